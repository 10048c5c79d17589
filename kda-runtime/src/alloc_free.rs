//! Tests that a warmed-up eager call allocates nothing on the host: planning, the variant's
//! lookup, building the arguments and binding them (the launch itself needs a GPU and is
//! covered by the GPU tests). A counting allocator, installed for this crate's unit tests,
//! counts the allocations of the calling thread only, so tests running beside it do not count.

use kda_dsl::dtype::DType::{BF16, F32, I32};

use crate::chunk::{chunk_config, plan_chunk, ChunkArgs};
use crate::decode::{decode_config, decode_shape, plan_decode, DecodeArgs};
use crate::kernels::Kernels;
use crate::launch::bind_planned;
use crate::tensor::TensorView;

include!("../tests/support/counting_alloc.rs");

fn tv(id: u64, shape: &[usize], dtype: kda_dsl::dtype::DType) -> TensorView {
    TensorView::describe(0x10_0000 * id, shape, dtype, 0).expect("a view")
}

const D: usize = 128;

#[test]
fn a_warm_decode_call_plans_looks_up_and_binds_without_allocating() {
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
    // The first call compiles the variant; the next ones find it.
    call();
    let ((), n) = allocations_in(call);
    assert_eq!(n, 0, "a warm decode call allocated {n} times");
}

#[test]
fn a_warm_prefill_call_plans_looks_up_and_binds_without_allocating() {
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
            let cfg = chunk_config(&plan);
            let ready = kernels.chunk(&cfg).expect("compiles");
            let bound = super::chunk::launch::kernel_args(&args, &plan, &cfg, out.ptr(), Some(fin)).expect("arguments");
            bind_planned(&ready.kernel, &ready.binding, &bound).expect("binds");
            if plan.workspace {
                let prep = kernels.chunk_prep(&kda_kernels::chunk_prep::PrepConfig::of(&cfg)).expect("compiles");
                let prep_args = super::chunk::prepared::preparation_args(&prep.kernel, &plan, &bound, None);
                bind_planned(&prep.kernel, &prep.binding, prep_args.as_slice()).expect("binds");
            }
        };
        call();
        let ((), n) = allocations_in(call);
        assert_eq!(n, 0, "a warm prefill call (workspace {}) allocated {n} times", workspace.is_some());
    }
}
