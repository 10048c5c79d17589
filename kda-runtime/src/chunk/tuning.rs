//! The path of a `chunk_kda` call as a value: [`ChunkTuning`] (the chain's launch shape, the
//! two-kernel path, token ranges, the split, the operands), decided from the shapes and the
//! device ([`ChunkTuning::for_call`]), never from whether a workspace was passed; and the
//! kernel variants a path runs ([`chunk_tuned_config`], [`chunk_variants`]).

use kda_dsl::tile::FILL_WARPS_MAX;
use kda_dsl::{DType, Target};
use kda_kernels::chunk::{ChunkConfig, ChunkStates, KeyProducts, NarrowProducts, Preparation};
pub use kda_kernels::chunk::{ChunkOperands, ChunkShape};
use kda_kernels::chunk_prep::PrepConfig;

#[cfg(doc)]
use super::chunk_kda;
use super::eligibility;
use super::plan::{ChunkPlan, FinalState, InitialState};
use crate::device::DeviceLimits;
use crate::error::RuntimeError;

/// Whether the two-kernel path's chain blocks share their SMs with other work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainSms {
    /// As many blocks an SM as fit, the chain's and any other kernel's.
    Shared,
    /// Each chain block asks for an SM's whole shared memory
    /// ([`DeviceLimits::shared_per_block_optin`]), so no block that uses shared memory (a token
    /// range's preparation) runs beside it: the chain keeps its SMs' issue slots while the next
    /// range's preparation runs on the others. Only the launch's shared memory changes, so the
    /// bits do not. Measured at one long sequence in token ranges: at best 2.4% faster on an
    /// H100, slower at half the length (docs/performance.md, 2026-12-06, "the chain on SMs of
    /// its own"): a tuning.
    Own,
}

/// How a chunk call runs: its kernels' launch shape, the path and the split.
/// [`ChunkTuning::for_call`] is what [`chunk_kda`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkTuning {
    /// The chain kernel's launch shape (warps 1, 2, 4 or 8; `rows_per_warp` 16 or 32, at most
    /// 128 value rows a block; `min_blocks` 1 to 8; `stages` 2 to 8; `fill_warps` 0 to
    /// [`FILL_WARPS_MAX`]).
    pub shape: ChunkShape,
    /// Tokens per segment of the exact long-sequence split (`split.rs`), a positive multiple
    /// of 16: every sequence longer than twice that is cut into segments of that many tokens
    /// from its first (a function of its length alone, so batch invariance holds); a shorter
    /// one runs as one segment, with the unsplit bits (two segments would take as long as
    /// one chain: `kda_kernels::chunk_segments::segment_count`). The schedule, the segments'
    /// prepared operands and their states live in the workspace (the caller's, which must then
    /// hold [`super::chunk_split_workspace_bytes`], or the one [`crate::Kernels`] keeps). Its
    /// transitions run on the thread's highest-priority stream (created by
    /// [`crate::preload::preload_chunk`] or one eager call: capture after either).
    /// [`ChunkTuning::for_call`] sets [`super::SPLIT_SEGMENT_TOKENS`] for calls with at most
    /// [`super::SPLIT_MAX_VALUE_HEADS`] value heads and more than twice that many tokens.
    /// `None`: each sequence runs as one chain.
    pub split: Option<usize>,
    /// Take the two-kernel path (`chunk_prep`, then the chain over its output, through the
    /// workspace). [`ChunkTuning::for_call`] sets it for calls with few chains.
    pub prepared: bool,
    /// Preparation blocks per (sequence, value head), each striding over the sequence's chunks;
    /// `None`: one per 8 chunks of the longest sequence, capped (`prepared.rs`). Any value gives
    /// the same bits.
    pub prep_blocks: Option<usize>,
    /// Token ranges for the two-kernel path (`ranges.rs`): the chain of each range runs on the
    /// thread's highest-priority stream ([`crate::Gpu::high_priority_stream`]) beside the
    /// preparation of the next. Capture such a call into a graph only on a thread that has
    /// created that stream: by [`crate::preload::preload_chunk`] or by one eager call. Calls of
    /// one sequence (dense with B = 1, or varlen with one: its `cu_seqlens` are `[0, S]` by the
    /// caller's contract, and the ranges run it as the dense call), at least one token, and f32
    /// final states (`output_final_state`) or an f32 pool (`state_indices`); the same bits as
    /// one range. `None`: one range. [`ChunkTuning::for_call`] sets it on devices of at least
    /// [`super::RANGE_MIN_BANDWIDTH`] (an H200, not an H100) for long calls of many heads that
    /// can take it. One thread's calls share that stream, so their chains run in call order
    /// even when the calls are on different streams (each call still waits only for work
    /// enqueued before it).
    pub ranges: Option<usize>,
    /// Whether the chain's blocks share their SMs with other work ([`ChainSms`]); the
    /// two-kernel path only. [`ChunkTuning::for_call`] takes [`ChainSms::Shared`].
    pub chain_sms: ChainSms,
    /// The element type the state's products round their operands to (and the prepared
    /// workspace holds). [`ChunkTuning::for_call`] sets [`default_operands`]: with l2norm
    /// [`ChunkOperands::F16`] (the states within 1e-3 of decode's f32 arithmetic, while values
    /// and states stay below f16's 65504), without it [`ChunkOperands::Bf16`] (f32's range at
    /// 8 significant bits). Either runs at the same speed.
    pub operands: ChunkOperands,
    /// The chunk kernel's PTX target: [`Target::Sm80`], which runs on every device from compute
    /// capability 8.0, or [`Target::Sm90a`], compute capability 9.0 alone, whose state products
    /// take `wgmma` with the state as their register A operand (at [`ChunkShape::HOPPER`]).
    /// [`ChunkTuning::for_call`] takes sm_80 (see there why); [`ChunkTuning::hopper`] is the
    /// fused kernel on sm_90a. The split's chunk passes take it too when they are fused
    /// (`prepared: false`; its schedule, merge and finish stay sm_80). The chain over a
    /// prepared workspace (and token ranges) takes it at whole warpgroups (4 or 8 warps; the
    /// default's 2 hold none, so sm_90a with them is refused), without the split; its
    /// preparation stays sm_80. On another device it is an error naming `gpu`.
    pub target: Target,
}

