//! The GEMM through the simulator against the f64 reference, ragged edges included.

use kda_dsl::sim::SimArg;
use kda_dsl::thread_ir::{Op, Src};
use kda_dsl::Target;
use kda_kernels::check::check_gemm;
use kda_kernels::gemm::GemmConfig;
use kda_kernels::gemm_configs;

#[path = "../../kda-dsl/tests/support/assemble.rs"]
mod assemble;

#[test]
fn every_shipped_gemm_variant_matches_the_reference_in_the_simulator() {
    for (i, cfg) in gemm_configs().iter().enumerate() {
        // Aligned variants need K (and N) multiples of 8; unaligned ones take anything.
        let shapes: &[(usize, usize, usize)] = if cfg.aligned {
            &[(cfg.bm, cfg.bn, 64), (cfg.bm + 24, cfg.bn / 2 + 8, 40)]
        } else {
            &[(cfg.bm, cfg.bn, 32), (37, 29, 19)]
        };
        for (j, &(m, n, k)) in shapes.iter().enumerate() {
            let out = check_gemm(cfg, kda_dsl::Target::Sm80, m, n, k, (i * 10 + j) as u64)
                .unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
            eprintln!("{} rel_err {:.2e} ({} instructions)", out.case, out.rel_err, out.instructions);
            assert!(out.passed(), "{}: rel err {} over {}", out.case, out.rel_err, out.bound);
        }
    }
}

/// The sm_90a GEMMs (`wgmma` on canonical tiles) against the reference; the shipped sm_80
/// configs compiled for sm_90a (the unaligned ones take `wgmma` there too); and tiles of two
/// slabs: `A·B` with N = 128 (B MN-major) and `A·Bᵀ` with K = 128; and the configs
/// `kda bench --sweep-gemm` times.
#[test]
fn the_sm_90a_gemms_match_the_reference_in_the_simulator() {
    let sm80 = gemm_configs().into_iter().filter(|c| !c.aligned);
    // Without a producer warpgroup or a staged epilogue, and 128 columns, which leave room for
    // K = 128.
    let plain =
        GemmConfig { fill_warps: 0, staged_store: false, bn: 128, ..kda_kernels::hopper_gemm_configs().remove(0) };
    let slabs = [GemmConfig { b_transposed: false, ..plain.clone() }, GemmConfig { bk: 128, stages: 3, ..plain }];
    let swept = kda_kernels::hopper_gemm_candidates();
    let configs = kda_kernels::hopper_gemm_configs().into_iter().chain(sm80).chain(slabs).chain(swept);
    for (i, cfg) in configs.enumerate() {
        let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
        assert!(kda_kernels::check::takes_wgmma(&def, Target::Sm90a).expect("lowers"), "{}", cfg.key());
        let shapes: &[(usize, usize, usize)] = if cfg.aligned {
            &[(cfg.bm, cfg.bn, 128), (cfg.bm + 24, cfg.bn / 2 + 8, 40)]
        } else {
            &[(cfg.bm, cfg.bn, 32), (37, 29, 19)]
        };
        for (j, &(m, n, k)) in shapes.iter().enumerate() {
            let out = check_gemm(&cfg, Target::Sm90a, m, n, k, (i * 10 + j) as u64)
                .unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
            eprintln!("{} rel_err {:.2e} ({} instructions)", out.case, out.rel_err, out.instructions);
            assert!(out.passed(), "{}: rel err {} over {}", out.case, out.rel_err, out.bound);
        }
    }
}

/// The fences the compiler places are what makes a GEMM whose tiles the threads fill (the
/// unaligned one: no TMA) correct on sm_90a: without them the simulator reports `wgmma`
/// reading shared memory the generic proxy wrote.
#[test]
fn the_sm_90a_gemm_without_its_proxy_fences_races() {
    let cfg = gemm_configs().into_iter().find(|c| !c.aligned).expect("an unaligned config");
    let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
    let (_, mut prog) = kda_dsl::lower_kernel_for(def, Target::Sm90a).expect("lowers");
    let fences = prog.body.iter().filter(|i| matches!(i.op, Op::FenceProxyAsync)).count();
    assert!(fences > 0, "the pass placed no fence");
    prog.body.retain(|i| !matches!(i.op, Op::FenceProxyAsync));
    let mut args = constant_args(&cfg, (cfg.bm, cfg.bn, 64));
    let e = kda_dsl::sim::run(&prog, [1, 1, 1], &mut args).expect_err("a race").to_string();
    assert!(e.contains("no fence.proxy.async after the write"), "{e}");
}

