//! CPU-only tests of `chunk_kda` validation (`plan_chunk`): every branch of the reference, every
//! check docs/semantics.md adds, and the plans valid calls resolve to.

use kda_dsl::dtype::DType::{self, BF16, F16, F32, I32, I64};
use kda_runtime::chunk::{plan_chunk, ChunkArgs, ChunkError, ChunkGate, ChunkPlan, FinalState, InitialState};
use kda_runtime::{RuntimeError, TensorView};

const D: usize = 128;
const H: usize = 2;
const HV: usize = 4;

/// A view at `0x1000 * id` (16-byte aligned) on device 0.
fn tv(id: u64, shape: &[usize], dtype: DType) -> TensorView {
    // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(0x1000 * id, shape, dtype, 0) }.expect("valid view")
}

/// A view on another device.
fn on(device: usize, x: TensorView) -> TensorView {
    // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(x.ptr(), x.shape(), x.dtype(), device) }.expect("valid view")
}

/// A view at a given (possibly misaligned) address.
fn at(ptr: u64, x: TensorView) -> TensorView {
    // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(ptr, x.shape(), x.dtype(), x.device()) }.expect("valid view")
}

/// The required tensors of a call: H = 2, HV = 4, D = 128.
struct Case {
    q: TensorView,
    k: TensorView,
    v: TensorView,
    g: TensorView,
    beta: TensorView,
    cu: Option<TensorView>,
}

impl Case {
    /// Dense: `B` sequences of `T` tokens, bf16.
    fn new(b: usize, t: usize) -> Self {
        Self::dense(b, t, BF16)
    }

    /// Dense of `dtype`.
    fn dense(b: usize, t: usize, dtype: DType) -> Self {
        Case {
            q: tv(1, &[b, t, H, D], dtype),
            k: tv(2, &[b, t, H, D], dtype),
            v: tv(3, &[b, t, HV, D], dtype),
            g: tv(4, &[b, t, HV, D], dtype),
            beta: tv(5, &[b, t, HV], dtype),
            cu: None,
        }
    }

    /// Varlen over `s` tokens and `n` sequences (`cu_seqlens` `[n + 1]` of `cu_dtype`), in the
    /// `[S, ..]` form when `flat`, else `[1, S, ..]`; bf16.
    fn varlen(s: usize, n: usize, cu_dtype: DType, flat: bool) -> Self {
        let lead: &[usize] = if flat { &[s] } else { &[1, s] };
        let with = |tail: &[usize]| [lead, tail].concat();
        Case {
            q: tv(1, &with(&[H, D]), BF16),
            k: tv(2, &with(&[H, D]), BF16),
            v: tv(3, &with(&[HV, D]), BF16),
            g: tv(4, &with(&[HV, D]), BF16),
            beta: tv(5, &with(&[HV]), BF16),
            cu: Some(tv(6, &[n + 1], cu_dtype)),
        }
    }

    fn run<'s>(&'s self, f: impl FnOnce(&mut ChunkArgs<'s>)) -> Result<ChunkPlan, ChunkError> {
        let mut args = ChunkArgs::new(&self.q, &self.k, &self.v, &self.g, &self.beta);
        args.cu_seqlens = self.cu.as_ref();
        f(&mut args);
        plan_chunk(&args)
    }

    fn plan<'s>(&'s self, f: impl FnOnce(&mut ChunkArgs<'s>)) -> ChunkPlan {
        self.run(f).expect("valid call")
    }
}

/// Asserts the error names `arg` and its message contains `phrase`.
fn err(r: Result<ChunkPlan, ChunkError>, arg: &str, phrase: &str) -> ChunkError {
    let e = r.expect_err("expected an error");
    assert_eq!(e.arg(), arg, "{e}");
    assert!(e.message().contains(phrase), "{e}");
    e
}

/// Like [`err`], for the whole message.
fn err_eq(r: Result<ChunkPlan, ChunkError>, arg: &str, message: &str) -> ChunkError {
    let e = r.expect_err("expected an error");
    assert_eq!((e.arg(), e.message()), (arg, message), "{e}");
    e
}

fn is_unsupported(e: &ChunkError) -> bool {
    matches!(e, ChunkError::Unsupported { .. })
}

/// A state `[n, HV, D, D]` of `dtype`.
fn state(id: u64, n: usize, dtype: DType) -> TensorView {
    tv(id, &[n, HV, D, D], dtype)
}

// ---- reference branches, in the reference's order ----

#[test]
fn dense_inputs_must_be_4d() {
    let c = Case::new(2, 3);
    let r3 = tv(9, &[2, 3, D], BF16);
    err_eq(c.run(|a| a.q = &r3), "q", "q must be a 4D tensor [B, T, H, 128].");
    err_eq(c.run(|a| a.k = &r3), "k", "k must be a 4D tensor [B, T, H, 128].");
    err_eq(c.run(|a| a.v = &r3), "v", "v must be a 4D tensor [B, T, H, 128].");
    err_eq(c.run(|a| a.g = &r3), "g", "g must be a 4D tensor [B, T, H, 128].");
}

#[test]
fn varlen_4d_inputs_need_leading_batch_of_one() {
    let c = Case::varlen(5, 2, I32, false);
    let q2 = tv(9, &[2, 5, H, D], BF16);
    let msg = "q.shape[0] must be 1 when cu_seqlens is provided; flatten variable-length input as [S, H, 128].";
    let e = err_eq(c.run(|a| a.q = &q2), "q", msg);
    assert!(!is_unsupported(&e));
    let g2 = tv(9, &[2, 5, HV, D], BF16);
    err(c.run(|a| a.g = &g2), "g", "g.shape[0] must be 1 when cu_seqlens is provided");
}

#[test]
fn varlen_inputs_must_be_3d_or_4d() {
    let c = Case::varlen(5, 2, I32, true);
    let r2 = tv(9, &[5, D], BF16);
    err_eq(c.run(|a| a.q = &r2), "q", "q must be [S, H, 128] or [1, S, H, 128] for varlen.");
    let r5 = tv(9, &[1, 1, 5, HV, D], BF16);
    err_eq(c.run(|a| a.v = &r5), "v", "v must be [S, H, 128] or [1, S, H, 128] for varlen.");
}

#[test]
fn varlen_forms_may_mix() {
    // q as [S, ..] and k as [1, S, ..] are the same shape once widened, as in the reference.
    let c = Case::varlen(5, 2, I32, true);
    let k4 = tv(2, &[1, 5, H, D], BF16);
    let beta3 = tv(5, &[1, 5, HV], BF16);
    let p = c.plan(|a| (a.k, a.beta) = (&k4, &beta3));
    assert!(p.squeeze_varlen);
}

