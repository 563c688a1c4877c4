//! The GPU buffer pool: ranges of large `wgpu::Buffer`s handed out as allocations that bind directly
//! as `(buffer, offset, size)`, and the naive baseline (one buffer per allocation) behind the same
//! interface.
//!
//! The decisions — which segment, when to grow, when to give memory back — are the
//! [`policy`](crate::policy)'s; this module supplies its storage (segments are `wgpu::Buffer`s with
//! `STORAGE | COPY_SRC | COPY_DST` usage), keeps reuse safe, and talks to the device.
//!
//! # Reuse safety
//!
//! `queue.write_buffer` data lands at the start of the *next* submission, before command buffers
//! recorded earlier but submitted with it. If a freed range were handed out at once, this could
//! happen: record kernel K reading allocation X, drop X, allocate Y on the same range, write Y with
//! `queue.write_buffer`, submit K — and K reads Y's data. So a dropped allocation's range is not
//! reusable at once: it waits in a pending list until the next [`Pool::submit`] (the submission that
//! carries the last work recorded on it). After that submission, any new use of the range — an
//! upload, a kernel, a copy — is ordered after it on the one queue, so work still running on the
//! GPU is safe too. The rule for callers: **submit every command buffer that uses an allocation
//! through [`Pool::submit`] (or call [`Pool::mark_submitted`] after submitting it yourself) no later
//! than the first submission after the allocation is dropped.** Submissions the pool makes for its
//! own purposes (zeroing, reading back) do not release pending ranges.
//!
//! [`ReuseSafety::Immediate`] switches this off, for measurements and to show the hazard in tests.
//!
//! # Read-only and read-write bindings
//!
//! wgpu rejects a dispatch that binds one buffer both as `var<storage, read>` and
//! `var<storage, read_write>`. Many allocations share one segment buffer, so an op reading
//! allocation A and writing allocation B of the same segment would hit this. The crate's kernels
//! therefore declare **every storage binding `read_write`**; kernels of your own that bind pool
//! allocations must do the same (or guarantee that inputs and outputs live in different buffers).
//!
//! # Contents
//!
//! Pool memory is uninitialised on reuse, like `torch.empty`: a new allocation may hold data of an
//! earlier one. [`AllocOptions::zeroed`] clears the range on the GPU before it is handed out, and
//! [`PoolOptions::zero_on_free`] clears freed ranges (for sensitive data) in the submission that
//! releases them.

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::Gpu;
use crate::policy::{
    OutOfMemory, Placement, PolicyConfig, PolicyError, PoolCore, PoolStats, SegmentId,
    SegmentStorage, StorageError,
};

/// The usages of every segment buffer.
pub const SEGMENT_USAGES: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// When a dropped allocation's range may be handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReuseSafety {
    /// After the next [`Pool::submit`] or [`Pool::mark_submitted`] (the default; see the module
    /// documentation).
    #[default]
    AfterSubmission,
    /// At once. Unsafe for data (a recorded kernel may read a later upload); for measurements and
    /// for tests that show the hazard.
    Immediate,
}

/// How a pool behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOptions {
    /// The policy; `None` derives the default one from the device's limits.
    pub policy: Option<PolicyConfig>,
    /// When freed ranges become reusable.
    pub reuse: ReuseSafety,
    /// Clear freed ranges on the GPU before they are reused.
    pub zero_on_free: bool,
    /// A prefix for the labels of the buffers the pool creates.
    pub label: String,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            policy: None,
            reuse: ReuseSafety::AfterSubmission,
            zero_on_free: false,
            label: "wgpu-pool".into(),
        }
    }
}

/// Options of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocOptions<'a> {
    /// A label for reports and history.
    pub label: &'a str,
    /// Clear the range on the GPU before handing it out.
    pub zeroed: bool,
    /// The allocation will be bound by kernels (the default): it must fit
    /// `max_storage_buffer_binding_size`. Set to `false` for copy-only allocations larger than that.
    pub bindable: bool,
}

impl Default for AllocOptions<'_> {
    fn default() -> Self {
        Self {
            label: "",
            zeroed: false,
            bindable: true,
        }
    }
}

