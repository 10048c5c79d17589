//! Decode on the GPU: uploading a case, the call through the validated API, and comparing with
//! the f64 reference.

use kda_dsl::DType;
use kda_kernels::decode::{Beta, DecodeConfig, Gate, Writes};
use kda_kernels::decode_ref::{DecodeInputs, DecodeOutputs, D};
use kda_kernels::reference::{from_bytes, to_bytes};
use kda_runtime::decode::{decode_config, gated_delta_rule_decode, plan_decode, DecodeArgs};
use kda_runtime::{download, upload, CudaStream, DeviceTensor, Gpu, Kernels, RuntimeError, TensorView};

/// A decode case's tensors on the device.
pub struct DecodeTensors {
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub a: DeviceTensor,
    pub b: DeviceTensor,
    pub a_log: DeviceTensor,
    pub dt_bias: DeviceTensor,
    pub pool: DeviceTensor,
    pub indices: Option<DeviceTensor>,
    pub cu: Option<DeviceTensor>,
    pub accepted: Option<DeviceTensor>,
    pub out: DeviceTensor,
    pub fin: Option<DeviceTensor>,
    /// Device slot of each reference slot.
    pub slot_map: Vec<usize>,
}

fn dev(gpu: &Gpu, s: &CudaStream, shape: &[usize], d: DType, v: &[f64]) -> Result<DeviceTensor, RuntimeError> {
    DeviceTensor::from_bytes(gpu, s, shape, d, &to_bytes(v, d))
}

/// Bytes of one state (all value heads of one slot).
fn slot_len(x: &DecodeInputs) -> usize {
    x.hv * D * D
}

/// A view of `slots` consecutive pool slots starting at `first`.
pub fn slot_view(pool: &DeviceTensor, hv: usize, first: usize, slots: usize) -> Result<TensorView, RuntimeError> {
    let esz = pool.dtype().size_bytes();
    pool.view().part(first * hv * D * D * esz, &[slots, hv, D, D], pool.dtype())
}

/// Uploads a case. The device pool has `device_slots` slots; reference slot `i` lives at
/// `slot_map[i]` (identity when `None`), so offsets past 2^31 elements can be exercised with a
/// small host pool. Outputs start as NaN.
pub fn upload_case(
    gpu: &Gpu,
    s: &CudaStream,
    cfg: &DecodeConfig,
    x: &DecodeInputs,
    device_slots: usize,
    slot_map: Option<Vec<usize>>,
) -> Result<DecodeTensors, RuntimeError> {
    let dt = cfg.dtype;
    let (b, t, h, hv) = (x.b, x.t, x.h, x.hv);
    let slot_map = slot_map.unwrap_or_else(|| (0..x.slots).collect());
    let pool = DeviceTensor::zeros(gpu, s, &[device_slots, hv, D, D], cfg.state_dtype)?;
    for (i, &m) in slot_map.iter().enumerate() {
        let chunk = &x.pool[i * slot_len(x)..(i + 1) * slot_len(x)];
        upload(&slot_view(&pool, hv, m, 1)?, &to_bytes(chunk, cfg.state_dtype), s)?;
    }
    let map_index =
        |r: i64| if r >= 0 && (r as usize) < slot_map.len() { slot_map[r as usize] as f64 } else { r as f64 };
    let n_seq = x.sequences(cfg);
    let indices = match cfg.indices {
        Some(d) => {
            let v: Vec<f64> = x.indices.iter().map(|r| map_index(*r)).collect();
            Some(dev(gpu, s, &[n_seq, x.cols], d, &v)?)
        }
        None => None,
    };
    let cu = match cfg.varlen {
        Some(d) => {
            Some(dev(gpu, s, &[x.cu_seqlens.len()], d, &x.cu_seqlens.iter().map(|v| *v as f64).collect::<Vec<_>>())?)
        }
        None => None,
    };
    let accepted = match cfg.accepted {
        Some(d) => Some(dev(gpu, s, &[n_seq], d, &x.accepted.iter().map(|v| *v as f64).collect::<Vec<_>>())?),
        None => None,
    };
    let mut out = DeviceTensor::zeros(gpu, s, &[b, t, hv, D], cfg.out_dtype)?;
    out.fill_nan(s)?;
    let fin = match x.final_rows(cfg) {
        0 => None,
        rows => {
            let mut f = DeviceTensor::zeros(gpu, s, &[rows, hv, D, D], cfg.state_dtype)?;
            f.fill_nan(s)?;
            Some(f)
        }
    };
    let bshape: Vec<usize> = if cfg.beta_headwise { vec![b, t, hv, D] } else { vec![b, t, hv] };
    Ok(DecodeTensors {
        q: dev(gpu, s, &[b, t, h, D], dt, &x.q)?,
        k: dev(gpu, s, &[b, t, h, D], dt, &x.k)?,
        v: dev(gpu, s, &[b, t, hv, D], dt, &x.v)?,
        a: dev(gpu, s, &[b, t, hv, D], dt, &x.a)?,
        b: dev(gpu, s, &bshape, dt, &x.beta)?,
        a_log: dev(gpu, s, &[hv], DType::F32, &x.a_log)?,
        dt_bias: dev(gpu, s, &[hv * D], cfg.dt_bias.unwrap_or(DType::F32), &x.dt_bias)?,
        pool,
        indices,
        cu,
        accepted,
        out,
        fin,
        slot_map,
    })
}

