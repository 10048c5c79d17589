//! How a kernel's registers are spread over its roles ([`RegisterPlan`]): on sm_90a a kernel
//! whose fill warps are whole warpgroups, and either only issue TMA boxes (every pipeline with
//! fills is warp-specialized) or run a producer block (`place_producers`), hands the registers
//! the fill warps do not need to the compute warpgroups with `setmaxnreg`, as soon as each role
//! starts; otherwise every thread keeps what ptxas gives it.
//!
//! The block's pool is what `.maxnreg` gives each thread at entry (as much as one resident block
//! may take, in steps of 8), times its threads. The fill warpgroups drop to the kernel's
//! `producer_registers`, or to [`PRODUCER_REGISTERS`] when they only issue boxes; a computing
//! producer without a declared count keeps the registers uniform, as only the kernel's author
//! knows what its block needs. The compute warpgroups take the rest, evenly, in steps of 8, at
//! most 256 (`setmaxnreg`'s range).
//!
//! The roles part at the kernel's entry, or, where the scalar code before its first pipelined
//! loop reads a shared tile that the compute warps' tile operations wrote (a varlen kernel's
//! sequence picked through shared memory), at that loop: before it every thread runs the
//! kernel's code as without the split, its barriers those of the whole block.

use std::fmt;

use crate::passes::plan_pipelines::{Handoff, StageFills, TmaPipeline};
use crate::passes::TileProgram;
use crate::target::Target;

/// Registers per thread of a fill warpgroup that only issues TMA boxes (an iteration counter,
/// a stage, the boxes' coordinates and the parity bits fit with room to spare).
pub const PRODUCER_REGISTERS: u32 = 40;

/// Registers one block may hold (per SM, on every target from sm_80 up).
pub const REGISTER_FILE: u32 = 65536;

/// Threads per warpgroup.
const WARPGROUP: u32 = 128;

/// How the registers are spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterPlan {
    /// Every thread keeps what ptxas allocates, and why no split.
    Uniform(NoSplit),
    /// `.maxnreg` at entry, then `setmaxnreg` per role.
    Split(RegisterSplit),
}

/// A split of the block's registers between the roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterSplit {
    /// `.maxnreg`: per thread at entry.
    pub at_entry: u32,
    /// The fill warpgroups' after their `setmaxnreg.dec`.
    pub producer: u32,
    /// The compute warpgroups' after their `setmaxnreg.inc`.
    pub consumers: u32,
    /// The kernel body's top-level statement from which the roles run apart (0: from entry).
    pub parts_at: usize,
}

/// Why a kernel's registers are not split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSplit {
    /// The target has no `setmaxnreg` (sm_90a).
    Target(Target),
    /// No fill warps.
    NoFillWarps,
    /// The fill warps are not whole warpgroups (`setmaxnreg` is per warpgroup).
    FillWarpsNotWarpgroups(u32),
    /// The compute threads are not whole warpgroups.
    ComputeNotWarpgroups(u32),
    /// A pipeline's fill warps issue `cp.async` copies for the compute warps (registers of
    /// their own, in a loop the compute warps share), neither TMA boxes alone nor a producer
    /// block's ring.
    FillsNotTma,
    /// A producer block runs on the fill warps, and the kernel does not say how many registers
    /// it needs (`launch(.., producer_registers = n)`).
    ProducerRegistersUndeclared,
    /// The compute warps would gain nothing.
    NothingToGain,
    /// The kernel asks for more than one block per SM (`min_blocks`): the pool at entry would
    /// not be one block's whole register file.
    SeveralBlocksPerSm(u32),
    /// The code the fill warps run beside the fills (indices, loop bounds, conditions) reads a
    /// shared tile, which the roles apart would read without a barrier ordering its writes.
    FillWarpsReadShared,
}

impl fmt::Display for NoSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoSplit::Target(t) => write!(f, "target {t} has no setmaxnreg (sm_90a)"),
            NoSplit::NoFillWarps => write!(f, "no fill warps"),
            NoSplit::FillWarpsNotWarpgroups(n) => write!(f, "{n} fill warps are not whole warpgroups"),
            NoSplit::ComputeNotWarpgroups(n) => write!(f, "{n} compute threads are not whole warpgroups"),
            NoSplit::FillsNotTma => write!(f, "the fill warps issue cp.async copies"),
            NoSplit::ProducerRegistersUndeclared => {
                write!(f, "a producer block runs on the fill warps without a producer_registers count")
            }
            NoSplit::NothingToGain => write!(f, "the compute warps would gain no registers"),
            NoSplit::SeveralBlocksPerSm(n) => write!(f, "min_blocks = {n}: the registers are shared between blocks"),
            NoSplit::FillWarpsReadShared => write!(f, "the fill warps' code reads a shared tile"),
        }
    }
}

