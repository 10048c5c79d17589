//! `chunk` in the block simulator against the f64 reference of `chunk_kda`, on small shapes.

use kda_dsl::DType::{BF16, F16, F32, I32, I64};
use kda_dsl::Target;
use kda_kernels::check::simulate_decode;
use kda_kernels::chunk::{
    ChunkConfig, ChunkGate, ChunkOperands, ChunkShape, ChunkStates, ChunkWindow, KeyProducts, NarrowProducts,
    Preparation, ROWS_PER_WARP,
};
use kda_kernels::chunk_check::{
    check_chunk, check_split, compare_chunk, simulate_chunk, simulate_chunk_on, simulate_chunk_window, simulate_split,
    tolerance,
};
use kda_kernels::chunk_families::chunk_families;
use kda_kernels::chunk_ref::{chunk_reference, ChunkInputs, ChunkOutputs, ChunkSpec, GateSpec, InitialSpec, Lengths};
use kda_kernels::chunk_segments::segment_count;
use kda_kernels::decode::{Beta, DecodeConfig, Writes};
use kda_kernels::decode_ref::DecodeInputs;
use kda_kernels::reference::{rel_err, Rng};

/// One random sequence of `t` tokens (dense `B = 1`, H = 1, HV = 2) with an initial state.
fn one_sequence(seed: u64, t: usize) -> ChunkInputs {
    let spec = ChunkSpec {
        lengths: Lengths::Dense { b: 1, t },
        h: 1,
        hv: 2,
        initial: InitialSpec::PerSequence,
        ..ChunkSpec::default()
    };
    ChunkInputs::random(&mut Rng::new(seed), &spec)
}

/// Every config family (`kda check`'s chunk rows) against the f64 token recurrence: within the
/// family's bounds, every output element written, padding rows exactly zero, and no state slot
/// the call must not write changed.
#[test]
fn every_family_matches_the_f64_reference() {
    for (i, f) in chunk_families().iter().enumerate() {
        let r = check_chunk(&f.cfg, &f.inputs(i as u64)).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let (to, ts) = tolerance(&f.cfg);
        eprintln!("{}: out {:.2e} state {:.2e}", f.name, r.out_err, r.state_err);
        assert_eq!(r.bad_elements, 0, "{}: unwritten or non-zero padding output elements", f.name);
        assert_eq!(r.untouched_changed, 0, "{}: state slots the call must not write changed", f.name);
        assert!(r.out_err <= to, "{}: output error {:.3e} > {to}", f.name, r.out_err);
        assert!(r.state_err <= ts, "{}: state error {:.3e} > {ts}", f.name, r.state_err);
    }
}

/// The two-kernel path (`chunk_prep` into the workspace, then `chunk` reading it) gives the
/// fused kernel's bits on every family, with the preparation spread over one block or several
/// per (sequence, value head), with the chain's blocks of 8, 4 or 2 warps, with and without
/// fill warps, and reads no workspace row the preparation did not write (they are
/// NaN-poisoned).
#[test]
fn prepared_workspace_equals_fused_bit_for_bit() {
    use kda_kernels::chunk_check::two_kernel_path_matches;
    for (i, f) in chunk_families().iter().enumerate() {
        let x = f.inputs(i as u64);
        let warps = [8, 4, 2][i % 3];
        for (prep_blocks, fill_warps) in [(1, 0), (3, 0), (2, 1)] {
            let chain = ChunkShape { warps, fill_warps, rows_per_warp: ROWS_PER_WARP, ..f.cfg.shape };
            let same =
                two_kernel_path_matches(&f.cfg, &x, chain, prep_blocks).unwrap_or_else(|e| panic!("{}: {e}", f.name));
            assert!(
                same,
                "{}: the bits differ ({warps} warps, {fill_warps} fill warps, {prep_blocks} preparation blocks)",
                f.name
            );
        }
    }
}

/// The fused kernel with fill warps (which issue its inputs' fills and run its step's producer
/// block, the chunk's factors, a chunk ahead of the state's chain: one warp, and a warpgroup),
/// with its step's barriers leaving the next chunk's loads in flight, and with both, gives the
/// bits of the kernel without, on every other family (every fourth for the last three), and
/// the simulator finds no race: the ring orders the hand-over, and the tiles copied before the
/// loop (`dt_bias`) land before the producer reads them.
#[test]
fn fill_warps_and_loads_in_flight_change_no_bit_of_the_fused_kernel() {
    for (i, f) in chunk_families().iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let x = f.inputs(i as u64);
        let want = simulate_chunk(&f.cfg, &x).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let shapes = [(1, false), (0, true), (1, true), (4, false)].into_iter().take(if i % 4 == 0 { 4 } else { 1 });
        for (fill_warps, fills_in_flight) in shapes {
            let shape = ChunkShape { fill_warps, fills_in_flight, ..f.cfg.shape };
            let got = simulate_chunk(&ChunkConfig { shape, ..f.cfg.clone() }, &x).unwrap_or_else(|e| {
                panic!("{} ({fill_warps} fill warps, loads in flight {fills_in_flight}): {e}", f.name)
            });
            let what = format!("{} ({fill_warps} fill warps, loads in flight {fills_in_flight})", f.name);
            assert!(bits(&got.out) == bits(&want.out), "{what}: outputs differ");
            assert!(bits(&got.final_state) == bits(&want.final_state), "{what}: final states differ");
        }
    }
}

/// The step's other order (the fused kernel's output rows before the state's update, the chain
/// over a prepared workspace's update before its output rows) changes no bit, on every third
/// family: the same operations on the same values.
#[test]
fn the_step_order_changes_no_bit() {
    use kda_kernels::chunk::StepOrder;
    use kda_kernels::chunk_check::two_kernel_path_matches;
    for (i, f) in chunk_families().iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let x = f.inputs(i as u64);
        let want = simulate_chunk(&f.cfg, &x).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let shape = ChunkShape { step_order_override: Some(StepOrder::OutputFirst), ..f.cfg.shape };
        let got = simulate_chunk(&ChunkConfig { shape, ..f.cfg.clone() }, &x)
            .unwrap_or_else(|e| panic!("{} (output first): {e}", f.name));
        assert!(bits(&got.out) == bits(&want.out), "{} (output first): outputs differ", f.name);
        assert!(bits(&got.final_state) == bits(&want.final_state), "{} (output first): final states differ", f.name);
        let chain = ChunkShape { step_order_override: Some(StepOrder::UpdateFirst), ..ChunkShape::PREPARED };
        let same = two_kernel_path_matches(&f.cfg, &x, chain, 2).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert!(same, "{}: the chain updating first gives other bits", f.name);
    }
}

/// The chain over a prepared workspace on sm_90a (one warpgroup of 16 value rows a warp, a fill
/// warp: its state products on `wgmma`, the state their register A operand) gives the sm_80
/// fused kernel's bits on every other family, the preparation being sm_80's; so does 4 warps of
/// 32 rows (two `wgmma`s a K-step) on every fourth.
#[test]
fn the_sm_90a_chain_gives_the_fused_kernels_bits() {
    use kda_kernels::chunk_check::two_kernel_path_matches_on;
    for (i, f) in chunk_families().iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let x = f.inputs(i as u64);
        let mut chains = vec![ChunkShape::HOPPER_PREPARED];
        if i % 4 == 0 {
            chains.push(ChunkShape { min_blocks: 1, rows_per_warp: 32, ..ChunkShape::HOPPER_PREPARED });
        }
        for chain in chains {
            let same = two_kernel_path_matches_on(&f.cfg, &x, chain, 2, Target::Sm90a)
                .unwrap_or_else(|e| panic!("{} ({chain:?}): {e}", f.name));
            assert!(same, "{}: the sm_90a chain ({chain:?}) gives other bits", f.name);
        }
    }
}

/// The fused kernel with a producer warpgroup (four fill warps computing each chunk's factors a
/// chunk ahead) gives the bits of the kernel without, with no race, on every fourth family: on
/// sm_80 at 3 stages (its fills a chunk ahead of its block, so past the loop's end it has fills
/// it must not issue: a dead fill would zero a stage the compute warps may still read), and on
/// sm_90a, where the roles part at entry, or varlen at the chunk loop (the sequence is picked
/// through shared memory before it) (`setmaxnreg`: the producer keeps 128 registers, the
/// warpgroup holding the state takes the rest) and meet only at the chunk loop's barriers of
/// the whole block, against the two warpgroups that keep the state in `wgmma` accumulators; and
/// there with two producer warpgroups taking turns at the chunks, on every family (9.0's
/// default path for calls of 80 to 132 chains: `DefaultPath::HopperProducers`).
#[test]
fn a_producer_warpgroup_changes_no_bit_of_the_fused_kernel() {
    use kda_kernels::chunk_check::simulate_chunk_on;
    let pairs = [
        (Target::Sm80, ChunkShape::FUSED, ChunkShape::PRODUCER),
        (Target::Sm90a, ChunkShape::HOPPER, ChunkShape::HOPPER_PRODUCER),
        (Target::Sm90a, ChunkShape::HOPPER, ChunkShape::HOPPER_TWO_PRODUCERS),
    ];
    // Two producer warpgroups are the default path on 9.0 for some calls: every family there.
    for (i, f) in chunk_families().iter().enumerate() {
        let x = f.inputs(i as u64);
        let every = |(_, _, producer): &(Target, ChunkShape, ChunkShape)| {
            i % 4 == 0 || *producer == ChunkShape::HOPPER_TWO_PRODUCERS
        };
        for (target, fused, producer) in pairs.into_iter().filter(every) {
            let run = |shape| simulate_chunk_on(&ChunkConfig { shape, ..f.cfg.clone() }, &x, 2, target);
            let want = run(fused).unwrap_or_else(|e| panic!("{} {target}: {e}", f.name));
            let got = run(producer).unwrap_or_else(|e| panic!("{} {target} (a producer warpgroup): {e}", f.name));
            assert!(bits(&got.out) == bits(&want.out), "{} {target}: outputs differ", f.name);
            assert!(bits(&got.final_state) == bits(&want.final_state), "{} {target}: final states differ", f.name);
        }
    }
}

