//! `infer_layouts`: picks every buffer's layout and the shared stages `pipelined` loops need.
//!
//! 2-D fragments spread over the block's warps in m16n8 atoms; a 1-D fragment takes the row or
//! column layout of the 2-D fragment it is reduced from or broadcast against, so element-wise
//! work between them stays in registers. Shared tiles of 16-bit elements are swizzled.

use super::place_producers::{splice_producers, ProducerRole, Splice, PRODUCER_GROUP};
use super::{BufLayout, TileProgram};
use crate::diag::{Diag, SrcLoc};
use crate::layout::{FragmentKind, FragmentLayout, SharedLayout};
use crate::tile::*;
use std::collections::{HashMap, HashSet};

/// Decides layouts and stage counts.
pub fn infer_layouts(p: &mut TileProgram) -> Result<(), Diag> {
    assign_warp_groups(p)?;
    let wof: IdVec<Buffer, u32> = (0..p.def.buffers.len()).map(|b| p.warps_of(BufId::new(b))).collect();
    let def = &p.def;
    let mut rel: IdVec<Buffer, Option<(FragmentLayout, SrcLoc)>> = IdVec::filled(def.buffers.len(), None);
    // Fragments a gemm reads or accumulates into take the mma accumulator layout.
    let mut in_gemm = vec![];
    gemm_fragments(&def.body, &mut in_gemm);
    let half_shapes = half_memory_shapes(def, &wof, &in_gemm);
    for (i, b) in def.buffers.iter_ids() {
        if b.scope == Scope::Fragment && b.shape.len() == 2 {
            let warps = wof[i];
            let fits = if in_gemm.contains(&i) {
                if b.lanes_per_row != 4 {
                    return Err(Diag::new(
                        b.loc,
                        format!(
                            "fragment `{}` has {} lanes per row, but a gemm uses it, and mma fragments have 4",
                            b.name, b.lanes_per_row
                        ),
                    ));
                }
                // A tile too small for every warp goes to the first warps that fit it (the most
                // of them, each with whole pairs of mma column atoms, as a gemm loads them);
                // the other warps skip the statements that use it.
                FragmentLayout::for_tile(b.shape[0], b.shape[1], warps).or_else(|| {
                    fewer_warps(warps, |w| {
                        FragmentLayout::for_tile(b.shape[0], b.shape[1], w).filter(|l| l.ni() % 2 == 0)
                    })
                })
            } else {
                let half = half_shapes.contains(&(b.shape[0], b.shape[1], warps, b.lanes_per_row));
                FragmentLayout::for_elementwise(b.shape[0], b.shape[1], warps, half, b.lanes_per_row).or_else(|| {
                    fewer_warps(warps, |w| {
                        FragmentLayout::for_elementwise(b.shape[0], b.shape[1], w, half, b.lanes_per_row)
                    })
                })
            };
            let l = fits.ok_or_else(|| {
                let msg = if b.lanes_per_row == 4 {
                    format!(
                        "fragment `{}` [{} x {}] does not fit m16n8 atoms over {warps} warps: rows must be a multiple of 16·wm and columns of 8·wn for some wm·wn = {warps}",
                        b.name, b.shape[0], b.shape[1]
                    )
                } else {
                    format!(
                        "fragment `{}` [{} x {}] with a row across the warp does not fit {warps} warps: rows must be a multiple of 2·wm and columns of 64·wn for some wm·wn = {warps}",
                        b.name, b.shape[0], b.shape[1]
                    )
                };
                Diag::new(b.loc, msg)
            })?;
            p.layouts[i] = BufLayout::Fragment(l);
        }
    }
    // A gemm whose left operand comes from registers needs whole rows per warp in both that
    // operand and the accumulator (the accumulator layout of one is the operand layout of the other).
    pin_register_operands(&def.body, def, &wof, &mut p.layouts)?;
    // A gemm that takes wgmma (`gemm_choice`) gets its accumulator 16 rows per warp and its
    // shared operands in canonical layouts.
    let mut canonical = pin_wgmma(p);
    // So does a tile a TMA bulk store reads (`plan_tma_stores`).
    canonical.extend(super::plan_tma_stores::store_sources(p));
    let def = &p.def;
    // Relations of 1-D fragments to 2-D ones.
    let mut relations = vec![];
    collect_relations(&def.body, &p.layouts, def, &mut relations);
    for (vec_buf, layout, loc) in relations {
        let b = &def.buffers[vec_buf];
        let want_len = if layout.kind == FragmentKind::Rows { layout.rows } else { layout.cols };
        if b.shape[0] != want_len {
            return Err(Diag::new(
                loc,
                format!(
                    "vector `{}` has {} elements; the tile it pairs with has {want_len} along that axis",
                    b.name, b.shape[0]
                ),
            ));
        }
        match rel[vec_buf] {
            None => rel[vec_buf] = Some((layout, loc)),
            Some((l, _)) if l == layout => {}
            Some((l, first)) => {
                return Err(Diag::new(
                    loc,
                    format!("vector `{}` is used here with layout {layout}, but at {first} with {l}; copy it into a shared tile to use it both ways", b.name),
                ))
            }
        }
    }
    // Vectors used together element by element share a layout.
    let mut pairs = vec![];
    vector_pairs(&def.body, def, &mut pairs);
    loop {
        let mut changed = false;
        for (x, y, loc) in &pairs {
            match (rel[*x], rel[*y]) {
                (Some(l), None) => {
                    rel[*y] = Some((l.0, *loc));
                    changed = true;
                }
                (None, Some(l)) => {
                    rel[*x] = Some((l.0, *loc));
                    changed = true;
                }
                (Some(a), Some(b)) if a.0 != b.0 => {
                    return Err(Diag::new(
                        *loc,
                        format!("vectors `{}` ({}) and `{}` ({}) are used together but laid out differently; copy one through a shared tile", def.buffers[*x].name, a.0, def.buffers[*y].name, b.0),
                    ));
                }
                _ => {}
            }
        }
        if !changed {
            break;
        }
    }
    for (i, b) in def.buffers.iter_ids() {
        p.layouts[i] = match (b.scope, b.shape.len()) {
            (Scope::Fragment, 2) => continue,
            (Scope::Fragment, _) => match rel[i] {
                Some((l, _)) => BufLayout::Fragment(l),
                None => BufLayout::Fragment(FragmentLayout::for_vector(b.shape[0], wof[i]).ok_or_else(|| {
                    Diag::new(
                        b.loc,
                        format!("vector fragment `{}` of {} elements: expected a multiple of 16", b.name, b.shape[0]),
                    )
                })?),
            },
            (Scope::Local, _) => BufLayout::Local,
            (Scope::Shared, _) => {
                let (r, c) = if b.shape.len() == 2 { (b.shape[0], b.shape[1]) } else { (1, b.shape[0]) };
                let elem = b.dtype.size_bytes() as u32;
                let canonical = canonical.contains(&i).then(|| SharedLayout::canonical(r, c, elem)).flatten();
                BufLayout::Shared(canonical.unwrap_or_else(|| SharedLayout::choose(r, c, elem)))
            }
        };
    }
    // Stages.
    let mut stages: IdVec<Buffer, u32> = IdVec::filled(def.buffers.len(), 1);
    collect_stages(&def.body, def, &mut stages);
    // A producer block on fill warps writes its hand-over for one iteration while the compute
    // warps read the one before: a copy per stage, rotated as the fills' are.
    for plan in &p.producers {
        if let ProducerRole::FillWarps(ring) = &plan.role {
            for b in &plan.outputs {
                stages[*b] = stages[*b].max(ring.stages);
            }
            // Producer groups compute at once, each in its own copy of the block's shared
            // temporaries.
            for b in plan.temporaries.iter().filter(|b| matches!(p.layouts[**b], BufLayout::Shared(_))) {
                stages[*b] = stages[*b].max(ring.groups);
            }
            // Across a cluster the fills only the block reads leave the stages for slots of
            // each group's own.
            for b in &plan.own_fills {
                stages[*b] = ring.groups * ring.own_fill_slots();
            }
        }
    }
    p.stages = stages;
    Ok(())
}

