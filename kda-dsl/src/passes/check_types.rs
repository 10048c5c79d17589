//! `check_types`: gives every variable its type and rejects ill-typed expressions.
//!
//! Values are `i32`, `i64`, `f32` or `bool`; 16-bit floats exist only in memory and are read as
//! `f32` (a cast to them rounds). An integer literal adapts to the other operand.

use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::tile::*;

/// The type a value of memory type `d` has in registers.
pub fn value_type(d: DType) -> DType {
    if d.is_half() {
        DType::F32
    } else {
        d
    }
}

/// A type, with untyped integer literals kept apart until they meet a typed operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// An integer literal not yet tied to a type.
    Literal,
    /// A concrete value type.
    Is(DType),
}

impl Ty {
    /// The concrete type (a literal alone is `i32`).
    pub fn concrete(self) -> DType {
        match self {
            Ty::Literal => DType::I32,
            Ty::Is(d) => d,
        }
    }
}

fn unify(a: Ty, b: Ty, loc: SrcLoc, what: &str) -> Result<Ty, Diag> {
    Ok(match (a, b) {
        (Ty::Literal, Ty::Literal) => Ty::Literal,
        (Ty::Literal, Ty::Is(t)) | (Ty::Is(t), Ty::Literal) => {
            if t == DType::Bool {
                return Err(Diag::new(loc, format!("{what}: an integer meets a bool")));
            }
            Ty::Is(t)
        }
        (Ty::Is(x), Ty::Is(y)) if x == y => Ty::Is(x),
        (Ty::Is(DType::I32), Ty::Is(DType::I64)) | (Ty::Is(DType::I64), Ty::Is(DType::I32)) => Ty::Is(DType::I64),
        (Ty::Is(x), Ty::Is(y)) => {
            return Err(Diag::new(loc, format!("{what} mixes {x} and {y}; convert one with `as`")));
        }
    })
}

/// The type of `e` in `def` (variables must already be typed).
pub fn type_of(def: &KernelDef, e: &Expr, loc: SrcLoc) -> Result<Ty, Diag> {
    let t = |x: &Expr| type_of(def, x, loc);
    Ok(match e {
        Expr::Int(_, None) => Ty::Literal,
        Expr::Int(_, Some(d)) => Ty::Is(*d),
        Expr::Float(_) => Ty::Is(DType::F32),
        Expr::Bool(_) => Ty::Is(DType::Bool),
        Expr::Dim(_) => Ty::Is(DType::I32),
        Expr::Scalar(p) => match &def.params[*p] {
            Param::Scalar { dtype, .. } => Ty::Is(value_type(*dtype)),
            _ => unreachable!("Expr::Scalar names a scalar param"),
        },
        Expr::Var(v) => Ty::Is(def.vars[*v].dtype),
        Expr::Load(p, idx) => {
            check_tensor_rank(def, *p, idx.len(), loc)?;
            for i in idx {
                index_type(def, i, loc)?;
            }
            match &def.params[*p] {
                Param::Tensor { dtype, .. } => Ty::Is(value_type(*dtype)),
                _ => unreachable!("Expr::Load names a tensor"),
            }
        }
        Expr::Elem(b, idx) => {
            check_tile_rank(def, *b, idx.len(), loc)?;
            for i in idx {
                index_type(def, i, loc)?;
            }
            Ty::Is(value_type(def.buffers[*b].dtype))
        }
        Expr::Unary(op, a) => {
            let ta = t(a)?;
            match op {
                UnOp::Not => {
                    if ta != Ty::Is(DType::Bool) {
                        return Err(Diag::new(loc, "`!` needs a bool"));
                    }
                    ta
                }
                UnOp::Neg | UnOp::Abs => {
                    if ta == Ty::Is(DType::Bool) {
                        return Err(Diag::new(loc, format!("{op:?} of a bool")));
                    }
                    ta
                }
                _ => {
                    if ta != Ty::Is(DType::F32) && ta != Ty::Literal {
                        return Err(Diag::new(
                            loc,
                            format!("{} needs an f32, found {}", format!("{op:?}").to_lowercase(), ta.concrete()),
                        ));
                    }
                    Ty::Is(DType::F32)
                }
            }
        }
        Expr::Binary(op, a, b) => {
            let u = unify(t(a)?, t(b)?, loc, &format!("{op:?}"))?;
            match op {
                BinOp::And | BinOp::Or => {
                    if u != Ty::Is(DType::Bool) {
                        return Err(Diag::new(loc, format!("{op:?} needs bools")));
                    }
                    u
                }
                op if op.is_compare() => Ty::Is(DType::Bool),
                _ => {
                    if u == Ty::Is(DType::Bool) {
                        return Err(Diag::new(loc, format!("{op:?} of bools")));
                    }
                    u
                }
            }
        }
        Expr::Select(c, a, b) => {
            if t(c)? != Ty::Is(DType::Bool) {
                return Err(Diag::new(loc, "select needs a bool condition"));
            }
            unify(t(a)?, t(b)?, loc, "select")?
        }
        Expr::Cast(d, a) => {
            t(a)?;
            Ty::Is(value_type(*d))
        }
    })
}

