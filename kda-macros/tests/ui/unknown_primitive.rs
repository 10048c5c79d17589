use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, N), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = shared([16, 16], F32);
    frobnicate(s, bx);
}
fn main() {}
