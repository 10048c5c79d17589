//! Which tensor-core instruction a `gemm` takes: `wgmma` where the target has it and the
//! operands fit it, `mma.sync` otherwise, with the reason ([`NoWgmma`]). One function decides
//! ([`choose_wgmma`]); `infer_layouts` lays the operands out for its answer and the lowering's
//! plan (`lower/gemm_plan.rs`) asks it again over the layouts it got, so the two never disagree.
//!
//! A `wgmma` is one warpgroup's 64 x N product: the accumulator's rows split over the warps 16
//! each (a warpgroup of 4 warps owns 64 rows), every warp holds all N columns, and N (the
//! accumulator's columns) is a multiple of 8 up to 256. An accumulator of 32 or more rows a warp
//! takes one `wgmma` per 16-row block of each warp (a warpgroup of 4 warps then owns 128 rows
//! or more): the instruction's 64 rows are every warp's block `i`, which only an A operand from
//! registers can give in that order (a shared A's 64 rows are evenly spaced lines). B is a
//! shared tile in a canonical layout, A a canonical shared tile or registers (the RS form): an
//! f32 fragment packed to 16-bit pairs, or one warp's 16 rows of a shared tile that every warp
//! reads whole (`tile.replicated()`), each warp loading them into its A registers with
//! `ldmatrix`.
//! A canonical tile here has rows of one line of a hardware swizzle (32 or 64 bytes) or of whole
//! 128-byte lines, which it stores as slabs one line wide (K, or M or N for an MN-major
//! operand, a multiple of 64 bf16 then).

use std::fmt;

use crate::dtype::DType;
use crate::hopper_layout::Major;
use crate::layout::SharedLayout;
use crate::target::Target;

/// What the choice needs to know of one `gemm` operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandFacts {
    /// A fragment (registers), not a shared tile.
    pub fragment: bool,
    /// Its shape as stored: (rows, columns).
    pub stored: (u32, u32),
    /// Read as its transpose.
    pub transposed: bool,
    /// Read whole by every warp (`tile.replicated()`).
    pub replicated: bool,
    /// Its element type.
    pub dtype: DType,
}

/// What the choice needs to know of a `gemm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmFacts {
    /// The target.
    pub target: Target,
    /// The accumulator's (rows, columns).
    pub acc: (u32, u32),
    /// Warps the accumulator spreads over.
    pub warps: u32,
    /// Whether the `gemm` runs in a `warp_group` block (its warps then need not be whole
    /// warpgroups from warp 0).
    pub in_warp_group: bool,
    /// The kernel's narrowest N for `wgmma` (`launch(.., wgmma_min_n)`).
    pub min_n: u32,
    /// The left operand (`[M, K]` after its transpose).
    pub a: OperandFacts,
    /// The right operand (`[K, N]` after its transpose).
    pub b: OperandFacts,
}

/// Where a `wgmma`'s A operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WgmmaAFrom {
    /// A canonical shared tile of this major-ness (the SS form).
    Shared(Major),
    /// An f32 fragment packed to 16-bit pairs (the RS form).
    Registers,
    /// The 16 rows of a shared tile every warp reads whole (`tile.replicated()`), loaded into
    /// each warp's A registers by `ldmatrix` (the RS form): each warp's 16 accumulator rows are
    /// the same product.
    ReplicatedRows,
}

/// A `gemm` on `wgmma`: N per instruction, A's source and B's major-ness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaShape {
    /// The instruction's N: the accumulator's columns.
    pub n: u32,
    /// Where A comes from.
    pub a: WgmmaAFrom,
    /// B's major-ness: K when stored `[N, K]` (`b.t()`), MN when stored `[K, N]`.
    pub b: Major,
    /// The accumulator's 16-row blocks a warp: one instruction each per K-step.
    pub row_blocks: u32,
}

/// Why a `gemm` does not take `wgmma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NoWgmma {
    /// The target has no `wgmma` (sm_90a only).
    Target(Target),
    /// Inside a `warp_group` block.
    WarpGroup,
    /// The accumulator's rows are not a multiple of 16 per warp over whole warpgroups.
    AccumulatorRows {
        /// Its rows.
        rows: u32,
        /// The warps it spreads over.
        warps: u32,
    },
    /// The accumulator's columns (the instruction's N) are not a multiple of 8 up to 256.
    Columns(u32),
    /// The accumulator's columns are fewer than the kernel's `wgmma_min_n`.
    Narrow {
        /// Its columns.
        n: u32,
        /// The kernel's `wgmma_min_n`.
        min_n: u32,
    },
    /// The accumulator holds more than 16 rows a warp, and A does not come from registers.
    RowBlocksFromShared {
        /// The accumulator's rows a warp.
        rows_per_warp: u32,
    },
    /// B is a fragment (`wgmma` reads B from shared memory only).
    RegisterB,
    /// A is transposed from registers, or replicated but not 16 untransposed rows of a shared
    /// tile.
    RegisterOrReplicatedA,
    /// An operand's element type is not 16-bit.
    InputType(DType),
    /// The accumulator or an A fragment is laid out for another gemm (B from registers, or a
    /// replicated A), which takes `mma.sync`, and the operands with it.
    PinnedOtherwise,
    /// An operand's rows are not one 32- or 64-byte swizzle line or whole 128-byte lines, or
    /// not whole atoms of 8 rows.
    NotCanonical {
        /// `'a'` or `'b'`.
        operand: char,
        /// Its stored shape.
        stored: (u32, u32),
    },
}

