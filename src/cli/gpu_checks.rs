//! Correctness checks on the GPU against the f64 CPU reference.

use kda_dsl::DType;
use kda_kernels::reference::*;
use kda_runtime::{gemm, gpu_available, DeviceTensor, Gpu, Kernels, RuntimeError};

/// One GEMM on the GPU at (m, n, k): random inputs, NaN-poisoned output, compared with the f64
/// reference on every element (or, past 2^27 multiply-adds, on 4096 sampled elements).
pub fn gemm_on_gpu(
    gpu: &Gpu,
    kernels: &Kernels,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    out: DType,
    bt: bool,
    seed: u64,
) -> Result<f64, RuntimeError> {
    let s = gpu.default_stream();
    let mut rng = Rng::new(seed);
    let a = rng.normals(m * k, dtype);
    let b = rng.normals(n * k, dtype);
    let to32 = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<_>>();
    let da = DeviceTensor::from_f32(gpu, &s, &[m, k], dtype, &to32(&a))?;
    let bshape = if bt { [n, k] } else { [k, n] };
    let db = DeviceTensor::from_f32(gpu, &s, &bshape, dtype, &to32(&b))?;
    let mut dc = DeviceTensor::zeros(gpu, &s, &[m, n], out)?;
    dc.fill_nan(&s)?;
    gemm(gpu, kernels, &s, &da.view(), &db.view(), &dc.view(), bt)?;
    let got = dc.to_f32_vec(&s)?;
    let elem = |i: usize, j: usize| -> f64 {
        let mut acc = 0.0;
        for p in 0..k {
            acc += a[i * k + p] * if bt { b[j * k + p] } else { b[p * n + j] };
        }
        round_to(acc, out)
    };
    let (mut gv, mut rv) = (vec![], vec![]);
    if (m * n * k) as u64 <= 1 << 27 {
        for i in 0..m {
            for j in 0..n {
                gv.push(got[i * n + j] as f64);
                rv.push(elem(i, j));
            }
        }
        // Every element: NaN anywhere (an unwritten element) fails through rel_err.
    } else {
        if got.iter().any(|x| x.is_nan()) {
            return Ok(f64::INFINITY);
        }
        for _ in 0..4096 {
            let (i, j) = ((rng.next_u64() % m as u64) as usize, (rng.next_u64() % n as u64) as usize);
            gv.push(got[i * n + j] as f64);
            rv.push(elem(i, j));
        }
    }
    Ok(rel_err(&gv, &rv))
}

/// The GPU conformance table; returns the number of failures.
pub fn gpu_checks() -> Result<usize, String> {
    if !gpu_available() {
        println!("GPU checks skipped: no CUDA driver (libcuda) or no device on this machine");
        return Ok(0);
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    println!("{:<52} {:>10} {:>10}  result   ({})", "case (GPU)", "rel err", "bound", gpu.name());
    let mut failures = 0;
    let cases = [
        (512, 384, 256, DType::BF16, DType::F32, true),
        (1000, 777, 520, DType::BF16, DType::F32, false),
        (2048, 2048, 1024, DType::F16, DType::F16, true),
        (333, 1000, 77, DType::BF16, DType::BF16, true),
        (8192, 8192, 8192, DType::BF16, DType::F32, true),
    ];
    for (i, (m, n, k, dt, out, bt)) in cases.into_iter().enumerate() {
        let case = format!("gemm {dt}->{out} {} {m}x{n}x{k}", if bt { "A·Bᵀ" } else { "A·B" });
        let bound = if out == DType::F32 { 1e-3 } else { 1e-2 };
        match gemm_on_gpu(&gpu, &kernels, m, n, k, dt, out, bt, 100 + i as u64) {
            Ok(e) => {
                let ok = e <= bound;
                failures += usize::from(!ok);
                println!("{case:<52} {e:>10.2e} {bound:>10.0e}  {}", if ok { "ok" } else { "FAIL" });
            }
            Err(e) => {
                failures += 1;
                println!("{case:<52} FAIL: {e}");
            }
        }
    }
    Ok(failures)
}
