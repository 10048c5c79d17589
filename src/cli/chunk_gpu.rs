//! Prefill (`chunk_kda`) on the GPU: uploading a case, the call through the validated API,
//! comparing with the f64 reference, and the bench rows.

use std::time::Instant;

use kda_dsl::{DType, Target};
use kda_kernels::chunk::{ChunkConfig, ChunkOperands, ChunkStates, PrefixCaching};
use kda_kernels::chunk_check::{compare_chunk, tolerance};
use kda_kernels::chunk_ref::{
    chunk_reference, ChunkInputs, ChunkOutputs, ChunkSpec, GateSpec, InitialSpec, Lengths, PrefixSpec,
};
use kda_kernels::reference::{from_bytes, to_bytes, Rng};
use kda_runtime::chunk::{
    chunk_kda, chunk_kda_tuned, chunk_tuned_config, chunk_tuned_workspace_bytes, chunk_workspace_bytes, plan_chunk,
    ChainSms, ChunkArgs, ChunkShape, ChunkTuning,
};
use kda_runtime::{median, time_ms, CudaStream, DeviceTensor, Gpu, Kernels, RuntimeError, TensorView};

use kda_kernels::decode_ref::D;

/// A chunk case's tensors on the device.
pub struct ChunkTensors {
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    g: DeviceTensor,
    beta: DeviceTensor,
    a_log: Option<DeviceTensor>,
    dt_bias: Option<DeviceTensor>,
    initial: Option<DeviceTensor>,
    indices: Option<DeviceTensor>,
    read: Option<DeviceTensor>,
    has_initial: Option<DeviceTensor>,
    cu: Option<DeviceTensor>,
    prefix_lens: Option<DeviceTensor>,
    checkpoint_slots: Option<DeviceTensor>,
    checkpoints: Option<DeviceTensor>,
    out: DeviceTensor,
    fin: Option<DeviceTensor>,
}

fn dev(gpu: &Gpu, s: &CudaStream, shape: &[usize], d: DType, v: &[f64]) -> Result<DeviceTensor, RuntimeError> {
    DeviceTensor::from_bytes(gpu, s, shape, d, &to_bytes(v, d))
}

fn ints(v: &[i64]) -> Vec<f64> {
    v.iter().map(|x| *x as f64).collect()
}

/// Uploads a case for `cfg`; the output and final states start as NaN.
pub fn upload_chunk(
    gpu: &Gpu,
    s: &CudaStream,
    cfg: &ChunkConfig,
    x: &ChunkInputs,
) -> Result<ChunkTensors, RuntimeError> {
    let dt = cfg.dtype;
    let (b, t, h, hv, n) = (x.b, x.t, x.h, x.hv, x.sequences());
    let opt =
        |v: &Option<Vec<f64>>, shape: &[usize], d: DType| v.as_ref().map(|v| dev(gpu, s, shape, d, v)).transpose();
    let opt_i = |v: &Option<Vec<i64>>, shape: &[usize], d: DType| {
        v.as_ref().map(|v| dev(gpu, s, shape, d, &ints(v))).transpose()
    };
    let (idx_dt, has_dt) = match cfg.states {
        ChunkStates::Pool { indices, has_initial } => (Some(indices), has_initial),
        _ => (None, None),
    };
    let initial = match cfg.states {
        ChunkStates::Zeros { .. } => None,
        _ => opt(&x.initial, &[x.pool_slots(), hv, D, D], cfg.state_dtype)?,
    };
    let store_final =
        matches!(cfg.states, ChunkStates::Zeros { store_final: true } | ChunkStates::PerSequence { store_final: true });
    let fin = if store_final {
        let mut f = DeviceTensor::zeros(gpu, s, &[n, hv, D, D], cfg.state_dtype)?;
        f.fill_nan(s)?;
        Some(f)
    } else {
        None
    };
    let mut out = DeviceTensor::zeros(gpu, s, &[b, t, hv, D], dt)?;
    out.fill_nan(s)?;
    Ok(ChunkTensors {
        q: dev(gpu, s, &[b, t, h, D], dt, &x.q)?,
        k: dev(gpu, s, &[b, t, h, D], dt, &x.k)?,
        v: dev(gpu, s, &[b, t, hv, D], dt, &x.v)?,
        g: dev(gpu, s, &[b, t, hv, D], dt, &x.g)?,
        beta: dev(gpu, s, &[b, t, hv], dt, &x.beta)?,
        a_log: opt(&x.a_log, &[hv], DType::F32)?,
        dt_bias: opt(&x.dt_bias, &[hv * D], cfg.dt_bias)?,
        initial,
        indices: match idx_dt {
            Some(d) => opt_i(&x.state_indices, &[n], d)?,
            None => None,
        },
        read: match idx_dt {
            Some(d) => opt_i(&x.read_indices, &[n], d)?,
            None => None,
        },
        has_initial: match has_dt {
            Some(d) => opt_i(&x.has_initial, &[n], d)?,
            None => None,
        },
        cu: match cfg.varlen {
            Some(d) => opt_i(&x.cu_seqlens, &[n + 1], d)?,
            None => None,
        },
        prefix_lens: match (cfg.prefix.prefix_lens, &x.prefix) {
            (Some(d), Some(p)) => Some(dev(gpu, s, &[n], d, &ints(&p.lens))?),
            _ => None,
        },
        checkpoint_slots: match (cfg.prefix.checkpoint_slots, &x.prefix) {
            (Some(d), Some(p)) => Some(dev(gpu, s, &[n, p.cols], d, &ints(&p.slots))?),
            _ => None,
        },
        checkpoints: match (cfg.prefix.checkpoint_slots, &x.prefix) {
            (Some(_), Some(p)) => {
                Some(dev(gpu, s, &[p.pool.len() / (hv * D * D), hv, D, D], cfg.state_dtype, &p.pool)?)
            }
            _ => None,
        },
        out,
        fin,
    })
}

