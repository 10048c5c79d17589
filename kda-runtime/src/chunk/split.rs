//! The exact long-sequence split of a dense call (opt-in: [`ChunkTuning::split`]).
//!
//! With `T` a multiple of `16 · nseg`, the tensors `[B, T, ..]` are exactly the dense batch
//! `[B · nseg, T / nseg, ..]` of the sequences' segments, so every pass is the chunk kernel on
//! that batch (CHUNK-ALGORITHM.md, the transition form):
//! 1. from zeros, each segment's final state `H` (its output rows are overwritten later);
//! 2. in transition mode (from the identity, `v = 0`), each segment's `K x K` transition `M`;
//! 3. the merge chains `S_{s+1} = S_s M_s + H_s` from each sequence's initial state, writing
//!    every segment's start and the final states;
//! 4. from its start state, every segment's output rows.
//!
//! With a workspace ([`ChunkTuning::prepared`]) the segments' operands are prepared once
//! first, and the three chunk passes read them.
//!
//! The split depends on `T` alone, so a sequence's result does not depend on the rest of the
//! batch.

use kda_kernels::chunk::{ChunkConfig, Preparation};
use kda_kernels::chunk_merge::MergeConfig;

use super::args::ChunkArgs;
use super::launch::{kernel_args, launch_ready, tuned_config, ChunkKernelArgs, ChunkTuning};
use super::plan::{plan_chunk, ChunkPlan, InitialState};
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::KernelArg;
use crate::tensor::{DeviceTensor, TensorView};
use cudarc::driver::CudaStream;
use kda_dsl::DType;

/// Head dimension (K = V).
const D: usize = crate::validate::HEAD_DIM;

/// The split's workspace: three f32 tensors of `[B · nseg, HV, 128, 128]`.
pub(super) struct SplitWorkspace {
    /// Each segment's final state from zeros.
    pub h: TensorView,
    /// Each segment's transition.
    pub m: TensorView,
    /// Each segment's start state.
    pub starts: TensorView,
}

/// The shape of each workspace tensor of a split into `nseg` segments.
pub(super) fn workspace_shape(plan: &ChunkPlan, nseg: usize) -> [usize; 4] {
    [plan.batch * nseg, plan.value_heads, D, D]
}

