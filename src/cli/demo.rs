//! `kda demo`, the main job: on a GPU, run the kernels at real shapes and check them against the
//! CPU reference; without one, say so, compile every shipped variant for every target, and run
//! the simulator checks.

use kda_dsl::Target;

pub fn run(args: &[String]) -> Result<i32, String> {
    if let Some(a) = args.first() {
        return Err(format!("`demo` takes no arguments (got `{a}`)"));
    }
    if kda_runtime::gpu_available() {
        let failures = super::gpu_checks::gpu_checks(super::gpu_checks::Scale::Full)?;
        let gpu = kda_runtime::Gpu::new(0).map_err(|e| e.to_string())?;
        let kernels = kda_runtime::Kernels::new();
        let target = gpu.limits().target().map_err(|e| e.to_string())?;
        let ms = super::bench::time_gemm(&gpu, &kernels, 8192, 8192, 8192, true, target)?.ms;
        let tflops = 2.0 * 8192f64.powi(3) / (ms as f64 * 1e-3) / 1e12;
        out!("gemm bf16 8192^3 A·Bᵀ ({target}): {ms:.3} ms, {tflops:.1} TFLOP/s");
        for case in super::chunk_gpu::prefill_cases().iter().filter(|c| c.name == "prefill_b8_t4096_h32") {
            let r = super::chunk_gpu::time_prefill(
                &gpu,
                &kernels,
                case,
                None,
                super::chunk_gpu::WorkspaceSource::Kept,
                super::chunk_gpu::ResultBits::Skip,
            )?;
            out!(
                "chunk_kda B=8 T=4096 H=32 bf16: {:.3} ms, {:.1} M tokens/s (first call {:.2} s)",
                r.ms,
                r.tokens as f64 / r.ms as f64 / 1e3,
                r.first_call_s
            );
        }
        out!("{}", if failures == 0 { "demo: all GPU checks passed" } else { "demo: GPU checks FAILED" });
        return Ok(i32::from(failures > 0));
    }
    out!("no GPU here (no CUDA driver or device): compiling every variant and running the simulator checks instead");
    let mut n = 0;
    for v in kda_kernels::variants() {
        let def = v.build().map_err(|e| format!("{}: {e}", v.id()))?;
        for t in Target::ALL {
            let k = kda_dsl::compile(def.clone(), t).map_err(|e| format!("{} ({t}): {e}", v.id()))?;
            n += 1;
            let _ = k;
        }
    }
    out!("compiled {n} kernels ({} variants x {} targets)", n / Target::ALL.len(), Target::ALL.len());
    let failures = super::check::simulate_all();
    out!(
        "{}",
        if failures == 0 {
            "demo: all simulator checks passed".to_string()
        } else {
            format!("demo: {failures} check(s) FAILED")
        }
    );
    Ok(i32::from(failures > 0))
}
