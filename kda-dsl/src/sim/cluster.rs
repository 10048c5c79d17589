//! Thread-block clusters: a cluster's blocks run together, round by round, so one block can
//! store into another's shared memory (`st.shared::cluster` and `st.async` at an address
//! `mapa` made), arrive at its mbarriers, and all of them meet at `barrier.cluster`.
//!
//! What a thread does to another block lands at the end of its own block's round, in issue
//! order. The race checker's vector clocks span the cluster (see `order`): a store landing in
//! another block is checked against the bytes' earlier accesses with what the storing warp
//! knew when it stored, and the target's later accesses are checked against the store as
//! against their own block's. What orders them across blocks: `barrier.cluster`, and an
//! mbarrier phase that a remote arrival or an `st.async`'s transaction released, waited for
//! at `.cluster` scope. Loads from another block's shared memory are not simulated (reported
//! as such).

use super::order::merge;
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

/// What a thread did to another block of the cluster, waiting for the end of its block's
/// round: a store (an `st.async`'s with the transaction it completes) or an mbarrier arrival.
pub(super) enum Remote {
    Store(RemoteStore),
    Arrive {
        rank: u32,
        /// The mbarrier's index into the target block's shared bytes.
        mbarrier: usize,
        /// The arriving thread ([`Block::group_thread`]) and its instruction.
        thread: u32,
        loc: SrcLoc,
        /// What the arrival releases ([`Block::release_from`]).
        release: Vec<u32>,
    },
}

/// A store into another block of the cluster.
pub(super) struct RemoteStore {
    rank: u32,
    /// Index into the target block's shared bytes.
    at: usize,
    bytes: Vec<u8>,
    /// The storing thread ([`Block::group_thread`]), its instruction, its block's epoch
    /// then, and what its warp knew ([`Block::knowledge`]): what the bytes' earlier accesses
    /// must be ordered by.
    thread: u32,
    loc: SrcLoc,
    epoch: u32,
    known: Vec<u32>,
    /// For `st.async` and bulk copies: the mbarrier (an index into the same block's shared
    /// bytes) whose transaction count the store completes, and what that releases.
    completes: Option<(usize, Vec<u32>)>,
    /// Written by the async proxy (a bulk copy): a `wgmma` may read the bytes unfenced.
    async_proxy: bool,
}

