//! Layouts as values: where a tile's element (row, col) lives.
//!
//! A [`SharedLayout`] maps it to an element offset in shared memory; a [`FragmentLayout`] maps
//! it to (warp, lane, register slot), built from the m16n8k16 accumulator atom:
//! with `g = lane >> 2`, `t = lane & 3`, atom registers d0,d1 hold `(g, 2t..2t+1)` and d2,d3
//! hold `(g + 8, 2t..2t+1)`.

use crate::hopper_layout::{KMajorTile, Major, MnMajorTile, OperandTile, Swizzle};
use std::fmt;

/// A shared-memory tile layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SharedLayout {
    /// Plain row-major.
    RowMajor {
        /// Rows.
        rows: u32,
        /// Columns.
        cols: u32,
    },
    /// Row-major in 16-byte chunks whose index is XORed with a function of the row group
    /// ([`ChunkXor`]), so that the eight 16-byte rows an `ldmatrix` phase reads (down a column or
    /// along a row) hit eight different bank groups, and (with [`ChunkXor::Spread`]) so do the
    /// row pairs (4-byte elements) and row quads (2-byte) that element-wise fragment loads read
    /// in one phase.
    Swizzled {
        /// Rows.
        rows: u32,
        /// Columns.
        cols: u32,
        /// Elements per 16-byte chunk.
        chunk: u32,
        /// How the row group mixes into the chunk index.
        xor: ChunkXor,
        /// Columns per slab: the columns split into slabs this wide, each holding every row's
        /// part of it, one slab after another (`cols` itself but for canonical tiles wider
        /// than one swizzle line).
        slab: u32,
    },
}

/// How a swizzled layout XORs row group `x` (`row / rows_per_line`, masked) into the 16-byte
/// chunk index. Both are GF(2)-linear, which the address splitting relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkXor {
    /// [`row_xor`]: also spreads row pairs and quads over a 128-byte line, for element-wise
    /// fragment loads. The default.
    Spread,
    /// `x` itself: the hardware's 32-, 64- and 128-byte swizzles, the canonical layouts that
    /// `wgmma` descriptors and TMA boxes assume (they differ from `Spread` only with 8 chunks
    /// per line).
    Plain,
}

impl ChunkXor {
    /// The XOR of row group `x` within `mask`.
    pub fn apply(self, x: u32, mask: u32) -> u32 {
        match self {
            ChunkXor::Spread => row_xor(x, mask),
            ChunkXor::Plain => x & mask,
        }
    }
}

/// What a swizzled layout's address arithmetic needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwizzleParams {
    /// Elements per 16-byte chunk.
    pub chunk: u32,
    /// Rows sharing one 128-byte line (a row group).
    pub rows_per_line: u32,
    /// The mask of the chunk index the row group XORs into.
    pub mask: u32,
    /// How it XORs.
    pub xor: ChunkXor,
    /// Columns per slab (a row's extent within one slab).
    pub slab: u32,
    /// Elements from one slab to the next (`rows · slab`).
    pub slab_elems: u32,
}

/// The chunk XOR of row group `x` (`row / rows_per_line`, masked) of a swizzled layout:
/// `x ^ (x << 2)` within `mask`. A GF(2)-linear bijection, so eight consecutive groups get eight
/// distinct values (`ldmatrix`) and group `x ^ y` gets `row_xor(x) ^ row_xor(y)` (passes and runs
/// offset a thread's first chunk by a constant). With 8 chunks per line it also sends rows
/// `2k, 2k + 1` to opposite 64-byte halves (a 16-byte-per-lane fragment load reads a row pair per
/// phase) and rows `4k .. 4k + 3` to four different 32-byte quarters (8 bytes per lane).
pub fn row_xor(x: u32, mask: u32) -> u32 {
    (x ^ (x << 2)) & mask
}

