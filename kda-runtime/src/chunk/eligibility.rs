//! Whether a call can take the token ranges or the long-sequence split, and when the default
//! path takes them: the thresholds, measured (docs/performance.md), and the checks a tuning
//! must pass. Each a function of the call's shapes alone (and the `max_seqlen` hint) and of
//! the device, so the path never depends on the batch around a sequence.

use kda_dsl::DType;
use kda_kernels::chunk_segments::{max_segments, segment_count};

use super::plan::{ChunkPlan, FinalState};
#[cfg(doc)]
use super::tuning::ChunkTuning;
use crate::device::DeviceLimits;
use crate::error::RuntimeError;

/// Whether a planned call can run in `nranges` token ranges; the reason when not.
pub(crate) fn check_ranges(plan: &ChunkPlan, nranges: usize) -> Result<(), RuntimeError> {
    // What carries the state from one range to the next, exactly: f32 final states, or the
    // f32 pool slots themselves.
    let f32_carry = plan.state_dtype == DType::F32
        && matches!(plan.final_out, FinalState::Given { .. } | FinalState::Allocate { .. } | FinalState::Pool);
    let why = if nranges < 2 {
        Some("at least 2 ranges")
    } else if plan.batch != 1 || plan.nseq != 1 {
        Some("one sequence (a dense call with B = 1, or varlen with one)")
    } else if plan.seq_len == 0 {
        Some("at least one token")
    } else if !f32_carry {
        Some(
            "f32 final states (output_final_state with an f32 state) or an f32 pool (state_indices): \
             they carry the state between ranges",
        )
    } else {
        None
    };
    match why {
        Some(w) => Err(RuntimeError::bad_argument("tune", format!("token ranges need {w}"), "this call")),
        None => Ok(()),
    }
}

/// The most token ranges [`ChunkTuning::for_call`] cuts a call into: the fastest of `kda
/// bench --sweep-chunk` at B = 1, T = 32768 (2 against 3 and 4, at 32 value heads and GVA;
/// docs/performance.md, 2026-12-03 (late), runs 36 and 37).
pub const DEFAULT_RANGES: usize = 2;

/// The fewest chunks a token range of [`ChunkTuning::for_call`] holds (16384 tokens): two
/// ranges measured faster on an H200 at 32768 tokens; at 16384 (two of 8192) they were 6%
/// slower on an H100 and are unmeasured on an H200, so such calls run one range.
pub const RANGE_MIN_CHUNKS: usize = 1024;

/// The fewest value heads at which [`ChunkTuning::for_call`] cuts a call into token ranges. A
/// range's chain shares its SMs with the next range's preparation, which slows it: with 32
/// value heads (a chain block on almost every SM) the overlap can win, with 8 it loses
/// (docs/performance.md, 2026-12-02 runs 23 and 24; 16 not measured).
pub const RANGE_MIN_VALUE_HEADS: usize = 32;

/// The least DRAM bandwidth (bytes a second) at which [`ChunkTuning::for_call`] cuts a call
/// into token ranges. The overlap hides a range's preparation, which is bound by memory, and
/// slows the chain beside it: on an H200 (4.8 TB/s) two ranges measured 5-7% faster at
/// B = 1, T = 32768 on 32 value heads, on an H100 SXM (3.35 TB/s) 3-4% slower
/// (docs/performance.md, 2026-12-06, "two token ranges on an H200 again"). A line between the
/// two devices measured, not a measured crossover.
pub const RANGE_MIN_BANDWIDTH: u64 = 4_000_000_000_000;

/// The ranges [`ChunkTuning::for_call`] takes on `device` for a planned call on the two-kernel
/// path: as many as fit [`RANGE_MIN_CHUNKS`] chunks each, at most [`DEFAULT_RANGES`], for calls
/// of at least [`RANGE_MIN_VALUE_HEADS`] value heads on a device of at least
/// [`RANGE_MIN_BANDWIDTH`]; `None` for a call that cannot take ranges, is too short for two or
/// has fewer heads, and on a slower device. Any count gives the same bits.
pub(crate) fn default_ranges(plan: &ChunkPlan, device: &DeviceLimits) -> Option<usize> {
    let n = (plan.seq_len.div_ceil(16) / RANGE_MIN_CHUNKS).min(DEFAULT_RANGES);
    let fast_memory = device.memory_bandwidth >= RANGE_MIN_BANDWIDTH;
    (n >= 2 && fast_memory && plan.value_heads >= RANGE_MIN_VALUE_HEADS && check_ranges(plan, n).is_ok()).then_some(n)
}