/// Gives each tile its owner: the warp group whose body uses it, or the block. A tile used by a
/// group and by anything else is an error (a group's barriers cover only its own threads).
fn assign_warp_groups(p: &mut TileProgram) -> Result<(), Diag> {
    let warps = p.warps();
    let has_fill_warps = p.def.fill_warps > 0;
    let mut owner: IdVec<Buffer, Option<(u32, SrcLoc)>> = IdVec::filled(p.def.buffers.len(), None);
    let mut claim = |b: BufId, g: u32, loc: SrcLoc, def: &KernelDef| -> Result<(), Diag> {
        match owner[b] {
            Some((h, _)) if h != g => {
                let who = |x: u32| match x {
                    0 => "the whole block".to_string(),
                    PRODUCER_GROUP if has_fill_warps => "the producer block".to_string(),
                    x => format!("warp group {x}"),
                };
                Err(Diag::new(
                    loc,
                    format!(
                        "tile `{}` is used by {} and by {}; a tile belongs to one warp group (or to the block)",
                        def.buffers[b].name,
                        who(h),
                        who(g)
                    ),
                ))
            }
            _ => {
                owner[b] = Some((g, loc));
                Ok(())
            }
        }
    };
    // A producer block on fill warps owns the fragments and locals it uses (the shared tiles
    // it hands over, and the fills it reads, are the ring's to order); the rest of the kernel
    // is walked without its statements.
    let mut in_producers: Vec<(SrcLoc, &[Stmt])> = vec![];
    visit_stmts(&p.def.body, &mut |s| {
        if let StmtKind::Producer(body) = &s.kind {
            in_producers.push((s.loc, body));
        }
    });
    for (loc, body) in &in_producers {
        let mut used = vec![];
        tiles_used(body, &mut used);
        for b in used.into_iter().filter(|b| p.def.buffers[*b].scope != Scope::Shared) {
            claim(b, PRODUCER_GROUP, *loc, &p.def)?;
        }
    }
    let stripped;
    let outside: &[Stmt] = if in_producers.is_empty() {
        &p.def.body
    } else {
        stripped = splice_producers(p.def.body.clone(), Splice::Drop);
        &stripped
    };
    for s in outside {
        let (g, body): (u32, &[Stmt]) = match &s.kind {
            StmtKind::WarpGroup { first, count, id, body, .. } => {
                if first + count > warps {
                    return Err(Diag::new(
                        s.loc,
                        format!("warp group {id} takes warps {first}..{} of a block of {warps}", first + count),
                    ));
                }
                p.groups.insert(*id, super::WarpGroupInfo { warps: *count, scratch_offset: 0 });
                (*id, body.as_slice())
            }
            _ => (0, std::slice::from_ref(s)),
        };
        let mut used = vec![];
        tiles_used(body, &mut used);
        for b in used {
            claim(b, g, s.loc, &p.def)?;
        }
    }
    p.owner = owner.into_iter().map(|o| o.map(|x| x.0).unwrap_or(0)).collect();
    Ok(())
}

