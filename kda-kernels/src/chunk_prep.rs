//! `chunk_prep`: the state-independent half of `chunk_kda`'s chunk step, for every chunk at
//! once.
//!
//! Each chunk's gated keys and queries, `INV = (I + A)^-1`, `Mqk`, decay `2^Γ` and betas depend on
//! the chunk's inputs alone (`chunk.rs` has the formulas). This kernel computes them with the
//! same helpers, in the same order, as the fused kernel does inside its serial chain, and
//! writes them to a workspace; the `chunk` kernel with [`Preparation::Workspace`] then reads
//! them back and runs only the state's products. The two together are bit-identical to the
//! fused kernel, and the preparation runs in parallel over chunks instead of once per chunk of
//! each sequence in turn.
//!
//! Workspace rows: a token's row is its own (`[B, T]` rows of a dense call, rounded up to whole
//! chunks), shifted down `15 n` rows for varlen sequence `n`, so that every chunk, the last
//! partial one included, writes its 16 rows without touching the next sequence's. With chunks
//! aligned to absolute positions (`prefix_lens`), chunk `c` of a sequence takes the 16 rows
//! from its first token's row plus `16 c`, whatever its first token, and varlen sequences are
//! `31 n` rows apart (one chunk more). A chunk's decay and betas go to row `w0 / 16` of its own
//! f32 table, `w0` its first workspace row.

use crate::chunk::{
    chunk_shift, prepare_keys, sequence_end, sequence_prefix, sequence_start, solve_chunk, window_end, window_start,
    ChunkGate, ChunkOperands, GateScan, InverseStores, KeyProducts, KeyTiles, Preparation, PREP_BETA, PREP_COLS,
    PREP_DECAY_COLS, PREP_INV, PREP_KD, PREP_KR, PREP_MQK, PREP_QD,
};
use crate::rules::Beta;
use kda_dsl::{DType, Hoist};
use kda_macros::kernel;

/// Warps of the preparation: the shipped fused kernel's ([`crate::chunk::ChunkConfig::default`]).
pub const PREP_WARPS: usize = 8;

/// What a preparation variant is specialized for (the fields of [`crate::chunk::ChunkConfig`]
/// it shares).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PrepConfig {
    /// q, k, g and beta element type (`BF16` or `F16`).
    pub dtype: DType,
    /// Gate rule.
    pub gate: ChunkGate,
    /// Beta rule.
    pub beta: Beta,
    /// `dt_bias` element type (gates computed in the kernel only).
    pub dt_bias: DType,
    /// l2-normalize q and k.
    pub l2norm: bool,
    /// `cu_seqlens` given, and its type.
    pub varlen: Option<DType>,
    /// Warps per block. The row reductions (l2 norms, the gate's cumulative sum) add in an
    /// order set by how a tile's elements are spread over the threads, so the results are
    /// bit-identical to the fused kernel's at this warp count: [`PREP_WARPS`], the shipped
    /// fused kernel's. The reading `chunk` variant's own warp count does not matter (each
    /// warp's value rows see the same products).
    pub warps: usize,
    /// The operand type of the workspace it writes (the reading variant's).
    pub operands: ChunkOperands,
    /// `prefix_lens` given, and its dtype: chunks end at absolute multiples of 16, as the
    /// reading variant's ([`crate::chunk::PrefixCaching`]).
    pub prefix_lens: Option<DType>,
}

impl Default for PrepConfig {
    /// The bench configuration's preparation: bf16 inputs, lower-bound gate, l2norm.
    fn default() -> Self {
        PrepConfig {
            dtype: DType::BF16,
            gate: ChunkGate::LowerBound,
            beta: Beta::Sigmoid,
            dt_bias: DType::F32,
            l2norm: true,
            varlen: None,
            warps: PREP_WARPS,
            operands: ChunkOperands::F16,
            prefix_lens: None,
        }
    }
}

impl PrepConfig {
    /// The preparation a chunk config with [`Preparation::Workspace`] reads.
    pub fn of(cfg: &crate::chunk::ChunkConfig) -> PrepConfig {
        debug_assert_eq!(cfg.preparation, Preparation::Workspace);
        PrepConfig {
            dtype: cfg.dtype,
            gate: cfg.gate,
            beta: cfg.beta,
            dt_bias: cfg.dt_bias,
            l2norm: cfg.l2norm,
            varlen: cfg.varlen,
            warps: PREP_WARPS,
            operands: cfg.operands,
            prefix_lens: cfg.prefix.prefix_lens,
        }
    }

