//! What a `gemm` lowers to, decided (and every rule it must meet checked) before anything is
//! emitted: the tensor-core instruction and where each operand's registers come from. The
//! emitter (`gemm.rs`) matches on the plan; `KDA_DUMP=gemm_plan` prints each one.

use std::fmt;

use super::Lower;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::gemm_choice::{choose_wgmma, GemmFacts, NoWgmma, WgmmaAFrom};
use crate::hopper_layout::OperandTile;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::passes::BufLayout;
use crate::thread_ir::Ty;
use crate::tile::*;

/// The instructions a `gemm` lowers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPlan {
    /// Warp-level `mma.sync.m16n8k16` with f32 accumulators.
    MmaSync(MmaSyncPlan),
    /// Warpgroup-level `wgmma.mma_async.m64nNk16` (sm_90a) with f32 accumulators.
    Wgmma(WgmmaPlan),
}

/// A `gemm` on `wgmma`: each warpgroup's accumulator rows (64 a row block) by all N columns, one
/// instruction per row block and K-step of 16, between a `wgmma.fence` and a commit and wait of
/// their group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaPlan {
    /// The 16-bit input type (bf16 or f16).
    pub ty: Ty,
    /// The accumulator's layout: 16 rows per warp a row block, every column in each.
    pub c: FragmentLayout,
    /// The accumulator's 16-row blocks a warp (more than one only with A from registers).
    pub row_blocks: u32,
    /// The reduction extent, a multiple of 16.
    pub k: u32,
    /// The instruction's N.
    pub n: u32,
    /// A: a canonical shared tile (its descriptor per K-step) or registers.
    pub a: WgmmaSource,
    /// B: a canonical shared tile.
    pub b: OperandTile,
}

/// Where a `wgmma`'s A operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaSource {
    /// A canonical shared tile, read through descriptors.
    Shared(OperandTile),
    /// An f32 fragment in the accumulator's layout, packed to 16-bit pairs.
    Registers(FragmentLayout),
    /// One warp's 16 rows of a shared tile, loaded into every warp's registers by `ldmatrix`.
    ReplicatedRows,
}

/// A `gemm` on `mma.sync.m16n8k16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaSyncPlan {
    /// The 16-bit input type (bf16 or f16).
    pub ty: Ty,
    /// The accumulator's layout.
    pub c: FragmentLayout,
    /// The reduction extent, a multiple of 16.
    pub k: u32,
    /// Where the left operand's registers come from.
    pub a: OperandSource,
    /// Where the right operand's registers come from.
    pub b: OperandSource,
    /// Why not `wgmma`, on a target that has it.
    pub no_wgmma: Option<NoWgmma>,
}

/// Where an `mma` operand's registers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandSource {
    /// `ldmatrix` from a shared tile, `.trans` when it is stored the other way round.
    Ldmatrix {
        /// `ldmatrix.trans`.
        trans: bool,
    },
    /// An f32 fragment in accumulator layout, packed to 16-bit pairs in registers (no
    /// shared-memory round trip).
    Registers {
        /// The fragment's layout.
        layout: FragmentLayout,
        /// Each packed 8 x 8 block transposed by `movmatrix` (a right operand stored `[K, N]`).
        movmatrix: bool,
    },
}

impl fmt::Display for GemmPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = |s: &OperandSource| match s {
            OperandSource::Ldmatrix { trans: false } => "ldmatrix".to_string(),
            OperandSource::Ldmatrix { trans: true } => "ldmatrix.trans".to_string(),
            OperandSource::Registers { movmatrix: false, .. } => "registers".to_string(),
            OperandSource::Registers { movmatrix: true, .. } => "registers + movmatrix".to_string(),
        };
        let tile = |t: &OperandTile| {
            let swizzle = match t {
                OperandTile::K(k) => k.swizzle,
                OperandTile::MN(m) => m.swizzle,
            };
            format!("shared {:?}-major {swizzle:?}", t.major())
        };
        match self {
            GemmPlan::MmaSync(p) => {
                write!(f, "mma.sync.m16n8k16 {:?}, k {}: a from {}, b from {}", p.ty, p.k, source(&p.a), source(&p.b))?;
                match &p.no_wgmma {
                    Some(why) => write!(f, " (not wgmma: {why})"),
                    None => Ok(()),
                }
            }
            GemmPlan::Wgmma(p) => {
                let a = match &p.a {
                    WgmmaSource::Shared(t) => tile(t),
                    WgmmaSource::Registers(_) => "registers".to_string(),
                    WgmmaSource::ReplicatedRows => "ldmatrix, its 16 rows in every warp".to_string(),
                };
                let blocks = if p.row_blocks > 1 { format!(" x {} row blocks", p.row_blocks) } else { String::new() };
                write!(f, "wgmma.m64n{}k16{blocks} {:?}, k {}: a from {a}, b from {}", p.n, p.ty, p.k, tile(&p.b))
            }
        }
    }
}