impl fmt::Display for NoWgmma {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoWgmma::Target(t) => write!(f, "{t} has no wgmma (sm_90a)"),
            NoWgmma::WarpGroup => f.write_str("inside a warp group block"),
            NoWgmma::AccumulatorRows { rows, warps } => {
                write!(
                    f,
                    "the accumulator's {rows} rows are not a multiple of 16 per warp over {warps} warps in whole warpgroups"
                )
            }
            NoWgmma::Columns(n) => write!(f, "N = {n} is not a multiple of 8 up to 256"),
            NoWgmma::Narrow { n, min_n } => write!(f, "N = {n} is below the kernel's wgmma_min_n = {min_n}"),
            NoWgmma::RowBlocksFromShared { rows_per_warp } => {
                write!(f, "the accumulator's {rows_per_warp} rows a warp need A from registers (a fragment)")
            }
            NoWgmma::RegisterB => f.write_str("B is a fragment"),
            NoWgmma::RegisterOrReplicatedA => {
                f.write_str("A is a transposed fragment, or replicated but not 16 untransposed rows of a shared tile")
            }
            NoWgmma::InputType(d) => write!(f, "{d} operand, not 16-bit"),
            NoWgmma::PinnedOtherwise => f.write_str("a fragment another gemm lays out for mma.sync"),
            NoWgmma::NotCanonical { operand, stored: (r, c) } => {
                write!(f, "{operand} [{r} x {c}]: rows are not one 32- or 64-byte line or whole 128-byte lines, in whole 8-row atoms")
            }
        }
    }
}

impl GemmFacts {
    /// The facts of `gemm(a, b, c)` in `p` (its warp groups assigned).
    pub fn of(
        p: &crate::passes::TileProgram,
        a: &crate::tile::Operand,
        b: &crate::tile::Operand,
        c: crate::tile::BufId,
    ) -> GemmFacts {
        let def = &p.def;
        let facts = |o: &crate::tile::Operand| {
            let x = &def.buffers[o.buf];
            let stored = match x.shape[..] {
                [r, c] => (r, c),
                [c] => (1, c),
                _ => (0, 0),
            };
            OperandFacts {
                fragment: x.scope == crate::tile::Scope::Fragment,
                stored,
                transposed: o.transposed,
                replicated: o.replicated,
                dtype: x.dtype,
            }
        };
        let shape = &def.buffers[c].shape;
        GemmFacts {
            target: p.target,
            acc: (shape.first().copied().unwrap_or(0), shape.get(1).copied().unwrap_or(0)),
            warps: p.warps_of(c),
            // Fill warps come after the kernel's `threads`: its warps still start at warp 0.
            in_warp_group: p.owner[c] != 0,
            min_n: def.wgmma_min_n,
            a: facts(a),
            b: facts(b),
        }
    }
}

