//! Lowering of loops: `unroll` (at compile time), `serial` (a run-time loop) and `pipelined`
//! (a multi-stage pipeline of `cp.async` copies or TMA boxes (`tma.rs`) whose stage-filling
//! copies run ahead of the compute).

use super::roles::Role;
use super::{Lower, WgmmaWait, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::passes::plan_pipelines::{is_stage_fill, Handoff, PipelinePlan, StageFills, TmaPipeline};
use crate::thread_ir::*;
use crate::tile::*;

impl Lower<'_> {
    pub(crate) fn for_loop(
        &mut self,
        var: VarId,
        kind: LoopKind,
        start: &Expr,
        end: &Expr,
        body: &[Stmt],
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        match kind {
            LoopKind::Unroll => {
                let (Some(a), Some(b)) = (self.const_of(start), self.const_of(end)) else {
                    return self
                        .err(loc, "`unroll` needs bounds known when lowering; use `serial` for run-time bounds");
                };
                if b - a > 4096 {
                    return self.err(loc, format!("`unroll` of {} iterations; at most 4096", b - a));
                }
                for i in a..b {
                    self.consts.insert(var, i);
                    self.var_regs.remove(&var);
                    self.block(body)?;
                }
                self.consts.remove(&var);
                Ok(())
            }
            LoopKind::Serial => {
                let s = self.expr(start, DType::I32, loc)?;
                let e = self.expr(end, DType::I32, loc)?;
                let e = self.em.to_reg(e.s, RegClass::B32, Ty::S32);
                let r = self.em.reg(RegClass::B32);
                self.mov(r, s);
                self.consts.remove(&var);
                self.var_regs.insert(var, r);
                let (top, exit) = (self.em.label(), self.em.label());
                self.em.emit(Op::Label(top));
                let p = self.em.setp(Cmp::Ge, Ty::S32, r, e);
                self.em.emit_if(p, true, Op::Bra { target: exit });
                self.block(body)?;
                self.em.loc = loc;
                self.em.emit(Op::Bin { op: BinKind::Add, ty: Ty::S32, d: r, a: Src::Reg(r), b: Src::Imm(1) });
                self.em.emit(Op::Bra { target: top });
                self.em.emit(Op::Label(exit));
                Ok(())
            }
            LoopKind::Pipelined { stages, .. } => self.pipelined(var, stages, start, end, body, loc),
        }
    }

    /// A multi-stage `cp.async` pipeline: the stage-filling copies of iteration `i + stages - 1`
    /// are issued while iteration `i` computes. With fill warps, each role runs its own copy of
    /// the loop (one branch, so the compute warps' body stays one block for the assembler to
    /// schedule): the fill warps issue the fills and pass the body's barriers, the compute
    /// warps run the body.
    fn pipelined(
        &mut self,
        var: VarId,
        stages: u32,
        start: &Expr,
        end: &Expr,
        body: &[Stmt],
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let s0 = self.expr(start, DType::I32, loc)?;
        let e = self.expr(end, DType::I32, loc)?;
        let bounds = (self.em.to_reg(s0.s, RegClass::B32, Ty::S32), self.em.to_reg(e.s, RegClass::B32, Ty::S32));
        let work = match self.role() {
            None => LoopWork::FillsAndBody,
            Some(Role::Fill) => LoopWork::Fills,
            Some(Role::Compute) => LoopWork::Body,
            Some(Role::Both) => return self.pipeline_per_role(var, stages, bounds, body, loc),
            Some(Role::Producer) => unreachable!("a producer block holds no `pipelined` loop (`place_producers`)"),
        };
        self.pipeline_loop(var, stages, bounds, body, loc, work)
    }

    /// A pipelined loop where both roles run: one branch to the fill warps' copy of the loop,
    /// the compute warps' copy first.
    fn pipeline_per_role(
        &mut self,
        var: VarId,
        stages: u32,
        bounds: (Reg, Reg),
        body: &[Stmt],
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let (fill_loop, done) = (self.em.label(), self.em.label());
        let is_fill = self.fill_warps.as_ref().expect("fill warps").is_fill;
        self.em.emit_if(is_fill, true, Op::Bra { target: fill_loop });
        self.in_role(Role::Compute, |lw| lw.pipeline_loop(var, stages, bounds, body, loc, LoopWork::Body))?;
        self.em.emit(Op::Bra { target: done });
        self.em.emit(Op::Label(fill_loop));
        self.in_role(Role::Fill, |lw| lw.pipeline_loop(var, stages, bounds, body, loc, LoopWork::Fills))?;
        self.em.emit(Op::Label(done));
        Ok(())
    }

    /// One copy of a pipelined loop over `bounds` (start, end), doing `work`.
    fn pipeline_loop(
        &mut self,
        var: VarId,
        stages: u32,
        (s0, e): (Reg, Reg),
        body: &[Stmt],
        loc: SrcLoc,
        work: LoopWork,
    ) -> Result<(), Diag> {
        // What is filled, what runs for the fills' iteration and whether dead fills branch
        // around their addresses: decided by `plan_pipelines`.
        let plan = self.p.pipeline(var).clone();
        debug_assert_eq!(plan.stages, stages);
        let program = self.p;
        if let Some(ring) = program.producer_ring(var) {
            return self.producer_ring_loop(&plan, ring, (s0, e), body, loc, work);
        }
        if let StageFills::TensorBoxes(tma @ TmaPipeline { handoff: Handoff::EmptyBarriers { .. }, .. }) = &plan.fills {
            return self.warp_specialized_loop(&plan, tma, (s0, e), body, loc);
        }
        let def = &self.p.def;
        let fills: Vec<&Stmt> = body.iter().filter(|s| is_stage_fill(def, s)).collect();
        let rest: Vec<Stmt> = body.iter().filter(|s| !is_stage_fill(def, s)).cloned().collect();
        let distance = plan.fill_distance();
        let in_flight = plan.wgmma_in_flight.is_some();
        let PipelinePlan { staged, prelude, skip_dead_fills, fills: how, barriers, .. } = plan;
        let tma = match how {
            StageFills::TensorBoxes(tma) => Some(tma),
            StageFills::AsyncCopies { .. } => None,
        };
        let issues_fills = work != LoopWork::Body;
        let home: Vec<Src> = staged.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        let stage_bytes: Vec<i64> = staged
            .iter()
            .map(|b| (self.p.shared(*b).size() as usize * self.def().buffers[*b].dtype.size_bytes()) as i64)
            .collect();
        let iter = self.em.reg(RegClass::B32);
        self.consts.remove(&var);
        // Prologue: iterations 0 .. distance-1.
        for st in (0..distance).filter(|_| issues_fills) {
            self.em.loc = loc;
            let it = self.em.add32(s0, Src::Imm(st as i64));
            self.mov(iter, V { s: it, ty: DType::I32 });
            let live = self.em.setp(Cmp::Lt, Ty::S32, iter, e);
            self.var_regs.insert(var, iter);
            for (k, b) in staged.iter().enumerate() {
                self.shared_base[*b] = Some(self.em.add32(home[k], Src::Imm(st as i64 * stage_bytes[k])));
            }
            match &tma {
                Some(tma) => self.tma_stage_fills(tma, &prelude, &fills, Src::Imm(i64::from(st)), Some(live))?,
                None => self.stage_fills(&prelude, &fills, live, skip_dead_fills)?,
            }
        }
        // Main loop.
        self.em.loc = loc;
        let ring = self.open_stage_ring((s0, e));
        let (ko, rd) = (ring.iter, ring.stage);
        match &tma {
            None if issues_fills => self.em.emit(Op::CpAsyncWait { n: distance - 1 }),
            Some(tma) if work != LoopWork::Fills => self.wait_tma_stage(var, tma, rd),
            _ => {}
        }
        // The kernel's own `cp.async` copies (a tile filled before the loop) land before this
        // barrier, as before any other, where the wait above does not cover them: a stage's
        // mbarrier orders only its boxes, and the compute warps' copy of a loop with fill
        // warps waits for no fill (theirs are all the compute warps have in flight).
        if tma.is_some() || work == LoopWork::Body {
            self.wait_plain_async_copies();
        }
        self.block_barrier();
        let mut deferred = vec![];
        if issues_fills {
            // Issue iteration ko + distance into its stage: the one read last iteration (or,
            // with a wgmma group in flight, the one before).
            let it = self.em.add32(ko, Src::Imm(distance as i64));
            self.mov(iter, V { s: it, ty: DType::I32 });
            let live = self.em.setp(Cmp::Lt, Ty::S32, iter, e);
            let wr = self.em.reg(RegClass::B32);
            let back = (stages - distance) as i64;
            let wrap = match back {
                1 => self.em.setp(Cmp::Eq, Ty::S32, rd, Src::Imm(0)),
                _ => self.em.setp(Cmp::Lt, Ty::S32, rd, Src::Imm(back)),
            };
            self.em.emit(Op::Bin { op: BinKind::Sub, ty: Ty::S32, d: wr, a: Src::Reg(rd), b: Src::Imm(back) });
            if back == 1 {
                self.em.emit_if(wrap, true, Op::Mov { ty: Ty::B32, d: wr, a: Src::Imm(stages as i64 - 1) });
            } else {
                let wrapped =
                    Op::Bin { op: BinKind::Add, ty: Ty::S32, d: wr, a: Src::Reg(wr), b: Src::Imm(stages as i64) };
                self.em.emit_if(wrap, true, wrapped);
            }
            self.var_regs.insert(var, iter);
            self.stage_bases(&staged, &home, wr);
            if let Some(tma) = &tma {
                self.tma_stage_fills(tma, &prelude, &fills, Src::Reg(wr), Some(live))?;
            } else {
                self.deferred_fills = Some(vec![]);
                let fill_result = self.stage_fills(&prelude, &fills, live, skip_dead_fills);
                deferred = self.deferred_fills.take().unwrap_or_default();
                fill_result?;
            }
        }
        // Compute on the stage read this iteration (the fill warps' copy passes its barriers).
        self.var_regs.insert(var, ko);
        self.stage_bases(&staged, &home, rd);
        let outer_wait = std::mem::replace(&mut self.wgmma_wait, WgmmaWait::in_pipeline(in_flight));
        let in_flight_fills = barriers == BodyBarriers::LeaveFillsInFlight;
        let outer_fills = std::mem::replace(&mut self.fills_in_flight, in_flight_fills);
        let lowered = self.block(&rest);
        self.wgmma_wait = outer_wait;
        self.fills_in_flight = outer_fills;
        lowered?;
        self.em.loc = loc;
        self.store_deferred_fills(deferred)?;
        self.close_stage_ring(ring, stages);
        // A TMA pipeline has nothing in flight: past the end no box is issued.
        if issues_fills && tma.is_none() {
            self.em.emit(Op::CpAsyncWait { n: 0 });
        }
        // The compute warps' last group (fill warps issue no wgmma, and are no warpgroup).
        if in_flight && work != LoopWork::Fills {
            self.em.emit(Op::WgmmaWait { n: 0 });
        }
        self.block_barrier();
        for (k, b) in staged.iter().enumerate() {
            self.shared_base[*b] = Some(home[k]);
        }
        Ok(())
    }

    /// Opens a pipeline's main loop over `s0 .. e`: the iteration and the stage it reads (from
    /// 0), and the loop's head, which leaves at the end.
    pub(super) fn open_stage_ring(&mut self, bounds: (Reg, Reg)) -> StageRing {
        self.open_stage_ring_at(bounds, Src::Imm(0))
    }

    /// [`Lower::open_stage_ring`] from the loop's iteration `first` (and its stage, `first`,
    /// below the ring's stages): a producer group's turns start at its own.
    pub(super) fn open_stage_ring_at(&mut self, (s0, e): (Reg, Reg), first: Src) -> StageRing {
        let iter = self.em.reg(RegClass::B32);
        let start = self.em.add32(s0, first);
        self.em.emit(Op::Mov { ty: Ty::B32, d: iter, a: start });
        let stage = self.em.reg(RegClass::B32);
        self.em.emit(Op::Mov { ty: Ty::B32, d: stage, a: first });
        let (top, exit) = (self.em.label(), self.em.label());
        self.em.emit(Op::Label(top));
        let done = self.em.setp(Cmp::Ge, Ty::S32, iter, e);
        self.em.emit_if(done, true, Op::Bra { target: exit });
        StageRing { iter, stage, top, exit }
    }

    /// Closes the loop `ring` opened: the next iteration, the next of `stages` stages (wrapping
    /// to 0), back to the head; then the loop's exit.
    pub(super) fn close_stage_ring(&mut self, ring: StageRing, stages: u32) {
        self.close_stage_ring_by(ring, stages, 1);
    }

    /// [`Lower::close_stage_ring`] advancing `step` iterations (and stages, wrapping) at a time:
    /// a producer group's next turn.
    pub(super) fn close_stage_ring_by(&mut self, ring: StageRing, stages: u32, step: u32) {
        let StageRing { iter, stage, top, exit } = ring;
        self.add_in_place(iter, step);
        self.advance_stage(stage, stages, step);
        self.em.emit(Op::Bra { target: top });
        self.em.emit(Op::Label(exit));
    }

    /// `r += n`, in place.
    fn add_in_place(&mut self, r: Reg, n: u32) {
        self.em.emit(Op::Bin { op: BinKind::Add, ty: Ty::S32, d: r, a: Src::Reg(r), b: Src::Imm(i64::from(n)) });
    }

    /// `stage = (stage + step) mod stages`, for a `stage` below `stages`, in place.
    pub(super) fn advance_stage(&mut self, stage: Reg, stages: u32, step: u32) {
        let step = step % stages;
        if step == 0 {
            return;
        }
        self.add_in_place(stage, step);
        // One stage at a time: the compare-and-reset every pipelined loop has always had.
        if step == 1 {
            let wrap = self.em.setp(Cmp::Eq, Ty::S32, stage, Src::Imm(i64::from(stages)));
            self.em.emit_if(wrap, true, Op::Mov { ty: Ty::B32, d: stage, a: Src::Imm(0) });
        } else {
            let wrap = self.em.setp(Cmp::Ge, Ty::S32, stage, Src::Imm(i64::from(stages)));
            let back =
                Op::Bin { op: BinKind::Sub, ty: Ty::S32, d: stage, a: Src::Reg(stage), b: Src::Imm(i64::from(stages)) };
            self.em.emit_if(wrap, true, back);
        }
    }

    /// Points each staged tile (`home` its stage 0) at its copy for `stage`.
    pub(super) fn stage_bases(&mut self, staged: &[BufId], home: &[Src], stage: Reg) {
        for (k, b) in staged.iter().enumerate() {
            let bytes = self.p.shared(*b).size() as usize * self.def().buffers[*b].dtype.size_bytes();
            let off = self.em.mul32(stage, Src::Imm(bytes as i64));
            self.shared_base[*b] = Some(self.em.add32(home[k], off));
        }
    }

    /// The shared stores of the main loop's element-wise fills, into the stage they were
    /// loaded for, where `live` held; the barrier at the top of the next iteration orders them
    /// before that stage's first read, as it does the `cp.async`s.
    pub(super) fn store_deferred_fills(&mut self, deferred: Vec<DeferredFill>) -> Result<(), Diag> {
        for fill in deferred {
            let DeferredFill { buf, stage_base, loaded, values, live } = fill;
            let compute_base = self.shared_base[buf].replace(stage_base);
            let dt = self.def().buffers[buf].dtype;
            let mut values = values.into_iter();
            self.for_each_shared_elem(buf, |lw, r, c| {
                let (r, c) = lw.shared_elem_index(buf, r, c);
                let saddr = lw.shared_addr(buf, r, c);
                let raw = values.next().expect("one loaded value per element, in the same order");
                if loaded == dt {
                    lw.store_bits_at(Space::Shared, saddr, 0, dt, Src::Reg(raw), live);
                } else {
                    let v = lw.widen(raw, loaded);
                    lw.store_mem_at(Space::Shared, saddr, 0, dt, v, live);
                }
                Ok(())
            })?;
            self.shared_base[buf] = compute_base;
        }
        Ok(())
    }

    /// One stage's fills (after the `prelude` they read, for the same iteration) and their
    /// commit. With `skip_dead`, past the loop's end (`live` false) the block branches around
    /// the fills' address arithmetic; the group is still committed (empty), so the loop's
    /// `wait_group` counts stay right.
    pub(super) fn stage_fills(
        &mut self,
        prelude: &[Stmt],
        fills: &[&Stmt],
        live: Reg,
        skip_dead: bool,
    ) -> Result<(), Diag> {
        let skip = skip_dead.then(|| self.em.label());
        if let Some(skip) = skip {
            self.em.emit_if(live, false, Op::Bra { target: skip });
        }
        self.block(prelude)?;
        for f in fills {
            self.em.loc = f.loc;
            if let StmtKind::Copy { src, dst } = &f.kind {
                self.copy_async(src, dst, Some(live), f.loc)?;
            }
        }
        if let Some(skip) = skip {
            self.em.emit(Op::Label(skip));
        }
        self.em.emit(Op::CpAsyncCommit);
        Ok(())
    }
}