#[test]
fn head_dim_must_be_128() {
    let c = Case::new(2, 3);
    let q64 = tv(9, &[2, 3, H, 64], BF16);
    let e = err_eq(c.run(|a| a.q = &q64), "q", "chunk_kda currently requires D=128.");
    assert!(is_unsupported(&e));
    err(c.run(|a| a.k = &q64), "k", "requires D=128");
    let v64 = tv(9, &[2, 3, HV, 64], BF16);
    err(c.run(|a| a.v = &v64), "v", "requires D=128");
    err(c.run(|a| a.g = &v64), "g", "requires D=128");
}

#[test]
fn k_must_match_q() {
    let c = Case::new(2, 3);
    let k = tv(9, &[2, 3, HV, D], BF16);
    err_eq(c.run(|a| a.k = &k), "k", "k must have the same shape as q.");
}

#[test]
fn v_and_g_must_match_q_batch_and_time() {
    let c = Case::new(2, 3);
    let x = tv(9, &[2, 4, HV, D], BF16);
    let msg = "q, v and g must have matching [B, T] dimensions.";
    err_eq(c.run(|a| a.v = &x), "v", msg);
    err_eq(c.run(|a| a.g = &x), "g", msg);
    let y = tv(9, &[1, 3, HV, D], BF16);
    err_eq(c.run(|a| a.g = &y), "g", msg);
}

#[test]
fn g_must_match_v() {
    let c = Case::new(2, 3);
    let g = tv(9, &[2, 3, 2 * HV, D], BF16);
    err_eq(c.run(|a| a.g = &g), "g", "g must have the same shape as v.");
}

#[test]
fn value_heads_must_be_a_multiple_of_heads() {
    let c = Case::new(2, 3);
    let (v, g) = (tv(9, &[2, 3, 3, D], BF16), tv(10, &[2, 3, 3, D], BF16));
    let msg = "GVA requires v/g heads to be divisible by q/k heads.";
    err_eq(c.run(|a| (a.v, a.g) = (&v, &g)), "v", msg);
    // H = 0: a division by zero in the reference.
    let (q0, k0) = (tv(11, &[2, 3, 0, D], BF16), tv(12, &[2, 3, 0, D], BF16));
    err_eq(c.run(|a| (a.q, a.k) = (&q0, &k0)), "v", msg);
}

#[test]
fn beta_must_be_b_t_hv() {
    let c = Case::new(2, 3);
    let msg = "beta must have shape [B, T, Hv].";
    let headwise = tv(9, &[2, 3, HV, D], BF16);
    err_eq(c.run(|a| a.beta = &headwise), "beta", msg);
    let wrong = tv(9, &[2, 3, H], BF16);
    err_eq(c.run(|a| a.beta = &wrong), "beta", msg);
    // [S, HV] is widened only for varlen.
    let flat = tv(9, &[6, HV], BF16);
    err_eq(c.run(|a| a.beta = &flat), "beta", msg);
    let cv = Case::varlen(5, 2, I32, false);
    let beta2 = tv(9, &[5, HV], BF16);
    cv.plan(|a| a.beta = &beta2);
}

#[test]
fn inputs_must_be_16_bit() {
    let mut c = Case::dense(2, 3, F32);
    let e = err_eq(c.run(|_| {}), "q", "chunk_kda supports f16 and bf16 inputs.");
    assert!(is_unsupported(&e));
    c.q = tv(1, &[2, 3, H, D], F16);
    err(c.run(|_| {}), "k", "k, v, g and beta must have the same dtype as q.");
}

#[test]
fn k_v_g_beta_share_q_dtype() {
    let c = Case::new(2, 3);
    let msg = "k, v, g and beta must have the same dtype as q.";
    let k = tv(9, &[2, 3, H, D], F16);
    let e = err_eq(c.run(|a| a.k = &k), "k", msg);
    assert!(is_unsupported(&e));
    let v = tv(9, &[2, 3, HV, D], F16);
    err_eq(c.run(|a| a.v = &v), "v", msg);
    err_eq(c.run(|a| a.g = &v), "g", msg);
    let beta = tv(9, &[2, 3, HV], F32);
    err_eq(c.run(|a| a.beta = &beta), "beta", msg);
}

#[test]
fn a_log_and_dt_bias_come_together() {
    let c = Case::new(2, 3);
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let msg = "A_log and dt_bias must be provided together.";
    let e = err_eq(c.run(|a| a.a_log = Some(&a_log)), "dt_bias", msg);
    assert!(!is_unsupported(&e));
    err_eq(c.run(|a| a.dt_bias = Some(&dt_bias)), "a_log", msg);
}

#[test]
fn initial_state_dtype_is_f32_or_the_inputs() {
    let c = Case::new(2, 3);
    let f16 = state(9, 2, F16);
    let e =
        err_eq(c.run(|a| a.initial_state = Some(&f16)), "initial_state", "initial_state must have dtype bf16 or f32.");
    assert!(is_unsupported(&e));
    let i32_state = state(9, 2, I32);
    err(c.run(|a| a.initial_state = Some(&i32_state)), "initial_state", "must have dtype bf16 or f32");
    for dtype in [F32, BF16] {
        let s = state(9, 2, dtype);
        assert_eq!(c.plan(|a| a.initial_state = Some(&s)).initial, InitialState::PerSequence { dtype });
    }
}

#[test]
fn cu_seqlens_dtype_is_i32_or_i64() {
    let mut c = Case::varlen(5, 2, I32, false);
    c.cu = Some(tv(6, &[3], F32));
    let e = err_eq(c.run(|_| {}), "cu_seqlens", "cu_seqlens must have dtype i32 or i64.");
    assert!(is_unsupported(&e));
}

#[test]
fn output_shape_and_dtype() {
    let c = Case::new(2, 3);
    let wrong = tv(9, &[2, 3, H, D], BF16);
    err_eq(c.run(|a| a.output = Some(&wrong)), "output", "output must have the same shape as v.");
    let flat = tv(9, &[6, HV, D], BF16);
    err_eq(c.run(|a| a.output = Some(&flat)), "output", "output must have the same shape as v.");
    let f32_out = tv(9, &[2, 3, HV, D], F32);
    let e = err_eq(c.run(|a| a.output = Some(&f32_out)), "output", "output must have the same dtype as q.");
    assert!(is_unsupported(&e));
    let ok = tv(9, &[2, 3, HV, D], BF16);
    assert!(c.plan(|a| a.output = Some(&ok)).output_given);
}

