use kda_macros::kernel;
struct Cfg;
#[kernel]
fn k(cfg: &Cfg, a: Vec<f32>) {
    let (bx,) = launch(grid = [1], threads = 32);
}
fn main() {}
