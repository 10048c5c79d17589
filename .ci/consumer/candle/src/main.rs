//! A KDA layer in a candle engine: prefill writes each prompt's final state into the engine's
//! state pool, decode continues from it in place, both over the engine's own buffers and on
//! its own stream, with one set of gate and beta rules.
//!
//! [`layer`] works on the cudarc types that candle's CUDA storage hands out (`CudaView`, the
//! device's `Arc<CudaStream>`); [`candle_glue`] (feature `cuda`) gets them from candle
//! tensors: `storage_and_layout`, `Storage::Cuda`, `as_cuda_slice`, the layout's offset.

/// The layer over cudarc buffers.
pub mod layer {
    use cudarc::driver::{CudaStream, CudaView, DevicePtr};
    use half::bf16;
    use kda::runtime::chunk::chunk_kda;
    use kda::runtime::decode::gated_delta_rule_decode;
    use kda::runtime::rules::{BetaRule, GateRule, LayerRules};
    use kda::{DType, Gpu, Kernels, RuntimeError, TensorView};

    /// Head dimension of q, k and v.
    pub const D: usize = 128;

    /// The layer's constants: the gate's head constants, its rules and the model's head counts.
    pub struct Layer<'a> {
        /// `A_log` `[HV]`, f32.
        pub a_log: CudaView<'a, f32>,
        /// `dt_bias` `[HV, 128]`, f32.
        pub dt_bias: CudaView<'a, f32>,
        /// The gate rule (Kimi Linear: the lower-bound gate at -5).
        pub gate: GateRule,
        /// The beta rule (the engine's `b` as logits: `Sigmoid`; already post-sigmoid: `Raw`).
        pub beta: BetaRule,
        /// Query/key heads.
        pub heads: usize,
        /// Value heads.
        pub value_heads: usize,
    }

    /// One step's token rows, packed: q, k `[tokens, H, 128]`, v, g `[tokens, HV, 128]`, beta
    /// logits `[tokens, HV]`, all bf16.
    pub struct Tokens<'a> {
        /// Queries.
        pub q: CudaView<'a, bf16>,
        /// Keys.
        pub k: CudaView<'a, bf16>,
        /// Values.
        pub v: CudaView<'a, bf16>,
        /// Raw gate input.
        pub g: CudaView<'a, bf16>,
        /// Beta logits.
        pub beta: CudaView<'a, bf16>,
        /// Token rows in the step.
        pub tokens: usize,
    }

    /// Where results go: the output rows and the state pool, written in place. candle hands
    /// out only shared references to a tensor's storage, so these are raw addresses: the
    /// caller owns both buffers and lets nothing else use them until the stream has run.
    pub struct Targets {
        /// Output `[tokens, HV, 128]` bf16.
        pub out: u64,
        /// State pool `[slots, HV, 128, 128]` f32, V-first.
        pub pool: u64,
        /// Slots in the pool.
        pub slots: usize,
    }

    /// Views of one step's inputs as `[1, tokens, ..]` (prefill's varlen form) or
    /// `[tokens, 1, ..]` (decode: one token per sequence).
    struct Views<'a> {
        q: kda::runtime::SliceView<'a>,
        k: kda::runtime::SliceView<'a>,
        v: kda::runtime::SliceView<'a>,
        g: kda::runtime::SliceView<'a>,
        beta: kda::runtime::SliceView<'a>,
        out: TensorView,
        pool: TensorView,
    }

    fn views<'a>(
        layer: &Layer,
        x: &'a Tokens,
        to: &Targets,
        lead: [usize; 2],
        stream: &'a CudaStream,
    ) -> Result<Views<'a>, RuntimeError> {
        let (h, hv) = (layer.heads, layer.value_heads);
        let rows = |s: &'a CudaView<bf16>, tail: &[usize]| {
            TensorView::of_slice(s, &[&lead[..], tail].concat(), DType::BF16, stream)
        };
        let device = stream.context().ordinal();
        // SAFETY: `Targets`' contract: the caller's live buffers of these shapes, used by
        // nothing else until the stream has run the call.
        let (out, pool) = unsafe {
            (
                TensorView::from_raw(to.out, &[lead[0], lead[1], hv, D], DType::BF16, device)?,
                TensorView::from_raw(to.pool, &[to.slots, hv, D, D], DType::F32, device)?,
            )
        };
        Ok(Views {
            q: rows(&x.q, &[h, D])?,
            k: rows(&x.k, &[h, D])?,
            v: rows(&x.v, &[hv, D])?,
            g: rows(&x.g, &[hv, D])?,
            beta: rows(&x.beta, &[hv])?,
            out,
            pool,
        })
    }

    /// Prefill of the prompts packed in `x` (`cu_seqlens` `[N + 1]` i32 bounds them) into the
    /// pool slots `state_indices` `[N]` i32.
    pub fn prefill(
        gpu: &Gpu,
        kernels: &Kernels,
        stream: &CudaStream,
        layer: &Layer,
        x: &Tokens,
        cu_seqlens: &CudaView<i32>,
        state_indices: &CudaView<i32>,
        to: &Targets,
    ) -> Result<(), RuntimeError> {
        let v = views(layer, x, to, [1, x.tokens], stream)?;
        let n = state_indices.len();
        let cu = TensorView::of_slice(cu_seqlens, &[n + 1], DType::I32, stream)?;
        let slots = TensorView::of_slice(state_indices, &[n], DType::I32, stream)?;
        let a_log = TensorView::of_slice(&layer.a_log, &[layer.value_heads], DType::F32, stream)?;
        let dt_bias = TensorView::of_slice(&layer.dt_bias, &[layer.value_heads, D], DType::F32, stream)?;
        let rules = LayerRules { a_log: Some(&a_log), dt_bias: Some(&dt_bias), gate: layer.gate, beta: layer.beta };
        let mut args = rules.chunk_args(&v.q, &v.k, &v.v, &v.g, &v.beta);
        args.cu_seqlens = Some(&cu);
        args.initial_state = Some(&v.pool);
        args.state_indices = Some(&slots);
        args.output = Some(&v.out);
        chunk_kda(gpu, kernels, stream, &args).map(|_| ())
    }

    /// Decode of one token per sequence (`x` has `N` rows) from the pool slots `state_indices`
    /// `[N]` i32, in place, with the layer's (prefill's) gate and beta rules.
    pub fn decode(
        gpu: &Gpu,
        kernels: &Kernels,
        stream: &CudaStream,
        layer: &Layer,
        x: &Tokens,
        state_indices: &CudaView<i32>,
        to: &Targets,
    ) -> Result<(), RuntimeError> {
        let v = views(layer, x, to, [x.tokens, 1], stream)?;
        let slots = TensorView::of_slice(state_indices, &[x.tokens], DType::I32, stream)?;
        let a_log = TensorView::of_slice(&layer.a_log, &[layer.value_heads], DType::F32, stream)?;
        let dt_bias = TensorView::of_slice(&layer.dt_bias, &[layer.value_heads, D], DType::F32, stream)?;
        // Prefill's rules, from the same value.
        let rules = LayerRules { a_log: Some(&a_log), dt_bias: Some(&dt_bias), gate: layer.gate, beta: layer.beta };
        let mut args = rules.decode_args(&v.q, &v.k, &v.v, &v.g, &v.beta);
        args.state = Some(&v.pool);
        args.state_indices = Some(&slots);
        args.inplace_final_state = true;
        args.output = Some(&v.out);
        gated_delta_rule_decode(gpu, kernels, stream, &args).map(|_| ())
    }

    /// The address of a buffer, for [`Targets`].
    pub fn address<T>(slice: &CudaView<T>, stream: &CudaStream) -> u64 {
        slice.device_ptr(stream).0
    }
}

/// candle tensors to the cudarc views [`layer`] takes.
#[cfg(feature = "cuda")]
pub mod candle_glue {
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{Result, Storage, Tensor};
    use cudarc::driver::CudaView;

    /// Runs `f` on a view of `t`'s elements: a contiguous CUDA tensor, from its layout's
    /// offset; the storage stays read-locked while `f` runs.
    pub fn with_view<T: CudaDType, R>(t: &Tensor, f: impl FnOnce(CudaView<'_, T>) -> R) -> Result<R> {
        if !t.is_contiguous() {
            candle_core::bail!("kda takes contiguous tensors");
        }
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            candle_core::bail!("kda takes CUDA tensors");
        };
        let slice = cuda.as_cuda_slice::<T>()?;
        Ok(f(slice.slice(layout.start_offset()..)))
    }

    /// The stream kda launches on: the candle device's own.
    pub fn stream_of(t: &Tensor) -> Result<std::sync::Arc<cudarc::driver::CudaStream>> {
        match t.device() {
            candle_core::Device::Cuda(d) => Ok(d.cuda_stream()),
            _ => candle_core::bail!("kda takes CUDA tensors"),
        }
    }
}

fn main() {
    println!("kda sees a GPU: {}", kda::gpu_available());
}
