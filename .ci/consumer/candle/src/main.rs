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

/// The layer run over candle tensors on the GPU, checked against itself: two prompts
/// prefilled into the pool and continued by one decode step give the outputs and states of the
/// same prompts one token longer prefilled whole.
#[cfg(feature = "cuda")]
pub mod layer_check {
    use crate::candle_glue::{stream_of, with_view};
    use crate::layer::{address, decode, prefill, Layer, Targets, Tokens, D};
    use candle_core::{DType, Device, IndexOp, Tensor};
    use kda::runtime::rules::{BetaRule, GateRule};
    use kda::{Gpu, Kernels};

    type Error = Box<dyn std::error::Error>;

    /// Query/key heads and value heads (GVA: each key head serves two value heads).
    const HEADS: usize = 2;
    const VALUE_HEADS: usize = 4;
    /// The prompts' lengths before the decoded token: one shorter than a chunk of 16 tokens,
    /// one a whole number of chunks.
    const PROMPTS: [usize; 2] = [37, 64];

    /// One prompt's rows: q, k `[T, H, 128]`, v, g `[T, HV, 128]`, beta logits `[T, HV]`, bf16.
    struct Rows {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
    }

    impl Rows {
        fn random(tokens: usize, dev: &Device) -> candle_core::Result<Rows> {
            let rand = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(DType::BF16);
            Ok(Rows {
                q: rand(&[tokens, HEADS, D])?,
                k: rand(&[tokens, HEADS, D])?,
                v: rand(&[tokens, VALUE_HEADS, D])?,
                g: rand(&[tokens, VALUE_HEADS, D])?,
                beta: rand(&[tokens, VALUE_HEADS])?,
            })
        }

        /// Rows `start..start + len` of each tensor.
        fn narrow(&self, start: usize, len: usize) -> candle_core::Result<Rows> {
            let n = |t: &Tensor| t.narrow(0, start, len);
            Ok(Rows { q: n(&self.q)?, k: n(&self.k)?, v: n(&self.v)?, g: n(&self.g)?, beta: n(&self.beta)? })
        }

        /// The prompts' rows packed one after another (contiguous, as kda takes them).
        fn cat(parts: &[Rows]) -> candle_core::Result<Rows> {
            let c = |f: fn(&Rows) -> &Tensor| Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0);
            Ok(Rows { q: c(|r| &r.q)?, k: c(|r| &r.k)?, v: c(|r| &r.v)?, g: c(|r| &r.g)?, beta: c(|r| &r.beta)? })
        }

