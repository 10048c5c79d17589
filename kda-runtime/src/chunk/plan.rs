//! Validation of [`ChunkArgs`] and the launch plan it resolves to.
//!
//! [`plan_chunk`] runs the reference's checks first, in the reference's order and with its
//! messages (`torch.float32` reads `f32`), then the checks docs/semantics.md adds ("Checks beyond
//! the reference"), then resolves the defaults. Errors name the [`ChunkArgs`] field. Where the
//! reference raises `ValueError` the error is [`ChunkError::InvalidArgument`]; where it raises
//! `TypeError` (an unsupported dtype) it is [`ChunkError::Unsupported`], as decode maps
//! `NotImplementedError`. The head-dim limit (a `ValueError` in the reference) is `Unsupported`,
//! as decode's head-dim check is: it is a limit of the kernels, not a malformed call.
//!
//! Views are dense row-major by construction ([`TensorView`] has no strides), so contiguity
//! holds for every argument and is not checked separately. Like decode, outputs overlapping
//! inputs are not checked: that is the caller's contract.

use kda_dsl::dtype::DType;

use super::args::ChunkArgs;
use crate::tensor::TensorView;
use crate::validate::{self, shape, ArgError, HEAD_DIM};
use kda_kernels::chunk::{PREP_COLS, PREP_DECAY_COLS};
use kda_kernels::chunk_prep::prep_rows;

/// The reference's default `lower_bound`.
const DEFAULT_LOWER_BOUND: f32 = -5.0;

validate::arg_error_type!(
    /// Why [`plan_chunk`] (or the checked mode) rejected a call.
    ChunkError,
    "ChunkArgs",
    Chunk
);

pub use crate::rules::BetaRule;
/// How the per-channel log decay is obtained from the gate input `g` (prefill takes every rule;
/// its lower bound in `[-5, 0)`).
pub use crate::rules::GateRule as ChunkGate;

/// Where each sequence's initial state comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialState {
    /// No `initial_state`: every sequence starts from zeros.
    Zeros,
    /// `initial_state` `[N, HV, 128, 128]`: sequence `n` starts from `initial_state[n]`.
    PerSequence {
        /// `initial_state`'s dtype (f32 or q's).
        dtype: DType,
    },
    /// `state_indices` given: `initial_state` is the pool `[pool, HV, 128, 128]`; sequence `n`
    /// starts from `pool[state_indices[n]]` (zeros where `has_initial_state[n]` is 0) and writes
    /// its final state back there. A slot outside `[0, pool)` is padding: zero output rows,
    /// nothing read or written.
    Pool {
        /// The pool's dtype (f32, or bf16 with bf16 inputs).
        dtype: DType,
        /// `state_indices`' dtype (i32 or i64).
        indices: DType,
        /// `has_initial_state`'s dtype (i32 or i64) when given; `None`: every slot is read.
        has_initial: Option<DType>,
        /// Pool slots (`initial_state.shape[0]`, at least 1).
        pool: usize,
    },
}

/// Where the final states go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalState {
    /// `output_final_state` is false (a given `final_state` is ignored, as in the reference):
    /// no final state is written.
    None,
    /// Into the caller's `final_state` `[N, HV, 128, 128]`.
    Given {
        /// `final_state`'s dtype (f32 or q's; initial_state's when both are given).
        dtype: DType,
    },
    /// Into a tensor the call allocates and returns.
    Allocate {
        /// `initial_state`'s dtype, else q's (the reference's rule).
        dtype: DType,
        /// `[N, HV, 128, 128]`.
        shape: [usize; 4],
    },
    /// Back into the pool slots named by `state_indices`, in place (see
    /// [`InitialState::Pool`]); nothing new is returned.
    Pool,
}

