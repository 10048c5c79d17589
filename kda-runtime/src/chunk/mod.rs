//! `chunk_kda`, the KDA prefill entry point. A call walks plan → path → workspace → steps →
//! launch, one file each:
//!
//! - [`ChunkArgs`] (`args.rs`) mirrors the reference API parameter by parameter, plus the Rust
//!   extras (the pool in place, decode's gate and beta rules, `max_seqlen`, `checked`,
//!   `workspace`);
//! - [`plan_chunk`] (`plan.rs`, host code, no GPU) runs every validation branch of the
//!   reference, in its order and with its messages, then the checks docs/semantics.md adds,
//!   and resolves the defaults into a [`ChunkPlan`], the validated call;
//! - [`check_chunk_indices`] (`checked.rs`) is the opt-in checked mode over host copies of
//!   the index tensors;
//! - `prefix.rs` validates prefix caching (`prefix_lens`, checkpoints) into a [`PrefixPlan`],
//!   which every path takes;
//! - [`ChunkTuning::for_call`] (`tuning.rs`) picks the path from the shapes and the device:
//!   the fused kernel; for few chains the two-kernel path (the preparation, then the chain over
//!   its output, bit-identical); for one long sequence its token ranges, whose chains overlap
//!   the next range's preparation (the same bits again); with few value heads, the exact split
//!   of long sequences into segments run side by side (within rounding of one chain).
//!   `eligibility.rs` says which calls can take the ranges and the split, `workspace.rs` what
//!   each path takes of a workspace;
//! - each path builds its steps (`steps.rs`: in `prepared.rs`, `ranges.rs`, `split.rs`), its
//!   kernels' arguments from `bind.rs`, and `steps::run_steps` binds and launches them on the
//!   caller's stream and the one beside it; [`chunk_kda`] (`launch.rs`) walks these steps, over
//!   the caller's `workspace` or the one [`crate::Kernels`] keeps for the stream.

pub mod args;
pub(crate) mod bind;
pub mod checked;
mod eligibility;
pub mod launch;
pub mod plan;
pub mod prefix;
pub(crate) mod prepared;
mod ranges;
mod split;
mod steps;
pub mod tuning;
mod workspace;

pub use args::ChunkArgs;
pub use checked::{check_chunk_indices, ChunkIndices};
pub(crate) use eligibility::may_take_ranges;
pub use eligibility::{
    DEFAULT_RANGES, RANGE_MIN_BANDWIDTH, RANGE_MIN_CHUNKS, RANGE_MIN_VALUE_HEADS, SPLIT_MAX_VALUE_HEADS,
    SPLIT_SEGMENT_TOKENS,
};
pub use launch::{chunk_kda, chunk_kda_tuned, ChunkResult};
pub use plan::{plan_chunk, BetaRule, ChunkError, ChunkGate, ChunkPlan, FinalState, InitialState};
pub use prefix::{PrefixCaching, PrefixPlan};
pub use split::{chunk_split_variants, chunk_split_workspace_bytes};
pub use tuning::{
    chunk_config, chunk_hopper_variant, chunk_tuned_config, chunk_variants, default_operands, prepared_max_chains,
    ChainSms, ChunkOperands, ChunkShape, ChunkTuning, DefaultPath,
};
pub use workspace::{chunk_tuned_workspace_bytes, chunk_workspace_bound, chunk_workspace_bytes};

/// What the chunk modules' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::tensor::TensorView;
    use kda_dsl::DType;

    /// A descriptor of a tensor at a made-up address, 1 MiB apart per `id` (planning and binding
    /// read no device memory).
    pub(crate) fn tv(id: u64, shape: &[usize], dtype: DType) -> TensorView {
        TensorView::describe(0x10_0000 * id, shape, dtype, 0).expect("a view")
    }

    /// The five bf16 inputs `q, k, v, g, beta` of a dense call of `b` rows of `t` tokens on
    /// `h` heads (as many value heads), at ids 1 to 5.
    pub(crate) fn dense_bf16_inputs(b: usize, t: usize, h: usize) -> [TensorView; 5] {
        let rows = |id, heads_tail: &[usize]| tv(id, &[&[b, t][..], heads_tail].concat(), DType::BF16);
        let d = crate::validate::HEAD_DIM;
        [rows(1, &[h, d]), rows(2, &[h, d]), rows(3, &[h, d]), rows(4, &[h, d]), rows(5, &[h])]
    }
}
