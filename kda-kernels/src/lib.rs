//! The kernels of kda written in the tile DSL, their configs, the curated list of shipped
//! variants, and f64 CPU references.

#![warn(missing_docs)]

pub mod check;
pub mod chunk;
pub mod chunk_check;
pub mod chunk_families;
pub mod chunk_merge;
pub mod chunk_order;
pub mod chunk_prep;
pub mod chunk_ref;
pub mod chunk_segments;
pub mod chunk_split;
pub mod decode;
pub mod decode_families;
pub mod decode_ref;
pub mod gemm;
pub mod reference;
pub mod rules;
pub mod selftest;

use kda_dsl::tile::KernelDef;
use kda_dsl::{Diag, Target};

/// One shipped kernel variant: a family, a config name and how to build it.
#[derive(Clone)]
pub struct Variant {
    /// Kernel family (`gemm`, ...).
    pub family: &'static str,
    /// Config name, unique within the family.
    pub name: String,
    /// True for the family's default variant on its target (`kda emit FAMILY [--target T]`).
    pub default: bool,
    /// The target the runtime compiles it for: sm_80 (PTX the driver runs on every GPU from
    /// compute capability 8.0) or sm_90a (compute capability 9.0 exactly).
    pub target: Target,
    build: std::sync::Arc<dyn Fn() -> Result<KernelDef, Diag> + Send + Sync>,
}

impl Variant {
    /// `family/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.family, self.name)
    }
    /// Builds the kernel definition.
    pub fn build(&self) -> Result<KernelDef, Diag> {
        (self.build)()
    }
}

/// The variant of `cfg` in `family`, named by `key`, built by `build`; the family's default
/// when `cfg` is its config type's default.
fn variant_of<C>(
    family: &'static str,
    cfg: C,
    key: fn(&C) -> String,
    build: fn(&C) -> Result<KernelDef, Diag>,
) -> Variant
where
    C: Default + PartialEq + Send + Sync + 'static,
{
    let default = cfg == C::default();
    Variant { family, name: key(&cfg), default, target: Target::Sm80, build: std::sync::Arc::new(move || build(&cfg)) }
}

/// `cfg`'s variant (`variant` makes it) compiled for `target`: on sm_90a under its own name
/// (the same config for sm_80 is another variant), the family's default there when it is the
/// first of `shipped` (the family's sm_90a configs).
fn variant_for<C: PartialEq>(cfg: C, target: Target, variant: fn(C) -> Variant, shipped: fn() -> Vec<C>) -> Variant {
    match target {
        Target::Sm90a => {
            let default = shipped().first() == Some(&cfg);
            let v = variant(cfg);
            Variant { target: Target::Sm90a, default, name: format!("{}_sm90a", v.name), ..v }
        }
        _ => variant(cfg),
    }
}

/// The sm_90a variant of a GEMM config of [`hopper_gemm_configs`] (the default is the first).
pub fn hopper_gemm_variant(cfg: gemm::GemmConfig) -> Variant {
    variant_for(cfg, Target::Sm90a, gemm_variant, hopper_gemm_configs)
}

/// The variant of a GEMM config compiled for `target`: [`hopper_gemm_variant`] on sm_90a,
/// [`gemm_variant`] otherwise.
pub fn gemm_variant_on(cfg: gemm::GemmConfig, target: Target) -> Variant {
    variant_for(cfg, target, gemm_variant, hopper_gemm_configs)
}

/// The variant of a GEMM config (the default variant is the first of [`gemm_configs`]).
pub fn gemm_variant(cfg: gemm::GemmConfig) -> Variant {
    // The first of `gemm_configs()` is the default config.
    variant_of("gemm", cfg, gemm::GemmConfig::key, gemm::gemm)
}

/// The variant of a decode config; shipped when it is one of [`decode_configs`], otherwise
/// compiled on first use like any config.
pub fn decode_variant(cfg: decode::DecodeConfig) -> Variant {
    variant_of("decode", cfg, decode::DecodeConfig::key, decode::decode)
}

