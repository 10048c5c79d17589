//! The workspace a prefill call needs: by its path ([`chunk_tuned_workspace_bytes`]), for the
//! path [`chunk_kda`](super::chunk_kda) picks on a device ([`chunk_workspace_bytes`]), and a
//! bound for engines that allocate once from the largest call they will make
//! ([`chunk_workspace_bound`]).

use super::eligibility::{SPLIT_MAX_VALUE_HEADS, SPLIT_SEGMENT_TOKENS};
use super::plan::{chunk_workspace_bytes_unsplit, prepared_bytes, ChunkPlan};
use super::split::{split_bytes_bound, split_layout_bytes};
use super::tuning::ChunkTuning;
use crate::device::DeviceLimits;
use crate::error::RuntimeError;
use crate::tensor::TensorView;
use kda_kernels::chunk_prep::prep_rows;

/// Bytes of workspace the call of `plan` takes on `device` ([`ChunkTuning::for_call`]'s path):
/// 0 for the fused kernel (then any workspace or none is accepted), the prepared operands for
/// the two-kernel path and its token ranges, the split's tables and operands for a split call.
/// From the shapes and the `max_seqlen` hint (a varlen call whose hint leaves no sequence long
/// enough to split needs no split tables): a workspace sized with a hint is too small for the
/// same call with a longer hint or none. Not monotone in the shapes (more chains can take the
/// fused kernel, which needs none): to allocate once, size by [`chunk_workspace_bound`].
/// Saturates at `usize::MAX` for shapes no device could hold.
pub fn chunk_workspace_bytes(plan: &ChunkPlan, device: &DeviceLimits) -> usize {
    chunk_tuned_workspace_bytes(plan, &ChunkTuning::for_call(plan, device))
}

/// Bytes of workspace the call of `plan` takes when run with `tune`
/// ([`chunk_kda_tuned`](super::chunk_kda_tuned)); as [`chunk_workspace_bytes`].
pub fn chunk_tuned_workspace_bytes(plan: &ChunkPlan, tune: &ChunkTuning) -> usize {
    match (tune.split, tune.prepared) {
        (Some(seg), _) => split_layout_bytes(plan, seg),
        (None, true) => chunk_workspace_bytes_unsplit(plan),
        (None, false) => 0,
    }
}

/// Bytes of workspace enough for every call of at most `tokens` tokens (`B · T`, or varlen
/// `S`), `sequences` sequences and `value_heads` value heads, on any device and path: the
/// prepared operands of every token row (a dense row rounds up to whole chunks, so 15 more per
/// sequence; 31 with `prefix_lens`, whose first chunk may be short: the bound takes that), or
/// with at most [`SPLIT_MAX_VALUE_HEADS`] value heads the split's tables for a segment per
/// [`SPLIT_SEGMENT_TOKENS`] tokens and one per sequence, whichever is larger. Grows
/// with each argument (the split's part counts at most [`SPLIT_MAX_VALUE_HEADS`] heads, so more
/// heads never shrink it); the dtypes do not change it (the operands are 16-bit either way).
/// Saturates at `usize::MAX`.
pub fn chunk_workspace_bound(tokens: usize, sequences: usize, value_heads: usize) -> usize {
    let (wb, tp) = prep_rows(1, tokens, sequences, true, true);
    let prepared = prepared_bytes(wb, tp, value_heads);
    let split_heads = value_heads.min(SPLIT_MAX_VALUE_HEADS);
    prepared.max(split_bytes_bound(sequences, tokens, split_heads, SPLIT_SEGMENT_TOKENS))
}

