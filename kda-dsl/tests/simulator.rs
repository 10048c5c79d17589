//! The simulator reports what the hardware would punish. These programs are written directly
//! in the thread IR (the simulator's input), each with one planted fault.

mod support;

use kda_dsl::hopper_layout::{Major, Swizzle};
use kda_dsl::sim::{run, SimArg};
use kda_dsl::thread_ir::*;
use kda_dsl::Target;
use support::flag_programs::*;
use support::hopper_programs::*;

fn err_of(prog: &ThreadProgram, args: &mut [(String, SimArg)]) -> String {
    run(prog, [1, 1, 1], args).expect_err("a planted fault").to_string()
}

/// Each planted fault's run fails, saying what its case expects.
fn assert_each_fault_reported<F: Copy + std::fmt::Debug, T: std::fmt::Debug>(
    run: impl Fn(F) -> Result<T, String>,
    cases: &[(F, &str)],
) {
    for &(fault, expected) in cases {
        let e = run(fault).expect_err("a planted fault");
        eprintln!("{fault:?}: {e}");
        if expected == "XX" {
            continue;
        }
        assert!(e.contains(expected), "{fault:?}: {e}");
    }
}

#[test]
fn a_cluster_s_blocks_store_into_each_other_and_meet_at_barrier_cluster() {
    assert_eq!(run_cluster(ClusterFault::None).expect("runs"), cluster_expected());
}

#[test]
fn a_ring_across_a_cluster_s_blocks_hands_stages_over_and_back() {
    for handover in [ClusterHandover::StAsync, ClusterHandover::BulkCopy] {
        let got = run_cluster_ring(handover, ClusterRingFault::None).unwrap_or_else(|e| panic!("{handover:?}: {e}"));
        assert_eq!(got, cluster_ring_expected(2), "{handover:?}");
    }
}

#[test]
fn blocks_hand_words_down_a_chain_of_flags() {
    for kind in [FlagKind::Store, FlagKind::Add] {
        let got = run_flag_chain(kind, FlagFault::None).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(got, flag_chain_expected(4), "{kind:?}");
    }
}

#[test]
fn polls_with_nothing_written_between_read_their_word_without_waiting() {
    // Five words in turn, and one word five times (an outer loop waiting again for a flag it
    // saw set).
    for words in [5, 1] {
        let flags = SimArg::Tensor(vec![1; 5 * 4]);
        let mut args = vec![("flags".to_string(), flags), ("out".to_string(), SimArg::Tensor(vec![0; 32 * 4]))];
        run(&repeated_polls_program(5, words), [1, 1, 1], &mut args).unwrap_or_else(|e| panic!("{words} words: {e}"));
        assert_eq!(words_of(&args, "out"), vec![5; 32], "{words} words");
    }
}

#[test]
fn polls_alternating_between_two_words_let_the_other_blocks_run() {
    let mut args =
        vec![("flags".to_string(), SimArg::Tensor(vec![0; 2 * 4])), ("out".to_string(), SimArg::Tensor(vec![0; 4]))];
    run(&two_flags_program(), [2, 1, 1], &mut args).expect("runs");
    assert_eq!(words_of(&args, "out"), vec![3]);
}

#[test]
fn a_block_that_releases_as_it_finishes_wakes_its_pollers() {
    let mut args = vec![
        ("flags".to_string(), SimArg::Tensor(vec![0; 4])),
        ("data".to_string(), SimArg::Tensor(vec![0xee; 32 * 4])),
        ("out".to_string(), SimArg::Tensor(vec![0xee; 32 * 4])),
    ];
    run(&release_at_the_end_program(), [2, 1, 1], &mut args).expect("runs");
    assert_eq!(words_of(&args, "out"), (0..32).collect::<Vec<u32>>());
}

#[test]
fn a_spin_that_never_repeats_a_poll_ends_at_the_limit() {
    let mut args = vec![("flags".to_string(), SimArg::Tensor(vec![0; 4]))];
    let e = run(&counting_spin_program(), [1, 1, 1], &mut args).expect_err("a flag never set").to_string();
    assert!(e.contains("polls of flag words by one thread"), "{e}");
}

