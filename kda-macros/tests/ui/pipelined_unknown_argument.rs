use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, K), BF16>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = shared([16, 16], BF16);
    for ko in pipelined(K, stages = 2, depth = 3) {
        copy(a.tile([0, ko], [16, 16]), s);
    }
}
fn main() {}
