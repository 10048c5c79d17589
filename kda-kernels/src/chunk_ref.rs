//! The f64 reference of `chunk_kda` (docs/semantics.md), computed two ways: the token recurrence
//! ([`chunk_reference`], the contract) and the kernels' per-chunk math (`chunk.rs`)
//! ([`chunk_form`], the algorithm the kernel implements, so a kernel bug can be told apart
//! from an algorithm bug), and random inputs for both ([`ChunkInputs::random`]).
//!
//! Both take the inputs as the tensors hold them (already rounded) and return f64 values that
//! are not rounded to any output or state dtype: a kernel's result is compared with them under
//! the bounds of docs/semantics.md, "Numerics and tests".

use crate::decode_ref::D;
use crate::reference::{gemm_f64, l2norm, round_to, sigmoid, softplus, token_step, Rng};
use crate::rules::{Beta, Gate};
use kda_dsl::DType;

/// Inputs of one `chunk_kda` call, as the tensors hold them (all values already rounded to
/// their tensor dtypes).
#[derive(Clone, Debug)]
pub struct ChunkInputs {
    /// Batch rows (1 for varlen).
    pub b: usize,
    /// Tokens per row (S, the total, for varlen).
    pub t: usize,
    /// q/k heads.
    pub h: usize,
    /// Value heads (a multiple of `h`; value head `j` reads q/k head `j / (hv / h)`).
    pub hv: usize,
    /// `[B, T, H, 128]`.
    pub q: Vec<f64>,
    /// `[B, T, H, 128]`.
    pub k: Vec<f64>,
    /// `[B, T, HV, 128]`.
    pub v: Vec<f64>,
    /// `[B, T, HV, 128]`: the raw gate input of a gate computed from `a_log` and `dt_bias`
    /// (the lower-bound or softplus rule), else a precomputed natural-log decay
    /// (`alpha = exp(g)`).
    pub g: Vec<f64>,
    /// The gate rule (a missing `a_log` or `dt_bias` counts as 0).
    pub gate: Gate,
    /// `[B, T, HV]`: beta's input, by `beta_rule`.
    pub beta: Vec<f64>,
    /// How `beta` becomes beta (`Sigmoid`: the reference's logits).
    pub beta_rule: Beta,
    /// `[HV]`, for a gate computed from it (the API requires it with `dt_bias`).
    pub a_log: Option<Vec<f64>>,
    /// `[HV * 128]`, for a gate computed from it.
    pub dt_bias: Option<Vec<f64>>,
    /// Lower bound of the lower-bound gate rule (`g = lower_bound * sigmoid(..)`).
    pub lower_bound: f64,
    /// Query scale (`chunk_kda`'s default is `128^-0.5`).
    pub scale: f64,
    /// l2-normalize q and k (`use_qk_l2norm_in_kernel`).
    pub l2norm: bool,
    /// `[N + 1]`; varlen when given (then `b` is 1 and `t` the total token count). Values are
    /// clamped to a monotone range inside `[0, t]`, as the kernels clamp them.
    pub cu_seqlens: Option<Vec<i64>>,
    /// `[N, HV, 128, 128]` V-first (element `(v, k)` holds `S[k, v]`); with `state_indices`, the
    /// pool `[P, HV, 128, 128]`. `None` is a zero initial state (and, with `state_indices`, an
    /// empty pool, so every slot is padding).
    pub initial: Option<Vec<f64>>,
    /// `[N]` pool slots: sequence n starts from `pool[state_indices[n]]` and its final state is
    /// written back there. A slot outside `[0, P)` is padding: zero output rows, nothing read or
    /// written.
    pub state_indices: Option<Vec<i64>>,
    /// `[N]` pool slots to read from, with `state_indices` (which still names the slot the
    /// final state goes to): sequence n starts from `pool[read_indices[n]]`, zeros when that
    /// slot is outside the pool. Absent: `state_indices`.
    pub read_indices: Option<Vec<i64>>,
    /// `[N]`: nonzero starts sequence n from its initial state, zero from zeros. Absent: every
    /// sequence starts from its initial state. Honoured with or without `state_indices`.
    pub has_initial: Option<Vec<i64>>,
    /// Prefix caching (with `state_indices`): where each sequence starts in its whole prompt,
    /// and the checkpoints.
    pub prefix: Option<PrefixInputs>,
}

/// The prefix-caching inputs of a call (docs/prefill.md, "Prefix caching").
#[derive(Clone, Debug, PartialEq)]
pub struct PrefixInputs {
    /// `[N]` `prefix_lens`: tokens of sequence n before this call.
    pub lens: Vec<i64>,
    /// `checkpoint_every` E (a multiple of 16); 0: no checkpoints.
    pub every: usize,
    /// `[N, cols]` `checkpoint_slots`, by absolute block: the state after absolute position p
    /// (`p % E == 0`, strictly inside the call's part of the sequence) goes to slot
    /// `slots[n * cols + p / E - 1]` of `pool`, when that column exists and the slot is in it.
    pub slots: Vec<i64>,
    /// Columns of `slots`.
    pub cols: usize,
    /// The checkpoint pool `[PC, HV, 128, 128]` V-first, as it is before the call.
    pub pool: Vec<f64>,
}

