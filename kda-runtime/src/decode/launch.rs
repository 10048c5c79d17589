//! `gated_delta_rule_decode`: validate, pick the kernel variant, bind and launch.

use cudarc::driver::CudaStream;
use kda_dsl::DType;
use kda_kernels::decode::{items_per_block, DecodeConfig, Writes, MAX_GRID_Z, MAX_ITEMS};
pub use kda_kernels::decode::{DecodeCallKind, DecodeShape};

use super::args::DecodeArgs;
use super::checked::check_indices;
use super::plan::{plan_decode, DecodePlan, StateIndexing};
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::Kernels;
use crate::launch::{launch_planned, KernelArg};
use crate::tensor::{download_i64, DeviceTensor, TensorView};

/// The launch shape `gated_delta_rule_decode` picks for a validated call: by whether some
/// sequence has several tokens, how many sequences there are and the state's dtype and layout
/// ([`DecodeCallKind`], chosen by `kda bench --sweep-decode` on an H200).
pub fn decode_shape(plan: &DecodePlan) -> DecodeShape {
    shape_for(plan, plan.total_tokens > plan.n, plan.n)
}

/// [`decode_shape`] for `plan`'s kind of call with `multi_token` and `nseq` in place of its own.
fn shape_for(plan: &DecodePlan, multi_token: bool, nseq: usize) -> DecodeShape {
    DecodeShape::for_call(plan.state_dtype, plan.state_v_first, multi_token, nseq)
}

/// What a decode call returns beyond what it wrote into the caller's buffers.
pub struct DecodeResult {
    /// The output, when the call allocated it (`output` was not given).
    pub output: Option<DeviceTensor>,
    /// The returned state tensor, when the call produces one and allocated it (no `final_state`
    /// buffer given). In place, the pool itself is the result and nothing is returned.
    pub final_state: Option<DeviceTensor>,
}

/// The kernel variant a validated call needs (with the shape [`decode_shape`] picks).
pub fn decode_config(plan: &DecodePlan) -> DecodeConfig {
    tuned_config(plan, decode_shape(plan))
}

/// Every variant a call of `plan`'s kind (its dtypes, flags and tensors given) can pick,
/// whatever its batch: the launch shape changes at 8 sequences, past [`MAX_GRID_Z`] (f32
/// state) or twice that (16-bit state), and with several tokens per sequence (which a varlen
/// call may or may not have; a dense call has them when `T > 1`).
pub fn decode_variants(plan: &DecodePlan) -> Vec<DecodeConfig> {
    let multi = plan.total_tokens > plan.n;
    let token_kinds: &[bool] = if plan.varlen { &[false, true] } else { std::slice::from_ref(&multi) };
    let mut out: Vec<DecodeConfig> = vec![];
    for &multi_token in token_kinds {
        for nseq in [1, 8, MAX_GRID_Z + 1, 2 * MAX_GRID_Z + 1] {
            let cfg = tuned_config(plan, shape_for(plan, multi_token, nseq));
            if !out.contains(&cfg) {
                out.push(cfg);
            }
        }
    }
    out
}

pub(crate) fn tuned_config(plan: &DecodePlan, shape: DecodeShape) -> DecodeConfig {
    let writes = match (plan.indices, plan.inplace_final_state, plan.store_final_state) {
        (StateIndexing::None, _, false) => Writes::None,
        (StateIndexing::None, true, true) => Writes::PoolPerSequence,
        (StateIndexing::None, false, true) => Writes::FinalPerSequence,
        (_, true, _) => Writes::PoolPerToken,
        (_, false, _) => Writes::FinalPerToken,
    };
    DecodeConfig {
        dtype: plan.qkv_dtype,
        state_dtype: plan.state_dtype,
        out_dtype: plan.output_dtype,
        v_first: plan.state_v_first,
        gate: plan.gate.kernel(),
        a_log: plan.has_a_log,
        dt_bias: if plan.has_dt_bias { plan.dt_bias_dtype } else { None },
        beta: plan.beta,
        beta_headwise: plan.beta_headwise,
        l2norm: plan.use_qk_l2norm,
        varlen: plan.cu_seqlens_dtype,
        indices: match plan.indices {
            StateIndexing::None => None,
            StateIndexing::PerSequence { dtype } | StateIndexing::PerToken { dtype, .. } => Some(dtype),
        },
        accepted: plan.num_accepted_dtype,
        use_initial_state: plan.use_initial_state,
        writes,
        shape,
    }
}

