//! `gemm`: the validated entry point for the DSL's tiled GEMM.

use cudarc::driver::CudaStream;
use kda_dsl::{DType, Target};
use kda_kernels::gemm::GemmConfig;

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::{launch, KernelArg};
use crate::tensor::TensorView;

fn bad(name: &str, expected: impl Into<String>, got: impl Into<String>) -> RuntimeError {
    RuntimeError::bad_argument(name, expected, got)
}

/// Picks the shipped GEMM variant for these operand types and shapes on `target`.
pub fn gemm_variant(
    dtype: DType,
    out: DType,
    b_transposed: bool,
    k: usize,
    n: usize,
    target: Target,
) -> Result<kda_kernels::Variant, RuntimeError> {
    gemm_config(dtype, out, b_transposed, k, n, target).map(|(c, t)| kda_kernels::gemm_variant_on(c, t))
}

/// The shipped GEMM config for these operand types and shapes on a device of `target`, and the
/// target it is compiled for: on sm_90a the `wgmma` configs for aligned shapes (rows of
/// 16-byte multiples, as TMA needs), the sm_80 configs otherwise.
fn gemm_config(
    dtype: DType,
    out: DType,
    b_transposed: bool,
    k: usize,
    n: usize,
    target: Target,
) -> Result<(GemmConfig, Target), RuntimeError> {
    let aligned = k.is_multiple_of(8) && n.is_multiple_of(8);
    let fits =
        |c: &GemmConfig| c.dtype == dtype && c.out == out && c.b_transposed == b_transposed && c.aligned == aligned;
    let hopper = (target == Target::Sm90a)
        .then(|| kda_kernels::hopper_gemm_configs().into_iter().find(fits).map(|c| (c, Target::Sm90a)))
        .flatten();
    let sm80 = || kda_kernels::gemm_configs().into_iter().find(fits).map(|c| (c, Target::Sm80));
    hopper.or_else(sm80).ok_or_else(|| {
        RuntimeError::Unsupported(format!(
            "no shipped gemm variant for {dtype} inputs, {out} output, b_transposed = {b_transposed}"
        ))
    })
}

/// Checks `gemm`'s arguments and picks its variant for `target` (what
/// [`crate::DeviceLimits::target`] gives for the device); `None` when there is nothing to
/// compute (M or N is 0). Pure host code: every rule is testable without a GPU.
pub fn plan_gemm(
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
    target: Target,
) -> Result<Option<kda_kernels::Variant>, RuntimeError> {
    Ok(check_gemm(a, b, c, b_transposed, target)?.map(|(cfg, t)| kda_kernels::gemm_variant_on(cfg, t)))
}

/// `plan_gemm`'s checks, giving the config (no variant name is formatted on the launch path).
fn check_gemm(
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
    target: Target,
) -> Result<Option<(GemmConfig, Target)>, RuntimeError> {
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
    gemm_config(a.dtype(), c.dtype(), b_transposed, k, n, target).map(Some)
}

/// `c = a · b` (`b` is `[K, N]`) or `a · bᵀ` (`b_transposed`, `b` is `[N, K]`) on `stream`.
/// `a`, `b`: bf16 or f16 (the same); `c`: f32 or the input type. Allocates nothing. Takes the
/// device's target ([`crate::DeviceLimits::target`]): `wgmma` on compute capability 9.0.
pub fn gemm(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
) -> Result<(), RuntimeError> {
    gemm_on(gpu, kernels, stream, a, b, c, b_transposed, gpu.limits().target()?)
}

/// [`gemm`] with the variant picked for `target`: sm_80 runs on every supported device, sm_90a
/// only on compute capability 9.0 (otherwise an error naming `gpu`).
#[allow(clippy::too_many_arguments)] // gemm's arguments and the target
pub fn gemm_on(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    a: &TensorView,
    b: &TensorView,
    c: &TensorView,
    b_transposed: bool,
    target: Target,
) -> Result<(), RuntimeError> {
    let Some((cfg, compiled_for)) = check_gemm(a, b, c, b_transposed, target)? else {
        return Ok(());
    };
    let ready = kernels.gemm(&cfg, compiled_for)?;
    launch(
        gpu,
        &kernels.modules,
        stream,
        &ready.kernel,
        &ready.id,
        &[("a", KernelArg::Tensor(*a)), ("b", KernelArg::Tensor(*b)), ("c", KernelArg::Tensor(*c))],
    )
}
