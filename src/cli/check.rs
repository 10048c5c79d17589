//! `kda check [--gpu [--quick] [--no-simulator]]`: every kernel family through the simulator
//! against its reference; with `--gpu` the GPU conformance cases too, at small shapes with
//! `--quick`, alone with `--no-simulator`.

use kda_dsl::Target;
use kda_kernels::check::{check_decode, check_gemm};
use kda_kernels::chunk::{ChunkConfig, ChunkShape};
use kda_kernels::chunk_check::{shapes_match_on, two_kernel_path_matches};
use kda_kernels::decode_families::{decode_families, tolerance};

/// Small shapes per GEMM config: one full tile and one with ragged edges.
pub fn gemm_shapes(cfg: &kda_kernels::gemm::GemmConfig) -> Vec<(usize, usize, usize)> {
    if cfg.aligned {
        vec![(cfg.bm, cfg.bn, 64), (cfg.bm + 24, cfg.bn / 2 + 8, 40)]
    } else {
        vec![(37, 29, 19)]
    }
}

/// One KDA row of the table: the worst of the output and state errors against the looser of their
/// bounds (each was held to its own), and on a failure why.
fn model_row(case: &str, err: f64, bound: f64, ok: bool, why: &str) {
    out!(
        "{case:<52} {err:>10.2e} {bound:>10.0e} {:>12}  {}",
        "-",
        if ok { "ok".to_string() } else { format!("FAIL{why}") }
    );
}

