//! Correctness checks on the GPU against the f64 CPU reference.

use kda_dsl::DType;
use kda_dsl::Target;
use kda_kernels::reference::*;
use kda_runtime::gemm::gemm_on;
use kda_runtime::{gpu_available, DeviceTensor, Gpu, Kernels, RuntimeError};

/// One GEMM on the GPU at (m, n, k): random inputs, NaN-poisoned output, compared with the f64
/// reference on every element (or, past 2^27 multiply-adds, on 4096 sampled elements).
#[allow(clippy::too_many_arguments)] // the case, spelled out
pub fn gemm_on_gpu(
    gpu: &Gpu,
    kernels: &Kernels,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    out: DType,
    bt: bool,
    target: Target,
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
    gemm_on(gpu, kernels, &s, &da.view(), &db.view(), &dc.view(), bt, target)?;
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

/// How large the GPU conformance cases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Real shapes (GEMM up to 8192³, decode at B = 64, H = 32, prefill up to T = 32768).
    Full,
    /// Every kernel family at small and ragged shapes, for compute-sanitizer (`--quick`).
    Quick,
}

/// The GPU conformance table; returns the number of failures.
pub fn gpu_checks(scale: Scale) -> Result<usize, String> {
    if !gpu_available() {
        out!("GPU checks skipped: no CUDA driver (libcuda) or no device on this machine");
        return Ok(0);
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    out!("{:<52} {:>10} {:>10}  result   ({})", "case (GPU)", "rel err", "bound", gpu.name());
    let mut failures = 0;
    let full = [
        (512, 384, 256, DType::BF16, DType::F32, true),
        (1000, 777, 520, DType::BF16, DType::F32, false),
        (2048, 2048, 1024, DType::F16, DType::F16, true),
        (333, 1000, 77, DType::BF16, DType::BF16, true),
        (8192, 8192, 8192, DType::BF16, DType::F32, true),
    ];
    let quick = [
        (256, 128, 64, DType::BF16, DType::F32, true),
        (100, 77, 52, DType::BF16, DType::F32, false),
        (33, 100, 17, DType::F16, DType::F16, true),
    ];
    let cases: &[_] = if scale == Scale::Quick { &quick } else { &full };
    // The device's variants (sm_90a's on compute capability 9.0) and, there, the sm_80 ones too.
    let device_target = gpu.limits().target().map_err(|e| e.to_string())?;
    let targets: Vec<Target> =
        if device_target == Target::Sm80 { vec![Target::Sm80] } else { vec![device_target, Target::Sm80] };
    let runs = cases.iter().flat_map(|c| targets.iter().map(move |t| (*c, *t)));
    for (i, ((m, n, k, dt, out, bt), target)) in runs.enumerate() {
        let case = format!("gemm {dt}->{out} {} {m}x{n}x{k} {target}", if bt { "A·Bᵀ" } else { "A·B" });
        let bound = if out == DType::F32 { 1e-3 } else { 1e-2 };
        match gemm_on_gpu(&gpu, &kernels, m, n, k, dt, out, bt, target, 100 + i as u64) {
            Ok(e) => {
                let ok = e <= bound;
                failures += usize::from(!ok);
                out!("{case:<52} {e:>10.2e} {bound:>10.0e}  {}", if ok { "ok" } else { "FAIL" });
            }
            Err(e) => {
                failures += 1;
                out!("{case:<52} FAIL: {e}");
            }
        }
    }
    failures += decode_checks(&gpu, &kernels, scale);
    failures += super::chunk_gpu::chunk_checks(&gpu, &kernels, scale);
    failures += selftest_checks(&gpu, &kernels);
    Ok(failures)
}

/// Distinct random slots in `0..pool`.
fn distinct_slots(rng: &mut Rng, n: usize, pool: usize) -> Vec<i64> {
    let mut all: Vec<i64> = (0..pool as i64).collect();
    for i in (1..all.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

/// Relative error over the slots the reference changed (untouched slots would dilute it).
fn touched_err(before: &[f64], want: &[f64], got: &[f64], slot: usize) -> f64 {
    let (mut w, mut g) = (vec![], vec![]);
    for i in 0..want.len() / slot {
        let r = i * slot..(i + 1) * slot;
        if want[r.clone()] != before[r.clone()] {
            w.extend_from_slice(&want[r.clone()]);
            g.extend_from_slice(&got[r]);
        }
    }
    rel_err(&g, &w)
}

/// A decode case on the GPU: name, config, inputs, device pool slots, device slot of each
/// reference slot (identity when `None`).
type DecodeCase =
    (String, kda_kernels::decode::DecodeConfig, kda_kernels::decode_ref::DecodeInputs, usize, Option<Vec<usize>>);

/// The decode conformance cases at real shapes; returns the number of failures.
fn decode_checks(gpu: &Gpu, kernels: &Kernels, scale: Scale) -> usize {
    // Batch rows and heads (and pool slots) of the batched cases.
    let (bb, hh, slots) = if scale == Scale::Quick { (12, 4, 32) } else { (64, 32, 128) };
    use kda_kernels::decode::{DecodeConfig, Writes};
    use kda_kernels::decode_ref::{decode_ref, random_inputs, D};
    let d = DecodeConfig::default();
    let mut cases: Vec<DecodeCase> = vec![];
    let mut rng = Rng::new(99);
    for (hv, state) in [(32, DType::F32), (64, DType::F32), (32, DType::BF16)] {
        let cfg = DecodeConfig { state_dtype: state, ..d.clone() };
        let mut x = random_inputs(&cfg, bb, 1, hh, hv, slots, &[], rng.next_u64());
        x.indices = distinct_slots(&mut rng, bb, slots);
        x.indices[3] = -1;
        x.indices[10] = 1000;
        cases.push((format!("decode B={bb} H={hh} HV={hv} {state} pool, 2 padding slots"), cfg, x, slots, None));
    }
    {
        let cfg = DecodeConfig { accepted: Some(DType::I32), ..d.clone() };
        let mut x = random_inputs(&cfg, bb, 4, hh, hh, 4 * slots, &[], rng.next_u64());
        x.indices = distinct_slots(&mut rng, 4 * bb, 4 * slots);
        x.cols = 4;
        x.accepted = (0..bb).map(|_| 1 + (rng.next_u64() % 4) as i64).collect();
        cases.push((format!("decode spec T=4 B={bb} H={hh} HV={hh}, [B, 4] indices"), cfg, x, 4 * slots, None));
    }
    {
        let cfg = DecodeConfig {
            v_first: false,
            varlen: Some(DType::I64),
            indices: None,
            writes: Writes::FinalPerSequence,
            ..d.clone()
        };
        let lens: Vec<usize> = (0..16).map(|i| if i == 5 { 0 } else { 1 + (rng.next_u64() % 3) as usize }).collect();
        let x = random_inputs(&cfg, 1, 0, 16, 32, 16, &lens, rng.next_u64());
        cases.push(("decode varlen K-first 16 seqs (one empty), final states".into(), cfg, x, 16, None));
    }
    if scale == Scale::Full {
        // Slots past 2^31 elements: slot stride is 8 * 128 * 128 = 2^17 elements.
        let cfg = d.clone();
        let mut x = random_inputs(&cfg, 4, 1, 4, 8, 8, &[], rng.next_u64());
        x.indices = distinct_slots(&mut rng, 4, 8);
        let map: Vec<usize> = (0..8).map(|i| 16_390 + 3 * i).collect();
        cases.push(("decode pool offsets past 2^31 elements (16414 slots)".into(), cfg, x, 16_420, Some(map)));
    }
    let mut failures = 0;
    let s = gpu.default_stream();
    for (name, cfg, x, device_slots, map) in cases {
        let (bo, bs) = if cfg.out_dtype == DType::F32 {
            (1e-4, 1e-4)
        } else {
            (1e-2, if cfg.state_dtype == DType::F32 { 1e-4 } else { 1e-2 })
        };
        let r = super::decode_gpu::upload_case(gpu, &s, &cfg, &x, device_slots, map)
            .map_err(|e| e.to_string())
            .and_then(|t| super::decode_gpu::run_on_gpu(gpu, kernels, &s, &cfg, &x, &t));
        match r {
            Ok(got) => {
                let want = decode_ref(&cfg, &x);
                let oe = rel_err(&got.out, &want.out);
                let pe = touched_err(&x.pool, &want.pool, &got.pool, x.hv * D * D);
                let fe = if want.final_state.is_empty() { 0.0 } else { rel_err(&got.final_state, &want.final_state) };
                let pad_ok = want
                    .out
                    .chunks(D)
                    .zip(got.out.chunks(D))
                    .all(|(w, g)| w.iter().any(|v| *v != 0.0) || g.iter().all(|v| *v == 0.0));
                let ok = oe <= bo && pe <= bs && fe <= bs && pad_ok;
                failures += usize::from(!ok);
                out!(
                    "{name:<52} {:>10.2e} {bo:>10.0e}  {}   (state {pe:.2e}, final {fe:.2e}{})",
                    oe,
                    if ok { "ok" } else { "FAIL" },
                    if pad_ok { "" } else { ", padding rows not zero" }
                );
            }
            Err(e) => {
                failures += 1;
                out!("{name:<52} FAIL: {e}");
            }
        }
    }
    failures
}

/// The DSL self-test kernels on the GPU, against the same references as in the simulator.
fn selftest_checks(gpu: &Gpu, kernels: &Kernels) -> usize {
    let tests = match kda_kernels::selftest::selftests(4) {
        Ok(t) => t,
        Err(e) => {
            out!("dsl self-tests FAIL: {e}");
            return 1;
        }
    };
    let mut failures = 0;
    let device = gpu.limits().target();
    for t in tests {
        if !device.as_ref().is_ok_and(|d| d.has(t.target)) {
            out!("{:<52} skipped: {} PTX does not run on this GPU", t.name, t.target);
            continue;
        }
        let r = (|| -> Result<f64, RuntimeError> {
            let s = gpu.default_stream();
            let compiled = kda_dsl::compile(t.def.clone(), t.target)
                .map_err(|e| RuntimeError::Unsupported(format!("{}: {e}", t.name)))?;
            let mut tensors = vec![];
            for (n, shape, v) in &t.inputs {
                let data: Vec<f32> = v.iter().map(|x| *x as f32).collect();
                tensors.push((*n, DeviceTensor::from_f32(gpu, &s, shape, DType::F32, &data)?));
            }
            for (n, shape, _) in &t.outputs {
                let mut o = DeviceTensor::zeros(gpu, &s, shape, DType::F32)?;
                o.fill_nan(&s)?;
                tensors.push((*n, o));
            }
            let args: Vec<(&str, kda_runtime::KernelArg)> =
                tensors.iter().map(|(n, d)| (*n, kda_runtime::KernelArg::Tensor(d.view()))).collect();
            kda_runtime::launch(gpu, &kernels.modules, &s, &compiled, t.name, &args)?;
            let mut got = vec![];
            for (n, _, _) in &t.outputs {
                let d = &tensors.iter().find(|(m, _)| m == n).expect("allocated above").1;
                got.push(d.to_f32_vec(&s)?.into_iter().map(f64::from).collect::<Vec<_>>());
            }
            Ok(t.error(&got))
        })();
        match r {
            Ok(e) => {
                let ok = e <= 1e-5;
                failures += usize::from(!ok);
                out!("{:<52} {e:>10.2e} {:>10.0e}  {}", t.name, 1e-5, if ok { "ok" } else { "FAIL" });
            }
            Err(e) => {
                failures += 1;
                out!("{:<52} FAIL: {e}", t.name);
            }
        }
    }
    failures
}
