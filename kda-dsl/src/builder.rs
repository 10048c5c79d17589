//! The API `#[kernel]` expands to: it records a [`KernelDef`] as the kernel body runs on the
//! host. Config values are plain Rust values here, so a loop over them unrolls and a branch on
//! them vanishes. Kernel authors do not call this directly.

use crate::artifact::HostExpr;
use crate::cache_policy::CachePolicy;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::tile::*;
use std::cell::RefCell;

/// A scalar value of the kernel (uniform, or per element inside `parallel`).
#[derive(Clone, Debug, PartialEq)]
pub struct Val(pub Expr);

macro_rules! val_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Val {
            fn from(v: $t) -> Val { Val(Expr::Int(v as i64, None)) }
        }
    )*};
}
val_from_int!(i8, i16, i32, i64, u8, u16, u32, u64, usize, isize);

impl From<f32> for Val {
    fn from(v: f32) -> Val {
        Val(Expr::Float(v as f64))
    }
}
impl From<f64> for Val {
    fn from(v: f64) -> Val {
        Val(Expr::Float(v))
    }
}
impl From<bool> for Val {
    fn from(v: bool) -> Val {
        Val(Expr::Bool(v))
    }
}
impl From<&Val> for Val {
    fn from(v: &Val) -> Val {
        v.clone()
    }
}

impl Val {
    /// A binary operation.
    pub fn bin(op: BinOp, a: impl Into<Val>, b: impl Into<Val>) -> Val {
        Val(Expr::Binary(op, Box::new(a.into().0), Box::new(b.into().0)))
    }
    /// A unary operation or math function.
    pub fn un(op: UnOp, a: impl Into<Val>) -> Val {
        Val(Expr::Unary(op, Box::new(a.into().0)))
    }
    /// `cond ? a : b`.
    pub fn select(c: impl Into<Val>, a: impl Into<Val>, b: impl Into<Val>) -> Val {
        Val(Expr::Select(Box::new(c.into().0), Box::new(a.into().0), Box::new(b.into().0)))
    }
    /// A conversion.
    pub fn cast(a: impl Into<Val>, to: DType) -> Val {
        Val(Expr::Cast(to, Box::new(a.into().0)))
    }
}

/// A host integer usable as a tile extent or a grid term.
pub trait HostInt: Copy {
    /// The value as i64.
    fn to_i64(self) -> i64;
}
macro_rules! host_int {
    ($($t:ty),*) => {$( impl HostInt for $t { fn to_i64(self) -> i64 { self as i64 } } )*};
}
host_int!(i32, i64, u32, u64, usize);

/// A host integer a kernel may leave out: an integer, or an `Option` of one (`None` leaves the
/// setting at its default).
pub trait OptionalHostInt: Copy {
    /// The value as i64, if any.
    fn to_option(self) -> Option<i64>;
}
impl<T: HostInt> OptionalHostInt for T {
    fn to_option(self) -> Option<i64> {
        Some(self.to_i64())
    }
}
impl<T: HostInt> OptionalHostInt for Option<T> {
    fn to_option(self) -> Option<i64> {
        self.map(HostInt::to_i64)
    }
}

/// A grid expression (host side), built from extents and config values.
#[derive(Clone, Debug, PartialEq)]
pub struct Host(pub HostExpr);

impl Host {
    /// A constant.
    pub fn int(v: impl HostInt) -> Host {
        Host(HostExpr::Const(v.to_i64()))
    }
    /// `ceil(a / b)`.
    pub fn ceil_div(a: Host, b: Host) -> Host {
        Host(HostExpr::CeilDiv(Box::new(a.0), Box::new(b.0)))
    }
}

impl std::ops::Add for Host {
    type Output = Host;
    fn add(self, b: Host) -> Host {
        Host(HostExpr::Add(Box::new(self.0), Box::new(b.0)))
    }
}
impl std::ops::Sub for Host {
    type Output = Host;
    fn sub(self, b: Host) -> Host {
        self + Host(HostExpr::Mul(Box::new(HostExpr::Const(-1)), Box::new(b.0)))
    }
}
impl std::ops::Mul for Host {
    type Output = Host;
    fn mul(self, b: Host) -> Host {
        Host(HostExpr::Mul(Box::new(self.0), Box::new(b.0)))
    }
}
impl std::ops::Div for Host {
    type Output = Host;
    fn div(self, b: Host) -> Host {
        Host(HostExpr::Div(Box::new(self.0), Box::new(b.0)))
    }
}

