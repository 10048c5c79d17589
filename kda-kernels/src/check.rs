//! Kernels through the block simulator against their f64 references, on small shapes.

use crate::gemm::{gemm, GemmConfig};
use crate::reference::*;
use kda_dsl::sim::{run, SimArg};
use kda_dsl::DType;

/// The outcome of one simulated check.
#[derive(Clone, Debug)]
pub struct CheckOutcome {
    /// What ran.
    pub case: String,
    /// Relative error against the reference.
    pub rel_err: f64,
    /// The bound it must stay under.
    pub bound: f64,
    /// Instructions simulated.
    pub instructions: u64,
}

impl CheckOutcome {
    /// True when within bound.
    pub fn passed(&self) -> bool {
        self.rel_err <= self.bound
    }
}

fn tol(out: DType) -> f64 {
    if out == DType::F32 {
        2e-3
    } else {
        1e-2
    }
}

/// Simulates one GEMM variant, compiled for `target`, at (m, n, k) on random inputs; the output
/// starts as NaN so an unwritten element fails.
pub fn check_gemm(
    cfg: &GemmConfig,
    target: kda_dsl::Target,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) -> Result<CheckOutcome, String> {
    let def = gemm(cfg).map_err(|e| e.to_string())?;
    let (_, prog) = kda_dsl::lower_kernel_for(def.clone(), target).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let a = rng.normals(m * k, cfg.dtype);
    let b = rng.normals(n * k, cfg.dtype);
    let (br, bc) = if cfg.b_transposed { (n, k) } else { (k, n) };
    let c = vec![f64::NAN; m * n];
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(to_bytes(&a, cfg.dtype))),
        ("M".to_string(), SimArg::I32(m as i32)),
        ("K".to_string(), SimArg::I32(k as i32)),
        ("b".to_string(), SimArg::Tensor(to_bytes(&b, cfg.dtype))),
        ("BR".to_string(), SimArg::I32(br as i32)),
        ("BC".to_string(), SimArg::I32(bc as i32)),
        ("c".to_string(), SimArg::Tensor(to_bytes(&c, cfg.out))),
        ("N".to_string(), SimArg::I32(n as i32)),
    ];
    let dims = |s: &str| match s {
        "M" => Some(m as i64),
        "N" => Some(n as i64),
        "K" => Some(k as i64),
        _ => None,
    };
    let grid = [0, 1, 2].map(|i| def.grid[i].eval(&dims).unwrap_or(1) as u32);
    let report = run(&prog, grid, &mut args).map_err(|e| e.to_string())?;
    let SimArg::Tensor(cb) = &args[6].1 else { unreachable!() };
    let got = from_bytes(cb, cfg.out);
    let want: Vec<f64> =
        gemm_f64(&a, &b, m, n, k, cfg.b_transposed).into_iter().map(|x| round_to(x, cfg.out)).collect();
    Ok(CheckOutcome {
        case: match target {
            kda_dsl::Target::Sm80 => format!("gemm/{} {m}x{n}x{k}", cfg.key()),
            t => format!("gemm/{} {t} {m}x{n}x{k}", cfg.key()),
        },
        rel_err: rel_err(&got, &want),
        bound: tol(cfg.out),
        instructions: report.instructions,
    })
}

/// Lowers `def` (for sm_80) and runs its whole grid in the simulator; extents come from the
/// `I32` arguments named after them. Tensors are updated in place in `args`.
pub fn simulate(
    def: &kda_dsl::tile::KernelDef,
    args: &mut [(String, SimArg)],
) -> Result<kda_dsl::sim::SimReport, String> {
    simulate_on(def, kda_dsl::Target::Sm80, args)
}

