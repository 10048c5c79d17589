//! Views of an engine's own cudarc buffers (`CudaSlice`, `CudaView`, `CudaViewMut`, or a byte
//! arena), checked against the shape and dtype and borrowing the buffer, so that a view cannot
//! outlive it.
//!
//! cudarc tracks each buffer's last read and write with events (unless the context's event
//! tracking is off): taking a buffer's address makes the stream wait for its last write (and,
//! for writing, its last read), and dropping the view records the stream's work as the
//! buffer's newest read or write. With CUDA graphs, make the views before capture begins and
//! drop them after it ends, so that neither wait nor record happens inside the capture; or use
//! one stream for everything; or turn tracking off
//! (`CudaContext::disable_event_tracking`) and order the streams yourself.

use std::ops::Deref;

use cudarc::driver::CudaStream;
use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};
use kda_dsl::dtype::DType;

use crate::error::RuntimeError;
use crate::tensor::TensorView;

/// A Rust element type a cudarc buffer may hold, and the dtypes a view of it may have.
pub trait Element {
    /// Whether a buffer of `Self` may be viewed as `dtype` (the same width and meaning; `u16`
    /// stores either 16-bit float).
    fn holds(dtype: DType) -> bool;
}

macro_rules! element {
    ($t:ty => $($d:ident)|+) => {
        impl Element for $t {
            fn holds(dtype: DType) -> bool {
                matches!(dtype, $(DType::$d)|+)
            }
        }
    };
}
element!(f32 => F32);
element!(half::f16 => F16);
element!(half::bf16 => BF16);
element!(u16 => F16 | BF16);
element!(i32 => I32);
element!(i64 => I64);

/// A [`TensorView`] of a cudarc buffer, borrowing it for `'a`; derefs to the view. Dropping it
/// records the stream's work on the buffer (cudarc's event tracking).
pub struct SliceView<'a> {
    view: TensorView,
    _access: SyncOnDrop<'a>,
}

impl Deref for SliceView<'_> {
    type Target = TensorView;
    fn deref(&self) -> &TensorView {
        &self.view
    }
}

impl std::fmt::Debug for SliceView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.view.fmt(f)
    }
}

/// The view of `len` elements of `T` (`bytes` of them) as `shape` of `dtype`, `offset` bytes in,
/// checked before the address is taken.
fn checked(
    name: &str,
    holds: bool,
    available: usize,
    offset: usize,
    shape: &[usize],
    dtype: DType,
    device: usize,
) -> Result<TensorView, RuntimeError> {
    if !holds {
        return Err(RuntimeError::bad_argument(
            name,
            format!("a buffer whose elements are {dtype}"),
            "another element type",
        ));
    }
    let probe = TensorView::describe(0, shape, dtype, device)?;
    let room = available.checked_sub(offset);
    if room.is_none_or(|r| r < probe.size_bytes()) {
        return Err(RuntimeError::bad_argument(
            name,
            format!("at least {} bytes from byte {offset} for {shape:?} of {dtype}", probe.size_bytes()),
            format!("a buffer of {available} bytes"),
        ));
    }
    Ok(probe)
}

/// The view of a buffer of `available` bytes on `device`, `offset` bytes in, as `shape` of
/// `dtype`: checked first, then `take` gives the buffer's address and access record.
#[allow(clippy::too_many_arguments)] // a buffer's facts and the view asked of it
fn view_of<'a>(
    name: &str,
    holds: bool,
    available: usize,
    device: usize,
    offset: usize,
    shape: &[usize],
    dtype: DType,
    take: impl FnOnce() -> (u64, SyncOnDrop<'a>),
) -> Result<SliceView<'a>, RuntimeError> {
    let probe = checked(name, holds, available, offset, shape, dtype, device)?;
    let (ptr, access) = take();
    Ok(SliceView { view: probe.at(ptr + offset as u64), _access: access })
}

impl TensorView {
    /// A view of `slice` (a `CudaSlice` or `CudaView`) as `shape` of `dtype`, for kernels to
    /// read, on `stream`. The buffer must hold at least the shape's elements, of a type that
    /// holds `dtype`; the device is the buffer's.
    pub fn of_slice<'a, T: Element, S: DevicePtr<T>>(
        slice: &'a S,
        shape: &[usize],
        dtype: DType,
        stream: &'a CudaStream,
    ) -> Result<SliceView<'a>, RuntimeError> {
        let device = slice.stream().context().ordinal();
        view_of("slice", T::holds(dtype), slice.num_bytes(), device, 0, shape, dtype, || slice.device_ptr(stream))
    }

    /// [`TensorView::of_slice`] for kernels to write (`CudaSlice` or `CudaViewMut`, borrowed
    /// mutably).
    pub fn of_slice_mut<'a, T: Element, S: DevicePtrMut<T>>(
        slice: &'a mut S,
        shape: &[usize],
        dtype: DType,
        stream: &'a CudaStream,
    ) -> Result<SliceView<'a>, RuntimeError> {
        let (device, bytes) = (slice.stream().context().ordinal(), slice.num_bytes());
        view_of("slice", T::holds(dtype), bytes, device, 0, shape, dtype, || slice.device_ptr_mut(stream))
    }

    /// A view into a byte arena (engines pool their memory): `shape` of `dtype` starting
    /// `offset` bytes into `arena`, all of it inside, for kernels to read.
    pub fn of_bytes<'a, S: DevicePtr<u8>>(
        arena: &'a S,
        offset: usize,
        shape: &[usize],
        dtype: DType,
        stream: &'a CudaStream,
    ) -> Result<SliceView<'a>, RuntimeError> {
        let device = arena.stream().context().ordinal();
        view_of("arena", true, arena.num_bytes(), device, offset, shape, dtype, || arena.device_ptr(stream))
    }

    /// [`TensorView::of_bytes`] for kernels to write.
    pub fn of_bytes_mut<'a, S: DevicePtrMut<u8>>(
        arena: &'a mut S,
        offset: usize,
        shape: &[usize],
        dtype: DType,
        stream: &'a CudaStream,
    ) -> Result<SliceView<'a>, RuntimeError> {
        let (device, bytes) = (arena.stream().context().ordinal(), arena.num_bytes());
        view_of("arena", true, bytes, device, offset, shape, dtype, || arena.device_ptr_mut(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_element_types_are_checked_before_the_address_is_taken() {
        let short = checked("slice", true, 100, 0, &[2, 64], DType::BF16, 0).expect_err("too short");
        assert!(short.to_string().contains("at least 256 bytes"), "{short}");
        assert!(checked("slice", true, 256, 0, &[2, 64], DType::BF16, 0).is_ok());
        let wrong = checked("slice", f32::holds(DType::BF16), 1024, 0, &[2, 64], DType::BF16, 0).expect_err("f32");
        assert!(wrong.to_string().contains("elements are bf16"), "{wrong}");
        assert!(u16::holds(DType::BF16) && u16::holds(DType::F16) && !u16::holds(DType::F32));
        // An arena: the part must fit after the offset.
        assert!(checked("arena", true, 1024, 768, &[128], DType::BF16, 0).is_ok());
        assert!(checked("arena", true, 1024, 800, &[128], DType::BF16, 0).is_err());
        assert!(checked("arena", true, 1024, 2048, &[0], DType::BF16, 0).is_err());
    }
}