/// The most (sequence, value head) chains for which [`chunk_kda`] takes the two-kernel path. It
/// prepares every chunk of the call in parallel, so its time grows with all of them; a fused
/// kernel's with the longest chain's, one block an SM while the chains fit. On compute capability
/// 9.0 three fifths of the SMs (79 of 132): there [`DefaultPath::HopperProducers`] takes the dense
/// calls above, one chain a block, measured faster from about 72 chains on an H100 and set a little
/// above, as the H200's faster memory helps the two-kernel path (docs/performance.md, 2026-12-06,
/// "the producer groups' code once"). Elsewhere one fused block per SM: with two per SM the sm_80
/// fused kernel wins (runs 6 and 8, an H200). Every unsplit path gives the same bits, so the choice
/// cannot break batch invariance.
pub fn prepared_max_chains(device: &DeviceLimits) -> usize {
    if takes_hopper_producers(device) {
        device.sm_count * 3 / 5
    } else {
        device.sm_count
    }
}

/// Whether `device` runs the sm_90a fused kernel with two producer warpgroups
/// ([`ChunkShape::HOPPER_TWO_PRODUCERS`]) where [`DefaultPath::HopperProducers`] says.
fn takes_hopper_producers(device: &DeviceLimits) -> bool {
    device.compute_capability == (9, 0)
}

/// The path [`ChunkTuning::for_call`] picks, each for its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultPath {
    /// The exact long-sequence split: few value heads and a sequence longer than twice
    /// [`super::SPLIT_SEGMENT_TOKENS`] (by the model's shape, so a sequence's bits do not
    /// depend on its batch).
    Split,
    /// The two-kernel path: at most [`prepared_max_chains`] chains, too few for the fused
    /// kernels to fill the SMs.
    Prepared,
    /// On compute capability 9.0, a dense call of more chains than that and at most one a
    /// SM: the sm_90a fused kernel with two producer warpgroups computing the chunk's factors
    /// a chunk ahead of the state's warpgroup, one block an SM. Its step is the shortest of the
    /// fused kernels there; a varlen call waits for its longest sequence on it, where the
    /// two-kernel path spreads the chunks of all (it stays on that path).
    HopperProducers,
    /// The sm_80 fused kernel, two blocks an SM: the most chains.
    Fused,
}

