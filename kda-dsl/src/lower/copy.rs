//! Lowering of `copy`: picks 16-byte vectors (`cp.async` from global to shared), pairs, or single
//! elements, and masks elements outside the tensor (or the box's bound). Each copy records its
//! [`CopyPlan`] (`copy_plan.rs`): the kind it lowers to and why not faster.

use super::copy_plan::{CopyKind, CopyPlan, NoFastPath};
use super::{Lower, V};
use crate::analysis::divisibility::{expr_divisor, gcd, ANY};
use crate::analysis::ranges;
use crate::artifact::HostExpr;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::passes::check_types::value_type;
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

/// A global box resolved against a tile: base address, per-axis steps and limits.
pub(crate) struct GlobalBox {
    pub(super) tensor: ParamId,
    /// Address of the box's first element.
    pub(super) base: Reg,
    /// `base` as an address and a constant: the box's start with its innermost index taken as
    /// 0, and that index's bytes (0 when it is not a constant).
    pub(super) base_parts: (Reg, i64),
    /// Bytes between rows (None for a 1-D tile).
    pub(super) row_stride: Option<Reg>,
    /// Bytes between columns (the element size when the column axis is contiguous).
    pub(super) col_stride: Src,
    /// The columns run along the tensor's innermost axis (adjacent columns are adjacent bytes).
    pub(super) col_contiguous: bool,
    /// Rows (columns) from the box's start to the bound: elements at or past are masked.
    pub(super) row_lim: Option<Src>,
    pub(super) col_lim: Src,
    /// False when a unit axis of the box is outside the tensor.
    pub(super) unit_ok: Option<Reg>,
    /// Element type.
    pub(super) dtype: DType,
    /// Why 16-byte vectors cannot be used, if they cannot.
    pub(super) no_vector: Option<NoFastPath>,
    /// The tile's rows and columns (a bound known to reach past them needs no mask).
    pub(super) extent: (u32, u32),
    /// The most adjacent columns (1, 2, 4 or 8) one access may cover.
    pub(super) run_align: u32,
    /// Why column pairs cannot be used, if they cannot.
    pub(super) no_pair: Option<NoFastPath>,
    /// Fragment stores write whole 128-byte lines (`.whole_lines()`).
    pub(super) whole_lines: bool,
}

/// Addresses of a fragment's slots in a global box, shared between slots: one base address
/// per distinct row, a constant byte offset per column, one predicate per distinct row and
/// column (slot coordinates are per-thread bases plus constants).
pub(super) struct SlotAddressing {
    pub(super) rows: std::collections::HashMap<u32, (Reg, Option<Reg>)>,
    pub(super) cols: std::collections::HashMap<u32, Option<Reg>>,
    pub(super) base_valid: Option<Reg>,
    pub(super) row_base: Option<Src>,
    pub(super) col_base: Src,
    pub(super) thread_addr: Reg,
    /// Bytes between columns, when a constant.
    pub(super) col_bytes: Option<i64>,
}

impl SlotAddressing {
    pub(super) fn new(
        lw: &mut Lower,
        gb: &GlobalBox,
        l: crate::layout::FragmentLayout,
        owner: Option<Reg>,
    ) -> SlotAddressing {
        let (rb, cb) = lw.frag_base(l);
        let (row_base, col_base) = match l.kind {
            FragmentKind::Tile => (Some(Src::Reg(rb)), Src::Reg(cb)),
            FragmentKind::Rows => (None, Src::Reg(rb)),
            FragmentKind::Cols => (None, Src::Reg(cb)),
        };
        let mut addr = Src::Reg(gb.base);
        if let (Some(rs), Some(r)) = (gb.row_stride, row_base) {
            addr = lw.add_scaled(addr, r, Src::Reg(rs));
        }
        addr = lw.add_scaled(addr, col_base, gb.col_stride);
        let thread_addr = lw.em.to_reg(addr, RegClass::B64, Ty::U64);
        let base_valid = lw.em.and_pred(gb.unit_ok, owner);
        let col_bytes = match gb.col_stride {
            Src::Imm(b) => Some(b),
            _ => None,
        };
        SlotAddressing {
            rows: Default::default(),
            cols: Default::default(),
            base_valid,
            row_base,
            col_base,
            thread_addr,
            col_bytes,
        }
    }

