//! `gated_delta_rule_decode` in the DSL: the KDA recurrence one token at a time, on a state held
//! in registers.
//!
//! A block owns `bv` rows of one value head's 128 x 128 state: rows of the V-first state
//! `[V, K]` are independent in the delta rule (`u[v]` reads only row `v`), so the grid is
//! `V / bv` x value heads x sequence groups, each block taking `ITEMS` sequences in turn through
//! a `cp.async` pipeline (the next one's state and first-token inputs load while one computes).
//! `ITEMS` is 1 or 2 for most calls: more blocks than fit, started in grid order, so the blocks
//! in flight cover a few states whole (2-4% faster than one wave, docs/performance.md). A warp holds whole
//! rows (`bv / warps`; with `lanes_per_row = 32` a row spans its 32 lanes), so row reductions
//! stay inside the warp. Per token: decay the state, reduce it against k and q in one pass
//! (`S k`, `S q`), `u = beta (v - S k)`, `o = S q + u (k · q)` (the output of the updated state
//! without a second pass), then `S += k uᵀ`. Every specialization below is a host-side `if` on
//! the config: the branches not taken leave no code.

use crate::rules::{beta_of, gate_of};
use kda_dsl::DType;
use kda_macros::kernel;

/// Sequences one block takes at most (`ITEMS`; the one-wave grid picks up to this many, `max_items`).
pub const MAX_ITEMS: usize = 256;

/// The most blocks a grid may have along its y and z axes (CUDA's limit); decode's sequence
/// groups run along z.
pub const MAX_GRID_Z: usize = 65535;

/// Sequences per block (`ITEMS`): the fewest that keep the grid (`ceil(nseq / ITEMS)` x
/// `blocks_per_sequence`) within `resident` blocks, so the whole call is one wave of blocks that
/// each pipeline across their sequences; at most [`MAX_ITEMS`].
pub fn items_per_block(nseq: usize, blocks_per_sequence: usize, resident: usize) -> usize {
    let columns = (resident / blocks_per_sequence.max(1)).max(1);
    nseq.div_ceil(columns).clamp(1, MAX_ITEMS)
}

pub use crate::rules::{Beta, Gate};

/// Where states are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Writes {
    /// Nothing.
    None,
    /// The pool at `state_indices[n, t]`, after every token (in place).
    PoolPerToken,
    /// `final_state[token]`, one state per token.
    FinalPerToken,
    /// `state[n]` after the last token (in place, no indices).
    PoolPerSequence,
    /// `final_state[n]` after the last token.
    FinalPerSequence,
}

/// What a decode variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DecodeConfig {
    /// q, k, v, a, b element type.
    pub dtype: DType,
    /// State element type (`F32` or `BF16`), rounded after every token.
    pub state_dtype: DType,
    /// Output element type.
    pub out_dtype: DType,
    /// State layout: `[V, K]` per head (true) or `[K, V]`.
    pub v_first: bool,
    /// Gate rule.
    pub gate: Gate,
    /// `A_log` given.
    pub a_log: bool,
    /// `dt_bias` given, and its type.
    pub dt_bias: Option<DType>,
    /// Beta rule.
    pub beta: Beta,
    /// `b` is `[B, T, HV, V]`.
    pub beta_headwise: bool,
    /// l2-normalize q and k.
    pub l2norm: bool,
    /// `cu_seqlens` given, and its type.
    pub varlen: Option<DType>,
    /// `state_indices` given, and its type.
    pub indices: Option<DType>,
    /// `num_accepted_tokens` given, and its type.
    pub accepted: Option<DType>,
    /// Read the initial state.
    pub use_initial_state: bool,
    /// Where states go.
    pub writes: Writes,
    /// How it is launched: chosen by the kind of call ([`DecodeCallKind`]).
    pub shape: DecodeShape,
}