impl DefaultPath {
    /// The path of `plan`'s call on `device`.
    pub fn of(plan: &ChunkPlan, device: &DeviceLimits) -> DefaultPath {
        if eligibility::splits_by_default(plan) {
            return DefaultPath::Split;
        }
        let chains = plan.nseq.saturating_mul(plan.value_heads);
        let hopper_producers = takes_hopper_producers(device) && plan.varlen.is_none();
        match chains {
            c if c > device.sm_count => DefaultPath::Fused,
            c if c > prepared_max_chains(device) && hopper_producers => DefaultPath::HopperProducers,
            _ => DefaultPath::Prepared,
        }
    }
}

impl ChunkTuning {
    /// What [`chunk_kda`] picks on `device`, from the shapes alone (never from whether a workspace
    /// was given), as [`DefaultPath::of`] decides: the split over prepared operands (`split.rs`);
    /// the two-kernel path, in token ranges on a device of at least
    /// [`super::RANGE_MIN_BANDWIDTH`] for a call that can take them (as many as hold
    /// [`super::RANGE_MIN_CHUNKS`] chunks each, at most [`super::DEFAULT_RANGES`], when that is
    /// two or more; on a slower device the overlap slows the chain more than it saves); on
    /// compute capability 9.0 the sm_90a fused kernel with two producer warpgroups
    /// ([`ChunkTuning::hopper_producers`]); or the sm_80 fused kernel, each path at its shape
    /// ([`ChunkShape`]). Every unsplit path gives the same bits (the simulator, and `kda check
    /// --gpu` on an H100 and an H200).
    pub fn for_call(plan: &ChunkPlan, device: &DeviceLimits) -> ChunkTuning {
        match DefaultPath::of(plan, device) {
            DefaultPath::Split => {
                ChunkTuning { split: Some(eligibility::SPLIT_SEGMENT_TOKENS), ..ChunkTuning::of_path(plan, true) }
            }
            DefaultPath::Prepared => {
                ChunkTuning { ranges: eligibility::default_ranges(plan, device), ..ChunkTuning::of_path(plan, true) }
            }
            DefaultPath::HopperProducers => ChunkTuning::hopper_producers(plan),
            DefaultPath::Fused => ChunkTuning::of_path(plan, false),
        }
    }

    /// The sm_90a fused kernel with two producer warpgroups
    /// ([`ChunkShape::HOPPER_TWO_PRODUCERS`]), no workspace: [`DefaultPath::HopperProducers`].
    pub fn hopper_producers(plan: &ChunkPlan) -> ChunkTuning {
        ChunkTuning { shape: ChunkShape::HOPPER_TWO_PRODUCERS, ..ChunkTuning::hopper(plan) }
    }

    /// The fused kernel for sm_90a ([`ChunkTuning::target`]) at [`ChunkShape::HOPPER`], for a
    /// caller on compute capability 9.0 that takes it for every call (with `split` for long
    /// sequences, so that a sequence gets the same bits in any batch).
    pub fn hopper(plan: &ChunkPlan) -> ChunkTuning {
        ChunkTuning { shape: ChunkShape::HOPPER, target: Target::Sm90a, ..ChunkTuning::fused(plan) }
    }

