//! `chunk_kda` in the DSL: the KDA recurrence over 16-token chunks, the heavy products on
//! tensor cores.
//!
//! A block owns `rows_per_warp · warps` value rows of one (sequence, value head)'s V-first
//! state `S [V, K]` ([`ChunkShape::value_rows`]), each warp 16 or 32 of them, held in registers
//! as an f32 mma accumulator for the whole sequence. Value rows are independent in the delta
//! rule, so the blocks of a head need nothing from each other. The block's warps prepare each
//! chunk's keys together, once for all their rows. Per chunk of `C = 16` tokens, with `G` the in-chunk inclusive
//! cumulative gate in log2 units and `Γ = G[last valid row]`:
//!
//! ```text
//! kd = k̂ 2^G   qd = scale q̂ 2^G   ki = k̂ 2^-G   kr = k̂ 2^(Γ - G)        16-bit
//! A   = strict_lower(diag(beta) kd kiᵀ)   INV = (I + A)^-1 (f32 forward substitution)
//! Mqk = lower_incl_diag(qd kiᵀ)
//! Wᵀ  = S kdᵀ,  Vnᵀ = beta (vᵀ - Wᵀ),  Uᵀ = Vnᵀ INVᵀ                   the transposed view
//! Oᵀ  = S qdᵀ + Uᵀ Mqkᵀ,  S = S diag(2^Γ) + Uᵀ kr
//! ```
//!
//! The state's products take `kd`, `qd`, `kr`, `INV`, `Mqk` (and `S`, `U`) as f16 operands by
//! default ([`ChunkOperands`]; the runtime takes bf16 without l2norm): 11 significant bits, so the
//! states stay within 1e-3 of decode's f32 arithmetic. `ki` reaches 2^115, past f16's range, so the
//! key products take bf16 copies of `kd` and `qd`. `kd kiᵀ` and `qd kiᵀ` are 16 x 16 products every
//! warp computes whole (`kd_key.replicated()`, an mma operand no warp copies); the first warp's
//! copy feeds the solve and `Mqk`. With the lower-bound gate (`g >= -5` per token) `G` stays above
//! `-16 · 5 · log2(e) = -115`, so `2^-G` fits f32 and bf16. A precomputed gate has no bound: that
//! variant computes `A` and `Mqk` element-wise with `2^(G_i - G_j)`, `j <= i` (never above 1 for a
//! decay), and needs no `ki`. Rows past the sequence's end read as zero (bounded boxes) and get
//! `g = 0` by a select, so nothing of the next sequence leaks in.
//!
//! Everything above `Wᵀ` depends on the chunk's inputs alone, and so do beta and the decay.
//! With [`Preparation::Workspace`] the kernel reads them from the workspace
//! [`crate::chunk_prep`] filled, in parallel over chunks, and runs only the state's products:
//! the same values in the same order, so the same bits.

use crate::chunk_order::{longest_first, ORDERED_MAX_SEQUENCES};
use crate::rules::{beta_of, gate_of};
use kda_dsl::builder::Tile;
use kda_dsl::{DType, Hoist};
use kda_macros::kernel;

/// Value rows of the state one warp owns unless a shape says otherwise
/// ([`ChunkShape::rows_per_warp`]): one mma accumulator row block.
pub const ROWS_PER_WARP: usize = 16;

/// How a chunk variant is launched: the part of its config the kind of call chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkShape {
    /// Warps per block (1, 2, 4 or 8), each owning `rows_per_warp` value rows: a block holds
    /// [`ChunkShape::value_rows`] rows of a head's state (and, fused, prepares each chunk's
    /// keys once for them).
    pub warps: usize,
    /// Value rows of the state each warp owns: 16 ([`ROWS_PER_WARP`]) or 32, at most 128 a
    /// block. At 32 a block of 4 warps holds a head's whole state, so the head's keys are
    /// prepared by 4 warps instead of 8: the per-warp share of the preparation (the key
    /// products every warp computes whole, the loop's own arithmetic) is paid half as often,
    /// for twice the state registers a thread (about 230 at 4 warps: 2 blocks an SM). Each
    /// value row's arithmetic is the same either way, so the bits are too.
    pub rows_per_warp: usize,
    /// Blocks that must fit on an SM at once (caps registers per thread).
    pub min_blocks: usize,
    /// Chunks in shared memory at once (the pipeline's depth, 2 or more; the loads of a chunk
    /// are issued `stages - 1` steps before its use). The chain over a workspace wants more
    /// than 2: its step is shorter than a load's latency from memory.
    pub stages: usize,
    /// Warps added to the block (`launch(.., fill_warps)`) that issue the pipeline's fills:
    /// the chain's step issues its fills' address arithmetic on the same warps as its products
    /// otherwise. In the fused kernel they also compute each chunk's factors (its step's
    /// producer block), a chunk ahead of the state's chain, and hand them over through a ring
    /// of mbarriers (`place_producers`). The arithmetic, and so the bits, do not depend on it.
    pub fill_warps: usize,
    /// Registers a thread of the fill warps keeps on sm_90a once the roles part
    /// (`launch(.., producer_registers)`; the compute warpgroups take the rest by
    /// `setmaxnreg`): what the fused step's producer block needs, which is far less than the
    /// state's warps. `None` keeps every thread's registers alike. Same bits.
    pub producer_registers: Option<usize>,
    /// The barriers inside a chunk's step leave the next chunks' loads in flight instead of
    /// waiting for them (`pipelined(.., fills_in_flight)`): with other blocks on the SM their
    /// work covers that wait, alone on it the block would stall at its step's first barrier
    /// for the loads it has just issued. Same arithmetic, same bits.
    pub fills_in_flight: bool,
    /// Another choice of the loop-invariant values computed once per loop than
    /// [`ChunkShape::hoist`]'s own (`kda bench --sweep-chunk` times them). Same bits.
    pub hoist_override: Option<Hoist>,
    /// Another way of summing a chunk's gates than [`ChunkShape::gate_scan`]'s own (`kda bench
    /// --sweep-chunk` times them). Same bits.
    pub gate_scan_override: Option<GateScan>,
    /// On sm_90a, the instruction of the products 16 columns wide ([`NarrowProducts`]).
    pub narrow_products: NarrowProducts,
    /// How the fused step computes the lower-bound gate's key products ([`KeyProducts`]; the
    /// sweep's `k` is [`KeyProducts::Split`]). Same bits either way.
    pub key_products: KeyProducts,
    /// Another order of the step's update and output rows than the path's own
    /// ([`ChunkConfig::step_order`]; `kda bench --sweep-chunk` times them). Same bits.
    pub step_order_override: Option<StepOrder>,
}

/// Which of the two consumers of a step's `Uᵀ` comes first in the kernel's code: the state's
/// update (the next step's input) or the output rows (their product, the transposed store into
/// shared memory and the barrier before it is read back). The same operations on the same
/// values either way, so the same bits; ptxas schedules the two orders differently, and the
/// barrier waits for whatever the code puts before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepOrder {
    /// The update, then the output rows: the fused kernel's, measured the faster there
    /// (docs/performance.md, 2026-12-02 run 10).
    UpdateFirst,
    /// The output rows, then the update: the chain's over a prepared workspace, measured the
    /// faster there in the same run (before its fill warp and hoisting).
    OutputFirst,
}

/// Which instruction the sm_90a kernel gives its products of 16 columns (a chunk's tokens):
/// the key products `kd kiᵀ` and `qd kiᵀ`, and the state's `S kdᵀ`, `S qdᵀ`, `Uᵀ = vn INVᵀ`,
/// `Uᵀ Mqkᵀ`. The state's update (`S += Uᵀ kr`, 128 columns) takes `wgmma` either way, and
/// on sm_80 every product is `mma.sync`. `wgmma` and `mma.sync` round these products alike
/// (`kda check --gpu`: the sm_90a kernel gives the sm_80 bits), so the choice changes no bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NarrowProducts {
    /// `wgmma`: the state stays the register A operand of every state product.
    Wgmma,
    /// `mma.sync` (`launch(.., wgmma_min_n = 32)`): a `wgmma` of 16 columns does a warp's
    /// `mma.sync` work for the descriptors, fences and waits around it, which cost more
    /// instructions and a longer dependent chain than the work they spare, and at 4 warps of
    /// 32 rows more registers than fit (docs/prefill.md, "Devices"). The state's fragments are
    /// laid out the same for both (each warp's rows in 16-row blocks), so it passes from one to
    /// the other in registers.
    MmaSync,
}

impl NarrowProducts {
    /// The kernel's `launch(.., wgmma_min_n)`.
    pub fn wgmma_min_n(self) -> usize {
        match self {
            NarrowProducts::Wgmma => kda_dsl::tile::WGMMA_MIN_N as usize,
            NarrowProducts::MmaSync => 32,
        }
    }
}