/// A global tensor parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its parameter index.
    pub id: ParamId,
    /// Its rank.
    pub rank: usize,
    /// Its element type.
    pub dtype: DType,
}

impl Tensor {
    /// The element type (for `shared([..], a.dtype())`).
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// A tile allocation (shared, fragment or local).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// Its buffer index.
    pub id: BufId,
    /// Its element type.
    pub dtype: DType,
}

impl Tile {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// This tile read as its transpose (a `gemm` operand).
    pub fn t(&self) -> Operand {
        Operand { buf: self.id, transposed: true, replicated: false }
    }
    /// This shared tile as a `gemm` left operand that every warp reads whole: with an
    /// accumulator split over rows only, each warp's rows are `tile · b` (see
    /// [`Operand::replicated`]).
    pub fn replicated(&self) -> Operand {
        Operand { buf: self.id, transposed: false, replicated: true }
    }
}

/// Anything `copy` accepts on either side.
pub trait IntoRegion {
    /// The region.
    fn into_region(self) -> Region;
}
impl IntoRegion for Region {
    fn into_region(self) -> Region {
        self
    }
}
impl IntoRegion for &Tile {
    fn into_region(self) -> Region {
        Region::Buf(self.id)
    }
}
impl IntoRegion for Tile {
    fn into_region(self) -> Region {
        Region::Buf(self.id)
    }
}

/// Anything `gemm` accepts as an operand.
pub trait IntoOperand {
    /// The operand.
    fn into_operand(self) -> Operand;
}
impl IntoOperand for Operand {
    fn into_operand(self) -> Operand {
        self
    }
}
impl IntoOperand for &Tile {
    fn into_operand(self) -> Operand {
        Operand { buf: self.id, transposed: false, replicated: false }
    }
}
impl IntoOperand for Tile {
    fn into_operand(self) -> Operand {
        Operand { buf: self.id, transposed: false, replicated: false }
    }
}

enum Frame {
    Root,
    For { var: VarId, kind: LoopKind, start: Expr, end: Expr, loc: SrcLoc },
    Parallel { over: BufId, vars: Vec<VarId>, loc: SrcLoc },
    Then { cond: Expr, loc: SrcLoc },
    Else { cond: Expr, then: Vec<Stmt>, loc: SrcLoc },
    WarpGroup { first: u32, count: u32, id: u32, var: VarId, loc: SrcLoc },
    Producer { loc: SrcLoc },
}

struct State {
    def: KernelDef,
    frames: Vec<(Frame, Vec<Stmt>)>,
    errors: Vec<Diag>,
    launched: bool,
    parallel_depth: usize,
    warp_groups: u32,
}

/// Records a kernel definition; the `#[kernel]` expansion drives it.
pub struct KernelBuilder {
    st: RefCell<State>,
}

impl KernelBuilder {
    /// Starts a kernel named `name`.
    pub fn new(name: &str, loc: SrcLoc) -> KernelBuilder {
        let def = KernelDef::empty(name, loc);
        KernelBuilder {
            st: RefCell::new(State {
                def,
                frames: vec![(Frame::Root, vec![])],
                errors: vec![],
                launched: false,
                parallel_depth: 0,
                warp_groups: 0,
            }),
        }
    }

    fn error(&self, loc: SrcLoc, msg: impl Into<String>) {
        self.st.borrow_mut().errors.push(Diag::new(loc, msg));
    }

    fn push(&self, kind: StmtKind, loc: SrcLoc) {
        let mut st = self.st.borrow_mut();
        st.frames.last_mut().expect("frame stack is never empty").1.push(Stmt { kind, loc });
    }

    fn dim_id(&self, name: &str) -> ParamId {
        let mut st = self.st.borrow_mut();
        if let Some(i) = st.def.params.position(|p| matches!(p, Param::Dim { name: n } if n == name)) {
            return i;
        }
        st.def.params.push(Param::Dim { name: name.to_string() })
    }

