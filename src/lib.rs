//! kda: KDA attention kernels written in a tile DSL that compiles to PTX for tensor cores.
//!
//! This facade re-exports the four crates: [`dsl`] (the compiler and simulator), [`kernels`]
//! (kernels in the DSL and their references), [`runtime`] (CUDA launches and the validated API),
//! the `#[kernel]` and `#[kernel_fn]` attributes, and at its root what an
//! integrator calls: the entry points, their argument, plan and error types, the config types
//! that name a kernel variant, and the device types. `cli` (feature `cli`, on by default) is
//! the `kda` tool.

#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub mod cli;

pub use kda_dsl::DType;
pub use kda_kernels::chunk::ChunkConfig;
pub use kda_kernels::decode::DecodeConfig;
pub use kda_kernels::gemm::GemmConfig;
pub use kda_macros::{kernel, kernel_fn};
pub use kda_runtime::chunk::{
    chunk_config, chunk_kda, chunk_workspace_bytes, plan_chunk, ChunkArgs, ChunkError, ChunkPlan, ChunkResult,
};
pub use kda_runtime::decode::{
    decode_config, gated_delta_rule_decode, plan_decode, DecodeArgs, DecodeError, DecodePlan, DecodeResult,
};
pub use kda_runtime::error::CUresult;
pub use kda_runtime::{gemm, gpu_available, CudaStream, DeviceTensor, Gpu, Kernels, RuntimeError, TensorView};

pub use kda_dsl as dsl;
pub use kda_kernels as kernels;
pub use kda_runtime as runtime;