impl ChunkShape {
    /// Which loop-invariant values the kernel computes once per loop instead of once per
    /// chunk (`launch(.., hoist)`): the shape's override if it has one (the chain's
    /// [`ChunkShape::PREPARED`] takes every one); else the block-uniform ones (a box's start,
    /// a tile's base) where a thread may hold more than 128 registers (the fused kernel at 4
    /// warps, the sm_90a kernel); none at 128 (8 warps, 2 blocks an SM), where ptxas has no
    /// room for them (one config spills when assembled for sm_90). Every invariant value
    /// (`Hoist::Everything`) fits the sm_90a kernel's 255 without a spill and cuts its step by
    /// a tenth, but ptxas then schedules it with a longer chain of waits
    /// (`scripts/sass_loop.py`'s latency bound), and alone on its SM that kernel waits more
    /// than it issues: the sweep's `e` times it
    /// (docs/performance.md).
    pub fn hoist(self) -> Hoist {
        if let Some(h) = self.hoist_override {
            return h;
        }
        if registers_per_thread(32 * (self.warps + self.fill_warps), self.min_blocks) > 128 {
            Hoist::BlockUniform
        } else {
            Hoist::Nothing
        }
    }

    /// `warps` warps, `min_blocks` blocks an SM, `stages` chunks in shared memory, and the rest
    /// plain: no fill warps, the step's barriers wait for the next loads, the hoisting
    /// [`ChunkShape::hoist`] picks.
    pub const fn plain(warps: usize, min_blocks: usize, stages: usize) -> ChunkShape {
        ChunkShape {
            warps,
            rows_per_warp: ROWS_PER_WARP,
            min_blocks,
            stages,
            fill_warps: 0,
            producer_registers: None,
            fills_in_flight: false,
            hoist_override: None,
            gate_scan_override: None,
            narrow_products: NarrowProducts::Wgmma,
            key_products: KeyProducts::Replicated,
            step_order_override: None,
        }
    }

    /// How the fused step sums a chunk's gates: [`GateScan::for_block`] of its warps, unless
    /// overridden.
    pub fn gate_scan(self) -> GateScan {
        self.gate_scan_override.unwrap_or(GateScan::for_block(32 * self.factor_warps()))
    }

    /// The warps that compute a fused chunk's factors (the step's producer block): one producer
    /// group of the fill warps where there are any, which run the block ahead of the state's
    /// chain (8 fill warps are two groups of 4 taking turns at the chunks), else the block's
    /// own.
    pub const fn factor_warps(self) -> usize {
        if self.fill_warps > 0 {
            kda_dsl::passes::place_producers::producer_groups(self.fill_warps as u32).warps as usize
        } else {
            self.warps
        }
    }

    /// The value rows of a head's state one block holds: `rows_per_warp · warps`.
    pub const fn value_rows(self) -> usize {
        self.rows_per_warp * self.warps
    }

    /// The fused kernel's: 4 warps of 32 value rows (a head's whole state in one block), 2
    /// blocks per SM, the step's barriers leaving the next chunk's loads in flight. Against 8
    /// warps of 16 rows, its 4 warps prepare each chunk's keys once for 128 rows, so the work
    /// every warp repeats is paid half as often (35% fewer instructions a block): 20 to 26%
    /// faster on every fused row of `kda bench --sweep-chunk` (docs/performance.md,
    /// 2026-12-05, H100). Leaving the loads in flight gained 4 to 7% more there: with 8 warps
    /// an SM, the other block does not cover the step's waits for them. Its key products are
    /// split over the 4 warps ([`KeyProducts::Split`]): a third of the replicated form's
    /// operand traffic through shared memory, for a few more instructions; the faster on every
    /// fused row of the sweep (docs/performance.md, 2026-12-05, night).
    pub const FUSED: ChunkShape = ChunkShape {
        rows_per_warp: 32,
        fills_in_flight: true,
        key_products: KeyProducts::Split,
        ..ChunkShape::plain(4, 2, 2)
    };
    /// [`ChunkShape::FUSED`] with a producer warpgroup: four fill warps compute each chunk's
    /// factors (the step's producer block) a chunk ahead of the state's chain on the 4 compute
    /// warps, 3 stages (the ring's fills a chunk ahead of the block), 1 block an SM (232
    /// registers a thread on sm_80). The fused kernel's bits; 11% faster on one long sequence
    /// alone, slower wherever blocks are many (docs/performance.md, 2026-12-06, later), so no
    /// path takes it by default.
    pub const PRODUCER: ChunkShape = ChunkShape { fill_warps: 4, min_blocks: 1, stages: 3, ..ChunkShape::FUSED };
    /// The chain over a prepared workspace (the two-kernel path, taken with few chains): 2
    /// warps and a fill warp, 4 blocks per SM, 4 stages. Its blocks carry no key preparation,
    /// so smaller ones spread each head's 128 value rows over more SMs; a step is short next
    /// to a load's latency from memory, so it stages 3 chunks ahead; and a warp of its own
    /// issues the fills, whose address arithmetic was on the step's path. The fastest of `kda
    /// bench --sweep-chunk` (docs/performance.md, 2026-12-01 run 8 and 2026-12-02 runs 13 to
    /// 16). Every loop-invariant value is computed once per loop ([`Hoist::Everything`]): the
    /// chain's step is latency-bound, and the hoisted step is shorter in instructions and in
    /// its chain of waits, within the registers of 4 blocks an SM (docs/performance.md,
    /// 2026-12-06). Its arithmetic depends on none of it, so the bits stay the fused kernel's.
    pub const PREPARED: ChunkShape =
        ChunkShape { fill_warps: 1, hoist_override: Some(Hoist::Everything), ..ChunkShape::plain(2, 4, 4) };
    /// The chain over a prepared workspace on sm_90a: one warpgroup of 16 value rows a warp (64
    /// a block, two blocks a head), the fill warp, 2 blocks an SM, 4 stages. Its state products
    /// take `wgmma` with the state as their register A operand, each product's K-steps in
    /// flight together; at [`ChunkShape::PREPARED`]'s 2 warps there is no warpgroup. The same
    /// bits as the sm_80 chain in the simulator (`chunk_sim`) and on an H100. No device takes
    /// it by default: slower there than the sm_80 chain, hoisted or not (docs/performance.md,
    /// 2026-12-06).
    pub const HOPPER_PREPARED: ChunkShape = ChunkShape { fill_warps: 1, ..ChunkShape::plain(4, 2, 4) };
    /// The fused kernel's on sm_90a: 8 warps (two warpgroups, each holding 64 of a head's 128
    /// value rows of the state as `wgmma` accumulators, which feed the next products as their
    /// register A operand), 1 block per SM. At 2 per SM ptxas has 128 registers a thread: it
    /// spills and serializes the `wgmma`s (C7512); at 1 it takes about 200 and neither. Alone
    /// on its SM, its step's barriers leave the next chunk's loads in flight. Slower than
    /// [`ChunkShape::FUSED`] on sm_80, whose second block per SM hides its waits
    /// (docs/prefill.md, "Devices"). At [`ChunkShape::FUSED`]'s shape (4 warps of 32 rows, 2
    /// blocks an SM) every state product on `wgmma` was faster but spills in one shipped config;
    /// with its products of 16 columns on `mma.sync` ([`NarrowProducts::MmaSync`], the sweep's
    /// `4x2w32ihm`) it spills in none, untimed so far.
    pub const HOPPER: ChunkShape = ChunkShape { fills_in_flight: true, ..ChunkShape::plain(8, 1, 2) };
    /// The fused kernel on sm_90a as two warpgroups of roles: one holds a head's whole state (4
    /// warps of 32 value rows, 128 f32 registers a thread of `wgmma` accumulators) and runs the
    /// state's products, the other computes each chunk's factors a chunk ahead (the step's producer
    /// block, as [`ChunkShape::PRODUCER`] on sm_80), keeping 128 registers a thread (the fewest in
    /// steps of 8 at which ptxas spills none of the factors) and giving the rest to the state's
    /// warpgroup (`setmaxnreg`). Its products of 16 columns take `mma.sync`: on `wgmma` ptxas waits
    /// on their accumulators (C7517). 1 block an SM, 3 stages. The same bits; on an H100 3% faster
    /// than `8x1x3f4h` (8 compute warps, 12 in all at 168 registers a thread), whose producer cut
    /// the sm_90a fused step by a quarter but still bounds it (docs/performance.md, 2026-12-06,
    /// "the producer shapes retimed"). At 128 registers a second producer warpgroup fits beside
    /// this one ([`ChunkShape::HOPPER_TWO_PRODUCERS`]). Varlen, where the roles part at the chunk
    /// loop, ptxas spills one value live across that point (4 bytes stored, 16 loaded) at any
    /// producer count from 128 to 144.
    pub const HOPPER_PRODUCER: ChunkShape =
        ChunkShape { producer_registers: Some(128), narrow_products: NarrowProducts::MmaSync, ..ChunkShape::PRODUCER };
    /// [`ChunkShape::HOPPER_PRODUCER`] with two producer warpgroups taking turns at the chunks
    /// (8 fill warps at 128 registers, the state's warpgroup at 248: a whole register file),
    /// 5 stages (one the state's warps read, one each group computes, one each group's fills
    /// ahead). The same bits. The producer groups run one copy of the code. On 9.0 the default
    /// for dense calls of 80 to 132 chains (`DefaultPath::HopperProducers` in kda-runtime; an
    /// H100: docs/performance.md, 2026-12-06, "the producer groups' code once").
    pub const HOPPER_TWO_PRODUCERS: ChunkShape = ChunkShape { fill_warps: 8, stages: 5, ..ChunkShape::HOPPER_PRODUCER };
}

