// How every GPU test starts (included with `include!`): it skips, visibly, on a machine without
// a driver, and fails with the error's message otherwise.

/// True, after saying so, when this machine has no CUDA driver or device.
#[allow(dead_code)] // not every GPU test binary has a test that takes the skip itself
fn skip_without_gpu() -> bool {
    let none = !kda_runtime::gpu_available();
    if none {
        eprintln!("skipped: no CUDA driver (libcuda) on this machine");
    }
    none
}

/// Runs `test` on a GPU machine (skipping visibly elsewhere), panicking with its error.
#[allow(dead_code)] // not every GPU test binary runs a fallible body
fn on_gpu(test: impl FnOnce() -> Result<(), kda_runtime::RuntimeError>) {
    if skip_without_gpu() {
        return;
    }
    if let Err(e) = test() {
        panic!("{e}");
    }
}
