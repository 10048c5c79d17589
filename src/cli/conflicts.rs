//! `kda conflicts [FAMILY] [--target sm_80|sm_90a] [--prepared | --shape SHAPE] [--all]`: the prefill
//! kernel's shared-memory bank conflicts, per source line, counted in the simulator over one
//! chunk family's call (`kda_dsl::sim::banks`).

use kda_kernels::chunk::{ChunkConfig, ChunkShape, Preparation};
use kda_kernels::chunk_check::simulate_chunk_on;
use kda_kernels::chunk_families::chunk_families;

pub(crate) const USAGE: &str =
    "usage: kda conflicts [FAMILY] [--target sm_80|sm_90a] [--prepared | --shape SHAPE] [--all]

Runs the prefill's chunk family whose name contains FAMILY (`kda check` lists them as
chunk/NAME; the first when omitted) in the simulator, compiled for the target (sm_80 unless
--target says otherwise; sm_90a runs the fused kernel as it ships there), and prints its
shared-memory instructions per source line: warp requests, the wavefronts they took, the
fewest they could take, and the excess (bank conflicts), the most first; the first 20 lines,
every one with --all. --prepared runs the two-kernel path (chunk_prep, then the chain over its
workspace) instead of the fused kernel. --shape SHAPE (a `kda bench --sweep-chunk` shape,
e.g. 4x1x5w32f8g128ihmk) runs the kernel at that shape, its path and target included. These
are the PTX's requests: ptxas may merge a
thread's adjacent 4-byte accesses into vectors, which cost less; confirm a flagged line in the
SASS (cuobjdump -sass).";

/// Lines printed: the rest are summed on one more.
const SHOWN: usize = 20;

pub fn run(args: &[String]) -> Result<i32, String> {
    let (target, rest) = super::take_target(args)?;
    let prepared = rest.contains(&"--prepared");
    let shown = if rest.contains(&"--all") { usize::MAX } else { SHOWN };
    let mut rest: Vec<&str> = rest.into_iter().filter(|a| !matches!(*a, "--prepared" | "--all")).collect();
    let tuning = match rest.iter().position(|a| *a == "--shape") {
        Some(at) if !prepared && at + 1 < rest.len() => {
            let shape = rest.remove(at + 1);
            rest.remove(at);
            Some(super::bench::parse_chunk_shape(shape)?)
        }
        Some(_) => return Err(USAGE.into()),
        None => None,
    };
    let names = rest;
    let filter = match names.as_slice() {
        [] => "",
        [f] if !f.starts_with('-') => f,
        _ => return Err(USAGE.into()),
    };
    let families = chunk_families();
    let f = families
        .iter()
        .find(|f| f.name.contains(filter))
        .ok_or_else(|| format!("no chunk family's name contains `{filter}`; `kda check` lists them"))?;
    let (cfg, target, prepared) = match tuning {
        Some(t) => {
            let target = if t.target == kda_dsl::Target::Sm90a { t.target } else { target };
            (t.apply(f.cfg.clone()), target, t.prepared)
        }
        None if prepared => (
            ChunkConfig { preparation: Preparation::Workspace, shape: ChunkShape::PREPARED, ..f.cfg.clone() },
            target,
            true,
        ),
        None => (f.cfg.clone().on_target(target), target, false),
    };
    let x = f.inputs(0);
    let (ran, stats) = kda_dsl::sim::banks::with_shared_access_stats(|| simulate_chunk_on(&cfg, &x, 2, target));
    ran.map_err(|e| format!("chunk/{}: {e}", f.name))?;
    out!(
        "chunk/{} ({}{}, {target}): shared-memory requests per source line",
        f.name,
        cfg.key(),
        if prepared { ", after chunk_prep" } else { "" }
    );
    out!(
        "{:<28} {:<10} {:>9} {:>11} {:>9} {:>9} {:>10}",
        "line",
        "op",
        "requests",
        "wavefronts",
        "fewest",
        "excess",
        "per request"
    );
    for s in stats.iter().take(shown) {
        let at = format!("{}:{}", s.loc.file.rsplit('/').next().unwrap_or(s.loc.file), s.loc.line);
        let per = s.wavefronts as f64 / s.requests.max(1) as f64;
        out!(
            "{at:<28} {:<10} {:>9} {:>11} {:>9} {:>9} {per:>10.2}",
            s.op.name(),
            s.requests,
            s.wavefronts,
            s.ideal,
            s.excess()
        );
    }
    let (w, i): (u64, u64) = stats.iter().map(|s| (s.wavefronts, s.ideal)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    if stats.len() > shown {
        out!("({} more lines; --all prints them)", stats.len() - shown);
    }
    out!("all: {w} wavefronts, {i} at the fewest, {} excess ({:.1}%)", w - i, 100.0 * (w - i) as f64 / w.max(1) as f64);
    Ok(0)
}