/// The views a call borrows.
pub struct ChunkViews {
    q: TensorView,
    k: TensorView,
    v: TensorView,
    g: TensorView,
    beta: TensorView,
    a_log: Option<TensorView>,
    dt_bias: Option<TensorView>,
    initial: Option<TensorView>,
    indices: Option<TensorView>,
    read: Option<TensorView>,
    has_initial: Option<TensorView>,
    cu: Option<TensorView>,
    prefix_lens: Option<TensorView>,
    checkpoint_slots: Option<TensorView>,
    checkpoints: Option<TensorView>,
    out: TensorView,
    fin: Option<TensorView>,
}

impl ChunkTensors {
    /// The views of every tensor.
    pub fn views(&self) -> ChunkViews {
        let v = |t: &Option<DeviceTensor>| t.as_ref().map(|t| t.view());
        ChunkViews {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            g: self.g.view(),
            beta: self.beta.view(),
            a_log: v(&self.a_log),
            dt_bias: v(&self.dt_bias),
            initial: v(&self.initial),
            indices: v(&self.indices),
            read: v(&self.read),
            has_initial: v(&self.has_initial),
            cu: v(&self.cu),
            prefix_lens: v(&self.prefix_lens),
            checkpoint_slots: v(&self.checkpoint_slots),
            checkpoints: v(&self.checkpoints),
            out: self.out.view(),
            fin: v(&self.fin),
        }
    }
}

/// The API arguments of a case: every output preallocated, so nothing is allocated.
pub fn chunk_args<'a>(x: &ChunkInputs, v: &'a ChunkViews) -> ChunkArgs<'a> {
    let mut a = ChunkArgs::new(&v.q, &v.k, &v.v, &v.g, &v.beta);
    a.scale = Some(x.scale as f32);
    a.initial_state = v.initial.as_ref();
    a.output_final_state = v.fin.is_some();
    a.final_state = v.fin.as_ref();
    a.cu_seqlens = v.cu.as_ref();
    a.a_log = v.a_log.as_ref();
    a.dt_bias = v.dt_bias.as_ref();
    a.lower_bound = Some(x.lower_bound as f32);
    // The case's gate and beta rules (`use_lower_bound` only where the kernel computes the gate).
    a.use_lower_bound = x.gate.in_kernel().then_some(x.gate == kda_kernels::rules::Gate::LowerBound);
    let (sigmoid, neg) = x.beta_rule.flags();
    a.apply_beta_sigmoid = Some(sigmoid);
    a.allow_neg_eigval = neg;
    a.use_qk_l2norm_in_kernel = Some(x.l2norm);
    a.output = Some(&v.out);
    a.state_indices = v.indices.as_ref();
    a.read_indices = v.read.as_ref();
    a.has_initial_state = v.has_initial.as_ref();
    a.prefix_lens = v.prefix_lens.as_ref();
    a.checkpoint_slots = v.checkpoint_slots.as_ref();
    a.checkpoint_pool = v.checkpoints.as_ref();
    a.checkpoint_every = x.prefix.as_ref().filter(|_| v.checkpoint_slots.is_some()).map(|p| p.every);
    a
}

/// A NaN-poisoned workspace for `args`' call under `tune` (a row the preparation skips and the
/// chain reads shows as NaN; so does a split's state that no pass wrote).
pub fn poisoned_workspace(
    gpu: &Gpu,
    s: &CudaStream,
    args: &ChunkArgs,
    tune: Option<ChunkTuning>,
) -> Result<DeviceTensor, String> {
    let plan = plan_chunk(args).map_err(|e| e.to_string())?;
    let bytes = match tune {
        Some(t) => chunk_tuned_workspace_bytes(&plan, &t),
        None => chunk_workspace_bytes(&plan, &gpu.limits()),
    };
    let words = bytes.div_ceil(4);
    let mut ws = DeviceTensor::zeros(gpu, s, &[words.max(1)], DType::F32).map_err(|e| e.to_string())?;
    ws.fill_nan(s).map_err(|e| e.to_string())?;
    Ok(ws)
}

/// A case's tuning for one of its two runs: the fused kernel (`prepared` false) or the
/// two-kernel path. Token ranges and chains on SMs of their own are forms of the two-kernel
/// path, so the fused run drops them; beside the sm_90a fused kernel the two-kernel run takes
/// the sm_90a chain, unsplit.
fn tuning_for_path(t: ChunkTuning, prepared: bool) -> ChunkTuning {
    if prepared && t.target == Target::Sm90a {
        return ChunkTuning { prepared, shape: ChunkShape::HOPPER_PREPARED, split: None, ranges: None, ..t };
    }
    if prepared {
        return ChunkTuning { prepared, ..t };
    }
    ChunkTuning { prepared, ranges: None, chain_sms: ChainSms::Shared, ..t }
}

/// One call on the GPU, checking the call's fused variant is `cfg`: the fused kernel (no
/// workspace), or with `prepared` the API's path (`tune`'s, or the default) over a poisoned
/// workspace; returns what it wrote, and the segment length of the split the call took, if
/// any.
#[allow(clippy::too_many_arguments)] // a case, its tensors and how to call
pub fn run_chunk_on_gpu(
    gpu: &Gpu,
    kernels: &Kernels,
    s: &CudaStream,
    cfg: &ChunkConfig,
    x: &ChunkInputs,
    t: &ChunkTensors,
    tune: Option<ChunkTuning>,
    prepared: bool,
) -> Result<(ChunkOutputs, RunPath), String> {
    let views = t.views();
    let mut args = chunk_args(x, &views);
    let plan = plan_chunk(&args).map_err(|e| e.to_string())?;
    let chosen = chunk_tuned_config(&plan, ChunkTuning::fused(&plan));
    if &chosen != cfg {
        return Err(format!("the call's fused variant is {}, not {}", chosen.key(), cfg.key()));
    }
    let tune = match (tune, prepared) {
        (Some(t), _) => Some(tuning_for_path(t, prepared)),
        (None, false) => Some(ChunkTuning::fused(&plan)),
        (None, true) => None,
    };
    // A split's states are in the workspace when there is one, in the kept one otherwise.
    let ws = if prepared { Some(poisoned_workspace(gpu, s, &args, tune)?) } else { None };
    let ws_view = ws.as_ref().map(|w| w.view());
    args.workspace = ws_view.as_ref();
    let taken = tune.unwrap_or_else(|| ChunkTuning::for_call(&plan, &gpu.limits()));
    let path = RunPath { split: taken.split, target: taken.target };
    match tune {
        Some(t) => chunk_kda_tuned(gpu, kernels, s, &args, t),
        None => chunk_kda(gpu, kernels, s, &args),
    }
    .map_err(|e| e.to_string())?;
    let bytes = |t: &DeviceTensor| t.to_bytes(s).map_err(|e| e.to_string());
    let final_state = match (&t.fin, &t.initial, cfg.states) {
        (Some(f), _, _) => from_bytes(&bytes(f)?, cfg.state_dtype),
        (None, Some(p), ChunkStates::Pool { .. }) => from_bytes(&bytes(p)?, cfg.state_dtype),
        _ => vec![],
    };
    let checkpoints = match &t.checkpoints {
        Some(c) => from_bytes(&bytes(c)?, cfg.state_dtype),
        None => vec![],
    };
    Ok((ChunkOutputs { out: from_bytes(&bytes(&t.out)?, cfg.dtype), final_state, checkpoints }, path))
}

