//! Loading compiled kernels into the driver once and keeping them loaded.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext};
use kda_dsl::artifact::CompiledKernel;

use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;
/// Size of the buffer the JIT writes its error log into.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// A PTX module loaded into a device's context, and its kernel entry point.
///
/// The module stays loaded as long as this value lives.
#[derive(Debug)]
pub struct LoadedKernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    /// Blocks of this kernel that fit on the whole device at once (resident blocks per SM, as
    /// the driver's occupancy calculator says, times the SM count).
    resident_blocks: u32,
    /// The dynamic shared memory a launch may ask for (the function's
    /// `MAX_DYNAMIC_SHARED_SIZE_BYTES`), raised by [`LoadedKernel::allow_shared`].
    shared_allowed: AtomicU32,
}

// SAFETY: module and function handles are plain driver handles, usable from any thread once
// the owning context is made current (every use goes through `ctx.bind_to_thread`).
unsafe impl Send for LoadedKernel {}
// SAFETY: as above; the handles are never replaced after loading (a function attribute set
// by `allow_shared` is the driver's state, set under the context like every other use).
unsafe impl Sync for LoadedKernel {}

impl LoadedKernel {
    /// The raw function handle, valid while `self` lives.
    pub fn cu_function(&self) -> sys::CUfunction {
        self.function
    }

    /// The context the module was loaded into.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Blocks of this kernel the device holds at once (at least 1).
    pub fn resident_blocks(&self) -> u32 {
        self.resident_blocks
    }

    /// Lets a launch ask for `bytes` of dynamic shared memory (raising the function's limit
    /// when it is lower), and returns `bytes`. Setting a function attribute is no stream
    /// operation, so a capture may be under way.
    pub(crate) fn allow_shared(&self, bytes: usize) -> Result<u32, RuntimeError> {
        let want = u32::try_from(bytes)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| RuntimeError::Unsupported(format!("{bytes} bytes of shared memory")))?;
        if want > self.shared_allowed.load(Ordering::Relaxed) {
            self.ctx.bind_to_thread().op("cuCtxSetCurrent")?;
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            // SAFETY: the function handle is valid while the module is loaded.
            unsafe { result::function::set_function_attribute(self.function, attr, want as i32) }
                .op("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
            self.shared_allowed.fetch_max(want, Ordering::Relaxed);
        }
        Ok(want)
    }
}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        // Errors are dropped: nothing can be done about a module that will not unload.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the module was loaded in this context and is unloaded once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// One module's place in the cache: empty until its first caller has loaded it.
type Slot = Arc<Mutex<Option<Arc<LoadedKernel>>>>;

/// Slots by device ordinal, then entry name, then config key: looked up by `&str`, so a hit
/// allocates nothing.
type Slots = HashMap<usize, HashMap<String, HashMap<String, Slot>>>;

/// A thread-safe cache of loaded kernels keyed by (device ordinal, entry name, config key).
///
/// The config key must identify the PTX: two kernels with the same entry name and key on one
/// device are taken to be the same module. The driver's JIT runs outside the cache's lock,
/// holding only its own module's slot: other modules are found or loaded meanwhile, and a
/// module is still loaded once.
#[derive(Debug, Default)]
pub struct ModuleCache {
    loaded: Mutex<Slots>,
}

