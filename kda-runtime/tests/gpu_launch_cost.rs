//! On a GPU: where the host time of one eager call goes. A benchmark, not a test of speed: it
//! prints and asserts nothing about time. Rows, each the median of 20 batches of 16 calls on an
//! idle stream ([`kda_runtime::host_us_per_call`]):
//!
//! - the driver alone: `cuLaunchKernel` of a small kernel with its parameters bound once, and
//!   of a kernel with as many parameters as decode's (12 tensors and their extents), to tell
//!   the driver's cost per parameter from kda's work;
//! - that kernel through [`kda_runtime::launch::launch_planned`] (binding and checks added);
//! - an eager decode call (B = 32, H = 32, in place in a pool) and an eager prefill call
//!   (B = 8, T = 64, H = 32, the fused kernel): planning, the variant's lookup, binding, launch.
//!
//! `cargo test --release -p kda-runtime --test gpu_launch_cost -- --ignored --nocapture`

use cudarc::driver::result;
use kda_dsl::dtype::DType::{BF16, F32, I32};
use kda_runtime::binding::{BindPlan, BoundArgs};
use kda_runtime::chunk::{chunk_kda, ChunkArgs};
use kda_runtime::launch::{bind_args, launch_planned, KernelArg};
use kda_runtime::{host_us_per_call, CudaStream, DeviceTensor, Gpu, Kernels, LoadedKernel, ModuleCache, RuntimeError};

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

include!("support/gpu_calls.rs");

const D: usize = 128;

fn host_time_of_one_eager_call() {
    on_gpu(measure);
}

/// The wide kernel the benchmark launches compiles (here, without a GPU) and takes decode's
/// number of parameters or more.
fn the_many_parameter_kernel_compiles() {
    let k = kernel_of_many_tensors(12).unwrap_or_else(|e| panic!("{e}"));
    assert!(k.params.len() >= 35, "{} parameters", k.params.len());
}

fn measure() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let s = gpu.new_stream()?;
    let z = |shape: &[usize], d| DeviceTensor::zeros(&gpu, &s, shape, d);

    // A small kernel (256 columns, 3 parameters), alone and through the planned launch, and
    // one with decode's number of parameters (12 tensors of 2 extents each).
    let cache = ModuleCache::new();
    let cfg = kda_kernels::selftest::TileCfg { rows: 1, cols: 256, threads: 128 };
    let def = kda_kernels::selftest::per_lane_prefix(&cfg).map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    let small = kda_dsl::compile(def, kda_dsl::Target::Sm80).map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    let (x, y) = (z(&[256], F32)?, z(&[256], F32)?);
    let small_args = [("x", KernelArg::Tensor(x.view())), ("y", KernelArg::Tensor(y.view()))];
    let loaded = cache.get_or_load(&gpu, &small, "launch_cost")?;
    let (driver, small_params) = driver_launch_us(&s, &loaded, bind_args(&small, &small_args)?)?;
    let plan = BindPlan::new(&small)?;
    let planned = host_us_per_call(&s, || launch_planned(&gpu, &loaded, &s, &small, &plan, "", &small_args, None))?;
    let wide = kernel_of_many_tensors(12)?;
    let wide_loaded = cache.get_or_load(&gpu, &wide, "launch_cost_wide")?;
    let cols = z(&[4, 8], F32)?;
    let names: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    let wide_args: Vec<(&str, KernelArg)> =
        names.iter().map(|n| (n.as_str(), KernelArg::Tensor(cols.view()))).collect();
    let (driver_wide, wide_params) = driver_launch_us(&s, &wide_loaded, bind_args(&wide, &wide_args)?)?;

    // Decode: 32 sequences, 32 heads, in place in a pool of 64 slots.
    let kernels = Kernels::new();
    let (b, h) = (32, 32);
    let dq = |d| z(&[b, 1, h, D], d);
    let (q, k, v, a, out) = (dq(BF16)?, dq(BF16)?, dq(BF16)?, dq(BF16)?, dq(BF16)?);
    let (beta, pool) = (z(&[b, 1, h], BF16)?, z(&[64, h, D, D], F32)?);
    let slots = DeviceTensor::from_i64(&gpu, &s, &[b], I32, &(0..b as i64).collect::<Vec<_>>())?;
    let decode =
        host_us_per_call(&s, || decode_in_place(&gpu, &kernels, &s, [&q, &k, &v, &a, &beta, &out, &pool, &slots]))?;

    // Prefill: 8 sequences of 64 tokens on 32 heads (256 chains: the fused kernel).
    let (pb, t) = (8, 64);
    let pt = |d| z(&[pb, t, h, D], d);
    let (q, k, v, g, out) = (pt(BF16)?, pt(BF16)?, pt(BF16)?, pt(BF16)?, pt(BF16)?);
    let (beta, fin) = (z(&[pb, t, h], BF16)?, z(&[pb, h, D, D], F32)?);
    let views = (q.view(), k.view(), v.view(), g.view(), beta.view(), out.view(), fin.view());
    let mut args = ChunkArgs::new(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.output = Some(&views.5);
    args.output_final_state = true;
    args.final_state = Some(&views.6);
    let prefill = host_us_per_call(&s, || chunk_kda(&gpu, &kernels, &s, &args).map(|_| ()))?;
    s.synchronize().map_err(|e| RuntimeError::Unsupported(e.to_string()))?;

    println!("host time per call, us ({}):", gpu.name());
    println!("  cuLaunchKernel alone, {small_params} parameters        {driver:.2}");
    println!("  cuLaunchKernel alone, {wide_params} parameters       {driver_wide:.2}");
    println!("  launch_planned, same kernel                 {planned:.2}");
    println!("  eager decode B=32 H=32 (in place)           {decode:.2}");
    println!("  eager prefill B=8 T=64 H=32 (fused)         {prefill:.2}");
    Ok(())
}

