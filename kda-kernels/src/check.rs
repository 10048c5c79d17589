//! Kernels through the block simulator against their f64 references, on small shapes.

use crate::gemm::{gemm, GemmConfig};
use crate::reference::*;
use kda_dsl::sim::{run, SimArg};
use kda_dsl::DType;

/// The outcome of one simulated check.
#[derive(Clone, Debug)]
pub struct CheckOutcome {
    /// What ran.
    pub case: String,
    /// Relative error against the reference.
    pub rel_err: f64,
    /// The bound it must stay under.
    pub bound: f64,
    /// Instructions simulated.
    pub instructions: u64,
}

impl CheckOutcome {
    /// True when within bound.
    pub fn passed(&self) -> bool {
        self.rel_err <= self.bound
    }
}

fn tol(out: DType) -> f64 {
    if out == DType::F32 {
        2e-3
    } else {
        1e-2
    }
}

/// Simulates one GEMM variant at (m, n, k) on random inputs; the output starts as NaN so an
/// unwritten element fails.
pub fn check_gemm(cfg: &GemmConfig, m: usize, n: usize, k: usize, seed: u64) -> Result<CheckOutcome, String> {
    let def = gemm(cfg).map_err(|e| e.to_string())?;
    let (_, prog) = kda_dsl::lower_kernel(def.clone()).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let a = rng.normals(m * k, cfg.dtype);
    let b = rng.normals(n * k, cfg.dtype);
    let (br, bc) = if cfg.b_transposed { (n, k) } else { (k, n) };
    let c = vec![f64::NAN; m * n];
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(to_bytes(&a, cfg.dtype))),
        ("M".to_string(), SimArg::I32(m as i32)),
        ("K".to_string(), SimArg::I32(k as i32)),
        ("b".to_string(), SimArg::Tensor(to_bytes(&b, cfg.dtype))),
        ("BR".to_string(), SimArg::I32(br as i32)),
        ("BC".to_string(), SimArg::I32(bc as i32)),
        ("c".to_string(), SimArg::Tensor(to_bytes(&c, cfg.out))),
        ("N".to_string(), SimArg::I32(n as i32)),
    ];
    let dims = |s: &str| match s {
        "M" => Some(m as i64),
        "N" => Some(n as i64),
        "K" => Some(k as i64),
        _ => None,
    };
    let grid = [0, 1, 2].map(|i| def.grid[i].eval(&dims).unwrap_or(1) as u32);
    let report = run(&prog, grid, &mut args).map_err(|e| e.to_string())?;
    let SimArg::Tensor(cb) = &args[6].1 else { unreachable!() };
    let got = from_bytes(cb, cfg.out);
    let want: Vec<f64> =
        gemm_f64(&a, &b, m, n, k, cfg.b_transposed).into_iter().map(|x| round_to(x, cfg.out)).collect();
    Ok(CheckOutcome {
        case: format!("gemm/{} {m}x{n}x{k}", cfg.key()),
        rel_err: rel_err(&got, &want),
        bound: tol(cfg.out),
        instructions: report.instructions,
    })
}

/// Lowers `def` and runs its whole grid in the simulator; extents come from the `I32`
/// arguments named after them. Tensors are updated in place in `args`.
pub fn simulate(
    def: &kda_dsl::tile::KernelDef,
    args: &mut [(String, SimArg)],
) -> Result<kda_dsl::sim::SimReport, String> {
    let (_, prog) = kda_dsl::lower_kernel(def.clone()).map_err(|e| e.to_string())?;
    let dims = |s: &str| {
        args.iter().find_map(|(n, a)| match a {
            SimArg::I32(v) if n == s => Some(*v as i64),
            _ => None,
        })
    };
    let mut grid = [1u32; 3];
    for (i, g) in grid.iter_mut().enumerate() {
        *g = def.grid[i].eval(&dims).ok_or_else(|| format!("grid axis {i} needs an extent that was not given"))? as u32;
    }
    run(&prog, grid, args).map_err(|e| e.to_string())
}

/// The tensor argument `name` decoded as `dtype`.
pub fn tensor_values(args: &[(String, SimArg)], name: &str, dtype: DType) -> Vec<f64> {
    args.iter()
        .find_map(|(n, a)| match a {
            SimArg::Tensor(b) if n == name => Some(from_bytes(b, dtype)),
            _ => None,
        })
        .unwrap_or_default()
}
