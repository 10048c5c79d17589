//! CUDA runtime for kda kernels: device discovery, device tensors, a module cache, validated
//! launches of [`kda_dsl::artifact::CompiledKernel`]s, and event / CUDA-graph timing.
//!
//! Everything is built on the CUDA driver API through cudarc, loaded at run time by default
//! (feature `fallback-dynamic-loading`, which yields to a `dynamic-linking` anywhere in the
//! build): on a machine without a driver, [`gpu_available`] is false and [`Gpu::new`] fails
//! with [`RuntimeError::NoGpu`]; nothing panics. The CUDA version of the bindings is the
//! feature `cuda-12080` by default, or the engine's own cudarc choice with default features
//! off (12.0 or newer).

#![warn(missing_docs)]

// The Hopper work needs the tensor-map entry points, which cudarc binds from CUDA 12.0 on.
const _: () = assert!(
    cudarc::driver::sys::CUDA_VERSION >= 12000,
    "kda needs cudarc's CUDA bindings 12.0 or newer: enable a cudarc feature `cuda-12000` or later (kda's default \
     `cuda-12080`), or `cuda-version-from-build-system` with CUDA 12 or newer installed"
);

#[cfg(test)]
mod alloc_free;
pub mod binding;
pub mod cache;
pub mod chunk;
mod convert;
pub mod decode;
pub mod device;
pub mod error;
pub mod gemm;
pub mod kernels;
pub mod launch;
pub mod preload;
#[cfg(test)]
mod random_calls;
pub mod rules;
pub mod slice_view;
pub mod tensor;
pub mod tensor_map;
pub mod timing;
mod validate;
mod workspace;

pub use cache::{LoadedKernel, ModuleCache};
pub use cudarc::driver::CudaStream;
pub use device::{device_count, gpu_available, DeviceLimits, Gpu};
pub use error::RuntimeError;
pub use gemm::{gemm, plan_gemm};
/// The PTX target a kernel is compiled for (`ChunkTuning::target`, the GEMM's variant).
pub use kda_dsl::Target;
pub use kernels::Kernels;
pub use launch::{
    bind_args, bind_planned, launch, launch_loaded, launch_planned, BindPlan, BoundArgs, KernelArg, RawArg,
    POINTER_ALIGN,
};
pub use slice_view::{Element, SliceView};
pub use tensor::{download, download_i64, upload, DeviceTensor, TensorView, MAX_RANK};
pub use tensor_map::{encode_tensor_map, TensorMapParam};
pub use timing::{host_us_per_call, median, time_graph_ms, time_ms};
