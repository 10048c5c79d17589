//! Finding GPUs and holding a CUDA context on one of them.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, CudaContext, CudaStream};

use crate::error::{DriverResultExt, RuntimeError};

/// True when the CUDA driver library can be loaded and reports at least one device.
///
/// Never panics, also on machines without CUDA: the library is probed before any driver call
/// (cudarc panics when a driver entry point is called without the library). Cached after the
/// first call.
pub fn gpu_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

/// The number of CUDA devices, or [`RuntimeError::NoGpu`] when the driver cannot be loaded.
pub fn device_count() -> Result<usize, RuntimeError> {
    static COUNT: OnceLock<Result<usize, RuntimeError>> = OnceLock::new();
    COUNT.get_or_init(probe_devices).clone()
}

fn probe_devices() -> Result<usize, RuntimeError> {
    // Whether cudarc loads the library at run time or links it is decided by the whole build's
    // features (an engine's `dynamic-linking` wins over kda's fallback), which this crate cannot
    // see; so probe for the library itself either way. Linked, it is there or nothing runs.
    if !driver_library_present() {
        return Err(RuntimeError::NoGpu);
    }
    // A driver too old to export an entry point makes cudarc panic; treat that as no GPU.
    let probe = std::panic::catch_unwind(|| -> Result<usize, RuntimeError> {
        result::init().op("cuInit")?;
        let n = result::device::get_count().op("cuDeviceGetCount")?;
        Ok(usize::try_from(n).unwrap_or(0))
    });
    probe.unwrap_or(Err(RuntimeError::NoGpu))
}

/// The names the CUDA driver library goes by: the unversioned development link, the driver's
/// own soname (installed without the development files), and Windows' name.
const DRIVER_LIBRARY_NAMES: [&str; 3] = ["libcuda.so", "libcuda.so.1", "nvcuda.dll"];

/// Whether the CUDA driver library opens under one of [`DRIVER_LIBRARY_NAMES`].
fn driver_library_present() -> bool {
    DRIVER_LIBRARY_NAMES.iter().any(|&name| {
        // SAFETY: opening the driver library runs only its initializers, as cudarc's own loading
        // does; nothing in it is called here, and the handle is closed at once.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

thread_local! {
    /// Per context (its driver handle), this thread's highest-priority stream.
    static HIGH_PRIORITY: std::cell::RefCell<Vec<(usize, Arc<CudaStream>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One GPU: the primary CUDA context of a device ordinal.
#[derive(Clone, Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    name: String,
}

impl Gpu {
    /// The GPU of an existing cudarc context (an engine's own): kda's launches, allocations and
    /// module loads then use that context.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Gpu, RuntimeError> {
        let name = ctx.name().op("cuDeviceGetName")?;
        Ok(Gpu { ctx, name })
    }

    /// Opens device `ordinal`; [`RuntimeError::NoGpu`] without a driver or device,
    /// [`RuntimeError::BadArgument`] when the ordinal is out of range.
    pub fn new(ordinal: usize) -> Result<Gpu, RuntimeError> {
        let count = device_count()?;
        if count == 0 {
            return Err(RuntimeError::NoGpu);
        }
        if ordinal >= count {
            return Err(RuntimeError::bad_argument(
                "ordinal",
                format!("a device ordinal below {count}"),
                ordinal.to_string(),
            ));
        }
        let ctx = CudaContext::new(ordinal).op("cuDevicePrimaryCtxRetain")?;
        let name = ctx.name().op("cuDeviceGetName")?;
        Ok(Gpu { ctx, name })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32), RuntimeError> {
        self.ctx.compute_capability().op("cuDeviceGetAttribute")
    }

    /// The underlying cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The context's legacy default (null) stream; it cannot be captured into a CUDA graph.
    pub fn default_stream(&self) -> Arc<CudaStream> {
        self.ctx.default_stream()
    }

    /// A new non-blocking stream.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, RuntimeError> {
        self.ctx.new_stream().op("cuStreamCreate")
    }

    /// A non-blocking stream of the highest priority the device has (its kernels' blocks are
    /// scheduled before those of lower-priority streams that are ready at the same time), one
    /// per thread and context, created on the thread's first call. Kept, not made per use, so a
    /// call that forks work onto it can be captured into a CUDA graph once the thread has made
    /// one such call, and no two threads share it (one thread's capture never takes in
    /// another's work).
    pub fn high_priority_stream(&self) -> Result<Arc<CudaStream>, RuntimeError> {
        let key = self.ctx.cu_ctx() as usize;
        if let Some(s) = HIGH_PRIORITY.with(|m| m.borrow().iter().find(|(k, _)| *k == key).map(|(_, s)| s.clone())) {
            return Ok(s);
        }
        self.ctx.bind_to_thread().op("cuCtxSetCurrent")?;
        let (_, greatest) = cudarc::driver::result::stream::get_priority_range().op("cuCtxGetStreamPriorityRange")?;
        let s = self.ctx.new_stream_with_priority(greatest).op("cuStreamCreateWithPriority")?;
        HIGH_PRIORITY.with(|m| m.borrow_mut().push((key, s.clone())));
        Ok(s)
    }

    /// Blocks until all work on the device's context has finished.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.ctx.synchronize().op("cuCtxSynchronize")
    }

    /// Checks that `stream` belongs to this GPU; `name` is the argument's name in messages.
    pub(crate) fn check_stream(&self, name: &str, stream: &CudaStream) -> Result<(), RuntimeError> {
        let on = stream.context().ordinal();
        if on == self.ordinal() {
            Ok(())
        } else {
            Err(RuntimeError::bad_argument(
                name,
                format!("a stream on device {}", self.ordinal()),
                format!("a stream on device {on}"),
            ))
        }
    }
}
