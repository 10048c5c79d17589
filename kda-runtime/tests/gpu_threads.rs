//! On a GPU: determinism (two runs, the same bits), and two threads sharing one `Kernels`, each
//! on its own stream, one calling decode and the other prefill on their own data, starting from
//! an empty cache (so both compile and load variants at once): the same bits as the same calls
//! made one after the other, and no deadlock. Skips (passes) on machines without a driver.

use kda_dsl::dtype::DType::{BF16, F32, I32};
use kda_runtime::chunk::{chunk_kda, ChunkArgs};
use kda_runtime::{DeviceTensor, Gpu, Kernels, RuntimeError};

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

include!("support/gpu_calls.rs");

const D: usize = 128;

fn random(gpu: &Gpu, s: &kda_runtime::CudaStream, shape: &[usize], seed: u64) -> Result<DeviceTensor, RuntimeError> {
    DeviceTensor::from_f32(gpu, s, shape, BF16, &lcg(seed, shape.iter().product(), 1.0))
}

/// One decode call (8 sequences, a pool of 16) on a fresh stream; the output and pool bytes.
fn decode_call(gpu: &Gpu, kernels: &Kernels) -> Result<Vec<u8>, RuntimeError> {
    let s = gpu.new_stream()?;
    let tok = [8, 1, 4, D];
    let (q, k, v, a) =
        (random(gpu, &s, &tok, 1)?, random(gpu, &s, &tok, 2)?, random(gpu, &s, &tok, 3)?, random(gpu, &s, &tok, 4)?);
    let b = random(gpu, &s, &[8, 1, 4], 5)?;
    let out = DeviceTensor::zeros(gpu, &s, &tok, BF16)?;
    let pool = DeviceTensor::zeros(gpu, &s, &[16, 4, D, D], F32)?;
    let slots = DeviceTensor::from_i64(gpu, &s, &[8], I32, &[1, 3, 5, 7, 9, 11, 13, 15])?;
    decode_in_place(gpu, kernels, &s, [&q, &k, &v, &a, &b, &out, &pool, &slots])?;
    Ok([out.to_bytes(&s)?, pool.to_bytes(&s)?].concat())
}

/// One prefill call (2 sequences of 100 tokens) on a fresh stream; the output and final states.
fn prefill_call(gpu: &Gpu, kernels: &Kernels) -> Result<Vec<u8>, RuntimeError> {
    let s = gpu.new_stream()?;
    let tok = [2, 100, 4, D];
    let (q, k, v, g) =
        (random(gpu, &s, &tok, 6)?, random(gpu, &s, &tok, 7)?, random(gpu, &s, &tok, 8)?, random(gpu, &s, &tok, 9)?);
    let beta = random(gpu, &s, &[2, 100, 4], 10)?;
    let out = DeviceTensor::zeros(gpu, &s, &tok, BF16)?;
    let fin = DeviceTensor::zeros(gpu, &s, &[2, 4, D, D], F32)?;
    let views = [q.view(), k.view(), v.view(), g.view(), beta.view(), out.view(), fin.view()];
    let mut args = ChunkArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
    args.output = Some(&views[5]);
    args.output_final_state = true;
    args.final_state = Some(&views[6]);
    chunk_kda(gpu, kernels, &s, &args)?;
    Ok([out.to_bytes(&s)?, fin.to_bytes(&s)?].concat())
}

fn threads_sharing_kernels_get_the_serial_bits() {
    if skip_without_gpu() {
        return;
    }
    let gpu = Gpu::new(0).expect("a GPU");
    let serial = Kernels::new();
    let want = (decode_call(&gpu, &serial).expect("decode"), prefill_call(&gpu, &serial).expect("prefill"));
    let shared = Kernels::new();
    let got = std::thread::scope(|scope| {
        let d = scope.spawn(|| decode_call(&gpu, &shared));
        let p = scope.spawn(|| prefill_call(&gpu, &shared));
        (d.join().expect("decode thread").expect("decode"), p.join().expect("prefill thread").expect("prefill"))
    });
    assert!(got.0 == want.0, "decode: the concurrent call's bits differ");
    assert!(got.1 == want.1, "prefill: the concurrent call's bits differ");
}

/// Two runs of the same decode call and the same prefill call give the same bits.
fn decode_and_prefill_determinism() {
    if skip_without_gpu() {
        return;
    }
    let gpu = Gpu::new(0).expect("a GPU");
    let kernels = Kernels::new();
    assert!(decode_call(&gpu, &kernels).expect("decode") == decode_call(&gpu, &kernels).expect("decode"));
    assert!(prefill_call(&gpu, &kernels).expect("prefill") == prefill_call(&gpu, &kernels).expect("prefill"));
}

fn main() {
    gpu_test_main(
        &[
            ("threads_sharing_kernels_get_the_serial_bits", threads_sharing_kernels_get_the_serial_bits),
            ("decode_and_prefill_determinism", decode_and_prefill_determinism),
        ],
        &[],
        &[],
    )
}
