//! A `parallel` over an `mma.sync` accumulator fragment that reads or writes a 16-bit shared
//! tile at its own index (`x[i][j]`) or transposed (`x[j][i]`) moves 8 x 8 blocks rather than
//! elements. The accumulator's 8 x 8 blocks are the matrix instructions' fragments: lane
//! `(g, t)` holds row `g`, columns `2t` and `2t + 1` of each.
//!
//! - A read takes `ldmatrix` (`.trans` for the transposed read) before the element loop, four
//!   blocks an instruction, instead of one `ld.shared.b16` and its address an element; each
//!   element lands in the register slot the fragment gives it.
//! - A transposed store (`x[j][i] = ..`, the tile laid out the other way round) keeps each
//!   element's value until the loop's end, then packs each block's two values of a thread to
//!   16 bits (`cvt.rn`), transposes the block (`movmatrix.trans`) and stores the two adjacent
//!   elements of the tile's row the thread then holds in one 4-byte store, instead of two
//!   2-byte stores. A store at the loop's own index needs none of it: a thread's two
//!   columns are adjacent already, and `deferred_stores` pairs them.
//!
//! The bits are the same either way: the same elements move, rounded the same (to nearest
//! even). Decided first ([`matrix_access_choice`], one [`MatrixAccessPlan`] per access the
//! lowering met), then emitted by [`Lower::matrix_accesses`] and [`Lower::matrix_stores`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::{Lower, V};
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout, SharedLayout};
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

/// How one access of a shared tile at a `parallel`'s own index is lowered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatrixAccessPlan {
    /// The shared tile's name.
    pub tile: String,
    /// A read or a store.
    pub access: MatrixAccess,
    /// At `x[j][i]` in a loop over `(i, j)`.
    pub transposed: bool,
    /// What was chosen.
    pub choice: MatrixAccessChoice,
}

/// Which way an access moves elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatrixAccess {
    /// Reads of the tile's elements.
    Read,
    /// A store of each element.
    Store,
}

/// The instructions of a [`MatrixAccessPlan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixAccessChoice {
    /// 8 x 8 blocks: `ldmatrix` (`.trans` when transposed) for a read, `movmatrix.trans` and
    /// 4-byte stores for a transposed store.
    Blocks,
    /// One shared access an element, for the reason given.
    PerElement(NoBlocks),
}

/// Why an access stays one shared access an element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoBlocks {
    /// The tile's elements are not 16 bits.
    NotSixteenBit,
    /// The loop's fragment is not laid out as the `mma.sync` accumulator (16-row atoms, 2
    /// adjacent columns a lane).
    NotAccumulatorLayout,
    /// The tile's shape is not the fragment's (transposed for a transposed access).
    ShapeDiffers,
    /// Some 8 elements of a row that a block's row covers are not 16 contiguous, aligned
    /// bytes in the tile's layout.
    RowsNotWholeChunks,
    /// A read of a tile the loop's body writes: its reads cannot all come first.
    WrittenInLoop,
    /// A store to a tile the loop's body reads: its stores cannot all wait.
    ReadInLoop,
    /// A store under a condition or in a loop, or not the body's only store to the tile.
    NotTheOnlyStore,
    /// A store at the loop's own index: `deferred_stores` pairs a thread's adjacent columns.
    NotTransposed,
    /// The loop runs under a guard (an if-converted branch), where lanes may be off.
    Guarded,
}

impl fmt::Display for MatrixAccessPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.transposed { "transposed" } else { "at its index" };
        let what = match self.access {
            MatrixAccess::Read => "read",
            MatrixAccess::Store => "store",
        };
        let how = match (self.choice, self.access, self.transposed) {
            (MatrixAccessChoice::Blocks, MatrixAccess::Read, true) => "ldmatrix.trans".to_string(),
            (MatrixAccessChoice::Blocks, MatrixAccess::Read, false) => "ldmatrix".to_string(),
            (MatrixAccessChoice::Blocks, MatrixAccess::Store, _) => "movmatrix.trans, 4-byte stores".to_string(),
            (MatrixAccessChoice::PerElement(why), ..) => format!("per element ({why:?})"),
        };
        write!(f, "{what} {} {at}: {how}", self.tile)
    }
}

/// What the loop's body does with a tile it accesses at its own index, for
/// [`matrix_access_choice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BodyUse {
    /// Some statement of the body reads the tile.
    pub read: bool,
    /// Some statement of the body stores to the tile.
    pub written: bool,
    /// The body's only store to the tile is one of its own statements (under no condition or
    /// loop), at the loop's index or transposed.
    pub one_store: bool,
}

