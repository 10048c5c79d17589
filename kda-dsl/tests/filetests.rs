//! Filetests: each `filetests/*.tile` file holds a kernel in the tile IR's text form, the stage
//! to run it to and the expected output, in that order (Cranelift's filetests are the model):
//!
//! ```text
//! ; What the test shows, in comment lines.
//! ; run: insert_barriers
//! kernel k(...) threads=64 grid=[1, 1, 1] {
//!   ...
//! }
//! ; expect:
//! ; the program after the stage, or `error: ...`, each line behind `; `
//! ```
//!
//! The kernel is type-checked first (its error is the output). A stage is a tile pass (`infer_layouts`, `fuse_reductions`, `insert_barriers`, `drop_dead_tiles`,
//! `plan_pipelines`, `plan_tma_stores`, `allocate_shared`: the pipeline runs up to and including it, and the program is printed),
//! `copy_plans`, `gemm_plans` and `matrix_access_plans` (the lowering's plan for every copy,
//! `gemm`, or shared tile access at a `parallel`'s index) or `ptx` (the whole compile). A `; target: sm_90a` line picks the target every stage chooses instructions
//! for (default sm_80).
//! `KDA_BLESS=1 cargo test -p kda-dsl --test filetests` rewrites the expected outputs
//! (`scripts/bless` does it with the other snapshots).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kda_dsl::passes::{
    allocate_shared::allocate_shared, check_types::check_types, drop_dead_tiles::drop_dead_tiles,
    fuse_reductions::fuse_reductions, infer_layouts::infer_layouts, insert_barriers::insert_barriers,
    place_producers::place_producers, plan_pipelines::plan_pipelines, plan_tma_stores::plan_tma_stores, TileProgram,
};
use kda_dsl::tile::KernelDef;
use kda_dsl::tile_text::parse_kernel;

/// What a filetest runs its kernel to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The tile passes in order, up to and including this many (1 to 6).
    TilePasses(usize),
    /// The lowering's plan for every copy.
    CopyPlans,
    /// The lowering's plan for every `gemm`.
    GemmPlans,
    /// The lowering's plan for every shared tile access at a `parallel`'s own index.
    MatrixAccessPlans,
    /// The whole compile, printed as PTX.
    Ptx,
}

/// The tile passes in pipeline order.
const PASSES: [&str; 8] = [
    "place_producers",
    "infer_layouts",
    "fuse_reductions",
    "insert_barriers",
    "drop_dead_tiles",
    "plan_pipelines",
    "plan_tma_stores",
    "allocate_shared",
];

impl Stage {
    fn parse(name: &str) -> Result<Stage, String> {
        match name {
            "copy_plans" => Ok(Stage::CopyPlans),
            "gemm_plans" => Ok(Stage::GemmPlans),
            "matrix_access_plans" => Ok(Stage::MatrixAccessPlans),
            "ptx" => Ok(Stage::Ptx),
            _ => PASSES.iter().position(|p| *p == name).map(|i| Stage::TilePasses(i + 1)).ok_or_else(|| {
                format!(
                    "unknown stage `{name}` (a tile pass, `copy_plans`, `gemm_plans`, `matrix_access_plans` or `ptx`)"
                )
            }),
        }
    }
}

/// One filetest, split into its parts.
struct FileTest {
    /// The comment lines before the kernel, `; run:` included, as written.
    header: Vec<String>,
    stage: Stage,
    /// The target (`; target:`, default sm_80).
    target: kda_dsl::Target,
    kernel: String,
    expected: String,
}

fn split(text: &str) -> Result<FileTest, String> {
    let mut lines = text.lines();
    let mut header = vec![];
    let mut stage = None;
    let mut target = kda_dsl::Target::Sm80;
    let mut kernel = String::new();
    for line in lines.by_ref() {
        if !line.starts_with(';') {
            kernel.push_str(line);
            kernel.push('\n');
            break;
        }
        if let Some(name) = line.strip_prefix("; run:") {
            stage = Some(Stage::parse(name.trim())?);
        }
        if let Some(name) = line.strip_prefix("; target:") {
            target = kda_dsl::Target::parse(name.trim()).ok_or_else(|| format!("unknown target `{}`", name.trim()))?;
        }
        header.push(line.to_string());
    }
    let stage = stage.ok_or("no `; run:` line before the kernel")?;
    let mut found_expect = false;
    for line in lines.by_ref() {
        if line.trim_end() == "; expect:" {
            found_expect = true;
            break;
        }
        kernel.push_str(line);
        kernel.push('\n');
    }
    if !found_expect {
        return Err("no `; expect:` line after the kernel".into());
    }
    let mut expected = String::new();
    for line in lines {
        let body = line
            .strip_prefix("; ")
            .or_else(|| line.strip_prefix(';'))
            .ok_or_else(|| format!("expected output lines start with `;`, found `{line}`"))?;
        expected.push_str(body);
        expected.push('\n');
    }
    Ok(FileTest { header, stage, target, kernel, expected })
}

