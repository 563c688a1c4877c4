//! The compute context: records ops into one open compute pass and command encoder, submits
//! them in batches through the pool, and caches pipelines and bind groups.
//!
//! # Batches
//!
//! An op validates its operands on the host, allocates its output from the pool, and records one
//! or two dispatches into the open pass (a new pass costs ~35–40 µs of CPU on NVIDIA, a dispatch
//! in an open pass ~1 µs). The batch is submitted — through [`Pool::submit`], so that tensors
//! dropped during the batch become reusable only after the submission that carries their last use
//! — when:
//!
//! - a tensor is read back ([`Context::read`]) or overwritten ([`Context::write`]),
//! - [`Context::flush`] or [`Context::sync`] is called,
//! - the batch holds [`ContextOptions::max_ops_per_batch`] dispatches,
//! - tensors of more than [`ContextOptions::flush_when_freed_bytes_exceed`] bytes were dropped
//!   since the last submission (checked before an op allocates its output, so that it can reuse
//!   their memory).
//!
//! An op's output takes the memory of a tensor of its size dropped earlier in the open batch (the
//! most recently dropped), as PyTorch's allocator reuses a block freed on the same stream: the op's
//! dispatch, recorded after every use of the dropped tensor, writes it first, and wgpu puts a
//! barrier between them (`Pool::reuse`; [`Context::write`] submits the batch before its upload
//! lands). Beyond that the pool cannot reuse what was dropped until the batch is submitted: a
//! batch's memory peak is what was live when it began plus the outputs no dropped tensor of the
//! same size could take. A stream of `add`s over 4M elements thus writes one range again and
//! again (kept in the GPU's cache) instead of a new one per op.
//!
//! This module knows dispatches and allocations, not tensors: the context's methods that make,
//! write and read tensors are in [`super::tensor`], its ops in [`super::ops`]. It is the batch
//! engine: what its handles share (the recording state, the tensors' storages and their
//! registry, the hand-over of dropped tensors' ranges) is in the private module `shared`, its
//! options and statistics in `options`, how a dispatch is recorded (bind groups, passes, the
//! uniform ring) in `record`, and its compaction entry points in `compaction`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::kernels::Kernels;
use super::record::{storage_group, BindGroups, Encoded, LayoutId, ParamsRing, Range};
use super::shared::{
    lock_ignoring_poison, Batch, PlanReadBack, Shared, State, Step, Storage, Tape,
};
use super::timing::{KernelTiming, Timer, TimestampSupport};
use super::types::{ComputeError, KernelKey, ParamsBlock, PARAMS_BYTES};
use super::user_kernel::{UserBindGroup, UserKernel};
use crate::device::Gpu;
use crate::pool::{Allocation, Pool};
use crate::state::BufferRole;

pub use super::options::{ContextOptions, ContextStats};
pub use super::shared::TensorAllocation;

/// One dispatch, validated by its op.
pub(crate) struct Dispatch<'a> {
    pub(crate) kernel: KernelKey,
    pub(crate) params: ParamsBlock,
    /// The storage bindings, in binding order (1, 2, ...): the tensors' storages.
    pub(crate) bindings: &'a [&'a Arc<Storage>],
    pub(crate) workgroups: [u32; 3],
}

