//! Lowering of a `pipelined` loop whose producer block runs on the fill warps
//! (`place_producers::ProducerRole::FillWarps`): the fill warps issue the loop's fills and run
//! the block one iteration ahead of the compute warps, which run the rest of the body. No
//! barrier spans both roles inside the loop; a ring of two mbarriers a stage hands each
//! iteration over.
//!
//! The producer's copy of iteration `i`: if iteration `i + d` exists (`d`, the fill distance, is
//! `stages - 2`), it waits for the `empty` phase of that iteration's stage (the compute warps
//! are done with iteration `i + d - stages`) and issues its fills as one `cp.async` group; then
//! waits for iteration `i`'s group (`cp.async.wait_group d`), passes its named barrier (every
//! fill warp's copies landed), runs the `let`s before the block and the block in its own scope
//! (its warps, its named barrier, its scratch), passes the barrier again, and one thread
//! arrives on the stage's `ready` mbarrier. The compute warps' copy of iteration `i` waits for
//! `ready`, runs the body but the fills and the block, and every compute thread arrives on
//! `empty`. So the producer computes iteration `i + 1` while the compute warps run iteration
//! `i`, with iteration `i + 2`'s fills in flight (three stages). Each side keeps one parity bit
//! a stage, so a loop run again (inside an outer loop) goes on from the phases it left.
//!
//! Fill warps of several warpgroups are as many producer groups (`place_producers`), which
//! take turns: group `g` runs iterations `g`, `g + groups`, .., each with its own named barrier,
//! scratch, copy of the block's shared temporaries and `cp.async` groups, its fills
//! `fill_distance` of its turns ahead. The compute warps see one ring either way. A group
//! counts in its `empty` parity bits the other groups' fills too (each flips its stage's bit
//! where the iteration exists), so it waits for the phase of a stage's last use by anyone.
//! The groups run one copy of the code, the group's index a register from its warps (its
//! barrier, scratch, copies and first turn computed from it): a copy per group would put
//! several producer loops, the kernel's longest code, in one SM's instruction caches.
//!
//! In a kernel launched in clusters the groups of all the cluster's blocks take the turns
//! (group `g` of the block of rank `r` first takes iteration `r groups + g`), and every block
//! consumes every iteration: the producing group's thread 0 bulk-copies the stage's tiles into
//! the other blocks, completing their `ready` (whose consumers arm it with the bytes), and each
//! block's compute warps, after their barrier, hand each stage back (one thread's remote
//! arrival) to the group that fills it next, on `empty` mbarriers of that group's own (a
//! group waits only for its own turns' stages, only where the stage had a use before). A fill
//! only the producer block reads stays in slots of its group's own, never copied; a fill only
//! the rest of the body reads is each block's own, issued by its compute warps `stages - 1`
//! iterations ahead into stages of their own (as a plain pipelined loop's fills), waited for
//! with `cp.async.wait_group` and their barrier. Every block of a cluster runs the loop over
//! the same iterations (the kernel's to ensure: the cluster's blocks share the loop's bounds).

use super::loops::LoopWork;
use super::roles::Role;
use super::tma::{PhaseStart, MBARRIER_BYTES};
use super::{Lower, Scope, WgmmaWait, V};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::passes::place_producers::{ProducerPlan, ProducerRing, PRODUCER_GROUP};
use crate::passes::plan_pipelines::{is_stage_fill, stage_fill_tile, PipelinePlan};
use crate::passes::BufLayout;
use crate::thread_ir::*;
use crate::tile::*;
use std::collections::HashMap;

/// The parity bits, one per stage, of the phases a producer ring's threads wait for next.
#[derive(Clone, Copy)]
pub(crate) struct RingPhases {
    /// The compute warps', of the `ready` barriers.
    pub ready: Reg,
    /// The fill warps', of the `empty` barriers.
    pub empty: Reg,
}

