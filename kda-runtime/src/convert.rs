//! Host-side conversion between `f32` / `i64` values and the little-endian bytes of a dtype.

use half::{bf16, f16};
use kda_dsl::dtype::DType;

use crate::error::RuntimeError;

/// Encodes `values` as `dtype` (`f32`, `bf16` or `f16`), rounding to nearest even.
pub(crate) fn encode_f32(values: &[f32], dtype: DType) -> Result<Vec<u8>, RuntimeError> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    match dtype {
        DType::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::BF16 => values.iter().for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        DType::F16 => values.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        other => return Err(not_float("dtype", other)),
    }
    Ok(out)
}

/// Encodes `values` as `dtype` (`i32` or `i64`); values outside `i32` fail for `i32`.
pub(crate) fn encode_i64(values: &[i64], dtype: DType) -> Result<Vec<u8>, RuntimeError> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    match dtype {
        DType::I64 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::I32 => {
            for (i, v) in values.iter().enumerate() {
                let v = i32::try_from(*v).map_err(|_| {
                    RuntimeError::bad_argument("data", "values that fit in i32", format!("{v} at index {i}"))
                })?;
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        other => return Err(not_int("dtype", other)),
    }
    Ok(out)
}

/// Decodes `bytes` of `dtype` to `f32` (integers are converted, possibly rounding).
pub(crate) fn decode_f32(bytes: &[u8], dtype: DType) -> Result<Vec<f32>, RuntimeError> {
    Ok(match dtype {
        DType::F32 => chunks::<4>(bytes).map(f32::from_le_bytes).collect(),
        DType::BF16 => chunks::<2>(bytes).map(|b| bf16::from_le_bytes(b).to_f32()).collect(),
        DType::F16 => chunks::<2>(bytes).map(|b| f16::from_le_bytes(b).to_f32()).collect(),
        DType::I32 => chunks::<4>(bytes).map(|b| i32::from_le_bytes(b) as f32).collect(),
        DType::I64 => chunks::<8>(bytes).map(|b| i64::from_le_bytes(b) as f32).collect(),
        DType::Bool => return Err(unstorable()),
    })
}

/// Decodes `bytes` of an integer `dtype` to `i64`.
pub(crate) fn decode_i64(bytes: &[u8], dtype: DType) -> Result<Vec<i64>, RuntimeError> {
    Ok(match dtype {
        DType::I32 => chunks::<4>(bytes).map(|b| i64::from(i32::from_le_bytes(b))).collect(),
        DType::I64 => chunks::<8>(bytes).map(i64::from_le_bytes).collect(),
        other => return Err(not_int("tensor", other)),
    })
}

fn chunks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.chunks_exact(N).filter_map(|c| <[u8; N]>::try_from(c).ok())
}

fn not_float(name: &str, got: DType) -> RuntimeError {
    RuntimeError::bad_argument(name, "a float dtype (f32, bf16 or f16)", got.name())
}

fn not_int(name: &str, got: DType) -> RuntimeError {
    RuntimeError::bad_argument(name, "an integer dtype (i32 or i64)", got.name())
}

/// The error for `bool`, which has no memory layout.
pub(crate) fn unstorable() -> RuntimeError {
    RuntimeError::Unsupported("bool tensors cannot be stored in device memory".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_round_trips() {
        let vals = [0.0f32, 1.5, -2.25, 1024.0];
        for dt in [DType::F32, DType::BF16, DType::F16] {
            let bytes = encode_f32(&vals, dt).unwrap();
            assert_eq!(bytes.len(), vals.len() * dt.size_bytes());
            assert_eq!(decode_f32(&bytes, dt).unwrap(), vals);
        }
    }

    #[test]
    fn int_round_trips_and_range() {
        let vals = [0i64, -7, 1 << 20];
        for dt in [DType::I32, DType::I64] {
            let bytes = encode_i64(&vals, dt).unwrap();
            assert_eq!(decode_i64(&bytes, dt).unwrap(), vals);
            assert_eq!(decode_f32(&bytes, dt).unwrap(), [0.0, -7.0, 1048576.0]);
        }
        let err = encode_i64(&[1 << 40], DType::I32).unwrap_err();
        assert!(err.to_string().contains("`data`"), "{err}");
    }

    #[test]
    fn wrong_kinds_are_rejected() {
        assert!(encode_f32(&[1.0], DType::I32).is_err());
        assert!(encode_i64(&[1], DType::BF16).is_err());
        assert!(decode_i64(&[0; 4], DType::F32).is_err());
        assert!(decode_f32(&[0], DType::Bool).is_err());
    }
}
