//! The thread IR: per-thread instructions with explicit `mma`, `wgmma`, `ldmatrix`, `cp.async`, `shfl`
//! and barriers. It is also the PTX AST: each instruction prints as one PTX line, and the
//! simulator runs exactly this list.

use crate::diag::SrcLoc;
use std::fmt;

/// Register classes; each is numbered separately, in emission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// `.pred` (`%p`).
    Pred,
    /// `.b16` (`%h`).
    B16,
    /// `.b32` (`%r`): integers and packed half pairs.
    B32,
    /// `.b64` (`%rd`): addresses and 64-bit integers.
    B64,
    /// `.f32` (`%f`).
    F32,
}

impl RegClass {
    /// PTX name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%h",
            RegClass::B32 => "%r",
            RegClass::B64 => "%rd",
            RegClass::F32 => "%f",
        }
    }
    /// PTX declaration type.
    pub fn decl(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::B64 => ".b64",
            RegClass::F32 => ".f32",
        }
    }
    /// All classes, in declaration order.
    pub const ALL: [RegClass; 5] = [RegClass::Pred, RegClass::B16, RegClass::B32, RegClass::B64, RegClass::F32];
}

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg {
    /// Class.
    pub class: RegClass,
    /// Number within the class.
    pub id: u32,
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.class.prefix(), self.id)
    }
}

/// An instruction operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    /// A register.
    Reg(Reg),
    /// An integer immediate.
    Imm(i64),
    /// An f32 immediate (printed as its exact bit pattern).
    F32(f32),
}

impl From<Reg> for Src {
    fn from(r: Reg) -> Src {
        Src::Reg(r)
    }
}

impl fmt::Display for Src {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Src::Reg(r) => write!(f, "{r}"),
            Src::Imm(v) => write!(f, "{v}"),
            Src::F32(v) => write!(f, "0f{:08X}", v.to_bits()),
        }
    }
}

/// Operation types (the PTX type suffix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    /// `.pred`
    Pred,
    /// `.b16`
    B16,
    /// `.b32`
    B32,
    /// `.b64`
    B64,
    /// `.u32`
    U32,
    /// `.s32`
    S32,
    /// `.u64`
    U64,
    /// `.s64`
    S64,
    /// `.f32`
    F32,
    /// `.f16`
    F16,
    /// `.bf16`
    BF16,
}

impl Ty {
    /// Suffix text.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Pred => "pred",
            Ty::B16 => "b16",
            Ty::B32 => "b32",
            Ty::B64 => "b64",
            Ty::U32 => "u32",
            Ty::S32 => "s32",
            Ty::U64 => "u64",
            Ty::S64 => "s64",
            Ty::F32 => "f32",
            Ty::F16 => "f16",
            Ty::BF16 => "bf16",
        }
    }
    /// Width in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Ty::Pred => 1,
            Ty::B16 | Ty::F16 | Ty::BF16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 => 8,
        }
    }
}

/// Two-operand arithmetic and logic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinKind {
    /// `add`
    Add,
    /// `sub`
    Sub,
    /// `mul.lo` (integers) / `mul.rn` (f32)
    Mul,
    /// `div` (integers) / `div.rn` (f32)
    Div,
    /// `rem`
    Rem,
    /// `min`
    Min,
    /// `max`
    Max,
    /// `and`
    And,
    /// `or`
    Or,
    /// `xor`
    Xor,
    /// `shl`
    Shl,
    /// `shr`
    Shr,
}

/// One-operand operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnKind {
    /// `neg`
    Neg,
    /// `abs`
    Abs,
    /// `not`
    Not,
    /// `ex2.approx.ftz.f32`
    Ex2,
    /// `lg2.approx.ftz.f32`
    Lg2,
    /// `rsqrt.approx.ftz.f32`
    Rsqrt,
    /// `sqrt.rn.f32`
    Sqrt,
    /// `rcp.approx.ftz.f32`: within an ulp or two, one instruction (`rcp.rn` adds a
    /// Newton step and a slow-path branch); `sigmoid` is its one user.
    Rcp,
}

/// Comparisons for `setp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `lt`
    Lt,
    /// `le`
    Le,
    /// `gt`
    Gt,
    /// `ge`
    Ge,
    /// `eq`
    Eq,
    /// `ne`
    Ne,
}

pub use crate::cache_policy::CachePolicy;

/// The register holding the `createpolicy` L2 evict-first policy of cache-hinted `cp.async`.
pub const EVICT_FIRST_POLICY: &str = "%l2_evict_first";

/// Memory spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// `.global`
    Global,
    /// `.shared`
    Shared,
    /// `.shared::cluster`: the shared memory of any block of the thread's cluster, at an
    /// address `mapa` made (or the block's own `.shared` address).
    SharedCluster,
}

/// Special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    /// `%tid.x`
    Tid,
    /// `%ctaid.{x,y,z}`
    Ctaid(u8),
    /// `%cluster_ctarank`: the block's rank in its cluster.
    ClusterCtaRank,
}

