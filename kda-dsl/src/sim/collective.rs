//! Warp collectives and barriers in the simulated block: an `mma`, `ldmatrix`, `movmatrix` or
//! `shfl` runs once every lane of its warp stands at it; a barrier releases once every thread
//! that takes part arrived (deadlocks and divergent collectives are errors).

use super::*;

impl Block<'_> {
    /// Runs the collective the lanes of warp `w` all wait at, if they do.
    pub(super) fn step_warp(&mut self, w: usize) -> R<bool> {
        let lanes: Vec<usize> = (w * 32..(w + 1) * 32).filter(|t| !self.threads[*t].done).collect();
        if lanes.is_empty() || !lanes.iter().all(|t| self.threads[*t].blocked) {
            return Ok(false);
        }
        let pc = self.threads[lanes[0]].pc;
        let op = self.prog.body[pc].op.clone();
        if matches!(op, Op::Bar { .. }) {
            return Ok(false);
        }
        if lanes.iter().any(|t| self.threads[*t].pc != pc) {
            let pcs: Vec<usize> = lanes.iter().map(|t| self.threads[*t].pc).collect();
            if pcs.iter().all(|p| matches!(self.prog.body[*p].op, Op::Bar { .. }) || *p == pc)
                && pcs.iter().any(|p| *p != pc)
                && matches!(self.prog.body[pc].op, Op::Bar { .. })
            {
                return Ok(false);
            }
            if pcs.iter().any(|p| matches!(self.prog.body[*p].op, Op::Bar { .. }))
                && !pcs.iter().all(|p| matches!(self.prog.body[*p].op, Op::Bar { .. }))
            {
                return Err(format!("warp {w}: some lanes wait at a barrier while others wait at a warp collective"));
            }
            return Err(format!("warp {w}: lanes reach different collectives (divergent `{}`)", self.prog.body[pc].op));
        }
        if lanes.len() != 32 {
            return Err(format!("warp {w}: a warp collective with {} live lanes; all 32 must take part", lanes.len()));
        }
        if warpgroup::is_warpgroup_collective(&op) {
            return self.step_warpgroup(w, pc);
        }
        let base = w * 32;
        match op {
            Op::Shfl { mode, d, a, b, .. } => {
                let vals: Vec<u64> = (0..32).map(|l| self.get(base + l, &Src::Reg(a))).collect();
                for l in 0..32usize {
                    let bv = self.get(base + l, &b) as i64;
                    let src = match mode {
                        ShflMode::Bfly => (l as i64) ^ bv,
                        ShflMode::Up => {
                            if (l as i64) - bv < 0 {
                                l as i64
                            } else {
                                l as i64 - bv
                            }
                        }
                        ShflMode::Down => {
                            if l as i64 + bv > 31 {
                                l as i64
                            } else {
                                l as i64 + bv
                            }
                        }
                        ShflMode::Idx => bv & 31,
                    };
                    self.set(base + l, d, vals[(src & 31) as usize]);
                }
            }
            Op::Ldmatrix { trans, d, addr } => {
                if self.banks.is_some() {
                    // One phase a matrix: its 8 row addresses of 16 bytes.
                    let rows = 8 * d.len();
                    let lanes: Vec<banks::LaneRequest> = (0..rows)
                        .map(|lane| banks::LaneRequest {
                            lane,
                            addr: self.get(base + lane, &Src::Reg(addr)),
                            bytes: 16,
                        })
                        .collect();
                    if let Some(rec) = self.banks.as_mut() {
                        rec.record_warp(pc, &lanes);
                    }
                }
                // Row addresses from lanes 8q..8q+7 for matrix q; each row is 8 b16. An `.x2`
                // reads two matrices (lanes 0..16 address them), an `.x4` four.
                let mut m = [[[0u16; 8]; 8]; 4];
                for (q, mat) in m.iter_mut().enumerate().take(d.len()) {
                    for (r, row) in mat.iter_mut().enumerate() {
                        let a = self.get(base + q * 8 + r, &Src::Reg(addr));
                        let bytes = self.read_shared(base + q * 8 + r, a, 16)?;
                        for (c, x) in row.iter_mut().enumerate() {
                            *x = u16::from_le_bytes([bytes[2 * c], bytes[2 * c + 1]]);
                        }
                    }
                }
                for l in 0..32usize {
                    for (q, dr) in d.iter().enumerate() {
                        let (x, y) = if trans {
                            (m[q][2 * (l % 4)][l / 4], m[q][2 * (l % 4) + 1][l / 4])
                        } else {
                            (m[q][l / 4][2 * (l % 4)], m[q][l / 4][2 * (l % 4) + 1])
                        };
                        self.set(base + l, *dr, x as u64 | ((y as u64) << 16));
                    }
                }
            }
            Op::Movmatrix { d, a } => {
                // Lane l holds m[l / 4][2 (l % 4) ..]; afterwards it holds row l / 4 of mᵀ.
                let mut m = [[0u16; 8]; 8];
                for l in 0..32usize {
                    let v = self.get(base + l, &Src::Reg(a));
                    m[l / 4][2 * (l % 4)] = v as u16;
                    m[l / 4][2 * (l % 4) + 1] = (v >> 16) as u16;
                }
                for l in 0..32usize {
                    let (x, y) = (m[2 * (l % 4)][l / 4], m[2 * (l % 4) + 1][l / 4]);
                    self.set(base + l, d, x as u64 | ((y as u64) << 16));
                }
            }
            Op::Mma { ab, d, a, b, c } => {
                let mut am = [[0f32; 16]; 16];
                let mut bm = [[0f32; 8]; 16];
                let mut cm = [[0f32; 8]; 16];
                let h = |v: u64, hi: bool| half_to_f32(if hi { (v >> 16) as u16 } else { v as u16 }, ab);
                for l in 0..32usize {
                    let (g, tq) = (l / 4, l % 4);
                    let av: Vec<u64> = a.iter().map(|r| self.get(base + l, &Src::Reg(*r))).collect();
                    let bv: Vec<u64> = b.iter().map(|r| self.get(base + l, &Src::Reg(*r))).collect();
                    let cv: Vec<u64> = c.iter().map(|r| self.get(base + l, &Src::Reg(*r))).collect();
                    for (k, (row, col)) in
                        [(g, 2 * tq), (g + 8, 2 * tq), (g, 2 * tq + 8), (g + 8, 2 * tq + 8)].into_iter().enumerate()
                    {
                        am[row][col] = h(av[k], false);
                        am[row][col + 1] = h(av[k], true);
                    }
                    for (k, row) in [2 * tq, 2 * tq + 8].into_iter().enumerate() {
                        bm[row][g] = h(bv[k], false);
                        bm[row + 1][g] = h(bv[k], true);
                    }
                    cm[g][2 * tq] = f32_of(cv[0]);
                    cm[g][2 * tq + 1] = f32_of(cv[1]);
                    cm[g + 8][2 * tq] = f32_of(cv[2]);
                    cm[g + 8][2 * tq + 1] = f32_of(cv[3]);
                }
                let mut dm = [[0f32; 8]; 16];
                for (i, row) in dm.iter_mut().enumerate() {
                    for (j, out) in row.iter_mut().enumerate() {
                        let mut s = cm[i][j] as f64;
                        for k in 0..16 {
                            s += am[i][k] as f64 * bm[k][j] as f64;
                        }
                        *out = s as f32;
                    }
                }
                for l in 0..32usize {
                    let (g, tq) = (l / 4, l % 4);
                    let vals = [dm[g][2 * tq], dm[g][2 * tq + 1], dm[g + 8][2 * tq], dm[g + 8][2 * tq + 1]];
                    for (k, r) in d.iter().enumerate() {
                        self.set(base + l, *r, vals[k].to_bits() as u64);
                    }
                }
            }
            _ => unreachable!("only collectives"),
        }
        self.check_uninit()?;
        self.executed += 32;
        for l in lanes {
            self.threads[l].blocked = false;
            self.threads[l].pc += 1;
        }
        Ok(true)
    }

    /// A barrier `bar.sync` (PTX's `.aligned` form) releases only threads that all wait at
    /// that one instruction; `barrier.sync` takes them from anywhere.
    fn check_barrier_reach(&self, id: u32, ts: &[usize]) -> R<()> {
        let pc = self.threads[ts[0]].pc;
        let aligned = |p: usize| matches!(self.prog.body[p].op, Op::Bar { reach: BarrierReach::SameInstruction, .. });
        match ts.iter().find(|t| self.threads[**t].pc != pc) {
            Some(&other) if aligned(pc) || aligned(self.threads[other].pc) => Err(format!(
                "barrier {id}: thread {} waits at instruction {pc} ({}) and thread {other} at {} ({}), but a \
                 `bar.sync` needs every thread at one instruction (`barrier.sync` where they reach it from \
                 different ones)",
                ts[0], self.prog.body[pc].loc, self.threads[other].pc, self.prog.body[self.threads[other].pc].loc
            )),
            _ => Ok(()),
        }
    }

    /// Releases a barrier every live thread waits at.
    pub(super) fn step_barrier(&mut self) -> R<bool> {
        let live: Vec<usize> = (0..self.threads.len()).filter(|t| !self.threads[*t].done).collect();
        let at_bar: Vec<usize> = live
            .iter()
            .copied()
            .filter(|t| self.threads[*t].blocked && matches!(self.prog.body[self.threads[*t].pc].op, Op::Bar { .. }))
            .collect();
        if at_bar.is_empty() {
            return Ok(false);
        }
        // Group waiting threads by barrier id; a barrier with a count releases at that count,
        // one without at every live thread of the block.
        let mut by_id: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for t in &at_bar {
            if let Op::Bar { id, .. } = self.prog.body[self.threads[*t].pc].op {
                by_id.entry(self.get(*t, &id) as u32).or_default().push(*t);
            }
        }
        for (id, ts) in by_id {
            let count = match self.prog.body[self.threads[ts[0]].pc].op {
                Op::Bar { count, .. } => count,
                _ => None,
            };
            let need = count.map(|c| c as usize).unwrap_or(live.len());
            if count.is_none() && live.len() < self.threads.len() {
                return Err(format!("bar.sync {id}: some threads of the block have exited while others wait"));
            }
            // More threads than its count wait at once: which of them it releases would depend
            // on the order they arrived (two groups of warps on one barrier, say).
            if count.is_some() && ts.len() > need {
                return Err(format!(
                    "bar.sync {id}: {} threads wait at a barrier of {need}: which it releases depends on the order \
                     they arrived",
                    ts.len()
                ));
            }
            if ts.len() >= need {
                self.check_barrier_reach(id, &ts)?;
                self.released += 1;
                let warps = self.warps;
                let mut met = vec![false; warps];
                for t in ts {
                    self.threads[t].blocked = false;
                    self.threads[t].pc += 1;
                    met[t / 32] = true;
                }
                let met: Vec<usize> = (0..warps).filter(|w| met[*w]).collect();
                // Order is transitive: what any warp that takes part had ordered before it is
                // ordered before all of them now, and so is everything they did.
                for a in 0..self.last_shared_barrier.len() / warps {
                    let known = met.iter().map(|s| self.last_shared_barrier[a * warps + s]).max().unwrap_or(0);
                    for b in &met {
                        self.last_shared_barrier[a * warps + b] = known;
                    }
                }
                for a in &met {
                    let a = self.group_warp(*a);
                    for b in &met {
                        self.last_shared_barrier[a * warps + b] = self.released;
                    }
                }
                return Ok(true);
            }
        }
        Ok(false)
    }
}
