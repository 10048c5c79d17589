//! Dense row-major tensors in device memory, and the plain descriptors kernels are launched with.

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaStream};
use kda_dsl::dtype::DType;

use crate::convert;
use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};

/// The largest rank a tensor may have.
pub const MAX_RANK: usize = 8;

/// A copyable description of a dense row-major tensor in device memory: address, shape, dtype,
/// device.
///
/// It holds no reference to the memory. Safe ways to make one check the memory is there: from
/// a [`DeviceTensor`] ([`DeviceTensor::view`]), from a cudarc buffer ([`TensorView::of_slice`],
/// [`TensorView::of_slice_mut`], [`TensorView::of_bytes`], which borrow it), or from another
/// view ([`TensorView::reshaped`], [`TensorView::part`]); [`TensorView::from_raw`] takes any
/// address, with its contract. The memory must outlive every launch that uses the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorView {
    ptr: u64,
    dims: [usize; MAX_RANK],
    rank: usize,
    dtype: DType,
    device: usize,
}

impl TensorView {
    /// Describes `shape` elements of `dtype` at device address `ptr` on device `device`, for
    /// memory from another allocator; fails for ranks above [`MAX_RANK`], `bool` or a size that
    /// overflows `usize`.
    ///
    /// # Safety
    ///
    /// Unless the shape is empty, `ptr` must address at least [`TensorView::size_bytes`] bytes
    /// of device memory on device `device`, which stays allocated, and is not reused, until
    /// every launch using the view (or a view derived from it) has run. A kernel reads and may
    /// write those bytes.
    pub unsafe fn from_raw(ptr: u64, shape: &[usize], dtype: DType, device: usize) -> Result<Self, RuntimeError> {
        Self::describe(ptr, shape, dtype, device)
    }

    /// An empty view (some extent 0) at address 0: a placeholder no kernel reads.
    pub fn empty(shape: &[usize], dtype: DType, device: usize) -> Result<Self, RuntimeError> {
        if !shape.contains(&0) {
            return Err(RuntimeError::bad_argument("shape", "an extent of 0 (an empty view)", format!("{shape:?}")));
        }
        Self::describe(0, shape, dtype, device)
    }

    /// The same memory as `shape`: no more bytes than this view's, the same dtype.
    pub fn reshaped(&self, shape: &[usize]) -> Result<Self, RuntimeError> {
        self.part(0, shape, self.dtype)
    }

    /// `shape` elements of `dtype` starting `byte_offset` bytes into this view's memory, all of
    /// them inside it.
    pub fn part(&self, byte_offset: usize, shape: &[usize], dtype: DType) -> Result<Self, RuntimeError> {
        let v = Self::describe(self.ptr.wrapping_add(byte_offset as u64), shape, dtype, self.device)?;
        let end = byte_offset.checked_add(v.size_bytes());
        if v.numel() != 0 && end.is_none_or(|e| e > self.size_bytes()) {
            return Err(RuntimeError::bad_argument(
                "shape",
                format!("at most the {} bytes of the view from byte {byte_offset}", self.size_bytes()),
                format!("{shape:?} of {dtype} ({} bytes)", v.size_bytes()),
            ));
        }
        Ok(v)
    }

    /// This view's shape and dtype at another address (the buffer it was checked against).
    pub(crate) fn at(self, ptr: u64) -> Self {
        TensorView { ptr, ..self }
    }

    /// The checked description, without the caller's contract: this crate's own views, whose
    /// addresses come from views checked before, and its tests' descriptors that are never
    /// launched.
    pub(crate) fn describe(ptr: u64, shape: &[usize], dtype: DType, device: usize) -> Result<Self, RuntimeError> {
        if dtype == DType::Bool {
            return Err(convert::unstorable());
        }
        if shape.len() > MAX_RANK {
            return Err(RuntimeError::bad_argument(
                "shape",
                format!("at most {MAX_RANK} dimensions"),
                format!("{shape:?}"),
            ));
        }
        let bytes = shape.iter().try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
        if bytes.is_none() {
            return Err(RuntimeError::bad_argument(
                "shape",
                "a size in bytes that fits in usize",
                format!("{shape:?} of {dtype}"),
            ));
        }
        let mut dims = [0; MAX_RANK];
        dims[..shape.len()].copy_from_slice(shape);
        Ok(TensorView { ptr, dims, rank: shape.len(), dtype, device })
    }

    /// Device address of the first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Extents, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Ordinal of the device holding the memory.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }
}

