//! The simulator reports what the hardware would punish. These programs are written directly
//! in the thread IR (the simulator's input), each with one planted fault.

use kda_dsl::hopper_layout::{KMajorTile, Major, MnMajorTile, OperandTile, Swizzle, TensorMap2d, WgmmaFragment};
use kda_dsl::sim::{run, SimArg};
use kda_dsl::thread_ir::*;
use kda_dsl::{SrcLoc, Target};

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
            params: params.into_iter().map(|(name, ty)| (name, ParamKind::Value(ty))).collect(),
            threads,
            min_blocks_per_sm: None,
            max_registers: None,
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

/// A register holding the shared address `offset` bytes into the block's dynamic shared
/// memory (the hardware's first kilobyte is its own: kernels address from `smem`).
fn shared_at(p: &mut P, offset: i64) -> Reg {
    let base = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: base });
    let a = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: a, a: Src::Reg(base), b: Src::Imm(offset) });
    a
}

fn err_of(prog: &ThreadProgram, args: &mut [(String, SimArg)]) -> String {
    run(prog, [1, 1, 1], args).expect_err("a planted fault").to_string()
}

#[test]
fn two_threads_writing_one_word_without_a_barrier_is_a_race() {
    let mut p = P::new();
    let a = shared_at(&mut p, 0);
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(1)] });
    p.op(Op::Ret);
    let e = err_of(&p.prog(64, 16, vec![]), &mut []);
    assert!(e.contains("race") && e.contains("k.rs:3:1"), "{e}");
}

#[test]
fn a_barrier_between_write_and_read_makes_it_safe() {
    let mut p = P::new();
    let t = tid(&mut p);
    let z = shared_at(&mut p, 0);
    let a = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: a, a: Src::Reg(t), b: Src::Imm(4), c: Src::Reg(z) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Reg(t)] });
    p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: z, offset: 0 });
    p.op(Op::Ret);
    run(&p.prog(64, 256, vec![]), [1, 1, 1], &mut []).expect("no fault");
}

#[test]
fn reading_shared_memory_nobody_wrote_is_reported() {
    let mut p = P::new();
    let a = shared_at(&mut p, 8);
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: a, offset: 0 });
    p.op(Op::Ret);
    let e = err_of(&p.prog(32, 16, vec![]), &mut []);
    assert!(e.contains("which nothing wrote") && e.contains("k.rs:"), "{e}");
}

#[test]
fn out_of_bounds_shared_and_global_accesses_are_reported() {
    let mut p = P::new();
    let a = shared_at(&mut p, 64);
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(1)] });
    let e = err_of(&p.prog(1, 64, vec![]), &mut []);
    assert!(e.contains("shared access out of bounds") && e.contains("k.rs:"), "{e}");

    // An offset taken for an address: below the block's shared memory, as on the hardware.
    let mut p = P::new();
    let a = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: a, a: Src::Imm(0) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(1)] });
    let e = err_of(&p.prog(1, 64, vec![]), &mut []);
    assert!(e.contains("shared access at address 0, outside the block's shared memory"), "{e}");

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
    let a = shared_at(&mut p, 0);
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

/// What a `wgmma` test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum WgmmaFault {
    None,
    NoRegisterFence,
    AccumulatorWrittenAfterFence,
    AccumulatorReadAfterFence,
    NoProxyFence,
    ReadBeforeWait,
    SharedWriteWhilePending,
    ExitPending,
    ProxyFenceAfterBarrier,
}

/// A `wgmma` test's product: `m64n{n}k16` with operand tiles of `swizzle` and each operand's
/// major-ness, A from shared memory or registers, `steps` instructions chained onto one
/// accumulator.
#[derive(Clone, Copy, Debug)]
struct WgmmaCase {
    swizzle: Swizzle,
    n: u32,
    a_from_registers: bool,
    a_major: Major,
    b_major: Major,
    steps: u32,
}

impl WgmmaCase {
    /// A from shared memory, both K-major, `n` = 16, two chained K-steps.
    fn shared_a(swizzle: Swizzle) -> WgmmaCase {
        WgmmaCase { swizzle, n: 16, a_from_registers: false, a_major: Major::K, b_major: Major::K, steps: 2 }
    }

    /// The operand tiles: A (64 rows) and B (`n` rows), `k` elements (one line of the swizzle,
    /// at least one K-step), B right after A. An MN-major tile whose extent is not whole lines
    /// of the swizzle takes none.
    fn tiles(&self) -> (OperandTile, OperandTile, u32) {
        let k = (self.swizzle.line_bytes() / 2).max(16);
        let tile = |mn: u32, major: Major| match major {
            Major::K => OperandTile::K(KMajorTile { rows: mn, k, elem_bytes: 2, swizzle: self.swizzle }),
            Major::MN => {
                let whole_lines = (2 * mn).is_multiple_of(self.swizzle.line_bytes());
                let swizzle = if whole_lines { self.swizzle } else { Swizzle::None };
                OperandTile::MN(MnMajorTile { mn, k, elem_bytes: 2, swizzle })
            }
        };
        let a = tile(64, self.a_major);
        (a, tile(self.n, self.b_major), a.bytes())
    }
}

