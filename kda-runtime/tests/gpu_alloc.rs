//! On a GPU: a warmed-up eager decode call and prefill call, launch included, allocate nothing
//! on the host. Skips (passes) on machines without a driver. Its own test binary, because it
//! installs a counting allocator.

use kda_dsl::dtype::DType::{BF16, F32, I32};
use kda_runtime::chunk::{chunk_kda, ChunkArgs};
use kda_runtime::decode::{gated_delta_rule_decode, DecodeArgs};
use kda_runtime::{DeviceTensor, Gpu, Kernels, RuntimeError};

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

include!("support/counting_alloc.rs");

const D: usize = 128;

fn warm_eager_calls_allocate_nothing() {
    on_gpu(warm_eager_calls_allocate_nothing_on_gpu);
}

fn warm_eager_calls_allocate_nothing_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let s = gpu.new_stream()?;
    let kernels = Kernels::new();
    let z = |shape: &[usize], d| DeviceTensor::zeros(&gpu, &s, shape, d);
    // Decode: 4 sequences in a pool of 8 slots, in place.
    let (b, h, hv) = (4, 2, 4);
    let (q, k) = (z(&[b, 1, h, D], BF16)?, z(&[b, 1, h, D], BF16)?);
    let (v, a, beta) = (z(&[b, 1, hv, D], BF16)?, z(&[b, 1, hv, D], BF16)?, z(&[b, 1, hv], BF16)?);
    let (pool, slots, out) = (z(&[8, hv, D, D], F32)?, z(&[b], I32)?, z(&[b, 1, hv, D], BF16)?);
    let views = (q.view(), k.view(), v.view(), a.view(), beta.view(), pool.view(), slots.view(), out.view());
    let mut args = DecodeArgs::new(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.state = Some(&views.5);
    args.state_indices = Some(&views.6);
    args.inplace_final_state = true;
    args.output = Some(&views.7);
    gated_delta_rule_decode(&gpu, &kernels, &s, &args)?;
    let (r, n) = allocations_in(|| gated_delta_rule_decode(&gpu, &kernels, &s, &args));
    r?;
    assert_eq!(n, 0, "a warm eager decode call allocated {n} times");
    // Prefill: 2 sequences of 40 tokens, outputs and final states given.
    let (pb, t) = (2, 40);
    let (q, k) = (z(&[pb, t, h, D], BF16)?, z(&[pb, t, h, D], BF16)?);
    let (v, g, beta) = (z(&[pb, t, hv, D], BF16)?, z(&[pb, t, hv, D], BF16)?, z(&[pb, t, hv], BF16)?);
    let (out, fin) = (z(&[pb, t, hv, D], BF16)?, z(&[pb, hv, D, D], F32)?);
    let views = (q.view(), k.view(), v.view(), g.view(), beta.view(), out.view(), fin.view());
    let mut args = ChunkArgs::new(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.output = Some(&views.5);
    args.output_final_state = true;
    args.final_state = Some(&views.6);
    chunk_kda(&gpu, &kernels, &s, &args)?;
    let (r, n) = allocations_in(|| chunk_kda(&gpu, &kernels, &s, &args));
    r?;
    assert_eq!(n, 0, "a warm eager prefill call allocated {n} times");
    s.synchronize().map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    Ok(())
}

fn main() {
    gpu_test_main(&[("warm_eager_calls_allocate_nothing", warm_eager_calls_allocate_nothing)], &[], &[])
}