/// What a conformance run took that changes its rounding: the split (its segment length) and
/// the fused kernel's target. Runs that differ in either agree within tolerance, not in bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunPath {
    /// The split's segment length, if split.
    pub split: Option<usize>,
    /// The fused kernel's target.
    pub target: Target,
}

/// One prefill conformance case: what the API must pick for the spec, and a launch shape that
/// overrides its choice (token ranges, or the split at a chosen segment length).
#[derive(Clone)]
struct ChunkCase {
    name: String,
    cfg: ChunkConfig,
    spec: ChunkSpec,
    tune: Option<ChunkTuning>,
}

/// The prefill conformance cases at real shapes (small ones for `quick`).
fn chunk_cases(quick: bool) -> Vec<ChunkCase> {
    let (t_dense, h_dense, t_long, t_split) = if quick { (100, 2, 256, 512) } else { (1024, 16, 32768, 4096) };
    use kda_dsl::DType::{BF16, F16, F32, I32, I64};
    use kda_kernels::chunk::{Beta, ChunkGate};
    use kda_kernels::chunk_ref::BetaSpec;
    let d = ChunkConfig::default();
    let init = ChunkSpec { initial: InitialSpec::PerSequence, ..ChunkSpec::default() };
    // Explicit tunings at the fused kernel's shape (both runs of a comparison take it): the
    // two-kernel path in 4 token ranges, and the split every `seg` tokens.
    let fused = ChunkTuning {
        shape: ChunkShape::FUSED,
        split: None,
        prepared: false,
        prep_blocks: None,
        ranges: None,
        chain_sms: ChainSms::Shared,
        operands: ChunkOperands::F16,
        target: Target::Sm80,
    };
    let four_ranges = ChunkTuning { prepared: true, ranges: Some(4), ..fused };
    let split = |seg| ChunkTuning { split: Some(seg), ..fused };
    // Segments of the varlen split row: the default's at full size.
    let seg_varlen = if quick { 64 } else { kda_runtime::chunk::SPLIT_SEGMENT_TOKENS };
    // Prefix caching rows: the pool, `prefix_lens` and checkpoints through a block table.
    let pool_i32 = ChunkStates::Pool { indices: I32, has_initial: Some(I32) };
    let caching = PrefixCaching { prefix_lens: Some(I32), checkpoint_slots: Some(I32), ..Default::default() };
    vec![
        ChunkCase {
            name: format!("chunk B=2 T={t_dense} H={h_dense} bf16, f32 state in and out"),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 2, t: t_dense }, h: h_dense, hv: h_dense, ..init.clone() },
            tune: None,
        },
        // 128 chains: on 9.0 the default path is the sm_90a kernel with two producer warpgroups.
        ChunkCase {
            name: format!("chunk B=4 T={t_dense} H=32 (128 chains), the default path"),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 4, t: t_dense }, h: 32, hv: 32, ..init.clone() },
            tune: None,
        },
        ChunkCase {
            name: "chunk varlen 8 ragged seqs H=4 HV=8 (GVA 2) f16".into(),
            cfg: ChunkConfig { dtype: F16, varlen: Some(I64), ..d.clone() },
            spec: ChunkSpec {
                dtype: F16,
                lengths: Lengths::Varlen(vec![1000, 1, 0, 333, 16, 2049, 15, 700]),
                h: 4,
                hv: 8,
                ..init.clone()
            },
            tune: None,
        },
        ChunkCase {
            name: "chunk varlen pool in place, bf16 state, padding".into(),
            cfg: ChunkConfig {
                state_dtype: BF16,
                varlen: Some(I32),
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                ..d.clone()
            },
            spec: ChunkSpec {
                lengths: Lengths::Varlen(vec![300, 17, 900, 64, 5, 1200]),
                h: 4,
                hv: 4,
                initial: InitialSpec::Pool { slots: 9 },
                state_dtype: BF16,
                ..ChunkSpec::default()
            },
            tune: None,
        },
        ChunkCase {
            name: "chunk B=2 T=1000 H=4 without l2norm, bf16 operands".into(),
            cfg: ChunkConfig { l2norm: false, operands: ChunkOperands::Bf16, ..d.clone() },
            spec: ChunkSpec { l2norm: false, lengths: Lengths::Dense { b: 2, t: 1000 }, h: 4, hv: 4, ..init.clone() },
            tune: None,
        },
        ChunkCase {
            name: "chunk precomputed gate -20 per token, T=777".into(),
            cfg: ChunkConfig {
                gate: ChunkGate::Precomputed,
                states: ChunkStates::Zeros { store_final: true },
                ..d.clone()
            },
            spec: ChunkSpec {
                lengths: Lengths::Dense { b: 1, t: 777 },
                h: 2,
                hv: 2,
                gate: GateSpec::PrecomputedFixed(-20.0),
                ..ChunkSpec::default()
            },
            tune: None,
        },
        ChunkCase {
            name: format!("chunk B=2 T={t_dense} softplus gate, raw beta (FLA's), pool"),
            cfg: ChunkConfig {
                gate: ChunkGate::Softplus,
                beta: Beta::Raw,
                states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) },
                ..d.clone()
            },
            spec: ChunkSpec {
                gate: GateSpec::Softplus,
                beta_rule: Beta::Raw,
                lengths: Lengths::Dense { b: 2, t: t_dense },
                h: 2,
                hv: 4,
                initial: InitialSpec::Pool { slots: 4 },
                ..ChunkSpec::default()
            },
            tune: None,
        },
        ChunkCase {
            name: format!("chunk B=1 T={t_dense} allow_neg_eigval, beta near 2, identical keys"),
            cfg: ChunkConfig { beta: Beta::TwoSigmoid, ..d.clone() },
            spec: ChunkSpec {
                beta_rule: Beta::TwoSigmoid,
                beta: BetaSpec::Fixed(8.0),
                identical_keys: true,
                lengths: Lengths::Dense { b: 1, t: t_dense },
                h: 2,
                hv: 2,
                ..init.clone()
            },
            tune: None,
        },
        ChunkCase {
            name: format!("chunk B=1 T={t_long} H=2, final state"),
            cfg: ChunkConfig { state_dtype: F32, ..d.clone() },
            spec: ChunkSpec { lengths: Lengths::Dense { b: 1, t: t_long }, h: 2, hv: 2, ..init.clone() },
            tune: None,
        },
        ChunkCase {
            name: format!("chunk B=2 T={} H=2 HV=4, a producer warpgroup", t_dense + 3),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 2, t: t_dense + 3 }, h: 2, hv: 4, ..init.clone() },
            tune: Some(ChunkTuning { shape: ChunkShape::PRODUCER, ..fused }),
        },
        ChunkCase {
            name: format!("chunk B=1 T={} H=2 HV=4, two-kernel path in 4 token ranges", t_split + 7),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 1, t: t_split + 7 }, h: 2, hv: 4, ..init.clone() },
            tune: Some(four_ranges),
        },
        ChunkCase {
            name: format!("chunk B=1 T={} H=2 HV=4, 4 token ranges, the chains on SMs of their own", t_split + 7),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 1, t: t_split + 7 }, h: 2, hv: 4, ..init.clone() },
            tune: Some(ChunkTuning { chain_sms: ChainSms::Own, ..four_ranges }),
        },
        ChunkCase {
            name: format!("chunk B=1 T={} f32 pool in place, two-kernel path in 4 token ranges", t_split + 9),
            cfg: ChunkConfig { states: ChunkStates::Pool { indices: I32, has_initial: Some(I32) }, ..d.clone() },
            spec: ChunkSpec {
                lengths: Lengths::Dense { b: 1, t: t_split + 9 },
                h: 2,
                hv: 4,
                initial: InitialSpec::Pool { slots: 3 },
                ..ChunkSpec::default()
            },
            tune: Some(four_ranges),
        },
        ChunkCase {
            name: format!("chunk B=1 T={} prefix caching, checkpoints every 64, 4 token ranges", t_split + 9),
            cfg: ChunkConfig { states: pool_i32, prefix: caching, ..d.clone() },
            spec: ChunkSpec {
                lengths: Lengths::Dense { b: 1, t: t_split + 9 },
                h: 2,
                hv: 4,
                initial: InitialSpec::Pool { slots: 3 },
                prefix: Some(PrefixSpec { every: 64, cols: (t_split + 9 + 33) / 64 + 1 }),
                ..ChunkSpec::default()
            },
            tune: Some(four_ranges),
        },
        ChunkCase {
            name: format!("chunk split every {seg_varlen} tokens, prefix caching, bf16 pool"),
            cfg: ChunkConfig { state_dtype: BF16, varlen: Some(I32), states: pool_i32, prefix: caching, ..d.clone() },
            spec: ChunkSpec {
                lengths: Lengths::Varlen(vec![3 * seg_varlen + 5, 17, 2 * seg_varlen + 1, 0, 40, 3 * seg_varlen]),
                h: 2,
                hv: 4,
                initial: InitialSpec::Pool { slots: 8 },
                state_dtype: BF16,
                prefix: Some(PrefixSpec { every: 64, cols: 3 * seg_varlen / 64 + 2 }),
                ..ChunkSpec::default()
            },
            tune: Some(split(seg_varlen)),
        },
        ChunkCase {
            name: format!("chunk split every {} tokens, B=2 T={t_split} H=2 HV=4", t_split / 8),
            cfg: d.clone(),
            spec: ChunkSpec { lengths: Lengths::Dense { b: 2, t: t_split }, h: 2, hv: 4, ..init },
            tune: Some(split(t_split / 8)),
        },
        ChunkCase {
            name: format!("chunk split every {seg_varlen} tokens, varlen pool, bf16 state"),
            cfg: ChunkConfig {
                state_dtype: BF16,
                varlen: Some(I64),
                states: ChunkStates::Pool { indices: I64, has_initial: Some(I32) },
                ..d
            },
            spec: ChunkSpec {
                lengths: Lengths::Varlen(vec![2 * seg_varlen + 5, 17, 0, seg_varlen, seg_varlen + 1, 3 * seg_varlen]),
                h: 2,
                hv: 4,
                initial: InitialSpec::Pool { slots: 8 },
                state_dtype: BF16,
                ..ChunkSpec::default()
            },
            tune: Some(split(seg_varlen)),
        },
    ]
}

