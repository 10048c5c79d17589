//! The simulator's arithmetic: PTX's integer, float and half-precision semantics on raw bits.

use crate::thread_ir::*;

/// A simulation step's failure message.
pub(super) type R<T> = Result<T, String>;

pub(super) fn f32_of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

pub(super) fn round_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    let lsb = (b >> 16) & 1;
    ((b.wrapping_add(0x7fff + lsb)) >> 16) as u16
}

pub(super) fn bf16_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

pub(super) fn round_f16(x: f32) -> u16 {
    f16_bits(x)
}

/// f32 to IEEE half, round to nearest even.
pub(super) fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

pub(super) fn f16_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    match e {
        0 => sign * m * 2f32.powi(-24),
        0x1f => {
            if m == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        _ => sign * (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

pub(super) fn half_to_f32(h: u16, ty: Ty) -> f32 {
    if ty == Ty::BF16 {
        bf16_f32(h)
    } else {
        f16_f32(h)
    }
}

pub(super) fn f32_to_half(x: f32, ty: Ty) -> u16 {
    if ty == Ty::BF16 {
        round_bf16(x)
    } else {
        round_f16(x)
    }
}

pub(super) fn cmp_of(c: Cmp, o: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match c {
        Cmp::Lt => o == Less,
        Cmp::Le => o != Greater,
        Cmp::Gt => o == Greater,
        Cmp::Ge => o != Less,
        Cmp::Eq => o == Equal,
        Cmp::Ne => o != Equal,
    }
}

pub(super) fn bin(op: BinKind, ty: Ty, x: u64, y: u64) -> R<u64> {
    Ok(match ty {
        Ty::F32 => {
            let (a, b) = (f32_of(x), f32_of(y));
            let r = match op {
                BinKind::Add => a + b,
                BinKind::Sub => a - b,
                BinKind::Mul => a * b,
                BinKind::Div => a / b,
                BinKind::Min => a.min(b),
                BinKind::Max => a.max(b),
                _ => return Err(format!("{op:?} on f32")),
            };
            r.to_bits() as u64
        }
        Ty::S64 | Ty::U64 | Ty::B64 => {
            let (a, b) = (x as i64, y as i64);
            (match op {
                BinKind::Add => a.wrapping_add(b),
                BinKind::Sub => a.wrapping_sub(b),
                BinKind::Mul => a.wrapping_mul(b),
                BinKind::Div => a.checked_div(b).ok_or("64-bit division by zero")?,
                BinKind::Rem => a.checked_rem(b).ok_or("64-bit remainder by zero")?,
                BinKind::Min => a.min(b),
                BinKind::Max => a.max(b),
                BinKind::And => a & b,
                BinKind::Or => a | b,
                BinKind::Xor => a ^ b,
                BinKind::Shl => a.wrapping_shl(b as u32),
                BinKind::Shr => {
                    if ty == Ty::S64 {
                        a >> (b as u32).min(63)
                    } else {
                        ((a as u64) >> (b as u32).min(63)) as i64
                    }
                }
            }) as u64
        }
        Ty::U32 | Ty::B32 => {
            let (a, b) = (x as u32, y as u32);
            (match op {
                BinKind::Add => a.wrapping_add(b),
                BinKind::Sub => a.wrapping_sub(b),
                BinKind::Mul => a.wrapping_mul(b),
                BinKind::Div => a.checked_div(b).ok_or("division by zero")?,
                BinKind::Rem => a.checked_rem(b).ok_or("remainder by zero")?,
                BinKind::Min => a.min(b),
                BinKind::Max => a.max(b),
                BinKind::And => a & b,
                BinKind::Or => a | b,
                BinKind::Xor => a ^ b,
                BinKind::Shl => a.checked_shl(b).unwrap_or(0),
                BinKind::Shr => a.checked_shr(b).unwrap_or(0),
            }) as u64
        }
        _ => {
            let (a, b) = (x as u32 as i32, y as u32 as i32);
            let ovf = || format!("32-bit signed overflow in {op:?} ({a}, {b}); index arithmetic needs 64 bits here");
            (match op {
                BinKind::Add => a.checked_add(b).ok_or_else(ovf)?,
                BinKind::Sub => a.checked_sub(b).ok_or_else(ovf)?,
                BinKind::Mul => a.checked_mul(b).ok_or_else(ovf)?,
                BinKind::Div => a.checked_div(b).ok_or("division by zero")?,
                BinKind::Rem => a.checked_rem(b).ok_or("remainder by zero")?,
                BinKind::Min => a.min(b),
                BinKind::Max => a.max(b),
                BinKind::And => a & b,
                BinKind::Or => a | b,
                BinKind::Xor => a ^ b,
                BinKind::Shl => a.wrapping_shl(b as u32),
                BinKind::Shr => a >> (b as u32).min(31),
            }) as u32 as u64
        }
    })
}

pub(super) fn cvt(dty: Ty, sty: Ty, x: u64) -> R<u64> {
    let f = f32_of(x);
    Ok(match (dty, sty) {
        (Ty::F32, Ty::S32) => (x as u32 as i32 as f32).to_bits() as u64,
        (Ty::F32, Ty::U32) => (x as u32 as f32).to_bits() as u64,
        (Ty::F32, Ty::S64) => (x as i64 as f32).to_bits() as u64,
        (Ty::S32, Ty::F32) => (if f.is_nan() { 0 } else { f as i32 }) as u32 as u64,
        (Ty::S64, Ty::F32) => (if f.is_nan() { 0 } else { f as i64 }) as u64,
        (Ty::S64, Ty::S32) => x as u32 as i32 as i64 as u64,
        (Ty::U64, Ty::U32) => x as u32 as u64,
        (Ty::S32 | Ty::U32, Ty::S64 | Ty::U64) => x as u32 as u64,
        (Ty::BF16, Ty::F32) => round_bf16(f) as u64,
        (Ty::F16, Ty::F32) => round_f16(f) as u64,
        (Ty::F32, Ty::BF16) => bf16_f32(x as u16).to_bits() as u64,
        (Ty::F32, Ty::F16) => f16_f32(x as u16).to_bits() as u64,
        (d, s) => return Err(format!("cvt.{}.{} is not simulated", d.name(), s.name())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_rounding_matches_ieee() {
        for x in [0.0f32, 1.0, -2.5, 65504.0, 1e-5, 2.71, 1e-8, 70000.0] {
            let h = f16_bits(x);
            let back = f16_f32(h);
            if x.abs() < 65520.0 {
                assert!((back - x).abs() <= x.abs() * 1e-3 + 6e-8, "{x} -> {back}");
            } else {
                assert!(back.is_infinite());
            }
        }
        assert_eq!(bf16_f32(round_bf16(1.0 + 1.0 / 256.0)), 1.0, "ties to even");
    }
}
