//! The block simulator: runs a lowered [`ThreadProgram`] (the program the PTX printer prints)
//! on the CPU, every thread of a block (of a cluster's blocks together: see `cluster`; of the
//! whole grid together for a program that waits on flags in global memory: see `flags`), with
//! the PTX ISA's per-lane meaning of `mma`, `ldmatrix`, `shfl`, `cp.async` groups, barriers,
//! `mbarrier` phases and the warpgroup's `wgmma` groups.
//!
//! Each thread runs until it reaches a warp-collective instruction or a barrier; a collective
//! executes once all lanes of the warp stand at it (a warpgroup's, all 128 threads: see
//! `warpgroup`), a barrier releases once every thread that takes part arrived, and a thread at
//! an `mbarrier.try_wait` sleeps until its phase completes (see `mbarrier`). It reports as errors what the hardware would punish or hide: shared or
//! global accesses out of bounds, reads of shared memory nobody wrote, two threads touching the
//! same shared byte between barriers (a race), divergent collectives, deadlocks and 32-bit
//! signed overflow in index arithmetic.

use crate::diag::SrcLoc;
use crate::thread_ir::*;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

mod args;
pub mod banks;
mod cluster;
mod collective;
mod flags;
mod mbarrier;
mod memory;
mod numeric;
mod order;
mod tma;
mod warpgroup;

use numeric::*;

/// A value for one kernel parameter.
#[derive(Clone, Debug)]
pub enum SimArg {
    /// A global tensor's bytes (read and written in place).
    Tensor(Vec<u8>),
    /// A 32-bit integer (extents, i32 scalars).
    I32(i32),
    /// A 64-bit integer.
    I64(i64),
    /// An f32 scalar.
    F32(f32),
    /// A TMA tensor map over the bytes of the `SimArg::Tensor` argument named `tensor`.
    TensorMap {
        /// The tensor's argument name.
        tensor: String,
        /// The map.
        map: crate::tensor_map::TensorMap,
    },
}

/// An error the simulator found.
#[derive(Clone, Debug, PartialEq)]
pub struct SimError {
    /// What happened.
    pub message: String,
    /// The kernel line of the instruction.
    pub loc: SrcLoc,
    /// Block index.
    pub block: [u32; 3],
    /// Thread index within the block.
    pub thread: u32,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: block {:?} thread {}: {}", self.loc, self.block, self.thread, self.message)
    }
}

impl std::error::Error for SimError {}

/// What a run produced besides the tensors: `print` output, in program order.
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    /// One entry per executed `print`, in the kernel author's logical (row, col) order.
    pub prints: Vec<String>,
    /// Instructions executed, summed over threads.
    pub instructions: u64,
}

const GLOBAL_SHIFT: u32 = 40;

/// The shared address of the block's first byte of dynamic shared memory, as `mov.u32 r, smem`
/// gives it: the hardware keeps the first kilobyte for itself, so a kernel that takes shared
/// offsets for addresses reads the wrong bytes on it, and here is out of bounds.
pub(crate) const SHARED_BASE: u64 = 1024;

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    /// Which registers have been written (reading another is an error).
    written: Vec<bool>,
    done: bool,
    /// Waiting at a collective or barrier (pc points at it).
    blocked: bool,
    /// Waiting at an mbarrier wait (`try_wait`, `test_wait`) whose phase has not completed (pc points at it).
    parked: bool,
    /// Woken from an mbarrier wait: the next one returns false once, as a timed-out hardware wait
    /// may, so a program must loop on it.
    woke: bool,
    groups: Vec<Vec<(u32, [u8; 16])>>,
    open_group: Vec<(u32, [u8; 16])>,
    /// Per register, the block's [`Block::clock`] at its last write by this thread.
    write_clock: Vec<u64>,
    /// Per register, the clock at its last read by an instruction of this thread (a `wgmma`'s
    /// own reads do not count).
    read_clock: Vec<std::cell::Cell<u64>>,
    /// Per register, whether a pending `wgmma` owns it (touching it is an error).
    in_flight: Vec<bool>,
    /// The clock at this thread's last `wgmma.fence`.
    register_fence: Option<u64>,
    /// This thread's `fence.proxy.async`s in order: the clock and the barrier epoch at each.
    /// A write is fenced by the first one after it; a later fence of the same thread does not
    /// undo that one's order.
    proxy_fences: Vec<(u64, u32)>,
    /// Shared byte ranges this thread's bulk copies (TMA stores) read, not yet committed.
    bulk_open: Vec<std::ops::Range<usize>>,
    /// Its committed bulk groups still reading, oldest first.
    bulk_groups: std::collections::VecDeque<Vec<std::ops::Range<usize>>>,
    /// The cluster barrier epoch of its last `barrier.cluster.arrive` not yet waited for.
    cluster_arrived: Option<u32>,
    /// Waiting at `barrier.cluster.wait` for the rest of the cluster (pc points at it).
    cluster_parked: bool,
    /// Its `ld.acquire`s ([`flags`]).
    polls: flags::Polls,
}

