//! TMA tensor maps, encoded on the host from the same [`TensorMap`] the simulator reads.
//!
//! A kernel that copies with `cp.async.bulk.tensor` takes a `CUtensorMap` (128 bytes, aligned
//! to 64) as a by-value parameter. The map is built with the driver's
//! `cuTensorMapEncodeTiled` for each call (a host-only call, legal while a stream captures a
//! graph, which keeps the parameter's bytes), from the tensor's device address and the
//! [`TensorMap`] that describes its extents, strides, box and swizzle. The simulator takes the
//! same `TensorMap`, so what it checks is what the hardware is told.

use cudarc::driver::sys;
use kda_dsl::hopper_layout::Swizzle;
use kda_dsl::tensor_map::TensorMap;

use crate::error::{DriverResultExt, RuntimeError};

/// A `CUtensorMap` ready to pass as a kernel's by-value tensor-map parameter.
#[derive(Clone, Copy, Debug)]
pub struct TensorMapParam(sys::CUtensorMap);

impl PartialEq for TensorMapParam {
    fn eq(&self, other: &Self) -> bool {
        self.0.opaque == other.0.opaque
    }
}

impl TensorMapParam {
    /// All zero bytes: no map, a placeholder in arrays of them.
    pub const ZERO: TensorMapParam = TensorMapParam(sys::CUtensorMap { opaque: [0; 16] });

    /// The encoded map, for `cuLaunchKernel`'s parameter array (the pointer must outlive the
    /// launch call, not the kernel: the driver copies the 128 bytes at launch).
    pub fn as_param(&mut self) -> *mut std::ffi::c_void {
        (&mut self.0 as *mut sys::CUtensorMap).cast()
    }
}

/// Global addresses a tensor map takes: aligned to 16 bytes.
pub const TENSOR_MAP_ADDRESS_ALIGN: u64 = 16;

/// Encodes `map` over the device tensor at `address` (of `bytes` bytes; the map's last
/// element must end inside it). `name` is the argument the errors name. The elements are copied as raw
/// 1-, 2-, 4- or 8-byte words, and boxes reaching past the extents are zero filled. Without a
/// CUDA driver: [`RuntimeError::NoGpu`].
pub fn encode_tensor_map(
    name: &str,
    map: &TensorMap,
    address: u64,
    bytes: u64,
) -> Result<TensorMapParam, RuntimeError> {
    map.check().map_err(|e| RuntimeError::bad_argument(name, "a tensor map the hardware takes", e))?;
    if !address.is_multiple_of(TENSOR_MAP_ADDRESS_ALIGN) {
        return Err(RuntimeError::bad_argument(
            name,
            format!("a device address aligned to {TENSOR_MAP_ADDRESS_ALIGN} bytes"),
            format!("{address:#x}"),
        ));
    }
    let needed = map.span_bytes();
    if needed.is_none_or(|n| n > bytes) {
        let need = needed.map_or("more than 2^64".to_string(), |n| n.to_string());
        let rank = map.rank;
        return Err(RuntimeError::bad_argument(
            name,
            format!(
                "a tensor of at least {need} bytes for extents {:?} and strides {:?}",
                &map.extent[..rank],
                &map.strides[..rank - 1]
            ),
            format!("{bytes} bytes"),
        ));
    }
    // cudarc panics on a driver call without the driver library: say so instead.
    crate::device::device_count()?;
    use sys::CUtensorMapDataType as D;
    let data_type = match map.elem_bytes {
        1 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2 => D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        _ => D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
    };
    use sys::CUtensorMapSwizzle as S;
    let swizzle = match map.swizzle {
        Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    // Arrays of 5 (one stride fewer: the inner axis is contiguous), read up to the rank.
    let (dims, strides, box_dims) = (map.extent, map.strides, map.box_extent);
    let element_strides = [1u32; 5];
    let mut out = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer is to a live local array of at least the rank's length (the strides
    // one shorter; `check` bounds the rank by 5); `out` is a properly aligned CUtensorMap the
    // call writes.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut out,
            data_type,
            map.rank as u32,
            address as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .op("cuTensorMapEncodeTiled")?;
    Ok(TensorMapParam(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: TensorMap = TensorMap::two_d(2, [100, 20], 208, [64, 16], Swizzle::B128);

    /// Bad maps, addresses and sizes are typed errors naming the argument, found before the
    /// driver is called (so they hold on a machine without one).
    #[test]
    fn bad_maps_are_refused_before_the_driver() {
        let bad_box = TensorMap { box_extent: [32, 16, 1, 1, 1], ..MAP };
        let four = TensorMap::packed(2, &[64, 3, 5, 2], &[64, 1, 4, 1], Swizzle::B128).expect("4 axes");
        for (map, address, bytes, expected) in [
            (bad_box, 0x1000, 1 << 20, "with the B128 swizzle: expected 128 (one line)"),
            (MAP, 0x1008, 1 << 20, "aligned to 16 bytes"),
            (MAP, 0x1000, 208 * 19 + 199, "at least 4152 bytes"),
            (four, 0x1000, 64 * 3 * 5 * 2 * 2 - 2, "at least 3840 bytes for extents [64, 3, 5, 2]"),
        ] {
            let e = encode_tensor_map("b_map", &map, address, bytes).expect_err("refused").to_string();
            assert!(e.contains("b_map") && e.contains(expected), "{e}");
        }
    }
}