/// A validated `chunk_kda` call with every default resolved; all a launch needs besides the
/// pointers, which it takes from the [`ChunkArgs`] it was planned from.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkPlan {
    /// Sequences `N`: `B`, or `cu_seqlens` entries - 1 for varlen.
    pub nseq: usize,
    /// Batch rows `B` of the 4-D form (`q.shape[0]`; 1 for varlen).
    pub batch: usize,
    /// Tokens per batch row `T` (`q.shape[1]`); the total `S` for varlen.
    pub seq_len: usize,
    /// Tokens in the call: `batch * seq_len`.
    pub total_tokens: usize,
    /// Query/key heads `H`.
    pub heads: usize,
    /// Value heads `HV` (a multiple of `H`; value head `hv` reads q/k head `hv / (HV / H)`).
    pub value_heads: usize,
    /// Dtype of q, k, v, g, beta and the output (f16 or bf16).
    pub dtype: DType,
    /// The gate rule.
    pub gate: ChunkGate,
    /// The beta rule (`Sigmoid` by default).
    pub beta: BetaRule,
    /// Resolved query scale (default `128^-0.5`), finite.
    pub scale: f32,
    /// Whether q and k are L2-normalized in the kernel (`use_qk_l2norm_in_kernel`, default true).
    pub l2norm: bool,
    /// `cu_seqlens`' dtype (i32 or i64) for a varlen call; `None` for a dense one.
    pub varlen: Option<DType>,
    /// Whether q was given as `[S, H, 128]` (the reference's `squeeze_varlen`): the output is
    /// then allocated and returned as `[S, HV, 128]` (a given 3-D output is that shape).
    pub squeeze_varlen: bool,
    /// Output shape in the 4-D form, `[B, T, HV, 128]` (v's shape; `[1, S, HV, 128]` for
    /// varlen).
    pub output_shape: [usize; 4],
    /// Whether `output` was given; otherwise the call allocates `output_shape` of `dtype`.
    pub output_given: bool,
    /// Where the initial states come from.
    pub initial: InitialState,
    /// Where the final states go.
    pub final_out: FinalState,
    /// The state dtype the kernel stores, resolved as the reference does: `initial_state`'s
    /// (the pool's), else `final_state`'s (when used), else q's.
    pub state_dtype: DType,
    /// `dt_bias`' dtype (f32 or bf16) when the lower-bound gate reads it; `None` otherwise.
    pub dt_bias: Option<DType>,
    /// The caller's `max_seqlen` hint, as given ([`ChunkArgs::max_seqlen`] says what it
    /// changes); the checked mode verifies it against `cu_seqlens` (whose contents are
    /// otherwise not read on the host).
    pub max_seqlen: Option<usize>,
    /// Whether the opt-in checked mode was requested (read the index tensors back first).
    pub checked: bool,
    /// No sequence owns a token (`N = 0`, or `B * T = 0` / `S = 0`): no output row is written.
    /// Not the same as "nothing to do": with `N > 0` the final states still have to be
    /// written ([`FinalState::Given`]/[`FinalState::Allocate`]: the initial state, or zeros),
    /// and with [`InitialState::Pool`] plus `has_initial_state`, slots of sequences without an
    /// initial state get zeros.
    pub empty: bool,
    /// Prefix caching (`prefix_lens`, checkpoints).
    pub prefix: super::prefix::PrefixPlan,
}

impl ChunkPlan {
    /// The most tokens a sequence of the call can have: a dense call's `T`; a varlen call's
    /// `S`, or its `max_seqlen` hint when shorter.
    pub fn longest_sequence(&self) -> usize {
        match (self.varlen, self.max_seqlen) {
            (Some(_), Some(hint)) => hint.min(self.seq_len),
            _ => self.seq_len,
        }
    }
}

/// Bytes of the two-kernel path's workspace: per value head and workspace row ([`prep_rows`]:
/// the tokens rounded up to whole chunks per dense row, plus 15 per varlen sequence), the
/// prepared operands in 16 bits (f16 or bf16, `ChunkOperands`); then per 16 rows a chunk's
/// decay and betas in f32.
pub(crate) fn chunk_workspace_bytes_unsplit(plan: &ChunkPlan) -> usize {
    let (wb, tp) = prep_rows(plan.batch, plan.seq_len, plan.nseq, plan.varlen.is_some(), plan.prefix.aligned());
    prepared_bytes(wb, tp, plan.value_heads)
}

/// Bytes of prepared operands for `wb` workspace rows of `tp` token rows each and `hv` value
/// heads (see [`chunk_workspace_bytes_unsplit`]); saturates at `usize::MAX`, and grows with each
/// argument.
pub(crate) fn prepared_bytes(wb: usize, tp: usize, hv: usize) -> usize {
    let heads = wb.saturating_mul(hv);
    let prep = heads.saturating_mul(tp).saturating_mul(PREP_COLS * 2);
    let decay = heads.saturating_mul(tp.div_ceil(16)).saturating_mul(PREP_DECAY_COLS * 4);
    prep.saturating_add(decay)
}