/// Who writes a store's bytes into another block.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Proxy {
    /// The thread itself (`st.shared::cluster`, `st.async`).
    Generic,
    /// The async proxy (a bulk copy).
    Async,
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
        self.send(t, rank, at, bytes, None, Proxy::Generic);
    }

    /// `st.async`: thread `t` stores `bytes` at the `.shared::cluster` address `addr` and
    /// completes as many bytes of the phase of the mbarrier at `mbar`, in the same block.
    pub(super) fn store_async(&mut self, t: usize, addr: u64, bytes: Vec<u8>, mbar: u64) -> R<()> {
        let n = bytes.len() as u32;
        match (self.cluster_target(addr, bytes.len())?, self.cluster_target(mbar, 8)?) {
            (Target::Own(own), Target::Own(m)) => {
                self.write_shared(t, own, &bytes)?;
                self.mbarrier_complete_tx(t, m, n)
            }
            (Target::Other { rank, at }, Target::Other { rank: mbar_rank, at: mbarrier }) if rank == mbar_rank => {
                self.send(t, rank, at, bytes, Some(mbarrier), Proxy::Generic);
                Ok(())
            }
            _ => Err("st.async into one block's shared memory completing another block's mbarrier".into()),
        }
    }

    /// `cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes`: thread `t`'s
    /// bulk copy of `bytes` of its block's shared memory at `src` to the `.shared::cluster`
    /// address `dst`, completing the mbarrier at `mbar` in the same block as `dst`. The async
    /// proxy reads the source (fenced by its writers, as for a TMA store) until the copy lands
    /// at the end of the round: a write to it before then is an error. Into the block itself,
    /// it lands at once.
    pub(super) fn bulk_copy_to_cluster(&mut self, t: usize, dst: u64, src: u64, bytes: u32, mbar: u64) -> R<()> {
        if bytes == 0 || !bytes.is_multiple_of(16) {
            return Err(format!("a bulk copy of {bytes} bytes: a positive multiple of 16"));
        }
        let n = bytes as usize;
        let from = self.check_shared(src, n)?;
        for i in from..from + n {
            if !self.shadow[i].written {
                return Err(format!("a bulk copy to the cluster reads shared byte {i}, which nothing wrote"));
            }
            self.check_async_visible(t as u32, i, "a bulk copy to the cluster")?;
        }
        let data = self.shared[from..from + n].to_vec();
        self.record_read(t, from, n);
        match (self.cluster_target(dst, n)?, self.cluster_target(mbar, 8)?) {
            (Target::Own(own), Target::Own(m)) => {
                self.write_shared(t, own, &data)?;
                let at = self.check_shared(own, n)?;
                self.shadow[at..at + n].iter_mut().for_each(|s| s.async_proxy = true);
                self.mbarrier_complete_tx(t, m, bytes)
            }
            (Target::Other { rank, at }, Target::Other { rank: mbar_rank, at: mbarrier }) if rank == mbar_rank => {
                self.send(t, rank, at, data, Some(mbarrier), Proxy::Async);
                self.copying_out.push(from..from + n);
                Ok(())
            }
            _ => Err("a bulk copy into one block's shared memory completing another block's mbarrier".into()),
        }
    }

    /// Thread `t`'s store of `bytes` at index `at` of block `rank`'s shared memory, for the
    /// end of the round, written by `proxy`; completing the transaction count of the
    /// mbarrier at index `completes` of that block when given (which releases the store:
    /// the store's epoch comes first).
    fn send(&mut self, t: usize, rank: u32, at: usize, bytes: Vec<u8>, completes: Option<usize>, proxy: Proxy) {
        let (thread, loc, epoch, known) = (self.group_thread(t), self.loc(t), self.released, self.knowledge(t));
        let completes = completes.map(|m| (m, self.release_from(t)));
        let async_proxy = proxy == Proxy::Async;
        let store = RemoteStore { rank, at, bytes, thread, loc, epoch, known, completes, async_proxy };
        self.remote_out.push(Remote::Store(store));
    }

    /// `mbarrier.arrive.release.cluster.shared::cluster`: thread `t` arrives at the mbarrier at
    /// the `.shared::cluster` address `addr`, releasing to the cluster what its warp did.
    pub(super) fn arrive_remote(&mut self, t: usize, addr: u64) -> R<()> {
        match self.cluster_target(addr, 8)? {
            Target::Own(own) => self.mbarrier_arrive(t, own, 0).map(|_| ()),
            Target::Other { rank, at } => {
                let (thread, loc, release) = (self.group_thread(t), self.loc(t), self.release_from(t));
                self.remote_out.push(Remote::Arrive { rank, mbarrier: at, thread, loc, release });
                Ok(())
            }
        }
    }

    /// Lands another block's store in this block's shared memory, checked against the bytes'
    /// earlier accesses: each must be ordered before the store.
    fn land(&mut self, st: &RemoteStore) -> R<()> {
        let from = self.describe(st.thread);
        let rank = self.cluster.rank;
        if self.bulk_pending > 0 {
            self.check_no_bulk_read(st.at, st.at + st.bytes.len())?;
        }
        self.check_not_copied_out(st.at, st.at + st.bytes.len())?;
        for (k, byte) in st.bytes.iter().enumerate() {
            let i = st.at + k;
            let s = self.shadow[i];
            if s.mbarrier {
                return Err(format!(
                    "{from} stores into shared byte {i} of block {rank}, which belongs to an mbarrier"
                ));
            }
            if s.written && s.writer != st.thread && st.known[s.writer as usize / 32] <= s.write_epoch {
                let writer = self.describe_in(s.writer, rank);
                return Err(format!(
                    "race: shared byte {i} of block {rank} written by {writer} and stored by {from} with no \
                     barrier.cluster or mbarrier phase (waited for at .cluster scope) between"
                ));
            }
            if !self.reads_ordered_for(&s, &st.known) {
                return Err(format!(
                    "race: shared byte {i} of block {rank} read by its threads and stored by {from} with no \
                     barrier.cluster or mbarrier phase (waited for at .cluster scope) between"
                ));
            }
            if self.warpgroups.iter().any(|g| g.reads_chunk(i as u32 / 16)) {
                return Err(format!(
                    "{from} stores into shared byte {i} of block {rank} while a pending wgmma reads it"
                ));
            }
            self.clock += 1;
            self.shared[i] = *byte;
            self.shadow[i] =
                Shadow { async_proxy: st.async_proxy, ..Shadow::written_by(st.thread, st.epoch, self.clock) };
        }
        match &st.completes {
            Some((mbarrier, release)) => self.complete_tx_from_afar(*mbarrier, st.bytes.len() as u32, release),
            None => Ok(()),
        }
    }
}

