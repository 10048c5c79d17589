//! Plans each `pipelined` loop: which of its statements are stage fills, which tiles they
//! stage, the body's `let`s the fills read (evaluated again for the fills' iteration), and
//! whether the fills branch around their address arithmetic past the loop's end. The lowering
//! emits the prologue and the steady state from this plan, and decides nothing about it.
//!
//! A stage fill is a copy from a global box into a shared tile at the top level of the loop's
//! body ([`is_stage_fill`]); the other passes use the same test. It runs `stages - 1` iterations
//! ahead of the body, into its own copy of the tile (`allocate_shared` makes `stages` of them).

use std::fmt;

use super::TileProgram;
use crate::analysis::fill_prelude::fill_prelude;
use crate::diag::Diag;
use crate::tile::*;
use crate::tma_choice::{choose_tma, register_map, NoTma, TmaBoxes};

/// What the lowering of one `pipelined` loop needs decided.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelinePlan {
    /// The loop's variable (each loop has its own).
    pub var: VarId,
    /// Iterations in flight.
    pub stages: u32,
    /// The shared tiles the fills stage, in fill order.
    pub staged: Vec<BufId>,
    /// The body's assignments the fills read, in body order, to run for the fills' iteration.
    pub prelude: Vec<Stmt>,
    /// Past the loop's end the fills branch around their address arithmetic; not in a
    /// tensor-core loop, where the branch would split the block that interleaves the fills
    /// with the MMAs (the GEMM measured slower with it), unless fill warps run the loop's
    /// producer block: their fills run apart from the MMAs, and a dead one would zero a stage
    /// the compute warps may still read (the producer waits for no `empty` phase past the end).
    pub skip_dead_fills: bool,
    /// The loop's `wgmma` group stays in flight into the next iteration ([`WgmmaInFlight`]).
    pub wgmma_in_flight: Option<WgmmaInFlight>,
    /// How the fills are copied and awaited.
    pub fills: StageFills,
    /// What the body's barriers wait for of the next stages' fills (the loop's own choice).
    pub barriers: BodyBarriers,
}

/// How a pipeline's stage fills are copied, and how the body waits for a stage.
#[derive(Clone, Debug, PartialEq)]
pub enum StageFills {
    /// `cp.async` copies in one commit group per stage, awaited with `cp.async.wait_group`
    /// and the barrier at the top of the iteration; why not TMA.
    AsyncCopies {
        /// Why the fills are not TMA boxes.
        not_tma: NoTma,
    },
    /// TMA boxes, one thread issuing a stage's boxes after raising the stage's mbarrier
    /// transaction count by their bytes; each reader waits for the stage's phase.
    TensorBoxes(TmaPipeline),
}

/// A pipeline whose fills are all TMA boxes.
#[derive(Clone, Debug, PartialEq)]
pub struct TmaPipeline {
    /// Per fill, in fill order: its boxes and the index of its map in
    /// [`TileProgram::tensor_maps`].
    pub fills: Vec<(TmaBoxes, usize)>,
    /// Bytes one stage's boxes bring (the mbarrier's transaction count per phase).
    pub stage_bytes: u32,
    /// Shared byte offset of the loop's mbarriers, 8 bytes each: one per stage that its boxes
    /// complete, then (with [`Handoff::EmptyBarriers`]) one per stage its readers release
    /// (`allocate_shared` places them).
    pub barriers: u32,
    /// How a stage's readers hand it back for its refill.
    pub handoff: Handoff,
}

impl TmaPipeline {
    /// The mbarriers the loop takes per stage.
    pub fn barriers_per_stage(&self) -> u32 {
        match self.handoff {
            Handoff::BlockBarrier => 1,
            Handoff::EmptyBarriers { .. } => 2,
        }
    }
}