/// The decode configs shipped: the bench cases' variants, each with the launch shape the API
/// picks for it (B = 1, which is the default; B >= 8 with an f32 or a bf16 state; several
/// tokens per sequence).
pub fn decode_configs() -> Vec<decode::DecodeConfig> {
    use decode::DecodeConfig as C;
    let d = C::default();
    debug_assert_eq!(d.clone().with_launch_shape_for(false, 1), d);
    vec![
        d.clone(),
        d.clone().with_launch_shape_for(false, 8),
        C { state_dtype: kda_dsl::DType::BF16, ..d.clone() }.with_launch_shape_for(false, 8),
        C { accepted: Some(kda_dsl::DType::I32), ..d }.with_launch_shape_for(true, 8),
    ]
}

/// The variant of a chunk config; shipped when it is one of [`chunk_configs`], otherwise
/// compiled on first use like any config.
pub fn chunk_variant(cfg: chunk::ChunkConfig) -> Variant {
    variant_of("chunk", cfg, chunk::ChunkConfig::key, chunk::chunk)
}

/// The sm_90a variant of a chunk config (shipped when it is one of [`hopper_chunk_configs`],
/// the first the default on sm_90a).
pub fn hopper_chunk_variant(cfg: chunk::ChunkConfig) -> Variant {
    variant_for(cfg, Target::Sm90a, chunk_variant, hopper_chunk_configs)
}

/// The variant of a chunk config compiled for `target`: [`hopper_chunk_variant`] on sm_90a,
/// [`chunk_variant`] otherwise.
pub fn chunk_variant_on(cfg: chunk::ChunkConfig, target: Target) -> Variant {
    variant_for(cfg, target, chunk_variant, hopper_chunk_configs)
}

/// The chunk configs shipped for sm_90a (compute capability 9.0): the fused ones of
/// [`chunk_configs`] at [`chunk::ChunkShape::HOPPER`], whose state products take `wgmma` with
/// the state as the register A operand. The chain over a prepared workspace (2 warps, no whole
/// warpgroup) and the split's passes ship only their sm_80 variants (a caller's
/// `ChunkTuning::hopper` with a split compiles its fused passes for sm_90a on first use).
pub fn hopper_chunk_configs() -> Vec<chunk::ChunkConfig> {
    chunk_configs()
        .into_iter()
        .filter(|c| c.preparation == chunk::Preparation::InKernel && c.run == chunk::ChunkRun::Output)
        .map(|c| c.on_target(Target::Sm90a))
        .collect()
}

/// The variant of a chunk-preparation config, which fills the workspace the `chunk` variant
/// with [`chunk::Preparation::Workspace`] reads; shipped when it is one of
/// [`chunk_prep_configs`].
pub fn chunk_prep_variant(cfg: chunk_prep::PrepConfig) -> Variant {
    variant_of("chunk_prep", cfg, chunk_prep::PrepConfig::key, chunk_prep::chunk_prep)
}

/// The preparation configs shipped: the bench cases' (dense and varlen, and dense with bf16
/// operands), and the split's
/// (over its segments, [`split_configs_shipped`]).
pub fn chunk_prep_configs() -> Vec<chunk_prep::PrepConfig> {
    let d = chunk_prep::PrepConfig::default();
    let split = split_configs_shipped().prep.expect("the shipped split is prepared");
    vec![
        d.clone(),
        chunk_prep::PrepConfig { varlen: Some(kda_dsl::DType::I64), ..d.clone() },
        chunk_prep::PrepConfig { operands: chunk::ChunkOperands::Bf16, ..d },
        split,
    ]
}

/// The variant of a split-merge config ([`chunk_merge::chunk_merge`]); shipped when it is the
/// one of [`split_configs_shipped`].
pub fn chunk_merge_variant(cfg: chunk_merge::MergeConfig) -> Variant {
    variant_of("chunk_merge", cfg, chunk_merge::MergeConfig::key, chunk_merge::chunk_merge)
}

/// The variant of a split-finish config ([`chunk_merge::chunk_finish`]).
pub fn chunk_finish_variant(cfg: chunk_merge::MergeConfig) -> Variant {
    variant_of("chunk_finish", cfg, chunk_merge::MergeConfig::key, chunk_merge::chunk_finish)
}

/// The variant of a segment-schedule config ([`chunk_segments::chunk_segments`]).
pub fn chunk_segments_variant(cfg: chunk_segments::SegmentsConfig) -> Variant {
    variant_of("chunk_segments", cfg, chunk_segments::SegmentsConfig::key, chunk_segments::chunk_segments)
}

