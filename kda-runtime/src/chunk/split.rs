//! The exact long-sequence split (the transition form, `chunk_split.rs`), run over the
//! segment schedule the device builds (`kda_kernels::chunk_split` has the passes).
//!
//! Every sequence longer than `2 · seg` tokens is cut into segments of `seg` tokens from its
//! first token, a function of its length alone, so a sequence splits alike alone, in a dense
//! batch and varlen-packed (batch invariance). A shorter one is one segment, with the unsplit
//! call's bits (`kda_kernels::chunk_segments::segment_count` says why).
//! [`chunk_kda`](super::chunk_kda) splits every sequence longer than twice
//! [`SPLIT_SEGMENT_TOKENS`] when the call has at most [`SPLIT_MAX_VALUE_HEADS`] value heads;
//! [`ChunkTuning::split`] asks for it (or another segment length) on any call.
//!
//! The schedule, the segments' prepared operands and their three f32 state tables live in the
//! workspace: the caller's ([`chunk_split_workspace_bytes`] sizes it) or the one
//! [`crate::Kernels`] keeps for the stream.
//!
//! With prefix caching the schedule also writes each segment's absolute start (the passes'
//! `prefix_lens`) and its sequence's checkpoint row and end, and the output pass writes the
//! checkpoints (`kda_kernels::chunk_split`); the prepared operands then take 31 rows per segment
//! (its first chunk may be short), as for a varlen call with `prefix_lens`.

use kda_kernels::chunk::{ChunkConfig, Pieces, PrefixCaching, Preparation};
use kda_kernels::chunk_segments::max_segments;
use kda_kernels::chunk_split::{split_configs, SplitConfigs};

use super::args::ChunkArgs;
use super::bind::{kernel_args, set_arg};
use super::eligibility::{check_split, SPLIT_MAX_VALUE_HEADS};
use super::plan::{prepared_bytes, ChunkPlan, FinalState, InitialState};
use super::prefix::PrefixPlan;
use super::steps::{Lane, Step};
use super::tuning::{chunk_tuned_config, ChainSms, ChunkTuning};
use crate::error::RuntimeError;
use crate::launch::KernelArg;
use crate::tensor::TensorView;
use kda_dsl::DType;
use kda_kernels::chunk_prep::{prep_rows, PrepConfig};

/// Head dimension (K = V).
const D: usize = crate::validate::HEAD_DIM;

/// Alignment of each part of a split call's workspace, in bytes.
const PART_ALIGN: usize = 256;

/// The split's kernels a call of `plan`'s kind (its dtypes, flags and tensors given) can pick
/// when [`chunk_kda`](super::chunk_kda) splits it: for calls of at most
/// [`SPLIT_MAX_VALUE_HEADS`] value heads, whatever their lengths.
pub fn chunk_split_variants(plan: &ChunkPlan) -> Option<SplitConfigs> {
    (plan.value_heads <= SPLIT_MAX_VALUE_HEADS)
        .then(|| split_configs(&chunk_tuned_config(plan, ChunkTuning::of_path(plan, true))))
}

/// The segments' call: every segment a varlen sequence over the call's token rows (`[1, B · T]`),
/// its state a slot of an f32 table of `NS` slots, read and written in place.
fn segment_plan(plan: &ChunkPlan, seg: usize) -> ChunkPlan {
    let ns = max_segments(plan.nseq, plan.total_tokens, seg);
    ChunkPlan {
        nseq: ns,
        batch: 1,
        seq_len: plan.total_tokens,
        squeeze_varlen: false,
        varlen: Some(DType::I32),
        output_shape: [1, plan.total_tokens, plan.value_heads, D],
        initial: InitialState::Pool { dtype: DType::F32, indices: DType::I32, has_initial: None, pool: ns },
        final_out: FinalState::Pool,
        state_dtype: DType::F32,
        // The preparation's grid by the split segments' length (about 8 chunks per block, as
        // run 27 measured); a sequence left whole, up to twice as long, strides over up to 16
        // per block (any grid covers every chunk).
        max_seqlen: Some(seg),
        checked: false,
        // With prefix caching the segments' `prefix_lens` are their absolute starts (i32);
        // the caching each pass takes is set by its config.
        prefix: PrefixPlan {
            caching: PrefixCaching { prefix_lens: plan.prefix.active().then_some(DType::I32), ..plan.prefix.caching },
            ..plan.prefix
        },
        ..plan.clone()
    }
}

