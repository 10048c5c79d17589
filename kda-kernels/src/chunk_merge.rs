//! The state kernels of the exact long-sequence split (`kda-kernels/src/chunk_split.rs`), over the
//! segment schedule `chunk_segments` writes (`seg_first[n]`: sequence `n`'s first segment). Each
//! segment but a sequence's last has run from zeros (its `H`) and, in the chunk kernel's
//! transition mode, from the identity with `v = 0` (its `M`).
//!
//! - [`chunk_merge`] chains each sequence's start states, `S_{s+1} = S_s M_s + H_s` from the
//!   sequence's initial state (or its pool slot, or zeros), writing every segment's start;
//!   [`MERGE_ROWS`] value rows of one (sequence, value head) per block (a state's rows chain
//!   apart). The products run on tensor cores with f32 accuracy kept: `S M ≈ S_hi M_hi + S_hi
//!   M_lo + S_lo M_hi`, each operand split into a bf16 value and the bf16 rounding of what
//!   remains.
//! - The output pass then runs every segment from its start and leaves its end state in the
//!   same slot; [`chunk_finish`] copies each sequence's last one to its final state (or pool
//!   slot), rounded once to the state's type, as the unsplit kernel stores it.

use crate::chunk::{starts_from_slot, state_slot, ChunkStates};
use kda_dsl::DType;
use kda_macros::kernel;

/// What a merge or finish variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MergeConfig {
    /// Element type of the call's initial and final states, or of its pool (`F32`, `BF16` or
    /// `F16`).
    pub state_dtype: DType,
    /// Where the call's states start and where its final states go (the call's own).
    pub states: ChunkStates,
}

impl Default for MergeConfig {
    /// The bench case's: f32 states, an initial state in and the final state out.
    fn default() -> Self {
        MergeConfig { state_dtype: DType::F32, states: ChunkStates::PerSequence { store_final: true } }
    }
}