/// One launch of the split: the kernel's config and its arguments.
pub(super) enum SplitLaunch {
    /// With a workspace, first: the segments' preparation (the segment call's plan, config and
    /// chunk-kernel arguments, from which the preparation takes its own).
    Prepare(ChunkPlan, ChunkConfig, ChunkKernelArgs),
    /// A chunk-kernel pass.
    Chunk(ChunkConfig, ChunkKernelArgs),
    /// The merge.
    Merge(MergeConfig, Vec<(&'static str, KernelArg)>),
}

/// Whether a planned call can take the split into `nseg` segments; the reason when not.
pub(super) fn check_split(plan: &ChunkPlan, nseg: usize) -> Result<(), RuntimeError> {
    let why = if nseg < 2 {
        Some("at least 2 segments".to_string())
    } else if plan.varlen.is_some() {
        Some("a dense call (varlen calls are not split yet)".to_string())
    } else if matches!(plan.initial, InitialState::Pool { .. }) {
        Some("a call without state_indices".to_string())
    } else if !plan.seq_len.is_multiple_of(16 * nseg) {
        Some(format!("T = {} a multiple of 16 · {nseg}", plan.seq_len))
    } else if plan.batch * nseg > 65535 {
        Some(format!("B · segments = {} at most 65535", plan.batch * nseg))
    } else {
        None
    };
    match why {
        Some(w) => {
            Err(RuntimeError::bad_argument("tune", format!("a split into {nseg} segments needs {w}"), "this call"))
        }
        None => Ok(()),
    }
}

/// The four launches of a split call, in order. `out_ptr` is the output, `fin` the final
/// states (the caller's, the allocated ones, or scratch of the plan's state dtype when the
/// call returns none).
pub(super) fn split_launches(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    nseg: usize,
    out_ptr: u64,
    ws: &SplitWorkspace,
    fin: TensorView,
) -> Result<Vec<SplitLaunch>, RuntimeError> {
    check_split(plan, nseg)?;
    let dev = args.q.device();
    let (nb, len, hv) = (plan.batch * nseg, plan.seq_len / nseg, plan.value_heads);
    let seg = |x: &TensorView, tail: &[usize]| {
        let shape: Vec<usize> = [&[nb, len][..], tail].concat();
        TensorView::describe(x.ptr(), &shape, x.dtype(), dev)
    };
    let q = seg(args.q, &[plan.heads, D])?;
    let k = seg(args.k, &[plan.heads, D])?;
    let v = seg(args.v, &[hv, D])?;
    let g = seg(args.g, &[hv, D])?;
    let beta = seg(args.beta, &[hv])?;
    let out = TensorView::describe(out_ptr, &[nb, len, hv, D], plan.dtype, dev)?;
    // A pass over the segments: the caller's call reshaped, with the pass's states.
    let pass = |initial: Option<&TensorView>, final_state: Option<&TensorView>, transition: bool| {
        let mut a = args.on_inputs(&q, &k, &v, &g, &beta);
        a.output = Some(&out);
        // The segments' workspace rows are the call's, in the same order (whole chunks).
        a.workspace = args.workspace.filter(|_| tune.prepared);
        a.initial_state = initial;
        a.output_final_state = final_state.is_some();
        a.final_state = final_state;
        // The caller's call was planned and this is its reshape: a failure is a bug here.
        let p = plan_chunk(&a).map_err(|e| RuntimeError::Unsupported(format!("the split's segment call: {e}")))?;
        let cfg = ChunkConfig { transition, ..tuned_config(&p, tune) };
        let bound = kernel_args(&a, &p, &cfg, out.ptr(), final_state.copied())?;
        Ok::<_, RuntimeError>((p, cfg, bound))
    };
    let initial = !matches!(plan.initial, InitialState::Zeros);
    let merge_cfg = MergeConfig { state_dtype: plan.state_dtype, initial };
    // Without an initial state, `init` is never read: it binds as `fin`, which has its shape.
    let init = match args.initial_state.filter(|_| initial) {
        Some(s) => *s,
        None => fin,
    };
    use KernelArg::{Tensor as T, I32};
    let nseg_arg = i32::try_from(nseg)
        .map_err(|_| RuntimeError::bad_argument("tune", "fewer than 2^31 segments", nseg.to_string()))?;
    let merge = vec![
        ("init", T(init)),
        ("h", T(ws.h)),
        ("m", T(ws.m)),
        ("starts", T(ws.starts)),
        ("fin", T(fin)),
        ("NSEG", I32(nseg_arg)),
    ];
    let chunk = |(_, cfg, bound): (ChunkPlan, ChunkConfig, _)| SplitLaunch::Chunk(cfg, bound);
    let first = pass(None, Some(&ws.h), false)?;
    // With a workspace, the segments' operands are prepared once for all three passes.
    let prepare = (first.1.preparation == Preparation::Workspace)
        .then(|| SplitLaunch::Prepare(first.0.clone(), first.1.clone(), first.2));
    Ok(prepare
        .into_iter()
        .chain([
            chunk(first),
            chunk(pass(None, Some(&ws.m), true)?),
            SplitLaunch::Merge(merge_cfg, merge),
            chunk(pass(Some(&ws.starts), None, false)?),
        ])
        .collect())
}

/// Runs a split call on `stream`: allocates the workspace (and scratch final states when the
/// call returns none), issues the four launches and frees the workspace, which waits for them.
#[allow(clippy::too_many_arguments)] // the launch's state, as the caller holds it
pub(super) fn launch(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    nseg: usize,
    out_ptr: u64,
    final_view: Option<TensorView>,
) -> Result<(), RuntimeError> {
    let shape = workspace_shape(plan, nseg);
    let ws_h = DeviceTensor::zeros(gpu, stream, &shape, DType::F32)?;
    let ws_m = DeviceTensor::zeros(gpu, stream, &shape, DType::F32)?;
    let ws_s = DeviceTensor::zeros(gpu, stream, &shape, DType::F32)?;
    let ws = SplitWorkspace { h: ws_h.view(), m: ws_m.view(), starts: ws_s.view() };
    // The merge writes final states; scratch ones when the call returns none.
    let scratch = match final_view.filter(|_| !matches!(plan.final_out, super::plan::FinalState::None)) {
        Some(_) => None,
        None => Some(DeviceTensor::zeros(gpu, stream, &[plan.nseq, plan.value_heads, D, D], plan.state_dtype)?),
    };
    let fin = match (&scratch, final_view) {
        (Some(t), _) => t.view(),
        (None, Some(v)) => v,
        (None, None) => unreachable!("a final view or scratch above"),
    };
    for step in split_launches(args, plan, tune, nseg, out_ptr, &ws, fin)? {
        match step {
            SplitLaunch::Prepare(p, cfg, bound) => {
                super::prepared::launch_preparation(gpu, kernels, stream, &p, &cfg, &bound, tune.prep_blocks)?
            }
            SplitLaunch::Chunk(cfg, bound) => launch_ready(gpu, kernels, stream, &*kernels.chunk(&cfg)?, &bound)?,
            SplitLaunch::Merge(cfg, bound) => launch_ready(gpu, kernels, stream, &*kernels.chunk_merge(&cfg)?, &bound)?,
        }
    }
    // Freed here with cuMemFree, which waits for the work queued on them (so a split call
    // returns once its kernels have run).
    drop((ws_h, ws_m, ws_s, scratch));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::testing::tv;
    use crate::launch::bind_args;
    use kda_dsl::DType;

    /// Every launch of a split binds to its compiled kernel, with and without initial and
    /// final states, for f32 and bf16 states; calls that cannot be split say why.
    #[test]
    fn split_launches_bind_to_their_kernels() {
        let (b, t, h, hv, nseg) = (2, 64, 1, 2, 4);
        let tune = ChunkTuning {
            shape: super::super::ChunkShape::FUSED,
            split: Some(nseg),
            prepared: false,
            prep_blocks: None,
            ranges: None,
        };
        let (q, k) = (tv(1, &[b, t, h, D], DType::BF16), tv(2, &[b, t, h, D], DType::BF16));
        let (v, g) = (tv(3, &[b, t, hv, D], DType::BF16), tv(4, &[b, t, hv, D], DType::BF16));
        let beta = tv(5, &[b, t, hv], DType::BF16);
        let out = tv(6, &[b, t, hv, D], DType::BF16);
        let (a_log, dt_bias) = (tv(7, &[hv], DType::F32), tv(8, &[hv, D], DType::F32));
        let ws_shape = [b * nseg, hv, D, D];
        let ws = SplitWorkspace {
            h: tv(9, &ws_shape, DType::F32),
            m: tv(10, &ws_shape, DType::F32),
            starts: tv(11, &ws_shape, DType::F32),
        };
        for (state_dtype, with_initial, with_final) in
            [(DType::F32, true, true), (DType::BF16, true, false), (DType::F32, false, true)]
        {
            let init = tv(12, &[b, hv, D, D], state_dtype);
            let fin = tv(13, &[b, hv, D, D], state_dtype);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.a_log = Some(&a_log);
            args.dt_bias = Some(&dt_bias);
            args.output = Some(&out);
            args.initial_state = with_initial.then_some(&init);
            args.output_final_state = with_final;
            args.final_state = with_final.then_some(&fin);
            let plan = plan_chunk(&args).expect("a valid call");
            for step in split_launches(&args, &plan, tune, nseg, out.ptr(), &ws, fin).expect("launches") {
                let (def, bound) = match step {
                    SplitLaunch::Prepare(..) => unreachable!("no workspace"),
                    SplitLaunch::Chunk(cfg, bound) => (kda_kernels::chunk::chunk(&cfg), bound.to_vec()),
                    SplitLaunch::Merge(cfg, bound) => (kda_kernels::chunk_merge::chunk_merge(&cfg), bound),
                };
                let kernel = kda_dsl::compile(def.expect("builds"), kda_dsl::Target::Sm80).expect("compiles");
                bind_args(&kernel, &bound).unwrap_or_else(|e| panic!("{}: {e}", kernel.entry));
            }
            // 64 tokens do not split into 3 segments of whole chunks.
            let e = split_launches(&args, &plan, tune, 3, out.ptr(), &ws, fin).err().expect("refused");
            assert!(e.to_string().contains("a multiple of 16"), "{e}");
        }
    }
}