/// Where each part of a split call's workspace lies, in bytes from its start, each
/// [`PART_ALIGN`]-aligned: the segments' prepared operands, the schedule's i32 tables, then
/// the `M`, `H` and start-state tables.
struct SplitLayout {
    /// Segments `NS`.
    segments: usize,
    /// Bytes of the prepared operands (at the start).
    prep: usize,
    /// Where `seg_cu`, `seg_first`, `live`, `split`, `fresh`, `seg_prefix` and `seg_rows`
    /// (`[NS, 2]`) start.
    tables: [usize; 7],
    /// Where the state tables start, and the bytes of each.
    states: (usize, usize),
    /// Bytes of the whole workspace.
    total: usize,
}

impl SplitLayout {
    fn of(plan: &ChunkPlan, seg: usize) -> SplitLayout {
        SplitLayout::new(plan.nseq, plan.total_tokens, plan.value_heads, seg, plan.prefix.active())
    }

    /// The layout for `nseq` sequences over `tokens` packed tokens on `hv` value heads, cut
    /// every `seg` tokens (at least 1): the segments are varlen sequences over the call's
    /// token rows, their chunks `aligned` to absolute positions with prefix caching. Sizes
    /// saturate at `usize::MAX` (never panic) and grow with each argument but `seg`.
    fn new(nseq: usize, tokens: usize, hv: usize, seg: usize, aligned: bool) -> SplitLayout {
        let ns = max_segments(nseq, tokens, seg.max(1));
        let align = |x: usize| x.checked_next_multiple_of(PART_ALIGN).unwrap_or(usize::MAX);
        let (wb, tp) = prep_rows(1, tokens, ns, true, aligned);
        let prep = prepared_bytes(wb, tp, hv);
        let mut at = align(prep);
        let mut tables = [0; 7];
        for (table, entries) in tables.iter_mut().zip([ns, nseq, ns, ns, ns, ns, ns.saturating_mul(2)]) {
            *table = at;
            at = align(at.saturating_add(entries.saturating_add(1).saturating_mul(4)));
        }
        let state_bytes = align(ns.saturating_mul(hv).saturating_mul(D * D * 4));
        let total = at.saturating_add(state_bytes.saturating_mul(3));
        SplitLayout { segments: ns, prep, tables, states: (at, state_bytes), total }
    }
}

/// Bytes of the workspace a call of `plan` split every `seg` tokens ([`ChunkTuning::split`])
/// takes: the segments' prepared operands, the schedule and three f32 state tables of
/// `[N + B · T / seg, HV, 128, 128]`. An error naming `tune` for a segment length the call
/// cannot be split at ([`ChunkTuning::check`]).
pub fn chunk_split_workspace_bytes(plan: &ChunkPlan, seg: usize) -> Result<usize, RuntimeError> {
    check_split(plan, seg, "tune")?;
    Ok(split_layout_bytes(plan, seg))
}

/// Bytes of the split's workspace ([`SplitLayout`]).
pub(super) fn split_layout_bytes(plan: &ChunkPlan, seg: usize) -> usize {
    SplitLayout::of(plan, seg).total
}

/// Bytes of the split's workspace for a call of at most `nseq` sequences over `tokens` tokens
/// on `hv` value heads, cut every `seg` tokens, with or without prefix caching; grows with
/// each of the three.
pub(super) fn split_bytes_bound(nseq: usize, tokens: usize, hv: usize, seg: usize) -> usize {
    SplitLayout::new(nseq, tokens, hv, seg, true).total
}

