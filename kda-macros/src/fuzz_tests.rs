//! Front-end fuzzing: the shipped kernels' sources, mutated token by token (deleted, repeated,
//! swapped, replaced), through the expansion of `#[kernel]` and `#[kernel_fn]`: every mutant
//! that still parses as a function expands or gets a diagnostic at a span, never a panic.

use super::{expand, expand_fn};
use quote::ToTokens;
use syn::ItemFn;

/// The `#[kernel]` and `#[kernel_fn]` functions of the kernel sources, as source text without
/// their attribute, and whether each is a helper.
fn kernel_functions() -> Vec<(String, bool)> {
    let sources = [
        include_str!("../../kda-kernels/src/chunk.rs"),
        include_str!("../../kda-kernels/src/chunk_prep.rs"),
        include_str!("../../kda-kernels/src/decode.rs"),
        include_str!("../../kda-kernels/src/gemm.rs"),
        include_str!("../../kda-kernels/src/selftest.rs"),
    ];
    let mut out = vec![];
    for src in sources {
        let file = syn::parse_file(src).expect("the kernel sources parse");
        for item in file.items {
            let syn::Item::Fn(mut f) = item else { continue };
            let is = |f: &ItemFn, name: &str| {
                f.attrs.iter().any(|a| a.path().segments.last().is_some_and(|s| s.ident == name))
            };
            let helper = is(&f, "kernel_fn");
            if !(helper || is(&f, "kernel")) {
                continue;
            }
            f.attrs.retain(|a| a.path().segments.last().is_none_or(|s| s.ident != "kernel" && s.ident != "kernel_fn"));
            out.push((f.to_token_stream().to_string(), helper));
        }
    }
    out
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn mutated_kernels_expand_or_get_a_diagnostic_never_a_panic() {
    let functions = kernel_functions();
    assert!(functions.len() >= 15, "found {} kernel functions", functions.len());
    let pool = [
        ";", "{", "}", "(", ")", "[", "]", "let", "mut", "for", "in", "if", "else", "parallel", "serial", "copy",
        "gemm", "shared", "fragment", "0", "1", "16", "x", "+", "*", "=", "==", "<", ".", ",", "as", "f32", "i32",
        "return", "&",
    ];
    let mut rng = Lcg(0x5eed);
    let (mut parsed, mut expanded) = (0, 0);
    for round in 0..12_000 {
        let (src, helper) = &functions[round % functions.len()];
        let mut toks: Vec<&str> = src.split_whitespace().collect();
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(toks.len());
            match rng.below(4) {
                0 => {
                    toks.remove(i);
                }
                1 => toks.insert(i, toks[i]),
                2 => {
                    let j = rng.below(toks.len());
                    toks.swap(i, j);
                }
                _ => toks[i] = pool[rng.below(pool.len())],
            }
        }
        let mutant = toks.join(" ");
        let Ok(f) = syn::parse_str::<ItemFn>(&mutant) else { continue };
        parsed += 1;
        let r = std::panic::catch_unwind(|| if *helper { expand_fn(f) } else { expand(f) });
        match r {
            Ok(Ok(_)) => expanded += 1,
            Ok(Err(_)) => {}
            Err(_) => panic!("the macro panicked on round {round}:\n{mutant}"),
        }
    }
    eprintln!("{parsed} mutants parsed, {expanded} expanded, the rest diagnosed");
    assert!(parsed > 500, "{parsed}");
}
