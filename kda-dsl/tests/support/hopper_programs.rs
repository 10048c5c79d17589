//! Thread programs that use the Hopper instructions (wgmma, mbarrier rings, TMA, setmaxnreg,
//! clusters),
//! each with the faults a test can plant, and their arguments. Shared by the simulator's tests
//! (`tests/simulator.rs`) and the GPU test that runs them on an H200 against the simulator
//! (`kda-runtime/tests/gpu_hopper.rs`), so both run the same programs.

use kda_dsl::hopper_layout::{KMajorTile, Major, MnMajorTile, OperandTile, Swizzle, WgmmaFragment};
use kda_dsl::sim::{run, SimArg};
use kda_dsl::tensor_map::TensorMap;
use kda_dsl::thread_ir::*;
use kda_dsl::SrcLoc;

/// A thread program under construction: its instructions and registers per class.
pub struct P {
    body: Vec<Inst>,
    counts: [u32; 5],
}

impl P {
    pub fn new() -> P {
        P { body: vec![], counts: [0; 5] }
    }
    pub fn reg(&mut self, c: RegClass) -> Reg {
        let i = RegClass::ALL.iter().position(|x| *x == c).expect("a class");
        self.counts[i] += 1;
        Reg { class: c, id: self.counts[i] - 1 }
    }
    pub fn op(&mut self, op: Op) {
        let line = self.body.len() as u32 + 1;
        self.body.push(Inst { op, guard: None, loc: SrcLoc::new("k.rs", line, 1), cache: CachePolicy::Normal });
    }
    pub fn guarded(&mut self, p: Reg, op: Op) {
        let line = self.body.len() as u32 + 1;
        self.body.push(Inst {
            op,
            guard: Some((p, true)),
            loc: SrcLoc::new("k.rs", line, 1),
            cache: CachePolicy::Normal,
        });
    }
    /// `op` under `@!p`.
    pub fn unless(&mut self, p: Reg, op: Op) {
        self.guarded(p, op);
        if let Some(inst) = self.body.last_mut() {
            inst.guard = Some((p, false));
        }
    }
    pub fn prog(self, threads: u32, shared: u32, params: Vec<(String, Ty)>) -> ThreadProgram {
        ThreadProgram {
            name: "t".into(),
            params: params.into_iter().map(|(name, ty)| (name, ParamKind::Value(ty))).collect(),
            threads,
            min_blocks_per_sm: None,
            max_registers: None,
            shared_bytes: shared,
            cluster_blocks: 1,
            body: self.body,
            reg_counts: self.counts,
        }
    }
}

/// A register holding the thread's index in the block.
pub fn tid(p: &mut P) -> Reg {
    let t = p.reg(RegClass::B32);
    p.op(Op::ReadSpecial { d: t, sreg: Special::Tid });
    t
}

/// A register holding the shared address `offset` bytes into the block's dynamic shared
/// memory (the hardware's first kilobyte is its own: kernels address from `smem`).
pub fn shared_at(p: &mut P, offset: i64) -> Reg {
    let base = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: base });
    let a = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: a, a: Src::Reg(base), b: Src::Imm(offset) });
    a
}

/// What a `wgmma` test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WgmmaFault {
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
pub struct WgmmaCase {
    pub swizzle: Swizzle,
    pub n: u32,
    pub a_from_registers: bool,
    pub a_major: Major,
    pub b_major: Major,
    pub steps: u32,
}

impl WgmmaCase {
    /// A from shared memory, both K-major, `n` = 16, two chained K-steps.
    pub fn shared_a(swizzle: Swizzle) -> WgmmaCase {
        WgmmaCase { swizzle, n: 16, a_from_registers: false, a_major: Major::K, b_major: Major::K, steps: 2 }
    }

    /// The operand tiles: A (64 rows) and B (`n` rows), `k` elements (one line of the swizzle,
    /// at least one K-step), B right after A. An MN-major tile whose extent is not whole lines
    /// of the swizzle takes none.
    pub fn tiles(&self) -> (OperandTile, OperandTile, u32) {
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

/// The shared address of the next lane's 16 bytes from `base` (lane 0's after lane 31's).
pub fn next_lane_slot(p: &mut P, lane: Reg, base: Reg) -> Reg {
    let next = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: next, a: Src::Reg(lane), b: Src::Imm(1) });
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: next, a: Src::Reg(next), b: Src::Imm(31) });
    let slot = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: slot, a: Src::Reg(next), b: Src::Imm(16), c: Src::Reg(base) });
    slot
}

/// Thread `t`'s address in tensor `name`, `stride` bytes per thread.
pub fn per_thread_global(p: &mut P, t: Reg, name: &str, stride: i64) -> Reg {
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
pub fn wgmma_program(case: WgmmaCase, fault: WgmmaFault) -> ThreadProgram {
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
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
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
pub fn small_bf16(i: u32) -> f32 {
    ((i * 7 + 3) % 9) as f32 / 4.0 - 1.0
}

/// A (64 x k) of a [`wgmma_program`], of [`small_bf16`] values.
fn wgmma_a(m: u32, k: u32) -> f32 {
    small_bf16(m * 131 + k)
}

/// B (n x k) of a [`wgmma_program`], of [`small_bf16`] values.
fn wgmma_b(n: u32, k: u32) -> f32 {
    small_bf16(n * 71 + k * 5 + 1)
}

/// The arguments of [`wgmma_program`]: the operand tiles' shared image (in their swizzled
/// layouts), A's register fragment, the output and each K-step's descriptors.
pub fn wgmma_args(case: WgmmaCase) -> Vec<(String, SimArg)> {
    let n = case.n;
    let (a_tile, b_tile, b_base) = case.tiles();
    let mut image = vec![0u8; (a_tile.bytes() + b_tile.bytes()) as usize];
    let bf16 = |x: f32| ((x.to_bits() >> 16) as u16).to_le_bytes();
    for (tile, base, rows, value) in [(a_tile, 0, 64, wgmma_a as fn(u32, u32) -> f32), (b_tile, b_base, n, wgmma_b)] {
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
            a_frag[at..at + 2].copy_from_slice(&bf16(wgmma_a(m, k)));
        }
    }
    let mut args = vec![
        ("tiles".to_string(), SimArg::Tensor(image)),
        ("a_frag".to_string(), SimArg::Tensor(a_frag)),
        ("out".to_string(), SimArg::Tensor(vec![0; 128 * 4 * n as usize / 2])),
    ];
    for s in 0..a_tile.k() / 16 {
        args.push((format!("a_desc{s}"), SimArg::I64(a_tile.descriptor(0, s).encode() as i64)));
        args.push((format!("b_desc{s}"), SimArg::I64(b_tile.descriptor(b_base, s).encode() as i64)));
    }
    args
}

/// Each (row, column) of a [`wgmma_program`]'s product in `out` (its output's bytes) with the
/// f64 reference, `1 + Σ_i A_i B_iᵀ` over the chained K-steps.
pub fn wgmma_products(case: WgmmaCase, out: &[u8]) -> Vec<(f32, f64)> {
    let WgmmaCase { n, steps, .. } = case;
    let steps_per_tile = case.tiles().0.k() / 16;
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
                        (k0..k0 + 16).map(|k| f64::from(wgmma_a(m, k)) * f64::from(wgmma_b(col, k))).sum::<f64>()
                    })
                    .sum::<f64>();
            got.push((value, reference));
        }
    }
    got
}

/// The bytes of tensor argument `name` in `args`.
pub fn tensor<'a>(args: &'a [(String, SimArg)], name: &str) -> &'a [u8] {
    match args.iter().find(|(n, _)| n == name) {
        Some((_, SimArg::Tensor(bytes))) => bytes,
        _ => panic!("no tensor argument `{name}`"),
    }
}