/// A workspace given to a call holds the `need` bytes of its path; the error names `workspace`.
pub(super) fn check_workspace(workspace: &TensorView, need: usize) -> Result<(), RuntimeError> {
    let have = workspace.size_bytes();
    if have >= need {
        return Ok(());
    }
    Err(RuntimeError::bad_argument(
        "workspace",
        format!("at least {need} bytes, what the call's path takes (chunk_workspace_bytes)"),
        format!("{have} bytes"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{plan_chunk, ChunkArgs};
    use kda_dsl::DType;
    use proptest::prelude::*;

    const DEVICES: [DeviceLimits; 4] =
        [DeviceLimits::A100, DeviceLimits::RTX_3090, DeviceLimits::L40S, DeviceLimits::H200];

    /// A dense call of `b` rows of `t` tokens on `hv` value heads (one q/k head), or varlen
    /// with `b` sequences over `b · t` tokens (an optional `max_seqlen` hint), planned; tensors
    /// 2^44 bytes apart so that no call's tensors overlap.
    fn plan(b: usize, t: usize, hv: usize, varlen: bool, hint: Option<usize>) -> ChunkPlan {
        let lead = if varlen { vec![1, b * t] } else { vec![b, t] };
        let mk = |id: u64, tail: &[usize]| {
            TensorView::describe(id << 44, &[&lead[..], tail].concat(), DType::BF16, 0).expect("a view")
        };
        let (q, k, v, g, beta) =
            (mk(1, &[1, 128]), mk(2, &[1, 128]), mk(3, &[hv, 128]), mk(4, &[hv, 128]), mk(5, &[hv]));
        let cu = TensorView::describe(6 << 44, &[b + 1], DType::I32, 0).expect("a view");
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        if varlen {
            args.cu_seqlens = Some(&cu);
            args.max_seqlen = hint;
        }
        plan_chunk(&args).expect("a valid call")
    }

    proptest! {
        /// The bound grows with each argument, across the split's 65535-segment edge and
        /// the 2^31-token edge.
        #[test]
        fn the_bound_grows_with_each_argument(
            tokens in prop_oneof![0usize..1 << 20, (1usize << 31) - 40_000..(1 << 31) + 40_000],
            sequences in prop_oneof![0usize..300, 65_000usize..66_000],
            hv in 0usize..40,
            step in 1usize..5000,
        ) {
            let bound = chunk_workspace_bound(tokens, sequences, hv);
            prop_assert!(chunk_workspace_bound(tokens + step, sequences, hv) >= bound);
            prop_assert!(chunk_workspace_bound(tokens, sequences + step, hv) >= bound);
            prop_assert!(chunk_workspace_bound(tokens, sequences, hv + 1) >= bound);
        }

        /// Every call within the bound's sizes takes at most the bound, on every device and
        /// path: the default one, the two-kernel path, token ranges and the default split.
        #[test]
        fn every_call_fits_the_bound(
            b in 1usize..40,
            t in prop_oneof![1usize..300, 8000usize..20_000],
            hv in prop_oneof![1usize..20, Just(32)],
            varlen in any::<bool>(),
            hint in proptest::option::of(1usize..20_000),
        ) {
            let p = plan(b, t, hv, varlen, hint);
            let bound = chunk_workspace_bound(b * t, b, hv);
            for device in DEVICES {
                prop_assert!(chunk_workspace_bytes(&p, &device) <= bound, "{device:?}");
            }
            let prepared = ChunkTuning::of_path(&p, true);
            prop_assert!(chunk_tuned_workspace_bytes(&p, &prepared) <= bound);
            let split = ChunkTuning { split: Some(SPLIT_SEGMENT_TOKENS), ..prepared };
            if hv <= SPLIT_MAX_VALUE_HEADS {
                prop_assert!(chunk_tuned_workspace_bytes(&p, &split) <= bound);
            }
        }
    }

    /// One long sequence takes the two-kernel path whether a workspace is given or not (the
    /// plan ignores it); many chains take the fused kernel, which takes no workspace.
    #[test]
    fn few_chains_take_the_prepared_path_without_a_workspace_and_many_the_fused_kernel() {
        let many = plan(64, 512, 32, false, None);
        assert!(!ChunkTuning::for_call(&many, &DeviceLimits::H200).prepared, "2048 chains");
        assert_eq!(chunk_workspace_bytes(&many, &DeviceLimits::H200), 0);
        assert_eq!(chunk_tuned_workspace_bytes(&many, &ChunkTuning::fused(&many)), 0);
        let one = plan(1, 32768, 32, false, None);
        let tune = ChunkTuning::for_call(&one, &DeviceLimits::H200);
        assert!(tune.prepared, "{tune:?}");
        assert_eq!(chunk_workspace_bytes(&one, &DeviceLimits::H200), chunk_workspace_bytes_unsplit(&one));
    }
}
