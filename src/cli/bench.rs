//! `kda bench [--json FILE] [--case NAME]`: GPU timings, printed as a table and written as JSON
//! lines; with `--case`, only the cases whose name contains NAME.

use super::chunk_gpu::WorkspaceSource;
use kda_dsl::DType;
use kda_dsl::Target;
use kda_kernels::decode::MAX_ITEMS;
use kda_kernels::reference::Rng;
use kda_runtime::gemm::gemm_on;
use kda_runtime::{gpu_available, median, time_ms, DeviceTensor, Gpu, Kernels};
use std::io::Write;

/// A `--sweep-chunk` shape's grammar, for the usage and the parser's errors alike.
macro_rules! chunk_shape_grammar {
    () => {
        "WARPSxMIN_BLOCKS[xSTAGES][wROWS][fFILL[gREGS]][sTOKENS][p[BLOCKS][rRANGES]][i][b][h][m][e|u|n][c][k][o][a|q]"
    };
}

pub(crate) const USAGE: &str = concat!(
    "usage: kda bench [--json FILE] [--case NAME] | --sweep-gemm [--case NAME] | --sweep-decode [ROWSxWARPSxMIN_BLOCKSxSTAGES[xITEMS[xLANES]] ...] [--case NAME] | --sweep-chunk [",
    chunk_shape_grammar!(),
    "|default ...] [--case NAME]"
);

pub fn run(args: &[String]) -> Result<i32, String> {
    let (mut json, mut filter) = (None, String::new());
    match args {
        [flag] if flag == "--sweep-gemm" => return sweep_gemm(""),
        [flag, case, name] if flag == "--sweep-gemm" && case == "--case" => return sweep_gemm(name),
        [flag, rest @ ..] if flag == "--sweep-decode" => return sweep_decode(rest),
        [flag, rest @ ..] if flag == "--sweep-chunk" => return sweep_chunk(rest),
        _ => {
            let mut it = args.iter();
            while let Some(a) = it.next() {
                let value = it.next().ok_or(USAGE)?;
                match a.as_str() {
                    "--json" if json.is_none() => json = Some(value.clone()),
                    "--case" => filter = value.clone(),
                    _ => return Err(USAGE.into()),
                }
            }
        }
    }
    if !gpu_available() {
        out!("bench needs a GPU: no CUDA driver (libcuda) or no device on this machine");
        return Ok(1);
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    let mut lines = vec![];
    out!("{:<36} {:>10} {:>10}   ({})", "case", "ms", "TFLOP/s", device_line(&gpu));
    // The device's GEMM (sm_90a's on an H100 or H200), and there the sm_80 one too (`_sm80`).
    let device_target = gpu.limits().target().map_err(|e| e.to_string())?;
    let targets: Vec<Target> =
        if device_target == Target::Sm80 { vec![Target::Sm80] } else { vec![device_target, Target::Sm80] };
    let shapes = [(8192usize, 8192usize, 8192usize, true), (8192, 8192, 8192, false), (4096, 4096, 4096, true)];
    for ((m, n, k, bt), target) in shapes.into_iter().flat_map(|s| targets.iter().map(move |t| (s, *t))) {
        let suffix =
            if target == device_target { String::new() } else { format!("_{}", target.name().replace('_', "")) };
        let case = format!("gemm_bf16_{}_m{m}_n{n}_k{k}{suffix}", if bt { "abt" } else { "ab" });
        if !case.contains(&filter) {
            continue;
        }
        let GemmTiming { ms, first_call_s } = time_gemm(&gpu, &kernels, m, n, k, bt, target)?;
        let tflops = 2.0 * (m * n * k) as f64 / (ms as f64 * 1e-3) / 1e12;
        out!("{case:<36} {ms:>10.4} {tflops:>10.1}   first call {first_call_s:.2} s");
        lines.push(format!("{{\"case\": \"{case}\", \"impl\": \"kda\", \"ms\": {ms:.6}, \"tflops\": {tflops:.2}, \"first_call_s\": {first_call_s:.4}}}"));
    }
    let mut host_rows = vec![];
    for (case, b, t, state, spec) in DECODE_CASES.iter().filter(|c| c.0.contains(&filter)) {
        let (ms, gbps, host_us) =
            time_decode(&gpu, &kernels, *b, *t, *state, *spec).map_err(|e| format!("{case}: {e}"))?;
        out!("{case:<36} {ms:>10.4} {:>10}   {gbps:.0} GB/s", "-");
        lines.push(format!("{{\"case\": \"{case}\", \"impl\": \"kda\", \"ms\": {ms:.6}, \"gbps\": {gbps:.1}, \"method\": \"cuda graph replay, mean of 100\"}}"));
        if *case == "decode_b32_h32" {
            host_rows.push((format!("host_eager_{case}"), host_us));
        }
    }
    // Each row as the README calls it (no workspace argument: the one kda keeps), and the B = 1
    // row again over a caller's workspace, to show the two are the same path.
    let prefill_runs = super::chunk_gpu::prefill_cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
        .flat_map(|c| {
            let caller = (c.name == "prefill_b1_t32768_h32").then(|| (c.clone(), WorkspaceSource::Caller));
            [Some((c, WorkspaceSource::Kept)), caller].into_iter().flatten()
        })
        .collect::<Vec<_>>();
    for (c, workspace) in prefill_runs {
        let r = super::chunk_gpu::time_prefill(&gpu, &kernels, &c, None, workspace, super::chunk_gpu::ResultBits::Skip)
            .map_err(|e| format!("{}: {e}", c.name))?;
        let name = match workspace {
            WorkspaceSource::Kept => c.name.to_string(),
            WorkspaceSource::Caller => format!("{}_caller_workspace", c.name),
        };
        let mtok = r.tokens as f64 / r.ms as f64 / 1e3;
        let floor = r.min_bytes as f64 / (r.ms as f64 * 1e-3) / 4.25e12 * 100.0;
        // The path this device took, as `--sweep-chunk` names it.
        let took = chunk_shape_name(&r.tuning).unwrap_or_else(|| "-".into());
        out!(
            "{:<36} {:>10.4} {:>10}   {mtok:.1} Mtok/s, {floor:.0}% of the byte floor, first call {:.2} s, took {took}",
            name,
            r.ms,
            "-",
            r.first_call_s
        );
        lines.push(format!(
            "{{\"case\": \"{}\", \"impl\": \"kda\", \"ms\": {:.6}, \"first_call_s\": {:.4}, \"mtok_per_s\": {mtok:.3}, \"min_bytes\": {}, \"tuning\": \"{took}\", \"method\": \"cuda events, median of 20\"}}",
            name, r.ms, r.first_call_s, r.min_bytes
        ));
        if name == "prefill_b8_t4096_h32" || name == "prefill_b1_t32768_h32" {
            host_rows.push((format!("host_eager_{name}"), r.host_us));
        }
    }
    // The host's part of one eager call: planning, lookups, binding and the launch.
    for (case, us) in host_rows {
        out!("{case:<36} {:>10.4} {:>10}   {us:.2} us of host time per eager call", "-", "-");
        // `ms` too, as every row of the bench format has one (compare.py reads it): here the
        // host's time, not the GPU's.
        let ms = us / 1e3;
        lines.push(format!("{{\"case\": \"{case}\", \"impl\": \"kda\", \"ms\": {ms:.6}, \"host_us\": {us:.3}, \"method\": \"host wall time of 16 eager calls on an idle stream, median of 20\"}}"));
    }
    if let Some(path) = json {
        let mut f = std::fs::File::create(&path).map_err(|e| format!("{path}: {e}"))?;
        for l in &lines {
            writeln!(f, "{l}").map_err(|e| format!("{path}: {e}"))?;
        }
    }
    Ok(0)
}

/// A sweep's arguments: its shapes, and the `--case NAME` filter (empty: every case).
fn split_case_filter(args: &[String]) -> Result<(Vec<&String>, String), String> {
    let (mut shapes, mut filter) = (vec![], String::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--case" {
            filter = it.next().ok_or(USAGE)?.clone();
        } else {
            shapes.push(a);
        }
    }
    Ok((shapes, filter))
}

