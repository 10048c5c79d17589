//! TMA copies in the simulated block: `cp.async.bulk.tensor` moves a tensor map's box from
//! global to shared memory through the async proxy and completes its bytes on an mbarrier.
//!
//! The copy lands when issued; what orders it before a reader is the mbarrier phase it
//! completes (a read without the wait is a race), and its bytes need no `fence.proxy.async`
//! before a `wgmma` reads them.

use super::*;

/// Marks a parameter value as tensor map number `value & !MAP_TAG` (an address no tensor has).
pub(super) const MAP_TAG: u64 = 0xf << 60;

impl Block<'_> {
    /// Thread `t` copies the box at element coordinates `at` of the tensor map whose address is
    /// `map` to shared `dst`, completing its bytes on the mbarrier at `mbar`.
    pub(super) fn tma_load(&mut self, t: usize, dst: u64, map: u64, at: [i32; 2], mbar: u64) -> R<()> {
        let index = (map & MAP_TAG == MAP_TAG).then_some((map & !MAP_TAG) as usize);
        let Some(&(slot, m)) = index.and_then(|i| self.maps.get(i)) else {
            return Err(format!("TMA copy through {map:#x}, which is no tensor map parameter's address"));
        };
        let align = m.swizzle.atom_bytes().max(128);
        if !dst.is_multiple_of(u64::from(align)) {
            return Err(format!(
                "TMA copy to shared byte {dst}: a box with the {:?} swizzle must start on a {align}-byte boundary",
                m.swizzle
            ));
        }
        // A box starts on a 16-byte granule of its row (the H200 faults with an illegal
        // instruction otherwise, `kda-runtime/tests/gpu_hopper.rs`).
        let inner_bytes = i64::from(at[0]) * i64::from(m.elem_bytes);
        if inner_bytes % 16 != 0 {
            return Err(format!(
                "TMA box at inner coordinate {}: {inner_bytes} bytes into the row, not a multiple of 16",
                at[0]
            ));
        }
        self.check_shared(dst, m.box_bytes() as usize)?;
        let elem = m.elem_bytes as usize;
        for outer in 0..m.box_extent[1] {
            for inner in 0..m.box_extent[0] {
                let bytes = match m.global_offset([i64::from(at[0]), i64::from(at[1])], inner, outer) {
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
                let to = dst + u64::from(m.shared_offset(inner, outer));
                self.write_shared(t, to, &bytes)?;
                let at = self.check_shared(to, elem)?;
                for s in &mut self.shadow[at..at + elem] {
                    s.async_proxy = true;
                }
            }
        }
        self.mbarrier_complete_tx(t, mbar, m.box_bytes())
    }
}