#[test]
fn a_release_in_a_grid_that_polls_nothing_is_a_store() {
    let mut args = vec![
        ("flags".to_string(), SimArg::Tensor(vec![0; 4])),
        ("out".to_string(), SimArg::Tensor(vec![0xee; 32 * 4])),
    ];
    run(&release_only_program(7), [1, 1, 1], &mut args).expect("runs");
    assert_eq!(words_of(&args, "flags"), vec![7]);
    assert_eq!(words_of(&args, "out"), (0..32).collect::<Vec<u32>>());
}

#[test]
fn a_count_of_releases_orders_every_adder_before_its_reader() {
    for variant in [CountVariant::Plain, CountVariant::WaiterResets] {
        let mut args = flag_count_args(5);
        run(&flag_count_program(variant), [5, 1, 1], &mut args).unwrap_or_else(|e| panic!("{variant:?}: {e}"));
        assert_eq!(words_of(&args, "out"), flag_count_expected(5), "{variant:?}");
    }
    assert_each_fault_reported(
        |variant| {
            let mut args = flag_count_args(5);
            run(&flag_count_program(variant), [5, 1, 1], &mut args).map_err(|e| e.to_string())
        },
        &[
            (CountVariant::LateWriter, "of `data` written by thread 0 of the grid's block 4 and read by thread 0 with no flag"),
            (
                CountVariant::LastAdderStoresPlainly,
                "global byte 0 of `flags` set by a flag access by thread 0 of the grid's block 3 and written by thread 0",
            ),
        ],
    );
}

#[test]
fn flag_misuse_is_reported() {
    let written_unordered = "written by thread 0 of the grid's block 3 and read by thread 0 with no flag between";
    assert_each_fault_reported(
        |fault| run_flag_chain(FlagKind::Store, fault),
        &[
            (FlagFault::ReleaseBeforeWrites, written_unordered),
            (
                FlagFault::NoBarrierBeforeRelease,
                "written by thread 1 of the grid's block 3 and read by thread 1 with no flag",
            ),
            (
                FlagFault::PlainFlagStore,
                "flag word at byte 12 of `flags` stored by thread 0 of the grid's block 3 with a plain store",
            ),
            (FlagFault::FlagNeverSet, "deadlock: ld.acquire polls a flag word that no block writes again"),
            (FlagFault::ReadsBeforePoll, "read by thread 0 of the grid's block 2 and written by thread 0 with no flag"),
        ],
    );
}

#[test]
fn a_ball_goes_back_and_forth_between_a_cluster_s_blocks() {
    for rounds in [1, 5] {
        let mut args = cluster_ping_pong_args(4, rounds);
        run(&cluster_ping_pong_program(), [4, 1, 1], &mut args).expect("runs");
        assert_eq!(ring_words(tensor(&args, "out")), cluster_ping_pong_expected(4, rounds as u32), "{rounds} rounds");
    }
}

#[test]
fn producers_of_a_cluster_take_turns_and_every_block_consumes_every_round() {
    assert_eq!(run_cluster_turns(TurnsFault::None).expect("runs"), cluster_turns_expected(2));
}

#[test]
fn cluster_turns_misuse_is_reported() {
    assert_each_fault_reported(
        run_cluster_turns,
        &[
            (
                TurnsFault::ProducerSkipsEmptyWait,
                "shared byte 0 written by thread 0 of the cluster's block 0 and by thread 0 with no barrier.cluster",
            ),
            (TurnsFault::ArrivesOnOwnEmpty, "deadlock: an mbarrier wait waits for a phase still 32 arrival(s) short"),
            (TurnsFault::NoExpectTx, "deadlock: an mbarrier wait waits for a phase still 64 arrival(s) short"),
            (
                TurnsFault::ConsumerWaitsAtCtaScope,
                "written by thread 0 of the cluster's block 1 and read by thread 32 with no barrier.cluster or mbarrier",
            ),
            (TurnsFault::NoProxyFence, "a bulk copy to the cluster reads shared byte 0, which thread 0 wrote with no"),
        ],
    );
}