/// The two halves of `barrier.cluster`, which every thread of every block of the cluster runs
/// (`.aligned`: all of a warp together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterBarrierStep {
    /// `barrier.cluster.arrive.release.aligned`: the thread's earlier memory accesses are
    /// released to the cluster.
    Arrive,
    /// `barrier.cluster.wait.acquire.aligned`: waits until every thread of the cluster has
    /// arrived since this thread's last wait, acquiring what they released.
    Wait,
}

/// How a thread waits for an mbarrier's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MbarrierWaitKind {
    /// `mbarrier.try_wait` (sm_90): may suspend the thread for a while before answering.
    Try,
    /// `mbarrier.test_wait` (sm_80): answers at once; the caller spins.
    Test,
}

impl MbarrierWaitKind {
    /// The wait `target` has: `try_wait` from sm_90 on.
    pub fn for_target(target: crate::target::Target) -> Self {
        if target.has(crate::target::Target::Sm90) {
            MbarrierWaitKind::Try
        } else {
            MbarrierWaitKind::Test
        }
    }
}

/// Whose releases an `mbarrier` wait acquires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MbarrierScope {
    /// `.acquire.cta` (the default): the block's own threads' arrivals.
    Cta,
    /// `.acquire.cluster`: also the arrivals and `st.async` completions that other blocks of
    /// the cluster made on it (`.release.cluster`).
    Cluster,
}

/// Where the threads that meet at a barrier reach it from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BarrierReach {
    /// Every thread that takes part at this one instruction: `bar.sync`, which is PTX's
    /// `barrier.sync.aligned` (undefined behaviour otherwise, and compute-sanitizer's synccheck
    /// reports it).
    SameInstruction,
    /// From different instructions: `barrier.sync`. The fill warps and the compute warps pass
    /// a pipelined loop's barriers in copies of the loop of their own.
    AnyInstruction,
}

/// `shfl.sync` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShflMode {
    /// XOR lane.
    Bfly,
    /// `lane - delta`.
    Up,
    /// `lane + delta`.
    Down,
    /// A given lane.
    Idx,
}

