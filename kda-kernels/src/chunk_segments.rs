//! The exact split's segment schedule, built on the device from `cu_seqlens` (never read on
//! the host), so that a varlen call splits each sequence exactly as a dense call of it would.
//!
//! A sequence of `L` tokens is cut into segments of `SEG` tokens (a multiple of 16) from its
//! first token, the last one holding the rest, when it has more than two segments' worth
//! ([`segment_count`]): a function of `L` alone. Two segments would gain nothing: the split's
//! passes run one after the other, each as long as one segment, so two of them take as long
//! as the sequence's own chain, and a full GPU pays for the extra work. Numbered in sequence
//! order, the segments are a varlen batch of their own: `seg_cu` holds their boundaries among
//! the packed token rows (a dense `[B, T]` call's rows flattened), `seg_first[n]` sequence
//! `n`'s first segment and `seg_first[NSEQ]` their count.
//! A call of `NSEQ` sequences over `T` packed tokens has at most `NSEQ + T / SEG` segments
//! (see [`max_segments`]); the launcher sizes every table so.
//!
//! The chunk passes of the split read the segments as state slots (`ChunkStates::Pool` over
//! the split's f32 tables), so two index tables say which segments each pass runs:
//! `live[s] = s` for every segment of a sequence that is not padding (its pool slot outside
//! the pool), `-1` otherwise; `split[s] = s` only for a segment that is not its sequence's
//! last (whose end state the merge chains), `-1` otherwise. `fresh` is all zeros: the
//! `has_initial_state` of the pass that runs the segments from zeros.

use crate::chunk::{sequence_end, sequence_prefix, sequence_start};
use kda_dsl::DType;
use kda_macros::kernel;

/// Sequences the schedule scans per step (its block's threads).
pub const SCAN_TILE: usize = 256;

/// The segments a sequence of `len` tokens is cut into, every `seg` tokens: one up to
/// `2 · seg` tokens, else `ceil(len / seg)` (at least 3). What `chunk_segments` computes on the
/// device, for hosts and tests.
pub fn segment_count(len: usize, seg: usize) -> usize {
    if len > 2 * seg {
        len.div_ceil(seg)
    } else {
        1
    }
}

/// The most segments a call of `nseq` sequences over `tokens` packed tokens (a dense call's
/// `B · T`) has, cut every `seg` tokens: one per sequence, plus one per whole `seg` tokens.
pub fn max_segments(nseq: usize, tokens: usize, seg: usize) -> usize {
    nseq + tokens / seg
}

/// What a schedule variant is specialized for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SegmentsConfig {
    /// `cu_seqlens` given, and its type; `None` for a dense call, whose `NSEQ` sequences of
    /// `T` tokens each are the rows `n · T ..` of the flattened batch.
    pub varlen: Option<DType>,
    /// `state_indices` given (the decode pool), and its type: a sequence whose slot lies
    /// outside the pool's `P` slots is padding, and its segments run nowhere.
    pub pool: Option<DType>,
    /// Whether the schedule writes the segments' positions (prefix caching), and from what.
    pub positions: SegmentPositions,
}

/// Where the segments' absolute positions come from, when the call caches prefixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SegmentPositions {
    /// No prefix caching: `seg_prefix` and `seg_rows` are left alone.
    #[default]
    Unused,
    /// Checkpoints without `prefix_lens`: every sequence starts at position 0.
    FromZero,
    /// `prefix_lens` given, of this dtype.
    PrefixLens(DType),
}

impl Default for SegmentsConfig {
    /// The bench case's: a dense call without a pool.
    fn default() -> Self {
        SegmentsConfig { varlen: None, pool: None, positions: SegmentPositions::Unused }
    }
}

impl SegmentsConfig {
    /// A short stable name.
    pub fn key(&self) -> String {
        let varlen = self.varlen.map_or("dense".to_string(), |d| format!("cu{}", d.name()));
        let pool = self.pool.map_or(String::new(), |d| format!("_pool_{}", d.name()));
        let positions = match self.positions {
            SegmentPositions::Unused => String::new(),
            SegmentPositions::FromZero => "_pos".to_string(),
            SegmentPositions::PrefixLens(d) => format!("_prefix{}", d.name()),
        };
        format!("{varlen}{pool}{positions}")
    }