/// The cases again with the fused kernel compiled for sm_90a (`wgmma`), on compute capability
/// 9.0: each of them whose API run is its own choice, at [`ChunkShape::HOPPER`] (and its
/// two-kernel run the sm_90a chain, [`ChunkShape::HOPPER_PREPARED`]); the first also with a
/// producer warpgroup computing the factors, and with two taking turns.
fn hopper_cases(cases: &[ChunkCase]) -> Vec<ChunkCase> {
    let hopper = |c: &ChunkCase, shape: ChunkShape, what: &str| ChunkCase {
        name: format!("{}{what} sm_90a", c.name),
        tune: Some(ChunkTuning {
            shape,
            split: None,
            prepared: false,
            prep_blocks: None,
            ranges: None,
            chain_sms: ChainSms::Shared,
            operands: c.cfg.operands,
            target: Target::Sm90a,
        }),
        ..c.clone()
    };
    let untuned: Vec<&ChunkCase> = cases.iter().filter(|c| c.tune.is_none()).collect();
    let mut out: Vec<ChunkCase> = untuned.iter().map(|c| hopper(c, ChunkShape::HOPPER, "")).collect();
    out.extend(untuned.first().map(|c| hopper(c, ChunkShape::HOPPER_PRODUCER, ", a producer warpgroup")));
    out.extend(untuned.first().map(|c| hopper(c, ChunkShape::HOPPER_TWO_PRODUCERS, ", two producer warpgroups")));
    out
}