impl SharedLayout {
    /// The layout for a `rows x cols` tile of `elem_bytes`-byte elements: swizzled when a row is
    /// a power-of-two number (at least 2) of 16-byte chunks (and, for 4-byte elements, the tile
    /// has several rows), row-major otherwise.
    pub fn choose(rows: u32, cols: u32, elem_bytes: u32) -> SharedLayout {
        let chunk = 16 / elem_bytes.max(1);
        let row_chunks = if cols.is_multiple_of(chunk) { cols / chunk } else { 0 };
        let swizzles = elem_bytes == 2 || (elem_bytes == 4 && rows > 1);
        if swizzles && row_chunks >= 2 && row_chunks.is_power_of_two() {
            SharedLayout::Swizzled { rows, cols, chunk, xor: ChunkXor::Spread, slab: cols }
        } else {
            SharedLayout::RowMajor { rows, cols }
        }
    }

    /// The canonical layout of a `wgmma` operand (or TMA box) whose rows are one line of a
    /// hardware swizzle (32 or 64 bytes) or whole 128-byte lines, in whole atoms of 8 rows:
    /// K-major when the columns are K, MN-major when they are M or N ([`Self::operand_tile`]).
    /// Rows of several lines split into slabs one line wide. `None` for other shapes.
    pub fn canonical(rows: u32, cols: u32, elem_bytes: u32) -> Option<SharedLayout> {
        let bytes = cols * elem_bytes;
        let line = match bytes {
            32 | 64 => bytes,
            b if b > 0 && b.is_multiple_of(128) => 128,
            _ => return None,
        };
        let fits = rows.is_multiple_of(8) && rows > 0;
        let (chunk, slab) = (16 / elem_bytes, line / elem_bytes);
        fits.then_some(SharedLayout::Swizzled { rows, cols, chunk, xor: ChunkXor::Plain, slab })
    }

    /// This layout as a `wgmma` operand tile of `major`-ness (the columns are K for
    /// [`Major::K`], M or N for [`Major::MN`]), when it is a [`Self::canonical`] layout.
    pub fn operand_tile(&self, major: Major, elem_bytes: u32) -> Option<OperandTile> {
        let SharedLayout::Swizzled { rows, cols, xor: ChunkXor::Plain, slab, .. } = *self else { return None };
        let swizzle = match slab * elem_bytes {
            32 => Swizzle::B32,
            64 => Swizzle::B64,
            128 => Swizzle::B128,
            _ => return None,
        };
        Some(match major {
            Major::K => OperandTile::K(KMajorTile { rows, k: cols, elem_bytes, swizzle }),
            Major::MN => OperandTile::MN(MnMajorTile { mn: cols, k: rows, elem_bytes, swizzle }),
        })
    }

    /// The byte alignment of the tile's base: a canonical tile's swizzle atom (8 lines: the
    /// pattern the hardware applies to address bits assumes it), 128 bytes otherwise. Every
    /// stage of a canonical tile is whole atoms, so each stage stays aligned.
    pub fn alignment(&self, elem_bytes: u32) -> u32 {
        match *self {
            SharedLayout::Swizzled { slab, xor: ChunkXor::Plain, .. } => (8 * slab * elem_bytes).max(128),
            _ => 128,
        }
    }

    /// Rows and columns.
    pub fn shape(&self) -> (u32, u32) {
        match *self {
            SharedLayout::RowMajor { rows, cols } | SharedLayout::Swizzled { rows, cols, .. } => (rows, cols),
        }
    }

    /// Elements the layout spans.
    pub fn size(&self) -> u32 {
        let (r, c) = self.shape();
        r * c
    }

    /// For a swizzled layout: its chunk, row group and XOR.
    pub fn swizzle_params(&self) -> Option<SwizzleParams> {
        match *self {
            SharedLayout::RowMajor { .. } => None,
            SharedLayout::Swizzled { rows, chunk, xor, slab, .. } => {
                let row_chunks = slab / chunk;
                let rows_per_line = (8 / row_chunks).max(1);
                let mask = row_chunks.min(8) - 1;
                Some(SwizzleParams { chunk, rows_per_line, mask, xor, slab, slab_elems: rows * slab })
            }
        }
    }

