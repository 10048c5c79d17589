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

/// The kernel's arguments for a planned call: the inputs as the kernel's 4-D (3-D for beta)
/// tensors, varlen `[S, ..]` views included; the output at `out_ptr`; `final_state` (given or
/// allocated) when the plan writes one. Tensors the config never reads bind as empty
/// placeholders at address 0, with shapes that agree with the symbols they share.
fn kernel_args(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    cfg: &ChunkConfig,
    out_ptr: u64,
    final_state: Option<TensorView>,
) -> Result<Vec<(&'static str, KernelArg)>, RuntimeError> {
    let dev = args.q.device();
    let view = |ptr: u64, shape: &[usize], dtype: DType| TensorView::new(ptr, shape, dtype, dev);
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
    let (a_log, dt_bias, lower_bound) = match (plan.gate, args.a_log, args.dt_bias) {
        (ChunkGate::LowerBound { lower_bound }, Some(a), Some(d)) => {
            (*a, view(d.ptr(), &[hv, D], d.dtype())?, lower_bound)
        }
        _ => (view(0, &[0], DType::F32)?, view(0, &[0, 0], cfg.dt_bias)?, 0.0),
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
    use KernelArg::{Tensor as T, F32, I32};
    Ok(vec![
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
    ])
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
    let output = match args.output {
        Some(_) => None,
        None => Some(DeviceTensor::zeros(gpu, stream, &plan.output_shape, plan.dtype)?),
    };
    let final_state = match (plan.final_out, args.final_state) {
        (FinalState::Allocate { dtype, shape }, _) => Some(DeviceTensor::zeros(gpu, stream, &shape, dtype)?),
        _ => None,
    };
    // No sequence (or no head), or no token and no state to write: nothing to launch.
    let writes_nothing = plan.total_tokens == 0 && matches!(plan.final_out, FinalState::None);
    if plan.nseq == 0 || plan.value_heads == 0 || writes_nothing {
        return Ok(ChunkResult { output, final_state });
    }
    let out_ptr = match (&output, args.output) {
        (Some(t), _) => t.view().ptr(),
        (None, Some(v)) => v.ptr(),
        (None, None) => unreachable!("allocated above"),
    };
    let final_view = match (&final_state, args.final_state) {
        (Some(t), _) => Some(t.view()),
        (None, given) => given.copied(),
    };
    let cfg = tuned_config(&plan, tune);
    let ready = kernels.chunk(&cfg)?;
    let bound = kernel_args(args, &plan, &cfg, out_ptr, final_view)?;
    let loaded = kernels.modules.get_or_load(gpu, &ready.kernel, &ready.id)?;
    launch_loaded(gpu, &loaded, stream, &ready.kernel, &bound)?;
    Ok(ChunkResult { output, final_state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::bind_args;

    fn tv(id: u64, shape: &[usize], dtype: DType) -> TensorView {
        TensorView::new(0x1000 * id, shape, dtype, 0).expect("a view")
    }

    /// Every accepted plan binds to its kernel: the inputs' shapes, the placeholders of what the
    /// config never reads (empty, at address 0) and the outputs agree on every symbol, including
    /// calls whose tensors are empty and at address 0 (T = 0).
    #[test]
    fn accepted_plans_bind_to_their_kernels() {
        let (h, hv) = (2, 4);
        for (t, varlen, pool, gate, final_state) in [
            (37, false, false, true, true),
            (37, true, false, true, false),
            (37, true, true, true, false),
            (37, false, false, false, true),
            (0, false, false, true, true),
        ] {
            let n = 3;
            let lead = if varlen { vec![1, t * n] } else { vec![n, t] };
            // Empty tensors may sit at address 0.
            let at = |id: u64| if t == 0 { 0 } else { id };
            let shaped = |tail: &[usize]| [lead.as_slice(), tail].concat();
            let mk = |id: u64, tail: &[usize], d: DType| {
                TensorView::new(0x1000 * at(id), &shaped(tail), d, 0).expect("a view")
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
            let plan = plan_chunk(&args).expect("a valid call");
            let cfg = chunk_config(&plan);
            let kernel = kda_dsl::compile(kda_kernels::chunk::chunk(&cfg).expect("builds"), kda_dsl::Target::Sm80)
                .expect("compiles");
            let bound = kernel_args(&args, &plan, &cfg, out.ptr(), args.final_state.copied()).expect("arguments");
            bind_args(&kernel, &bound).unwrap_or_else(|e| panic!("t {t} varlen {varlen} pool {pool}: {e}"));
        }
    }
}
