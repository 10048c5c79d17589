//! The `kda` command-line tool: `list`, `emit`, `check`, `bench`, `demo`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(kda::cli::run(&args));
}