/// The most registers a thread has.
const REGISTERS_MAX: u64 = 255;

/// A tile that fits where it lives: positive extents, at most a block's shared memory, at most
/// a thread's registers per thread (a fragment spread over the block's `threads`, a local
/// whole in each thread).
fn check_tile_size(b: &Buffer, threads: u32) -> Result<(), Diag> {
    if b.shape.is_empty() || b.shape.contains(&0) {
        return Err(Diag::new(b.loc, format!("tile `{}`: extents must be positive", b.name)));
    }
    let elems = b.shape.iter().try_fold(1u64, |n, &e| n.checked_mul(u64::from(e))).unwrap_or(u64::MAX);
    let (fits, place) = match b.scope {
        Scope::Shared => {
            let bytes = elems.saturating_mul(b.dtype.size_bytes() as u64);
            (bytes <= u64::from(super::allocate_shared::MAX_SHARED_BYTES), "shared memory")
        }
        Scope::Fragment => (elems <= REGISTERS_MAX.saturating_mul(u64::from(threads)), "the block's registers"),
        Scope::Local => (elems <= REGISTERS_MAX, "a thread's registers"),
    };
    if fits {
        return Ok(());
    }
    Err(Diag::new(b.loc, format!("tile `{}` {:?} does not fit in {place}", b.name, b.shape)))
}

/// Why the kernel's fill warps cannot be, if they cannot: at most 8, within the block's 1024
/// threads, with a `pipelined` loop for them to fill, and no warp groups (whose named barriers
/// the compute warps' would share).
fn fill_warps_error(def: &KernelDef) -> Option<String> {
    let n = def.fill_warps;
    if n == 0 {
        return def
            .producer_registers
            .map(|r| format!("producer_registers = {r}: the kernel has no fill warps (`fill_warps`) to keep them"));
    }
    let mut pipelined = false;
    let mut groups = false;
    visit_stmts(&def.body, &mut |s| match s.kind {
        StmtKind::For { kind: LoopKind::Pipelined { .. }, .. } => pipelined = true,
        StmtKind::WarpGroup { .. } => groups = true,
        _ => {}
    });
    if n > FILL_WARPS_MAX || def.launched_threads() > 1024 {
        Some(format!(
            "fill_warps = {n}: expected at most {FILL_WARPS_MAX}, and at most 1024 threads with the {} of `threads`",
            def.threads
        ))
    } else if !pipelined {
        Some(format!("fill_warps = {n}: the kernel has no `pipelined` loop whose stages they could fill"))
    } else if groups {
        Some(format!("fill_warps = {n}: a kernel with fill warps cannot also have warp groups"))
    } else {
        None
    }
}

/// Why `threads` cannot be a block's thread count (whole warps, 32 to 1024), if it cannot. The
/// builder and this check share it.
pub(crate) fn threads_error(threads: i64) -> Option<String> {
    let ok = (32..=1024).contains(&threads) && threads % 32 == 0;
    (!ok).then(|| format!("threads = {threads}: expected a multiple of 32 in 32..=1024"))
}

/// Why a loop of this kind cannot be built, if it cannot (a pipeline of too few or too many
/// stages).
pub(crate) fn loop_kind_error(kind: LoopKind) -> Option<String> {
    match kind {
        LoopKind::Pipelined { stages, .. } if !(2..=8).contains(&stages) => {
            Some(format!("stages = {stages}: expected 2 to 8"))
        }
        _ => None,
    }
}