pub use crate::rules::Beta;
/// The gate rule of `chunk_kda`, decode's ([`crate::rules::Gate`]). The lower-bound gate
/// (with `lower_bound` in [-5, 0)) keeps every exponent of a chunk in f32's range, so its key
/// products run on tensor cores; the softplus and precomputed gates are unbounded below and
/// take the exact element-wise form.
pub use crate::rules::Gate as ChunkGate;

/// Where a sequence's state starts and where its final state goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkStates {
    /// From zeros; the final state goes to `final_state[n]` when `store_final`.
    Zeros {
        /// Write `final_state[n]`.
        store_final: bool,
    },
    /// From `state[n]`; the final state goes to `final_state[n]` when `store_final`.
    PerSequence {
        /// Write `final_state[n]`.
        store_final: bool,
    },
    /// The decode pool in place: from `state[state_indices[n]]` (zeros where
    /// `has_initial_state[n]` is 0), and back into that slot; a slot outside the pool is padding.
    Pool {
        /// `state_indices` dtype (i32 or i64).
        indices: DType,
        /// `has_initial_state` dtype, when given.
        has_initial: Option<DType>,
    },
}

/// Where a chunk's prepared operands come from: the gated keys `kd`, `qd`, `kr`, `INV`, `Mqk`,
/// the chunk's decay `2^Γ` and its betas. They depend on the inputs alone, not on the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preparation {
    /// Computed by this kernel, chunk after chunk, inside the sequence's serial chain.
    InKernel,
    /// Read from the workspace [`crate::chunk_prep`] filled before, in parallel over chunks.
    /// The same values in the same order: the results are bit-identical to [`Self::InKernel`].
    Workspace,
}

/// Columns of one token's row of the prepared-operand workspace (in the [`ChunkOperands`]
/// type): `kd`, `qd`, `kr` (128 each), then the token's rows of `INV` and `Mqk` (16 each).
pub const PREP_COLS: usize = 3 * 128 + 2 * 16;
/// Where each prepared operand starts in a workspace row.
pub(crate) const PREP_KD: usize = 0;
pub(crate) const PREP_QD: usize = 128;
pub(crate) const PREP_KR: usize = 256;
pub(crate) const PREP_INV: usize = 384;
pub(crate) const PREP_MQK: usize = 400;
/// Columns of one chunk's row of the f32 workspace: its decay `2^Γ`, one per key channel, then
/// its 16 betas (`sigmoid(b)`, 0 past the chunk's valid rows). The chunk whose first workspace
/// row is `w0` owns row `w0 / 16`: a sequence's chunks are 16 rows apart and the next sequence
/// starts at least 16 rows further, so no two share one.
pub const PREP_DECAY_COLS: usize = 128 + 16;
/// Where the betas start in a row of the f32 workspace.
pub(crate) const PREP_BETA: usize = 128;

/// The element type the state's products round their operands to: `kd`, `qd`, `kr`, `INV`,
/// `Mqk` (and the prepared workspace holding them), the state `S` and `U`. The products
/// accumulate in f32 either way, at the same speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkOperands {
    /// f16: 11 significant bits, so prefill then decode agree with prefill of the whole
    /// sequence within 1e-3 (f32 states). Finite up to 65504: the values and the state must
    /// stay below it, and so (without l2norm) must `scale q·k` and the solve of `beta k·k`, or
    /// the results turn Inf.
    F16,
    /// bf16: f32's range, 8 significant bits (the states drift about 3e-3 from decode's f32
    /// arithmetic). For values or states beyond f16's range.
    Bf16,
}

impl ChunkOperands {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            ChunkOperands::F16 => DType::F16,
            ChunkOperands::Bf16 => DType::BF16,
        }
    }
}

/// What a chunk run produces. The exact long-sequence split runs its
/// segments twice without output rows before the run that writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkRun {
    /// Output rows, and final states as [`ChunkConfig::states`] asks: every `chunk_kda` call.
    Output,
    /// Final states only (the split's segments from zeros, their `H`): the same state
    /// arithmetic as [`Self::Output`], so the same bits, without the output's products.
    StatesOnly,
    /// From the identity with `v = 0`, so the final state is the segment's `K x K` transition
    /// `M` (`S_end = S_0 M + H` for any start `S_0`); no output rows. With
    /// [`ChunkStates::Zeros`].
    Transition,
}

/// What a chunk variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkConfig {
    /// q, k, v, g, beta and output element type (`BF16` or `F16`).
    pub dtype: DType,
    /// State element type (`F32`, or the input type), carried in f32 and rounded once on store.
    pub state_dtype: DType,
    /// Gate rule.
    pub gate: ChunkGate,
    /// Beta rule (`Sigmoid`, the reference's, by default).
    pub beta: Beta,
    /// `dt_bias` element type (gates computed in the kernel only).
    pub dt_bias: DType,
    /// l2-normalize q and k.
    pub l2norm: bool,
    /// `cu_seqlens` given, and its type.
    pub varlen: Option<DType>,
    /// State sources and destinations.
    pub states: ChunkStates,
    /// How it is launched ([`ChunkShape::FUSED`] or [`ChunkShape::PREPARED`] by default).
    pub shape: ChunkShape,
    /// What the run produces: output rows (every call), or one of the exact split's
    /// state-only passes.
    pub run: ChunkRun,
    /// Where the prepared operands come from.
    pub preparation: Preparation,
    /// The state's products' operand type.
    pub operands: ChunkOperands,
    /// Prefix caching: chunks aligned to absolute positions, and checkpoints.
    pub prefix: PrefixCaching,
}

/// Prefix caching in the pool mode (`prefix_lens`, `checkpoint_slots`): what a config takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefixCaching {
    /// `prefix_lens` given, and its dtype: sequence `n`'s token `i` is at absolute position
    /// `prefix_lens[n] + i`, and chunks end at absolute multiples of 16 (the first may be
    /// shorter).
    pub prefix_lens: Option<DType>,
    /// `checkpoint_slots` given, and its dtype: the state after every absolute position `p`
    /// that is a multiple of `checkpoint_every` and strictly inside the call's part of the
    /// sequence goes to `checkpoints[checkpoint_slots[n, p / checkpoint_every - 1]]`.
    pub checkpoint_slots: Option<DType>,
    /// What the kernel's block rows run: the call's sequences, or the split's segments.
    pub pieces: Pieces,
}

/// What each block row of a chunk kernel with prefix caching runs, which says where its
/// checkpoints go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pieces {
    /// A sequence `n` of the call: row `n` of `checkpoint_slots`, its part ending at its last
    /// token, the checkpoints of the state's dtype.
    #[default]
    Sequences,
    /// A segment `s` of the split (`chunk_segments`): `prefix_lens[s]` is the segment's absolute
    /// start, `segment_rows[s]` its sequence's row of `checkpoint_slots` and absolute end (so a
    /// checkpoint at the segment's end is written unless the sequence ends there), and the
    /// checkpoints have the call's state dtype `checkpoints` (the segments' states are f32).
    Segments {
        /// The checkpoint pool's dtype.
        checkpoints: DType,
    },
}

impl PrefixCaching {
    /// A short stable name (empty without prefix caching).
    fn key(&self) -> String {
        let part = |tag: &str, d: Option<DType>| d.map(|d| format!("_{tag}{}", d.name())).unwrap_or_default();
        let pieces = match self.pieces {
            Pieces::Sequences => String::new(),
            Pieces::Segments { checkpoints } => format!("_segs{}", checkpoints.name()),
        };
        part("prefix", self.prefix_lens) + &part("ckpt", self.checkpoint_slots) + &pieces
    }

    /// The checkpoint pool's dtype, for a kernel whose states are `state_dtype`.
    pub fn checkpoint_dtype(&self, state_dtype: DType) -> DType {
        match self.pieces {
            Pieces::Sequences => state_dtype,
            Pieces::Segments { checkpoints } => checkpoints,
        }
    }
}

impl Default for ChunkConfig {
    /// The bench configuration: bf16 inputs, lower-bound gate, l2norm, an f32 initial state in
    /// and the final state out.
    fn default() -> Self {
        ChunkConfig {
            dtype: DType::BF16,
            state_dtype: DType::F32,
            gate: ChunkGate::LowerBound,
            beta: Beta::Sigmoid,
            dt_bias: DType::F32,
            l2norm: true,
            varlen: None,
            states: ChunkStates::PerSequence { store_final: true },
            shape: ChunkShape::FUSED,
            run: ChunkRun::Output,
            preparation: Preparation::InKernel,
            operands: ChunkOperands::F16,
            prefix: PrefixCaching::default(),
        }
    }
}

impl ChunkStates {
    /// A short stable name.
    pub fn key(&self) -> String {
        match *self {
            ChunkStates::Zeros { store_final } => format!("zeros{}", if store_final { "_final" } else { "" }),
            ChunkStates::PerSequence { store_final } => format!("init{}", if store_final { "_final" } else { "" }),
            ChunkStates::Pool { indices, has_initial } => {
                format!(
                    "pool_{}{}",
                    indices.name(),
                    has_initial.map(|d| format!("_has{}", d.name())).unwrap_or_default()
                )
            }
        }
    }

