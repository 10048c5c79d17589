//! The decode config families that `kda check` and the simulator suite run: one small call
//! (B, H, T ≤ 4; K = V = 128) per family, with inputs that keep the caller's contract (no two
//! tokens of a call write one slot, no sequence reads a slot another writes) unless the family is
//! about padding, where out-of-range slots must be skipped.

use crate::decode::{Beta, DecodeConfig, DecodeShape, Gate, Writes, MAX_ITEMS};
use crate::decode_ref::{random_inputs, DecodeInputs};
use kda_dsl::DType::{BF16, F16, F32, I32, I64};

/// One decode config family: a config and the inputs of one small call for it.
#[derive(Clone)]
pub struct DecodeFamily {
    /// Short name (`decode/<name>` in `kda check`).
    pub name: &'static str,
    /// The config under test.
    pub cfg: DecodeConfig,
    /// Inputs of one call from a seed.
    pub inputs: fn(&DecodeConfig, u64) -> DecodeInputs,
}

/// Error bounds `(output, state)` against the f64 reference (docs/semantics.md "Numerics to test
/// against"): 1e-4 when the value is f32 and computed from an f32 state, else 1e-2.
pub fn tolerance(cfg: &DecodeConfig) -> (f64, f64) {
    let state = if cfg.state_dtype == F32 { 1e-4 } else { 1e-2 };
    (if cfg.out_dtype == F32 { state } else { 1e-2 }, state)
}

/// Random inputs of a call of `b` rows of `t` tokens (or varlen `lens`) with a pool sized to the
/// call: with `state_indices`, each sequence gets its own slots (`[N, max tokens]` when it
/// writes per token or counts accepted tokens, else `[N]`), numbered from the top of the pool
/// down so that slot ≠ sequence; slot 0 is never used. Accepted counts are 1 for every sequence.
pub fn call_inputs(
    cfg: &DecodeConfig,
    (b, t, h, hv): (usize, usize, usize, usize),
    lens: &[usize],
    seed: u64,
) -> DecodeInputs {
    let n_seq = if cfg.varlen.is_some() { lens.len() } else { b };
    let tmax = if cfg.varlen.is_some() { lens.iter().copied().max().unwrap_or(1) } else { t };
    let per_token = cfg.writes == Writes::PoolPerToken || cfg.accepted.is_some();
    let cols = if cfg.indices.is_some() && per_token { tmax.max(1) } else { 1 };
    let slots = if cfg.indices.is_some() { n_seq * cols + 1 } else { n_seq + 1 };
    let mut x = random_inputs(cfg, b, t, h, hv, slots, lens, seed);
    if cfg.indices.is_some() {
        x.cols = cols;
        x.indices = (0..n_seq * cols).map(|i| (slots - 1 - i) as i64).collect();
    }
    x
}

/// Inputs of the [`call_inputs`] shape `B = 2, T = 2, H = 1, HV = 2`.
fn small(cfg: &DecodeConfig, seed: u64) -> DecodeInputs {
    call_inputs(cfg, (2, 2, 1, 2), &[], seed)
}

/// The base of the feature families: the default config with an f32 output, so that both
/// output and state are held to the f32 bound, and blocks that take several sequences in turn
/// (the one-wave grid, whose pipeline crosses sequences).
fn base() -> DecodeConfig {
    DecodeConfig {
        out_dtype: F32,
        shape: DecodeShape { max_items: MAX_ITEMS, ..DecodeConfig::default().shape },
        ..DecodeConfig::default()
    }
}