/// Why `given` indices cannot index tile `buf` (one per axis), if they cannot.
pub(crate) fn tile_rank_error(buf: &Buffer, given: usize) -> Option<String> {
    (buf.shape.len() != given)
        .then(|| format!("tile `{}` has {} axes; {given} indices given", buf.name, buf.shape.len()))
}

/// Tile `b` indexed with `given` indices: one per axis.
fn check_tile_rank(def: &KernelDef, b: BufId, given: usize, loc: SrcLoc) -> Result<(), Diag> {
    tile_rank_error(&def.buffers[b], given).map_or(Ok(()), |m| Err(Diag::new(loc, m)))
}

/// Tensor `p` indexed (or boxed) with `given` coordinates: one per axis.
fn check_tensor_rank(def: &KernelDef, p: ParamId, given: usize, loc: SrcLoc) -> Result<(), Diag> {
    match &def.params[p] {
        Param::Tensor { dims, .. } if dims.len() == given => Ok(()),
        Param::Tensor { name, dims, .. } => {
            Err(Diag::new(loc, format!("tensor `{name}` has {} axes; {given} coordinates given", dims.len())))
        }
        other => Err(Diag::new(loc, format!("`{}` is not a tensor", other.name()))),
    }
}

/// A global box: one offset, one extent and (when given) one bound per axis of its tensor.
fn check_region(def: &KernelDef, r: &Region, loc: SrcLoc) -> Result<(), Diag> {
    if let Region::Global { tensor, offset, shape, bound, .. } = r {
        check_tensor_rank(def, *tensor, offset.len(), loc)?;
        check_tensor_rank(def, *tensor, shape.len(), loc)?;
        if let Some(b) = bound {
            check_tensor_rank(def, *tensor, b.len(), loc)?;
        }
        if shape.contains(&0) {
            return Err(Diag::new(loc, "a box's extents must be positive"));
        }
    }
    Ok(())
}

fn index_type(def: &KernelDef, e: &Expr, loc: SrcLoc) -> Result<(), Diag> {
    match type_of(def, e, loc)? {
        Ty::Literal | Ty::Is(DType::I32) | Ty::Is(DType::I64) => Ok(()),
        Ty::Is(d) => Err(Diag::new(loc, format!("an index must be an integer, found {d}"))),
    }
}

/// Types every variable from its first assignment and checks every expression.
pub fn check_types(def: &mut KernelDef) -> Result<(), Diag> {
    // What the builder checks as it records a kernel, again for kernels read from text.
    if let Some(m) = threads_error(i64::from(def.threads)) {
        return Err(Diag::new(def.loc, m));
    }
    if let Some(m) = fill_warps_error(def) {
        return Err(Diag::new(def.loc, m));
    }
    for (_, b) in def.buffers.iter_ids() {
        check_tile_size(b, def.threads)?;
    }
    let mut assigned: IdVec<Var, bool> = IdVec::filled(def.vars.len(), false);
    for v in def.block_vars.iter().flatten() {
        assigned[*v] = true;
    }
    let body = std::mem::take(&mut def.body);
    let r = check_block(def, &body, &mut assigned);
    def.body = body;
    r
}

