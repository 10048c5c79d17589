//! A TMA tensor map as a value: the tiled view of a global tensor of 1 to 5 axes that
//! `cuTensorMapEncodeTiled` encodes, and where each element of one of its boxes comes from and
//! lands. The runtime encodes it, the simulator copies by it, and the tests decode it, all from
//! this one description.

use crate::hopper_layout::Swizzle;

/// The most axes a tensor map has (`cp.async.bulk.tensor.1d` to `.5d`).
pub const MAX_TENSOR_MAP_RANK: usize = 5;

/// The most bytes one box may fill: a block's shared memory on compute capability 9.0.
pub const MAX_BOX_BYTES: u64 = 227 * 1024;

/// Per axis of a box, the inner (contiguous) axis first: an element's index in the box, or a
/// box's element coordinates in the tensor. Axes past the map's rank are 0.
pub type BoxIndex<T> = [T; MAX_TENSOR_MAP_RANK];

/// A TMA tensor map's tiled view of a global tensor: `extent` elements per axis (the inner,
/// contiguous axis first), each further axis `strides` bytes from one index to the next, copied
/// a box of `box_extent` elements at a time into shared memory, where the box's rows (its
/// inner axis) follow each other in the order of the outer axes and `swizzle` permutes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap {
    /// Bytes per element.
    pub elem_bytes: u32,
    /// Axes, 1 to [`MAX_TENSOR_MAP_RANK`].
    pub rank: usize,
    /// The tensor's extent in elements per axis, inner first; 1 past the rank.
    pub extent: BoxIndex<u64>,
    /// Bytes from one index to the next of axes 1 to `rank - 1` (the inner axis is
    /// contiguous); 0 past them.
    pub strides: [u64; MAX_TENSOR_MAP_RANK - 1],
    /// The box's extent in elements per axis, inner first; 1 past the rank.
    pub box_extent: BoxIndex<u32>,
    /// The swizzle of the box in shared memory.
    pub swizzle: Swizzle,
}

impl TensorMap {
    /// The map over a tensor whose elements are packed (each axis's stride the next inner
    /// axis's times its extent), `extent` and `box_extent` inner first, one entry per axis;
    /// `None` when their lengths differ or are not 1 to 5.
    pub fn packed(elem_bytes: u32, extent: &[u64], box_extent: &[u32], swizzle: Swizzle) -> Option<TensorMap> {
        let rank = extent.len();
        if !(1..=MAX_TENSOR_MAP_RANK).contains(&rank) || box_extent.len() != rank {
            return None;
        }
        let mut map = TensorMap { elem_bytes, rank, extent: [1; 5], strides: [0; 4], box_extent: [1; 5], swizzle };
        map.extent[..rank].copy_from_slice(extent);
        map.box_extent[..rank].copy_from_slice(box_extent);
        let mut stride = u64::from(elem_bytes);
        for axis in 1..rank {
            stride = stride.saturating_mul(extent[axis - 1]);
            map.strides[axis - 1] = stride;
        }
        Some(map)
    }

    /// A 2-D map: `extent` and `box_extent` as `[inner, outer]`, rows `row_stride` bytes apart.
    pub const fn two_d(
        elem_bytes: u32,
        extent: [u64; 2],
        row_stride: u64,
        box_extent: [u32; 2],
        swizzle: Swizzle,
    ) -> TensorMap {
        TensorMap {
            elem_bytes,
            rank: 2,
            extent: [extent[0], extent[1], 1, 1, 1],
            strides: [row_stride, 0, 0, 0],
            box_extent: [box_extent[0], box_extent[1], 1, 1, 1],
            swizzle,
        }
    }