/// Runs [`wgmma_program`] in the simulator; returns [`wgmma_products`].
pub fn run_wgmma(case: WgmmaCase, fault: WgmmaFault) -> Result<Vec<(f32, f64)>, String> {
    let mut args = wgmma_args(case);
    run(&wgmma_program(case, fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(wgmma_products(case, tensor(&args, "out")))
}

/// What a producer/consumer ring test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RingFault {
    None,
    NoBarrierAfterInit,
    ConsumerSkipsFullWait,
    MissingArrival,
    StoreToBarrier,
    WaitWithoutLoop,
}

/// Rounds through the ring's one slot.
pub const RING_ROUNDS: u32 = 3;

/// The threads of the second warp on (the consumers) branch to `target`; the first warp goes on.
pub fn consumers_branch_to(p: &mut P, t: Reg, target: u32) {
    let is_consumer = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ge, ty: Ty::S32, d: is_consumer, a: Src::Reg(t), b: Src::Imm(32) });
    p.guarded(is_consumer, Op::Bra { target });
}

/// A global-space address of this lane's `bytes` of the tensor `name`: a `cp.async` source.
pub fn lane_global_source(p: &mut P, lane: Reg, name: &str, bytes: i64) -> Reg {
    let generic = per_thread_global(p, lane, name, bytes);
    let global = p.reg(RegClass::B64);
    p.op(Op::CvtaGlobal { d: global, a: generic });
    global
}

/// Waits for the phase of `parity` of the mbarrier at `addr`: `try_wait` until it says so.
pub fn wait_phase(p: &mut P, addr: Reg, parity: u32, label: &mut u32) {
    wait_phase_in(p, addr, parity, label, MbarrierScope::Cta);
}

/// [`wait_phase`], acquiring what the arrivals released within `scope`.
pub fn wait_phase_in(p: &mut P, addr: Reg, parity: u32, label: &mut u32, scope: MbarrierScope) {
    let (top, done) = (*label, *label + 1);
    *label += 2;
    let ready = p.reg(RegClass::Pred);
    p.op(Op::Label(top));
    p.op(Op::MbarrierWait { d: ready, addr, parity: Src::Imm(i64::from(parity)), kind: MbarrierWaitKind::Try, scope });
    p.guarded(ready, Op::Bra { target: done });
    p.op(Op::Bra { target: top });
    p.op(Op::Label(done));
}

/// The registers of a one-slot ring: its `full` and `empty` mbarriers, this lane's word of the
/// slot, an arrival's state and the value moved.
pub struct Ring {
    pub full: Reg,
    pub empty: Reg,
    pub lane: Reg,
    pub slot: Reg,
    pub state: Reg,
    pub value: Reg,
}

