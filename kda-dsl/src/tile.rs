//! The tile IR: what a `#[kernel]` builds. Block-level statements over tiles; every value
//! outside a `parallel` body is uniform across the block.

use crate::artifact::HostExpr;
use crate::cache_policy::CachePolicy;
use crate::diag::SrcLoc;
use crate::dtype::DType;
pub use crate::handle::{Arena, Id, IdVec};
use std::fmt;

/// Handle of a kernel parameter in [`KernelDef::params`].
pub type ParamId = Id<Param>;
/// Handle of a buffer in [`KernelDef::buffers`].
pub type BufId = Id<Buffer>;
/// Handle of a scalar variable in [`KernelDef::vars`].
pub type VarId = Id<Var>;

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// A global tensor, row-major and contiguous, with symbolic extents.
    Tensor {
        /// Name in the source.
        name: String,
        /// Element type.
        dtype: DType,
        /// Extents, outermost first, as indices of `Dim` params.
        dims: Vec<ParamId>,
        /// Declared writable (`GlobalMut`).
        writes: bool,
    },
    /// A tensor extent, passed as `.s32`.
    Dim {
        /// Its symbol.
        name: String,
    },
    /// A scalar passed by value.
    Scalar {
        /// Name in the source.
        name: String,
        /// `F32`, `I32` or `I64`.
        dtype: DType,
    },
}

impl Param {
    /// The parameter's name.
    pub fn name(&self) -> &str {
        match self {
            Param::Tensor { name, .. } | Param::Dim { name } | Param::Scalar { name, .. } => name,
        }
    }
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Shared memory of the block.
    Shared,
    /// Registers spread over the block's threads (layout inferred).
    Fragment,
    /// Registers private to each thread: every thread holds the whole tile.
    Local,
}

/// A tile allocation.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    /// Name in the source.
    pub name: String,
    /// Storage.
    pub scope: Scope,
    /// Extents (1-D or 2-D).
    pub shape: Vec<u32>,
    /// Element type.
    pub dtype: DType,
    /// Where it was declared.
    pub loc: SrcLoc,
    /// For a 2-D fragment no `gemm` touches: the lanes along each row of its register layout
    /// (4, the default, or 32; `FragmentLayout::lanes_per_row`). Other tiles ignore it.
    pub lanes_per_row: u32,
}

impl Buffer {
    /// Number of elements.
    pub fn numel(&self) -> u32 {
        self.shape.iter().product()
    }
}

/// A scalar variable: a block-uniform `let`, a loop counter, a block index or an element index.
#[derive(Clone, Debug, PartialEq)]
pub struct Var {
    /// Name in the source.
    pub name: String,
    /// Value type (`I32`, `I64`, `F32` or `Bool`).
    pub dtype: DType,
}

/// Unary operators and math functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// `-x`.
    Neg,
    /// `!x` (booleans).
    Not,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// `2^x`.
    Exp2,
    /// Natural logarithm.
    Log,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x > 20 ? x : ln(1 + e^x)`.
    Softplus,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `sqrt(x)`.
    Sqrt,
}

/// Binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/` (integers round toward zero)
    Div,
    /// `%`
    Rem,
    /// minimum
    Min,
    /// maximum
    Max,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `&&`
    And,
    /// `||`
    Or,
}

impl BinOp {
    /// True for comparisons (their result is `Bool`).
    pub fn is_compare(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }
}

/// A scalar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An integer constant; `None` adapts to the other operand's type (else `I32`).
    Int(i64, Option<DType>),
    /// A floating-point constant (`F32`).
    Float(f64),
    /// A boolean constant.
    Bool(bool),
    /// A `Dim` parameter's value (`I32`).
    Dim(ParamId),
    /// A `Scalar` parameter's value.
    Scalar(ParamId),
    /// A variable.
    Var(VarId),
    /// A read of one global tensor element at run-time indices (one per axis).
    Load(ParamId, Vec<Expr>),
    /// A read of one tile element (inside `parallel`, or any element of a local/shared tile).
    Elem(BufId, Vec<Expr>),
    /// A unary operator or math function.
    Unary(UnOp, Box<Expr>),
    /// A binary operator.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `cond ? a : b`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// A conversion; to `F16`/`BF16` it rounds and the value stays a float.
    Cast(DType, Box<Expr>),
}

