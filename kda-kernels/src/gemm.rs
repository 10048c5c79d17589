//! A tiled GEMM in the DSL: the example a kernel author copies to write a new tiled variant.
//!
//! `C[M, N] = A[M, K] · B` with `B` given as `[K, N]` (`C = A·B`) or `[N, K]` (`C = A·Bᵀ`),
//! bf16 or f16 inputs, f32 accumulation, f32 or 16-bit output, any M, N, K: boxes at the
//! edges are masked (reads give 0, writes are skipped).

use kda_dsl::DType;
use kda_macros::kernel;

/// What a GEMM variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    /// Input element type (`BF16` or `F16`).
    pub dtype: DType,
    /// Output element type (`F32`, or the input type).
    pub out: DType,
    /// True for `C = A·Bᵀ` (B stored `[N, K]`), false for `C = A·B` (B stored `[K, N]`).
    pub b_transposed: bool,
    /// Block tile rows.
    pub bm: usize,
    /// Block tile columns.
    pub bn: usize,
    /// K step per pipeline stage.
    pub bk: usize,
    /// Shared-memory stages.
    pub stages: usize,
    /// Threads per block.
    pub threads: usize,
    /// True when K (and N for `A·B`) are multiples of 8, so rows are 16-byte aligned and
    /// copies use 16-byte vectors; launchers pick the unaligned variant otherwise.
    pub aligned: bool,
    /// Warps beside `threads` that only issue the pipeline's copies (`launch(.., fill_warps)`),
    /// so the warps that multiply never wait on their issue.
    pub fill_warps: usize,
    /// The epilogue goes through shared memory (whole rows of C in 16-byte stores) instead of
    /// storing the accumulator's fragments straight to global memory.
    pub staged_store: bool,
    /// Output tile rows walked together (0: none). The grid's blocks, in launch order, take the
    /// output's tiles row by row without it; with it, this many tile rows at a time, column by
    /// column, so that the blocks resident together read fewer distinct A and B tiles and more
    /// of them hit in L2 (Triton's grouped order). Same tiles, same arithmetic: same bits.
    pub raster_group: usize,
}

impl Default for GemmConfig {
    fn default() -> Self {
        // Chosen by `kda bench --sweep-gemm` on an H200 (see docs/performance.md).
        GemmConfig {
            dtype: DType::BF16,
            out: DType::F32,
            b_transposed: true,
            bm: 128,
            bn: 128,
            bk: 32,
            stages: 4,
            threads: 128,
            aligned: true,
            fill_warps: 0,
            staged_store: false,
            raster_group: 0,
        }
    }
}

impl GemmConfig {
    /// A short stable name for variant lists and caches.
    pub fn key(&self) -> String {
        format!(
            "{}_{}_{}_{}x{}x{}_s{}_t{}{}{}{}{}",
            self.dtype,
            self.out,
            if self.b_transposed { "abt" } else { "ab" },
            self.bm,
            self.bn,
            self.bk,
            self.stages,
            self.threads,
            if self.fill_warps == 0 { String::new() } else { format!("_fw{}", self.fill_warps) },
            if self.staged_store { "_ss" } else { "" },
            if self.raster_group == 0 { String::new() } else { format!("_g{}", self.raster_group) },
            if self.aligned { "" } else { "_unaligned" }
        )
    }
}

/// `C = A·B` or `A·Bᵀ` on tensor cores with a multi-stage `cp.async` pipeline.
#[kernel]
pub fn gemm(
    cfg: &GemmConfig,
    a: Global<(M, K), { cfg.dtype }>,
    b: Global<(BR, BC), { cfg.dtype }>,
    c: GlobalMut<(M, N), { cfg.out }>,
) {
    let (block_x, block_y) =
        launch(grid = [ceil_div(N, cfg.bn), ceil_div(M, cfg.bm)], threads = cfg.threads, fill_warps = cfg.fill_warps);
    // The output tile (`bx` its column, `by` its row) this block computes.
    let mut bx = block_x;
    let mut by = block_y;
    if cfg.raster_group > 0 {
        let tiles_n = ceil_div(N, cfg.bn);
        let tiles_m = ceil_div(M, cfg.bm);
        let group = cfg.raster_group as i32;
        // Block `id` in launch order is the `id % per_group`-th of its group's tiles, column
        // by column: the group's first tile row plus `(id % per_group) % rows`, column
        // `(id % per_group) / rows` (the last group may have fewer rows).
        let id = block_y * tiles_n + block_x;
        let per_group = group * tiles_n;
        let first_row = (id / per_group) * group;
        let rows = min(tiles_m - first_row, group);
        let in_group = id % per_group;
        by = first_row + in_group % rows;
        bx = in_group / rows;
    }
    if cfg.aligned {
        assume_multiple(K, 8);
        assume_multiple(BC, 8);
        assume_multiple(N, 8);
    }
    let a_s = shared([cfg.bm, cfg.bk], cfg.dtype);
    let acc = fragment([cfg.bm, cfg.bn], F32);
    clear(acc);
    if cfg.b_transposed {
        // B is [N, K]: its tile is [bn, bk], read transposed.
        let b_s = shared([cfg.bn, cfg.bk], cfg.dtype);
        for ko in pipelined(ceil_div(K, cfg.bk), stages = cfg.stages) {
            copy(a.tile([by, ko], [cfg.bm, cfg.bk]), a_s);
            copy(b.tile([bx, ko], [cfg.bn, cfg.bk]), b_s);
            gemm(a_s, b_s.t(), acc);
        }
    } else {
        // B is [K, N]: its tile is [bk, bn].
        let b_s = shared([cfg.bk, cfg.bn], cfg.dtype);
        for ko in pipelined(ceil_div(K, cfg.bk), stages = cfg.stages) {
            copy(a.tile([by, ko], [cfg.bm, cfg.bk]), a_s);
            copy(b.tile([ko, bx], [cfg.bk, cfg.bn]), b_s);
            gemm(a_s, b_s, acc);
        }
    }
    if cfg.staged_store {
        // Through shared memory: whole rows of C leave in 16-byte stores.
        let c_s = shared([cfg.bm, cfg.bn], cfg.out);
        copy(acc, c_s);
        copy(c_s, c.tile([by, bx], [cfg.bm, cfg.bn]));
    } else {
        copy(acc, c.tile([by, bx], [cfg.bm, cfg.bn]));
    }
}
