//! Validation of [`DecodeArgs`] and the launch plan it resolves to.
//!
//! [`plan_decode`] runs the reference's checks first, in the reference's order and with its
//! messages (`torch.float32` reads `f32`, shapes print as `[..]`, devices as `cuda:N`), then the
//! checks docs/semantics.md adds ("Checks beyond the reference"). Errors name the [`DecodeArgs`]
//! field.

use kda_dsl::dtype::DType;

use super::args::DecodeArgs;
use crate::tensor::TensorView;
use crate::validate::{self, shape, ArgError, HEAD_DIM};

validate::arg_error_type!(
    /// Why [`plan_decode`] (or the checked mode) rejected a call.
    DecodeError,
    "DecodeArgs",
    Decode
);

pub use crate::rules::{BetaRule, GateRule};

/// How sequences and tokens map to slots of the state pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateIndexing {
    /// No `state_indices`: sequence `n` uses slot `n`.
    None,
    /// `state_indices` is `[N]`: one slot per sequence (the `[N, 1]` case).
    PerSequence {
        /// Index dtype (i32 or i64).
        dtype: DType,
    },
    /// `state_indices` is `[N, columns]`: slot `idx[n, t]` per token.
    PerToken {
        /// Entries per sequence.
        columns: usize,
        /// Index dtype (i32 or i64).
        dtype: DType,
    },
}

/// A validated decode call with every default resolved; all a launch needs besides pointers.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePlan {
    /// Batch `B` (`q.shape[0]`; 1 for varlen).
    pub b: usize,
    /// Tokens per sequence `T` (`q.shape[1]`; the total `S` for varlen).
    pub t: usize,
    /// Query/key heads `H`.
    pub h: usize,
    /// Value heads `HV` (a multiple of `H`).
    pub hv: usize,
    /// Key head dim `K` (128).
    pub k: usize,
    /// Value head dim `V` (128).
    pub v: usize,
    /// Logical batch `N`: `B`, or `cu_seqlens` entries - 1 for varlen.
    pub n: usize,
    /// Whether the varlen path runs (`is_varlen`, default: `cu_seqlens` given).
    pub varlen: bool,
    /// Tokens in the call: `B * T` (`S` for varlen).
    pub total_tokens: usize,
    /// Resolved query scale (default `K^-0.5`).
    pub scale: f32,
    /// Whether q and k are L2-normalized in the kernel (default true).
    pub use_qk_l2norm: bool,
    /// The gate rule.
    pub gate: GateRule,
    /// Whether the kernel reads `A_log` (given and the gate is computed in the kernel).
    pub has_a_log: bool,
    /// Whether the kernel reads `dt_bias` (given and the gate is computed in the kernel).
    pub has_dt_bias: bool,
    /// `dt_bias`'s dtype when the kernel reads it.
    pub dt_bias_dtype: Option<DType>,
    /// The beta rule.
    pub beta: BetaRule,
    /// Whether beta is headwise (`b` is `[B, T, HV, V]`).
    pub beta_headwise: bool,
    /// Dtype of q, k, v, a and b.
    pub qkv_dtype: DType,
    /// Output dtype (the given output's, else q's).
    pub output_dtype: DType,
    /// Output shape `[B, T, HV, V]`.
    pub output_shape: [usize; 4],
    /// State dtype (f32 or bf16): `state_dtype`, else the state's, else f32.
    pub state_dtype: DType,
    /// State layout: `[.., HV, V, K]` when true, `[.., HV, K, V]` when false (default true).
    pub state_v_first: bool,
    /// Whether the initial state is read from the pool (default true; zeros otherwise).
    pub use_initial_state: bool,
    /// How sequences and tokens map to pool slots.
    pub indices: StateIndexing,
    /// `cu_seqlens`' dtype when the varlen path reads it.
    pub cu_seqlens_dtype: Option<DType>,
    /// Whether `num_accepted_tokens` is given (speculative decoding).
    pub spec_decoding: bool,
    /// `num_accepted_tokens`' dtype when given.
    pub num_accepted_dtype: Option<DType>,
    /// Whether final states are written into the pool (`inplace_final_state`).
    pub inplace_final_state: bool,
    /// Whether a final state is stored without `state_indices` (`store_final_state`).
    pub store_final_state: bool,
    /// Pool slots: `state.shape[0]`. Without a state, the size of the reference's scratch pool,
    /// which only decides which indices are padding: `N` with `state_indices`, else 0.
    pub pool_slots: usize,
    /// Shape of the new state tensor the call returns (see the written/returned table of
    /// docs/semantics.md); `None` when it returns none or returns the pool itself.
    pub returned_state: Option<[usize; 4]>,
    /// True when no kernel needs to run (no sequence, or no token and no per-sequence final
    /// state to write): the caller returns at once.
    pub empty: bool,
}