/// Runs the simulator checks and prints a table; returns the number of failures.
pub fn simulate_all() -> usize {
    out!("{:<52} {:>10} {:>10} {:>12}  result", "case (simulator)", "rel err", "bound", "instructions");
    let mut failures = 0;
    // Each sm_80 GEMM, again on sm_90a where it takes wgmma there, and the sm_90a GEMMs.
    let sm80 = kda_kernels::gemm_configs();
    let takes_wgmma = |cfg: &kda_kernels::gemm::GemmConfig| {
        kda_kernels::gemm::gemm(cfg)
            .map_err(|e| e.to_string())
            .and_then(|def| kda_kernels::check::takes_wgmma(&def, Target::Sm90a))
            .unwrap_or(true)
    };
    let gemms = sm80
        .iter()
        .map(|c| (c.clone(), Target::Sm80))
        .chain(sm80.iter().filter(|c| takes_wgmma(c)).map(|c| (c.clone(), Target::Sm90a)))
        .chain(kda_kernels::hopper_gemm_configs().into_iter().map(|c| (c, Target::Sm90a)));
    for (i, (cfg, target)) in gemms.enumerate() {
        let cfg = &cfg;
        for (j, (m, n, k)) in gemm_shapes(cfg).into_iter().enumerate() {
            match check_gemm(cfg, target, m, n, k, (i * 16 + j) as u64) {
                Ok(o) => {
                    let ok = o.passed();
                    failures += usize::from(!ok);
                    out!(
                        "{:<52} {:>10.2e} {:>10.0e} {:>12}  {}",
                        o.case,
                        o.rel_err,
                        o.bound,
                        o.instructions,
                        if ok { "ok" } else { "FAIL" }
                    );
                }
                Err(e) => {
                    failures += 1;
                    out!("{:<52} FAIL: {e}", format!("gemm/{} {target} {m}x{n}x{k}", cfg.key()));
                }
            }
        }
    }
    // Decode: one small call per config family (seeded like the decode_sim suite). The row's error
    // is the worst of output and state errors, its bound the looser of their bounds; each must
    // stay under its own, padding rows must be exactly zero.
    for (i, f) in decode_families().iter().enumerate() {
        let case = format!("decode/{}", f.name);
        match check_decode(&f.cfg, &(f.inputs)(&f.cfg, i as u64)) {
            Ok(c) => {
                let ((to, ts), state_err) = (tolerance(&f.cfg), c.pool_err.max(c.final_err));
                let ok = c.out_err <= to && state_err <= ts && c.nonzero_padding_rows == 0;
                failures += usize::from(!ok);
                let why = format!(
                    " (out {:.2e}/{to:.0e}, state {state_err:.2e}/{ts:.0e}, nonzero padding rows {})",
                    c.out_err, c.nonzero_padding_rows
                );
                model_row(&case, c.out_err.max(state_err), to.max(ts), ok, &why);
            }
            Err(e) => {
                failures += 1;
                out!("{case:<52} FAIL: {e}");
            }
        }
    }
    // Prefill: one small call per config family, against the f64 token recurrence.
    for (i, f) in kda_kernels::chunk_families::chunk_families().iter().enumerate() {
        let case = format!("chunk/{}", f.name);
        failures += chunk_row(&case, &f.cfg, kda_kernels::chunk_check::check_chunk(&f.cfg, &f.inputs(i as u64)));
    }
    // sm_90a: the families whose kernel takes wgmma there, again, the fused ones at the shape
    // the runtime takes on compute capability 9.0.
    for (i, f) in kda_kernels::chunk_families::chunk_families().iter().enumerate() {
        let cfg = f.cfg.clone().on_target(Target::Sm90a);
        let hopper = kda_kernels::chunk::chunk(&cfg)
            .map_err(|e| e.to_string())
            .and_then(|def| kda_kernels::check::takes_wgmma(&def, Target::Sm90a));
        match hopper {
            Ok(false) => {}
            Ok(true) => {
                let case = format!("chunk/{} {}", f.name, Target::Sm90a);
                let x = f.inputs(i as u64);
                failures += chunk_row(&case, &cfg, kda_kernels::chunk_check::check_chunk_on(&cfg, &x, Target::Sm90a));
            }
            Err(e) => {
                failures += 1;
                out!("{:<52} FAIL: {e}", format!("chunk/{} {}", f.name, Target::Sm90a));
            }
        }
    }
    // The two-kernel path against the fused kernel, bit for bit, on a dense and a varlen family.
    let families = kda_kernels::chunk_families::chunk_families();
    for (i, f) in families.iter().enumerate().filter(|(_, f)| {
        matches!(
            f.name,
            "dense_t37_initial_state"
                | "varlen_i64_f16_gva2_empty_and_one_token"
                | "softplus_gate_minus_20_to_never_decaying"
                | "beta_near_2_identical_keys"
                | "varlen_pool_softplus_raw_beta"
        )
    }) {
        let case = format!("chunk/{}_two_kernel_path", f.name);
        let chain = ChunkShape::PREPARED;
        failures += bits_row(&case, two_kernel_path_matches(&f.cfg, &f.inputs(i as u64), chain, 3));
    }
    // A producer warpgroup (four fill warps computing each chunk's factors a chunk ahead)
    // against the fused kernel without, bit for bit, on sm_80 and sm_90a, on two families; on
    // sm_90a two producer warpgroups taking turns (9.0's default for dense calls of 80 to 132
    // chains, `DefaultPath::HopperProducers`) on every family.
    let pairs = [
        (Target::Sm80, ChunkShape::FUSED, ChunkShape::PRODUCER, "producer_warpgroup"),
        (Target::Sm90a, ChunkShape::HOPPER, ChunkShape::HOPPER_PRODUCER, "producer_warpgroup"),
        (Target::Sm90a, ChunkShape::HOPPER, ChunkShape::HOPPER_TWO_PRODUCERS, "two_producer_warpgroups"),
    ];
    for (i, f) in families.iter().enumerate() {
        let sampled = matches!(f.name, "dense_t37_initial_state" | "varlen_pool_bf16_state_gva4_padding_empty");
        for (target, shape, producer, what) in pairs {
            if sampled || producer == ChunkShape::HOPPER_TWO_PRODUCERS {
                let case = format!("chunk/{}_{what} {target}", f.name);
                failures += bits_row(&case, shapes_match_on(&f.cfg, &f.inputs(i as u64), shape, producer, target));
            }
        }
    }
    // The exact split, every pass in the simulator, on the pool families (prefix caching
    // included) with segments of 16 tokens (every sequence past two chunks splits).
    for (i, f) in families.iter().enumerate().filter(|(_, f)| {
        matches!(
            f.name,
            "varlen_pool_bf16_state_gva4_padding_empty"
                | "varlen_pool_softplus_raw_beta"
                | "varlen_pool_prefix_checkpoints_e16"
                | "dense_bf16_pool_prefix_checkpoints_e64"
        )
    }) {
        let case = format!("chunk/{}_split_every_16", f.name);
        failures += chunk_row(&case, &f.cfg, kda_kernels::chunk_check::check_split(&f.cfg, &f.inputs(i as u64), 16));
        // Its fused passes on sm_90a, at the Hopper shape (`ChunkTuning::target`).
        if matches!(f.name, "varlen_pool_bf16_state_gva4_padding_empty" | "varlen_pool_prefix_checkpoints_e16") {
            let cfg = f.cfg.clone().on_target(Target::Sm90a);
            let case = format!("chunk/{}_split_every_16 {}", f.name, Target::Sm90a);
            let r = kda_kernels::chunk_check::check_split_on(&cfg, &f.inputs(i as u64), 16, Target::Sm90a);
            failures += chunk_row(&case, &cfg, r);
        }
    }
    match kda_kernels::selftest::selftests(3) {
        Ok(tests) => {
            for t in tests {
                let r = kda_kernels::check::simulate_selftest(&t).map(|got| t.error(&got));
                failures += usize::from(!matches!(r, Ok(e) if e <= 1e-6));
                match r {
                    Ok(e) => out!(
                        "{:<52} {e:>10.2e} {:>10.0e} {:>12}  {}",
                        t.name,
                        1e-6,
                        "-",
                        if e <= 1e-6 { "ok" } else { "FAIL" }
                    ),
                    Err(e) => out!("{:<52} FAIL: {e}", t.name),
                }
            }
        }
        Err(e) => {
            failures += 1;
            out!("dsl self-tests FAIL: {e}");
        }
    }
    failures
}

