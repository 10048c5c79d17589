use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: GlobalMut<(M,), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = fragment([32], F32);
    copy(s.streaming(), a.tile_at([0], [32]));
}
fn main() {}