    /// The dtype `prefix_lens` binds as (I32 for a placeholder).
    fn prefix_lens(&self) -> DType {
        match self.positions {
            SegmentPositions::PrefixLens(d) => d,
            _ => DType::I32,
        }
    }
}

/// Sequence `n`'s first token row: a dense call's `n · T`, a varlen call's from `cu_seqlens`
/// clamped as the chunk kernel clamps it.
#[kda_macros::kernel_fn]
fn rows_of(varlen: bool, cu_seqlens: Tensor, n: Val, t: Val) -> Val {
    let mut start = n * t;
    if varlen {
        start = sequence_start(cu_seqlens, n, t);
    }
    start
}

/// Sequence `n`'s end row (after [`rows_of`]'s `start`), clamped as the chunk kernel clamps it.
#[kda_macros::kernel_fn]
fn end_of(varlen: bool, cu_seqlens: Tensor, n: Val, t: Val, start: Val) -> Val {
    let mut end = start + t;
    if varlen {
        end = sequence_end(cu_seqlens, n, t, start);
    }
    end
}

/// Writes the segment tables of a call (one block).
#[kernel]
pub fn chunk_segments(
    cfg: &SegmentsConfig,
    cu_seqlens: Global<(NC,), { cfg.varlen.unwrap_or(I32) }>,
    state_indices: Global<(NI,), { cfg.pool.unwrap_or(I32) }>,
    seg_cu: GlobalMut<(NB,), I32>,
    seg_first: GlobalMut<(NF,), I32>,
    live: GlobalMut<(NS,), I32>,
    split: GlobalMut<(NS,), I32>,
    fresh: GlobalMut<(NS,), I32>,
    prefix_lens: Global<(NPL,), { cfg.prefix_lens() }>,
    seg_prefix: GlobalMut<(NSP,), I32>,
    seg_rows: GlobalMut<(NSP, RW), I32>,
    NSEQ: Dim,
    T: Dim,
    P: Dim,
    SEG: Dim,
) {
    let (_x,) = launch(grid = [1], threads = SCAN_TILE);
    let varlen = cfg.varlen.is_some();
    let positions = cfg.positions != SegmentPositions::Unused;
    let with_lens = matches!(cfg.positions, SegmentPositions::PrefixLens(_));
    let counts = shared([SCAN_TILE], I32);
    let ends = shared([SCAN_TILE], I32);
    // Segments numbered before the current tile of sequences.
    let carry = shared([1], I32);
    for (i,) in parallel(carry) {
        carry[i] = 0;
    }
    for tile in serial(0, ceil_div(NSEQ, SCAN_TILE)) {
        for (i,) in parallel(counts) {
            let n = min(tile * SCAN_TILE + i, NSEQ - 1);
            let start = rows_of(varlen, cu_seqlens, n, T);
            let len = end_of(varlen, cu_seqlens, n, T, start) - start;
            let count = select(len > 2 * SEG, ceil_div(len, SEG), 1);
            counts[i] = select(tile * SCAN_TILE + i < NSEQ, count, 0);
        }
        cumsum(counts, ends, 0);
        for (i,) in parallel(counts) {
            let n = tile * SCAN_TILE + i;
            if n < NSEQ {
                let start = rows_of(varlen, cu_seqlens, n, T);
                let count = counts[i];
                let first = carry[0] + ends[i] - count;
                let mut alive = n >= 0;
                if cfg.pool.is_some() {
                    let raw = state_indices[n];
                    alive = raw >= 0 && raw < P;
                }
                seg_first[n] = min(first, NS);
                // The sequence's place in its prompt, for prefix caching (read only then).
                let mut prefix = 0;
                let mut len = 0;
                if positions {
                    prefix = sequence_prefix(with_lens, prefix_lens, n);
                    len = end_of(varlen, cu_seqlens, n, T, start) - start;
                }
                // Past `NS` only when `cu_seqlens` overlaps itself (the checked mode reports
                // it): those segments are left out, never written out of bounds.
                for j in serial(0, min(count, max(NS - first, 0))) {
                    let s = first + j;
                    seg_cu[s] = start + j * SEG;
                    live[s] = select(alive, s, -1);
                    split[s] = select(alive && j + 1 < count, s, -1);
                    fresh[s] = 0;
                    if positions {
                        seg_prefix[s] = prefix + j * SEG;
                        seg_rows[s][0] = n;
                        seg_rows[s][1] = prefix + len;
                    }
                }
            }
        }
        for (i,) in parallel(carry) {
            carry[i] = carry[i] + ends[SCAN_TILE - 1];
        }
    }
    // The boundary after the last segment, and the unused segments past it: empty, at the
    // end of the last sequence, run by no pass.
    let total = min(carry[0], NS);
    let last_start = rows_of(varlen, cu_seqlens, NSEQ - 1, T);
    let end = end_of(varlen, cu_seqlens, NSEQ - 1, T, last_start);
    for tile in serial(0, ceil_div(NS + 1, SCAN_TILE)) {
        for (i,) in parallel(counts) {
            let s = tile * SCAN_TILE + i;
            if s >= total && s <= NS {
                seg_cu[s] = end;
            }
            if s >= total && s < NS {
                live[s] = -1;
                split[s] = -1;
                fresh[s] = 0;
                if positions {
                    seg_prefix[s] = 0;
                    seg_rows[s][0] = 0;
                    seg_rows[s][1] = 0;
                }
            }
        }
    }
    for (i,) in parallel(carry) {
        seg_first[NSEQ + i] = total;
    }
}