/// A thread-IR operation. Field names follow PTX operand order: `d` is the destination, `a`,
/// `b`, `c` the sources, `ty` the instruction type, `addr` + `offset` an address; each variant's
/// doc is the PTX it prints as.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are named by the convention above
pub enum Op {
    /// `mov.ty d, a`
    Mov { ty: Ty, d: Reg, a: Src },
    /// `mov.u32 d, %special`
    ReadSpecial { d: Reg, sreg: Special },
    /// `mov.u32 d, smem` (the dynamic shared base address)
    SharedBase { d: Reg },
    /// `ld.param.ty d, [name]`
    LdParam { ty: Ty, d: Reg, name: String },
    /// `cvta.to.global.u64 d, a`
    CvtaGlobal { d: Reg, a: Reg },
    /// Binary arithmetic.
    Bin { op: BinKind, ty: Ty, d: Reg, a: Src, b: Src },
    /// `mul.wide.ty d, a, b` (32 x 32 -> 64 bits)
    MulWide { ty: Ty, d: Reg, a: Src, b: Src },
    /// `mad.lo.ty` (integers) / `fma.rn.f32`: `d = a * b + c`
    Mad { ty: Ty, d: Reg, a: Src, b: Src, c: Src },
    /// Unary arithmetic and approximate math.
    Un { op: UnKind, ty: Ty, d: Reg, a: Src },
    /// `setp.cmp.ty d, a, b`
    Setp { cmp: Cmp, ty: Ty, d: Reg, a: Src, b: Src },
    /// `and/or/not` on predicates: `d = a op b`
    PredLogic { op: BinKind, d: Reg, a: Reg, b: Reg },
    /// `selp.ty d, a, b, p`
    Selp { ty: Ty, d: Reg, a: Src, b: Src, p: Reg },
    /// `cvt[.rnd].dty.sty d, a`
    Cvt { dty: Ty, sty: Ty, d: Reg, a: Src },
    /// `cvt.rn.{bf16,f16}x2.f32 d, hi, lo`: packs two rounded floats (`hi` in the upper half).
    PackHalf2 { half: Ty, d: Reg, hi: Src, lo: Src },
    /// `mov.b32 {lo, hi}, a`: splits a packed pair.
    Unpack2 { lo: Reg, hi: Reg, a: Reg },
    /// `ld.space[.v2|.v4].ty {d..}, [addr + offset]`
    Ld { space: Space, ty: Ty, d: Vec<Reg>, addr: Reg, offset: i64 },
    /// `st.space[.v2|.v4].ty [addr + offset], {vals..}`
    St { space: Space, ty: Ty, addr: Reg, offset: i64, vals: Vec<Src> },
    /// `mapa.shared::cluster.u32 d, addr, rank`: the `.shared::cluster` address of the byte at
    /// this block's shared address `addr` in the block of rank `rank` of the cluster.
    Mapa { d: Reg, addr: Reg, rank: Src },
    /// One half of `barrier.cluster` ([`ClusterBarrierStep`]).
    ClusterBarrier { step: ClusterBarrierStep },
    /// `ld.acquire.gpu.global.u32 d, [addr + offset]`: reads a flag word another block
    /// releases, acquiring (at the device's scope) what the release ordered before it.
    LdAcquire { d: Reg, addr: Reg, offset: i64 },
    /// `st.release.gpu.global.u32 [addr + offset], a`: sets a flag word, releasing (at the
    /// device's scope) the thread's earlier accesses, and what it acquired, to whoever acquires
    /// the word.
    StRelease { addr: Reg, offset: i64, a: Src },
    /// `red.release.gpu.global.add.u32 [addr + offset], a`: adds to a flag word atomically,
    /// releasing as [`Op::StRelease`] does (a count of arrivals: every release it adds to stays
    /// acquired by a read of the sum).
    RedReleaseAdd { addr: Reg, offset: i64, a: Src },
    /// `cp.async.cg.shared.global [dst], [src], 16, src_bytes` (bytes past `src_bytes` are zero)
    CpAsync { dst: Reg, src: Reg, src_bytes: Src },
    /// `prefetch.global.L2 [addr]`: a hint; the line containing `addr` moves into L2.
    Prefetch { addr: Reg },
    /// `cp.async.commit_group`
    CpAsyncCommit,
    /// `cp.async.wait_group n`
    CpAsyncWait { n: u32 },
    /// `ldmatrix.sync.aligned.m8n8.x{2,4}[.trans].shared.b16 {d..}, [addr]`: one matrix a
    /// register of `d` (2 or 4), matrix `q`'s rows addressed by lanes `8q .. 8q + 8`.
    Ldmatrix { trans: bool, d: Vec<Reg>, addr: Reg },
    /// `movmatrix.sync.aligned.m8n8.trans.b16 d, a`: the warp's 8 x 8 matrix of 16-bit
    /// pairs (lane `l` holds row `l / 4`, columns `2 (l % 4)` and `2 (l % 4) + 1`), transposed
    /// in the same layout.
    Movmatrix { d: Reg, a: Reg },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32 {d}, {a}, {b}, {c}`
    Mma { ab: Ty, d: [Reg; 4], a: [Reg; 4], b: [Reg; 2], c: [Reg; 4] },
    /// `wgmma.fence.sync.aligned`: orders the warpgroup's register accesses before the
    /// `wgmma`s that follow (needed before the first, and after any other instruction wrote an
    /// accumulator or A register a `wgmma` uses).
    WgmmaFence,
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {d}, a, b, accumulate, 1, 1[, trans-a], trans-b`:
    /// the warpgroup's 64 x `n` f32 accumulator `d` (`n / 2` registers per thread, in
    /// [`crate::hopper_layout::WgmmaFragment::Accumulator`]'s layout) plus A (64 x 16) times Bᵀ
    /// (B `n` x 16 in shared memory); `d` is overwritten when the predicate `accumulate` is
    /// false. Asynchronous: `d` (and A's registers) belong to the instruction until a
    /// `wgmma.wait_group` retires its group.
    Wgmma { ab: Ty, n: u32, d: Vec<Reg>, a: WgmmaA, b: SharedOperand, accumulate: Reg },
    /// `wgmma.commit_group.sync.aligned`: the `wgmma`s since the last commit become a group.
    WgmmaCommit,
    /// `wgmma.wait_group.sync.aligned n`: waits until at most `n` groups are pending.
    WgmmaWait { n: u32 },
    /// `setmaxnreg.{inc,dec}.sync.aligned.u32 count`: the warpgroup's registers per thread
    /// become `count` (24 to 256, a multiple of 8), raised from or returned to the block's pool.
    SetMaxNReg { raise: bool, count: u32 },
    /// `fence.proxy.async.shared::cta`: this thread's earlier shared-memory writes become
    /// visible to the async proxy (the `wgmma` descriptors' reads).
    FenceProxyAsync,
    /// `mbarrier.init.shared.b64 [addr], count`: a barrier object in 8 shared bytes whose
    /// phases complete after `count` arrivals each.
    MbarrierInit { addr: Reg, count: u32 },
    /// `mbarrier.arrive.shared.b64 state, [addr]`: one arrival, releasing this thread's
    /// earlier shared accesses to whoever waits for the phase.
    MbarrierArrive { state: Reg, addr: Reg },
    /// `cp.async.mbarrier.arrive.noinc.shared.b64 [addr]`: one arrival on the mbarrier at
    /// `addr` once every `cp.async` this thread issued before it has landed, releasing their
    /// bytes to whoever waits for the phase; `.noinc`, so the arrival counts among the phase's
    /// (the `init` count includes the copying threads). The copies need no `wait_group`.
    CpAsyncMbarrierArrive { addr: Reg },
    /// `mbarrier.try_wait.parity[.acquire.cluster].shared.b64 d, [addr], parity` (or
    /// `test_wait`, by `kind`): `d` is whether the phase of parity `parity` completed
    /// (acquiring what its arrivals released, within `scope`).
    MbarrierWait { d: Reg, addr: Reg, parity: Src, kind: MbarrierWaitKind, scope: MbarrierScope },
    /// `mbarrier.arrive.release.cluster.shared::cluster.b64 _, [addr]`: one arrival on the
    /// mbarrier at the `.shared::cluster` address `addr` (another block's, from `mapa`),
    /// releasing this thread's earlier accesses to the cluster.
    MbarrierArriveRemote { addr: Reg },
    /// `st.async.shared::cluster.mbarrier::complete_tx::bytes[.v2|.v4].ty [addr], {vals..},
    /// [mbar]`: stores `vals` into another block's shared memory at the `.shared::cluster`
    /// address `addr`, then completes that many bytes of the phase of the mbarrier at `mbar`
    /// (in the same block), which releases them to the cluster.
    StAsync { ty: Ty, addr: Reg, vals: Vec<Src>, mbar: Reg },
    /// `cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src],
    /// bytes, [mbar]`: the async proxy copies `bytes` (a multiple of 16) of this block's shared
    /// memory at `src` to the `.shared::cluster` address `dst` (another block's, from `mapa`),
    /// then completes that many bytes of the phase of the mbarrier at `mbar` (in the
    /// destination block), which releases them. The source's writers must have fenced the
    /// proxies (`fence.proxy.async`) before.
    BulkCopyToCluster { dst: Reg, src: Reg, bytes: u32, mbar: Reg },
    /// `fence.mbarrier_init.release.cluster`: this thread's earlier `mbarrier.init`s become
    /// visible to the other blocks of the cluster (with a `barrier.cluster` after it, which
    /// orders the fence before what they do next).
    FenceMbarrierInit,
    /// `mbarrier.arrive.expect_tx.shared.b64 state, [addr], bytes`: raises the phase's
    /// transaction count by `bytes` (the copies that complete it lower it), then arrives.
    MbarrierArriveExpectTx { state: Reg, addr: Reg, bytes: u32 },
    /// `mov.u64 d, name`: the parameter-space address of parameter `name`.
    ParamAddress { d: Reg, name: String },
    /// `cvta.param.u64 d, a`: a parameter-space address as a generic one.
    CvtaParam { d: Reg, a: Reg },
    /// `cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes [dst],
    /// [map, {at..}], [mbar]`: TMA copies the box at element coordinates `at` (one per axis of
    /// the map, 1 to 5, inner first) of the tensor map at generic address `map` to shared
    /// `dst`, and lowers the transaction count of the mbarrier at `mbar` by the box's bytes.
    TmaLoad { dst: Reg, map: Reg, at: Vec<Reg>, mbar: Reg },
    /// `cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group [map, {at..}], [src]`: TMA copies
    /// shared `src` (laid out as the map's box) to the box at element coordinates `at` (inner
    /// first) of the tensor map at generic address `map`, writing only the elements inside the
    /// tensor.
    TmaStore { map: Reg, at: Vec<Reg>, src: Reg },
    /// `cp.async.bulk.commit_group`: this thread's bulk copies so far form a group.
    BulkCommit,
    /// `cp.async.bulk.wait_group.read n`: waits until at most `n` of this thread's bulk groups
    /// still read their shared sources (which may then be written again, or freed by exiting).
    BulkWaitRead { n: u32 },
    /// `shfl.sync.mode.b32 d, a, b, c, 0xffffffff`
    Shfl { mode: ShflMode, d: Reg, a: Reg, b: Src, c: u32 },
    /// `bar.sync id[, count]`, or `barrier.sync id[, count]` when its threads reach it from
    /// different instructions. The id is a register where warps running one copy of some code
    /// each take their own barrier (producer groups).
    Bar { id: Src, count: Option<u32>, reach: BarrierReach },
    /// `bar.arrive id, count`
    BarArrive { id: u32, count: u32 },
    /// A label.
    Label(u32),
    /// `[@[!]p] bra L`
    Bra { target: u32 },
    /// `ret`
    Ret,
    /// Shows a tile in the simulator (prints as a comment): each thread contributes its
    /// elements as (flat logical index, value register, value is f32).
    Trace { name: String, shape: Vec<u32>, elems: Vec<(Src, Reg)> },
}

