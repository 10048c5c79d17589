//! CPU-only tests of `gated_delta_rule_decode` validation (`plan_decode`) and the checked mode.

use kda_dsl::dtype::DType::{self, BF16, F16, F32, I32, I64};
use kda_runtime::decode::{
    check_indices, plan_decode, BetaRule, DecodeArgs, DecodeError, DecodePlan, GateRule, StateIndexing,
};
use kda_runtime::{RuntimeError, TensorView};

const D: usize = 128;
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

/// `B` sequences of `T` tokens, H = 2, HV = 4, K = V = 128, bf16, an f32 V-first state `[B, ..]`.
struct Case {
    q: TensorView,
    k: TensorView,
    v: TensorView,
    a: TensorView,
    b: TensorView,
    state: Option<TensorView>,
}

impl Case {
    fn new(b: usize, t: usize) -> Self {
        Case {
            q: tv(1, &[b, t, 2, D], BF16),
            k: tv(2, &[b, t, 2, D], BF16),
            v: tv(3, &[b, t, HV, D], BF16),
            a: tv(4, &[b, t, HV, D], BF16),
            b: tv(5, &[b, t, HV], BF16),
            state: Some(tv(6, &[b, HV, D, D], F32)),
        }
    }

    /// Replaces the state with an f32 V-first pool of `slots` slots.
    fn pool(mut self, slots: usize) -> Self {
        self.state = Some(tv(6, &[slots, HV, D, D], F32));
        self
    }

    fn run<'s>(&'s self, f: impl FnOnce(&mut DecodeArgs<'s>)) -> Result<DecodePlan, DecodeError> {
        let mut args = DecodeArgs::new(&self.q, &self.k, &self.v, &self.a, &self.b);
        args.state = self.state.as_ref();
        f(&mut args);
        plan_decode(&args)
    }

    fn plan<'s>(&'s self, f: impl FnOnce(&mut DecodeArgs<'s>)) -> DecodePlan {
        self.run(f).expect("valid call")
    }
}

/// Asserts the error names `arg` and its message contains `phrase`.
fn err(r: Result<impl std::fmt::Debug, DecodeError>, arg: &str, phrase: &str) -> DecodeError {
    let e = r.expect_err("expected an error");
    assert_eq!(e.arg(), arg, "{e}");
    assert!(e.message().contains(phrase), "{e}");
    e
}

fn is_unsupported(e: &DecodeError) -> bool {
    matches!(e, DecodeError::Unsupported { .. })
}

// ---- reference branches, in the reference's order ----

#[test]
fn state_dtype_must_be_f32_or_bf16() {
    let c = Case::new(2, 1);
    err(c.run(|a| a.state_dtype = Some(F16)), "state_dtype", "state_dtype must be f32 or bf16, got f16");
    let mut c = Case::new(2, 1);
    c.state = Some(tv(6, &[2, HV, D, D], F16));
    err(c.run(|_| {}), "state", "state_dtype must be f32 or bf16, got f16");
}

#[test]
fn q_k_v_must_be_4d() {
    let q3 = tv(9, &[2, 2, D], BF16);
    let c = Case::new(2, 1);
    err(c.run(|a| a.q = &q3), "q", "q, k, and v must each have shape [B, T, H, D]");
    err(c.run(|a| a.v = &q3), "v", "must each have shape");
}

#[test]
fn a_must_be_4d() {
    let a3 = tv(9, &[2, HV, D], BF16);
    err(Case::new(2, 1).run(|a| a.a = &a3), "a", "a must have shape [B, T, HV, K].");
}

#[test]
fn a_log_must_be_1d() {
    let x = tv(9, &[HV, 1], F32);
    err(Case::new(2, 1).run(|a| a.a_log = Some(&x)), "a_log", "A_log must have shape [HV].");
}

#[test]
fn dt_bias_must_be_2d_or_flat() {
    let x = tv(9, &[HV, D, 1], F32);
    err(Case::new(2, 1).run(|a| a.dt_bias = Some(&x)), "dt_bias", "dt_bias must have shape [HV, K]");
}

#[test]
fn k_must_match_q() {
    let k = tv(9, &[2, 1, 3, D], BF16);
    err(Case::new(2, 1).run(|a| a.k = &k), "k", "k must match q shape [B, T, H, K], got q=[2, 1, 2, 128]");
}

#[test]
fn v_must_match_q_batch_and_time() {
    let v = tv(9, &[2, 2, HV, D], BF16);
    err(Case::new(2, 1).run(|a| a.v = &v), "v", "v must match q in batch/time dims");
}

