//! Thread programs whose blocks order each other through flags in global memory
//! (`st.release.gpu` / `red.release.gpu.add`, `ld.acquire.gpu`), each with the faults a test
//! can plant, and their arguments. Shared by the simulator's tests (`tests/simulator.rs`) and
//! the GPU test that runs them against the simulator (`kda-runtime/tests/gpu_hopper.rs`).

use super::hopper_programs::{per_thread_global, tid, P};
use kda_dsl::sim::{run, SimArg};
use kda_dsl::thread_ir::*;

/// Threads a block of the flag programs.
pub const FLAG_THREADS: u32 = 64;

/// A predicate: whether `a == b`.
fn equals(p: &mut P, a: Reg, b: Src) -> Reg {
    let d = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d, a: Src::Reg(a), b });
    d
}

/// The block's index along x.
fn block_x(p: &mut P) -> Reg {
    let b = p.reg(RegClass::B32);
    p.op(Op::ReadSpecial { d: b, sreg: Special::Ctaid(0) });
    b
}

/// The address of word `k` of tensor `name` (4-byte words), the same for every thread.
fn word_at(p: &mut P, name: &str, k: i64) -> Reg {
    let index = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: index, a: Src::Imm(k) });
    per_thread_global(p, index, name, 4)
}

/// The start of the chain and count programs: the thread's index, the block's, the
/// `p_blocks` parameter, and whether the thread is thread 0.
fn grid_place(p: &mut P) -> (Reg, Reg, Reg, Reg) {
    let t = tid(p);
    let b = block_x(p);
    let blocks = p.reg(RegClass::B32);
    p.op(Op::LdParam { ty: Ty::S32, d: blocks, name: "p_blocks".into() });
    let first = equals(p, t, Src::Imm(0));
    (t, b, blocks, first)
}

/// How a block tells the next that its words are written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlagKind {
    /// `st.release` of 1 on the block's own flag word.
    Store,
    /// `red.release.add` of 1 on the block's own flag word.
    Add,
}

/// What [`flag_chain_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlagFault {
    None,
    /// Thread 0 releases the flag before the block writes its words.
    ReleaseBeforeWrites,
    /// No barrier between the block's writes and thread 0's release.
    NoBarrierBeforeRelease,
    /// The flag is set with a plain `st.global`, which releases nothing.
    PlainFlagStore,
    /// The last block never sets its flag.
    FlagNeverSet,
    /// The waiting block reads the next block's words before it polls the flag.
    ReadsBeforePoll,
}

