//! The `kda` tool's commands, run as a user would.

use std::process::Command;

fn kda(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_kda")).args(args).output().expect("runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn list_names_every_variant_and_one_default_per_family() {
    let (code, out, _) = kda(&["list"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), kda_kernels::variants().len());
    for family in ["gemm", "decode", "chunk", "chunk_prep"] {
        let defaults =
            out.lines().filter(|l| l.split_whitespace().next() == Some(family) && l.ends_with("(default)")).count();
        assert_eq!(defaults, 1, "{family}: {out}");
    }
}

/// `kda emit chunk` prints the default prefill variant: the state recurrence on tensor cores,
/// with no atomics (its results are bit-identical across runs and batch compositions).
#[test]
fn emit_chunk_prints_the_default_prefill_variant() {
    let (code, out, _) = kda(&["emit", "chunk"]);
    assert_eq!(code, 0);
    let v = kda_kernels::variants().into_iter().find(|v| v.family == "chunk" && v.default).expect("a default");
    let (_, named, _) = kda(&["emit", "chunk", &v.name]);
    assert_eq!(out, named);
    assert!(out.contains(".entry chunk(") && out.contains("mma.sync.aligned.m16n8k16") && out.contains("cp.async"));
    for v in kda_kernels::variants().into_iter().filter(|v| v.family.starts_with("chunk")) {
        let (_, ptx, _) = kda(&["emit", v.family, &v.name]);
        let atomic = ptx.lines().any(|l| {
            // The opcode, after an optional guard (`@%p1 atom.add...`).
            let op = l.split_whitespace().find(|w| !w.starts_with('@')).unwrap_or("");
            op.starts_with("atom.") || op.starts_with("red.")
        });
        assert!(!atomic, "{}: an atomic", v.name);
    }
}

#[test]
fn emit_without_a_config_prints_the_default_variant() {
    let (code, out, _) = kda(&["emit", "gemm"]);
    assert_eq!(code, 0);
    let v = kda_kernels::variants().into_iter().find(|v| v.default).expect("a default");
    let (code2, out2, _) = kda(&["emit", "gemm", &v.name, "--target", "sm_80"]);
    assert_eq!(code2, 0);
    assert_eq!(out, out2);
    assert!(
        out.contains(".entry gemm(")
            && out.contains("mma.sync.aligned.m16n8k16")
            && out.contains("ldmatrix")
            && out.contains("cp.async")
    );
    let (_, sm90, _) = kda(&["emit", "gemm", "--target", "sm_90"]);
    assert!(sm90.contains(".target sm_90"));
    let (code, sm90a, _) = kda(&["emit", "gemm", "--target", "sm_90a"]);
    assert_eq!(code, 0);
    assert!(sm90a.contains(".version 8.0\n.target sm_90a"), "{}", &sm90a[..200]);
}

#[test]
fn emit_and_unknown_commands_fail_with_a_clear_message() {
    let (code, _, err) = kda(&["emit", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("no kernel family `nope`"), "{err}");
    let (code, _, err) = kda(&["emit", "gemm", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("has no config `nope`"), "{err}");
    let (code, _, err) = kda(&["emit", "gemm", "--target", "sm_70"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown target `sm_70`"), "{err}");
    let (code, _, err) = kda(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown command"), "{err}");
    // A malformed sweep shape is refused before any GPU work, naming the expected form.
    for bad in [
        &["bench", "--sweep-decode", "32x2"][..],
        &["bench", "--sweep-decode", "--case"],
        &["bench", "-x"],
        &["bench", "--case"],
        &["bench", "--json", "a", "--json", "b"],
    ] {
        let (code, _, err) = kda(bad);
        assert_eq!(code, 2, "{bad:?}");
        assert!(err.contains("ROWSxWARPSxMIN_BLOCKSxSTAGES"), "{bad:?}: {err}");
    }
}

#[test]
fn check_runs_every_family_in_the_simulator() {
    let (code, out, _) = kda(&["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("all checks passed"));
    assert!(out.lines().filter(|l| l.starts_with("gemm/")).count() >= kda_kernels::gemm_configs().len());
}

#[test]
fn emit_into_a_reader_that_stops_early_exits_cleanly() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kda"))
        .args(["emit", "decode"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let mut head = [0u8; 64];
    child.stdout.take().expect("piped").read_exact(&mut head).expect("the first bytes");
    // The pipe's read end is closed here, with most of the PTX not yet written.
    let out = child.wait_with_output().expect("exits");
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_command_takes_help_and_the_tool_its_version() {
    for cmd in ["list", "emit", "check", "bench", "conflicts", "demo"] {
        for flag in ["--help", "-h"] {
            let (code, out, err) = kda(&[cmd, flag]);
            assert_eq!(code, 0, "kda {cmd} {flag}: {err}");
            assert!(out.starts_with(&format!("usage: kda {cmd}")), "kda {cmd} {flag}: {out}");
        }
    }
    let (code, out, _) = kda(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--version"), "{out}");
    for flag in ["--version", "-V"] {
        let (code, out, _) = kda(&[flag]);
        assert_eq!(code, 0);
        assert_eq!(out.trim(), format!("kda {}", env!("CARGO_PKG_VERSION")));
    }
}

/// `kda emit chunk --shape` prints the kernel a `--sweep-chunk` row times: the split key products
/// (the default's) load a warp's 8 columns with `ldmatrix.x2`, the replicated ones do not; `h`
/// compiles for sm_90a, `m` puts the narrow products on `mma.sync` beside the update's `wgmma`.
/// Other families refuse it.
#[test]
fn emit_takes_a_sweep_shape_for_chunk() {
    let (code, split, err) = kda(&["emit", "chunk", "--shape", "4x2w32ik"]);
    assert_eq!(code, 0, "{err}");
    assert!(split.contains("ldmatrix.sync.aligned.m8n8.x2.shared.b16"), "no ldmatrix.x2");
    let (_, default, _) = kda(&["emit", "chunk"]);
    assert_eq!(default, split, "the default is the split key products' shape");
    let (code, replicated, err) = kda(&["emit", "chunk", "--shape", "4x2w32i"]);
    assert_eq!(code, 0, "{err}");
    assert!(!replicated.contains(".x2.shared"));
    let (code, hopper, err) = kda(&["emit", "chunk", "--shape", "4x2w32ihm"]);
    assert_eq!(code, 0, "{err}");
    assert!(hopper.contains(".target sm_90a") && hopper.contains("wgmma.mma_async") && hopper.contains("mma.sync"));
    let (code, _, err) = kda(&["emit", "gemm", "--shape", "4x2"]);
    assert!(code == 2 && err.contains("--shape applies to `chunk`"), "{err}");
    let (code, _, err) = kda(&["emit", "chunk", "--shape"]);
    assert!(code == 2 && err.contains("--shape needs"), "{err}");
}

/// `kda conflicts` counts the prefill kernel's shared-memory wavefronts per source line in the
/// simulator, on either target and either path, or at a sweep shape (two producer warpgroups on
/// sm_90a, named in its first line); an unknown family or argument is refused.
#[test]
fn conflicts_counts_wavefronts_per_line() {
    let runs = [
        &["conflicts"][..],
        &["conflicts", "pool", "--target", "sm_90a"],
        &["conflicts", "--prepared"],
        &["conflicts", "dense", "--shape", "4x1x5w32f8g128ihmk"],
    ];
    for args in runs {
        let (code, out, err) = kda(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("chunk/") && lines[1].starts_with("line"), "{out}");
        assert!(lines.iter().any(|l| l.starts_with("chunk.rs:") && l.contains("ldmatrix")), "{out}");
        assert!(lines.last().is_some_and(|l| l.starts_with("all: ")), "{out}");
        if args.contains(&"--shape") {
            assert!(lines[0].contains("_fw8_pr128_") && lines[0].contains("sm_90a"), "{out}");
        }
    }
    let (code, _, err) = kda(&["conflicts", "nosuchfamily"]);
    assert!(code == 2 && err.contains("nosuchfamily"), "{err}");
    for args in
        [&["conflicts", "a", "b"][..], &["conflicts", "--shape"], &["conflicts", "--prepared", "--shape", "8x2"]]
    {
        let (code, _, err) = kda(args);
        assert!(code == 2 && err.contains("usage: kda conflicts"), "{args:?}: {err}");
    }
}

#[test]
fn check_on_the_gpu_without_one_runs_nothing_and_says_so_by_its_status() {
    if kda_runtime::gpu_available() {
        eprintln!("skipped: this machine has a GPU, so `kda check --gpu` would run");
        return;
    }
    let (code, out, _) = kda(&["check", "--gpu", "--quick"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("GPU checks not run"), "{out}");
    for bad in [
        &["check", "--quick"][..],
        &["check", "--allow-no-gpu"],
        &["check", "--no-simulator"],
        &["check", "--gpu", "--no-simulator", "--allow-no-gpu"],
        &["check", "--gpu", "x"],
    ] {
        let (code, _, err) = kda(bad);
        assert_eq!(code, 2, "{bad:?}");
        assert!(err.contains("usage: kda check"), "{bad:?}: {err}");
    }
}
