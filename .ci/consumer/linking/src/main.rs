//! Builds beside cudarc's `dynamic-linking`: both see one driver library.

fn main() {
    let available = kda::runtime::gpu_available();
    let devices = cudarc::driver::result::device::get_count().ok();
    println!("kda sees a GPU: {available}; cudarc counts {devices:?}");
}