impl PrefixInputs {
    /// Where sequence `n` (of `len` tokens, `hv` value heads) checkpoints: `(tokens into the
    /// call, checkpoint pool slot)` in order, the skipped ones (a column past `cols`, a slot
    /// outside the pool) left out.
    pub fn checkpoints_of(&self, n: usize, len: usize, hv: usize) -> Vec<(usize, usize)> {
        let start = usize::try_from(self.lens[n]).unwrap_or(0);
        let pool_slots = self.pool.len() / (hv * D * D).max(1);
        if self.every == 0 {
            return vec![];
        }
        (start / self.every + 1..)
            .map(|k| k * self.every)
            .take_while(|p| *p < start + len)
            .filter(|p| *p > start)
            .filter_map(|p| {
                let col = p / self.every - 1;
                let slot = (col < self.cols).then(|| self.slots[n * self.cols + col])?;
                let slot = usize::try_from(slot).ok().filter(|s| *s < pool_slots)?;
                Some((p - start, slot))
            })
            .collect()
    }
}

/// What a `chunk_kda` call produces, in f64 (not rounded to the output or state dtype).
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkOutputs {
    /// `[B, T, HV, 128]`; the rows of padding sequences (and rows no sequence owns) are 0.
    pub out: Vec<f64>,
    /// `[N, HV, 128, 128]` V-first; with `state_indices`, the whole pool after the call: the
    /// slots of live sequences written in place, every other slot as it was.
    pub final_state: Vec<f64>,
    /// The checkpoint pool after the call (empty without checkpoints).
    pub checkpoints: Vec<f64>,
}

/// How long the sequences of a random call are.
#[derive(Clone, Debug, PartialEq)]
pub enum Lengths {
    /// `b` rows of `t` tokens each.
    Dense {
        /// Batch rows.
        b: usize,
        /// Tokens per row.
        t: usize,
    },
    /// Varlen: one sequence per entry (zero allowed), packed into `[1, sum, ..]`.
    Varlen(Vec<usize>),
}

/// The gate of a random call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GateSpec {
    /// The lower-bound rule: raw gate input `~ N(0, 1)`, `A_log ~ U(0, 2.8)`,
    /// `dt_bias ~ N(0, 1)` (both f32), `lower_bound = -5`.
    LowerBound,
    /// The softplus rule over its range: raw gate input `~ U(-14, 3)`, `A_log ~ U(0, 1.6)`,
    /// `dt_bias ~ 0.5 N(0, 1)`: from about -20 per token down the chunk to channels that decay
    /// by under 1e-6 (`softplus(-15.5)`), which never forget.
    Softplus,
    /// A precomputed natural-log decay `g = -softplus(N(0, 1))` per channel (never positive).
    Precomputed,
    /// A precomputed decay of this value for every channel of every token (e.g. -20: the state
    /// forgets almost all of itself at each token, the far end of the unbounded gate).
    PrecomputedFixed(f64),
}

/// Beta's inputs in a random call (their rule is [`ChunkSpec::beta_rule`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BetaSpec {
    /// Logits `~ N(0, 1)`; for [`Beta::Raw`] their sigmoid (a post-sigmoid beta in (0, 1)).
    Random,
    /// This input for every token (a logit of 8 with [`Beta::TwoSigmoid`] gives beta near 2).
    Fixed(f64),
}

/// The initial state of a random call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InitialSpec {
    /// No initial state (zeros); the final state is `[N, HV, 128, 128]`.
    None,
    /// `initial[n]` per sequence, `~ 0.1 N(0, 1)`.
    PerSequence,
    /// A pool of `slots` states (`~ 0.1 N(0, 1)`) with `state_indices` and `has_initial`.
    /// Sequence n with `n % 3 == 1` is padding (slot -1, then one past the pool, alternating);
    /// the others take distinct random slots (so `slots` must cover them) and start from zeros
    /// when `n % 3 == 2`. Three sequences show every kind; five show both padding kinds.
    Pool {
        /// Pool slots P.
        slots: usize,
    },
    /// As [`InitialSpec::Pool`], with `read_indices` apart (prefix caching): every live
    /// sequence writes its own slot among the first `slots - 1` and reads the last, a cached
    /// state no sequence writes, except those with `n % 4 == 3`, which read one past the pool
    /// (zeros).
    CachedPrefix {
        /// Pool slots P.
        slots: usize,
    },
}

/// What [`ChunkInputs::random`] draws (docs/semantics.md, "Numerics and tests").
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkSpec {
    /// Input dtype (`BF16` or `F16`): q, k, v, g and the beta logits are rounded to it.
    pub dtype: DType,
    /// Sequence lengths, dense or varlen.
    pub lengths: Lengths,
    /// q/k heads.
    pub h: usize,
    /// Value heads (a multiple of `h`).
    pub hv: usize,
    /// Gate rule and its inputs.
    pub gate: GateSpec,
    /// Beta rule.
    pub beta_rule: Beta,
    /// Beta's inputs.
    pub beta: BetaSpec,
    /// Every token of a row carries its first token's key (per head): the hard case of the
    /// delta rule's solve, with beta near 2 its largest entries.
    pub identical_keys: bool,
    /// l2-normalize q and k in the kernel; when off, k is drawn unit-norm (then rounded) so the
    /// delta rule stays stable, as docs/semantics.md asks.
    pub l2norm: bool,
    /// Initial state, if any.
    pub initial: InitialSpec,
    /// Dtype the initial state is rounded to (`F32`, `BF16` or `F16`).
    pub state_dtype: DType,
    /// Prefix caching (with a pool): see [`PrefixSpec`].
    pub prefix: Option<PrefixSpec>,
}