fn check_block(def: &mut KernelDef, body: &[Stmt], assigned: &mut IdVec<Var, bool>) -> Result<(), Diag> {
    for s in body {
        let loc = s.loc;
        match &s.kind {
            StmtKind::Assign(v, e) => {
                let t = type_of(def, e, loc)?.concrete();
                if !assigned[*v] {
                    def.vars[*v].dtype = t;
                    assigned[*v] = true;
                } else {
                    let have = def.vars[*v].dtype;
                    unify(Ty::Is(have), Ty::Is(t), loc, "assignment")?;
                    if have == DType::I32 && t == DType::I64 {
                        return Err(Diag::new(loc, format!("`{}` is i32; the value is i64", def.vars[*v].name)));
                    }
                }
            }
            StmtKind::Fill(b, e) => {
                let t = type_of(def, e, loc)?;
                unify(Ty::Is(value_type(def.buffers[*b].dtype)), t, loc, "fill")?;
            }
            StmtKind::Store(b, idx, e) => {
                check_tile_rank(def, *b, idx.len(), loc)?;
                for i in idx {
                    index_type(def, i, loc)?;
                }
                let t = type_of(def, e, loc)?;
                unify(Ty::Is(value_type(def.buffers[*b].dtype)), t, loc, "store")?;
            }
            StmtKind::StoreGlobal(p, idx, e) => {
                check_tensor_rank(def, *p, idx.len(), loc)?;
                for i in idx {
                    index_type(def, i, loc)?;
                }
                let t = type_of(def, e, loc)?;
                if let Param::Tensor { dtype, writes, name, .. } = &def.params[*p] {
                    if !writes {
                        return Err(Diag::new(loc, format!("`{name}` is read-only; declare it GlobalMut to write it")));
                    }
                    unify(Ty::Is(value_type(*dtype)), t, loc, "store")?;
                }
            }
            StmtKind::Copy { src, dst } => {
                check_region(def, src, loc)?;
                check_region(def, dst, loc)?;
                for e in src.index_exprs().chain(dst.index_exprs()) {
                    index_type(def, e, loc)?;
                }
            }
            StmtKind::Prefetch(r) => {
                check_region(def, r, loc)?;
                let Region::Global { shape, .. } = r else {
                    return Err(Diag::new(loc, "`prefetch` takes a global box (`x.tile_at(..)`), not a tile"));
                };
                if shape.iter().filter(|s| **s > 1).count() > 2 {
                    return Err(Diag::new(loc, "a prefetched box has at most two axes longer than 1"));
                }
                for e in r.index_exprs() {
                    index_type(def, e, loc)?;
                }
            }
            StmtKind::For { kind, start, end, body, .. } => {
                if let Some(m) = loop_kind_error(*kind) {
                    return Err(Diag::new(loc, m));
                }
                index_type(def, start, loc)?;
                index_type(def, end, loc)?;
                check_block(def, body, assigned)?;
            }
            StmtKind::Parallel { body, .. } | StmtKind::Producer(body) => check_block(def, body, assigned)?,
            StmtKind::WarpGroup { first, count, id, var, body } => {
                let (warps, end) = (def.threads / 32, first.saturating_add(*count));
                if *count < 1 || end > warps || !(1..=15).contains(id) {
                    return Err(Diag::new(
                        loc,
                        format!(
                            "warp group {id} (warps {first}..{end}): expected 1 or more of the block's {warps} warps and a named barrier 1 to 15"
                        ),
                    ));
                }
                assigned[*var] = true;
                def.vars[*var].dtype = DType::I32;
                check_block(def, body, assigned)?;
            }
            StmtKind::If(c, t, e) => {
                if type_of(def, c, loc)? != Ty::Is(DType::Bool) {
                    return Err(Diag::new(loc, "an `if` condition must be a bool"));
                }
                check_block(def, t, assigned)?;
                check_block(def, e, assigned)?;
            }
            StmtKind::Gemm { .. }
            | StmtKind::Reduce { .. }
            | StmtKind::Cumsum { .. }
            | StmtKind::Print(_)
            | StmtKind::ReduceLanes { .. }
            | StmtKind::ReduceVectorLanes { .. }
            | StmtKind::Barrier => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::tile::BinOp;

    #[test]
    fn variables_take_the_type_of_their_first_value() {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["N"], DType::BF16, false);
        k.launch(vec![Host::int(1)], 32, loc(2));
        let x = k.let_var("x", k.load(&a, vec![Val::from(0)], loc(3)), loc(3));
        let n = k.let_var("n", Val::bin(BinOp::Add, k.dim("N"), 1), loc(4));
        let def = k.finish().expect("valid");
        let (Val(crate::tile::Expr::Var(xv)), Val(crate::tile::Expr::Var(nv))) = (x, n) else { panic!("vars") };
        assert_eq!(def.vars[xv].dtype, DType::F32, "a bf16 element is read as f32");
        assert_eq!(def.vars[nv].dtype, DType::I32);
    }

    #[test]
    fn mixing_integers_and_floats_is_an_error_at_the_statement() {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["N"], DType::F32, false);
        k.launch(vec![Host::int(1)], 32, loc(2));
        k.let_var("x", Val::bin(BinOp::Add, k.load(&a, vec![Val::from(0)], loc(3)), k.dim("N")), loc(3));
        let e = k.finish().expect_err("ill-typed");
        assert_eq!(e.loc.line, 3);
        assert!(e.message.contains("mixes f32 and i32"), "{e}");
    }

    #[test]
    fn conditions_must_be_bools() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 32, loc(2));
        k.begin_if(k.dim("N"), loc(3));
        k.end();
        let e = k.finish().expect_err("ill-typed");
        assert!(e.message.contains("must be a bool"), "{e}");
    }
}
