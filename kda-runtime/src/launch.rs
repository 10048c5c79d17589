//! Validating arguments against a compiled kernel's signature and launching it.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::{result, CudaStream};
use kda_dsl::artifact::{CompiledKernel, ParamSig};
use kda_dsl::dtype::DType;

use crate::cache::{LoadedKernel, ModuleCache};
use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};
use crate::tensor::TensorView;

/// Alignment every tensor's address must have (the widest vector access kernels make).
pub const POINTER_ALIGN: u64 = 16;

/// One kernel argument, passed by parameter name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A tensor, for a `Tensor` parameter.
    Tensor(TensorView),
    /// An `i32` scalar, or the value of a `Dim` parameter no tensor names.
    I32(i32),
    /// An `i64` scalar.
    I64(i64),
    /// An `f32` scalar.
    F32(f32),
}

/// A parameter value as `cuLaunchKernel` receives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawArg {
    /// A device pointer.
    U64(u64),
    /// A `.s32` value (extents and `i32` scalars).
    I32(i32),
    /// A `.s64` value.
    I64(i64),
    /// A `.f32` value.
    F32(f32),
}

impl RawArg {
    /// The address of the value, as the kernel-parameter array holds it.
    fn as_param(&mut self) -> *mut c_void {
        match self {
            RawArg::U64(v) => (v as *mut u64).cast(),
            RawArg::I32(v) => (v as *mut i32).cast(),
            RawArg::I64(v) => (v as *mut i64).cast(),
            RawArg::F32(v) => (v as *mut f32).cast(),
        }
    }
}

/// A launch, validated and marshalled: everything `cuLaunchKernel` needs except the function.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundArgs {
    /// Grid extents (x, y, z); a 0 means there is nothing to launch.
    pub grid: [u32; 3],
    /// Block extents (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// Parameter values in declaration order.
    pub values: Vec<RawArg>,
    /// Each tensor argument's name and device.
    devices: Vec<(String, usize)>,
}

impl BoundArgs {
    /// True when some grid extent is 0.
    pub fn is_empty(&self) -> bool {
        self.grid.contains(&0)
    }

    /// Checks every tensor lives on device `ordinal`.
    pub fn check_device(&self, ordinal: usize) -> Result<(), RuntimeError> {
        match self.devices.iter().find(|(_, d)| *d != ordinal) {
            None => Ok(()),
            Some((name, d)) => Err(RuntimeError::bad_argument(
                name,
                format!("a tensor on device {ordinal} (the stream's)"),
                format!("a tensor on device {d}"),
            )),
        }
    }
}

/// Where an extent's value came from.
struct Extent {
    value: i64,
    /// The argument that supplied it (a tensor, or the `Dim` argument itself).
    from: String,
}

/// Validates `args` against `kernel`'s signature and marshals them in parameter order.
///
/// Tensor parameters need a tensor of the same dtype and rank, 16-byte aligned. Each `Dim` takes
/// its value from the first tensor whose dims name it (all such tensors must agree), else from
/// an `I32` argument of that name. Scalars need an argument of their type. The kernel's
/// divisibility assumptions are checked and its grid evaluated.
pub fn bind_args(kernel: &CompiledKernel, args: &[(&str, KernelArg)]) -> Result<BoundArgs, RuntimeError> {
    let given = index_args(kernel, args)?;
    let mut extents: HashMap<&str, Extent> = HashMap::new();
    let mut devices = Vec::new();
    for p in &kernel.params {
        if let ParamSig::Tensor { name, dtype, dims, .. } = p {
            let view = tensor_arg(name, *dtype, dims, given.get(name.as_str()))?;
            bind_extents(name, dims, &view, &mut extents)?;
            devices.push((name.clone(), view.device()));
        }
    }
    let mut values = Vec::with_capacity(kernel.params.len());
    for p in &kernel.params {
        let arg = given.get(p.name());
        values.push(match p {
            ParamSig::Tensor { .. } => match arg {
                Some(KernelArg::Tensor(view)) => RawArg::U64(view.ptr()),
                _ => return Err(missing(p.name(), "a tensor")),
            },
            ParamSig::Dim { name } => RawArg::I32(dim_arg(name, arg, &mut extents)?),
            ParamSig::Scalar { name, dtype } => scalar_arg(name, *dtype, arg)?,
        });
    }
    check_assumptions(kernel, &extents)?;
    let grid = eval_grid(kernel, &extents)?;
    if kernel.threads == 0 {
        return Err(RuntimeError::Unsupported(format!("`{}` has 0 threads", kernel.entry)));
    }
    Ok(BoundArgs { grid, block: [kernel.threads, 1, 1], shared_bytes: kernel.shared_bytes, values, devices })
}