/// A pipeline's main loop, opened by [`Lower::open_stage_ring`]: the iteration, the stage it
/// reads, and the loop's head and exit labels.
pub(super) struct StageRing {
    /// The loop variable's register.
    pub(super) iter: Reg,
    /// The stage of the ring this iteration reads (0 to `stages - 1`).
    pub(super) stage: Reg,
    top: u32,
    exit: u32,
}

/// What one copy of a pipelined loop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LoopWork {
    /// Fills and body: a kernel without fill warps.
    FillsAndBody,
    /// The fills, and the body's barriers: the fill warps' copy.
    Fills,
    /// The body: the compute warps' copy.
    Body,
}

/// The most elements per thread an element-wise stage fill holds in registers across a
/// pipeline's body (`DeferredFill`); larger fills store at once.
pub(crate) const DEFERRED_ELEMS_MAX: u32 = 4;

/// An element-wise stage fill of a pipeline's main loop, loaded but not yet stored. Its
/// loads are issued with the stage's `cp.async`s (which element copies cannot use: a load of
/// under 4 bytes, or a strided box); storing them at once would stall the warp for the
/// load's whole latency before the iteration's work, and every other warp at the next
/// barrier. Stored at the end of the body, the load has had the iteration to land.
pub(crate) struct DeferredFill {
    /// The shared tile filled.
    pub buf: BufId,
    /// The tile's base address in the stage being filled.
    pub stage_base: Src,
    /// The tensor's element type, as loaded.
    pub loaded: DType,
    /// The loaded elements' bits, in `for_each_shared_elem`'s order.
    pub values: Vec<Reg>,
    /// Whether the stage's iteration exists (a masked load reads 0 otherwise).
    pub live: Option<Reg>,
}