/// How the threads that read a TMA pipeline's stage hand it back to the thread that refills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// Every thread passes the barrier at the top of each iteration, which orders the stage's
    /// last reads before its refill (a kernel without fill warps: one thread of the block
    /// issues the boxes).
    BlockBarrier,
    /// Warp specialization: the fill warps (the producer) run ahead on their own, waiting for
    /// a stage's `empty` mbarrier, on which each of the `consumers` threads arrives once it is
    /// done reading the stage; no barrier spans both roles inside the loop, so the body's own
    /// barriers are the compute warps' alone.
    EmptyBarriers {
        /// Threads that read each stage (the compute threads).
        consumers: u32,
    },
}

/// A `pipelined` loop whose only work beside its fills is one `gemm` on `wgmma` with both
/// operands in shared memory, accumulating across iterations: each iteration waits for the
/// group before its own (`wgmma.wait_group 1`), so the tensor cores never wait for the issue of
/// the next, and the fills run one stage less ahead, so that the stage a fill overwrites was
/// read by a group every warpgroup has waited for before the barrier at the top of the
/// iteration. The loop's exit waits for the last group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaInFlight {
    /// The accumulator.
    pub acc: BufId,
}

impl PipelinePlan {
    /// Iterations the fills run ahead of the compute: `stages - 1`, one less with a `wgmma`
    /// group in flight.
    pub fn fill_distance(&self) -> u32 {
        self.stages - 1 - u32::from(self.wgmma_in_flight.is_some())
    }
}

/// Whether `s` (a statement at the top level of a `pipelined` loop's body) is a stage fill.
pub fn is_stage_fill(def: &KernelDef, s: &Stmt) -> bool {
    matches!(&s.kind, StmtKind::Copy { src: Region::Global { .. }, dst: Region::Buf(b) } if def.buffers[*b].scope == Scope::Shared)
}

/// The tile a stage fill fills (`None` for any other statement).
pub fn stage_fill_tile(def: &KernelDef, s: &Stmt) -> Option<BufId> {
    match &s.kind {
        StmtKind::Copy { dst: Region::Buf(b), .. } if is_stage_fill(def, s) => Some(*b),
        _ => None,
    }
}

