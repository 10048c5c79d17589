//! The order between threads' memory accesses, as vector clocks: each warp knows, per warp of
//! its group (the blocks that run together: its cluster's, a resident grid's (`flags`), or its
//! block's own warps alone), the epoch of that warp's block before which everything that warp
//! did is ordered before what it does now.
//!
//! A block's epoch is its count of releases ([`Block::released`]): barriers, mbarrier
//! arrivals and completed transactions, `barrier.cluster` arrivals, the stores and arrivals
//! that reach another block, and releases on flag words. A release hands on what the releasing
//! warp knows (order is transitive); an acquire (a barrier passed, an mbarrier phase waited for
//! within its scope, `barrier.cluster.wait`, a flag word read by `ld.acquire`) merges it into
//! what the acquiring warp knows.

use super::*;

/// Raises each epoch of `known` to `new`'s where that is later.
pub(super) fn merge(known: &mut [u32], new: &[u32]) {
    for (k, n) in known.iter_mut().zip(new) {
        *k = (*k).max(*n);
    }
}

impl Block<'_> {
    /// Warp `w` of this block among the group's warps.
    pub(super) fn group_warp(&self, w: usize) -> usize {
        self.group.rank as usize * self.warps + w
    }

    /// Thread `t` of this block among the group's threads (whole warps a block).
    pub(super) fn group_thread(&self, t: usize) -> u32 {
        (self.group_warp(0) * 32 + t) as u32
    }

    /// A group thread as an error message names it: by its index in its block, and the
    /// block's rank when it is another block's.
    pub(super) fn describe(&self, thread: u32) -> String {
        self.describe_in(thread, self.group.rank)
    }

    /// The rank of group thread `thread`'s block in the group, and its index there.
    pub(super) fn place_of(&self, thread: u32) -> (u32, u32) {
        let per_block = 32 * self.warps as u32;
        (thread / per_block, thread % per_block)
    }

    /// A group thread as an error message about block `rank`'s memory names it.
    pub(super) fn describe_in(&self, thread: u32, rank: u32) -> String {
        let group = if self.global_order.is_some() { "grid" } else { "cluster" };
        match self.place_of(thread) {
            (its_rank, t) if its_rank == rank => format!("thread {t}"),
            (its_rank, t) => format!("thread {t} of the {group}'s block {its_rank}"),
        }
    }

    /// What a race with group thread `thread` lacks: a barrier of the block, or one of the
    /// cluster's orders when it is another block's thread.
    pub(super) fn missing_order(&self, thread: u32) -> &'static str {
        if self.place_of(thread).0 == self.group.rank {
            "no barrier"
        } else {
            "no barrier.cluster or mbarrier phase (waited for at .cluster scope)"
        }
    }

    /// Whether everything group warp `a` did when its block had released `epoch` is ordered
    /// before what warp `b` of this block does now.
    pub(super) fn barrier_between_warps(&self, a: usize, epoch: u32, b: usize) -> bool {
        self.last_shared_barrier[a * self.warps + b] > epoch
    }

    /// Whether group thread `a`'s access when its block had released `epoch` is ordered
    /// before what thread `b` of this block does now: the same thread, or a release since that
    /// `b`'s warp acquired.
    pub(super) fn ordered(&self, a: u32, epoch: u32, b: u32) -> bool {
        a == self.group_thread(b as usize) || self.barrier_between_warps(a as usize / 32, epoch, b as usize / 32)
    }

    /// What thread `t`'s warp knows now, per warp of the group.
    pub(super) fn knowledge(&self, t: usize) -> Vec<u32> {
        let me = t / 32;
        (0..self.last_shared_barrier.len() / self.warps)
            .map(|a| self.last_shared_barrier[a * self.warps + me])
            .collect()
    }

    /// What a release by thread `t` now orders, per warp of the group: everything its warp
    /// did so far (a new epoch, so not what it does after), and what its warp knows.
    pub(super) fn release_from(&mut self, t: usize) -> Vec<u32> {
        self.released += 1;
        let mut release = self.knowledge(t);
        release[self.group_warp(t / 32)] = self.released;
        release
    }

    /// Thread `t`'s warp acquires what `released` orders.
    pub(super) fn acquire(&mut self, t: usize, released: &[u32]) {
        let me = t / 32;
        for (a, epoch) in released.iter().enumerate() {
            let slot = &mut self.last_shared_barrier[a * self.warps + me];
            *slot = (*slot).max(*epoch);
        }
    }
}