/// Bytes of the workspace's first part, the prepared operands; the decays and betas follow.
pub(crate) fn workspace_prep_bytes(plan: &ChunkPlan) -> usize {
    let (wb, tp) = prep_rows(plan.batch, plan.seq_len, plan.nseq, plan.varlen.is_some(), plan.prefix.aligned());
    wb * tp * plan.value_heads * PREP_COLS * 2
}

/// Validates a `chunk_kda` call and resolves its defaults; pure host code, reads no device
/// memory.
///
/// ```
/// use kda_dsl::DType::BF16;
/// use kda_runtime::chunk::{plan_chunk, ChunkArgs};
/// use kda_runtime::TensorView;
/// // SAFETY: planning reads no device memory, and these descriptors are never launched.
/// let tv = |id: u64, shape: &[usize]| unsafe { TensorView::from_raw(0x1000 * id, shape, BF16, 0) }.unwrap();
/// let (q, k, v, g) = (tv(1, &[1, 37, 2, 128]), tv(2, &[1, 37, 2, 128]), tv(3, &[1, 37, 4, 128]), tv(4, &[1, 37, 4, 128]));
/// let beta = tv(5, &[1, 37, 4]);
/// let plan = plan_chunk(&ChunkArgs::new(&q, &k, &v, &g, &beta)).expect("a valid call");
/// assert_eq!((plan.nseq, plan.value_heads, plan.l2norm), (1, 4, true));
/// let bad = tv(6, &[1, 37, 3]);
/// let e = plan_chunk(&ChunkArgs::new(&q, &k, &v, &g, &bad)).unwrap_err();
/// assert_eq!(e.arg(), "beta");
/// ```
pub fn plan_chunk(args: &ChunkArgs) -> Result<ChunkPlan, ChunkError> {
    let shapes = check_reference(args)?;
    let q = args.q;
    let [b, t, h, _] = shapes.q;
    let hv = shapes.v[2];
    // The reference ignores `final_state` unless `output_final_state` is set; so do all checks.
    let final_state = args.final_state.filter(|_| args.output_final_state);

    // ---- checks beyond the reference ----
    let n = logical_batch(args, b)?;
    check_gate_params(args, hv)?;
    let initial = check_initial_state(args, n, hv)?;
    let prefix = super::prefix::check_prefix(args, n, hv, initial)?;
    let state_shape = [n, hv, HEAD_DIM, HEAD_DIM];
    if let Some(fs) = final_state.filter(|fs| fs.shape() != state_shape) {
        let msg = format!("final_state must have shape [N, HV, 128, 128] = {state_shape:?}, got {}.", shape(fs));
        return Err(invalid("final_state", msg));
    }
    let (gate, beta) = check_scalars(args)?;
    let tensors = [
        ("q", Some(q)),
        ("k", Some(args.k)),
        ("v", Some(args.v)),
        ("g", Some(args.g)),
        ("beta", Some(args.beta)),
        ("initial_state", args.initial_state),
        ("cu_seqlens", args.cu_seqlens),
        ("a_log", args.a_log),
        ("dt_bias", args.dt_bias),
        ("output", args.output),
        ("final_state", final_state),
        ("state_indices", args.state_indices),
        ("read_indices", args.read_indices),
        ("has_initial_state", args.has_initial_state),
        ("prefix_lens", args.prefix_lens),
        ("checkpoint_slots", args.checkpoint_slots),
        ("checkpoint_pool", args.checkpoint_pool),
        ("workspace", args.workspace),
    ];
    for &(name, x) in &tensors[1..] {
        x.map_or(Ok(()), |x| validate::same_device(q, name, x))?;
    }
    validate::check_aligned(&tensors)?;
    check_launch_limits(args, n, b, t, hv)?;

    // ---- resolution ----
    // Cannot fail after the checks above (H >= 1 and D = 128, and q's size in bytes fits in
    // usize), but stays checked so that reordering the checks can never make it wrap.
    let total_tokens = b.checked_mul(t).ok_or_else(|| invalid("q", format!("B * T overflows, got q={}.", shape(q))))?;
    let state_dtype = args.initial_state.or(final_state).map_or(q.dtype(), |s| s.dtype());
    let final_out = match (args.state_indices, args.output_final_state, final_state) {
        (Some(_), ..) => FinalState::Pool,
        (None, false, _) => FinalState::None,
        (None, true, Some(fs)) => FinalState::Given { dtype: fs.dtype() },
        (None, true, None) => FinalState::Allocate { dtype: state_dtype, shape: state_shape },
    };
    Ok(ChunkPlan {
        nseq: n,
        batch: b,
        seq_len: t,
        total_tokens,
        heads: h,
        value_heads: hv,
        dtype: q.dtype(),
        gate,
        beta,
        scale: args.scale.unwrap_or((HEAD_DIM as f64).powf(-0.5) as f32),
        l2norm: args.use_qk_l2norm_in_kernel.unwrap_or(true),
        varlen: args.cu_seqlens.map(|c| c.dtype()),
        squeeze_varlen: shapes.squeeze_varlen,
        output_shape: shapes.v,
        output_given: args.output.is_some(),
        initial,
        final_out,
        state_dtype,
        dt_bias: args.dt_bias.filter(|_| gate.in_kernel()).map(|d| d.dtype()),
        max_seqlen: args.max_seqlen,
        checked: args.checked,
        empty: n == 0 || total_tokens == 0,
        prefix,
    })
}

