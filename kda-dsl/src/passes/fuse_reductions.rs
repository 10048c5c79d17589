//! `fuse_reductions`: a `parallel` over a fragment that fills a temporary tile, followed by a
//! reduction of that tile into a row or column vector, becomes a `parallel` that accumulates
//! straight into the vector, then a `reduce_lanes` across the lanes holding each element.
//!
//! Several reductions right after one loop all fold into it (one pass over the tile).
//!
//! The temporary then has no live range at all: for a 16 x 128 f32 state per warp that is 64
//! registers per thread, which decides how many warps fit on an SM.

use super::{BufLayout, TileProgram};
use crate::diag::Diag;
use crate::dtype::DType;
use crate::layout::FragmentKind;
use crate::tile::*;

/// Fuses every eligible (parallel, reduce) pair.
pub fn fuse_reductions(p: &mut TileProgram) -> Result<(), Diag> {
    let body = std::mem::take(&mut p.def.body);
    let nb = p.def.buffers.len();
    let mut reads: IdVec<Buffer, usize> = IdVec::filled(nb, 0);
    count_other_uses(&body, &mut reads);
    // A reduction that does not directly follow the loop writing its source keeps that source
    // alive (a temporary reduced twice from one write, or later on): it counts as a use.
    let (mut reduced, mut paired): (IdVec<Buffer, usize>, IdVec<Buffer, usize>) =
        (IdVec::filled(nb, 0), IdVec::filled(nb, 0));
    count_reductions(&body, &mut reduced, &mut paired);
    for b in (0..nb).map(BufId::new) {
        reads[b] += reduced[b] - paired[b];
    }
    p.def.body = rewrite(p, body, &reads);
    Ok(())
}

/// Per buffer: `reduce` statements reading it, and how many of them directly follow (in the
/// run of reductions after a `parallel`) a loop that stores it, counting one per loop.
fn count_reductions(body: &[Stmt], reduced: &mut IdVec<Buffer, usize>, paired: &mut IdVec<Buffer, usize>) {
    for (k, s) in body.iter().enumerate() {
        match &s.kind {
            StmtKind::Reduce { src, .. } => reduced[*src] += 1,
            StmtKind::Parallel { body: pb, .. } => {
                let stored: Vec<BufId> = pb
                    .iter()
                    .filter_map(|x| match &x.kind {
                        StmtKind::Store(b, _, _) => Some(*b),
                        _ => None,
                    })
                    .collect();
                let mut seen = vec![];
                for next in &body[k + 1..] {
                    let StmtKind::Reduce { src, .. } = &next.kind else { break };
                    if stored.contains(src) && !seen.contains(src) {
                        seen.push(*src);
                        paired[*src] += 1;
                    }
                }
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                count_reductions(body, reduced, paired)
            }
            StmtKind::If(_, t, e) => {
                count_reductions(t, reduced, paired);
                count_reductions(e, reduced, paired);
            }
            _ => {}
        }
    }
}

/// Per buffer: element reads plus uses by tile operations other than as a `reduce` source (a
/// temporary with any is kept).
fn count_other_uses(body: &[Stmt], n: &mut IdVec<Buffer, usize>) {
    fn expr(e: &Expr, n: &mut IdVec<Buffer, usize>) {
        e.for_each_elem_tile(&mut |b| n[b] += 1);
    }
    fn region(r: &Region, n: &mut IdVec<Buffer, usize>) {
        if let Region::Buf(b) = r {
            n[*b] += 1;
        }
        r.index_exprs().for_each(|e| expr(e, n));
    }
    for s in body {
        match &s.kind {
            StmtKind::Assign(_, e) => expr(e, n),
            StmtKind::Store(_, idx, e) | StmtKind::StoreGlobal(_, idx, e) => {
                idx.iter().for_each(|i| expr(i, n));
                expr(e, n);
            }
            StmtKind::Copy { src, dst } => {
                for r in [src, dst] {
                    region(r, n);
                }
            }
            StmtKind::Prefetch(r) => region(r, n),
            StmtKind::Gemm { a, b, c } => {
                n[a.buf] += 1;
                n[b.buf] += 1;
                n[*c] += 1;
            }
            StmtKind::Fill(b, e) => {
                n[*b] += 1;
                expr(e, n);
            }
            StmtKind::Print(b) => n[*b] += 1,
            StmtKind::Cumsum { src, dst, .. } => {
                n[*src] += 1;
                n[*dst] += 1;
            }
            StmtKind::Reduce { dst, .. } | StmtKind::ReduceLanes { dst, .. } => n[*dst] += 1,
            StmtKind::ReduceVectorLanes { dst, vector, .. } => {
                n[*dst] += 1;
                n[*vector] += 1;
            }
            StmtKind::For { start, end, body, .. } => {
                expr(start, n);
                expr(end, n);
                count_other_uses(body, n);
            }
            StmtKind::Parallel { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                count_other_uses(body, n)
            }
            StmtKind::If(c, t, e) => {
                expr(c, n);
                count_other_uses(t, n);
                count_other_uses(e, n);
            }
            StmtKind::Barrier => {}
        }
    }
}

