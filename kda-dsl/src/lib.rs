//! kda-dsl: the tile DSL compiler behind `#[kernel]`.
//!
//! Tile IR ([`tile`]) as the front end builds it ([`builder`]) → tile passes ([`passes`]:
//! layouts, barriers, shared memory) → lowering ([`lower`]) to the thread IR ([`thread_ir`]),
//! which is both what the PTX printer ([`ptx`]) prints and what the block simulator ([`sim`])
//! runs on the CPU.

#![warn(missing_docs)]

pub mod analysis;
pub mod artifact;
pub mod builder;
pub mod cache_policy;
pub mod compile;
pub mod diag;
pub mod dtype;
pub mod gemm_choice;
pub mod handle;
pub mod hopper_layout;
pub mod layout;
pub mod lower;
pub mod passes;
pub mod ptx;
pub mod sim;
pub mod target;
pub mod tensor_map;
pub mod thread_ir;
pub mod tile;
pub mod tile_text;
pub mod tma_choice;

pub use artifact::CompiledKernel;
pub use compile::{compile, lower_kernel, lower_kernel_for};
pub use diag::{Diag, SrcLoc};
pub use dtype::DType;
pub use target::Target;
pub use tile::Hoist;