#[test]
fn varlen_output_forms() {
    // q as [S, ..]: a 3-D output is widened (and the result is returned 3-D); so is 4-D.
    let c = Case::varlen(5, 2, I32, true);
    let (o3, o4) = (tv(9, &[5, HV, D], BF16), tv(9, &[1, 5, HV, D], BF16));
    assert!(c.plan(|a| a.output = Some(&o3)).output_given);
    c.plan(|a| a.output = Some(&o4));
    // q as [1, S, ..]: only the 4-D output, as in the reference.
    let c = Case::varlen(5, 2, I32, false);
    err_eq(c.run(|a| a.output = Some(&o3)), "output", "output must have the same shape as v.");
    c.plan(|a| a.output = Some(&o4));
}

#[test]
fn final_state_dtype_is_f32_or_the_inputs() {
    let c = Case::new(2, 3);
    let f16 = state(9, 2, F16);
    let r = c.run(|a| (a.output_final_state, a.final_state) = (true, Some(&f16)));
    let e = err_eq(r, "final_state", "final_state must have dtype bf16 or f32.");
    assert!(is_unsupported(&e));
}

#[test]
fn initial_and_final_state_share_a_dtype() {
    let c = Case::new(2, 3);
    let (init, fs) = (state(9, 2, F32), state(10, 2, BF16));
    let r = c.run(|a| (a.initial_state, a.output_final_state, a.final_state) = (Some(&init), true, Some(&fs)));
    let e = err_eq(r, "final_state", "initial_state and final_state must have the same dtype.");
    assert!(is_unsupported(&e));
}

#[test]
fn final_state_without_output_final_state_is_ignored() {
    // As the reference: not even its dtype, shape, device or address is looked at.
    let c = Case::new(2, 3);
    for fs in [state(9, 2, F16), state(9, 7, F32), on(1, state(9, 2, F32)), at(0x9004, state(9, 2, F32))] {
        let p = c.plan(|a| a.final_state = Some(&fs));
        assert_eq!(p.final_out, FinalState::None);
    }
    let (init, fs) = (state(9, 2, F32), state(10, 2, BF16));
    let p = c.plan(|a| (a.initial_state, a.final_state) = (Some(&init), Some(&fs)));
    assert_eq!((p.final_out, p.state_dtype), (FinalState::None, F32));
}

// ---- checks beyond the reference ----

#[test]
fn cu_seqlens_is_1d_with_at_least_one_entry() {
    let mut c = Case::varlen(5, 2, I32, false);
    c.cu = Some(tv(6, &[3, 1], I32));
    err_eq(c.run(|_| {}), "cu_seqlens", "cu_seqlens must be a 1D tensor [N + 1], got shape [3, 1].");
    c.cu = Some(tv(6, &[0], I64));
    err_eq(c.run(|_| {}), "cu_seqlens", "cu_seqlens must have N + 1 >= 1 entries for N sequences, got 0.");
}

#[test]
fn a_log_is_hv_f32() {
    let c = Case::new(2, 3);
    let dt_bias = tv(10, &[HV, D], F32);
    for bad in [tv(9, &[HV, 1], F32), tv(9, &[HV + 1], F32)] {
        let r = c.run(|a| (a.a_log, a.dt_bias) = (Some(&bad), Some(&dt_bias)));
        err(r, "a_log", "A_log must have shape [HV] = [4], got");
    }
    let bf16 = tv(9, &[HV], BF16);
    let r = c.run(|a| (a.a_log, a.dt_bias) = (Some(&bf16), Some(&dt_bias)));
    err_eq(r, "a_log", "A_log must be f32, got A_log=bf16.");
}

#[test]
fn dt_bias_is_hv_by_128_or_flat_in_f32_or_bf16() {
    let c = Case::new(2, 3);
    let a_log = tv(9, &[HV], F32);
    let bad = [tv(10, &[HV, 64], F32), tv(10, &[HV * D + 1], F32), tv(10, &[HV, D, 1], F32)];
    for x in bad {
        let r = c.run(|a| (a.a_log, a.dt_bias) = (Some(&a_log), Some(&x)));
        err(r, "dt_bias", "dt_bias must have shape [4, 128] (or flat [HV * K]) when provided, got");
    }
    let f16 = tv(10, &[HV, D], F16);
    let r = c.run(|a| (a.a_log, a.dt_bias) = (Some(&a_log), Some(&f16)));
    err_eq(r, "dt_bias", "dt_bias must be f32 or bf16 when provided, got dt_bias=f16.");
    let flat = tv(10, &[HV * D], BF16);
    let p = c.plan(|a| (a.a_log, a.dt_bias) = (Some(&a_log), Some(&flat)));
    assert_eq!(p.dt_bias, Some(BF16));
}

#[test]
fn has_initial_state_needs_state_indices() {
    let c = Case::new(2, 3);
    let hi = tv(9, &[2], I32);
    let init = state(10, 2, F32);
    let r = c.run(|a| (a.has_initial_state, a.initial_state) = (Some(&hi), Some(&init)));
    err(r, "has_initial_state", "has_initial_state is only meaningful with state_indices");
}

#[test]
fn state_indices_shape_dtype_and_length() {
    let c = Case::new(2, 3);
    let pool = state(10, 8, F32);
    let check = |si: &TensorView, phrase: &str| {
        err(c.run(|a| (a.state_indices, a.initial_state) = (Some(si), Some(&pool))), "state_indices", phrase);
    };
    check(&tv(9, &[2, 1], I32), "state_indices must have shape [N] (one entry per sequence), got [2, 1].");
    check(&tv(9, &[2], F32), "state_indices must have dtype i32 or i64, got f32.");
    check(&tv(9, &[3], I64), "state_indices must have N = 2 entries (one per sequence), got 3.");
    // Varlen: N is the number of sequences, not the batch.
    let cv = Case::varlen(5, 3, I32, false);
    let si = tv(9, &[1], I32);
    let r = cv.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&pool)));
    err(r, "state_indices", "must have N = 3 entries");
}

#[test]
fn has_initial_state_shape_dtype_and_length() {
    let c = Case::new(2, 3);
    let (pool, si) = (state(10, 8, F32), tv(9, &[2], I32));
    let check = |hi: &TensorView, phrase: &str| {
        let r = c.run(|a| (a.state_indices, a.initial_state, a.has_initial_state) = (Some(&si), Some(&pool), Some(hi)));
        err(r, "has_initial_state", phrase);
    };
    check(&tv(11, &[2, 2], I32), "has_initial_state must have shape [N] (one entry per sequence), got [2, 2].");
    check(&tv(11, &[2], BF16), "has_initial_state must have dtype i32 or i64, got bf16.");
    check(&tv(11, &[1], I64), "has_initial_state must have N = 2 entries (one per sequence), got 1.");
}