    /// Whether a sequence may start from a given state (`state[n]` or its pool slot).
    pub(crate) fn reads_state(&self) -> bool {
        !matches!(self, ChunkStates::Zeros { .. })
    }

    /// Whether the states are the decode pool, read and written in place.
    pub(crate) fn pool(&self) -> bool {
        matches!(self, ChunkStates::Pool { .. })
    }

    /// Whether final states go to `final_state[n]`.
    pub(crate) fn store_final(&self) -> bool {
        matches!(self, ChunkStates::Zeros { store_final: true } | ChunkStates::PerSequence { store_final: true })
    }

    /// `state_indices`' dtype (i32 where there is none).
    pub(crate) fn indices(&self) -> DType {
        match *self {
            ChunkStates::Pool { indices, .. } => indices,
            _ => DType::I32,
        }
    }

    /// `has_initial_state`'s dtype, when given.
    pub(crate) fn has_initial(&self) -> Option<DType> {
        match *self {
            ChunkStates::Pool { has_initial, .. } => has_initial,
            _ => None,
        }
    }
}

/// The chunks of every sequence a chunk kernel (and its preparation) runs: `first .. end`,
/// counted in the sequence's chunks (aligned to absolute positions with `prefix_lens`, so only
/// the device knows where they start). Token ranges cut a call into windows, each run from the
/// state the one before left; every other call runs [`ChunkWindow::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkWindow {
    /// The first chunk run.
    pub first: i32,
    /// The chunk after the last one run (past the sequence's chunks: up to its end).
    pub end: i32,
}

impl ChunkWindow {
    /// Every chunk of every sequence.
    pub const ALL: ChunkWindow = ChunkWindow { first: 0, end: i32::MAX };
}

/// The first chunk of a window (`first`) of a sequence of `chunks` chunks, clamped into
/// `0 ..= chunks`.
#[kda_macros::kernel_fn]
pub(crate) fn window_start(first: Val, chunks: Val) -> Val {
    min(max(first, 0), chunks)
}

/// The end of a window (`end`) that starts at chunk `start` of a sequence of `chunks` chunks,
/// clamped into `start ..= chunks`, so a window never runs past its sequence nor backwards.
#[kda_macros::kernel_fn]
pub(crate) fn window_end(end: Val, chunks: Val, start: Val) -> Val {
    max(min(end, chunks), start)
}

/// Sequence `n`'s state slot: `n`, or with the pool `state_indices[n]` when it lies inside the
/// pool's `p` slots and -1 (padding) otherwise.
#[kda_macros::kernel_fn]
pub(crate) fn state_slot(pool: bool, state_indices: Tensor, n: Val, p: Val) -> Val {
    let mut slot = n;
    if pool {
        let raw = state_indices[n];
        slot = select(raw >= 0 && raw < p, raw as i32, -1);
    }
    slot
}

/// Sequence `n`'s tokens before the call: `prefix_lens[n]` (at least 0: a negative entry is
/// taken as 0, as the checked mode reports it) with `aligned`, else 0.
#[kda_macros::kernel_fn]
pub(crate) fn sequence_prefix(aligned: bool, prefix_lens: Tensor, n: Val) -> Val {
    let mut prefix = 0;
    if aligned {
        prefix = max(prefix_lens[n] as i32, 0);
    }
    prefix
}

/// How many token positions before the first token of a sequence (`bos`; it ends at `eos`)
/// its first chunk starts when chunks end at absolute multiples of 16, `prefix` tokens into its
/// prompt: `prefix % 16`, so the first chunk holds `16 - shift` tokens; 0 for an empty sequence
/// (which has no chunk). Chunk `c` holds tokens `max(bos, bos - shift + 16 c) .. min(eos, bos
/// - shift + 16 c + 16)`, and its workspace rows start `16 c` rows after the sequence's first.
#[kda_macros::kernel_fn]
pub(crate) fn chunk_shift(prefix: Val, bos: Val, eos: Val) -> Val {
    select(eos > bos, prefix % 16, 0)
}

/// Whether sequence `n`, in state slot `slot`, starts from that slot's state: not padding, and
/// (when `has_initial_state` is given) its entry nonzero.
#[kda_macros::kernel_fn]
pub(crate) fn starts_from_slot(with_has_initial: bool, has_initial: Tensor, n: Val, slot: Val) -> Val {
    let mut from_state = slot >= 0;
    if with_has_initial {
        from_state = slot >= 0 && has_initial[n] != 0;
    }
    from_state
}

impl ChunkConfig {
    /// The order of the step's update and output rows: the shape's override, else the path's
    /// own ([`StepOrder`]: the fused kernel updates first, the chain over a workspace outputs
    /// first).
    pub fn step_order(&self) -> StepOrder {
        self.shape.step_order_override.unwrap_or(match self.preparation {
            Preparation::InKernel => StepOrder::UpdateFirst,
            Preparation::Workspace => StepOrder::OutputFirst,
        })
    }

    /// This config as it runs on `target`: on sm_90a a fused one (its keys prepared in the
    /// kernel) takes [`ChunkShape::HOPPER`], its state products on `wgmma`; the chain over a
    /// workspace, and every config on another target, keep their shape.
    pub fn on_target(self, target: kda_dsl::Target) -> ChunkConfig {
        match (target, self.preparation) {
            (kda_dsl::Target::Sm90a, Preparation::InKernel) => ChunkConfig { shape: ChunkShape::HOPPER, ..self },
            _ => self,
        }
    }

    /// A short stable name.
    pub fn key(&self) -> String {
        let gate = rules_key(self.gate, self.dt_bias, self.beta);
        format!(
            "{}_s{}_{}{}_cu{}_{}{}_w{}{}_mb{}{}{}{}{}{}{}{}{}{}{}{}{}",
            self.dtype,
            self.state_dtype,
            gate,
            if self.l2norm { "_l2" } else { "" },
            self.varlen.map(|d| d.name()).unwrap_or("none"),
            self.states.key(),
            self.prefix.key(),
            self.shape.warps,
            // 16 rows a warp, the default, go unnamed.
            if self.shape.rows_per_warp == ROWS_PER_WARP {
                String::new()
            } else {
                format!("r{}", self.shape.rows_per_warp)
            },
            self.shape.min_blocks,
            // Two stages, the fused kernel's, go unnamed.
            if self.shape.stages == 2 { String::new() } else { format!("_st{}", self.shape.stages) },
            if self.shape.fill_warps == 0 { String::new() } else { format!("_fw{}", self.shape.fill_warps) },
            self.shape.producer_registers.map(|n| format!("_pr{n}")).unwrap_or_default(),
            if self.shape.fills_in_flight { "_ff" } else { "" },
            match self.shape.hoist_override {
                None => "",
                Some(Hoist::Nothing) => "_hn",
                Some(Hoist::BlockUniform) => "_hu",
                Some(Hoist::Everything) => "_he",
            },
            match self.shape.gate_scan_override {
                None => "",
                Some(GateScan::PerChannel) => "_gc",
                Some(GateScan::Shared) => "_gs",
            },
            match self.shape.narrow_products {
                NarrowProducts::Wgmma => "",
                NarrowProducts::MmaSync => "_nm",
            },
            match self.shape.key_products {
                KeyProducts::Replicated => "",
                KeyProducts::Split => "_ks",
            },
            match self.shape.step_order_override {
                None => "",
                Some(StepOrder::UpdateFirst) => "_su",
                Some(StepOrder::OutputFirst) => "_so",
            },
            match self.run {
                ChunkRun::Output => "",
                ChunkRun::StatesOnly => "_states",
                ChunkRun::Transition => "_transition",
            },
            if self.preparation == Preparation::Workspace { "_prepared" } else { "" },
            // f16, the default, goes unnamed.
            if self.operands == ChunkOperands::Bf16 { "_opbf16" } else { "" }
        )
        .to_lowercase()
    }
}

/// The gate and beta rules in a variant key: the gate (with `dt_bias`' type where the kernel
/// computes it), then the beta rule where it is not the reference's sigmoid.
pub(crate) fn rules_key(gate: ChunkGate, dt_bias: DType, beta: Beta) -> String {
    let gate = match gate {
        ChunkGate::LowerBound => format!("lb_dt{}", dt_bias.name()),
        ChunkGate::Softplus => format!("sp_dt{}", dt_bias.name()),
        ChunkGate::Precomputed => "pre".to_string(),
    };
    match beta {
        Beta::Sigmoid => gate,
        other => format!("{gate}_b{}", other.key()),
    }
}

/// `log2(e)`: gates are natural-log decays; the kernel works in powers of two.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Beta by `rule` into `bt_sh`, 0 past the chunk's `nv` valid rows.
#[kda_macros::kernel_fn]
fn beta_gate(rule: Beta, b_sh: Tile, bt_sh: Tile, nv: Val) {
    for (i,) in parallel(bt_sh) {
        bt_sh[i] = select(i < nv, beta_of(rule, b_sh[i] as f32), 0.0);
    }
}

