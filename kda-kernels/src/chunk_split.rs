//! The kernels of the exact long-sequence split (the transition form), as
//! configs derived from the call's own, and the order they run in.
//!
//! Every sequence longer than `2 · SEG` tokens is cut into segments of `SEG` tokens by
//! `chunk_segments` ([`crate::chunk_segments::segment_count`]: a function of its length alone,
//! so a varlen call and a dense one cut a sequence alike). The segments are a
//! varlen batch of their own (`cu_seqlens` = the schedule's `seg_cu`, i32), each with a state
//! slot in three f32 tables of `[NS, HV, 128, 128]`, which the chunk passes read and write as
//! a pool (`ChunkStates::Pool` with i32 indices):
//! 1. [`SplitConfigs::transition`]: each segment but its sequence's last, from the identity
//!    with `v = 0`, into the `M` table (indices `split`);
//! 2. [`SplitConfigs::from_zeros`]: the same segments from zeros (`has_initial_state` =
//!    `fresh`, all zeros), their final states only, into the `H` table;
//! 3. [`SplitConfigs::merge`]: each sequence's start states, `S_{s+1} = S_s M_s + H_s` from its
//!    initial state, into the starts table;
//! 4. [`SplitConfigs::output`]: every segment of every live sequence (indices `live`) from its
//!    start, writing the output rows and leaving its end state in the starts table;
//! 5. [`SplitConfigs::finish`]: each sequence's last end state to its final state or pool slot.
//!
//! A sequence of at most `2 · SEG` tokens is one segment: passes 1 and 2 skip it, the merge copies
//! its initial state to its start, and pass 4 runs the unsplit call's arithmetic on it, so its
//! results are the unsplit call's bits. With [`Preparation::Workspace`] the segments' operands
//! are prepared once (`chunk_prep` over the segments) and all three chunk passes read them.
//!
//! With prefix caching the schedule writes each segment's absolute start, which every pass
//! takes as the segment's `prefix_lens` (chunks end at absolute multiples of 16, so the state
//! at every checkpoint position is a chunk's end), and the output pass, running each segment
//! from its true start state, writes the checkpoints ([`Pieces::Segments`]): a checkpoint
//! inside a segment is that segment's state there, after the merge.

use crate::chunk::{ChunkConfig, ChunkRun, ChunkStates, Pieces, PrefixCaching, Preparation};
use crate::chunk_merge::MergeConfig;
use crate::chunk_prep::PrepConfig;
use crate::chunk_segments::{SegmentPositions, SegmentsConfig};
use kda_dsl::DType;

/// Every kernel config of a split call, derived from the call's [`ChunkConfig`] (its dtypes,
/// gate, flags, states, launch shape and preparation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitConfigs {
    /// The segment schedule.
    pub segments: SegmentsConfig,
    /// The segments' preparation, when the passes read a workspace.
    pub prep: Option<PrepConfig>,
    /// Pass 1: the transitions `M`.
    pub transition: ChunkConfig,
    /// Pass 2: the states from zeros `H`.
    pub from_zeros: ChunkConfig,
    /// Pass 3: the start states.
    pub merge: MergeConfig,
    /// Pass 4: the output rows and each segment's end state.
    pub output: ChunkConfig,
    /// Pass 5, when the call writes final states (or a pool): the final states.
    pub finish: Option<MergeConfig>,
}