impl fmt::Display for RegisterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterPlan::Uniform(why) => write!(f, "registers uniform ({why})"),
            RegisterPlan::Split(s) => {
                write!(
                    f,
                    "registers split: .maxnreg {}, fill warpgroups setmaxnreg.dec {}, compute warpgroups setmaxnreg.inc {}",
                    s.at_entry, s.producer, s.consumers
                )?;
                match s.parts_at {
                    0 => Ok(()),
                    // The scalar code before reads a shared tile: both roles run it.
                    k => write!(f, ", from top-level statement {k} (the first pipelined loop)"),
                }
            }
        }
    }
}

/// The register plan of `p`.
pub fn plan_registers(p: &TileProgram) -> RegisterPlan {
    split(p).map_or_else(RegisterPlan::Uniform, RegisterPlan::Split)
}

fn split(p: &TileProgram) -> Result<RegisterSplit, NoSplit> {
    if !p.target.has(Target::Sm90a) {
        return Err(NoSplit::Target(p.target));
    }
    let (fill, compute) = (p.def.fill_warps * 32, p.def.threads);
    if fill == 0 {
        return Err(NoSplit::NoFillWarps);
    }
    if !fill.is_multiple_of(WARPGROUP) {
        return Err(NoSplit::FillWarpsNotWarpgroups(p.def.fill_warps));
    }
    if !compute.is_multiple_of(WARPGROUP) {
        return Err(NoSplit::ComputeNotWarpgroups(compute));
    }
    let specialized = |plan: &crate::passes::plan_pipelines::PipelinePlan| match &plan.fills {
        StageFills::TensorBoxes(TmaPipeline { handoff: Handoff::EmptyBarriers { .. }, .. }) => true,
        StageFills::AsyncCopies { .. } => plan.staged.is_empty(),
        StageFills::TensorBoxes(_) => false,
    };
    let ring = |plan: &crate::passes::plan_pipelines::PipelinePlan| p.producer_ring(plan.var).is_some();
    if !p.pipelines.iter().all(|plan| ring(plan) || specialized(plan)) {
        return Err(NoSplit::FillsNotTma);
    }
    let producer = match (p.def.producer_registers, p.pipelines.iter().any(ring)) {
        (Some(n), _) => n,
        (None, false) => PRODUCER_REGISTERS,
        (None, true) => return Err(NoSplit::ProducerRegistersUndeclared),
    };
    if let Some(n) = p.def.min_blocks_per_sm.filter(|n| *n > 1) {
        return Err(NoSplit::SeveralBlocksPerSm(n));
    }
    let body = &p.def.body;
    let first_loop = body.iter().position(holds_pipelined_loop).unwrap_or(body.len());
    let parts_at = match (skeleton_reads_shared(p, &body[..first_loop]), skeleton_reads_shared(p, &body[first_loop..]))
    {
        (_, true) => return Err(NoSplit::FillWarpsReadShared),
        (true, false) => first_loop,
        (false, false) => 0,
    };
    let groups = (fill + compute) / WARPGROUP;
    let at_entry = (REGISTER_FILE / (fill + compute) / 8 * 8).min(255 / 8 * 8);
    let pool = at_entry * groups;
    let consumers = ((pool.saturating_sub(producer * fill / WARPGROUP)) / (compute / WARPGROUP) / 8 * 8).min(256);
    if consumers <= at_entry {
        return Err(NoSplit::NothingToGain);
    }
    Ok(RegisterSplit { at_entry, producer, consumers, parts_at })
}

/// Whether `s` is or holds a pipelined loop.
fn holds_pipelined_loop(s: &crate::tile::Stmt) -> bool {
    use crate::tile::{visit_stmts, LoopKind, StmtKind};
    let mut found = false;
    visit_stmts(std::slice::from_ref(s), &mut |n| {
        found |= matches!(n.kind, StmtKind::For { kind: LoopKind::Pipelined { .. }, .. })
    });
    found
}

