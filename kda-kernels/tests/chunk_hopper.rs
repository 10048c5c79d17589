//! The prefill's fused kernel on sm_90a, as the assembler sees it: its state products on
//! `wgmma` with the state as the register A operand, the state never in shared memory, and
//! what ptxas and cuobjdump make of it.

use std::collections::HashSet;

use kda_dsl::Target;

#[path = "../../kda-dsl/tests/support/assemble.rs"]
mod assemble;

/// The default sm_90a chunk variant's PTX (what `kda emit chunk --target sm_90a` prints).
fn hopper_ptx() -> String {
    let cfg = kda_kernels::hopper_chunk_configs().remove(0);
    assert_eq!(cfg.shape, kda_kernels::chunk::ChunkShape::HOPPER);
    kda_dsl::compile(kda_kernels::chunk::chunk(&cfg).expect("builds"), Target::Sm90a).expect("compiles").ptx
}

/// The registers between the first `{` and `}` of a PTX instruction.
fn braced(line: &str) -> Vec<String> {
    let (Some(a), Some(b)) = (line.find('{'), line.find('}')) else { return vec![] };
    line[a + 1..b].split(',').map(|r| r.trim().to_string()).collect()
}

/// The registers an instruction reads (its operands after the destination).
fn sources(line: &str) -> Vec<String> {
    let ops = line.split_once(char::is_whitespace).map_or("", |(_, rest)| rest);
    ops.split(|c: char| !(c.is_ascii_alphanumeric() || c == '%' || c == '_'))
        .filter(|t| t.starts_with('%'))
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// The state's update is one `wgmma` m64n128k16 per warpgroup whose accumulator is the state
/// (128 value rows over two warpgroups, 64 f32 registers a thread); the state feeds the other
/// state products as their register A operand (`W = S kdᵀ` and the output's `S qdᵀ`, m64n16k16
/// over K = 128, packed to 16-bit pairs in registers); and no `st.shared` stores the state or
/// anything moved or converted from it: the state never reaches shared memory.
#[test]
fn the_state_is_a_wgmma_accumulator_and_never_reaches_shared_memory() {
    let ptx = hopper_ptx();
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let update: Vec<&&str> =
        lines.iter().filter(|l| l.starts_with("wgmma.mma_async") && l.contains("m64n128k16")).collect();
    assert_eq!(update.len(), 1, "one state update per chunk");
    let state: HashSet<String> = braced(update[0]).into_iter().collect();
    assert_eq!(state.len(), 64, "64 accumulator registers a thread");
    // Everything moved or converted from the state, transitively.
    let mut derived = state.clone();
    loop {
        let before = derived.len();
        for l in lines.iter().filter(|l| l.starts_with("mov.") || l.starts_with("cvt.")) {
            let dst = l.split_whitespace().nth(1).map(|d| d.trim_end_matches(',').to_string());
            if let Some(d) = dst.filter(|_| sources(l).iter().any(|r| derived.contains(r))) {
                derived.insert(d);
            }
        }
        if derived.len() == before {
            break;
        }
    }
    // The state's 16-bit pairs are the A operands of the products over K = 128.
    let from_registers: Vec<&&str> =
        lines.iter().filter(|l| l.starts_with("wgmma.mma_async") && l.contains("m64n16k16")).collect();
    let packed_state = from_registers
        .iter()
        .filter(|l| l.matches('{').count() == 2)
        .filter(|l| {
            let second = &l[l.find('}').expect("an accumulator") + 1..];
            braced(second).iter().all(|r| derived.contains(r))
        })
        .count();
    assert_eq!(packed_state, 16, "W = S kdᵀ and S qdᵀ: 8 K-steps each with the state as A");
    let stored: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("st.shared"))
        .filter(|l| sources(l).iter().any(|r| derived.contains(r)))
        .collect();
    assert!(stored.is_empty(), "the state reaches shared memory: {stored:?}");
}

/// ptxas assembles every shipped sm_90a chunk kernel without spills, without serializing its
/// `wgmma`s (C7512, C7515) and without waits of its own between them (C7517); its SASS has the Hopper `HGMMA`s of the state products (64 x 16
/// and the 64 x 128 update) and no sm_80 `HMMA`: the lower-bound gate's key products (16 x 16,
/// every warp's own copy) take `wgmma` too, their A loaded by `ldmatrix`. ptxas from
/// `KDA_PTXAS`, cuobjdump from `KDA_CUOBJDUMP` (`.ci/run` sets both); skipped with a line saying
/// so without them, failed when `KDA_REQUIRE_PTXAS` is set.
#[test]
fn the_hopper_chunk_kernels_assemble_to_hgmma_alone() {
    let Some((ptxas, cuobjdump)) = assemble::tools_or_skip("the sm_90a chunk kernels") else { return };
    for (i, cfg) in kda_kernels::hopper_chunk_configs().into_iter().enumerate() {
        let (key, sass) = assembled_without_spills(&ptxas, &cuobjdump, &cfg, &format!("hopper_chunk_{i}"));
        for op in ["HGMMA.64x16x16.F32", "HGMMA.64x128x16.F32"] {
            assert!(sass.contains(op), "{key}: no {op} in the SASS");
        }
        assert!(!sass.contains(" HMMA"), "{key}: an sm_80 HMMA in the SASS");
    }
}