/// The chunk's gate by `gate` in log2 units (0 past its `nv` valid rows) and its inclusive
/// cumulative sum down the chunk into `gl`, as `scan` says; beta by `beta` into `bt_sh` (0 past
/// the end); the chunk's decay of the state, `2^Γ` per key channel, into `eg_sh`.
#[kda_macros::kernel_fn]
fn gate_and_beta(
    scan: GateScan,
    gate: ChunkGate,
    beta: Beta,
    g_sh: Tile,
    dt_sh: Tile,
    b_sh: Tile,
    gl: Tile,
    bt_sh: Tile,
    eg_sh: Tile,
    nv: Val,
    ea: Val,
    lower_bound: Val,
) {
    // Both sum each channel's gates from 0 in row order, so they give the same bits; past the
    // valid rows they add zeros, so the last row's sum is `Γ`.
    if scan == GateScan::PerChannel {
        for (j,) in parallel(eg_sh) {
            let mut acc = 0.0;
            for i in 0..16 {
                let mut gx = g_sh[i][j] as f32;
                if gate.in_kernel() {
                    gx = gate_of(gate, gx + dt_sh[j] as f32, ea, lower_bound);
                }
                acc = acc + select(i < nv, gx * LOG2E, 0.0);
                gl[i][j] = acc;
            }
            eg_sh[j] = exp2(acc);
        }
        beta_gate(beta, b_sh, bt_sh, nv);
    } else {
        for (i, j) in parallel(gl) {
            let mut gx = g_sh[i][j] as f32;
            if gate.in_kernel() {
                gx = gate_of(gate, gx + dt_sh[j] as f32, ea, lower_bound);
            }
            gl[i][j] = select(i < nv, gx * LOG2E, 0.0);
        }
        cumsum(gl, gl, 0);
        beta_gate(beta, b_sh, bt_sh, nv);
        for (j,) in parallel(eg_sh) {
            eg_sh[j] = exp2(gl[nv - 1][j]);
        }
    }
}

/// The chunk's keys and queries into `kf` and `qf`, l2-normalized per row when `l2norm`.
#[kda_macros::kernel_fn]
fn load_normalized(l2norm: bool, k_sh: Tile, q_sh: Tile, kf: Tile, qf: Tile, sq: Tile, rk: Tile, rq: Tile) {
    copy(k_sh, kf);
    copy(q_sh, qf);
    if l2norm {
        for (i, j) in parallel(sq) {
            sq[i][j] = kf[i][j] * kf[i][j];
        }
        reduce_sum(sq, rk, 1);
        for (i, j) in parallel(sq) {
            sq[i][j] = qf[i][j] * qf[i][j];
        }
        reduce_sum(sq, rq, 1);
        for (i, j) in parallel(kf) {
            kf[i][j] = kf[i][j] * rsqrt(rk[i] + 1e-6);
            qf[i][j] = qf[i][j] * rsqrt(rq[i] + 1e-6);
        }
    }
}

/// The prepared operands, computed in place in registers: `qd = scale q̂ 2^G` into `qf`,
/// `kd = k̂ 2^G` into `kf`, `kr = k̂ 2^(Γ - G)` into `sq` (none above `|k̂|` or `scale |q̂|`),
/// for the caller to store in the state products' operand type. For the lower-bound gate also
/// `ki = k̂ 2^-G` into `ki_sh` and `kd`, `qd` into `kd_key`, `qd_key` for their products with
/// it, all bf16 (`ki` reaches 2^115: only bf16 or f32 hold it, and an mma multiplies one type);
/// for a precomputed gate, the plain f32 rows `kn_sh`, `qn_sh` for the element-wise products.
/// Stores from registers go out in vectors.
#[kda_macros::kernel_fn]
fn prepare_operands(
    lower: bool,
    kf: Tile,
    qf: Tile,
    sq: Tile,
    gl: Tile,
    ki_sh: Tile,
    products: KeyProducts,
    kd_key: Tile,
    qd_key: Tile,
    kq_key: Tile,
    kn_sh: Tile,
    qn_sh: Tile,
    nv: Val,
    scale: Val,
) {
    for (i, j) in parallel(qf) {
        qf[i][j] = qf[i][j] * scale;
    }
    if lower {
        for (i, j) in parallel(kf) {
            sq[i][j] = kf[i][j] * exp2(-gl[i][j]);
        }
        copy(sq, ki_sh);
    } else {
        copy(kf, kn_sh);
        copy(qf, qn_sh);
    }
    for (i, j) in parallel(kf) {
        let gi = gl[i][j];
        let decay = exp2(gi);
        sq[i][j] = kf[i][j] * exp2(gl[nv - 1][j] - gi);
        kf[i][j] = kf[i][j] * decay;
        qf[i][j] = qf[i][j] * decay;
    }
    if lower {
        if products == KeyProducts::Split {
            for (i, j) in parallel(kf) {
                kq_key[i][j] = kf[i][j];
                kq_key[i + 16][j] = qf[i][j];
            }
        } else {
            copy(kf, kd_key);
            copy(qf, qd_key);
        }
    }
}

/// `diag(beta) kd kiᵀ` into `l_sh` and `Mqk = lower_incl_diag(qd kiᵀ)` into `mq_sh`: on tensor
/// cores for the lower-bound gate, element-wise for a precomputed one. With `la` and `ma` of
/// `16 · warps` rows every warp computes both products whole and stores its copy in its own rows
/// of `l_sh` and `m_sh` (so no two warps write one word; rows 0..16 are read); with 16 x 16
/// ones they are laid out on the first warp, which alone computes them (the same instructions on
/// the same operands as every warp's copy, so the same bits). [`KeyProducts::Split`] computes
/// them as one product of `kq_sh` (`kd` over `qd`) into `lm`, a 16 x 8 tile a warp. The
/// precomputed gate's products take each pair's own `2^(G_i - G_j)`, `j <= i` (at most 1 for a
/// decay `g <= 0`, however strong; the pairs above the diagonal, never read, take exponent 0).
#[kda_macros::kernel_fn]
fn key_products(
    lower: bool,
    products: KeyProducts,
    kd_sh: Tile,
    qd_sh: Tile,
    kq_sh: Tile,
    ki_sh: Tile,
    kn_sh: Tile,
    qn_sh: Tile,
    gl: Tile,
    bt_sh: Tile,
    la: Tile,
    ma: Tile,
    lm: Tile,
    l_sh: Tile,
    m_sh: Tile,
    mq_sh: Tile,
) {
    if lower && products == KeyProducts::Split {
        // Rows 0..16 of `lm` are `kd kiᵀ`, rows 16..32 `qd kiᵀ`: one 16 x 8 tile a warp. `l_sh`
        // takes both (32 rows; the second product times 1, exactly itself), in one store.
        clear(lm);
        gemm(kq_sh, ki_sh.t(), lm);
        for (i, j) in parallel(lm) {
            l_sh[i][j] = select(i < 16, bt_sh[i % 16], 1.0) * lm[i][j];
        }
        for (i, j) in parallel(mq_sh) {
            mq_sh[i][j] = select(j <= i, l_sh[i + 16][j], 0.0);
        }
    } else {
        if lower {
            clear(la);
            clear(ma);
            gemm(kd_sh.replicated(), ki_sh.t(), la);
            gemm(qd_sh.replicated(), ki_sh.t(), ma);
            for (i, j) in parallel(la) {
                l_sh[i][j] = bt_sh[i % 16] * la[i][j];
                m_sh[i][j] = ma[i][j];
            }
        } else {
            for (i, j) in parallel(mq_sh) {
                let mut acc_l = 0.0;
                let mut acc_m = 0.0;
                for cc in serial(0, 128) {
                    let kj = kn_sh[j][cc] * exp2(select(j <= i, gl[i][cc] - gl[j][cc], 0.0));
                    acc_l = acc_l + kn_sh[i][cc] * kj;
                    acc_m = acc_m + qn_sh[i][cc] * kj;
                }
                l_sh[i][j] = bt_sh[i] * acc_l;
                m_sh[i][j] = acc_m;
            }
        }
        for (i, j) in parallel(mq_sh) {
            mq_sh[i][j] = select(j <= i, m_sh[i][j], 0.0);
        }
    }
}

/// `inv = (I + strict_lower(l))^-1` for a 16 x 16 `l`, by f32 forward substitution with one lane
/// per column, right-looking: once `x_m` is final it updates every later `x_i`, so the longest
/// chain of dependent multiply-adds is 15 long instead of the 120 of summing each row in turn.
/// `cols` is a `[16]` tile giving the lanes their columns; `x` a `local([16])`. `stores` says
/// when each `x_m` goes to `inv_sh` (the same values either way).
#[kda_macros::kernel_fn]
fn invert_unit_lower(stores: InverseStores, l_sh: Tile, cols: Tile, x: Tile, inv_sh: Tile) {
    for (jc,) in parallel(cols) {
        for i in 0..16 {
            x[i] = select(jc == i as i32, 1.0, 0.0);
        }
        for m in 0..16 {
            if stores == InverseStores::AsSolved {
                inv_sh[m][jc] = x[m];
            }
            for i in m + 1..16 {
                x[i] = x[i] - l_sh[i][m] * x[m];
            }
        }
        if stores == InverseStores::AfterSolve {
            for m in 0..16 {
                inv_sh[m][jc] = x[m];
            }
        }
    }
}