/// Thread `t`'s address in tensor `name`, `stride` bytes per thread.
fn per_thread_global(p: &mut P, t: Reg, name: &str, stride: i64) -> Reg {
    let base = p.reg(RegClass::B64);
    p.op(Op::LdParam { ty: Ty::U64, d: base, name: format!("p_{name}") });
    let off = p.reg(RegClass::B64);
    p.op(Op::MulWide { ty: Ty::U32, d: off, a: Src::Reg(t), b: Src::Imm(stride) });
    let a = p.reg(RegClass::B64);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::S64, d: a, a: Src::Reg(base), b: Src::Reg(off) });
    a
}

/// A warpgroup's `m64nNk16` product through `wgmma`, as named steps: copy the tile image
/// (already in the swizzled layout) into shared memory, fence it for the async proxy, set the
/// accumulator to 1, fence the registers, chain `steps` `wgmma`s (K-step `i % steps_per_tile`),
/// commit, wait, and store each thread's accumulator registers.
fn wgmma_program(case: WgmmaCase, fault: WgmmaFault) -> ThreadProgram {
    let WgmmaCase { n, a_from_registers, steps, .. } = case;
    let (a_tile, b_tile, b_base) = case.tiles();
    let image = a_tile.bytes() + b_tile.bytes();
    let mut p = P::new();
    let t = tid(&mut p);
    // Copy the image, 16 bytes per thread per round.
    let src = per_thread_global(&mut p, t, "tiles", 16);
    let smem = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: smem });
    let dst = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: dst, a: Src::Reg(t), b: Src::Imm(16), c: Src::Reg(smem) });
    let chunk: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
    for round in 0..image.div_ceil(2048) {
        let offset = i64::from(round * 2048);
        let load = Op::Ld { space: Space::Global, ty: Ty::U32, d: chunk.clone(), addr: src, offset };
        let vals = chunk.iter().map(|r| Src::Reg(*r)).collect();
        let store = Op::St { space: Space::Shared, ty: Ty::U32, addr: dst, offset, vals };
        let rest = (image - round * 2048) / 16;
        if rest >= 128 {
            p.op(load);
            p.op(store);
        } else {
            let q = p.reg(RegClass::Pred);
            p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(i64::from(rest)) });
            p.guarded(q, load);
            p.guarded(q, store);
        }
    }
    if !matches!(fault, WgmmaFault::NoProxyFence | WgmmaFault::ProxyFenceAfterBarrier) {
        p.op(Op::FenceProxyAsync);
    }
    p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    if fault == WgmmaFault::ProxyFenceAfterBarrier {
        p.op(Op::FenceProxyAsync);
    }
    // Operands: descriptors per K-step from the parameters (each tile's offset in shared memory
    // in the start field) plus the shared base, A's fragment from its tensor.
    let steps_per_tile = a_tile.k() / 16;
    let base_field = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Shr, ty: Ty::U32, d: base_field, a: Src::Reg(smem), b: Src::Imm(4) });
    let base_field64 = p.reg(RegClass::B64);
    p.op(Op::Cvt { dty: Ty::U64, sty: Ty::U32, d: base_field64, a: Src::Reg(base_field) });
    let descriptor = |p: &mut P, name: String| {
        let offset = p.reg(RegClass::B64);
        p.op(Op::LdParam { ty: Ty::U64, d: offset, name });
        let d = p.reg(RegClass::B64);
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::U64, d, a: Src::Reg(offset), b: Src::Reg(base_field64) });
        d
    };
    let a_desc: Vec<Reg> = (0..steps_per_tile).map(|s| descriptor(&mut p, format!("p_a_desc{s}"))).collect();
    let b_desc: Vec<Reg> = (0..steps_per_tile).map(|s| descriptor(&mut p, format!("p_b_desc{s}"))).collect();
    let a_frag = [(); 4].map(|_| p.reg(RegClass::B32));
    if a_from_registers {
        let at = per_thread_global(&mut p, t, "a_frag", 16);
        p.op(Op::Ld { space: Space::Global, ty: Ty::U32, d: a_frag.to_vec(), addr: at, offset: 0 });
    }
    let acc: Vec<Reg> = (0..n / 2).map(|_| p.reg(RegClass::F32)).collect();
    for r in &acc {
        p.op(Op::Mov { ty: Ty::F32, d: *r, a: Src::F32(1.0) });
    }
    let accumulate = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: accumulate, a: Src::Reg(t), b: Src::Imm(0) });
    if fault != WgmmaFault::NoRegisterFence {
        p.op(Op::WgmmaFence);
    }
    if fault == WgmmaFault::AccumulatorWrittenAfterFence {
        p.op(Op::Mov { ty: Ty::F32, d: acc[0], a: Src::F32(2.0) });
    }
    if fault == WgmmaFault::AccumulatorReadAfterFence {
        let copy = p.reg(RegClass::F32);
        p.op(Op::Mov { ty: Ty::F32, d: copy, a: Src::Reg(acc[1]) });
    }
    for i in 0..steps {
        let step = (i % steps_per_tile) as usize;
        let a = if a_from_registers {
            WgmmaA::Registers(a_frag)
        } else {
            WgmmaA::Shared(SharedOperand { desc: a_desc[step], major: case.a_major })
        };
        let b = SharedOperand { desc: b_desc[step], major: case.b_major };
        p.op(Op::Wgmma { ab: Ty::BF16, n, d: acc.clone(), a, b, accumulate });
    }
    p.op(Op::WgmmaCommit);
    if fault == WgmmaFault::SharedWriteWhilePending {
        // Each of these threads rewrites a chunk of B it copied itself: no race, but the wgmma
        // still reads it.
        let q = p.reg(RegClass::Pred);
        p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(i64::from(b_tile.bytes() / 16)) });
        let vals = chunk.iter().map(|r| Src::Reg(*r)).collect();
        p.guarded(q, Op::St { space: Space::Shared, ty: Ty::U32, addr: dst, offset: i64::from(b_base), vals });
    }
    if fault == WgmmaFault::ExitPending {
        p.op(Op::Ret);
    }
    let out = per_thread_global(&mut p, t, "out", 4 * i64::from(n / 2));
    let store = |p: &mut P| {
        for (half, regs) in acc.chunks(4).enumerate() {
            let vals = regs.iter().map(|r| Src::Reg(*r)).collect();
            p.op(Op::St { space: Space::Global, ty: Ty::F32, addr: out, offset: 16 * half as i64, vals });
        }
    };
    if fault == WgmmaFault::ReadBeforeWait {
        store(&mut p);
    }
    p.op(Op::WgmmaWait { n: 0 });
    store(&mut p);
    p.op(Op::Ret);
    let mut params: Vec<(String, Ty)> =
        vec![("p_tiles".into(), Ty::U64), ("p_a_frag".into(), Ty::U64), ("p_out".into(), Ty::U64)];
    for s in 0..steps_per_tile {
        params.push((format!("p_a_desc{s}"), Ty::U64));
        params.push((format!("p_b_desc{s}"), Ty::U64));
    }
    p.prog(128, image, params)
}