/// The shipped sm_90a GEMMs (both operand orders) keep one `wgmma` group in flight in their
/// steady state, their tiles filled by a producer warpgroup's TMA boxes two stages ahead of
/// four: each iteration waits for its stage's mbarrier phase and for the group before its own;
/// the loop's exit waits for the last group. The registers are split between the roles; a
/// staged epilogue (the swept candidates') is a bulk store after the proxy fence the compiler
/// placed; no `cp.async`. Compiled for sm_80, the same config has none of the Hopper
/// instructions.
#[test]
fn the_shipped_sm_90a_gemms_keep_one_group_in_flight_behind_a_producer() {
    use kda_dsl::passes::plan_pipelines::{Handoff, StageFills, TmaPipeline};
    let staged = kda_kernels::hopper_gemm_candidates().into_iter().filter(|c| c.fill_warps == 4 && c.staged_store);
    for cfg in kda_kernels::hopper_gemm_configs().into_iter().chain(staged) {
        let hopper = ["wgmma.mma_async", "cp.async.bulk.tensor.2d", "mbarrier.try_wait.parity", "setmaxnreg"];
        let bulk_store = ["fence.proxy.async", "cp.async.bulk.wait_group.read 0"];
        let hopper = hopper.into_iter().chain(bulk_store.into_iter().filter(|_| cfg.staged_store));
        assert_eq!(cfg.stages, 4);
        let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
        let p = kda_dsl::passes::run_tile_passes_for(def.clone(), Target::Sm90a).expect("passes");
        let [plan] = &p.pipelines[..] else { panic!("one pipeline") };
        assert_eq!(plan.fill_distance(), 2, "{}", cfg.key());
        let StageFills::TensorBoxes(TmaPipeline { handoff, .. }) = &plan.fills else { panic!("{plan:?}") };
        assert_eq!(*handoff, Handoff::EmptyBarriers { consumers: cfg.threads as u32 }, "{}", cfg.key());
        let ptx = kda_dsl::compile(def.clone(), Target::Sm90a).expect("compiles").ptx;
        let waits: Vec<&str> = ptx.lines().map(str::trim).filter(|l| l.contains("wgmma.wait_group")).collect();
        assert_eq!(waits, ["wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 0;"], "{}", cfg.key());
        for want in hopper.clone() {
            assert!(ptx.contains(want), "{}: no {want}", cfg.key());
        }
        assert!(!ptx.contains("cp.async.ca") && !ptx.contains("cp.async.cg"), "{}: a cp.async copy", cfg.key());
        let sm80 = kda_dsl::compile(def, Target::Sm80).expect("compiles").ptx;
        for absent in hopper.clone().chain(["mbarrier"]) {
            assert!(!sm80.contains(absent), "{}: {absent} on sm_80", cfg.key());
        }
    }
}

/// A test config: M (the accumulator's rows) and the threads.
#[derive(Clone)]
struct TransposedA {
    m: usize,
    threads: usize,
}

/// `c = aᵀ · bᵀ` with `a` stored `[K, M]` and `b` stored `[N, K]`: A MN-major in shared
/// memory, M over every warpgroup.
#[kda_macros::kernel]
fn transposed_a(cfg: &TransposedA, a: Global<(K, M), BF16>, b: Global<(N, KB), BF16>, c: GlobalMut<(M, N), F32>) {
    let (_bx,) = launch(grid = [1], threads = cfg.threads);
    let a_s = shared([64, cfg.m], BF16);
    let b_s = shared([64, 64], BF16);
    copy(a.tile([0, 0], [64, cfg.m]), a_s);
    copy(b.tile([0, 0], [64, 64]), b_s);
    let acc = fragment([cfg.m, 64], F32);
    clear(acc);
    gemm(a_s.t(), b_s.t(), acc);
    copy(acc, c.tile([0, 0], [cfg.m, 64]));
}