/// Validates and launches `kernel` on `stream` with the raw driver call (no per-buffer events
/// are recorded, so the launch can be captured into a CUDA graph). Returns without launching
/// when the grid is empty. The module is loaded through `cache` under `config_key`.
///
/// The tensors behind `args` must stay alive until the kernel has run.
pub fn launch(
    gpu: &Gpu,
    cache: &ModuleCache,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    config_key: &str,
    args: &[(&str, KernelArg)],
) -> Result<(), RuntimeError> {
    let Some(bound) = checked_bind(gpu, stream, kernel, args)? else { return Ok(()) };
    let loaded = cache.get_or_load(gpu, kernel, config_key)?;
    launch_bound(gpu, &loaded, stream, bound)
}

/// [`launch`] of a kernel the caller has already loaded (through the same cache), for launchers
/// that read the loaded module first (its resident-block count).
pub fn launch_loaded(
    gpu: &Gpu,
    loaded: &LoadedKernel,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    args: &[(&str, KernelArg)],
) -> Result<(), RuntimeError> {
    let Some(bound) = checked_bind(gpu, stream, kernel, args)? else { return Ok(()) };
    launch_bound(gpu, loaded, stream, bound)
}

/// `args` bound and checked against the stream's device; `None` when the grid is empty.
fn checked_bind(
    gpu: &Gpu,
    stream: &CudaStream,
    kernel: &CompiledKernel,
    args: &[(&str, KernelArg)],
) -> Result<Option<BoundArgs>, RuntimeError> {
    let bound = bind_args(kernel, args)?;
    gpu.check_stream("stream", stream)?;
    bound.check_device(gpu.ordinal())?;
    Ok((!bound.is_empty()).then_some(bound))
}

/// The raw driver launch of checked arguments.
fn launch_bound(gpu: &Gpu, loaded: &LoadedKernel, stream: &CudaStream, bound: BoundArgs) -> Result<(), RuntimeError> {
    gpu.context().bind_to_thread().op("cuCtxSetCurrent")?;
    let mut values = bound.values;
    let mut params: Vec<*mut c_void> = values.iter_mut().map(RawArg::as_param).collect();
    let [gx, gy, gz] = bound.grid;
    let [bx, by, bz] = bound.block;
    // SAFETY: the function is loaded in the stream's context (same device, primary context);
    // `params` points at `values`, which outlive the call, one slot per declared parameter with
    // the declared width; pointers were checked for device and alignment.
    unsafe {
        result::launch_kernel(
            loaded.cu_function(),
            (gx, gy, gz),
            (bx, by, bz),
            bound.shared_bytes,
            stream.cu_stream(),
            &mut params,
        )
    }
    .op("cuLaunchKernel")
}

/// Maps names to arguments, rejecting duplicates and names the kernel does not take.
fn index_args<'a>(
    kernel: &CompiledKernel,
    args: &'a [(&'a str, KernelArg)],
) -> Result<HashMap<&'a str, KernelArg>, RuntimeError> {
    let mut given = HashMap::with_capacity(args.len());
    for (name, arg) in args {
        if !kernel.params.iter().any(|p| p.name() == *name) {
            let names: Vec<&str> = kernel.params.iter().map(ParamSig::name).collect();
            return Err(RuntimeError::bad_argument(
                *name,
                format!("one of the parameters of `{}`: {}", kernel.entry, names.join(", ")),
                "an argument the kernel does not take",
            ));
        }
        if given.insert(*name, *arg).is_some() {
            return Err(RuntimeError::bad_argument(*name, "one value", "two"));
        }
    }
    Ok(given)
}

