//! `kda emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a]`: a variant's PTX on stdout.

use kda_dsl::Target;

pub fn run(args: &[String]) -> Result<i32, String> {
    let (target, pos) = super::take_target(args)?;
    let (family, config) = match pos.as_slice() {
        [f] => (*f, None),
        [f, c] => (*f, Some(*c)),
        _ => return Err("usage: kda emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a]".into()),
    };
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
    let def = v.build().map_err(|e| e.to_string())?;
    let k = kda_dsl::compile(def, target).map_err(|e| e.to_string())?;
    super::write_stdout(&k.ptx).map_err(|e| format!("writing the PTX: {e}"))?;
    Ok(0)
}