/// Whether an `access` of a shared tile (`tile`, of `dtype`) at a `parallel`'s index,
/// `transposed` or not, inside a loop over a fragment laid out as `frag`, moves 8 x 8 blocks.
pub fn matrix_access_choice(
    access: MatrixAccess,
    frag: FragmentLayout,
    tile: SharedLayout,
    dtype: DType,
    transposed: bool,
    body: BodyUse,
    guarded: bool,
) -> MatrixAccessChoice {
    use MatrixAccessChoice::PerElement;
    if !dtype.is_half() {
        return PerElement(NoBlocks::NotSixteenBit);
    }
    if frag.kind != FragmentKind::Tile || frag.lanes_per_row != 4 || frag.vec != 2 {
        return PerElement(NoBlocks::NotAccumulatorLayout);
    }
    let want = if transposed { (frag.cols, frag.rows) } else { (frag.rows, frag.cols) };
    if tile.shape() != want {
        return PerElement(NoBlocks::ShapeDiffers);
    }
    if !rows_in_whole_chunks(tile) {
        return PerElement(NoBlocks::RowsNotWholeChunks);
    }
    match access {
        MatrixAccess::Read if body.written => return PerElement(NoBlocks::WrittenInLoop),
        MatrixAccess::Store if !transposed => return PerElement(NoBlocks::NotTransposed),
        MatrixAccess::Store if body.read => return PerElement(NoBlocks::ReadInLoop),
        MatrixAccess::Store if !body.one_store => return PerElement(NoBlocks::NotTheOnlyStore),
        _ => {}
    }
    if guarded {
        return PerElement(NoBlocks::Guarded);
    }
    MatrixAccessChoice::Blocks
}

/// Whether every run of 8 elements of a row starting at a multiple of 8 is 16 contiguous
/// bytes at a 16-byte boundary (of 2-byte elements), in every stage of a pipeline too (the
/// tile's bytes a multiple of 16; its base is aligned to 128).
fn rows_in_whole_chunks(tile: SharedLayout) -> bool {
    let (rows, cols) = tile.shape();
    cols.is_multiple_of(8)
        && (2 * tile.size()).is_multiple_of(16)
        && (0..rows).all(|r| {
            (0..cols).step_by(8).all(|c| {
                let first = tile.offset(r, c);
                first.is_multiple_of(8) && (1..8).all(|k| tile.offset(r, c + k) == first + k)
            })
        })
}

/// Whether `idx` is the loop's index `(i, j)` (false), transposed (true), or neither.
pub(crate) fn index_order(idx: &[Expr], (i, j): (VarId, VarId)) -> Option<bool> {
    match idx {
        [Expr::Var(a), Expr::Var(c)] if (*a, *c) == (i, j) => Some(false),
        [Expr::Var(a), Expr::Var(c)] if (*a, *c) == (j, i) => Some(true),
        _ => None,
    }
}

/// One access of a tile at a loop's own index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IndexAccess {
    tile: BufId,
    access: MatrixAccess,
    transposed: bool,
}

/// The tiles `body` accesses at the loop's index `ij`, each (tile, access, transposed) once in
/// the order met, and what the body does with each tile.
fn index_accesses(body: &[Stmt], ij: (VarId, VarId)) -> (Vec<IndexAccess>, HashMap<BufId, BodyUse>) {
    let mut found = vec![];
    let mut uses: HashMap<BufId, BodyUse> = HashMap::new();
    let note = |found: &mut Vec<IndexAccess>, tile, access, transposed| {
        let a = IndexAccess { tile, access, transposed };
        if !found.contains(&a) {
            found.push(a);
        }
    };
    visit_stmts(body, &mut |s| {
        s.for_each_expr(&mut |e| {
            e.for_each_elem_read(&mut |b, idx| {
                uses.entry(b).or_default().read = true;
                if let Some(t) = index_order(idx, ij) {
                    note(&mut found, b, MatrixAccess::Read, t);
                }
            })
        });
        if let StmtKind::Store(b, idx, _) = &s.kind {
            let u = uses.entry(*b).or_default();
            u.one_store = !u.written;
            u.written = true;
            if let Some(t) = index_order(idx, ij) {
                note(&mut found, *b, MatrixAccess::Store, t);
            }
        }
    });
    // A store under a condition or in a loop is not the body's own statement.
    for s in body {
        s.for_each_nested(&mut |inner| {
            if let StmtKind::Store(b, ..) = &inner.kind {
                uses.entry(*b).or_default().one_store = false;
            }
        });
    }
    (found, uses)
}

