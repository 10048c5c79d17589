//! Validating arguments against a compiled kernel's signature and marshalling them, without
//! allocating.
//!
//! A [`BindPlan`], made once per compiled kernel, resolves every name the binding needs (each
//! tensor dimension's symbol, the assumptions, the grid's extents) to a slot number. Binding a
//! call then looks arguments up by parameter position and fills fixed-size arrays, so a
//! warmed-up launch allocates nothing on its success path; only errors format messages.

use std::ffi::c_void;

use kda_dsl::artifact::{CompiledKernel, ParamSig};
use kda_dsl::dtype::DType;
use kda_dsl::tma_choice::TensorMapSig;

use crate::error::RuntimeError;
use crate::launch::{KernelArg, RawArg, POINTER_ALIGN};
use crate::tensor::{TensorView, MAX_RANK};
use crate::tensor_map::{encode_tensor_map, TensorMapParam};

/// Most parameters (tensors, extents and scalars) a kernel may declare, and most distinct
/// extent symbols it may name.
pub const MAX_PARAMS: usize = 64;

/// Where one tensor dimension's extent goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DimSlot {
    /// A literal extent the kernel was specialized for.
    Literal(i64),
    /// Symbol number `n` of the plan.
    Symbol(usize),
}

/// A kernel's names resolved to slots, made once per compiled kernel ([`BindPlan::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindPlan {
    /// Every extent symbol, numbered by position.
    symbols: Vec<String>,
    /// Per parameter: a tensor's dimensions (the first `rank`), or an extent's symbol number.
    params: Vec<ParamSlots>,
    /// `(symbol, m)`: the extent is a multiple of `m`.
    assumptions: Vec<(usize, u32)>,
    /// `(symbol, v)`: the extent is exactly `v`.
    exact: Vec<(usize, i64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParamSlots {
    Tensor {
        dims: [DimSlot; MAX_RANK],
        rank: usize,
    },
    Dim(usize),
    Scalar,
    /// A tensor map over the tensor parameter at this position.
    TensorMap {
        tensor: usize,
    },
}

/// Most tensor maps a kernel may take.
pub const MAX_TENSOR_MAPS: usize = 4;

impl BindPlan {
    /// Resolves `kernel`'s names; fails for kernels past [`MAX_PARAMS`] parameters or symbols,
    /// tensors of more than [`MAX_RANK`] dimensions, and assumptions about unknown extents.
    pub fn new(kernel: &CompiledKernel) -> Result<BindPlan, RuntimeError> {
        if kernel.params.len() > MAX_PARAMS {
            return Err(RuntimeError::Unsupported(format!(
                "`{}` has {} parameters; at most {MAX_PARAMS} bind",
                kernel.entry,
                kernel.params.len()
            )));
        }
        let mut symbols: Vec<String> = vec![];
        let mut number = |s: &str| match symbols.iter().position(|x| x == s) {
            Some(i) => i,
            None => {
                symbols.push(s.to_owned());
                symbols.len() - 1
            }
        };
        let mut params = Vec::with_capacity(kernel.params.len());
        for p in &kernel.params {
            params.push(match p {
                ParamSig::Tensor { name, dims, .. } => {
                    if dims.len() > MAX_RANK {
                        return Err(RuntimeError::Unsupported(format!(
                            "tensor parameter `{name}` of `{}` has rank {}; at most {MAX_RANK}",
                            kernel.entry,
                            dims.len()
                        )));
                    }
                    let mut slots = [DimSlot::Literal(0); MAX_RANK];
                    for (slot, sym) in slots.iter_mut().zip(dims) {
                        *slot = match sym.parse::<i64>() {
                            Ok(v) => DimSlot::Literal(v),
                            Err(_) => DimSlot::Symbol(number(sym)),
                        };
                    }
                    ParamSlots::Tensor { dims: slots, rank: dims.len() }
                }
                ParamSig::Dim { name } => ParamSlots::Dim(number(name)),
                ParamSig::Scalar { .. } => ParamSlots::Scalar,
                ParamSig::TensorMap(sig) => ParamSlots::TensorMap { tensor: map_tensor(kernel, sig)? },
            });
        }
        let maps = params.iter().filter(|p| matches!(p, ParamSlots::TensorMap { .. })).count();
        if maps > MAX_TENSOR_MAPS {
            return Err(RuntimeError::Unsupported(format!(
                "`{}` takes {maps} tensor maps; at most {MAX_TENSOR_MAPS} bind",
                kernel.entry
            )));
        }
        let known = |s: &str, what: &str| {
            symbols.iter().position(|x| x == s).ok_or_else(|| {
                RuntimeError::Unsupported(format!("`{}` assumes {s} {what}, but {s} is not an extent", kernel.entry))
            })
        };
        let mut assumptions = vec![];
        for (sym, m) in &kernel.assumptions {
            if *m == 0 {
                return Err(RuntimeError::Unsupported(format!("`{}` assumes {sym} is a multiple of 0", kernel.entry)));
            }
            assumptions.push((known(sym, &format!("is a multiple of {m}"))?, *m));
        }
        let mut exact = vec![];
        for (sym, v) in &kernel.exact_extents {
            exact.push((known(sym, &format!("= {v}"))?, *v));
        }
        if symbols.len() > MAX_PARAMS {
            return Err(RuntimeError::Unsupported(format!(
                "`{}` names {} extents; at most {MAX_PARAMS} bind",
                kernel.entry,
                symbols.len()
            )));
        }
        Ok(BindPlan { symbols, params, assumptions, exact })
    }
}

/// The position of the tensor parameter `sig` maps (one axis per axis of its box).
fn map_tensor(kernel: &CompiledKernel, sig: &TensorMapSig) -> Result<usize, RuntimeError> {
    let axes = sig.box_extent.len();
    kernel
        .params
        .iter()
        .position(|p| matches!(p, ParamSig::Tensor { name, dims, .. } if *name == sig.tensor && dims.len() == axes))
        .ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "`{}`: tensor map `{}` maps `{}`, which is no tensor parameter of {axes} axes",
                kernel.entry, sig.name, sig.tensor
            ))
        })
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
    values: [RawArg; MAX_PARAMS],
    len: usize,
    /// Each tensor parameter's position and device, the first `tensors`.
    devices: [(usize, usize); MAX_PARAMS],
    tensors: usize,
    /// The tensor maps [`RawArg::TensorMap`] values number.
    maps: [TensorMapParam; MAX_TENSOR_MAPS],
}

