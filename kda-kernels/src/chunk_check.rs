//! `chunk` through the block simulator against the f64 reference of `chunk_kda`.

use crate::check::{simulate, simulate_on, tensor_values};
use crate::chunk::{chunk, ChunkConfig, ChunkShape, ChunkStates, ChunkWindow, Preparation, PREP_COLS, PREP_DECAY_COLS};
use crate::chunk_prep::{chunk_prep, prep_rows, PrepConfig};
use crate::chunk_ref::{chunk_reference, ChunkInputs, ChunkOutputs, PrefixInputs};
use crate::reference::{rel_err, to_bytes};
use kda_dsl::sim::SimArg;
use kda_dsl::{DType, Target};

use crate::decode_ref::D;

/// How a simulated chunk call compares with the f64 reference.
#[derive(Clone, Debug)]
pub struct ChunkCompare {
    /// Worst relative error of one (sequence, value head)'s output rows.
    pub out_err: f64,
    /// Worst relative error of one written (sequence, value head) state.
    pub state_err: f64,
    /// Output elements that are NaN (never written) or non-zero where the reference is exactly
    /// zero (padding rows).
    pub bad_elements: usize,
    /// State elements that differ from the reference in slots the call must not write.
    pub untouched_changed: usize,
    /// What the simulator produced.
    pub got: ChunkOutputs,
}

/// Error bounds `(output, state)` against the f64 reference (docs/semantics.md "Numerics to test
/// against"): 16-bit inputs and outputs, and the state's products on 16-bit operands.
pub fn tolerance(_cfg: &ChunkConfig) -> (f64, f64) {
    (1e-2, 1e-2)
}

/// Runs one call in the simulator and compares it with [`chunk_reference`], per (sequence,
/// value head).
pub fn check_chunk(cfg: &ChunkConfig, x: &ChunkInputs) -> Result<ChunkCompare, String> {
    check_chunk_on(cfg, x, Target::Sm80)
}

/// [`check_chunk`] with the kernels compiled for `target`.
pub fn check_chunk_on(cfg: &ChunkConfig, x: &ChunkInputs, target: Target) -> Result<ChunkCompare, String> {
    let got = simulate_chunk_on(cfg, x, 4, target)?;
    Ok(compare_chunk(cfg, x, got, &chunk_reference(x)))
}

/// Runs one call split every `seg` tokens in the simulator ([`simulate_split`]) and compares it
/// with [`chunk_reference`], per (sequence, value head).
pub fn check_split(cfg: &ChunkConfig, x: &ChunkInputs, seg: usize) -> Result<ChunkCompare, String> {
    check_split_on(cfg, x, seg, Target::Sm80)
}

/// [`check_split`] with the split's chunk passes compiled for `target`.
pub fn check_split_on(cfg: &ChunkConfig, x: &ChunkInputs, seg: usize, target: Target) -> Result<ChunkCompare, String> {
    let got = simulate_split_on(cfg, x, seg, target)?;
    Ok(compare_chunk(cfg, x, got, &chunk_reference(x)))
}

/// Whether the two-kernel path (`chunk_prep` over `prep_blocks` blocks per sequence and head,
/// then `chunk` over its workspace in blocks of the `chain` shape) writes exactly the fused
/// kernel's bits for `cfg`'s call, in the simulator.
pub fn two_kernel_path_matches(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    chain: ChunkShape,
    prep_blocks: usize,
) -> Result<bool, String> {
    two_kernel_path_matches_on(cfg, x, chain, prep_blocks, Target::Sm80)
}

/// [`two_kernel_path_matches`] with the chain compiled for `target` (the fused kernel and the
/// preparation for sm_80).
pub fn two_kernel_path_matches_on(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    chain: ChunkShape,
    prep_blocks: usize,
    target: Target,
) -> Result<bool, String> {
    let fused = simulate_chunk(cfg, x)?;
    let two = ChunkConfig { preparation: Preparation::Workspace, shape: chain, ..cfg.clone() };
    let got = simulate_chunk_on(&two, x, prep_blocks, target)?;
    Ok(same_bits(&got, &fused))
}

