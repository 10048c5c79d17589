//! `gemm`: the validated entry point for the DSL's tiled GEMM.

use cudarc::driver::CudaStream;
use kda_dsl::DType;
use kda_kernels::gemm::GemmConfig;

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::{launch, KernelArg};
use crate::tensor::TensorView;

fn bad(name: &str, expected: impl Into<String>, got: impl Into<String>) -> RuntimeError {
    RuntimeError::bad_argument(name, expected, got)
}

/// Picks the shipped GEMM variant for these operand types and shapes.
pub fn gemm_variant(
    dtype: DType,
    out: DType,
    b_transposed: bool,
    k: usize,
    n: usize,
) -> Result<kda_kernels::Variant, RuntimeError> {
    gemm_config(dtype, out, b_transposed, k, n).map(kda_kernels::gemm_variant)
}

/// The shipped GEMM config for these operand types and shapes.
fn gemm_config(dtype: DType, out: DType, b_transposed: bool, k: usize, n: usize) -> Result<GemmConfig, RuntimeError> {
    let aligned = k.is_multiple_of(8) && n.is_multiple_of(8);
    kda_kernels::gemm_configs()
        .into_iter()
        .find(|c: &GemmConfig| {
            c.dtype == dtype && c.out == out && c.b_transposed == b_transposed && c.aligned == aligned
        })
        .ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "no shipped gemm variant for {dtype} inputs, {out} output, b_transposed = {b_transposed}"
            ))
        })
}

/// Checks `gemm`'s arguments and picks its variant; `None` when there is nothing to compute
/// (M or N is 0). Pure host code: every rule is testable without a GPU.
pub fn plan_gemm(
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
) -> Result<Option<kda_kernels::Variant>, RuntimeError> {
    Ok(check_gemm(a, b, c, b_transposed)?.map(kda_kernels::gemm_variant))
}

/// `plan_gemm`'s checks, giving the config (no variant name is formatted on the launch path).
fn check_gemm(
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
) -> Result<Option<GemmConfig>, RuntimeError> {
    for (name, t) in [("a", a), ("b", b), ("c", c)] {
        if t.shape().len() != 2 {
            return Err(bad(name, "a 2-D tensor", format!("shape {:?}", t.shape())));
        }
    }
    if !a.dtype().is_half() {
        return Err(bad("a", "bf16 or f16", a.dtype().name()));
    }
    if b.dtype() != a.dtype() {
        return Err(bad("b", format!("{} (a's dtype)", a.dtype()), b.dtype().name()));
    }
    if c.dtype() != DType::F32 && c.dtype() != a.dtype() {
        return Err(bad("c", format!("f32 or {}", a.dtype()), c.dtype().name()));
    }
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (bk, n) = if b_transposed { (b.shape()[1], b.shape()[0]) } else { (b.shape()[0], b.shape()[1]) };
    if bk != k {
        let want = if b_transposed { format!("[N, {k}]") } else { format!("[{k}, N]") };
        return Err(bad("b", want, format!("{:?}", b.shape())));
    }
    if c.shape() != [m, n] {
        return Err(bad("c", format!("[{m}, {n}]"), format!("{:?}", c.shape())));
    }
    for (name, v) in [("M", m), ("N", n), ("K", k)] {
        if v > i32::MAX as usize {
            return Err(bad(name, "an extent below 2^31", v.to_string()));
        }
    }
    if m == 0 || n == 0 {
        return Ok(None);
    }
    gemm_config(a.dtype(), c.dtype(), b_transposed, k, n).map(Some)
}

/// `c = a · b` (`b` is `[K, N]`) or `a · bᵀ` (`b_transposed`, `b` is `[N, K]`) on `stream`.
/// `a`, `b`: bf16 or f16 (the same); `c`: f32 or the input type. Allocates nothing.
pub fn gemm(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
) -> Result<(), RuntimeError> {
    let Some(cfg) = check_gemm(a, b, c, b_transposed)? else {
        return Ok(());
    };
    let ready = kernels.gemm(&cfg)?;
    launch(
        gpu,
        &kernels.modules,
        stream,
        &ready.kernel,
        &ready.id,
        &[("a", KernelArg::Tensor(*a)), ("b", KernelArg::Tensor(*b)), ("c", KernelArg::Tensor(*c))],
    )
}