/// A `wgmma` operand in shared memory: its 64-bit matrix descriptor register and which axis of
/// its tile is contiguous (MN-major prints `imm-trans` 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedOperand {
    /// The descriptor.
    pub desc: Reg,
    /// K-major or MN-major.
    pub major: crate::hopper_layout::Major,
}

impl SharedOperand {
    /// The instruction's `imm-trans` immediate for it.
    fn trans(&self) -> u32 {
        u32::from(self.major == crate::hopper_layout::Major::MN)
    }
}

/// Where a `wgmma`'s A operand comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum WgmmaA {
    /// A shared tile.
    Shared(SharedOperand),
    /// Four registers of 16-bit pairs per thread, in
    /// [`crate::hopper_layout::WgmmaFragment::RegisterA`]'s layout.
    Registers([Reg; 4]),
}

/// An instruction: an operation, an optional guard predicate and the kernel line it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    /// What it does.
    pub op: Op,
    /// `@p` (true) or `@!p` (false).
    pub guard: Option<(Reg, bool)>,
    /// The kernel source line.
    pub loc: SrcLoc,
    /// L2 policy of a global load, store or `cp.async` (ignored by other instructions).
    pub cache: CachePolicy,
}

/// What a kernel parameter is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A value of the type (pointers are `u64`).
    Value(Ty),
    /// A TMA tensor map (`CUtensorMap`, 128 bytes, 64-aligned), passed by value: what it maps.
    TensorMap(crate::tma_choice::TensorMapSig),
}

