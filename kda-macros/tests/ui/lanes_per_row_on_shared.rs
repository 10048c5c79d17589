use kda_macros::kernel;

struct Cfg;

#[kernel]
fn k(_cfg: &Cfg, x: Global<(M, N), F32>) {
    let (_bx,) = launch(grid = [1], threads = 32);
    let s = shared([16, 128], F32, lanes_per_row = 32);
    copy(x.tile([0, 0], [16, 128]), s);
}

fn main() {}