fn rewrite(p: &TileProgram, body: Vec<Stmt>, reads: &IdVec<Buffer, usize>) -> Vec<Stmt> {
    let mut out: Vec<Stmt> = vec![];
    let mut it = body.into_iter().peekable();
    while let Some(s) = it.next() {
        let s = match s.kind {
            StmtKind::For { var, kind, start, end, body } => {
                Stmt { kind: StmtKind::For { var, kind, start, end, body: rewrite(p, body, reads) }, loc: s.loc }
            }
            StmtKind::If(c, t, e) => {
                Stmt { kind: StmtKind::If(c, rewrite(p, t, reads), rewrite(p, e, reads)), loc: s.loc }
            }
            StmtKind::WarpGroup { first, count, id, var, body } => {
                Stmt { kind: StmtKind::WarpGroup { first, count, id, var, body: rewrite(p, body, reads) }, loc: s.loc }
            }
            StmtKind::Producer(body) => Stmt { kind: StmtKind::Producer(rewrite(p, body, reads)), loc: s.loc },
            kind => Stmt { kind, loc: s.loc },
        };
        if let StmtKind::Parallel { over, vars, body } = &s.kind {
            // Every reduction right after the loop whose temporary it fills folds into it: one
            // pass over the tile feeds several vectors.
            let mut body = body.clone();
            let (mut fills, mut lanes) = (vec![], vec![]);
            while let Some(StmtKind::Reduce { op, src, dst, axis }) = it.peek().map(|n| &n.kind) {
                let (op, src, dst, axis) = (*op, *src, *dst, *axis);
                let (fused, finish) = if let Some(f) = fuse(p, *over, vars, &body, op, src, dst, axis, reads) {
                    (f, StmtKind::ReduceLanes { op, dst, axis })
                } else if let Some(f) = fuse_to_one(p, *over, vars, &body, op, src, dst, reads) {
                    (f, StmtKind::ReduceVectorLanes { op, dst, vector: *over })
                } else {
                    break;
                };
                let loc = it.next().map_or(s.loc, |n| n.loc);
                body = fused;
                let identity = if op == ReduceOp::Sum { Expr::Float(0.0) } else { Expr::Float(f64::NEG_INFINITY) };
                fills.push(Stmt { kind: StmtKind::Fill(dst, identity), loc });
                lanes.push(Stmt { kind: finish, loc });
            }
            if !fills.is_empty() {
                out.extend(fills);
                out.push(Stmt { kind: StmtKind::Parallel { over: *over, vars: vars.clone(), body }, loc: s.loc });
                out.extend(lanes);
                continue;
            }
        }
        out.push(s);
    }
    out
}

/// A `parallel` over a vector fragment that fills a temporary, reduced to one value in a local
/// `[1]`: the loop accumulates each thread's elements straight into the local.
#[allow(clippy::too_many_arguments)]
fn fuse_to_one(
    p: &TileProgram,
    over: BufId,
    vars: &[VarId],
    body: &[Stmt],
    op: ReduceOp,
    src: BufId,
    dst: BufId,
    reads: &IdVec<Buffer, usize>,
) -> Option<Vec<Stmt>> {
    let (BufLayout::Fragment(lo), BufLayout::Fragment(ls), BufLayout::Local) =
        (p.layouts[over], p.layouts[src], p.layouts[dst])
    else {
        return None;
    };
    let f32s = [src, dst].iter().all(|b| p.def.buffers[*b].dtype == DType::F32);
    if lo.kind == FragmentKind::Tile || ls != lo || p.def.buffers[dst].shape != [1] || !f32s || reads[src] != 0 {
        return None;
    }
    let own: Vec<Expr> = vars.iter().map(|v| Expr::Var(*v)).collect();
    let at_zero = vec![Expr::Int(0, None)];
    accumulate_into(body, src, dst, &own, at_zero, op)
}