/// Thread 0 initializes the ring's `full` and `empty` mbarriers (at the shared base and 8 bytes
/// on) with these arrival counts; a block barrier orders that before their use (unless
/// `barrier_after_init` is false); each thread finds its lane's word of the slot (16 bytes on).
pub fn ring_setup(p: &mut P, t: Reg, full_count: u32, empty_count: u32, barrier_after_init: bool) -> Ring {
    let full = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: full });
    let empty = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: empty, a: Src::Reg(full), b: Src::Imm(8) });
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    p.guarded(first, Op::MbarrierInit { addr: full, count: full_count });
    p.guarded(first, Op::MbarrierInit { addr: empty, count: empty_count });
    if barrier_after_init {
        p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
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
pub fn produce(p: &mut P, t: Reg, ring: &Ring, consumer: u32, label: &mut u32) {
    consumers_branch_to(p, t, consumer);
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
pub fn ring_program(fault: RingFault) -> ThreadProgram {
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
                p.op(Op::MbarrierWait {
                    d: ready,
                    addr: full,
                    parity: Src::Imm(i64::from(round % 2)),
                    kind: MbarrierWaitKind::Try,
                    scope: MbarrierScope::Cta,
                });
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

/// The argument of [`ring_program`]: its output, [`RING_ROUNDS`] words per lane.
pub fn ring_args() -> Vec<(String, SimArg)> {
    vec![("out".to_string(), SimArg::Tensor(vec![0; (RING_ROUNDS * 32 * 4) as usize]))]
}

/// A [`ring_program`]'s output as words (round-major).
pub fn ring_words(out: &[u8]) -> Vec<u32> {
    out.chunks(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes"))).collect()
}

/// Runs [`ring_program`] in the simulator; returns [`ring_words`].
pub fn run_ring(fault: RingFault) -> Result<Vec<u32>, String> {
    let mut args = ring_args();
    run(&ring_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(ring_words(tensor(&args, "out")))
}

/// What a [`cp_async_ring_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CpAsyncRingFault {
    None,
    /// The consumer reads the slot without waiting for `full`.
    ConsumerSkipsFullWait,
    /// The producer arrives on `full` with a plain `mbarrier.arrive`, which does not wait for
    /// its copies.
    PlainArrive,
}

/// A producer warp fills a shared slot of 16 bytes a lane with `cp.async` from the input, one
/// round after another, and hands each round over with `cp.async.mbarrier.arrive.noinc` on
/// `full` (32 arrivals a phase: the copying threads count, `.noinc`), never waiting for the
/// copies itself; a consumer warp waits for `full`, copies its lane's 16 bytes to the output
/// and arrives on `empty`, as in [`ring_program`].
pub fn cp_async_ring_program(fault: CpAsyncRingFault) -> ThreadProgram {
    let mut p = P::new();
    let mut label = 0;
    let t = tid(&mut p);
    let ring = ring_setup(&mut p, t, 32, 32, true);
    let Ring { full, empty, lane, .. } = ring;
    let slot = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: slot, a: Src::Reg(lane), b: Src::Imm(16), c: Src::Reg(full) });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: slot, a: Src::Reg(slot), b: Src::Imm(16) });
    let (consumer, end) = (1000, 1001);
    consumers_branch_to(&mut p, t, consumer);
    let input = lane_global_source(&mut p, lane, "input", 16);
    for round in 0..RING_ROUNDS {
        wait_phase(&mut p, empty, (round + 1) % 2, &mut label);
        let src = p.reg(RegClass::B64);
        let offset = i64::from(round * 32 * 16);
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::S64, d: src, a: Src::Reg(input), b: Src::Imm(offset) });
        p.op(Op::CpAsync { dst: slot, src, src_bytes: Src::Imm(16) });
        match fault {
            CpAsyncRingFault::PlainArrive => p.op(Op::MbarrierArrive { state: ring.state, addr: full }),
            _ => p.op(Op::CpAsyncMbarrierArrive { addr: full }),
        }
    }
    p.op(Op::Bra { target: end });
    p.op(Op::Label(consumer));
    let out = per_thread_global(&mut p, lane, "out", 16);
    let words: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
    for round in 0..RING_ROUNDS {
        if fault != CpAsyncRingFault::ConsumerSkipsFullWait {
            wait_phase(&mut p, full, round % 2, &mut label);
        }
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: words.clone(), addr: slot, offset: 0 });
        let offset = i64::from(round * 32 * 16);
        let vals = words.iter().map(|w| Src::Reg(*w)).collect();
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals });
        p.op(Op::MbarrierArrive { state: ring.state, addr: empty });
    }
    p.op(Op::Label(end));
    p.op(Op::Ret);
    p.prog(64, 16 + 32 * 16, vec![("p_input".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}

/// The input of [`cp_async_ring_program`]: byte `i` of the [`RING_ROUNDS`] rounds of 32 lanes'
/// 16 bytes is `i * 7 + 3` (mod 256), so every byte of a round differs from the last's.
pub fn cp_async_ring_input() -> Vec<u8> {
    (0..RING_ROUNDS * 32 * 16).map(|i| (i * 7 + 3) as u8).collect()
}

/// The arguments of [`cp_async_ring_program`]: the input and a zeroed output of its size.
pub fn cp_async_ring_args() -> Vec<(String, SimArg)> {
    let input = cp_async_ring_input();
    let out = vec![0; input.len()];
    vec![("input".to_string(), SimArg::Tensor(input)), ("out".to_string(), SimArg::Tensor(out))]
}

/// Runs [`cp_async_ring_program`] in the simulator; returns its output.
pub fn run_cp_async_ring(fault: CpAsyncRingFault) -> Result<Vec<u8>, String> {
    let mut args = cp_async_ring_args();
    run(&cp_async_ring_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(tensor(&args, "out").to_vec())
}

/// What a [`compute_ring_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ComputeRingFault {
    None,
    /// The consumer reads the stage without waiting for `ready`.
    ConsumerSkipsReadyWait,
    /// The producer computes from the stage without waiting for `loaded`.
    ProducerSkipsLoadedWait,
    /// The producer never arrives on `ready`.
    NoReadyArrival,
    /// The elected lane arrives on `ready` before the warp's named barrier, so the other
    /// lanes' results are not released with it.
    ArrivesBeforeWarpBarrier,
    /// The producer loads as many rounds ahead as there are stages: before computing a round
    /// it waits for that round's own stage to be released, which needs the round computed.
    LoadsAllStagesAhead,
}

/// Stages of [`compute_ring_program`]'s ring.
pub const COMPUTE_RING_STAGES: u32 = 3;
/// Rounds through it.
pub const COMPUTE_RING_ROUNDS: u32 = 7;
/// Rounds the producer loads ahead of the one it computes: `stages - 2`, so its loads wait
/// only for stages the consumer has released while the producer computed.
pub const COMPUTE_RING_AHEAD: u32 = COMPUTE_RING_STAGES - 2;

/// The producer role that computes, as `docs/performance.md` ("2026-12-05, last hours")
/// designs it for the chunk kernel, in its smallest form: per stage a `loaded`, a `ready` and an
/// `empty` mbarrier. A producer warp loads each round's 16 bytes a lane with `cp.async` into the
/// round's stage ([`COMPUTE_RING_AHEAD`] rounds ahead, once the stage's `empty` phase says the
/// consumer is done with it), completing on `loaded` through `cp.async.mbarrier.arrive.noinc`;
/// then, for the round it computes, it waits for `loaded`, writes each lane's result (the next
/// lane's first word plus `1000 (round + 1)`) to the stage's output slot, meets at its named
/// barrier, and one elected lane arrives on `ready`. A consumer warp waits for `ready` alone,
/// reads the output and the loaded input (its lane's second word), writes both out, and
/// arrives on `empty`. Shared memory: the 9 mbarriers, then the input slots (512 bytes a
/// stage), then the output slots (128 bytes a stage).
pub fn compute_ring_program(fault: ComputeRingFault) -> ThreadProgram {
    const S: u32 = COMPUTE_RING_STAGES;
    let mut p = P::new();
    let mut label = 0;
    let t = tid(&mut p);
    let base = p.reg(RegClass::B32);
    p.op(Op::SharedBase { d: base });
    let at = |p: &mut P, offset: u32| {
        let r = p.reg(RegClass::B32);
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: r, a: Src::Reg(base), b: Src::Imm(i64::from(offset)) });
        r
    };
    let loaded: Vec<Reg> = (0..S).map(|s| at(&mut p, 8 * s)).collect();
    let ready: Vec<Reg> = (0..S).map(|s| at(&mut p, 8 * (S + s))).collect();
    let empty: Vec<Reg> = (0..S).map(|s| at(&mut p, 8 * (2 * S + s))).collect();
    let (inputs, outputs) = (128, 128 + S * 512);
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    for s in 0..S as usize {
        p.guarded(first, Op::MbarrierInit { addr: loaded[s], count: 32 });
        p.guarded(first, Op::MbarrierInit { addr: ready[s], count: 1 });
        p.guarded(first, Op::MbarrierInit { addr: empty[s], count: 32 });
    }
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    let lane = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: lane, a: Src::Reg(t), b: Src::Imm(31) });
    // This lane's 16 bytes of stage 0's input and 4 bytes of its output.
    let in_slot = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: in_slot, a: Src::Reg(lane), b: Src::Imm(16), c: Src::Reg(base) });
    let out_slot = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: out_slot, a: Src::Reg(lane), b: Src::Imm(4), c: Src::Reg(base) });
    let state = p.reg(RegClass::B64);
    let (consumer, end) = (1000, 1001);
    consumers_branch_to(&mut p, t, consumer);

    // The producer warp.
    let input = lane_global_source(&mut p, lane, "input", 16);
    // The next lane's 16 bytes of stage 0's input.
    let next_slot = next_lane_slot(&mut p, lane, base);
    let is_elected = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: is_elected, a: Src::Reg(lane), b: Src::Imm(0) });
    let load = |p: &mut P, label: &mut u32, round: u32| {
        let s = (round % S) as usize;
        wait_phase(p, empty[s], (round / S + 1) % 2, label);
        let (src, dst) = (p.reg(RegClass::B64), p.reg(RegClass::B32));
        let from = i64::from(round * 32 * 16);
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::S64, d: src, a: Src::Reg(input), b: Src::Imm(from) });
        let to = i64::from(inputs + s as u32 * 512);
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: dst, a: Src::Reg(in_slot), b: Src::Imm(to) });
        p.op(Op::CpAsync { dst, src, src_bytes: Src::Imm(16) });
        p.op(Op::CpAsyncMbarrierArrive { addr: loaded[s] });
    };
    let ahead = if fault == ComputeRingFault::LoadsAllStagesAhead { S } else { COMPUTE_RING_AHEAD };
    for round in 0..ahead.min(COMPUTE_RING_ROUNDS) {
        load(&mut p, &mut label, round);
    }
    let word = p.reg(RegClass::B32);
    for round in 0..COMPUTE_RING_ROUNDS {
        if round + ahead < COMPUTE_RING_ROUNDS {
            load(&mut p, &mut label, round + ahead);
        }
        let s = (round % S) as usize;
        if fault != ComputeRingFault::ProducerSkipsLoadedWait {
            wait_phase(&mut p, loaded[s], (round / S) % 2, &mut label);
        }
        let offset = i64::from(inputs + s as u32 * 512);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![word], addr: next_slot, offset });
        let plus = i64::from(1000 * (round + 1));
        p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: word, a: Src::Reg(word), b: Src::Imm(plus) });
        let offset = i64::from(outputs + s as u32 * 128);
        p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: out_slot, offset, vals: vec![Src::Reg(word)] });
        // The warp's writes, then one arrival that releases them all.
        let arrive = Op::MbarrierArrive { state, addr: ready[s] };
        let warp_barrier = Op::Bar { id: Src::Imm(1), count: Some(32), reach: BarrierReach::SameInstruction };
        match fault {
            ComputeRingFault::NoReadyArrival => p.op(warp_barrier),
            ComputeRingFault::ArrivesBeforeWarpBarrier => {
                p.guarded(is_elected, arrive);
                p.op(warp_barrier);
            }
            _ => {
                p.op(warp_barrier);
                p.guarded(is_elected, arrive);
            }
        }
    }
    p.op(Op::Bra { target: end });

    // The consumer warp.
    p.op(Op::Label(consumer));
    let out = per_thread_global(&mut p, lane, "out", 8);
    let (result, own) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
    for round in 0..COMPUTE_RING_ROUNDS {
        let s = (round % S) as usize;
        if fault != ComputeRingFault::ConsumerSkipsReadyWait {
            wait_phase(&mut p, ready[s], (round / S) % 2, &mut label);
        }
        let offset = i64::from(outputs + s as u32 * 128);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![result], addr: out_slot, offset });
        let offset = i64::from(inputs + s as u32 * 512 + 4);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![own], addr: in_slot, offset });
        let offset = i64::from(round * 32 * 8);
        let vals = vec![Src::Reg(result), Src::Reg(own)];
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals });
        p.op(Op::MbarrierArrive { state, addr: empty[s] });
    }
    p.op(Op::Label(end));
    p.op(Op::Ret);
    p.prog(64, outputs + S * 128, vec![("p_input".into(), Ty::U64), ("p_out".into(), Ty::U64)])
}