impl BoundArgs {
    /// True when some grid extent is 0.
    pub fn is_empty(&self) -> bool {
        self.grid.contains(&0)
    }

    /// Parameter values in declaration order.
    pub fn values(&self) -> &[RawArg] {
        &self.values[..self.len]
    }

    /// A pointer to each parameter's value, as `cuLaunchKernel`'s parameter array holds them
    /// (valid while `self` is neither moved nor dropped), and how many there are.
    pub fn param_pointers(&mut self) -> ([*mut c_void; MAX_PARAMS], usize) {
        let mut pointers = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (p, v) in pointers.iter_mut().zip(self.values[..self.len].iter_mut()) {
            *p = match v {
                RawArg::U64(v) => (v as *mut u64).cast(),
                RawArg::I32(v) => (v as *mut i32).cast(),
                RawArg::I64(v) => (v as *mut i64).cast(),
                RawArg::F32(v) => (v as *mut f32).cast(),
                RawArg::TensorMap(n) => self.maps[*n].as_param(),
            };
        }
        (pointers, self.len)
    }

    /// Checks every tensor of `kernel` (the kernel these were bound for) lives on device
    /// `ordinal`.
    pub fn check_device(&self, kernel: &CompiledKernel, ordinal: usize) -> Result<(), RuntimeError> {
        match self.devices[..self.tensors].iter().find(|(_, d)| *d != ordinal) {
            None => Ok(()),
            Some((i, d)) => Err(RuntimeError::bad_argument(
                kernel.params[*i].name(),
                format!("a tensor on device {ordinal} (the stream's)"),
                format!("a tensor on device {d}"),
            )),
        }
    }
}

