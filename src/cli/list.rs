//! `kda list`: kernel families and their shipped configs.

pub fn run(args: &[String]) -> Result<i32, String> {
    if let Some(a) = args.first() {
        return Err(format!("`list` takes no arguments (got `{a}`)"));
    }
    for v in kda_kernels::variants() {
        let default = match (v.default, v.target) {
            (false, _) => String::new(),
            (true, kda_dsl::Target::Sm80) => "  (default)".to_string(),
            (true, t) => format!("  (default on {t})"),
        };
        let target = if v.target == kda_dsl::Target::Sm80 { String::new() } else { format!("  [{}]", v.target) };
        out!("{:<8} {}{target}{default}", v.family, v.name);
    }
    Ok(0)
}
