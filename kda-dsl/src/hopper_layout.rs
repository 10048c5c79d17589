//! Hopper's operand layouts as values: the swizzle modes that TMA boxes write and `wgmma`
//! descriptors read ([`Swizzle`]), the canonical K-major shared tile ([`KMajorTile`]), its
//! matrix descriptor ([`MatrixDescriptor`]), and the warpgroup's register layouts: the f32
//! accumulator of `wgmma.m64nNk16` and the 16-bit A operand read from registers
//! ([`WgmmaFragment`]). The TMA box that fills a tile is [`crate::tensor_map::TensorMap`].
//!
//! The `wgmma` lowering names these layouts, and the simulator reads `wgmma` operands through
//! [`MatrixDescriptor::decode`]. Their tests check each against a decoder written from the PTX
//! ISA's description of the descriptor and the canonical layouts, not from the encoder.

/// The swizzle of a Hopper shared tile: within each atom of 8 lines of [`Swizzle::line_bytes`],
/// the address bits of the 16-byte chunk (as many as a line has chunks: 1, 2 or 3) are XORed
/// with the bits from 7 up (the 128-byte row), as CUTLASS's `Swizzle<B, 4, 3>`. A TMA box
/// written with one mode must be read by a descriptor of the same mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// No swizzle: the atom is an 8 x 16-byte core matrix.
    None,
    /// 32-byte lines.
    B32,
    /// 64-byte lines.
    B64,
    /// 128-byte lines.
    B128,
}

impl Swizzle {
    /// Every mode.
    pub const ALL: [Swizzle; 4] = [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128];

    /// Bytes of one line of an atom (16 without a swizzle: one row of a core matrix).
    pub fn line_bytes(self) -> u32 {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// Bytes of one atom (8 lines): the boundary the pattern repeats at, to which a tile's
    /// base is aligned.
    pub fn atom_bytes(self) -> u32 {
        8 * self.line_bytes()
    }

    /// The physical shared address of the byte at logical address `addr`: bits 4 and up (the
    /// 16-byte chunk) XOR bits 7 and up (the 128-byte line), as many bits as a line has chunks'
    /// index bits. An involution, and a permutation of every aligned atom.
    pub fn apply(self, addr: u32) -> u32 {
        let chunk_bits = (self.line_bytes() / 16).trailing_zeros();
        let mask = ((1 << chunk_bits) - 1) << 4;
        addr ^ ((addr >> 3) & mask)
    }

    /// The descriptor's 2-bit mode field.
    fn descriptor_mode(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }
}

/// Bytes of K one `wgmma` instruction reads: 16 elements of 16 bits (or 8 of 32, 32 of 8).
pub const WGMMA_K_BYTES: u32 = 32;

/// Which axis of a shared operand tile is contiguous: K (`imm-trans` 0) or M/N (`imm-trans` 1,
/// 16-bit types only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Major {
    /// K-major: a row's K elements are contiguous.
    K,
    /// MN-major: a K row's M (or N) elements are contiguous.
    MN,
}

/// An MN-major operand tile in the canonical layout of `swizzle`: `mn` (M or N) by `k` (a
/// multiple of 8) elements of `elem_bytes`. The MN axis is cut into blocks one line wide;
/// block `b` holds every K row's part of it, K rows a line apart (8 K rows: one atom), and the
/// blocks follow each other, `k` lines apart. Without a swizzle a block is one 16-byte column of
/// core matrices (8 K rows of 16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MnMajorTile {
    /// Elements along M or N; `mn * elem_bytes` a multiple of the line.
    pub mn: u32,
    /// Elements along K, a multiple of 8.
    pub k: u32,
    /// Bytes per element (2 for bf16 and f16).
    pub elem_bytes: u32,
    /// The swizzle.
    pub swizzle: Swizzle,
}

impl MnMajorTile {
    /// Bytes of the whole tile.
    pub fn bytes(&self) -> u32 {
        self.mn * self.k * self.elem_bytes
    }

    /// The byte offset of element (`mn`, `kk`) before the swizzle.
    pub fn logical_offset(&self, mn: u32, kk: u32) -> u32 {
        let line = self.swizzle.line_bytes();
        let mb = mn * self.elem_bytes;
        (mb / line) * self.k * line + kk * line + mb % line
    }

    /// The shared address of element (`mn`, `kk`) of the tile at `base` (aligned to the
    /// swizzle's atom).
    pub fn address(&self, base: u32, mn: u32, kk: u32) -> u32 {
        self.swizzle.apply(base + self.logical_offset(mn, kk))
    }