/// Shapes in the reference's 4-D form, after its reference checks.
struct Shapes {
    /// q (and k) `[B, T, H, 128]`.
    q: [usize; 4],
    /// v (and g, output) `[B, T, HV, 128]`.
    v: [usize; 4],
    /// q was `[S, H, 128]`.
    squeeze_varlen: bool,
}

/// Every validation branch of the reference's `chunk_kda`, in its order.
fn check_reference(args: &ChunkArgs) -> Result<Shapes, ChunkError> {
    let q = args.q;
    let varlen = args.cu_seqlens.is_some();
    let (qs, squeeze_varlen) = as_4d("q", q, varlen)?;
    let (ks, _) = as_4d("k", args.k, varlen)?;
    let (vs, _) = as_4d("v", args.v, varlen)?;
    let (gs, _) = as_4d("g", args.g, varlen)?;
    for (name, s) in [("q", qs), ("k", ks), ("v", vs), ("g", gs)] {
        if s[3] != HEAD_DIM {
            return Err(unsupported(name, "chunk_kda currently requires D=128.".into()));
        }
    }
    if ks != qs {
        return Err(invalid("k", "k must have the same shape as q.".into()));
    }
    for (name, s) in [("v", vs), ("g", gs)] {
        if s[..2] != qs[..2] {
            return Err(invalid(name, "q, v and g must have matching [B, T] dimensions.".into()));
        }
    }
    if gs != vs {
        return Err(invalid("g", "g must have the same shape as v.".into()));
    }
    // `checked_rem`: H = 0 is a ZeroDivisionError in the reference, an error here too.
    if vs[2].checked_rem(qs[2]) != Some(0) {
        return Err(invalid("v", "GVA requires v/g heads to be divisible by q/k heads.".into()));
    }
    // Compared in place (a varlen `[S, HV]` as `[1, S, HV]`): planning allocates nothing.
    let beta_matches = match *args.beta.shape() {
        [s, heads] if varlen => [1, s, heads] == vs[..3],
        ref other => *other == vs[..3],
    };
    if !beta_matches {
        return Err(invalid("beta", "beta must have shape [B, T, Hv].".into()));
    }
    let dtype = q.dtype();
    if !dtype.is_half() {
        return Err(unsupported("q", "chunk_kda supports f16 and bf16 inputs.".into()));
    }
    for (name, x) in [("k", args.k), ("v", args.v), ("g", args.g), ("beta", args.beta)] {
        if x.dtype() != dtype {
            return Err(unsupported(name, "k, v, g and beta must have the same dtype as q.".into()));
        }
    }
    if args.a_log.is_some() != args.dt_bias.is_some() {
        let missing = if args.a_log.is_none() { "a_log" } else { "dt_bias" };
        return Err(invalid(missing, "A_log and dt_bias must be provided together.".into()));
    }
    if let Some(init) = args.initial_state {
        check_state_dtype("initial_state", init, dtype)?;
    }
    if args.cu_seqlens.is_some_and(|c| !c.dtype().is_int()) {
        return Err(unsupported("cu_seqlens", "cu_seqlens must have dtype i32 or i64.".into()));
    }
    if let Some(out) = args.output {
        let out_matches = match *out.shape() {
            [s, heads, d] if squeeze_varlen => [1, s, heads, d] == vs,
            ref other => *other == vs,
        };
        if !out_matches {
            return Err(invalid("output", "output must have the same shape as v.".into()));
        }
        if out.dtype() != dtype {
            return Err(unsupported("output", "output must have the same dtype as q.".into()));
        }
    }
    if let Some(fs) = args.final_state.filter(|_| args.output_final_state) {
        check_state_dtype("final_state", fs, dtype)?;
        if args.initial_state.is_some_and(|init| init.dtype() != fs.dtype()) {
            return Err(unsupported("final_state", "initial_state and final_state must have the same dtype.".into()));
        }
    }
    Ok(Shapes { q: qs, v: vs, squeeze_varlen })
}