/// Host microseconds of the driver's `cuLaunchKernel` alone, with `bound` marshalled once, and
/// the number of parameters it passes.
fn driver_launch_us(s: &CudaStream, loaded: &LoadedKernel, mut bound: BoundArgs) -> Result<(f32, usize), RuntimeError> {
    let (mut pointers, len) = bound.param_pointers();
    let params = &mut pointers[..len];
    let us = host_us_per_call(s, || {
        // SAFETY: the function is loaded in this context; `params` points into `bound` (not
        // moved since), one slot per declared parameter with its declared width.
        unsafe {
            result::launch_kernel(
                loaded.cu_function(),
                (bound.grid[0], bound.grid[1], bound.grid[2]),
                (bound.block[0], bound.block[1], bound.block[2]),
                bound.shared_bytes,
                s.cu_stream(),
                params,
            )
        }
        .map_err(|e| RuntimeError::Unsupported(e.to_string()))
    })?;
    Ok((us, params.len()))
}

/// A kernel of `n` f32 tensors `[R{i}, C{i}]` that reads nothing and writes one element of the
/// first: its launch costs what its parameters cost.
fn kernel_of_many_tensors(n: usize) -> Result<kda_dsl::artifact::CompiledKernel, RuntimeError> {
    use kda_dsl::builder::{Host, KernelBuilder, Val};
    let at = |line| kda_dsl::SrcLoc::new("gpu_launch_cost.rs", line, 1);
    let k = KernelBuilder::new("many_tensors", at(1));
    let tensors: Vec<_> =
        (0..n).map(|i| k.tensor(&format!("t{i}"), &[&format!("R{i}"), &format!("C{i}")], F32, i == 0)).collect();
    k.launch(vec![Host::int(1)], 32, at(2));
    k.store_global(&tensors[0], vec![Val::from(0), Val::from(0)], Val::from(1.0), at(3));
    let def = k.finish().map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    kda_dsl::compile(def, kda_dsl::Target::Sm80).map_err(|e| RuntimeError::Unsupported(e.to_string()))
}

fn main() {
    gpu_test_main(
        &[],
        &[("host_time_of_one_eager_call", host_time_of_one_eager_call)],
        &[("the_many_parameter_kernel_compiles", the_many_parameter_kernel_compiles)],
    )
}