#[test]
fn cluster_ring_misuse_is_reported() {
    use ClusterRingFault as F;
    assert_each_fault_reported(
        |fault| run_cluster_ring(ClusterHandover::StAsync, fault),
        &[
            (F::ProducerSkipsEmptyWait, "a phase whose copies delivered 512 bytes more than its expect_tx"),
            (
                F::ConsumerWaitsAtCtaScope,
                "of the cluster's block 0 and read by thread 0 with no barrier.cluster or mbarrier phase (waited for at \
                 .cluster scope) between",
            ),
            (
                F::ConsumerArrivesBeforeReading,
                "shared byte 0 of block 1 read by its threads and stored by thread 0 of the cluster's block 0 with no",
            ),
            (
                F::NoClusterBarrierAfterInit,
                "the mbarrier at shared byte 512 of the cluster's block 1 is used from another block with no \
                 barrier.cluster after its fence.mbarrier_init",
            ),
            (
                F::NoInitFence,
                "the mbarrier at shared byte 512 of the cluster's block 1 is used from another block with no \
                 fence.mbarrier_init.release.cluster after its initialization",
            ),
            (F::NoClusterBarrierAtExit, "block 1 of the cluster reaches block 0, which has exited"),
            (F::CompletesItsOwnBlock, "st.async into one block's shared memory completing another block's mbarrier"),
        ],
    );
    assert_each_fault_reported(
        |fault| run_cluster_ring(ClusterHandover::BulkCopy, fault),
        &[
            (F::ProducerSkipsEmptyWait, "shared byte 0 of block 1 read by its threads and stored by thread 0 of the"),
            (
                F::ConsumerWaitsAtCtaScope,
                "written by thread 0 of the cluster's block 0 and read by thread 0 with no barrier.cluster or mbarrier",
            ),
            (F::CompletesItsOwnBlock, "a bulk copy into one block's shared memory completing another block's mbarrier"),
            (
                F::NoProxyFence,
                "a bulk copy to the cluster reads shared byte 0, which thread 0 wrote with no fence.proxy.async",
            ),
            (
                F::WritesSourceWhileCopying,
                "shared byte 0 written while a bulk copy to another block of the cluster still reads it",
            ),
        ],
    );
}

#[test]
fn cluster_misuse_is_reported() {
    assert_each_fault_reported(
        run_cluster,
        &[
            (
                ClusterFault::NoBarrier,
                "written by thread 0 of the cluster's block 0 and read by thread 0 with no barrier.cluster or mbarrier",
            ),
            (ClusterFault::WaitWithoutArrive, "barrier.cluster.wait with no arrive before it"),
            (ClusterFault::RankPastTheCluster, "mapa to rank 2 of a cluster of 2 blocks"),
            (ClusterFault::LoadFromThePeer, "only stores cross blocks here"),
            (ClusterFault::PeerStuck, "deadlock: barrier.cluster waits for threads of the cluster that never arrive"),
        ],
    );
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
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: z, offset: 0 });
    p.op(Op::Ret);
    run(&p.prog(64, 256, vec![]), [1, 1, 1], &mut []).expect("no fault");
}

/// 32 threads each copy 16 bytes into their own slot with `cp.async`, pass a barrier and
/// read the next thread's slot: its copy lands by its issuer's `wait_group`, so a read before
/// that wait (`waits` false) may meet it landing, whatever the barrier orders.
fn read_a_neighbours_copy(waits: bool) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let base = shared_at(&mut p, 0);
    let mine = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: mine, a: Src::Reg(t), b: Src::Imm(16), c: Src::Reg(base) });
    let src = lane_global_source(&mut p, t, "input", 16);
    p.op(Op::CpAsync { dst: mine, src, src_bytes: Src::Imm(16) });
    p.op(Op::CpAsyncCommit);
    if waits {
        p.op(Op::CpAsyncWait { n: 0 });
    }
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    let theirs = next_lane_slot(&mut p, t, base);
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: theirs, offset: 0 });
    p.op(Op::CpAsyncWait { n: 0 });
    p.op(Op::Ret);
    p.prog(32, 512, vec![("p_input".into(), Ty::U64)])
}

