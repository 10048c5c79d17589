//! Which variables and tiles can differ between the blocks of one cluster.
//!
//! A kernel launched in clusters of `n` blocks along x (`launch(.., cluster = n)`) runs each
//! cluster's blocks with block indices `x = c n .. c n + n - 1`: the index itself differs
//! between them, `x / k` for a multiple `k` of `n` does not, and nor do the other axes' block
//! indices. A value differs when it reads something that does or is set under a condition,
//! loop bound or `if` that does (a fixed point over the kernel, as a loop's later iterations
//! read what its earlier ones set). A tile differs when anything it is written from does.
//! What a producer ring across a cluster computes once for all of its blocks (the loop's fills,
//! its producer block and the `let`s before it, `place_producers`) must not.
//!
//! The producer ring's loop itself is taken to run over the same iterations in every block
//! (the documented rule of a ring across a cluster, which the simulator checks): its counter
//! is the same in each.

use std::collections::HashSet;

use super::tile_access::tile_access;
use crate::tile::*;

/// A variable or a tile that can differ between the blocks of one cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Varying {
    /// A variable (the block index itself among them).
    Var(VarId),
    /// A tile.
    Tile(BufId),
}

impl Varying {
    /// Its name in `def`.
    pub fn name(self, def: &KernelDef) -> &str {
        match self {
            Varying::Var(v) => &def.vars[v].name,
            Varying::Tile(b) => &def.buffers[b].name,
        }
    }
}

/// The variables and tiles of a kernel that can differ between the blocks of one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterVarying {
    /// The block index along the cluster's axis, where the kernel has one and is launched in
    /// clusters of more than one block.
    index: Option<VarId>,
    /// Blocks in a cluster.
    blocks: i64,
    /// Variables set from something that differs, or under a condition that does.
    pub vars: HashSet<VarId>,
    /// Tiles written from something that differs, or under a condition that does.
    pub tiles: HashSet<BufId>,
}

impl ClusterVarying {
    /// What differs between the blocks of a cluster of `def`: nothing in a kernel launched
    /// without clusters.
    pub fn of(def: &KernelDef) -> ClusterVarying {
        let index = def.block_vars[0].filter(|_| def.cluster_blocks > 1);
        let mut varying = ClusterVarying { index, blocks: i64::from(def.cluster_blocks.max(1)), ..Default::default() };
        if index.is_none() {
            return varying;
        }
        loop {
            let before = (varying.vars.len(), varying.tiles.len());
            varying.walk(&def.body, false);
            if (varying.vars.len(), varying.tiles.len()) == before {
                return varying;
            }
        }
    }

