//! `allocate_shared`: gives every shared tile (times its stages; 0 for a tile no statement
//! touches, `drop_dead_tiles.rs`) an offset in dynamic shared memory aligned to 128 bytes (a
//! canonical tile's: to its swizzle atom), then places the TMA pipelines' and the producer
//! rings' mbarriers, then a scratch area sized for the reductions and scans that need one (one
//! for each warp group, and for the producer blocks fill warps run).

use super::place_producers::{ProducerRole, PRODUCER_GROUP};
use super::{BufLayout, TileProgram};
use crate::diag::Diag;
use crate::layout::FragmentKind;
use crate::tile::*;

/// Most dynamic shared memory a block may use on sm_90 (the H200's 232448 bytes).
pub const MAX_SHARED_BYTES: u32 = 232_448;

fn align(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

/// Assigns offsets and the scratch area.
pub fn allocate_shared(p: &mut TileProgram) -> Result<(), Diag> {
    let mut off = 0u32;
    for (i, b) in p.def.buffers.iter_ids() {
        if let BufLayout::Shared(l) = p.layouts[i] {
            let elem = b.dtype.size_bytes() as u32;
            off = align(off, l.alignment(elem));
            p.shared_offsets[i] = off;
            off = align(off + l.size() * b.dtype.size_bytes() as u32 * p.stages[i], 128);
        }
    }
    // Each TMA pipeline's mbarriers, 8 bytes each.
    for plan in &mut p.pipelines {
        if let super::plan_pipelines::StageFills::TensorBoxes(tma) = &mut plan.fills {
            off = align(off, 8);
            tma.barriers = off;
            off += 8 * plan.stages * tma.barriers_per_stage();
        }
    }
    // Each producer ring's `ready` then `empty` mbarriers.
    for plan in &mut p.producers {
        if let ProducerRole::FillWarps(ring) = &mut plan.role {
            off = align(off, 8);
            ring.barriers = off;
            off += 8 * ring.mbarriers();
        }
    }
    let mut need = 0u32;
    scratch_need(p, &p.def.body, &mut need);
    p.scratch = super::Scratch { offset: off, bytes: need };
    // Warp groups, and producer blocks beside the compute warps, run at the same time: each
    // reduces in a scratch area of its own.
    let mut end = off + need;
    let mut group_areas = vec![];
    for s in &p.def.body {
        if let StmtKind::WarpGroup { id, body, .. } = &s.kind {
            let mut g = 0u32;
            scratch_need(p, body, &mut g);
            end = align(end, 16);
            group_areas.push((*id, end));
            end += g;
        }
    }
    if p.groups.contains_key(&PRODUCER_GROUP) {
        let mut g = 0u32;
        visit_stmts(&p.def.body, &mut |s| {
            if let StmtKind::Producer(body) = &s.kind {
                scratch_need(p, body, &mut g);
            }
        });
        // Producer groups run at the same time: an area each, `producer_scratch_stride` apart.
        let groups = super::place_producers::producer_groups(p.def.fill_warps).groups;
        end = align(end, 16);
        group_areas.push((PRODUCER_GROUP, end));
        p.producer_scratch_stride = align(g, 16);
        end += p.producer_scratch_stride * groups;
    }
    for (id, at) in group_areas {
        if let Some(x) = p.groups.get_mut(&id) {
            x.scratch_offset = at;
        }
    }
    need = end - off;
    p.shared_bytes = align(off + need, 16);
    if p.shared_bytes > MAX_SHARED_BYTES {
        return Err(Diag::new(
            p.def.loc,
            format!("the kernel needs {} bytes of shared memory (tiles times stages, plus {need} of scratch); a block may use {MAX_SHARED_BYTES}", p.shared_bytes),
        ));
    }
    Ok(())
}

/// Bytes of scratch a reduction or scan of a fragment needs.
pub fn scratch_for(p: &TileProgram, s: &StmtKind) -> u32 {
    match s {
        StmtKind::Reduce { src, axis, .. } => match p.layouts[*src] {
            BufLayout::Fragment(l) if l.kind != FragmentKind::Tile => {
                let across = if l.kind == FragmentKind::Rows { l.wm } else { l.wn };
                if across > 1 {
                    across * 4
                } else {
                    0
                }
            }
            BufLayout::Fragment(l) if l.kind == FragmentKind::Tile => {
                let (across, len) = if *axis == 1 { (l.wn, l.rows) } else { (l.wm, l.cols) };
                if across > 1 {
                    across * len * 4
                } else {
                    0
                }
            }
            _ => 0,
        },
        StmtKind::ReduceLanes { dst, axis, .. } => match p.layouts[*dst] {
            BufLayout::Fragment(l) => {
                let (across, len) = if *axis == 1 { (l.wn, l.rows) } else { (l.wm, l.cols) };
                if across > 1 {
                    across * len * 4
                } else {
                    0
                }
            }
            _ => 0,
        },
        StmtKind::ReduceVectorLanes { vector, .. } => match p.layouts[*vector] {
            BufLayout::Fragment(l) => {
                let across = if l.kind == FragmentKind::Rows { l.wm } else { l.wn };
                if across > 1 {
                    across * 4
                } else {
                    0
                }
            }
            _ => 0,
        },
        StmtKind::Cumsum { src, .. } => match p.layouts[*src] {
            BufLayout::Fragment(_) | BufLayout::Local => p.def.buffers[*src].numel() * 4,
            _ => 0,
        },
        _ => 0,
    }
}

fn scratch_need(p: &TileProgram, body: &[Stmt], need: &mut u32) {
    for s in body {
        *need = (*need).max(scratch_for(p, &s.kind));
        match &s.kind {
            StmtKind::For { body, .. } | StmtKind::Parallel { body, .. } => scratch_need(p, body, need),
            StmtKind::If(_, t, e) => {
                scratch_need(p, t, need);
                scratch_need(p, e, need);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::passes::{run_tile_passes, TileProgram};
    use crate::tile::{LoopKind, ReduceOp};

    #[test]
    fn pipelined_tiles_get_one_copy_per_stage_and_scratch_comes_last() {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "K"], DType::BF16, false);
        k.launch(vec![Host::int(1)], 256, loc(2));
        let s = k.shared("a_s", &[64, 32], DType::BF16, loc(3));
        let f = k.fragment("f", &[64, 64], DType::F32, loc(4));
        let r = k.fragment("r", &[64], DType::F32, loc(5));
        let ko = k.begin_for("ko", LoopKind::pipelined(3), 0, k.dim("K"), loc(6));
        k.copy(k.tile(&a, vec![Val::from(0), ko], &[64, 32], loc(7)), s, loc(7));
        k.end();
        k.reduce(ReduceOp::Sum, &f, &r, 1, loc(8));
        let p: TileProgram = run_tile_passes(k.finish().expect("valid")).expect("passes");
        assert_eq!(p.stages[s.id], 3);
        assert_eq!(p.shared_offsets[s.id], 0);
        assert_eq!(p.scratch.offset, 3 * 64 * 32 * 2, "scratch after the three stages");
        insta::assert_snapshot!(p.to_string());
    }

    #[test]
    fn too_much_shared_memory_is_an_error_with_the_size() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 128, loc(2));
        // Each tile fits on its own (128 KiB); the three together do not.
        for name in ["a", "b", "c"] {
            let t = k.shared(name, &[256, 128], DType::F32, loc(3));
            k.fill(&t, 1.0, loc(4));
        }
        let e = run_tile_passes(k.finish().expect("valid")).expect_err("too big");
        assert!(e.message.contains("393216 bytes of shared memory"), "{e}");
    }
}