/// Validates a decode call and resolves its defaults; pure host code, reads no device memory.
///
/// ```
/// use kda_dsl::DType::{BF16, F32};
/// use kda_runtime::decode::{plan_decode, DecodeArgs};
/// use kda_runtime::TensorView;
/// // SAFETY: planning reads no device memory, and these descriptors are never launched.
/// let tv = |id: u64, shape: &[usize], d| unsafe { TensorView::from_raw(0x1000 * id, shape, d, 0) }.unwrap();
/// let (q, k) = (tv(1, &[4, 1, 2, 128], BF16), tv(2, &[4, 1, 2, 128], BF16));
/// let (v, a, b) = (tv(3, &[4, 1, 4, 128], BF16), tv(4, &[4, 1, 4, 128], BF16), tv(5, &[4, 1, 4], BF16));
/// let state = tv(6, &[4, 4, 128, 128], F32);
/// let mut args = DecodeArgs::new(&q, &k, &v, &a, &b);
/// args.state = Some(&state);
/// let plan = plan_decode(&args).expect("a valid call");
/// assert_eq!(plan.n, 4);
/// ```
pub fn plan_decode(args: &DecodeArgs) -> Result<DecodePlan, DecodeError> {
    let q = args.q;
    let state_v_first = args.state_v_first.unwrap_or(true);
    let varlen = args.is_varlen.unwrap_or(args.cu_seqlens.is_some());
    let use_initial_state = args.use_initial_state.unwrap_or(true);
    let inplace = args.inplace_final_state;
    let state_dtype = args.state_dtype.or(args.state.map(|s| s.dtype())).unwrap_or(DType::F32);
    if !matches!(state_dtype, DType::F32 | DType::BF16) {
        let arg = if args.state_dtype.is_some() { "state_dtype" } else { "state" };
        return Err(invalid(arg, format!("state_dtype must be f32 or bf16, got {state_dtype}.")));
    }
    let [b, t, h, k, hv, v] = validate_common(args)?;
    let n = logical_batch(args, varlen, b)?;
    if let Some(nat) = args.num_accepted_tokens {
        if nat.shape() != [n] {
            return Err(invalid(
                "num_accepted_tokens",
                format!("num_accepted_tokens must have shape [B={n}], got {}.", shape(nat)),
            ));
        }
    }
    let indices = state_indexing(args, varlen, n, t)?;
    let pool_slots = check_state(args, state_dtype, [n, hv, v, k], state_v_first)?;

    let beta_headwise = check_beyond_reference(args, [b, t, k, hv, v], varlen)?;
    let cu_seqlens = args.cu_seqlens.filter(|_| varlen);
    let apply_beta_sigmoid = args.apply_beta_sigmoid.unwrap_or(false);
    let allow_neg_eigval = args.allow_neg_eigval.unwrap_or(false);

    let total_tokens = b.checked_mul(t).ok_or_else(|| invalid("q", format!("B * T overflows, got q={}.", shape(q))))?;
    let [d1, d2] = if state_v_first { [v, k] } else { [k, v] };
    let returned_state = match (indices, inplace, args.store_final_state) {
        (StateIndexing::None, false, true) => Some([n, hv, d1, d2]),
        (StateIndexing::None, ..) | (_, true, _) => None,
        (_, false, _) => Some([total_tokens, hv, d1, d2]),
    };
    check_final_state(args.final_state, returned_state, state_dtype)?;

    // the scalar checks (the reference accepts NaN and infinities).
    if let Some(scale) = args.scale.filter(|s| !s.is_finite()) {
        return Err(invalid("scale", format!("scale must be finite, got {scale}.")));
    }
    if let Some(lb) = args.lower_bound.filter(|l| !l.is_finite()) {
        return Err(invalid("lower_bound", format!("lower_bound must be finite, got {lb}.")));
    }
    let gate = match (args.use_gate_in_kernel.unwrap_or(true), args.use_lower_bound.unwrap_or(false)) {
        (false, _) => GateRule::Precomputed,
        (true, false) => GateRule::Softplus,
        // The reference runs a missing bound as 0, a gate that never decays: never what a
        // caller meant (docs/semantics.md, "Combinations the reference leaves open").
        (true, true) => GateRule::LowerBound {
            lower_bound: args.lower_bound.ok_or_else(|| {
                invalid(
                    "lower_bound",
                    "use_lower_bound=True needs lower_bound (the reference's default 0 never decays the state).".into(),
                )
            })?,
        },
    };
    let in_kernel = gate.in_kernel();
    let dt_bias_dtype = args.dt_bias.filter(|_| in_kernel).map(|d| d.dtype());
    let beta = BetaRule::from_flags(apply_beta_sigmoid, allow_neg_eigval);
    let per_sequence_write =
        indices == StateIndexing::None && args.store_final_state && (!inplace || !use_initial_state);
    Ok(DecodePlan {
        b,
        t,
        h,
        hv,
        k,
        v,
        n,
        varlen,
        total_tokens,
        scale: args.scale.unwrap_or((k as f64).powf(-0.5) as f32),
        use_qk_l2norm: args.use_qk_l2norm.unwrap_or(true),
        gate,
        has_a_log: in_kernel && args.a_log.is_some(),
        has_dt_bias: dt_bias_dtype.is_some(),
        dt_bias_dtype,
        beta,
        beta_headwise,
        qkv_dtype: q.dtype(),
        output_dtype: args.output.map_or(q.dtype(), |o| o.dtype()),
        output_shape: [b, t, hv, v],
        state_dtype,
        state_v_first,
        use_initial_state,
        indices,
        cu_seqlens_dtype: cu_seqlens.map(|c| c.dtype()),
        spec_decoding: args.num_accepted_tokens.is_some(),
        num_accepted_dtype: args.num_accepted_tokens.map(|x| x.dtype()),
        inplace_final_state: inplace,
        store_final_state: args.store_final_state,
        pool_slots,
        returned_state,
        empty: n == 0 || (total_tokens == 0 && !per_sequence_write),
    })
}