/// A chain through the grid, against the order the simulator runs blocks in: block `b` waits
/// for block `b + 1`'s flag (the last block waits for none), then every thread `t` writes
/// `chain[b][t] = chain[b + 1][t] + 1000 (b + 1) + t` (the last block: `1000 B + t`), the block
/// meets at a barrier, and thread 0 sets the block's flag (`kind`). Thread 0 polls with
/// `ld.acquire` and the block meets at a barrier before reading the words.
pub fn flag_chain_program(kind: FlagKind, fault: FlagFault) -> ThreadProgram {
    let mut p = P::new();
    let (t, b, blocks, first) = grid_place(&mut p);
    let next = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: next, a: Src::Reg(b), b: Src::Imm(1) });
    let my_flag = per_thread_global(&mut p, b, "flags", 4);
    let next_flag = per_thread_global(&mut p, next, "flags", 4);
    let row = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: row, a: Src::Reg(b), b: Src::Imm(i64::from(FLAG_THREADS)), c: Src::Reg(t) });
    let mine = per_thread_global(&mut p, row, "chain", 4);
    // The last block's `chain[b + 1]` would be past the tensor: it reads nothing.
    let last = equals(&mut p, next, Src::Reg(blocks));
    let prev = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: prev, a: Src::Imm(0) });
    p.guarded(last, Op::Bra { target: 2 });
    let read_next = |p: &mut P| {
        p.op(Op::Ld {
            space: Space::Global,
            ty: Ty::U32,
            d: vec![prev],
            addr: mine,
            offset: i64::from(FLAG_THREADS * 4),
        })
    };
    if fault == FlagFault::ReadsBeforePoll {
        read_next(&mut p);
    }
    // Thread 0 polls the next block's flag; the others wait at the barrier.
    p.unless(first, Op::Bra { target: 1 });
    poll_until_set(&mut p, next_flag, 0);
    p.op(Op::Label(1));
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::AnyInstruction });
    if fault != FlagFault::ReadsBeforePoll {
        read_next(&mut p);
    }
    p.op(Op::Label(2));
    let release = |p: &mut P| match (kind, fault) {
        (_, FlagFault::PlainFlagStore) => p.guarded(
            first,
            Op::St { space: Space::Global, ty: Ty::U32, addr: my_flag, offset: 0, vals: vec![Src::Imm(1)] },
        ),
        (FlagKind::Store, _) => p.guarded(first, Op::StRelease { addr: my_flag, offset: 0, a: Src::Imm(1) }),
        (FlagKind::Add, _) => p.guarded(first, Op::RedReleaseAdd { addr: my_flag, offset: 0, a: Src::Imm(1) }),
    };
    if fault == FlagFault::ReleaseBeforeWrites {
        release(&mut p);
    }
    let own = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: own, a: Src::Reg(next), b: Src::Imm(1000), c: Src::Reg(t) });
    let value = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: value, a: Src::Reg(prev), b: Src::Reg(own) });
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: mine, offset: 0, vals: vec![Src::Reg(value)] });
    if fault != FlagFault::NoBarrierBeforeRelease {
        p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::AnyInstruction });
    }
    match fault {
        FlagFault::ReleaseBeforeWrites => {}
        FlagFault::FlagNeverSet => {
            let released = p.reg(RegClass::Pred);
            p.op(Op::PredLogic { op: BinKind::And, d: released, a: first, b: last });
            p.op(Op::PredLogic { op: BinKind::Xor, d: released, a: released, b: first });
            p.guarded(released, Op::StRelease { addr: my_flag, offset: 0, a: Src::Imm(1) });
        }
        _ => release(&mut p),
    }
    p.op(Op::Ret);
    let params = vec![("p_chain".into(), Ty::U64), ("p_flags".into(), Ty::U64), ("p_blocks".into(), Ty::S32)];
    p.prog(FLAG_THREADS, 0, params)
}

/// [`flag_chain_program`]'s arguments over `blocks` blocks: the words (poisoned), the flags
/// (zero, one a block), the count.
pub fn flag_chain_args(blocks: u32) -> Vec<(String, SimArg)> {
    vec![
        ("chain".to_string(), SimArg::Tensor(vec![0xee; (blocks * FLAG_THREADS * 4) as usize])),
        ("flags".to_string(), SimArg::Tensor(vec![0; (blocks * 4) as usize])),
        ("blocks".to_string(), SimArg::I32(blocks as i32)),
    ]
}

/// What [`flag_chain_program`] writes over `blocks` blocks: `chain[b][t] = sum over c >= b of
/// 1000 (c + 1) + t`.
pub fn flag_chain_expected(blocks: u32) -> Vec<u32> {
    (0..blocks).flat_map(|b| (0..FLAG_THREADS).map(move |t| (b..blocks).map(|c| 1000 * (c + 1) + t).sum())).collect()
}

/// Runs [`flag_chain_program`] over 4 blocks; the words it wrote.
pub fn run_flag_chain(kind: FlagKind, fault: FlagFault) -> Result<Vec<u32>, String> {
    const BLOCKS: u32 = 4;
    let mut args = flag_chain_args(BLOCKS);
    run(&flag_chain_program(kind, fault), [BLOCKS, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(words_of(&args, "chain"))
}

/// At label `top`, polls the flag word at `addr` with `ld.acquire` until it is not 0.
fn poll_until_set(p: &mut P, addr: Reg, top: u32) {
    let (flag, unset) = (p.reg(RegClass::B32), p.reg(RegClass::Pred));
    p.op(Op::Label(top));
    p.op(Op::LdAcquire { d: flag, addr, offset: 0 });
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: unset, a: Src::Reg(flag), b: Src::Imm(0) });
    p.guarded(unset, Op::Bra { target: top });
}

/// `i += 1`, then back to label `top` while `i < limit`.
fn count_up_to(p: &mut P, i: Reg, limit: Src, top: u32) {
    let more = p.reg(RegClass::Pred);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: i, a: Src::Reg(i), b: Src::Imm(1) });
    p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::U32, d: more, a: Src::Reg(i), b: limit });
    p.guarded(more, Op::Bra { target: top });
}

