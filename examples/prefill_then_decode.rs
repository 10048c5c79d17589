//! Prefill into the decode state pool, then decode from it: `chunk_kda` writes each prompt's
//! final state into its pool slot through `state_indices`, and `gated_delta_rule_decode`
//! continues from those slots in place, both calls made from one `LayerRules` (the layer's
//! gate and beta rules). The example checks the decoded token against a prefill
//! of the whole sequence (prompt and token): the f32 pool states within 1e-3 (the chunk
//! kernel's f16 operands), the bf16 outputs within their own rounding (about 1e-2).
//!
//! `cargo run --release --example prefill_then_decode` (needs a GPU; says so otherwise).

use kda::kernels::reference::{rel_err, Rng};
use kda::runtime::chunk::chunk_kda;
use kda::runtime::decode::gated_delta_rule_decode;
use kda::runtime::rules::{BetaRule, GateRule, LayerRules};
use kda::{DType, DeviceTensor, Gpu, Kernels, TensorView};

const D: usize = 128;
const H: usize = 4;

/// Host inputs of `n` tokens per sequence (row-major `[tokens, heads, D]` per tensor).
struct Tokens {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Tokens {
    fn random(rng: &mut Rng, tokens: usize) -> Tokens {
        let mut draw = |n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
        Tokens {
            q: draw(tokens * H * D),
            k: draw(tokens * H * D),
            v: draw(tokens * H * D),
            g: draw(tokens * H * D),
            beta: draw(tokens * H),
        }
    }

    /// Rows `from .. to` of every tensor.
    fn rows(&self, from: usize, to: usize) -> Tokens {
        let cut = |x: &[f32], w: usize| x[from * w..to * w].to_vec();
        Tokens {
            q: cut(&self.q, H * D),
            k: cut(&self.k, H * D),
            v: cut(&self.v, H * D),
            g: cut(&self.g, H * D),
            beta: cut(&self.beta, H),
        }
    }

