//! On a GPU, through the public API: batch invariance (a sequence's output and state are
//! bit-identical alone and in a batch of 256 for decode, alone and varlen-packed among others
//! for prefill, on both prefill paths) and isolation (NaN and Inf in one sequence's inputs leave
//! every other sequence's output and state bit-identical; padding slots write zero output rows
//! and, with unused pool slots, keep their bytes); token ranges give the fused kernel's bits,
//! eagerly and from a graph; the split gives the same bits with its states allocated or in the
//! workspace, fused or over prepared operands, eagerly and from a graph. Skips (passes) on
//! machines without a driver.

use kda_dsl::dtype::DType::{self, BF16, F32, I32};
use kda_runtime::chunk::{
    chunk_kda, chunk_kda_tuned, chunk_split_workspace_bytes, chunk_workspace_bytes, plan_chunk, ChunkArgs, ChunkShape,
    ChunkTuning,
};
use kda_runtime::{time_graph_ms, CudaStream, DeviceTensor, Gpu, Kernels, RuntimeError, TensorView};

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

include!("support/gpu_calls.rs");

const D: usize = 128;
/// Query/key heads and value heads (GVA 2).
const H: usize = 2;
const HV: usize = 4;

fn upload(gpu: &Gpu, s: &CudaStream, shape: &[usize], dtype: DType, v: &[f32]) -> Result<DeviceTensor, RuntimeError> {
    DeviceTensor::from_f32(gpu, s, shape, dtype, v)
}

/// `n` rows of `row` values each, taken at `rows` of `all`.
fn gather(all: &[f32], row: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter().flat_map(|&r| all[r * row..(r + 1) * row].iter().copied()).collect()
}

/// Decode inputs for `b` sequences, one token each: q, k, v, a, beta (token rows in order).
struct DecodeInputs {
    b: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    beta: Vec<f32>,
}

impl DecodeInputs {
    fn random(b: usize, seed: u64) -> DecodeInputs {
        DecodeInputs {
            b,
            q: lcg(seed, b * H * D, 1.0),
            k: lcg(seed + 1, b * H * D, 1.0),
            v: lcg(seed + 2, b * HV * D, 1.0),
            a: lcg(seed + 3, b * HV * D, 1.0),
            beta: lcg(seed + 4, b * HV, 1.0),
        }
    }

    /// The inputs of sequences `rows` only, in that order.
    fn rows(&self, rows: &[usize]) -> DecodeInputs {
        DecodeInputs {
            b: rows.len(),
            q: gather(&self.q, H * D, rows),
            k: gather(&self.k, H * D, rows),
            v: gather(&self.v, HV * D, rows),
            a: gather(&self.a, HV * D, rows),
            beta: gather(&self.beta, HV, rows),
        }
    }
}

/// One in-place decode step over `pool` (f32, V-first) with `slots` (-1: padding); the output
/// bytes and the pool's bytes after it.
fn decode(
    gpu: &Gpu,
    kernels: &Kernels,
    x: &DecodeInputs,
    pool: &[f32],
    slots: &[i64],
) -> Result<(Vec<u8>, Vec<u8>), RuntimeError> {
    let s = gpu.new_stream()?;
    let b = x.b;
    let q = upload(gpu, &s, &[b, 1, H, D], BF16, &x.q)?;
    let k = upload(gpu, &s, &[b, 1, H, D], BF16, &x.k)?;
    let v = upload(gpu, &s, &[b, 1, HV, D], BF16, &x.v)?;
    let a = upload(gpu, &s, &[b, 1, HV, D], BF16, &x.a)?;
    let beta = upload(gpu, &s, &[b, 1, HV], BF16, &x.beta)?;
    let out = DeviceTensor::from_f32(gpu, &s, &[b, 1, HV, D], BF16, &vec![7.0; b * HV * D])?;
    let pool_t = upload(gpu, &s, &[pool.len() / (HV * D * D), HV, D, D], F32, pool)?;
    let idx = DeviceTensor::from_i64(gpu, &s, &[b], I32, slots)?;
    decode_in_place(gpu, kernels, &s, [&q, &k, &v, &a, &beta, &out, &pool_t, &idx])?;
    Ok((out.to_bytes(&s)?, pool_t.to_bytes(&s)?))
}

