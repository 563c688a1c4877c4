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
//!
//! # History and reports
//!
//! The pool keeps every live allocation's sizes, label and op (the one in scope when it was made,
//! see [`Pool::op_scope`]), so that [`Pool::memory_state`] and [`Pool::snapshot`] can tile each
//! segment with its allocations, pending frees and free blocks. With
//! [`PoolOptions::history`] (or [`Pool::set_history`]) it also records every allocation, free,
//! segment creation and destruction and out-of-memory refusal in a bounded ring
//! ([`crate::history`]); off, that costs one branch under the lock the pool takes anyway. The
//! [`report`](crate::report) module turns both into text, JSON, PyTorch snapshots, Chrome traces and
//! SVG plots.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::device::Gpu;
use crate::history::{Event, EventKind, History, HistoryOptions, Label, OomDetails, Totals};
use crate::policy::{
    OutOfMemory, Placement, PolicyConfig, PolicyError, PoolCore, PoolStats, SegmentEvent,
    SegmentId, SegmentStorage, StorageError,
};
use crate::snapshot::Snapshot;
use crate::state::{HistoryStatus, PolicySummary, PoolState, SegmentState, Span, SpanKind};

pub use crate::state::SegmentInfo;

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
    /// Record the allocation history from the start (`None`, the default: off; see
    /// [`Pool::set_history`] to switch it on later).
    pub history: Option<HistoryOptions>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            policy: None,
            reuse: ReuseSafety::AfterSubmission,
            zero_on_free: false,
            label: "wgpu-pool".into(),
            history: None,
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
/// Each buffer is reported as a segment of its own, with an id from `next_segment_id`.
#[derive(Debug, Default)]
struct NaiveState {
    stats: PoolStats,
    next_segment_id: u64,
}

enum Backing {
    Pooled(PoolCore<BufferStorage>),
    Naive(NaiveState),
}

/// A dropped allocation waiting for the submission that carries its last use.
struct PendingFree {
    placement: Placement,
    buffer: wgpu::Buffer,
    /// Its record in the live slab.
    live_slot: usize,
}

/// What the pool remembers of a live allocation (or one dropped and waiting for a submission),
/// for snapshots and history.
#[derive(Debug)]
struct LiveAllocation {
    segment: SegmentId,
    offset_bytes: u64,
    requested_bytes: u64,
    allocated_bytes: u64,
    label: Label,
    op: Option<Label>,
    /// Dropped, waiting for the submission that releases it.
    pending: bool,
}

/// The live allocations in a slab: each handle (and each pending free) holds its record's index,
/// so keeping the records costs a vector write per allocation and no hashing.
#[derive(Debug, Default)]
struct LiveSlab {
    slots: Vec<Option<LiveAllocation>>,
    vacant: Vec<usize>,
}

impl LiveSlab {
    fn insert(&mut self, entry: LiveAllocation) -> usize {
        match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        }
    }

    fn get(&self, slot: usize) -> Option<&LiveAllocation> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, slot: usize) -> Option<&mut LiveAllocation> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    fn remove(&mut self, slot: usize) -> Option<LiveAllocation> {
        let entry = self.slots.get_mut(slot).and_then(Option::take);
        if entry.is_some() {
            self.vacant.push(slot);
        }
        entry
    }

    fn iter(&self) -> impl Iterator<Item = &LiveAllocation> {
        self.slots.iter().flatten()
    }
}

struct State {
    backing: Backing,
    pending: Vec<PendingFree>,
    live: LiveSlab,
    /// The op in scope (see [`Pool::op_scope`]).
    op: Option<Label>,
    /// The recorded history, when it is on.
    history: Option<History>,
}

