//! Flags in global memory: blocks of one launch ordering each other's global accesses with
//! `st.release.gpu` / `red.release.gpu.add` and `ld.acquire.gpu` on a flag word.
//!
//! A program with such a flag is run with its whole grid resident at once (the launch must
//! guarantee that on the device: a block that waits for a later block's flag would otherwise
//! wait for a block that never starts), every block taking rounds in turn, so a block polling a
//! flag lets the others run. A poll that would read the same word again, with no global write
//! anywhere since, waits instead of spinning: when no block can do anything else, the wait is
//! a deadlock and reported.
//!
//! The order of global bytes across blocks follows the vector clocks of `order`, over the
//! grid's warps: each global byte remembers its last writer and the writer's epoch, and a read
//! or write of it by another thread must be ordered after that write: the writer's barrier,
//! then a release on a flag word that the reader's warp acquired (directly or through a chain
//! of releases and acquires); a write, also after each read since the last write. A flag word
//! keeps what its releases released (merged: a `red.release.add` continues the release
//! sequence of the word's earlier releases).

use super::order::merge;
use super::*;

/// The writer of a global byte that flag accesses write: the byte is read only through
/// flag accesses, which do not race with each other.
const FLAG_WRITER: u32 = u32::MAX - 2;

/// A thread's access to global bytes, as the order of a resident grid checks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum GlobalAccess {
    Read,
    Write,
}

impl GlobalAccess {
    /// As an error message says it: "read by", "written by".
    fn participle(self) -> &'static str {
        match self {
            GlobalAccess::Read => "read",
            GlobalAccess::Write => "written",
        }
    }
}

/// How a release sets its flag word.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Release {
    /// `st.release`: the word becomes the value; its earlier releases are replaced.
    Store,
    /// `red.release.add`: the value is added; the release joins the word's earlier ones.
    Add,
}

/// A thread's last `ld.acquire`: the instruction, the word's global address, and the count of
/// global writes then ([`GlobalOrder::writes`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Poll {
    pub(super) pc: usize,
    pub(super) addr: u64,
    pub(super) writes: u64,
}

/// What a resident grid's global memory remembers for its order: per tensor and byte the last
/// writer (a thread of the grid, [`NONE`] before the launch wrote it) and its block's epoch
/// then, per (tensor, byte) read since its last write each reading thread and its block's
/// latest epoch then, and per flag word (tensor, byte offset) what its releases released.
pub(super) struct GlobalOrder {
    writers: Vec<Vec<(u32, u32)>>,
    readers: HashMap<(usize, usize), Vec<(u32, u32)>>,
    releases: HashMap<(usize, usize), Vec<u32>>,
    /// Counts global writes by any block: a poll that saw this count wait until it changes.
    pub(super) writes: u64,
}

impl GlobalOrder {
    /// The order of tensors of `sizes` bytes, nothing written yet.
    pub(super) fn new(sizes: impl Iterator<Item = usize>) -> GlobalOrder {
        GlobalOrder {
            writers: sizes.map(|n| vec![(NONE, 0); n]).collect(),
            readers: HashMap::new(),
            releases: HashMap::new(),
            writes: 0,
        }
    }
}

/// Whether `prog` orders its blocks through flags in global memory (and so runs with its grid
/// resident at once).
pub(super) fn waits_on_flags(prog: &ThreadProgram) -> bool {
    prog.body.iter().any(|i| matches!(i.op, Op::LdAcquire { .. }))
}

/// What a resident grid's program may not also have: instructions whose order across blocks
/// the simulator does not follow in that mode.
pub(super) fn check_resident(prog: &ThreadProgram) -> Result<(), String> {
    if prog.cluster_blocks > 1 {
        return Err("a program that waits on flags in global memory, launched in clusters: not simulated".into());
    }
    match prog
        .body
        .iter()
        .find(|i| matches!(i.op, Op::TmaLoad { .. } | Op::TmaStore { .. } | Op::ClusterBarrier { .. }))
    {
        Some(i) => Err(format!("{} in a program that waits on flags in global memory: not simulated", i.op)),
        None => Ok(()),
    }
}