const DECODE_B: usize = 256;
const POOL: usize = 2 * DECODE_B;
const OUT_ROW: usize = HV * D * 2;
const SLOT: usize = HV * D * D * 4;

/// Sequence `i` of the batch uses slot `2i + 1`; the even slots are never named.
fn decode_slots() -> Vec<i64> {
    (0..DECODE_B as i64).map(|i| 2 * i + 1).collect()
}

fn decode_batch_invariance() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let x = DecodeInputs::random(DECODE_B, 11);
    let pool = lcg(17, POOL * HV * D * D, 0.2);
    let slots = decode_slots();
    let (out, after) = decode(&gpu, &kernels, &x, &pool, &slots).expect("the batch");
    for i in [0, 1, 100, 255] {
        let (o1, p1) = decode(&gpu, &kernels, &x.rows(&[i]), &pool, &slots[i..=i]).expect("one sequence");
        let slot = slots[i] as usize;
        assert!(o1 == out[i * OUT_ROW..(i + 1) * OUT_ROW], "sequence {i}: output differs alone and in the batch");
        assert!(
            p1[slot * SLOT..(slot + 1) * SLOT] == after[slot * SLOT..(slot + 1) * SLOT],
            "sequence {i}: state differs alone and in the batch"
        );
    }
}

fn decode_isolation() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let clean = DecodeInputs::random(DECODE_B, 23);
    let pool = lcg(29, POOL * HV * D * D, 0.2);
    let mut slots = decode_slots();
    // Sequence 9 is padding: zero output row, no slot read or written.
    slots[9] = -1;
    let (poisoned_seq, inf_seq) = (7, 200);
    let mut bad = DecodeInputs::random(DECODE_B, 23);
    bad.q[poisoned_seq * H * D] = f32::NAN;
    bad.k[poisoned_seq * H * D + 3] = f32::INFINITY;
    bad.v[poisoned_seq * HV * D + 5] = f32::NAN;
    bad.a[inf_seq * HV * D] = f32::NEG_INFINITY;
    bad.beta[inf_seq * HV] = f32::NAN;
    let (out_clean, pool_clean) = decode(&gpu, &kernels, &clean, &pool, &slots).expect("clean batch");
    let (out_bad, pool_bad) = decode(&gpu, &kernels, &bad, &pool, &slots).expect("poisoned batch");
    let initial: Vec<u8> = pool.iter().flat_map(|x| x.to_le_bytes()).collect();
    for (i, &slot) in slots.iter().enumerate() {
        let row = i * OUT_ROW..(i + 1) * OUT_ROW;
        if i == 9 {
            assert!(out_bad[row].iter().all(|&x| x == 0), "the padding sequence's output row is not zero");
            continue;
        }
        if i == poisoned_seq || i == inf_seq {
            continue;
        }
        assert!(out_bad[row.clone()] == out_clean[row], "sequence {i}: output changed by another sequence's NaN");
        let r = slot as usize * SLOT..(slot as usize + 1) * SLOT;
        assert!(pool_bad[r.clone()] == pool_clean[r], "sequence {i}: state changed by another sequence's NaN");
    }
    // Unused slots, and the slot sequence 9 would have named, keep their bytes.
    for slot in (0..POOL).filter(|s| s % 2 == 0).chain([19]) {
        let r = slot * SLOT..(slot + 1) * SLOT;
        assert!(pool_bad[r.clone()] == initial[r], "slot {slot}: an unused slot was written");
    }
}

/// Prefill inputs for sequences of `lens` tokens, packed in order (token rows).
struct PrefillInputs {
    lens: Vec<usize>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    /// Per sequence, its initial state `[HV, D, D]`.
    init: Vec<f32>,
}