    /// The first variable or tile `e` reads that can differ between the cluster's blocks.
    pub fn varying_in_expr(&self, e: &Expr) -> Option<Varying> {
        let first = |es: &[&Expr]| es.iter().find_map(|x| self.varying_in_expr(x));
        match e {
            Expr::Var(v) if Some(*v) == self.index || self.vars.contains(v) => Some(Varying::Var(*v)),
            // The cluster's own index: the same in each of its blocks.
            Expr::Binary(BinOp::Div, a, k)
                if matches!(**a, Expr::Var(v) if Some(v) == self.index)
                    && matches!(**k, Expr::Int(k, _) if k > 0 && k % self.blocks == 0) =>
            {
                None
            }
            Expr::Elem(b, _) if self.tiles.contains(b) => Some(Varying::Tile(*b)),
            Expr::Elem(_, idx) | Expr::Load(_, idx) => idx.iter().find_map(|x| self.varying_in_expr(x)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => self.varying_in_expr(a),
            Expr::Binary(_, a, b) => first(&[a, b]),
            Expr::Select(c, a, b) => first(&[c, a, b]),
            Expr::Var(_) | Expr::Int(..) | Expr::Float(_) | Expr::Bool(_) | Expr::Dim(_) | Expr::Scalar(_) => None,
        }
    }

    /// Whether statement `s` itself (its expressions and, for a statement without a body, the
    /// tiles it reads) reads something that can differ between the cluster's blocks.
    pub fn stmt_reads_varying(&self, s: &Stmt) -> bool {
        self.varying_in_stmt(s).is_some()
    }

    /// The first variable or tile statement `s` itself reads ([`Self::stmt_reads_varying`])
    /// that can differ between the cluster's blocks.
    pub fn varying_in_stmt(&self, s: &Stmt) -> Option<Varying> {
        let mut found = None;
        s.for_each_expr(&mut |e| {
            if found.is_none() {
                found = self.varying_in_expr(e);
            }
        });
        let leaf = s.bodies().iter().all(|b| b.is_empty());
        let mut tiles: Vec<BufId> =
            tile_access(s).reads.into_iter().filter(|b| leaf && self.tiles.contains(b)).collect();
        tiles.sort();
        found.or(tiles.first().map(|b| Varying::Tile(*b)))
    }

    /// One pass over `body`, under a condition that differs between blocks with `control`.
    fn walk(&mut self, body: &[Stmt], control: bool) {
        for s in body {
            let varies = control || self.stmt_reads_varying(s);
            match &s.kind {
                StmtKind::Assign(v, _) => {
                    if varies {
                        self.vars.insert(*v);
                    }
                }
                // The ring's loop runs over the same iterations in every block (the module's
                // doc): its counter and body are as uniform as what is around it.
                StmtKind::For { kind: LoopKind::Pipelined { .. }, body, .. }
                    if body.iter().any(|x| matches!(x.kind, StmtKind::Producer(_))) =>
                {
                    self.walk(body, control)
                }
                StmtKind::For { var, body, .. } => {
                    if varies {
                        self.vars.insert(*var);
                    }
                    self.walk(body, varies);
                }
                // A `parallel`'s indices and a warp group's warp index are the same in every
                // block; what is inside is as uniform as its own reads.
                StmtKind::Parallel { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                    self.walk(body, control)
                }
                StmtKind::If(_, then, other) => {
                    self.walk(then, varies);
                    self.walk(other, varies);
                }
                _ => {
                    if varies {
                        self.tiles.extend(tile_access(s).writes);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile_text::parse_kernel;

    fn varying(body: &str) -> (KernelDef, ClusterVarying) {
        let text = format!(
            "kernel t(M: dim, K: dim, a: f32[M, K], o: mut f32[M, K]) threads=32 cluster=2 grid=[4, 1, 1] {{
  vars bx#0: i32, h#1: i32, r#2: i32, i#3: i32, c#4: i32, j#5: i32
  block_vars [bx#0, _, _]
  s = Shared<f32>[16, 16]
  u = Shared<f32>[16, 16]
{body}
}}"
        );
        let def = parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let v = ClusterVarying::of(&def);
        (def, v)
    }

    fn var(def: &KernelDef, name: &str) -> VarId {
        def.vars.iter_ids().find(|(_, v)| v.name == name).map(|(id, _)| id).expect("a variable")
    }

    fn tile(def: &KernelDef, name: &str) -> BufId {
        def.buffers.iter_ids().find(|(_, b)| b.name == name).map(|(id, _)| id).expect("a tile")
    }

    /// The block index differs; the cluster's index (`x / k`, `k` a multiple of the cluster)
    /// does not, and what is computed from it alone does not either.
    #[test]
    fn the_cluster_index_is_the_same_in_its_blocks() {
        let (def, v) = varying(
            "  h#1 = (bx#0 Div 2)
  r#2 = (bx#0 Rem 2)
  c#4 = (bx#0 Div 3)
  copy a[(h#1 Mul 16), 0; 16x16] -> s
  copy a[(r#2 Mul 16), 0; 16x16] -> u",
        );
        assert!(!v.vars.contains(&var(&def, "h")));
        assert!(v.vars.contains(&var(&def, "r")));
        assert!(v.vars.contains(&var(&def, "c")), "3 is no multiple of the cluster's 2 blocks");
        assert!(!v.tiles.contains(&tile(&def, "s")));
        assert!(v.tiles.contains(&tile(&def, "u")));
    }

    /// What a loop or an `if` over something that differs sets differs, and what is set from a
    /// tile that differs, as late in the kernel as it comes (the fixed point).
    #[test]
    fn conditions_and_loops_carry_what_differs() {
        let (def, v) = varying(
            "  j#5 = 0
  for i#3 in serial 0..2 {
    c#4 = j#5
    j#5 = bx#0
  }
  if (bx#0 Lt 2) {
    h#1 = 1
  }
  copy a[0, 0; 16x16] -> s
  for r#2 in serial 0..bx#0 {
    copy a[0, 0; 16x16] -> u
  }",
        );
        for name in ["j", "c", "h", "r"] {
            assert!(v.vars.contains(&var(&def, name)), "{name}");
        }
        assert!(!v.vars.contains(&var(&def, "i")));
        assert!(!v.tiles.contains(&tile(&def, "s")));
        assert!(v.tiles.contains(&tile(&def, "u")));
    }

    /// Without clusters nothing differs between the blocks of one.
    #[test]
    fn a_kernel_without_clusters_has_nothing_that_differs() {
        let text = "kernel t(M: dim, K: dim, a: f32[M, K]) threads=32 grid=[4, 1, 1] {
  vars bx#0: i32, h#1: i32
  block_vars [bx#0, _, _]
  h#1 = bx#0
}";
        let def = parse_kernel(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ClusterVarying::of(&def), ClusterVarying { blocks: 1, ..Default::default() });
    }
}
