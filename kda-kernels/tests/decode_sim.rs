//! The decode kernel through the simulator against the f64 reference, per config family.

use kda_dsl::DType;
use kda_kernels::check::check_decode;
use kda_kernels::decode::{DecodeConfig, Writes};
use kda_kernels::decode_ref::random_inputs;

#[test]
fn default_config_in_place_pool_with_padding_slot() {
    let cfg = DecodeConfig::default();
    let mut x = random_inputs(&cfg, 3, 1, 2, 2, 5, &[], 1);
    x.indices = vec![4, -1, 0];
    x.cols = 1;
    let c = check_decode(&cfg, &x).expect("simulates");
    eprintln!("out {:.2e} pool {:.2e} pad {}", c.out_err, c.pool_err, c.nonzero_padding_rows);
    assert!(c.out_err < 1e-2 && c.pool_err < 1e-4 && c.nonzero_padding_rows == 0, "{c:?}");
    let _ = (Writes::None, DType::F32);
}