/// Small exact bf16 values: products and their sums stay exact in f32.
fn small_bf16(i: u32) -> f32 {
    ((i * 7 + 3) % 9) as f32 / 4.0 - 1.0
}

/// Runs [`wgmma_program`] on A (64 x k) and B (n x k) of [`small_bf16`] values and returns each
/// (row, column) of the product with the f64 reference, `1 + Σ_i A_i B_iᵀ` over the chained
/// K-steps.
fn run_wgmma(case: WgmmaCase, fault: WgmmaFault) -> Result<Vec<(f32, f64)>, String> {
    let WgmmaCase { n, steps, .. } = case;
    let (a_tile, b_tile, b_base) = case.tiles();
    let a = |m: u32, k: u32| small_bf16(m * 131 + k);
    let b = |n: u32, k: u32| small_bf16(n * 71 + k * 5 + 1);
    let mut image = vec![0u8; (a_tile.bytes() + b_tile.bytes()) as usize];
    let bf16 = |x: f32| ((x.to_bits() >> 16) as u16).to_le_bytes();
    for (tile, base, rows, value) in [(a_tile, 0, 64, &a as &dyn Fn(u32, u32) -> f32), (b_tile, b_base, n, &b)] {
        for row in 0..rows {
            for k in 0..tile.k() {
                let at = tile.address(base, row, k) as usize;
                image[at..at + 2].copy_from_slice(&bf16(value(row, k)));
            }
        }
    }
    let mut a_frag = vec![0u8; 128 * 16];
    for thread in 0..128 {
        for v in 0..8 {
            let (m, k) = WgmmaFragment::RegisterA.coord(thread, v);
            let at = (thread * 16 + v * 2) as usize;
            a_frag[at..at + 2].copy_from_slice(&bf16(a(m, k)));
        }
    }
    let mut args = vec![
        ("tiles".to_string(), SimArg::Tensor(image)),
        ("a_frag".to_string(), SimArg::Tensor(a_frag)),
        ("out".to_string(), SimArg::Tensor(vec![0; 128 * 4 * n as usize / 2])),
    ];
    let steps_per_tile = a_tile.k() / 16;
    for s in 0..steps_per_tile {
        args.push((format!("a_desc{s}"), SimArg::I64(a_tile.descriptor(0, s).encode() as i64)));
        args.push((format!("b_desc{s}"), SimArg::I64(b_tile.descriptor(b_base, s).encode() as i64)));
    }
    run(&wgmma_program(case, fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    let SimArg::Tensor(out) = &args[2].1 else { unreachable!() };
    let acc = WgmmaFragment::Accumulator { n };
    let mut got = vec![];
    for thread in 0..128 {
        for v in 0..acc.values_per_thread() {
            let (m, col) = acc.coord(thread, v);
            let at = ((thread * n / 2 + v) * 4) as usize;
            let value = f32::from_le_bytes(out[at..at + 4].try_into().expect("4 bytes"));
            let reference = 1.0
                + (0..steps)
                    .map(|i| {
                        let k0 = 16 * (i % steps_per_tile);
                        (k0..k0 + 16).map(|k| f64::from(a(m, k)) * f64::from(b(col, k))).sum::<f64>()
                    })
                    .sum::<f64>();
            got.push((value, reference));
        }
    }
    Ok(got)
}

#[test]
fn wgmma_multiplies_through_each_swizzles_descriptors() {
    for swizzle in Swizzle::ALL {
        // Every K-step of the line, chained onto one accumulator, and at least two.
        let steps = (WgmmaCase::shared_a(swizzle).tiles().0.k() / 16).max(2);
        let case = WgmmaCase { steps, ..WgmmaCase::shared_a(swizzle) };
        for (value, reference) in run_wgmma(case, WgmmaFault::None).expect("runs") {
            assert_eq!(f64::from(value), reference, "{case:?}");
        }
    }
}

#[test]
fn wgmma_takes_a_from_registers() {
    let case = WgmmaCase { a_from_registers: true, ..WgmmaCase::shared_a(Swizzle::B32) };
    for (value, reference) in run_wgmma(case, WgmmaFault::None).expect("runs") {
        assert_eq!(f64::from(value), reference);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Every N the instruction has (8 to 256), each swizzle, each operand K- or MN-major, A
    /// from shared memory or registers (one K-step of a 32-byte line): the product equals the
    /// reference.
    #[test]
    fn wgmma_multiplies_at_every_n(
        blocks in 1u32..=32,
        swizzle in proptest::sample::select(Swizzle::ALL.to_vec()),
        a_from_registers: bool,
        a_mn_major: bool,
        b_mn_major: bool,
    ) {
        let swizzle = if a_from_registers { Swizzle::B32 } else { swizzle };
        let major = |mn: bool| if mn { Major::MN } else { Major::K };
        let (a_major, b_major) = (major(a_mn_major), major(b_mn_major));
        let case = WgmmaCase { swizzle, n: 8 * blocks, a_from_registers, a_major, b_major, steps: 2 };
        for (value, reference) in run_wgmma(case, WgmmaFault::None).expect("runs") {
            proptest::prop_assert_eq!(f64::from(value), reference, "{:?}", case);
        }
    }
}

#[test]
fn wgmma_misuse_is_reported() {
    for (fault, expected) in [
        (WgmmaFault::NoRegisterFence, "no wgmma.fence before it"),
        (WgmmaFault::AccumulatorWrittenAfterFence, "register %f0 was read or written after the last wgmma.fence"),
        (WgmmaFault::AccumulatorReadAfterFence, "register %f1 was read or written after the last wgmma.fence"),
        (WgmmaFault::NoProxyFence, "no fence.proxy.async after the write"),
        (WgmmaFault::ReadBeforeWait, "touches register %f0 while a wgmma that owns it is pending"),
        (WgmmaFault::SharedWriteWhilePending, "while a pending wgmma reads it"),
        (WgmmaFault::ExitPending, "exits with wgmma results pending"),
        (WgmmaFault::ProxyFenceAfterBarrier, "no barrier orders thread 1's fence.proxy.async before it"),
    ] {
        let e = run_wgmma(WgmmaCase::shared_a(Swizzle::B128), fault).expect_err("a planted fault");
        assert!(e.contains(expected), "{fault:?}: {e}");
    }
}

/// What a producer/consumer ring test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RingFault {
    None,
    NoBarrierAfterInit,
    ConsumerSkipsFullWait,
    MissingArrival,
    StoreToBarrier,
    WaitWithoutLoop,
}

/// Rounds through the ring's one slot.
const RING_ROUNDS: u32 = 3;

/// Waits for the phase of `parity` of the mbarrier at `addr`: `try_wait` until it says so.
fn wait_phase(p: &mut P, addr: Reg, parity: u32, label: &mut u32) {
    let (top, done) = (*label, *label + 1);
    *label += 2;
    let ready = p.reg(RegClass::Pred);
    p.op(Op::Label(top));
    p.op(Op::MbarrierTryWait { d: ready, addr, parity: Src::Imm(i64::from(parity)) });
    p.guarded(ready, Op::Bra { target: done });
    p.op(Op::Bra { target: top });
    p.op(Op::Label(done));
}

/// The registers of a one-slot ring: its `full` and `empty` mbarriers, this lane's word of the
/// slot, an arrival's state and the value moved.
struct Ring {
    full: Reg,
    empty: Reg,
    lane: Reg,
    slot: Reg,
    state: Reg,
    value: Reg,
}

/// Thread 0 initializes the ring's `full` and `empty` mbarriers (at the shared base and 8 bytes
/// on) with these arrival counts; a block barrier orders that before their use (unless
/// `barrier_after_init` is false); each thread finds its lane's word of the slot (16 bytes on).
fn ring_setup(p: &mut P, t: Reg, full_count: u32, empty_count: u32, barrier_after_init: bool) -> Ring {
    let full = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: full });
    let empty = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: empty, a: Src::Reg(full), b: Src::Imm(8) });
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    p.guarded(first, Op::MbarrierInit { addr: full, count: full_count });
    p.guarded(first, Op::MbarrierInit { addr: empty, count: empty_count });
    if barrier_after_init {
        p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    }
    let lane = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: lane, a: Src::Reg(t), b: Src::Imm(31) });
    let slot = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: slot, a: Src::Reg(lane), b: Src::Imm(4), c: Src::Reg(full) });
    let (state, value) = (p.reg(RegClass::B64), p.reg(RegClass::B32));
    Ring { full, empty, lane, slot, state, value }
}

