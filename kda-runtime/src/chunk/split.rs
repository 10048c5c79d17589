//! The exact long-sequence split of a dense call (opt-in: [`ChunkTuning::split`]).
//!
//! With `T` a multiple of `16 · nseg`, the tensors `[B, T, ..]` are exactly the dense batch
//! `[B · nseg, T / nseg, ..]` of the sequences' segments, so every pass is the chunk kernel on
//! that batch (CHUNK-ALGORITHM.md, the transition form):
//! 1. from zeros, each segment's final state `H` (no output rows: pass 4 writes them);
//! 2. in transition mode (from the identity, `v = 0`), each segment's `K x K` transition `M`;
//! 3. the merge chains `S_{s+1} = S_s M_s + H_s` from each sequence's initial state, writing
//!    every segment's start and the final states;
//! 4. from its start state, every segment's output rows.
//!
//! With a workspace ([`ChunkTuning::prepared`]) the segments' operands are prepared once
//! first, and the three chunk passes read them. Passes 1 and 2 are independent: the second
//! runs on the thread's highest-priority stream beside the first.
//!
//! The segments' states live in the caller's workspace when one is given
//! ([`chunk_split_workspace_bytes`] sizes it), after the prepared operands; without one they
//! are allocated for the call and freed after it.
//!
//! The split depends on `T` alone, so a sequence's result does not depend on the rest of the
//! batch.

use kda_kernels::chunk::{ChunkConfig, ChunkRun, Preparation};
use kda_kernels::chunk_merge::MergeConfig;

use super::args::ChunkArgs;
use super::launch::{kernel_args, launch_ready, tuned_config, ChunkKernelArgs, ChunkTuning};
use super::plan::{chunk_workspace_bytes, plan_chunk, ChunkPlan, FinalState, InitialState};
use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};
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

/// Alignment of each part of a split call's workspace, in bytes.
const PART_ALIGN: usize = 256;

/// Where each part of a split call's workspace lies, in bytes from its start: the prepared
/// operands (any workspace holds [`chunk_workspace_bytes`]; only [`ChunkTuning::prepared`]
/// uses them), then `H`, `M` and the start states, then scratch final states when the call
/// returns none; every part [`PART_ALIGN`]-aligned.
struct SplitLayout {
    /// Bytes of each of `H`, `M` and the start states.
    states: usize,
    /// Where `H` starts (the prepared operands come first).
    h: usize,
    /// Where the scratch final states start, and their bytes (0 when the call returns its own).
    scratch: (usize, usize),
    /// Bytes of the whole workspace.
    total: usize,
}

impl SplitLayout {
    fn of(plan: &ChunkPlan, nseg: usize) -> SplitLayout {
        let prep = chunk_workspace_bytes(plan).next_multiple_of(PART_ALIGN);
        let states = workspace_shape(plan, nseg).iter().product::<usize>() * 4;
        let scratch_bytes = match plan.final_out {
            FinalState::None => plan.nseq * plan.value_heads * D * D * plan.state_dtype.size_bytes(),
            _ => 0,
        };
        let scratch = prep + 3 * states.next_multiple_of(PART_ALIGN);
        SplitLayout { states, h: prep, scratch: (scratch, scratch_bytes), total: scratch + scratch_bytes }
    }

    /// Where state tensor `i` (0 `H`, 1 `M`, 2 the starts) begins.
    fn state(&self, i: usize) -> usize {
        self.h + i * self.states.next_multiple_of(PART_ALIGN)
    }
}

/// Bytes of the workspace a call of `plan` split into `nseg` segments
/// ([`ChunkTuning::split`]) takes from the caller: [`super::chunk_workspace_bytes`] (the
/// prepared operands), then three f32 states of `[B · nseg, HV, 128, 128]`, then scratch final
/// states when the call returns none.
pub fn chunk_split_workspace_bytes(plan: &ChunkPlan, nseg: usize) -> usize {
    SplitLayout::of(plan, nseg).total
}

