//! The GEMM through the simulator against the f64 reference, ragged edges included.

use kda_kernels::check::check_gemm;
use kda_kernels::gemm_configs;

#[test]
fn every_shipped_gemm_variant_matches_the_reference_in_the_simulator() {
    for (i, cfg) in gemm_configs().iter().enumerate() {
        // Aligned variants need K (and N) multiples of 8; unaligned ones take anything.
        let shapes: &[(usize, usize, usize)] = if cfg.aligned {
            &[(cfg.bm, cfg.bn, 64), (cfg.bm + 24, cfg.bn / 2 + 8, 40)]
        } else {
            &[(cfg.bm, cfg.bn, 32), (37, 29, 19)]
        };
        for (j, &(m, n, k)) in shapes.iter().enumerate() {
            let out = check_gemm(cfg, m, n, k, (i * 10 + j) as u64).unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
            eprintln!("{} rel_err {:.2e} ({} instructions)", out.case, out.rel_err, out.instructions);
            assert!(out.passed(), "{}: rel err {} over {}", out.case, out.rel_err, out.bound);
        }
    }
}