#[test]
fn state_indices_need_the_pool() {
    let c = Case::new(2, 3);
    let si = tv(9, &[2], I32);
    err(c.run(|a| a.state_indices = Some(&si)), "initial_state", "initial_state must be provided when state_indices");
}

#[test]
fn state_indices_conflict_with_final_state_outputs() {
    let c = Case::new(2, 3);
    let (pool, si) = (state(10, 8, F32), tv(9, &[2], I32));
    let r = c.run(|a| (a.state_indices, a.initial_state, a.output_final_state) = (Some(&si), Some(&pool), true));
    err(r, "output_final_state", "output_final_state must not be set with state_indices");
    // final_state is an error with state_indices even without output_final_state.
    let fs = state(11, 2, F32);
    let r = c.run(|a| (a.state_indices, a.initial_state, a.final_state) = (Some(&si), Some(&pool), Some(&fs)));
    err(r, "final_state", "final_state must not be given with state_indices");
}

#[test]
fn pool_dtype_is_f32_or_bf16_with_bf16_inputs() {
    let c = Case::dense(2, 3, F16);
    let si = tv(9, &[2], I32);
    let f16_pool = state(10, 8, F16);
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&f16_pool)));
    let e = err(
        r,
        "initial_state",
        "must be f32, or bf16 with bf16 inputs (decode reads f32 and bf16 states only), got f16",
    );
    assert!(is_unsupported(&e));
    // A bf16 pool with f16 inputs already fails the reference's dtype rule.
    let bf16_pool = state(10, 8, BF16);
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&bf16_pool)));
    err_eq(r, "initial_state", "initial_state must have dtype f16 or f32.");
    let f32_pool = state(10, 8, F32);
    c.plan(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&f32_pool)));
    let c = Case::new(2, 3);
    let p = c.plan(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&bf16_pool)));
    assert_eq!(p.state_dtype, BF16);
}

#[test]
fn pool_shape_and_size() {
    let c = Case::new(2, 3);
    let si = tv(9, &[2], I32);
    let bad = tv(10, &[8, HV + 1, D, D], F32);
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&bad)));
    err(r, "initial_state", "must have shape [pool, HV, 128, 128] = [pool, 4, 128, 128], got [8, 5, 128, 128].");
    let r3 = tv(10, &[HV, D, D], F32);
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&r3)));
    err(r, "initial_state", "[pool, HV, 128, 128]");
    let empty = state(10, 0, F32);
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&empty)));
    err_eq(r, "initial_state", "the state pool must contain at least one slot.");
    // Fewer slots than sequences is fine: indices pick slots, and out-of-range ones are padding.
    let one = state(10, 1, F32);
    c.plan(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&one)));
}

#[test]
fn per_sequence_initial_state_shape() {
    let c = Case::new(2, 3);
    for bad in [state(9, 3, F32), tv(9, &[2, H, D, D], F32), tv(9, &[2, HV, D], F32)] {
        let r = c.run(|a| a.initial_state = Some(&bad));
        err(r, "initial_state", "initial_state must have shape [N, HV, 128, 128] = [2, 4, 128, 128], got");
    }
}

#[test]
fn final_state_shape() {
    let c = Case::new(2, 3);
    let bad = state(9, 1, F32);
    let r = c.run(|a| (a.output_final_state, a.final_state) = (true, Some(&bad)));
    err_eq(r, "final_state", "final_state must have shape [N, HV, 128, 128] = [2, 4, 128, 128], got [1, 4, 128, 128].");
}

#[test]
fn scale_and_lower_bound_must_be_finite() {
    let c = Case::new(2, 3);
    err_eq(c.run(|a| a.scale = Some(f32::NAN)), "scale", "scale must be finite, got NaN.");
    err(c.run(|a| a.scale = Some(f32::INFINITY)), "scale", "scale must be finite");
    // Even where the precomputed rule ignores it.
    err_eq(c.run(|a| a.lower_bound = Some(f32::NEG_INFINITY)), "lower_bound", "lower_bound must be finite, got -inf.");
}

#[test]
fn lower_bound_range_with_gate_params() {
    let c = Case::new(2, 3);
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let with = |lb: f32| c.run(|a| (a.a_log, a.dt_bias, a.lower_bound) = (Some(&a_log), Some(&dt_bias), Some(lb)));
    for lb in [-5.01, 0.0, -0.0, 0.5] {
        let e = err(with(lb), "lower_bound", "lower_bound must be in [-5, 0)");
        assert!(is_unsupported(&e));
    }
    for lb in [-5.0, -1.0, -1e-6] {
        assert_eq!(with(lb).expect("in range").gate, ChunkGate::LowerBound { lower_bound: lb });
    }
    // The precomputed rule does not read it: any finite value is fine.
    assert_eq!(c.plan(|a| a.lower_bound = Some(3.0)).gate, ChunkGate::Precomputed);
}

#[test]
fn tensors_must_share_q_device() {
    let c = Case::new(2, 3);
    let k = on(1, c.k);
    err_eq(c.run(|a| a.k = &k), "k", "Expected k to be on device cuda:0, got cuda:1.");
    let beta = on(2, c.beta);
    err(c.run(|a| a.beta = &beta), "beta", "Expected beta to be on device cuda:0, got cuda:2.");
    let out = on(1, tv(9, &[2, 3, HV, D], BF16));
    err(c.run(|a| a.output = Some(&out)), "output", "Expected output to be on device cuda:0");
    let init = on(1, state(9, 2, F32));
    err(c.run(|a| a.initial_state = Some(&init)), "initial_state", "to be on device cuda:0");
    let fs = on(1, state(9, 2, F32));
    err(c.run(|a| (a.output_final_state, a.final_state) = (true, Some(&fs))), "final_state", "to be on device cuda:0");
    let (a_log, dt_bias) = (on(1, tv(9, &[HV], F32)), tv(10, &[HV, D], F32));
    err(c.run(|a| (a.a_log, a.dt_bias) = (Some(&a_log), Some(&dt_bias))), "a_log", "to be on device cuda:0");
    let (pool, si) = (state(10, 8, F32), on(1, tv(9, &[2], I32)));
    let r = c.run(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&pool)));
    err(r, "state_indices", "to be on device cuda:0");
    let mut cv = Case::varlen(5, 2, I32, false);
    cv.cu = Some(on(1, tv(6, &[3], I32)));
    err(cv.run(|_| {}), "cu_seqlens", "Expected cu_seqlens to be on device cuda:0, got cuda:1.");
}

