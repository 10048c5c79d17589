//! TMA bulk stores: on sm_90a a copy from a shared tile to a global box is one thread's
//! `cp.async.bulk.tensor` stores (one per slab of the tile) when the box takes TMA
//! (`tma_choice`). The tile must be laid out as the boxes are, canonically: `infer_layouts` asks
//! [`store_sources`] which tiles to lay out so (those whose only reader is such a store, and which
//! only fragments write), and [`plan_tma_stores`] then records each store's boxes and map.

use super::TileProgram;
use crate::diag::{Diag, SrcLoc};
use crate::tile::*;
use crate::tma_choice::{choose_tma_store, register_map, takes_tma_once_canonical, TmaBoxes};
use std::collections::HashSet;

/// A copy from a shared tile to a global box that a bulk store makes.
#[derive(Clone, Debug, PartialEq)]
pub struct TmaStore {
    /// The copy in the kernel source.
    pub loc: SrcLoc,
    /// The shared tile stored.
    pub buf: BufId,
    /// Its boxes, and the index of their map in [`TileProgram::tensor_maps`].
    pub boxes: (TmaBoxes, usize),
}

/// The shared tiles whose one reader is a copy to a global box that would take TMA once the
/// tile is canonical (into a tensor nothing else of the kernel touches), and whose writers are
/// copies from fragments: `infer_layouts` lays these out canonically.
pub fn store_sources(p: &TileProgram) -> HashSet<BufId> {
    let mut stored = vec![];
    let mut other_use = HashSet::new();
    visit_stmts(&p.def.body, &mut |s| match &s.kind {
        StmtKind::Copy { src: Region::Buf(b), dst: region @ Region::Global { tensor, .. } } => {
            let takes = accesses_of(&p.def, *tensor) == 1 && takes_tma_once_canonical(p, region, *b);
            stored.push((*b, takes))
        }
        StmtKind::Copy { src: Region::Buf(f), dst: Region::Buf(_) } if p.def.buffers[*f].scope == Scope::Fragment => {}
        // A loop's or branch's statements are visited on their own.
        StmtKind::For { .. } | StmtKind::If(..) | StmtKind::WarpGroup { .. } => {}
        StmtKind::Parallel { over, .. } => {
            other_use.insert(*over);
        }
        _ => {
            let mut used = vec![];
            super::infer_layouts::tiles_used(std::slice::from_ref(s), &mut used);
            other_use.extend(used);
        }
    });
    let stores_of = |b: BufId| stored.iter().filter(|(x, _)| *x == b).count();
    stored
        .iter()
        .filter(|(b, takes)| *takes && stores_of(*b) == 1 && !other_use.contains(b))
        .filter(|(b, _)| p.def.buffers[*b].scope == Scope::Shared)
        .map(|(b, _)| *b)
        .collect()
}

/// Records every copy from a shared tile to a global box that takes TMA in `p.tma_stores`,
/// its map in `p.tensor_maps`.
pub fn plan_tma_stores(p: &mut TileProgram) -> Result<(), Diag> {
    let mut stores = vec![];
    visit_stmts(&p.def.body, &mut |s| {
        if let StmtKind::Copy { src: Region::Buf(b), dst: Region::Global { tensor, .. } } = &s.kind {
            // A bulk store's global writes are not ordered before the kernel's later accesses
            // to the tensor (its wait covers the shared reads only): a tensor the kernel
            // touches anywhere else keeps the threads' stores.
            if p.def.buffers[*b].scope == Scope::Shared && accesses_of(&p.def, *tensor) == 1 {
                if let Ok(boxes) = choose_tma_store(p, s) {
                    stores.push((s.loc, *b, boxes));
                }
            }
        }
    });
    for (loc, buf, mut boxes) in stores {
        let map = register_map(&mut p.tensor_maps, &boxes.map);
        boxes.map.name = p.tensor_maps[map].name.clone();
        p.tma_stores.push(TmaStore { loc, buf, boxes: (boxes, map) });
    }
    Ok(())
}

/// How many copies (and prefetches) of `def` name global tensor `t`.
fn accesses_of(def: &KernelDef, t: ParamId) -> usize {
    let mut n = 0;
    visit_stmts(&def.body, &mut |s| {
        let names = |r: &Region| matches!(r, Region::Global { tensor, .. } if *tensor == t);
        n += match &s.kind {
            StmtKind::Copy { src, dst } => usize::from(names(src)) + usize::from(names(dst)),
            StmtKind::Prefetch(r) => usize::from(names(r)),
            _ => 0,
        };
    });
    n
}

impl TileProgram {
    /// The bulk store of shared tile `buf` by the copy at `loc`, if it is one.
    pub fn tma_store(&self, loc: SrcLoc, buf: BufId) -> Option<&TmaStore> {
        self.tma_stores.iter().find(|s| s.loc == loc && s.buf == buf)
    }
}