    /// Declares a global tensor parameter with symbolic extents.
    pub fn tensor(&self, name: &str, dims: &[&str], dtype: DType, writes: bool) -> Tensor {
        let dims: Vec<ParamId> = dims.iter().map(|d| self.dim_id(d)).collect();
        let mut st = self.st.borrow_mut();
        let rank = dims.len();
        let id = st.def.params.push(Param::Tensor { name: name.to_string(), dtype, dims, writes });
        Tensor { id, rank, dtype }
    }

    /// The value of an extent symbol.
    pub fn dim(&self, name: &str) -> Val {
        Val(Expr::Dim(self.dim_id(name)))
    }

    /// An extent symbol as a grid term.
    pub fn host_dim(&self, name: &str) -> Host {
        self.dim_id(name);
        Host(HostExpr::Dim(name.to_string()))
    }

    /// Declares a scalar parameter.
    pub fn scalar(&self, name: &str, dtype: DType) -> Val {
        let mut st = self.st.borrow_mut();
        Val(Expr::Scalar(st.def.params.push(Param::Scalar { name: name.to_string(), dtype })))
    }

    fn new_var(&self, name: &str, dtype: DType) -> VarId {
        let mut st = self.st.borrow_mut();
        st.def.vars.push(Var { name: name.to_string(), dtype })
    }

    /// `launch(grid = [x, y, z], threads = n)`: returns the block index per grid axis.
    pub fn launch(&self, grid: Vec<Host>, threads: impl HostInt, loc: SrcLoc) -> Vec<Val> {
        let threads = threads.to_i64();
        if self.st.borrow().launched {
            self.error(loc, "`launch` may appear only once per kernel");
        }
        if let Some(m) = crate::passes::check_types::threads_error(threads) {
            self.error(loc, m);
        }
        if grid.is_empty() || grid.len() > 3 {
            self.error(loc, format!("grid has {} axes; expected 1 to 3", grid.len()));
        }
        let names = ["bx", "by", "bz"];
        let mut out = vec![];
        for (i, g) in grid.into_iter().take(3).enumerate() {
            let v = self.new_var(names[i], DType::I32);
            let mut st = self.st.borrow_mut();
            st.def.grid[i] = g.0;
            st.def.block_vars[i] = Some(v);
            out.push(Val(Expr::Var(v)));
        }
        let mut st = self.st.borrow_mut();
        st.def.threads = threads.clamp(0, 1024) as u32;
        st.launched = true;
        out
    }

    /// `launch(.., min_blocks = n)`: at least `n` blocks must fit on one SM at once, so the
    /// assembler keeps registers per thread low enough (occupancy for memory-bound kernels).
    pub fn min_blocks_per_sm(&self, n: impl HostInt, loc: SrcLoc) {
        match u32::try_from(n.to_i64()) {
            Ok(v) if (1..=32).contains(&v) => self.st.borrow_mut().def.min_blocks_per_sm = Some(v),
            _ => self.error(loc, format!("min_blocks = {}: expected 1 to 32", n.to_i64())),
        }
    }

    /// `launch(.., fill_warps = n)`: `n` more warps that issue the stage fills of `pipelined`
    /// loops and run their producer blocks ([`crate::tile::KernelDef::fill_warps`]); 0 to
    /// [`crate::tile::FILL_WARPS_MAX`].
    pub fn fill_warps(&self, n: impl HostInt, loc: SrcLoc) {
        match u32::try_from(n.to_i64()) {
            Ok(v) if v <= crate::tile::FILL_WARPS_MAX => self.st.borrow_mut().def.fill_warps = v,
            _ => self.error(loc, format!("fill_warps = {}: expected 0 to {}", n.to_i64(), crate::tile::FILL_WARPS_MAX)),
        }
    }

