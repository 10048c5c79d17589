//! Compiling and loading ahead of time every variant a kind of call can pick, so that no call,
//! and no CUDA graph capture, meets a first compile or a driver JIT.
//!
//! What picks a variant, in one place:
//! - decode ([`decode_variants`]): the dtypes (inputs, state, output), the gate and beta rules,
//!   which optional tensors are given (`A_log`, `dt_bias`, `cu_seqlens`, `state_indices`,
//!   `num_accepted_tokens`), the state layout and how the final state is written; then a launch
//!   shape by whether some sequence has several tokens, fewer than 8 sequences or more, and more
//!   than 65535 (f32 state) or 131070 (16-bit state) sequences
//!   (the table of [`kda_kernels::decode::DecodeCallKind`], [`kda_kernels::decode::DecodeShape::for_call`]);
//! - prefill ([`chunk_variants`]): the dtypes, the gate rule, l2norm, `cu_seqlens` and its
//!   dtype, the initial and final states (and the pool's index dtypes); the two-kernel path for
//!   at most [`prepared_max_chains`] (sequence, value head) chains, which adds the chain over a
//!   prepared workspace and its preparation kernel, and for a call that can take token ranges
//!   on the device the ranges' later form (from the carried state) and, varlen, the dense forms
//!   of both with their preparation (the ranges are dense calls); with at most
//!   [`SPLIT_MAX_VALUE_HEADS`] value heads, the long-sequence split's kernels
//!   ([`chunk_split_variants`]); on compute capability 9.0 a dense call's sm_90a fused kernel
//!   with two producer warpgroups ([`chunk_hopper_variant`]); a call that can take token ranges
//!   or the split also needs the thread's highest-priority stream, which is created here. A
//!   tuning the caller picks (other ranges, shapes or operands) compiles its own on first use.

use crate::chunk::{
    chunk_hopper_variant, chunk_split_variants, chunk_variants, chunk_workspace_bound, may_take_ranges, plan_chunk,
    ChunkArgs,
};
#[cfg(doc)]
use crate::chunk::{prepared_max_chains, SPLIT_MAX_VALUE_HEADS};
use crate::decode::{decode_variants, plan_decode, DecodeArgs};
use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::kernels::{Kernels, Ready};
use cudarc::driver::CudaStream;
use kda_dsl::Target;

/// Compiles and loads on `gpu` every decode variant a call like `args` can pick (the same
/// dtypes, flags and optional tensors; any batch size, and for varlen calls one or several
/// tokens per sequence). Returns how many variants that is. Nothing is launched.
pub fn preload_decode(gpu: &Gpu, kernels: &Kernels, args: &DecodeArgs) -> Result<usize, RuntimeError> {
    let plan = plan_decode(args)?;
    let variants = decode_variants(&plan);
    for cfg in &variants {
        load(gpu, kernels, &*kernels.decode(cfg)?)?;
    }
    Ok(variants.len())
}

/// Compiles and loads on `gpu` every prefill variant a call like `args` can pick (the same
/// dtypes, flags and optional tensors; any batch), and, when `args` gives no workspace, grows
/// the workspace `kernels` keeps for `stream` to [`chunk_workspace_bound`] of `args`' call: then
/// every call on `stream` with at most its tokens, sequences and value heads that gives no
/// workspace runs without allocating (call it before the engine profiles its free memory,
/// with its largest call; [`Kernels::kept_workspace_bytes`] tells the size). Returns how many
/// kernels it loaded. Nothing is launched. When such a call can take token ranges or the
/// split, it also creates the calling thread's highest-priority stream
/// ([`Gpu::high_priority_stream`]), so that the thread can capture the call into a CUDA graph
/// at once.
pub fn preload_chunk(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    args: &ChunkArgs,
) -> Result<usize, RuntimeError> {
    let plan = plan_chunk(args)?;
    if args.workspace.is_none() {
        let bound = chunk_workspace_bound(plan.total_tokens, plan.nseq, plan.value_heads);
        if bound > 0 {
            kernels.kept_workspace(gpu, stream, bound)?;
        }
    }
    let split = chunk_split_variants(&plan);
    let device = gpu.limits();
    if may_take_ranges(&plan, &device) || split.is_some() {
        gpu.high_priority_stream()?;
    }
    let (mut chains, mut preps) = chunk_variants(&plan, &device);
    let mut loaded = 0;
    if let Some(c) = split {
        chains.extend([c.transition, c.from_zeros, c.output]);
        preps.extend(c.prep);
        load(gpu, kernels, &*kernels.chunk_segments(&c.segments)?)?;
        load(gpu, kernels, &*kernels.chunk_merge(&c.merge)?)?;
        loaded += 2;
        if let Some(f) = &c.finish {
            load(gpu, kernels, &*kernels.chunk_finish(f)?)?;
            loaded += 1;
        }
    }
    for cfg in &chains {
        load(gpu, kernels, &*kernels.chunk(cfg, Target::Sm80)?)?;
    }
    if let Some(cfg) = chunk_hopper_variant(&plan, &gpu.limits()) {
        load(gpu, kernels, &*kernels.chunk(&cfg, Target::Sm90a)?)?;
        loaded += 1;
    }
    for p in &preps {
        load(gpu, kernels, &*kernels.chunk_prep(p)?)?;
    }
    Ok(loaded + chains.len() + preps.len())
}

