//! TMA boxes of tensors with more than two axes, as the prefill's `[B, T, H, D]` operands
//! have: a per-head product whose stage fills and bulk stores are 4-D boxes, through the
//! simulator against the f64 reference (T ragged, so boxes reach past the sequence axis and
//! TMA zero-fills there) and through ptxas for sm_90a.

use kda_dsl::sim::SimArg;
use kda_dsl::Target;
use kda_kernels::reference::{rel_err, to_bytes, Rng};

#[path = "../../kda-dsl/tests/support/assemble.rs"]
mod assemble;

/// A test config: the pipeline's stages.
#[derive(Clone)]
struct PerHead {
    stages: usize,
}

/// `o[b, t, h, :] = x[b, t, h, :] · wᵀ`, one block per (head, batch), 64 rows of T at a time:
/// each stage's `x` rows are one box of the 4-D tensor (1 x 64 x 1 x 64), each result goes
/// back through a shared tile as 4-D bulk stores. `w` is copied with `cp.async` before the
/// TMA pipeline, which must land before the loop's first barrier as well.
#[kda_macros::kernel]
fn per_head(cfg: &PerHead, x: Global<(B, T, H, D), BF16>, w: Global<(N, DW), BF16>, o: GlobalMut<(B, T, H, N), F32>) {
    let (h, b) = launch(grid = [H, B], threads = 128);
    assume_multiple(D, 8);
    assume_multiple(DW, 8);
    assume_multiple(N, 8);
    let w_s = shared([64, 64], BF16);
    copy(w.tile([0, 0], [64, 64]), w_s);
    let x_s = shared([64, 64], BF16);
    let o_s = shared([64, 64], F32);
    for tb in pipelined(ceil_div(T, 64), stages = cfg.stages) {
        copy(x.tile_at([b, tb * 64, h, 0], [1, 64, 1, 64]), x_s);
        let acc = fragment([64, 64], F32);
        clear(acc);
        gemm(x_s, w_s.t(), acc);
        copy(acc, o_s);
        copy(o_s, o.tile_at([b, tb * 64, h, 0], [1, 64, 1, 64]));
    }
}

#[test]
fn four_axis_boxes_fill_and_store_the_heads_of_a_ragged_sequence() {
    let cfg = PerHead { stages: 2 };
    let def = per_head(&cfg).expect("builds");
    let ptx = kda_dsl::compile(def.clone(), Target::Sm90a).expect("compiles").ptx;
    for want in ["cp.async.bulk.tensor.4d.shared::cluster.global", "cp.async.bulk.tensor.4d.global.shared::cta"] {
        assert!(ptx.contains(want), "no {want}");
    }
    let (nb, t, nh, d, n) = (2usize, 100usize, 3usize, 64usize, 64usize);
    let mut rng = Rng::new(7);
    let x = rng.normals(nb * t * nh * d, kda_dsl::DType::BF16);
    let w = rng.normals(n * d, kda_dsl::DType::BF16);
    let dim = |name: &str, v: usize| (name.to_string(), SimArg::I32(v as i32));
    let mut args = vec![
        ("x".to_string(), SimArg::Tensor(to_bytes(&x, kda_dsl::DType::BF16))),
        dim("B", nb),
        dim("T", t),
        dim("H", nh),
        dim("D", d),
        ("w".to_string(), SimArg::Tensor(to_bytes(&w, kda_dsl::DType::BF16))),
        dim("N", n),
        dim("DW", d),
        ("o".to_string(), SimArg::Tensor(to_bytes(&vec![f64::NAN; nb * t * nh * n], kda_dsl::DType::F32))),
    ];
    kda_kernels::check::simulate_on(&def, Target::Sm90a, &mut args).unwrap_or_else(|e| panic!("{e}"));
    let got = kda_kernels::check::tensor_values(&args, "o", kda_dsl::DType::F32);
    let want: Vec<f64> = (0..nb * t * nh * n)
        .map(|e| {
            let (row, col) = (e / n, e % n);
            (0..d).map(|k| x[row * d + k] * w[col * d + k]).sum()
        })
        .collect();
    let err = rel_err(&got, &want);
    assert!(err < 1e-5, "rel err {err}");
    // Every row was stored (the poison is gone); the last box's rows past T were clipped.
    assert!(got.iter().all(|v| v.is_finite()));
}

/// The 4-D boxes assemble for sm_90a without spills, and the SASS copies with `UTMALDG.4D`
/// and `UTMASTG.4D`. ptxas from `KDA_PTXAS`, cuobjdump from `KDA_CUOBJDUMP` (`.ci/run` sets
/// both); skipped with a line saying so without them, failed when `KDA_REQUIRE_PTXAS` is set.
#[test]
fn four_axis_boxes_assemble_to_four_axis_tma() {
    let Some((ptxas, cuobjdump)) = assemble::tools_or_skip("the 4-D TMA kernel") else { return };
    let ptx = kda_dsl::compile(per_head(&PerHead { stages: 2 }).expect("builds"), Target::Sm90a).expect("compiles").ptx;
    let done =
        assemble::assemble(&ptxas, Some(&cuobjdump), "sm_90a", "per_head", &ptx).unwrap_or_else(|e| panic!("{e}"));
    assert!(done.log.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{}", done.log);
    let sass = done.sass.expect("a cuobjdump was given");
    for op in ["UTMALDG.4D", "UTMASTG.4D", "HGMMA.64x64x16.F32.BF16"] {
        assert!(sass.contains(op), "no {op} in the SASS");
    }
}
