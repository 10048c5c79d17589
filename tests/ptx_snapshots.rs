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
    for (t, want) in [(Target::Sm80, ".version 7.0\n.target sm_80"), (Target::Sm90, ".version 7.8\n.target sm_90")] {
        let k = kda_dsl::compile(v.build().expect("builds"), t).expect("compiles");
        assert!(k.ptx.contains(want), "{t}: {}", &k.ptx[..200]);
        assert!(k.ptx.contains(".file 1 \"kda-kernels/src/gemm.rs\""), "the PTX points at the kernel source");
        assert!(k.ptx.contains("\n    .loc 1 "), "instructions carry .loc");
    }
}
