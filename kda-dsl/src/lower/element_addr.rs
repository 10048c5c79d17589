//! Shared-memory element addresses in unrolled element loops, split into a per-thread part
//! computed once and a per-element constant.
//!
//! A `parallel` body (and a shared tile's element loop) is unrolled over the thread's elements,
//! whose indices are a per-thread base plus a constant: a pass moved down whole rows, a fragment
//! slot. Where the constant's bits are disjoint from every value the base can take, the sum is
//! a bitwise or, and the swizzled offset splits because the chunk XOR is GF(2)-linear
//! ([`crate::layout::ChunkXor`]): `offset(r0 | kr, c0 | kc) = (offset(r0, c0) ^ x) + k`, with `x` and `k` known
//! when lowering. Each element then costs at most one XOR and an add that ptxas folds into the
//! access's immediate offset, instead of recomputing the swizzle from its indices.
//!
//! The plan ([`split_offset`]) is a function of the layout and the constants alone, tested
//! against [`SharedLayout::offset`]; the lowering caches each thread part where the register
//! that holds it dominates every later use (see [`Lower::scoped_addresses`]).

use super::Lower;
use crate::layout::{FragmentKind, FragmentLayout, SharedLayout, SwizzleParams};
use crate::thread_ir::*;
use crate::tile::BufId;
use std::collections::HashMap;

/// An index known as `base + off` with `off & base_bits == 0`, where `base_bits` has every bit
/// any value of the base can have: the sum is then also `base | off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitIndex {
    /// The per-thread part, written once (a fresh register that nothing reassigns).
    pub(crate) base: Reg,
    /// Every bit a value of `base` can have.
    pub(crate) base_bits: u32,
    /// The constant part.
    pub(crate) off: u32,
}

/// The per-element constant of a split byte offset: `thread_part ^ xor + add`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConstantPart {
    /// XORed into the thread part's 16-byte-chunk bits (0 in a row-major tile).
    pub xor: u32,
    /// Added after.
    pub add: u32,
}

/// One side (row or column) of an element index, as the split needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IndexSide {
    /// Known now.
    Constant(u32),
    /// `base | off`.
    Split(SplitIndex),
}

impl IndexSide {
    fn base(&self) -> Option<Reg> {
        match self {
            IndexSide::Constant(_) => None,
            IndexSide::Split(s) => Some(s.base),
        }
    }

    fn off(&self) -> u32 {
        match self {
            IndexSide::Constant(c) => *c,
            IndexSide::Split(s) => s.off,
        }
    }

    /// Every bit the base can have (none for a constant).
    fn base_bits(&self) -> u32 {
        match self {
            IndexSide::Constant(_) => 0,
            IndexSide::Split(s) => s.base_bits,
        }
    }
}

/// The constant part of the byte offset of element `(r0 | kr, c0 | kc)` of `layout`
/// (`elem_bytes` per element) over the thread part `offset(r0, c0)`. The caller guarantees
/// `r0 & kr == 0` and `c0 & kc == 0` for every base value.
///
/// A swizzled offset is `row · row_bytes + 16 · phys + elem_bytes · (col % chunk)`, three
/// bit-disjoint terms, with `phys = (col / chunk) ^ xor((row / rpl) & mask)`. Shifts, masks
/// and the XOR distribute over a disjoint or, so `phys = phys(r0, c0) ^ phys_k` where
/// `phys_k = (kc / chunk) ^ xor((kr / rpl) & mask)`, and `16 · phys_k` touches only the
/// middle term's bits.
pub(crate) fn split_offset(layout: SharedLayout, elem_bytes: u32, kr: u32, kc: u32) -> ConstantPart {
    let (_, cols) = layout.shape();
    match layout.swizzle_params() {
        None => ConstantPart { xor: 0, add: (kr * cols + kc) * elem_bytes },
        Some(SwizzleParams { chunk, rows_per_line, mask, xor, slab, slab_elems }) => {
            // A slab's index and a row's offset in it are further bit-disjoint terms (slabs are a
            // power of two of columns).
            let phys_k = ((kc % slab) / chunk) ^ xor.apply((kr / rows_per_line) & mask, mask);
            let add = (kc / slab) * slab_elems + kr * slab + kc % chunk;
            ConstantPart { xor: 16 * phys_k, add: add * elem_bytes }
        }
    }
}

