//! `chunk_kda`: validate, pick the kernel variant, bind and launch.

use cudarc::driver::CudaStream;
use kda_dsl::tile::FILL_WARPS_MAX;
use kda_dsl::DType;
use kda_kernels::chunk::{ChunkConfig, ChunkStates, Preparation, PREP_COLS, PREP_DECAY_COLS};
pub use kda_kernels::chunk::{ChunkOperands, ChunkShape};
use kda_kernels::chunk_prep::{prep_rows, PrepConfig};

use super::args::ChunkArgs;
use super::checked::check_chunk_indices;
use super::plan::{
    chunk_workspace_bytes_unsplit, plan_chunk, workspace_prep_bytes, ChunkGate, ChunkPlan, FinalState, InitialState,
};
use super::workspace::{check_workspace, chunk_tuned_workspace_bytes};
use super::{prepared, ranges, split};
#[cfg(doc)]
use super::{DEFAULT_RANGES, RANGE_MIN_CHUNKS};
use crate::device::{DeviceLimits, Gpu};
use crate::error::RuntimeError;
use crate::kernels::{Kernels, Ready};
use crate::launch::{launch_planned, KernelArg};
use crate::tensor::{download_i64, DeviceTensor, TensorView};

/// Head dimension (K = V).
const D: usize = crate::validate::HEAD_DIM;

/// What a `chunk_kda` call returns beyond what it wrote into the caller's buffers.
pub struct ChunkResult {
    /// The output, when the call allocated it (`output` was not given).
    pub output: Option<DeviceTensor>,
    /// The final states, when `output_final_state` asked for them and no `final_state` buffer
    /// was given. With `state_indices` the pool itself is the result and nothing is returned.
    pub final_state: Option<DeviceTensor>,
}

/// How a chunk call runs: its kernels' launch shape, the path and the split.
/// [`ChunkTuning::for_call`] is what [`chunk_kda`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkTuning {
    /// The chain kernel's launch shape (warps 1, 2, 4 or 8; `min_blocks` 1 to 8; `stages` 2 to
    /// 8; `fill_warps` 0 to [`FILL_WARPS_MAX`]).
    pub shape: ChunkShape,
    /// Tokens per segment of the exact long-sequence split (`split.rs`), a positive multiple
    /// of 16: every sequence longer than twice that is cut into segments of that many tokens
    /// from its first (a function of its length alone, so batch invariance holds); a shorter
    /// one runs as one segment, with the unsplit bits (two segments would take as long as
    /// one chain: `kda_kernels::chunk_segments::segment_count`). The schedule, the segments'
    /// prepared operands and their states live in the `workspace`, which must then hold
    /// [`super::chunk_split_workspace_bytes`]; without one they are allocated and freed before
    /// returning, which waits for its kernels (not graph-capturable). Its transitions run on
    /// the thread's highest-priority stream (capture it as for `ranges`).
    /// [`ChunkTuning::for_call`] sets [`super::SPLIT_SEGMENT_TOKENS`] for calls with a
    /// workspace, at most [`super::SPLIT_MAX_VALUE_HEADS`] value heads and more than twice
    /// that many tokens. `None`: each sequence runs as one chain.
    pub split: Option<usize>,
    /// Take the two-kernel path (`chunk_prep`, then the chain over its output); needs a
    /// `workspace`. [`ChunkTuning::for_call`] sets it for calls with few chains.
    pub prepared: bool,
    /// Preparation blocks per (sequence, value head), each striding over the sequence's chunks;
    /// `None`: one per 8 chunks of the longest sequence, capped (`prepared.rs`). Any value gives
    /// the same bits.
    pub prep_blocks: Option<usize>,
    /// Token ranges for the two-kernel path (`ranges.rs`): the chain of each range runs on
    /// the thread's highest-priority stream ([`crate::Gpu::high_priority_stream`]) beside the
    /// preparation of the next. Capture such a call into a graph only on a thread that has
    /// created that stream: by [`crate::preload::preload_chunk`] or by one eager call. Calls of
    /// one sequence (dense with B = 1, or varlen with one: its `cu_seqlens` are `[0, S]` by the
    /// caller's contract, and the ranges run it as the dense call), at least one token, a
    /// workspace, and f32 final states (`output_final_state`) or an f32 pool
    /// (`state_indices`); the same bits as one range. `None`: one range.
    /// [`ChunkTuning::for_call`] sets it for long enough calls that can take it. One thread's
    /// calls share that stream, so their chains run in call order even when the calls are on
    /// different streams (each call still waits only for work enqueued before it).
    pub ranges: Option<usize>,
    /// The element type the state's products round their operands to (and the prepared
    /// workspace holds). [`ChunkTuning::for_call`] sets [`default_operands`]: with l2norm
    /// [`ChunkOperands::F16`] (the states within 1e-3 of decode's f32 arithmetic, while values
    /// and states stay below f16's 65504), without it [`ChunkOperands::Bf16`] (f32's range at
    /// 8 significant bits). Either runs at the same speed.
    pub operands: ChunkOperands,
}