/// Times the prefill cases at each chunk launch shape
/// (`WARPSxMIN_BLOCKS[xSTAGES][wROWS][fFILL[gREGS]][sTOKENS][p[BLOCKS][rRANGES]][i][b][h][m][e|u|n][c][k][o][a|q]`: `x`
/// the pipeline's depth in chunks (the path's default without it), `w` the value rows each warp
/// holds (16 without it), `f` that many fill warps issuing the pipeline's fills (`g` the
/// registers they keep on sm_90a, the rest going to the compute warps), `s` the exact
/// split into segments of that many tokens, `p` the two-kernel path with that many preparation
/// blocks per chain, `r` that path in token ranges, `i` the step's barriers leaving the next
/// chunks' loads in flight, `b` bf16 operands for the state's products (f16 without it), `h`
/// the fused kernel compiled for sm_90a (`wgmma`; compute capability 9.0), `m` its products of
/// 16 columns on `mma.sync` (`NarrowProducts::MmaSync`), `e`, `u` or `n` the
/// loop-invariant values hoisted (every one, the block-uniform ones, none; without one, by
/// `ChunkShape::hoist`'s rule for a shape without an override, so the default chain over a
/// prepared workspace is `2x4x4f1pe`), `c` the gates summed
/// through shared memory (`GateScan::Shared`), `k` the key products split over the warps
/// (`KeyProducts::Split`), `o` the two-kernel path's chain on SMs of its own, `a` or `q` the
/// step's output rows after the state's update or before it (`StepOrder`; without either, the
/// path's own); 4x2w32ik (the default), 4x2w32i, 4x2w32iek, 8x2, 8x1ih, 4x2w32ihmk,
/// 4x2w32ihk (every state product on `wgmma`) and 4x2w32ihmn when none is given), over the five
/// bench cases and one with few heads ([`super::chunk_gpu::sweep_prefill_cases`]), optionally
/// only the cases whose name contains `--case NAME`: how the default was chosen. `default` is
/// the path `chunk_kda` picks for each case on this device (the split's where it splits), and
/// its row ends with that tuning's shape name. Each row says whether its bits are those of the
/// case's first unsplit row, `default` included.
fn sweep_chunk(args: &[String]) -> Result<i32, String> {
    let (shape_args, filter) = split_case_filter(args)?;
    let mut shapes = vec![];
    // The fused kernel's shapes when none is given.
    let defaults =
        ["4x2w32ik", "4x2w32i", "4x2w32iek", "8x2", "8x1ih", "4x2w32ihmk", "4x2w32ihk", "4x2w32ihmn"].map(String::from);
    let names = if shape_args.is_empty() { defaults.iter().collect() } else { shape_args };
    for a in names {
        shapes.push((a.clone(), if a == "default" { None } else { Some(parse_chunk_shape(a)?) }));
    }
    if !gpu_available() {
        out!("bench needs a GPU: no CUDA driver (libcuda) or no device on this machine");
        return Ok(1);
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    out!("({})", device_line(&gpu));
    for c in super::chunk_gpu::sweep_prefill_cases().iter().filter(|c| c.name.contains(&filter)) {
        let mut first = None;
        for (name, tune) in &shapes {
            let hashed = super::chunk_gpu::ResultBits::Hash;
            match super::chunk_gpu::time_prefill(&gpu, &kernels, c, *tune, WorkspaceSource::Caller, hashed) {
                Ok(r) => {
                    let unsplit = r.tuning.split.is_none();
                    let verdict = bits_verdict(&mut first, name, r.bits.unwrap_or_default(), unsplit);
                    // The runtime's own choice, named as a shape would be.
                    let taken = match (tune, chunk_shape_name(&r.tuning)) {
                        (None, Some(n)) => format!(" ({n})"),
                        _ => String::new(),
                    };
                    out!(
                        "{:<36} {name:<8} {:>10.4} ms  first call {:.2} s  {verdict}{taken}",
                        c.name,
                        r.ms,
                        r.first_call_s
                    )
                }
                // A tuning the case cannot take is skipped, saying so.
                Err(e) => out!("{:<36} {name:<8} skipped: {e}", c.name),
            }
        }
    }
    Ok(0)
}

/// The device as the runtime sees it: its name, SMs and the DRAM bandwidth its default paths
/// read (`DeviceLimits::memory_bandwidth`).
fn device_line(gpu: &Gpu) -> String {
    let limits = gpu.limits();
    let tb_s = limits.memory_bandwidth as f64 / 1e12;
    format!("{}, {} SMs, {tb_s:.2} TB/s", gpu.name(), limits.sm_count)
}

/// What a sweep row's bits say: every unsplit tuning of a case gives the bits of its first
/// unsplit row (`first`, set by that row), a split rounds its merge otherwise. `default` counts
/// as the tuning the runtime took, so the verdicts do not depend on where it stands in the list.
fn bits_verdict<'a>(first: &mut Option<(&'a str, u64)>, name: &'a str, bits: u64, unsplit: bool) -> String {
    match *first {
        None if unsplit => {
            *first = Some((name, bits));
            "bits: the first".to_string()
        }
        Some((_, b)) if b == bits => "bits: the same".to_string(),
        Some((f, _)) if unsplit => format!("bits: DIFFER from {f}"),
        _ => "bits: a split's own".to_string(),
    }
}