    /// (address register, constant byte offset, validity) of slot `s`.
    pub(super) fn slot(
        &mut self,
        lw: &mut Lower,
        gb: &GlobalBox,
        l: crate::layout::FragmentLayout,
        s: u32,
    ) -> (Reg, i64, Option<Reg>) {
        let c = l.slot_coord(s);
        let (row_off, col_off) = match l.kind {
            FragmentKind::Tile => (c.row_off, c.col_off),
            FragmentKind::Rows => (0, c.row_off),
            FragmentKind::Cols => (0, c.col_off),
        };
        let (row_addr, row_valid) = *self.rows.entry(row_off).or_insert_with(|| {
            let (addr, valid) = match (gb.row_stride, self.row_base) {
                (Some(rs), Some(rb)) => {
                    let a = if row_off == 0 {
                        self.thread_addr
                    } else {
                        let step = lw.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, rs, Src::Imm(row_off as i64));
                        lw.em.bin(BinKind::Add, Ty::S64, RegClass::B64, self.thread_addr, step)
                    };
                    let lim =
                        gb.row_lim.filter(|l| !covers(*l, gb.extent.0)).map(|lim| lw.lt_minus(rb, lim, row_off as i64));
                    (a, lim.flatten())
                }
                _ => (self.thread_addr, None),
            };
            (addr, valid)
        });
        let col_base = self.col_base;
        let col_valid = *self.cols.entry(col_off).or_insert_with(|| {
            if covers(gb.col_lim, gb.extent.1) {
                None
            } else {
                lw.lt_minus(col_base, gb.col_lim, col_off as i64)
            }
        });
        let valid = lw.em.and_pred(self.base_valid, row_valid);
        let valid = lw.em.and_pred(valid, col_valid);
        match self.col_bytes {
            Some(b) => (row_addr, col_off as i64 * b, valid),
            None => {
                // A strided column axis: add the column's offset at run time.
                let stride = lw.em.to_reg(gb.col_stride, RegClass::B64, Ty::S64);
                let step = lw.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, stride, Src::Imm(col_off as i64));
                (lw.em.bin(BinKind::Add, Ty::S64, RegClass::B64, row_addr, step), 0, valid)
            }
        }
    }
}

/// A tile shape as (rows, cols); a 1-D shape is one row.
fn rows_cols(s: &[u32]) -> (u32, u32) {
    if s.len() == 2 {
        (s[0], s[1])
    } else {
        (1, s[0])
    }
}

/// True when a bound known when lowering reaches past every element of an axis of `n`.
pub(super) fn covers(lim: Src, n: u32) -> bool {
    matches!(lim, Src::Imm(v) if v >= n as i64)
}

