//! The gate and beta rules of a KDA layer (docs/semantics.md, "Gate rules" and "Beta rules"),
//! one set for prefill and decode: the same enums in both kernels' configs, and the same
//! element-wise code for the rules both compute per element.

/// How the per-channel log decay `g` comes from the raw gate input `a` (`ea = exp(A_log)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// `lower_bound * sigmoid(exp(A_log) * (a + dt_bias))`, bounded to `[lower_bound, 0]`.
    LowerBound,
    /// `-exp(A_log) * softplus(a + dt_bias)`, unbounded below.
    Softplus,
    /// `g = a`, a natural-log decay given by the caller (unbounded below).
    Precomputed,
}

impl Gate {
    /// Whether the kernel computes the gate from `A_log` and `dt_bias`.
    pub fn in_kernel(self) -> bool {
        self != Gate::Precomputed
    }
}

/// How the input `b` becomes beta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Beta {
    /// As given (already post-sigmoid, as FLA's `chunk_kda` takes it).
    Raw,
    /// `sigmoid(b)`.
    Sigmoid,
    /// `2 * sigmoid(b)` (`allow_neg_eigval`: beta up to 2).
    TwoSigmoid,
}

impl Beta {
    /// A short name for variant keys.
    pub fn key(self) -> &'static str {
        match self {
            Beta::Raw => "raw",
            Beta::Sigmoid => "sigmoid",
            Beta::TwoSigmoid => "twosigmoid",
        }
    }
}

/// The raw gate input `x` (with `dt_bias` added by the caller where the rule takes it) as a
/// natural-log decay by `gate`; `ea = exp(A_log)`.
#[kda_macros::kernel_fn]
pub(crate) fn gate_of(gate: Gate, x: Val, ea: Val, lower_bound: Val) -> Val {
    let mut g = x;
    if gate == Gate::LowerBound {
        g = lower_bound * sigmoid(ea * x);
    }
    if gate == Gate::Softplus {
        g = -ea * softplus(x);
    }
    g
}

/// Beta from `b` by `rule`.
#[kda_macros::kernel_fn]
pub(crate) fn beta_of(rule: Beta, b: Val) -> Val {
    let mut bt = b;
    if rule == Beta::Sigmoid {
        bt = sigmoid(bt);
    }
    if rule == Beta::TwoSigmoid {
        bt = 2.0 * sigmoid(bt);
    }
    bt
}

// Below the kernel functions: lines added above them would move every snapshot's `.loc`.
impl Beta {
    /// The rule the calls' flags name: `apply_beta_sigmoid` and `allow_neg_eigval` (which only
    /// means something with the sigmoid).
    pub fn from_flags(sigmoid: bool, allow_neg_eigval: bool) -> Beta {
        match (sigmoid, allow_neg_eigval) {
            (false, _) => Beta::Raw,
            (true, false) => Beta::Sigmoid,
            (true, true) => Beta::TwoSigmoid,
        }
    }

    /// The calls' flags for this rule: (`apply_beta_sigmoid`, `allow_neg_eigval`).
    pub fn flags(self) -> (bool, bool) {
        (self != Beta::Raw, self == Beta::TwoSigmoid)
    }
}