impl PrefillInputs {
    fn random(lens: &[usize], seed: u64) -> PrefillInputs {
        let t: usize = lens.iter().sum();
        // A precomputed gate: a small log decay per element.
        let g = lcg(seed + 3, t * HV * D, 0.2).into_iter().map(|x| -x.abs()).collect();
        PrefillInputs {
            lens: lens.to_vec(),
            q: lcg(seed, t * H * D, 1.0),
            k: lcg(seed + 1, t * H * D, 1.0),
            v: lcg(seed + 2, t * HV * D, 1.0),
            g,
            beta: lcg(seed + 4, t * HV, 1.0),
            init: lcg(seed + 5, lens.len() * HV * D * D, 0.2),
        }
    }

    /// Sequence `n` alone.
    fn sequence(&self, n: usize) -> PrefillInputs {
        self.sequences(n..n + 1)
    }

    /// Sequences `seqs` alone, packed.
    fn sequences(&self, seqs: std::ops::Range<usize>) -> PrefillInputs {
        let start: usize = self.lens[..seqs.start].iter().sum();
        let end: usize = self.lens[..seqs.end].iter().sum();
        let rows: Vec<usize> = (start..end).collect();
        let states: Vec<usize> = seqs.clone().collect();
        PrefillInputs {
            lens: self.lens[seqs].to_vec(),
            q: gather(&self.q, H * D, &rows),
            k: gather(&self.k, H * D, &rows),
            v: gather(&self.v, HV * D, &rows),
            g: gather(&self.g, HV * D, &rows),
            beta: gather(&self.beta, HV, &rows),
            init: gather(&self.init, HV * D * D, &states),
        }
    }
}

/// How a test's prefill call runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// The fused kernel (`ChunkTuning::fused`), no workspace.
    Fused,
    /// The API's path (the two-kernel path for few chains, or with few heads and long calls
    /// the split) in a workspace of `chunk_workspace_bytes`.
    TwoKernel,
    /// As [`Path::TwoKernel`], with the `max_seqlen` hint (the longest sequence).
    Hinted,
    /// The API's path with no workspace argument: the one `Kernels` keeps for the stream,
    /// eager, or (`graph`) sized by `preload_chunk` and replayed from a CUDA graph.
    Kept { graph: bool },
    /// As [`Path::Kept`] (eager), the sequences (all of one length) as a dense batch `[n, L]`.
    DenseBatch,
    /// As [`Path::Kept`], called as an engine on another cudarc calls it: its stream as a raw
    /// handle (`Gpu::borrow_raw_stream`), its buffers as `TensorView::from_raw` views.
    RawHandles,
    /// The two-kernel path in 4 token ranges (`ChunkTuning::ranges`), eager, or captured into
    /// a CUDA graph after one eager call and replayed; one sequence given as a `varlen` call
    /// (`cu_seqlens` `[0, T]`) or dense.
    Ranges { graph: bool, varlen: bool },
    /// The exact split every [`SPLIT`] tokens (`ChunkTuning::split`): its tables in the
    /// workspace kda keeps, or (`workspace`) in one of `chunk_split_workspace_bytes`, its
    /// segments' operands `prepared` or not, eager or (with a workspace) replayed from a graph.
    Split { workspace: bool, prepared: bool, graph: bool },
}

/// Tokens per segment of [`Path::Split`].
const SPLIT: usize = 64;

