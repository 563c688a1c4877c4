//! Growth: the size of a new segment of each class, the cache bounded by demand (which empty
//! segments are given back before growing), the budget, and the out-of-memory refusal with its
//! figures.

use super::engine::PoolCore;
use super::error::{OutOfMemory, PolicyError};
use super::segment::{Placement, Segment, SegmentClass};
use super::storage::SegmentStorage;
use super::windows::CompactionLimits;

/// A new segment of the mid-sized class holds at least this many requests of the size that made
/// it (rounded up to a power of two, at most `max_segment_bytes` and at most half the demand,
/// rounded down to a power of two): with room for one request only, a pool at its cache ceiling
/// gave back and created a segment for every few requests of sizes cycling from 1 to 8 MiB (56
/// segments where the buddy allocators created 9).
const MID_SEGMENT_REQUESTS: u64 = 2;

impl<S: SegmentStorage> PoolCore<S> {
    /// A mid-sized request that fits nowhere now: a new segment of the mid-sized class, sized as a
    /// packed one would be, and with room for at least [`MID_SEGMENT_REQUESTS`] such requests.
    pub(super) fn allocate_mid(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let rounded = self.rounded_size(size_bytes);
        let packed = self.packed_segment_bytes(rounded);
        // At most half the demand, rounded down to a power of two: a small pool does not grow
        // by segments twice its requests.
        let half_demand = (self.demand_with(rounded) / 2).max(1);
        let half_demand = 1u64 << (63 - half_demand.leading_zeros());
        let roomy = packed.max(
            rounded
                .saturating_mul(MID_SEGMENT_REQUESTS)
                .checked_next_power_of_two()
                .unwrap_or(u64::MAX)
                .min(self.config.max_segment_bytes)
                .min(half_demand),
        );
        // When the roomier segment would pass the budget, the size a packed request would get
        // (then, if that passes it too, the request's own).
        let with_roomy = self.stats.reserved_bytes.current.saturating_add(roomy);
        let over_budget = self
            .config
            .budget_bytes
            .is_some_and(|budget| with_roomy > budget);
        let segment_bytes = if over_budget { packed } else { roomy };
        self.grow_ranges(size_bytes, rounded, segment_bytes, SegmentClass::Mid)
    }

    /// Grows the pool by a segment of free ranges of `class` (mid-sized or large) of `segment_bytes` and
    /// places the request at its start.
    pub(super) fn grow_ranges(
        &mut self,
        size_bytes: u64,
        rounded: u64,
        segment_bytes: u64,
        class: SegmentClass,
    ) -> Result<Placement, PolicyError> {
        let slot = self.grow_for(size_bytes, rounded, segment_bytes, class)?;
        Ok(self.place_large(slot, 0, size_bytes, rounded))
    }

    /// A new segment of `class` and `segment_bytes` for a request (`rounded` the fallback size):
    /// refused over the budget, after giving back what the cache must. Returns its slot.
    pub(super) fn grow_for(
        &mut self,
        size_bytes: u64,
        rounded: u64,
        segment_bytes: u64,
        class: SegmentClass,
    ) -> Result<usize, PolicyError> {
        self.refuse_over_budget(size_bytes, rounded)?;
        let reserved_before = self.stats.reserved_bytes.current;
        self.release_for_growth(rounded, segment_bytes);
        self.grow(size_bytes, segment_bytes, rounded, class, reserved_before)
    }

    /// The size of a new packed segment for a request holding `rounded` bytes:
    /// `next_power_of_two(rounded)`, at least `min_segment_bytes` and `reserved / growth_divisor`
    /// (rounded down to a power of two), at most `max_segment_bytes`, and at least `rounded`.
    pub(super) fn packed_segment_bytes(&self, rounded: u64) -> u64 {
        let mut segment_bytes = rounded
            .next_power_of_two()
            .max(self.config.min_segment_bytes);
        if let Some(proportional) = self
            .stats
            .reserved_bytes
            .current
            .checked_div(self.config.growth_divisor)
        {
            // Round down, so that growth stays under reserved / divisor.
            let proportional = proportional.max(1);
            segment_bytes = segment_bytes.max(1u64 << (63 - proportional.leading_zeros()));
        }
        segment_bytes
            .min(self.config.max_segment_bytes)
            .max(rounded)
    }

