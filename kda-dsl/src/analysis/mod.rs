//! Analyses of the tile IR: facts about its index expressions that the lowering uses but no
//! pass changes. Each is a function of a [`crate::tile::KernelDef`], with its own tests.
//!
//! - [`divisibility`]: a number every value of an expression is a multiple of (aligned vector
//!   accesses);
//! - [`ranges`]: the values an expression can take (bound checks that cannot fail);
//! - [`fill_prelude`]: the body's `let`s a pipeline's fills read (re-evaluated for the fills'
//!   iteration);
//! - [`tile_access`]: the tiles a statement reads and writes (where a `wgmma` group must be
//!   waited for);
//! - [`cluster_uniform`]: the variables and tiles that can differ between a cluster's blocks
//!   (what a producer ring across a cluster may not compute from).

pub(crate) mod cluster_uniform;
pub(crate) mod divisibility;
pub(crate) mod fill_prelude;
pub(crate) mod ranges;
pub(crate) mod tile_access;
