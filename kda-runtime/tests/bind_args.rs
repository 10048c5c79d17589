//! CPU-only tests of argument validation and marshalling (no GPU needed).

use kda_dsl::artifact::{CompiledKernel, HostExpr, ParamSig};
use kda_dsl::dtype::DType;
use kda_runtime::{bind_args, KernelArg, RawArg, RuntimeError, TensorView};

fn tensor(name: &str, dtype: DType, dims: &[&str]) -> ParamSig {
    let dims = dims.iter().map(|d| d.to_string()).collect();
    ParamSig::Tensor { name: name.into(), dtype, dims, writes: name == "c" }
}

fn dim(name: &str) -> ParamSig {
    ParamSig::Dim { name: name.into() }
}

fn ceil_div(sym: &str, by: i64) -> HostExpr {
    HostExpr::CeilDiv(Box::new(HostExpr::Dim(sym.into())), Box::new(HostExpr::Const(by)))
}

/// `c[M, N] = alpha * a[M, K] @ b[K, N]`, 64x64 tiles, K a multiple of 16.
fn gemm() -> CompiledKernel {
    CompiledKernel {
        entry: "gemm".into(),
        ptx: String::new(),
        params: vec![
            tensor("a", DType::BF16, &["M", "K"]),
            tensor("b", DType::BF16, &["K", "N"]),
            tensor("c", DType::F32, &["M", "N"]),
            dim("M"),
            dim("N"),
            dim("K"),
            ParamSig::Scalar { name: "alpha".into(), dtype: DType::F32 },
        ],
        threads: 128,
        shared_bytes: 64 * 1024,
        grid: [ceil_div("N", 64), ceil_div("M", 64), HostExpr::Const(1)],
        assumptions: vec![("K".into(), 16)],
        exact_extents: vec![],
        cluster_blocks: 1,
    }
}

fn view(ptr: u64, shape: &[usize], dtype: DType) -> KernelArg {
    KernelArg::Tensor(
        // SAFETY: a descriptor for planning and binding only, never launched.
        unsafe { TensorView::from_raw(ptr, shape, dtype, 0) }.expect("valid view"),
    )
}

fn args(m: usize, n: usize, k: usize) -> Vec<(&'static str, KernelArg)> {
    vec![
        ("a", view(0x1000, &[m, k], DType::BF16)),
        ("b", view(0x2000, &[k, n], DType::BF16)),
        ("c", view(0x3000, &[m, n], DType::F32)),
        ("alpha", KernelArg::F32(0.5)),
    ]
}

