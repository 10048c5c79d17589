//! Lowering of `gemm`: `ldmatrix` (`.trans` for operands stored the other way) feeding
//! `mma.sync.m16n8k16` with f32 accumulators. Either operand (not both) may instead be an f32
//! fragment in the accumulator layout, packed to 16-bit pairs in registers (no shared-memory
//! round trip); a right operand stored `[K, N]` that way is transposed by `movmatrix`.

use super::Lower;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    fn operand_shape(&self, o: &Operand) -> (u32, u32) {
        let s = &self.def().buffers[o.buf].shape;
        let (r, c) = if s.len() == 2 { (s[0], s[1]) } else { (1, s[0]) };
        if o.transposed {
            (c, r)
        } else {
            (r, c)
        }
    }

    pub(crate) fn gemm(&mut self, a: &Operand, b: &Operand, c: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let def = self.def();
        let (cb, ab, bb) = (&def.buffers[c], &def.buffers[a.buf], &def.buffers[b.buf]);
        let BufLayout::Fragment(lc) = self.p.layouts[c] else {
            return self.err(loc, format!("gemm accumulator `{}` must be a fragment", cb.name));
        };
        debug_assert_eq!(lc.lanes_per_row, 4, "infer_layouts gives gemm fragments the mma layout");
        if cb.dtype != DType::F32 || lc.kind != FragmentKind::Tile || lc.vec != 2 {
            return self.err(loc, format!("gemm accumulator `{}` must be a 2-D f32 fragment", cb.name));
        }
        let (m, k) = self.operand_shape(a);
        let (k2, n) = self.operand_shape(b);
        if a.replicated && (a.transposed || b.replicated || m != lc.warp_rows() || lc.wn != 1) {
            return self.err(
                loc,
                format!("gemm: a replicated left operand must be an untransposed [{} x k] tile (the rows of one warp of {lc}) beside a plain right operand", lc.warp_rows()),
            );
        }
        // Replicated: every warp row multiplies the same tile rows.
        let m = if a.replicated { m * lc.wm } else { m };
        if k != k2 || m != lc.rows || n != lc.cols {
            return self.err(
                loc,
                format!("gemm shapes: a is [{m} x {k}], b is [{k2} x {n}], c is [{} x {}]", lc.rows, lc.cols),
            );
        }
        if k % 16 != 0 {
            return self.err(loc, format!("gemm: the reduction extent {k} must be a multiple of 16 (the mma k)"));
        }
        // The mma's input type: a shared operand's (a fragment operand is packed to it).
        let (a_regs, b_regs) = (self.is_fragment(a.buf), self.is_fragment(b.buf));
        let ab_ty = match (ab.dtype, bb.dtype, a_regs, b_regs) {
            (_, _, true, true) => {
                return self.err(
                    loc,
                    format!("gemm: `{}` and `{}` are both fragments; one operand must be a bf16 or f16 shared tile, which names the mma's input type", ab.name, bb.name),
                )
            }
            (_, DType::BF16, true, false) | (DType::BF16, _, false, true) | (DType::BF16, DType::BF16, ..) => Ty::BF16,
            (_, DType::F16, true, false) | (DType::F16, _, false, true) | (DType::F16, DType::F16, ..) => Ty::F16,
            (x, y, ..) => {
                return self.err(loc, format!("gemm operands must both be bf16 or both f16 tiles, found {x} and {y}"))
            }
        };
        let b_frag = match self.p.layouts[b.buf] {
            BufLayout::Shared(_) => None,
            BufLayout::Fragment(lb) => Some(self.register_b_layout(b, lb, lc, k, loc)?),
            _ => return self.err(loc, format!("gemm right operand `{}` must be a shared tile or a fragment", bb.name)),
        };
        let a_frag = match self.p.layouts[a.buf] {
            BufLayout::Shared(_) => None,
            BufLayout::Fragment(_) if a.replicated => {
                return self.err(loc, format!("gemm: the replicated operand `{}` must be a shared tile", ab.name))
            }
            BufLayout::Fragment(la) => {
                if a.transposed || la.kind != FragmentKind::Tile || la.wn != 1 || la.wm != lc.wm {
                    return self.err(
                        loc,
                        format!("gemm left operand `{}` from registers must be an untransposed fragment whose warps split only rows, as the accumulator's ({la} vs {lc})", ab.name),
                    );
                }
                Some(la)
            }
            _ => return self.err(loc, format!("gemm left operand `{}` must be a shared tile or a fragment", ab.name)),
        };
        if lc.ni() % 2 != 0 && b_frag.is_none() {
            return self.err(
                loc,
                format!("gemm: each warp's {} accumulator columns must be a multiple of 16 ({lc})", lc.warp_cols()),
            );
        }
        let th = self.scope.th;
        let wr = self.em.op32(BinKind::Div, th.warp, lc.wn as i64);
        let wc = self.em.op32(BinKind::Rem, th.warp, lc.wn as i64);
        let m_base = self.em.mul32(wr, Src::Imm(lc.warp_rows() as i64));
        let n_base = self.em.mul32(wc, Src::Imm(lc.warp_cols() as i64));
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
                            lw.em.emit(Op::Ldmatrix { trans: a.transposed, d, addr });
                            afr.push(d);
                        }
                        Some(la) => afr.push(lw.pack_a(a.buf, la, i, kk, ab_ty)),
                    }
                }
                let mut bfr: Vec<[Reg; 2]> = vec![];
                match b_frag {
                    None => {
                        let parts = b_parts.expect("a shared B has its parts");
                        for jp in 0..ni / 2 {
                            let (row, col) = index(lw, parts, !b.transposed, jp * 16, k0);
                            let addr = lw.shared_addr(b.buf, row, col);
                            let d = [0; 4].map(|_| lw.em.reg(RegClass::B32));
                            lw.em.emit(Op::Ldmatrix { trans: !b.transposed, d, addr });
                            bfr.push([d[0], d[1]]);
                            bfr.push([d[2], d[3]]);
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
        Ok(())
    }

    fn is_fragment(&self, buf: BufId) -> bool {
        matches!(self.p.layouts[buf], BufLayout::Fragment(_))
    }

    /// Checks a right operand from registers against the accumulator's layout `lc` (reduction
    /// extent `k`) and returns its layout. Each warp needs the whole reduction extent of its
    /// own accumulator columns, so the accumulator's warps split columns only, and the operand's
    /// warps split its `n` axis the same way and never its `k` axis.
    fn register_b_layout(
        &self,
        b: &Operand,
        lb: FragmentLayout,
        lc: FragmentLayout,
        k: u32,
        loc: SrcLoc,
    ) -> Result<FragmentLayout, Diag> {
        let name = &self.def().buffers[b.buf].name;
        // Stored [N, K] (`b.t()`) or [K, N]: the warps of its n axis, and its extent per warp.
        let (n_warps, k_warps, n_per_warp) =
            if b.transposed { (lb.wm, lb.wn, lb.warp_rows()) } else { (lb.wn, lb.wm, lb.warp_cols()) };
        let ok = lb.kind == FragmentKind::Tile
            && lb.vec == 2
            && lb.lanes_per_row == 4
            && lc.wm == 1
            && k_warps == 1
            && n_warps == lc.wn
            && n_per_warp == lc.warp_cols()
            && (!b.transposed || n_per_warp.is_multiple_of(16))
            && k.is_multiple_of(16);
        if !ok {
            return Err(Diag::new(
                loc,
                format!("gemm right operand `{name}` from registers: the accumulator's warps must split its columns only and `{name}` ({lb}) must hold each warp's columns over the whole reduction ({k}), {}, as the accumulator does ({lc})", if b.transposed { "its rows 16 or more per warp" } else { "its columns" }),
            ));
        }
        Ok(lb)
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
    fn pack_a(&mut self, buf: BufId, la: FragmentLayout, i: u32, kk: u32, half: Ty) -> [Reg; 4] {
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