/// Warp 0 produces [`RING_ROUNDS`] rounds: wait for `empty` (the first wait passes: the phase
/// before the first has parity 1), write `100 round + lane` and arrive on `full`; every other
/// thread branches to `consumer`.
fn produce(p: &mut P, t: Reg, ring: &Ring, consumer: u32, label: &mut u32) {
    let is_consumer = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: is_consumer, a: Src::Reg(t), b: Src::Imm(32) });
    p.guarded(is_consumer, Op::Bra { target: consumer });
    for round in 0..RING_ROUNDS {
        wait_phase(p, ring.empty, (round + 1) % 2, label);
        let value = Op::Mad {
            ty: Ty::U32,
            d: ring.value,
            a: Src::Imm(i64::from(round)),
            b: Src::Imm(100),
            c: Src::Reg(ring.lane),
        };
        p.op(value);
        p.op(Op::St {
            space: Space::Shared,
            ty: Ty::U32,
            addr: ring.slot,
            offset: 16,
            vals: vec![Src::Reg(ring.value)],
        });
        p.op(Op::MbarrierArrive { state: ring.state, addr: ring.full });
    }
}

/// A producer warp hands [`RING_ROUNDS`] values per lane to a consumer warp through one
/// shared slot, with a `full` and an `empty` mbarrier (32 arrivals a phase): the producer
/// waits for `empty`, writes and arrives on `full`; the consumer waits for `full`, copies the
/// slot out and arrives on `empty`.
fn ring_program(fault: RingFault) -> ThreadProgram {
    let mut p = P::new();
    let mut label = 0;
    let t = tid(&mut p);
    let full_count = if fault == RingFault::MissingArrival { 33 } else { 32 };
    let ring = ring_setup(&mut p, t, full_count, 32, fault != RingFault::NoBarrierAfterInit);
    let Ring { full, empty, lane, slot, state, value } = ring;
    let (consumer, end) = (1000, 1001);
    produce(&mut p, t, &ring, consumer, &mut label);
    if fault == RingFault::StoreToBarrier {
        p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: full, offset: 0, vals: vec![Src::Imm(0)] });
    }
    p.op(Op::Bra { target: end });
    p.op(Op::Label(consumer));
    let out = per_thread_global(&mut p, lane, "out", 4);
    for round in 0..RING_ROUNDS {
        match fault {
            RingFault::ConsumerSkipsFullWait => {}
            RingFault::WaitWithoutLoop => {
                let ready = p.reg(RegClass::Pred);
                p.op(Op::MbarrierTryWait { d: ready, addr: full, parity: Src::Imm(i64::from(round % 2)) });
            }
            _ => wait_phase(&mut p, full, round % 2, &mut label),
        }
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![value], addr: slot, offset: 16 });
        let offset = i64::from(round * 32 * 4);
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals: vec![Src::Reg(value)] });
        p.op(Op::MbarrierArrive { state, addr: empty });
    }
    p.op(Op::Label(end));
    p.op(Op::Ret);
    p.prog(64, 16 + 32 * 4, vec![("p_out".into(), Ty::U64)])
}