impl Expr {
    /// Calls `f` on each tile the expression reads an element of, at any depth (once per read).
    pub fn for_each_elem_tile(&self, f: &mut impl FnMut(BufId)) {
        self.for_each_elem_read(&mut |b, _| f(b));
    }

    /// Calls `f` on each variable the expression reads, at any depth (once per read).
    pub fn for_each_var(&self, f: &mut impl FnMut(VarId)) {
        if let Expr::Var(v) = self {
            f(*v);
        }
        self.for_each_operand(&mut |e| e.for_each_var(f));
    }

    /// Calls `f` on each tile element read of the expression, with its indices, at any depth
    /// (once per read; a read inside another's index after it).
    pub fn for_each_elem_read(&self, f: &mut impl FnMut(BufId, &[Expr])) {
        if let Expr::Elem(b, idx) = self {
            f(*b, idx);
        }
        self.for_each_operand(&mut |e| e.for_each_elem_read(f));
    }

    /// Calls `f` on each expression one level down: a read's indices, an operator's operands.
    fn for_each_operand(&self, f: &mut impl FnMut(&Expr)) {
        match self {
            Expr::Elem(_, idx) | Expr::Load(_, idx) => idx.iter().for_each(f),
            Expr::Unary(_, a) | Expr::Cast(_, a) => f(a),
            Expr::Binary(_, a, b) => {
                f(a);
                f(b);
            }
            Expr::Select(c, a, b) => {
                f(c);
                f(a);
                f(b);
            }
            Expr::Int(..) | Expr::Float(_) | Expr::Bool(_) | Expr::Dim(_) | Expr::Scalar(_) | Expr::Var(_) => {}
        }
    }
}

impl Stmt {
    /// Calls `f` on every statement nested in this one (loops' and warp groups' bodies, both
    /// arms of an `if`), at any depth, not on this one.
    pub fn for_each_nested<'a>(&'a self, f: &mut impl FnMut(&'a Stmt)) {
        for body in self.bodies() {
            visit_stmts(body, f);
        }
    }

    /// The bodies one level down: a loop's, a `parallel`'s, a warp group's or a producer
    /// block's (and an empty one), both arms of an `if`; two empty ones for the others.
    pub fn bodies(&self) -> [&[Stmt]; 2] {
        match &self.kind {
            StmtKind::For { body, .. }
            | StmtKind::Parallel { body, .. }
            | StmtKind::WarpGroup { body, .. }
            | StmtKind::Producer(body) => [body, &[]],
            StmtKind::If(_, t, e) => [t, e],
            _ => [&[], &[]],
        }
    }

    /// Calls `f` on each expression of the statement itself (values, indices, bounds,
    /// conditions, a copy's box), not of the statements nested in it.
    pub fn for_each_expr(&self, f: &mut impl FnMut(&Expr)) {
        match &self.kind {
            StmtKind::Assign(_, e) | StmtKind::Fill(_, e) => f(e),
            StmtKind::Store(_, idx, e) | StmtKind::StoreGlobal(_, idx, e) => {
                idx.iter().for_each(&mut *f);
                f(e);
            }
            StmtKind::For { start, end, .. } => {
                f(start);
                f(end);
            }
            StmtKind::If(c, ..) => f(c),
            StmtKind::Copy { src, dst } => src.index_exprs().chain(dst.index_exprs()).for_each(f),
            StmtKind::Prefetch(r) => r.index_exprs().for_each(f),
            _ => {}
        }
    }
}