/// One block whose threads make `n` polls at one instruction, of word `i % words` at the `i`th
/// (every word already set by the host), then store how many they passed, a word a thread:
/// with nothing written between, each poll reads its word, and a word polled again (an outer
/// loop waiting for a flag it saw set) does not wait.
pub fn repeated_polls_program(n: i64, words: i64) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let (i, flag) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
    let unset = p.reg(RegClass::Pred);
    p.op(Op::Mov { ty: Ty::U32, d: i, a: Src::Imm(0) });
    p.op(Op::Label(0));
    let which = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Rem, ty: Ty::U32, d: which, a: Src::Reg(i), b: Src::Imm(words) });
    let word = per_thread_global(&mut p, which, "flags", 4);
    p.op(Op::LdAcquire { d: flag, addr: word, offset: 0 });
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: unset, a: Src::Reg(flag), b: Src::Imm(0) });
    p.guarded(unset, Op::Bra { target: 0 });
    count_up_to(&mut p, i, Src::Imm(n), 0);
    let out = per_thread_global(&mut p, t, "out", 4);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(i)] });
    p.op(Op::Ret);
    p.prog(32, 0, vec![("p_flags".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}

/// A block that only releases: thread `t` stores `t` into its word of `out`, the block meets,
/// and thread 0 releases flag word 0 with `value`. No `ld.acquire`, so the grid is not resident.
pub fn release_only_program(value: i64) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let out = per_thread_global(&mut p, t, "out", 4);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(t)] });
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    let first = equals(&mut p, t, Src::Imm(0));
    let flag = word_at(&mut p, "flags", 0);
    p.guarded(first, Op::StRelease { addr: flag, offset: 0, a: Src::Imm(value) });
    p.op(Op::Ret);
    p.prog(32, 0, vec![("p_flags".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}

/// The words of a tensor argument.
pub fn words_of(args: &[(String, SimArg)], name: &str) -> Vec<u32> {
    let Some((_, SimArg::Tensor(bytes))) = args.iter().find(|(n, _)| n == name) else { panic!("no tensor {name}") };
    bytes.chunks(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes"))).collect()
}

/// Blocks counted through one flag word: every block but 0 writes `data[b][t] = 100 b + t`,
/// meets its barrier, and thread 0 adds 1 to the count (`red.release.add`); block 0's thread 0
/// polls until the count is `blocks - 1`, the block meets, and each thread stores the sum of
/// the others' words, `out[t]`. The read needs every adder's release: a count continues the
/// word's release sequence. `variant` adds a reset of the count or a fault.
pub fn flag_count_program(variant: CountVariant) -> ThreadProgram {
    let late_writer = variant == CountVariant::LateWriter;
    let mut p = P::new();
    let (t, b, blocks, first) = grid_place(&mut p);
    let waiter = equals(&mut p, b, Src::Imm(0));
    let count = word_at(&mut p, "flags", 0);
    p.guarded(waiter, Op::Bra { target: 1 });
    // An adder: its words, the barrier, the count.
    let row = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: row, a: Src::Reg(b), b: Src::Imm(i64::from(FLAG_THREADS)), c: Src::Reg(t) });
    let mine = per_thread_global(&mut p, row, "data", 4);
    let value = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: value, a: Src::Reg(b), b: Src::Imm(100), c: Src::Reg(t) });
    let write = Op::St { space: Space::Global, ty: Ty::U32, addr: mine, offset: 0, vals: vec![Src::Reg(value)] };
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: row, a: Src::Reg(b), b: Src::Imm(1) });
    let last = equals(&mut p, row, Src::Reg(blocks));
    if late_writer {
        p.unless(last, write.clone());
    } else {
        p.op(write.clone());
    }
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    if variant == CountVariant::LastAdderStoresPlainly {
        // Thread 0 of the last block stores; thread 0 of the others adds.
        let (stores, adds) = (p.reg(RegClass::Pred), p.reg(RegClass::Pred));
        p.op(Op::PredLogic { op: BinKind::And, d: stores, a: first, b: last });
        p.op(Op::PredLogic { op: BinKind::Xor, d: adds, a: stores, b: first });
        p.guarded(adds, Op::RedReleaseAdd { addr: count, offset: 0, a: Src::Imm(1) });
        let plain = Op::St { space: Space::Global, ty: Ty::U32, addr: count, offset: 0, vals: vec![Src::Reg(row)] };
        p.guarded(stores, plain);
    } else {
        p.guarded(first, Op::RedReleaseAdd { addr: count, offset: 0, a: Src::Imm(1) });
    }
    if late_writer {
        p.guarded(last, write);
    }
    p.op(Op::Ret);
    // The waiter.
    p.op(Op::Label(1));
    let expected = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Sub, ty: Ty::U32, d: expected, a: Src::Reg(blocks), b: Src::Imm(1) });
    p.unless(first, Op::Bra { target: 3 });
    let (seen, short) = (p.reg(RegClass::B32), p.reg(RegClass::Pred));
    p.op(Op::Label(2));
    p.op(Op::LdAcquire { d: seen, addr: count, offset: 0 });
    p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::U32, d: short, a: Src::Reg(seen), b: Src::Reg(expected) });
    p.guarded(short, Op::Bra { target: 2 });
    p.op(Op::Label(3));
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::AnyInstruction });
    let (sum, c, word) = (p.reg(RegClass::B32), p.reg(RegClass::B32), p.reg(RegClass::B32));
    p.op(Op::Mov { ty: Ty::U32, d: sum, a: Src::Imm(0) });
    p.op(Op::Mov { ty: Ty::U32, d: c, a: Src::Imm(1) });
    p.op(Op::Label(4));
    let at = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: at, a: Src::Reg(c), b: Src::Imm(i64::from(FLAG_THREADS)), c: Src::Reg(t) });
    let theirs = per_thread_global(&mut p, at, "data", 4);
    p.op(Op::Ld { space: Space::Global, ty: Ty::U32, d: vec![word], addr: theirs, offset: 0 });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: sum, a: Src::Reg(sum), b: Src::Reg(word) });
    count_up_to(&mut p, c, Src::Reg(blocks), 4);
    let out = per_thread_global(&mut p, t, "out", 4);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(sum)] });
    if variant == CountVariant::WaiterResets {
        // Ordered after every add: the waiter acquired them all.
        p.guarded(first, Op::St { space: Space::Global, ty: Ty::U32, addr: count, offset: 0, vals: vec![Src::Imm(0)] });
    }
    p.op(Op::Ret);
    let params = vec![
        ("p_data".into(), Ty::U64),
        ("p_flags".into(), Ty::U64),
        ("p_out".into(), Ty::U64),
        ("p_blocks".into(), Ty::S32),
    ];
    p.prog(FLAG_THREADS, 0, params)
}

