//! Moving, loading and storing one element: the conversions between a value's register and
//! its memory type that every lowering shares.

use super::{class_of, mem_ty, Lower, V};
use crate::dtype::DType;
use crate::thread_ir::*;

impl Lower<'_> {
    /// Moves `v` into `d` (converting as `d`'s class needs).
    pub(crate) fn mov(&mut self, d: Reg, v: V) {
        // `d` changes: nothing cached may stand for its old value.
        self.forget_cached(d);
        let ty = match d.class {
            RegClass::Pred => Ty::Pred,
            RegClass::B64 => Ty::B64,
            RegClass::F32 => Ty::F32,
            RegClass::B16 => Ty::B16,
            RegClass::B32 => Ty::B32,
        };
        let a = match (v.s, d.class) {
            (Src::Imm(x), RegClass::F32) => Src::F32(x as f32),
            (s, _) => s,
        };
        if d.class == RegClass::Pred {
            if let Src::Imm(x) = a {
                // setp gives a predicate from a constant.
                let r = self.em.to_reg(Src::Imm(x), RegClass::B32, Ty::S32);
                self.em.emit(Op::Setp { cmp: Cmp::Ne, ty: Ty::S32, d, a: Src::Reg(r), b: Src::Imm(0) });
                return;
            }
        }
        if a != Src::Reg(d) {
            self.em.emit(Op::Mov { ty, d, a });
        }
    }

    /// Loads one element of memory type `dt` at `addr` as a value.
    pub(crate) fn load_mem(&mut self, space: Space, addr: Reg, dt: DType) -> V {
        self.load_mem_at(space, addr, 0, dt, None)
    }

    /// Loads one element at `addr + offset`; with a guard, only where it holds (else 0).
    pub(crate) fn load_mem_at(&mut self, space: Space, addr: Reg, offset: i64, dt: DType, guard: Option<Reg>) -> V {
        let raw = self.load_raw_at(space, addr, offset, dt, guard);
        self.widen(raw, dt)
    }

    /// Loads one element of `dt` at `addr + offset` as its bits (16-bit types in a `b16`
    /// register); with a guard, 0 where it does not hold.
    pub(crate) fn load_raw_at(&mut self, space: Space, addr: Reg, offset: i64, dt: DType, guard: Option<Reg>) -> Reg {
        let (d, ty) = match dt {
            DType::F16 | DType::BF16 => (self.em.reg(RegClass::B16), Ty::B16),
            _ => (self.em.reg(class_of(dt)), mem_ty(dt)),
        };
        let op = Op::Ld { space, ty, d: vec![d], addr, offset };
        match guard {
            Some(p) => {
                let zero = if d.class == RegClass::F32 { Src::F32(0.0) } else { Src::Imm(0) };
                self.em.emit(Op::Mov { ty: if d.class == RegClass::B16 { Ty::B16 } else { ty }, d, a: zero });
                self.em.emit_if(p, true, op)
            }
            None => self.em.emit(op),
        }
        d
    }

    /// The value of an element of `dt` loaded as its bits (`load_raw_at`): 16-bit types widen
    /// to f32.
    pub(crate) fn widen(&mut self, raw: Reg, dt: DType) -> V {
        let vt = crate::passes::check_types::value_type(dt);
        match dt {
            DType::F16 | DType::BF16 => {
                let f = self.em.reg(RegClass::F32);
                let sty = if dt == DType::BF16 { Ty::BF16 } else { Ty::F16 };
                self.em.emit(Op::Cvt { dty: Ty::F32, sty, d: f, a: Src::Reg(raw) });
                V { s: Src::Reg(f), ty: vt }
            }
            _ => V { s: Src::Reg(raw), ty: vt },
        }
    }

    /// The two 16-bit elements of `dt` (bf16 or f16) packed in `word`, the lower half first,
    /// widened to f32 into `lo` and `hi`. bf16 is the upper half of an f32: a shift and a mask
    /// widen a packed pair; f16 unpacks and converts.
    pub(crate) fn widen_pair_into(&mut self, word: Reg, dt: DType, lo: Reg, hi: Reg) {
        if dt == DType::BF16 {
            self.em.emit(Op::Bin { op: BinKind::Shl, ty: Ty::B32, d: lo, a: Src::Reg(word), b: Src::Imm(16) });
            let mask = Src::Imm(0xffff_0000);
            self.em.emit(Op::Bin { op: BinKind::And, ty: Ty::B32, d: hi, a: Src::Reg(word), b: mask });
        } else {
            let (l, h) = (self.em.reg(RegClass::B16), self.em.reg(RegClass::B16));
            self.em.emit(Op::Unpack2 { lo: l, hi: h, a: word });
            self.em.emit(Op::Cvt { dty: Ty::F32, sty: Ty::F16, d: lo, a: Src::Reg(l) });
            self.em.emit(Op::Cvt { dty: Ty::F32, sty: Ty::F16, d: hi, a: Src::Reg(h) });
        }
    }

    /// Rounds a value to 16 bits for storing as `dt`.
    pub(crate) fn round_to_half(&mut self, v: V, dt: DType) -> Reg {
        let h = self.em.reg(RegClass::B16);
        let dty = if dt == DType::BF16 { Ty::BF16 } else { Ty::F16 };
        let a = match v.s {
            Src::Imm(x) => Src::F32(x as f32),
            s => s,
        };
        self.em.emit(Op::Cvt { dty, sty: Ty::F32, d: h, a });
        h
    }

    /// Stores a value as one element of memory type `dt`.
    pub(crate) fn store_mem(&mut self, space: Space, addr: Reg, dt: DType, v: V) {
        self.store_mem_at(space, addr, 0, dt, v, None)
    }

    /// Stores one element at `addr + offset`; with a guard, only where it holds.
    pub(crate) fn store_mem_at(&mut self, space: Space, addr: Reg, offset: i64, dt: DType, v: V, guard: Option<Reg>) {
        let val = match dt {
            DType::F16 | DType::BF16 => Src::Reg(self.round_to_half(v, dt)),
            DType::F32 => match v.s {
                Src::Imm(x) => Src::F32(x as f32),
                s => s,
            },
            _ => v.s,
        };
        self.store_bits_at(space, addr, offset, dt, val, guard);
    }

    /// Stores one element's bits (already in `dt`'s memory form) at `addr + offset`; with a
    /// guard, only where it holds.
    pub(crate) fn store_bits_at(
        &mut self,
        space: Space,
        addr: Reg,
        offset: i64,
        dt: DType,
        val: Src,
        guard: Option<Reg>,
    ) {
        let op = Op::St { space, ty: mem_ty(dt), addr, offset, vals: vec![val] };
        match guard {
            Some(p) => self.em.emit_if(p, true, op),
            None => self.em.emit(op),
        }
    }
}