/// The tensor for a `Tensor` parameter, checked for dtype, rank and alignment.
fn tensor_arg(name: &str, dtype: DType, dims: &[String], arg: Option<&KernelArg>) -> Result<TensorView, RuntimeError> {
    let want = || format!("a {dtype} tensor of rank {} [{}]", dims.len(), dims.join(", "));
    let view = match arg {
        Some(KernelArg::Tensor(v)) => *v,
        Some(other) => return Err(RuntimeError::bad_argument(name, want(), describe(other))),
        None => return Err(missing(name, &want())),
    };
    if view.dtype() != dtype || view.shape().len() != dims.len() {
        return Err(RuntimeError::bad_argument(name, want(), describe(&KernelArg::Tensor(view))));
    }
    // An empty tensor is never accessed, so any address (often 0) will do for it.
    if view.numel() != 0 && view.ptr() % POINTER_ALIGN != 0 {
        return Err(RuntimeError::bad_argument(
            name,
            format!("a device address aligned to {POINTER_ALIGN} bytes"),
            format!("{:#x}", view.ptr()),
        ));
    }
    if view.ptr() == 0 && view.numel() != 0 {
        return Err(RuntimeError::bad_argument(name, "a non-null address", "null"));
    }
    Ok(view)
}

/// Records the extents `view` gives the symbols in `dims`, checking agreement.
fn bind_extents<'k>(
    name: &str,
    dims: &'k [String],
    view: &TensorView,
    extents: &mut HashMap<&'k str, Extent>,
) -> Result<(), RuntimeError> {
    for (axis, (sym, &len)) in dims.iter().zip(view.shape()).enumerate() {
        let got = || format!("shape {:?}", view.shape());
        let value = i64::try_from(len)
            .ok()
            .filter(|v| *v <= i64::from(i32::MAX))
            .ok_or_else(|| RuntimeError::bad_argument(name, "extents that fit in i32", got()))?;
        // A literal extent: the kernel was specialized for this size.
        if let Ok(fixed) = sym.parse::<i64>() {
            if fixed != value {
                let want = format!("extent {fixed} at axis {axis}");
                return Err(RuntimeError::bad_argument(name, want, got()));
            }
            continue;
        }
        match extents.get(sym.as_str()) {
            Some(e) if e.value != value => {
                let want = format!("{sym} = {} at axis {axis} (as given by `{}`)", e.value, e.from);
                return Err(RuntimeError::bad_argument(name, want, got()));
            }
            Some(_) => {}
            None => {
                extents.insert(sym, Extent { value, from: name.to_owned() });
            }
        }
    }
    Ok(())
}

/// The value of a `Dim` parameter: from the tensors, else from an explicit `I32` argument.
fn dim_arg<'k>(
    name: &'k str,
    arg: Option<&KernelArg>,
    extents: &mut HashMap<&'k str, Extent>,
) -> Result<i32, RuntimeError> {
    let want = "an i32 extent >= 0, or a tensor argument whose dims name it";
    let value = match (extents.get(name), arg) {
        (Some(e), None) => e.value,
        (Some(e), Some(KernelArg::I32(v))) if i64::from(*v) == e.value => e.value,
        (Some(e), Some(other)) => {
            let want = format!("{} (as given by `{}`), or no argument", e.value, e.from);
            return Err(RuntimeError::bad_argument(name, want, describe(other)));
        }
        (None, Some(KernelArg::I32(v))) if *v >= 0 => {
            extents.insert(name, Extent { value: i64::from(*v), from: name.to_owned() });
            i64::from(*v)
        }
        (None, Some(other)) => return Err(RuntimeError::bad_argument(name, want, describe(other))),
        (None, None) => return Err(missing(name, want)),
    };
    // Extents were range-checked when bound.
    i32::try_from(value).map_err(|_| RuntimeError::bad_argument(name, want, value.to_string()))
}

