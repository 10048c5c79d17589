//! `chunk_kda`: validate, pick the kernel variant, bind and launch.

use cudarc::driver::CudaStream;
use kda_dsl::DType;
use kda_kernels::chunk::{ChunkConfig, ChunkGate as KernelGate, ChunkStates};

use super::args::ChunkArgs;
use super::checked::check_chunk_indices;
use super::plan::{plan_chunk, ChunkGate, ChunkPlan, FinalState, InitialState};
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::{launch_loaded, KernelArg};
use crate::tensor::{download_i64, DeviceTensor, TensorView};

/// Head dimension (K = V).
const D: usize = 128;

/// What a `chunk_kda` call returns beyond what it wrote into the caller's buffers.
pub struct ChunkResult {
    /// The output, when the call allocated it (`output` was not given).
    pub output: Option<DeviceTensor>,
    /// The final states, when `output_final_state` asked for them and no `final_state` buffer
    /// was given. With `state_indices` the pool itself is the result and nothing is returned.
    pub final_state: Option<DeviceTensor>,
}

/// How a chunk launch is shaped. [`ChunkTuning::for_call`] is what [`chunk_kda`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkTuning {
    /// Warps per block (1, 2, 4 or 8), each owning 16 of a head's 128 value rows.
    pub warps: usize,
    /// Blocks that must fit on an SM at once (1 to 8; caps registers per thread).
    pub min_blocks: usize,
}

impl ChunkTuning {
    /// The shape [`chunk_kda`] picks: the config default, whatever the call
    /// ([`ChunkConfig::default`]; chosen by `kda bench --sweep-chunk` on an H200).
    pub fn for_call(_plan: &ChunkPlan) -> ChunkTuning {
        let d = ChunkConfig::default();
        ChunkTuning { warps: d.warps, min_blocks: d.min_blocks }
    }
}

/// The kernel variant a validated call needs.
pub fn chunk_config(plan: &ChunkPlan) -> ChunkConfig {
    tuned_config(plan, ChunkTuning::for_call(plan))
}

fn tuned_config(plan: &ChunkPlan, tune: ChunkTuning) -> ChunkConfig {
    let store_final = !matches!(plan.final_out, FinalState::None);
    let states = match plan.initial {
        InitialState::Zeros => ChunkStates::Zeros { store_final },
        InitialState::PerSequence { .. } => ChunkStates::PerSequence { store_final },
        InitialState::Pool { indices, has_initial, .. } => ChunkStates::Pool { indices, has_initial },
    };
    ChunkConfig {
        dtype: plan.dtype,
        state_dtype: plan.state_dtype,
        gate: match plan.gate {
            ChunkGate::LowerBound { .. } => KernelGate::LowerBound,
            ChunkGate::Precomputed => KernelGate::Precomputed,
        },
        dt_bias: plan.dt_bias.unwrap_or(DType::F32),
        l2norm: plan.l2norm,
        varlen: plan.varlen,
        states,
        warps: tune.warps,
        min_blocks: tune.min_blocks,
    }
}

/// Runs KDA prefill on `stream`, mirroring the reference `chunk_kda`.
///
/// Validates every argument first (typed errors, nothing launched on a bad call). Allocates only
/// the outputs not given (`output`, and the final states when `output_final_state` is set without
/// a `final_state` buffer); with them given it allocates nothing, synchronizes nothing and reads
/// nothing back, so it can be captured in a CUDA graph (make one call of the same kind first so
/// its module is loaded: the variant depends on the dtypes and flags, [`chunk_config`]).
/// `cu_seqlens` is never read on the host; `checked` reads `cu_seqlens` and `state_indices`
/// back and reports values the kernel would clamp or skip (not graph-safe).
///
/// The grid is one block per (16 value rows, value head, sequence), sized from the shapes alone;
/// `max_seqlen` does not change it (only the checked mode reads it).
pub fn chunk_kda(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
) -> Result<ChunkResult, RuntimeError> {
    let plan = plan_chunk(args)?;
    launch_plan(gpu, kernels, stream, args, &plan, ChunkTuning::for_call(&plan))
}