/// The input of [`compute_ring_program`]: byte `i` of the rounds' 32 lanes' 16 bytes is
/// `i * 7 + 3` (mod 256).
pub fn compute_ring_input() -> Vec<u8> {
    (0..COMPUTE_RING_ROUNDS * 32 * 16).map(|i| (i * 7 + 3) as u8).collect()
}

/// The arguments of [`compute_ring_program`]: the input and a zeroed output (8 bytes a lane
/// and round).
pub fn compute_ring_args() -> Vec<(String, SimArg)> {
    let out = vec![0; (COMPUTE_RING_ROUNDS * 32 * 8) as usize];
    vec![("input".to_string(), SimArg::Tensor(compute_ring_input())), ("out".to_string(), SimArg::Tensor(out))]
}

/// What [`compute_ring_program`] writes: per round and lane, the next lane's first input word
/// plus `1000 (round + 1)`, then the lane's own second word.
pub fn compute_ring_expected() -> Vec<u32> {
    let input = compute_ring_input();
    let word = |round: u32, lane: u32, w: u32| {
        let at = ((round * 32 + lane) * 16 + 4 * w) as usize;
        u32::from_le_bytes(input[at..at + 4].try_into().expect("4 bytes"))
    };
    let mut out = vec![];
    for round in 0..COMPUTE_RING_ROUNDS {
        for lane in 0..32 {
            out.push(word(round, (lane + 1) % 32, 0).wrapping_add(1000 * (round + 1)));
            out.push(word(round, lane, 1));
        }
    }
    out
}

/// Runs [`compute_ring_program`] in the simulator; returns its output as words.
pub fn run_compute_ring(fault: ComputeRingFault) -> Result<Vec<u32>, String> {
    let mut args = compute_ring_args();
    run(&compute_ring_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(ring_words(tensor(&args, "out")))
}

/// What a TMA test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TmaFault {
    None,
    NoWait,
    ArriveWithoutExpectTx,
    MisalignedBox,
    ExpectTxTooHigh,
    ExpectTxTooLow,
}

/// The TMA tests' map: a 100 x 20 bf16 tensor (rows padded to 208 bytes) in boxes of 64 x 16,
/// 128-byte swizzled.
pub const TMA_MAP: TensorMap = TensorMap::two_d(2, [100, 20], 208, [64, 16], Swizzle::B128);

/// Thread 0 copies the box at (`x`, `y`) into shared memory with TMA, completing on an
/// mbarrier it expects the box's bytes on; every thread waits for the phase and copies
/// 16-byte chunks of the shared box out.
pub fn tma_program(fault: TmaFault) -> ThreadProgram {
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
    p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
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
    p.guarded(first, Op::TmaLoad { dst, map, at: vec![x, y], mbar });
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
    // The arguments give the map itself (`tma_args`); the signature says what it maps.
    let m = TMA_MAP;
    let sig = kda_dsl::tma_choice::TensorMapSig {
        name: "map".into(),
        tensor: "t".into(),
        extents: m.extent[..2].iter().map(|e| e.to_string()).collect(),
        elem_bytes: m.elem_bytes,
        box_extent: m.box_extent[..2].to_vec(),
        swizzle: m.swizzle,
    };
    prog.params.push(("p_map".into(), ParamKind::TensorMap(sig)));
    prog
}

/// Element (`x`, `y`) of the TMA tests' tensor: distinct and never 0.
fn tma_value(x: u64, y: u64) -> u16 {
    (1 + x + 1000 * y) as u16
}

/// The arguments of [`tma_program`] with its box at `at`: the output (poisoned), the box's
/// coordinates, a [`TMA_MAP`] tensor of [`tma_value`]s and the map over it.
pub fn tma_args(at: [i32; 2]) -> Vec<(String, SimArg)> {
    let m = TMA_MAP;
    let row_stride = m.strides[0];
    let mut tensor = vec![0u8; (row_stride * m.extent[1]) as usize];
    for y in 0..m.extent[1] {
        for x in 0..m.extent[0] {
            let at = (y * row_stride + 2 * x) as usize;
            tensor[at..at + 2].copy_from_slice(&tma_value(x, y).to_le_bytes());
        }
    }
    vec![
        ("out".to_string(), SimArg::Tensor(vec![0xee; m.box_bytes() as usize])),
        ("x".to_string(), SimArg::I32(at[0])),
        ("y".to_string(), SimArg::I32(at[1])),
        ("t".to_string(), SimArg::Tensor(tensor)),
        ("map".to_string(), SimArg::TensorMap { tensor: "t".into(), map: m }),
    ]
}

/// The bytes TMA should put in shared memory for the box at `at`: the swizzled box, zero
/// outside the tensor.
pub fn tma_expected(at: [i32; 2]) -> Vec<u8> {
    let m = TMA_MAP;
    let mut expected = vec![0u8; m.box_bytes() as usize];
    for outer in 0..m.box_extent[1] {
        for inner in 0..m.box_extent[0] {
            let (gx, gy) = (i64::from(at[0]) + i64::from(inner), i64::from(at[1]) + i64::from(outer));
            let inside = (0..m.extent[0] as i64).contains(&gx) && (0..m.extent[1] as i64).contains(&gy);
            let v = if inside { tma_value(gx as u64, gy as u64) } else { 0 };
            let to = m.shared_offset([inner, outer, 0, 0, 0]) as usize;
            expected[to..to + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    expected
}

/// Runs [`tma_program`] in the simulator; returns the shared box's bytes as copied out and
/// [`tma_expected`].
pub fn run_tma(fault: TmaFault, at: [i32; 2]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut args = tma_args(at);
    run(&tma_program(fault), [1, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok((tensor(&args, "out").to_vec(), tma_expected(at)))
}

/// What a register-roles test program gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RolesFault {
    None,
    NoRegisterCap,
    Overcommit,
    CountNotMultipleOf8,
}

/// Three warpgroups under `.maxnreg 168`: the producer (warpgroup 0) returns registers down to
/// 40, the two consumers raise theirs to 232 (40 + 232 + 232 = 3 x 168), each role one branch.
pub fn roles_program(fault: RolesFault) -> ThreadProgram {
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

/// What a [`cluster_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClusterFault {
    None,
    /// No `barrier.cluster` between the peer's store and the block's own read.
    NoBarrier,
    /// `barrier.cluster.wait` with no arrive before it.
    WaitWithoutArrive,
    /// `mapa` to a rank past the cluster.
    RankPastTheCluster,
    /// The block reads its peer's word with `ld.shared::cluster` instead of receiving it.
    LoadFromThePeer,
    /// In the cluster's second block, warp 0 waits at a named barrier that warp 1 never
    /// reaches, so that block never arrives at `barrier.cluster`.
    PeerStuck,
}

/// Registers holding the thread's index, its block's rank in the cluster and the block's
/// index along x.
pub fn cluster_place(p: &mut P) -> (Reg, Reg, Reg) {
    let t = tid(p);
    let (rank, block) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
    p.op(Op::ReadSpecial { d: rank, sreg: Special::ClusterCtaRank });
    p.op(Op::ReadSpecial { d: block, sreg: Special::Ctaid(0) });
    (t, rank, block)
}

/// A new register holding `a + imm` (u32).
pub fn plus(p: &mut P, a: Reg, imm: i64) -> Reg {
    let d = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d, a: Src::Reg(a), b: Src::Imm(imm) });
    d
}

/// `barrier.cluster`: every thread of the cluster arrives, then waits for the rest.
pub fn meet_the_cluster(p: &mut P) {
    p.op(Op::ClusterBarrier { step: ClusterBarrierStep::Arrive });
    p.op(Op::ClusterBarrier { step: ClusterBarrierStep::Wait });
}

/// Stores `got` at word `block threads + t` of the output `out`.
pub fn store_thread_word(p: &mut P, block: Reg, threads: u32, t: Reg, got: Reg) {
    let index = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: index, a: Src::Reg(block), b: Src::Imm(i64::from(threads)), c: Src::Reg(t) });
    let out = per_thread_global(p, index, "out", 4);
    p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset: 0, vals: vec![Src::Reg(got)] });
}

