//! The `kda` commands.

/// `println!` for the commands' output: a reader that stops early (`kda check | head`) ends
/// the command quietly instead of panicking on the closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        if let Err(e) = $crate::cli::write_stdout(&format!("{}\n", format_args!($($arg)*))) {
            panic!("writing to stdout: {e}");
        }
    }};
}

/// Writes `text` to standard output. A reader that stops early (`| head`) ends the command
/// quietly (exit status 0); any other write error is returned.
pub(crate) fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => r,
    }
}

mod bench;
mod check;
mod chunk_gpu;
mod conflicts;
mod decode_gpu;
mod demo;
mod emit;
pub mod gpu_checks;
mod list;

const USAGE: &str = "usage: kda <command> [--help]
  list                                   kernels and their shipped configs
  emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a] [--shape SHAPE]
                                         PTX of a variant on stdout (default config when omitted)
  check [--gpu [--quick] [--allow-no-gpu]]
                                         every kernel family through the simulator against its
                                         reference (with --gpu: on the GPU too); exit 1 on failure
  conflicts [FAMILY] [--target T] [--prepared] [--all]
                                         the prefill kernel's shared-memory bank conflicts per
                                         source line, counted in the simulator
  bench [--json FILE] [--case NAME]      GPU timings (and JSON lines), the cases whose name
                                         contains NAME; --sweep-gemm, --sweep-decode and
                                         --sweep-chunk time launch shapes (--case NAME:
                                         the rows or cases whose name contains NAME)
  demo                                   the main job: run and check the kernels on the GPU, or
                                         without one, compile everything and run `check`
  --version                              the version";

/// The target `--target T` (or `--target=T`) names among `args` (sm_80 without one), and the
/// other arguments.
fn take_target(args: &[String]) -> Result<(kda_dsl::Target, Vec<&str>), String> {
    let parse = |t: &str| {
        kda_dsl::Target::parse(t).ok_or_else(|| format!("unknown target `{t}`; expected sm_80, sm_90 or sm_90a"))
    };
    let mut target = kda_dsl::Target::Sm80;
    let mut rest = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--target" {
            target = parse(it.next().ok_or("--target needs sm_80, sm_90 or sm_90a")?)?;
        } else if let Some(t) = a.strip_prefix("--target=") {
            target = parse(t)?;
        } else {
            rest.push(a.as_str());
        }
    }
    Ok((target, rest))
}

/// Each command's `--help`: its usage and what it does.
fn command_help(cmd: &str) -> Option<&'static str> {
    Some(match cmd {
        "list" => "usage: kda list\n\nLists every shipped kernel variant by family and config name; `(default)` marks\nthe config `kda emit NAME` prints without one.",
        "emit" => "usage: kda emit NAME [CONFIG] [--target sm_80|sm_90|sm_90a] [--shape SHAPE]\n\nPrints the PTX of a shipped variant (`kda list` names them): the family's default\nconfig without CONFIG; for sm_80 unless --target says otherwise. For `chunk`,\n--shape SHAPE (a `kda bench --sweep-chunk` shape, e.g. 4x2w32ik) replaces the config's\nlaunch shape, path and operands: the kernel that sweep row times.",
        "check" => "usage: kda check [--gpu [--quick] [--allow-no-gpu] [--no-simulator]]\n\nRuns every kernel family through the simulator against its f64 reference and\nprints a row per case. --gpu adds the GPU cases at real shapes (--quick: small and\nragged shapes, for compute-sanitizer; --no-simulator: the GPU cases alone). Exit\nstatus: 0 all passed, 1 a check failed, 2 bad usage, 3 --gpu without a GPU (nothing\nrun; --allow-no-gpu runs the simulator checks and exits 0).",
        "bench" => bench::USAGE,
        "conflicts" => conflicts::USAGE,
        "demo" => "usage: kda demo\n\nThe main job. With a GPU: runs the kernels at real shapes against the f64 reference,\nthen times the GEMM and one prefill case. Without one: says so, compiles every\nshipped variant for every target and runs the simulator checks.",
        _ => return None,
    })
}

/// Runs the tool with `args` (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return 2;
    };
    let rest = &args[1..];
    let asks_help = rest.iter().any(|a| a == "--help" || a == "-h");
    let r = match cmd.as_str() {
        _ if asks_help && command_help(cmd).is_some() => {
            out!("{}", command_help(cmd).unwrap_or(USAGE));
            Ok(0)
        }
        "list" => list::run(rest),
        "emit" => emit::run(rest),
        "check" => check::run(rest),
        "bench" => bench::run(rest),
        "conflicts" => conflicts::run(rest),
        "demo" => demo::run(rest),
        "-h" | "--help" | "help" => {
            out!("{USAGE}");
            Ok(0)
        }
        "-V" | "--version" => {
            out!("kda {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kda: {e}");
            2
        }
    }
}
