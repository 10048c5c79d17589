use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, idx: Global<(M,), I32>) {
    let n = idx[0];
    let (bx,) = launch(grid = [n], threads = 32);
}
fn main() {}