impl<'a> AllocOptions<'a> {
    /// Default options with this label.
    pub fn labeled(label: &'a str) -> Self {
        Self {
            label,
            ..Self::default()
        }
    }
}

/// Why the pool refused a request or an operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// A request of zero bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A bindable request larger than the device lets one binding be.
    #[error(
        "request of {requested_bytes} bytes exceeds max_storage_buffer_binding_size ({max_storage_buffer_binding_size} bytes): \
         no kernel could bind it. Split it, or ask for a copy-only allocation (AllocOptions {{ bindable: false, .. }})"
    )]
    ExceedsBindingLimit {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's `max_storage_buffer_binding_size`, in bytes.
        max_storage_buffer_binding_size: u64,
    },
    /// A request larger than any buffer the device can create.
    #[error(
        "request of {requested_bytes} bytes exceeds max_buffer_size ({max_buffer_size} bytes)"
    )]
    ExceedsBufferLimit {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's `max_buffer_size`, in bytes.
        max_buffer_size: u64,
    },
    /// The budget or the device has no memory for the request.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// A write or read outside the allocation, or not aligned to 4 bytes.
    #[error("access of {len_bytes} bytes at offset {offset_bytes} does not fit an allocation of {size_bytes} bytes, or is not a multiple of 4 bytes")]
    OutOfBounds {
        /// Offset in the allocation, in bytes.
        offset_bytes: u64,
        /// Length of the access, in bytes.
        len_bytes: u64,
        /// The allocation's size, in bytes.
        size_bytes: u64,
    },
    /// The pool's configuration is not valid.
    #[error("invalid pool configuration: {0}")]
    Config(String),
    /// Reading back from the GPU failed.
    #[error("reading back from the GPU failed: {0}")]
    ReadBack(String),
}

impl From<PolicyError> for PoolError {
    fn from(error: PolicyError) -> Self {
        match error {
            PolicyError::ZeroSize => Self::ZeroSize,
            PolicyError::TooLarge {
                requested_bytes,
                max_allocation_bytes,
            } => Self::ExceedsBufferLimit {
                requested_bytes,
                max_buffer_size: max_allocation_bytes,
            },
            PolicyError::OutOfMemory(oom) => Self::OutOfMemory(oom),
            PolicyError::Config(config) => Self::Config(config.to_string()),
        }
    }
}

/// The storage of a pool: every segment is one `wgpu::Buffer`.
struct BufferStorage {
    device: wgpu::Device,
    label: String,
}

impl SegmentStorage for BufferStorage {
    type Segment = wgpu::Buffer;

    fn create_segment(
        &mut self,
        size_bytes: u64,
        dedicated: bool,
    ) -> Result<wgpu::Buffer, StorageError> {
        let label = format!(
            "{} {} segment ({size_bytes} B)",
            self.label,
            if dedicated { "dedicated" } else { "pooled" }
        );
        create_buffer_checked(&self.device, &label, size_bytes, SEGMENT_USAGES)
    }

    fn destroy_segment(&mut self, segment: wgpu::Buffer) {
        // Dropping (not `destroy()`): wgpu frees the memory once submitted work using it is done.
        drop(segment);
    }
}

/// `create_buffer` with out-of-memory and validation errors caught as a [`StorageError`] instead
/// of reaching the device's uncaptured-error handler.
fn create_buffer_checked(
    device: &wgpu::Device,
    label: &str,
    size_bytes: u64,
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer, StorageError> {
    let out_of_memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size_bytes,
        usage,
        mapped_at_creation: false,
    });
    let validation = pollster::block_on(validation.pop());
    let out_of_memory = pollster::block_on(out_of_memory.pop());
    match validation.or(out_of_memory) {
        None => Ok(buffer),
        Some(error) => Err(StorageError {
            size_bytes,
            reason: error.to_string(),
        }),
    }
}

/// The naive baseline's bookkeeping: one buffer per allocation, counted like the pool counts.
#[derive(Debug, Default)]
struct NaiveState {
    stats: PoolStats,
}

