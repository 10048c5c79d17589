//! What a prefill path launches, as data: [`Step`]s, the launches in order and the joins
//! between the call's stream and the one beside it. Each path builds its own (`prepared.rs`
//! the one-chain paths, `ranges.rs` the token ranges, `split.rs` the split); [`run_steps`] is
//! the one function that binds and launches them.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use kda_dsl::Target;
use kda_kernels::chunk::ChunkConfig;
use kda_kernels::chunk_merge::MergeConfig;
use kda_kernels::chunk_prep::PrepConfig;
use kda_kernels::chunk_segments::SegmentsConfig;

use super::bind::{preparation_args, ChunkKernelArgs};
use super::tuning::ChainSms;
use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};
use crate::kernels::{Kernels, Ready};
use crate::launch::{launch_planned, KernelArg};

/// The stream a step runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The call's stream.
    Call,
    /// Beside it: the thread's highest-priority stream ([`Gpu::high_priority_stream`]), whose
    /// blocks are scheduled first, for the serial chains that other work overlaps.
    Beside,
}

impl Lane {
    /// The lane a join on this one waits for.
    pub(crate) fn other(self) -> Lane {
        match self {
            Lane::Call => Lane::Beside,
            Lane::Beside => Lane::Call,
        }
    }
}

/// Named kernel arguments of the split's own kernels.
pub(crate) type NamedArgs = Vec<(&'static str, KernelArg)>;

/// One step of a prefill call.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    /// The chunk kernel (a chain, or one of the split's passes) over `args`.
    Chain {
        /// Where it runs.
        lane: Lane,
        /// Its variant.
        cfg: ChunkConfig,
        /// The target it is compiled for.
        target: Target,
        /// Its arguments.
        args: ChunkKernelArgs,
        /// Whether its blocks keep their SMs to themselves.
        sms: ChainSms,
    },
    /// `chunk_prep` for a chain's arguments (it takes those it declares), over `blocks` blocks
    /// per (sequence, value head), on the call's stream.
    Prepare {
        /// Its variant.
        cfg: PrepConfig,
        /// The chain's arguments.
        args: ChunkKernelArgs,
        /// Blocks per (sequence, value head), below 2^31.
        blocks: usize,
    },
    /// The split's segment schedule, on the call's stream.
    Segments(SegmentsConfig, NamedArgs),
    /// The split's merge of start states, on the call's stream.
    Merge(MergeConfig, NamedArgs),
    /// The split's final states, on the call's stream.
    Finish(MergeConfig, NamedArgs),
    /// The lane waits for everything enqueued on the other so far (work before the call
    /// included).
    Join(Lane),
}

/// Binds and launches `steps` in order, for a call on `stream`.
pub(crate) fn run_steps<'a>(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    steps: impl IntoIterator<Item = &'a Step>,
) -> Result<(), RuntimeError> {
    let mut beside: Option<Arc<CudaStream>> = None;
    let mut on = |lane: Lane| -> Result<Option<Arc<CudaStream>>, RuntimeError> {
        match lane {
            Lane::Call => Ok(None),
            Lane::Beside => {
                if beside.is_none() {
                    beside = Some(gpu.high_priority_stream()?);
                }
                Ok(beside.clone())
            }
        }
    };
    for step in steps {
        match step {
            Step::Chain { lane, cfg, target, args, sms } => {
                let s = on(*lane)?;
                let ready = kernels.chunk(cfg, *target)?;
                let shared = match sms {
                    ChainSms::Shared => None,
                    ChainSms::Own => Some(gpu.limits().shared_per_block_optin),
                };
                launch_ready(gpu, kernels, s.as_deref().unwrap_or(stream), &ready, args, shared)?
            }
            Step::Prepare { cfg, args, blocks } => {
                let ready = kernels.chunk_prep(cfg)?;
                let prep = preparation_args(&ready.kernel, args, *blocks)?;
                launch_ready(gpu, kernels, stream, &ready, prep.as_slice(), None)?
            }
            Step::Segments(cfg, args) => {
                launch_ready(gpu, kernels, stream, &*kernels.chunk_segments(cfg)?, args, None)?
            }
            Step::Merge(cfg, args) => launch_ready(gpu, kernels, stream, &*kernels.chunk_merge(cfg)?, args, None)?,
            Step::Finish(cfg, args) => launch_ready(gpu, kernels, stream, &*kernels.chunk_finish(cfg)?, args, None)?,
            Step::Join(lane) => {
                let (waiter, waited) = (on(*lane)?, on(lane.other())?);
                let waiter = waiter.as_deref().unwrap_or(stream);
                waiter.join(waited.as_deref().unwrap_or(stream)).op("cuStreamWaitEvent")?;
            }
        }
    }
    Ok(())
}

/// Loads a compiled kernel on `gpu` (once) and launches it on `stream` with `bound`, its blocks
/// asking for `shared` bytes of shared memory where given (else the kernel's own).
fn launch_ready(
    gpu: &Gpu,
    kernels: &Kernels,
    stream: &CudaStream,
    ready: &Ready,
    bound: &[(&str, KernelArg)],
    shared: Option<usize>,
) -> Result<(), RuntimeError> {
    let loaded = ready.loaded(gpu, &kernels.modules)?;
    launch_planned(gpu, &loaded, stream, &ready.kernel, &ready.binding, &ready.id, bound, shared)
}

/// Test support: every launch of `steps` binds to its kernel, compiled for sm_80.
#[cfg(test)]
pub(crate) fn assert_steps_bind(steps: &[Step]) {
    use crate::launch::bind_args;
    let compile_on = |def: Result<kda_dsl::tile::KernelDef, kda_dsl::Diag>, target| {
        kda_dsl::compile(def.expect("builds"), target).expect("compiles")
    };
    let compile = |def| compile_on(def, Target::Sm80);
    for (i, step) in steps.iter().enumerate() {
        let bound = match step {
            Step::Chain { cfg, target, args, .. } => {
                bind_args(&compile_on(kda_kernels::chunk::chunk(cfg), *target), args)
            }
            Step::Prepare { cfg, args, blocks } => {
                let kernel = compile(kda_kernels::chunk_prep::chunk_prep(cfg));
                let prep = preparation_args(&kernel, args, *blocks).expect("preparation arguments");
                bind_args(&kernel, prep.as_slice())
            }
            Step::Segments(cfg, args) => bind_args(&compile(kda_kernels::chunk_segments::chunk_segments(cfg)), args),
            Step::Merge(cfg, args) => bind_args(&compile(kda_kernels::chunk_merge::chunk_merge(cfg)), args),
            Step::Finish(cfg, args) => bind_args(&compile(kda_kernels::chunk_merge::chunk_finish(cfg)), args),
            Step::Join(_) => continue,
        };
        bound.unwrap_or_else(|e| panic!("step {i} ({step:?}) does not bind: {e}"));
    }
}