/// A shared address [`Lower::split_shared_addr`] made, by its parts: `base + (thread ^ xor) +
/// add`. Two with the same base, thread part and XOR lie `add` apart, so held 16-bit stores to
/// both halves of one 4-byte word may go out as one (`deferred_stores.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitAddr {
    /// The buffer's shared base.
    pub(crate) base: Reg,
    /// The thread part of the offset, in bytes.
    pub(crate) thread: Reg,
    /// XORed into the thread part (16-byte chunk bits).
    pub(crate) xor: u32,
    /// Added after, in bytes.
    pub(crate) add: u32,
    /// Whether `base + (thread ^ xor)` is a multiple of 4 bytes for every thread.
    pub(crate) word_aligned: bool,
}

impl SplitAddr {
    /// Whether `other` is the 16-bit element right after `self` in the same 4-byte word.
    pub(crate) fn pairs_with(&self, other: &SplitAddr) -> bool {
        self.word_aligned
            && self.add.is_multiple_of(4)
            && (other.base, other.thread, other.xor) == (self.base, self.thread, self.xor)
            && other.add == self.add + 2
    }

    /// Whether a store at `other` (of at most 4 bytes) may touch the word `self` starts, as
    /// far as the parts tell: another base or thread part may be anywhere.
    pub(crate) fn may_touch_word_of(&self, other: &SplitAddr) -> bool {
        (other.base, other.thread, other.xor) != (self.base, self.thread, self.xor)
            || (other.add + 4 > self.add && other.add < self.add + 4)
    }
}

/// Whether every thread part `offset(r, c)` (in bytes) of `layout` is a multiple of 4 bytes,
/// over every row and column base the bits allow; false when there are too many to check.
pub(crate) fn thread_parts_word_aligned(layout: SharedLayout, elem_bytes: u32, row_bits: u32, col_bits: u32) -> bool {
    if row_bits.count_ones() + col_bits.count_ones() > 12 || !(layout.size() * elem_bytes).is_multiple_of(4) {
        return false;
    }
    let (rows, cols) = layout.shape();
    let cs = values_under(col_bits);
    values_under(row_bits)
        .into_iter()
        .filter(|&r| r < rows)
        .all(|r| cs.iter().filter(|&&c| c < cols).all(|&c| (layout.offset(r, c) * elem_bytes).is_multiple_of(4)))
}

/// A thread part of a split shared offset.
#[derive(Clone, Copy, Debug)]
struct ThreadPart {
    /// `offset(r0, c0)` in bytes.
    bytes: Reg,
    /// Whether it is a multiple of 4 for every thread.
    word_aligned: bool,
}

/// Every value whose bits lie within `bits` (0 included), in increasing order.
fn values_under(bits: u32) -> Vec<u32> {
    let mut v = vec![0];
    let mut x = bits & bits.wrapping_neg();
    while x != 0 {
        v.push(x);
        x = x.wrapping_sub(bits) & bits;
    }
    v
}

/// Per-thread parts cached while their registers dominate the code being lowered.
#[derive(Clone, Default)]
pub(crate) struct ThreadOffsets {
    /// `offset(r0, c0)` by layout, element size and bases.
    offsets: HashMap<(SharedLayout, u32, Option<Reg>, Option<Reg>), ThreadPart>,
    /// `shared_base + offset`, by base register and thread part.
    addresses: HashMap<(Reg, Reg), Reg>,
    /// The parts of each shared address made from them, by its register (held 16-bit stores
    /// pair by them: `deferred_stores.rs`).
    address_parts: HashMap<Reg, SplitAddr>,
    /// Integer results by operation and operands, so that an index every element computes
    /// alike (`nv - 1`) is one register, whose thread part is then cached once.
    values: HashMap<(BinKind, Ty, Operand, Operand), Reg>,
}

