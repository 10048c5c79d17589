//! Every shipped variant and DSL self-test assembles with ptxas for sm_80, sm_90 and sm_90a, with no
//! register spills where it ships: an sm_80 variant for sm_80 and sm_90 (the PTX the driver
//! compiles for a Hopper part), an sm_90a one for sm_90a. An sm_80 variant compiled for sm_90a
//! (where its `gemm`s may take `wgmma`) must assemble; its spills are printed, not failed: that
//! form is not shipped. A shipped sm_90a variant must not have its `wgmma`s serialized (ptxas's
//! C7515, C7512, C7518), waits injected between them (C7517) nor a `setmaxnreg` ignored (C7507,
//! C7508).
//!
//! ptxas comes from `KDA_PTXAS`, `.cache/ptxas` (what `.ci/run` installs) or the PATH. Without
//! one the test is reported ignored, the reason in the run's output (a `harness = false` binary),
//! unless `KDA_REQUIRE_PTXAS` is set (CI sets it): then it fails.

use kda_dsl::Target;
use std::path::PathBuf;
use std::process::Command;

fn find_ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KDA_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/ptxas");
    if local.exists() {
        return Some(local);
    }
    Command::new("ptxas").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from("ptxas"))
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let ptxas = find_ptxas();
    let required = std::env::var_os("KDA_REQUIRE_PTXAS").is_some();
    if ptxas.is_none() && !required {
        println!("1 ptxas test ignored: no ptxas (set KDA_PTXAS, or run .ci/run once to install it into .cache/)");
    }
    let test = libtest_mimic::Trial::test("every_variant_assembles_without_spills", move || match ptxas {
        Some(p) => {
            every_variant_assembles_without_spills(p);
            Ok(())
        }
        None => Err("KDA_REQUIRE_PTXAS is set but no ptxas was found".into()),
    })
    .with_ignored_flag(find_ptxas().is_none() && !required);
    libtest_mimic::run(&args, vec![test]).exit()
}

fn every_variant_assembles_without_spills(ptxas: PathBuf) {
    let dir = std::env::temp_dir().join(format!("kda-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = vec![];
    // Every shipped variant, and the DSL self-tests `kda check --gpu` runs.
    let mut kernels: Vec<(String, kda_dsl::tile::KernelDef, Target)> =
        kda_kernels::variants().into_iter().map(|v| (v.id(), v.build().expect("builds"), v.target)).collect();
    kernels.extend(
        kda_kernels::selftest::selftests(1).expect("builds").into_iter().map(|t| (t.name.to_string(), t.def, t.target)),
    );
    // The sm_90a candidates `kda bench --sweep-gemm` times, held to what a shipped variant is.
    kernels.extend(kda_kernels::hopper_gemm_candidates().into_iter().map(|c| {
        let v = kda_kernels::hopper_gemm_variant(c);
        (format!("{} (sweep)", v.id()), v.build().expect("builds"), Target::Sm90a)
    }));
    // The sm_90a chain over a prepared workspace (`ChunkShape::HOPPER_PREPARED`), a tuning the
    // sweep times, held to the same.
    let hopper_chain = kda_kernels::chunk::ChunkConfig {
        shape: kda_kernels::chunk::ChunkShape::HOPPER_PREPARED,
        preparation: kda_kernels::chunk::Preparation::Workspace,
        ..Default::default()
    };
    kernels.push((
        format!("chunk/{} (sweep)", hopper_chain.key()),
        kda_kernels::chunk::chunk(&hopper_chain).expect("builds"),
        Target::Sm90a,
    ));
    // The fused kernel with a producer warpgroup computing its factors, on sm_80 and beside the
    // sm_90a fused kernel (with one and two producer warpgroups, their registers apart):
    // tunings the sweep times, held to the same.
    use kda_kernels::chunk::{ChunkConfig, ChunkShape};
    let producers = [
        (ChunkShape::PRODUCER, Target::Sm80),
        (ChunkShape::HOPPER_PRODUCER, Target::Sm90a),
        (ChunkShape::HOPPER_TWO_PRODUCERS, Target::Sm90a),
    ];
    for (shape, target) in producers {
        let cfg = ChunkConfig { shape, ..Default::default() };
        kernels.push((
            format!("chunk/{} (sweep)", cfg.key()),
            kda_kernels::chunk::chunk(&cfg).expect("builds"),
            target,
        ));
    }
    // Varlen, whose sequence is picked through shared memory before the chunk loop (there the
    // roles part): two producer warpgroups, their registers apart.
    let varlen = ChunkConfig {
        shape: ChunkShape::HOPPER_TWO_PRODUCERS,
        varlen: Some(kda_dsl::DType::I64),
        ..Default::default()
    };
    kernels.push((
        format!("chunk/{} (sweep)", varlen.key()),
        kda_kernels::chunk::chunk(&varlen).expect("builds"),
        Target::Sm90a,
    ));
    for (id, def, shipped) in &kernels {
        // A kernel launched in clusters has no form for a target without them.
        for t in Target::ALL.into_iter().filter(|t| def.cluster_blocks <= 1 || t.has(Target::Sm90)) {
            // Where it ships: sm_80 PTX also for sm_90, which the driver compiles it for.
            let ships = t == *shipped || (*shipped == Target::Sm80 && t == Target::Sm90);
            let k = kda_dsl::compile(def.clone(), t).expect("compiles");
            let src = dir.join(format!("{}_{}.ptx", id.replace('/', "_"), t));
            std::fs::write(&src, &k.ptx).expect("write ptx");
            let out = Command::new(&ptxas)
                .arg(format!("-arch={t}"))
                .arg("-v")
                .arg(&src)
                .arg("-o")
                .arg(src.with_extension("cubin"))
                .output()
                .expect("run ptxas");
            let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                failures.push(format!("{id} {t}: ptxas failed:\n{log}"));
            } else if ships && ["C7515", "C7512", "C7517", "C7518"].iter().any(|c| log.contains(c)) {
                // ptxas serialized the wgmmas (a non-wgmma instruction defines an accumulator
                // register inside their pipeline, registers ran short, or they sit on a path
                // it takes for divergent) or injected waits of its own between them: the
                // shipped form would lose their overlap.
                failures.push(format!("{id} {t}: wgmma serialized:\n{log}"));
            } else if ships && ["C7507", "C7508"].iter().any(|c| log.contains(c)) {
                // ptxas ignored a `setmaxnreg`: the register split would be dead code.
                failures.push(format!("{id} {t}: setmaxnreg ignored:\n{log}"));
            } else if log
                .lines()
                .any(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads"))
            {
                if ships {
                    failures.push(format!("{id} {t}: register spills:\n{log}"));
                } else {
                    println!("{id} {t} (not shipped): register spills:\n{log}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