/// The most (sequence, value head) chains for which [`chunk_kda`] takes the two-kernel path:
/// one fused block per SM or fewer. There the fused kernel leaves SMs idle and each chain's
/// chunk step is the whole time, so preparing every chunk in parallel first pays; with two
/// fused blocks per SM the fused kernel wins (docs/performance.md, runs 6 and 8, on an H200's
/// 132 SMs). Both paths give the same bits, so the choice cannot break batch invariance.
pub fn prepared_max_chains(device: &DeviceLimits) -> usize {
    device.sm_count
}

impl ChunkTuning {
    /// What [`chunk_kda`] picks on `device`, from the shapes alone (never from whether a
    /// workspace was given): the split over prepared operands for a call of few value heads
    /// and long sequences (`split.rs`); otherwise the two-kernel path for a call of at most
    /// [`prepared_max_chains`] chains, the fused kernel for more, each path at its shape
    /// ([`ChunkShape`]); on the two-kernel path, token ranges for a call that can take them:
    /// as many as hold [`RANGE_MIN_CHUNKS`] chunks each, at most [`DEFAULT_RANGES`], when that
    /// is two or more.
    pub fn for_call(plan: &ChunkPlan, device: &DeviceLimits) -> ChunkTuning {
        if split::splits_by_default(plan) {
            return ChunkTuning { split: Some(split::SPLIT_SEGMENT_TOKENS), ..ChunkTuning::of_path(plan, true) };
        }
        let chains = plan.nseq.saturating_mul(plan.value_heads);
        let prepared = chains <= prepared_max_chains(device);
        let ranges = if prepared { ranges::default_ranges(plan) } else { None };
        ChunkTuning { ranges, ..ChunkTuning::of_path(plan, prepared) }
    }

    /// Whether a planned call can run so: the shape in range, and the split, the preparation
    /// blocks, the ranges and the path each possible for the call; the reason (named `tune`)
    /// when not.
    pub fn check(&self, plan: &ChunkPlan) -> Result<(), RuntimeError> {
        let bad = |what: &str| Err(RuntimeError::bad_argument("tune", what, format!("{self:?}")));
        let ChunkShape { warps, min_blocks, stages, fill_warps } = self.shape;
        if !matches!(warps, 1 | 2 | 4 | 8)
            || !(1..=8).contains(&min_blocks)
            || !(2..=8).contains(&stages)
            || fill_warps > FILL_WARPS_MAX as usize
        {
            return bad(&format!(
                "warps 1, 2, 4 or 8, min_blocks 1 to 8, stages 2 to 8 and fill_warps 0 to {FILL_WARPS_MAX}"
            ));
        }
        if let Some(seg) = self.split {
            split::check_split(plan, seg, "tune")?;
        }
        if self.prep_blocks.is_some_and(|b| b == 0 || b > i32::MAX as usize) {
            return bad("prep_blocks from 1 to 2^31 - 1");
        }
        if let Some(n) = self.ranges {
            ranges::check_ranges(plan, n)?;
        }
        Ok(())
    }

    /// The fused kernel alone, at its shape: no workspace, no split.
    pub fn fused(plan: &ChunkPlan) -> ChunkTuning {
        ChunkTuning::of_path(plan, false)
    }