/// One loop with a producer ring, as both roles' copies see it.
#[derive(Clone, Copy)]
struct RingLoop<'a> {
    plan: &'a PipelinePlan,
    ring: &'a ProducerRing,
    /// The loop's producer block: what it hands over and what it keeps.
    producer: &'a ProducerPlan,
    /// The stage's tiles (its fills', then the block's hand-over) and their stage 0 bases.
    staged: &'a [BufId],
    home: &'a [Src],
    /// How many of `staged` are fills.
    staged_fills: usize,
    /// The fills each producer group keeps in slots of its own (across a cluster, those only
    /// the block reads), and their first slot's bases.
    own: &'a [BufId],
    own_home: &'a [Src],
    /// The fills each block's compute warps issue for themselves (across a cluster, those only
    /// they read), and their stage 0 bases.
    block_fills: &'a [BufId],
    block_home: &'a [Src],
    /// The loop's first iteration and its end.
    bounds: (Reg, Reg),
    body: &'a [Stmt],
    loc: SrcLoc,
    /// Across a cluster, the block's rank in it, read once before both roles' copies.
    rank: Option<Reg>,
}

/// A producer group of a ring: its first turn (its index among every producer taking turns,
/// those of the cluster's blocks too) and its index among the block's groups.
#[derive(Clone, Copy)]
struct Group {
    turn: Src,
    local: Src,
}

/// Where an iteration is produced across a cluster: the block's rank and its group there.
struct Producer {
    block: Src,
    group: Src,
}

/// Which of a stage's two mbarriers.
#[derive(Clone, Copy)]
enum RingBarrier {
    /// Completed by the producer's one arrival once the stage's hand-over is written.
    Ready,
    /// Completed once every compute thread is done with the stage: by each one's arrival, or
    /// across a cluster by one arrival a block.
    Empty,
}