enum Backing {
    Pooled(PoolCore<BufferStorage>),
    Naive(NaiveState),
}

/// A dropped allocation waiting for the submission that carries its last use.
struct PendingFree {
    placement: Placement,
    buffer: wgpu::Buffer,
}

struct State {
    backing: Backing,
    pending: Vec<PendingFree>,
}

struct Shared {
    gpu: Gpu,
    options: PoolOptions,
    max_buffer_size: u64,
    max_binding_bytes: u64,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the counters half-updated in a way that
        // matters more than losing the pool: carry on with the data as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A pool of GPU memory. Cheap to clone (all clones share one pool); `Send + Sync`.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("naive", &self.is_naive())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    /// A buddy pool on `gpu`'s device, with the policy derived from its limits unless
    /// `options.policy` says otherwise.
    pub fn new(gpu: &Gpu, options: PoolOptions) -> Result<Self, PoolError> {
        let limits = gpu.device.limits();
        let policy = options.policy.clone().unwrap_or_else(|| {
            PolicyConfig::for_limits(
                u64::from(limits.min_storage_buffer_offset_alignment),
                limits.max_buffer_size,
            )
        });
        if policy.min_block_bytes < u64::from(limits.min_storage_buffer_offset_alignment) {
            return Err(PoolError::Config(format!(
                "min_block_bytes {} is below the device's min_storage_buffer_offset_alignment {}",
                policy.min_block_bytes, limits.min_storage_buffer_offset_alignment
            )));
        }
        if policy.max_segment_bytes > limits.max_buffer_size
            || policy.max_allocation_bytes > limits.max_buffer_size
        {
            return Err(PoolError::Config(format!(
                "segments of {} bytes and allocations of {} bytes exceed the device's max_buffer_size {}",
                policy.max_segment_bytes, policy.max_allocation_bytes, limits.max_buffer_size
            )));
        }
        let storage = BufferStorage {
            device: gpu.device.clone(),
            label: options.label.clone(),
        };
        let core = PoolCore::new(policy, storage)?;
        Ok(Self::with_backing(gpu, options, Backing::Pooled(core)))
    }

    /// The naive baseline: one `wgpu::Buffer` per allocation, dropped when the allocation is —
    /// what a user writes without a pool. Same interface and statistics.
    pub fn naive(gpu: &Gpu, options: PoolOptions) -> Self {
        Self::with_backing(gpu, options, Backing::Naive(NaiveState::default()))
    }

    fn with_backing(gpu: &Gpu, options: PoolOptions, backing: Backing) -> Self {
        let limits = gpu.device.limits();
        Self {
            shared: Arc::new(Shared {
                gpu: gpu.clone(),
                options,
                max_buffer_size: limits.max_buffer_size,
                max_binding_bytes: limits.max_storage_buffer_binding_size,
                state: Mutex::new(State {
                    backing,
                    pending: Vec::new(),
                }),
            }),
        }
    }

    /// True for the naive baseline.
    pub fn is_naive(&self) -> bool {
        matches!(self.shared.lock().backing, Backing::Naive(_))
    }

    /// The device and queue the pool allocates on.
    pub fn gpu(&self) -> &Gpu {
        &self.shared.gpu
    }

    /// Allocates `size_bytes` with default options (bindable, uninitialised).
    pub fn allocate(&self, size_bytes: u64) -> Result<Allocation, PoolError> {
        self.allocate_with(size_bytes, AllocOptions::default())
    }

