//! Compiled-kernel cache: each shipped variant is compiled to PTX once per process, then loaded
//! once per device by the [`ModuleCache`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kda_dsl::artifact::CompiledKernel;
use kda_dsl::Target;
use kda_kernels::chunk::ChunkConfig;
use kda_kernels::chunk_merge::MergeConfig;
use kda_kernels::chunk_prep::PrepConfig;
use kda_kernels::chunk_segments::SegmentsConfig;
use kda_kernels::decode::DecodeConfig;
use kda_kernels::gemm::GemmConfig;
use kda_kernels::Variant;

use crate::binding::BindPlan;
use crate::cache::{LoadedKernel, ModuleCache};
use crate::device::{DeviceLimits, Gpu};
use crate::error::RuntimeError;
use crate::tensor::TensorView;
use crate::workspace::KeptWorkspaces;
use cudarc::driver::CudaStream;

/// A compiled kernel, the id its module is cached under, and its names resolved for binding.
pub struct Ready {
    /// The compiled kernel.
    pub kernel: Arc<CompiledKernel>,
    /// `family/config`, the module cache's key (an sm_90a variant's config name differs from
    /// every sm_80 one's).
    pub id: String,
    /// The target its PTX is for.
    pub target: Target,
    /// The kernel's parameter and extent names as slots: a launch binds without allocating.
    pub binding: BindPlan,
    /// Its module on each device it was loaded on, so a warm launch finds it without hashing
    /// `id` in the module cache.
    loaded: Mutex<Vec<(usize, Arc<LoadedKernel>)>>,
}

impl Ready {
    /// The kernel's module on `gpu`, loaded through `modules` (the cache that owns it) on the
    /// first call for that device.
    pub fn loaded(&self, gpu: &Gpu, modules: &ModuleCache) -> Result<Arc<LoadedKernel>, RuntimeError> {
        let ordinal = gpu.ordinal();
        if let Some((_, k)) = self.devices().iter().find(|(o, _)| *o == ordinal) {
            return Ok(k.clone());
        }
        // A device the kernel cannot run on gets a typed error, not the driver's load error.
        self.fits(&gpu.limits())?;
        let k = modules.get_or_load(gpu, &self.kernel, &self.id)?;
        let mut devices = self.devices();
        if !devices.iter().any(|(o, _)| *o == ordinal) {
            devices.push((ordinal, k.clone()));
        }
        Ok(k)
    }

    /// Whether the kernel runs on a device of `limits`: its target, and its shared memory per
    /// block within what a block may opt in to; an error naming `gpu` and the need otherwise.
    pub fn fits(&self, limits: &DeviceLimits) -> Result<(), RuntimeError> {
        let device = limits.target()?;
        if !device.has(self.target) {
            let (major, minor) = limits.compute_capability;
            return Err(RuntimeError::bad_argument(
                "gpu",
                format!("a GPU of compute capability 9.0 for {} ({} PTX)", self.id, self.target),
                format!("compute capability {major}.{minor}"),
            ));
        }
        let need = self.kernel.shared_bytes as usize;
        if need > limits.shared_per_block_optin {
            return Err(RuntimeError::bad_argument(
                "gpu",
                format!("{need} bytes of shared memory per block for {}", self.id),
                format!("a device that allows {} bytes per block", limits.shared_per_block_optin),
            ));
        }
        Ok(())
    }

    fn devices(&self) -> std::sync::MutexGuard<'_, Vec<(usize, Arc<LoadedKernel>)>> {
        // A panic while holding the lock cannot leave the list half-updated.
        self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Compiles shipped variants on first use and keeps their modules loaded; also keeps the
/// prefill workspaces of calls that give none. Dropping it frees those workspaces: a CUDA
/// graph captured from such a call must not outlive it.
#[derive(Default)]
pub struct Kernels {
    compiled: Mutex<HashMap<String, Arc<CompiledKernel>>>,
    // Per-call lookups by config, so a launch formats no variant name.
    gemm: Mutex<HashMap<(GemmConfig, Target), Arc<Ready>>>,
    decode: Mutex<HashMap<DecodeConfig, Arc<Ready>>>,
    chunk: Mutex<HashMap<(ChunkConfig, Target), Arc<Ready>>>,
    chunk_merge: Mutex<HashMap<MergeConfig, Arc<Ready>>>,
    chunk_finish: Mutex<HashMap<MergeConfig, Arc<Ready>>>,
    chunk_segments: Mutex<HashMap<SegmentsConfig, Arc<Ready>>>,
    chunk_prep: Mutex<HashMap<PrepConfig, Arc<Ready>>>,
    /// Loaded modules per (device, kernel, config).
    pub modules: ModuleCache,
    /// The prefill workspaces kept per (device, stream) for calls that give none.
    workspaces: KeptWorkspaces,
}

impl Kernels {
    /// An empty cache.
    pub fn new() -> Kernels {
        Kernels::default()
    }