/// The sweep's `4x2w32ihm` (the sm_90a kernel at the sm_80 default's 4 warps of 32 rows, its
/// products of 16 columns on `mma.sync`, `NarrowProducts::MmaSync`): every shipped sm_90a
/// config assembles without spills or serialized `wgmma`s, the state's update on `HGMMA`
/// 64 x 128 and the rest on `HMMA`. With every product on `wgmma` that shape spills in one
/// (docs/performance.md), which this option is there to avoid.
#[test]
fn narrow_products_on_mma_sync_fit_four_warps_of_32_rows() {
    use kda_kernels::chunk::{ChunkShape, NarrowProducts};
    let Some((ptxas, cuobjdump)) = assemble::tools_or_skip("the sm_90a chunk kernels at 4 warps") else { return };
    let shape = ChunkShape {
        rows_per_warp: 32,
        fills_in_flight: true,
        narrow_products: NarrowProducts::MmaSync,
        ..ChunkShape::plain(4, 2, 2)
    };
    for (i, cfg) in kda_kernels::hopper_chunk_configs().into_iter().enumerate() {
        let cfg = kda_kernels::chunk::ChunkConfig { shape, ..cfg };
        let (key, sass) = assembled_without_spills(&ptxas, &cuobjdump, &cfg, &format!("hopper_chunk_nm_{i}"));
        assert!(sass.contains("HGMMA.64x128x16.F32"), "{key}: the update is not on HGMMA");
        assert!(!sass.contains("HGMMA.64x16x16"), "{key}: a product of 16 columns on HGMMA");
        assert!(sass.contains(" HMMA"), "{key}: no HMMA in the SASS");
    }
}

/// `cfg`'s chunk kernel compiled for sm_90a and assembled by ptxas (as `name`), checked for no
/// spills and no serialized or waited-on `wgmma`s (C7512, C7515, C7517): its key and SASS.
fn assembled_without_spills(
    ptxas: &std::ffi::OsStr,
    cuobjdump: &std::ffi::OsStr,
    cfg: &kda_kernels::chunk::ChunkConfig,
    name: &str,
) -> (String, String) {
    let ptx = kda_dsl::compile(kda_kernels::chunk::chunk(cfg).expect("builds"), Target::Sm90a).expect("compiles").ptx;
    let done = assemble::assemble(ptxas, Some(cuobjdump), "sm_90a", name, &ptx).unwrap_or_else(|e| panic!("{e}"));
    let (key, log) = (cfg.key(), done.log);
    assert!(log.contains(" 0 bytes spill stores, 0 bytes spill loads"), "{key}: {log}");
    assert!(["C7512", "C7515", "C7517"].iter().all(|c| !log.contains(c)), "{key}: {log}");
    (key, done.sass.expect("a cuobjdump was given"))
}

/// The lines of the loop of `ptx` that holds the most `bar.sync`s: from its label to the
/// branch back to it.
fn busiest_loop(ptx: &str) -> Vec<&str> {
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let label_at = |label: &str| lines.iter().position(|l| *l == format!("{label}:"));
    let loops = lines.iter().enumerate().filter_map(|(end, l)| {
        let label = l.strip_prefix("bra ").or_else(|| l.split_once(" bra ").map(|(_, b)| b))?.trim_end_matches(';');
        label_at(label).filter(|top| *top < end).map(|top| &lines[top..=end])
    });
    let barriers = |body: &&[&str]| body.iter().filter(|l| l.starts_with("bar.sync")).count();
    loops.max_by_key(barriers).expect("a loop").to_vec()
}

/// The fused kernels' chunk step (sm_90a alone on its SM, and sm_80's default at 4 warps of 32
/// rows) waits for its chunk's loads once, at the top of the step, and its other barriers leave
/// the next chunk's loads (issued just after) in flight (`ChunkShape::fills_in_flight`); without
/// it the step waits for them at every barrier.
#[test]
fn the_fused_step_leaves_the_next_chunks_loads_in_flight() {
    let waits = |ptx: &str| busiest_loop(ptx).iter().filter(|l| l.starts_with("cp.async.wait_group")).count();
    let ptx = hopper_ptx();
    let barriers = busiest_loop(&ptx).iter().filter(|l| l.starts_with("bar.sync")).count();
    assert!(barriers > 2, "{barriers} barriers in the step");
    assert_eq!(waits(&ptx), 1);
    let sm80 = |cfg: &kda_kernels::chunk::ChunkConfig| {
        kda_dsl::compile(kda_kernels::chunk::chunk(cfg).expect("builds"), Target::Sm80).expect("compiles").ptx
    };
    let fused = kda_kernels::chunk::ChunkConfig::default();
    assert!(fused.shape.fills_in_flight);
    assert_eq!(waits(&sm80(&fused)), 1);
    let waiting = kda_kernels::chunk::ChunkShape { fills_in_flight: false, ..fused.shape };
    let plain = kda_kernels::chunk::ChunkConfig { shape: waiting, ..fused };
    assert!(waits(&sm80(&plain)) > 2, "without fills_in_flight the step waits at its barriers");
}