fn view(ptr: u64, shape: &[usize], dtype: DType, device: usize) -> Result<TensorView, RuntimeError> {
    TensorView::describe(ptr, shape, dtype, device)
}

/// Runs KDA decode on `stream`, mirroring the reference `gated_delta_rule_decode`.
///
/// Validates every argument first (typed errors, nothing launched on a bad call). Allocates only
/// the outputs not given (`output`, and the returned state tensor when `final_state` is absent);
/// with both given it allocates nothing, synchronizes nothing and can be captured in a CUDA graph
/// (load its variants before capturing: [`crate::preload::preload_decode`]; what picks one is
/// listed there). `checked`
/// reads the index tensors back and reports any value out of range before launching (not
/// graph-safe).
///
/// ```
/// use kda_dsl::DType::{BF16, F32, I32};
/// use kda_runtime::decode::{gated_delta_rule_decode, DecodeArgs};
/// use kda_runtime::{DeviceTensor, Gpu, Kernels};
/// # fn main() -> Result<(), kda_runtime::RuntimeError> {
/// if !kda_runtime::gpu_available() {
///     return Ok(()); // needs a GPU
/// }
/// let (gpu, kernels) = (Gpu::new(0)?, Kernels::new());
/// let s = gpu.new_stream()?;
/// let z = |shape: &[usize], d| DeviceTensor::zeros(&gpu, &s, shape, d);
/// // 8 sequences, one token each, 4 heads, a pool of 16 slots updated in place.
/// let (q, k, v, a) = (z(&[8, 1, 4, 128], BF16)?, z(&[8, 1, 4, 128], BF16)?, z(&[8, 1, 4, 128], BF16)?, z(&[8, 1, 4, 128], BF16)?);
/// let (b, out, pool) = (z(&[8, 1, 4], BF16)?, z(&[8, 1, 4, 128], BF16)?, z(&[16, 4, 128, 128], F32)?);
/// let slots = DeviceTensor::from_i64(&gpu, &s, &[8], I32, &[0, 2, 4, 6, 8, 10, -1, -1])?;
/// let views = [q.view(), k.view(), v.view(), a.view(), b.view(), out.view(), pool.view(), slots.view()];
/// let mut args = DecodeArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
/// args.output = Some(&views[5]);
/// args.state = Some(&views[6]);
/// args.state_indices = Some(&views[7]); // -1: padding rows, nothing touched
/// args.inplace_final_state = true;
/// gated_delta_rule_decode(&gpu, &kernels, &s, &args)?;
/// # Ok(())
/// # }
/// ```
pub fn gated_delta_rule_decode(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &DecodeArgs,
) -> Result<DecodeResult, RuntimeError> {
    let plan = plan_decode(args)?;
    launch_plan(gpu, kernels, stream, args, &plan, decode_shape(&plan))
}

