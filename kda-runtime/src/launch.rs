//! Launching a compiled kernel with arguments bound by name (`binding.rs`).

use cudarc::driver::{result, CudaStream};
use kda_dsl::artifact::CompiledKernel;

pub use crate::binding::{bind_args, bind_planned, BindPlan, BoundArgs, MAX_PARAMS};
use crate::cache::{LoadedKernel, ModuleCache};
use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};
use crate::tensor::TensorView;

/// Alignment every tensor's address must have (the widest vector access kernels make).
pub const POINTER_ALIGN: u64 = 16;

/// One kernel argument, passed by parameter name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A tensor, for a `Tensor` parameter.
    Tensor(TensorView),
    /// An `i32` scalar, or the value of a `Dim` parameter no tensor names.
    I32(i32),
    /// An `i64` scalar.
    I64(i64),
    /// An `f32` scalar.
    F32(f32),
}

/// A parameter value as `cuLaunchKernel` receives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawArg {
    /// A device pointer.
    U64(u64),
    /// A `.s32` value (extents and `i32` scalars).
    I32(i32),
    /// A `.s64` value.
    I64(i64),
    /// A `.f32` value.
    F32(f32),
    /// Tensor map number `n` of the launch ([`BoundArgs::param_pointers`] points at it).
    TensorMap(usize),
}

/// Validates and launches `kernel` on `stream` with the raw driver call (no per-buffer events
/// are recorded, so the launch can be captured into a CUDA graph). Returns without launching
/// when the grid is empty. The module is loaded through `cache` under `config_key`.
///
/// The tensors behind `args` must stay alive until the kernel has run.
pub fn launch(
    gpu: &Gpu,
    cache: &ModuleCache,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    config_key: &str,
    args: &[(&str, KernelArg)],
) -> Result<(), RuntimeError> {
    let Some(bound) = checked_bind(gpu, stream, kernel, &BindPlan::new(kernel)?, args)? else { return Ok(()) };
    let loaded = cache.get_or_load(gpu, kernel, config_key)?;
    launch_bound(gpu, &loaded, stream, bound)?;
    sync_check(stream, kernel, config_key)
}

/// [`launch`] of a kernel the caller has already loaded (through the same cache), for launchers
/// that read the loaded module first (its resident-block count).
pub fn launch_loaded(
    gpu: &Gpu,
    loaded: &LoadedKernel,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    args: &[(&str, KernelArg)],
) -> Result<(), RuntimeError> {
    launch_planned(gpu, loaded, stream, kernel, &BindPlan::new(kernel)?, "", args, None)
}

/// [`launch_loaded`] with the kernel's names already resolved: allocates nothing unless it
/// fails. `config` names the variant in a [`KDA_SYNC_CHECK`] failure. Its blocks ask for
/// `shared` bytes of shared memory where given and more than the kernel's own (at most what a
/// block may opt in to): a block that reserves an SM's shared memory keeps other kernels'
/// blocks off its SM; the kernel reads no more of it.
#[allow(clippy::too_many_arguments)] // the launch's parts, and the reservation
pub fn launch_planned(
    gpu: &Gpu,
    loaded: &LoadedKernel,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    plan: &BindPlan,
    config: &str,
    args: &[(&str, KernelArg)],
    shared: Option<usize>,
) -> Result<(), RuntimeError> {
    let Some(mut bound) = checked_bind(gpu, stream, kernel, plan, args)? else { return Ok(()) };
    if let Some(bytes) = shared.filter(|&b| b > bound.shared_bytes as usize) {
        bound.shared_bytes = loaded.allow_shared(bytes)?;
    }
    launch_bound(gpu, loaded, stream, bound)?;
    sync_check(stream, kernel, config)
}

/// The environment variable that makes every launch wait for its kernel (except on a stream
/// that is capturing a CUDA graph), so that a kernel's fault surfaces at its own launch, with
/// the kernel and its config named.
pub const KDA_SYNC_CHECK: &str = "KDA_SYNC_CHECK";

/// With [`KDA_SYNC_CHECK`]`=1`, waits for `stream` unless it is capturing, and names the
/// kernel in a failure.
fn sync_check(stream: &CudaStream, kernel: &CompiledKernel, config: &str) -> Result<(), RuntimeError> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var(KDA_SYNC_CHECK).is_ok_and(|v| v == "1")) {
        return Ok(());
    }
    let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream handle is live (borrowed); the status is written by the driver.
    unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        .result()
        .op("cuStreamIsCapturing")?;
    if status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(());
    }
    stream.synchronize().map_err(|e| match RuntimeError::driver("cuStreamSynchronize", e) {
        RuntimeError::Driver { op, code, message } => RuntimeError::Driver {
            op,
            code,
            message: format!("{message} (after launching `{}` {config})", kernel.entry),
        },
        other => other,
    })
}

/// `args` bound and checked against the stream's device; `None` when the grid is empty.
fn checked_bind(
    gpu: &Gpu,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    plan: &BindPlan,
    args: &[(&str, KernelArg)],
) -> Result<Option<BoundArgs>, RuntimeError> {
    let bound = bind_planned(kernel, plan, args)?;
    gpu.check_stream("stream", stream)?;
    bound.check_device(kernel, gpu.ordinal())?;
    Ok((!bound.is_empty()).then_some(bound))
}

/// The raw driver launch of checked arguments.
fn launch_bound(
    gpu: &Gpu,
    loaded: &LoadedKernel,
    stream: &CudaStream,
    mut bound: BoundArgs,
) -> Result<(), RuntimeError> {
    gpu.context().bind_to_thread().op("cuCtxSetCurrent")?;
    let (mut params, len) = bound.param_pointers();
    let params = &mut params[..len];
    let [gx, gy, gz] = bound.grid;
    let [bx, by, bz] = bound.block;
    // SAFETY: the function is loaded in the stream's context (same device, primary context);
    // `params` points at `values`, which outlive the call, one slot per declared parameter with
    // the declared width; pointers were checked for device and alignment.
    unsafe {
        result::launch_kernel(
            loaded.cu_function(),
            (gx, gy, gz),
            (bx, by, bz),
            bound.shared_bytes,
            stream.cu_stream(),
            params,
        )
    }
    .op("cuLaunchKernel")
}
