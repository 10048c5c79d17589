//! The arguments of `gated_delta_rule_decode`, one field per reference parameter.

use kda_dsl::dtype::DType;

use crate::tensor::TensorView;

/// Arguments of `gated_delta_rule_decode`, named as the reference's parameters (in snake case).
///
/// `None` (or `false`) means the reference's default, documented on each field. Build one with
/// [`DecodeArgs::new`] and set the fields a call needs; [`crate::decode::plan_decode`] validates
/// it and resolves the defaults.
#[derive(Clone, Copy, Debug)]
pub struct DecodeArgs<'a> {
    /// Query `[B, T, H, K]`, or `[1, S, H, K]` for varlen; f16 or bf16. Required.
    pub q: &'a TensorView,
    /// Key, q's shape and dtype. Required.
    pub k: &'a TensorView,
    /// Value `[B, T, HV, V]`, q's dtype. Required.
    pub v: &'a TensorView,
    /// State pool `[pool, HV, V, K]` (V-first) or `[pool, HV, K, V]`, f32 or bf16. Default
    /// `None`: allowed only when `use_initial_state` is false and `inplace_final_state` is off.
    pub state: Option<&'a TensorView>,
    /// Log decay `[HV]` f32 (`A_log` in the reference). Default `None`: read as zeros.
    pub a_log: Option<&'a TensorView>,
    /// Raw gate input `[B, T, HV, K]`, q's dtype (a precomputed log decay when
    /// `use_gate_in_kernel` is false). Required.
    pub a: &'a TensorView,
    /// Decay bias `[HV, K]` (or flat `[HV * K]`), f32 or bf16. Default `None`: read as zeros.
    pub dt_bias: Option<&'a TensorView>,
    /// Speculative-decoding accepted-token counts `[N]`, i32 or i64. Default `None`: no
    /// speculative decoding.
    pub num_accepted_tokens: Option<&'a TensorView>,
    /// Cumulative sequence lengths `[N + 1]`, i32 or i64, for varlen. Default `None`.
    pub cu_seqlens: Option<&'a TensorView>,
    /// Update gate (beta) `[B, T, HV]`, or headwise `[B, T, HV, V]`; q's dtype. Required.
    pub b: &'a TensorView,
    /// Slot of the state pool per sequence `[N]` or per token `[N, columns]`, i32 or i64;
    /// negative entries are padding. Default `None`: sequence `n` uses slot `n`.
    pub state_indices: Option<&'a TensorView>,
    /// Query scale. Default `None`: `K^-0.5`.
    pub scale: Option<f32>,
    /// Preallocated output `[B, T, HV, V]`, f16, bf16 or f32. Default `None`: q's dtype.
    pub output: Option<&'a TensorView>,
    /// L2-normalize q and k in the kernel. Default `None`: true.
    pub use_qk_l2norm: Option<bool>,
    /// Lower bound of the lower-bound gate rule. Default `None`: 0.0.
    pub lower_bound: Option<f32>,
    /// Compute the gate from `a`, `A_log` and `dt_bias` in the kernel. Default `None`: true;
    /// false takes `a` as a precomputed log decay and ignores `A_log` and `dt_bias`.
    pub use_gate_in_kernel: Option<bool>,
    /// Use the lower-bound gate rule instead of softplus. Default `None`: false.
    pub use_lower_bound: Option<bool>,
    /// Apply a sigmoid to `b`. Default `None`: false (`b` is used as given).
    pub apply_beta_sigmoid: Option<bool>,
    /// Beta is `2 * sigmoid(b)` (needs `apply_beta_sigmoid`). Default `None`: false.
    pub allow_neg_eigval: Option<bool>,
    /// Read the initial state from `state`. Default `None`: true (zeros when false).
    pub use_initial_state: Option<bool>,
    /// State layout: `[.., HV, V, K]` when true, `[.., HV, K, V]` when false. Default `None`:
    /// true.
    pub state_v_first: Option<bool>,
    /// Run the varlen path. Default `None`: whether `cu_seqlens` is given.
    pub is_varlen: Option<bool>,
    /// Produce the final state (see the written/returned table of docs/semantics.md). Default
    /// false.
    pub store_final_state: bool,
    /// Write final states into `state` instead of a new tensor. Default false.
    pub inplace_final_state: bool,
    /// State storage dtype, f32 or bf16. Default `None`: `state`'s dtype, else f32.
    pub state_dtype: Option<DType>,
    /// Rust extra: preallocated buffer for the state tensor the call returns (exactly its shape
    /// and dtype). Default `None`: the call allocates it.
    pub final_state: Option<&'a TensorView>,
    /// Rust extra: opt-in checked mode, which reads the index tensors back and reports values
    /// out of range (not graph-safe). Default false.
    pub checked: bool,
}

impl<'a> DecodeArgs<'a> {
    /// The required tensors, every other field at its default (`None` / `false`).
    pub fn new(q: &'a TensorView, k: &'a TensorView, v: &'a TensorView, a: &'a TensorView, b: &'a TensorView) -> Self {
        DecodeArgs {
            q,
            k,
            v,
            state: None,
            a_log: None,
            a,
            dt_bias: None,
            num_accepted_tokens: None,
            cu_seqlens: None,
            b,
            state_indices: None,
            scale: None,
            output: None,
            use_qk_l2norm: None,
            lower_bound: None,
            use_gate_in_kernel: None,
            use_lower_bound: None,
            apply_beta_sigmoid: None,
            allow_neg_eigval: None,
            use_initial_state: None,
            state_v_first: None,
            is_varlen: None,
            store_final_state: false,
            inplace_final_state: false,
            state_dtype: None,
            final_state: None,
            checked: false,
        }
    }
}
