//! The order in which a varlen launch runs its sequences: longest first.
//!
//! A varlen grid has one block row per sequence, and blocks start roughly in index order, so
//! a long sequence late in `cu_seqlens` starts in the last wave and everything waits for its
//! chain. Block `z` instead runs the sequence of rank `z` by decreasing token count (ties by
//! index), which is longest-processing-time-first list scheduling: the long chains start in
//! the first wave and the last wave holds short ones. Each block ranks the sequences itself,
//! from `cu_seqlens` on the device (never read on the host), so the launch needs no
//! workspace and stays graph-safe. Only which block runs a sequence changes, never its
//! arithmetic, so results are the same bits in any order (batch invariance holds).

use crate::chunk::{sequence_end, sequence_start};

/// The most sequences a varlen launch orders longest first. Each block's ranking reads every
/// pair of lengths (256 · 256 shared reads, spread over the block's threads), which stays small
/// against the chains it schedules; larger batches run in `cu_seqlens` order.
pub const ORDERED_MAX_SEQUENCES: usize = 256;

/// The sequence block `z` of `nseq` runs: the one of rank `z` by decreasing token count (ties
/// by index) when `nseq <= ORDERED_MAX_SEQUENCES`, else `z`. `lens` is a shared
/// `[ORDERED_MAX_SEQUENCES]` i32 tile, `pick` a shared `[1]` i32 tile; `t` clamps the
/// sequence bounds as the chunk kernel does, so the ranks are a permutation of `0 .. nseq`
/// whatever `cu_seqlens` holds.
#[kda_macros::kernel_fn]
pub(crate) fn longest_first(cu_seqlens: Tensor, lens: Tile, pick: Tile, z: Val, nseq: Val, t: Val) -> Val {
    for (i,) in parallel(pick) {
        pick[i] = z;
    }
    if nseq <= ORDERED_MAX_SEQUENCES as i32 {
        for (i,) in parallel(lens) {
            let ni = min(i, nseq - 1);
            let start = sequence_start(cu_seqlens, ni, t);
            lens[i] = sequence_end(cu_seqlens, ni, t, start) - start;
        }
        for (i,) in parallel(lens) {
            let li = lens[i];
            let mut rank = 0;
            for j in serial(0, nseq) {
                let lj = lens[j];
                rank = rank + select(lj > li || (lj == li && j < i), 1, 0);
            }
            if i < nseq && rank == z {
                pick[0] = i;
            }
        }
    }
    pick[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{simulate, tensor_values};
    use kda_dsl::sim::SimArg;
    use kda_dsl::DType;
    use kda_macros::kernel;

    /// What the probe kernel is specialized for: the index dtype of `cu_seqlens`.
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct ProbeConfig {
        index: DType,
    }

    /// `order[z]` = the sequence block `z` runs.
    #[kernel]
    fn order_probe(
        cfg: &ProbeConfig,
        cu_seqlens: Global<(NC,), { cfg.index }>,
        order: GlobalMut<(NSEQ,), I32>,
        T: Dim,
    ) {
        let (z,) = launch(grid = [NSEQ], threads = 64);
        let lens = shared([ORDERED_MAX_SEQUENCES], I32);
        let pick = shared([1], I32);
        let one = shared([1], I32);
        let n = longest_first(cu_seqlens, lens, pick, z, NSEQ, T);
        for (i,) in parallel(one) {
            one[i] = n;
        }
        copy(one, order.tile_at([z], [1]));
    }

    /// Sequence indices by decreasing clamped length, ties by index: what the kernel must give.
    fn host_order(cu: &[i64], t: i64) -> Vec<i64> {
        let n = cu.len() - 1;
        let len = |i: usize| {
            let start = cu[i].clamp(0, t);
            cu[i + 1].clamp(start, t) - start
        };
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by_key(|&i| (std::cmp::Reverse(len(i)), i));
        idx.into_iter().map(|i| i as i64).collect()
    }

    fn probe(cu: &[i64], t: i64, index: DType) -> Vec<i64> {
        let def = order_probe(&ProbeConfig { index }).unwrap_or_else(|e| panic!("{e}"));
        let nseq = cu.len() - 1;
        let cu_bytes: Vec<u8> = match index {
            DType::I64 => cu.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => cu.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
        };
        let mut args = vec![
            ("cu_seqlens".to_string(), SimArg::Tensor(cu_bytes)),
            ("NC".to_string(), SimArg::I32(cu.len() as i32)),
            ("order".to_string(), SimArg::Tensor(vec![0xff; 4 * nseq])),
            ("NSEQ".to_string(), SimArg::I32(nseq as i32)),
            ("T".to_string(), SimArg::I32(t as i32)),
        ];
        simulate(&def, &mut args).unwrap_or_else(|e| panic!("{e}"));
        tensor_values(&args, "order", DType::I32).into_iter().map(|v| v as i64).collect()
    }

    fn cumulative(lens: &[i64]) -> Vec<i64> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |acc, l| {
                *acc += l;
                Some(*acc)
            }))
            .collect()
    }

    #[test]
    fn ragged_lengths_run_longest_first_ties_by_index() {
        let cu = cumulative(&[3, 40, 0, 17, 40, 1, 0, 16, 17]);
        let t = *cu.last().unwrap();
        for index in [DType::I32, DType::I64] {
            let got = probe(&cu, t, index);
            assert_eq!(got, host_order(&cu, t), "{index:?}");
            assert_eq!(got, vec![1, 4, 3, 8, 7, 0, 5, 2, 6]);
        }
    }

    #[test]
    fn out_of_range_offsets_still_give_a_permutation() {
        // Decreasing, negative and past-the-end offsets clamp as the chunk kernel's do.
        let cu = vec![0, 9, 4, -3, 30, 12];
        let got = probe(&cu, 20, DType::I64);
        assert_eq!(got, host_order(&cu, 20));
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, (0..5).collect::<Vec<_>>());
    }

    #[test]
    fn more_sequences_than_ordered_keep_their_order() {
        let lens: Vec<i64> = (0..ORDERED_MAX_SEQUENCES as i64 + 1).map(|i| i % 3).collect();
        let cu = cumulative(&lens);
        let got = probe(&cu, *cu.last().unwrap(), DType::I32);
        assert_eq!(got, (0..lens.len() as i64).collect::<Vec<_>>());
    }

    #[test]
    fn the_most_ordered_sequences_are_ordered() {
        let lens: Vec<i64> = (0..ORDERED_MAX_SEQUENCES as i64).map(|i| (i * 37) % 11).collect();
        let cu = cumulative(&lens);
        let t = *cu.last().unwrap();
        assert_eq!(probe(&cu, t, DType::I32), host_order(&cu, t));
    }
}
