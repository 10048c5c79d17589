//! The two-kernel path in token ranges ([`ChunkTuning::ranges`], taken by default for long
//! enough calls on devices of fast memory): the preparation of range `r + 1` runs beside the
//! chain of range `r`.
//!
//! On the two-kernel path the preparation (parallel over chunks, bound by issuing
//! instructions on every SM) and the chain (one serial chain per value head, one block per SM
//! that leaves most issue slots idle) run one after the other. Cut into ranges of whole chunks,
//! the call becomes a preparation per range on the caller's stream, in order, and a chain per
//! range on a second stream of the highest priority, each chain waiting for its range's
//! preparation (an event) and for the chain before it (stream order): the chain of range `r`
//! and the preparation of range `r + 1` are independent, so they share the SMs, the chain's
//! blocks scheduled first. Nothing waits on another kernel's progress, only on completed work,
//! so no order of execution can deadlock.
//!
//! Each range is the chunk kernel and its preparation over a window of the sequence's chunks
//! ([`ChunkWindow`]): the whole call bound as a dense `[1, T, ..]` call (a varlen call of one
//! sequence is the same call, its `cu_seqlens` being `[0, S]` by the caller's contract, so it
//! never reads them), each range running its chunks alone from the state the range before left,
//! carried in the f32 final states, or with `state_indices` in the f32 pool slots themselves
//! (each range reads and writes them in place; only the first honours `read_indices` and
//! `has_initial_state`). The windows count chunks on the device, so with `prefix_lens` a
//! range's first token moves to the sequence's absolute chunk boundary there, and the
//! checkpoints are written as the windows pass them. So the bits are those of the whole call
//! (the simulator tests `token_ranges_carrying_the_state_equal_the_whole_run_bit_for_bit`,
//! `token_ranges_through_the_pool_in_place_equal_the_whole_run_bit_for_bit` and
//! `token_ranges_with_prefix_caching_equal_the_whole_run_bit_for_bit`): the chunks are the same
//! and the state goes through memory exactly. The ranges share the call's workspace, each
//! preparing its own chunks' rows.

use kda_dsl::DType;
use kda_kernels::chunk::{ChunkConfig, ChunkWindow};
use kda_kernels::chunk_prep::PrepConfig;

use super::args::ChunkArgs;
use super::bind::{kernel_args, set_arg, ChunkKernelArgs};
use super::eligibility::check_ranges;
use super::plan::{ChunkPlan, FinalState, InitialState};
use super::steps::{Lane, Step};
use super::tuning::{chunk_tuned_config, ChunkTuning};
use crate::error::RuntimeError;
use crate::launch::KernelArg;
use crate::tensor::TensorView;

/// Head dimension (K = V).
const D: usize = crate::validate::HEAD_DIM;

/// The token ranges of a call of `t` tokens cut into `nranges`: whole chunks each, the last
/// one shorter or empty ranges dropped.
pub(super) fn token_ranges(t: usize, nranges: usize) -> Vec<(usize, usize)> {
    let per = 16 * t.div_ceil(16).div_ceil(nranges.max(1)).max(1);
    (0..t).step_by(per).map(|t0| (t0, (t0 + per).min(t))).collect()
}

/// The windows of chunks of a call of `t` tokens (below 2^31) in `nranges` ranges: those of
/// [`token_ranges`], the last running to the sequence's end (which holds one chunk more when
/// `prefix_lens` shifts its chunks).
pub(super) fn chunk_windows(t: usize, nranges: usize) -> Vec<ChunkWindow> {
    let chunk = |tokens: usize| i32::try_from(tokens / 16).unwrap_or(i32::MAX);
    token_ranges(t, nranges)
        .into_iter()
        .map(|(t0, t1)| ChunkWindow { first: chunk(t0), end: if t1 == t { i32::MAX } else { chunk(t1) } })
        .collect()
}

/// One range's chain: its plan, its config, its kernel arguments (the window's bounds among
/// them) and the tokens of its window (at most).
pub(super) struct RangeLaunch {
    /// The range's call, planned.
    pub plan: ChunkPlan,
    /// The chain's config (over a workspace).
    pub cfg: ChunkConfig,
    /// The chain's arguments, from which the preparation takes its own.
    pub bound: ChunkKernelArgs,
    /// Tokens in the range (its preparation's blocks go by them).
    pub tokens: usize,
}

