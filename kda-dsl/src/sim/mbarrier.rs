//! `mbarrier` objects in the simulated block: 8 shared bytes that only `mbarrier`
//! instructions touch, whose phases complete after their count of arrivals.
//!
//! A `try_wait` whose phase has not completed parks its thread until it does, and then
//! returns false once, as a hardware wait that timed out may: a program that does not loop on
//! it reads what the phase has not released yet. An arrival releases the arriving
//! warp's earlier shared accesses and a successful wait acquires them: the race checker orders
//! them before what the waiting warp does next, as it does across a barrier.

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
    /// The thread that initialized it, and the barrier epoch then.
    init: (u32, u32),
    /// The current phase's arrivals: (warp, epoch just after the arrival).
    arrivals: Vec<(usize, u32)>,
    /// The last completed phase's arrivals.
    released: Vec<(usize, u32)>,
}

impl Mbarrier {
    /// Completes the phase once its arrivals came and its transactions balance.
    fn complete_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = self.count;
            self.released = std::mem::take(&mut self.arrivals);
        }
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
                "thread {t} uses the mbarrier at shared byte {key} with no barrier after thread {by} initialized it"
            ));
        }
        Ok(self.mbarriers.get_mut(&key).expect("checked above"))
    }

    pub(super) fn mbarrier_init(&mut self, t: usize, addr: u64, count: u32) -> R<()> {
        let a = self.check_shared(addr, 8)?;
        if count == 0 || count >= 1 << 20 {
            return Err(format!("mbarrier.init count {count}: it must be 1 to 2^20 - 1"));
        }
        for s in &mut self.shadow[a..a + 8] {
            *s = Shadow { written: true, writer: t as u32, write_epoch: self.released, mbarrier: true, ..*s };
        }

        let m = Mbarrier {
            count,
            pending: count,
            tx: 0,
            completed: 0,
            init: (t as u32, self.released),
            arrivals: vec![],
            released: vec![],
        };
        self.mbarriers.insert(a as u32, m);
        Ok(())
    }

    /// One arrival of thread `t` that first expects `tx_bytes` more of the phase's copies;
    /// returns the phase it arrived in.
    pub(super) fn mbarrier_arrive(&mut self, t: usize, addr: u64, tx_bytes: u32) -> R<u64> {
        let epoch = self.release_epoch();
        let m = self.mbarrier(t, addr)?;
        if m.pending == 0 {
            return Err(format!(
                "more arrivals at the mbarrier at shared byte {addr} than its count of {} in one phase",
                m.count
            ));
        }
        let phase = m.completed;
        m.arrivals.push((t / 32, epoch));
        m.pending -= 1;
        m.tx += i64::from(tx_bytes);
        m.complete_if_done();
        Ok(u64::from(phase))
    }

    /// A copy thread `t` issued completed `bytes` of the phase's transactions: like an
    /// arrival, it releases what it wrote.
    pub(super) fn mbarrier_complete_tx(&mut self, t: usize, addr: u64, bytes: u32) -> R<()> {
        let epoch = self.release_epoch();
        let m = self.mbarrier(t, addr)?;
        m.arrivals.push((t / 32, epoch));
        m.tx -= i64::from(bytes);
        m.complete_if_done();
        Ok(())
    }

    /// A new epoch: a release orders what the warp did before it, not after.
    fn release_epoch(&mut self) -> u32 {
        self.released += 1;
        self.released
    }

    /// Whether the phase of parity `parity` of the `mbarrier` at `addr` completed.
    pub(super) fn mbarrier_phase_done(&mut self, t: usize, addr: u64, parity: u64) -> R<bool> {
        let m = self.mbarrier(t, addr)?;
        Ok(u64::from(m.completed % 2) != parity % 2)
    }

    /// Thread `t` passed the completed phase: what its arrivals released is ordered before
    /// what `t`'s warp does next.
    pub(super) fn mbarrier_acquire(&mut self, t: usize, addr: u64) -> R<()> {
        let released = self.mbarrier(t, addr)?.released.clone();
        let me = t / 32;
        for (warp, epoch) in released {
            let slot = &mut self.last_shared_barrier[warp * self.warps + me];
            *slot = (*slot).max(epoch);
        }
        Ok(())
    }

    /// Why the phase thread `t` is parked at cannot complete: its arrivals never come, or they
    /// came and the transaction count is off (`expect_tx` and the copies' bytes differ).
    pub(super) fn stuck_phase(&mut self, t: usize) -> String {
        let Op::MbarrierTryWait { addr, .. } = self.prog.body[self.threads[t].pc].op else {
            unreachable!("threads park only at mbarrier.try_wait")
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

    /// Wakes the threads parked at a `try_wait` whose phase has completed.
    pub(super) fn unpark(&mut self) -> R<bool> {
        let mut woke = false;
        for t in 0..self.threads.len() {
            if !self.threads[t].parked {
                continue;
            }
            let Op::MbarrierTryWait { addr, parity, .. } = self.prog.body[self.threads[t].pc].op else {
                unreachable!("threads park only at mbarrier.try_wait")
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