/// [`simulate`] with the instructions chosen for `target`.
pub fn simulate_on(
    def: &kda_dsl::tile::KernelDef,
    target: kda_dsl::Target,
    args: &mut [(String, SimArg)],
) -> Result<kda_dsl::sim::SimReport, String> {
    let (_, prog) = kda_dsl::lower_kernel_for(def.clone(), target).map_err(|e| e.to_string())?;
    let dims = |s: &str| {
        args.iter().find_map(|(n, a)| match a {
            SimArg::I32(v) if n == s => Some(*v as i64),
            _ => None,
        })
    };
    // What the runtime checks before a launch, the simulator checks too: the extents the
    // kernel assumes exact or multiples of a factor.
    for (p, v) in &def.exact_extents {
        let name = def.params[*p].name();
        if let Some(e) = dims(name).filter(|e| e != v) {
            return Err(format!("{name} = {e} where `{}` assumes {v}", def.name));
        }
    }
    for (p, m) in &def.assumptions {
        let name = def.params[*p].name();
        if let Some(e) = dims(name).filter(|e| e % i64::from(*m) != 0) {
            return Err(format!("{name} = {e} where `{}` assumes a multiple of {m}", def.name));
        }
    }
    let mut grid = [1u32; 3];
    for (i, g) in grid.iter_mut().enumerate() {
        *g = def.grid[i].eval(&dims).ok_or_else(|| format!("grid axis {i} needs an extent that was not given"))? as u32;
    }
    run(&prog, grid, args).map_err(|e| e.to_string())
}

/// Whether `def` compiled for `target` takes `wgmma` for any `gemm` (so its simulation there
/// differs from sm_80's).
pub fn takes_wgmma(def: &kda_dsl::tile::KernelDef, target: kda_dsl::Target) -> Result<bool, String> {
    let plans = kda_dsl::lower::plans(def.clone(), target).map_err(|e| e.to_string())?;
    Ok(plans.gemms.iter().any(|p| matches!(p, kda_dsl::lower::gemm_plan::GemmPlan::Wgmma(_))))
}

/// The tensor argument `name` decoded as `dtype`.
pub fn tensor_values(args: &[(String, SimArg)], name: &str, dtype: DType) -> Vec<f64> {
    args.iter()
        .find_map(|(n, a)| match a {
            SimArg::Tensor(b) if n == name => Some(from_bytes(b, dtype)),
            _ => None,
        })
        .unwrap_or_default()
}

/// How a simulated decode call compares with the f64 reference.
#[derive(Clone, Debug)]
pub struct DecodeCompare {
    /// Relative error of the outputs.
    pub out_err: f64,
    /// Relative error of the pool after the call.
    pub pool_err: f64,
    /// Relative error of the returned states (0 when none).
    pub final_err: f64,
    /// Output rows the reference has as exactly zero (padding) that were not exactly zero.
    pub nonzero_padding_rows: usize,
    /// What the simulator produced.
    pub got: crate::decode_ref::DecodeOutputs,
}

/// Runs one decode call in the simulator and compares it with [`crate::decode_ref::decode_ref`].
pub fn check_decode(
    cfg: &crate::decode::DecodeConfig,
    x: &crate::decode_ref::DecodeInputs,
) -> Result<DecodeCompare, String> {
    let got = simulate_decode(cfg, x)?;
    let want = crate::decode_ref::decode_ref(cfg, x);
    let d = crate::decode_ref::D;
    let nonzero_padding_rows = want
        .out
        .chunks(d)
        .zip(got.out.chunks(d))
        .filter(|(w, g)| w.iter().all(|v| *v == 0.0) && g.iter().any(|v| *v != 0.0))
        .count();
    Ok(DecodeCompare {
        out_err: rel_err(&got.out, &want.out),
        pool_err: rel_err(&got.pool, &want.pool),
        final_err: if want.final_state.is_empty() { 0.0 } else { rel_err(&got.final_state, &want.final_state) },
        nonzero_padding_rows,
        got,
    })
}