/// How [`gate_and_beta`] sums a chunk's gates down its 16 rows; either gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateScan {
    /// One thread per key channel computes the channel's 16 gates and sums them in registers
    /// as it goes, storing each row's sum: no barrier or shared-memory round trip between the
    /// gates and the sum. Each of the block's threads owns a channel or more.
    PerChannel,
    /// Every thread computes gates across the tile, then `cumsum` sums each channel through
    /// shared memory: with more threads than channels the gates' special functions spread
    /// over all of them, which per channel would leave half idle.
    Shared,
}

impl GateScan {
    /// The plan for a block of `threads` compute threads: one thread per channel where there
    /// are at most 128 of them (`scripts/sass_loop.py`: at 4 warps the fused step's latency
    /// bound falls from 3263 to 2859 cycles; at 8 warps `chunk_prep`'s rises from 3147 to
    /// 4006).
    pub fn for_block(threads: usize) -> GateScan {
        if threads <= 128 {
            GateScan::PerChannel
        } else {
            GateScan::Shared
        }
    }
}

/// How a block computes the lower-bound gate's key products `kd kiᵀ` and `qd kiᵀ` (16 x 16
/// each, over K = 128). Each 16 x 8 tile of them takes the same `mma`s in the same order
/// either way, so the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyProducts {
    /// Each 16-row block of the accumulators computes both whole: every warp its own copy
    /// (`kd_key.replicated()`), or the first warp alone when they are 16 rows.
    Replicated,
    /// `[kd; qd] kiᵀ` as one 32 x 16 product, one 16 x 8 tile a warp (a fused kernel of 4
    /// warps): each warp loads one 16-row operand and half of `ki` instead of both operands and
    /// all of `ki`, a third of the replicated form's shared-memory traffic.
    Split,
}

/// When the forward substitution ([`invert_unit_lower`]) stores its columns of `INV`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InverseStores {
    /// Each `x_m` once final, between the loads of `l`: the assembler cannot tell the two tiles
    /// apart, so a store keeps it from issuing the next column's loads before it, and every
    /// column of the solve waits for its loads. Fewest live registers.
    AsSolved,
    /// All 16 after the solve: the loads of `l` issue ahead of the multiply-adds that need
    /// them, held in registers meanwhile (the sm_80 fused kernel, at 128 registers a thread,
    /// spills with it).
    AfterSolve,
}

impl InverseStores {
    /// The plan for a block of `threads` threads of which `min_blocks` must fit on an SM:
    /// after the solve where a thread may take more than 128 registers.
    pub fn for_block(threads: usize, min_blocks: usize) -> InverseStores {
        if registers_per_thread(threads, min_blocks) > 128 {
            InverseStores::AfterSolve
        } else {
            InverseStores::AsSolved
        }
    }
}

/// The registers a thread of a block of `threads` may hold when `min_blocks` blocks share an SM
/// (a config with no threads or blocks gets its diagnostic from the launch, not here).
fn registers_per_thread(threads: usize, min_blocks: usize) -> usize {
    kda_dsl::lower::register_plan::REGISTER_FILE as usize / (threads * min_blocks).max(1)
}

/// The tiles of one chunk's key preparation and solve, as each kernel lays them out, passed
/// whole to [`prepare_keys`] and [`solve_chunk`].
#[derive(Clone, Copy)]
pub(crate) struct KeyTiles {
    // The staged inputs: the gate (raw), `dt_bias`, beta (raw), keys and queries.
    pub g_sh: Tile,
    pub dt_sh: Tile,
    pub b_sh: Tile,
    pub k_sh: Tile,
    pub q_sh: Tile,
    // The gate's cumulative sum in log2 units, beta, and the chunk's decay `2^Γ`.
    pub gl: Tile,
    pub bt_sh: Tile,
    pub eg_sh: Tile,
    // Row fragments: the keys and queries (then `kd`, `qd`), a scratch (then `kr`), and the
    // rows' squared norms.
    pub kf: Tile,
    pub qf: Tile,
    pub sq: Tile,
    pub rk: Tile,
    pub rq: Tile,
    // The lower-bound gate's bf16 key-product operands `ki`, `kd`, `qd`; the precomputed
    // gate's f32 rows.
    pub ki_sh: Tile,
    pub kd_key: Tile,
    pub qd_key: Tile,
    // `kd` over `qd` (32 rows), for [`KeyProducts::Split`].
    pub kq_key: Tile,
    pub kn_sh: Tile,
    pub qn_sh: Tile,
    // The key products (accumulators, then rows), `Mqk`, and the solve's columns, lane
    // vector and result `INV`.
    pub la: Tile,
    pub ma: Tile,
    // Both products stacked ([`KeyProducts::Split`]).
    pub lm: Tile,
    pub l_sh: Tile,
    pub m_sh: Tile,
    pub mq_sh: Tile,
    pub cols: Tile,
    pub x: Tile,
    pub inv_sh: Tile,
}

/// The state-independent steps of one chunk up to its prepared operands, in order: the gate
/// and beta, the normalized keys and the operands ([`prepare_operands`]: `kd`, `qd`, `kr` left
/// in `kf`, `qf`, `sq`). Each kernel then stores those three where its chain reads them and
/// runs [`solve_chunk`]. The fused kernel and `chunk_prep` both run exactly this, which is
/// what makes their results the same bits.
#[kda_macros::kernel_fn]
pub(crate) fn prepare_keys(
    scan: GateScan,
    products: KeyProducts,
    gate: ChunkGate,
    beta: Beta,
    l2norm: bool,
    KeyTiles {
        g_sh,
        dt_sh,
        b_sh,
        k_sh,
        q_sh,
        gl,
        bt_sh,
        eg_sh,
        kf,
        qf,
        sq,
        rk,
        rq,
        ki_sh,
        kd_key,
        qd_key,
        kq_key,
        kn_sh,
        qn_sh,
        ..
    }: KeyTiles,
    nv: Val,
    ea: Val,
    lower_bound: Val,
    scale: Val,
) {
    // Only the lower-bound gate bounds a chunk's exponents enough for its key products to run
    // on tensor cores; the others take the exact element-wise form.
    let lower = gate == ChunkGate::LowerBound;
    gate_and_beta(scan, gate, beta, g_sh, dt_sh, b_sh, gl, bt_sh, eg_sh, nv, ea, lower_bound);
    load_normalized(l2norm, k_sh, q_sh, kf, qf, sq, rk, rq);
    prepare_operands(lower, kf, qf, sq, gl, ki_sh, products, kd_key, qd_key, kq_key, kn_sh, qn_sh, nv, scale);
}

/// The key products and the solve, after [`prepare_keys`]: `INV` into `inv_sh`, `Mqk` into
/// `mq_sh`.
#[kda_macros::kernel_fn]
pub(crate) fn solve_chunk(
    lower: bool,
    products: KeyProducts,
    stores: InverseStores,
    KeyTiles {
        kd_key,
        qd_key,
        kq_key,
        ki_sh,
        kn_sh,
        qn_sh,
        gl,
        bt_sh,
        la,
        ma,
        lm,
        l_sh,
        m_sh,
        mq_sh,
        cols,
        x,
        inv_sh,
        ..
    }: KeyTiles,
) {
    #[rustfmt::skip]
    key_products(lower, products, kd_key, qd_key, kq_key, ki_sh, kn_sh, qn_sh, gl, bt_sh, la, ma, lm, l_sh, m_sh, mq_sh);
    invert_unit_lower(stores, l_sh, cols, x, inv_sh);
}

/// Sequence `n`'s first token among the packed rows: `cu_seqlens[n]` clamped into `[0, t]`.
#[kda_macros::kernel_fn]
pub(crate) fn sequence_start(cu_seqlens: Tensor, n: Val, t: Val) -> Val {
    max(min(cu_seqlens[n], t), 0) as i32
}

/// Sequence `n`'s end among the packed rows: `cu_seqlens[n + 1]` clamped into `[start, t]`.
#[kda_macros::kernel_fn]
pub(crate) fn sequence_end(cu_seqlens: Tensor, n: Val, t: Val, start: Val) -> Val {
    max(min(cu_seqlens[n + 1], t), start) as i32
}

/// The state's products for one chunk, in the transposed view (rows = the block's value rows):
/// `Wᵀ = S kdᵀ`, with `output` the output's first term `Oᵀ = S qdᵀ` into `ot`, and
/// `Uᵀ = beta (vᵀ - Wᵀ) INVᵀ` into `ut` (`v = 0` for a `transition` run).
#[kda_macros::kernel_fn]
fn state_products(
    transition: bool,
    output: bool,
    s: Tile,
    kd_sh: Tile,
    qd_sh: Tile,
    inv_sh: Tile,
    bt_sh: Tile,
    v_sh: Tile,
    wt: Tile,
    ot: Tile,
    vn: Tile,
    ut: Tile,
) {
    clear(wt);
    if output {
        clear(ot);
    }
    gemm(s, kd_sh.t(), wt);
    if output {
        gemm(s, qd_sh.t(), ot);
    }
    if transition {
        for (a, b) in parallel(vn) {
            vn[a][b] = -bt_sh[b] * wt[a][b];
        }
    } else {
        for (a, b) in parallel(vn) {
            vn[a][b] = bt_sh[b] * (v_sh[b][a] as f32 - wt[a][b]);
        }
    }
    clear(ut);
    gemm(vn, inv_sh.t(), ut);
}