/// A dense row-major tensor that owns its device memory (freed on drop).
///
/// Memory comes from `cuMemAlloc` (256-byte aligned); an empty tensor holds no allocation and
/// has address 0. Every transfer runs on a stream the caller passes.
#[derive(Debug)]
pub struct DeviceTensor {
    ctx: Arc<CudaContext>,
    view: TensorView,
}

impl DeviceTensor {
    /// Allocates without initializing.
    fn alloc(gpu: &Gpu, shape: &[usize], dtype: DType) -> Result<Self, RuntimeError> {
        let probe = TensorView::describe(0, shape, dtype, gpu.ordinal())?;
        let ctx = gpu.context().clone();
        let ptr = if probe.size_bytes() == 0 {
            0
        } else {
            ctx.bind_to_thread().op("cuCtxSetCurrent")?;
            // SAFETY: the context is current; the size is non-zero.
            unsafe { result::malloc_sync(probe.size_bytes()) }.op("cuMemAlloc")?
        };
        Ok(DeviceTensor { ctx, view: TensorView { ptr, ..probe } })
    }

    /// A tensor of zeros, cleared asynchronously on `stream`.
    pub fn zeros(gpu: &Gpu, stream: &CudaStream, shape: &[usize], dtype: DType) -> Result<Self, RuntimeError> {
        let mut t = Self::alloc(gpu, shape, dtype)?;
        t.fill_bytes(stream, 0)?;
        Ok(t)
    }

    /// Uploads raw little-endian element bytes; returns once the copy on `stream` is done.
    pub fn from_bytes(
        gpu: &Gpu,
        stream: &CudaStream,
        shape: &[usize],
        dtype: DType,
        bytes: &[u8],
    ) -> Result<Self, RuntimeError> {
        let t = Self::alloc(gpu, shape, dtype)?;
        if bytes.len() != t.size_bytes() {
            return Err(RuntimeError::bad_argument(
                "bytes",
                format!("{} bytes for shape {shape:?} of {dtype}", t.size_bytes()),
                format!("{} bytes", bytes.len()),
            ));
        }
        t.check_stream(stream)?;
        if !bytes.is_empty() {
            // SAFETY: the destination holds exactly `bytes.len()` bytes; the stream is
            // synchronized before `bytes` can be released.
            unsafe { result::memcpy_htod_async(t.view.ptr, bytes, stream.cu_stream()) }.op("cuMemcpyHtoDAsync")?;
            stream.synchronize().op("cuStreamSynchronize")?;
        }
        Ok(t)
    }

    /// Uploads `data`, rounded on the host to a float `dtype` (`f32`, `bf16` or `f16`).
    pub fn from_f32(
        gpu: &Gpu,
        stream: &CudaStream,
        shape: &[usize],
        dtype: DType,
        data: &[f32],
    ) -> Result<Self, RuntimeError> {
        check_len(shape, data.len())?;
        Self::from_bytes(gpu, stream, shape, dtype, &convert::encode_f32(data, dtype)?)
    }

    /// Uploads `data` as an integer `dtype` (`i32` or `i64`); values must fit the dtype.
    pub fn from_i64(
        gpu: &Gpu,
        stream: &CudaStream,
        shape: &[usize],
        dtype: DType,
        data: &[i64],
    ) -> Result<Self, RuntimeError> {
        check_len(shape, data.len())?;
        Self::from_bytes(gpu, stream, shape, dtype, &convert::encode_i64(data, dtype)?)
    }

    /// The copyable descriptor kernels are launched with.
    pub fn view(&self) -> TensorView {
        self.view
    }

    /// Extents, outermost first.
    pub fn shape(&self) -> &[usize] {
        self.view.shape()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.view.dtype
    }

    /// Ordinal of the device holding the memory.
    pub fn device(&self) -> usize {
        self.view.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.view.numel()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.view.size_bytes()
    }

    /// Sets every byte to `byte`, asynchronously on `stream`.
    pub fn fill_bytes(&mut self, stream: &CudaStream, byte: u8) -> Result<(), RuntimeError> {
        self.check_stream(stream)?;
        if self.size_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: writes exactly the allocation; the context is current (check_stream).
        unsafe { result::memset_d8_async(self.view.ptr, byte, self.size_bytes(), stream.cu_stream()) }
            .op("cuMemsetD8Async")
    }