/// What a shared byte's race check needs: its last write and the reads since, each with the
/// number of barriers the accessing thread's block had released then ([`Block::released`]).
#[derive(Clone, Copy, Default)]
struct Shadow {
    written: bool,
    /// The writing thread's place in the cluster ([`Block::group_thread`]): another block's
    /// thread for a store through `.shared::cluster`, its epoch counted in that block.
    writer: u32,
    write_epoch: u32,
    /// The reading thread of this block (loads never cross blocks), [`MANY`] or [`NONE`].
    reader: u32,
    /// With [`MANY`] readers: their warps, one bit each.
    reader_warps: u32,
    read_epoch: u32,
    /// The block's [`Block::clock`] at the last write.
    write_clock: u64,
    /// Part of an `mbarrier` object (only `mbarrier` instructions may touch it).
    mbarrier: bool,
    /// Last written by the async proxy (a TMA copy): `wgmma` reads it with no proxy fence.
    async_proxy: bool,
    /// The destination of a `cp.async` issued and not yet waited for: the copy may land at
    /// any moment until its issuer's wait (the simulator lands it there), so no access may
    /// touch the byte meanwhile.
    copy_in_flight: bool,
}

impl Shadow {
    /// A byte just written by cluster thread `writer` when its block had released `epoch`,
    /// at clock `clock`, by the generic proxy: the reads before it are ordered before the
    /// write, and so before whatever is ordered after it.
    fn written_by(writer: u32, epoch: u32, clock: u64) -> Shadow {
        Shadow { written: true, writer, write_epoch: epoch, reader: NONE, write_clock: clock, ..Shadow::default() }
    }
}

/// One executed `print`: the tile's name, shape and values by flat logical index.
type Trace = (String, Vec<u32>, BTreeMap<i64, String>);

const MANY: u32 = u32::MAX;
const NONE: u32 = u32::MAX - 1;

struct Block<'a> {
    prog: &'a ThreadProgram,
    labels: HashMap<u32, usize>,
    reg_base: [usize; 5],
    threads: Vec<Thread>,
    shared: Vec<u8>,
    shadow: Vec<Shadow>,
    /// Warps of the block (the last may be partial).
    warps: usize,
    /// Barriers released so far (a barrier's number is the count once it is released).
    released: u32,
    /// Per warp `a` of the cluster (`rank * warps + warp`) and warp `b` of this block (at
    /// `a * warps + b`), the epoch of `a`'s block before which everything warp `a` did is
    /// ordered before what warp `b` does now: the last barrier both passed, or later through
    /// a chain of barriers, mbarrier phases and cluster barriers (order is transitive). A
    /// named barrier orders only the warps that take part in it. A vector clock per warp, of
    /// the cluster's warps (a block's own, alone, without clusters).
    last_shared_barrier: Vec<u32>,
    block: [u32; 3],
    params: &'a HashMap<String, u64>,
    /// The global tensors, moved in while this block runs (a cluster's blocks take turns).
    globals: Vec<Vec<u8>>,
    /// Its place in its cluster.
    cluster: cluster::Place,
    /// Its place among the blocks that run together: its cluster, or a resident grid.
    group: cluster::Place,
    /// A resident grid's order of global bytes, moved in with `globals` ([`flags`]).
    global_order: Option<flags::GlobalOrder>,
    /// `barrier.cluster`s completed.
    cluster_epoch: u32,
    /// What its threads' `barrier.cluster.arrive`s of the current cluster phase released, per
    /// warp of the cluster (as [`Block::last_shared_barrier`]'s epochs).
    cluster_releasing: Vec<u32>,
    /// What the last completed `barrier.cluster` released: every block's arrivals.
    cluster_released: Vec<u32>,
    /// Its stores and arrivals into other blocks of the cluster this round, in issue order.
    remote_out: Vec<cluster::Remote>,
    /// The shared byte ranges its bulk copies to other blocks still read (until the round
    /// ends and they land).
    copying_out: Vec<std::ops::Range<usize>>,
    global_names: &'a [String],
    /// The tensor maps: (the mapped tensor's global slot, the map).
    maps: &'a [(usize, crate::tensor_map::TensorMap)],
    traces: BTreeMap<(usize, u32), Trace>,
    trace_counts: Vec<HashMap<usize, u32>>,
    executed: u64,
    /// The first read of a register nothing wrote: (thread, register).
    uninit: std::cell::Cell<Option<(usize, Reg)>>,
    /// The first access to a register a pending `wgmma` owns: (thread, register).
    touched_in_flight: std::cell::Cell<Option<(usize, Reg)>>,
    /// Counts register and shared writes (and `wgmma.fence`s): what orders accesses against
    /// the fences.
    clock: u64,
    /// Shared byte ranges bulk copies still read, over every thread (0: none to check).
    bulk_pending: usize,
    /// Each warpgroup's pending `wgmma`s.
    warpgroups: Vec<warpgroup::Warpgroup>,
    /// Whether the program has a `wgmma`: only then do register reads and writes carry the
    /// clock and the pending check its fences and groups need (every access pays for them).
    tracks_wgmma_registers: bool,
    /// The `mbarrier` objects, by shared address.
    mbarriers: HashMap<u32, mbarrier::Mbarrier>,
    /// Its shared accesses, recorded when a bank-conflict count is open ([`banks`]).
    banks: Option<banks::BankRecorder>,
}

