//! On an H100 or H200 (compute capability 9.0): the Hopper thread programs of the simulator's
//! tests (wgmma through every swizzle and operand order, an mbarrier ring, a TMA box with zero
//! fill, warpgroups trading registers, clusters and a ring across a cluster's blocks, blocks
//! ordered by flags in global memory) run on the GPU, and every tensor they leave must hold the
//! same bytes the simulator left. The simulator is the primary check of the async rules, so
//! this is where its model of the instructions meets the hardware. Skips, visibly, on other
//! devices and on machines without a GPU.

use std::ffi::c_void;

use cudarc::driver::result;
use kda_dsl::artifact::{CompiledKernel, HostExpr};
use kda_dsl::hopper_layout::{Major, Swizzle};
use kda_dsl::sim::SimArg;
use kda_dsl::thread_ir::{ParamKind, ThreadProgram};
use kda_dsl::{DType, Target};
use kda_runtime::{encode_tensor_map, DeviceTensor, Gpu, ModuleCache, RuntimeError, TensorMapParam};

#[path = "../../kda-dsl/tests/support/hopper_programs.rs"]
#[allow(dead_code)] // the fault-planting half serves the simulator's tests only
mod hopper_programs;
use hopper_programs::*;
#[path = "../../kda-dsl/tests/support/flag_programs.rs"]
#[allow(dead_code)] // the faulty programs and the checks serve the simulator's tests only
mod flag_programs;
use flag_programs::*;

include!("support/on_gpu.rs");

include!("support/gpu_main.rs");

/// One program to run on both sides: its name, target, arguments and grid.
struct Probe {
    name: String,
    target: Target,
    program: ThreadProgram,
    args: Vec<(String, SimArg)>,
    grid: [u32; 3],
}

/// The fault-free programs of `tests/simulator.rs`, over the shapes its tests cover.
fn probes() -> Vec<Probe> {
    let mut out = vec![];
    let mut wgmma = |name: String, case: WgmmaCase| {
        let program = wgmma_program(case, WgmmaFault::None);
        out.push(Probe { name, target: Target::Sm90a, program, args: wgmma_args(case), grid: [1, 1, 1] });
    };
    for swizzle in Swizzle::ALL {
        let steps = (WgmmaCase::shared_a(swizzle).tiles().0.k() / 16).max(2);
        wgmma(
            format!("wgmma shared A, {swizzle:?}, {steps} steps"),
            WgmmaCase { steps, ..WgmmaCase::shared_a(swizzle) },
        );
    }
    wgmma("wgmma A from registers".into(), WgmmaCase { a_from_registers: true, ..WgmmaCase::shared_a(Swizzle::B32) });
    for (n, swizzle, a_major, b_major, a_from_registers) in [
        (8, Swizzle::B32, Major::K, Major::MN, false),
        (24, Swizzle::None, Major::MN, Major::K, false),
        (64, Swizzle::B128, Major::MN, Major::MN, false),
        (128, Swizzle::B64, Major::K, Major::MN, false),
        (256, Swizzle::B128, Major::K, Major::K, false),
        (256, Swizzle::B32, Major::K, Major::MN, true),
    ] {
        let case = WgmmaCase { swizzle, n, a_from_registers, a_major, b_major, steps: 2 };
        wgmma(format!("wgmma n {n}, {swizzle:?}, A {a_major:?}, B {b_major:?}, A regs {a_from_registers}"), case);
    }
    out.push(Probe {
        name: "mbarrier ring".into(),
        target: Target::Sm90,
        program: ring_program(RingFault::None),
        args: ring_args(),
        grid: [1, 1, 1],
    });
    out.push(Probe {
        name: "cp.async ring".into(),
        target: Target::Sm90,
        program: cp_async_ring_program(CpAsyncRingFault::None),
        args: cp_async_ring_args(),
        grid: [1, 1, 1],
    });
    out.push(Probe {
        name: "compute ring (loaded, ready, empty)".into(),
        target: Target::Sm90,
        program: compute_ring_program(ComputeRingFault::None),
        args: compute_ring_args(),
        grid: [1, 1, 1],
    });
    for at in [[0, 0], [32, 4], [56, -3], [-8, 15]] {
        out.push(Probe {
            name: format!("tma box at {at:?}"),
            target: Target::Sm90,
            program: tma_program(TmaFault::None),
            args: tma_args(at),
            grid: [1, 1, 1],
        });
    }
    out.push(Probe {
        name: "setmaxnreg roles".into(),
        target: Target::Sm90a,
        program: roles_program(RolesFault::None),
        args: vec![],
        grid: [1, 1, 1],
    });
    out.push(Probe {
        name: "clusters of 2: st.shared::cluster, barrier.cluster".into(),
        target: Target::Sm90,
        program: cluster_program(ClusterFault::None),
        args: cluster_args(),
        grid: [CLUSTER_GRID, 1, 1],
    });
    out.push(Probe {
        name: "a ring across clusters of 2: st.async, remote mbarrier arrivals".into(),
        target: Target::Sm90,
        program: cluster_ring_program(ClusterHandover::StAsync, ClusterRingFault::None),
        args: cluster_ring_args(2),
        grid: [4, 1, 1],
    });
    out.push(Probe {
        name: "a ring across clusters of 2: bulk copies between blocks".into(),
        target: Target::Sm90,
        program: cluster_ring_program(ClusterHandover::BulkCopy, ClusterRingFault::None),
        args: cluster_ring_args(2),
        grid: [4, 1, 1],
    });
    out.push(Probe {
        name: "producers of clusters of 2 taking turns, every block consuming".into(),
        target: Target::Sm90,
        program: cluster_turns_program(TurnsFault::None),
        args: cluster_turns_args(2),
        grid: [4, 1, 1],
    });
    out.push(ping_pong(4, 5));
    // Few enough blocks to be resident at once on any device, as the programs need.
    for (kind, how) in [(FlagKind::Store, "st.release"), (FlagKind::Add, "red.release.add")] {
        out.push(Probe {
            name: format!("a chain of flags down 8 blocks: {how}, ld.acquire"),
            target: Target::Sm80,
            program: flag_chain_program(kind, FlagFault::None),
            args: flag_chain_args(8),
            grid: [8, 1, 1],
        });
    }
    out.push(Probe {
        name: "5 blocks counted on one flag word: red.release.add, ld.acquire".into(),
        target: Target::Sm80,
        program: flag_count_program(CountVariant::Plain),
        args: flag_count_args(5),
        grid: [5, 1, 1],
    });
    out
}

