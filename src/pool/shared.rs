//! The state every clone of a pool and every allocation share: the policy's core over the buffer
//! storage, the live-allocation slab, the pending frees, the op in scope and the history, under one
//! lock; and what is done under it — reserving a range, freeing it (at once or after the next
//! submission), submitting and releasing, filling the plain-data state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use web_time::Instant;

use super::live::{
    allocation_event, fill_state, record_oom, record_segment_events, LiveAllocation, LiveSlab,
    StateLimits,
};
use super::options::{OomObserver, OomReport, PoolError, PoolOptions, ReuseSafety};
use super::storage::BufferStorage;
use crate::device::{AccountedBuffer, Gpu};
use crate::history::{EventKind, History, Label};
use crate::policy::{PolicyError, PoolCore, SegmentId};
use crate::state::PoolState;

/// A dropped allocation waiting for the submission that carries its last use.
pub(super) struct PendingFree {
    /// Its record in the live slab (which owns its placement).
    pub(super) live_slot: usize,
    pub(super) buffer: wgpu::Buffer,
    pub(super) offset_bytes: u64,
    pub(super) allocated_bytes: u64,
}

/// What the lock guards.
pub(super) struct State {
    pub(super) core: PoolCore<BufferStorage>,
    pub(super) pending: Vec<PendingFree>,
    pub(super) live: LiveSlab,
    /// The op in scope (see `Pool::op_scope`).
    pub(super) op: Option<Label>,
    /// The recorded history, when it is on.
    pub(super) history: Option<History>,
}

impl State {
    /// Ranges dropped but waiting for a submission, and their bytes.
    pub(super) fn pending_totals(&self) -> (usize, u64) {
        (
            self.pending.len(),
            self.pending.iter().map(|free| free.allocated_bytes).sum(),
        )
    }
}

/// A range just reserved for an allocation: what its handle needs.
pub(super) struct Reserved {
    pub(super) buffer: wgpu::Buffer,
    pub(super) live_slot: usize,
    pub(super) segment: SegmentId,
    pub(super) offset_bytes: u64,
    pub(super) allocated_bytes: u64,
}

/// The pool itself, shared by its clones and its allocations.
pub(super) struct Shared {
    pub(super) gpu: Gpu,
    pub(super) options: PoolOptions,
    /// The policy's naive mode: one buffer per allocation, freed at once.
    pub(super) naive: bool,
    pub(super) max_buffer_size: u64,
    pub(super) max_binding_bytes: u64,
    /// The pool's time origin: event times are microseconds since then.
    created: Instant,
    state: Mutex<State>,
    /// The staging buffer reads copy through, kept between reads (grown to the largest read).
    pub(super) staging: Mutex<Option<AccountedBuffer>>,
    /// The staging buffer's size (0 when there is none), readable without its lock.
    pub(super) staging_bytes: AtomicU64,
    /// Called at every out-of-memory refusal (`Pool::set_oom_observer`).
    pub(super) oom_observer: Mutex<Option<OomObserver>>,
    /// Whether the snapshot of [`PoolOptions::oom_snapshot`] was written.
    oom_snapshot_written: AtomicBool,
}