/// The part of a decode variant the kind of call chooses: its block shape, its pipeline and how
/// many sequences a block takes ([`DecodeCallKind::shape`]; `kda bench --sweep-decode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    /// State rows per block.
    pub rows: usize,
    /// Warps per block (they split the 128 key columns of the block's rows).
    pub warps: usize,
    /// Blocks that must fit on an SM at once (caps registers per thread).
    pub min_blocks: usize,
    /// Pipeline stages of initial states in shared memory (2: the next sequence's state loads
    /// while this one computes).
    pub stages: usize,
    /// Sequences a block takes, at most: its tables of pool slots and betas have this many
    /// entries. [`MAX_ITEMS`] for one wave of blocks that each take many sequences in turn
    /// ([`items_per_block`]); a few for a grid of many short blocks, which the hardware starts
    /// in order as others finish.
    pub max_items: usize,
    /// Lanes along each state row in registers: 4 (16-row atoms, a row over 4 lanes) or 32 (a
    /// row across the warp, so a warp may own as few as 2 rows and k, q and the gate take 4
    /// registers per thread; V-first states only).
    pub lanes_per_row: u32,
    /// State stores write whole 128-byte lines per warp instruction (`.whole_lines()`).
    pub whole_line_stores: bool,
}

/// The kinds of decode call the shape table tells apart, measured on an H200
/// (`kda bench --sweep-decode`; docs/performance.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeCallKind {
    /// f32 V-first state, several tokens per sequence, at most [`MAX_GRID_Z`] sequences: a
    /// block per (sequence, head, row block), rows across the warp.
    GridMultiToken,
    /// f32 state, one token, fewer than 8 sequences: a block per (sequence, head, row block).
    GridFew,
    /// f32 state, one token, 8 to [`MAX_GRID_Z`] sequences: the same grid, larger blocks. The
    /// hardware starts far more blocks than fit in grid order as others finish.
    GridMany,
    /// 16-bit state, one token, 8 to twice [`MAX_GRID_Z`] sequences: the same grid with two
    /// sequences per block (the second's state loads while the first computes).
    GridPairs,
    /// Several tokens per sequence otherwise: one wave of small blocks, each taking many
    /// sequences in turn.
    WaveMultiToken,
    /// One token, fewer than 8 sequences otherwise: one wave of blocks.
    WaveFew,
    /// One token, an f32 state past [`MAX_GRID_Z`] sequences: one wave, 3 stages.
    WaveF32,
    /// One token, a 16-bit state otherwise: one wave, 2 stages.
    Wave16Bit,
}

impl DecodeShape {
    /// The shape of a call with states of `state_dtype` (V-first when `v_first`), `nseq`
    /// sequences, and several tokens in some sequence when `multi_token`: its kind's, with
    /// state stores in whole lines whenever a sequence has several tokens (measured faster
    /// there, slower for one token).
    pub fn for_call(state_dtype: DType, v_first: bool, multi_token: bool, nseq: usize) -> DecodeShape {
        let kind = DecodeCallKind::of(state_dtype, v_first, multi_token, nseq);
        DecodeShape { whole_line_stores: multi_token, ..kind.shape() }
    }
}

impl DecodeCallKind {
    /// The kind of a call with states of `state_dtype` (V-first when `v_first`), `nseq`
    /// sequences, and several tokens in some sequence when `multi_token`.
    pub fn of(state_dtype: DType, v_first: bool, multi_token: bool, nseq: usize) -> DecodeCallKind {
        let f32_state = state_dtype == DType::F32;
        if f32_state && nseq <= MAX_GRID_Z {
            if multi_token && v_first {
                DecodeCallKind::GridMultiToken
            } else if nseq < 8 {
                DecodeCallKind::GridFew
            } else {
                DecodeCallKind::GridMany
            }
        } else if !f32_state && !multi_token && (8..=2 * MAX_GRID_Z).contains(&nseq) {
            DecodeCallKind::GridPairs
        } else if multi_token {
            DecodeCallKind::WaveMultiToken
        } else if nseq < 8 {
            DecodeCallKind::WaveFew
        } else if f32_state {
            DecodeCallKind::WaveF32
        } else {
            DecodeCallKind::Wave16Bit
        }
    }