/// The checks docs/semantics.md adds beyond the reference; `dims` is `[B, T, K, HV, V]`. Returns
/// whether beta is headwise.
fn check_beyond_reference(args: &DecodeArgs, dims: [usize; 5], varlen: bool) -> Result<bool, DecodeError> {
    let q = args.q;
    let [b, t, k, hv, v] = dims;
    for (name, x) in [("k", args.k), ("v", args.v), ("a", args.a), ("b", args.b)] {
        if x.dtype() != q.dtype() {
            return Err(invalid(name, format!("{name} must have q's dtype {}, got {}.", q.dtype(), x.dtype())));
        }
    }
    let beta_headwise = match *args.b.shape() {
        [b0, b1, b2] if [b0, b1, b2] == [b, t, hv] => false,
        [b0, b1, b2, b3] if [b0, b1, b2, b3] == [b, t, hv, v] => true,
        _ => {
            let msg = format!("b must have shape [B, T, HV] = {:?} or [B, T, HV, V] = {:?}", [b, t, hv], [b, t, hv, v]);
            return Err(invalid("b", format!("{msg}, got {}.", shape(args.b))));
        }
    };
    if k != HEAD_DIM {
        return Err(unsupported("q", format!("head dim K = {k}: only {HEAD_DIM} is supported.")));
    }
    if v != HEAD_DIM {
        return Err(unsupported("v", format!("head dim V = {v}: only {HEAD_DIM} is supported.")));
    }
    if varlen && b != 1 {
        return Err(invalid(
            "q",
            format!(
                "q.shape[0] must be 1 when cu_seqlens is provided; flatten variable-length input as \
                 [1, S, H, 128], got q={}.",
                shape(q)
            ),
        ));
    }
    let cu_seqlens = args.cu_seqlens.filter(|_| varlen);
    for (name, x) in [("cu_seqlens", cu_seqlens), ("num_accepted_tokens", args.num_accepted_tokens)] {
        if let Some(x) = x.filter(|x| !x.dtype().is_int()) {
            return Err(invalid(name, format!("{name} must have dtype i32 or i64, got {}.", x.dtype())));
        }
    }
    let apply_beta_sigmoid = args.apply_beta_sigmoid.unwrap_or(false);
    let allow_neg_eigval = args.allow_neg_eigval.unwrap_or(false);
    if allow_neg_eigval && !apply_beta_sigmoid {
        return Err(invalid(
            "allow_neg_eigval",
            "allow_neg_eigval requires apply_beta_sigmoid=True (beta = 2 * sigmoid(b)).".into(),
        ));
    }
    let extra = [
        ("state_indices", args.state_indices),
        ("cu_seqlens", args.cu_seqlens),
        ("num_accepted_tokens", args.num_accepted_tokens),
        ("final_state", args.final_state),
    ];
    for (name, x) in extra {
        x.map_or(Ok(()), |x| same_device(q, name, x))?;
    }
    check_alignment(args)?;
    Ok(beta_headwise)
}