/// One side of a `copy`.
#[derive(Clone, Debug, PartialEq)]
pub enum Region {
    /// A box of a global tensor: element offsets per axis and extents per axis (axes of extent 1
    /// are dropped when matched against a tile). Elements at or past `bound` (per axis; the
    /// tensor's extent when `None`) are masked: reads give 0, writes are skipped.
    Global {
        /// The tensor.
        tensor: ParamId,
        /// First element, per axis.
        offset: Vec<Expr>,
        /// Extents, per axis.
        shape: Vec<u32>,
        /// Exclusive upper bounds per axis, replacing the tensor's extents for masking.
        bound: Option<Vec<Expr>>,
        /// L2 policy of the box's loads, stores and `cp.async` copies (`.streaming()`: evict
        /// first).
        cache: CachePolicy,
        /// Fragment stores into the box write whole 128-byte lines per warp instruction
        /// (`.whole_lines()`).
        whole_lines: bool,
    },
    /// A whole tile.
    Buf(BufId),
}

/// Calls `f` on every statement of `body` and of the bodies nested in it (loops, `parallel`,
/// warp groups, both arms of an `if`), each statement before the ones inside it.
pub fn visit_stmts<'a>(body: &'a [Stmt], f: &mut impl FnMut(&'a Stmt)) {
    for s in body {
        f(s);
        s.for_each_nested(f);
    }
}

impl Region {
    /// The run-time expressions the region is indexed by: a box's offsets and bounds (none for
    /// a whole tile).
    pub fn index_exprs(&self) -> impl Iterator<Item = &Expr> {
        let (offset, bound): (&[Expr], Option<&Vec<Expr>>) = match self {
            Region::Global { offset, bound, .. } => (offset, bound.as_ref()),
            Region::Buf(_) => (&[], None),
        };
        offset.iter().chain(bound.into_iter().flatten())
    }
}

/// A `gemm` operand: a tile, possibly transposed.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    /// The tile.
    pub buf: BufId,
    /// Read as its transpose.
    pub transposed: bool,
    /// A left operand every warp reads whole (`tile.replicated()`): a shared `[r, k]` tile
    /// multiplies into each warp's `r` accumulator rows, so the warps of a block (split over
    /// rows only) each compute the same `r x n` product, an mma operand without a copy per warp.
    pub replicated: bool,
}

/// Loop kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopKind {
    /// A run-time loop.
    Serial,
    /// Unrolled when lowered (bounds must be constants).
    Unroll,
    /// A run-time loop whose global-to-shared copies run `stages - 1` iterations ahead.
    Pipelined {
        /// Number of shared-memory stages.
        stages: u32,
        /// What the barriers inside the body wait for of the next stages' fills.
        barriers: BodyBarriers,
    },
}

impl LoopKind {
    /// A pipelined loop of `stages` stages whose body's barriers wait for every copy.
    pub const fn pipelined(stages: u32) -> LoopKind {
        LoopKind::Pipelined { stages, barriers: BodyBarriers::WaitForFills }
    }
}

/// What the barriers inside a `pipelined` loop's body wait for of the `cp.async` copies in
/// flight, the next stages' fills among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyBarriers {
    /// Every copy in flight, the next stages' fills included: each body's first barrier then
    /// waits for the fill just issued. Where other blocks share the SM their work covers the
    /// wait, and in decode this measured the faster (`docs/performance.md`).
    WaitForFills,
    /// None: the fills stay in flight until the top of the iteration that reads them, so a
    /// block alone on its SM keeps computing meanwhile. The body may issue no other
    /// global-to-shared copy (those would need the wait).
    LeaveFillsInFlight,
}

/// Reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
}

/// A statement with the kernel line it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    /// What it does.
    pub kind: StmtKind,
    /// Where it was written.
    pub loc: SrcLoc,
}