    /// The shape measured fastest for this kind of call, with state stores in whole lines for
    /// the kinds that always have several tokens per sequence ([`DecodeShape::for_call`] sets
    /// them for every call with several).
    pub fn shape(self) -> DecodeShape {
        use DecodeCallKind::*;
        let shape = |rows, warps, min_blocks, stages, max_items| DecodeShape {
            rows,
            warps,
            min_blocks,
            stages,
            max_items,
            lanes_per_row: 4,
            whole_line_stores: false,
        };
        match self {
            GridMultiToken => DecodeShape { lanes_per_row: 32, whole_line_stores: true, ..shape(32, 2, 6, 2, 1) },
            GridFew => shape(32, 2, 6, 2, 1),
            GridMany => shape(64, 2, 4, 2, 1),
            GridPairs => shape(64, 2, 4, 3, 2),
            WaveMultiToken => DecodeShape { whole_line_stores: true, ..shape(16, 1, 8, 2, MAX_ITEMS) },
            WaveFew => shape(32, 2, 6, 2, MAX_ITEMS),
            WaveF32 => shape(64, 2, 4, 3, MAX_ITEMS),
            Wave16Bit => shape(64, 2, 4, 2, MAX_ITEMS),
        }
    }
}

impl Default for DecodeConfig {
    /// The bench configuration: bf16 inputs, f32 V-first pool through `state_indices`, in place,
    /// lower-bound gate, beta sigmoid, l2norm.
    fn default() -> Self {
        DecodeConfig {
            dtype: DType::BF16,
            state_dtype: DType::F32,
            out_dtype: DType::BF16,
            v_first: true,
            gate: Gate::LowerBound,
            a_log: true,
            dt_bias: Some(DType::F32),
            beta: Beta::Sigmoid,
            beta_headwise: false,
            l2norm: true,
            varlen: None,
            indices: Some(DType::I32),
            accepted: None,
            use_initial_state: true,
            writes: Writes::PoolPerToken,
            // The shape of a single-token call of a few sequences.
            shape: DecodeCallKind::GridFew.shape(),
        }
    }
}

impl DecodeConfig {
    /// This config with the launch shape of its kind of call ([`DecodeCallKind`]): several
    /// tokens in some sequence when `multi_token`, `nseq` sequences.
    pub fn with_launch_shape_for(self, multi_token: bool, nseq: usize) -> DecodeConfig {
        DecodeConfig { shape: DecodeShape::for_call(self.state_dtype, self.v_first, multi_token, nseq), ..self }
    }

    /// A short stable name.
    pub fn key(&self) -> String {
        let o = |d: Option<DType>| d.map(|d| d.name()).unwrap_or("none");
        format!(
            "{}_s{}_o{}_{}_{:?}{}_dt{}_{:?}{}{}_cu{}_idx{}_nat{}_{}{:?}_bv{}_w{}_mb{}_st{}{}{}{}",
            self.dtype,
            self.state_dtype,
            self.out_dtype,
            if self.v_first { "vk" } else { "kv" },
            self.gate,
            if self.a_log { "_alog" } else { "" },
            o(self.dt_bias),
            self.beta,
            if self.beta_headwise { "_hw" } else { "" },
            if self.l2norm { "_l2" } else { "" },
            o(self.varlen),
            o(self.indices),
            o(self.accepted),
            if self.use_initial_state { "init_" } else { "" },
            self.writes,
            self.shape.rows,
            self.shape.warps,
            self.shape.min_blocks,
            self.shape.stages,
            if self.shape.whole_line_stores { "_wl" } else { "" },
            if self.shape.max_items == MAX_ITEMS { String::new() } else { format!("_it{}", self.shape.max_items) },
            if self.shape.lanes_per_row == 4 { String::new() } else { format!("_l{}", self.shape.lanes_per_row) }
        )
        .to_lowercase()
    }
}