/// Which 8 x 8 blocks one `ldmatrix` reads: an atom's two (16 rows by 8 columns), or two
/// atoms' four where the second atom is a constant step from the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockGroup {
    /// Two atoms of one atom row (the warp's atom columns are even in number).
    AtomsSideBySide,
    /// Two atoms of one atom column (the warp has one atom column).
    AtomsStacked,
    /// One atom (the last of an odd count, or atom columns odd in number but for one).
    OneAtom,
}

impl BlockGroup {
    /// The group starting at atom `atom` of a warp's `atoms`, `ni` atoms a row.
    fn at(atom: u32, atoms: u32, ni: u32) -> BlockGroup {
        match ni {
            _ if atom + 1 >= atoms => BlockGroup::OneAtom,
            1 => BlockGroup::AtomsStacked,
            n if n.is_multiple_of(2) => BlockGroup::AtomsSideBySide,
            _ => BlockGroup::OneAtom,
        }
    }

    /// Its atoms.
    fn atoms(self) -> u32 {
        match self {
            BlockGroup::OneAtom => 1,
            BlockGroup::AtomsSideBySide | BlockGroup::AtomsStacked => 2,
        }
    }

    /// The fragment (row, column) offset from the group's first atom of the block lane `lane`
    /// addresses (block `lane / 8`: its upper half `lane / 8 % 2`, its second atom `lane / 16`).
    fn lane_offsets(self, lane: u32) -> (u32, u32) {
        let (half, second) = ((lane >> 3) & 1, lane >> 4);
        match self {
            BlockGroup::AtomsStacked => (16 * second + 8 * half, 0),
            BlockGroup::AtomsSideBySide => (8 * half, 8 * second),
            BlockGroup::OneAtom => (8 * half, 0),
        }
    }
}

/// Per (tile, transposed): each register slot's element as f32 (of a read, loaded; of a store,
/// once the body has run). Ordered, so that the stores go out in the same order every compile.
pub(crate) type SlotRegs = BTreeMap<(BufId, bool), Vec<Option<Reg>>>;

/// The bits a per-thread value takes over every lane of `warps` warps, each value the OR of
/// `at(warp, lane)`'s two parts (so that `split_index` can tell its constant's bits apart).
fn bits_over_lanes(warps: u32, at: impl Fn(u32, u32) -> (u32, u32)) -> (u32, u32) {
    let mut bits = (0, 0);
    for w in 0..warps {
        for lane in 0..32 {
            let (a, b) = at(w, lane);
            bits.0 |= a;
            bits.1 |= b;
        }
    }
    bits
}

