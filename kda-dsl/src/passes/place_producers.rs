//! `place_producers`, the first tile pass: checks each producer block (`for _ in producer() {
//! .. }`, [`StmtKind::Producer`]) against the rules that let a role of its own run it ahead of
//! the rest of its loop's body, records what it hands over ([`ProducerPlan`]), and decides where
//! it runs ([`ProducerRole`]): in a kernel with fill warps, on them, ahead of the rest of the
//! body, fill warps beyond one warpgroup as more producer groups taking turns at the
//! iterations (the block stays in the body for the later passes and the lowering,
//! `lower/producer_ring.rs`); otherwise in its place, its statements put where it stands (the
//! same code, and the same bits, as its statements written inline). Both give the same bits.
//!
//! The rules, each an error at the user's span:
//! - a producer block is a statement of a `pipelined` loop's body (not inside an `if` or
//!   another loop), one per loop, after nothing but the loop's stage fills and `let`s;
//! - it writes no global memory and holds no `pipelined` loop;
//! - it hands over shared tiles only: a tile it writes that anything outside it touches is a
//!   shared tile, written nowhere else and used nowhere outside the loop's body; a variable it
//!   assigns is read nowhere outside it;
//! - the body after it writes nothing it reads (tiles and variables, those the `let`s before it
//!   read included), so it may run for a later iteration than the rest of the body.

use std::collections::HashSet;
use std::fmt;

use super::plan_pipelines::{is_stage_fill, stage_fill_tile};
use super::TileProgram;
use crate::analysis::cluster_uniform::ClusterVarying;
use crate::analysis::tile_access::tile_access;
use crate::diag::{Diag, SrcLoc};
use crate::tile::*;

/// What one `pipelined` loop's producer block hands over to the rest of the body.
#[derive(Clone, Debug, PartialEq)]
pub struct ProducerPlan {
    /// The loop's variable.
    pub var: VarId,
    /// The shared tiles it writes that the rest of the body reads, by id.
    pub outputs: Vec<BufId>,
    /// The tiles it writes that nothing outside it touches (its own temporaries), by id: what a
    /// role running it lays out over its own warps.
    pub temporaries: Vec<BufId>,
    /// Across a cluster, the loop's stage fills that only the block reads (no other statement
    /// of the kernel touches their tiles), by id: each producer group keeps them in slots of its
    /// own ([`ProducerRing::own_fill_slots`]) instead of the ring's stages, which every block
    /// receives a copy of. Empty otherwise: in one block nothing is copied, and moving them
    /// would save shared memory but change the shipped producer kernels, unmeasured.
    pub own_fills: Vec<BufId>,
    /// Across a cluster, the loop's stage fills that the block and the `let`s before it do not
    /// read, only the rest of the body, by id: each block's compute warps issue them for
    /// themselves (they may read the block's own index), `stages - 1` iterations ahead as a
    /// plain pipelined loop's fills run. Empty otherwise (the producer issues them).
    pub block_fills: Vec<BufId>,
    /// Where it runs.
    pub role: ProducerRole,
    /// Where the block was written.
    pub loc: SrcLoc,
}

/// Where a producer block runs, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum ProducerRole {
    /// In its place, on every thread, as its statements written inline: the kernel has no fill
    /// warps to run it.
    Inline,
    /// On the kernel's fill warps, which issue the loop's fills and run the block one iteration
    /// ahead of the compute warps, handing each iteration over through a ring of mbarriers.
    FillWarps(ProducerRing),
}

/// The warp group id of the fill warps running a producer block, and the named barrier of the
/// first producer group (group `g`'s is `PRODUCER_GROUP + g`): their temporaries are laid out
/// over one producer group's warps as a warp group's tiles are. A kernel with fill warps has
/// no warp groups, and its compute warps synchronize on barrier 1.
pub const PRODUCER_GROUP: u32 = 2;

/// Warps in a producer group when the fill warps are several warpgroups.
const WARPGROUP_WARPS: u32 = 4;

/// How fill warps split into producer groups ([`producer_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerGroups {
    /// Warps in each group.
    pub warps: u32,
    /// Groups, taking turns at the loop's iterations.
    pub groups: u32,
}

/// How `fill_warps` fill warps run a producer block. Whole warpgroups beyond the first become
/// groups of their own, which take turns at the loop's iterations (a block's latency, not its
/// instructions, bounds a producer: a second group computes the next iteration beside the
/// first); otherwise one group of them all.
pub const fn producer_groups(fill_warps: u32) -> ProducerGroups {
    if fill_warps > WARPGROUP_WARPS && fill_warps.is_multiple_of(WARPGROUP_WARPS) {
        ProducerGroups { warps: WARPGROUP_WARPS, groups: fill_warps / WARPGROUP_WARPS }
    } else {
        ProducerGroups { warps: fill_warps, groups: 1 }
    }
}