/// Whether `cfg`'s call writes the same bits at launch shape `other` as at `shape`, both
/// compiled for `target`, in the simulator.
pub fn shapes_match_on(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    shape: ChunkShape,
    other: ChunkShape,
    target: Target,
) -> Result<bool, String> {
    let run = |shape| simulate_chunk_on(&ChunkConfig { shape, ..cfg.clone() }, x, 2, target);
    Ok(same_bits(&run(other)?, &run(shape)?))
}

/// Whether two calls wrote the same bits: outputs, final states and checkpoints.
fn same_bits(a: &ChunkOutputs, b: &ChunkOutputs) -> bool {
    let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
    bits(&a.out) == bits(&b.out)
        && bits(&a.final_state) == bits(&b.final_state)
        && bits(&a.checkpoints) == bits(&b.checkpoints)
}

/// Compares what a call wrote (`got`, from the simulator or a GPU) with the reference's `want`,
/// per (sequence, value head).
pub fn compare_chunk(cfg: &ChunkConfig, x: &ChunkInputs, got: ChunkOutputs, want: &ChunkOutputs) -> ChunkCompare {
    let mut out_err = 0.0f64;
    let mut bad_elements = 0;
    for n in 0..x.sequences() {
        // The first token as a row of the flattened `[B * T]` tokens.
        let (row0, tn) = x.span(n);
        for hv in 0..x.hv {
            let rows = |o: &[f64]| -> Vec<f64> {
                (row0..row0 + tn).flat_map(|r| o[(r * x.hv + hv) * D..][..D].to_vec()).collect()
            };
            let (g, w) = (rows(&got.out), rows(&want.out));
            if w.iter().all(|v| *v == 0.0) {
                bad_elements += g.iter().filter(|v| **v != 0.0).count();
            } else {
                out_err = out_err.max(rel_err(&g, &w));
            }
        }
    }
    bad_elements += got.out.iter().filter(|v| v.is_nan()).count();
    let state = |s: &[f64], slot: usize, hv: usize| s[(slot * x.hv + hv) * D * D..][..D * D].to_vec();
    let mut state_err = 0.0f64;
    let mut untouched_changed = 0;
    let n = x.sequences();
    match cfg.states {
        ChunkStates::Pool { .. } => {
            let idx = x.state_indices.as_deref().unwrap_or(&[]);
            let slots = x.pool_slots();
            for slot in 0..slots {
                let written = idx.contains(&(slot as i64));
                for hv in 0..x.hv {
                    let (g, w) = (state(&got.final_state, slot, hv), state(&want.final_state, slot, hv));
                    if written {
                        state_err = state_err.max(rel_err(&g, &w));
                    } else {
                        untouched_changed += g.iter().zip(&w).filter(|(a, b)| a != b).count();
                    }
                }
            }
        }
        ChunkStates::Zeros { store_final: true } | ChunkStates::PerSequence { store_final: true } => {
            for s in 0..n {
                for hv in 0..x.hv {
                    state_err =
                        state_err.max(rel_err(&state(&got.final_state, s, hv), &state(&want.final_state, s, hv)));
                }
            }
        }
        _ => {}
    }
    // The checkpoints: each written slot against the reference's, every other left as it was.
    if let (Some(p), Some(_)) = (&x.prefix, cfg.prefix.checkpoint_slots) {
        let written: std::collections::HashSet<usize> = (0..n)
            .filter(|&s| x.state_indices.as_ref().is_none_or(|idx| idx[s] >= 0 && (idx[s] as usize) < x.pool_slots()))
            .flat_map(|s| p.checkpoints_of(s, x.span(s).1, x.hv))
            .map(|(_, slot)| slot)
            .collect();
        for slot in 0..p.pool.len() / (x.hv * D * D) {
            for hv in 0..x.hv {
                let (g, w) = (state(&got.checkpoints, slot, hv), state(&want.checkpoints, slot, hv));
                if written.contains(&slot) {
                    state_err = state_err.max(rel_err(&g, &w));
                } else {
                    untouched_changed += g.iter().zip(&w).filter(|(a, b)| a != b).count();
                }
            }
        }
    }
    ChunkCompare { out_err, state_err, bad_elements, untouched_changed, got }
}