        fn tokens(&self) -> usize {
            self.q.dims()[0]
        }
    }

    /// Runs `f` on the cudarc views of `rows`' tensors.
    fn with_tokens<R>(rows: &Rows, f: impl FnOnce(&Tokens) -> R) -> candle_core::Result<R> {
        Ok(with_view(&rows.q, |q| {
            with_view(&rows.k, |k| {
                with_view(&rows.v, |v| {
                    with_view(&rows.g, |g| {
                        with_view(&rows.beta, |beta| f(&Tokens { q, k, v, g, beta, tokens: rows.tokens() }))
                    })
                })
            })
        })?????)
    }

    /// The largest absolute difference of two tensors over the largest absolute value of `want`.
    fn relative_error(got: &Tensor, want: &Tensor) -> candle_core::Result<f32> {
        let (got, want) = (got.to_dtype(DType::F32)?, want.to_dtype(DType::F32)?);
        let diff = (got - &want)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let scale = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        Ok(diff / scale.max(f32::MIN_POSITIVE))
    }

    /// The check; `Ok(false)` when no GPU is present.
    pub fn run() -> Result<bool, Error> {
        if !kda::gpu_available() {
            return Ok(false);
        }
        let dev = Device::new_cuda(0)?;
        let probe = Tensor::zeros(1, DType::F32, &dev)?;
        let stream = stream_of(&probe)?;
        let gpu = Gpu::from_context(stream.context().clone())?;
        let kernels = Kernels::new();

        // The layer's constants: Kimi Linear's gate and beta rules.
        let a_log = Tensor::rand(0f32, 2.8, VALUE_HEADS, &dev)?;
        let dt_bias = Tensor::randn(0f32, 1.0, (VALUE_HEADS, D), &dev)?;
        // Each prompt's rows, the decoded token included.
        let prompts = PROMPTS.iter().map(|&t| Rows::random(t + 1, &dev)).collect::<candle_core::Result<Vec<_>>>()?;
        let before =
            Rows::cat(&prompts.iter().zip(PROMPTS).map(|(r, t)| r.narrow(0, t)).collect::<Result<Vec<_>, _>>()?)?;
        let next =
            Rows::cat(&prompts.iter().zip(PROMPTS).map(|(r, t)| r.narrow(t, 1)).collect::<Result<Vec<_>, _>>()?)?;
        let whole = Rows::cat(&prompts)?;

        // Slots 0 and 1: prefill, then decode in place; slots 2 and 3: the longer prompts whole.
        let pool = Tensor::zeros((4, VALUE_HEADS, D, D), DType::F32, &dev)?;
        let bounds = |lens: [usize; 2]| Tensor::new(&[0i32, lens[0] as i32, (lens[0] + lens[1]) as i32], &dev);
        let cu_before = bounds(PROMPTS)?;
        let cu_whole = bounds(PROMPTS.map(|t| t + 1))?;
        let slots_stepped = Tensor::new(&[0i32, 1], &dev)?;
        let slots_whole = Tensor::new(&[2i32, 3], &dev)?;
        let out_before = Tensor::zeros((before.tokens(), VALUE_HEADS, D), DType::BF16, &dev)?;
        let out_next = Tensor::zeros((next.tokens(), VALUE_HEADS, D), DType::BF16, &dev)?;
        let out_whole = Tensor::zeros((whole.tokens(), VALUE_HEADS, D), DType::BF16, &dev)?;

        with_view(&a_log, |a_log| {
            with_view(&dt_bias, |dt_bias| -> Result<(), Error> {
                let layer = Layer {
                    a_log,
                    dt_bias,
                    gate: GateRule::LowerBound { lower_bound: -5.0 },
                    beta: BetaRule::Sigmoid,
                    heads: HEADS,
                    value_heads: VALUE_HEADS,
                };
                let pool_at = with_view(&pool, |p| address::<f32>(&p, &stream))?;
                let targets = |out: &Tensor| -> candle_core::Result<Targets> {
                    Ok(Targets {
                        out: with_view(out, |o| address::<half::bf16>(&o, &stream))?,
                        pool: pool_at,
                        slots: 4,
                    })
                };
                let (to_before, to_next, to_whole) = (targets(&out_before)?, targets(&out_next)?, targets(&out_whole)?);
                with_view(&cu_before, |cu| {
                    with_view(&slots_stepped, |slots| {
                        with_tokens(&before, |x| prefill(&gpu, &kernels, &stream, &layer, x, &cu, &slots, &to_before))
                    })
                })????;
                with_view(&slots_stepped, |slots| {
                    with_tokens(&next, |x| decode(&gpu, &kernels, &stream, &layer, x, &slots, &to_next))
                })???;
                with_view(&cu_whole, |cu| {
                    with_view(&slots_whole, |slots| {
                        with_tokens(&whole, |x| prefill(&gpu, &kernels, &stream, &layer, x, &cu, &slots, &to_whole))
                    })
                })????;
                Ok(())
            })
        })???;
        dev.synchronize()?;

        // The decoded token's output is the whole prefill's last row of each prompt.
        let mut worst = vec![];
        let mut start = 0;
        for (n, &t) in PROMPTS.iter().enumerate() {
            let stepped = out_next.i(n)?;
            let whole_row = out_whole.i(start + t)?;
            worst.push((
                format!("prompt {n}: the decoded token's output"),
                relative_error(&stepped, &whole_row)?,
                1e-2,
            ));
            let prefix = out_before.narrow(0, start - n, t)?;
            let whole_prefix = out_whole.narrow(0, start, t)?;
            worst.push((format!("prompt {n}: the prompt's outputs"), relative_error(&prefix, &whole_prefix)?, 1e-2));
            worst.push((
                format!("prompt {n}: the state after decode"),
                relative_error(&pool.i(n)?, &pool.i(n + 2)?)?,
                1e-3,
            ));
            start += t + 1;
        }
        let mut ok = true;
        for (what, err, bound) in &worst {
            println!("{what}: {err:.2e} (bound {bound:.0e})");
            ok &= err <= bound;
        }
        if !ok {
            return Err("the stepped layer differs from the whole prefill".into());
        }
        Ok(true)
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    match layer_check::run() {
        Ok(true) => println!("a KDA layer over candle tensors: prefill then decode matches the whole prefill"),
        Ok(false) => println!("no GPU: the candle layer check is skipped"),
        Err(e) => {
            eprintln!("the candle layer check failed: {e}");
            std::process::exit(1);
        }
    }
    #[cfg(not(feature = "cuda"))]
    println!(
        "kda sees a GPU: {}; `--features cuda` (candle's kernels, built by nvcc) runs a layer over candle tensors",
        kda::gpu_available()
    );
}
