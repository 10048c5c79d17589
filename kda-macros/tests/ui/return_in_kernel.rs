use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M,), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    return;
}
fn main() {}