    /// Each path at its shape: [`ChunkShape::PREPARED`] for the chain over a prepared
    /// workspace, [`ChunkShape::FUSED`] otherwise; the call's operands
    /// ([`default_operands`]).
    pub(crate) fn of_path(plan: &ChunkPlan, prepared: bool) -> ChunkTuning {
        let shape = if prepared { ChunkShape::PREPARED } else { ChunkShape::FUSED };
        let operands = default_operands(plan);
        ChunkTuning { shape, split: None, prepared, prep_blocks: None, ranges: None, operands }
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

/// The chain's kernel variant a validated call runs on `device`.
pub fn chunk_config(plan: &ChunkPlan, device: &DeviceLimits) -> ChunkConfig {
    chunk_tuned_config(plan, ChunkTuning::for_call(plan, device))
}

/// Every chain variant a call of `plan`'s kind (its dtypes, flags and tensors given) can pick,
/// whatever its batch: the fused kernel, the chain over prepared operands (taken at most
/// [`prepared_max_chains`] chains); for a call that can take token ranges also
/// the form the ranges after the first take (from the final states, or from the pool without
/// `has_initial_state`) and, varlen, the dense forms of both (the ranges are dense calls); and
/// the preparations they need.
pub fn chunk_variants(plan: &ChunkPlan) -> (Vec<ChunkConfig>, Vec<PrepConfig>) {
    let fused = chunk_tuned_config(plan, ChunkTuning::of_path(plan, false));
    let prepared = chunk_tuned_config(plan, ChunkTuning::of_path(plan, true));
    let mut chains = vec![fused];
    let mut preps = vec![PrepConfig::of(&prepared)];
    if !ranges::may_take_ranges(plan) {
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

/// The chain's kernel variant a validated call runs with `tune`.
pub fn chunk_tuned_config(plan: &ChunkPlan, tune: ChunkTuning) -> ChunkConfig {
    let store_final = !matches!(plan.final_out, FinalState::None);
    let states = match plan.initial {
        InitialState::Zeros => ChunkStates::Zeros { store_final },
        InitialState::PerSequence { .. } => ChunkStates::PerSequence { store_final },
        InitialState::Pool { indices, has_initial, .. } => ChunkStates::Pool { indices, has_initial },
    };
    ChunkConfig {
        dtype: plan.dtype,
        state_dtype: plan.state_dtype,
        gate: plan.gate.kernel(),
        beta: plan.beta,
        dt_bias: plan.dt_bias.unwrap_or(DType::F32),
        l2norm: plan.l2norm,
        varlen: plan.varlen,
        states,
        shape: tune.shape,
        run: kda_kernels::chunk::ChunkRun::Output,
        preparation: if tune.prepared { Preparation::Workspace } else { Preparation::InKernel },
        operands: tune.operands,
    }
}

/// The chunk kernel's arguments by name (an array: building them allocates nothing).
pub(crate) type ChunkKernelArgs = [(&'static str, KernelArg); 18];

/// The kernel's arguments for a planned call: the inputs as the kernel's 4-D (3-D for beta)
/// tensors, varlen `[S, ..]` views included; the output at `out_ptr`; `final_state` (given or
/// allocated) when the plan writes one. Tensors the config never reads bind as empty
/// placeholders at address 0, with shapes that agree with the symbols they share.
pub(crate) fn kernel_args(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    cfg: &ChunkConfig,
    out_ptr: u64,
    final_state: Option<TensorView>,
) -> Result<ChunkKernelArgs, RuntimeError> {
    let dev = args.q.device();
    let view = |ptr: u64, shape: &[usize], dtype: DType| TensorView::describe(ptr, shape, dtype, dev);
    let (bt, hv) = ([plan.batch, plan.seq_len], plan.value_heads);
    let dt = plan.dtype;
    let q = view(args.q.ptr(), &[bt[0], bt[1], plan.heads, D], dt)?;
    let k = view(args.k.ptr(), &[bt[0], bt[1], plan.heads, D], dt)?;
    let v = view(args.v.ptr(), &[bt[0], bt[1], hv, D], dt)?;
    let g = view(args.g.ptr(), &[bt[0], bt[1], hv, D], dt)?;
    let beta = view(args.beta.ptr(), &[bt[0], bt[1], hv], dt)?;
    let out = view(out_ptr, &plan.output_shape, dt)?;
    let st = plan.state_dtype;
    let empty_state = || view(0, &[0, hv, D, D], st);
    let state = match (plan.initial, args.initial_state) {
        (InitialState::Zeros, _) | (_, None) => empty_state()?,
        (_, Some(s)) => *s,
    };
    let final_view = match (plan.final_out, final_state) {
        (FinalState::Allocate { .. } | FinalState::Given { .. }, Some(t)) => t,
        _ => empty_state()?,
    };
    let lower_bound = match plan.gate {
        ChunkGate::LowerBound { lower_bound } => lower_bound,
        _ => 0.0,
    };
    let (a_log, dt_bias) = match (plan.gate.in_kernel(), args.a_log, args.dt_bias) {
        (true, Some(a), Some(d)) => (*a, view(d.ptr(), &[hv, D], d.dtype())?),
        _ => (view(0, &[0], DType::F32)?, view(0, &[0, 0], cfg.dt_bias)?),
    };
    let pool = matches!(plan.initial, InitialState::Pool { .. });
    let empty_index = || view(0, &[0], DType::I32);
    let indices = match (pool, args.state_indices) {
        (true, Some(t)) => *t,
        _ => empty_index()?,
    };
    let has_initial = match (pool, args.has_initial_state) {
        (true, Some(t)) => *t,
        _ => empty_index()?,
    };
    let cu = match (plan.varlen, args.cu_seqlens) {
        (Some(_), Some(t)) => *t,
        _ => empty_index()?,
    };
    let nseq = i32::try_from(plan.nseq)
        .map_err(|_| RuntimeError::bad_argument("cu_seqlens", "fewer than 2^31 sequences", plan.nseq.to_string()))?;
    // The workspace as the prepared operands `[WB, TP, HV, PREP_COLS]` (16-bit), then the
    // decays and betas `[WB, TP / 16 rounded up, HV, PREP_DECAY_COLS]` (f32).
    // Without a workspace only when the path takes none (no token rows): empty at address 0.
    let (prep, prep_decay) = match (cfg.preparation, args.workspace) {
        (Preparation::Workspace, ws) => {
            let base = ws.map_or(0, |w| w.ptr());
            if ws.is_none() && chunk_workspace_bytes_unsplit(plan) > 0 {
                return Err(RuntimeError::bad_argument("workspace", "a workspace for the two-kernel path", "none"));
            }
            let (wb, tp) = prep_rows(plan.batch, plan.seq_len, plan.nseq, plan.varlen.is_some());
            let decay_at = base + workspace_prep_bytes(plan) as u64;
            (
                view(base, &[wb, tp, hv, PREP_COLS], cfg.operands.dtype())?,
                view(decay_at, &[wb, tp.div_ceil(16), hv, PREP_DECAY_COLS], DType::F32)?,
            )
        }
        _ => (view(0, &[0, 0, hv, 0], cfg.operands.dtype())?, view(0, &[0, 0, hv, 0], DType::F32)?),
    };
    use KernelArg::{Tensor as T, F32, I32};
    Ok([
        ("q", T(q)),
        ("k", T(k)),
        ("v", T(v)),
        ("g", T(g)),
        ("beta", T(beta)),
        ("a_log", T(a_log)),
        ("dt_bias", T(dt_bias)),
        ("state", T(state)),
        ("final_state", T(final_view)),
        ("state_indices", T(indices)),
        ("has_initial", T(has_initial)),
        ("cu_seqlens", T(cu)),
        ("prep", T(prep)),
        ("prep_decay", T(prep_decay)),
        ("out", T(out)),
        ("NSEQ", I32(nseq)),
        ("scale", F32(plan.scale)),
        ("lower_bound", F32(lower_bound)),
    ])
}

/// Runs KDA prefill on `stream`, mirroring the reference `chunk_kda`.
///
/// Validates every argument first (typed errors, nothing launched on a bad call). Allocates only
/// the outputs not given (`output`, and the final states when `output_final_state` is set without
/// a `final_state` buffer), and without a `workspace` grows the one [`Kernels`] keeps for
/// `stream` when the call needs more; with the outputs given and the workspace the caller's or
/// preloaded ([`crate::preload::preload_chunk`], which also loads the variants a call can pick)
/// it allocates nothing, synchronizes nothing and reads nothing back, so it can be captured in
/// a CUDA graph. `cu_seqlens` is never read on the host; `checked` reads `cu_seqlens` and
/// `state_indices` back and reports values the kernel would clamp or skip (not graph-safe).
///
/// The path is [`ChunkTuning::for_call`]'s, from the shapes and the device: the chain's grid is
/// one block per (`16 · warps` value rows, value head, sequence); with at most
/// [`prepared_max_chains`] chains the chunks are prepared first by `chunk_prep` (its grid may
/// shrink to the `max_seqlen` hint), with the same bits as the fused kernel.
///
/// ```
/// use kda_dsl::DType::{BF16, F32};
/// use kda_runtime::chunk::{chunk_kda, ChunkArgs};
/// use kda_runtime::{DeviceTensor, Gpu, Kernels};
/// # fn main() -> Result<(), kda_runtime::RuntimeError> {
/// if !kda_runtime::gpu_available() {
///     return Ok(()); // needs a GPU
/// }
/// let (gpu, kernels) = (Gpu::new(0)?, Kernels::new());
/// let s = gpu.new_stream()?;
/// let z = |shape: &[usize], d| DeviceTensor::zeros(&gpu, &s, shape, d);
/// // Two prompts of 100 tokens, 4 heads.
/// let (q, k, v, g) = (z(&[2, 100, 4, 128], BF16)?, z(&[2, 100, 4, 128], BF16)?, z(&[2, 100, 4, 128], BF16)?, z(&[2, 100, 4, 128], BF16)?);
/// let (beta, out, fin) = (z(&[2, 100, 4], BF16)?, z(&[2, 100, 4, 128], BF16)?, z(&[2, 4, 128, 128], F32)?);
/// let views = [q.view(), k.view(), v.view(), g.view(), beta.view(), out.view(), fin.view()];
/// let mut args = ChunkArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
/// args.output = Some(&views[5]);
/// args.output_final_state = true;
/// args.final_state = Some(&views[6]);
/// chunk_kda(&gpu, &kernels, &s, &args)?;
/// # Ok(())
/// # }
/// ```
pub fn chunk_kda(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
) -> Result<ChunkResult, RuntimeError> {
    let plan = plan_chunk(args)?;
    let tune = ChunkTuning::for_call(&plan, &gpu.limits());
    // The default split has limits of its own (segments per grid axis): a call past them is
    // refused, by the argument that makes it so, rather than run unsplit with other bits.
    if let Some(seg) = tune.split {
        split::check_split(&plan, seg, if plan.varlen.is_some() { "cu_seqlens" } else { "q" })?;
    }
    launch_plan(gpu, kernels, stream, args, &plan, tune)
}

/// [`chunk_kda`] with an explicit launch shape (for tuning; `warps` must be 1, 2, 4 or 8,
/// `min_blocks` 1 to 8, `stages` 2 to 8; a shape that does not fit the SM fails to load).
pub fn chunk_kda_tuned(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
    tune: ChunkTuning,
) -> Result<ChunkResult, RuntimeError> {
    let plan = plan_chunk(args)?;
    tune.check(&plan)?;
    launch_plan(gpu, kernels, stream, args, &plan, tune)
}

/// Checks the index tensors (`checked`), allocates the outputs not given and launches.
fn launch_plan(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
) -> Result<ChunkResult, RuntimeError> {
    if plan.checked {
        let cu = match (args.cu_seqlens, plan.varlen) {
            (Some(t), Some(_)) => Some(download_i64(t, stream)?),
            _ => None,
        };
        let idx = match (args.state_indices, plan.initial) {
            (Some(t), InitialState::Pool { .. }) => Some(download_i64(t, stream)?),
            _ => None,
        };
        check_chunk_indices(plan, cu.as_deref(), idx.as_deref())?;
    }
    // Varlen `[S, H, 128]` inputs get an `[S, HV, 128]` output, as the reference returns it.
    let [_, s, hv, d] = plan.output_shape;
    let output = match args.output {
        Some(_) => None,
        None if plan.squeeze_varlen => Some(DeviceTensor::zeros(gpu, stream, &[s, hv, d], plan.dtype)?),
        None => Some(DeviceTensor::zeros(gpu, stream, &plan.output_shape, plan.dtype)?),
    };
    let final_state = match plan.final_out {
        FinalState::Allocate { dtype, shape } => Some(DeviceTensor::zeros(gpu, stream, &shape, dtype)?),
        _ => None,
    };
    // Nothing to launch: no sequence or head, or no token and no state that changes (a pool
    // slot is rewritten with itself unless `has_initial_state` may zero it).
    let states_change = match (plan.final_out, plan.initial) {
        (FinalState::None, _) => false,
        (FinalState::Pool, InitialState::Pool { has_initial, .. }) => has_initial.is_some(),
        _ => true,
    };
    if plan.nseq == 0 || plan.value_heads == 0 || (plan.empty && !states_change) {
        return Ok(ChunkResult { output, final_state });
    }
    let out_ptr = match (&output, args.output) {
        (Some(t), _) => t.view().ptr(),
        (None, Some(v)) => v.ptr(),
        (None, None) => unreachable!("allocated above"),
    };
    let final_view = final_state.as_ref().map(|t| t.view()).or(args.final_state.copied());
    let kept;
    let args = &match args.workspace {
        Some(w) => {
            check_workspace(w, chunk_tuned_workspace_bytes(plan, &tune))?;
            *args
        }
        None => match chunk_tuned_workspace_bytes(plan, &tune) {
            0 => *args,
            need => {
                kept = kernels.kept_workspace(gpu, stream, need)?;
                ChunkArgs { workspace: Some(&kept), ..*args }
            }
        },
    };
    if let Some(seg) = tune.split {
        split::launch(gpu, kernels, stream, args, plan, tune, seg, out_ptr, final_view)?;
        return Ok(ChunkResult { output, final_state });
    }
    if let Some(n) = tune.ranges {
        ranges::launch(gpu, kernels, stream, args, plan, tune, n, out_ptr, final_view)?;
        return Ok(ChunkResult { output, final_state });
    }
    let cfg = chunk_tuned_config(plan, tune);
    let bound = kernel_args(args, plan, &cfg, out_ptr, final_view)?;
    if cfg.preparation == Preparation::Workspace {
        prepared::launch_preparation(gpu, kernels, stream, plan, &cfg, &bound, tune.prep_blocks)?;
    }
    launch_ready(gpu, kernels, stream, &*kernels.chunk(&cfg)?, &bound)?;
    Ok(ChunkResult { output, final_state })
}

/// Loads a compiled kernel on `gpu` (once) and launches it on `stream` with `bound`.
pub(super) fn launch_ready(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    ready: &Ready,
    bound: &[(&str, KernelArg)],
) -> Result<(), RuntimeError> {
    let loaded = ready.loaded(gpu, &kernels.modules)?;
    launch_planned(gpu, &loaded, stream, &ready.kernel, &ready.binding, &ready.id, bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::testing::{dense_bf16_inputs, tv};
    use crate::launch::bind_args;
    use crate::random_calls::{check_random_calls, DTYPES};

    /// Every accepted plan binds to its kernel: the inputs' shapes, the placeholders of what the
    /// config never reads (empty, at address 0) and the outputs agree on every symbol, including
    /// calls whose tensors are empty and at address 0 (T = 0).
    #[test]
    fn accepted_plans_bind_to_their_kernels() {
        let (h, hv) = (2, 4);
        let ws = tv(13, &[1 << 20], DType::F32);
        for ((t, varlen, pool, gate, final_state), prepared) in [
            (37, false, false, true, true),
            (37, true, false, true, false),
            (37, true, true, true, false),
            (37, false, false, false, true),
            (0, false, false, true, true),
        ]
        .into_iter()
        .flat_map(|c| [(c, false), (c, true)])
        {
            let n = 3;
            let lead = if varlen { vec![1, t * n] } else { vec![n, t] };
            // Empty tensors may sit at address 0.
            let at = |id: u64| if t == 0 { 0 } else { id };
            let shaped = |tail: &[usize]| [lead.as_slice(), tail].concat();
            let mk = |id: u64, tail: &[usize], d: DType| {
                TensorView::describe(0x1000 * at(id), &shaped(tail), d, 0).expect("a view")
            };
            let (q, k) = (mk(1, &[h, D], DType::BF16), mk(2, &[h, D], DType::BF16));
            let (v, g) = (mk(3, &[hv, D], DType::BF16), mk(4, &[hv, D], DType::BF16));
            let beta = mk(5, &[hv], DType::BF16);
            let out = mk(6, &[hv, D], DType::BF16);
            let cu = tv(7, &[n + 1], DType::I64);
            let a_log = tv(8, &[hv], DType::F32);
            let dt_bias = tv(9, &[hv * D], DType::F32);
            let init = tv(10, &[if pool { 8 } else { n }, hv, D, D], DType::F32);
            let fin = tv(11, &[n, hv, D, D], DType::F32);
            let slots = tv(12, &[n], DType::I32);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.output = Some(&out);
            args.cu_seqlens = varlen.then_some(&cu);
            if gate {
                args.a_log = Some(&a_log);
                args.dt_bias = Some(&dt_bias);
            }
            args.initial_state = Some(&init);
            args.state_indices = pool.then_some(&slots);
            args.output_final_state = final_state;
            args.final_state = final_state.then_some(&fin);
            args.workspace = prepared.then_some(&ws);
            let plan = plan_chunk(&args).expect("a valid call");
            let cfg = chunk_tuned_config(&plan, ChunkTuning::of_path(&plan, prepared));
            assert_eq!(cfg.preparation == Preparation::Workspace, prepared);
            let kernel = kda_dsl::compile(kda_kernels::chunk::chunk(&cfg).expect("builds"), kda_dsl::Target::Sm80)
                .expect("compiles");
            let bound = kernel_args(&args, &plan, &cfg, out.ptr(), args.final_state.copied()).expect("arguments");
            bind_args(&kernel, &bound).unwrap_or_else(|e| panic!("t {t} varlen {varlen} pool {pool}: {e}"));
            if prepared {
                let prep_cfg = kda_kernels::chunk_prep::PrepConfig::of(&cfg);
                let prep = kda_dsl::compile(
                    kda_kernels::chunk_prep::chunk_prep(&prep_cfg).expect("builds"),
                    kda_dsl::Target::Sm80,
                )
                .expect("compiles");
                let prep_args = super::prepared::preparation_args(&prep, &plan, &bound, None);
                bind_args(&prep, prep_args.as_slice())
                    .unwrap_or_else(|e| panic!("prep: t {t} varlen {varlen} pool {pool}: {e}"));
            }
        }
    }

    /// Random calls, well-formed or not (shapes with 0, 1, 15..17, 127, 129 tokens; every dtype
    /// in every slot; optional tensors present or absent, of the right or a wrong shape; NaN and
    /// infinite scalars; misaligned, null and other-device pointers): planning never panics, and
    /// every plan it accepts binds to its kernel.
    #[test]
    fn random_calls_plan_without_panicking_and_accepted_ones_bind() {
        use std::collections::HashMap;
        let mut kernels: HashMap<ChunkConfig, kda_dsl::artifact::CompiledKernel> = HashMap::new();
        let (mut accepted, mut rejected) = (0, 0);
        check_random_calls(0x5eed, 20_000, |x| {
            let varlen = x.r(2) == 0;
            let n = x.of(&[0, 1, 2, 3]);
            let t = x.of(&[0, 1, 15, 16, 17, 127, 129]);
            let h = x.of(&[1, 2]);
            let hv = h * x.of(&[1, 2, 3]) + usize::from(x.r(10) == 0);
            let d = if x.r(12) == 0 { 64 } else { D };
            let dt = if x.r(8) == 0 { x.of(&DTYPES) } else { x.of(&[DType::BF16, DType::F16]) };
            let lead: Vec<usize> = match (varlen, x.r(4)) {
                (true, 0) => vec![t * n.max(1)],
                (true, _) => vec![1, t * n.max(1)],
                (false, _) => vec![n, t],
            };
            let with = |tail: &[usize]| [lead.as_slice(), tail].concat();
            let q = x.view(&with(&[h, d]), dt);
            let kd = if x.r(20) == 0 { 64 } else { d };
            let k_dt = x.mostly(dt);
            let k = x.view(&with(&[h, kd]), k_dt);
            let (v_dt, g_dt, b_dt, o_dt) = (x.mostly(dt), x.mostly(dt), x.mostly(dt), x.mostly(dt));
            let v = x.view(&with(&[hv, d]), v_dt);
            let g = x.view(&with(&[hv, d]), g_dt);
            let bh = hv + usize::from(x.r(20) == 0);
            let beta = x.view(&with(&[bh]), b_dt);
            let cu_len = n + 1 - usize::from(x.r(20) == 0 && n > 0);
            let cu_dt = x.of(&[DType::I32, DType::I64, DType::F32]);
            let cu = x.view(&[cu_len], cu_dt);
            let (al_len, al_dt) = (hv + usize::from(x.r(20) == 0), x.mostly(DType::F32));
            let a_log = x.view(&[al_len], al_dt);
            let db_shape = if x.r(2) == 0 { vec![hv, D] } else { vec![hv * D] };
            let db_dt = x.of(&[DType::F32, DType::BF16, DType::F16]);
            let dt_bias = x.view(&db_shape, db_dt);
            let pool = x.r(3) == 0;
            let slots_n = if pool { x.of(&[1, 4, 8]) } else { n };
            let state_dt = x.of(&[DType::F32, dt, DType::BF16, DType::F16]);
            let init = x.view(&[slots_n, hv, D, D], state_dt);
            let fin_dt = x.mostly(state_dt);
            let fin = x.view(&[n, hv, D, D], fin_dt);
            let (idx_len, idx_dt) = (n + usize::from(x.r(20) == 0), x.of(&[DType::I32, DType::I64, DType::F32]));
            let slots = x.view(&[idx_len], idx_dt);
            let has_dt = x.of(&[DType::I32, DType::I64]);
            let has = x.view(&[n], has_dt);
            let out = x.view(&with(&[hv, d]), o_dt);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.cu_seqlens = (varlen || x.r(20) == 0).then_some(&cu);
            args.a_log = (x.r(3) != 0).then_some(&a_log);
            args.dt_bias = (x.r(3) != 0).then_some(&dt_bias);
            args.initial_state = (pool || x.r(2) == 0).then_some(&init);
            args.state_indices = (pool && x.r(10) != 0).then_some(&slots);
            args.has_initial_state = (pool && x.r(2) == 0).then_some(&has);
            args.output_final_state = x.r(2) == 0;
            args.final_state = (x.r(2) == 0).then_some(&fin);
            args.output = (x.r(3) != 0).then_some(&out);
            let scale = x.of(&[0.1, -1.0, f32::NAN, f32::INFINITY, 0.0]);
            args.scale = (x.r(3) == 0).then_some(scale);
            let lower_bound = x.of(&[-5.0, -1.0, -0.0, 0.0, -6.0, f32::NAN]);
            args.lower_bound = (x.r(2) == 0).then_some(lower_bound);
            let l2 = x.r(2) == 0;
            args.use_qk_l2norm_in_kernel = (x.r(2) == 0).then_some(l2);
            let plan = match std::panic::catch_unwind(|| plan_chunk(&args)) {
                Err(_) => panic!("plan_chunk panicked"),
                Ok(Err(_)) => {
                    rejected += 1;
                    return Ok(());
                }
                Ok(Ok(plan)) => plan,
            };
            accepted += 1;
            let tune = ChunkTuning::for_call(&plan, &DeviceLimits::H200);
            let cfg = chunk_tuned_config(&plan, tune);
            // The workspace the launch gives the call's path: the caller's or the kept one.
            let need = super::chunk_tuned_workspace_bytes(&plan, &tune);
            let ws = TensorView::describe(0xb000_0000, &[need.div_ceil(4)], DType::F32, q.device()).expect("a view");
            if need > 0 && args.workspace.is_none_or(|w| w.size_bytes() < need) {
                args.workspace = Some(&ws);
            }
            let kernel = kernels.entry(cfg.clone()).or_insert_with(|| {
                kda_dsl::compile(kda_kernels::chunk::chunk(&cfg).expect("builds"), kda_dsl::Target::Sm80)
                    .expect("compiles")
            });
            // The outputs the launch would allocate, where none was given.
            let dev = q.device();
            let out_view = match args.output {
                Some(o) => *o,
                None => TensorView::describe(0x9000_0000, &plan.output_shape, plan.dtype, dev).expect("a view"),
            };
            let final_view = match plan.final_out {
                FinalState::Allocate { dtype, shape } => {
                    Some(TensorView::describe(0xa000_0000, &shape, dtype, dev).expect("a view"))
                }
                _ => args.final_state.copied(),
            };
            let bound = kernel_args(&args, &plan, &cfg, out_view.ptr(), final_view)
                .unwrap_or_else(|e| panic!("an accepted plan gets no arguments: {e}"));
            bind_args(kernel, &bound).unwrap_or_else(|e| panic!("an accepted plan does not bind ({}): {e}", cfg.key()));
            Ok(())
        });
        // Both outcomes are exercised.
        eprintln!("accepted {accepted}, rejected {rejected}, {} kernel configs", kernels.len());
        assert!(accepted > 500 && rejected > 5000, "accepted {accepted}, rejected {rejected}");
    }

    /// The longest dense call the plan accepts, 2^31 - 16 tokens (whole chunks within 32 bits),
    /// binds on the path its value heads take, or its split is refused by name before launching.
    #[test]
    fn the_longest_call_binds_or_is_refused_by_name() {
        let t = i32::MAX as usize - 15;
        for hv in [1, 32] {
            let at = |id: u64, tail: &[usize]| tv(id << 44 >> 20, &[&[1, t][..], tail].concat(), DType::BF16);
            let (q, k, v, g, beta) = (at(1, &[1, D]), at(2, &[1, D]), at(3, &[hv, D]), at(4, &[hv, D]), at(5, &[hv]));
            let out = at(6, &[hv, D]);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.output = Some(&out);
            let plan = plan_chunk(&args).expect("T = 2^31 - 1 is accepted");
            let tune = ChunkTuning::for_call(&plan, &DeviceLimits::H200);
            let need = super::super::chunk_tuned_workspace_bytes(&plan, &tune);
            let ws = TensorView::describe(7 << 44, &[need.div_ceil(4)], DType::F32, 0).expect("a view");
            args.workspace = Some(&ws);
            if let Some(seg) = tune.split {
                let e = super::split::check_split(&plan, seg, "q").expect_err("2^19 segments").to_string();
                assert!(e.contains("65535 segments"), "{e}");
                continue;
            }
            let cfg = chunk_tuned_config(&plan, tune);
            let kernel = kda_dsl::compile(kda_kernels::chunk::chunk(&cfg).expect("builds"), kda_dsl::Target::Sm80)
                .expect("compiles");
            let bound = kernel_args(&args, &plan, &cfg, out.ptr(), None).expect("arguments");
            bind_args(&kernel, &bound).unwrap_or_else(|e| panic!("HV {hv}, {}: {e}", cfg.key()));
        }
    }

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
        let shape = |warps, min_blocks, stages| ChunkTuning {
            shape: ChunkShape { warps, min_blocks, stages, fill_warps: 0 },
            ..ok
        };
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
        refused(ChunkTuning { prep_blocks: Some(0), ..ok }, "prep_blocks from 1");
        refused(ChunkTuning { ranges: Some(1), ..ok }, "at least 2 ranges");
        refused(ChunkTuning { split: Some(3), ..ok }, "split");
    }

    /// The README's bf16 operands: a valid tuning, carried into the chain's config, its
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
        assert!(chunk_variants(&unnormalized).0.iter().all(|c| c.operands == ChunkOperands::Bf16), "preloads");
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