/// Prefix caching in a random call: sequence n is `[0, 1, 15, 16, 17, 33][n % 6]` tokens into
/// its prompt; with `every` > 0 it checkpoints every `every` tokens through a block table of
/// `cols` columns into a pool of `N · cols` slots (0.5 each before the call), entry
/// `n · cols + c` naming slot `n · cols + c`, except every 7th from the 2nd (-1, skipped) and
/// from the 3rd (one past the pool, skipped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixSpec {
    /// `checkpoint_every` (0: `prefix_lens` alone).
    pub every: usize,
    /// Columns of the block table.
    pub cols: usize,
}

impl Default for ChunkSpec {
    /// bf16 inputs, one dense row of 37 tokens (two full 16-token chunks and a partial one),
    /// one head, lower-bound gate, l2norm, no initial state (an f32 one when enabled).
    fn default() -> Self {
        ChunkSpec {
            dtype: DType::BF16,
            lengths: Lengths::Dense { b: 1, t: 37 },
            h: 1,
            hv: 1,
            gate: GateSpec::LowerBound,
            beta_rule: Beta::Sigmoid,
            beta: BetaSpec::Random,
            identical_keys: false,
            l2norm: true,
            initial: InitialSpec::None,
            state_dtype: DType::F32,
            prefix: None,
        }
    }
}

/// Where one sequence's state comes from and goes to.
struct Slot {
    /// Offset (in states of `HV` heads) of the initial state to read; `None` starts from zeros.
    read: Option<usize>,
    /// Offset of the final state to write; `None` is padding (nothing written, zero rows).
    write: Option<usize>,
}

/// One (sequence, value head)'s prepared inputs, token-major, `D` entries per token row.
struct HeadRows {
    /// Tokens.
    len: usize,
    /// `q^`: l2-normalized when enabled, not scaled (the scale enters where each form puts it).
    q: Vec<f64>,
    /// `k^`.
    k: Vec<f64>,
    /// `v`.
    v: Vec<f64>,
    /// Natural-log decay per channel, from the gate rule.
    g: Vec<f64>,
    /// Beta per token, by the beta rule.
    beta: Vec<f64>,
}

impl ChunkInputs {
    /// Sequences N: `cu_seqlens` entries less one for varlen, else `b`.
    pub fn sequences(&self) -> usize {
        match &self.cu_seqlens {
            Some(cu) => cu.len().saturating_sub(1),
            None => self.b,
        }
    }

    /// States held by `initial` (P of the pool with `state_indices`, N without; 0 when there is
    /// no initial state).
    pub fn pool_slots(&self) -> usize {
        match &self.initial {
            Some(s) if self.hv > 0 => s.len() / (self.hv * D * D),
            _ => 0,
        }
    }