/// Runs one decode call in the simulator; outputs start as NaN.
pub fn simulate_decode(
    cfg: &crate::decode::DecodeConfig,
    x: &crate::decode_ref::DecodeInputs,
) -> Result<crate::decode_ref::DecodeOutputs, String> {
    use crate::decode_ref::D;
    let def = crate::decode::decode(cfg).map_err(|e| e.to_string())?;
    let n_seq = x.sequences(cfg);
    let fin_rows = x.final_rows(cfg);
    let dt = cfg.dtype;
    let st = cfg.state_dtype;
    let t = |n: &str, v: &[f64], d: DType| (n.to_string(), SimArg::Tensor(to_bytes(v, d)));
    let i = |n: &str, v: usize| (n.to_string(), SimArg::I32(v as i32));
    let small = |n: &str, d: DType| (n.to_string(), SimArg::Tensor(to_bytes(&[0.0; 4], d)));
    let mut args = vec![
        t("q", &x.q, dt),
        i("B", x.b),
        i("T", x.t),
        i("H", x.h),
        i("KD", D),
        t("k", &x.k, dt),
        t("v", &x.v, dt),
        i("HV", x.hv),
        i("VD", D),
        t("a", &x.a, dt),
        t("b", &x.beta, dt),
        i("BW", if cfg.beta_headwise { D } else { 1 }),
        i("S1", D),
        i("S2", D),
        t("state", &x.pool, st),
        i("P", x.slots),
        t("out", &vec![f64::NAN; x.b * x.t * x.hv * D], cfg.out_dtype),
        i("NSEQ", n_seq),
        // Several sequences per block, with a short last block when there are 4 (one per block
        // for configs whose tables hold one).
        i("ITEMS", n_seq.clamp(1, 3).min(cfg.shape.max_items)),
        ("scale".into(), SimArg::F32(x.scale as f32)),
        ("lower_bound".into(), SimArg::F32(x.lower_bound as f32)),
    ];
    args.push(if cfg.a_log { t("a_log", &x.a_log, DType::F32) } else { small("a_log", DType::F32) });
    args.push(i("HVA", if cfg.a_log { x.hv } else { 1 }));
    match cfg.dt_bias {
        Some(d) => args.extend([t("dt_bias", &x.dt_bias, d), i("HVD", x.hv), i("KDB", D)]),
        None => args.extend([small("dt_bias", DType::F32), i("HVD", 1), i("KDB", 1)]),
    }
    if fin_rows > 0 {
        args.extend([t("final_state", &vec![f64::NAN; fin_rows * x.hv * D * D], st), i("F", fin_rows)]);
    } else {
        args.extend([small("final_state", st), i("F", 0)]);
    }
    let idx: Vec<f64> = x.indices.iter().map(|v| *v as f64).collect();
    match cfg.indices {
        Some(d) => args.extend([t("state_indices", &idx, d), i("NI", n_seq), i("IC", x.cols)]),
        None => args.extend([small("state_indices", DType::I32), i("NI", 1), i("IC", 1)]),
    }
    let cu: Vec<f64> = x.cu_seqlens.iter().map(|v| *v as f64).collect();
    match cfg.varlen {
        Some(d) => args.extend([t("cu_seqlens", &cu, d), i("NC", cu.len())]),
        None => args.extend([small("cu_seqlens", DType::I32), i("NC", 1)]),
    }
    let nat: Vec<f64> = x.accepted.iter().map(|v| *v as f64).collect();
    match cfg.accepted {
        Some(d) => args.extend([t("accepted", &nat, d), i("NA", n_seq)]),
        None => args.extend([small("accepted", DType::I32), i("NA", 1)]),
    }
    simulate(&def, &mut args)?;
    Ok(crate::decode_ref::DecodeOutputs {
        out: tensor_values(&args, "out", cfg.out_dtype),
        pool: tensor_values(&args, "state", st),
        final_state: if fin_rows > 0 { tensor_values(&args, "final_state", st) } else { vec![] },
    })
}

/// Runs a self-test in the simulator; returns its outputs (in `outputs` order).
pub fn simulate_selftest(t: &crate::selftest::SelfTest) -> Result<Vec<Vec<f64>>, String> {
    let mut args = vec![];
    let mut dims = std::collections::BTreeMap::new();
    for p in &t.def.params {
        if let kda_dsl::tile::Param::Tensor { name, dims: d, .. } = p {
            let shape = t
                .inputs
                .iter()
                .map(|(n, s, _)| (n, s))
                .chain(t.outputs.iter().map(|(n, s, _)| (n, s)))
                .find(|(n, _)| **n == name.as_str())
                .map(|(_, s)| s.clone())
                .ok_or_else(|| format!("{}: no data for tensor `{name}`", t.name))?;
            for (k, di) in d.iter().enumerate() {
                dims.insert(t.def.params[*di].name().to_string(), shape[k]);
            }
        }
    }
    for (n, _, v) in &t.inputs {
        args.push((n.to_string(), SimArg::Tensor(to_bytes(v, DType::F32))));
    }
    for (n, s, _) in &t.outputs {
        args.push((n.to_string(), SimArg::Tensor(to_bytes(&vec![f64::NAN; s.iter().product()], DType::F32))));
    }
    for (n, v) in dims {
        args.push((n, SimArg::I32(v as i32)));
    }
    simulate_on(&t.def, t.target, &mut args)?;
    Ok(t.outputs.iter().map(|(n, _, _)| tensor_values(&args, n, DType::F32)).collect())
}
