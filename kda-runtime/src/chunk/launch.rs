//! `chunk_kda`: validate, pick the path, resolve the workspace, then run the path's steps.

use cudarc::driver::CudaStream;

use super::args::ChunkArgs;
use super::bind::kernel_args;
use super::checked::{check_chunk_indices, ChunkIndices};
use super::plan::{plan_chunk, ChunkPlan, FinalState, InitialState};
use super::steps::run_steps;
#[cfg(doc)]
use super::tuning::prepared_max_chains;
use super::tuning::{chunk_tuned_config, ChunkTuning};
use super::workspace::{check_workspace, chunk_tuned_workspace_bytes};
use super::{eligibility, prepared, ranges, split};
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::tensor::{download_i64, DeviceTensor};

/// What a `chunk_kda` call returns beyond what it wrote into the caller's buffers.
pub struct ChunkResult {
    /// The output, when the call allocated it (`output` was not given).
    pub output: Option<DeviceTensor>,
    /// The final states, when `output_final_state` asked for them and no `final_state` buffer
    /// was given. With `state_indices` the pool itself is the result and nothing is returned.
    pub final_state: Option<DeviceTensor>,
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
        eligibility::check_split(&plan, seg, if plan.varlen.is_some() { "cu_seqlens" } else { "q" })?;
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

/// Checks the index tensors (`checked`) and the caller's workspace, allocates the outputs not
/// given, takes the kept workspace when the path needs one and none was given, then runs the
/// path's steps.
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
        let pool_ints = |t: Option<&crate::TensorView>| match (t, plan.initial) {
            (Some(t), InitialState::Pool { .. }) => download_i64(t, stream).map(Some),
            _ => Ok(None),
        };
        let (idx, read) = (pool_ints(args.state_indices)?, pool_ints(args.read_indices)?);
        let (lens, slots) = (pool_ints(args.prefix_lens)?, pool_ints(args.checkpoint_slots)?);
        let shared_pool = match (args.checkpoint_pool, args.initial_state) {
            (Some(c), Some(p)) => c.ptr() == p.ptr(),
            _ => true,
        };
        let indices = ChunkIndices {
            cu_seqlens: cu.as_deref(),
            state_indices: idx.as_deref(),
            read_indices: read.as_deref(),
            prefix_lens: lens.as_deref(),
            checkpoint_slots: slots.as_deref(),
            checkpoints_in_the_state_pool: shared_pool,
        };
        check_chunk_indices(plan, indices)?;
    }
    // The workspace the path takes: a caller's must hold it (checked before anything is
    // allocated); without one, the kept workspace is taken below, once there is work.
    let need = chunk_tuned_workspace_bytes(plan, &tune);
    if let Some(w) = args.workspace {
        check_workspace(w, need)?;
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
    // slot is rewritten with itself unless `has_initial_state` may zero it or `read_indices`
    // names another slot to start from).
    let states_change = match (plan.final_out, plan.initial) {
        (FinalState::None, _) => false,
        (FinalState::Pool, InitialState::Pool { has_initial, .. }) => {
            has_initial.is_some() || args.read_indices.is_some()
        }
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
        None if need > 0 => {
            kept = kernels.kept_workspace(gpu, stream, need)?;
            ChunkArgs { workspace: Some(&kept), ..*args }
        }
        _ => *args,
    };
    // Each path's steps, then the one function that binds and launches them.
    match (tune.split, tune.ranges) {
        (Some(seg), _) => {
            run_steps(gpu, kernels, stream, &split::split_steps(args, plan, tune, seg, out_ptr, final_view)?)?
        }
        (None, Some(n)) => {
            run_steps(gpu, kernels, stream, &ranges::range_steps(args, plan, tune, n, out_ptr, final_view)?)?
        }
        (None, None) => {
            let cfg = chunk_tuned_config(plan, tune);
            let bound = kernel_args(args, plan, &cfg, out_ptr, final_view)?;
            let steps = prepared::chain_steps(plan, cfg, tune.target, bound, tune.prep_blocks, tune.chain_sms);
            run_steps(gpu, kernels, stream, steps.iter().flatten())?
        }
    }
    Ok(ChunkResult { output, final_state })
}
