//! The opt-in checked mode of `chunk_kda`: index values and the caller's contract, over host
//! copies.
//!
//! By default the kernel clamps `cu_seqlens` into `[0, S]` and treats a slot outside the pool as
//! padding, and nothing is read back. With `checked`, the caller copies the index tensors to the
//! host (so the call is not graph-safe) and [`check_chunk_indices`] reports what the kernel
//! would silently clamp, skip or race on.

use super::plan::{ChunkError, ChunkPlan, InitialState};

fn invalid(arg: &'static str, message: String) -> ChunkError {
    ChunkError::InvalidArgument { arg, message }
}

/// Host copies (widened to `i64`, one entry per element) of a call's index tensors, each where
/// the call has it: `cu_seqlens` for varlen calls; `state_indices`, `read_indices`,
/// `prefix_lens` and `checkpoint_slots` with the pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkIndices<'a> {
    /// `cu_seqlens`.
    pub cu_seqlens: Option<&'a [i64]>,
    /// `state_indices`.
    pub state_indices: Option<&'a [i64]>,
    /// `read_indices`.
    pub read_indices: Option<&'a [i64]>,
    /// `prefix_lens`.
    pub prefix_lens: Option<&'a [i64]>,
    /// `checkpoint_slots`, `[N, C]` row by row.
    pub checkpoint_slots: Option<&'a [i64]>,
    /// The checkpoints go to the state pool (no `checkpoint_pool`, or the same tensor).
    pub checkpoints_in_the_state_pool: bool,
}

/// Checks the host copies `x`: `cu_seqlens` rises monotonically from 0 to `S`; every
/// `state_indices` slot is in `[0, pool)` or negative (padding); no two sequences write one slot
/// (each writes its slot, so a shared slot is a race); no sequence reads a slot another
/// sequence of the call writes (`read_indices`: it could read the new state; reading its own
/// slot is the in-place default); and a `max_seqlen` hint is at least the longest sequence.
///
/// With prefix caching: every `prefix_lens` entry is at least 0; every checkpoint a live
/// sequence takes has its column in `checkpoint_slots` and a slot in the checkpoint pool (or a
/// negative one, skipped); no slot is written twice (checkpoints and, in one pool, final
/// states together), and none is both read and written.
pub fn check_chunk_indices(plan: &ChunkPlan, x: ChunkIndices) -> Result<(), ChunkError> {
    let ChunkIndices { cu_seqlens, state_indices, .. } = x;
    let copy_len = |arg: &'static str, got: usize, want: usize| {
        if got == want {
            return Ok(());
        }
        Err(invalid(arg, format!("the host copy of {arg} has {got} entries; the call has {want}.")))
    };
    let mut longest = if plan.varlen.is_none() { plan.seq_len } else { 0 };
    if let Some(cu) = cu_seqlens {
        copy_len("cu_seqlens", cu.len(), plan.nseq + 1)?;
        if cu.first() != Some(&0) {
            return Err(invalid("cu_seqlens", format!("cu_seqlens[0] = {:?} must be 0.", cu.first())));
        }
        for (i, w) in cu.windows(2).enumerate() {
            if w[1] < w[0] {
                let msg = format!(
                    "cu_seqlens must not decrease: cu_seqlens[{}] = {} < cu_seqlens[{i}] = {}.",
                    i + 1,
                    w[1],
                    w[0]
                );
                return Err(invalid("cu_seqlens", msg));
            }
            longest = longest.max((w[1] - w[0]) as usize);
        }
        let last = cu.last().copied().unwrap_or(0);
        if last != plan.seq_len as i64 {
            let msg = format!("cu_seqlens[-1] = {last} must equal the {} tokens of q.", plan.seq_len);
            return Err(invalid("cu_seqlens", msg));
        }
    }
    if let (InitialState::Pool { pool, .. }, Some(idx)) = (plan.initial, state_indices) {
        copy_len("state_indices", idx.len(), plan.nseq)?;
        let mut owner = std::collections::HashMap::new();
        for (n, &slot) in idx.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            if slot as u64 >= pool as u64 {
                let msg = format!(
                    "state_indices[{n}] = {slot} is outside the state pool [0, {pool}) (negative entries are padding)."
                );
                return Err(invalid("state_indices", msg));
            }
            if let Some(m) = owner.insert(slot, n) {
                let msg = format!("state_indices[{m}] and state_indices[{n}] both name slot {slot}; each sequence writes its slot in place.");
                return Err(invalid("state_indices", msg));
            }
        }
        check_pool_writes(plan, &x, idx, pool)?;
    }
    if let Some(hint) = plan.max_seqlen.filter(|&h| h < longest) {
        let msg = format!("max_seqlen = {hint} is shorter than the longest sequence ({longest} tokens).");
        return Err(invalid("max_seqlen", msg));
    }
    Ok(())
}

