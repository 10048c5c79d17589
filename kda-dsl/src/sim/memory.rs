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

    pub(super) fn check_shared(&self, addr: u64, n: usize) -> R<usize> {
        let a = addr as usize;
        if addr > u32::MAX as u64 || a + n > self.shared.len() {
            return Err(format!("shared access out of bounds: bytes {a}..{} of {}", a + n, self.shared.len()));
        }
        if !a.is_multiple_of(n.min(16)) {
            return Err(format!("misaligned {n}-byte shared access at {a}"));
        }
        Ok(a)
    }

    pub(super) fn read_shared(&mut self, t: usize, addr: u64, n: usize) -> R<Vec<u8>> {
        let a = self.check_shared(addr, n)?;
        let me = t as u32;
        for i in a..a + n {
            let s = &mut self.shadow[i];
            if !s.written {
                return Err(format!("read of shared byte {i}, which nothing wrote"));
            }
            if s.write_epoch == self.epoch && s.writer != me {
                return Err(format!(
                    "race: shared byte {i} written by thread {} and read by thread {me} with no barrier between",
                    s.writer
                ));
            }
            if s.read_epoch != self.epoch || s.reader == NONE {
                s.read_epoch = self.epoch;
                s.reader = me;
            } else if s.reader != me {
                s.reader = MANY;
            }
        }
        Ok(self.shared[a..a + n].to_vec())
    }

    pub(super) fn write_shared(&mut self, t: usize, addr: u64, bytes: &[u8]) -> R<()> {
        let a = self.check_shared(addr, bytes.len())?;
        let me = t as u32;
        for i in a..a + bytes.len() {
            let s = &mut self.shadow[i];
            if s.written && s.write_epoch == self.epoch && s.writer != me {
                return Err(format!(
                    "race: shared byte {i} written by threads {} and {me} with no barrier between",
                    s.writer
                ));
            }
            if s.read_epoch == self.epoch && s.reader != NONE && s.reader != me {
                let who = if s.reader == MANY { "other threads".to_string() } else { format!("thread {}", s.reader) };
                return Err(format!(
                    "race: shared byte {i} read by {who} and written by thread {me} with no barrier between"
                ));
            }
            *s = Shadow {
                written: true,
                writer: me,
                write_epoch: self.epoch,
                reader: s.reader,
                read_epoch: s.read_epoch,
            };
        }
        self.shared[a..a + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}