/// `S = S diag(2^Γ) + Uᵀ kr`.
#[kda_macros::kernel_fn]
fn decay_and_update(s: Tile, eg_sh: Tile, ut: Tile, kr_sh: Tile) {
    for (a, j) in parallel(s) {
        s[a][j] = s[a][j] * eg_sh[j];
    }
    gemm(ut, kr_sh, s);
}

/// The output rows `Oᵀ = S qdᵀ + Uᵀ Mqkᵀ` (the first term already in `ot`), transposed back
/// into `o_sh` (zeros for padding, `live` false).
#[kda_macros::kernel_fn]
fn output_rows(ut: Tile, mq_sh: Tile, ot: Tile, o_sh: Tile, live: Val) {
    gemm(ut, mq_sh.t(), ot);
    for (a, b) in parallel(ot) {
        o_sh[b][a] = select(live, ot[a][b], 0.0);
    }
}

/// The state `s` (value rows `v0 .. v0 + bv` of head `hv`) after absolute position `p` of
/// the sequence of checkpoint row `n`, to its checkpoint when `inside` (a live sequence, `p`
/// before the call's last token) and `p` is a multiple of `every`: column `p / every - 1` of
/// `slots`' row `n` (of `cc` columns), skipped past the row's columns or for a slot outside the
/// `pc` of `checkpoints`.
#[kda_macros::kernel_fn]
#[allow(clippy::too_many_arguments)] // the checkpoint's tensors and coordinates, as the kernel has them
fn write_checkpoint(
    s: Tile,
    checkpoints: Tensor,
    slots: Tensor,
    n: Val,
    hv: Val,
    v0: Val,
    bv: usize,
    inside: Val,
    p: Val,
    every: Val,
    cc: Val,
    pc: Val,
) {
    if inside && p % every == 0 {
        let col = p / every - 1;
        if col >= 0 && col < cc {
            let raw = slots[n][col];
            if raw >= 0 && raw < pc {
                copy(s, checkpoints.tile_at([raw as i32, hv, v0, 0], [1, 1, bv, 128]));
            }
        }
    }
}