#[test]
fn pointers_must_be_16_byte_aligned() {
    let mut c = Case::new(2, 3);
    c.q = at(0x1008, c.q);
    let e = err_eq(c.run(|_| {}), "q", "q must be 16-byte aligned (the kernels use vector loads), got address 0x1008.");
    assert!(is_unsupported(&e));
    let c = Case::new(2, 3);
    let g = at(0x4002, c.g);
    err(c.run(|a| a.g = &g), "g", "g must be 16-byte aligned");
    let out = at(0x9004, tv(9, &[2, 3, HV, D], BF16));
    err(c.run(|a| a.output = Some(&out)), "output", "16-byte aligned");
    let (pool, si, hi) = (state(10, 8, F32), tv(9, &[2], I32), at(0xb004, tv(11, &[2], I32)));
    let r = c.run(|a| (a.state_indices, a.initial_state, a.has_initial_state) = (Some(&si), Some(&pool), Some(&hi)));
    err(r, "has_initial_state", "16-byte aligned");
    // Zero elements: nothing is accessed, so the address does not matter.
    let mut c = Case::new(0, 3);
    c.q = at(0x1001, c.q);
    assert!(c.plan(|_| {}).empty);
}

// ---- resolved plans ----

#[test]
fn dense_defaults() {
    let p = Case::new(2, 3).plan(|_| {});
    assert_eq!((p.nseq, p.batch, p.seq_len, p.total_tokens, p.heads, p.value_heads), (2, 2, 3, 6, H, HV));
    assert_eq!(p.dtype, BF16);
    assert_eq!(p.gate, ChunkGate::Precomputed);
    assert_eq!(p.scale, (128f64).powf(-0.5) as f32);
    assert!(p.l2norm);
    assert_eq!((p.varlen, p.squeeze_varlen), (None, false));
    assert_eq!(p.output_shape, [2, 3, HV, D]);
    assert!(!p.output_given);
    assert_eq!((p.initial, p.final_out), (InitialState::Zeros, FinalState::None));
    assert_eq!((p.state_dtype, p.dt_bias, p.max_seqlen), (BF16, None, None));
    assert!(!p.checked && !p.empty);
}

#[test]
fn explicit_options_resolve() {
    let c = Case::new(2, 3);
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let p = c.plan(|a| {
        (a.scale, a.use_qk_l2norm_in_kernel, a.max_seqlen, a.checked) = (Some(0.25), Some(false), Some(3), true);
        (a.a_log, a.dt_bias) = (Some(&a_log), Some(&dt_bias));
    });
    assert_eq!((p.scale, p.l2norm, p.max_seqlen, p.checked), (0.25, false, Some(3), true));
    assert_eq!(p.gate, ChunkGate::LowerBound { lower_bound: -5.0 });
    assert_eq!(p.dt_bias, Some(F32));
}

#[test]
fn varlen_flat_i32() {
    let c = Case::varlen(7, 3, I32, true);
    let p = c.plan(|a| a.max_seqlen = Some(4));
    assert_eq!((p.nseq, p.batch, p.seq_len, p.total_tokens), (3, 1, 7, 7));
    assert_eq!((p.varlen, p.squeeze_varlen, p.output_shape), (Some(I32), true, [1, 7, HV, D]));
    assert_eq!(p.max_seqlen, Some(4));
}

#[test]
fn varlen_4d_i64() {
    let c = Case::varlen(7, 3, I64, false);
    let p = c.plan(|a| a.output_final_state = true);
    assert_eq!((p.nseq, p.batch, p.seq_len), (3, 1, 7));
    assert_eq!((p.varlen, p.squeeze_varlen), (Some(I64), false));
    assert_eq!(p.final_out, FinalState::Allocate { dtype: BF16, shape: [3, HV, D, D] });
    // States are per sequence, not per batch row.
    let init = state(9, 3, F32);
    assert_eq!(c.plan(|a| a.initial_state = Some(&init)).initial, InitialState::PerSequence { dtype: F32 });
}

#[test]
fn gva_and_equal_heads() {
    let mut c = Case::new(2, 3);
    c.q = tv(1, &[2, 3, 1, D], BF16);
    c.k = tv(2, &[2, 3, 1, D], BF16);
    let p = c.plan(|_| {});
    assert_eq!((p.heads, p.value_heads), (1, HV));
    c.q = tv(1, &[2, 3, HV, D], BF16);
    c.k = tv(2, &[2, 3, HV, D], BF16);
    let p = c.plan(|_| {});
    assert_eq!((p.heads, p.value_heads), (HV, HV));
}

#[test]
fn f16_inputs() {
    let c = Case::dense(2, 3, F16);
    let p = c.plan(|a| a.output_final_state = true);
    assert_eq!((p.dtype, p.state_dtype), (F16, F16));
    assert_eq!(p.final_out, FinalState::Allocate { dtype: F16, shape: [2, HV, D, D] });
    let init = state(9, 2, F16);
    let p = c.plan(|a| a.initial_state = Some(&init));
    assert_eq!((p.initial, p.state_dtype), (InitialState::PerSequence { dtype: F16 }, F16));
}

#[test]
fn precomputed_and_lower_bound_gates() {
    let c = Case::new(2, 3);
    let p = c.plan(|a| a.lower_bound = Some(-2.0));
    assert_eq!((p.gate, p.dt_bias), (ChunkGate::Precomputed, None));
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV * D], F32));
    let p = c.plan(|a| (a.a_log, a.dt_bias, a.lower_bound) = (Some(&a_log), Some(&dt_bias), Some(-2.0)));
    assert_eq!((p.gate, p.dt_bias), (ChunkGate::LowerBound { lower_bound: -2.0 }, Some(F32)));
}

#[test]
fn pool_with_state_indices() {
    let c = Case::varlen(9, 3, I32, true);
    let (pool, si, hi) = (state(10, 16, BF16), tv(9, &[3], I64), tv(11, &[3], I32));
    let p = c.plan(|a| (a.state_indices, a.initial_state, a.has_initial_state) = (Some(&si), Some(&pool), Some(&hi)));
    let want = InitialState::Pool { dtype: BF16, indices: I64, has_initial: Some(I32), pool: 16 };
    assert_eq!((p.initial, p.final_out, p.state_dtype), (want, FinalState::Pool, BF16));
    let pool = state(10, 4, F32);
    let p = c.plan(|a| (a.state_indices, a.initial_state) = (Some(&si), Some(&pool)));
    let want = InitialState::Pool { dtype: F32, indices: I64, has_initial: None, pool: 4 };
    assert_eq!((p.initial, p.final_out, p.state_dtype), (want, FinalState::Pool, F32));
}

