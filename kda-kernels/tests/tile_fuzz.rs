//! Malformed kernels through the compiler's back half: the printed tile IR of shipped kernels,
//! mutated at random (numbers changed, lines deleted, duplicated or swapped, names of
//! variables and tiles exchanged), read back, type-checked and compiled for sm_80 and sm_90a
//! (and the small self-test kernels simulated). Whatever the mutant, the parser, the type check, every pass,
//! the lowering and the simulator give a result or a diagnostic, never a panic.
//! (The macro's own fuzzing, of token streams, is in `kda-macros`.)

use kda_dsl::tile_text::parse_kernel;
use kda_kernels::reference::Rng;

/// Kernels to mutate: one variant of each family and the DSL's self-tests, small enough that
/// hundreds of compiles stay quick.
fn seeds() -> Vec<(String, String)> {
    let mut out = vec![];
    for family in ["gemm", "decode", "chunk", "chunk_prep"] {
        let v = kda_kernels::variants().into_iter().find(|v| v.family == family && v.default).expect("a default");
        out.push((v.id(), v.build().expect("builds").to_string()));
    }
    // The sm_90a GEMM, whose gemm takes wgmma.
    let hopper = kda_kernels::hopper_gemm_variant(kda_kernels::hopper_gemm_configs().remove(0));
    out.push((hopper.id(), hopper.build().expect("builds").to_string()));
    for t in kda_kernels::selftest::selftests(4).expect("builds") {
        out.push((t.name.to_string(), t.def.to_string()));
    }
    out
}

const NUMBERS: [&str; 12] = ["0", "1", "2", "3", "7", "16", "17", "128", "4096", "-1", "65536", "2147483647"];

/// The `name#id` variable references and the tile names of a kernel's text.
fn names(text: &str) -> (Vec<String>, Vec<String>) {
    let mut vars = vec![];
    let mut tiles = vec![];
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '#')) {
        if word.contains('#') && !vars.iter().any(|v| v == word) {
            vars.push(word.to_string());
        }
    }
    for line in text.lines() {
        if let Some((name, rest)) = line.trim().split_once(" = ") {
            if (rest.starts_with("Shared<") || rest.starts_with("Fragment<") || rest.starts_with("Local<"))
                && !tiles.iter().any(|t| t == name)
            {
                tiles.push(name.to_string());
            }
        }
    }
    (vars, tiles)
}