/// The reference's `_validate_common_decode_inputs`; returns `[B, T, H, K, HV, V]`.
fn validate_common(args: &DecodeArgs) -> Result<[usize; 6], DecodeError> {
    let (q, k, v, a) = (args.q, args.k, args.v, args.a);
    let qkv = "q, k, and v must each have shape [B, T, H, D] or [1, total_tokens, H, D].";
    let qs = rank4("q", q, qkv)?;
    let ks = rank4("k", k, qkv)?;
    let [bv, tv, hv, vd] = rank4("v", v, qkv)?;
    let a_shape = rank4("a", a, "a must have shape [B, T, HV, K].")?;
    if args.a_log.is_some_and(|x| x.shape().len() != 1) {
        return Err(invalid("a_log", "A_log must have shape [HV].".into()));
    }
    if args.dt_bias.is_some_and(|x| !matches!(x.shape().len(), 1 | 2)) {
        return Err(invalid("dt_bias", "dt_bias must have shape [HV, K] (or flat [HV * K]) when provided.".into()));
    }
    let [b, t, h, kd] = qs;
    if ks != qs {
        let msg = format!("k must match q shape [B, T, H, K], got q={}, k={}.", shape(q), shape(k));
        return Err(invalid("k", msg));
    }
    if [bv, tv] != [b, t] {
        let msg = format!("v must match q in batch/time dims, got q={}, v={}.", shape(q), shape(v));
        return Err(invalid("v", msg));
    }
    if hv.checked_rem(h) != Some(0) {
        return Err(invalid("v", format!("Expected HV to be divisible by H, got HV={hv}, H={h}.")));
    }
    if a_shape != [b, t, hv, kd] {
        return Err(invalid("a", format!("Expected a shape {:?}, got a={}.", [b, t, hv, kd], shape(a))));
    }
    if let Some(x) = args.a_log.filter(|x| x.numel() != hv) {
        return Err(invalid("a_log", format!("A_log must have {hv} elements, got {}.", x.numel())));
    }
    if let Some(x) = args.dt_bias {
        let flat_ok = x.shape().len() == 1 && hv.checked_mul(kd) == Some(x.numel());
        if x.shape() != [hv, kd] && !flat_ok {
            let msg =
                format!("dt_bias must have shape {:?} (or flat [HV * K]) when provided, got {}.", [hv, kd], shape(x));
            return Err(invalid("dt_bias", msg));
        }
    }
    if !q.dtype().is_half() {
        return Err(unsupported("q", format!("q/k/v dtype must be f16 or bf16, got {}.", q.dtype())));
    }
    if let Some(x) = args.a_log.filter(|x| x.dtype() != DType::F32) {
        return Err(invalid("a_log", format!("A_log must be f32, got A_log={}.", x.dtype())));
    }
    if let Some(x) = args.dt_bias.filter(|x| !matches!(x.dtype(), DType::F32 | DType::BF16)) {
        let msg = format!("dt_bias must be f32 or bf16 when provided, got dt_bias={}.", x.dtype());
        return Err(invalid("dt_bias", msg));
    }
    let others = [("k", Some(k)), ("v", Some(v)), ("a", Some(a)), ("b", Some(args.b))];
    for (name, x) in others.into_iter().chain([("a_log", args.a_log), ("dt_bias", args.dt_bias)]) {
        x.map_or(Ok(()), |x| same_device(q, name, x))?;
    }
    if let Some(out) = args.output {
        if out.shape() != [b, t, hv, vd] {
            let msg = format!("Expected output shape {:?}, got {}.", [b, t, hv, vd], shape(out));
            return Err(invalid("output", msg));
        }
        if !out.dtype().is_float() {
            let msg = format!("Unsupported output dtype {}. Supported dtypes: (f16, bf16, f32).", out.dtype());
            return Err(unsupported("output", msg));
        }
        same_device(q, "output", out)?;
    }
    Ok([b, t, h, kd, hv, vd])
}

