//! `insert_barriers`: places every block barrier; kernel authors write none.
//!
//! Tracks, per shared tile, the reads and writes made since the last barrier. A statement that
//! reads what another thread may have written, or writes what another may have read or written,
//! gets a `bar.sync` before it. Element-wise loops that touch a shared tile only at their own
//! index, with the same distribution, are owned by one thread per element and need none between
//! them. Loops are walked twice so accesses late in one iteration meet those early in the next.
//! A `pipelined` loop syncs at the top of every iteration and after its end (its lowering emits
//! those barriers), and the copies that fill its stages are ordered by them.

use super::plan_pipelines::is_stage_fill;
use super::{BufLayout, TileProgram};
use crate::diag::Diag;
use crate::tile::*;

#[derive(Clone, Debug, PartialEq)]
struct Access {
    buf: BufId,
    write: bool,
    /// `Some(shape)` when each element is touched only by the thread that owns it in a
    /// `parallel` over a shared tile of this shape.
    owned: Option<Vec<u32>>,
}

fn conflicts(pending: &[Access], new: &[Access]) -> bool {
    new.iter().any(|n| {
        pending.iter().any(|p| p.buf == n.buf && (p.write || n.write) && !(p.owned.is_some() && p.owned == n.owned))
    })
}

/// Inserts `Barrier` statements.
pub fn insert_barriers(p: &mut TileProgram) -> Result<(), Diag> {
    let body = std::mem::take(&mut p.def.body);
    let mut state = vec![];
    p.def.body = walk(p, &body, &mut state);
    Ok(())
}

fn is_shared(p: &TileProgram, b: BufId) -> bool {
    matches!(p.layouts[b], BufLayout::Shared(_))
}

fn expr_reads(p: &TileProgram, e: &Expr, out: &mut Vec<Access>) {
    let mut found = vec![];
    super::infer_layouts::elems_in(
        &[Stmt { kind: StmtKind::Assign(VarId::new(0), e.clone()), loc: Default::default() }],
        &mut found,
    );
    for (b, _, _) in found {
        if is_shared(p, b) {
            out.push(Access { buf: b, write: false, owned: None });
        }
    }
}

fn accesses(p: &TileProgram, s: &Stmt) -> Vec<Access> {
    let mut out = vec![];
    let rd = |b: BufId, out: &mut Vec<Access>| {
        if is_shared(p, b) {
            out.push(Access { buf: b, write: false, owned: None })
        }
    };
    let wr = |b: BufId, out: &mut Vec<Access>| {
        if is_shared(p, b) {
            out.push(Access { buf: b, write: true, owned: None })
        }
    };
    match &s.kind {
        StmtKind::Copy { src, dst } => {
            for e in src.index_exprs().chain(dst.index_exprs()) {
                expr_reads(p, e, &mut out);
            }
            if let Region::Buf(b) = src {
                rd(*b, &mut out);
            }
            if let Region::Buf(b) = dst {
                wr(*b, &mut out);
            }
        }
        StmtKind::Gemm { a, b, .. } => {
            rd(a.buf, &mut out);
            rd(b.buf, &mut out);
        }
        // A shared fill is spread over threads exactly as a `parallel` over the tile.
        StmtKind::Fill(b, _) if is_shared(p, *b) => {
            out.push(Access { buf: *b, write: true, owned: Some(p.def.buffers[*b].shape.clone()) })
        }
        StmtKind::Fill(..) => {}
        StmtKind::Reduce { src, dst, .. } | StmtKind::Cumsum { src, dst, .. } => {
            rd(*src, &mut out);
            wr(*dst, &mut out);
        }
        StmtKind::Print(b) => rd(*b, &mut out),
        StmtKind::Prefetch(r) => {
            for e in r.index_exprs() {
                expr_reads(p, e, &mut out);
            }
        }
        StmtKind::Assign(_, e) => expr_reads(p, e, &mut out),
        StmtKind::Parallel { over, vars, body } => {
            let own_shape = is_shared(p, *over).then(|| p.def.buffers[*over].shape.clone());
            let own_idx: Vec<Expr> = vars.iter().map(|v| Expr::Var(*v)).collect();
            let mut found = vec![];
            super::infer_layouts::elems_in(body, &mut found);
            let mut writes = vec![];
            collect_stores(body, &mut writes);
            for (b, idx, _) in found {
                if !is_shared(p, b) {
                    continue;
                }
                let write = writes.iter().any(|(wb, widx)| *wb == b && *widx == idx);
                let owned = match &own_shape {
                    Some(shape) if idx == own_idx && p.def.buffers[b].shape == *shape => Some(shape.clone()),
                    _ => None,
                };
                out.push(Access { buf: b, write, owned });
            }
        }
        StmtKind::Store(b, idx, e) => {
            for i in idx {
                expr_reads(p, i, &mut out);
            }
            expr_reads(p, e, &mut out);
            wr(*b, &mut out);
        }
        StmtKind::StoreGlobal(_, idx, e) => {
            for i in idx {
                expr_reads(p, i, &mut out);
            }
            expr_reads(p, e, &mut out);
        }
        StmtKind::If(c, _, _) => expr_reads(p, c, &mut out),
        StmtKind::For { start, end, .. } => {
            expr_reads(p, start, &mut out);
            expr_reads(p, end, &mut out);
        }
        // A producer block on fill warps hands its tiles over through its ring's mbarriers.
        StmtKind::Barrier
        | StmtKind::ReduceLanes { .. }
        | StmtKind::ReduceVectorLanes { .. }
        | StmtKind::WarpGroup { .. }
        | StmtKind::Producer(_) => {}
    }
    out
}

