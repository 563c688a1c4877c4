//! The context's compaction entry points: moving its tensors out of sparsely used segments
//! ([`Context::compact`], [`Context::compact_for`], [`Context::compaction_estimate`]) and the
//! retry of an allocation that failed with out of memory.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockWriteGuard, TryLockError, Weak};

use super::context::Context;
use super::shared::Storage;
use super::types::ComputeError;
use crate::policy::{CompactionEstimate, CompactionLimits, OutOfMemory};
use crate::pool::{AllocOptions, Allocation, Compaction, Pool, PoolError};

impl Context {
    /// Moves the context's tensors out of sparsely used segments of the pool into free space of
    /// the others, and gives each segment so emptied back to the device
    /// ([`Pool::compact_segments`]), least occupied first, until no further segment can be
    /// emptied. Returns what moved and what was given back.
    ///
    /// Safe against work in flight: the open batch is submitted first, the copies are submitted
    /// after it (and after everything submitted before), and the old ranges are reused only
    /// after that submission. The context's cached bind groups are forgotten and plans that bind
    /// moved tensors make their bind groups again at their next replay. Only tensors with memory
    /// of this context move: allocations of other users of the pool, plan arenas, tensors whose
    /// allocation is borrowed at the time ([`Tensor::allocation`](super::Tensor::allocation))
    /// and tensors being read asynchronously stay where they are, and a segment holding one is
    /// never emptied. Bind groups or ranges of your own over a tensor's allocation do not follow
    /// it: make them again after a compaction.
    pub fn compact(&self) -> Result<Compaction, ComputeError> {
        let limits = CompactionLimits {
            max_moved_factor: 1,
            max_moves: usize::MAX,
        };
        self.compact_with(|pool, allocations| pool.compact_segments(allocations, limits))
    }

    /// Moves the context's tensors so that a request of `size_bytes` fits in the segments the
    /// pool holds, without a new segment ([`Pool::compact_for`] within
    /// [`CompactionLimits::default`]: at most the request's size is copied). Nothing moves when it
    /// already fits, or when no plan over the context's tensors makes room (an out-of-memory
    /// error's [`OutOfMemory::compaction`](crate::policy::OutOfMemory::compaction) says whether
    /// one would). Room is made in one segment by moving tensors out of it into free space of
    /// other segments, never within it: the holes of a pool of one segment are not closed up
    /// (its tensors have nowhere else to go). The same guarantees as [`Context::compact`].
    pub fn compact_for(&self, size_bytes: u64) -> Result<Compaction, ComputeError> {
        self.compact_with(|pool, allocations| {
            pool.compact_for(size_bytes, allocations, CompactionLimits::default())
        })
    }

    /// What [`Context::compact_for`] would move to make room for `size_bytes`, without moving
    /// anything (over the tensors that would move now); `None` when it would not make room.
    pub fn compaction_estimate(&self, size_bytes: u64) -> Option<CompactionEstimate> {
        let storages = self.live_storages();
        // The tensors a compaction would move now: those it could lock for writing.
        let guards = movable(&storages);
        let allocations: Vec<&Allocation> = guards.iter().filter_map(|g| g.as_ref()).collect();
        self.shared
            .pool
            .compaction_estimate(size_bytes, &allocations)
    }

    /// How many compactions moved tensors: plans compare it with the count their bind groups
    /// were made at.
    pub(crate) fn moved_generation(&self) -> u64 {
        self.shared.moved.load(Ordering::Acquire)
    }

    /// The storages of the context's live tensors with memory.
    fn live_storages(&self) -> Vec<Arc<Storage>> {
        self.shared
            .registry()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Runs a compaction of the pool over the context's movable tensors, under the context's lock
    /// (no op records meanwhile) and after submitting the open batch; forgets the bind groups
    /// when something moved.
    fn compact_with(
        &self,
        compact: impl FnOnce(&Pool, &mut [&mut Allocation]) -> Result<Compaction, PoolError>,
    ) -> Result<Compaction, ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)?;
        let storages = self.live_storages();
        let mut guards = movable(&storages);
        let mut allocations: Vec<&mut Allocation> =
            guards.iter_mut().filter_map(|g| g.as_mut()).collect();
        let outcome = compact(&self.shared.pool, &mut allocations);
        drop(allocations);
        if outcome.as_ref().is_ok_and(|o| o.moves > 0) {
            // Cached groups name the old ranges (and keep given-back segments alive).
            state.bind_groups.clear();
            self.shared.moved.fetch_add(1, Ordering::AcqRel);
        }
        drop(guards);
        drop(state);
        drop(storages);
        Ok(outcome?)
    }

    /// An op's allocation of `bytes` failed with `oom`: with [`ContextOptions::compact_on_oom`],
    /// compacts and tries once more when that would make room; else (or when it still fails) the
    /// error, saying whether compacting the context's tensors would make room.
    pub(crate) fn after_out_of_memory(
        &self,
        bytes: u64,
        label: &str,
        mut oom: Box<OutOfMemory>,
    ) -> Result<Allocation, ComputeError> {
        let mut estimate = self.compaction_estimate(bytes);
        if self.shared.options.compact_on_oom && estimate.is_some() {
            self.compact_for(bytes)?;
            match self
                .shared
                .pool
                .allocate_with(bytes, AllocOptions::labeled(label))
            {
                Err(PoolError::OutOfMemory(again)) => {
                    oom = again;
                    estimate = self.compaction_estimate(bytes);
                }
                result => return Ok(result?),
            }
        }
        // The pool's estimate counts every allocation as movable; the context moves only its
        // own tensors.
        oom.compaction = estimate;
        Err(PoolError::OutOfMemory(oom).into())
    }
}

/// The allocations of `storages` that a compaction may move, locked for writing. Never waits: a
/// tensor borrowed ([`Storage::allocation`]) or pinned ([`Storage::pin`]) elsewhere is left out.
fn movable(storages: &[Arc<Storage>]) -> Vec<RwLockWriteGuard<'_, Option<Allocation>>> {
    storages
        .iter()
        .filter_map(|storage| {
            let guard = match storage.allocation.try_write() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            };
            (storage.pins.load(Ordering::Acquire) == 0).then_some(guard)
        })
        .collect()
}