    /// The element offset of (row, col).
    pub fn offset(&self, row: u32, col: u32) -> u32 {
        match (*self, self.swizzle_params()) {
            (
                SharedLayout::Swizzled { .. },
                Some(SwizzleParams { chunk, rows_per_line, mask, xor, slab, slab_elems }),
            ) => {
                let phys = ((col % slab) / chunk) ^ xor.apply((row / rows_per_line) & mask, mask);
                (col / slab) * slab_elems + row * slab + phys * chunk + col % chunk
            }
            (SharedLayout::RowMajor { cols, .. }, _) | (SharedLayout::Swizzled { cols, .. }, None) => row * cols + col,
        }
    }
}

impl fmt::Display for SharedLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedLayout::RowMajor { rows, cols } => write!(f, "row_major[{rows}x{cols}]"),
            SharedLayout::Swizzled { rows, cols, chunk, xor: ChunkXor::Spread, .. } => {
                write!(f, "swizzled[{rows}x{cols}, chunk {chunk}]")
            }
            SharedLayout::Swizzled { rows, cols, chunk, xor: ChunkXor::Plain, slab } if slab == cols => {
                write!(f, "canonical[{rows}x{cols}, chunk {chunk}]")
            }
            SharedLayout::Swizzled { rows, cols, chunk, xor: ChunkXor::Plain, slab } => {
                write!(f, "canonical[{rows}x{cols}, chunk {chunk}, slabs of {slab}]")
            }
        }
    }
}

/// Which part of the accumulator atom grid a fragment covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragmentKind {
    /// A 2-D tile: every element owned by exactly one (warp, lane, slot).
    Tile,
    /// A 1-D vector along the rows of the parent tile: lane `(g, t)` of warp `(wr, wc)` holds the
    /// rows it holds in the parent, replicated over `t` and `wc`.
    Rows,
    /// A 1-D vector along the columns: replicated over `g` and `wr`.
    Cols,
}

/// Register layout of a fragment: a `rows x cols` parent tile spread over a `wm x wn` grid of
/// warps in atoms. The lanes of a warp split into `32 / lanes_per_row` row groups `g` of
/// `lanes_per_row` lanes `t`; an atom is `2 * 32 / lanes_per_row` rows by `lanes_per_row * vec`
/// columns, and lane `(g, t)` holds its rows `g` and `g + 32 / lanes_per_row` and `vec` adjacent
/// columns from `vec * t`.
/// - `lanes_per_row = 4`: 16-row atoms; with `vec = 2` that is the m16n8 accumulator of
///   `mma.sync`; element-wise tiles take `vec = 4`, so each thread's columns are 16 bytes of f32.
/// - `lanes_per_row = 32`: a row lies across the whole warp (`32 * vec` columns per atom of 2
///   rows): every thread holds every row of its warp, a column vector is `vec` registers per
///   thread, and a warp-wide access covers `32 * vec` adjacent elements of one row. For
///   element-wise tiles with few rows per warp and long rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentLayout {
    /// Parent tile rows.
    pub rows: u32,
    /// Parent tile columns.
    pub cols: u32,
    /// Warps along rows.
    pub wm: u32,
    /// Warps along columns.
    pub wn: u32,
    /// Tile or vector.
    pub kind: FragmentKind,
    /// Adjacent columns per thread in one atom (2: the mma accumulator; 4 or 8: element-wise).
    pub vec: u32,
    /// Lanes that share a row in an atom: 4 (the mma layouts) or 32 (a row across the warp).
    pub lanes_per_row: u32,
}

/// The coordinates of one register slot, split into the parts known at compile time and the
/// parts that depend on the warp and lane (`row = warp_row_base + g + row_off` and so on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotCoord {
    /// Constant row offset within the warp's sub-tile (add `wr * WM + g`).
    pub row_off: u32,
    /// Constant column offset within the warp's sub-tile (add `wc * WN + vec * t`).
    pub col_off: u32,
}