/// One random mutation of `text`, described.
fn mutate(text: &str, x: &mut Rng) -> (String, String) {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let pick = |x: &mut Rng, n: usize| (x.next_u64() % n.max(1) as u64) as usize;
    // Body lines: after the kernel's header line.
    let first = 1.min(lines.len());
    let line = first + pick(x, lines.len() - first);
    let (vars, tiles) = names(text);
    let what = match pick(x, 6) {
        0 => {
            // A number in the line becomes another.
            let words: Vec<(usize, &str)> =
                lines[line].match_indices(|c: char| c.is_ascii_digit()).map(|(i, _)| (i, &lines[line][i..])).collect();
            if words.is_empty() {
                return (text.to_string(), "no number".into());
            }
            let (at, rest) = words[pick(x, words.len())];
            let len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            let new = NUMBERS[pick(x, NUMBERS.len())];
            let old = lines[line].clone();
            lines[line] = format!("{}{new}{}", &old[..at], &old[at + len..]);
            format!("line {line}: a number became {new}")
        }
        1 => {
            lines.remove(line);
            format!("line {line} deleted")
        }
        2 => {
            let copy = lines[line].clone();
            lines.insert(line, copy);
            format!("line {line} duplicated")
        }
        3 => {
            let other = first + pick(x, lines.len() - first);
            lines.swap(line, other);
            format!("lines {line} and {other} swapped")
        }
        4 if vars.len() > 1 => {
            let (a, b) = (&vars[pick(x, vars.len())], &vars[pick(x, vars.len())]);
            lines[line] = lines[line].replace(a.as_str(), b);
            format!("line {line}: {a} became {b}")
        }
        _ if tiles.len() > 1 => {
            let (a, b) = (&tiles[pick(x, tiles.len())], &tiles[pick(x, tiles.len())]);
            let old = lines[line].clone();
            lines[line] = old
                .split(' ')
                .map(|w| {
                    if w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_') == a {
                        w.replace(a.as_str(), b)
                    } else {
                        w.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
            format!("line {line}: tile {a} became {b}")
        }
        _ => return (text.to_string(), "nothing to exchange".into()),
    };
    (lines.join("\n"), what)
}

/// Arguments for simulating `def`: every extent 64, every tensor zeros of its size, every
/// scalar 1.
fn zero_args(def: &kda_dsl::tile::KernelDef) -> Vec<(String, kda_dsl::sim::SimArg)> {
    use kda_dsl::sim::SimArg;
    use kda_dsl::tile::Param;
    const EXTENT: usize = 64;
    def.params
        .iter()
        .map(|p| {
            let arg = match p {
                Param::Dim { .. } => SimArg::I32(EXTENT as i32),
                Param::Tensor { dtype, dims, .. } => {
                    SimArg::Tensor(vec![0; EXTENT.pow(dims.len() as u32) * dtype.size_bytes()])
                }
                Param::Scalar { dtype, .. } => match dtype {
                    kda_dsl::DType::F32 => SimArg::F32(1.0),
                    kda_dsl::DType::I64 => SimArg::I64(1),
                    _ => SimArg::I32(1),
                },
            };
            (p.name().to_string(), arg)
        })
        .collect()
}

#[test]
fn mutated_kernels_compile_or_give_a_diagnostic_never_a_panic() {
    let mut x = Rng::new(0xf022);
    let (mut parsed, mut compiled, mut total) = (0, 0, 0);
    let (mut simulated, mut sim_ok) = (0, 0);
    let seeds = seeds();
    // Every mutant's panic is reported, not only the first.
    let mut panics = vec![];
    for (id, text) in &seeds {
        for round in 0..500 {
            // One to three mutations at once.
            let (mut mutant, mut what) = (text.clone(), vec![]);
            for _ in 0..1 + (x.next_u64() % 3) {
                let (m, w) = mutate(&mutant, &mut x);
                mutant = m;
                what.push(w);
            }
            total += 1;
            let outcome = std::panic::catch_unwind(|| {
                let Ok(mut def) = parse_kernel(&mutant) else { return (false, false, None) };
                // What the builder does before handing a kernel to the compiler.
                if kda_dsl::passes::check_types::check_types(&mut def).is_err() {
                    return (true, false, None);
                }
                let small = id.starts_with("dsl/");
                let compiled = kda_dsl::compile(def.clone(), kda_dsl::Target::Sm80).is_ok();
                // And for sm_90a, where gemms may take wgmma: a result or a diagnostic too.
                let _ = kda_dsl::compile(def.clone(), kda_dsl::Target::Sm90a);
                // The simulator too (the self-tests are small enough): a report or an error.
                let ran = (compiled && small).then(|| kda_kernels::check::simulate(&def, &mut zero_args(&def)).is_ok());
                (true, compiled, ran)
            });
            match outcome {
                Ok((p, c, ran)) => {
                    parsed += usize::from(p);
                    compiled += usize::from(c);
                    simulated += usize::from(ran.is_some());
                    sim_ok += usize::from(ran == Some(true));
                }
                Err(_) => panics.push(format!("{id} round {round} ({}):\n{mutant}", what.join("; "))),
            }
        }
    }
    eprintln!(
        "{total} mutants: {parsed} parsed, {compiled} compiled, {simulated} simulated ({sim_ok} without an error)"
    );
    assert!(panics.is_empty(), "{} mutants panicked:\n\n{}", panics.len(), panics.join("\n\n"));
    // Both outcomes are exercised: mutants the compiler accepts and mutants it refuses.
    assert!(parsed > total / 4 && compiled > 0 && compiled < parsed, "{parsed} parsed, {compiled} compiled of {total}");
    assert!(sim_ok > 0 && sim_ok < simulated, "{simulated} simulated, {sim_ok} without an error");
}