    /// Allocates `size_bytes`.
    pub fn allocate_with(
        &self,
        size_bytes: u64,
        options: AllocOptions<'_>,
    ) -> Result<Allocation, PoolError> {
        if size_bytes == 0 {
            return Err(PoolError::ZeroSize);
        }
        if options.bindable && size_bytes > self.shared.max_binding_bytes {
            return Err(PoolError::ExceedsBindingLimit {
                requested_bytes: size_bytes,
                max_storage_buffer_binding_size: self.shared.max_binding_bytes,
            });
        }
        if size_bytes > self.shared.max_buffer_size {
            return Err(PoolError::ExceedsBufferLimit {
                requested_bytes: size_bytes,
                max_buffer_size: self.shared.max_buffer_size,
            });
        }
        let allocation = {
            let mut state = self.shared.lock();
            match &mut state.backing {
                Backing::Pooled(core) => {
                    let placement = core.allocate(size_bytes)?;
                    let buffer = core
                        .segment(placement.slot())
                        .expect("placement's segment is held")
                        .memory
                        .clone();
                    Allocation {
                        pool: self.clone(),
                        buffer,
                        placement: Some(placement),
                        offset_bytes: 0,
                        size_bytes,
                        label: options.label.to_string(),
                    }
                    .with_offset()
                }
                Backing::Naive(naive) => {
                    let allocated = size_bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT)
                        * wgpu::COPY_BUFFER_ALIGNMENT;
                    let label = format!("{} naive {}", self.shared.options.label, options.label);
                    let buffer = create_buffer_checked(
                        &self.shared.gpu.device,
                        &label,
                        allocated,
                        SEGMENT_USAGES,
                    )
                    .map_err(|error| {
                        naive.stats.oom_count += 1;
                        PoolError::OutOfMemory(Box::new(OutOfMemory {
                            requested_bytes: size_bytes,
                            segment_bytes: allocated,
                            reserved_bytes: naive.stats.reserved_bytes.current,
                            allocated_bytes: naive.stats.allocated_bytes.current,
                            largest_free_bytes: 0,
                            external_fragmentation: 0.0,
                            budget_bytes: None,
                            device_error: Some(error.reason),
                        }))
                    })?;
                    let stats = &mut naive.stats;
                    stats.create_segment_calls += 1;
                    stats.reserved_bytes.add(allocated);
                    stats.segments.add(1);
                    stats.allocated_bytes.add(allocated);
                    stats.requested_bytes.add(size_bytes);
                    stats.allocations.add(1);
                    Allocation {
                        pool: self.clone(),
                        buffer,
                        placement: None,
                        offset_bytes: 0,
                        size_bytes,
                        label: options.label.to_string(),
                    }
                }
            }
        };
        if options.zeroed {
            let mut encoder =
                self.shared
                    .gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("wgpu-pool zero"),
                    });
            encoder.clear_buffer(
                &allocation.buffer,
                allocation.offset_bytes,
                Some(allocation.allocated_size()),
            );
            self.shared.gpu.queue.submit([encoder.finish()]);
        }
        Ok(allocation)
    }

    /// Submits `command_buffers`, then releases the ranges of allocations dropped before this call
    /// (see the module documentation). Returns the submission index.
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        command_buffers: I,
    ) -> wgpu::SubmissionIndex {
        let pending = std::mem::take(&mut self.shared.lock().pending);
        let mut buffers: Vec<wgpu::CommandBuffer> = command_buffers.into_iter().collect();
        if self.shared.options.zero_on_free && !pending.is_empty() {
            let mut encoder =
                self.shared
                    .gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("wgpu-pool zero on free"),
                    });
            for free in &pending {
                encoder.clear_buffer(
                    &free.buffer,
                    free.placement.offset(),
                    Some(free.placement.allocated_size()),
                );
            }
            buffers.push(encoder.finish());
        }
        let index = self.shared.gpu.queue.submit(buffers);
        self.release(pending);
        index
    }

    /// Declares that every command buffer recorded so far has been submitted (by the caller, through
    /// the queue), so that ranges dropped before this call can be reused.
    pub fn mark_submitted(&self) {
        if self.shared.options.zero_on_free {
            self.submit([]);
            return;
        }
        let pending = std::mem::take(&mut self.shared.lock().pending);
        self.release(pending);
    }

    fn release(&self, pending: Vec<PendingFree>) {
        if pending.is_empty() {
            return;
        }
        let mut state = self.shared.lock();
        if let Backing::Pooled(core) = &mut state.backing {
            for free in pending {
                core.free(free.placement);
            }
        }
    }

    /// Ranges dropped but not yet reusable (waiting for a submission), and their bytes.
    pub fn pending_frees(&self) -> (usize, u64) {
        let state = self.shared.lock();
        (
            state.pending.len(),
            state
                .pending
                .iter()
                .map(|p| p.placement.allocated_size())
                .sum(),
        )
    }

    /// Gives back every empty segment (PyTorch's `empty_cache`). Returns the bytes given back.
    /// Ranges waiting for a submission keep their segments.
    pub fn trim(&self) -> u64 {
        match &mut self.shared.lock().backing {
            Backing::Pooled(core) => core.trim(),
            Backing::Naive(_) => 0,
        }
    }

    /// Sets or clears the budget on reserved bytes.
    pub fn set_budget(&self, budget_bytes: Option<u64>) {
        if let Backing::Pooled(core) = &mut self.shared.lock().backing {
            core.set_budget(budget_bytes);
        }
    }

    /// The statistics (current, peak and total of reserved, allocated and requested bytes,
    /// allocations and segments; `create_buffer` calls; OOMs; free-space figures).
    pub fn stats(&self) -> PoolStats {
        match &self.shared.lock().backing {
            Backing::Pooled(core) => core.stats(),
            Backing::Naive(naive) => naive.stats,
        }
    }

    /// Starts new peaks from the current values.
    pub fn reset_peaks(&self) {
        match &mut self.shared.lock().backing {
            Backing::Pooled(core) => core.reset_peaks(),
            Backing::Naive(naive) => {
                let s = &mut naive.stats;
                for counter in [
                    &mut s.reserved_bytes,
                    &mut s.allocated_bytes,
                    &mut s.requested_bytes,
                    &mut s.allocations,
                    &mut s.segments,
                ] {
                    counter.reset_peak();
                }
            }
        }
    }

    /// The policy in use (`None` for the naive baseline).
    pub fn policy(&self) -> Option<PolicyConfig> {
        match &self.shared.lock().backing {
            Backing::Pooled(core) => Some(core.config().clone()),
            Backing::Naive(_) => None,
        }
    }

    /// Per-segment figures: id, size, whether dedicated, and the buddy statistics, in slot order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        match &self.shared.lock().backing {
            Backing::Pooled(core) => {
                let min_block = core.config().min_block_bytes;
                core.segments()
                    .map(|segment| SegmentInfo {
                        id: segment.id,
                        size_bytes: segment.size_bytes,
                        dedicated: segment.allocator.is_none(),
                        stats: segment.stats(min_block),
                        free_blocks: segment
                            .allocator
                            .as_ref()
                            .map(|a| a.free_blocks())
                            .unwrap_or_default(),
                    })
                    .collect()
            }
            Backing::Naive(_) => Vec::new(),
        }
    }

    /// Uploads `data` at `offset_bytes` into `allocation` with `queue.write_buffer` (it lands at
    /// the start of the next submission). Offset and length must be multiples of 4.
    pub fn write(
        &self,
        allocation: &Allocation,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        allocation.check_access(offset_bytes, data.len() as u64)?;
        if !data.is_empty() {
            self.shared.gpu.queue.write_buffer(
                &allocation.buffer,
                allocation.offset_bytes + offset_bytes,
                data,
            );
        }
        Ok(())
    }

    /// Reads the whole allocation back (its size rounded up to 4 bytes): submits a copy into a
    /// staging buffer and waits for it. Work recorded but not submitted is not included.
    pub fn read(&self, allocation: &Allocation) -> Result<Vec<u8>, PoolError> {
        let size = allocation.binding_size();
        let staging = self
            .shared
            .gpu
            .device
            .create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-pool read-back"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
        let mut encoder =
            self.shared
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("wgpu-pool read-back"),
                });
        encoder.copy_buffer_to_buffer(
            &allocation.buffer,
            allocation.offset_bytes,
            &staging,
            0,
            size,
        );
        self.shared.gpu.queue.submit([encoder.finish()]);
        let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
        staging.map_async(wgpu::MapMode::Read, .., move |result| {
            sender.send(result).ok();
        });
        self.shared
            .gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| PoolError::ReadBack(e.to_string()))?;
        match pollster::block_on(receiver.receive()) {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(PoolError::ReadBack(error.to_string())),
            None => return Err(PoolError::ReadBack("the map callback was dropped".into())),
        }
        let bytes = staging
            .get_mapped_range(..)
            .map_err(|e| PoolError::ReadBack(e.to_string()))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }

    fn free(&self, placement: Option<Placement>, buffer: wgpu::Buffer, size_bytes: u64) {
        let mut state = self.shared.lock();
        match (&mut state.backing, placement) {
            (Backing::Pooled(core), Some(placement)) => {
                if self.shared.options.reuse == ReuseSafety::Immediate
                    && !self.shared.options.zero_on_free
                {
                    core.free(placement);
                } else {
                    state.pending.push(PendingFree { placement, buffer });
                }
            }
            (Backing::Naive(naive), None) => {
                let allocated = buffer.size();
                let stats = &mut naive.stats;
                stats.reserved_bytes.sub(allocated);
                stats.segments.sub(1);
                stats.allocated_bytes.sub(allocated);
                stats.requested_bytes.sub(size_bytes);
                stats.allocations.sub(1);
                // Dropped here; wgpu frees it once submitted work using it is done.
            }
            _ => unreachable!(
                "a pooled allocation always has a placement and a naive one never does"
            ),
        }
    }
}