/// Holds the views a call borrows.
pub struct Views {
    q: TensorView,
    k: TensorView,
    v: TensorView,
    a: TensorView,
    b: TensorView,
    a_log: TensorView,
    dt_bias: TensorView,
    pool: TensorView,
    indices: Option<TensorView>,
    cu: Option<TensorView>,
    accepted: Option<TensorView>,
    out: TensorView,
    fin: Option<TensorView>,
}

impl DecodeTensors {
    /// The views of every tensor.
    pub fn views(&self) -> Views {
        Views {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            a: self.a.view(),
            b: self.b.view(),
            a_log: self.a_log.view(),
            dt_bias: self.dt_bias.view(),
            pool: self.pool.view(),
            indices: self.indices.as_ref().map(|t| t.view()),
            cu: self.cu.as_ref().map(|t| t.view()),
            accepted: self.accepted.as_ref().map(|t| t.view()),
            out: self.out.view(),
            fin: self.fin.as_ref().map(|t| t.view()),
        }
    }
}

/// The API arguments that express `cfg` for these views.
pub fn args_for<'a>(cfg: &DecodeConfig, x: &DecodeInputs, v: &'a Views) -> DecodeArgs<'a> {
    let mut a = DecodeArgs::new(&v.q, &v.k, &v.v, &v.a, &v.b);
    a.state = Some(&v.pool);
    a.a_log = cfg.a_log.then_some(&v.a_log);
    a.dt_bias = cfg.dt_bias.map(|_| &v.dt_bias);
    a.state_indices = v.indices.as_ref();
    a.cu_seqlens = v.cu.as_ref();
    a.num_accepted_tokens = v.accepted.as_ref();
    a.output = Some(&v.out);
    a.final_state = v.fin.as_ref();
    a.scale = Some(x.scale as f32);
    a.use_qk_l2norm = Some(cfg.l2norm);
    a.use_gate_in_kernel = Some(cfg.gate != Gate::Precomputed);
    a.use_lower_bound = Some(cfg.gate == Gate::LowerBound);
    a.lower_bound = Some(x.lower_bound as f32);
    a.apply_beta_sigmoid = Some(cfg.beta != Beta::Raw);
    a.allow_neg_eigval = Some(cfg.beta == Beta::TwoSigmoid);
    a.use_initial_state = Some(cfg.use_initial_state);
    a.state_v_first = Some(cfg.v_first);
    a.inplace_final_state = matches!(cfg.writes, Writes::PoolPerToken | Writes::PoolPerSequence);
    a.store_final_state = !matches!(cfg.writes, Writes::None);
    a
}

/// One call on the GPU, checking the API picks the expected variant; returns what it wrote.
pub fn run_on_gpu(
    gpu: &Gpu,
    kernels: &Kernels,
    s: &CudaStream,
    cfg: &DecodeConfig,
    x: &DecodeInputs,
    t: &DecodeTensors,
) -> Result<DecodeOutputs, String> {
    let views = t.views();
    let args = args_for(cfg, x, &views);
    let plan = plan_decode(&args).map_err(|e| e.to_string())?;
    // The API picks the launch shape by the call; everything else must be the config's.
    let chosen = decode_config(&plan);
    let shaped = DecodeConfig { shape: chosen.shape, ..cfg.clone() };
    if chosen != shaped {
        return Err(format!("the API chose {} for {}", chosen.key(), shaped.key()));
    }
    gated_delta_rule_decode(gpu, kernels, s, &args).map_err(|e| e.to_string())?;
    let st = cfg.state_dtype;
    let mut pool = vec![];
    for &m in &t.slot_map {
        pool.extend(from_bytes(
            &download(&slot_view(&t.pool, x.hv, m, 1).map_err(|e| e.to_string())?, s).map_err(|e| e.to_string())?,
            st,
        ));
    }
    Ok(DecodeOutputs {
        out: from_bytes(&t.out.to_bytes(s).map_err(|e| e.to_string())?, cfg.out_dtype),
        pool,
        final_state: match &t.fin {
            Some(f) => from_bytes(&f.to_bytes(s).map_err(|e| e.to_string())?, st),
            None => vec![],
        },
    })
}
