//! Lowering of a warp-specialized TMA pipeline (`plan_pipelines::Handoff::EmptyBarriers`): the
//! fill warps are the producer, the compute warps the consumers, and no barrier spans both
//! inside the loop.
//!
//! The producer's copy of the loop waits for a stage's `empty` phase, then its first thread
//! raises the stage's `full` transaction count and issues the boxes; it runs as far ahead as
//! the stages allow. The consumers' copy waits for the stage's `full` phase, runs the body,
//! and arrives on the stage's `empty` barrier once done reading it: at the end of the same
//! iteration, or, with a `wgmma` group in flight, of the next one (after the `wait_group 1`
//! that retires the group which read it), the last stage after the exit's `wait_group 0`. Every
//! use of a stage thus completes one phase of each of its barriers, so a loop run again (inside
//! an outer loop) goes on from the phases it left.

use super::roles::Role;
use super::{Lower, WgmmaWait};
use crate::diag::{Diag, SrcLoc};
use crate::passes::plan_pipelines::{is_stage_fill, PipelinePlan, TmaPipeline};
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    /// One role's copy of the warp-specialized loop over `var` from `s0` to `e` (`plan`'s fills
    /// are `tma`'s boxes): the producer's for [`Role::Fill`], the consumers' otherwise.
    pub(super) fn warp_specialized_loop(
        &mut self,
        plan: &PipelinePlan,
        tma: &TmaPipeline,
        (s0, e): (Reg, Reg),
        body: &[Stmt],
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let def = &self.p.def;
        let fills: Vec<&Stmt> = body.iter().filter(|s| is_stage_fill(def, s)).collect();
        let rest: Vec<Stmt> = body.iter().filter(|s| !is_stage_fill(def, s)).cloned().collect();
        let home: Vec<Src> = plan.staged.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        self.consts.remove(&plan.var);
        self.em.loc = loc;
        let ring = self.open_stage_ring((s0, e));
        let (it, stage) = (ring.iter, ring.stage);
        self.var_regs.insert(plan.var, it);
        self.stage_bases(&plan.staged, &home, stage);
        let producer = self.role() == Some(Role::Fill);
        let in_flight = plan.wgmma_in_flight.is_some();
        if producer {
            let empty = self.empty_barrier(tma, plan.stages, Src::Reg(stage));
            let bits = self.tma_phases[&plan.var].empty.expect("a warp-specialized pipeline's empty phases");
            self.wait_phase(empty, bits, stage);
            // Inside the loop every iteration is live.
            self.tma_stage_fills(tma, &plan.prelude, &fills, Src::Reg(stage), None)?;
        } else {
            self.wait_tma_stage(plan.var, tma, stage);
            self.compute_warps_body(&plan.staged, &rest, WgmmaWait::in_pipeline(in_flight))?;
            self.em.loc = loc;
            if in_flight {
                // The group that read the previous iteration's stage has retired.
                let first = self.em.setp(Cmp::Eq, Ty::S32, it, s0);
                let previous = self.previous_stage(stage, plan.stages);
                self.release_stage(tma, plan.stages, previous, Some(first));
            } else {
                self.release_stage(tma, plan.stages, stage, None);
            }
        }
        self.close_stage_ring(ring, plan.stages);
        if !producer && in_flight {
            self.em.emit(Op::WgmmaWait { n: 0 });
            let none_ran = self.em.setp(Cmp::Eq, Ty::S32, it, s0);
            let last = self.previous_stage(stage, plan.stages);
            self.release_stage(tma, plan.stages, last, Some(none_ran));
        }
        // Both roles meet again after the loop (with the roles apart for the whole kernel, the
        // compute warps alone).
        self.block_barrier();
        for (k, b) in plan.staged.iter().enumerate() {
            self.shared_base[*b] = Some(home[k]);
        }
        Ok(())
    }

    /// The compute warps' copy of a warp-specialized loop's body `rest` (its fills and any
    /// producer block left out), its `wgmma`s waited for as `wait` says; every barrier in it
    /// is theirs alone.
    pub(super) fn compute_warps_body(&mut self, staged: &[BufId], rest: &[Stmt], wait: WgmmaWait) -> Result<(), Diag> {
        let outer = (std::mem::replace(&mut self.wgmma_wait, wait), std::mem::replace(&mut self.producer_apart, true));
        // The barrier passes put none at the top of a pipelined body (the pipeline's own was to
        // be there): with shared tiles beside the `staged` ones, the compute warps' barrier
        // orders one iteration's accesses before the next's.
        if self.touches_tiles_apart_from(staged, rest) {
            // The compute warps' own `cp.async` copies (a tile filled before the loop) land
            // first: the stage's mbarrier orders only what it hands over.
            self.wait_plain_async_copies();
            self.block_barrier();
        }
        let lowered = self.block(rest);
        (self.wgmma_wait, self.producer_apart) = outer;
        lowered
    }

    /// Whether `body` touches a shared tile other than the `staged` ones.
    fn touches_tiles_apart_from(&self, staged: &[BufId], body: &[Stmt]) -> bool {
        let mut used = vec![];
        crate::passes::infer_layouts::tiles_used(body, &mut used);
        used.into_iter().any(|b| !staged.contains(&b) && matches!(self.p.layouts[b], BufLayout::Shared(_)))
    }

    /// The stage before `stage` in a ring of `stages`.
    fn previous_stage(&mut self, stage: Reg, stages: u32) -> Reg {
        let previous = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, stage, Src::Imm(1));
        let wrap = self.em.setp(Cmp::Lt, Ty::S32, previous, Src::Imm(0));
        self.em.emit_if(wrap, true, Op::Mov { ty: Ty::B32, d: previous, a: Src::Imm(i64::from(stages) - 1) });
        previous
    }

    /// Every consumer arrives on the `empty` barrier of `stage`, unless `skip` holds.
    fn release_stage(&mut self, tma: &TmaPipeline, stages: u32, stage: Reg, skip: Option<Reg>) {
        let empty = self.empty_barrier(tma, stages, Src::Reg(stage));
        let state = self.em.reg(RegClass::B64);
        let arrive = Op::MbarrierArrive { state, addr: empty };
        match skip {
            Some(p) => self.em.emit_if(p, false, arrive),
            None => self.em.emit(arrive),
        }
    }
}
