// The main of a GPU test binary (`harness = false` in Cargo.toml; included with `include!`).

/// Runs `tests` as libtest would (names, filters, `--test-threads`, `--nocapture`), or on a
/// machine without a CUDA driver or device reports each one ignored, after saying why in the
/// run's normal output: a run counts the GPU tests it skipped instead of passing them.
/// `benchmarks` are ignored unless asked for (`--ignored`, or `--include-ignored`); `cpu` tests
/// of the binary run anywhere.
fn gpu_test_main(
    tests: &[(&'static str, fn())],
    benchmarks: &[(&'static str, fn())],
    cpu: &[(&'static str, fn())],
) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let gpu = kda_runtime::gpu_available();
    if !gpu && !tests.is_empty() {
        println!("{} GPU tests ignored: no CUDA driver (libcuda) or no device on this machine", tests.len());
    }
    let trial = |(name, f): &(&'static str, fn()), ignored: bool| {
        let f = *f;
        libtest_mimic::Trial::test(*name, move || {
            f();
            Ok(())
        })
        .with_ignored_flag(ignored)
    };
    let trials = tests
        .iter()
        .map(|t| trial(t, !gpu))
        .chain(benchmarks.iter().map(|t| trial(t, true)))
        .chain(cpu.iter().map(|t| trial(t, false)))
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
