//! The GPU buffer pool: ranges of large `wgpu::Buffer`s handed out as allocations that bind directly
//! as `(buffer, offset, size)`, and the naive baseline (one buffer per allocation) behind the same
//! interface.
//!
//! The decisions — which segment, when to grow, when to give memory back — are the
//! [`policy`](crate::policy)'s; this module supplies its storage (segments are `wgpu::Buffer`s with
//! `STORAGE | COPY_SRC | COPY_DST` usage), keeps reuse safe, and talks to the device. The naive
//! baseline ([`Pool::naive`]) is the policy's naive mode ([`PolicyConfig::naive`]) through the same
//! code: every allocation a buffer of its own (a plain `create_buffer`), given back when it is
//! dropped.
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
//! The naive baseline needs none of this: a dropped allocation's buffer is given back at once
//! (wgpu keeps it alive until the submitted work that uses it is done) and nothing reuses it.
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
//! # Layout
//!
//! Bottom up, each file using only the ones listed before it: `options.rs` (options and errors),
//! `storage.rs` (the policy's storage of `wgpu::Buffer`s), `live.rs` (the live-allocation slab, the
//! history events made from it, and the filling of the plain-data [`PoolState`]), `shared.rs` (the
//! state under the pool's lock, and reserving, freeing, submitting and releasing), `allocation.rs`
//! (the [`Allocation`] handle, which holds the shared state, not a [`Pool`]), `compact.rs`
//! (compaction plans carried out: copies, then the moved handles re-pointed), `io.rs` (writes and
//! reads), and this file ([`Pool`], [`OpScope`], [`BudgetScope`]).
//!
//! # Compaction
//!
//! A pool never moves an allocation on its own. [`Pool::compact_for`] and
//! [`Pool::compact_segments`] move only the allocations handed in (`&mut`, so that their handles
//! can be re-pointed): the compute context hands in its tensors. The copies are submitted on the
//! queue before the policy frees the old ranges, so their reuse is ordered after the copies;
//! work that uses a moved allocation must be submitted before the call. The history records a
//! move as a free at the old place and an allocation at the new one.
//!
//! # History and reports
//!
//! The pool keeps every live allocation's sizes, label and op (the one in scope when it was made,
//! see [`Pool::op_scope`]), so that [`Pool::memory_state`] and [`Pool::snapshot`] can tile each
//! segment with its allocations, pending frees and free blocks. With
//! [`PoolOptions::history`] (or [`Pool::set_history`]) it also records every allocation, free,
//! segment creation and destruction and out-of-memory refusal in a bounded ring
//! ([`crate::history`]); off, that costs one branch under the lock the pool takes anyway. The
//! state ([`crate::state`]) is plain data below the pool; the `report` module turns it and the
//! history into text, JSON, PyTorch snapshots, Chrome traces and SVG plots.

mod allocation;
mod compact;
mod io;
mod live;
mod options;
mod shared;
mod storage;

use std::sync::Arc;

use crate::device::Gpu;
use crate::history::{History, HistoryOptions, Label, Totals};
use crate::policy::{CompactionEstimate, CompactionLimits, PolicyConfig, PoolCore, PoolStats};
use crate::snapshot::Snapshot;
use crate::state::PoolState;

pub use allocation::Allocation;
pub use compact::Compaction;
pub use io::MAX_STAGING_BYTES;
pub use options::{AllocOptions, OomObserver, OomReport, PoolError, PoolOptions, ReuseSafety};
pub use storage::SEGMENT_USAGES;

pub use crate::state::SegmentInfo;

