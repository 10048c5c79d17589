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

/// Variables and tiles an expression reads.
fn reads(e: &Expr, vars: &mut Vec<VarId>, bufs: &mut Vec<BufId>) {
    match e {
        Expr::Var(v) => vars.push(*v),
        Expr::Elem(b, idx) => {
            bufs.push(*b);
            idx.iter().for_each(|x| reads(x, vars, bufs));
        }
        Expr::Load(_, idx) => idx.iter().for_each(|x| reads(x, vars, bufs)),
        Expr::Unary(_, a) | Expr::Cast(_, a) => reads(a, vars, bufs),
        Expr::Binary(_, a, b) => {
            reads(a, vars, bufs);
            reads(b, vars, bufs);
        }
        Expr::Select(c, a, b) => {
            reads(c, vars, bufs);
            reads(a, vars, bufs);
            reads(b, vars, bufs);
        }
        Expr::Int(..) | Expr::Float(_) | Expr::Bool(_) | Expr::Dim(_) | Expr::Scalar(_) => {}
    }
}

/// Variables assigned and tiles written anywhere in `body`.
fn writes(body: &[Stmt]) -> (HashSet<VarId>, HashSet<BufId>) {
    let (mut vars, mut bufs) = (HashSet::new(), HashSet::new());
    visit_stmts(body, &mut |s| match &s.kind {
        StmtKind::Assign(v, _) => {
            vars.insert(*v);
        }
        StmtKind::For { var, .. } | StmtKind::WarpGroup { var, .. } => {
            vars.insert(*var);
        }
        StmtKind::Parallel { vars: vs, .. } => vars.extend(vs.iter().copied()),
        StmtKind::Copy { dst: Region::Buf(b), .. }
        | StmtKind::Gemm { c: b, .. }
        | StmtKind::Fill(b, _)
        | StmtKind::Store(b, ..)
        | StmtKind::Reduce { dst: b, .. }
        | StmtKind::Cumsum { dst: b, .. }
        | StmtKind::ReduceLanes { dst: b, .. }
        | StmtKind::ReduceVectorLanes { dst: b, .. } => {
            bufs.insert(*b);
        }
        _ => {}
    });
    (vars, bufs)
}

/// The top-level assignments of `body` that must run before its fills (the statements `fills`
/// picks out), for the fill's iteration, in body order; an error at the fill or the assignment
/// when a fill reads a value the body computes in any other way.
pub(crate) fn fill_prelude(def: &KernelDef, counter: VarId, body: &[Stmt], fills: &[&Stmt]) -> Result<Vec<Stmt>, Diag> {
    let (assigned, written) = writes(body);
    let name = |v: VarId| def.vars[v].name.clone();
    // Candidates: the body's own `let`s, top level, assigned once. (Passes move the fills to the
    // front of the body, so position says nothing; the macro's scoping already put each `let`
    // before the fills that read it.)
    let mut top = HashSet::new();
    let mut once = HashSet::new();
    for s in body {
        if let StmtKind::Assign(v, _) = &s.kind {
            if top.insert(*v) {
                once.insert(*v);
            } else {
                once.remove(v);
            }
        }
    }
    let nested = {
        let (mut all, _) = writes(body);
        for s in body {
            if let StmtKind::Assign(v, _) = &s.kind {
                all.remove(v);
            }
        }
        all
    };
    let carried = |v: &VarId| {
        // Assigned outside this body too (before the loop, or in an enclosing loop).
        let mut n = 0;
        visit_stmts(&def.body, &mut |s| n += usize::from(matches!(&s.kind, StmtKind::Assign(x, _) if x == v)));
        let inside = body.iter().filter(|s| matches!(&s.kind, StmtKind::Assign(x, _) if x == v)).count();
        n > inside
    };
    let mut prelude: Vec<Stmt> = vec![];
    let mut ready: HashSet<VarId> = HashSet::new();
    // What the fills need, resolved backwards through the assignments they read.
    let mut need: Vec<(VarId, SrcLoc)> = vec![];
    for f in fills {
        if let StmtKind::Copy { src, .. } = &f.kind {
            let (mut vs, mut bs) = (vec![], vec![]);
            src.index_exprs().for_each(|e| reads(e, &mut vs, &mut bs));
            if let Some(b) = bs.iter().find(|b| written.contains(b)) {
                return Err(Diag::new(
                    f.loc,
                    format!(
                        "this fill runs ahead of the loop body, so its box cannot read `{}`, which the body writes",
                        def.buffers[*b].name
                    ),
                ));
            }
            need.extend(vs.into_iter().map(|v| (v, f.loc)));
        }
    }
    while let Some((v, at)) = need.pop() {
        if v == counter || !assigned.contains(&v) || ready.contains(&v) {
            continue;
        }
        let stmt = body.iter().find(|s| matches!(&s.kind, StmtKind::Assign(x, _) if *x == v));
        let eligible = once.contains(&v) && !nested.contains(&v) && !carried(&v);
        let (Some(s), true) = (stmt, eligible) else {
            return Err(Diag::new(
                at,
                format!("a fill runs stages - 1 iterations ahead of the loop body, so it can read `{}` only if a `let` of the body's own (at its top level, set once) computes it from the loop counter, values set before the loop, global scalars and shared tiles the loop does not write", name(v)),
            ));
        };
        let StmtKind::Assign(_, e) = &s.kind else { unreachable!("found as an assignment") };
        let (mut vs, mut bs) = (vec![], vec![]);
        reads(e, &mut vs, &mut bs);
        if let Some(b) = bs.iter().find(|b| written.contains(b)) {
            return Err(Diag::new(
                s.loc,
                format!(
                    "`{}` feeds a fill of the pipeline, so it cannot read `{}`, which the body writes",
                    name(v),
                    def.buffers[*b].name
                ),
            ));
        }
        ready.insert(v);
        need.extend(vs.into_iter().map(|x| (x, s.loc)));
    }
    // Body order, so each assignment follows those it reads.
    for s in body {
        if matches!(&s.kind, StmtKind::Assign(v, _) if ready.contains(v)) {
            prelude.push(s.clone());
        }
    }
    Ok(prelude)
}
