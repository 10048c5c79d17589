//! Shared-memory bank conflicts, counted while the simulator runs a program: for each warp's
//! shared-memory instruction, the wavefronts the hardware takes to serve it against the fewest
//! its bytes need. A kernel author reads them per source line (`kda conflicts`) to find the
//! accesses that serialize, which neither the PTX nor ptxas shows.
//!
//! The model (the CUDA programming guide's, compute capability 5.0 on): 32 banks of 4-byte
//! words; lanes reading the same word share it. A request of 4 bytes a lane or fewer is served
//! for the whole warp at once, 8 bytes in two phases of 16 lanes, 16 bytes in four of 8 lanes
//! (an `ldmatrix` matrix is one such phase: 8 row addresses of 16 bytes). A phase takes as many
//! wavefronts as the most distinct words any one bank holds among its lanes' bytes; the fewest
//! it can take is 1. `cp.async` counts its 16-byte write into shared memory. `wgmma`'s and the
//! bulk copies' shared operands go through the async proxy in whole swizzled lines and are not
//! counted.
//!
//! These are the PTX's requests. ptxas may merge a thread's adjacent scalar accesses into one
//! vector (`LDS.64`, `LDS.128`), which the hardware then serves as such: a line flagged with
//! 4-byte requests may cost less in the SASS, so confirm it there (`cuobjdump -sass`) before
//! changing a layout for it.
//!
//! Counting is off unless a caller asks for it ([`with_shared_access_stats`]): it records every
//! shared access of every thread.

use crate::diag::SrcLoc;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// The kind of a counted shared-memory instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SharedOp {
    /// `ld.shared`.
    Load,
    /// `st.shared`.
    Store,
    /// `cp.async`'s write into shared memory.
    CpAsync,
    /// `ldmatrix`.
    Ldmatrix,
}

impl SharedOp {
    /// The PTX instruction's name.
    pub fn name(self) -> &'static str {
        match self {
            SharedOp::Load => "ld.shared",
            SharedOp::Store => "st.shared",
            SharedOp::CpAsync => "cp.async",
            SharedOp::Ldmatrix => "ldmatrix",
        }
    }
}

/// One source line's shared-memory instructions of one kind, summed over the warps and blocks
/// the counting scope ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedAccessStat {
    /// The kernel line.
    pub loc: SrcLoc,
    /// The instruction.
    pub op: SharedOp,
    /// Warp-level executions.
    pub requests: u64,
    /// Wavefronts they took.
    pub wavefronts: u64,
    /// The fewest they could take (one a phase).
    pub ideal: u64,
}

impl SharedAccessStat {
    /// Wavefronts past the fewest: what bank conflicts cost.
    pub fn excess(&self) -> u64 {
        self.wavefronts - self.ideal
    }
}

thread_local! {
    static COUNTS: RefCell<Option<HashMap<(SrcLoc, SharedOp), SharedAccessStat>>> = const { RefCell::new(None) };
}

/// Runs `f` with bank-conflict counting on for every simulation it runs on this thread, and
/// returns what it returned with the counts, the most excess wavefronts first.
pub fn with_shared_access_stats<T>(f: impl FnOnce() -> T) -> (T, Vec<SharedAccessStat>) {
    let outer = COUNTS.with(|c| c.borrow_mut().replace(HashMap::new()));
    let out = f();
    let counts = COUNTS.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer));
    let mut stats: Vec<SharedAccessStat> = counts.unwrap_or_default().into_values().collect();
    stats.sort_by_key(|s| (std::cmp::Reverse(s.excess()), std::cmp::Reverse(s.wavefronts), s.loc.line, s.op));
    (out, stats)
}

/// Whether a counting scope is open on this thread.
pub(super) fn counting() -> bool {
    COUNTS.with(|c| c.borrow().is_some())
}

/// One lane's part of a warp's shared request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneRequest {
    /// The lane (0 to 31).
    pub lane: usize,
    /// Its first byte's shared address.
    pub addr: u64,
    /// Its bytes.
    pub bytes: u32,
}

/// One lane's shared access: the instruction, how many times the lane had run it before, the
/// byte address and width.
#[derive(Clone, Copy)]
pub(super) struct LaneAccess {
    pub pc: usize,
    pub instance: u32,
    pub addr: u64,
    pub bytes: u32,
}

/// The shared accesses of one block's threads, recorded while it runs.
pub(super) struct BankRecorder {
    /// Per thread, its accesses in order.
    accesses: Vec<Vec<LaneAccess>>,
    /// Per thread, how many times it ran each instruction that accessed shared memory.
    instances: Vec<HashMap<usize, u32>>,
    /// Warp-level requests counted whole (`ldmatrix`): (pc, wavefronts, ideal).
    whole: Vec<(usize, u64, u64)>,
}

