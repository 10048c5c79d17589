//! The simulator reports what the hardware would punish. These programs are written directly
//! in the thread IR (the simulator's input), each with one planted fault.

use kda_dsl::sim::{run, SimArg};
use kda_dsl::thread_ir::*;
use kda_dsl::SrcLoc;

struct P {
    body: Vec<Inst>,
    counts: [u32; 5],
}

impl P {
    fn new() -> P {
        P { body: vec![], counts: [0; 5] }
    }
    fn reg(&mut self, c: RegClass) -> Reg {
        let i = RegClass::ALL.iter().position(|x| *x == c).expect("a class");
        self.counts[i] += 1;
        Reg { class: c, id: self.counts[i] - 1 }
    }
    fn op(&mut self, op: Op) {
        let line = self.body.len() as u32 + 1;
        self.body.push(Inst { op, guard: None, loc: SrcLoc::new("k.rs", line, 1), cache: CachePolicy::Normal });
    }
    fn guarded(&mut self, p: Reg, op: Op) {
        let line = self.body.len() as u32 + 1;
        self.body.push(Inst {
            op,
            guard: Some((p, true)),
            loc: SrcLoc::new("k.rs", line, 1),
            cache: CachePolicy::Normal,
        });
    }
    fn prog(self, threads: u32, shared: u32, params: Vec<(String, Ty)>) -> ThreadProgram {
        ThreadProgram {
            name: "t".into(),
            params,
            threads,
            min_blocks_per_sm: None,
            shared_bytes: shared,
            body: self.body,
            reg_counts: self.counts,
        }
    }
}

fn tid(p: &mut P) -> Reg {
    let t = p.reg(RegClass::B32);
    p.op(Op::ReadSpecial { d: t, sreg: Special::Tid });
    t
}

fn err_of(prog: &ThreadProgram, args: &mut [(String, SimArg)]) -> String {
    run(prog, [1, 1, 1], args).expect_err("a planted fault").to_string()
}

#[test]
fn two_threads_writing_one_word_without_a_barrier_is_a_race() {
    let mut p = P::new();
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: a, a: Src::Imm(0) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(1)] });
    p.op(Op::Ret);
    let e = err_of(&p.prog(64, 16, vec![]), &mut []);
    assert!(e.contains("race") && e.contains("k.rs:2:1"), "{e}");
}

#[test]
fn a_barrier_between_write_and_read_makes_it_safe() {
    let mut p = P::new();
    let t = tid(&mut p);
    let a = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Mul, ty: Ty::U32, d: a, a: Src::Reg(t), b: Src::Imm(4) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Reg(t)] });
    p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    let z = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: z, a: Src::Imm(0) });
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: z, offset: 0 });
    p.op(Op::Ret);
    run(&p.prog(64, 256, vec![]), [1, 1, 1], &mut []).expect("no fault");
}

#[test]
fn reading_shared_memory_nobody_wrote_is_reported() {
    let mut p = P::new();
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: a, a: Src::Imm(8) });
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: a, offset: 0 });
    p.op(Op::Ret);
    let e = err_of(&p.prog(32, 16, vec![]), &mut []);
    assert!(e.contains("which nothing wrote") && e.contains("k.rs:"), "{e}");
}

#[test]
fn out_of_bounds_shared_and_global_accesses_are_reported() {
    let mut p = P::new();
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: a, a: Src::Imm(64) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(1)] });
    let e = err_of(&p.prog(1, 64, vec![]), &mut []);
    assert!(e.contains("shared access out of bounds") && e.contains("k.rs:"), "{e}");

    let mut p = P::new();
    let base = p.reg(RegClass::B64);
    p.op(Op::LdParam { ty: Ty::U64, d: base, name: "p_x".into() });
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: base, offset: 16, vals: vec![Src::Imm(1)] });
    let mut args = vec![("x".to_string(), SimArg::Tensor(vec![0; 16]))];
    let e = err_of(&p.prog(1, 0, vec![("p_x".into(), Ty::U64)]), &mut args);
    assert!(e.contains("global access out of bounds: tensor `x` byte 16..20 of 16") && e.contains("k.rs:"), "{e}");
}

#[test]
fn a_barrier_some_threads_skip_is_a_deadlock() {
    let mut p = P::new();
    let t = tid(&mut p);
    let q = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(0) });
    p.guarded(q, Op::Ret);
    p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    p.op(Op::Ret);
    let e = err_of(&p.prog(64, 0, vec![]), &mut []);
    assert!(e.contains("exited while others wait"), "{e}");
}

#[test]
fn named_barriers_release_at_their_thread_count() {
    // Warps 0 and 1 meet at barrier 1 (64 threads); warps 2 and 3 go on without them.
    let mut p = P::new();
    let t = tid(&mut p);
    let q = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(64) });
    p.guarded(q, Op::Bra { target: 1 });
    p.op(Op::Bar { id: 1, count: Some(64), reach: BarrierReach::SameInstruction });
    p.op(Op::Label(1));
    p.op(Op::Ret);
    run(&p.prog(128, 0, vec![]), [1, 1, 1], &mut []).expect("releases");
}