#[test]
fn hv_must_be_divisible_by_h() {
    let v = tv(9, &[2, 1, 3, D], BF16);
    err(Case::new(2, 1).run(|a| a.v = &v), "v", "Expected HV to be divisible by H, got HV=3, H=2.");
    let (q0, k0) = (tv(9, &[2, 1, 0, D], BF16), tv(10, &[2, 1, 0, D], BF16));
    err(Case::new(2, 1).run(|a| (a.q, a.k) = (&q0, &k0)), "v", "H=0");
}

#[test]
fn a_must_be_b_t_hv_k() {
    let x = tv(9, &[2, 1, HV, 64], BF16);
    err(Case::new(2, 1).run(|a| a.a = &x), "a", "Expected a shape [2, 1, 4, 128], got a=[2, 1, 4, 64].");
}

#[test]
fn a_log_must_have_hv_elements() {
    let x = tv(9, &[3], F32);
    err(Case::new(2, 1).run(|a| a.a_log = Some(&x)), "a_log", "A_log must have 4 elements, got 3.");
}

#[test]
fn dt_bias_shape_and_flat_form() {
    let c = Case::new(2, 1);
    let bad = tv(9, &[HV, 64], F32);
    err(c.run(|a| a.dt_bias = Some(&bad)), "dt_bias", "dt_bias must have shape [4, 128]");
    let bad_flat = tv(9, &[HV * D + 1], F32);
    err(c.run(|a| a.dt_bias = Some(&bad_flat)), "dt_bias", "or flat [HV * K]");
    let flat = tv(9, &[HV * D], BF16);
    let p = c.plan(|a| a.dt_bias = Some(&flat));
    assert!(p.has_dt_bias);
    assert_eq!(p.dt_bias_dtype, Some(BF16));
}

#[test]
fn qkv_dtype_must_be_16_bit() {
    let mut c = Case::new(2, 1);
    c.q = tv(1, &[2, 1, 2, D], F32);
    let e = err(c.run(|_| {}), "q", "q/k/v dtype must be f16 or bf16, got f32.");
    assert!(is_unsupported(&e));
}

#[test]
fn a_log_must_be_f32() {
    let x = tv(9, &[HV], BF16);
    err(Case::new(2, 1).run(|a| a.a_log = Some(&x)), "a_log", "A_log must be f32, got A_log=bf16.");
}

#[test]
fn dt_bias_must_be_f32_or_bf16() {
    let x = tv(9, &[HV, D], F16);
    let e = err(Case::new(2, 1).run(|a| a.dt_bias = Some(&x)), "dt_bias", "dt_bias must be f32 or bf16");
    assert!(!is_unsupported(&e));
}

#[test]
fn inputs_must_share_q_device() {
    let c = Case::new(2, 1);
    let k = on(1, c.k);
    err(c.run(|a| a.k = &k), "k", "Expected k to be on device cuda:0, got cuda:1.");
    let x = on(1, tv(9, &[HV], F32));
    err(c.run(|a| a.a_log = Some(&x)), "a_log", "to be on device cuda:0");
}

#[test]
fn output_shape_dtype_and_device() {
    let c = Case::new(2, 1);
    let bad_shape = tv(9, &[2, 1, HV, 64], F32);
    err(c.run(|a| a.output = Some(&bad_shape)), "output", "Expected output shape [2, 1, 4, 128]");
    let bad_dtype = tv(9, &[2, 1, HV, D], I32);
    let e = err(c.run(|a| a.output = Some(&bad_dtype)), "output", "Unsupported output dtype i32");
    assert!(is_unsupported(&e));
    let elsewhere = on(1, tv(9, &[2, 1, HV, D], F32));
    err(c.run(|a| a.output = Some(&elsewhere)), "output", "Expected output to be on device cuda:0");
    let ok = tv(9, &[2, 1, HV, D], F32);
    assert_eq!(c.plan(|a| a.output = Some(&ok)).output_dtype, F32);
}

#[test]
fn varlen_needs_1d_cu_seqlens() {
    let c = Case::new(1, 3);
    err(c.run(|a| a.is_varlen = Some(true)), "cu_seqlens", "cu_seqlens must be a 1D tensor when is_varlen=True.");
    let cu2 = tv(9, &[2, 2], I32);
    err(c.run(|a| a.cu_seqlens = Some(&cu2)), "cu_seqlens", "1D tensor");
}

#[test]
fn num_accepted_tokens_must_be_n() {
    let x = tv(9, &[3], I32);
    err(Case::new(2, 1).run(|a| a.num_accepted_tokens = Some(&x)), "num_accepted_tokens", "shape [B=2], got [3]");
}

