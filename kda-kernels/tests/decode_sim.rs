//! The decode kernel through the simulator: every config family of `decode_families()` against
//! the f64 reference, and the identities of docs/semantics.md (one call of T tokens equals T calls
//! of one, speculative decoding continues from the accepted token's state, out-of-range indices, counts
//! and `cu_seqlens` are clamped like the reference and never leave their buffers).

use kda_dsl::DType::{BF16, F32, I32, I64};
use kda_kernels::check::{check_decode, simulate_decode};
use kda_kernels::decode::{DecodeConfig, Writes};
use kda_kernels::decode_families::{call_inputs, decode_families, tolerance};
use kda_kernels::decode_ref::{decode_ref, DecodeInputs, D};

/// The f32-output, f32-state config the identity tests start from.
fn base() -> DecodeConfig {
    DecodeConfig { out_dtype: F32, ..DecodeConfig::default() }
}

/// Simulates one call and compares it with the reference: errors within [`tolerance`], padding
/// rows exactly zero, no NaN (unwritten outputs), and pool slots the reference leaves alone
/// bit-identical. Returns the printed row, `Err` holding it on failure.
fn check(name: &str, cfg: &DecodeConfig, x: &DecodeInputs) -> Result<String, String> {
    let c = check_decode(cfg, x).map_err(|e| format!("{name}: simulator error: {e}"))?;
    let want = decode_ref(cfg, x);
    let slot = x.hv * D * D;
    let stray = (0..x.slots)
        .filter(|s| {
            let r = s * slot..(s + 1) * slot;
            want.pool[r.clone()] == x.pool[r.clone()] && c.got.pool[r.clone()] != x.pool[r]
        })
        .count();
    let (to, ts) = tolerance(cfg);
    let row = format!(
        "{name:<40} out {:.2e} pool {:.2e} final {:.2e} (bounds {to:.0e}/{ts:.0e}) padding {} stray slots {stray}",
        c.out_err, c.pool_err, c.final_err, c.nonzero_padding_rows
    );
    let ok = c.out_err <= to && c.pool_err <= ts && c.final_err <= ts && c.nonzero_padding_rows == 0 && stray == 0;
    eprintln!("{row}{}", if ok { "" } else { "  FAIL" });
    if ok {
        Ok(row)
    } else {
        Err(row)
    }
}

/// Every family (seeded by its position, as `kda check` does); fails listing every failing row.
#[test]
fn every_decode_family_matches_the_reference() {
    let failures: Vec<String> = decode_families()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| check(f.name, &f.cfg, &(f.inputs)(&f.cfg, i as u64)).err())
        .collect();
    assert!(failures.is_empty(), "failing families:\n{}", failures.join("\n"));
}

/// Token `ti` of a non-varlen call as a call of one token (indices and pool kept).
fn token(x: &DecodeInputs, ti: usize) -> DecodeInputs {
    let pick = |buf: &[f64], w: usize| -> Vec<f64> {
        (0..x.b).flat_map(|n| buf[(n * x.t + ti) * w..(n * x.t + ti + 1) * w].iter().copied()).collect()
    };
    let bw = x.beta.len() / (x.b * x.t * x.hv);
    DecodeInputs {
        t: 1,
        q: pick(&x.q, x.h * D),
        k: pick(&x.k, x.h * D),
        v: pick(&x.v, x.hv * D),
        a: pick(&x.a, x.hv * D),
        beta: pick(&x.beta, x.hv * bw),
        ..x.clone()
    }
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|e| e.to_bits()).collect()
}

/// One call of T tokens with per-token in-place indices `[B, T]` equals T calls of one token,
/// bit for bit, the pool chained between calls (slot `idx[n, t-1]` copied to `idx[n, t]`
/// before call t, which reads and writes `idx[n, t]`).
fn one_call_equals_single_token_calls(cfg: DecodeConfig) {
    let (b, t) = (2, 3);
    let x = call_inputs(&cfg, (b, t, 1, 2), &[], 7);
    check("one call of T tokens", &cfg, &x).unwrap();
    let all = simulate_decode(&cfg, &x).unwrap();
    let (slot, row) = (x.hv * D * D, x.hv * D);
    let mut pool = x.pool.clone();
    for ti in 0..t {
        let mut xt = token(&x, ti);
        xt.indices = (0..b).map(|n| x.indices[n * t + ti]).collect();
        xt.cols = 1;
        if ti > 0 {
            for n in 0..b {
                let (src, dst) = (x.indices[n * t + ti - 1] as usize, xt.indices[n] as usize);
                pool.copy_within(src * slot..(src + 1) * slot, dst * slot);
            }
        }
        xt.pool = pool;
        let one = simulate_decode(&cfg, &xt).unwrap();
        for n in 0..b {
            let r = (n * t + ti) * row;
            assert_eq!(bits(&one.out[n * row..(n + 1) * row]), bits(&all.out[r..r + row]), "out of token {ti} row {n}");
        }
        pool = one.pool;
    }
    assert!(bits(&pool) == bits(&all.pool), "pools differ");
}