/// Plans every `pipelined` loop of the kernel into `p.pipelines`, outermost first.
pub fn plan_pipelines(p: &mut TileProgram) -> Result<(), Diag> {
    let mut plans = vec![];
    let mut first_error = None;
    visit_stmts(&p.def.body, &mut |s| {
        let StmtKind::For { var, kind: LoopKind::Pipelined { stages, barriers }, body, .. } = &s.kind else {
            return;
        };
        if *barriers == BodyBarriers::LeaveFillsInFlight {
            if let Some(copy) = other_shared_copy(&p.def, body) {
                let why = "a pipelined loop with `fills_in_flight` issues no global-to-shared copy but its stage fills (its barriers would not wait for this one); copy before the loop";
                first_error.get_or_insert(Diag::new(copy.loc, why));
                return;
            }
        }
        let fills: Vec<&Stmt> = body.iter().filter(|x| is_stage_fill(&p.def, x)).collect();
        let staged = fills
            .iter()
            .filter_map(|f| match &f.kind {
                StmtKind::Copy { dst: Region::Buf(b), .. } => Some(*b),
                _ => None,
            })
            .collect();
        match fill_prelude(&p.def, *var, body, &fills) {
            Ok(prelude) => plans.push(PipelinePlan {
                fills: match p.producer_ring(*var) {
                    // The fill warps wait for their own copies, and hand the stage over with
                    // the block's results.
                    Some(_) => StageFills::AsyncCopies { not_tma: NoTma::ProducerRing },
                    None => stage_fills(p, &fills, &prelude),
                },
                var: *var,
                stages: *stages,
                staged,
                prelude,
                skip_dead_fills: !contains_gemm(body) || p.producer_ring(*var).is_some(),
                wgmma_in_flight: wgmma_in_flight(p, *stages, body),
                barriers: *barriers,
            }),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    });
    if let Some(e) = first_error {
        return Err(e);
    }
    // Each map once, named after its tensor.
    for plan in &mut plans {
        if let StageFills::TensorBoxes(tma) = &mut plan.fills {
            for (boxes, index) in &mut tma.fills {
                *index = register_map(&mut p.tensor_maps, &boxes.map);
                boxes.map.name = p.tensor_maps[*index].name.clone();
            }
        }
    }
    p.pipelines = plans;
    Ok(())
}

/// How the `fills` of one loop are copied: TMA boxes when every fill can be, `cp.async`
/// otherwise.
fn stage_fills(p: &TileProgram, fills: &[&Stmt], prelude: &[Stmt]) -> StageFills {
    if fills.is_empty() {
        return StageFills::AsyncCopies { not_tma: NoTma::NoFills };
    }
    let mut boxes = vec![];
    for (k, f) in fills.iter().enumerate() {
        match choose_tma(p, f) {
            Ok(b) => boxes.push((b, 0)),
            Err(why) if k == 0 => return StageFills::AsyncCopies { not_tma: why },
            Err(why) => return StageFills::AsyncCopies { not_tma: NoTma::AnotherFill(Box::new(why)) },
        }
    }
    let stage_bytes = boxes.iter().map(|(b, _)| b.boxes * b.box_bytes()).sum();
    // The fill warps run apart only when what they evaluate (the boxes' coordinates and the
    // prelude) reads no shared tile, whose writes no barrier would order before.
    let apart = !fills.iter().any(|f| match &f.kind {
        StmtKind::Copy { src, dst } => {
            src.index_exprs().chain(dst.index_exprs()).any(|e| super::infer_layouts::reads_shared(p, e))
        }
        _ => false,
    }) && !prelude
        .iter()
        .any(|s| matches!(&s.kind, StmtKind::Assign(_, e) if super::infer_layouts::reads_shared(p, e)));
    let handoff = match p.def.fill_warps {
        n if n > 0 && apart => Handoff::EmptyBarriers { consumers: p.def.threads },
        _ => Handoff::BlockBarrier,
    };
    StageFills::TensorBoxes(TmaPipeline { fills: boxes, stage_bytes, barriers: 0, handoff })
}

impl TileProgram {
    /// The plan of the `pipelined` loop over `var` (`plan_pipelines` made one for each).
    pub fn pipeline(&self, var: VarId) -> &PipelinePlan {
        self.pipelines.iter().find(|x| x.var == var).expect("plan_pipelines planned every pipelined loop")
    }
}

/// The `wgmma` group a loop of `stages` over `body` keeps in flight: when everything but the
/// fills is one `gemm` that takes `wgmma` with A from shared memory (an A fragment would be
/// repacked into registers the group in flight still owns), and at least 3 stages leave the
/// fills a stage ahead.
fn wgmma_in_flight(p: &TileProgram, stages: u32, body: &[Stmt]) -> Option<WgmmaInFlight> {
    let rest: Vec<&Stmt> = body.iter().filter(|s| !is_stage_fill(&p.def, s)).collect();
    let [Stmt { kind: StmtKind::Gemm { a, b, c }, .. }] = rest[..] else { return None };
    let shape = crate::gemm_choice::choose_wgmma(&crate::gemm_choice::GemmFacts::of(p, a, b, *c)).ok()?;
    let shared_a = matches!(shape.a, crate::gemm_choice::WgmmaAFrom::Shared(_));
    (shared_a && stages >= 3).then_some(WgmmaInFlight { acc: *c })
}

/// A global-to-shared copy in a `pipelined` loop's `body` other than its stage fills (one nested
/// deeper, or in a loop inside it), if there is one.
pub(crate) fn other_shared_copy<'a>(def: &KernelDef, body: &'a [Stmt]) -> Option<&'a Stmt> {
    body.iter().filter(|s| !is_stage_fill(def, s)).find_map(|s| plain_shared_copy(def, std::slice::from_ref(s)))
}

/// The first global-to-shared copy in `body` that is not a stage fill (a copy at the top level of
/// a `pipelined` loop's body), if there is one.
pub(crate) fn plain_shared_copy<'a>(def: &KernelDef, body: &'a [Stmt]) -> Option<&'a Stmt> {
    body.iter().find_map(|s| match &s.kind {
        _ if is_stage_fill(def, s) => Some(s),
        StmtKind::For { kind: LoopKind::Pipelined { .. }, body, .. } => other_shared_copy(def, body),
        StmtKind::For { body, .. } | StmtKind::Parallel { body, .. } | StmtKind::WarpGroup { body, .. } => {
            plain_shared_copy(def, body)
        }
        StmtKind::If(_, t, e) => plain_shared_copy(def, t).or_else(|| plain_shared_copy(def, e)),
        _ => None,
    })
}

