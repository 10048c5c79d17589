// What the GPU tests share (included with `include!`, so it carries no module of its own):
// deterministic data and one in-place decode step through the public API.

/// Deterministic values in `[-scale/2, scale/2)` (a small LCG: no dependency).
#[allow(dead_code)] // not every GPU test draws random data
fn lcg(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * scale
        })
        .collect()
}

/// Decodes one token per sequence in place: `t` holds q, k, v, a, beta, the output, the state
/// pool and the slots (`state_indices`), in that order.
fn decode_in_place(
    gpu: &kda_runtime::Gpu,
    kernels: &kda_runtime::Kernels,
    stream: &kda_runtime::CudaStream,
    t: [&kda_runtime::DeviceTensor; 8],
) -> Result<(), kda_runtime::RuntimeError> {
    let views = t.map(|x| x.view());
    let mut args = kda_runtime::decode::DecodeArgs::new(&views[0], &views[1], &views[2], &views[3], &views[4]);
    args.output = Some(&views[5]);
    args.state = Some(&views[6]);
    args.state_indices = Some(&views[7]);
    args.inplace_final_state = true;
    kda_runtime::decode::gated_delta_rule_decode(gpu, kernels, stream, &args).map(|_| ())
}
