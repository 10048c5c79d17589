use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, N), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = shared([bx, 16], F32);
}
fn main() {}