use live::{record_segment_events, segment_infos};
use shared::Shared;
use storage::BufferStorage;

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
    /// A pool on `gpu`'s device, with the policy derived from its limits unless `options.policy`
    /// says otherwise (a naive policy, [`PolicyConfig::naive`], makes the naive baseline).
    pub fn new(gpu: &Gpu, options: PoolOptions) -> Result<Self, PoolError> {
        let limits = gpu.device.limits();
        let max_allocation_bytes = max_allocation_bytes(limits.max_buffer_size);
        let policy = options.policy.clone().unwrap_or_else(|| {
            PolicyConfig::for_limits(
                u64::from(limits.min_storage_buffer_offset_alignment),
                max_allocation_bytes,
            )
        });
        // Buffers are sized, written and copied in whole blocks: a block below wgpu's copy
        // alignment would make a buffer shorter than its binding.
        if policy.min_block_bytes < wgpu::COPY_BUFFER_ALIGNMENT {
            return Err(PoolError::Config(format!(
                "min_block_bytes {} is below wgpu's COPY_BUFFER_ALIGNMENT ({} bytes)",
                policy.min_block_bytes,
                wgpu::COPY_BUFFER_ALIGNMENT
            )));
        }
        // Naive buffers are bound at offset 0 and sized by requests: only their size limit
        // applies.
        if !policy.is_naive()
            && policy.min_block_bytes < u64::from(limits.min_storage_buffer_offset_alignment)
        {
            return Err(PoolError::Config(format!(
                "min_block_bytes {} is below the device's min_storage_buffer_offset_alignment {}",
                policy.min_block_bytes, limits.min_storage_buffer_offset_alignment
            )));
        }
        if (!policy.is_naive() && policy.max_segment_bytes > limits.max_buffer_size)
            || policy.max_allocation_bytes > limits.max_buffer_size
        {
            return Err(PoolError::Config(format!(
                "segments of {} bytes and allocations of {} bytes exceed the device's max_buffer_size {}",
                policy.max_segment_bytes, policy.max_allocation_bytes, limits.max_buffer_size
            )));
        }
        // Allocations are whole words (see `max_allocation_bytes`), whatever the policy says.
        let policy = PolicyConfig {
            max_allocation_bytes: policy.max_allocation_bytes.min(max_allocation_bytes),
            ..policy
        };
        let storage = BufferStorage::new(gpu, options.label.clone(), policy.is_naive());
        let core = PoolCore::new(policy, storage)?;
        Ok(Self {
            shared: Arc::new(Shared::new(gpu, options, core)),
        })
    }

    /// The naive baseline: one `wgpu::Buffer` per allocation, dropped when the allocation is —
    /// what a user writes without a pool. Same interface and statistics: it is [`Pool::new`] with
    /// the policy's naive mode ([`PolicyConfig::naive`]; `options.policy` is replaced by it).
    pub fn naive(gpu: &Gpu, options: PoolOptions) -> Self {
        let policy = PolicyConfig::naive(
            wgpu::COPY_BUFFER_ALIGNMENT,
            max_allocation_bytes(gpu.device.limits().max_buffer_size),
        );
        Self::new(
            gpu,
            PoolOptions {
                policy: Some(policy),
                ..options
            },
        )
        .expect("the naive policy fits every device")
    }

    /// Whether `other` is a handle of this same pool (pools are cheap clones of one state).
    pub fn same_pool(&self, other: &Pool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// True for the naive baseline.
    pub fn is_naive(&self) -> bool {
        self.shared.naive
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
        self.allocate_as(size_bytes, options, false)
    }

    /// [`Pool::allocate`] as a future that checks, without blocking the thread, that the device
    /// created every buffer the request needed (see [`Pool::allocate_with_async`]).
    pub async fn allocate_async(&self, size_bytes: u64) -> Result<Allocation, PoolError> {
        self.allocate_with_async(size_bytes, AllocOptions::default())
            .await
    }

    /// [`Pool::allocate_with`], awaiting the device's word on every buffer the request created
    /// (its error scopes) without blocking the thread. Natively the synchronous call already
    /// waits for that word; in a browser it cannot, so a segment the device refuses there (out
    /// of memory) is only seen by this call, or reaches the device's uncaptured-error handler.
    /// Errors as [`Pool::allocate_with`], and [`PoolError::DeviceRefused`] when the device
    /// refused a buffer made for this request: the allocation is then undone and the segment
    /// given back.
    pub async fn allocate_with_async(
        &self,
        size_bytes: u64,
        options: AllocOptions<'_>,
    ) -> Result<Allocation, PoolError> {
        let device = &self.shared.gpu.device;
        let out_of_memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = self.allocate_with(size_bytes, options);
        let validation = validation.pop().await;
        let out_of_memory = out_of_memory.pop().await;
        let Some(error) = validation.or(out_of_memory) else {
            return result;
        };
        if let Ok(allocation) = result {
            // Never used by any work: freed at once, and its segment (new, so holding nothing
            // else) given back.
            let segment = allocation.segment();
            self.free_submitted([allocation]);
            self.shared.release_if_empty(segment);
        }
        Err(PoolError::DeviceRefused {
            requested_bytes: size_bytes,
            reason: error.to_string(),
        })
    }

    /// [`Pool::allocate_with`] in a segment sized for the request, whatever its size: the
    /// pool reserves for it the request rounded up to the policy's `min_block_bytes` and no more
    /// (a new segment of the large class's, or the tightest free range of a large segment that
    /// the policy's large rules allow), where [`Pool::allocate_with`] would place a request of up
    /// to 16 MiB (by default) in power-of-two segments shared with others. For long-lived
    /// allocations whose reservation must be known before they are made, such as a KV cache
    /// sized to a budget: [`Pool::own_segment_bytes`] says what each will reserve. In the naive
    /// baseline every allocation has a segment of its own anyway. Errors as
    /// [`Pool::allocate_with`].
    pub fn allocate_in_own_segment(
        &self,
        size_bytes: u64,
        options: AllocOptions<'_>,
    ) -> Result<Allocation, PoolError> {
        self.allocate_as(size_bytes, options, true)
    }

    /// The bytes [`Pool::allocate_in_own_segment`] reserves for a request of `size_bytes` when it
    /// makes a segment for it: the request rounded up to the policy's `min_block_bytes`.
    pub fn own_segment_bytes(&self, size_bytes: u64) -> u64 {
        self.shared.lock().core.own_segment_bytes(size_bytes)
    }

    /// [`Pool::allocate_with`], in a segment of its own or not
    /// ([`Pool::allocate_in_own_segment`]).
    fn allocate_as(
        &self,
        size_bytes: u64,
        options: AllocOptions<'_>,
        own_segment: bool,
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
        let max_allocation_bytes = max_allocation_bytes(self.shared.max_buffer_size);
        if size_bytes > max_allocation_bytes {
            return Err(PoolError::ExceedsBufferLimit {
                requested_bytes: size_bytes,
                max_buffer_size: max_allocation_bytes,
            });
        }
        let label = Label::new(options.label);
        let reserved = self.shared.reserve(size_bytes, &label, own_segment)?;
        let allocation = Allocation::new(Arc::clone(&self.shared), reserved, size_bytes, label);
        if options.zeroed {
            let mut encoder =
                self.shared
                    .gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("wgpu-pool zero"),
                    });
            encoder.clear_buffer(
                allocation.buffer(),
                allocation.offset(),
                Some(allocation.allocated_size()),
            );
            self.shared.gpu.queue.submit([encoder.finish()]);
        }
        Ok(allocation)
    }

    /// Hands `allocation`'s range to a new owner at once, labelled `label` (with the op in scope),
    /// instead of dropping it and waiting for a submission: reuse ordered by the command stream,
    /// as PyTorch's caching allocator reuses a block freed on the same CUDA stream. The history
    /// records the old owner's free and the new owner's allocation at the same place; the
    /// policy's counters see one allocation throughout (the range never left the pool). An
    /// allocation of another pool comes back unchanged.
    ///
    /// Sound only where every use of the new owner is ordered after every use of the old one on
    /// the GPU: both recorded into one command stream in that order (the compute context's open
    /// batch, whose dispatches wgpu separates by barriers), the new owner first written by a
    /// command recorded after the old owner's last use, and no [`Pool::write`] into it (which
    /// lands at the start of the next submission, before those commands) until that stream is
    /// submitted. The compute context reuses this way the tensors dropped in its open batch for
    /// its ops' outputs.
    pub(crate) fn reuse(&self, mut allocation: Allocation, label: &str) -> Allocation {
        if allocation.is_of(&self.shared) {
            let label = Label::new(label);
            self.shared.hand_over(allocation.live_slot(), &label);
            allocation.set_label(label);
        }
        allocation
    }

    /// Submits `command_buffers`, then releases the ranges of allocations dropped before this call
    /// (see the module documentation). Returns the submission index.
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        command_buffers: I,
    ) -> wgpu::SubmissionIndex {
        self.shared.submit(command_buffers.into_iter().collect())
    }

    /// Declares that every command buffer recorded so far has been submitted (by the caller, through
    /// the queue), so that ranges dropped before this call can be reused.
    pub fn mark_submitted(&self) {
        self.shared.mark_submitted();
    }

    /// Frees allocations whose last use is in work already submitted (through [`Pool::submit`]
    /// or the queue): their ranges are reusable at once, whatever anyone submits next. Dropping
    /// an allocation instead makes it wait for the next submission through the pool, which is
    /// right only if no one else submits before the work that uses it. With `zero_on_free` the
    /// ranges are cleared first (one more submission). The compute context frees the tensors
    /// dropped during a batch this way, after submitting the batch.
    ///
    /// An allocation of another pool is dropped as usual instead: its range waits for its own
    /// pool's next submission (this pool's submissions say nothing of that pool's work).
    pub fn free_submitted<I: IntoIterator<Item = Allocation>>(&self, allocations: I) {
        let mut any = false;
        for mut allocation in allocations {
            if !allocation.is_of(&self.shared) {
                drop(allocation);
                continue;
            }
            allocation.set_last_use_submitted();
            any = true;
            drop(allocation);
        }
        if any && self.shared.options.zero_on_free {
            self.submit([]);
        }
    }

    /// Sets (or with `None` removes) the function called at every out-of-memory refusal of this
    /// pool, with the refusal and the pool as it was at that moment ([`OomReport`]: its
    /// `snapshot()` is what PyTorch's `_dump_snapshot` writes from an out-of-memory observer).
    /// It runs on the thread whose request was refused, after the pool's lock is released, before
    /// the error is returned; it may use the pool. Taking the report costs a memory state (and a
    /// copy of the history) per refusal, and nothing while no observer is set. An observer that
    /// holds a clone of the pool keeps the pool alive until it is removed.
    pub fn set_oom_observer(&self, observer: Option<OomObserver>) {
        *self
            .shared
            .oom_observer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = observer;
    }

    /// Ranges dropped but not yet reusable (waiting for a submission), and their bytes.
    pub fn pending_frees(&self) -> (usize, u64) {
        self.shared.lock().pending_totals()
    }

    /// Gives back every empty segment (PyTorch's `empty_cache`) and the read-back staging buffer
    /// (outside the statistics, shown by [`Pool::memory_state`] as `staging_bytes`). Returns the
    /// bytes of segments given back (the statistics' reserved bytes). Ranges waiting for a
    /// submission keep their segments.
    pub fn trim(&self) -> u64 {
        // The staging lock is not held with the state's (a read takes them in that order).
        self.shared.release_staging();
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let released = state.core.trim();
        let segment_events = state.core.take_events();
        if let Some(history) = &mut state.history {
            record_segment_events(history, segment_events, self.shared.now_us());
        }
        released
    }

    /// Moves allocations among `allocations` (and only those) so that a request of `size_bytes`
    /// fits in the segments the pool holds, within `limits` (`PoolCore::compaction_plan_where`),
    /// and re-points their handles: each moved handle names its new buffer, offset and segment;
    /// data, size and label stay. The copies are submitted on the queue (after everything
    /// submitted before) and the old ranges become reusable after that submission. Work recorded
    /// but not submitted that uses one of `allocations`, or bind groups made over them, must not
    /// outlive the call: submit the work first, make the bind groups again. Nothing moves when the
    /// request already fits or no plan over these allocations makes room. Room is made in a
    /// segment by moving allocations out of it into other segments' free space, never within
    /// it, so one segment's holes are not closed up. Allocations of another pool are passed
    /// over. The compute context's `Context::compact_for` calls this with its tensors.
    pub fn compact_for(
        &self,
        size_bytes: u64,
        allocations: &mut [&mut Allocation],
        limits: CompactionLimits,
    ) -> Result<Compaction, PoolError> {
        compact::compact_for(&self.shared, size_bytes, allocations, limits)
    }

    /// Empties packed segments and segments of free ranges by moving their allocations — all of
    /// them among `allocations`, at most `limits.max_moves` per segment — into free space of the
    /// other segments of their kind (least occupied first, `PoolCore::evacuation_plan`), and gives each emptied segment back, until
    /// no further one can be emptied. Moved handles are re-pointed, with the same rules as
    /// [`Pool::compact_for`].
    pub fn compact_segments(
        &self,
        allocations: &mut [&mut Allocation],
        limits: CompactionLimits,
    ) -> Result<Compaction, PoolError> {
        compact::compact_segments(&self.shared, allocations, limits)
    }

    /// What [`Pool::compact_for`] with [`CompactionLimits::default`] would move over these
    /// allocations to make room for `size_bytes`, without moving anything; `None` when it would
    /// not make room (or the request already fits a free block: then the estimate moves nothing).
    pub fn compaction_estimate(
        &self,
        size_bytes: u64,
        allocations: &[&Allocation],
    ) -> Option<CompactionEstimate> {
        compact::estimate(&self.shared, size_bytes, allocations)
    }

    /// Names parts of `allocation` in the pool's memory state and the snapshots and JSON
    /// report made from it (the text summary and segment maps show sizes, not labels): `parts`
    /// are `(offset from the allocation's start, bytes, label)`, each shown as a
    /// span labelled `"<allocation's label>: <label>"` (a plan's arena names the tensors that share
    /// each range). Replaces earlier parts; empty parts show the allocation whole again. Parts
    /// that are empty, overlap or pass the allocation's size are [`PoolError::InvalidParts`] and
    /// change nothing.
    pub fn label_parts(
        &self,
        allocation: &Allocation,
        parts: &[(u64, u64, String)],
    ) -> Result<(), PoolError> {
        allocation.check_pool(&self.shared)?;
        let mut sorted = parts.to_vec();
        sorted.sort_by_key(|part| part.0);
        let size_bytes = allocation.size();
        let invalid = |reason: String| PoolError::InvalidParts { size_bytes, reason };
        let mut end = 0;
        for (offset, bytes, label) in &sorted {
            if *bytes == 0 {
                return Err(invalid(format!("part {label:?} is empty")));
            }
            if *offset < end {
                return Err(invalid(format!(
                    "part {label:?} at {offset} overlaps the one before"
                )));
            }
            end = offset
                .checked_add(*bytes)
                .filter(|&end| end <= size_bytes)
                .ok_or_else(|| {
                    invalid(format!(
                        "part {label:?} at {offset} of {bytes} bytes passes the end"
                    ))
                })?;
        }
        let mut state = self.shared.lock();
        if let Some(live) = state.live.get_mut(allocation.live_slot()) {
            live.parts = sorted;
        }
        Ok(())
    }

    /// Sets or clears the budget on reserved bytes. See [`Pool::budget_scope`] for a guard that
    /// puts back the budget set before.
    pub fn set_budget(&self, budget_bytes: Option<u64>) {
        self.shared.lock().core.set_budget(budget_bytes);
    }

    /// The budget on reserved bytes, if any.
    pub fn budget(&self) -> Option<u64> {
        self.shared.lock().core.config().budget_bytes
    }

    /// Sets the budget to `budget_bytes` (`None`: no budget) until the guard is dropped, then puts
    /// back the budget the pool had before — unless the budget was changed meanwhile by hand
    /// ([`Pool::set_budget`]), which is then left as it is. The guard holds a clone of the pool
    /// (cheap), so it may live in a struct beside the pool's users, as a server's budget does.
    /// Scopes nest: dropped in the reverse order of their making, each puts back the one before.
    pub fn budget_scope(&self, budget_bytes: Option<u64>) -> BudgetScope {
        let previous = {
            let mut state = self.shared.lock();
            let previous = state.core.config().budget_bytes;
            state.core.set_budget(budget_bytes);
            previous
        };
        BudgetScope {
            pool: self.clone(),
            previous,
            set: budget_bytes,
        }
    }

    /// The statistics (current, peak and total of reserved, allocated and requested bytes,
    /// allocations and segments; `create_buffer` calls; OOMs; free-space figures).
    pub fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        let mut stats = state.core.stats();
        let (frees, bytes) = state.pending_totals();
        stats.pending_frees = frees as u64;
        stats.pending_free_bytes = bytes;
        stats
    }

    /// Segments given back so far (`stats().segments.freed`), without the scans of
    /// [`Pool::stats`]: for the compute context, which asks at every submission.
    pub(crate) fn segments_freed(&self) -> u64 {
        self.shared.lock().core.counters().segments.freed
    }

    /// Starts new peaks from the current values.
    pub fn reset_peaks(&self) {
        self.shared.lock().core.reset_peaks();
    }

    /// The policy in use (for the naive baseline, the naive mode: [`PolicyConfig::is_naive`]).
    pub fn policy(&self) -> PolicyConfig {
        self.shared.lock().core.config().clone()
    }

    /// Per-segment figures: id, size, size class, the buddy statistics and the free spans, in
    /// slot order (in the naive baseline, one dedicated segment per live allocation).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        segment_infos(&self.shared.lock().core)
    }

    /// Switches history recording on (a fresh, empty ring whose totals start from the pool's
    /// current figures) or off (`None`, dropping what was recorded). Like PyTorch's
    /// `_record_memory_history`.
    pub fn set_history(&self, options: Option<HistoryOptions>) {
        let mut state = self.shared.lock();
        let baseline = Totals::of_stats(&state.core.stats());
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

    /// The pool's memory as plain data: its statistics and policy, and every segment (in id
    /// order) tiled, in address order, by its allocations, pending frees and free blocks. Taken
    /// under one lock, so the figures agree with each other. O(segments + live allocations + free
    /// blocks).
    pub fn memory_state(&self) -> PoolState {
        self.shared.memory_state_of(&self.shared.lock())
    }

    /// [`Pool::memory_state`] and [`Pool::history`] taken under one lock, so that the history ends
    /// exactly at the state.
    pub fn state_and_history(&self) -> (PoolState, Option<History>) {
        let guard = self.shared.lock();
        (self.shared.memory_state_of(&guard), guard.history.clone())
    }

    /// The pool as a PyTorch memory snapshot: its segments (blocks tiling each one) and, when
    /// history is on, its events as device 0's trace. Write it with
    /// [`Snapshot::to_pickle_bytes`] for `python -m torch.cuda._memory_viz` and
    /// pytorch.org/memory_viz. See [`crate::state::pytorch_snapshot`] for the mapping.
    pub fn snapshot(&self) -> Snapshot {
        // Under one lock, so that the trace ends exactly at the state the segments show.
        let guard = self.shared.lock();
        let state = self.shared.memory_state_of(&guard);
        crate::state::pytorch_snapshot(&state, guard.history.as_ref())
    }

    /// Uploads `data` at `offset_bytes` into `allocation` with `queue.write_buffer` (it lands at
    /// the start of the next submission). The offset must be a multiple of 4, and so must the
    /// length unless the write ends at the allocation's [`size`](Allocation::size) (its last
    /// partial word is then padded with zeros into the bytes that round the size up to 4). An
    /// allocation of another pool is refused ([`PoolError::ForeignAllocation`]).
    pub fn write(
        &self,
        allocation: &Allocation,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        self.shared.write(allocation, offset_bytes, data)
    }

    /// Reads the whole allocation back, exactly [`size`](Allocation::size) bytes: submits a copy
    /// into a staging buffer (in pieces of at most [`MAX_STAGING_BYTES`]) and waits for it,
    /// blocking the thread (in async code or a browser, use [`Pool::read_async`]). Work recorded but not submitted is not included. An
    /// allocation of another pool is refused ([`PoolError::ForeignAllocation`]).
    pub fn read(&self, allocation: &Allocation) -> Result<Vec<u8>, PoolError> {
        self.shared.read_via(allocation, None)
    }

    /// Submits `command_buffers` as [`Pool::submit`] does (ranges dropped before this call become
    /// reusable after it), with a copy of `allocation` behind them in the same submission; then
    /// waits for it and returns the allocation's bytes (exactly its size). The work and its
    /// read-back cost one submission instead of two. An allocation of another pool is refused
    /// ([`PoolError::ForeignAllocation`]) after the work is submitted.
    pub fn submit_and_read<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        command_buffers: I,
        allocation: &Allocation,
    ) -> Result<Vec<u8>, PoolError> {
        self.shared
            .read_via(allocation, Some(command_buffers.into_iter().collect()))
    }

    /// Uploads the elements `data` at `offset_bytes` into `allocation`: [`Pool::write`] of their
    /// bytes (so any `T: Pod`, of any byte length that ends at the allocation's size or is a
    /// multiple of 4).
    pub fn write_slice<T: bytemuck::Pod>(
        &self,
        allocation: &Allocation,
        offset_bytes: u64,
        data: &[T],
    ) -> Result<(), PoolError> {
        self.write(allocation, offset_bytes, bytemuck::cast_slice(data))
    }

    /// Reads the whole allocation back as elements of `T` ([`Pool::read`]); its size must be a
    /// whole number of them ([`PoolError::ElementSize`] else, before anything is read).
    pub fn read_vec<T: bytemuck::Pod>(&self, allocation: &Allocation) -> Result<Vec<T>, PoolError> {
        let count = element_count::<T>(allocation)?;
        let bytes = self.read(allocation)?;
        Ok(to_elements(&bytes, count))
    }

    /// [`Pool::read`] as a future that does not block the thread: for async code, and the read a
    /// browser can run. Each piece is copied into a staging buffer of the read's own (dropped
    /// after it) and awaited; on native backends the future polls the device without waiting
    /// each time it is polled, and asks to be polled again until the copy is done.
    pub async fn read_async(&self, allocation: &Allocation) -> Result<Vec<u8>, PoolError> {
        self.shared.read_async(allocation).await
    }

    /// [`Pool::read_async`] of `size` bytes at `offset` of `buffer` (a range of `binding_size`
    /// bytes, a multiple of 4, of one of this pool's allocations): for the compute context, which
    /// pins a tensor's range instead of holding its allocation across the wait.
    pub(crate) async fn read_range_async(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        binding_size: u64,
        size: u64,
    ) -> Result<Vec<u8>, PoolError> {
        self.shared
            .read_range_async(buffer, offset, binding_size, size)
            .await
    }

    /// [`Pool::read_vec`] as a future ([`Pool::read_async`]).
    pub async fn read_vec_async<T: bytemuck::Pod>(
        &self,
        allocation: &Allocation,
    ) -> Result<Vec<T>, PoolError> {
        let count = element_count::<T>(allocation)?;
        let bytes = self.read_async(allocation).await?;
        Ok(to_elements(&bytes, count))
    }

    /// [`Pool::submit_and_read`] as elements of `T`. When the allocation's size is not a whole
    /// number of them, the work is submitted all the same and nothing is read
    /// ([`PoolError::ElementSize`]).
    pub fn submit_and_read_vec<T: bytemuck::Pod, I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        command_buffers: I,
        allocation: &Allocation,
    ) -> Result<Vec<T>, PoolError> {
        let count = match element_count::<T>(allocation) {
            Ok(count) => count,
            Err(error) => {
                self.submit(command_buffers);
                return Err(error);
            }
        };
        let bytes = self.submit_and_read(command_buffers, allocation)?;
        Ok(to_elements(&bytes, count))
    }
}