/// One prefill call: dense `[1, T]` for one sequence, varlen-packed (i32 `cu_seqlens`) for
/// more (dense `[n, L]` for [`Path::DenseBatch`]), along `path`. The output and final-state
/// bytes.
fn prefill(gpu: &Gpu, kernels: &Kernels, x: &PrefillInputs, path: Path) -> Result<(Vec<u8>, Vec<u8>), RuntimeError> {
    let s = gpu.new_stream()?;
    let (t, n) = (x.lens.iter().sum::<usize>(), x.lens.len());
    // The packed tokens are the dense batch's rows one after another.
    let (rows, t) = if path == Path::DenseBatch { (n, t / n) } else { (1, t) };
    let q = upload(gpu, &s, &[rows, t, H, D], BF16, &x.q)?;
    let k = upload(gpu, &s, &[rows, t, H, D], BF16, &x.k)?;
    let v = upload(gpu, &s, &[rows, t, HV, D], BF16, &x.v)?;
    let g = upload(gpu, &s, &[rows, t, HV, D], BF16, &x.g)?;
    let beta = upload(gpu, &s, &[rows, t, HV], BF16, &x.beta)?;
    let init = upload(gpu, &s, &[n, HV, D, D], F32, &x.init)?;
    let out = DeviceTensor::from_f32(gpu, &s, &[rows, t, HV, D], BF16, &vec![7.0; rows * t * HV * D])?;
    let fin = DeviceTensor::from_f32(gpu, &s, &[n, HV, D, D], F32, &vec![7.0; n * HV * D * D])?;
    let mut bounds = vec![0i64];
    for l in &x.lens {
        bounds.push(bounds.last().copied().unwrap_or(0) + *l as i64);
    }
    let cu = DeviceTensor::from_i64(gpu, &s, &[n + 1], I32, &bounds)?;
    let views = [q.view(), k.view(), v.view(), g.view(), beta.view(), init.view(), out.view(), fin.view(), cu.view()];
    let mut args = ChunkArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
    args.initial_state = Some(&views[5]);
    args.output = Some(&views[6]);
    args.output_final_state = true;
    args.final_state = Some(&views[7]);
    let varlen = (n > 1 && path != Path::DenseBatch) || matches!(path, Path::Ranges { varlen: true, .. });
    args.cu_seqlens = varlen.then_some(&views[8]);
    args.max_seqlen = (path == Path::Hinted).then(|| x.lens.iter().copied().max().unwrap_or(0));
    let ws_bytes = match path {
        Path::Fused
        | Path::Kept { .. }
        | Path::DenseBatch
        | Path::RawHandles
        | Path::Split { workspace: false, .. } => None,
        Path::Split { workspace: true, .. } => Some(chunk_split_workspace_bytes(&plan_chunk(&args)?, SPLIT)?),
        Path::TwoKernel | Path::Hinted | Path::Ranges { .. } => {
            Some(chunk_workspace_bytes(&plan_chunk(&args)?, &gpu.limits()))
        }
    };
    let ws_tensor = ws_bytes.map(|bytes| DeviceTensor::zeros(gpu, &s, &[bytes.div_ceil(4).max(1)], F32)).transpose()?;
    let ws_view = ws_tensor.as_ref().map(|w| w.view());
    args.workspace = ws_view.as_ref();
    match path {
        Path::Fused => {
            chunk_kda_tuned(gpu, kernels, &s, &args, ChunkTuning::fused(&plan_chunk(&args)?))?;
        }
        Path::TwoKernel | Path::Hinted | Path::Kept { graph: false } | Path::DenseBatch => {
            chunk_kda(gpu, kernels, &s, &args)?;
        }
        Path::RawHandles => {
            // SAFETY: `s` lives to the end of this function, past every use of `raw`.
            let raw = unsafe { gpu.borrow_raw_stream(s.cu_stream() as *mut std::ffi::c_void) }?;
            // SAFETY: views of this function's live tensors, as an engine's allocator hands them out.
            let from_raw = |v: &TensorView| unsafe { TensorView::from_raw(v.ptr(), v.shape(), v.dtype(), v.device()) };
            let r: Vec<TensorView> = views.iter().map(from_raw).collect::<Result<_, _>>()?;
            let mut raw_args = ChunkArgs::new(&r[0], &r[1], &r[2], &r[3], &r[4]);
            raw_args.initial_state = Some(&r[5]);
            raw_args.output = Some(&r[6]);
            raw_args.output_final_state = true;
            raw_args.final_state = Some(&r[7]);
            raw_args.cu_seqlens = args.cu_seqlens.map(|_| &r[8]);
            chunk_kda(gpu, kernels, &raw, &raw_args)?;
        }
        Path::Kept { graph: true } => {
            kda_runtime::preload::preload_chunk(gpu, kernels, &s, &args)?;
            let kept = kernels.kept_workspace_bytes(gpu, &s);
            time_graph_ms(gpu, &s, 3, || chunk_kda(gpu, kernels, &s, &args).map(|_| ()))?;
            assert_eq!(kernels.kept_workspace_bytes(gpu, &s), kept, "the preloaded workspace sufficed");
        }
        Path::Ranges { graph, .. } | Path::Split { graph, .. } => {
            let plan = plan_chunk(&args)?;
            let tune = match path {
                Path::Split { prepared, .. } => {
                    // The fused kernel's shape either way: its in-kernel preparation reduces
                    // in an order set by its warps.
                    let shape = if prepared { ChunkShape::PREPARED } else { ChunkShape::FUSED };
                    ChunkTuning {
                        shape,
                        split: Some(SPLIT),
                        prepared,
                        prep_blocks: None,
                        ranges: None,
                        ..ChunkTuning::for_call(&plan, &gpu.limits())
                    }
                }
                _ => ChunkTuning { ranges: Some(4), prepared: true, ..ChunkTuning::for_call(&plan, &gpu.limits()) },
            };
            let call = || chunk_kda_tuned(gpu, kernels, &s, &args, tune).map(|_| ());
            if graph {
                // One eager call, the capture (which runs nothing), then the replays.
                time_graph_ms(gpu, &s, 3, call)?;
            } else {
                call()?;
            }
        }
    }
    Ok((out.to_bytes(&s)?, fin.to_bytes(&s)?))
}