    /// Whether a planned call can run so: the shape in range, and the split, the preparation
    /// blocks, the ranges and the path each possible for the call; the reason (named `tune`)
    /// when not.
    pub fn check(&self, plan: &ChunkPlan) -> Result<(), RuntimeError> {
        let bad = |what: &str| Err(RuntimeError::bad_argument("tune", what, format!("{self:?}")));
        let ChunkShape { warps, rows_per_warp, min_blocks, stages, fill_warps, .. } = self.shape;
        if !matches!(warps, 1 | 2 | 4 | 8)
            || !(1..=8).contains(&min_blocks)
            || !(2..=8).contains(&stages)
            || fill_warps > FILL_WARPS_MAX as usize
        {
            return bad(&format!(
                "warps 1, 2, 4 or 8, min_blocks 1 to 8, stages 2 to 8 and fill_warps 0 to {FILL_WARPS_MAX}"
            ));
        }
        if !matches!(rows_per_warp, 16 | 32) || self.shape.value_rows() > 128 {
            return bad("rows_per_warp 16 or 32, at most 128 value rows a block (rows_per_warp x warps)");
        }
        // The chain over a prepared workspace takes `wgmma` only as whole warpgroups: at 1 or 2
        // warps every product would be `mma.sync`, the sm_80 kernel under another name.
        if self.target == Target::Sm90a && self.prepared && !warps.is_multiple_of(4) {
            return bad("the sm_90a target for a chain over a prepared workspace of whole warpgroups (4 or 8 warps)");
        }
        if self.target == Target::Sm90a && self.prepared && self.split.is_some() {
            return bad("the sm_90a target for a chain over a prepared workspace without the split");
        }
        // One 16 x 8 tile a warp: the split key products need 4 warps preparing their keys
        // (the fill warps where there are any: they compute the factors). (A chain over a
        // prepared workspace computes none: the option is moot there, and the paths derived
        // from a fused tuning, token ranges and the split, keep its shape.)
        if self.shape.key_products == KeyProducts::Split && self.shape.factor_warps() != 4 && !self.prepared {
            return bad("key products split over exactly 4 warps computing the fused kernel's factors (its warps, or its fill warps where it has any)");
        }
        // Fill warps of two warpgroups compute the fused step's factors as two producer groups
        // taking turns, each a stage of its own beside the one the state's warps read.
        let groups = kda_dsl::passes::place_producers::producer_groups(fill_warps as u32).groups;
        if !self.prepared && stages <= groups as usize {
            return bad(&format!("more stages than producer groups ({groups}, of {fill_warps} fill warps)"));
        }
        // The fill warps keep their registers by `setmaxnreg`, which sm_90a alone has: on
        // another target the option would compile the same kernel under another name.
        if let Some(n) = self.shape.producer_registers {
            if self.target != Target::Sm90a || fill_warps == 0 || !n.is_multiple_of(8) || !(24..=256).contains(&n) {
                return bad("producer_registers a multiple of 8 from 24 to 256, with fill warps, on the sm_90a target");
            }
        }
        // On sm_80 every product is `mma.sync` already: the option would compile the same
        // kernel under another name.
        if self.target != Target::Sm90a && self.shape.narrow_products == NarrowProducts::MmaSync {
            return bad("narrow_products MmaSync on the sm_90a target alone");
        }
        if let Some(seg) = self.split {
            eligibility::check_split(plan, seg, "tune")?;
        }
        if self.prep_blocks.is_some_and(|b| b == 0 || b > i32::MAX as usize) {
            return bad("prep_blocks from 1 to 2^31 - 1");
        }
        if let Some(n) = self.ranges {
            eligibility::check_ranges(plan, n)?;
        }
        // The split's passes run the chain kernel as several steps of their own.
        if self.chain_sms == ChainSms::Own && (!self.prepared || self.split.is_some()) {
            return bad("chain_sms Own on the two-kernel path without the split");
        }
        Ok(())
    }

    /// The chunk kernel `self` runs for `cfg`'s call: its shape, path (a prepared workspace or
    /// not) and operands.
    pub fn apply(self, cfg: ChunkConfig) -> ChunkConfig {
        let (preparation, shape) = if self.prepared {
            // The chain reads the key products' results from the workspace: one kernel (and
            // one name) whichever way a fused step would compute them.
            (Preparation::Workspace, ChunkShape { key_products: KeyProducts::Replicated, ..self.shape })
        } else {
            (Preparation::InKernel, self.shape)
        };
        ChunkConfig { shape, preparation, operands: self.operands, ..cfg }
    }

    /// The fused kernel alone, at its shape: no workspace, no split.
    pub fn fused(plan: &ChunkPlan) -> ChunkTuning {
        ChunkTuning::of_path(plan, false)
    }

    /// Each path at its shape on sm_80: [`ChunkShape::PREPARED`] for the chain over a prepared
    /// workspace, [`ChunkShape::FUSED`] otherwise; the call's operands
    /// ([`default_operands`]).
    pub(crate) fn of_path(plan: &ChunkPlan, prepared: bool) -> ChunkTuning {
        let shape = if prepared { ChunkShape::PREPARED } else { ChunkShape::FUSED };
        let operands = default_operands(plan);
        ChunkTuning {
            shape,
            split: None,
            prepared,
            prep_blocks: None,
            ranges: None,
            chain_sms: ChainSms::Shared,
            operands,
            target: Target::Sm80,
        }
    }
}