/// An MN-major shared A over one, two and four warpgroups (each warpgroup's M in its own
/// slab) against the reference, on sm_90a.
#[test]
fn a_transposed_shared_a_takes_wgmma_over_every_warpgroup() {
    use kda_kernels::reference::{from_bytes, rel_err, to_bytes, Rng};
    for (i, m) in [64usize, 128, 256].into_iter().enumerate() {
        let def = transposed_a(&TransposedA { m, threads: 2 * m }).expect("builds");
        assert!(kda_kernels::check::takes_wgmma(&def, Target::Sm90a).expect("lowers"), "M = {m}");
        let (n, k) = (64, 64);
        let mut rng = Rng::new(40 + i as u64);
        let a = rng.normals(k * m, kda_dsl::DType::BF16);
        let b = rng.normals(n * k, kda_dsl::DType::BF16);
        let t = |v: &[f64], d| SimArg::Tensor(to_bytes(v, d));
        let mut args = vec![
            ("a".to_string(), t(&a, kda_dsl::DType::BF16)),
            ("K".to_string(), SimArg::I32(k as i32)),
            ("M".to_string(), SimArg::I32(m as i32)),
            ("b".to_string(), t(&b, kda_dsl::DType::BF16)),
            ("N".to_string(), SimArg::I32(n as i32)),
            ("KB".to_string(), SimArg::I32(k as i32)),
            ("c".to_string(), t(&vec![f64::NAN; m * n], kda_dsl::DType::F32)),
        ];
        kda_kernels::check::simulate_on(&def, Target::Sm90a, &mut args).unwrap_or_else(|e| panic!("M = {m}: {e}"));
        let SimArg::Tensor(c) = &args[6].1 else { unreachable!() };
        let got = from_bytes(c, kda_dsl::DType::F32);
        let want: Vec<f64> = (0..m * n).map(|e| (0..k).map(|p| a[p * m + e / n] * b[(e % n) * k + p]).sum()).collect();
        let err = rel_err(&got, &want);
        assert!(err < 1e-5, "M = {m}: rel err {err}");
    }
}

/// With a fill warp and TMA fills the sm_90a GEMM is warp-specialized: the fill warp waits for
/// each stage's `empty` mbarrier and issues the boxes, the warpgroups wait for its `full` one
/// and release it when its group retires; inside either loop no barrier spans the block
/// (`bar.sync 0`), only the compute warps' own (named barrier 1), if any.
#[test]
fn a_gemm_with_a_fill_warp_runs_its_producer_apart() {
    use kda_dsl::passes::plan_pipelines::{Handoff, StageFills, TmaPipeline};
    let cfg =
        kda_kernels::hopper_gemm_candidates().into_iter().find(|c| c.fill_warps == 1).expect("a fill-warp config");
    let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
    let p = kda_dsl::passes::run_tile_passes_for(def.clone(), Target::Sm90a).expect("passes");
    let handoff = match &p.pipelines[0].fills {
        StageFills::TensorBoxes(TmaPipeline { handoff, .. }) => *handoff,
        other => panic!("{other:?}"),
    };
    assert_eq!(handoff, Handoff::EmptyBarriers { consumers: cfg.threads as u32 });
    let (_, prog) = kda_dsl::lower_kernel_for(def, Target::Sm90a).expect("lowers");
    let body = &prog.body;
    let label_at = |l: u32| body.iter().position(|i| i.op == Op::Label(l)).expect("a label");
    let loops: Vec<(usize, usize)> = body
        .iter()
        .enumerate()
        .filter_map(|(at, i)| match i.op {
            Op::Bra { target } if label_at(target) < at => Some((label_at(target), at)),
            _ => None,
        })
        .filter(|(top, end)| body[*top..*end].iter().any(|i| matches!(i.op, Op::MbarrierWait { .. })))
        .collect();
    // Each role's loop, not counting the wait loops inside them.
    let outer: Vec<_> = loops.iter().filter(|(t, e)| !loops.iter().any(|(t2, e2)| t2 < t && e < e2)).collect();
    assert_eq!(outer.len(), 2, "{loops:?}");
    for (top, end) in outer {
        let block_wide = body[*top..*end].iter().filter(|i| matches!(i.op, Op::Bar { id: Src::Imm(0), .. })).count();
        assert_eq!(block_wide, 0, "a block-wide barrier in the loop at {top}..{end}");
    }
    let arrives = body.iter().filter(|i| matches!(i.op, Op::MbarrierArrive { .. })).count();
    assert_eq!(arrives, 2, "a release per iteration and one at the exit");
}