#[test]
fn reading_a_cp_async_destination_before_its_wait_is_a_race() {
    let input = || vec![("input".to_string(), SimArg::Tensor((0..512).map(|i| i as u8).collect()))];
    run(&read_a_neighbours_copy(true), [1, 1, 1], &mut input()).expect("waited for before the barrier");
    let e = err_of(&read_a_neighbours_copy(false), &mut input());
    assert!(e.contains("while a cp.async into it is in flight"), "{e}");
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
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
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
    p.op(Op::Bar { id: Src::Imm(1), count: Some(64), reach: BarrierReach::SameInstruction });
    p.op(Op::Label(1));
    p.op(Op::Ret);
    run(&p.prog(128, 0, vec![]), [1, 1, 1], &mut []).expect("releases");
}

/// Two pairs of warps run one `bar.sync id, 64` with the id in a register: `1 + tid / 64`
/// (each pair its own barrier), or 1 for both (`shared`).
fn pairs_at_a_register_barrier(shared: bool) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let id = p.reg(RegClass::B32);
    let pair = p.reg(RegClass::B32);
    p.op(Op::Bin {
        op: BinKind::Div,
        ty: Ty::U32,
        d: pair,
        a: Src::Reg(t),
        b: Src::Imm(if shared { 128 } else { 64 }),
    });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: id, a: Src::Reg(pair), b: Src::Imm(1) });
    p.op(Op::Bar { id: Src::Reg(id), count: Some(64), reach: BarrierReach::SameInstruction });
    p.op(Op::Ret);
    p.prog(128, 0, vec![])
}

#[test]
fn a_barrier_id_in_a_register_is_each_threads_own() {
    run(&pairs_at_a_register_barrier(false), [1, 1, 1], &mut []).expect("each pair meets at its barrier");
    let e = err_of(&pairs_at_a_register_barrier(true), &mut []);
    assert!(e.contains("bar.sync 1: 128 threads wait at a barrier of 64"), "{e}");
}

/// Warp 1 meets warp 0 at barrier 0 from another instruction (as a fill warp's copy of a
/// loop does): legal only for `barrier.sync`.
fn meet_from_two_instructions(reach: BarrierReach) -> ThreadProgram {
    let mut p = P::new();
    let t = tid(&mut p);
    let q = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: q, a: Src::Reg(t), b: Src::Imm(32) });
    p.guarded(q, Op::Bra { target: 1 });
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach });
    p.op(Op::Bra { target: 2 });
    p.op(Op::Label(1));
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach });
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
        p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    }
    let third = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: third, a: Src::Reg(t), b: Src::Imm(64) });
    p.guarded(third, Op::Bra { target: 1 });
    p.op(Op::Bar { id: Src::Imm(1), count: Some(64), reach: BarrierReach::SameInstruction });
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
    assert_each_fault_reported(
        |fault| run_wgmma(WgmmaCase::shared_a(Swizzle::B128), fault),
        &[
            (WgmmaFault::NoRegisterFence, "no wgmma.fence before it"),
            (WgmmaFault::AccumulatorWrittenAfterFence, "register %f0 was read or written after the last wgmma.fence"),
            (WgmmaFault::AccumulatorReadAfterFence, "register %f1 was read or written after the last wgmma.fence"),
            (WgmmaFault::NoProxyFence, "no fence.proxy.async after the write"),
            (WgmmaFault::ReadBeforeWait, "touches register %f0 while a wgmma that owns it is pending"),
            (WgmmaFault::SharedWriteWhilePending, "while a pending wgmma reads it"),
            (WgmmaFault::ExitPending, "exits with wgmma results pending"),
            (WgmmaFault::ProxyFenceAfterBarrier, "no barrier orders thread 1's fence.proxy.async before it"),
        ],
    );
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
    assert_each_fault_reported(
        run_ring,
        &[
            (RingFault::NoBarrierAfterInit, "with no barrier after thread 0 initialized it"),
            (RingFault::ConsumerSkipsFullWait, "race: shared byte 16 written by thread 0 and read by thread 32"),
            (RingFault::MissingArrival, "arrival(s) short, which never come"),
            (RingFault::StoreToBarrier, "belongs to an mbarrier"),
            (RingFault::WaitWithoutLoop, "race: shared byte 16 written by thread 0 and read by thread 32"),
        ],
    );
}