/// Where an extent's value came from.
#[derive(Clone, Copy)]
struct Extent<'a> {
    value: i64,
    /// The argument that supplied it (a tensor, or the `Dim` argument itself).
    from: &'a str,
}

/// Validates `args` against `kernel`'s signature and marshals them in parameter order.
///
/// Tensor parameters need a tensor of the same dtype and rank, 16-byte aligned. Each `Dim` takes
/// its value from the first tensor whose dims name it (all such tensors must agree), else from
/// an `I32` argument of that name. Scalars need an argument of their type. The kernel's
/// divisibility assumptions are checked and its grid evaluated. Resolves the kernel's names
/// first; launchers that bind one kernel often keep its [`BindPlan`] and call [`bind_planned`].
pub fn bind_args(kernel: &CompiledKernel, args: &[(&str, KernelArg)]) -> Result<BoundArgs, RuntimeError> {
    bind_planned(kernel, &BindPlan::new(kernel)?, args)
}

/// [`bind_args`] with `kernel`'s names already resolved (`plan` made from this kernel):
/// allocates nothing unless it fails.
pub fn bind_planned(
    kernel: &CompiledKernel,
    plan: &BindPlan,
    args: &[(&str, KernelArg)],
) -> Result<BoundArgs, RuntimeError> {
    let given = index_args(kernel, args)?;
    let mut extents: [Option<Extent>; MAX_PARAMS] = [None; MAX_PARAMS];
    let mut bound = BoundArgs {
        grid: [0; 3],
        block: [kernel.threads, 1, 1],
        shared_bytes: kernel.shared_bytes,
        values: [RawArg::I32(0); MAX_PARAMS],
        len: kernel.params.len(),
        devices: [(0, 0); MAX_PARAMS],
        tensors: 0,
        maps: [TensorMapParam::ZERO; MAX_TENSOR_MAPS],
    };
    let mut maps = 0;
    for (i, (p, slots)) in kernel.params.iter().zip(&plan.params).enumerate() {
        if let (ParamSig::Tensor { name, dtype, dims, .. }, ParamSlots::Tensor { dims: ds, rank }) = (p, slots) {
            let view = tensor_arg(name, *dtype, dims, given[i])?;
            bind_extents(name, &ds[..*rank], &view, &plan.symbols, &mut extents)?;
            bound.devices[bound.tensors] = (i, view.device());
            bound.tensors += 1;
        }
    }
    for (i, (p, slots)) in kernel.params.iter().zip(&plan.params).enumerate() {
        let arg = given[i];
        bound.values[i] = match (p, slots) {
            (ParamSig::Tensor { .. }, _) => match arg {
                Some(KernelArg::Tensor(view)) => RawArg::U64(view.ptr()),
                _ => return Err(missing(p.name(), "a tensor")),
            },
            (ParamSig::Dim { name }, ParamSlots::Dim(sym)) => RawArg::I32(dim_arg(name, *sym, arg, &mut extents)?),
            (ParamSig::Scalar { name, dtype }, _) => scalar_arg(name, *dtype, arg)?,
            (ParamSig::TensorMap(sig), _) if arg.is_some() => {
                return Err(RuntimeError::bad_argument(
                    &sig.name,
                    format!("no argument: the runtime makes the map over `{}`", sig.tensor),
                    "an argument",
                ));
            }
            // Encoded below, once the extents are known to meet the kernel's assumptions.
            (ParamSig::TensorMap(_), _) => {
                maps += 1;
                RawArg::TensorMap(maps - 1)
            }
            (ParamSig::Dim { .. }, _) => unreachable!("the plan was made from this kernel"),
        };
    }
    check_assumptions(kernel, plan, &extents)?;
    for (p, (slots, value)) in kernel.params.iter().zip(plan.params.iter().zip(bound.values)) {
        if let (ParamSig::TensorMap(sig), ParamSlots::TensorMap { tensor }, RawArg::TensorMap(n)) = (p, slots, value) {
            let Some(KernelArg::Tensor(view)) = given[*tensor] else { unreachable!("the tensor was bound above") };
            // An empty tensor has no box to copy: its map stays zero, never read (no block
            // runs, or none issues a box).
            if view.numel() > 0 {
                bound.maps[n] = tensor_map_arg(sig, view)?;
            }
        }
    }
    bound.grid = eval_grid(kernel, plan, &extents)?;
    if kernel.threads == 0 {
        return Err(RuntimeError::Unsupported(format!("`{}` has 0 threads", kernel.entry)));
    }
    Ok(bound)
}