/// Threads per block of [`cluster_program`].
pub const CLUSTER_THREADS: u32 = 64;

/// Blocks of [`cluster_program`]'s grid: two clusters of two.
pub const CLUSTER_GRID: u32 = 4;

/// Clusters of two blocks: every thread clears its own shared word and meets the cluster at
/// `barrier.cluster` (so no peer's store can come before the clearing), stores `1000 block +
/// thread` into the same word of its peer's shared memory (`mapa` of its own word to rank
/// `rank ^ 1`, `st.shared::cluster`), meets the cluster again, then copies its own word, which
/// the peer wrote, to the output.
pub fn cluster_program(fault: ClusterFault) -> ThreadProgram {
    let mut p = P::new();
    let (t, rank, block) = cluster_place(&mut p);
    let base = shared_at(&mut p, 0);
    let word = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: word, a: Src::Reg(t), b: Src::Imm(4), c: Src::Reg(base) });
    let peer = p.reg(RegClass::B32);
    let flip = if fault == ClusterFault::RankPastTheCluster { 2 } else { 1 };
    p.op(Op::Bin { op: BinKind::Xor, ty: Ty::B32, d: peer, a: Src::Reg(rank), b: Src::Imm(flip) });
    let remote = p.reg(RegClass::B32);
    p.op(Op::Mapa { d: remote, addr: word, rank: Src::Reg(peer) });
    let value = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: value, a: Src::Reg(block), b: Src::Imm(1000), c: Src::Reg(t) });
    let got = p.reg(RegClass::B32);
    p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: word, offset: 0, vals: vec![Src::Imm(0)] });
    if fault == ClusterFault::PeerStuck {
        let (second, warp0, stuck) = (p.reg(RegClass::Pred), p.reg(RegClass::Pred), p.reg(RegClass::Pred));
        p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: second, a: Src::Reg(rank), b: Src::Imm(1) });
        p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::U32, d: warp0, a: Src::Reg(t), b: Src::Imm(32) });
        p.op(Op::PredLogic { op: BinKind::And, d: stuck, a: second, b: warp0 });
        p.guarded(stuck, Op::Bar { id: Src::Imm(1), count: Some(64), reach: BarrierReach::SameInstruction });
    }
    meet_the_cluster(&mut p);
    if fault == ClusterFault::LoadFromThePeer {
        p.op(Op::Ld { space: Space::SharedCluster, ty: Ty::U32, d: vec![got], addr: remote, offset: 0 });
    } else {
        p.op(Op::St { space: Space::SharedCluster, ty: Ty::U32, addr: remote, offset: 0, vals: vec![Src::Reg(value)] });
        match fault {
            ClusterFault::NoBarrier => {}
            ClusterFault::WaitWithoutArrive => p.op(Op::ClusterBarrier { step: ClusterBarrierStep::Wait }),
            _ => {
                meet_the_cluster(&mut p);
            }
        }
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![got], addr: word, offset: 0 });
    }
    store_thread_word(&mut p, block, CLUSTER_THREADS, t, got);
    p.op(Op::Ret);
    ThreadProgram { cluster_blocks: 2, ..p.prog(CLUSTER_THREADS, CLUSTER_THREADS * 4, vec![("p_out".into(), Ty::U64)]) }
}

/// The argument of [`cluster_program`]: its output, a word per thread of the grid.
pub fn cluster_args() -> Vec<(String, SimArg)> {
    vec![("out".to_string(), SimArg::Tensor(vec![0; (CLUSTER_GRID * CLUSTER_THREADS * 4) as usize]))]
}

/// What [`cluster_program`] writes: each thread the word its peer block's same thread stored.
pub fn cluster_expected() -> Vec<u32> {
    (0..CLUSTER_GRID).flat_map(|b| (0..CLUSTER_THREADS).map(move |t| 1000 * (b ^ 1) + t)).collect()
}

/// Runs [`cluster_program`] in the simulator; returns its output words.
pub fn run_cluster(fault: ClusterFault) -> Result<Vec<u32>, String> {
    let mut args = cluster_args();
    run(&cluster_program(fault), [CLUSTER_GRID, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(ring_words(tensor(&args, "out")))
}

/// What [`cluster_ring_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClusterRingFault {
    None,
    /// The producer never waits for a stage to be empty: its stores outrun the consumer.
    ProducerSkipsEmptyWait,
    /// The consumer waits for its full stage at `.cta` scope, which does not acquire what the
    /// other block's `st.async`s released.
    ConsumerWaitsAtCtaScope,
    /// The consumer hands the stage back (its remote arrival) before reading it.
    ConsumerArrivesBeforeReading,
    /// No `fence.mbarrier_init.release.cluster` after the mbarriers' initialization.
    NoInitFence,
    /// A block barrier instead of `barrier.cluster` after the mbarriers' initialization.
    NoClusterBarrierAfterInit,
    /// No `barrier.cluster` before the blocks exit: the consumer's last arrivals reach a
    /// producer that has exited.
    NoClusterBarrierAtExit,
    /// The producer's stores complete its own block's mbarrier, not the consumer's.
    CompletesItsOwnBlock,
    /// Bulk copies: the producer's threads write the stage with no `fence.proxy.async`
    /// before the copy reads it.
    NoProxyFence,
    /// Bulk copies: the copying thread writes the stage again while the copy still reads it.
    WritesSourceWhileCopying,
}

/// How [`cluster_ring_program`]'s producer hands a stage to the consumer's block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClusterHandover {
    /// Each thread `st.async`s its word.
    StAsync,
    /// Each thread writes its word into the producer's own copy of the stage, fences the
    /// proxies, and after a block barrier one thread copies the stage over with
    /// `cp.async.bulk.shared::cluster.shared::cta`.
    BulkCopy,
}

/// Threads per block of [`cluster_ring_program`].
pub const CLUSTER_RING_THREADS: u32 = 64;
/// Its stages and rounds.
pub const CLUSTER_RING_STAGES: u32 = 2;
pub const CLUSTER_RING_ROUNDS: u32 = 6;
const CLUSTER_RING_STAGE_BYTES: u32 = CLUSTER_RING_THREADS * 4;

