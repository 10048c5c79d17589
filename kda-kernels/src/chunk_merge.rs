//! The merge of the exact long-sequence split (CHUNK-ALGORITHM.md): a sequence cut into
//! segments runs each segment from zeros (its `H`) and, in the chunk kernel's transition mode,
//! from the identity with `v = 0` (its `M`); then, in order, each segment's start state is
//! `S_{s+1} = S_s M_s + H_s` from the sequence's initial state. This kernel does that chain for
//! [`MERGE_ROWS`] value rows of one (sequence, value head) per block (a state's rows chain
//! apart), writing every segment's start state and the final one.
//!
//! The products run on tensor cores with f32 accuracy kept: `S M ≈ S_hi M_hi + S_hi M_lo +
//! S_lo M_hi`, each operand split into a bf16 value and the bf16 rounding of what remains.

use kda_dsl::DType;
use kda_macros::kernel;

/// What a merge variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MergeConfig {
    /// Element type of the initial and final states (`F32`, `BF16` or `F16`).
    pub state_dtype: DType,
    /// Start from `init[n]` (otherwise from zeros).
    pub initial: bool,
}

impl MergeConfig {
    /// A short stable name.
    pub fn key(&self) -> String {
        format!("s{}{}", self.state_dtype, if self.initial { "_init" } else { "" }).to_lowercase()
    }
}

/// `x` as `hi + lo`: its bf16 rounding and the bf16 rounding of what remains (shared tiles of
/// `x`'s shape).
#[kda_macros::kernel_fn]
fn split_hi_lo(x: Tile, hi: Tile, lo: Tile) {
    for (i, j) in parallel(x) {
        let v = x[i][j];
        let h = v as bf16;
        hi[i][j] = h;
        lo[i][j] = v - h;
    }
}

/// Value rows of the state per block: 4 blocks per (sequence, value head) instead of one, so a
/// call of few heads keeps more SMs busy in its serial merge.
pub const MERGE_ROWS: usize = 32;

/// `starts[n·NSEG + s] = S_s` and `fin[n] = S_NSEG`, with `S_0 = init[n]` (or zeros) and
/// `S_{s+1} = S_s M_s + H_s`; states V-first `[V, K]`, `M_s` `[K, K]`.
#[kernel]
pub fn chunk_merge(
    cfg: &MergeConfig,
    init: Global<(N, HV, S1, S2), { cfg.state_dtype }>,
    h: Global<(NS, HV, S1, S2), F32>,
    m: Global<(NS, HV, S1, S2), F32>,
    starts: GlobalMut<(NS, HV, S1, S2), F32>,
    fin: GlobalMut<(N, HV, S1, S2), { cfg.state_dtype }>,
    NSEG: Dim,
) {
    let (xb, hv, n) = launch(grid = [128 / MERGE_ROWS, HV, N], threads = 128);
    assume_extent(S1, 128);
    assume_extent(S2, 128);
    let v0 = xb * MERGE_ROWS;
    // The block's rows of the state live in the accumulator from one segment to the next.
    let acc = fragment([MERGE_ROWS, 128], F32);
    let s_hi = shared([MERGE_ROWS, 128], BF16);
    let s_lo = shared([MERGE_ROWS, 128], BF16);
    let m_sh = shared([128, 128], F32);
    let m_hi = shared([128, 128], BF16);
    let m_lo = shared([128, 128], BF16);
    if cfg.initial {
        copy(init.tile_at([n, hv, v0, 0], [1, 1, MERGE_ROWS, 128]), acc);
    } else {
        clear(acc);
    }
    for sg in serial(0, NSEG) {
        let ns = n * NSEG + sg;
        copy(acc, starts.tile_at([ns, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
        split_hi_lo(acc, s_hi, s_lo);
        copy(m.tile_at([ns, hv, 0, 0], [1, 1, 128, 128]), m_sh);
        split_hi_lo(m_sh, m_hi, m_lo);
        // S M + H, from H.
        copy(h.tile_at([ns, hv, v0, 0], [1, 1, MERGE_ROWS, 128]), acc);
        gemm(s_hi, m_hi, acc);
        gemm(s_hi, m_lo, acc);
        gemm(s_lo, m_hi, acc);
    }
    copy(acc, fin.tile_at([n, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_merge_variant_compiles() {
        for state_dtype in [DType::F32, DType::BF16, DType::F16] {
            for initial in [false, true] {
                let def = chunk_merge(&MergeConfig { state_dtype, initial }).unwrap_or_else(|e| panic!("{e}"));
                let k = kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap_or_else(|e| panic!("{e}"));
                if std::env::var("KDA_EMIT_MERGE").is_ok() && state_dtype == DType::F32 && initial {
                    std::fs::write("/tmp/merge.ptx", &k.ptx).expect("writes");
                }
            }
        }
    }
}