/// [`cluster_ping_pong_program`] over `blocks` blocks, `rounds` round trips.
fn ping_pong(blocks: u32, rounds: i32) -> Probe {
    Probe {
        name: format!("a ball between clusters' blocks, {rounds} round trips"),
        target: Target::Sm90,
        program: cluster_ping_pong_program(),
        args: cluster_ping_pong_args(blocks, rounds),
        grid: [blocks, 1, 1],
    }
}

/// On an H100 or H200, what a design that spreads a head over a cluster's blocks would meet:
/// the time of a round trip between two blocks of a cluster (`st.async` a warp's 128 bytes
/// into the peer, completing its mbarrier, and back: [`cluster_ping_pong_program`]), the
/// difference of a long and a short run over their difference in trips (so launch and copy
/// costs cancel), median of 5; and how many clusters the device runs at once
/// (`cuOccupancyMaxActiveClusters`) for blocks of 320 threads at several shared sizes. A
/// benchmark: it prints and asserts only that the ball came back right.
fn cluster_round_trip_and_occupancy() {
    on_gpu(|| {
        let gpu = Gpu::new(0)?;
        if gpu.limits().compute_capability != (9, 0) {
            println!("skipped: clusters are measured on compute capability 9.0 only");
            return Ok(());
        }
        let cache = ModuleCache::new();
        let (short, long) = (1_000, 51_000);
        let time_of = |rounds: i32| -> Result<f64, RuntimeError> {
            let mut runs = vec![];
            for _ in 0..5 {
                let probe = ping_pong(2, rounds);
                let start = std::time::Instant::now();
                let out = run_on_gpu(&gpu, &cache, &probe)?;
                runs.push(start.elapsed().as_secs_f64());
                let words: Vec<u32> =
                    out[0].1.chunks(4).map(|w| u32::from_le_bytes(w.try_into().expect("a word"))).collect();
                assert_eq!(words, cluster_ping_pong_expected(2, rounds as u32), "{rounds} round trips");
            }
            runs.sort_by(f64::total_cmp);
            Ok(runs[2])
        };
        let (t_short, t_long) = (time_of(short)?, time_of(long)?);
        let trip_ns = (t_long - t_short) / f64::from(long - short) * 1e9;
        println!(
            "round trip between a cluster's two blocks (st.async of 128 bytes each way): {trip_ns:.0} ns \
             ({short} trips {:.3} ms, {long} trips {:.3} ms)",
            t_short * 1e3,
            t_long * 1e3
        );
        println!("clusters the device runs at once, blocks of 320 threads (cuOccupancyMaxActiveClusters):");
        println!("{:>14} {:>10} {:>10} {:>10} {:>10}", "shared bytes", "1 block", "2 blocks", "4 blocks", "8 blocks");
        for shared in [48 * 1024, 100 * 1024, 160 * 1024, 200 * 1024] {
            let mut row = format!("{shared:>14}");
            for cluster in [1u32, 2, 4, 8] {
                let n = max_active_clusters(&gpu, &cache, 320, shared, cluster)?;
                row += &format!(" {n:>10}");
            }
            println!("{row}");
        }
        Ok(())
    });
}

