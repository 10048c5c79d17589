//! Small DSL kernels that exercise the compiler's harder lowerings (reductions across warps,
//! per-lane serial loops, warp groups with named barriers, a gemm's right operand from
//! registers, on sm_90a a replicated left operand on `wgmma`, on sm_90 producer rings across a
//! cluster's blocks), with their references: run through the simulator in the tests and on the
//! GPU by `kda check --gpu`, so both agree with hardware.

use crate::reference::{rel_err, Rng};
use kda_dsl::tile::KernelDef;
use kda_dsl::{DType, Target};
use kda_macros::kernel;

/// Tile extents and threads of a self-test kernel.
#[derive(Clone, Debug)]
pub struct TileCfg {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Threads per block.
    pub threads: usize,
}

/// `y = x - rowmax(x) + colsum(x)` and `sums = colsum(x)` on one fragment.
#[kernel]
pub fn row_col_stats(cfg: &TileCfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>, sums: GlobalMut<(C,), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    let rmax = fragment([cfg.rows], F32);
    let csum = fragment([cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    reduce_max(f, rmax, 1);
    reduce_sum(f, csum, 0);
    for (i, j) in parallel(f) {
        f[i][j] = f[i][j] - rmax[i] + csum[j];
    }
    copy(f, y.tile([0, 0], [cfg.rows, cfg.cols]));
    copy(csum, sums.tile([0], [cfg.cols]));
}

/// `y[j] = sum_{i <= j} x[i] * (i + 1)`, one lane per column with a loop of its own length.
#[kernel]
pub fn per_lane_prefix(cfg: &TileCfg, x: Global<(C,), F32>, y: GlobalMut<(C,), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let xs = shared([cfg.cols], F32);
    let ys = shared([cfg.cols], F32);
    copy(x.tile([0], [cfg.cols]), xs);
    for (j,) in parallel(ys) {
        let mut acc = 0.0;
        for i in serial(0, j + 1) {
            acc = acc + xs[i] * (i as f32 + 1.0);
        }
        ys[j] = acc;
    }
    copy(ys, y.tile([0], [cfg.cols]));
}

/// Warps 0-1 sum the rows of a 16 x 64 `x` while warps 2-3 scan the columns of a 32 x 16 `y`:
/// each group synchronizes on its own named barrier, so neither waits for the other.
#[kernel]
pub fn two_warp_groups(
    cfg: &TileCfg,
    x: Global<(R, C), F32>,
    sums: GlobalMut<(R,), F32>,
    y: Global<(R2, C2), F32>,
    z: GlobalMut<(R2, C2), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    for w in warp_group(0, 2) {
        let f = fragment([16, 64], F32);
        let r = fragment([16], F32);
        copy(x.tile([0, 0], [16, 64]), f);
        reduce_sum(f, r, 1);
        copy(r, sums.tile([0], [16]));
    }
    for w in warp_group(2, 2) {
        let s = shared([32, 16], F32);
        copy(y.tile([0, 0], [32, 16]), s);
        cumsum(s, s, 0);
        copy(s, z.tile([0, 0], [32, 16]));
    }
}

/// `o1 = x · y` and `o2 = x · ytᵀ` on tensor cores, `x` [16, 64] staged to bf16 in shared
/// memory, `y` [64, cols] and `yt` [cols, 64] held as f32 register fragments: the right
/// operand from registers, transposed by `movmatrix` for `y`, packed as it is for `yt.t()`.
#[kernel]
pub fn right_operand_from_registers(
    cfg: &TileCfg,
    x: Global<(M, K), F32>,
    y: Global<(K, N), F32>,
    yt: Global<(N, K), F32>,
    o1: GlobalMut<(M, N), F32>,
    o2: GlobalMut<(M, N), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let x_sh = shared([16, 64], BF16);
    copy(x.tile([0, 0], [16, 64]), x_sh);
    let yf = fragment([64, cfg.cols], F32);
    copy(y.tile([0, 0], [64, cfg.cols]), yf);
    let ytf = fragment([cfg.cols, 64], F32);
    copy(yt.tile([0, 0], [cfg.cols, 64]), ytf);
    let c1 = fragment([16, cfg.cols], F32);
    clear(c1);
    gemm(x_sh, yf, c1);
    copy(c1, o1.tile([0, 0], [16, cfg.cols]));
    let c2 = fragment([16, cfg.cols], F32);
    clear(c2);
    gemm(x_sh, ytf.t(), c2);
    copy(c2, o2.tile([0, 0], [16, cfg.cols]));
}

/// `o = x · yᵀ` once per warp of 8 (two warpgroups): every warp multiplies the whole 16-row
/// `x` (`x.replicated()`) into its own 16 rows of `c`. On sm_90a a `wgmma` whose A every warp
/// loads from the same rows by `ldmatrix`, as the prefill's key products take it.
#[kernel]
pub fn replicated_left_operand(
    cfg: &TileCfg,
    x: Global<(M, K), F32>,
    y: Global<(N, K), F32>,
    o: GlobalMut<(MO, N), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let x_sh = shared([16, 64], BF16);
    copy(x.tile([0, 0], [16, 64]), x_sh);
    let y_sh = shared([cfg.cols, 64], BF16);
    copy(y.tile([0, 0], [cfg.cols, 64]), y_sh);
    let c = fragment([cfg.rows, cfg.cols], F32);
    clear(c);
    gemm(x_sh.replicated(), y_sh.t(), c);
    copy(c, o.tile([0, 0], [cfg.rows, cfg.cols]));
}

/// `o = x · yᵀ` with 8 of the accumulator's columns a warp (a 2 x 2 grid of warps over
/// `[rows, 16]`): each warp's B is one 8-column `ldmatrix.x2` a K-step.
#[kernel]
pub fn eight_columns_a_warp(cfg: &TileCfg, x: Global<(M, K), F32>, y: Global<(N, K), F32>, o: GlobalMut<(M, N), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let x_sh = shared([cfg.rows, 64], BF16);
    copy(x.tile([0, 0], [cfg.rows, 64]), x_sh);
    let y_sh = shared([cfg.cols, 64], BF16);
    copy(y.tile([0, 0], [cfg.cols, 64]), y_sh);
    let c = fragment([cfg.rows, cfg.cols], F32);
    clear(c);
    gemm(x_sh, y_sh.t(), c);
    copy(c, o.tile([0, 0], [cfg.rows, cfg.cols]));
}

/// A producer ring across a cluster's config: fill warps (1: one producer group a block, 8:
/// two), stages, iterations fewer in the odd blocks (0 but where a test breaks the rule that a
/// cluster's blocks share the loop's bounds), and whether the compute warps read the producer's
/// fill too (else only the producer block does, and each group keeps it in slots of its own).
#[derive(Clone, Debug)]
pub struct ClusterRingCfg {
    /// Fill warps a block (4 a producer group).
    pub fill_warps: usize,
    /// The loop's stages.
    pub stages: usize,
    /// Iterations the odd blocks leave out (0 for a valid kernel).
    pub fewer_in_odd_blocks: i32,
    /// Whether the compute warps read the producer's fill `x` too.
    pub body_reads_fill: bool,
}

/// A producer ring across clusters of two blocks: `y[b] = 2 x + 1 + z[b]` (`+ x` with
/// `body_reads_fill`), 16 rows an iteration. The blocks' producer groups take turns at the
/// iterations (`2 x + 1`, handed to both blocks); each block's compute warps add its own rows of
/// `z`, which they fill themselves.
#[kernel]
pub fn cluster_ring(
    cfg: &ClusterRingCfg,
    x: Global<(T, C), F32>,
    z: Global<(NB, T, C), F32>,
    y: GlobalMut<(NB, T, C), F32>,
) {
    let (bx,) = launch(grid = [NB], threads = 64, fill_warps = cfg.fill_warps, cluster = 2);
    let xs = shared([16, 32], F32);
    let zs = shared([16, 32], F32);
    let ys = shared([16, 32], F32);
    let f = fragment([16, 32], F32);
    for i in pipelined(0, T / 16 - (bx % 2) * cfg.fewer_in_odd_blocks, stages = cfg.stages) {
        copy(x.tile([i, 0], [16, 32]), xs);
        // Each block's own rows: only its compute warps read them.
        copy(z.tile_at([bx, 16 * i, 0], [1, 16, 32]), zs);
        for _ in producer() {
            for (r, c) in parallel(ys) {
                ys[r][c] = xs[r][c] * 2.0 + 1.0;
            }
        }
        copy(ys, f);
        for (r, c) in parallel(f) {
            f[r][c] = f[r][c] + zs[r][c];
        }
        if cfg.body_reads_fill {
            for (r, c) in parallel(f) {
                f[r][c] = f[r][c] + xs[r][c];
            }
        }
        copy(f, y.tile_at([bx, 16 * i, 0], [1, 16, 32]));
    }
}

/// One self-test: a kernel, its f32 inputs, the outputs it writes and what they must hold.
pub struct SelfTest {
    /// Row name.
    pub name: &'static str,
    /// The kernel.
    pub def: KernelDef,
    /// The target it is compiled for (sm_90a for a lowering only that target has).
    pub target: Target,
    /// (tensor name, shape, values).
    pub inputs: Vec<(&'static str, Vec<usize>, Vec<f64>)>,
    /// (tensor name, shape, expected values).
    pub outputs: Vec<(&'static str, Vec<usize>, Vec<f64>)>,
}

impl SelfTest {
    /// The worst relative error of `got` (in `outputs` order) against the expected values.
    pub fn error(&self, got: &[Vec<f64>]) -> f64 {
        self.outputs.iter().zip(got).map(|((_, _, want), g)| rel_err(g, want)).fold(0.0, f64::max)
    }
}

/// The self-tests, on fresh random inputs from `seed`.
pub fn selftests(seed: u64) -> Result<Vec<SelfTest>, kda_dsl::Diag> {
    let mut rng = Rng::new(seed);
    let mut out = vec![];
    {
        // 8 warps over 64 x 64: rows and columns both split over warps, so both reductions go
        // through shared scratch.
        let (r, c) = (64, 64);
        let x = rng.normals(r * c, DType::F32);
        let rmax: Vec<f64> = (0..r).map(|i| (0..c).map(|j| x[i * c + j]).fold(f64::MIN, f64::max)).collect();
        let csum: Vec<f64> = (0..c).map(|j| (0..r).map(|i| x[i * c + j]).sum()).collect();
        let y = (0..r * c).map(|k| x[k] - rmax[k / c] + csum[k % c]).collect();
        out.push(SelfTest {
            name: "dsl/reductions_across_warps",
            def: row_col_stats(&TileCfg { rows: r, cols: c, threads: 256 })?,
            target: Target::Sm80,
            inputs: vec![("x", vec![r, c], x)],
            outputs: vec![("y", vec![r, c], y), ("sums", vec![c], csum)],
        });
    }
    {
        let x = rng.normals(64, DType::F32);
        let y = (0..64).map(|j| (0..=j).map(|i| x[i] * (i as f64 + 1.0)).sum()).collect();
        out.push(SelfTest {
            name: "dsl/per_lane_serial_loops",
            def: per_lane_prefix(&TileCfg { rows: 1, cols: 64, threads: 32 })?,
            target: Target::Sm80,
            inputs: vec![("x", vec![64], x)],
            outputs: vec![("y", vec![64], y)],
        });
    }
    {
        let x = rng.normals(16 * 64, DType::F32);
        let y = rng.normals(32 * 16, DType::F32);
        let sums = (0..16).map(|r| (0..64).map(|c| x[r * 64 + c]).sum()).collect();
        let mut scan = y.clone();
        for r in 1..32 {
            for c in 0..16 {
                scan[r * 16 + c] += scan[(r - 1) * 16 + c];
            }
        }
        out.push(SelfTest {
            name: "dsl/warp_groups_named_barriers",
            def: two_warp_groups(&TileCfg { rows: 0, cols: 0, threads: 128 })?,
            target: Target::Sm80,
            inputs: vec![("x", vec![16, 64], x), ("y", vec![32, 16], y)],
            outputs: vec![("sums", vec![16], sums), ("z", vec![32, 16], scan)],
        });
    }
    {
        // Multiples of 1/8 below 4 in magnitude: exact in bf16, and every product and sum exact
        // in f32, so the only error is a wrong operand.
        let eighths = |rng: &mut Rng, n: usize| -> Vec<f64> {
            rng.normals(n, DType::F32).into_iter().map(|v| (v * 8.0).round().clamp(-31.0, 31.0) / 8.0).collect()
        };
        let (m, k, n) = (16, 64, 32);
        let x = eighths(&mut rng, m * k);
        let y = eighths(&mut rng, k * n);
        let yt: Vec<f64> = (0..n * k).map(|i| y[(i % k) * n + i / k]).collect();
        let o: Vec<f64> = (0..m * n).map(|e| (0..k).map(|j| x[(e / n) * k + j] * y[j * n + e % n]).sum()).collect();
        out.push(SelfTest {
            name: "dsl/gemm_right_operand_from_registers",
            def: right_operand_from_registers(&TileCfg { rows: m, cols: n, threads: 64 })?,
            target: Target::Sm80,
            inputs: vec![("x", vec![m, k], x.clone()), ("y", vec![k, n], y), ("yt", vec![n, k], yt)],
            outputs: vec![("o1", vec![m, n], o.clone()), ("o2", vec![m, n], o)],
        });
        // `x · yᵀ` for 32 rows and 16 columns over 4 warps: 8 columns a warp.
        let (rows, n) = (32, 16);
        let x32 = eighths(&mut rng, rows * k);
        let y16 = eighths(&mut rng, n * k);
        let o8: Vec<f64> =
            (0..rows * n).map(|e| (0..k).map(|j| x32[(e / n) * k + j] * y16[(e % n) * k + j]).sum()).collect();
        out.push(SelfTest {
            name: "dsl/gemm_eight_columns_a_warp",
            def: eight_columns_a_warp(&TileCfg { rows, cols: n, threads: 128 })?,
            target: Target::Sm80,
            inputs: vec![("x", vec![rows, k], x32), ("y", vec![n, k], y16)],
            outputs: vec![("o", vec![rows, n], o8)],
        });
        // The same exact values, `x · yᵀ` in each of 8 warps' rows, on sm_90a's `wgmma`.
        let (warps, n) = (8, 32);
        let y = eighths(&mut rng, n * k);
        let once: Vec<f64> =
            (0..m * n).map(|e| (0..k).map(|j| x[(e / n) * k + j] * y[(e % n) * k + j]).sum()).collect();
        let o: Vec<f64> = (0..warps).flat_map(|_| once.clone()).collect();
        out.push(SelfTest {
            name: "dsl/gemm_replicated_left_operand_wgmma",
            def: replicated_left_operand(&TileCfg { rows: warps * m, cols: n, threads: 32 * warps })?,
            target: Target::Sm90a,
            inputs: vec![("x", vec![m, k], x), ("y", vec![n, k], y)],
            outputs: vec![("o", vec![warps * m, n], o)],
        });
    }
    // Producer rings across clusters of two blocks, on sm_90: one group a block with its fill
    // a turn ahead in slots of its own, and two groups a block whose fill the compute warps
    // read too (copied along with the hand-over); each block's own rows of `z` beside.
    for (name, fill_warps, stages, body_reads_fill) in [
        ("dsl/producer_ring_across_a_cluster_own_fills", 1, 5, false),
        ("dsl/producer_ring_across_a_cluster_two_groups", 8, 6, true),
    ] {
        let (blocks, rows, cols) = (4, 16 * 13, 32);
        let x = rng.normals(rows * cols, DType::F32);
        let z = rng.normals(blocks * rows * cols, DType::F32);
        let times = if body_reads_fill { 3.0 } else { 2.0 };
        let y = (0..blocks * rows * cols).map(|k| times * x[k % (rows * cols)] + 1.0 + z[k]).collect();
        out.push(SelfTest {
            name,
            def: cluster_ring(&ClusterRingCfg { fill_warps, stages, fewer_in_odd_blocks: 0, body_reads_fill })?,
            target: Target::Sm90,
            inputs: vec![("x", vec![rows, cols], x), ("z", vec![blocks, rows, cols], z)],
            outputs: vec![("y", vec![blocks, rows, cols], y)],
        });
    }
    Ok(out)
}
