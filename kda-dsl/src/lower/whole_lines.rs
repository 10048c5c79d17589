//! Whole-line fragment stores (`.whole_lines()`): a warp writes four rows' whole 128-byte lines
//! per store instruction instead of half lines of eight rows.
//!
//! In a tile fragment with 4 lanes per row, a row is spread over four lanes (`t`), 16 bytes each
//! per 16-column group, so one `st.global.v4` covers 64 bytes of each of eight rows (`g`). Row
//! groups `g` and `g ^ 1` (lanes `l` and `l ^ 4`) trade one of every two such groups through a
//! `shfl`; then for each row of the pair in turn, the even group stores the lower 64 bytes of a
//! line and the odd group the upper 64, so each instruction writes four whole lines. Same bytes,
//! half the line requests; a write-heavy decode (several tokens per sequence) measured faster
//! with it. (With 32 lanes per row, plain stores already write whole lines.)

use super::copy::{covers, GlobalBox};
use super::copy_plan::NoFastPath;
use super::Lower;
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::thread_ir::*;
use std::collections::HashMap;

impl Lower<'_> {
    /// Why fragment `l` cannot be stored into `gb` as whole lines, if it cannot (`run`:
    /// adjacent columns per access).
    pub(super) fn whole_line_obstacle(&self, gb: &GlobalBox, l: FragmentLayout, run: u32) -> Option<NoFastPath> {
        if l.kind != FragmentKind::Tile {
            return Some(NoFastPath::WholeLinesNeedATile);
        }
        if l.lanes_per_row != 4 {
            return Some(NoFastPath::RowsAlreadyAcrossTheWarp);
        }
        if gb.dtype != DType::F32 || l.vec != 4 || run != 4 || gb.col_stride != Src::Imm(4) {
            return Some(NoFastPath::WholeLinesNeedF32Vectors);
        }
        if gb.row_stride.is_none() {
            return Some(NoFastPath::OneRow);
        }
        if !l.ni().is_multiple_of(2) {
            return Some(NoFastPath::OddColumnGroups);
        }
        // Partner lanes store each other's rows: a mask per row would have to travel too.
        if gb.row_lim.is_some_and(|lim| !covers(lim, gb.extent.0)) || !covers(gb.col_lim, gb.extent.1) {
            return Some(NoFastPath::Masked);
        }
        None
    }

    /// Stores fragment registers `regs` (layout `l`) into `gb` as whole lines; `thread_addr` is
    /// this lane's address of its first slot, `valid` a block-uniform store predicate.
    pub(super) fn store_whole_lines(
        &mut self,
        gb: &GlobalBox,
        l: FragmentLayout,
        regs: &[Reg],
        thread_addr: Reg,
        valid: Option<Reg>,
    ) {
        let rs = gb.row_stride.expect("whole_line_obstacle: a 2-D box");
        let odd_bit = self.em.op32(BinKind::And, self.scope.th.g, 1);
        let odd_bit = self.em.to_reg(odd_bit, RegClass::B32, Ty::U32);
        let odd = self.em.setp(Cmp::Ne, Ty::U32, odd_bit, Src::Imm(0));
        // An odd row group stores into the row above it, 64 bytes in.
        let odd64 = self.em.reg(RegClass::B64);
        self.em.emit(Op::Cvt { dty: Ty::U64, sty: Ty::U32, d: odd64, a: Src::Reg(odd_bit) });
        let up = self.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, odd64, rs);
        let over = self.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, odd64, Src::Imm(64));
        let pair = self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, thread_addr, over);
        let pair = self.em.bin(BinKind::Sub, Ty::S64, RegClass::B64, pair, up);
        let mut row_addr: HashMap<u32, Reg> = HashMap::new();
        let mut at_row = |lw: &mut Self, k: u32| {
            *row_addr.entry(k).or_insert_with(|| {
                if k == 0 {
                    return pair;
                }
                let step = match k {
                    1 => rs,
                    _ => lw.em.bin(BinKind::Mul, Ty::S64, RegClass::B64, rs, Src::Imm(k as i64)),
                };
                lw.em.bin(BinKind::Add, Ty::S64, RegClass::B64, pair, step)
            })
        };
        // The first slot of each (row offset, 16-column group).
        let mut slot_of: HashMap<(u32, u32), usize> = HashMap::new();
        for s in (0..l.slots()).step_by(4) {
            let c = l.slot_coord(s);
            slot_of.insert((c.row_off, c.col_off / 16), s as usize);
        }
        let mut row_offs: Vec<u32> = slot_of.keys().map(|k| k.0).collect();
        row_offs.sort_unstable();
        row_offs.dedup();
        let pick = |lw: &mut Self, if_odd: Reg, if_even: Reg| {
            let d = lw.em.reg(RegClass::F32);
            lw.em.emit(Op::Selp { ty: Ty::F32, d, a: Src::Reg(if_odd), b: Src::Reg(if_even), p: odd });
            d
        };
        for r in row_offs {
            for m in 0..l.ni() / 2 {
                let (sa, sb) = (slot_of[&(r, 2 * m)], slot_of[&(r, 2 * m + 1)]);
                let (lo, hi) = (&regs[sa..sa + 4], &regs[sb..sb + 4]);
                // Each lane sends what its partner stores: an even group its upper half line,
                // an odd group its lower one.
                let got: Vec<Reg> = (0..4)
                    .map(|k| {
                        let send = pick(self, lo[k], hi[k]);
                        let d = self.em.reg(RegClass::F32);
                        self.em.emit(Op::Shfl { mode: ShflMode::Bfly, d, a: send, b: Src::Imm(4), c: 31 });
                        d
                    })
                    .collect();
                let first: Vec<Reg> = (0..4).map(|k| pick(self, got[k], lo[k])).collect();
                let second: Vec<Reg> = (0..4).map(|k| pick(self, hi[k], got[k])).collect();
                for (row, vals) in [(r, first), (r + 1, second)] {
                    let addr = at_row(self, row);
                    self.run_store(Space::Global, addr, 128 * m as i64, DType::F32, valid, DType::F32, &vals);
                }
            }
        }
    }
}