/// The counted kind of a shared-memory instruction ([`banks`]).
fn shared_op(op: &Op) -> banks::SharedOp {
    match op {
        Op::St { .. } => banks::SharedOp::Store,
        Op::CpAsync { .. } => banks::SharedOp::CpAsync,
        Op::Ldmatrix { .. } => banks::SharedOp::Ldmatrix,
        _ => banks::SharedOp::Load,
    }
}

fn class_slot(c: RegClass) -> usize {
    RegClass::ALL.iter().position(|x| *x == c).unwrap_or(0)
}

impl<'a> Block<'a> {
    /// Thread `t`'s shared access of `n` bytes at `addr` by its current instruction, for the
    /// bank-conflict count when one is open.
    fn record_shared(&mut self, t: usize, addr: u64, n: usize) {
        let pc = self.threads[t].pc;
        if let Some(rec) = self.banks.as_mut() {
            rec.record(t, pc, addr, n as u32);
        }
    }

    fn reg_index(&self, r: Reg) -> usize {
        self.reg_base[class_slot(r.class)] + r.id as usize
    }

    fn get(&self, t: usize, s: &Src) -> u64 {
        match s {
            Src::Reg(r) => {
                if self.tracks_wgmma_registers {
                    let i = self.reg_index(*r);
                    self.note_in_flight(t, i, *r);
                    self.threads[t].read_clock[i].set(self.clock);
                }
                self.read_register(t, *r)
            }
            Src::Imm(v) => *v as u64,
            Src::F32(v) => v.to_bits() as u64,
        }
    }

    /// Register `r` of thread `t`, noting a read of one nothing wrote. `wgmma`s read so: a
    /// chained one may read registers its predecessors own.
    fn read_register(&self, t: usize, r: Reg) -> u64 {
        let i = self.reg_index(r);
        if !self.threads[t].written[i] && self.uninit.get().is_none() {
            self.uninit.set(Some((t, r)));
        }
        self.threads[t].regs[i]
    }

    fn set(&mut self, t: usize, r: Reg, v: u64) {
        let i = self.reg_index(r);
        let v = match r.class {
            RegClass::Pred => (v != 0) as u64,
            RegClass::B16 => v & 0xffff,
            RegClass::B32 | RegClass::F32 => v & 0xffff_ffff,
            RegClass::B64 => v,
        };
        if self.tracks_wgmma_registers {
            self.note_in_flight(t, i, r);
            self.clock += 1;
            self.threads[t].write_clock[i] = self.clock;
        }
        let th = &mut self.threads[t];
        th.regs[i] = v;
        th.written[i] = true;
    }

    fn note_in_flight(&self, t: usize, i: usize, r: Reg) {
        if self.threads[t].in_flight[i] && self.touched_in_flight.get().is_none() {
            self.touched_in_flight.set(Some((t, r)));
        }
    }

    fn check_uninit(&self) -> R<()> {
        if let Some((t, r)) = self.touched_in_flight.get() {
            return Err(format!(
                "thread {t} touches register {r} while a wgmma that owns it is pending (wgmma.wait_group first)"
            ));
        }
        match self.uninit.get() {
            None => Ok(()),
            Some((t, r)) => Err(format!("thread {t} reads register {r}, which nothing wrote on its path")),
        }
    }

    fn is_collective(op: &Op) -> bool {
        matches!(op, Op::Ldmatrix { .. } | Op::Movmatrix { .. } | Op::Mma { .. } | Op::Shfl { .. } | Op::Bar { .. })
            || warpgroup::is_warpgroup_collective(op)
    }

    /// Runs thread `t` until it blocks or finishes.
    fn run_thread(&mut self, t: usize) -> R<()> {
        let prog = self.prog;
        let mut steps = 0u64;
        loop {
            let th = &self.threads[t];
            if th.done || th.blocked || th.parked || th.cluster_parked {
                return Ok(());
            }
            let Some(inst) = prog.body.get(th.pc) else {
                self.threads[t].done = true;
                return Ok(());
            };
            steps += 1;
            if steps > 50_000_000 {
                return Err("thread ran 50 million instructions: an endless loop?".into());
            }
            if let Some((p, pos)) = inst.guard {
                let v = self.get(t, &Src::Reg(p)) != 0;
                if v != pos {
                    self.threads[t].pc += 1;
                    continue;
                }
            }
            if Self::is_collective(&inst.op) {
                self.threads[t].blocked = true;
                return Ok(());
            }
            if let Op::ClusterBarrier { step: ClusterBarrierStep::Wait } = inst.op {
                match self.threads[t].cluster_arrived {
                    None => return Err("barrier.cluster.wait with no arrive before it".into()),
                    Some(e) if e == self.cluster_epoch => {
                        self.threads[t].cluster_parked = true;
                        return Ok(());
                    }
                    Some(_) => {
                        self.threads[t].cluster_arrived = None;
                        let released = self.cluster_released.clone();
                        self.acquire(t, &released);
                        self.executed += 1;
                        self.threads[t].pc += 1;
                        continue;
                    }
                }
            }
            if let Op::LdAcquire { addr, offset, .. } = inst.op {
                let at = self.get(t, &Src::Reg(addr)).wrapping_add(offset as u64);
                if self.poll_waits(t, self.threads[t].pc, at) {
                    return Ok(());
                }
            }
            if let Op::MbarrierWait { addr, parity, .. } = &inst.op {
                let (a, p) = (self.get(t, &Src::Reg(*addr)), self.get(t, parity));
                if !self.mbarrier_phase_done(t, a, p)? {
                    self.threads[t].parked = true;
                    return Ok(());
                }
                if std::mem::take(&mut self.threads[t].woke) {
                    let Op::MbarrierWait { d, .. } = inst.op else { unreachable!("matched above") };
                    self.executed += 1;
                    self.set(t, d, 0);
                    self.threads[t].pc += 1;
                    continue;
                }
            }
            self.executed += 1;
            self.exec(t, inst)?;
            self.check_uninit()?;
            if matches!(inst.op, Op::LdAcquire { .. }) {
                // The other blocks run before it polls again.
                return Ok(());
            }
        }
    }