impl ModuleCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of loaded kernels.
    pub fn len(&self) -> usize {
        let slots = self.lock();
        let loaded = |s: &Slot| s.lock().map(|m| m.is_some()).unwrap_or(false);
        slots.values().flat_map(|e| e.values()).flat_map(|c| c.values()).filter(|s| loaded(s)).count()
    }

    /// True when nothing is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The loaded kernel for `kernel` under `config_key` on `gpu`, JIT-compiling its PTX with
    /// the driver on first use. Kernels with more than 48 KiB of dynamic shared memory are
    /// opted in to their `shared_bytes`.
    pub fn get_or_load(
        &self,
        gpu: &Gpu,
        kernel: &CompiledKernel,
        config_key: &str,
    ) -> Result<Arc<LoadedKernel>, RuntimeError> {
        let slot = self.slot(gpu.ordinal(), &kernel.entry, config_key);
        let mut module = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = module.as_ref() {
            return Ok(k.clone());
        }
        // A failed load leaves the slot empty: the next caller tries again.
        let k = Arc::new(load(gpu.context(), kernel)?);
        *module = Some(k.clone());
        Ok(k)
    }

    /// The slot of (`ordinal`, `entry`, `config_key`), made on first use.
    fn slot(&self, ordinal: usize, entry: &str, config_key: &str) -> Slot {
        let mut slots = self.lock();
        if let Some(s) = slots.get(&ordinal).and_then(|e| e.get(entry)).and_then(|c| c.get(config_key)) {
            return s.clone();
        }
        let configs = slots.entry(ordinal).or_default().entry(entry.to_owned()).or_default();
        configs.entry(config_key.to_owned()).or_default().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding the lock cannot leave the map half-updated.
        self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Loads the kernel's PTX into `ctx` and looks up its entry point.
fn load(ctx: &Arc<CudaContext>, kernel: &CompiledKernel) -> Result<LoadedKernel, RuntimeError> {
    let ptx = CString::new(kernel.ptx.as_str()).map_err(|e| {
        RuntimeError::bad_argument(
            "ptx",
            "PTX text without NUL bytes",
            format!("a NUL byte at offset {}", e.nul_position()),
        )
    })?;
    let entry = CString::new(kernel.entry.as_str())
        .map_err(|_| RuntimeError::bad_argument("entry", "a name without NUL bytes", kernel.entry.clone()))?;
    ctx.bind_to_thread().op("cuCtxSetCurrent")?;
    let module = load_ptx(&ptx)?;
    let mut loaded = LoadedKernel {
        ctx: ctx.clone(),
        module,
        function: std::ptr::null_mut(),
        resident_blocks: 1,
        shared_allowed: AtomicU32::new(kernel.shared_bytes.max(DEFAULT_SHARED_LIMIT)),
    };
    // SAFETY: the module is loaded and current; `loaded` unloads it on the error paths.
    let function = unsafe { result::module::get_function(module, entry) }.op("cuModuleGetFunction")?;
    if kernel.shared_bytes > DEFAULT_SHARED_LIMIT {
        let bytes = i32::try_from(kernel.shared_bytes)
            .map_err(|_| RuntimeError::Unsupported(format!("{} bytes of shared memory", kernel.shared_bytes)))?;
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: the function handle is valid while the module is loaded.
        unsafe { result::function::set_function_attribute(function, attr, bytes) }
            .op("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
    }
    loaded.function = function;
    let threads = i32::try_from(kernel.threads)
        .map_err(|_| RuntimeError::Unsupported(format!("{} threads per block", kernel.threads)))?;
    // SAFETY: the function handle is valid while the module is loaded.
    let per_sm = unsafe {
        result::occupancy::max_active_block_per_multiprocessor(function, threads, kernel.shared_bytes as usize)
    }
    .op("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
    let sms =
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).op("cuDeviceGetAttribute")?;
    loaded.resident_blocks = (per_sm.max(1) as u32).saturating_mul(sms.max(1) as u32);
    Ok(loaded)
}

/// JIT-compiles NUL-terminated PTX in the current context, returning the JIT's error log in
/// the error on failure.
fn load_ptx(ptx: &CString) -> Result<sys::CUmodule, RuntimeError> {
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options =
        [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    // Option values are passed in pointer-sized slots; the size is a value, not an address.
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), std::ptr::without_provenance_mut(JIT_LOG_BYTES)];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `ptx` is NUL-terminated; the log buffer outlives the call and its size is given.
    let rc = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            ptx.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(e) = rc.result() {
        let mut err = RuntimeError::driver("cuModuleLoadDataEx", e);
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        if let RuntimeError::Driver { message, .. } = &mut err {
            if !text.trim().is_empty() {
                message.push_str("\nJIT log:\n");
                message.push_str(text.trim_end());
            }
        }
        return Err(err);
    }
    Ok(module)
}