/// `N`: `B`, or the number of sequences `cu_seqlens` describes.
fn logical_batch(args: &DecodeArgs, varlen: bool, b: usize) -> Result<usize, DecodeError> {
    if !varlen {
        return Ok(b);
    }
    let cu = args.cu_seqlens.filter(|c| c.shape().len() == 1);
    let cu = cu.ok_or_else(|| invalid("cu_seqlens", "cu_seqlens must be a 1D tensor when is_varlen=True.".into()))?;
    cu.numel()
        .checked_sub(1)
        .ok_or_else(|| invalid("cu_seqlens", "cu_seqlens must have N + 1 >= 1 entries for N sequences, got 0.".into()))
}

/// The reference's `state_indices` checks.
fn state_indexing(args: &DecodeArgs, varlen: bool, n: usize, t: usize) -> Result<StateIndexing, DecodeError> {
    let Some(si) = args.state_indices else {
        return Ok(StateIndexing::None);
    };
    let name = "state_indices";
    let (rows, columns) = match *si.shape() {
        [rows] => (rows, None),
        [rows, columns] => (rows, Some(columns)),
        _ => return Err(invalid(name, format!("state_indices must have shape [B] or [B, T], got {}.", shape(si)))),
    };
    let dtype = si.dtype();
    if !dtype.is_int() {
        return Err(invalid(name, format!("state_indices must have dtype i32 or i64, got {dtype}.")));
    }
    if rows != n {
        return Err(invalid(name, format!("state_indices first dimension must be {n}, got {rows}.")));
    }
    let spec = args.num_accepted_tokens.is_some();
    let inplace = args.inplace_final_state;
    let Some(columns) = columns else {
        if spec || (inplace && (varlen || t > 1)) {
            let msg = "1D state_indices only support non-speculative single-token in-place decode; use [B, T] \
                       state_indices for speculative, multi-token, or varlen in-place decode.";
            return Err(invalid(name, msg.into()));
        }
        return Ok(StateIndexing::PerSequence { dtype });
    };
    if columns < 1 {
        return Err(invalid(name, "state_indices must contain at least one column.".into()));
    }
    if !varlen && (inplace || spec) && columns < t {
        let msg = format!(
            "state_indices needs at least {t} columns for fixed multi-token in-place or speculative decode, got \
             {columns}."
        );
        return Err(invalid(name, msg));
    }
    Ok(StateIndexing::PerToken { columns, dtype })
}

