//! Timing GPU work with CUDA events, launched directly or replayed from a CUDA graph.

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::device::Gpu;
use crate::error::{DriverResultExt, RuntimeError};

/// Host microseconds of one eager call of `call` (which enqueues work on `stream`): the median
/// over 20 batches of 16 calls of the batch's wall time per call, each batch started on an
/// idle stream so that no call waits for queued work. Binding, lookups and the launch are
/// counted; the GPU's time is not.
pub fn host_us_per_call(
    stream: &CudaStream,
    mut call: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f32, RuntimeError> {
    const BATCH: usize = 16;
    call()?;
    let mut samples = Vec::with_capacity(20);
    for _ in 0..20 {
        stream.synchronize().op("cuStreamSynchronize")?;
        let t0 = std::time::Instant::now();
        for _ in 0..BATCH {
            call()?;
        }
        samples.push(t0.elapsed().as_secs_f32() * 1e6 / BATCH as f32);
    }
    stream.synchronize().op("cuStreamSynchronize")?;
    Ok(median(&mut samples))
}

/// Graph replays run before timing, to settle clocks and caches.
const GRAPH_WARMUP: usize = 3;

/// How long [`time_ms`] keeps the GPU busy before timing, at least: from idle its clocks take
/// longer to rise than a few calls of a millisecond last, and the first bench row timed after
/// an idle spell measured up to a fifth slower than the same row later.
const WARM: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs `f` `warmup` times and on until the GPU has been busy with it for `WARM` (200 ms) (at most
/// 1000 calls), then `iters` times between CUDA events recorded on `stream`, and returns each
/// timed iteration's milliseconds. `f` must enqueue its work on `stream`.
pub fn time_ms(
    gpu: &Gpu,
    stream: &CudaStream,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<Vec<f32>, RuntimeError> {
    gpu.check_stream("stream", stream)?;
    // The first call may compile and load its kernel: the clock starts once it has run.
    f()?;
    stream.synchronize().op("cuStreamSynchronize")?;
    let start = std::time::Instant::now();
    let mut calls = 1;
    while calls < warmup || (calls < 1000 && start.elapsed() < WARM) {
        f()?;
        calls += 1;
        // The host runs ahead of the GPU: wait now and then so that the elapsed time is the
        // GPU's.
        if calls % 8 == 0 {
            stream.synchronize().op("cuStreamSynchronize")?;
        }
    }
    let events = (0..=iters).map(|_| timing_event(gpu)).collect::<Result<Vec<_>, _>>()?;
    let Some((first, rest)) = events.split_first() else {
        return Ok(Vec::new());
    };
    first.record(stream).op("cuEventRecord")?;
    for e in rest {
        f()?;
        e.record(stream).op("cuEventRecord")?;
    }
    events.windows(2).map(|w| w[0].elapsed_ms(&w[1]).op("cuEventElapsedTime")).collect()
}

/// The median of `samples` (mean of the middle two for an even count); NaN when empty.
/// Sorts `samples` in place.
pub fn median(samples: &mut [f32]) -> f32 {
    samples.sort_by(f32::total_cmp);
    let n = samples.len();
    match n {
        0 => f32::NAN,
        _ if n % 2 == 1 => samples[n / 2],
        _ => (samples[n / 2 - 1] + samples[n / 2]) / 2.0,
    }
}

/// Captures one call of `f` into a CUDA graph on `stream` and returns the mean milliseconds per
/// replay over `replays` replays timed between two events.
///
/// `f` runs once eagerly first (loading modules, checking it succeeds), then once under capture
/// (relaxed mode), so it must only enqueue work on `stream`: no allocation, copy to the host or
/// synchronization. `stream` must come from [`Gpu::new_stream`]: the legacy default stream
/// cannot be captured.
pub fn time_graph_ms(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    replays: usize,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f32, RuntimeError> {
    gpu.check_stream("stream", stream)?;
    if stream.cu_stream().is_null() {
        return Err(RuntimeError::bad_argument(
            "stream",
            "a stream from Gpu::new_stream (the legacy default stream cannot be captured)",
            "the default stream",
        ));
    }
    if replays == 0 {
        return Err(RuntimeError::bad_argument("replays", "at least 1", "0"));
    }
    f()?;
    stream.synchronize().op("cuStreamSynchronize")?;

    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    stream.begin_capture(mode).op("cuStreamBeginCapture")?;
    let captured = f();
    // Capture always ends, so that the stream is usable again whatever `f` did.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph
        .op("cuStreamEndCapture/cuGraphInstantiate")?
        .ok_or_else(|| RuntimeError::Unsupported("the captured call enqueued no work on the stream".into()))?;

    graph.upload().op("cuGraphUpload")?;
    for _ in 0..GRAPH_WARMUP {
        graph.launch().op("cuGraphLaunch")?;
    }
    let (start, end) = (timing_event(gpu)?, timing_event(gpu)?);
    start.record(stream).op("cuEventRecord")?;
    for _ in 0..replays {
        graph.launch().op("cuGraphLaunch")?;
    }
    end.record(stream).op("cuEventRecord")?;
    let total = start.elapsed_ms(&end).op("cuEventElapsedTime")?;
    Ok(total / replays as f32)
}

/// An event that records timestamps.
fn timing_event(gpu: &Gpu) -> Result<CudaEvent, RuntimeError> {
    gpu.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).op("cuEventCreate")
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