/// How many elements of `T` `allocation` holds, or [`PoolError::ElementSize`].
fn element_count<T>(allocation: &Allocation) -> Result<usize, PoolError> {
    let element_bytes = std::mem::size_of::<T>() as u64;
    let size_bytes = allocation.size();
    if element_bytes == 0 || !size_bytes.is_multiple_of(element_bytes) {
        return Err(PoolError::ElementSize {
            size_bytes,
            element_bytes,
        });
    }
    usize::try_from(size_bytes / element_bytes).map_err(|_| PoolError::ElementSize {
        size_bytes,
        element_bytes,
    })
}

/// The elements of `T` in `bytes` (a whole number of them), whatever their alignment.
pub(crate) fn to_elements<T: bytemuck::Pod>(bytes: &[u8], count: usize) -> Vec<T> {
    let mut elements = vec![T::zeroed(); count];
    bytemuck::cast_slice_mut::<T, u8>(&mut elements).copy_from_slice(bytes);
    elements
}

/// The largest allocation a device allows: its `max_buffer_size` rounded down to a multiple of
/// 4 bytes, since copies and clears move whole multiples of 4 (so a dedicated segment's size, and
/// every clear of it, is a multiple of 4).
fn max_allocation_bytes(max_buffer_size: u64) -> u64 {
    max_buffer_size / wgpu::COPY_BUFFER_ALIGNMENT * wgpu::COPY_BUFFER_ALIGNMENT
}

/// Puts back the budget the pool had before [`Pool::budget_scope`] when dropped (unless the
/// budget was changed meanwhile by hand).
#[must_use = "the budget scope ends when this guard is dropped"]
pub struct BudgetScope {
    pool: Pool,
    previous: Option<u64>,
    set: Option<u64>,
}

impl BudgetScope {
    /// The budget this scope set.
    pub fn budget_bytes(&self) -> Option<u64> {
        self.set
    }

    /// The budget the pool had before, which the scope puts back.
    pub fn previous_bytes(&self) -> Option<u64> {
        self.previous
    }
}

impl std::fmt::Debug for BudgetScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetScope")
            .field("budget_bytes", &self.set)
            .field("previous_bytes", &self.previous)
            .finish()
    }
}

impl Drop for BudgetScope {
    fn drop(&mut self) {
        let mut state = self.pool.shared.lock();
        if state.core.config().budget_bytes == self.set {
            state.core.set_budget(self.previous);
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