#[test]
fn t_tokens_in_one_call_equal_t_single_token_calls_f32_state() {
    one_call_equals_single_token_calls(base());
}

#[test]
fn t_tokens_in_one_call_equal_t_single_token_calls_bf16_state() {
    one_call_equals_single_token_calls(DecodeConfig { state_dtype: BF16, ..base() });
    one_call_equals_single_token_calls(DecodeConfig { state_dtype: BF16, v_first: false, ..DecodeConfig::default() });
}

/// Speculative decoding: call 1 writes the state after each token to `idx[n, t]`; call 2 with
/// `num_accepted_tokens = j` and the same index rows gives, bit for bit, what a plain call
/// reading `idx[n, j-1]` (the state after token j of call 1) gives.
fn speculative_continues_from_the_accepted_state(idx: kda_dsl::DType, state: kda_dsl::DType) {
    let (b, t) = (4, 4);
    let cfg1 = DecodeConfig { indices: Some(idx), state_dtype: state, ..base() };
    let x1 = call_inputs(&cfg1, (b, t, 1, 2), &[], 11);
    check("speculative call 1", &cfg1, &x1).unwrap();
    let p1 = simulate_decode(&cfg1, &x1).unwrap().pool;
    let cfg2 = DecodeConfig { accepted: Some(idx), ..cfg1.clone() };
    let mut x2 = call_inputs(&cfg2, (b, t, 1, 2), &[], 12);
    (x2.pool, x2.indices, x2.accepted) = (p1, x1.indices.clone(), vec![2, 4, 1, 3]);
    check("speculative call 2", &cfg2, &x2).unwrap();
    let spec = simulate_decode(&cfg2, &x2).unwrap();
    let cfg3 = DecodeConfig { writes: Writes::FinalPerToken, ..cfg1 };
    let mut x3 = x2.clone();
    x3.indices = (0..b).map(|n| x1.indices[n * t + x2.accepted[n] as usize - 1]).collect();
    x3.cols = 1;
    let plain = simulate_decode(&cfg3, &x3).unwrap();
    assert!(bits(&spec.out) == bits(&plain.out), "outputs differ");
    let slot = x1.hv * D * D;
    for n in 0..b {
        for ti in 0..t {
            let (s, f) = (x1.indices[n * t + ti] as usize, n * t + ti);
            assert!(
                bits(&spec.pool[s * slot..(s + 1) * slot]) == bits(&plain.final_state[f * slot..(f + 1) * slot]),
                "state after token {ti} of row {n}"
            );
        }
    }
}

#[test]
fn speculative_decoding_continues_from_the_accepted_token_i32_f32_state() {
    speculative_continues_from_the_accepted_state(I32, F32);
}

#[test]
fn speculative_decoding_continues_from_the_accepted_token_i64_bf16_state() {
    speculative_continues_from_the_accepted_state(I64, BF16);
}

/// A speculative call (B = 4, T = 3, `[B, T]` indices) with the given index values and counts.
fn spec_call(idx: kda_dsl::DType, indices: &[(usize, i64)], accepted: [i64; 4]) -> (DecodeConfig, DecodeInputs) {
    let cfg = DecodeConfig { indices: Some(idx), accepted: Some(idx), ..base() };
    let mut x = call_inputs(&cfg, (4, 3, 1, 2), &[], 21);
    for &(i, v) in indices {
        x.indices[i] = v;
    }
    x.accepted = accepted.to_vec();
    (cfg, x)
}

#[test]
fn out_of_range_i32_indices_and_counts_stay_in_the_pool() {
    let (t, big) = (3i64, 1_000_000);
    // Row 0: count 0 reads column 0, out of range: padding. Row 1: count -3 reads column 0;
    // writes of tokens 1, 2 go to -5 and i32::MAX: skipped. Row 2: count T+5 reads column T-1.
    // Row 3: count i32::MAX reads column T-1 = i32::MIN: padding.
    let idx = [(0, big), (4, -5), (5, i32::MAX as i64), (11, i32::MIN as i64)];
    let (cfg, x) = spec_call(I32, &idx, [0, -3, t + 5, i32::MAX as i64]);
    check("oob i32 indices and counts", &cfg, &x).unwrap();
    // Without counts: `[B, T]` indices far out of range in read and write columns.
    let cfg = base();
    let mut x = call_inputs(&cfg, (3, 3, 1, 2), &[], 22);
    (x.indices[0], x.indices[4], x.indices[5], x.indices[7]) = (-5, big, -1, i32::MIN as i64);
    check("oob i32 indices", &cfg, &x).unwrap();
}