/// Statement kinds.
#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// Defines or reassigns a scalar variable.
    Assign(VarId, Expr),
    /// Copies between global regions, shared tiles and fragments (with a cast when dtypes differ).
    Copy {
        /// Source.
        src: Region,
        /// Destination.
        dst: Region,
    },
    /// `c += a · b` on tensor cores.
    Gemm {
        /// Left operand `[M, K]` (after its transpose).
        a: Operand,
        /// Right operand `[K, N]` (after its transpose).
        b: Operand,
        /// Accumulator `[M, N]`, an f32 fragment.
        c: BufId,
    },
    /// Sets every element of a tile.
    Fill(BufId, Expr),
    /// Element-wise loop over a tile's index space, spread over threads as the tile's layout says.
    Parallel {
        /// The tile whose index space is iterated.
        over: BufId,
        /// One index variable per axis.
        vars: Vec<VarId>,
        /// Element statements (`Store`, `Assign`, `If`, `For`).
        body: Vec<Stmt>,
    },
    /// Stores one tile element (inside `parallel`, or any element of a local tile).
    Store(BufId, Vec<Expr>, Expr),
    /// Stores one global tensor element (inside `parallel`).
    StoreGlobal(ParamId, Vec<Expr>, Expr),
    /// A loop `for var in start..end`.
    For {
        /// Counter.
        var: VarId,
        /// Kind.
        kind: LoopKind,
        /// First value.
        start: Expr,
        /// End (exclusive).
        end: Expr,
        /// Body.
        body: Vec<Stmt>,
    },
    /// A run-time branch.
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    /// Warp specialization: only warps `first .. first + count` run `body`, concurrently with the
    /// rest of the block; tiles used in it belong to the group (spread over its warps), and its
    /// barriers are the named barrier `id` over the group's threads.
    WarpGroup {
        /// First warp.
        first: u32,
        /// Warps in the group.
        count: u32,
        /// Named barrier id (1-based; 0 is the block's).
        id: u32,
        /// Holds the warp index within the group.
        var: VarId,
        /// What the group runs.
        body: Vec<Stmt>,
    },
    /// Reduces `src` along `axis` into `dst` (one axis fewer).
    Reduce {
        /// Operator.
        op: ReduceOp,
        /// 2-D source tile.
        src: BufId,
        /// 1-D destination tile.
        dst: BufId,
        /// Reduced axis.
        axis: usize,
    },
    /// Inclusive prefix sum of `src` along `axis` into `dst` (same shape).
    Cumsum {
        /// Source tile.
        src: BufId,
        /// Destination tile (may be `src`).
        dst: BufId,
        /// Scanned axis.
        axis: usize,
    },
    /// Completes a reduction fused into a `parallel` (by `fuse_reductions`): `dst`, a row
    /// (axis 1) or column (axis 0) vector, holds per-lane partials; afterwards, the totals.
    ReduceLanes {
        /// Operator.
        op: ReduceOp,
        /// The vector fragment.
        dst: BufId,
        /// Reduced axis of the parent tile.
        axis: usize,
    },
    /// Completes a vector-to-one-value reduction fused into a `parallel` over `vector` (by
    /// `fuse_reductions`): `dst`, a local `[1]`, holds this thread's partial over the elements
    /// it holds; afterwards, the total.
    ReduceVectorLanes {
        /// Operator.
        op: ReduceOp,
        /// The local `[1]` tile.
        dst: BufId,
        /// The vector fragment whose distribution the partials follow.
        vector: BufId,
    },
    /// Shows a tile in the simulator (no code on the GPU).
    Print(BufId),
    /// Asks L2 to fetch a global box ahead of its use (`prefetch.global.L2`, one per 128-byte
    /// line; masked like a copy). No data moves into the block and nothing waits for it.
    Prefetch(Region),
    /// A block barrier (`bar.sync`); inserted by `insert_barriers`, never written by authors.
    Barrier,
    /// The producer's part of a `pipelined` loop's body (`for _ in producer() { .. }`): what it
    /// computes from the stage's fills into shared tiles for the rest of the body. Its meaning
    /// is its statements written in its place; `passes::place_producers` checks its rules and
    /// decides where it runs (on the fill warps, a step ahead, it stays in the body).
    Producer(Vec<Stmt>),
}