/// The fused kernel's 4 warps of 32 value rows (`ChunkShape::rows_per_warp`: a head's whole
/// state in one block) give the bits of 8 warps of 16 on every other family, on sm_80 and on
/// sm_90a (there every state product takes two `wgmma`s a K-step, one per 16-row block of each
/// warp; or, with `NarrowProducts::MmaSync`, those of 16 columns `mma.sync` from the same
/// fragments), and with the key products split over the warps or not (`KeyProducts`); so does
/// the chain over a workspace at 2 warps of 32 on every fourth.
#[test]
fn thirty_two_rows_a_warp_change_no_bit() {
    use kda_kernels::chunk_check::two_kernel_path_matches;
    for (i, f) in chunk_families().iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        let x = f.inputs(i as u64);
        assert_eq!((f.cfg.shape.warps, f.cfg.shape.rows_per_warp), (4, 32), "{}: the fused default", f.name);
        let narrow = ChunkConfig { shape: ChunkShape::plain(8, 2, 2), ..f.cfg.clone() };
        let want = simulate_chunk(&narrow, &x).unwrap_or_else(|e| panic!("{} (8 warps of 16 rows): {e}", f.name));
        // On sm_90a the state's products on `wgmma`, then those of 16 columns on `mma.sync`.
        let on_mma_sync = ChunkShape { narrow_products: NarrowProducts::MmaSync, ..f.cfg.shape };
        // And the key products the other way than the default's (split over the warps, one
        // 16 x 8 tile each, or every warp's own copy).
        let other_keys = match f.cfg.shape.key_products {
            KeyProducts::Split => KeyProducts::Replicated,
            KeyProducts::Replicated => KeyProducts::Split,
        };
        let other_keys = ChunkShape { key_products: other_keys, ..f.cfg.shape };
        let runs = [
            (Target::Sm80, f.cfg.shape),
            (Target::Sm90a, f.cfg.shape),
            (Target::Sm90a, on_mma_sync),
            (Target::Sm80, other_keys),
            (Target::Sm90a, other_keys),
        ];
        for (target, shape) in runs {
            let wide = ChunkConfig { shape, ..f.cfg.clone() };
            let got = simulate_chunk_on(&wide, &x, 4, target)
                .unwrap_or_else(|e| panic!("{} (4 warps of 32 rows, {target}, {shape:?}): {e}", f.name));
            let what = format!("{} at 32 rows a warp on {target}, {shape:?}", f.name);
            assert!(bits(&got.out) == bits(&want.out), "{what}: outputs differ");
            assert!(bits(&got.final_state) == bits(&want.final_state), "{what}: final states differ");
        }
        if i % 4 == 1 {
            let chain = ChunkShape { rows_per_warp: 32, ..ChunkShape::PREPARED };
            let same = two_kernel_path_matches(&f.cfg, &x, chain, 2).unwrap_or_else(|e| panic!("{}: {e}", f.name));
            assert!(same, "{}: the chain at 2 warps of 32 rows gives other bits", f.name);
        }
    }
}

/// A shape past a head's 128 value rows (8 warps of 32) is refused before it runs, as the
/// runtime's launch refuses it (the kernel assumes `VD` a multiple of its block's rows), instead
/// of running no block and writing nothing.
#[test]
fn a_shape_past_a_heads_rows_is_refused() {
    let f = &chunk_families()[0];
    let shape = ChunkShape { rows_per_warp: 32, ..ChunkShape::plain(8, 1, 2) };
    let e = simulate_chunk(&ChunkConfig { shape, ..f.cfg.clone() }, &f.inputs(0)).expect_err("256 rows a block");
    assert!(e.contains("VD = 128") && e.contains("a multiple of 256"), "{e}");
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|e| e.to_bits()).collect()
}

/// The token data (q, k, v, g, beta) and initial states of `parts` (one sequence each, dense
/// `b = 1`), concatenated: varlen `[1, sum, ..]` with `cu_seqlens` when `varlen`, else dense
/// `B = parts.len()` (every part of one length). The parts share their head constants (A_log,
/// dt_bias, lower bound, scale, l2norm).
fn pack(parts: &[&ChunkInputs], varlen: bool) -> ChunkInputs {
    let cat = |f: fn(&ChunkInputs) -> &[f64]| parts.iter().flat_map(|p| f(p).iter().copied()).collect::<Vec<_>>();
    let first = parts[0];
    let mut cu = vec![0i64];
    for p in parts {
        assert_eq!((p.b, p.cu_seqlens.as_ref()), (1, None), "pack takes dense one-sequence parts");
        assert!(p.a_log == first.a_log && p.dt_bias == first.dt_bias, "pack: parts with other head constants");
        cu.push(cu.last().copied().unwrap_or(0) + p.t as i64);
    }
    let (b, t) = if varlen {
        (1, parts.iter().map(|p| p.t).sum())
    } else {
        assert!(parts.iter().all(|p| p.t == first.t), "dense packing needs one length");
        (parts.len(), first.t)
    };
    ChunkInputs {
        b,
        t,
        q: cat(|p| &p.q),
        k: cat(|p| &p.k),
        v: cat(|p| &p.v),
        g: cat(|p| &p.g),
        beta: cat(|p| &p.beta),
        initial: Some(cat(|p| p.initial.as_deref().unwrap_or(&[]))),
        cu_seqlens: varlen.then_some(cu),
        ..first.clone()
    }
}

/// Sequence `n`'s output rows and final state from a simulated call on `x` (with a pool, its
/// slot's state; none for padding).
fn sequence_of(x: &ChunkInputs, got: &ChunkOutputs, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (tok0, len) = x.span(n);
    let (row, st) = (x.hv * 128, x.hv * 128 * 128);
    let slot = match &x.state_indices {
        Some(idx) => usize::try_from(idx[n]).ok().filter(|s| *s < x.pool_slots()),
        None => Some(n),
    };
    let state = slot.map_or(vec![], |s| got.final_state[s * st..(s + 1) * st].to_vec());
    (got.out[tok0 * row..(tok0 + len) * row].to_vec(), state)
}

/// docs/semantics.md, "Prefill (chunk_kda)", batch invariance: a 37-token sequence's output rows
/// and final state are the same bits alone (dense B = 1, varlen with one sequence) and packed among others
/// (varlen after sequences of 19 and 0 tokens and before one of 5, so it starts off a 16-token
/// boundary of the packed tensor; dense B = 3 as row 1).
#[test]
fn batch_invariance_bit_for_bit() {
    batch_invariance_on(Target::Sm80);
}

/// [`batch_invariance_bit_for_bit`] for the fused kernel on sm_90a, at its Hopper shape.
#[test]
fn batch_invariance_bit_for_bit_on_sm_90a() {
    batch_invariance_on(Target::Sm90a);
}

/// The fused kernel's shape on `target`.
fn fused_shape(target: Target) -> ChunkShape {
    match target {
        Target::Sm90a => ChunkShape::HOPPER,
        _ => ChunkShape::FUSED,
    }
}

/// The batch-invariance cases of [`batch_invariance_bit_for_bit`], the kernels compiled for
/// `target`.
fn batch_invariance_on(target: Target) {
    let x = one_sequence(21, 37);
    // Other sequences: their own token data and initial states, the call's head constants.
    let other = |seed, t| ChunkInputs { a_log: x.a_log.clone(), dt_bias: x.dt_bias.clone(), ..one_sequence(seed, t) };
    let (before, empty, after) = (other(22, 19), other(26, 0), other(23, 5));
    let (row0, row2) = (other(24, 37), other(25, 37));
    let dense = ChunkConfig { shape: fused_shape(target), ..ChunkConfig::default() };
    let varlen = ChunkConfig { varlen: Some(I32), ..dense.clone() };
    let run = |cfg: &ChunkConfig, x: &ChunkInputs| simulate_chunk_on(cfg, x, 4, target);

    let alone = run(&dense, &x).unwrap_or_else(|e| panic!("alone: {e}"));
    let r = compare_chunk(&dense, &x, alone.clone(), &chunk_reference(&x));
    eprintln!("alone: out {:.2e} state {:.2e}", r.out_err, r.state_err);
    assert_eq!(r.bad_elements, 0);
    let (to, ts) = tolerance(&dense);
    assert!(r.out_err <= to && r.state_err <= ts, "alone: out {:.3e} state {:.3e}", r.out_err, r.state_err);
    let (want_out, want_state) = sequence_of(&x, &alone, 0);

    for (name, cfg, packed, n) in [
        ("varlen alone", &varlen, pack(&[&x], true), 0),
        ("varlen 19 | 0 | 37 | 5", &varlen, pack(&[&before, &empty, &x, &after], true), 2),
        ("dense B = 3, row 1", &dense, pack(&[&row0, &x, &row2], false), 1),
    ] {
        let got = run(cfg, &packed).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got.out.iter().all(|e| !e.is_nan()), "{name}: unwritten output elements");
        let (out, state) = sequence_of(&packed, &got, n);
        assert!(bits(&out) == bits(&want_out), "{name}: output rows differ from the sequence alone");
        assert!(bits(&state) == bits(&want_state), "{name}: final state differs from the sequence alone");
        eprintln!("{name}: bit-identical to the sequence alone");
    }
}

