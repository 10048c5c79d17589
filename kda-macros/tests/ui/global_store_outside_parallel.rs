use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, out: GlobalMut<(M, N), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    out[bx][0] = 1.0;
}
fn main() {}
