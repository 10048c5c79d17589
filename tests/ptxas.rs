//! Every shipped variant assembles with ptxas for sm_80 and sm_90, with no register spills.
//!
//! ptxas comes from `KDA_PTXAS`, `.cache/ptxas` (what `.ci/run` installs) or the PATH. Without
//! one the test says it skipped, unless `KDA_REQUIRE_PTXAS` is set (CI sets it): then it fails.

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

#[test]
fn every_variant_assembles_without_spills() {
    let Some(ptxas) = find_ptxas() else {
        assert!(std::env::var_os("KDA_REQUIRE_PTXAS").is_none(), "KDA_REQUIRE_PTXAS is set but no ptxas was found");
        eprintln!("skipped: no ptxas (set KDA_PTXAS, or run .ci/run once to install it into .cache/)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("kda-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = vec![];
    for v in kda_kernels::variants() {
        for t in Target::ALL {
            let k = kda_dsl::compile(v.build().expect("builds"), t).expect("compiles");
            let src = dir.join(format!("{}_{}.ptx", v.id().replace('/', "_"), t));
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
                failures.push(format!("{} {t}: ptxas failed:\n{log}", v.id()));
            } else if log
                .lines()
                .any(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads"))
            {
                failures.push(format!("{} {t}: register spills:\n{log}", v.id()));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
