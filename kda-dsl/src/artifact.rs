//! What compilation hands to a runtime: PTX text plus everything needed to launch it.

use crate::dtype::DType;
use crate::tma_choice::TensorMapSig;

/// One parameter of a compiled kernel, in the order the PTX entry declares them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSig {
    /// A device pointer to a global tensor's first element (`.u64`).
    Tensor {
        /// The parameter's name in the kernel source.
        name: String,
        /// Element type the kernel was specialized for.
        dtype: DType,
        /// Symbolic extents, outermost first (names of [`ParamSig::Dim`] parameters).
        dims: Vec<String>,
        /// True when the kernel writes through this pointer.
        writes: bool,
    },
    /// A tensor extent (`.s32`), named after its symbol (`M`, `K`, ...).
    Dim {
        /// The symbol.
        name: String,
    },
    /// A scalar value passed by value.
    Scalar {
        /// The parameter's name in the kernel source.
        name: String,
        /// Its type (`F32`, `I32` or `I64`).
        dtype: DType,
    },
    /// A TMA tensor map the compiler added (128 bytes by value): the runtime encodes it at each
    /// launch over the tensor argument it names ([`TensorMapSig::map`]); callers never pass it.
    TensorMap(TensorMapSig),
}

impl ParamSig {
    /// The parameter's name.
    pub fn name(&self) -> &str {
        match self {
            ParamSig::Tensor { name, .. } | ParamSig::Dim { name } | ParamSig::Scalar { name, .. } => name,
            ParamSig::TensorMap(sig) => &sig.name,
        }
    }
}

/// An integer expression over the kernel's extents, evaluated on the host to size the grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostExpr {
    /// A constant.
    Const(i64),
    /// The value of a `Dim` parameter.
    Dim(String),
    /// `a + b`.
    Add(Box<HostExpr>, Box<HostExpr>),
    /// `a * b`.
    Mul(Box<HostExpr>, Box<HostExpr>),
    /// `ceil(a / b)`.
    CeilDiv(Box<HostExpr>, Box<HostExpr>),
    /// `a / b`, rounding toward zero.
    Div(Box<HostExpr>, Box<HostExpr>),
}

impl HostExpr {
    /// Evaluates the expression, looking extents up with `dim`; `None` when a name is unknown
    /// or a division by zero occurs.
    pub fn eval(&self, dim: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        Some(match self {
            HostExpr::Const(c) => *c,
            HostExpr::Dim(n) => dim(n)?,
            HostExpr::Add(a, b) => a.eval(dim)?.checked_add(b.eval(dim)?)?,
            HostExpr::Mul(a, b) => a.eval(dim)?.checked_mul(b.eval(dim)?)?,
            HostExpr::CeilDiv(a, b) => {
                let (a, b) = (a.eval(dim)?, b.eval(dim)?);
                if b == 0 {
                    return None;
                }
                (a + b - 1).div_euclid(b)
            }
            HostExpr::Div(a, b) => {
                let (a, b) = (a.eval(dim)?, b.eval(dim)?);
                a.checked_div(b)?
            }
        })
    }
}

/// A kernel compiled for one target: the PTX module and how to launch its entry point.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    /// Name of the `.entry` in the PTX.
    pub entry: String,
    /// The PTX module text.
    pub ptx: String,
    /// Parameters in declaration order.
    pub params: Vec<ParamSig>,
    /// Threads per block (one dimension).
    pub threads: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// Grid extents (x, y, z) as expressions over the `Dim` parameters.
    pub grid: [HostExpr; 3],
    /// Divisibility the kernel assumes of extents (`(name, m)`: the extent is a multiple of m);
    /// a launcher must check these before launching.
    pub assumptions: Vec<(String, u32)>,
    /// Extents the kernel assumes to be exactly a value (`(name, value)`); checked the same way.
    pub exact_extents: Vec<(String, i64)>,
    /// Blocks a thread-block cluster along x (`.reqnctapercluster`; 1: none): the grid's x
    /// extent must be a multiple, which the launcher checks.
    pub cluster_blocks: u32,
}