impl Shared {
    pub(super) fn new(gpu: &Gpu, options: PoolOptions, core: PoolCore<BufferStorage>) -> Self {
        let limits = gpu.device.limits();
        let history = options
            .history
            .map(|history| History::new(history, crate::history::Totals::default()));
        Self {
            gpu: gpu.clone(),
            naive: core.config().is_naive(),
            options,
            max_buffer_size: limits.max_buffer_size,
            max_binding_bytes: limits.max_storage_buffer_binding_size,
            created: Instant::now(),
            staging: Mutex::new(None),
            staging_bytes: AtomicU64::new(0),
            oom_observer: Mutex::new(None),
            oom_snapshot_written: AtomicBool::new(false),
            state: Mutex::new(State {
                core,
                pending: Vec::new(),
                live: LiveSlab::default(),
                op: None,
                history,
            }),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the counters half-updated in a way that
        // matters more than losing the pool: carry on with the data as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Microseconds since the pool was created.
    pub(super) fn now_us(&self) -> u64 {
        u64::try_from(self.created.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Asks the policy for `size_bytes` (already checked against the device's limits) and records
    /// the allocation in the slab and the history; with `own_segment`, placed in a segment sized
    /// for it (`PoolCore::allocate_own_segment`).
    pub(super) fn reserve(
        &self,
        size_bytes: u64,
        label: &Label,
        own_segment: bool,
    ) -> Result<Reserved, PoolError> {
        let mut guard = self.lock();
        let State {
            core,
            live,
            op,
            history,
            ..
        } = &mut *guard;
        if self.naive {
            // The label of the one buffer this request gets.
            label
                .as_ref()
                .clone_into(&mut core.storage_mut().allocation_label);
        }
        let result = if own_segment {
            core.allocate_own_segment(size_bytes)
        } else {
            core.allocate(size_bytes)
        };
        // Drained always, so that the policy's event list stays empty when history is off; an
        // empty list costs nothing to take.
        let segment_events = core.take_events();
        let time_us = history.as_ref().map(|_| self.now_us());
        if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
            record_segment_events(history, segment_events, time_us);
            if let Err(PolicyError::OutOfMemory(oom)) = &result {
                record_oom(history, time_us, oom, op.as_ref());
            }
        }
        let placement = match result {
            Ok(placement) => placement,
            Err(PolicyError::OutOfMemory(oom)) => {
                // The pool as it is at the refusal, taken under this lock; observers run after
                // it is released (they may use the pool).
                let report = self.wants_oom_report().then(|| OomReport {
                    error: (*oom).clone(),
                    state: self.memory_state_of(&guard),
                    history: guard.history.clone(),
                });
                drop(guard);
                if let Some(report) = report {
                    self.observe_oom(&report);
                }
                return Err(PolicyError::OutOfMemory(oom).into());
            }
            Err(error) => return Err(error.into()),
        };
        let buffer = core
            .segment(placement.slot())
            .expect("placement's segment is held")
            .memory
            .clone();
        let (segment, offset_bytes, allocated_bytes) = (
            placement.segment(),
            placement.offset(),
            placement.allocated_size(),
        );
        let entry = LiveAllocation {
            placement,
            label: label.clone(),
            op: op.clone(),
            pending: false,
            parts: Vec::new(),
        };
        if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
            history.record(allocation_event(EventKind::Alloc, time_us, &entry));
        }
        Ok(Reserved {
            buffer,
            live_slot: live.insert(entry),
            segment,
            offset_bytes,
            allocated_bytes,
        })
    }

    /// Whether a refusal is to be reported: an observer is set, or the snapshot of
    /// [`PoolOptions::oom_snapshot`] is still to be written.
    fn wants_oom_report(&self) -> bool {
        (self.options.oom_snapshot.is_some() && !self.oom_snapshot_written.load(Ordering::Acquire))
            || self
                .oom_observer
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .is_some()
    }

    /// Writes the snapshot of [`PoolOptions::oom_snapshot`] (at the first refusal only) and calls
    /// the observer.
    fn observe_oom(&self, report: &OomReport) {
        if let Some(path) = &self.options.oom_snapshot {
            if !self.oom_snapshot_written.swap(true, Ordering::AcqRel) {
                let written = report
                    .snapshot()
                    .to_pickle_bytes()
                    .map_err(|error| error.to_string())
                    .and_then(|bytes| write_file(path, &bytes));
                if let Err(error) = written {
                    log::warn!(
                        "wgpu-pool: the out-of-memory snapshot could not be written to {}: {error}",
                        path.display()
                    );
                }
            }
        }
        let observer = self
            .oom_observer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some(observer) = observer {
            observer(report);
        }
    }

    /// Frees the allocation recorded in `live_slot`: at once when reuse is immediate, its last use
    /// is submitted, or the pool is naive (its buffer is given back, nothing waits for reuse);
    /// else it waits for the next submission through the pool.
    pub(super) fn free(&self, live_slot: usize, buffer: wgpu::Buffer, last_use_submitted: bool) {
        let mut guard = self.lock();
        let State {
            core,
            pending,
            live,
            history,
            ..
        } = &mut *guard;
        let time_us = history.as_ref().map(|_| self.now_us());
        if let (Some(history), Some(time_us), Some(entry)) =
            (history.as_mut(), time_us, live.get(live_slot))
        {
            history.record(allocation_event(EventKind::FreeRequested, time_us, entry));
        }
        let at_once = self.naive
            || ((self.options.reuse == ReuseSafety::Immediate || last_use_submitted)
                && !self.options.zero_on_free);
        if at_once {
            release_slots(core, live, history, time_us, [live_slot]);
        } else if let Some(entry) = live.get_mut(live_slot) {
            entry.pending = true;
            pending.push(PendingFree {
                live_slot,
                buffer,
                offset_bytes: entry.placement.offset(),
                allocated_bytes: entry.placement.allocated_size(),
            });
        }
    }

    /// Gives segment `id` back to the device if it holds nothing (recorded in the history).
    /// Returns its bytes, or 0.
    pub(super) fn release_if_empty(&self, id: SegmentId) -> u64 {
        let mut guard = self.lock();
        let state = &mut *guard;
        let released = state.core.release_if_empty(id);
        let events = state.core.take_events();
        if let Some(history) = &mut state.history {
            record_segment_events(history, events, self.now_us());
        }
        released
    }

    /// Hands the live allocation in `live_slot` to a new owner labelled `label` (with the op in
    /// scope): the history records the old owner's free (requested and completed) and the new
    /// one's allocation at the same place, and the policy's counters the same free and
    /// allocation (the range itself stays where it is; see `Pool::reuse`).
    pub(super) fn hand_over(&self, live_slot: usize, label: &Label) {
        let mut guard = self.lock();
        let State {
            core,
            live,
            history,
            op,
            ..
        } = &mut *guard;
        let time_us = history.as_ref().map(|_| self.now_us());
        let Some(entry) = live.get_mut(live_slot) else {
            return;
        };
        // One definition of an allocation for the counters and the history: a free and an
        // allocation in both.
        core.count_hand_over(&entry.placement);
        if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
            history.record(allocation_event(EventKind::FreeRequested, time_us, entry));
            history.record(allocation_event(EventKind::FreeCompleted, time_us, entry));
        }
        entry.label = label.clone();
        entry.op = op.clone();
        entry.parts.clear();
        if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
            history.record(allocation_event(EventKind::Alloc, time_us, entry));
        }
    }

    /// Submits `buffers`, then releases the ranges dropped before the call (clearing them first in
    /// the same submission with `zero_on_free`).
    pub(super) fn submit(&self, mut buffers: Vec<wgpu::CommandBuffer>) -> wgpu::SubmissionIndex {
        let pending = std::mem::take(&mut self.lock().pending);
        if self.options.zero_on_free && !pending.is_empty() {
            let mut encoder =
                self.gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("wgpu-pool zero on free"),
                    });
            for free in &pending {
                encoder.clear_buffer(&free.buffer, free.offset_bytes, Some(free.allocated_bytes));
            }
            buffers.push(encoder.finish());
        }
        let index = self.gpu.queue.submit(buffers);
        self.release(pending);
        index
    }

    /// Declares every command buffer recorded so far submitted: ranges dropped before the call
    /// become reusable.
    pub(super) fn mark_submitted(&self) {
        if self.options.zero_on_free {
            self.submit(Vec::new());
            return;
        }
        let pending = std::mem::take(&mut self.lock().pending);
        self.release(pending);
    }

    /// Gives the pending frees' ranges back to the policy.
    fn release(&self, pending: Vec<PendingFree>) {
        if pending.is_empty() {
            return;
        }
        let mut guard = self.lock();
        let State {
            core,
            live,
            history,
            ..
        } = &mut *guard;
        let time_us = history.as_ref().map(|_| self.now_us());
        release_slots(
            core,
            live,
            history,
            time_us,
            pending.iter().map(|free| free.live_slot),
        );
    }

    /// Drops the read-back staging buffer (waiting for a read in progress).
    pub(super) fn release_staging(&self) {
        let mut staging = self
            .staging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *staging = None;
        self.staging_bytes.store(0, Ordering::Relaxed);
    }

    /// The pool's memory as plain data, from the state under the lock.
    pub(super) fn memory_state_of(&self, state: &State) -> PoolState {
        fill_state(
            &state.core,
            &state.live,
            state.history.as_ref(),
            self.now_us(),
            StateLimits {
                max_buffer_size: self.max_buffer_size,
                max_storage_buffer_binding_size: self.max_binding_bytes,
                staging_bytes: self.staging_bytes.load(Ordering::Relaxed),
            },
        )
    }
}

/// Gives the allocations recorded in `slots` back to the policy, with their `FreeCompleted`
/// events and the segment events that follow (when history is on: `time_us` is its time).
fn release_slots(
    core: &mut PoolCore<BufferStorage>,
    live: &mut LiveSlab,
    history: &mut Option<History>,
    time_us: Option<u64>,
    slots: impl IntoIterator<Item = usize>,
) {
    for slot in slots {
        let entry = live.remove(slot);
        if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
            history.record(allocation_event(EventKind::FreeCompleted, time_us, &entry));
        }
        core.free(entry.placement);
    }
    let segment_events = core.take_events();
    if let (Some(history), Some(time_us)) = (history.as_mut(), time_us) {
        record_segment_events(history, segment_events, time_us);
    }
}

/// Writes `bytes` to `path` (native); in a browser, which has no file system, refuses (take the
/// snapshot through an out-of-memory observer there).
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::fs::write(path, bytes).map_err(|error| error.to_string())
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (path, bytes);
        Err("a browser has no file system: take the snapshot with Pool::set_oom_observer".into())
    }
}
