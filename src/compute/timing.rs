//! Per-kernel GPU time from timestamp queries.
//!
//! With [`ContextOptions::profile`](super::ContextOptions::profile) the context brackets every
//! dispatch with timestamps: inside the open pass where the adapter has
//! `TIMESTAMP_QUERY_INSIDE_PASSES`, else by giving each dispatch its own pass with
//! `timestamp_writes` (costlier: a pass per op). Without `TIMESTAMP_QUERY` there are no GPU
//! times; measure wall clock around [`Context::sync`](super::Context::sync) instead. The
//! timestamps of a batch are resolved in the batch's command buffer and read back when it is
//! submitted (profiling therefore waits for every batch).

use super::types::ComputeError;
use crate::device::{AccountedBuffer, Gpu};
use crate::state::BufferRole;

/// What the adapter offers for GPU timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampSupport {
    /// No timestamp queries: time with the wall clock.
    None,
    /// Timestamps at the beginning and end of passes only (`TIMESTAMP_QUERY`).
    PassBoundaries,
    /// Timestamps anywhere in a pass (`TIMESTAMP_QUERY_INSIDE_PASSES` too).
    InsidePasses,
}

impl TimestampSupport {
    /// What the device's features allow. In a browser: `None` (reading timestamps back waits
    /// for the GPU, which a browser's thread may not do), so profiling records nothing there.
    pub fn of(device: &wgpu::Device) -> Self {
        let features = device.features();
        if cfg!(target_arch = "wasm32") || !features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            Self::None
        } else if features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
            Self::InsidePasses
        } else {
            Self::PassBoundaries
        }
    }
}

/// The GPU time of one dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTiming {
    /// The kernel's entry point and variant, e.g. `matmul 128x128x8 vec4`.
    pub kernel: String,
    /// Time between the timestamps before and after the dispatch, in nanoseconds.
    pub gpu_ns: f64,
    /// When the dispatch began: nanoseconds after the first timestamp of its batch (one
    /// submission). With it, the span of several dispatches of a batch (from the first one's
    /// start to the last one's `start_ns + gpu_ns`) counts the gaps between them too: the
    /// barriers a GPU drains between dependent dispatches, which `gpu_ns` leaves out.
    pub start_ns: f64,
}

impl KernelTiming {
    /// The GPU time from the start of the first of `timings` to the end of the last (dispatches
    /// of one batch), in nanoseconds: their own times and the gaps between them. 0 for none.
    pub fn span_ns(timings: &[KernelTiming]) -> f64 {
        if timings.is_empty() {
            return 0.0;
        }
        let start = timings
            .iter()
            .map(|t| t.start_ns)
            .fold(f64::INFINITY, f64::min);
        let end = timings
            .iter()
            .map(|t| t.start_ns + t.gpu_ns)
            .fold(f64::NEG_INFINITY, f64::max);
        (end - start).max(0.0)
    }
}

/// Timestamp pairs of one batch.
pub(crate) struct Timer {
    pub(crate) support: TimestampSupport,
    pub(crate) query_set: wgpu::QuerySet,
    resolve: AccountedBuffer,
    readback: AccountedBuffer,
    /// Queries in the set (two per dispatch).
    capacity: u32,
    /// Queries written in this batch.
    used: u32,
    kernels: Vec<String>,
    period_ns: f64,
}

impl Timer {
    /// Dispatches timed per batch.
    pub(crate) const DISPATCHES_PER_BATCH: u32 = 512;

    pub(crate) fn new(gpu: &Gpu) -> Option<Self> {
        let (device, queue) = (&gpu.device, &gpu.queue);
        let support = TimestampSupport::of(device);
        if support == TimestampSupport::None {
            return None;
        }
        let capacity = 2 * Self::DISPATCHES_PER_BATCH;
        let bytes = u64::from(capacity) * u64::from(wgpu::QUERY_SIZE);
        Some(Self {
            support,
            query_set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgpu-pool compute timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: capacity,
            }),
            resolve: gpu.create_accounted_buffer(
                BufferRole::Timestamps,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool compute timestamps resolve"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                },
            ),
            readback: gpu.create_accounted_buffer(
                BufferRole::Timestamps,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool compute timestamps read-back"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                },
            ),
            capacity,
            used: 0,
            kernels: Vec::new(),
            period_ns: f64::from(queue.get_timestamp_period()),
        })
    }

    /// True when another dispatch's pair does not fit this batch.
    pub(crate) fn is_full(&self) -> bool {
        self.used + 2 > self.capacity
    }

    /// Reserves the pair of query indices for the next dispatch.
    pub(crate) fn next_pair(&mut self, kernel: String) -> (u32, u32) {
        let begin = self.used;
        self.used += 2;
        self.kernels.push(kernel);
        (begin, begin + 1)
    }

    /// Records the resolve and the copy to the read-back buffer; call before finishing the
    /// batch's encoder. Returns whether anything is to be read after the submission.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) -> bool {
        if self.used == 0 {
            return false;
        }
        encoder.resolve_query_set(&self.query_set, 0..self.used, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(
            &self.resolve,
            0,
            &self.readback,
            0,
            u64::from(self.used) * u64::from(wgpu::QUERY_SIZE),
        );
        true
    }

    /// Waits for the submitted batch and returns its dispatches' times; resets for the next batch.
    pub(crate) fn read(
        &mut self,
        device: &wgpu::Device,
    ) -> Result<Vec<KernelTiming>, ComputeError> {
        let used = std::mem::take(&mut self.used);
        let kernels = std::mem::take(&mut self.kernels);
        if used == 0 {
            return Ok(Vec::new());
        }
        let bytes = u64::from(used) * u64::from(wgpu::QUERY_SIZE);
        let ticks: Vec<u64> = crate::device::read_mapped(device, &self.readback, bytes)
            .map_err(ComputeError::Timing)?
            .chunks_exact(8)
            .map(bytemuck::pod_read_unaligned::<u64>)
            .collect();
        let first = ticks.first().copied().unwrap_or(0);
        Ok(kernels
            .into_iter()
            .zip(ticks.chunks_exact(2))
            .map(|(kernel, pair)| KernelTiming {
                kernel,
                gpu_ns: pair[1].saturating_sub(pair[0]) as f64 * self.period_ns,
                start_ns: pair[0].saturating_sub(first) as f64 * self.period_ns,
            })
            .collect())
    }
}
