//! The chunk config families that `kda check` and the simulator suite run: one small call per
//! family (K = V = 128, a few heads, T ≤ 64), covering the flags pairwise rather than as a full
//! product so the suite stays fast.

use crate::chunk::{Beta, ChunkConfig, ChunkGate, ChunkOperands, ChunkStates, PrefixCaching};
use crate::chunk_ref::{BetaSpec, ChunkInputs, ChunkSpec, GateSpec, InitialSpec, Lengths, PrefixSpec};
use crate::reference::Rng;
use kda_dsl::DType::{BF16, F16, I32, I64};

/// One chunk config family: a config and the inputs of one small call for it.
#[derive(Clone, Debug)]
pub struct ChunkFamily {
    /// Short name (`chunk/<name>` in `kda check`).
    pub name: &'static str,
    /// The config under test.
    pub cfg: ChunkConfig,
    /// What the call's random inputs are drawn from.
    pub spec: ChunkSpec,
}

impl ChunkFamily {
    /// Random inputs of the family's call from `seed`, as its config reads them: without
    /// `has_initial_state` in the config, every pool slot is read (the spec's fresh slots are
    /// dropped).
    pub fn inputs(&self, seed: u64) -> ChunkInputs {
        let mut x = ChunkInputs::random(&mut Rng::new(seed), &self.spec);
        if !matches!(self.cfg.states, ChunkStates::Pool { has_initial: Some(_), .. }) {
            x.has_initial = None;
        }
        x
    }
}

