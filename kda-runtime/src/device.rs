//! Finding GPUs and holding a CUDA context on one of them.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, CudaContext, CudaStream};

use crate::error::{DriverResultExt, RuntimeError};
use kda_dsl::Target;

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

/// What kda's choices depend on in a device, read once when a [`Gpu`] is made: a plain value,
/// so that every choice made from it is a pure function, tested for each kind of device on a
/// machine without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// The compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: usize,
    /// Shared memory a block may opt in to, in bytes.
    pub shared_per_block_optin: usize,
    /// Peak DRAM bandwidth in bytes a second (twice the memory clock times the bus width), 0
    /// where the driver does not report it.
    pub memory_bandwidth: u64,
}

impl DeviceLimits {
    /// An A100 (sm_80, 40 GB): 108 SMs, 163 KB of shared memory per block, 1.56 TB/s.
    pub const A100: DeviceLimits = DeviceLimits {
        compute_capability: (8, 0),
        sm_count: 108,
        shared_per_block_optin: 166_912,
        memory_bandwidth: 1_555_000_000_000,
    };
    /// An RTX 3090 (sm_86; A10 and RTX 30 parts share the 99 KB per block).
    pub const RTX_3090: DeviceLimits = DeviceLimits {
        compute_capability: (8, 6),
        sm_count: 82,
        shared_per_block_optin: 101_376,
        memory_bandwidth: 936_000_000_000,
    };
    /// An L40S (sm_89; L4 and RTX 40 parts share the 99 KB per block).
    pub const L40S: DeviceLimits = DeviceLimits {
        compute_capability: (8, 9),
        sm_count: 142,
        shared_per_block_optin: 101_376,
        memory_bandwidth: 864_000_000_000,
    };
    /// An H100 SXM (sm_90): 132 SMs, 227 KB per block, 3.35 TB/s.
    pub const H100: DeviceLimits = DeviceLimits {
        compute_capability: (9, 0),
        sm_count: 132,
        shared_per_block_optin: 232_448,
        memory_bandwidth: 3_350_000_000_000,
    };
    /// An H200 (sm_90): the H100 SXM's SMs and shared memory, 4.8 TB/s.
    pub const H200: DeviceLimits = DeviceLimits { memory_bandwidth: 4_800_000_000_000, ..DeviceLimits::H100 };

    /// The most a kernel compiled for this device may use: sm_90a on compute capability 9.0
    /// exactly (H100, H200: `wgmma`, `setmaxnreg`), sm_80 from 8.0 up otherwise (the driver
    /// compiles it for the device; PTX ISA 7.0 needs a CUDA 11.0 driver or newer). Families
    /// ship sm_80 variants for every device and, where they have them, sm_90a ones (the GEMM).
    /// Below 8.0 the kernels' instructions (bf16 `mma.sync`, `cp.async`, `ldmatrix`) do not
    /// exist: an error naming the device's capability and the one needed.
    pub fn target(&self) -> Result<Target, RuntimeError> {
        let (major, minor) = self.compute_capability;
        if major < 8 {
            return Err(RuntimeError::bad_argument(
                "gpu",
                "a GPU of compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell)",
                format!("compute capability {major}.{minor}"),
            ));
        }
        Ok(if (major, minor) == (9, 0) { Target::Sm90a } else { Target::Sm80 })
    }

    /// Reads the limits of `ctx`'s device.
    fn read(ctx: &CudaContext) -> Result<DeviceLimits, RuntimeError> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attribute = |a| ctx.attribute(a).op("cuDeviceGetAttribute").map(|v| usize::try_from(v).unwrap_or(0));
        Ok(DeviceLimits {
            compute_capability: (
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            sm_count: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            shared_per_block_optin: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            memory_bandwidth: memory_bandwidth(
                attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0),
                attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0),
            ),
        })
    }
}

/// Peak DRAM bandwidth in bytes a second of a memory clocked at `clock_khz` (the driver's
/// unit) on a bus `bus_bits` wide: two transfers a clock. 0 when either is unknown.
fn memory_bandwidth(clock_khz: usize, bus_bits: usize) -> u64 {
    (2 * 1000 * clock_khz as u64).saturating_mul(bus_bits as u64 / 8)
}

/// One GPU: the primary CUDA context of a device ordinal.
#[derive(Clone, Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    name: String,
    limits: DeviceLimits,
}

