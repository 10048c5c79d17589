//! The PTX of every variant `kda list` names, as insta snapshots, for the target it ships for
//! (sm_80, or sm_90a for the Hopper GEMMs; sm_90 differs only in its header, which
//! `ptx_header_per_target` pins). Review changes with `cargo insta review`.

use kda_dsl::Target;

#[test]
fn ptx_of_every_shipped_variant() {
    for v in kda_kernels::variants() {
        let def = v.build().unwrap_or_else(|e| panic!("{}: {e}", v.id()));
        let k = kda_dsl::compile(def, v.target).unwrap_or_else(|e| panic!("{}: {e}", v.id()));
        insta::assert_snapshot!(v.id().replace('/', "__"), k.ptx);
    }
}

#[test]
fn ptx_header_per_target() {
    let v = &kda_kernels::variants()[0];
    for (t, want) in [
        (Target::Sm80, ".version 7.0\n.target sm_80"),
        (Target::Sm90, ".version 7.8\n.target sm_90"),
        (Target::Sm90a, ".version 8.0\n.target sm_90a"),
    ] {
        let k = kda_dsl::compile(v.build().expect("builds"), t).expect("compiles");
        assert!(k.ptx.contains(want), "{t}: {}", &k.ptx[..200]);
        assert!(k.ptx.contains(".file 1 \"kda-kernels/src/gemm.rs\""), "the PTX points at the kernel source");
        assert!(k.ptx.contains("\n    .loc 1 "), "instructions carry .loc");
    }
}

#[test]
fn no_snapshot_outlives_its_variant() {
    let ids: Vec<String> =
        kda_kernels::variants().iter().map(|v| format!("ptx_snapshots__{}.snap", v.id().replace('/', "__"))).collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    for entry in std::fs::read_dir(dir).expect("snapshots folder") {
        let name = entry.expect("entry").file_name().to_string_lossy().to_string();
        if name.starts_with("ptx_snapshots__") && name.ends_with(".snap") && !name.starts_with("ptx_snapshots__ptx_") {
            assert!(ids.contains(&name), "{name} belongs to no shipped variant: delete it");
        }
    }
}

/// sm_90a changes only what its instructions change: every shipped variant's sm_90a PTX is its
/// sm_80 PTX (header aside) unless it takes `wgmma`, and then it has no `mma.sync` for the
/// `gemm`s that took it.
#[test]
fn sm_90a_ptx_differs_only_where_wgmma_is_taken() {
    let body = |ptx: &str| {
        ptx.lines().filter(|l| !l.starts_with(".version") && !l.starts_with(".target")).collect::<Vec<_>>().join("\n")
    };
    for v in kda_kernels::variants() {
        let build = || v.build().unwrap_or_else(|e| panic!("{}: {e}", v.id()));
        let sm80 = kda_dsl::compile(build(), Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", v.id())).ptx;
        let sm90a = kda_dsl::compile(build(), Target::Sm90a).unwrap_or_else(|e| panic!("{}: {e}", v.id())).ptx;
        eprintln!("{}: wgmma {}", v.id(), sm90a.contains("wgmma.mma_async"));
        if !sm90a.contains("wgmma.mma_async") {
            assert_eq!(body(&sm80), body(&sm90a), "{}", v.id());
        }
    }
}
