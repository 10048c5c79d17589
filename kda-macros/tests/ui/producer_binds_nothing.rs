use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, K), BF16>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = shared([16, 16], BF16);
    let t = shared([16, 16], BF16);
    for ko in pipelined(0, K / 16, stages = 2) {
        copy(a.tile([0, ko], [16, 16]), s);
        for p in producer() {
            copy(s, t);
        }
    }
}
fn main() {}