impl Gpu {
    /// The GPU of an existing cudarc context (an engine's own): kda's launches, allocations and
    /// module loads then use that context.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Gpu, RuntimeError> {
        let name = ctx.name().op("cuDeviceGetName")?;
        let limits = DeviceLimits::read(&ctx)?;
        Ok(Gpu { ctx, name, limits })
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
        Gpu::from_context(CudaContext::new(ordinal).op("cuDevicePrimaryCtxRetain")?)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability `(major, minor)`, as read when this `Gpu` was made.
    pub fn compute_capability(&self) -> Result<(i32, i32), RuntimeError> {
        let (major, minor) = self.limits.compute_capability;
        Ok((major as i32, minor as i32))
    }

    /// The device's limits, as read when this `Gpu` was made.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
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

    /// An engine's own stream, given as its raw driver handle (`CUstream`, cast to a pointer),
    /// for kda's calls: the way in for an engine built on another cudarc version (or none),
    /// whose stream type is not kda's. Pair it with [`crate::TensorView::from_raw`] views of
    /// the engine's buffers. The stream must belong to this `Gpu`'s context (made by
    /// [`Gpu::new`] on the same ordinal: the device's primary context, which engines use); an
    /// error naming `stream` otherwise. Dropping the returned stream leaves the engine's alone.
    ///
    /// # Safety
    /// `stream` is a live stream handle, and stays alive while the returned stream (or a CUDA
    /// graph captured through it) is used; the engine orders its own work on it as usual.
    pub unsafe fn borrow_raw_stream(&self, stream: *mut std::ffi::c_void) -> Result<Arc<CudaStream>, RuntimeError> {
        let raw = stream as cudarc::driver::sys::CUstream;
        self.ctx.bind_to_thread().op("cuCtxSetCurrent")?;
        let mut owner: cudarc::driver::sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a live stream handle (the caller's contract); the driver writes its context.
        unsafe { cudarc::driver::sys::cuStreamGetCtx(raw, &mut owner) }.result().op("cuStreamGetCtx")?;
        if owner != self.ctx.cu_ctx() {
            return Err(RuntimeError::bad_argument(
                "stream",
                format!("a stream of device {}'s primary context (the Gpu's)", self.ordinal()),
                "a stream of another context",
            ));
        }
        // SAFETY: the stream belongs to this context (checked) and outlives the wrapper (the
        // caller's contract); the wrapper never destroys it.
        Ok(unsafe { self.ctx.wrap_borrowed_stream(raw) })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bandwidth from the driver's clock (kHz) and bus width (bits): an H100 SXM's
    /// 2619 MHz on 5120 bits is its 3.35 TB/s, an H200's 3201 MHz on 6144 bits its 4.9; an
    /// unreported attribute gives 0.
    #[test]
    fn memory_bandwidth_is_two_transfers_a_clock_over_the_bus() {
        assert_eq!(memory_bandwidth(2_619_000, 5120), 3_352_320_000_000);
        assert_eq!(memory_bandwidth(3_201_000, 6144), 4_916_736_000_000);
        assert_eq!(memory_bandwidth(0, 5120), 0);
        assert_eq!(memory_bandwidth(2_619_000, 0), 0);
    }

    /// The target is a function of the compute capability alone: sm_90a on 9.0 exactly, sm_80
    /// PTX from 8.0 up otherwise (Blackwell runs no sm_90a code), an error naming `gpu` and the
    /// capability below.
    #[test]
    fn the_target_follows_the_compute_capability() {
        let of = |cc| DeviceLimits { compute_capability: cc, ..DeviceLimits::H200 }.target();
        for (cc, want) in [
            ((8, 0), Target::Sm80),
            ((8, 6), Target::Sm80),
            ((8, 9), Target::Sm80),
            ((9, 0), Target::Sm90a),
            ((10, 0), Target::Sm80),
            ((12, 0), Target::Sm80),
        ] {
            assert_eq!(of(cc).unwrap_or_else(|e| panic!("{cc:?}: {e}")), want, "{cc:?}");
        }
        let e = of((7, 5)).expect_err("Turing").to_string();
        assert!(e.contains("gpu") && e.contains("8.0 or newer") && e.contains("7.5"), "{e}");
    }
}
