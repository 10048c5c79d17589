//! The arguments of `chunk_kda`, one field per reference parameter.

use crate::tensor::TensorView;

/// Arguments of `chunk_kda` (prefill), named as the reference's parameters (in snake case:
/// `A_log` is [`a_log`](Self::a_log)), plus the Rust extras `state_indices`,
/// `has_initial_state`, `max_seqlen` and `checked`.
///
/// `None` (or `false`) means the reference's default, documented on each field. Build one with
/// [`ChunkArgs::new`] and set the fields a call needs; [`crate::chunk::plan_chunk`] validates it
/// and resolves the defaults. `H` is the query/key head count, `HV` the value head count (a
/// multiple of `H`), `N` the number of sequences (`B`, or `cu_seqlens` entries - 1).
#[derive(Clone, Copy, Debug)]
pub struct ChunkArgs<'a> {
    /// Query `[B, T, H, 128]`, or `[S, H, 128]` / `[1, S, H, 128]` for varlen; f16 or bf16.
    /// Required.
    pub q: &'a TensorView,
    /// Key, q's shape (after the varlen `[S, ..]` form is widened to `[1, S, ..]`) and dtype.
    /// Required.
    pub k: &'a TensorView,
    /// Value `[B, T, HV, 128]` or its varlen form, q's dtype. Required.
    pub v: &'a TensorView,
    /// Gate input, v's shape, q's dtype: the raw gate `a` of the lower-bound rule when `a_log`
    /// and `dt_bias` are given, else a precomputed natural-log decay. Required.
    pub g: &'a TensorView,
    /// Beta logits `[B, T, HV]`, or `[S, HV]` / `[1, S, HV]` for varlen; q's dtype; the kernel
    /// applies `sigmoid`. Required.
    pub beta: &'a TensorView,
    /// Query scale. Default `None`: `128^-0.5`.
    pub scale: Option<f32>,
    /// Initial state `[N, HV, 128, 128]` (V-first), f32 or q's dtype. With `state_indices` it is
    /// the state pool `[pool, HV, 128, 128]` instead (f32, or bf16 with bf16 inputs), read and
    /// written in place. Default `None`: zeros.
    pub initial_state: Option<&'a TensorView>,
    /// Produce the final states: into `final_state` when given, else into a new tensor
    /// `[N, HV, 128, 128]` of `initial_state`'s dtype (q's without one). Must stay false with
    /// `state_indices` (the final states then go to the pool). Default false.
    pub output_final_state: bool,
    /// Cumulative sequence lengths `[N + 1]`, i32 or i64, for varlen (sequence `n` owns tokens
    /// `cu_seqlens[n] .. cu_seqlens[n + 1]`), rising from 0 to `S` (the caller's contract, which
    /// the checked mode verifies; padding tokens past the last sequence are outside it). Never
    /// read on the host; a call of one sequence in token ranges does not read it at all (its
    /// sequence is `0 .. S`). Default `None`: dense, `N = B`.
    pub cu_seqlens: Option<&'a TensorView>,
    /// Log decay `[HV]` f32 (`A_log` in the reference); given together with `dt_bias`, the
    /// kernel computes the gate from `g` (the lower-bound rule, or softplus with
    /// `use_lower_bound = Some(false)`). Default `None`: `g` is the precomputed log decay.
    pub a_log: Option<&'a TensorView>,
    /// Decay bias `[HV, 128]` (or flat `[HV * 128]`), f32 or bf16; given together with `a_log`.
    /// Default `None`.
    pub dt_bias: Option<&'a TensorView>,
    /// Lower bound of the lower-bound gate rule, in `[-5, 0)` when that rule runs. Default
    /// `None`: -5.0.
    pub lower_bound: Option<f32>,
    /// Rust extra (decode's parameter): with `a_log` and `dt_bias`, which gate the kernel
    /// computes: the lower-bound rule, or with `Some(false)` decode's softplus rule
    /// (`-exp(A_log) softplus(g + dt_bias)`, unbounded below: the exact element-wise path).
    /// An error without `a_log` and `dt_bias`. Default `None`: the lower-bound rule (the
    /// reference's). [`crate::rules::LayerRules`] sets it alike for prefill and decode.
    pub use_lower_bound: Option<bool>,
    /// Rust extra (decode's parameter): `Some(false)` takes `beta` as given (already
    /// post-sigmoid, as FLA's `chunk_kda` takes it). Default `None`: `sigmoid(beta)`.
    pub apply_beta_sigmoid: Option<bool>,
    /// Rust extra (decode's parameter): beta is `2 sigmoid(beta)`, up to 2 (negative
    /// eigenvalues); needs the sigmoid. Default false.
    pub allow_neg_eigval: bool,
    /// L2-normalize q and k in the kernel. Default `None`: true.
    pub use_qk_l2norm_in_kernel: Option<bool>,
    /// Preallocated output, v's shape (`[S, HV, 128]` is accepted too when q is `[S, H, 128]`)
    /// and q's dtype. Default `None`: the call allocates it.
    pub output: Option<&'a TensorView>,
    /// Preallocated final states `[N, HV, 128, 128]`, f32 or q's dtype (initial_state's when
    /// both are given). Read only when `output_final_state` is true, else ignored as in the
    /// reference; an error with `state_indices`. Default `None`.
    pub final_state: Option<&'a TensorView>,
    /// Rust extra: pool slot per sequence `[N]`, i32 or i64; makes `initial_state` the pool.
    /// A slot outside `[0, pool)` is padding (zero output rows, no state touched). Default
    /// `None`: `initial_state[n]` and `final_state[n]` as in the reference.
    pub state_indices: Option<&'a TensorView>,
    /// Rust extra (prefix caching): pool slot per sequence `[N]` to start from, state_indices'
    /// dtype; `state_indices` still names the slot the final state goes to, so a cached prefix
    /// state is read and never overwritten, and several sequences may read one slot. A read
    /// slot outside `[0, pool)` starts the sequence from zeros. Only with `state_indices`.
    /// Default `None`: `state_indices` (read and write in place).
    pub read_indices: Option<&'a TensorView>,
    /// Rust extra (prefix caching): `[N]`, i32 or i64, the tokens of sequence n before this
    /// call (its first token is at absolute position `prefix_lens[n]`). Chunks then end at
    /// absolute multiples of 16, so a checkpoint is exactly the state at its boundary. Only
    /// with `state_indices`. Default `None`: 0.
    pub prefix_lens: Option<&'a TensorView>,
    /// Rust extra (prefix caching): E, a positive multiple of 16: the state after every
    /// absolute position p with `p % E == 0` strictly inside the call's part of a sequence
    /// goes to `checkpoint_slots[n, p / E - 1]`. Needs `checkpoint_slots`. Default `None`: no
    /// checkpoints.
    pub checkpoint_every: Option<usize>,
    /// Rust extra (prefix caching): `[N, C]`, i32 or i64, the engine's block table by absolute
    /// block: slots of the checkpoint pool. A slot outside the pool skips that checkpoint; a
    /// column past C is not written (the checked mode reports both). Needs `checkpoint_every`.
    pub checkpoint_slots: Option<&'a TensorView>,
    /// Rust extra (prefix caching): where checkpoints go, `[slots, HV, 128, 128]` of the state
    /// pool's dtype. Default `None`: the state pool itself.
    pub checkpoint_pool: Option<&'a TensorView>,
    /// Rust extra: per sequence `[N]`, i32 or i64, nonzero when the pool slot holds an initial
    /// state (zeros are used otherwise). Only with `state_indices`. Default `None`: every slot
    /// holds one.
    pub has_initial_state: Option<&'a TensorView>,
    /// Rust extra: the longest sequence's token count. The launch does not need it: the
    /// two-kernel path's preparation grid shrinks to it, and a call whose hint leaves no
    /// sequence long enough to split skips the split's launches (its sequences would each be
    /// one segment, with the same bits). A hint shorter than the longest sequence never costs
    /// a chunk or a bound: it costs time, or leaves a long sequence unsplit (other rounding);
    /// the checked mode reports it. Default `None`: unknown.
    pub max_seqlen: Option<usize>,
    /// Rust extra: opt-in checked mode, which reads the index tensors (`cu_seqlens`,
    /// `state_indices`) back and reports values out of range (not graph-safe). Default false.
    pub checked: bool,
    /// Rust extra: scratch memory for the paths that take one (the two-kernel path, token
    /// ranges, the long-sequence split), any dtype and shape, 16-byte aligned, of at least
    /// [`chunk_workspace_bytes`](super::chunk_workspace_bytes) bytes (0 for a fused call: then
    /// any workspace or none). The path never depends on it: default `None` takes the
    /// workspace [`Kernels`](crate::Kernels) keeps for the call's stream, grown on first use
    /// (outside a CUDA graph capture; [`crate::preload::preload_chunk`] sizes it ahead).
    pub workspace: Option<&'a TensorView>,
}