/// The token's decay `alpha = exp(g)` per key channel into `af`, one channel per thread through
/// shared `a_sh`: `g` from the raw gate input `a_raw` by the gate rule (with `dt_bias` when
/// given; `ea = exp(A_log)`).
#[kda_macros::kernel_fn]
#[allow(clippy::too_many_arguments)] // the step's tiles and scalars, named as the kernel names them
fn token_decay(gate: Gate, dt_bias: bool, a_raw: Tile, dt_sh: Tile, a_sh: Tile, af: Tile, ea: Val, lower_bound: Val) {
    for (j,) in parallel(a_sh) {
        let mut x = a_raw[j] as f32;
        if gate.in_kernel() && dt_bias {
            x = x + dt_sh[j] as f32;
        }
        a_sh[j] = exp(gate_of(gate, x, ea, lower_bound));
    }
    copy(a_sh, af);
}

/// `1 / sqrt(x · x + 1e-6)` of a 128-vector, reduced through `sq` into the one-value `nrm`.
#[kda_macros::kernel_fn]
fn inverse_norm(x: Tile, sq: Tile, nrm: Tile) -> Val {
    for (j,) in parallel(sq) {
        sq[j] = x[j] * x[j];
    }
    reduce_sum(sq, nrm, 0);
    rsqrt(nrm[0] + 1e-6)
}

/// Decays the state by `af` per key channel and reduces `S k` into `uf` and `S q` into `of`, in
/// one pass over the state (`tmp`, `tmq` hold the products). The key runs along the state's
/// columns when `v_first`, along its rows otherwise.
#[kda_macros::kernel_fn]
#[allow(clippy::too_many_arguments)] // the step's tiles, named as the kernel names them
fn decay_and_project(v_first: bool, s: Tile, af: Tile, kf: Tile, qf: Tile, tmp: Tile, tmq: Tile, uf: Tile, of: Tile) {
    if v_first {
        for (i, j) in parallel(s) {
            s[i][j] = s[i][j] * af[j];
            tmp[i][j] = s[i][j] * kf[j];
            tmq[i][j] = s[i][j] * qf[j];
        }
        reduce_sum(tmp, uf, 1);
        reduce_sum(tmq, of, 1);
    } else {
        for (i, j) in parallel(s) {
            s[i][j] = s[i][j] * af[i];
            tmp[i][j] = s[i][j] * kf[i];
            tmq[i][j] = s[i][j] * qf[i];
        }
        reduce_sum(tmp, uf, 0);
        reduce_sum(tmq, of, 0);
    }
}

/// `S += k uᵀ`, the key along the state's columns when `v_first`.
#[kda_macros::kernel_fn]
fn rank_one_update(v_first: bool, s: Tile, kf: Tile, uf: Tile) {
    if v_first {
        for (i, j) in parallel(s) {
            s[i][j] = s[i][j] + kf[j] * uf[i];
        }
    } else {
        for (i, j) in parallel(s) {
            s[i][j] = s[i][j] + kf[i] * uf[j];
        }
    }
}