#[test]
fn allocate_and_given_final_state() {
    let c = Case::new(2, 3);
    let p = c.plan(|a| a.output_final_state = true);
    assert_eq!(p.final_out, FinalState::Allocate { dtype: BF16, shape: [2, HV, D, D] });
    // Allocated in initial_state's dtype.
    let init = state(9, 2, F32);
    let p = c.plan(|a| (a.initial_state, a.output_final_state) = (Some(&init), true));
    assert_eq!((p.final_out, p.state_dtype), (FinalState::Allocate { dtype: F32, shape: [2, HV, D, D] }, F32));
    // A given final state decides the state dtype when there is no initial state.
    let fs = state(10, 2, F32);
    let p = c.plan(|a| (a.output_final_state, a.final_state) = (true, Some(&fs)));
    assert_eq!((p.initial, p.final_out, p.state_dtype), (InitialState::Zeros, FinalState::Given { dtype: F32 }, F32));
}

#[test]
fn empty_work() {
    assert!(Case::new(0, 3).plan(|_| {}).empty);
    let p = Case::new(2, 0).plan(|a| a.output_final_state = true);
    // No tokens, but two final states (zeros) still to write.
    assert!(p.empty);
    assert_eq!((p.nseq, p.final_out), (2, FinalState::Allocate { dtype: BF16, shape: [2, HV, D, D] }));
    let p = Case::varlen(0, 0, I32, true).plan(|_| {});
    assert!(p.empty && p.nseq == 0);
    // Tokens no sequence owns (N = 0): nothing to compute.
    assert!(Case::varlen(4, 0, I32, false).plan(|_| {}).empty);
    assert!(!Case::varlen(4, 2, I32, false).plan(|_| {}).empty);
}

#[test]
fn errors_display_and_convert() {
    let e = ChunkError::InvalidArgument { arg: "k", message: "bad.".into() };
    assert_eq!(e.to_string(), "k: bad.");
    // The runtime error keeps the typed one, as its variant and as its source.
    let converted = RuntimeError::from(e.clone());
    assert!(matches!(&converted, RuntimeError::Chunk(ChunkError::InvalidArgument { arg: "k", .. })));
    assert_eq!(converted.to_string(), "chunk_kda: bad argument k: bad.");
    let source = std::error::Error::source(&converted).expect("a source");
    assert_eq!(source.downcast_ref::<ChunkError>(), Some(&e));
    let e = ChunkError::Unsupported { arg: "q", message: "no.".into() };
    assert_eq!(e.to_string(), "q: no.");
    assert_eq!(RuntimeError::from(e.clone()), RuntimeError::Chunk(e));
}

#[test]
fn calls_past_the_launch_limits_are_rejected_by_the_plan() {
    // The grid holds one block row per sequence along z (at most 65535) and extents are 32-bit.
    let e = err(Case::varlen(70_000, 65_536, I32, true).run(|_| {}), "cu_seqlens", "at most 65535 sequences");
    assert!(is_unsupported(&e), "{e}");
    let e = err(Case::new(65_536, 1).run(|_| {}), "q", "at most 65535 batch rows");
    assert!(is_unsupported(&e), "{e}");
    let e = err(Case::new(1, 1 << 31).run(|_| {}), "q", "fit in 32 bits");
    assert!(is_unsupported(&e), "{e}");
    // At the limits themselves, the plan is accepted.
    Case::varlen(70_000, 65_535, I32, true).plan(|_| {});
    Case::new(1, (1 << 31) - 16).plan(|_| {});
    // Past it once rounded up to whole chunks: the launch's limit, checked on what it launches.
    let e = err(Case::new(1, (1 << 31) - 1).run(|_| {}), "q", "prefix_lens) = 2147483648");
    assert!(is_unsupported(&e), "{e}");
    let e = err(Case::varlen((1 << 31) - 20, 2, I32, true).run(|_| {}), "cu_seqlens", "S + 15 N");
    assert!(is_unsupported(&e), "{e}");
}

// ---- the workspace ----

#[test]
fn the_workspace_a_call_takes_follows_its_path_never_the_argument() {
    use kda_runtime::chunk::{chunk_workspace_bound, chunk_workspace_bytes};
    use kda_runtime::DeviceLimits;
    let c = Case::new(2, 37);
    let plain = c.plan(|_| {});
    // Two rows of 48 tokens (whole chunks), HV = 4: 416 bf16 per token, 144 f32 per chunk
    // (the decay and the betas). 8 chains take the two-kernel path on any of these devices.
    let need = 2 * HV * (48 * 416 * 2 + 3 * 144 * 4);
    for device in [DeviceLimits::A100, DeviceLimits::RTX_3090, DeviceLimits::L40S, DeviceLimits::H200] {
        assert_eq!(chunk_workspace_bytes(&plain, &device), need, "{device:?}");
    }
    // More chains than SMs: the fused kernel, which takes none.
    let few_sms = DeviceLimits { sm_count: 4, ..DeviceLimits::H200 };
    assert_eq!(chunk_workspace_bytes(&plain, &few_sms), 0);
    assert!(chunk_workspace_bound(2 * 37, 2, HV) >= need);
    // A workspace, however large, changes nothing in the plan; a bad one is still refused.
    let exact = tv(9, &[need / 4], F32);
    assert_eq!(c.plan(|a| a.workspace = Some(&exact)), plain);
    let misaligned = at(0x9008, exact);
    err(c.run(|a| a.workspace = Some(&misaligned)), "workspace", "aligned");
    let elsewhere = on(1, exact);
    err(c.run(|a| a.workspace = Some(&elsewhere)), "workspace", "device");
    // Varlen: 15 rows more per sequence for the last chunks, and an f32 row per 16 rows.
    let v = Case::varlen(100, 3, I32, true);
    let vp = v.plan(|_| {});
    assert_eq!(chunk_workspace_bytes(&vp, &DeviceLimits::H200), HV * (145 * 416 * 2 + 10 * 144 * 4));
}