/// The hand-over of a producer block run by fill warps: per stage, a `ready` mbarrier (one
/// elected producer arrival after the producer's named barrier) and an `empty` one (each
/// compute thread's arrival once done with the stage).
#[derive(Clone, Debug, PartialEq)]
pub struct ProducerRing {
    /// The warps of one producer group.
    pub warps: u32,
    /// Producer groups: group `g` runs the iterations `g`, `g + groups`, .. of the loop.
    pub groups: u32,
    /// The loop's stages: the block's outputs take one copy each, rotated with the fills'.
    pub stages: u32,
    /// Shared byte offset of the `stages` `ready` mbarriers, then the `stages` `empty` ones
    /// (`allocate_shared` places them).
    pub barriers: u32,
    /// The blocks of the kernel's cluster whose producers take turns (1: the block alone).
    /// Across a cluster, group `g` of block `r` runs the iterations `r groups + g`,
    /// `+ groups cluster`, .., and its block's hand-over reaches every block of the cluster;
    /// each group has `empty` mbarriers of its own (only its turns' stages are released to
    /// it).
    pub cluster: u32,
}

impl ProducerRing {
    /// A group's own iterations its fills run ahead of its block: as many as the stages leave
    /// beside the one the compute warps read and one a group computes. A group waits for the
    /// stage of iteration `i + groups · d` to be released, which the compute warps do for
    /// iteration `i + groups · d - stages` before they need iteration `i`: so it never waits
    /// on itself while `groups · d < stages` (one group: `stages - 2`, the producer a
    /// iteration ahead of the compute warps).
    pub fn fill_distance(&self) -> u32 {
        (self.stages - 1 - self.turns()) / self.turns()
    }

    /// The producers taking turns at the iterations: the groups, or the cluster's blocks.
    pub fn turns(&self) -> u32 {
        self.groups * self.cluster
    }

    /// The ring's mbarriers: `ready` a stage, and `empty` a stage (a stage and group across a
    /// cluster).
    pub fn mbarriers(&self) -> u32 {
        let empty_sets = if self.cluster > 1 { self.groups } else { 1 };
        self.stages * (1 + empty_sets)
    }

    /// Slots a producer group keeps the fills only its block reads in ([`ProducerPlan::
    /// own_fills`]): one for each turn its fills run ahead and one for the turn it computes.
    pub fn own_fill_slots(&self) -> u32 {
        self.fill_distance() + 1
    }

    /// The scope of the ring's waits: the cluster's when other blocks arrive on its
    /// mbarriers and copy into its stages.
    pub fn scope(&self) -> crate::thread_ir::MbarrierScope {
        match self.cluster {
            1 => crate::thread_ir::MbarrierScope::Cta,
            _ => crate::thread_ir::MbarrierScope::Cluster,
        }
    }
}

/// Checks and places every producer block of the kernel, recording one plan per block in
/// `p.producers`, outermost loop first.
pub fn place_producers(p: &mut TileProgram) -> Result<(), Diag> {
    check_placement(&p.def, &p.def.body, false)?;
    let varying = ClusterVarying::of(&p.def);
    let mut plans = vec![];
    let mut found = Ok(());
    visit_stmts(&p.def.body, &mut |s| {
        if found.is_err() {
            return;
        }
        if let StmtKind::For { var, kind: LoopKind::Pipelined { stages, .. }, body, .. } = &s.kind {
            if let Some(at) = body.iter().position(|x| matches!(x.kind, StmtKind::Producer(_))) {
                match plan_producer(&p.def, s, *var, body, at)
                    .and_then(|plan| Ok(plan.placed(choose_role(&p.def, *stages)?)))
                    .and_then(|plan| {
                        check_once_for_the_cluster(&p.def, &varying, &plan, body, at)?;
                        Ok(plan)
                    }) {
                    Ok(plan) => plans.push(plan),
                    Err(e) => found = Err(e),
                }
            }
        }
    });
    found?;
    if plans.iter().any(|x| matches!(x.role, ProducerRole::FillWarps(_))) {
        let warps = producer_groups(p.def.fill_warps).warps;
        p.groups.insert(PRODUCER_GROUP, super::WarpGroupInfo { warps, scratch_offset: 0 });
    } else {
        p.def.body = splice_producers(std::mem::take(&mut p.def.body), Splice::Inline);
    }
    p.producers = plans;
    Ok(())
}

impl ProducerPlan {
    /// The plan running as `role`: the fills leave the ring's stages ([`Self::own_fills`],
    /// [`Self::block_fills`]) only in a ring across a cluster.
    fn placed(self, role: ProducerRole) -> ProducerPlan {
        let across = matches!(&role, ProducerRole::FillWarps(ring) if ring.cluster > 1);
        let (own_fills, block_fills) = if across { (self.own_fills, self.block_fills) } else { (vec![], vec![]) };
        ProducerPlan { role, own_fills, block_fills, ..self }
    }
}

