//! The policy engine's books: the segments held, their slots, the statistics and the events;
//! creating and giving back segments. Placement and growth (`place.rs`, `growth.rs`) and
//! compaction (`compaction.rs`) are further `impl` blocks of `PoolCore`.

use std::collections::BTreeSet;
use std::fmt;

use crate::buddy::Rounding;

use super::config::PolicyConfig;
use super::error::PolicyError;
use super::ranges::ClassIndexes;
use super::segment::{Placement, Segment, SegmentClass, SegmentEvent, SegmentId};
use super::stats::PoolStats;
use super::storage::SegmentStorage;

/// The policy engine: segments, their layouts by size class, and the statistics.
pub struct PoolCore<S: SegmentStorage> {
    pub(super) config: PolicyConfig,
    pub(super) storage: S,
    pub(super) segments: Vec<Option<Segment<S::Segment>>>,
    /// The slots of `segments` that hold no segment, so that a new segment takes the lowest one
    /// without a scan.
    vacant_slots: BTreeSet<usize>,
    next_segment_id: u64,
    pub(super) stats: PoolStats,
    events: Vec<SegmentEvent>,
    /// The most bytes ever allocated at once (not reset with the peaks): the demand that
    /// `cache_headroom_divisor` measures the cache against.
    pub(super) demand_high_water: u64,
    /// Counts the frees: segments are given back least recently used first.
    pub(super) clock: u64,
    /// The free ranges of the segments of each class of free ranges (mid-sized, large), by size.
    pub(super) ranges_free: ClassIndexes,
}