/// Asserts that a call's outputs and final states (`prefill`'s bytes) are `want`'s, bit for
/// bit; `what` names the call, `whose` the one it is compared with.
fn assert_same_bits(got: &(Vec<u8>, Vec<u8>), want: &(Vec<u8>, Vec<u8>), what: &str, whose: &str) {
    assert!(got.0 == want.0, "{what}: outputs differ from {whose}");
    assert!(got.1 == want.1, "{what}: final states differ from {whose}");
}

/// Lengths around the chunk size: shorter than a chunk, one token, whole chunks and ragged.
const LENS: [usize; 6] = [37, 200, 1, 129, 64, 16];
const TOKEN_ROW: usize = HV * D * 2;
const STATE: usize = HV * D * D * 4;

/// Sequence `n`'s output rows in a packed call's output.
fn token_rows(lens: &[usize], n: usize) -> std::ops::Range<usize> {
    let start: usize = lens[..n].iter().sum();
    start * TOKEN_ROW..(start + lens[n]) * TOKEN_ROW
}

fn prefill_batch_invariance() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let x = PrefillInputs::random(&LENS, 31);
    // With the split, 200 and 129 tokens are segments of 64 and the rest (4 and 3); the
    // others stay whole.
    let split = Path::Split { workspace: true, prepared: true, graph: false };
    for path in [Path::Fused, Path::TwoKernel, split] {
        let (out, fin) = prefill(&gpu, &kernels, &x, path).expect("packed");
        for n in 0..LENS.len() {
            let (o1, f1) = prefill(&gpu, &kernels, &x.sequence(n), path).expect("alone");
            assert!(o1 == out[token_rows(&LENS, n)], "{path:?}: sequence {n}: output differs alone and packed");
            assert!(
                f1 == fin[n * STATE..(n + 1) * STATE],
                "{path:?}: sequence {n}: final state differs alone and packed"
            );
        }
    }
}

