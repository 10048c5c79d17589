//! The instruction emitter: fresh registers per class, labels, and the current kernel line.

use crate::diag::SrcLoc;
use crate::thread_ir::*;

/// Appends instructions and hands out registers and labels.
#[derive(Default)]
pub struct Emitter {
    /// Instructions so far.
    pub body: Vec<Inst>,
    /// Next free register per class.
    pub counts: [u32; 5],
    /// The kernel line new instructions are attributed to.
    pub loc: SrcLoc,
    /// The predicate every new instruction runs under, inside an `if` lowered without a branch
    /// (`Lower::if_converted`); `None` outside one.
    pub guard: Option<Reg>,
    /// The L2 policy stamped on new instructions (a copy of a `.streaming()` box sets it).
    pub cache: CachePolicy,
    labels: u32,
}

fn class_index(c: RegClass) -> usize {
    RegClass::ALL.iter().position(|x| *x == c).unwrap_or(0)
}

impl Emitter {
    /// An empty emitter attributing instructions to `loc`.
    pub fn new(loc: SrcLoc) -> Emitter {
        Emitter { loc, ..Default::default() }
    }

    /// A fresh register.
    pub fn reg(&mut self, class: RegClass) -> Reg {
        let i = class_index(class);
        let id = self.counts[i];
        self.counts[i] += 1;
        Reg { class, id }
    }

    /// A fresh label number.
    pub fn label(&mut self) -> u32 {
        self.labels += 1;
        self.labels - 1
    }

    /// Appends `op` (under the current guard, if any).
    pub fn emit(&mut self, op: Op) {
        self.push(op, self.guard.map(|g| (g, true)));
    }

    /// Appends `op` under `guard` exactly, at the current line and L2 policy.
    fn push(&mut self, op: Op, guard: Option<(Reg, bool)>) {
        self.body.push(Inst { op, guard, loc: self.loc, cache: self.cache });
    }

    /// Appends `op` guarded by `@p` (`pos`) or `@!p`; under a current guard `g`, by `g && p`
    /// (or `g && !p`).
    pub fn emit_if(&mut self, p: Reg, pos: bool, op: Op) {
        let guard = match self.guard {
            None => (p, pos),
            Some(g) => {
                let both = self.and_unguarded(g, p);
                (if pos { both } else { self.xor_unguarded(g, both) }, true)
            }
        };
        self.push(op, Some(guard));
    }

    /// `a && b` as an unguarded instruction. `a` comes first: where it is false, `b` may be
    /// a register only written under `a` (the simulator reads `b` only when `a` holds).
    pub fn and_unguarded(&mut self, a: Reg, b: Reg) -> Reg {
        let d = self.reg(RegClass::Pred);
        self.push(Op::PredLogic { op: BinKind::And, d, a, b }, None);
        d
    }

    /// `a != b` on predicates, as an unguarded instruction.
    pub fn xor_unguarded(&mut self, a: Reg, b: Reg) -> Reg {
        let d = self.reg(RegClass::Pred);
        self.push(Op::PredLogic { op: BinKind::Xor, d, a, b }, None);
        d
    }

    /// A copy of predicate `p` in a fresh register, as an unguarded instruction.
    pub fn copy_unguarded(&mut self, p: Reg) -> Reg {
        let d = self.reg(RegClass::Pred);
        self.push(Op::Mov { ty: Ty::Pred, d, a: Src::Reg(p) }, None);
        d
    }

    /// `!p` as unguarded instructions.
    pub fn not_unguarded(&mut self, p: Reg) -> Reg {
        let t = self.reg(RegClass::Pred);
        self.push(Op::Mov { ty: Ty::Pred, d: t, a: Src::Imm(1) }, None);
        self.xor_unguarded(p, t)
    }

    /// `d = a op b` into a fresh register of `class`.
    pub fn bin(&mut self, op: BinKind, ty: Ty, class: RegClass, a: impl Into<Src>, b: impl Into<Src>) -> Reg {
        let (mut a, mut b) = (a.into(), b.into());
        if !matches!(a, Src::Reg(_)) {
            let commutes = matches!(
                op,
                BinKind::Add | BinKind::Mul | BinKind::Min | BinKind::Max | BinKind::And | BinKind::Or | BinKind::Xor
            );
            if commutes && matches!(b, Src::Reg(_)) {
                std::mem::swap(&mut a, &mut b);
            } else {
                // PTX takes an immediate only as the last source.
                a = Src::Reg(self.to_reg(a, class, ty));
            }
        }
        let d = self.reg(class);
        self.emit(Op::Bin { op, ty, d, a, b });
        d
    }