    /// `launch(.., producer_registers = n)`: the registers a thread of the fill warpgroups keeps
    /// once the roles part ([`crate::tile::KernelDef::producer_registers`]); a multiple of 8
    /// from 24 to 256 (`setmaxnreg`'s range), or `None` for the default.
    pub fn producer_registers(&self, n: impl OptionalHostInt, loc: SrcLoc) {
        let Some(n) = n.to_option() else { return };
        match u32::try_from(n) {
            Ok(v) if v.is_multiple_of(8) && (24..=256).contains(&v) => {
                self.st.borrow_mut().def.producer_registers = Some(v)
            }
            _ => self.error(loc, format!("producer_registers = {n}: expected a multiple of 8 from 24 to 256")),
        }
    }

    /// `launch(.., hoist = h)`: which loop-invariant instructions move before their loop
    /// ([`crate::tile::Hoist`]).
    pub fn hoist(&self, h: crate::tile::Hoist) {
        self.st.borrow_mut().def.hoist = h;
    }

    /// `launch(.., wgmma_min_n = n)`: the narrowest accumulator a `gemm` takes `wgmma` for
    /// ([`crate::tile::KernelDef::wgmma_min_n`]); a multiple of 8 from 8 to 256.
    pub fn wgmma_min_n(&self, n: impl HostInt, loc: SrcLoc) {
        match u32::try_from(n.to_i64()) {
            Ok(v) if v.is_multiple_of(8) && (8..=256).contains(&v) => self.st.borrow_mut().def.wgmma_min_n = v,
            _ => self.error(loc, format!("wgmma_min_n = {}: expected a multiple of 8 from 8 to 256", n.to_i64())),
        }
    }

    /// `launch(.., cluster = n)`: the grid's blocks in thread-block clusters of `n` along x
    /// ([`crate::tile::KernelDef::cluster_blocks`]); 1 to 8, the clusters every sm_90 device
    /// runs (16 needs a non-portable opt-in).
    pub fn cluster_blocks(&self, n: impl HostInt, loc: SrcLoc) {
        match u32::try_from(n.to_i64()) {
            Ok(v) if (1..=8).contains(&v) => self.st.borrow_mut().def.cluster_blocks = v,
            _ => self.error(loc, format!("cluster = {}: expected 1 to 8 blocks", n.to_i64())),
        }
    }

    /// Assumes extent `dim` is exactly `v`; launchers check it, copies drop the masks it makes
    /// unnecessary.
    pub fn assume_extent(&self, dim: &Val, v: impl HostInt, loc: SrcLoc) {
        match &dim.0 {
            Expr::Dim(p) if v.to_i64() > 0 => self.st.borrow_mut().def.exact_extents.push((*p, v.to_i64())),
            Expr::Dim(_) => self.error(loc, format!("assume_extent: {} is not a positive extent", v.to_i64())),
            _ => self.error(loc, "assume_extent: the first argument must be an extent symbol"),
        }
    }

    /// Assumes extent `dim` is a multiple of `m`; launchers check it, copies use it to vectorize.
    pub fn assume_multiple(&self, dim: &Val, m: impl HostInt, loc: SrcLoc) {
        let m = m.to_i64();
        match (&dim.0, u32::try_from(m)) {
            (Expr::Dim(p), Ok(m)) if m > 0 => self.st.borrow_mut().def.assumptions.push((*p, m)),
            (Expr::Dim(_), _) => self.error(loc, format!("assume_multiple: {m} is not a positive u32")),
            _ => self.error(loc, "assume_multiple: the first argument must be an extent symbol"),
        }
    }

    fn alloc(&self, name: &str, scope: Scope, shape: &[i64], dtype: DType, loc: SrcLoc) -> Tile {
        let mut dims = vec![];
        for &s in shape {
            match u32::try_from(s) {
                Ok(v) if v > 0 => dims.push(v),
                _ => self.error(loc, format!("tile `{name}`: extent {s} is not a positive integer")),
            }
        }
        if shape.is_empty() || shape.len() > 2 {
            self.error(loc, format!("tile `{name}` has {} axes; tiles have 1 or 2", shape.len()));
        }
        if dtype == DType::Bool {
            self.error(loc, format!("tile `{name}`: bool tiles are not supported"));
        }
        let mut st = self.st.borrow_mut();
        let id =
            st.def.buffers.push(Buffer { name: name.to_string(), scope, shape: dims, dtype, loc, lanes_per_row: 4 });
        Tile { id, dtype }
    }