/// [`gated_delta_rule_decode`] with an explicit launch shape (for tuning; `rows` must be 16,
/// 32, 64 or 128 (or 2, 4 or 8 with 32 lanes per row), `warps` 1 to 16, `min_blocks` 1 to 32,
/// `stages` 2 to 4, `max_items` 1 to [`MAX_ITEMS`], with the sequences fitting [`MAX_GRID_Z`]
/// blocks of `max_items`, and `lanes_per_row` 4 or 32; `whole_line_stores` is used as given;
/// a shape the kernel cannot lay out is an error from its compilation).
pub fn gated_delta_rule_decode_tuned(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &DecodeArgs,
    shape: DecodeShape,
) -> Result<DecodeResult, RuntimeError> {
    let rows_ok =
        matches!(shape.rows, 16 | 32 | 64 | 128) || (shape.lanes_per_row == 32 && matches!(shape.rows, 2 | 4 | 8));
    if !rows_ok
        || !matches!(shape.lanes_per_row, 4 | 32)
        || !(1..=16).contains(&shape.warps)
        || !(1..=32).contains(&shape.min_blocks)
        || !(2..=4).contains(&shape.stages)
        || !(1..=MAX_ITEMS).contains(&shape.max_items)
    {
        return Err(RuntimeError::Unsupported(format!(
            "decode shape {shape:?}: rows must be 16, 32, 64 or 128 (or 2, 4, 8 with 32 lanes per row), lanes_per_row 4 or \
             32, warps 1 to 16, min_blocks 1 to 32, stages 2 to 4, max_items 1 to {MAX_ITEMS}"
        )));
    }
    let plan = plan_decode(args)?;
    if shape.max_items < MAX_ITEMS && plan.n > shape.max_items * MAX_GRID_Z {
        return Err(RuntimeError::Unsupported(format!(
            "decode shape {shape:?}: {} sequences need more than {MAX_GRID_Z} blocks of {} (use max_items = {MAX_ITEMS})",
            plan.n, shape.max_items
        )));
    }
    launch_plan(gpu, kernels, stream, args, &plan, shape)
}

/// Checks the index tensors (`checked`), allocates the outputs not given and launches.
fn launch_plan(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &DecodeArgs,
    plan: &DecodePlan,
    shape: DecodeShape,
) -> Result<DecodeResult, RuntimeError> {
    if args.checked {
        let get = |t: Option<&TensorView>| t.map(|v| download_i64(v, stream)).transpose();
        let cu = if plan.varlen { get(args.cu_seqlens)? } else { None };
        let idx = get(args.state_indices)?;
        let nat = get(args.num_accepted_tokens)?;
        check_indices(plan, cu.as_deref(), idx.as_deref(), nat.as_deref())?;
    }
    let output = match args.output {
        Some(_) => None,
        None => Some(DeviceTensor::zeros(gpu, stream, &plan.output_shape, plan.output_dtype)?),
    };
    let final_state = match (plan.returned_state, args.final_state) {
        (Some(shape), None) => Some(DeviceTensor::zeros(gpu, stream, &shape, plan.state_dtype)?),
        _ => None,
    };
    if plan.empty {
        return Ok(DecodeResult { output, final_state });
    }
    let out_view = match (&output, args.output) {
        (Some(t), _) => t.view(),
        (None, Some(v)) => *v,
        (None, None) => unreachable!("allocated above"),
    };
    let cfg = tuned_config(plan, shape);
    let ready = kernels.decode(&cfg)?;
    let loaded = ready.loaded(gpu, &kernels.modules)?;
    // One wave of blocks, each taking many sequences; or the config's few per block (the
    // shape rule and the tuned entry keep the grid within `MAX_GRID_Z` then).
    let items = if cfg.shape.max_items == MAX_ITEMS {
        items_per_block(plan.n, blocks_per_sequence(&ready.kernel, plan), loaded.resident_blocks() as usize)
    } else {
        cfg.shape.max_items
    };
    let final_view = final_state.as_ref().map(|t| t.view()).or(args.final_state.copied());
    let bound = kernel_args(args, plan, &cfg, out_view, final_view, items)?;
    launch_planned(gpu, &loaded, stream, &ready.kernel, &ready.binding, &ready.id, &bound, None)?;
    Ok(DecodeResult { output, final_state })
}