/// The split's kernels shipped: those of the bench case's call over a prepared workspace
/// (dense, f32 states in and out), which `chunk_kda` splits with few value heads.
pub fn split_configs_shipped() -> chunk_split::SplitConfigs {
    let call = chunk::ChunkConfig {
        preparation: chunk::Preparation::Workspace,
        shape: chunk::ChunkShape::PREPARED,
        ..chunk::ChunkConfig::default()
    };
    chunk_split::split_configs(&call)
}

/// The chunk configs shipped: the bench cases' variant (dense and varlen), the decode pool in
/// place, the precomputed gate, the bench case's chain over a prepared workspace (the
/// two-kernel path a call with a workspace and few chains takes), the bench case's fused and
/// prepared chains with bf16 operands ([`chunk::ChunkOperands`]), and the split's three passes
/// ([`split_configs_shipped`]).
pub fn chunk_configs() -> Vec<chunk::ChunkConfig> {
    use chunk::{ChunkConfig as C, ChunkGate, ChunkStates, Preparation};
    let d = C::default();
    let mut configs = vec![
        d.clone(),
        C { preparation: Preparation::Workspace, shape: chunk::ChunkShape::PREPARED, ..d.clone() },
        C { varlen: Some(kda_dsl::DType::I64), ..d.clone() },
        C {
            varlen: Some(kda_dsl::DType::I32),
            states: ChunkStates::Pool { indices: kda_dsl::DType::I32, has_initial: Some(kda_dsl::DType::I32) },
            ..d.clone()
        },
        C { gate: ChunkGate::Precomputed, ..d.clone() },
        C { operands: chunk::ChunkOperands::Bf16, ..d.clone() },
        C {
            operands: chunk::ChunkOperands::Bf16,
            preparation: Preparation::Workspace,
            shape: chunk::ChunkShape::PREPARED,
            ..d
        },
    ];
    let split = split_configs_shipped();
    configs.extend([split.transition, split.from_zeros, split.output]);
    configs
}

/// The GEMM configs shipped (and covered by snapshots and ptxas).
pub fn gemm_configs() -> Vec<gemm::GemmConfig> {
    use gemm::GemmConfig as G;
    use kda_dsl::DType::*;
    let mut out = vec![];
    // Aligned shapes take 128x128 tiles; the unaligned fallback, 64x64 with element copies.
    for aligned in [true, false] {
        for dtype in [BF16, F16] {
            for o in [F32, dtype] {
                for b_transposed in [true, false] {
                    let base = if aligned {
                        G::default()
                    } else {
                        G { bm: 64, bn: 64, bk: 32, stages: 3, threads: 128, ..G::default() }
                    };
                    out.push(G { dtype, out: o, b_transposed, aligned, ..base });
                }
            }
        }
    }
    out
}

/// The GEMM configs shipped for sm_90a (compute capability 9.0), both operand orders with
/// aligned shapes, as Hopper's fastest GEMMs are built: a producer warpgroup filling a 4-stage
/// ring of canonical 128-byte-swizzled tiles (K = 64) by TMA and handing its registers to two
/// consumer warpgroups (`setmaxnreg`) of 64 x 256 accumulators each, `wgmma` m64n256k16 with
/// one group in flight, each consumer storing its fragments. Against 128-column tiles with an
/// epilogue through shared memory (the earlier default), the 256-column tile reads A half as
/// often and was the faster at 8192³ (`kda bench --sweep-gemm`, docs/performance.md,
/// 2026-12-05, night); a 256-column staged epilogue would not fit beside the ring. The default
/// is the first (`A·Bᵀ`, bf16 to f32).
pub fn hopper_gemm_configs() -> Vec<gemm::GemmConfig> {
    use gemm::GemmConfig as G;
    use kda_dsl::DType::*;
    let base =
        G { bm: 128, bn: 256, bk: 64, stages: 4, threads: 256, fill_warps: 4, staged_store: false, ..G::default() };
    let mut configs = vec![];
    for b_transposed in [true, false] {
        for dtype in [BF16, F16] {
            for out in [F32, dtype] {
                configs.push(G { b_transposed, dtype, out, ..base.clone() });
            }
        }
    }
    configs
}