/// The API's default across the chain count at which it turns from the two-kernel path to the
/// fused kernel (the device's SM count): a sequence alone (4 chains) and packed among enough
/// others that the call takes the fused kernel gives the same bits. Both defaults must round
/// alike, on every device (so the default never picks a kernel that rounds otherwise by the
/// batch; varlen, these calls never take the sm_90a one, which a dense batch may:
/// [`a_dense_batch_gives_one_set_of_bits_on_every_default_path`]).
fn the_default_gives_one_set_of_bits_on_both_sides_of_the_chain_count() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let nseq = gpu.limits().sm_count / HV + 2;
    let lens: Vec<usize> = (0..nseq).map(|i| LENS[i % LENS.len()]).collect();
    let x = PrefillInputs::random(&lens, 37);
    let (out, fin) = prefill(&gpu, &kernels, &x, Path::TwoKernel).expect("packed");
    for n in [0, 1, 3, nseq - 1] {
        let alone = prefill(&gpu, &kernels, &x.sequence(n), Path::TwoKernel).expect("alone");
        assert!(alone.0 == out[token_rows(&lens, n)], "sequence {n}: output differs alone and among {nseq}");
        assert!(alone.1 == fin[n * STATE..(n + 1) * STATE], "sequence {n}: final state differs alone and among {nseq}");
    }
}

/// A dense batch's default path by its chains (`DefaultPath`): on 9.0 the two-kernel path up to
/// three fifths of the SMs, the sm_90a kernel with two producer warpgroups up to one chain an
/// SM, the sm_80 fused kernel above (elsewhere the two-kernel path up to one an SM). A sequence
/// gives the same bits alone and in a batch on each side of both counts.
fn a_dense_batch_gives_one_set_of_bits_on_every_default_path() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let limits = gpu.limits();
    let prepared = kda_runtime::chunk::prepared_max_chains(&limits) / HV;
    let most = limits.sm_count / HV + 2;
    let x = PrefillInputs::random(&vec![100; most], 59);
    let alone: Vec<_> =
        (0..most).map(|n| prefill(&gpu, &kernels, &x.sequence(n), Path::DenseBatch).expect("alone")).collect();
    for b in [prepared, prepared + 1, limits.sm_count / HV, most] {
        let batch = x.sequences(0..b);
        let (out, fin) = prefill(&gpu, &kernels, &batch, Path::DenseBatch).expect("a dense batch");
        let lens = &batch.lens;
        for n in [0, b / 2, b - 1] {
            assert!(alone[n].0 == out[token_rows(lens, n)], "sequence {n}: output differs alone and among {b}");
            let state = &fin[n * STATE..(n + 1) * STATE];
            assert!(alone[n].1 == state, "sequence {n}: final state differs alone and among {b}");
        }
    }
}

fn prefill_isolation() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let clean = PrefillInputs::random(&LENS, 37);
    let mut bad = PrefillInputs::random(&LENS, 37);
    // NaN and Inf in sequence 1 (tokens 37 ..) and in the last token of sequence 3.
    let s1 = LENS[0];
    bad.q[s1 * H * D] = f32::NAN;
    bad.k[(s1 + 20) * H * D + 1] = f32::INFINITY;
    bad.v[(s1 + 199) * HV * D] = f32::NAN;
    let s3_last: usize = LENS[..4].iter().sum::<usize>() - 1;
    bad.g[s3_last * HV * D] = f32::NEG_INFINITY;
    bad.beta[s3_last * HV] = f32::NAN;
    for path in [Path::Fused, Path::TwoKernel, Path::Split { workspace: true, prepared: true, graph: false }] {
        let (out_clean, fin_clean) = prefill(&gpu, &kernels, &clean, path).expect("clean");
        let (out_bad, fin_bad) = prefill(&gpu, &kernels, &bad, path).expect("poisoned");
        for n in [0, 2, 4, 5] {
            let rows = token_rows(&LENS, n);
            assert!(out_bad[rows.clone()] == out_clean[rows], "sequence {n}: output changed by another's NaN");
            let st = n * STATE..(n + 1) * STATE;
            assert!(fin_bad[st.clone()] == fin_clean[st], "sequence {n}: final state changed by another's NaN");
        }
    }
}