/// A ring across the two blocks of each cluster: the block of rank 0 produces, each of its
/// threads handing the word `1000 (round + 1) + 100000 cluster + thread` to the consumer's
/// stage (by `handover`, completing the consumer's `full` mbarrier of it); the block of rank 1
/// expects the stage's bytes on `full`, waits for them at `.cluster` scope, copies the word
/// of the thread after its own to the output, and arrives at the producer's `empty` mbarrier
/// of the stage (`mbarrier.arrive.release.cluster.shared::cluster`), which the producer waits
/// for before reusing it. `fence.mbarrier_init.release.cluster` and `barrier.cluster` after
/// the mbarriers' initialization, `barrier.cluster` before the end.
pub fn cluster_ring_program(handover: ClusterHandover, fault: ClusterRingFault) -> ThreadProgram {
    use ClusterRingFault as F;
    const S: u32 = CLUSTER_RING_STAGES;
    let mut p = P::new();
    let mut label = 0;
    let (t, rank, block) = cluster_place(&mut p);
    // Stages first, then `full` and `empty`, an mbarrier a stage each.
    let stages = shared_at(&mut p, 0);
    let full: Vec<Reg> = (0..S).map(|s| shared_at(&mut p, i64::from(S * CLUSTER_RING_STAGE_BYTES + 8 * s))).collect();
    let empty: Vec<Reg> =
        (0..S).map(|s| shared_at(&mut p, i64::from(S * CLUSTER_RING_STAGE_BYTES + 8 * (S + s)))).collect();
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    for s in 0..S as usize {
        p.guarded(first, Op::MbarrierInit { addr: full[s], count: 1 });
        p.guarded(first, Op::MbarrierInit { addr: empty[s], count: CLUSTER_RING_THREADS });
    }
    if fault != F::NoInitFence {
        p.guarded(first, Op::FenceMbarrierInit);
    }
    if fault == F::NoClusterBarrierAfterInit {
        p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
    } else {
        meet_the_cluster(&mut p);
    }
    let cluster = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Shr, ty: Ty::U32, d: cluster, a: Src::Reg(block), b: Src::Imm(1) });
    let (consumer, end) = (label, label + 1);
    label += 2;
    let consuming = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Ne, ty: Ty::U32, d: consuming, a: Src::Reg(rank), b: Src::Imm(0) });
    p.guarded(consuming, Op::Bra { target: consumer });

    // The producer: the consumer's stages and `full`s, through `mapa`.
    let word = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: word, a: Src::Reg(t), b: Src::Imm(4), c: Src::Reg(stages) });
    let remote_word = p.reg(RegClass::B32);
    p.op(Op::Mapa { d: remote_word, addr: word, rank: Src::Imm(1) });
    let completes: Vec<Reg> = (0..S as usize)
        .map(|s| {
            let r = p.reg(RegClass::B32);
            let target = if fault == F::CompletesItsOwnBlock { 0 } else { 1 };
            p.op(Op::Mapa { d: r, addr: full[s], rank: Src::Imm(target) });
            r
        })
        .collect();
    let cluster_value = p.reg(RegClass::B32);
    for round in 0..CLUSTER_RING_ROUNDS {
        let s = (round % S) as usize;
        if fault != F::ProducerSkipsEmptyWait {
            // The first pass over the stages waits for the phase before the first (parity 1).
            wait_phase_in(&mut p, empty[s], (round / S + 1) % 2, &mut label, MbarrierScope::Cluster);
        }
        p.op(Op::Mad { ty: Ty::U32, d: cluster_value, a: Src::Reg(cluster), b: Src::Imm(100_000), c: Src::Reg(t) });
        let value = plus(&mut p, cluster_value, i64::from(1000 * (round + 1)));
        let at = plus(&mut p, remote_word, i64::from(s as u32 * CLUSTER_RING_STAGE_BYTES));
        match handover {
            ClusterHandover::StAsync => {
                p.op(Op::StAsync { ty: Ty::B32, addr: at, vals: vec![Src::Reg(value)], mbar: completes[s] })
            }
            ClusterHandover::BulkCopy => {
                // Thread 0's own word and the consumer's are the stages' starts.
                let offset = i64::from(s as u32 * CLUSTER_RING_STAGE_BYTES);
                p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: word, offset, vals: vec![Src::Reg(value)] });
                if fault != F::NoProxyFence {
                    p.op(Op::FenceProxyAsync);
                }
                p.op(Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction });
                let src = plus(&mut p, word, offset);
                let copy = Op::BulkCopyToCluster { dst: at, src, bytes: CLUSTER_RING_STAGE_BYTES, mbar: completes[s] };
                p.guarded(first, copy);
                if fault == F::WritesSourceWhileCopying {
                    let again =
                        Op::St { space: Space::Shared, ty: Ty::U32, addr: word, offset, vals: vec![Src::Reg(value)] };
                    p.guarded(first, again);
                }
            }
        }
    }
    p.op(Op::Bra { target: end });

    // The consumer: the word of the thread after its own, and the producer's `empty`s.
    p.op(Op::Label(consumer));
    let next = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: next, a: Src::Reg(t), b: Src::Imm(1) });
    p.op(Op::Bin {
        op: BinKind::And,
        ty: Ty::B32,
        d: next,
        a: Src::Reg(next),
        b: Src::Imm(i64::from(CLUSTER_RING_THREADS - 1)),
    });
    let from = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: from, a: Src::Reg(next), b: Src::Imm(4), c: Src::Reg(stages) });
    let hand_back: Vec<Reg> = (0..S as usize)
        .map(|s| {
            let r = p.reg(RegClass::B32);
            p.op(Op::Mapa { d: r, addr: empty[s], rank: Src::Imm(0) });
            r
        })
        .collect();
    let index = p.reg(RegClass::B32);
    p.op(Op::Mad {
        ty: Ty::U32,
        d: index,
        a: Src::Reg(cluster),
        b: Src::Imm(i64::from(CLUSTER_RING_ROUNDS * CLUSTER_RING_THREADS)),
        c: Src::Reg(t),
    });
    let out = per_thread_global(&mut p, index, "out", 4);
    let (state, got) = (p.reg(RegClass::B64), p.reg(RegClass::B32));
    let scope = if fault == F::ConsumerWaitsAtCtaScope { MbarrierScope::Cta } else { MbarrierScope::Cluster };
    for round in 0..CLUSTER_RING_ROUNDS {
        let s = (round % S) as usize;
        p.guarded(first, Op::MbarrierArriveExpectTx { state, addr: full[s], bytes: CLUSTER_RING_STAGE_BYTES });
        wait_phase_in(&mut p, full[s], (round / S) % 2, &mut label, scope);
        if fault == F::ConsumerArrivesBeforeReading {
            p.op(Op::MbarrierArriveRemote { addr: hand_back[s] });
        }
        let offset = i64::from(s as u32 * CLUSTER_RING_STAGE_BYTES);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![got], addr: from, offset });
        if fault != F::ConsumerArrivesBeforeReading {
            p.op(Op::MbarrierArriveRemote { addr: hand_back[s] });
        }
        let offset = i64::from(round * CLUSTER_RING_THREADS * 4);
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals: vec![Src::Reg(got)] });
    }
    p.op(Op::Label(end));
    if fault != F::NoClusterBarrierAtExit {
        meet_the_cluster(&mut p);
    }
    p.op(Op::Ret);
    let shared = S * CLUSTER_RING_STAGE_BYTES + 16 * S;
    ThreadProgram { cluster_blocks: 2, ..p.prog(CLUSTER_RING_THREADS, shared, vec![("p_out".into(), Ty::U64)]) }
}

/// The argument of [`cluster_ring_program`] over `clusters` clusters: its output, a word per
/// consumer thread and round (poisoned).
pub fn cluster_ring_args(clusters: u32) -> Vec<(String, SimArg)> {
    let words = clusters * CLUSTER_RING_ROUNDS * CLUSTER_RING_THREADS;
    vec![("out".to_string(), SimArg::Tensor(vec![0xee; (words * 4) as usize]))]
}

/// What [`cluster_ring_program`] writes over `clusters` clusters: per cluster and round, each
/// consumer thread the word the producer's next thread stored.
pub fn cluster_ring_expected(clusters: u32) -> Vec<u32> {
    let mut out = vec![];
    for cluster in 0..clusters {
        for round in 0..CLUSTER_RING_ROUNDS {
            for t in 0..CLUSTER_RING_THREADS {
                out.push(1000 * (round + 1) + 100_000 * cluster + (t + 1) % CLUSTER_RING_THREADS);
            }
        }
    }
    out
}

