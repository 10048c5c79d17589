//! Loop-invariant code motion over the thread IR. A pure instruction inside a loop whose
//! sources are all defined outside it moves before the loop, so it runs once instead of every
//! iteration. The lowering computes addresses where it uses them: a box's block-uniform 64-bit
//! start and a thread's swizzled offsets come back in every iteration of a chunk loop, and
//! ptxas recomputes them each time. A hoisted value stays live across the whole loop, so what
//! may move is the kernel's choice ([`Hoist`], `launch(.., hoist = ..)`).
//!
//! The values do not change, only where they are computed: the same bits.

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::thread_ir::*;
use crate::tile::Hoist;

/// What moved out of one loop, for the dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoistedLoop {
    /// The loop's top label.
    pub label: u32,
    /// Instructions moved before it.
    pub moved: usize,
    /// Instructions left inside it.
    pub left: usize,
}

impl fmt::Display for HoistedLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "// loop L{}: {} instructions moved before it, {} left", self.label, self.moved, self.left)
    }
}

/// Moves what `hoist` allows out of every loop of `prog` (a label and a branch back to it),
/// innermost first, so a value fixed across an outer loop too leaves that one next.
pub fn hoist_invariants(prog: &mut ThreadProgram, hoist: Hoist) -> Vec<HoistedLoop> {
    let per_thread = match hoist {
        Hoist::Nothing => return vec![],
        Hoist::Everything => HashSet::new(),
        Hoist::BlockUniform => thread_dependent(&prog.body),
    };
    let defs = def_counts(&prog.body);
    let mut report = vec![];
    for label in loops_innermost_first(&prog.body) {
        let Some((top, back)) = loop_span(&prog.body, label) else { continue };
        if entered_from_the_side(&prog.body, top, back) {
            continue;
        }
        let inside = &prog.body[top + 1..back];
        let skippable = skippable_inside(inside);
        let mut defined_inside: HashSet<Reg> = inside.iter().flat_map(|i| defined(&i.op)).collect();
        let mut moved = vec![];
        for (k, inst) in inside.iter().enumerate() {
            let dests = defined(&inst.op);
            // f32 values stay: a float computed once per loop is rare, and each would hold
            // a register the loop's own arithmetic wants.
            let movable = inst.guard.is_none()
                && !skippable[k]
                && may_speculate(&inst.op)
                && dests.iter().all(|d| defs[d] == 1 && d.class != RegClass::F32 && !per_thread.contains(d))
                && sources(&inst.op).is_some_and(|srcs| srcs.iter().all(|r| !defined_inside.contains(r)));
            if movable {
                dests.iter().for_each(|d| {
                    defined_inside.remove(d);
                });
                moved.push(k);
            }
        }
        if moved.is_empty() {
            continue;
        }
        let left = back - top - 1 - moved.len();
        report.push(HoistedLoop { label, moved: moved.len(), left });
        let moved: HashSet<usize> = moved.into_iter().map(|k| top + 1 + k).collect();
        let mut body = Vec::with_capacity(prog.body.len());
        let mut hoisted = vec![];
        let mut kept = vec![];
        for (k, inst) in std::mem::take(&mut prog.body).into_iter().enumerate() {
            if moved.contains(&k) {
                hoisted.push(inst);
            } else if k < top {
                body.push(inst);
            } else {
                kept.push(inst);
            }
        }
        body.extend(hoisted);
        body.extend(kept);
        prog.body = body;
    }
    report
}

/// Each loop's top label: a label with a branch back to it from further down, the shortest
/// span first (a loop inside another is shorter than it).
fn loops_innermost_first(body: &[Inst]) -> Vec<u32> {
    let labels: HashMap<u32, usize> = body
        .iter()
        .enumerate()
        .filter_map(|(k, i)| match i.op {
            Op::Label(l) => Some((l, k)),
            _ => None,
        })
        .collect();
    let mut spans: Vec<(usize, u32)> = body
        .iter()
        .enumerate()
        .filter_map(|(k, i)| match i.op {
            Op::Bra { target } => labels.get(&target).filter(|top| **top < k).map(|top| (k - top, target)),
            _ => None,
        })
        .collect();
    spans.sort();
    let mut seen = HashSet::new();
    spans.into_iter().filter(|(_, l)| seen.insert(*l)).map(|(_, l)| l).collect()
}