/// What writes a slot in one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writer {
    /// Sequence n's final state (`state_indices[n]`).
    Final(usize),
    /// Sequence n's checkpoint in column c (`checkpoint_slots[n, c]`).
    Checkpoint(usize, usize),
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Writer::Final(n) => write!(f, "state_indices[{n}]"),
            Writer::Checkpoint(n, c) => write!(f, "checkpoint_slots[{n}, {c}]"),
        }
    }
}

/// The pool part of [`check_chunk_indices`] beyond the slots' range, for a pool of `pool` slots
/// that sequences write at `state_indices`: prefixes, checkpoints, and reads against writes.
fn check_pool_writes(plan: &ChunkPlan, x: &ChunkIndices, state_indices: &[i64], pool: usize) -> Result<(), ChunkError> {
    let n = plan.nseq;
    let len_of = |s: usize| match x.cu_seqlens {
        Some(cu) => (cu[s + 1] - cu[s]).max(0) as usize,
        None => plan.seq_len,
    };
    if let Some(lens) = x.prefix_lens {
        if lens.len() != n {
            return Err(invalid(
                "prefix_lens",
                format!("the host copy of prefix_lens has {} entries; the call has {n}.", lens.len()),
            ));
        }
        for (s, &l) in lens.iter().enumerate() {
            if l < 0 || l as u64 + len_of(s) as u64 > i32::MAX as u64 {
                let msg = format!(
                    "prefix_lens[{s}] = {l}: positions must run from 0 to below 2^31 (with its {} tokens).",
                    len_of(s)
                );
                return Err(invalid("prefix_lens", msg));
            }
        }
    }
    let live = |s: usize| state_indices[s] >= 0 && (state_indices[s] as u64) < pool as u64;
    // Slots written, keyed by (in the state pool, slot).
    let mut written = std::collections::HashMap::new();
    for s in (0..n).filter(|&s| live(s)) {
        written.insert((true, state_indices[s]), Writer::Final(s));
    }
    let (every, cols, ck_pool) = (plan.prefix.every, plan.prefix.columns, plan.prefix.pool);
    let slots = x.checkpoint_slots.unwrap_or(&[]);
    if x.checkpoint_slots.is_some() && slots.len() != n * cols {
        let msg = format!("the host copy of checkpoint_slots has {} entries; the call has {n} x {cols}.", slots.len());
        return Err(invalid("checkpoint_slots", msg));
    }
    for s in (0..n).filter(|&s| live(s) && x.checkpoint_slots.is_some()) {
        let start = x.prefix_lens.map_or(0, |l| l[s] as usize);
        for p in (start / every + 1..).map(|k| k * every).take_while(|p| *p < start + len_of(s)) {
            let col = p / every - 1;
            if col >= cols {
                let msg = format!(
                    "sequence {s} reaches absolute position {p}, a checkpoint in column {col} of checkpoint_slots, which has {cols}."
                );
                return Err(invalid("checkpoint_slots", msg));
            }
            let slot = slots[s * cols + col];
            if slot < 0 {
                continue;
            }
            if slot as u64 >= ck_pool as u64 {
                let msg = format!("checkpoint_slots[{s}, {col}] = {slot} is outside the checkpoint pool [0, {ck_pool}) (negative entries skip a checkpoint).");
                return Err(invalid("checkpoint_slots", msg));
            }
            let me = Writer::Checkpoint(s, col);
            if let Some(other) = written.insert((x.checkpoints_in_the_state_pool, slot), me) {
                return Err(invalid("checkpoint_slots", format!("{me} and {other} both write slot {slot}.")));
            }
        }
    }
    // Reads (conservatively, also of sequences `has_initial_state` starts from zeros): a live
    // sequence reads its read slot of the state pool, which only its own final state may write.
    if let Some(read) = x.read_indices {
        if read.len() != n {
            let msg = format!("the host copy of read_indices has {} entries; the call has {n}.", read.len());
            return Err(invalid("read_indices", msg));
        }
    }
    let reads = x.read_indices.unwrap_or(state_indices);
    for s in (0..n).filter(|&s| live(s)) {
        let read = reads[s];
        if let Some(other) = written.get(&(true, read)).filter(|w| **w != Writer::Final(s)) {
            let msg = format!("read_indices[{s}] = {read} is the slot {other} writes in the same call; a sequence may read only a slot nothing else of the call writes.");
            return Err(invalid("read_indices", msg));
        }
    }
    Ok(())
}
