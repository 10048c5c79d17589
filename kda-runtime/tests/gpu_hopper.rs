//! On an H100 or H200 (compute capability 9.0): the Hopper thread programs of the simulator's
//! tests (wgmma through every swizzle and operand order, an mbarrier ring, a TMA box with zero
//! fill, warpgroups trading registers, clusters and a ring across a cluster's blocks) run on
//! the GPU, and every tensor they leave must hold the same bytes the simulator left. The simulator is the primary check of the async rules,
//! so this is where its model of the instructions meets the hardware. Skips, visibly, on other
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
        program: cluster_ring_program(ClusterRingFault::None),
        args: cluster_ring_args(2),
        grid: [4, 1, 1],
    });
    out
}

/// A parameter's value as `cuLaunchKernel` reads it.
enum ParamValue {
    Word(u64),
    Map(TensorMapParam),
}

/// Runs `probe` on the GPU (its grid; a program's clusters are its `.reqnctapercluster`) and
/// returns every tensor argument's bytes afterwards,
/// in `probe.args` order.
fn run_on_gpu(gpu: &Gpu, cache: &ModuleCache, probe: &Probe) -> Result<Vec<(String, Vec<u8>)>, RuntimeError> {
    let s = gpu.default_stream();
    let prog = &probe.program;
    let kernel = CompiledKernel {
        entry: prog.name.clone(),
        ptx: kda_dsl::ptx::print_module(prog, probe.target),
        params: vec![],
        threads: prog.threads,
        shared_bytes: prog.shared_bytes,
        grid: [HostExpr::Const(1), HostExpr::Const(1), HostExpr::Const(1)],
        assumptions: vec![],
        exact_extents: vec![],
    };
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
        &[],
        &[("probes_run_in_the_simulator", probes_run_in_the_simulator)],
    )
}
