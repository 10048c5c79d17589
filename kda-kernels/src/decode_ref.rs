//! The f64 reference of `gated_delta_rule_decode` (docs/semantics.md), and random inputs for it.

use crate::decode::{Beta, DecodeConfig, Gate, Writes};
use crate::reference::{l2norm, round_to, sigmoid, softplus, token_step, Rng};
use kda_dsl::DType;

/// Head dimension (K = V).
pub const D: usize = 128;

/// Inputs of one decode call, as the tensors hold them (already rounded to their dtypes).
#[derive(Clone, Debug)]
pub struct DecodeInputs {
    /// Batch rows of q (1 for varlen).
    pub b: usize,
    /// Tokens per row (S for varlen).
    pub t: usize,
    /// q/k heads.
    pub h: usize,
    /// Value heads.
    pub hv: usize,
    /// `[B, T, H, D]`.
    pub q: Vec<f64>,
    /// `[B, T, H, D]`.
    pub k: Vec<f64>,
    /// `[B, T, HV, D]`.
    pub v: Vec<f64>,
    /// Gate input `[B, T, HV, D]`.
    pub a: Vec<f64>,
    /// `[B, T, HV]` or `[B, T, HV, D]`.
    pub beta: Vec<f64>,
    /// `[HV]`.
    pub a_log: Vec<f64>,
    /// `[HV, D]`.
    pub dt_bias: Vec<f64>,
    /// The state pool `[P, HV, D, D]` in the config's layout.
    pub pool: Vec<f64>,
    /// Pool slots.
    pub slots: usize,
    /// `[N, cols]` (row-major) and cols.
    pub indices: Vec<i64>,
    /// Columns of `indices`.
    pub cols: usize,
    /// `[N + 1]`.
    pub cu_seqlens: Vec<i64>,
    /// `[N]`.
    pub accepted: Vec<i64>,
    /// Query scale.
    pub scale: f64,
    /// Lower bound of the lower-bound gate.
    pub lower_bound: f64,
}

/// What a decode call produces.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeOutputs {
    /// `[B, T, HV, D]`, rounded to the output dtype.
    pub out: Vec<f64>,
    /// The pool after the call.
    pub pool: Vec<f64>,
    /// The returned state tensor (`[tokens or N, HV, D, D]`), empty when none.
    pub final_state: Vec<f64>,
}

impl DecodeInputs {
    /// Sequences in the call.
    pub fn sequences(&self, cfg: &DecodeConfig) -> usize {
        if cfg.varlen.is_some() {
            self.cu_seqlens.len().saturating_sub(1)
        } else {
            self.b
        }
    }

    /// Rows of the returned state tensor.
    pub fn final_rows(&self, cfg: &DecodeConfig) -> usize {
        match cfg.writes {
            Writes::FinalPerToken => self.b * self.t,
            Writes::FinalPerSequence => self.sequences(cfg),
            _ => 0,
        }
    }
}

/// Offset of element (k, v) of state `slot`, head `hv` in a pool of the config's layout.
fn at(cfg: &DecodeConfig, hvs: usize, slot: usize, hv: usize, k: usize, v: usize) -> usize {
    let base = (slot * hvs + hv) * D * D;
    if cfg.v_first {
        base + v * D + k
    } else {
        base + k * D + v
    }
}