/// The variants a kind of call can pick include the one each batch picks on each device, and
/// the preparation of the two-kernel path.
#[test]
fn chunk_variants_cover_every_batch_size() {
    use kda_runtime::chunk::{chunk_config, chunk_variants, prepared_max_chains};
    use kda_runtime::DeviceLimits;
    let few = Case::new(1, 64);
    for device in
        [DeviceLimits::A100, DeviceLimits::RTX_3090, DeviceLimits::L40S, DeviceLimits::H100, DeviceLimits::H200]
    {
        let (variants, prep) = chunk_variants(&few.plan(|_| {}), &device);
        assert_eq!(prep.len(), 1);
        // HV = 4: 40 sequences are more chains than the two-kernel path takes.
        assert!(40 * HV > prepared_max_chains(&device));
        for b in [1, 2, 40] {
            let c = Case::new(b, 64);
            let cfg = chunk_config(&c.plan(|_| {}), &device);
            assert!(variants.contains(&cfg), "B = {b}: {} not among {variants:?}", cfg.key());
        }
    }
}

// ---- the gate and beta rules (one layer's, as decode takes them) ----

#[test]
fn prefill_takes_decodes_gate_and_beta_rules() {
    use kda_runtime::chunk::{chunk_config, BetaRule};
    use kda_runtime::DeviceLimits;
    let head = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let c = Case::new(1, 40);
    fn with<'a>(a: &mut ChunkArgs<'a>, (a_log, dt_bias): &'a (TensorView, TensorView)) {
        (a.a_log, a.dt_bias) = (Some(a_log), Some(dt_bias));
    }
    // The reference's defaults: the lower-bound gate (bound -5), beta through a sigmoid.
    let p = c.plan(|a| with(a, &head));
    assert_eq!((p.gate, p.beta), (ChunkGate::LowerBound { lower_bound: -5.0 }, BetaRule::Sigmoid));
    // Decode's softplus gate; its bound is not the lower-bound gate's, so any value goes.
    let p = c.plan(|a| {
        with(a, &head);
        (a.use_lower_bound, a.lower_bound) = (Some(false), Some(0.0));
    });
    assert_eq!(p.gate, ChunkGate::Softplus);
    let cfg = chunk_config(&p, &DeviceLimits::H200);
    assert_eq!((cfg.gate, cfg.beta), (kda_kernels::rules::Gate::Softplus, kda_kernels::rules::Beta::Sigmoid));
    // Raw beta (FLA's post-sigmoid) and negative eigenvalues.
    let p = c.plan(|a| a.apply_beta_sigmoid = Some(false));
    assert_eq!((p.gate, p.beta), (ChunkGate::Precomputed, BetaRule::Raw));
    assert_eq!(chunk_config(&p, &DeviceLimits::H200).beta, kda_kernels::rules::Beta::Raw);
    assert_eq!(c.plan(|a| a.allow_neg_eigval = true).beta, BetaRule::TwoSigmoid);
    // What cannot be meant: a gate rule without the gate's inputs, and 2 sigmoid(b) without the
    // sigmoid.
    for lower in [true, false] {
        err(c.run(|a| a.use_lower_bound = Some(lower)), "use_lower_bound", "needs A_log and dt_bias");
    }
    err(
        c.run(|a| (a.apply_beta_sigmoid, a.allow_neg_eigval) = (Some(false), true)),
        "allow_neg_eigval",
        "needs the beta sigmoid",
    );
    // The lower-bound gate keeps its range.
    let r = c.run(|a| {
        with(a, &head);
        a.lower_bound = Some(0.0);
    });
    err(r, "lower_bound", "[-5, 0)");
}

/// `LayerRules` gives prefill and decode the same rules whatever their defaults.
#[test]
fn one_layers_rules_make_both_calls() {
    use kda_runtime::decode::plan_decode;
    use kda_runtime::rules::{BetaRule, GateRule, LayerRules};
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let c = Case::new(1, 40);
    let step = Case::new(1, 1);
    let pool = tv(11, &[1, HV, D, D], F32);
    for gate in [GateRule::LowerBound { lower_bound: -3.0 }, GateRule::Softplus, GateRule::Precomputed] {
        for beta in [BetaRule::Sigmoid, BetaRule::Raw, BetaRule::TwoSigmoid] {
            let rules = LayerRules { a_log: Some(&a_log), dt_bias: Some(&dt_bias), gate, beta };
            let prefill = plan_chunk(&rules.chunk_args(&c.q, &c.k, &c.v, &c.g, &c.beta)).expect("prefill");
            let mut args = rules.decode_args(&step.q, &step.k, &step.v, &step.g, &step.beta);
            args.state = Some(&pool);
            let decode = plan_decode(&args).expect("decode");
            assert_eq!((prefill.gate, prefill.beta), (gate, beta));
            assert_eq!((decode.gate, decode.beta), (gate, beta));
        }
    }
}

#[test]
fn read_indices_need_state_indices_and_share_their_dtype() {
    let c = Case::new(2, 3);
    let (pool, si, ri) = (state(10, 8, F32), tv(9, &[2], I32), tv(11, &[2], I32));
    let r = c.run(|a| (a.read_indices, a.initial_state) = (Some(&ri), Some(&pool)));
    err(r, "read_indices", "read_indices is only meaningful with state_indices");
    let check = |ri: &TensorView, phrase: &str| {
        let r = c.run(|a| (a.state_indices, a.initial_state, a.read_indices) = (Some(&si), Some(&pool), Some(ri)));
        err(r, "read_indices", phrase);
    };
    check(&tv(11, &[2, 1], I32), "read_indices must have shape [N] (one entry per sequence), got [2, 1].");
    check(&tv(11, &[2], F32), "read_indices must have dtype i32 or i64, got f32.");
    check(&tv(11, &[3], I32), "read_indices must have N = 2 entries (one per sequence), got 3.");
    check(&tv(11, &[2], I64), "read_indices must have state_indices' dtype (i32), got i64.");
    c.plan(|a| (a.state_indices, a.initial_state, a.read_indices) = (Some(&si), Some(&pool), Some(&ri)));
}

/// The checked mode: a sequence may read its own slot (the in-place default) or one no
/// sequence of the call writes (a cached prefix, read by several), never another's.
#[test]
fn checked_read_slots_are_not_written_by_other_sequences() {
    use kda_runtime::chunk::{check_chunk_indices, ChunkIndices};
    let c = Case::varlen(9, 3, I32, false);
    let (pool, si) = (state(10, 8, F32), tv(9, &[3], I32));
    let p = c.plan(|a| (a.state_indices, a.initial_state, a.checked) = (Some(&si), Some(&pool), true));
    let cu = [0, 2, 5, 9];
    let check = |write: &[i64], read: &[i64]| {
        let x = ChunkIndices {
            cu_seqlens: Some(&cu),
            state_indices: Some(write),
            read_indices: Some(read),
            ..ChunkIndices::default()
        };
        check_chunk_indices(&p, x)
    };
    check(&[0, 1, 2], &[0, 1, 2]).expect("in place");
    check(&[0, 1, 2], &[7, 7, -1]).expect("one cached slot read twice, one fresh");
    check(&[0, -1, 2], &[7, 0, 99]).expect("a padding sequence's read and a read outside the pool are no reads");
    let e = check(&[0, 1, 2], &[7, 2, 7]).expect_err("sequence 1 reads what sequence 2 writes").to_string();
    assert!(e.contains("read_indices[1] = 2 is the slot state_indices[2] writes"), "{e}");
    let x = ChunkIndices {
        cu_seqlens: Some(&cu),
        state_indices: Some(&[0, 1, 2]),
        read_indices: Some(&[7]),
        ..ChunkIndices::default()
    };
    assert!(check_chunk_indices(&p, x).expect_err("a short copy").to_string().contains("read_indices"));
}