#[test]
fn state_indices_rank_dtype_and_rows() {
    let c = Case::new(2, 1);
    let r3 = tv(9, &[2, 1, 1], I32);
    err(c.run(|a| a.state_indices = Some(&r3)), "state_indices", "must have shape [B] or [B, T]");
    let f = tv(9, &[2], F32);
    err(c.run(|a| a.state_indices = Some(&f)), "state_indices", "must have dtype i32 or i64, got f32.");
    let rows = tv(9, &[3], I64);
    err(c.run(|a| a.state_indices = Some(&rows)), "state_indices", "first dimension must be 2, got 3.");
}

#[test]
fn one_d_state_indices_only_single_token_inplace() {
    let si = tv(9, &[2], I32);
    let nat = tv(10, &[2], I32);
    let c = Case::new(2, 1);
    let msg = "1D state_indices only support non-speculative single-token in-place decode";
    err(c.run(|a| (a.state_indices, a.num_accepted_tokens) = (Some(&si), Some(&nat))), "state_indices", msg);
    let c2 = Case::new(2, 2);
    err(c2.run(|a| (a.state_indices, a.inplace_final_state) = (Some(&si), true)), "state_indices", msg);
    c.plan(|a| (a.state_indices, a.inplace_final_state) = (Some(&si), true));
}

#[test]
fn two_d_state_indices_columns() {
    let c = Case::new(2, 3);
    let zero = tv(9, &[2, 0], I32);
    err(c.run(|a| a.state_indices = Some(&zero)), "state_indices", "at least one column");
    let two = tv(9, &[2, 2], I32);
    let e = err(c.run(|a| (a.state_indices, a.inplace_final_state) = (Some(&two), true)), "state_indices", "");
    assert_eq!(
        e.message(),
        "state_indices needs at least 3 columns for fixed multi-token in-place or speculative decode, got 2."
    );
    // Not in place and not speculative: fewer columns are fine.
    c.plan(|a| a.state_indices = Some(&two));
}

#[test]
fn state_required_for_initial_state_and_inplace() {
    let mut c = Case::new(2, 1);
    c.state = None;
    err(c.run(|_| {}), "state", "state must be provided when use_initial_state=True.");
    let inplace = |a: &mut DecodeArgs| (a.use_initial_state, a.inplace_final_state) = (Some(false), true);
    err(c.run(inplace), "state", "state must be provided when inplace_final_state=True.");
    c.plan(|a| a.use_initial_state = Some(false));
}

#[test]
fn state_dtype_device_and_agreement() {
    let mut c = Case::new(2, 1);
    c.state = Some(tv(6, &[2, HV, D, D], F16));
    err(c.run(|a| a.state_dtype = Some(F32)), "state", "state must have dtype f32 or bf16, got f16.");
    c.state = Some(on(1, tv(6, &[2, HV, D, D], F32)));
    err(c.run(|_| {}), "state", "Expected state to be on device cuda:0");
    c.state = Some(tv(6, &[2, HV, D, D], BF16));
    err(c.run(|a| a.state_dtype = Some(F32)), "state", "state has dtype bf16, but state_dtype=f32.");
}

#[test]
fn state_shape_and_pool_size() {
    let mut c = Case::new(2, 1);
    c.state = Some(tv(6, &[2, HV + 1, D, D], F32));
    err(c.run(|_| {}), "state", "expected trailing dimensions [4, 128, 128], got [2, 5, 128, 128].");
    c.state = Some(tv(6, &[1, HV, D, D], F32));
    err(c.run(|_| {}), "state", "state pool must contain at least 2 slots, got 1.");
    c.state = Some(tv(6, &[0, HV, D, D], F32));
    let si = tv(9, &[2], I32);
    err(c.run(|a| a.state_indices = Some(&si)), "state", "state pool must contain at least one slot.");
}

// ---- checks beyond the reference ----

#[test]
fn k_v_a_b_share_q_dtype() {
    let c = Case::new(2, 1);
    let k = tv(9, &[2, 1, 2, D], F16);
    err(c.run(|a| a.k = &k), "k", "k must have q's dtype bf16, got f16.");
    let b = tv(9, &[2, 1, HV], F32);
    err(c.run(|a| a.b = &b), "b", "b must have q's dtype bf16, got f32.");
}

