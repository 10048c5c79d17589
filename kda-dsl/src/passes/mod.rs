//! Passes over the tile IR. Each is a function over [`TileProgram`] in its own file, with its
//! own tests and a dump (`KDA_DUMP=<pass name>` prints the program after it, to stderr).

pub mod allocate_shared;
pub mod check_types;
pub mod drop_dead_tiles;
pub mod fuse_reductions;
pub mod infer_layouts;
pub mod insert_barriers;
pub mod place_producers;
pub mod plan_pipelines;
pub mod plan_tma_stores;

use crate::diag::Diag;
use crate::layout::{FragmentLayout, SharedLayout};
use crate::target::Target;
use crate::tile::{BufId, Buffer, IdVec, KernelDef};
use std::fmt;

/// Where and how a buffer is laid out, decided by `infer_layouts`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BufLayout {
    /// Not yet decided.
    Unknown,
    /// A shared tile.
    Shared(SharedLayout),
    /// A fragment.
    Fragment(FragmentLayout),
    /// A per-thread local tile (row-major registers).
    Local,
}

/// The tile IR plus what the passes decide about it.
#[derive(Clone, Debug)]
pub struct TileProgram {
    /// The kernel.
    pub def: KernelDef,
    /// The target the passes and the lowering choose instructions for.
    pub target: Target,
    /// Per buffer: its layout.
    pub layouts: IdVec<Buffer, BufLayout>,
    /// Per buffer: shared-memory stages (`pipelined` loops multiply the buffers they fill).
    pub stages: IdVec<Buffer, u32>,
    /// Per buffer: byte offset in dynamic shared memory (shared buffers only).
    pub shared_offsets: IdVec<Buffer, u32>,
    /// The scratch area reductions and scans use.
    pub scratch: Scratch,
    /// Total dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// Per buffer: the warp group that owns it (0: the whole block).
    pub owner: IdVec<Buffer, u32>,
    /// Per warp group id: its warps and its own scratch area.
    pub groups: std::collections::BTreeMap<u32, WarpGroupInfo>,
    /// Bytes between the scratch areas of successive producer groups (`allocate_shared`; the
    /// first is [`PRODUCER_GROUP`](place_producers::PRODUCER_GROUP)'s own).
    pub producer_scratch_stride: u32,
    /// Each producer block's plan (`place_producers`), outermost loop first.
    pub producers: Vec<place_producers::ProducerPlan>,
    /// Each `pipelined` loop's plan (`plan_pipelines`), outermost first.
    pub pipelines: Vec<plan_pipelines::PipelinePlan>,
    /// The accumulators of `gemm`s that take `wgmma` (`infer_layouts`).
    pub wgmma_accumulators: std::collections::HashSet<BufId>,
    /// The TMA tensor maps the pipelines copy through (`plan_pipelines`), each a kernel
    /// parameter after the source's.
    pub tensor_maps: Vec<crate::tma_choice::TensorMapSig>,
    /// The copies from shared tiles to global boxes that bulk stores make (`plan_tma_stores`).
    pub tma_stores: Vec<plan_tma_stores::TmaStore>,
}

/// Where the scratch area for reductions and scans lives in dynamic shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scratch {
    /// Byte offset.
    pub offset: u32,
    /// Size in bytes.
    pub bytes: u32,
}

/// What the tile passes know of a warp group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarpGroupInfo {
    /// Warps in the group.
    pub warps: u32,
    /// Byte offset of the group's own scratch area.
    pub scratch_offset: u32,
}

impl TileProgram {
    /// Wraps a checked kernel definition, to be compiled for `target`.
    pub fn new(def: KernelDef, target: Target) -> TileProgram {
        let n = def.buffers.len();
        TileProgram {
            def,
            target,
            layouts: IdVec::filled(n, BufLayout::Unknown),
            stages: IdVec::filled(n, 1),
            shared_offsets: IdVec::filled(n, 0),
            scratch: Scratch::default(),
            shared_bytes: 0,
            owner: IdVec::filled(n, 0),
            groups: Default::default(),
            producer_scratch_stride: 0,
            producers: vec![],
            pipelines: vec![],
            wgmma_accumulators: Default::default(),
            tensor_maps: vec![],
            tma_stores: vec![],
        }
    }

    /// Warps per block.
    pub fn warps(&self) -> u32 {
        self.def.threads / 32
    }

    /// Warps buffer `b` is spread over: its warp group's, or the block's.
    pub fn warps_of(&self, b: BufId) -> u32 {
        match self.owner[b] {
            0 => self.warps(),
            g => self.groups.get(&g).map(|x| x.warps).unwrap_or(1),
        }
    }

    /// The fragment layout of buffer `b` (a bug if it has none).
    pub fn frag(&self, b: BufId) -> FragmentLayout {
        match self.layouts[b] {
            BufLayout::Fragment(l) => l,
            other => panic!("buffer {b} is not a fragment ({other:?}); infer_layouts should have said"),
        }
    }

    /// The shared layout of buffer `b` (a bug if it has none).
    pub fn shared(&self, b: BufId) -> SharedLayout {
        match self.layouts[b] {
            BufLayout::Shared(l) => l,
            other => panic!("buffer {b} is not shared ({other:?}); infer_layouts should have said"),
        }
    }
}