    /// `shared([r, c], dtype)`.
    pub fn shared(&self, name: &str, shape: &[i64], dtype: DType, loc: SrcLoc) -> Tile {
        self.alloc(name, Scope::Shared, shape, dtype, loc)
    }
    /// `fragment([r, c], dtype)`.
    pub fn fragment(&self, name: &str, shape: &[i64], dtype: DType, loc: SrcLoc) -> Tile {
        self.alloc(name, Scope::Fragment, shape, dtype, loc)
    }
    /// `fragment([r, c], dtype, lanes_per_row = n)`: a 2-D fragment whose register layout puts
    /// `n` lanes along each row: 4 (as `fragment`) or 32 (a row across the warp, 2-row atoms;
    /// for element-wise tiles with few rows per warp).
    pub fn fragment_lanes(&self, name: &str, shape: &[i64], dtype: DType, lanes_per_row: i64, loc: SrcLoc) -> Tile {
        let t = self.alloc(name, Scope::Fragment, shape, dtype, loc);
        if !matches!(lanes_per_row, 4 | 32) || shape.len() != 2 {
            self.error(
                loc,
                format!("fragment `{name}`: lanes_per_row is 4 or 32, for a 2-D fragment (got {lanes_per_row})"),
            );
        } else {
            self.st.borrow_mut().def.buffers[t.id].lanes_per_row = lanes_per_row as u32;
        }
        t
    }
    /// `local([n], dtype)`.
    pub fn local(&self, name: &str, shape: &[i64], dtype: DType, loc: SrcLoc) -> Tile {
        self.alloc(name, Scope::Local, shape, dtype, loc)
    }

    /// `t.tile([i, j], [r, c])`: the box of tile index (i, j) with extents (r, c).
    pub fn tile(&self, t: &Tensor, index: Vec<Val>, shape: &[i64], loc: SrcLoc) -> Region {
        let offset = index.into_iter().zip(shape).map(|(i, s)| Val::bin(BinOp::Mul, i, *s).0).collect();
        self.region(t, offset, shape, loc)
    }

    /// `t.tile_at([r0, c0], [r, c])`: the box starting at element (r0, c0).
    pub fn tile_at(&self, t: &Tensor, offset: Vec<Val>, shape: &[i64], loc: SrcLoc) -> Region {
        self.region(t, offset.into_iter().map(|v| v.0).collect(), shape, loc)
    }

    fn region(&self, t: &Tensor, offset: Vec<Expr>, shape: &[i64], loc: SrcLoc) -> Region {
        if offset.len() != t.rank || shape.len() != t.rank {
            self.error(
                loc,
                format!(
                    "the tensor has {} axes; the box gives {} offsets and {} extents",
                    t.rank,
                    offset.len(),
                    shape.len()
                ),
            );
        }
        let mut dims = vec![];
        for &s in shape {
            match u32::try_from(s) {
                Ok(v) if v > 0 => dims.push(v),
                _ => self.error(loc, format!("box extent {s} is not a positive integer")),
            }
        }
        Region::Global {
            tensor: t.id,
            offset,
            shape: dims,
            bound: None,
            cache: CachePolicy::Normal,
            whole_lines: false,
        }
    }

    /// `region.bounded([e0, e1, ..])`: masks elements at or past `e` per axis.
    pub fn bounded(&self, mut r: Region, bound: Vec<Val>, loc: SrcLoc) -> Region {
        match &mut r {
            Region::Global { offset, bound: b, .. } => {
                if bound.len() != offset.len() {
                    self.error(loc, format!("bounded: {} bounds for a box of {} axes", bound.len(), offset.len()));
                }
                *b = Some(bound.into_iter().map(|v| v.0).collect());
            }
            Region::Buf(_) => self.error(loc, "bounded applies to a box of a global tensor"),
        }
        r
    }