/// One segment's figures, for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentInfo {
    /// The segment's id.
    pub id: SegmentId,
    /// Its size, in bytes.
    pub size_bytes: u64,
    /// True for a segment made for one large request.
    pub dedicated: bool,
    /// Its buddy statistics.
    pub stats: crate::buddy::Stats,
    /// Its free blocks as `(offset_bytes, size_bytes)`, in address order.
    pub free_blocks: Vec<(u64, u64)>,
}

/// A range of a GPU buffer, held until dropped. Binds directly as `(buffer, offset, size)`. Not
/// `Clone`; dropping it gives the range back (reusable after the next [`Pool::submit`]).
pub struct Allocation {
    pool: Pool,
    buffer: wgpu::Buffer,
    placement: Option<Placement>,
    offset_bytes: u64,
    size_bytes: u64,
    label: String,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("offset_bytes", &self.offset_bytes)
            .field("size_bytes", &self.size_bytes)
            .field("allocated_bytes", &self.allocated_size())
            .field("segment", &self.segment())
            .field("label", &self.label)
            .finish()
    }
}

impl Allocation {
    fn with_offset(mut self) -> Self {
        self.offset_bytes = self.placement.as_ref().map_or(0, Placement::offset);
        self
    }

    fn check_access(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), PoolError> {
        let aligned = offset_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
            && len_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let fits = offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= self.binding_size());
        if aligned && fits {
            Ok(())
        } else {
            Err(PoolError::OutOfBounds {
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes,
            })
        }
    }

    /// The buffer holding the range.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Start of the range in the buffer, in bytes; a multiple of the device's
    /// `min_storage_buffer_offset_alignment`.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size_bytes
    }

    /// The size bound by [`Allocation::binding`]: the size asked for rounded up to 4 bytes.
    pub fn binding_size(&self) -> u64 {
        self.size_bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT
    }

    /// The bytes held for this allocation after rounding.
    pub fn allocated_size(&self) -> u64 {
        self.placement
            .as_ref()
            .map_or(self.buffer.size(), Placement::allocated_size)
    }

    /// The segment holding it (`None` in the naive baseline).
    pub fn segment(&self) -> Option<SegmentId> {
        self.placement.as_ref().map(Placement::segment)
    }

    /// The label given at allocation.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `(buffer, offset, size)` for a bind group entry.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset_bytes,
            size: NonZeroU64::new(self.binding_size()),
        }
    }

    /// The binding as a bind-group resource.
    pub fn as_binding_resource(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(self.binding())
    }

    /// The range as a buffer slice, for copies.
    pub fn slice(&self) -> wgpu::BufferSlice<'_> {
        self.buffer
            .slice(self.offset_bytes..self.offset_bytes + self.binding_size())
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let buffer = self.buffer.clone();
        self.pool
            .free(self.placement.take(), buffer, self.size_bytes);
    }
}