/// The tensor map `sig` over `view` (its tensor), encoded for this launch; an error names the
/// tensor when the hardware would not take the map.
fn tensor_map_arg(sig: &TensorMapSig, view: &TensorView) -> Result<TensorMapParam, RuntimeError> {
    let shape = view.shape();
    let mut extent = [0u64; kda_dsl::tensor_map::MAX_TENSOR_MAP_RANK];
    if shape.len() > extent.len() {
        return Err(RuntimeError::bad_argument(&sig.tensor, "a tensor of at most 5 axes", format!("{shape:?}")));
    }
    // Inner axis first, as the map numbers them.
    for (e, s) in extent.iter_mut().zip(shape.iter().rev()) {
        *e = *s as u64;
    }
    let map = sig.map(&extent[..shape.len()]).ok_or_else(|| {
        RuntimeError::bad_argument(&sig.tensor, format!("{} axes", sig.box_extent.len()), format!("{shape:?}"))
    })?;
    encode_tensor_map(&sig.tensor, &map, view.ptr(), view.size_bytes() as u64)
}

/// The arguments by parameter position (references: copying them into a table of
/// [`MAX_PARAMS`] would dominate a warm call's binding), rejecting duplicates and names the
/// kernel does not take.
/// Launchers pass arguments in declaration order, so each name is looked for first where the
/// previous one left off.
fn index_args<'a>(
    kernel: &CompiledKernel,
    args: &'a [(&str, KernelArg)],
) -> Result<[Option<&'a KernelArg>; MAX_PARAMS], RuntimeError> {
    let params = &kernel.params;
    let mut given = [None; MAX_PARAMS];
    let mut next = 0;
    for (name, arg) in args {
        let found = (next..params.len()).chain(0..next).find(|&i| params[i].name() == *name);
        let Some(i) = found else {
            let names: Vec<&str> = params.iter().map(ParamSig::name).collect();
            return Err(RuntimeError::bad_argument(
                *name,
                format!("one of the parameters of `{}`: {}", kernel.entry, names.join(", ")),
                "an argument the kernel does not take",
            ));
        };
        if given[i].replace(arg).is_some() {
            return Err(RuntimeError::bad_argument(*name, "one value", "two"));
        }
        next = i + 1;
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

/// Records the extents `view` gives the symbols of its dimensions `dims`, checking agreement.
fn bind_extents<'a>(
    name: &'a str,
    dims: &[DimSlot],
    view: &TensorView,
    symbols: &[String],
    extents: &mut [Option<Extent<'a>>; MAX_PARAMS],
) -> Result<(), RuntimeError> {
    for (axis, (slot, &len)) in dims.iter().zip(view.shape()).enumerate() {
        let got = || format!("shape {:?}", view.shape());
        let value = i64::try_from(len)
            .ok()
            .filter(|v| *v <= i64::from(i32::MAX))
            .ok_or_else(|| RuntimeError::bad_argument(name, "extents that fit in i32", got()))?;
        match *slot {
            // The kernel was specialized for this size.
            DimSlot::Literal(fixed) if fixed != value => {
                return Err(RuntimeError::bad_argument(name, format!("extent {fixed} at axis {axis}"), got()));
            }
            DimSlot::Literal(_) => {}
            DimSlot::Symbol(s) => match extents[s] {
                Some(e) if e.value != value => {
                    let want = format!("{} = {} at axis {axis} (as given by `{}`)", symbols[s], e.value, e.from);
                    return Err(RuntimeError::bad_argument(name, want, got()));
                }
                Some(_) => {}
                None => extents[s] = Some(Extent { value, from: name }),
            },
        }
    }
    Ok(())
}

/// The value of a `Dim` parameter: from the tensors, else from an explicit `I32` argument.
fn dim_arg<'a>(
    name: &'a str,
    sym: usize,
    arg: Option<&KernelArg>,
    extents: &mut [Option<Extent<'a>>; MAX_PARAMS],
) -> Result<i32, RuntimeError> {
    let want = "an i32 extent >= 0, or a tensor argument whose dims name it";
    let value = match (extents[sym], arg) {
        (Some(e), None) => e.value,
        (Some(e), Some(KernelArg::I32(v))) if i64::from(*v) == e.value => e.value,
        (Some(e), Some(other)) => {
            let want = format!("{} (as given by `{}`), or no argument", e.value, e.from);
            return Err(RuntimeError::bad_argument(name, want, describe(other)));
        }
        (None, Some(KernelArg::I32(v))) if *v >= 0 => {
            extents[sym] = Some(Extent { value: i64::from(*v), from: name });
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

/// Checks the extents the kernel assumes are multiples of some factor, or exactly a value.
fn check_assumptions(
    kernel: &CompiledKernel,
    plan: &BindPlan,
    extents: &[Option<Extent>; MAX_PARAMS],
) -> Result<(), RuntimeError> {
    let unbound = |s: usize, what: String| {
        RuntimeError::Unsupported(format!(
            "`{}` assumes {} {what}, but {} is not an extent",
            kernel.entry, plan.symbols[s], plan.symbols[s]
        ))
    };
    for &(s, m) in &plan.assumptions {
        let e = extents[s].ok_or_else(|| unbound(s, format!("is a multiple of {m}")))?;
        if e.value % i64::from(m) != 0 {
            let sym = &plan.symbols[s];
            return Err(RuntimeError::bad_argument(
                e.from,
                format!("{sym} to be a multiple of {m} (`{}` assumes it)", kernel.entry),
                format!("{sym} = {}", e.value),
            ));
        }
    }
    for &(s, v) in &plan.exact {
        let e = extents[s].ok_or_else(|| unbound(s, format!("= {v}")))?;
        if e.value != v {
            let sym = &plan.symbols[s];
            return Err(RuntimeError::bad_argument(
                e.from,
                format!("{sym} = {v} (`{}` assumes it)", kernel.entry),
                format!("{sym} = {}", e.value),
            ));
        }
    }
    Ok(())
}

/// Evaluates the grid expressions over the bound extents.
fn eval_grid(
    kernel: &CompiledKernel,
    plan: &BindPlan,
    extents: &[Option<Extent>; MAX_PARAMS],
) -> Result<[u32; 3], RuntimeError> {
    let lookup = |n: &str| plan.symbols.iter().position(|s| s == n).and_then(|s| extents[s]).map(|e| e.value);
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
    // A cluster launch runs whole clusters only.
    if !grid[0].is_multiple_of(kernel.cluster_blocks.max(1)) {
        return Err(RuntimeError::Unsupported(format!(
            "grid axis 0 of `{}` evaluates to {} blocks, not a multiple of its clusters of {}",
            kernel.entry, grid[0], kernel.cluster_blocks
        )));
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