/// The operands [`ChunkTuning::for_call`] picks: f16 with l2-normalized queries and keys (the
/// gated keys, `Mqk` and the solve are then bounded by 1 and `scale`, and values and states
/// stay far below f16's 65504 in practice); bf16 without, where `scale q·k` and the solve of
/// `beta k·k` grow with the caller's own norms.
pub fn default_operands(plan: &ChunkPlan) -> ChunkOperands {
    if plan.l2norm {
        ChunkOperands::F16
    } else {
        ChunkOperands::Bf16
    }
}

/// The chain's kernel variant a validated call runs on `device` (for sm_80,
/// [`ChunkTuning::for_call`]).
pub fn chunk_config(plan: &ChunkPlan, device: &DeviceLimits) -> ChunkConfig {
    chunk_tuned_config(plan, ChunkTuning::for_call(plan, device))
}

/// Every sm_80 chain variant a call of `plan`'s kind (its dtypes, flags and tensors given) can
/// pick by default on `device`, whatever its batch (see [`ChunkTuning::for_call`]): the fused
/// kernel, the chain over prepared operands (taken at most [`prepared_max_chains`] chains); for
/// a call that can take token ranges there also the form the ranges after the first take (from
/// the final states, or from the pool without `has_initial_state`) and, varlen, the dense forms
/// of both (the ranges are dense calls); and the preparations they need.
pub fn chunk_variants(plan: &ChunkPlan, device: &DeviceLimits) -> (Vec<ChunkConfig>, Vec<PrepConfig>) {
    let fused = chunk_tuned_config(plan, ChunkTuning::of_path(plan, false));
    let prepared = chunk_tuned_config(plan, ChunkTuning::of_path(plan, true));
    let mut chains = vec![fused];
    let mut preps = vec![PrepConfig::of(&prepared)];
    if !eligibility::may_take_ranges(plan, device) {
        chains.push(prepared);
        return (chains, preps);
    }
    // Token ranges after the first start from the state the one before left: the pool without
    // `has_initial_state`, or the final states.
    let later = match prepared.states {
        ChunkStates::Pool { indices, .. } => ChunkStates::Pool { indices, has_initial: None },
        _ => ChunkStates::PerSequence { store_final: true },
    };
    let mut range_chains = vec![prepared.clone()];
    if later != prepared.states {
        range_chains.push(ChunkConfig { states: later, ..prepared.clone() });
    }
    if prepared.varlen.is_some() {
        let dense: Vec<ChunkConfig> = range_chains.iter().map(|c| ChunkConfig { varlen: None, ..c.clone() }).collect();
        preps.push(PrepConfig::of(&dense[0]));
        range_chains.extend(dense);
    }
    chains.extend(range_chains);
    (chains, preps)
}

/// On compute capability 9.0, the sm_90a kernel a dense call of `plan`'s kind can take by
/// default ([`DefaultPath::HopperProducers`], at some batch); `None` elsewhere and for varlen.
pub fn chunk_hopper_variant(plan: &ChunkPlan, device: &DeviceLimits) -> Option<ChunkConfig> {
    (takes_hopper_producers(device) && plan.varlen.is_none())
        .then(|| chunk_tuned_config(plan, ChunkTuning::hopper_producers(plan)))
}

