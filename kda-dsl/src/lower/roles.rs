//! Fill warps (`launch(.., fill_warps = n)`): warps of their own that issue the stage fills of
//! `pipelined` loops while the kernel's `threads` run everything else.
//!
//! Outside pipelined loops both roles run the kernel's scalar skeleton (assignments, loops,
//! `if`s) and each tile operation sits behind a branch the fill warps take around it. A
//! pipelined loop is lowered twice behind one branch: the compute warps' copy runs the body
//! (one block of code, which the assembler schedules as without fill warps), the fill warps'
//! copy issues and awaits the fills and keeps the body's skeleton. Every statement and
//! pipeline barrier is barrier 0 over the whole block, and both copies pass the same ones
//! in the same order, so each stage's hand-off (filled and awaited by the fill warps, then the
//! barrier at the top of the iteration that reads it) is the ordinary pipeline order. What a
//! tile operation synchronizes inside uses the compute warps' own named barrier
//! ([`COMPUTE_BARRIER`]). Inside a pipelined loop the two roles reach each barrier from their
//! own copy, so it is `barrier.sync`: PTX's `bar.sync` is the `.aligned` form, which needs every
//! thread at one instruction (the simulator refuses it otherwise, as synccheck does).

use super::{Lower, Scope, ThreadRegs};
use crate::diag::Diag;
use crate::thread_ir::*;
use crate::tile::{Stmt, StmtKind};
use std::collections::HashMap;

/// The named barrier the compute warps synchronize with inside a tile operation (a kernel with
/// fill warps has no warp groups, whose barriers are 1 to 15 too).
pub(crate) const COMPUTE_BARRIER: u32 = 1;

/// Which threads the code being lowered runs on, in a kernel with fill warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Every thread: the kernel's scalar skeleton, and tile operations each behind a branch
    /// the fill warps take around it.
    Both,
    /// The compute warps only: tile operations run as they are.
    Compute,
    /// The fill warps only, in their scope: tile operations other than stage fills are left
    /// out, the skeleton and the barriers kept.
    Fill,
    /// The fill warps running a producer block (`producer_ring`): every statement, in their
    /// scope, each barrier their named one.
    Producer,
}

/// A kernel's fill warps, as the lowering sees them.
#[derive(Clone)]
pub(crate) struct FillWarps {
    /// True on the fill warps' threads.
    pub is_fill: Reg,
    /// Their scope: thread and warp indices counted from their first thread.
    pub scope: Scope,
    /// Where the lowering is.
    pub role: Role,
}

impl FillWarps {
    /// The fill warps of a block of `compute_threads` then `fill_warps` warps, with `th` the
    /// block's thread registers; emits what tells them apart.
    pub(crate) fn new(em: &mut super::Emitter, th: ThreadRegs, compute_threads: u32, fill_warps: u32) -> FillWarps {
        let compute_warps = i64::from(compute_threads / 32);
        // The warp index as lane 0 has it: the assembler then knows the roles' branch is the
        // same for every lane of a warp. Branching on the thread's own index makes each role's
        // code a divergent path to it, where it waits for every `wgmma` before issuing the
        // next (C7518).
        let warp = em.reg(RegClass::B32);
        em.emit(Op::Shfl { mode: super::ShflMode::Idx, d: warp, a: th.warp, b: Src::Imm(0), c: 0x1f });
        let is_fill = em.setp(Cmp::Ge, Ty::U32, Src::Reg(warp), Src::Imm(compute_warps));
        let tid = em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.tid, Src::Imm(i64::from(compute_threads)));
        let warp = em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.warp, Src::Imm(compute_warps));
        let scope = Scope {
            th: ThreadRegs { tid, warp, ..th },
            threads: 32 * fill_warps,
            // Fills synchronize nothing themselves.
            bar_id: Src::Imm(0),
            scratch_base: Src::Imm(0),
            frag_bases: HashMap::new(),
        };
        FillWarps { is_fill, scope, role: Role::Both }
    }
}

/// Whether `s` is a tile operation, which only the compute warps run in a kernel with fill
/// warps. Assignments, loops and `if`s are the skeleton both roles run; barriers both pass.
pub(crate) fn compute_only(s: &Stmt) -> bool {
    !matches!(s.kind, StmtKind::Assign(..) | StmtKind::For { .. } | StmtKind::If(..) | StmtKind::Barrier)
}

