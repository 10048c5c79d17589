//! A `parallel` body's shared stores held back until the thread's last element: its loads of
//! every element then come before the first store.
//!
//! A thread runs a `parallel` body once for each element it owns, one after the other. The
//! assembler cannot tell two shared tiles apart (their addresses are swizzled offsets of one
//! base), so a shared store keeps it from moving any later shared load above it: with the
//! stores in place, each element waits for its own loads, and a body that loads, computes and
//! stores is as slow as its chain times the elements. The elements of a `parallel` loop are
//! independent, so a store may wait until the thread's last element when nothing in the body
//! reads that tile and the store is not under a condition (a branch around it would be lost).
//! The values stored, the addresses and their order are the same; only the schedule changes.
//!
//! Held 16-bit stores to the two halves of one 4-byte word (a fragment's adjacent columns)
//! then go out as one store of both, packed by one conversion, when their addresses' parts
//! prove it ([`SplitAddr::pairs_with`]) and no held store between them may touch that word: the
//! same bytes get the same values, in half the stores.

use super::element_addr::SplitAddr;
use super::{class_of, ty_of, Lower, V};
use crate::analysis::tile_access::tile_access;
use crate::dtype::DType;
use crate::passes::{BufLayout, TileProgram};
use crate::thread_ir::*;
use crate::tile::*;
use std::collections::HashSet;

/// Stores held at most: a thread's elements of the chunk kernel's bodies (8 to 16) wait whole,
/// a fragment of 64 elements a thread does not hold 64 more values live.
const MAX_HELD: usize = 16;

/// The shared stores of the elements lowered so far, waiting for the thread's last element.
pub(crate) struct DeferredStores {
    /// The tiles whose stores wait.
    tiles: HashSet<BufId>,
    /// Each store, in program order.
    pending: Vec<HeldStore>,
}

/// One held store.
struct HeldStore {
    /// The tile stored to.
    tile: BufId,
    /// Its shared address.
    addr: Reg,
    /// The tile's element type.
    dt: DType,
    /// The value.
    v: V,
    /// The address's parts, where `split_shared_addr` made it.
    parts: Option<SplitAddr>,
}

/// The shared tiles whose stores in `body` may wait for the thread's last element: stored only
/// by statements of the body itself (not under an `if` or a loop) and read nowhere in it.
pub(crate) fn deferrable_tiles(p: &TileProgram, body: &[Stmt]) -> HashSet<BufId> {
    let (mut stored, mut kept) = (HashSet::new(), HashSet::new());
    for s in body {
        let access = tile_access(s);
        kept.extend(access.reads);
        match &s.kind {
            StmtKind::Store(b, ..) => {
                stored.insert(*b);
            }
            // Written under a condition or in a loop, or by anything else: stores stay.
            _ => kept.extend(access.writes),
        }
    }
    stored.into_iter().filter(|b| matches!(p.layouts[*b], BufLayout::Shared(_)) && !kept.contains(b)).collect()
}

impl Lower<'_> {
    /// Lowers `f` (a thread's elements of a `parallel` body, with no branch around any of
    /// them) with the shared stores to `tiles` held back, then emits them in order.
    pub(crate) fn with_deferred_stores<T>(&mut self, tiles: HashSet<BufId>, f: impl FnOnce(&mut Self) -> T) -> T {
        if tiles.is_empty() {
            return f(self);
        }
        let outer = self.deferred_stores.replace(DeferredStores { tiles, pending: vec![] });
        let r = f(self);
        let held = std::mem::replace(&mut self.deferred_stores, outer).map(|d| d.pending).unwrap_or_default();
        self.store_held(held);
        r
    }

    /// Emits held stores, in order, each 16-bit one with the store to the other half of its word
    /// where [`word_partner`] finds one (that store moves up to it).
    fn store_held(&mut self, held: Vec<HeldStore>) {
        let mut stored = vec![false; held.len()];
        for i in 0..held.len() {
            if stored[i] {
                continue;
            }
            stored[i] = true;
            let h = &held[i];
            match word_partner(&held, &stored, i) {
                Some(j) => {
                    stored[j] = true;
                    let half = if h.dt == DType::BF16 { Ty::BF16 } else { Ty::F16 };
                    let lo = self.em.to_reg(h.v.s, RegClass::F32, Ty::F32);
                    let hi = self.em.to_reg(held[j].v.s, RegClass::F32, Ty::F32);
                    let d = self.em.reg(RegClass::B32);
                    self.em.emit(Op::PackHalf2 { half, d, hi: Src::Reg(hi), lo: Src::Reg(lo) });
                    let vals = vec![Src::Reg(d)];
                    self.em.emit(Op::St { space: Space::Shared, ty: Ty::B32, addr: h.addr, offset: 0, vals });
                }
                None => self.store_mem(Space::Shared, h.addr, h.dt, h.v),
            }
        }
    }

    /// `v` in a register of its own (a constant as it is), to store after the thread's later
    /// elements: the body may assign the value's register again for a later element.
    pub(crate) fn held_value(&mut self, v: V) -> V {
        match v.s {
            Src::Reg(r) => {
                let held = self.em.reg(class_of(v.ty));
                self.em.emit(Op::Mov { ty: ty_of(v.ty), d: held, a: Src::Reg(r) });
                V { s: Src::Reg(held), ty: v.ty }
            }
            _ => v,
        }
    }

    /// Holds back a store of `v` to shared tile `b` at `addr` if `b`'s stores wait; false if
    /// the caller is to store it now.
    pub(crate) fn defer_store(&mut self, b: BufId, addr: Reg, dt: DType, v: V) -> bool {
        if !self.deferred_stores.as_ref().is_some_and(|d| d.tiles.contains(&b)) {
            return false;
        }
        let v = self.held_value(v);
        // Each held store keeps its value (and address) live: past a bound, store them rather
        // than spill.
        let parts = self.split_addr_parts(addr);
        let full = self.deferred_stores.as_mut().and_then(|d| {
            d.pending.push(HeldStore { tile: b, addr, dt, v, parts });
            (d.pending.len() >= MAX_HELD).then(|| std::mem::take(&mut d.pending))
        });
        if let Some(held) = full {
            self.store_held(held);
        }
        true
    }
}

/// The held store after `i` to the other half of `i`'s 4-byte word, which may move up to `i`:
/// both 16-bit stores of f32 values to one tile, at addresses whose parts prove the pair, and
/// no store left between them that may touch that word (another tile's stores cannot: tiles
/// written in one body are live together, so apart).
fn word_partner(held: &[HeldStore], stored: &[bool], i: usize) -> Option<usize> {
    let h = &held[i];
    let halves = matches!(h.dt, DType::BF16 | DType::F16) && h.v.ty == DType::F32;
    let first = h.parts.filter(|_| halves)?;
    for (j, k) in held.iter().enumerate().skip(i + 1) {
        if stored[j] {
            continue;
        }
        let second = k.parts.filter(|p| k.tile == h.tile && k.dt == h.dt && k.v.ty == h.v.ty && first.pairs_with(p));
        if second.is_some() {
            return Some(j);
        }
        let may_touch = k.tile == h.tile && k.parts.is_none_or(|p| first.may_touch_word_of(&p));
        if may_touch {
            return None;
        }
    }
    None
}