/// What [`flag_count_program`] adds to the count, or gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CountVariant {
    /// The count as described.
    Plain,
    /// The waiter sets the count back to 0 with a plain store after reading the words.
    WaiterResets,
    /// The last block writes its words after it adds.
    LateWriter,
    /// The last block stores its count with a plain store instead of adding.
    LastAdderStoresPlainly,
}

/// Two flags set by block 1 (the second, then the first), which block 0's thread 0 polls in
/// turn, counting its tries, until both are set, then stores their sum into `out[0]`: polls
/// that alternate between two words and never repeat (the count) yield to the other blocks.
pub fn two_flags_program() -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let b = block_x(&mut p);
    let (first_flag, second_flag) = (word_at(&mut p, "flags", 0), word_at(&mut p, "flags", 1));
    let thread0 = equals(&mut p, t, Src::Imm(0));
    p.unless(thread0, Op::Ret);
    let setter = equals(&mut p, b, Src::Imm(1));
    p.guarded(setter, Op::StRelease { addr: second_flag, offset: 0, a: Src::Imm(2) });
    p.guarded(setter, Op::StRelease { addr: first_flag, offset: 0, a: Src::Imm(1) });
    p.guarded(setter, Op::Ret);
    let (a, c, both) = (p.reg(RegClass::B32), p.reg(RegClass::B32), p.reg(RegClass::Pred));
    let tries = p.reg(RegClass::B32);
    p.op(Op::Mov { ty: Ty::U32, d: tries, a: Src::Imm(0) });
    p.op(Op::Label(0));
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: tries, a: Src::Reg(tries), b: Src::Imm(1) });
    p.op(Op::LdAcquire { d: a, addr: first_flag, offset: 0 });
    p.op(Op::LdAcquire { d: c, addr: second_flag, offset: 0 });
    let unset = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ne, ty: Ty::U32, d: both, a: Src::Reg(a), b: Src::Imm(0) });
    p.op(Op::Setp { cmp: Cmp::Ne, ty: Ty::U32, d: unset, a: Src::Reg(c), b: Src::Imm(0) });
    p.op(Op::PredLogic { op: BinKind::And, d: both, a: both, b: unset });
    p.unless(both, Op::Bra { target: 0 });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: a, a: Src::Reg(a), b: Src::Reg(c) });
    let out = word_at(&mut p, "out", 0);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(a)] });
    p.op(Op::Ret);
    p.prog(32, 0, vec![("p_flags".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}

/// A spin that counts its tries in a register and never finds its flag set: no poll repeats
/// (its registers change), so only the limit on polls ends it.
pub fn counting_spin_program() -> ThreadProgram {
    let mut p = P::new();
    let flag_at = word_at(&mut p, "flags", 0);
    let (tries, flag, unset) = (p.reg(RegClass::B32), p.reg(RegClass::B32), p.reg(RegClass::Pred));
    p.op(Op::Mov { ty: Ty::U32, d: tries, a: Src::Imm(0) });
    p.op(Op::Label(0));
    p.op(Op::LdAcquire { d: flag, addr: flag_at, offset: 0 });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: tries, a: Src::Reg(tries), b: Src::Imm(1) });
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: unset, a: Src::Reg(flag), b: Src::Imm(0) });
    p.guarded(unset, Op::Bra { target: 0 });
    p.op(Op::Ret);
    p.prog(32, 0, vec![("p_flags".into(), Ty::U64)])
}