    /// The descriptor of the tile at `base` for K-step `step` (K rows `step * 16` onwards for
    /// 16-bit elements): its start is that step's first K row; with a swizzle, the leading
    /// offset steps from one MN block to the next and the stride from 8 K rows to the next;
    /// without one the roles swap: the leading offset steps 8 K rows, the stride one 16-byte
    /// MN column.
    pub fn descriptor(&self, base: u32, step: u32) -> MatrixDescriptor {
        let line = self.swizzle.line_bytes();
        let k_rows = step * WGMMA_K_BYTES / self.elem_bytes;
        let start = base + k_rows * line;
        let (leading, stride) = match self.swizzle {
            Swizzle::None => (8 * 16, self.k * 16),
            _ => (self.k * line, 8 * line),
        };
        MatrixDescriptor { start, leading, stride, swizzle: self.swizzle }
    }
}

/// A K-major operand tile in the canonical layout of `swizzle`: `rows` (M or N, a multiple of
/// 8) by `k` elements of `elem_bytes`. The k axis is cut into slabs one line wide; slab `s`
/// holds every row's part of it, rows a line apart (8 rows: one atom), and the slabs follow
/// each other, `rows` lines apart. Without a swizzle a slab is one 16-byte column of core
/// matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KMajorTile {
    /// Rows (the M or N extent), a multiple of 8.
    pub rows: u32,
    /// Elements along K; `k * elem_bytes` a multiple of the line.
    pub k: u32,
    /// Bytes per element (2 for bf16 and f16).
    pub elem_bytes: u32,
    /// The swizzle.
    pub swizzle: Swizzle,
}

impl KMajorTile {
    /// Bytes of the whole tile.
    pub fn bytes(&self) -> u32 {
        self.rows * self.k * self.elem_bytes
    }

    /// The byte offset of element (`row`, `kk`) before the swizzle.
    pub fn logical_offset(&self, row: u32, kk: u32) -> u32 {
        let line = self.swizzle.line_bytes();
        let kb = kk * self.elem_bytes;
        (kb / line) * self.rows * line + row * line + kb % line
    }

    /// The shared address of element (`row`, `kk`) of the tile at `base` (aligned to the
    /// swizzle's atom).
    pub fn address(&self, base: u32, row: u32, kk: u32) -> u32 {
        self.swizzle.apply(base + self.logical_offset(row, kk))
    }

    /// The descriptor of the tile at `base` for K-step `step` (the instruction's
    /// [`WGMMA_K_BYTES`] from `step * WGMMA_K_BYTES`): its start is that step's first byte in row
    /// 0; the stride between 8-row groups is an atom's 8 lines; without a swizzle, the leading
    /// offset steps from one 16-byte slab of K to the next (with one, K never leaves a line
    /// within a step, and the field is 1 by convention).
    pub fn descriptor(&self, base: u32, step: u32) -> MatrixDescriptor {
        let line = self.swizzle.line_bytes();
        let kb = step * WGMMA_K_BYTES;
        let start = base + (kb / line) * self.rows * line + kb % line;
        let (leading, stride) = match self.swizzle {
            Swizzle::None => (self.rows * 16, 8 * 16),
            _ => (16, 8 * line),
        };
        MatrixDescriptor { start, leading, stride, swizzle: self.swizzle }
    }
}

/// A shared `wgmma` operand tile of either major-ness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandTile {
    /// K contiguous.
    K(KMajorTile),
    /// M or N contiguous.
    MN(MnMajorTile),
}

impl OperandTile {
    /// Which axis is contiguous.
    pub fn major(&self) -> Major {
        match self {
            OperandTile::K(_) => Major::K,
            OperandTile::MN(_) => Major::MN,
        }
    }

    /// Elements along K.
    pub fn k(&self) -> u32 {
        match self {
            OperandTile::K(t) => t.k,
            OperandTile::MN(t) => t.k,
        }
    }

    /// Bytes of the whole tile.
    pub fn bytes(&self) -> u32 {
        match self {
            OperandTile::K(t) => t.bytes(),
            OperandTile::MN(t) => t.bytes(),
        }
    }

    /// The shared address of element (`mn`, `k`) of the tile at `base`.
    pub fn address(&self, base: u32, mn: u32, k: u32) -> u32 {
        match self {
            OperandTile::K(t) => t.address(base, mn, k),
            OperandTile::MN(t) => t.address(base, mn, k),
        }
    }