impl<S: SegmentStorage> fmt::Debug for PoolCore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCore")
            .field("config", &self.config)
            .field("segments", &self.segment_count())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<S: SegmentStorage> PoolCore<S> {
    /// A pool with no segments yet.
    pub fn new(config: PolicyConfig, storage: S) -> Result<Self, PolicyError> {
        config.validate()?;
        Ok(Self {
            config,
            storage,
            segments: Vec::new(),
            vacant_slots: BTreeSet::new(),
            next_segment_id: 0,
            stats: PoolStats::default(),
            events: Vec::new(),
            demand_high_water: 0,
            clock: 0,
            ranges_free: ClassIndexes::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Sets or clears the budget on reserved bytes. Segments already held stay.
    pub fn set_budget(&mut self, budget_bytes: Option<u64>) {
        self.config.budget_bytes = budget_bytes;
    }

    /// The storage.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by the policy's tests only")
    )]
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The storage, to change its settings (the GPU pool names the next naive buffer).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    /// The segments, by slot; a slot is `None` after its segment was given back.
    pub fn segments(&self) -> impl Iterator<Item = &Segment<S::Segment>> {
        self.segments.iter().flatten()
    }

    /// The segment in `slot`, if it is held.
    pub fn segment(&self, slot: usize) -> Option<&Segment<S::Segment>> {
        self.segments.get(slot).and_then(Option::as_ref)
    }

    /// The number of segments held.
    pub fn segment_count(&self) -> usize {
        self.segments.len() - self.vacant_slots.len()
    }

    /// Takes back the count of the last refusal, which was no out-of-memory error after all: its
    /// request was served by a last resort.
    pub(crate) fn forget_refusal(&mut self) {
        self.stats.oom_count = self.stats.oom_count.saturating_sub(1);
    }

    /// The segment events since the last call (creations and destructions, in order).
    pub fn take_events(&mut self) -> Vec<SegmentEvent> {
        std::mem::take(&mut self.events)
    }

    /// The statistics, with the free-space figures brought up to date. O(segments) in a pool,
    /// O(1) in the naive mode (which has no free space).
    pub fn stats(&self) -> PoolStats {
        let mut stats = self.stats;
        stats.free_bytes = 0;
        stats.largest_free_bytes = 0;
        stats.empty_segment_bytes = 0;
        stats.largest_held_free_bytes = 0;
        if self.config.is_naive() {
            return stats;
        }
        for segment in self.segments.iter().flatten() {
            if segment.is_dedicated() {
                // The naive mode's alone, never held empty: no free space.
                continue;
            }
            let (free, largest) = segment.free_and_largest_bytes();
            stats.free_bytes += free;
            stats.largest_free_bytes = stats.largest_free_bytes.max(largest);
            if segment.is_empty() {
                stats.empty_segment_bytes += segment.size_bytes;
            } else {
                stats.largest_held_free_bytes = stats.largest_held_free_bytes.max(largest);
            }
        }
        stats
    }

    /// The counters of the statistics, without the free-space figures (`free_bytes` and
    /// `largest_free_bytes` are 0): O(1).
    pub fn counters(&self) -> PoolStats {
        PoolStats {
            free_bytes: 0,
            largest_free_bytes: 0,
            ..self.stats
        }
    }

    /// Starts new peaks from the current values.
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// The bytes a request of `size_bytes` would hold once placed in a segment.
    /// `u64::MAX` when the rounding passes it (such a request is refused as too large).
    pub fn rounded_size(&self, size_bytes: u64) -> u64 {
        self.checked_rounded_size(size_bytes).unwrap_or(u64::MAX)
    }

    /// [`Self::rounded_size`], or `None` when the rounding passes `u64::MAX`.
    fn checked_rounded_size(&self, size_bytes: u64) -> Option<u64> {
        let units = size_bytes.div_ceil(self.config.min_block_bytes).max(1);
        let units = match self.config.rounding {
            Rounding::Exact => units,
            Rounding::PowerOfTwo => units.checked_next_power_of_two()?,
        };
        units.checked_mul(self.config.min_block_bytes)
    }

    /// Whether a request of `size_bytes` can be placed at all: not zero, within the largest
    /// allocation, and its rounded size within `u64`.
    pub(super) fn placeable(&self, size_bytes: u64) -> bool {
        size_bytes > 0
            && size_bytes <= self.config.max_allocation_bytes
            && self.checked_rounded_size(size_bytes).is_some()
    }

    /// Counts the hand-over of `placement` from one owner to the next (the compute context's
    /// reuse of a range within its batch), or its move by a compaction, as what it is in the
    /// history: a free and an allocation of the same bytes. The current values and peaks do not move; the totals and the
    /// freed totals grow, so that the counters and a replay of the history agree.
    pub fn count_hand_over(&mut self, placement: &Placement) {
        self.stats.requested_bytes.sub(placement.requested_bytes);
        self.stats.allocated_bytes.sub(placement.allocated_bytes);
        self.stats.allocations.sub(1);
        self.count_allocation(placement.requested_bytes, placement.allocated_bytes);
    }

    pub(super) fn count_allocation(&mut self, requested_bytes: u64, allocated_bytes: u64) {
        self.stats.requested_bytes.add(requested_bytes);
        self.stats.allocated_bytes.add(allocated_bytes);
        self.demand_high_water = self
            .demand_high_water
            .max(self.stats.allocated_bytes.current);
        self.stats.allocations.add(1);
    }

    /// `Err(None)`: over budget; `Err(Some(reason))`: the storage refused.
    pub(super) fn try_create(
        &mut self,
        size_bytes: u64,
        class: SegmentClass,
    ) -> Result<usize, Option<String>> {
        if let Some(budget) = self.config.budget_bytes {
            if self.stats.reserved_bytes.current + size_bytes > budget {
                return Err(None);
            }
        }
        let memory = self
            .storage
            .create_segment(size_bytes, class)
            .map_err(|e| Some(e.reason))?;
        let id = SegmentId(self.next_segment_id);
        self.next_segment_id += 1;
        let blocks = (self.config.min_block_bytes, self.config.rounding);
        let segment = Segment::new(id, memory, size_bytes, class, blocks, self.clock);
        self.stats.create_segment_calls += 1;
        self.stats.reserved_bytes.add(size_bytes);
        self.stats.segments.add(1);
        self.events.push(SegmentEvent::Created { id, size_bytes });
        let slot = match self.vacant_slots.pop_first() {
            Some(slot) => {
                self.segments[slot] = Some(segment);
                slot
            }
            None => {
                self.segments.push(Some(segment));
                self.segments.len() - 1
            }
        };
        if let Some(ranges) = class.ranges() {
            self.ranges_free[ranges].add_segment(slot, size_bytes);
        }
        Ok(slot)
    }

    /// Gives back every empty segment (PyTorch's `empty_cache`). Returns the bytes given back.
    pub fn trim(&mut self) -> u64 {
        if self.config.is_naive() {
            // No segment of the naive mode outlives its allocation.
            return 0;
        }
        self.release_empty(|_| true)
    }

    pub(super) fn release_empty(
        &mut self,
        mut which: impl FnMut(&Segment<S::Segment>) -> bool,
    ) -> u64 {
        let mut released = 0;
        for slot in 0..self.segments.len() {
            if self.segments[slot]
                .as_ref()
                .is_some_and(|s| s.is_empty() && which(s))
            {
                released += self.destroy_slot(slot);
            }
        }
        released
    }

    pub(super) fn destroy_slot(&mut self, slot: usize) -> u64 {
        let segment = self.segments[slot].take().expect("slot holds a segment");
        if let Some(ranges) = segment.ranges() {
            self.ranges_free[ranges.class()].remove_segment(slot, ranges);
        }
        self.vacant_slots.insert(slot);
        self.stats.reserved_bytes.sub(segment.size_bytes);
        self.stats.segments.sub(1);
        self.events.push(SegmentEvent::Destroyed {
            id: segment.id,
            size_bytes: segment.size_bytes,
        });
        self.storage.destroy_segment(segment.memory);
        segment.size_bytes
    }

    /// Gives back the segment `id` if it is held and empty (a packed one made empty by
    /// compaction, say). Returns the bytes given back (0 when it is not).
    pub fn release_if_empty(&mut self, id: SegmentId) -> u64 {
        if self.config.is_naive() {
            return 0;
        }
        self.release_empty(|segment| segment.id == id)
    }

    /// Bytes of the live allocations in the packed segment or segment of free ranges `id` (0 for
    /// none, or a dedicated one).
    pub fn live_bytes(&self, id: SegmentId) -> u64 {
        self.slot_of(id)
            .and_then(|slot| self.segments[slot].as_ref())
            .map_or(0, |s| s.live.values().map(|l| l.allocated_bytes).sum())
    }

    /// The slot of the segment `id`, if it is held.
    pub(super) fn slot_of(&self, id: SegmentId) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id))
    }
}