/// The `--sweep-chunk` shape that names `t` ([`parse_chunk_shape`] gives `t` back), stages
/// always written; `None` for a tuning the grammar has no word for (the gates summed per
/// channel by choice, or token ranges off the two-kernel path).
pub(crate) fn chunk_shape_name(t: &kda_runtime::chunk::ChunkTuning) -> Option<String> {
    use kda_dsl::Hoist;
    use kda_kernels::chunk::{GateScan, KeyProducts, NarrowProducts, StepOrder};
    use kda_runtime::chunk::{ChainSms, ChunkOperands};
    let sh = &t.shape;
    if sh.gate_scan_override == Some(GateScan::PerChannel) || (t.ranges.is_some() && !t.prepared) {
        return None;
    }
    let mut name = format!("{}x{}x{}", sh.warps, sh.min_blocks, sh.stages);
    if sh.rows_per_warp != kda_kernels::chunk::ROWS_PER_WARP {
        name += &format!("w{}", sh.rows_per_warp);
    }
    if sh.fill_warps > 0 || sh.producer_registers.is_some() {
        name += &format!("f{}", sh.fill_warps);
    }
    if let Some(regs) = sh.producer_registers {
        name += &format!("g{regs}");
    }
    if let Some(tokens) = t.split {
        name += &format!("s{tokens}");
    }
    if t.prepared {
        name.push('p');
        if let Some(blocks) = t.prep_blocks {
            name += &blocks.to_string();
        }
    }
    if let Some(n) = t.ranges {
        name += &format!("r{n}");
    }
    let flags = [
        (sh.fills_in_flight, "i"),
        (t.operands == ChunkOperands::Bf16, "b"),
        (t.target == Target::Sm90a, "h"),
        (sh.narrow_products == NarrowProducts::MmaSync, "m"),
        (sh.hoist_override == Some(Hoist::Everything), "e"),
        (sh.hoist_override == Some(Hoist::BlockUniform), "u"),
        (sh.hoist_override == Some(Hoist::Nothing), "n"),
        (sh.gate_scan_override == Some(GateScan::Shared), "c"),
        (sh.key_products == KeyProducts::Split, "k"),
        (t.chain_sms == ChainSms::Own, "o"),
        (sh.step_order_override == Some(StepOrder::UpdateFirst), "a"),
        (sh.step_order_override == Some(StepOrder::OutputFirst), "q"),
    ];
    flags.iter().filter(|(on, _)| *on).for_each(|(_, letter)| name += letter);
    Some(name)
}