fn run_ring(fault: RingFault) -> Result<Vec<u32>, String> {
    let mut args = vec![("out".to_string(), SimArg::Tensor(vec![0; (RING_ROUNDS * 32 * 4) as usize]))];
    run(&ring_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    let SimArg::Tensor(out) = &args[0].1 else { unreachable!() };
    Ok(out.chunks(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes"))).collect())
}

#[test]
fn an_mbarrier_ring_hands_values_from_producer_to_consumer() {
    let out = run_ring(RingFault::None).expect("runs");
    for round in 0..RING_ROUNDS {
        for lane in 0..32 {
            assert_eq!(out[(round * 32 + lane) as usize], round * 100 + lane, "round {round}, lane {lane}");
        }
    }
}

#[test]
fn mbarrier_misuse_is_reported() {
    for (fault, expected) in [
        (RingFault::NoBarrierAfterInit, "with no barrier after thread 0 initialized it"),
        (RingFault::ConsumerSkipsFullWait, "race: shared byte 16 written by thread 0 and read by thread 32"),
        (RingFault::MissingArrival, "arrival(s) short, which never come"),
        (RingFault::StoreToBarrier, "belongs to an mbarrier"),
        (RingFault::WaitWithoutLoop, "race: shared byte 16 written by thread 0 and read by thread 32"),
    ] {
        let e = run_ring(fault).expect_err("a planted fault");
        assert!(e.contains(expected), "{fault:?}: {e}");
    }
}

/// The Hopper programs the simulator runs are PTX that ptxas takes (the `wgmma` ones for
/// sm_90a, the mbarrier ring and the TMA copy for sm_90), and their SASS has the Hopper
/// instructions: `HGMMA` (not `HMMA`), `UTMALDG`, the mbarrier's `SYNCS`, `USETMAXREG` (and
/// ptxas does not ignore the `setmaxnreg`s: no warning C7508). ptxas from
/// `KDA_PTXAS`, cuobjdump from `KDA_CUOBJDUMP` (`.ci/run` sets both); skipped with a line saying
/// so without them, failed when `KDA_REQUIRE_PTXAS` is set.
#[test]
fn hopper_programs_assemble() {
    let required = std::env::var_os("KDA_REQUIRE_PTXAS").is_some();
    let Some(ptxas) = std::env::var_os("KDA_PTXAS") else {
        assert!(!required, "KDA_REQUIRE_PTXAS is set but KDA_PTXAS is not");
        println!("skipped: set KDA_PTXAS to assemble the Hopper programs");
        return;
    };
    let cuobjdump = std::env::var_os("KDA_CUOBJDUMP");
    if cuobjdump.is_none() {
        assert!(!required, "KDA_REQUIRE_PTXAS is set but KDA_CUOBJDUMP is not");
        println!("SASS not checked: set KDA_CUOBJDUMP (with nvdisasm on the PATH)");
    }
    let dir = std::env::temp_dir().join(format!("kda-hopper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let programs = [
        (
            "shared_a",
            wgmma_program(WgmmaCase::shared_a(Swizzle::B128), WgmmaFault::None),
            Target::Sm90a,
            "HGMMA.64x16x16.F32.BF16",
        ),
        (
            "register_a",
            wgmma_program(WgmmaCase { a_from_registers: true, ..WgmmaCase::shared_a(Swizzle::B32) }, WgmmaFault::None),
            Target::Sm90a,
            "HGMMA.64x16x16.F32.BF16",
        ),
        (
            "mn_major",
            wgmma_program(
                WgmmaCase { n: 64, a_major: Major::MN, b_major: Major::MN, ..WgmmaCase::shared_a(Swizzle::B128) },
                WgmmaFault::None,
            ),
            Target::Sm90a,
            ".tnspA.tnspB",
        ),
        ("ring", ring_program(RingFault::None), Target::Sm90, "SYNCS.PHASECHK.TRANS64.TRYWAIT"),
        ("tma", tma_program(TmaFault::None), Target::Sm90, "UTMALDG.2D"),
        ("roles", roles_program(RolesFault::None), Target::Sm90a, "USETMAXREG"),
    ];
    for (name, prog, target, sass_op) in programs {
        let src = dir.join(format!("{name}.ptx"));
        std::fs::write(&src, kda_dsl::ptx::print_module(&prog, target)).expect("write ptx");
        let out = std::process::Command::new(&ptxas)
            .arg(format!("-arch={target}"))
            .arg("-o")
            .arg(src.with_extension("cubin"))
            .arg(&src)
            .output()
            .expect("run ptxas");
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        // C7508: ptxas ignored a setmaxnreg.
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!log.contains("C7508"), "{name}: {log}");
        if let Some(cuobjdump) = &cuobjdump {
            let out = std::process::Command::new(cuobjdump)
                .arg("-sass")
                .arg(src.with_extension("cubin"))
                .output()
                .expect("run cuobjdump");
            let sass = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{name}: cuobjdump: {}", String::from_utf8_lossy(&out.stderr));
            assert!(sass.contains(sass_op), "{name}: no {sass_op} in the SASS:\n{sass}");
            assert!(!sass.contains(" HMMA"), "{name}: an sm_80 HMMA in the SASS:\n{sass}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a TMA test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TmaFault {
    None,
    NoWait,
    ArriveWithoutExpectTx,
    MisalignedBox,
    ExpectTxTooHigh,
    ExpectTxTooLow,
}

/// The TMA tests' map: a 100 x 20 bf16 tensor (rows padded to 208 bytes) in boxes of 64 x 16,
/// 128-byte swizzled.
const TMA_MAP: TensorMap2d =
    TensorMap2d { elem_bytes: 2, extent: [100, 20], row_stride: 208, box_extent: [64, 16], swizzle: Swizzle::B128 };

/// Thread 0 copies the box at (`x`, `y`) into shared memory with TMA, completing on an
/// mbarrier it expects the box's bytes on; every thread waits for the phase and copies
/// 16-byte chunks of the shared box out.
fn tma_program(fault: TmaFault) -> ThreadProgram {
    let box_bytes = TMA_MAP.box_bytes();
    let box_offset = if fault == TmaFault::MisalignedBox { 128 } else { 0 };
    let mut p = P::new();
    let mut label = 0;
    let t = tid(&mut p);
    let smem = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: smem });
    let mbar = p.reg(RegClass::B32);
    p.op(Op::Bin {
        op: BinKind::Add,
        ty: Ty::U32,
        d: mbar,
        a: Src::Reg(smem),
        b: Src::Imm(i64::from(box_bytes + 128)),
    });
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    p.guarded(first, Op::MbarrierInit { addr: mbar, count: 1 });
    p.op(Op::Bar { id: 0, count: None, reach: BarrierReach::SameInstruction });
    let param = p.reg(RegClass::B64);
    p.op(Op::ParamAddress { d: param, name: "p_map".into() });
    let map = p.reg(RegClass::B64);
    p.op(Op::CvtaParam { d: map, a: param });
    let [x, y] = ["p_x", "p_y"].map(|name| {
        let r = p.reg(RegClass::B32);
        p.op(Op::LdParam { ty: Ty::S32, d: r, name: name.into() });
        r
    });
    let state = p.reg(RegClass::B64);
    if fault == TmaFault::ArriveWithoutExpectTx {
        p.guarded(first, Op::MbarrierArrive { state, addr: mbar });
    } else {
        let bytes = match fault {
            TmaFault::ExpectTxTooHigh => box_bytes + 16,
            TmaFault::ExpectTxTooLow => box_bytes - 16,
            _ => box_bytes,
        };
        p.guarded(first, Op::MbarrierArriveExpectTx { state, addr: mbar, bytes });
    }
    let dst = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: dst, a: Src::Reg(smem), b: Src::Imm(box_offset) });
    p.guarded(first, Op::TmaLoad2d { dst, map, x, y, mbar });
    if fault != TmaFault::NoWait {
        wait_phase(&mut p, mbar, 0, &mut label);
    }
    let from = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: from, a: Src::Reg(t), b: Src::Imm(16), c: Src::Reg(dst) });
    let out = per_thread_global(&mut p, t, "out", 16);
    let chunk: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
    for round in 0..box_bytes / (64 * 16) {
        let offset = i64::from(round * 64 * 16);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: chunk.clone(), addr: from, offset });
        let vals = chunk.iter().map(|r| Src::Reg(*r)).collect();
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals });
    }
    p.op(Op::Ret);
    let scalars = [("p_out", Ty::U64), ("p_x", Ty::S32), ("p_y", Ty::S32)];
    let mut prog = p.prog(64, box_bytes + 256, scalars.map(|(n, ty)| (n.to_string(), ty)).to_vec());
    prog.params.push(("p_map".into(), ParamKind::TensorMap));
    prog
}