/// A workspace given to a split call holds [`chunk_split_workspace_bytes`]; the error names
/// `workspace` otherwise.
pub(super) fn check_split_workspace(args: &ChunkArgs, plan: &ChunkPlan, nseg: usize) -> Result<(), RuntimeError> {
    let need = chunk_split_workspace_bytes(plan, nseg);
    match args.workspace {
        Some(w) if w.size_bytes() < need => Err(RuntimeError::bad_argument(
            "workspace",
            format!("at least chunk_split_workspace_bytes = {need} bytes for a split into {nseg} segments"),
            format!("{} bytes", w.size_bytes()),
        )),
        _ => Ok(()),
    }
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

/// The launches of a split call, in order: the preparation (with a workspace), the
/// transitions, the states from zeros, the merge and the outputs. `out_ptr` is the output, `fin` the final
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
    let pass = |initial: Option<&TensorView>, final_state: Option<&TensorView>, run: ChunkRun| {
        let mut a = args.on_inputs(&q, &k, &v, &g, &beta);
        a.output = Some(&out);
        // The segments' workspace rows are the call's, in the same order (whole chunks).
        a.workspace = args.workspace.filter(|_| tune.prepared);
        a.initial_state = initial;
        a.output_final_state = final_state.is_some();
        a.final_state = final_state;
        // The caller's call was planned and this is its reshape: a failure is a bug here.
        let p = plan_chunk(&a).map_err(|e| RuntimeError::Unsupported(format!("the split's segment call: {e}")))?;
        let cfg = ChunkConfig { run, ..tuned_config(&p, tune) };
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
    let first = pass(None, Some(&ws.h), ChunkRun::StatesOnly)?;
    // With a workspace, the segments' operands are prepared once for all three passes.
    let prepare = (first.1.preparation == Preparation::Workspace)
        .then(|| SplitLaunch::Prepare(first.0.clone(), first.1.clone(), first.2));
    // The transitions come before the states from zeros: the launcher runs them on a stream
    // of their own that waits only for what was issued before them (the preparation).
    Ok(prepare
        .into_iter()
        .chain([
            chunk(pass(None, Some(&ws.m), ChunkRun::Transition)?),
            chunk(first),
            SplitLaunch::Merge(merge_cfg, merge),
            chunk(pass(Some(&ws.starts), None, ChunkRun::Output)?),
        ])
        .collect())
}

/// Runs a split call on `stream`: the segments' states in the caller's workspace (refused,
/// naming `workspace`, when it is smaller than [`chunk_split_workspace_bytes`]) or, without
/// one, allocated for the call and freed after it (which waits for its kernels); then the
/// launches, the transitions beside the segments from zeros.
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
    let layout = SplitLayout::of(plan, nseg);
    let shape = workspace_shape(plan, nseg);
    let fin_shape = [plan.nseq, plan.value_heads, D, D];
    let returns_final = !matches!(plan.final_out, FinalState::None);
    check_split_workspace(args, plan, nseg)?;
    let mut owned = vec![];
    let (ws, scratch) = match args.workspace {
        Some(w) => {
            let dev = w.device();
            let at = |off: usize, shape: &[usize], dtype| TensorView::describe(w.ptr() + off as u64, shape, dtype, dev);
            let ws = SplitWorkspace {
                h: at(layout.state(0), &shape, DType::F32)?,
                m: at(layout.state(1), &shape, DType::F32)?,
                starts: at(layout.state(2), &shape, DType::F32)?,
            };
            let scratch = (!returns_final).then(|| at(layout.scratch.0, &fin_shape, plan.state_dtype)).transpose()?;
            (ws, scratch)
        }
        None => {
            let mut alloc = |shape: &[usize], dtype| -> Result<TensorView, RuntimeError> {
                let t = DeviceTensor::zeros(gpu, stream, shape, dtype)?;
                let v = t.view();
                owned.push(t);
                Ok(v)
            };
            let ws = SplitWorkspace {
                h: alloc(&shape, DType::F32)?,
                m: alloc(&shape, DType::F32)?,
                starts: alloc(&shape, DType::F32)?,
            };
            let scratch = if returns_final { None } else { Some(alloc(&fin_shape, plan.state_dtype)?) };
            (ws, scratch)
        }
    };
    // The merge writes final states; scratch ones when the call returns none.
    let fin = match (scratch, final_view.filter(|_| returns_final)) {
        (Some(t), _) => t,
        (None, Some(v)) => v,
        (None, None) => unreachable!("final states or scratch above"),
    };
    let mut transitions_beside = None;
    for step in split_launches(args, plan, tune, nseg, out_ptr, &ws, fin)? {
        match step {
            SplitLaunch::Prepare(p, cfg, bound) => {
                super::prepared::launch_preparation(gpu, kernels, stream, &p, &cfg, &bound, tune.prep_blocks)?
            }
            // The transitions do not depend on the segments from zeros: they run on the
            // thread's highest-priority stream beside them, and the merge waits for both.
            SplitLaunch::Chunk(cfg, bound) if cfg.run == ChunkRun::Transition => {
                let beside = gpu.high_priority_stream()?;
                beside.join(stream).op("cuStreamWaitEvent")?;
                launch_ready(gpu, kernels, &beside, &*kernels.chunk(&cfg)?, &bound)?;
                transitions_beside = Some(beside);
            }
            SplitLaunch::Chunk(cfg, bound) => launch_ready(gpu, kernels, stream, &*kernels.chunk(&cfg)?, &bound)?,
            SplitLaunch::Merge(cfg, bound) => {
                if let Some(beside) = transitions_beside.take() {
                    stream.join(&beside).op("cuStreamWaitEvent")?;
                }
                launch_ready(gpu, kernels, stream, &*kernels.chunk_merge(&cfg)?, &bound)?
            }
        }
    }
    // Allocated states are freed here with cuMemFree, which waits for the work queued on
    // them (so such a call returns once its kernels have run).
    drop(owned);
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
            let steps = split_launches(&args, &plan, tune, nseg, out.ptr(), &ws, fin).expect("launches");
            // The transitions come first, so their stream waits for nothing the states from
            // zeros issue.
            let runs: Vec<Option<ChunkRun>> = steps
                .iter()
                .map(|s| match s {
                    SplitLaunch::Chunk(cfg, _) => Some(cfg.run),
                    _ => None,
                })
                .collect();
            assert_eq!(runs, [Some(ChunkRun::Transition), Some(ChunkRun::StatesOnly), None, Some(ChunkRun::Output)]);
            for step in steps {
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

    /// The workspace of a split: the prepared operands' room first, then `H`, `M` and the starts,
    /// then scratch final states only for a call that returns none, each part aligned and
    /// apart; a smaller workspace is refused by name.
    #[test]
    fn a_split_workspace_holds_its_parts_in_order() {
        let (b, t, hv, nseg) = (2, 64, 2, 4);
        let bf16 = |id, heads| tv(id, &[b, t, heads, D], DType::BF16);
        let (q, k, v, g) = (bf16(1, 1), bf16(2, 1), bf16(3, hv), bf16(4, hv));
        let beta = tv(5, &[b, t, hv], DType::BF16);
        let fin = tv(6, &[b, hv, D, D], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        let bare = plan_chunk(&args).expect("a valid call");
        args.output_final_state = true;
        args.final_state = Some(&fin);
        let with_final = plan_chunk(&args).expect("a valid call");
        let states = b * nseg * hv * D * D * 4;
        for plan in [&bare, &with_final] {
            let l = SplitLayout::of(plan, nseg);
            let prep = chunk_workspace_bytes(plan);
            assert!(l.h >= prep && l.h.is_multiple_of(256) && l.h < prep + 256, "H after the operands");
            for i in 0..3 {
                assert_eq!(l.states, states);
                assert!(l.state(i).is_multiple_of(256));
                assert!(i == 0 || l.state(i) >= l.state(i - 1) + states, "state {i} after the one before");
            }
            assert!(l.scratch.0 >= l.state(2) + states);
            let esz = plan.state_dtype.size_bytes();
            let scratch = if plan.final_out == FinalState::None { b * hv * D * D * esz } else { 0 };
            assert_eq!((l.scratch.1, l.total), (scratch, l.scratch.0 + scratch));
            assert_eq!(chunk_split_workspace_bytes(plan, nseg), l.total);
        }
        let need = chunk_split_workspace_bytes(&with_final, nseg);
        let short = tv(7, &[need / 4 - 1], DType::F32);
        args.workspace = Some(&short);
        let e = check_split_workspace(&args, &with_final, nseg).expect_err("too small").to_string();
        assert!(e.contains("workspace") && e.contains("chunk_split_workspace_bytes"), "{e}");
        let enough = tv(7, &[need / 4], DType::F32);
        args.workspace = Some(&enough);
        check_split_workspace(&args, &with_final, nseg).expect("large enough");
    }
}
