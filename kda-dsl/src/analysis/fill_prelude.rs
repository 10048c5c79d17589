//! The values a `pipelined` loop's fills compute in its body: the `let`s at the top of the
//! body, before a fill, that the fills' coordinates read.
//!
//! A fill runs `stages - 1` iterations ahead of the compute, so such a `let` is evaluated twice
//! per iteration: once for the fill's iteration, right before the fills, and again for the
//! current one, where the body has it. That is only right for a pure function of the iteration:
//! the loop counter, values set before the loop, global scalars and shared tiles the loop does
//! not write. Anything else a fill reads from the body is an error at the fill, where it used to
//! read a stale value.

use std::collections::HashSet;

use crate::diag::{Diag, SrcLoc};
use crate::tile::*;

/// What an expression reads: variables, tiles and global tensors.
#[derive(Default)]
struct Reads {
    vars: Vec<VarId>,
    bufs: Vec<BufId>,
    tensors: Vec<ParamId>,
}

fn reads(e: &Expr, r: &mut Reads) {
    match e {
        Expr::Var(v) => r.vars.push(*v),
        Expr::Elem(b, idx) => {
            r.bufs.push(*b);
            idx.iter().for_each(|x| reads(x, r));
        }
        Expr::Load(t, idx) => {
            r.tensors.push(*t);
            idx.iter().for_each(|x| reads(x, r));
        }
        Expr::Unary(_, a) | Expr::Cast(_, a) => reads(a, r),
        Expr::Binary(_, a, b) => {
            reads(a, r);
            reads(b, r);
        }
        Expr::Select(c, a, b) => {
            reads(c, r);
            reads(a, r);
            reads(b, r);
        }
        Expr::Int(..) | Expr::Float(_) | Expr::Bool(_) | Expr::Dim(_) | Expr::Scalar(_) => {}
    }
}

/// What `body` writes anywhere in it: variables, tiles and global tensors.
#[derive(Default)]
struct Writes {
    vars: HashSet<VarId>,
    bufs: HashSet<BufId>,
    tensors: HashSet<ParamId>,
}

fn writes(body: &[Stmt]) -> Writes {
    let mut w = Writes::default();
    visit_stmts(body, &mut |s| match &s.kind {
        StmtKind::Assign(v, _) => {
            w.vars.insert(*v);
        }
        StmtKind::For { var, .. } | StmtKind::WarpGroup { var, .. } => {
            w.vars.insert(*var);
        }
        StmtKind::Parallel { vars: vs, .. } => w.vars.extend(vs.iter().copied()),
        StmtKind::Copy { dst: Region::Global { tensor, .. }, .. } | StmtKind::StoreGlobal(tensor, ..) => {
            w.tensors.insert(*tensor);
        }
        StmtKind::Copy { dst: Region::Buf(b), .. }
        | StmtKind::Gemm { c: b, .. }
        | StmtKind::Fill(b, _)
        | StmtKind::Store(b, ..)
        | StmtKind::Reduce { dst: b, .. }
        | StmtKind::Cumsum { dst: b, .. }
        | StmtKind::ReduceLanes { dst: b, .. }
        | StmtKind::ReduceVectorLanes { dst: b, .. } => {
            w.bufs.insert(*b);
        }
        _ => {}
    });
    w
}

/// The first tile or global tensor in `r` that `w` says the body writes, by name.
fn written_read(def: &KernelDef, r: &Reads, w: &Writes) -> Option<String> {
    let buf = r.bufs.iter().find(|b| w.bufs.contains(b)).map(|b| def.buffers[*b].name.clone());
    buf.or_else(|| r.tensors.iter().find(|t| w.tensors.contains(t)).map(|t| def.params[*t].name().to_string()))
}

/// The top-level assignments of `body` that must run before its fills (the statements `fills`
/// picks out), for the fill's iteration, in body order; an error at the fill or the assignment
/// when a fill reads a value the body computes in any other way.
pub(crate) fn fill_prelude(def: &KernelDef, counter: VarId, body: &[Stmt], fills: &[&Stmt]) -> Result<Vec<Stmt>, Diag> {
    let written = writes(body);
    let name = |v: VarId| def.vars[v].name.clone();
    // Candidates: the body's own `let`s, each assigned exactly once in the whole kernel, at the
    // body's top level. (Passes move the fills to the front of the body, so position says
    // nothing; the macro's scoping already put each `let` before the fills that read it.)
    let assigned_once_at_top = |v: VarId| {
        let mut anywhere = 0;
        visit_stmts(&def.body, &mut |s| anywhere += usize::from(matches!(&s.kind, StmtKind::Assign(x, _) if *x == v)));
        let at_top = body.iter().filter(|s| matches!(&s.kind, StmtKind::Assign(x, _) if *x == v)).count();
        anywhere == 1 && at_top == 1
    };
    let mut ready: HashSet<VarId> = HashSet::new();
    // What the fills need, resolved backwards through the assignments they read.
    let mut need: Vec<(VarId, SrcLoc)> = vec![];
    for f in fills {
        if let StmtKind::Copy { src, .. } = &f.kind {
            let mut r = Reads::default();
            src.index_exprs().for_each(|e| reads(e, &mut r));
            if let Some(x) = written_read(def, &r, &written) {
                return Err(Diag::new(
                    f.loc,
                    format!(
                        "this fill runs ahead of the loop body, so its box cannot read `{x}`, which the body writes"
                    ),
                ));
            }
            need.extend(r.vars.into_iter().map(|v| (v, f.loc)));
        }
    }
    while let Some((v, at)) = need.pop() {
        if v == counter || !written.vars.contains(&v) || ready.contains(&v) {
            continue;
        }
        let stmt = body.iter().find(|s| matches!(&s.kind, StmtKind::Assign(x, _) if *x == v));
        let (Some(s), true) = (stmt, assigned_once_at_top(v)) else {
            return Err(Diag::new(
                at,
                format!("a fill runs stages - 1 iterations ahead of the loop body, so it can read `{}` only if a `let` of the body's own (at its top level, set once) computes it from the loop counter, values set before the loop, global scalars and shared tiles the loop does not write", name(v)),
            ));
        };
        let StmtKind::Assign(_, e) = &s.kind else { unreachable!("found as an assignment") };
        let mut r = Reads::default();
        reads(e, &mut r);
        if let Some(x) = written_read(def, &r, &written) {
            return Err(Diag::new(
                s.loc,
                format!("`{}` feeds a fill of the pipeline, so it cannot read `{x}`, which the body writes", name(v)),
            ));
        }
        ready.insert(v);
        need.extend(r.vars.into_iter().map(|x| (x, s.loc)));
    }
    // Body order, so each assignment follows those it reads.
    Ok(body.iter().filter(|s| matches!(&s.kind, StmtKind::Assign(v, _) if ready.contains(v))).cloned().collect())
}