/// A lowered kernel: its instructions plus what the printer and simulator need.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadProgram {
    /// Entry name.
    pub name: String,
    /// Parameters: (name, kind) in order.
    pub params: Vec<(String, ParamKind)>,
    /// Threads per block.
    pub threads: u32,
    /// `.minnctapersm`, when the kernel asks for occupancy.
    pub min_blocks_per_sm: Option<u32>,
    /// `.maxnreg`: the registers per thread at entry, the pool `setmaxnreg` redistributes
    /// between warpgroups (ptxas ignores `setmaxnreg` without it).
    pub max_registers: Option<u32>,
    /// Dynamic shared memory, bytes.
    pub shared_bytes: u32,
    /// Blocks per cluster along x (`.reqnctapercluster`; 1: the implicit one-block cluster).
    /// The grid's x extent is a multiple of it; rank `r` of a cluster is block `x` with
    /// `x % cluster_blocks == r`.
    pub cluster_blocks: u32,
    /// The body.
    pub body: Vec<Inst>,
    /// Registers used per class (the next free number).
    pub reg_counts: [u32; 5],
}

#[cfg(test)]
impl ThreadProgram {
    /// A program `t` of `threads` threads holding `body` and nothing else, for tests of what
    /// reads a body (no parameters, no shared memory, no registers counted).
    pub(crate) fn of_body(threads: u32, body: Vec<Inst>) -> ThreadProgram {
        ThreadProgram {
            name: "t".into(),
            params: vec![],
            threads,
            min_blocks_per_sm: None,
            max_registers: None,
            cluster_blocks: 1,
            shared_bytes: 0,
            body,
            reg_counts: [0; 5],
        }
    }
}

fn ptx_un(op: UnKind, ty: Ty) -> String {
    let t = ty.name();
    match op {
        UnKind::Neg => format!("neg.{t}"),
        UnKind::Abs => format!("abs.{t}"),
        UnKind::Not => format!("not.{t}"),
        UnKind::Ex2 => "ex2.approx.ftz.f32".into(),
        UnKind::Lg2 => "lg2.approx.ftz.f32".into(),
        UnKind::Rsqrt => "rsqrt.approx.ftz.f32".into(),
        UnKind::Sqrt => "sqrt.rn.f32".into(),
        UnKind::Rcp => "rcp.approx.ftz.f32".into(),
    }
}

fn ptx_bin(op: BinKind, ty: Ty) -> String {
    let t = ty.name();
    let float = ty == Ty::F32;
    match op {
        BinKind::Add if float => "add.rn.f32".into(),
        BinKind::Sub if float => "sub.rn.f32".into(),
        BinKind::Mul if float => "mul.rn.f32".into(),
        BinKind::Div if float => "div.rn.f32".into(),
        BinKind::Add => format!("add.{t}"),
        BinKind::Sub => format!("sub.{t}"),
        BinKind::Mul => format!("mul.lo.{t}"),
        BinKind::Div => format!("div.{t}"),
        BinKind::Rem => format!("rem.{t}"),
        BinKind::Min => format!("min.{t}"),
        BinKind::Max => format!("max.{t}"),
        BinKind::And => format!("and.{t}"),
        BinKind::Or => format!("or.{t}"),
        BinKind::Xor => format!("xor.{t}"),
        BinKind::Shl => format!("shl.{t}"),
        BinKind::Shr => format!("shr.{t}"),
    }
}

fn vec_suffix(n: usize) -> &'static str {
    match n {
        1 => "",
        2 => ".v2",
        4 => ".v4",
        _ => ".v?",
    }
}

fn list<T: fmt::Display>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

fn addr(a: &Reg, off: i64) -> String {
    if off == 0 {
        format!("[{a}]")
    } else {
        format!("[{a}+{off}]")
    }
}

