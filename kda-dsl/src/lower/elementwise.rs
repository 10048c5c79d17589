//! Lowering of element-wise work: `fill`, `parallel` bodies (element reads and stores at the
//! loop's own index), local tiles, and `print`.

use super::element_addr::bits_below;
use super::{class_of, ty_of, ElemCtx, Lower, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::FragmentKind;
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    pub(crate) fn fill(&mut self, b: BufId, e: &Expr, loc: SrcLoc) -> Result<(), Diag> {
        let dt = self.def().buffers[b].dtype;
        let v = self.expr(e, crate::passes::check_types::value_type(dt), loc)?;
        match self.p.layouts[b] {
            BufLayout::Fragment(_) | BufLayout::Local => {
                for r in self.regs[b].clone() {
                    self.mov(r, v);
                }
                Ok(())
            }
            BufLayout::Shared(_) => self.for_each_shared_elem(b, |lw, row, col| {
                let a = lw.shared_addr(b, row, col);
                lw.store_mem(Space::Shared, a, dt, v);
                Ok(())
            }),
            BufLayout::Unknown => unreachable!(),
        }
    }

    /// Whether the threads cover shared tile `b` in whole rows, each pass all of them: no
    /// element of [`Lower::for_each_shared_elem`] is then behind a bounds branch.
    fn whole_passes(&self, b: BufId) -> bool {
        let (rows, cols) = self.p.shared(b).shape();
        let threads = self.scope.threads;
        threads.is_multiple_of(cols) && (rows * cols).is_multiple_of(threads)
    }

    /// Runs `f(row, col)` for each element of shared tile `b` this thread owns (cyclic over threads).
    pub(crate) fn for_each_shared_elem(
        &mut self,
        b: BufId,
        mut f: impl FnMut(&mut Self, Src, Src) -> Result<(), Diag>,
    ) -> Result<(), Diag> {
        let (rows, cols) = self.p.shared(b).shape();
        let n = rows * cols;
        let threads = self.scope.threads;
        if self.whole_passes(b) {
            // Every pass covers whole rows: pass k is pass 0 moved down k * threads / cols rows.
            let row0 = self.em.op32(BinKind::Div, self.scope.th.tid, cols as i64);
            let col0 = self.em.op32(BinKind::Rem, self.scope.th.tid, cols as i64);
            return self.element_loop(|lw| {
                let row0 = lw.em.to_reg(row0, RegClass::B32, Ty::U32);
                let col0 = lw.em.to_reg(col0, RegClass::B32, Ty::U32);
                let col = lw.split_index(col0, bits_below(cols), 0);
                for k in 0..n / threads {
                    let row = lw.split_index(row0, bits_below(threads / cols), k * (threads / cols));
                    f(lw, row, col)?;
                }
                Ok(())
            });
        }
        for k in 0..n.div_ceil(threads) {
            let e = self.em.add32(self.scope.th.tid, Src::Imm((k * threads) as i64));
            let skip = if (k + 1) * threads > n {
                let p = self.em.setp(Cmp::Ge, Ty::S32, e, Src::Imm(n as i64));
                let l = self.em.label();
                self.em.emit_if(p, true, Op::Bra { target: l });
                Some(l)
            } else {
                None
            };
            let row = self.em.op32(BinKind::Div, e, cols as i64);
            let col = self.em.op32(BinKind::Rem, e, cols as i64);
            // Past the bounds branch `e < n`, so the row is below `rows` as the column is below
            // `cols`: both are split indices (with no constant part), whose shared addresses
            // then split into a thread part cached for this pass and a constant
            // (`element_addr.rs`), as in whole passes.
            self.element_loop(|lw| {
                let row = lw.em.to_reg(row, RegClass::B32, Ty::U32);
                let col = lw.em.to_reg(col, RegClass::B32, Ty::U32);
                let row = lw.split_index(row, bits_below(rows), 0);
                let col = lw.split_index(col, bits_below(cols), 0);
                f(lw, row, col)
            })?;
            if let Some(l) = skip {
                self.em.emit(Op::Label(l));
            }
        }
        Ok(())
    }

    pub(crate) fn parallel(&mut self, over: BufId, vars: &[VarId], body: &[Stmt], loc: SrcLoc) -> Result<(), Diag> {
        if self.elem.is_some() {
            return self.err(loc, "`parallel` loops do not nest");
        }
        let held = super::deferred_stores::deferrable_tiles(self.p, body);
        match self.p.layouts[over] {
            BufLayout::Fragment(l) => self.element_loop(|lw| {
                (lw.matrix_read_regs, lw.matrix_store_regs) = lw.matrix_accesses(over, l, vars, body);
                let r = lw.with_deferred_stores(held, |lw| {
                    for s in 0..l.slots() {
                        let (row, col) = lw.frag_coords(l, s);
                        lw.bind_index(vars, &[row, col]);
                        lw.elem = Some(ElemCtx { over, slot: s, vars: [vars.first().copied(), vars.get(1).copied()] });
                        let r = lw.block(body);
                        lw.elem = None;
                        r?;
                    }
                    Ok(())
                });
                lw.matrix_read_regs.clear();
                let stores = std::mem::take(&mut lw.matrix_store_regs);
                r?;
                lw.matrix_stores(l, stores);
                Ok(())
            }),
            BufLayout::Local => {
                let shape = self.def().buffers[over].shape.clone();
                let cols = *shape.last().unwrap_or(&1);
                for e in 0..shape.iter().product::<u32>() {
                    let idx =
                        if shape.len() == 2 { vec![(e / cols) as i64, (e % cols) as i64] } else { vec![e as i64] };
                    for (v, i) in vars.iter().zip(idx) {
                        self.consts.insert(*v, i);
                    }
                    self.block(body)?;
                }
                Ok(())
            }
            BufLayout::Shared(_) => {
                let two_d = self.def().buffers[over].shape.len() == 2;
                // Only where no element sits behind a bounds branch.
                let held = if self.whole_passes(over) { held } else { Default::default() };
                self.with_deferred_stores(held, |lw| {
                    lw.for_each_shared_elem(over, |lw, row, col| {
                        let idx = if two_d { [row, col] } else { [col, Src::Imm(0)] };
                        lw.bind_index(vars, &idx);
                        lw.block(body)
                    })
                })
            }
            BufLayout::Unknown => unreachable!(),
        }
    }

    fn bind_index(&mut self, vars: &[VarId], idx: &[Src]) {
        for (v, i) in vars.iter().zip(idx) {
            match i {
                Src::Imm(c) => {
                    self.consts.insert(*v, *c);
                    self.var_regs.remove(v);
                }
                s => {
                    self.consts.remove(v);
                    let r = self.em.to_reg(*s, RegClass::B32, Ty::U32);
                    self.var_regs.insert(*v, r);
                }
            }
        }
    }

    /// The register of fragment `b` at `idx` from inside a `parallel` body, if `idx` is the loop's own index.
    pub(crate) fn frag_elem_reg(&self, b: BufId, idx: &[Expr], loc: SrcLoc) -> Result<Reg, Diag> {
        let name = &self.def().buffers[b].name;
        let Some(ctx) = self.elem else {
            return self.err(loc, format!("fragment `{name}` elements are reachable only inside `parallel`"));
        };
        let vars: Vec<VarId> = ctx.vars.iter().flatten().copied().collect();
        let lo = self.p.frag(ctx.over);
        let lb = self.p.frag(b);
        let same = |e: &Expr, k: usize| vars.get(k).is_some_and(|v| *e == Expr::Var(*v));
        let slot = if b == ctx.over
            || (lb == lo && idx.len() == vars.len() && idx.iter().enumerate().all(|(k, e)| same(e, k)))
        {
            Some(ctx.slot)
        } else if lo.kind == FragmentKind::Tile
            && idx.len() == 1
            && lb == lo.vector(FragmentKind::Rows)
            && same(&idx[0], 0)
        {
            Some(lo.row_slot_of(ctx.slot))
        } else if lo.kind == FragmentKind::Tile
            && idx.len() == 1
            && lb == lo.vector(FragmentKind::Cols)
            && same(&idx[0], 1)
        {
            Some(lo.col_slot_of(ctx.slot))
        } else {
            None
        };
        match slot {
            Some(s) => Ok(self.regs[b][s as usize]),
            None => self.err(
                loc,
                format!("fragment `{name}` can be indexed only at the `parallel` loop's own index (or a row/column vector at its row/column); copy it to a shared tile for other access"),
            ),
        }
    }

    pub(crate) fn store(&mut self, b: BufId, idx: &[Expr], e: &Expr, loc: SrcLoc) -> Result<(), Diag> {
        let dt = self.def().buffers[b].dtype;
        let vt = crate::passes::check_types::value_type(dt);
        let v = self.expr(e, vt, loc)?;
        match self.p.layouts[b] {
            BufLayout::Fragment(_) => {
                let r = self.frag_elem_reg(b, idx, loc)?;
                let v = self.round_for(v, dt);
                self.mov(r, v);
            }
            BufLayout::Local => {
                let i = self.local_index(b, idx, loc)?;
                let r = self.regs[b][i];
                let v = self.round_for(v, dt);
                self.mov(r, v);
            }
            BufLayout::Shared(_) => {
                // The store rounds to the element type itself: rounding first would convert
                // twice (ptxas keeps both).
                if self.store_elem_of_block(b, idx, v) {
                    return Ok(());
                }
                let (row, col) = self.shared_rc(idx, loc)?;
                let a = self.shared_addr(b, row, col);
                if !self.defer_store(b, a, dt, v) {
                    self.store_mem(Space::Shared, a, dt, v);
                }
            }
            BufLayout::Unknown => unreachable!(),
        }
        Ok(())
    }

    /// Rounds `v` to 16 bits when a register tile of element type `dt` keeps it.
    pub(crate) fn round_for(&mut self, v: V, dt: DType) -> V {
        if !dt.is_half() {
            return v;
        }
        let h = self.round_to_half(v, dt);
        let f = self.em.reg(RegClass::F32);
        let sty = if dt == DType::BF16 { Ty::BF16 } else { Ty::F16 };
        self.em.emit(Op::Cvt { dty: Ty::F32, sty, d: f, a: Src::Reg(h) });
        V { s: Src::Reg(f), ty: DType::F32 }
    }

    pub(crate) fn local_index(&mut self, b: BufId, idx: &[Expr], loc: SrcLoc) -> Result<usize, Diag> {
        let shape = self.def().buffers[b].shape.clone();
        let mut lin = 0i64;
        for (k, e) in idx.iter().enumerate() {
            let Some(i) = self.const_of(e) else {
                return self.err(
                    loc,
                    format!(
                        "local tile `{}` needs indices known when lowering (use `unroll` loops)",
                        self.def().buffers[b].name
                    ),
                );
            };
            if i < 0 || i >= shape[k] as i64 {
                return self.err(
                    loc,
                    format!("index {i} is outside local tile `{}` of extent {}", self.def().buffers[b].name, shape[k]),
                );
            }
            lin = lin * shape[k] as i64 + i;
        }
        Ok(lin as usize)
    }

    pub(crate) fn shared_rc(&mut self, idx: &[Expr], loc: SrcLoc) -> Result<(Src, Src), Diag> {
        let mut v = vec![];
        for e in idx {
            v.push(self.expr(e, DType::I32, loc)?.s);
        }
        Ok(if v.len() == 2 { (v[0], v[1]) } else { (Src::Imm(0), v[0]) })
    }

    pub(crate) fn print(&mut self, b: BufId) -> Result<(), Diag> {
        let buf = self.def().buffers[b].clone();
        let cols = *buf.shape.last().unwrap_or(&1) as i64;
        let mut elems = vec![];
        match self.p.layouts[b] {
            BufLayout::Fragment(l) => {
                for s in 0..l.slots() {
                    let (row, col) = self.frag_coords(l, s);
                    let flat = if buf.shape.len() == 2 {
                        let rc = self.em.mul32(row, Src::Imm(cols));
                        self.em.add32(rc, col)
                    } else {
                        row
                    };
                    elems.push((flat, self.regs[b][s as usize]));
                }
            }
            BufLayout::Local => {
                // Every thread holds the whole tile; the simulator shows the first holder's.
                for (i, r) in self.regs[b].clone().into_iter().enumerate() {
                    elems.push((Src::Imm(i as i64), r));
                }
            }
            BufLayout::Shared(_) => {
                let two_d = buf.shape.len() == 2;
                let mut collected = vec![];
                self.for_each_shared_elem(b, |lw, row, col| {
                    let (r, c) = if two_d { (row, col) } else { (Src::Imm(0), col) };
                    let a = lw.shared_addr(b, r, c);
                    let v = lw.load_mem(Space::Shared, a, buf.dtype);
                    let vr = lw.em.to_reg(v.s, class_of(v.ty), ty_of(v.ty));
                    let rc = lw.em.mul32(r, Src::Imm(cols));
                    let flat = lw.em.add32(rc, c);
                    collected.push((flat, vr));
                    Ok(())
                })?;
                elems = collected;
            }
            BufLayout::Unknown => unreachable!(),
        }
        self.em.emit(Op::Trace { name: buf.name.clone(), shape: buf.shape.clone(), elems });
        Ok(())
    }
}
