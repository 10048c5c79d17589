//! The workspaces kda keeps for prefill calls that give none: one per (device, stream).
//!
//! A call that needs a workspace and gives none takes the one kept for its stream, so that it
//! runs the same path, with the same bits, as a call given one (the path never depends on
//! whether a workspace was passed, nor on memory pressure). A kept workspace grows in stream
//! order (`cuMemAllocAsync` on the caller's stream), and only outside a CUDA graph capture:
//! under capture a workspace too small is an error naming `workspace`, since the capture
//! cannot allocate. Growth allocates a new buffer and keeps the old one: a captured graph
//! holds the address it was captured with, so no kept buffer is freed or moved while the
//! [`crate::Kernels`] that owns it lives, except through the explicit, unsafe
//! [`crate::Kernels::release_workspaces`]. Workspaces are keyed by the stream's driver handle:
//! a stream destroyed while its work is pending and a new one made at the same address would
//! share one, so synchronize a stream before destroying it (as freeing its buffers asks anyway).

use std::sync::Mutex;

use cudarc::driver::{result, sys, CudaContext, CudaStream};
use kda_dsl::DType;

use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};
use crate::tensor::TensorView;

/// Growth rounds the bytes up to a multiple of this, so that calls of nearby sizes share one
/// buffer instead of growing it call by call.
const GROWTH_GRANULE: usize = 1 << 21;

/// One stream's workspace on one device.
struct Kept {
    /// The device ordinal.
    device: usize,
    /// The stream's driver handle (compared, never dereferenced).
    stream: usize,
    /// The buffer calls take now: its address and bytes.
    current: (sys::CUdeviceptr, usize),
    /// Buffers outgrown: a captured graph may still use them.
    retired: Vec<sys::CUdeviceptr>,
    /// The context the buffers belong to, to free them in.
    ctx: std::sync::Arc<CudaContext>,
}

/// Every stream's kept workspace (see the module's documentation).
#[derive(Default)]
pub(crate) struct KeptWorkspaces {
    kept: Mutex<Vec<Kept>>,
}

impl KeptWorkspaces {
    /// A view of at least `bytes` of the workspace kept for `stream` on `gpu`, grown first
    /// when smaller (not under capture: then the error names `workspace`). A warm call, whose
    /// workspace is large enough, allocates nothing (host or device).
    pub(crate) fn at_least(&self, gpu: &Gpu, stream: &CudaStream, bytes: usize) -> Result<TensorView, RuntimeError> {
        let (device, key) = (gpu.ordinal(), stream.cu_stream() as usize);
        let mut kept = self.lock()?;
        let found = kept.iter().position(|k| k.device == device && k.stream == key);
        if let Some(k) = found.map(|i| &kept[i]).filter(|k| k.current.1 >= bytes) {
            return view(k.current, device);
        }
        let have = found.map_or(0, |i| kept[i].current.1);
        // SAFETY: the stream is the caller's live stream.
        let capturing = unsafe { result::stream::is_capturing(stream.cu_stream()) }.op("cuStreamIsCapturing")?;
        if capturing != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(RuntimeError::bad_argument(
                "workspace",
                format!(
                    "a workspace of at least {bytes} bytes: under CUDA graph capture kda cannot grow the one it keeps \
                     for this stream (call preload_chunk with the largest call before capturing, or pass a workspace)"
                ),
                format!("{have} bytes kept for this stream"),
            ));
        }
        let grown = bytes.div_ceil(GROWTH_GRANULE).max(1) * GROWTH_GRANULE;
        gpu.context().bind_to_thread().op("cuCtxSetCurrent")?;
        // SAFETY: a live stream of this context; the memory is only handed to kernels, which
        // the stream orders after this allocation.
        let ptr = unsafe { result::malloc_async(stream.cu_stream(), grown) }.op("cuMemAllocAsync")?;
        match found {
            Some(i) => {
                let k = &mut kept[i];
                let old = std::mem::replace(&mut k.current, (ptr, grown));
                k.retired.push(old.0);
            }
            None => kept.push(Kept {
                device,
                stream: key,
                current: (ptr, grown),
                retired: vec![],
                ctx: gpu.context().clone(),
            }),
        }
        view((ptr, grown), device)
    }

    /// Bytes of the workspace kept for `stream` on `gpu` (0 when none is kept).
    pub(crate) fn bytes(&self, gpu: &Gpu, stream: &CudaStream) -> usize {
        let (device, key) = (gpu.ordinal(), stream.cu_stream() as usize);
        self.lock()
            .map_or(0, |kept| kept.iter().find(|k| k.device == device && k.stream == key).map_or(0, |k| k.current.1))
    }

    /// Frees every kept workspace once the device has finished its work.
    ///
    /// # Safety
    /// No CUDA graph that a call captured with a kept workspace may be launched afterwards, and
    /// no other thread may be running a call that took one.
    pub(crate) unsafe fn release(&self) -> Result<(), RuntimeError> {
        let kept = std::mem::take(&mut *self.lock()?);
        for k in &kept {
            k.ctx.synchronize().op("cuCtxSynchronize")?;
            for &ptr in k.retired.iter().chain([&k.current.0]) {
                // SAFETY: allocated by `at_least` in this context, freed once (taken out of the
                // list), after the device finished every kernel that used it.
                unsafe { result::free_sync(ptr) }.op("cuMemFree")?;
            }
        }
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Vec<Kept>>, RuntimeError> {
        self.kept.lock().map_err(|_| RuntimeError::Unsupported("kept workspaces poisoned".into()))
    }
}

impl Drop for KeptWorkspaces {
    fn drop(&mut self) {
        // SAFETY: the owner is going away, and with it every call that could use these; a
        // graph captured with them outliving their `Kernels` is the caller's contract (the
        // README and `Kernels` say so). Errors at teardown have nowhere to go.
        let _ = unsafe { self.release() };
    }
}

/// A view of a kept buffer, as f32 words (the kernels take the workspace as any dtype).
fn view((ptr, bytes): (sys::CUdeviceptr, usize), device: usize) -> Result<TensorView, RuntimeError> {
    TensorView::describe(ptr, &[bytes / 4], DType::F32, device)
}
