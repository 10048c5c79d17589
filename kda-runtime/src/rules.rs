//! One KDA layer's gate and beta rules, for prefill and decode alike
//! (docs/semantics.md, "One layer, two calls").
//!
//! An engine runs a layer's prompt through `chunk_kda` and its next tokens through
//! `gated_delta_rule_decode`; the two entry points mirror two reference functions whose
//! defaults differ (prefill: the lower-bound gate and a sigmoid on beta; decode: the softplus
//! gate and raw beta). [`LayerRules`] holds the layer's rules once and makes both calls'
//! arguments from them, so that the two cannot compute different recurrences by accident.

use crate::chunk::ChunkArgs;
use crate::decode::DecodeArgs;
use crate::tensor::TensorView;

/// How the per-channel log decay `g` comes from the gate input (a resolved rule, as a plan
/// holds it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GateRule {
    /// `g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))`.
    LowerBound {
        /// The bound (prefill takes `[-5, 0)`).
        lower_bound: f32,
    },
    /// `g = -exp(A_log) * softplus(a + dt_bias)`, unbounded below.
    Softplus,
    /// `g = a`, a natural-log decay the caller computed.
    Precomputed,
}

impl GateRule {
    /// The kernels' gate rule.
    pub fn kernel(self) -> kda_kernels::rules::Gate {
        match self {
            GateRule::LowerBound { .. } => kda_kernels::rules::Gate::LowerBound,
            GateRule::Softplus => kda_kernels::rules::Gate::Softplus,
            GateRule::Precomputed => kda_kernels::rules::Gate::Precomputed,
        }
    }

    /// Whether the kernel computes the gate from `A_log` and `dt_bias`.
    pub fn in_kernel(self) -> bool {
        self.kernel().in_kernel()
    }

    /// The bound of [`GateRule::LowerBound`] (0 for the other rules, which do not read it).
    pub fn lower_bound(self) -> f32 {
        match self {
            GateRule::LowerBound { lower_bound } => lower_bound,
            _ => 0.0,
        }
    }
}

/// How beta comes from the input `b`: `Raw` (as given), `Sigmoid`, or `TwoSigmoid`
/// (`allow_neg_eigval`).
pub use kda_kernels::rules::Beta as BetaRule;

/// A KDA layer's rules: its gate (with the layer's `A_log` and `dt_bias`) and its beta rule.
/// [`LayerRules::chunk_args`] and [`LayerRules::decode_args`] set every rule field of each
/// call from them, whatever the entry point's own defaults.
///
/// ```
/// use kda_dsl::DType::{BF16, F32};
/// use kda_runtime::chunk::plan_chunk;
/// use kda_runtime::decode::plan_decode;
/// use kda_runtime::rules::{BetaRule, GateRule, LayerRules};
/// use kda_runtime::TensorView;
/// // SAFETY: planning reads no device memory, and these descriptors are never launched.
/// let tv = |id: u64, shape: &[usize], d| unsafe { TensorView::from_raw(0x10_0000 * id, shape, d, 0) }.unwrap();
/// let (a_log, dt_bias) = (tv(1, &[4], F32), tv(2, &[4, 128], F32));
/// let rules = LayerRules {
///     a_log: Some(&a_log),
///     dt_bias: Some(&dt_bias),
///     gate: GateRule::Softplus,
///     beta: BetaRule::Raw,
/// };
/// let x = |id, t: usize, heads: usize| tv(id, &[1, t, heads, 128], BF16);
/// // The prompt: 100 tokens.
/// let (q, k, v, g, b) = (x(3, 100, 2), x(4, 100, 2), x(5, 100, 4), x(6, 100, 4), tv(7, &[1, 100, 4], BF16));
/// let prefill = plan_chunk(&rules.chunk_args(&q, &k, &v, &g, &b)).expect("a valid call");
/// // The next token.
/// let (q1, k1, v1, a1, b1) = (x(8, 1, 2), x(9, 1, 2), x(10, 1, 4), x(11, 1, 4), tv(12, &[1, 1, 4], BF16));
/// let pool = tv(13, &[1, 4, 128, 128], F32);
/// let mut step = rules.decode_args(&q1, &k1, &v1, &a1, &b1);
/// step.state = Some(&pool);
/// let decode = plan_decode(&step).expect("a valid call");
/// assert_eq!((prefill.gate, prefill.beta), (decode.gate, decode.beta));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LayerRules<'a> {
    /// `A_log` `[HV]` f32, for a gate computed in the kernel.
    pub a_log: Option<&'a TensorView>,
    /// `dt_bias` `[HV, 128]` (or flat), f32 or bf16, for a gate computed in the kernel.
    pub dt_bias: Option<&'a TensorView>,
    /// The gate rule. Prefill computes the lower-bound and softplus gates with both `A_log`
    /// and `dt_bias` given, and takes the lower bound in `[-5, 0)`.
    pub gate: GateRule,
    /// The beta rule.
    pub beta: BetaRule,
}

impl<'a> LayerRules<'a> {
    /// `chunk_kda`'s arguments for `q, k, v, g, beta` under these rules (every other field at
    /// its default).
    pub fn chunk_args(
        &self,
        q: &'a TensorView,
        k: &'a TensorView,
        v: &'a TensorView,
        g: &'a TensorView,
        beta: &'a TensorView,
    ) -> ChunkArgs<'a> {
        let mut args = ChunkArgs::new(q, k, v, g, beta);
        if self.gate.in_kernel() {
            args.a_log = self.a_log;
            args.dt_bias = self.dt_bias;
            args.use_lower_bound = Some(matches!(self.gate, GateRule::LowerBound { .. }));
        }
        if let GateRule::LowerBound { lower_bound } = self.gate {
            args.lower_bound = Some(lower_bound);
        }
        let (sigmoid, neg) = self.beta.flags();
        args.apply_beta_sigmoid = Some(sigmoid);
        args.allow_neg_eigval = neg;
        args
    }

    /// `gated_delta_rule_decode`'s arguments for `q, k, v, a, b` under these rules (every other
    /// field at its default).
    pub fn decode_args(
        &self,
        q: &'a TensorView,
        k: &'a TensorView,
        v: &'a TensorView,
        a: &'a TensorView,
        b: &'a TensorView,
    ) -> DecodeArgs<'a> {
        let mut args = DecodeArgs::new(q, k, v, a, b);
        args.use_gate_in_kernel = Some(self.gate.in_kernel());
        if self.gate.in_kernel() {
            args.a_log = self.a_log;
            args.dt_bias = self.dt_bias;
        }
        args.use_lower_bound = Some(matches!(self.gate, GateRule::LowerBound { .. }));
        if let GateRule::LowerBound { lower_bound } = self.gate {
            args.lower_bound = Some(lower_bound);
        }
        let (sigmoid, neg) = self.beta.flags();
        args.apply_beta_sigmoid = Some(sigmoid);
        args.allow_neg_eigval = Some(neg);
        args
    }
}