impl<'a> ChunkArgs<'a> {
    /// A call on other views of the inputs (a reshape or a token range of this call's), with
    /// this call's gate, beta and options (`scale`, `a_log`, `dt_bias`, `lower_bound`,
    /// `use_lower_bound`, `apply_beta_sigmoid`, `allow_neg_eigval`, `use_qk_l2norm_in_kernel`)
    /// and every other field at its default.
    pub(crate) fn on_inputs<'b>(
        &self,
        q: &'b TensorView,
        k: &'b TensorView,
        v: &'b TensorView,
        g: &'b TensorView,
        beta: &'b TensorView,
    ) -> ChunkArgs<'b>
    where
        'a: 'b,
    {
        ChunkArgs {
            scale: self.scale,
            a_log: self.a_log,
            dt_bias: self.dt_bias,
            lower_bound: self.lower_bound,
            use_lower_bound: self.use_lower_bound,
            apply_beta_sigmoid: self.apply_beta_sigmoid,
            allow_neg_eigval: self.allow_neg_eigval,
            use_qk_l2norm_in_kernel: self.use_qk_l2norm_in_kernel,
            ..ChunkArgs::new(q, k, v, g, beta)
        }
    }

    /// The required tensors, every other field at its default (`None` / `false`).
    pub fn new(
        q: &'a TensorView,
        k: &'a TensorView,
        v: &'a TensorView,
        g: &'a TensorView,
        beta: &'a TensorView,
    ) -> Self {
        ChunkArgs {
            q,
            k,
            v,
            g,
            beta,
            scale: None,
            initial_state: None,
            output_final_state: false,
            cu_seqlens: None,
            a_log: None,
            dt_bias: None,
            lower_bound: None,
            use_lower_bound: None,
            apply_beta_sigmoid: None,
            allow_neg_eigval: false,
            use_qk_l2norm_in_kernel: None,
            output: None,
            final_state: None,
            state_indices: None,
            read_indices: None,
            prefix_lens: None,
            checkpoint_every: None,
            checkpoint_slots: None,
            checkpoint_pool: None,
            has_initial_state: None,
            max_seqlen: None,
            checked: false,
            workspace: None,
        }
    }
}
