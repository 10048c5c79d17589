//! Validation and planning for `gated_delta_rule_decode`, the KDA decode entry point.
//!
//! The layer is pure host code and needs no GPU:
//! - [`DecodeArgs`] mirrors the reference API parameter by parameter (plus the Rust extras
//!   `final_state` and `checked`);
//! - [`plan_decode`] runs every validation branch of the reference, in its order and with its
//!   messages, then the checks docs/semantics.md adds, and resolves the defaults into a
//!   [`DecodePlan`];
//! - [`check_indices`] is the opt-in checked mode over host copies of the index tensors
//!   (`cu_seqlens`, `state_indices`, `num_accepted_tokens`) and the caller's contract.

pub mod args;
pub mod checked;
pub mod launch;
pub mod plan;

pub use args::DecodeArgs;
pub use checked::check_indices;
pub use launch::{
    decode_config, decode_shape, decode_variants, gated_delta_rule_decode, gated_delta_rule_decode_tuned,
    DecodeCallKind, DecodeResult, DecodeShape,
};
pub use plan::{plan_decode, BetaRule, DecodeError, DecodePlan, GateRule, StateIndexing};