/// One `--sweep-chunk` shape (the grammar of `chunk_shape_grammar!`, which the usage prints)
/// as the tuning it names.
pub(crate) fn parse_chunk_shape<'a>(a: &'a str) -> Result<kda_runtime::chunk::ChunkTuning, String> {
    use kda_kernels::chunk::NarrowProducts;
    use kda_runtime::chunk::{ChainSms, ChunkOperands, ChunkShape, ChunkTuning};
    let bad = || format!("`{a}` is not {}; {USAGE}", chunk_shape_grammar!());
    let num = |n: &str| n.parse::<usize>().map_err(|_| bad());
    // From the end: `k` (the key products split over the warps: `ChunkShape::
    // key_products`), `c` (the gates summed through shared memory: `ChunkShape::
    // gate_scan_override`), `e`, `u` or `n` (every loop-invariant value computed once per loop,
    // the block-uniform ones, or none: `ChunkShape::hoist_override`), `m` (products of 16 columns
    // on `mma.sync`: `ChunkShape::narrow_products`), `h` (the fused kernel for
    // sm_90a), `b` (bf16 operands for the state's products), `i` (the step's barriers leave the
    // next chunks' loads in flight), `rRANGES` (the two-kernel path in that many token ranges),
    // `p[BLOCKS]` (the two-kernel path, BLOCKS preparation blocks per (sequence, value head)),
    // then `sTOKENS` (the split into segments of that many tokens), `fFILL` (fill warps; the
    // fused kernel's also compute each chunk's factors a chunk ahead of the state's chain) and
    // its `gREGS` (the registers they keep on sm_90a: `ChunkShape::producer_registers`),
    // `wROWS` (value rows a warp) and `xSTAGES`. Last of all `o`: the two-kernel path's chain
    // blocks on SMs of their own (`ChainSms::Own`), then `a` or `q`: the step's output rows
    // after the state's update or before it (`ChunkShape::step_order_override`).
    // `a` less the suffix `c`, and whether it had it.
    let flag = |a: &'a str, c: char| a.strip_suffix(c).map_or((a, false), |rest| (rest, true));
    let (a, update_first) = flag(a, 'a');
    let (a, output_first) = flag(a, 'q');
    let step_order_override = match (update_first, output_first) {
        (true, true) => return Err(bad()),
        (true, false) => Some(kda_kernels::chunk::StepOrder::UpdateFirst),
        (false, true) => Some(kda_kernels::chunk::StepOrder::OutputFirst),
        (false, false) => None,
    };
    let (a, own_sms) = flag(a, 'o');
    let chain_sms = if own_sms { ChainSms::Own } else { ChainSms::Shared };
    let (a, split_keys) = flag(a, 'k');
    let key_products =
        if split_keys { kda_kernels::chunk::KeyProducts::Split } else { kda_kernels::chunk::KeyProducts::Replicated };
    let (a, shared_scan) = flag(a, 'c');
    let gate_scan_override = shared_scan.then_some(kda_kernels::chunk::GateScan::Shared);
    let hoists =
        [('e', kda_dsl::Hoist::Everything), ('u', kda_dsl::Hoist::BlockUniform), ('n', kda_dsl::Hoist::Nothing)];
    let (a, hoist_override) = match hoists.iter().find(|(c, _)| a.ends_with(*c)) {
        Some((c, h)) => (&a[..a.len() - c.len_utf8()], Some(*h)),
        None => (a, None),
    };
    let (a, on_mma_sync) = flag(a, 'm');
    let narrow_products = if on_mma_sync { NarrowProducts::MmaSync } else { NarrowProducts::Wgmma };
    let (a, sm90a) = flag(a, 'h');
    let target = if sm90a { Target::Sm90a } else { Target::Sm80 };
    let (a, bf16) = flag(a, 'b');
    let operands = if bf16 { ChunkOperands::Bf16 } else { ChunkOperands::F16 };
    let (a, fills_in_flight) = flag(a, 'i');
    let (a_path, ranges) = match a.rsplit_once('r') {
        Some((rest, n)) => (rest, Some(num(n)?)),
        None => (a, None),
    };
    let (a_shape, prepared, prep_blocks) = match a_path.rsplit_once('p') {
        Some((rest, "")) => (rest, true, None),
        Some((rest, n)) => (rest, true, Some(num(n)?)),
        None => (a_path, false, None),
    };
    let (a_shape, split) = match a_shape.split_once('s') {
        Some((rest, n)) => (rest, Some(num(n)?)),
        None => (a_shape, None),
    };
    let (a_shape, fill_warps, producer_registers) = match a_shape.split_once('f') {
        Some((rest, n)) => match n.split_once('g') {
            Some((n, regs)) => (rest, num(n)?, Some(num(regs)?)),
            None => (rest, num(n)?, None),
        },
        None => (a_shape, 0, None),
    };
    let (a_shape, rows_per_warp) = match a_shape.split_once('w') {
        Some((rest, n)) => (rest, num(n)?),
        None => (a_shape, kda_kernels::chunk::ROWS_PER_WARP),
    };
    let fields: Vec<&str> = a_shape.split('x').collect();
    let (warps, min_blocks, stages) = match fields.as_slice() {
        [w, m] => (num(w)?, num(m)?, None),
        [w, m, st] => (num(w)?, num(m)?, Some(num(st)?)),
        _ => return Err(bad()),
    };
    // Without `xSTAGES`, the path's own depth.
    let default_stages = if prepared { ChunkShape::PREPARED.stages } else { ChunkShape::FUSED.stages };
    let stages = stages.unwrap_or(default_stages);
    let shape = ChunkShape {
        rows_per_warp,
        fill_warps,
        producer_registers,
        fills_in_flight,
        hoist_override,
        gate_scan_override,
        narrow_products,
        key_products,
        step_order_override,
        ..ChunkShape::plain(warps, min_blocks, stages)
    };
    Ok(ChunkTuning { shape, split, prepared, prep_blocks, ranges, chain_sms, operands, target })
}