#[test]
fn cp_async_copies_hand_over_through_an_mbarrier() {
    assert_eq!(run_cp_async_ring(CpAsyncRingFault::None).expect("runs"), cp_async_ring_input());
}

#[test]
fn cp_async_ring_misuse_is_reported() {
    assert_each_fault_reported(
        run_cp_async_ring,
        &[
            (CpAsyncRingFault::ConsumerSkipsFullWait, "race: shared byte"),
            (CpAsyncRingFault::PlainArrive, "while a cp.async into it is in flight"),
        ],
    );
}

#[test]
fn a_producer_computes_a_stage_ahead_through_three_mbarriers() {
    assert_eq!(run_compute_ring(ComputeRingFault::None).expect("runs"), compute_ring_expected());
}

#[test]
fn compute_ring_misuse_is_reported() {
    assert_each_fault_reported(
        run_compute_ring,
        &[
            (ComputeRingFault::ConsumerSkipsReadyWait, "thread 32: read of shared byte"),
            (ComputeRingFault::ProducerSkipsLoadedWait, "which nothing wrote"),
            (ComputeRingFault::NoReadyArrival, "deadlock"),
            (ComputeRingFault::ArrivesBeforeWarpBarrier, "race: shared byte"),
            (ComputeRingFault::LoadsAllStagesAhead, "deadlock"),
        ],
    );
}

/// The Hopper programs the simulator runs are PTX that ptxas takes (the `wgmma` ones for
/// sm_90a, the mbarrier ring and the TMA copy for sm_90), and their SASS has the Hopper
/// instructions: `HGMMA` (not `HMMA`), `UTMALDG`, the mbarrier's `SYNCS`, `USETMAXREG` (and
/// ptxas does not ignore the `setmaxnreg`s: no warning C7508), and the flag programs are sm_80 PTX
/// whose flags are `.STRONG.GPU` accesses. ptxas from
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
        ("cp_async_ring", cp_async_ring_program(CpAsyncRingFault::None), Target::Sm90, "ARRIVES.LDGSTSBAR.64.ARVCNT"),
        ("compute_ring", compute_ring_program(ComputeRingFault::None), Target::Sm90, "ARRIVES.LDGSTSBAR.64.ARVCNT"),
        ("roles", roles_program(RolesFault::None), Target::Sm90a, "USETMAXREG"),
        ("cluster", cluster_program(ClusterFault::None), Target::Sm90, "UCGABAR_ARV"),
        ("cluster_ring", cluster_ring_program(ClusterHandover::StAsync, ClusterRingFault::None), Target::Sm90, "STAS"),
        (
            "cluster_bulk_ring",
            cluster_ring_program(ClusterHandover::BulkCopy, ClusterRingFault::None),
            Target::Sm90,
            "UBLKCP.S.S",
        ),
        ("cluster_ping_pong", cluster_ping_pong_program(), Target::Sm90, "STAS"),
        ("cluster_turns", cluster_turns_program(TurnsFault::None), Target::Sm90, "UBLKCP.S.S"),
        ("flag_chain", flag_chain_program(FlagKind::Store, FlagFault::None), Target::Sm80, "STG.E.STRONG.GPU"),
        ("flag_chain_add", flag_chain_program(FlagKind::Add, FlagFault::None), Target::Sm80, "RED.E.ADD.STRONG.GPU"),
        ("flag_count", flag_count_program(CountVariant::WaiterResets), Target::Sm80, "LDG.E.STRONG.GPU"),
    ];
    for (name, prog, target, sass_op) in programs {
        let ptx = kda_dsl::ptx::print_module(&prog, target);
        let done = support::assemble::assemble(&ptxas, cuobjdump.as_deref(), &target.to_string(), name, &ptx)
            .unwrap_or_else(|e| panic!("{e}"));
        // C7508: ptxas ignored a setmaxnreg.
        assert!(!done.log.contains("C7508"), "{name}: {}", done.log);
        if let Some(sass) = done.sass {
            assert!(sass.contains(sass_op), "{name}: no {sass_op} in the SASS:\n{sass}");
            assert!(!sass.contains(" HMMA"), "{name}: an sm_80 HMMA in the SASS:\n{sass}");
        }
    }
}