/// A load, store or `cp.async` under L2 policy `cache` (which only global accesses carry): an
/// evict-first load or store is `.cs` (cache streaming), an evict-first `cp.async` names the
/// policy register.
fn fmt_memory(f: &mut fmt::Formatter<'_>, op: &Op, cache: CachePolicy) -> fmt::Result {
    let space = |s: &Space| match (s, cache) {
        (Space::Global, CachePolicy::EvictFirst) => "global.cs",
        (Space::Global, CachePolicy::Normal) => "global",
        (Space::Shared, _) => "shared",
        (Space::SharedCluster, _) => "shared::cluster",
    };
    match op {
        Op::Ld { space: sp, ty, d, addr: a, offset } => {
            let dst = if d.len() == 1 { d[0].to_string() } else { format!("{{{}}}", list(d)) };
            write!(f, "ld.{}{}.{} {dst}, {};", space(sp), vec_suffix(d.len()), ty.name(), addr(a, *offset))
        }
        Op::St { space: sp, ty, addr: a, offset, vals } => {
            let v = if vals.len() == 1 { vals[0].to_string() } else { format!("{{{}}}", list(vals)) };
            write!(f, "st.{}{}.{} {}, {v};", space(sp), vec_suffix(vals.len()), ty.name(), addr(a, *offset))
        }
        Op::CpAsync { dst, src, src_bytes } => match cache {
            CachePolicy::Normal => write!(f, "cp.async.cg.shared.global [{dst}], [{src}], 16, {src_bytes};"),
            CachePolicy::EvictFirst => write!(
                f,
                "cp.async.cg.shared.global.L2::cache_hint [{dst}], [{src}], 16, {src_bytes}, {EVICT_FIRST_POLICY};"
            ),
        },
        _ => unreachable!("fmt_memory: not a memory instruction"),
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Mov { ty, d, a } => write!(f, "mov.{} {d}, {a};", ty.name()),
            Op::ReadSpecial { d, sreg } => match sreg {
                Special::Tid => write!(f, "mov.u32 {d}, %tid.x;"),
                Special::Ctaid(a) => write!(f, "mov.u32 {d}, %ctaid.{};", ["x", "y", "z"][*a as usize]),
                Special::ClusterCtaRank => write!(f, "mov.u32 {d}, %cluster_ctarank;"),
            },
            Op::Mapa { d, addr, rank } => write!(f, "mapa.shared::cluster.u32 {d}, {addr}, {rank};"),
            Op::ClusterBarrier { step: ClusterBarrierStep::Arrive } => write!(f, "barrier.cluster.arrive.release.aligned;"),
            Op::ClusterBarrier { step: ClusterBarrierStep::Wait } => write!(f, "barrier.cluster.wait.acquire.aligned;"),
            Op::SharedBase { d } => write!(f, "mov.u32 {d}, smem;"),
            Op::LdParam { ty, d, name } => write!(f, "ld.param.{} {d}, [{name}];", ty.name()),
            Op::CvtaGlobal { d, a } => write!(f, "cvta.to.global.u64 {d}, {a};"),
            Op::Bin { op, ty, d, a, b } => write!(f, "{} {d}, {a}, {b};", ptx_bin(*op, *ty)),
            Op::MulWide { ty, d, a, b } => write!(f, "mul.wide.{} {d}, {a}, {b};", ty.name()),
            Op::Mad { ty, d, a, b, c } => {
                if *ty == Ty::F32 {
                    write!(f, "fma.rn.f32 {d}, {a}, {b}, {c};")
                } else {
                    write!(f, "mad.lo.{} {d}, {a}, {b}, {c};", ty.name())
                }
            }
            Op::Un { op, ty, d, a } => write!(f, "{} {d}, {a};", ptx_un(*op, *ty)),
            Op::Setp { cmp, ty, d, a, b } => {
                let c = format!("{cmp:?}").to_lowercase();
                write!(f, "setp.{c}.{} {d}, {a}, {b};", ty.name())
            }
            Op::PredLogic { op, d, a, b } => match op {
                BinKind::And => write!(f, "and.pred {d}, {a}, {b};"),
                BinKind::Or => write!(f, "or.pred {d}, {a}, {b};"),
                BinKind::Xor => write!(f, "xor.pred {d}, {a}, {b};"),
                _ => write!(f, "// bad pred op"),
            },
            Op::Selp { ty, d, a, b, p } => write!(f, "selp.{} {d}, {a}, {b}, {p};", ty.name()),
            Op::Cvt { dty, sty, d, a } => {
                let rnd = match (dty, sty) {
                    (Ty::F32, Ty::S32 | Ty::S64 | Ty::U32) => ".rn",
                    (Ty::S32 | Ty::S64, Ty::F32) => ".rzi",
                    (Ty::F16 | Ty::BF16, Ty::F32) => ".rn",
                    _ => "",
                };
                write!(f, "cvt{rnd}.{}.{} {d}, {a};", dty.name(), sty.name())
            }
            Op::PackHalf2 { half, d, hi, lo } => write!(f, "cvt.rn.{}x2.f32 {d}, {hi}, {lo};", half.name()),
            Op::Unpack2 { lo, hi, a } => write!(f, "mov.b32 {{{lo}, {hi}}}, {a};"),
            Op::Ld { .. } | Op::St { .. } | Op::CpAsync { .. } => fmt_memory(f, self, CachePolicy::Normal),
            Op::Prefetch { addr } => write!(f, "prefetch.global.L2 [{addr}];"),
            Op::LdAcquire { d, addr: a, offset } => write!(f, "ld.acquire.gpu.global.u32 {d}, {};", addr(a, *offset)),
            Op::StRelease { addr: a, offset, a: v } => {
                write!(f, "st.release.gpu.global.u32 {}, {v};", addr(a, *offset))
            }
            Op::RedReleaseAdd { addr: a, offset, a: v } => {
                write!(f, "red.release.gpu.global.add.u32 {}, {v};", addr(a, *offset))
            }
            Op::CpAsyncCommit => write!(f, "cp.async.commit_group;"),
            Op::CpAsyncWait { n } => write!(f, "cp.async.wait_group {n};"),
            Op::Ldmatrix { trans, d, addr: a } => {
                let t = if *trans { ".trans" } else { "" };
                write!(f, "ldmatrix.sync.aligned.m8n8.x{}{t}.shared.b16 {{{}}}, [{a}];", d.len(), list(d))
            }
            Op::Movmatrix { d, a } => write!(f, "movmatrix.sync.aligned.m8n8.trans.b16 {d}, {a};"),
            Op::Mma { ab, d, a, b, c } => write!(
                f,
                "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{{1}}}, {{{2}}}, {{{3}}}, {{{4}}};",
                ab.name(),
                list(d),
                list(a),
                list(b),
                list(c)
            ),
            Op::WgmmaFence => write!(f, "wgmma.fence.sync.aligned;"),
            Op::Wgmma { ab, n, d, a, b, accumulate } => {
                // Immediates: scale A and B by 1, then whether each shared operand is MN-major
                // (A from registers has no such immediate).
                let (a, trans_a) = match a {
                    WgmmaA::Shared(op) => (op.desc.to_string(), format!(", {}", op.trans())),
                    WgmmaA::Registers(r) => (format!("{{{}}}", list(r)), String::new()),
                };
                write!(
                    f,
                    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{0}.{0} {{{1}}}, {a}, {2}, {accumulate}, 1, 1{trans_a}, {3};",
                    ab.name(),
                    list(d),
                    b.desc,
                    b.trans()
                )
            }
            Op::WgmmaCommit => write!(f, "wgmma.commit_group.sync.aligned;"),
            Op::WgmmaWait { n } => write!(f, "wgmma.wait_group.sync.aligned {n};"),
            Op::FenceProxyAsync => write!(f, "fence.proxy.async.shared::cta;"),
            Op::FenceMbarrierInit => write!(f, "fence.mbarrier_init.release.cluster;"),
            Op::SetMaxNReg { raise, count } => {
                write!(f, "setmaxnreg.{}.sync.aligned.u32 {count};", if *raise { "inc" } else { "dec" })
            }
            Op::MbarrierInit { addr, count } => write!(f, "mbarrier.init.shared.b64 [{addr}], {count};"),
            Op::MbarrierArrive { state, addr } => write!(f, "mbarrier.arrive.shared.b64 {state}, [{addr}];"),
            Op::CpAsyncMbarrierArrive { addr } => write!(f, "cp.async.mbarrier.arrive.noinc.shared.b64 [{addr}];"),
            Op::MbarrierWait { d, addr, parity, kind, scope } => {
                let wait = match kind {
                    MbarrierWaitKind::Try => "try_wait",
                    MbarrierWaitKind::Test => "test_wait",
                };
                let scope = match scope {
                    MbarrierScope::Cta => "",
                    MbarrierScope::Cluster => ".acquire.cluster",
                };
                write!(f, "mbarrier.{wait}.parity{scope}.shared.b64 {d}, [{addr}], {parity};")
            }
            Op::MbarrierArriveRemote { addr } => {
                write!(f, "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{addr}];")
            }
            Op::BulkCopyToCluster { dst, src, bytes, mbar } => write!(
                f,
                "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [{dst}], [{src}], {bytes}, [{mbar}];"
            ),
            Op::StAsync { ty, addr, vals, mbar } => {
                let v = if vals.len() == 1 { vals[0].to_string() } else { format!("{{{}}}", list(vals)) };
                write!(
                    f,
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes{}.{} [{addr}], {v}, [{mbar}];",
                    vec_suffix(vals.len()),
                    ty.name()
                )
            }
            Op::MbarrierArriveExpectTx { state, addr, bytes } => {
                write!(f, "mbarrier.arrive.expect_tx.shared.b64 {state}, [{addr}], {bytes};")
            }
            Op::ParamAddress { d, name } => write!(f, "mov.u64 {d}, {name};"),
            Op::CvtaParam { d, a } => write!(f, "cvta.param.u64 {d}, {a};"),
            Op::TmaLoad { dst, map, at, mbar } => write!(
                f,
                "cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{}}}], [{mbar}];",
                at.len(),
                list(at)
            ),
            Op::TmaStore { map, at, src } => write!(
                f,
                "cp.async.bulk.tensor.{}d.global.shared::cta.bulk_group [{map}, {{{}}}], [{src}];",
                at.len(),
                list(at)
            ),
            Op::BulkCommit => write!(f, "cp.async.bulk.commit_group;"),
            Op::BulkWaitRead { n } => write!(f, "cp.async.bulk.wait_group.read {n};"),
            Op::Shfl { mode, d, a, b, c } => {
                let m = format!("{mode:?}").to_lowercase();
                write!(f, "shfl.sync.{m}.b32 {d}, {a}, {b}, {c}, -1;")
            }
            Op::Bar { id, count, reach } => {
                let op = match reach {
                    BarrierReach::SameInstruction => "bar.sync",
                    BarrierReach::AnyInstruction => "barrier.sync",
                };
                match count {
                    Some(c) => write!(f, "{op} {id}, {c};"),
                    None => write!(f, "{op} {id};"),
                }
            }
            Op::BarArrive { id, count } => write!(f, "bar.arrive {id}, {count};"),
            Op::Label(l) => write!(f, "$L{l}:"),
            Op::Bra { target } => write!(f, "bra $L{target};"),
            Op::Ret => write!(f, "ret;"),
            Op::Trace { name, shape, .. } => write!(f, "// print {name} {shape:?} (simulator only)"),
        }
    }
}