/// Without the consumers' releases the warp-specialized GEMM's producer waits forever for a
/// stage to come back: the simulator reports the deadlock.
#[test]
fn the_warp_specialized_gemm_without_its_releases_deadlocks() {
    let cfg =
        kda_kernels::hopper_gemm_candidates().into_iter().find(|c| c.fill_warps == 1).expect("a fill-warp config");
    let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
    let (_, mut prog) = kda_dsl::lower_kernel_for(def, Target::Sm90a).expect("lowers");
    prog.body.retain(|i| !matches!(i.op, Op::MbarrierArrive { .. }));
    // One more K step than stages, so a stage is filled twice.
    let mut args = constant_args(&cfg, (cfg.bm, cfg.bn, cfg.bk * (cfg.stages + 1)));
    let e = kda_dsl::sim::run(&prog, [1, 1, 1], &mut args).expect_err("a deadlock").to_string();
    assert!(e.contains("deadlock"), "{e}");
}

/// The arguments of a GEMM config's kernel at (m, n, k), every input element 0x3f3f.
fn constant_args(cfg: &GemmConfig, (m, n, k): (usize, usize, usize)) -> Vec<(String, SimArg)> {
    let bytes = |len: usize| SimArg::Tensor(vec![0x3f; len * 2]);
    let (br, bc) = if cfg.b_transposed { (n, k) } else { (k, n) };
    vec![
        ("a".to_string(), bytes(m * k)),
        ("M".to_string(), SimArg::I32(m as i32)),
        ("K".to_string(), SimArg::I32(k as i32)),
        ("b".to_string(), bytes(n * k)),
        ("BR".to_string(), SimArg::I32(br as i32)),
        ("BC".to_string(), SimArg::I32(bc as i32)),
        ("c".to_string(), SimArg::Tensor(vec![0; m * n * cfg.out.size_bytes()])),
        ("N".to_string(), SimArg::I32(n as i32)),
    ]
}

/// On sm_90a the staged epilogue is a TMA bulk store: the tile the accumulator is copied to is
/// laid out as the boxes are, one thread stores it and waits for the store to read it. Without
/// the proxy fences the compiler places, the simulator reports the store reading what the
/// generic proxy wrote; without the wait, the thread exiting while its store still reads.
#[test]
fn the_staged_epilogue_is_a_bulk_store_on_sm_90a() {
    let cfg = kda_kernels::hopper_gemm_candidates().into_iter().find(|c| c.staged_store).expect("a staged config");
    let def = kda_kernels::gemm::gemm(&cfg).expect("builds");
    let ptx = kda_dsl::compile(def.clone(), Target::Sm90a).expect("compiles").ptx;
    for want in ["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", "cp.async.bulk.wait_group.read 0"] {
        assert!(ptx.contains(want), "no {want}");
    }
    let sm80 = kda_dsl::compile(def.clone(), Target::Sm80).expect("compiles").ptx;
    assert!(!sm80.contains("cp.async.bulk"));
    let (_, prog) = kda_dsl::lower_kernel_for(def, Target::Sm90a).expect("lowers");
    let shape = (cfg.bm + 8, cfg.bn - 8, 64);
    let broken = |drop: &dyn Fn(&Op) -> bool| {
        let mut p = prog.clone();
        p.body.retain(|i| !drop(&i.op));
        let mut args = constant_args(&cfg, shape);
        kda_dsl::sim::run(&p, [2, 2, 1], &mut args).map(|_| ()).map_err(|e| e.to_string())
    };
    broken(&|_| false).expect("the whole program runs");
    let e = broken(&|op| matches!(op, Op::FenceProxyAsync)).expect_err("a race");
    assert!(e.contains("a TMA store reads shared byte"), "{e}");
    let e = broken(&|op| matches!(op, Op::BulkWaitRead { .. })).expect_err("an early exit");
    assert!(e.contains("exits while its bulk copies still read"), "{e}");
}

