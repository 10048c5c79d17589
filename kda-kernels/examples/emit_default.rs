//! Prints the PTX of a GEMM config: `emit_default [bm bn bk stages threads]`.
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|x| x.parse().expect("numbers")).collect();
    let mut cfg = kda_kernels::gemm::GemmConfig::default();
    if a.len() == 5 {
        (cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.threads) = (a[0], a[1], a[2], a[3], a[4]);
    }
    let k = kda_dsl::compile(kda_kernels::gemm::gemm(&cfg).expect("builds"), kda_dsl::Target::Sm80).expect("compiles");
    print!("{}", k.ptx);
}
