//! Whether a pipeline's stage fill is copied by TMA (`cp.async.bulk.tensor` boxes completing on
//! an mbarrier) or by `cp.async`, with the reason when not ([`NoTma`]). One function decides
//! ([`choose_tma`]); `plan_pipelines` asks it for every fill of a loop and takes TMA when every
//! fill can, and the lowering emits whatever the plan says.
//!
//! A box lands in shared memory as the hardware lays it out: rows one after the other, each row
//! one swizzle line (32, 64 or 128 bytes) permuted by the swizzle. That is a canonical tile's
//! layout ([`SharedLayout::canonical`], the layout `wgmma` operands get), one box per slab. The
//! tensor has 1 to 5 axes: the tile's columns run along its contiguous (last) axis and its rows
//! along one other, the box 1 wide on the rest (a `[1, 16, 1, 128]` box of a `[B, T, H, K]`
//! tensor fills a `[16, 128]` tile). The tensor map describes the whole tensor, so zero fill
//! happens only at its edges: a fill with an explicit bound (a varlen sequence's end inside the
//! tensor) keeps `cp.async`, which masks.

use std::fmt;

use crate::analysis::divisibility::{expr_divisor, var_divisors};
use crate::dtype::DType;
use crate::hopper_layout::Swizzle;
use crate::layout::{ChunkXor, SharedLayout};
use crate::passes::{BufLayout, TileProgram};
use crate::target::Target;
use crate::tensor_map::{TensorMap, MAX_TENSOR_MAP_RANK};
use crate::tile::*;

/// A tensor map parameter as the compiler declares it: which tensor it maps, the box, and the
/// swizzle. The runtime and the simulator both make the [`TensorMap`] from it ([`Self::map`])
/// with the tensor's extents at the call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSig {
    /// The parameter's name: the tensor's, then `$map` and a number (a `$` no kernel
    /// parameter of the source has).
    pub name: String,
    /// The tensor parameter it maps (1 to 5 axes, packed).
    pub tensor: String,
    /// The tensor's extents as named in its signature, one per axis, the inner (contiguous)
    /// axis first: a `Dim` symbol or a literal.
    pub extents: Vec<String>,
    /// Bytes per element.
    pub elem_bytes: u32,
    /// The box in elements per axis, inner first.
    pub box_extent: Vec<u32>,
    /// The box's swizzle in shared memory.
    pub swizzle: Swizzle,
}

impl TensorMapSig {
    /// The map over the packed tensor of these extents (inner first, one per axis); `None`
    /// when they are not one per axis of the signature.
    pub fn map(&self, extent: &[u64]) -> Option<TensorMap> {
        TensorMap::packed(self.elem_bytes, extent, &self.box_extent, self.swizzle)
    }

    /// Bytes one box fills in shared memory.
    pub fn box_bytes(&self) -> u32 {
        self.box_extent.iter().product::<u32>() * self.elem_bytes
    }

    /// The box's extents as `inner x ... x outer`, for dumps.
    pub fn box_text(&self) -> String {
        self.box_extent.iter().map(u32::to_string).collect::<Vec<_>>().join("x")
    }
}

/// One stage fill copied by TMA: the map, and how many boxes (one per slab of the tile).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaBoxes {
    /// The map the boxes are copied through (its `name` left for the program to assign).
    pub map: TensorMapSig,
    /// Boxes per fill: the tile's slabs, side by side along the inner axis.
    pub boxes: u32,
}

impl TmaBoxes {
    /// Shared bytes from one box's destination to the next (one slab).
    pub fn box_bytes(&self) -> u32 {
        self.map.box_bytes()
    }
}

/// Why a stage fill is not copied by TMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoTma {
    /// The target has no TMA (sm_90a only here).
    Target(Target),
    /// The pipeline has no stage fills.
    NoFills,
    /// The tensor has more axes than a tensor map (5).
    Rank(usize),
    /// The tile's columns do not run along the tensor's contiguous (last) axis.
    ColumnsNotContiguous,
    /// The box has an explicit bound: TMA zero-fills only at the tensor's edges.
    Bounded,
    /// The tensor's and the tile's element types differ.
    DtypesDiffer {
        /// The tensor's.
        tensor: DType,
        /// The tile's.
        tile: DType,
    },
    /// The tile is not laid out as boxes land (a canonical swizzled tile).
    NotCanonical,
    /// The tile is not 2-D.
    TileRank(usize),
    /// The box is taller than TMA's 256 rows.
    TooTall(u32),
    /// The row length is not known to be a multiple of 16 bytes (a tensor map's stride must).
    RowLengthNotAligned,
    /// The box's first column is not known to be a multiple of 16 bytes into its row.
    StartNotAligned,
    /// Another fill of the same pipeline cannot take TMA (its barriers serve every fill).
    AnotherFill(Box<NoTma>),
    /// Fill warps run the loop's producer block: they issue its fills as `cp.async` copies,
    /// wait for them themselves and hand the stage over with the block's results.
    ProducerRing,
}

