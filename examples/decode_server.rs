//! How a Rust inference server runs KDA decode: its own cudarc context, stream and buffers
//! (the state pool its cache manager owns, with -1 padding slots for idle batch rows), every
//! variant loaded before capture, one decode step captured in a CUDA graph and replayed, one
//! loop (thread) per device.
//!
//! `cargo run --release --example decode_server` (needs a GPU; says so otherwise).

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use kda::runtime::decode::{gated_delta_rule_decode, DecodeArgs};
use kda::runtime::preload::preload_decode;
use kda::{DType, Gpu, Kernels, RuntimeError, TensorView};

const D: usize = 128;
const HEADS: usize = 16;
/// Batch rows the server decodes per step (some idle: their slot is -1).
const BATCH: usize = 32;
/// Sequences the state pool can hold.
const POOL: usize = 64;

/// One device's decode loop: allocate, preload, capture a step, replay it.
fn serve(ordinal: usize, kernels: &Kernels) -> Result<(), Box<dyn std::error::Error>> {
    // The engine's own context and stream (kda only borrows them).
    let ctx: Arc<CudaContext> = CudaContext::new(ordinal)?;
    let gpu = Gpu::from_context(ctx.clone())?;
    let stream: Arc<CudaStream> = ctx.new_stream()?;
    // The engine's buffers: bf16 activations stored as u16, an f32 state pool, i32 slots.
    let act = |n: usize| stream.alloc_zeros::<u16>(n);
    let (q, k): (CudaSlice<u16>, CudaSlice<u16>) = (act(BATCH * HEADS * D)?, act(BATCH * HEADS * D)?);
    let (v, a) = (act(BATCH * HEADS * D)?, act(BATCH * HEADS * D)?);
    let b = act(BATCH * HEADS)?;
    let mut out = act(BATCH * HEADS * D)?;
    let mut pool: CudaSlice<f32> = stream.alloc_zeros(POOL * HEADS * D * D)?;
    // Rows 0..24 decode sequences in slots 2, 4, 6, ...; rows 24.. are idle (-1: untouched).
    let slots_host: Vec<i32> = (0..BATCH as i32).map(|r| if r < 24 { 2 * r } else { -1 }).collect();
    let slots = stream.clone_htod(&slots_host)?;
    let (a_log, dt_bias): (CudaSlice<f32>, CudaSlice<f32>) =
        (stream.alloc_zeros(HEADS)?, stream.alloc_zeros(HEADS * D)?);

    // Views of those buffers, made before capture and dropped after it (cudarc's event
    // tracking then waits and records outside the capture).
    let tok = [BATCH, 1, HEADS, D];
    let (qv, kv) =
        (TensorView::of_slice(&q, &tok, DType::BF16, &stream)?, TensorView::of_slice(&k, &tok, DType::BF16, &stream)?);
    let (vv, av) =
        (TensorView::of_slice(&v, &tok, DType::BF16, &stream)?, TensorView::of_slice(&a, &tok, DType::BF16, &stream)?);
    let bv = TensorView::of_slice(&b, &[BATCH, 1, HEADS], DType::BF16, &stream)?;
    let outv = TensorView::of_slice_mut(&mut out, &tok, DType::BF16, &stream)?;
    let poolv = TensorView::of_slice_mut(&mut pool, &[POOL, HEADS, D, D], DType::F32, &stream)?;
    let slotv = TensorView::of_slice(&slots, &[BATCH], DType::I32, &stream)?;
    let (alv, dtv) = (
        TensorView::of_slice(&a_log, &[HEADS], DType::F32, &stream)?,
        TensorView::of_slice(&dt_bias, &[HEADS * D], DType::F32, &stream)?,
    );
    let mut args = DecodeArgs::new(&qv, &kv, &vv, &av, &bv);
    args.state = Some(&poolv);
    args.state_indices = Some(&slotv);
    args.inplace_final_state = true;
    args.output = Some(&outv);
    args.a_log = Some(&alv);
    args.dt_bias = Some(&dtv);
    args.use_lower_bound = Some(true);
    args.lower_bound = Some(-5.0);
    args.apply_beta_sigmoid = Some(true);

    // Every variant this kind of call can pick, compiled and loaded: capture meets no JIT.
    let loaded = preload_decode(&gpu, kernels, &args)?;

    // One step captured, then replayed (a real server updates q, k, v, a, b in place between
    // replays; the graph reads them where they are).
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = gated_delta_rule_decode(&gpu, kernels, &stream, &args);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or_else(|| RuntimeError::Unsupported("the step enqueued nothing".into()))?;
    let started = std::time::Instant::now();
    for _ in 0..100 {
        graph.launch()?;
    }
    stream.synchronize()?;
    let us = started.elapsed().as_secs_f64() * 1e6 / 100.0;
    println!("device {ordinal} ({}): {loaded} variants preloaded, 100 graph replays, {us:.1} us per step", gpu.name());
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !kda::gpu_available() {
        println!("no GPU here: this example needs one");
        return Ok(());
    }
    // One Kernels for the process (compiled PTX is shared); a loop per device.
    let kernels = Kernels::new();
    let devices = kda::runtime::device_count()?;
    std::thread::scope(|scope| {
        let loops: Vec<_> = (0..devices)
            .map(|d| {
                scope.spawn({
                    let kernels = &kernels;
                    move || serve(d, kernels).map_err(|e| e.to_string())
                })
            })
            .collect();
        for l in loops {
            if let Err(e) = l.join().expect("a device loop panicked") {
                eprintln!("{e}");
            }
        }
    });
    Ok(())
}