/// Every decode family, in a stable order.
pub fn decode_families() -> Vec<DecodeFamily> {
    let fam = |name, cfg, inputs| DecodeFamily { name, cfg, inputs };
    let d = DecodeConfig::default();
    let b = base();
    let mut out = vec![
        fam("default", d.clone(), |c, s| call_inputs(c, (3, 2, 2, 2), &[], s)),
        fam("f16_in_f32_out", DecodeConfig { dtype: F16, ..b.clone() }, small),
        fam("bf16_state", DecodeConfig { state_dtype: BF16, ..d.clone() }, |c, s| call_inputs(c, (2, 4, 1, 2), &[], s)),
        fam("bf16_state_f32_out", DecodeConfig { state_dtype: BF16, ..b.clone() }, small),
        fam("k_first", DecodeConfig { v_first: false, ..b.clone() }, small),
        fam("k_first_bf16_state", DecodeConfig { v_first: false, state_dtype: BF16, ..b.clone() }, small),
        // bv = 8 does not lower: an [8 x 128] fragment does not fit m16n8 atoms.
        fam("bv32", DecodeConfig { shape: DecodeShape { rows: 32, ..b.shape }, ..b.clone() }, small),
        fam(
            "k_first_bv32",
            DecodeConfig { v_first: false, shape: DecodeShape { rows: 32, ..b.shape }, ..b.clone() },
            small,
        ),
    ];
    // Gate rules with and without A_log / dt_bias (the precomputed rule ignores both).
    for (name, gate, a_log, dt_bias) in [
        ("gate_lb_alog_dtf32", Gate::LowerBound, true, Some(F32)),
        ("gate_lb_alog_dtbf16", Gate::LowerBound, true, Some(BF16)),
        ("gate_lb_alog", Gate::LowerBound, true, None),
        ("gate_lb_dtf32", Gate::LowerBound, false, Some(F32)),
        ("gate_lb_dtbf16", Gate::LowerBound, false, Some(BF16)),
        ("gate_lb", Gate::LowerBound, false, None),
        ("gate_softplus_alog_dtf32", Gate::Softplus, true, Some(F32)),
        ("gate_softplus_alog_dtbf16", Gate::Softplus, true, Some(BF16)),
        ("gate_softplus_alog", Gate::Softplus, true, None),
        ("gate_softplus_dtf32", Gate::Softplus, false, Some(F32)),
        ("gate_softplus_dtbf16", Gate::Softplus, false, Some(BF16)),
        ("gate_softplus", Gate::Softplus, false, None),
        ("gate_precomputed", Gate::Precomputed, false, None),
        ("gate_precomputed_alog_dtf32_ignored", Gate::Precomputed, true, Some(F32)),
    ] {
        out.push(fam(name, DecodeConfig { gate, a_log, dt_bias, ..b.clone() }, small));
    }
    for (name, beta, beta_headwise) in [
        ("beta_raw", Beta::Raw, false),
        ("beta_sigmoid", Beta::Sigmoid, false),
        ("beta_two_sigmoid", Beta::TwoSigmoid, false),
        ("beta_raw_headwise", Beta::Raw, true),
        ("beta_sigmoid_headwise", Beta::Sigmoid, true),
        ("beta_two_sigmoid_headwise", Beta::TwoSigmoid, true),
    ] {
        out.push(fam(name, DecodeConfig { beta, beta_headwise, ..b.clone() }, small));
    }
    out.extend([
        fam("no_l2norm", DecodeConfig { l2norm: false, ..b.clone() }, small),
        // Varlen: a zero-length sequence writes nothing; per-token slots `[N, max len]`.
        fam("varlen_cu_i32", DecodeConfig { varlen: Some(I32), ..b.clone() }, |c, s| {
            call_inputs(c, (0, 0, 1, 2), &[2, 0, 1, 3], s)
        }),
        fam("varlen_cu_i64_idx_i64", DecodeConfig { varlen: Some(I64), indices: Some(I64), ..b.clone() }, |c, s| {
            call_inputs(c, (0, 0, 2, 2), &[0, 3, 1], s)
        }),
        // A zero-length sequence's final state is its initial state.
        fam(
            "varlen_final_per_sequence",
            DecodeConfig { varlen: Some(I32), indices: None, writes: Writes::FinalPerSequence, ..b.clone() },
            |c, s| call_inputs(c, (0, 0, 1, 2), &[2, 0, 3], s),
        ),
        // `[B]` indices (T = 1): a negative and a past-the-pool read slot are padding.
        fam("indices_b_i32_padding", b.clone(), |c, s| {
            let mut x = call_inputs(c, (4, 1, 1, 2), &[], s);
            x.indices[1] = -1;
            x.indices[3] = x.slots as i64 + 3;
            x
        }),
        fam("indices_b_i64_padding", DecodeConfig { indices: Some(I64), ..b.clone() }, |c, s| {
            let mut x = call_inputs(c, (4, 1, 1, 2), &[], s);
            x.indices[0] = x.slots as i64;
            x.indices[2] = -7;
            x
        }),
        // `[B, T]` indices: padding read slots, and -1 / past-the-pool write slots that are skipped.
        fam("indices_bt_i32_padding", b.clone(), |c, s| {
            let mut x = call_inputs(c, (3, 3, 1, 2), &[], s);
            x.indices[1] = -1; // row 0 skips the write of token 1
            x.indices[3] = -1; // row 1 is padding
            x.indices[8] = x.slots as i64; // row 2 skips the write of token 2
            x
        }),
        fam("indices_bt_i64_padding", DecodeConfig { indices: Some(I64), ..b.clone() }, |c, s| {
            let mut x = call_inputs(c, (3, 3, 1, 2), &[], s);
            x.indices[0] = x.slots as i64 + 9; // row 0 is padding
            x.indices[5] = -1;
            x.indices[7] = -1;
            x
        }),
        // Speculative decoding: every count 1..=T across the batch.
        fam("spec_accepted_i32", DecodeConfig { accepted: Some(I32), ..b.clone() }, |c, s| {
            let mut x = call_inputs(c, (4, 4, 1, 2), &[], s);
            x.accepted = vec![3, 1, 4, 2];
            x
        }),
        fam(
            "spec_accepted_i64_idx_i64_bf16_state",
            DecodeConfig { accepted: Some(I64), indices: Some(I64), state_dtype: BF16, ..b.clone() },
            |c, s| {
                let mut x = call_inputs(c, (3, 3, 1, 2), &[], s);
                x.accepted = vec![2, 3, 1];
                x
            },
        ),
        // The launch shapes the API picks for many sequences and for several tokens each.
        fam("many_sequences_shape", d.clone().with_launch_shape_for(false, 8), |c, s| {
            call_inputs(c, (4, 1, 2, 2), &[], s)
        }),
        fam(
            "many_sequences_shape_bf16_state",
            DecodeConfig { state_dtype: BF16, ..d.clone() }.with_launch_shape_for(false, 8),
            |c, s| call_inputs(c, (4, 1, 1, 2), &[], s),
        ),
        fam(
            "multi_token_shape_spec",
            DecodeConfig { accepted: Some(I32), ..d.clone() }.with_launch_shape_for(true, 4),
            |c, s| {
                let mut x = call_inputs(c, (4, 4, 1, 2), &[], s);
                x.accepted = vec![3, 1, 4, 2];
                x
            },
        ),
        // State rows across whole warps: 16 rows on each of two warps, 8 on one, 4 on each of two.
        fam(
            "rows_across_lanes_32x2",
            DecodeConfig { shape: DecodeShape { lanes_per_row: 32, ..b.shape }, ..b.clone() },
            |c, s| call_inputs(c, (3, 2, 1, 2), &[], s),
        ),
        fam(
            "rows_across_lanes_8x1",
            DecodeConfig { shape: DecodeShape { lanes_per_row: 32, rows: 8, warps: 1, ..d.shape }, ..d.clone() },
            |c, s| call_inputs(c, (2, 1, 2, 2), &[], s),
        ),
        fam(
            "rows_across_lanes_8x2_spec",
            DecodeConfig {
                accepted: Some(I32),
                shape: DecodeShape { lanes_per_row: 32, rows: 8, warps: 2, ..b.shape },
                ..b.clone()
            },
            |c, s| {
                let mut x = call_inputs(c, (3, 3, 1, 2), &[], s);
                x.accepted = vec![2, 3, 1];
                x
            },
        ),
        // One state per token (not in place); rows of a padded sequence are zero.
        fam("final_per_token", DecodeConfig { writes: Writes::FinalPerToken, ..b.clone() }, |c, s| {
            let mut x = call_inputs(c, (3, 2, 1, 2), &[], s);
            x.indices[1] = -2;
            x
        }),
        fam(
            "final_per_token_varlen",
            DecodeConfig { writes: Writes::FinalPerToken, varlen: Some(I64), ..b.clone() },
            |c, s| call_inputs(c, (0, 0, 1, 2), &[1, 0, 3], s),
        ),
        fam(
            "final_per_sequence",
            DecodeConfig { indices: None, writes: Writes::FinalPerSequence, ..b.clone() },
            |c, s| call_inputs(c, (2, 3, 1, 2), &[], s),
        ),
        fam(
            "pool_per_sequence",
            DecodeConfig { indices: None, writes: Writes::PoolPerSequence, ..b.clone() },
            |c, s| call_inputs(c, (2, 3, 1, 2), &[], s),
        ),
        fam("no_writes", DecodeConfig { writes: Writes::None, ..b.clone() }, small),
        fam("no_initial_state", DecodeConfig { use_initial_state: false, ..b.clone() }, small),
        fam(
            "no_initial_state_varlen_final",
            DecodeConfig {
                use_initial_state: false,
                varlen: Some(I32),
                indices: None,
                writes: Writes::FinalPerSequence,
                ..b.clone()
            },
            |c, s| call_inputs(c, (0, 0, 1, 2), &[1, 0, 2], s),
        ),
        // Grouped value heads: HV = G * H.
        fam("gva1", b.clone(), |c, s| call_inputs(c, (2, 2, 2, 2), &[], s)),
        fam("gva2", b.clone(), |c, s| call_inputs(c, (2, 2, 2, 4), &[], s)),
        fam("gva4", b, |c, s| call_inputs(c, (2, 2, 1, 4), &[], s)),
    ]);
    out
}