/// Where the producer block of a loop of `stages` (2 or more, `check_types`) runs: on the
/// kernel's fill warps if it has any, else in its place.
fn choose_role(def: &KernelDef, stages: u32) -> Result<ProducerRole, Diag> {
    if def.fill_warps == 0 {
        return Ok(ProducerRole::Inline);
    }
    let ProducerGroups { warps, groups } = producer_groups(def.fill_warps);
    let cluster = def.cluster_blocks.max(1);
    let turns = groups * cluster;
    if stages <= turns {
        let who = if cluster > 1 {
            format!("the producers of a cluster of {cluster} blocks")
        } else {
            format!("{groups} producer groups ({} fill warps)", def.fill_warps)
        };
        return Err(Diag::new(
            def.loc,
            format!("{who} need a loop of more than {turns} stages (it has {stages}): one for the compute warps to read, one for each producer to compute"),
        ));
    }
    Ok(ProducerRole::FillWarps(ProducerRing { warps, groups, stages, barriers: 0, cluster }))
}

/// Across a cluster, an error at the first of the loop's fills (but the blocks' own), the
/// `let`s before its producer block that those and the block read, and the block's statements
/// that reads something the cluster's blocks can hold different values of: one block computes
/// each iteration of those for all of them.
fn check_once_for_the_cluster(
    def: &KernelDef,
    varying: &ClusterVarying,
    plan: &ProducerPlan,
    body: &[Stmt],
    at: usize,
) -> Result<(), Diag> {
    let (ProducerRole::FillWarps(ring), Some(index)) = (&plan.role, def.block_vars[0]) else {
        return Ok(());
    };
    if ring.cluster == 1 {
        return Ok(());
    }
    let StmtKind::Producer(block) = &body[at].kind else { unreachable!("`at` is the producer block") };
    // A block's own fills are its compute warps' to issue: they may differ.
    let fills: Vec<&Stmt> =
        body.iter().filter(|s| stage_fill_tile(def, s).is_some_and(|b| !plan.block_fills.contains(&b))).collect();
    let mut inside = vec![];
    visit_stmts(block, &mut |s| inside.push(s));
    // The `let`s the producer's fills and block read, directly or through other `let`s (the
    // others, which only the compute warps' statements read, may differ).
    let mut uses = Uses::of(block, None);
    fills.iter().for_each(|f| uses.add_whole(f));
    let mut read = uses.vars_read;
    let mut lets = vec![];
    for s in body[..at].iter().rev() {
        if let StmtKind::Assign(v, e) = &s.kind {
            if read.contains(v) {
                e.for_each_var(&mut |v| _ = read.insert(v));
                lets.insert(0, s);
            }
        }
    }
    for s in fills.into_iter().chain(lets).chain(inside) {
        if let Some(what) = varying.varying_in_stmt(s) {
            let index = &def.vars[index].name;
            return Err(Diag::new(
                s.loc,
                format!(
                    "`{}` can differ between the blocks of a cluster (it comes from the block index `{index}`; `{index} / {}` is the same in all of a cluster's blocks), but across a cluster one block computes each iteration's fills, the `let`s before its producer block and the block for all of them",
                    what.name(def),
                    ring.cluster
                ),
            ));
        }
    }
    Ok(())
}

/// Errors for a producer block anywhere but directly in a `pipelined` loop's body, a second one
/// in a loop, and a `pipelined` loop, warp group or global write inside one.
fn check_placement(def: &KernelDef, body: &[Stmt], in_pipelined_body: bool) -> Result<(), Diag> {
    let mut seen = false;
    for s in body {
        match &s.kind {
            StmtKind::Producer(inner) => {
                if !in_pipelined_body {
                    return Err(Diag::new(s.loc, "a producer block is a statement of a `pipelined` loop's body (not inside an `if`, `parallel`, another loop or another producer block)"));
                }
                if seen {
                    return Err(Diag::new(s.loc, "a `pipelined` loop has at most one producer block"));
                }
                seen = true;
                check_inside(def, inner)?;
            }
            StmtKind::For { kind, body, .. } => {
                check_placement(def, body, matches!(kind, LoopKind::Pipelined { .. }))?;
            }
            StmtKind::If(_, t, e) => {
                check_placement(def, t, false)?;
                check_placement(def, e, false)?;
            }
            StmtKind::Parallel { body, .. } | StmtKind::WarpGroup { body, .. } => check_placement(def, body, false)?,
            _ => {}
        }
    }
    Ok(())
}

/// What a producer block's own statements may not do.
fn check_inside(def: &KernelDef, block: &[Stmt]) -> Result<(), Diag> {
    let mut err = None;
    visit_stmts(block, &mut |s| {
        let why = match &s.kind {
            StmtKind::StoreGlobal(..) | StmtKind::Copy { dst: Region::Global { .. }, .. } => {
                "a producer block writes no global memory: it hands its results to the rest of the body in shared tiles"
            }
            StmtKind::Copy { src: Region::Global { .. }, dst: Region::Buf(b) } if def.buffers[*b].scope == Scope::Shared => {
                "a producer block copies global memory into shared tiles only through its loop's stage fills (before the block)"
            }
            StmtKind::For { kind: LoopKind::Pipelined { .. }, .. } => "a producer block holds no `pipelined` loop",
            StmtKind::WarpGroup { .. } => "a producer block holds no warp group",
            StmtKind::Producer(_) => "producer blocks do not nest",
            _ => return,
        };
        err.get_or_insert(Diag::new(s.loc, why));
    });
    err.map_or(Ok(()), Err)
}