/// Runs the prefill conformance cases (on compute capability 9.0 each also with the sm_90a fused
/// kernel); returns the number of failures.
pub fn chunk_checks(gpu: &Gpu, kernels: &Kernels, scale: super::gpu_checks::Scale) -> usize {
    let s = gpu.default_stream();
    let mut failures = 0;
    let quick = scale == super::gpu_checks::Scale::Quick;
    let mut cases = chunk_cases(quick);
    if gpu.limits().target().is_ok_and(|t| t == Target::Sm90a) {
        cases.extend(hopper_cases(&cases));
    }
    for (i, ChunkCase { name, cfg, spec, tune }) in cases.into_iter().enumerate() {
        let x = ChunkInputs::random(&mut Rng::new(100 + i as u64), &spec);
        // Each path on fresh tensors: the pool is updated in place.
        let run = |prepared: bool| {
            upload_chunk(gpu, &s, &cfg, &x)
                .map_err(|e| e.to_string())
                .and_then(|t| run_chunk_on_gpu(gpu, kernels, &s, &cfg, &x, &t, tune, prepared))
        };
        match run(false).and_then(|fused| Ok((run(true)?, fused))) {
            Ok(((prepared, path_ws), (got, path))) => {
                let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
                let bit_identical = bits(&prepared.out) == bits(&got.out)
                    && bits(&prepared.final_state) == bits(&got.final_state)
                    && bits(&prepared.checkpoints) == bits(&got.checkpoints);
                // A split, or another target, differs from the unsplit sm_80 chain by rounding:
                // with a workspace alone (the API's default split) or an sm_90a fused kernel,
                // the two runs are compared with the reference only.
                let alike = path_ws == path;
                let same = bit_identical || !alike;
                let c = compare_chunk(&cfg, &x, got, &chunk_reference(&x));
                let (to, ts) = tolerance(&cfg);
                let ok =
                    same && c.out_err <= to && c.state_err <= ts && c.bad_elements == 0 && c.untouched_changed == 0;
                failures += usize::from(!ok);
                out!(
                    "{name:<52} {:>10.2e} {:>10.0e}  {}  (state {:.2e}, bad elements {}, untouched slots changed {}, two-kernel path {})",
                    c.out_err,
                    to,
                    if ok { "ok" } else { "FAIL" },
                    c.state_err,
                    c.bad_elements,
                    c.untouched_changed,
                    // Across targets the bits are reported, not required: whether sm_90a's
                    // `wgmma` rounds as sm_80's `mma.sync` does on this GPU.
                    match (alike, bit_identical) {
                        (false, true) => "another split or target, yet bit-identical",
                        (false, false) => "another split or target, within tolerance",
                        (true, true) => "bit-identical",
                        (true, false) => "DIFFERS",
                    }
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

/// One standard prefill bench case: name, batch rows, tokens per row, heads, value heads,
/// varlen lengths, where its states come from and go, and how its gates are drawn.
#[derive(Clone)]
pub struct PrefillCase {
    /// The peer bench's case name.
    pub name: &'static str,
    b: usize,
    t: usize,
    h: usize,
    hv: usize,
    lens: Option<Vec<usize>>,
    states: BenchStates,
    gates: BenchGates,
}

impl PrefillCase {
    /// A dense case of `b` rows of `t` tokens, per-sequence states.
    fn dense(name: &'static str, b: usize, t: usize, h: usize, hv: usize) -> PrefillCase {
        PrefillCase { name, b, t, h, hv, lens: None, states: BenchStates::PerSequence, gates: BenchGates::Standard }
    }

    /// A varlen case of these sequence lengths, per-sequence states.
    fn varlen(name: &'static str, lens: &[usize], h: usize, hv: usize) -> PrefillCase {
        let t = lens.iter().sum();
        let (states, gates) = (BenchStates::PerSequence, BenchGates::Standard);
        PrefillCase { name, b: 1, t, h, hv, lens: Some(lens.to_vec()), states, gates }
    }

    /// The case with its states from and to `states`.
    fn with_states(self, states: BenchStates) -> PrefillCase {
        PrefillCase { states, ..self }
    }

    /// The case with its gates drawn as `gates` says.
    fn with_gates(self, gates: BenchGates) -> PrefillCase {
        PrefillCase { gates, ..self }
    }
}

/// How a prefill bench row's gate parameters are drawn, beyond the peer bench's standard draw
/// (`A_log ~ 2.8·U(0, 1)` per value head, `dt_bias ~ N(0, 1)` per value head and channel, raw
/// gates `N(0, 1)`, the safe gate's lower bound -5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchGates {
    /// The standard draw.
    Standard,
    /// The standard draw, then channel 0 of every value head made never to decay:
    /// `dt_bias[h·D + 0]` = [`NO_DECAY_DT_BIAS`] for every value head `h`, so that its gate
    /// `-5·sigmoid(exp(A_log)·(g + dt_bias))` is at most about 2e-10 in magnitude (g near 0,
    /// decay near 1) on every token.
    /// A warm-up shortcut (a piece of a split sequence started from zeros some chunks early) is
    /// safe only where its bound on the state it drops (the product over the warm-up's tokens
    /// of the slowest channel's decay) is small; a channel that never decays keeps that bound
    /// near 1 on every head, so this row prices the exact path such a shortcut would have to
    /// fall back to (`docs/performance.md`, "The warm-up shortcut's bound, per token").
    OneChannelNoDecay,
}

/// The `dt_bias` of [`BenchGates::OneChannelNoDecay`]'s never-decaying channel: with `A_log`
/// at least 0 and the raw gate's draws within ±6, `exp(A_log)·(g + dt_bias)` is at most -24,
/// and the gate at most `5·sigmoid(-24)` ≈ 2e-10 in magnitude.
pub const NO_DECAY_DT_BIAS: f32 = -30.0;

impl BenchGates {
    /// Applies the row's override to `dt_bias [hv·D]` as drawn (the draw itself, and so every
    /// later draw from the same generator, is the standard one).
    fn apply(self, dt_bias: &mut [f32]) {
        match self {
            BenchGates::Standard => {}
            BenchGates::OneChannelNoDecay => {
                for head in dt_bias.chunks_exact_mut(D) {
                    head[0] = NO_DECAY_DT_BIAS;
                }
            }
        }
    }
}

/// Where a prefill bench row's states come from and go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchStates {
    /// `initial_state [N, ..]` in, `final_state` out (the peer bench's rows).
    PerSequence,
    /// The pool in place (`state_indices`), checkpointing every that many tokens through a
    /// block table into a pool of its own when given.
    Pool {
        /// `checkpoint_every`.
        checkpoint_every: Option<usize>,
    },
}

const VARLEN16: [usize; 16] =
    [512, 8192, 1000, 3000, 4096, 7000, 100, 2048, 6000, 5000, 1500, 9000, 300, 4000, 7500, 6284];
const VARLEN_MIX64: [usize; 64] = [
    300, 5000, 383, 700, 999, 255, 4000, 63, 257, 12000, 7, 16000, 8000, 1000, 33, 128, 256, 500, 1025, 1500, 7000,
    6500, 1536, 3500, 1300, 1023, 1024, 511, 1777, 4097, 8191, 2049, 127, 129, 3, 17, 64, 15, 1, 8192, 6000, 7777,
    4096, 777, 513, 16, 47, 2048, 3000, 65, 4095, 10000, 4500, 3333, 200, 100, 2, 2500, 1100, 512, 2000, 2047, 31,
    9000,
];

/// The prefill cases of the peer bench (`fla_ref.py`'s `PREFILL`).
pub fn prefill_cases() -> Vec<PrefillCase> {
    let pool = |checkpoint_every| BenchStates::Pool { checkpoint_every };
    vec![
        PrefillCase::dense("prefill_b1_t32768_h32", 1, 32768, 32, 32),
        PrefillCase::dense("prefill_b8_t4096_h32", 8, 4096, 32, 32),
        PrefillCase::dense("prefill_gva_b1_t32768_h16_hv32", 1, 32768, 16, 32),
        PrefillCase::varlen("prefill_varlen16_s65536_h32", &VARLEN16, 32, 32),
        PrefillCase::varlen("prefill_varlen_mix64_h32", &VARLEN_MIX64, 32, 32),
        // The mix64 row through the pool, without and with checkpoints every 256 tokens (prefix
        // caching's extra state writes against the bytes they add).
        PrefillCase::varlen("prefill_varlen_mix64_h32_pool", &VARLEN_MIX64, 32, 32).with_states(pool(None)),
        PrefillCase::varlen("prefill_varlen_mix64_h32_pool_ckpt256", &VARLEN_MIX64, 32, 32)
            .with_states(pool(Some(256))),
        // One GPU's heads of a 32-head model under 4- and 8-way tensor parallelism.
        PrefillCase::dense("prefill_tp4_b1_t32768_h8", 1, 32768, 8, 8),
        PrefillCase::dense("prefill_tp8_b1_t32768_h4", 1, 32768, 4, 4),
        // The B = 1 row with channel 0 of every value head never decaying (g near 0).
        PrefillCase::dense("prefill_nodecay_b1_t32768_h32", 1, 32768, 32, 32).with_gates(BenchGates::OneChannelNoDecay),
    ]
}

/// The sweeps' cases: the peer bench's; one long sequence with few heads
/// (`prefill_b1_t32768_h8`, the shape cuLA publishes its intra-sequence split at), where one
/// chain per head leaves most SMs idle; the varlen16 lengths with few heads, where the
/// split's extra passes meet more chains; and 32 sequences of 8192 tokens on 8 heads, every
/// one split, on a GPU the unsplit chains already fill; then the lengths and batches at which
/// the split's rule is set (`prefill_b1_t8192_h8` .. `prefill_b16_t16384_h8`, and at 4 heads
/// `prefill_b1_t8192_h4` .. `prefill_b16_t16384_h4`, where shorter segments are a candidate
/// that a full GPU may pay for); the B = 1 row as a varlen call of its one sequence, as
/// engines make it (`prefill_varlen1_t32768_h32`);
/// and 32 to 128 unsplit chains (32 heads), where the two-kernel path meets the fused kernels
/// ([`kda_runtime::chunk::prepared_max_chains`]).
pub fn sweep_prefill_cases() -> Vec<PrefillCase> {
    let mut cases = prefill_cases();
    cases.extend([
        PrefillCase::dense("prefill_b1_t32768_h8", 1, 32768, 8, 8),
        PrefillCase::varlen("prefill_varlen16_s65536_h8", &VARLEN16, 8, 8),
        PrefillCase::dense("prefill_b32_t8192_h8", 32, 8192, 8, 8),
        PrefillCase::dense("prefill_b1_t8192_h8", 1, 8192, 8, 8),
        PrefillCase::dense("prefill_b1_t12288_h8", 1, 12288, 8, 8),
        PrefillCase::dense("prefill_b1_t16384_h8", 1, 16384, 8, 8),
        PrefillCase::dense("prefill_b4_t16384_h8", 4, 16384, 8, 8),
        PrefillCase::dense("prefill_b16_t16384_h8", 16, 16384, 8, 8),
        PrefillCase::dense("prefill_b1_t8192_h4", 1, 8192, 4, 4),
        PrefillCase::dense("prefill_b1_t16384_h4", 1, 16384, 4, 4),
        PrefillCase::dense("prefill_b32_t8192_h4", 32, 8192, 4, 4),
        PrefillCase::dense("prefill_b16_t16384_h4", 16, 16384, 4, 4),
        PrefillCase::varlen("prefill_varlen1_t32768_h32", &[32768], 32, 32),
        PrefillCase::dense("prefill_b1_t16384_h32", 1, 16384, 32, 32),
        PrefillCase::dense("prefill_b2_t16384_h32", 2, 16384, 32, 32),
        PrefillCase::dense("prefill_b2_t8192_h32", 2, 8192, 32, 32),
        PrefillCase::dense("prefill_b3_t8192_h32", 3, 8192, 32, 32),
        PrefillCase::dense("prefill_b4_t8192_h32", 4, 8192, 32, 32),
        PrefillCase::dense("prefill_b4_t2048_h32", 4, 2048, 32, 32),
    ]);
    cases
}

/// What a prefill bench row measured.
pub struct PrefillTiming {
    /// Median milliseconds of one call.
    pub ms: f32,
    /// Wall seconds of the first call (variant compile, module load and driver JIT included).
    pub first_call_s: f64,
    /// Tokens of the call.
    pub tokens: usize,
    /// The byte floor as the peer counts it: inputs read once, output and states written once.
    pub min_bytes: usize,
    /// Host microseconds of one eager call ([`kda_runtime::host_us_per_call`]).
    pub host_us: f32,
    /// A hash of the first call's output and final-state bytes, where [`ResultBits::Hash`]
    /// asked for it: two launch shapes of one case that give the same bits give the same hash.
    pub bits: Option<u64>,
    /// The tuning the call ran: the one given, or the runtime's own (unsplit, every tuning of
    /// a case gives the same bits; a split rounds its merge otherwise).
    pub tuning: ChunkTuning,
}

/// Whether [`time_prefill`] hashes its first call's results (downloading them: a sweep
/// compares shapes' bits, a bench row only times).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultBits {
    /// Hash the output and the final states.
    Hash,
    /// Time only.
    Skip,
}

/// `n` values drawn as `f` does, from a block of 1 Mi random draws repeated (timing does not
/// depend on the values beyond their distribution, and drawing billions takes minutes).
fn repeated(rng: &mut Rng, n: usize, f: impl Fn(&mut Rng) -> f64) -> Vec<f32> {
    let block: Vec<f32> = (0..(1 << 20).min(n.max(1))).map(|_| f(rng) as f32).collect();
    (0..n).map(|i| block[i % block.len()]).collect()
}

/// Whose workspace a timed prefill call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkspaceSource {
    /// None passed: the one `Kernels` keeps for the stream (the README's calls).
    Kept,
    /// The caller's, of the path's size, NaN-poisoned.
    Caller,
}

/// A pool row's index tensors: a slot per sequence, and with checkpoints a block table `[N, C]`
/// naming distinct slots of a checkpoint pool of its own (-1 past what a sequence reaches).
struct PoolTensors {
    slots: DeviceTensor,
    table: Option<DeviceTensor>,
    checkpoints: Option<DeviceTensor>,
    /// Checkpoints the call writes.
    written: usize,
}

impl PoolTensors {
    /// `c`'s pool tensors for its `n` sequences (none for a per-sequence row).
    fn of(gpu: &Gpu, s: &CudaStream, c: &PrefillCase, n: usize) -> Result<Option<PoolTensors>, RuntimeError> {
        let BenchStates::Pool { checkpoint_every } = c.states else { return Ok(None) };
        let ints_of = |shape: &[usize], v: &[i64]| {
            DeviceTensor::from_bytes(gpu, s, shape, DType::I32, &to_bytes(&ints(v), DType::I32))
        };
        let slots = ints_of(&[n], &(0..n as i64).collect::<Vec<_>>())?;
        let Some(every) = checkpoint_every else {
            return Ok(Some(PoolTensors { slots, table: None, checkpoints: None, written: 0 }));
        };
        let lens = c.lens.clone().unwrap_or_else(|| vec![c.t; c.b]);
        // Sequence s checkpoints at every multiple of E strictly inside its tokens.
        let per: Vec<usize> = lens.iter().map(|l| l.saturating_sub(1) / every).collect();
        let cols = per.iter().copied().max().unwrap_or(0).max(1);
        let mut table = vec![-1i64; n * cols];
        let mut next = 0i64;
        for (s_n, k) in per.iter().enumerate() {
            for col in 0..*k {
                table[s_n * cols + col] = next;
                next += 1;
            }
        }
        let written = next as usize;
        let pool = DeviceTensor::zeros(gpu, s, &[written.max(1), c.hv, D, D], DType::F32)?;
        let table = ints_of(&[n, cols], &table)?;
        Ok(Some(PoolTensors { slots, table: Some(table), checkpoints: Some(pool), written }))
    }

    /// The views a call borrows: slots, block table, checkpoint pool.
    fn views(&self) -> (TensorView, Option<TensorView>, Option<TensorView>) {
        (self.slots.view(), self.table.as_ref().map(|t| t.view()), self.checkpoints.as_ref().map(|t| t.view()))
    }
}

/// Times one prefill case as the peer's bench runs it (bf16, lower-bound gate with `A_log` and
/// `dt_bias` drawn as `c`'s [`BenchGates`] says, l2norm, beta logits, an f32 initial state in
/// and the final state out), through
/// [`chunk_kda`] with every output preallocated: the first call's wall time, then the median of
/// 20 CUDA-event timings after at least 3 warm-up calls and 200 ms (`time_ms`), over
/// `workspace`. `tune` overrides the launch shape the API picks; `bits` says whether to hash
/// the first call's results.
pub fn time_prefill(
    gpu: &Gpu,
    kernels: &Kernels,
    c: &PrefillCase,
    tune: Option<ChunkTuning>,
    workspace: WorkspaceSource,
    bits: ResultBits,
) -> Result<PrefillTiming, String> {
    let e = |e: RuntimeError| e.to_string();
    let s = gpu.new_stream().map_err(e)?;
    let mut rng = Rng::new(7);
    let (b, t, h, hv) = (c.b, c.t, c.h, c.hv);
    let n = c.lens.as_ref().map_or(b, |l| l.len());
    let tokens = b * t;
    let bf = DType::BF16;
    let normal = |r: &mut Rng| r.normal();
    let up = |shape: &[usize], d: DType, v: Vec<f32>| DeviceTensor::from_f32(gpu, &s, shape, d, &v).map_err(e);
    let q = up(&[b, t, h, D], bf, repeated(&mut rng, tokens * h * D, normal))?;
    let k = up(&[b, t, h, D], bf, repeated(&mut rng, tokens * h * D, normal))?;
    let v = up(&[b, t, hv, D], bf, repeated(&mut rng, tokens * hv * D, normal))?;
    let g = up(&[b, t, hv, D], bf, repeated(&mut rng, tokens * hv * D, normal))?;
    let beta = up(&[b, t, hv], bf, repeated(&mut rng, tokens * hv, normal))?;
    let a_log = up(&[hv], DType::F32, repeated(&mut rng, hv, |r| 2.8 * r.uniform()))?;
    let mut dt_bias = repeated(&mut rng, hv * D, normal);
    c.gates.apply(&mut dt_bias);
    let dt_bias = up(&[hv * D], DType::F32, dt_bias)?;
    let h0 = up(&[n, hv, D, D], DType::F32, repeated(&mut rng, n * hv * D * D, |r| 0.1 * r.normal()))?;
    let fin = DeviceTensor::zeros(gpu, &s, &[n, hv, D, D], DType::F32).map_err(e)?;
    let out = DeviceTensor::zeros(gpu, &s, &[b, t, hv, D], bf).map_err(e)?;
    let cu = match &c.lens {
        Some(l) => {
            let mut cu = vec![0i64];
            for len in l {
                cu.push(cu[cu.len() - 1] + *len as i64);
            }
            Some(
                DeviceTensor::from_bytes(gpu, &s, &[n + 1], DType::I64, &to_bytes(&ints(&cu), DType::I64))
                    .map_err(e)?,
            )
        }
        None => None,
    };
    let views = (q.view(), k.view(), v.view(), g.view(), beta.view(), a_log.view(), dt_bias.view(), h0.view());
    let (fin_v, out_v, cu_v) = (fin.view(), out.view(), cu.as_ref().map(|c| c.view()));
    let mut args = ChunkArgs::new(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.a_log = Some(&views.5);
    args.dt_bias = Some(&views.6);
    args.initial_state = Some(&views.7);
    args.output = Some(&out_v);
    args.cu_seqlens = cu_v.as_ref();
    let pool = PoolTensors::of(gpu, &s, c, n).map_err(e)?;
    let pool_v = pool.as_ref().map(PoolTensors::views);
    match &pool_v {
        None => {
            args.output_final_state = true;
            args.final_state = Some(&fin_v);
        }
        Some((slots, table, checkpoints)) => {
            args.state_indices = Some(slots);
            args.checkpoint_slots = table.as_ref();
            args.checkpoint_pool = checkpoints.as_ref();
            args.checkpoint_every = match c.states {
                BenchStates::Pool { checkpoint_every } => checkpoint_every,
                BenchStates::PerSequence => None,
            };
        }
    }
    let ran = match tune {
        Some(t) => t,
        None => ChunkTuning::for_call(&plan_chunk(&args).map_err(|e| e.to_string())?, &gpu.limits()),
    };
    let ws = match workspace {
        WorkspaceSource::Caller => Some(poisoned_workspace(gpu, &s, &args, tune)?),
        WorkspaceSource::Kept => None,
    };
    let ws_view = ws.as_ref().map(|w| w.view());
    args.workspace = ws_view.as_ref();
    let call = || match tune {
        Some(t) => chunk_kda_tuned(gpu, kernels, &s, &args, t),
        None => chunk_kda(gpu, kernels, &s, &args),
    };
    s.synchronize().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    call().map_err(e)?;
    s.synchronize().map_err(|e| e.to_string())?;
    let first_call_s = t0.elapsed().as_secs_f64();
    // The first call's results, before the timed calls run it again over the pool's states.
    let bits = match bits {
        ResultBits::Skip => None,
        ResultBits::Hash => {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            out.to_bytes(&s).map_err(e)?.hash(&mut h);
            // A pool row's states are `h0`'s slots, updated in place; its checkpoints beside.
            match &pool {
                Some(p) => {
                    h0.to_bytes(&s).map_err(e)?.hash(&mut h);
                    if let Some(c) = &p.checkpoints {
                        c.to_bytes(&s).map_err(e)?.hash(&mut h);
                    }
                }
                None => fin.to_bytes(&s).map_err(e)?.hash(&mut h),
            }
            Some(h.finish())
        }
    };
    let mut samples = time_ms(gpu, &s, 3, 20, || call().map(|_| ())).map_err(e)?;
    let host_us = kda_runtime::host_us_per_call(&s, || call().map(|_| ())).map_err(e)?;
    let checkpoint_bytes = pool.as_ref().map_or(0, |p| p.written * hv * D * D * 4);
    let min_bytes =
        tokens * (2 * h * D * 2 + 2 * hv * D * 2 + hv * 2 + hv * D * 2) + 2 * n * hv * D * D * 4 + checkpoint_bytes;
    Ok(PrefillTiming { ms: median(&mut samples), first_call_s, tokens, min_bytes, host_us, bits, tuning: ran })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tuned case's fused run takes none of the two-kernel path's forms (which the runtime
    /// refuses there), and its two-kernel run keeps the forms the case asked for.
    #[test]
    fn each_run_takes_a_tuning_of_its_own_path() {
        let cases = chunk_cases(false);
        let hopper = hopper_cases(&cases);
        let tuned: Vec<ChunkTuning> = cases.iter().chain(&hopper).filter_map(|c| c.tune).collect();
        assert!(tuned.iter().any(|t| t.chain_sms == ChainSms::Own) && tuned.iter().any(|t| t.ranges.is_some()));
        for t in tuned {
            let fused = tuning_for_path(t, false);
            assert!(!fused.prepared && fused.ranges.is_none() && fused.chain_sms == ChainSms::Shared, "{t:?}");
            let two = tuning_for_path(t, true);
            assert!(two.prepared && two.chain_sms == t.chain_sms, "{t:?}");
            if t.target == Target::Sm80 {
                assert_eq!(two.ranges, t.ranges, "{t:?}");
            }
        }
    }
}
