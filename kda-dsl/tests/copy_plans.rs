//! The plan each copy gets ([`CopyKind`]) and why a faster one was not possible
//! ([`NoFastPath`]), decided before emission and asserted here on small kernels.

use kda_dsl::builder::*;
use kda_dsl::lower::copy_plan::{copy_plans, CopyKind, NoFastPath};
use kda_dsl::{DType, SrcLoc};

fn loc(line: u32) -> SrcLoc {
    SrcLoc::new("k.rs", line, 5)
}

/// A kernel copying a `[16, cols]` box of `a` (dtype `dt`, extents `[M, N]`) into a shared
/// tile of `tile_dt` and back out to `o`, with `N` assumed a multiple of `n_multiple`.
fn through_shared(
    cols: i64,
    dt: DType,
    tile_dt: DType,
    n_multiple: Option<u32>,
) -> Vec<(u32, CopyKind, Option<NoFastPath>)> {
    let k = KernelBuilder::new("copy", loc(1));
    let a = k.tensor("a", &["M", "N"], dt, false);
    let o = k.tensor("o", &["M", "N"], tile_dt, true);
    let b = k.launch(vec![Host::int(1)], 128, loc(2));
    if let Some(m) = n_multiple {
        k.assume_multiple(&k.dim("N"), m, loc(2));
    }
    let s = k.shared("s", &[16, cols], tile_dt, loc(3));
    k.copy(k.tile(&a, vec![b[0].clone(), Val::from(0)], &[16, cols], loc(4)), s, loc(4));
    k.copy(s, k.tile(&o, vec![b[0].clone(), Val::from(0)], &[16, cols], loc(5)), loc(5));
    let plans = copy_plans(k.finish().expect("valid")).expect("lowers");
    plans.into_iter().map(|p| (p.loc.line, p.kind, p.slower_because)).collect()
}

#[test]
fn aligned_boxes_take_vectors_both_ways() {
    let plans = through_shared(64, DType::BF16, DType::BF16, Some(8));
    assert_eq!(plans, vec![(4, CopyKind::AsyncVectors, None), (5, CopyKind::VectorStores, None)]);
}

#[test]
fn an_unknown_row_length_falls_back_to_elements_and_says_so() {
    let plans = through_shared(64, DType::BF16, DType::BF16, None);
    assert_eq!(plans[0], (4, CopyKind::Elements, Some(NoFastPath::RowLengthNotAligned { of: 8 })));
    assert_eq!(plans[1].1, CopyKind::Elements);
}

#[test]
fn odd_columns_and_converting_copies_are_element_copies() {
    let odd = through_shared(12, DType::BF16, DType::BF16, Some(8));
    assert_eq!(odd[0], (4, CopyKind::Elements, Some(NoFastPath::ColumnsNotMultiple { cols: 12, of: 8 })));
    let converting = through_shared(64, DType::BF16, DType::F32, Some(8));
    let differ = NoFastPath::DtypesDiffer { tensor: DType::BF16, tile: DType::F32 };
    assert_eq!(converting[0], (4, CopyKind::Elements, Some(differ)));
}

/// A fragment copy of a `[64, 64]` f32 box, with `N` assumed a multiple of `n_multiple`.
fn fragment_copies(n_multiple: Option<u32>) -> Vec<(CopyKind, Option<NoFastPath>)> {
    let k = KernelBuilder::new("frag", loc(1));
    let a = k.tensor("a", &["M", "N"], DType::F32, false);
    let o = k.tensor("o", &["M", "N"], DType::F32, true);
    let b = k.launch(vec![Host::int(1)], 128, loc(2));
    if let Some(m) = n_multiple {
        k.assume_multiple(&k.dim("N"), m, loc(2));
    }
    let f = k.fragment("f", &[64, 64], DType::F32, loc(3));
    k.copy(k.tile(&a, vec![b[0].clone(), Val::from(0)], &[64, 64], loc(4)), f, loc(4));
    k.copy(f, k.tile(&o, vec![b[0].clone(), Val::from(0)], &[64, 64], loc(5)), loc(5));
    let plans = copy_plans(k.finish().expect("valid")).expect("lowers");
    plans.into_iter().map(|p| (p.kind, p.slower_because)).collect()
}

#[test]
fn fragment_copies_name_their_access_width_and_what_narrows_it() {
    let aligned = fragment_copies(Some(4));
    assert_eq!(aligned, vec![(CopyKind::FragmentRuns { elems: 4 }, None); 2]);
    let unaligned = fragment_copies(None);
    let narrowed =
        NoFastPath::NarrowRuns { run: 1, widest: 4, limit: Some(Box::new(NoFastPath::RowLengthNotAligned { of: 2 })) };
    assert_eq!(unaligned[0], (CopyKind::FragmentRuns { elems: 1 }, Some(narrowed.clone())));
    // The message a kernel author reads under KDA_DUMP=copy_plan.
    assert_eq!(
        narrowed.to_string(),
        "1 adjacent elements per access, not 4: the row length is not known to be a multiple of 2 (add `assume_multiple`)"
    );
}