/// Runs [`tma_program`] on a tensor of distinct values; returns the shared box's bytes as
/// copied out and the bytes TMA should have put there.
fn run_tma(fault: TmaFault, at: [i32; 2]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let m = TMA_MAP;
    let value = |x: u64, y: u64| (1 + x + 1000 * y) as u16;
    let mut tensor = vec![0u8; (m.row_stride * m.extent[1]) as usize];
    for y in 0..m.extent[1] {
        for x in 0..m.extent[0] {
            let at = (y * m.row_stride + 2 * x) as usize;
            tensor[at..at + 2].copy_from_slice(&value(x, y).to_le_bytes());
        }
    }
    let mut expected = vec![0u8; m.box_bytes() as usize];
    for outer in 0..m.box_extent[1] {
        for inner in 0..m.box_extent[0] {
            let (gx, gy) = (i64::from(at[0]) + i64::from(inner), i64::from(at[1]) + i64::from(outer));
            let inside = (0..m.extent[0] as i64).contains(&gx) && (0..m.extent[1] as i64).contains(&gy);
            let v = if inside { value(gx as u64, gy as u64) } else { 0 };
            let to = m.shared_offset(inner, outer) as usize;
            expected[to..to + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    let mut args = vec![
        ("out".to_string(), SimArg::Tensor(vec![0xee; m.box_bytes() as usize])),
        ("x".to_string(), SimArg::I32(at[0])),
        ("y".to_string(), SimArg::I32(at[1])),
        ("t".to_string(), SimArg::Tensor(tensor)),
        ("map".to_string(), SimArg::TensorMap { tensor: "t".into(), map: m }),
    ];
    run(&tma_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    let SimArg::Tensor(out) = &args[0].1 else { unreachable!() };
    Ok((out.clone(), expected))
}

#[test]
fn tma_copies_a_swizzled_box_zero_filling_outside_the_tensor() {
    for at in [[0, 0], [36, 4], [60, -3], [-10, 15]] {
        let (got, expected) = run_tma(TmaFault::None, at).expect("runs");
        assert!(got == expected, "box at {at:?}: the shared image differs");
    }
}

#[test]
fn tma_misuse_is_reported() {
    for (fault, expected) in [
        (TmaFault::NoWait, "race: shared byte"),
        (TmaFault::ArriveWithoutExpectTx, "race: shared byte"),
        (TmaFault::MisalignedBox, "must start on a 1024-byte boundary"),
        (TmaFault::ExpectTxTooHigh, "whose copies delivered 16 bytes fewer than its expect_tx"),
        (TmaFault::ExpectTxTooLow, "whose copies delivered 16 bytes more than its expect_tx"),
    ] {
        let e = run_tma(fault, [0, 0]).expect_err("a planted fault");
        assert!(e.contains(expected), "{fault:?}: {e}");
    }
}

/// What a register-roles test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RolesFault {
    None,
    NoRegisterCap,
    Overcommit,
    CountNotMultipleOf8,
}

/// Three warpgroups under `.maxnreg 168`: the producer (warpgroup 0) returns registers down to
/// 40, the two consumers raise theirs to 232 (40 + 232 + 232 = 3 x 168), each role one branch.
fn roles_program(fault: RolesFault) -> ThreadProgram {
    let (producer, consumer) = match fault {
        RolesFault::Overcommit => (40, 240),
        RolesFault::CountNotMultipleOf8 => (36, 232),
        _ => (40, 232),
    };
    let mut p = P::new();
    let t = tid(&mut p);
    let group = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Shr, ty: Ty::U32, d: group, a: Src::Reg(t), b: Src::Imm(7) });
    let is_consumer = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ne, ty: Ty::S32, d: is_consumer, a: Src::Reg(group), b: Src::Imm(0) });
    p.guarded(is_consumer, Op::Bra { target: 0 });
    p.op(Op::SetMaxNReg { raise: false, count: producer });
    p.op(Op::Bra { target: 1 });
    p.op(Op::Label(0));
    p.op(Op::SetMaxNReg { raise: true, count: consumer });
    p.op(Op::Label(1));
    p.op(Op::Ret);
    let mut prog = p.prog(384, 0, vec![]);
    prog.max_registers = (fault != RolesFault::NoRegisterCap).then_some(168);
    prog
}

