//! Lowering of scalar expressions, with constant folding of values known when lowering
//! (literals, `unroll` counters, element indices of local tiles).

use super::{class_of, ty_of, Lower, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::passes::check_types::{type_of, value_type};
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2: f32 = std::f32::consts::LN_2;

impl Lower<'_> {
    /// The value of `e` if it is known when lowering (integers only).
    pub(crate) fn const_of(&self, e: &Expr) -> Option<i64> {
        match e {
            Expr::Int(v, _) => Some(*v),
            Expr::Bool(b) => Some(*b as i64),
            Expr::Var(v) => self.consts.get(v).copied(),
            Expr::Select(c, a, b) => {
                if self.const_of(c)? != 0 {
                    self.const_of(a)
                } else {
                    self.const_of(b)
                }
            }
            Expr::Binary(op, a, b) => {
                let (a, b) = (self.const_of(a)?, self.const_of(b)?);
                Some(match op {
                    BinOp::Add => a.checked_add(b)?,
                    BinOp::Sub => a.checked_sub(b)?,
                    BinOp::Mul => a.checked_mul(b)?,
                    BinOp::Div => a.checked_div(b)?,
                    BinOp::Rem => a.checked_rem(b)?,
                    BinOp::Min => a.min(b),
                    BinOp::Max => a.max(b),
                    _ => return None,
                })
            }
            _ => None,
        }
    }

    /// Lowers `e` as a value of type `want` (integer literals adapt; `I32` widens to `I64`).
    pub(crate) fn expr(&mut self, e: &Expr, want: DType, loc: SrcLoc) -> Result<V, Diag> {
        if let Some(c) = self.const_of(e) {
            return Ok(match want {
                DType::F32 | DType::F16 | DType::BF16 => V { s: Src::F32(c as f32), ty: DType::F32 },
                DType::Bool => V { s: Src::Imm((c != 0) as i64), ty: DType::Bool },
                t => V { s: Src::Imm(c), ty: t },
            });
        }
        let v = self.expr_raw(e, want, loc)?;
        self.coerce(v, want, loc)
    }

    fn coerce(&mut self, v: V, want: DType, loc: SrcLoc) -> Result<V, Diag> {
        let want = value_type(want);
        if v.ty == want {
            return Ok(v);
        }
        match (v.ty, want, v.s) {
            (DType::I32, DType::I64, s) => Ok(V { s: self.em.wide(s), ty: DType::I64 }),
            (_, _, Src::Imm(c)) if want == DType::F32 => Ok(V { s: Src::F32(c as f32), ty: DType::F32 }),
            (from, to, _) => self.err(loc, format!("expected a {to} value, found {from}; convert with `as`")),
        }
    }

    fn ty(&self, e: &Expr, loc: SrcLoc) -> Result<DType, Diag> {
        Ok(type_of(&self.p.def, e, loc)?.concrete())
    }

    fn expr_raw(&mut self, e: &Expr, want: DType, loc: SrcLoc) -> Result<V, Diag> {
        Ok(match e {
            Expr::Int(v, t) => V { s: Src::Imm(*v), ty: t.unwrap_or(if want.is_int() { want } else { DType::I32 }) },
            Expr::Float(v) => V { s: Src::F32(*v as f32), ty: DType::F32 },
            Expr::Bool(b) => V { s: Src::Imm(*b as i64), ty: DType::Bool },
            Expr::Dim(p) => V { s: Src::Reg(self.dims[p]), ty: DType::I32 },
            Expr::Scalar(p) => {
                let t = match &self.def().params[*p] {
                    Param::Scalar { dtype, .. } => value_type(*dtype),
                    _ => unreachable!(),
                };
                V { s: Src::Reg(self.scalars[p]), ty: t }
            }
            Expr::Var(v) => match self.var_regs.get(v) {
                Some(r) => V { s: Src::Reg(*r), ty: self.def().vars[*v].dtype },
                None => return self.err(loc, format!("`{}` is used before it has a value", self.def().vars[*v].name)),
            },
            Expr::Load(t, idx) => {
                let addr = self.global_addr(*t, idx, loc)?;
                let dt = self.tensor_dtype(*t);
                self.load_mem(Space::Global, addr, dt)
            }
            Expr::Elem(b, idx) => self.elem_read(*b, idx, loc)?,
            Expr::Unary(op, a) => self.unary(*op, a, loc)?,
            Expr::Binary(op, a, b) => self.binary(*op, a, b, want, loc)?,
            Expr::Select(c, a, b) => {
                let ty = match (self.ty(a, loc)?, self.ty(b, loc)?) {
                    (DType::I64, _) | (_, DType::I64) => DType::I64,
                    (t, _) if t != DType::I32 => t,
                    (_, t) => {
                        if t == DType::I32 && want.is_int() {
                            want
                        } else {
                            t
                        }
                    }
                };
                let c = self.expr(c, DType::Bool, loc)?;
                let x = self.expr(a, ty, loc)?;
                let y = self.expr(b, ty, loc)?;
                match c.s {
                    Src::Imm(v) => {
                        if v != 0 {
                            x
                        } else {
                            y
                        }
                    }
                    Src::Reg(p) => {
                        let d = self.em.reg(class_of(ty));
                        if ty == DType::Bool {
                            // (p && x) || (!p && y)
                            let xr = self.em.to_reg(x.s, RegClass::Pred, Ty::Pred);
                            let yr = self.em.to_reg(y.s, RegClass::Pred, Ty::Pred);
                            self.em.emit(Op::Mov { ty: Ty::Pred, d, a: Src::Reg(yr) });
                            self.em.emit_if(p, true, Op::Mov { ty: Ty::Pred, d, a: Src::Reg(xr) });
                        } else {
                            self.em.emit(Op::Selp { ty: ty_of(ty), d, a: x.s, b: y.s, p });
                        }
                        V { s: Src::Reg(d), ty }
                    }
                    Src::F32(_) => unreachable!(),
                }
            }
            Expr::Cast(to, a) => self.cast(*to, a, loc)?,
        })
    }

    fn elem_read(&mut self, b: BufId, idx: &[Expr], loc: SrcLoc) -> Result<V, Diag> {
        let dt = self.def().buffers[b].dtype;
        let vt = value_type(dt);
        match self.p.layouts[b] {
            BufLayout::Fragment(_) => {
                let r = self.frag_elem_reg(b, idx, loc)?;
                Ok(V { s: Src::Reg(r), ty: vt })
            }
            BufLayout::Local => {
                let i = self.local_index(b, idx, loc)?;
                Ok(V { s: Src::Reg(self.regs[b][i]), ty: vt })
            }
            BufLayout::Shared(_) => {
                if let Some(f) = self.matrix_read(b, idx) {
                    return Ok(V { s: Src::Reg(f), ty: vt });
                }
                let (row, col) = self.shared_rc(idx, loc)?;
                let a = self.shared_addr(b, row, col);
                Ok(self.load_mem(Space::Shared, a, dt))
            }
            BufLayout::Unknown => unreachable!(),
        }
    }

    /// Shared tile `b`'s element at `idx` (as f32), where the `parallel` being lowered read it
    /// by `ldmatrix` (`matrix_access`): `idx` is the loop's index, or transposed.
    fn matrix_read(&self, b: BufId, idx: &[Expr]) -> Option<Reg> {
        let ctx = self.elem?;
        let [Some(i), Some(j)] = ctx.vars else { return None };
        let transposed = super::matrix_access::index_order(idx, (i, j))?;
        self.matrix_read_regs.get(&(b, transposed)).and_then(|slots| slots[ctx.slot as usize])
    }

    fn f32_reg(&mut self, s: Src) -> Reg {
        self.em.to_reg(s, RegClass::F32, Ty::F32)
    }

    fn un_f(&mut self, op: UnKind, a: Src) -> Reg {
        let d = self.em.reg(RegClass::F32);
        self.em.emit(Op::Un { op, ty: Ty::F32, d, a });
        d
    }

    fn mul_f(&mut self, a: impl Into<Src>, b: impl Into<Src>) -> Reg {
        self.em.bin(BinKind::Mul, Ty::F32, RegClass::F32, a, b)
    }

    fn exp_f(&mut self, x: Src) -> Reg {
        let s = self.mul_f(x, Src::F32(LOG2E));
        self.un_f(UnKind::Ex2, Src::Reg(s))
    }

    fn unary(&mut self, op: UnOp, a: &Expr, loc: SrcLoc) -> Result<V, Diag> {
        let ta = self.ty(a, loc)?;
        if matches!(op, UnOp::Neg | UnOp::Abs) && ta.is_int() {
            let x = self.expr(a, ta, loc)?;
            let d = self.em.reg(class_of(ta));
            let k = if op == UnOp::Neg { UnKind::Neg } else { UnKind::Abs };
            self.em.emit(Op::Un { op: k, ty: ty_of(ta), d, a: x.s });
            return Ok(V { s: Src::Reg(d), ty: ta });
        }
        if op == UnOp::Not {
            let x = self.expr(a, DType::Bool, loc)?;
            let d = self.em.reg(RegClass::Pred);
            self.em.emit(Op::Un { op: UnKind::Not, ty: Ty::Pred, d, a: x.s });
            return Ok(V { s: Src::Reg(d), ty: DType::Bool });
        }
        let x = self.expr(a, DType::F32, loc)?.s;
        let d = match op {
            UnOp::Neg => self.un_f(UnKind::Neg, x),
            UnOp::Abs => self.un_f(UnKind::Abs, x),
            UnOp::Exp => self.exp_f(x),
            UnOp::Exp2 => self.un_f(UnKind::Ex2, x),
            UnOp::Log => {
                let l = self.un_f(UnKind::Lg2, x);
                self.mul_f(l, Src::F32(LN2))
            }
            UnOp::Sigmoid => {
                // 1 / (1 + e^-x)
                let n = self.mul_f(x, Src::F32(-LOG2E));
                let e = self.un_f(UnKind::Ex2, Src::Reg(n));
                let s = self.em.bin(BinKind::Add, Ty::F32, RegClass::F32, e, Src::F32(1.0));
                self.un_f(UnKind::Rcp, Src::Reg(s))
            }
            UnOp::Softplus => {
                // x > 20 ? x : ln(1 + e^x)
                let e = self.exp_f(x);
                let s = self.em.bin(BinKind::Add, Ty::F32, RegClass::F32, e, Src::F32(1.0));
                let l = self.un_f(UnKind::Lg2, Src::Reg(s));
                let l = self.mul_f(l, Src::F32(LN2));
                let p = self.em.setp(Cmp::Gt, Ty::F32, x, Src::F32(20.0));
                let d = self.em.reg(RegClass::F32);
                self.em.emit(Op::Selp { ty: Ty::F32, d, a: x, b: Src::Reg(l), p });
                d
            }
            UnOp::Rsqrt => self.un_f(UnKind::Rsqrt, x),
            UnOp::Sqrt => self.un_f(UnKind::Sqrt, x),
            UnOp::Not => unreachable!(),
        };
        Ok(V { s: Src::Reg(d), ty: DType::F32 })
    }

    fn binary(&mut self, op: BinOp, a: &Expr, b: &Expr, want: DType, loc: SrcLoc) -> Result<V, Diag> {
        let (ta, tb) = (type_of(&self.p.def, a, loc)?, type_of(&self.p.def, b, loc)?);
        use crate::passes::check_types::Ty as T;
        let ty = match (ta, tb) {
            (T::Literal, T::Literal) => {
                if want.is_int() && !op.is_compare() {
                    want
                } else {
                    DType::I32
                }
            }
            (T::Literal, T::Is(t)) | (T::Is(t), T::Literal) => t,
            (T::Is(DType::I64), _) | (_, T::Is(DType::I64)) => DType::I64,
            (T::Is(t), _) => t,
        };
        if matches!(op, BinOp::And | BinOp::Or) {
            let x = self.expr(a, DType::Bool, loc)?;
            let y = self.expr(b, DType::Bool, loc)?;
            let xr = self.em.to_reg(x.s, RegClass::Pred, Ty::Pred);
            let yr = self.em.to_reg(y.s, RegClass::Pred, Ty::Pred);
            let d = self.em.reg(RegClass::Pred);
            let k = if op == BinOp::And { BinKind::And } else { BinKind::Or };
            self.em.emit(Op::PredLogic { op: k, d, a: xr, b: yr });
            return Ok(V { s: Src::Reg(d), ty: DType::Bool });
        }
        if ty == DType::F32 && matches!(op, BinOp::Add | BinOp::Sub) {
            if let Some(v) = self.fused_multiply_add(op, a, b, loc)? {
                return Ok(v);
            }
        }
        let x = self.expr(a, ty, loc)?.s;
        let y = self.expr(b, ty, loc)?.s;
        let pty = ty_of(ty);
        if op.is_compare() {
            let cmp = match op {
                BinOp::Lt => Cmp::Lt,
                BinOp::Le => Cmp::Le,
                BinOp::Gt => Cmp::Gt,
                BinOp::Ge => Cmp::Ge,
                BinOp::Eq => Cmp::Eq,
                _ => Cmp::Ne,
            };
            let (x, y) = if ty == DType::F32 { (Src::Reg(self.f32_reg(x)), y) } else { (x, y) };
            let (x, y) = match (x, y) {
                (Src::Imm(_), Src::Reg(_)) | (Src::Imm(_), Src::Imm(_)) => {
                    (Src::Reg(self.em.to_reg(x, class_of(ty), pty)), y)
                }
                p => p,
            };
            return Ok(V { s: Src::Reg(self.em.setp(cmp, pty, x, y)), ty: DType::Bool });
        }
        let kind = match op {
            BinOp::Add => BinKind::Add,
            BinOp::Sub => BinKind::Sub,
            BinOp::Mul => BinKind::Mul,
            BinOp::Div => BinKind::Div,
            BinOp::Rem => BinKind::Rem,
            BinOp::Min => BinKind::Min,
            BinOp::Max => BinKind::Max,
            _ => unreachable!("handled above"),
        };
        if ty == DType::F32 && op == BinOp::Rem {
            return self.err(loc, "`%` of floats is not supported");
        }
        if let Some(r) = self.split_remainder(op, x, y) {
            return Ok(V { s: r, ty });
        }
        if let Some(r) = self.split_offset(op, x, y) {
            return Ok(V { s: r, ty });
        }
        // PTX wants the first operand in a register.
        let x = match x {
            Src::Reg(r) => Src::Reg(r),
            s => Src::Reg(self.em.to_reg(s, class_of(ty), pty)),
        };
        if ty.is_int() {
            if let Some(d) = self.cached_int_op(kind, pty, class_of(ty), x, y) {
                return Ok(V { s: Src::Reg(d), ty });
            }
        }
        let d = self.em.bin(kind, pty, class_of(ty), x, y);
        Ok(V { s: Src::Reg(d), ty })
    }

    /// `x % 2^k` of a split index `x = base | off` (thread coordinates, never negative) as the
    /// split index `(base & (2^k - 1)) | (off & (2^k - 1))`, so a shared access at it still
    /// splits into a thread part and constants (`element_addr.rs`); `None` otherwise.
    fn split_remainder(&mut self, op: BinOp, x: Src, y: Src) -> Option<Src> {
        let (BinOp::Rem, Src::Reg(r), Src::Imm(m)) = (op, x, y) else { return None };
        let split = self.split_of(r)?;
        if m <= 0 || m > i64::from(u32::MAX) || m & (m - 1) != 0 {
            return None;
        }
        let mask = (m - 1) as u32;
        // One mask per base for the whole element loop (its thread parts are cached by base).
        let (a, b) = (Src::Reg(split.base), Src::Imm(i64::from(mask)));
        let base = match self.cached_int_op(BinKind::And, Ty::B32, RegClass::B32, a, b) {
            Some(r) => r,
            None => self.em.bin(BinKind::And, Ty::B32, RegClass::B32, a, b),
        };
        Some(self.split_index(base, split.base_bits & mask, split.off & mask))
    }

    /// `x + c` (either order) of a split index `x = base | off` and a constant `c` with `off + c`
    /// still disjoint from the base's bits (a row block further down, `kq[i + 16][j]`) as the
    /// split index `base | (off + c)`, so a shared access at it still splits into a thread part
    /// and constants (`element_addr.rs`) instead of swizzling its address whole; `None`
    /// otherwise.
    fn split_offset(&mut self, op: BinOp, x: Src, y: Src) -> Option<Src> {
        let (BinOp::Add, (Src::Reg(r), Src::Imm(c)) | (Src::Imm(c), Src::Reg(r))) = (op, (x, y)) else {
            return None;
        };
        let split = self.split_of(r)?;
        let off = u32::try_from(c).ok().and_then(|c| split.off.checked_add(c))?;
        (off & split.base_bits == 0).then(|| self.split_index(split.base, split.base_bits, off))
    }

    /// `m * n + c` (either order), `c - m * n` and `m * n - c` of f32 values as one
    /// `fma.rn.f32` (of `-m` or `-c` for a difference; negation is exact): a single rounding,
    /// as CUDA C++ contracts by default. `None` when neither side is an f32 product.
    fn fused_multiply_add(&mut self, op: BinOp, a: &Expr, b: &Expr, loc: SrcLoc) -> Result<Option<V>, Diag> {
        use crate::passes::check_types::Ty as T;
        let is_f32_product = |lw: &Self, e: &Expr| {
            matches!(e, Expr::Binary(BinOp::Mul, ..)) && matches!(type_of(&lw.p.def, e, loc), Ok(T::Is(DType::F32)))
        };
        // Which operand is negated: the product's first factor (`c - m * n`) or the addend.
        let (prod, c, negate_product) = if op == BinOp::Sub && is_f32_product(self, b) {
            (b, a, true)
        } else if is_f32_product(self, a) {
            (a, b, false)
        } else if op == BinOp::Add && is_f32_product(self, b) {
            (b, a, false)
        } else {
            return Ok(None);
        };
        let Expr::Binary(_, m, n) = prod else { return Ok(None) };
        let m = self.expr(m, DType::F32, loc)?.s;
        let n = self.expr(n, DType::F32, loc)?.s;
        let c = self.expr(c, DType::F32, loc)?.s;
        let m = if negate_product { self.negated(m) } else { Src::Reg(self.f32_reg(m)) };
        let c = if op == BinOp::Sub && !negate_product { self.negated(c) } else { c };
        let d = self.em.reg(RegClass::F32);
        self.em.emit(Op::Mad { ty: Ty::F32, d, a: m, b: n, c });
        Ok(Some(V { s: Src::Reg(d), ty: DType::F32 }))
    }

    /// `-x` of an f32 value, in a register.
    fn negated(&mut self, x: Src) -> Src {
        let r = Src::Reg(self.f32_reg(x));
        Src::Reg(self.un_f(UnKind::Neg, r))
    }

    fn cast(&mut self, to: DType, a: &Expr, loc: SrcLoc) -> Result<V, Diag> {
        let from = self.ty(a, loc)?;
        let x = self.expr(a, from, loc)?;
        let tv = value_type(to);
        if from == DType::Bool || to == DType::Bool {
            if from == to {
                return Ok(x);
            }
            return self.err(loc, format!("cannot convert {from} to {to}"));
        }
        if to.is_half() {
            let f = if from == DType::F32 { x } else { self.cast_value(x, DType::F32) };
            return Ok(self.round_for(f, to));
        }
        if from == tv {
            return Ok(x);
        }
        Ok(self.cast_value(x, tv))
    }

    fn cast_value(&mut self, x: V, to: DType) -> V {
        if let Src::Imm(c) = x.s {
            return match to {
                DType::F32 => V { s: Src::F32(c as f32), ty: to },
                DType::I32 => V { s: Src::Imm(c as i32 as i64), ty: to },
                _ => V { s: Src::Imm(c), ty: to },
            };
        }
        let d = self.em.reg(class_of(to));
        self.em.emit(Op::Cvt { dty: ty_of(to), sty: ty_of(x.ty), d, a: x.s });
        V { s: Src::Reg(d), ty: to }
    }
}
