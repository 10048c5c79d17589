//! Where a body's `wgmma` groups are waited for. A `gemm` on `wgmma` commits its group and goes
//! on; its `wgmma.wait_group` comes before the first later statement of the same body that
//! touches its accumulator, or (moved before the last barrier since the group's issue, since
//! another thread may write once past it) that writes a shared tile it reads or is a loop,
//! branch or warp group, and at the end of the body. So independent products overlap (the
//! prefill's `S kdᵀ` and `S qdᵀ`, its two key products), and everything between a product and
//! its first use runs beside it, barriers included.
//!
//! Groups retire in order: retiring a group retires every older one, so a wait keeps the newer
//! groups in flight (`wgmma.wait_group keep`). The first group in flight also gets a wait
//! before it, with nothing pending: free at run time, it keeps ptxas from injecting waits of
//! its own between the K-steps ([`WaitReason::Settled`]). The simulator checks what this leaves pending
//! (a register a pending `wgmma` owns, a shared write under its read, an exit with groups
//! pending).

use std::fmt;

use crate::analysis::tile_access::tile_access;
use crate::tile::*;

/// One `wgmma` group in flight: its accumulator and the shared tiles it reads asynchronously.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// The accumulator fragment.
    pub acc: BufId,
    /// The shared operands read through descriptors (not those loaded into registers first).
    pub shared: Vec<BufId>,
}

/// Why a wait sits where it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitReason {
    /// The statement reads or writes a pending group's accumulator.
    Accumulator(BufId),
    /// The statement writes a shared tile a pending group reads.
    SharedOperand(BufId),
    /// A loop, branch or warp group follows: its body is planned on its own.
    ControlFlow,
    /// A later statement writes a shared operand (or is a loop, branch or warp group): the
    /// wait comes before the last barrier since the group's issue, after which other threads
    /// may write.
    Barrier,
    /// The body ends.
    End,
    /// The statement issues the body's first group in flight: nothing is pending, so the wait
    /// costs nothing, but it tells ptxas that the registers the product reads belong to no
    /// pending group (across loops and branches it loses track and injects waits of its own
    /// between the K-steps, C7517, which serialize them).
    Settled,
}

/// A `wgmma.wait_group keep` before statement `at` of a body (`at` = its length: after the
/// last), keeping the `keep` newest groups in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    /// The statement it comes before.
    pub at: usize,
    /// Groups left in flight.
    pub keep: u32,
    /// Why here.
    pub why: WaitReason,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wait_group {} before statement {} ({:?})", self.keep, self.at, self.why)
    }
}

