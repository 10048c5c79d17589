//! kda: KDA attention kernels written in a tile DSL that compiles to PTX for tensor cores.
//!
//! This facade re-exports the four crates: [`dsl`] (the compiler and simulator), [`kernels`]
//! (kernels in the DSL and their references), [`runtime`] (CUDA launches and the validated API)
//! and the `#[kernel]` attribute through `kda_kernels`' dependency. [`cli`] is the `kda` tool.

#![warn(missing_docs)]

pub mod cli;

pub use kda_dsl as dsl;
pub use kda_kernels as kernels;
pub use kda_runtime as runtime;