/// Runs one call in the simulator; the output and final state start as NaN.
pub fn simulate_chunk(cfg: &ChunkConfig, x: &ChunkInputs) -> Result<ChunkOutputs, String> {
    simulate_chunk_with(cfg, x, 4)
}

/// [`simulate_chunk`], with a [`Preparation::Workspace`] config's preparation spread over
/// `prep_blocks` blocks per (sequence, value head).
pub fn simulate_chunk_with(cfg: &ChunkConfig, x: &ChunkInputs, prep_blocks: usize) -> Result<ChunkOutputs, String> {
    simulate_chunk_on(cfg, x, prep_blocks, Target::Sm80)
}

/// [`simulate_chunk_with`] with the kernels compiled for `target`.
pub fn simulate_chunk_on(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    prep_blocks: usize,
    target: Target,
) -> Result<ChunkOutputs, String> {
    simulate_pass(cfg, x, prep_blocks, target, ChunkWindow::ALL, None)
}

/// [`simulate_chunk_with`] over a window of every sequence's chunks (a token range): the
/// preparation and the chain run chunks `window.first .. window.end` alone, from `x`'s states;
/// rows outside the window keep their NaN.
pub fn simulate_chunk_window(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    prep_blocks: usize,
    window: ChunkWindow,
) -> Result<ChunkOutputs, String> {
    simulate_pass(cfg, x, prep_blocks, Target::Sm80, window, None)
}