/// `body` with its one store of `src` (at `own`, at the top level, `dst` untouched) turned into
/// `dst[at] = dst[at] op value`.
fn accumulate_into(
    body: &[Stmt],
    src: BufId,
    dst: BufId,
    own: &[Expr],
    at: Vec<Expr>,
    op: ReduceOp,
) -> Option<Vec<Stmt>> {
    let stores: Vec<usize> = body
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(&s.kind, StmtKind::Store(b, _, _) if *b == src))
        .map(|(i, _)| i)
        .collect();
    let mut touched = vec![];
    super::infer_layouts::elems_in(body, &mut touched);
    if stores.len() != 1
        || touched.iter().any(|(b, _, _)| *b == dst)
        || touched.iter().filter(|(b, _, _)| *b == src).count() != 1
    {
        return None;
    }
    let StmtKind::Store(_, idx, e) = &body[stores[0]].kind else { return None };
    if idx.as_slice() != own {
        return None;
    }
    let bop = if op == ReduceOp::Sum { BinOp::Add } else { BinOp::Max };
    let acc = Expr::Binary(bop, Box::new(Expr::Elem(dst, at.clone())), Box::new(e.clone()));
    let mut fused = body.to_vec();
    fused[stores[0]] = Stmt { kind: StmtKind::Store(dst, at, acc), loc: body[stores[0]].loc };
    Some(fused)
}

#[allow(clippy::too_many_arguments)]
fn fuse(
    p: &TileProgram,
    over: BufId,
    vars: &[VarId],
    body: &[Stmt],
    op: ReduceOp,
    src: BufId,
    dst: BufId,
    axis: usize,
    reads: &IdVec<Buffer, usize>,
) -> Option<Vec<Stmt>> {
    let (BufLayout::Fragment(lo), BufLayout::Fragment(ls), BufLayout::Fragment(ld)) =
        (p.layouts[over], p.layouts[src], p.layouts[dst])
    else {
        return None;
    };
    let kind = if axis == 1 { FragmentKind::Rows } else { FragmentKind::Cols };
    let f32s = [src, dst].iter().all(|b| p.def.buffers[*b].dtype == DType::F32);
    if lo.kind != FragmentKind::Tile || ls != lo || ld != lo.vector(kind) || !f32s || reads[src] != 0 || vars.len() != 2
    {
        return None;
    }
    let own: Vec<Expr> = vars.iter().map(|v| Expr::Var(*v)).collect();
    // Exactly one store of the temporary, at the loop's own index, at the top of the body; the
    // vector itself is not touched there.
    let vi = vec![Expr::Var(if axis == 1 { vars[0] } else { vars[1] })];
    accumulate_into(body, src, dst, &own, vi, op)
}

#[cfg(test)]
mod tests {
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::passes::TileProgram;
    use crate::tile::{BinOp, ReduceOp};

    /// The kernel after layout inference and this pass, as text.
    fn fused(k: KernelBuilder) -> String {
        let mut p = TileProgram::new(k.finish().expect("valid"), crate::target::Target::Sm80);
        crate::passes::infer_layouts::infer_layouts(&mut p).expect("layouts");
        super::fuse_reductions(&mut p).expect("fuses");
        p.def.to_string()
    }

