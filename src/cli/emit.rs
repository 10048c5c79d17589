//! `kda emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a] [--shape SHAPE]`: a variant's PTX on
//! stdout; for `chunk`, `--shape` takes a `kda bench --sweep-chunk` shape instead of the config's
//! own, so the shapes the sweep times can be read and counted (`scripts/sass_loop.py`) too.

use kda_dsl::Target;
use kda_kernels::chunk::ChunkConfig;

pub(crate) const USAGE: &str = "usage: kda emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a] [--shape SHAPE]";

pub fn run(args: &[String]) -> Result<i32, String> {
    let (target, mut pos) = super::take_target(args)?;
    let shape = match pos.iter().position(|a| *a == "--shape") {
        Some(i) if i + 1 < pos.len() => {
            let s = pos[i + 1];
            pos.drain(i..i + 2);
            Some(s)
        }
        Some(_) => return Err("--shape needs a shape (`kda bench --help` names its parts)".into()),
        None => None,
    };
    let (family, config) = match pos.as_slice() {
        [f] => (*f, None),
        [f, c] => (*f, Some(*c)),
        _ => return Err(USAGE.into()),
    };
    if let Some(shape) = shape {
        return emit_chunk_shape(family, config, shape, target);
    }
    let vs: Vec<_> = kda_kernels::variants().into_iter().filter(|v| v.family == family).collect();
    if vs.is_empty() {
        return Err(format!("no kernel family `{family}`; `kda list` shows them"));
    }
    // The family's default on this target (an sm_90a variant where the family ships one), else
    // its sm_80 default.
    let v = match config {
        None => vs
            .iter()
            .find(|v| v.default && v.target == target)
            .or_else(|| vs.iter().find(|v| v.default && v.target == Target::Sm80))
            .unwrap_or(&vs[0]),
        Some(c) => vs
            .iter()
            .find(|v| v.name == c)
            .ok_or_else(|| format!("`{family}` has no config `{c}`; `kda list` shows them"))?,
    };
    print_ptx(v.build().map_err(|e| e.to_string())?, target)
}

/// The `chunk` kernel of `config` (the default without one) at a `--sweep-chunk` shape: the
/// shape's warps, rows, stages and options, its path (`p`: the chain over a workspace) and its
/// operands (`b`); sm_90a when the shape says `h`, else `target`.
fn emit_chunk_shape(family: &str, config: Option<&str>, shape: &str, target: Target) -> Result<i32, String> {
    if family != "chunk" {
        return Err(format!("--shape applies to `chunk` alone, not `{family}`"));
    }
    let base = match config {
        None => ChunkConfig::default(),
        Some(c) => kda_kernels::chunk_configs()
            .into_iter()
            .find(|cfg| cfg.key() == c)
            .ok_or_else(|| format!("`chunk` has no sm_80 config `{c}`; `kda list` shows them"))?,
    };
    let tuning = super::bench::parse_chunk_shape(shape)?;
    let target = if tuning.target == Target::Sm90a { Target::Sm90a } else { target };
    print_ptx(kda_kernels::chunk::chunk(&tuning.apply(base)).map_err(|e| e.to_string())?, target)
}

/// Compiles `def` for `target` and prints its PTX.
fn print_ptx(def: kda_dsl::tile::KernelDef, target: Target) -> Result<i32, String> {
    let k = kda_dsl::compile(def, target).map_err(|e| e.to_string())?;
    super::write_stdout(&k.ptx).map_err(|e| format!("writing the PTX: {e}"))?;
    Ok(0)
}
