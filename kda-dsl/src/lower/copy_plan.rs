//! What each `copy` lowers to, decided before it is emitted: the instruction kind
//! ([`CopyKind`]) and, when a faster kind was not possible, why ([`NoFastPath`]). The lowering
//! records one [`CopyPlan`] per copy; `KDA_DUMP=copy_plan` prints them, and [`copy_plans`]
//! returns them for tests and kernel authors.

use std::fmt;

use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::tile::KernelDef;

/// The instructions a copy lowers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// Global to shared in 16-byte `cp.async` copies.
    AsyncVectors,
    /// Shared to global in 16-byte vector accesses.
    VectorStores,
    /// Global and shared element by element (masked per element).
    Elements,
    /// Between global and a fragment, `elems` adjacent elements per access.
    FragmentRuns {
        /// Elements per access (1 to 8).
        elems: u32,
    },
    /// Fragment to global in whole 128-byte lines, partner lanes exchanging rows first.
    WholeLines,
    /// Shared to global in TMA bulk stores, one box per slab of the tile (one thread issues
    /// them and waits until they have read the tile).
    TensorBoxes {
        /// Boxes per copy.
        boxes: u32,
    },
}

/// Why a copy did not take a faster kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoFastPath {
    /// The tile's columns are not the tensor's innermost axis.
    ColumnsNotInnermost,
    /// The tile's column count is not a multiple of the vector's elements.
    ColumnsNotMultiple {
        /// The tile's columns.
        cols: u64,
        /// The multiple a vector needs.
        of: u64,
    },
    /// The box's first element is not known to be a multiple of the vector's elements.
    StartNotAligned {
        /// The multiple a vector needs.
        of: u64,
    },
    /// The tensor's row length is not known to be a multiple of the vector's elements.
    RowLengthNotAligned {
        /// The multiple a vector needs.
        of: u64,
    },
    /// The column bound is not known to be a multiple of the vector's elements.
    ColumnBoundNotAligned {
        /// The multiple a vector needs.
        of: u64,
    },
    /// The tensor's and the tile's element types differ (a conversion per element).
    DtypesDiffer {
        /// The global tensor's element type.
        tensor: DType,
        /// The tile's element type.
        tile: DType,
    },
    /// A row vector fragment holds no adjacent columns.
    RowVector,
    /// Fewer adjacent elements per access than the fragment holds.
    NarrowRuns {
        /// Elements per access.
        run: u32,
        /// What the fragment would allow.
        widest: u32,
        /// What limits it (`None`: the alignment of the box).
        limit: Option<Box<NoFastPath>>,
    },
    /// Whole-line stores need a tile fragment.
    WholeLinesNeedATile,
    /// A row already lies across the warp: plain stores write whole lines.
    RowsAlreadyAcrossTheWarp,
    /// Whole-line stores need contiguous f32 columns stored 16 bytes at a time.
    WholeLinesNeedF32Vectors,
    /// The box has one row.
    OneRow,
    /// Each warp row needs an even number of 16-column groups.
    OddColumnGroups,
    /// The box is masked (partner lanes would have to exchange masks too).
    Masked,
}

impl fmt::Display for NoFastPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoFastPath::ColumnsNotInnermost => write!(f, "the tile's columns are not the tensor's innermost axis"),
            NoFastPath::ColumnsNotMultiple { cols, of } => {
                write!(f, "the tile's {cols} columns are not a multiple of {of}")
            }
            NoFastPath::StartNotAligned { of } => write!(
                f,
                "the box's first element is not known to be a multiple of {of} elements (use extents of tile \
                 multiples and `assume_multiple`)"
            ),
            NoFastPath::RowLengthNotAligned { of } => {
                write!(f, "the row length is not known to be a multiple of {of} (add `assume_multiple`)")
            }
            NoFastPath::ColumnBoundNotAligned { of } => {
                write!(f, "the column bound is not known to be a multiple of {of} (add `assume_multiple`)")
            }
            NoFastPath::DtypesDiffer { tensor, tile } => write!(f, "the tensor is {tensor} and the tile {tile}"),
            NoFastPath::RowVector => write!(f, "a row vector holds no adjacent columns"),
            NoFastPath::NarrowRuns { run, widest, limit } => {
                write!(f, "{run} adjacent elements per access, not {widest}: ")?;
                match limit {
                    Some(why) => write!(f, "{why}"),
                    None => write!(f, "alignment"),
                }
            }
            NoFastPath::WholeLinesNeedATile => write!(f, "the fragment is a vector, not a tile"),
            NoFastPath::RowsAlreadyAcrossTheWarp => {
                write!(f, "a row already lies across the warp: plain stores write whole lines")
            }
            NoFastPath::WholeLinesNeedF32Vectors => {
                write!(f, "the box is not contiguous f32 columns stored 16 bytes (4 columns) at a time")
            }
            NoFastPath::OneRow => write!(f, "the box has one row"),
            NoFastPath::OddColumnGroups => write!(f, "each warp row needs an even number of 16-column groups"),
            NoFastPath::Masked => write!(f, "the box is masked"),
        }
    }
}

/// One copy's plan: where it is, what it lowers to, and why not faster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// The copy in the kernel source.
    pub loc: SrcLoc,
    /// The instructions it lowers to.
    pub kind: CopyKind,
    /// Why a faster kind was not possible, when one was considered.
    pub slower_because: Option<NoFastPath>,
}

impl fmt::Display for CopyPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}", self.loc, self.kind)?;
        if let Some(why) = &self.slower_because {
            write!(f, " (not faster: {why})")?;
        }
        Ok(())
    }
}

/// The plan of every copy in `def`, in the order the lowering meets them (a pipeline's stage
/// fills once per place they are emitted).
pub fn copy_plans(def: KernelDef) -> Result<Vec<CopyPlan>, Diag> {
    super::plans(def, crate::target::Target::default()).map(|plans| plans.copies)
}
