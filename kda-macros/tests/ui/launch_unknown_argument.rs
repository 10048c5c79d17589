use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, N), F32>) {
    let (bx,) = launch(grid = [1], warps = 4);
}
fn main() {}
