//! Lowering of `reduce_*` and `cumsum`. Reductions of fragments combine a thread's own
//! elements, then the lanes holding the same row (column) with `shfl.sync.bfly`, then, when the
//! axis spans several warps, the warps' partials through shared scratch. Scans go through shared
//! memory with one thread per line, which fits the short lines (chunks of 16 to 64) KDA scans.

use super::element_addr::bits_below;
use super::{class_of, ty_of, Lower, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::passes::check_types::value_type;
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

/// Elements of a `cumsum` line loaded ahead of their adds and stores, at most: the chunk
/// kernel's lines of 16 load whole, a line of hundreds does not hold them all in registers.
const SCAN_BATCH: usize = 16;

impl Lower<'_> {
    fn combine(&mut self, op: ReduceOp, vt: DType, d: Reg, a: Reg, b: Reg) {
        let k = if op == ReduceOp::Sum { BinKind::Add } else { BinKind::Max };
        self.em.emit(Op::Bin { op: k, ty: ty_of(vt), d, a: Src::Reg(a), b: Src::Reg(b) });
    }

    fn scratch_addr(&mut self, index: Src) -> Reg {
        let base = self.em.add32(self.smem, self.scope.scratch_base);
        let off = self.em.mul32(index, Src::Imm(4));
        let a = self.em.add32(base, off);
        self.em.to_reg(a, RegClass::B32, Ty::U32)
    }

    /// A predicate true on the lanes that own (store) the elements of a replicated vector.
    pub(crate) fn vector_owner(&mut self, l: FragmentLayout) -> Option<Reg> {
        let (g, t) = self.lane_parts(l);
        let (w, lane_part) = match l.kind {
            FragmentKind::Tile => return None,
            FragmentKind::Rows => (self.em.op32(BinKind::Rem, self.scope.th.warp, l.wn as i64), t),
            FragmentKind::Cols => (self.em.op32(BinKind::Div, self.scope.th.warp, l.wn as i64), g),
        };
        let p1 = self.lane_is_first(lane_part);
        let w = self.em.to_reg(w, RegClass::B32, Ty::U32);
        let p2 = self.em.setp(Cmp::Eq, Ty::S32, w, Src::Imm(0));
        self.em.and_pred(p1, Some(p2))
    }

    /// `part == 0` for a lane coordinate; `None` (always) when the layout makes it constant 0.
    fn lane_is_first(&mut self, part: Src) -> Option<Reg> {
        match part {
            Src::Imm(0) => None,
            p => Some(self.em.setp(Cmp::Eq, Ty::S32, p, Src::Imm(0))),
        }
    }

    pub(crate) fn reduce(
        &mut self,
        op: ReduceOp,
        src: BufId,
        dst: BufId,
        axis: usize,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let (sb, db) = (self.def().buffers[src].clone(), self.def().buffers[dst].clone());
        if let (BufLayout::Fragment(l), BufLayout::Local) = (self.p.layouts[src], self.p.layouts[dst]) {
            if l.kind != FragmentKind::Tile {
                return self.reduce_vector(op, src, dst, l, loc);
            }
        }
        let BufLayout::Fragment(l) = self.p.layouts[src] else {
            return self.err(
                loc,
                format!("reduce source `{}` must be a 2-D fragment (copy a shared tile into one first)", sb.name),
            );
        };
        if l.kind != FragmentKind::Tile || axis > 1 {
            return self
                .err(loc, format!("reduce needs a 2-D fragment and axis 0 or 1 (got `{}` with axis {axis})", sb.name));
        }
        let vt = value_type(sb.dtype);
        if value_type(db.dtype) != vt {
            return self.err(loc, format!("reduce from {} into {}: element types must agree", sb.dtype, db.dtype));
        }
        let kind = if axis == 1 { FragmentKind::Rows } else { FragmentKind::Cols };
        let vl = l.vector(kind);
        let want_len = if axis == 1 { l.rows } else { l.cols };
        if db.shape != [want_len] {
            return self.err(
                loc,
                format!(
                    "reduce of `{}` along axis {axis} gives {want_len} elements; `{}` has shape {:?}",
                    sb.name, db.name, db.shape
                ),
            );
        }
        let mut out = vec![];
        for vs in 0..vl.slots() {
            // The tile slots that share this vector slot.
            let members: Vec<u32> = (0..l.slots())
                .filter(|s| if axis == 1 { l.row_slot_of(*s) == vs } else { l.col_slot_of(*s) == vs })
                .collect();
            let acc = self.em.reg(class_of(vt));
            self.em.emit(Op::Mov { ty: ty_of(vt), d: acc, a: Src::Reg(self.regs[src][members[0] as usize]) });
            for s in &members[1..] {
                let r = self.regs[src][*s as usize];
                self.combine(op, vt, acc, acc, r);
            }
            out.push(acc);
        }
        self.combine_lanes(op, vt, l, axis, &out);
        match self.p.layouts[dst] {
            BufLayout::Fragment(dl) if dl == vl => {
                for (vs, acc) in out.into_iter().enumerate() {
                    let v = self.round_for(V { s: Src::Reg(acc), ty: vt }, db.dtype);
                    let r = self.regs[dst][vs];
                    self.mov(r, v);
                }
                Ok(())
            }
            BufLayout::Shared(_) => {
                let owner = self.vector_owner(vl);
                for (vs, acc) in out.into_iter().enumerate() {
                    let (i, _) = self.frag_coords(vl, vs as u32);
                    let a = self.shared_addr(dst, Src::Imm(0), i);
                    let skip = self.em.label();
                    if let Some(p) = owner {
                        self.em.emit_if(p, false, Op::Bra { target: skip });
                    }
                    self.store_mem(Space::Shared, a, db.dtype, V { s: Src::Reg(acc), ty: vt });
                    self.em.emit(Op::Label(skip));
                }
                Ok(())
            }
            _ => self.err(
                loc,
                format!(
                    "reduce destination `{}` must be a vector fragment paired with `{}` or a 1-D shared tile",
                    db.name, sb.name
                ),
            ),
        }
    }

    /// Combines per-thread partials `acc` (one per slot of the row (axis 1) or column (axis 0)
    /// vector of tile layout `l`) across the lanes, then the warps, that hold the same element.
    pub(crate) fn combine_lanes(&mut self, op: ReduceOp, vt: DType, l: FragmentLayout, axis: usize, acc: &[Reg]) {
        let lanes = l.lane_masks(axis == 1);
        for a in acc {
            for m in &lanes {
                let o = self.em.reg(class_of(vt));
                self.em.emit(Op::Shfl { mode: ShflMode::Bfly, d: o, a: *a, b: Src::Imm(*m), c: 31 });
                self.combine(op, vt, *a, *a, o);
            }
        }
        let across = if axis == 1 { l.wn } else { l.wm };
        if across == 1 {
            return;
        }
        let vl = l.vector(if axis == 1 { FragmentKind::Rows } else { FragmentKind::Cols });
        let len = (if axis == 1 { l.rows } else { l.cols }) as i64;
        // Partials of each warp along the axis meet in scratch: [across][len].
        self.barrier();
        // Every warp along the axis writes its partial: one lane per row (column) of it.
        let (g, t) = self.lane_parts(l);
        let owner = self.lane_is_first(if axis == 1 { t } else { g });
        let wpos = if axis == 1 {
            self.em.op32(BinKind::Rem, self.scope.th.warp, l.wn as i64)
        } else {
            self.em.op32(BinKind::Div, self.scope.th.warp, l.wn as i64)
        };
        let mut idx = vec![];
        for (vs, a) in acc.iter().enumerate() {
            let (i, _) = self.frag_coords(vl, vs as u32);
            idx.push(i);
            let row = self.em.mul32(wpos, Src::Imm(len));
            let at = self.em.add32(row, i);
            let addr = self.scratch_addr(at);
            let st = Op::St { space: Space::Shared, ty: ty_of(vt), addr, offset: 0, vals: vec![Src::Reg(*a)] };
            match owner {
                Some(p) => self.em.emit_if(p, true, st),
                None => self.em.emit(st),
            }
        }
        self.barrier();
        for (vs, a) in acc.iter().enumerate() {
            for w in 0..across as i64 {
                let at = self.em.add32(idx[vs], Src::Imm(w * len));
                let addr = self.scratch_addr(at);
                let v = self.em.reg(class_of(vt));
                self.em.emit(Op::Ld { space: Space::Shared, ty: ty_of(vt), d: vec![v], addr, offset: 0 });
                if w == 0 {
                    self.em.emit(Op::Mov { ty: ty_of(vt), d: *a, a: Src::Reg(v) });
                } else {
                    self.combine(op, vt, *a, *a, v);
                }
            }
        }
    }

    /// `reduce_lanes`: a row/column vector holding per-lane partials (from a fused reduction)
    /// becomes the full reduction in every holder.
    pub(crate) fn reduce_lanes(&mut self, op: ReduceOp, dst: BufId, axis: usize, loc: SrcLoc) -> Result<(), Diag> {
        let BufLayout::Fragment(vl) = self.p.layouts[dst] else {
            return self.err(loc, "reduce_lanes needs a vector fragment");
        };
        let vt = value_type(self.def().buffers[dst].dtype);
        let regs = self.regs[dst].clone();
        self.combine_lanes(op, vt, vl.vector(FragmentKind::Tile), axis, &regs);
        Ok(())
    }

    /// A vector fragment reduced to one value every thread holds, kept in a local `[1]` tile.
    fn reduce_vector(
        &mut self,
        op: ReduceOp,
        src: BufId,
        dst: BufId,
        l: FragmentLayout,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let (sb, db) = (self.def().buffers[src].clone(), self.def().buffers[dst].clone());
        if db.shape != [1] {
            return self.err(
                loc,
                format!(
                    "reducing vector `{}` to one value needs a local [1] tile; `{}` is {:?}",
                    sb.name, db.name, db.shape
                ),
            );
        }
        let vt = value_type(sb.dtype);
        if value_type(db.dtype) != vt {
            return self.err(loc, format!("reduce from {} into {}: element types must agree", sb.dtype, db.dtype));
        }
        let acc = self.em.reg(class_of(vt));
        self.em.emit(Op::Mov { ty: ty_of(vt), d: acc, a: Src::Reg(self.regs[src][0]) });
        for s in 1..l.slots() as usize {
            let r = self.regs[src][s];
            self.combine(op, vt, acc, acc, r);
        }
        self.combine_vector_holders(op, vt, l, acc);
        let v = self.round_for(V { s: Src::Reg(acc), ty: vt }, db.dtype);
        let d = self.regs[dst][0];
        self.mov(d, v);
        Ok(())
    }

    /// `reduce_vector_lanes`: the local `[1]` `dst` holds this thread's partial over its
    /// elements of `vector`; afterwards, the total in every thread.
    pub(crate) fn reduce_vector_lanes(
        &mut self,
        op: ReduceOp,
        dst: BufId,
        vector: BufId,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let (BufLayout::Fragment(l), BufLayout::Local) = (self.p.layouts[vector], self.p.layouts[dst]) else {
            return self.err(loc, "reduce_vector_lanes needs a vector fragment and a local [1] tile");
        };
        let vt = value_type(self.def().buffers[dst].dtype);
        let acc = self.regs[dst][0];
        self.combine_vector_holders(op, vt, l, acc);
        Ok(())
    }

    /// Combines one partial per thread (over its elements of a vector with layout `l`) across
    /// the lanes, then the warps, that hold different elements; every thread gets the total.
    fn combine_vector_holders(&mut self, op: ReduceOp, vt: DType, l: FragmentLayout, acc: Reg) {
        // Rows are spread over g (lanes `lanes_per_row` apart), columns over t (adjacent lanes).
        let lanes = l.lane_masks(l.kind != FragmentKind::Rows);
        for m in &lanes {
            let o = self.em.reg(class_of(vt));
            self.em.emit(Op::Shfl { mode: ShflMode::Bfly, d: o, a: acc, b: Src::Imm(*m), c: 31 });
            self.combine(op, vt, acc, acc, o);
        }
        let across = if l.kind == FragmentKind::Rows { l.wm } else { l.wn };
        if across > 1 {
            let (wpos, other) = if l.kind == FragmentKind::Rows {
                (
                    self.em.op32(BinKind::Div, self.scope.th.warp, l.wn as i64),
                    self.em.op32(BinKind::Rem, self.scope.th.warp, l.wn as i64),
                )
            } else {
                (
                    self.em.op32(BinKind::Rem, self.scope.th.warp, l.wn as i64),
                    self.em.op32(BinKind::Div, self.scope.th.warp, l.wn as i64),
                )
            };
            self.barrier();
            // Lane 0 of one warp per position along the vector writes that warp's partial.
            let lane0 = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.lane, Src::Imm(0));
            let other = self.em.to_reg(other, RegClass::B32, Ty::U32);
            let first = self.em.setp(Cmp::Eq, Ty::S32, other, Src::Imm(0));
            let owner = self.em.and_pred(Some(lane0), Some(first));
            let a = self.scratch_addr(wpos);
            let skip = self.em.label();
            if let Some(p) = owner {
                self.em.emit_if(p, false, Op::Bra { target: skip });
            }
            self.em.emit(Op::St { space: Space::Shared, ty: ty_of(vt), addr: a, offset: 0, vals: vec![Src::Reg(acc)] });
            self.em.emit(Op::Label(skip));
            self.barrier();
            for w in 0..across {
                let a = self.scratch_addr(Src::Imm(w as i64));
                let v = self.em.reg(class_of(vt));
                self.em.emit(Op::Ld { space: Space::Shared, ty: ty_of(vt), d: vec![v], addr: a, offset: 0 });
                if w == 0 {
                    self.em.emit(Op::Mov { ty: ty_of(vt), d: acc, a: Src::Reg(v) });
                } else {
                    self.combine(op, vt, acc, acc, v);
                }
            }
        }
    }

    pub(crate) fn cumsum(&mut self, src: BufId, dst: BufId, axis: usize, loc: SrcLoc) -> Result<(), Diag> {
        let (sb, db) = (self.def().buffers[src].clone(), self.def().buffers[dst].clone());
        if sb.shape != db.shape {
            return self.err(
                loc,
                format!("cumsum from `{}` {:?} into `{}` {:?}: shapes differ", sb.name, sb.shape, db.name, db.shape),
            );
        }
        if axis >= sb.shape.len() {
            return self.err(loc, format!("cumsum axis {axis} of a {}-D tile", sb.shape.len()));
        }
        let vt = value_type(sb.dtype);
        if !matches!(vt, DType::F32 | DType::I32) || value_type(db.dtype) != vt {
            return self.err(
                loc,
                format!("cumsum needs f32/bf16/f16 or i32 tiles of one kind, found {} and {}", sb.dtype, db.dtype),
            );
        }
        let (rows, cols) = self.tile_rc(src);
        let (lines, len, line_stride, step) =
            if sb.shape.len() == 1 || axis == 1 { (rows, cols, cols, 1) } else { (cols, rows, 1, cols) };
        let shared =
            matches!(self.p.layouts[src], BufLayout::Shared(_)) && matches!(self.p.layouts[dst], BufLayout::Shared(_));
        let threads = self.scope.threads;
        let two_d = sb.shape.len() == 2;
        if shared {
            if src != dst {
                self.for_each_shared_elem(dst, |lw, r, c| {
                    let (r, c) = if two_d { (r, c) } else { (Src::Imm(0), c) };
                    let a = lw.shared_addr(src, r, c);
                    let v = lw.load_mem(Space::Shared, a, sb.dtype);
                    let b = lw.shared_addr(dst, r, c);
                    lw.store_mem(Space::Shared, b, db.dtype, v);
                    Ok(())
                })?;
                self.barrier();
            }
        } else {
            self.barrier();
            self.tile_to_scratch(src, loc)?;
            self.barrier();
        }
        // One thread per line scans it serially. The line is the thread index plus a constant
        // (a split index), so inside the element-loop scope a shared tile's addresses along the
        // line are one thread part plus a constant XOR and offset each (`element_addr.rs`).
        let tid_bits = bits_below(threads);
        for k in 0..lines.div_ceil(threads) {
            let line = self.split_index(self.scope.th.tid, tid_bits, k * threads);
            let skip = self.em.label();
            if (k + 1) * threads > lines {
                let p = self.em.setp(Cmp::Ge, Ty::S32, line, Src::Imm(lines as i64));
                self.em.emit_if(p, true, Op::Bra { target: skip });
            }
            let acc = self.em.reg(class_of(vt));
            let zero = if vt == DType::F32 { Src::F32(0.0) } else { Src::Imm(0) };
            self.em.emit(Op::Mov { ty: ty_of(vt), d: acc, a: zero });
            self.element_loop(|lw| {
                // The loads of a batch before its first store: a store between them would keep
                // the assembler from issuing the next loads early (it cannot tell swizzled
                // addresses of one tile apart), and the line's scan would wait for each load in
                // turn. Batches bound the registers a long line holds.
                let mut loaded = Vec::with_capacity(SCAN_BATCH.min(len as usize));
                for e in 0..len {
                    let (addr, dt) = if shared {
                        let (r, c) = if sb.shape.len() == 1 || axis == 1 {
                            (line, Src::Imm(e as i64))
                        } else {
                            (Src::Imm(e as i64), line)
                        };
                        (lw.shared_addr(dst, r, c), db.dtype)
                    } else {
                        let base = lw.em.mul32(line, Src::Imm(line_stride as i64));
                        let at = lw.em.add32(base, Src::Imm((e * step) as i64));
                        (lw.scratch_addr(at), if vt == DType::F32 { DType::F32 } else { DType::I32 })
                    };
                    let v = lw.load_mem(Space::Shared, addr, dt);
                    loaded.push((addr, dt, lw.em.to_reg(v.s, class_of(vt), ty_of(vt))));
                    if loaded.len() == SCAN_BATCH || e + 1 == len {
                        for (addr, dt, vr) in loaded.drain(..) {
                            let (a, b) = (Src::Reg(acc), Src::Reg(vr));
                            lw.em.emit(Op::Bin { op: BinKind::Add, ty: ty_of(vt), d: acc, a, b });
                            lw.store_mem(Space::Shared, addr, dt, V { s: Src::Reg(acc), ty: vt });
                        }
                    }
                }
            });
            self.em.emit(Op::Label(skip));
        }
        if !shared {
            self.barrier();
            self.scratch_to_tile(dst, loc)?;
        }
        Ok(())
    }

    fn tile_to_scratch(&mut self, b: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let (_, cols) = self.tile_rc(b);
        let vt = value_type(self.def().buffers[b].dtype);
        match self.p.layouts[b] {
            BufLayout::Fragment(l) => {
                let owner = self.vector_owner(l);
                for s in 0..l.slots() {
                    let a = self.scratch_slot_addr(l, s, cols);
                    let skip = self.em.label();
                    if let Some(p) = owner {
                        self.em.emit_if(p, false, Op::Bra { target: skip });
                    }
                    let v = self.regs[b][s as usize];
                    self.em.emit(Op::St {
                        space: Space::Shared,
                        ty: ty_of(vt),
                        addr: a,
                        offset: 0,
                        vals: vec![Src::Reg(v)],
                    });
                    self.em.emit(Op::Label(skip));
                }
                Ok(())
            }
            _ => self.err(loc, "cumsum of a local tile: use a fragment or shared tile"),
        }
    }

    /// The scratch address of fragment slot `s`, the tile stored row-major with `cols` columns.
    fn scratch_slot_addr(&mut self, l: FragmentLayout, s: u32, cols: u32) -> Reg {
        let (r, c) = self.frag_coords(l, s);
        let at = if l.kind == FragmentKind::Tile {
            let rc = self.em.mul32(r, Src::Imm(cols as i64));
            self.em.add32(rc, c)
        } else {
            r
        };
        self.scratch_addr(at)
    }

    fn scratch_to_tile(&mut self, b: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let (_, cols) = self.tile_rc(b);
        let dt = self.def().buffers[b].dtype;
        let vt = value_type(dt);
        match self.p.layouts[b] {
            BufLayout::Fragment(l) => {
                for s in 0..l.slots() {
                    let a = self.scratch_slot_addr(l, s, cols);
                    let v = self.em.reg(class_of(vt));
                    self.em.emit(Op::Ld { space: Space::Shared, ty: ty_of(vt), d: vec![v], addr: a, offset: 0 });
                    let v = self.round_for(V { s: Src::Reg(v), ty: vt }, dt);
                    let d = self.regs[b][s as usize];
                    self.mov(d, v);
                }
                Ok(())
            }
            _ => self.err(loc, "cumsum into a local tile: use a fragment or shared tile"),
        }
    }
}