    #[test]
    fn a_product_reduced_along_rows_accumulates_in_the_vector() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.fragment("s", &[16, 128], DType::F32, loc(3));
        let tmp = k.fragment("tmp", &[16, 128], DType::F32, loc(4));
        let x = k.fragment("x", &[128], DType::F32, loc(5));
        let u = k.fragment("u", &[16], DType::F32, loc(6));
        k.fill(&s, 1.0, loc(7));
        k.fill(&x, 2.0, loc(8));
        let ij = k.begin_parallel(&s, &["i", "j"], loc(9));
        let prod = Val::bin(BinOp::Mul, k.elem(&s, ij.clone(), loc(10)), k.elem(&x, vec![ij[1].clone()], loc(10)));
        k.store(&tmp, ij, prod, loc(10));
        k.end();
        k.reduce(ReduceOp::Sum, &tmp, &u, 1, loc(11));
        let text = fused(k);
        assert!(text.contains("reduce_lanes_Sum u axis=1") && !text.contains("tmp["), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn two_products_reduced_after_one_loop_share_the_pass() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.fragment("s", &[16, 128], DType::F32, loc(3));
        let t1 = k.fragment("t1", &[16, 128], DType::F32, loc(4));
        let t2 = k.fragment("t2", &[16, 128], DType::F32, loc(5));
        let x = k.fragment("x", &[128], DType::F32, loc(6));
        let y = k.fragment("y", &[128], DType::F32, loc(7));
        let u = k.fragment("u", &[16], DType::F32, loc(8));
        let o = k.fragment("o", &[16], DType::F32, loc(9));
        k.fill(&s, 1.0, loc(10));
        k.fill(&x, 2.0, loc(11));
        k.fill(&y, 3.0, loc(12));
        let ij = k.begin_parallel(&s, &["i", "j"], loc(13));
        let sx = Val::bin(BinOp::Mul, k.elem(&s, ij.clone(), loc(14)), k.elem(&x, vec![ij[1].clone()], loc(14)));
        k.store(&t1, ij.clone(), sx, loc(14));
        let sy = Val::bin(BinOp::Mul, k.elem(&s, ij.clone(), loc(15)), k.elem(&y, vec![ij[1].clone()], loc(15)));
        k.store(&t2, ij, sy, loc(15));
        k.end();
        k.reduce(ReduceOp::Sum, &t1, &u, 1, loc(16));
        k.reduce(ReduceOp::Sum, &t2, &o, 1, loc(17));
        let text = fused(k);
        assert_eq!(text.matches("parallel").count(), 1, "{text}");
        assert!(text.contains("reduce_lanes_Sum u axis=1") && text.contains("reduce_lanes_Sum o axis=1"), "{text}");
        assert!(!text.contains("t1[") && !text.contains("t2["), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_temporary_reduced_twice_keeps_its_stores() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.fragment("s", &[16, 128], DType::F32, loc(3));
        let tmp = k.fragment("tmp", &[16, 128], DType::F32, loc(4));
        let u = k.fragment("u", &[16], DType::F32, loc(5));
        let m = k.fragment("m", &[16], DType::F32, loc(6));
        k.fill(&s, 1.0, loc(7));
        let ij = k.begin_parallel(&s, &["i", "j"], loc(8));
        let v = Val::bin(BinOp::Mul, k.elem(&s, ij.clone(), loc(9)), k.elem(&s, ij.clone(), loc(9)));
        k.store(&tmp, ij, v, loc(9));
        k.end();
        k.reduce(ReduceOp::Sum, &tmp, &u, 1, loc(10));
        k.reduce(ReduceOp::Max, &tmp, &m, 1, loc(11));
        let text = fused(k);
        assert!(text.contains("tmp[i#1, j#2] =") && !text.contains("reduce_lanes"), "{text}");
    }

    #[test]
    fn a_vector_reduced_to_one_value_accumulates_in_the_local() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 64, loc(2));
        let s = k.fragment("s", &[32, 128], DType::F32, loc(3));
        let x = k.fragment("x", &[128], DType::F32, loc(4));
        let sq = k.fragment("sq", &[128], DType::F32, loc(5));
        let n = k.local("n", &[1], DType::F32, loc(6));
        k.fill(&s, 1.0, loc(7));
        k.fill(&x, 2.0, loc(8));
        let ij = k.begin_parallel(&s, &["i", "j"], loc(9));
        let sx = Val::bin(BinOp::Mul, k.elem(&s, ij.clone(), loc(10)), k.elem(&x, vec![ij[1].clone()], loc(10)));
        k.store(&s, ij, sx, loc(10));
        k.end();
        let j = k.begin_parallel(&sq, &["j"], loc(11));
        let xx = Val::bin(BinOp::Mul, k.elem(&x, j.clone(), loc(12)), k.elem(&x, j.clone(), loc(12)));
        k.store(&sq, j, xx, loc(12));
        k.end();
        k.reduce(ReduceOp::Sum, &sq, &n, 0, loc(13));
        let text = fused(k);
        assert!(text.contains("reduce_vector_lanes_Sum n over sq") && !text.contains("sq[j"), "{text}");
        insta::assert_snapshot!(text);
    }
}