    /// The compiled form of `variant`, PTX for its target (sm_80, which the driver JITs for
    /// newer GPUs, or sm_90a for compute capability 9.0).
    pub fn compiled(&self, variant: &Variant) -> Result<Arc<CompiledKernel>, RuntimeError> {
        let id = variant.id();
        let mut map = self.compiled.lock().map_err(|_| RuntimeError::Unsupported("kernel cache poisoned".into()))?;
        if let Some(k) = map.get(&id) {
            return Ok(k.clone());
        }
        let def = variant.build().map_err(|e| RuntimeError::Unsupported(format!("building {id}: {e}")))?;
        let k = Arc::new(
            kda_dsl::compile(def, variant.target)
                .map_err(|e| RuntimeError::Unsupported(format!("compiling {id}: {e}")))?,
        );
        map.insert(id, k.clone());
        Ok(k)
    }

    /// Bytes of the prefill workspace kept for `stream` on `gpu` (0 when none is kept): what a
    /// `chunk_kda` call without a `workspace` uses (`kda_runtime::workspace` in the source says
    /// how it grows), sized ahead by [`crate::preload::preload_chunk`].
    pub fn kept_workspace_bytes(&self, gpu: &Gpu, stream: &CudaStream) -> usize {
        self.workspaces.bytes(gpu, stream)
    }

    /// The workspace kept for `stream` on `gpu`, grown to `bytes` first when smaller (never
    /// under a CUDA graph capture: then an error naming `workspace`).
    pub(crate) fn kept_workspace(
        &self,
        gpu: &Gpu,
        stream: &CudaStream,
        bytes: usize,
    ) -> Result<TensorView, RuntimeError> {
        self.workspaces.at_least(gpu, stream, bytes)
    }

    /// Frees the prefill workspaces kept for calls without one (also outgrown ones, which
    /// graphs captured earlier may still use), after waiting for the devices' work. The next
    /// such call allocates again.
    ///
    /// # Safety
    /// No CUDA graph captured from a `chunk_kda` call without a `workspace` (made with these
    /// `Kernels`) may be launched afterwards, and no other thread may be making such a call.
    pub unsafe fn release_workspaces(&self) -> Result<(), RuntimeError> {
        // SAFETY: the caller's contract, as above.
        unsafe { self.workspaces.release() }
    }

    /// The compiled GEMM for `cfg` on `target` (compiled on first use).
    pub fn gemm(&self, cfg: &GemmConfig, target: Target) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.gemm, &(cfg.clone(), target), || kda_kernels::gemm_variant_on(cfg.clone(), target))
    }

    /// The compiled decode kernel for `cfg` (compiled on first use).
    pub fn decode(&self, cfg: &DecodeConfig) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.decode, cfg, || kda_kernels::decode_variant(cfg.clone()))
    }

    /// The compiled chunk (prefill) kernel for `cfg` on `target` (compiled on first use).
    pub fn chunk(&self, cfg: &ChunkConfig, target: Target) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.chunk, &(cfg.clone(), target), || kda_kernels::chunk_variant_on(cfg.clone(), target))
    }

    /// The compiled chunk-preparation kernel for `cfg` (compiled on first use).
    pub fn chunk_prep(&self, cfg: &PrepConfig) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.chunk_prep, cfg, || kda_kernels::chunk_prep_variant(cfg.clone()))
    }

    /// The compiled merge kernel of the long-sequence split for `cfg` (compiled on first use).
    pub fn chunk_merge(&self, cfg: &MergeConfig) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.chunk_merge, cfg, || kda_kernels::chunk_merge_variant(cfg.clone()))
    }

    /// The compiled finish kernel of the long-sequence split for `cfg` (compiled on first use).
    pub fn chunk_finish(&self, cfg: &MergeConfig) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.chunk_finish, cfg, || kda_kernels::chunk_finish_variant(cfg.clone()))
    }

    /// The compiled segment schedule of the long-sequence split for `cfg` (compiled on first
    /// use).
    pub fn chunk_segments(&self, cfg: &SegmentsConfig) -> Result<Arc<Ready>, RuntimeError> {
        self.ready(&self.chunk_segments, cfg, || kda_kernels::chunk_segments_variant(cfg.clone()))
    }

    fn ready<K: std::hash::Hash + Eq + Clone>(
        &self,
        map: &Mutex<HashMap<K, Arc<Ready>>>,
        key: &K,
        variant: impl FnOnce() -> Variant,
    ) -> Result<Arc<Ready>, RuntimeError> {
        let poisoned = || RuntimeError::Unsupported("kernel cache poisoned".into());
        if let Some(r) = map.lock().map_err(|_| poisoned())?.get(key) {
            return Ok(r.clone());
        }
        let v = variant();
        let kernel = self.compiled(&v)?;
        let binding = BindPlan::new(&kernel)?;
        let r = Arc::new(Ready { kernel, id: v.id(), target: v.target, binding, loaded: Mutex::default() });
        map.lock().map_err(|_| poisoned())?.insert(key.clone(), r.clone());
        Ok(r)
    }
}