    /// `region.streaming()`: the box's data is read or written once, so its loads, stores and
    /// `cp.async` copies ask L2 to evict their lines first (`CachePolicy::EvictFirst`), leaving
    /// room for what other blocks still read.
    pub fn streaming(&self, mut r: Region, loc: SrcLoc) -> Region {
        match &mut r {
            Region::Global { cache, .. } => *cache = CachePolicy::EvictFirst,
            Region::Buf(_) => self.error(loc, "streaming applies to a box of a global tensor"),
        }
        r
    }

    /// `region.whole_lines()` (or `.whole_lines(on)` with a host `bool`): a fragment stored
    /// into the box writes whole 128-byte lines per warp instruction (neighbouring row groups
    /// trade halves through `shfl` first) instead of half lines of twice as many rows. Where
    /// the fragment's layout or the box's masks do not allow it, the store is the usual one (the
    /// `copy_plan` dump says why); loads and copies from shared memory ignore it.
    pub fn whole_lines(&self, mut r: Region, on: bool, loc: SrcLoc) -> Region {
        match &mut r {
            Region::Global { whole_lines, .. } => *whole_lines = on,
            Region::Buf(_) => self.error(loc, "whole_lines applies to a box of a global tensor"),
        }
        r
    }

    /// `copy(src, dst)`.
    pub fn copy(&self, src: impl IntoRegion, dst: impl IntoRegion, loc: SrcLoc) {
        self.tile_op(loc, "copy");
        self.push(StmtKind::Copy { src: src.into_region(), dst: dst.into_region() }, loc);
    }

    /// `prefetch(global_box)`: warm L2 with a box a later copy will read.
    pub fn prefetch(&self, src: impl IntoRegion, loc: SrcLoc) {
        self.tile_op(loc, "prefetch");
        let src = src.into_region();
        // Asking L2 to bring in lines it should evict first contradicts itself.
        if matches!(src, Region::Global { cache: CachePolicy::EvictFirst, .. }) {
            self.error(loc, "prefetch of a `.streaming()` box: a streamed box is read once, by its copy");
        }
        self.push(StmtKind::Prefetch(src), loc);
    }

    /// `gemm(a, b, c)`: `c += a · b`.
    pub fn gemm(&self, a: impl IntoOperand, b: impl IntoOperand, c: &Tile, loc: SrcLoc) {
        self.tile_op(loc, "gemm");
        self.push(StmtKind::Gemm { a: a.into_operand(), b: b.into_operand(), c: c.id }, loc);
    }

    /// `fill(t, v)`; `clear(t)` is `fill(t, 0)`.
    pub fn fill(&self, t: &Tile, v: impl Into<Val>, loc: SrcLoc) {
        self.tile_op(loc, "fill");
        self.push(StmtKind::Fill(t.id, v.into().0), loc);
    }

    /// `reduce_sum` / `reduce_max`.
    pub fn reduce(&self, op: ReduceOp, src: &Tile, dst: &Tile, axis: impl HostInt, loc: SrcLoc) {
        self.tile_op(loc, "reduce");
        let axis = usize::try_from(axis.to_i64()).unwrap_or(usize::MAX);
        self.push(StmtKind::Reduce { op, src: src.id, dst: dst.id, axis }, loc);
    }

    /// `cumsum(src, dst, axis)`.
    pub fn cumsum(&self, src: &Tile, dst: &Tile, axis: impl HostInt, loc: SrcLoc) {
        self.tile_op(loc, "cumsum");
        let axis = usize::try_from(axis.to_i64()).unwrap_or(usize::MAX);
        self.push(StmtKind::Cumsum { src: src.id, dst: dst.id, axis }, loc);
    }

    /// `print(t)`.
    pub fn print(&self, t: &Tile, loc: SrcLoc) {
        self.tile_op(loc, "print");
        self.push(StmtKind::Print(t.id), loc);
    }

    fn tile_op(&self, loc: SrcLoc, what: &str) {
        if self.st.borrow().parallel_depth > 0 {
            self.error(loc, format!("`{what}` is a tile operation and cannot appear inside `parallel`"));
        }
    }

    /// `let name = value;` for a kernel value: a variable.
    pub fn let_var(&self, name: &str, value: impl Into<Val>, loc: SrcLoc) -> Val {
        let v = self.new_var(name, DType::Bool); // typed by `check_types`
        self.push(StmtKind::Assign(v, value.into().0), loc);
        Val(Expr::Var(v))
    }