fn collect_stores(body: &[Stmt], out: &mut Vec<(BufId, Vec<Expr>)>) {
    for s in body {
        match &s.kind {
            StmtKind::Store(b, idx, _) => out.push((*b, idx.clone())),
            StmtKind::If(_, t, e) => {
                collect_stores(t, out);
                collect_stores(e, out);
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                collect_stores(body, out)
            }
            _ => {}
        }
    }
}

fn barrier(loc: crate::diag::SrcLoc) -> Stmt {
    Stmt { kind: StmtKind::Barrier, loc }
}

fn merge(into: &mut Vec<Access>, from: Vec<Access>) {
    for a in from {
        if !into.contains(&a) {
            into.push(a);
        }
    }
}

fn walk(p: &TileProgram, body: &[Stmt], state: &mut Vec<Access>) -> Vec<Stmt> {
    let mut out = vec![];
    for s in body {
        match &s.kind {
            StmtKind::Barrier => {
                state.clear();
                out.push(s.clone());
            }
            StmtKind::WarpGroup { first, count, id, var, body } => {
                // The group's tiles are its own (`infer_layouts` checks): its barriers start
                // from nothing pending and are the group's named barrier.
                let mut own = vec![];
                let body = walk(p, body, &mut own);
                let kind = StmtKind::WarpGroup { first: *first, count: *count, id: *id, var: *var, body };
                out.push(Stmt { kind, loc: s.loc });
            }
            StmtKind::Producer(body) => {
                // A producer block left in place runs on the fill warps (`place_producers`), one
                // iteration ahead: its barriers are theirs, from nothing pending (its reads of
                // the fills and its hand-over are the ring's to order), and it leaves nothing
                // pending for the rest of the body.
                let mut own = vec![];
                let body = walk(p, body, &mut own);
                out.push(Stmt { kind: StmtKind::Producer(body), loc: s.loc });
            }
            StmtKind::If(c, t, e) => {
                let head = accesses(p, s);
                if conflicts(state, &head) {
                    out.push(barrier(s.loc));
                    state.clear();
                }
                merge(state, head);
                let mut st_t = state.clone();
                let mut st_e = state.clone();
                let t2 = walk(p, t, &mut st_t);
                let e2 = walk(p, e, &mut st_e);
                *state = st_t;
                merge(state, st_e);
                out.push(Stmt { kind: StmtKind::If(c.clone(), t2, e2), loc: s.loc });
            }
            StmtKind::For { var, kind: kind @ LoopKind::Pipelined { .. }, start, end, body } => {
                // Writes into the stages happen in the prologue, before the first barrier, and
                // so do the reads of shared tiles their coordinates make.
                let staged: Vec<Access> =
                    body.iter().filter(|x| is_stage_fill(&p.def, x)).flat_map(|x| accesses(p, x)).collect();
                if conflicts(state, &staged) {
                    out.push(barrier(s.loc));
                }
                state.clear();
                let inner: Vec<Stmt> = body.iter().filter(|x| !is_stage_fill(&p.def, x)).cloned().collect();
                // Each iteration issues the next fills after its top barrier: their reads of shared
                // tables are pending when the body starts.
                let mut st: Vec<Access> = staged.iter().filter(|a| !a.write).cloned().collect();
                let mut inner2 = walk(p, &inner, &mut st);
                // Put the stage-filling copies back first, where the lowering expects them.
                let mut new_body: Vec<Stmt> = body.iter().filter(|x| !inner.contains(x)).cloned().collect();
                new_body.append(&mut inner2);
                out.push(Stmt {
                    kind: StmtKind::For {
                        var: *var,
                        kind: *kind,
                        start: start.clone(),
                        end: end.clone(),
                        body: new_body,
                    },
                    loc: s.loc,
                });
                state.clear();
            }
            StmtKind::For { var, kind, start, end, body } => {
                let head = accesses(p, s);
                if conflicts(state, &head) {
                    out.push(barrier(s.loc));
                    state.clear();
                }
                merge(state, head);
                let mut first = state.clone();
                walk(p, body, &mut first);
                let mut entry = state.clone();
                merge(&mut entry, first);
                let mut second = entry;
                let body2 = walk(p, body, &mut second);
                merge(state, second);
                out.push(Stmt {
                    kind: StmtKind::For { var: *var, kind: *kind, start: start.clone(), end: end.clone(), body: body2 },
                    loc: s.loc,
                });
            }
            _ => {
                let acc = accesses(p, s);
                if conflicts(state, &acc) {
                    out.push(barrier(s.loc));
                    state.clear();
                }
                merge(state, acc);
                out.push(s.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn barrier_between_shared_write_and_read_and_at_loop_back_edge() {
        let mut p =
            crate::passes::TileProgram::new(crate::passes::testing::staged_copy_kernel(), crate::target::Target::Sm80);
        crate::passes::infer_layouts::infer_layouts(&mut p).expect("layouts");
        super::insert_barriers(&mut p).expect("barriers");
        insta::assert_snapshot!(p.def.to_string());
    }

    #[test]
    fn owned_element_wise_updates_need_no_barrier_between_them() {
        let mut p = crate::passes::TileProgram::new(
            crate::passes::testing::owned_updates_kernel(),
            crate::target::Target::Sm80,
        );
        crate::passes::infer_layouts::infer_layouts(&mut p).expect("layouts");
        super::insert_barriers(&mut p).expect("barriers");
        let text = p.def.to_string();
        // One barrier: before the copy that reads what the element-wise loops wrote.
        assert_eq!(text.matches("barrier").count(), 1, "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_table_read_by_stage_fills_is_not_rewritten_before_a_barrier() {
        use crate::builder::*;
        use crate::dtype::DType;
        use crate::passes::testing::loc;
        use crate::tile::LoopKind;
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "N"], DType::F32, false);
        k.launch(vec![Host::int(1)], 64, loc(2));
        let tab = k.shared("tab", &[64], DType::I32, loc(3));
        let st = k.shared("st", &[4, 64], DType::F32, loc(4));
        k.fill(&tab, 0, loc(5));
        let it = k.begin_for("it", LoopKind::pipelined(2), 0, 4, loc(6));
        // The fill's row comes from the table; the body then rewrites the table.
        let row = k.elem(&tab, vec![it.clone()], loc(7));
        k.copy(k.tile_at(&a, vec![row, Val::from(0)], &[4, 64], loc(7)), st, loc(7));
        let j = k.begin_parallel(&tab, &["j"], loc(8));
        k.store(&tab, j.clone(), Val::bin(crate::tile::BinOp::Add, j[0].clone(), it), loc(8));
        k.end();
        k.end();
        let mut p = crate::passes::TileProgram::new(k.finish().expect("valid"), crate::target::Target::Sm80);
        crate::passes::infer_layouts::infer_layouts(&mut p).expect("layouts");
        super::insert_barriers(&mut p).expect("barriers");
        let text = p.def.to_string();
        let body = &text[text.find("pipelined").expect("the loop")..];
        let (fill, rest) = body.split_at(body.find("parallel").expect("the table update"));
        assert!(fill.contains("barrier") && !rest.contains("barrier"), "{text}");
    }
}
