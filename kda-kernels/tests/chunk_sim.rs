//! `chunk` in the block simulator against the f64 reference of `chunk_kda`, on small shapes.

use kda_dsl::DType::{BF16, F16, I32, I64};
use kda_kernels::chunk::{ChunkConfig, ChunkGate, ChunkStates};
use kda_kernels::chunk_check::{check_chunk, tolerance};
use kda_kernels::chunk_ref::{ChunkInputs, ChunkSpec, GateSpec, InitialSpec, Lengths};
use kda_kernels::reference::Rng;

fn run(name: &str, cfg: &ChunkConfig, spec: &ChunkSpec, seed: u64) {
    let x = ChunkInputs::random(&mut Rng::new(seed), spec);
    let r = check_chunk(cfg, &x).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (to, ts) = tolerance(cfg);
    eprintln!("{name}: out {:.2e} state {:.2e}", r.out_err, r.state_err);
    assert_eq!(r.bad_elements, 0, "{name}: unwritten or non-zero padding output elements");
    assert_eq!(r.untouched_changed, 0, "{name}: state slots the call must not write changed");
    assert!(r.out_err <= to, "{name}: output error {:.3e} > {to}", r.out_err);
    assert!(r.state_err <= ts, "{name}: state error {:.3e} > {ts}", r.state_err);
}

#[test]
fn dense_with_initial_state_and_partial_chunk() {
    let spec = ChunkSpec { initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
    run("dense_t37", &ChunkConfig::default(), &spec, 1);
}

#[test]
fn short_sequences_below_one_chunk() {
    for t in [1, 15, 17] {
        let spec = ChunkSpec { lengths: Lengths::Dense { b: 2, t }, ..ChunkSpec::default() };
        run(
            &format!("dense_t{t}"),
            &ChunkConfig { states: ChunkStates::Zeros { store_final: true }, ..ChunkConfig::default() },
            &spec,
            2,
        );
    }
}

#[test]
fn varlen_with_empty_and_one_token_sequences_gva2_f16() {
    let spec = ChunkSpec {
        dtype: F16,
        lengths: Lengths::Varlen(vec![5, 0, 1, 32, 19]),
        h: 1,
        hv: 2,
        initial: InitialSpec::PerSequence,
        ..ChunkSpec::default()
    };
    let cfg = ChunkConfig { dtype: F16, varlen: Some(I64), ..ChunkConfig::default() };
    run("varlen_f16_gva2", &cfg, &spec, 3);
}

#[test]
fn pool_in_place_with_padding_and_fresh_slots_bf16_state_gva4() {
    let spec = ChunkSpec {
        lengths: Lengths::Varlen(vec![20, 7, 16, 3, 9]),
        h: 1,
        hv: 4,
        initial: InitialSpec::Pool { slots: 8 },
        state_dtype: BF16,
        ..ChunkSpec::default()
    };
    let cfg = ChunkConfig {
        state_dtype: BF16,
        varlen: Some(I32),
        states: ChunkStates::Pool { indices: I64, has_initial: Some(I32) },
        ..ChunkConfig::default()
    };
    run("pool_bf16_gva4", &cfg, &spec, 4);
}

#[test]
fn precomputed_gates_down_to_minus_20_per_token() {
    for (name, gate) in [("pre", GateSpec::Precomputed), ("pre_m20", GateSpec::PrecomputedFixed(-20.0))] {
        let spec = ChunkSpec { gate, initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
        run(name, &ChunkConfig { gate: ChunkGate::Precomputed, ..ChunkConfig::default() }, &spec, 5);
    }
}

#[test]
fn without_l2norm() {
    let spec = ChunkSpec { l2norm: false, lengths: Lengths::Dense { b: 1, t: 48 }, ..ChunkSpec::default() };
    let cfg = ChunkConfig { l2norm: false, states: ChunkStates::Zeros { store_final: true }, ..ChunkConfig::default() };
    run("no_l2norm", &cfg, &spec, 6);
}