impl fmt::Display for NoTma {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoTma::Target(t) => write!(f, "target {t} has no TMA (sm_90a)"),
            NoTma::NoFills => write!(f, "no stage fills"),
            NoTma::Rank(r) => write!(f, "the tensor has {r} axes; a tensor map has at most {MAX_TENSOR_MAP_RANK}"),
            NoTma::ColumnsNotContiguous => {
                write!(f, "the tile's columns do not run along the tensor's contiguous (last) axis")
            }
            NoTma::Bounded => write!(f, "the box has its own bound (TMA zero-fills only at the tensor's edges)"),
            NoTma::DtypesDiffer { tensor, tile } => write!(f, "the tensor is {tensor} and the tile {tile}"),
            NoTma::NotCanonical => write!(f, "the tile is not a canonical swizzled tile"),
            NoTma::TileRank(r) => write!(f, "the tile has {r} axes, not 2"),
            NoTma::TooTall(rows) => write!(f, "{rows} rows; a box has at most 256"),
            NoTma::RowLengthNotAligned => {
                write!(f, "the row length is not known to be a multiple of 16 bytes (add `assume_multiple`)")
            }
            NoTma::StartNotAligned => write!(f, "the box's first column is not known to be 16-byte aligned"),
            NoTma::AnotherFill(why) => write!(f, "another fill of the loop: {why}"),
            NoTma::ProducerRing => {
                write!(f, "the fill warps run the loop's producer block and wait for their own copies")
            }
        }
    }
}

/// How `fill` (a stage fill: a copy from a global box into a shared tile) is copied by TMA on
/// `p`'s target, or why it is not.
pub fn choose_tma(p: &TileProgram, fill: &Stmt) -> Result<TmaBoxes, NoTma> {
    let StmtKind::Copy { src: region, dst: Region::Buf(b) } = &fill.kind else {
        unreachable!("a stage fill copies a global box into a shared tile")
    };
    tma_boxes(p, region, *b)
}

/// How `store` (a copy from a shared tile to a global box) is copied by a TMA bulk store on
/// `p`'s target, or why it is not.
pub fn choose_tma_store(p: &TileProgram, store: &Stmt) -> Result<TmaBoxes, NoTma> {
    let StmtKind::Copy { src: Region::Buf(b), dst: region } = &store.kind else {
        unreachable!("a store copies a shared tile into a global box")
    };
    tma_boxes(p, region, *b)
}

/// Whether the copy between shared tile `b` and the global box `region` would take TMA if
/// the tile were laid out canonically (what `infer_layouts` asks before it lays tiles out).
pub fn takes_tma_once_canonical(p: &TileProgram, region: &Region, b: BufId) -> bool {
    let tile = &p.def.buffers[b];
    let [rows, cols] = tile.shape[..] else { return false };
    let elem = tile.dtype.size_bytes() as u32;
    box_rules(p, region, b).is_ok() && SharedLayout::canonical(rows, cols, elem).is_some()
}

/// The rules of a TMA box between `region` and tile `b` that do not depend on the tile's
/// layout: the tensor's name, its axes (outer first, as declared), the element bytes and the
/// axis the tile's rows run along (none for a tile of one row).
fn box_rules(p: &TileProgram, region: &Region, b: BufId) -> Result<BoxAxes, NoTma> {
    if !p.target.has(Target::Sm90a) {
        return Err(NoTma::Target(p.target));
    }
    let Region::Global { tensor, offset, shape, bound, .. } = region else { unreachable!("a global box") };
    let Param::Tensor { name, dtype, dims, .. } = &p.def.params[*tensor] else { unreachable!("a tensor") };
    if dims.len() > MAX_TENSOR_MAP_RANK {
        return Err(NoTma::Rank(dims.len()));
    }
    if bound.is_some() {
        return Err(NoTma::Bounded);
    }
    let tile = &p.def.buffers[b];
    if tile.dtype != *dtype {
        return Err(NoTma::DtypesDiffer { tensor: *dtype, tile: tile.dtype });
    }
    let elem = dtype.size_bytes() as u32;
    let [rows, cols] = tile.shape[..] else { return Err(NoTma::TileRank(tile.shape.len())) };
    if rows > 256 {
        return Err(NoTma::TooTall(rows));
    }
    // The copy's own rule: the box's axes longer than 1 are the tile's (in order).
    let last = dims.len() - 1;
    let long: Vec<usize> = (0..last).filter(|a| shape[*a] > 1).collect();
    let row_axis = long.first().copied();
    if long.len() > 1 || shape[last] != cols || row_axis.map_or(1, |a| shape[a]) != rows {
        return Err(NoTma::ColumnsNotContiguous);
    }
    let granule = u64::from(16 / elem);
    if !(p.def.multiple_of(dims[last]) as u64).is_multiple_of(granule) {
        return Err(NoTma::RowLengthNotAligned);
    }
    let divisors = var_divisors(&p.def);
    let var = |v: VarId| divisors.get(&v).copied().unwrap_or(1);
    let start = expr_divisor(&offset[last], &var, &|d| p.def.multiple_of(d) as u64);
    if !start.is_multiple_of(granule) {
        return Err(NoTma::StartNotAligned);
    }
    Ok(BoxAxes { tensor: name.clone(), dims: dims.clone(), elem, row_axis })
}

