//! Lowering: tile IR (after the tile passes) to the thread IR, one tile operation at a time.
//! Element distribution is static (layouts are values), so every tile operation unrolls into
//! per-thread instructions; only `serial`/`pipelined` loops and `if`s stay run-time control flow
//! (short `if`s that store to memory run predicated instead: `if_conversion`).

mod addresses;
mod copy;
mod copy_fragment;
pub mod copy_plan;
mod copy_shared;
mod deferred_stores;
mod element_addr;
mod elementwise;
pub mod emit;
mod expr;
mod gemm;
pub mod gemm_plan;
mod plans;
pub mod proxy_fences;
pub use plans::{plans, Plans};
pub mod hoist;
mod if_conversion;
mod loops;
pub mod matrix_access;
mod memory;
mod producer;
mod producer_ring;
mod reduce;
pub mod register_plan;
mod roles;
mod tma;
mod wgmma;
mod wgmma_waits;
mod whole_lines;

use crate::analysis::{divisibility, ranges};
use crate::diag::{Diag, SrcLoc};
use crate::dtype::DType;
use crate::layout::{FragmentKind, FragmentLayout};
use crate::passes::{BufLayout, TileProgram};
use crate::thread_ir::*;
use crate::tile::*;
use emit::Emitter;
use std::collections::HashMap;

/// A lowered value: where it is and its value type (`I32`, `I64`, `F32` or `Bool`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct V {
    pub s: Src,
    pub ty: DType,
}

/// The register class holding values of type `t`.
pub(crate) fn class_of(t: DType) -> RegClass {
    match t {
        DType::I64 => RegClass::B64,
        DType::Bool => RegClass::Pred,
        DType::I32 => RegClass::B32,
        _ => RegClass::F32,
    }
}

/// The PTX arithmetic type of value type `t`.
pub(crate) fn ty_of(t: DType) -> Ty {
    match t {
        DType::I64 => Ty::S64,
        DType::Bool => Ty::Pred,
        DType::I32 => Ty::S32,
        _ => Ty::F32,
    }
}

/// The PTX memory type of element type `t`.
pub(crate) fn mem_ty(t: DType) -> Ty {
    match t {
        DType::F16 | DType::BF16 => Ty::B16,
        DType::F32 => Ty::F32,
        DType::I32 => Ty::S32,
        DType::I64 => Ty::S64,
        DType::Bool => Ty::B16,
    }
}

/// Per-thread registers every lowering needs.
#[derive(Clone, Copy)]
pub(crate) struct ThreadRegs {
    pub tid: Reg,
    pub lane: Reg,
    pub warp: Reg,
    pub g: Reg,
    pub t: Reg,
}

/// The element a `parallel` body is at: the driving tile and the register slot.
#[derive(Clone, Copy)]
pub(crate) struct ElemCtx {
    pub over: BufId,
    pub slot: u32,
    /// The loop's index variables (at most 2).
    pub vars: [Option<VarId>; 2],
}

/// The threads a region of the kernel runs on (the block, or a warp group) and what is theirs:
/// entered and left in one place ([`Lower::warp_group`]).
#[derive(Clone)]
pub(crate) struct Scope {
    /// Their thread, lane and warp registers.
    pub th: ThreadRegs,
    /// Threads taking part in the tile operations being lowered.
    pub threads: u32,
    /// The barrier they synchronize with (0: the block's; a warp group's named barrier; a
    /// register where groups of warps running one copy of the code each take their own).
    pub bar_id: Src,
    /// Byte offset of the scratch area reductions use here (a register as `bar_id` may be).
    pub scratch_base: Src,
    /// Per-thread fragment bases, by layout (its kind aside: vectors share their tile's).
    pub frag_bases: HashMap<FragmentLayout, (Reg, Reg)>,
}