/// Capture ids, unique in the process (0 is "not capturing").
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// Records ops on [`Tensor`](super::Tensor)s into batched command buffers. Cheap to clone (clones share one
/// context); `Send + Sync` (ops from several threads are recorded one at a time).
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("options", &self.shared.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Context {
    /// A context whose tensors live in `pool` (on the pool's device).
    pub fn new(pool: &Pool, options: ContextOptions) -> Result<Self, ComputeError> {
        if !(1..=65_536).contains(&options.max_ops_per_batch) {
            return Err(ComputeError::Config(format!(
                "max_ops_per_batch must be 1..=65536, not {}",
                options.max_ops_per_batch
            )));
        }
        if options.max_grid_x == Some(0) {
            return Err(ComputeError::Config("max_grid_x must not be 0".into()));
        }
        let gpu = pool.gpu().clone();
        let limits = gpu.device.limits();
        options.matmul.validate(&limits)?;
        let timer = if options.profile {
            Timer::new(&gpu)
        } else {
            None
        };
        let state = State {
            kernels: Kernels::new(&gpu.device, options.shader_checks),
            bind_groups: BindGroups::new(options.max_cached_bind_groups, !pool.is_naive()),
            ring: ParamsRing::new(
                &gpu,
                options.max_ops_per_batch,
                limits.min_uniform_buffer_offset_alignment,
            ),
            batch: Batch::default(),
            timer,
            timings: Vec::new(),
            stats: ContextStats::default(),
            segments_freed_seen: pool.segments_freed(),
            tape: None,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                pool: pool.clone(),
                timestamps: TimestampSupport::of(&gpu.device),
                gpu,
                options,
                limits,
                freed_bytes: AtomicU64::new(0),
                deferred: Mutex::new(HashMap::new()),
                deferred_exposed: Mutex::new(Vec::new()),
                plan_read_back: Mutex::new(None),
                batch_open: AtomicBool::new(false),
                capturing: AtomicU64::new(0),
                registry: Mutex::new(HashMap::new()),
                moved: AtomicU64::new(0),
                tuned: OnceLock::new(),
                state: Mutex::new(state),
            }),
        })
    }

    /// The pool the tensors live in.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The device and queue.
    pub fn gpu(&self) -> &Gpu {
        &self.shared.gpu
    }

    /// The options the context was made with.
    pub fn options(&self) -> &ContextOptions {
        &self.shared.options
    }

    /// The device's limits.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.shared.limits
    }

    /// What the adapter offers for GPU timing.
    pub fn timestamp_support(&self) -> TimestampSupport {
        self.shared.timestamps
    }

    /// What the context did so far.
    pub fn stats(&self) -> ContextStats {
        let state = self.shared.lock();
        ContextStats {
            pipelines_created: state.kernels.pipelines_created + state.stats.user_kernels,
            cached_bind_groups: state.bind_groups.len() as u64,
            bind_groups_created: state.bind_groups.created,
            bind_group_cache_hits: state.bind_groups.hits,
            passes: state.batch.recorder.passes,
            ..state.stats
        }
    }

    /// Dispatches (and clears of [`Context::zeros`]) recorded but not yet submitted.
    pub fn pending_dispatches(&self) -> u32 {
        self.shared.lock().batch.dispatches
    }

    /// Submits the open batch (which may compute `allocation`) together with a read-back of
    /// `allocation`, and waits for it: the allocation's bytes.
    pub(crate) fn read_allocation(&self, allocation: &Allocation) -> Result<Vec<u8>, ComputeError> {
        // The open batch and the read-back go in one submission.
        let mut state = self.shared.lock();
        let (buffers, timed) = self.finish_batch_locked(&mut state);
        let bytes = self.shared.pool.submit_and_read(buffers, allocation);
        self.after_submit_locked(&mut state, timed)?;
        Ok(bytes?)
    }

    /// Submits the open batch (possibly empty: that still releases the ranges of dropped tensors).
    pub fn flush(&self) -> Result<(), ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)
    }

    /// Submits the open batch and waits until the GPU has finished all work. Blocks the
    /// thread: in a browser use [`Context::sync_async`].
    pub fn sync(&self) -> Result<(), ComputeError> {
        self.flush()?;
        crate::device::wait_for_submitted(&self.shared.gpu.device)
            .map_err(|e| ComputeError::Wait(e.to_string()))
    }

    /// [`Context::sync`] as a future that does not block the thread (for async code and
    /// browsers): submits the open batch, then resolves when the GPU has finished all work
    /// submitted on the context's queue.
    pub async fn sync_async(&self) -> Result<(), ComputeError> {
        self.flush()?;
        let gpu = &self.shared.gpu;
        crate::device::submitted_work_done_async(&gpu.device, &gpu.queue)
            .await
            .map_err(ComputeError::Wait)?;
        match gpu.reported_errors() {
            Some(errors) => Err(crate::pool::PoolError::DeviceReported(errors).into()),
            None => Ok(()),
        }
    }

    /// The GPU times of the dispatches submitted since the last call (with
    /// [`ContextOptions::profile`] on an adapter with timestamps; empty otherwise).
    pub fn take_kernel_timings(&self) -> Vec<KernelTiming> {
        std::mem::take(&mut self.shared.lock().timings)
    }

    /// Forgets the cached bind groups (they keep the buffers they bind alive).
    pub fn clear_bind_groups(&self) {
        self.shared.lock().bind_groups.clear();
    }

    /// Submits the open batch, forgets the cached bind groups, gives the plans' read-back buffer
    /// back and every empty segment to the device ([`Pool::trim`]). Returns the bytes of
    /// segments given back.
    pub fn trim(&self) -> Result<u64, ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)?;
        state.bind_groups.clear();
        drop(state);
        // Taken alone: a plan reading back holds it and then the state's lock.
        *lock_ignoring_poison(&self.shared.plan_read_back) = None;
        Ok(self.shared.pool.trim())
    }

    /// The buffer plans of this context read their outputs back through, at least `bytes` long
    /// (made, or made larger, here), held until the guard drops: plans share it, so that serving
    /// many batch sizes holds one read-back buffer, not one per plan.
    pub(crate) fn plan_read_back(&self, bytes: u64) -> PlanReadBack<'_> {
        let mut slot = lock_ignoring_poison(&self.shared.plan_read_back);
        let bytes = bytes.max(4);
        if slot.as_ref().is_none_or(|buffer| buffer.size() < bytes) {
            // Dropped first, so that the old and the new one are not held at once. Grown to a
            // power of two where the device allows it, so that growing stays rare.
            *slot = None;
            let max = self.shared.gpu.device.limits().max_buffer_size;
            let size = bytes
                .checked_next_power_of_two()
                .filter(|&size| size <= max)
                .unwrap_or(bytes);
            *slot = Some(self.shared.gpu.create_accounted_buffer(
                BufferRole::PlanReadBack,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool plan read-back"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                },
            ));
        }
        PlanReadBack { slot }
    }

    /// The largest x dimension of a grid.
    pub(crate) fn max_grid_x(&self) -> u32 {
        let device = self.shared.limits.max_compute_workgroups_per_dimension;
        self.shared
            .options
            .max_grid_x
            .map_or(device, |cap| cap.min(device))
    }

    /// Called by an op before it allocates its output: submits the batch when enough was dropped
    /// (see [`ContextOptions::flush_when_freed_bytes_exceed`]).
    pub(crate) fn before_op(&self) -> Result<(), ComputeError> {
        if let Some(limit) = self.shared.options.flush_when_freed_bytes_exceed {
            if self.shared.freed_bytes.load(Ordering::Relaxed) > limit {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Compiles `kernel` if it is not yet (so that an op can fail before it records anything).
    pub(crate) fn prepare(&self, kernel: &KernelKey) -> Result<(), ComputeError> {
        self.shared.lock().kernels.pipeline(kernel).map(|_| ())
    }

    /// [`Context::record`] of bindings that are all different tensors (`Context::record`, in
    /// `tensor.rs`, binds a repeated one through a copy).
    pub(crate) fn record_distinct(&self, dispatch: Dispatch<'_>) -> Result<(), ComputeError> {
        let storage = dispatch.kernel.storage_bindings();
        if dispatch.bindings.len() != storage {
            return Err(ComputeError::Config(format!(
                "{} takes {storage} storage bindings, {} given",
                dispatch.kernel.entry,
                dispatch.bindings.len()
            )));
        }
        let allocations = self.allocations(dispatch.kernel.entry, dispatch.bindings)?;
        // The kernels view every binding as vec4s: guard the unchecked ones (a plan's arena
        // offsets are aligned to at least 16 bytes).
        for allocation in allocations.iter().flatten() {
            if !allocation.offset().is_multiple_of(16)
                || !allocation.binding_size().is_multiple_of(16)
            {
                return Err(ComputeError::Config(format!(
                    "{}: binding at offset {} of {} bytes is not 16-byte aligned",
                    dispatch.kernel.entry,
                    allocation.offset(),
                    allocation.binding_size()
                )));
            }
        }
        self.check_workgroups(dispatch.kernel.entry, dispatch.workgroups)?;

        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let pipeline = state.kernels.pipeline(&dispatch.kernel)?.clone();
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Kernel {
                kernel: dispatch.kernel,
                params: dispatch.params,
                bindings: dispatch.bindings.iter().map(|&s| s.clone()).collect(),
                workgroups: dispatch.workgroups,
            });
            return Ok(());
        }
        let ranges = allocations.iter().flatten().map(range_of).collect();
        let layout = state.kernels.layouts(storage).bind_group.clone();
        let kernel = dispatch.kernel;
        self.record_locked(
            state,
            RecordedOp {
                pipeline: &pipeline,
                layout: (LayoutId::Builtin(storage), &layout),
                params: Params::Block(&dispatch.params),
                ranges,
                more_groups: &[],
                workgroups: dispatch.workgroups,
                label: &|| kernel.label(),
            },
        )
    }

    /// The allocations of `storages` (`None` for symbolic tensors of the open capture). A
    /// symbolic tensor of no open capture is [`ComputeError::Symbolic`].
    fn allocations<'s>(
        &self,
        op: &'static str,
        storages: &'s [&'s Arc<Storage>],
    ) -> Result<Vec<Option<TensorAllocation<'s>>>, ComputeError> {
        let capture = self.capture_id();
        storages
            .iter()
            .map(|storage| match (storage.allocation(), storage.capture) {
                (Some(allocation), _) => Ok(Some(allocation)),
                (None, Some(id)) if Some(id) == capture => Ok(None),
                (None, _) => Err(ComputeError::Symbolic { op }),
            })
            .collect()
    }

    /// The id of the open capture, if any.
    pub(crate) fn capture_id(&self) -> Option<u64> {
        match self.shared.capturing.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Opens a capture: submits the open batch, then records into a tape until
    /// [`Context::end_tape`]. Refused while a capture is open.
    pub(crate) fn begin_tape(&self) -> Result<u64, ComputeError> {
        let mut state = self.shared.lock();
        if state.tape.is_some() {
            return Err(ComputeError::Capture(
                "the context is already capturing: finish or drop that capture first".into(),
            ));
        }
        self.flush_locked(&mut state)?;
        let id = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        state.tape = Some(Tape {
            id,
            steps: Vec::new(),
        });
        self.shared.capturing.store(id, Ordering::Release);
        Ok(id)
    }

    /// Closes the capture `id` (if it is the open one) and returns its tape.
    pub(crate) fn end_tape(&self, id: u64) -> Option<Tape> {
        let mut state = self.shared.lock();
        if state.tape.as_ref().is_some_and(|tape| tape.id == id) {
            self.shared.capturing.store(0, Ordering::Release);
            state.tape.take()
        } else {
            None
        }
    }

    /// The pipeline of `kernel`, compiled if it is not yet.
    pub(crate) fn pipeline(
        &self,
        kernel: &KernelKey,
    ) -> Result<wgpu::ComputePipeline, ComputeError> {
        self.shared.lock().kernels.pipeline(kernel).cloned()
    }

    /// The bind-group layout of the kernels with `storage` storage bindings (after the
    /// parameters' uniform at binding 0).
    pub(crate) fn kernel_layout(&self, storage: usize) -> wgpu::BindGroupLayout {
        self.shared
            .lock()
            .kernels
            .layouts(storage)
            .bind_group
            .clone()
    }

    /// Submits the open batch and then `buffers`, in one submission through the pool (so that
    /// both are ordered after everything recorded before, and the batch's dropped tensors are
    /// released after it); `before` runs first, under the context's lock (no op records
    /// meanwhile), for queue writes that must land before `buffers` but after the batch.
    ///
    /// `moved` is [`Context::moved_generation`] when `buffers` were recorded: if a compaction has
    /// moved tensors since, they may name ranges given back, and nothing is submitted (`None`).
    pub(crate) fn submit_after_batch(
        &self,
        before: impl FnOnce() -> Result<(), ComputeError>,
        buffers: Vec<wgpu::CommandBuffer>,
        moved: u64,
    ) -> Result<Option<wgpu::SubmissionIndex>, ComputeError> {
        let mut state = self.shared.lock();
        if state.tape.is_some() {
            return Err(ComputeError::Capture(
                "a plan cannot run while its context captures".into(),
            ));
        }
        // Compactions hold the lock throughout: none can move a tensor between here and the
        // submission.
        if self.moved_generation() != moved {
            return Ok(None);
        }
        // The batch first, in a submission of its own: queue writes land at the start of the
        // next submission, and the batch may read what they overwrite.
        if state.batch.dispatches > 0 {
            self.flush_locked(&mut state)?;
        }
        before()?;
        let index = self.shared.pool.submit(buffers);
        state.stats.submissions += 1;
        Ok(Some(index))
    }

    /// Records a dispatch of a user's `kernel` into the open pass (or the open capture's tape):
    /// `params` at binding 0 and `storage` at bindings `1..` of group 0, `groups` at groups `1..`.
    /// The allocations are those of live tensors: the batch holds their ranges from here until it
    /// is submitted (a tensor dropped meanwhile is kept, see [`Shared::free_tensor`]).
    pub(crate) fn record_user(
        &self,
        kernel: &UserKernel,
        params: &[u8],
        storage: &[&Arc<Storage>],
        groups: &[&UserBindGroup],
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        const OP: &str = "dispatch";
        self.check_workgroups(OP, workgroups)?;
        kernel.check_dispatch(params, storage.iter().map(|s| s.bytes), groups)?;
        let allocations = self.allocations(OP, storage)?;
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Custom {
                kernel: kernel.clone(),
                params: params.to_vec(),
                storage: storage.iter().map(|&s| s.clone()).collect(),
                groups: groups.iter().map(|&g| g.clone()).collect(),
                workgroups,
            });
            return Ok(());
        }
        let Some(allocations) = allocations.into_iter().collect::<Option<Vec<_>>>() else {
            return Err(ComputeError::Symbolic { op: OP });
        };
        let ranges = allocations.iter().map(range_of).collect();
        let more_groups: Vec<wgpu::BindGroup> = groups.iter().map(|g| g.group.clone()).collect();
        let inner = &*kernel.inner;
        self.record_locked(
            state,
            RecordedOp {
                pipeline: &inner.pipeline,
                layout: (LayoutId::User(inner.id), &inner.layout),
                params: if inner.params_bytes > 0 {
                    Params::Bytes(params, inner.params_binding_bytes)
                } else {
                    Params::None
                },
                ranges,
                more_groups: &more_groups,
                workgroups,
                label: &|| inner.label.clone(),
            },
        )?;
        state.stats.user_dispatches += 1;
        Ok(())
    }

    /// Counts a user's kernel made by the context.
    pub(crate) fn count_user_kernel(&self) {
        self.shared.lock().stats.user_kernels += 1;
    }

    /// Records a clear of `storage` to zeros into the open batch, between passes (or into the
    /// open capture's tape). It counts as a dispatch of the batch (so that an overwrite submits
    /// the batch first: an upload lands at the start of the next submission, before the clear).
    pub(crate) fn record_clear(&self, storage: &Arc<Storage>) -> Result<(), ComputeError> {
        let storages = [storage];
        let allocation = self.allocations("zeros", &storages)?.pop().flatten();
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Clear(storage.clone()));
            return Ok(());
        }
        let Some(allocation) = allocation else {
            return Err(ComputeError::Symbolic { op: "zeros" });
        };
        self.flush_if_full_locked(state, 0)?;
        self.shared.batch_open.store(true, Ordering::Release);
        // A clear is not a compute command: end the open pass.
        state.batch.recorder.end();
        let device = &self.shared.gpu.device;
        let encoder = state.batch.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgpu-pool compute batch"),
            })
        });
        // Offsets and binding sizes are multiples of 4 (`COPY_BUFFER_ALIGNMENT`).
        encoder.clear_buffer(
            allocation.buffer(),
            allocation.offset(),
            Some(allocation.binding_size()),
        );
        state.batch.dispatches += 1;
        Ok(())
    }

    /// Refuses a grid beyond the device's `max_compute_workgroups_per_dimension`.
    pub(crate) fn check_workgroups(
        &self,
        op: &'static str,
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        let limit = self.shared.limits.max_compute_workgroups_per_dimension;
        for (&count, name) in workgroups.iter().zip(["x", "y", "z"]) {
            if count > limit {
                return Err(ComputeError::ExceedsLimit {
                    op,
                    what: name,
                    value: u64::from(count),
                    limit_name: "max_compute_workgroups_per_dimension",
                    limit: u64::from(limit),
                });
            }
        }
        Ok(())
    }

    /// Submits the open batch if it holds `max_ops_per_batch` dispatches, the timer is full, or
    /// the parameter ring has no room for `params_slots` more slots.
    fn flush_if_full_locked(
        &self,
        state: &mut State,
        params_slots: u64,
    ) -> Result<(), ComputeError> {
        let timer_full = state.timer.as_ref().is_some_and(Timer::is_full);
        if state.batch.dispatches >= self.shared.options.max_ops_per_batch
            || timer_full
            || !state.ring.has_room(params_slots)
        {
            self.flush_locked(state)?;
        }
        Ok(())
    }

    /// Records one dispatch into the open pass (opening the encoder and pass if needed): its
    /// parameters into the ring, its bind group from the cache or made, then the dispatch. The
    /// one recording path of the context's kernels and users' kernels alike.
    fn record_locked(&self, state: &mut State, op: RecordedOp<'_>) -> Result<(), ComputeError> {
        let slots = match op.params {
            Params::Bytes(_, binding) => state.ring.slots_for(binding),
            Params::Block(_) | Params::None => 1,
        };
        self.flush_if_full_locked(state, slots)?;
        // The batch uses the dispatch's tensors from here on.
        self.shared.batch_open.store(true, Ordering::Release);
        let State {
            ring,
            bind_groups,
            batch,
            timer,
            ..
        } = state;
        let (params_offset, params_bytes) = match op.params {
            Params::Block(block) => (Some(ring.push(block)), Some(PARAMS_BYTES)),
            Params::Bytes(bytes, binding) => (Some(ring.push_bytes(bytes, binding)), Some(binding)),
            Params::None => (None, None),
        };
        let device = &self.shared.gpu.device;
        let (layout_id, layout) = op.layout;
        let group = bind_groups.get_or_make(layout_id, op.ranges, |ranges| {
            let params = params_bytes.map(|bytes| (&*ring.buffer, bytes));
            storage_group(device, "wgpu-pool compute", layout, params, ranges)
        });
        let encoder = batch.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgpu-pool compute batch"),
            })
        });
        let timing = timer.as_mut().map(|timer| (timer, (op.label)()));
        batch.recorder.dispatch(
            encoder,
            "wgpu-pool compute",
            &Encoded {
                pipeline: op.pipeline,
                group: &group,
                params_offset,
                more_groups: op.more_groups,
                workgroups: op.workgroups,
            },
            timing,
        );
        batch.dispatches += 1;
        state.stats.dispatches += 1;
        Ok(())
    }

    pub(crate) fn flush_locked(&self, state: &mut State) -> Result<(), ComputeError> {
        let (buffers, timed) = self.finish_batch_locked(state);
        // Through the pool: ranges of tensors dropped so far become reusable after this.
        self.shared.pool.submit(buffers);
        self.after_submit_locked(state, timed)
    }

    /// Ends the open pass and batch: its command buffer (if any), with the op parameters written
    /// so that they land at the start of the submission that carries it. Returns whether the
    /// batch resolves timestamps.
    fn finish_batch_locked(&self, state: &mut State) -> (Vec<wgpu::CommandBuffer>, bool) {
        // Ends the pass (dropping it records its end into the encoder).
        state.batch.recorder.end();
        let mut buffers = Vec::with_capacity(1);
        let mut timed = false;
        if let Some(mut encoder) = state.batch.encoder.take() {
            if let Some(timer) = &state.timer {
                timed = timer.resolve(&mut encoder);
            }
            buffers.push(encoder.finish());
        }
        // Lands at the start of the next submission, before the batch's dispatches.
        state.stats.params_bytes_written += state.ring.write(&self.shared.gpu.queue) as u64;
        state.ring.reset();
        state.batch.dispatches = 0;
        self.shared.freed_bytes.store(0, Ordering::Relaxed);
        (buffers, timed)
    }

    /// Bookkeeping after a batch was submitted: timings, and the bind groups of segments the pool
    /// gave back.
    fn after_submit_locked(&self, state: &mut State, timed: bool) -> Result<(), ComputeError> {
        state.stats.submissions += 1;
        // Cleared only now that the batch is submitted (and under the lock, so no op records
        // meanwhile): a tensor dropped before this point waits in `deferred`.
        self.shared.batch_open.store(false, Ordering::Release);
        self.shared.release_deferred();
        if timed {
            if let Some(timer) = &mut state.timer {
                let timings = timer.read(&self.shared.gpu.device)?;
                state.timings.extend(timings);
            }
        }
        // Cached bind groups keep their buffers alive: forget them when the pool gave segments
        // back, so that the memory really returns to the device.
        let freed = self.shared.pool.segments_freed();
        if freed != state.segments_freed_seen {
            state.bind_groups.clear();
            state.segments_freed_seen = freed;
        }
        Ok(())
    }
}

/// The storage range a dispatch binds for a tensor's allocation.
fn range_of(allocation: &TensorAllocation<'_>) -> Range {
    (
        allocation.buffer().clone(),
        allocation.offset(),
        allocation.binding_size(),
    )
}

/// A dispatch's parameters.
#[derive(Clone, Copy)]
enum Params<'a> {
    /// A kernel of the context's: one slot.
    Block(&'a ParamsBlock),
    /// A user's kernel's: its bytes and the bytes of its binding.
    Bytes(&'a [u8], u64),
    /// None (a user's kernel without parameters).
    None,
}

/// One dispatch for [`Context::record_locked`].
struct RecordedOp<'a> {
    pipeline: &'a wgpu::ComputePipeline,
    /// Group 0's layout and its key in the bind-group cache.
    layout: (LayoutId, &'a wgpu::BindGroupLayout),
    params: Params<'a>,
    ranges: Vec<Range>,
    more_groups: &'a [wgpu::BindGroup],
    workgroups: [u32; 3],
    /// The kernel's name, for timings.
    label: &'a dyn Fn() -> String,
}