    /// The descriptor of the tile at `base` for K-step `step`.
    pub fn descriptor(&self, base: u32, step: u32) -> MatrixDescriptor {
        match self {
            OperandTile::K(t) => t.descriptor(base, step),
            OperandTile::MN(t) => t.descriptor(base, step),
        }
    }
}

/// A `wgmma` matrix descriptor's fields, in bytes (the encoding drops the low 4 bits of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixDescriptor {
    /// The matrix's start address in shared memory.
    pub start: u32,
    /// Leading dimension byte offset.
    pub leading: u32,
    /// Stride dimension byte offset.
    pub stride: u32,
    /// The swizzle mode.
    pub swizzle: Swizzle,
}

impl MatrixDescriptor {
    /// The 64-bit descriptor: start address in bits 0-13, leading offset 16-29, stride offset
    /// 32-45 (each in 16-byte units), base offset 49-51 (0: tiles start on an atom boundary),
    /// swizzle mode 62-63.
    pub fn encode(&self) -> u64 {
        let field = |bytes: u32| u64::from((bytes >> 4) & 0x3fff);
        field(self.start) | field(self.leading) << 16 | field(self.stride) << 32 | self.swizzle.descriptor_mode() << 62
    }

    /// The fields of a 64-bit descriptor (what the simulator's `wgmma` reads), or why it is not
    /// one this crate makes: a base offset (bits 49-51) other than 0.
    pub fn decode(bits: u64) -> Result<MatrixDescriptor, String> {
        if (bits >> 49) & 7 != 0 {
            return Err(format!("matrix descriptor {bits:#x} has a base offset; tiles here start on an atom boundary"));
        }
        let bytes = |shift: u32| (((bits >> shift) & 0x3fff) as u32) << 4;
        let swizzle = match bits >> 62 {
            0 => Swizzle::None,
            1 => Swizzle::B128,
            2 => Swizzle::B64,
            _ => Swizzle::B32,
        };
        Ok(MatrixDescriptor { start: bytes(0), leading: bytes(16), stride: bytes(32), swizzle })
    }

    /// The shared address of the operand element at `mn` (its M or N index) and `k` (0..16
    /// for 16-bit elements) of a `major` tile of `elem_bytes` elements.
    ///
    /// K-major: without a swizzle, 8 x 16-byte core matrices, the next 8 rows `stride` bytes on
    /// and the next 16 bytes of K `leading` bytes on; with one, rows a line apart within an atom
    /// of 8, the next 8 rows `stride` bytes on. MN-major: with a swizzle, K rows a line apart
    /// within an atom of 8, the next 8 K rows `stride` bytes on and the next line of MN `leading`
    /// bytes on; without one, K rows 16 bytes apart, the next 8 K rows `leading` bytes on and
    /// the next 16 bytes of MN `stride` bytes on. The swizzle permutes the address last.
    pub fn address(&self, major: Major, mn: u32, k: u32, elem_bytes: u32) -> u32 {
        let line = self.swizzle.line_bytes();
        let (row, row_bytes) = match major {
            Major::K => (mn, k * elem_bytes),
            Major::MN => (k, mn * elem_bytes),
        };
        let unswizzled = match (major, self.swizzle) {
            (Major::K, Swizzle::None) => {
                (row / 8) * self.stride + (row_bytes / 16) * self.leading + (row % 8) * 16 + row_bytes % 16
            }
            (Major::K, _) => (row / 8) * self.stride + (row % 8) * line + row_bytes,
            (Major::MN, Swizzle::None) => {
                (row / 8) * self.leading + (row_bytes / 16) * self.stride + (row % 8) * 16 + row_bytes % 16
            }
            (Major::MN, _) => {
                (row / 8) * self.stride + (row_bytes / line) * self.leading + (row % 8) * line + row_bytes % line
            }
        };
        self.swizzle.apply(self.start + unswizzled)
    }
}

/// Which register layout a warpgroup's `wgmma` fragment has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaFragment {
    /// The f32 accumulator of `wgmma.m64nNk16`: 64 rows by `n` columns over the warpgroup's
    /// 128 threads, `n / 2` registers each.
    Accumulator {
        /// Columns, a multiple of 8 up to 256.
        n: u32,
    },
    /// The 16-bit A operand from registers, 64 rows by 16 (one K-step), 4 registers of two
    /// halves each.
    RegisterA,
}

