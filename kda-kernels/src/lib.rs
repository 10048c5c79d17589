//! The kernels of kda written in the tile DSL, their configs, the curated list of shipped
//! variants, and f64 CPU references.

pub mod check;
pub mod gemm;
pub mod reference;

use kda_dsl::tile::KernelDef;
use kda_dsl::Diag;

/// One shipped kernel variant: a family, a config name and how to build it.
#[derive(Clone)]
pub struct Variant {
    /// Kernel family (`gemm`, ...).
    pub family: &'static str,
    /// Config name, unique within the family.
    pub name: String,
    /// True for the family's default variant (`kda emit FAMILY`).
    pub default: bool,
    build: std::sync::Arc<dyn Fn() -> Result<KernelDef, Diag> + Send + Sync>,
}

impl Variant {
    /// `family/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.family, self.name)
    }
    /// Builds the kernel definition.
    pub fn build(&self) -> Result<KernelDef, Diag> {
        (self.build)()
    }
}

fn gemm_variant(cfg: gemm::GemmConfig, default: bool) -> Variant {
    Variant { family: "gemm", name: cfg.key(), default, build: std::sync::Arc::new(move || gemm::gemm(&cfg)) }
}

/// The GEMM configs shipped (and covered by snapshots and ptxas).
pub fn gemm_configs() -> Vec<gemm::GemmConfig> {
    use gemm::GemmConfig as G;
    use kda_dsl::DType::*;
    let d = G::default();
    vec![
        d.clone(),
        G { out: BF16, ..d.clone() },
        G { b_transposed: false, ..d.clone() },
        G { dtype: F16, out: F16, ..d.clone() },
        G { dtype: F16, out: F32, b_transposed: false, ..d.clone() },
        G { bm: 64, bn: 64, bk: 32, stages: 3, threads: 128, aligned: false, ..d.clone() },
        G { bm: 64, bn: 64, bk: 32, stages: 3, threads: 128, aligned: false, b_transposed: false, out: BF16, ..d },
    ]
}

/// Every shipped variant, in a stable order.
pub fn variants() -> Vec<Variant> {
    gemm_configs().into_iter().enumerate().map(|(i, c)| gemm_variant(c, i == 0)).collect()
}