/// The sm_80 GEMM tile configs `kda bench --sweep-gemm` times (bf16 to f32, `A·Bᵀ`): how the
/// shipped default was chosen.
pub fn gemm_candidates() -> Vec<gemm::GemmConfig> {
    tile_configs(&[
        (128, 128, 32, 3, 256, true),
        (128, 128, 32, 4, 256, true),
        (128, 128, 64, 3, 256, true),
        (128, 256, 32, 3, 256, true),
        (256, 128, 32, 3, 256, true),
        (128, 256, 64, 3, 256, true),
        (128, 128, 32, 4, 128, true),
        (256, 128, 64, 3, 512, true),
        (128, 256, 32, 4, 256, true),
    ])
}

/// Default GEMM configs with these (bm, bn, bk, stages, threads, b_transposed).
fn tile_configs(tiles: &[(usize, usize, usize, usize, usize, bool)]) -> Vec<gemm::GemmConfig> {
    let config = |&(bm, bn, bk, stages, threads, b_transposed): &(usize, usize, usize, usize, usize, bool)| {
        gemm::GemmConfig { bm, bn, bk, stages, threads, b_transposed, ..gemm::GemmConfig::default() }
    };
    tiles.iter().map(config).collect()
}

/// The sm_90a GEMM configs `kda bench --sweep-gemm` times beside the shipped one (bf16 to f32):
/// two warpgroups of 64 rows (or four), N up to 256, K of one or two 128-byte slabs, `A·B`
/// with its B MN-major in slabs, a fill warp beside the warpgroups, an epilogue through
/// shared memory, and the shipped tiles walked in groups of 8 tile rows. Each takes `wgmma`;
/// the simulator checks them (`gemm_sim`).
pub fn hopper_gemm_candidates() -> Vec<gemm::GemmConfig> {
    use gemm::GemmConfig as G;
    tile_configs(&[
        (128, 128, 64, 4, 256, true),
        (128, 128, 64, 3, 256, true),
        (128, 128, 64, 5, 256, true),
        (128, 256, 64, 3, 256, true),
        (128, 128, 128, 3, 256, true),
        (256, 128, 64, 3, 512, true),
        (128, 128, 64, 4, 256, false),
        (128, 256, 64, 3, 256, false),
    ])
    .into_iter()
    // One fill warp issuing the copies, so the warpgroups only multiply; an epilogue through
    // shared memory; a producer warpgroup (warp-specialized, its registers handed to the two
    // consumer warpgroups), which leaves room for 64 x 256 accumulators.
    .chain(
        [
            (128, 3, true, 1, false),
            (128, 4, true, 1, false),
            (128, 4, false, 1, false),
            (128, 3, true, 0, true),
            (128, 3, true, 1, true),
            (128, 4, true, 4, false),
            (256, 3, true, 4, false),
            (256, 4, true, 4, false),
            (256, 4, false, 4, false),
            (128, 4, true, 4, true),
            (128, 4, false, 4, true),
        ]
        .map(|(bn, stages, b_transposed, fill_warps, staged_store)| G {
            bm: 128,
            bn,
            bk: 64,
            stages,
            threads: 256,
            b_transposed,
            fill_warps,
            staged_store,
            ..G::default()
        }),
    )
    // The shipped tiles with the output walked 8 tile rows at a time (`GemmConfig::raster_group`).
    .chain(
        hopper_gemm_configs()
            .into_iter()
            .filter(|c| c.dtype == kda_dsl::DType::BF16 && c.out == kda_dsl::DType::F32)
            .map(|c| G { raster_group: 8, ..c }),
    )
    .collect()
}

/// Every shipped variant, in a stable order.
pub fn variants() -> Vec<Variant> {
    gemm_configs()
        .into_iter()
        .map(gemm_variant)
        .chain(hopper_gemm_configs().into_iter().map(hopper_gemm_variant))
        .chain(decode_configs().into_iter().map(decode_variant))
        .chain(chunk_configs().into_iter().map(chunk_variant))
        .chain(hopper_chunk_configs().into_iter().map(hopper_chunk_variant))
        .chain(chunk_prep_configs().into_iter().map(chunk_prep_variant))
        .chain(split_kernels_shipped())
        .collect()
}

/// The split's own kernels shipped (its chunk passes and preparation are in
/// [`chunk_configs`] and [`chunk_prep_configs`]): the schedule, the merge and the finish.
fn split_kernels_shipped() -> Vec<Variant> {
    let split = split_configs_shipped();
    let mut out = vec![chunk_segments_variant(split.segments), chunk_merge_variant(split.merge)];
    out.extend(split.finish.map(chunk_finish_variant));
    out
}