/// The chunked recurrence for [`ChunkShape::value_rows`] value rows of one (sequence, value
/// head).
///
/// Tensors a config does not use are still parameters; the launcher binds a placeholder the
/// kernel never reads. `state` is `initial_state` (or the pool, read and written in place),
/// `final_state` the per-sequence output.
#[kernel]
pub fn chunk(
    cfg: &ChunkConfig,
    q: Global<(B, T, H, KD), { cfg.dtype }>,
    k: Global<(B, T, H, KD), { cfg.dtype }>,
    v: Global<(B, T, HV, VD), { cfg.dtype }>,
    g: Global<(B, T, HV, KD), { cfg.dtype }>,
    beta: Global<(B, T, HV), { cfg.dtype }>,
    a_log: Global<(HVA,), F32>,
    dt_bias: Global<(HVD, KDB), { cfg.dt_bias }>,
    state: GlobalMut<(P, HV, S1, S2), { cfg.state_dtype }>,
    final_state: GlobalMut<(F, HV, S1, S2), { cfg.state_dtype }>,
    state_indices: Global<(NI,), { cfg.states.indices() }>,
    read_indices: Global<(NR,), { cfg.states.indices() }>,
    has_initial: Global<(NH,), { cfg.states.has_initial().unwrap_or(I32) }>,
    cu_seqlens: Global<(NC,), { cfg.varlen.unwrap_or(I32) }>,
    prep: Global<(WB, TP, HV, PW), { cfg.operands.dtype() }>,
    prep_decay: Global<(WB, TC, HV, DW), F32>,
    prefix_lens: Global<(NPL,), { cfg.prefix.prefix_lens.unwrap_or(I32) }>,
    checkpoint_slots: Global<(NCK, CC), { cfg.prefix.checkpoint_slots.unwrap_or(I32) }>,
    checkpoints: GlobalMut<(PC, HV, S1, S2), { cfg.prefix.checkpoint_dtype(cfg.state_dtype) }>,
    segment_rows: Global<(NSR, RW), I32>,
    out: GlobalMut<(B, T, HV, VD), { cfg.dtype }>,
    NSEQ: Dim,
    scale: f32,
    lower_bound: f32,
    checkpoint_every: i32,
    first_chunk: i32,
    end_chunk: i32,
) {
    let bv = cfg.shape.value_rows();
    let prepared = cfg.preparation == Preparation::Workspace;
    let transition = cfg.run == ChunkRun::Transition;
    let output = cfg.run == ChunkRun::Output;
    let update_first = cfg.step_order() == StepOrder::UpdateFirst;
    let (vb, hv, z) = launch(
        grid = [VD / bv, HV, NSEQ],
        threads = 32 * cfg.shape.warps,
        min_blocks = cfg.shape.min_blocks,
        fill_warps = cfg.shape.fill_warps,
        producer_registers = cfg.shape.producer_registers,
        hoist = cfg.shape.hoist(),
        wgmma_min_n = cfg.shape.narrow_products.wgmma_min_n(),
    );
    // K = V = 128 (the launcher checks): boxes along these axes need no masks.
    assume_extent(KD, 128);
    assume_extent(VD, 128);
    // A head's 128 value rows in whole blocks: a launch of a shape past them is refused.
    assume_multiple(VD, bv);
    assume_extent(S1, 128);
    assume_extent(S2, 128);
    let h = hv / (HV / H);
    let v0 = vb * bv;
    let inverse_stores = InverseStores::for_block(32 * (cfg.shape.warps + cfg.shape.fill_warps), cfg.shape.min_blocks);
    let gate_scan = cfg.shape.gate_scan();
    let lower = cfg.gate == ChunkGate::LowerBound;
    if prepared {
        assume_extent(PW, PREP_COLS);
        assume_extent(DW, PREP_DECAY_COLS);
    }
    // Block row `z` runs sequence `n` (varlen: longest first, `chunk_order.rs`): rows
    // `bos .. eos` of batch row `bi`; its workspace rows are `pad` further down (a varlen
    // sequence's last chunk has its 16 rows to itself).
    let mut n = z;
    let mut bos = 0;
    let mut eos = T;
    let mut bi = z;
    let mut pad = 0;
    if cfg.varlen.is_some() {
        let lens_sh = shared([ORDERED_MAX_SEQUENCES], I32);
        let pick_sh = shared([1], I32);
        n = longest_first(cu_seqlens, lens_sh, pick_sh, z, NSEQ, T);
        bos = sequence_start(cu_seqlens, n, T);
        eos = sequence_end(cu_seqlens, n, T, bos);
        bi = 0;
        pad = crate::chunk_prep::sequence_pad(cfg.prefix.prefix_lens.is_some()) as i32 * n;
    }
    // The state slot (-1: padding, which writes zero output rows and touches no state), the
    // slot it starts from (`read_indices`, the same tensor as `state_indices` unless the
    // caller gave one; -1: zeros) and whether it does.
    let slot = state_slot(cfg.states.pool(), state_indices, n, P);
    let read = state_slot(cfg.states.pool(), read_indices, n, P);
    let live = slot >= 0;
    let from_state = live && starts_from_slot(cfg.states.has_initial().is_some(), has_initial, n, read);

    let s = fragment([bv, 128], F32);
    if transition {
        for (a, j) in parallel(s) {
            s[a][j] = select(v0 + a == j, 1.0, 0.0);
        }
    } else if cfg.states.reads_state() {
        if from_state {
            copy(state.tile_at([read, hv, v0, 0], [1, 1, bv, 128]), s);
        } else {
            clear(s);
        }
    } else {
        clear(s);
    }

    // The head's gate constants.
    let dt_sh = shared([128], cfg.dt_bias);
    let mut ea = 1.0;
    if cfg.gate.in_kernel() && !prepared {
        ea = exp(a_log[hv]);
        copy(dt_bias.tile_at([hv, 0], [1, 128]), dt_sh);
    }

    // The chunk's inputs, staged by the pipeline. A tile a config never touches takes no
    // shared memory (`drop_dead_tiles`): every tile is declared at its size.
    let q_sh = shared([16, 128], cfg.dtype);
    let k_sh = shared([16, 128], cfg.dtype);
    let g_sh = shared([16, 128], cfg.dtype);
    let v_sh = shared([16, bv], cfg.dtype);
    let b_sh = shared([16], cfg.dtype);
    // Key preparation, shared by the block's warps (the chain over a prepared workspace
    // touches none of it). The element-wise products need one copy of `l_sh` and `m_sh`, not
    // one per warp.
    let gl = shared([16, 128], F32);
    let kf = fragment([16, 128], F32, lanes_per_row = 32);
    let qf = fragment([16, 128], F32, lanes_per_row = 32);
    let sq = fragment([16, 128], F32, lanes_per_row = 32);
    let rk = fragment([16], F32);
    let rq = fragment([16], F32);
    let op = cfg.operands.dtype();
    let kd_sh = shared([16, 128], op);
    let qd_sh = shared([16, 128], op);
    let kr_sh = shared([16, 128], op);
    // The lower-bound gate's key products read `ki`, `kd` and `qd` in bf16, whatever the
    // operands; the element-wise products of the other gates read f32 rows.
    let ki_sh = shared([16, 128], BF16);
    let kd_key = shared([16, 128], BF16);
    let qd_key = shared([16, 128], BF16);
    let kq_key = shared([32, 128], BF16);
    let kn_sh = shared([16, 128], F32);
    let qn_sh = shared([16, 128], F32);
    // The key products: one 16-row copy a warp, however many value rows it holds, or split
    // over the warps.
    let key_products = cfg.shape.key_products;
    let key_rows = 16 * cfg.shape.factor_warps();
    let la = fragment([key_rows, 16], F32);
    let ma = fragment([key_rows, 16], F32);
    let lm = fragment([32, 16], F32);
    let fused_keys = lower && !prepared;
    let copies = fused_keys && key_products == KeyProducts::Replicated;
    // Split, `l_sh` holds both products (32 rows).
    let l_rows = match (fused_keys, key_products) {
        (true, KeyProducts::Replicated) => key_rows,
        (true, KeyProducts::Split) => 32,
        (false, _) => 16,
    };
    let l_sh = shared([l_rows, 16], F32);
    let m_sh = shared([if copies { key_rows } else { 16 }, 16], F32);
    let mq_sh = shared([16, 16], op);
    let bt_sh = shared([16], F32);
    let eg_sh = shared([128], F32);
    let cols = shared([16], F32);
    let x = local([16], F32);
    let inv_sh = shared([16, 16], op);
    #[rustfmt::skip]
    let keys = KeyTiles {
        g_sh, dt_sh, b_sh, k_sh, q_sh, gl, bt_sh, eg_sh, kf, qf, sq, rk, rq, ki_sh, kd_key, qd_key, kq_key, kn_sh,
        qn_sh, la, ma, lm, l_sh, m_sh, mq_sh, cols, x, inv_sh,
    };
    // The state's products.
    let wt = fragment([bv, 16], F32);
    let ot = fragment([bv, 16], F32);
    let vn = fragment([bv, 16], F32);
    let ut = fragment([bv, 16], F32);
    let o_sh = shared([16, bv], cfg.dtype);

    // The f32 workspace row of the sequence's first chunk: chunk `c`'s `w0 / 16` is this plus
    // `c`, so the loop divides nothing (as `chunk_prep` finds it).
    let d0 = (bos + pad) / 16;
    // With `prefix_lens`, chunks end at absolute multiples of 16 (`chunk_shift`).
    let prefix = sequence_prefix(cfg.prefix.prefix_lens.is_some(), prefix_lens, n);
    let shift = chunk_shift(prefix, bos, eos);
    let mut chunks = ceil_div(eos - bos + shift, 16);
    // Where the block row's checkpoints go (`Pieces`): its own row of `checkpoint_slots` up to
    // its last token, or a segment's sequence's row up to that sequence's last.
    let mut ck_row = n;
    let mut ck_end = prefix + eos - bos;
    if matches!(cfg.prefix.pieces, Pieces::Segments { .. }) {
        ck_row = segment_rows[n][0];
        ck_end = segment_rows[n][1];
    }
    if !output {
        // A padding slot writes no output rows here, so it has nothing to do: the split's
        // state passes leave out the segments they do not need so.
        chunks = select(live, chunks, 0);
    }
    // A token range runs its window of the sequence's chunks (`ChunkWindow`), from the state
    // the window before left.
    let c_first = window_start(first_chunk, chunks);
    let c_end = window_end(end_chunk, chunks, c_first);
    for c in pipelined(c_first, c_end, stages = cfg.shape.stages, fills_in_flight = cfg.shape.fills_in_flight) {
        // The chunk's first token, the end of its tokens and its workspace row (the fills see
        // them for the chunk they fetch).
        let t0 = max(bos, bos - shift + 16 * c);
        let t1 = min(eos, bos - shift + 16 * c + 16);
        let w0 = bos + 16 * c + pad;
        if prepared {
            // The queries' operands (`qd`, `Mqk`) feed only the output rows.
            copy(prep.tile_at([bi, w0, hv, PREP_KD], [1, 16, 1, 128]), kd_sh);
            if output {
                copy(prep.tile_at([bi, w0, hv, PREP_QD], [1, 16, 1, 128]), qd_sh);
            }
            copy(prep.tile_at([bi, w0, hv, PREP_KR], [1, 16, 1, 128]), kr_sh);
            copy(prep.tile_at([bi, w0, hv, PREP_INV], [1, 16, 1, 16]), inv_sh);
            if output {
                copy(prep.tile_at([bi, w0, hv, PREP_MQK], [1, 16, 1, 16]), mq_sh);
            }
            copy(prep_decay.tile_at([bi, d0 + c, hv, 0], [1, 1, 1, 128]), eg_sh);
            copy(prep_decay.tile_at([bi, d0 + c, hv, PREP_BETA], [1, 1, 1, 16]), bt_sh);
        } else {
            copy(q.tile_at([bi, t0, h, 0], [1, 16, 1, 128]).bounded([B, t1, H, 128]), q_sh);
            copy(k.tile_at([bi, t0, h, 0], [1, 16, 1, 128]).bounded([B, t1, H, 128]), k_sh);
            copy(g.tile_at([bi, t0, hv, 0], [1, 16, 1, 128]).bounded([B, t1, HV, 128]), g_sh);
        }
        if !transition {
            copy(v.tile_at([bi, t0, hv, v0], [1, 16, 1, bv]).bounded([B, t1, HV, 128]), v_sh);
        }
        if !prepared {
            copy(beta.tile_at([bi, t0, hv], [1, 16, 1]).bounded([B, t1, HV]), b_sh);
        }
        // Valid rows of this chunk (16 but in the last, and with a prefix the first).
        let nv = min(t1 - t0, 16);

        if !prepared {
            // The chunk's factors, from its fills alone: what a role of its own is to compute
            // a chunk ahead of the state's chain.
            for _ in producer() {
                prepare_keys(gate_scan, key_products, cfg.gate, cfg.beta, cfg.l2norm, keys, nv, ea, lower_bound, scale);
                copy(kf, kd_sh);
                if output {
                    copy(qf, qd_sh);
                }
                copy(sq, kr_sh);
                solve_chunk(lower, key_products, inverse_stores, keys);
            }
        }
        state_products(transition, output, s, kd_sh, qd_sh, inv_sh, bt_sh, v_sh, wt, ot, vn, ut);
        if update_first {
            decay_and_update(s, eg_sh, ut, kr_sh);
        }
        if output {
            output_rows(ut, mq_sh, ot, o_sh, live);
            copy(o_sh, out.tile_at([bi, t0, hv, v0], [1, 16, 1, bv]).bounded([B, t1, HV, 128]));
        }
        if !update_first {
            decay_and_update(s, eg_sh, ut, kr_sh);
        }
        if cfg.prefix.checkpoint_slots.is_some() {
            let p = prefix + t1 - bos;
            let inside = live && p < ck_end;
            write_checkpoint(s, checkpoints, checkpoint_slots, ck_row, hv, v0, bv, inside, p, checkpoint_every, CC, PC);
        }
    }

    if cfg.states.store_final() {
        copy(s, final_state.tile_at([n, hv, v0, 0], [1, 1, bv, 128]));
    }
    if cfg.states.pool() {
        if live {
            copy(s, state.tile_at([slot, hv, v0, 0], [1, 1, bv, 128]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_compiles() {
        let def = chunk(&ChunkConfig::default()).unwrap_or_else(|e| panic!("{e}"));
        kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The fused step's factors are a producer block handing the chain exactly the tiles a
    /// prepared workspace holds; the chain over a workspace has none.
    #[test]
    fn the_fused_steps_factors_are_its_producer_block() {
        let names = |cfg: &ChunkConfig, target| {
            let def = chunk(cfg).unwrap_or_else(|e| panic!("{e}"));
            let p = kda_dsl::passes::run_tile_passes_for(def, target).unwrap_or_else(|e| panic!("{e}"));
            let outputs = |plan: &kda_dsl::passes::place_producers::ProducerPlan| {
                plan.outputs.iter().map(|b| p.def.buffers[*b].name.clone()).collect::<Vec<_>>().join(" ")
            };
            p.producers.iter().map(outputs).collect::<Vec<_>>()
        };
        let fused = ChunkConfig::default();
        let hopper = ChunkConfig { shape: ChunkShape::HOPPER, ..fused.clone() };
        let handed_over = vec!["kd_sh qd_sh kr_sh mq_sh bt_sh eg_sh inv_sh".to_string()];
        assert_eq!(names(&fused, kda_dsl::Target::Sm80), handed_over);
        assert_eq!(names(&hopper, kda_dsl::Target::Sm90a), handed_over);
        let chain = ChunkConfig { shape: ChunkShape::PREPARED, preparation: Preparation::Workspace, ..fused };
        assert_eq!(names(&chain, kda_dsl::Target::Sm80), Vec::<String>::new());
    }
}