    /// Random inputs drawn as `spec` says (docs/semantics.md, "Numerics and tests"): normal q, k,
    /// v and beta logits, the gate inputs of [`GateSpec`], the initial state of [`InitialSpec`].
    ///
    /// # Panics
    /// When `spec` cannot be drawn (a caller's bug): `hv` not a multiple of a nonzero `h`, or a
    /// pool with fewer slots than live sequences.
    pub fn random(rng: &mut Rng, spec: &ChunkSpec) -> ChunkInputs {
        let dt = spec.dtype;
        let (b, t, lens) = match &spec.lengths {
            Lengths::Dense { b, t } => (*b, *t, None),
            Lengths::Varlen(l) => (1, l.iter().sum(), Some(l.clone())),
        };
        let n_seq = lens.as_ref().map_or(b, |l| l.len());
        let (h, hv) = (spec.h, spec.hv);
        assert!(h > 0 && hv % h == 0, "ChunkSpec: hv ({hv}) must be a multiple of h ({h})");
        let q = rng.normals(b * t * h * D, dt);
        let mut k = rng.normals(b * t * h * D, dt);
        if !spec.l2norm {
            for row in k.chunks_mut(D) {
                let n = row.iter().map(|e| e * e).sum::<f64>().sqrt();
                row.iter_mut().for_each(|e| *e = round_to(*e / n, dt));
            }
        }
        if spec.identical_keys {
            for row in 0..b {
                let first = k[row * t * h * D..][..h * D].to_vec();
                for tok in 1..t {
                    k[(row * t + tok) * h * D..][..h * D].copy_from_slice(&first);
                }
            }
        }
        let v = rng.normals(b * t * hv * D, dt);
        let g = match spec.gate {
            GateSpec::LowerBound => rng.normals(b * t * hv * D, dt),
            GateSpec::Softplus => (0..b * t * hv * D).map(|_| round_to(-14.0 + 17.0 * rng.uniform(), dt)).collect(),
            GateSpec::Precomputed => (0..b * t * hv * D).map(|_| round_to(-softplus(rng.normal()), dt)).collect(),
            GateSpec::PrecomputedFixed(x) => vec![round_to(x, dt); b * t * hv * D],
        };
        let beta = match (spec.beta, spec.beta_rule) {
            (BetaSpec::Fixed(x), _) => vec![round_to(x, dt); b * t * hv],
            (BetaSpec::Random, Beta::Raw) => (0..b * t * hv).map(|_| round_to(sigmoid(rng.normal()), dt)).collect(),
            (BetaSpec::Random, _) => rng.normals(b * t * hv, dt),
        };
        let (a_log, dt_bias, gate) = match spec.gate {
            GateSpec::LowerBound => {
                let a_log = (0..hv).map(|_| round_to(rng.uniform() * 2.8, DType::F32)).collect();
                (Some(a_log), Some(rng.normals(hv * D, DType::F32)), Gate::LowerBound)
            }
            GateSpec::Softplus => {
                let a_log = (0..hv).map(|_| round_to(rng.uniform() * 1.6, DType::F32)).collect();
                let dt_bias = (0..hv * D).map(|_| round_to(0.5 * rng.normal(), DType::F32)).collect();
                (Some(a_log), Some(dt_bias), Gate::Softplus)
            }
            _ => (None, None, Gate::Precomputed),
        };
        let cu_seqlens = lens.map(|l| {
            let mut cu = vec![0i64];
            for n in l {
                cu.push(cu.last().copied().unwrap_or(0) + n as i64);
            }
            cu
        });
        let mut states = |slots: usize| -> Vec<f64> {
            (0..slots * hv * D * D).map(|_| round_to(rng.normal() * 0.1, spec.state_dtype)).collect()
        };
        let (writable, cached) = match spec.initial {
            InitialSpec::CachedPrefix { slots } => (slots - 1, Some(slots - 1)),
            InitialSpec::Pool { slots } => (slots, None),
            _ => (0, None),
        };
        let (initial, state_indices, has_initial) = match spec.initial {
            InitialSpec::None => (None, None, None),
            InitialSpec::PerSequence => (Some(states(n_seq)), None, None),
            InitialSpec::Pool { .. } | InitialSpec::CachedPrefix { .. } => {
                let (slots, total) = (writable, writable + usize::from(cached.is_some()));
                let pool = states(total);
                let live = (0..n_seq).filter(|n| n % 3 != 1).count();
                assert!(slots >= live, "InitialSpec::Pool: {slots} slots for {live} live sequences");
                // Distinct slots in random order (Fisher-Yates): the caller's contract (no slot written
                // twice), and slots that are not simply the sequence numbers.
                let mut perm: Vec<i64> = (0..slots as i64).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
                let (mut next, mut pads) = (0, 0);
                let idx = (0..n_seq)
                    .map(|n| {
                        if n % 3 == 1 {
                            pads += 1;
                            if pads % 2 == 1 {
                                -1
                            } else {
                                total as i64
                            }
                        } else {
                            next += 1;
                            perm[next - 1]
                        }
                    })
                    .collect();
                let has = (0..n_seq).map(|n| i64::from(n % 3 != 2)).collect();
                (Some(pool), Some(idx), Some(has))
            }
        };
        let read_indices = cached.map(|c| {
            let outside = c as i64 + 1;
            (0..n_seq).map(|n| if n % 4 == 3 { outside } else { c as i64 }).collect()
        });
        ChunkInputs {
            b,
            t,
            h,
            hv,
            q,
            k,
            v,
            g,
            gate,
            beta,
            beta_rule: spec.beta_rule,
            a_log,
            dt_bias,
            lower_bound: -5.0,
            scale: 1.0 / (D as f64).sqrt(),
            l2norm: spec.l2norm,
            cu_seqlens,
            initial,
            state_indices,
            read_indices,
            has_initial,
            prefix: spec.prefix.map(|p| {
                let total = n_seq * p.cols;
                let slot = |e: usize| match e % 7 {
                    1 => -1,
                    2 => total as i64,
                    _ => e as i64,
                };
                PrefixInputs {
                    lens: (0..n_seq).map(|n| [0, 1, 15, 16, 17, 33][n % 6]).collect(),
                    every: p.every,
                    slots: (0..total).map(slot).collect(),
                    cols: p.cols,
                    pool: vec![0.5; total * hv * D * D],
                }
            }),
        }
    }

    /// Sequence n's first token as a row of the flattened `[B * T]` tokens, and its length
    /// (`cu_seqlens` clamped into `[0, T]` as the kernel clamps it).
    pub fn span(&self, n: usize) -> (usize, usize) {
        match &self.cu_seqlens {
            Some(cu) => {
                let t = self.t as i64;
                let s0 = cu[n].clamp(0, t);
                let s1 = cu[n + 1].clamp(s0, t);
                (s0 as usize, (s1 - s0) as usize)
            }
            None => (n * self.t, self.t),
        }
    }

    /// Where sequence n's state is read from and written to (docs/semantics.md, "Prefill
    /// (chunk_kda)").
    fn slot(&self, n: usize) -> Slot {
        let starts = self.has_initial.as_ref().is_none_or(|h| h[n] != 0);
        let (p, have_state) = (self.pool_slots(), self.initial.is_some());
        let in_pool = |slot: i64| usize::try_from(slot).ok().filter(|s| *s < p);
        match &self.state_indices {
            Some(idx) => match in_pool(idx[n]) {
                Some(s) => {
                    let read = self.read_indices.as_ref().map_or(Some(s), |r| in_pool(r[n]));
                    Slot { read: read.filter(|_| starts && have_state), write: Some(s) }
                }
                None => Slot { read: None, write: None },
            },
            None => Slot { read: (starts && have_state).then_some(n), write: Some(n) },
        }
    }

    /// The gate (natural log, per channel) of value head `hv` at flattened token row `tok`.
    fn gate(&self, tok: usize, hv: usize) -> Vec<f64> {
        let a = &self.g[(tok * self.hv + hv) * D..][..D];
        let ea = self.a_log.as_ref().map_or(1.0, |a_log| a_log[hv].exp());
        let x = |j: usize| a[j] + self.dt_bias.as_ref().map_or(0.0, |dt| dt[hv * D + j]);
        match self.gate {
            Gate::LowerBound => (0..D).map(|j| self.lower_bound * sigmoid(ea * x(j))).collect(),
            Gate::Softplus => (0..D).map(|j| -ea * softplus(x(j))).collect(),
            Gate::Precomputed => a.to_vec(),
        }
    }