    /// Why the hardware (or this crate) would not take the map: 1 to 5 axes; elements of 1,
    /// 2, 4 or 8 bytes; box extents 1 to 256 with whole 16-byte rows; with a swizzle, rows
    /// exactly one swizzle line (the layout the `wgmma` descriptors read; the hardware also
    /// takes narrower ones); extents 1 to 2^32; strides of whole 16 bytes below 2^40, the first
    /// covering a row.
    pub fn check(&self) -> Result<(), String> {
        let rank = self.rank;
        if !(1..=MAX_TENSOR_MAP_RANK).contains(&rank) {
            return Err(format!("tensor map of {rank} axes: expected 1 to {MAX_TENSOR_MAP_RANK}"));
        }
        if self.extent[rank..].iter().any(|e| *e != 1) || self.box_extent[rank..].iter().any(|b| *b != 1) {
            return Err(format!("tensor map of {rank} axes: extents past them must be 1"));
        }
        if ![1, 2, 4, 8].contains(&self.elem_bytes) {
            return Err(format!("tensor map element of {} bytes: expected 1, 2, 4 or 8", self.elem_bytes));
        }
        let box_extent = &self.box_extent[..rank];
        if box_extent.iter().any(|b| !(1..=256).contains(b)) {
            return Err(format!("tensor map box {box_extent:?}: each extent must be 1 to 256"));
        }
        let box_bytes = box_extent.iter().map(|b| u64::from(*b)).product::<u64>() * u64::from(self.elem_bytes);
        if box_bytes > MAX_BOX_BYTES {
            return Err(format!("tensor map box of {box_bytes} bytes: at most {MAX_BOX_BYTES} (shared memory)"));
        }
        let row_bytes = self.row_bytes();
        if !row_bytes.is_multiple_of(16) {
            return Err(format!("tensor map box rows of {row_bytes} bytes: expected a multiple of 16"));
        }
        if self.swizzle != Swizzle::None && row_bytes != self.swizzle.line_bytes() {
            return Err(format!(
                "tensor map box rows of {row_bytes} bytes with the {:?} swizzle: expected {} (one line)",
                self.swizzle,
                self.swizzle.line_bytes()
            ));
        }
        let extent = &self.extent[..rank];
        if extent.iter().any(|e| !(1..=1 << 32).contains(e)) {
            return Err(format!("tensor map extent {extent:?}: each must be 1 to 2^32"));
        }
        let row = self.extent[0] * u64::from(self.elem_bytes);
        for (axis, &stride) in self.strides[..rank - 1].iter().enumerate() {
            let least = if axis == 0 { row } else { 0 };
            if !stride.is_multiple_of(16) || stride >= 1 << 40 || stride < least {
                return Err(format!(
                    "tensor map stride {stride} of axis {}: expected a multiple of 16 below 2^40, at least a row's {row} bytes",
                    axis + 1
                ));
            }
        }
        Ok(())
    }

    /// Bytes of one row of a box (its inner axis) in shared memory.
    fn row_bytes(&self) -> u32 {
        self.box_extent[0] * self.elem_bytes
    }

    /// Bytes one box fills in shared memory.
    pub fn box_bytes(&self) -> u32 {
        self.box_extent[..self.rank].iter().product::<u32>() * self.elem_bytes
    }