impl Lower<'_> {
    /// Where the lowering is, in a kernel with fill warps.
    pub(crate) fn role(&self) -> Option<Role> {
        self.fill_warps.as_ref().map(|f| f.role)
    }

    /// Lowers `f` as `role` (in the fill warps' scope for [`Role::Fill`]).
    pub(crate) fn in_role<T>(&mut self, role: Role, f: impl FnOnce(&mut Self) -> Result<T, Diag>) -> Result<T, Diag> {
        let fill = self.fill_warps.as_mut().expect("a kernel with fill warps");
        let outer_role = std::mem::replace(&mut fill.role, role);
        let fill_scope = fill.scope.clone();
        let outer_scope = (role == Role::Fill).then(|| std::mem::replace(&mut self.scope, fill_scope));
        let r = self.scoped_addresses(f);
        if let Some(scope) = outer_scope {
            self.scope = scope;
        }
        self.fill_warps.as_mut().expect("a kernel with fill warps").role = outer_role;
        r
    }

    /// Lowers `f` for the compute warps only: the fill warps branch around it, or (under an
    /// if-converted guard, where a branch cannot go) are guarded off.
    pub(crate) fn on_compute_warps(&mut self, f: impl FnOnce(&mut Self) -> Result<(), Diag>) -> Result<(), Diag> {
        let is_fill = self.fill_warps.as_ref().expect("a kernel with fill warps").is_fill;
        match self.em.guard {
            Some(g) => {
                let not_fill = self.em.not_unguarded(is_fill);
                let guard = self.em.and_unguarded(g, not_fill);
                let outer = self.em.guard.replace(guard);
                let r = self.in_role(Role::Compute, f);
                self.em.guard = outer;
                r
            }
            None => {
                let skip = self.em.label();
                self.em.emit_if(is_fill, true, Op::Bra { target: skip });
                let r = self.in_role(Role::Compute, f);
                self.em.emit(Op::Label(skip));
                r
            }
        }
    }

    /// The barrier of a statement or a pipeline: barrier 0 over the whole block in a kernel
    /// with fill warps (both roles pass each one, in the same order; inside a pipelined loop
    /// each from its own copy of the loop, so there it is `barrier.sync`), the scope's barrier
    /// otherwise.
    pub(crate) fn block_barrier(&mut self) {
        let reach = match self.role() {
            None => return self.barrier(),
            // Inside a warp-specialized loop (or a kernel with its roles apart) the fill warps
            // run apart: the compute warps' barriers are their own, the fill warps pass none.
            Some(Role::Compute) if self.producer_apart => return self.barrier(),
            Some(Role::Fill) if self.producer_apart => return,
            Some(Role::Producer) => return self.barrier(),
            Some(Role::Both) => BarrierReach::SameInstruction,
            Some(Role::Compute | Role::Fill) => BarrierReach::AnyInstruction,
        };
        self.em.emit(Op::Bar { id: Src::Imm(0), count: None, reach });
    }

    /// The kernel's `body` with its roles apart from here on (`RegisterPlan::Split`): the
    /// compute warpgroups take registers (`setmaxnreg.inc`) and run the body's tile operations,
    /// every barrier theirs alone; the fill warpgroups give registers back (`setmaxnreg.dec`)
    /// and run the skeleton and the producer's copy of each pipelined loop. The two paths never
    /// join (each ends the kernel), so the assembler fits the fill warps' path in their few
    /// registers; nothing but the loops' mbarriers passes between them.
    pub(crate) fn roles_apart(
        &mut self,
        body: &[Stmt],
        split: super::register_plan::RegisterSplit,
    ) -> Result<(), Diag> {
        let is_fill = self.fill_warps.as_ref().expect("a kernel with fill warps").is_fill;
        let producer = self.em.label();
        self.em.emit_if(is_fill, true, Op::Bra { target: producer });
        self.em.emit(Op::SetMaxNReg { raise: true, count: split.consumers });
        let outer = std::mem::replace(&mut self.producer_apart, true);
        let lowered = self.in_role(Role::Compute, |lw| lw.block(body));
        self.em.emit(Op::Ret);
        self.em.emit(Op::Label(producer));
        self.em.emit(Op::SetMaxNReg { raise: false, count: split.producer });
        let lowered = lowered.and_then(|()| self.in_role(Role::Fill, |lw| lw.block(body)));
        self.producer_apart = outer;
        lowered
    }

    /// `cp.async.wait_group 0` for the threads that issue plain (non-stage) async copies: the
    /// compute warps (the fill warps' groups are their pipeline's to wait for). Nothing in a
    /// kernel that issues none.
    pub(crate) fn wait_plain_async_copies(&mut self) {
        if !self.async_copies {
            return;
        }
        match self.fill_warps.as_ref().map(|f| (f.role, f.is_fill)) {
            None | Some((Role::Compute, _)) => self.em.emit(Op::CpAsyncWait { n: 0 }),
            Some((Role::Both, is_fill)) => self.em.emit_if(is_fill, false, Op::CpAsyncWait { n: 0 }),
            // A producer block copies nothing into shared memory but its loop's fills, which
            // its ring waits for.
            Some((Role::Fill | Role::Producer, _)) => {}
        }
    }
}