impl fmt::Display for Inst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((p, pos)) = self.guard {
            write!(f, "@{}{p} ", if pos { "" } else { "!" })?;
        }
        match &self.op {
            Op::Ld { .. } | Op::St { .. } | Op::CpAsync { .. } => fmt_memory(f, &self.op, self.cache),
            op => write!(f, "{op}"),
        }
    }
}

impl Inst {
    /// The least PTX ISA version that has this instruction (at least 7.0): 7.7 for
    /// `cvta.param`, 7.8 for `movmatrix` and `mbarrier.try_wait`, 8.0 for `expect_tx`, TMA,
    /// clusters, `fence.proxy.async` and `wgmma`, 8.1 for `st.async`.
    pub fn least_ptx_version(&self) -> (u32, u32) {
        match self.op {
            Op::CvtaParam { .. } => (7, 7),
            Op::Movmatrix { .. } | Op::MbarrierWait { kind: MbarrierWaitKind::Try, .. } => (7, 8),
            Op::StAsync { .. } => (8, 1),
            Op::MbarrierWait { scope: MbarrierScope::Cluster, .. }
            | Op::MbarrierArriveRemote { .. }
            | Op::BulkCopyToCluster { .. }
            | Op::FenceMbarrierInit => (8, 0),
            Op::MbarrierWait { kind: MbarrierWaitKind::Test, .. } => (7, 1),
            Op::MbarrierArriveExpectTx { .. }
            | Op::Mapa { .. }
            | Op::ClusterBarrier { .. }
            | Op::ReadSpecial { sreg: Special::ClusterCtaRank, .. }
            | Op::Ld { space: Space::SharedCluster, .. }
            | Op::St { space: Space::SharedCluster, .. }
            | Op::TmaLoad { .. }
            | Op::TmaStore { .. }
            | Op::BulkCommit
            | Op::BulkWaitRead { .. }
            | Op::FenceProxyAsync
            | Op::WgmmaFence
            | Op::Wgmma { .. }
            | Op::WgmmaCommit
            | Op::WgmmaWait { .. }
            | Op::SetMaxNReg { .. } => (8, 0),
            _ => (7, 0),
        }
    }

