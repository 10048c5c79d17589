use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Global<(M, K), BF16>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let b_s = shared([16, 16], BF16);
    let acc = fragment([16, 16], F32);
    gemm(a, b_s, acc);
}
fn main() {}