/// `cuOccupancyMaxActiveClusters` for a kernel of `threads` threads and `shared` bytes of
/// dynamic shared memory launched in clusters of `cluster` blocks.
fn max_active_clusters(
    gpu: &Gpu,
    cache: &ModuleCache,
    threads: u32,
    shared: u32,
    cluster: u32,
) -> Result<i32, RuntimeError> {
    use cudarc::driver::sys;
    // The ping-pong program without its `.reqnctapercluster`: the launch names the cluster.
    let prog = ThreadProgram { cluster_blocks: 1, threads, shared_bytes: shared, ..cluster_ping_pong_program() };
    let kernel = kernel_of(&prog, Target::Sm90);
    let loaded = cache.get_or_load(gpu, &kernel, &format!("occupancy {threads} {shared}"))?;
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    };
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster, y: 1, z: 1 };
    let config = sys::CUlaunchConfig {
        gridDimX: cluster * 64,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: std::ptr::null_mut(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut clusters = 0;
    // SAFETY: the function is loaded in the current context; `config` and its one attribute
    // live across the call, which only reads them.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, loaded.cu_function(), &config) }
        .result()
        .map_err(|e| RuntimeError::driver("cuOccupancyMaxActiveClusters", e))?;
    Ok(clusters)
}

/// A parameter's value as `cuLaunchKernel` reads it.
enum ParamValue {
    Word(u64),
    Map(TensorMapParam),
}

/// `prog` printed for `target` as a kernel the cache loads (its launches name their own grid
/// and parameters).
fn kernel_of(prog: &ThreadProgram, target: Target) -> CompiledKernel {
    CompiledKernel {
        entry: prog.name.clone(),
        ptx: kda_dsl::ptx::print_module(prog, target),
        params: vec![],
        threads: prog.threads,
        shared_bytes: prog.shared_bytes,
        grid: [HostExpr::Const(1), HostExpr::Const(1), HostExpr::Const(1)],
        assumptions: vec![],
        exact_extents: vec![],
        cluster_blocks: prog.cluster_blocks,
    }
}

/// Runs `probe` on the GPU (its grid; a program's clusters are its `.reqnctapercluster`) and
/// returns every tensor argument's bytes afterwards,
/// in `probe.args` order.
fn run_on_gpu(gpu: &Gpu, cache: &ModuleCache, probe: &Probe) -> Result<Vec<(String, Vec<u8>)>, RuntimeError> {
    let s = gpu.default_stream();
    let prog = &probe.program;
    let kernel = kernel_of(prog, probe.target);
    let loaded = cache.get_or_load(gpu, &kernel, &probe.name)?;
    let mut tensors = vec![];
    for (name, a) in &probe.args {
        if let SimArg::Tensor(bytes) = a {
            // Every probe's tensors are whole 32-bit words.
            let words = [bytes.len() / 4];
            tensors.push((name.clone(), DeviceTensor::from_bytes(gpu, &s, &words, DType::I32, bytes)?));
        }
    }
    let tensor = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
    let mut values = vec![];
    for (pname, kind) in &prog.params {
        let name = pname.strip_prefix("p_").unwrap_or(pname);
        let arg = probe.args.iter().find(|(n, _)| n == name).map(|(_, a)| a);
        let value = match (kind, arg) {
            (ParamKind::Value(_), Some(SimArg::Tensor(_))) => {
                ParamValue::Word(tensor(name).expect("uploaded").view().ptr())
            }
            (ParamKind::Value(_), Some(SimArg::I32(v))) => ParamValue::Word(*v as u32 as u64),
            (ParamKind::Value(_), Some(SimArg::I64(v))) => ParamValue::Word(*v as u64),
            (ParamKind::Value(_), Some(SimArg::F32(v))) => ParamValue::Word(u64::from(v.to_bits())),
            (ParamKind::TensorMap(_), Some(SimArg::TensorMap { tensor: over, map })) => {
                let t = tensor(over).expect("the mapped tensor is an argument");
                ParamValue::Map(encode_tensor_map(name, map, t.view().ptr(), t.size_bytes() as u64)?)
            }
            _ => {
                return Err(RuntimeError::bad_argument(
                    pname.as_str(),
                    format!("an argument for a {kind:?} parameter"),
                    "none",
                ))
            }
        };
        values.push(value);
    }
    // Each word parameter is read at its declared width from the start of its slot: the low
    // bytes of a little-endian u64 are the u32 too.
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| match v {
            ParamValue::Word(w) => (w as *mut u64).cast(),
            ParamValue::Map(m) => m.as_param(),
        })
        .collect();
    // SAFETY: the function is loaded in this context; `params` points at `values`, which
    // outlive the call, one slot per declared parameter; the tensors outlive the synchronize.
    unsafe {
        result::launch_kernel(
            loaded.cu_function(),
            (probe.grid[0], probe.grid[1], probe.grid[2]),
            (prog.threads, 1, 1),
            prog.shared_bytes,
            s.cu_stream(),
            &mut params,
        )
    }
    .map_err(|e| RuntimeError::driver("cuLaunchKernel", e))?;
    s.synchronize().map_err(|e| RuntimeError::driver("cuStreamSynchronize", e))?;
    tensors.iter().map(|(n, t)| Ok((n.clone(), t.to_bytes(&s)?))).collect()
}