/// Lowering state.
pub(crate) struct Lower<'a> {
    pub p: &'a TileProgram,
    pub em: Emitter,
    /// The threads the operations being lowered run on, and what belongs to them.
    pub scope: Scope,
    pub smem: Reg,
    /// Per buffer: the shared base address (changes per stage inside pipelines).
    pub shared_base: IdVec<Buffer, Option<Src>>,
    /// Per buffer: its registers (fragments and locals).
    pub regs: IdVec<Buffer, Vec<Reg>>,
    pub var_regs: HashMap<VarId, Reg>,
    pub consts: HashMap<VarId, i64>,
    pub dims: HashMap<ParamId, Reg>,
    pub dims64: HashMap<ParamId, Reg>,
    pub ptrs: HashMap<ParamId, Reg>,
    pub scalars: HashMap<ParamId, Reg>,
    pub elem: Option<ElemCtx>,
    /// A `parallel` body's shared stores waiting for the thread's last element.
    pub deferred_stores: Option<deferred_stores::DeferredStores>,
    /// How many times each variable is assigned in the kernel.
    pub assign_counts: HashMap<VarId, usize>,
    /// A divisor of every value each assigned variable takes (alignment of boxes it offsets).
    pub var_divisors: HashMap<VarId, u64>,
    /// The values each variable can take, where known (block indices of a constant grid and
    /// what is built from them): bound checks that cannot fail are dropped.
    pub var_ranges: HashMap<VarId, ranges::Range>,
    /// The kernel copies global to shared other than as pipeline stage fills (barriers then
    /// wait for cp.async).
    pub async_copies: bool,
    /// Index registers known as a per-thread base plus a constant (`element_addr`).
    pub split_indices: HashMap<Reg, element_addr::SplitIndex>,
    /// Inside an element loop: the thread parts of shared addresses computed so far.
    pub thread_offsets: Option<element_addr::ThreadOffsets>,
    /// Every copy's plan, in the order lowered.
    pub copy_plans: Vec<copy_plan::CopyPlan>,
    /// Every `gemm`'s plan, in order.
    pub gemm_plans: Vec<gemm_plan::GemmPlan>,
    /// Every access of a shared tile at a `parallel`'s index, in order (`matrix_access`).
    pub matrix_access_plans: Vec<matrix_access::MatrixAccessPlan>,
    /// Inside a `parallel`: the shared tiles read by `ldmatrix` before its element loop, per
    /// (tile, transposed), each register slot's element as f32.
    pub matrix_read_regs: matrix_access::SlotRegs,
    /// Inside a `parallel`: the shared tiles stored transposed in 8 x 8 blocks after its
    /// element loop, per (tile, transposed), each register slot's value once stored.
    pub matrix_store_regs: matrix_access::SlotRegs,
    /// Per enclosing run-time loop, innermost last: its variable and every variable its body
    /// assigns. An expression that reads none of the innermost's has one value across it.
    pub loop_variant: Vec<std::collections::HashSet<VarId>>,
    /// Where the `wgmma` group of the `gemm` being lowered is waited for.
    pub wgmma_wait: WgmmaWait,
    /// Inside a pipeline's main loop: its element-wise stage fills, loaded and waiting for
    /// their shared stores at the end of the body (`loops::pipelined`).
    pub deferred_fills: Option<Vec<loops::DeferredFill>>,
    /// The kernel's fill warps, if it has any (`roles`).
    pub fill_warps: Option<roles::FillWarps>,
    /// Each of `p.tensor_maps`' generic address (`tma`).
    pub tensor_maps: Vec<Reg>,
    /// Per TMA pipeline (by its loop variable): the parity bits of the phases its threads
    /// wait for next (`tma`).
    pub tma_phases: HashMap<VarId, tma::TmaPhases>,
    /// Lowering the compute warps' copy of a warp-specialized loop, whose barriers leave the
    /// fill warps out (`producer`, `producer_ring`).
    pub producer_apart: bool,
    /// Per loop whose producer block runs on the fill warps (by its variable): the parity bits
    /// of the phases its threads wait for next (`producer_ring`).
    pub ring_phases: HashMap<VarId, producer_ring::RingPhases>,
    /// Lowering the body of a pipelined loop whose barriers leave the next stages' fills in
    /// flight (`BodyBarriers::LeaveFillsInFlight`).
    pub fills_in_flight: bool,
}

/// Where a `wgmma` gemm's group is waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaWait {
    /// Right after it, whole (`wgmma.wait_group 0`).
    Whole,
    /// Right after it, leaving it in flight and the previous iteration's group retired
    /// (`wgmma.wait_group 1`): a pipelined loop that keeps its group in flight
    /// (`plan_pipelines::WgmmaInFlight`).
    KeepLatest,
    /// Where its body's plan says (`wgmma_waits`).
    Planned,
}

