//! The opt-in checked mode: index values and the caller's contract, over host copies.
//!
//! By default the kernels clamp index values so no access leaves its buffer, and nothing is
//! read back. With `checked`, the caller copies the index tensors to the host (so the call is
//! not graph-safe) and [`check_indices`] reports what the kernels would silently clamp or race
//! on, naming the argument, the position and the value.

use std::collections::HashMap;

use super::plan::{invalid, DecodeError, DecodePlan, StateIndexing};

/// Checks host copies of the index tensors of a call planned as `plan`.
///
/// Each copy must be given exactly when the plan reads that tensor (`cu_seqlens` for varlen,
/// `state_indices` when indexed, `num_accepted` for speculative decoding), row-major, widened to
/// `i64`. Checks: `cu_seqlens` rises monotonically from 0 to `S`; every state index is in
/// `[0, pool_slots)` or negative (padding); counts are in `[1, columns]` (with per-token
/// indices); a varlen sequence written in place has at most `columns` tokens; and, when writing
/// in place, no two tokens write the same pool slot and no sequence reads a slot another writes.
pub fn check_indices(
    plan: &DecodePlan,
    cu_seqlens: Option<&[i64]>,
    state_indices: Option<&[i64]>,
    num_accepted: Option<&[i64]>,
) -> Result<(), DecodeError> {
    let lens = sequence_lengths(plan, cu_seqlens)?;
    let columns = match plan.indices {
        StateIndexing::None => 0,
        StateIndexing::PerSequence { .. } => 1,
        StateIndexing::PerToken { columns, .. } => columns,
    };
    let rows = host_copy("state_indices", state_indices, columns > 0, plan.n.saturating_mul(columns))?;
    let counts = host_copy("num_accepted_tokens", num_accepted, plan.spec_decoding, plan.n)?;
    let idx = Indices { rows, columns, per_token: matches!(plan.indices, StateIndexing::PerToken { .. }) };
    for (i, &slot) in idx.rows.iter().enumerate() {
        if usize::try_from(slot).is_ok_and(|s| s >= plan.pool_slots) {
            let msg = format!(
                "state_indices{} = {slot} is outside the state pool [0, {}) (negative entries are padding).",
                idx.position(i),
                plan.pool_slots
            );
            return Err(invalid("state_indices", msg));
        }
    }
    if idx.per_token {
        for (n, &c) in counts.iter().enumerate() {
            if usize::try_from(c).map_or(true, |c| c < 1 || c > columns) {
                let msg = format!("num_accepted_tokens[{n}] = {c} is outside [1, {columns}] (state_indices columns).");
                return Err(invalid("num_accepted_tokens", msg));
            }
        }
        if plan.varlen && plan.inplace_final_state {
            if let Some((n, &len)) = lens.iter().enumerate().find(|(_, &len)| len > columns) {
                let msg = format!(
                    "sequence {n} has {len} tokens, but state_indices has {columns} columns to write them in place."
                );
                return Err(invalid("cu_seqlens", msg));
            }
        }
    }
    if plan.inplace_final_state && columns > 0 {
        check_contract(plan, &idx, &lens, counts)?;
    }
    Ok(())
}

/// Host `state_indices`, `columns` entries per sequence.
struct Indices<'a> {
    rows: &'a [i64],
    columns: usize,
    per_token: bool,
}

impl Indices<'_> {
    /// The entry for token `t` of sequence `n` (per-sequence indices ignore `t`).
    fn get(&self, n: usize, t: usize) -> Option<i64> {
        let col = if self.per_token { t } else { 0 };
        self.rows.get(n.checked_mul(self.columns)?.checked_add(col)?).copied()
    }

    /// `[n, c]` (or `[n]`) for flat position `i`.
    fn position(&self, i: usize) -> String {
        match self.columns {
            c if self.per_token && c > 0 => format!("[{}, {}]", i / c, i % c),
            _ => format!("[{i}]"),
        }
    }
}