/// The reference's `_as_4d_varlen_input`: the 4-D shape, and whether a 3-D varlen input was
/// widened to `[1, S, ..]`.
fn as_4d(name: &'static str, x: &TensorView, varlen: bool) -> Result<([usize; 4], bool), ChunkError> {
    match (x.shape(), varlen) {
        (&[b, t, h, d], false) => Ok(([b, t, h, d], false)),
        (_, false) => Err(invalid(name, format!("{name} must be a 4D tensor [B, T, H, 128]."))),
        (&[s, h, d], true) => Ok(([1, s, h, d], true)),
        (&[1, s, h, d], true) => Ok(([1, s, h, d], false)),
        (&[_, _, _, _], true) => Err(invalid(
            name,
            format!(
                "{name}.shape[0] must be 1 when cu_seqlens is provided; flatten variable-length input as [S, H, 128]."
            ),
        )),
        (_, true) => Err(invalid(name, format!("{name} must be [S, H, 128] or [1, S, H, 128] for varlen."))),
    }
}

/// The reference's `_check_state_dtype`: f32 or the inputs' dtype.
fn check_state_dtype(name: &'static str, x: &TensorView, value_dtype: DType) -> Result<(), ChunkError> {
    if x.dtype() == value_dtype || x.dtype() == DType::F32 {
        return Ok(());
    }
    Err(unsupported(name, format!("{name} must have dtype {value_dtype} or f32.")))
}

/// The limits of the kernel's launch, so an accepted plan always launches: the grid is
/// (value-row blocks, HV, N) and CUDA allows 65535 blocks along y and z; extents are passed
/// as 32-bit integers.
fn check_launch_limits(args: &ChunkArgs, n: usize, b: usize, t: usize, hv: usize) -> Result<(), ChunkError> {
    const GRID_YZ: usize = 65535;
    if n > GRID_YZ {
        let (arg, what) = if args.cu_seqlens.is_some() { ("cu_seqlens", "sequences") } else { ("q", "batch rows") };
        return Err(unsupported(
            arg,
            format!("chunk_kda takes at most {GRID_YZ} {what} per call, got {n}; split the call."),
        ));
    }
    if hv > GRID_YZ {
        return Err(unsupported("v", format!("chunk_kda takes at most {GRID_YZ} value heads, got {hv}.")));
    }
    let extent_limit = i32::MAX as usize;
    let pool = match args.initial_state.filter(|_| args.state_indices.is_some()) {
        Some(p) => p.shape().first().copied().unwrap_or(0),
        None => 0,
    };
    for (arg, extent) in [("q", b), ("q", t), ("initial_state", pool)] {
        if extent > extent_limit {
            return Err(unsupported(
                arg,
                format!("extents must fit in 32 bits (at most {extent_limit}), got {extent}."),
            ));
        }
    }
    // The prepared operands' rows (`prep_rows`: whole chunks per dense row, 15 more per varlen
    // sequence, a chunk more per sequence with `prefix_lens`). Checked whatever the path, so
    // that whether a call is valid never depends on the device.
    let varlen = args.cu_seqlens.is_some();
    let (_, rows) = prep_rows(b, t, n, varlen, args.prefix_lens.is_some());
    if rows > extent_limit {
        let (arg, what) = if varlen {
            ("cu_seqlens", format!("S + 15 N (31 N with prefix_lens) = {rows}"))
        } else {
            ("q", format!("T rounded up to whole chunks of 16 (one more with prefix_lens) = {rows}"))
        };
        return Err(unsupported(arg, format!("{what} must fit in 32 bits (at most {extent_limit}).")));
    }
    Ok(())
}