/// Warp 1 meets warp 0 at barrier 0 from another instruction (as a fill warp's copy of a
/// loop does): legal only for `barrier.sync`.
fn meet_from_two_instructions(reach: BarrierReach) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let q = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(32) });
    p.guarded(q, Op::Bra { target: 1 });
    p.op(Op::Bar { id: 0, count: None, reach });
    p.op(Op::Bra { target: 2 });
    p.op(Op::Label(1));
    p.op(Op::Bar { id: 0, count: None, reach });
    p.op(Op::Label(2));
    p.op(Op::Ret);
    p.prog(64, 0, vec![])
}

#[test]
fn an_aligned_barrier_met_from_two_instructions_is_an_error() {
    let e = err_of(&meet_from_two_instructions(BarrierReach::SameInstruction), &mut []);
    assert!(e.contains("needs every thread at one instruction"), "{e}");
    run(&meet_from_two_instructions(BarrierReach::AnyInstruction), [1, 1, 1], &mut []).expect("releases");
}

/// Thread 64 (warp 2) writes a word, then warps 0 and 1 meet at named barrier 1 without it
/// and thread 0 reads the word: with `block_barrier`, warp 2 joins them at `bar.sync 0` first.
fn hand_off(block_barrier: bool) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: a, a: Src::Imm(0) });
    let writer = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: writer, a: Src::Reg(t), b: Src::Imm(64) });
    p.guarded(writer, Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(7)] });
    if block_barrier {
        p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    }
    let third = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: third, a: Src::Reg(t), b: Src::Imm(64) });
    p.guarded(third, Op::Bra { target: 1 });
    p.op(Op::Bar { id: 1, count: Some(64), reach: BarrierReach::SameInstruction });
    let reader = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: reader, a: Src::Reg(t), b: Src::Imm(0) });
    let v = p.reg(RegClass::B32);
    p.guarded(reader, Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: a, offset: 0 });
    p.op(Op::Label(1));
    p.op(Op::Ret);
    p.prog(96, 16, vec![])
}

#[test]
fn a_named_barrier_orders_only_the_warps_that_take_part() {
    let e = err_of(&hand_off(false), &mut []);
    assert!(e.contains("race") && e.contains("written by thread 64 and read by thread 0"), "{e}");
    run(&hand_off(true), [1, 1, 1], &mut []).expect("ordered by the block barrier");
}

#[test]
fn shuffles_follow_the_ptx_lane_rules() {
    let mut p = P::new();
    let t = tid(&mut p);
    let x = p.reg(RegClass::B32);
    p.op(Op::Shfl { mode: ShflMode::Bfly, d: x, a: t, b: Src::Imm(1), c: 31 });
    let y = p.reg(RegClass::B32);
    p.op(Op::Shfl { mode: ShflMode::Up, d: y, a: t, b: Src::Imm(2), c: 31 });
    let base = p.reg(RegClass::B64);
    p.op(Op::LdParam { ty: Ty::U64, d: base, name: "p_out".into() });
    let off = p.reg(RegClass::B64);
    p.op(Op::MulWide { ty: Ty::U32, d: off, a: Src::Reg(t), b: Src::Imm(8) });
    let a = p.reg(RegClass::B64);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::S64, d: a, a: Src::Reg(base), b: Src::Reg(off) });
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Reg(x), Src::Reg(y)] });
    p.op(Op::Ret);
    let mut args = vec![("out".to_string(), SimArg::Tensor(vec![0; 32 * 8]))];
    run(&p.prog(32, 0, vec![("p_out".into(), Ty::U64)]), [1, 1, 1], &mut args).expect("runs");
    let SimArg::Tensor(b) = &args[0].1 else { unreachable!() };
    for lane in 0..32usize {
        let word = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) as usize;
        assert_eq!(word(lane * 8), lane ^ 1);
        assert_eq!(word(lane * 8 + 4), if lane >= 2 { lane - 2 } else { lane });
    }
}

#[test]
fn signed_32_bit_overflow_in_index_arithmetic_is_reported() {
    let mut p = P::new();
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::S32, d: a, a: Src::Imm(1 << 30) });
    let b = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Mul, ty: Ty::S32, d: b, a: Src::Reg(a), b: Src::Imm(4) });
    let e = err_of(&p.prog(1, 0, vec![]), &mut []);
    assert!(e.contains("32-bit signed overflow"), "{e}");
}

#[test]
fn reading_a_register_nothing_wrote_is_reported() {
    // A value computed only on one path and read on another: the simulator names the register.
    let mut p = P::new();
    let t = tid(&mut p);
    let q = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(0) });
    let x = p.reg(RegClass::B32);
    p.guarded(q, Op::Mov { ty: Ty::U32, d: x, a: Src::Imm(7) });
    let y = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: y, a: Src::Reg(x), b: Src::Imm(1) });
    p.op(Op::Ret);
    let e = err_of(&p.prog(32, 0, vec![]), &mut []);
    assert!(e.contains("reads register %r1, which nothing wrote"), "{e}");
}