/// The split's kernel configs for a call of config `call` (whose `run` is
/// [`ChunkRun::Output`]).
pub fn split_configs(call: &ChunkConfig) -> SplitConfigs {
    let caching = call.prefix;
    let positions = match (caching.prefix_lens, caching.checkpoint_slots) {
        (Some(d), _) => SegmentPositions::PrefixLens(d),
        (None, Some(_)) => SegmentPositions::FromZero,
        (None, None) => SegmentPositions::Unused,
    };
    // With prefix caching every pass takes the segments' absolute starts as their prefixes
    // (i32, from the schedule); only the output pass writes checkpoints.
    let aligned = positions != SegmentPositions::Unused;
    let prefix = |checkpoints: bool| {
        let checkpoint_slots = caching.checkpoint_slots.filter(|_| checkpoints);
        let pieces = match checkpoint_slots {
            Some(_) => Pieces::Segments { checkpoints: call.state_dtype },
            None => Pieces::Sequences,
        };
        PrefixCaching { prefix_lens: aligned.then_some(DType::I32), checkpoint_slots, pieces }
    };
    let pass = |run: ChunkRun, has_initial: Option<DType>| ChunkConfig {
        state_dtype: DType::F32,
        varlen: Some(DType::I32),
        states: ChunkStates::Pool { indices: DType::I32, has_initial },
        run,
        prefix: prefix(run == ChunkRun::Output),
        ..call.clone()
    };
    let output = pass(ChunkRun::Output, None);
    let merge = MergeConfig { state_dtype: call.state_dtype, states: call.states };
    let writes_final = call.states.store_final() || call.states.pool();
    SplitConfigs {
        segments: SegmentsConfig {
            varlen: call.varlen,
            pool: call.states.pool().then(|| call.states.indices()),
            positions,
        },
        prep: (call.preparation == Preparation::Workspace).then(|| PrepConfig::of(&output)),
        transition: pass(ChunkRun::Transition, None),
        from_zeros: pass(ChunkRun::StatesOnly, Some(DType::I32)),
        merge: merge.clone(),
        output,
        finish: writes_final.then_some(merge),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The passes share the call's arithmetic (dtype, gate, flags, shape, preparation) and
    /// differ only in what they run and where their states live.
    #[test]
    fn passes_keep_the_calls_arithmetic() {
        let call = ChunkConfig {
            state_dtype: DType::BF16,
            varlen: Some(DType::I64),
            states: ChunkStates::Pool { indices: DType::I64, has_initial: Some(DType::I32) },
            preparation: Preparation::Workspace,
            shape: crate::chunk::ChunkShape::PREPARED,
            ..ChunkConfig::default()
        };
        let s = split_configs(&call);
        for (p, run) in [
            (&s.transition, ChunkRun::Transition),
            (&s.from_zeros, ChunkRun::StatesOnly),
            (&s.output, ChunkRun::Output),
        ] {
            assert_eq!(
                (p.dtype, p.gate, p.l2norm, p.shape, p.preparation),
                (call.dtype, call.gate, call.l2norm, call.shape, call.preparation)
            );
            assert_eq!((p.run, p.state_dtype, p.varlen), (run, DType::F32, Some(DType::I32)));
        }
        assert_eq!(
            s.segments,
            SegmentsConfig { varlen: Some(DType::I64), pool: Some(DType::I64), ..Default::default() }
        );
        assert!([&s.transition, &s.from_zeros, &s.output].iter().all(|p| p.prefix == PrefixCaching::default()));
        assert_eq!(s.prep.as_ref().map(|p| p.varlen), Some(Some(DType::I32)));
        assert_eq!(s.finish.as_ref().map(|f| f.state_dtype), Some(DType::BF16));
        let bare =
            split_configs(&ChunkConfig { states: ChunkStates::Zeros { store_final: false }, ..ChunkConfig::default() });
        assert!(bare.finish.is_none() && bare.prep.is_none());
    }

    /// With prefix caching every pass aligns its chunks to the segments' absolute starts, and
    /// the output pass alone writes the checkpoints, in the call's state dtype.
    #[test]
    fn prefix_caching_reaches_every_pass() {
        for (prefix_lens, positions) in
            [(Some(DType::I64), SegmentPositions::PrefixLens(DType::I64)), (None, SegmentPositions::FromZero)]
        {
            let call = ChunkConfig {
                state_dtype: DType::BF16,
                states: ChunkStates::Pool { indices: DType::I32, has_initial: None },
                prefix: PrefixCaching { prefix_lens, checkpoint_slots: Some(DType::I64), pieces: Pieces::Sequences },
                ..ChunkConfig::default()
            };
            let s = split_configs(&call);
            assert_eq!(s.segments.positions, positions);
            for p in [&s.transition, &s.from_zeros] {
                assert_eq!(p.prefix, PrefixCaching { prefix_lens: Some(DType::I32), ..Default::default() });
            }
            let want = PrefixCaching {
                prefix_lens: Some(DType::I32),
                checkpoint_slots: Some(DType::I64),
                pieces: Pieces::Segments { checkpoints: DType::BF16 },
            };
            assert_eq!(s.output.prefix, want);
        }
    }
}
