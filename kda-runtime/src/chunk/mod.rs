//! `chunk_kda`, the KDA prefill entry point: validation, planning and the launch.
//!
//! - [`ChunkArgs`] mirrors the reference API parameter by parameter (plus the Rust extras
//!   `state_indices`, `has_initial_state`, `max_seqlen`, `checked` and `workspace`);
//! - [`plan_chunk`] (host code, no GPU) runs every validation branch of the reference, in its
//!   order and with its messages, then the checks docs/semantics.md adds, and resolves the
//!   defaults into a [`ChunkPlan`];
//! - [`check_chunk_indices`] is the opt-in checked mode over host copies of `cu_seqlens` and
//!   `state_indices`;
//! - [`chunk_kda`] launches the kernel variants the plan needs on the device
//!   ([`ChunkTuning::for_call`], [`chunk_config`]) on the caller's stream, over the caller's
//!   `workspace` or the one [`crate::Kernels`] keeps for the stream (`workspace.rs` sizes it):
//!   the fused kernel, or for few chains the preparation kernel and then the chain over its
//!   output (`prepared.rs`), bit-identical to it, for a call of one sequence in token ranges
//!   whose chains overlap the next range's preparation (`ranges.rs`), the same bits again;
//!   with few value heads, long sequences split exactly into segments whose chains run side
//!   by side (`split.rs`), within rounding of one chain.

pub mod args;
pub mod checked;
pub mod launch;
pub mod plan;
pub(crate) mod prepared;
mod ranges;
mod split;
mod workspace;

pub use args::ChunkArgs;
pub use checked::check_chunk_indices;
pub use launch::{
    chunk_config, chunk_kda, chunk_kda_tuned, chunk_tuned_config, chunk_variants, default_operands,
    prepared_max_chains, ChunkOperands, ChunkResult, ChunkShape, ChunkTuning,
};
pub use plan::{plan_chunk, BetaRule, ChunkError, ChunkGate, ChunkPlan, FinalState, InitialState};
pub(crate) use ranges::may_take_ranges;
pub use ranges::{DEFAULT_RANGES, RANGE_MIN_CHUNKS, RANGE_MIN_VALUE_HEADS};
pub use split::{chunk_split_variants, chunk_split_workspace_bytes, SPLIT_MAX_VALUE_HEADS, SPLIT_SEGMENT_TOKENS};
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
