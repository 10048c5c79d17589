//! The driver: kernel definition to tile passes to thread program to PTX.

use crate::artifact::{CompiledKernel, ParamSig};
use crate::diag::{Diag, SrcLoc};
use crate::passes::{dump, run_tile_passes_for, TileProgram};
use crate::target::Target;
use crate::thread_ir::ThreadProgram;
use crate::tile::{KernelDef, Param};

/// Runs the tile passes and lowers to the thread program (what the printer prints and the
/// simulator runs), for the default target (sm_80).
pub fn lower_kernel(def: KernelDef) -> Result<(TileProgram, ThreadProgram), Diag> {
    lower_kernel_for(def, Target::default())
}

/// [`lower_kernel`] with the instructions chosen for `target`.
pub fn lower_kernel_for(def: KernelDef, target: Target) -> Result<(TileProgram, ThreadProgram), Diag> {
    let tp = run_tile_passes_for(def, target)?;
    let prog = crate::lower::lower(&tp)?;
    dump("lower", &ThreadDump(&prog));
    Ok((tp, prog))
}

struct ThreadDump<'a>(&'a ThreadProgram);

impl std::fmt::Display for ThreadDump<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for i in &self.0.body {
            writeln!(f, "{i}    // {}", i.loc)?;
        }
        Ok(())
    }
}

/// Compiles a kernel for `target`.
pub fn compile(def: KernelDef, target: Target) -> Result<CompiledKernel, Diag> {
    let params = def
        .params
        .iter()
        .map(|p| match p {
            Param::Tensor { name, dtype, dims, writes } => ParamSig::Tensor {
                name: name.clone(),
                dtype: *dtype,
                dims: dims.iter().map(|d| def.params[*d].name().to_string()).collect(),
                writes: *writes,
            },
            Param::Dim { name } => ParamSig::Dim { name: name.clone() },
            Param::Scalar { name, dtype } => ParamSig::Scalar { name: name.clone(), dtype: *dtype },
        })
        .collect();
    let grid = def.grid.clone();
    let assumptions = def.assumptions.iter().map(|(p, m)| (def.params[*p].name().to_string(), *m)).collect();
    let exact_extents = def.exact_extents.iter().map(|(p, v)| (def.params[*p].name().to_string(), *v)).collect();
    let declared = def.loc;
    let (tp, prog) = lower_kernel_for(def, target)?;
    check_target(declared, &prog, target)?;
    // The tensor maps the lowering added, after the source's parameters as in the entry.
    let mut params: Vec<ParamSig> = params;
    params.extend(tp.tensor_maps.iter().cloned().map(ParamSig::TensorMap));
    let ptx = crate::ptx::print_module(&prog, target);
    dump("ptx", &ptx);
    Ok(CompiledKernel {
        entry: prog.name.clone(),
        ptx,
        params,
        threads: prog.threads,
        shared_bytes: tp.shared_bytes,
        grid,
        assumptions,
        exact_extents,
        cluster_blocks: prog.cluster_blocks,
    })
}

/// The first instruction of `prog` that `target` lacks, as an error at its kernel line, or
/// its clusters where `target` has none (at the kernel's declaration).
fn check_target(declared: SrcLoc, prog: &ThreadProgram, target: Target) -> Result<(), Diag> {
    if prog.cluster_blocks > 1 && !target.has(Target::Sm90) {
        return Err(Diag::new(
            declared,
            format!("`launch(.., cluster = {})` needs target {}, not {target}", prog.cluster_blocks, Target::Sm90),
        ));
    }
    match prog.body.iter().find(|i| !target.has(i.least_target())) {
        None => Ok(()),
        Some(i) => Err(Diag::new(i.loc, format!("`{}` needs target {}, not {target}", i.op, i.least_target()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thread_ir::{CachePolicy, Inst, Op};

    /// A program holding a `wgmma.fence` compiles for sm_90a only, and the error names the
    /// instruction, the target it needs and the kernel line.
    #[test]
    fn an_instruction_the_target_lacks_is_an_error_at_its_line() {
        let inst = Inst { op: Op::WgmmaFence, guard: None, loc: SrcLoc::new("k.rs", 7, 3), cache: CachePolicy::Normal };
        let prog = ThreadProgram::of_body(128, vec![inst]);
        let declared = SrcLoc::new("k.rs", 1, 1);
        assert!(check_target(declared, &prog, Target::Sm90a).is_ok());
        for target in [Target::Sm80, Target::Sm90] {
            let e = check_target(declared, &prog, target).expect_err("wgmma needs sm_90a").to_string();
            assert!(e.contains("`wgmma.fence.sync.aligned;` needs target sm_90a") && e.contains("k.rs:7:3"), "{e}");
        }
    }

    /// A kernel in clusters compiles for sm_90 and later only, the error at its declaration.
    #[test]
    fn clusters_need_sm_90() {
        let prog = ThreadProgram { cluster_blocks: 2, ..ThreadProgram::of_body(128, vec![]) };
        let declared = SrcLoc::new("k.rs", 4, 1);
        assert!(check_target(declared, &prog, Target::Sm90).is_ok());
        let e = check_target(declared, &prog, Target::Sm80).expect_err("clusters need sm_90").to_string();
        assert!(e.contains("`launch(.., cluster = 2)` needs target sm_90, not sm_80") && e.contains("k.rs:4:1"), "{e}");
    }
}