/// [`simulate_chunk_on`] over `window`, for a split's pass with prefix caching also given each
/// segment's `segment_rows` (`[S, 2]`: its sequence's checkpoint row and absolute end).
fn simulate_pass(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    prep_blocks: usize,
    target: Target,
    window: ChunkWindow,
    segment_rows: Option<&[i64]>,
) -> Result<ChunkOutputs, String> {
    let def = chunk(cfg).map_err(|e| e.to_string())?;
    let n = x.sequences();
    let (dt, st) = (cfg.dtype, cfg.state_dtype);
    let t = |n: &str, v: &[f64], d: DType| (n.to_string(), SimArg::Tensor(to_bytes(v, d)));
    let i = |n: &str, v: usize| (n.to_string(), SimArg::I32(v as i32));
    let small = |n: &str, d: DType| (n.to_string(), SimArg::Tensor(to_bytes(&[0.0; 4], d)));
    let mut args = vec![
        t("q", &x.q, dt),
        t("k", &x.k, dt),
        t("v", &x.v, dt),
        t("g", &x.g, dt),
        t("beta", &x.beta, dt),
        i("B", x.b),
        i("T", x.t),
        i("H", x.h),
        i("HV", x.hv),
        i("KD", D),
        i("VD", D),
        i("S1", D),
        i("S2", D),
        t("out", &vec![f64::NAN; x.b * x.t * x.hv * D], dt),
        i("NSEQ", n),
        ("scale".into(), SimArg::F32(x.scale as f32)),
        ("lower_bound".into(), SimArg::F32(x.lower_bound as f32)),
        ("first_chunk".into(), SimArg::I32(window.first)),
        ("end_chunk".into(), SimArg::I32(window.end)),
    ];
    match (&x.a_log, &x.dt_bias) {
        (Some(al), Some(db)) => args.extend([
            t("a_log", al, DType::F32),
            i("HVA", x.hv),
            t("dt_bias", db, cfg.dt_bias),
            i("HVD", x.hv),
            i("KDB", D),
        ]),
        _ => args.extend([
            small("a_log", DType::F32),
            i("HVA", 1),
            small("dt_bias", cfg.dt_bias),
            i("HVD", 1),
            i("KDB", 1),
        ]),
    }
    let state_len = |slots: usize| slots * x.hv * D * D;
    match (cfg.states, &x.initial) {
        (ChunkStates::Zeros { .. }, _) | (_, None) => args.extend([small("state", st), i("P", 1)]),
        (_, Some(init)) => args.extend([t("state", init, st), i("P", init.len() / state_len(1))]),
    }
    let stores_final =
        matches!(cfg.states, ChunkStates::Zeros { store_final: true } | ChunkStates::PerSequence { store_final: true });
    if stores_final {
        args.extend([t("final_state", &vec![f64::NAN; state_len(n)], st), i("F", n)]);
    } else {
        args.extend([small("final_state", st), i("F", 1)]);
    }
    let as_f64 = |v: &[i64]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    match (cfg.states, &x.state_indices) {
        (ChunkStates::Pool { indices, .. }, Some(idx)) => {
            let read = x.read_indices.as_ref().unwrap_or(idx);
            args.extend([t("state_indices", &as_f64(idx), indices), i("NI", n)]);
            args.extend([t("read_indices", &as_f64(read), indices), i("NR", n)]);
        }
        _ => {
            args.extend([small("state_indices", DType::I32), i("NI", 1), small("read_indices", DType::I32), i("NR", 1)])
        }
    }
    match (cfg.states, &x.has_initial) {
        (ChunkStates::Pool { has_initial: Some(d), .. }, Some(h)) => {
            args.extend([t("has_initial", &as_f64(h), d), i("NH", n)])
        }
        _ => args.extend([small("has_initial", DType::I32), i("NH", 1)]),
    }
    match (cfg.varlen, &x.cu_seqlens) {
        (Some(d), Some(cu)) => args.extend([t("cu_seqlens", &as_f64(cu), d), i("NC", cu.len())]),
        _ => args.extend([small("cu_seqlens", DType::I32), i("NC", 1)]),
    }
    args.extend(prefix_args(cfg, x));
    match segment_rows {
        Some(rows) => args.extend([t("segment_rows", &as_f64(rows), DType::I32), i("NSR", rows.len() / 2)]),
        None => args.extend([small("segment_rows", DType::I32), i("NSR", 1)]),
    }
    args.push(i("RW", 2));
    match cfg.preparation {
        Preparation::InKernel => args.extend([
            small("prep", cfg.operands.dtype()),
            small("prep_decay", DType::F32),
            i("WB", 1),
            i("TP", 1),
            i("TC", 1),
            i("PW", 1),
            i("DW", 1),
        ]),
        Preparation::Workspace => {
            // Poisoned, so that a row the preparation skips and the state pass reads shows.
            let (wb, tp) = prep_rows(x.b, x.t, n, cfg.varlen.is_some(), cfg.prefix.prefix_lens.is_some());
            let rows = wb * tp * x.hv;
            let tc = tp.div_ceil(16);
            args.extend([
                t("prep", &vec![f64::NAN; rows * PREP_COLS], cfg.operands.dtype()),
                t("prep_decay", &vec![f64::NAN; wb * tc * x.hv * PREP_DECAY_COLS], DType::F32),
                i("WB", wb),
                i("TP", tp),
                i("TC", tc),
                i("PW", PREP_COLS),
                i("DW", PREP_DECAY_COLS),
                i("NX", prep_blocks),
            ]);
            // The preparation is sm_80's on every device, as the runtime launches it.
            let prep = chunk_prep(&PrepConfig::of(cfg)).map_err(|e| e.to_string())?;
            simulate_on(&prep, Target::Sm80, &mut args)?;
        }
    }
    simulate_on(&def, target, &mut args)?;
    let final_state = match cfg.states {
        ChunkStates::Pool { .. } => tensor_values(&args, "state", st),
        _ if stores_final => tensor_values(&args, "final_state", st),
        _ => vec![],
    };
    let checkpoints = match cfg.prefix.checkpoint_slots {
        Some(_) => tensor_values(&args, "checkpoints", cfg.prefix.checkpoint_dtype(st)),
        None => vec![],
    };
    Ok(ChunkOutputs { out: tensor_values(&args, "out", dt), final_state, checkpoints })
}