/// Every range's launch, in order. `out_ptr` is the output, `fin` the final states (the
/// caller's or the allocated ones), which carry the state from one range to the next; with
/// `state_indices` there are none, and the pool slots carry it in place.
pub(super) fn range_launches(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    nranges: usize,
    out_ptr: u64,
    fin: Option<TensorView>,
) -> Result<Vec<RangeLaunch>, RuntimeError> {
    check_ranges(plan, nranges)?;
    let ws = args.workspace.ok_or_else(|| RuntimeError::Unsupported("token ranges without a workspace".into()))?;
    let dev = args.q.device();
    let (h, hv, t) = (plan.heads, plan.value_heads, plan.seq_len);
    // The call as a dense `[1, T, ..]` call.
    let whole = |x: &TensorView, tail: &[usize]| {
        let shape: Vec<usize> = [&[1, t][..], tail].concat();
        TensorView::describe(x.ptr(), &shape, x.dtype(), dev)
    };
    let (q, k, v, g) =
        (whole(args.q, &[h, D])?, whole(args.k, &[h, D])?, whole(args.v, &[hv, D])?, whole(args.g, &[hv, D])?);
    let beta = whole(args.beta, &[hv])?;
    let out = TensorView::describe(out_ptr, &[1, t, hv, D], plan.dtype, dev)?;
    let tune = ChunkTuning { prepared: true, split: None, ranges: None, ..tune };
    let mut launches = vec![];
    for (r, (window, (t0, t1))) in chunk_windows(t, nranges).into_iter().zip(token_ranges(t, nranges)).enumerate() {
        let mut a = args.on_inputs(&q, &k, &v, &g, &beta);
        a.output = Some(&out);
        a.workspace = Some(ws);
        (a.prefix_lens, a.checkpoint_every) = (args.prefix_lens, args.checkpoint_every);
        (a.checkpoint_slots, a.checkpoint_pool) = (args.checkpoint_slots, args.checkpoint_pool);
        match &fin {
            // The first range starts from the call's state, every other from the one before's.
            Some(fin) => {
                a.initial_state = match r {
                    0 => args.initial_state.filter(|_| plan.initial != InitialState::Zeros),
                    _ => Some(fin),
                };
                a.output_final_state = true;
                a.final_state = Some(fin);
            }
            // Each range writes the pool slots; the first reads the call's read slots (fresh
            // prompts start from zeros), every other the slot the one before wrote.
            None => {
                a.initial_state = args.initial_state;
                a.state_indices = args.state_indices;
                a.read_indices = args.read_indices.filter(|_| r == 0);
                a.has_initial_state = args.has_initial_state.filter(|_| r == 0);
            }
        }
        let p = range_plan(plan, r, fin.is_some());
        // The derivation is what planning the range's own arguments gives (checked in tests).
        #[cfg(test)]
        assert_eq!(p, super::plan::plan_chunk(&a).expect("a range's call"), "range {r}'s plan");
        let cfg = chunk_tuned_config(&p, tune);
        let mut bound = kernel_args(&a, &p, &cfg, out.ptr(), fin)?;
        set_arg(&mut bound, "first_chunk", KernelArg::I32(window.first));
        set_arg(&mut bound, "end_chunk", KernelArg::I32(window.end));
        launches.push(RangeLaunch { plan: p, cfg, bound, tokens: t1 - t0 });
    }
    Ok(launches)
}

/// Range `r` of a call, as the call's own dense B = 1 form: its state from the call's (the
/// first) or from the range before (carried in the f32 final states, `by_final`, or in the pool
/// slots, whose `read_indices` and `has_initial_state` only the first honours), into the final
/// states or the pool again.
fn range_plan(plan: &ChunkPlan, r: usize, by_final: bool) -> ChunkPlan {
    let (initial, final_out) = match plan.initial {
        InitialState::Pool { dtype, indices, has_initial, pool } if !by_final => {
            (InitialState::Pool { dtype, indices, has_initial: has_initial.filter(|_| r == 0), pool }, FinalState::Pool)
        }
        first if r == 0 => (first, FinalState::Given { dtype: DType::F32 }),
        _ => (InitialState::PerSequence { dtype: DType::F32 }, FinalState::Given { dtype: DType::F32 }),
    };
    let len = plan.seq_len;
    ChunkPlan {
        nseq: 1,
        batch: 1,
        total_tokens: len,
        varlen: None,
        squeeze_varlen: false,
        output_shape: [1, len, plan.value_heads, D],
        output_given: true,
        initial,
        final_out,
        max_seqlen: None,
        checked: false,
        empty: len == 0,
        ..plan.clone()
    }
}