/// Lands the round's stores and arrivals of every block of the cluster in their targets, in
/// issue order; whether any did. An error names the block and thread that stored or arrived.
fn deliver(blocks: &mut [Block]) -> Result<bool, SimError> {
    let mut delivered = false;
    for from in 0..blocks.len() {
        // Its bulk copies land now: their sources are free again.
        blocks[from].copying_out.clear();
        for event in std::mem::take(&mut blocks[from].remote_out) {
            delivered = true;
            let (rank, thread, loc) = match &event {
                Remote::Store(st) => (st.rank, st.thread, st.loc),
                Remote::Arrive { rank, thread, loc, .. } => (*rank, *thread, *loc),
            };
            let (block, local) = (blocks[from].block, blocks[from].place_of(thread).1);
            let fail = |message: String| SimError { message, loc, block, thread: local };
            let to = &mut blocks[rank as usize];
            let landed = if to.threads.iter().all(|t| t.done) {
                Err(format!("block {from} of the cluster reaches block {rank}, which has exited"))
            } else {
                match &event {
                    Remote::Store(st) => to.land(st),
                    Remote::Arrive { mbarrier, release, .. } => to.arrive_from_afar(*mbarrier, release),
                }
            };
            landed.map_err(fail)?;
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
    let warps = blocks[0].cluster_released.len();
    let mut released = vec![0; warps];
    for b in blocks.iter_mut() {
        merge(&mut released, &std::mem::replace(&mut b.cluster_releasing, vec![0; warps]));
    }
    for b in blocks.iter_mut() {
        b.cluster_released.clone_from(&released);
        b.cluster_epoch += 1;
        for th in &mut b.threads {
            th.cluster_parked = false;
        }
    }
    true
}

/// Runs blocks that run together (a cluster's; one, for a program without clusters; a resident
/// grid's, see `flags`) to the end, round by round, with `globals` and their order moved into
/// the block that runs; `meets`: whether the program has a `barrier.cluster` (else no round
/// looks for one completing).
pub(super) fn run_together(
    blocks: &mut [Block],
    globals: &mut Vec<Vec<u8>>,
    global_order: &mut Option<flags::GlobalOrder>,
    meets: bool,
) -> Result<(), SimError> {
    let mut finished = vec![false; blocks.len()];
    loop {
        let mut progress = false;
        for b in 0..blocks.len() {
            if finished[b] {
                continue;
            }
            let blk = &mut blocks[b];
            blk.globals = std::mem::take(globals);
            blk.global_order = global_order.take();
            let r = round(blk);
            *globals = std::mem::take(&mut blk.globals);
            *global_order = blk.global_order.take();
            match r? {
                Round::Finished => {
                    // Its last instructions ran in this round.
                    finished[b] = true;
                    progress = true;
                }
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
            // A phase that never completes says more than the barrier.cluster that waits on it.
            let live = |b: &usize| !finished[*b];
            let parked = (0..blocks.len()).filter(live).find(|b| blocks[*b].threads.iter().any(|t| t.parked));
            let polling = (0..blocks.len()).filter(live).find(|b| blocks[*b].polling_thread().is_some());
            let b = parked.or(polling).or((0..blocks.len()).find(live)).unwrap_or(0);
            return Err(stall_error(&mut blocks[b]));
        }
    }
}
