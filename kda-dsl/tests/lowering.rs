//! The lowered thread IR of small kernels (canonical register names), and what the lowering
//! refuses, at the kernel line.

use kda_dsl::builder::*;
use kda_dsl::sim::{run, SimArg};
use kda_dsl::tile::{BinOp, LoopKind};
use kda_dsl::{DType, SrcLoc};

fn loc(line: u32) -> SrcLoc {
    SrcLoc::new("k.rs", line, 5)
}

fn dump(p: &kda_dsl::thread_ir::ThreadProgram) -> String {
    p.body.iter().map(|i| format!("{i}    // {}\n", i.loc.line)).collect()
}

/// The dumped instructions from source line `line`, one per line.
fn line_ir(p: &kda_dsl::thread_ir::ThreadProgram, line: u32) -> String {
    let tag = format!("// {line}");
    dump(p).lines().filter(|l| l.ends_with(&tag)).map(|l| format!("{l}\n")).collect()
}

#[test]
fn a_masked_copy_through_shared_memory() {
    let k = KernelBuilder::new("copy", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::BF16, false);
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    let b = k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16, 16], DType::BF16, loc(3));
    k.copy(k.tile(&a, vec![b[0].clone(), Val::from(0)], &[16, 16], loc(4)), s, loc(4));
    k.copy(s, k.tile(&o, vec![b[0].clone(), Val::from(0)], &[16, 16], loc(5)), loc(5));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    insta::assert_snapshot!(dump(&prog));
}