impl WgmmaWait {
    /// The wait inside a pipelined loop's body, which keeps its group in flight or not.
    pub fn in_pipeline(in_flight: bool) -> Self {
        if in_flight {
            WgmmaWait::KeepLatest
        } else {
            WgmmaWait::Whole
        }
    }
}

fn count_assigns(body: &[Stmt], n: &mut HashMap<VarId, usize>) {
    for s in body {
        match &s.kind {
            StmtKind::Assign(v, _) => *n.entry(*v).or_default() += 1,
            StmtKind::For { body, .. } | StmtKind::Parallel { body, .. } => {
                // Inside loops an assignment runs many times: never a constant.
                let mut inner = HashMap::new();
                count_assigns(body, &mut inner);
                for v in inner.into_keys() {
                    *n.entry(v).or_default() += 2;
                }
            }
            StmtKind::If(_, t, e) => {
                count_assigns(t, n);
                count_assigns(e, n);
            }
            StmtKind::WarpGroup { body, .. } => count_assigns(body, n),
            _ => {}
        }
    }
}

/// PTX parameter name of kernel parameter `name`.
pub fn param_name(name: &str) -> String {
    format!("p_{name}")
}

/// Lowers a tile program to a thread program.
pub fn lower(p: &TileProgram) -> Result<ThreadProgram, Diag> {
    lower_with_plans(p).map(|(prog, _)| prog)
}

