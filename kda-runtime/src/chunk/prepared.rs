//! The paths of `chunk_kda` on one chain kernel: the fused kernel, and the two-kernel path, on
//! which `chunk_prep` fills the workspace with every chunk's state-independent operands, in
//! parallel over chunks, and the `chunk` variant with `Preparation::Workspace` then runs each
//! sequence's chain over them (`chunk_prep.rs`).

use kda_dsl::Target;
use kda_kernels::chunk::{ChunkConfig, Preparation};
use kda_kernels::chunk_prep::PrepConfig;

use super::bind::ChunkKernelArgs;
use super::plan::ChunkPlan;
use super::steps::{Lane, Step};
use super::tuning::ChainSms;

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
pub(crate) fn prep_blocks(plan: &ChunkPlan) -> usize {
    prep_blocks_over(plan.longest_sequence(), plan)
}

/// [`prep_blocks`] for a preparation whose longest sequence prepares `longest` tokens (a token
/// range's window).
pub(crate) fn prep_blocks_over(longest: usize, plan: &ChunkPlan) -> usize {
    let cap = (PREP_BLOCKS / (plan.nseq * plan.value_heads).max(1)).max(1);
    longest.div_ceil(16 * PREP_CHUNKS_PER_BLOCK).clamp(1, cap)
}

/// The steps of a call that runs one chain kernel (`cfg`, over `bound`): the fused kernel, or
/// on the two-kernel path its preparation first, over `blocks` blocks per (sequence, value
/// head) when given (else [`prep_blocks`]). At most two, in an array: building them allocates
/// nothing.
pub(super) fn chain_steps(
    plan: &ChunkPlan,
    cfg: ChunkConfig,
    target: Target,
    bound: ChunkKernelArgs,
    blocks: Option<usize>,
    sms: ChainSms,
) -> [Option<Step>; 2] {
    let prepare = (cfg.preparation == Preparation::Workspace).then(|| Step::Prepare {
        cfg: PrepConfig::of(&cfg),
        args: bound,
        blocks: blocks.unwrap_or_else(|| prep_blocks(plan)),
    });
    [prepare, Some(Step::Chain { lane: Lane::Call, cfg, target, args: bound, sms })]
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

    /// One chain kernel's steps: the fused kernel alone, or its preparation first over the
    /// given or default grid; both bind.
    #[test]
    fn chain_steps_prepare_only_on_the_two_kernel_path() {
        use crate::chunk::bind::kernel_args;
        use crate::chunk::tuning::{chunk_tuned_config, ChunkTuning};
        let tv = |id: u64, shape: &[usize]| tv(id, shape, BF16);
        let (q, k) = (tv(1, &[2, 70, 2, 128]), tv(2, &[2, 70, 2, 128]));
        let (v, g, beta, out) =
            (tv(3, &[2, 70, 4, 128]), tv(4, &[2, 70, 4, 128]), tv(5, &[2, 70, 4]), tv(6, &[2, 70, 4, 128]));
        let ws = crate::chunk::testing::tv(7, &[1 << 20], kda_dsl::DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.output = Some(&out);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        for (prepared, blocks, want) in
            [(false, None, None), (true, None, Some(prep_blocks(&plan))), (true, Some(3), Some(3))]
        {
            let cfg = chunk_tuned_config(&plan, ChunkTuning::of_path(&plan, prepared));
            let bound = kernel_args(&args, &plan, &cfg, out.ptr(), None).expect("arguments");
            let steps: Vec<Step> =
                chain_steps(&plan, cfg, Target::Sm80, bound, blocks, ChainSms::Shared).into_iter().flatten().collect();
            let got = match &steps[..] {
                [Step::Chain { lane: Lane::Call, .. }] => None,
                [Step::Prepare { blocks, .. }, Step::Chain { lane: Lane::Call, .. }] => Some(*blocks),
                other => panic!("{other:?}"),
            };
            assert_eq!(got, want, "prepared {prepared}, blocks {blocks:?}");
            crate::chunk::steps::assert_steps_bind(&steps);
        }
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
