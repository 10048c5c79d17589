//! Compiled-kernel cache: each shipped variant is compiled to PTX once per process, then loaded
//! once per device by the [`ModuleCache`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kda_dsl::artifact::CompiledKernel;
use kda_dsl::Target;
use kda_kernels::Variant;

use crate::cache::ModuleCache;
use crate::error::RuntimeError;

/// Compiles shipped variants on first use and keeps their modules loaded.
#[derive(Default)]
pub struct Kernels {
    compiled: Mutex<HashMap<String, Arc<CompiledKernel>>>,
    /// Loaded modules per (device, kernel, config).
    pub modules: ModuleCache,
}

impl Kernels {
    /// An empty cache.
    pub fn new() -> Kernels {
        Kernels::default()
    }

    /// The compiled form of `variant` (PTX for sm_80, which the driver JITs for newer GPUs).
    pub fn compiled(&self, variant: &Variant) -> Result<Arc<CompiledKernel>, RuntimeError> {
        let id = variant.id();
        let mut map = self.compiled.lock().map_err(|_| RuntimeError::Unsupported("kernel cache poisoned".into()))?;
        if let Some(k) = map.get(&id) {
            return Ok(k.clone());
        }
        let def = variant.build().map_err(|e| RuntimeError::Unsupported(format!("building {id}: {e}")))?;
        let k = Arc::new(
            kda_dsl::compile(def, Target::Sm80)
                .map_err(|e| RuntimeError::Unsupported(format!("compiling {id}: {e}")))?,
        );
        map.insert(id, k.clone());
        Ok(k)
    }
}