/// The positions of loop `label`'s top and of its last branch back to the top.
fn loop_span(body: &[Inst], label: u32) -> Option<(usize, usize)> {
    let top = body.iter().position(|i| i.op == Op::Label(label))?;
    let back = body.iter().rposition(|i| i.op == Op::Bra { target: label })?;
    (back > top).then_some((top, back))
}

/// Whether a branch from outside `top ..= back` lands inside the loop or on its top label: the
/// code moved before the label would not run on that path.
fn entered_from_the_side(body: &[Inst], top: usize, back: usize) -> bool {
    let inside: HashSet<u32> = body[top..=back]
        .iter()
        .filter_map(|i| match i.op {
            Op::Label(l) => Some(l),
            _ => None,
        })
        .collect();
    body.iter().enumerate().any(|(k, i)| {
        let outside = k < top || k > back;
        matches!(i.op, Op::Bra { target } if outside && inside.contains(&target))
    })
}

/// Per instruction of a loop's body, whether a branch inside the body can jump over it to a
/// label inside the body (an `if` arm): such an instruction does not run in every iteration,
/// and moved out it would read what that path may not have written. The loop's exit (a branch
/// past its end) skips nothing here: a loop whose body runs at least once per entry is the
/// common case, and its zero-trip entry computes values nothing then reads.
fn skippable_inside(inside: &[Inst]) -> Vec<bool> {
    let labels: HashMap<u32, usize> = inside
        .iter()
        .enumerate()
        .filter_map(|(k, i)| match i.op {
            Op::Label(l) => Some((l, k)),
            _ => None,
        })
        .collect();
    let mut skippable = vec![false; inside.len()];
    for (k, i) in inside.iter().enumerate() {
        if let Op::Bra { target } = i.op {
            if let Some(&to) = labels.get(&target).filter(|to| **to > k) {
                skippable[k + 1..to].iter_mut().for_each(|x| *x = true);
            }
        }
    }
    skippable
}

/// How many instructions write each register (a guarded one counts as a definition too).
fn def_counts(body: &[Inst]) -> HashMap<Reg, u32> {
    let mut n = HashMap::new();
    for i in body {
        for d in defined(&i.op) {
            *n.entry(d).or_insert(0) += 1;
        }
    }
    n
}

/// The registers whose value may differ between the threads of a block: the thread index, a
/// load from a per-thread address, what shuffles and tensor-core instructions write, and
/// everything computed from those (or under a per-thread guard).
fn thread_dependent(body: &[Inst]) -> HashSet<Reg> {
    let mut per_thread = HashSet::new();
    loop {
        let before = per_thread.len();
        for i in body {
            let from_thread = match &i.op {
                Op::ReadSpecial { sreg, .. } => *sreg == Special::Tid,
                Op::Ld { addr, .. } => per_thread.contains(addr),
                op => sources(op).is_none_or(|srcs| srcs.iter().any(|r| per_thread.contains(r))),
            };
            if from_thread || i.guard.is_some_and(|(p, _)| per_thread.contains(&p)) {
                per_thread.extend(defined(&i.op));
            }
        }
        if per_thread.len() == before {
            return per_thread;
        }
    }
}

/// Whether `op` may run where it did not before: an integer division or remainder only by a
/// non-zero constant (PTX gives an unspecified value for a zero divisor, and the simulator
/// stops there).
fn may_speculate(op: &Op) -> bool {
    match op {
        Op::Bin { op: BinKind::Div | BinKind::Rem, ty, b, .. } if !matches!(ty, Ty::F32 | Ty::F16 | Ty::BF16) => {
            matches!(b, Src::Imm(v) if *v != 0)
        }
        _ => true,
    }
}