impl BankRecorder {
    pub(super) fn new(threads: usize) -> BankRecorder {
        BankRecorder { accesses: vec![vec![]; threads], instances: vec![HashMap::new(); threads], whole: vec![] }
    }

    /// Thread `t`'s access at instruction `pc`.
    pub(super) fn record(&mut self, t: usize, pc: usize, addr: u64, bytes: u32) {
        let n = self.instances[t].entry(pc).or_insert(0);
        self.accesses[t].push(LaneAccess { pc, instance: *n, addr, bytes });
        *n += 1;
    }

    /// A whole warp's request at `pc`.
    pub(super) fn record_warp(&mut self, pc: usize, lanes: &[LaneRequest]) {
        let (w, i) = wavefronts(lanes);
        self.whole.push((pc, w, i));
    }

    /// Adds the block's counts to the open scope, each instruction's under its line and kind.
    pub(super) fn finish(self, loc_op: impl Fn(usize) -> (SrcLoc, SharedOp)) {
        // Per instruction: requests, wavefronts, the fewest.
        let mut per_pc: HashMap<usize, (u64, u64, u64)> = HashMap::new();
        let mut add = |pc: usize, (w, i): (u64, u64)| {
            let e = per_pc.entry(pc).or_default();
            *e = (e.0 + 1, e.1 + w, e.2 + i);
        };
        for (pc, w, i) in self.whole {
            add(pc, (w, i));
        }
        for warp in self.accesses.chunks(32) {
            let mut requests: HashMap<(usize, u32), Vec<LaneRequest>> = HashMap::new();
            for (lane, acc) in warp.iter().enumerate() {
                for a in acc {
                    requests.entry((a.pc, a.instance)).or_default().push(LaneRequest {
                        lane,
                        addr: a.addr,
                        bytes: a.bytes,
                    });
                }
            }
            for ((pc, _), lanes) in requests {
                add(pc, wavefronts(&lanes));
            }
        }
        COUNTS.with(|c| {
            if let Some(counts) = c.borrow_mut().as_mut() {
                for (pc, (requests, wavefronts, ideal)) in per_pc {
                    let (loc, op) = loc_op(pc);
                    let s = counts.entry((loc, op)).or_insert(SharedAccessStat {
                        loc,
                        op,
                        requests: 0,
                        wavefronts: 0,
                        ideal: 0,
                    });
                    s.requests += requests;
                    s.wavefronts += wavefronts;
                    s.ideal += ideal;
                }
            }
        });
    }
}

/// The wavefronts one warp's request takes, and the fewest it could: phases of
/// `32 / (bytes / 4)` lanes (at least one word a lane).
pub fn wavefronts(lanes: &[LaneRequest]) -> (u64, u64) {
    let bytes = lanes.iter().map(|l| l.bytes).max().unwrap_or(4).max(4);
    let per_phase = (32 / (bytes / 4)).max(1) as usize;
    let mut phases: HashMap<usize, HashSet<u64>> = HashMap::new();
    for &LaneRequest { lane, addr, bytes: n } in lanes {
        let words = phases.entry(lane / per_phase).or_default();
        for word in addr / 4..(addr + u64::from(n.max(1))).div_ceil(4) {
            words.insert(word);
        }
    }
    let mut total = 0;
    for words in phases.values() {
        let mut per_bank = [0u64; 32];
        for w in words {
            per_bank[(w % 32) as usize] += 1;
        }
        total += per_bank.iter().copied().max().unwrap_or(0).max(1);
    }
    (total, phases.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warp(bytes: u32, addr: impl Fn(u64) -> u64) -> Vec<LaneRequest> {
        (0..32u64).map(|l| LaneRequest { lane: l as usize, addr: addr(l), bytes }).collect()
    }

    /// Consecutive words are one wavefront; a column of a 32-word row pitch puts every lane in
    /// one bank (32); one shared word is a broadcast; 16-byte vectors take four phases, and a
    /// pitch of 8 words within each makes two lanes share banks.
    #[test]
    fn wavefronts_follow_the_bank_model() {
        assert_eq!(wavefronts(&warp(4, |l| 4 * l)), (1, 1));
        assert_eq!(wavefronts(&warp(4, |l| 128 * l)), (32, 1));
        assert_eq!(wavefronts(&warp(4, |_| 64)), (1, 1));
        assert_eq!(wavefronts(&warp(4, |l| 8 * l)), (2, 1));
        assert_eq!(wavefronts(&warp(16, |l| 16 * l)), (4, 4));
        assert_eq!(wavefronts(&warp(16, |l| 32 * l)), (8, 4));
        assert_eq!(wavefronts(&warp(8, |l| 8 * l)), (2, 2));
        // Half a warp: one phase of 4-byte accesses.
        let half: Vec<_> = warp(4, |l| 4 * l).into_iter().take(16).collect();
        assert_eq!(wavefronts(&half), (1, 1));
    }
}
