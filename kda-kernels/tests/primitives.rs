//! Every tile primitive, in small kernels run through the simulator against Rust references.

use kda_dsl::sim::SimArg;
use kda_dsl::DType;
use kda_kernels::check::{simulate, tensor_values};
use kda_kernels::reference::{rel_err, round_to, to_bytes, Rng};
use kda_kernels::selftest::{cluster_ring, ClusterRingCfg};
use kda_macros::kernel;

/// A test config: tile extents and threads.
#[derive(Clone)]
struct Cfg {
    rows: usize,
    cols: usize,
    threads: usize,
}

fn t(name: &str, v: &[f64], d: DType) -> (String, SimArg) {
    (name.to_string(), SimArg::Tensor(to_bytes(v, d)))
}
fn i(name: &str, v: usize) -> (String, SimArg) {
    (name.to_string(), SimArg::I32(v as i32))
}

#[kernel]
fn math(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    for (i, j) in parallel(f) {
        let v = f[i][j];
        let a = abs(v) + 1.0;
        let w = select(i > j, exp(v), sigmoid(v)) + softplus(v) * rsqrt(a) + log(a) - exp2(v * 0.5);
        let m = max(min(w, 4.0), -4.0);
        f[i][j] = (m as bf16) + (i as f32) * 0.25 - (j as f32);
    }
    copy(f, y.tile([0, 0], [cfg.rows, cfg.cols]));
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

#[test]
fn element_wise_math_select_and_casts() {
    let cfg = Cfg { rows: 32, cols: 32, threads: 128 };
    let (r, c) = (32, 32);
    let x = Rng::new(1).normals(r * c, DType::F32);
    let mut args = vec![t("x", &x, DType::F32), i("R", r), i("C", c), t("y", &vec![f64::NAN; r * c], DType::F32)];
    simulate(&math(&cfg).expect("builds"), &mut args).expect("runs");
    let got = tensor_values(&args, "y", DType::F32);
    let want: Vec<f64> = (0..r * c)
        .map(|k| {
            let (ii, jj, v) = (k / c, k % c, x[k]);
            let a = v.abs() + 1.0;
            let sel = if ii > jj { v.exp() } else { 1.0 / (1.0 + (-v).exp()) };
            let w = sel + softplus(v) / a.sqrt() + a.ln() - (v * 0.5).exp2();
            round_to(w.clamp(-4.0, 4.0), DType::BF16) + ii as f64 * 0.25 - jj as f64
        })
        .collect();
    assert!(rel_err(&got, &want) < 1e-5, "rel err {}", rel_err(&got, &want));
}

#[kernel]
fn scans(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>, z: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    let s = shared([cfg.rows, cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), s);
    cumsum(f, f, 1);
    cumsum(s, s, 0);
    copy(f, y.tile([0, 0], [cfg.rows, cfg.cols]));
    copy(s, z.tile([0, 0], [cfg.rows, cfg.cols]));
}

#[test]
fn cumsum_of_fragments_and_shared_tiles() {
    let cfg = Cfg { rows: 32, cols: 16, threads: 64 };
    let (r, c) = (32, 16);
    let x = Rng::new(3).normals(r * c, DType::F32);
    let mut args = vec![
        t("x", &x, DType::F32),
        i("R", r),
        i("C", c),
        t("y", &vec![f64::NAN; r * c], DType::F32),
        t("z", &vec![f64::NAN; r * c], DType::F32),
    ];
    simulate(&scans(&cfg).expect("builds"), &mut args).expect("runs");
    let mut rows = x.clone();
    let mut cols = x.clone();
    for ii in 0..r {
        for jj in 1..c {
            rows[ii * c + jj] += rows[ii * c + jj - 1];
        }
    }
    for jj in 0..c {
        for ii in 1..r {
            cols[ii * c + jj] += cols[(ii - 1) * c + jj];
        }
    }
    assert!(rel_err(&tensor_values(&args, "y", DType::F32), &rows) < 1e-6);
    assert!(rel_err(&tensor_values(&args, "z", DType::F32), &cols) < 1e-6);
}

#[kernel]
fn gather_rows(cfg: &Cfg, idx: Global<(NB,), I32>, x: Global<(R, C), F32>, out: GlobalMut<(NB, C), F32>) {
    let (n,) = launch(grid = [NB], threads = cfg.threads);
    let s = shared([cfg.cols], F32);
    clear(s);
    let row = idx[n];
    if row >= 0 {
        // A run-time bound read from global memory.
        for r in serial(0, row + 1) {
            for (j,) in parallel(s) {
                s[j] = s[j] + x[r][j];
            }
        }
    }
    copy(s, out.tile([n, 0], [1, cfg.cols]));
}

#[test]
fn scalar_reads_runtime_if_and_runtime_loop_bounds() {
    let cfg = Cfg { rows: 0, cols: 32, threads: 32 };
    let (r, c) = (6, 32);
    let x = Rng::new(4).normals(r * c, DType::F32);
    let idx = [2.0, -1.0, 5.0, 0.0];
    let nb = idx.len();
    let mut args = vec![
        t("idx", &idx, DType::I32),
        i("NB", nb),
        t("x", &x, DType::F32),
        i("R", r),
        i("C", c),
        t("out", &vec![f64::NAN; nb * c], DType::F32),
    ];
    simulate(&gather_rows(&cfg).expect("builds"), &mut args).expect("runs");
    let want: Vec<f64> = (0..nb * c)
        .map(|k| {
            let (n, j) = (k / c, k % c);
            let row = idx[n] as i64;
            (0..=row).map(|rr| x[rr as usize * c + j]).sum::<f64>()
        })
        .collect();
    assert_eq!(
        tensor_values(&args, "out", DType::F32).iter().map(|v| (v * 1e4).round()).collect::<Vec<_>>(),
        want.iter().map(|v| (v * 1e4).round()).collect::<Vec<_>>()
    );
}

#[kernel]
fn locals_and_unroll(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let w = local([4], F32);
    for u in unroll(4) {
        w[u] = x[0][u] * 2.0;
    }
    let f = fragment([cfg.rows, cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    let mut total = 0.0;
    for u in unroll(4) {
        total = total + w[u];
    }
    for (i, j) in parallel(f) {
        f[i][j] = f[i][j] * w[3] + total;
    }
    copy(f, y.tile([0, 0], [cfg.rows, cfg.cols]));
}

#[test]
fn local_tiles_unrolled_loops_and_mutable_scalars() {
    let cfg = Cfg { rows: 16, cols: 16, threads: 32 };
    let (r, c) = (16, 16);
    let x = Rng::new(5).normals(r * c, DType::F32);
    let mut args = vec![t("x", &x, DType::F32), i("R", r), i("C", c), t("y", &vec![f64::NAN; r * c], DType::F32)];
    simulate(&locals_and_unroll(&cfg).expect("builds"), &mut args).expect("runs");
    let total: f64 = (0..4).map(|u| x[u] * 2.0).sum();
    let want: Vec<f64> = x.iter().map(|v| v * x[3] * 2.0 + total).collect();
    assert!(rel_err(&tensor_values(&args, "y", DType::F32), &want) < 1e-6);
}

#[kernel]
fn attention_like(
    cfg: &Cfg,
    q: Global<(R, D), BF16>,
    k: Global<(C, D), BF16>,
    v: Global<(C, D), BF16>,
    o: GlobalMut<(R, D), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let qs = shared([cfg.rows, 32], BF16);
    let ks = shared([cfg.cols, 32], BF16);
    let vs = shared([cfg.cols, 32], BF16);
    copy(q.tile([0, 0], [cfg.rows, 32]), qs);
    copy(k.tile([0, 0], [cfg.cols, 32]), ks);
    copy(v.tile([0, 0], [cfg.cols, 32]), vs);
    let p = fragment([cfg.rows, cfg.cols], F32);
    clear(p);
    gemm(qs, ks.t(), p);
    // P stays in registers as the left operand of the next product.
    let acc = fragment([cfg.rows, 32], F32);
    clear(acc);
    gemm(p, vs, acc);
    copy(acc, o.tile([0, 0], [cfg.rows, 32]));
}

#[test]
fn gemm_with_the_left_operand_from_registers() {
    let cfg = Cfg { rows: 64, cols: 32, threads: 128 };
    let (r, c, d) = (64, 32, 32);
    let mut rng = Rng::new(6);
    let q = rng.normals(r * d, DType::BF16);
    let k = rng.normals(c * d, DType::BF16);
    let v = rng.normals(c * d, DType::BF16);
    let mut args = vec![
        t("q", &q, DType::BF16),
        i("R", r),
        i("D", d),
        t("k", &k, DType::BF16),
        i("C", c),
        t("v", &v, DType::BF16),
        t("o", &vec![f64::NAN; r * d], DType::F32),
    ];
    simulate(&attention_like(&cfg).expect("builds"), &mut args).expect("runs");
    let p: Vec<f64> = (0..r * c)
        .map(|x| round_to((0..d).map(|e| q[(x / c) * d + e] * k[(x % c) * d + e]).sum(), DType::BF16))
        .collect();
    let want: Vec<f64> = (0..r * d).map(|x| (0..c).map(|e| p[(x / d) * c + e] * v[e * d + x % d]).sum()).collect();
    let err = rel_err(&tensor_values(&args, "o", DType::F32), &want);
    assert!(err < 1e-5, "rel err {err}");
}

#[kernel]
fn show(cfg: &Cfg, x: Global<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    print(f);
}

#[test]
fn print_shows_a_fragment_once_in_logical_order() {
    let cfg = Cfg { rows: 16, cols: 8, threads: 32 };
    let x: Vec<f64> = (0..128).map(|v| v as f64).collect();
    let mut args = vec![t("x", &x, DType::F32), i("R", 16), i("C", 8)];
    let rep = simulate(&show(&cfg).expect("builds"), &mut args).expect("runs");
    assert_eq!(rep.prints.len(), 1);
    let lines: Vec<&str> = rep.prints[0].lines().collect();
    assert_eq!(lines.len(), 17, "{}", rep.prints[0]);
    assert!(lines[1].contains("[0.000000, 1.000000, 2.000000"), "{}", lines[1]);
    assert!(lines[16].contains("127.000000]"), "{}", lines[16]);
}

#[test]
fn reductions_across_warps_per_lane_loops_and_warp_groups() {
    // The self-test kernels `kda check --gpu` also runs on the GPU.
    for t in kda_kernels::selftest::selftests(2).expect("builds") {
        let got = kda_kernels::check::simulate_selftest(&t).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(t.error(&got) < 1e-6, "{}: rel err {}", t.name, t.error(&got));
        // An sm_90a self-test is there for its `wgmma`.
        if t.target == kda_dsl::Target::Sm90a {
            assert_eq!(kda_kernels::check::takes_wgmma(&t.def, t.target), Ok(true), "{}", t.name);
        }
    }
}

#[test]
fn warp_groups_synchronize_on_their_own_named_barriers() {
    let def =
        kda_kernels::selftest::two_warp_groups(&kda_kernels::selftest::TileCfg { rows: 0, cols: 0, threads: 128 })
            .expect("builds");
    let ptx = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect("compiles").ptx;
    assert!(ptx.contains("bar.sync 1, 64;") && ptx.contains("bar.sync 2, 64;"), "named barriers per group");
}

/// A bf16 tile through a swizzled shared tile (one address per fill pass, one swizzle per
/// thread for the register loads), then row sums of `x * w + x` (one fused multiply-add) and
/// the vector's dot product with itself (fused into one loop accumulating into a local).
#[kernel]
fn staged_rows(
    cfg: &Cfg,
    x: Global<(R, C), BF16>,
    w: Global<(C,), F32>,
    y: GlobalMut<(R,), F32>,
    z: GlobalMut<(R, C), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    assume_extent(C, 128);
    let xs = shared([cfg.rows, 128], BF16);
    let f = fragment([cfg.rows, 128], F32);
    let tmp = fragment([cfg.rows, 128], F32);
    let wf = fragment([128], F32);
    let sq = fragment([128], F32);
    let rs = fragment([cfg.rows], F32);
    let nrm = local([1], F32);
    copy(x.tile([0, 0], [cfg.rows, 128]), xs);
    copy(w.tile([0], [128]), wf);
    copy(xs, f);
    for (i, j) in parallel(f) {
        tmp[i][j] = f[i][j] * wf[j] + f[i][j];
    }
    reduce_sum(tmp, rs, 1);
    for (j,) in parallel(sq) {
        sq[j] = wf[j] * wf[j];
    }
    reduce_sum(sq, nrm, 0);
    for (i,) in parallel(rs) {
        rs[i] = rs[i] * nrm[0];
    }
    copy(rs, y.tile([0], [cfg.rows]));
    copy(f, z.tile([0, 0], [cfg.rows, 128]));
}

#[test]
fn swizzled_bf16_rows_fused_multiply_add_and_fused_dot() {
    for threads in [32, 64] {
        let cfg = Cfg { rows: 16 * threads / 32, cols: 128, threads };
        let (r, c) = (cfg.rows, 128);
        let x: Vec<f64> = Rng::new(3).normals(r * c, DType::BF16);
        let w = Rng::new(4).normals(c, DType::F32);
        let mut args = vec![
            t("x", &x, DType::BF16),
            i("R", r),
            i("C", c),
            t("w", &w, DType::F32),
            t("y", &vec![f64::NAN; r], DType::F32),
            t("z", &vec![f64::NAN; r * c], DType::F32),
        ];
        let def = staged_rows(&cfg).expect("builds");
        simulate(&def, &mut args).expect("runs");
        let ww: f64 = w.iter().map(|v| v * v).sum();
        let want: Vec<f64> =
            (0..r).map(|ii| (0..c).map(|jj| x[ii * c + jj] * (w[jj] + 1.0)).sum::<f64>() * ww).collect();
        let got = tensor_values(&args, "y", DType::F32);
        assert!(rel_err(&got, &want) < 1e-5, "{threads} threads: rel err {}", rel_err(&got, &want));
        // The fragment holds the staged values exactly.
        assert_eq!(tensor_values(&args, "z", DType::F32), x, "{threads} threads");
        let ptx = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect("compiles").ptx;
        assert!(ptx.contains("fma.rn.f32") && ptx.contains("ld.shared.v2.b32"), "{threads} threads");
    }
}

/// Prefetches a box that runs past the tensor's rows, then copies the same rows.
#[kernel]
fn prefetched_rows(cfg: &Cfg, x: Global<(R, C), BF16>, y: GlobalMut<(R, C), F32>, R0: Dim) {
    let (bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    prefetch(x.tile_at([R0, 0], [cfg.rows, cfg.cols]));
    prefetch(x.tile_at([R0 + 1, 3], [1, 1]));
    // A column of the tensor: one hint per element.
    prefetch(x.tile_at([R0, 5], [cfg.rows, 1]));
    copy(x.tile_at([R0, 0], [cfg.rows, cfg.cols]), f);
    copy(f, y.tile_at([R0, 0], [cfg.rows, cfg.cols]));
}

#[test]
fn prefetch_issues_one_hint_per_line_and_masks_like_a_copy() {
    // 16 rows of 200 bf16 (400 bytes: hints at elements 0, 64, 128, 192 and, for a row that does
    // not start a line, 199), from row 8 of 20: the last 4 rows are past the tensor, and the
    // simulator fails any hint outside it.
    let cfg = Cfg { rows: 16, cols: 200, threads: 32 };
    let (r, c, r0) = (20, 200, 8);
    let x = Rng::new(3).normals(r * c, DType::BF16);
    let k = prefetched_rows(&cfg).expect("builds");
    let mut args =
        vec![t("x", &x, DType::BF16), i("R", r), i("C", c), i("R0", r0), t("y", &vec![0.0; r * c], DType::F32)];
    simulate(&k, &mut args).expect("runs");
    let got = tensor_values(&args, "y", DType::F32);
    for (e, (g, w)) in got.iter().zip(&x).enumerate() {
        let want = if e / c >= r0 { *w } else { 0.0 };
        assert_eq!(*g, want, "element {e}");
    }
    let ptx = kda_dsl::compile(k, kda_dsl::Target::Sm80).expect("compiles").ptx;
    // 16 rows x 5 hints over 32 threads (3 rounds), one single-element hint, and a 16-element
    // column (one round).
    assert_eq!(ptx.matches("prefetch.global.L2").count(), 3 + 1 + 1, "{ptx}");
    assert!(ptx.contains("@%p") && ptx.lines().filter(|l| l.contains("prefetch.global.L2")).all(|l| l.contains('@')));
}

#[kernel]
fn prefetch_of_a_tile(cfg: &Cfg, x: Global<(R, C), F32>) {
    let (bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    prefetch(f);
}

#[kernel]
fn prefetch_of_a_cube(cfg: &Cfg, x: Global<(R, C, D), F32>) {
    let (bx,) = launch(grid = [1], threads = cfg.threads);
    prefetch(x.tile_at([0, 0, 0], [2, 2, 2]));
}

#[test]
fn prefetch_takes_a_global_box_of_at_most_two_long_axes() {
    let cfg = Cfg { rows: 16, cols: 16, threads: 32 };
    // Both point at the user's `prefetch` line.
    let line = |e: &kda_dsl::Diag| include_str!("primitives.rs").lines().nth(e.loc.line as usize - 1).unwrap_or("");
    let e = prefetch_of_a_tile(&cfg).expect_err("a tile");
    assert!(e.message.contains("`prefetch` takes a global box") && line(&e).contains("prefetch(f)"), "{e:?}");
    let e = prefetch_of_a_cube(&cfg).expect_err("3 axes");
    assert!(e.message.contains("at most two axes longer than 1") && line(&e).contains("[2, 2, 2]"), "{e:?}");
}

/// A fragment whose rows each lie across a whole warp (`lanes_per_row = 32`): filled through
/// shared memory, scaled by a column vector, reduced along both axes, and stored back.
#[kernel]
fn rows_across_lanes(
    cfg: &Cfg,
    x: Global<(R, C), F32>,
    w: Global<(C,), F32>,
    rsum: GlobalMut<(R,), F32>,
    csum: GlobalMut<(C,), F32>,
    z: GlobalMut<(R, C), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    assume_extent(C, 128);
    let xs = shared([cfg.rows, 128], F32);
    let f = fragment([cfg.rows, 128], F32, lanes_per_row = 32);
    let wf = fragment([128], F32);
    let rs = fragment([cfg.rows], F32);
    let cs = shared([128], F32);
    copy(x.tile([0, 0], [cfg.rows, 128]), xs);
    copy(w.tile([0], [128]), wf);
    copy(xs, f);
    for (i, j) in parallel(f) {
        f[i][j] = f[i][j] * wf[j] + (i as f32);
    }
    reduce_sum(f, rs, 1);
    reduce_sum(f, cs, 0);
    copy(rs, rsum.tile([0], [cfg.rows]));
    copy(cs, csum.tile([0], [128]));
    copy(f, z.tile([0, 0], [cfg.rows, 128]));
}

#[test]
fn fragments_with_rows_across_the_warp_reduce_both_ways() {
    // 2 rows on one warp (one atom), 8 on one (four), 8 on two (four rows each), 2 on two
    // (warps side by side along the row: the row reduction meets across warps in shared memory).
    for (rows, threads) in [(2, 32), (8, 32), (8, 64), (2, 64)] {
        let cfg = Cfg { rows, cols: 128, threads };
        let c = 128;
        let x = Rng::new(5).normals(rows * c, DType::F32);
        let w = Rng::new(6).normals(c, DType::F32);
        let mut args = vec![
            t("x", &x, DType::F32),
            i("R", rows),
            i("C", c),
            t("w", &w, DType::F32),
            t("rsum", &vec![f64::NAN; rows], DType::F32),
            t("csum", &vec![f64::NAN; c], DType::F32),
            t("z", &vec![f64::NAN; rows * c], DType::F32),
        ];
        let def = rows_across_lanes(&cfg).expect("builds");
        simulate(&def, &mut args).expect("runs");
        let zw: Vec<f64> = (0..rows * c).map(|k| x[k] * w[k % c] + (k / c) as f64).collect();
        let rw: Vec<f64> = (0..rows).map(|r| zw[r * c..(r + 1) * c].iter().sum()).collect();
        let cw: Vec<f64> = (0..c).map(|j| (0..rows).map(|r| zw[r * c + j]).sum()).collect();
        let what = format!("{rows} rows, {threads} threads");
        assert!(rel_err(&tensor_values(&args, "z", DType::F32), &zw) < 1e-6, "{what}");
        assert!(rel_err(&tensor_values(&args, "rsum", DType::F32), &rw) < 1e-5, "{what}");
        assert!(rel_err(&tensor_values(&args, "csum", DType::F32), &cw) < 1e-5, "{what}");
        // A row reduction crosses all 32 lanes; 4 columns per lane (2 when two warps share a
        // row of 128), one access each.
        let ptx = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect("compiles").ptx;
        assert!(ptx.contains("shfl.sync.bfly.b32") && ptx.contains(", 16, 31, -1;"), "{what}");
        let store = if (rows, threads) == (2, 64) { "st.global.v2.f32" } else { "st.global.v4.f32" };
        assert!(ptx.contains(store), "{what}");
    }
}

/// A fragment asking for `cfg.rows` lanes per row (only 4 and 32 exist).
#[kernel]
fn odd_lanes(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([16, 128], F32, lanes_per_row = cfg.rows);
    copy(x.tile([0, 0], [16, 128]), f);
    copy(f, y.tile([0, 0], [16, 128]));
}

#[test]
fn lanes_per_row_other_than_4_or_32_is_an_error_at_the_fragment() {
    let e = odd_lanes(&Cfg { rows: 8, cols: 128, threads: 32 }).map(|_| ()).expect_err("8 lanes per row");
    let msg = e.to_string();
    assert!(msg.contains("lanes_per_row is 4 or 32") && msg.contains("primitives.rs"), "{msg}");
    odd_lanes(&Cfg { rows: 32, cols: 128, threads: 32 }).map(|_| ()).expect("32 lanes build");
}

/// `y[w*16 + i][j] = (a · b)[i][j] * (w + 1)`: every warp multiplies the whole replicated 16-row
/// `a` into its own accumulator rows, then scales them by its warp number, so a warp that read
/// another warp's rows (or none) gives the wrong block.
#[kernel]
fn replicated_gemm(cfg: &Cfg, a: Global<(R, K), BF16>, b: Global<(K, C), BF16>, y: GlobalMut<(RW, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let a_s = shared([16, 32], BF16);
    let b_s = shared([32, cfg.cols], BF16);
    copy(a.tile([0, 0], [16, 32]), a_s);
    copy(b.tile([0, 0], [32, cfg.cols]), b_s);
    let acc = fragment([cfg.rows, cfg.cols], F32);
    clear(acc);
    gemm(a_s.replicated(), b_s, acc);
    for (i, j) in parallel(acc) {
        acc[i][j] = acc[i][j] * ((i / 16) as f32 + 1.0);
    }
    copy(acc, y.tile([0, 0], [cfg.rows, cfg.cols]));
}

/// With fewer copies than warps, the copies lay out on the first warps and the others skip the
/// products (and the stores): the result is the same.
#[test]
fn a_replicated_left_operand_gives_every_warp_the_whole_product() {
    for (copies, warps) in [(1, 1), (2, 2), (4, 4), (8, 8), (1, 8), (2, 4), (1, 2)] {
        let (r, k, c) = (16 * copies, 32, 16);
        let cfg = Cfg { rows: r, cols: c, threads: 32 * warps };
        let mut rng = Rng::new(7);
        let a = rng.normals(16 * k, DType::BF16);
        let b = rng.normals(k * c, DType::BF16);
        let mut args = vec![
            t("a", &a, DType::BF16),
            i("R", 16),
            i("K", k),
            t("b", &b, DType::BF16),
            i("C", c),
            t("y", &vec![f64::NAN; r * c], DType::F32),
            i("RW", r),
        ];
        simulate(&replicated_gemm(&cfg).expect("builds"), &mut args).expect("runs");
        let got = tensor_values(&args, "y", DType::F32);
        let want: Vec<f64> = (0..r * c)
            .map(|e| {
                let (row, j) = (e / c, e % c);
                let dot: f64 = (0..k).map(|p| a[(row % 16) * k + p] * b[p * c + j]).sum();
                dot * ((row / 16) as f64 + 1.0)
            })
            .collect();
        assert!(rel_err(&got, &want) < 1e-5, "{copies} copies on {warps} warps: {}", rel_err(&got, &want));
    }
}

#[test]
fn a_replicated_operand_needs_16_accumulator_rows_per_warp() {
    // 48 rows on 4 warps: 3 copies of the tile's 16, which do not divide the warps.
    let cfg = Cfg { rows: 48, cols: 16, threads: 128 };
    let def = replicated_gemm(&cfg).expect("builds");
    let e = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect_err("rejected").to_string();
    assert!(e.contains("replicated"), "{e}");
}

/// `y[8 i ..][..] = x[2 offs[i] + 1 ..][..]`: each fill's row comes from a `let` in the pipelined
/// body, which the fill (running `stages - 1` iterations ahead) must see for its own iteration.
#[kernel]
fn gather_by_let(cfg: &Cfg, x: Global<(R, C), F32>, offs: Global<(NO,), I32>, y: GlobalMut<(RY, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let s = shared([8, 32], F32);
    for i in pipelined(0, NO, stages = cfg.rows) {
        let row = offs[i] * 2 + 1;
        copy(x.tile_at([row, 0], [8, 32]), s);
        copy(s, y.tile_at([8 * i, 0], [8, 32]));
    }
}

#[test]
fn a_let_in_a_pipelined_body_feeds_the_fills_of_its_own_iteration() {
    let (r, c) = (64, 32);
    let offs: Vec<f64> = vec![5.0, 0.0, 12.0, 3.0, 30.0, 7.0];
    let x = Rng::new(3).normals(r * c, DType::F32);
    for stages in [2, 3] {
        let cfg = Cfg { rows: stages, cols: c, threads: 64 };
        let ry = 8 * offs.len();
        let mut args = vec![
            t("x", &x, DType::F32),
            i("R", r),
            i("C", c),
            t("offs", &offs, DType::I32),
            i("NO", offs.len()),
            t("y", &vec![f64::NAN; ry * c], DType::F32),
            i("RY", ry),
        ];
        simulate(&gather_by_let(&cfg).expect("builds"), &mut args).expect("runs");
        let got = tensor_values(&args, "y", DType::F32);
        let want: Vec<f64> = (0..ry * c)
            .map(|e| {
                let (row, col) = (e / c, e % c);
                let src = 2 * offs[row / 8] as usize + 1 + row % 8;
                if src < r {
                    x[src * c + col]
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(got, want, "{stages} stages");
    }
}

/// A fill reading a value the body carries from one iteration to the next (it cannot be
/// recomputed for the fill's iteration).
#[kernel]
fn carried_fill(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(RY, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let s = shared([8, 32], F32);
    let mut row = 0;
    for i in pipelined(0, 4, stages = 2) {
        row = row + 8;
        copy(x.tile_at([row, 0], [8, 32]), s);
        copy(s, y.tile_at([8 * i, 0], [8, 32]));
    }
}

#[test]
fn a_fill_cannot_read_a_value_carried_across_iterations() {
    let cfg = Cfg { rows: 0, cols: 32, threads: 64 };
    let e =
        kda_dsl::compile(carried_fill(&cfg).expect("builds"), kda_dsl::Target::Sm80).expect_err("rejected").to_string();
    assert!(e.contains("`row`") && e.contains("ahead of the loop body"), "{e}");
}

/// `y = 2 x + rowsum(x)`: named steps through `#[kernel_fn]` helpers (one returns a value, one
/// takes a host count and calls the other), inlined where the kernel calls them.
#[kda_macros::kernel_fn]
fn twice(v: Val) -> Val {
    v * 2.0
}

/// `a x + y`; a `Val` parameter takes a host number too (`a` below).
#[kda_macros::kernel_fn]
fn axpy(a: Val, x: Val, y: Val) -> Val {
    a * x + y
}

#[kda_macros::kernel_fn]
fn add_row_sums(f: Tile, sums: Tile, rounds: usize) {
    reduce_sum(f, sums, 1);
    let half = 0.5 * rounds as f32;
    for _ in 0..rounds {
        for (i, j) in parallel(f) {
            f[i][j] = axpy(0.5, twice(f[i][j]), sums[i]) + twice(f[i][j]) * half;
        }
    }
}

/// Runs a `[16, 32]` kernel of `x` to `y` in the simulator on random `x` (seed `seed`) and
/// checks `y = a x + rowsum(x)`.
fn check_scaled_row_sums(kernel: fn(&Cfg) -> Result<kda_dsl::tile::KernelDef, kda_dsl::Diag>, seed: u64, a: f64) {
    let cfg = Cfg { rows: 16, cols: 32, threads: 64 };
    let (r, c) = (16, 32);
    let x = Rng::new(seed).normals(r * c, DType::F32);
    let mut args = vec![t("x", &x, DType::F32), i("R", r), i("C", c), t("y", &vec![f64::NAN; r * c], DType::F32)];
    simulate(&kernel(&cfg).expect("builds"), &mut args).expect("runs");
    let got = tensor_values(&args, "y", DType::F32);
    let want: Vec<f64> = (0..r * c)
        .map(|e| {
            let row: f64 = x[(e / c) * c..(e / c + 1) * c].iter().sum();
            a * x[e] + row
        })
        .collect();
    assert!(rel_err(&got, &want) < 1e-6, "{}", rel_err(&got, &want));
}

#[kernel]
fn with_helpers(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    let sums = fragment([cfg.rows], F32);
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    add_row_sums(f, sums, 1);
    copy(f, y.tile([0, 0], [cfg.rows, cfg.cols]));
}

#[test]
fn kernel_helpers_are_inlined_where_they_are_called() {
    check_scaled_row_sums(with_helpers, 5, 2.0);
}

/// The tiles of [`row_sums`] and [`scale_rows`], passed as one argument.
#[derive(Clone, Copy)]
struct RowTiles {
    f: kda_dsl::builder::Tile,
    sums: kda_dsl::builder::Tile,
    scaled: kda_dsl::builder::Tile,
}

/// `sums = rowsum(f)`: a helper taking the struct and leaving a field out.
#[kda_macros::kernel_fn]
fn row_sums(RowTiles { f, sums, .. }: RowTiles) {
    reduce_sum(f, sums, 1);
}

/// `scaled = a f + sums`: binding fields under other names.
#[kda_macros::kernel_fn]
fn scale_rows(RowTiles { f: rows, sums, scaled: out }: RowTiles, a: Val) {
    for (i, j) in parallel(rows) {
        out[i][j] = a * rows[i][j] + sums[i];
    }
}

#[kernel]
fn with_tile_struct(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let f = fragment([cfg.rows, cfg.cols], F32);
    let sums = fragment([cfg.rows], F32);
    let scaled = fragment([cfg.rows, cfg.cols], F32);
    let tiles = RowTiles { f, sums, scaled };
    copy(x.tile([0, 0], [cfg.rows, cfg.cols]), f);
    row_sums(tiles);
    scale_rows(tiles, 3.0);
    copy(scaled, y.tile([0, 0], [cfg.rows, cfg.cols]));
}

#[test]
fn a_struct_of_tiles_passes_its_tiles_to_a_helper() {
    check_scaled_row_sums(with_tile_struct, 6, 3.0);
}

/// A `let` feeding a fill from a global tensor the body writes (the fill would read it before
/// the body's earlier iterations wrote it).
#[kernel]
fn fill_reads_written_global(
    cfg: &Cfg,
    x: Global<(R, C), F32>,
    offs: GlobalMut<(NO,), I32>,
    y: GlobalMut<(RY, C), F32>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let s = shared([8, 32], F32);
    let o = shared([8], I32);
    for i in pipelined(0, NO, stages = 2) {
        let row = offs[i];
        copy(x.tile_at([row, 0], [8, 32]), s);
        copy(s, y.tile_at([8 * i, 0], [8, 32]));
        copy(o, offs.tile_at([0], [8]));
    }
}

#[test]
fn a_let_feeding_a_fill_cannot_read_a_global_the_body_writes() {
    let cfg = Cfg { rows: 0, cols: 32, threads: 64 };
    let e = kda_dsl::compile(fill_reads_written_global(&cfg).expect("builds"), kda_dsl::Target::Sm80)
        .expect_err("rejected")
        .to_string();
    assert!(e.contains("`row` feeds a fill") && e.contains("`offs`"), "{e}");
}

/// A pipeline with fill warps: how many, and its depth.
#[derive(Clone)]
struct FillCfg {
    fill_warps: usize,
    stages: usize,
}

/// Over blocks `i`: `acc += x[16 offs[i] ..] k[32 i ..]` on tensor cores, and `rs += rowsum(x
/// block) * beta[i ..]` through a reduction across the compute warps (which synchronize inside
/// it); the row block from a `let`, a strided `beta` filled element by element (stored at the
/// end of the body). With fill warps, every fill is theirs.
#[kernel]
fn staged_products(
    cfg: &FillCfg,
    x: Global<(R, C), BF16>,
    k: Global<(RK, C), BF16>,
    beta: Global<(NB, S), BF16>,
    offs: Global<(NO,), I32>,
    y: GlobalMut<(RY, C), F32>,
    z: GlobalMut<(RY,), F32>,
    NL: Dim,
) {
    let (_bx,) = launch(grid = [1], threads = 64, fill_warps = cfg.fill_warps);
    assume_extent(C, 32);
    let x_sh = shared([16, 32], BF16);
    let k_sh = shared([32, 32], BF16);
    let b_sh = shared([16], BF16);
    let acc = fragment([16, 32], F32);
    let xf = fragment([16, 32], F32);
    let part = fragment([16], F32);
    let rs = fragment([16], F32);
    clear(acc);
    clear(rs);
    // `offs` runs past the loop's end: in a tensor-core loop, fills past it are issued
    // (masked), and their `let`s read on.
    for i in pipelined(0, NL, stages = cfg.stages) {
        let row = offs[i] * 16;
        copy(x.tile_at([row, 0], [16, 32]), x_sh);
        copy(k.tile_at([32 * i, 0], [32, 32]), k_sh);
        copy(beta.tile_at([16 * i, 1], [16, 1]), b_sh);
        gemm(x_sh, k_sh, acc);
        copy(x_sh, xf);
        reduce_sum(xf, part, 1);
        for (r,) in parallel(rs) {
            rs[r] = rs[r] + part[r] * b_sh[r];
        }
    }
    copy(acc, y.tile([0, 0], [16, 32]));
    copy(rs, z.tile([0], [16]));
}

#[test]
fn fill_warps_issue_a_pipelines_fills_and_change_no_bit() {
    let (r, c, nb) = (64, 32, 3);
    let offs: Vec<f64> = vec![2.0, 0.0, 3.0, 0.0, 0.0];
    let mut rng = Rng::new(11);
    let x = rng.normals(r * c, DType::BF16);
    let k = rng.normals(32 * nb * c, DType::BF16);
    let beta = rng.normals(16 * nb * 2, DType::BF16);
    let run = |cfg: &FillCfg| {
        let mut args = vec![
            t("x", &x, DType::BF16),
            i("R", r),
            i("C", c),
            t("k", &k, DType::BF16),
            i("RK", 32 * nb),
            t("beta", &beta, DType::BF16),
            i("NB", 16 * nb),
            i("S", 2),
            t("offs", &offs, DType::I32),
            i("NO", offs.len()),
            t("y", &vec![f64::NAN; 16 * c], DType::F32),
            i("RY", 16),
            t("z", &[f64::NAN; 16], DType::F32),
            i("NL", nb),
        ];
        let def = staged_products(cfg).expect("builds");
        simulate(&def, &mut args).unwrap_or_else(|e| panic!("{} fill warps: {e}", cfg.fill_warps));
        (tensor_values(&args, "y", DType::F32), tensor_values(&args, "z", DType::F32))
    };
    let mut want_y = vec![0.0; 16 * c];
    let mut want_z = vec![0.0; 16];
    for (b, o) in offs.iter().take(nb).enumerate() {
        for row in 0..16 {
            let xr = &x[(16 * *o as usize + row) * c..][..c];
            for col in 0..c {
                want_y[row * c + col] += (0..c).map(|j| xr[j] * k[(32 * b + j) * c + col]).sum::<f64>();
            }
            want_z[row] += xr.iter().sum::<f64>() * beta[(16 * b + row) * 2 + 1];
        }
    }
    for stages in [2, 3] {
        let plain = run(&FillCfg { fill_warps: 0, stages });
        assert!(rel_err(&plain.0, &want_y) < 1e-5 && rel_err(&plain.1, &want_z) < 1e-5, "{stages} stages");
        for fill_warps in [1, 2] {
            let split = run(&FillCfg { fill_warps, stages });
            let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            assert!(bits(&split.0) == bits(&plain.0), "products, {fill_warps} fill warps, {stages} stages");
            assert!(bits(&split.1) == bits(&plain.1), "row sums, {fill_warps} fill warps, {stages} stages");
        }
    }
}

/// Fill warps in a kernel with no `pipelined` loop for them.
#[kernel]
fn fill_warps_idle(cfg: &FillCfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = 64, fill_warps = cfg.fill_warps);
    let f = fragment([16, 32], F32);
    copy(x.tile([0, 0], [16, 32]), f);
    copy(f, y.tile([0, 0], [16, 32]));
}

#[test]
fn fill_warps_need_a_pipeline_and_at_most_eight() {
    // Refused where the kernel is built, or else where it is compiled.
    let refusal = |def: Result<kda_dsl::tile::KernelDef, kda_dsl::Diag>| match def {
        Ok(def) => kda_dsl::compile(def, kda_dsl::Target::Sm80).expect_err("rejected").to_string(),
        Err(e) => e.to_string(),
    };
    let e = refusal(fill_warps_idle(&FillCfg { fill_warps: 1, stages: 2 }));
    assert!(e.contains("fill_warps = 1") && e.contains("no `pipelined` loop"), "{e}");
    let e = refusal(staged_products(&FillCfg { fill_warps: 9, stages: 2 }));
    assert!(e.contains("fill_warps = 9") && e.contains("expected 0 to 8"), "{e}");
}

/// A tile fragment stored into shared tiles of f32, bf16 and f16, then read back out through
/// global memory: the rows a warp holds with 32 lanes per row, and mma-style ones.
#[kernel]
fn fragment_to_shared(
    cfg: &Cfg,
    x: Global<(R, C), F32>,
    y32: GlobalMut<(R, C), F32>,
    yb: GlobalMut<(R, C), BF16>,
    yh: GlobalMut<(R, C), F16>,
) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    assume_extent(C, 128);
    let f = fragment([cfg.rows, 128], F32, lanes_per_row = 32);
    let g = fragment([cfg.rows, 128], F32);
    let s32 = shared([cfg.rows, 128], F32);
    let sb = shared([cfg.rows, 128], BF16);
    let sh = shared([cfg.rows, 128], F16);
    copy(x.tile([0, 0], [cfg.rows, 128]), f);
    copy(x.tile([0, 0], [cfg.rows, 128]), g);
    copy(f, s32);
    copy(f, sb);
    copy(g, sh);
    copy(s32, y32.tile([0, 0], [cfg.rows, 128]));
    copy(sb, yb.tile([0, 0], [cfg.rows, 128]));
    copy(sh, yh.tile([0, 0], [cfg.rows, 128]));
}

#[test]
fn tile_fragments_store_into_shared_tiles_in_vectors() {
    for threads in [32, 128] {
        let cfg = Cfg { rows: 16, cols: 128, threads };
        let (r, c) = (16, 128);
        let x: Vec<f64> = Rng::new(5).normals(r * c, DType::F32);
        let mut args = vec![
            t("x", &x, DType::F32),
            i("R", r),
            i("C", c),
            t("y32", &vec![f64::NAN; r * c], DType::F32),
            t("yb", &vec![f64::NAN; r * c], DType::BF16),
            t("yh", &vec![f64::NAN; r * c], DType::F16),
        ];
        let def = fragment_to_shared(&cfg).expect("builds");
        simulate(&def, &mut args).expect("runs");
        assert_eq!(tensor_values(&args, "y32", DType::F32), x, "{threads} threads: f32");
        for (name, d) in [("yb", DType::BF16), ("yh", DType::F16)] {
            let want: Vec<f64> = x.iter().map(|v| round_to(*v, d)).collect();
            assert_eq!(tensor_values(&args, name, d), want, "{threads} threads: {d:?}");
        }
        let ptx = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect("compiles").ptx;
        assert!(!ptx.contains("st.shared.b16") && !ptx.contains("st.shared.f32 "), "{threads} threads: element stores");
        assert!(
            ptx.contains("st.shared.v4.f32") && ptx.contains("st.shared.v2.b32"),
            "{threads} threads: vector stores"
        );
    }
}

/// The step of [`produced_step`]: `out = 2 s + 1` through a fragment.
#[kda_macros::kernel_fn]
fn doubled_plus_one(s: Tile, f: Tile, out: Tile) {
    copy(s, f);
    for (r, c) in parallel(f) {
        out[r][c] = 2.0 * f[r][c] + 1.0;
    }
}

/// The step of [`produced_step`] with `row_sums`: `out = 2 s + rowsum(s)`, the row sums
/// meeting across warps in the scratch area of the warps that run it.
#[kda_macros::kernel_fn]
fn doubled_plus_row_sums(s: Tile, f: Tile, sums: Tile, out: Tile) {
    copy(s, f);
    reduce_sum(f, sums, 1);
    for (r, c) in parallel(f) {
        out[r][c] = 2.0 * f[r][c] + sums[r];
    }
}

/// [`produced_step`]'s config: rows, threads, fill warps, stages, whether the step is a
/// producer block, and whether it adds row sums ([`doubled_plus_row_sums`]) or 1.
struct StepCfg {
    rows: usize,
    threads: usize,
    fill_warps: usize,
    stages: usize,
    in_producer: bool,
    row_sums: bool,
}

/// `y = 2 x + 1` (or `+ rowsum(x)`) by 32-column tiles in a pipelined loop, the step in a
/// producer block or not.
#[kernel]
fn produced_step(cfg: &StepCfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads, fill_warps = cfg.fill_warps);
    let s = shared([cfg.rows, 32], F32);
    let f = fragment([cfg.rows, 32], F32);
    let sums = fragment([cfg.rows], F32);
    let out = shared([cfg.rows, 32], F32);
    for i in pipelined(0, C / 32, stages = cfg.stages) {
        copy(x.tile([0, i], [cfg.rows, 32]), s);
        if cfg.in_producer {
            for _ in producer() {
                step(cfg.row_sums, s, f, sums, out);
            }
        } else {
            step(cfg.row_sums, s, f, sums, out);
        }
        copy(out, y.tile([0, i], [cfg.rows, 32]));
    }
}

/// [`produced_step`]'s step: adding row sums or 1.
#[kda_macros::kernel_fn]
fn step(row_sums: bool, s: Tile, f: Tile, sums: Tile, out: Tile) {
    if row_sums {
        doubled_plus_row_sums(s, f, sums, out);
    } else {
        doubled_plus_one(s, f, out);
    }
}

/// [`produced_step`] at `cfg` over `x` (`cfg.rows` rows of `tiles` 32-column tiles) in the
/// simulator: `y`, and the PTX for sm_80.
fn run_step(cfg: &StepCfg, x: &[f64], tiles: usize) -> (Vec<f64>, String) {
    let def = produced_step(cfg).expect("builds");
    let ptx = kda_dsl::compile(def.clone(), kda_dsl::Target::Sm80).expect("compiles").ptx;
    let mut args =
        vec![t("x", x, DType::F32), i("R", cfg.rows), i("C", 32 * tiles), t("y", &vec![f64::NAN; x.len()], DType::F32)];
    simulate(&def, &mut args).unwrap_or_else(|e| panic!("{} fill warps: {e}", cfg.fill_warps));
    (tensor_values(&args, "y", DType::F32), ptx)
}

#[test]
fn a_producer_block_runs_as_its_statements_written_in_place() {
    let (rows, tiles) = (16, 5);
    let mut rng = Rng::new(11);
    let x: Vec<f64> = (0..rows * 32 * tiles).map(|_| rng.normal()).collect();
    for (threads, stages) in [(32, 2), (64, 3)] {
        let run = |in_producer: bool| {
            let (y, ptx) =
                run_step(&StepCfg { rows, threads, fill_warps: 0, stages, in_producer, row_sums: false }, &x, tiles);
            // Source lines differ between the two forms; the instructions may not.
            let code: Vec<String> =
                ptx.lines().filter(|l| !l.contains(".loc") && !l.contains(".file")).map(String::from).collect();
            (y, code)
        };
        let (inline, inline_ptx) = run(false);
        let (produced, produced_ptx) = run(true);
        let want: Vec<f64> = x.iter().map(|v| 2.0 * round_to(*v, DType::F32) + 1.0).collect();
        assert!(rel_err(&produced, &want) < 1e-6, "{threads} threads: {}", rel_err(&produced, &want));
        assert_eq!(produced, inline, "{threads} threads, {stages} stages");
        assert!(produced_ptx == inline_ptx, "{threads} threads, {stages} stages: the PTX differs");
    }
}

/// On fill warps the block runs apart, ahead of the compute warps, through its ring: the same
/// values as inline for every split of the warps, every depth of the ring and two producer groups
/// taking turns (at the fewest stages they take, 3, and more), and its row sums (which meet in each
/// group's scratch) right; the PTX shows the ring (the producer's named barrier, the `ready` and
/// `empty` arrivals) with one copy of the producer's code for every group.
#[test]
fn a_producer_block_on_fill_warps_gives_the_inline_values() {
    let (rows, tiles) = (16, 7);
    let mut rng = Rng::new(12);
    let x: Vec<f64> = (0..rows * 32 * tiles).map(|_| rng.normal()).collect();
    let want_row_sums: Vec<f64> = (0..x.len())
        .map(|e| {
            let (row, tile) = (e / (32 * tiles), (e % (32 * tiles)) / 32);
            let sum: f64 = x[row * 32 * tiles + tile * 32..][..32].iter().sum();
            2.0 * x[e] + sum
        })
        .collect();
    let cases = [(32, 1, 2), (64, 1, 3), (32, 2, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4), (64, 8, 5), (128, 8, 7)];
    for (threads, fill_warps, stages) in cases {
        let case = format!("{threads} threads, {fill_warps} fill warps, {stages} stages");
        let cfg = |fill_warps, row_sums| StepCfg { rows, threads, fill_warps, stages, in_producer: true, row_sums };
        let (inline, _) = run_step(&cfg(0, false), &x, tiles);
        let (got, ptx) = run_step(&cfg(fill_warps, false), &x, tiles);
        assert!(got == inline, "{case}: the values differ");
        // Row sums over other warps than inline add in another order: against f64.
        let (got, _) = run_step(&cfg(fill_warps, true), &x, tiles);
        assert!(rel_err(&got, &want_row_sums) < 1e-5, "{case}, row sums: {}", rel_err(&got, &want_row_sums));
        // Eight fill warps are two producer groups running one copy of the code, each group's
        // named barrier (2 + its index) in a register; one `ready` arrival in that copy, one
        // `empty` arrival of the compute warps.
        let kda_dsl::passes::place_producers::ProducerGroups { warps, groups } =
            kda_dsl::passes::place_producers::producer_groups(fill_warps as u32);
        let (id, count) = (if groups == 1 { "2" } else { "%r" }, format!(", {};", 32 * warps));
        let producer_barrier = format!("bar.sync {id}");
        let named = ptx.lines().any(|l| l.contains(&producer_barrier) && l.ends_with(&count));
        assert!(named, "{case}: `{producer_barrier}..{count}` missing:\n{ptx}");
        assert_eq!(ptx.matches("mbarrier.arrive.shared.b64").count(), 2, "{case}:\n{ptx}");
    }
}

/// [`biased_step`]'s config: whether the fill warpgroup keeps 128 registers (the roles apart on
/// sm_90a) or every thread what ptxas gives it.
struct BiasedCfg {
    producer_registers: Option<usize>,
}

/// `y = 2 x + b` by 32-column tiles on 4 compute warps, the step a producer block on a fill
/// warpgroup, `b` a shared tile the compute warps write before the loop and the producer reads.
#[kernel]
fn biased_step(cfg: &BiasedCfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (_bx,) = launch(grid = [1], threads = 128, fill_warps = 4, producer_registers = cfg.producer_registers);
    let s = shared([16, 32], F32);
    let b = shared([16, 32], F32);
    let f = fragment([16, 32], F32);
    let out = shared([16, 32], F32);
    for (r, c) in parallel(b) {
        b[r][c] = 3.0;
    }
    for i in pipelined(0, C / 32, stages = 3) {
        copy(x.tile([0, i], [16, 32]), s);
        for _ in producer() {
            copy(s, f);
            for (r, c) in parallel(f) {
                out[r][c] = 2.0 * f[r][c] + b[r][c];
            }
        }
        copy(out, y.tile([0, i], [16, 32]));
    }
}

/// With `producer_registers` the roles part at entry on sm_90a (`setmaxnreg`): the fill
/// warpgroup keeps 128 registers a thread, the compute warpgroup takes 256, and the two meet at
/// the ring loop on barrier 0, so the producer reads the tile the compute warps wrote before the
/// loop. The same values as without the split; without that barrier the simulator reports the
/// producer reading bytes nothing wrote yet.
#[test]
fn a_computing_producer_keeps_its_declared_registers() {
    let tiles = 6;
    let x: Vec<f64> = Rng::new(13).normals(16 * 32 * tiles, DType::F32);
    let run = |producer_registers: Option<usize>| {
        let def = biased_step(&BiasedCfg { producer_registers }).expect("builds");
        let mut args =
            vec![t("x", &x, DType::F32), i("R", 16), i("C", 32 * tiles), t("y", &vec![f64::NAN; x.len()], DType::F32)];
        kda_kernels::check::simulate_on(&def, kda_dsl::Target::Sm90a, &mut args)
            .unwrap_or_else(|e| panic!("producer_registers {producer_registers:?}: {e}"));
        let ptx = kda_dsl::compile(def, kda_dsl::Target::Sm90a).expect("compiles").ptx;
        (tensor_values(&args, "y", DType::F32), ptx)
    };
    let (split, ptx) = run(Some(128));
    let (uniform, uniform_ptx) = run(None);
    let want: Vec<f64> = x.iter().map(|v| round_to(2.0 * v + 3.0, DType::F32)).collect();
    assert_eq!(split, want);
    assert_eq!(uniform, want);
    assert!(ptx.contains(".maxnreg 248"), "{ptx}");
    assert!(ptx.contains("setmaxnreg.dec.sync.aligned.u32 128;"), "{ptx}");
    assert!(ptx.contains("setmaxnreg.inc.sync.aligned.u32 256;"), "{ptx}");
    assert!(!uniform_ptx.contains("setmaxnreg"), "{uniform_ptx}");
}

#[kernel]
fn clustered(cfg: &Cfg, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (bx,) = launch(grid = [R / 16], threads = cfg.threads, cluster = 2);
    let f = fragment([16, cfg.cols], F32);
    copy(x.tile([bx, 0], [16, cfg.cols]), f);
    copy(f, y.tile([bx, 0], [16, cfg.cols]));
}

/// `launch(.., cluster = 2)`: the kernel runs in clusters of two blocks (the simulator runs
/// each cluster's blocks together), compiles for sm_90 with `.reqnctapercluster` and not for
/// sm_80, and a grid of a partial cluster is refused.
#[test]
fn a_kernel_launched_in_clusters() {
    let cfg = Cfg { rows: 16, cols: 32, threads: 64 };
    let def = clustered(&cfg).expect("builds");
    assert_eq!(def.cluster_blocks, 2);
    let (r, c) = (64, 32);
    let x = Rng::new(5).normals(r * c, DType::F32);
    let mut args = vec![t("x", &x, DType::F32), i("R", r), i("C", c), t("y", &vec![f64::NAN; r * c], DType::F32)];
    kda_kernels::check::simulate_on(&def, kda_dsl::Target::Sm90, &mut args).expect("runs");
    assert_eq!(tensor_values(&args, "y", DType::F32), x);
    let mut three_blocks =
        vec![t("x", &x[..48 * c], DType::F32), i("R", 48), i("C", c), t("y", &x[..48 * c], DType::F32)];
    let e =
        kda_kernels::check::simulate_on(&def, kda_dsl::Target::Sm90, &mut three_blocks).expect_err("a partial cluster");
    assert!(e.contains("a grid of 3 blocks along x in clusters of 2"), "{e}");
    let k = kda_dsl::compile(def.clone(), kda_dsl::Target::Sm90).expect("compiles for sm_90");
    assert!(k.ptx.contains(".reqnctapercluster 2, 1, 1") && k.cluster_blocks == 2, "{}", k.ptx);
    let e = kda_dsl::compile(def, kda_dsl::Target::Sm80).expect_err("no clusters on sm_80").to_string();
    assert!(e.contains("`launch(.., cluster = 2)` needs target sm_90"), "{e}");
}

/// A producer ring across a cluster of two blocks: the blocks' producer groups (one or two a
/// block) take turns at the iterations and every block's compute warps see every iteration's
/// hand-over (`2 x + 1` for each row of `x`, plus the fill copied along where the compute warps
/// read it too) beside the block's own rows of `z` (which its compute warps fill), for a loop
/// of fewer iterations than turns and of several rounds of them.
#[test]
fn producers_across_a_cluster_take_turns() {
    for body_reads_fill in [true, false] {
        for (fill_warps, stages) in [(1, 4), (1, 5), (1, 7), (8, 5), (8, 6), (8, 7)] {
            for iterations in [3, 7, 13] {
                let cfg = ClusterRingCfg { fill_warps, stages, fewer_in_odd_blocks: 0, body_reads_fill };
                let def = cluster_ring(&cfg).expect("builds");
                let (t_rows, c) = (16 * iterations, 32);
                let x = Rng::new(7).normals(t_rows * c, DType::F32);
                let nb = 4;
                let z = Rng::new(8).normals(nb * t_rows * c, DType::F32);
                let mut args = vec![
                    t("x", &x, DType::F32),
                    t("z", &z, DType::F32),
                    i("T", t_rows),
                    i("C", c),
                    i("NB", nb),
                    t("y", &vec![f64::NAN; nb * t_rows * c], DType::F32),
                ];
                let case = format!("{fill_warps} fill warps, {stages} stages, {iterations} iterations, body reads the fill: {body_reads_fill}");
                kda_kernels::check::simulate_on(&def, kda_dsl::Target::Sm90, &mut args)
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
                let got = tensor_values(&args, "y", DType::F32);
                let times = if body_reads_fill { 3.0 } else { 2.0 };
                let want: Vec<f64> = (0..nb * t_rows * c).map(|k| times * x[k % (t_rows * c)] + 1.0 + z[k]).collect();
                assert!(rel_err(&got, &want) < 1e-6, "{case}: rel err {}", rel_err(&got, &want));
            }
        }
    }
    // The hand-over crosses blocks: bulk copies out, remote releases back, cluster-scope waits.
    let compiled = |body_reads_fill| {
        let cfg = ClusterRingCfg { fill_warps: 8, stages: 6, fewer_in_odd_blocks: 0, body_reads_fill };
        kda_dsl::compile(cluster_ring(&cfg).expect("builds"), kda_dsl::Target::Sm90).unwrap_or_else(|e| panic!("{e}"))
    };
    let (both, own) = (compiled(true), compiled(false));
    for op in [
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
        "mbarrier.arrive.release.cluster.shared::cluster.b64",
        "mbarrier.try_wait.parity.acquire.cluster",
        "fence.mbarrier_init.release.cluster",
    ] {
        assert!(both.ptx.contains(op) && own.ptx.contains(op), "no {op} in the PTX");
    }
    // A fill only the producer reads stays in its group's slots: the other block receives the
    // hand-over alone (2048 bytes a stage instead of 4096), and the fill takes a slot for each
    // of the two groups (its fills are 0 turns ahead at 6 stages) instead of a copy a stage.
    let bulk_copies = |ptx: &str| ptx.matches("cp.async.bulk.shared::cluster").count();
    assert_eq!((bulk_copies(&both.ptx), bulk_copies(&own.ptx)), (4, 2));
    let expected_bytes = |ptx: &str| -> Vec<String> {
        let arms = ptx.lines().filter(|l| l.contains("mbarrier.arrive.expect_tx"));
        arms.filter_map(|l| l.trim_end().trim_end_matches(';').rsplit(", ").next().map(str::to_string)).collect()
    };
    assert_eq!((expected_bytes(&both.ptx), expected_bytes(&own.ptx)), (vec!["4096".into()], vec!["2048".into()]));
    assert_eq!(both.shared_bytes - own.shared_bytes, (6 - 2) * 2048);
}

/// A cluster's blocks must run a producer ring over the same iterations: with other bounds
/// in one block the ring cannot complete, which the simulator reports.
#[test]
fn a_cluster_ring_over_uneven_bounds_is_reported() {
    let cfg = ClusterRingCfg { fill_warps: 1, stages: 4, fewer_in_odd_blocks: 1, body_reads_fill: true };
    let def = cluster_ring(&cfg).expect("builds");
    let (t_rows, c) = (16 * 7, 32);
    let x = Rng::new(7).normals(t_rows * c, DType::F32);
    let mut args = vec![
        t("x", &x, DType::F32),
        t("z", &vec![0.0; 2 * t_rows * c], DType::F32),
        i("T", t_rows),
        i("C", c),
        i("NB", 2),
        t("y", &vec![f64::NAN; 2 * t_rows * c], DType::F32),
    ];
    let e = kda_kernels::check::simulate_on(&def, kda_dsl::Target::Sm90, &mut args).expect_err("uneven bounds");
    assert!(e.contains("deadlock: an mbarrier wait waits for a phase still 1 arrival(s) short"), "{e}");
}