/// The tables the schedule writes, as values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentTables {
    /// `[NS + 1]` segment boundaries among the packed token rows.
    pub seg_cu: Vec<i64>,
    /// `[NSEQ + 1]`: each sequence's first segment, then the count.
    pub seg_first: Vec<i64>,
    /// `[NS]`: `s` for a segment of a live sequence, else -1.
    pub live: Vec<i64>,
    /// `[NS]`: `s` for a segment that is not its sequence's last, else -1.
    pub split: Vec<i64>,
    /// `[NS]` zeros.
    pub fresh: Vec<i64>,
    /// `[NS]` each segment's absolute start (empty without [`SegmentPositions`]).
    pub seg_prefix: Vec<i64>,
    /// `[NS, 2]` each segment's sequence's checkpoint row and absolute end (empty without).
    pub seg_rows: Vec<i64>,
}

/// A call's sequences as the schedule reads them, for [`simulate_segments`].
#[derive(Clone, Copy, Debug)]
pub struct ScheduleInputs<'a> {
    /// `cu_seqlens` (varlen) or a placeholder.
    pub cu: &'a [i64],
    /// Tokens: each sequence's (dense) or in all (varlen).
    pub t: usize,
    /// Sequences.
    pub nseq: usize,
    /// Pool slots (with `cfg.pool`) or a placeholder.
    pub indices: &'a [i64],
    /// Slots of the pool.
    pub pool: usize,
    /// `prefix_lens` (with [`SegmentPositions::PrefixLens`]) or a placeholder.
    pub prefix_lens: &'a [i64],
}