/// The split's tables, as views into its workspace.
pub(super) struct SplitTables {
    seg_cu: TensorView,
    seg_first: TensorView,
    live: TensorView,
    split: TensorView,
    fresh: TensorView,
    seg_prefix: TensorView,
    seg_rows: TensorView,
    m: TensorView,
    h: TensorView,
    starts: TensorView,
    /// The segments' prepared operands.
    prep: TensorView,
}

impl SplitTables {
    /// The tables of a split workspace at `base` (laid out by [`SplitLayout`]).
    fn at(base: u64, plan: &ChunkPlan, layout: &SplitLayout, dev: usize) -> Result<SplitTables, RuntimeError> {
        let ns = layout.segments;
        let view = |off: usize, shape: &[usize], dtype| TensorView::describe(base + off as u64, shape, dtype, dev);
        let state = |i: usize| view(layout.states.0 + i * layout.states.1, &[ns, plan.value_heads, D, D], DType::F32);
        let t = layout.tables;
        Ok(SplitTables {
            seg_cu: view(t[0], &[ns + 1], DType::I32)?,
            seg_first: view(t[1], &[plan.nseq + 1], DType::I32)?,
            live: view(t[2], &[ns], DType::I32)?,
            split: view(t[3], &[ns], DType::I32)?,
            fresh: view(t[4], &[ns], DType::I32)?,
            seg_prefix: view(t[5], &[ns], DType::I32)?,
            seg_rows: view(t[6], &[ns, 2], DType::I32)?,
            m: state(0)?,
            h: state(1)?,
            starts: state(2)?,
            prep: view(0, &[layout.prep.div_ceil(4)], DType::F32)?,
        })
    }
}