struct Shared {
    gpu: Gpu,
    options: PoolOptions,
    max_buffer_size: u64,
    max_binding_bytes: u64,
    /// The pool's time origin: event times are microseconds since then.
    created: Instant,
    state: Mutex<State>,
    /// The staging buffer `read` copies through, kept between reads (grown to the largest read).
    staging: Mutex<Option<wgpu::Buffer>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the counters half-updated in a way that
        // matters more than losing the pool: carry on with the data as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Microseconds since the pool was created.
    fn now_us(&self) -> u64 {
        u64::try_from(self.created.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// An event about a live allocation, with its label and op.
fn allocation_event(kind: EventKind, time_us: u64, live: &LiveAllocation) -> Event {
    let mut event = Event::new(
        kind,
        time_us,
        live.requested_bytes,
        live.allocated_bytes,
        Some(live.segment),
        live.offset_bytes,
    );
    event.label = live.label.clone();
    event.op = live.op.clone();
    event
}

/// Records the policy's segment events.
fn record_segment_events(history: &mut History, events: Vec<SegmentEvent>, time_us: u64) {
    for event in events {
        let (kind, id, size_bytes) = match event {
            SegmentEvent::Created { id, size_bytes } => (EventKind::SegmentAlloc, id, size_bytes),
            SegmentEvent::Destroyed { id, size_bytes } => (EventKind::SegmentFree, id, size_bytes),
        };
        history.record(Event::new(
            kind,
            time_us,
            size_bytes,
            size_bytes,
            Some(id),
            0,
        ));
    }
}

/// Records an out-of-memory refusal.
fn record_oom(history: &mut History, time_us: u64, oom: &OutOfMemory, op: Option<&Label>) {
    let mut event = Event::new(EventKind::Oom, time_us, oom.requested_bytes, 0, None, 0);
    event.op = op.cloned();
    event.oom = Some(Box::new(OomDetails {
        segment_bytes: oom.segment_bytes,
        reserved_bytes: oom.reserved_bytes,
        allocated_bytes: oom.allocated_bytes,
        largest_free_bytes: oom.largest_free_bytes,
        budget_bytes: oom.budget_bytes,
        device_refused: oom.device_error.is_some(),
    }));
    history.record(event);
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
        let history = options
            .history
            .map(|history| History::new(history, Totals::default()));
        Self {
            shared: Arc::new(Shared {
                gpu: gpu.clone(),
                options,
                max_buffer_size: limits.max_buffer_size,
                max_binding_bytes: limits.max_storage_buffer_binding_size,
                created: Instant::now(),
                staging: Mutex::new(None),
                state: Mutex::new(State {
                    backing,
                    pending: Vec::new(),
                    live: LiveSlab::default(),
                    op: None,
                    history,
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
        let label = Label::new(options.label);
        let allocation = {
            let mut guard = self.shared.lock();
            let State {
                backing,
                live,
                op,
                history,
                ..
            } = &mut *guard;
            match backing {
                Backing::Pooled(core) => {
                    let result = core.allocate(size_bytes);
                    // Drained always, so that the policy's event list stays empty when history is
                    // off; an empty list costs nothing to take.
                    let segment_events = core.take_events();
                    let time_us = history.as_ref().map(|_| self.shared.now_us());
                    if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
                        record_segment_events(history, segment_events, time_us);
                        if let Err(PolicyError::OutOfMemory(oom)) = &result {
                            record_oom(history, time_us, oom, op.as_ref());
                        }
                    }
                    let placement = result?;
                    let entry = LiveAllocation {
                        segment: placement.segment(),
                        offset_bytes: placement.offset(),
                        requested_bytes: size_bytes,
                        allocated_bytes: placement.allocated_size(),
                        label: label.clone(),
                        op: op.clone(),
                        pending: false,
                    };
                    if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
                        history.record(allocation_event(EventKind::Alloc, time_us, &entry));
                    }
                    let live_slot = live.insert(entry);
                    let buffer = core
                        .segment(placement.slot())
                        .expect("placement's segment is held")
                        .memory
                        .clone();
                    Allocation {
                        pool: self.clone(),
                        buffer,
                        placement: Some(placement),
                        naive_segment: None,
                        live_slot,
                        offset_bytes: 0,
                        size_bytes,
                        label,
                        last_use_submitted: false,
                    }
                    .with_offset()
                }
                Backing::Naive(naive) => {
                    let allocated = size_bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT)
                        * wgpu::COPY_BUFFER_ALIGNMENT;
                    let buffer_label =
                        format!("{} naive {}", self.shared.options.label, options.label);
                    // What a user writes without a pool: a plain `create_buffer` (sizes were checked
                    // against the device's limits above; a driver out-of-memory reaches wgpu's
                    // uncaptured-error handler, as it would in that user's code).
                    let buffer = self
                        .shared
                        .gpu
                        .device
                        .create_buffer(&wgpu::BufferDescriptor {
                            label: Some(&buffer_label),
                            size: allocated,
                            usage: SEGMENT_USAGES,
                            mapped_at_creation: false,
                        });
                    let stats = &mut naive.stats;
                    stats.create_segment_calls += 1;
                    stats.reserved_bytes.add(allocated);
                    stats.segments.add(1);
                    stats.allocated_bytes.add(allocated);
                    stats.requested_bytes.add(size_bytes);
                    stats.allocations.add(1);
                    let id = SegmentId(naive.next_segment_id);
                    naive.next_segment_id += 1;
                    let entry = LiveAllocation {
                        segment: id,
                        offset_bytes: 0,
                        requested_bytes: size_bytes,
                        allocated_bytes: allocated,
                        label: label.clone(),
                        op: op.clone(),
                        pending: false,
                    };
                    if let Some(history) = history {
                        let time_us = self.shared.now_us();
                        record_segment_events(
                            history,
                            vec![SegmentEvent::Created {
                                id,
                                size_bytes: allocated,
                            }],
                            time_us,
                        );
                        history.record(allocation_event(EventKind::Alloc, time_us, &entry));
                    }
                    let live_slot = live.insert(entry);
                    Allocation {
                        pool: self.clone(),
                        buffer,
                        placement: None,
                        naive_segment: Some(id),
                        live_slot,
                        offset_bytes: 0,
                        size_bytes,
                        label,
                        last_use_submitted: false,
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

    /// Frees allocations whose last use is in work already submitted (through [`Pool::submit`]
    /// or the queue): their ranges are reusable at once, whatever anyone submits next. Dropping
    /// an allocation instead makes it wait for the next submission through the pool, which is
    /// right only if no one else submits before the work that uses it. With `zero_on_free` the
    /// ranges are cleared first (one more submission). The compute context frees the tensors
    /// dropped during a batch this way, after submitting the batch.
    pub fn free_submitted<I: IntoIterator<Item = Allocation>>(&self, allocations: I) {
        let mut any = false;
        for mut allocation in allocations {
            allocation.last_use_submitted = true;
            any = true;
            drop(allocation);
        }
        if any && self.shared.options.zero_on_free {
            self.submit([]);
        }
    }

    fn release(&self, pending: Vec<PendingFree>) {
        if pending.is_empty() {
            return;
        }
        let mut guard = self.shared.lock();
        let State {
            backing,
            live,
            history,
            ..
        } = &mut *guard;
        if let Backing::Pooled(core) = backing {
            let time_us = history.as_ref().map(|_| self.shared.now_us());
            for free in pending {
                let entry = live.remove(free.live_slot);
                if let (Some(history), Some(time_us), Some(entry)) =
                    (history.as_mut(), time_us, entry.as_ref())
                {
                    history.record(allocation_event(EventKind::FreeCompleted, time_us, entry));
                }
                core.free(free.placement);
            }
            let segment_events = core.take_events();
            if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
                record_segment_events(history, segment_events, time_us);
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
        let mut guard = self.shared.lock();
        let State {
            backing, history, ..
        } = &mut *guard;
        match backing {
            Backing::Pooled(core) => {
                let released = core.trim();
                let segment_events = core.take_events();
                if let Some(history) = history {
                    record_segment_events(history, segment_events, self.shared.now_us());
                }
                released
            }
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
            Backing::Naive(naive) => naive.stats.reset_peaks(),
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

    /// Switches history recording on (a fresh, empty ring whose totals start from the pool's
    /// current figures) or off (`None`, dropping what was recorded). Like PyTorch's
    /// `_record_memory_history`.
    pub fn set_history(&self, options: Option<HistoryOptions>) {
        let mut state = self.shared.lock();
        let baseline = match &state.backing {
            Backing::Pooled(core) => Totals::of_stats(&core.stats()),
            Backing::Naive(naive) => Totals::of_stats(&naive.stats),
        };
        state.history = options.map(|options| History::new(options, baseline));
    }

    /// A copy of the recorded history (`None` when recording is off).
    pub fn history(&self) -> Option<History> {
        self.shared.lock().history.clone()
    }

    /// Sets the op that later allocations and events are attributed to (`None`: no op). The op is
    /// the pool's, not the thread's: with several threads allocating, attribute with care. See
    /// [`Pool::op_scope`] for a guard that restores the previous op.
    pub fn set_op(&self, op: Option<&str>) {
        self.shared.lock().op = op.map(Label::new);
    }

    /// The op in scope, if any.
    pub fn op(&self) -> Option<String> {
        self.shared.lock().op.as_ref().map(|op| op.to_string())
    }

    /// Attributes allocations and events to `op` until the guard is dropped, then restores the op
    /// that was in scope before. Scopes nest.
    pub fn op_scope(&self, op: &str) -> OpScope<'_> {
        let previous = self.shared.lock().op.replace(Label::new(op));
        OpScope {
            pool: self,
            previous,
        }
    }

    /// The pool's memory as plain data: its statistics and policy, and every segment tiled, in
    /// address order, by its allocations, pending frees and free blocks. Taken under one lock, so
    /// the figures agree with each other. O(segments + live allocations + free blocks).
    pub fn memory_state(&self) -> PoolState {
        self.memory_state_of(&self.shared.lock())
    }

    fn memory_state_of(&self, state: &State) -> PoolState {
        let time_us = self.shared.now_us();
        let mut by_segment: HashMap<SegmentId, Vec<Span>> = HashMap::new();
        for live in state.live.iter() {
            by_segment.entry(live.segment).or_default().push(Span {
                offset_bytes: live.offset_bytes,
                size_bytes: live.allocated_bytes,
                requested_bytes: live.requested_bytes,
                kind: if live.pending {
                    SpanKind::PendingFree
                } else {
                    SpanKind::Allocated
                },
                label: live.label.to_string(),
                op: live.op.as_ref().map(|op| op.to_string()),
            });
        }
        let (naive, stats, policy, segments) = match &state.backing {
            Backing::Pooled(core) => {
                let segments = core
                    .segments()
                    .map(|segment| {
                        let mut spans = by_segment.remove(&segment.id).unwrap_or_default();
                        match &segment.allocator {
                            Some(allocator) => {
                                spans.extend(allocator.free_blocks().into_iter().map(
                                    |(offset_bytes, size_bytes)| {
                                        Span::free(offset_bytes, size_bytes)
                                    },
                                ));
                            }
                            None if segment.is_empty() => {
                                spans.push(Span::free(0, segment.size_bytes));
                            }
                            None => {}
                        }
                        spans.sort_unstable_by_key(|span| span.offset_bytes);
                        SegmentState {
                            id: segment.id,
                            size_bytes: segment.size_bytes,
                            dedicated: segment.allocator.is_none(),
                            spans,
                        }
                    })
                    .collect();
                let config = core.config();
                let policy = PolicySummary {
                    min_block_bytes: config.min_block_bytes,
                    min_segment_bytes: config.min_segment_bytes,
                    max_segment_bytes: config.max_segment_bytes,
                    dedicated_above_bytes: config.dedicated_above_bytes,
                    max_allocation_bytes: config.max_allocation_bytes,
                    rounding: format!("{:?}", config.rounding),
                    budget_bytes: config.budget_bytes,
                };
                (false, core.stats(), Some(policy), segments)
            }
            Backing::Naive(naive) => {
                let mut segments: Vec<SegmentState> = by_segment
                    .into_iter()
                    .map(|(id, spans)| SegmentState {
                        id,
                        size_bytes: spans.iter().map(|span| span.size_bytes).sum(),
                        dedicated: true,
                        spans,
                    })
                    .collect();
                segments.sort_unstable_by_key(|segment| segment.id);
                (true, naive.stats, None, segments)
            }
        };
        PoolState {
            naive,
            time_us,
            stats,
            policy,
            max_buffer_size: self.shared.max_buffer_size,
            max_storage_buffer_binding_size: self.shared.max_binding_bytes,
            history: state.history.as_ref().map(|history| HistoryStatus {
                max_events: history.max_events(),
                events: history.len(),
                dropped_events: history.dropped_events(),
            }),
            segments,
        }
    }

    /// [`Pool::memory_state`] and [`Pool::history`] taken under one lock, so that the history ends
    /// exactly at the state.
    pub fn state_and_history(&self) -> (PoolState, Option<History>) {
        let guard = self.shared.lock();
        (self.memory_state_of(&guard), guard.history.clone())
    }

    /// The pool as a PyTorch memory snapshot: its segments (blocks tiling each one) and, when
    /// history is on, its events as device 0's trace. Write it with
    /// [`Snapshot::to_pickle_bytes`] for `python -m torch.cuda._memory_viz` and
    /// pytorch.org/memory_viz. See [`crate::state::pytorch_snapshot`] for the mapping.
    pub fn snapshot(&self) -> Snapshot {
        // Under one lock, so that the trace ends exactly at the state the segments show.
        let guard = self.shared.lock();
        let state = self.memory_state_of(&guard);
        crate::state::pytorch_snapshot(&state, guard.history.as_ref())
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
        self.read_via(allocation, None)
    }

    /// Submits `command_buffers` as [`Pool::submit`] does (ranges dropped before this call become
    /// reusable after it), with a copy of `allocation` behind them in the same submission; then
    /// waits for it and returns the allocation's bytes (its size rounded up to 4). The work and its
    /// read-back cost one submission instead of two.
    pub fn submit_and_read<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        command_buffers: I,
        allocation: &Allocation,
    ) -> Result<Vec<u8>, PoolError> {
        self.read_via(allocation, Some(command_buffers.into_iter().collect()))
    }

    /// Copies `allocation` into the staging buffer — alone, or behind `work` through
    /// [`Pool::submit`] — waits, and returns its bytes.
    fn read_via(
        &self,
        allocation: &Allocation,
        work: Option<Vec<wgpu::CommandBuffer>>,
    ) -> Result<Vec<u8>, PoolError> {
        let size = allocation.binding_size();
        // One staging buffer, reused by every read (reads wait for each other here).
        let mut staging_slot = self
            .shared
            .staging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if staging_slot
            .as_ref()
            .is_none_or(|buffer| buffer.size() < size)
        {
            *staging_slot = Some(
                self.shared
                    .gpu
                    .device
                    .create_buffer(&wgpu::BufferDescriptor {
                        label: Some("wgpu-pool read-back"),
                        size: size.next_power_of_two().max(64 << 10),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    }),
            );
        }
        let staging = staging_slot.as_ref().expect("just ensured");
        let result = self.read_through(staging, allocation, size, work);
        if result.is_err() {
            // A failed read may leave the staging buffer mapped: start afresh next time.
            *staging_slot = None;
        }
        result
    }

    fn read_through(
        &self,
        staging: &wgpu::Buffer,
        allocation: &Allocation,
        size: u64,
        work: Option<Vec<wgpu::CommandBuffer>>,
    ) -> Result<Vec<u8>, PoolError> {
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
            staging,
            0,
            size,
        );
        match work {
            // The pool's own submission: ranges waiting for one stay pending.
            None => {
                self.shared.gpu.queue.submit([encoder.finish()]);
            }
            Some(mut buffers) => {
                buffers.push(encoder.finish());
                self.submit(buffers);
            }
        }
        crate::device::read_mapped(&self.shared.gpu.device, staging, size)
            .map_err(PoolError::ReadBack)
    }

    fn free(
        &self,
        placement: Option<Placement>,
        naive_segment: Option<SegmentId>,
        live_slot: usize,
        buffer: wgpu::Buffer,
        size_bytes: u64,
        last_use_submitted: bool,
    ) {
        let mut guard = self.shared.lock();
        let State {
            backing,
            pending,
            live,
            history,
            ..
        } = &mut *guard;
        match (backing, placement, naive_segment) {
            (Backing::Pooled(core), Some(placement), None) => {
                let time_us = history.as_ref().map(|_| self.shared.now_us());
                if let (Some(history), Some(time_us), Some(entry)) =
                    (history.as_mut(), time_us, live.get(live_slot))
                {
                    history.record(allocation_event(EventKind::FreeRequested, time_us, entry));
                }
                if (self.shared.options.reuse == ReuseSafety::Immediate || last_use_submitted)
                    && !self.shared.options.zero_on_free
                {
                    let entry = live.remove(live_slot);
                    core.free(placement);
                    let segment_events = core.take_events();
                    if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
                        if let Some(entry) = &entry {
                            history.record(allocation_event(
                                EventKind::FreeCompleted,
                                time_us,
                                entry,
                            ));
                        }
                        record_segment_events(history, segment_events, time_us);
                    }
                } else {
                    if let Some(entry) = live.get_mut(live_slot) {
                        entry.pending = true;
                    }
                    pending.push(PendingFree {
                        placement,
                        buffer,
                        live_slot,
                    });
                }
            }
            (Backing::Naive(naive), None, Some(id)) => {
                let allocated = buffer.size();
                let stats = &mut naive.stats;
                stats.reserved_bytes.sub(allocated);
                stats.segments.sub(1);
                stats.allocated_bytes.sub(allocated);
                stats.requested_bytes.sub(size_bytes);
                stats.allocations.sub(1);
                let entry = live.remove(live_slot);
                if let Some(history) = history {
                    let time_us = self.shared.now_us();
                    if let Some(entry) = &entry {
                        for kind in [EventKind::FreeRequested, EventKind::FreeCompleted] {
                            history.record(allocation_event(kind, time_us, entry));
                        }
                    }
                    record_segment_events(
                        history,
                        vec![SegmentEvent::Destroyed {
                            id,
                            size_bytes: allocated,
                        }],
                        time_us,
                    );
                }
                // Dropped here; wgpu frees it once submitted work using it is done.
            }
            _ => unreachable!(
                "a pooled allocation always has a placement and a naive one never does"
            ),
        }
    }
}

/// Restores the op that was in scope before [`Pool::op_scope`] when dropped.
#[must_use = "the op scope ends when this guard is dropped"]
pub struct OpScope<'a> {
    pool: &'a Pool,
    previous: Option<Label>,
}

impl std::fmt::Debug for OpScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpScope")
            .field("previous", &self.previous)
            .finish()
    }
}

impl Drop for OpScope<'_> {
    fn drop(&mut self) {
        self.pool.shared.lock().op = self.previous.take();
    }
}

/// A range of a GPU buffer, held until dropped. Binds directly as `(buffer, offset, size)`. Not
/// `Clone`; dropping it gives the range back (reusable after the next [`Pool::submit`]).
pub struct Allocation {
    pool: Pool,
    buffer: wgpu::Buffer,
    placement: Option<Placement>,
    /// The naive baseline's id for this allocation's buffer (`None` in a pool).
    naive_segment: Option<SegmentId>,
    /// Its record in the pool's live slab.
    live_slot: usize,
    offset_bytes: u64,
    size_bytes: u64,
    label: Label,
    /// Set by [`Pool::free_submitted`]: the last use is already submitted, so the range is
    /// reusable as soon as it is dropped.
    last_use_submitted: bool,
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
        self.pool.free(
            self.placement.take(),
            self.naive_segment,
            self.live_slot,
            buffer,
            self.size_bytes,
            self.last_use_submitted,
        );
    }
}