    fn exec(&mut self, t: usize, inst: &Inst) -> R<()> {
        let mut next = self.threads[t].pc + 1;
        match &inst.op {
            Op::Mov { ty: _, d, a } => {
                let v = self.get(t, a);
                self.set(t, *d, v);
            }
            Op::ReadSpecial { d, sreg } => {
                let v = match sreg {
                    Special::Tid => t as u64,
                    Special::Ctaid(a) => self.block[*a as usize] as u64,
                    Special::ClusterCtaRank => u64::from(self.cluster.rank),
                };
                self.set(t, *d, v);
            }
            Op::SharedBase { d } => self.set(t, *d, SHARED_BASE),
            Op::Mapa { d, addr, rank } => {
                let v = self.mapa(self.get(t, &Src::Reg(*addr)), self.get(t, rank))?;
                self.set(t, *d, v);
            }
            Op::ClusterBarrier { step: ClusterBarrierStep::Arrive } => {
                if self.threads[t].cluster_arrived.is_some() {
                    return Err("barrier.cluster.arrive twice with no wait between".into());
                }
                let release = self.release_from(t);
                order::merge(&mut self.cluster_releasing, &release);
                self.threads[t].cluster_arrived = Some(self.cluster_epoch);
            }
            Op::ClusterBarrier { step: ClusterBarrierStep::Wait } => {
                unreachable!("run_thread waits at barrier.cluster.wait")
            }
            Op::LdParam { d, name, .. } => {
                let v = *self.params.get(name).ok_or_else(|| format!("no value for parameter {name}"))?;
                self.set(t, *d, v);
            }
            Op::CvtaGlobal { d, a } => {
                let v = self.get(t, &Src::Reg(*a));
                self.set(t, *d, v);
            }
            Op::Bin { op, ty, d, a, b } => {
                let (x, y) = (self.get(t, a), self.get(t, b));
                let v = bin(*op, *ty, x, y)?;
                self.set(t, *d, v);
            }
            Op::MulWide { ty, d, a, b } => {
                let (x, y) = (self.get(t, a), self.get(t, b));
                let v = match ty {
                    Ty::U32 => (x as u32 as u64) * (y as u32 as u64),
                    _ => ((x as u32 as i32 as i64) * (y as u32 as i32 as i64)) as u64,
                };
                self.set(t, *d, v);
            }
            Op::Mad { ty, d, a, b, c } => {
                let (x, y, z) = (self.get(t, a), self.get(t, b), self.get(t, c));
                let v = match ty {
                    Ty::F32 => f32_of(x).mul_add(f32_of(y), f32_of(z)).to_bits() as u64,
                    Ty::S64 | Ty::U64 => (x as i64).wrapping_mul(y as i64).wrapping_add(z as i64) as u64,
                    _ => {
                        let (x, y, z) = (x as u32 as i32, y as u32 as i32, z as u32 as i32);
                        x.checked_mul(y).and_then(|p| p.checked_add(z)).ok_or("32-bit signed overflow in mad")? as u32
                            as u64
                    }
                };
                self.set(t, *d, v);
            }
            Op::Un { op, ty, d, a } => {
                let x = self.get(t, a);
                let f = f32_of(x);
                let v = match (op, ty) {
                    (UnKind::Neg, Ty::F32) => (-f).to_bits() as u64,
                    (UnKind::Abs, Ty::F32) => f.abs().to_bits() as u64,
                    (UnKind::Neg, Ty::S64) => (x as i64).wrapping_neg() as u64,
                    (UnKind::Abs, Ty::S64) => (x as i64).wrapping_abs() as u64,
                    (UnKind::Neg, _) => (x as u32 as i32).wrapping_neg() as u32 as u64,
                    (UnKind::Abs, _) => (x as u32 as i32).wrapping_abs() as u32 as u64,
                    (UnKind::Not, Ty::Pred) => (x == 0) as u64,
                    (UnKind::Not, _) => !x,
                    (UnKind::Ex2, _) => f.exp2().to_bits() as u64,
                    (UnKind::Lg2, _) => f.log2().to_bits() as u64,
                    (UnKind::Rsqrt, _) => (1.0 / f.sqrt()).to_bits() as u64,
                    (UnKind::Sqrt, _) => f.sqrt().to_bits() as u64,
                    (UnKind::Rcp, _) => (1.0 / f).to_bits() as u64,
                };
                self.set(t, *d, v);
            }
            Op::Setp { cmp, ty, d, a, b } => {
                let (x, y) = (self.get(t, a), self.get(t, b));
                let v = match ty {
                    Ty::F32 => {
                        let (x, y) = (f32_of(x), f32_of(y));
                        if x.is_nan() || y.is_nan() {
                            false
                        } else {
                            cmp_of(*cmp, x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal))
                        }
                    }
                    Ty::S64 => cmp_of(*cmp, (x as i64).cmp(&(y as i64))),
                    Ty::U64 | Ty::B64 => cmp_of(*cmp, x.cmp(&y)),
                    Ty::U32 | Ty::B32 => cmp_of(*cmp, (x as u32).cmp(&(y as u32))),
                    _ => cmp_of(*cmp, (x as u32 as i32).cmp(&(y as u32 as i32))),
                };
                self.set(t, *d, v as u64);
            }
            Op::PredLogic { op, d, a, b } => {
                let x = self.get(t, &Src::Reg(*a)) != 0;
                // `false && b` is false whatever `b` holds: an if-converted branch combines its
                // guard with predicates written only under it.
                let y = (*op != BinKind::And || x) && self.get(t, &Src::Reg(*b)) != 0;
                let v = match op {
                    BinKind::And => x && y,
                    BinKind::Or => x || y,
                    _ => x != y,
                };
                self.set(t, *d, v as u64);
            }
            Op::Selp { d, a, b, p, .. } => {
                let v = if self.get(t, &Src::Reg(*p)) != 0 { self.get(t, a) } else { self.get(t, b) };
                self.set(t, *d, v);
            }
            Op::Cvt { dty, sty, d, a } => {
                let x = self.get(t, a);
                let v = cvt(*dty, *sty, x)?;
                self.set(t, *d, v);
            }
            Op::PackHalf2 { half, d, hi, lo } => {
                let (h, l) = (f32_of(self.get(t, hi)), f32_of(self.get(t, lo)));
                let v = ((f32_to_half(h, *half) as u64) << 16) | f32_to_half(l, *half) as u64;
                self.set(t, *d, v);
            }
            Op::Unpack2 { lo, hi, a } => {
                let x = self.get(t, &Src::Reg(*a));
                self.set(t, *lo, x & 0xffff);
                self.set(t, *hi, (x >> 16) & 0xffff);
            }
            Op::Ld { space, ty, d, addr, offset } => {
                let mut a = self.get(t, &Src::Reg(*addr)).wrapping_add(*offset as u64);
                let w = ty.bytes() as usize;
                let n = w * d.len();
                if *space == Space::SharedCluster {
                    a = match self.cluster_target(a, n)? {
                        cluster::Target::Own(own) => own,
                        cluster::Target::Other { rank, .. } => {
                            return Err(format!("ld.shared::cluster from block {rank}: only stores cross blocks here"))
                        }
                    };
                }
                if *space != Space::Global {
                    self.record_shared(t, a, n);
                }
                let bytes = match space {
                    Space::Global => self.read_global(t, a, n)?,
                    Space::Shared | Space::SharedCluster => self.read_shared(t, a, n)?,
                };
                for (k, r) in d.iter().enumerate() {
                    let mut v = 0u64;
                    for i in 0..w {
                        v |= (bytes[k * w + i] as u64) << (8 * i);
                    }
                    if *ty == Ty::S32 && r.class == RegClass::B64 {
                        v = v as u32 as i32 as i64 as u64;
                    }
                    self.set(t, *r, v);
                }
            }
            Op::St { space, ty, addr, offset, vals } => {
                let a = self.get(t, &Src::Reg(*addr)).wrapping_add(*offset as u64);
                let w = ty.bytes() as usize;
                let mut bytes = vec![];
                for s in vals {
                    let v = self.get(t, s);
                    bytes.extend_from_slice(&v.to_le_bytes()[..w]);
                }
                let target = match space {
                    Space::SharedCluster => self.cluster_target(a, bytes.len())?,
                    _ => cluster::Target::Own(a),
                };
                match (space, target) {
                    (Space::Global, _) => self.write_global(t, a, &bytes)?,
                    (_, cluster::Target::Own(own)) => {
                        self.record_shared(t, own, bytes.len());
                        self.write_shared(t, own, &bytes)?
                    }
                    (_, cluster::Target::Other { rank, at }) => self.store_remote(t, rank, at, bytes),
                }
            }
            Op::StAsync { ty, addr, vals, mbar } => {
                let (a, m) = (self.get(t, &Src::Reg(*addr)), self.get(t, &Src::Reg(*mbar)));
                let w = ty.bytes() as usize;
                let mut bytes = vec![];
                for s in vals {
                    bytes.extend_from_slice(&self.get(t, s).to_le_bytes()[..w]);
                }
                self.store_async(t, a, bytes, m)?;
            }
            Op::MbarrierArriveRemote { addr } => {
                let a = self.get(t, &Src::Reg(*addr));
                self.arrive_remote(t, a)?;
            }
            Op::BulkCopyToCluster { dst, src, bytes, mbar } => {
                let [d, s, m] = [dst, src, mbar].map(|r| self.get(t, &Src::Reg(*r)));
                self.bulk_copy_to_cluster(t, d, s, *bytes, m)?;
            }
            Op::CpAsync { dst, src, src_bytes } => {
                let n = self.get(t, src_bytes) as usize;
                if n > 16 {
                    return Err(format!("cp.async source size {n} > 16"));
                }
                let d = self.get(t, &Src::Reg(*dst));
                let at = self.check_shared(d, 16)?;
                self.copy_issued(at)?;
                self.record_shared(t, d, 16);
                let mut data = [0u8; 16];
                if n > 0 {
                    let a = self.get(t, &Src::Reg(*src));
                    let (b, off) = self.global_slice(a, 16.min(n.next_power_of_two()))?;
                    if off + n > self.globals[b].len() {
                        return Err("cp.async reads past the tensor".into());
                    }
                    self.order_global(t, b, off, n, flags::GlobalAccess::Read)?;
                    data[..n].copy_from_slice(&self.globals[b][off..off + n]);
                }
                self.threads[t].open_group.push((d as u32, data));
            }
            Op::LdAcquire { d, addr, offset } => {
                let a = self.get(t, &Src::Reg(*addr)).wrapping_add(*offset as u64);
                let v = self.ld_acquire(t, a)?;
                self.set(t, *d, v);
            }
            Op::StRelease { addr, offset, a } | Op::RedReleaseAdd { addr, offset, a } => {
                let at = self.get(t, &Src::Reg(*addr)).wrapping_add(*offset as u64);
                let v = self.get(t, a);
                let how = match inst.op {
                    Op::RedReleaseAdd { .. } => flags::Release::Add,
                    _ => flags::Release::Store,
                };
                self.release_flag(t, at, v, how)?;
            }
            Op::Prefetch { addr } => {
                // Nothing moves; the address must still be one of the tensor's (masks hold).
                let a = self.get(t, &Src::Reg(*addr));
                self.global_slice(a, 1)?;
            }
            Op::CpAsyncCommit => {
                let g = std::mem::take(&mut self.threads[t].open_group);
                self.threads[t].groups.push(g);
            }
            Op::CpAsyncWait { n } => {
                let keep = *n as usize;
                let total = self.threads[t].groups.len();
                if total > keep {
                    let done: Vec<_> = self.threads[t].groups.drain(..total - keep).flatten().collect();
                    self.land_copies(t, done)?;
                }
            }
            Op::FenceProxyAsync => self.threads[t].proxy_fences.push((self.clock, self.released)),
            Op::FenceMbarrierInit => self.fence_mbarrier_inits(t),
            Op::MbarrierInit { addr, count } => {
                let a = self.get(t, &Src::Reg(*addr));
                self.mbarrier_init(t, a, *count)?;
            }
            Op::MbarrierArrive { state, addr } => {
                let a = self.get(t, &Src::Reg(*addr));
                let phase = self.mbarrier_arrive(t, a, 0)?;
                self.set(t, *state, phase);
            }
            Op::CpAsyncMbarrierArrive { addr } => {
                let a = self.get(t, &Src::Reg(*addr));
                self.cp_async_arrive(t, a)?;
            }
            Op::MbarrierArriveExpectTx { state, addr, bytes } => {
                let a = self.get(t, &Src::Reg(*addr));
                let phase = self.mbarrier_arrive(t, a, *bytes)?;
                self.set(t, *state, phase);
            }
            Op::ParamAddress { d, name } => {
                let v = *self.params.get(name).ok_or_else(|| format!("no value for parameter {name}"))?;
                self.set(t, *d, v);
            }
            Op::CvtaParam { d, a } => {
                let v = self.get(t, &Src::Reg(*a));
                self.set(t, *d, v);
            }
            Op::TmaLoad { dst, map, at, mbar } => {
                let (dst, map, mbar) =
                    (self.get(t, &Src::Reg(*dst)), self.get(t, &Src::Reg(*map)), self.get(t, &Src::Reg(*mbar)));
                let at = self.box_coords(t, at);
                self.tma_load(t, dst, map, at, mbar)?;
            }
            Op::TmaStore { map, at, src } => {
                let (map, src) = (self.get(t, &Src::Reg(*map)), self.get(t, &Src::Reg(*src)));
                let at = self.box_coords(t, at);
                self.tma_store(t, map, at, src)?;
            }
            Op::BulkCommit => self.bulk_commit(t),
            Op::BulkWaitRead { n } => self.bulk_wait_read(t, *n),
            Op::MbarrierWait { d, addr, scope, .. } => {
                // run_thread parks the thread until the phase completed.
                let a = self.get(t, &Src::Reg(*addr));
                self.mbarrier_acquire(t, a, *scope)?;
                self.set(t, *d, 1);
            }
            Op::BarArrive { .. } => {}
            Op::Label(_) => {}
            Op::Bra { target } => {
                next = *self.labels.get(target).ok_or("branch to a missing label")?;
            }
            Op::Ret => {
                self.check_no_bulk_reads_at_exit(t)?;
                self.threads[t].done = true;
            }
            Op::Trace { name, shape, elems } => {
                let pc = self.threads[t].pc;
                let occ = {
                    let c = self.trace_counts[t].entry(pc).or_insert(0);
                    *c += 1;
                    *c
                };
                let mut vals = vec![];
                for (flat, r) in elems {
                    let i = self.get(t, flat) as i64;
                    let v = self.get(t, &Src::Reg(*r));
                    let s = match r.class {
                        RegClass::F32 => format!("{:.6}", f32_of(v)),
                        RegClass::B64 => format!("{}", v as i64),
                        _ => format!("{}", v as u32 as i32),
                    };
                    vals.push((i, s));
                }
                let e = self.traces.entry((pc, occ)).or_insert_with(|| (name.clone(), shape.clone(), BTreeMap::new()));
                for (i, s) in vals {
                    e.2.entry(i).or_insert(s);
                }
            }
            Op::Ldmatrix { .. }
            | Op::Movmatrix { .. }
            | Op::Mma { .. }
            | Op::Shfl { .. }
            | Op::Bar { .. }
            | Op::WgmmaFence
            | Op::Wgmma { .. }
            | Op::WgmmaCommit
            | Op::WgmmaWait { .. }
            | Op::SetMaxNReg { .. } => {
                unreachable!("collectives run in step_warp")
            }
        }
        if !self.threads[t].done {
            self.threads[t].pc = next;
        }
        Ok(())
    }
}