/// Times GEMM tile configs at 8192^3 (bf16, A·Bᵀ unless `ab`) compiled for sm_80 and, on
/// compute capability 9.0, for sm_90a (where those that fit take `wgmma`: 16 accumulator rows
/// per warp, operand rows of whole swizzle lines), each checked on 256 sampled elements: how
/// the shipped defaults were chosen. Only the candidates whose row name (key and target, as
/// printed) contains `filter`; none is an error, before the GPU is asked.
fn sweep_gemm(filter: &str) -> Result<i32, String> {
    let row = |cfg: &kda_kernels::gemm::GemmConfig, target: Target| format!("{} {target}", cfg.key());
    let sm80 = kda_kernels::gemm_candidates().into_iter().map(|c| (c, Target::Sm80));
    let sm90a = kda_kernels::hopper_gemm_candidates().into_iter().map(|c| (c, Target::Sm90a));
    let candidates: Vec<_> = sm80.chain(sm90a).filter(|(c, t)| row(c, *t).contains(filter)).collect();
    if candidates.is_empty() {
        return Err(format!("--sweep-gemm --case {filter:?}: no candidate's row name (`KEY TARGET`) contains it"));
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    let (m, n, k) = (8192usize, 8192usize, 8192usize);
    let device = gpu.limits().target().map_err(|e| e.to_string())?;
    for (cfg, target) in candidates.into_iter().filter(|(_, t)| device.has(*t)) {
        let v = kda_kernels::gemm_variant_on(cfg.clone(), target);
        let r = (|| -> Result<(f32, f64), kda_runtime::RuntimeError> {
            let compiled = kernels.compiled(&v)?;
            let s = gpu.default_stream();
            let mut rng = Rng::new(7);
            let gen = |rng: &mut Rng, len: usize| (0..len).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
            let (ha, hb) = (gen(&mut rng, m * k), gen(&mut rng, n * k));
            let a = DeviceTensor::from_f32(&gpu, &s, &[m, k], DType::BF16, &ha)?;
            // [N, K] for A·Bᵀ; the same buffer read as [K, N] for A·B (N = K here).
            let b = DeviceTensor::from_f32(&gpu, &s, &[n, k], DType::BF16, &hb)?;
            let c = DeviceTensor::zeros(&gpu, &s, &[m, n], DType::F32)?;
            use kda_runtime::KernelArg::Tensor as T;
            let mut t = time_ms(&gpu, &s, 3, 10, || {
                kda_runtime::launch(
                    &gpu,
                    &kernels.modules,
                    &s,
                    &compiled,
                    &v.id(),
                    &[("a", T(a.view())), ("b", T(b.view())), ("c", T(c.view()))],
                )
            })?;
            // What was timed computes the product: 256 sampled elements against f64.
            let got = c.to_f32_vec(&s)?;
            let bf = |x: f32| kda_kernels::reference::round_to(f64::from(x), DType::BF16);
            let b_at = |p: usize, j: usize| if cfg.b_transposed { hb[j * k + p] } else { hb[p * n + j] };
            let (mut gv, mut rv) = (vec![], vec![]);
            for _ in 0..256 {
                let (i, j) = ((rng.next_u64() % m as u64) as usize, (rng.next_u64() % n as u64) as usize);
                gv.push(f64::from(got[i * n + j]));
                rv.push((0..k).map(|p| bf(ha[i * k + p]) * bf(b_at(p, j))).sum());
            }
            Ok((median(&mut t), kda_kernels::reference::rel_err(&gv, &rv)))
        })();
        match r {
            Ok((ms, err)) => out!(
                "{:<48} {ms:>8.3} ms {:>7.1} TFLOP/s   rel err {err:.1e}{}",
                row(&cfg, target),
                2.0 * (m * n * k) as f64 / (ms as f64 * 1e-3) / 1e12,
                if err <= 1e-3 { "" } else { "  WRONG" }
            ),
            Err(e) => out!("{:<48} error: {e}", row(&cfg, target)),
        }
    }
    Ok(0)
}

/// The standard decode cases (`tests/bench/README.md`, "The cases"): name, B, tokens per sequence, state
/// dtype, speculative.
const DECODE_CASES: &[(&str, usize, usize, DType, bool)] = &[
    ("decode_b1_h32", 1, 1, DType::F32, false),
    ("decode_b32_h32", 32, 1, DType::F32, false),
    ("decode_b256_h32", 256, 1, DType::F32, false),
    ("decode_b1024_h32", 1024, 1, DType::F32, false),
    ("decode_bf16state_b256_h32", 256, 1, DType::BF16, false),
    ("decode_spec4_b256_h32", 256, 4, DType::F32, true),
];

/// One decode call as the peer's bench makes it (H = HV = 32, a pool of 2·B·T random states,
/// random distinct `state_indices`, in place, lower-bound gate, beta sigmoid, l2norm), timed as
/// the mean of 100 CUDA-graph replays; returns (ms, GB/s of the states that must move).
pub fn time_decode(
    gpu: &Gpu,
    kernels: &Kernels,
    b: usize,
    t: usize,
    state: DType,
    spec: bool,
) -> Result<(f32, f64, f32), String> {
    time_decode_tuned(gpu, kernels, b, t, state, spec, None)
}

/// Times decode launch shapes on the standard cases: how the API's shapes were chosen. With
/// `ROWSxWARPSxMIN_BLOCKSxSTAGES[xITEMS[xLANES]]` arguments, those shapes instead of the
/// built-in list (`ITEMS`: sequences per block at most, 256 when left out: one wave of blocks;
/// `LANES`: lanes along each state row, 4 when left out, or 32); with
/// `--case NAME`, only the cases whose name contains NAME.
fn sweep_decode(args: &[String]) -> Result<i32, String> {
    use kda_runtime::decode::DecodeShape;
    // Whole-line state stores follow the case (several tokens per sequence), as in the API.
    let shape_of = |rows, warps, min_blocks, stages, max_items, lanes_per_row| DecodeShape {
        rows,
        warps,
        min_blocks,
        stages,
        max_items,
        lanes_per_row,
        whole_line_stores: false,
    };
    let (shape_args, filter) = split_case_filter(args)?;
    let mut shapes = vec![];
    for a in shape_args {
        let n: Vec<usize> = a.split('x').map(|p| p.parse().map_err(|_| USAGE)).collect::<Result<_, _>>()?;
        let (rows, warps, min_blocks, stages, items, lanes) = match n[..] {
            [r, w, m, s] => (r, w, m, s, MAX_ITEMS, 4),
            [r, w, m, s, i] => (r, w, m, s, i, 4),
            [r, w, m, s, i, l] => (r, w, m, s, i, l),
            _ => return Err(USAGE.into()),
        };
        let lanes_per_row = u32::try_from(lanes).map_err(|_| USAGE)?;
        shapes.push(shape_of(rows, warps, min_blocks, stages, items, lanes_per_row));
    }
    if shapes.is_empty() {
        shapes = vec![
            // The API's shapes (`DecodeConfig::with_launch_shape_for`), then close runners-up.
            shape_of(64, 2, 4, 2, 1, 4),
            shape_of(32, 2, 6, 2, 1, 4),
            shape_of(32, 2, 6, 2, MAX_ITEMS, 4),
            shape_of(64, 2, 4, 3, MAX_ITEMS, 4),
            shape_of(64, 2, 4, 2, MAX_ITEMS, 4),
            shape_of(16, 1, 8, 2, MAX_ITEMS, 4),
            shape_of(32, 2, 6, 2, 2, 4),
            shape_of(64, 2, 4, 3, 2, 4),
        ];
    }
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let kernels = Kernels::new();
    for tune in shapes {
        for (case, b, t, state, spec) in DECODE_CASES.iter().filter(|c| c.0.contains(&filter)) {
            let tune = DecodeShape { whole_line_stores: *t > 1, ..tune };
            match time_decode_tuned(&gpu, &kernels, *b, *t, *state, *spec, Some(tune)) {
                Ok((ms, gbps, _)) => out!("{case:<28} {tune:?} {ms:>9.5} ms {gbps:>6.0} GB/s"),
                Err(e) => out!("{case:<28} {tune:?} error: {e}"),
            }
        }
    }
    Ok(0)
}

/// [`time_decode`] with a given launch shape (`None`: the one the API picks).
#[allow(clippy::too_many_arguments)]
fn time_decode_tuned(
    gpu: &Gpu,
    kernels: &Kernels,
    b: usize,
    t: usize,
    state: DType,
    spec: bool,
    tune: Option<kda_runtime::decode::DecodeShape>,
) -> Result<(f32, f64, f32), String> {
    use kda_kernels::decode::DecodeConfig;
    use kda_kernels::decode_ref::{random_inputs, D};
    let e = |e: kda_runtime::RuntimeError| e.to_string();
    let cfg = DecodeConfig { state_dtype: state, accepted: spec.then_some(DType::I32), ..DecodeConfig::default() };
    let (h, hv, slots) = (32, 32, 2 * b * t);
    let mut rng = Rng::new(11);
    let mut x = random_inputs(&cfg, b, t, h, hv, 1, &[], 5);
    let mut all: Vec<i64> = (0..slots as i64).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    x.indices = all[..b * t].to_vec();
    x.cols = t;
    x.accepted = (0..b).map(|_| 1 + (rng.next_u64() % t as u64) as i64).collect();
    let s = gpu.default_stream();
    let tensors = super::decode_gpu::upload_case(gpu, &s, &cfg, &x, slots, None).map_err(e)?;
    // Every slot holds random data (one random state, repeated).
    let one: Vec<f64> = (0..hv * D * D).map(|_| rng.normal() * 0.1).collect();
    let bytes = kda_kernels::reference::to_bytes(&one, state);
    for slot in 0..slots {
        kda_runtime::upload(&super::decode_gpu::slot_view(&tensors.pool, hv, slot, 1).map_err(e)?, &bytes, &s)
            .map_err(e)?;
    }
    let views = tensors.views();
    let args = super::decode_gpu::args_for(&cfg, &x, &views);
    let stream = gpu.new_stream().map_err(e)?;
    let call = || {
        match tune {
            Some(tune) => kda_runtime::decode::gated_delta_rule_decode_tuned(gpu, kernels, &stream, &args, tune),
            None => kda_runtime::decode::gated_delta_rule_decode(gpu, kernels, &stream, &args),
        }
        .map(|_| ())
    };
    let ms = kda_runtime::time_graph_ms(gpu, &stream, 100, call).map_err(e)?;
    let host_us = kda_runtime::host_us_per_call(&stream, call).map_err(e)?;
    let bytes_moved = ((b + b * t) * hv * D * D * state.size_bytes()) as f64;
    Ok((ms, bytes_moved / (ms as f64 * 1e-3) / 1e9, host_us))
}

/// Median of 20 event-timed runs after at least 5 warm-ups and 200 ms (`time_ms`), bf16 in,
/// f32 out, random inputs, the variant picked for `target`.
pub fn time_gemm(
    gpu: &Gpu,
    kernels: &Kernels,
    m: usize,
    n: usize,
    k: usize,
    bt: bool,
    target: Target,
) -> Result<GemmTiming, String> {
    let s = gpu.default_stream();
    let mut rng = Rng::new(7);
    let gen = |rng: &mut Rng, len: usize| (0..len).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
    let e = |e: kda_runtime::RuntimeError| e.to_string();
    let a = DeviceTensor::from_f32(gpu, &s, &[m, k], DType::BF16, &gen(&mut rng, m * k)).map_err(e)?;
    let bshape = if bt { [n, k] } else { [k, n] };
    let b = DeviceTensor::from_f32(gpu, &s, &bshape, DType::BF16, &gen(&mut rng, n * k)).map_err(e)?;
    let c = DeviceTensor::zeros(gpu, &s, &[m, n], DType::F32).map_err(e)?;
    let call = || gemm_on(gpu, kernels, &s, &a.view(), &b.view(), &c.view(), bt, target);
    // The process's first call of a variant compiles it, loads its module and has the driver
    // JIT it (with `CUDA_CACHE_DISABLE=1`, in every process).
    let t0 = std::time::Instant::now();
    call().map_err(e)?;
    s.synchronize().map_err(|e| e.to_string())?;
    let first_call_s = t0.elapsed().as_secs_f64();
    let mut t = time_ms(gpu, &s, 5, 20, call).map_err(e)?;
    Ok(GemmTiming { ms: median(&mut t), first_call_s })
}

/// [`time_gemm`]'s result.
pub struct GemmTiming {
    /// The median of the timed calls, ms.
    pub ms: f32,
    /// Wall seconds of the process's first call of the variant (compile, module load and
    /// driver JIT included): a later row of the same variant finds it loaded.
    pub first_call_s: f64,
}

#[cfg(test)]
mod tests {
    use super::parse_chunk_shape;
    use kda_dsl::{Hoist, Target};
    use kda_runtime::chunk::{ChainSms, ChunkOperands, ChunkShape, ChunkTuning};

    #[test]
    fn a_sweep_rows_bits_compare_with_the_first_unsplit_row_wherever_default_stands() {
        let verdicts = |rows: &[(&'static str, u64, bool)]| {
            let mut first = None;
            rows.iter()
                .map(|&(name, bits, unsplit)| super::bits_verdict(&mut first, name, bits, unsplit))
                .collect::<Vec<_>>()
        };
        // A split first (its own bits), then `default` unsplit: it becomes the reference.
        assert_eq!(
            verdicts(&[("s4096", 1, false), ("default", 2, true), ("4x2w32ik", 2, true), ("8x2", 3, true)]),
            ["bits: a split's own", "bits: the first", "bits: the same", "bits: DIFFER from default"]
        );
        // `default` later, split: compared, and its own bits when they differ.
        assert_eq!(
            verdicts(&[("4x2w32ik", 5, true), ("default", 5, false), ("s2048", 6, false)]),
            ["bits: the first", "bits: the same", "bits: a split's own"]
        );
    }

    /// A shape's name parses back to its tuning: for the sweeps' shapes and for every path's
    /// own shape (what `default` rows print), on both targets; a tuning the grammar cannot
    /// say has no name.
    #[test]
    fn chunk_shape_names_parse_back_to_their_tuning() {
        use super::chunk_shape_name;
        use kda_kernels::chunk::GateScan;
        let round_trip = |t: ChunkTuning| {
            let name = chunk_shape_name(&t).unwrap_or_else(|| panic!("{t:?} has a name"));
            assert_eq!(parse_chunk_shape(&name).unwrap_or_else(|e| panic!("{name}: {e}")), t, "{name}");
            name
        };
        for s in [
            "2x4x4f1pe",
            "4x2x4f1pr16eo",
            "4x2x4f1pr16heo",
            "4x1x5w32f8g128ihmk",
            "2x2x4w32f1pr16eo",
            "4x2w32s2048ik",
            "2x8x3p256",
            "8x1ih",
            "4x2w32ihmn",
            "4x2w32iek",
            "8x2b",
            "4x2w32uc",
            "2x4x4f1pea",
            "2x4x4f1pr16eoa",
            "4x2w32ikq",
        ] {
            round_trip(parse_chunk_shape(s).expect(s));
        }
        let of = |shape, prepared, target| ChunkTuning {
            shape,
            split: None,
            prepared,
            prep_blocks: None,
            ranges: None,
            chain_sms: ChainSms::Shared,
            operands: ChunkOperands::F16,
            target,
        };
        assert_eq!(round_trip(of(ChunkShape::PREPARED, true, Target::Sm80)), "2x4x4f1pe");
        assert_eq!(
            round_trip(ChunkTuning { ranges: Some(2), ..of(ChunkShape::PREPARED, true, Target::Sm80) }),
            "2x4x4f1pr2e"
        );
        round_trip(of(ChunkShape::FUSED, false, Target::Sm80));
        round_trip(ChunkTuning { split: Some(4096), ..of(ChunkShape::PREPARED, true, Target::Sm80) });
        round_trip(of(ChunkShape::HOPPER, false, Target::Sm90a));
        round_trip(of(ChunkShape::HOPPER_PREPARED, true, Target::Sm90a));
        assert_eq!(round_trip(of(ChunkShape::HOPPER_TWO_PRODUCERS, false, Target::Sm90a)), "4x1x5w32f8g128ihmk");
        let per_channel = ChunkShape { gate_scan_override: Some(GateScan::PerChannel), ..ChunkShape::FUSED };
        assert_eq!(chunk_shape_name(&of(per_channel, false, Target::Sm80)), None);
        let ranges_fused = ChunkTuning { ranges: Some(2), ..of(ChunkShape::FUSED, false, Target::Sm80) };
        assert_eq!(chunk_shape_name(&ranges_fused), None);
    }

    #[test]
    fn a_gemm_sweep_filter_matching_no_candidate_is_refused_before_the_gpu() {
        let e = super::sweep_gemm("no such row").expect_err("no candidate matches");
        assert!(e.contains("no candidate's row name"), "{e}");
    }

    #[test]
    fn chunk_shapes_parse_every_part() {
        let shape = ChunkShape::plain;
        let tune = |shape, split, prepared, prep_blocks, ranges| ChunkTuning {
            shape,
            split,
            prepared,
            prep_blocks,
            ranges,
            chain_sms: ChainSms::Shared,
            operands: ChunkOperands::F16,
            target: Target::Sm80,
        };
        let cases = [
            ("8x2", tune(shape(8, 2, ChunkShape::FUSED.stages), None, false, None, None)),
            ("2x8p", tune(shape(2, 8, ChunkShape::PREPARED.stages), None, true, None, None)),
            ("2x8x4pr8", tune(shape(2, 8, 4), None, true, None, Some(8))),
            ("2x8x3p256", tune(shape(2, 8, 3), None, true, Some(256), None)),
            ("8x2s4096p", tune(shape(8, 2, ChunkShape::PREPARED.stages), Some(4096), true, None, None)),
            ("2x4x4f1pr8", tune(ChunkShape { fill_warps: 1, ..shape(2, 4, 4) }, None, true, None, Some(8))),
            (
                "4x2x4f1pr4eo",
                ChunkTuning {
                    chain_sms: ChainSms::Own,
                    ..tune(
                        ChunkShape { fill_warps: 1, hoist_override: Some(Hoist::Everything), ..shape(4, 2, 4) },
                        None,
                        true,
                        None,
                        Some(4),
                    )
                },
            ),
            (
                "2x4x4f1pr4b",
                ChunkTuning {
                    operands: ChunkOperands::Bf16,
                    ..tune(ChunkShape { fill_warps: 1, ..shape(2, 4, 4) }, None, true, None, Some(4))
                },
            ),
            ("8x2b", ChunkTuning { operands: ChunkOperands::Bf16, ..tune(shape(8, 2, 2), None, false, None, None) }),
            ("8x1h", ChunkTuning { target: Target::Sm90a, ..tune(shape(8, 1, 2), None, false, None, None) }),
            (
                "8x1ih",
                ChunkTuning {
                    shape: ChunkShape::HOPPER,
                    target: Target::Sm90a,
                    ..tune(shape(8, 1, 2), None, false, None, None)
                },
            ),
            (
                "8x1ihe",
                ChunkTuning {
                    shape: ChunkShape { hoist_override: Some(Hoist::Everything), ..ChunkShape::HOPPER },
                    target: Target::Sm90a,
                    ..tune(shape(8, 1, 2), None, false, None, None)
                },
            ),
            (
                "8x1ihu",
                ChunkTuning {
                    shape: ChunkShape { hoist_override: Some(Hoist::BlockUniform), ..ChunkShape::HOPPER },
                    target: Target::Sm90a,
                    ..tune(shape(8, 1, 2), None, false, None, None)
                },
            ),
            (
                "2x4x4f1pn",
                tune(
                    ChunkShape { fill_warps: 1, hoist_override: Some(Hoist::Nothing), ..shape(2, 4, 4) },
                    None,
                    true,
                    None,
                    None,
                ),
            ),
            ("4x2w32", tune(ChunkShape { rows_per_warp: 32, ..shape(4, 2, 2) }, None, false, None, None)),
            (
                "4x2w32ic",
                tune(
                    ChunkShape {
                        rows_per_warp: 32,
                        fills_in_flight: true,
                        gate_scan_override: Some(kda_kernels::chunk::GateScan::Shared),
                        ..shape(4, 2, 2)
                    },
                    None,
                    false,
                    None,
                    None,
                ),
            ),
            (
                "2x4x4w32f1p",
                tune(ChunkShape { rows_per_warp: 32, fill_warps: 1, ..shape(2, 4, 4) }, None, true, None, None),
            ),
            (
                "4x2w32ik",
                tune(
                    ChunkShape {
                        rows_per_warp: 32,
                        fills_in_flight: true,
                        key_products: kda_kernels::chunk::KeyProducts::Split,
                        ..shape(4, 2, 2)
                    },
                    None,
                    false,
                    None,
                    None,
                ),
            ),
            (
                "4x2w32ihmn",
                ChunkTuning {
                    target: Target::Sm90a,
                    ..tune(
                        ChunkShape {
                            rows_per_warp: 32,
                            fills_in_flight: true,
                            narrow_products: kda_kernels::chunk::NarrowProducts::MmaSync,
                            hoist_override: Some(Hoist::Nothing),
                            ..shape(4, 2, 2)
                        },
                        None,
                        false,
                        None,
                        None,
                    )
                },
            ),
            (
                "4x2bh",
                ChunkTuning {
                    operands: ChunkOperands::Bf16,
                    target: Target::Sm90a,
                    ..tune(shape(4, 2, 2), None, false, None, None)
                },
            ),
            (
                "4x1x5w32f8g128ihmk",
                ChunkTuning {
                    target: Target::Sm90a,
                    ..tune(ChunkShape::HOPPER_TWO_PRODUCERS, None, false, None, None)
                },
            ),
            (
                "2x4x4f1pea",
                tune(
                    ChunkShape {
                        step_order_override: Some(kda_kernels::chunk::StepOrder::UpdateFirst),
                        ..ChunkShape::PREPARED
                    },
                    None,
                    true,
                    None,
                    None,
                ),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_chunk_shape(text), Ok(want), "{text}");
        }
        for text in [
            "8", "8x", "8x2x", "8x2x4x1", "ax2", "8x2pr", "8x2qa", "8x2aq", "8x2aa", "8x2ao", "8x2f", "8x2bb", "8x2hb",
            "8x2hh", "8x2ne", "8x2en", "8x2ee", "8x2w", "8x2wx", "8x2cc", "8x2ce", "8x2mm", "8x2mh", "8x2nm", "8x2kk",
            "8x2kc", "8x2f4g", "8x2f4gx", "8x2g128",
        ] {
            let e = parse_chunk_shape(text).expect_err(text);
            assert!(e.contains(text) && e.contains("WARPSxMIN_BLOCKS"), "{text}: {e}");
        }
    }
}