    /// The prepared inputs of `len` tokens from row `tok0` for value head `hv`.
    fn head_rows(&self, tok0: usize, len: usize, hv: usize) -> HeadRows {
        let h = hv / (self.hv / self.h);
        let mut r = HeadRows { len, q: vec![], k: vec![], v: vec![], g: vec![], beta: vec![] };
        for tok in tok0..tok0 + len {
            let qk = |x: &[f64]| {
                let row = &x[(tok * self.h + h) * D..][..D];
                if self.l2norm {
                    l2norm(row)
                } else {
                    row.to_vec()
                }
            };
            r.q.extend(qk(&self.q));
            r.k.extend(qk(&self.k));
            r.v.extend_from_slice(&self.v[(tok * self.hv + hv) * D..][..D]);
            r.g.extend(self.gate(tok, hv));
            let b = self.beta[tok * self.hv + hv];
            r.beta.push(match self.beta_rule {
                Beta::Raw => b,
                Beta::Sigmoid => sigmoid(b),
                Beta::TwoSigmoid => 2.0 * sigmoid(b),
            });
        }
        r
    }

    /// Runs `head` on every live (sequence, value head): it gets the prepared inputs, the
    /// initial state (V-first `[V * K]`, zeros when none) to advance in place, and the
    /// sequence's output rows (`[len * V]`) to fill.
    fn run(&self, head: impl Fn(&HeadRows, &mut [f64], &mut [f64])) -> ChunkOutputs {
        let (hvn, dd) = (self.hv, D * D);
        let mut out = vec![0.0; self.b * self.t * hvn * D];
        let mut fin = match (&self.state_indices, &self.initial) {
            (Some(_), Some(pool)) => pool.clone(),
            (Some(_), None) => vec![],
            (None, _) => vec![0.0; self.sequences() * hvn * dd],
        };
        let mut checkpoints = self.prefix.as_ref().map(|p| p.pool.clone()).unwrap_or_default();
        for n in 0..self.sequences() {
            let Slot { read, write: Some(w) } = self.slot(n) else {
                continue; // padding: zero rows, no state read or written
            };
            let (tok0, len) = self.span(n);
            let cuts = self.prefix.as_ref().map(|p| p.checkpoints_of(n, len, hvn)).unwrap_or_default();
            for hv in 0..hvn {
                let mut s = match (read, &self.initial) {
                    (Some(r), Some(init)) => init[(r * hvn + hv) * dd..][..dd].to_vec(),
                    _ => vec![0.0; dd],
                };
                // Up to each checkpoint, then to the end: the recurrence is the same in pieces.
                let mut done = 0;
                for &(upto, slot) in cuts.iter().chain(std::iter::once(&(len, usize::MAX))) {
                    let mut o = vec![0.0; (upto - done) * D];
                    head(&self.head_rows(tok0 + done, upto - done, hv), &mut s, &mut o);
                    for (i, row) in o.chunks(D).enumerate() {
                        out[((tok0 + done + i) * hvn + hv) * D..][..D].copy_from_slice(row);
                    }
                    if slot != usize::MAX {
                        checkpoints[(slot * hvn + hv) * dd..][..dd].copy_from_slice(&s);
                    }
                    done = upto;
                }
                fin[(w * hvn + hv) * dd..][..dd].copy_from_slice(&s);
            }
        }
        ChunkOutputs { out, final_state: fin, checkpoints }
    }
}

/// `chunk_kda` by the token recurrence in f64 (the step shared with decode's reference,
/// [`token_step`]); the state is carried unrounded through each sequence.
pub fn chunk_reference(inp: &ChunkInputs) -> ChunkOutputs {
    inp.run(|x, s_vf, o| {
        // token_step holds S K-first; the pool is V-first.
        let mut s = transpose(s_vf);
        for t in 0..x.len {
            let row = |buf: &[f64]| buf[t * D..(t + 1) * D].to_vec();
            let alpha: Vec<f64> = row(&x.g).iter().map(|g| g.exp()).collect();
            let q: Vec<f64> = row(&x.q).iter().map(|e| e * inp.scale).collect();
            let ot = token_step(&mut s, &alpha, &row(&x.k), &row(&x.v), &[x.beta[t]], &q);
            o[t * D..(t + 1) * D].copy_from_slice(&ot);
        }
        s_vf.copy_from_slice(&transpose(&s));
    })
}