fn hopper_programs_match_the_simulator() {
    on_gpu(|| {
        let gpu = Gpu::new(0)?;
        if gpu.limits().compute_capability != (9, 0) {
            println!(
                "skipped: sm_90a programs need compute capability 9.0, this GPU has {:?}",
                gpu.limits().compute_capability
            );
            return Ok(());
        }
        let cache = ModuleCache::new();
        let mut failures = vec![];
        for probe in probes() {
            let mut simulated = probe.args.clone();
            if let Err(e) = kda_dsl::sim::run(&probe.program, probe.grid, &mut simulated) {
                failures.push(format!("{}: the simulator: {e}", probe.name));
                continue;
            }
            let on_gpu = match run_on_gpu(&gpu, &cache, &probe) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{}: the GPU: {e}", probe.name));
                    continue;
                }
            };
            let mut bytes = 0;
            for (name, got) in &on_gpu {
                let want = tensor(&simulated, name);
                match got.iter().zip(want).position(|(g, w)| g != w) {
                    None if got.len() == want.len() => bytes += got.len(),
                    first => {
                        let at = first.unwrap_or(0) / 4 * 4;
                        let words = |b: &[u8]| {
                            b[at..(at + 16).min(b.len())]
                                .chunks(4)
                                .map(|w| format!("{:08x}", u32::from_le_bytes(w.try_into().unwrap_or([0; 4]))))
                                .collect::<Vec<_>>()
                                .join(" ")
                        };
                        let differing = got.iter().zip(want).filter(|(g, w)| g != w).count();
                        failures.push(format!(
                            "{}: tensor `{name}` differs from the simulator's at byte {first:?} of {} ({differing} bytes differ); GPU words there {}, simulator {}",
                            probe.name,
                            want.len(),
                            words(got),
                            words(want)
                        ))
                    }
                }
            }
            println!("{:<60} {bytes:>8} bytes as simulated", probe.name);
        }
        assert!(failures.is_empty(), "{} program(s) differ:\n{}", failures.len(), failures.join("\n"));
        Ok(())
    });
}

/// Anywhere: every probe runs cleanly in the simulator, so a GPU run compares two results
/// rather than finding a fault the simulator would have named.
fn probes_run_in_the_simulator() {
    for probe in probes() {
        let mut args = probe.args.clone();
        if let Err(e) = kda_dsl::sim::run(&probe.program, probe.grid, &mut args) {
            panic!("{}: {e}", probe.name);
        }
    }
}

fn main() {
    gpu_test_main(
        &[("hopper_programs_match_the_simulator", hopper_programs_match_the_simulator)],
        &[("cluster_round_trip_and_occupancy", cluster_round_trip_and_occupancy)],
        &[("probes_run_in_the_simulator", probes_run_in_the_simulator)],
    )
}
