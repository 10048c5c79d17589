//! Prints the PTX of the default decode config with a launch shape: rows warps min_blocks [16: a bf16 state].
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|x| x.parse().expect("numbers")).collect();
    let mut cfg = kda_kernels::decode::DecodeConfig::default();
    if a.len() >= 3 {
        (cfg.shape.rows, cfg.shape.warps, cfg.shape.min_blocks) = (a[0], a[1], a[2]);
    }
    if a.len() == 4 && a[3] == 16 {
        cfg.state_dtype = kda_dsl::DType::BF16;
    }
    let k =
        kda_dsl::compile(kda_kernels::decode::decode(&cfg).expect("builds"), kda_dsl::Target::Sm80).expect("compiles");
    eprintln!("shared bytes: {}", k.shared_bytes);
    print!("{}", k.ptx);
}