/// Token ranges (the two-kernel path cut into 4 ranges, chains on a second stream) give the bits
/// of the fused kernel, eagerly and replayed from a CUDA graph, dense and as a varlen call of
/// the one sequence: 1000 tokens.
fn prefill_in_token_ranges_is_bit_identical() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let x = PrefillInputs::random(&[1000], 41);
    let fused = prefill(&gpu, &kernels, &x, Path::Fused).expect("fused");
    for (graph, varlen) in [(false, false), (true, false), (false, true), (true, true)] {
        let ranges = prefill(&gpu, &kernels, &x, Path::Ranges { graph, varlen }).expect("in token ranges");
        assert_same_bits(&ranges, &fused, &format!("graph {graph}, varlen {varlen}"), "the fused kernel's");
    }
}

/// A varlen call of few heads and more than 8192 tokens takes the split's path when given a
/// workspace, though no sequence here is long enough to split, unless its `max_seqlen` hint
/// says so (then the two-kernel path alone): both give the fused kernel's bits, since a
/// sequence left whole keeps them.
fn a_max_seqlen_hint_changes_no_bits() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let x = PrefillInputs::random(&[5000, 37, 4100], 47);
    let fused = prefill(&gpu, &kernels, &x, Path::Fused).expect("fused");
    for path in [Path::TwoKernel, Path::Hinted] {
        let got = prefill(&gpu, &kernels, &x, path).expect("with a workspace");
        assert_same_bits(&got, &fused, &format!("{path:?}"), "the fused kernel's");
    }
}

/// A call without a workspace runs the path a call with one runs, with its bits: one long
/// sequence (the two-kernel path in token ranges) and a varlen batch with one sequence past the
/// split's threshold, eager and from a graph after `preload_chunk`. Under capture, a kept
/// workspace too small for the call is an error naming `workspace`, and nothing is launched.
fn a_call_without_a_workspace_runs_the_fast_path_with_its_bits() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    for lens in [&[20000][..], &[9000, 37, 4100]] {
        let x = PrefillInputs::random(lens, 53);
        let given = prefill(&gpu, &kernels, &x, Path::TwoKernel).expect("with a workspace");
        for graph in [false, true] {
            let kept = prefill(&gpu, &kernels, &x, Path::Kept { graph }).expect("without one");
            assert_same_bits(&kept, &given, &format!("{lens:?}, graph {graph}"), "the call given a workspace");
        }
    }
    // An engine on another cudarc: raw stream handle and raw views, the same bits.
    let x = PrefillInputs::random(&[9000, 37, 4100], 53);
    let given = prefill(&gpu, &kernels, &x, Path::TwoKernel).expect("with a workspace");
    let raw = prefill(&gpu, &kernels, &x, Path::RawHandles).expect("through raw handles");
    assert_same_bits(&raw, &given, "raw handles", "the call given a workspace");
    // A stream of another context is refused by name.
    let other = cudarc::driver::CudaContext::new_non_primary(0, 0).expect("a context");
    let foreign = other.new_stream().expect("a stream");
    // SAFETY: `foreign` outlives the call, which refuses it.
    let e =
        unsafe { gpu.borrow_raw_stream(foreign.cu_stream() as *mut std::ffi::c_void) }.expect_err("another context");
    assert!(e.to_string().contains("stream"), "{e}");
    gpu.context().bind_to_thread().expect("the Gpu's context again");
    // A fresh stream has no kept workspace: capturing a call that needs one is refused.
    let s = gpu.new_stream().expect("a stream");
    let t = 4096;
    let z = |shape: &[usize], d| DeviceTensor::zeros(&gpu, &s, shape, d).expect("zeros");
    let (q, k, v, g) =
        (z(&[1, t, H, D], BF16), z(&[1, t, H, D], BF16), z(&[1, t, HV, D], BF16), z(&[1, t, HV, D], BF16));
    let (beta, out) = (z(&[1, t, HV], BF16), z(&[1, t, HV, D], BF16));
    let views = [q.view(), k.view(), v.view(), g.view(), beta.view(), out.view()];
    let mut args = ChunkArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
    args.output = Some(&views[5]);
    let cfg = kda_runtime::chunk::chunk_config(&plan_chunk(&args).expect("a call"), &gpu.limits());
    kernels.chunk(&cfg, kda_runtime::Target::Sm80).expect("compiles");
    s.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("capture");
    let e = chunk_kda(&gpu, &kernels, &s, &args).map(|_| ()).expect_err("no workspace to grow under capture");
    let _ = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    assert!(e.to_string().contains("workspace") && e.to_string().contains("capture"), "{e}");
    assert_eq!(kernels.kept_workspace_bytes(&gpu, &s), 0);
}