/// The blocks the compiled decode kernel launches per sequence group: its grid's x times y,
/// read from the kernel (over the value rows `VD` and the value heads `HV`).
fn blocks_per_sequence(kernel: &kda_dsl::CompiledKernel, plan: &DecodePlan) -> usize {
    let dim = |name: &str| match name {
        "VD" => i64::try_from(plan.v).ok(),
        "HV" => i64::try_from(plan.hv).ok(),
        _ => None,
    };
    let extent = |axis: usize| kernel.grid[axis].eval(&dim).and_then(|n| usize::try_from(n).ok());
    match (extent(0), extent(1)) {
        (Some(x), Some(y)) => x.saturating_mul(y),
        _ => unreachable!("the decode kernel's grid x and y read only VD and HV, which a valid plan bounds"),
    }
}

/// The decode kernel's arguments by name (an array: building them allocates nothing).
pub(crate) type DecodeKernelArgs = [(&'static str, KernelArg); 17];

/// The kernel's arguments for a planned call: the output at `out_view`, the returned state at
/// `final_state` (given or allocated) when there is one, `items` sequences per block.
/// Tensors the config never reads bind as placeholders at q's address, with shapes that agree
/// with the symbols they share; the kernel does not touch them.
pub(crate) fn kernel_args(
    args: &DecodeArgs,
    plan: &DecodePlan,
    cfg: &DecodeConfig,
    out_view: TensorView,
    final_state: Option<TensorView>,
    items: usize,
) -> Result<DecodeKernelArgs, RuntimeError> {
    let dev = args.q.device();
    // Placeholders sit at q's address, which the plan checked aligned when q has elements; an
    // empty q may sit anywhere, so they then take the smallest aligned non-null address (never
    // dereferenced either way).
    let hold = if args.q.numel() > 0 { args.q.ptr() } else { crate::launch::POINTER_ALIGN };
    let (hv, d) = (plan.hv, plan.k);
    let (s1, s2) = (d, d);
    let state_view = match args.state {
        Some(s) => *s,
        None => view(hold, &[plan.pool_slots.max(1), hv, s1, s2], plan.state_dtype, dev)?,
    };
    let final_view = match final_state {
        Some(v) => v,
        None => view(hold, &[1, hv, s1, s2], plan.state_dtype, dev)?,
    };
    let [bb, tt, _, _] = plan.output_shape;
    let b_view = if plan.beta_headwise { *args.b } else { view(args.b.ptr(), &[bb, tt, hv, 1], args.b.dtype(), dev)? };
    let a_log = match args.a_log.filter(|_| cfg.a_log) {
        Some(t) => *t,
        None => view(hold, &[1], DType::F32, dev)?,
    };
    let dt_bias = match (args.dt_bias, cfg.dt_bias) {
        (Some(t), Some(_)) => view(t.ptr(), &[hv, d], t.dtype(), dev)?,
        _ => view(hold, &[1, 1], DType::F32, dev)?,
    };
    let indices = match (args.state_indices, plan.indices) {
        (Some(t), StateIndexing::PerSequence { .. }) => view(t.ptr(), &[plan.n, 1], t.dtype(), dev)?,
        (Some(t), StateIndexing::PerToken { .. }) => *t,
        _ => view(hold, &[1, 1], DType::I32, dev)?,
    };
    let cu = match (args.cu_seqlens, plan.varlen) {
        (Some(t), true) => *t,
        _ => view(hold, &[1], DType::I32, dev)?,
    };
    let nat = match args.num_accepted_tokens {
        Some(t) => *t,
        None => view(hold, &[1], DType::I32, dev)?,
    };
    let lower_bound = plan.gate.lower_bound();
    let nseq = i32::try_from(plan.n)
        .map_err(|_| RuntimeError::bad_argument("q", "fewer than 2^31 sequences", plan.n.to_string()))?;
    use KernelArg::{Tensor as T, F32, I32};
    Ok([
        ("q", T(*args.q)),
        ("k", T(*args.k)),
        ("v", T(*args.v)),
        ("a", T(*args.a)),
        ("b", T(b_view)),
        ("a_log", T(a_log)),
        ("dt_bias", T(dt_bias)),
        ("state", T(state_view)),
        ("final_state", T(final_view)),
        ("state_indices", T(indices)),
        ("cu_seqlens", T(cu)),
        ("accepted", T(nat)),
        ("out", T(out_view)),
        ("NSEQ", I32(nseq)),
        ("ITEMS", I32(items as i32)),
        ("scale", F32(plan.scale)),
        ("lower_bound", F32(lower_bound)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::bind_args;
    use crate::random_calls::{check_random_calls, DTYPES};

    /// Random calls, well-formed or not (0, 1, 2, 3, 127, 129 sequences and tokens; every dtype
    /// in every slot; optional tensors present or absent, of the right shape or not; every flag;
    /// NaN and infinite scalars; misaligned, null and other-device pointers): planning never
    /// panics, and every plan it accepts binds to its kernel.
    #[test]
    fn random_calls_plan_without_panicking_and_accepted_ones_bind() {
        use std::collections::HashMap;
        let mut kernels: HashMap<DecodeConfig, kda_dsl::artifact::CompiledKernel> = HashMap::new();
        let (mut accepted, mut rejected) = (0, 0);
        check_random_calls(0xdec0de, 6_000, |x| {
            let varlen = x.r(3) == 0;
            let b = x.of(&[0, 1, 2, 3, 129]);
            let t = x.of(&[0, 1, 2, 3, 127]);
            let h = x.of(&[1, 2]);
            let hv = h * x.of(&[1, 2]) + usize::from(x.r(12) == 0);
            let d = if x.r(12) == 0 { 64 } else { 128 };
            let dt = if x.r(8) == 0 { x.of(&DTYPES) } else { x.of(&[DType::BF16, DType::F16]) };
            let lead = if varlen { vec![1, b * t] } else { vec![b, t] };
            let n = if varlen { x.of(&[0, 1, 2, 3]) } else { b };
            let with = |tail: &[usize]| [lead.as_slice(), tail].concat();
            let q = x.view(&with(&[h, d]), dt);
            let k_dt = x.mostly(dt);
            let k = x.view(&with(&[h, d]), k_dt);
            let (v_dt, a_dt, b_dt, o_dt) = (x.mostly(dt), x.mostly(dt), x.mostly(dt), x.mostly(dt));
            let v = x.view(&with(&[hv, d]), v_dt);
            let a = x.view(&with(&[hv, d]), a_dt);
            let beta_tail = if x.r(6) == 0 { vec![hv, d] } else { vec![hv] };
            let beta = x.view(&with(&beta_tail), b_dt);
            let state_dt = x.of(&[DType::F32, DType::BF16, DType::F16]);
            let slots = x.of(&[1, 4, 8, n.max(1)]);
            let state = x.view(&[slots, hv, d, d], state_dt);
            let (cu_len, cu_dt) =
                (n + 1 - usize::from(x.r(20) == 0 && n > 0), x.of(&[DType::I32, DType::I64, DType::F32]));
            let cu = x.view(&[cu_len], cu_dt);
            let idx_shape = if x.r(3) == 0 { vec![n, t.max(1)] } else { vec![n] };
            let idx_dt = x.of(&[DType::I32, DType::I64, DType::F32]);
            let idx = x.view(&idx_shape, idx_dt);
            let nat_dt = x.of(&[DType::I32, DType::I64]);
            let nat = x.view(&[n], nat_dt);
            let (al_len, al_dt) = (hv + usize::from(x.r(20) == 0), x.mostly(DType::F32));
            let a_log = x.view(&[al_len], al_dt);
            let db_dt = x.of(&[DType::F32, DType::BF16]);
            let dt_bias = x.view(&[hv * d], db_dt);
            let out = x.view(&with(&[hv, d]), o_dt);
            let (fin_rows, fin_dt) = (x.of(&[n, b * t, 1]), x.mostly(state_dt));
            let fin = x.view(&[fin_rows, hv, d, d], fin_dt);
            let mut args = DecodeArgs::new(&q, &k, &v, &a, &beta);
            args.state = (x.r(5) != 0).then_some(&state);
            args.cu_seqlens = (varlen || x.r(20) == 0).then_some(&cu);
            args.state_indices = (x.r(2) == 0).then_some(&idx);
            args.num_accepted_tokens = (x.r(6) == 0).then_some(&nat);
            args.a_log = (x.r(2) == 0).then_some(&a_log);
            args.dt_bias = (x.r(2) == 0).then_some(&dt_bias);
            args.output = (x.r(3) != 0).then_some(&out);
            args.final_state = (x.r(4) == 0).then_some(&fin);
            let scale = x.of(&[0.1, -1.0, f32::NAN, f32::INFINITY, 0.0]);
            args.scale = (x.r(4) == 0).then_some(scale);
            let lower_bound = x.of(&[-5.0, -1.0, 0.0, f32::NAN]);
            args.lower_bound = (x.r(3) == 0).then_some(lower_bound);
            args.use_qk_l2norm = (x.r(2) == 0).then(|| x.r(2) == 0);
            args.use_gate_in_kernel = (x.r(3) == 0).then(|| x.r(2) == 0);
            args.use_lower_bound = (x.r(2) == 0).then(|| x.r(2) == 0);
            args.apply_beta_sigmoid = (x.r(2) == 0).then(|| x.r(2) == 0);
            args.allow_neg_eigval = (x.r(4) == 0).then(|| x.r(2) == 0);
            args.use_initial_state = (x.r(4) == 0).then(|| x.r(2) == 0);
            args.state_v_first = (x.r(6) == 0).then(|| x.r(2) == 0);
            args.is_varlen = (x.r(10) == 0).then(|| x.r(2) == 0);
            args.store_final_state = x.r(2) == 0;
            args.inplace_final_state = x.r(2) == 0;
            args.state_dtype = (x.r(8) == 0).then(|| x.of(&DTYPES));
            let plan = match std::panic::catch_unwind(|| plan_decode(&args)) {
                Err(_) => panic!("plan_decode panicked"),
                Ok(Err(_)) => {
                    rejected += 1;
                    return Ok(());
                }
                Ok(Ok(plan)) => plan,
            };
            accepted += 1;
            if plan.empty {
                return Ok(());
            }
            let cfg = decode_config(&plan);
            let kernel = kernels.entry(cfg.clone()).or_insert_with(|| {
                kda_dsl::compile(kda_kernels::decode::decode(&cfg).expect("builds"), kda_dsl::Target::Sm80)
                    .expect("compiles")
            });
            let dev = q.device();
            let out_view = match args.output {
                Some(o) => *o,
                None => TensorView::describe(0x9000_0000, &plan.output_shape, plan.output_dtype, dev).expect("a view"),
            };
            let final_view = match (plan.returned_state, args.final_state) {
                (Some(shape), None) => {
                    Some(TensorView::describe(0xa000_0000, &shape, plan.state_dtype, dev).expect("a view"))
                }
                (_, f) => f.copied(),
            };
            let bound = kernel_args(&args, &plan, &cfg, out_view, final_view, 1)
                .unwrap_or_else(|e| panic!("an accepted plan gets no arguments: {e}"));
            bind_args(kernel, &bound).unwrap_or_else(|e| panic!("an accepted plan does not bind ({}): {e}", cfg.key()));
            Ok(())
        });
        eprintln!("accepted {accepted}, rejected {rejected}, {} kernel configs", kernels.len());
        assert!(accepted > 200 && rejected > 2000, "accepted {accepted}, rejected {rejected}");
    }
}