    fn append(&mut self, other: &Tokens) {
        self.q.extend(&other.q);
        self.k.extend(&other.k);
        self.v.extend(&other.v);
        self.g.extend(&other.g);
        self.beta.extend(&other.beta);
    }
}

/// The tensors of `tokens` rows laid out as `lead` (`[S]` varlen rows, or `[N, 1]` for decode).
struct OnDevice {
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    g: DeviceTensor,
    beta: DeviceTensor,
    out: DeviceTensor,
}

fn upload(gpu: &Gpu, s: &kda::CudaStream, x: &Tokens, lead: &[usize]) -> Result<OnDevice, kda::RuntimeError> {
    let shape = |tail: &[usize]| [lead, tail].concat();
    let up = |shape: &[usize], v: &[f32]| DeviceTensor::from_f32(gpu, s, shape, DType::BF16, v);
    Ok(OnDevice {
        q: up(&shape(&[H, D]), &x.q)?,
        k: up(&shape(&[H, D]), &x.k)?,
        v: up(&shape(&[H, D]), &x.v)?,
        g: up(&shape(&[H, D]), &x.g)?,
        beta: up(&shape(&[H]), &x.beta)?,
        out: DeviceTensor::zeros(gpu, s, &shape(&[H, D]), DType::BF16)?,
    })
}

/// Prefill of the packed sequences `lens` into `pool` at `slots` under the layer's `rules`;
/// returns the output rows.
#[allow(clippy::too_many_arguments)]
fn prefill(
    gpu: &Gpu,
    kernels: &Kernels,
    s: &kda::CudaStream,
    x: &Tokens,
    lens: &[usize],
    pool: &TensorView,
    slots: &TensorView,
    rules: &LayerRules,
) -> Result<Vec<f32>, kda::RuntimeError> {
    let total: usize = lens.iter().sum();
    let t = upload(gpu, s, x, &[total])?;
    let mut cu = vec![0i64];
    for l in lens {
        cu.push(cu[cu.len() - 1] + *l as i64);
    }
    let cu = DeviceTensor::from_i64(gpu, s, &[cu.len()], DType::I32, &cu)?;
    let views = (t.q.view(), t.k.view(), t.v.view(), t.g.view(), t.beta.view(), t.out.view(), cu.view());
    let mut args = rules.chunk_args(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.cu_seqlens = Some(&views.6);
    args.initial_state = Some(pool);
    args.state_indices = Some(slots);
    args.output = Some(&views.5);
    chunk_kda(gpu, kernels, s, &args)?;
    t.out.to_f32_vec(s)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !kda::gpu_available() {
        println!("no GPU here: this example needs one");
        return Ok(());
    }
    let gpu = Gpu::new(0)?;
    let s = gpu.new_stream()?;
    let kernels = Kernels::new();
    let mut rng = Rng::new(3);
    let prompts = [100usize, 37, 250];
    let n = prompts.len();
    // Each sequence: its prompt, then one more token to decode.
    let seqs: Vec<Tokens> = prompts.iter().map(|l| Tokens::random(&mut rng, l + 1)).collect();
    let (mut prompt, mut whole, mut next) =
        (Tokens::rows(&seqs[0], 0, 0), Tokens::rows(&seqs[0], 0, 0), Tokens::rows(&seqs[0], 0, 0));
    for (x, l) in seqs.iter().zip(prompts) {
        prompt.append(&x.rows(0, l));
        whole.append(x);
        next.append(&x.rows(l, l + 1));
    }
    // The layer's rules, shared by both calls: the lower-bound gate with its head constants,
    // beta through a sigmoid.
    let a_log =
        DeviceTensor::from_f32(&gpu, &s, &[H], DType::F32, &(0..H).map(|i| 0.5 * i as f32).collect::<Vec<_>>())?;
    let dt_bias = DeviceTensor::zeros(&gpu, &s, &[H * D], DType::F32)?;
    let gate = (a_log.view(), dt_bias.view());
    let rules = LayerRules {
        a_log: Some(&gate.0),
        dt_bias: Some(&gate.1),
        gate: GateRule::LowerBound { lower_bound: -5.0 },
        beta: BetaRule::Sigmoid,
    };
    // The pool: 8 slots of f32 V-first states; the sequences own slots 5, 2 and 7.
    let slots = DeviceTensor::from_i64(&gpu, &s, &[n], DType::I32, &[5, 2, 7])?;

    // 1. Prefill the prompts into the pool, then decode the next token from it, in place.
    let pool = DeviceTensor::zeros(&gpu, &s, &[8, H, D, D], DType::F32)?;
    prefill(&gpu, &kernels, &s, &prompt, &prompts, &pool.view(), &slots.view(), &rules)?;
    let t = upload(&gpu, &s, &next, &[n, 1])?;
    let views =
        (t.q.view(), t.k.view(), t.v.view(), t.g.view(), t.beta.view(), t.out.view(), pool.view(), slots.view());
    let mut args = rules.decode_args(&views.0, &views.1, &views.2, &views.3, &views.4);
    args.state = Some(&views.6);
    args.state_indices = Some(&views.7);
    args.inplace_final_state = true;
    args.output = Some(&views.5);
    gated_delta_rule_decode(&gpu, &kernels, &s, &args)?;
    let decoded = t.out.to_f32_vec(&s)?;

    // 2. Prefill the whole sequences (prompt and token) into a fresh pool.
    let fresh = DeviceTensor::zeros(&gpu, &s, &[8, H, D, D], DType::F32)?;
    let lens: Vec<usize> = prompts.iter().map(|l| l + 1).collect();
    let full = prefill(&gpu, &kernels, &s, &whole, &lens, &fresh.view(), &slots.view(), &rules)?;

    // The decoded token is the last row of each whole sequence.
    let mut last = vec![];
    let mut end = 0;
    for l in &lens {
        end += l;
        last.extend_from_slice(&full[(end - 1) * H * D..end * H * D]);
    }
    let as64 = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    let (pools_a, pools_b) = (pool.to_f32_vec(&s)?, fresh.to_f32_vec(&s)?);
    println!(
        "decoded token against the whole-sequence prefill: output {:.2e} (bf16 rounding: about 1e-2), pool states {:.2e} (within 1e-3)",
        rel_err(&as64(&decoded), &as64(&last)),
        rel_err(&as64(&pools_a), &as64(&pools_b)),
    );
    Ok(())
}
