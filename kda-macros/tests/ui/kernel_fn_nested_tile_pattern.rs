use kda_macros::kernel_fn;
#[derive(Clone, Copy)]
struct Pair {
    a: kda_dsl::builder::Tile,
    b: (kda_dsl::builder::Tile, kda_dsl::builder::Tile),
}
#[kernel_fn]
fn step(Pair { a, b: (c, d) }: Pair) {
    clear(a);
}
fn main() {}