#[test]
fn unroll_needs_constant_bounds_and_says_where() {
    let k = KernelBuilder::new("bad", loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    k.begin_for("i", LoopKind::Unroll, 0, k.dim("N"), loc(3));
    k.end();
    let e = kda_dsl::lower_kernel(k.finish().expect("valid")).expect_err("refused");
    assert_eq!(e.loc.line, 3);
    assert!(e.message.contains("`unroll` needs bounds known when lowering"), "{e}");
}

#[test]
fn gemm_shapes_must_agree() {
    let k = KernelBuilder::new("bad", loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let a = k.shared("a", &[16, 32], DType::BF16, loc(3));
    let b = k.shared("b", &[16, 16], DType::BF16, loc(4));
    let c = k.fragment("c", &[16, 16], DType::F32, loc(5));
    k.gemm(a, b.t(), &c, loc(6));
    let e = kda_dsl::lower_kernel(k.finish().expect("valid")).expect_err("refused");
    assert_eq!(e.loc.line, 6);
    assert!(e.message.contains("gemm shapes"), "{e}");
}

#[test]
fn a_product_plus_a_value_is_one_fused_multiply_add() {
    let k = KernelBuilder::new("fma", loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let x = k.fragment("x", &[16, 16], DType::F32, loc(3));
    let y = k.fragment("y", &[16, 16], DType::F32, loc(4));
    k.fill(&x, 2.0, loc(5));
    k.fill(&y, 3.0, loc(6));
    let ij = k.begin_parallel(&x, &["i", "j"], loc(7));
    let xy = Val::bin(BinOp::Mul, k.elem(&x, ij.clone(), loc(8)), k.elem(&y, ij.clone(), loc(8)));
    k.store(&y, ij.clone(), Val::bin(BinOp::Add, k.elem(&y, ij.clone(), loc(8)), xy), loc(8));
    k.end();
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line8: String = line_ir(&prog, 8);
    assert!(line8.contains("fma.rn.f32") && !line8.contains("mul.rn.f32"), "{line8}");
}

/// `c - a * b` and `a * b - c` are one `fma.rn.f32` each (of `-a`, of `-c`), and compute what
/// a single rounding of the exact value gives: (1 + 2^-11) - (1 + 2^-12)^2 is -2^-24 exactly,
/// which a rounded product (to 1 + 2^-11) would lose.
#[test]
fn a_difference_with_a_product_is_one_fused_multiply_add() {
    let k = KernelBuilder::new("fms", loc(1));
    let o = k.tensor("o", &["N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let x = k.fragment("x", &[16, 16], DType::F32, loc(3));
    let y = k.fragment("y", &[16, 16], DType::F32, loc(4));
    let r = k.shared("r", &[2], DType::F32, loc(5));
    k.fill(&x, 1.0 + 1.0 / 4096.0, loc(5));
    k.fill(&y, 1.0 + 1.0 / 4096.0, loc(6));
    let ij = k.begin_parallel(&x, &["i", "j"], loc(7));
    let xy = Val::bin(BinOp::Mul, k.elem(&x, ij.clone(), loc(8)), k.elem(&y, ij.clone(), loc(8)));
    k.store(&x, ij.clone(), Val::bin(BinOp::Sub, Val::from(1.0 + 1.0 / 2048.0), xy), loc(8));
    k.end();
    let ij = k.begin_parallel(&y, &["i", "j"], loc(9));
    let yy = Val::bin(BinOp::Mul, k.elem(&y, ij.clone(), loc(9)), Val::from(2.0));
    k.store(&y, ij.clone(), Val::bin(BinOp::Sub, yy, Val::from(1.0)), loc(9));
    k.end();
    let ij = k.begin_parallel(&x, &["i", "j"], loc(10));
    let first = Val::bin(
        BinOp::And,
        Val::bin(BinOp::Eq, ij[0].clone(), Val::from(0)),
        Val::bin(BinOp::Eq, ij[1].clone(), Val::from(0)),
    );
    k.begin_if(first, loc(10));
    k.store(&r, vec![Val::from(0)], k.elem(&x, ij.clone(), loc(10)), loc(10));
    k.store(&r, vec![Val::from(1)], k.elem(&y, ij.clone(), loc(10)), loc(10));
    k.end();
    k.end();
    k.copy(r, k.tile(&o, vec![Val::from(0)], &[2], loc(11)), loc(11));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    for line in [8, 9] {
        let text: String = line_ir(&prog, line);
        assert!(text.contains("fma.rn.f32") && !text.contains("mul.rn.f32") && !text.contains("sub.rn.f32"), "{text}");
    }
    let mut args = vec![("o".to_string(), SimArg::Tensor(vec![0; 8])), ("N".to_string(), SimArg::I32(2))];
    run(&prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(out) = &args[0].1 else { unreachable!() };
    let got: Vec<f32> = out.chunks(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
    assert_eq!(got[0], -(2f32.powi(-24)), "c - x y");
    assert_eq!(got[1], 1.0 + 1.0 / 2048.0, "2 y - 1");
}

/// A 32-thread kernel whose `parallel` over a 16 x 16 f32 fragment `f` (filled with 1.5, line
/// 5; the loop at line 6) runs `body(k, f, s, [i, j])` with `s` a bf16 shared tile of `shape`,
/// lowered.
fn stores_from_a_fragment(
    name: &str,
    shape: &[i64],
    body: impl FnOnce(&KernelBuilder, &Tile, &Tile, Vec<Val>),
) -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new(name, loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let f = k.fragment("f", &[16, 16], DType::F32, loc(3));
    let s = k.shared("s", shape, DType::BF16, loc(4));
    k.fill(&f, 1.5, loc(5));
    let ij = k.begin_parallel(&f, &["i", "j"], loc(6));
    body(&k, &f, &s, ij);
    k.end();
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// An element stored to a bf16 shared tile is rounded once, by the store (a register tile of
/// bf16 keeps the rounded value as f32, so there it is rounded and widened); a fragment's two
/// adjacent columns go out as one 4-byte store, packed by one conversion.
#[test]
fn an_element_stored_to_bf16_shared_memory_is_converted_once() {
    let prog = stores_from_a_fragment("narrow", &[16, 16], |k, f, s, ij| {
        k.store(s, ij.clone(), Val::bin(BinOp::Mul, k.elem(f, ij.clone(), loc(6)), Val::from(3.0)), loc(6));
    });
    let line6: String = line_ir(&prog, 6);
    // 8 elements per thread, 4 pairs of adjacent columns: one conversion and one store a pair,
    // and none back to f32.
    assert_eq!(line6.matches("cvt.rn.bf16x2.f32").count(), 4, "{line6}");
    assert_eq!(line6.matches("st.shared.b32").count(), 4, "{line6}");
    assert!(!line6.contains("cvt.rn.bf16.f32") && !line6.contains("st.shared.b16"), "{line6}");
    assert!(!line6.contains("cvt.f32.bf16"), "{line6}");
}

/// A shared element at the loop's index plus a constant row block (`s[i + 16][j]`) stays a
/// per-thread part plus constants: the thread part's swizzle is computed once and each store
/// adds a constant to it (before, each of the 8 elements swizzled its own address), and they
/// pair as `s[i][j]`'s do.
#[test]
fn an_index_plus_a_constant_keeps_its_address_split() {
    let prog = stores_from_a_fragment("stacked", &[32, 16], |k, f, s, ij| {
        let below = vec![Val::bin(BinOp::Add, ij[0].clone(), Val::from(16)), ij[1].clone()];
        k.store(s, below, k.elem(f, ij.clone(), loc(7)), loc(7));
    });
    let line7: String = line_ir(&prog, 7);
    assert_eq!(line7.matches("st.shared.b32").count(), 4, "{line7}");
    assert_eq!(line7.matches("xor.b32").count(), 1, "{line7}");
}

/// Held stores pair only where nothing between them may write the same word: a store between
/// whose address is not a split of a thread part and a constant (`j * 1 + 16`: columns no other
/// store of the body writes, but the lowering cannot tell) keeps every 16-bit store apart.
#[test]
fn stores_that_may_overlap_are_not_paired() {
    let prog = stores_from_a_fragment("overlap", &[16, 32], |k, f, s, ij| {
        let opaque = Val::bin(BinOp::Add, Val::bin(BinOp::Mul, ij[1].clone(), Val::from(1)), Val::from(16));
        k.store(s, ij.clone(), k.elem(f, ij.clone(), loc(6)), loc(6));
        k.store(s, vec![ij[0].clone(), opaque], Val::from(2.0), loc(6));
    });
    let line6: String = line_ir(&prog, 6);
    assert!(!line6.contains("st.shared.b32"), "{line6}");
    assert_eq!(line6.matches("st.shared.b16").count(), 16, "{line6}");
}

/// A gemm's `ldmatrix` addresses are a per-thread part computed once per operand plus a
/// constant XOR and offset per k-step: the swizzle is not recomputed for each of them.
#[test]
fn gemm_operand_addresses_split_into_a_thread_part_and_constants() {
    let k = KernelBuilder::new("mm", loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let a = k.shared("a", &[16, 64], DType::BF16, loc(3));
    let b = k.shared("b", &[16, 64], DType::BF16, loc(4));
    let c = k.fragment("c", &[16, 16], DType::F32, loc(5));
    k.fill(&a, 1.0, loc(6));
    k.fill(&b, 1.0, loc(6));
    k.gemm(a, b.t(), &c, loc(7));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line7: String = line_ir(&prog, 7);
    // 4 k-steps, one `ldmatrix` of each operand per step.
    assert_eq!(line7.matches("ldmatrix").count(), 8, "{line7}");
    // The swizzled offset's multiplications: two per operand's thread part and the warp's row
    // base, not two per `ldmatrix`; later k-steps XOR a constant into the thread part.
    assert!(line7.matches("mul.lo.s32").count() <= 5, "{line7}");
    assert!(line7.matches("xor.b32").count() >= 6, "{line7}");
}

/// A column scan of a swizzled shared tile computes each thread's address once: the rows down
/// its column are a constant XOR and offset each.
#[test]
fn a_scan_down_shared_columns_splits_its_addresses() {
    let k = KernelBuilder::new("scan", loc(1));
    k.launch(vec![Host::int(1)], 128, loc(2));
    let s = k.shared("s", &[16, 128], DType::F32, loc(3));
    k.fill(&s, 1.0, loc(4));
    k.cumsum(&s, &s, 0, loc(5));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line5: String = line_ir(&prog, 5);
    assert_eq!(line5.matches("ld.shared.f32").count(), 16, "{line5}");
    // One thread part (its multiplications) for the 16 rows, not one per row.
    assert!(line5.matches("mul.lo.s32").count() <= 2, "{line5}");
}

/// A kernel of `threads` threads that fills a shared table `t [16, cols]` with `t[i][j] = i cols
/// + j`, gathers `f[i][j] = t[row(i)][j]` into a fragment `f [rows, cols]` (line 6) and stores
/// `f` to `o`. Returns line 6's thread IR and `o` after a simulator run with `N = n`.
fn gather_rows(
    threads: u32,
    rows: u32,
    cols: u32,
    n: i32,
    row: impl Fn(&KernelBuilder, Val) -> Val,
) -> (String, Vec<f32>) {
    let k = KernelBuilder::new("gather", loc(1));
    let o = k.tensor("o", &["M", "C"], DType::F32, true);
    k.launch(vec![Host::int(1)], threads, loc(2));
    let t = k.shared("t", &[16, cols as i64], DType::F32, loc(3));
    let f = k.fragment("f", &[rows as i64, cols as i64], DType::F32, loc(4));
    let ij = k.begin_parallel(&t, &["i", "j"], loc(5));
    let v = Val::bin(BinOp::Add, Val::bin(BinOp::Mul, ij[0].clone(), Val::from(cols as i64)), ij[1].clone());
    k.store(&t, ij.clone(), Val::cast(v, DType::F32), loc(5));
    k.end();
    let ij = k.begin_parallel(&f, &["i", "j"], loc(6));
    let r = row(&k, ij[0].clone());
    k.store(&f, ij.clone(), k.elem(&t, vec![r, ij[1].clone()], loc(6)), loc(6));
    k.end();
    k.copy(f, k.tile_at(&o, vec![Val::from(0), Val::from(0)], &[rows as i64, cols as i64], loc(7)), loc(7));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line6: String = line_ir(&prog, 6);
    let mut args = vec![
        ("o".to_string(), SimArg::Tensor(vec![0; (rows * cols * 4) as usize])),
        ("M".to_string(), SimArg::I32(rows as i32)),
        ("C".to_string(), SimArg::I32(cols as i32)),
        ("N".to_string(), SimArg::I32(n)),
    ];
    run(&prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(out) = &args[0].1 else { unreachable!() };
    (line6, out.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// `i % 16` of a fragment's row index stays a split index: the shared reads at it are a thread
/// part plus constants (no remainder per element), and they read the right rows.
#[test]
fn a_power_of_two_remainder_of_an_element_index_keeps_its_split() {
    let (line6, out) = gather_rows(64, 32, 16, 0, |_, i| Val::bin(BinOp::Rem, i, Val::from(16)));
    assert!(!line6.contains("rem."), "{line6}");
    for (e, v) in out.iter().enumerate() {
        let (i, j) = (e / 16, e % 16);
        assert_eq!(*v, ((i % 16) * 16 + j) as f32, "row {i} column {j}");
    }
}

/// A row every element reads alike (`t[n - 1][j]`, `n` known at run time) is computed once,
/// and its thread part with it: each element adds constants only, and reads the right row.
#[test]
fn an_index_every_element_computes_alike_is_computed_once() {
    let n = 6;
    let (line6, out) = gather_rows(32, 16, 128, n, |k, _| Val::bin(BinOp::Sub, k.dim("N"), Val::from(1)));
    assert_eq!(line6.matches("ld.shared").count(), 64, "{line6}");
    assert_eq!(line6.matches("sub.s32").count(), 1, "{line6}");
    assert!(line6.matches("mul.lo.s32").count() <= 2, "{line6}");
    for (e, v) in out.iter().enumerate() {
        assert_eq!(*v, ((n as usize - 1) * 128 + e % 128) as f32, "element {e}");
    }
}

/// The loads of line 6 in a kernel copying a bf16 shared tile into a fragment; with `to_f32`,
/// the fragment is also stored to an f32 tensor.
fn bf16_rows_into_a_fragment(to_f32: bool) -> String {
    let k = KernelBuilder::new("widen", loc(1));
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16, 64], DType::BF16, loc(3));
    let f = k.fragment("f", &[16, 64], DType::F32, loc(4));
    k.fill(&s, 1.0, loc(5));
    k.copy(s, f, loc(6));
    if to_f32 {
        k.copy(f, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 64], loc(7)), loc(7));
    }
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    line_ir(&prog, 6)
}

#[test]
fn bf16_shared_rows_load_into_a_fragment_as_vectors() {
    // A fragment that only meets 16-bit memory holds 8 adjacent columns per thread: its 32
    // elements are 4 runs of 8 bf16, one 16-byte load each.
    let line6 = bf16_rows_into_a_fragment(false);
    assert_eq!(line6.matches("ld.shared.v4.b32").count(), 4, "{line6}");
    assert!(!line6.contains("ld.shared.b16"), "{line6}");
    // Stored as f32 too, it keeps 4 (16 bytes of f32): 8 runs of 4 bf16, 8 bytes each.
    let line6 = bf16_rows_into_a_fragment(true);
    assert_eq!(line6.matches("ld.shared.v2.b32").count(), 8, "{line6}");
    assert!(!line6.contains("ld.shared.b16"), "{line6}");
}

/// A copy of 32 rows at row `32 * blockIdx.x + shift` of `a` `[R, 64]` into shared memory, with
/// `R` assumed to be `rows` and a grid of `rows / 32` blocks; the number of row-mask compares
/// its lowering emits.
fn row_checks(rows: i64, shift: i64) -> usize {
    row_checks_of(rows, shift, false)
}

/// [`row_checks`], with the block index first reassigned to itself plus one (`bump`).
fn row_checks_of(rows: i64, shift: i64, bump: bool) -> usize {
    let k = KernelBuilder::new("rows", loc(1));
    let a = k.tensor("a", &["R", "C"], DType::F32, false);
    let r = k.dim("R");
    let c = k.dim("C");
    k.assume_extent(&r, rows, loc(2));
    k.assume_extent(&c, 64, loc(2));
    let b = k.launch(vec![Host::ceil_div(k.host_dim("R"), Host::int(32))], 128, loc(3));
    if bump {
        k.assign(&b[0], Val::bin(BinOp::Add, b[0].clone(), 1), loc(3));
    }
    let s = k.shared("s", &[32, 64], DType::F32, loc(4));
    let r0 = Val::bin(BinOp::Add, Val::bin(BinOp::Mul, b[0].clone(), 32), shift);
    k.copy(k.tile_at(&a, vec![r0, Val::from(0)], &[32, 64], loc(5)), s, loc(5));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    dump(&prog).lines().filter(|l| l.starts_with("setp.lt") && l.ends_with("// 5")).count()
}

#[test]
fn a_box_that_provably_fits_its_axis_has_no_row_checks() {
    // Rows 32 b .. 32 b + 32 with b < 128 / 32 stay below 128: no compare at all.
    assert_eq!(row_checks(128, 0), 0);
    // Shifted by 16 the last block's box would cross the end: every pass is checked.
    assert!(row_checks(128, 16) > 0);
    // A block index the kernel reassigns has no grid range: the checks stay.
    assert!(row_checks_of(128, 0, true) > 0);
    // 100 rows: ceil(100 / 32) = 4 blocks, and the last box crosses row 100.
    assert!(row_checks(100, 0) > 0);
}

/// A fill of rows past the tensor's end at a constant column start: the masked selection is of
/// the address without the start (so fills of other column blocks of the same rows share it),
/// the start is added after, and the simulator reads the right columns and zeros past the end.
#[test]
fn a_row_masked_fill_at_a_constant_column_start_adds_the_start_after_the_mask() {
    let k = KernelBuilder::new("cols", loc(1));
    let a = k.tensor("a", &["R", "C"], DType::BF16, false);
    let o = k.tensor("o", &["P", "Q"], DType::BF16, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    k.assume_extent(&k.dim("C"), 128, loc(2));
    let s = k.shared("s", &[16, 64], DType::BF16, loc(3));
    k.copy(k.tile_at(&a, vec![Val::from(0), Val::from(64)], &[16, 64], loc(4)), s, loc(4));
    k.copy(s, k.tile_at(&o, vec![Val::from(0), Val::from(0)], &[16, 64], loc(5)), loc(5));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line4: String = line_ir(&prog, 4);
    // 16 rows of 8 chunks over 32 threads: 4 passes, each a masked selection, then + 128 bytes.
    assert_eq!(line4.matches("cp.async.cg").count(), 4, "{line4}");
    let lines: Vec<&str> = line4.lines().collect();
    let start_after_select = lines
        .windows(2)
        .filter(|w| {
            let selected = w[0].split_whitespace().nth(1).unwrap_or("-").trim_end_matches(',');
            w[0].starts_with("selp.u64") && w[1].starts_with("add.s64") && w[1].contains(&format!("{selected}, 128;"))
        })
        .count();
    assert_eq!(start_after_select, 4, "{line4}");
    let rows = 10;
    // Finite positive bf16 values, each distinct (the store out may round through f32).
    let x: Vec<u16> = (0..rows * 128).map(|i| (0x3f80 + i) as u16).collect();
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(x.iter().flat_map(|v| v.to_le_bytes()).collect())),
        ("R".to_string(), SimArg::I32(rows as i32)),
        ("C".to_string(), SimArg::I32(128)),
        ("o".to_string(), SimArg::Tensor(vec![0xff; 16 * 64 * 2])),
        ("P".to_string(), SimArg::I32(16)),
        ("Q".to_string(), SimArg::I32(64)),
    ];
    run(&prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(out) = &args[3].1 else { unreachable!() };
    for r in 0..16 {
        for c in 0..64 {
            let got = u16::from_le_bytes([out[2 * (r * 64 + c)], out[2 * (r * 64 + c) + 1]]);
            let want = if r < rows { x[r * 128 + 64 + c] } else { 0 };
            assert_eq!(got, want, "row {r} column {c}");
        }
    }
}

/// Runs a table kernel (`a` and `o` of 64 f32, extent `M`, dimension `N = n`) in the
/// simulator; `o` afterwards.
fn run_table(prog: &kda_dsl::thread_ir::ThreadProgram, a: &[f32], n: i32) -> Vec<f32> {
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(a.iter().flat_map(|x| x.to_le_bytes()).collect())),
        ("M".to_string(), SimArg::I32(64)),
        ("o".to_string(), SimArg::Tensor(vec![0; 256])),
        ("N".to_string(), SimArg::I32(n)),
    ];
    run(prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(o) = &args[2].1 else { unreachable!() };
    o.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The table kernels' start: f32 tensors `a` (read) and `o` (written) of extent `M`, 32
/// threads, a 64-entry shared table `s` and an open `parallel` over it with index `i`.
fn table_kernel(name: &str) -> (KernelBuilder, Tensor, Tensor, Tile, Val) {
    let k = KernelBuilder::new(name, loc(1));
    let a = k.tensor("a", &["M"], DType::F32, false);
    let o = k.tensor("o", &["M"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[64], DType::F32, loc(3));
    let i = k.begin_parallel(&s, &["i"], loc(4)).remove(0);
    (k, a, o, s, i)
}

/// Closes a table kernel's `parallel`, copies the table to `o` at kernel line `line` and lowers.
fn finish_table(k: KernelBuilder, s: Tile, o: Tensor, line: u32) -> kda_dsl::thread_ir::ThreadProgram {
    k.end();
    k.copy(s, k.tile(&o, vec![Val::from(0)], &[64], loc(line)), loc(line));
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// Fills a 64-entry shared table in a `parallel` loop, `a[i]` where `N > 0` and -1 elsewhere
/// (`into_shared`), or through a register assigned under the `if` (`!into_shared`), then
/// writes it to `o`.
fn guarded_table(into_shared: bool) -> (kda_dsl::thread_ir::ThreadProgram, String) {
    let (k, a, o, s, i) = table_kernel("table");
    let positive = Val::bin(BinOp::Gt, k.dim("N"), 0);
    if into_shared {
        k.begin_if(positive, loc(5));
        k.store(&s, vec![i.clone()], k.load(&a, vec![i.clone()], loc(6)), loc(6));
        k.begin_else();
        k.store(&s, vec![i], -1.0, loc(7));
        k.end();
    } else {
        let x = k.let_var("x", -1.0, loc(5));
        k.begin_if(positive, loc(6));
        k.assign(&x, k.load(&a, vec![i.clone()], loc(6)), loc(6));
        k.end();
        k.store(&s, vec![i], x, loc(7));
    }
    let prog = finish_table(k, s, o, 8);
    let text = dump(&prog);
    (prog, text)
}

#[test]
fn a_short_if_that_stores_to_memory_runs_under_its_predicate_without_a_branch() {
    let (prog, text) = guarded_table(true);
    // Both arms' loads and stores are guarded, and nothing branches: the two passes' loads
    // share one basic block (ptxas issues them together).
    assert!(!text.contains("bra"), "{text}");
    let guarded = |op: &str| text.lines().filter(|l| l.contains(op)).all(|l| l.starts_with('@'));
    assert!(guarded("ld.global") && guarded("st.shared"), "{text}");
    // Both arms are right, in the simulator, for either value of the condition.
    for n in [0, 3] {
        let a: Vec<f32> = (0..64).map(|x| x as f32 + 0.5).collect();
        let o = run_table(&prog, &a, n);
        let want: Vec<f32> = if n > 0 { a } else { vec![-1.0; 64] };
        assert_eq!(o, want, "N = {n}");
    }
}

#[test]
fn an_if_nested_in_a_predicated_arm_is_predicated_too() {
    // `if N > 0 { x = a[i]; if i < 40 { x = 2 } ; s[i] = x }`: the inner `if` only sets a
    // register, yet inside the predicated arm it may not branch.
    let (k, a, o, s, i) = table_kernel("nested");
    let x = k.let_var("x", -1.0, loc(5));
    k.begin_if(Val::bin(BinOp::Gt, k.dim("N"), 0), loc(6));
    k.assign(&x, k.load(&a, vec![i.clone()], loc(7)), loc(7));
    k.begin_if(Val::bin(BinOp::Lt, i.clone(), 40), loc(8));
    k.assign(&x, 2.0, loc(8));
    k.end();
    k.store(&s, vec![i.clone()], x.clone(), loc(9));
    k.end();
    k.begin_if(Val::bin(BinOp::Le, k.dim("N"), 0), loc(10));
    k.store(&s, vec![i], -1.0, loc(10));
    k.end();
    let prog = finish_table(k, s, o, 11);
    let text = dump(&prog);
    assert!(!text.contains("bra") && !text.lines().any(|l| l.starts_with('@') && l.contains(':')), "{text}");
    let a: Vec<f32> = (0..64).map(|x| x as f32).collect();
    let o = run_table(&prog, &a, 1);
    let want: Vec<f32> = (0..64).map(|i| if i < 40 { 2.0 } else { i as f32 }).collect();
    assert_eq!(o, want);
}

#[test]
fn a_predicated_arm_that_assigns_its_own_condition_runs_once() {
    // `let f = N > 0; if f { f = false; s[i] = a[i] } else { s[i] = -1 }`: the guards are fixed
    // before either arm, so the then-arm's own stores still run and the else-arm does not.
    let (k, a, o, s, i) = table_kernel("flag");
    let f = k.let_var("f", Val::bin(BinOp::Gt, k.dim("N"), 0), loc(5));
    k.begin_if(f.clone(), loc(6));
    k.assign(&f, false, loc(6));
    k.store(&s, vec![i.clone()], k.load(&a, vec![i.clone()], loc(7)), loc(7));
    k.begin_else();
    k.store(&s, vec![i], -1.0, loc(8));
    k.end();
    let prog = finish_table(k, s, o, 9);
    assert!(!dump(&prog).contains("bra"), "{}", dump(&prog));
    for n in [0, 2] {
        let a: Vec<f32> = (0..64).map(|x| x as f32 + 0.25).collect();
        let o = run_table(&prog, &a, n);
        assert_eq!(o, if n > 0 { a } else { vec![-1.0; 64] }, "N = {n}");
    }
}

#[test]
fn an_if_that_only_sets_registers_keeps_its_branch() {
    let (_, text) = guarded_table(false);
    assert!(text.contains("bra"), "{text}");
}

#[test]
fn a_stage_fill_without_row_masks_chooses_its_source_once() {
    // A 2-stage pipeline over the `N` matrices of `a` [N, 32, 64], whose inner extents are
    // assumed: every row fits, and the only mask is `it < N`, the same for the fill's four
    // passes (32 x 64 f32 in 16-byte chunks over 128 threads).
    let k = KernelBuilder::new("fill", loc(1));
    let a = k.tensor("a", &["N", "R", "C"], DType::F32, false);
    let o = k.tensor("o", &["N", "R", "C"], DType::F32, true);
    k.assume_extent(&k.dim("R"), 32, loc(2));
    k.assume_extent(&k.dim("C"), 64, loc(2));
    k.launch(vec![Host::int(1)], 128, loc(3));
    let s = k.shared("s", &[32, 64], DType::F32, loc(4));
    let it = k.begin_for("it", LoopKind::pipelined(2), 0, k.dim("N"), loc(5));
    let at = |t: &kda_dsl::builder::Tensor, l: u32| {
        k.tile_at(t, vec![it.clone(), Val::from(0), Val::from(0)], &[1, 32, 64], loc(l))
    };
    k.copy(at(&a, 6), s, loc(6));
    k.copy(s, at(&o, 7), loc(7));
    k.end();
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let line6: Vec<String> = dump(&prog).lines().filter(|l| l.ends_with("// 6")).map(String::from).collect();
    let count = |op: &str| line6.iter().filter(|l| l.contains(op)).count();
    // Two fills (the prologue's and the body's), four passes each; per fill, one choice of the
    // first address and one of the step between passes, not one per pass.
    assert_eq!(count("cp.async.cg"), 8, "{line6:#?}");
    assert_eq!(count("selp.u64"), 4, "{line6:#?}");
    // The assumed extents are constants in the address arithmetic.
    for extent in [", 32, ", ", 64, "] {
        assert!(line6.iter().any(|l| l.starts_with("mad.lo.s64") && l.contains(extent)), "{line6:#?}");
    }
}

/// `o = a` through a shared stage (`cp.async`) and a fragment, plus register loads of `b` and
/// `c`; `stream` marks the boxes of `a`, `c` and `o` `.streaming()`.
fn copies_ptx(stream: bool) -> String {
    let k = KernelBuilder::new("stream", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::F32, false);
    let b = k.tensor("b", &["M", "N"], DType::F32, false);
    let c = k.tensor("c", &["M", "N"], DType::F32, false);
    let row = k.tensor("row", &["R"], DType::I32, false);
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    k.assume_extent(&k.dim("N"), 64, loc(2));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16, 64], DType::F32, loc(3));
    let f = k.fragment("f", &[16, 64], DType::F32, loc(4));
    let g = k.fragment("g", &[16, 64], DType::F32, loc(4));
    let at = |t: &kda_dsl::builder::Tensor, l: u32| k.tile_at(t, vec![Val::from(0), Val::from(0)], &[16, 64], loc(l));
    let region = |r: kda_dsl::tile::Region, l: u32| if stream { k.streaming(r, loc(l)) } else { r };
    k.copy(region(at(&a, 5), 5), s, loc(5));
    k.copy(s, f, loc(6));
    k.copy(at(&b, 7), g, loc(7));
    // A box whose row is read from memory: that scalar load is not the box's data.
    let r0 = k.load(&row, vec![Val::from(0)], loc(7));
    let c_box = k.tile_at(&c, vec![r0, Val::from(0)], &[16, 64], loc(7));
    k.copy(region(c_box, 7), g, loc(7));
    k.copy(f, region(at(&o, 8), 8), loc(8));
    kda_dsl::compile(k.finish().expect("valid"), kda_dsl::Target::Sm80).expect("compiles").ptx
}

#[test]
fn a_streaming_box_asks_l2_to_evict_its_lines_first() {
    let plain = copies_ptx(false);
    assert!(!plain.contains("createpolicy") && !plain.contains(".cs.") && !plain.contains("cache_hint"), "{plain}");
    let ptx = copies_ptx(true);
    // One policy, made at entry, for the box's `cp.async` copies.
    assert_eq!(ptx.matches("createpolicy.fractional.L2::evict_first.b64 %l2_evict_first, 1.0;").count(), 1, "{ptx}");
    let fills = ptx.lines().filter(|l| l.contains("cp.async.cg")).collect::<Vec<_>>();
    assert!(
        !fills.is_empty() && fills.iter().all(|l| l.contains(".L2::cache_hint") && l.ends_with(", %l2_evict_first;")),
        "{fills:#?}"
    );
    // Its loads and stores are `.cs`; the load of `b`, whose box is not streaming, is plain.
    let stores = ptx.lines().filter(|l| l.contains("st.global")).collect::<Vec<_>>();
    assert!(!stores.is_empty() && stores.iter().all(|l| l.contains("st.global.cs.")), "{stores:#?}");
    let loads = |cop: &str| ptx.matches(&format!("ld.global{cop}.v4.f32")).count();
    assert!(loads("") > 0 && loads("") == loads(".cs"), "{ptx}");
    // The row index of `c`'s box is loaded without the hint.
    assert!(ptx.contains("ld.global.s32") && !ptx.contains("ld.global.cs.s32"), "{ptx}");
    // The policy needs PTX 7.4: the header names it only then (sm_80's lowest is 7.0).
    assert!(ptx.contains(".version 7.4\n.target sm_80"), "{}", &ptx[..200]);
    assert!(plain.contains(".version 7.0\n.target sm_80"), "{}", &plain[..200]);
}

#[test]
fn streaming_applies_to_global_boxes_only() {
    let k = KernelBuilder::new("stream", loc(1));
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16, 64], DType::F32, loc(3));
    let _ = k.streaming(kda_dsl::tile::Region::Buf(s.id), loc(4));
    let err = k.finish().expect_err("a tile cannot stream").to_string();
    assert!(err.contains("streaming applies to a box of a global tensor") && err.contains("k.rs:4"), "{err}");
    // Nor is a streamed box prefetched: L2 would be asked to keep lines it should drop.
    let k = KernelBuilder::new("stream", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::F32, false);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let boxed = k.tile_at(&a, vec![Val::from(0), Val::from(0)], &[16, 64], loc(3));
    k.prefetch(k.streaming(boxed, loc(3)), loc(3));
    let err = k.finish().expect_err("no prefetch of a streamed box").to_string();
    assert!(err.contains("prefetch of a `.streaming()` box") && err.contains("k.rs:3"), "{err}");
}

/// How `whole_lines_copy` stores: a `rows x cols` box at column `col0` of `width`-column f32
/// tensors, through a fragment of `warps` warps; `ragged` bounds the box's rows (a mask).
struct LinesCase {
    rows: i64,
    cols: i64,
    col0: i64,
    width: i64,
    warps: u32,
    ragged: bool,
}

/// `o[box] = a[box]` with the store into `o` marked `.whole_lines()`. Returns `a`, the
/// simulated `o` and the lowered store line.
fn whole_lines_copy(c: &LinesCase) -> (Vec<f32>, Vec<f32>, String) {
    let k = KernelBuilder::new("lines", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::F32, false);
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    k.assume_extent(&k.dim("M"), c.rows, loc(2));
    k.assume_extent(&k.dim("N"), c.width, loc(2));
    k.launch(vec![Host::int(1)], 32 * c.warps, loc(2));
    let f = k.fragment("f", &[c.rows, c.cols], DType::F32, loc(3));
    let at = |t: &kda_dsl::builder::Tensor, l: u32| {
        k.tile_at(t, vec![Val::from(0), Val::from(c.col0)], &[c.rows, c.cols], loc(l))
    };
    k.copy(at(&a, 4), f, loc(4));
    let mut dst = at(&o, 5);
    if c.ragged {
        dst = k.bounded(dst, vec![Val::from(c.rows - 1), Val::from(c.width)], loc(5));
    }
    k.copy(f, k.whole_lines(dst, true, loc(5)), loc(5));
    let (_, prog) = kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers");
    let n = (c.rows * c.width) as usize;
    let input: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(input.iter().flat_map(|x| x.to_le_bytes()).collect())),
        ("M".to_string(), SimArg::I32(c.rows as i32)),
        ("N".to_string(), SimArg::I32(c.width as i32)),
        ("o".to_string(), SimArg::Tensor(vec![0; 4 * n])),
    ];
    run(&prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(out) = &args[3].1 else { unreachable!() };
    let out = out.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let line5 = line_ir(&prog, 5);
    (input, out, line5)
}

/// `input` where row `r < rows` and column `col0 <= j < col0 + cols`, else 0.
fn boxed(c: &LinesCase, input: &[f32], rows: i64) -> Vec<f32> {
    let w = c.width as usize;
    let inside = |i: usize| (i / w) < rows as usize && (c.col0..c.col0 + c.cols).contains(&((i % w) as i64));
    input.iter().enumerate().map(|(i, x)| if inside(i) { *x } else { 0.0 }).collect()
}

#[test]
fn whole_line_stores_write_the_same_bytes_four_lines_per_instruction() {
    let case = |rows, warps| LinesCase { rows, cols: 128, col0: 0, width: 128, warps, ragged: false };
    // One warp; two atoms per warp; warps along rows; warps along columns (2 and 4 column
    // groups per warp).
    for c in [case(16, 1), case(32, 1), case(64, 2), case(16, 2), case(16, 4)] {
        let (input, out, line5) = whole_lines_copy(&c);
        assert_eq!(out, input, "{} rows, {} warps", c.rows, c.warps);
        // As many 16-byte stores per lane as before (one per 4 of its values), each at a whole
        // line's offset from one of the lane's row addresses, after two exchanges per store.
        let stores: Vec<&str> = line5.lines().filter(|l| l.contains("st.global.v4.f32")).collect();
        assert_eq!(stores.len() as i64, c.rows * c.cols / 128 / c.warps as i64, "{line5}");
        for st in &stores {
            let off = st.split('+').nth(1).map_or(0, |o| o.split(']').next().unwrap().parse::<i64>().unwrap());
            assert_eq!(off % 128, 0, "{st}");
        }
        assert_eq!(line5.matches("shfl.sync.bfly.b32").count(), stores.len() * 2, "{line5}");
    }
    // A box that starts off a line still lands right (each store then spans two lines).
    let c = LinesCase { rows: 16, cols: 128, col0: 4, width: 136, warps: 1, ragged: false };
    let (input, out, line5) = whole_lines_copy(&c);
    assert!(line5.contains("shfl"), "{line5}");
    assert_eq!(out, boxed(&c, &input, 16));
    // Where the exchange cannot apply, the store is the usual one, and right: a masked box,
    // and three 16-column groups per warp row.
    for c in [
        LinesCase { rows: 16, cols: 128, col0: 0, width: 128, warps: 1, ragged: true },
        LinesCase { rows: 16, cols: 48, col0: 0, width: 48, warps: 1, ragged: false },
    ] {
        let (input, out, line5) = whole_lines_copy(&c);
        assert!(!line5.contains("shfl"), "{line5}");
        let rows = if c.ragged { c.rows - 1 } else { c.rows };
        assert_eq!(out, boxed(&c, &input, rows));
    }
}

/// A pipeline whose stage fill is element by element (bf16 elements two apart: no `cp.async`).
/// Iteration `c` fills `s` with column 0 of rows `16 c ..` of `a` `[T, 2]` and copies it to row
/// `c` of `o`.
fn strided_fill_pipeline() -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new("strided", loc(1));
    let a = k.tensor("a", &["T", "W"], DType::BF16, false);
    let o = k.tensor("o", &["C", "X"], DType::BF16, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16], DType::BF16, loc(3));
    let c = k.begin_for("c", LoopKind::pipelined(2), 0, k.dim("C"), loc(4));
    k.copy(k.tile(&a, vec![c.clone(), Val::from(0)], &[16, 1], loc(5)), s, loc(5));
    k.copy(s, k.tile(&o, vec![c, Val::from(0)], &[1, 16], loc(6)), loc(6));
    k.end();
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// In the steady state the fill's loads are issued with the stage's other fills, and its
/// shared stores wait for the end of the body (after the copy out), so no warp stalls on the
/// load before the body; the values are those of storing at once.
#[test]
fn an_element_fill_of_a_pipeline_stores_at_the_end_of_the_body() {
    let prog = strided_fill_pipeline();
    let text = dump(&prog);
    // The loop's body: from its top barrier to its back edge.
    let lines: Vec<&str> = text.lines().collect();
    let top = lines.iter().position(|l| l.contains("bar.sync")).expect("the loop's barrier");
    let back = top + lines[top..].iter().position(|l| l.trim_start().starts_with("bra")).expect("the back edge");
    let body = &lines[top..back];
    let load = body.iter().position(|l| l.contains("ld.global")).expect("the next stage's load");
    let out = body.iter().position(|l| l.contains("st.global")).expect("the copy out");
    let store = body.iter().rposition(|l| l.contains("st.shared")).expect("the deferred store");
    assert!(load < out && out < store, "load {load}, copy out {out}, shared store {store}:\n{}", body.join("\n"));
    // Values: row c of `o` is column 0 of rows 16 c .. 16 c + 16 of `a`.
    let (t, chunks) = (64usize, 4usize);
    let a: Vec<f32> = (0..t * 2).map(|i| i as f32).collect();
    let bf16 = |x: f32| ((x.to_bits() >> 16) as u16).to_le_bytes();
    let mut args = vec![
        ("T".to_string(), SimArg::I32(t as i32)),
        ("W".to_string(), SimArg::I32(2)),
        ("a".to_string(), SimArg::Tensor(a.iter().flat_map(|x| bf16(*x)).collect())),
        ("C".to_string(), SimArg::I32(chunks as i32)),
        ("X".to_string(), SimArg::I32(16)),
        ("o".to_string(), SimArg::Tensor(vec![0; chunks * 16 * 2])),
    ];
    run(&prog, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(o) = &args[5].1 else { unreachable!() };
    let got: Vec<f32> = o.chunks(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).collect();
    let want: Vec<f32> = (0..chunks * 16).map(|r| (2 * r) as f32).collect();
    assert_eq!(got, want);
}

/// `a · y` for `warps` warps, `a` [16, 64] bf16 in shared memory, into `o[0]` with `y`
/// [64, N] f32 as a fragment (`movmatrix`), `o[1]` with its transpose `yt` [N, 64] as a
/// fragment read `.t()` (packs only) and `o[2]` with `y` rounded to bf16 in shared memory;
/// the last two when `wide` (16 accumulator columns per warp, which they need).
fn b_from_registers(warps: u32, n: i64, wide: bool) -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new("b_regs", loc(1));
    let a = k.tensor("a", &["M", "K"], DType::BF16, false);
    let y = k.tensor("y", &["K", "N"], DType::F32, false);
    let yt = k.tensor("yt", &["N", "K"], DType::F32, false);
    let yb = k.tensor("yb", &["K", "N"], DType::BF16, false);
    let o = k.tensor("o", &["R", "M", "N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32 * warps, loc(2));
    let whole = |t: &kda_dsl::builder::Tensor, shape: &[i64], l: u32| {
        k.tile(t, vec![Val::from(0), Val::from(0)], shape, loc(l))
    };
    let a_sh = k.shared("a_sh", &[16, 64], DType::BF16, loc(3));
    k.copy(whole(&a, &[16, 64], 3), a_sh, loc(3));
    let yb_sh = k.shared("yb_sh", &[64, n], DType::BF16, loc(4));
    k.copy(whole(&yb, &[64, n], 4), yb_sh, loc(4));
    let yf = k.fragment("yf", &[64, n], DType::F32, loc(5));
    k.copy(whole(&y, &[64, n], 5), yf, loc(5));
    let out = |r: i64, c: &Tile, l: u32| {
        k.copy(c, k.tile(&o, vec![Val::from(r), Val::from(0), Val::from(0)], &[1, 16, n], loc(l)), loc(l))
    };
    let c1 = k.fragment("c1", &[16, n], DType::F32, loc(6));
    k.fill(&c1, 0.0, loc(6));
    k.gemm(a_sh, yf, &c1, loc(7));
    out(0, &c1, 7);
    if wide {
        let ytf = k.fragment("ytf", &[n, 64], DType::F32, loc(8));
        k.copy(whole(&yt, &[n, 64], 8), ytf, loc(8));
        let c2 = k.fragment("c2", &[16, n], DType::F32, loc(9));
        k.fill(&c2, 0.0, loc(9));
        k.gemm(a_sh, ytf.t(), &c2, loc(10));
        out(1, &c2, 10);
        let c3 = k.fragment("c3", &[16, n], DType::F32, loc(11));
        k.fill(&c3, 0.0, loc(11));
        k.gemm(a_sh, yb_sh, &c3, loc(12));
        out(2, &c3, 12);
    }
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// A gemm's right operand from registers (stored `[K, N]`, transposed by `movmatrix`, or
/// `[N, K]` read `.t()`, packed only) gives the bits of the same values from shared memory,
/// over 1, 2 and 4 warps splitting the accumulator's columns, 16 per warp; with 8 per warp
/// (which a shared right operand cannot take), on small integers whose products are exact,
/// the exact result.
#[test]
fn a_right_operand_from_registers_equals_the_shared_one() {
    let bf16_bits = |x: f32| -> u16 {
        let b = x.to_bits();
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    };
    let (kk, m) = (64usize, 16usize);
    for (warps, per_warp) in [(1u32, 16usize), (2, 16), (4, 16), (1, 8), (4, 8)] {
        let (n, wide) = (per_warp * warps as usize, per_warp == 16);
        let prog = b_from_registers(warps, n as i64, wide);
        let text = dump(&prog);
        assert!(text.contains("movmatrix.sync.aligned.m8n8.trans.b16"), "{text}");
        // Rounded to bf16 when wide; small integers (exact in every product and sum) when not.
        let val = |i: usize| match wide {
            true => ((i * 37 % 101) as f32 - 50.0) / 16.0 + (i % 7) as f32 / 3.0,
            false => ((i * 7 + i / 5) % 7) as f32 - 3.0,
        };
        let a_vals: Vec<f32> = (0..m * kk).map(|i| f32::from_bits((bf16_bits(val(i + 5)) as u32) << 16)).collect();
        let y: Vec<f32> = (0..kk * n).map(val).collect();
        let yt: Vec<f32> = (0..n * kk).map(|i| y[(i % kk) * n + i / kk]).collect();
        let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let mut args = vec![
            ("M".to_string(), SimArg::I32(m as i32)),
            ("K".to_string(), SimArg::I32(kk as i32)),
            ("a".to_string(), SimArg::Tensor(a_vals.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect())),
            ("N".to_string(), SimArg::I32(n as i32)),
            ("y".to_string(), SimArg::Tensor(f32s(&y))),
            ("yt".to_string(), SimArg::Tensor(f32s(&yt))),
            ("yb".to_string(), SimArg::Tensor(y.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect())),
            ("R".to_string(), SimArg::I32(3)),
            ("o".to_string(), SimArg::Tensor(vec![0; 3 * m * n * 4])),
        ];
        run(&prog, [1, 1, 1], &mut args).unwrap_or_else(|e| panic!("{warps} warps: {e}"));
        let SimArg::Tensor(o) = &args[8].1 else { unreachable!() };
        let got: Vec<u32> = o.chunks(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let regs = &got[..m * n];
        if wide {
            let shared = &got[2 * m * n..];
            assert_eq!(regs, shared, "{warps} warps: [K, N] from registers");
            assert_eq!(&got[m * n..2 * m * n], shared, "{warps} warps: [N, K] from registers");
            assert!(shared.iter().any(|b| *b != 0), "{warps} warps: the products were written");
        } else {
            let exact: Vec<u32> = (0..m * n)
                .map(|e| (0..kk).map(|x| a_vals[(e / n) * kk + x] * y[x * n + e % n]).sum::<f32>().to_bits())
                .collect();
            assert_eq!(regs, exact.as_slice(), "{warps} warps, 8 columns each: [K, N] from registers");
        }
    }
}

/// A right operand from registers beside a left one, or one whose columns do not split over the
/// block's warps, is refused at the gemm.
#[test]
fn a_right_operand_from_registers_says_what_it_needs() {
    let refusal = |warps: u32, a_in_registers: bool, m: i64, n: i64| {
        let k = KernelBuilder::new("bad", loc(1));
        k.launch(vec![Host::int(1)], 32 * warps, loc(2));
        let y = k.fragment("y", &[64, n], DType::F32, loc(3));
        k.fill(&y, 1.0, loc(3));
        let c = k.fragment("c", &[m, n], DType::F32, loc(4));
        k.fill(&c, 0.0, loc(4));
        if a_in_registers {
            let a = k.fragment("a", &[m, 64], DType::F32, loc(5));
            k.fill(&a, 1.0, loc(5));
            k.gemm(a, y, &c, loc(6));
        } else {
            let a = k.shared("a", &[m, 64], DType::BF16, loc(5));
            k.fill(&a, 1.0, loc(5));
            k.gemm(a, y, &c, loc(6));
        }
        let e = kda_dsl::lower_kernel(k.finish().expect("valid")).expect_err("refused");
        assert_eq!(e.loc.line, 6, "{e}");
        e.message
    };
    let both = refusal(1, true, 16, 16);
    assert!(both.contains("both fragments"), "{both}");
    // 32 x 8 fits two warps by rows, not by columns.
    let narrow = refusal(2, false, 32, 8);
    assert!(narrow.contains("must split their `n` axis over all 2 warps"), "{narrow}");
}

/// Each `gemm`'s plan, chosen before anything is emitted (`kda_dsl::lower::plans`): the
/// instruction, and each operand from `ldmatrix` (`.trans` when stored the other way round)
/// or from registers (`movmatrix` for a right operand stored `[K, N]`).
#[test]
fn every_gemm_is_planned_with_its_operands_sources() {
    let k = KernelBuilder::new("plans", loc(1));
    let a = k.tensor("a", &["M", "K"], DType::BF16, false);
    let y = k.tensor("y", &["K", "N"], DType::F32, false);
    let yb = k.tensor("yb", &["K", "N"], DType::BF16, false);
    let o = k.tensor("o", &["R", "M", "N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let whole = |t: &kda_dsl::builder::Tensor, shape: &[i64], l: u32| {
        k.tile(t, vec![Val::from(0), Val::from(0)], shape, loc(l))
    };
    let a_sh = k.shared("a_sh", &[16, 64], DType::BF16, loc(3));
    k.copy(whole(&a, &[16, 64], 3), a_sh, loc(3));
    let yb_sh = k.shared("yb_sh", &[64, 16], DType::BF16, loc(4));
    k.copy(whole(&yb, &[64, 16], 4), yb_sh, loc(4));
    let yf = k.fragment("yf", &[64, 16], DType::F32, loc(5));
    k.copy(whole(&y, &[64, 16], 5), yf, loc(5));
    for (r, right_from_registers) in [(0, false), (1, true)] {
        let c = k.fragment(&format!("c{r}"), &[16, 16], DType::F32, loc(6));
        k.fill(&c, 0.0, loc(6));
        if right_from_registers {
            k.gemm(a_sh, yf, &c, loc(7));
        } else {
            k.gemm(a_sh, yb_sh, &c, loc(7));
        }
        k.copy(c, k.tile(&o, vec![Val::from(r), Val::from(0), Val::from(0)], &[1, 16, 16], loc(8)), loc(8));
    }
    let plans = kda_dsl::lower::plans(k.finish().expect("valid"), kda_dsl::Target::Sm80).expect("lowers").gemms;
    let shown: Vec<String> = plans.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        shown,
        [
            "mma.sync.m16n8k16 BF16, k 64: a from ldmatrix, b from ldmatrix.trans",
            "mma.sync.m16n8k16 BF16, k 64: a from ldmatrix, b from registers + movmatrix",
        ]
    );
}

/// On sm_90a two independent products stay in flight together: each `wgmma` group is
/// committed without a wait (the first after a wait with nothing pending, for ptxas's sake),
/// the first read of the older accumulator waits for it alone
/// (`wait_group 1`, the newer kept in flight), the read of the newer one for the rest; the
/// simulator runs it (a read under a pending `wgmma` is an error there) and the sums are right.
#[test]
fn independent_wgmma_products_stay_in_flight_together() {
    let k = KernelBuilder::new("two", loc(1));
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 128, loc(2));
    let a = k.shared("a", &[64, 64], DType::BF16, loc(3));
    let b1 = k.shared("b1", &[16, 64], DType::BF16, loc(4));
    let b2 = k.shared("b2", &[16, 64], DType::BF16, loc(4));
    let (c1, c2) = (k.fragment("c1", &[64, 16], DType::F32, loc(5)), k.fragment("c2", &[64, 16], DType::F32, loc(5)));
    k.fill(&a, 1.0, loc(6));
    k.fill(&b1, 1.0, loc(6));
    k.fill(&b2, 2.0, loc(6));
    k.fill(&c1, 0.0, loc(6));
    k.fill(&c2, 0.0, loc(6));
    k.gemm(a, b1.t(), &c1, loc(7));
    k.gemm(a, b2.t(), &c2, loc(8));
    k.copy(c1, k.tile(&o, vec![Val::from(0), Val::from(0)], &[64, 16], loc(9)), loc(9));
    // Tile coordinates: the second 16 columns.
    k.copy(c2, k.tile(&o, vec![Val::from(0), Val::from(1)], &[64, 16], loc(10)), loc(10));
    let (_, prog) = kda_dsl::lower_kernel_for(k.finish().expect("valid"), kda_dsl::Target::Sm90a).expect("lowers");
    let ir = dump(&prog);
    let at = |what: &str| ir.find(what).unwrap_or_else(|| panic!("no `{what}` in:\n{ir}"));
    let (first_read, second_read) = (ir.find("// 9").expect("line 9"), ir.find("// 10").expect("line 10"));
    // A wait with nothing pending before the first product (for ptxas), then the two retiring.
    let waits: Vec<&str> = ir.lines().filter(|l| l.contains("wgmma.wait_group")).collect();
    assert_eq!(waits.len(), 3, "{ir}");
    let keeps = waits.iter().map(|w| w.contains("aligned 0")).collect::<Vec<_>>();
    assert_eq!(keeps, [true, false, true], "{ir}");
    assert!(at("wait_group.sync.aligned 0") < at("commit_group"), "{ir}");
    let (one, last_zero) = (at("wait_group.sync.aligned 1"), ir.rfind("wait_group.sync.aligned 0").expect("a wait"));
    assert!(ir.matches("wgmma.commit_group").count() == 2 && one > ir.rfind("commit_group").expect("commits"));
    assert!(one < first_read && first_read < last_zero && last_zero < second_read, "{ir}");
    let mut args = vec![
        ("o".to_string(), SimArg::Tensor(vec![0; 64 * 32 * 4])),
        ("M".into(), SimArg::I32(64)),
        ("N".into(), SimArg::I32(32)),
    ];
    run(&prog, [1, 1, 1], &mut args).expect("runs without a read under a pending wgmma");
    let SimArg::Tensor(bytes) = &args[0].1 else { panic!("a tensor") };
    let got: Vec<f32> = bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert!(
        got.chunks(32).all(|row| row[..16].iter().all(|v| *v == 64.0) && row[16..].iter().all(|v| *v == 128.0)),
        "{:?}",
        &got[..40]
    );
}

/// A kernel of 32 threads whose `parallel` body over a 16 x 16 shared tile `d` (8 elements a
/// thread) is written by `body` at line 8, after `s` is loaded from `a`; `d` goes to `o`.
fn shared_body(body: impl Fn(&KernelBuilder, &Tile, &Tile, &[Val])) -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new("k", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::F32, false);
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    k.launch(vec![Host::int(1)], 32, loc(2));
    let s = k.shared("s", &[16, 16], DType::F32, loc(3));
    let d = k.shared("d", &[16, 16], DType::F32, loc(4));
    k.copy(k.tile(&a, vec![Val::from(0), Val::from(0)], &[16, 16], loc(5)), s, loc(5));
    k.fill(&d, 1.0, loc(6));
    let ij = k.begin_parallel(&d, &["i", "j"], loc(7));
    body(&k, &s, &d, &ij);
    k.end();
    k.copy(d, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 16], loc(9)), loc(9));
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// Positions of the shared loads and stores among line 8's instructions.
fn loads_and_stores(p: &kda_dsl::thread_ir::ThreadProgram) -> (Vec<usize>, Vec<usize>) {
    let ir = line_ir(p, 8);
    let at = |what: &str| ir.lines().enumerate().filter(|(_, l)| l.contains(what)).map(|(i, _)| i).collect();
    (at("ld.shared"), at("st.shared"))
}

/// `o` after running `p` (from [`shared_body`]) on `a[i] = i - 100`, and `a`.
fn run_shared_body(p: &kda_dsl::thread_ir::ThreadProgram) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..256).map(|i| i as f32 - 100.0).collect();
    let mut args = vec![
        ("a".to_string(), SimArg::Tensor(x.iter().flat_map(|v| v.to_le_bytes()).collect())),
        ("o".to_string(), SimArg::Tensor(vec![0; 256 * 4])),
        ("M".to_string(), SimArg::I32(16)),
        ("N".to_string(), SimArg::I32(16)),
    ];
    run(p, [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(out) = &args[1].1 else { unreachable!() };
    (out.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(), x)
}

/// A thread's elements of a `parallel` body load before any of them stores (the assembler
/// cannot move a shared load above a shared store), and compute what they did.
#[test]
fn a_parallel_bodys_shared_stores_wait_for_its_last_element() {
    let p = shared_body(|k, s, d, ij| {
        k.store(d, ij.to_vec(), Val::bin(BinOp::Mul, k.elem(s, ij.to_vec(), loc(8)), Val::from(2.0)), loc(8));
    });
    let (loads, stores) = loads_and_stores(&p);
    assert_eq!((loads.len(), stores.len()), (8, 8), "{}", line_ir(&p, 8));
    assert!(loads.iter().max() < stores.iter().min(), "{}", line_ir(&p, 8));
    let (got, x) = run_shared_body(&p);
    assert_eq!(got, x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
}

/// A held store keeps the value its element gave it: a variable that every element assigns
/// again, under a run-time condition too, is stored as each element left it.
#[test]
fn a_held_store_keeps_its_elements_value() {
    let p = shared_body(|k, s, d, ij| {
        let t = k.let_var("t", k.elem(s, ij.to_vec(), loc(8)), loc(8));
        k.begin_if(Val::bin(BinOp::Lt, ij[0].clone(), Val::from(3)), loc(8));
        k.assign(&t, Val::bin(BinOp::Mul, t.clone(), Val::from(3.0)), loc(8));
        k.end();
        k.store(d, ij.to_vec(), t, loc(8));
    });
    let (loads, stores) = loads_and_stores(&p);
    assert!(loads.iter().max() < stores.iter().min(), "{}", line_ir(&p, 8));
    let (got, x) = run_shared_body(&p);
    let want: Vec<f32> = x.iter().enumerate().map(|(e, v)| if e / 16 < 3 { v * 3.0 } else { *v }).collect();
    assert_eq!(got, want);
}

/// A body that reads the tile it stores, or stores it under a condition, keeps each store in
/// its element.
#[test]
fn a_parallel_bodys_stores_stay_where_the_body_reads_the_tile_or_branches() {
    let reads_itself = shared_body(|k, s, d, ij| {
        let sum = Val::bin(BinOp::Add, k.elem(d, ij.to_vec(), loc(8)), k.elem(s, ij.to_vec(), loc(8)));
        k.store(d, ij.to_vec(), sum, loc(8));
    });
    let under_if = shared_body(|k, s, d, ij| {
        k.begin_if(Val::bin(BinOp::Lt, ij[0].clone(), Val::from(3)), loc(8));
        k.store(d, ij.to_vec(), k.elem(s, ij.to_vec(), loc(8)), loc(8));
        k.end();
    });
    for p in [reads_itself, under_if] {
        let (loads, stores) = loads_and_stores(&p);
        assert_eq!(stores.len(), 8, "{}", line_ir(&p, 8));
        assert!(stores.iter().min() < loads.iter().max(), "{}", line_ir(&p, 8));
    }
}

/// Copies `a` to `o` (f32 `[M, 16]`) through a shared tile, one 16-row tile an iteration of a
/// `serial` loop over `N` tiles from the block's, with `hoist`.
fn row_blocks(hoist: kda_dsl::Hoist) -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new("rows", loc(1));
    let a = k.tensor("a", &["M", "C"], DType::F32, false);
    let o = k.tensor("o", &["M", "C"], DType::F32, true);
    let b = k.launch(vec![Host::int(1)], 32, loc(2));
    k.hoist(hoist);
    k.assume_extent(&k.dim("C"), 16, loc(2));
    let s = k.shared("s", &[16, 16], DType::F32, loc(3));
    let i = k.begin_for("i", LoopKind::Serial, 0, k.dim("N"), loc(4));
    let row = k.let_var("row", Val::bin(BinOp::Add, b[0].clone(), i), loc(5));
    k.copy(k.tile(&a, vec![row.clone(), Val::from(0)], &[16, 16], loc(6)), s, loc(6));
    k.copy(s, k.tile(&o, vec![row, Val::from(0)], &[16, 16], loc(7)), loc(7));
    k.end();
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// Instructions between the loop's label and its branch back.
fn loop_length(p: &kda_dsl::thread_ir::ThreadProgram) -> usize {
    use kda_dsl::thread_ir::Op;
    let back = p.body.iter().rposition(|i| matches!(i.op, Op::Bra { .. })).expect("a loop");
    let Op::Bra { target } = p.body[back].op else { unreachable!() };
    let top = p.body.iter().position(|i| i.op == Op::Label(target)).expect("its label");
    back - top - 1
}

#[test]
fn hoisting_moves_loop_invariant_addresses_out_and_keeps_the_values() {
    let a: Vec<f32> = (0..48 * 16).map(|x| x as f32 * 0.5 - 7.0).collect();
    let run_rows = |p: &kda_dsl::thread_ir::ThreadProgram| {
        let mut args = vec![
            ("a".to_string(), SimArg::Tensor(a.iter().flat_map(|x| x.to_le_bytes()).collect())),
            ("M".to_string(), SimArg::I32(48)),
            ("C".to_string(), SimArg::I32(16)),
            ("o".to_string(), SimArg::Tensor(vec![0; 48 * 16 * 4])),
            ("N".to_string(), SimArg::I32(3)),
        ];
        run(p, [1, 1, 1], &mut args).expect("runs");
        let SimArg::Tensor(o) = &args[3].1 else { unreachable!() };
        o.clone()
    };
    let plain = row_blocks(kda_dsl::Hoist::Nothing);
    let expected = run_rows(&plain);
    assert_eq!(expected, a.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let mut lengths = vec![loop_length(&plain)];
    for hoist in [kda_dsl::Hoist::BlockUniform, kda_dsl::Hoist::Everything] {
        let p = row_blocks(hoist);
        assert_eq!(run_rows(&p), expected, "{hoist:?}");
        lengths.push(loop_length(&p));
    }
    // The boxes' starts leave the loop first (block-uniform), then the threads' own offsets.
    assert!(lengths[0] > lengths[1] && lengths[1] > lengths[2], "{lengths:?}");
}

/// The bits of `x` as `dt` (bf16 or f16; `x` a multiple of 1/4 below 16, exact in both).
fn half_bits(x: f32, dt: DType) -> u16 {
    match dt {
        DType::BF16 => (x.to_bits() >> 16) as u16,
        _ => {
            let (sign, a) = (if x < 0.0 { 0x8000 } else { 0 }, x.abs());
            if a == 0.0 {
                return sign;
            }
            let e = a.log2().floor() as i32;
            let mant = ((a / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
            sign | (((e + 15) as u16) << 10) | mant
        }
    }
}

/// A kernel of `warps` warps whose `parallel` over a `[rows, cols]` accumulator fragment `f`
/// (a `gemm`'s, so laid out as `mma.sync`'s) reads the 16-bit tiles `vt` `[cols, rows]`
/// transposed and `vd` `[rows, cols]` at its index, `f[i][j] = 2 vt[j][i] + vd[i][j]`, and
/// stores `f` transposed into the 16-bit tile `ot` (`ot[j][i] = f[i][j] + 0.5`); `o` gets `f`
/// and `ot` gets `ot`. Returns the lowered program.
fn matrix_access_kernel(rows: i64, cols: i64, warps: i64, dt: DType) -> kda_dsl::thread_ir::ThreadProgram {
    let k = KernelBuilder::new("blocks", loc(1));
    let a = k.tensor("a", &["C", "R"], dt, false);
    let b = k.tensor("b", &["R", "C"], dt, false);
    let o = k.tensor("o", &["R", "C"], DType::F32, true);
    let ot_out = k.tensor("ot_out", &["C", "R"], dt, true);
    k.launch(vec![Host::int(1)], 32 * warps, loc(2));
    let f = k.fragment("f", &[rows, cols], DType::F32, loc(3));
    let vt = k.shared("vt", &[cols, rows], dt, loc(3));
    let vd = k.shared("vd", &[rows, cols], dt, loc(3));
    let ot = k.shared("ot", &[cols, rows], dt, loc(3));
    let z1 = k.shared("z1", &[rows, 16], dt, loc(3));
    let z2 = k.shared("z2", &[16, cols], dt, loc(3));
    let zero = || vec![Val::from(0), Val::from(0)];
    k.copy(k.tile(&a, zero(), &[cols, rows], loc(4)), vt, loc(4));
    k.copy(k.tile(&b, zero(), &[rows, cols], loc(4)), vd, loc(4));
    k.fill(&z1, 0.0, loc(4));
    k.fill(&z2, 0.0, loc(4));
    k.fill(&f, 0.0, loc(4));
    k.gemm(z1, z2, &f, loc(4));
    let ij = k.begin_parallel(&f, &["i", "j"], loc(5));
    let ji = vec![ij[1].clone(), ij[0].clone()];
    let twice = Val::bin(BinOp::Mul, k.elem(&vt, ji.clone(), loc(6)), Val::from(2.0));
    k.store(&f, ij.clone(), Val::bin(BinOp::Add, twice, k.elem(&vd, ij.clone(), loc(6))), loc(6));
    k.store(&ot, ji, Val::bin(BinOp::Add, k.elem(&f, ij.clone(), loc(7)), Val::from(0.5)), loc(7));
    k.end();
    k.copy(f, k.tile(&o, zero(), &[rows, cols], loc(8)), loc(8));
    k.copy(ot, k.tile(&ot_out, zero(), &[cols, rows], loc(8)), loc(8));
    kda_dsl::lower_kernel(k.finish().expect("valid")).expect("lowers").1
}

/// A `parallel` over an `mma.sync` accumulator reads 16-bit shared tiles at its index and
/// transposed by `ldmatrix`, and stores one transposed by `movmatrix` and 4-byte stores,
/// giving every element where per-element accesses would (the simulator against the host), for
/// each way the blocks group into instructions: two atoms side by side (`[32, 16]` on 2
/// warps), one above the other (`[64, 8]` on 2 warps), one atom an instruction (`[16, 24]` on
/// 1 warp: 3 atoms a row), in bf16 and f16.
#[test]
fn accumulator_loops_move_16_bit_tiles_in_8_by_8_blocks() {
    for (rows, cols, warps) in [(32, 16, 2), (64, 8, 2), (16, 24, 1)] {
        for dt in [DType::BF16, DType::F16] {
            let prog = matrix_access_kernel(rows, cols, warps, dt);
            let ir = line_ir(&prog, 5) + &line_ir(&prog, 6) + &line_ir(&prog, 7);
            let (r, c) = (rows as usize, cols as usize);
            assert!(ir.contains("ldmatrix.sync.aligned.m8n8.x") && ir.contains(".trans.shared.b16"), "{ir}");
            assert_eq!(
                ir.matches("movmatrix.sync.aligned.m8n8.trans.b16").count(),
                r * c / 64 / warps as usize,
                "{ir}"
            );
            assert!(!ir.contains("ld.shared.b16") && !ir.contains("st.shared.b16"), "{ir}");
            // Multiples of 1/4 below 4, so that every value here is exact in both types.
            let av: Vec<f32> = (0..r * c).map(|e| ((e * 37 % 31) as f32 - 15.0) / 4.0).collect();
            let bv: Vec<f32> = (0..r * c).map(|e| ((e * 91 % 29) as f32 - 14.0) / 4.0).collect();
            let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| half_bits(*x, dt).to_le_bytes()).collect() };
            let mut args = vec![
                ("a".to_string(), SimArg::Tensor(bytes(&av))),
                ("C".to_string(), SimArg::I32(cols as i32)),
                ("R".to_string(), SimArg::I32(rows as i32)),
                ("b".to_string(), SimArg::Tensor(bytes(&bv))),
                ("o".to_string(), SimArg::Tensor(vec![0; 4 * r * c])),
                ("ot_out".to_string(), SimArg::Tensor(vec![0; 2 * r * c])),
            ];
            run(&prog, [1, 1, 1], &mut args).expect("runs");
            let SimArg::Tensor(o) = &args[4].1 else { unreachable!() };
            let SimArg::Tensor(ot) = &args[5].1 else { unreachable!() };
            for i in 0..r {
                for j in 0..c {
                    let want = 2.0 * av[j * r + i] + bv[i * c + j];
                    let got = f32::from_le_bytes(o[4 * (i * c + j)..4 * (i * c + j) + 4].try_into().expect("4 bytes"));
                    assert_eq!(got, want, "{rows}x{cols} {dt:?}: f[{i}][{j}]");
                    let stored = u16::from_le_bytes([ot[2 * (j * r + i)], ot[2 * (j * r + i) + 1]]);
                    assert_eq!(stored, half_bits(want + 0.5, dt), "{rows}x{cols} {dt:?}: ot[{j}][{i}]");
                }
            }
        }
    }
}