    /// A short stable name.
    pub fn key(&self) -> String {
        let gate = crate::chunk::rules_key(self.gate, self.dt_bias, self.beta);
        format!(
            "{}_{}{}_cu{}_w{}{}{}",
            self.dtype,
            gate,
            if self.l2norm { "_l2" } else { "" },
            self.varlen.map(|d| d.name()).unwrap_or("none"),
            self.warps,
            if self.operands == ChunkOperands::Bf16 { "_opbf16" } else { "" },
            self.prefix_lens.map(|d| format!("_prefix{}", d.name())).unwrap_or_default()
        )
        .to_lowercase()
    }
}

/// The workspace's leading extents `[WB, TP]` for a call of `nseq` sequences over `batch` rows
/// of `seq_len` tokens (varlen: one row of all the tokens): whole chunks per dense row, and
/// [`sequence_pad`] rows more per varlen sequence; with chunks `aligned` to absolute positions
/// (`prefix_lens`) a sequence may take one chunk more, whose 16 rows come on top. The decay
/// table has `TP.div_ceil(16)` rows per `WB`.
pub fn prep_rows(batch: usize, seq_len: usize, nseq: usize, varlen: bool, aligned: bool) -> (usize, usize) {
    if varlen {
        (1, seq_len + sequence_pad(aligned) * nseq)
    } else {
        (batch, seq_len.div_ceil(16) * 16 + if aligned { 16 } else { 0 })
    }
}

/// Workspace rows between one varlen sequence's and the next's beyond their tokens: 15, so a
/// last partial chunk has its 16 rows to itself; 31 with chunks aligned to absolute positions
/// (a short first chunk makes one chunk more, each chunk's rows 16 apart from the sequence's
/// first token).
pub(crate) fn sequence_pad(aligned: bool) -> usize {
    if aligned {
        31
    } else {
        15
    }
}