/// The fused kernel on sm_90a (every product on `wgmma`, at its Hopper shape) and on sm_80
/// (`mma.sync`) give the same bits in the simulator, outputs, states and checkpoints, on every
/// family: the same products in the same K order, the same roundings. (Whether the hardware's
/// two instructions round alike is what `kda check --gpu` reports on compute capability 9.0.)
#[test]
fn sm_80_and_sm_90a_agree_bit_for_bit_in_the_simulator() {
    for (i, f) in chunk_families().iter().enumerate().filter(|(_, f)| f.cfg.preparation == Preparation::InKernel) {
        let x = f.inputs(i as u64);
        let sm80 = simulate_chunk(&f.cfg, &x).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let hopper = f.cfg.clone().on_target(Target::Sm90a);
        let got = simulate_chunk_on(&hopper, &x, 4, Target::Sm90a).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert!(bits(&got.out) == bits(&sm80.out), "{}: outputs differ", f.name);
        assert!(bits(&got.final_state) == bits(&sm80.final_state), "{}: states differ", f.name);
        assert!(bits(&got.checkpoints) == bits(&sm80.checkpoints), "{}: checkpoints differ", f.name);
    }
}

/// `[P, HV = 1, 128, 128]` pool slot `s`.
fn slot_of(pool: &[f64], s: usize) -> Vec<f64> {
    pool[s * 128 * 128..(s + 1) * 128 * 128].to_vec()
}

/// The decode config of a layer whose prefill is `cfg` (the same enums, its V-first pool, one
/// state per token written back).
fn layer_decode(cfg: &ChunkConfig) -> DecodeConfig {
    DecodeConfig {
        dtype: cfg.dtype,
        state_dtype: cfg.state_dtype,
        out_dtype: cfg.dtype,
        v_first: true,
        gate: cfg.gate,
        a_log: cfg.gate.in_kernel(),
        dt_bias: cfg.gate.in_kernel().then_some(F32),
        beta: cfg.beta,
        l2norm: true,
        indices: Some(I32),
        writes: Writes::PoolPerToken,
        ..DecodeConfig::default()
    }
}

/// Decode inputs of tokens `t0 .. t0 + n` of `x` (one dense sequence, H = HV = 1) from the
/// 4-slot V-first `pool`, token `i` at slot `indices[i]`.
fn decode_tokens(x: &ChunkInputs, t0: usize, n: usize, indices: Vec<i64>, pool: Vec<f64>) -> DecodeInputs {
    let d = 128;
    let rows = |v: &[f64], w: usize| v[t0 * w..(t0 + n) * w].to_vec();
    DecodeInputs {
        b: 1,
        t: n,
        h: 1,
        hv: 1,
        q: rows(&x.q, d),
        k: rows(&x.k, d),
        v: rows(&x.v, d),
        a: rows(&x.g, d),
        beta: rows(&x.beta, 1),
        a_log: x.a_log.clone().unwrap_or_default(),
        dt_bias: x.dt_bias.clone().unwrap_or_default(),
        pool,
        slots: 4,
        cols: indices.len(),
        indices,
        cu_seqlens: vec![],
        accepted: vec![1],
        scale: x.scale,
        lower_bound: x.lower_bound,
    }
}

