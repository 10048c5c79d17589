//! The two-kernel path of `chunk_kda`: `chunk_prep` fills the caller's workspace with every
//! chunk's state-independent operands, in parallel over chunks; the `chunk` variant with
//! `Preparation::Workspace` then runs each sequence's chain over them (`chunk_prep.rs`).

use cudarc::driver::CudaStream;
use kda_kernels::chunk::ChunkConfig;
use kda_kernels::chunk_prep::PrepConfig;

use super::launch::launch_ready;
use super::plan::ChunkPlan;
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::KernelArg;
use kda_dsl::artifact::CompiledKernel;

/// Blocks of the preparation grid, at most (before the per-sequence floor of one): enough to
/// spread a long sequence's chunks over every SM, without launching millions that find none.
const PREP_BLOCKS: usize = 1 << 18;

/// Chunks each preparation block strides over, about. One chunk per block ran a block's entry
/// work (the parameters, the GVA head's divisions, the first fills) once per chunk, with
/// nothing to overlap its loads; 8 measured fastest of 1, 4, 8 and 32 at B = 1, T = 32768
/// (docs/performance.md, 2026-12-02, run 4).
const PREP_CHUNKS_PER_BLOCK: usize = 8;

/// Chunk-preparation blocks per (sequence, value head): one per [`PREP_CHUNKS_PER_BLOCK`]
/// chunks of the longest sequence the shapes (or the `max_seqlen` hint) allow, capped so that
/// the grid stays near [`PREP_BLOCKS`]. Each block strides over its sequence's chunks, so any
/// value covers them all: a wrong hint costs time, never a chunk.
pub(super) fn prep_blocks(plan: &ChunkPlan) -> usize {
    let longest = plan.longest_sequence();
    let cap = (PREP_BLOCKS / (plan.nseq * plan.value_heads).max(1)).max(1);
    longest.div_ceil(16 * PREP_CHUNKS_PER_BLOCK).clamp(1, cap)
}

/// Launches `chunk_prep` for `cfg`'s call with the arguments `bound` for its `chunk` kernel
/// (the preparation takes the ones it declares), over `blocks` blocks per (sequence, value
/// head) when given.
pub(super) fn launch_preparation(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    plan: &ChunkPlan,
    cfg: &ChunkConfig,
    bound: &[(&'static str, KernelArg)],
    blocks: Option<usize>,
) -> Result<(), RuntimeError> {
    let ready = kernels.chunk_prep(&PrepConfig::of(cfg))?;
    let args = preparation_args(&ready.kernel, plan, bound, blocks);
    launch_ready(gpu, kernels, stream, &ready, args.as_slice())
}

/// The preparation kernel's arguments (in an array: building them allocates nothing).
pub(crate) struct PrepArgs {
    items: [(&'static str, KernelArg); ARGS],
    len: usize,
}

/// Room for every argument of the chain's kernel, and `NX`.
const ARGS: usize = 19;

impl PrepArgs {
    /// The arguments, by name.
    pub(crate) fn as_slice(&self) -> &[(&'static str, KernelArg)] {
        &self.items[..self.len]
    }
}

/// The arguments of the preparation `kernel`: those of `bound` (its `chunk` kernel's) it
/// declares, and its grid's `NX` (`blocks`, checked below 2^31 by the caller, or
/// [`prep_blocks`]).
pub(crate) fn preparation_args(
    kernel: &CompiledKernel,
    plan: &ChunkPlan,
    bound: &[(&'static str, KernelArg)],
    blocks: Option<usize>,
) -> PrepArgs {
    let takes = |name: &str| kernel.params.iter().any(|p| p.name() == name);
    let mut args = PrepArgs { items: [("", KernelArg::I32(0)); ARGS], len: 0 };
    let nx = i32::try_from(blocks.unwrap_or_else(|| prep_blocks(plan))).expect("fewer than 2^31 blocks");
    for arg in bound.iter().filter(|(n, _)| takes(n)).copied().chain([("NX", KernelArg::I32(nx))]) {
        args.items[args.len] = arg;
        args.len += 1;
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::testing::tv;
    use crate::chunk::{plan_chunk, ChunkArgs};
    use kda_dsl::DType::BF16;

    /// The preparation grid per (sequence, value head) for a dense call of `b` sequences of
    /// `t` tokens and `hv` heads.
    fn blocks(b: usize, t: usize, hv: usize) -> usize {
        let tv = |id: u64, shape: &[usize]| tv(id, shape, BF16);
        let (q, k) = (tv(1, &[b, t, hv, 128]), tv(2, &[b, t, hv, 128]));
        let (v, g, beta) = (tv(3, &[b, t, hv, 128]), tv(4, &[b, t, hv, 128]), tv(5, &[b, t, hv]));
        prep_blocks(&plan_chunk(&ChunkArgs::new(&q, &k, &v, &g, &beta)).expect("a valid call"))
    }

    #[test]
    fn preparation_blocks_take_about_eight_chunks_each() {
        assert_eq!(blocks(1, 32768, 32), 256);
        assert_eq!(blocks(1, 16 * 8 + 1, 2), 2);
        assert_eq!(blocks(2, 37, 4), 1);
        // The grid stays near PREP_BLOCKS: 2^15 chains leave 8 blocks each.
        assert_eq!(blocks(1024, 1 << 16, 32), PREP_BLOCKS / (1024 * 32));
    }
}