fn src_reg(s: &Src) -> Option<Reg> {
    match s {
        Src::Reg(r) => Some(*r),
        Src::Imm(_) | Src::F32(_) => None,
    }
}

/// The registers `op` reads when it is pure (it only computes its destinations from them: no
/// memory, no other thread, no side effect); `None` for every other operation.
fn sources(op: &Op) -> Option<Vec<Reg>> {
    let regs = |srcs: &[&Src]| srcs.iter().filter_map(|s| src_reg(s)).collect::<Vec<Reg>>();
    Some(match op {
        Op::Mov { a, .. } | Op::Un { a, .. } | Op::Cvt { a, .. } => regs(&[a]),
        Op::Bin { a, b, .. } | Op::MulWide { a, b, .. } | Op::Setp { a, b, .. } => regs(&[a, b]),
        Op::Mad { a, b, c, .. } => regs(&[a, b, c]),
        Op::PackHalf2 { hi, lo, .. } => regs(&[hi, lo]),
        Op::Selp { a, b, p, .. } => [src_reg(a), src_reg(b), Some(*p)].into_iter().flatten().collect(),
        Op::PredLogic { a, b, .. } => vec![*a, *b],
        Op::CvtaGlobal { a, .. } | Op::CvtaParam { a, .. } | Op::Unpack2 { a, .. } => vec![*a],
        Op::Mapa { addr, rank, .. } => [Some(*addr), src_reg(rank)].into_iter().flatten().collect(),
        Op::ReadSpecial { .. } | Op::SharedBase { .. } | Op::LdParam { .. } | Op::ParamAddress { .. } => vec![],
        Op::Ld { .. }
        | Op::St { .. }
        | Op::CpAsync { .. }
        | Op::Prefetch { .. }
        | Op::LdAcquire { .. }
        | Op::StRelease { .. }
        | Op::RedReleaseAdd { .. }
        | Op::CpAsyncCommit
        | Op::CpAsyncWait { .. }
        | Op::Ldmatrix { .. }
        | Op::Movmatrix { .. }
        | Op::Mma { .. }
        | Op::WgmmaFence
        | Op::Wgmma { .. }
        | Op::WgmmaCommit
        | Op::WgmmaWait { .. }
        | Op::SetMaxNReg { .. }
        | Op::FenceProxyAsync
        | Op::MbarrierInit { .. }
        | Op::MbarrierArrive { .. }
        | Op::CpAsyncMbarrierArrive { .. }
        | Op::MbarrierWait { .. }
        | Op::MbarrierArriveExpectTx { .. }
        | Op::MbarrierArriveRemote { .. }
        | Op::StAsync { .. }
        | Op::BulkCopyToCluster { .. }
        | Op::FenceMbarrierInit
        | Op::ClusterBarrier { .. }
        | Op::TmaLoad { .. }
        | Op::TmaStore { .. }
        | Op::BulkCommit
        | Op::BulkWaitRead { .. }
        | Op::Shfl { .. }
        | Op::Bar { .. }
        | Op::BarArrive { .. }
        | Op::Label(_)
        | Op::Bra { .. }
        | Op::Ret
        | Op::Trace { .. } => return None,
    })
}

