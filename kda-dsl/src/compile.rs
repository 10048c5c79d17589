//! The driver: kernel definition to tile passes to thread program to PTX.

use crate::artifact::{CompiledKernel, ParamSig};
use crate::diag::Diag;
use crate::passes::{dump, run_tile_passes, TileProgram};
use crate::target::Target;
use crate::thread_ir::ThreadProgram;
use crate::tile::{KernelDef, Param};

/// Runs the tile passes and lowers to the thread program (what the printer prints and the
/// simulator runs).
pub fn lower_kernel(def: KernelDef) -> Result<(TileProgram, ThreadProgram), Diag> {
    let tp = run_tile_passes(def)?;
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
    let (tp, prog) = lower_kernel(def)?;
    if let Some(i) = prog.body.iter().find(|i| !target.has(i.least_target())) {
        return Err(Diag::new(i.loc, format!("`{}` needs target {}, not {target}", i.op, i.least_target())));
    }
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
    })
}