/// An operand of a cached integer operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Operand {
    Reg(Reg),
    Imm(i64),
}

impl Operand {
    fn of(s: Src) -> Option<Operand> {
        match s {
            Src::Reg(r) => Some(Operand::Reg(r)),
            Src::Imm(v) => Some(Operand::Imm(v)),
            Src::F32(_) => None,
        }
    }

    fn is(&self, r: Reg) -> bool {
        *self == Operand::Reg(r)
    }
}

/// Every bit the row and the column base of fragment layout `l` can have, over `warps` warps
/// (the bases [`Lower::frag_base`] computes: a slot's coordinates less its constant part).
pub(crate) fn fragment_base_bits(l: FragmentLayout, warps: u32) -> (u32, u32) {
    let tile = FragmentLayout { kind: FragmentKind::Tile, ..l };
    let c = tile.slot_coord(0);
    let (mut rows, mut cols) = (0, 0);
    for w in 0..warps {
        for lane in 0..32 {
            let (r, col) = tile.coords(w, lane, 0);
            rows |= r - c.row_off;
            cols |= col - c.col_off;
        }
    }
    (rows, cols)
}

/// Every bit of the values `0 .. n`.
pub(crate) fn bits_below(n: u32) -> u32 {
    n.max(1).next_power_of_two() - 1
}

