use kda_macros::kernel;
#[kernel]
fn k(a: Global<(M, N), F32>) {
    let (bx,) = launch(grid = [1], threads = 32);
}
fn main() {}