/// docs/semantics.md, "Numerics and tests": prefill of 37 tokens into a pool slot, then decode of
/// the last 3 tokens from and into that slot, equals prefill of all 40 tokens (the V-first pool
/// round-trips between the kernels). Both paths against the f64 token recurrence over 40 tokens,
/// and against each other. The 3 tokens are decoded as 3 one-token calls reading and writing the
/// slot, and once more as one 3-token call (per-token slots `[slot, s1, s2]`, the state after
/// the last token in `s2`) that must give the same bits.
fn prefill_then_decode(id: &Identity) -> [(&'static str, f64); 6] {
    let Identity { dtype, state_dtype, gate, beta, operands, seed, target } = *id;
    const T: usize = 40;
    const PRE: usize = 37;
    let d = 128;
    let spec = ChunkSpec {
        lengths: Lengths::Dense { b: 1, t: T },
        initial: InitialSpec::Pool { slots: 4 },
        state_dtype,
        dtype,
        gate: match gate {
            ChunkGate::LowerBound => GateSpec::LowerBound,
            ChunkGate::Softplus => GateSpec::Softplus,
            ChunkGate::Precomputed => GateSpec::Precomputed,
        },
        beta_rule: beta,
        ..ChunkSpec::default()
    };
    let mut whole = ChunkInputs::random(&mut Rng::new(seed), &spec);
    whole.has_initial = None;
    let slot = whole.state_indices.as_ref().map_or(0, |i| i[0]) as usize;
    let spare: Vec<usize> = (0..4).filter(|s| *s != slot).collect();
    let ccfg = ChunkConfig {
        state_dtype,
        states: ChunkStates::Pool { indices: I32, has_initial: None },
        dtype,
        gate,
        beta,
        operands,
        shape: fused_shape(target),
        ..ChunkConfig::default()
    };
    let prefill = |x: &ChunkInputs| simulate_chunk_on(&ccfg, x, 4, target);
    let want = chunk_reference(&whole);
    let name = format!(
        "{dtype:?} inputs, {state_dtype:?} pool, {gate:?} gate, {beta:?} beta, {operands:?} operands, slot {slot}, \
         {target}"
    );

    // Path B: prefill of all 40 tokens.
    let b = prefill(&whole).unwrap_or_else(|e| panic!("{name}: chunk over {T}: {e}"));
    let rb = compare_chunk(&ccfg, &whole, b.clone(), &want);
    assert_eq!((rb.bad_elements, rb.untouched_changed), (0, 0), "{name}: path B writes");

    // Path A: prefill of the first 37, then decode.
    let prefix = |v: &[f64], w: usize| v[..PRE * w].to_vec();
    let pre = ChunkInputs {
        t: PRE,
        q: prefix(&whole.q, d),
        k: prefix(&whole.k, d),
        v: prefix(&whole.v, d),
        g: prefix(&whole.g, d),
        beta: prefix(&whole.beta, 1),
        ..whole.clone()
    };
    let a_pre = prefill(&pre).unwrap_or_else(|e| panic!("{name}: chunk over {PRE}: {e}"));
    let rp = compare_chunk(&ccfg, &pre, a_pre.clone(), &chunk_reference(&pre));
    assert_eq!((rp.bad_elements, rp.untouched_changed), (0, 0), "{name}: path A prefill writes");
    let (to, ts) = tolerance(&ccfg);
    for (path, r) in [("A prefill", &rp), ("B", &rb)] {
        assert!(
            r.out_err <= to && r.state_err <= ts,
            "{name}: {path}: out {:.3e} state {:.3e}",
            r.out_err,
            r.state_err
        );
    }
    // Not a contract (the kernel's chunks are causal inside, so masked rows add exact zeros):
    // printed, to tell a change of the kernel's arithmetic from a change of its numbers.
    let prefill_rows_equal = bits(&a_pre.out) == bits(&b.out[..PRE * d]);

    // Decode with the layer's rules: the same enums.
    let dcfg = layer_decode(&ccfg);
    let tokens = |t0: usize, n: usize, idx: Vec<i64>| decode_tokens(&whole, t0, n, idx, a_pre.final_state.clone());
    let mut pool = a_pre.final_state.clone();
    let mut a_out = vec![];
    for t in PRE..T {
        let x = DecodeInputs { pool, ..tokens(t, 1, vec![slot as i64]) };
        let got = simulate_decode(&dcfg, &x).unwrap_or_else(|e| panic!("{name}: decode of token {t}: {e}"));
        assert!(got.out.iter().all(|e| !e.is_nan()), "{name}: decode left output unwritten");
        a_out.extend(got.out);
        pool = got.pool;
    }
    let pool0 = whole.initial.clone().unwrap_or_default();
    for s in &spare {
        assert!(bits(&slot_of(&pool, *s)) == bits(&slot_of(&pool0, *s)), "{name}: path A changed slot {s}");
    }
    // The same 3 tokens as one call.
    let idx3 = vec![slot as i64, spare[0] as i64, spare[1] as i64];
    let one = simulate_decode(&dcfg, &tokens(PRE, T - PRE, idx3)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(bits(&one.out) == bits(&a_out), "{name}: one 3-token decode call: outputs differ from 3 calls");
    assert!(
        bits(&slot_of(&one.pool, spare[1])) == bits(&slot_of(&pool, slot)),
        "{name}: one 3-token decode call: final state differs from 3 calls"
    );

    let tail = |o: &[f64]| o[PRE * d..T * d].to_vec();
    let (sa, sb, sw) = (slot_of(&pool, slot), slot_of(&b.final_state, slot), slot_of(&want.final_state, slot));
    let errs = [
        ("A out vs ref", rel_err(&a_out, &tail(&want.out))),
        ("B out vs ref", rel_err(&tail(&b.out), &tail(&want.out))),
        ("A state vs ref", rel_err(&sa, &sw)),
        ("B state vs ref", rel_err(&sb, &sw)),
        ("A out vs B", rel_err(&a_out, &tail(&b.out))),
        ("A state vs B", rel_err(&sa, &sb)),
    ];
    eprintln!(
        "{name}: {} (rows 0..{PRE} {}bit-identical between the paths)",
        errs.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect::<Vec<_>>().join(", "),
        if prefill_rows_equal { "" } else { "not " }
    );
    errs
}

/// One case of [`prefill_then_decode`].
#[derive(Clone, Copy)]
struct Identity {
    dtype: kda_dsl::DType,
    state_dtype: kda_dsl::DType,
    gate: ChunkGate,
    beta: Beta,
    operands: ChunkOperands,
    seed: u64,
    /// The prefill's target (sm_90a: the fused kernel at `ChunkShape::HOPPER`).
    target: Target,
}

/// Both paths within 1e-2 of the f64 recurrence; of each other, the f32 states (what the pool
/// carries on) within 1e-3 with the default f16 operands (measured 2.4-4.1e-4; bf16 operands
/// 2-3e-3), 1e-2 for a bf16 pool or bf16 operands; the outputs within 1e-2. Outputs in bf16
/// cannot meet 1e-3: each path rounds them to bf16 on its own, and decode's rows alone are
/// 1.6-1.8e-3 from the f64 reference. In f16 the lower-bound gate's key products (bf16: `ki`
/// needs f32's range) keep the chunk kernel's rows 3.5e-3 from it.
#[test]
fn prefill_then_decode_equals_prefill_of_the_whole_sequence() {
    let lower = ChunkGate::LowerBound;
    let base = Identity {
        dtype: BF16,
        state_dtype: F32,
        gate: lower,
        beta: Beta::Sigmoid,
        operands: ChunkOperands::F16,
        seed: 31,
        target: Target::Sm80,
    };
    let mut cases = vec![];
    for seed in [31, 40, 41] {
        cases.push(Identity { seed, ..base });
        cases.push(Identity { seed, gate: ChunkGate::Precomputed, ..base });
    }
    cases.push(Identity { dtype: F16, seed: 42, ..base });
    cases.push(Identity { state_dtype: BF16, seed: 32, ..base });
    cases.push(Identity { operands: ChunkOperands::Bf16, seed: 33, ..base });
    // One layer under decode's rules (softplus gate, raw beta) and with negative eigenvalues.
    cases.push(Identity { gate: ChunkGate::Softplus, beta: Beta::Raw, seed: 34, ..base });
    cases.push(Identity { beta: Beta::TwoSigmoid, seed: 35, ..base });
    // The fused kernel on sm_90a (its state products on `wgmma`), then decode.
    let hopper = Identity { target: Target::Sm90a, ..base };
    cases.extend([hopper, Identity { gate: ChunkGate::Softplus, beta: Beta::Raw, seed: 36, ..hopper }]);
    for id in &cases {
        let errs = prefill_then_decode(id);
        let tight = id.state_dtype == F32 && id.operands == ChunkOperands::F16;
        for (n, e) in errs {
            let bound = if n == "A state vs B" && tight { 1e-3 } else { 1e-2 };
            assert!(
                e <= bound,
                "{:?} inputs, {:?} pool, seed {}: {n}: {e:.3e} > {bound:.0e}",
                id.dtype,
                id.state_dtype,
                id.seed
            );
        }
    }
}

/// the edge cases through the kernel: identical keys with beta near 1 and no decay (the
/// inverse's worst case: `A` is all ones below the diagonal, so INV has entries of ±1 and the
/// Neumann product would blow up), and every gate at the lower bound (`G` reaches
/// `-16 · 5 · log2(e) ≈ -115` in a chunk, so `2^-G` is near the top of bf16's range). Both stay
/// finite and within the usual bounds.
#[test]
fn identical_keys_without_decay_and_every_gate_at_the_bound() {
    // Identical keys, beta = sigmoid(8) ≈ 0.9997 and no decay, 37 tokens: a precomputed g = 0,
    // and the lower-bound rule with a raw gate input of -30 (g ≈ -5e-13), which takes the
    // tensor-core path for A.
    for (gate, spec_gate, raw) in [
        (ChunkGate::Precomputed, GateSpec::PrecomputedFixed(0.0), 0.0),
        (ChunkGate::LowerBound, GateSpec::LowerBound, -30.0),
    ] {
        let spec = ChunkSpec { gate: spec_gate, initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
        let mut x = ChunkInputs::random(&mut Rng::new(21), &spec);
        let key = x.k[..128].to_vec();
        for row in x.k.chunks_mut(128) {
            row.copy_from_slice(&key);
        }
        x.beta.iter_mut().for_each(|b| *b = 8.0);
        x.g.iter_mut().for_each(|g| *g = raw);
        let cfg = ChunkConfig { gate, ..ChunkConfig::default() };
        let r = check_chunk(&cfg, &x).expect("simulates");
        let (to, ts) = tolerance(&cfg);
        eprintln!("identical keys {gate:?}: out {:.2e} state {:.2e}", r.out_err, r.state_err);
        assert!(r.got.out.iter().chain(&r.got.final_state).all(|v| v.is_finite()), "{gate:?}: Inf or NaN");
        assert!(r.out_err <= to && r.state_err <= ts, "{gate:?}: {:.2e} {:.2e}", r.out_err, r.state_err);
    }
    // Every gate at the bound: a raw gate input of 30 saturates the sigmoid (g = lower_bound
    // = -5 on every channel of every token).
    let mut x = ChunkInputs::random(
        &mut Rng::new(22),
        &ChunkSpec { initial: InitialSpec::PerSequence, ..ChunkSpec::default() },
    );
    x.g.iter_mut().for_each(|g| *g = 30.0);
    let cfg = ChunkConfig::default();
    let r = check_chunk(&cfg, &x).expect("simulates");
    let (to, ts) = tolerance(&cfg);
    eprintln!("gates at the bound: out {:.2e} state {:.2e}", r.out_err, r.state_err);
    assert!(r.got.out.iter().chain(&r.got.final_state).all(|v| v.is_finite()), "gates at the bound: Inf or NaN");
    assert!(r.out_err <= to && r.state_err <= ts, "gates at the bound: {:.2e} {:.2e}", r.out_err, r.state_err);
}

/// The exact split of a long sequence rests on this (`kda-kernels/src/chunk_split.rs`): a
/// segment's final state is affine in its initial one, `S_end = S_0 · M + H`, where `H` is the run from zeros
/// and `M` (K x K) the run with `v = 0` from the identity (its state rows are those of `M`). The
/// kernel's three runs, combined in f64, match its direct run from `S_0`.
#[test]
fn final_state_is_affine_in_the_initial_state() {
    let d = 128;
    let spec = ChunkSpec {
        lengths: Lengths::Dense { b: 1, t: 37 },
        initial: InitialSpec::PerSequence,
        ..ChunkSpec::default()
    };
    let x = ChunkInputs::random(&mut Rng::new(41), &spec);
    let cfg = ChunkConfig::default();
    let run = |x: &ChunkInputs| simulate_chunk(&cfg, x).expect("simulates").final_state;
    let direct = run(&x);
    let from_zeros = run(&ChunkInputs { initial: Some(vec![0.0; d * d]), ..x.clone() });
    let identity: Vec<f64> = (0..d * d).map(|e| if e / d == e % d { 1.0 } else { 0.0 }).collect();
    let transition = run(&ChunkInputs { initial: Some(identity), v: vec![0.0; x.v.len()], ..x.clone() });
    let s0 = x.initial.as_ref().expect("an initial state");
    // (S_0 · M)[v][k] = sum_r S_0[v][r] M[r][k], V-first rows.
    let combined: Vec<f64> = (0..d * d)
        .map(|e| {
            let (row, col) = (e / d, e % d);
            (0..d).map(|r| s0[row * d + r] * transition[r * d + col]).sum::<f64>() + from_zeros[e]
        })
        .collect();
    let err = rel_err(&combined, &direct);
    eprintln!("S0 M + H against the direct run: {err:.2e}");
    assert!(err < 1e-2, "{err:.3e}");
}

/// The split's merge: every segment's start state matches the f64 chain `S_{s+1} = S_s M_s +
/// H_s` from each sequence's initial state, to f32 accuracy (the bf16 hi/lo products), for
/// sequences of 3, 1 and 2 segments; slots past the last segment stay untouched.
#[test]
fn merge_chains_segment_states() {
    use kda_dsl::sim::SimArg;
    use kda_kernels::chunk_merge::{chunk_merge, MergeConfig};
    use kda_kernels::reference::{rel_err, to_bytes};
    let (hv, d) = (1usize, 128usize);
    let seg_first = [0usize, 3, 4, 6];
    let (n, ns) = (seg_first.len() - 1, 7usize);
    let mut rng = Rng::new(51);
    let state = d * d;
    let init: Vec<f64> = rng.normals(n * hv * state, F32).iter().map(|x| 0.1 * x).collect();
    let h: Vec<f64> = rng.normals(ns * hv * state, F32).iter().map(|x| 0.1 * x).collect();
    let m: Vec<f64> = rng
        .normals(ns * hv * state, F32)
        .iter()
        .enumerate()
        .map(|(e, x)| 0.05 * x + if (e % state) / d == e % d { 0.9 } else { 0.0 })
        .collect();
    let cfg = MergeConfig { state_dtype: F32, states: ChunkStates::PerSequence { store_final: true } };
    let def = chunk_merge(&cfg).expect("builds");
    let t = |name: &str, v: &[f64], dt| (name.to_string(), SimArg::Tensor(to_bytes(v, dt)));
    let i = |name: &str, v: usize| (name.to_string(), SimArg::I32(v as i32));
    let firsts: Vec<f64> = seg_first.iter().map(|v| *v as f64).collect();
    let mut args = vec![
        t("state", &init, F32),
        i("P", n),
        t("state_indices", &[0.0], I32),
        i("NI", 1),
        t("read_indices", &[0.0], I32),
        i("NR", 1),
        t("has_initial", &[0.0], I32),
        i("NH", 1),
        t("seg_first", &firsts, I32),
        i("NF", n + 1),
        t("h", &h, F32),
        t("m", &m, F32),
        t("starts", &vec![f64::NAN; ns * hv * state], F32),
        i("NS", ns),
        i("HV", hv),
        i("S1", d),
        i("S2", d),
        i("NSEQ", n),
    ];
    kda_kernels::check::simulate(&def, &mut args).expect("simulates");
    let got = kda_kernels::check::tensor_values(&args, "starts", F32);
    let mut want = vec![];
    for seq in 0..n {
        let mut s = init[seq * state..(seq + 1) * state].to_vec();
        for sg in seg_first[seq]..seg_first[seq + 1] {
            want.extend_from_slice(&s);
            let at = sg * state;
            s = (0..state)
                .map(|e| {
                    let (v, k) = (e / d, e % d);
                    (0..d).map(|r| s[v * d + r] * m[at + r * d + k]).sum::<f64>() + h[at + e]
                })
                .collect();
        }
    }
    let used = seg_first[n] * state;
    let err = rel_err(&got[..used], &want);
    eprintln!("merge: starts {err:.2e}");
    assert!(err < 1e-4, "starts {err:.3e}");
    assert!(got[used..].iter().all(|v| v.is_nan()), "a slot past the last segment was written");
}

/// The exact split (`chunk_split.rs`), every pass through the simulator as the launcher runs
/// it, against the unsplit kernel and the f64 recurrence: varlen with zero-length, one-token,
/// exactly-one-segment and several-segment sequences; dense; the pool with padding and fresh
/// slots and a bf16 state; the fused passes and the passes over a prepared workspace. A
/// sequence left whole (at most two segments' worth) gives the unsplit call's bits; a longer
/// one stays within rounding of them.
#[test]
fn split_equals_unsplit() {
    let seg = 32;
    let cases = [
        ("varlen 0 | 1 | 32 | 70, fused", Lengths::Varlen(vec![0, 1, 32, 70]), InitialSpec::PerSequence, F32, false),
        ("dense 2 x 70, prepared", Lengths::Dense { b: 2, t: 70 }, InitialSpec::None, F32, true),
        (
            "pool, bf16 state, prepared",
            Lengths::Varlen(vec![65, 9, 100, 33, 3]),
            InitialSpec::Pool { slots: 6 },
            BF16,
            true,
        ),
    ];
    for (i, (name, lengths, initial, state_dtype, prepared)) in cases.into_iter().enumerate() {
        let spec = ChunkSpec { lengths, initial, state_dtype, ..ChunkSpec::default() };
        let x = ChunkInputs::random(&mut Rng::new(71 + i as u64), &spec);
        let states = match initial {
            InitialSpec::None => ChunkStates::Zeros { store_final: true },
            InitialSpec::PerSequence => ChunkStates::PerSequence { store_final: true },
            InitialSpec::Pool { .. } | InitialSpec::CachedPrefix { .. } => {
                ChunkStates::Pool { indices: I32, has_initial: Some(I32) }
            }
        };
        let mut cfg =
            ChunkConfig { state_dtype, states, varlen: x.cu_seqlens.as_ref().map(|_| I32), ..ChunkConfig::default() };
        if prepared {
            cfg = ChunkConfig { preparation: Preparation::Workspace, shape: ChunkShape::PREPARED, ..cfg };
        }
        let unsplit = simulate_chunk(&cfg, &x).unwrap_or_else(|e| panic!("{name}, unsplit: {e}"));
        let r = check_split(&cfg, &x, seg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = &r.got;
        assert_eq!((r.bad_elements, r.untouched_changed), (0, 0), "{name}: unwritten, padding or untouched slots");
        let (to, ts) = tolerance(&cfg);
        assert!(r.out_err <= to && r.state_err <= ts, "{name}: out {:.3e} state {:.3e}", r.out_err, r.state_err);
        for n in 0..x.sequences() {
            let ((out, st), (want_out, want_st)) = (sequence_of(&x, got, n), sequence_of(&x, &unsplit, n));
            if segment_count(x.span(n).1, seg) == 1 {
                assert!(
                    bits(&out) == bits(&want_out) && bits(&st) == bits(&want_st),
                    "{name}: sequence {n} changed bits"
                );
            } else {
                let (eo, es) = (rel_err(&out, &want_out), rel_err(&st, &want_st));
                eprintln!("{name}: sequence {n} ({} tokens) against unsplit: out {eo:.2e} state {es:.2e}", x.span(n).1);
                assert!(eo < 1e-2 && es < 1e-2, "{name}: sequence {n} against unsplit: out {eo:.2e} state {es:.2e}");
            }
        }
        eprintln!("{name}: out {:.2e} state {:.2e} against f64", r.out_err, r.state_err);
    }
}

/// docs/prefill.md, "Prefix caching", under the exact split: sequences cut every 32 tokens, 0,
/// 1, 15, 16, 17 and 33 tokens into their prompts, checkpointing every 16 (at every segment's
/// end too), 48 and 64 tokens, and without `prefix_lens` every 32; f32 and bf16 pools, fused
/// and over a prepared workspace, with padding, fresh slots, skipped slots and more checkpoints
/// than columns. Outputs, final states and checkpoints are within the f64 reference's
/// tolerance, no other slot is touched, and a sequence left whole keeps the unsplit call's
/// bits, its checkpoints included.
#[test]
fn split_writes_checkpoints() {
    use kda_kernels::chunk::PrefixCaching;
    use kda_kernels::chunk_ref::PrefixSpec;
    let seg = 32;
    let st = 128 * 128;
    for (i, (state_dtype, every, prepared, prefix_lens)) in
        [(F32, 16, false, Some(I64)), (BF16, 48, true, Some(I32)), (F32, 64, true, Some(I32)), (F32, 32, false, None)]
            .into_iter()
            .enumerate()
    {
        let name = format!("{state_dtype} pool, E = {every}, prepared {prepared}, prefix_lens {prefix_lens:?}");
        let spec = ChunkSpec {
            lengths: Lengths::Varlen(vec![100, 0, 70, 1, 130, 40]),
            initial: InitialSpec::Pool { slots: 8 },
            state_dtype,
            prefix: Some(PrefixSpec { every, cols: 6 }),
            ..ChunkSpec::default()
        };
        let mut x = ChunkInputs::random(&mut Rng::new(90 + i as u64), &spec);
        if prefix_lens.is_none() {
            x.prefix.as_mut().expect("prefix caching").lens.fill(0);
        }
        let mut cfg = ChunkConfig {
            state_dtype,
            varlen: Some(I32),
            states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
            prefix: PrefixCaching { prefix_lens, checkpoint_slots: Some(I32), ..Default::default() },
            ..ChunkConfig::default()
        };
        if prepared {
            cfg = ChunkConfig { preparation: Preparation::Workspace, shape: ChunkShape::PREPARED, ..cfg };
        }
        let unsplit = simulate_chunk(&cfg, &x).unwrap_or_else(|e| panic!("{name}, unsplit: {e}"));
        let r = check_split(&cfg, &x, seg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((r.bad_elements, r.untouched_changed), (0, 0), "{name}: unwritten or untouched elements");
        let (to, ts) = tolerance(&cfg);
        assert!(r.out_err <= to && r.state_err <= ts, "{name}: out {:.3e} state {:.3e}", r.out_err, r.state_err);
        let p = x.prefix.as_ref().expect("prefix caching");
        let ck = |pool: &[f64], slot: usize| pool[slot * st..(slot + 1) * st].to_vec();
        let mut split_checkpoints = 0;
        for n in 0..x.sequences() {
            let len = x.span(n).1;
            let whole = segment_count(len, seg) == 1;
            for (_, slot) in p.checkpoints_of(n, len, x.hv) {
                let (got, want) = (ck(&r.got.checkpoints, slot), ck(&unsplit.checkpoints, slot));
                if whole {
                    assert!(bits(&got) == bits(&want), "{name}: sequence {n}'s checkpoint in slot {slot} changed bits");
                } else {
                    split_checkpoints += 1;
                }
            }
            if whole {
                let ((out, s), (want_out, want_s)) = (sequence_of(&x, &r.got, n), sequence_of(&x, &unsplit, n));
                assert!(
                    bits(&out) == bits(&want_out) && bits(&s) == bits(&want_s),
                    "{name}: sequence {n} changed bits"
                );
            }
        }
        assert!(split_checkpoints >= 3, "{name}: only {split_checkpoints} checkpoints of split sequences");
        eprintln!("{name}: out {:.2e} state and checkpoints {:.2e} against f64", r.out_err, r.state_err);
    }
}

/// A states-only run (the split's segments from zeros) leaves the final states of the full
/// run, bit for bit, fused and over a prepared workspace, and writes no output row.
#[test]
fn a_states_only_run_keeps_the_states_bits() {
    use kda_kernels::chunk::ChunkRun;
    let spec = ChunkSpec { lengths: Lengths::Dense { b: 2, t: 40 }, ..ChunkSpec::default() };
    let x = ChunkInputs::random(&mut Rng::new(62), &spec);
    let zeros = ChunkConfig { states: ChunkStates::Zeros { store_final: true }, ..ChunkConfig::default() };
    let full = simulate_chunk(&zeros, &x).expect("full run");
    let chain = ChunkConfig { preparation: Preparation::Workspace, shape: ChunkShape::PREPARED, ..zeros.clone() };
    for cfg in [zeros, chain] {
        let got = simulate_chunk(&ChunkConfig { run: ChunkRun::StatesOnly, ..cfg.clone() }, &x).expect("states only");
        assert!(bits(&got.final_state) == bits(&full.final_state), "{}: the states changed", cfg.key());
        assert!(got.out.iter().all(|v| v.is_nan()), "{}: output rows written", cfg.key());
    }
}

/// docs/semantics.md, "Prefill (chunk_kda)", batch invariance under the split: a 70-token sequence
/// (3 segments of 32) gives the same bits alone (dense B = 1) and varlen-packed after sequences of 19 and 40
/// tokens, so that its segments start off the packed tensor's segment grid.
#[test]
fn split_is_batch_invariant_bit_for_bit() {
    let seg = 32;
    let x = one_sequence(81, 70);
    let other = |seed, t| ChunkInputs { a_log: x.a_log.clone(), dt_bias: x.dt_bias.clone(), ..one_sequence(seed, t) };
    let dense = ChunkConfig::default();
    let varlen = ChunkConfig { varlen: Some(I32), ..ChunkConfig::default() };
    let alone = simulate_split(&dense, &x, seg).expect("alone");
    let packed = pack(&[&other(82, 19), &other(83, 40), &x], true);
    let got = simulate_split(&varlen, &packed, seg).expect("packed");
    let ((out, st), (want_out, want_st)) = (sequence_of(&packed, &got, 2), sequence_of(&x, &alone, 0));
    assert!(bits(&out) == bits(&want_out), "output rows differ from the sequence alone");
    assert!(bits(&st) == bits(&want_st), "final state differs from the sequence alone");
}

/// NaN and infinities in one sequence's inputs (and initial state) leave every other sequence's
/// output rows and final state bit-identical, varlen-packed and in a dense batch, through the
/// fused kernel and the two-kernel path.
#[test]
fn prefill_isolation() {
    use kda_kernels::chunk_check::simulate_chunk_with;
    let base = one_sequence(31, 37);
    let seq =
        |seed, t| ChunkInputs { a_log: base.a_log.clone(), dt_bias: base.dt_bias.clone(), ..one_sequence(seed, t) };
    let poison = |x: &ChunkInputs| {
        let bad = |v: &[f64]| {
            v.iter().enumerate().map(|(i, _)| [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][i % 3]).collect::<Vec<_>>()
        };
        ChunkInputs {
            q: bad(&x.q),
            k: bad(&x.k),
            v: bad(&x.v),
            g: bad(&x.g),
            beta: bad(&x.beta),
            initial: x.initial.as_ref().map(|s| bad(s)),
            ..x.clone()
        }
    };
    for varlen in [true, false] {
        let t = if varlen { [19, 37, 5] } else { [37, 37, 37] };
        let parts = [seq(32, t[0]), seq(33, t[1]), seq(34, t[2])];
        let clean = pack(&[&parts[0], &parts[1], &parts[2]], varlen);
        let bad_middle = poison(&parts[1]);
        let dirty = pack(&[&parts[0], &bad_middle, &parts[2]], varlen);
        let fused =
            if varlen { ChunkConfig { varlen: Some(I32), ..ChunkConfig::default() } } else { ChunkConfig::default() };
        let prepared = ChunkConfig { preparation: Preparation::Workspace, ..fused.clone() };
        for cfg in [fused, prepared] {
            let a = simulate_chunk_with(&cfg, &clean, 2).unwrap_or_else(|e| panic!("{e}"));
            let b = simulate_chunk_with(&cfg, &dirty, 2).unwrap_or_else(|e| panic!("{e}"));
            let (poisoned, _) = sequence_of(&dirty, &b, 1);
            assert!(poisoned.iter().any(|v| !v.is_finite()), "the poisoned sequence stayed finite");
            for n in [0, 2] {
                let (ao, a_state) = sequence_of(&clean, &a, n);
                let (bo, b_state) = sequence_of(&dirty, &b, n);
                assert!(bits(&ao) == bits(&bo), "{}: sequence {n}'s output changed", cfg.key());
                assert!(bits(&a_state) == bits(&b_state), "{}: sequence {n}'s final state changed", cfg.key());
            }
        }
    }
}

/// The windows of chunks the token-range tests cut a call into: two chunks, one, the rest.
const WINDOWS: [ChunkWindow; 3] =
    [ChunkWindow { first: 0, end: 2 }, ChunkWindow { first: 2, end: 3 }, ChunkWindow { first: 3, end: i32::MAX }];

/// `got`'s written rows over `out` (a window leaves the rows of other windows NaN).
fn take_written(out: &mut [f64], got: &[f64]) {
    for (o, g) in out.iter_mut().zip(got) {
        if !g.is_nan() {
            *o = *g;
        }
    }
}

/// A sequence run in token ranges (windows of its chunks, the state carried from one window's
/// final state to the next one's initial state in f32) gives the bits of the run over all of
/// it, outputs and final state, fused and over a prepared workspace: the chunks are the same
/// and the state goes through memory exactly. What running the chain range by range (beside
/// the next range's preparation) rests on.
#[test]
fn token_ranges_carrying_the_state_equal_the_whole_run_bit_for_bit() {
    let x = one_sequence(71, 16 * 5 + 7);
    for preparation in [Preparation::InKernel, Preparation::Workspace] {
        let whole_cfg = ChunkConfig {
            states: ChunkStates::PerSequence { store_final: true },
            preparation,
            ..ChunkConfig::default()
        };
        let whole = simulate_chunk(&whole_cfg, &x).expect("simulates");
        let (mut state, mut out) = (x.initial.clone(), vec![f64::NAN; whole.out.len()]);
        for w in WINDOWS {
            let range = ChunkInputs { initial: state.clone(), ..x.clone() };
            let r = simulate_chunk_window(&whole_cfg, &range, 2, w).expect("simulates a range");
            take_written(&mut out, &r.out);
            state = Some(r.final_state);
        }
        let name = format!("{preparation:?}");
        assert!(bits(&out) == bits(&whole.out), "{name}: outputs differ");
        assert!(bits(&state.expect("a state")) == bits(&whole.final_state), "{name}: final states differ");
    }
}

/// The decode pool in place, in token ranges: each range reads and writes the sequences' f32
/// pool slots, the first honouring `has_initial_state`, every later one reading the slot the
/// one before wrote. The pool and the outputs have the bits of one run, padding included
/// (dense B = 3: a live slot, a padding one, a fresh prompt).
#[test]
fn token_ranges_through_the_pool_in_place_equal_the_whole_run_bit_for_bit() {
    let spec = ChunkSpec {
        lengths: Lengths::Dense { b: 3, t: 16 * 5 + 7 },
        h: 1,
        hv: 2,
        initial: InitialSpec::Pool { slots: 4 },
        ..ChunkSpec::default()
    };
    let x = ChunkInputs::random(&mut Rng::new(72), &spec);
    assert!(x.has_initial.as_ref().is_some_and(|h| h.contains(&0)), "a fresh prompt among them");
    let pool = |has_initial| ChunkStates::Pool { indices: I32, has_initial };
    for preparation in [Preparation::InKernel, Preparation::Workspace] {
        let cfg = |has_initial| ChunkConfig { states: pool(has_initial), preparation, ..ChunkConfig::default() };
        let whole = simulate_chunk(&cfg(Some(I32)), &x).expect("simulates");
        let (mut slots, mut out) = (x.initial.clone(), vec![f64::NAN; whole.out.len()]);
        for (r, w) in WINDOWS.into_iter().enumerate() {
            let range = ChunkInputs {
                initial: slots.clone(),
                has_initial: x.has_initial.clone().filter(|_| r == 0),
                ..x.clone()
            };
            let has_initial = if r == 0 { Some(I32) } else { None };
            let got = simulate_chunk_window(&cfg(has_initial), &range, 2, w).expect("simulates a range");
            take_written(&mut out, &got.out);
            slots = Some(got.final_state);
        }
        let name = format!("{preparation:?}");
        assert!(bits(&out) == bits(&whole.out), "{name}: outputs differ");
        assert!(bits(&slots.expect("a pool")) == bits(&whole.final_state), "{name}: pools differ");
    }
}

/// Prefix caching in token ranges: windows of the sequence's chunks aligned to absolute
/// positions (prefixes 0, 9 and 17, so a window's first token moves with the prefix), the first
/// reading the cached prefix's slot and every later one the slot the one before wrote, the
/// checkpoints (every 16 and 48) going to the block table as they pass. Outputs, the pool and
/// the checkpoint pool have the whole call's bits, fused and over a prepared workspace.
#[test]
fn token_ranges_with_prefix_caching_equal_the_whole_run_bit_for_bit() {
    let (x, cfg) = checkpointed_prompt(8);
    for preparation in [Preparation::InKernel, Preparation::Workspace] {
        let cfg = ChunkConfig { preparation, ..cfg.clone() };
        for (prefix, every) in [(0, 16), (9, 48), (17, 16)] {
            let name = format!("{preparation:?}, prefix {prefix}, E = {every}");
            let whole_in = checkpointed(&x, 0, 80, prefix, every, 0);
            let whole = simulate_chunk(&cfg, &whole_in).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut range = whole_in.clone();
            let mut out = vec![f64::NAN; whole.out.len()];
            for (r, w) in WINDOWS.into_iter().enumerate() {
                if r > 0 {
                    range.read_indices = range.state_indices.clone();
                }
                let got = simulate_chunk_window(&cfg, &range, 2, w).unwrap_or_else(|e| panic!("{name}: {e}"));
                take_written(&mut out, &got.out);
                range.initial = Some(got.final_state);
                range.prefix.as_mut().expect("prefix caching").pool = got.checkpoints;
            }
            assert!(bits(&out) == bits(&whole.out), "{name}: outputs differ");
            assert!(bits(range.initial.as_ref().expect("a pool")) == bits(&whole.final_state), "{name}: pools differ");
            let checkpoints = &range.prefix.as_ref().expect("prefix caching").pool;
            assert!(bits(checkpoints) == bits(&whole.checkpoints), "{name}: checkpoints differ");
            assert!(checkpoints.iter().any(|v| *v != 0.5), "{name}: no checkpoint written");
        }
    }
}

/// The range [`ChunkOperands::F16`] documents: values (and with them the state) scaled by
/// 2^17, past f16's 65504, turn the f16 operands' results Inf, while bf16 operands keep f32's
/// range and the usual bounds. The scale is a power of two, so the inputs stay exact.
#[test]
fn values_beyond_f16_range_need_bf16_operands() {
    let spec = ChunkSpec { initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
    let mut x = ChunkInputs::random(&mut Rng::new(50), &spec);
    let big = 131072.0;
    x.v.iter_mut().for_each(|v| *v *= big);
    x.initial.iter_mut().flatten().for_each(|s| *s *= big);
    let bf16 = ChunkConfig { operands: ChunkOperands::Bf16, ..ChunkConfig::default() };
    let r = check_chunk(&bf16, &x).unwrap_or_else(|e| panic!("{e}"));
    let (to, ts) = tolerance(&bf16);
    assert!(r.out_err <= to && r.state_err <= ts, "bf16 operands: out {:.3e} state {:.3e}", r.out_err, r.state_err);
    let f16 = simulate_chunk(&ChunkConfig::default(), &x).unwrap_or_else(|e| panic!("{e}"));
    assert!(f16.out.iter().any(|o| !o.is_finite()), "f16 operands kept values of 2^17 finite");
}

/// `read_indices` apart from `state_indices`: two sequences read one cached slot and write
/// their own, a third reads a slot outside the pool (zeros), a fourth is padding. Against the
/// f64 reference, fused, over a prepared workspace and split; the read slot is left as it was,
/// and each sequence equals the same call reading and writing its own copy of that slot.
#[test]
fn sequences_read_one_slot_and_write_their_own() {
    let spec = ChunkSpec {
        lengths: Lengths::Varlen(vec![40, 23, 70, 9]),
        initial: InitialSpec::Pool { slots: 6 },
        ..ChunkSpec::default()
    };
    let mut x = ChunkInputs::random(&mut Rng::new(91), &spec);
    x.has_initial = None;
    let cached = 4usize;
    x.state_indices = Some(vec![0, 1, 2, -1]);
    x.read_indices = Some(vec![cached as i64, cached as i64, 99, cached as i64]);
    let states = ChunkStates::Pool { indices: I32, has_initial: None };
    let fused = ChunkConfig { states, varlen: Some(I32), ..ChunkConfig::default() };
    let prepared = ChunkConfig { preparation: Preparation::Workspace, shape: ChunkShape::PREPARED, ..fused };
    let pool0 = x.initial.clone().expect("a pool");
    // The same call with the cached state copied into each writer's slot, read in place.
    let mut in_place = x.clone();
    let mut pool = pool0.clone();
    for w in [0usize, 1] {
        let at = w * 128 * 128 * x.hv;
        let from = cached * 128 * 128 * x.hv;
        let cached_state = pool0[from..from + 128 * 128 * x.hv].to_vec();
        pool[at..at + 128 * 128 * x.hv].copy_from_slice(&cached_state);
    }
    in_place.initial = Some(pool);
    in_place.read_indices = None;
    in_place.has_initial = Some(vec![1, 1, 0, 1]);
    let slot = |pool: &[f64], s: usize| pool[s * 128 * 128 * x.hv..(s + 1) * 128 * 128 * x.hv].to_vec();
    for (name, cfg) in [("fused", fused), ("prepared", prepared)] {
        let r = check_chunk(&cfg, &x).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((r.bad_elements, r.untouched_changed), (0, 0), "{name}");
        let (to, ts) = tolerance(&cfg);
        assert!(r.out_err <= to && r.state_err <= ts, "{name}: out {:.3e} state {:.3e}", r.out_err, r.state_err);
        assert!(
            bits(&slot(&r.got.final_state, cached)) == bits(&slot(&pool0, cached)),
            "{name}: the read slot changed"
        );
        let with_has_initial =
            ChunkConfig { states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) }, ..cfg };
        let want = simulate_chunk(&with_has_initial, &in_place).unwrap_or_else(|e| panic!("{name}, in place: {e}"));
        assert!(bits(&r.got.out) == bits(&want.out), "{name}: outputs differ from reading in place");
        for s in [0, 1, 2] {
            assert!(bits(&slot(&r.got.final_state, s)) == bits(&slot(&want.final_state, s)), "{name}: slot {s}");
        }
        let split = check_split(&cfg, &x, 32).unwrap_or_else(|e| panic!("{name}, split: {e}"));
        assert_eq!((split.bad_elements, split.untouched_changed), (0, 0), "{name}, split");
        assert!(
            split.out_err <= to && split.state_err <= ts,
            "{name}, split: {:.3e} {:.3e}",
            split.out_err,
            split.state_err
        );
        assert!(bits(&slot(&split.got.final_state, cached)) == bits(&slot(&pool0, cached)), "{name}, split: read slot");
    }
}

/// A call of `len` tokens (one dense sequence, HV = 1, a 4-slot f32 pool written at slot 1,
/// read from `read`) `prefix` tokens into its prompt, checkpointing every `every` tokens into
/// an 8-slot pool by the block table `[2, 3, 4, 5, 6, 7]`, from `x`'s tokens `from ..`.
fn checkpointed(x: &ChunkInputs, from: usize, len: usize, prefix: usize, every: usize, read: i64) -> ChunkInputs {
    use kda_kernels::chunk_ref::PrefixInputs;
    let (row, st) = (x.h * 128, x.hv * 128 * 128);
    let rows = |v: &[f64], w: usize| v[from * w..(from + len) * w].to_vec();
    let mut pool = x.initial.clone().expect("a pool");
    pool.truncate(4 * st);
    ChunkInputs {
        t: len,
        q: rows(&x.q, row),
        k: rows(&x.k, row),
        v: rows(&x.v, x.hv * 128),
        g: rows(&x.g, x.hv * 128),
        beta: rows(&x.beta, x.hv),
        initial: Some(pool),
        state_indices: Some(vec![1]),
        read_indices: Some(vec![read]),
        has_initial: None,
        prefix: Some(PrefixInputs {
            lens: vec![prefix as i64],
            every,
            slots: vec![2, 3, 4, 5, 6, 7],
            cols: 6,
            pool: vec![0.5; 8 * st],
        }),
        ..x.clone()
    }
}

/// An 80-token prompt (dense, H = HV = 1, a 4-slot f32 pool) drawn from `seed`, and the fused
/// config that reads it with `prefix_lens` and checkpoints (i32 indices).
fn checkpointed_prompt(seed: u64) -> (ChunkInputs, ChunkConfig) {
    checkpointed_prompt_of(seed, 80)
}

/// [`checkpointed_prompt`] of `t` tokens.
fn checkpointed_prompt_of(seed: u64, t: usize) -> (ChunkInputs, ChunkConfig) {
    use kda_kernels::chunk::PrefixCaching;
    let spec = ChunkSpec {
        lengths: Lengths::Dense { b: 1, t },
        h: 1,
        hv: 1,
        initial: InitialSpec::Pool { slots: 4 },
        ..ChunkSpec::default()
    };
    let cfg = ChunkConfig {
        states: ChunkStates::Pool { indices: I32, has_initial: None },
        prefix: PrefixCaching { prefix_lens: Some(I32), checkpoint_slots: Some(I32), ..Default::default() },
        ..ChunkConfig::default()
    };
    (ChunkInputs::random(&mut Rng::new(seed), &spec), cfg)
}

/// docs/prefill.md, "Prefix caching", bit for bit with an f32 pool: for prefix
/// lengths 0, 1, 15, 16 and 17 and E = 16, 64 (an 80-token prompt) and 256 (a 300-token one),
/// the checkpoints are within the f64 reference's tolerance; each checkpoint is the final state
/// of the same call stopped at its position; and the call resumed from a checkpoint (its
/// position as the prefix, reading the checkpoint's slot from the checkpoint pool copied into
/// the state pool) gives the whole call's remaining output rows and final state.
#[test]
fn checkpoints_are_the_state_at_their_boundary() {
    let st = 128 * 128;
    let slot = |pool: &[f64], s: usize| pool[s * st..(s + 1) * st].to_vec();
    for (every, t) in [(16usize, 80), (64, 80), (256, 300)] {
        let (x, cfg) = checkpointed_prompt_of(5, t);
        for prefix in [0usize, 1, 15, 16, 17] {
            let len = t - prefix.min(16);
            let name = format!("E = {every}, prefix {prefix}");
            let whole = checkpointed(&x, 0, len, prefix, every, 0);
            let r = check_chunk(&cfg, &whole).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((r.bad_elements, r.untouched_changed), (0, 0), "{name}");
            assert!(r.out_err <= 1e-2 && r.state_err <= 1e-2, "{name}: {:.2e} {:.2e}", r.out_err, r.state_err);
            let want = chunk_reference(&whole);
            let got = &r.got;
            let positions: Vec<usize> =
                (1..).map(|k| k * every).skip_while(|p| *p <= prefix).take_while(|p| *p < prefix + len).collect();
            assert!(!positions.is_empty() || every > prefix + len, "{name}: no checkpoint to test");
            for (j, slot_n) in (2..8).enumerate() {
                let written = positions.iter().any(|p| p / every - 1 == j);
                let (g, w) = (slot(&got.checkpoints, slot_n), slot(&want.checkpoints, slot_n));
                if written {
                    let e = rel_err(&g, &w);
                    assert!(e <= 1e-2, "{name}: checkpoint slot {slot_n}: {e:.2e}");
                } else {
                    assert!(g.iter().all(|v| *v == 0.5), "{name}: slot {slot_n} written");
                }
            }
            for &p in &positions {
                let ck = slot(&got.checkpoints, 2 + p / every - 1);
                // The same call stopped at p.
                let stopped = checkpointed(&x, 0, p - prefix, prefix, every, 0);
                let s = simulate_chunk(&cfg, &stopped).unwrap_or_else(|e| panic!("{name}, stopped at {p}: {e}"));
                assert!(
                    bits(&ck) == bits(&slot(&s.final_state, 1)),
                    "{name}: checkpoint at {p} != the call stopped there"
                );
                // Resumed from the checkpoint.
                let mut resumed = checkpointed(&x, p - prefix, len - (p - prefix), p, every, 3);
                let pool = resumed.initial.as_mut().expect("a pool");
                pool[3 * st..4 * st].copy_from_slice(&ck);
                let rr = simulate_chunk(&cfg, &resumed).unwrap_or_else(|e| panic!("{name}, resumed at {p}: {e}"));
                let tail = |o: &[f64]| o[(p - prefix) * 128..].to_vec();
                assert!(bits(&rr.out) == bits(&tail(&got.out)), "{name}: outputs resumed at {p}");
                assert!(
                    bits(&slot(&rr.final_state, 1)) == bits(&slot(&got.final_state, 1)),
                    "{name}: state resumed at {p}"
                );
            }
        }
    }
}

/// Batch invariance with prefix caching: a sequence's output rows, final state and checkpoints
/// are the same bits alone and packed among others (varlen, after sequences of 19 and 0 tokens
/// with other prefixes and block tables).
#[test]
fn checkpoints_are_batch_invariant_bit_for_bit() {
    use kda_kernels::chunk::PrefixCaching;
    use kda_kernels::chunk_ref::PrefixInputs;
    let cfg = ChunkConfig {
        varlen: Some(I32),
        states: ChunkStates::Pool { indices: I32, has_initial: None },
        prefix: PrefixCaching { prefix_lens: Some(I32), checkpoint_slots: Some(I32), ..Default::default() },
        ..ChunkConfig::default()
    };
    let st = 128 * 128;
    let part = |seed: u64, t: usize| {
        let spec = ChunkSpec { lengths: Lengths::Dense { b: 1, t }, h: 1, hv: 1, ..ChunkSpec::default() };
        ChunkInputs::random(&mut Rng::new(seed), &spec)
    };
    let c = part(5, 70);
    let same_head = |x: ChunkInputs| ChunkInputs { a_log: c.a_log.clone(), dt_bias: c.dt_bias.clone(), ..x };
    let (a, b) = (same_head(part(3, 19)), same_head(part(4, 0)));
    // Alone: prefix 9, checkpoints every 16 into slots 0 .. 4 of a 5-slot pool.
    let alone_pool: Vec<f64> = (0..st).map(|i| 0.01 * (i % 97) as f64).collect();
    let alone = ChunkInputs {
        cu_seqlens: Some(vec![0, 70]),
        initial: Some(alone_pool.clone()),
        state_indices: Some(vec![0]),
        has_initial: None,
        prefix: Some(PrefixInputs {
            lens: vec![9],
            every: 16,
            slots: vec![0, 1, 2, 3, 4],
            cols: 5,
            pool: vec![0.5; 5 * st],
        }),
        ..c.clone()
    };
    let mut packed = pack(&[&a, &b, &c], true);
    let mut pool = vec![0.25; 3 * st];
    pool[2 * st..].copy_from_slice(&alone_pool);
    packed.initial = Some(pool);
    packed.state_indices = Some(vec![0, 1, 2]);
    packed.has_initial = None;
    packed.prefix = Some(PrefixInputs {
        lens: vec![40, 3, 9],
        every: 16,
        slots: vec![10, 11, 12, 13, 14, -1, -1, -1, -1, -1, 0, 1, 2, 3, 4],
        cols: 5,
        pool: vec![0.5; 15 * st],
    });
    let one = simulate_chunk(&cfg, &alone).expect("alone");
    let many = simulate_chunk(&cfg, &packed).expect("packed");
    let (o1, s1) = sequence_of(&alone, &one, 0);
    let (o2, s2) = sequence_of(&packed, &many, 2);
    assert!(bits(&o1) == bits(&o2), "output rows differ");
    assert!(bits(&s1) == bits(&s2), "final state differs");
    assert!(bits(&one.checkpoints) == bits(&many.checkpoints[..5 * st]), "checkpoints differ");
    assert!(one.checkpoints[..4 * st].iter().all(|v| *v != 0.5), "the four checkpoints (16, 32, 48, 64) written");
}

/// Prefix caching, then decode: the 80-token prompt checkpointed every 16 tokens; a second
/// request resumes from the checkpoint at 48 (reading it, writing its own slot) for tokens
/// 48 .. 77, then decodes tokens 77 .. 80 one by one from that slot. Its outputs and final
/// state are within the f64 tolerance of the whole prompt's token recurrence.
#[test]
fn decode_continues_from_a_resumed_prefill() {
    let (x, cfg) = checkpointed_prompt(17);
    let (d, st) = (128, 128 * 128);
    // The first request: the whole prompt from slot 0 (every 16 tokens into slots 2 .. 7).
    let first = checkpointed(&x, 0, 80, 0, 16, 0);
    let got = simulate_chunk(&cfg, &first).expect("first request");
    let at48 = got.checkpoints[(2 + 48 / 16 - 1) * st..][..st].to_vec();
    // The second: from the checkpoint at 48 (copied into pool slot 3), tokens 48 .. 77.
    let mut resumed = checkpointed(&x, 48, 29, 48, 16, 3);
    resumed.initial.as_mut().expect("a pool")[3 * st..4 * st].copy_from_slice(&at48);
    let r = simulate_chunk(&cfg, &resumed).expect("resumed");
    // Then decode 77 .. 80 from and into slot 1, with the prompt's rules.
    let dcfg = layer_decode(&cfg);
    let mut pool = r.final_state.clone();
    let mut outs = r.out.clone();
    for t in 77..80 {
        let step = decode_tokens(&x, t, 1, vec![1], pool);
        let got = simulate_decode(&dcfg, &step).unwrap_or_else(|e| panic!("decode of token {t}: {e}"));
        outs.extend(got.out);
        pool = got.pool;
    }
    // The whole prompt from the same start, by the token recurrence.
    let want = chunk_reference(&checkpointed(&x, 0, 80, 0, 16, 0));
    let e_out = rel_err(&outs, &want.out[48 * d..]);
    let e_state = rel_err(&pool[st..2 * st], &want.final_state[st..2 * st]);
    assert!(e_out <= 1e-2 && e_state <= 1e-2, "outputs {e_out:.2e}, state {e_state:.2e}");
}