impl Block<'_> {
    /// The tensor and byte offset of the flag word at global address `addr` (4-byte aligned,
    /// in bounds).
    fn flag_word(&mut self, addr: u64) -> R<(usize, usize)> {
        self.global_slice(addr, 4)
    }

    /// Whether thread `t`, at an `ld.acquire` of global address `addr` at `pc`, would read the
    /// word it read there last with nothing written to global memory since: then it waits for
    /// a write.
    pub(super) fn poll_unchanged(&self, t: usize, pc: usize, addr: u64) -> bool {
        let writes = self.global_order.as_ref().map_or(0, |o| o.writes);
        self.threads[t].polled == Some(Poll { pc, addr, writes })
    }

    /// `ld.acquire.gpu.global.u32`: thread `t` reads the flag word at `addr` and acquires what
    /// its releases released.
    pub(super) fn ld_acquire(&mut self, t: usize, addr: u64) -> R<u64> {
        let (b, off) = self.flag_word(addr)?;
        let word = u32::from_le_bytes(self.globals[b][off..off + 4].try_into().expect("4 bytes"));
        let pc = self.threads[t].pc;
        let order = self.global_order.as_ref().ok_or("ld.acquire in a grid that is not resident: not simulated")?;
        self.threads[t].polled = Some(Poll { pc, addr, writes: order.writes });
        if let Some(released) = order.releases.get(&(b, off)).cloned() {
            self.acquire(t, &released);
        }
        Ok(u64::from(word))
    }

    /// `st.release.gpu.global.u32` or `red.release.gpu.global.add.u32` (`how`): thread `t`
    /// sets (adds `value` to) the flag word at `addr`, releasing what its warp did and knows.
    pub(super) fn release_flag(&mut self, t: usize, addr: u64, value: u64, how: Release) -> R<()> {
        let (b, off) = self.flag_word(addr)?;
        let old = u32::from_le_bytes(self.globals[b][off..off + 4].try_into().expect("4 bytes"));
        let word = match how {
            Release::Store => value as u32,
            Release::Add => old.wrapping_add(value as u32),
        };
        let release = self.release_from(t);
        self.globals[b][off..off + 4].copy_from_slice(&word.to_le_bytes());
        // A grid that polls no flag is not resident: nothing in it acquires the release.
        let Some(order) = self.global_order.as_mut() else { return Ok(()) };
        let kept = order.releases.entry((b, off)).or_default();
        if how == Release::Add && !kept.is_empty() {
            merge(kept, &release);
        } else {
            *kept = release;
        }
        order.writers[b][off..off + 4].fill((FLAG_WRITER, 0));
        order.writes += 1;
        Ok(())
    }

    /// Checks thread `t`'s `access` to `n` global bytes of tensor `b` at `off` against each
    /// byte's last write by another thread (a write, also against the reads since), then
    /// records it. Nothing to check outside a resident grid.
    pub(super) fn order_global(&mut self, t: usize, b: usize, off: usize, n: usize, access: GlobalAccess) -> R<()> {
        let Some(order) = self.global_order.as_ref() else { return Ok(()) };
        let (me, now, writing) = (self.group_thread(t), self.released, access == GlobalAccess::Write);
        let what = access.participle();
        let race = |i: usize, other: &str, who: u32| {
            format!(
                "race: global byte {i} of `{}` {other} by {} and {what} by thread {t} with no flag between (a \
                 barrier, st.release or red.release on a flag word, ld.acquire of it)",
                self.global_names[b],
                self.describe(who),
            )
        };
        for i in off..off + n {
            let (writer, epoch) = order.writers[b][i];
            if writer == FLAG_WRITER && writing {
                return Err(format!(
                    "global byte {i} of `{}` is a flag word's, written with a plain store",
                    self.global_names[b]
                ));
            }
            if writer != NONE && writer != FLAG_WRITER && !self.ordered(writer, epoch, t as u32) {
                return Err(race(i, GlobalAccess::Write.participle(), writer));
            }
            if writing {
                let readers = order.readers.get(&(b, i)).map_or(&[][..], Vec::as_slice);
                if let Some(&(reader, _)) = readers.iter().find(|(r, e)| !self.ordered(*r, *e, t as u32)) {
                    return Err(race(i, GlobalAccess::Read.participle(), reader));
                }
            }
        }
        let order = self.global_order.as_mut().expect("checked above");
        for i in off..off + n {
            if writing {
                order.readers.remove(&(b, i));
            } else {
                let readers = order.readers.entry((b, i)).or_default();
                match readers.iter_mut().find(|(r, _)| *r == me) {
                    Some(read) => read.1 = now,
                    None => readers.push((me, now)),
                }
            }
        }
        if writing {
            order.writers[b][off..off + n].fill((me, now));
            order.writes += 1;
        }
        Ok(())
    }
}
