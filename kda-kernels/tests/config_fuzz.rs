//! Random configs through the compiler: every kernel family's builder, the tile passes, the
//! lowering and the PTX printer return a diagnostic or a kernel for any config, well-formed or
//! not (shapes that do not divide, warp counts past the block, every dtype in every slot), and
//! never panic.

use kda_dsl::DType::{self, BF16, F16, F32, I32, I64};
use kda_dsl::Hoist;
use kda_kernels::chunk::{
    ChunkConfig, ChunkGate, ChunkOperands, ChunkRun, ChunkShape, ChunkStates, GateScan, KeyProducts, NarrowProducts,
    Pieces, PrefixCaching, Preparation, StepOrder,
};
use kda_kernels::chunk_prep::PrepConfig;
use kda_kernels::decode::{Beta, DecodeConfig, DecodeShape, Gate, Writes};
use kda_kernels::gemm::GemmConfig;
use kda_kernels::reference::Rng;

struct Draw(Rng);

impl Draw {
    fn r(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    fn of<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.r(xs.len())]
    }
    fn b(&mut self) -> bool {
        self.r(2) == 0
    }
    fn dt(&mut self) -> DType {
        self.of(&[BF16, F16, F32, I32, I64])
    }
    fn opt_dt(&mut self) -> Option<DType> {
        if self.b() {
            None
        } else {
            Some(self.dt())
        }
    }
}

/// Builds and compiles `def`, which may fail with a diagnostic but must not panic.
fn compiles_or_says_why(what: String, build: impl FnOnce() -> Result<kda_dsl::tile::KernelDef, kda_dsl::Diag>) -> bool {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build().and_then(|def| kda_dsl::compile(def, kda_dsl::Target::Sm80).map(|_| ()))
    }));
    match r {
        Ok(r) => r.is_ok(),
        Err(_) => panic!("{what}: the compiler panicked"),
    }
}

#[test]
fn random_configs_compile_or_get_a_diagnostic_never_a_panic() {
    let mut x = Draw(Rng::new(0xf022));
    let (mut ok, mut refused) = (0, 0);
    for case in 0..400 {
        let d = DecodeConfig {
            dtype: x.dt(),
            state_dtype: x.dt(),
            out_dtype: x.dt(),
            v_first: x.b(),
            gate: x.of(&[Gate::LowerBound, Gate::Softplus, Gate::Precomputed]),
            a_log: x.b(),
            dt_bias: x.opt_dt(),
            beta: x.of(&[Beta::Raw, Beta::Sigmoid, Beta::TwoSigmoid]),
            beta_headwise: x.r(5) == 0,
            l2norm: x.b(),
            varlen: x.opt_dt(),
            indices: x.opt_dt(),
            accepted: x.opt_dt(),
            use_initial_state: x.b(),
            writes: x.of(&[
                Writes::None,
                Writes::PoolPerToken,
                Writes::FinalPerToken,
                Writes::PoolPerSequence,
                Writes::FinalPerSequence,
            ]),
            shape: DecodeShape {
                rows: x.of(&[2, 4, 8, 16, 32, 64, 128, 48, 0]),
                warps: x.of(&[1, 2, 4, 8, 16, 3, 0]),
                min_blocks: x.of(&[1, 2, 4, 8, 0]),
                stages: x.of(&[1, 2, 3, 4]),
                whole_line_stores: x.b(),
                max_items: x.of(&[1, 2, 256, 0]),
                lanes_per_row: x.of(&[4, 32, 8]),
            },
        };
        let c = ChunkConfig {
            dtype: x.dt(),
            state_dtype: x.dt(),
            gate: x.of(&[ChunkGate::LowerBound, ChunkGate::Softplus, ChunkGate::Precomputed]),
            beta: x.of(&[Beta::Raw, Beta::Sigmoid, Beta::TwoSigmoid]),
            dt_bias: x.dt(),
            l2norm: x.b(),
            varlen: x.opt_dt(),
            states: match x.r(3) {
                0 => ChunkStates::Zeros { store_final: x.b() },
                1 => ChunkStates::PerSequence { store_final: x.b() },
                _ => ChunkStates::Pool { indices: x.dt(), has_initial: x.opt_dt() },
            },
            shape: ChunkShape {
                warps: x.of(&[1, 2, 4, 8, 3, 16, 0]),
                rows_per_warp: x.of(&[16, 32, 0, 24]),
                min_blocks: x.of(&[1, 2, 3, 0]),
                stages: x.of(&[2, 3, 4, 1, 0]),
                fill_warps: x.of(&[0, 1, 2, 5]),
                producer_registers: x.of(&[None, None, Some(128), Some(20)]),
                fills_in_flight: x.b(),
                hoist_override: x.of(&[None, Some(Hoist::Nothing), Some(Hoist::BlockUniform), Some(Hoist::Everything)]),
                gate_scan_override: x.of(&[None, Some(GateScan::PerChannel), Some(GateScan::Shared)]),
                narrow_products: x.of(&[NarrowProducts::Wgmma, NarrowProducts::MmaSync]),
                key_products: x.of(&[KeyProducts::Replicated, KeyProducts::Split]),
                step_order_override: x.of(&[None, Some(StepOrder::UpdateFirst), Some(StepOrder::OutputFirst)]),
            },
            run: x.of(&[ChunkRun::Transition, ChunkRun::StatesOnly, ChunkRun::Output, ChunkRun::Output]),
            preparation: x.of(&[Preparation::InKernel, Preparation::Workspace]),
            operands: x.of(&[ChunkOperands::F16, ChunkOperands::Bf16]),
            prefix: PrefixCaching {
                prefix_lens: x.opt_dt(),
                checkpoint_slots: x.opt_dt(),
                pieces: {
                    let checkpoints = x.dt();
                    x.of(&[Pieces::Sequences, Pieces::Segments { checkpoints }])
                },
            },
        };
        let p = PrepConfig {
            dtype: x.dt(),
            gate: c.gate,
            beta: c.beta,
            dt_bias: x.dt(),
            l2norm: x.b(),
            varlen: x.opt_dt(),
            warps: x.of(&[1, 2, 4, 8, 5]),
            operands: c.operands,
            prefix_lens: x.opt_dt(),
        };
        let g = GemmConfig {
            dtype: x.dt(),
            out: x.dt(),
            b_transposed: x.b(),
            bm: x.of(&[16, 32, 64, 128, 24, 0]),
            bn: x.of(&[8, 16, 64, 128, 40]),
            bk: x.of(&[16, 32, 64, 8]),
            stages: x.of(&[1, 2, 3, 4]),
            threads: x.of(&[32, 64, 128, 256, 96, 0]),
            aligned: x.b(),
            fill_warps: x.of(&[0, 1, 2]),
            staged_store: x.b(),
            raster_group: x.of(&[0, 8, 3]),
        };
        for built in [
            compiles_or_says_why(format!("case {case}: decode {d:?}"), || kda_kernels::decode::decode(&d)),
            compiles_or_says_why(format!("case {case}: chunk {c:?}"), || kda_kernels::chunk::chunk(&c)),
            compiles_or_says_why(format!("case {case}: chunk_prep {p:?}"), || kda_kernels::chunk_prep::chunk_prep(&p)),
            compiles_or_says_why(format!("case {case}: gemm {g:?}"), || kda_kernels::gemm::gemm(&g)),
        ] {
            if built {
                ok += 1;
            } else {
                refused += 1;
            }
        }
    }
    eprintln!("compiled {ok}, refused with a diagnostic {refused}");
    assert!(ok > 50 && refused > 50, "compiled {ok}, refused {refused}");
}
