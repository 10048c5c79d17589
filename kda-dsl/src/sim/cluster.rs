//! Thread-block clusters: a cluster's blocks run together, round by round, so one block can
//! store into another's shared memory (`st.shared::cluster` at an address `mapa` made) and all
//! of them meet at `barrier.cluster`.
//!
//! A store into another block lands at the end of the storing block's round. Only
//! `barrier.cluster` orders it (and everything else) across the cluster, so each shared byte
//! remembers the cluster barrier epoch of its last remote store and of its last access by the
//! block itself: meeting both within one epoch is a race, as are two blocks' stores to one
//! byte. Loads from another block's shared memory are not simulated (reported as such).

use super::*;

/// Where a `.shared::cluster` address of [`mapa`](Block::mapa) points: the shared memory of
/// the cluster's blocks, one window of [`WINDOW`] bytes a rank from [`CLUSTER_BASE`] (32-bit
/// addresses, as `mapa.u32` makes them). A block's own `.shared` addresses (below the
/// windows) mean its own bytes.
pub(super) const CLUSTER_BASE: u64 = 1 << 31;
const WINDOW: u64 = 1 << 24;

/// A block's place in its cluster.
#[derive(Clone, Copy, Debug)]
pub(super) struct Place {
    pub(super) rank: u32,
    pub(super) blocks: u32,
}

/// A store into another block of the cluster, waiting for the end of the round.
pub(super) struct RemoteStore {
    rank: u32,
    /// Index into the target block's shared bytes.
    at: usize,
    bytes: Vec<u8>,
    /// The storing thread, for the error message.
    thread: u32,
}

/// The block a `.shared::cluster` access at `addr` reaches: the block itself (its `.shared`
/// address) or another rank's (the index into its shared bytes).
pub(super) enum Target {
    Own(u64),
    Other { rank: u32, at: usize },
}

impl Block<'_> {
    /// `mapa.shared::cluster`: the cluster address of this block's shared address `addr` in
    /// the block of rank `rank`.
    pub(super) fn mapa(&self, addr: u64, rank: u64) -> R<u64> {
        if rank >= u64::from(self.cluster.blocks) {
            return Err(format!("mapa to rank {rank} of a cluster of {} blocks", self.cluster.blocks));
        }
        let at = self.check_shared(addr, 1)? as u64;
        Ok(CLUSTER_BASE + rank * WINDOW + at)
    }

    /// Which block a `.shared::cluster` access at `addr` of `n` bytes reaches.
    pub(super) fn cluster_target(&self, addr: u64, n: usize) -> R<Target> {
        if addr < CLUSTER_BASE {
            return Ok(Target::Own(addr));
        }
        let rank = (addr - CLUSTER_BASE) / WINDOW;
        let at = ((addr - CLUSTER_BASE) % WINDOW) as usize;
        if rank >= u64::from(self.cluster.blocks) {
            return Err(format!("shared::cluster address {addr:#x} is in no block of the cluster"));
        }
        if rank == u64::from(self.cluster.rank) {
            return Ok(Target::Own(SHARED_BASE + at as u64));
        }
        // Every block of the cluster runs the same program: the same shared size and layout.
        self.check_shared(SHARED_BASE + at as u64, n)?;
        Ok(Target::Other { rank: rank as u32, at })
    }

    /// Thread `t`'s store of `bytes` into another block's shared memory, for the end of the
    /// round.
    pub(super) fn store_remote(&mut self, t: usize, rank: u32, at: usize, bytes: Vec<u8>) {
        self.remote_out.push(RemoteStore { rank, at, bytes, thread: t as u32 });
    }

    /// Notes a local access of shared bytes `at..at + n` in this cluster epoch; a race when a
    /// remote store reached one of them since the last `barrier.cluster`.
    pub(super) fn touch_locally(&mut self, t: usize, at: usize, n: usize) -> R<()> {
        let now = self.cluster_epoch + 1;
        for i in at..at + n {
            if self.shadow[i].remote_epoch == now {
                return Err(format!(
                    "race: shared byte {i} stored by block {} of the cluster and accessed by thread {t} with no \
                     barrier.cluster between",
                    self.shadow[i].remote_from
                ));
            }
            self.shadow[i].local_epoch = now;
        }
        Ok(())
    }

    /// Every access so far is ordered before every later one, as a completed `barrier.cluster`
    /// orders them: a barrier every warp passed.
    fn order_everything(&mut self) {
        self.released += 1;
        self.last_shared_barrier.iter_mut().for_each(|e| *e = self.released);
        self.cluster_epoch += 1;
        for th in &mut self.threads {
            th.cluster_parked = false;
        }
    }
}

