//! Prefix caching in `chunk_kda`'s pool mode (docs/prefill.md, "Prefix caching"):
//! `prefix_lens` aligns each sequence's chunks to absolute positions, and
//! `checkpoint_every` with `checkpoint_slots` writes the state every E tokens into a block
//! table's slots. Validated here into a [`PrefixPlan`]; the chain kernel does the rest
//! (`kda_kernels::chunk`, `write_checkpoint`) on every path: fused, over a prepared workspace,
//! in token ranges (windows of chunks) and split (`Pieces::Segments`).

pub use kda_kernels::chunk::PrefixCaching;

use super::args::ChunkArgs;
use super::plan::{ChunkError, InitialState};
use crate::tensor::TensorView;

/// A call's prefix caching, validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixPlan {
    /// What the kernel takes (`prefix_lens`' and `checkpoint_slots`' dtypes).
    pub caching: PrefixCaching,
    /// `checkpoint_every` E (a positive multiple of 16; 0 without checkpoints).
    pub every: usize,
    /// Columns of `checkpoint_slots` (`C`).
    pub columns: usize,
    /// Slots of the checkpoint pool (the state pool's unless `checkpoint_pool` is given).
    pub pool: usize,
}

impl PrefixPlan {
    /// Whether the call has any prefix caching (`prefix_lens` or checkpoints).
    pub fn active(&self) -> bool {
        self.caching != PrefixCaching::default()
    }

    /// Whether chunks end at absolute positions (`prefix_lens`): a sequence may take one chunk
    /// more, and its workspace rows 16 more.
    pub fn aligned(&self) -> bool {
        self.caching.prefix_lens.is_some()
    }
}

fn invalid(arg: &'static str, message: String) -> ChunkError {
    ChunkError::InvalidArgument { arg, message }
}

fn shape(x: &TensorView) -> String {
    format!("{:?}", x.shape())
}

/// Checks `prefix_lens`, `checkpoint_every`, `checkpoint_slots` and `checkpoint_pool` for a
/// call of `n` sequences and `hv` value heads whose states are `initial`.
pub fn check_prefix(args: &ChunkArgs, n: usize, hv: usize, initial: InitialState) -> Result<PrefixPlan, ChunkError> {
    let given = [
        ("prefix_lens", args.prefix_lens.is_some()),
        ("checkpoint_every", args.checkpoint_every.is_some()),
        ("checkpoint_slots", args.checkpoint_slots.is_some()),
        ("checkpoint_pool", args.checkpoint_pool.is_some()),
    ];
    let Some(&(first, _)) = given.iter().find(|(_, g)| *g) else {
        return Ok(PrefixPlan::default());
    };
    let InitialState::Pool { dtype, pool, .. } = initial else {
        let msg = format!(
            "{first} is part of prefix caching in the pool mode: pass state_indices (and the pool as initial_state)."
        );
        return Err(invalid(first, msg));
    };
    let ints = |name: &'static str, x: &TensorView| {
        if !x.dtype().is_int() {
            return Err(invalid(name, format!("{name} must have dtype i32 or i64, got {}.", x.dtype())));
        }
        Ok(x.dtype())
    };
    let prefix_lens = match args.prefix_lens {
        Some(x) if x.shape() != [n] => {
            return Err(invalid("prefix_lens", format!("prefix_lens must have shape [N] = [{n}], got {}.", shape(x))))
        }
        Some(x) => Some(ints("prefix_lens", x)?),
        None => None,
    };
    let (slots, every, columns) = match (args.checkpoint_slots, args.checkpoint_every) {
        (None, None) => (None, 0, 0),
        (Some(_), None) => {
            return Err(invalid("checkpoint_every", "checkpoint_slots needs checkpoint_every (the interval E).".into()))
        }
        (None, Some(_)) => {
            let msg = "checkpoint_every needs checkpoint_slots (the [N, C] block table the checkpoints go to).";
            return Err(invalid("checkpoint_slots", msg.into()));
        }
        (Some(x), Some(e)) => {
            if e == 0 || !e.is_multiple_of(16) || e > i32::MAX as usize {
                let msg = format!("checkpoint_every must be a positive multiple of 16 below 2^31, got {e}.");
                return Err(invalid("checkpoint_every", msg));
            }
            let cols = match *x.shape() {
                [rows, cols] if rows == n => cols,
                _ => {
                    let msg = format!("checkpoint_slots must have shape [N, C] = [{n}, C], got {}.", shape(x));
                    return Err(invalid("checkpoint_slots", msg));
                }
            };
            (Some(ints("checkpoint_slots", x)?), e, cols)
        }
    };
    let ck_pool = match args.checkpoint_pool {
        None => pool,
        Some(p) => {
            if slots.is_none() {
                let msg = "checkpoint_pool is where checkpoints go: pass checkpoint_every and checkpoint_slots too.";
                return Err(invalid("checkpoint_pool", msg.into()));
            }
            if p.dtype() != dtype {
                let msg = format!("checkpoint_pool must have the state pool's dtype ({dtype}), got {}.", p.dtype());
                return Err(invalid("checkpoint_pool", msg));
            }
            match *p.shape() {
                [slots, a, b, c] if slots > 0 && [a, b, c] == [hv, 128, 128] => slots,
                _ => {
                    let msg = format!(
                        "checkpoint_pool must have shape [slots, HV, 128, 128] = [slots, {hv}, 128, 128] with at \
                         least one slot, got {}.",
                        shape(p)
                    );
                    return Err(invalid("checkpoint_pool", msg));
                }
            }
        }
    };
    if ck_pool > i32::MAX as usize || columns > i32::MAX as usize {
        return Err(invalid("checkpoint_slots", "checkpoint_slots and its pool must fit 32-bit indices.".into()));
    }
    let caching = PrefixCaching { prefix_lens, checkpoint_slots: slots, ..Default::default() };
    Ok(PrefixPlan { caching, every, columns, pool: if slots.is_some() { ck_pool } else { 0 } })
}
