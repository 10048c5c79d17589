//! A planned call's tensors as the chunk kernel's arguments ([`kernel_args`]), for every
//! variant a path runs: views of the inputs in the kernel's form, the workspace's parts, and
//! empty placeholders for what a variant never reads; and the preparation's share of them
//! ([`preparation_args`]).

use kda_dsl::artifact::CompiledKernel;
use kda_dsl::DType;
use kda_kernels::chunk::{ChunkConfig, ChunkWindow, Preparation, PREP_COLS, PREP_DECAY_COLS};
use kda_kernels::chunk_prep::prep_rows;

use super::args::ChunkArgs;
use super::plan::{chunk_workspace_bytes_unsplit, workspace_prep_bytes, ChunkPlan, FinalState, InitialState};
use crate::error::RuntimeError;
use crate::launch::KernelArg;
use crate::tensor::TensorView;

/// Head dimension (K = V).
const D: usize = crate::validate::HEAD_DIM;

/// The chunk kernel's arguments by name (an array: building them allocates nothing).
pub(crate) type ChunkKernelArgs = [(&'static str, KernelArg); 26];

/// Rebinds argument `name` of `bound` (a split's pass binds its segment tables so, a token
/// range its window).
pub(crate) fn set_arg(bound: &mut ChunkKernelArgs, name: &str, arg: KernelArg) {
    if let Some(entry) = bound.iter_mut().find(|(n, _)| *n == name) {
        entry.1 = arg;
    }
}

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
    let lower_bound = plan.gate.lower_bound();
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
    // The slots sequences start from: state_indices itself unless the caller gave others.
    let read = match (pool, args.read_indices) {
        (true, Some(t)) => *t,
        _ => indices,
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
            let (wb, tp) = prep_rows(plan.batch, plan.seq_len, plan.nseq, plan.varlen.is_some(), plan.prefix.aligned());
            let decay_at = base + workspace_prep_bytes(plan) as u64;
            (
                view(base, &[wb, tp, hv, PREP_COLS], cfg.operands.dtype())?,
                view(decay_at, &[wb, tp.div_ceil(16), hv, PREP_DECAY_COLS], DType::F32)?,
            )
        }
        _ => (view(0, &[0, 0, hv, 0], cfg.operands.dtype())?, view(0, &[0, 0, hv, 0], DType::F32)?),
    };
    // Prefix caching: the call's tensors where the config takes them, empty placeholders the
    // kernel never reads otherwise (`checkpoint_every` then any multiple of 16).
    let caching = cfg.prefix;
    let prefix_lens = match (caching.prefix_lens, args.prefix_lens) {
        (Some(_), Some(t)) => *t,
        _ => empty_index()?,
    };
    let (checkpoint_slots, checkpoints) = match (caching.checkpoint_slots, args.checkpoint_slots) {
        (Some(_), Some(t)) => (*t, *args.checkpoint_pool.unwrap_or(&state)),
        _ => (view(0, &[0, 0], DType::I32)?, view(0, &[0, hv, D, D], caching.checkpoint_dtype(st))?),
    };
    let every = i32::try_from(plan.prefix.every.max(16))
        .map_err(|_| RuntimeError::bad_argument("checkpoint_every", "below 2^31", plan.prefix.every.to_string()))?;
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
        ("read_indices", T(read)),
        ("has_initial", T(has_initial)),
        ("cu_seqlens", T(cu)),
        ("prep", T(prep)),
        ("prep_decay", T(prep_decay)),
        ("prefix_lens", T(prefix_lens)),
        ("checkpoint_slots", T(checkpoint_slots)),
        ("checkpoints", T(checkpoints)),
        // Bound by the split's output pass alone (`set_arg`).
        ("segment_rows", T(view(0, &[0, 2], DType::I32)?)),
        ("out", T(out)),
        ("NSEQ", I32(nseq)),
        ("scale", F32(plan.scale)),
        ("lower_bound", F32(lower_bound)),
        ("checkpoint_every", I32(every)),
        // Every chunk; a token range binds its window (`set_arg`).
        ("first_chunk", I32(ChunkWindow::ALL.first)),
        ("end_chunk", I32(ChunkWindow::ALL.end)),
    ])
}

/// The preparation kernel's arguments (in an array: building them allocates nothing).
pub(crate) struct PrepArgs {
    items: [(&'static str, KernelArg); ARGS],
    len: usize,
}

/// Room for every argument of the chain's kernel, and `NX`.
const ARGS: usize = 27;

impl PrepArgs {
    /// The arguments, by name.
    pub(crate) fn as_slice(&self) -> &[(&'static str, KernelArg)] {
        &self.items[..self.len]
    }
}

/// The arguments of the preparation `kernel`: those of `bound` (its `chunk` kernel's) it
/// declares, and its grid's `NX`, `blocks` (an error naming `tune` from 2^31 on).
pub(crate) fn preparation_args(
    kernel: &CompiledKernel,
    bound: &[(&'static str, KernelArg)],
    blocks: usize,
) -> Result<PrepArgs, RuntimeError> {
    let takes = |name: &str| kernel.params.iter().any(|p| p.name() == name);
    let mut args = PrepArgs { items: [("", KernelArg::I32(0)); ARGS], len: 0 };
    let nx = i32::try_from(blocks)
        .map_err(|_| RuntimeError::bad_argument("tune", "prep_blocks below 2^31", blocks.to_string()))?;
    for arg in bound.iter().filter(|(n, _)| takes(n)).copied().chain([("NX", KernelArg::I32(nx))]) {
        args.items[args.len] = arg;
        args.len += 1;
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::testing::tv;
    use crate::chunk::tuning::{chunk_tuned_config, ChunkTuning};
    use crate::chunk::{chunk_tuned_workspace_bytes, plan_chunk};
    use crate::device::DeviceLimits;
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
                let blocks = crate::chunk::prepared::prep_blocks(&plan);
                let prep_args = crate::chunk::bind::preparation_args(&prep, &bound, blocks).expect("arguments");
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
            let need = chunk_tuned_workspace_bytes(&plan, &tune);
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
            let need = chunk_tuned_workspace_bytes(&plan, &tune);
            let ws = TensorView::describe(7 << 44, &[need.div_ceil(4)], DType::F32, 0).expect("a view");
            args.workspace = Some(&ws);
            if let Some(seg) = tune.split {
                let e = crate::chunk::eligibility::check_split(&plan, seg, "q").expect_err("2^19 segments").to_string();
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
}
