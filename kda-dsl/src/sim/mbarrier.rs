//! `mbarrier` objects in the simulated block: 8 shared bytes that only `mbarrier`
//! instructions touch, whose phases complete after their count of arrivals.
//!
//! A `try_wait` (or `test_wait`) whose phase has not completed parks its thread until it does, and then
//! returns false once, as a hardware wait that timed out may: a program that does not loop on
//! it reads what the phase has not released yet. An arrival releases the arriving
//! warp's earlier shared accesses and a successful wait acquires them: the race checker orders
//! them before what the waiting warp does next, as it does across a barrier. What another
//! block of the cluster released on it (a remote arrival, an `st.async`'s transaction) only a
//! wait at `.cluster` scope acquires.

use super::order::merge;
use super::*;

/// One `mbarrier` object.
pub(super) struct Mbarrier {
    /// Arrivals per phase.
    count: u32,
    /// Arrivals the current phase still needs.
    pending: u32,
    /// The current phase's transaction count: bytes expected minus bytes copies completed
    /// (negative while a copy completes before its `expect_tx`).
    tx: i64,
    /// Phases completed.
    completed: u32,
    /// The thread that initialized it ([`Block::group_thread`]), and its block's epoch then.
    init: (u32, u32),
    /// Its block's epoch at the initializing thread's first `fence.mbarrier_init` after the
    /// init: before it, no other block of the cluster may use it.
    init_fenced: Option<u32>,
    /// What the current phase's arrivals by the block's own threads release, per warp of the
    /// cluster: the epoch before which everything that warp did is ordered before the
    /// arrivals (an arriving warp's own arrival epoch, and what was ordered before it: order
    /// is transitive).
    releasing: Vec<u32>,
    /// What the last completed phase's own arrivals released.
    released: Vec<u32>,
    /// As `releasing` and `released`, for the other blocks' arrivals and transactions.
    releasing_remote: Vec<u32>,
    released_remote: Vec<u32>,
}

impl Mbarrier {
    /// Completes the phase once its arrivals came and its transactions balance.
    fn complete_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = self.count;
            let fresh = vec![0; self.released.len()];
            self.released = std::mem::replace(&mut self.releasing, fresh.clone());
            self.released_remote = std::mem::replace(&mut self.releasing_remote, fresh);
        }
    }

    /// The phase's releases that a wait at `scope` acquires (another block's: `.cluster`).
    fn releasing(&mut self, scope: MbarrierScope) -> &mut Vec<u32> {
        match scope {
            MbarrierScope::Cta => &mut self.releasing,
            MbarrierScope::Cluster => &mut self.releasing_remote,
        }
    }

    /// One arrival that releases `release` to waits at `scope` and first expects `tx_bytes`
    /// more of the phase's copies; the phase it arrived in.
    fn arrive(&mut self, release: &[u32], scope: MbarrierScope, tx_bytes: u32, key: u32) -> R<u32> {
        if self.pending == 0 {
            return Err(format!(
                "more arrivals at the mbarrier at shared byte {key} than its count of {} in one phase",
                self.count
            ));
        }
        let phase = self.completed;
        merge(self.releasing(scope), release);
        self.pending -= 1;
        self.tx += i64::from(tx_bytes);
        self.complete_if_done();
        Ok(phase)
    }

    /// Copies that completed `bytes` of the phase's transactions, releasing `release` to waits
    /// at `scope`.
    fn complete_tx(&mut self, release: &[u32], scope: MbarrierScope, bytes: u32) {
        merge(self.releasing(scope), release);
        self.tx -= i64::from(bytes);
        self.complete_if_done();
    }
}

