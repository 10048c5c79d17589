//! Tests that a warmed-up eager call allocates nothing on the host: planning, the variant's
//! lookup, building the arguments and binding them (the launch itself needs a GPU and is
//! covered by the GPU tests). A counting allocator, installed for this crate's unit tests,
//! counts the allocations of the calling thread only, so tests running beside it do not count.

use kda_dsl::dtype::DType::{BF16, F32, I32};

use crate::chunk::{plan_chunk, ChunkArgs};
use crate::decode::{decode_config, decode_shape, plan_decode, DecodeArgs};
use crate::kernels::Kernels;
use crate::launch::bind_planned;
use crate::tensor::TensorView;

include!("../tests/support/counting_alloc.rs");

fn tv(id: u64, shape: &[usize], dtype: kda_dsl::dtype::DType) -> TensorView {
    TensorView::describe(0x10_0000 * id, shape, dtype, 0).expect("a view")
}

const D: usize = 128;

/// Runs `f` with a decode call's host work (plan, lookup, arguments, bind: all but the launch),
/// for B = 64 single-token sequences on 32 heads through the pool in place.
fn with_decode_call(f: impl FnOnce(&dyn Fn())) {
    let (b, hv) = (64, 32);
    let (q, k) = (tv(1, &[b, 1, 16, D], BF16), tv(2, &[b, 1, 16, D], BF16));
    let (v, a) = (tv(3, &[b, 1, hv, D], BF16), tv(4, &[b, 1, hv, D], BF16));
    let beta = tv(5, &[b, 1, hv], BF16);
    let pool = tv(6, &[b + 8, hv, D, D], F32);
    let slots = tv(7, &[b], I32);
    let out = tv(8, &[b, 1, hv, D], BF16);
    let (a_log, dt_bias) = (tv(9, &[hv], F32), tv(10, &[hv * D], F32));
    let mut args = DecodeArgs::new(&q, &k, &v, &a, &beta);
    args.state = Some(&pool);
    args.state_indices = Some(&slots);
    args.inplace_final_state = true;
    args.output = Some(&out);
    args.a_log = Some(&a_log);
    args.dt_bias = Some(&dt_bias);
    let kernels = Kernels::new();
    let call = || {
        let plan = plan_decode(&args).expect("a valid call");
        let cfg = super::decode::launch::tuned_config(&plan, decode_shape(&plan));
        assert_eq!(cfg, decode_config(&plan));
        let ready = kernels.decode(&cfg).expect("compiles");
        let bound = super::decode::launch::kernel_args(&args, &plan, &cfg, out, None, 1).expect("arguments");
        bind_planned(&ready.kernel, &ready.binding, &bound).expect("binds");
    };
    f(&call);
}

#[test]
fn a_warm_decode_call_plans_looks_up_and_binds_without_allocating() {
    with_decode_call(|call| {
        // The first call compiles the variant; the next ones find it.
        call();
        let ((), n) = allocations_in(call);
        assert_eq!(n, 0, "a warm decode call allocated {n} times");
    });
}

/// Runs `f` with a prefill call's host work (as [`with_decode_call`], and the preparation's
/// binding on the two-kernel path), for 2 sequences of 300 tokens on 4 value heads, on the
/// fused path (no workspace) and the two-kernel path (a workspace; `f` gets which).
fn with_prefill_calls(mut f: impl FnMut(bool, &dyn Fn())) {
    let (b, t, h, hv) = (2, 300, 2, 4);
    let (q, k) = (tv(1, &[b, t, h, D], BF16), tv(2, &[b, t, h, D], BF16));
    let (v, g) = (tv(3, &[b, t, hv, D], BF16), tv(4, &[b, t, hv, D], BF16));
    let beta = tv(5, &[b, t, hv], BF16);
    let (a_log, dt_bias) = (tv(6, &[hv], F32), tv(7, &[hv * D], F32));
    let (init, fin) = (tv(8, &[b, hv, D, D], F32), tv(9, &[b, hv, D, D], F32));
    let out = tv(10, &[b, t, hv, D], BF16);
    let ws = tv(11, &[1 << 22], F32);
    for workspace in [None, Some(&ws)] {
        let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
        args.a_log = Some(&a_log);
        args.dt_bias = Some(&dt_bias);
        args.initial_state = Some(&init);
        args.output_final_state = true;
        args.final_state = Some(&fin);
        args.output = Some(&out);
        args.workspace = workspace;
        let kernels = Kernels::new();
        let call = || {
            let plan = plan_chunk(&args).expect("a valid call");
            let tune = crate::chunk::ChunkTuning::of_path(&plan, workspace.is_some());
            let cfg = crate::chunk::chunk_tuned_config(&plan, tune);
            let ready = kernels.chunk(&cfg, kda_dsl::Target::Sm80).expect("compiles");
            let bound = crate::chunk::bind::kernel_args(&args, &plan, &cfg, out.ptr(), Some(fin)).expect("arguments");
            bind_planned(&ready.kernel, &ready.binding, &bound).expect("binds");
            if tune.prepared {
                let prep = kernels.chunk_prep(&kda_kernels::chunk_prep::PrepConfig::of(&cfg)).expect("compiles");
                let blocks = crate::chunk::prepared::prep_blocks(&plan);
                let prep_args = crate::chunk::bind::preparation_args(&prep.kernel, &bound, blocks).expect("arguments");
                bind_planned(&prep.kernel, &prep.binding, prep_args.as_slice()).expect("binds");
            }
        };
        f(workspace.is_some(), &call);
    }
}

#[test]
fn a_warm_prefill_call_plans_looks_up_and_binds_without_allocating() {
    with_prefill_calls(|workspace, call| {
        call();
        let ((), n) = allocations_in(call);
        assert_eq!(n, 0, "a warm prefill call (workspace {workspace}) allocated {n} times");
    });
}

/// The median over 21 rounds of one warm call's host work, in microseconds.
fn warm_call_us(call: &dyn Fn()) -> f64 {
    const CALLS: u32 = 2000;
    call();
    let mut rounds: Vec<f64> = (0..21)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..CALLS {
                call();
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

/// A benchmark, not a test (it asserts nothing about speed): the host time of a warm call's
/// planning, lookup, arguments and binding, everything but the driver's launch. Run with
/// `cargo test --release -p kda-runtime host_work_of_a_warm_call -- --ignored --nocapture`.
#[test]
#[ignore = "a benchmark: run it by name with --ignored"]
fn host_work_of_a_warm_call() {
    with_decode_call(|call| eprintln!("decode B=64 H=32: {:.3} us per call", warm_call_us(call)));
    with_prefill_calls(|workspace, call| {
        eprintln!("prefill B=2 T=300 HV=4, workspace {workspace}: {:.3} us per call", warm_call_us(call));
    });
}
