//! The tiles a statement reads and writes, at any depth: what the lowering needs to know to
//! leave a `wgmma` group in flight across it (`lower/wgmma_waits.rs`) or hold a store
//! (`lower/deferred_stores.rs`), and which tiles a kernel uses at all (`drop_dead_tiles`).

use std::collections::HashSet;

use crate::tile::*;

/// The tiles a statement (and every statement inside it) reads and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TileAccess {
    /// Tiles read (an element, a copy's source, a gemm's operands and accumulator).
    pub reads: HashSet<BufId>,
    /// Tiles written (a store, a fill, a copy's destination, a gemm's accumulator).
    pub writes: HashSet<BufId>,
}

impl TileAccess {
    /// Whether the statement reads or writes `b`.
    pub fn touches(&self, b: BufId) -> bool {
        self.reads.contains(&b) || self.writes.contains(&b)
    }
}

/// What `s` reads and writes.
pub(crate) fn tile_access(s: &Stmt) -> TileAccess {
    let mut a = TileAccess::default();
    visit_stmts(std::slice::from_ref(s), &mut |s| {
        s.for_each_expr(&mut |e: &Expr| expr_reads(e, &mut a.reads));
        match &s.kind {
            StmtKind::Copy { src, dst } => {
                if let Region::Buf(b) = src {
                    a.reads.insert(*b);
                }
                if let Region::Buf(b) = dst {
                    a.writes.insert(*b);
                }
            }
            StmtKind::Gemm { a: x, b: y, c } => {
                a.reads.extend([x.buf, y.buf, *c]);
                a.writes.insert(*c);
            }
            StmtKind::Fill(b, _) | StmtKind::Store(b, ..) => {
                a.writes.insert(*b);
            }
            StmtKind::Reduce { src, dst, .. } | StmtKind::Cumsum { src, dst, .. } => {
                a.reads.insert(*src);
                a.writes.insert(*dst);
            }
            StmtKind::ReduceLanes { dst, .. } => {
                a.reads.insert(*dst);
                a.writes.insert(*dst);
            }
            StmtKind::ReduceVectorLanes { dst, vector, .. } => {
                a.reads.extend([*dst, *vector]);
                a.writes.insert(*dst);
            }
            StmtKind::Print(b) => {
                a.reads.insert(*b);
            }
            StmtKind::Parallel { over, .. } => {
                // Its index space: a fragment's lanes own elements as its layout says.
                a.reads.insert(*over);
            }
            // Every kind is listed, so a new one must say what it touches (the expressions
            // above are its reads).
            StmtKind::Assign(..)
            | StmtKind::StoreGlobal(..)
            | StmtKind::Prefetch(_)
            | StmtKind::For { .. }
            | StmtKind::If(..)
            | StmtKind::WarpGroup { .. }
            | StmtKind::Producer(_)
            | StmtKind::Barrier => {}
        }
    });
    a
}

/// The tiles an expression reads an element of.
fn expr_reads(e: &Expr, out: &mut HashSet<BufId>) {
    e.for_each_elem_tile(&mut |b| {
        out.insert(b);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::SrcLoc;

    fn at(kind: StmtKind) -> Stmt {
        Stmt { kind, loc: SrcLoc::new("test.rs", 1, 1) }
    }

    /// A gemm reads its operands and accumulator and writes the accumulator; a `parallel`
    /// reads what its element statements read and writes what they store, at any depth; a
    /// copy reads its source tile and writes its destination tile.
    #[test]
    fn accesses_reach_into_nested_statements() {
        let [a, b, c, d] = [0, 1, 2, 3].map(BufId::new);
        let (i, j) = (VarId::new(0), VarId::new(1));
        let operand = |buf, transposed| Operand { buf, transposed, replicated: false };
        let gemm = at(StmtKind::Gemm { a: operand(a, false), b: operand(b, true), c });
        let g = tile_access(&gemm);
        assert_eq!(g.reads, HashSet::from([a, b, c]));
        assert_eq!(g.writes, HashSet::from([c]));
        let ij = vec![Expr::Var(i), Expr::Var(j)];
        let store = at(StmtKind::Store(d, ij.clone(), Expr::Elem(c, ij)));
        let guarded = at(StmtKind::If(Expr::Bool(true), vec![store], vec![]));
        let par = at(StmtKind::Parallel { over: d, vars: vec![i, j], body: vec![guarded] });
        let p = tile_access(&par);
        assert!(p.touches(c) && p.writes.contains(&d) && !p.writes.contains(&c), "{p:?}");
        assert!(!p.touches(a) && !p.touches(b));
        let copy = at(StmtKind::Copy { src: Region::Buf(d), dst: Region::Buf(a) });
        let cp = tile_access(&copy);
        assert_eq!((cp.reads, cp.writes), (HashSet::from([d]), HashSet::from([a])));
    }
}