/// The steps of a call split every `seg` tokens, in order (`chunk_split.rs` in kda-kernels),
/// its tables at `tables`: the schedule, the preparation (on the workspace path), the
/// transitions beside the states from zeros (on the thread's highest-priority stream, once the
/// call's stream has reached them), the merge (after both), the outputs and the finish.
/// `out_ptr` is the output, `fin` the final states (the caller's or the allocated ones) when
/// the call writes them.
pub(super) fn steps_over(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    seg: usize,
    out_ptr: u64,
    tables: &SplitTables,
    fin: Option<TensorView>,
) -> Result<Vec<Step>, RuntimeError> {
    check_split(plan, seg, "tune")?;
    let dev = args.q.device();
    let (tokens, hv) = (plan.total_tokens, plan.value_heads);
    let rows = |x: &TensorView, tail: &[usize]| {
        let shape: Vec<usize> = [&[1, tokens][..], tail].concat();
        TensorView::describe(x.ptr(), &shape, x.dtype(), dev)
    };
    let q = rows(args.q, &[plan.heads, D])?;
    let k = rows(args.k, &[plan.heads, D])?;
    let v = rows(args.v, &[hv, D])?;
    let g = rows(args.g, &[hv, D])?;
    let beta = rows(args.beta, &[hv])?;
    let out = TensorView::describe(out_ptr, &[1, tokens, hv, D], plan.dtype, dev)?;
    let call = chunk_tuned_config(plan, ChunkTuning { split: None, ranges: None, ..tune });
    let c = split_configs(&call);
    let seg_plan = segment_plan(plan, seg);
    let ns = seg_plan.nseq;
    // A chunk pass over the segments: the call's inputs as `[1, B · T]` rows, `table` its
    // states, `indices` the segments it runs.
    let pass = |cfg: &ChunkConfig, table: &TensorView, indices: &TensorView, has_initial: Option<&TensorView>| {
        let mut a = args.on_inputs(&q, &k, &v, &g, &beta);
        a.output = Some(&out);
        a.cu_seqlens = Some(&tables.seg_cu);
        a.initial_state = Some(table);
        a.state_indices = Some(indices);
        a.has_initial_state = has_initial;
        a.workspace = (cfg.preparation == Preparation::Workspace).then_some(&tables.prep);
        // Prefix caching: the segments' absolute starts as their prefixes, and the call's
        // checkpoints (into its checkpoint pool, the state pool unless it gave one).
        if plan.prefix.active() {
            a.prefix_lens = Some(&tables.seg_prefix);
            a.checkpoint_slots = args.checkpoint_slots;
            a.checkpoint_pool = args.checkpoint_pool.or(args.initial_state);
        }
        let initial = InitialState::Pool {
            dtype: DType::F32,
            indices: DType::I32,
            has_initial: has_initial.map(|_| DType::I32),
            pool: ns,
        };
        let p = ChunkPlan { initial, ..seg_plan.clone() };
        let mut bound = kernel_args(&a, &p, cfg, out.ptr(), None)?;
        if matches!(cfg.prefix.pieces, Pieces::Segments { .. }) {
            set_arg(&mut bound, "segment_rows", KernelArg::Tensor(tables.seg_rows));
        }
        Ok::<_, RuntimeError>((p, bound))
    };
    use KernelArg::{Tensor as T, I32};
    let dim = |name: &str, n: usize| {
        i32::try_from(n).map_err(|_| RuntimeError::bad_argument(name, "fewer than 2^31", n.to_string()))
    };
    let empty = |shape: &[usize], dtype| TensorView::describe(0, shape, dtype, dev);
    let state_shape = [0, hv, D, D];
    // The call's own state tensors, or empty placeholders the kernels never read.
    let (pool, pool_slots) = match (plan.initial, args.initial_state) {
        (InitialState::Pool { pool, .. }, Some(s)) => (Some(*s), pool),
        _ => (None, 0),
    };
    let initial = match (plan.initial, args.initial_state) {
        (InitialState::Zeros, _) | (_, None) => empty(&state_shape, plan.state_dtype)?,
        (_, Some(s)) => *s,
    };
    let index = |t: Option<&TensorView>| t.copied().map_or_else(|| empty(&[0], DType::I32), Ok);
    let (state_indices, has_initial) = match plan.initial {
        InitialState::Pool { .. } => (index(args.state_indices)?, index(args.has_initial_state)?),
        _ => (empty(&[0], DType::I32)?, empty(&[0], DType::I32)?),
    };
    let read_indices = match (plan.initial, args.read_indices) {
        (InitialState::Pool { .. }, Some(t)) => *t,
        _ => state_indices,
    };
    let cu = match plan.varlen {
        Some(_) => index(args.cu_seqlens)?,
        None => empty(&[0], DType::I32)?,
    };
    let prefix_lens = match plan.prefix.caching.prefix_lens {
        Some(_) => index(args.prefix_lens)?,
        None => empty(&[0], DType::I32)?,
    };
    let segments = vec![
        ("cu_seqlens", T(cu)),
        ("state_indices", T(state_indices)),
        ("seg_cu", T(tables.seg_cu)),
        ("seg_first", T(tables.seg_first)),
        ("live", T(tables.live)),
        ("split", T(tables.split)),
        ("fresh", T(tables.fresh)),
        ("prefix_lens", T(prefix_lens)),
        ("seg_prefix", T(tables.seg_prefix)),
        ("seg_rows", T(tables.seg_rows)),
        ("NSEQ", I32(dim("cu_seqlens", plan.nseq)?)),
        ("T", I32(dim("q", plan.seq_len)?)),
        ("P", I32(dim("initial_state", pool_slots)?)),
        ("SEG", I32(dim("tune", seg)?)),
    ];
    let merge = vec![
        ("state", T(initial)),
        ("state_indices", T(state_indices)),
        ("read_indices", T(read_indices)),
        ("has_initial", T(has_initial)),
        ("seg_first", T(tables.seg_first)),
        ("h", T(tables.h)),
        ("m", T(tables.m)),
        ("starts", T(tables.starts)),
        ("NSEQ", I32(dim("cu_seqlens", plan.nseq)?)),
    ];
    let transition = pass(&c.transition, &tables.m, &tables.split, None)?;
    let from_zeros = pass(&c.from_zeros, &tables.h, &tables.split, Some(&tables.fresh))?;
    let output = pass(&c.output, &tables.starts, &tables.live, None)?;
    let mut steps = vec![Step::Segments(c.segments.clone(), segments)];
    if c.output.preparation == Preparation::Workspace {
        let blocks = tune.prep_blocks.unwrap_or_else(|| super::prepared::prep_blocks(&output.0));
        steps.push(Step::Prepare { cfg: PrepConfig::of(&c.output), args: output.1, blocks });
    }
    let chain = |lane, cfg: &ChunkConfig, args| Step::Chain {
        lane,
        cfg: cfg.clone(),
        target: tune.target,
        args,
        sms: ChainSms::Shared,
    };
    // The transitions do not depend on the states from zeros: they run beside them, and the
    // merge waits for both.
    steps.extend([
        Step::Join(Lane::Beside),
        chain(Lane::Beside, &c.transition, transition.1),
        chain(Lane::Call, &c.from_zeros, from_zeros.1),
        Step::Join(Lane::Call),
        Step::Merge(c.merge.clone(), merge),
        chain(Lane::Call, &c.output, output.1),
    ]);
    if let Some(f) = c.finish {
        let final_state = match (pool, fin) {
            (Some(_), _) => empty(&state_shape, plan.state_dtype)?,
            (None, Some(t)) => t,
            (None, None) => return Err(RuntimeError::Unsupported("the split's final states are missing".into())),
        };
        steps.push(Step::Finish(
            f,
            vec![
                ("state", T(pool.unwrap_or(empty(&state_shape, plan.state_dtype)?))),
                ("final_state", T(final_state)),
                ("state_indices", T(state_indices)),
                ("seg_first", T(tables.seg_first)),
                ("ends", T(tables.starts)),
                ("NSEQ", I32(dim("cu_seqlens", plan.nseq)?)),
            ],
        ));
    }
    Ok(steps)
}

