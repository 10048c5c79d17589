//! Tests that need a CUDA GPU; each one skips (passes) on machines without a driver.

use kda_dsl::artifact::{CompiledKernel, HostExpr, ParamSig};
use kda_dsl::dtype::DType;
use kda_runtime::{
    launch, median, time_graph_ms, time_ms, DeviceTensor, Gpu, KernelArg, ModuleCache, RuntimeError, TensorView,
};

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

/// `x[i] += b` for `i < N`, 128 threads per block.
///
/// Hand-written PTX is allowed here only: this tests the launcher (module cache, argument
/// marshalling, raw launch, graph capture), not the compiler, so it must not depend on it.
const ADD_SCALAR_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry add_scalar(
    .param .u64 p_x,
    .param .s32 p_n,
    .param .f32 p_b
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [p_x];
    ld.param.s32 %r1, [p_n];
    ld.param.f32 %f3, [p_b];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, %f3;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}
"#;

fn round_trips_f32_bf16_and_ints() {
    on_gpu(round_trips_f32_bf16_and_ints_on_gpu);
}

fn launches_a_hand_written_kernel() {
    on_gpu(launches_a_hand_written_kernel_on_gpu);
}

fn jit_errors_carry_the_driver_message() {
    on_gpu(jit_errors_carry_the_driver_message_on_gpu);
}

fn times_launches_and_graph_replays() {
    on_gpu(times_launches_and_graph_replays_on_gpu);
}

fn an_allocation_past_the_device_is_out_of_memory() {
    on_gpu(an_allocation_past_the_device_is_out_of_memory_on_gpu);
}

/// 16 TiB: more than any device holds. The error is typed and the context stays usable.
fn an_allocation_past_the_device_is_out_of_memory_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let Err(err) = DeviceTensor::zeros(&gpu, &stream, &[1 << 42], DType::F32) else {
        panic!("no device holds 16 TiB");
    };
    assert!(err.is_out_of_memory(), "{err}");
    let x = DeviceTensor::zeros(&gpu, &stream, &[4], DType::F32)?;
    assert_eq!(x.to_f32_vec(&stream)?, vec![0.0; 4]);
    Ok(())
}

fn views_of_cudarc_buffers_are_checked_and_launch() {
    on_gpu(views_of_cudarc_buffers_are_checked_and_launch_on_gpu);
}

/// An engine's own buffers: views check size and element type, take the device from the
/// buffer, and a kernel launched through one (its stream the engine's, the context the
/// engine's) writes the buffer.
fn views_of_cudarc_buffers_are_checked_and_launch_on_gpu() -> Result<(), RuntimeError> {
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    let gpu = Gpu::from_context(ctx.clone())?;
    let stream = ctx.default_stream();
    let dev_err = |e: cudarc::driver::DriverError| RuntimeError::Unsupported(e.to_string());
    let mut x: cudarc::driver::CudaSlice<f32> = stream.alloc_zeros(300).map_err(dev_err)?;
    let short = TensorView::of_slice(&x, &[400], DType::F32, &stream).expect_err("too short");
    assert!(short.to_string().contains("at least 1600 bytes"), "{short}");
    let wrong = TensorView::of_slice(&x, &[300], DType::BF16, &stream).expect_err("f32 is not bf16");
    assert!(wrong.to_string().contains("elements are bf16"), "{wrong}");
    {
        let view = TensorView::of_slice_mut(&mut x, &[300], DType::F32, &stream)?;
        assert_eq!((view.device(), view.shape()), (0, &[300][..]));
        let args = [("x", KernelArg::Tensor(*view)), ("b", KernelArg::F32(2.5))];
        launch(&gpu, &ModuleCache::new(), &stream, &add_scalar(), "view", &args)?;
    }
    let host = stream.clone_dtoh(&x).map_err(dev_err)?;
    assert!(host.iter().all(|v| *v == 2.5), "{:?}", &host[..4]);
    // A byte arena: a part inside it, and one past its end.
    let arena: cudarc::driver::CudaSlice<u8> = stream.alloc_zeros(4096).map_err(dev_err)?;
    let part = TensorView::of_bytes(&arena, 1024, &[256], DType::BF16, &stream)?;
    assert_eq!(part.size_bytes(), 512);
    assert!(TensorView::of_bytes(&arena, 3800, &[256], DType::BF16, &stream).is_err());
    Ok(())
}