/// What [`box_rules`] found of a box that may take TMA.
struct BoxAxes {
    tensor: String,
    /// The tensor's axes, outer first.
    dims: Vec<ParamId>,
    elem: u32,
    /// The axis the tile's rows run along, if it has more than one.
    row_axis: Option<usize>,
}

/// The boxes of a copy between the global box `region` and shared tile `b`, or why not TMA.
fn tma_boxes(p: &TileProgram, region: &Region, b: BufId) -> Result<TmaBoxes, NoTma> {
    let BoxAxes { tensor, dims, elem, row_axis } = box_rules(p, region, b)?;
    let BufLayout::Shared(SharedLayout::Swizzled { rows, cols, xor: ChunkXor::Plain, slab, .. }) = p.layouts[b] else {
        return Err(NoTma::NotCanonical);
    };
    let swizzle = match slab * elem {
        32 => Swizzle::B32,
        64 => Swizzle::B64,
        128 => Swizzle::B128,
        _ => return Err(NoTma::NotCanonical),
    };
    let extent = |d: ParamId| match p.def.exact_extent(d) {
        Some(v) => v.to_string(),
        None => p.def.params[d].name().to_string(),
    };
    // Inner first, as the hardware numbers the axes: one slab wide, the tile's rows along
    // their axis, 1 on the others.
    let last = dims.len() - 1;
    let box_extent = (0..=last)
        .rev()
        .map(|a| match a {
            _ if a == last => slab,
            _ if Some(a) == row_axis => rows,
            _ => 1,
        })
        .collect();
    Ok(TmaBoxes {
        map: TensorMapSig {
            name: String::new(),
            tensor,
            extents: dims.iter().rev().map(|d| extent(*d)).collect(),
            elem_bytes: elem,
            box_extent,
            swizzle,
        },
        boxes: cols / slab,
    })
}