/// A kernel as the front end builds it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelDef {
    /// Entry name.
    pub name: String,
    /// Parameters, in declaration order (dims appended as first seen).
    pub params: Arena<Param>,
    /// Threads per block.
    pub threads: u32,
    /// Blocks that must fit on one SM at once (`.minnctapersm`): caps registers per thread.
    pub min_blocks_per_sm: Option<u32>,
    /// Warps added to the block's `threads` that issue the stage fills of `pipelined` loops
    /// (and pass the block's barriers), and run a loop's producer block one iteration ahead
    /// (`place_producers`); the `threads` run everything else. A warp's instructions issue in
    /// order, so fills on warps of their own take their address arithmetic off the compute
    /// warps' path.
    pub fill_warps: u32,
    /// Registers a thread of the fill warpgroups keeps once the roles part on sm_90a
    /// (`launch(.., producer_registers = n)`, `setmaxnreg.dec`; a multiple of 8 from 24 to
    /// 256): what a producer block that computes needs, which only its author knows. The
    /// compute warpgroups take the rest (`lower/register_plan.rs`). Without it, fill warps
    /// that only issue TMA boxes keep a small fixed count and a computing producer keeps what
    /// every thread has.
    pub producer_registers: Option<u32>,
    /// Which loop-invariant instructions move out of the kernel's loops (`lower/hoist.rs`).
    pub hoist: Hoist,
    /// The narrowest accumulator (N, its columns) a `gemm` takes `wgmma` for on sm_90a
    /// (`launch(.., wgmma_min_n = n)`, a multiple of 8 up to 256; 8, every width, by
    /// default): a narrower one takes `mma.sync` (`gemm_choice.rs`, `NoWgmma::Narrow`). A
    /// `wgmma` of few columns does little work for its fixed cost (descriptors, fences, the
    /// wait), which the kernel may judge too high.
    pub wgmma_min_n: u32,
    /// Blocks a thread-block cluster (`launch(.., cluster = n)`, `.reqnctapercluster n, 1, 1`;
    /// 1 to 8, 1 for none): the grid's x extent comes in clusters of `n` consecutive blocks,
    /// which the device runs at once on one GPC (sm_90). The launcher refuses a grid whose x
    /// extent it does not divide.
    pub cluster_blocks: u32,
    /// Grid extents.
    pub grid: [HostExpr; 3],
    /// Variables holding the block index per grid axis.
    pub block_vars: [Option<VarId>; 3],
    /// Tiles.
    pub buffers: Arena<Buffer>,
    /// Scalars.
    pub vars: Arena<Var>,
    /// Extents assumed to be multiples of a number (param id, multiple).
    pub assumptions: Vec<(ParamId, u32)>,
    /// Extents assumed to be exactly a value (param id, value).
    pub exact_extents: Vec<(ParamId, i64)>,
    /// The body.
    pub body: Vec<Stmt>,
    /// Where the kernel was declared.
    pub loc: SrcLoc,
}

/// `wgmma`'s narrowest N, and [`KernelDef::wgmma_min_n`]'s default: every width takes it.
pub const WGMMA_MIN_N: u32 = 8;

/// Which loop-invariant thread-IR instructions move before their loop (`launch(.., hoist =
/// ..)`). A moved value is computed once instead of every iteration, and stays in a register
/// across the loop: how many registers a thread has to spare is the kernel's to judge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Hoist {
    /// None: each value is computed where it is used.
    #[default]
    Nothing,
    /// Those computed from parameters, block indices, constants, the shared base and loads
    /// from such addresses, not from the thread index: ptxas keeps most of them in uniform
    /// registers, beside the thread's own. (A value written under a branch on a per-thread
    /// condition counts as such too; it costs a register, never a wrong value.)
    BlockUniform,
    /// Every value that does not change across the loop but f32 ones (integers, predicates,
    /// packed halves), per-thread addresses included.
    Everything,
}

impl Hoist {
    /// Its name in the kernel's text form.
    pub fn name(self) -> &'static str {
        match self {
            Hoist::Nothing => "nothing",
            Hoist::BlockUniform => "block_uniform",
            Hoist::Everything => "everything",
        }
    }

    /// The setting named `name` in the kernel's text form.
    pub fn named(name: &str) -> Option<Hoist> {
        [Hoist::Nothing, Hoist::BlockUniform, Hoist::Everything].into_iter().find(|h| h.name() == name)
    }
}

/// The most fill warps a kernel takes ([`KernelDef::fill_warps`]): two warpgroups, which a
/// producer block runs as two producer groups (`place_producers`).
pub const FILL_WARPS_MAX: u32 = 8;

impl KernelDef {
    /// Threads the block is launched with: `threads` and the fill warps.
    pub fn launched_threads(&self) -> u32 {
        self.threads + 32 * self.fill_warps
    }

