//! The tile IR's text form reads back: for every shipped kernel variant (and the DSL's
//! self-test kernels), parsing what the kernel prints gives the same kernel, source locations
//! aside (the text does not carry them).

use kda_dsl::tile_text::{parse_kernel, without_locs};

#[test]
fn every_shipped_kernel_round_trips_through_its_text() {
    let mut defs: Vec<(String, kda_dsl::tile::KernelDef)> =
        kda_kernels::variants().iter().map(|v| (v.id(), v.build().expect("builds"))).collect();
    for t in kda_kernels::selftest::selftests(4).expect("builds") {
        defs.push((t.name.to_string(), t.def.clone()));
    }
    for (id, def) in defs {
        let text = def.to_string();
        let back = parse_kernel(&text).unwrap_or_else(|e| panic!("{id}: {e}\n{text}"));
        if without_locs(&back) != without_locs(&def) {
            let again = back.to_string();
            let line = text.lines().zip(again.lines()).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "{id}: the kernel read back differs (first differing line {line}):\n{}\n{}",
                text.lines().nth(line).unwrap_or(""),
                again.lines().nth(line).unwrap_or("")
            );
        }
    }
}
