//! Copies between global boxes and register fragments (and local tiles): runs of adjacent
//! elements per access as wide as alignment allows, whole 128-byte lines where the plan allows.

use super::copy::SlotAddressing;
use super::copy_plan::{CopyKind, NoFastPath};
use super::Lower;
use super::V;
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::FragmentKind;
use crate::passes::check_types::value_type;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    /// Global box to fragment (`load`) or fragment to global box.
    pub(super) fn global_frag(&mut self, r: &Region, b: BufId, load: bool, loc: SrcLoc) -> Result<(), Diag> {
        let gb = self.global_box(r, b, loc)?;
        let l = self.p.frag(b);
        let dt = self.def().buffers[b].dtype;
        // A tile or column vector holds `vec` adjacent columns in consecutive slots: one access
        // covers as many as alignment allows, at most 16 bytes (4 f32 or 8 bf16).
        let floats = matches!(gb.dtype, DType::F32 | DType::BF16 | DType::F16);
        let widest = l.vec.min(16 / gb.dtype.size_bytes() as u32);
        let run = if l.kind == FragmentKind::Rows || !floats { 1 } else { widest.min(gb.run_align) };
        let reason = match (l.kind, run) {
            (FragmentKind::Rows, _) => Some(NoFastPath::RowVector),
            (_, r) if r < widest => {
                Some(NoFastPath::NarrowRuns { run: r, widest, limit: gb.no_pair.clone().map(Box::new) })
            }
            _ => None,
        };
        let two_d = self.def().buffers[b].shape.len() == 2;
        if two_d != (l.kind == FragmentKind::Tile) {
            return self.err(loc, "a vector fragment is 1-D and a tile fragment 2-D");
        }
        // The plan: whole lines for a store that asks for them and can take them, runs of
        // `run` elements otherwise; the whole-line obstacle is then the reason it is not faster.
        let (kind, reason) = match (load || !gb.whole_lines, self.whole_line_obstacle(&gb, l, run)) {
            (false, None) => (CopyKind::WholeLines, None),
            (false, why) => (CopyKind::FragmentRuns { elems: run }, reason.or(why)),
            (true, _) => (CopyKind::FragmentRuns { elems: run }, reason),
        };
        self.record_plan(loc, kind, reason);
        // Replicated vector elements are stored once, by their owner lanes.
        let owner = if load { None } else { self.vector_owner(l) };
        let mut at = SlotAddressing::new(self, &gb, l, owner);
        match kind {
            CopyKind::WholeLines => {
                let regs = self.regs[b].clone();
                self.store_whole_lines(&gb, l, &regs, at.thread_addr, at.base_valid);
            }
            _ => {
                let mut s = 0;
                while s < l.slots() {
                    let (addr, offset, valid) = at.slot(self, &gb, l, s);
                    let regs: Vec<Reg> = (s..s + run).map(|k| self.regs[b][k as usize]).collect();
                    if load {
                        self.run_load(Space::Global, addr, offset, gb.dtype, valid, dt, &regs);
                    } else {
                        self.run_store(Space::Global, addr, offset, gb.dtype, valid, dt, &regs);
                    }
                    s += run;
                }
            }
        }
        Ok(())
    }

    /// `dst.len()` adjacent elements at `addr + offset` in `space` into `dst` (0 where `valid`
    /// is false), rounded for a `dt` tile: one vector load.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_load(
        &mut self,
        space: Space,
        addr: Reg,
        offset: i64,
        src: DType,
        valid: Option<Reg>,
        dt: DType,
        dst: &[Reg],
    ) {
        if dst.len() == 1 {
            // Shared runs are at least two elements (`tile_to_tile`).
            debug_assert_eq!(space, Space::Global, "a one-element run from shared memory");
            let v = self.masked_load(addr, offset, src, valid);
            let v = self.round_for(v, dt);
            self.mov(dst[0], v);
            return;
        }
        let n = dst.len();
        let guarded = |lw: &mut Self, op: Op| match valid {
            Some(p) => lw.em.emit_if(p, true, op),
            None => lw.em.emit(op),
        };
        let vals: Vec<Reg> = (0..n).map(|_| self.em.reg(RegClass::F32)).collect();
        if src == DType::F32 {
            if valid.is_some() {
                for v in &vals {
                    self.em.emit(Op::Mov { ty: Ty::F32, d: *v, a: Src::F32(0.0) });
                }
            }
            guarded(self, Op::Ld { space, ty: Ty::F32, d: vals.clone(), addr, offset });
        } else {
            let words: Vec<Reg> = (0..n / 2).map(|_| self.em.reg(RegClass::B32)).collect();
            if valid.is_some() {
                for w in &words {
                    self.em.emit(Op::Mov { ty: Ty::B32, d: *w, a: Src::Imm(0) });
                }
            }
            guarded(self, Op::Ld { space, ty: Ty::B32, d: words.clone(), addr, offset });
            for (k, w) in words.iter().enumerate() {
                self.widen_pair_into(*w, src, vals[2 * k], vals[2 * k + 1]);
            }
        }
        for (v, d) in vals.into_iter().zip(dst) {
            let v = self.round_for(V { s: Src::Reg(v), ty: DType::F32 }, dt);
            self.mov(*d, v);
        }
    }

    /// `src.len()` adjacent elements of a `dt` tile to `addr + offset` in `space` (skipped
    /// where `valid` is false): one vector store, 16-bit types packed in pairs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_store(
        &mut self,
        space: Space,
        addr: Reg,
        offset: i64,
        to: DType,
        valid: Option<Reg>,
        dt: DType,
        src: &[Reg],
    ) {
        if src.len() == 1 {
            debug_assert_eq!(space, Space::Global, "a one-element run into shared memory");
            let v = V { s: Src::Reg(src[0]), ty: value_type(dt) };
            self.masked_store(addr, offset, to, v, valid);
            return;
        }
        let (ty, vals) = if to == DType::F32 {
            (Ty::F32, src.iter().map(|r| Src::Reg(*r)).collect::<Vec<_>>())
        } else {
            let half = if to == DType::BF16 { Ty::BF16 } else { Ty::F16 };
            let mut words = vec![];
            for p in src.chunks(2) {
                let d = self.em.reg(RegClass::B32);
                self.em.emit(Op::PackHalf2 { half, d, hi: Src::Reg(p[1]), lo: Src::Reg(p[0]) });
                words.push(Src::Reg(d));
            }
            (Ty::B32, words)
        };
        let op = Op::St { space, ty, addr, offset, vals };
        match valid {
            Some(p) => self.em.emit_if(p, true, op),
            None => self.em.emit(op),
        }
    }

    pub(super) fn global_to_local(&mut self, r: &Region, b: BufId, loc: SrcLoc) -> Result<(), Diag> {
        let gb = self.global_box(r, b, loc)?;
        let (_, cols) = self.tile_rc(b);
        let dt = self.def().buffers[b].dtype;
        for (i, reg) in self.regs[b].clone().into_iter().enumerate() {
            let (row, col) = ((i as u32 / cols) as i64, (i as u32 % cols) as i64);
            let (addr, valid) = self.box_elem(&gb, Src::Imm(row), Src::Imm(col));
            let v = self.masked_load(addr, 0, gb.dtype, valid);
            let v = self.round_for(v, dt);
            self.mov(reg, v);
        }
        Ok(())
    }
}