/// The tiles and variables a set of statements reads and writes.
#[derive(Default)]
struct Uses {
    tiles_read: HashSet<BufId>,
    tiles_written: HashSet<BufId>,
    vars_read: HashSet<VarId>,
    vars_assigned: HashSet<VarId>,
}

impl Uses {
    /// What `body` uses, at any depth, leaving out the statement `skip` (by address) and what it
    /// holds.
    fn of(body: &[Stmt], skip: Option<&Stmt>) -> Uses {
        let mut u = Uses::default();
        u.add(body, skip);
        u
    }

    fn add(&mut self, body: &[Stmt], skip: Option<&Stmt>) {
        for s in body {
            let Some(k) = skip.filter(|k| contains(s, k)) else {
                self.add_whole(s);
                continue;
            };
            if std::ptr::eq(s, k) {
                continue;
            }
            // An ancestor of the skipped statement: its header, then the bodies around it.
            self.add_header(s);
            for b in s.bodies() {
                self.add(b, skip);
            }
        }
    }

    /// What `s` and every statement inside it use.
    fn add_whole(&mut self, s: &Stmt) {
        let access = tile_access(s);
        self.tiles_read.extend(access.reads);
        self.tiles_written.extend(access.writes);
        visit_stmts(std::slice::from_ref(s), &mut |x| self.add_own_vars(x));
    }

    /// What `s` uses itself, not the statements inside it: its expressions, its counters and a
    /// `parallel`'s index space.
    fn add_header(&mut self, s: &Stmt) {
        s.for_each_expr(&mut |e| e.for_each_elem_tile(&mut |b| _ = self.tiles_read.insert(b)));
        self.add_own_vars(s);
        if let StmtKind::Parallel { over, .. } = &s.kind {
            self.tiles_read.insert(*over);
        }
    }

    /// The variables `s` itself reads and sets (not those of the statements inside it).
    fn add_own_vars(&mut self, s: &Stmt) {
        s.for_each_expr(&mut |e| e.for_each_var(&mut |v| _ = self.vars_read.insert(v)));
        match &s.kind {
            StmtKind::Assign(v, _) | StmtKind::For { var: v, .. } | StmtKind::WarpGroup { var: v, .. } => {
                self.vars_assigned.insert(*v);
            }
            StmtKind::Parallel { vars, .. } => self.vars_assigned.extend(vars),
            _ => {}
        }
    }

    fn touches(&self, b: BufId) -> bool {
        self.tiles_read.contains(&b) || self.tiles_written.contains(&b)
    }
}

/// Whether `s` is `inner` or holds it.
fn contains(s: &Stmt, inner: &Stmt) -> bool {
    let mut found = false;
    visit_stmts(std::slice::from_ref(s), &mut |x| found |= std::ptr::eq(x, inner));
    found
}