/// A call's steps split every `seg` tokens, its tables in the call's workspace (the caller's,
/// checked against [`chunk_split_workspace_bytes`], or the one kept for the stream):
/// [`steps_over`] them.
pub(super) fn split_steps(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    seg: usize,
    out_ptr: u64,
    final_view: Option<TensorView>,
) -> Result<Vec<Step>, RuntimeError> {
    // `steps_over` checks `seg` (as the call's entry did); the layout takes any.
    let layout = SplitLayout::of(plan, seg);
    let ws = args.workspace.ok_or_else(|| RuntimeError::Unsupported("a split call without a workspace".into()))?;
    let tables = SplitTables::at(ws.ptr(), plan, &layout, ws.device())?;
    let fin = final_view.filter(|_| !matches!(plan.final_out, FinalState::None));
    steps_over(args, plan, tune, seg, out_ptr, &tables, fin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::eligibility::{GRID_YZ, SPLIT_SEGMENT_TOKENS};
    use crate::chunk::plan::plan_chunk;
    use crate::chunk::testing::tv;
    use crate::device::DeviceLimits;
    use kda_dsl::Target;

    /// Every launch step of a split binds to its compiled kernel, dense and varlen, with and without
    /// initial and final states, with the pool (and prefix caching), for f32 and bf16 states,
    /// fused and over a prepared workspace; segment lengths that are not multiples of 16 are
    /// refused.
    #[test]
    fn split_steps_bind_to_their_kernels() {
        let (h, hv, seg) = (1, 2, 32);
        for (varlen, pool, state_dtype, with_initial, with_final, prepared, caching) in [
            (false, false, DType::F32, true, true, true, false),
            (false, false, DType::BF16, true, false, false, false),
            (true, false, DType::F32, false, true, true, false),
            (true, true, DType::F32, true, false, true, false),
            (false, true, DType::BF16, true, false, false, false),
            (true, true, DType::F32, true, false, true, true),
            (false, true, DType::BF16, true, false, false, true),
        ] {
            let (n, t) = (3, 70);
            let lead = if varlen { vec![1, n * t] } else { vec![n, t] };
            let mk = |id, tail: &[usize], d| tv(id, &[lead.as_slice(), tail].concat(), d);
            let (q, k) = (mk(1, &[h, D], DType::BF16), mk(2, &[h, D], DType::BF16));
            let (v, g) = (mk(3, &[hv, D], DType::BF16), mk(4, &[hv, D], DType::BF16));
            let beta = mk(5, &[hv], DType::BF16);
            let out = mk(6, &[hv, D], DType::BF16);
            let (a_log, dt_bias) = (tv(7, &[hv], DType::F32), tv(8, &[hv, D], DType::F32));
            let cu = tv(9, &[n + 1], DType::I64);
            let init = tv(12, &[if pool { 5 } else { n }, hv, D, D], state_dtype);
            let fin = tv(13, &[n, hv, D, D], state_dtype);
            let slots = tv(14, &[n], DType::I64);
            let has = tv(15, &[n], DType::I32);
            let ws = tv(16, &[1 << 24], DType::F32);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.a_log = Some(&a_log);
            args.dt_bias = Some(&dt_bias);
            args.output = Some(&out);
            args.cu_seqlens = varlen.then_some(&cu);
            args.initial_state = with_initial.then_some(&init);
            args.state_indices = pool.then_some(&slots);
            args.has_initial_state = pool.then_some(&has);
            args.output_final_state = with_final;
            args.final_state = with_final.then_some(&fin);
            args.workspace = Some(&ws);
            // Prefix caching: checkpoints every 32 tokens into a pool of their own.
            let (lens, table, ckpool) =
                (tv(17, &[n], DType::I64), tv(18, &[n, 4], DType::I32), tv(19, &[9, hv, D, D], state_dtype));
            if caching {
                args.prefix_lens = Some(&lens);
                (args.checkpoint_every, args.checkpoint_slots, args.checkpoint_pool) =
                    (Some(32), Some(&table), Some(&ckpool));
            }
            let plan = plan_chunk(&args).expect("a valid call");
            assert_eq!(plan.prefix.active(), caching);
            let tune = ChunkTuning { split: Some(seg), ..ChunkTuning::of_path(&plan, prepared) };
            let layout = SplitLayout::of(&plan, seg);
            let tables = SplitTables::at(ws.ptr(), &plan, &layout, 0).expect("tables");
            let steps =
                steps_over(&args, &plan, tune, seg, out.ptr(), &tables, with_final.then_some(fin)).expect("launches");
            let finishes = steps.iter().filter(|s| matches!(s, Step::Finish(..))).count();
            assert_eq!(finishes, usize::from(with_final || pool), "a finish exactly when states are written");
            crate::chunk::steps::assert_steps_bind(&steps);
            if caching {
                // Every chain pass takes the segments' starts as prefixes; the output pass (the
                // last chain) writes the call's checkpoints through the segments' rows.
                let tensor = |args: &[(&str, KernelArg)], name: &str| {
                    args.iter().find_map(|(n, a)| match a {
                        KernelArg::Tensor(t) if *n == name => Some(t.ptr()),
                        _ => None,
                    })
                };
                let chains: Vec<_> = steps
                    .iter()
                    .filter_map(|s| match s {
                        Step::Chain { args, .. } => Some(args),
                        _ => None,
                    })
                    .collect();
                assert!(chains.iter().all(|a| tensor(&a[..], "prefix_lens") == Some(tables.seg_prefix.ptr())));
                let output = chains.last().expect("the output pass");
                assert_eq!(tensor(&output[..], "segment_rows"), Some(tables.seg_rows.ptr()));
                assert_eq!(tensor(&output[..], "checkpoints"), Some(ckpool.ptr()));
                assert_eq!(tensor(&output[..], "checkpoint_slots"), Some(table.ptr()));
            }
            if !prepared {
                // The fused passes compiled for sm_90a: every chain on it, the rest on sm_80.
                let hopper = ChunkTuning { split: Some(seg), ..ChunkTuning::hopper(&plan) };
                hopper.check(&plan).expect("the split on sm_90a");
                let steps = steps_over(&args, &plan, hopper, seg, out.ptr(), &tables, with_final.then_some(fin))
                    .expect("launches");
                crate::chunk::steps::assert_steps_bind(&steps);
                let chains = steps.iter().filter_map(|s| match s {
                    Step::Chain { target, .. } => Some(*target),
                    _ => None,
                });
                assert!(chains.collect::<Vec<_>>() == [Target::Sm90a; 3], "the three passes on sm_90a");
            }
            let e = steps_over(&args, &plan, tune, 40, out.ptr(), &tables, None).expect_err("refused");
            assert!(e.to_string().contains("multiple of 16"), "{e}");
        }
    }

    /// `chunk_kda` splits at most 16 value heads and more than 8192 tokens (per sequence
    /// dense, in all or by the `max_seqlen` hint varlen), whether a workspace is given or not;
    /// `chunk_workspace_bytes` is the split's workspace exactly when it splits.
    #[test]
    fn the_default_split_goes_by_heads_and_length() {
        let ws = tv(20, &[1 << 28], DType::F32);
        let plan_of = |lead: &[usize], hv: usize, varlen: Option<Option<usize>>, with_ws: bool| {
            let mk = |id, tail: &[usize]| tv(id, &[lead, tail].concat(), DType::BF16);
            let (q, k, v, g, beta) = (mk(1, &[1, D]), mk(2, &[1, D]), mk(3, &[hv, D]), mk(4, &[hv, D]), mk(5, &[hv]));
            let cu = tv(6, &[3], DType::I32);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.cu_seqlens = varlen.map(|_| &cu);
            args.max_seqlen = varlen.flatten();
            args.workspace = with_ws.then_some(&ws);
            plan_chunk(&args).expect("a valid call")
        };
        let t = SPLIT_SEGMENT_TOKENS;
        let (dense, varlen, hint) = (None, Some(None), |h| Some(Some(h)));
        for (lead, hv, varlen, splits) in [
            (vec![1, 8 * t], 8, dense, true),
            (vec![2, 2 * t + 16], SPLIT_MAX_VALUE_HEADS, dense, true),
            (vec![2, 2 * t], SPLIT_MAX_VALUE_HEADS, dense, false),
            (vec![1, 8 * t], 32, dense, false),
            (vec![4, t], 8, dense, false),
            (vec![1, 4 * t], 8, varlen, true),
            (vec![1, 2 * t], 8, varlen, false),
            (vec![1, 4 * t], 8, hint(2 * t), false),
            (vec![1, 4 * t], 8, hint(2 * t + 1), true),
        ] {
            let plan = plan_of(&lead, hv, varlen, true);
            assert_eq!(plan, plan_of(&lead, hv, varlen, false), "{lead:?}: the plan ignores the workspace");
            let got = ChunkTuning::for_call(&plan, &DeviceLimits::H200).split;
            assert_eq!(got, splits.then_some(t), "{lead:?}, {hv} heads, varlen (hint) {varlen:?}");
            // docs/prefill.md's way out of the default split runs the call unsplit.
            let unsplit_tuning = ChunkTuning { split: None, ..ChunkTuning::for_call(&plan, &DeviceLimits::H200) };
            unsplit_tuning.check(&plan).unwrap_or_else(|e| panic!("{lead:?}: split: None refused: {e}"));
            let need = super::super::chunk_workspace_bytes(&plan, &DeviceLimits::H200);
            if splits {
                assert_eq!(need, split_layout_bytes(&plan, t), "{lead:?}: the split's workspace");
            }
        }
    }

    /// Past the grid's 65535 segments a call that splits by default is refused, naming the
    /// input that makes it so, instead of running unsplit (other bits for the same sequence);
    /// its workspace size never panics.
    #[test]
    fn a_default_split_past_the_grid_is_refused_not_left_unsplit() {
        let seg = SPLIT_SEGMENT_TOKENS;
        let plan_of = |b: usize, t: usize| {
            let mk = |id: u64, tail: &[usize]| tv(id * (1 << 40), &[&[b, t][..], tail].concat(), DType::BF16);
            let (q, k, v, g, beta) = (mk(1, &[1, D]), mk(2, &[1, D]), mk(3, &[2, D]), mk(4, &[2, D]), mk(5, &[2]));
            plan_chunk(&ChunkArgs::new(&q, &k, &v, &g, &beta)).expect("a valid call")
        };
        // Up to 4 segments per sequence of 3 · seg tokens (one per sequence, one per seg tokens):
        // 16383 sequences fit, 16384 do not.
        let fits = plan_of(16383, 3 * seg);
        let past = plan_of(16384, 3 * seg);
        for plan in [&fits, &past] {
            assert_eq!(ChunkTuning::for_call(plan, &DeviceLimits::H200).split, Some(seg), "the rule is the length");
        }
        assert!(max_segments(fits.nseq, fits.total_tokens, seg) <= GRID_YZ);
        check_split(&fits, seg, "q").expect("within the grid");
        let e = check_split(&past, seg, "q").expect_err("past the grid").to_string();
        assert!(e.contains("q") && e.contains("65535 segments") && e.contains("max_seqlen"), "{e}");
        // Sizes never panic, whatever the segment length.
        for s in [0, 1, 16, seg] {
            let _ = chunk_split_workspace_bytes(&plan_of(1, i32::MAX as usize - 15), s);
            let _ = split_layout_bytes(&plan_of(1, i32::MAX as usize - 15), s.max(1));
        }
        assert!(chunk_split_workspace_bytes(&fits, 0).is_err());
    }

    /// The workspace of a split: the prepared operands first, then the schedule's tables and
    /// the three state tables, each part aligned and apart; a smaller workspace is refused by
    /// name.
    #[test]
    fn a_split_workspace_holds_its_parts_in_order() {
        let (b, t, hv, seg) = (2, 100, 2, 32);
        let bf16 = |id, heads| tv(id, &[b, t, heads, D], DType::BF16);
        let (q, k, v, g) = (bf16(1, 1), bf16(2, 1), bf16(3, hv), bf16(4, hv));
        let beta = tv(5, &[b, t, hv], DType::BF16);
        let args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        let plan = plan_chunk(&args).expect("a valid call");
        let l = SplitLayout::of(&plan, seg);
        let ns = max_segments(b, b * t, seg);
        assert_eq!(l.segments, ns);
        assert!(l.tables[0] >= l.prep && l.tables.iter().all(|t| t.is_multiple_of(PART_ALIGN)));
        assert!(l.states.0 >= l.tables[6] + 8 * ns && l.states.0.is_multiple_of(PART_ALIGN));
        assert!(l.states.1 >= ns * hv * D * D * 4 && l.states.1.is_multiple_of(PART_ALIGN));
        assert_eq!(l.total, l.states.0 + 3 * l.states.1);
        let tables = SplitTables::at(0, &plan, &l, 0).expect("tables");
        let mut parts: Vec<(u64, usize)> = [
            &tables.prep,
            &tables.seg_cu,
            &tables.seg_first,
            &tables.live,
            &tables.split,
            &tables.fresh,
            &tables.seg_prefix,
            &tables.seg_rows,
            &tables.m,
            &tables.h,
            &tables.starts,
        ]
        .iter()
        .map(|t| (t.ptr(), t.size_bytes()))
        .collect();
        parts.sort();
        for w in parts.windows(2) {
            assert!(w[0].0 + w[0].1 as u64 <= w[1].0, "parts overlap: {w:?}");
        }
        let last = parts.last().expect("parts");
        assert!(last.0 as usize + last.1 <= l.total, "a part past the end");
        let need = chunk_split_workspace_bytes(&plan, seg).expect("a valid split");
        assert_eq!(need, l.total);
        let tune = ChunkTuning { split: Some(seg), ..ChunkTuning::of_path(&plan, true) };
        assert_eq!(crate::chunk::chunk_tuned_workspace_bytes(&plan, &tune), need);
        let short = tv(7, &[need / 4 - 1], DType::F32);
        let e = super::super::workspace::check_workspace(&short, need).expect_err("too small").to_string();
        assert!(e.contains("workspace") && e.contains(&format!("at least {need} bytes")), "{e}");
        super::super::workspace::check_workspace(&tv(7, &[need / 4], DType::F32), need).expect("large enough");
    }
}