/// The `wgmma` a `gemm` takes, or why it takes `mma.sync`.
pub fn choose_wgmma(g: &GemmFacts) -> Result<WgmmaShape, NoWgmma> {
    if g.target != Target::Sm90a {
        return Err(NoWgmma::Target(g.target));
    }
    if g.in_warp_group {
        return Err(NoWgmma::WarpGroup);
    }
    let (rows, n) = g.acc;
    if g.warps == 0 || !g.warps.is_multiple_of(4) || rows == 0 || !rows.is_multiple_of(16 * g.warps) {
        return Err(NoWgmma::AccumulatorRows { rows, warps: g.warps });
    }
    if !n.is_multiple_of(8) || !(8..=256).contains(&n) {
        return Err(NoWgmma::Columns(n));
    }
    if n < g.min_n {
        return Err(NoWgmma::Narrow { n, min_n: g.min_n });
    }
    let row_blocks = rows / (16 * g.warps);
    if row_blocks > 1 && !(g.a.fragment && !g.a.transposed && !g.a.replicated) {
        return Err(NoWgmma::RowBlocksFromShared { rows_per_warp: rows / g.warps });
    }
    if g.b.fragment {
        return Err(NoWgmma::RegisterB);
    }
    let one_warps_rows = !g.a.fragment && !g.a.transposed && g.a.stored.0 == 16;
    if (g.a.replicated && !one_warps_rows) || (g.a.fragment && g.a.transposed) {
        return Err(NoWgmma::RegisterOrReplicatedA);
    }
    // `wgmma` multiplies bf16 or f16 (an f32 operand would take its tf32 form).
    let input_type = |d: DType| match d {
        DType::BF16 | DType::F16 => Ok(()),
        d => Err(NoWgmma::InputType(d)),
    };
    let canonical = |o: &OperandFacts, operand: char| -> Result<(), NoWgmma> {
        input_type(o.dtype)?;
        let (r, c) = o.stored;
        match SharedLayout::canonical(r, c, o.dtype.size_bytes() as u32) {
            Some(_) => Ok(()),
            None => Err(NoWgmma::NotCanonical { operand, stored: o.stored }),
        }
    };
    canonical(&g.b, 'b')?;
    // Stored [N, K] (`b.t()`) has K contiguous; stored [K, N], N.
    let b = if g.b.transposed { Major::K } else { Major::MN };
    let a = if g.a.replicated {
        input_type(g.a.dtype)?;
        WgmmaAFrom::ReplicatedRows
    } else if g.a.fragment {
        WgmmaAFrom::Registers
    } else {
        canonical(&g.a, 'a')?;
        // Stored [M, K] has K contiguous; stored [K, M] (`a.t()`), M.
        WgmmaAFrom::Shared(if g.a.transposed { Major::MN } else { Major::K })
    };
    Ok(WgmmaShape { n, a, b, row_blocks })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(stored: (u32, u32), transposed: bool) -> OperandFacts {
        OperandFacts { fragment: false, stored, transposed, replicated: false, dtype: DType::BF16 }
    }

    fn gemm() -> GemmFacts {
        GemmFacts {
            target: Target::Sm90a,
            acc: (128, 128),
            warps: 8,
            in_warp_group: false,
            min_n: 8,
            a: shared((128, 64), false),
            b: shared((128, 64), true),
        }
    }

    /// Each rule picks `wgmma` or says which part of the `gemm` does not fit.
    #[test]
    fn each_rule_has_its_reason() {
        let ok = WgmmaShape { n: 128, a: WgmmaAFrom::Shared(Major::K), b: Major::K, row_blocks: 1 };
        assert_eq!(choose_wgmma(&gemm()), Ok(ok));
        let b_kn = GemmFacts { b: shared((64, 64), false), acc: (128, 64), ..gemm() };
        assert_eq!(choose_wgmma(&b_kn).map(|s| s.b), Ok(Major::MN));
        // At the kernel's narrowest N it still takes `wgmma`.
        assert_eq!(choose_wgmma(&GemmFacts { min_n: 128, ..gemm() }), Ok(ok));
        let regs = GemmFacts { a: OperandFacts { fragment: true, dtype: DType::F32, ..gemm().a }, ..gemm() };
        assert_eq!(choose_wgmma(&regs).map(|s| s.a), Ok(WgmmaAFrom::Registers));
        // 32 rows a warp: two instructions a K-step, A from registers only.
        let two_blocks = GemmFacts { warps: 4, ..regs };
        assert_eq!(choose_wgmma(&two_blocks).map(|s| (s.a, s.row_blocks)), Ok((WgmmaAFrom::Registers, 2)));
        let replicated = GemmFacts { a: OperandFacts { replicated: true, ..shared((16, 64), false) }, ..gemm() };
        assert_eq!(choose_wgmma(&replicated).map(|s| s.a), Ok(WgmmaAFrom::ReplicatedRows));
        let (rows32, transposed) = (shared((32, 64), false), shared((64, 16), true));
        for a in [rows32, transposed] {
            let facts = GemmFacts { a: OperandFacts { replicated: true, ..a }, ..gemm() };
            assert_eq!(choose_wgmma(&facts), Err(NoWgmma::RegisterOrReplicatedA), "{a:?}");
        }
        let cases = [
            (GemmFacts { target: Target::Sm90, ..gemm() }, NoWgmma::Target(Target::Sm90)),
            (GemmFacts { in_warp_group: true, ..gemm() }, NoWgmma::WarpGroup),
            (GemmFacts { warps: 4, ..gemm() }, NoWgmma::RowBlocksFromShared { rows_per_warp: 32 }),
            (GemmFacts { warps: 4, acc: (96, 128), ..gemm() }, NoWgmma::AccumulatorRows { rows: 96, warps: 4 }),
            (GemmFacts { warps: 2, acc: (32, 128), ..gemm() }, NoWgmma::AccumulatorRows { rows: 32, warps: 2 }),
            (GemmFacts { acc: (128, 264), ..gemm() }, NoWgmma::Columns(264)),
            (GemmFacts { acc: (128, 12), ..gemm() }, NoWgmma::Columns(12)),
            (GemmFacts { min_n: 256, ..gemm() }, NoWgmma::Narrow { n: 128, min_n: 256 }),
            (GemmFacts { b: OperandFacts { fragment: true, ..gemm().b }, ..gemm() }, NoWgmma::RegisterB),
            (GemmFacts { a: OperandFacts { replicated: true, ..gemm().a }, ..gemm() }, NoWgmma::RegisterOrReplicatedA),
            (GemmFacts { b: OperandFacts { dtype: DType::F32, ..gemm().b }, ..gemm() }, NoWgmma::InputType(DType::F32)),
            (
                GemmFacts { a: shared((128, 48), false), ..gemm() },
                NoWgmma::NotCanonical { operand: 'a', stored: (128, 48) },
            ),
        ];
        for (facts, why) in cases {
            assert_eq!(choose_wgmma(&facts), Err(why), "{facts:?}");
            assert!(!why.to_string().is_empty());
        }
    }
}