/// The shipped warp-specialized GEMMs (and the swept one with a bulk-store epilogue), assembled
/// for sm_90a: no spills, no `setmaxnreg` ignored (C7507, C7508), and its SASS has the Hopper
/// instructions the DSL chose: `HGMMA` of the tile's width, TMA loads (and, staged, stores:
/// `UTMALDG`, `UTMASTG`), the mbarrier waits (`SYNCS`) and the register split (`USETMAXREG`),
/// no `HMMA`. ptxas from `KDA_PTXAS`, cuobjdump from `KDA_CUOBJDUMP` (`.ci/run` sets both);
/// skipped with a line saying so without them, failed when `KDA_REQUIRE_PTXAS` is set.
#[test]
fn the_warp_specialized_gemm_assembles_to_hopper_instructions() {
    let Some((ptxas, cuobjdump)) = assemble::tools_or_skip("the warp-specialized GEMM") else { return };
    // The shipped default for each operand order, and the staged candidate.
    let shipped = kda_kernels::hopper_gemm_configs();
    let staged = kda_kernels::hopper_gemm_candidates().into_iter().find(|c| c.fill_warps == 4 && c.staged_store);
    let defaults = [true, false]
        .map(|b_transposed| shipped.iter().find(|c| c.b_transposed == b_transposed).expect("shipped for both orders"));
    for cfg in defaults.into_iter().cloned().chain(staged) {
        assert_eq!(cfg.fill_warps, 4, "{}", cfg.key());
        let ptx =
            kda_dsl::compile(kda_kernels::gemm::gemm(&cfg).expect("builds"), Target::Sm90a).expect("compiles").ptx;
        let done = assemble::assemble(&ptxas, Some(&cuobjdump), "sm_90a", &cfg.key(), &ptx)
            .unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
        let log = done.log;
        assert!(log.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{log}");
        assert!(!log.contains("C7507") && !log.contains("C7508"), "{log}");
        let sass = done.sass.expect("a cuobjdump was given");
        let hgmma = format!("HGMMA.64x{}x16.F32.BF16", cfg.bn);
        let store = cfg.staged_store.then_some("UTMASTG.2D");
        for op in [hgmma.as_str(), "UTMALDG.2D", "SYNCS.PHASECHK", "USETMAXREG"].into_iter().chain(store) {
            assert!(sass.contains(op), "{}: no {op} in the SASS", cfg.key());
        }
        assert!(!sass.contains(" HMMA"), "{}: an sm_80 HMMA in the SASS", cfg.key());
    }
}

/// A GEMM walking its output tiles in groups of tile rows (`GemmConfig::raster_group`) computes
/// every tile once: 7 x 5 tiles in groups of 3 rows (the last group of one), ragged edges
/// included, and a group taller than the grid; against the reference, on sm_80 and sm_90a.
#[test]
fn grouped_tile_orders_cover_every_tile_once() {
    let small =
        GemmConfig { bm: 32, bn: 32, bk: 32, stages: 2, threads: 128, raster_group: 3, ..GemmConfig::default() };
    for (i, (cfg, target, (m, n, k))) in [
        (small.clone(), Target::Sm80, (7 * 32 - 8, 4 * 32 + 24, 64)),
        (GemmConfig { raster_group: 16, ..small }, Target::Sm80, (3 * 32, 2 * 32, 32)),
    ]
    .into_iter()
    .chain(kda_kernels::hopper_gemm_candidates().into_iter().filter(|c| c.raster_group > 0).map(|c| {
        let shape = (2 * c.bm + 24, 2 * c.bn - 8, 64);
        (c, Target::Sm90a, shape)
    }))
    .enumerate()
    {
        let out = check_gemm(&cfg, target, m, n, k, 90 + i as u64).unwrap_or_else(|e| panic!("{}: {e}", cfg.key()));
        eprintln!("{} rel_err {:.2e}", out.case, out.rel_err);
        assert!(out.passed(), "{}: rel err {} over {}", out.case, out.rel_err, out.bound);
    }
}