#[test]
fn b_is_scalar_or_headwise() {
    let c = Case::new(2, 1);
    let bad = tv(9, &[2, 1, HV, 64], BF16);
    err(c.run(|a| a.b = &bad), "b", "b must have shape [B, T, HV] = [2, 1, 4] or [B, T, HV, V]");
    let headwise = tv(9, &[2, 1, HV, D], BF16);
    assert!(c.plan(|a| a.b = &headwise).beta_headwise);
    assert!(!c.plan(|_| {}).beta_headwise);
}

#[test]
fn head_dims_must_be_128() {
    let mut c = Case::new(2, 1);
    c.q = tv(1, &[2, 1, 2, 64], BF16);
    c.k = tv(2, &[2, 1, 2, 64], BF16);
    c.a = tv(4, &[2, 1, HV, 64], BF16);
    c.state = Some(tv(6, &[2, HV, D, 64], F32));
    let e = err(c.run(|_| {}), "q", "only 128 is supported");
    assert!(is_unsupported(&e));
    let mut c = Case::new(2, 1);
    c.v = tv(3, &[2, 1, HV, 64], BF16);
    c.state = Some(tv(6, &[2, HV, 64, D], F32));
    err(c.run(|_| {}), "v", "head dim V = 64: only 128 is supported");
}

#[test]
fn index_tensors_must_be_integers() {
    let c = Case::new(1, 3);
    let cu = tv(9, &[2], F32);
    err(c.run(|a| a.cu_seqlens = Some(&cu)), "cu_seqlens", "cu_seqlens must have dtype i32 or i64, got f32.");
    let nat = tv(10, &[1], F32);
    err(c.run(|a| a.num_accepted_tokens = Some(&nat)), "num_accepted_tokens", "must have dtype i32 or i64");
}

#[test]
fn varlen_needs_leading_batch_of_one() {
    let cu = tv(9, &[3], I32);
    err(Case::new(2, 3).run(|a| a.cu_seqlens = Some(&cu)), "q", "q.shape[0] must be 1 when cu_seqlens is provided");
}

#[test]
fn cu_seqlens_needs_at_least_one_entry() {
    let cu = tv(9, &[0], I32);
    err(Case::new(1, 3).run(|a| a.cu_seqlens = Some(&cu)), "cu_seqlens", "N + 1 >= 1 entries");
}

#[test]
fn allow_neg_eigval_needs_beta_sigmoid() {
    let c = Case::new(2, 1);
    err(c.run(|a| a.allow_neg_eigval = Some(true)), "allow_neg_eigval", "requires apply_beta_sigmoid=True");
    let p = c.plan(|a| (a.allow_neg_eigval, a.apply_beta_sigmoid) = (Some(true), Some(true)));
    assert_eq!(p.beta, BetaRule::TwoSigmoid);
}

#[test]
fn index_tensors_and_final_state_on_q_device() {
    let c = Case::new(2, 1);
    let si = on(1, tv(9, &[2], I32));
    err(c.run(|a| a.state_indices = Some(&si)), "state_indices", "Expected state_indices to be on device cuda:0");
    let fs = on(1, tv(9, &[2, HV, D, D], F32));
    let store = c.run(|a| (a.store_final_state, a.final_state) = (true, Some(&fs)));
    err(store, "final_state", "Expected final_state to be on device cuda:0, got cuda:1.");
}

#[test]
fn pointers_must_be_16_byte_aligned() {
    let mut c = Case::new(2, 1);
    c.q = // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(0x1008, &[2, 1, 2, D], BF16, 0) }.expect("valid view");
    let e = err(c.run(|_| {}), "q", "q must be 16-byte aligned");
    assert!(is_unsupported(&e));
    assert!(e.message().contains("0x1008"));
    let c = Case::new(2, 1);
    let out = // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(0x2004, &[2, 1, HV, D], F32, 0) }.expect("valid view");
    err(c.run(|a| a.output = Some(&out)), "output", "16-byte aligned");
    // Zero elements: nothing is accessed, so the address does not matter.
    let mut c = Case::new(0, 1);
    c.q = // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(0x1001, &[0, 1, 2, D], BF16, 0) }.expect("valid view");
    assert!(c.plan(|_| {}).empty);
}

#[test]
fn final_state_only_when_a_new_state_is_returned() {
    let c = Case::new(2, 1);
    let fs = tv(9, &[2, HV, D, D], F32);
    err(c.run(|a| a.final_state = Some(&fs)), "final_state", "returns no new state tensor");
    let inplace = c.run(|a| (a.store_final_state, a.inplace_final_state, a.final_state) = (true, true, Some(&fs)));
    err(inplace, "final_state", "returns no new state tensor");
    c.plan(|a| (a.store_final_state, a.final_state) = (true, Some(&fs)));
}