fn with(
    mut args: Vec<(&'static str, KernelArg)>,
    name: &'static str,
    arg: KernelArg,
) -> Vec<(&'static str, KernelArg)> {
    args.retain(|(n, _)| *n != name);
    args.push((name, arg));
    args
}

/// Asserts `r` is a `BadArgument` naming `name`, and that the message names it too.
fn assert_names<T: std::fmt::Debug>(r: Result<T, RuntimeError>, name: &str) {
    let err = r.expect_err("binding should fail");
    let msg = err.to_string();
    match &err {
        RuntimeError::BadArgument { name: n, .. } => assert_eq!(n, name, "{msg}"),
        other => panic!("expected BadArgument for `{name}`, got {other:?}"),
    }
    assert!(msg.contains(&format!("`{name}`")), "{msg}");
}

#[test]
fn binds_in_parameter_order() {
    let k = gemm();
    let b = bind_args(&k, &args(100, 130, 32)).expect("valid arguments");
    assert_eq!(b.grid, [3, 2, 1]);
    assert_eq!(b.block, [128, 1, 1]);
    assert_eq!(b.shared_bytes, 64 * 1024);
    let want = [
        RawArg::U64(0x1000),
        RawArg::U64(0x2000),
        RawArg::U64(0x3000),
        RawArg::I32(100),
        RawArg::I32(130),
        RawArg::I32(32),
        RawArg::F32(0.5),
    ];
    assert_eq!(b.values(), want);
    assert!(!b.is_empty());
    assert!(b.check_device(&k, 0).is_ok());
    assert_names(b.check_device(&k, 1), "a");
}

#[test]
fn empty_grid_is_not_an_error() {
    let b = bind_args(&gemm(), &args(0, 64, 16)).expect("valid arguments");
    assert!(b.is_empty());
}

#[test]
fn rank_mismatch_names_the_tensor() {
    assert_names(bind_args(&gemm(), &with(args(64, 64, 16), "a", view(0x1000, &[64], DType::BF16))), "a");
}

#[test]
fn dtype_mismatch_names_the_tensor() {
    let a = view(0x1000, &[64, 16], DType::F32);
    assert_names(bind_args(&gemm(), &with(args(64, 64, 16), "a", a)), "a");
}

#[test]
fn disagreeing_extents_name_the_later_tensor() {
    let b = view(0x2000, &[32, 64], DType::BF16);
    let r = bind_args(&gemm(), &with(args(64, 64, 16), "b", b));
    let msg = r.as_ref().map(|_| ()).expect_err("K disagrees").to_string();
    assert!(msg.contains("K = 16") && msg.contains("`a`"), "{msg}");
    assert_names(r, "b");
}

#[test]
fn missing_argument_is_named() {
    let mut a = args(64, 64, 16);
    a.retain(|(n, _)| *n != "alpha");
    assert_names(bind_args(&gemm(), &a), "alpha");
    a.retain(|(n, _)| *n != "c");
    assert_names(bind_args(&gemm(), &a), "c");
}

#[test]
fn wrong_scalar_type_and_unknown_names_are_rejected() {
    assert_names(bind_args(&gemm(), &with(args(64, 64, 16), "alpha", KernelArg::I32(1))), "alpha");
    assert_names(bind_args(&gemm(), &with(args(64, 64, 16), "beta", KernelArg::F32(1.0))), "beta");
    let mut twice = args(64, 64, 16);
    twice.push(("alpha", KernelArg::F32(2.0)));
    assert_names(bind_args(&gemm(), &twice), "alpha");
}

#[test]
fn assumption_violation_names_the_source_tensor() {
    let r = bind_args(&gemm(), &args(64, 64, 24));
    let msg = r.as_ref().map(|_| ()).expect_err("K % 16 != 0").to_string();
    assert!(msg.contains("multiple of 16") && msg.contains("K = 24"), "{msg}");
    assert_names(r, "a");
}

#[test]
fn misaligned_pointer_names_the_tensor() {
    let c = view(0x3008, &[64, 64], DType::F32);
    assert_names(bind_args(&gemm(), &with(args(64, 64, 16), "c", c)), "c");
}

#[test]
fn explicit_dims_fill_extents_no_tensor_names() {
    let mut k = gemm();
    k.params.push(dim("T"));
    k.grid[2] = HostExpr::Dim("T".into());
    assert_names(bind_args(&k, &args(64, 64, 16)), "T");
    let b = bind_args(&k, &with(args(64, 64, 16), "T", KernelArg::I32(5))).expect("T given");
    assert_eq!(b.grid, [1, 1, 5]);
    assert_eq!(b.values().last(), Some(&RawArg::I32(5)));
    assert_names(bind_args(&k, &with(args(64, 64, 16), "T", KernelArg::I32(-1))), "T");
    // A dim a tensor already gives may be repeated only with the same value.
    assert!(bind_args(&k, &with(with(args(64, 64, 16), "T", KernelArg::I32(1)), "M", KernelArg::I32(64))).is_ok());
    assert_names(bind_args(&k, &with(with(args(64, 64, 16), "T", KernelArg::I32(1)), "M", KernelArg::I32(32))), "M");
}

#[test]
fn grids_past_cuda_limits_are_rejected() {
    // 65536 row tiles along y: one more than CUDA launches.
    let m = 64 * 65536;
    bind_args(&gemm(), &args(64 * 65535, 64, 16)).expect("65535 blocks along y launch");
    match bind_args(&gemm(), &args(m, 64, 16)) {
        Err(RuntimeError::Unsupported(msg)) => {
            assert!(msg.contains("grid axis 1") && msg.contains("65536") && msg.contains("65535"), "{msg}")
        }
        other => panic!("expected an unsupported-grid error, got {:?}", other.map(|b| b.grid)),
    }
}

#[test]
fn a_cluster_launch_takes_whole_clusters_only() {
    // Clusters of 2 along x, the N tiles: 128 columns are 2 tiles, 192 are 3.
    let clustered = CompiledKernel { cluster_blocks: 2, ..gemm() };
    let bound = bind_args(&clustered, &args(64, 128, 16)).expect("a grid of whole clusters");
    assert_eq!(bound.grid, [2, 1, 1]);
    match bind_args(&clustered, &args(64, 192, 16)) {
        Err(RuntimeError::Unsupported(msg)) => {
            assert!(msg.contains("grid axis 0") && msg.contains("3 blocks") && msg.contains("clusters of 2"), "{msg}")
        }
        other => panic!("expected an error for a partial cluster, got {:?}", other.map(|b| b.grid)),
    }
}

/// An sm_90a GEMM whose fills are TMA boxes and whose epilogue is a bulk store (a swept
/// candidate; the shipped one stores its fragments): three tensor maps after the source's
/// parameters.
fn hopper_gemm() -> CompiledKernel {
    let staged = |c: &kda_kernels::gemm::GemmConfig| c.fill_warps == 4 && c.staged_store;
    let cfg = kda_kernels::hopper_gemm_candidates().into_iter().find(staged).expect("a staged candidate");
    kda_dsl::compile(kda_kernels::gemm::gemm(&cfg).expect("builds"), kda_dsl::Target::Sm90a).expect("compiles")
}

#[test]
fn a_kernel_declares_its_tensor_maps_after_its_own_parameters() {
    let k = hopper_gemm();
    let maps: Vec<&str> = k
        .params
        .iter()
        .filter_map(|p| match p {
            ParamSig::TensorMap(sig) => Some(sig.tensor.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(maps, ["a", "b", "c"]);
    let first_map = k.params.iter().position(|p| matches!(p, ParamSig::TensorMap(_))).expect("a map");
    assert!(k.params[first_map..].iter().all(|p| matches!(p, ParamSig::TensorMap(_))));
    assert!(k.ptx.contains(".param .align 64 .b8 p_a$map0[128]"), "{}", k.ptx);
}

/// The caller passes the tensors; the maps are the runtime's. An extent the kernel assumes
/// aligned is reported as that assumption (naming the tensor it came from), before any map is
/// encoded; valid arguments encode the maps, or say there is no GPU, never panicking.
#[test]
fn tensor_maps_are_made_from_the_tensors_they_map() {
    let k = hopper_gemm();
    let hopper_args = |m: usize, n: usize, kk: usize| {
        vec![
            ("a", view(0x1000, &[m, kk], DType::BF16)),
            ("b", view(0x100000, &[n, kk], DType::BF16)),
            ("c", view(0x200000, &[m, n], DType::F32)),
        ]
    };
    assert_names(bind_args(&k, &hopper_args(256, 256, 100)), "a");
    let passing_a_map = with(hopper_args(256, 256, 128), "a$map0", KernelArg::I32(0));
    assert_names(bind_args(&k, &passing_a_map), "a$map0");
    match bind_args(&k, &hopper_args(256, 256, 128)) {
        Ok(bound) => {
            assert!(kda_runtime::gpu_available());
            assert!(matches!(bound.values().last(), Some(RawArg::TensorMap(2))), "{:?}", bound.values());
        }
        Err(e) => {
            assert!(!kda_runtime::gpu_available(), "{e}");
            assert!(matches!(e, RuntimeError::NoGpu), "{e:?}");
        }
    }
}
