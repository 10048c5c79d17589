//! Lowering of a pipeline whose stage fills are TMA boxes (`plan_pipelines::StageFills::
//! TensorBoxes`): one thread raises a stage's mbarrier transaction count by the stage's bytes
//! and issues its boxes; every thread that reads the stage waits for the stage's phase.
//!
//! The mbarriers are initialized once, at the kernel's entry (a stage's `full` barrier takes one
//! arrival a phase, the issuing thread's `arrive.expect_tx`; with warp specialization its
//! `empty` barrier takes one from each consumer, `producer.rs`), and each waiting thread keeps
//! one parity bit per stage, so a pipelined loop run many times (inside an outer loop) goes on
//! from the phase it left. Without warp specialization the barrier at the top of each
//! iteration still orders a stage's last readers before its refill, as with `cp.async`.

use super::{Lower, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::passes::plan_pipelines::{Handoff, StageFills, TmaPipeline};
use crate::passes::plan_tma_stores::TmaStore;
use crate::thread_ir::*;
use crate::tile::*;
use crate::tma_choice::TmaBoxes;

/// Bytes of one mbarrier.
pub(super) const MBARRIER_BYTES: i64 = 8;

/// The phase of a fresh mbarrier a thread waits for first.
#[derive(Clone, Copy)]
pub(super) enum PhaseStart {
    /// Phase 0: the first the arrivals complete (what a reader waits for).
    Phase0,
    /// The phase "before" phase 0, which counts as complete (what a producer waits for before
    /// it first fills a stage).
    BeforePhase0,
}

/// The parity bits, one per stage, of the phases a TMA pipeline's threads wait for next.
#[derive(Clone, Copy)]
pub(crate) struct TmaPhases {
    /// The readers': of the `full` barriers.
    pub full: Reg,
    /// The producer's, of the `empty` barriers (with [`Handoff::EmptyBarriers`]).
    pub empty: Option<Reg>,
}

impl Lower<'_> {
    /// At the kernel's entry: each tensor map's generic address (a by-value parameter's), each
    /// TMA pipeline's mbarriers initialized by thread 0, fenced for the async proxy, then a
    /// barrier so no thread waits on one before it is initialized. Returns the maps' parameters.
    pub(super) fn tma_entry(&mut self) -> Vec<(String, ParamKind)> {
        let mut params = vec![];
        for sig in &self.p.tensor_maps {
            let name = super::param_name(&sig.name);
            let at = self.em.reg(RegClass::B64);
            self.em.emit(Op::ParamAddress { d: at, name: name.clone() });
            let generic = self.em.reg(RegClass::B64);
            self.em.emit(Op::CvtaParam { d: generic, a: at });
            self.tensor_maps.push(generic);
            params.push((name, ParamKind::TensorMap(sig.clone())));
        }
        let pipelines: Vec<(VarId, u32, TmaPipeline)> = self
            .p
            .pipelines
            .iter()
            .filter_map(|plan| match &plan.fills {
                StageFills::TensorBoxes(tma) => Some((plan.var, plan.stages, tma.clone())),
                StageFills::AsyncCopies { .. } => None,
            })
            .collect();
        if pipelines.is_empty() {
            return params;
        }
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        for (var, stages, tma) in pipelines {
            // The `full` barriers complete on the issuing thread's arrival and the boxes' bytes;
            // the `empty` ones on every consumer's arrival.
            let empty_count = match tma.handoff {
                Handoff::BlockBarrier => None,
                Handoff::EmptyBarriers { consumers } => Some(consumers),
            };
            let counts = (0..stages).map(|_| 1).chain((0..stages).filter_map(|_| empty_count));
            self.init_mbarriers(first, tma.barriers, counts);
            // Readers wait for phase 0 of a stage first; the producer waits for the phase
            // "before" phase 0 of an `empty` barrier, which counts as complete.
            let full = self.phase_bits(PhaseStart::Phase0);
            let empty = empty_count.map(|_| self.phase_bits(PhaseStart::BeforePhase0));
            self.tma_phases.insert(var, TmaPhases { full, empty });
        }
        // The initialized barriers visible to the async proxy (TMA completes on them), then
        // to every thread.
        self.em.emit_if(first, true, Op::FenceProxyAsync);
        self.em.emit(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
        params
    }

    /// Thread `first` (a predicate) initializes the array of mbarriers at shared byte `at`,
    /// one per count, each completing a phase on that many arrivals.
    pub(super) fn init_mbarriers(&mut self, first: Reg, at: u32, counts: impl Iterator<Item = u32>) {
        for (k, count) in counts.enumerate() {
            let addr = self.em.add32(self.smem, Src::Imm(i64::from(at) + MBARRIER_BYTES * k as i64));
            let addr = self.em.to_reg(addr, RegClass::B32, Ty::U32);
            self.em.emit_if(first, true, Op::MbarrierInit { addr, count });
        }
    }

    /// A register of parity bits, one per stage, for the phase a thread waits for first.
    pub(super) fn phase_bits(&mut self, start: PhaseStart) -> Reg {
        let bits = self.em.reg(RegClass::B32);
        let all = match start {
            PhaseStart::Phase0 => 0,
            PhaseStart::BeforePhase0 => -1,
        };
        self.em.emit(Op::Mov { ty: Ty::B32, d: bits, a: Src::Imm(all) });
        bits
    }

    /// The shared address of the `full` mbarrier of `stage` of `tma` (its boxes complete it).
    fn stage_barrier(&mut self, tma: &TmaPipeline, stage: Src) -> Reg {
        self.barrier_at(i64::from(tma.barriers), stage)
    }

    /// The shared address of the `empty` mbarrier of `stage` of `tma`, a loop of `stages`.
    pub(super) fn empty_barrier(&mut self, tma: &TmaPipeline, stages: u32, stage: Src) -> Reg {
        self.barrier_at(i64::from(tma.barriers) + MBARRIER_BYTES * i64::from(stages), stage)
    }

    /// The mbarrier `stage` of an array of them at shared byte `first`.
    pub(super) fn barrier_at(&mut self, first: i64, stage: Src) -> Reg {
        let base = self.em.add32(self.smem, Src::Imm(first));
        let addr = match stage {
            Src::Imm(s) => self.em.add32(base, Src::Imm(MBARRIER_BYTES * s)),
            stage => {
                let off = self.em.mul32(stage, Src::Imm(MBARRIER_BYTES));
                self.em.add32(base, off)
            }
        };
        self.em.to_reg(addr, RegClass::B32, Ty::U32)
    }

    /// One stage's fills as TMA boxes into `stage` (the tiles' `shared_base` already at that
    /// stage), after the `prelude` they read: thread 0 of the scope, where `live` holds (always
    /// without one), raises the stage's transaction count by the stage's bytes and issues every
    /// box.
    pub(super) fn tma_stage_fills(
        &mut self,
        tma: &TmaPipeline,
        prelude: &[Stmt],
        fills: &[&Stmt],
        stage: Src,
        live: Option<Reg>,
    ) -> Result<(), Diag> {
        self.block(prelude)?;
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let issue = self.em.and_pred(Some(first), live).expect("a predicate");
        let mbar = self.stage_barrier(tma, stage);
        let state = self.em.reg(RegClass::B64);
        self.em.emit_if(issue, true, Op::MbarrierArriveExpectTx { state, addr: mbar, bytes: tma.stage_bytes });
        for (f, (boxes, map)) in fills.iter().zip(&tma.fills) {
            let StmtKind::Copy { src: Region::Global { offset, .. }, dst: Region::Buf(b) } = &f.kind else {
                unreachable!("a stage fill")
            };
            self.em.loc = f.loc;
            let map = self.tensor_maps[*map];
            for (dst, at) in self.slab_boxes(boxes, offset, *b, f.loc)? {
                self.em.emit_if(issue, true, Op::TmaLoad { dst, map, at, mbar });
            }
        }
        Ok(())
    }

    /// The boxes of one copy between shared tile `b` and the global box at `offset` (outer
    /// axis first, as written): per slab, its shared address and its element coordinates in
    /// registers, inner axis first (as the tensor map numbers them).
    fn slab_boxes(
        &mut self,
        boxes: &TmaBoxes,
        offset: &[Expr],
        b: BufId,
        loc: SrcLoc,
    ) -> Result<Vec<(Reg, Vec<Reg>)>, Diag> {
        let mut outer = vec![];
        for e in offset[..offset.len() - 1].iter().rev() {
            let V { s, .. } = self.expr(e, DType::I32, loc)?;
            outer.push(self.em.to_reg(s, RegClass::B32, Ty::S32));
        }
        let V { s: x0, .. } = self.expr(&offset[offset.len() - 1], DType::I32, loc)?;
        let base = self.shared_base[b].expect("a shared tile");
        let mut out = vec![];
        for k in 0..boxes.boxes {
            let x = self.em.add32(x0, Src::Imm(i64::from(k * boxes.map.box_extent[0])));
            let x = self.em.to_reg(x, RegClass::B32, Ty::S32);
            let at = self.em.add32(base, Src::Imm(i64::from(k * boxes.box_bytes())));
            let coords = std::iter::once(x).chain(outer.iter().copied()).collect();
            out.push((self.em.to_reg(at, RegClass::B32, Ty::U32), coords));
        }
        Ok(out)
    }

    /// Waits for the phase of stage `rd` of the TMA pipeline over `var` that brings its next
    /// fill, then flips the stage's parity bit.
    pub(super) fn wait_tma_stage(&mut self, var: VarId, tma: &TmaPipeline, rd: Reg) {
        let mbar = self.stage_barrier(tma, Src::Reg(rd));
        self.wait_phase(mbar, self.tma_phases[&var].full, rd);
    }

    /// Waits for the phase of the mbarrier at `mbar` whose parity is bit `stage` of `bits`,
    /// then flips that bit.
    pub(super) fn wait_phase(&mut self, mbar: Reg, phases: Reg, stage: Reg) {
        self.wait_phase_at(mbar, phases, stage, MbarrierScope::Cta);
    }

    /// [`Lower::wait_phase`], acquiring what the phase released within `scope`.
    pub(super) fn wait_phase_at(&mut self, mbar: Reg, phases: Reg, stage: Reg, scope: MbarrierScope) {
        let rd = stage;
        let bit = self.em.bin(BinKind::Shr, Ty::U32, RegClass::B32, phases, Src::Reg(rd));
        let parity = self.em.bin(BinKind::And, Ty::B32, RegClass::B32, bit, Src::Imm(1));
        let (again, done) = (self.em.label(), self.em.reg(RegClass::Pred));
        self.em.emit(Op::Label(again));
        let kind = MbarrierWaitKind::for_target(self.p.target);
        self.em.emit(Op::MbarrierWait { d: done, addr: mbar, parity: Src::Reg(parity), kind, scope });
        self.em.emit_if(done, false, Op::Bra { target: again });
        self.count_phase(phases, rd, None);
    }

    /// Flips `stage`'s bit of `phases` (where `when` holds, if given): one more phase of that
    /// stage's mbarrier counted, so the next wait on it is for the phase after.
    pub(super) fn count_phase(&mut self, phases: Reg, stage: Reg, when: Option<Reg>) {
        let one = self.em.reg(RegClass::B32);
        self.em.emit(Op::Mov { ty: Ty::B32, d: one, a: Src::Imm(1) });
        let mask = self.em.bin(BinKind::Shl, Ty::B32, RegClass::B32, one, Src::Reg(stage));
        let flip = Op::Bin { op: BinKind::Xor, ty: Ty::B32, d: phases, a: Src::Reg(phases), b: Src::Reg(mask) };
        match when {
            Some(p) => self.em.emit_if(p, true, flip),
            None => self.em.emit(flip),
        }
    }

    /// The copy of shared tile `store.buf` to the global box `dst` as TMA bulk stores: thread 0
    /// of the scope issues one per slab, commits them and waits until they have read the tile
    /// (so it may be written again, and the block may exit). The barrier before the copy, and
    /// the writers' proxy fences before it (`proxy_fences`), order the tile's writes first.
    pub(super) fn tma_store(&mut self, store: &TmaStore, dst: &Region, loc: SrcLoc) -> Result<(), Diag> {
        let Region::Global { offset, .. } = dst else { unreachable!("a global box") };
        let (boxes, map) = &store.boxes;
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let map = self.tensor_maps[*map];
        for (src, at) in self.slab_boxes(boxes, offset, store.buf, loc)? {
            self.em.emit_if(first, true, Op::TmaStore { map, at, src });
        }
        self.em.emit_if(first, true, Op::BulkCommit);
        self.em.emit_if(first, true, Op::BulkWaitRead { n: 0 });
        Ok(())
    }
}