impl FragmentLayout {
    /// Spreads a `rows x cols` tile over `warps` warps, choosing the warp grid that loads the
    /// fewest operand fragments per k-step (ties go to more warps along rows, so whole rows stay
    /// in one warp); `None` when the shape does not fit m16n8 atoms.
    pub fn for_tile(rows: u32, cols: u32, warps: u32) -> Option<FragmentLayout> {
        let mut best: Option<(u32, FragmentLayout)> = None;
        let mut wm = 1;
        while wm <= warps {
            let wn = warps / wm;
            if warps.is_multiple_of(wm) && rows.is_multiple_of(16 * wm) && cols.is_multiple_of(8 * wn) {
                let mi = rows / (16 * wm);
                let ni = cols / (8 * wn);
                let cost = 2 * mi + ni;
                let l = FragmentLayout { rows, cols, wm, wn, kind: FragmentKind::Tile, vec: 2, lanes_per_row: 4 };
                if best.is_none_or(|(c, _)| cost <= c) {
                    best = Some((cost, l));
                }
            }
            wm *= 2;
        }
        best.map(|(_, l)| l)
    }

    /// The layout with every warp along rows (`wn = 1`), if the shape fits it.
    pub fn rows_only(rows: u32, cols: u32, warps: u32) -> Option<FragmentLayout> {
        (rows.is_multiple_of(16 * warps) && cols.is_multiple_of(8)).then_some(FragmentLayout {
            rows,
            cols,
            wm: warps,
            wn: 1,
            kind: FragmentKind::Tile,
            vec: 2,
            lanes_per_row: 4,
        })
    }

    /// The layout with every warp along columns (`wm = 1`), if the shape fits it.
    pub fn cols_only(rows: u32, cols: u32, warps: u32) -> Option<FragmentLayout> {
        (rows.is_multiple_of(16) && cols.is_multiple_of(8 * warps)).then_some(FragmentLayout {
            rows,
            cols,
            wm: 1,
            wn: warps,
            kind: FragmentKind::Tile,
            vec: 2,
            lanes_per_row: 4,
        })
    }

    /// The layout of a tile no `gemm` touches, with `lanes_per_row` lanes along each row (4 or
    /// 32): as many warps along rows as fit (rows stay in one warp, so row reductions need no
    /// shared memory), 4 adjacent columns per thread when the columns allow (16-byte accesses
    /// of f32), else 2; 8 first when the tile only moves to and from 16-bit memory
    /// (`half_memory`: 16-byte accesses of bf16 and f16).
    pub fn for_elementwise(
        rows: u32,
        cols: u32,
        warps: u32,
        half_memory: bool,
        lanes_per_row: u32,
    ) -> Option<FragmentLayout> {
        if !matches!(lanes_per_row, 4 | 32) {
            return None;
        }
        let widths: &[u32] = if half_memory { &[8, 4, 2] } else { &[4, 2] };
        let atom_rows = 64 / lanes_per_row;
        let mut wm = warps;
        while wm >= 1 {
            let wn = warps / wm;
            // A `wm` that does not divide the warps would leave some outside the grid.
            if warps.is_multiple_of(wm) && rows.is_multiple_of(atom_rows * wm) {
                for &vec in widths {
                    if cols.is_multiple_of(lanes_per_row * vec * wn) {
                        return Some(FragmentLayout {
                            rows,
                            cols,
                            wm,
                            wn,
                            kind: FragmentKind::Tile,
                            vec,
                            lanes_per_row,
                        });
                    }
                }
            }
            wm /= 2;
        }
        None
    }

    /// A standalone 1-D vector of `len` elements along rows.
    pub fn for_vector(len: u32, warps: u32) -> Option<FragmentLayout> {
        let mut wm = warps;
        while wm >= 1 {
            if warps.is_multiple_of(wm) && len.is_multiple_of(16 * wm) {
                return Some(FragmentLayout {
                    rows: len,
                    cols: 8 * (warps / wm),
                    wm,
                    wn: warps / wm,
                    kind: FragmentKind::Rows,
                    vec: 2,
                    lanes_per_row: 4,
                });
            }
            wm /= 2;
        }
        None
    }