impl Lower<'_> {
    /// At the kernel's entry: each producer ring's mbarriers initialized by thread 0, then a
    /// barrier so no thread waits on one before it is initialized.
    pub(super) fn producer_ring_entry(&mut self) {
        let program = self.p;
        let rings: Vec<(VarId, &ProducerRing)> =
            program.pipelines.iter().filter_map(|plan| Some((plan.var, program.producer_ring(plan.var)?))).collect();
        if rings.is_empty() {
            return;
        }
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let across_cluster = rings.iter().any(|(_, ring)| ring.cluster > 1);
        for (var, ring) in rings {
            // In one block every compute thread releases each stage; across a cluster one
            // elected thread of every block does, after its compute warps' barrier.
            let releases = if ring.cluster > 1 { ring.cluster } else { self.p.def.threads };
            let counts = (0..ring.stages).map(|_| 1).chain((ring.stages..ring.mbarriers()).map(|_| releases));
            self.init_mbarriers(first, ring.barriers, counts);
            // The compute warps wait for phase 0 of `ready` first; the producer for the phase
            // "before" phase 0 of `empty`, which counts as complete. Across a cluster a
            // block's producer waits only where the stage had a use before, for phase 0 first.
            let ready = self.phase_bits(PhaseStart::Phase0);
            let start = if ring.cluster > 1 { PhaseStart::Phase0 } else { PhaseStart::BeforePhase0 };
            let empty = self.phase_bits(start);
            self.ring_phases.insert(var, RingPhases { ready, empty });
        }
        if across_cluster {
            // Other blocks arrive on these mbarriers and copy into this block.
            self.em.emit_if(first, true, Op::FenceMbarrierInit);
            self.meet_the_cluster();
        } else {
            self.em.emit(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
        }
    }

    /// `barrier.cluster` of every thread of the cluster.
    fn meet_the_cluster(&mut self) {
        self.em.emit(Op::ClusterBarrier { step: ClusterBarrierStep::Arrive });
        self.em.emit(Op::ClusterBarrier { step: ClusterBarrierStep::Wait });
    }

    /// One role's copy of the loop over `plan.var` from `s0` to `e` whose producer block runs
    /// on the fill warps through `ring`: the producer's for [`LoopWork::Fills`], the compute
    /// warps' for [`LoopWork::Body`].
    pub(super) fn producer_ring_loop(
        &mut self,
        plan: &PipelinePlan,
        ring: &ProducerRing,
        bounds: (Reg, Reg),
        body: &[Stmt],
        loc: SrcLoc,
        work: LoopWork,
    ) -> Result<(), Diag> {
        let program = self.p;
        let producer = program.producers.iter().find(|x| x.var == plan.var).expect("a producer plan");
        // The stage's tiles: the fills' (but those a group keeps in slots of its own), then the
        // block's hand-over.
        let (own, block_fills) = (&producer.own_fills, &producer.block_fills);
        let fills: Vec<BufId> =
            plan.staged.iter().copied().filter(|b| !own.contains(b) && !block_fills.contains(b)).collect();
        let staged: Vec<BufId> = fills.iter().chain(&producer.outputs).copied().collect();
        let home: Vec<Src> = staged.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        let own_home: Vec<Src> = own.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        let block_home: Vec<Src> = block_fills.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        let rank = (ring.cluster > 1).then(|| {
            let rank = self.em.reg(RegClass::B32);
            self.em.emit(Op::ReadSpecial { d: rank, sreg: Special::ClusterCtaRank });
            rank
        });
        let lp = RingLoop {
            plan,
            ring,
            producer,
            staged: &staged,
            home: &home,
            staged_fills: fills.len(),
            own,
            own_home: &own_home,
            block_fills,
            block_home: &block_home,
            bounds,
            body,
            loc,
            rank,
        };
        self.consts.remove(&plan.var);
        // What the kernel wrote before the loop (its own `cp.async` copies landed) is visible
        // to both roles: inside, no barrier spans them.
        self.em.loc = loc;
        self.wait_plain_async_copies();
        self.both_roles_barrier();
        match work {
            LoopWork::Fills => self.producer_copy(&lp)?,
            LoopWork::Body => self.consumer_copy(&lp)?,
            LoopWork::FillsAndBody => unreachable!("a producer ring's kernel has fill warps"),
        }
        self.em.loc = loc;
        // Both roles meet again after the loop; across a cluster, every block's, so that no
        // block leaves while another still copies into it or reads what it copied out.
        if ring.cluster > 1 {
            self.meet_the_cluster();
        } else {
            self.both_roles_barrier();
        }
        let tiles = staged.iter().chain(own).chain(block_fills);
        for (b, at) in tiles.zip(home.iter().chain(&own_home).chain(&block_home)) {
            self.shared_base[*b] = Some(*at);
        }
        Ok(())
    }

    /// A barrier of every thread of the block, at a ring loop's entry and exit: the block's
    /// barrier, or with the roles apart (`RegisterPlan::Split`, where the block's barriers
    /// leave the fill warps out) barrier 0 for every thread. Both roles run the same skeleton
    /// of loops and `if`s, so each reaches it as often as the other, each from its own code.
    fn both_roles_barrier(&mut self) {
        if self.producer_apart {
            self.em.emit(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::AnyInstruction });
        } else {
            self.block_barrier();
        }
    }

    /// `f` lowered as producer group `group` of `ring` (an immediate, or a register each
    /// group's warps hold their own index in): its warps (thread and warp indices counted from
    /// its first), its named barrier, its scratch and the fragment bases of the tiles the block
    /// owns.
    fn in_producer_group(
        &mut self,
        ring: &ProducerRing,
        group: Src,
        f: impl FnOnce(&mut Self) -> Result<(), Diag>,
    ) -> Result<(), Diag> {
        let fill = self.fill_warps.as_mut().expect("a kernel with fill warps");
        let outer_role = std::mem::replace(&mut fill.role, Role::Producer);
        let mut th = fill.scope.th;
        let first_warp = self.em.mul32(group, Src::Imm(i64::from(ring.warps)));
        if first_warp != Src::Imm(0) {
            let first_thread = self.em.mul32(first_warp, Src::Imm(32));
            th.tid = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.tid, first_thread);
            th.warp = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.warp, first_warp);
        }
        let scratch = self.em.mul32(group, Src::Imm(i64::from(self.p.producer_scratch_stride)));
        let scope = Scope {
            th,
            threads: 32 * ring.warps,
            bar_id: self.em.add32(Src::Imm(i64::from(PRODUCER_GROUP)), group),
            scratch_base: self.em.add32(Src::Imm(i64::from(self.p.groups[&PRODUCER_GROUP].scratch_offset)), scratch),
            frag_bases: HashMap::new(),
        };
        let outer_scope = std::mem::replace(&mut self.scope, scope);
        for (i, l) in self.p.layouts.iter_ids() {
            if let (BufLayout::Fragment(l), true) = (l, self.p.owner[i] == PRODUCER_GROUP) {
                self.frag_base(*l);
            }
        }
        let lowered = self.scoped_addresses(f);
        self.scope = outer_scope;
        self.fill_warps.as_mut().expect("a kernel with fill warps").role = outer_role;
        lowered
    }

    /// The fill warps' copy of the loop: one for every producer group, the group's index
    /// computed from its warps where there are several (each group's barriers, scratch and
    /// copies of the block's shared temporaries are its own). Across a cluster a group's turns
    /// follow its block's rank.
    fn producer_copy(&mut self, lp: &RingLoop) -> Result<(), Diag> {
        let ring = lp.ring;
        let local = if ring.groups == 1 {
            Src::Imm(0)
        } else {
            let warp = self.fill_warps.as_ref().expect("a kernel with fill warps").scope.th.warp;
            self.em.op32(BinKind::Div, warp, i64::from(ring.warps))
        };
        let turn = match lp.rank {
            Some(rank) => {
                let first = self.em.mul32(Src::Reg(rank), Src::Imm(i64::from(ring.groups)));
                self.em.add32(first, local)
            }
            None => local,
        };
        let group = Group { turn, local };
        if ring.groups == 1 {
            return self.in_producer_group(ring, local, |lw| lw.group_copy(lp, group));
        }
        let group_reg = self.em.to_reg(local, RegClass::B32, Ty::B32);
        // Each group's copy of the block's shared temporaries (`infer_layouts`).
        let temporaries: Vec<BufId> = lp
            .producer
            .temporaries
            .iter()
            .copied()
            .filter(|b| matches!(self.p.layouts[*b], BufLayout::Shared(_)))
            .collect();
        let homes: Vec<Src> = temporaries.iter().map(|b| self.shared_base[*b].expect("shared")).collect();
        self.stage_bases(&temporaries, &homes, group_reg);
        self.in_producer_group(ring, local, |lw| lw.group_copy(lp, group))?;
        for (b, home) in temporaries.iter().zip(homes) {
            self.shared_base[*b] = Some(home);
        }
        Ok(())
    }

    /// Producer group `group`'s copy of the loop, its turns `group.turn`, `+ turns`, .. (the
    /// module's doc says what it does).
    fn group_copy(&mut self, lp: &RingLoop, group: Group) -> Result<(), Diag> {
        let first_turn = group.turn;
        let RingLoop { plan, ring, staged, home, bounds: (s0, e), body, loc, .. } = *lp;
        let def = &self.p.def;
        // The blocks' own fills are their compute warps'.
        let fills: Vec<&Stmt> =
            body.iter().filter(|s| stage_fill_tile(def, s).is_some_and(|b| !lp.block_fills.contains(&b))).collect();
        let at = body.iter().position(|s| matches!(s.kind, StmtKind::Producer(_))).expect("the producer block");
        let lets: Vec<Stmt> = body[..at].iter().filter(|s| !is_stage_fill(def, s)).cloned().collect();
        let StmtKind::Producer(block) = &body[at].kind else { unreachable!("found above") };
        let distance = ring.fill_distance();
        // A group's turns are `turns` iterations apart; its fills run `distance` turns ahead.
        let (turn, ahead) = (ring.turns(), ring.turns() * ring.fill_distance());
        let iter = self.em.reg(RegClass::B32);
        // The earlier groups' first fills, before this group's first: iteration `k`'s, at
        // stage `k`, for each group `k` below this one (across a cluster each group's `empty`
        // mbarriers count its own turns alone).
        if ring.cluster == 1 {
            for k in 1..ring.groups {
                let earlier = self.em.setp(Cmp::Ge, Ty::S32, first_turn, Src::Imm(i64::from(k)));
                self.pass_other_fills(lp, (s0, e), Src::Imm(0), k - 1..k, Some(earlier));
            }
        }
        // Prologue: the fills of the group's first `distance` turns (each below `stages`:
        // `group + k * turns < turns * distance < stages`).
        for k in 0..distance {
            self.em.loc = loc;
            let first = self.em.add32(first_turn, Src::Imm(i64::from(k * turn)));
            let it = self.em.add32(s0, first);
            self.mov(iter, V { s: it, ty: DType::I32 });
            let stage = self.em.reg(RegClass::B32);
            self.em.emit(Op::Mov { ty: Ty::B32, d: stage, a: first });
            self.issue_ring_fills(lp, (iter, e), stage, group, &fills, false)?;
        }
        self.em.loc = loc;
        let stages = self.open_stage_ring_at((s0, e), first_turn);
        let (ko, rd) = (stages.iter, stages.stage);
        // The fills of iteration ko + ahead, into its stage.
        let it = self.em.add32(ko, Src::Imm(i64::from(ahead)));
        self.mov(iter, V { s: it, ty: DType::I32 });
        let wr = self.em.reg(RegClass::B32);
        self.em.emit(Op::Mov { ty: Ty::B32, d: wr, a: Src::Reg(rd) });
        self.advance_stage(wr, ring.stages, ahead);
        // With the fills a stage ahead, their element-wise stores wait for the end of the
        // iteration (`DeferredFill`); with none ahead the block reads them at once.
        let deferred = self.issue_ring_fills(lp, (iter, e), wr, group, &fills, distance > 0)?;
        // Iteration ko's fills have landed, for every fill warp.
        self.em.emit(Op::CpAsyncWait { n: distance });
        self.barrier();
        self.var_regs.insert(plan.var, ko);
        self.stage_bases(staged, home, rd);
        self.own_fill_bases(lp, group, ko);
        self.block(&lets)?;
        self.block(block)?;
        self.em.loc = loc;
        self.store_deferred_fills(deferred)?;
        // The hand-over is written by every fill warp; one thread tells the compute warps.
        self.barrier();
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let ready = self.ring_barrier(ring, RingBarrier::Ready, rd);
        if let Some(rank) = lp.rank {
            self.copy_stage_to_the_cluster(lp, rank, first, ready, loc)?;
        }
        let state = self.em.reg(RegClass::B64);
        self.em.emit_if(first, true, Op::MbarrierArrive { state, addr: ready });
        self.close_stage_ring_by(stages, ring.stages, turn);
        // Only the empty groups of iterations past the end are in flight.
        self.em.emit(Op::CpAsyncWait { n: 0 });
        Ok(())
    }

    /// The fills of the iteration in `it` (of a loop ending at `e`) by producer group
    /// `group`, into `stage` (the group's own fills into its slot): where the iteration
    /// exists, after the `empty` phase of the stage's last use. Returns the element-wise fills
    /// left to store, with `defer`.
    fn issue_ring_fills(
        &mut self,
        lp: &RingLoop,
        (it, e): (Reg, Reg),
        stage: Reg,
        group: Group,
        fills: &[&Stmt],
        defer: bool,
    ) -> Result<Vec<super::loops::DeferredFill>, Diag> {
        let RingLoop { plan, ring, staged, home, staged_fills, .. } = *lp;
        self.var_regs.insert(plan.var, it);
        let live = self.em.setp(Cmp::Lt, Ty::S32, it, e);
        // The producer waits only for iterations that exist, as the compute warps release only
        // those: each side then counts the same phases of each stage in every run of the loop.
        // Across a cluster a stage's release goes to the block that fills it next, only where
        // the stage had a use before.
        let waits = match ring.cluster {
            1 => live,
            _ => {
                let first_use = self.em.add32(lp.bounds.0, Src::Imm(i64::from(ring.stages)));
                let reused = self.em.setp(Cmp::Ge, Ty::S32, it, first_use);
                self.em.and_pred(Some(live), Some(reused)).expect("a predicate")
            }
        };
        let past_end = self.em.label();
        self.em.emit_if(waits, false, Op::Bra { target: past_end });
        let empty = self.empty_barrier_of(ring, group.local, stage);
        self.wait_phase_at(empty, self.ring_phases[&plan.var].empty, stage, ring.scope());
        self.em.emit(Op::Label(past_end));
        self.stage_bases(&staged[..staged_fills], &home[..staged_fills], stage);
        self.own_fill_bases(lp, group, it);
        if defer {
            self.deferred_fills = Some(vec![]);
        }
        let issued = self.stage_fills(&plan.prelude, fills, live, plan.skip_dead_fills);
        let deferred = self.deferred_fills.take().unwrap_or_default();
        issued?;
        // The other groups' fills up to this group's next (across a cluster, none: each
        // group's `empty` mbarriers are its own).
        if ring.cluster == 1 {
            self.pass_other_fills(lp, (it, e), Src::Reg(stage), 1..ring.groups, None);
        }
        Ok(deferred)
    }

    /// Points the fills group `group` keeps in slots of its own at its slot for iteration
    /// `it`: the count of its turns before it, modulo the slots, after the slots of the
    /// block's earlier groups. A slot is filled again only after the group's barrier that ends
    /// the turn reading it (its fills run fewer turns ahead than it has slots).
    fn own_fill_bases(&mut self, lp: &RingLoop, group: Group, it: Reg) {
        if lp.own.is_empty() {
            return;
        }
        let slots = lp.ring.own_fill_slots();
        let from_first = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, it, lp.bounds.0);
        let mine = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, from_first, group.turn);
        let turns_before = self.em.op32(BinKind::Div, mine, i64::from(lp.ring.turns()));
        let slot = self.em.op32(BinKind::Rem, turns_before, i64::from(slots));
        let first_slot = self.em.mul32(group.local, Src::Imm(i64::from(slots)));
        let index = self.em.add32(first_slot, slot);
        let index = self.em.to_reg(index, RegClass::B32, Ty::U32);
        self.stage_bases(lp.own, lp.own_home, index);
    }

    /// Counts in this group's `empty` parity bits the fills other producer groups issue, of
    /// the iterations `it + k` for `k` in `offsets` (at stages `stage + k`), each where it
    /// exists (the compute warps release only those) and `when` holds: a group waits for a
    /// stage's phase by the uses it has counted, every group's included. Nothing with one
    /// group.
    fn pass_other_fills(
        &mut self,
        lp: &RingLoop,
        (it, e): (Reg, Reg),
        stage: Src,
        offsets: std::ops::Range<u32>,
        when: Option<Reg>,
    ) {
        let ring = lp.ring;
        let phases = self.ring_phases[&lp.plan.var].empty;
        for k in offsets {
            let at = self.em.add32(it, Src::Imm(i64::from(k)));
            let live = self.em.setp(Cmp::Lt, Ty::S32, at, e);
            let live = self.em.and_pred(Some(live), when).expect("a predicate");
            let st = self.em.reg(RegClass::B32);
            self.em.emit(Op::Mov { ty: Ty::B32, d: st, a: stage });
            self.advance_stage(st, ring.stages, k);
            self.count_phase(phases, st, Some(live));
        }
    }

    /// The compute warps' copy of the loop (the module's doc says what it does).
    fn consumer_copy(&mut self, lp: &RingLoop) -> Result<(), Diag> {
        let RingLoop { plan, ring, staged, home, bounds, body, loc, .. } = *lp;
        let def = &self.p.def;
        let rest: Vec<Stmt> = body
            .iter()
            .filter(|s| !is_stage_fill(def, s) && !matches!(s.kind, StmtKind::Producer(_)))
            .cloned()
            .collect();
        // The block's own fills, `stages - 1` iterations ahead, as a plain pipelined loop's.
        let block_fills: Vec<&Stmt> =
            body.iter().filter(|s| stage_fill_tile(def, s).is_some_and(|b| lp.block_fills.contains(&b))).collect();
        let ahead = ring.stages - 1;
        let iter = (!block_fills.is_empty()).then(|| self.em.reg(RegClass::B32));
        if let Some(iter) = iter {
            for k in 0..ahead {
                self.em.loc = loc;
                let it = self.em.add32(bounds.0, Src::Imm(i64::from(k)));
                self.mov(iter, V { s: it, ty: DType::I32 });
                let stage = self.em.reg(RegClass::B32);
                self.em.emit(Op::Mov { ty: Ty::B32, d: stage, a: Src::Imm(i64::from(k)) });
                self.issue_block_fills(lp, (iter, bounds.1), stage, &block_fills)?;
            }
        }
        self.em.loc = loc;
        let stages = self.open_stage_ring(bounds);
        let (ko, rd) = (stages.iter, stages.stage);
        if let Some(iter) = iter {
            // Into the stage of the iteration before, which every compute warp is done with
            // (their barrier before the hand-back).
            let it = self.em.add32(ko, Src::Imm(i64::from(ahead)));
            self.mov(iter, V { s: it, ty: DType::I32 });
            let wr = self.em.reg(RegClass::B32);
            self.em.emit(Op::Mov { ty: Ty::B32, d: wr, a: Src::Reg(rd) });
            self.advance_stage(wr, ring.stages, ahead);
            self.issue_block_fills(lp, (iter, bounds.1), wr, &block_fills)?;
            // This iteration's own fills have landed, for every compute warp.
            self.em.emit(Op::CpAsyncWait { n: ahead });
            self.barrier();
        }
        self.var_regs.insert(plan.var, ko);
        self.stage_bases(lp.block_fills, lp.block_home, rd);
        let ready = self.ring_barrier(ring, RingBarrier::Ready, rd);
        if let Some(rank) = lp.rank {
            self.expect_stage_from_the_cluster(lp, rank, ko, ready)?;
        }
        self.wait_phase_at(ready, self.ring_phases[&plan.var].ready, rd, ring.scope());
        self.stage_bases(staged, home, rd);
        // The block's own fills are waited for above, as the stage is.
        let in_stages: Vec<BufId> = staged.iter().chain(lp.block_fills).copied().collect();
        self.compute_warps_body(&in_stages, &rest, WgmmaWait::Whole)?;
        self.em.loc = loc;
        if ring.cluster > 1 {
            self.release_stage_to_the_cluster(lp, ko, rd);
        } else {
            let empty = self.ring_barrier(ring, RingBarrier::Empty, rd);
            let state = self.em.reg(RegClass::B64);
            self.em.emit(Op::MbarrierArrive { state, addr: empty });
        }
        self.close_stage_ring(stages, ring.stages);
        if !block_fills.is_empty() {
            // Only the empty groups of iterations past the end are in flight.
            self.em.emit(Op::CpAsyncWait { n: 0 });
        }
        Ok(())
    }

    /// The block's own fills (`fills`, of [`RingLoop::block_fills`]) of the iteration in `it`
    /// (of a loop ending at `e`) into `stage`, by the compute warps, as one `cp.async` group.
    fn issue_block_fills(
        &mut self,
        lp: &RingLoop,
        (it, e): (Reg, Reg),
        stage: Reg,
        fills: &[&Stmt],
    ) -> Result<(), Diag> {
        self.var_regs.insert(lp.plan.var, it);
        let live = self.em.setp(Cmp::Lt, Ty::S32, it, e);
        self.stage_bases(lp.block_fills, lp.block_home, stage);
        self.stage_fills(&lp.plan.prelude, fills, live, lp.plan.skip_dead_fills)
    }

    /// The bytes of one stage of the ring's tiles (each a multiple of 16: a bulk copy's
    /// unit).
    fn stage_bytes(&self, lp: &RingLoop, loc: SrcLoc) -> Result<Vec<u32>, Diag> {
        lp.staged
            .iter()
            .map(|b| {
                let bytes = self.p.shared(*b).size() as usize * self.def().buffers[*b].dtype.size_bytes();
                match u32::try_from(bytes) {
                    Ok(n) if n.is_multiple_of(16) => Ok(n),
                    _ => Err(Diag::new(
                        loc,
                        format!(
                            "tile `{}` of {bytes} bytes goes across the cluster by bulk copies: its bytes must be a multiple of 16",
                            self.def().buffers[*b].name
                        ),
                    )),
                }
            })
            .collect()
    }

    /// The producer's hand-over across a cluster: thread `first` of the block of rank `rank`
    /// copies each of the stage's tiles (at their stage's bases) into every other block, completing that block's `ready`
    /// (at `ready`, this block's address of it). The proxy fences before the group's barrier
    /// (`proxy_fences`) make the tiles' bytes visible to the copies.
    fn copy_stage_to_the_cluster(
        &mut self,
        lp: &RingLoop,
        rank: Reg,
        first: Reg,
        ready: Reg,
        loc: SrcLoc,
    ) -> Result<(), Diag> {
        let sizes = self.stage_bytes(lp, loc)?;
        for peer in 0..lp.ring.cluster {
            let other = self.em.setp(Cmp::Ne, Ty::U32, Src::Reg(rank), Src::Imm(i64::from(peer)));
            let copies = self.em.and_pred(Some(first), Some(other)).expect("a predicate");
            let peer_ready = self.em.reg(RegClass::B32);
            self.em.emit(Op::Mapa { d: peer_ready, addr: ready, rank: Src::Imm(i64::from(peer)) });
            for (b, bytes) in lp.staged.iter().zip(&sizes) {
                let src = self.shared_base[*b].expect("a staged tile");
                let src = self.em.to_reg(src, RegClass::B32, Ty::U32);
                let dst = self.em.reg(RegClass::B32);
                self.em.emit(Op::Mapa { d: dst, addr: src, rank: Src::Imm(i64::from(peer)) });
                self.em.emit_if(copies, true, Op::BulkCopyToCluster { dst, src, bytes: *bytes, mbar: peer_ready });
            }
        }
        Ok(())
    }

    /// Across a cluster, where another block produces iteration `ko`: the compute warps'
    /// thread 0 arrives on the stage's `ready` expecting the bytes that block copies in (this
    /// block's own producer arrives where it produces the iteration).
    fn expect_stage_from_the_cluster(&mut self, lp: &RingLoop, rank: Reg, ko: Reg, ready: Reg) -> Result<(), Diag> {
        let bytes: u32 = self.stage_bytes(lp, lp.loc)?.iter().sum();
        let producer = self.producer_of(lp, Src::Reg(ko)).block;
        let remote = self.em.setp(Cmp::Ne, Ty::U32, producer, rank);
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let arms = self.em.and_pred(Some(remote), Some(first)).expect("a predicate");
        let state = self.em.reg(RegClass::B64);
        self.em.emit_if(arms, true, Op::MbarrierArriveExpectTx { state, addr: ready, bytes });
        Ok(())
    }

    /// Across a cluster, the block hands `stage`, of iteration `ko`, back to the group that
    /// fills it next (iteration `ko + stages`, where it exists): once every compute warp is done
    /// with it (their barrier), thread 0 arrives on that group's `empty` mbarrier of the stage,
    /// in its block. The barrier orders every compute thread's reads before the arrival, which
    /// releases them at cluster scope: one remote arrival a block instead of one a thread.
    fn release_stage_to_the_cluster(&mut self, lp: &RingLoop, ko: Reg, stage: Reg) {
        self.barrier();
        let next = self.em.add32(ko, Src::Imm(i64::from(lp.ring.stages)));
        let exists = self.em.setp(Cmp::Lt, Ty::S32, next, lp.bounds.1);
        let first = self.em.setp(Cmp::Eq, Ty::S32, self.scope.th.tid, Src::Imm(0));
        let hands_back = self.em.and_pred(Some(exists), Some(first)).expect("a predicate");
        let filler = self.producer_of(lp, next);
        let empty = self.empty_barrier_of(lp.ring, filler.group, stage);
        let addr = self.em.reg(RegClass::B32);
        self.em.emit(Op::Mapa { d: addr, addr: empty, rank: filler.block });
        self.em.emit_if(hands_back, true, Op::MbarrierArriveRemote { addr });
    }

    /// Which producer group of which block of the cluster produces iteration `it`: turn
    /// `(it - first) mod turns`, of group `turn mod groups` of the block of rank
    /// `turn / groups`.
    fn producer_of(&mut self, lp: &RingLoop, it: Src) -> Producer {
        let from_first = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, it, lp.bounds.0);
        let turn = self.em.op32(BinKind::Rem, from_first, i64::from(lp.ring.turns()));
        let groups = i64::from(lp.ring.groups);
        Producer { block: self.em.op32(BinKind::Div, turn, groups), group: self.em.op32(BinKind::Rem, turn, groups) }
    }

    /// The `empty` mbarrier of `stage` that producer group `group` of the block waits for
    /// (across a cluster each group has its own; else the block's).
    fn empty_barrier_of(&mut self, ring: &ProducerRing, group: Src, stage: Reg) -> Reg {
        if ring.cluster == 1 {
            return self.ring_barrier(ring, RingBarrier::Empty, stage);
        }
        let stage_of_group = self.em.mul32(group, Src::Imm(i64::from(ring.stages)));
        let index = self.em.add32(stage_of_group, Src::Reg(stage));
        let first = i64::from(ring.barriers) + MBARRIER_BYTES * i64::from(ring.stages);
        self.barrier_at(first, index)
    }

    /// The shared address of `which` mbarrier of `stage` of `ring`.
    fn ring_barrier(&mut self, ring: &ProducerRing, which: RingBarrier, stage: Reg) -> Reg {
        let first = i64::from(ring.barriers)
            + match which {
                RingBarrier::Ready => 0,
                RingBarrier::Empty => MBARRIER_BYTES * i64::from(ring.stages),
            };
        self.barrier_at(first, Src::Reg(stage))
    }
}
