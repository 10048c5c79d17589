//! `drop_dead_tiles`: a shared tile that no statement touches takes no shared memory (its
//! stages become 0, so `allocate_shared` gives it no bytes). A kernel may then declare every
//! tile at its full size and let its configuration decide which it uses, instead of shrinking
//! the unused ones by hand.

use super::{BufLayout, TileProgram};
use crate::analysis::tile_access::tile_access;
use crate::diag::Diag;
use crate::tile::*;

/// Marks every shared tile the body never touches as taking no stages.
pub fn drop_dead_tiles(p: &mut TileProgram) -> Result<(), Diag> {
    let used = used_buffers(&p.def.body, p.def.buffers.len());
    for (b, _) in p.def.buffers.iter_ids() {
        if !used[b] && matches!(p.layouts[b], BufLayout::Shared(_)) {
            p.stages[b] = 0;
        }
    }
    Ok(())
}

/// Per buffer: whether any statement of `body` (nested bodies included) reads or writes it.
pub fn used_buffers(body: &[Stmt], buffers: usize) -> IdVec<Buffer, bool> {
    let mut used = IdVec::filled(buffers, false);
    for s in body {
        let access = tile_access(s);
        for b in access.reads.into_iter().chain(access.writes) {
            used[b] = true;
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::run_tile_passes;
    use crate::passes::testing::loc;

    /// A tile no statement touches gets no shared memory; the tiles around it keep theirs, in
    /// order, and a tile read only in an element expression inside a nested body stays.
    #[test]
    fn an_unused_tile_takes_no_shared_memory() {
        let k = KernelBuilder::new("dead", loc(1));
        let a = k.tensor("a", &["M", "N"], DType::F32, false);
        let o = k.tensor("o", &["M", "N"], DType::F32, true);
        k.launch(vec![Host::int(1)], 64, loc(2));
        let first = k.shared("first", &[16, 16], DType::F32, loc(3));
        let dead = k.shared("dead", &[16, 128], DType::F32, loc(4));
        let read = k.shared("read", &[16, 16], DType::F32, loc(5));
        let last = k.shared("last", &[16, 16], DType::F32, loc(6));
        k.copy(k.tile(&a, vec![Val::from(0), Val::from(0)], &[16, 16], loc(7)), first, loc(7));
        k.fill(&read, 2.0, loc(8));
        let ij = k.begin_parallel(&last, &["i", "j"], loc(9));
        let v =
            Val::bin(crate::tile::BinOp::Mul, k.elem(&first, ij.clone(), loc(9)), k.elem(&read, ij.clone(), loc(9)));
        k.store(&last, ij, v, loc(9));
        k.end();
        k.copy(last, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 16], loc(10)), loc(10));
        let def = k.finish().expect("valid");
        let used = used_buffers(&def.body, def.buffers.len());
        assert_eq!((used[first.id], used[dead.id], used[read.id], used[last.id]), (true, false, true, true));
        let p = run_tile_passes(def).expect("passes");
        assert_eq!(p.stages[dead.id], 0);
        assert_eq!(p.shared_offsets[read.id], 1024, "the dead tile takes no bytes before it");
        assert_eq!(p.shared_offsets[last.id], 2048);
    }
}