/// Checks the producer block at `body[at]` of the `pipelined` loop `lp` over `var` against the
/// kernel, and what it hands over.
fn plan_producer(def: &KernelDef, lp: &Stmt, var: VarId, body: &[Stmt], at: usize) -> Result<ProducerPlan, Diag> {
    let block = &body[at];
    let StmtKind::Producer(inner) = &block.kind else { unreachable!("`at` is a producer block") };
    let name = |b: BufId| &def.buffers[b].name;
    let var_name = |v: VarId| &def.vars[v].name;
    let before = &body[..at];
    if let Some(s) = before.iter().find(|s| !is_stage_fill(def, s) && !matches!(s.kind, StmtKind::Assign(..))) {
        return Err(Diag::new(
            block.loc,
            format!("a producer block comes first in its loop's body, after the stage fills and `let`s alone; here the statement at {} comes before it", s.loc),
        ));
    }
    let own = Uses::of(inner, None);
    let elsewhere = Uses::of(&def.body, Some(block));
    let outside_loop = Uses::of(&def.body, Some(lp));
    // An error points at the statement that conflicts with the block, naming the block where
    // it has a place (the tile text form's statements have none).
    let block_at =
        if block.loc == SrcLoc::default() { String::new() } else { format!(" (the producer block at {})", block.loc) };
    let at_use = |within: &[Stmt], skip: Option<&Stmt>, hit: &dyn Fn(&Uses) -> bool, why: String| {
        let loc = first_use(within, skip, hit).map_or(block.loc, |s| s.loc);
        Err(Diag::new(loc, format!("{why}{block_at}")))
    };
    let (mut outputs, mut temporaries) = (vec![], vec![]);
    for b in sorted(&own.tiles_written) {
        if !elsewhere.touches(b) {
            temporaries.push(b);
            continue;
        }
        let touches = |u: &Uses| u.touches(b);
        if def.buffers[b].scope != Scope::Shared {
            let why = format!("`{}` is written in the producer block and used here, but a producer hands its results over in shared tiles; make it `shared`, or keep its uses in the block", name(b));
            return at_use(&def.body, Some(block), &touches, why);
        }
        if elsewhere.tiles_written.contains(&b) {
            let why = format!(
                "`{}` is written here and in the producer block; only the producer may write the tiles it hands over",
                name(b)
            );
            return at_use(&def.body, Some(block), &|u| u.tiles_written.contains(&b), why);
        }
        if outside_loop.touches(b) {
            let why = format!("`{}` is written in the producer block and used here, outside its loop; a producer's tiles hold one iteration's results, for that iteration's body", name(b));
            return at_use(&def.body, Some(lp), &touches, why);
        }
        outputs.push(b);
    }
    if let Some(v) = sorted(&own.vars_assigned).into_iter().find(|v| elsewhere.vars_read.contains(v)) {
        let why = format!("`{}` is set in the producer block and read here; a producer hands its results over in shared tiles, not variables", var_name(v));
        return at_use(&def.body, Some(block), &|u| u.vars_read.contains(&v), why);
    }
    // What the block depends on: its own reads and the `let`s before it (which a role running
    // ahead evaluates for its own iteration, as the fills do).
    let lets = Uses::of(before, None);
    let after = &body[at + 1..];
    let rest = Uses::of(after, None);
    let tiles_in: HashSet<BufId> = own.tiles_read.union(&lets.tiles_read).copied().collect();
    if let Some(b) = sorted(&tiles_in).into_iter().find(|b| rest.tiles_written.contains(b)) {
        let why = format!("`{}` is read for the producer block and written here, after it in the loop's body; a producer running ahead would read a later iteration's value", name(b));
        return at_use(after, None, &|u| u.tiles_written.contains(&b), why);
    }
    let vars_in: HashSet<VarId> =
        own.vars_read.iter().chain(&lets.vars_read).chain(&lets.vars_assigned).copied().collect();
    if let Some(v) = sorted(&vars_in).into_iter().find(|v| rest.vars_assigned.contains(v)) {
        let why = format!("`{}` is read for the producer block and set here, after it in the loop's body; a producer running ahead would read a later iteration's value", var_name(v));
        return at_use(after, None, &|u| u.vars_assigned.contains(&v), why);
    }
    // The fills no statement but the block reads: neither the body's others (the compute
    // warps run those, its `let`s among them) nor anything outside the loop; and those only
    // the others read.
    let filled: Vec<BufId> = body.iter().filter_map(|s| stage_fill_tile(def, s)).collect();
    let mut compute = Uses::default();
    body.iter().filter(|s| !is_stage_fill(def, s) && !std::ptr::eq(*s, block)).for_each(|s| compute.add_whole(s));
    let producing: HashSet<BufId> = own.tiles_read.union(&lets.tiles_read).copied().collect();
    let own_fills = filled.iter().copied().filter(|b| !compute.touches(*b) && !outside_loop.touches(*b)).collect();
    let block_fills = filled
        .iter()
        .copied()
        .filter(|b| !producing.contains(b) && compute.touches(*b) && !outside_loop.touches(*b))
        .collect();
    Ok(ProducerPlan { var, outputs, temporaries, own_fills, block_fills, role: ProducerRole::Inline, loc: block.loc })
}

/// The first statement of `body` in source order, leaving out `skip` and what it holds, whose
/// own uses (a compound statement's header, else the statement) `hit` accepts.
fn first_use<'a>(body: &'a [Stmt], skip: Option<&Stmt>, hit: &dyn Fn(&Uses) -> bool) -> Option<&'a Stmt> {
    for s in body {
        if skip.is_some_and(|k| std::ptr::eq(s, k)) {
            continue;
        }
        let mut own = Uses::default();
        match s.bodies() {
            [[], []] => own.add_whole(s),
            _ => own.add_header(s),
        }
        if hit(&own) {
            return Some(s);
        }
        if let Some(found) = s.bodies().into_iter().find_map(|b| first_use(b, skip, hit)) {
            return Some(found);
        }
    }
    None
}

/// A set's ids in order, so the first error and the plan do not depend on hashing.
fn sorted<T: Copy + Ord>(set: &HashSet<T>) -> Vec<T> {
    let mut v: Vec<T> = set.iter().copied().collect();
    v.sort();
    v
}

/// What becomes of a producer block's statements in [`splice_producers`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Splice {
    /// They stand in the block's place.
    Inline,
    /// They are left out (what the rest of the kernel runs without them).
    Drop,
}

/// `body` with every producer block replaced by its statements, or by nothing.
pub(crate) fn splice_producers(body: Vec<Stmt>, splice: Splice) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for mut s in body {
        match s.kind {
            StmtKind::Producer(inner) if splice == Splice::Inline => out.extend(splice_producers(inner, splice)),
            StmtKind::Producer(_) => {}
            _ => {
                match &mut s.kind {
                    StmtKind::For { body, .. } | StmtKind::Parallel { body, .. } | StmtKind::WarpGroup { body, .. } => {
                        *body = splice_producers(std::mem::take(body), splice)
                    }
                    StmtKind::If(_, t, e) => {
                        *t = splice_producers(std::mem::take(t), splice);
                        *e = splice_producers(std::mem::take(e), splice);
                    }
                    _ => {}
                }
                out.push(s);
            }
        }
    }
    out
}