/// A tile pass, as `run_tile_passes` runs them.
type TilePass = fn(&mut TileProgram) -> Result<(), kda_dsl::Diag>;

/// The tile passes up to `n` over a type-checked kernel.
fn tile_passes(def: KernelDef, target: kda_dsl::Target, n: usize) -> Result<TileProgram, kda_dsl::Diag> {
    let mut p = TileProgram::new(def, target);
    let passes: [TilePass; 8] = [
        place_producers,
        infer_layouts,
        fuse_reductions,
        insert_barriers,
        drop_dead_tiles,
        plan_pipelines,
        plan_tma_stores,
        allocate_shared,
    ];
    for pass in &passes[..n] {
        pass(&mut p)?;
    }
    Ok(p)
}

/// What running `test` prints.
fn run(test: &FileTest) -> Result<String, String> {
    let mut def = parse_kernel(&test.kernel).map_err(|e| format!("the kernel does not parse: {e}"))?;
    if let Err(diag) = check_types(&mut def) {
        return Ok(format!("error: {}\n", diag.message));
    }
    let out = match test.stage {
        Stage::TilePasses(n) => tile_passes(def, test.target, n).map(|p| p.to_string()),
        // The text has no source locations: plans are numbered in the order lowered.
        Stage::CopyPlans => kda_dsl::lower::plans(def, test.target).map(|plans| {
            let mut s = String::new();
            for (i, plan) in plans.copies.iter().enumerate() {
                write!(s, "copy {i}: {:?}", plan.kind).expect("writes to a string");
                if let Some(why) = &plan.slower_because {
                    write!(s, " (not faster: {why})").expect("writes to a string");
                }
                s.push('\n');
            }
            s
        }),
        Stage::GemmPlans => kda_dsl::lower::plans(def, test.target).map(|plans| {
            let mut s = String::new();
            for (i, plan) in plans.gemms.iter().enumerate() {
                writeln!(s, "gemm {i}: {plan}").expect("writes to a string");
            }
            s
        }),
        Stage::MatrixAccessPlans => kda_dsl::lower::plans(def, test.target).map(|plans| {
            let mut s = String::new();
            for (i, plan) in plans.matrix_accesses.iter().enumerate() {
                writeln!(s, "access {i}: {plan}").expect("writes to a string");
            }
            s
        }),
        Stage::Ptx => kda_dsl::compile(def, test.target).map(|k| k.ptx),
    };
    Ok(match out {
        Ok(text) => text,
        Err(diag) => format!("error: {}\n", diag.message),
    })
}

/// `test` with `actual` as its expected output.
fn blessed(test: &FileTest, actual: &str) -> String {
    let mut s = String::new();
    for line in &test.header {
        writeln!(s, "{line}").expect("writes to a string");
    }
    s.push_str(&test.kernel);
    s.push_str("; expect:\n");
    for line in actual.lines() {
        if line.is_empty() {
            s.push_str(";\n");
        } else {
            writeln!(s, "; {line}").expect("writes to a string");
        }
    }
    s
}

fn filetests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "tile"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_filetest_prints_its_expected_output() {
    let bless = std::env::var("KDA_BLESS").is_ok_and(|v| v == "1");
    let files = filetests();
    assert!(files.len() >= 10, "at least ten filetests, found {}", files.len());
    let mut failures = vec![];
    for path in &files {
        let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let test = match split(&text) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let actual = match run(&test) {
            Ok(a) => a,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        if actual == test.expected {
            continue;
        }
        if bless {
            std::fs::write(path, blessed(&test, &actual)).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else {
            failures.push(format!("{name}: the output differs\n--- expected\n{}--- actual\n{actual}", test.expected));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed (KDA_BLESS=1 rewrites the expected outputs; read the diff):\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

#[test]
fn a_test_without_its_parts_is_an_error() {
    assert!(split("kernel k() threads=32 grid=[1, 1, 1] {\n}\n; expect:\n").is_err());
    assert!(split("; run: insert_barriers\nkernel k() threads=32 grid=[1, 1, 1] {\n}\n").is_err());
    assert!(split("; run: no_such_pass\nkernel k() {\n}\n; expect:\n").is_err());
    assert!(split("; run: ptx\nkernel k() {\n}\n; expect:\nnot a comment\n").is_err());
}