/// [`lower`], and the plans it chose.
pub(crate) fn lower_with_plans(p: &TileProgram) -> Result<(ThreadProgram, Plans), Diag> {
    let mut em = Emitter::new(p.def.loc);
    let tid = em.reg(RegClass::B32);
    em.emit(Op::ReadSpecial { d: tid, sreg: Special::Tid });
    let lane = em.bin(BinKind::And, Ty::B32, RegClass::B32, tid, Src::Imm(31));
    let warp = em.bin(BinKind::Shr, Ty::U32, RegClass::B32, tid, Src::Imm(5));
    let g = em.bin(BinKind::Shr, Ty::U32, RegClass::B32, lane, Src::Imm(2));
    let t = em.bin(BinKind::And, Ty::B32, RegClass::B32, lane, Src::Imm(3));
    let smem = em.reg(RegClass::B32);
    em.emit(Op::SharedBase { d: smem });
    let th = ThreadRegs { tid, lane, warp, g, t };
    let fill_warps =
        (p.def.fill_warps > 0).then(|| roles::FillWarps::new(&mut em, th, p.def.threads, p.def.fill_warps));
    let registers = register_plan::plan_registers(p);
    crate::passes::dump("register_plan", &registers);
    let mut lw = Lower {
        p,
        em,
        scope: Scope {
            th,
            threads: p.def.threads,
            // With fill warps, what the compute warps synchronize inside a tile operation
            // leaves the fill warps out.
            bar_id: Src::Imm(if fill_warps.is_some() { roles::COMPUTE_BARRIER.into() } else { 0 }),
            scratch_base: Src::Imm(p.scratch.offset.into()),
            frag_bases: HashMap::new(),
        },
        smem,
        shared_base: IdVec::filled(p.def.buffers.len(), None),
        regs: IdVec::filled(p.def.buffers.len(), vec![]),
        var_regs: HashMap::new(),
        consts: HashMap::new(),
        dims: HashMap::new(),
        dims64: HashMap::new(),
        ptrs: HashMap::new(),
        scalars: HashMap::new(),
        elem: None,
        deferred_stores: None,
        assign_counts: HashMap::new(),
        var_divisors: divisibility::var_divisors(&p.def),
        var_ranges: ranges::var_ranges(&p.def),
        async_copies: crate::passes::plan_pipelines::plain_shared_copy(&p.def, &p.def.body).is_some(),
        split_indices: HashMap::new(),
        thread_offsets: None,
        copy_plans: vec![],
        gemm_plans: vec![],
        matrix_access_plans: vec![],
        matrix_read_regs: Default::default(),
        matrix_store_regs: Default::default(),
        loop_variant: vec![],
        wgmma_wait: WgmmaWait::Whole,
        deferred_fills: None,
        fill_warps,
        tensor_maps: vec![],
        tma_phases: HashMap::new(),
        producer_apart: false,
        ring_phases: HashMap::new(),
        fills_in_flight: false,
    };
    count_assigns(&p.def.body, &mut lw.assign_counts);
    let mut params = vec![];
    for (i, prm) in p.def.params.iter_ids() {
        let name = param_name(prm.name());
        match prm {
            Param::Tensor { .. } => {
                let raw = lw.em.reg(RegClass::B64);
                lw.em.emit(Op::LdParam { ty: Ty::U64, d: raw, name: name.clone() });
                let d = lw.em.reg(RegClass::B64);
                lw.em.emit(Op::CvtaGlobal { d, a: raw });
                lw.ptrs.insert(i, d);
                params.push((name, ParamKind::Value(Ty::U64)));
            }
            Param::Dim { .. } => {
                let d = lw.em.reg(RegClass::B32);
                lw.em.emit(Op::LdParam { ty: Ty::S32, d, name: name.clone() });
                let d64 = lw.em.reg(RegClass::B64);
                lw.em.emit(Op::Cvt { dty: Ty::S64, sty: Ty::S32, d: d64, a: Src::Reg(d) });
                lw.dims.insert(i, d);
                lw.dims64.insert(i, d64);
                params.push((name, ParamKind::Value(Ty::S32)));
            }
            Param::Scalar { dtype, .. } => {
                let ty = ty_of(*dtype);
                let d = lw.em.reg(class_of(*dtype));
                lw.em.emit(Op::LdParam { ty, d, name: name.clone() });
                lw.scalars.insert(i, d);
                params.push((name, ParamKind::Value(ty)));
            }
        }
    }
    for (axis, v) in p.def.block_vars.iter().enumerate() {
        if let Some(v) = v {
            let d = lw.em.reg(RegClass::B32);
            lw.em.emit(Op::ReadSpecial { d, sreg: Special::Ctaid(axis as u8) });
            lw.var_regs.insert(*v, d);
        }
    }
    for (i, b) in p.def.buffers.iter_ids() {
        match p.layouts[i] {
            BufLayout::Shared(_) => {
                lw.shared_base[i] = Some(lw.em.add32(smem, Src::Imm(p.shared_offsets[i] as i64)));
            }
            BufLayout::Fragment(l) => {
                let class = class_of(crate::passes::check_types::value_type(b.dtype));
                lw.regs[i] = (0..l.slots()).map(|_| lw.em.reg(class)).collect();
                // Computed here, at entry, so the cached registers dominate every use (a warp
                // group's at the group's entry).
                if p.owner[i] == 0 {
                    lw.frag_base(l);
                }
            }
            BufLayout::Local => {
                let class = class_of(crate::passes::check_types::value_type(b.dtype));
                lw.regs[i] = (0..b.numel()).map(|_| lw.em.reg(class)).collect();
            }
            BufLayout::Unknown => unreachable!("infer_layouts leaves no buffer unknown"),
        }
    }
    params.extend(lw.tma_entry());
    lw.producer_ring_entry();
    let body = p.def.body.clone();
    match registers {
        register_plan::RegisterPlan::Split(split) => {
            lw.block(&body[..split.parts_at])?;
            lw.roles_apart(&body[split.parts_at..], split)?
        }
        register_plan::RegisterPlan::Uniform(_) => lw.block(&body)?,
    }
    lw.em.emit(Op::Ret);
    let mut prog = ThreadProgram {
        name: p.def.name.clone(),
        params,
        threads: p.def.launched_threads(),
        min_blocks_per_sm: p.def.min_blocks_per_sm,
        max_registers: match registers {
            register_plan::RegisterPlan::Split(split) => Some(split.at_entry),
            register_plan::RegisterPlan::Uniform(_) => None,
        },
        shared_bytes: p.shared_bytes,
        cluster_blocks: p.def.cluster_blocks,
        body: lw.em.body,
        reg_counts: lw.em.counts,
    };
    for moved in hoist::hoist_invariants(&mut prog, p.def.hoist) {
        crate::passes::dump("hoist", &moved);
    }
    proxy_fences::insert_proxy_fences(&mut prog);
    Ok((
        prog,
        Plans { copies: lw.copy_plans, gemms: lw.gemm_plans, matrix_accesses: lw.matrix_access_plans, registers },
    ))
}

