//! f64 CPU references and the host-side rounding inputs go through.

use half::{bf16, f16};
use kda_dsl::DType;

/// Rounds `x` to `dtype` and back (the value a tensor of that type holds).
pub fn round_to(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        _ => x,
    }
}

/// Encodes values as the little-endian bytes of a `dtype` tensor.
pub fn to_bytes(v: &[f64], dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size_bytes());
    for &x in v {
        match dtype {
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(x as i64).to_le_bytes()),
            DType::Bool => out.push((x != 0.0) as u8),
        }
    }
    out
}

/// Decodes the little-endian bytes of a `dtype` tensor.
pub fn from_bytes(b: &[u8], dtype: DType) -> Vec<f64> {
    let n = dtype.size_bytes();
    b.chunks_exact(n)
        .map(|c| match dtype {
            DType::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F16 => f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
            DType::Bool => c[0] as f64,
        })
        .collect()
}

/// `C = A·B` (`b` is `[K, N]`) or `A·Bᵀ` (`b` is `[N, K]`) in f64; row-major.
pub fn gemm_f64(a: &[f64], b: &[f64], m: usize, n: usize, k: usize, b_transposed: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let bv = if b_transposed { b[j * k + p] } else { b[p * n + j] };
                s += a[i * k + p] * bv;
            }
            c[i * n + j] = s;
        }
    }
    c
}

/// `||x - r|| / ||r||` (or `||x||` when `r` is zero); NaN anywhere gives infinity.
pub fn rel_err(x: &[f64], r: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (a, b) in x.iter().zip(r) {
        if a.is_nan() {
            return f64::INFINITY;
        }
        num += (a - b) * (a - b);
        den += b * b;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// A small deterministic generator (SplitMix64) for test inputs.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` normals rounded to `dtype`.
    pub fn normals(&mut self, n: usize, dtype: DType) -> Vec<f64> {
        (0..n).map(|_| round_to(self.normal(), dtype)).collect()
    }
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// the softplus: `x` above 20 (where `ln(1 + e^x)` is `x` to f32 precision), else
/// `ln(1 + e^x)`.
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// the l2norm: `x / sqrt(sum(x^2) + 1e-6)` (the epsilon keeps a zero row at zero).
pub fn l2norm(x: &[f64]) -> Vec<f64> {
    let n = (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|v| v / n).collect()
}

/// One token of the recurrence, in place on a K x V state `s` (`s[k * V + v]` holds
/// `S[k, v]`), shared by the decode and chunk references so the recurrence is written once:
///
/// ```text
/// S = diag(alpha) * S;  u = beta * (v - S^T k);  S = S + k u^T;  o = S^T q
/// ```
///
/// `alpha` (`exp(g)`), `k` and `q` have K entries (q already l2-normalized and scaled), `v` has
/// V; `beta` holds one scalar, or V entries for a headwise beta. Returns `o` (V entries), read
/// after the update.
pub fn token_step(s: &mut [f64], alpha: &[f64], k: &[f64], v: &[f64], beta: &[f64], q: &[f64]) -> Vec<f64> {
    let (kd, vd) = (k.len(), v.len());
    debug_assert!(s.len() == kd * vd && alpha.len() == kd && q.len() == kd);
    debug_assert!(beta.len() == 1 || beta.len() == vd);
    for kk in 0..kd {
        for e in &mut s[kk * vd..(kk + 1) * vd] {
            *e *= alpha[kk];
        }
    }
    // Value columns are independent: each takes its delta, its update and its output in turn.
    (0..vd)
        .map(|v2| {
            let sk: f64 = (0..kd).map(|kk| s[kk * vd + v2] * k[kk]).sum();
            let u = beta[if beta.len() == 1 { 0 } else { v2 }] * (v[v2] - sk);
            for kk in 0..kd {
                s[kk * vd + v2] += k[kk] * u;
            }
            (0..kd).map(|kk| s[kk * vd + v2] * q[kk]).sum()
        })
        .collect()
}
