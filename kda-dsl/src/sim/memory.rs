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

    pub(super) fn read_global(&mut self, addr: u64, n: usize) -> R<Vec<u8>> {
        let (b, off) = self.global_slice(addr, n)?;
        Ok(self.globals[b][off..off + n].to_vec())
    }

    pub(super) fn write_global(&mut self, addr: u64, bytes: &[u8]) -> R<()> {
        let (b, off) = self.global_slice(addr, bytes.len())?;
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

    /// Whether thread `a`'s access when `epoch` barriers had been released is ordered before
    /// what thread `b` does now: the same thread, or a barrier both passed since.
    pub(super) fn ordered(&self, a: u32, epoch: u32, b: u32) -> bool {
        a == b || self.barrier_between_warps(a as usize / 32, epoch, b as usize / 32)
    }

    /// Whether warps `a` and `b` both passed a barrier released after the `epoch`th.
    fn barrier_between_warps(&self, a: usize, epoch: u32, b: usize) -> bool {
        self.last_shared_barrier[a * self.warps + b] > epoch
    }

    /// Whether every read recorded in `s` is ordered before what thread `me` does now.
    fn reads_ordered(&self, s: &Shadow, me: u32) -> bool {
        match s.reader {
            NONE => true,
            MANY => (0..32)
                .filter(|w| s.reader_warps & (1 << w) != 0)
                .all(|w| self.barrier_between_warps(w, s.read_epoch, me as usize / 32)),
            r => self.ordered(r, s.read_epoch, me),
        }
    }

    pub(super) fn read_shared(&mut self, t: usize, addr: u64, n: usize) -> R<Vec<u8>> {
        let a = self.check_shared(addr, n)?;
        if self.cluster.blocks > 1 {
            self.touch_locally(t, a, n)?;
        }
        let me = t as u32;
        for i in a..a + n {
            let s = self.shadow[i];
            if !s.written {
                return Err(format!("read of shared byte {i}, which nothing wrote"));
            }
            if s.mbarrier {
                return Err(format!("shared byte {i} belongs to an mbarrier; only mbarrier instructions read it"));
            }
            if !self.ordered(s.writer, s.write_epoch, me) {
                return Err(format!(
                    "race: shared byte {i} written by thread {} and read by thread {me} with no barrier between",
                    s.writer
                ));
            }
            // Reads ordered before this one need no checking against later writes: keep only
            // the reads that might still race.
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
        Ok(self.shared[a..a + n].to_vec())
    }

    /// Checks that shared byte `i`, which the async proxy is about to read (`what`: a `wgmma`
    /// or a TMA store) for thread `reader`, is visible to it: written by the async proxy, or
    /// by a thread that fenced the proxies after the write (its first `fence.proxy.async` after
    /// it) before a barrier ordering that fence before `reader`.
    pub(super) fn check_async_visible(&self, reader: u32, i: usize, what: &str) -> R<()> {
        let s = self.shadow[i];
        if s.async_proxy || !s.written {
            return Ok(());
        }
        let fences = &self.threads[s.writer as usize].proxy_fences;
        let Some(&(_, fence_epoch)) = fences.iter().find(|(clock, _)| *clock >= s.write_clock) else {
            return Err(format!(
                "{what} reads shared byte {i}, which thread {} wrote with no fence.proxy.async after the write",
                s.writer
            ));
        };
        if !self.ordered(s.writer, fence_epoch, reader) {
            return Err(format!(
                "{what} reads shared byte {i}, but no barrier orders thread {}'s fence.proxy.async before it",
                s.writer
            ));
        }
        Ok(())
    }

    /// Thread `t`'s `cp.async` copies (destination, bytes) land in shared memory, in order.
    pub(super) fn land_copies(&mut self, t: usize, copies: Vec<(u32, [u8; 16])>) -> R<()> {
        for (d, data) in copies {
            self.write_shared(t, u64::from(d), &data)?;
        }
        Ok(())
    }

    pub(super) fn write_shared(&mut self, t: usize, addr: u64, bytes: &[u8]) -> R<()> {
        let a = self.check_shared(addr, bytes.len())?;
        if self.cluster.blocks > 1 {
            self.touch_locally(t, a, bytes.len())?;
        }
        let me = t as u32;
        if self.bulk_pending > 0 {
            self.check_no_bulk_read(a, a + bytes.len())?;
        }
        for i in a..a + bytes.len() {
            let s = self.shadow[i];
            if s.mbarrier {
                return Err(format!("shared byte {i} belongs to an mbarrier; only mbarrier instructions write it"));
            }
            if s.written && !self.ordered(s.writer, s.write_epoch, me) {
                return Err(format!(
                    "race: shared byte {i} written by threads {} and {me} with no barrier between",
                    s.writer
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
            // The reads before it are ordered before this write, and so before whatever is
            // ordered after it.
            self.shadow[i] = Shadow {
                written: true,
                writer: me,
                write_epoch: self.released,
                reader: NONE,
                reader_warps: 0,
                read_epoch: 0,
                write_clock: self.clock,
                mbarrier: false,
                async_proxy: false,
                ..s
            };
        }
        self.shared[a..a + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}