fn views_of_cudarc_buffers_work_under_graph_capture() {
    on_gpu(views_of_cudarc_buffers_work_under_graph_capture_on_gpu);
}

/// The pattern `slice_view` documents: views made before the capture begins and dropped after
/// it ends, so cudarc's event waits and records happen outside it; the captured launch writes
/// the engine's buffer on every replay.
fn views_of_cudarc_buffers_work_under_graph_capture_on_gpu() -> Result<(), RuntimeError> {
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    let gpu = Gpu::from_context(ctx.clone())?;
    let stream = ctx.new_stream().map_err(|e| RuntimeError::Unsupported(e.to_string()))?;
    let dev_err = |e: cudarc::driver::DriverError| RuntimeError::Unsupported(e.to_string());
    let mut x: cudarc::driver::CudaSlice<f32> = stream.alloc_zeros(256).map_err(dev_err)?;
    let kernel = add_scalar();
    let cache = ModuleCache::new();
    {
        let view = TensorView::of_slice_mut(&mut x, &[256], DType::F32, &stream)?;
        let args = [("x", KernelArg::Tensor(*view)), ("b", KernelArg::F32(1.0))];
        // One eager call (loads the module), then 3 warm-up and 10 timed replays of the graph.
        time_graph_ms(&gpu, &stream, 10, || launch(&gpu, &cache, &stream, &kernel, "view", &args))?;
    }
    let host = stream.clone_dtoh(&x).map_err(dev_err)?;
    // 1 eager + 1 captured (not run) + 3 + 10 replays.
    assert!(host.iter().all(|v| *v == 14.0), "{:?}", &host[..4]);
    Ok(())
}

fn add_scalar() -> CompiledKernel {
    let n = || Box::new(HostExpr::Dim("N".into()));
    CompiledKernel {
        entry: "add_scalar".into(),
        ptx: ADD_SCALAR_PTX.into(),
        params: vec![
            ParamSig::Tensor { name: "x".into(), dtype: DType::F32, dims: vec!["N".into()], writes: true },
            ParamSig::Dim { name: "N".into() },
            ParamSig::Scalar { name: "b".into(), dtype: DType::F32 },
        ],
        threads: 128,
        shared_bytes: 0,
        grid: [HostExpr::CeilDiv(n(), Box::new(HostExpr::Const(128))), HostExpr::Const(1), HostExpr::Const(1)],
        assumptions: vec![],
        exact_extents: vec![],
        cluster_blocks: 1,
    }
}

fn round_trips_f32_bf16_and_ints_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    eprintln!("device 0: {} {:?}", gpu.name(), gpu.compute_capability()?);
    let vals = [0.0f32, 1.5, -3.25, 1024.0, 1.0 + 1.0 / 512.0, f32::INFINITY];
    let f = DeviceTensor::from_f32(&gpu, &stream, &[2, 3], DType::F32, &vals)?;
    assert_eq!(f.to_f32_vec(&stream)?, vals);
    let mut h = DeviceTensor::from_f32(&gpu, &stream, &[6], DType::BF16, &vals)?;
    assert_eq!(h.size_bytes(), 12);
    // 1 + 2^-9 is not a bf16: it rounds to even, 1.0.
    assert_eq!(h.to_f32_vec(&stream)?, [0.0, 1.5, -3.25, 1024.0, 1.0, f32::INFINITY]);
    h.fill_nan(&stream)?;
    assert!(h.to_f32_vec(&stream)?.iter().all(|v| v.is_nan()));
    let z = DeviceTensor::zeros(&gpu, &stream, &[4, 5], DType::F16)?;
    assert_eq!(z.to_f32_vec(&stream)?, [0.0; 20]);
    let ints = [-5i64, 0, 1 << 30];
    let i = DeviceTensor::from_i64(&gpu, &stream, &[3], DType::I32, &ints)?;
    assert_eq!(i.to_i64_vec(&stream)?, ints);
    let e = DeviceTensor::zeros(&gpu, &stream, &[0, 7], DType::BF16)?;
    assert!(e.to_f32_vec(&stream)?.is_empty());
    assert!(DeviceTensor::from_f32(&gpu, &stream, &[5], DType::F32, &vals).is_err());
    Ok(())
}