/// The prefix-caching arguments of `cfg`'s kernel for `x`: its `prefix_lens`, checkpoint slots
/// and pool and `checkpoint_every` where the config takes them, placeholders otherwise.
fn prefix_args(cfg: &ChunkConfig, x: &ChunkInputs) -> Vec<(String, SimArg)> {
    let t = |n: &str, v: &[f64], d: DType| (n.to_string(), SimArg::Tensor(to_bytes(v, d)));
    let i = |n: &str, v: usize| (n.to_string(), SimArg::I32(v as i32));
    let ints = |v: &[i64]| v.iter().map(|e| *e as f64).collect::<Vec<_>>();
    let n = x.sequences();
    let p = x.prefix.as_ref();
    let mut args = vec![];
    match (cfg.prefix.prefix_lens, p) {
        (Some(d), Some(p)) => args.extend([t("prefix_lens", &ints(&p.lens), d), i("NPL", n)]),
        _ => args.extend([t("prefix_lens", &[0.0], DType::I32), i("NPL", 1)]),
    }
    let state = x.hv * D * D;
    match (cfg.prefix.checkpoint_slots, p) {
        (Some(d), Some(p)) => args.extend([
            t("checkpoint_slots", &ints(&p.slots), d),
            i("NCK", n),
            i("CC", p.cols),
            t("checkpoints", &p.pool, cfg.prefix.checkpoint_dtype(cfg.state_dtype)),
            i("PC", p.pool.len() / state),
            ("checkpoint_every".to_string(), SimArg::I32(p.every as i32)),
        ]),
        _ => args.extend([
            t("checkpoint_slots", &[0.0], DType::I32),
            i("NCK", 1),
            i("CC", 1),
            t("checkpoints", &[0.0], cfg.prefix.checkpoint_dtype(cfg.state_dtype)),
            i("PC", 0),
            ("checkpoint_every".to_string(), SimArg::I32(16)),
        ]),
    }
    args
}

/// Runs a call split every `seg` tokens (`chunk_split.rs`) in the simulator, pass by pass as
/// the launcher runs it: the schedule, the transitions and the states from zeros (into
/// NaN-poisoned tables), the merge, the output pass and the finish. `cfg` is the call's config
/// (its preparation says whether the passes read a prepared workspace); the output and final
/// states start as NaN, a pool as `x` gives it.
pub fn simulate_split(cfg: &ChunkConfig, x: &ChunkInputs, seg: usize) -> Result<ChunkOutputs, String> {
    simulate_split_on(cfg, x, seg, Target::Sm80)
}

