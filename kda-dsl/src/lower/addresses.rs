//! Addresses of tile elements: in a shared tile's layout (its swizzle, the thread part cached
//! by `element_addr`) and in a global tensor (64-bit, strides from its extents).

use super::*;

impl Lower<'_> {
    /// The shared address of element (row, col) of shared buffer `b` (1-D tiles use col).
    pub(crate) fn shared_addr(&mut self, b: BufId, row: Src, col: Src) -> Reg {
        if let Some(a) = self.split_shared_addr(b, row, col) {
            return a;
        }
        let off = self.element_offset(b, row, col);
        let esize = self.def().buffers[b].dtype.size_bytes() as i64;
        let base = self.shared_base[b].expect("shared buffers have a base");
        let bytes = self.em.mul32(off, Src::Imm(esize));
        let a = self.em.add32(base, bytes);
        self.em.to_reg(a, RegClass::B32, Ty::U32)
    }

    /// The element offset of `(row, col)` in shared buffer `b`'s layout.
    pub(crate) fn element_offset(&mut self, b: BufId, row: Src, col: Src) -> Src {
        let l = self.p.shared(b);
        let (_, cols) = l.shape();
        match (row, col) {
            (Src::Imm(r), Src::Imm(c)) => Src::Imm(l.offset(r as u32, c as u32) as i64),
            _ => match l.swizzle_params() {
                None => {
                    let rc = self.em.mul32(row, Src::Imm(cols as i64));
                    self.em.add32(rc, col)
                }
                Some(z) if z.slab == cols => {
                    let chunk = z.chunk;
                    let lc = chunk.trailing_zeros() as i64;
                    let ch = self.em.op32(BinKind::Shr, col, lc);
                    let within = self.em.op32(BinKind::And, col, chunk as i64 - 1);
                    let phys = self.swizzled_chunk(z, row, ch);
                    let pc = self.em.op32(BinKind::Shl, phys, lc);
                    let rc = self.em.mul32(row, Src::Imm(cols as i64));
                    let s = self.em.add32(rc, pc);
                    self.em.add32(s, within)
                }
                // Slabs: the slab's offset, then the row within it as one line of `slab`.
                Some(z) => {
                    let lc = z.chunk.trailing_zeros() as i64;
                    let in_slab = self.em.op32(BinKind::And, col, z.slab as i64 - 1);
                    let ch = self.em.op32(BinKind::Shr, in_slab, lc);
                    let within = self.em.op32(BinKind::And, col, z.chunk as i64 - 1);
                    let phys = self.swizzled_chunk(z, row, ch);
                    let pc = self.em.op32(BinKind::Shl, phys, lc);
                    let slab = self.em.op32(BinKind::Shr, col, z.slab.trailing_zeros() as i64);
                    let slab_off = self.em.mul32(slab, Src::Imm(z.slab_elems as i64));
                    let rc = self.em.mul32(row, Src::Imm(z.slab as i64));
                    let s = self.em.add32(rc, pc);
                    let s = self.em.add32(s, slab_off);
                    self.em.add32(s, within)
                }
            },
        }
    }

    /// The physical 16-byte chunk of logical chunk `chunk` in row `row` of a swizzled tile
    /// (`z`): `chunk ^ xor((row / rows_per_line) & mask)`.
    pub(crate) fn swizzled_chunk(&mut self, z: crate::layout::SwizzleParams, row: Src, chunk: Src) -> Src {
        let mask = z.mask;
        let rs = self.em.op32(BinKind::Shr, row, z.rows_per_line.trailing_zeros() as i64);
        let x = match rs {
            Src::Imm(v) => Src::Imm(z.xor.apply((v as u32) & mask, mask) as i64),
            // Below 8 chunks per line (and for the plain XOR) the map is the identity.
            rs if mask < 4 || z.xor == crate::layout::ChunkXor::Plain => self.em.op32(BinKind::And, rs, mask as i64),
            rs => {
                let up = self.em.op32(BinKind::Shl, rs, 2);
                let mixed = Src::Reg(self.em.bin(BinKind::Xor, Ty::B32, RegClass::B32, rs, up));
                self.em.op32(BinKind::And, mixed, mask as i64)
            }
        };
        match (chunk, x) {
            (Src::Imm(a), Src::Imm(b)) => Src::Imm(a ^ b),
            (a, b) => Src::Reg(self.em.bin(BinKind::Xor, Ty::B32, RegClass::B32, a, b)),
        }
    }

    /// Extent `dim` as a 64-bit operand: the constant the kernel assumes it is (`assume_extent`,
    /// checked at launch), so that addresses scale by shifts, else its register.
    pub(crate) fn extent64(&self, dim: ParamId) -> Src {
        match self.def().exact_extent(dim) {
            Some(v) => Src::Imm(v),
            None => Src::Reg(self.dims64[&dim]),
        }
    }

    /// The global address of `tensor[idx..]` (64-bit arithmetic throughout).
    pub(crate) fn global_addr(&mut self, t: ParamId, idx: &[Expr], loc: SrcLoc) -> Result<Reg, Diag> {
        let mut vals = vec![];
        for e in idx {
            vals.push(self.expr(e, DType::I64, loc)?.s);
        }
        Ok(self.global_addr_of(t, &vals))
    }

    /// The global address of `tensor[idx..]` from lowered 64-bit (or immediate) indices.
    pub(crate) fn global_addr_of(&mut self, t: ParamId, idx: &[Src]) -> Reg {
        let (a, bytes) = self.global_addr_parts(t, idx);
        self.plus_bytes(a, bytes)
    }

    /// `addr + bytes` (a 64-bit add, none for 0).
    pub(crate) fn plus_bytes(&mut self, addr: Reg, bytes: i64) -> Reg {
        match bytes {
            0 => addr,
            b => self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, addr, Src::Imm(b)),
        }
    }

    /// [`Self::global_addr_of`] as the address with the innermost index taken as 0, and that
    /// index's bytes when it is a non-negative constant (else 0, and the index is in the
    /// address). Boxes that differ only in a constant innermost start (column blocks of one
    /// row) then compute the same first part, which ptxas shares.
    pub(crate) fn global_addr_parts(&mut self, t: ParamId, idx: &[Src]) -> (Reg, i64) {
        self.global_addr_parts_in_loop(t, idx, &vec![false; idx.len()])
    }

    /// [`Self::global_addr_parts`] where `varies[k]` says index `k` changes from one iteration
    /// of the innermost loop to the next. When some do and some do not, the indices that do
    /// not make an address of their own (the others taken as 0), and each that does adds its
    /// index times its axis's bytes: that first address reads only values fixed across the
    /// loop, so it is computed once before the loop (`hoist`) instead of every iteration.
    /// The same address either way (64-bit arithmetic, reassociated).
    pub(crate) fn global_addr_parts_in_loop(&mut self, t: ParamId, idx: &[Src], varies: &[bool]) -> (Reg, i64) {
        let dims = self.tensor_dims(t);
        let esize = self.tensor_dtype(t).size_bytes() as i64;
        let last = dims.len() - 1;
        let split = match idx[last] {
            Src::Imm(c) if c >= 0 && last > 0 => Some(c),
            _ => None,
        };
        let split_off = |k: usize| split.is_some() && k == last;
        let loop_part: Vec<usize> = (0..idx.len()).filter(|k| varies[*k] && !split_off(*k)).collect();
        let mixed = !loop_part.is_empty() && loop_part.len() < idx.len();
        let fixed = |k: usize| if split_off(k) || (mixed && varies[k]) { Src::Imm(0) } else { idx[k] };
        let first = self.em.wide(fixed(0));
        let mut lin = Src::Reg(self.em.to_reg(first, RegClass::B64, Ty::S64));
        for (k, dim) in dims.iter().enumerate().skip(1) {
            let d = self.extent64(*dim);
            let i = self.em.wide(fixed(k));
            let r = self.em.reg(RegClass::B64);
            self.em.emit(Op::Mad { ty: Ty::S64, d: r, a: lin, b: d, c: i });
            lin = Src::Reg(r);
        }
        let base = self.ptrs[&t];
        let mut a = self.em.reg(RegClass::B64);
        self.em.emit(Op::Mad { ty: Ty::S64, d: a, a: lin, b: Src::Imm(esize), c: Src::Reg(base) });
        if mixed {
            for k in loop_part {
                let bytes = self.axis_bytes(&dims, k, esize);
                let i = self.em.wide(idx[k]);
                let i = self.em.to_reg(i, RegClass::B64, Ty::S64);
                let r = self.em.reg(RegClass::B64);
                self.em.emit(Op::Mad { ty: Ty::S64, d: r, a: Src::Reg(i), b: bytes, c: Src::Reg(a) });
                a = r;
            }
        }
        (a, split.map_or(0, |c| c * esize))
    }

    /// Bytes between consecutive indices of axis `axis` of a tensor of extents `dims` and
    /// elements of `esize` bytes (64-bit; a constant where the extents are known).
    pub(crate) fn axis_bytes(&mut self, dims: &[ParamId], axis: usize, esize: i64) -> Src {
        let mut s = Src::Imm(esize);
        for d in &dims[axis + 1..] {
            s = match (self.extent64(*d), s) {
                (Src::Imm(a), Src::Imm(b)) if a.checked_mul(b).is_some() => Src::Imm(a * b),
                (a, b) => {
                    let a = self.em.to_reg(a, RegClass::B64, Ty::S64);
                    Src::Reg(self.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, a, b))
                }
            };
        }
        s
    }

    /// The address (register, constant offset) of each `vec`-run of a tile fragment in swizzled
    /// shared tile `sh`, computing the swizzle once: when a warp's columns are one atom wide
    /// (`wn = 1`) and slot rows differ by whole swizzle periods, a run's physical chunk is the
    /// thread's first chunk XOR a constant (the run's chunk offset has no bits in common with
    /// the thread's). `None` when that does not hold, or the tile is not swizzled.
    pub(super) fn swizzled_runs(&mut self, sh: BufId, l: crate::layout::FragmentLayout) -> Option<Vec<(Reg, i64)>> {
        let z = self.p.shared(sh).swizzle_params()?;
        // Runs in a tile of slabs take the element addresses.
        if z.slab != self.p.shared(sh).shape().1 {
            return None;
        }
        let (chunk, period) = (z.chunk, z.rows_per_line * (z.mask + 1));
        let runs: Vec<crate::layout::SlotCoord> =
            (0..l.slots()).step_by(l.vec as usize).map(|s| l.slot_coord(s)).collect();
        let granule: u32 = l.atom_cols();
        let fits = l.kind == FragmentKind::Tile
            && l.wn == 1
            && granule.is_multiple_of(chunk)
            && (granule / chunk).is_power_of_two()
            && runs.iter().all(|c| c.row_off.is_multiple_of(period) && c.col_off.is_multiple_of(granule));
        if !fits {
            return None;
        }
        let esize = self.def().buffers[sh].dtype.size_bytes() as i64;
        let (_, cols) = self.p.shared(sh).shape();
        let row_bytes = cols as i64 * esize;
        let (rb, cb) = self.frag_base(l);
        let base = self.shared_base[sh].expect("shared buffers have a base");
        let rows = self.em.mul32(rb, Src::Imm(row_bytes));
        let within = self.em.op32(BinKind::Rem, cb, chunk as i64);
        let within = self.em.mul32(within, Src::Imm(esize));
        let row_base = self.em.add32(base, rows);
        let row_base = self.em.add32(row_base, within);
        let ch = self.em.op32(BinKind::Div, cb, chunk as i64);
        let phys0 = self.swizzled_chunk(z, Src::Reg(rb), ch);
        let mut by_chunk: std::collections::HashMap<u32, Reg> = std::collections::HashMap::new();
        let mut out = vec![];
        for c in runs {
            let k = c.col_off / chunk;
            let a = match by_chunk.get(&k) {
                Some(a) => *a,
                None => {
                    let p = if k == 0 { phys0 } else { self.em.op32(BinKind::Xor, phys0, k as i64) };
                    let off = self.em.op32(BinKind::Shl, p, 4);
                    let a = self.em.add32(row_base, off);
                    let a = self.em.to_reg(a, RegClass::B32, Ty::U32);
                    by_chunk.insert(k, a);
                    a
                }
            };
            out.push((a, c.row_off as i64 * row_bytes));
        }
        Some(out)
    }
}