/// `chunk_kda` by the kernels' per-chunk math (`chunk.rs`) in f64, chunks of `chunk` tokens
/// starting at each sequence's first token, the last partial chunk masked as the kernel masks
/// it (rows past the end get g = 0 after the gate, k = q = v = 0, beta = 0); gates in log2
/// units as the doc has them. Equals [`chunk_reference`] in real arithmetic for every chunk
/// size. In f64, `2^-G` stays finite (and `2^G` normal) while a chunk's gate sum stays above
/// -1022 in log2 units: the lower-bound rule at -5 keeps that up to `chunk = 128`
/// (`128 * 5 * 1.44 = 923`), a precomputed -20 per token up to `chunk = 32`
/// (`32 * 20 * 1.44 = 923`); past that the f64 form itself overflows, as the kernel's would in
/// f32 much sooner (`chunk.rs`, on the numerical range).
///
/// # Panics
/// When `chunk` is 0 (a caller's bug).
pub fn chunk_form(inp: &ChunkInputs, chunk: usize) -> ChunkOutputs {
    assert!(chunk > 0, "chunk_form: chunk size 0");
    let c = chunk;
    inp.run(|x, s, o| {
        for c0 in (0..x.len).step_by(c) {
            let rows = (x.len - c0).min(c);
            // Masked operands, C rows each; the zero rows past `rows` are the kernel's select.
            let (mut k, mut q, mut v, mut g, mut beta) =
                (vec![0.0; c * D], vec![0.0; c * D], vec![0.0; c * D], vec![0.0; c * D], vec![0.0; c]);
            let live = c0 * D..(c0 + rows) * D;
            k[..rows * D].copy_from_slice(&x.k[live.clone()]);
            q[..rows * D].copy_from_slice(&x.q[live.clone()]);
            v[..rows * D].copy_from_slice(&x.v[live.clone()]);
            g[..rows * D].copy_from_slice(&x.g[live]);
            beta[..rows].copy_from_slice(&x.beta[c0..c0 + rows]);
            // G_i = log2(e) * (inclusive cumsum of g within the chunk); Γ = G of the last valid row.
            let mut gc = vec![0.0; c * D];
            let mut acc = vec![0.0; D];
            for i in 0..c {
                for j in 0..D {
                    acc[j] += g[i * D + j];
                    gc[i * D + j] = std::f64::consts::LOG2_E * acc[j];
                }
            }
            // 2^Γ per key channel.
            let decay: Vec<f64> = gc[(rows - 1) * D..rows * D].iter().map(|e| e.exp2()).collect();
            let (mut kd, mut qd, mut ki, mut kr) =
                (vec![0.0; c * D], vec![0.0; c * D], vec![0.0; c * D], vec![0.0; c * D]);
            for e in 0..c * D {
                kd[e] = k[e] * gc[e].exp2();
                qd[e] = inp.scale * q[e] * gc[e].exp2();
                ki[e] = k[e] * (-gc[e]).exp2();
                kr[e] = ki[e] * decay[e % D];
            }
            // L = strict_lower(diag(beta) kd ki^T), Mqk = lower_incl_diag(qd ki^T).
            let mut l = gemm_f64(&kd, &ki, c, c, D, true);
            let mut mqk = gemm_f64(&qd, &ki, c, c, D, true);
            for i in 0..c {
                for j in 0..c {
                    l[i * c + j] = if j < i { beta[i] * l[i * c + j] } else { 0.0 };
                    if j > i {
                        mqk[i * c + j] = 0.0;
                    }
                }
            }
            // INV = (I + L)^-1 by forward substitution: row i of (I + L) X = I gives
            // X[i][j] = δij - Σ_{j <= m < i} L[i][m] X[m][j] (X is unit lower triangular).
            let mut inv = vec![0.0; c * c];
            for i in 0..c {
                inv[i * c + i] = 1.0;
                for j in 0..i {
                    inv[i * c + j] = -(j..i).map(|m| l[i * c + m] * inv[m * c + j]).sum::<f64>();
                }
            }
            // Vn = beta * (v - kd S^T), U = INV Vn, O = qd S^T + Mqk U (S is V x K).
            let w = gemm_f64(&kd, s, c, D, D, true);
            let vn: Vec<f64> = (0..c * D).map(|e| beta[e / D] * (v[e] - w[e])).collect();
            let u = gemm_f64(&inv, &vn, c, D, c, false);
            let o1 = gemm_f64(&qd, s, c, D, D, true);
            let o2 = gemm_f64(&mqk, &u, c, D, c, false);
            for e in 0..rows * D {
                o[c0 * D + e] = o1[e] + o2[e];
            }
            // S = S diag(2^Γ) + U^T kr.
            let ut = (0..D * c).map(|e| u[(e % c) * D + e / c]).collect::<Vec<_>>();
            let upd = gemm_f64(&ut, &kr, D, D, c, false);
            for (e, x) in s.iter_mut().enumerate() {
                *x = *x * decay[e % D] + upd[e];
            }
        }
    })
}