impl Lower<'_> {
    /// `base + off` in a fresh register (even for `off == 0`, so that no variable is ever bound
    /// to the base itself), recorded as a split when `off` is disjoint from `base_bits`.
    pub(crate) fn split_index(&mut self, base: Reg, base_bits: u32, off: u32) -> Src {
        let d = if off == 0 {
            let d = self.em.reg(RegClass::B32);
            self.em.emit(Op::Mov { ty: Ty::U32, d, a: Src::Reg(base) });
            d
        } else {
            self.em.bin(BinKind::Add, Ty::S32, RegClass::B32, base, Src::Imm(off as i64))
        };
        if off & base_bits == 0 {
            self.split_indices.insert(d, SplitIndex { base, base_bits, off });
        }
        Src::Reg(d)
    }

    /// The split recorded for `r`, if any.
    pub(crate) fn split_of(&self, r: Reg) -> Option<SplitIndex> {
        self.split_indices.get(&r).copied()
    }

    /// A constant, a recorded split, or any other register as a base of its own (any bits, no
    /// constant): its thread part is cached under it until it is written again
    /// ([`Self::forget_cached`]).
    fn index_side(&self, s: Src) -> Option<IndexSide> {
        match s {
            Src::Imm(v) => u32::try_from(v).ok().map(IndexSide::Constant),
            Src::Reg(r) => Some(IndexSide::Split(self.split_indices.get(&r).copied().unwrap_or(SplitIndex {
                base: r,
                base_bits: u32::MAX,
                off: 0,
            }))),
            Src::F32(_) => None,
        }
    }

    /// `op` of integer operands `a` and `b` into a register: inside an element loop, the
    /// register an earlier element computed it into (computed for every thread, as thread
    /// parts are: an if-converted arm may ask first); `None` for operands it does not cache.
    pub(crate) fn cached_int_op(&mut self, op: BinKind, ty: Ty, class: RegClass, a: Src, b: Src) -> Option<Reg> {
        self.thread_offsets.as_ref()?;
        if !matches!(
            op,
            BinKind::Add
                | BinKind::Sub
                | BinKind::Mul
                | BinKind::And
                | BinKind::Or
                | BinKind::Xor
                | BinKind::Min
                | BinKind::Max
        ) {
            return None;
        }
        let key = (op, ty, Operand::of(a)?, Operand::of(b)?);
        if let Some(r) = self.cached(|c| c.values.get(&key).copied()) {
            return Some(r);
        }
        let guard = self.em.guard.take();
        let d = self.em.bin(op, ty, class, a, b);
        self.em.guard = guard;
        self.cache_mut().values.insert(key, d);
        Some(d)
    }

    /// Forgets everything cached under `r`, which is about to be written: its split, the
    /// thread parts keyed by it and the integer results computed from it.
    pub(crate) fn forget_cached(&mut self, r: Reg) {
        self.split_indices.remove(&r);
        if let Some(c) = self.thread_offsets.as_mut() {
            c.offsets.retain(|(_, _, rb, cb), v| *rb != Some(r) && *cb != Some(r) && v.bytes != r);
            c.addresses.retain(|(b, o), v| *b != r && *o != r && *v != r);
            c.address_parts.retain(|a, p| *a != r && p.base != r && p.thread != r);
            c.values.retain(|(_, _, a, b), v| !a.is(r) && !b.is(r) && *v != r);
        }
    }

    /// The address of shared element `(row, col)` of buffer `b` from a cached thread part and a
    /// constant, inside an element loop, when both indices are constants or recorded splits
    /// (not both constants).
    pub(crate) fn split_shared_addr(&mut self, b: BufId, row: Src, col: Src) -> Option<Reg> {
        // Outside element loops thread parts are not cached: tile operations branch inside.
        self.thread_offsets.as_ref()?;
        let (rs, cs) = (self.index_side(row)?, self.index_side(col)?);
        if rs.base().is_none() && cs.base().is_none() {
            return None;
        }
        let Some(Src::Reg(base)) = self.shared_base[b] else { return None };
        let layout = self.p.shared(b);
        let esize = self.def().buffers[b].dtype.size_bytes() as u32;
        let part = split_offset(layout, esize, rs.off(), cs.off());
        // Computed for every thread, as fragment bases are: an if-converted arm may ask first.
        let guard = self.em.guard.take();
        let key = (layout, esize, rs.base(), cs.base());
        let ThreadPart { bytes: offset, word_aligned } = match self.cached(|c| c.offsets.get(&key).copied()) {
            Some(thread) => thread,
            None => {
                let to_src = |b: Option<Reg>| b.map(Src::Reg).unwrap_or(Src::Imm(0));
                let elems = self.element_offset(b, to_src(rs.base()), to_src(cs.base()));
                let bytes = self.em.mul32(elems, Src::Imm(esize as i64));
                let bytes = self.em.to_reg(bytes, RegClass::B32, Ty::U32);
                let word_aligned = thread_parts_word_aligned(layout, esize, rs.base_bits(), cs.base_bits());
                let thread = ThreadPart { bytes, word_aligned };
                self.cache_mut().offsets.insert(key, thread);
                thread
            }
        };
        let at = if part.xor == 0 {
            let at = match self.cached(|c| c.addresses.get(&(base, offset)).copied()) {
                Some(r) => r,
                None => {
                    let a = self.em.add32(base, offset);
                    let r = self.em.to_reg(a, RegClass::B32, Ty::U32);
                    self.cache_mut().addresses.insert((base, offset), r);
                    r
                }
            };
            self.em.guard = guard;
            Src::Reg(at)
        } else {
            self.em.guard = guard;
            let x = self.em.bin(BinKind::Xor, Ty::B32, RegClass::B32, offset, Src::Imm(part.xor as i64));
            self.em.add32(base, x)
        };
        let addr = self.em.add32(at, Src::Imm(part.add as i64));
        let addr = self.em.to_reg(addr, RegClass::B32, Ty::U32);
        let parts = SplitAddr { base, thread: offset, xor: part.xor, add: part.add, word_aligned };
        self.cache_mut().address_parts.insert(addr, parts);
        Some(addr)
    }

    /// The parts of shared address `addr`, where [`Self::split_shared_addr`] made it in the
    /// element loop being lowered.
    pub(crate) fn split_addr_parts(&self, addr: Reg) -> Option<SplitAddr> {
        self.thread_offsets.as_ref()?.address_parts.get(&addr).copied()
    }

    fn cached<T>(&self, f: impl FnOnce(&ThreadOffsets) -> T) -> T {
        f(self.thread_offsets.as_ref().expect("inside an element loop"))
    }

    fn cache_mut(&mut self) -> &mut ThreadOffsets {
        self.thread_offsets.as_mut().expect("inside an element loop")
    }

    /// Lowers the element loop `f` with thread parts cached across its elements, and forgets
    /// them after: they need not dominate what follows.
    pub(crate) fn element_loop<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let saved = self.thread_offsets.replace(ThreadOffsets::default());
        let r = f(self);
        self.thread_offsets = saved;
        r
    }

    /// Lowers `f` with the thread parts cached so far, and forgets those it adds: they are
    /// defined inside a branch arm, a loop body or an element loop, and need not dominate
    /// what follows.
    pub(crate) fn scoped_addresses<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        if self.thread_offsets.is_none() {
            return f(self);
        }
        let saved = self.thread_offsets.clone();
        let r = f(self);
        self.thread_offsets = saved;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_under_are_every_pattern_of_the_bits() {
        for bits in [0, 1, 0b110, 0b1011, 0b1111_0000] {
            let want: Vec<u32> = (0..=bits).filter(|v| v & !bits == 0).collect();
            assert_eq!(values_under(bits), want, "{bits:#b}");
        }
    }

    /// A fragment's thread parts (rows from `lane / 4`, even columns from `2 (lane % 4)`) are
    /// whole 4-byte words in a swizzled bf16 tile; an odd column base or a row of 34 bytes is not.
    #[test]
    fn thread_parts_are_word_aligned_where_every_base_is() {
        let swizzled = SharedLayout::choose(16, 128, 2);
        assert!(thread_parts_word_aligned(swizzled, 2, 0b111, 0b110));
        assert!(!thread_parts_word_aligned(swizzled, 2, 0b111, 0b111));
        let odd_rows = SharedLayout::RowMajor { rows: 16, cols: 17 };
        assert!(thread_parts_word_aligned(odd_rows, 2, 0, 0b110));
        assert!(!thread_parts_word_aligned(odd_rows, 2, 0b1, 0b110));
        assert!(thread_parts_word_aligned(odd_rows, 4, 0b1, 0b111), "f32 elements are words");
    }

    #[test]
    fn split_offsets_match_the_layout() {
        let layouts = [
            (SharedLayout::choose(16, 128, 2), 2),
            (SharedLayout::choose(16, 128, 4), 4),
            (SharedLayout::choose(64, 32, 2), 2),
            (SharedLayout::choose(32, 16, 2), 2),
            (SharedLayout::choose(128, 16, 4), 4),
            (SharedLayout::choose(16, 16, 2), 2),
            (SharedLayout::choose(16, 8, 4), 4),
            (SharedLayout::choose(1, 128, 4), 4),
            (SharedLayout::canonical(64, 128, 2).expect("slabs"), 2),
            (SharedLayout::canonical(16, 256, 2).expect("slabs"), 2),
            (SharedLayout::canonical(8, 64, 4).expect("slabs"), 4),
            (SharedLayout::canonical(32, 32, 2).expect("one line"), 2),
        ];
        for (l, esize) in layouts {
            let (rows, cols) = l.shape();
            // Bases of every width, and every constant disjoint from them.
            for (row_bits, col_bits) in [(0, 0), (1, 0), (1, 127), (7, 6), (15, 3), (0, 127), (3, 7)] {
                let (row_bits, col_bits) = (row_bits & (rows - 1), col_bits & (cols - 1));
                for kr in (0..rows).filter(|k| k & row_bits == 0) {
                    for kc in (0..cols).filter(|k| k & col_bits == 0) {
                        let part = split_offset(l, esize, kr, kc);
                        for r0 in values_under(row_bits) {
                            for c0 in values_under(col_bits) {
                                let whole = l.offset(r0 | kr, c0 | kc) * esize;
                                let thread = l.offset(r0, c0) * esize;
                                assert_eq!((thread ^ part.xor) + part.add, whole, "{l} at ({r0} | {kr}, {c0} | {kc})");
                            }
                        }
                    }
                }
            }
        }
    }
}