/// Lands the round's stores of every block of the cluster in their targets; whether any did.
fn deliver(blocks: &mut [Block]) -> Result<bool, SimError> {
    let mut delivered = false;
    for from in 0..blocks.len() {
        for st in std::mem::take(&mut blocks[from].remote_out) {
            delivered = true;
            let to = &mut blocks[st.rank as usize];
            let fail =
                |message: String| SimError { message, loc: SrcLoc::default(), block: to.block, thread: st.thread };
            if to.threads.iter().all(|t| t.done) {
                return Err(fail(format!(
                    "st.shared::cluster from block {from} into block {}, which has exited",
                    st.rank
                )));
            }
            let now = to.cluster_epoch + 1;
            for (k, byte) in st.bytes.iter().enumerate() {
                let i = st.at + k;
                let s = to.shadow[i];
                if s.mbarrier {
                    return Err(fail(format!("st.shared::cluster into shared byte {i} of an mbarrier")));
                }
                if s.local_epoch == now {
                    return Err(fail(format!(
                        "race: shared byte {i} of block {} accessed by it and stored by block {from} with no \
                         barrier.cluster between",
                        st.rank
                    )));
                }
                if s.remote_epoch == now && s.remote_from != from as u32 {
                    return Err(fail(format!(
                        "race: shared byte {i} of block {} stored by blocks {} and {from} with no barrier.cluster \
                         between",
                        st.rank, s.remote_from
                    )));
                }
                to.shared[i] = *byte;
                to.shadow[i] = Shadow {
                    written: true,
                    writer: 0,
                    write_epoch: to.released,
                    reader: NONE,
                    reader_warps: 0,
                    read_epoch: 0,
                    remote_epoch: now,
                    remote_from: from as u32,
                    ..s
                };
            }
        }
    }
    Ok(delivered)
}

/// Completes the cluster barrier once every live thread of the cluster has arrived in this
/// epoch (exited threads count as arrived); whether it did.
fn complete_barrier(blocks: &mut [Block]) -> bool {
    let epoch = blocks[0].cluster_epoch;
    let waited_for = |b: &Block| b.threads.iter().any(|t| t.cluster_arrived == Some(epoch));
    let all_arrived = |b: &Block| b.threads.iter().all(|t| t.done || t.cluster_arrived == Some(epoch));
    if !blocks.iter().any(waited_for) || !blocks.iter().all(all_arrived) {
        return false;
    }
    blocks.iter_mut().for_each(Block::order_everything);
    true
}

/// Runs a cluster's blocks (one, for a program without clusters) to the end, round by round,
/// with `globals` moved into the block that runs; `meets`: whether the program has a
/// `barrier.cluster` (else no round looks for one completing).
pub(super) fn run_cluster(blocks: &mut [Block], globals: &mut Vec<Vec<u8>>, meets: bool) -> Result<(), SimError> {
    let mut finished = vec![false; blocks.len()];
    loop {
        let mut progress = false;
        for b in 0..blocks.len() {
            if finished[b] {
                continue;
            }
            let blk = &mut blocks[b];
            blk.globals = std::mem::take(globals);
            let r = round(blk);
            *globals = std::mem::take(&mut blk.globals);
            match r? {
                Round::Finished => finished[b] = true,
                Round::Progressed => progress = true,
                Round::Stalled => {}
            }
            // Before the next block runs, so that what it does meets these stores.
            progress |= deliver(blocks)?;
        }
        if meets {
            progress |= complete_barrier(blocks);
        }
        if finished.iter().all(|f| *f) {
            return Ok(());
        }
        if !progress {
            let b = finished.iter().position(|f| !f).unwrap_or(0);
            return Err(stall_error(&mut blocks[b]));
        }
    }
}