/// The waits of `body`, whose statements' `wgmma` groups `group_of` gives (`None`: the statement
/// issues none).
pub(crate) fn plan_waits(body: &[Stmt], mut group_of: impl FnMut(&Stmt) -> Option<Group>) -> Vec<Wait> {
    // Each pending group with the statement that issued it, oldest first.
    let mut pending: Vec<(Group, usize)> = vec![];
    let mut waits = vec![];
    // The last barrier of the body so far.
    let mut last_barrier = None;
    for (at, s) in body.iter().enumerate() {
        let retire = match &s.kind {
            _ if pending.is_empty() => None,
            StmtKind::For { .. } | StmtKind::If(..) | StmtKind::WarpGroup { .. } => {
                Some((pending.len() - 1, WaitReason::ControlFlow))
            }
            _ => {
                let access = tile_access(s);
                // The newest group the statement conflicts with, and why.
                pending.iter().enumerate().rev().find_map(|(k, (g, _))| {
                    if access.touches(g.acc) {
                        return Some((k, WaitReason::Accumulator(g.acc)));
                    }
                    g.shared.iter().find(|b| access.writes.contains(b)).map(|b| (k, WaitReason::SharedOperand(*b)))
                })
            }
        };
        if let Some((k, why)) = retire {
            // Another thread's write of a shared operand (in the statement, or somewhere in a
            // loop or branch) comes after a barrier it passes once every thread has waited:
            // the wait goes before the last barrier since the group's issue (with the groups
            // pending there), so every thread's wait precedes the write. An accumulator is the
            // thread's own: its wait goes right before the access.
            let barrier = last_barrier.filter(|b| *b > pending[k].1);
            let (wait_at, why) = match (why, barrier) {
                (WaitReason::Accumulator(_), _) | (_, None) => (at, why),
                (_, Some(b)) => (b, WaitReason::Barrier),
            };
            let newer_before = pending[k + 1..].iter().filter(|(_, issued)| *issued < wait_at).count();
            waits.push(Wait { at: wait_at, keep: newer_before as u32, why });
            pending.drain(..=k);
        }
        if matches!(s.kind, StmtKind::Barrier) {
            last_barrier = Some(at);
        }
        let group = group_of(s);
        // (A wait for every group right here settles them already.)
        if group.is_some() && pending.is_empty() && !waits.iter().any(|w| w.at == at && w.keep == 0) {
            waits.push(Wait { at, keep: 0, why: WaitReason::Settled });
        }
        pending.extend(group.map(|g| (g, at)));
    }
    if !pending.is_empty() {
        waits.push(Wait { at: body.len(), keep: 0, why: WaitReason::End });
    }
    waits.sort_by_key(|w| w.at);
    waits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::SrcLoc;

    fn at(kind: StmtKind) -> Stmt {
        Stmt { kind, loc: SrcLoc::new("test.rs", 1, 1) }
    }

    fn gemm(a: BufId, b: BufId, c: BufId) -> Stmt {
        let operand = |buf| Operand { buf, transposed: false, replicated: false };
        at(StmtKind::Gemm { a: operand(a), b: operand(b), c })
    }

    /// A gemm's group: its accumulator, its B operand read from shared memory.
    fn group(st: &Stmt) -> Option<Group> {
        match &st.kind {
            StmtKind::Gemm { b, c, .. } => Some(Group { acc: *c, shared: vec![b.buf] }),
            _ => None,
        }
    }

    /// `x` filled from an element of `b`: a read of `b`.
    fn read_into(x: BufId, b: BufId) -> Stmt {
        at(StmtKind::Fill(x, Expr::Elem(b, vec![Expr::Int(0, None)])))
    }

    /// Two independent products stay in flight together; the first read of the older one's
    /// accumulator retires it alone (the newer kept), the newer one's accumulator retires it;
    /// a write of a shared operand, a loop and the body's end each retire what is pending.
    #[test]
    fn groups_retire_at_their_first_conflict() {
        let [s, kd, qd, w, o, x, y] = [0, 1, 2, 3, 4, 5, 6].map(BufId::new);
        let read = |b: BufId| read_into(x, b);
        let body = [gemm(s, kd, w), gemm(s, qd, o), read(w), read(o), read(y)];
        let waits = plan_waits(&body, group);
        let settled = |at| Wait { at, keep: 0, why: WaitReason::Settled };
        let want = [
            settled(0),
            Wait { at: 2, keep: 1, why: WaitReason::Accumulator(w) },
            Wait { at: 3, keep: 0, why: WaitReason::Accumulator(o) },
        ];
        assert_eq!(waits, want);
        // Overwriting `kd` while `S kdᵀ` reads it.
        let body = [gemm(s, kd, w), at(StmtKind::Fill(kd, Expr::Float(0.0)))];
        assert_eq!(plan_waits(&body, group), [settled(0), Wait { at: 1, keep: 0, why: WaitReason::SharedOperand(kd) }]);
        let body = [gemm(s, kd, w), at(StmtKind::If(Expr::Bool(true), vec![], vec![]))];
        assert_eq!(plan_waits(&body, group)[1].why, WaitReason::ControlFlow);
        assert!(plan_waits(&[read(y)], group).is_empty(), "no group, no wait");
    }

    /// A barrier alone retires nothing; a later write of a shared operand (which another
    /// thread may make once past a barrier) retires its group before the last barrier since
    /// the group's issue, keeping the groups issued before that barrier but after it; an
    /// accumulator's read after a barrier waits right there.
    #[test]
    fn groups_stay_in_flight_across_barriers_until_an_operand_is_written() {
        let [s, kd, qd, w, o, x, y] = [0, 1, 2, 3, 4, 5, 6].map(BufId::new);
        let read = |b: BufId| read_into(x, b);
        let barrier = || at(StmtKind::Barrier);
        let write_kd = || at(StmtKind::Fill(kd, Expr::Float(0.0)));
        let settled = |at| Wait { at, keep: 0, why: WaitReason::Settled };
        let end = |at| Wait { at, keep: 0, why: WaitReason::End };
        let body = [gemm(s, kd, w), barrier(), gemm(s, qd, o)];
        assert_eq!(plan_waits(&body, group), [settled(0), end(3)]);
        let body = [gemm(s, kd, w), read(y), barrier(), read(y), barrier(), write_kd()];
        assert_eq!(plan_waits(&body, group), [settled(0), Wait { at: 4, keep: 0, why: WaitReason::Barrier }]);
        let body = [gemm(s, kd, w), barrier(), gemm(s, qd, o), barrier(), write_kd()];
        let want = [settled(0), Wait { at: 3, keep: 1, why: WaitReason::Barrier }, end(5)];
        assert_eq!(plan_waits(&body, group), want);
        let body = [gemm(s, kd, w), barrier(), read(w)];
        assert_eq!(plan_waits(&body, group)[1], Wait { at: 2, keep: 0, why: WaitReason::Accumulator(w) });
        // Without a barrier since the issue the wait stays at the write.
        let body = [barrier(), gemm(s, kd, w), write_kd()];
        assert_eq!(plan_waits(&body, group)[1], Wait { at: 2, keep: 0, why: WaitReason::SharedOperand(kd) });
        // A loop retires what is pending before the last barrier as well.
        let body = [gemm(s, kd, w), barrier(), at(StmtKind::If(Expr::Bool(true), vec![], vec![]))];
        assert_eq!(plan_waits(&body, group)[1], Wait { at: 1, keep: 0, why: WaitReason::Barrier });
    }
}