    /// Poisons the tensor with all-ones bytes, asynchronously on `stream`: NaN for the float
    /// dtypes, -1 for the integer ones.
    pub fn fill_nan(&mut self, stream: &CudaStream) -> Result<(), RuntimeError> {
        self.fill_bytes(stream, 0xFF)
    }

    /// Downloads the raw bytes; waits for all work queued on `stream` first.
    pub fn to_bytes(&self, stream: &CudaStream) -> Result<Vec<u8>, RuntimeError> {
        self.check_stream(stream)?;
        download(&self.view, stream)
    }

    /// Downloads and widens to `f32` (integers are converted); synchronous on `stream`.
    pub fn to_f32_vec(&self, stream: &CudaStream) -> Result<Vec<f32>, RuntimeError> {
        convert::decode_f32(&self.to_bytes(stream)?, self.dtype())
    }

    /// Downloads an integer tensor as `i64`; synchronous on `stream`.
    pub fn to_i64_vec(&self, stream: &CudaStream) -> Result<Vec<i64>, RuntimeError> {
        if !self.dtype().is_int() {
            return Err(RuntimeError::bad_argument("tensor", "an integer tensor (i32 or i64)", self.dtype().name()));
        }
        convert::decode_i64(&self.to_bytes(stream)?, self.dtype())
    }

    /// Checks `stream` is on this tensor's device and makes the context current.
    fn check_stream(&self, stream: &CudaStream) -> Result<(), RuntimeError> {
        let on = stream.context().ordinal();
        if on != self.device() {
            return Err(RuntimeError::bad_argument(
                "stream",
                format!("a stream on device {} (the tensor's)", self.device()),
                format!("a stream on device {on}"),
            ));
        }
        self.ctx.bind_to_thread().op("cuCtxSetCurrent")
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        if self.view.ptr != 0 {
            // Errors are dropped: a failing free leaves nothing to undo, and recording it in the
            // context would fail unrelated later calls.
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the pointer came from cuMemAlloc in this context and is freed once;
            // cuMemFree synchronizes with work still queued on the device.
            let _ = unsafe { result::free_sync(self.view.ptr) };
        }
    }
}

fn check_len(shape: &[usize], len: usize) -> Result<(), RuntimeError> {
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if numel == Some(len) {
        return Ok(());
    }
    Err(RuntimeError::bad_argument(
        "data",
        match numel {
            Some(n) => format!("{n} values for shape {shape:?}"),
            None => format!("a shape whose element count fits in usize, not {shape:?}"),
        },
        format!("{len} values"),
    ))
}

/// Downloads the bytes `view` covers, on `stream` (which must be on the view's device);
/// synchronous. The caller vouches that the view describes live device memory.
pub fn download(view: &TensorView, stream: &CudaStream) -> Result<Vec<u8>, RuntimeError> {
    stream.context().bind_to_thread().op("cuCtxSetCurrent")?;
    let mut out = vec![0u8; view.size_bytes()];
    if !out.is_empty() {
        // SAFETY: the source holds `out.len()` bytes (the view's contract); the stream is
        // synchronized before `out` is read or released.
        unsafe { result::memcpy_dtoh_async(&mut out, view.ptr, stream.cu_stream()) }.op("cuMemcpyDtoHAsync")?;
    }
    stream.synchronize().op("cuStreamSynchronize")?;
    Ok(out)
}

/// Downloads an integer view (`i32`/`i64`) as `i64` values; synchronous.
pub fn download_i64(view: &TensorView, stream: &CudaStream) -> Result<Vec<i64>, RuntimeError> {
    convert::decode_i64(&download(view, stream)?, view.dtype)
}

/// Uploads `bytes` into the device memory `view` covers (exactly its size), on `stream`;
/// synchronous. The caller vouches that the view describes live device memory.
pub fn upload(view: &TensorView, bytes: &[u8], stream: &CudaStream) -> Result<(), RuntimeError> {
    if bytes.len() != view.size_bytes() {
        return Err(RuntimeError::bad_argument(
            "bytes",
            format!("{} bytes (the view's size)", view.size_bytes()),
            format!("{} bytes", bytes.len()),
        ));
    }
    stream.context().bind_to_thread().op("cuCtxSetCurrent")?;
    if !bytes.is_empty() {
        // SAFETY: the destination holds `bytes.len()` bytes (the view's contract); the stream is
        // synchronized before `bytes` can be released.
        unsafe { result::memcpy_htod_async(view.ptr, bytes, stream.cu_stream()) }.op("cuMemcpyHtoDAsync")?;
    }
    stream.synchronize().op("cuStreamSynchronize")
}