impl Lower<'_> {
    /// Plans the accesses of the `parallel` over fragment `over` (laid out as `frag`, index
    /// variables `vars`) of shared tiles at its own index, reads those that move blocks
    /// (`ldmatrix`) and returns them (every slot filled), with the stores that move blocks
    /// (no slot filled yet: [`Lower::store_elem_of_block`] fills them as the body runs, then
    /// [`Lower::matrix_stores`] stores them). Called inside the loop's element-address scope.
    pub(crate) fn matrix_accesses(
        &mut self,
        over: BufId,
        frag: FragmentLayout,
        vars: &[VarId],
        body: &[Stmt],
    ) -> (SlotRegs, SlotRegs) {
        let (mut reads, mut stores) = (BTreeMap::new(), BTreeMap::new());
        let [i, j] = vars else { return (reads, stores) };
        let (accesses, uses) = index_accesses(body, (*i, *j));
        for IndexAccess { tile: b, access, transposed } in accesses {
            let BufLayout::Shared(tile) = self.p.layouts[b] else { continue };
            debug_assert_ne!(b, over, "a fragment is not a shared tile");
            let dtype = self.def().buffers[b].dtype;
            let guarded = self.em.guard.is_some();
            let choice = matrix_access_choice(access, frag, tile, dtype, transposed, uses[&b], guarded);
            let tile_name = self.def().buffers[b].name.clone();
            self.matrix_access_plans.push(MatrixAccessPlan { tile: tile_name, access, transposed, choice });
            match (choice, access) {
                (MatrixAccessChoice::Blocks, MatrixAccess::Read) => {
                    let slots = self.ldmatrix_reads(frag, b, transposed);
                    reads.insert((b, transposed), slots.into_iter().map(Some).collect());
                }
                (MatrixAccessChoice::Blocks, MatrixAccess::Store) => {
                    stores.insert((b, transposed), vec![None; frag.slots() as usize]);
                }
                (MatrixAccessChoice::PerElement(_), _) => {}
            }
        }
        (reads, stores)
    }

    /// Holds `v` as the element of slot `slot` for shared tile `b`'s transposed block store,
    /// where the loop being lowered stores `b` so ([`Lower::matrix_accesses`]); false if the
    /// caller is to store it now.
    pub(crate) fn store_elem_of_block(&mut self, b: BufId, idx: &[Expr], v: V) -> bool {
        let Some(ctx) = self.elem else { return false };
        let [Some(i), Some(j)] = ctx.vars else { return false };
        let Some(transposed) = index_order(idx, (i, j)) else { return false };
        if !self.matrix_store_regs.contains_key(&(b, transposed)) {
            return false;
        }
        let held = self.held_value(v);
        let held = self.em.to_reg(held.s, RegClass::F32, Ty::F32);
        let slots = self.matrix_store_regs.get_mut(&(b, transposed)).expect("checked");
        slots[ctx.slot as usize] = Some(held);
        true
    }

    /// Stores the held elements of each transposed block store (`stores`, every slot filled)
    /// of a loop over a fragment laid out as `frag`: per 8 x 8 block, both of a thread's values
    /// packed, the block transposed, and the two adjacent elements of the tile's row the
    /// thread then holds stored at once.
    pub(crate) fn matrix_stores(&mut self, frag: FragmentLayout, stores: SlotRegs) {
        if stores.is_empty() {
            return;
        }
        // After the transpose, lane `(g, t)` holds row `g`, columns `2t` and `2t + 1` of the
        // block's transpose: the tile's row (the fragment's column) `g`, columns (the
        // fragment's rows) `2t`, `2t + 1`. As a per-thread base (and the bits it takes over
        // every warp and lane) plus each block's constant; the same for every tile.
        let th = self.scope.th;
        let (row_bits, col_bits) = bits_over_lanes(self.scope.threads / 32, |w, lane| {
            ((w % frag.wn) * frag.warp_cols() + lane / 4, (w / frag.wn) * frag.warp_rows() + 2 * (lane % 4))
        });
        let (warp_row, warp_col) = self.warp_origin(frag);
        let tile_row = self.em.add32(warp_col, Src::Reg(th.g));
        let tile_row = self.em.to_reg(tile_row, RegClass::B32, Ty::U32);
        let t2 = self.em.op32(BinKind::Shl, Src::Reg(th.t), 1);
        let tile_col = self.em.add32(warp_row, t2);
        let tile_col = self.em.to_reg(tile_col, RegClass::B32, Ty::U32);
        for ((b, _), slots) in stores {
            let half = if self.def().buffers[b].dtype == DType::BF16 { Ty::BF16 } else { Ty::F16 };
            for block in 0..frag.slots() / 2 {
                let (lo, hi) = (slots[2 * block as usize], slots[2 * block as usize + 1]);
                let (lo, hi) = (lo.expect("every slot stored"), hi.expect("every slot stored"));
                let packed = self.em.reg(RegClass::B32);
                self.em.emit(Op::PackHalf2 { half, d: packed, hi: Src::Reg(hi), lo: Src::Reg(lo) });
                let moved = self.em.reg(RegClass::B32);
                self.em.emit(Op::Movmatrix { d: moved, a: packed });
                // Block `(atom (i, j), upper half h)`: fragment rows from `16 i + 8 h`, columns
                // from `8 j`.
                let c = frag.slot_coord(2 * block);
                let row = self.split_index(tile_row, row_bits, c.col_off);
                let col = self.split_index(tile_col, col_bits, c.row_off);
                let addr = self.shared_addr(b, row, col);
                self.em.emit(Op::St {
                    space: Space::Shared,
                    ty: Ty::B32,
                    addr,
                    offset: 0,
                    vals: vec![Src::Reg(moved)],
                });
            }
        }
    }

    /// Every element of fragment layout `frag` from shared tile `b` (`[rows, cols]` of the
    /// fragment, or `[cols, rows]` when `transposed`), by `ldmatrix`: each slot's element as
    /// f32. The warp's 8 x 8 blocks go in slot order (`(atom, upper half)`), two atoms (four
    /// blocks) an instruction where [`BlockGroup`] allows, lane `l` addressing row `l % 8` of
    /// block `l / 8`.
    fn ldmatrix_reads(&mut self, frag: FragmentLayout, b: BufId, transposed: bool) -> Vec<Reg> {
        let dtype = self.def().buffers[b].dtype;
        let (warps, lane) = (self.scope.threads / 32, Src::Reg(self.scope.th.lane));
        let (ni, atoms) = (frag.ni(), frag.mi() * frag.ni());
        // The lane's block (`l / 8`: its upper half, and its second atom) and row (`l % 8`).
        let block = self.em.op32(BinKind::Shr, lane, 3);
        let half = self.em.op32(BinKind::And, block, 1);
        let half8 = self.em.op32(BinKind::Shl, half, 3);
        let second = self.em.op32(BinKind::Shr, lane, 4);
        let r8 = self.em.op32(BinKind::And, lane, 7);
        let (warp_row, warp_col) = self.warp_origin(frag);
        let mut slots = vec![None; frag.slots() as usize];
        let mut atom = 0;
        while atom < atoms {
            let group = BlockGroup::at(atom, atoms, ni);
            // Fragment (row, column) of this thread's block start, as a per-thread base and
            // the group's constant (its first atom's); the bits the base takes over every warp
            // and lane.
            let (row_c, col_c) = (16 * (atom / ni), 8 * (atom % ni));
            let bits = bits_over_lanes(warps, |w, l| {
                let (r, c) = group.lane_offsets(l);
                ((w / frag.wn) * frag.warp_rows() + r, (w % frag.wn) * frag.warp_cols() + c)
            });
            let (r_lane, c_lane) = match group {
                BlockGroup::AtomsStacked => {
                    let s16 = self.em.op32(BinKind::Shl, second, 4);
                    (self.em.add32(s16, half8), Src::Imm(0))
                }
                BlockGroup::AtomsSideBySide => (half8, self.em.op32(BinKind::Shl, second, 3)),
                BlockGroup::OneAtom => (half8, Src::Imm(0)),
            };
            let row_base = self.em.add32(warp_row, r_lane);
            let col_base = self.em.add32(warp_col, c_lane);
            // Lane `l` gives the address of row `l % 8` of its block: a row of the tile, or
            // (transposed) a column of the fragment.
            let reg = |lw: &mut Self, x: Src| lw.em.to_reg(x, RegClass::B32, Ty::U32);
            let (row, col) = if transposed {
                let tile_row = self.em.add32(col_base, r8);
                let tile_row = reg(self, tile_row);
                let tile_col = reg(self, row_base);
                (self.split_index(tile_row, bits.1 | 7, col_c), self.split_index(tile_col, bits.0, row_c))
            } else {
                let tile_row = self.em.add32(row_base, r8);
                let tile_row = reg(self, tile_row);
                let tile_col = reg(self, col_base);
                (self.split_index(tile_row, bits.0 | 7, row_c), self.split_index(tile_col, bits.1, col_c))
            };
            let addr = self.shared_addr(b, row, col);
            let d: Vec<Reg> = (0..2 * group.atoms()).map(|_| self.em.reg(RegClass::B32)).collect();
            self.em.emit(Op::Ldmatrix { trans: transposed, d: d.clone(), addr });
            // Block `2 * atom + k` holds slots `2 (2 atom + k)` (its lower column) and the next.
            for (k, packed) in d.into_iter().enumerate() {
                let (lo, hi) = (self.em.reg(RegClass::F32), self.em.reg(RegClass::F32));
                self.widen_pair_into(packed, dtype, lo, hi);
                let s = 2 * (2 * atom as usize + k);
                slots[s] = Some(lo);
                slots[s + 1] = Some(hi);
            }
            atom += group.atoms();
        }
        slots.into_iter().map(|r| r.expect("every slot is in a block")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accumulator(rows: u32, cols: u32, warps: u32) -> FragmentLayout {
        FragmentLayout::for_tile(rows, cols, warps).expect("fits m16n8 atoms")
    }

    const ALONE: BodyUse = BodyUse { read: false, written: false, one_store: false };
    const STORED: BodyUse = BodyUse { read: false, written: true, one_store: true };

    #[test]
    fn a_bf16_tile_of_the_fragments_shape_moves_blocks() {
        let frag = accumulator(128, 16, 4);
        for transposed in [false, true] {
            let (r, c) = if transposed { (16, 128) } else { (128, 16) };
            let tile = SharedLayout::choose(r, c, 2);
            let read = matrix_access_choice(MatrixAccess::Read, frag, tile, DType::BF16, transposed, ALONE, false);
            assert_eq!(read, MatrixAccessChoice::Blocks);
        }
        let tile = SharedLayout::choose(16, 128, 2);
        let store = matrix_access_choice(MatrixAccess::Store, frag, tile, DType::F16, true, STORED, false);
        assert_eq!(store, MatrixAccessChoice::Blocks);
    }

    #[test]
    fn each_reason_is_given() {
        use MatrixAccess::{Read, Store};
        let frag = accumulator(128, 16, 4);
        let tile = SharedLayout::choose(16, 128, 2);
        let no = |c| MatrixAccessChoice::PerElement(c);
        let choice = |access, frag, dtype, transposed, body, guarded| {
            matrix_access_choice(access, frag, tile, dtype, transposed, body, guarded)
        };
        assert_eq!(choice(Read, frag, DType::F32, true, ALONE, false), no(NoBlocks::NotSixteenBit));
        let elementwise = FragmentLayout::for_elementwise(128, 16, 4, true, 4).expect("fits");
        assert_eq!(choice(Read, elementwise, DType::BF16, true, ALONE, false), no(NoBlocks::NotAccumulatorLayout));
        assert_eq!(choice(Read, frag, DType::BF16, false, ALONE, false), no(NoBlocks::ShapeDiffers));
        assert_eq!(choice(Read, frag, DType::BF16, true, STORED, false), no(NoBlocks::WrittenInLoop));
        assert_eq!(choice(Read, frag, DType::BF16, true, ALONE, true), no(NoBlocks::Guarded));
        let square = accumulator(16, 16, 1);
        let square_tile = SharedLayout::choose(16, 16, 2);
        let at_index = matrix_access_choice(Store, square, square_tile, DType::BF16, false, STORED, false);
        assert_eq!(at_index, no(NoBlocks::NotTransposed));
        let read_too = BodyUse { read: true, ..STORED };
        assert_eq!(choice(Store, frag, DType::BF16, true, read_too, false), no(NoBlocks::ReadInLoop));
        let two_stores = BodyUse { one_store: false, ..STORED };
        assert_eq!(choice(Store, frag, DType::BF16, true, two_stores, false), no(NoBlocks::NotTheOnlyStore));
    }

    #[test]
    fn blocks_group_two_atoms_an_instruction_where_the_second_is_a_constant_step_away() {
        let groups = |atoms: u32, ni: u32| {
            let (mut atom, mut out) = (0, vec![]);
            while atom < atoms {
                let g = BlockGroup::at(atom, atoms, ni);
                out.push(g);
                atom += g.atoms();
            }
            out
        };
        use BlockGroup::*;
        assert_eq!(groups(4, 2), [AtomsSideBySide, AtomsSideBySide]);
        assert_eq!(groups(3, 1), [AtomsStacked, OneAtom]);
        assert_eq!(groups(3, 3), [OneAtom, OneAtom, OneAtom]);
        // Lanes 16..32 address the second atom: 8 columns on, or 16 rows down.
        assert_eq!(AtomsSideBySide.lane_offsets(24), (8, 8));
        assert_eq!(AtomsStacked.lane_offsets(24), (24, 0));
        assert_eq!(OneAtom.lane_offsets(8), (8, 0));
    }

    #[test]
    fn rows_that_do_not_start_on_16_bytes_are_refused() {
        // 20 columns of bf16: row 1 starts 40 bytes in.
        assert!(rows_in_whole_chunks(SharedLayout::RowMajor { rows: 16, cols: 24 }));
        let tile = SharedLayout::RowMajor { rows: 16, cols: 20 };
        assert!(!rows_in_whole_chunks(tile));
        let frag =
            FragmentLayout { rows: 16, cols: 20, wm: 1, wn: 1, kind: FragmentKind::Tile, vec: 2, lanes_per_row: 4 };
        assert_eq!(
            matrix_access_choice(MatrixAccess::Read, frag, tile, DType::BF16, false, ALONE, false),
            MatrixAccessChoice::PerElement(NoBlocks::RowsNotWholeChunks)
        );
    }
}