fn launches_a_hand_written_kernel_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let cache = ModuleCache::new();
    let kernel = add_scalar();
    let host: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let x = DeviceTensor::from_f32(&gpu, &stream, &[1000], DType::F32, &host)?;
    let args = [("x", KernelArg::Tensor(x.view())), ("b", KernelArg::F32(1.0))];
    launch(&gpu, &cache, &stream, &kernel, "test", &args)?;
    launch(&gpu, &cache, &stream, &kernel, "test", &args)?;
    assert_eq!(cache.len(), 1);
    let want: Vec<f32> = host.iter().map(|v| v + 2.0).collect();
    assert_eq!(x.to_f32_vec(&stream)?, want);

    // More than 48 KiB of dynamic shared memory needs the opt-in attribute the cache sets.
    let big = CompiledKernel { shared_bytes: 100 * 1024, ..kernel.clone() };
    launch(&gpu, &cache, &stream, &big, "test-100k-smem", &args)?;
    assert_eq!(cache.len(), 2);
    let want: Vec<f32> = host.iter().map(|v| v + 3.0).collect();
    assert_eq!(x.to_f32_vec(&stream)?, want);

    // An empty tensor gives an empty grid: nothing is launched.
    let empty = DeviceTensor::zeros(&gpu, &stream, &[0], DType::F32)?;
    let args = [("x", KernelArg::Tensor(empty.view())), ("b", KernelArg::F32(1.0))];
    launch(&gpu, &cache, &stream, &kernel, "test", &args)?;
    Ok(())
}

fn jit_errors_carry_the_driver_message_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let mut kernel = add_scalar();
    kernel.ptx = kernel.ptx.replace("add.f32", "add.bogus");
    let x = DeviceTensor::zeros(&gpu, &stream, &[4], DType::F32)?;
    let args = [("x", KernelArg::Tensor(x.view())), ("b", KernelArg::F32(1.0))];
    let err = launch(&gpu, &ModuleCache::new(), &stream, &kernel, "bad", &args).expect_err("broken PTX must not load");
    eprintln!("{err}");
    assert!(matches!(err, RuntimeError::Driver { op: "cuModuleLoadDataEx", .. }), "{err}");
    Ok(())
}

fn times_launches_and_graph_replays_on_gpu() -> Result<(), RuntimeError> {
    let gpu = Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let cache = ModuleCache::new();
    let kernel = add_scalar();
    let x = DeviceTensor::zeros(&gpu, &stream, &[1 << 20], DType::F32)?;
    let args = [("x", KernelArg::Tensor(x.view())), ("b", KernelArg::F32(1.0))];
    let run = || launch(&gpu, &cache, &stream, &kernel, "test", &args);

    let mut ms = time_ms(&gpu, &stream, 2, 5, run)?;
    assert_eq!(ms.len(), 5);
    assert!(ms.iter().all(|t| t.is_finite() && *t >= 0.0), "{ms:?}");
    let eager = median(&mut ms);
    // Each run adds 1: at least the 2 warm-up and 5 timed runs (the warm-up runs on until the
    // GPU has been busy for a while, so more).
    let runs = x.to_f32_vec(&stream)?;
    assert!(runs[0] >= 7.0 && runs.iter().all(|v| *v == runs[0]), "{:?}", &runs[..4]);

    let graph = time_graph_ms(&gpu, &stream, 10, run)?;
    eprintln!("add_scalar on 2^20 f32: {eager:.4} ms eager (median), {graph:.4} ms per graph replay");
    assert!(graph.is_finite() && graph > 0.0);
    // 1 run before capture, 3 warm-up replays and 10 timed ones; capture runs nothing.
    let out = x.to_f32_vec(&stream)?;
    assert!(out.iter().all(|v| *v == runs[0] + 14.0), "{:?} after {}", &out[..4], runs[0]);

    let default = gpu.default_stream();
    assert!(time_graph_ms(&gpu, &default, 1, run).is_err());
    Ok(())
}

fn main() {
    gpu_test_main(
        &[
            ("round_trips_f32_bf16_and_ints", round_trips_f32_bf16_and_ints),
            ("launches_a_hand_written_kernel", launches_a_hand_written_kernel),
            ("jit_errors_carry_the_driver_message", jit_errors_carry_the_driver_message),
            ("times_launches_and_graph_replays", times_launches_and_graph_replays),
            ("an_allocation_past_the_device_is_out_of_memory", an_allocation_past_the_device_is_out_of_memory),
            ("views_of_cudarc_buffers_are_checked_and_launch", views_of_cudarc_buffers_are_checked_and_launch),
            ("views_of_cudarc_buffers_work_under_graph_capture", views_of_cudarc_buffers_work_under_graph_capture),
        ],
        &[],
        &[],
    )
}
