//! Flags in global memory: blocks of one launch ordering each other's global accesses with
//! `st.release.gpu` / `red.release.gpu.add` and `ld.acquire.gpu` on a flag word.
//!
//! A program with such a flag is run with its whole grid resident at once (the launch must
//! guarantee that on the device: a block that waits for a later block's flag would otherwise
//! wait for a block that never starts), every block taking rounds in turn. A thread yields its
//! block's round after each `ld.acquire`, so a block polling a flag lets the others run. A poll
//! that the thread already made since the last global write anywhere, from the same instruction
//! with the same registers (so it would read the same word and go the same way), waits instead:
//! when no block can do anything else, the wait is a deadlock and reported. A thread that polls
//! [`POLL_LIMIT`] times is reported too (a spin whose registers change every time, such as a
//! count of its tries, never repeats a poll).
//!
//! The order of global bytes across blocks follows the vector clocks of `order`, over the
//! grid's warps: each global byte remembers its last writer and the writer's epoch, and a read
//! or write of it by another thread must be ordered after that write: the writer's barrier,
//! then a release on a flag word that the reader's warp acquired (directly or through a chain
//! of releases and acquires); a write, also after each read since the last write. A flag word
//! keeps what its releases released (merged: a `red.release.add` continues the release
//! sequence of the word's earlier releases). Flag accesses do not race with each other; a
//! plain store into a flag word must be ordered after its last flag access's write, and a flag
//! access after the word's last plain store. Known gaps: the order is kept per warp (a release
//! by one lane covers what its warp's other lanes did before it in the run), a `cp.async`
//! reads its source when issued, and the reads of flag words are not remembered.

use super::order::merge;
use super::*;

/// Polls one thread may make before it is reported.
pub(super) const POLL_LIMIT: u64 = 100_000;

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

/// One `ld.acquire` as a thread made it: the instruction, the word's global address, and a
/// hash of the thread's registers then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Poll {
    pc: usize,
    addr: u64,
    registers: u64,
}

/// A thread's polls since the last global write it saw ([`GlobalOrder::writes`]), and how
/// many it made in all.
#[derive(Clone, Debug, Default)]
pub(super) struct Polls {
    since_write: std::collections::HashSet<Poll>,
    writes: u64,
    made: u64,
}

/// The last write of a global byte: the writing thread of the grid ([`NONE`] before the launch
/// wrote it), its block's epoch then, and whether a flag access made it.
#[derive(Clone, Copy)]
struct LastWrite {
    thread: u32,
    epoch: u32,
    flag: bool,
}

/// What a resident grid's global memory remembers for its order: per tensor and byte the last
/// write, per (tensor, byte) read since its last write each reading thread and its block's
/// latest epoch then, and per flag word (tensor, byte offset) what its releases released.
pub(super) struct GlobalOrder {
    writers: Vec<Vec<LastWrite>>,
    readers: HashMap<(usize, usize), Vec<(u32, u32)>>,
    releases: HashMap<(usize, usize), Vec<u32>>,
    /// Counts global writes by any block: a poll waits until it changes.
    writes: u64,
}

impl GlobalOrder {
    /// The order of tensors of `sizes` bytes, nothing written yet.
    pub(super) fn new(sizes: impl Iterator<Item = usize>) -> GlobalOrder {
        let unwritten = LastWrite { thread: NONE, epoch: 0, flag: false };
        GlobalOrder {
            writers: sizes.map(|n| vec![unwritten; n]).collect(),
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

    /// Thread `t`'s poll at `pc` of the word at global address `addr`, as it stands now.
    fn poll_now(&self, t: usize, pc: usize, addr: u64) -> Poll {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.threads[t].regs.hash(&mut h);
        Poll { pc, addr, registers: h.finish() }
    }

    /// Whether thread `t`, at an `ld.acquire` of global address `addr` at `pc`, made this same
    /// poll since the last global write: then it waits for a write.
    pub(super) fn poll_waits(&self, t: usize, pc: usize, addr: u64) -> bool {
        let writes = self.global_order.as_ref().map_or(0, |o| o.writes);
        let polls = &self.threads[t].polls;
        polls.writes == writes && polls.since_write.contains(&self.poll_now(t, pc, addr))
    }

    /// The first live thread of the block standing at an `ld.acquire`.
    pub(super) fn polling_thread(&self) -> Option<usize> {
        let at_poll = |t: &Thread| matches!(self.prog.body.get(t.pc).map(|i| &i.op), Some(Op::LdAcquire { .. }));
        self.threads.iter().position(|t| !t.done && at_poll(t))
    }

    /// `ld.acquire.gpu.global.u32`: thread `t` reads the flag word at `addr` and acquires what
    /// its releases released.
    pub(super) fn ld_acquire(&mut self, t: usize, addr: u64) -> R<u64> {
        let (b, off) = self.flag_word(addr)?;
        let word = u32::from_le_bytes(self.globals[b][off..off + 4].try_into().expect("4 bytes"));
        let poll = self.poll_now(t, self.threads[t].pc, addr);
        self.check_flag_access(t, b, off, "acquired")?;
        let order = self.global_order.as_ref().ok_or("ld.acquire in a grid that is not resident: not simulated")?;
        let (writes, released) = (order.writes, order.releases.get(&(b, off)).cloned());
        let polls = &mut self.threads[t].polls;
        if polls.writes != writes {
            polls.since_write.clear();
            polls.writes = writes;
        }
        polls.since_write.insert(poll);
        polls.made += 1;
        if polls.made >= POLL_LIMIT {
            return Err(format!("{POLL_LIMIT} polls of flag words by one thread: a flag never set?"));
        }
        if let Some(released) = released {
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
        self.check_flag_access(t, b, off, "released")?;
        // The word's write comes before the release (whoever acquires it is ordered after).
        let (me, before) = (self.group_thread(t), self.released);
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
        order.writers[b][off..off + 4].fill(LastWrite { thread: me, epoch: before, flag: true });
        order.writes += 1;
        Ok(())
    }

    /// Checks thread `t`'s flag access (`what`: "acquired" or "released") to the word at byte
    /// `off` of tensor `b` against the word's last plain store by another thread.
    fn check_flag_access(&self, t: usize, b: usize, off: usize, what: &str) -> R<()> {
        let Some(order) = self.global_order.as_ref() else { return Ok(()) };
        for i in off..off + 4 {
            let last = order.writers[b][i];
            if last.thread != NONE && !last.flag && !self.ordered(last.thread, last.epoch, t as u32) {
                return Err(format!(
                    "race: flag word at byte {off} of `{}` stored by {} with a plain store and {what} by thread {t} \
                     with no flag between",
                    self.global_names[b],
                    self.describe(last.thread),
                ));
            }
        }
        Ok(())
    }

    /// Checks thread `t`'s plain `access` to `n` global bytes of tensor `b` at `off` against
    /// each byte's last write by another thread (a write, also against the reads since), then
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
            let last = order.writers[b][i];
            // A plain read of a flag word is not checked; a plain store into one must come after
            // the word's last flag access as any write after a write.
            let checked = last.thread != NONE && (writing || !last.flag);
            if checked && !self.ordered(last.thread, last.epoch, t as u32) {
                let other = if last.flag { "set by a flag access" } else { GlobalAccess::Write.participle() };
                return Err(race(i, other, last.thread));
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
            order.writers[b][off..off + n].fill(LastWrite { thread: me, epoch: now, flag: false });
            order.writes += 1;
        }
        Ok(())
    }
}