/// Whether evaluating `e` reads an element of a shared tile.
pub(crate) fn reads_shared(p: &TileProgram, e: &Expr) -> bool {
    let probe = Stmt { kind: StmtKind::Assign(VarId::new(0), e.clone()), loc: Default::default() };
    let mut found = vec![];
    elems_in(std::slice::from_ref(&probe), &mut found);
    found.into_iter().any(|(b, _, _)| matches!(p.layouts[b], BufLayout::Shared(_)))
}

/// Every tile a statement list touches (operands of tile operations and element accesses).
pub(crate) fn tiles_used(body: &[Stmt], out: &mut Vec<BufId>) {
    let mut elems = vec![];
    elems_in(body, &mut elems);
    out.extend(elems.into_iter().map(|(b, _, _)| b));
    for s in body {
        match &s.kind {
            StmtKind::Copy { src, dst } => {
                for r in [src, dst] {
                    if let Region::Buf(b) = r {
                        out.push(*b);
                    }
                }
            }
            StmtKind::Gemm { a, b, c } => out.extend([a.buf, b.buf, *c]),
            StmtKind::Fill(b, _) | StmtKind::Print(b) => out.push(*b),
            StmtKind::Reduce { src, dst, .. } | StmtKind::Cumsum { src, dst, .. } => out.extend([*src, *dst]),
            StmtKind::ReduceLanes { dst, .. } => out.push(*dst),
            StmtKind::ReduceVectorLanes { dst, vector, .. } => out.extend([*dst, *vector]),
            StmtKind::Parallel { over, body, .. } => {
                out.push(*over);
                tiles_used(body, out);
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                tiles_used(body, out)
            }
            StmtKind::If(_, t, e) => {
                tiles_used(t, out);
                tiles_used(e, out);
            }
            _ => {}
        }
    }
}