/// Whether `body` has a tensor-core `gemm` at any depth.
fn contains_gemm(body: &[Stmt]) -> bool {
    let mut found = false;
    visit_stmts(body, &mut |s| found |= matches!(s.kind, StmtKind::Gemm { .. }));
    found
}

/// One line per pipeline, for the program's dump: `// pipeline c#13: 2 stages, fills a_sh,
/// b_sh; prelude t0#14; dead fills skipped`.
pub(crate) struct PipelineLine<'a>(pub &'a KernelDef, pub &'a PipelinePlan);

impl fmt::Display for PipelineLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PipelineLine(def, plan) = self;
        let var = |v: VarId| format!("{}#{}", def.vars[v].name, v.index());
        write!(f, "// pipeline {}: {} stages, fills ", var(plan.var), plan.stages)?;
        let names: Vec<&str> = plan.staged.iter().map(|b| def.buffers[*b].name.as_str()).collect();
        write!(f, "{}", if names.is_empty() { "none".to_string() } else { names.join(", ") })?;
        let lets: Vec<String> = plan
            .prelude
            .iter()
            .filter_map(|s| match &s.kind {
                StmtKind::Assign(v, _) => Some(var(*v)),
                _ => None,
            })
            .collect();
        if !lets.is_empty() {
            write!(f, "; prelude {}", lets.join(", "))?;
        }
        write!(f, "; dead fills {}", if plan.skip_dead_fills { "skipped" } else { "issued" })?;
        match &plan.fills {
            StageFills::AsyncCopies { not_tma } => write!(f, "; cp.async (not TMA: {not_tma})")?,
            StageFills::TensorBoxes(tma) => {
                let maps: Vec<String> = tma
                    .fills
                    .iter()
                    .map(|(b, _)| format!("{} {}x {} {:?}", b.map.name, b.boxes, b.map.box_text(), b.map.swizzle))
                    .collect();
                write!(f, "; TMA boxes {}, {} bytes a stage", maps.join(", "), tma.stage_bytes)?;
                write!(f, ", mbarriers at {}", tma.barriers)?;
                if let Handoff::EmptyBarriers { consumers } = tma.handoff {
                    write!(f, ", fill warps apart ({consumers} consumers release each stage)")?;
                }
            }
        }
        if let Some(w) = plan.wgmma_in_flight {
            let acc = &def.buffers[w.acc].name;
            write!(f, "; wgmma group into {acc} in flight (wait_group 1), fills {} ahead", plan.fill_distance())?;
        }
        if plan.barriers == BodyBarriers::LeaveFillsInFlight {
            write!(f, "; the body's barriers leave the fills in flight")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;

    /// A pipelined loop whose fills read a `let` of the body, and a tensor-core one.
    fn two_pipelines() -> KernelDef {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "K"], DType::BF16, false);
        let o = k.tensor("o", &["M", "K"], DType::F32, true);
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.shared("s", &[16, 64], DType::BF16, loc(3));
        let w = k.shared("w", &[64, 16], DType::BF16, loc(3));
        let acc = k.fragment("acc", &[16, 16], DType::F32, loc(4));
        let i = k.begin_for("i", LoopKind::pipelined(2), 0, 4, loc(5));
        let row = k.let_var("row", Val::bin(crate::tile::BinOp::Add, i, Val::from(1)), loc(6));
        k.copy(k.tile(&a, vec![row, Val::from(0)], &[16, 64], loc(7)), s, loc(7));
        k.copy(s, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 64], loc(8)), loc(8));
        k.end();
        k.fill(&acc, 0.0, loc(9));
        let j = k.begin_for("j", LoopKind::pipelined(3), 0, 4, loc(10));
        k.copy(k.tile(&a, vec![Val::from(0), j.clone()], &[16, 64], loc(11)), s, loc(11));
        k.copy(k.tile(&a, vec![j, Val::from(0)], &[64, 16], loc(12)), w, loc(12));
        k.gemm(s, w, &acc, loc(13));
        k.end();
        k.copy(acc, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 16], loc(14)), loc(14));
        k.finish().expect("valid")
    }

    #[test]
    fn each_pipeline_gets_its_fills_prelude_and_dead_fill_rule() {
        let p = crate::passes::run_tile_passes(two_pipelines()).expect("passes");
        assert_eq!(p.pipelines.len(), 2);
        let (first, second) = (&p.pipelines[0], &p.pipelines[1]);
        assert_eq!((first.stages, first.staged.len(), first.prelude.len(), first.skip_dead_fills), (2, 1, 1, true));
        assert_eq!(
            (second.stages, second.staged.len(), second.prelude.len(), second.skip_dead_fills),
            (3, 2, 0, false)
        );
        insta::assert_snapshot!(p.to_string());
    }

    #[test]
    fn a_fill_that_reads_what_the_body_writes_is_an_error_at_the_fill() {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "K"], DType::BF16, false);
        k.launch(vec![Host::int(1)], 128, loc(2));
        let s = k.shared("s", &[16, 64], DType::BF16, loc(3));
        let t = k.shared("t", &[16], DType::I32, loc(3));
        k.fill(&t, Val::from(0), loc(4));
        k.begin_for("i", LoopKind::pipelined(2), 0, 4, loc(5));
        let row = k.elem(&t, vec![Val::from(0)], loc(6));
        k.copy(k.tile(&a, vec![row, Val::from(0)], &[16, 64], loc(7)), s, loc(7));
        k.fill(&t, Val::from(1), loc(8));
        k.end();
        let e = crate::passes::run_tile_passes(k.finish().expect("valid")).expect_err("a stale read");
        assert_eq!(e.loc.line, 7, "{e}");
        assert!(e.message.contains("which the body writes"), "{e}");
    }
    /// A loop whose barriers leave its fills in flight may issue no other copy into shared
    /// memory (its barriers would not wait for it): an error at that copy. Without one, the
    /// plan keeps the loop's choice and its dump line says so.
    #[test]
    fn a_loop_leaving_its_fills_in_flight_copies_nothing_else_to_shared_memory() {
        let build = |other_copy: bool| {
            let k = KernelBuilder::new("t", loc(1));
            let a = k.tensor("a", &["M", "K"], DType::BF16, false);
            let o = k.tensor("o", &["M", "K"], DType::F32, true);
            k.launch(vec![Host::int(1)], 32, loc(2));
            let s = k.shared("s", &[16, 64], DType::BF16, loc(3));
            let u = k.shared("u", &[16, 64], DType::BF16, loc(3));
            let kind = LoopKind::Pipelined { stages: 2, barriers: BodyBarriers::LeaveFillsInFlight };
            let i = k.begin_for("i", kind, 0, 4, loc(5));
            k.copy(k.tile(&a, vec![i.clone(), Val::from(0)], &[16, 64], loc(6)), s, loc(6));
            if other_copy {
                k.begin_for("j", LoopKind::Serial, 0, 2, loc(7));
                k.copy(k.tile(&a, vec![i, Val::from(0)], &[16, 64], loc(8)), u, loc(8));
                k.end();
                k.copy(u, k.tile(&o, vec![Val::from(1), Val::from(0)], &[16, 64], loc(9)), loc(9));
            }
            k.copy(s, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 64], loc(10)), loc(10));
            k.end();
            crate::passes::run_tile_passes(k.finish().expect("valid"))
        };
        let p = build(false).expect("passes");
        assert_eq!(p.pipelines[0].barriers, BodyBarriers::LeaveFillsInFlight);
        assert!(p.to_string().contains("the body's barriers leave the fills in flight"), "{p}");
        let e = build(true).expect_err("another copy");
        assert_eq!(e.loc.line, 8, "{e}");
        assert!(e.message.contains("fills_in_flight"), "{e}");
    }
}