#[test]
fn final_state_must_match_returned_shape_and_dtype() {
    let c = Case::new(2, 1);
    let wrong_dtype = tv(9, &[2, HV, D, D], BF16);
    let e = err(c.run(|a| (a.store_final_state, a.final_state) = (true, Some(&wrong_dtype))), "final_state", "");
    assert!(e.message().contains("shape [2, 4, 128, 128] and dtype f32, got [2, 4, 128, 128] of bf16"));
    // Per-token states with state_indices: [B * T, HV, ..].
    let c = Case::new(2, 3);
    let si = tv(10, &[2, 3], I32);
    let per_seq = tv(9, &[2, HV, D, D], F32);
    err(c.run(|a| (a.state_indices, a.final_state) = (Some(&si), Some(&per_seq))), "final_state", "[6, 4, 128, 128]");
    let per_token = tv(9, &[6, HV, D, D], F32);
    c.plan(|a| (a.state_indices, a.final_state) = (Some(&si), Some(&per_token)));
}

// ---- resolved defaults and the written/returned table ----

#[test]
fn defaults_resolve_as_documented() {
    let p = Case::new(2, 3).plan(|_| {});
    assert_eq!((p.b, p.t, p.h, p.hv, p.k, p.v, p.n, p.total_tokens), (2, 3, 2, HV, D, D, 2, 6));
    assert_eq!(p.scale, (128f64).powf(-0.5) as f32);
    assert!(p.use_qk_l2norm && p.use_initial_state && p.state_v_first && !p.varlen);
    assert_eq!(p.gate, GateRule::Softplus);
    assert_eq!(p.beta, BetaRule::Raw);
    assert!(!p.has_a_log && !p.has_dt_bias && p.dt_bias_dtype.is_none());
    assert_eq!((p.qkv_dtype, p.output_dtype, p.state_dtype), (BF16, BF16, F32));
    assert_eq!(p.output_shape, [2, 3, HV, D]);
    assert_eq!(p.indices, StateIndexing::None);
    assert!(!p.spec_decoding && !p.inplace_final_state && !p.store_final_state && !p.empty);
    assert_eq!((p.pool_slots, p.returned_state), (2, None));
}

#[test]
fn explicit_options_resolve() {
    let mut c = Case::new(2, 1);
    c.state = Some(tv(6, &[2, HV, D, D], BF16));
    let p = c.plan(|a| {
        (a.scale, a.use_qk_l2norm, a.use_lower_bound, a.lower_bound) = (Some(0.5), Some(false), Some(true), Some(-5.0));
        (a.apply_beta_sigmoid, a.state_v_first) = (Some(true), Some(false));
    });
    assert_eq!((p.scale, p.use_qk_l2norm, p.state_dtype), (0.5, false, BF16));
    assert_eq!(p.gate, GateRule::LowerBound { lower_bound: -5.0 });
    assert_eq!(p.beta, BetaRule::Sigmoid);
    assert!(!p.state_v_first);
    // An explicit 0 is taken as written (no decay); a missing bound is an error naming it (the
    // reference silently runs with 0).
    let p = c.plan(|a| (a.use_lower_bound, a.lower_bound) = (Some(true), Some(0.0)));
    assert_eq!(p.gate, GateRule::LowerBound { lower_bound: 0.0 });
    err(c.run(|a| a.use_lower_bound = Some(true)), "lower_bound", "use_lower_bound=True needs lower_bound");
}

#[test]
fn precomputed_gate_ignores_a_log_and_dt_bias() {
    let (a_log, dt_bias) = (tv(9, &[HV], F32), tv(10, &[HV, D], F32));
    let c = Case::new(2, 1);
    let p = c.plan(|a| (a.a_log, a.dt_bias, a.use_gate_in_kernel) = (Some(&a_log), Some(&dt_bias), Some(false)));
    assert_eq!(p.gate, GateRule::Precomputed);
    assert!(!p.has_a_log && !p.has_dt_bias && p.dt_bias_dtype.is_none());
    let p = c.plan(|a| (a.a_log, a.dt_bias) = (Some(&a_log), Some(&dt_bias)));
    assert!(p.has_a_log && p.has_dt_bias);
    assert_eq!(p.dt_bias_dtype, Some(F32));
}

