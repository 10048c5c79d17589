//! The instruction plans a lowering chose ([`Plans`]), for tests and kernel authors.

use super::{copy_plan, gemm_plan};
use crate::diag::Diag;
use crate::tile::KernelDef;

/// The instruction plans a lowering chose, in the order it met their operations.
#[derive(Clone, Debug)]
pub struct Plans {
    /// Every copy's ([`copy_plan::CopyPlan`]).
    pub copies: Vec<copy_plan::CopyPlan>,
    /// Every `gemm`'s ([`gemm_plan::GemmPlan`]).
    pub gemms: Vec<gemm_plan::GemmPlan>,
    /// Every access of a shared tile at a `parallel`'s own index
    /// ([`super::matrix_access::MatrixAccessPlan`]).
    pub matrix_accesses: Vec<super::matrix_access::MatrixAccessPlan>,
    /// How the registers are spread over the roles.
    pub registers: super::register_plan::RegisterPlan,
}

/// The plans of every copy and `gemm` in `def`, and of its registers, lowered for `target`.
pub fn plans(def: KernelDef, target: crate::target::Target) -> Result<Plans, Diag> {
    let tp = crate::passes::run_tile_passes_for(def, target)?;
    super::lower_with_plans(&tp).map(|(_, plans)| plans)
}
