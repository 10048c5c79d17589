use kda_macros::kernel;
struct Cfg;
#[derive(Clone, Copy)]
struct Pair {
    a: kda_dsl::builder::Tile,
    b: kda_dsl::builder::Tile,
}
#[kernel]
fn k(cfg: &Cfg, x: Global<(M,), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
    let s = shared([32], F32);
    let t = shared([32], F32);
    let p = Pair { a: s, b: t };
    copy(p, t);
}
fn main() {}