/// The index of `map` (named or not) in `maps`, adding it, named after its tensor, if new.
pub fn register_map(maps: &mut Vec<TensorMapSig>, map: &TensorMapSig) -> usize {
    let unnamed = |m: &TensorMapSig| TensorMapSig { name: String::new(), ..m.clone() };
    let key = unnamed(map);
    if let Some(i) = maps.iter().position(|m| unnamed(m) == key) {
        return i;
    }
    let same_tensor = maps.iter().filter(|m| m.tensor == map.tensor).count();
    maps.push(TensorMapSig { name: format!("{}$map{same_tensor}", map.tensor), ..key });
    maps.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::*;
    use crate::passes::testing::loc;

    /// A `[64, 128]` tile multiplied by `wgmma` on sm_90a (so canonical), filled from `a`
    /// (`[M, K]`, K a multiple of `k_multiple`) at column `col`.
    fn fill_of(target: Target, k_multiple: u32, col: Val, bounded: bool) -> Result<TmaBoxes, NoTma> {
        fill_from(target, &["M", "K"], k_multiple, |i| (vec![i, col.clone()], vec![64, 128]), bounded)
    }

    /// A `[64, 128]` tile multiplied by `wgmma` on sm_90a, filled from `a` of axes `dims` (the
    /// last a multiple of `k_multiple`) by the box `at(i)` gives (offsets and extents) in
    /// iteration `i`.
    fn fill_from(
        target: Target,
        dims: &[&str],
        k_multiple: u32,
        at: impl Fn(Val) -> (Vec<Val>, Vec<i64>),
        bounded: bool,
    ) -> Result<TmaBoxes, NoTma> {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", dims, DType::BF16, false);
        let w_src = k.tensor("b", &["N", "KB"], DType::BF16, false);
        let o = k.tensor("o", &["M", "N"], DType::F32, true);
        k.assume_multiple(&k.dim(dims[dims.len() - 1]), i64::from(k_multiple), loc(1));
        k.assume_multiple(&k.dim("KB"), 8, loc(1));
        k.launch(vec![Host::int(1)], 128, loc(2));
        let s = k.shared("s", &[64, 128], DType::BF16, loc(3));
        let w = k.shared("w", &[64, 128], DType::BF16, loc(3));
        let acc = k.fragment("acc", &[64, 64], DType::F32, loc(4));
        k.fill(&acc, 0.0, loc(4));
        let i = k.begin_for("i", LoopKind::pipelined(3), 0, 4, loc(5));
        let (offset, shape) = at(i.clone());
        let mut src = k.tile_at(&a, offset, &shape, loc(6));
        if bounded {
            if let Region::Global { bound, .. } = &mut src {
                *bound = Some(vec![Val::from(64).0, Val::from(100).0]);
            }
        }
        k.copy(src, s, loc(6));
        k.copy(k.tile(&w_src, vec![Val::from(0), i], &[64, 128], loc(7)), w, loc(7));
        k.gemm(s, w.t(), &acc, loc(8));
        k.end();
        k.copy(acc, k.tile(&o, vec![Val::from(0), Val::from(0)], &[64, 64], loc(9)), loc(9));
        let p = crate::passes::run_tile_passes_for(k.finish().expect("valid"), target).expect("passes");
        let mut fill = None;
        visit_stmts(&p.def.body, &mut |s| {
            if s.loc.line == 6 && matches!(s.kind, StmtKind::Copy { .. }) {
                fill = Some(s.clone());
            }
        });
        choose_tma(&p, &fill.expect("the fill"))
    }

    /// A `[1, 64, 1, 128]` box of a `[B, T, H, D]` tensor (rows along T) is a 4-D map whose
    /// box is one slab wide, 64 rows along T and 1 on the rest; with its columns along
    /// another axis than the contiguous one it takes no TMA.
    #[test]
    fn a_box_of_a_four_axis_tensor_is_a_four_axis_map() {
        let dims = ["B", "T", "H", "D"];
        let rows_along_t = |i: Val| (vec![Val::from(0), i, Val::from(2), Val::from(0)], vec![1, 64, 1, 128]);
        let boxes = fill_from(Target::Sm90a, &dims, 8, rows_along_t, false).expect("TMA");
        assert_eq!(boxes.boxes, 2);
        assert_eq!(boxes.map.box_extent, [64, 1, 64, 1]);
        assert_eq!(boxes.map.extents, ["D", "H", "T", "B"]);
        assert_eq!(boxes.box_bytes(), 8192);
        let columns_along_h = |i: Val| (vec![Val::from(0), i, Val::from(0), Val::from(0)], vec![1, 64, 128, 1]);
        assert_eq!(fill_from(Target::Sm90a, &dims, 8, columns_along_h, false), Err(NoTma::ColumnsNotContiguous));
        let six = ["A", "B", "C", "T", "H", "D"];
        let at = |i: Val| (vec![0.into(), 0.into(), 0.into(), i, 0.into(), 0.into()], vec![1, 1, 1, 64, 1, 128]);
        assert_eq!(fill_from(Target::Sm90a, &six, 8, at, false), Err(NoTma::Rank(6)));
    }

    #[test]
    fn a_canonical_fill_takes_one_box_per_slab() {
        let boxes = fill_of(Target::Sm90a, 8, Val::from(0), false).expect("TMA");
        assert_eq!(boxes.boxes, 2);
        assert_eq!(boxes.map.box_extent, [64, 64]);
        assert_eq!(boxes.map.swizzle, Swizzle::B128);
        assert_eq!(boxes.map.extents, ["K".to_string(), "M".to_string()]);
        assert_eq!(boxes.box_bytes(), 8192);
    }

    #[test]
    fn each_rule_has_its_reason() {
        assert_eq!(fill_of(Target::Sm80, 8, Val::from(0), false), Err(NoTma::Target(Target::Sm80)));
        assert_eq!(fill_of(Target::Sm90, 8, Val::from(0), false), Err(NoTma::Target(Target::Sm90)));
        assert_eq!(fill_of(Target::Sm90a, 4, Val::from(0), false), Err(NoTma::RowLengthNotAligned));
        assert_eq!(fill_of(Target::Sm90a, 8, Val::from(4), false), Err(NoTma::StartNotAligned));
        assert_eq!(fill_of(Target::Sm90a, 8, Val::from(0), true), Err(NoTma::Bounded));
    }
}