    /// This layout's row (or column) vector.
    pub fn vector(&self, kind: FragmentKind) -> FragmentLayout {
        FragmentLayout { kind, ..*self }
    }

    /// Rows of one warp's sub-tile.
    pub fn warp_rows(&self) -> u32 {
        self.rows / self.wm
    }
    /// Columns of one warp's sub-tile.
    pub fn warp_cols(&self) -> u32 {
        self.cols / self.wn
    }
    /// Row groups of a warp (`g` takes this many values): 8, or 1 when a row spans the warp.
    pub fn row_groups(&self) -> u32 {
        32 / self.lanes_per_row
    }
    /// Rows of one atom: 16, or 2 when a row spans the warp.
    pub fn atom_rows(&self) -> u32 {
        2 * self.row_groups()
    }
    /// Columns of one atom: `lanes_per_row * vec`.
    pub fn atom_cols(&self) -> u32 {
        self.lanes_per_row * self.vec
    }
    /// Atoms per warp along rows (m16 atoms in the mma layouts).
    pub fn mi(&self) -> u32 {
        self.warp_rows() / self.atom_rows()
    }
    /// Atoms per warp along columns (each [`Self::atom_cols`] wide).
    pub fn ni(&self) -> u32 {
        self.warp_cols() / self.atom_cols()
    }
    /// The XOR masks of the `shfl.bfly` steps that combine the lanes of one row (`t`, adjacent
    /// lanes) or of one column (`g`, lanes `lanes_per_row` apart).
    pub fn lane_masks(&self, along_row: bool) -> Vec<i64> {
        let (from, to) = if along_row { (1, self.lanes_per_row) } else { (self.lanes_per_row, 32) };
        std::iter::successors(Some(from), |m| Some(m * 2)).take_while(|m| *m < to).map(i64::from).collect()
    }

    /// Register slots per thread.
    pub fn slots(&self) -> u32 {
        match self.kind {
            FragmentKind::Tile => self.mi() * self.ni() * 2 * self.vec,
            FragmentKind::Rows => self.mi() * 2,
            FragmentKind::Cols => self.ni() * self.vec,
        }
    }

    /// Compile-time part of slot `s`'s coordinates.
    pub fn slot_coord(&self, s: u32) -> SlotCoord {
        match self.kind {
            FragmentKind::Tile => {
                let (ni, v) = (self.ni(), self.vec);
                let (i, j, h, c) = (s / (ni * 2 * v), (s / (2 * v)) % ni, (s / v) % 2, s % v);
                SlotCoord { row_off: i * self.atom_rows() + h * self.row_groups(), col_off: j * self.atom_cols() + c }
            }
            FragmentKind::Rows => {
                SlotCoord { row_off: (s / 2) * self.atom_rows() + (s % 2) * self.row_groups(), col_off: 0 }
            }
            FragmentKind::Cols => SlotCoord { row_off: 0, col_off: (s / self.vec) * self.atom_cols() + s % self.vec },
        }
    }

    /// The element slot `s` of `lane` in `warp` holds: (row, col) for a tile, (index, 0) for a vector.
    pub fn coords(&self, warp: u32, lane: u32, s: u32) -> (u32, u32) {
        let (wr, wc) = (warp / self.wn, warp % self.wn);
        let (g, t) = (lane / self.lanes_per_row, lane % self.lanes_per_row);
        let c = self.slot_coord(s);
        let row = wr * self.warp_rows() + g + c.row_off;
        let col = wc * self.warp_cols() + self.vec * t + c.col_off;
        match self.kind {
            FragmentKind::Tile => (row, col),
            FragmentKind::Rows => (row, 0),
            FragmentKind::Cols => (col, 0),
        }
    }

    /// The slot of a row vector holding the row of tile slot `s` (`Tile` slot to `Rows` slot).
    pub fn row_slot_of(&self, s: u32) -> u32 {
        let (ni, v) = (self.ni(), self.vec);
        (s / (ni * 2 * v)) * 2 + (s / v) % 2
    }