#[test]
fn tma_copies_a_swizzled_box_zero_filling_outside_the_tensor() {
    for at in [[0, 0], [32, 4], [56, -3], [-8, 15]] {
        let (got, expected) = run_tma(TmaFault::None, at).expect("runs");
        assert!(got == expected, "box at {at:?}: the shared image differs");
    }
}

#[test]
fn tma_misuse_is_reported() {
    assert_each_fault_reported(
        |fault| run_tma(fault, [0, 0]),
        &[
            (TmaFault::NoWait, "race: shared byte"),
            (TmaFault::ArriveWithoutExpectTx, "race: shared byte"),
            (TmaFault::MisalignedBox, "must start on a 1024-byte boundary"),
            (TmaFault::ExpectTxTooHigh, "whose copies delivered 16 bytes fewer than its expect_tx"),
            (TmaFault::ExpectTxTooLow, "whose copies delivered 16 bytes more than its expect_tx"),
        ],
    );
    // A box starting inside a 16-byte granule of the row (the H200 faults on it).
    let e = run_tma(TmaFault::None, [36, 4]).expect_err("an unaligned box");
    assert!(e.contains("TMA box at inner coordinate 36: 72 bytes into the row, not a multiple of 16"), "{e}");
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
            p.op(Op::Bar { id: Src::Imm(1), count: Some(64), reach: BarrierReach::SameInstruction });
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
    p.guarded(in_first, Op::Bar { id: Src::Imm(1), count: Some(count), reach: BarrierReach::AnyInstruction });
    let in_second = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Le, ty: Ty::S32, d: in_second, a: Src::Reg(warp), b: Src::Imm(1) });
    p.guarded(in_second, Op::Bar { id: Src::Imm(2), count: Some(64), reach: BarrierReach::AnyInstruction });
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

/// Bank conflicts are counted per source line when asked for: a warp storing consecutive words
/// takes one wavefront, one storing a column of a 32-word pitch takes 32 (every lane in one
/// bank), and reading its row back takes one; two warps and two blocks sum.
#[test]
fn bank_conflicts_are_counted_per_line() {
    use kda_dsl::sim::banks::{with_shared_access_stats, SharedOp};
    let mut p = P::new();
    let t = tid(&mut p);
    let z = shared_at(&mut p, 0);
    let row = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: row, a: Src::Reg(t), b: Src::Imm(4), c: Src::Reg(z) });
    let col = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: col, a: Src::Reg(t), b: Src::Imm(128), c: Src::Reg(z) });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: row, offset: 8192, vals: vec![Src::Reg(t)] });
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: col, offset: 0, vals: vec![Src::Reg(t)] });
    let v = p.reg(RegClass::B32);
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![v], addr: row, offset: 8192 });
    p.op(Op::Ret);
    let prog = p.prog(64, 8192 + 256, vec![]);
    let (ran, stats) = with_shared_access_stats(|| run(&prog, [2, 1, 1], &mut []));
    ran.expect("no fault");
    let at = |line: u32| stats.iter().find(|s| s.loc.line == line).copied().expect("a counted line");
    let (row_store, col_store, row_load) = (at(6), at(7), at(8));
    assert_eq!((row_store.op, row_store.requests, row_store.wavefronts, row_store.ideal), (SharedOp::Store, 4, 4, 4));
    assert_eq!((col_store.requests, col_store.wavefronts, col_store.excess()), (4, 4 * 32, 4 * 31));
    assert_eq!((row_load.op, row_load.wavefronts), (SharedOp::Load, 4));
    assert_eq!(stats[0].loc.line, 7, "the most excess first");
    // Outside a scope nothing is counted.
    let (_, none) = with_shared_access_stats(|| ());
    assert!(none.is_empty());
}