    /// A kernel named `name` with nothing in it yet (no threads, a grid of one block).
    pub fn empty(name: &str, loc: SrcLoc) -> KernelDef {
        KernelDef {
            name: name.to_string(),
            params: Arena::new(),
            threads: 0,
            min_blocks_per_sm: None,
            fill_warps: 0,
            producer_registers: None,
            hoist: Hoist::Nothing,
            wgmma_min_n: WGMMA_MIN_N,
            cluster_blocks: 1,
            grid: [HostExpr::Const(1), HostExpr::Const(1), HostExpr::Const(1)],
            block_vars: [None; 3],
            buffers: Arena::new(),
            vars: Arena::new(),
            assumptions: vec![],
            exact_extents: vec![],
            body: vec![],
            loc,
        }
    }

    /// The largest multiple that extent `dim` is assumed to have (1 when none).
    pub fn multiple_of(&self, dim: ParamId) -> u32 {
        let exact = self.exact_extent(dim).and_then(|v| u32::try_from(v).ok()).unwrap_or(1);
        self.assumptions.iter().filter(|(p, _)| *p == dim).map(|(_, m)| *m).max().unwrap_or(1).max(exact)
    }

    /// The value extent `dim` is assumed to have, if any.
    pub fn exact_extent(&self, dim: ParamId) -> Option<i64> {
        self.exact_extents.iter().find(|(p, _)| *p == dim).map(|(_, v)| *v)
    }
}

// ---------------------------------------------------------------------------------------------
// Display: a stable text form for snapshots and `KDA_DUMP`.

impl fmt::Display for KernelDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {}(", self.name)?;
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            match p {
                Param::Tensor { name, dtype, dims, writes } => {
                    let dims: Vec<_> = dims.iter().map(|d| self.params[*d].name()).collect();
                    let m = if *writes { "mut " } else { "" };
                    write!(f, "{name}: {m}{dtype}[{}]", dims.join(", "))?
                }
                Param::Dim { name } => write!(f, "{name}: dim")?,
                Param::Scalar { name, dtype } => write!(f, "{name}: {dtype}")?,
            }
        }
        let min_blocks = self.min_blocks_per_sm.map(|m| format!(" min_blocks={m}")).unwrap_or_default();
        let fill_warps = if self.fill_warps > 0 { format!(" fill_warps={}", self.fill_warps) } else { String::new() };
        let producer = self.producer_registers.map(|n| format!(" producer_registers={n}")).unwrap_or_default();
        let hoist = if self.hoist == Hoist::Nothing { String::new() } else { format!(" hoist={}", self.hoist.name()) };
        let wgmma_min_n =
            if self.wgmma_min_n == WGMMA_MIN_N { String::new() } else { format!(" wgmma_min_n={}", self.wgmma_min_n) };
        let cluster = if self.cluster_blocks > 1 { format!(" cluster={}", self.cluster_blocks) } else { String::new() };
        writeln!(
            f,
            ") threads={}{min_blocks}{fill_warps}{producer}{hoist}{wgmma_min_n}{cluster} grid=[{}, {}, {}] {{",
            self.threads,
            host(&self.grid[0]),
            host(&self.grid[1]),
            host(&self.grid[2])
        )?;
        // Every variable's type, and the block indices: what the statements below leave out.
        if !self.vars.is_empty() {
            let vars: Vec<_> = self.vars.iter_ids().map(|(id, v)| format!("{}#{id}: {}", v.name, v.dtype)).collect();
            writeln!(f, "  vars {}", vars.join(", "))?;
        }
        if self.block_vars.iter().any(Option::is_some) {
            let bv: Vec<_> = self
                .block_vars
                .iter()
                .map(|v| v.map(|v| format!("{}#{v}", self.vars[v].name)).unwrap_or_else(|| "_".into()))
                .collect();
            writeln!(f, "  block_vars [{}]", bv.join(", "))?;
        }
        for (p, m) in &self.assumptions {
            writeln!(f, "  assume {} % {m} == 0", self.params[*p].name())?;
        }
        for (p, v) in &self.exact_extents {
            writeln!(f, "  assume {} == {v}", self.params[*p].name())?;
        }
        for b in &self.buffers {
            let shape: Vec<_> = b.shape.iter().map(|s| s.to_string()).collect();
            let lanes =
                if b.lanes_per_row == 4 { String::new() } else { format!(" lanes_per_row={}", b.lanes_per_row) };
            writeln!(f, "  {} = {:?}<{}>[{}]{lanes}", b.name, b.scope, b.dtype, shape.join(", "))?;
        }
        for s in &self.body {
            self.fmt_stmt(f, s, 1)?;
        }
        writeln!(f, "}}")
    }
}