/// The (rows, cols, warps, lanes per row) shapes of 2-D element-wise fragments that move only
/// to and from 16-bit memory: some copy moves such a fragment, and every copy between one of
/// them and a shared tile or a global box moves bf16 or f16. Decided per shape, not per
/// fragment: the fragments of one shape work together element by element, so they share one
/// layout.
fn half_memory_shapes(def: &KernelDef, wof: &IdVec<Buffer, u32>, in_gemm: &[BufId]) -> HashSet<(u32, u32, u32, u32)> {
    let elementwise = |b: BufId| {
        let x = &def.buffers[b];
        (x.scope == Scope::Fragment && x.shape.len() == 2 && !in_gemm.contains(&b))
            .then(|| (x.shape[0], x.shape[1], wof[b], x.lanes_per_row))
    };
    // Per shape (and lanes per row): whether every copy so far moved 16-bit elements.
    let mut all_half: HashMap<(u32, u32, u32, u32), bool> = HashMap::new();
    visit_stmts(&def.body, &mut |s| {
        let StmtKind::Copy { src, dst } = &s.kind else { return };
        let memory_dtype = |r: &Region| match r {
            Region::Global { tensor, .. } => match &def.params[*tensor] {
                Param::Tensor { dtype, .. } => Some(*dtype),
                _ => None,
            },
            Region::Buf(b) if def.buffers[*b].scope == Scope::Shared => Some(def.buffers[*b].dtype),
            Region::Buf(_) => None,
        };
        for (frag, other) in [(src, dst), (dst, src)] {
            let Region::Buf(f) = frag else { continue };
            let Some(shape) = elementwise(*f) else { continue };
            let half = match other {
                Region::Buf(o) if def.buffers[*o].scope == Scope::Fragment => continue,
                o => memory_dtype(o).is_some_and(|d| d.is_half()),
            };
            *all_half.entry(shape).or_insert(true) &= half;
        }
    });
    all_half.into_iter().filter(|(_, half)| *half).map(|(shape, _)| shape).collect()
}

fn gemm_fragments(body: &[Stmt], out: &mut Vec<BufId>) {
    visit_stmts(body, &mut |s| {
        if let StmtKind::Gemm { a, b, c } = &s.kind {
            out.extend([a.buf, b.buf, *c]);
        }
    });
}

/// Lays out every `gemm` that takes `wgmma` for it: the accumulator (and an A fragment) 16 rows
/// per warp, all columns in each; returns the shared operands that need canonical layouts.
fn pin_wgmma(p: &mut TileProgram) -> HashSet<BufId> {
    let mut gemms = vec![];
    visit_stmts(&p.def.body, &mut |s| {
        if let StmtKind::Gemm { a, b, c } = &s.kind {
            gemms.push((a.clone(), b.clone(), *c));
        }
    });
    // Fragments another gemm pinned to columns, or to replicated rows it cannot take `wgmma` on,
    // keep that layout: their gemms on them take mma.sync. (A replicated gemm that takes
    // `wgmma` pins its accumulator 16 rows per warp, as `wgmma` does.)
    let takes_wgmma = |p: &TileProgram, a: &Operand, b: &Operand, c: BufId| {
        crate::gemm_choice::choose_wgmma(&crate::gemm_choice::GemmFacts::of(p, a, b, c)).is_ok()
    };
    let pinned_otherwise: HashSet<BufId> = gemms
        .iter()
        .filter(|(a, b, c)| {
            (a.replicated && !takes_wgmma(p, a, b, *c)) || p.def.buffers[b.buf].scope == Scope::Fragment
        })
        .flat_map(|(a, b, c)| [a.buf, b.buf, *c])
        .collect();
    let mut canonical = HashSet::new();
    for (a, b, c) in gemms {
        if pinned_otherwise.contains(&c) || pinned_otherwise.contains(&a.buf) {
            continue;
        }
        let Ok(shape) = crate::gemm_choice::choose_wgmma(&crate::gemm_choice::GemmFacts::of(p, &a, &b, c)) else {
            continue;
        };
        for x in [a.buf, c] {
            let s = &p.def.buffers[x].shape;
            if p.def.buffers[x].scope == Scope::Fragment && s.len() == 2 {
                if let Some(l) = FragmentLayout::rows_only(s[0], s[1], p.warps_of(x)) {
                    p.layouts[x] = BufLayout::Fragment(l);
                }
            }
        }
        if matches!(shape.a, crate::gemm_choice::WgmmaAFrom::Shared(_)) {
            canonical.insert(a.buf);
        }
        canonical.insert(b.buf);
        p.wgmma_accumulators.insert(c);
    }
    canonical
}