/// The exit status of `kda check --gpu` on a machine without a GPU.
pub const NO_GPU: i32 = 3;

pub fn run(args: &[String]) -> Result<i32, String> {
    use super::gpu_checks::Scale;
    let usage = "usage: kda check [--gpu [--quick] [--allow-no-gpu] [--no-simulator]]";
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if args.iter().any(|a| !matches!(a.as_str(), "--gpu" | "--quick" | "--allow-no-gpu" | "--no-simulator")) {
        return Err(usage.into());
    }
    let gpu = match (has("--gpu"), has("--quick")) {
        (false, false) if !has("--allow-no-gpu") && !has("--no-simulator") => None,
        (true, quick) => Some(if quick { Scale::Quick } else { Scale::Full }),
        _ => return Err(format!("--quick, --allow-no-gpu and --no-simulator go with --gpu; {usage}")),
    };
    if has("--no-simulator") && has("--allow-no-gpu") {
        return Err(format!("--no-simulator and --allow-no-gpu together would run nothing without a GPU; {usage}"));
    }
    // A GPU run that cannot run says so by its status before doing anything else, so that a
    // script (scripts/sanitize) cannot take "nothing ran" for "nothing failed".
    if gpu.is_some() && !kda_runtime::gpu_available() && !has("--allow-no-gpu") {
        out!("GPU checks not run: no CUDA driver (libcuda) or no device on this machine (--allow-no-gpu runs the simulator checks alone and exits 0)");
        return Ok(NO_GPU);
    }
    // The simulator's rows launch nothing: a compute-sanitizer run leaves them out.
    let mut failures = if has("--no-simulator") { 0 } else { simulate_all() };
    if let Some(scale) = gpu {
        failures += super::gpu_checks::gpu_checks(scale)?;
    }
    out!("{}", if failures == 0 { "all checks passed".to_string() } else { format!("{failures} check(s) FAILED") });
    Ok(i32::from(failures > 0))
}

/// Prints one prefill row of `kda check` from a simulated call's comparison with the f64
/// reference (within the config's tolerance, every output element written, no untouched state
/// slot changed); returns 1 on a failure.
fn chunk_row(case: &str, cfg: &ChunkConfig, compared: Result<kda_kernels::chunk_check::ChunkCompare, String>) -> usize {
    match compared {
        Ok(c) => {
            let (to, ts) = kda_kernels::chunk_check::tolerance(cfg);
            let ok = c.out_err <= to && c.state_err <= ts && c.bad_elements == 0 && c.untouched_changed == 0;
            let why = format!(
                " (out {:.2e}/{to:.0e}, state {:.2e}/{ts:.0e}, bad elements {}, untouched changed {})",
                c.out_err, c.state_err, c.bad_elements, c.untouched_changed
            );
            model_row(case, c.out_err.max(c.state_err), to.max(ts), ok, &why);
            usize::from(!ok)
        }
        Err(e) => {
            out!("{case:<52} FAIL: {e}");
            1
        }
    }
}

/// Prints a row comparing another path's bits with the fused kernel's (`same`, or why it could
/// not run); returns 1 if it failed.
fn bits_row(case: &str, same: Result<bool, String>) -> usize {
    match same {
        Ok(same) => {
            let verdict = if same { "ok (bit-identical to the fused kernel)" } else { "FAIL: bits differ" };
            out!("{case:<52} {:>10} {:>10} {:>12}  {verdict}", "-", "-", "-");
            usize::from(!same)
        }
        Err(e) => {
            out!("{case:<52} FAIL: {e}");
            1
        }
    }
}