/// Prepares chunks `first + x, first + x + NX, ..` of one (sequence, value head), those of the
/// window `first_chunk .. end_chunk` ([`crate::chunk::ChunkWindow`]).
#[kernel]
pub fn chunk_prep(
    cfg: &PrepConfig,
    q: Global<(B, T, H, KD), { cfg.dtype }>,
    k: Global<(B, T, H, KD), { cfg.dtype }>,
    g: Global<(B, T, HV, KD), { cfg.dtype }>,
    beta: Global<(B, T, HV), { cfg.dtype }>,
    a_log: Global<(HVA,), F32>,
    dt_bias: Global<(HVD, KDB), { cfg.dt_bias }>,
    cu_seqlens: Global<(NC,), { cfg.varlen.unwrap_or(I32) }>,
    prefix_lens: Global<(NPL,), { cfg.prefix_lens.unwrap_or(I32) }>,
    prep: GlobalMut<(WB, TP, HV, PW), { cfg.operands.dtype() }>,
    prep_decay: GlobalMut<(WB, TC, HV, DW), F32>,
    NSEQ: Dim,
    NX: Dim,
    scale: f32,
    lower_bound: f32,
    first_chunk: i32,
    end_chunk: i32,
) {
    // Block-uniform addresses once per loop (`hoist`), at the registers that keep 32 warps an
    // SM (`min_blocks`: four blocks of the default 8 warps, as many as fitted without hoisting).
    let (x0, hv, n) = launch(
        grid = [NX, HV, NSEQ],
        threads = 32 * cfg.warps,
        min_blocks = (32 / cfg.warps.max(1)).max(1),
        hoist = Hoist::BlockUniform,
    );
    assume_extent(KD, 128);
    assume_extent(PW, PREP_COLS);
    assume_extent(DW, PREP_DECAY_COLS);
    let h = hv / (HV / H);
    let lower = cfg.gate == ChunkGate::LowerBound;
    let mut bos = 0;
    let mut eos = T;
    let mut bi = n;
    let mut pad = 0;
    if cfg.varlen.is_some() {
        bos = sequence_start(cu_seqlens, n, T);
        eos = sequence_end(cu_seqlens, n, T, bos);
        bi = 0;
        pad = sequence_pad(cfg.prefix_lens.is_some()) as i32 * n;
    }
    let prefix = sequence_prefix(cfg.prefix_lens.is_some(), prefix_lens, n);
    let shift = chunk_shift(prefix, bos, eos);
    let dt_sh = shared([128], cfg.dt_bias);
    let mut ea = 1.0;
    if cfg.gate.in_kernel() {
        ea = exp(a_log[hv]);
        copy(dt_bias.tile_at([hv, 0], [1, 128]), dt_sh);
    }
    let q_sh = shared([16, 128], cfg.dtype);
    let k_sh = shared([16, 128], cfg.dtype);
    let g_sh = shared([16, 128], cfg.dtype);
    let b_sh = shared([16], cfg.dtype);
    let gl = shared([16, 128], F32);
    let kf = fragment([16, 128], F32, lanes_per_row = 32);
    let qf = fragment([16, 128], F32, lanes_per_row = 32);
    let sq = fragment([16, 128], F32, lanes_per_row = 32);
    let rk = fragment([16], F32);
    let rq = fragment([16], F32);
    // `kd`, `qd` and `kr` go from registers to the workspace; the lower-bound gate's key
    // products read `ki`, `kd` and `qd` in bf16 here, the other gates' f32 rows (a tile a gate
    // never touches takes no shared memory).
    let op = cfg.operands.dtype();
    let kd_key = shared([16, 128], BF16);
    let qd_key = shared([16, 128], BF16);
    // Only `KeyProducts::Split` (4 warps) reads these: no shared memory here.
    let kq_key = shared([32, 128], BF16);
    let lm = fragment([32, 16], F32);
    let ki_sh = shared([16, 128], BF16);
    let kn_sh = shared([16, 128], F32);
    let qn_sh = shared([16, 128], F32);
    // 16 x 16 products on the first warp (`key_products`): the other warps skip them, and
    // `l_sh` and `m_sh` hold one copy, so more blocks fit an SM. The fused kernel keeps one
    // copy per warp (the same bits); there, one warp's would spill registers.
    let la = fragment([16, 16], F32);
    let ma = fragment([16, 16], F32);
    let l_sh = shared([16, 16], F32);
    let m_sh = shared([16, 16], F32);
    let mq_sh = shared([16, 16], op);
    let bt_sh = shared([16], F32);
    let eg_sh = shared([128], F32);
    let cols = shared([16], F32);
    let x = local([16], F32);
    let inv_sh = shared([16, 16], op);
    #[rustfmt::skip]
    let keys = KeyTiles {
        g_sh, dt_sh, b_sh, k_sh, q_sh, gl, bt_sh, eg_sh, kf, qf, sq, rk, rq, ki_sh, kd_key, qd_key, kq_key,
        kn_sh, qn_sh, la, ma, lm, l_sh, m_sh, mq_sh, cols, x, inv_sh,
    };

    let chunks = ceil_div(eos - bos + shift, 16);
    // The decay table's row of the sequence's first chunk: chunk `c`'s is this plus `c`, so
    // the loop divides nothing.
    let d0 = (bos + pad) / 16;
    // The chain's window of chunks (`ChunkWindow`), block `x0` taking every `NX`-th.
    let c_first = window_start(first_chunk, chunks);
    let c_end = window_end(end_chunk, chunks, c_first);
    for it in pipelined(0, ceil_div(max(c_end - c_first - x0, 0), NX), stages = 2) {
        let c = c_first + x0 + NX * it;
        let t0 = max(bos, bos - shift + 16 * c);
        let t1 = min(eos, bos - shift + 16 * c + 16);
        let w0 = bos + 16 * c + pad;
        copy(q.tile_at([bi, t0, h, 0], [1, 16, 1, 128]).bounded([B, t1, H, 128]), q_sh);
        copy(k.tile_at([bi, t0, h, 0], [1, 16, 1, 128]).bounded([B, t1, H, 128]), k_sh);
        copy(g.tile_at([bi, t0, hv, 0], [1, 16, 1, 128]).bounded([B, t1, HV, 128]), g_sh);
        copy(beta.tile_at([bi, t0, hv], [1, 16, 1]).bounded([B, t1, HV]), b_sh);
        let nv = min(t1 - t0, 16);

        prepare_keys(
            GateScan::for_block(32 * cfg.warps),
            KeyProducts::Replicated,
            cfg.gate,
            cfg.beta,
            cfg.l2norm,
            keys,
            nv,
            ea,
            lower_bound,
            scale,
        );
        copy(kf, prep.tile_at([bi, w0, hv, PREP_KD], [1, 16, 1, 128]));
        copy(qf, prep.tile_at([bi, w0, hv, PREP_QD], [1, 16, 1, 128]));
        copy(sq, prep.tile_at([bi, w0, hv, PREP_KR], [1, 16, 1, 128]));
        // Many blocks share an SM here and cover the solve's waits for each other: its stores
        // stay where they take the fewest registers.
        solve_chunk(lower, KeyProducts::Replicated, InverseStores::AsSolved, keys);

        copy(inv_sh, prep.tile_at([bi, w0, hv, PREP_INV], [1, 16, 1, 16]));
        copy(mq_sh, prep.tile_at([bi, w0, hv, PREP_MQK], [1, 16, 1, 16]));
        copy(eg_sh, prep_decay.tile_at([bi, d0 + c, hv, 0], [1, 1, 1, 128]));
        copy(bt_sh, prep_decay.tile_at([bi, d0 + c, hv, PREP_BETA], [1, 1, 1, 16]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_compiles() {
        let def = chunk_prep(&PrepConfig::default()).unwrap_or_else(|e| panic!("{e}"));
        kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap_or_else(|e| panic!("{e}"));
    }
}