/// Whether some call of `plan`'s kind (its flags and tensors given, whatever its length) takes
/// token ranges by default on `device`: then it needs the thread's highest-priority stream and
/// the ranges' variants.
pub(crate) fn may_take_ranges(plan: &ChunkPlan, device: &DeviceLimits) -> bool {
    let long = ChunkPlan { seq_len: 16 * RANGE_MIN_CHUNKS * DEFAULT_RANGES, batch: 1, nseq: 1, ..plan.clone() };
    default_ranges(&long, device).is_some()
}

/// Tokens per segment of the default split. At B = 1, T = 32768, HV = 8 segments of 4096
/// tokens measured faster than 2048 or 8192 (docs/performance.md, 2026-12-02 run 24 and
/// 2026-12-03 runs 26 and 29); a sequence of at most twice this many stays whole (run 29:
/// split in two it gained nothing alone and cost a third on a full GPU).
pub const SPLIT_SEGMENT_TOKENS: usize = 4096;

/// The most value heads at which [`chunk_kda`](super::chunk_kda) splits long sequences: with
/// few heads the serial chains leave most SMs idle and the split's extra passes run on them;
/// at 32 heads the chains already fill the GPU and the split measured slower
/// (docs/performance.md, 2026-12-02, runs 23 and 24). A function of the model's shape, not of
/// the batch, so batch invariance holds.
pub const SPLIT_MAX_VALUE_HEADS: usize = 16;

/// Segments at most in one grid axis of the split's passes.
pub(crate) const GRID_YZ: usize = 65535;

/// Whether [`chunk_kda`](super::chunk_kda) splits a call of this shape
/// ([`SPLIT_MAX_VALUE_HEADS`], a sequence that may be longer than twice
/// [`SPLIT_SEGMENT_TOKENS`] by the shapes and the `max_seqlen` hint). Never by the grid's
/// limits, which would make a sequence's bits depend on its batch: a call past them is refused
/// ([`check_split`]).
pub(crate) fn splits_by_default(plan: &ChunkPlan) -> bool {
    plan.value_heads <= SPLIT_MAX_VALUE_HEADS && segment_count(plan.longest_sequence(), SPLIT_SEGMENT_TOKENS) > 1
}

/// Whether a planned call can be split every `seg` tokens; the reason, named `arg` (`tune` for
/// a tuning, the input that makes the default split too large otherwise), when not.
pub(crate) fn check_split(plan: &ChunkPlan, seg: usize, arg: &str) -> Result<(), RuntimeError> {
    let ns = max_segments(plan.nseq, plan.total_tokens, seg.max(1));
    let why = if seg == 0 || !seg.is_multiple_of(16) || seg > i32::MAX as usize / 2 {
        Some("a segment length that is a positive multiple of 16 tokens, below 2^30".to_string())
    } else if ns > GRID_YZ {
        Some(format!("at most {GRID_YZ} segments (this call has up to {ns})"))
    } else if plan.total_tokens > i32::MAX as usize {
        Some("fewer than 2^31 tokens".to_string())
    } else {
        None
    };
    match why {
        Some(w) => Err(RuntimeError::bad_argument(
            arg,
            format!(
                "a split every {seg} tokens needs {w} (calls of at most {SPLIT_MAX_VALUE_HEADS} value heads split \
                 sequences longer than {} tokens by default: split the call, give a max_seqlen hint of at most \
                 that, or pass ChunkTuning {{ split: None, .. }} to chunk_kda_tuned)",
                2 * SPLIT_SEGMENT_TOKENS
            ),
            "this call",
        )),
        None => Ok(()),
    }
}