fn host(e: &HostExpr) -> String {
    match e {
        HostExpr::Const(c) => c.to_string(),
        HostExpr::Dim(d) => d.clone(),
        HostExpr::Add(a, b) => format!("({} + {})", host(a), host(b)),
        HostExpr::Mul(a, b) => format!("({} * {})", host(a), host(b)),
        HostExpr::CeilDiv(a, b) => format!("ceil_div({}, {})", host(a), host(b)),
        HostExpr::Div(a, b) => format!("({} / {})", host(a), host(b)),
    }
}

impl KernelDef {
    /// Formats an expression with names.
    pub fn expr_str(&self, e: &Expr) -> String {
        let list = |v: &[Expr]| v.iter().map(|x| self.expr_str(x)).collect::<Vec<_>>().join(", ");
        match e {
            Expr::Int(v, Some(t)) => format!("{v}{t}"),
            Expr::Int(v, None) => v.to_string(),
            Expr::Float(v) => format!("{v:?}"),
            Expr::Bool(b) => b.to_string(),
            Expr::Dim(p) | Expr::Scalar(p) => self.params[*p].name().to_string(),
            Expr::Var(v) => format!("{}#{}", self.vars[*v].name, v),
            Expr::Load(p, idx) => format!("{}[{}]", self.params[*p].name(), list(idx)),
            Expr::Elem(b, idx) => format!("{}[{}]", self.buffers[*b].name, list(idx)),
            Expr::Unary(op, a) => format!("{}({})", format!("{op:?}").to_lowercase(), self.expr_str(a)),
            Expr::Binary(op, a, b) => format!("({} {:?} {})", self.expr_str(a), op, self.expr_str(b)),
            Expr::Select(c, a, b) => {
                format!("select({}, {}, {})", self.expr_str(c), self.expr_str(a), self.expr_str(b))
            }
            Expr::Cast(t, a) => format!("{}({})", t, self.expr_str(a)),
        }
    }

    fn region_str(&self, r: &Region) -> String {
        match r {
            Region::Buf(b) => self.buffers[*b].name.clone(),
            Region::Global { tensor, offset, shape, bound, cache, whole_lines } => {
                let off: Vec<_> = offset.iter().map(|e| self.expr_str(e)).collect();
                let shp: Vec<_> = shape.iter().map(|s| s.to_string()).collect();
                let mut s = format!("{}[{}; {}]", self.params[*tensor].name(), off.join(", "), shp.join("x"));
                if let Some(b) = bound {
                    let b: Vec<_> = b.iter().map(|e| self.expr_str(e)).collect();
                    s += &format!(" bound [{}]", b.join(", "));
                }
                if *cache == CachePolicy::EvictFirst {
                    s += " streaming";
                }
                if *whole_lines {
                    s += " whole_lines";
                }
                s
            }
        }
    }