    /// The least target that has this instruction: `sm_90a` for `wgmma`, `sm_90` for
    /// `mbarrier.try_wait`, `expect_tx`, TMA, clusters and `fence.proxy.async`, `sm_80` for
    /// the rest.
    pub fn least_target(&self) -> crate::target::Target {
        use crate::target::Target;
        match self.op {
            Op::WgmmaFence | Op::Wgmma { .. } | Op::WgmmaCommit | Op::WgmmaWait { .. } | Op::SetMaxNReg { .. } => {
                Target::Sm90a
            }
            Op::FenceProxyAsync
            | Op::MbarrierWait { scope: MbarrierScope::Cluster, .. }
            | Op::MbarrierArriveRemote { .. }
            | Op::StAsync { .. }
            | Op::BulkCopyToCluster { .. }
            | Op::FenceMbarrierInit
            | Op::Mapa { .. }
            | Op::ClusterBarrier { .. }
            | Op::ReadSpecial { sreg: Special::ClusterCtaRank, .. }
            | Op::Ld { space: Space::SharedCluster, .. }
            | Op::St { space: Space::SharedCluster, .. }
            | Op::MbarrierWait { kind: MbarrierWaitKind::Try, .. }
            | Op::MbarrierArriveExpectTx { .. }
            | Op::TmaLoad { .. }
            | Op::TmaStore { .. }
            | Op::BulkCommit
            | Op::BulkWaitRead { .. } => Target::Sm90,
            _ => Target::Sm80,
        }
    }

    /// Whether this is a `cp.async` that reads the L2 policy register [`EVICT_FIRST_POLICY`].
    pub fn uses_evict_first_policy(&self) -> bool {
        self.cache == CachePolicy::EvictFirst && matches!(self.op, Op::CpAsync { .. })
    }
}