impl Lower<'_> {
    /// A lower bound of `extent - off` for every value `off` of `e` on tensor axis `dim`, when
    /// one is known and positive: the offset's range and an exact extent, or the offset is the
    /// block index whose grid extent is that very `Dim`. Only a bound at least the box's extent
    /// may stand in for the run-time limit (a smaller one would mask elements in range).
    pub(super) fn sure_limit(&self, e: &Expr, dim: ParamId) -> Option<i64> {
        let var = |v: VarId| self.consts.get(&v).map(|c| (*c, *c)).or_else(|| self.var_ranges.get(&v).copied());
        let exact = |p: ParamId| self.def().exact_extent(p);
        if let (Some((lo, hi)), Some(n)) = (ranges::expr_range(e, &var, &exact), exact(dim)) {
            return (lo >= 0 && hi < n).then_some(n - hi);
        }
        let def = self.def();
        let Expr::Var(v) = e else { return None };
        let axis = def.block_vars.iter().position(|b| *b == Some(*v))?;
        let grid_is_dim = matches!(&def.grid[axis], HostExpr::Dim(name) if name == def.params[dim].name());
        (grid_is_dim && !self.consts.contains_key(v) && !self.assign_counts.contains_key(v)).then_some(1)
    }

    /// A number every value of `e` is a multiple of.
    pub(super) fn divisor(&self, e: &Expr) -> u64 {
        let var = |v: VarId| match self.consts.get(&v) {
            Some(0) => ANY,
            Some(c) => c.unsigned_abs(),
            None => self.var_divisors.get(&v).copied().unwrap_or(1),
        };
        expr_divisor(e, &var, &|p| self.def().multiple_of(p) as u64)
    }

    /// Tile extents as (rows, cols); a 1-D tile is one row.
    pub(crate) fn tile_rc(&self, b: BufId) -> (u32, u32) {
        rows_cols(&self.def().buffers[b].shape)
    }

    /// The box `r` as copied to or from tile `b` (their extents must agree).
    pub(crate) fn global_box(&mut self, r: &Region, b: BufId, loc: SrcLoc) -> Result<GlobalBox, Diag> {
        let Region::Global { shape, .. } = r else { unreachable!("a global region") };
        let tile_shape = self.def().buffers[b].shape.clone();
        let tile_big: Vec<u32> = tile_shape.iter().copied().filter(|s| *s > 1).collect();
        let box_big: Vec<u32> = shape.iter().copied().filter(|s| *s > 1).collect();
        if box_big != tile_big {
            return self.err(
                loc,
                format!("the box {shape:?} does not match tile `{}` {tile_shape:?}", self.def().buffers[b].name),
            );
        }
        self.box_as(r, &tile_shape, loc)
    }

    /// The box `r` laid out as a tile of `tile_shape` (1-D or 2-D, the box's axes longer than 1).
    /// Its offsets and bounds may read global scalars (a varlen row); those are not the box's
    /// data, so they are lowered without the copy's L2 policy.
    pub(super) fn box_as(&mut self, r: &Region, tile_shape: &[u32], loc: SrcLoc) -> Result<GlobalBox, Diag> {
        let policy = std::mem::take(&mut self.em.cache);
        let gb = self.box_layout(r, tile_shape, loc);
        self.em.cache = policy;
        gb
    }

    pub(super) fn box_layout(&mut self, r: &Region, tile_shape: &[u32], loc: SrcLoc) -> Result<GlobalBox, Diag> {
        let Region::Global { tensor, offset, shape, bound, whole_lines, .. } = r else {
            unreachable!("a global region")
        };
        let t = *tensor;
        let dims = self.tensor_dims(t);
        let dtype = self.tensor_dtype(t);
        let big: Vec<usize> = (0..shape.len()).filter(|k| shape[*k] > 1).collect();
        // Which tensor axes carry the tile's rows and columns.
        let (row_axis, col_axis) = match (tile_shape.len(), big.len()) {
            (2, 2) => (Some(big[0]), big[1]),
            (2, 1) if tile_shape[0] == 1 => (None, big[0]),
            (2, 1) => (Some(big[0]), shape.len() - 1),
            (2, 0) | (1, 0) => (None, shape.len() - 1),
            (1, 1) => (None, big[0]),
            _ => unreachable!("tiles are 1-D or 2-D"),
        };
        let esize = dtype.size_bytes() as i64;
        let mut offs = vec![];
        for e in offset {
            offs.push(self.expr(e, DType::I32, loc)?.s);
        }
        // Split only where the loop-invariant part will move out (`hoist`): kept in the loop,
        // the split costs a multiply-add per varying index and the one chain ptxas shares
        // between boxes.
        let hoisted = self.def().hoist != Hoist::Nothing;
        let varies: Vec<bool> = offset.iter().map(|e| hoisted && self.varies_in_loop(e)).collect();
        let base_parts = self.global_addr_parts_in_loop(t, &offs, &varies);
        let base = self.plus_bytes(base_parts.0, base_parts.1);
        let mut lims = vec![];
        for (k, e) in offs.iter().enumerate() {
            // A box that provably lies inside its axis needs no check: its limit is a constant
            // at least the box's extent.
            if let (None, Some(sure)) = (bound, self.sure_limit(&offset[k], dims[k])) {
                if sure >= shape[k] as i64 {
                    lims.push(Src::Imm(sure));
                    continue;
                }
            }
            let bnd = match (bound, self.def().exact_extent(dims[k])) {
                (Some(bs), _) => self.expr(&bs[k], DType::I32, loc)?.s,
                (None, Some(e)) => Src::Imm(e),
                (None, None) => Src::Reg(self.dims[&dims[k]]),
            };
            let lim = match (bnd, *e) {
                (Src::Imm(a), Src::Imm(b)) => Src::Imm(a - b),
                (a, b) => {
                    let a = self.em.to_reg(a, RegClass::B32, Ty::S32);
                    Src::Reg(self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, a, b))
                }
            };
            lims.push(lim);
        }
        let mut unit_ok = None;
        for (k, lim) in lims.iter().enumerate() {
            if Some(k) != row_axis && k != col_axis && !matches!(lim, Src::Imm(v) if *v > 0) {
                let lim = self.em.to_reg(*lim, RegClass::B32, Ty::S32);
                let p = self.em.setp(Cmp::Gt, Ty::S32, lim, Src::Imm(0));
                unit_ok = self.em.and_pred(unit_ok, Some(p));
            }
        }
        let stride_of = |lw: &mut Self, axis: usize| lw.axis_bytes(&dims, axis, esize);
        let row_stride = row_axis.map(|a| {
            let s = stride_of(self, a);
            self.em.to_reg(s, RegClass::B64, Ty::S64)
        });
        let col_stride = stride_of(self, col_axis);
        // Alignment facts for vectors.
        let stride_div = |lw: &Self, axis: usize| -> u64 {
            dims[axis + 1..].iter().fold(1u64, |acc, d| (acc * lw.def().multiple_of(*d) as u64).min(ANY))
        };
        let base_div = offset
            .iter()
            .enumerate()
            .fold(ANY, |acc, (k, e)| gcd(acc, (self.divisor(e).saturating_mul(stride_div(self, k))).min(ANY)));
        let col_bound_div = match bound {
            Some(bs) => self.divisor(&bs[col_axis]),
            None => self.def().multiple_of(dims[col_axis]) as u64,
        };
        let cols = *tile_shape.last().unwrap_or(&1) as u64;
        let need = |m: u64| -> Option<NoFastPath> {
            if col_axis != dims.len() - 1 {
                return Some(NoFastPath::ColumnsNotInnermost);
            }
            if !cols.is_multiple_of(m) {
                return Some(NoFastPath::ColumnsNotMultiple { cols, of: m });
            }
            if base_div % m != 0 {
                return Some(NoFastPath::StartNotAligned { of: m });
            }
            if row_axis.is_some_and(|a| stride_div(self, a) % m != 0) {
                return Some(NoFastPath::RowLengthNotAligned { of: m });
            }
            if col_bound_div % m != 0 {
                return Some(NoFastPath::ColumnBoundNotAligned { of: m });
            }
            None
        };
        let chunk = (16 / esize) as u64;
        let no_vector = need(chunk);
        let no_pair = need(2);
        let run_align = [8u32, 4, 2].into_iter().find(|m| need(*m as u64).is_none()).unwrap_or(1);
        Ok(GlobalBox {
            tensor: t,
            base,
            base_parts,
            row_stride,
            col_stride,
            col_contiguous: col_axis == dims.len() - 1,
            row_lim: row_axis.map(|a| lims[a]),
            col_lim: lims[col_axis],
            unit_ok,
            dtype,
            no_vector,
            no_pair,
            extent: rows_cols(tile_shape),
            run_align,
            whole_lines: *whole_lines,
        })
    }

    /// `prefetch(box)`: one `prefetch.global.L2` per 128-byte line of each box row (at every
    /// 128 bytes from the row's first element, and at its last; every element when the box's
    /// columns are not the tensor's innermost axis), spread over the threads; masked elements
    /// prefetch nothing.
    pub(crate) fn prefetch(&mut self, r: &Region, loc: SrcLoc) -> Result<(), Diag> {
        let Region::Global { shape, .. } = r else { unreachable!("check_types: a global box") };
        let mut tile_shape: Vec<u32> = shape.iter().copied().filter(|s| *s > 1).collect();
        if tile_shape.is_empty() {
            tile_shape.push(1);
        }
        let gb = self.box_as(r, &tile_shape, loc)?;
        let (rows, cols) = gb.extent;
        // Columns along the tensor's innermost axis share lines; along any other axis each
        // element has its own.
        let step = if gb.col_contiguous { (128 / gb.dtype.size_bytes() as u32).max(1) } else { 1 };
        // Columns step, 2 step, ... and the last one (an unaligned row ends in a line of its own).
        let per_row = cols.div_ceil(step) + u32::from((cols - 1) % step != 0);
        let n = rows * per_row;
        let threads = self.scope.threads;
        for k in 0..n.div_ceil(threads) {
            let v = self.em.add32(self.scope.th.tid, Src::Imm((k * threads) as i64));
            let in_range = ((k + 1) * threads > n).then(|| self.em.setp(Cmp::Lt, Ty::S32, v, Src::Imm(n as i64)));
            let row = self.em.op32(BinKind::Div, v, per_row as i64);
            let line = self.em.op32(BinKind::Rem, v, per_row as i64);
            let at = self.em.mul32(line, Src::Imm(step as i64));
            let col = Src::Reg(self.em.bin(BinKind::Min, Ty::S32, RegClass::B32, at, Src::Imm(cols as i64 - 1)));
            let (addr, valid) = self.box_elem(&gb, row, col);
            match self.em.and_pred(valid, in_range) {
                Some(p) => self.em.emit_if(p, true, Op::Prefetch { addr }),
                None => self.em.emit(Op::Prefetch { addr }),
            }
        }
        Ok(())
    }

    /// Address and validity of element (row, col) of a box.
    pub(super) fn box_elem(&mut self, gb: &GlobalBox, row: Src, col: Src) -> (Reg, Option<Reg>) {
        let addr = self.box_addr(gb, row, col);
        let mut valid = gb.unit_ok;
        if let Some(rl) = gb.row_lim.filter(|l| !covers(*l, gb.extent.0)) {
            let p = self.lt(row, rl);
            valid = self.em.and_pred(valid, p);
        }
        (addr, self.and_col_mask(gb, col, valid))
    }

    /// The address of element (row, col) of a box.
    pub(super) fn box_addr(&mut self, gb: &GlobalBox, row: Src, col: Src) -> Reg {
        self.box_addr_from(gb, gb.base, row, col)
    }

    /// [`Self::box_addr`] from `base` instead of the box's own first element.
    pub(super) fn box_addr_from(&mut self, gb: &GlobalBox, base: Reg, row: Src, col: Src) -> Reg {
        let mut addr = Src::Reg(base);
        if let Some(rs) = gb.row_stride {
            addr = self.add_scaled(addr, row, Src::Reg(rs));
        }
        addr = self.add_scaled(addr, col, gb.col_stride);
        self.em.to_reg(addr, RegClass::B64, Ty::U64)
    }

    /// `valid` and, where the box's columns can pass the bound, `col` inside it.
    pub(super) fn and_col_mask(&mut self, gb: &GlobalBox, col: Src, valid: Option<Reg>) -> Option<Reg> {
        if covers(gb.col_lim, gb.extent.1) {
            return valid;
        }
        let p = self.lt(col, gb.col_lim);
        self.em.and_pred(valid, p)
    }

    /// `base + off < lim` as a predicate, computed as `base < lim - off`.
    pub(super) fn lt_minus(&mut self, base: Src, lim: Src, off: i64) -> Option<Reg> {
        let lim = match lim {
            Src::Imm(v) => Src::Imm(v - off),
            l if off == 0 => l,
            l => Src::Reg(self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, l, Src::Imm(off))),
        };
        self.lt(base, lim)
    }

    /// `x < lim` as a predicate (None when always true, folded when both are known).
    pub(super) fn lt(&mut self, x: Src, lim: Src) -> Option<Reg> {
        match (x, lim) {
            (Src::Imm(a), Src::Imm(b)) if a < b => None,
            _ => {
                let x = self.em.to_reg(x, RegClass::B32, Ty::S32);
                Some(self.em.setp(Cmp::Lt, Ty::S32, x, lim))
            }
        }
    }

    /// `addr + i * stride` in 64 bits (`i` a 32-bit non-negative value).
    pub(super) fn add_scaled(&mut self, addr: Src, i: Src, stride: Src) -> Src {
        match (i, stride) {
            (Src::Imm(0), _) => addr,
            (Src::Imm(a), Src::Imm(b)) => {
                let a64 = self.em.to_reg(addr, RegClass::B64, Ty::U64);
                Src::Reg(self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, a64, Src::Imm(a * b)))
            }
            (i, Src::Imm(b)) => {
                let w = self.em.reg(RegClass::B64);
                self.em.emit(Op::MulWide { ty: Ty::U32, d: w, a: i, b: Src::Imm(b) });
                Src::Reg(self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, addr, w))
            }
            (i, s) => {
                let i64r = self.em.reg(RegClass::B64);
                self.em.emit(Op::Cvt { dty: Ty::U64, sty: Ty::U32, d: i64r, a: i });
                let d = self.em.reg(RegClass::B64);
                self.em.emit(Op::Mad { ty: Ty::S64, d, a: Src::Reg(i64r), b: s, c: addr });
                Src::Reg(d)
            }
        }
    }

    /// Records the plan of the copy at `loc` (and prints it under `KDA_DUMP=copy_plan`).
    pub(super) fn record_plan(&mut self, loc: SrcLoc, kind: CopyKind, slower_because: Option<NoFastPath>) {
        let plan = CopyPlan { loc, kind, slower_because };
        crate::passes::dump("copy_plan", &plan);
        self.copy_plans.push(plan);
    }

    /// `copy(src, dst)` that is not a pipeline's stage fill.
    pub(crate) fn copy(&mut self, src: &Region, dst: &Region, loc: SrcLoc) -> Result<(), Diag> {
        self.copy_async(src, dst, None, loc)
    }

    /// `copy(src, dst)`; a vector global-to-shared copy uses `cp.async`. With `stage_live` (a
    /// pipeline's stage fill) it loads nothing when the predicate is false and leaves the
    /// commit to the pipeline.
    pub(crate) fn copy_async(
        &mut self,
        src: &Region,
        dst: &Region,
        stage_live: Option<Reg>,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let layout = |r: &Region| match r {
            Region::Global { .. } => None,
            Region::Buf(b) => Some(self.p.layouts[*b]),
        };
        // The global side's L2 policy goes on every instruction of the copy (the printer only
        // shows it on global accesses).
        let cache = [src, dst]
            .into_iter()
            .find_map(|r| match r {
                Region::Global { cache, .. } => Some(*cache),
                Region::Buf(_) => None,
            })
            .unwrap_or_default();
        let outer = std::mem::replace(&mut self.em.cache, cache);
        let done = self.copy_dispatch(src, dst, layout(src), layout(dst), stage_live, loc);
        self.em.cache = outer;
        done
    }

    /// `copy_async` by direction, with the copy's L2 policy already on the emitter.
    pub(super) fn copy_dispatch(
        &mut self,
        src: &Region,
        dst: &Region,
        src_layout: Option<BufLayout>,
        dst_layout: Option<BufLayout>,
        stage_live: Option<Reg>,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        match (src, dst, src_layout, dst_layout) {
            (Region::Global { .. }, Region::Buf(b), _, Some(BufLayout::Shared(_))) => {
                self.global_to_shared(src, *b, stage_live, loc)
            }
            (Region::Buf(b), Region::Global { .. }, Some(BufLayout::Shared(_)), _) => {
                self.shared_to_global(*b, dst, loc)
            }
            (Region::Global { .. }, Region::Buf(b), _, Some(BufLayout::Fragment(_))) => {
                self.global_frag(src, *b, true, loc)
            }
            (Region::Buf(b), Region::Global { .. }, Some(BufLayout::Fragment(_)), _) => {
                self.global_frag(dst, *b, false, loc)
            }
            (Region::Global { .. }, Region::Buf(b), _, Some(BufLayout::Local)) => self.global_to_local(src, *b, loc),
            (Region::Buf(s), Region::Buf(d), Some(ls), Some(ld)) => self.tile_to_tile(*s, *d, ls, ld, loc),
            (Region::Global { .. }, Region::Global { .. }, _, _) => {
                self.err(loc, "copy between two global boxes: stage it through a tile")
            }
            _ => self.err(loc, "this copy direction is not supported (local tiles are written element by element)"),
        }
    }

    /// When shared tile `sh` maps a thread's fragment slots to addresses that differ from the
    /// first slot's by constants (a row-major tile, or a one-row tile, whose swizzle is the
    /// identity), the first slot's address and the bytes per fragment row: every run then loads
    /// at a constant offset from one register. Row vectors are not handled (their slots are
    /// rows of a 2-D tile or elements of a 1-D one, and neither is reached here).
    pub(super) fn affine_base(
        &mut self,
        sh: BufId,
        l: crate::layout::FragmentLayout,
        two_d: bool,
    ) -> Option<(Reg, i64)> {
        let layout = self.p.shared(sh);
        let (rows, cols) = layout.shape();
        let row_major = matches!(layout, crate::layout::SharedLayout::RowMajor { .. });
        let kind_fits = if two_d { l.kind == FragmentKind::Tile } else { l.kind == FragmentKind::Cols };
        if !(row_major || rows == 1) || !kind_fits {
            return None;
        }
        let esize = self.def().buffers[sh].dtype.size_bytes() as i64;
        let (rb, cb) = self.frag_base(l);
        let base = if two_d {
            self.shared_addr(sh, Src::Reg(rb), Src::Reg(cb))
        } else {
            self.shared_addr(sh, Src::Imm(0), Src::Reg(cb))
        };
        Some((base, if two_d { cols as i64 * esize } else { 0 }))
    }

    pub(super) fn check_same_shape(&self, a: BufId, b: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let (x, y) = (&self.def().buffers[a], &self.def().buffers[b]);
        if x.shape != y.shape {
            return self.err(
                loc,
                format!("copy from `{}` {:?} to `{}` {:?}: shapes differ", x.name, x.shape, y.name, y.shape),
            );
        }
        Ok(())
    }

    pub(super) fn tile_to_tile(
        &mut self,
        s: BufId,
        d: BufId,
        ls: BufLayout,
        ld: BufLayout,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        self.check_same_shape(s, d, loc)?;
        let (sdt, ddt) = (self.def().buffers[s].dtype, self.def().buffers[d].dtype);
        let two_d = self.def().buffers[s].shape.len() == 2;
        match (ls, ld) {
            (BufLayout::Fragment(a), BufLayout::Fragment(b)) => {
                if a != b {
                    return self.err(
                        loc,
                        format!("fragments with different layouts ({a} and {b}): copy through a shared tile"),
                    );
                }
                for k in 0..a.slots() as usize {
                    let v = V { s: Src::Reg(self.regs[s][k]), ty: value_type(sdt) };
                    let v = self.round_for(v, ddt);
                    let r = self.regs[d][k];
                    self.mov(r, v);
                }
                Ok(())
            }
            (BufLayout::Shared(_), BufLayout::Fragment(l)) | (BufLayout::Fragment(l), BufLayout::Shared(_)) => {
                let to_frag = matches!(ld, BufLayout::Fragment(_));
                // No access is behind a branch (an owner's store has its address before the
                // branch around it): as in an element loop, each address is a thread part cached
                // for the copy plus constants (`element_addr.rs`).
                self.element_loop(|lw| lw.shared_fragment_copy(s, d, l, to_frag, two_d));
                Ok(())
            }
            (BufLayout::Shared(_), BufLayout::Shared(_)) => self.for_each_shared_elem(d, |lw, r, c| {
                let (r, c) = if two_d { (r, c) } else { (Src::Imm(0), c) };
                let a = lw.shared_addr(s, r, c);
                let v = lw.load_mem(Space::Shared, a, sdt);
                let b2 = lw.shared_addr(d, r, c);
                lw.store_mem(Space::Shared, b2, ddt, v);
                Ok(())
            }),
            (BufLayout::Shared(_), BufLayout::Local) => {
                let (_, cols) = self.tile_rc(d);
                for (i, reg) in self.regs[d].clone().into_iter().enumerate() {
                    let (r, c) = ((i as u32 / cols) as i64, (i as u32 % cols) as i64);
                    let a = self.shared_addr(s, Src::Imm(r), Src::Imm(c));
                    let v = self.load_mem(Space::Shared, a, sdt);
                    let v = self.round_for(v, ddt);
                    self.mov(reg, v);
                }
                Ok(())
            }
            (BufLayout::Local, BufLayout::Local) => {
                for k in 0..self.regs[s].len() {
                    let v = V { s: Src::Reg(self.regs[s][k]), ty: value_type(sdt) };
                    let v = self.round_for(v, ddt);
                    let r = self.regs[d][k];
                    self.mov(r, v);
                }
                Ok(())
            }
            _ => self.err(
                loc,
                "this copy direction is not supported (write local tiles to shared element by element in `parallel`)",
            ),
        }
    }

    /// A copy between shared tile and fragment `l` (`to_frag`: shared to fragment), inside an
    /// element loop.
    fn shared_fragment_copy(&mut self, s: BufId, d: BufId, l: FragmentLayout, to_frag: bool, two_d: bool) {
        let (sdt, ddt) = (self.def().buffers[s].dtype, self.def().buffers[d].dtype);
        let (sh, fr) = if to_frag { (s, d) } else { (d, s) };
        // A thread's `vec` adjacent columns start at a multiple of `vec`; accessed in runs of at
        // most 16 bytes, each run lies in one 16-byte chunk of a swizzled tile.
        let (shared_dt, frag_dt) = if to_frag { (sdt, ddt) } else { (ddt, sdt) };
        let esize = shared_dt.size_bytes() as u32;
        let run = l.vec.min(16 / esize);
        let floats = matches!(shared_dt, DType::F32 | DType::BF16 | DType::F16);
        // One aligned vector access per run: loads widen 16-bit pairs in registers, stores pack
        // them. A tile fragment holds each element once, so every thread stores its own runs
        // (vector fragments, replicated over warps, store element by element from their owners
        // below).
        if floats && run >= 2 && (l.kind == FragmentKind::Tile || (to_frag && l.kind != FragmentKind::Rows)) {
            let fast = if two_d && run == l.vec { self.swizzled_runs(sh, l) } else { None };
            let affine = if fast.is_none() { self.affine_base(sh, l, two_d) } else { None };
            let mut k = 0;
            while k < l.slots() {
                let (a, off) = match (&fast, affine) {
                    (Some(runs), _) => runs[(k / l.vec) as usize],
                    (None, Some((base, row_bytes))) => {
                        let c = l.slot_coord(k);
                        let off = c.row_off as i64 * row_bytes + (c.col_off * esize) as i64;
                        (base, off)
                    }
                    (None, None) => {
                        let (row, col) = self.frag_coords(l, k);
                        let (row, col) = if two_d { (row, col) } else { (Src::Imm(0), row) };
                        (self.shared_addr(sh, row, col), 0)
                    }
                };
                let regs: Vec<Reg> = (k..k + run).map(|j| self.regs[fr][j as usize]).collect();
                if to_frag {
                    self.run_load(Space::Shared, a, off, shared_dt, None, frag_dt, &regs);
                } else {
                    self.run_store(Space::Shared, a, off, shared_dt, None, frag_dt, &regs);
                }
                k += run;
            }
            return;
        }
        // Replicated vector elements are written to shared once, by their owners.
        let owner = if to_frag { None } else { self.vector_owner(l) };
        for k in 0..l.slots() {
            let (row, col) = self.frag_coords(l, k);
            let (row, col) = if two_d { (row, col) } else { (Src::Imm(0), row) };
            let a = self.shared_addr(sh, row, col);
            let fr_reg = self.regs[fr][k as usize];
            if to_frag {
                let v = self.load_mem(Space::Shared, a, sdt);
                let v = self.round_for(v, ddt);
                self.mov(fr_reg, v);
            } else {
                let skip = self.em.label();
                if let Some(p) = owner {
                    self.em.emit_if(p, false, Op::Bra { target: skip });
                }
                self.store_mem(Space::Shared, a, ddt, V { s: Src::Reg(fr_reg), ty: value_type(sdt) });
                self.em.emit(Op::Label(skip));
            }
        }
    }
}