impl Lower<'_> {
    /// Selects how `gemm(a, b, c)` lowers, checking its operands: every rule a `gemm` must meet
    /// is checked here, before anything is emitted.
    pub(super) fn plan_gemm(&self, a: &Operand, b: &Operand, c: BufId, loc: SrcLoc) -> Result<GemmPlan, Diag> {
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
        let no_wgmma = match self.wgmma_plan(a, b, c, ab_ty, lc, k) {
            Ok(plan) => return Ok(GemmPlan::Wgmma(plan)),
            Err(NoWgmma::Target(_)) => None,
            Err(why) => Some(why),
        };
        let a = match a_frag {
            None => OperandSource::Ldmatrix { trans: a.transposed },
            Some(layout) => OperandSource::Registers { layout, movmatrix: false },
        };
        let b = match b_frag {
            None => OperandSource::Ldmatrix { trans: !b.transposed },
            Some(layout) => OperandSource::Registers { layout, movmatrix: !b.transposed },
        };
        Ok(GemmPlan::MmaSync(MmaSyncPlan { ty: ab_ty, c: lc, k, a, b, no_wgmma }))
    }

    /// The `wgmma` plan of a checked `gemm`, when `gemm_choice` takes it and `infer_layouts`
    /// laid its operands out for it.
    fn wgmma_plan(
        &self,
        a: &Operand,
        b: &Operand,
        c: BufId,
        ty: Ty,
        lc: FragmentLayout,
        k: u32,
    ) -> Result<WgmmaPlan, NoWgmma> {
        let shape = choose_wgmma(&GemmFacts::of(self.p, a, b, c))?;
        let laid_out = |o: &Operand, major| match self.p.layouts[o.buf] {
            BufLayout::Shared(l) => l.operand_tile(major, self.def().buffers[o.buf].dtype.size_bytes() as u32),
            _ => None,
        };
        // `infer_layouts` lays a wgmma accumulator (and an A fragment) out in whole rows of 16
        // per row block and warp and its shared operands canonically, unless another gemm
        // pinned its fragments otherwise.
        let block_rows = 16 * shape.row_blocks;
        let warpgroup_rows = |l: FragmentLayout| l.wn == 1 && l.warp_rows() == block_rows;
        let a_rows = !matches!(shape.a, WgmmaAFrom::Registers) || warpgroup_rows(self.p.frag(a.buf));
        if !warpgroup_rows(lc) || !a_rows {
            return Err(NoWgmma::PinnedOtherwise);
        }
        let b_tile = laid_out(b, shape.b).ok_or(NoWgmma::PinnedOtherwise)?;
        let a_source = match shape.a {
            WgmmaAFrom::Shared(major) => WgmmaSource::Shared(laid_out(a, major).ok_or(NoWgmma::PinnedOtherwise)?),
            WgmmaAFrom::Registers => WgmmaSource::Registers(self.p.frag(a.buf)),
            WgmmaAFrom::ReplicatedRows => WgmmaSource::ReplicatedRows,
        };
        Ok(WgmmaPlan { ty, c: lc, row_blocks: shape.row_blocks, k, n: shape.n, a: a_source, b: b_tile })
    }

    fn operand_shape(&self, o: &Operand) -> (u32, u32) {
        let s = &self.def().buffers[o.buf].shape;
        let (r, c) = if s.len() == 2 { (s[0], s[1]) } else { (1, s[0]) };
        if o.transposed {
            (c, r)
        } else {
            (r, c)
        }
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
}