/// Runs the whole grid, one cluster at a time (a block, for a program without clusters), or
/// every block together for a program that waits on flags in global memory ([`flags`]).
/// `args` holds one value per parameter of the program, by the parameter's kernel name
/// (tensors as their bytes, written in place).
pub fn run(prog: &ThreadProgram, grid: [u32; 3], args: &mut [(String, SimArg)]) -> Result<SimReport, SimError> {
    let args::BoundArgs { params, mut globals, names, tensor_slot, maps } = args::bind(prog, args)?;
    let mut labels = HashMap::new();
    for (i, inst) in prog.body.iter().enumerate() {
        if let Op::Label(l) = inst.op {
            labels.insert(l, i);
        }
    }
    let mut reg_base = [0usize; 5];
    let mut total = 0usize;
    for (base, count) in reg_base.iter_mut().zip(prog.reg_counts) {
        *base = total;
        total += count as usize;
    }
    let launch_error = |message: String| SimError { message, loc: SrcLoc::default(), block: [0; 3], thread: 0 };
    let cluster_blocks = prog.cluster_blocks.max(1);
    if !grid[0].is_multiple_of(cluster_blocks) {
        return Err(launch_error(format!("a grid of {} blocks along x in clusters of {cluster_blocks}", grid[0])));
    }
    let resident = flags::waits_on_flags(prog);
    if resident {
        flags::check_resident(prog).map_err(launch_error)?;
    }
    let tracks_wgmma_registers = prog.body.iter().any(|i| matches!(i.op, Op::Wgmma { .. }));
    let meets = prog.body.iter().any(|i| matches!(i.op, Op::ClusterBarrier { .. }));
    let warps = prog.threads.div_ceil(32) as usize;
    // Clusters are consecutive along x (the grid's x extent is a multiple of the cluster).
    let grid_blocks: Vec<[u32; 3]> =
        (0..grid[2]).flat_map(|z| (0..grid[1]).flat_map(move |y| (0..grid[0]).map(move |x| [x, y, z]))).collect();
    let group_blocks = if resident { grid_blocks.len().max(1) } else { cluster_blocks as usize };
    let group_warps = group_blocks * warps;
    let mut global_order = resident.then(|| flags::GlobalOrder::new(globals.iter().map(Vec::len)));
    let mut report = SimReport::default();
    let mut result = Ok(());
    for group in grid_blocks.chunks(group_blocks) {
        let mut blocks: Vec<Block> = group
            .iter()
            .enumerate()
            .map(|(rank, &block)| Block {
                prog,
                labels: labels.clone(),
                reg_base,
                threads: (0..prog.threads)
                    .map(|_| Thread {
                        pc: 0,
                        regs: vec![0; total],
                        written: vec![false; total],
                        done: false,
                        blocked: false,
                        parked: false,
                        woke: false,
                        groups: vec![],
                        open_group: vec![],
                        write_clock: vec![0; total],
                        read_clock: vec![std::cell::Cell::new(0); total],
                        in_flight: vec![false; total],
                        register_fence: None,
                        proxy_fences: vec![],
                        bulk_open: vec![],
                        bulk_groups: Default::default(),
                        cluster_arrived: None,
                        cluster_parked: false,
                        polls: Default::default(),
                    })
                    .collect(),
                shared: vec![0; prog.shared_bytes as usize],
                shadow: vec![Shadow { reader: NONE, ..Default::default() }; prog.shared_bytes as usize],
                released: 0,
                warps,
                last_shared_barrier: vec![0; group_warps * warps],
                block,
                params: &params,
                globals: vec![],
                cluster: match resident {
                    true => cluster::Place { rank: 0, blocks: 1 },
                    false => cluster::Place { rank: rank as u32, blocks: cluster_blocks },
                },
                group: cluster::Place { rank: rank as u32, blocks: group_blocks as u32 },
                global_order: None,
                cluster_epoch: 0,
                cluster_releasing: vec![0; group_warps],
                cluster_released: vec![0; group_warps],
                remote_out: vec![],
                copying_out: vec![],
                global_names: &names,
                maps: &maps,
                traces: BTreeMap::new(),
                trace_counts: vec![HashMap::new(); prog.threads as usize],
                executed: 0,
                uninit: std::cell::Cell::new(None),
                touched_in_flight: std::cell::Cell::new(None),
                clock: 0,
                bulk_pending: 0,
                mbarriers: HashMap::new(),
                tracks_wgmma_registers,
                warpgroups: (0..prog.threads.div_ceil(warpgroup::WARPGROUP as u32))
                    .map(|_| warpgroup::Warpgroup::new(prog.max_registers.unwrap_or(0)))
                    .collect(),
                banks: banks::counting().then(|| banks::BankRecorder::new(prog.threads as usize)),
            })
            .collect();
        let r = cluster::run_together(&mut blocks, &mut globals, &mut global_order, meets);
        for blk in &mut blocks {
            report.instructions += blk.executed;
            if let Some(rec) = blk.banks.take() {
                rec.finish(|pc| (prog.body[pc].loc, shared_op(&prog.body[pc].op)));
            }
            for ((_, _), (name, shape, vals)) in std::mem::take(&mut blk.traces) {
                report.prints.push(format_print(&name, &shape, blk.block, &vals));
            }
        }
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    args::hand_back(args, globals, &tensor_slot);
    result.map(|_| report)
}

/// What one round of a block's scheduling did.
enum Round {
    /// Every thread has finished.
    Finished,
    /// Instructions ran, a collective or barrier completed or an mbarrier wait woke.
    Progressed,
    /// Nothing could move: every live thread waits (for another block of the cluster, or for
    /// good: [`stall_error`] says which).
    Stalled,
}

/// Runs every thread of `blk` until it blocks, then the warps' collectives and barriers once.
fn round(blk: &mut Block) -> Result<Round, SimError> {
    let executed = blk.executed;
    for t in 0..blk.threads.len() {
        if let Err(m) = blk.run_thread(t) {
            return Err(blk.fail(t, m));
        }
    }
    if blk.threads.iter().all(|t| t.done) {
        if let Some(g) = blk.warpgroups.iter().position(|g| !g.idle()) {
            return Err(blk.fail(
                g * warpgroup::WARPGROUP,
                format!("warpgroup {g} exits with wgmma results pending (wgmma.wait_group 0 before the end)"),
            ));
        }
        return Ok(Round::Finished);
    }
    let mut progress = blk.executed != executed;
    for w in 0..blk.warps {
        match blk.step_warp(w) {
            Ok(p) => progress |= p,
            Err(m) => return Err(blk.fail(w * 32, m)),
        }
    }
    match blk.step_barrier() {
        Ok(p) => progress |= p,
        Err(m) => return Err(blk.fail(0, m)),
    }
    match blk.unpark() {
        Ok(p) => progress |= p,
        Err(m) => return Err(blk.fail(0, m)),
    }
    Ok(if progress { Round::Progressed } else { Round::Stalled })
}

/// Why a block that cannot move is stuck: a deadlock at an mbarrier phase, at
/// `barrier.cluster`, or at barriers and collectives.
fn stall_error(blk: &mut Block) -> SimError {
    if let Some(t) = blk.threads.iter().position(|t| t.parked) {
        let why = blk.stuck_phase(t);
        return blk.fail(t, format!("deadlock: an mbarrier wait waits for a phase {why}"));
    }
    if let Some(t) = blk.polling_thread() {
        return blk.fail(t, "deadlock: ld.acquire polls a flag word that no block writes again".into());
    }
    if let Some(t) = blk.threads.iter().position(|t| t.cluster_parked) {
        return blk.fail(t, "deadlock: barrier.cluster waits for threads of the cluster that never arrive".into());
    }
    let t = blk.threads.iter().position(|t| !t.done).unwrap_or(0);
    blk.fail(t, "deadlock: threads wait at barriers or collectives that can never complete".into())
}

impl Block<'_> {
    /// The kernel line of thread `t`'s instruction.
    fn loc(&self, t: usize) -> SrcLoc {
        self.prog.body.get(self.threads[t].pc).map(|i| i.loc).unwrap_or_default()
    }

    /// An error at thread `t`'s instruction.
    fn fail(&self, t: usize, message: String) -> SimError {
        SimError { message, loc: self.loc(t), block: self.block, thread: t as u32 }
    }
}

fn format_print(name: &str, shape: &[u32], block: [u32; 3], vals: &BTreeMap<i64, String>) -> String {
    let mut s = format!("print {name} {shape:?} (block {block:?}):\n");
    let cols = *shape.last().unwrap_or(&1) as i64;
    let rows = if shape.len() == 2 { shape[0] as i64 } else { 1 };
    for r in 0..rows {
        let line: Vec<String> =
            (0..cols).map(|c| vals.get(&(r * cols + c)).cloned().unwrap_or_else(|| "?".into())).collect();
        s += &format!("  [{}]\n", line.join(", "));
    }
    s
}
