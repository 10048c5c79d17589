//! Copies between global boxes and shared tiles: 16-byte `cp.async` fills and vector stores
//! where the plan allows them, element by element (masked) otherwise.

use super::copy::{covers, GlobalBox};
use super::copy_plan::{CopyKind, NoFastPath};
use super::element_addr::bits_below;
use super::Lower;
use super::V;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::passes::check_types::value_type;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    /// Plans a copy between `gb` and a shared tile of `dt`: `vectors` when the box allows
    /// 16-byte vectors and the element types agree, element by element otherwise (and why);
    /// records the plan and returns the kind, which the emitter matches on.
    fn plan_shared_copy(&mut self, gb: &GlobalBox, dt: DType, vectors: CopyKind, loc: SrcLoc) -> CopyKind {
        let mut no_vec = gb.no_vector.clone();
        if no_vec.is_none() && dt != gb.dtype {
            no_vec = Some(NoFastPath::DtypesDiffer { tensor: gb.dtype, tile: dt });
        }
        let kind = if no_vec.is_none() { vectors } else { CopyKind::Elements };
        self.record_plan(loc, kind, no_vec);
        kind
    }

    pub(super) fn global_to_shared(
        &mut self,
        src: &Region,
        b: BufId,
        live: Option<Reg>,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let gb = self.global_box(src, b, loc)?;
        let dt = self.def().buffers[b].dtype;
        match self.plan_shared_copy(&gb, dt, CopyKind::AsyncVectors, loc) {
            CopyKind::Elements => self.element_fill(&gb, b, live),
            _ => {
                self.async_vector_fill(&gb, b, live);
                Ok(())
            }
        }
    }

    /// `global_to_shared` in 16-byte `cp.async` copies (committed here outside a pipeline's
    /// stage fills). Every vector copy is asynchronous: the warp goes on, and the barrier
    /// before the first read waits for it (the lowering of `Barrier`). Inside a pipeline's body
    /// its group is newer than the stage fills, which only makes the loop's waits stricter.
    fn async_vector_fill(&mut self, gb: &GlobalBox, b: BufId, live: Option<Reg>) {
        let dt = self.def().buffers[b].dtype;
        let (rows, cols) = self.tile_rc(b);
        let threads = self.scope.threads;
        let chunk = 16 / dt.size_bytes() as u32;
        let vpr = cols / chunk;
        let n = rows * vpr;
        let step = threads / vpr;
        // Pass k's swizzle is pass 0's XOR a constant when `step` rows are whole groups of
        // `rpl` rows, a power of two of them (pass 0's row groups stay below that bit).
        let swizzle_ok = self
            .p
            .shared(b)
            .swizzle_params()
            .is_none_or(|z| step.is_multiple_of(z.rows_per_line) && (step / z.rows_per_line).is_power_of_two());
        let whole_rows = threads.is_multiple_of(vpr) && n.is_multiple_of(threads);
        if rows > 1 && whole_rows && swizzle_ok && gb.row_stride.is_some() {
            self.strided_fill(gb, b, live, step, n / threads);
        } else {
            for k in 0..n.div_ceil(threads) {
                let v = self.em.add32(self.scope.th.tid, Src::Imm((k * threads) as i64));
                let in_range = if (k + 1) * threads > n {
                    Some(self.em.setp(Cmp::Lt, Ty::S32, v, Src::Imm(n as i64)))
                } else {
                    None
                };
                let r = self.em.op32(BinKind::Div, v, vpr as i64);
                let cv = self.em.op32(BinKind::Rem, v, vpr as i64);
                let c = self.em.op32(BinKind::Mul, cv, chunk as i64);
                let (addr, valid) = self.box_elem(gb, r, c);
                let valid = self.em.and_pred(valid, live);
                let saddr = self.shared_addr(b, r, c);
                if let Some(skip) = in_range {
                    let l = self.em.label();
                    self.em.emit_if(skip, false, Op::Bra { target: l });
                    self.vector_fill(addr, saddr, valid, gb.tensor);
                    self.em.emit(Op::Label(l));
                } else {
                    self.vector_fill(addr, saddr, valid, gb.tensor);
                }
            }
        }
        if live.is_none() {
            self.em.emit(Op::CpAsyncCommit);
        }
    }

    /// `global_to_shared` element by element, masked per element.
    fn element_fill(&mut self, gb: &GlobalBox, b: BufId, live: Option<Reg>) -> Result<(), Diag> {
        let dt = self.def().buffers[b].dtype;
        let (rows, cols) = self.tile_rc(b);
        // In a pipeline's main loop the stores wait for the end of the body (`DeferredFill`),
        // where each thread holds only a few: the loaded values stay in registers across the
        // body (an unaligned GEMM's 16 per tile took it from 72 to 122 registers).
        let per_thread = (rows * cols).div_ceil(self.scope.threads);
        let defer = self.deferred_fills.is_some() && per_thread <= super::loops::DEFERRED_ELEMS_MAX;
        let mut loaded = vec![];
        self.for_each_shared_elem(b, |lw, r, c| {
            let (r, c) = lw.shared_elem_index(b, r, c);
            let (addr, valid) = lw.box_elem(gb, r, c);
            let valid = lw.em.and_pred(valid, live);
            if defer {
                // The bits only: converting them here would wait for the load.
                loaded.push(lw.load_raw_at(Space::Global, addr, 0, gb.dtype, valid));
            } else {
                let v = lw.masked_load(addr, 0, gb.dtype, valid);
                let saddr = lw.shared_addr(b, r, c);
                lw.store_mem(Space::Shared, saddr, dt, v);
            }
            Ok(())
        })?;
        if let Some(deferred) = self.deferred_fills.as_mut().filter(|_| defer) {
            let stage_base = self.shared_base[b].expect("shared buffers have a base");
            deferred.push(super::loops::DeferredFill { buf: b, stage_base, loaded: gb.dtype, values: loaded, live });
        }
        Ok(())
    }

    /// The (row, column) of a shared tile's element as `for_each_shared_elem` gives it: a
    /// 1-D tile is one row.
    pub(super) fn shared_elem_index(&self, b: BufId, r: Src, c: Src) -> (Src, Src) {
        if self.def().buffers[b].shape.len() == 2 {
            (r, c)
        } else {
            (Src::Imm(0), c)
        }
    }

    /// A vector fill whose threads cover whole rows: pass `k` moves the chunks of pass 0 down
    /// `k * step` rows, so one address of each kind is computed and the others are offsets
    /// from it (a 64-bit add in global memory; in a swizzled tile, the chunk index changes by
    /// a constant XOR, since the rows of pass 0 stay below `step`).
    pub(super) fn strided_fill(&mut self, gb: &GlobalBox, b: BufId, live: Option<Reg>, step: u32, passes: u32) {
        let dt = self.def().buffers[b].dtype;
        let esize = dt.size_bytes() as i64;
        let chunk = 16 / esize;
        let l = self.p.shared(b);
        let (_, cols) = l.shape();
        let vpr = cols as i64 / chunk;
        let (r0, cv, c0) = self.first_pass_chunk(vpr, chunk);
        // Global: the first chunk's address and the columns' mask; rows are masked per pass.
        // With the columns inside the tensor, a constant column start is added after the
        // masked selection: fills of other column blocks of the same rows (and the tensor's
        // base they fall back to, plus that start, still inside its first row) then share
        // every address but the instruction's offset.
        let rs = gb.row_stride.expect("a 2-D box");
        let (row_base, tail) = match gb.base_parts {
            (a, t) if t != 0 && covers(gb.col_lim, gb.extent.1) => (a, t),
            _ => (gb.base, 0),
        };
        let first = self.box_addr_from(gb, row_base, r0, c0);
        let mut addr = first;
        let valid = self.em.and_pred(gb.unit_ok, live);
        let col_valid = self.and_col_mask(gb, c0, valid);
        let step_bytes = self.em.reg(RegClass::B64);
        self.em.emit(Op::Bin {
            op: BinKind::Mul,
            ty: Ty::S64,
            d: step_bytes,
            a: Src::Reg(rs),
            b: Src::Imm(step as i64),
        });
        // Shared: the row base and (swizzled) the physical chunk of pass 0. In a tile of slabs
        // a row is one slab wide, and the thread's chunk picks its slab.
        let base = self.shared_base[b].expect("shared buffers have a base");
        let slabs = l.swizzle_params().filter(|z| z.slab != cols);
        let (row_bytes, base, cv) = match slabs {
            None => (cols as i64 * esize, base, cv),
            Some(z) => {
                let per_slab = (z.slab as i64) / chunk;
                let slab = self.em.op32(BinKind::Shr, cv, per_slab.trailing_zeros() as i64);
                let slab_off = self.em.mul32(slab, Src::Imm(z.slab_elems as i64 * esize));
                let in_slab = self.em.op32(BinKind::And, cv, per_slab - 1);
                (z.slab as i64 * esize, self.em.add32(base, slab_off), in_slab)
            }
        };
        let rb = self.em.mul32(r0, Src::Imm(row_bytes));
        let row_base = self.em.add32(base, rb);
        let swizzle = l.swizzle_params().map(|z| (z, self.swizzled_chunk(z, r0, cv)));
        let row_masks = gb.row_lim.filter(|lim| !covers(*lim, gb.extent.0));
        // One mask for every pass: choose the source address and size once. A masked thread
        // reads nothing from the tensor's base in every pass (its step is 0).
        let mut uniform = None;
        if let (None, Some(p)) = (row_masks, col_valid) {
            let ptr = self.ptrs[&gb.tensor];
            addr = self.em.reg(RegClass::B64);
            self.em.emit(Op::Selp { ty: Ty::U64, d: addr, a: Src::Reg(first), b: Src::Reg(ptr), p });
            let step = self.em.reg(RegClass::B64);
            self.em.emit(Op::Selp { ty: Ty::U64, d: step, a: Src::Reg(step_bytes), b: Src::Imm(0), p });
            let n = self.em.reg(RegClass::B32);
            self.em.emit(Op::Selp { ty: Ty::U32, d: n, a: Src::Imm(16), b: Src::Imm(0), p });
            uniform = Some((step, n));
        }
        for k in 0..passes as i64 {
            if k > 0 {
                let step = uniform.map_or(step_bytes, |(s, _)| s);
                addr = self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, addr, step);
            }
            let valid = match row_masks {
                Some(lim) => {
                    let p = self.lt_minus(r0, lim, k * step as i64);
                    self.em.and_pred(col_valid, p)
                }
                None => col_valid,
            };
            let pass_base = self.em.add32(row_base, Src::Imm(k * step as i64 * row_bytes));
            let saddr = match swizzle {
                None => {
                    let c = self.em.mul32(c0, Src::Imm(esize));
                    self.em.add32(pass_base, c)
                }
                Some((z, phys)) => {
                    // Pass rows add to row r0 < step without carries: the XOR of the sum is
                    // r0's XOR the pass's (the chunk XOR is linear).
                    let group = ((k * step as i64 / z.rows_per_line as i64) & z.mask as i64) as u32;
                    let ck = z.xor.apply(group, z.mask) as i64;
                    let p = if ck == 0 { phys } else { self.em.op32(BinKind::Xor, phys, ck) };
                    let off = self.em.op32(BinKind::Shl, p, 4);
                    self.em.add32(pass_base, off)
                }
            };
            let saddr = self.em.to_reg(saddr, RegClass::B32, Ty::U32);
            match uniform {
                Some((_, n)) => {
                    let src = self.plus_bytes(addr, tail);
                    self.em.emit(Op::CpAsync { dst: saddr, src, src_bytes: Src::Reg(n) })
                }
                None => self.vector_fill_at(addr, tail, saddr, valid, gb.tensor),
            }
        }
    }

    /// One 16-byte chunk from global to shared, zero when `valid` is false.
    pub(super) fn vector_fill(&mut self, addr: Reg, saddr: Reg, valid: Option<Reg>, tensor: ParamId) {
        self.vector_fill_at(addr, 0, saddr, valid, tensor)
    }

    /// [`Self::vector_fill`] from `addr + tail`; a masked chunk reads nothing from the tensor's
    /// base plus `tail` (which the caller keeps inside the tensor).
    fn vector_fill_at(&mut self, addr: Reg, tail: i64, saddr: Reg, valid: Option<Reg>, tensor: ParamId) {
        match valid {
            None => {
                let src = self.plus_bytes(addr, tail);
                self.em.emit(Op::CpAsync { dst: saddr, src, src_bytes: Src::Imm(16) })
            }
            Some(p) => {
                // A masked chunk reads nothing (src size 0) from an address known to be valid.
                let n = self.em.reg(RegClass::B32);
                self.em.emit(Op::Selp { ty: Ty::U32, d: n, a: Src::Imm(16), b: Src::Imm(0), p });
                let safe = self.em.reg(RegClass::B64);
                self.em.emit(Op::Selp { ty: Ty::U64, d: safe, a: Src::Reg(addr), b: Src::Reg(self.ptrs[&tensor]), p });
                let src = self.plus_bytes(safe, tail);
                self.em.emit(Op::CpAsync { dst: saddr, src, src_bytes: Src::Reg(n) });
            }
        }
    }

    /// A load of `addr + offset` that yields 0 when `valid` is false (a guarded load).
    pub(super) fn masked_load(&mut self, addr: Reg, offset: i64, dt: DType, valid: Option<Reg>) -> V {
        let vt = value_type(dt);
        let Some(p) = valid else {
            return self.load_mem_at(Space::Global, addr, offset, dt, None);
        };
        let v = self.load_mem_at(Space::Global, addr, offset, dt, Some(p));
        V { s: v.s, ty: vt }
    }

    /// A store to `addr + offset` skipped when `valid` is false (a guarded store).
    pub(super) fn masked_store(&mut self, addr: Reg, offset: i64, dt: DType, v: V, valid: Option<Reg>) {
        self.store_mem_at(Space::Global, addr, offset, dt, v, valid);
    }

    pub(super) fn shared_to_global(&mut self, b: BufId, dst: &Region, loc: SrcLoc) -> Result<(), Diag> {
        if let Some(store) = self.p.tma_store(loc, b).cloned() {
            self.record_plan(loc, CopyKind::TensorBoxes { boxes: store.boxes.0.boxes }, None);
            return self.tma_store(&store, dst, loc);
        }
        let gb = self.global_box(dst, b, loc)?;
        let dt = self.def().buffers[b].dtype;
        match self.plan_shared_copy(&gb, dt, CopyKind::VectorStores, loc) {
            CopyKind::Elements => self.for_each_shared_elem(b, |lw, r, c| {
                let (r, c) = lw.shared_elem_index(b, r, c);
                let (addr, valid) = lw.box_elem(&gb, r, c);
                let saddr = lw.shared_addr(b, r, c);
                let v = lw.load_mem(Space::Shared, saddr, dt);
                lw.masked_store(addr, 0, gb.dtype, v, valid);
                Ok(())
            }),
            _ => {
                self.vector_stores(&gb, b);
                Ok(())
            }
        }
    }

    /// This thread's 16-byte chunk in the first pass over a tile of `vpr` chunks a row, of
    /// `chunk` elements each: its row, its chunk in the row and that chunk's first column.
    fn first_pass_chunk(&mut self, vpr: i64, chunk: i64) -> (Src, Src, Src) {
        let r0 = self.em.op32(BinKind::Div, self.scope.th.tid, vpr);
        let cv = self.em.op32(BinKind::Rem, self.scope.th.tid, vpr);
        let c0 = self.em.op32(BinKind::Mul, cv, chunk);
        (r0, cv, c0)
    }

    /// `shared_to_global` in 16-byte vector loads and stores.
    fn vector_stores(&mut self, gb: &GlobalBox, b: BufId) {
        let dt = self.def().buffers[b].dtype;
        let (_, cols) = self.tile_rc(b);
        let threads = self.scope.threads;
        let chunk = 16 / dt.size_bytes() as u32;
        let vpr = cols / chunk;
        // With whole rows a pass, pass k's row is pass 0's plus `k * threads / vpr` and its
        // column pass 0's: split indices, whose shared addresses are a thread part cached at
        // the first pass plus constants (`element_addr.rs`). Each is computed before the
        // branch around its store, so the cached part dominates every later use.
        let pass0 = threads.is_multiple_of(vpr).then(|| {
            let (r0, _, c0) = self.first_pass_chunk(vpr as i64, chunk as i64);
            (self.em.to_reg(r0, RegClass::B32, Ty::U32), self.em.to_reg(c0, RegClass::B32, Ty::U32))
        });
        self.element_loop(|lw| lw.vector_store_passes(gb, b, pass0));
    }

    /// [`Self::vector_stores`]'s passes; with `pass0`, pass 0's row and column registers.
    fn vector_store_passes(&mut self, gb: &GlobalBox, b: BufId, pass0: Option<(Reg, Reg)>) {
        let dt = self.def().buffers[b].dtype;
        let (rows, cols) = self.tile_rc(b);
        let threads = self.scope.threads;
        let chunk = 16 / dt.size_bytes() as u32;
        let vpr = cols / chunk;
        let n = rows * vpr;
        for k in 0..n.div_ceil(threads) {
            let v = self.em.add32(self.scope.th.tid, Src::Imm((k * threads) as i64));
            let (r, c) = match pass0 {
                Some((r0, c0)) => (
                    self.split_index(r0, bits_below(threads / vpr), k * (threads / vpr)),
                    self.split_index(c0, bits_below(vpr) * chunk, 0),
                ),
                None => {
                    let r = self.em.op32(BinKind::Div, v, vpr as i64);
                    let cv = self.em.op32(BinKind::Rem, v, vpr as i64);
                    (r, self.em.op32(BinKind::Mul, cv, chunk as i64))
                }
            };
            let (addr, valid) = self.box_elem(gb, r, c);
            let valid = if (k + 1) * threads > n {
                let p = self.em.setp(Cmp::Lt, Ty::S32, v, Src::Imm(n as i64));
                self.em.and_pred(valid, Some(p))
            } else {
                valid
            };
            let saddr = self.shared_addr(b, r, c);
            let skip = self.em.label();
            if let Some(p) = valid {
                self.em.emit_if(p, false, Op::Bra { target: skip });
            }
            let regs: Vec<Reg> = (0..4).map(|_| self.em.reg(RegClass::B32)).collect();
            self.em.emit(Op::Ld { space: Space::Shared, ty: Ty::B32, d: regs.clone(), addr: saddr, offset: 0 });
            self.em.emit(Op::St {
                space: Space::Global,
                ty: Ty::B32,
                addr,
                offset: 0,
                vals: regs.into_iter().map(Src::Reg).collect(),
            });
            self.em.emit(Op::Label(skip));
        }
    }
}