    /// 32-bit `a + b`.
    pub fn add32(&mut self, a: impl Into<Src>, b: impl Into<Src>) -> Src {
        match (a.into(), b.into()) {
            (Src::Imm(x), Src::Imm(y)) => Src::Imm(x + y),
            (a, Src::Imm(0)) | (Src::Imm(0), a) => a,
            (a, b) => Src::Reg(self.bin(BinKind::Add, Ty::S32, RegClass::B32, a, b)),
        }
    }

    /// 32-bit `a * b`.
    pub fn mul32(&mut self, a: impl Into<Src>, b: impl Into<Src>) -> Src {
        match (a.into(), b.into()) {
            (Src::Imm(x), Src::Imm(y)) => Src::Imm(x * y),
            (_, Src::Imm(0)) | (Src::Imm(0), _) => Src::Imm(0),
            (a, Src::Imm(1)) | (Src::Imm(1), a) => a,
            (a, b) => Src::Reg(self.bin(BinKind::Mul, Ty::S32, RegClass::B32, a, b)),
        }
    }

    /// 32-bit `a op imm` folded when `a` is an immediate (shifts, and, xor, div, rem).
    pub fn op32(&mut self, op: BinKind, a: impl Into<Src>, b: i64) -> Src {
        match a.into() {
            Src::Imm(x) => Src::Imm(match op {
                BinKind::Shr => x >> b,
                BinKind::Shl => x << b,
                BinKind::And => x & b,
                BinKind::Xor => x ^ b,
                BinKind::Div => x / b,
                BinKind::Rem => x % b,
                BinKind::Add => x + b,
                BinKind::Mul => x * b,
                _ => unreachable!("op32 {op:?}"),
            }),
            // Unsigned division and remainder by a power of two are a shift and a mask.
            a if op == BinKind::Div && b == 1 => a,
            _ if op == BinKind::Rem && b == 1 => Src::Imm(0),
            a if op == BinKind::Div && b > 0 && (b as u64).is_power_of_two() => {
                Src::Reg(self.bin(BinKind::Shr, Ty::U32, RegClass::B32, a, Src::Imm(b.trailing_zeros() as i64)))
            }
            a if op == BinKind::Rem && b > 0 && (b as u64).is_power_of_two() => {
                Src::Reg(self.bin(BinKind::And, Ty::B32, RegClass::B32, a, Src::Imm(b - 1)))
            }
            a => {
                let ty = if matches!(
                    op,
                    BinKind::Shr | BinKind::Shl | BinKind::And | BinKind::Xor | BinKind::Div | BinKind::Rem
                ) {
                    Ty::U32
                } else {
                    Ty::S32
                };
                let ty = if matches!(op, BinKind::And | BinKind::Xor) { Ty::B32 } else { ty };
                let ty = if op == BinKind::Shl { Ty::B32 } else { ty };
                Src::Reg(self.bin(op, ty, RegClass::B32, a, Src::Imm(b)))
            }
        }
    }

    /// Materializes `s` in a register of `class` (moving an immediate in with `ty`).
    pub fn to_reg(&mut self, s: Src, class: RegClass, ty: Ty) -> Reg {
        match s {
            Src::Reg(r) => r,
            s => {
                let d = self.reg(class);
                self.emit(Op::Mov { ty, d, a: s });
                d
            }
        }
    }

    /// A predicate `a cmp b`.
    pub fn setp(&mut self, cmp: Cmp, ty: Ty, a: impl Into<Src>, b: impl Into<Src>) -> Reg {
        let class = match ty {
            Ty::F32 => RegClass::F32,
            Ty::S64 | Ty::U64 | Ty::B64 => RegClass::B64,
            _ => RegClass::B32,
        };
        let a = Src::Reg(self.to_reg(a.into(), class, ty));
        let d = self.reg(RegClass::Pred);
        self.emit(Op::Setp { cmp, ty, d, a, b: b.into() });
        d
    }

    /// `a && b` on predicates (either may be absent, meaning true).
    pub fn and_pred(&mut self, a: Option<Reg>, b: Option<Reg>) -> Option<Reg> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let d = self.reg(RegClass::Pred);
                self.emit(Op::PredLogic { op: BinKind::And, d, a, b });
                Some(d)
            }
            (a, None) => a,
            (None, b) => b,
        }
    }

    /// Sign-extends a 32-bit value to 64 bits.
    pub fn wide(&mut self, a: Src) -> Src {
        match a {
            Src::Imm(v) => Src::Imm(v),
            Src::Reg(r) if r.class == RegClass::B64 => Src::Reg(r),
            a => {
                let d = self.reg(RegClass::B64);
                self.emit(Op::Cvt { dty: Ty::S64, sty: Ty::S32, d, a });
                Src::Reg(d)
            }
        }
    }
}