/// The transpose of a `D x D` matrix (row-major).
fn transpose(m: &[f64]) -> Vec<f64> {
    (0..D * D).map(|e| m[(e % D) * D + e / D]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::rel_err;

    /// The largest `||got - want|| / ||want||` over every (sequence, value head)'s output rows
    /// and every (state row, value head) of the final state (the whole pool with
    /// `state_indices`); an absolute norm where the reference is zero (padding, empty inputs).
    fn max_err(inp: &ChunkInputs, got: &ChunkOutputs, want: &ChunkOutputs) -> f64 {
        assert_eq!((got.out.len(), got.final_state.len()), (want.out.len(), want.final_state.len()));
        let mut worst: f64 = 0.0;
        for n in 0..inp.sequences() {
            let (tok0, len) = inp.span(n);
            for hv in 0..inp.hv {
                let rows = |o: &[f64]| -> Vec<f64> {
                    (tok0..tok0 + len).flat_map(|t| o[(t * inp.hv + hv) * D..][..D].to_vec()).collect()
                };
                worst = worst.max(rel_err(&rows(&got.out), &rows(&want.out)));
            }
        }
        for (a, b) in got.final_state.chunks(D * D).zip(want.final_state.chunks(D * D)) {
            worst = worst.max(rel_err(a, b));
        }
        // A NaN in the reference would compare as anything.
        assert!(want.out.iter().chain(&want.final_state).all(|e| e.is_finite()));
        worst
    }

    /// chunk_form at C = 1, 16, 32 against the token recurrence, 1e-9 relative.
    fn forms_agree(name: &str, inp: &ChunkInputs) {
        let want = chunk_reference(inp);
        assert!(want.out.iter().any(|&e| e != 0.0), "{name}: all-zero reference");
        for c in [1, 16, 32] {
            let err = max_err(inp, &chunk_form(inp, c), &want);
            assert!(err < 1e-9, "{name}: C = {c}: relative error {err:e}");
        }
    }

    fn spec_forms_agree(name: &str, spec: ChunkSpec, seed: u64) {
        forms_agree(name, &ChunkInputs::random(&mut Rng::new(seed), &spec));
    }

    fn dense(b: usize, t: usize) -> Lengths {
        Lengths::Dense { b, t }
    }

    #[test]
    fn chunk_ref_forms_agree_dense_lengths() {
        // Multiples of 16 and not; shorter than a chunk; tails of 1 and 15 at C = 16.
        for (b, t) in [(1, 37), (2, 32), (1, 48), (1, 1), (2, 15), (1, 17), (1, 80)] {
            spec_forms_agree(&format!("b{b} t{t}"), ChunkSpec { lengths: dense(b, t), ..ChunkSpec::default() }, 1);
        }
    }

    #[test]
    fn chunk_ref_forms_agree_varlen_gva_and_state() {
        let lens = Lengths::Varlen(vec![0, 1, 17, 0, 33, 16, 5]);
        let base = ChunkSpec { lengths: lens.clone(), ..ChunkSpec::default() };
        spec_forms_agree("varlen", base.clone(), 2);
        spec_forms_agree("gva2", ChunkSpec { h: 2, hv: 4, lengths: dense(2, 21), ..base.clone() }, 3);
        spec_forms_agree("gva4", ChunkSpec { h: 1, hv: 4, ..base.clone() }, 4);
        spec_forms_agree("initial", ChunkSpec { initial: InitialSpec::PerSequence, ..base.clone() }, 5);
        spec_forms_agree(
            "initial bf16 dense",
            ChunkSpec {
                lengths: dense(2, 19),
                initial: InitialSpec::PerSequence,
                state_dtype: DType::BF16,
                ..base.clone()
            },
            6,
        );
        spec_forms_agree(
            "pool f16",
            ChunkSpec {
                hv: 2,
                dtype: DType::F16,
                initial: InitialSpec::Pool { slots: 9 },
                state_dtype: DType::F16,
                ..base.clone()
            },
            7,
        );
        spec_forms_agree("l2norm off", ChunkSpec { l2norm: false, initial: InitialSpec::PerSequence, ..base }, 8);
    }

    #[test]
    fn chunk_ref_forms_agree_gates() {
        let base = ChunkSpec { lengths: Lengths::Varlen(vec![40, 0, 7, 33]), hv: 2, ..ChunkSpec::default() };
        spec_forms_agree("precomputed", ChunkSpec { gate: GateSpec::Precomputed, ..base.clone() }, 9);
        // -20 per token: 2^-G reaches 2^(16 * 20 * 1.44) ~ 1e139 at C = 16 and 2^923 ~ 1e278 at
        // C = 32, both finite in f64 (C = 64 would overflow: the kernel's element-wise form).
        spec_forms_agree(
            "precomputed -20",
            ChunkSpec { gate: GateSpec::PrecomputedFixed(-20.0), initial: InitialSpec::PerSequence, ..base.clone() },
            10,
        );
        // Every lower-bound gate at its bound (-5 per token): G reaches -230 (log2) at C = 32,
        // 2^230 ~ 1e69, fine in f64. A raw input of 30 saturates the sigmoid.
        let mut x = ChunkInputs::random(&mut Rng::new(11), &base);
        x.g.iter_mut().for_each(|e| *e = 30.0);
        forms_agree("lower bound saturated", &x);
        // No decay at all with identical keys and beta near 1 (the chunk solve's hard case for
        // the inverse): precomputed g = 0.
        let mut x =
            ChunkInputs::random(&mut Rng::new(12), &ChunkSpec { gate: GateSpec::PrecomputedFixed(0.0), ..base });
        let k0 = x.k[..D].to_vec();
        x.k.chunks_mut(D).for_each(|r| r.copy_from_slice(&k0));
        x.beta.iter_mut().for_each(|e| *e = 8.0);
        forms_agree("identical keys, no decay", &x);
    }

    #[test]
    fn chunk_ref_zero_length_keeps_initial_state() {
        let spec = ChunkSpec {
            lengths: Lengths::Varlen(vec![0, 5, 0]),
            hv: 2,
            initial: InitialSpec::PerSequence,
            ..ChunkSpec::default()
        };
        let x = ChunkInputs::random(&mut Rng::new(13), &spec);
        let init = x.initial.clone().unwrap_or_default();
        let hd = x.hv * D * D;
        for r in [chunk_reference(&x), chunk_form(&x, 16)] {
            for n in [0, 2] {
                assert_eq!(r.final_state[n * hd..(n + 1) * hd], init[n * hd..(n + 1) * hd], "sequence {n}");
            }
            assert_ne!(r.final_state[hd..2 * hd], init[hd..2 * hd]);
        }
        // Without an initial state, zeros.
        let x = ChunkInputs { initial: None, ..x };
        for r in [chunk_reference(&x), chunk_form(&x, 16)] {
            assert!(r.final_state[..hd].iter().chain(&r.final_state[2 * hd..]).all(|&e| e == 0.0));
        }
    }

    #[test]
    fn chunk_ref_pool_padding_and_has_initial() {
        // Sequences 1 and 4 are padding (slots -1 and P), 2 and 5 start from zeros.
        let spec = ChunkSpec {
            lengths: Lengths::Varlen(vec![9, 6, 20, 0, 3, 17]),
            hv: 2,
            initial: InitialSpec::Pool { slots: 7 },
            ..ChunkSpec::default()
        };
        let x = ChunkInputs::random(&mut Rng::new(14), &spec);
        let (idx, pool) = (x.state_indices.clone().unwrap_or_default(), x.initial.clone().unwrap_or_default());
        assert_eq!((idx[1], idx[4]), (-1, 7));
        assert_eq!(x.has_initial, Some(vec![1, 1, 0, 1, 1, 0]));
        let hd = x.hv * D * D;
        let live: Vec<usize> = [0, 2, 3, 5].iter().map(|&n| idx[n] as usize).collect();
        for r in [chunk_reference(&x), chunk_form(&x, 16)] {
            assert_eq!(r.final_state.len(), pool.len());
            // Slots no live sequence names are untouched, bit for bit.
            for s in (0..7).filter(|s| !live.contains(s)) {
                assert_eq!(r.final_state[s * hd..(s + 1) * hd], pool[s * hd..(s + 1) * hd], "slot {s}");
            }
            // Padding rows are exactly zero.
            for n in [1, 4] {
                let (tok0, len) = x.span(n);
                assert!(r.out[tok0 * x.hv * D..(tok0 + len) * x.hv * D].iter().all(|&e| e == 0.0), "sequence {n}");
            }
            // The zero-length live sequence 3 (has_initial 1) writes its slot's own state back.
            assert_eq!(r.final_state[live[2] * hd..(live[2] + 1) * hd], pool[live[2] * hd..(live[2] + 1) * hd]);
        }
        // has_initial = 0 is the same as starting from a zeroed slot.
        let mut zeroed = x.clone();
        let mut p = pool.clone();
        for n in [2, 5] {
            p[idx[n] as usize * hd..(idx[n] as usize + 1) * hd].iter_mut().for_each(|e| *e = 0.0);
        }
        zeroed.initial = Some(p);
        zeroed.has_initial = None;
        let (a, b) = (chunk_reference(&x), chunk_reference(&zeroed));
        assert_eq!(a.out, b.out);
        for n in [0, 2, 3, 5] {
            let s = idx[n] as usize;
            assert_eq!(a.final_state[s * hd..(s + 1) * hd], b.final_state[s * hd..(s + 1) * hd]);
        }
    }

    #[test]
    fn chunk_ref_dense_equals_varlen_packing() {
        // Batch invariance of the reference: B = 2 dense and the same rows as varlen agree bit
        // for bit (each sequence depends only on its own inputs).
        let x = ChunkInputs::random(
            &mut Rng::new(15),
            &ChunkSpec { lengths: dense(2, 19), hv: 2, initial: InitialSpec::PerSequence, ..ChunkSpec::default() },
        );
        let y = ChunkInputs { b: 1, t: 38, cu_seqlens: Some(vec![0, 19, 38]), ..x.clone() };
        assert_eq!(chunk_reference(&x), chunk_reference(&y));
        assert_eq!(chunk_form(&x, 16), chunk_form(&y, 16));
    }

    #[test]
    fn chunk_ref_matches_decode_ref() {
        // The same call through decode's reference (lower-bound gate, beta sigmoid, f32 state
        // and output, one final state per sequence): the conventions (gate, beta, scale, GVA,
        // V-first layout) agree; decode rounds its output and state to f32, hence 1e-6.
        use crate::decode::{DecodeConfig, Writes};
        use crate::decode_ref::{decode_ref, DecodeInputs};
        let x = ChunkInputs::random(
            &mut Rng::new(16),
            &ChunkSpec { lengths: dense(2, 6), h: 1, hv: 2, initial: InitialSpec::PerSequence, ..ChunkSpec::default() },
        );
        let cfg = DecodeConfig {
            out_dtype: DType::F32,
            indices: None,
            writes: Writes::FinalPerSequence,
            ..Default::default()
        };
        let d = DecodeInputs {
            b: x.b,
            t: x.t,
            h: x.h,
            hv: x.hv,
            q: x.q.clone(),
            k: x.k.clone(),
            v: x.v.clone(),
            a: x.g.clone(),
            beta: x.beta.clone(),
            a_log: x.a_log.clone().unwrap_or_default(),
            dt_bias: x.dt_bias.clone().unwrap_or_default(),
            pool: x.initial.clone().unwrap_or_default(),
            slots: x.sequences(),
            indices: vec![],
            cols: 1,
            cu_seqlens: vec![],
            accepted: vec![1; x.sequences()],
            scale: x.scale,
            lower_bound: x.lower_bound,
        };
        let (want, got) = (chunk_reference(&x), decode_ref(&cfg, &d));
        let got = ChunkOutputs { out: got.out, final_state: got.final_state, checkpoints: vec![] };
        let err = max_err(&x, &got, &want);
        assert!(err < 1e-6, "decode_ref vs chunk_reference: {err:e}");
    }
}
