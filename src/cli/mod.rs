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
mod decode_gpu;
mod demo;
mod emit;
pub mod gpu_checks;
mod list;

const USAGE: &str = "usage: kda <command>
  list                                   kernels and their shipped configs
  emit NAME [CONFIG] [--target sm_80|sm_90]
                                         PTX of a variant on stdout (default config when omitted)
  check [--gpu [--quick]]                every kernel family through the simulator against its
                                         reference (with --gpu: on the GPU too; --quick: small
                                         shapes); exit 1 on failure
  bench [--json FILE] [--case NAME]      GPU timings (and JSON lines), the cases whose name
                                         contains NAME; --sweep-gemm, --sweep-decode and
                                         --sweep-chunk time launch shapes
  demo                                   the main job: run and check the kernels on the GPU, or
                                         without one, compile everything and run `check`";

/// Runs the tool with `args` (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return 2;
    };
    let rest = &args[1..];
    let r = match cmd.as_str() {
        "list" => list::run(rest),
        "emit" => emit::run(rest),
        "check" => check::run(rest),
        "bench" => bench::run(rest),
        "demo" => demo::run(rest),
        "-h" | "--help" | "help" => {
            out!("{USAGE}");
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