    fn fmt_stmt(&self, f: &mut fmt::Formatter<'_>, s: &Stmt, depth: usize) -> fmt::Result {
        let pad = "  ".repeat(depth);
        let name = |b: &BufId| self.buffers[*b].name.clone();
        let block = |f: &mut fmt::Formatter<'_>, body: &[Stmt]| -> fmt::Result {
            for s in body {
                self.fmt_stmt(f, s, depth + 1)?;
            }
            writeln!(f, "{pad}}}")
        };
        match &s.kind {
            StmtKind::Assign(v, e) => writeln!(f, "{pad}{}#{} = {}", self.vars[*v].name, v, self.expr_str(e)),
            StmtKind::Copy { src, dst } => {
                writeln!(f, "{pad}copy {} -> {}", self.region_str(src), self.region_str(dst))
            }
            StmtKind::Gemm { a, b, c } => {
                let t = |o: &Operand| {
                    format!(
                        "{}{}{}",
                        name(&o.buf),
                        if o.transposed { ".T" } else { "" },
                        if o.replicated { ".replicated" } else { "" }
                    )
                };
                writeln!(f, "{pad}gemm {} x {} += {}", t(a), t(b), name(c))
            }
            StmtKind::Fill(b, e) => writeln!(f, "{pad}fill {} = {}", name(b), self.expr_str(e)),
            StmtKind::Parallel { over, vars, body } => {
                let vs: Vec<_> = vars.iter().map(|v| format!("{}#{}", self.vars[*v].name, v)).collect();
                writeln!(f, "{pad}parallel ({}) over {} {{", vs.join(", "), name(over))?;
                block(f, body)
            }
            StmtKind::Store(b, idx, e) => {
                let idx: Vec<_> = idx.iter().map(|x| self.expr_str(x)).collect();
                writeln!(f, "{pad}{}[{}] = {}", name(b), idx.join(", "), self.expr_str(e))
            }
            StmtKind::StoreGlobal(p, idx, e) => {
                let idx: Vec<_> = idx.iter().map(|x| self.expr_str(x)).collect();
                writeln!(f, "{pad}{}[{}] = {}", self.params[*p].name(), idx.join(", "), self.expr_str(e))
            }
            StmtKind::For { var, kind, start, end, body } => {
                let k = match kind {
                    LoopKind::Serial => "serial".to_string(),
                    LoopKind::Unroll => "unroll".to_string(),
                    LoopKind::Pipelined { stages, barriers: BodyBarriers::WaitForFills } => {
                        format!("pipelined(stages={stages})")
                    }
                    LoopKind::Pipelined { stages, barriers: BodyBarriers::LeaveFillsInFlight } => {
                        format!("pipelined(stages={stages}, fills_in_flight)")
                    }
                };
                writeln!(
                    f,
                    "{pad}for {}#{} in {k} {}..{} {{",
                    self.vars[*var].name,
                    var,
                    self.expr_str(start),
                    self.expr_str(end)
                )?;
                block(f, body)
            }
            StmtKind::If(c, t, e) => {
                writeln!(f, "{pad}if {} {{", self.expr_str(c))?;
                for s in t {
                    self.fmt_stmt(f, s, depth + 1)?;
                }
                if !e.is_empty() {
                    writeln!(f, "{pad}}} else {{")?;
                }
                block(f, e)
            }
            StmtKind::Reduce { op, src, dst, axis } => {
                writeln!(f, "{pad}reduce_{:?} {} -> {} axis={axis}", op, name(src), name(dst))
            }
            StmtKind::Cumsum { src, dst, axis } => {
                writeln!(f, "{pad}cumsum {} -> {} axis={axis}", name(src), name(dst))
            }
            StmtKind::ReduceLanes { op, dst, axis } => {
                writeln!(f, "{pad}reduce_lanes_{:?} {} axis={axis}", op, name(dst))
            }
            StmtKind::ReduceVectorLanes { op, dst, vector } => {
                writeln!(f, "{pad}reduce_vector_lanes_{:?} {} over {}", op, name(dst), name(vector))
            }
            StmtKind::Print(b) => writeln!(f, "{pad}print {}", name(b)),
            StmtKind::Prefetch(r) => writeln!(f, "{pad}prefetch {}", self.region_str(r)),
            StmtKind::WarpGroup { first, count, id, var, body } => {
                let v = &self.vars[*var].name;
                writeln!(f, "{pad}warp_group#{id} warps {first}..{} ({v}#{var}) {{", first + count)?;
                block(f, body)
            }
            StmtKind::Barrier => writeln!(f, "{pad}barrier"),
            StmtKind::Producer(body) => {
                writeln!(f, "{pad}producer {{")?;
                block(f, body)
            }
        }
    }
}