    /// Every element index of a box, the inner axis fastest (the order its bytes land in).
    pub fn box_elements(&self) -> impl Iterator<Item = BoxIndex<u32>> + '_ {
        let count = self.box_extent.iter().product::<u32>();
        (0..count).map(|mut linear| {
            let mut index = [0; MAX_TENSOR_MAP_RANK];
            for (i, extent) in index.iter_mut().zip(self.box_extent) {
                *i = linear % extent;
                linear /= extent;
            }
            index
        })
    }

    /// Where box element `index` lands, in bytes from the box's shared base (which is aligned
    /// to the swizzle's atom): its row is the position of its outer indices in the box.
    pub fn shared_offset(&self, index: BoxIndex<u32>) -> u32 {
        let mut row = 0;
        for axis in (1..self.rank).rev() {
            row = row * self.box_extent[axis] + index[axis];
        }
        self.swizzle.apply(row * self.row_bytes() + index[0] * self.elem_bytes)
    }

    /// The global byte offset box element `index` of the box at element coordinates `at`
    /// comes from (or goes to), or `None` outside the tensor (a load writes zeros there, a
    /// store skips it).
    pub fn global_offset(&self, at: BoxIndex<i64>, index: BoxIndex<u32>) -> Option<u64> {
        let mut offset = 0u64;
        for axis in 0..self.rank {
            let c = u64::try_from(at[axis] + i64::from(index[axis])).ok().filter(|c| *c < self.extent[axis])?;
            let stride = if axis == 0 { u64::from(self.elem_bytes) } else { self.strides[axis - 1] };
            offset += c * stride;
        }
        Some(offset)
    }

    /// Bytes from the tensor's start to the end of its last element (what its buffer must
    /// hold), `None` past 2^64.
    pub fn span_bytes(&self) -> Option<u64> {
        let last_row = self.strides[..self.rank - 1]
            .iter()
            .zip(&self.extent[1..self.rank])
            .try_fold(0u64, |sum, (stride, extent)| sum.checked_add(stride.checked_mul(extent - 1)?))?;
        last_row.checked_add(self.extent[0] * u64::from(self.elem_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A packed map of 2 to 5 axes of 16-bit elements, its rows one 128-byte line.
    fn packed_map() -> impl Strategy<Value = TensorMap> {
        (prop::collection::vec(1u64..6, 1..=4), prop::collection::vec(1u32..4, 4), 1u64..3).prop_map(
            |(outer, boxes, lines)| {
                let extent: Vec<u64> = [64 * lines].into_iter().chain(outer.iter().copied()).collect();
                let box_extent: Vec<u32> = [64].into_iter().chain(boxes[..outer.len()].iter().copied()).collect();
                TensorMap::packed(2, &extent, &box_extent, Swizzle::B128).expect("rank 2 to 5")
            },
        )
    }

    proptest! {
        /// Each box element comes from the element its coordinates name in a row-major
        /// tensor, or from nowhere outside it; the box's elements land at distinct offsets
        /// inside the box, rows in the order of the outer axes.
        #[test]
        fn a_box_reads_its_elements_in_row_major_order(map in packed_map(), at in prop::collection::vec(-3i64..8, 5)) {
            prop_assert_eq!(map.check(), Ok(()));
            let at: BoxIndex<i64> = std::array::from_fn(|a| if a < map.rank { at[a] } else { 0 });
            let mut seen = std::collections::HashSet::new();
            for index in map.box_elements() {
                let landed = map.shared_offset(index);
                prop_assert!(landed < map.box_bytes() && seen.insert(landed), "{:?} at {}", index, landed);
                let coords: Vec<i64> = (0..map.rank).map(|a| at[a] + i64::from(index[a])).collect();
                let inside = coords.iter().zip(&map.extent).all(|(c, e)| (0..*e as i64).contains(c));
                // Row-major over the outer-first shape, written out from the extents alone.
                let linear = (0..map.rank).rev().fold(0i64, |l, a| l * map.extent[a] as i64 + coords[a]);
                let want = inside.then(|| linear as u64 * 2);
                prop_assert_eq!(map.global_offset(at, index), want, "{:?}", index);
            }
            prop_assert_eq!(seen.len() as u32, map.box_bytes() / 2);
            prop_assert_eq!(map.span_bytes(), Some(map.extent[..map.rank].iter().product::<u64>() * 2));
        }

        /// Box elements outside the tensor have no source, on either side of either axis.
        #[test]
        fn box_elements_outside_the_tensor_are_zero_filled(
            x in -300i64..300, y in -300i64..300, inner in 0u32..64, outer in 0u32..256, w in 1u64..200, h in 1u64..200,
        ) {
            let map = TensorMap::two_d(2, [w, h], (w * 2).next_multiple_of(16), [64, 256], Swizzle::B128);
            let (gx, gy) = (x + i64::from(inner), y + i64::from(outer));
            let inside = (0..w as i64).contains(&gx) && (0..h as i64).contains(&gy);
            prop_assert_eq!(map.global_offset([x, y, 0, 0, 0], [inner, outer, 0, 0, 0]).is_some(), inside);
        }
    }

    /// Each rule of a tensor map names what it expected.
    #[test]
    fn tensor_maps_the_hardware_would_refuse_are_errors() {
        let ok = TensorMap::two_d(2, [64, 100], 128, [64, 64], Swizzle::B128);
        assert_eq!(ok.check(), Ok(()));
        let three = TensorMap::packed(2, &[64, 4, 100], &[64, 1, 64], Swizzle::B128).expect("3 axes");
        assert_eq!(three.check(), Ok(()));
        assert_eq!(TensorMap::packed(2, &[64, 4], &[64], Swizzle::B128), None);
        for (bad, expected) in [
            (TensorMap { elem_bytes: 3, ..ok }, "expected 1, 2, 4 or 8"),
            (TensorMap { rank: 6, ..ok }, "expected 1 to 5"),
            (TensorMap { box_extent: [64, 257, 1, 1, 1], ..ok }, "each extent must be 1 to 256"),
            (TensorMap { box_extent: [4, 64, 1, 1, 1], swizzle: Swizzle::None, ..ok }, "expected a multiple of 16"),
            (TensorMap { box_extent: [32, 64, 1, 1, 1], ..ok }, "expected 128 (one line)"),
            (TensorMap { extent: [0, 100, 1, 1, 1], ..ok }, "each must be 1 to 2^32"),
            (TensorMap { strides: [120, 0, 0, 0], ..ok }, "expected a multiple of 16"),
            (TensorMap { strides: [112, 0, 0, 0], ..ok }, "at least a row's 128 bytes"),
            (TensorMap { strides: [128, 8, 0, 0], ..three }, "stride 8 of axis 2"),
            (TensorMap { box_extent: [64, 64, 2, 1, 1], ..ok }, "extents past them must be 1"),
            (TensorMap::packed(2, &[64, 256, 256], &[64, 256, 256], Swizzle::B128).expect("3 axes"), "at most 232448"),
        ] {
            let e = bad.check().expect_err("refused");
            assert!(e.contains(expected), "{bad:?}: {e}");
        }
    }
}