    /// `name = value;` for a variable made by `let_var`.
    pub fn assign(&self, var: &Val, value: impl Into<Val>, loc: SrcLoc) {
        match var.0 {
            Expr::Var(v) => self.push(StmtKind::Assign(v, value.into().0), loc),
            _ => self.error(loc, "only a `let` variable of the kernel can be assigned"),
        }
    }

    /// Reads a global tensor element.
    pub fn load(&self, t: &Tensor, index: Vec<Val>, loc: SrcLoc) -> Val {
        if index.len() != t.rank {
            self.error(loc, format!("the tensor has {} axes; {} indices given", t.rank, index.len()));
        }
        Val(Expr::Load(t.id, index.into_iter().map(|v| v.0).collect()))
    }

    /// Reads a tile element.
    pub fn elem(&self, t: &Tile, index: Vec<Val>, loc: SrcLoc) -> Val {
        self.check_rank(t, index.len(), loc);
        Val(Expr::Elem(t.id, index.into_iter().map(|v| v.0).collect()))
    }

    fn check_rank(&self, t: &Tile, n: usize, loc: SrcLoc) {
        let msg = crate::passes::check_types::tile_rank_error(&self.st.borrow().def.buffers[t.id], n);
        if let Some(msg) = msg {
            self.error(loc, msg);
        }
    }

    /// Writes a tile element.
    pub fn store(&self, t: &Tile, index: Vec<Val>, value: impl Into<Val>, loc: SrcLoc) {
        self.check_rank(t, index.len(), loc);
        self.push(StmtKind::Store(t.id, index.into_iter().map(|v| v.0).collect(), value.into().0), loc);
    }

    /// Writes a global tensor element (inside `parallel`).
    pub fn store_global(&self, t: &Tensor, index: Vec<Val>, value: impl Into<Val>, loc: SrcLoc) {
        if index.len() != t.rank {
            self.error(loc, format!("the tensor has {} axes; {} indices given", t.rank, index.len()));
        }
        self.push(StmtKind::StoreGlobal(t.id, index.into_iter().map(|v| v.0).collect(), value.into().0), loc);
    }

    /// Opens `for var in kind(start..end)`; returns the counter. Close with [`Self::end`].
    pub fn begin_for(
        &self,
        name: &str,
        kind: LoopKind,
        start: impl Into<Val>,
        end: impl Into<Val>,
        loc: SrcLoc,
    ) -> Val {
        let var = self.new_var(name, DType::I32);
        if let Some(m) = crate::passes::check_types::loop_kind_error(kind) {
            self.error(loc, m);
        }
        let frame = Frame::For { var, kind, start: start.into().0, end: end.into().0, loc };
        self.st.borrow_mut().frames.push((frame, vec![]));
        Val(Expr::Var(var))
    }

    /// Opens `for (i, j) in parallel(t)`; returns the index variables. Close with [`Self::end`].
    pub fn begin_parallel(&self, t: &Tile, names: &[&str], loc: SrcLoc) -> Vec<Val> {
        self.check_rank(t, names.len(), loc);
        let vars: Vec<VarId> = names.iter().map(|n| self.new_var(n, DType::I32)).collect();
        let mut st = self.st.borrow_mut();
        st.parallel_depth += 1;
        st.frames.push((Frame::Parallel { over: t.id, vars: vars.clone(), loc }, vec![]));
        vars.into_iter().map(|v| Val(Expr::Var(v))).collect()
    }

