//! The simulated block's memory: global tensors (bounds-checked per buffer) and shared memory
//! (bounds, uninitialized reads and races between barriers, tracked per byte).

use super::*;

impl Block<'_> {
    pub(super) fn global_slice(&mut self, addr: u64, n: usize) -> R<(usize, usize)> {
        let buf = (addr >> GLOBAL_SHIFT) as usize;
        let off = (addr & ((1u64 << GLOBAL_SHIFT) - 1)) as usize;
        if buf == 0 || buf > self.globals.len() {
            return Err(format!("global access at {addr:#x} is in no tensor"));
        }
        let len = self.globals[buf - 1].len();
        if off + n > len {
            return Err(format!(
                "global access out of bounds: tensor `{}` byte {off}..{} of {len}",
                self.global_names[buf - 1],
                off + n
            ));
        }
        if !off.is_multiple_of(n.min(16)) {
            return Err(format!("misaligned {n}-byte global access at byte {off} of `{}`", self.global_names[buf - 1]));
        }
        Ok((buf - 1, off))
    }

    /// Thread `t`'s read of `n` global bytes at `addr`.
    pub(super) fn read_global(&mut self, t: usize, addr: u64, n: usize) -> R<Vec<u8>> {
        let (b, off) = self.global_slice(addr, n)?;
        self.order_global(t, b, off, n, flags::GlobalAccess::Read)?;
        Ok(self.globals[b][off..off + n].to_vec())
    }

    /// Thread `t`'s write of `bytes` at global address `addr`.
    pub(super) fn write_global(&mut self, t: usize, addr: u64, bytes: &[u8]) -> R<()> {
        let (b, off) = self.global_slice(addr, bytes.len())?;
        self.order_global(t, b, off, bytes.len(), flags::GlobalAccess::Write)?;
        self.globals[b][off..off + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// The index into the block's shared bytes (the offset from [`SHARED_BASE`]) of an
    /// `n`-byte access at shared address `addr`, checked for bounds and alignment.
    pub(super) fn check_shared(&self, addr: u64, n: usize) -> R<usize> {
        let Some(a) = addr.checked_sub(SHARED_BASE).map(|a| a as usize).filter(|_| addr <= u64::from(u32::MAX)) else {
            return Err(format!("shared access at address {addr}, outside the block's shared memory"));
        };
        if a + n > self.shared.len() {
            return Err(format!("shared access out of bounds: bytes {a}..{} of {}", a + n, self.shared.len()));
        }
        if !a.is_multiple_of(n.min(16)) {
            return Err(format!("misaligned {n}-byte shared access at {a}"));
        }
        Ok(a)
    }

    /// Whether every read recorded in `s` is ordered before an access that `after(w, epoch)`
    /// says comes after what cluster warp `w` did when its block had released `epoch` (reads
    /// are always by this block's threads).
    fn reads_ordered_by(&self, s: &Shadow, after: impl Fn(usize, u32) -> bool) -> bool {
        let read_before = |w: usize| after(self.group_warp(w), s.read_epoch);
        match s.reader {
            NONE => true,
            MANY => (0..32).filter(|w| s.reader_warps & (1 << w) != 0).all(read_before),
            r => read_before(r as usize / 32),
        }
    }

    /// Whether every read recorded in `s` is ordered before what the warp that knows `known`
    /// (per warp of the cluster: [`Block::knowledge`]) does now.
    pub(super) fn reads_ordered_for(&self, s: &Shadow, known: &[u32]) -> bool {
        self.reads_ordered_by(s, |w, epoch| known[w] > epoch)
    }

    /// Whether every read recorded in `s` is ordered before what thread `me` does now.
    fn reads_ordered(&self, s: &Shadow, me: u32) -> bool {
        s.reader == me || self.reads_ordered_by(s, |w, epoch| self.barrier_between_warps(w, epoch, me as usize / 32))
    }

    pub(super) fn read_shared(&mut self, t: usize, addr: u64, n: usize) -> R<Vec<u8>> {
        let a = self.check_shared(addr, n)?;
        let me = t as u32;
        for i in a..a + n {
            let s = self.shadow[i];
            self.check_no_copy_in_flight(i, me, "read")?;
            if !s.written {
                return Err(format!("read of shared byte {i}, which nothing wrote"));
            }
            if s.mbarrier {
                return Err(format!("shared byte {i} belongs to an mbarrier; only mbarrier instructions read it"));
            }
            if !self.ordered(s.writer, s.write_epoch, me) {
                return Err(format!(
                    "race: shared byte {i} written by {} and read by thread {me} with {} between",
                    self.describe(s.writer),
                    self.missing_order(s.writer)
                ));
            }
        }
        self.record_read(t, a, n);
        Ok(self.shared[a..a + n].to_vec())
    }

    /// Notes thread `t`'s read of shared bytes `a..a + n`, which later writes must be ordered
    /// after. Reads ordered before this one need no checking against later writes: only the
    /// reads that might still race are kept.
    pub(super) fn record_read(&mut self, t: usize, a: usize, n: usize) {
        let me = t as u32;
        for i in a..a + n {
            let s = self.shadow[i];
            let (reader, reader_warps) = if s.reader == me || self.reads_ordered(&s, me) {
                (me, 0)
            } else {
                let warps = match s.reader {
                    MANY => s.reader_warps,
                    r => 1 << (r / 32),
                };
                (MANY, warps | 1 << (me / 32))
            };
            self.shadow[i] = Shadow { reader, reader_warps, read_epoch: self.released, ..s };
        }
    }

    /// Checks that shared byte `i`, which the async proxy is about to read (`what`: a `wgmma`
    /// or a TMA store) for thread `reader`, is visible to it: written by the async proxy, or
    /// by a thread that fenced the proxies after the write (its first `fence.proxy.async` after
    /// it) before a barrier ordering that fence before `reader`.
    pub(super) fn check_async_visible(&self, reader: u32, i: usize, what: &str) -> R<()> {
        let s = self.shadow[i];
        self.check_no_copy_in_flight(i, reader, &format!("read by {what}"))?;
        if s.async_proxy || !s.written {
            return Ok(());
        }
        let Some(writer) =
            (s.writer as usize).checked_sub(self.group_thread(0) as usize).filter(|w| *w < self.threads.len())
        else {
            return Err(format!(
                "{what} reads shared byte {i}, which {} stored: the async proxy's view of another block's stores \
                 is not simulated",
                self.describe(s.writer)
            ));
        };
        let fences = &self.threads[writer].proxy_fences;
        let Some(&(_, fence_epoch)) = fences.iter().find(|(clock, _)| *clock >= s.write_clock) else {
            return Err(format!(
                "{what} reads shared byte {i}, which thread {writer} wrote with no fence.proxy.async after the write"
            ));
        };
        if !self.ordered(s.writer, fence_epoch, reader) {
            return Err(format!(
                "{what} reads shared byte {i}, but no barrier orders thread {writer}'s fence.proxy.async before it"
            ));
        }
        Ok(())
    }

    /// A write to shared bytes `start..end` while one of the block's bulk copies to another
    /// block still reads them (it lands at the end of the round) is an error.
    pub(super) fn check_not_copied_out(&self, start: usize, end: usize) -> R<()> {
        match self.copying_out.iter().find(|r| r.start < end && start < r.end) {
            Some(r) => Err(format!(
                "shared byte {} written while a bulk copy to another block of the cluster still reads it",
                start.max(r.start)
            )),
            None => Ok(()),
        }
    }

    /// Thread `t`'s `cp.async` copies (destination, bytes) land in shared memory, in order.
    pub(super) fn land_copies(&mut self, t: usize, copies: Vec<(u32, [u8; 16])>) -> R<()> {
        for (d, data) in copies {
            let a = self.check_shared(u64::from(d), data.len())?;
            for s in &mut self.shadow[a..a + data.len()] {
                s.copy_in_flight = false;
            }
            self.write_shared(t, u64::from(d), &data)?;
        }
        Ok(())
    }

    /// Marks the 16 shared bytes from `a` as a `cp.async`'s destination until it lands; an
    /// error where another copy into them is still in flight.
    pub(super) fn copy_issued(&mut self, a: usize) -> R<()> {
        for i in a..a + 16 {
            if self.shadow[i].copy_in_flight {
                return Err(format!("race: two cp.async copies into shared byte {i} in flight at once"));
            }
            self.shadow[i].copy_in_flight = true;
        }
        Ok(())
    }

    /// An error where shared byte `i` is a `cp.async`'s destination still in flight: `access`
    /// by thread `me` could meet the copy landing.
    fn check_no_copy_in_flight(&self, i: usize, me: u32, access: &str) -> R<()> {
        match self.shadow[i].copy_in_flight {
            true => Err(format!(
                "race: shared byte {i} {access} by thread {me} while a cp.async into it is in flight (its issuer's cp.async.wait_group first)"
            )),
            false => Ok(()),
        }
    }

    pub(super) fn write_shared(&mut self, t: usize, addr: u64, bytes: &[u8]) -> R<()> {
        let a = self.check_shared(addr, bytes.len())?;
        let me = t as u32;
        if self.bulk_pending > 0 {
            self.check_no_bulk_read(a, a + bytes.len())?;
        }
        self.check_not_copied_out(a, a + bytes.len())?;
        for i in a..a + bytes.len() {
            let s = self.shadow[i];
            if s.mbarrier {
                return Err(format!("shared byte {i} belongs to an mbarrier; only mbarrier instructions write it"));
            }
            self.check_no_copy_in_flight(i, me, "written")?;
            if s.written && !self.ordered(s.writer, s.write_epoch, me) {
                return Err(format!(
                    "race: shared byte {i} written by {} and by thread {me} with {} between",
                    self.describe(s.writer),
                    self.missing_order(s.writer)
                ));
            }
            if s.reader != me && !self.reads_ordered(&s, me) {
                let who = if s.reader == MANY { "other threads".to_string() } else { format!("thread {}", s.reader) };
                return Err(format!(
                    "race: shared byte {i} read by {who} and written by thread {me} with no barrier between"
                ));
            }
            if self.warpgroups.iter().any(|g| g.reads_chunk(i as u32 / 16)) {
                return Err(format!(
                    "shared byte {i} written by thread {me} while a pending wgmma reads it (wgmma.wait_group first)"
                ));
            }
            self.clock += 1;
            self.shadow[i] = Shadow::written_by(self.group_thread(t), self.released, self.clock);
        }
        self.shared[a..a + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}