#[test]
fn warpgroups_trade_registers_within_the_cap() {
    run(&roles_program(RolesFault::None), [1, 1, 1], &mut []).expect("runs");
    for (fault, expected) in [
        (RolesFault::NoRegisterCap, "no .maxnreg: ptxas ignores it"),
        (RolesFault::Overcommit, "deadlock"),
        (RolesFault::CountNotMultipleOf8, "setmaxnreg 36: expected a multiple of 8 from 24 to 256"),
    ] {
        let e = err_of(&roles_program(fault), &mut []);
        assert!(e.contains(expected), "{fault:?}: {e}");
    }
}

/// Warp 0 hands [`RING_ROUNDS`] values per lane to consumer warps 1 and 2 through one slot:
/// both read it, meet at a named barrier (with `named_barrier`), and one elected thread
/// (thread 32) returns the slot with the only arrival on `empty`. Warp 2's reads reach the
/// producer's next write only through the named barrier and then the arrival.
fn elected_ring_program(named_barrier: bool) -> ThreadProgram {
    let mut p = P::new();
    let mut label = 0;
    let t = tid(&mut p);
    let ring = ring_setup(&mut p, t, 32, 1, true);
    let Ring { full, empty, slot, state, value, .. } = ring;
    let (consumer, end) = (1000, 1001);
    produce(&mut p, t, &ring, consumer, &mut label);
    p.op(Op::Bra { target: end });
    p.op(Op::Label(consumer));
    let elected = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: elected, a: Src::Reg(t), b: Src::Imm(32) });
    for round in 0..RING_ROUNDS {
        wait_phase(&mut p, full, round % 2, &mut label);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![value], addr: slot, offset: 16 });
        if named_barrier {
            p.op(Op::Bar { id: 1, count: Some(64), reach: BarrierReach::SameInstruction });
        }
        p.guarded(elected, Op::MbarrierArrive { state, addr: empty });
    }
    p.op(Op::Label(end));
    p.op(Op::Ret);
    p.prog(96, 16 + 32 * 4, vec![])
}