fn pin_register_operands(
    body: &[Stmt],
    def: &KernelDef,
    wof: &IdVec<Buffer, u32>,
    layouts: &mut IdVec<Buffer, BufLayout>,
) -> Result<(), Diag> {
    for s in body {
        match &s.kind {
            // Each warp of the accumulator multiplies the whole replicated tile into its own
            // rows: its warps split rows only, each holding one copy of the tile's rows. Fewer
            // copies than warps (a divisor of them) lay out on the first warps; the others skip.
            StmtKind::Gemm { a, c, .. } if a.replicated => {
                let (x, tile) = (&def.buffers[*c], &def.buffers[a.buf]);
                let warps = wof[*c];
                let per_warp = tile.shape.first().copied().unwrap_or(0);
                let copies = if per_warp > 0 && x.shape.len() == 2 { x.shape[0] / per_warp } else { 0 };
                let l = (copies > 0 && x.shape[0] == per_warp * copies && warps.is_multiple_of(copies))
                    .then(|| FragmentLayout::rows_only(x.shape[0], x.shape[1], copies))
                    .flatten()
                    .ok_or_else(|| {
                        Diag::new(s.loc, format!("gemm with `{}` replicated over {warps} warps: the accumulator `{}` {:?} must have n x {per_warp} rows (one copy of the tile's rows per warp, a multiple of 16, for n dividing {warps})", tile.name, x.name, x.shape))
                    })?;
                layouts[*c] = BufLayout::Fragment(l);
            }
            StmtKind::Gemm { a, c, .. } if def.buffers[a.buf].scope == Scope::Fragment => {
                for b in [a.buf, *c] {
                    let x = &def.buffers[b];
                    if x.shape.len() != 2 {
                        continue;
                    }
                    let warps = wof[b];
                    let l = FragmentLayout::rows_only(x.shape[0], x.shape[1], warps).ok_or_else(|| {
                        Diag::new(s.loc, format!("gemm with `{}` from registers: `{}` [{} x {}] must split its rows over all {warps} warps (rows a multiple of {})", def.buffers[a.buf].name, x.name, x.shape[0], x.shape[1], 16 * warps))
                    })?;
                    layouts[b] = BufLayout::Fragment(l);
                }
            }
            // A right operand from registers: each warp multiplies the whole reduction into
            // its own accumulator columns, so the accumulator's warps split columns only and the
            // operand's warps split its `n` axis alike (rows when stored `[N, K]`, `b.t()`).
            StmtKind::Gemm { b, c, .. } if def.buffers[b.buf].scope == Scope::Fragment => {
                let (x, y) = (&def.buffers[*c], &def.buffers[b.buf]);
                let warps = wof[*c];
                let pinned = (x.shape.len() == 2 && y.shape.len() == 2)
                    .then(|| {
                        let lc = FragmentLayout::cols_only(x.shape[0], x.shape[1], warps)?;
                        let lb = if b.transposed {
                            FragmentLayout::rows_only(y.shape[0], y.shape[1], warps)?
                        } else {
                            FragmentLayout::cols_only(y.shape[0], y.shape[1], warps)?
                        };
                        Some((lc, lb))
                    })
                    .flatten();
                let Some((lc, lb)) = pinned else {
                    return Err(Diag::new(s.loc, format!("gemm with `{}` from registers: the accumulator `{}` {:?} and `{}` {:?} must split their `n` axis over all {warps} warps (a multiple of {} per warp; rows a multiple of 16)", y.name, x.name, x.shape, y.name, y.shape, if b.transposed { 16 } else { 8 })));
                };
                layouts[*c] = BufLayout::Fragment(lc);
                layouts[b.buf] = BufLayout::Fragment(lb);
            }
            StmtKind::For { body, .. }
            | StmtKind::Parallel { body, .. }
            | StmtKind::WarpGroup { body, .. }
            | StmtKind::Producer(body) => pin_register_operands(body, def, wof, layouts)?,
            StmtKind::If(_, t, e) => {
                pin_register_operands(t, def, wof, layouts)?;
                pin_register_operands(e, def, wof, layouts)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn collect_stages(body: &[Stmt], def: &KernelDef, stages: &mut IdVec<Buffer, u32>) {
    for s in body {
        match &s.kind {
            StmtKind::For { kind: LoopKind::Pipelined { stages: n, .. }, body, .. } => {
                for inner in body.iter().filter(|x| super::plan_pipelines::is_stage_fill(def, x)) {
                    if let StmtKind::Copy { dst: Region::Buf(b), .. } = &inner.kind {
                        stages[*b] = stages[*b].max(*n);
                    }
                }
                collect_stages(body, def, stages);
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                collect_stages(body, def, stages)
            }
            StmtKind::If(_, t, e) => {
                collect_stages(t, def, stages);
                collect_stages(e, def, stages);
            }
            _ => {}
        }
    }
}

/// (driver, other) for each `parallel` over a vector fragment that touches another vector
/// fragment at the loop's index.
fn vector_pairs(body: &[Stmt], def: &KernelDef, out: &mut Vec<(BufId, BufId, SrcLoc)>) {
    for s in body {
        match &s.kind {
            StmtKind::Parallel { over, vars, body } if is_vec_frag(def, *over) => {
                let mut found = vec![];
                elems_in(body, &mut found);
                for (b, idx, loc) in found {
                    if b != *over && is_vec_frag(def, b) && idx == [Expr::Var(vars[0])] {
                        out.push((*over, b, loc));
                    }
                }
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                vector_pairs(body, def, out)
            }
            StmtKind::If(_, t, e) => {
                vector_pairs(t, def, out);
                vector_pairs(e, def, out);
            }
            _ => {}
        }
    }
}

fn is_vec_frag(def: &KernelDef, b: BufId) -> bool {
    let x = &def.buffers[b];
    x.scope == Scope::Fragment && x.shape.len() == 1
}

fn collect_relations(
    body: &[Stmt],
    layouts: &IdVec<Buffer, BufLayout>,
    def: &KernelDef,
    out: &mut Vec<(BufId, FragmentLayout, SrcLoc)>,
) {
    for s in body {
        match &s.kind {
            StmtKind::Reduce { src, dst, axis, .. } if is_vec_frag(def, *dst) => {
                if let BufLayout::Fragment(l) = layouts[*src] {
                    let kind = if *axis == 1 { FragmentKind::Rows } else { FragmentKind::Cols };
                    out.push((*dst, l.vector(kind), s.loc));
                }
            }
            StmtKind::Parallel { over, vars, body } => {
                if let BufLayout::Fragment(l) = layouts[*over] {
                    if l.kind == FragmentKind::Tile {
                        let mut found = vec![];
                        elems_in(body, &mut found);
                        for (b, idx, loc) in found {
                            if is_vec_frag(def, b) && idx.len() == 1 {
                                if idx[0] == Expr::Var(vars[0]) {
                                    out.push((b, l.vector(FragmentKind::Rows), loc));
                                } else if idx[0] == Expr::Var(vars[1]) {
                                    out.push((b, l.vector(FragmentKind::Cols), loc));
                                }
                            }
                        }
                    }
                }
                collect_relations(body, layouts, def, out);
            }
            StmtKind::For { body, .. } | StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => {
                collect_relations(body, layouts, def, out)
            }
            StmtKind::If(_, t, e) => {
                collect_relations(t, layouts, def, out);
                collect_relations(e, layouts, def, out);
            }
            _ => {}
        }
    }
}

/// Every tile element access (reads and writes) in `body`: (buffer, index, where).
pub fn elems_in(body: &[Stmt], out: &mut Vec<(BufId, Vec<Expr>, SrcLoc)>) {
    fn expr(e: &Expr, loc: SrcLoc, out: &mut Vec<(BufId, Vec<Expr>, SrcLoc)>) {
        match e {
            Expr::Elem(b, idx) => {
                out.push((*b, idx.clone(), loc));
                idx.iter().for_each(|i| expr(i, loc, out));
            }
            Expr::Load(_, idx) => idx.iter().for_each(|i| expr(i, loc, out)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => expr(a, loc, out),
            Expr::Binary(_, a, b) => {
                expr(a, loc, out);
                expr(b, loc, out);
            }
            Expr::Select(c, a, b) => {
                expr(c, loc, out);
                expr(a, loc, out);
                expr(b, loc, out);
            }
            _ => {}
        }
    }
    for s in body {
        match &s.kind {
            StmtKind::Assign(_, e) => expr(e, s.loc, out),
            StmtKind::Store(b, idx, e) => {
                out.push((*b, idx.clone(), s.loc));
                expr(e, s.loc, out);
            }
            StmtKind::StoreGlobal(_, idx, e) => {
                idx.iter().for_each(|i| expr(i, s.loc, out));
                expr(e, s.loc, out);
            }
            StmtKind::If(c, t, e) => {
                expr(c, s.loc, out);
                elems_in(t, out);
                elems_in(e, out);
            }
            StmtKind::For { body, start, end, .. } => {
                expr(start, s.loc, out);
                expr(end, s.loc, out);
                elems_in(body, out);
            }
            StmtKind::WarpGroup { body, .. } | StmtKind::Producer(body) => elems_in(body, out),
            _ => {}
        }
    }
}

/// The layout `fits` gives over the most warps below `warps` that divide it, if any.
fn fewer_warps(warps: u32, fits: impl Fn(u32) -> Option<FragmentLayout>) -> Option<FragmentLayout> {
    (1..warps).rev().filter(|w| warps.is_multiple_of(*w)).find_map(fits)
}

#[cfg(test)]
mod tests {
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::passes::TileProgram;
    use crate::tile::ReduceOp;

    #[test]
    fn vectors_take_the_layout_of_the_tile_they_reduce() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 256, loc(2));
        let f = k.fragment("f", &[64, 64], DType::F32, loc(3));
        let rows = k.fragment("rows", &[64], DType::F32, loc(4));
        let cols = k.fragment("cols", &[64], DType::F32, loc(5));
        let s = k.shared("s", &[64, 32], DType::BF16, loc(6));
        let v = k.fragment("alone", &[32], DType::F32, loc(7));
        k.fill(&f, 0.0, loc(8));
        k.reduce(ReduceOp::Max, &f, &rows, 1, loc(9));
        k.reduce(ReduceOp::Sum, &f, &cols, 0, loc(10));
        let _ = (s, v);
        let mut p = TileProgram::new(k.finish().expect("valid"), crate::target::Target::Sm80);
        super::infer_layouts(&mut p).expect("layouts");
        insta::assert_snapshot!(p.to_string());
    }

    #[test]
    fn a_fragment_that_does_not_fit_the_atoms_is_an_error_at_its_declaration() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 128, loc(2));
        k.fragment("f", &[24, 8], DType::F32, loc(3));
        let mut p = TileProgram::new(k.finish().expect("valid"), crate::target::Target::Sm80);
        let e = super::infer_layouts(&mut p).expect_err("does not fit");
        assert_eq!(e.loc.line, 3);
        assert!(e.message.contains("does not fit m16n8 atoms"), "{e}");
    }
}

#[cfg(test)]
mod group_tests {
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::passes::TileProgram;

    #[test]
    fn a_tile_belongs_to_one_warp_group() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 128, loc(2));
        let s = k.shared("s", &[16, 16], DType::F32, loc(3));
        k.begin_warp_group("w", 0, 2, loc(4));
        k.fill(&s, 1.0, loc(5));
        k.end();
        k.fill(&s, 2.0, loc(6));
        let mut p = TileProgram::new(k.finish().expect("valid"), crate::target::Target::Sm80);
        let e = super::infer_layouts(&mut p).expect_err("shared by a group and the block");
        assert!(e.message.contains("tile `s` is used by warp group 1 and by the whole block"), "{e}");
    }

    #[test]
    fn group_tiles_spread_over_the_group_and_its_barriers_stay_inside() {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "N"], DType::F32, false);
        k.launch(vec![Host::int(1)], 256, loc(2));
        let s = k.shared("s", &[16, 16], DType::F32, loc(3));
        let f = k.fragment("f", &[16, 16], DType::F32, loc(4));
        k.begin_warp_group("w", 4, 2, loc(5));
        k.copy(k.tile(&a, vec![Val::from(0), Val::from(0)], &[16, 16], loc(6)), s, loc(6));
        k.copy(s, f, loc(7));
        k.end();
        let mut p = crate::passes::run_tile_passes(k.finish().expect("valid")).expect("passes");
        assert_eq!(p.warps_of(f.id), 2);
        assert_eq!(p.owner[s.id], 1);
        super::infer_layouts(&mut p).expect("idempotent");
        insta::assert_snapshot!(p.to_string());
    }
}