/// The chain's kernel variant a validated call runs with `tune`.
pub fn chunk_tuned_config(plan: &ChunkPlan, tune: ChunkTuning) -> ChunkConfig {
    let store_final = !matches!(plan.final_out, FinalState::None);
    let states = match plan.initial {
        InitialState::Zeros => ChunkStates::Zeros { store_final },
        InitialState::PerSequence { .. } => ChunkStates::PerSequence { store_final },
        InitialState::Pool { indices, has_initial, .. } => ChunkStates::Pool { indices, has_initial },
    };
    tune.apply(ChunkConfig {
        dtype: plan.dtype,
        state_dtype: plan.state_dtype,
        gate: plan.gate.kernel(),
        beta: plan.beta,
        dt_bias: plan.dt_bias.unwrap_or(DType::F32),
        l2norm: plan.l2norm,
        varlen: plan.varlen,
        states,
        prefix: plan.prefix.caching,
        // The shape, path and operands are the tuning's; the run writes the output.
        ..ChunkConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::bind::kernel_args;
    use crate::chunk::testing::{dense_bf16_inputs, tv};
    use crate::chunk::{plan_chunk, ChunkArgs};
    use crate::launch::KernelArg;
    use kda_dsl::DType;

    /// Every refusal of a tuning names `tune` and says what it expected; the defaults pass.
    #[test]
    fn tunings_a_call_cannot_take_are_refused_by_name() {
        let [q, k, v, g, beta] = dense_bf16_inputs(1, 64, 2);
        let args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        let plan = plan_chunk(&args).expect("a valid call");
        let ok = ChunkTuning::for_call(&plan, &DeviceLimits::H200);
        ok.check(&plan).expect("the default tuning");
        let refused = |tune: ChunkTuning, expected: &str| {
            let e = tune.check(&plan).expect_err(expected).to_string();
            assert!(e.contains("tune") && e.contains(expected), "{e}");
        };
        let shape =
            |warps, min_blocks, stages| ChunkTuning { shape: ChunkShape::plain(warps, min_blocks, stages), ..ok };
        let shapes =
            format!("warps 1, 2, 4 or 8, min_blocks 1 to 8, stages 2 to 8 and fill_warps 0 to {FILL_WARPS_MAX}");
        let shapes = shapes.as_str();
        refused(shape(3, 2, 2), shapes);
        refused(shape(8, 9, 2), shapes);
        refused(shape(8, 2, 1), shapes);
        refused(shape(8, 2, 9), shapes);
        refused(
            ChunkTuning { shape: ChunkShape { fill_warps: FILL_WARPS_MAX as usize + 1, ..ok.shape }, ..ok },
            shapes,
        );
        let rows = |warps, rows_per_warp| ChunkTuning {
            shape: ChunkShape { rows_per_warp, ..ChunkShape::plain(warps, 2, 2) },
            prepared: false,
            ranges: None,
            ..ok
        };
        rows(4, 32).check(&plan).expect("4 warps of 32 value rows");
        refused(rows(8, 32), "at most 128 value rows a block");
        refused(rows(4, 24), "rows_per_warp 16 or 32");
        refused(rows(4, 0), "rows_per_warp 16 or 32");
        refused(ChunkTuning { prep_blocks: Some(0), ..ok }, "prep_blocks from 1");
        refused(ChunkTuning { ranges: Some(1), ..ok }, "at least 2 ranges");
        refused(ChunkTuning { split: Some(3), ..ok }, "split");
        // The chain's own SMs: a two-kernel launch shape, never the fused kernel or the split.
        let own = ChunkTuning { chain_sms: ChainSms::Own, ..ok };
        assert!(ok.prepared, "a short call on few heads takes the two-kernel path");
        own.check(&plan).expect("the chain on SMs of its own");
        let on_own_sms = "chain_sms Own on the two-kernel path without the split";
        refused(ChunkTuning { prepared: false, ..own }, on_own_sms);
        refused(ChunkTuning { split: Some(64), ..own }, on_own_sms);
        let hopper = ChunkTuning::hopper(&plan);
        hopper.check(&plan).expect("the sm_90a fused kernel");
        // The chain over a prepared workspace on sm_90a: whole warpgroups, no split.
        let hopper_chain = ChunkTuning { shape: ChunkShape::HOPPER_PREPARED, prepared: true, ..hopper };
        hopper_chain.check(&plan).expect("the sm_90a chain of one warpgroup");
        refused(ChunkTuning { shape: ChunkShape::PREPARED, ..hopper_chain }, "whole warpgroups (4 or 8 warps)");
        refused(ChunkTuning { split: Some(64), ..hopper_chain }, "without the split");
        let split = ChunkShape { key_products: KeyProducts::Split, ..ChunkShape::FUSED };
        ChunkTuning { shape: split, ..ChunkTuning::fused(&plan) }.check(&plan).expect("split key products");
        refused(
            ChunkTuning { shape: ChunkShape { warps: 8, rows_per_warp: 16, ..split }, ..ChunkTuning::fused(&plan) },
            "exactly 4 warps",
        );
        // With fill warps, they compute the factors: split key products over 4 of them.
        let produced = ChunkTuning { shape: ChunkShape::PRODUCER, ..ChunkTuning::fused(&plan) };
        produced.check(&plan).expect("a producer warpgroup");
        ChunkTuning { prepared: true, ..produced }.check(&plan).expect("its shape on the chain");
        ChunkTuning { shape: ChunkShape::HOPPER_PRODUCER, ..hopper }
            .check(&plan)
            .expect("a producer warpgroup beside the sm_90a fused kernel");
        ChunkTuning { shape: ChunkShape::HOPPER_TWO_PRODUCERS, ..hopper }
            .check(&plan)
            .expect("two producer warpgroups: each computes with 4 warps");
        refused(
            ChunkTuning { shape: ChunkShape { stages: 2, ..ChunkShape::HOPPER_TWO_PRODUCERS }, ..hopper },
            "more stages than producer groups (2, of 8 fill warps)",
        );
        refused(
            ChunkTuning { shape: ChunkShape { fill_warps: 2, ..ChunkShape::PRODUCER }, ..produced },
            "exactly 4 warps",
        );
        // The producer's registers: sm_90a's `setmaxnreg`, with fill warps to keep them.
        let registers = "producer_registers a multiple of 8 from 24 to 256, with fill warps, on the sm_90a target";
        refused(ChunkTuning { shape: ChunkShape::HOPPER_PRODUCER, ..produced }, registers);
        let hopper_producer = ChunkTuning { shape: ChunkShape::HOPPER_PRODUCER, ..hopper };
        for n in [0, 20, 100, 264] {
            let shape = ChunkShape { producer_registers: Some(n), ..ChunkShape::HOPPER_PRODUCER };
            refused(ChunkTuning { shape, ..hopper_producer }, registers);
        }
        let shape = ChunkShape { producer_registers: Some(128), ..ChunkShape::HOPPER };
        refused(ChunkTuning { shape, ..hopper }, registers);
        // Token ranges and the split derive a prepared tuning from the fused one: accepted, and
        // its chain, which computes no key products, has one name either way.
        let chain = ChunkTuning { prepared: true, ..ChunkTuning::fused(&plan) };
        chain.check(&plan).expect("the fused shape on the chain");
        assert_eq!(chain.apply(ChunkConfig::default()).shape.key_products, KeyProducts::Replicated);
        let on_mma_sync = ChunkShape { narrow_products: NarrowProducts::MmaSync, ..ChunkShape::FUSED };
        ChunkTuning { shape: on_mma_sync, ..hopper }.check(&plan).expect("narrow products on mma.sync, sm_90a");
        refused(ChunkTuning { shape: on_mma_sync, ..ChunkTuning::fused(&plan) }, "MmaSync on the sm_90a target alone");
        ChunkTuning { split: Some(64), ..hopper }.check(&plan).expect("the split's fused passes on sm_90a");
    }

    /// The default path by chains (batch x 2 value heads here) and device: the two-kernel path
    /// for few, on compute capability 9.0 the sm_90a kernel with two producer warpgroups from
    /// three fifths of the SMs to one chain an SM (dense calls only), the sm_80 fused kernel
    /// above; sm_80 everywhere else. Every choice passes `check`, and a 9.0 device preloads the
    /// sm_90a kernel for dense calls.
    #[test]
    fn the_default_takes_two_producer_warpgroups_on_9_0_between_few_chains_and_one_an_sm() {
        let plan_of = |b: usize| {
            let [q, k, v, g, beta] = dense_bf16_inputs(b, 64, 2);
            plan_chunk(&ChunkArgs::new(&q, &k, &v, &g, &beta)).expect("a valid call")
        };
        let hopper = DeviceLimits::H200;
        assert_eq!(prepared_max_chains(&hopper), 79);
        let cases = [
            (39, DefaultPath::Prepared),
            (40, DefaultPath::HopperProducers),
            (66, DefaultPath::HopperProducers),
            (67, DefaultPath::Fused),
        ];
        for (batch, on_hopper) in cases {
            let plan = plan_of(batch);
            for cc in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
                let device = DeviceLimits { compute_capability: cc, ..hopper };
                let want = match (cc, on_hopper) {
                    ((9, 0), path) => path,
                    (_, DefaultPath::Fused) => DefaultPath::Fused,
                    _ => DefaultPath::Prepared,
                };
                assert_eq!(DefaultPath::of(&plan, &device), want, "{batch} sequences, {cc:?}");
                let tune = ChunkTuning::for_call(&plan, &device);
                tune.check(&plan).unwrap_or_else(|e| panic!("{batch} sequences, {cc:?}: {e}"));
                let sm90a = (tune.target == Target::Sm90a, tune.shape, tune.prepared);
                let expected = (true, ChunkShape::HOPPER_TWO_PRODUCERS, false);
                assert_eq!(sm90a == expected, want == DefaultPath::HopperProducers, "{batch}, {cc:?}: {tune:?}");
                assert_eq!(tune.target == Target::Sm90a, want == DefaultPath::HopperProducers, "{cc:?}: {tune:?}");
            }
            let hopper_variant = chunk_hopper_variant(&plan, &hopper).expect("dense, on 9.0");
            assert_eq!(hopper_variant, chunk_tuned_config(&plan, ChunkTuning::hopper_producers(&plan)));
            assert_eq!(chunk_hopper_variant(&plan, &DeviceLimits::A100), None);
        }
        // A varlen call of as many chains keeps the two-kernel path.
        let [q, k, v, g, beta] = dense_bf16_inputs(1, 64 * 50, 2);
        let cu = crate::chunk::testing::tv(9 << 20, &[51], kda_dsl::DType::I32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.cu_seqlens = Some(&cu);
        let varlen = plan_chunk(&args).expect("a valid varlen call");
        assert_eq!(DefaultPath::of(&varlen, &hopper), DefaultPath::Prepared);
        assert_eq!(chunk_hopper_variant(&varlen, &hopper), None);
        let tuned = ChunkTuning::hopper(&plan_of(400));
        assert_eq!((tuned.target, tuned.shape, tuned.prepared), (Target::Sm90a, ChunkShape::HOPPER, false));
        tuned.check(&plan_of(400)).expect("the sm_90a fused kernel");
    }

    /// docs/prefill.md's bf16 operands: a valid tuning, carried into the chain's config, its
    /// preparation's and the workspace's element type (f16 by default, bf16 by default
    /// without l2norm).
    #[test]
    fn bf16_operands_reach_the_kernels_and_the_workspace() {
        let [q, k, v, g, beta] = dense_bf16_inputs(1, 64, 2);
        let ws = tv(6, &[1 << 20], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let default = ChunkTuning { prepared: true, ..ChunkTuning::for_call(&plan, &DeviceLimits::H200) };
        let bf16 = ChunkTuning { operands: ChunkOperands::Bf16, ..default };
        assert_eq!(default_operands(&plan), ChunkOperands::F16, "with l2norm (the default)");
        args.use_qk_l2norm_in_kernel = Some(false);
        let unnormalized = plan_chunk(&args).expect("a valid call");
        assert_eq!(
            ChunkTuning::for_call(&unnormalized, &DeviceLimits::H200).operands,
            ChunkOperands::Bf16,
            "without l2norm"
        );
        assert!(
            chunk_variants(&unnormalized, &DeviceLimits::H200).0.iter().all(|c| c.operands == ChunkOperands::Bf16),
            "preloads"
        );
        args.use_qk_l2norm_in_kernel = None;
        for (tune, dtype) in [(default, DType::F16), (bf16, DType::BF16)] {
            tune.check(&plan).unwrap_or_else(|e| panic!("{tune:?}: {e}"));
            let cfg = chunk_tuned_config(&plan, tune);
            assert_eq!(cfg.operands.dtype(), dtype);
            assert_eq!(PrepConfig::of(&cfg).operands, cfg.operands);
            let bound = kernel_args(&args, &plan, &cfg, 0x9000_0000, None).expect("arguments");
            let prep = bound.iter().find(|(name, _)| *name == "prep").expect("a prep argument");
            match &prep.1 {
                KernelArg::Tensor(t) => assert_eq!(t.dtype(), dtype, "the workspace's operands"),
                _ => panic!("prep is a tensor"),
            }
        }
    }
}