#[test]
fn prefix_caching_needs_the_pool_and_checks_its_arguments() {
    let c = Case::new(2, 3);
    let (pool, si) = (state(10, 8, F32), tv(9, &[2], I32));
    let (lens, slots) = (tv(11, &[2], I64), tv(12, &[2, 4], I32));
    let r = c.run(|a| a.prefix_lens = Some(&lens));
    err(r, "prefix_lens", "prefix caching in the pool mode");
    // Each call with the pool, and the fields under test.
    macro_rules! run {
        ($a:ident => $($set:tt)*) => {
            c.run(|$a| {
                ($a.state_indices, $a.initial_state) = (Some(&si), Some(&pool));
                $($set)*
            })
        };
    }
    err(run!(a => a.prefix_lens = Some(&slots);), "prefix_lens", "must have shape [N] = [2]");
    err(run!(a => a.checkpoint_slots = Some(&slots);), "checkpoint_every", "needs checkpoint_every");
    err(run!(a => a.checkpoint_every = Some(64);), "checkpoint_slots", "needs checkpoint_slots");
    for e in [0, 24] {
        let r = run!(a => (a.checkpoint_every, a.checkpoint_slots) = (Some(e), Some(&slots)););
        err(r, "checkpoint_every", "a positive multiple of 16");
    }
    let wide = tv(13, &[3, 4], I32);
    let r = run!(a => (a.checkpoint_every, a.checkpoint_slots) = (Some(64), Some(&wide)););
    err(r, "checkpoint_slots", "must have shape [N, C] = [2, C]");
    let bf16_pool = state(14, 4, BF16);
    let r = run!(a => (a.checkpoint_every, a.checkpoint_slots, a.checkpoint_pool) = (Some(64), Some(&slots), Some(&bf16_pool)););
    err(r, "checkpoint_pool", "the state pool's dtype (f32)");
    let p = c.plan(|a| {
        (a.state_indices, a.initial_state, a.prefix_lens) = (Some(&si), Some(&pool), Some(&lens));
        (a.checkpoint_every, a.checkpoint_slots) = (Some(64), Some(&slots));
    });
    assert!(p.prefix.active());
    assert_eq!((p.prefix.every, p.prefix.columns, p.prefix.pool), (64, 4, 8));
    // Such a call takes every path: the fused kernel, the two-kernel path, the split and
    // token ranges.
    use kda_runtime::chunk::ChunkTuning;
    let fused = ChunkTuning::fused(&p);
    fused.check(&p).expect("the fused kernel");
    ChunkTuning { prepared: true, ..fused }.check(&p).expect("the two-kernel path");
    ChunkTuning { split: Some(64), ..fused }.check(&p).expect("the split");
    let one = Case::new(1, 64);
    let (si1, lens1, slots1) = (tv(15, &[1], I32), tv(16, &[1], I64), tv(17, &[1, 4], I32));
    let p1 = one.plan(|a| {
        (a.state_indices, a.initial_state, a.prefix_lens) = (Some(&si1), Some(&pool), Some(&lens1));
        (a.checkpoint_every, a.checkpoint_slots) = (Some(16), Some(&slots1));
    });
    let ranges = ChunkTuning { ranges: Some(2), ..ChunkTuning { prepared: true, ..ChunkTuning::fused(&p1) } };
    ranges.check(&p1).expect("token ranges");
}

/// The checked mode of prefix caching: columns and slots in range, nothing written twice,
/// nothing read that another write of the call lands in.
#[test]
fn checked_checkpoints_in_range_and_written_once() {
    use kda_runtime::chunk::{check_chunk_indices, ChunkIndices};
    let c = Case::varlen(100, 2, I32, false);
    let (pool, si, lens, slots) = (state(10, 8, F32), tv(9, &[2], I32), tv(11, &[2], I32), tv(12, &[2, 3], I32));
    let p = c.plan(|a| {
        (a.state_indices, a.initial_state, a.prefix_lens) = (Some(&si), Some(&pool), Some(&lens));
        (a.checkpoint_every, a.checkpoint_slots) = (Some(16), Some(&slots));
    });
    // Sequence 0: tokens 0..40 from position 5 (checkpoints at 16 and 32: columns 0 and 1);
    // sequence 1: 60 tokens from 0 (16, 32, 48: columns 0 to 2).
    let cu = [0, 40, 100];
    let check = |table: &[i64], lens: &[i64]| {
        let x = ChunkIndices {
            cu_seqlens: Some(&cu),
            state_indices: Some(&[0, 1]),
            prefix_lens: Some(lens),
            checkpoint_slots: Some(table),
            checkpoints_in_the_state_pool: true,
            ..ChunkIndices::default()
        };
        check_chunk_indices(&p, x).map_err(|e| e.to_string())
    };
    check(&[2, 3, -1, 4, 5, 6], &[5, 0]).expect("distinct slots, a skipped column past the need");
    let e = check(&[2, 3, -1, 4, 5, 6], &[5, 20]).expect_err("sequence 1 needs a fourth column");
    assert!(e.contains("column 3 of checkpoint_slots, which has 3"), "{e}");
    let e = check(&[2, 9, -1, 4, 5, 6], &[5, 0]).expect_err("slot 9 of 8");
    assert!(e.contains("outside the checkpoint pool [0, 8)"), "{e}");
    let e = check(&[2, 3, -1, 4, 3, 6], &[5, 0]).expect_err("slot 3 twice");
    assert!(e.contains("both write slot 3"), "{e}");
    let e = check(&[1, 3, -1, 4, 5, 6], &[5, 0]).expect_err("a checkpoint over sequence 1's state");
    assert!(e.contains("both write slot 1"), "{e}");
    let e = check(&[2, 3, -1, 4, 5, 6], &[-1, 0]).expect_err("a negative prefix");
    assert!(e.contains("prefix_lens[0] = -1"), "{e}");
}