impl Lower<'_> {
    pub(crate) fn def(&self) -> &KernelDef {
        &self.p.def
    }

    pub(crate) fn err<T>(&self, loc: SrcLoc, msg: impl Into<String>) -> Result<T, Diag> {
        Err(Diag::new(loc, msg))
    }

    pub(crate) fn block(&mut self, body: &[Stmt]) -> Result<(), Diag> {
        // A pipeline keeping its group in flight, and warp roles (whose branches the waits
        // would straddle), wait right after each `wgmma`; a `parallel` body holds none.
        if self.wgmma_wait != WgmmaWait::Whole
            || self.role().is_some()
            || self.elem.is_some()
            || self.p.target != crate::target::Target::Sm90a
        {
            for s in body {
                self.stmt(s)?;
            }
            return Ok(());
        }
        let waits = wgmma_waits::plan_waits(body, |s| self.wgmma_group(s));
        for w in &waits {
            crate::passes::dump("wgmma_waits", w);
        }
        let mut waits = waits.into_iter().peekable();
        for (i, s) in body.iter().enumerate() {
            while let Some(w) = waits.next_if(|w| w.at == i) {
                self.em.loc = s.loc;
                self.em.emit(Op::WgmmaWait { n: w.keep });
            }
            let outer = self.wgmma_wait;
            if matches!(s.kind, StmtKind::Gemm { .. }) {
                self.wgmma_wait = WgmmaWait::Planned;
            }
            let lowered = self.stmt(s);
            self.wgmma_wait = outer;
            lowered?;
        }
        for w in waits {
            self.em.emit(Op::WgmmaWait { n: w.keep });
        }
        Ok(())
    }

    /// Whether `e` may take another value in the next iteration of the innermost run-time loop
    /// being lowered: it reads a variable the loop assigns (its own included) or memory.
    pub(crate) fn varies_in_loop(&self, e: &Expr) -> bool {
        let Some(variant) = self.loop_variant.last() else { return false };
        match e {
            Expr::Int(..) | Expr::Float(_) | Expr::Bool(_) | Expr::Dim(_) | Expr::Scalar(_) => false,
            Expr::Var(v) => variant.contains(v),
            Expr::Load(..) | Expr::Elem(..) => true,
            Expr::Unary(_, a) | Expr::Cast(_, a) => self.varies_in_loop(a),
            Expr::Binary(_, a, b) => self.varies_in_loop(a) || self.varies_in_loop(b),
            Expr::Select(c, a, b) => self.varies_in_loop(c) || self.varies_in_loop(a) || self.varies_in_loop(b),
        }
    }

    /// The `wgmma` group statement `s` issues, when it is a `gemm` that takes `wgmma`: its
    /// accumulator and the shared operands it reads through descriptors.
    fn wgmma_group(&self, s: &Stmt) -> Option<wgmma_waits::Group> {
        let StmtKind::Gemm { a, b, c } = &s.kind else { return None };
        let gemm_plan::GemmPlan::Wgmma(p) = self.plan_gemm(a, b, *c, s.loc).ok()? else { return None };
        let mut shared = vec![b.buf];
        if matches!(p.a, gemm_plan::WgmmaSource::Shared(_)) {
            shared.push(a.buf);
        }
        Some(wgmma_waits::Group { acc: *c, shared })
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), Diag> {
        self.em.loc = s.loc;
        match self.role() {
            // A wgmma accumulator's fill runs on the fill warps too (their copy of its registers
            // is never read): a branch around it would join the fill warps' path into the
            // wgmma pipeline's, and ptxas then serializes the wgmmas (C7515).
            Some(roles::Role::Both) if matches!(s.kind, StmtKind::Fill(b, _) if self.p.wgmma_accumulators.contains(&b)) =>
            {
                return self.in_role(roles::Role::Compute, |lw| lw.stmt(s));
            }
            Some(roles::Role::Both) if roles::compute_only(s) => return self.on_compute_warps(|lw| lw.stmt(s)),
            // The fill warps' copy of a pipelined loop keeps its skeleton and barriers only.
            Some(roles::Role::Fill) if roles::compute_only(s) => return Ok(()),
            _ => {}
        }
        match self.partial_warps(s)? {
            // A gemm, fill, copy or `parallel` of a fragment laid out over the first `active`
            // warps (smaller than the block allows): the other warps skip it.
            Some(active) => {
                let warp = self.scope.th.warp;
                let idle = self.em.setp(Cmp::Ge, Ty::U32, Src::Reg(warp), Src::Imm(i64::from(active)));
                let skip = self.em.label();
                self.em.emit_if(idle, true, Op::Bra { target: skip });
                self.scoped_addresses(|lw| lw.stmt_on_all_warps(s))?;
                self.em.emit(Op::Label(skip));
                Ok(())
            }
            None => self.stmt_on_all_warps(s),
        }
    }

    /// The warps a statement's fragments are laid out over, when fewer than the scope's:
    /// `infer_layouts` gives a gemm fragment too small for every warp the first warps that fit
    /// it. Reductions and scans of such fragments (which synchronize the scope's warps inside)
    /// are refused.
    fn partial_warps(&self, s: &Stmt) -> Result<Option<u32>, Diag> {
        let warps = self.scope.threads / 32;
        let active = |b: BufId| match self.p.layouts[b] {
            BufLayout::Fragment(l) if l.wm * l.wn < warps => Some(l.wm * l.wn),
            _ => None,
        };
        let region = |r: &Region| match r {
            Region::Buf(b) => active(*b),
            _ => None,
        };
        let found = match &s.kind {
            StmtKind::Gemm { a, c, .. } => active(*c).or(active(a.buf)),
            StmtKind::Fill(b, _) => active(*b),
            StmtKind::Parallel { over, .. } => active(*over),
            StmtKind::Copy { src, dst } => region(src).or(region(dst)),
            StmtKind::Reduce { src, dst, .. }
            | StmtKind::Cumsum { src, dst, .. }
            | StmtKind::ReduceLanes { dst: src @ dst, .. }
            | StmtKind::ReduceVectorLanes { dst: src @ dst, .. } => {
                if let Some(b) = [*src, *dst].into_iter().find(|b| active(*b).is_some()) {
                    return self.err(
                        s.loc,
                        format!(
                            "fragment `{}` is laid out over {} of the block's {warps} warps; reductions and scans need it over all of them",
                            self.def().buffers[b].name,
                            active(b).unwrap_or(warps)
                        ),
                    );
                }
                None
            }
            _ => None,
        };
        Ok(found)
    }

    fn stmt_on_all_warps(&mut self, s: &Stmt) -> Result<(), Diag> {
        let loc = s.loc;
        match &s.kind {
            StmtKind::Assign(v, e) => {
                let ty = self.def().vars[*v].dtype;
                // A variable set once to a value known now is a constant (masks and addresses fold).
                if self.assign_counts.get(v) == Some(&1) {
                    if let Some(c) = self.const_of(e) {
                        self.consts.insert(*v, c);
                    }
                }
                let val = self.expr(e, ty, loc)?;
                let d = match self.var_regs.get(v) {
                    Some(r) => *r,
                    None => {
                        let r = self.em.reg(class_of(ty));
                        self.var_regs.insert(*v, r);
                        r
                    }
                };
                self.mov(d, val);
                Ok(())
            }
            StmtKind::Fill(b, e) => self.fill(*b, e, loc),
            StmtKind::Copy { src, dst } => self.copy(src, dst, loc),
            StmtKind::Gemm { a, b, c } => self.gemm(a, b, *c, loc),
            StmtKind::Parallel { over, vars, body } => self.parallel(*over, vars, body, loc),
            StmtKind::Store(b, idx, e) => self.store(*b, idx, e, loc),
            StmtKind::StoreGlobal(t, idx, e) => {
                let ty = self.tensor_dtype(*t);
                let val = self.expr(e, crate::passes::check_types::value_type(ty), loc)?;
                let addr = self.global_addr(*t, idx, loc)?;
                self.store_mem(Space::Global, addr, ty, val);
                Ok(())
            }
            StmtKind::For { var, kind, start, end, body } => {
                let run_time = *kind != LoopKind::Unroll;
                if run_time {
                    let mut assigned = HashMap::new();
                    count_assigns(body, &mut assigned);
                    self.loop_variant.push(assigned.into_keys().chain([*var]).collect());
                }
                let lowered = self.scoped_addresses(|lw| lw.for_loop(*var, *kind, start, end, body, loc));
                if run_time {
                    self.loop_variant.pop();
                }
                lowered
            }
            StmtKind::If(c, t, e) => {
                let cond = self.expr(c, DType::Bool, loc)?;
                match cond.s {
                    Src::Imm(v) => self.block(if v != 0 { t } else { e }),
                    // Inside an if-converted arm (whose nested `if`s are short by its check),
                    // an `if` is predicated too: a branch there would put labels under a guard.
                    Src::Reg(p) if self.em.guard.is_some() || if_conversion::predicable(self.p, t, e) => {
                        self.if_converted(p, t, e)
                    }
                    Src::Reg(p) => {
                        let (l_else, l_end) = (self.em.label(), self.em.label());
                        self.em.emit_if(p, false, Op::Bra { target: l_else });
                        self.scoped_addresses(|lw| lw.block(t))?;
                        self.em.emit(Op::Bra { target: l_end });
                        self.em.emit(Op::Label(l_else));
                        self.scoped_addresses(|lw| lw.block(e))?;
                        self.em.emit(Op::Label(l_end));
                        Ok(())
                    }
                    Src::F32(_) => unreachable!("a condition is a predicate"),
                }
            }
            StmtKind::Reduce { op, src, dst, axis } => self.reduce(*op, *src, *dst, *axis, loc),
            StmtKind::WarpGroup { first, count, id, var, body } => {
                self.scoped_addresses(|lw| lw.warp_group(*first, *count, *id, *var, body))
            }
            StmtKind::Cumsum { src, dst, axis } => self.cumsum(*src, *dst, *axis, loc),
            StmtKind::ReduceLanes { op, dst, axis } => self.reduce_lanes(*op, *dst, *axis, loc),
            StmtKind::ReduceVectorLanes { op, dst, vector } => self.reduce_vector_lanes(*op, *dst, *vector, loc),
            StmtKind::Print(b) => self.print(*b),
            StmtKind::Prefetch(r) => self.prefetch(r, loc),
            StmtKind::Barrier => {
                // Asynchronous copies (other than stage fills) land before the barrier releases
                // anyone. In a kernel that has them, a barrier inside a pipeline's body also
                // waits for the next stage's fill unless the loop asks otherwise (in decode,
                // leaving it in flight measured slower, three times, though a profile puts much
                // of the time at this wait: docs/performance.md, "Decode and GEMM"). Such a
                // body issues no other copy (`plan_pipelines`), and the copies before the loop
                // landed at its first iteration's wait.
                if !self.fills_in_flight {
                    self.wait_plain_async_copies();
                }
                self.block_barrier();
                Ok(())
            }
            StmtKind::Producer(_) => {
                unreachable!("a producer block left in place is lowered with its loop (`producer_ring`)")
            }
        }
    }

    /// A barrier over the threads of the current scope: `bar.sync 0` for the block, the group's
    /// named barrier inside a warp group.
    pub(crate) fn barrier(&mut self) {
        let count = (self.scope.bar_id != Src::Imm(0)).then_some(self.scope.threads);
        self.em.emit(Op::Bar { id: self.scope.bar_id, count, reach: BarrierReach::SameInstruction });
    }

    /// Warps `first .. first + count` run `body`, with thread indices, tile distributions,
    /// barriers and scratch of their own; the other warps skip it.
    fn warp_group(&mut self, first: u32, count: u32, id: u32, var: VarId, body: &[Stmt]) -> Result<(), Diag> {
        let th = self.scope.th;
        let lo = self.em.setp(Cmp::Ge, Ty::S32, th.warp, Src::Imm(first as i64));
        let hi = self.em.setp(Cmp::Lt, Ty::S32, th.warp, Src::Imm((first + count) as i64));
        let inside = self.em.and_pred(Some(lo), Some(hi)).expect("two predicates");
        let end = self.em.label();
        self.em.emit_if(inside, false, Op::Bra { target: end });
        let tid = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.tid, Src::Imm(first as i64 * 32));
        let warp = self.em.bin(BinKind::Sub, Ty::S32, RegClass::B32, th.warp, Src::Imm(first as i64));
        let group = Scope {
            th: ThreadRegs { tid, warp, ..th },
            threads: count * 32,
            bar_id: Src::Imm(id.into()),
            scratch_base: Src::Imm(
                self.p.groups.get(&id).map(|g| g.scratch_offset).unwrap_or(self.p.scratch.offset).into(),
            ),
            frag_bases: HashMap::new(),
        };
        let outer = std::mem::replace(&mut self.scope, group);
        self.var_regs.insert(var, warp);
        for (i, l) in self.p.layouts.iter_ids() {
            if let (BufLayout::Fragment(l), true) = (l, self.p.owner[i] == id) {
                self.frag_base(*l);
            }
        }
        let r = self.block(body);
        self.scope = outer;
        self.em.emit(Op::Label(end));
        r
    }

    pub(crate) fn tensor_dtype(&self, t: ParamId) -> DType {
        match &self.def().params[t] {
            Param::Tensor { dtype, .. } => *dtype,
            _ => unreachable!("a tensor parameter"),
        }
    }

    pub(crate) fn tensor_dims(&self, t: ParamId) -> Vec<ParamId> {
        match &self.def().params[t] {
            Param::Tensor { dims, .. } => dims.clone(),
            _ => unreachable!("a tensor parameter"),
        }
    }

    /// Per-thread (row base, col base) of a fragment layout: `wr*WM + g` and `wc*WN + vec*t`.
    pub(crate) fn frag_base(&mut self, l: FragmentLayout) -> (Reg, Reg) {
        let key = FragmentLayout { kind: crate::layout::FragmentKind::Tile, ..l };
        if let Some(r) = self.scope.frag_bases.get(&key) {
            return *r;
        }
        // Computed for every thread: the bases outlive an if-converted branch that first asks.
        let guard = self.em.guard.take();
        let th = self.scope.th;
        let wr = self.em.op32(BinKind::Div, th.warp, l.wn as i64);
        let wc = self.em.op32(BinKind::Rem, th.warp, l.wn as i64);
        let (g, t) = self.lane_parts(l);
        let rb = self.em.mul32(wr, Src::Imm(l.warp_rows() as i64));
        let rb = self.em.add32(rb, g);
        let cb = self.em.mul32(wc, Src::Imm(l.warp_cols() as i64));
        let t2 = self.em.mul32(t, Src::Imm(l.vec as i64));
        let cb = self.em.add32(cb, t2);
        let r = (self.em.to_reg(rb, RegClass::B32, Ty::U32), self.em.to_reg(cb, RegClass::B32, Ty::U32));
        self.scope.frag_bases.insert(key, r);
        self.em.guard = guard;
        r
    }

    /// The first fragment row and column of this thread's warp in layout `frag`.
    pub(crate) fn warp_origin(&mut self, frag: FragmentLayout) -> (Src, Src) {
        let th = self.scope.th;
        let wr = self.em.op32(BinKind::Div, th.warp, i64::from(frag.wn));
        let wc = self.em.op32(BinKind::Rem, th.warp, i64::from(frag.wn));
        (
            self.em.mul32(wr, Src::Imm(i64::from(frag.warp_rows()))),
            self.em.mul32(wc, Src::Imm(i64::from(frag.warp_cols()))),
        )
    }

    /// This thread's row group `g` and lane along the row `t` in fragment layout `l`.
    pub(crate) fn lane_parts(&mut self, l: FragmentLayout) -> (Src, Src) {
        match l.lanes_per_row {
            4 => (Src::Reg(self.scope.th.g), Src::Reg(self.scope.th.t)),
            32 => (Src::Imm(0), Src::Reg(self.scope.th.lane)),
            n => unreachable!("layouts have 4 or 32 lanes per row, not {n}"),
        }
    }

    /// (row, col) of slot `s` of a fragment (for a vector: (index, 0)).
    pub(crate) fn frag_coords(&mut self, l: FragmentLayout, s: u32) -> (Src, Src) {
        let (rb, cb) = self.frag_base(l);
        let c = l.slot_coord(s);
        let (row_bits, col_bits) = element_addr::fragment_base_bits(l, self.scope.threads / 32);
        let row = self.split_index(rb, row_bits, c.row_off);
        let col = self.split_index(cb, col_bits, c.col_off);
        match l.kind {
            FragmentKind::Tile => (row, col),
            FragmentKind::Rows => (row, Src::Imm(0)),
            FragmentKind::Cols => (col, Src::Imm(0)),
        }
    }
}