#[test]
fn returned_state_follows_the_table() {
    let c = Case::new(2, 3);
    let si = tv(9, &[2, 3], I64);
    let rows = [
        (true, true, false, None),
        (true, false, false, Some([6, HV, D, D])),
        (true, false, true, Some([6, HV, D, D])),
        (false, false, false, None),
        (false, true, true, None),
        (false, false, true, Some([2, HV, D, D])),
    ];
    for (indexed, inplace, store, want) in rows {
        let p = c.plan(|a| {
            a.state_indices = indexed.then_some(&si);
            (a.inplace_final_state, a.store_final_state) = (inplace, store);
        });
        assert_eq!(p.returned_state, want, "indexed={indexed} inplace={inplace} store={store}");
    }
    let p = c.plan(|a| (a.state_indices, a.state_v_first) = (Some(&si), Some(false)));
    assert_eq!(p.indices, StateIndexing::PerToken { columns: 3, dtype: I64 });
    assert_eq!(p.returned_state, Some([6, HV, D, D]));
}

#[test]
fn varlen_plan() {
    let c = Case::new(1, 7).pool(3);
    let cu = tv(9, &[4], I64);
    let p = c.plan(|a| {
        a.cu_seqlens = Some(&cu);
        a.store_final_state = true;
    });
    assert!(p.varlen);
    assert_eq!((p.n, p.total_tokens, p.cu_seqlens_dtype), (3, 7, Some(I64)));
    assert_eq!(p.returned_state, Some([3, HV, D, D]));
    // cu_seqlens given but is_varlen=false: ignored, N = B.
    let p = c.plan(|a| (a.cu_seqlens, a.is_varlen) = (Some(&cu), Some(false)));
    assert_eq!((p.varlen, p.n, p.cu_seqlens_dtype), (false, 1, None));
}

#[test]
fn empty_work_and_scratch_pool() {
    assert!(Case::new(0, 1).plan(|_| {}).empty);
    assert!(Case::new(2, 0).plan(|_| {}).empty);
    let cu = tv(9, &[1], I32);
    let p = Case::new(1, 0).plan(|a| a.cu_seqlens = Some(&cu));
    assert!(p.empty && p.n == 0);
    // T = 0 with a per-sequence final state to produce: the kernel still copies the states.
    assert!(!Case::new(2, 0).plan(|a| a.store_final_state = true).empty);
    let mut c = Case::new(2, 1);
    c.state = None;
    let si = tv(9, &[2], I32);
    let p = c.plan(|a| (a.use_initial_state, a.state_indices) = (Some(false), Some(&si)));
    assert_eq!((p.pool_slots, p.indices), (2, StateIndexing::PerSequence { dtype: I32 }));
    assert_eq!(c.plan(|a| a.use_initial_state = Some(false)).pool_slots, 0);
}

#[test]
fn errors_display_and_convert() {
    let e = DecodeError::InvalidArgument { arg: "k", message: "bad.".into() };
    assert_eq!(e.to_string(), "k: bad.");
    let converted = RuntimeError::from(e.clone());
    assert!(matches!(&converted, RuntimeError::Decode(DecodeError::InvalidArgument { arg: "k", .. })));
    assert_eq!(converted.to_string(), "gated_delta_rule_decode: bad argument k: bad.");
    let source = std::error::Error::source(&converted).expect("a source");
    assert_eq!(source.downcast_ref::<DecodeError>(), Some(&e));
    let e = DecodeError::Unsupported { arg: "q", message: "no.".into() };
    assert_eq!(RuntimeError::from(e.clone()), RuntimeError::Decode(e));
}