/// `N`: `B`, or the number of sequences `cu_seqlens` describes (which must be 1-D, with at
/// least the leading 0).
fn logical_batch(args: &ChunkArgs, b: usize) -> Result<usize, ChunkError> {
    let Some(cu) = args.cu_seqlens else {
        return Ok(b);
    };
    if cu.shape().len() != 1 {
        return Err(invalid("cu_seqlens", format!("cu_seqlens must be a 1D tensor [N + 1], got shape {}.", shape(cu))));
    }
    cu.numel()
        .checked_sub(1)
        .ok_or_else(|| invalid("cu_seqlens", "cu_seqlens must have N + 1 >= 1 entries for N sequences, got 0.".into()))
}

/// `A_log` is `[HV]` f32; `dt_bias` is `[HV, 128]` or flat `[HV * 128]`, f32 or bf16 (decode's
/// rules and words; shapes first, then dtypes, as decode orders them).
fn check_gate_params(args: &ChunkArgs, hv: usize) -> Result<(), ChunkError> {
    if let Some(x) = args.a_log.filter(|x| x.shape() != [hv]) {
        return Err(invalid("a_log", format!("A_log must have shape [HV] = [{hv}], got {}.", shape(x))));
    }
    if let Some(x) = args.dt_bias {
        let flat_ok = x.shape().len() == 1 && hv.checked_mul(HEAD_DIM) == Some(x.numel());
        if x.shape() != [hv, HEAD_DIM] && !flat_ok {
            let msg = format!(
                "dt_bias must have shape {:?} (or flat [HV * K]) when provided, got {}.",
                [hv, HEAD_DIM],
                shape(x)
            );
            return Err(invalid("dt_bias", msg));
        }
    }
    if let Some(x) = args.a_log.filter(|x| x.dtype() != DType::F32) {
        return Err(invalid("a_log", format!("A_log must be f32, got A_log={}.", x.dtype())));
    }
    if let Some(x) = args.dt_bias.filter(|x| !matches!(x.dtype(), DType::F32 | DType::BF16)) {
        let msg = format!("dt_bias must be f32 or bf16 when provided, got dt_bias={}.", x.dtype());
        return Err(invalid("dt_bias", msg));
    }
    Ok(())
}

/// The Rust extras `state_indices` / `read_indices` / `has_initial_state`, their conflicts, and
/// the shape (and, for the pool, dtype) of `initial_state`.
fn check_initial_state(args: &ChunkArgs, n: usize, hv: usize) -> Result<InitialState, ChunkError> {
    let tail = [hv, HEAD_DIM, HEAD_DIM];
    let Some(si) = args.state_indices else {
        if args.read_indices.is_some() {
            let msg =
                "read_indices is only meaningful with state_indices (it names the pool slot each sequence starts \
                       from, state_indices the one it writes); pass state_indices or drop it.";
            return Err(invalid("read_indices", msg.into()));
        }
        if args.has_initial_state.is_some() {
            let msg = "has_initial_state is only meaningful with state_indices (it marks which pool slots hold an \
                       initial state); pass state_indices or drop it.";
            return Err(invalid("has_initial_state", msg.into()));
        }
        let Some(init) = args.initial_state else {
            return Ok(InitialState::Zeros);
        };
        let want = [n, hv, HEAD_DIM, HEAD_DIM];
        if init.shape() != want {
            let msg = format!("initial_state must have shape [N, HV, 128, 128] = {want:?}, got {}.", shape(init));
            return Err(invalid("initial_state", msg));
        }
        return Ok(InitialState::PerSequence { dtype: init.dtype() });
    };
    let indices = per_sequence_ints("state_indices", si, n)?;
    if let Some(ri) = args.read_indices {
        let read = per_sequence_ints("read_indices", ri, n)?;
        if read != indices {
            let msg = format!("read_indices must have state_indices' dtype ({indices}), got {read}.");
            return Err(invalid("read_indices", msg));
        }
    }
    let has_initial = args.has_initial_state.map(|x| per_sequence_ints("has_initial_state", x, n)).transpose()?;
    let Some(pool) = args.initial_state else {
        let msg = "initial_state must be provided when state_indices is given: it is the state pool the sequences \
                   start from and write their final states back to.";
        return Err(invalid("initial_state", msg.into()));
    };
    if args.output_final_state {
        let msg = "output_final_state must not be set with state_indices: the final states are written back to the \
                   pool (initial_state) in place.";
        return Err(invalid("output_final_state", msg.into()));
    }
    if args.final_state.is_some() {
        let msg = "final_state must not be given with state_indices: the final states are written back to the pool \
                   (initial_state) in place.";
        return Err(invalid("final_state", msg.into()));
    }
    let dtype = pool.dtype();
    // Prefill and decode share the pool, and decode reads f32 and bf16 states only.
    if !(dtype == DType::F32 || (dtype == DType::BF16 && args.q.dtype() == DType::BF16)) {
        let msg = format!(
            "the state pool (initial_state with state_indices) must be f32, or bf16 with bf16 inputs (decode reads \
             f32 and bf16 states only), got {dtype} with {} inputs.",
            args.q.dtype()
        );
        return Err(unsupported("initial_state", msg));
    }
    let slots = match *pool.shape() {
        [slots, d0, d1, d2] if [d0, d1, d2] == tail => slots,
        _ => {
            let msg = format!(
                "initial_state (the state pool with state_indices) must have shape [pool, HV, 128, 128] = [pool, \
                 {hv}, 128, 128], got {}.",
                shape(pool)
            );
            return Err(invalid("initial_state", msg));
        }
    };
    if slots == 0 {
        return Err(invalid("initial_state", "the state pool must contain at least one slot.".into()));
    }
    Ok(InitialState::Pool { dtype, indices, has_initial, pool: slots })
}