impl WgmmaFragment {
    /// Values each thread holds (an accumulator register holds one, an A register two).
    pub fn values_per_thread(self) -> u32 {
        match self {
            WgmmaFragment::Accumulator { n } => n / 2,
            WgmmaFragment::RegisterA => 8,
        }
    }

    /// The (row, column) of value `v` of thread `thread` (0..128): warp `thread / 32` holds rows
    /// 16 · warp onwards; in it lane `(g, t) = (lane / 4, lane % 4)` holds, per 8-column block,
    /// rows `g` and `g + 8`, columns `2t` and `2t + 1`, as `mma.sync`'s m16n8 fragments do.
    pub fn coord(self, thread: u32, v: u32) -> (u32, u32) {
        let (warp, lane) = (thread / 32, thread % 32);
        let (g, t) = (lane / 4, lane % 4);
        let (block, pair) = match self {
            // Value v: column block v / 4, then the row half (v / 2) % 2, then the column v % 2.
            WgmmaFragment::Accumulator { .. } => (v / 4, v % 4),
            // Register r = v / 2 holds a pair: r 0 and 1 the first 8 columns (rows g, g + 8),
            // r 2 and 3 the next 8.
            WgmmaFragment::RegisterA => (v / 4, v % 4),
        };
        (16 * warp + g + 8 * (pair / 2), 8 * block + 2 * t + pair % 2)
    }

