//! TMA copies in the simulated block: `cp.async.bulk.tensor` moves a tensor map's box from
//! global to shared memory through the async proxy and completes its bytes on an mbarrier, or
//! from shared to global memory (a bulk store) in a bulk group its thread waits for.
//!
//! The copy lands when issued; what orders it before a reader is the mbarrier phase it
//! completes (a read without the wait is a race), and its bytes need no `fence.proxy.async`
//! before a `wgmma` reads them.

use super::*;
use crate::tensor_map::{BoxIndex, TensorMap};

/// A TMA copy's box coordinates (inner first) and how many the instruction gave.
#[derive(Clone, Copy)]
pub(super) struct BoxCoords {
    at: BoxIndex<i64>,
    given: usize,
}

/// Marks a parameter value as tensor map number `value & !MAP_TAG` (an address no tensor has).
pub(super) const MAP_TAG: u64 = 0xf << 60;

impl Block<'_> {
    /// The element coordinates of a box, one register per axis of its map (inner first), as
    /// signed 32-bit values (0 past them), and how many were given.
    pub(super) fn box_coords(&self, t: usize, at: &[Reg]) -> BoxCoords {
        let mut coords = [0; crate::tensor_map::MAX_TENSOR_MAP_RANK];
        for (c, r) in coords.iter_mut().zip(at) {
            *c = i64::from(self.get(t, &Src::Reg(*r)) as u32 as i32);
        }
        BoxCoords { at: coords, given: at.len() }
    }

    /// Thread `t` copies the box at element coordinates `at` of the tensor map whose address is
    /// `map` to shared `dst`, completing its bytes on the mbarrier at `mbar`.
    pub(super) fn tma_load(&mut self, t: usize, dst: u64, map: u64, coords: BoxCoords, mbar: u64) -> R<()> {
        let (slot, m) = self.checked_box(map, coords, dst)?;
        let at = coords.at;
        let elem = m.elem_bytes as usize;
        for index in m.box_elements() {
            let bytes = match m.global_offset(at, index) {
                None => vec![0; elem],
                Some(off) => {
                    let off = off as usize;
                    let Some(src) = self.globals[slot].get(off..off + elem) else {
                        return Err(format!(
                            "the tensor map over `{}` reaches byte {off}, past its {} bytes",
                            self.global_names[slot],
                            self.globals[slot].len()
                        ));
                    };
                    src.to_vec()
                }
            };
            let to = dst + u64::from(m.shared_offset(index));
            self.write_shared(t, to, &bytes)?;
            let at = self.check_shared(to, elem)?;
            for s in &mut self.shadow[at..at + elem] {
                s.async_proxy = true;
            }
        }
        self.mbarrier_complete_tx(t, mbar, m.box_bytes())
    }

    /// The tensor map at `map` (its tensor's slot and the map), checked for a box at element
    /// coordinates `at` with its shared side at `shared`.
    fn checked_box(&self, map: u64, coords: BoxCoords, shared: u64) -> R<(usize, TensorMap)> {
        let index = (map & MAP_TAG == MAP_TAG).then_some((map & !MAP_TAG) as usize);
        let Some(&(slot, m)) = index.and_then(|i| self.maps.get(i)) else {
            return Err(format!("TMA copy through {map:#x}, which is no tensor map parameter's address"));
        };
        let align = m.swizzle.atom_bytes().max(128);
        if !shared.is_multiple_of(u64::from(align)) {
            return Err(format!(
                "TMA copy at shared byte {shared}: a box with the {:?} swizzle must start on a {align}-byte boundary",
                m.swizzle
            ));
        }
        if coords.given != m.rank {
            return Err(format!("TMA copy with {} coordinates through a map of {} axes", coords.given, m.rank));
        }
        // A box starts on a 16-byte granule of its row (the H200 faults with an illegal
        // instruction otherwise, `kda-runtime/tests/gpu_hopper.rs`).
        let inner_bytes = coords.at[0] * i64::from(m.elem_bytes);
        if inner_bytes % 16 != 0 {
            return Err(format!(
                "TMA box at inner coordinate {}: {inner_bytes} bytes into the row, not a multiple of 16",
                coords.at[0]
            ));
        }
        self.check_shared(shared, m.box_bytes() as usize)?;
        Ok((slot, m))
    }

    /// Thread `t` stores the shared box at `src` to the box at element coordinates `at` of the
    /// tensor map at `map`: the elements inside the tensor, read through the async proxy (so
    /// each was fenced by its writer, and ordered by a barrier, before this copy). The box is
    /// read until the thread's `cp.async.bulk.wait_group.read` retires the copy's group.
    pub(super) fn tma_store(&mut self, t: usize, map: u64, coords: BoxCoords, src: u64) -> R<()> {
        let (slot, m) = self.checked_box(map, coords, src)?;
        let at = coords.at;
        let elem = m.elem_bytes as usize;
        for index in m.box_elements() {
            let Some(off) = m.global_offset(at, index) else {
                continue;
            };
            let from = src + u64::from(m.shared_offset(index));
            let bytes = self.read_shared(t, from, elem)?;
            let i = self.check_shared(from, elem)?;
            for b in i..i + elem {
                self.check_async_visible(t as u32, b, "a TMA store")?;
            }
            let off = off as usize;
            let Some(dst) = self.globals[slot].get_mut(off..off + elem) else {
                return Err(format!(
                    "the tensor map over `{}` reaches byte {off}, past its end",
                    self.global_names[slot]
                ));
            };
            dst.copy_from_slice(&bytes);
        }
        let start = self.check_shared(src, m.box_bytes() as usize)?;
        self.threads[t].bulk_open.push(start..start + m.box_bytes() as usize);
        self.bulk_pending += 1;
        Ok(())
    }

    /// An error when shared bytes `start..end` are being written while a bulk copy reads them.
    pub(super) fn check_no_bulk_read(&self, start: usize, end: usize) -> R<()> {
        for (reader, th) in self.threads.iter().enumerate() {
            let pending = th.bulk_open.iter().chain(th.bulk_groups.iter().flatten());
            if let Some(r) = pending.into_iter().find(|r| r.start < end && start < r.end) {
                return Err(format!(
                    "shared byte {} written while thread {reader}'s bulk copy still reads it (cp.async.bulk.wait_group.read first)",
                    start.max(r.start)
                ));
            }
        }
        Ok(())
    }

    /// `cp.async.bulk.commit_group` of thread `t`.
    pub(super) fn bulk_commit(&mut self, t: usize) {
        let open = std::mem::take(&mut self.threads[t].bulk_open);
        self.threads[t].bulk_groups.push_back(open);
    }

    /// `cp.async.bulk.wait_group.read n` of thread `t`: its older groups stop reading.
    pub(super) fn bulk_wait_read(&mut self, t: usize, n: u32) {
        while self.threads[t].bulk_groups.len() > n as usize {
            let done = self.threads[t].bulk_groups.pop_front().unwrap_or_default();
            self.bulk_pending -= done.len();
        }
    }

    /// An error when thread `t` exits while a bulk copy of its still reads shared memory.
    pub(super) fn check_no_bulk_reads_at_exit(&self, t: usize) -> R<()> {
        let th = &self.threads[t];
        if th.bulk_open.is_empty() && th.bulk_groups.is_empty() {
            return Ok(());
        }
        Err(format!(
            "thread {t} exits while its bulk copies still read shared memory (cp.async.bulk.wait_group.read 0 first)"
        ))
    }
}