    /// Refuses at once, giving nothing back, when even a segment of `fallback_bytes` after giving
    /// back every empty segment would pass the budget: the refusal then changes nothing.
    pub(super) fn refuse_over_budget(
        &mut self,
        requested_bytes: u64,
        fallback_bytes: u64,
    ) -> Result<(), PolicyError> {
        let Some(budget) = self.config.budget_bytes else {
            return Ok(());
        };
        // A naive pool holds no empty segment (each is given back when freed): no scan.
        let empty_bytes: u64 = if self.config.is_naive() {
            0
        } else {
            self.segments
                .iter()
                .flatten()
                .filter(|s| s.is_empty())
                .map(|s| s.size_bytes)
                .sum()
        };
        let least_reserved = self.stats.reserved_bytes.current - empty_bytes;
        if least_reserved.saturating_add(fallback_bytes) > budget {
            return Err(self.out_of_memory(requested_bytes, fallback_bytes, None, 0));
        }
        Ok(())
    }

    /// The empty segments as `(key, slot)`.
    fn empty_segments(&self, key: impl Fn(&Segment<S::Segment>) -> u64) -> Vec<(u64, usize)> {
        self.segments
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().filter(|s| s.is_empty()).map(|s| (key(s), slot)))
            .collect()
    }

    /// Before growing by a segment of `segment_bytes` for a request that holds `rounded_bytes`:
    /// gives back empty segments (none of which could serve the request), least recently used
    /// first, until the pool with the new segment keeps within the cache's headroom over its
    /// demand (`PoolCore::cache_ceiling`).
    fn release_for_growth(&mut self, rounded_bytes: u64, segment_bytes: u64) {
        if self.config.is_naive() {
            // Nothing to give back: a naive segment is given back as soon as it is freed.
            return;
        }
        let cap = self.cache_ceiling(rounded_bytes);
        let mut empty = self.empty_segments(|s| s.last_used);
        empty.sort_unstable();
        for (_, slot) in empty {
            if self.stats.reserved_bytes.current + segment_bytes <= cap {
                break;
            }
            self.destroy_slot(slot);
        }
    }

    /// The demand once a request holding `rounded_bytes` is placed: the most bytes ever allocated
    /// at once, this request included.
    fn demand_with(&self, rounded_bytes: u64) -> u64 {
        self.demand_high_water.max(
            self.stats
                .allocated_bytes
                .current
                .saturating_add(rounded_bytes),
        )
    }

    /// The most bytes the pool may hold, cache included, once a request holding `rounded_bytes`
    /// is placed: its demand (the most bytes ever allocated at once, this request included) plus
    /// `1 / cache_headroom_divisor` of it.
    pub(super) fn cache_ceiling(&self, rounded_bytes: u64) -> u64 {
        let demand = self.demand_with(rounded_bytes);
        demand + demand / self.config.cache_headroom_divisor.max(1)
    }

    /// Creates a segment of `segment_bytes` (or, when the budget or the device refuses, of
    /// `fallback_bytes` after giving back every empty segment) and returns its slot. On failure the
    /// error reports the bytes given back since `reserved_before`.
    pub(super) fn grow(
        &mut self,
        requested_bytes: u64,
        segment_bytes: u64,
        fallback_bytes: u64,
        class: SegmentClass,
        reserved_before: u64,
    ) -> Result<usize, PolicyError> {
        match self.try_create(segment_bytes, class) {
            Ok(slot) => Ok(slot),
            Err(first_error) => {
                if !self.config.is_naive() {
                    self.release_empty(|_| true);
                }
                self.try_create(fallback_bytes, class)
                    .map_err(|device_error| {
                        let error = device_error.or(first_error);
                        // No segment was created on this path: reserved only went down.
                        let released = reserved_before - self.stats.reserved_bytes.current;
                        self.out_of_memory(requested_bytes, fallback_bytes, error, released)
                    })
            }
        }
    }

    fn out_of_memory(
        &mut self,
        requested_bytes: u64,
        segment_bytes: u64,
        device_error: Option<String>,
        released_bytes: u64,
    ) -> PolicyError {
        self.stats.oom_count += 1;
        let stats = self.stats();
        PolicyError::OutOfMemory(Box::new(OutOfMemory {
            requested_bytes,
            segment_bytes,
            reserved_bytes: stats.reserved_bytes.current,
            allocated_bytes: stats.allocated_bytes.current,
            largest_free_bytes: stats.largest_free_bytes,
            external_fragmentation: stats.external_fragmentation(),
            budget_bytes: self.config.budget_bytes,
            device_error,
            released_bytes,
            free_bytes: stats.free_bytes,
            compaction: self.compaction_estimate(requested_bytes, CompactionLimits::default()),
        }))
    }
}