/// A failed driver call keeps the driver's code: out of memory and an illegal address can be
/// matched. (Built by hand: naming a driver error asks the driver, which CI does not have.)
#[test]
fn driver_errors_keep_their_code() {
    use kda_runtime::error::CUresult;
    let failed = |op, code| RuntimeError::Driver { op, code, message: String::new() };
    let oom = failed("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert!(matches!(oom, RuntimeError::Driver { code: CUresult::CUDA_ERROR_OUT_OF_MEMORY, .. }));
    assert!(oom.is_out_of_memory());
    let illegal = failed("cuStreamSynchronize", CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(illegal.driver_code(), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
    assert!(!illegal.is_out_of_memory() && RuntimeError::NoGpu.driver_code().is_none());
}

// ---- checked mode ----

/// A plan for `[n, t]` tokens with `[n, columns]` state indices into an 8-slot pool.
fn indexed_plan(n: usize, t: usize, columns: usize, inplace: bool, spec: bool) -> DecodePlan {
    let c = Case::new(n, t).pool(8);
    let (si, nat) = (tv(9, &[n, columns], I32), tv(10, &[n], I32));
    c.plan(|a| {
        (a.state_indices, a.inplace_final_state) = (Some(&si), inplace);
        a.num_accepted_tokens = spec.then_some(&nat);
    })
}

#[test]
fn checked_cu_seqlens_monotone_from_zero_to_s() {
    let c = Case::new(1, 5).pool(2);
    let cu = tv(9, &[3], I32);
    let p = c.plan(|a| a.cu_seqlens = Some(&cu));
    check_indices(&p, Some(&[0, 2, 5]), None, None).expect("valid");
    err(check_indices(&p, Some(&[1, 2, 5]), None, None), "cu_seqlens", "cu_seqlens[0] must be 0, got 1.");
    err(check_indices(&p, Some(&[0, 3, 2]), None, None), "cu_seqlens", "cu_seqlens[2] = 2 < cu_seqlens[1] = 3");
    err(check_indices(&p, Some(&[0, 2, 4]), None, None), "cu_seqlens", "cu_seqlens[2] must equal S = 5");
}

#[test]
fn checked_host_copies_must_match_the_plan() {
    let p = indexed_plan(2, 2, 2, false, false);
    err(check_indices(&p, None, None, None), "state_indices", "needs a host copy");
    err(check_indices(&p, None, Some(&[0, 1, 2]), None), "state_indices", "has 3 entries, expected 4");
    err(check_indices(&p, None, Some(&[0, 1, 2, 3]), Some(&[1, 1])), "num_accepted_tokens", "does not read");
}

#[test]
fn checked_state_indices_in_pool_or_negative() {
    let p = indexed_plan(2, 2, 2, false, false);
    check_indices(&p, None, Some(&[0, -1, 7, -5]), None).expect("negative entries are padding");
    err(check_indices(&p, None, Some(&[0, 1, 8, 2]), None), "state_indices", "state_indices[1, 0] = 8 is outside");
}

#[test]
fn checked_counts_within_columns() {
    let p = indexed_plan(2, 2, 2, false, true);
    let si: &[i64] = &[0, 1, 2, 3];
    check_indices(&p, None, Some(si), Some(&[1, 2])).expect("valid");
    err(check_indices(&p, None, Some(si), Some(&[0, 2])), "num_accepted_tokens", "num_accepted_tokens[0] = 0");
    err(check_indices(&p, None, Some(si), Some(&[1, 3])), "num_accepted_tokens", "outside [1, 2]");
}

#[test]
fn checked_no_slot_written_twice() {
    let p = indexed_plan(2, 2, 2, true, false);
    check_indices(&p, None, Some(&[0, 1, 2, 3]), None).expect("valid");
    let e = err(check_indices(&p, None, Some(&[0, 1, 2, 1]), None), "state_indices", "");
    assert!(e.message().starts_with("pool slot 1 is written by token 1 of sequence 0 and by token 1 of sequence 1"));
    // Padding sequences write nothing, and padded entries are skipped.
    check_indices(&p, None, Some(&[-1, 1, 2, -1]), None).expect("valid");
}

#[test]
fn checked_no_read_of_another_sequences_write() {
    let p = indexed_plan(2, 2, 3, true, true);
    // Sequence 1 reads idx[1, nat - 1] = idx[1, 2] = slot 0, which sequence 0 writes.
    let (si, nat): (&[i64], &[i64]) = (&[0, 1, 5, 2, 3, 0], &[1, 3]);
    let e = err(check_indices(&p, None, Some(si), Some(nat)), "state_indices", "");
    assert_eq!(e.message(), "sequence 1 reads pool slot 0, which sequence 0 writes in the same call.");
    // Not reading the initial state: nothing is read, so no conflict.
    let c = Case::new(2, 2).pool(8);
    let (si_t, nat_t) = (tv(9, &[2, 3], I32), tv(10, &[2], I32));
    let p = c.plan(|a| {
        (a.state_indices, a.num_accepted_tokens, a.inplace_final_state) = (Some(&si_t), Some(&nat_t), true);
        a.use_initial_state = Some(false);
    });
    check_indices(&p, None, Some(si), Some(nat)).expect("no reads");
}

#[test]
fn checked_varlen_inplace_sequence_fits_columns() {
    let c = Case::new(1, 5).pool(8);
    let (cu, si) = (tv(9, &[3], I32), tv(10, &[2, 3], I32));
    let p = c.plan(|a| (a.cu_seqlens, a.state_indices, a.inplace_final_state) = (Some(&cu), Some(&si), true));
    check_indices(&p, Some(&[0, 3, 5]), Some(&[0, 1, 2, 3, 4, -1]), None).expect("valid");
    err(check_indices(&p, Some(&[0, 1, 5]), Some(&[0, 1, 2, 3, 4, 5]), None), "cu_seqlens", "sequence 1 has 4 tokens");
}

#[test]
fn launch_shape_follows_tokens_per_sequence_and_sequence_count() {
    use kda_runtime::decode::{decode_config, decode_shape};
    let shape = |p: &DecodePlan| {
        let t = decode_shape(p);
        (t.rows, t.warps, t.min_blocks, t.stages, t.max_items, t.lanes_per_row)
    };
    // An f32 state: a block per sequence; several tokens each put a state row across a warp
    // (V-first only).
    assert_eq!(shape(&Case::new(1, 1).plan(|_| {})), (32, 2, 6, 2, 1, 4));
    assert_eq!(shape(&Case::new(7, 1).plan(|_| {})), (32, 2, 6, 2, 1, 4));
    assert_eq!(shape(&Case::new(8, 1).plan(|_| {})), (64, 2, 4, 2, 1, 4));
    assert_eq!(shape(&Case::new(1, 2).plan(|_| {})), (32, 2, 6, 2, 1, 32));
    assert_eq!(shape(&Case::new(8, 2).plan(|_| {})), (32, 2, 6, 2, 1, 32));
    assert_eq!(shape(&Case::new(8, 2).plan(|a| a.state_v_first = Some(false))), (64, 2, 4, 2, 1, 4));
    // A bf16 state: two sequences per block for one token each, one wave of blocks that take
    // many sequences otherwise.
    let bf16 = |b, t| {
        let mut c = Case::new(b, t);
        c.state = Some(tv(6, &[b * t, HV, D, D], BF16));
        c
    };
    assert_eq!(shape(&bf16(8, 1).plan(|_| {})), (64, 2, 4, 3, 2, 4));
    assert_eq!(shape(&bf16(7, 1).plan(|_| {})), (32, 2, 6, 2, 256, 4));
    assert_eq!(shape(&bf16(8, 2).plan(|_| {})), (16, 1, 8, 2, 256, 4));
    // Several tokens in some sequence of a varlen call; two sequences of one token each stay
    // single-token.
    let c = Case::new(1, 3).pool(4);
    let cu = tv(9, &[3], I32);
    let p = c.plan(|a| a.cu_seqlens = Some(&cu));
    assert_eq!((p.n, p.total_tokens), (2, 3));
    let cfg = decode_config(&p);
    assert!(cfg.shape.whole_line_stores);
    let c = Case::new(1, 2).pool(4);
    let p = c.plan(|a| a.cu_seqlens = Some(&cu));
    assert!(!decode_config(&p).shape.whole_line_stores);
    // The config the call launches carries the shape.
    let cfg = decode_config(&Case::new(8, 1).plan(|_| {}));
    assert_eq!(
        (cfg.shape.rows, cfg.shape.warps, cfg.shape.min_blocks, cfg.shape.stages, cfg.shape.max_items),
        (64, 2, 4, 2, 1)
    );
}

/// The variants a kind of call can pick include the one each batch size picks.
#[test]
fn decode_variants_cover_every_batch_size() {
    use kda_runtime::decode::{decode_config, decode_variants};
    let pool = tv(6, &[70_000, HV, D, D], F32);
    let kind = |b: usize| {
        let mut c = Case::new(b, 1);
        c.state = Some(pool);
        c
    };
    let slots = |b: usize| tv(7, &[b], I32);
    let plan_of = |b: usize| {
        let c = kind(b);
        let s = slots(b);
        c.plan(|a| {
            a.state_indices = Some(&s);
            a.inplace_final_state = true;
        })
    };
    let variants = decode_variants(&plan_of(1));
    for b in [1, 7, 8, 64, 66_000] {
        let cfg = decode_config(&plan_of(b));
        assert!(variants.contains(&cfg), "B = {b}: {} not among {} variants", cfg.key(), variants.len());
    }
    assert!(variants.len() >= 3, "{}", variants.len());
}

/// the scalar checks: a NaN or infinite `scale` or `lower_bound` is a typed error naming
/// it (the reference would run with it).
#[test]
fn non_finite_scalars_are_rejected() {
    let c = Case::new(2, 1);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        err(c.run(|a| a.scale = Some(bad)), "scale", "must be finite");
        err(c.run(|a| a.lower_bound = Some(bad)), "lower_bound", "must be finite");
    }
    assert!(c.run(|a| a.scale = Some(0.25)).is_ok());
}