#[test]
fn out_of_range_i64_indices_and_counts_stay_in_the_pool() {
    let (t, p32) = (3i64, 1i64 << 32);
    // Values that an i32 truncation would turn into slots 0, 1, 2 must stay out of range.
    let idx = [(0, p32), (4, p32 + 1), (5, -p32 + 2), (11, i64::MIN)];
    let (cfg, mut x) = spec_call(I64, &idx, [0, -3, t + 5, 2]);
    x.indices[8] = x.indices[6]; // row 2 reads column T-1; keep it live (and written once)
    x.indices[6] = 1 << 40;
    check("oob i64 indices and counts", &cfg, &x).unwrap();
    // `[B]` indices with one state per token: padded rows' states are zero.
    let cfg = DecodeConfig { indices: Some(I64), writes: Writes::FinalPerToken, ..base() };
    let mut x = call_inputs(&cfg, (3, 2, 1, 2), &[], 23);
    (x.indices[0], x.indices[2]) = (p32, -2 * p32 + 1);
    check("oob i64 [B] indices, final per token", &cfg, &x).unwrap();
}

#[test]
fn out_of_range_cu_seqlens_are_clamped_like_the_reference() {
    for (varlen, cu) in [(I32, vec![-7, 2, 2, 1_000_000]), (I64, vec![-7, 2, 2, i32::MAX as i64])] {
        let cfg = DecodeConfig { varlen: Some(varlen), ..base() };
        let mut x = call_inputs(&cfg, (0, 0, 1, 2), &[2, 0, 2], 24);
        x.cu_seqlens = cu;
        check(&format!("cu_seqlens {varlen:?} out of range"), &cfg, &x).unwrap();
    }
}

// Regressions: decode.rs converted i64 counts and `cu_seqlens` with `as i32` before clamping,
// so a value beyond 2^31 wrapped to a small in-range value instead of clamping like the
// reference (memory stayed in bounds, the semantics did not). Clamp in the index type, then
// convert.

/// `num_accepted_tokens` (i64) = 2^32 + 1 clamps to T (column T-1, a padding slot here), not to
/// 1 (column 0, a live slot) as a wrapping cast would.
#[test]
fn i64_count_beyond_i32_is_clamped_like_the_reference() {
    let (cfg, x) = spec_call(I64, &[(11, -1)], [1, 2, 3, (1 << 32) + 1]);
    check("i64 count 2^32 + 1", &cfg, &x).unwrap();
}

/// i64 `cu_seqlens` beyond 2^31 clamp to [0, S]; a wrapping cast would turn 2^33 into 0 (the
/// last sequence loses its tokens: unwritten output rows) and -2^32 + 3 into 3.
#[test]
fn i64_cu_seqlens_beyond_i32_are_clamped_like_the_reference() {
    let cfg = DecodeConfig { varlen: Some(I64), ..base() };
    let mut x = call_inputs(&cfg, (0, 0, 1, 2), &[2, 0, 2], 24);
    x.cu_seqlens = vec![-(1 << 32) + 3, 2, 2, 1 << 33];
    check("i64 cu_seqlens beyond 2^31", &cfg, &x).unwrap();
}

/// T = 0 with a per-sequence final state: the launch still runs (the final state is the
/// initial one) and reads nothing of the empty token tensors.
#[test]
fn zero_tokens_copy_the_initial_state_and_read_no_token() {
    for cfg in [
        DecodeConfig { indices: None, writes: Writes::FinalPerSequence, ..base() },
        DecodeConfig { indices: None, writes: Writes::FinalPerSequence, beta_headwise: true, ..base() },
    ] {
        let x = call_inputs(&cfg, (3, 0, 1, 2), &[], 21);
        check("T = 0", &cfg, &x).unwrap();
    }
}

/// NaN and infinities in one sequence's token inputs and pool slot leave every other
/// sequence's output rows and pool slot bit-identical (and unused slots untouched).
#[test]
fn decode_isolation() {
    use kda_kernels::decode_ref::random_inputs;
    let cfg = base();
    let (b, h, hv, slots) = (4, 1, 2, 6);
    let mut clean = random_inputs(&cfg, b, 1, h, hv, slots, &[], 41);
    clean.indices = vec![3, 0, 5, 1];
    let mut dirty = clean.clone();
    let bad = |v: &mut [f64]| {
        v.iter_mut().enumerate().for_each(|(i, e)| *e = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][i % 3])
    };
    // Sequence 1 (slot 0).
    bad(&mut dirty.q[h * D..2 * h * D]);
    bad(&mut dirty.k[h * D..2 * h * D]);
    bad(&mut dirty.v[hv * D..2 * hv * D]);
    bad(&mut dirty.a[hv * D..2 * hv * D]);
    bad(&mut dirty.beta[hv..2 * hv]);
    let slot = hv * D * D;
    bad(&mut dirty.pool[0..slot]);
    let a = simulate_decode(&cfg, &clean).expect("simulates");
    let z = simulate_decode(&cfg, &dirty).expect("simulates");
    let row = hv * D;
    assert!(z.out[row..2 * row].iter().any(|v| !v.is_finite()), "the poisoned sequence stayed finite");
    for n in [0, 2, 3] {
        assert!(
            bits(&a.out[n * row..(n + 1) * row]) == bits(&z.out[n * row..(n + 1) * row]),
            "sequence {n}'s output changed"
        );
    }
    for s in [1, 2, 3, 4, 5] {
        let r = s * slot..(s + 1) * slot;
        assert!(bits(&a.pool[r.clone()]) == bits(&z.pool[r]), "pool slot {s} changed");
    }
}
