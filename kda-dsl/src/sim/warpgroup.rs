//! Warpgroup instructions in the simulated block: `wgmma.fence`, `wgmma.mma_async`,
//! `wgmma.commit_group`, `wgmma.wait_group` and `setmaxnreg` run once all 128 threads of a
//! warpgroup (4 aligned warps) stand at the same one.
//!
//! A `wgmma` computes at issue, but its result stays with the warpgroup's pending groups until
//! a `wait_group` retires them; until then the simulator reports what the hardware leaves
//! undefined: an instruction touching the accumulator or A registers, a shared write to the
//! bytes it reads. At issue it also checks what the ISA asks before one: a `wgmma.fence` after
//! the registers' last access by another instruction, and for operand bytes written through
//! the generic proxy, a `fence.proxy.async` by their writer after the write, ordered before
//! the `wgmma` by a barrier. A `setmaxnreg` raise waits until the block's register pool has
//! room.

use super::*;
use crate::hopper_layout::{MatrixDescriptor, WgmmaFragment};
use std::collections::{HashSet, VecDeque};

/// Threads of a warpgroup.
pub(super) const WARPGROUP: usize = 128;

/// One issued `wgmma` whose group has not retired.
pub(super) struct InFlight {
    /// The accumulator registers and the values each thread gets at retirement.
    accumulator: Vec<Reg>,
    values: Vec<Vec<u64>>,
    /// The A operand's registers (read from registers): they belong to the instruction too.
    a_registers: Vec<Reg>,
    /// The 16-byte shared chunks it reads.
    chunks: HashSet<u32>,
}

/// A warpgroup's `wgmma`s not yet retired, and its registers per thread.
#[derive(Default)]
pub(super) struct Warpgroup {
    /// Registers per thread: the kernel's `.maxnreg` until a `setmaxnreg`.
    registers: u32,
    /// Issued since the last `commit_group`.
    open: Vec<InFlight>,
    /// Committed groups, oldest first.
    committed: VecDeque<Vec<InFlight>>,
}

impl Warpgroup {
    /// A warpgroup with `registers` per thread and nothing pending.
    pub(super) fn new(registers: u32) -> Warpgroup {
        Warpgroup { registers, ..Default::default() }
    }

    fn pending(&self) -> impl Iterator<Item = &InFlight> {
        self.committed.iter().flatten().chain(&self.open)
    }

    /// Whether a pending `wgmma` reads the 16-byte shared chunk `chunk`.
    pub(super) fn reads_chunk(&self, chunk: u32) -> bool {
        self.pending().any(|f| f.chunks.contains(&chunk))
    }

    /// Whether nothing is pending.
    pub(super) fn idle(&self) -> bool {
        self.open.is_empty() && self.committed.is_empty()
    }
}

/// Whether `op` is run by a whole warpgroup at once.
pub(super) fn is_warpgroup_collective(op: &Op) -> bool {
    matches!(op, Op::WgmmaFence | Op::Wgmma { .. } | Op::WgmmaCommit | Op::WgmmaWait { .. } | Op::SetMaxNReg { .. })
}