/// Every family.
pub fn chunk_families() -> Vec<ChunkFamily> {
    let d = ChunkConfig::default();
    let init = ChunkSpec { initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
    let zeros = ChunkStates::Zeros { store_final: true };
    let softplus = ChunkSpec { gate: GateSpec::Softplus, lengths: Lengths::Dense { b: 2, t: 45 }, ..init.clone() };
    let near_two = ChunkSpec {
        beta_rule: Beta::TwoSigmoid,
        beta: BetaSpec::Fixed(8.0),
        identical_keys: true,
        lengths: Lengths::Dense { b: 1, t: 48 },
        ..init.clone()
    };
    let f = |name, cfg, spec| ChunkFamily { name, cfg, spec };
    vec![
        f("dense_t37_initial_state", d.clone(), init.clone()),
        f(
            "dense_b2_t17_no_initial",
            ChunkConfig { states: zeros, ..d.clone() },
            ChunkSpec { lengths: Lengths::Dense { b: 2, t: 17 }, ..ChunkSpec::default() },
        ),
        f(
            "dense_t15_shorter_than_a_chunk",
            ChunkConfig { states: zeros, ..d.clone() },
            ChunkSpec { lengths: Lengths::Dense { b: 1, t: 15 }, ..ChunkSpec::default() },
        ),
        f(
            "dense_t1_no_final_state",
            ChunkConfig { states: ChunkStates::PerSequence { store_final: false }, ..d.clone() },
            ChunkSpec { lengths: Lengths::Dense { b: 1, t: 1 }, ..init.clone() },
        ),
        f(
            "varlen_i64_f16_gva2_empty_and_one_token",
            ChunkConfig { dtype: F16, varlen: Some(I64), ..d.clone() },
            ChunkSpec { dtype: F16, lengths: Lengths::Varlen(vec![5, 0, 1, 32, 19]), h: 1, hv: 2, ..init.clone() },
        ),
        f(
            "varlen_pool_bf16_state_gva4_padding_empty",
            ChunkConfig {
                state_dtype: BF16,
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I64, has_initial: Some(I32) },
                ..d.clone()
            },
            ChunkSpec {
                lengths: Lengths::Varlen(vec![40, 7, 0, 16, 3, 9]),
                h: 1,
                hv: 4,
                initial: InitialSpec::Pool { slots: 8 },
                state_dtype: BF16,
                ..ChunkSpec::default()
            },
        ),
        f(
            // Prefix caching: sequences read one cached slot and write their own.
            "varlen_pool_read_apart_cached_prefix",
            ChunkConfig {
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                ..d.clone()
            },
            ChunkSpec {
                lengths: Lengths::Varlen(vec![21, 5, 40, 16, 0, 9]),
                h: 1,
                hv: 2,
                initial: InitialSpec::CachedPrefix { slots: 6 },
                ..ChunkSpec::default()
            },
        ),
        f(
            // Prefix caching: prefixes off and on 16-token boundaries, checkpoints every 16
            // tokens through a block table (some entries skipped, some columns past it).
            "varlen_pool_prefix_checkpoints_e16",
            ChunkConfig {
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                prefix: PrefixCaching { prefix_lens: Some(I64), checkpoint_slots: Some(I32), ..Default::default() },
                ..d.clone()
            },
            ChunkSpec {
                lengths: Lengths::Varlen(vec![40, 3, 33, 16, 0, 50]),
                h: 1,
                hv: 1,
                initial: InitialSpec::Pool { slots: 6 },
                prefix: Some(PrefixSpec { every: 16, cols: 4 }),
                ..ChunkSpec::default()
            },
        ),
        f(
            // The same with a bf16 pool (each checkpoint rounded once) and E = 64.
            "dense_bf16_pool_prefix_checkpoints_e64",
            ChunkConfig {
                state_dtype: BF16,
                states: ChunkStates::Pool { indices: I64, has_initial: None },
                prefix: PrefixCaching { prefix_lens: Some(I32), checkpoint_slots: Some(I64), ..Default::default() },
                ..d.clone()
            },
            ChunkSpec {
                lengths: Lengths::Dense { b: 6, t: 70 },
                h: 1,
                hv: 1,
                initial: InitialSpec::Pool { slots: 6 },
                state_dtype: BF16,
                prefix: Some(PrefixSpec { every: 64, cols: 2 }),
                ..ChunkSpec::default()
            },
        ),
        f(
            "dense_f16_f32_pool_without_has_initial",
            ChunkConfig { dtype: F16, states: ChunkStates::Pool { indices: I32, has_initial: None }, ..d.clone() },
            ChunkSpec {
                dtype: F16,
                lengths: Lengths::Dense { b: 3, t: 21 },
                initial: InitialSpec::Pool { slots: 4 },
                ..ChunkSpec::default()
            },
        ),
        f(
            // The shipped pool variant (`chunk_configs`).
            "varlen_i32_f32_pool_has_initial_i32",
            ChunkConfig {
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                ..d.clone()
            },
            ChunkSpec {
                lengths: Lengths::Varlen(vec![33, 1, 18, 0, 16]),
                h: 2,
                hv: 2,
                initial: InitialSpec::Pool { slots: 6 },
                ..ChunkSpec::default()
            },
        ),
        f(
            // Not a decay, but the reference's math all the same (a small growth per token).
            "precomputed_gate_positive",
            ChunkConfig { gate: ChunkGate::Precomputed, ..d.clone() },
            ChunkSpec { gate: GateSpec::PrecomputedFixed(0.05), ..init.clone() },
        ),
        f(
            "precomputed_gate",
            ChunkConfig { gate: ChunkGate::Precomputed, ..d.clone() },
            ChunkSpec { gate: GateSpec::Precomputed, ..init.clone() },
        ),
        f(
            "precomputed_gate_minus_20_per_token",
            ChunkConfig { gate: ChunkGate::Precomputed, states: zeros, ..d.clone() },
            ChunkSpec { gate: GateSpec::PrecomputedFixed(-20.0), ..ChunkSpec::default() },
        ),
        f("dense_t37_bf16_operands", ChunkConfig { operands: ChunkOperands::Bf16, ..d.clone() }, init.clone()),
        // Decode's softplus gate, unbounded below: computed in the kernel, then the precomputed
        // gate's element-wise form; from about -20 per token to channels that never decay.
        f(
            "softplus_gate_minus_20_to_never_decaying",
            ChunkConfig { gate: ChunkGate::Softplus, ..d.clone() },
            softplus.clone(),
        ),
        f(
            "softplus_gate_bf16_operands",
            ChunkConfig { gate: ChunkGate::Softplus, operands: ChunkOperands::Bf16, ..d.clone() },
            softplus,
        ),
        // `allow_neg_eigval`: beta near 2 with one key repeated, the solve's largest entries.
        f("beta_near_2_identical_keys", ChunkConfig { beta: Beta::TwoSigmoid, ..d.clone() }, near_two.clone()),
        f(
            "beta_near_2_identical_keys_bf16_operands",
            ChunkConfig { beta: Beta::TwoSigmoid, operands: ChunkOperands::Bf16, ..d.clone() },
            near_two,
        ),
        // FLA's convention (beta already post-sigmoid) with decode's gate, on the pool.
        f(
            "varlen_pool_softplus_raw_beta",
            ChunkConfig {
                gate: ChunkGate::Softplus,
                beta: Beta::Raw,
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                ..d.clone()
            },
            ChunkSpec {
                gate: GateSpec::Softplus,
                beta_rule: Beta::Raw,
                lengths: Lengths::Varlen(vec![37, 5, 0, 40]),
                h: 1,
                hv: 2,
                initial: InitialSpec::Pool { slots: 5 },
                ..ChunkSpec::default()
            },
        ),
        f(
            // Without l2norm the runtime takes bf16 operands (`default_operands`).
            "no_l2norm_t48",
            ChunkConfig { l2norm: false, states: zeros, operands: ChunkOperands::Bf16, ..d },
            ChunkSpec { l2norm: false, lengths: Lengths::Dense { b: 1, t: 48 }, ..ChunkSpec::default() },
        ),
    ]
}