/// Whether the fill warps' code in `body` reads a shared tile: an element in an assignment, a
/// loop bound, a condition, or a copy's box, of the statements they run (the skeleton:
/// assignments, loops and `if`s, and the copies they issue), not inside the tile operations
/// only the compute warps run. A producer block on the fill warps is not skeleton: it runs in
/// its own scope, after the loop's barrier of the whole block (`producer_ring`).
fn skeleton_reads_shared(p: &TileProgram, body: &[crate::tile::Stmt]) -> bool {
    use crate::tile::{Expr, Stmt, StmtKind};
    fn walk<'a>(body: &'a [Stmt], exprs: &mut Vec<&'a Expr>) {
        for s in body {
            match &s.kind {
                StmtKind::Assign(_, e) => exprs.push(e),
                StmtKind::For { start, end, body, .. } => {
                    exprs.extend([start, end]);
                    walk(body, exprs);
                }
                StmtKind::If(c, then, other) => {
                    exprs.push(c);
                    walk(then, exprs);
                    walk(other, exprs);
                }
                StmtKind::Copy { src, dst } => exprs.extend(src.index_exprs().chain(dst.index_exprs())),
                _ => {}
            }
        }
    }
    let mut exprs = vec![];
    walk(body, &mut exprs);
    exprs.into_iter().any(|e| crate::passes::infer_layouts::reads_shared(p, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::*;
    use crate::dtype::DType;
    use crate::passes::testing::loc;
    use crate::tile::LoopKind;

    /// A GEMM-like loop on `threads` compute threads and `fill_warps`, K a multiple of 8 when
    /// `aligned` (so its fills can be TMA boxes).
    fn plan_of(target: Target, threads: u32, fill_warps: u32, aligned: bool) -> RegisterPlan {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "K"], DType::BF16, false);
        let o = k.tensor("o", &["M", "N"], DType::F32, true);
        if aligned {
            k.assume_multiple(&k.dim("K"), 8, loc(1));
        }
        k.launch(vec![Host::int(1)], threads, loc(2));
        k.fill_warps(fill_warps, loc(2));
        let s = k.shared("s", &[128, 64], DType::BF16, loc(3));
        let w = k.shared("w", &[128, 64], DType::BF16, loc(3));
        let acc = k.fragment("acc", &[128, 128], DType::F32, loc(4));
        k.fill(&acc, 0.0, loc(4));
        let i = k.begin_for("i", LoopKind::pipelined(3), 0, 4, loc(5));
        k.copy(k.tile(&a, vec![Val::from(0), i.clone()], &[128, 64], loc(6)), s, loc(6));
        k.copy(k.tile(&a, vec![Val::from(1), i], &[128, 64], loc(7)), w, loc(7));
        k.gemm(s, w.t(), &acc, loc(8));
        k.end();
        k.copy(acc, k.tile(&o, vec![Val::from(0), Val::from(0)], &[128, 128], loc(9)), loc(9));
        plan_registers(&crate::passes::run_tile_passes_for(k.finish().expect("valid"), target).expect("passes"))
    }

    /// Where [`ring_plan_reading`]'s scalar code reads a shared tile the compute warps wrote.
    #[derive(Clone, Copy, PartialEq)]
    enum SharedRead {
        Nowhere,
        BeforeTheLoop,
        InTheLoop,
    }

    /// A loop whose step (a fragment through a `gemm`) is a producer block on 4 fill warps,
    /// handing a shared tile to 128 compute threads, on sm_90a.
    fn ring_plan(producer_registers: Option<u32>) -> RegisterPlan {
        ring_plan_reading(producer_registers, SharedRead::Nowhere)
    }

    /// [`ring_plan`] with the row its loop loads read from a shared tile (`read`).
    fn ring_plan_reading(producer_registers: Option<u32>, read: SharedRead) -> RegisterPlan {
        let k = KernelBuilder::new("t", loc(1));
        let a = k.tensor("a", &["M", "K"], DType::BF16, false);
        let o = k.tensor("o", &["M", "N"], DType::F32, true);
        k.launch(vec![Host::int(1)], 128, loc(2));
        k.fill_warps(4, loc(2));
        k.producer_registers(producer_registers, loc(2));
        let s = k.shared("s", &[64, 64], DType::BF16, loc(3));
        let h = k.shared("h", &[64, 64], DType::F32, loc(3));
        let row = k.shared("row", &[1], DType::I32, loc(3));
        let f = k.fragment("f", &[64, 64], DType::F32, loc(4));
        let acc = k.fragment("acc", &[64, 64], DType::F32, loc(4));
        k.fill(&acc, 0.0, loc(4));
        k.fill(&row, 0, loc(4));
        let r = match read {
            SharedRead::BeforeTheLoop => k.let_var("r", k.elem(&row, vec![Val::from(0)], loc(4)), loc(4)),
            _ => k.let_var("r", 0, loc(4)),
        };
        let i = k.begin_for("i", LoopKind::pipelined(3), 0, 4, loc(5));
        let r = match read {
            SharedRead::InTheLoop => k.let_var("r_in", k.elem(&row, vec![Val::from(0)], loc(5)), loc(5)),
            _ => r,
        };
        k.copy(k.tile(&a, vec![r, i], &[64, 64], loc(6)), s, loc(6));
        k.begin_producer(loc(7));
        k.fill(&f, 0.0, loc(8));
        k.gemm(s, s.t(), &f, loc(8));
        k.copy(f, h, loc(9));
        k.end();
        k.copy(h, acc, loc(10));
        k.end();
        k.copy(acc, k.tile(&o, vec![Val::from(0), Val::from(0)], &[64, 64], loc(11)), loc(11));
        let def = k.finish().expect("valid");
        plan_registers(&crate::passes::run_tile_passes_for(def, Target::Sm90a).expect("passes"))
    }

    #[test]
    fn a_computing_producer_keeps_what_the_kernel_declares() {
        // 256 threads at entry: 248 each; the compute warpgroup takes the rest, at most 256.
        let split = RegisterSplit { at_entry: 248, producer: 128, consumers: 256, parts_at: 0 };
        assert_eq!(ring_plan(Some(128)), RegisterPlan::Split(split));
        let split = RegisterSplit { at_entry: 248, producer: 240, consumers: 256, parts_at: 0 };
        assert_eq!(ring_plan(Some(240)), RegisterPlan::Split(split));
        assert_eq!(ring_plan(Some(248)), RegisterPlan::Uniform(NoSplit::NothingToGain));
        assert_eq!(ring_plan(None), RegisterPlan::Uniform(NoSplit::ProducerRegistersUndeclared));
    }

    #[test]
    fn the_roles_part_after_scalar_code_that_reads_shared_memory() {
        // Read before the loop, both roles run up to the loop together; read in the loop's own
        // scalar code, the fill warps would read it apart from the compute warps' writes.
        let split = RegisterSplit { at_entry: 248, producer: 128, consumers: 256, parts_at: 0 };
        assert_eq!(ring_plan_reading(Some(128), SharedRead::Nowhere), RegisterPlan::Split(split));
        let RegisterPlan::Split(before) = ring_plan_reading(Some(128), SharedRead::BeforeTheLoop) else {
            panic!("a split")
        };
        assert!(before.parts_at > 0 && RegisterSplit { parts_at: 0, ..before } == split, "{before:?}");
        let in_loop = ring_plan_reading(Some(128), SharedRead::InTheLoop);
        assert_eq!(in_loop, RegisterPlan::Uniform(NoSplit::FillWarpsReadShared));
    }

    #[test]
    fn a_producer_warpgroup_of_tma_boxes_hands_its_registers_to_the_consumers() {
        let split = RegisterSplit { at_entry: 168, producer: 40, consumers: 232, parts_at: 0 };
        assert_eq!(plan_of(Target::Sm90a, 256, 4, true), RegisterPlan::Split(split));
    }

    #[test]
    fn each_rule_has_its_reason() {
        let uniform = |why| RegisterPlan::Uniform(why);
        assert_eq!(plan_of(Target::Sm80, 256, 4, true), uniform(NoSplit::Target(Target::Sm80)));
        assert_eq!(plan_of(Target::Sm90a, 256, 0, true), uniform(NoSplit::NoFillWarps));
        assert_eq!(plan_of(Target::Sm90a, 256, 1, true), uniform(NoSplit::FillWarpsNotWarpgroups(1)));
        assert_eq!(plan_of(Target::Sm90a, 256, 4, false), uniform(NoSplit::FillsNotTma));
    }
}