/// Runs [`cluster_ring_program`] on two clusters in the simulator; returns its output words.
pub fn run_cluster_ring(handover: ClusterHandover, fault: ClusterRingFault) -> Result<Vec<u32>, String> {
    let mut args = cluster_ring_args(2);
    run(&cluster_ring_program(handover, fault), [4, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(ring_words(tensor(&args, "out")))
}

/// Threads per block of [`cluster_ping_pong_program`]: a warp.
pub const PING_PONG_THREADS: u32 = 32;

/// A ball sent back and forth between the two blocks of each cluster, `p_rounds` round trips
/// (a kernel parameter, so that a long run times one trip): each lane `st.async`s the value it
/// received plus one into the same word of the peer block, completing the peer's mbarrier (128
/// bytes a hop), and waits at `.cluster` scope for the reply on its own. The block of rank 0
/// serves 1 first and does not return the last ball. Each lane writes the last value its block
/// received: `2 rounds` in rank 0, `2 rounds - 1` in rank 1.
pub fn cluster_ping_pong_program() -> ThreadProgram {
    let mut p = P::new();
    let (t, rank, block) = cluster_place(&mut p);
    let base = shared_at(&mut p, 0);
    let full = shared_at(&mut p, i64::from(PING_PONG_THREADS * 4));
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    p.guarded(first, Op::MbarrierInit { addr: full, count: 1 });
    p.guarded(first, Op::FenceMbarrierInit);
    meet_the_cluster(&mut p);
    let word = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: word, a: Src::Reg(t), b: Src::Imm(4), c: Src::Reg(base) });
    let peer = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Xor, ty: Ty::B32, d: peer, a: Src::Reg(rank), b: Src::Imm(1) });
    let (peer_word, peer_full) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
    p.op(Op::Mapa { d: peer_word, addr: word, rank: Src::Reg(peer) });
    p.op(Op::Mapa { d: peer_full, addr: full, rank: Src::Reg(peer) });
    let rounds = p.reg(RegClass::B32);
    p.op(Op::LdParam { ty: Ty::S32, d: rounds, name: "p_rounds".into() });
    let serves = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: serves, a: Src::Reg(rank), b: Src::Imm(0) });
    p.guarded(serves, Op::StAsync { ty: Ty::B32, addr: peer_word, vals: vec![Src::Imm(1)], mbar: peer_full });
    let (i, parity, got, ball) =
        (p.reg(RegClass::B32), p.reg(RegClass::B32), p.reg(RegClass::B32), p.reg(RegClass::B32));
    p.op(Op::Mov { ty: Ty::U32, d: i, a: Src::Imm(0) });
    let state = p.reg(RegClass::B64);
    let (ready, last, more) = (p.reg(RegClass::Pred), p.reg(RegClass::Pred), p.reg(RegClass::Pred));
    p.op(Op::Label(0));
    p.guarded(first, Op::MbarrierArriveExpectTx { state, addr: full, bytes: PING_PONG_THREADS * 4 });
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: parity, a: Src::Reg(i), b: Src::Imm(1) });
    p.op(Op::Label(1));
    let wait = MbarrierWaitKind::Try;
    p.op(Op::MbarrierWait {
        d: ready,
        addr: full,
        parity: Src::Reg(parity),
        kind: wait,
        scope: MbarrierScope::Cluster,
    });
    p.guarded(ready, Op::Bra { target: 2 });
    p.op(Op::Bra { target: 1 });
    p.op(Op::Label(2));
    p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![got], addr: word, offset: 0 });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: i, a: Src::Reg(i), b: Src::Imm(1) });
    // Rank 0 keeps the last ball; rank 1 returns every one.
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: last, a: Src::Reg(i), b: Src::Reg(rounds) });
    p.op(Op::PredLogic { op: BinKind::And, d: last, a: last, b: serves });
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: ball, a: Src::Reg(got), b: Src::Imm(1) });
    p.unless(last, Op::StAsync { ty: Ty::B32, addr: peer_word, vals: vec![Src::Reg(ball)], mbar: peer_full });
    p.op(Op::Setp { cmp: Cmp::Lt, ty: Ty::U32, d: more, a: Src::Reg(i), b: Src::Reg(rounds) });
    p.guarded(more, Op::Bra { target: 0 });
    // Both blocks stay until the last ball landed.
    meet_the_cluster(&mut p);
    store_thread_word(&mut p, block, PING_PONG_THREADS, t, got);
    p.op(Op::Ret);
    let params = vec![("p_out".into(), Ty::U64), ("p_rounds".into(), Ty::S32)];
    ThreadProgram { cluster_blocks: 2, ..p.prog(PING_PONG_THREADS, PING_PONG_THREADS * 4 + 8, params) }
}

/// The arguments of [`cluster_ping_pong_program`] over `blocks` blocks: the output (a word a
/// thread, poisoned) and the round trips.
pub fn cluster_ping_pong_args(blocks: u32, rounds: i32) -> Vec<(String, SimArg)> {
    vec![
        ("out".to_string(), SimArg::Tensor(vec![0xee; (blocks * PING_PONG_THREADS * 4) as usize])),
        ("rounds".to_string(), SimArg::I32(rounds)),
    ]
}

/// What [`cluster_ping_pong_program`] writes over `blocks` blocks after `rounds` round trips.
pub fn cluster_ping_pong_expected(blocks: u32, rounds: u32) -> Vec<u32> {
    (0..blocks).flat_map(|b| (0..PING_PONG_THREADS).map(move |_| 2 * rounds - b % 2)).collect()
}

/// What [`cluster_turns_program`] gets wrong on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TurnsFault {
    None,
    /// A producer fills a stage without waiting for both blocks' consumers to release it.
    ProducerSkipsEmptyWait,
    /// The consumers hand each stage back to their own block's `empty`, not to the block
    /// whose producer fills the stage next.
    ArrivesOnOwnEmpty,
    /// A consumer does not expect the bytes of a stage another block's producer copies in.
    NoExpectTx,
    /// The consumers wait for `ready` at `.cta` scope.
    ConsumerWaitsAtCtaScope,
    /// The producer writes its stage with no `fence.proxy.async` before the bulk copy.
    NoProxyFence,
}

/// [`cluster_turns_program`]'s stages (more than the cluster's two producers) and rounds.
pub const TURNS_STAGES: u32 = 3;
pub const TURNS_ROUNDS: u32 = 8;
const TURNS_STAGE_BYTES: u32 = 32 * 4;