/// [`chunk_kda`] with an explicit launch shape (for tuning; `warps` must be 1, 2, 4 or 8,
/// `min_blocks` 1 to 8; a shape that does not fit the SM fails to load).
pub fn chunk_kda_tuned(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
    tune: ChunkTuning,
) -> Result<ChunkResult, RuntimeError> {
    if !matches!(tune.warps, 1 | 2 | 4 | 8) || !(1..=8).contains(&tune.min_blocks) {
        return Err(RuntimeError::Unsupported(format!(
            "chunk tuning {tune:?}: warps must be 1, 2, 4 or 8, min_blocks 1 to 8"
        )));
    }
    let plan = plan_chunk(args)?;
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
    let plan = plan.clone();
    if args.checked {
        let cu = match (args.cu_seqlens, plan.varlen) {
            (Some(t), Some(_)) => Some(download_i64(t, stream)?),
            _ => None,
        };
        let idx = match (args.state_indices, plan.initial) {
            (Some(t), InitialState::Pool { .. }) => Some(download_i64(t, stream)?),
            _ => None,
        };
        check_chunk_indices(&plan, cu.as_deref(), idx.as_deref())?;
    }
    let dev = args.q.device();
    let output = match args.output {
        Some(_) => None,
        None => Some(DeviceTensor::zeros(gpu, stream, &plan.output_shape, plan.dtype)?),
    };
    let final_state = match (plan.final_out, args.final_state) {
        (FinalState::Allocate { dtype, shape }, _) => Some(DeviceTensor::zeros(gpu, stream, &shape, dtype)?),
        _ => None,
    };
    // No sequence (or no head): nothing to compute or write.
    if plan.nseq == 0 || plan.value_heads == 0 {
        return Ok(ChunkResult { output, final_state });
    }
    let view = |ptr: u64, shape: &[usize], dtype: DType| TensorView::new(ptr, shape, dtype, dev);
    let out_ptr = match (&output, args.output) {
        (Some(t), _) => t.view().ptr(),
        (None, Some(v)) => v.ptr(),
        (None, None) => unreachable!("allocated above"),
    };
    let cfg = tuned_config(&plan, tune);
    let ready = kernels.chunk(&cfg)?;

    // Inputs as the kernel's 4-D (3-D for beta) tensors, varlen `[S, ..]` views included.
    let (bt, hv) = ([plan.batch, plan.seq_len], plan.value_heads);
    let dt = plan.dtype;
    let q = view(args.q.ptr(), &[bt[0], bt[1], plan.heads, D], dt)?;
    let k = view(args.k.ptr(), &[bt[0], bt[1], plan.heads, D], dt)?;
    let v = view(args.v.ptr(), &[bt[0], bt[1], hv, D], dt)?;
    let g = view(args.g.ptr(), &[bt[0], bt[1], hv, D], dt)?;
    let beta = view(args.beta.ptr(), &[bt[0], bt[1], hv], dt)?;
    let out = view(out_ptr, &plan.output_shape, dt)?;
    // Tensors the config never reads still bind: a placeholder at q's address, with a shape
    // that agrees with the symbols it shares. The kernel does not touch them.
    let hold = args.q.ptr();
    let st = plan.state_dtype;
    let state = match (plan.initial, args.initial_state) {
        (InitialState::Zeros, _) | (_, None) => view(hold, &[1, hv, D, D], st)?,
        (_, Some(s)) => *s,
    };
    let final_view = match (plan.final_out, &final_state, args.final_state) {
        (FinalState::Allocate { .. }, Some(t), _) => t.view(),
        (FinalState::Given { .. }, _, Some(t)) => *t,
        _ => view(hold, &[1, hv, D, D], st)?,
    };
    let (a_log, dt_bias, lower_bound) = match (plan.gate, args.a_log, args.dt_bias) {
        (ChunkGate::LowerBound { lower_bound }, Some(a), Some(d)) => {
            (*a, view(d.ptr(), &[hv, D], d.dtype())?, lower_bound)
        }
        _ => (view(hold, &[1], DType::F32)?, view(hold, &[1, 1], cfg.dt_bias)?, 0.0),
    };
    let pool = matches!(plan.initial, InitialState::Pool { .. });
    let indices = match (pool, args.state_indices) {
        (true, Some(t)) => *t,
        _ => view(hold, &[1], DType::I32)?,
    };
    let has_initial = match (pool, args.has_initial_state) {
        (true, Some(t)) => *t,
        _ => view(hold, &[1], DType::I32)?,
    };
    let cu = match (plan.varlen, args.cu_seqlens) {
        (Some(_), Some(t)) => *t,
        _ => view(hold, &[1], DType::I32)?,
    };
    let nseq = i32::try_from(plan.nseq)
        .map_err(|_| RuntimeError::bad_argument("cu_seqlens", "fewer than 2^31 sequences", plan.nseq.to_string()))?;
    let loaded = kernels.modules.get_or_load(gpu, &ready.kernel, &ready.id)?;
    use KernelArg::{Tensor as T, F32, I32};
    launch_loaded(
        gpu,
        &loaded,
        stream,
        &ready.kernel,
        &[
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
            ("out", T(out)),
            ("NSEQ", I32(nseq)),
            ("scale", F32(plan.scale)),
            ("lower_bound", F32(lower_bound)),
        ],
    )?;
    Ok(ChunkResult { output, final_state })
}