/// A per-sequence integer tensor `[N]`, i32 or i64; returns its dtype.
fn per_sequence_ints(name: &'static str, x: &TensorView, n: usize) -> Result<DType, ChunkError> {
    if x.shape().len() != 1 {
        return Err(invalid(name, format!("{name} must have shape [N] (one entry per sequence), got {}.", shape(x))));
    }
    if !x.dtype().is_int() {
        return Err(invalid(name, format!("{name} must have dtype i32 or i64, got {}.", x.dtype())));
    }
    if x.numel() != n {
        return Err(invalid(name, format!("{name} must have N = {n} entries (one per sequence), got {}.", x.numel())));
    }
    Ok(x.dtype())
}

/// `scale` and `lower_bound` must be finite (the reference does not check); the lower-bound
/// gate needs `lower_bound` in `[-5, 0)`, FLA's safe range for the fast path; `use_lower_bound`
/// needs a gate computed in the kernel, and `allow_neg_eigval` the beta sigmoid. Returns the
/// gate and beta rules.
fn check_scalars(args: &ChunkArgs) -> Result<(ChunkGate, BetaRule), ChunkError> {
    if let Some(scale) = args.scale.filter(|s| !s.is_finite()) {
        return Err(invalid("scale", format!("scale must be finite, got {scale}.")));
    }
    let lower_bound = args.lower_bound.unwrap_or(DEFAULT_LOWER_BOUND);
    if !lower_bound.is_finite() {
        return Err(invalid("lower_bound", format!("lower_bound must be finite, got {lower_bound}.")));
    }
    let sigmoid = args.apply_beta_sigmoid.unwrap_or(true);
    if args.allow_neg_eigval && !sigmoid {
        let msg =
            "allow_neg_eigval needs the beta sigmoid (beta = 2 * sigmoid(beta)); drop apply_beta_sigmoid = false.";
        return Err(invalid("allow_neg_eigval", msg.into()));
    }
    let beta = BetaRule::from_flags(sigmoid, args.allow_neg_eigval);
    // The reference checks A_log and dt_bias come together, so one of them decides whether the
    // kernel computes the gate.
    if args.a_log.is_none() {
        if let Some(lower) = args.use_lower_bound {
            let msg = format!(
                "use_lower_bound={lower} picks the gate computed in the kernel, which needs A_log and dt_bias; without \
                 them g is the precomputed log decay."
            );
            return Err(invalid("use_lower_bound", msg));
        }
        return Ok((ChunkGate::Precomputed, beta));
    }
    if !args.use_lower_bound.unwrap_or(true) {
        return Ok((ChunkGate::Softplus, beta));
    }
    if !(-5.0..0.0).contains(&lower_bound) {
        let msg = format!(
            "lower_bound must be in [-5, 0) (FLA's safe range for the lower-bound gate with A_log and dt_bias), got \
             {lower_bound}."
        );
        return Err(unsupported("lower_bound", msg));
    }
    Ok((ChunkGate::LowerBound { lower_bound }, beta))
}

fn invalid(arg: &'static str, message: String) -> ChunkError {
    ChunkError::invalid(arg, message)
}

fn unsupported(arg: &'static str, message: String) -> ChunkError {
    ChunkError::unsupported(arg, message)
}