impl Block<'_> {
    /// Runs the warpgroup instruction at `pc` that every lane of warp `w` waits at, once the
    /// warpgroup's other three warps wait at it too.
    pub(super) fn step_warpgroup(&mut self, w: usize, pc: usize) -> R<bool> {
        let first = w / 4 * WARPGROUP;
        // The issuing warp's warpgroup must be whole; warps past the last whole one (fill
        // warps, say) may be there as long as they issue none.
        if first + WARPGROUP > self.threads.len() {
            return Err(format!(
                "`{}` in warp {w}, whose warpgroup is not whole in a block of {} threads",
                self.prog.body[pc].op,
                self.threads.len()
            ));
        }
        let members = first..first + WARPGROUP;
        for t in members.clone() {
            let th = &self.threads[t];
            if th.done {
                return Err(format!(
                    "warpgroup {}: thread {t} has exited; all 128 threads must take part in `{}`",
                    w / 4,
                    self.prog.body[pc].op
                ));
            }
            if !th.blocked {
                return Ok(false);
            }
            // Elsewhere at a warp collective or a barrier, it may still come.
            if th.pc != pc && !is_warpgroup_collective(&self.prog.body[th.pc].op) {
                return Ok(false);
            }
            if th.pc != pc {
                return Err(format!(
                    "warpgroup {}: thread {first} waits at `{}` ({}) and thread {t} at {} ({}); all 128 threads must reach the same warpgroup instruction",
                    w / 4,
                    self.prog.body[pc].op,
                    self.prog.body[pc].loc,
                    th.pc,
                    self.prog.body[th.pc].loc
                ));
            }
        }
        let group = w / 4;
        if let Op::SetMaxNReg { raise, count } = self.prog.body[pc].op {
            if !self.set_registers(group, raise, count)? {
                return Ok(false);
            }
        }
        match self.prog.body[pc].op.clone() {
            Op::WgmmaFence => {
                for t in members.clone() {
                    self.threads[t].register_fence = Some(self.clock);
                }
                // Reads from here on carry a later clock than the fence.
                self.clock += 1;
            }
            Op::Wgmma { ab, n, d, a, b, accumulate } => self.issue_wgmma(group, ab, n, &d, &a, b, accumulate)?,
            Op::WgmmaCommit => {
                let open = std::mem::take(&mut self.warpgroups[group].open);
                self.warpgroups[group].committed.push_back(open);
            }
            Op::WgmmaWait { n } => {
                while self.warpgroups[group].committed.len() > n as usize {
                    let retired = self.warpgroups[group].committed.pop_front().unwrap_or_default();
                    self.retire(first, retired);
                }
                self.mark_in_flight(group);
            }
            Op::SetMaxNReg { .. } => {}
            _ => unreachable!("only warpgroup instructions"),
        }
        self.check_uninit()?;
        self.executed += WARPGROUP as u64;
        for t in members {
            self.threads[t].blocked = false;
            self.threads[t].pc += 1;
        }
        Ok(true)
    }

    /// Moves warpgroup `group` to `count` registers per thread; false while the block's pool
    /// (`.maxnreg` times its threads) cannot yet supply a raise: it waits for other
    /// warpgroups to return theirs.
    fn set_registers(&mut self, group: usize, raise: bool, count: u32) -> R<bool> {
        let Some(cap) = self.prog.max_registers else {
            return Err("setmaxnreg in a kernel with no .maxnreg: ptxas ignores it".into());
        };
        if !(24..=256).contains(&count) || !count.is_multiple_of(8) {
            return Err(format!("setmaxnreg {count}: expected a multiple of 8 from 24 to 256"));
        }
        let now = self.warpgroups[group].registers;
        if raise && count < now || !raise && count > now {
            let (verb, dir) = if raise { ("inc", "below") } else { ("dec", "above") };
            return Err(format!("setmaxnreg.{verb} to {count}, {dir} the warpgroup's {now} registers"));
        }
        let others: u32 =
            self.warpgroups.iter().enumerate().filter(|(g, _)| *g != group).map(|(_, w)| w.registers).sum();
        if others + count > cap * self.warpgroups.len() as u32 {
            return Ok(false);
        }
        self.warpgroups[group].registers = count;
        Ok(true)
    }

    /// A register value the whole warpgroup must agree on (a descriptor, the accumulate
    /// predicate).
    fn uniform(&self, first: usize, r: Reg, what: &str) -> R<u64> {
        let v = self.get(first, &Src::Reg(r));
        match (first..first + WARPGROUP).find(|t| self.get(*t, &Src::Reg(r)) != v) {
            None => Ok(v),
            Some(t) => Err(format!("wgmma {what} {r} differs across the warpgroup (threads {first} and {t})")),
        }
    }

    /// The accumulator value thread `t` would see for `r` once everything pending retired:
    /// a chained `wgmma` accumulates onto its predecessor's result.
    fn accumulator_value(&self, group: usize, t: usize, r: Reg) -> u64 {
        let local = t % WARPGROUP;
        let pending = self.warpgroups[group].pending().collect::<Vec<_>>();
        for f in pending.iter().rev() {
            if let Some(k) = f.accumulator.iter().position(|x| *x == r) {
                return f.values[local][k];
            }
        }
        self.read_register(t, r)
    }

    /// Checks that no register `regs` names was read or written by another instruction of
    /// thread `t` after its last `wgmma.fence`.
    fn check_register_fence(&self, t: usize, regs: &[Reg]) -> R<()> {
        let Some(fence) = self.threads[t].register_fence else {
            return Err(format!("thread {t}: a wgmma with no wgmma.fence before it"));
        };
        let th = &self.threads[t];
        let accessed = |r: &&Reg| {
            let i = self.reg_index(**r);
            th.write_clock[i].max(th.read_clock[i].get()) > fence
        };
        match regs.iter().find(accessed) {
            None => Ok(()),
            Some(r) => Err(format!(
                "thread {t}: register {r} was read or written after the last wgmma.fence; fence between that access and the wgmma that uses it"
            )),
        }
    }

    /// Reads the 16-bit operand element at `addr` for the warpgroup starting at thread `first`:
    /// ordered after its writes by a barrier, and made visible to the async proxy by a fence of
    /// its writer after the write and before that barrier.
    fn read_operand(&mut self, first: usize, addr: u32, chunks: &mut HashSet<u32>) -> R<u16> {
        let bytes = self.read_shared(first, u64::from(addr), 2)?;
        let at = self.check_shared(u64::from(addr), 2)?;
        for i in at..at + 2 {
            self.check_async_visible(first as u32, i, "wgmma")?;
        }
        chunks.insert(at as u32 / 16);
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    #[allow(clippy::too_many_arguments)] // the instruction's operands, as the IR names them
    fn issue_wgmma(
        &mut self,
        group: usize,
        ab: Ty,
        n: u32,
        d: &[Reg],
        a: &WgmmaA,
        b: SharedOperand,
        accumulate: Reg,
    ) -> R<()> {
        let first = group * WARPGROUP;
        let acc_layout = WgmmaFragment::Accumulator { n };
        if n == 0 || n > 256 || !n.is_multiple_of(8) || d.len() as u32 != acc_layout.values_per_thread() {
            return Err(format!("wgmma m64n{n}k16 with {} accumulator registers", d.len()));
        }
        let a_registers: Vec<Reg> = match a {
            WgmmaA::Registers(r) => r.to_vec(),
            WgmmaA::Shared(_) => vec![],
        };
        let fenced: Vec<Reg> = d.iter().chain(&a_registers).copied().collect();
        for t in first..first + WARPGROUP {
            self.check_register_fence(t, &fenced)?;
        }
        if accumulate.class != RegClass::Pred {
            return Err(format!("wgmma accumulate operand {accumulate} is not a predicate"));
        }
        let scale_d = self.uniform(first, accumulate, "accumulate predicate")? != 0;
        let b_desc = MatrixDescriptor::decode(self.uniform(first, b.desc, "B descriptor")?)?;
        let mut chunks = HashSet::new();
        let half = |h: u16| f64::from(half_to_f32(h, ab));
        let mut am = vec![[0f64; 16]; 64];
        match a {
            WgmmaA::Shared(op) => {
                let a_desc = MatrixDescriptor::decode(self.uniform(first, op.desc, "A descriptor")?)?;
                for (m, row) in am.iter_mut().enumerate() {
                    for (k, x) in row.iter_mut().enumerate() {
                        let at = a_desc.address(op.major, m as u32, k as u32, 2);
                        *x = half(self.read_operand(first, at, &mut chunks)?);
                    }
                }
            }
            WgmmaA::Registers(regs) => {
                for local in 0..WARPGROUP {
                    for v in 0..WgmmaFragment::RegisterA.values_per_thread() {
                        let pair = self.read_register(first + local, regs[v as usize / 2]);
                        let bits = if v % 2 == 0 { pair as u16 } else { (pair >> 16) as u16 };
                        let (m, k) = WgmmaFragment::RegisterA.coord(local as u32, v);
                        am[m as usize][k as usize] = half(bits);
                    }
                }
            }
        }
        let mut bm = vec![[0f64; 16]; n as usize];
        for (col, row) in bm.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                let at = b_desc.address(b.major, col as u32, k as u32, 2);
                *x = half(self.read_operand(first, at, &mut chunks)?);
            }
        }
        let mut values = vec![vec![0u64; d.len()]; WARPGROUP];
        for (local, out) in values.iter_mut().enumerate() {
            for (v, (slot, r)) in out.iter_mut().zip(d).enumerate() {
                let (m, col) = acc_layout.coord(local as u32, v as u32);
                let c = if scale_d { f64::from(f32_of(self.accumulator_value(group, first + local, *r))) } else { 0.0 };
                // From the accumulator, product by product, as `mma.sync`'s model sums: the two
                // instructions then agree wherever a kernel's arithmetic does.
                let sum = (0..16).fold(c, |s, k| s + am[m as usize][k] * bm[col as usize][k]);
                *slot = u64::from((sum as f32).to_bits());
            }
        }
        self.warpgroups[group].open.push(InFlight { accumulator: d.to_vec(), values, a_registers, chunks });
        self.mark_in_flight(group);
        Ok(())
    }

    /// Writes a retired group's results into the warpgroup's registers. They are not the
    /// threads' writes: a following `wgmma` into the same accumulator needs no fence for them.
    fn retire(&mut self, first: usize, retired: Vec<InFlight>) {
        for f in retired {
            for (local, vals) in f.values.iter().enumerate() {
                for (r, v) in f.accumulator.iter().zip(vals) {
                    let i = self.reg_index(*r);
                    let th = &mut self.threads[first + local];
                    th.regs[i] = *v;
                    th.written[i] = true;
                }
            }
        }
    }

    /// Marks exactly the registers pending `wgmma`s own as in flight, in every thread of the
    /// warpgroup.
    fn mark_in_flight(&mut self, group: usize) {
        let first = group * WARPGROUP;
        let owned: Vec<usize> = self.warpgroups[group]
            .pending()
            .flat_map(|f| f.accumulator.iter().chain(&f.a_registers))
            .map(|r| self.reg_index(*r))
            .collect();
        for t in first..first + WARPGROUP {
            let th = &mut self.threads[t];
            th.in_flight.iter_mut().for_each(|x| *x = false);
            for i in &owned {
                th.in_flight[*i] = true;
            }
        }
    }
}