#[test]
fn an_elected_arrival_releases_what_a_barrier_ordered_before_it() {
    run(&elected_ring_program(true), [1, 1, 1], &mut []).expect("ordered through the named barrier and the arrival");
    let e = err_of(&elected_ring_program(false), &mut []);
    assert!(e.contains("race: shared byte 16 read by") && e.contains("written by thread 0"), "{e}");
}

/// Thread 64 (warp 2) writes a word, meets warp 1 at named barrier 1, warp 1 meets warp 0 at
/// named barrier 2, and thread 0 reads the word: ordered through warp 1 (order is transitive).
/// With `chain` false warp 1 skips barrier 1, and the read races.
fn barrier_chain(chain: bool) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let a = shared_at(&mut p, 0);
    let warp = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Shr, ty: Ty::U32, d: warp, a: Src::Reg(t), b: Src::Imm(5) });
    let writer = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: writer, a: Src::Reg(t), b: Src::Imm(64) });
    p.guarded(writer, Op::St { space: Space::Shared, ty: Ty::U32, addr: a, offset: 0, vals: vec![Src::Imm(7)] });
    // Warps 1 and 2 (or, without the chain, warp 2 alone with a count of 32) meet first.
    let in_first = p.reg(RegClass::Pred);
    let first_from = if chain { 1 } else { 2 };
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: in_first, a: Src::Reg(warp), b: Src::Imm(first_from) });
    let count = if chain { 64 } else { 32 };
    p.guarded(in_first, Op::Bar { id: 1, count: Some(count), reach: BarrierReach::AnyInstruction });
    let in_second = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Le, ty: Ty::S32, d: in_second, a: Src::Reg(warp), b: Src::Imm(1) });
    p.guarded(in_second, Op::Bar { id: 2, count: Some(64), reach: BarrierReach::AnyInstruction });
    let reader = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: reader, a: Src::Reg(t), b: Src::Imm(0) });
    let v = p.reg(RegClass::B32);
    p.guarded(reader, Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: a, offset: 0 });
    p.op(Op::Ret);
    p.prog(96, 16, vec![])
}

#[test]
fn barriers_order_transitively() {
    run(&barrier_chain(true), [1, 1, 1], &mut []).expect("ordered through warp 1");
    let e = err_of(&barrier_chain(false), &mut []);
    assert!(e.contains("race") && e.contains("written by thread 64 and read by thread 0"), "{e}");
}