/// Tokens per sequence: from `cu_seqlens` for varlen (validated), else `T` each.
fn sequence_lengths(plan: &DecodePlan, cu_seqlens: Option<&[i64]>) -> Result<Vec<usize>, DecodeError> {
    let cu = host_copy("cu_seqlens", cu_seqlens, plan.varlen, plan.n.saturating_add(1))?;
    if !plan.varlen {
        return Ok(vec![plan.t; plan.n]);
    }
    if let Some(&first) = cu.first().filter(|&&c| c != 0) {
        return Err(invalid("cu_seqlens", format!("cu_seqlens[0] must be 0, got {first}.")));
    }
    let mut lens = Vec::with_capacity(plan.n);
    for (i, w) in cu.windows(2).enumerate() {
        let len = w[1].checked_sub(w[0]).and_then(|d| usize::try_from(d).ok());
        let Some(len) = len else {
            let msg = format!(
                "cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} < cu_seqlens[{i}] = {}.",
                i + 1,
                w[1],
                w[0]
            );
            return Err(invalid("cu_seqlens", msg));
        };
        lens.push(len);
    }
    if let Some(&last) = cu.last().filter(|&&c| usize::try_from(c) != Ok(plan.t)) {
        let msg = format!("cu_seqlens[{}] must equal S = {} (q.shape[1]), got {last}.", plan.n, plan.t);
        return Err(invalid("cu_seqlens", msg));
    }
    Ok(lens)
}

/// Within one call no two tokens write the same pool slot, and no sequence reads a slot another
/// sequence writes. Only called for in-place writes through `state_indices`.
fn check_contract(plan: &DecodePlan, idx: &Indices, lens: &[usize], counts: &[i64]) -> Result<(), DecodeError> {
    let in_pool = |s: i64| usize::try_from(s).is_ok_and(|s| s < plan.pool_slots);
    let read_column = |n: usize| counts.get(n).and_then(|&c| usize::try_from(c.checked_sub(1)?).ok()).unwrap_or(0);
    let read_slot = |n: usize| idx.get(n, read_column(n)).filter(|&s| in_pool(s));
    let mut writer: HashMap<i64, (usize, usize)> = HashMap::new();
    for (n, &len) in lens.iter().enumerate() {
        if read_slot(n).is_none() {
            continue; // padding: the sequence touches no state
        }
        for t in 0..len {
            let Some(slot) = idx.get(n, t).filter(|&s| in_pool(s)) else { continue };
            if let Some((m, u)) = writer.insert(slot, (n, t)) {
                let msg = format!(
                    "pool slot {slot} is written by token {u} of sequence {m} and by token {t} of sequence {n}; \
                     within one call each slot may be written once."
                );
                return Err(invalid("state_indices", msg));
            }
        }
    }
    if !plan.use_initial_state {
        return Ok(());
    }
    for n in 0..lens.len() {
        let Some(slot) = read_slot(n) else { continue };
        if let Some(&(m, _)) = writer.get(&slot).filter(|&&(m, _)| m != n) {
            let msg = format!("sequence {n} reads pool slot {slot}, which sequence {m} writes in the same call.");
            return Err(invalid("state_indices", msg));
        }
    }
    Ok(())
}

/// The host copy of `name`: required with `len` entries when `expected`, else absent.
fn host_copy<'a>(
    name: &'static str,
    copy: Option<&'a [i64]>,
    expected: bool,
    len: usize,
) -> Result<&'a [i64], DecodeError> {
    match (copy, expected) {
        (Some(c), true) if c.len() == len => Ok(c),
        (Some(c), true) => Err(invalid(name, format!("the host copy has {} entries, expected {len}.", c.len()))),
        (None, true) => Err(invalid(name, "checked mode needs a host copy of this tensor.".into())),
        (Some(_), false) => Err(invalid(name, "a host copy is given, but this call does not read the tensor.".into())),
        (None, false) => Ok(&[]),
    }
}