/// [`flag_count_program`]'s arguments over `blocks` blocks.
pub fn flag_count_args(blocks: u32) -> Vec<(String, SimArg)> {
    vec![
        ("data".to_string(), SimArg::Tensor(vec![0xee; (blocks * FLAG_THREADS * 4) as usize])),
        ("flags".to_string(), SimArg::Tensor(vec![0; 4])),
        ("out".to_string(), SimArg::Tensor(vec![0xee; (FLAG_THREADS * 4) as usize])),
        ("blocks".to_string(), SimArg::I32(blocks as i32)),
    ]
}

/// What [`flag_count_program`] stores over `blocks` blocks: `out[t] = sum over b >= 1 of 100 b + t`.
pub fn flag_count_expected(blocks: u32) -> Vec<u32> {
    (0..FLAG_THREADS).map(|t| (1..blocks).map(|b| 100 * b + t).sum()).collect()
}

/// Block 1 writes `data[t] = t`, meets its barriers four times, and thread 0 releases the flag as
/// the block's last instructions; block 0's thread 0 polls it, the block meets, and every thread
/// copies `data[t]` to `out[t]`. The releasing block finishes in the round that releases.
pub fn release_at_the_end_program() -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let b = block_x(&mut p);
    let flag_at = word_at(&mut p, "flags", 0);
    let data = per_thread_global(&mut p, t, "data", 4);
    let first = equals(&mut p, t, Src::Imm(0));
    let setter = equals(&mut p, b, Src::Imm(1));
    p.unless(setter, Op::Bra { target: 1 });
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: data, offset: 0, vals: vec![Src::Reg(t)] });
    // Rounds in which the poller has nothing new to read, before the release.
    for id in 0..4 {
        p.op(Op::Bar { id: Src::Imm(id), count: None, reach: BarrierReach::AnyInstruction });
    }
    p.guarded(first, Op::StRelease { addr: flag_at, offset: 0, a: Src::Imm(1) });
    p.op(Op::Ret);
    p.op(Op::Label(1));
    p.unless(first, Op::Bra { target: 2 });
    poll_until_set(&mut p, flag_at, 3);
    p.op(Op::Label(2));
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::AnyInstruction });
    let got = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Global, ty: Ty::U32, d: vec![got], addr: data, offset: 0 });
    let out = per_thread_global(&mut p, t, "out", 4);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(got)] });
    p.op(Op::Ret);
    p.prog(32, 0, vec![("p_flags".into(), Ty::U64), ("p_data".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}