/// A call's steps in token ranges: each range's preparation on the call's stream, its chain
/// beside it once the stream has reached that preparation (a join, which covers the work
/// before the call too) and after the chain before it (the lane's order), then the call's
/// stream waits for the last chain. `fin` is the final states (the caller's or the allocated
/// ones), which carry the state from one range to the next; the pool carries it without.
pub(super) fn range_steps(
    args: &ChunkArgs,
    plan: &ChunkPlan,
    tune: ChunkTuning,
    nranges: usize,
    out_ptr: u64,
    final_view: Option<TensorView>,
) -> Result<Vec<Step>, RuntimeError> {
    let fin = match plan.initial {
        InitialState::Pool { .. } => None,
        _ => Some(final_view.ok_or_else(|| RuntimeError::Unsupported("token ranges without final states".into()))?),
    };
    let mut steps = vec![];
    for l in range_launches(args, plan, tune, nranges, out_ptr, fin)? {
        let blocks = tune.prep_blocks.unwrap_or_else(|| super::prepared::prep_blocks_over(l.tokens, &l.plan));
        steps.extend([
            Step::Prepare { cfg: PrepConfig::of(&l.cfg), args: l.bound, blocks },
            Step::Join(Lane::Beside),
            Step::Chain { lane: Lane::Beside, cfg: l.cfg, target: tune.target, args: l.bound, sms: tune.chain_sms },
        ]);
    }
    steps.push(Step::Join(Lane::Call));
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::chunk_workspace_bytes;
    use crate::chunk::eligibility::{may_take_ranges, DEFAULT_RANGES, RANGE_MIN_BANDWIDTH, RANGE_MIN_CHUNKS};
    use crate::chunk::plan::{chunk_workspace_bytes_unsplit, plan_chunk};
    use crate::chunk::testing::{dense_bf16_inputs, tv};
    use crate::chunk::tuning::ChainSms;
    use crate::device::DeviceLimits;
    use crate::launch::bind_args;
    use kda_kernels::chunk::ChunkStates;

    /// Value heads of the tests' calls: the model's shape of the rows ranges were measured on.
    const HEADS: usize = 32;

    /// A tuning in two token ranges on top of the call's default path.
    fn in_two_ranges(plan: &ChunkPlan) -> ChunkTuning {
        ChunkTuning { ranges: Some(2), ..ChunkTuning::for_call(plan, &DeviceLimits::H200) }
    }

    /// q, k, v, g, beta and the output of a dense B = 1 call of `t` tokens.
    fn dense_inputs(t: usize, h: usize, hv: usize) -> [TensorView; 6] {
        let bf16 = |id, heads: usize| tv(id, &[1, t, heads, D], DType::BF16);
        [bf16(1, h), bf16(2, h), bf16(3, hv), bf16(4, hv), tv(5, &[1, t, hv], DType::BF16), bf16(6, hv)]
    }

    /// Range `r`'s chain arguments bind to its compiled kernel.
    fn assert_chain_binds(l: &RangeLaunch, r: usize) {
        let kernel = kda_dsl::compile(kda_kernels::chunk::chunk(&l.cfg).expect("builds"), kda_dsl::Target::Sm80)
            .expect("compiles");
        bind_args(&kernel, &l.bound).unwrap_or_else(|e| panic!("range {r}: {e}"));
    }

    /// The address bound to the tensor parameter `name`.
    fn tensor_at(bound: &ChunkKernelArgs, name: &str) -> u64 {
        match bound.iter().find(|(n, _)| *n == name) {
            Some((_, crate::launch::KernelArg::Tensor(t))) => t.ptr(),
            _ => panic!("no tensor `{name}`"),
        }
    }

    #[test]
    fn ranges_are_whole_chunks_covering_every_token() {
        assert_eq!(token_ranges(100, 3), vec![(0, 48), (48, 96), (96, 100)]);
        assert_eq!(token_ranges(32768, 8), (0..8).map(|r| (4096 * r, 4096 * (r + 1))).collect::<Vec<_>>());
        assert_eq!(token_ranges(20, 8), vec![(0, 16), (16, 20)]);
        assert_eq!(token_ranges(0, 4), vec![]);
    }

    /// The i32 bound to the scalar parameter `name`.
    fn scalar_at(bound: &ChunkKernelArgs, name: &str) -> i32 {
        match bound.iter().find(|(n, _)| *n == name) {
            Some((_, KernelArg::I32(v))) => *v,
            _ => panic!("no i32 `{name}`"),
        }
    }

    #[test]
    fn windows_are_the_ranges_chunks_the_last_open() {
        let w = |first, end| ChunkWindow { first, end };
        assert_eq!(chunk_windows(100, 3), vec![w(0, 3), w(3, 6), w(6, i32::MAX)]);
        assert_eq!(chunk_windows(20, 8), vec![w(0, 1), w(1, i32::MAX)]);
        assert_eq!(chunk_windows(0, 4), vec![]);
    }

    /// Every range's chain and preparation bind to their kernels, over the whole call and its
    /// workspace, each with its window of chunks; the first range starts from the call's
    /// initial state and every later one from the final states.
    #[test]
    fn range_launches_bind_to_their_kernels() {
        let (t, h, hv) = (100, 2, 4);
        let [q, k, v, g, beta, out] = dense_inputs(t, h, hv);
        let (a_log, dt_bias) = (tv(7, &[hv], DType::F32), tv(8, &[hv * D], DType::F32));
        let (init, fin) = (tv(9, &[1, hv, D, D], DType::F32), tv(10, &[1, hv, D, D], DType::F32));
        let ws = tv(11, &[1 << 20], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.a_log = Some(&a_log);
        args.dt_bias = Some(&dt_bias);
        args.output = Some(&out);
        args.initial_state = Some(&init);
        args.output_final_state = true;
        args.final_state = Some(&fin);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let tune = ChunkTuning::for_call(&plan, &DeviceLimits::H200);
        let launches = range_launches(&args, &plan, tune, 3, out.ptr(), Some(fin)).expect("launches");
        assert_eq!(launches.len(), 3);
        let windows = chunk_windows(t, 3);
        for (r, l) in launches.iter().enumerate() {
            assert_chain_binds(l, r);
            let prep_cfg = kda_kernels::chunk_prep::PrepConfig::of(&l.cfg);
            let prep = kda_dsl::compile(
                kda_kernels::chunk_prep::chunk_prep(&prep_cfg).expect("builds"),
                kda_dsl::Target::Sm80,
            )
            .expect("compiles");
            let blocks = crate::chunk::prepared::prep_blocks(&l.plan);
            let prep_args = crate::chunk::bind::preparation_args(&prep, &l.bound, blocks).expect("arguments");
            bind_args(&prep, prep_args.as_slice()).unwrap_or_else(|e| panic!("range {r} preparation: {e}"));
            assert_eq!(tensor_at(&l.bound, "state"), if r == 0 { init.ptr() } else { fin.ptr() }, "range {r}");
            assert_eq!(tensor_at(&l.bound, "final_state"), fin.ptr(), "range {r}");
            assert_eq!(tensor_at(&l.bound, "q"), q.ptr(), "range {r}");
            assert_eq!(tensor_at(&l.bound, "out"), out.ptr(), "range {r}");
            assert_eq!(tensor_at(&l.bound, "prep"), ws.ptr(), "range {r}: the call's workspace");
            let window = (scalar_at(&l.bound, "first_chunk"), scalar_at(&l.bound, "end_chunk"));
            assert_eq!(window, (windows[r].first, windows[r].end), "range {r}: its window");
            assert_eq!(prep_args.as_slice().iter().filter(|(n, _)| n.ends_with("_chunk")).count(), 2);
            assert_eq!(l.tokens, [48, 48, 4][r]);
        }
        assert!(
            chunk_workspace_bytes_unsplit(&launches[0].plan) <= chunk_workspace_bytes(&plan, &DeviceLimits::H200),
            "the ranges fit the call's workspace"
        );
    }

    /// With prefix caching, every range binds the call's `prefix_lens`, block table and
    /// checkpoint pool (the windows count the aligned chunks on the device), only the first its
    /// `read_indices`; every range's kernel is among those an H200 preloads.
    #[test]
    fn prefix_caching_ranges_bind_the_call_s_tables() {
        let (t, h, hv) = (16 * 1024, 2, HEADS);
        let [q, k, v, g, beta, out] = dense_inputs(t, h, hv);
        let pool = tv(64, &[3, hv, D, D], DType::F32);
        let (slots, read, lens) = (tv(10, &[1], DType::I32), tv(12, &[1], DType::I32), tv(13, &[1], DType::I64));
        let (table, ckpool) = (tv(14, &[1, 40], DType::I32), tv(128, &[9, hv, D, D], DType::F32));
        let ws = tv(11, &[1 << 28], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.output = Some(&out);
        args.initial_state = Some(&pool);
        args.state_indices = Some(&slots);
        args.read_indices = Some(&read);
        args.prefix_lens = Some(&lens);
        (args.checkpoint_every, args.checkpoint_slots, args.checkpoint_pool) = (Some(256), Some(&table), Some(&ckpool));
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let tune = in_two_ranges(&plan);
        tune.check(&plan).expect("ranges");
        let (preloaded, _) = crate::chunk::chunk_variants(&plan, &DeviceLimits::H200);
        let launches = range_launches(&args, &plan, tune, 2, out.ptr(), None).expect("launches");
        for (r, l) in launches.iter().enumerate() {
            assert_chain_binds(l, r);
            assert_eq!(tensor_at(&l.bound, "prefix_lens"), lens.ptr(), "range {r}");
            assert_eq!(tensor_at(&l.bound, "checkpoint_slots"), table.ptr(), "range {r}");
            assert_eq!(tensor_at(&l.bound, "checkpoints"), ckpool.ptr(), "range {r}");
            let reads = tensor_at(&l.bound, "read_indices");
            assert_eq!(reads, if r == 0 { read.ptr() } else { slots.ptr() }, "range {r}: its read slots");
            assert!(preloaded.contains(&l.cfg), "range {r}: {} is not preloaded", l.cfg.key());
        }
    }

    /// A call's steps in ranges: each range's preparation on the call's stream, then its chain
    /// beside it after a join, and the call's stream joins the chains at the end; every launch
    /// binds.
    #[test]
    fn range_steps_prepare_on_the_call_and_chain_beside_it() {
        let (t, h, hv) = (16 * 6 + 5, 2, HEADS);
        let [q, k, v, g, beta, out] = dense_inputs(t, h, hv);
        let fin = tv(8, &[1, hv, D, D], DType::F32);
        let ws = tv(11, &[1 << 24], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.output = Some(&out);
        args.output_final_state = true;
        args.final_state = Some(&fin);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let tune = ChunkTuning::for_call(&plan, &DeviceLimits::H200);
        let steps = range_steps(&args, &plan, tune, 3, out.ptr(), Some(fin)).expect("steps");
        let lanes: Vec<String> = steps
            .iter()
            .map(|s| match s {
                Step::Prepare { .. } => "prepare".into(),
                Step::Chain { lane, .. } => format!("chain {lane:?}"),
                Step::Join(lane) => format!("{lane:?} waits {:?}", lane.other()),
                other => format!("{other:?}"),
            })
            .collect();
        let range = ["prepare", "Beside waits Call", "chain Beside"];
        let want: Vec<&str> = range.iter().chain(&range).chain(&range).copied().chain(["Call waits Beside"]).collect();
        assert_eq!(lanes, want);
        crate::chunk::steps::assert_steps_bind(&steps);
        // Chains on SMs of their own: every chain step says so, and only they.
        let own = ChunkTuning { chain_sms: ChainSms::Own, ..tune };
        let own_steps = range_steps(&args, &plan, own, 3, out.ptr(), Some(fin)).expect("steps");
        for (s, o) in steps.iter().zip(&own_steps) {
            match (s, o) {
                (Step::Chain { sms: ChainSms::Shared, .. }, Step::Chain { sms: ChainSms::Own, .. }) => {}
                (Step::Chain { .. }, other) => panic!("{other:?}"),
                (a, b) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
            }
        }
        // Without final states (and no pool) there is nothing to carry the state: refused.
        assert!(range_steps(&args, &plan, tune, 3, out.ptr(), None).is_err());
    }

    /// With `state_indices`, every range binds to its kernel with the pool as its state, in
    /// place, and only the first reads `has_initial_state`.
    #[test]
    fn pool_ranges_bind_to_their_kernels_and_carry_the_state_in_the_pool() {
        let (t, h, hv) = (100, 2, HEADS);
        let [q, k, v, g, beta, out] = dense_inputs(t, h, hv);
        let pool = tv(64, &[3, hv, D, D], DType::F32);
        let (slots, fresh) = (tv(10, &[1], DType::I32), tv(12, &[1], DType::I32));
        let ws = tv(11, &[1 << 20], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.output = Some(&out);
        args.initial_state = Some(&pool);
        args.state_indices = Some(&slots);
        args.has_initial_state = Some(&fresh);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let launches =
            range_launches(&args, &plan, ChunkTuning::for_call(&plan, &DeviceLimits::H200), 3, out.ptr(), None)
                .expect("launches");
        assert_eq!(launches.len(), 3);
        for (r, l) in launches.iter().enumerate() {
            assert_chain_binds(l, r);
            assert_eq!(tensor_at(&l.bound, "state"), pool.ptr(), "range {r}: the pool, in place");
            assert_eq!(tensor_at(&l.bound, "state_indices"), slots.ptr(), "range {r}");
            let reads_fresh = matches!(l.cfg.states, ChunkStates::Pool { has_initial: Some(_), .. });
            assert_eq!(reads_fresh, r == 0, "range {r}: only the first reads has_initial_state");
        }
        // A bf16 pool would round the state between ranges: refused.
        let pool16 = tv(64, &[3, hv, D, D], DType::BF16);
        args.initial_state = Some(&pool16);
        let plan16 = plan_chunk(&args).expect("a valid call");
        let e = check_ranges(&plan16, 2).expect_err("a bf16 pool");
        assert!(e.to_string().contains("an f32 pool"), "{e}");
        check_ranges(&plan, 2).expect("an f32 pool");
    }

    /// On a device of fast memory (an H200) `for_call` takes ranges of at least
    /// `RANGE_MIN_CHUNKS` chunks, at most `DEFAULT_RANGES` of them, and only for calls of many
    /// heads that can take them; on an H100 or an A100 none (one range measured faster there),
    /// though such calls can take them as a tuning. `may_take_ranges` says so whatever the
    /// call's length and batch.
    #[test]
    fn long_calls_take_ranges_by_default_on_fast_memory() {
        let plan_of = |b: usize, t: usize, final_state: bool, hv: usize| {
            // 16 GiB apart: long calls' tensors must not overlap.
            let at = |id: u64, shape: &[usize], dtype| tv(16 * 1024 * id, shape, dtype);
            let (q, k) = (at(1, &[b, t, 2, D], DType::BF16), at(2, &[b, t, 2, D], DType::BF16));
            let (v, g) = (at(3, &[b, t, hv, D], DType::BF16), at(4, &[b, t, hv, D], DType::BF16));
            let beta = at(5, &[b, t, hv], DType::BF16);
            let ws = at(6, &[1 << 30], DType::F32);
            let fin = at(7, &[b, hv, D, D], DType::F32);
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.workspace = Some(&ws);
            args.output_final_state = final_state;
            args.final_state = Some(&fin).filter(|_| final_state);
            plan_chunk(&args).expect("a valid call")
        };
        let ranges_on =
            |device: &DeviceLimits, b, t, fin, hv| ChunkTuning::for_call(&plan_of(b, t, fin, hv), device).ranges;
        let ranges_of = |b, t, fin| ranges_on(&DeviceLimits::H200, b, t, fin, HEADS);
        assert_eq!(ranges_of(1, 32768, true), Some(DEFAULT_RANGES));
        assert_eq!(ranges_of(1, 16 * RANGE_MIN_CHUNKS * 3 + 15, true), Some(3.min(DEFAULT_RANGES)));
        assert_eq!(ranges_of(1, 16 * RANGE_MIN_CHUNKS * 2 - 16, true), None, "too short for two");
        assert_eq!(ranges_of(1, 16384, true), None, "16384 tokens: unmeasured on an H200");
        assert_eq!(ranges_of(1, 32768, false), None, "no final states to carry the state");
        assert_eq!(ranges_of(2, 32768, true), None, "B = 2");
        assert_eq!(ranges_on(&DeviceLimits::H200, 1, 32768, true, HEADS / 4), None, "8 value heads");
        assert!(may_take_ranges(&plan_of(2, 16, true, HEADS), &DeviceLimits::H200), "a B = 1 call of that kind can");
        assert!(!may_take_ranges(&plan_of(1, 32768, false, HEADS), &DeviceLimits::H200));
        assert!(!may_take_ranges(&plan_of(1, 32768, true, HEADS / 4), &DeviceLimits::H200));
        let just_fast = DeviceLimits { memory_bandwidth: RANGE_MIN_BANDWIDTH, ..DeviceLimits::H100 };
        assert_eq!(ranges_on(&just_fast, 1, 32768, true, HEADS), Some(DEFAULT_RANGES));
        for device in [DeviceLimits::H100, DeviceLimits::A100] {
            for (t, hv) in [(32768, HEADS), (65536, 64)] {
                let plan = plan_of(1, t, true, hv);
                let tune = ChunkTuning::for_call(&plan, &device);
                assert_eq!(tune.ranges, None, "T = {t}, HV = {hv}, {} SMs", device.sm_count);
                assert!(tune.prepared, "T = {t}, HV = {hv}: the two-kernel path");
                assert!(!may_take_ranges(&plan, &device));
                in_two_ranges(&plan).check(&plan).unwrap_or_else(|e| panic!("T = {t}, HV = {hv}: {e}"));
            }
        }
    }

    /// A varlen call of one sequence takes the token ranges a dense B = 1 call of it takes on an
    /// H200: the same launches, configs and arguments (its `cu_seqlens` bound nowhere), every
    /// variant among those `chunk_variants` preloads; with two sequences it takes none, and
    /// ranges are refused.
    #[test]
    fn a_varlen_call_of_one_sequence_runs_as_the_dense_call() {
        let (t, hv) = (16 * RANGE_MIN_CHUNKS * 2, HEADS);
        // 16 GiB apart: long calls' tensors must not overlap.
        let at = |id: u64, shape: &[usize], dtype| tv(16 * 1024 * id, shape, dtype);
        let (q, k) = (at(1, &[1, t, 2, D], DType::BF16), at(2, &[1, t, 2, D], DType::BF16));
        let (v, g) = (at(3, &[1, t, hv, D], DType::BF16), at(4, &[1, t, hv, D], DType::BF16));
        let (beta, out) = (at(5, &[1, t, hv], DType::BF16), at(6, &[1, t, hv, D], DType::BF16));
        let (ws, fin) = (at(7, &[1 << 30], DType::F32), at(8, &[1, hv, D, D], DType::F32));
        let (cu1, cu2) = (at(9, &[2], DType::I32), at(10, &[3], DType::I32));
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.output = Some(&out);
        args.workspace = Some(&ws);
        args.output_final_state = true;
        args.final_state = Some(&fin);
        let dense = plan_chunk(&args).expect("a valid dense call");
        let dense_tune = in_two_ranges(&dense);
        let want = range_launches(&args, &dense, dense_tune, 2, out.ptr(), Some(fin)).expect("dense");
        args.cu_seqlens = Some(&cu1);
        let varlen = plan_chunk(&args).expect("a valid varlen call");
        let tune = ChunkTuning::for_call(&varlen, &DeviceLimits::H200);
        assert_eq!(tune.ranges, Some(2), "one sequence of {t} tokens");
        assert_eq!(tune, dense_tune);
        assert!(may_take_ranges(&varlen, &DeviceLimits::H200));
        let got = range_launches(&args, &varlen, tune, 2, out.ptr(), Some(fin)).expect("varlen");
        // The dense call's parts fit its workspace (`range_launches_bind_to_their_kernels`).
        assert!(
            chunk_workspace_bytes(&dense, &DeviceLimits::H200) <= chunk_workspace_bytes(&varlen, &DeviceLimits::H200),
            "the parts fit"
        );
        let (chains, preps) = crate::chunk::chunk_variants(&varlen, &DeviceLimits::H200);
        assert_eq!(got.len(), want.len());
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.cfg, w.cfg, "range {r}: config");
            assert_eq!(format!("{:?}", g.bound), format!("{:?}", w.bound), "range {r}: arguments");
            assert!(chains.contains(&g.cfg), "range {r}: {} is not preloaded", g.cfg.key());
            let prep = kda_kernels::chunk_prep::PrepConfig::of(&g.cfg);
            assert!(preps.contains(&prep), "range {r}: its preparation {} is not preloaded", prep.key());
            assert_ne!(tensor_at(&g.bound, "cu_seqlens"), cu1.ptr(), "range {r}: reads cu_seqlens");
        }
        let fin2 = at(11, &[2, hv, D, D], DType::F32);
        args.cu_seqlens = Some(&cu2);
        args.final_state = Some(&fin2);
        let two = plan_chunk(&args).expect("a valid varlen call");
        assert_eq!(ChunkTuning::for_call(&two, &DeviceLimits::H200).ranges, None, "two sequences");
        let e = check_ranges(&two, 2).expect_err("two sequences");
        assert!(e.to_string().contains("one sequence"), "{e}");
    }

    /// The ranges' workspace fits the call's own workspace, sized exactly, when the call
    /// has few heads (its ranges, longer than a split's threshold, never split): dense in 5
    /// and 4 ranges, and varlen with a `max_seqlen` hint shorter than its one sequence (a
    /// wrong hint: its workspace holds no split tables).
    #[test]
    fn range_parts_fit_the_workspace_of_calls_with_few_heads() {
        let hv = 8;
        for (t, nranges, hint) in [(41040, 5, None), (32832, 4, None), (20000, 2, Some(100))] {
            // 16 GiB apart: long calls' tensors must not overlap.
            let at = |id: u64, shape: &[usize], dtype| tv(16 * 1024 * id, shape, dtype);
            let (q, k) = (at(1, &[1, t, 2, D], DType::BF16), at(2, &[1, t, 2, D], DType::BF16));
            let (v, g) = (at(3, &[1, t, hv, D], DType::BF16), at(4, &[1, t, hv, D], DType::BF16));
            let (beta, out) = (at(5, &[1, t, hv], DType::BF16), at(6, &[1, t, hv, D], DType::BF16));
            let (fin, cu) = (at(8, &[1, hv, D, D], DType::F32), at(9, &[2], DType::I32));
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.output = Some(&out);
            args.output_final_state = true;
            args.final_state = Some(&fin);
            if hint.is_some() {
                args.cu_seqlens = Some(&cu);
                args.max_seqlen = hint;
            }
            let need = chunk_workspace_bytes(&plan_chunk(&args).expect("a valid call"), &DeviceLimits::H200);
            let ws = at(7, &[need.div_ceil(4)], DType::F32);
            args.workspace = Some(&ws);
            let plan = plan_chunk(&args).expect("a valid call");
            let tune = ChunkTuning { ranges: Some(nranges), ..ChunkTuning::of_path(&plan, true) };
            tune.check(&plan).unwrap_or_else(|e| panic!("T = {t}: {e}"));
            let launches = range_launches(&args, &plan, tune, nranges, out.ptr(), Some(fin)).expect("launches");
            for l in &launches {
                let end = tensor_at(&l.bound, "prep") + chunk_workspace_bytes_unsplit(&l.plan) as u64 - ws.ptr();
                assert!(end <= need as u64, "T = {t} in {nranges}: the workspace ends at byte {end} of {need}");
            }
        }
    }

    #[test]
    fn calls_the_ranges_cannot_take_are_refused_by_name() {
        let [q, k, v, g, beta] = dense_bf16_inputs(2, 64, 2);
        let ws = tv(11, &[1 << 20], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.workspace = Some(&ws);
        let plan = plan_chunk(&args).expect("a valid call");
        let e = check_ranges(&plan, 4).expect_err("B = 2");
        assert!(e.to_string().contains("tune") && e.to_string().contains("one sequence"), "{e}");
        // No token: the final states would be nobody's to write.
        let [q, k, v, g, beta] = dense_bf16_inputs(1, 0, 2);
        let fin = tv(6, &[1, 2, D, D], DType::F32);
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.workspace = Some(&ws);
        args.output_final_state = true;
        args.final_state = Some(&fin);
        let plan = plan_chunk(&args).expect("a valid call");
        let e = check_ranges(&plan, 4).expect_err("T = 0");
        assert!(e.to_string().contains("at least one token"), "{e}");
    }
}
