//! The PTX of every variant `kda list` names, as insta snapshots (sm_80; sm_90 differs only in
//! its header, which `ptx_header_per_target` pins). Review changes with `cargo insta review`.

use kda_dsl::Target;

#[test]
fn ptx_of_every_shipped_variant() {
    for v in kda_kernels::variants() {
        let def = v.build().unwrap_or_else(|e| panic!("{}: {e}", v.id()));
        let k = kda_dsl::compile(def, Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", v.id()));
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