    /// Opens `for w in warp_group(first, count) { .. }`: only warps `first .. first + count` run
    /// the body; returns the warp index within the group. Close with [`Self::end`].
    pub fn begin_warp_group(&self, name: &str, first: impl HostInt, count: impl HostInt, loc: SrcLoc) -> Val {
        let (first, count) = (first.to_i64(), count.to_i64());
        let nested = {
            let st = self.st.borrow();
            st.parallel_depth > 0 || st.frames.iter().any(|(f, _)| !matches!(f, Frame::Root))
        };
        if nested {
            self.error(loc, "a warp group is a top-level statement of the kernel (not inside a loop, branch, parallel or another group)");
        }
        if first < 0 || count < 1 || first + count > 32 {
            self.error(loc, format!("warp_group({first}, {count}): expected a first warp >= 0 and 1 or more warps"));
        }
        let var = self.new_var(name, DType::I32);
        let mut st = self.st.borrow_mut();
        st.warp_groups += 1;
        let id = st.warp_groups;
        if id > 15 {
            drop(st);
            self.error(loc, "at most 15 warp groups (named barriers 1 to 15)");
            st = self.st.borrow_mut();
        }
        let frame =
            Frame::WarpGroup { first: first.clamp(0, 32) as u32, count: count.clamp(1, 32) as u32, id, var, loc };
        st.frames.push((frame, vec![]));
        Val(Expr::Var(var))
    }

    /// Opens `for _ in producer() { .. }`: the producer's part of a `pipelined` loop's body
    /// ([`StmtKind::Producer`]; `passes::place_producers` checks where it stands). Close with
    /// [`Self::end`].
    pub fn begin_producer(&self, loc: SrcLoc) {
        let mut st = self.st.borrow_mut();
        let nested = st.parallel_depth > 0 || st.frames.iter().any(|(f, _)| matches!(f, Frame::Producer { .. }));
        st.frames.push((Frame::Producer { loc }, vec![]));
        drop(st);
        if nested {
            self.error(loc, "a producer block is a statement of a `pipelined` loop's body, not inside `parallel` or another producer block");
        }
    }

    /// Opens `if cond { .. }`. Continue with [`Self::begin_else`] or close with [`Self::end`].
    pub fn begin_if(&self, cond: impl Into<Val>, loc: SrcLoc) {
        self.st.borrow_mut().frames.push((Frame::Then { cond: cond.into().0, loc }, vec![]));
    }

    /// Switches the open `if` to its `else` branch.
    pub fn begin_else(&self) {
        let mut st = self.st.borrow_mut();
        match st.frames.pop() {
            Some((Frame::Then { cond, loc }, then)) => st.frames.push((Frame::Else { cond, then, loc }, vec![])),
            _ => panic!("begin_else without begin_if: a bug in the #[kernel] expansion"),
        }
    }

    /// Closes the innermost open loop or branch.
    pub fn end(&self) {
        let mut st = self.st.borrow_mut();
        let (frame, body) = st.frames.pop().expect("end without begin: a bug in the #[kernel] expansion");
        let (kind, loc) = match frame {
            Frame::Root => panic!("end of the root frame: a bug in the #[kernel] expansion"),
            Frame::For { var, kind, start, end, loc } => (StmtKind::For { var, kind, start, end, body }, loc),
            Frame::Parallel { over, vars, loc } => {
                st.parallel_depth -= 1;
                (StmtKind::Parallel { over, vars, body }, loc)
            }
            Frame::Then { cond, loc } => (StmtKind::If(cond, body, vec![]), loc),
            Frame::Else { cond, then, loc } => (StmtKind::If(cond, then, body), loc),
            Frame::WarpGroup { first, count, id, var, loc } => {
                (StmtKind::WarpGroup { first, count, id, var, body }, loc)
            }
            Frame::Producer { loc } => (StmtKind::Producer(body), loc),
        };
        st.frames.last_mut().expect("frame stack is never empty").1.push(Stmt { kind, loc });
    }

    /// Finishes: the definition, or the first error recorded.
    pub fn finish(self) -> Result<KernelDef, Diag> {
        let mut st = self.st.into_inner();
        if let Some(e) = st.errors.into_iter().next() {
            return Err(e);
        }
        if !st.launched {
            return Err(Diag::new(st.def.loc, "the kernel never calls `launch(grid = [..], threads = n)`"));
        }
        assert_eq!(st.frames.len(), 1, "unclosed frames: a bug in the #[kernel] expansion");
        st.def.body = st.frames.pop().map(|f| f.1).unwrap_or_default();
        crate::passes::check_types::check_types(&mut st.def)?;
        Ok(st.def)
    }
}
