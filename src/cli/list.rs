//! `kda list`: kernel families and their shipped configs.

pub fn run(args: &[String]) -> Result<i32, String> {
    if let Some(a) = args.first() {
        return Err(format!("`list` takes no arguments (got `{a}`)"));
    }
    for v in kda_kernels::variants() {
        out!("{:<8} {}{}", v.family, v.name, if v.default { "  (default)" } else { "" });
    }
    Ok(0)
}