/// The hand-over the cluster design of `docs/performance.md` plans for a producer ring, in
/// its smallest form: the producers of a cluster's two blocks take turns at the rounds (block
/// `round % 2` produces), and every round reaches both blocks' consumers. Warp 0 of each block
/// produces: for its round `j` at stage `s = j % 3`, it waits (from `j = 3` on) for its own
/// `empty[s]` at `.cluster` scope, writes `1000 (j + 1) + 100000 cluster + lane` into its
/// own copy of the stage, fences the proxies, meets its warp's barrier, and lane 0 copies the
/// stage into the other block (a bulk copy completing that block's `ready[s]`) and arrives on
/// its own `ready[s]`. Warp 1 consumes every round: where the other block produces it, lane 0
/// expects the stage's bytes on `ready[s]`; every lane waits for `ready[s]` at `.cluster`
/// scope, copies the word of the lane after its own to the output, and arrives on the
/// `empty[s]` of the block that produces round `i + 3` (both blocks' consumers release a
/// stage before its next producer fills it: a count of 64).
pub fn cluster_turns_program(fault: TurnsFault) -> ThreadProgram {
    const S: u32 = TURNS_STAGES;
    let mut p = P::new();
    let mut label = 0;
    let (t, rank, block) = cluster_place(&mut p);
    let stages = shared_at(&mut p, 0);
    let ready: Vec<Reg> = (0..S).map(|s| shared_at(&mut p, i64::from(S * TURNS_STAGE_BYTES + 8 * s))).collect();
    let empty: Vec<Reg> = (0..S).map(|s| shared_at(&mut p, i64::from(S * TURNS_STAGE_BYTES + 8 * (S + s)))).collect();
    let first = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::S32, d: first, a: Src::Reg(t), b: Src::Imm(0) });
    for s in 0..S as usize {
        p.guarded(first, Op::MbarrierInit { addr: ready[s], count: 1 });
        p.guarded(first, Op::MbarrierInit { addr: empty[s], count: 64 });
    }
    p.guarded(first, Op::FenceMbarrierInit);
    meet_the_cluster(&mut p);
    let lane = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: lane, a: Src::Reg(t), b: Src::Imm(31) });
    let word = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: word, a: Src::Reg(lane), b: Src::Imm(4), c: Src::Reg(stages) });
    let lane0 = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: lane0, a: Src::Reg(lane), b: Src::Imm(0) });
    let cluster = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Shr, ty: Ty::U32, d: cluster, a: Src::Reg(block), b: Src::Imm(1) });
    let peer = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Xor, ty: Ty::B32, d: peer, a: Src::Reg(rank), b: Src::Imm(1) });
    let (consumer, end) = (label, label + 1);
    label += 2;
    consumers_branch_to(&mut p, t, consumer);

    // The producers: each block its own rounds, unrolled.
    let second = p.reg(RegClass::Pred);
    p.op(Op::Setp { cmp: Cmp::Eq, ty: Ty::U32, d: second, a: Src::Reg(rank), b: Src::Imm(1) });
    let (rank1, state) = (label, p.reg(RegClass::B64));
    label += 1;
    let base = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: base, a: Src::Reg(cluster), b: Src::Imm(100_000), c: Src::Reg(lane) });
    for r in 0..2u32 {
        if r == 0 {
            p.guarded(second, Op::Bra { target: rank1 });
        } else {
            p.op(Op::Label(rank1));
        }
        let mut waits = [0u32; S as usize];
        for j in (r..TURNS_ROUNDS).step_by(2) {
            let s = (j % S) as usize;
            if j >= S && fault != TurnsFault::ProducerSkipsEmptyWait {
                wait_phase_in(&mut p, empty[s], waits[s] % 2, &mut label, MbarrierScope::Cluster);
                waits[s] += 1;
            }
            let value = plus(&mut p, base, i64::from(1000 * (j + 1)));
            let offset = i64::from(s as u32 * TURNS_STAGE_BYTES);
            p.op(Op::St { space: Space::Shared, ty: Ty::U32, addr: word, offset, vals: vec![Src::Reg(value)] });
            if fault != TurnsFault::NoProxyFence {
                p.op(Op::FenceProxyAsync);
            }
            p.op(Op::Bar { id: Src::Imm(1), count: Some(32), reach: BarrierReach::SameInstruction });
            let src = plus(&mut p, stages, offset);
            let (dst, peer_ready) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
            p.op(Op::Mapa { d: dst, addr: src, rank: Src::Reg(peer) });
            p.op(Op::Mapa { d: peer_ready, addr: ready[s], rank: Src::Reg(peer) });
            p.guarded(lane0, Op::BulkCopyToCluster { dst, src, bytes: TURNS_STAGE_BYTES, mbar: peer_ready });
            p.guarded(lane0, Op::MbarrierArrive { state, addr: ready[s] });
        }
        p.op(Op::Bra { target: end });
    }

    // The consumers: every round, whichever block produced it.
    p.op(Op::Label(consumer));
    let next = p.reg(RegClass::B32);
    p.op(Op::Mad { ty: Ty::U32, d: next, a: Src::Reg(lane), b: Src::Imm(4), c: Src::Imm(4) });
    p.op(Op::Bin { op: BinKind::And, ty: Ty::B32, d: next, a: Src::Reg(next), b: Src::Imm(127) });
    let from = p.reg(RegClass::B32);
    p.op(Op::Bin { op: BinKind::Add, ty: Ty::U32, d: from, a: Src::Reg(next), b: Src::Reg(stages) });
    let index = p.reg(RegClass::B32);
    p.op(Op::Mad {
        ty: Ty::U32,
        d: index,
        a: Src::Reg(block),
        b: Src::Imm(i64::from(TURNS_ROUNDS * 32)),
        c: Src::Reg(lane),
    });
    let out = per_thread_global(&mut p, index, "out", 4);
    let (got, remote) = (p.reg(RegClass::B32), p.reg(RegClass::Pred));
    let arms = p.reg(RegClass::Pred);
    let scope = if fault == TurnsFault::ConsumerWaitsAtCtaScope { MbarrierScope::Cta } else { MbarrierScope::Cluster };
    for i in 0..TURNS_ROUNDS {
        let s = (i % S) as usize;
        // Block `i % 2` produces round `i`.
        p.op(Op::Setp { cmp: Cmp::Ne, ty: Ty::U32, d: remote, a: Src::Reg(rank), b: Src::Imm(i64::from(i % 2)) });
        p.op(Op::PredLogic { op: BinKind::And, d: arms, a: remote, b: lane0 });
        if fault != TurnsFault::NoExpectTx {
            p.guarded(arms, Op::MbarrierArriveExpectTx { state, addr: ready[s], bytes: TURNS_STAGE_BYTES });
        }
        wait_phase_in(&mut p, ready[s], (i / S) % 2, &mut label, scope);
        let offset = i64::from(s as u32 * TURNS_STAGE_BYTES);
        p.op(Op::Ld { space: Space::Shared, ty: Ty::U32, d: vec![got], addr: from, offset });
        if i + S < TURNS_ROUNDS {
            let to =
                if fault == TurnsFault::ArrivesOnOwnEmpty { Src::Reg(rank) } else { Src::Imm(i64::from((i + S) % 2)) };
            let hand_back = p.reg(RegClass::B32);
            p.op(Op::Mapa { d: hand_back, addr: empty[s], rank: to });
            p.op(Op::MbarrierArriveRemote { addr: hand_back });
        }
        let offset = i64::from(i * 32 * 4);
        p.op(Op::St { space: Space::Global, ty: Ty::U32, addr: out, offset, vals: vec![Src::Reg(got)] });
    }
    p.op(Op::Label(end));
    meet_the_cluster(&mut p);
    p.op(Op::Ret);
    let shared = S * TURNS_STAGE_BYTES + 16 * S;
    ThreadProgram { cluster_blocks: 2, ..p.prog(64, shared, vec![("p_out".into(), Ty::U64)]) }
}

/// The argument of [`cluster_turns_program`] over `clusters` clusters: its output, a word per
/// consumer lane, round and block (poisoned).
pub fn cluster_turns_args(clusters: u32) -> Vec<(String, SimArg)> {
    vec![("out".to_string(), SimArg::Tensor(vec![0xee; (clusters * 2 * TURNS_ROUNDS * 32 * 4) as usize]))]
}

/// What [`cluster_turns_program`] writes over `clusters` clusters: per block, round and lane,
/// the word of the next lane of that round's producer.
pub fn cluster_turns_expected(clusters: u32) -> Vec<u32> {
    let mut out = vec![];
    for block in 0..2 * clusters {
        for round in 0..TURNS_ROUNDS {
            for lane in 0..32 {
                out.push(1000 * (round + 1) + 100_000 * (block / 2) + (lane + 1) % 32);
            }
        }
    }
    out
}

/// Runs [`cluster_turns_program`] on two clusters in the simulator; returns its output words.
pub fn run_cluster_turns(fault: TurnsFault) -> Result<Vec<u32>, String> {
    let mut args = cluster_turns_args(2);
    run(&cluster_turns_program(fault), [4, 1, 1], &mut args).map_err(|e| e.to_string())?;
    Ok(ring_words(tensor(&args, "out")))
}