impl fmt::Display for TileProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.def.buffers.iter_ids() {
            let l = match self.layouts[i] {
                BufLayout::Unknown => "?".to_string(),
                BufLayout::Shared(l) => format!("{l} at {} x{} stages", self.shared_offsets[i], self.stages[i]),
                BufLayout::Fragment(l) => l.to_string(),
                BufLayout::Local => "local".to_string(),
            };
            writeln!(f, "// {}: {l}", b.name)?;
        }
        if self.scratch.bytes > 0 {
            writeln!(f, "// scratch: {} bytes at {}", self.scratch.bytes, self.scratch.offset)?;
        }
        writeln!(f, "// shared bytes: {}", self.shared_bytes)?;
        for plan in &self.producers {
            writeln!(f, "{}", place_producers::ProducerLine(&self.def, plan))?;
        }
        for plan in &self.pipelines {
            writeln!(f, "{}", plan_pipelines::PipelineLine(&self.def, plan))?;
        }
        for store in &self.tma_stores {
            let (boxes, _) = &store.boxes;
            let tile = &self.def.buffers[store.buf].name;
            let (map, count, text) = (&boxes.map, boxes.boxes, boxes.map.box_text());
            writeln!(f, "// bulk store of {tile}: {} {count}x {text} {:?}", map.name, map.swizzle)?;
        }
        write!(f, "{}", self.def)
    }
}

/// Prints `text` to stderr when `KDA_DUMP` names `pass` (comma-separated, or `all`).
pub fn dump(pass: &str, text: &dyn fmt::Display) {
    if let Ok(v) = std::env::var("KDA_DUMP") {
        if v.split(',').any(|p| p.trim() == pass || p.trim() == "all") {
            eprintln!("=== KDA_DUMP {pass} ===\n{text}");
        }
    }
}

/// Runs the tile passes in order, for the default target (sm_80).
pub fn run_tile_passes(def: KernelDef) -> Result<TileProgram, Diag> {
    run_tile_passes_for(def, Target::default())
}

/// Runs the tile passes in order, choosing instructions for `target`.
pub fn run_tile_passes_for(def: KernelDef, target: Target) -> Result<TileProgram, Diag> {
    let mut p = TileProgram::new(def, target);
    dump("input", &p.def);
    place_producers::place_producers(&mut p)?;
    dump("place_producers", &p);
    infer_layouts::infer_layouts(&mut p)?;
    dump("infer_layouts", &p);
    fuse_reductions::fuse_reductions(&mut p)?;
    dump("fuse_reductions", &p);
    insert_barriers::insert_barriers(&mut p)?;
    dump("insert_barriers", &p);
    drop_dead_tiles::drop_dead_tiles(&mut p)?;
    dump("drop_dead_tiles", &p);
    plan_pipelines::plan_pipelines(&mut p)?;
    dump("plan_pipelines", &p);
    plan_tma_stores::plan_tma_stores(&mut p)?;
    dump("plan_tma_stores", &p);
    allocate_shared::allocate_shared(&mut p)?;
    dump("allocate_shared", &p);
    Ok(p)
}

/// Small kernels the pass tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::builder::*;
    use crate::diag::SrcLoc;
    use crate::dtype::DType;
    use crate::tile::{KernelDef, LoopKind};

    pub fn loc(line: u32) -> SrcLoc {
        SrcLoc::new("test.rs", line, 1)
    }

    /// Global -> shared -> fragment -> global inside a run-time loop.
    pub fn staged_copy_kernel() -> KernelDef {
        let k = KernelBuilder::new("staged", loc(1));
        let a = k.tensor("a", &["M", "N"], DType::F32, false);
        let o = k.tensor("o", &["M", "N"], DType::F32, true);
        let n = k.dim("N");
        k.launch(vec![Host::int(1)], 64, loc(2));
        let s = k.shared("s", &[16, 16], DType::F32, loc(3));
        let f = k.fragment("f", &[16, 16], DType::F32, loc(4));
        let i = k.begin_for("i", LoopKind::Serial, 0, n, loc(5));
        k.copy(k.tile(&a, vec![Val::from(0), i.clone()], &[16, 16], loc(6)), s, loc(6));
        k.copy(s, f, loc(7));
        k.copy(f, k.tile(&o, vec![Val::from(0), i], &[16, 16], loc(8)), loc(8));
        k.end();
        k.finish().expect("valid")
    }

    /// Two element-wise updates of a shared tile at their own index, then a copy out.
    pub fn owned_updates_kernel() -> KernelDef {
        let k = KernelBuilder::new("owned", loc(1));
        let o = k.tensor("o", &["M", "N"], DType::BF16, true);
        k.launch(vec![Host::int(1)], 32, loc(2));
        let s = k.shared("s", &[16, 16], DType::BF16, loc(3));
        k.fill(&s, 1.0, loc(4));
        for line in [5, 6] {
            let ij = k.begin_parallel(&s, &["i", "j"], loc(line));
            let v = Val::bin(
                crate::tile::BinOp::Add,
                k.elem(&s, ij.clone(), loc(line)),
                Val::cast(ij[0].clone(), DType::F32),
            );
            k.store(&s, ij, v, loc(line));
            k.end();
        }
        k.copy(s, k.tile(&o, vec![Val::from(0), Val::from(0)], &[16, 16], loc(7)), loc(7));
        k.finish().expect("valid")
    }
}