impl MergeConfig {
    /// A short stable name.
    pub fn key(&self) -> String {
        format!("s{}_{}", self.state_dtype, self.states.key()).to_lowercase()
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

/// Sequence `n`'s segments `first .. end` (`seg_first` clamped into the tables' `NS` slots).
#[kda_macros::kernel_fn]
fn segment_end(seg_first: Tensor, n: Val, ns: Val) -> Val {
    min(seg_first[n + 1], ns)
}

/// `starts[first] = S_0` and `starts[s + 1] = S_s M_s + H_s` over sequence `n`'s segments `s`
/// but its last, with `S_0` its initial state (its read slot, or zeros); states V-first
/// `[V, K]`, `M_s` `[K, K]`. A padding sequence (pool slot outside the pool) writes nothing.
#[kernel]
pub fn chunk_merge(
    cfg: &MergeConfig,
    state: Global<(P, HV, S1, S2), { cfg.state_dtype }>,
    state_indices: Global<(NI,), { cfg.states.indices() }>,
    read_indices: Global<(NR,), { cfg.states.indices() }>,
    has_initial: Global<(NH,), { cfg.states.has_initial().unwrap_or(I32) }>,
    seg_first: Global<(NF,), I32>,
    h: Global<(NS, HV, S1, S2), F32>,
    m: Global<(NS, HV, S1, S2), F32>,
    starts: GlobalMut<(NS, HV, S1, S2), F32>,
    NSEQ: Dim,
) {
    let (xb, hv, n) = launch(grid = [128 / MERGE_ROWS, HV, NSEQ], threads = 256);
    assume_extent(S1, 128);
    assume_extent(S2, 128);
    let v0 = xb * MERGE_ROWS;
    let slot = state_slot(cfg.states.pool(), state_indices, n, P);
    let read = state_slot(cfg.states.pool(), read_indices, n, P);
    let from_state = starts_from_slot(cfg.states.has_initial().is_some(), has_initial, n, read);
    let first = seg_first[n];
    let end = segment_end(seg_first, n, NS);
    // The block's rows of the state live in the accumulator from one segment to the next.
    let acc = fragment([MERGE_ROWS, 128], F32);
    let s_hi = shared([MERGE_ROWS, 128], BF16);
    let s_lo = shared([MERGE_ROWS, 128], BF16);
    // M goes through registers on its way to its bf16 halves: an f32 copy in shared memory
    // would take the block past the 99 KB of sm_86 and sm_89 parts. 8 warps hold it, one
    // segment ahead, without spilling (4 warps needed 255 registers and spilled on sm_90).
    let m_rf = fragment([128, 128], F32);
    let m_hi = shared([128, 128], BF16);
    let m_lo = shared([128, 128], BF16);
    if slot >= 0 && first < end {
        if cfg.states.reads_state() && from_state {
            copy(state.tile_at([read, hv, v0, 0], [1, 1, MERGE_ROWS, 128]), acc);
        } else {
            clear(acc);
        }
        copy(acc, starts.tile_at([first, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
        // M of the first segment; each step then loads the next one's while its products run
        // (the step's loads would otherwise wait out a global round trip each). A sequence's
        // last segment has no M: the transitions never run it, so it is not read.
        if first < end - 1 {
            copy(m.tile_at([first, hv, 0, 0], [1, 1, 128, 128]), m_rf);
        }
        for sg in serial(first, end - 1) {
            split_hi_lo(acc, s_hi, s_lo);
            // S M + H, from H (its load in flight while M splits).
            copy(h.tile_at([sg, hv, v0, 0], [1, 1, MERGE_ROWS, 128]), acc);
            split_hi_lo(m_rf, m_hi, m_lo);
            if sg + 1 < end - 1 {
                copy(m.tile_at([sg + 1, hv, 0, 0], [1, 1, 128, 128]), m_rf);
            }
            gemm(s_hi, m_hi, acc);
            gemm(s_hi, m_lo, acc);
            gemm(s_lo, m_hi, acc);
            copy(acc, starts.tile_at([sg + 1, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
        }
    }
}

/// Sequence `n`'s final state, from its last segment's end state (`ends[end - 1]`, left there
/// by the output pass), to `final_state[n]` or back into its pool slot; a padding sequence
/// writes nothing.
#[kernel]
pub fn chunk_finish(
    cfg: &MergeConfig,
    state: GlobalMut<(P, HV, S1, S2), { cfg.state_dtype }>,
    final_state: GlobalMut<(F, HV, S1, S2), { cfg.state_dtype }>,
    state_indices: Global<(NI,), { cfg.states.indices() }>,
    seg_first: Global<(NF,), I32>,
    ends: Global<(NS, HV, S1, S2), F32>,
    NSEQ: Dim,
) {
    let (xb, hv, n) = launch(grid = [128 / MERGE_ROWS, HV, NSEQ], threads = 128);
    assume_extent(S1, 128);
    assume_extent(S2, 128);
    let v0 = xb * MERGE_ROWS;
    let slot = state_slot(cfg.states.pool(), state_indices, n, P);
    let first = seg_first[n];
    let end = segment_end(seg_first, n, NS);
    let rows = fragment([MERGE_ROWS, 128], F32);
    if slot >= 0 && first < end {
        copy(ends.tile_at([end - 1, hv, v0, 0], [1, 1, MERGE_ROWS, 128]), rows);
        if cfg.states.pool() {
            copy(rows, state.tile_at([slot, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
        } else {
            copy(rows, final_state.tile_at([n, hv, v0, 0], [1, 1, MERGE_ROWS, 128]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_merge_variant_compiles() {
        let pool = ChunkStates::Pool { indices: DType::I64, has_initial: Some(DType::I32) };
        for state_dtype in [DType::F32, DType::BF16, DType::F16] {
            for states in
                [ChunkStates::Zeros { store_final: true }, ChunkStates::PerSequence { store_final: true }, pool]
            {
                let cfg = MergeConfig { state_dtype, states };
                for def in [chunk_merge(&cfg), chunk_finish(&cfg)] {
                    let def = def.unwrap_or_else(|e| panic!("{e}"));
                    kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
                }
            }
        }
    }
}