/// The reference's `state` checks; returns the pool size (see [`DecodePlan::pool_slots`]).
/// `dims` is `[N, HV, V, K]`.
fn check_state(args: &DecodeArgs, state_dtype: DType, dims: [usize; 4], v_first: bool) -> Result<usize, DecodeError> {
    let [n, hv, v, k] = dims;
    let use_initial_state = args.use_initial_state.unwrap_or(true);
    let Some(state) = args.state else {
        if use_initial_state {
            return Err(invalid("state", "state must be provided when use_initial_state=True.".into()));
        }
        if args.inplace_final_state {
            return Err(invalid("state", "state must be provided when inplace_final_state=True.".into()));
        }
        return Ok(if args.state_indices.is_some() { n } else { 0 });
    };
    let dtype = state.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16) {
        return Err(invalid("state", format!("state must have dtype f32 or bf16, got {dtype}.")));
    }
    same_device(args.q, "state", state)?;
    if dtype != state_dtype {
        return Err(invalid("state", format!("state has dtype {dtype}, but state_dtype={state_dtype}.")));
    }
    let tail = if v_first { [hv, v, k] } else { [hv, k, v] };
    let pool = match *state.shape() {
        [pool, d0, d1, d2] if [d0, d1, d2] == tail => pool,
        _ => {
            let msg = format!(
                "state must have shape [pool, HV, V, K] for V-first or [pool, HV, K, V] for K-first; expected \
                 trailing dimensions {tail:?}, got {}.",
                shape(state)
            );
            return Err(invalid("state", msg));
        }
    };
    if args.state_indices.is_none() && pool < n {
        return Err(invalid("state", format!("state pool must contain at least {n} slots, got {pool}.")));
    }
    if args.state_indices.is_some() && pool == 0 {
        return Err(invalid("state", "state pool must contain at least one slot.".into()));
    }
    Ok(pool)
}

/// Every given tensor with elements must be 16-byte aligned (see [`validate::check_aligned`]).
fn check_alignment(args: &DecodeArgs) -> Result<(), DecodeError> {
    validate::check_aligned(&[
        ("q", Some(args.q)),
        ("k", Some(args.k)),
        ("v", Some(args.v)),
        ("state", args.state),
        ("a_log", args.a_log),
        ("a", Some(args.a)),
        ("dt_bias", args.dt_bias),
        ("num_accepted_tokens", args.num_accepted_tokens),
        ("cu_seqlens", args.cu_seqlens),
        ("b", Some(args.b)),
        ("state_indices", args.state_indices),
        ("output", args.output),
        ("final_state", args.final_state),
    ])
}

/// The preallocated `final_state` must be exactly the state tensor the call returns.
fn check_final_state(fs: Option<&TensorView>, returned: Option<[usize; 4]>, dtype: DType) -> Result<(), DecodeError> {
    match (fs, returned) {
        (Some(_), None) => Err(invalid(
            "final_state",
            "final_state is given, but this call returns no new state tensor (it stores no final state, or \
             writes it into the state pool in place)."
                .into(),
        )),
        (Some(fs), Some(want)) if fs.shape() != want || fs.dtype() != dtype => Err(invalid(
            "final_state",
            format!(
                "final_state must have the returned state's shape {want:?} and dtype {dtype}, got {} of {}.",
                shape(fs),
                fs.dtype()
            ),
        )),
        _ => Ok(()),
    }
}

fn rank4(name: &'static str, x: &TensorView, msg: &str) -> Result<[usize; 4], DecodeError> {
    x.shape().try_into().map_err(|_| invalid(name, msg.into()))
}

fn same_device(q: &TensorView, name: &'static str, x: &TensorView) -> Result<(), DecodeError> {
    validate::same_device(q, name, x)
}

pub(super) fn invalid(arg: &'static str, message: String) -> DecodeError {
    DecodeError::invalid(arg, message)
}

fn unsupported(arg: &'static str, message: String) -> DecodeError {
    DecodeError::unsupported(arg, message)
}