impl Block<'_> {
    /// The `mbarrier` at `addr`, which thread `t` may use: initialized, and the initialization
    /// ordered before by a barrier.
    fn mbarrier(&mut self, t: usize, addr: u64) -> R<&mut Mbarrier> {
        let key = self.check_shared(addr, 8)? as u32;
        let Some(&Mbarrier { init: (by, epoch), .. }) = self.mbarriers.get(&key) else {
            return Err(format!("no mbarrier.init at shared byte {key}"));
        };
        if !self.ordered(by, epoch, t as u32) {
            return Err(format!(
                "thread {t} uses the mbarrier at shared byte {key} with no barrier after {} initialized it",
                self.describe(by)
            ));
        }
        Ok(self.mbarriers.get_mut(&key).expect("checked above"))
    }

    /// The `mbarrier` at shared byte `at`, which a thread of another block that knows `known`
    /// ([`Block::knowledge`]) reaches: initialized, and the initialization ordered before (by a
    /// `barrier.cluster`, say).
    pub(super) fn mbarrier_from_afar(&mut self, at: usize, known: &[u32]) -> R<&mut Mbarrier> {
        let key = at as u32;
        let Some(&Mbarrier { init: (by, _), init_fenced, .. }) = self.mbarriers.get(&key) else {
            return Err(format!("no mbarrier.init at shared byte {key} of the cluster's block {}", self.cluster.rank));
        };
        let Some(fenced) = init_fenced else {
            return Err(format!(
                "the mbarrier at shared byte {key} of the cluster's block {} is used from another block with no \
                 fence.mbarrier_init.release.cluster after its initialization",
                self.cluster.rank
            ));
        };
        if known[by as usize / 32] <= fenced {
            return Err(format!(
                "the mbarrier at shared byte {key} of the cluster's block {} is used from another block with no \
                 barrier.cluster after its fence.mbarrier_init",
                self.cluster.rank
            ));
        }
        Ok(self.mbarriers.get_mut(&key).expect("checked above"))
    }

    pub(super) fn mbarrier_init(&mut self, t: usize, addr: u64, count: u32) -> R<()> {
        let a = self.check_shared(addr, 8)?;
        if count == 0 || count >= 1 << 20 {
            return Err(format!("mbarrier.init count {count}: it must be 1 to 2^20 - 1"));
        }
        let writer = self.group_thread(t);
        for s in &mut self.shadow[a..a + 8] {
            *s = Shadow { written: true, writer, write_epoch: self.released, mbarrier: true, ..*s };
        }
        let cluster_warps = self.last_shared_barrier.len() / self.warps;

        let m = Mbarrier {
            count,
            pending: count,
            tx: 0,
            completed: 0,
            init: (writer, self.released),
            init_fenced: None,
            releasing: vec![0; cluster_warps],
            released: vec![0; cluster_warps],
            releasing_remote: vec![0; cluster_warps],
            released_remote: vec![0; cluster_warps],
        };
        self.mbarriers.insert(a as u32, m);
        Ok(())
    }

    /// `fence.mbarrier_init.release.cluster` by thread `t`: the mbarriers it initialized become
    /// usable from other blocks once something orders this fence before them.
    pub(super) fn fence_mbarrier_inits(&mut self, t: usize) {
        let (me, now) = (self.group_thread(t), self.released);
        for m in self.mbarriers.values_mut().filter(|m| m.init.0 == me && m.init_fenced.is_none()) {
            m.init_fenced = Some(now);
        }
    }

    /// One arrival of thread `t` that first expects `tx_bytes` more of the phase's copies;
    /// returns the phase it arrived in.
    pub(super) fn mbarrier_arrive(&mut self, t: usize, addr: u64, tx_bytes: u32) -> R<u64> {
        let release = self.release_from(t);
        let key = self.check_shared(addr, 8)? as u32;
        let phase = self.mbarrier(t, addr)?.arrive(&release, MbarrierScope::Cta, tx_bytes, key)?;
        Ok(u64::from(phase))
    }

    /// `cp.async.mbarrier.arrive.noinc`: thread `t`'s `cp.async` copies (committed or not, not
    /// yet waited for) land, then it arrives on the mbarrier at `addr`, which releases them. As
    /// a TMA box, they land when the simulator reaches the arrival; a later `wait_group` has
    /// none of them left to wait for.
    pub(super) fn cp_async_arrive(&mut self, t: usize, addr: u64) -> R<()> {
        // In issue order, so that a later copy to the same bytes lands last.
        let open = std::mem::take(&mut self.threads[t].open_group);
        let mut copies: Vec<_> = self.threads[t].groups.iter_mut().flat_map(std::mem::take).collect();
        copies.extend(open);
        self.land_copies(t, copies)?;
        self.mbarrier_arrive(t, addr, 0).map(|_| ())
    }

    /// A copy thread `t` issued completed `bytes` of the phase's transactions: like an
    /// arrival, it releases what it wrote.
    pub(super) fn mbarrier_complete_tx(&mut self, t: usize, addr: u64, bytes: u32) -> R<()> {
        let release = self.release_from(t);
        self.mbarrier(t, addr)?.complete_tx(&release, MbarrierScope::Cta, bytes);
        Ok(())
    }

    /// Another block's arrival at the mbarrier at shared byte `at`, releasing `release` (its
    /// warp's [`Block::release_from`]).
    pub(super) fn arrive_from_afar(&mut self, at: usize, release: &[u32]) -> R<()> {
        self.mbarrier_from_afar(at, release)?.arrive(release, MbarrierScope::Cluster, 0, at as u32).map(|_| ())
    }

    /// Another block's `st.async` completed `bytes` of the phase of the mbarrier at shared byte
    /// `at`, releasing `release`.
    pub(super) fn complete_tx_from_afar(&mut self, at: usize, bytes: u32, release: &[u32]) -> R<()> {
        self.mbarrier_from_afar(at, release)?.complete_tx(release, MbarrierScope::Cluster, bytes);
        Ok(())
    }

    /// Whether the phase of parity `parity` of the `mbarrier` at `addr` completed.
    pub(super) fn mbarrier_phase_done(&mut self, t: usize, addr: u64, parity: u64) -> R<bool> {
        let m = self.mbarrier(t, addr)?;
        Ok(u64::from(m.completed % 2) != parity % 2)
    }

    /// Thread `t` passed the completed phase: what its arrivals released (within `scope`) is
    /// ordered before what `t`'s warp does next.
    pub(super) fn mbarrier_acquire(&mut self, t: usize, addr: u64, scope: MbarrierScope) -> R<()> {
        let m = self.mbarrier(t, addr)?;
        let mut released = m.released.clone();
        if scope == MbarrierScope::Cluster {
            merge(&mut released, &m.released_remote);
        }
        self.acquire(t, &released);
        Ok(())
    }

    /// Why the phase thread `t` is parked at cannot complete: its arrivals never come, or they
    /// came and the transaction count is off (`expect_tx` and the copies' bytes differ).
    pub(super) fn stuck_phase(&mut self, t: usize) -> String {
        let Op::MbarrierWait { addr, .. } = self.prog.body[self.threads[t].pc].op else {
            unreachable!("threads park only at an mbarrier wait")
        };
        let a = self.get(t, &Src::Reg(addr));
        match self.mbarrier(t, a) {
            Ok(m) if m.pending == 0 && m.tx > 0 => {
                format!("whose copies delivered {} bytes fewer than its expect_tx", m.tx)
            }
            Ok(m) if m.pending == 0 => {
                format!("whose copies delivered {} bytes more than its expect_tx", -m.tx)
            }
            Ok(m) => format!("still {} arrival(s) short, which never come", m.pending),
            Err(e) => e,
        }
    }

    /// Wakes the threads parked at a `try_wait` or `test_wait` whose phase has completed.
    pub(super) fn unpark(&mut self) -> R<bool> {
        let mut woke = false;
        for t in 0..self.threads.len() {
            if !self.threads[t].parked {
                continue;
            }
            let Op::MbarrierWait { addr, parity, .. } = self.prog.body[self.threads[t].pc].op else {
                unreachable!("threads park only at an mbarrier wait")
            };
            let (a, p) = (self.get(t, &Src::Reg(addr)), self.get(t, &parity));
            if self.mbarrier_phase_done(t, a, p)? {
                self.threads[t].parked = false;
                self.threads[t].woke = true;
                woke = true;
            }
        }
        Ok(woke)
    }
}