impl TileProgram {
    /// The ring of the `pipelined` loop over `var`, if fill warps run its producer block.
    pub fn producer_ring(&self, var: VarId) -> Option<&ProducerRing> {
        self.producers.iter().find(|x| x.var == var).and_then(|x| match &x.role {
            ProducerRole::FillWarps(ring) => Some(ring),
            ProducerRole::Inline => None,
        })
    }
}

/// One plan as a line of the pass dumps.
pub struct ProducerLine<'a>(pub &'a KernelDef, pub &'a ProducerPlan);

impl fmt::Display for ProducerLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ProducerLine(def, plan) = self;
        let names = |bufs: &[BufId]| match bufs {
            [] => "nothing".to_string(),
            _ => bufs.iter().map(|b| def.buffers[*b].name.as_str()).collect::<Vec<_>>().join(", "),
        };
        write!(
            f,
            "// producer of loop {}#{}: hands over {}; keeps {}",
            def.vars[plan.var].name,
            plan.var,
            names(&plan.outputs),
            names(&plan.temporaries)
        )?;
        match &plan.role {
            ProducerRole::Inline => write!(f, " (placed inline: no fill warps)"),
            ProducerRole::FillWarps(ring) if ring.cluster > 1 => write!(
                f,
                " (on the fill warps, {} groups of {} in each of the cluster's {} blocks taking turns at the iterations, each block's hand-over copied to every block; {} stages, each group's fills {} of its turns ahead of its block, those only the block reads ({}) in {} a group of its own, those only the rest of the body reads ({}) issued by each block's compute warps; ready and empty mbarriers at {})",
                ring.groups,
                ring.warps,
                ring.cluster,
                ring.stages,
                ring.fill_distance(),
                names(&plan.own_fills),
                match ring.own_fill_slots() {
                    1 => "1 slot".to_string(),
                    n => format!("{n} slots"),
                },
                names(&plan.block_fills),
                ring.barriers
            ),
            ProducerRole::FillWarps(ring) if ring.groups == 1 => write!(
                f,
                " (on the fill warps, {}, one iteration ahead; {} stages, fills {} ahead of the block; ready and empty mbarriers at {})",
                ring.warps,
                ring.stages,
                ring.fill_distance(),
                ring.barriers
            ),
            ProducerRole::FillWarps(ring) => write!(
                f,
                " (on the fill warps, {} groups of {} taking turns at the iterations; {} stages, each group's fills {} of its turns ahead of its block; ready and empty mbarriers at {})",
                ring.groups,
                ring.warps,
                ring.stages,
                ring.fill_distance(),
                ring.barriers
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;
    use crate::tile_text::parse_kernel;

    /// A kernel of one 2-stage pipelined loop over `i#1` whose fill copies `a` into `s`, with
    /// `body` after the fill, and `after` after the loop; the tiles `s`, `y`, `z` (shared) and
    /// `f` (a fragment), the variables `r#2`, `c#3` (indices) and `v#4`, `w#5` (`let`s).
    fn kernel(body: &str, after: &str) -> TileProgram {
        let text = format!(
            "kernel t(M: dim, K: dim, a: f32[M, K], o: mut f32[M, K]) threads=32 grid=[1, 1, 1] {{
  vars bx#0: i32, i#1: i32, r#2: i32, c#3: i32, v#4: i32, w#5: i32
  block_vars [bx#0, _, _]
  s = Shared<f32>[16, 16]
  y = Shared<f32>[16, 16]
  z = Shared<f32>[16, 16]
  f = Fragment<f32>[16, 16]
  v#4 = 0
  for i#1 in pipelined(stages=2) 0..4 {{
    copy a[0, (i#1 Mul 16); 16x16] -> s
{body}
  }}
{after}
}}"
        );
        let def = parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        TileProgram::new(def, Target::Sm80)
    }

    fn error_of(body: &str, after: &str) -> String {
        match place_producers(&mut kernel(body, after)) {
            Err(e) => e.message,
            Ok(()) => panic!("expected an error for\n{body}"),
        }
    }

    const PRODUCE_Y: &str = "producer {\n copy s -> y\n }";

    /// A producer loop of `stages` in a kernel of `fill_warps` launched in clusters of 2.
    fn in_clusters(fill_warps: u32, stages: u32) -> Result<TileProgram, String> {
        in_clusters_filling(fill_warps, stages, "0", PRODUCE_Y)
    }

    /// [`in_clusters`] with the fill's first row `row` and the producer block `producer`.
    fn in_clusters_filling(fill_warps: u32, stages: u32, row: &str, producer: &str) -> Result<TileProgram, String> {
        let text = format!(
            "kernel t(M: dim, K: dim, a: f32[M, K], o: mut f32[M, K]) threads=32 fill_warps={fill_warps} cluster=2 grid=[4, 1, 1] {{
  vars bx#0: i32, i#1: i32, h#2: i32, r#3: i32, c#4: i32
  block_vars [bx#0, _, _]
  s = Shared<f32>[16, 16]
  y = Shared<f32>[16, 16]
  h#2 = (bx#0 Div 2)
  for i#1 in pipelined(stages={stages}) 0..4 {{
    copy a[{row}, (i#1 Mul 16); 16x16] -> s
    {producer}
    copy y -> o[(bx#0 Mul 16), 0; 16x16]
  }}
}}"
        );
        let mut p = TileProgram::new(parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}")), Target::Sm90);
        place_producers(&mut p).map_err(|e| e.message)?;
        Ok(p)
    }

    /// Across a cluster one block computes each iteration's fills and producer block for all
    /// of them: what they read must be the same in every block of the cluster (the cluster's
    /// index `bx / 2` is; `bx` is not), while the rest of the body may read the block's own.
    #[test]
    fn a_cluster_ring_computes_only_what_its_blocks_share() {
        in_clusters_filling(1, 3, "(h#2 Mul 16)", PRODUCE_Y).expect("the cluster's index");
        let e = in_clusters_filling(1, 3, "(bx#0 Mul 16)", PRODUCE_Y).map(|_| ()).expect_err("the block index");
        assert!(
            e.contains("`bx` can differ between the blocks of a cluster (it comes from the block index `bx`; `bx / 2` is the same in all of a cluster's blocks)"),
            "{e}"
        );
        let producer = "producer {\n parallel (r#3, c#4) over y {\n y[r#3, c#4] = (s[r#3, c#4] Add f32(bx#0))\n }\n }";
        let e = in_clusters_filling(1, 3, "0", producer).map(|_| ()).expect_err("the block reads the block index");
        assert!(e.contains("`bx` can differ between the blocks of a cluster"), "{e}");
        // A fill only the rest of the body reads is the block's own: it may read its index.
        // So may a `let` only such a fill reads; one the block reads may not.
        let with_lets = |producer: &str| {
            let text = format!(
                "kernel t(M: dim, K: dim, a: f32[M, K], o: mut f32[M, K]) threads=32 fill_warps=1 cluster=2 grid=[4, 1, 1] {{
  vars bx#0: i32, i#1: i32, r#2: i32, c#3: i32, r#4: i32, c#5: i32
  block_vars [bx#0, _, _]
  s = Shared<f32>[16, 16]
  u = Shared<f32>[16, 16]
  y = Shared<f32>[16, 16]
  for i#1 in pipelined(stages=3) 0..4 {{
    r#2 = (bx#0 Mul 16)
    c#3 = (i#1 Mul 16)
    copy a[0, c#3; 16x16] -> s
    copy a[r#2, c#3; 16x16] -> u
    {producer}
    copy y -> o[(bx#0 Mul 16), 0; 16x16]
    copy u -> o[(bx#0 Mul 16), 16; 16x16]
  }}
}}"
            );
            let mut p = TileProgram::new(parse_kernel(&text).unwrap_or_else(|e| panic!("{e}")), Target::Sm90);
            place_producers(&mut p).map(|_| p).map_err(|e| e.message)
        };
        let p = with_lets(PRODUCE_Y).expect("the block's own fill and its `let`");
        let name = |b: &BufId| p.def.buffers[*b].name.clone();
        let plan = &p.producers[0];
        assert_eq!(plan.own_fills.iter().map(name).collect::<Vec<_>>(), ["s"]);
        assert_eq!(plan.block_fills.iter().map(name).collect::<Vec<_>>(), ["u"]);
        let reads_r = "producer {\n parallel (r#4, c#5) over y {\n y[r#4, c#5] = (s[r#4, c#5] Add f32(r#2))\n }\n }";
        let e = with_lets(reads_r).map(|_| ()).expect_err("the block reads a `let` of the block index");
        assert!(e.contains("`bx` can differ between the blocks of a cluster"), "{e}");
    }

    /// Across a cluster the blocks' groups take the turns: more stages than groups in all.
    #[test]
    fn a_producer_ring_across_a_cluster_takes_turns_over_its_blocks() {
        let p = in_clusters(1, 3).expect("one group a block, 3 stages");
        let line = ProducerLine(&p.def, &p.producers[0]).to_string();
        assert!(line.contains("in each of the cluster's 2 blocks taking turns at the iterations"), "{line}");
        // Only the block reads the fill `s`: each group keeps it in slots of its own.
        assert!(line.contains("those only the block reads (s) in 1 slot a group of its own"), "{line}");
        let p = in_clusters(8, 5).expect("two groups a block, 5 stages");
        let ring = match &p.producers[0].role {
            ProducerRole::FillWarps(ring) => ring.clone(),
            ProducerRole::Inline => panic!("on the fill warps"),
        };
        assert_eq!((ring.turns(), ring.mbarriers()), (4, 15), "a ready and two empty mbarriers a stage");
        let e = in_clusters(8, 4).map(|_| ()).expect_err("4 stages for 4 groups");
        assert!(
            e.contains("the producers of a cluster of 2 blocks need a loop of more than 4 stages (it has 4)"),
            "{e}"
        );
        let e = in_clusters(1, 2).map(|_| ()).expect_err("2 stages for 2 blocks");
        assert!(
            e.contains("the producers of a cluster of 2 blocks need a loop of more than 2 stages (it has 2)"),
            "{e}"
        );
    }

    #[test]
    fn a_producer_block_is_placed_and_its_outputs_named() {
        let mut p = kernel(&format!("{PRODUCE_Y}\n copy y -> o[0, 0; 16x16]"), "");
        place_producers(&mut p).expect("valid");
        let mut left = 0;
        visit_stmts(&p.def.body, &mut |s| left += matches!(s.kind, StmtKind::Producer(_)) as usize);
        assert_eq!(left, 0, "{}", p.def);
        let y = p.def.buffers.position(|b| b.name == "y").expect("y");
        assert_eq!(p.producers.len(), 1);
        assert_eq!(p.producers[0].outputs, vec![y]);
        assert_eq!(
            ProducerLine(&p.def, &p.producers[0]).to_string(),
            "// producer of loop i#1: hands over y; keeps nothing (placed inline: no fill warps)"
        );
    }

    #[test]
    fn a_producer_block_may_keep_temporaries_and_read_lets_before_it() {
        let body = "w#5 = (i#1 Add v#4)\n producer {\n copy s -> f\n copy f -> y\n }\n copy y -> o[0, w#5; 16x16]";
        let mut p = kernel(body, "");
        place_producers(&mut p).expect("valid");
        let y = p.def.buffers.position(|b| b.name == "y").expect("y");
        let f = p.def.buffers.position(|b| b.name == "f").expect("f");
        assert_eq!(p.producers[0].outputs, vec![y]);
        assert_eq!(p.producers[0].temporaries, vec![f], "the fragment `f` is the block's own");
    }

    /// An error about a use that conflicts with the block points at that use, naming the block.
    #[test]
    fn an_error_points_at_the_conflicting_statement() {
        use crate::builder::*;
        use crate::dtype::DType;
        use crate::passes::testing::loc;
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "N"], DType::F32, false);
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.shared("s", &[16, 16], DType::F32, loc(3));
        let y = k.shared("y", &[16, 16], DType::F32, loc(3));
        let i = k.begin_for("i", LoopKind::pipelined(2), 0, k.dim("N"), loc(4));
        k.copy(k.tile(&a, vec![Val::from(0), i], &[16, 16], loc(5)), s, loc(5));
        k.begin_producer(loc(6));
        k.copy(s, y, loc(7));
        k.end();
        k.copy(y, s, loc(9));
        k.end();
        let mut p = TileProgram::new(k.finish().expect("valid"), Target::Sm80);
        let e = place_producers(&mut p).expect_err("the body writes what the block reads");
        assert_eq!(e.loc.line, 9, "{e}");
        assert!(e.message.contains("`s` is read for the producer block and written here"), "{e}");
        assert!(e.message.contains("the producer block at test.rs:6:1"), "{e}");
    }

    #[test]
    fn each_rule_is_an_error() {
        let cases: [(&str, &str, &str); 10] = [
            (&format!("{PRODUCE_Y}\n producer {{\n copy s -> z\n }}"), "", "at most one producer block"),
            ("copy s -> z\n producer {\n copy s -> y\n }", "", "comes first in its loop's body"),
            ("producer {\n copy s -> o[0, 0; 16x16]\n }", "", "writes no global memory"),
            ("producer {\n copy a[0, 0; 16x16] -> y\n }", "", "only through its loop's stage fills"),
            (
                "producer {\n for w#5 in pipelined(stages=2) 0..2 {\n copy s -> y\n }\n }",
                "",
                "holds no `pipelined` loop",
            ),
            (&format!("{PRODUCE_Y}\n fill y = 0.0"), "", "is written here and in the producer block"),
            (PRODUCE_Y, "copy y -> o[0, 0; 16x16]", "used here, outside its loop"),
            (
                "producer {\n w#5 = i#1\n copy s -> y\n }\n copy y -> o[0, w#5; 16x16]",
                "",
                "`w` is set in the producer block",
            ),
            (
                "w#5 = v#4\n producer {\n copy s -> y\n }\n v#4 = (v#4 Add 1)",
                "",
                "`v` is read for the producer block and set here, after it",
            ),
            (
                "producer {\n copy s -> y\n }\n fill s = 0.0",
                "",
                "`s` is read for the producer block and written here, after it",
            ),
        ];
        for (body, after, want) in cases {
            let got = error_of(body, after);
            assert!(got.contains(want), "for\n{body}\nexpected `{want}` in: {got}");
        }
    }
}