/// [`simulate_split`] with the chunk passes (the transitions, the states from zeros and the
/// output) compiled for `target`; the schedule, the merge and the finish stay sm_80's.
pub fn simulate_split_on(
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    seg: usize,
    target: Target,
) -> Result<ChunkOutputs, String> {
    use crate::chunk_merge::{chunk_finish, chunk_merge};
    use crate::chunk_segments::{max_segments, simulate_segments, ScheduleInputs, SegmentPositions};
    use crate::chunk_split::split_configs;
    let c = split_configs(cfg);
    let nseq = x.sequences();
    let (pool_slots, pool) = (x.pool_slots(), cfg.states.pool());
    let indices = x.state_indices.clone().unwrap_or_else(|| vec![0]);
    let cu = x.cu_seqlens.clone().unwrap_or_else(|| vec![0]);
    let lens = x.prefix.as_ref().map_or(vec![0], |p| p.lens.clone());
    let schedule = ScheduleInputs { cu: &cu, t: x.t, nseq, indices: &indices, pool: pool_slots, prefix_lens: &lens };
    let tab = simulate_segments(&c.segments, &schedule, seg)?;
    let ns = max_segments(nseq, x.b * x.t, seg);
    let state = x.hv * D * D;
    // The segments as a varlen batch over the same token rows, their states in the tables;
    // with prefix caching their prefixes are their absolute starts.
    let positions = c.segments.positions != SegmentPositions::Unused;
    let segment_prefix = match &x.prefix {
        Some(p) if positions => Some(PrefixInputs { lens: tab.seg_prefix.clone(), ..p.clone() }),
        other => other.clone(),
    };
    let segments = |indices: &[i64], table: Vec<f64>, has_initial: Option<Vec<i64>>| ChunkInputs {
        b: 1,
        t: x.b * x.t,
        cu_seqlens: Some(tab.seg_cu.clone()),
        initial: Some(table),
        state_indices: Some(indices.to_vec()),
        read_indices: None,
        has_initial,
        prefix: segment_prefix.clone(),
        ..x.clone()
    };
    let poisoned = || vec![f64::NAN; ns * state];
    let pass = |cfg: &ChunkConfig, x: &ChunkInputs| simulate_chunk_on(cfg, x, 4, target);
    let m = pass(&c.transition, &segments(&tab.split, poisoned(), None))?.final_state;
    let h = pass(&c.from_zeros, &segments(&tab.split, poisoned(), Some(tab.fresh.clone())))?.final_state;

    let t = |n: &str, v: &[f64], d: DType| (n.to_string(), SimArg::Tensor(to_bytes(v, d)));
    let i = |n: &str, v: usize| (n.to_string(), SimArg::I32(v as i32));
    let ints = |v: &[i64]| v.iter().map(|e| *e as f64).collect::<Vec<_>>();
    let st = cfg.state_dtype;
    let (state_t, slots) = match (&x.initial, cfg.states) {
        (Some(s), ChunkStates::PerSequence { .. } | ChunkStates::Pool { .. }) => (s.clone(), s.len() / state),
        _ => (vec![0.0; state], 1),
    };
    let mut common = vec![
        t("state", &state_t, st),
        i("P", slots),
        t("seg_first", &ints(&tab.seg_first), DType::I32),
        i("NF", nseq + 1),
        i("NS", ns),
        i("HV", x.hv),
        i("S1", D),
        i("S2", D),
        i("NSEQ", nseq),
    ];
    match (pool, &x.state_indices) {
        (true, Some(idx)) => common.extend([t("state_indices", &ints(idx), cfg.states.indices()), i("NI", nseq)]),
        _ => common.extend([t("state_indices", &[0.0], DType::I32), i("NI", 1)]),
    }
    let mut merge_args = common.clone();
    match (pool, &x.state_indices) {
        (true, Some(idx)) => {
            let read = x.read_indices.as_ref().unwrap_or(idx);
            merge_args.extend([t("read_indices", &ints(read), cfg.states.indices()), i("NR", nseq)])
        }
        _ => merge_args.extend([t("read_indices", &[0.0], DType::I32), i("NR", 1)]),
    }
    match (cfg.states.has_initial(), &x.has_initial) {
        (Some(d), Some(hi)) => merge_args.extend([t("has_initial", &ints(hi), d), i("NH", nseq)]),
        _ => merge_args.extend([t("has_initial", &[0.0], DType::I32), i("NH", 1)]),
    }
    merge_args.extend([t("h", &h, DType::F32), t("m", &m, DType::F32), t("starts", &poisoned(), DType::F32)]);
    simulate(&chunk_merge(&c.merge).map_err(|e| e.to_string())?, &mut merge_args)?;
    let starts = tensor_values(&merge_args, "starts", DType::F32);

    let rows = positions.then_some(tab.seg_rows.as_slice());
    let pass4 = simulate_pass(&c.output, &segments(&tab.live, starts, None), 4, target, ChunkWindow::ALL, rows)?;
    let mut final_state = vec![];
    if let Some(f) = &c.finish {
        let mut args = common;
        args.extend([
            t("final_state", &vec![f64::NAN; nseq * state], st),
            i("F", nseq),
            t("ends", &pass4.final_state, DType::F32),
        ]);
        simulate(&chunk_finish(f).map_err(|e| e.to_string())?, &mut args)?;
        final_state = tensor_values(&args, if pool { "state" } else { "final_state" }, st);
    }
    Ok(ChunkOutputs { out: pass4.out, final_state, checkpoints: pass4.checkpoints })
}
