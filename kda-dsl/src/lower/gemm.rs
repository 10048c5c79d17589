//! Lowering of `gemm`: `ldmatrix` (`.trans` for operands stored the other way) feeding
//! `mma.sync.m16n8k16` with f32 accumulators. Either operand (not both) may instead be an f32
//! fragment in the accumulator layout, packed to 16-bit pairs in registers (no shared-memory
//! round trip); a right operand stored `[K, N]` that way is transposed by `movmatrix`.

use super::gemm_plan::{GemmPlan, MmaSyncPlan, OperandSource};
use super::Lower;
use crate::diag::{Diag, SrcLoc};
use crate::layout::FragmentLayout;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    pub(crate) fn gemm(&mut self, a: &Operand, b: &Operand, c: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let plan = self.plan_gemm(a, b, c, loc)?;
        crate::passes::dump("gemm_plan", &plan);
        self.gemm_plans.push(plan);
        match plan {
            GemmPlan::MmaSync(p) => self.mma_sync(a, b, c, &p),
            GemmPlan::Wgmma(p) => self.wgmma(a, b, c, &p),
        }
        Ok(())
    }

    /// `gemm` on `mma.sync.m16n8k16`, as `p` plans it.
    fn mma_sync(&mut self, a: &Operand, b: &Operand, c: BufId, p: &MmaSyncPlan) {
        let (lc, k, ab_ty) = (p.c, p.k, p.ty);
        // Each operand from its plan: `ldmatrix` (and whether `.trans`), or registers.
        let (a_frag, a_trans) = match p.a {
            OperandSource::Registers { layout, .. } => (Some(layout), false),
            OperandSource::Ldmatrix { trans } => (None, trans),
        };
        let (b_frag, b_trans) = match p.b {
            OperandSource::Registers { layout, .. } => (Some(layout), false),
            OperandSource::Ldmatrix { trans } => (None, trans),
        };
        let th = self.scope.th;
        let (m_base, n_base) = self.warp_origin(lc);
        let lane = Src::Reg(th.lane);
        let q = self.em.op32(BinKind::Shr, lane, 3);
        let r8 = self.em.op32(BinKind::And, lane, 7);
        let l16 = self.em.op32(BinKind::And, lane, 15);
        let hi16 = self.em.op32(BinKind::Shr, lane, 4);
        let q_lo = self.em.op32(BinKind::And, q, 1);
        let q_hi = self.em.op32(BinKind::Shr, q, 1);
        let eight = |lw: &mut Self, x: Src| lw.em.op32(BinKind::Shl, x, 3);
        // Lane-dependent parts of the ldmatrix row addresses.
        let (a_r, a_c) = if a.transposed {
            // stored [K, M]: k = r8 + q_hi*8, m = q_lo*8
            let qh8 = eight(self, q_hi);
            (self.em.add32(r8, qh8), eight(self, q_lo))
        } else {
            // stored [M, K]: m = lane % 16, k = (lane / 16) * 8
            (l16, eight(self, hi16))
        };
        let (b_r, b_c) = if b.transposed {
            // stored [N, K]: n = r8 + (lane/16)*8, k = q_lo*8
            let h8 = eight(self, hi16);
            (self.em.add32(r8, h8), eight(self, q_lo))
        } else {
            // stored [K, N]: k = r8 + q_lo*8, n = q_hi*8
            let ql8 = eight(self, q_lo);
            (self.em.add32(r8, ql8), eight(self, q_hi))
        };
        let (mi, ni) = (lc.mi(), lc.ni());
        // Operand indices as a per-thread base plus a constant (an atom's rows or columns, a
        // k-step), so that inside the element-loop scope the swizzled addresses split into a
        // thread part computed once and a constant XOR and offset per `ldmatrix`
        // (`element_addr.rs`). The bases' bits: every value over the block's warps and lanes.
        let warp_rows: Vec<u32> = (0..lc.wm).map(|w| if a.replicated { 0 } else { w * lc.warp_rows() }).collect();
        let warp_cols: Vec<u32> = (0..lc.wn).map(|w| w * lc.warp_cols()).collect();
        let bits_of = |bases: &[u32], lanes: &[u32]| -> u32 {
            bases.iter().flat_map(|b| lanes.iter().map(move |l| b + l)).fold(0, |acc, v| acc | v)
        };
        let (sixteen, halves): (Vec<u32>, Vec<u32>) = ((0..16).collect(), vec![0, 8]);
        let a_base = if a.replicated { Src::Imm(0) } else { m_base };
        let reg = |lw: &mut Self, x: Src| lw.em.to_reg(x, RegClass::B32, Ty::U32);
        // (row base, its bits, column base, its bits) of each operand, and which of row and
        // column steps with the atom (the other with the k-step).
        // (A from registers reads no shared addresses.)
        let a_parts = if a_frag.is_some() {
            None
        } else if a.transposed {
            // stored [K, M]: rows are k (a_r + k0), columns m (a_base + 16 i + a_c).
            let col = self.em.add32(a_base, a_c);
            Some((reg(self, a_r), bits_of(&[0], &sixteen), reg(self, col), bits_of(&warp_rows, &halves)))
        } else {
            // stored [M, K]: rows are m (a_base + 16 i + a_r), columns k (a_c + k0).
            let row = self.em.add32(a_base, a_r);
            Some((reg(self, row), bits_of(&warp_rows, &sixteen), reg(self, a_c), bits_of(&[0], &halves)))
        };
        let b_parts = if b_frag.is_some() {
            // (B from registers reads no shared addresses.)
            None
        } else if b.transposed {
            // stored [N, K]: rows are n (n_base + 16 jp + b_r), columns k (b_c + k0).
            let row = self.em.add32(n_base, b_r);
            Some((reg(self, row), bits_of(&warp_cols, &sixteen), reg(self, b_c), bits_of(&[0], &halves)))
        } else {
            // stored [K, N]: rows are k (b_r + k0), columns n (n_base + 16 jp + b_c).
            let col = self.em.add32(n_base, b_c);
            Some((reg(self, b_r), bits_of(&[0], &sixteen), reg(self, col), bits_of(&warp_cols, &halves)))
        };
        // The (row, column) of an operand's `ldmatrix` for atom offset `atom` and k-step `k0`;
        // `k_rows`: the operand's rows run along k.
        let index = |lw: &mut Self, parts: (Reg, u32, Reg, u32), k_rows: bool, atom: u32, k0: u32| -> (Src, Src) {
            let (r, rb, c, cb) = parts;
            let (ro, co) = if k_rows { (k0, atom) } else { (atom, k0) };
            (lw.split_index(r, rb, ro), lw.split_index(c, cb, co))
        };
        self.element_loop(|lw| {
            for kk in 0..k / 16 {
                let k0 = kk * 16;
                let mut afr: Vec<[Reg; 4]> = vec![];
                for i in 0..mi {
                    match a_frag {
                        None => {
                            let parts = a_parts.expect("a shared A has its parts");
                            let (row, col) = index(lw, parts, a.transposed, i * 16, k0);
                            let addr = lw.shared_addr(a.buf, row, col);
                            let d = [0; 4].map(|_| lw.em.reg(RegClass::B32));
                            lw.em.emit(Op::Ldmatrix { trans: a_trans, d: d.to_vec(), addr });
                            afr.push(d);
                        }
                        Some(la) => afr.push(lw.pack_a(a.buf, la, i, kk, ab_ty)),
                    }
                }
                let mut bfr: Vec<[Reg; 2]> = vec![];
                match b_frag {
                    None => {
                        let parts = b_parts.expect("a shared B has its parts");
                        // 16 columns an `ldmatrix.x4`; a warp's odd last 8 an `.x2`, whose
                        // matrices are the first two of the `.x4`'s (lanes 0..16 address them).
                        for jp in 0..ni.div_ceil(2) {
                            let (row, col) = index(lw, parts, !b.transposed, jp * 16, k0);
                            let addr = lw.shared_addr(b.buf, row, col);
                            let matrices = if 2 * jp + 1 < ni { 4 } else { 2 };
                            let d: Vec<Reg> = (0..matrices).map(|_| lw.em.reg(RegClass::B32)).collect();
                            lw.em.emit(Op::Ldmatrix { trans: b_trans, d: d.clone(), addr });
                            for pair in d.chunks(2) {
                                bfr.push([pair[0], pair[1]]);
                            }
                        }
                    }
                    Some(lb) => {
                        for j in 0..ni {
                            bfr.push(lw.pack_b(b.buf, lb, b.transposed, j, kk, ab_ty));
                        }
                    }
                }
                for i in 0..mi {
                    for j in 0..ni {
                        let s = ((i * ni + j) * 4) as usize;
                        let acc = [lw.regs[c][s], lw.regs[c][s + 1], lw.regs[c][s + 2], lw.regs[c][s + 3]];
                        lw.em.emit(Op::Mma { ab: ab_ty, d: acc, a: afr[i as usize], b: bfr[j as usize], c: acc });
                    }
                }
            }
        });
    }

    /// The B registers of n-atom `j` and k-step `kk` from an f32 fragment in accumulator
    /// layout. Stored `[N, K]` (`transposed`), lane `(g, t)` already holds `B[2t, 2t + 1][g]`
    /// as row `g` of the fragment: a pack per register. Stored `[K, N]`, it holds row `g` of
    /// each 8 x 8 block, `B[g][2t, 2t + 1]`; a `movmatrix` transposes each packed block.
    fn pack_b(&mut self, buf: BufId, lb: FragmentLayout, transposed: bool, j: u32, kk: u32, half: Ty) -> [Reg; 2] {
        let ni = lb.ni();
        let slot = |i: u32, jj: u32, h: u32, c: u32| (((i * ni + jj) * 2 + h) * 2 + c) as usize;
        // The fragment's (atom row, atom column, half) of each of the two registers.
        let parts =
            if transposed { [(j / 2, 2 * kk, j % 2), (j / 2, 2 * kk + 1, j % 2)] } else { [(kk, j, 0), (kk, j, 1)] };
        parts.map(|(i, jj, h)| {
            let d = self.em.reg(RegClass::B32);
            let (lo, hi) = (self.regs[buf][slot(i, jj, h, 0)], self.regs[buf][slot(i, jj, h, 1)]);
            self.em.emit(Op::PackHalf2 { half, d, hi: Src::Reg(hi), lo: Src::Reg(lo) });
            if transposed {
                d
            } else {
                let t = self.em.reg(RegClass::B32);
                self.em.emit(Op::Movmatrix { d: t, a: d });
                t
            }
        })
    }

    /// The A registers of atom (i, k-step kk) packed from an f32 fragment in accumulator layout.
    pub(super) fn pack_a(&mut self, buf: BufId, la: FragmentLayout, i: u32, kk: u32, half: Ty) -> [Reg; 4] {
        let ni = la.ni();
        let slot = |j: u32, h: u32, c: u32| (((i * ni + j) * 2 + h) * 2 + c) as usize;
        let mut out = [Reg { class: RegClass::B32, id: 0 }; 4];
        for (n, (j, h)) in [(2 * kk, 0), (2 * kk, 1), (2 * kk + 1, 0), (2 * kk + 1, 1)].into_iter().enumerate() {
            let d = self.em.reg(RegClass::B32);
            let (lo, hi) = (self.regs[buf][slot(j, h, 0)], self.regs[buf][slot(j, h, 1)]);
            self.em.emit(Op::PackHalf2 { half, d, hi: Src::Reg(hi), lo: Src::Reg(lo) });
            out[n] = d;
        }
        out
    }
}