/// Runs the schedule in the block simulator for the call `x`, cut every `seg` tokens. Tables
/// start poisoned.
pub fn simulate_segments(cfg: &SegmentsConfig, x: &ScheduleInputs, seg: usize) -> Result<SegmentTables, String> {
    use crate::check::{simulate, tensor_values};
    use kda_dsl::sim::SimArg;
    let def = chunk_segments(cfg).map_err(|e| e.to_string())?;
    let ScheduleInputs { cu, t, nseq, indices, pool, prefix_lens } = *x;
    let tokens = if cfg.varlen.is_some() { t } else { nseq * t };
    let ns = max_segments(nseq, tokens, seg);
    let ints = |v: &[i64], d: DType| -> Vec<u8> {
        match d {
            DType::I64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        }
    };
    let poison = |n: usize| SimArg::Tensor(vec![0x7f; 4 * n]);
    let dim = |name: &str, v: usize| (name.to_string(), SimArg::I32(v as i32));
    let mut args = vec![
        ("cu_seqlens".to_string(), SimArg::Tensor(ints(cu, cfg.varlen.unwrap_or(DType::I32)))),
        dim("NC", cu.len()),
        ("state_indices".to_string(), SimArg::Tensor(ints(indices, cfg.pool.unwrap_or(DType::I32)))),
        dim("NI", indices.len()),
        ("seg_cu".to_string(), poison(ns + 1)),
        dim("NB", ns + 1),
        ("seg_first".to_string(), poison(nseq + 1)),
        dim("NF", nseq + 1),
        ("live".to_string(), poison(ns)),
        ("split".to_string(), poison(ns)),
        ("fresh".to_string(), poison(ns)),
        dim("NS", ns),
        ("prefix_lens".to_string(), SimArg::Tensor(ints(prefix_lens, cfg.prefix_lens()))),
        dim("NPL", prefix_lens.len()),
        ("seg_prefix".to_string(), poison(ns)),
        ("seg_rows".to_string(), poison(2 * ns)),
        dim("NSP", ns),
        dim("RW", 2),
        dim("NSEQ", nseq),
        dim("T", t),
        dim("P", pool),
        dim("SEG", seg),
    ];
    simulate(&def, &mut args)?;
    let positions = cfg.positions != SegmentPositions::Unused;
    let get = |name: &str| tensor_values(&args, name, DType::I32).into_iter().map(|v| v as i64).collect();
    Ok(SegmentTables {
        seg_cu: get("seg_cu"),
        seg_first: get("seg_first"),
        live: get("live"),
        split: get("split"),
        fresh: get("fresh"),
        seg_prefix: if positions { get("seg_prefix") } else { vec![] },
        seg_rows: if positions { get("seg_rows") } else { vec![] },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nseq` sequences over `t` tokens (`cu` their `cu_seqlens` when varlen), no pool, no
    /// prefixes.
    fn sequences(cu: &[i64], t: usize, nseq: usize) -> ScheduleInputs<'_> {
        ScheduleInputs { cu, t, nseq, indices: &[0], pool: 1, prefix_lens: &[0] }
    }

    /// The tables a host computes from the same lengths: what the kernel must write.
    fn host_tables(rows: &[(i64, i64)], alive: &[bool], ns: usize, seg: i64) -> SegmentTables {
        let mut t = SegmentTables {
            seg_cu: vec![],
            seg_first: vec![],
            live: vec![],
            split: vec![],
            fresh: vec![0; ns],
            seg_prefix: vec![],
            seg_rows: vec![],
        };
        for (n, &(start, end)) in rows.iter().enumerate() {
            t.seg_first.push(t.live.len() as i64);
            let count = segment_count((end - start) as usize, seg as usize) as i64;
            for j in 0..count {
                let s = t.live.len() as i64;
                t.seg_cu.push(start + j * seg);
                t.live.push(if alive[n] { s } else { -1 });
                t.split.push(if alive[n] && j + 1 < count { s } else { -1 });
            }
        }
        let total = t.live.len();
        assert!(total <= ns, "the bound holds");
        t.seg_first.push(total as i64);
        let end = rows.last().map_or(0, |r| r.1);
        t.seg_cu.resize(ns + 1, end);
        t.live.resize(ns, -1);
        t.split.resize(ns, -1);
        t
    }

    fn assert_same(got: &SegmentTables, want: &SegmentTables) {
        assert_eq!(got.seg_cu, want.seg_cu, "seg_cu");
        assert_eq!(got.seg_first, want.seg_first, "seg_first");
        assert_eq!(got.live, want.live, "live");
        assert_eq!(got.split, want.split, "split");
        assert_eq!(got.fresh, want.fresh, "fresh");
        assert_eq!(got.seg_prefix, want.seg_prefix, "seg_prefix");
        assert_eq!(got.seg_rows, want.seg_rows, "seg_rows");
    }

    /// With prefix caching each segment knows its absolute start (its sequence's prefix, a
    /// negative one taken as 0, plus its offset) and its sequence's checkpoint row and absolute
    /// end; the unused segments get zeros. Without `prefix_lens` every prefix is 0.
    #[test]
    fn segments_know_their_positions() {
        let seg = 16i64;
        let lens = [0i64, 40, 17, 50];
        let prefixes = [5i64, 3, -4, 33];
        let mut cu = vec![0i64];
        for l in lens {
            cu.push(cu[cu.len() - 1] + l);
        }
        let t = *cu.last().expect("a total") as usize;
        let rows: Vec<(i64, i64)> = cu.windows(2).map(|w| (w[0], w[1])).collect();
        let ns = max_segments(lens.len(), t, seg as usize);
        for positions in [SegmentPositions::PrefixLens(DType::I64), SegmentPositions::FromZero] {
            let cfg = SegmentsConfig { varlen: Some(DType::I32), pool: None, positions };
            let x = ScheduleInputs { prefix_lens: &prefixes, ..sequences(&cu, t, lens.len()) };
            let got = simulate_segments(&cfg, &x, seg as usize).unwrap_or_else(|e| panic!("{e}"));
            let mut want = host_tables(&rows, &[true; 4], ns, seg);
            for (n, &(start, end)) in rows.iter().enumerate() {
                let prefix = if positions == SegmentPositions::FromZero { 0 } else { prefixes[n].max(0) };
                for j in 0..segment_count((end - start) as usize, seg as usize) as i64 {
                    want.seg_prefix.push(prefix + j * seg);
                    want.seg_rows.extend([n as i64, prefix + end - start]);
                }
            }
            want.seg_prefix.resize(ns, 0);
            want.seg_rows.resize(2 * ns, 0);
            assert_same(&got, &want);
        }
    }

    /// Varlen lengths of zero, one, exactly a segment, a segment and one, exactly two (one
    /// segment still), two and one (the first that splits, in 3) and several segments, in both
    /// index types; every table matches the host's, the unused segments empty at the end.
    #[test]
    fn varlen_schedule_matches_the_host() {
        let seg = 32;
        let lens = [0i64, 1, 32, 33, 100, 5, 64, 65];
        let mut cu = vec![0i64];
        for l in lens {
            cu.push(cu[cu.len() - 1] + l);
        }
        let t = *cu.last().expect("a total") as usize;
        let rows: Vec<(i64, i64)> = cu.windows(2).map(|w| (w[0], w[1])).collect();
        for index in [DType::I32, DType::I64] {
            let cfg = SegmentsConfig { varlen: Some(index), ..SegmentsConfig::default() };
            let got = simulate_segments(&cfg, &sequences(&cu, t, lens.len()), seg).unwrap_or_else(|e| panic!("{e}"));
            let ns = max_segments(lens.len(), t, seg);
            assert_same(&got, &host_tables(&rows, &[true; 8], ns, seg as i64));
        }
    }

    /// A dense call's sequences are the flattened rows `n · T ..`; with more sequences than
    /// one scan tile, the carry between tiles counts.
    #[test]
    fn dense_schedule_over_several_scan_tiles() {
        let (nseq, t, seg) = (SCAN_TILE + 3, 48, 16);
        let rows: Vec<(i64, i64)> = (0..nseq as i64).map(|n| (n * t as i64, (n + 1) * t as i64)).collect();
        let got = simulate_segments(&SegmentsConfig::default(), &sequences(&[0], t, nseq), seg)
            .unwrap_or_else(|e| panic!("{e}"));
        let ns = max_segments(nseq, nseq * t, seg);
        assert_same(&got, &host_tables(&rows, &vec![true; nseq], ns, seg as i64));
    }

    /// With a pool, a sequence whose slot lies outside it is padding: no pass runs its
    /// segments, though they keep their places.
    #[test]
    fn padding_sequences_run_no_segment() {
        let seg = 16;
        let cu = [0i64, 40, 40, 57];
        let indices = [2i64, -1, 7];
        let rows: Vec<(i64, i64)> = cu.windows(2).map(|w| (w[0], w[1])).collect();
        let cfg = SegmentsConfig { varlen: Some(DType::I32), pool: Some(DType::I64), ..SegmentsConfig::default() };
        let got = simulate_segments(
            &cfg,
            &ScheduleInputs { cu: &cu, t: 57, nseq: 3, indices: &indices, pool: 4, prefix_lens: &[0] },
            seg,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ns = max_segments(3, 57, seg);
        assert_same(&got, &host_tables(&rows, &[true, false, false], ns, seg as i64));
    }

    /// `cu_seqlens` that overlaps itself asks for more segments than the tables hold: the
    /// schedule leaves the excess out and writes nothing out of bounds (the simulator checks).
    #[test]
    fn overlapping_cu_seqlens_stays_in_bounds() {
        let cfg = SegmentsConfig { varlen: Some(DType::I32), ..SegmentsConfig::default() };
        let got = simulate_segments(&cfg, &sequences(&[0, 64, 0, 64], 64, 3), 16).unwrap_or_else(|e| panic!("{e}"));
        let ns = max_segments(3, 64, 16);
        assert_eq!(got.seg_first[3], ns as i64, "every slot used, no more");
        assert_eq!(got.live.len(), ns);
    }
}