fn load(gpu: &Gpu, kernels: &Kernels, ready: &Ready) -> Result<(), RuntimeError> {
    ready.loaded(gpu, &kernels.modules).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::testing::tv;
    use crate::device::DeviceLimits;
    use kda_dsl::DType::{BF16, F16, F32, I32};

    /// Every kernel a prefill call can pick (the chains, preparations and the split's passes of
    /// calls of each kind; on 9.0 the sm_90a kernel of dense ones), and every shipped variant, fits
    /// an A100, an RTX 3090 (99 KB of shared memory per block), an L40S and an H200: what
    /// `Ready::fits` checks before loading.
    #[test]
    fn every_variant_a_call_can_pick_fits_every_device() {
        let kernels = Kernels::new();
        let devices = [DeviceLimits::A100, DeviceLimits::RTX_3090, DeviceLimits::L40S, DeviceLimits::H200];
        let check = |ready: &Ready| {
            for d in &devices {
                ready.fits(d).unwrap_or_else(|e| panic!("{}: {e}", ready.id));
            }
        };
        // (dtype, value heads, tokens, varlen, pool, gate, f32 final states)
        for (dtype, hv, t, varlen, pool, gate) in [
            (BF16, 32, 32768, false, false, true),
            (BF16, 8, 32768, false, false, true),
            (BF16, 8, 20000, true, true, true),
            (F16, 4, 100, false, false, false),
            (BF16, 32, 300, true, true, false),
        ] {
            let lead = [1, t];
            let mk = |id: u64, tail: &[usize]| tv(id << 20, &[&lead[..], tail].concat(), dtype);
            let (q, k, v, g, beta) =
                (mk(1, &[2, 128]), mk(2, &[2, 128]), mk(3, &[hv, 128]), mk(4, &[hv, 128]), mk(5, &[hv]));
            let (a_log, dt_bias) = (tv(6 << 20, &[hv], F32), tv(7 << 20, &[hv, 128], F32));
            let cu = tv(8 << 20, &[2], I32);
            let (init, fin) =
                (tv(9 << 20, &[if pool { 4 } else { 1 }, hv, 128, 128], F32), tv(10 << 20, &[1, hv, 128, 128], F32));
            let (slots, has) = (tv(11 << 20, &[1], I32), tv(12 << 20, &[1], I32));
            let mut args = ChunkArgs::new(&q, &k, &v, &g, &beta);
            args.cu_seqlens = varlen.then_some(&cu);
            if gate {
                args.a_log = Some(&a_log);
                args.dt_bias = Some(&dt_bias);
            }
            args.initial_state = Some(&init);
            if pool {
                args.state_indices = Some(&slots);
                args.has_initial_state = Some(&has);
            } else {
                args.output_final_state = true;
                args.final_state = Some(&fin);
            }
            let plan = plan_chunk(&args).expect("a valid call");
            let (chains, preps) = chunk_variants(&plan, &DeviceLimits::H200);
            chains.iter().for_each(|c| check(&kernels.chunk(c, Target::Sm80).expect("compiles")));
            // The sm_90a kernel a dense call takes on 9.0 fits the H200 (and the H100).
            if let Some(c) = chunk_hopper_variant(&plan, &DeviceLimits::H200) {
                kernels.chunk(&c, Target::Sm90a).expect("compiles").fits(&DeviceLimits::H200).expect("fits an H200");
            }
            preps.iter().for_each(|p| check(&kernels.chunk_prep(p).expect("compiles")));
            if let Some(s) = chunk_split_variants(&plan) {
                check(&kernels.chunk_segments(&s.segments).expect("compiles"));
                check(&kernels.chunk_merge(&s.merge).expect("compiles"));
                s.finish.iter().for_each(|f| check(&kernels.chunk_finish(f).expect("compiles")));
                s.prep.iter().for_each(|p| check(&kernels.chunk_prep(p).expect("compiles")));
                let passes = [s.transition, s.from_zeros, s.output];
                passes.iter().for_each(|c| check(&kernels.chunk(c, Target::Sm80).expect("compiles")));
            }
        }
        // Every variant fits every device its target runs on (sm_90a: compute capability 9.0).
        for v in kda_kernels::variants() {
            let kernel = kernels.compiled(&v).expect("compiles");
            for d in devices.iter().filter(|d| d.target().is_ok_and(|t| t.has(v.target))) {
                assert!(kernel.shared_bytes as usize <= d.shared_per_block_optin, "{}: {d:?}", v.id());
            }
        }
        // An sm_90a GEMM on an A100 is refused by name.
        let hopper = kda_kernels::hopper_gemm_configs().remove(0);
        let ready = kernels.gemm(&hopper, kda_dsl::Target::Sm90a).expect("compiles");
        let e = ready.fits(&DeviceLimits::A100).expect_err("sm_80 device").to_string();
        assert!(e.contains("gpu") && e.contains("compute capability 9.0") && e.contains("8.0"), "{e}");
        ready.fits(&DeviceLimits::H200).expect("an H200 runs it");
        // A Volta part, and a block asking for more than a part allows, are refused by name.
        let merge = kernels.chunk_merge(&Default::default()).expect("compiles");
        let volta = DeviceLimits { compute_capability: (7, 0), ..DeviceLimits::A100 };
        assert!(merge.fits(&volta).expect_err("sm_70").to_string().contains("8.0 or newer"));
        let small = DeviceLimits { shared_per_block_optin: 48 * 1024, ..DeviceLimits::A100 };
        let e = merge.fits(&small).expect_err("48 KB").to_string();
        assert!(e.contains("gpu") && e.contains("shared memory per block"), "{e}");
    }
}