/// The split gives the same bits whether its states are allocated by the call or live in the
/// caller's workspace, over prepared operands or not (the two-kernel path's bits are the fused
/// kernel's), and replayed from a CUDA graph (allocation-free with a workspace): one sequence
/// of 1024 tokens in 16 segments of 64. It stays near the unsplit call (not bit-identical).
fn the_split_gives_one_set_of_bits_on_every_path() {
    if skip_without_gpu() {
        return;
    }
    let (gpu, kernels) = (Gpu::new(0).expect("a GPU"), Kernels::new());
    let x = PrefillInputs::random(&[1024], 43);
    let allocated = prefill(&gpu, &kernels, &x, Path::Split { workspace: false, prepared: false, graph: false })
        .expect("split, states allocated");
    for (prepared, graph) in [(false, false), (true, false), (true, true)] {
        let path = Path::Split { workspace: true, prepared, graph };
        let got = prefill(&gpu, &kernels, &x, path).expect("split, states in the workspace");
        assert_same_bits(&got, &allocated, &format!("{path:?}"), "the split with allocated states");
    }
    let unsplit = prefill(&gpu, &kernels, &x, Path::Fused).expect("fused");
    // Outputs are bf16, final states f32.
    let values = |bytes: &[u8], bf16: bool| -> Vec<f32> {
        match bf16 {
            true => bytes.chunks(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            false => bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        }
    };
    for (what, a, b, bf16) in
        [("outputs", &allocated.0, &unsplit.0, true), ("final states", &allocated.1, &unsplit.1, false)]
    {
        let (a, b) = (values(a, bf16), values(b, bf16));
        let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let scale = b.iter().map(|y| y.abs()).fold(0f32, f32::max);
        assert!(a.iter().all(|v| v.is_finite()) && err <= 2e-2 * scale, "{what}: {err} apart, scale {scale}");
    }
}

fn main() {
    gpu_test_main(
        &[
            ("decode_batch_invariance", decode_batch_invariance),
            ("decode_isolation", decode_isolation),
            ("prefill_batch_invariance", prefill_batch_invariance),
            ("prefill_isolation", prefill_isolation),
            (
                "the_default_gives_one_set_of_bits_on_both_sides_of_the_chain_count",
                the_default_gives_one_set_of_bits_on_both_sides_of_the_chain_count,
            ),
            (
                "a_dense_batch_gives_one_set_of_bits_on_every_default_path",
                a_dense_batch_gives_one_set_of_bits_on_every_default_path,
            ),
            ("prefill_in_token_ranges_is_bit_identical", prefill_in_token_ranges_is_bit_identical),
            ("a_max_seqlen_hint_changes_no_bits", a_max_seqlen_hint_changes_no_bits),
            (
                "a_call_without_a_workspace_runs_the_fast_path_with_its_bits",
                a_call_without_a_workspace_runs_the_fast_path_with_its_bits,
            ),
            ("the_split_gives_one_set_of_bits_on_every_path", the_split_gives_one_set_of_bits_on_every_path),
        ],
        &[],
        &[],
    )
}