/// The registers `op` writes.
fn defined(op: &Op) -> Vec<Reg> {
    match op {
        Op::Mov { d, .. }
        | Op::ReadSpecial { d, .. }
        | Op::SharedBase { d }
        | Op::LdParam { d, .. }
        | Op::CvtaGlobal { d, .. }
        | Op::Bin { d, .. }
        | Op::MulWide { d, .. }
        | Op::Mad { d, .. }
        | Op::Un { d, .. }
        | Op::Setp { d, .. }
        | Op::PredLogic { d, .. }
        | Op::Selp { d, .. }
        | Op::Cvt { d, .. }
        | Op::PackHalf2 { d, .. }
        | Op::Movmatrix { d, .. }
        | Op::MbarrierWait { d, .. }
        | Op::ParamAddress { d, .. }
        | Op::CvtaParam { d, .. }
        | Op::Mapa { d, .. }
        | Op::LdAcquire { d, .. }
        | Op::Shfl { d, .. } => vec![*d],
        Op::Unpack2 { lo, hi, .. } => vec![*lo, *hi],
        Op::Ld { d, .. } | Op::Wgmma { d, .. } | Op::Ldmatrix { d, .. } => d.clone(),
        Op::Mma { d, .. } => d.to_vec(),
        Op::MbarrierArrive { state, .. } | Op::MbarrierArriveExpectTx { state, .. } => vec![*state],
        Op::St { .. }
        | Op::CpAsync { .. }
        | Op::Prefetch { .. }
        | Op::StRelease { .. }
        | Op::RedReleaseAdd { .. }
        | Op::CpAsyncCommit
        | Op::CpAsyncWait { .. }
        | Op::WgmmaFence
        | Op::WgmmaCommit
        | Op::WgmmaWait { .. }
        | Op::SetMaxNReg { .. }
        | Op::FenceProxyAsync
        | Op::MbarrierInit { .. }
        | Op::CpAsyncMbarrierArrive { .. }
        | Op::MbarrierArriveRemote { .. }
        | Op::StAsync { .. }
        | Op::BulkCopyToCluster { .. }
        | Op::FenceMbarrierInit
        | Op::ClusterBarrier { .. }
        | Op::TmaLoad { .. }
        | Op::TmaStore { .. }
        | Op::BulkCommit
        | Op::BulkWaitRead { .. }
        | Op::Bar { .. }
        | Op::BarArrive { .. }
        | Op::Label(_)
        | Op::Bra { .. }
        | Op::Ret
        | Op::Trace { .. } => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::SrcLoc;

    fn inst(op: Op) -> Inst {
        Inst { op, guard: None, loc: SrcLoc::new("k.rs", 1, 1), cache: CachePolicy::Normal }
    }

    fn r(id: u32) -> Reg {
        Reg { class: RegClass::B32, id }
    }

    fn add(d: u32, a: u32, b: Src) -> Inst {
        inst(Op::Bin { op: BinKind::Add, ty: Ty::S32, d: r(d), a: Src::Reg(r(a)), b })
    }

    /// `r0` = tid, `r1` = a block index; a loop (label 7) over counter `r2` whose body adds
    /// `r1 + 4` (block-uniform, invariant), `r0 + 8` (per thread, invariant), `r2 + r1`
    /// (changes every iteration) and `r3 + 1` from the first (invariant once it has moved).
    fn program() -> ThreadProgram {
        let body = vec![
            inst(Op::ReadSpecial { d: r(0), sreg: Special::Tid }),
            inst(Op::ReadSpecial { d: r(1), sreg: Special::Ctaid(0) }),
            inst(Op::Mov { ty: Ty::S32, d: r(2), a: Src::Imm(0) }),
            inst(Op::Label(7)),
            add(3, 1, Src::Imm(4)),
            add(4, 0, Src::Imm(8)),
            add(5, 2, Src::Reg(r(1))),
            add(6, 3, Src::Imm(1)),
            add(2, 2, Src::Imm(1)),
            inst(Op::Bra { target: 7 }),
            inst(Op::Ret),
        ];
        ThreadProgram::of_body(32, body)
    }

    fn position(prog: &ThreadProgram, d: u32) -> usize {
        prog.body.iter().position(|i| defined(&i.op) == vec![r(d)]).unwrap()
    }

    #[test]
    fn invariant_values_move_before_the_loop_in_order() {
        let mut prog = program();
        let report = hoist_invariants(&mut prog, Hoist::Everything);
        assert_eq!(report, vec![HoistedLoop { label: 7, moved: 3, left: 2 }]);
        let top = prog.body.iter().position(|i| i.op == Op::Label(7)).unwrap();
        assert!(position(&prog, 3) < position(&prog, 6) && position(&prog, 6) < top);
        assert!(position(&prog, 4) < top);
        assert!(position(&prog, 5) > top, "r5 reads the counter");
    }

    #[test]
    fn a_block_uniform_plan_leaves_per_thread_values_in_the_loop() {
        let mut prog = program();
        hoist_invariants(&mut prog, Hoist::BlockUniform);
        let top = prog.body.iter().position(|i| i.op == Op::Label(7)).unwrap();
        assert!(position(&prog, 3) < top && position(&prog, 6) < top);
        assert!(position(&prog, 4) > top, "r4 reads the thread index");
    }

    #[test]
    fn guarded_values_stay() {
        let mut prog = program();
        prog.body[4].guard = Some((Reg { class: RegClass::Pred, id: 0 }, true));
        hoist_invariants(&mut prog, Hoist::Everything);
        let top = prog.body.iter().position(|i| i.op == Op::Label(7)).unwrap();
        // r3 is written under a guard, so r6 (which reads it) stays as well.
        assert!(prog.body[top + 1..].iter().any(|i| defined(&i.op) == vec![r(3)]));
        assert!(position(&prog, 6) > top);
    }

    /// Wraps `program()`'s loop in an outer loop (label 9) over `r7`: `r1 + 4` leaves both.
    #[test]
    fn a_value_fixed_across_both_loops_leaves_the_inner_then_the_outer() {
        let mut prog = program();
        let inner = prog.body.drain(2..10).collect::<Vec<_>>();
        let mut outer = vec![inst(Op::Mov { ty: Ty::S32, d: r(7), a: Src::Imm(0) }), inst(Op::Label(9))];
        outer.extend(inner);
        outer.extend([add(7, 7, Src::Imm(1)), inst(Op::Bra { target: 9 })]);
        prog.body.splice(2..2, outer);
        let report = hoist_invariants(&mut prog, Hoist::Everything);
        assert_eq!(report.iter().map(|l| l.label).collect::<Vec<_>>(), vec![7, 9]);
        let outer_top = prog.body.iter().position(|i| i.op == Op::Label(9)).unwrap();
        assert!(position(&prog, 3) < outer_top && position(&prog, 6) < outer_top);
        // `r2` starts again at 0 in every outer iteration: its `mov` stays in the outer loop.
        assert!(position(&prog, 5) > outer_top);
    }

    #[test]
    fn a_loop_entered_from_the_side_keeps_its_instructions() {
        let mut prog = program();
        // A branch from before the loop to a label inside it, past the loop's top.
        prog.body.insert(2, inst(Op::Bra { target: 8 }));
        prog.body.insert(6, inst(Op::Label(8)));
        assert!(hoist_invariants(&mut prog, Hoist::Everything).is_empty());
    }

    #[test]
    fn what_an_if_inside_the_loop_skips_and_divisions_by_registers_stay() {
        let mut prog = program();
        // `@p bra 8` skips `r3 = r1 + 4`; `r4 = r0 / r1` may divide by zero.
        let p = Reg { class: RegClass::Pred, id: 0 };
        let skip = Inst { guard: Some((p, true)), ..inst(Op::Bra { target: 8 }) };
        prog.body.insert(4, skip);
        prog.body.insert(6, inst(Op::Label(8)));
        let div = Op::Bin { op: BinKind::Div, ty: Ty::S32, d: r(4), a: Src::Reg(r(0)), b: Src::Reg(r(1)) };
        let at = position(&prog, 4);
        prog.body[at].op = div;
        hoist_invariants(&mut prog, Hoist::Everything);
        let top = prog.body.iter().position(|i| i.op == Op::Label(7)).unwrap();
        assert!(position(&prog, 3) > top && position(&prog, 4) > top);
    }
}