/// One decode step per token for `bv` state rows of one (sequence, value head).
///
/// Tensors a config does not use are still parameters; the launcher binds a placeholder the
/// kernel never reads. `b` is `[B, T, HV, BW]` with `BW = 1` for a scalar beta.
#[kernel]
pub fn decode(
    cfg: &DecodeConfig,
    q: Global<(B, T, H, KD), { cfg.dtype }>,
    k: Global<(B, T, H, KD), { cfg.dtype }>,
    v: Global<(B, T, HV, VD), { cfg.dtype }>,
    a: Global<(B, T, HV, KD), { cfg.dtype }>,
    b: Global<(B, T, HV, BW), { cfg.dtype }>,
    a_log: Global<(HVA,), F32>,
    dt_bias: Global<(HVD, KDB), { cfg.dt_bias.unwrap_or(F32) }>,
    state: GlobalMut<(P, HV, S1, S2), { cfg.state_dtype }>,
    final_state: GlobalMut<(F, HV, S1, S2), { cfg.state_dtype }>,
    state_indices: Global<(NI, IC), { cfg.indices.unwrap_or(I32) }>,
    cu_seqlens: Global<(NC,), { cfg.varlen.unwrap_or(I32) }>,
    accepted: Global<(NA,), { cfg.accepted.unwrap_or(I32) }>,
    out: GlobalMut<(B, T, HV, VD), { cfg.out_dtype }>,
    NSEQ: Dim,
    ITEMS: Dim,
    scale: f32,
    lower_bound: f32,
) {
    // Memory-bound: `min_blocks` caps registers so enough warps fit. A block takes `ITEMS`
    // sequences in turn for one head and row range; a head's row blocks are adjacent in the
    // grid, then the heads, so blocks started together write one state slot's neighbourhood.
    let (vb, hv, blk) = launch(
        grid = [VD / cfg.shape.rows, HV, ceil_div(NSEQ, ITEMS)],
        threads = 32 * cfg.shape.warps,
        min_blocks = cfg.shape.min_blocks,
    );
    // K = V = 128 (the launcher checks): boxes along these axes need no masks.
    assume_extent(KD, 128);
    assume_extent(VD, 128);
    assume_extent(S1, 128);
    assume_extent(S2, 128);
    let h = hv / (HV / H);
    let v0 = vb * cfg.shape.rows;
    let n0 = blk * ITEMS;
    // The launcher keeps ITEMS within the tables; the clamp keeps any other caller in bounds.
    let items = min(min(ITEMS, cfg.shape.max_items), NSEQ - n0);
    let (vr, kc) = if cfg.v_first { (cfg.shape.rows, 128) } else { (128, cfg.shape.rows) };
    let s = fragment([vr, kc], F32, lanes_per_row = cfg.shape.lanes_per_row);
    let tmp = fragment([vr, kc], F32, lanes_per_row = cfg.shape.lanes_per_row);
    let tmq = fragment([vr, kc], F32, lanes_per_row = cfg.shape.lanes_per_row);
    let kf = fragment([128], F32);
    let qf = fragment([128], F32);
    let af = fragment([128], F32);
    let sq = fragment([128], F32);
    let uf = fragment([cfg.shape.rows], F32);
    let vf = fragment([cfg.shape.rows], F32);
    let of = fragment([cfg.shape.rows], F32);
    // Headwise betas (otherwise unused, and then 16 long, which a vector on its own needs).
    let bw = fragment([if cfg.beta_headwise { cfg.shape.rows } else { 16 }], F32);
    let nrm = local([1], F32);
    // The pool slot a token's state goes to, with per-token indices (`IC` > 1): loaded with the
    // token's inputs, so the store does not wait on it.
    let wraw = local([1], cfg.indices.unwrap_or(I32));
    let a_raw = shared([128], cfg.dtype);
    let dt_sh = shared([128], cfg.dt_bias.unwrap_or(F32));
    let a_sh = shared([128], F32);
    // Pipeline stages: a sequence's initial state and its first token's inputs.
    let st_sh = shared([vr, kc], cfg.state_dtype);
    let a0_sh = shared([128], cfg.dtype);
    let k0_sh = shared([128], cfg.dtype);
    let q0_sh = shared([128], cfg.dtype);
    let v0_sh = shared([cfg.shape.rows], cfg.dtype);
    let b0_sh = shared([cfg.shape.rows], cfg.dtype);
    let slot_sh = shared([cfg.shape.max_items], I32);
    let beta_sh = shared([cfg.shape.max_items], F32);
    // This block's rows of the state box, in the pool's layout.
    let r0 = if cfg.v_first { v0 } else { 0 };
    let c0 = if cfg.v_first { 0 } else { v0 };
    // The head's gate constants load first and are not used before the slot table below is
    // written, so neither load waits in front of the slot loads: `A_log` into a register, whose
    // `exp` comes after the table, and `dt_bias` (a row of K = 128 the launcher checks, so whole
    // 16-byte copies) through `cp.async`, which the first barrier waits for.
    let mut al = 0.0;
    if cfg.gate != Gate::Precomputed {
        if cfg.a_log {
            al = a_log[hv];
        }
        if cfg.dt_bias.is_some() {
            assume_extent(KDB, 128);
            copy(dt_bias.tile_at([hv, 0], [1, 128]), dt_sh);
        }
    }
    // The pool slot each of the block's sequences starts from (-1: padding), all read at once
    // rather than one dependent load per sequence.
    for (i,) in parallel(slot_sh) {
        let ni = min(n0 + i, NSEQ - 1);
        let mut slot = ni;
        if cfg.indices.is_some() {
            let mut col = 0;
            if cfg.accepted.is_some() {
                // Clamped in the index's own width, so a huge i64 count cannot wrap.
                col = (min(max(accepted[ni], 1), IC) - 1) as i32;
            }
            let raw = state_indices[ni][col];
            slot = select(raw >= 0 && raw < P, raw as i32, -1);
        }
        slot_sh[i] = slot;
        if !cfg.beta_headwise {
            // The first token's beta (a row inside `b` even for an empty sequence; `b` has no
            // rows at all when T = 0, and then no token reads the table).
            if T > 0 {
                let mut bi0 = ni;
                let mut ti0 = 0;
                if cfg.varlen.is_some() {
                    bi0 = 0;
                    ti0 = max(min(cu_seqlens[ni], T - 1), 0) as i32;
                }
                beta_sh[i] = b[bi0][ti0][hv][0] as f32;
            }
        }
    }
    let mut ea = 1.0;
    if cfg.gate != Gate::Precomputed {
        if cfg.a_log {
            ea = exp(al);
        }
    }
    for it in pipelined(0, items, stages = cfg.shape.stages) {
        if cfg.use_initial_state {
            // A padding sequence's stage reads slot 0 and is never used.
            copy(
                state
                    .tile_at([max(slot_sh[min(it, cfg.shape.max_items - 1)], 0), hv, r0, c0], [1, 1, vr, kc])
                    .streaming(),
                st_sh,
            );
        }
        // The first token's inputs (batch row, token) = (sequence, 0), or (0, its first row) in
        // varlen; an empty sequence's row may lie past the end, and the box masks it. The state
        // and these stream (evict-first in L2, as do the state and output stores below): with
        // only the state streaming, b256 measured 7% slower, with everything 0.2-1% faster.
        if cfg.varlen.is_some() {
            let row0 = max(min(cu_seqlens[min(n0 + it, NSEQ - 1)], T), 0) as i32;
            copy(a.tile_at([0, row0, hv, 0], [1, 1, 1, 128]).streaming(), a0_sh);
            copy(k.tile_at([0, row0, h, 0], [1, 1, 1, 128]).streaming(), k0_sh);
            copy(q.tile_at([0, row0, h, 0], [1, 1, 1, 128]).streaming(), q0_sh);
            copy(v.tile_at([0, row0, hv, vb * cfg.shape.rows], [1, 1, 1, cfg.shape.rows]).streaming(), v0_sh);
            if cfg.beta_headwise {
                copy(b.tile_at([0, row0, hv, vb * cfg.shape.rows], [1, 1, 1, cfg.shape.rows]).streaming(), b0_sh);
            }
        } else {
            copy(a.tile_at([n0 + it, 0, hv, 0], [1, 1, 1, 128]).streaming(), a0_sh);
            copy(k.tile_at([n0 + it, 0, h, 0], [1, 1, 1, 128]).streaming(), k0_sh);
            copy(q.tile_at([n0 + it, 0, h, 0], [1, 1, 1, 128]).streaming(), q0_sh);
            copy(v.tile_at([n0 + it, 0, hv, vb * cfg.shape.rows], [1, 1, 1, cfg.shape.rows]).streaming(), v0_sh);
            if cfg.beta_headwise {
                copy(b.tile_at([n0 + it, 0, hv, vb * cfg.shape.rows], [1, 1, 1, cfg.shape.rows]).streaming(), b0_sh);
            }
        }
        let n = n0 + it;
        let live = slot_sh[it] >= 0;
        // The sequence's tokens: rows `bos .. bos + tn` of batch row `bi`.
        let mut bos = 0;
        let mut tn = T;
        let mut bi = n;
        if cfg.varlen.is_some() {
            let s0 = max(min(cu_seqlens[n], T), 0) as i32;
            let s1 = max(min(cu_seqlens[n + 1], T), s0) as i32;
            bos = s0;
            tn = s1 - s0;
            bi = 0;
        }
        // Flat token index of the sequence's first token (rows of a per-token `final_state`).
        let tok0 = bos + bi * T;
        let mut beta = 0.0;
        // The initial state, or zeros (no initial state, or padding).
        if cfg.use_initial_state {
            if live {
                copy(st_sh, s);
            } else {
                clear(s);
            }
        } else {
            clear(s);
        }
        // Iteration t finishes token t - 1 with the inputs fetched in iteration t - 1, then fetches
        // token t (waited on at once; fetching it earlier measured slower, docs/performance.md).
        // The pool slot token t - 1's state goes to (-1: none). Token t - 1's stores follow the
        // live/padding branch rather than sit in it (measured faster, docs/performance.md).
        let mut wst = -1;
        for t in serial(0, tn + 1) {
            if t > 0 {
                let tp = t - 1;
                let ti = bos + tp;
                if live {
                    token_decay(cfg.gate, cfg.dt_bias.is_some(), a_raw, dt_sh, a_sh, af, ea, lower_bound);
                    // One pass over the decayed state gives both `S k` and `S q`: with `S' = S + k̂ uᵀ`,
                    // `S' q̂ = S q̂ + u (k̂ · q̂)`, so the output needs no second reduction after the
                    // update. The norms scale the reduced vectors instead of k and q.
                    let mut rk = 1.0;
                    let mut rq = 1.0;
                    if cfg.l2norm {
                        rk = inverse_norm(kf, sq, nrm);
                        rq = inverse_norm(qf, sq, nrm);
                    }
                    for (j,) in parallel(sq) {
                        sq[j] = kf[j] * qf[j];
                    }
                    reduce_sum(sq, nrm, 0);
                    let kq = nrm[0] * rk * rq;
                    decay_and_project(cfg.v_first, s, af, kf, qf, tmp, tmq, uf, of);
                    // u = beta * (v - S k̂), with the decayed state.
                    if cfg.beta_headwise {
                        for (i,) in parallel(uf) {
                            uf[i] = beta_of(cfg.beta, bw[i]) * (vf[i] - uf[i] * rk);
                        }
                    } else {
                        let bt = beta_of(cfg.beta, beta);
                        for (i,) in parallel(uf) {
                            uf[i] = bt * (vf[i] - uf[i] * rk);
                        }
                    }
                    for (i,) in parallel(of) {
                        of[i] = (of[i] * rq + uf[i] * kq) * scale;
                    }
                    // S += k̂ uᵀ = k (rk u)ᵀ: the norm scales the short vector.
                    if cfg.l2norm {
                        for (i,) in parallel(uf) {
                            uf[i] = uf[i] * rk;
                        }
                    }
                    rank_one_update(cfg.v_first, s, kf, uf);
                    // Rounded to the state's dtype after every token. The per-token write rounds as
                    // it stores, so only a state that goes on to another token needs it in registers.
                    if cfg.state_dtype != F32 {
                        if t < tn || cfg.writes == Writes::PoolPerSequence || cfg.writes == Writes::FinalPerSequence {
                            for (i, j) in parallel(s) {
                                s[i][j] = s[i][j] as bf16;
                            }
                        }
                    }
                    if cfg.writes == Writes::PoolPerToken {
                        // One index per sequence (`IC` = 1): every token writes the slot the
                        // sequence started from, already in the table (-1 for padding).
                        let mut w = slot_sh[it];
                        if IC > 1 {
                            let raw = wraw[0];
                            w = select(raw >= 0 && raw < P, raw as i32, -1);
                        }
                        wst = w;
                    }
                } else {
                    // Padding: a zero output row; a per-token state of the sequence is zero too.
                    clear(of);
                }
                copy(of, out.tile_at([bi, ti, hv, v0], [1, 1, 1, cfg.shape.rows]).streaming());
                if cfg.writes == Writes::FinalPerToken {
                    copy(
                        s,
                        final_state
                            .tile_at([tok0 + tp, hv, r0, c0], [1, 1, vr, kc])
                            .streaming()
                            .whole_lines(cfg.shape.whole_line_stores),
                    );
                }
                if cfg.writes == Writes::PoolPerToken {
                    if wst >= 0 {
                        copy(
                            s,
                            state
                                .tile_at([wst, hv, r0, c0], [1, 1, vr, kc])
                                .streaming()
                                .whole_lines(cfg.shape.whole_line_stores),
                        );
                    }
                }
            }
            if t == 0 && tn > 0 {
                // Staged by the pipeline with the state.
                copy(a0_sh, a_raw);
                copy(k0_sh, kf);
                copy(q0_sh, qf);
                copy(v0_sh, vf);
                if cfg.beta_headwise {
                    copy(b0_sh, bw);
                } else {
                    beta = beta_sh[it];
                }
                if cfg.writes == Writes::PoolPerToken {
                    if IC > 1 {
                        wraw[0] = state_indices[n][0];
                    }
                }
            }
            if t > 0 && t < tn {
                let ti = bos + t;
                // Register loads first: they stay in flight while the copy into shared memory
                // waits for its data. Not streaming: marked evict-first, spec4 measured 0.4%
                // slower (docs/performance.md).
                copy(k.tile_at([bi, ti, h, 0], [1, 1, 1, 128]), kf);
                copy(q.tile_at([bi, ti, h, 0], [1, 1, 1, 128]), qf);
                copy(v.tile_at([bi, ti, hv, v0], [1, 1, 1, cfg.shape.rows]), vf);
                copy(a.tile_at([bi, ti, hv, 0], [1, 1, 1, 128]), a_raw);
                if cfg.beta_headwise {
                    copy(b.tile_at([bi, ti, hv, v0], [1, 1, 1, cfg.shape.rows]), bw);
                } else {
                    beta = b[bi][ti][hv][0];
                }
                if cfg.writes == Writes::PoolPerToken {
                    if IC > 1 {
                        wraw[0] = state_indices[n][min(t, IC - 1)];
                    }
                }
            }
        }
        if cfg.writes == Writes::PoolPerSequence {
            copy(
                s,
                state.tile_at([n, hv, r0, c0], [1, 1, vr, kc]).streaming().whole_lines(cfg.shape.whole_line_stores),
            );
        }
        if cfg.writes == Writes::FinalPerSequence {
            copy(
                s,
                final_state
                    .tile_at([n, hv, r0, c0], [1, 1, vr, kc])
                    .streaming()
                    .whole_lines(cfg.shape.whole_line_stores),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_per_block_fills_one_wave() {
        // 132 SMs x 6 blocks, 32 heads x 4 row blocks per sequence.
        let (per_seq, resident) = (128, 792);
        for (nseq, want) in [(1, 1), (6, 1), (7, 2), (32, 6), (256, 43), (1024, 171), (100_000, MAX_ITEMS)] {
            let items = items_per_block(nseq, per_seq, resident);
            assert_eq!(items, want, "nseq {nseq}");
            if items < MAX_ITEMS {
                assert!(nseq.div_ceil(items) * per_seq <= resident.max(per_seq), "nseq {nseq}");
            }
        }
        // More blocks per sequence than fit at once: one sequence per column.
        assert_eq!(items_per_block(5, 4096, 792), 5);
    }

    #[test]
    fn every_launch_shape_builds_and_compiles() {
        // The shape rule sees the state's layout and dtype: each of its choices must lay out
        // (32 lanes per row fit V-first states only).
        for v_first in [true, false] {
            for state_dtype in [DType::F32, DType::BF16] {
                for multi_token in [false, true] {
                    for nseq in [1, 8, MAX_GRID_Z + 1] {
                        let cfg = DecodeConfig { v_first, state_dtype, ..DecodeConfig::default() }
                            .with_launch_shape_for(multi_token, nseq);
                        let def = decode(&cfg).unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
                        kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
                        assert!(cfg.shape.lanes_per_row == 4 || (v_first && multi_token), "{}", cfg.key());
                        assert!(
                            cfg.shape.max_items == MAX_ITEMS || nseq <= cfg.shape.max_items * MAX_GRID_Z,
                            "{}",
                            cfg.key()
                        );
                    }
                }
            }
        }
    }
}