/// The value of a `Scalar` parameter.
fn scalar_arg(name: &str, dtype: DType, arg: Option<&KernelArg>) -> Result<RawArg, RuntimeError> {
    match (dtype, arg) {
        (DType::I32, Some(KernelArg::I32(v))) => Ok(RawArg::I32(*v)),
        (DType::I64, Some(KernelArg::I64(v))) => Ok(RawArg::I64(*v)),
        (DType::F32, Some(KernelArg::F32(v))) => Ok(RawArg::F32(*v)),
        (DType::I32 | DType::I64 | DType::F32, Some(other)) => {
            Err(RuntimeError::bad_argument(name, format!("a {dtype} scalar"), describe(other)))
        }
        (DType::I32 | DType::I64 | DType::F32, None) => Err(missing(name, &format!("a {dtype} scalar"))),
        (other, _) => Err(RuntimeError::Unsupported(format!("scalar parameter `{name}` of type {other}"))),
    }
}

/// Checks the extents the kernel assumes are multiples of some factor.
fn check_assumptions(kernel: &CompiledKernel, extents: &HashMap<&str, Extent>) -> Result<(), RuntimeError> {
    for (sym, m) in &kernel.assumptions {
        let Some(e) = extents.get(sym.as_str()) else {
            return Err(RuntimeError::Unsupported(format!(
                "`{}` assumes {sym} is a multiple of {m}, but {sym} is not an extent",
                kernel.entry
            )));
        };
        if *m == 0 {
            return Err(RuntimeError::Unsupported(format!("`{}` assumes {sym} is a multiple of 0", kernel.entry)));
        }
        if e.value % i64::from(*m) != 0 {
            return Err(RuntimeError::bad_argument(
                &e.from,
                format!("{sym} to be a multiple of {m} (`{}` assumes it)", kernel.entry),
                format!("{sym} = {}", e.value),
            ));
        }
    }
    for (sym, v) in &kernel.exact_extents {
        match extents.get(sym.as_str()) {
            Some(e) if e.value == *v => {}
            Some(e) => {
                return Err(RuntimeError::bad_argument(
                    &e.from,
                    format!("{sym} = {v} (`{}` assumes it)", kernel.entry),
                    format!("{sym} = {}", e.value),
                ))
            }
            None => {
                return Err(RuntimeError::Unsupported(format!(
                    "`{}` assumes {sym} = {v}, but {sym} is not an extent",
                    kernel.entry
                )))
            }
        }
    }
    Ok(())
}

/// Evaluates the grid expressions over the bound extents.
fn eval_grid(kernel: &CompiledKernel, extents: &HashMap<&str, Extent>) -> Result<[u32; 3], RuntimeError> {
    let lookup = |n: &str| extents.get(n).map(|e| e.value);
    let mut grid = [0u32; 3];
    for (axis, expr) in kernel.grid.iter().enumerate() {
        let v = expr.eval(&lookup).ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "grid axis {axis} of `{}` ({expr:?}) names an unknown extent, divides by zero \
                 or overflows",
                kernel.entry
            ))
        })?;
        grid[axis] = u32::try_from(v).map_err(|_| {
            RuntimeError::Unsupported(format!(
                "grid axis {axis} of `{}` evaluates to {v}, outside 0..=u32::MAX",
                kernel.entry
            ))
        })?;
        // CUDA's limits: 2^31 - 1 blocks along x, 65535 along y and z.
        let limit = if axis == 0 { i32::MAX as u32 } else { 65535 };
        if grid[axis] > limit {
            return Err(RuntimeError::Unsupported(format!(
                "grid axis {axis} of `{}` needs {} blocks; CUDA allows at most {limit}",
                kernel.entry, grid[axis]
            )));
        }
    }
    Ok(grid)
}

/// The error for a parameter with no argument.
fn missing(name: &str, want: &str) -> RuntimeError {
    RuntimeError::bad_argument(name, want, "no argument")
}

/// A short description of an argument for messages.
fn describe(arg: &KernelArg) -> String {
    match arg {
        KernelArg::Tensor(v) => format!("a {} tensor of shape {:?}", v.dtype(), v.shape()),
        KernelArg::I32(v) => format!("i32 {v}"),
        KernelArg::I64(v) => format!("i64 {v}"),
        KernelArg::F32(v) => format!("f32 {v}"),
    }
}
