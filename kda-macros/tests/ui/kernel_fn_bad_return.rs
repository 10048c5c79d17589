use kda_macros::kernel_fn;
#[kernel_fn]
fn step(t: Tile) -> Tile {
    t
}
fn main() {}