    /// The accumulator value whose bits become value `v` of the A operand of K-step `kk`, when
    /// an accumulator of `n` columns (its columns the K of the next product) is converted to
    /// 16-bit pairs in registers: the same thread holds both, value for value.
    pub fn accumulator_value_for_a(kk: u32, v: u32) -> u32 {
        4 * (2 * kk + v / 4) + v % 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_map::TensorMap;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// A descriptor's fields back from its 64 bits, as the PTX ISA's table lays them out (start
    /// address bits 0-13, leading offset 16-29, stride offset 32-45, each in 16-byte units;
    /// mode 62-63: 0 none, 1 128B, 2 64B, 3 32B).
    fn decode(d: u64) -> (u32, u32, u32, Swizzle) {
        let bytes = |shift: u32| (((d >> shift) & 0x3fff) as u32) << 4;
        let mode = match d >> 62 {
            0 => Swizzle::None,
            1 => Swizzle::B128,
            2 => Swizzle::B64,
            _ => Swizzle::B32,
        };
        (bytes(0), bytes(16), bytes(32), mode)
    }

    /// The address `wgmma` reads for operand element (`mn`, `k`) of a `major` tile of
    /// 16-bit elements, from the descriptor alone, evaluating the PTX ISA's canonical layouts
    /// as CuTe layouts in elements (T = 8 elements per 16 bytes, W = 16-byte chunks per
    /// swizzle line; LBO and SBO in elements):
    /// - K-major, no swizzle: `((8,m),(T,2k)):((T,SBO),(1,LBO))`; swizzled:
    ///   `((8,m),(T,2k)):((W·T,SBO),(1,T))`;
    /// - MN-major, no swizzle: `((T,1,m),(8,k)):((1,T,SBO),(T,LBO))`; swizzled:
    ///   `((T,W,m),(8,k)):((1,T,LBO),(W·T,SBO))`;
    ///
    /// then `Swizzle<log2 W, 4, 3>` on the byte address.
    fn wgmma_reads(d: u64, major: Major, mn: u32, k: u32) -> u32 {
        const T: u32 = 8;
        let (start, leading, stride, mode) = decode(d);
        let (lbo, sbo) = (leading / 2, stride / 2);
        let w = mode.line_bytes() / 16;
        // A coordinate split by a shape's modes, dotted with their strides.
        // (The last mode takes what is left; its size is not used.)
        let eval = |mut x: u32, modes: &[(u32, u32)]| {
            let (last, inner) = modes.split_last().expect("a mode");
            let mut offset = 0;
            for (size, step) in inner {
                offset += (x % size) * step;
                x /= size;
            }
            offset + x * last.1
        };
        let elems = match (major, mode) {
            (Major::K, Swizzle::None) => eval(mn, &[(8, T), (0, sbo)]) + eval(k, &[(T, 1), (0, lbo)]),
            (Major::K, _) => eval(mn, &[(8, w * T), (0, sbo)]) + eval(k, &[(T, 1), (0, T)]),
            (Major::MN, Swizzle::None) => eval(mn, &[(T, 1), (1, T), (0, sbo)]) + eval(k, &[(8, T), (0, lbo)]),
            (Major::MN, _) => eval(mn, &[(T, 1), (w, T), (0, lbo)]) + eval(k, &[(8, w * T), (0, sbo)]),
        };
        let addr = start + 2 * elems;
        let bits = w.trailing_zeros();
        addr ^ ((addr >> 3) & (((1 << bits) - 1) << 4))
    }

    fn swizzle() -> impl Strategy<Value = Swizzle> {
        prop::sample::select(Swizzle::ALL.to_vec())
    }

    /// A K-major tile of 16-bit elements: rows a multiple of 8 (up to 256), K whole lines and
    /// whole instruction steps.
    fn tile() -> impl Strategy<Value = KMajorTile> {
        (swizzle(), 1u32..=32, 1u32..=4).prop_map(|(swizzle, row_groups, lines)| {
            let line_elems = swizzle.line_bytes() / 2;
            let k = (lines * line_elems).next_multiple_of(WGMMA_K_BYTES / 2);
            KMajorTile { rows: 8 * row_groups, k, elem_bytes: 2, swizzle }
        })
    }

    /// An MN-major tile of 16-bit elements: MN whole lines (up to 256 elements), K whole
    /// instruction steps (up to 64).
    fn mn_tile() -> impl Strategy<Value = MnMajorTile> {
        (swizzle(), 1u32..=4, 1u32..=4).prop_map(|(swizzle, steps, lines)| {
            let line_elems = swizzle.line_bytes() / 2;
            let mn = (lines * line_elems).next_multiple_of(8).min(256);
            MnMajorTile { mn, k: 16 * steps, elem_bytes: 2, swizzle }
        })
    }

    proptest! {
        /// The swizzle undoes itself and permutes every aligned atom.
        #[test]
        fn a_swizzle_is_an_involution_that_keeps_each_atom(mode in swizzle(), addr in 0u32..(1 << 18)) {
            let s = mode.apply(addr);
            prop_assert_eq!(mode.apply(s), addr);
            prop_assert_eq!(s / mode.atom_bytes(), addr / mode.atom_bytes());
        }

        /// Every element of a tile has its own address, inside the tile.
        #[test]
        fn a_tile_maps_its_elements_one_to_one_onto_its_bytes(t in tile(), atoms in 0u32..16) {
            let base = atoms * 1024;
            let mut seen = HashSet::new();
            for row in 0..t.rows {
                for kk in 0..t.k {
                    let a = t.address(base, row, kk);
                    prop_assert!(a >= base && a + t.elem_bytes <= base + t.bytes(), "({row}, {kk}) at {a}");
                    prop_assert!(a % t.elem_bytes == 0);
                    prop_assert!(seen.insert(a), "({row}, {kk}) shares {a}");
                }
            }
        }

        /// What `wgmma` reads through each K-step's descriptor is the element the tile put
        /// there: the ISA's reading of the descriptor agrees with the layout, element by
        /// element.
        #[test]
        fn each_steps_descriptor_reads_the_tiles_elements(t in tile(), atoms in 0u32..16) {
            let base = atoms * 1024;
            for step in 0..t.k * t.elem_bytes / WGMMA_K_BYTES {
                let d = t.descriptor(base, step).encode();
                for row in 0..t.rows {
                    for kb in (0..WGMMA_K_BYTES).step_by(t.elem_bytes as usize) {
                        let kk = (step * WGMMA_K_BYTES + kb) / t.elem_bytes;
                        let reads = wgmma_reads(d, Major::K, row, kb / 2);
                        prop_assert_eq!(reads, t.address(base, row, kk), "step {}, row {}, byte {}", step, row, kb);
                        let decoded = MatrixDescriptor::decode(d).expect("no base offset");
                        prop_assert_eq!(decoded.address(Major::K, row, kb / 2, 2), reads);
                    }
                }
            }
        }

        /// Every element of an MN-major tile has its own address, inside the tile.
        #[test]
        fn an_mn_major_tile_maps_its_elements_one_to_one_onto_its_bytes(t in mn_tile(), atoms in 0u32..16) {
            let base = atoms * 1024;
            let mut seen = HashSet::new();
            for mn in 0..t.mn {
                for kk in 0..t.k {
                    let a = t.address(base, mn, kk);
                    prop_assert!(a >= base && a + t.elem_bytes <= base + t.bytes(), "({mn}, {kk}) at {a}");
                    prop_assert!(seen.insert(a), "({mn}, {kk}) shares {a}");
                }
            }
        }

        /// What `wgmma` reads through an MN-major tile's descriptors (`imm-trans` 1) is the
        /// element the tile put there, for every K-step.
        #[test]
        fn each_steps_descriptor_reads_the_mn_major_tiles_elements(t in mn_tile(), atoms in 0u32..16) {
            let base = atoms * 1024;
            for step in 0..t.k / 16 {
                let d = t.descriptor(base, step).encode();
                let decoded = MatrixDescriptor::decode(d).expect("no base offset");
                for mn in 0..t.mn {
                    for k in 0..16 {
                        let reads = wgmma_reads(d, Major::MN, mn, k);
                        prop_assert_eq!(reads, t.address(base, mn, 16 * step + k), "step {}, mn {}, k {}", step, mn, k);
                        prop_assert_eq!(decoded.address(Major::MN, mn, k, 2), reads);
                    }
                }
            }
        }

        /// A K-major tile is what TMA boxes one swizzle line wide write, a box per slab of K.
        #[test]
        fn tma_boxes_fill_a_k_major_tile(t in tile().prop_filter("swizzled", |t| t.swizzle != Swizzle::None), atoms in 0u32..16) {
            let base = atoms * 1024;
            let line_elems = t.swizzle.line_bytes() / t.elem_bytes;
            let extent = [u64::from(t.k), u64::from(t.rows)];
            let map = TensorMap::two_d(t.elem_bytes, extent, u64::from(t.k * t.elem_bytes), [line_elems, t.rows], t.swizzle);
            prop_assert_eq!(map.check(), Ok(()));
            for slab in 0..t.k / line_elems {
                let box_base = base + slab * map.box_bytes();
                for row in 0..t.rows {
                    for kk in 0..line_elems {
                        let index = [kk, row, 0, 0, 0];
                        prop_assert_eq!(box_base + map.shared_offset(index), t.address(base, row, slab * line_elems + kk));
                        let from = map.global_offset([i64::from(slab * line_elems), 0, 0, 0, 0], index);
                        prop_assert_eq!(from, Some(u64::from(row * t.k + slab * line_elems + kk) * 2));
                    }
                }
            }
        }

        /// The encoding keeps every field (addresses in shared memory's 18 bits, 16-byte
        /// aligned).
        #[test]
        fn a_descriptor_decodes_to_its_fields(
            start in 0u32..(1 << 14), leading in 0u32..(1 << 14), stride in 0u32..(1 << 14), mode in swizzle(),
        ) {
            let d = MatrixDescriptor { start: start << 4, leading: leading << 4, stride: stride << 4, swizzle: mode };
            prop_assert_eq!(decode(d.encode()), (d.start, d.leading, d.stride, mode));
        }
    }

    /// The accumulator spreads 64 x N over the warpgroup's threads one value each, and so does
    /// the register A operand over 64 x 16.
    #[test]
    fn wgmma_fragments_hold_every_element_once() {
        for (frag, cols) in
            (1..=32).map(|b| (WgmmaFragment::Accumulator { n: 8 * b }, 8 * b)).chain([(WgmmaFragment::RegisterA, 16)])
        {
            let mut seen = HashSet::new();
            for thread in 0..128 {
                for v in 0..frag.values_per_thread() {
                    let (r, c) = frag.coord(thread, v);
                    assert!(r < 64 && c < cols, "{frag:?}: thread {thread} value {v} at ({r}, {c})");
                    assert!(seen.insert((r, c)), "{frag:?}: ({r}, {c}) twice");
                }
            }
            assert_eq!(seen.len() as u32, 64 * cols);
        }
    }

    /// An accumulator converted to the A operand of the next product (the KDA state's trick):
    /// each A value is the same thread's accumulator value at the same (row, K) position.
    #[test]
    fn an_accumulator_is_its_own_register_a_operand() {
        let acc = WgmmaFragment::Accumulator { n: 128 };
        for kk in 0..8 {
            for thread in 0..128 {
                for v in 0..8 {
                    let (r, c) = WgmmaFragment::RegisterA.coord(thread, v);
                    let from = WgmmaFragment::accumulator_value_for_a(kk, v);
                    assert_eq!(acc.coord(thread, from), (r, 16 * kk + c), "k-step {kk}, thread {thread}, value {v}");
                }
            }
        }
    }
}