    /// The slot of a column vector holding the column of tile slot `s`.
    pub fn col_slot_of(&self, s: u32) -> u32 {
        let (ni, v) = (self.ni(), self.vec);
        ((s / (2 * v)) % ni) * v + s % v
    }
}

impl fmt::Display for FragmentLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}[{}x{} over {}x{} warps, {} cols/thread, {} slots{}]",
            self.kind,
            self.rows,
            self.cols,
            self.wm,
            self.wn,
            self.vec,
            self.slots(),
            if self.lanes_per_row == 4 { String::new() } else { format!(", {} lanes per row", self.lanes_per_row) }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A canonical layout puts every element where the `wgmma` operand tile of either
    /// major-ness (the hardware's swizzle on bytes, `hopper_layout`) has it: K-major with the
    /// columns as K, MN-major with the rows as K.
    #[test]
    fn canonical_layouts_are_the_operand_tiles() {
        for (rows, cols, eb) in [
            (64, 64, 2),
            (128, 64, 2),
            (8, 16, 2),
            (32, 32, 2),
            (64, 32, 4),
            (16, 8, 4),
            (64, 128, 2),
            (16, 256, 2),
            (8, 96, 4),
        ] {
            let l = SharedLayout::canonical(rows, cols, eb).expect("one line per row");
            for major in [Major::K, Major::MN] {
                let tile = l.operand_tile(major, eb).expect("canonical");
                for r in 0..rows {
                    for c in 0..cols {
                        let (mn, k) = if major == Major::K { (r, c) } else { (c, r) };
                        assert_eq!(l.offset(r, c) * eb, tile.address(0, mn, k), "{l} {major:?} ({r}, {c})");
                    }
                }
            }
        }
        assert_eq!(SharedLayout::canonical(64, 48, 2), None, "rows of one and a half 64-byte lines");
        assert_eq!(SharedLayout::canonical(12, 64, 2), None, "not whole atoms");
        // Below 8 chunks per line the spread XOR is the plain one: the layouts agree.
        for cols in [16, 32] {
            let (spread, plain) =
                (SharedLayout::choose(64, cols, 2), SharedLayout::canonical(64, cols, 2).expect("fits"));
            assert!((0..64).all(|r| (0..cols).all(|c| spread.offset(r, c) == plain.offset(r, c))), "{cols}");
        }
    }

    #[test]
    fn swizzles_are_permutations() {
        for (rows, cols, eb) in
            [(64, 32, 2), (128, 64, 2), (32, 16, 2), (16, 128, 2), (64, 24, 2), (8, 8, 4), (128, 256, 2)]
        {
            let l = SharedLayout::choose(rows, cols, eb);
            let mut seen = HashSet::new();
            for r in 0..rows {
                for c in 0..cols {
                    let o = l.offset(r, c);
                    assert!(o < l.size(), "{l}: offset {o} out of range");
                    assert!(seen.insert(o), "{l}: offset {o} twice");
                }
            }
            assert_eq!(seen.len() as u32, rows * cols);
        }
    }

    #[test]
    fn swizzle_keeps_chunks_contiguous_and_ldmatrix_conflict_free() {
        for cols in [16u32, 32, 64, 128] {
            let l = SharedLayout::choose(64, cols, 2);
            assert!(matches!(l, SharedLayout::Swizzled { .. }));
            for r in 0..64 {
                for c in (0..cols).step_by(8) {
                    for e in 0..8 {
                        assert_eq!(l.offset(r, c + e), l.offset(r, c) + e);
                    }
                }
            }
            // Eight consecutive rows at one chunk (the `.trans` access) and, for wide rows,
            // eight chunks of one row pair: distinct 16-byte bank groups of a 128-byte line.
            for r0 in (0..64).step_by(8) {
                for c in (0..cols).step_by(8) {
                    let groups: HashSet<u32> = (0..8).map(|r| (l.offset(r0 + r, c) * 2 / 16) % 8).collect();
                    assert_eq!(groups.len(), 8, "cols {cols} rows {r0}.. chunk {c}");
                }
            }
        }
    }

    #[test]
    fn element_wise_fragment_loads_are_conflict_free() {
        // One phase of a 16-byte-per-lane load of a 4-byte tile reads 64 bytes from each of two
        // adjacent rows; of an 8-byte-per-lane load of a 2-byte tile, 32 bytes from each of four.
        for (eb, rows_per_phase) in [(4u32, 2u32), (2, 4)] {
            let cols = 128;
            let l = SharedLayout::choose(32, cols, eb);
            assert!(matches!(l, SharedLayout::Swizzled { .. }), "{l}");
            let bytes_per_row = 128 / rows_per_phase;
            for r0 in (0..32).step_by(rows_per_phase as usize) {
                for c in (0..cols).step_by((bytes_per_row / eb) as usize) {
                    let mut groups = HashSet::new();
                    for r in r0..r0 + rows_per_phase {
                        for k in (0..bytes_per_row / eb).step_by((16 / eb) as usize) {
                            groups.insert((l.offset(r, c + k) * eb / 16) % 8);
                        }
                    }
                    assert_eq!(groups.len(), 8, "{eb}-byte rows {r0}.. col {c}");
                }
            }
        }
        // A one-row 4-byte tile stays row-major.
        assert!(matches!(SharedLayout::choose(1, 128, 4), SharedLayout::RowMajor { .. }));
    }

    #[test]
    fn fragments_are_bijections_onto_lane_and_slot() {
        let chosen = [(16, 8, 1), (64, 64, 4), (128, 128, 8), (128, 128, 4), (64, 32, 4), (32, 128, 4), (16, 64, 4)]
            .map(|(r, c, w)| (r, c, w, FragmentLayout::for_tile(r, c, w).expect("fits")));
        // The pinned layouts of gemm operands from registers: warps along rows only, or along
        // columns only, 8 columns each.
        let pinned = [(64, 32, 2, true), (128, 64, 8, false), (16, 32, 4, false), (128, 8, 1, false)].map(
            |(r, c, w, by_rows)| {
                let l = if by_rows { FragmentLayout::rows_only(r, c, w) } else { FragmentLayout::cols_only(r, c, w) };
                (r, c, w, l.expect("fits"))
            },
        );
        assert!(FragmentLayout::cols_only(16, 8, 2).is_none() && FragmentLayout::cols_only(8, 16, 1).is_none());
        for (rows, cols, warps, l) in chosen.into_iter().chain(pinned) {
            assert_eq!(l.wm * l.wn, warps);
            let mut seen = HashSet::new();
            for w in 0..warps {
                for lane in 0..32 {
                    for s in 0..l.slots() {
                        let (r, c) = l.coords(w, lane, s);
                        assert!(r < rows && c < cols);
                        assert!(seen.insert((r, c)), "{l}: ({r},{c}) twice");
                    }
                }
            }
            assert_eq!(seen.len() as u32, rows * cols, "{l} covers every element");
        }
    }

    #[test]
    fn element_wise_layouts_are_bijections_too() {
        for (rows, cols, warps, lanes) in [
            (16, 128, 1, 4),
            (16, 128, 2, 4),
            (32, 128, 2, 4),
            (64, 64, 4, 4),
            (16, 8, 1, 4),
            (128, 16, 1, 4),
            (16, 128, 1, 32),
            (8, 128, 2, 32),
            (4, 256, 1, 32),
            (64, 128, 4, 32),
            (2, 64, 1, 32),
        ] {
            for half in [false, true] {
                let l = FragmentLayout::for_elementwise(rows, cols, warps, half, lanes).expect("fits");
                let mut seen = HashSet::new();
                for w in 0..warps {
                    for lane in 0..32 {
                        for s in 0..l.slots() {
                            let (r, c) = l.coords(w, lane, s);
                            assert!(r < rows && c < cols, "{l}");
                            assert!(seen.insert((r, c)), "{l}: ({r},{c}) twice");
                            let (rv, cv) = (l.vector(FragmentKind::Rows), l.vector(FragmentKind::Cols));
                            assert_eq!(rv.coords(w, lane, l.row_slot_of(s)).0, r);
                            assert_eq!(cv.coords(w, lane, l.col_slot_of(s)).0, c);
                        }
                    }
                }
                assert_eq!(seen.len() as u32, rows * cols, "{l}");
            }
        }
        assert_eq!(FragmentLayout::for_elementwise(16, 128, 1, false, 4).map(|l| l.vec), Some(4));
        assert_eq!(FragmentLayout::for_elementwise(16, 128, 1, true, 4).map(|l| l.vec), Some(8));
        // Too narrow for 8 columns per thread: 4.
        assert_eq!(FragmentLayout::for_elementwise(16, 16, 1, true, 4).map(|l| l.vec), Some(4));
        // A row across the warp: 2-row atoms, so 8 rows over 2 warps is 4 rows (2 atoms) each,
        // 4 f32 per lane, and a column vector of 4 registers.
        let l = FragmentLayout::for_elementwise(8, 128, 2, false, 32).expect("fits");
        assert_eq!((l.wm, l.wn, l.vec, l.mi(), l.ni(), l.slots()), (2, 1, 4, 2, 1, 16));
        assert_eq!(l.vector(FragmentKind::Cols).slots(), 4);
        assert_eq!(l.vector(FragmentKind::Rows).slots(), 4);
        assert_eq!((l.lane_masks(true), l.lane_masks(false)), (vec![1, 2, 4, 8, 16], vec![]));
        let m = FragmentLayout::for_elementwise(16, 128, 1, false, 4).expect("fits");
        assert_eq!((m.lane_masks(true), m.lane_masks(false)), (vec![1, 2], vec![4, 8, 16]));
        // Lanes of one row hold adjacent 16-byte pieces of it: lane t, slot 0 is column 4t.
        for lane in 0..32 {
            assert_eq!(l.coords(1, lane, 0), (4, 4 * lane));
        }
        assert!(FragmentLayout::for_elementwise(16, 128, 1, false, 8).is_none());
        assert!(FragmentLayout::for_elementwise(3, 128, 1, false, 32).is_none());
    }

    #[test]
    fn vectors_follow_their_tile() {
        let l = FragmentLayout::for_tile(64, 64, 4).expect("fits");
        let (rv, cv) = (l.vector(FragmentKind::Rows), l.vector(FragmentKind::Cols));
        for w in 0..4 {
            for lane in 0..32 {
                for s in 0..l.slots() {
                    let (r, c) = l.coords(w, lane, s);
                    assert_eq!(rv.coords(w, lane, l.row_slot_of(s)).0, r);
                    assert_eq!(cv.coords(w, lane, l.col_slot_of(s)).0, c);
                }
            }
        }
        // Each row index is held (replicated) by someone.
        let v = FragmentLayout::for_vector(64, 4).expect("fits");
        let held: HashSet<u32> = (0..4)
            .flat_map(|w| (0..32).flat_map(move |ln| (0..v.slots()).map(move |s| v.coords(w, ln, s).0)))
            .collect();
        assert_eq!(held.len(), 64);
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        assert!(FragmentLayout::for_tile(24, 8, 1).is_none());
        assert!(FragmentLayout::for_tile(16, 12, 1).is_none());
        assert!(FragmentLayout::for_vector(8, 4).is_none());
        // Every warp lands in the warp grid: 5 warps have no 2 x 2 split.
        for lanes in [4, 32] {
            if let Some(l) = FragmentLayout::for_elementwise(640, 640, 5, false, lanes) {
                assert_eq!(l.wm * l.wn, 5, "{l}");
            }
            assert!(FragmentLayout::for_elementwise(64, 128, 5, false, lanes).is_none());
        }
        assert_eq!(FragmentLayout::for_vector(160, 5).map(|l| l.wm * l.wn), Some(5));
        assert_eq!(FragmentLayout::for_vector(32, 5).map(|l| (l.wm, l.wn)), Some((1, 5)));
    }
}
