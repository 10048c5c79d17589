//! Builds on the engine's CUDA 13.0 bindings: kda forces no CUDA version of its own.

fn main() {
    let available = kda::runtime::gpu_available();
    println!("kda sees a GPU: {available}; cudarc's bindings: CUDA {}", cudarc::driver::sys::CUDA_VERSION);
}