/// Runs the recurrence in f64 exactly as docs/semantics.md states it.
pub fn decode_ref(cfg: &DecodeConfig, x: &DecodeInputs) -> DecodeOutputs {
    let (bt, t_all, hv_n, g_ratio) = (x.b, x.t, x.hv, x.hv / x.h);
    let mut out = vec![0.0; bt * t_all * hv_n * D];
    let mut pool = x.pool.clone();
    let mut fin = vec![0.0; x.final_rows(cfg) * hv_n * D * D];
    let n_seq = x.sequences(cfg);
    let p = x.slots as i64;
    for n in 0..n_seq {
        let (bi, bos, tn) = if cfg.varlen.is_some() {
            let s0 = x.cu_seqlens[n].clamp(0, t_all as i64);
            let s1 = x.cu_seqlens[n + 1].clamp(s0, t_all as i64);
            (0, s0 as usize, (s1 - s0) as usize)
        } else {
            (n, 0, t_all)
        };
        let tok0 = bi * t_all + bos;
        let (rs, live) = if cfg.indices.is_some() {
            let col = if cfg.accepted.is_some() { x.accepted[n].clamp(1, x.cols as i64) as usize - 1 } else { 0 };
            let r = x.indices[n * x.cols + col];
            (r.max(0) as usize, (0..p).contains(&r))
        } else {
            (n, true)
        };
        for hv in 0..hv_n {
            let h = hv / g_ratio;
            // s[k][v]
            let mut s = vec![0.0; D * D];
            if cfg.use_initial_state && live {
                for kk in 0..D {
                    for vv in 0..D {
                        s[kk * D + vv] = pool[at(cfg, hv_n, rs, hv, kk, vv)];
                    }
                }
            }
            if !live {
                // Padding: outputs and per-token states stay zero; nothing else is touched.
                continue;
            }
            for t in 0..tn {
                let ti = bos + t;
                let row = |buf: &[f64], heads: usize, hh: usize| -> Vec<f64> {
                    let o = ((bi * t_all + ti) * heads + hh) * D;
                    buf[o..o + D].to_vec()
                };
                let (mut qv, mut kv) = (row(&x.q, x.h, h), row(&x.k, x.h, h));
                if cfg.l2norm {
                    qv = l2norm(&qv);
                    kv = l2norm(&kv);
                }
                let qv: Vec<f64> = qv.iter().map(|e| e * x.scale).collect();
                let av = row(&x.a, hv_n, hv);
                let vv = row(&x.v, hv_n, hv);
                let ea = if cfg.a_log { x.a_log[hv].exp() } else { 1.0 };
                let alpha: Vec<f64> = (0..D)
                    .map(|j| {
                        let z = av[j] + if cfg.dt_bias.is_some() { x.dt_bias[hv * D + j] } else { 0.0 };
                        let g = match cfg.gate {
                            Gate::Precomputed => av[j],
                            Gate::LowerBound => x.lower_bound * sigmoid(ea * z),
                            Gate::Softplus => -ea * softplus(z),
                        };
                        g.exp()
                    })
                    .collect();
                let beta_of = |braw: f64| match cfg.beta {
                    Beta::Raw => braw,
                    Beta::Sigmoid => sigmoid(braw),
                    Beta::TwoSigmoid => 2.0 * sigmoid(braw),
                };
                let bidx = (bi * t_all + ti) * hv_n + hv;
                let beta: Vec<f64> = if cfg.beta_headwise {
                    x.beta[bidx * D..(bidx + 1) * D].iter().map(|&b| beta_of(b)).collect()
                } else {
                    vec![beta_of(x.beta[bidx])]
                };
                let o = token_step(&mut s, &alpha, &kv, &vv, &beta, &qv);
                for (dst, o) in out[bidx * D..(bidx + 1) * D].iter_mut().zip(o) {
                    *dst = round_to(o, cfg.out_dtype);
                }
                if cfg.state_dtype != DType::F32 {
                    s.iter_mut().for_each(|e| *e = round_to(*e, cfg.state_dtype));
                }
                match cfg.writes {
                    Writes::PoolPerToken => {
                        let w = x.indices[n * x.cols + t.min(x.cols - 1)];
                        if (0..p).contains(&w) {
                            store(cfg, &mut pool, &s, hv_n, w as usize, hv);
                        }
                    }
                    Writes::FinalPerToken => store(cfg, &mut fin, &s, hv_n, tok0 + t, hv),
                    _ => {}
                }
            }
            match cfg.writes {
                Writes::PoolPerSequence => store(cfg, &mut pool, &s, hv_n, n, hv),
                Writes::FinalPerSequence => store(cfg, &mut fin, &s, hv_n, n, hv),
                _ => {}
            }
        }
    }
    DecodeOutputs { out, pool, final_state: fin }
}

fn store(cfg: &DecodeConfig, dst: &mut [f64], s: &[f64], hvs: usize, slot: usize, hv: usize) {
    for kk in 0..D {
        for vv in 0..D {
            dst[at(cfg, hvs, slot, hv, kk, vv)] = round_to(s[kk * D + vv], cfg.state_dtype);
        }
    }
}

/// Random inputs (docs/semantics.md, "Numerics and tests") for a call of `b` rows of `t` tokens, or
/// varlen `lens` when the config is varlen.
#[allow(clippy::too_many_arguments)] // the call's shape, in the spec's letters
pub fn random_inputs(
    cfg: &DecodeConfig,
    b: usize,
    t: usize,
    h: usize,
    hv: usize,
    slots: usize,
    lens: &[usize],
    seed: u64,
) -> DecodeInputs {
    let mut rng = Rng::new(seed);
    let (b, t) = if cfg.varlen.is_some() { (1, lens.iter().sum::<usize>()) } else { (b, t) };
    let n_seq = if cfg.varlen.is_some() { lens.len() } else { b };
    let dt = cfg.dtype;
    let q = rng.normals(b * t * h * D, dt);
    let mut k = rng.normals(b * t * h * D, dt);
    if !cfg.l2norm {
        // Keep the delta rule stable: unit-norm keys, as l2norm would give.
        for row in k.chunks_mut(D) {
            let n = row.iter().map(|e| e * e).sum::<f64>().sqrt();
            row.iter_mut().for_each(|e| *e = round_to(*e / n, dt));
        }
    }
    let v = rng.normals(b * t * hv * D, dt);
    let a: Vec<f64> = if cfg.gate == Gate::Precomputed {
        (0..b * t * hv * D).map(|_| round_to(-softplus(rng.normal()), dt)).collect()
    } else {
        rng.normals(b * t * hv * D, dt)
    };
    let bw = if cfg.beta_headwise { D } else { 1 };
    let beta: Vec<f64> = (0..b * t * hv * bw)
        .map(|_| if cfg.beta == Beta::Raw { round_to(rng.uniform(), dt) } else { round_to(rng.normal(), dt) })
        .collect();
    let a_log = (0..hv).map(|_| (rng.uniform() * 2.8) as f32 as f64).collect();
    let dt_bias = (0..hv * D).map(|_| round_to(rng.normal(), cfg.dt_bias.unwrap_or(DType::F32))).collect();
    let pool = (0..slots * hv * D * D).map(|_| round_to(rng.normal() * 0.1, cfg.state_dtype)).collect();
    let mut cu = vec![0i64];
    for l in lens {
        cu.push(cu.last().copied().unwrap_or(0) + *l as i64);
    }
    DecodeInputs {
        b,
        t,
        h,
        hv,
        q,
        k,
        v,
        a,
        beta,
        a_log,
        dt_bias,
        pool,
        slots,
        indices: vec![],
        cols: 1,
        cu_seqlens: if cfg.varlen.is_some() { cu } else { vec![] },
        accepted: vec![1; n_seq],
        scale: 1.0 / (D as f64).sqrt(),
        lower_bound: -5.0,
    }
}
