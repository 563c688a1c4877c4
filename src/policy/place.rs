//! Placement by size class: which class a request belongs to, where in the segments held it goes
//! (the packed segments' buddy allocators, the free ranges of the mid-sized or large class, a
//! segment of its own in the naive mode), and giving an allocation back. Growing the pool when
//! nothing fits is `growth.rs`.

use super::engine::PoolCore;
use super::error::PolicyError;
use super::ranges::RangeClass;
use super::segment::{Layout, Live, Placement, SegmentClass};
use super::storage::SegmentStorage;

impl<S: SegmentStorage> PoolCore<S> {
    /// Places a request of `size_bytes`, growing the pool if needed.
    pub fn allocate(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        if size_bytes == 0 {
            return Err(PolicyError::ZeroSize);
        }
        if !self.placeable(size_bytes) {
            return Err(PolicyError::TooLarge {
                requested_bytes: size_bytes,
                max_allocation_bytes: self.config.max_allocation_bytes,
            });
        }
        let class = self.class_of(size_bytes);
        match class {
            SegmentClass::Dedicated => return self.allocate_dedicated(size_bytes),
            SegmentClass::Large => {
                return self
                    .allocate_large(size_bytes)
                    .or_else(|error| self.place_as_a_last_resort(size_bytes, error));
            }
            SegmentClass::Packed | SegmentClass::Mid => {}
        }
        // The request's own class first, then free space of the other class, before growing.
        if let Some(placement) = self.place_packed_or_mid_existing(size_bytes) {
            return Ok(placement);
        }
        if class == SegmentClass::Mid {
            return self.allocate_mid(size_bytes);
        }
        let rounded = self.rounded_size(size_bytes);
        let segment_bytes = self.packed_segment_bytes(rounded);
        // When the budget or the device refuses, the fallback is a segment of exactly the rounded
        // request.
        let slot = self.grow_for(size_bytes, rounded, segment_bytes, SegmentClass::Packed)?;
        Ok(self
            .place_in_slot(slot, size_bytes)
            .expect("a new segment sized for the request has room for it"))
    }

    /// Places a request of `size_bytes` in a segment sized for it, whatever its size class: the
    /// large class's way (the tightest free range of the large segments that its rules allow,
    /// else a new large segment of exactly the request rounded up to `min_block_bytes`); in the
    /// naive mode, the segment of its own every request gets. So the pool reserves for it its
    /// rounded size and no more, not a power-of-two segment shared with other requests: for
    /// long-lived allocations whose reservation must be known in advance (a KV cache's tensors,
    /// a plan's arena). Refusals as [`PoolCore::allocate`]'s.
    pub fn allocate_own_segment(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        if size_bytes == 0 {
            return Err(PolicyError::ZeroSize);
        }
        if !self.placeable(size_bytes) {
            return Err(PolicyError::TooLarge {
                requested_bytes: size_bytes,
                max_allocation_bytes: self.config.max_allocation_bytes,
            });
        }
        if self.config.is_naive() {
            return self.allocate_dedicated(size_bytes);
        }
        self.allocate_large(size_bytes)
            .or_else(|error| self.place_as_a_last_resort(size_bytes, error))
    }

    /// The bytes [`PoolCore::allocate_own_segment`] reserves for a request of `size_bytes` when
    /// it makes a segment for it: the request rounded up to `min_block_bytes` (never past the
    /// largest allocation).
    pub fn own_segment_bytes(&self, size_bytes: u64) -> u64 {
        self.large_rounded(size_bytes)
    }

    /// The size class of a request of `size_bytes`: every request a segment of its own in the
    /// naive mode; else large above `large_above_bytes` (or `max_segment_bytes`, whichever is
    /// less), mid-sized above `mid_above_bytes` (when not 0), packed below.
    pub fn class_of(&self, size_bytes: u64) -> SegmentClass {
        let config = &self.config;
        if config.is_naive() {
            SegmentClass::Dedicated
        } else if size_bytes > config.large_above_bytes.min(config.max_segment_bytes) {
            SegmentClass::Large
        } else if config.mid_above_bytes > 0 && size_bytes > config.mid_above_bytes {
            SegmentClass::Mid
        } else {
            SegmentClass::Packed
        }
    }

    /// Places a request only where the pool has room now (free space of a segment of its class,
    /// or of the other of the packed and the mid-sized classes): never creates or gives back a
    /// segment. `None` when it would have to grow, or for a request of 0 bytes or too large
    /// (which `PoolCore::allocate` explains).
    pub fn allocate_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        if !self.placeable(size_bytes) {
            return None;
        }
        match self.class_of(size_bytes) {
            SegmentClass::Dedicated => None,
            SegmentClass::Large => {
                let rounded = self.large_rounded(size_bytes);
                self.place_large_existing(size_bytes, rounded)
            }
            SegmentClass::Packed | SegmentClass::Mid => {
                self.place_packed_or_mid_existing(size_bytes)
            }
        }
    }

    /// Places a packed or mid-sized request where the pool has room now, in the order
    /// `PoolCore::allocate` tries: the request's own class first, then the other's free space.
    fn place_packed_or_mid_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        let mid = self.config.mid_above_bytes > 0;
        let rounded = self.rounded_size(size_bytes);
        if self.class_of(size_bytes) == SegmentClass::Mid {
            self.place_mid_existing(size_bytes, rounded)
                .or_else(|| self.place_in_existing(size_bytes))
        } else {
            self.place_in_existing(size_bytes)
                .or_else(|| mid.then(|| self.place_mid_existing(size_bytes, rounded))?)
        }
    }

    fn place_in_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        let mut best: Option<(u32, usize)> = None;
        for (slot, segment) in self.segments.iter().enumerate() {
            let Some(allocator) = segment.as_ref().and_then(|s| s.allocator()) else {
                continue;
            };
            if let Some(order) = allocator.fit_order(size_bytes) {
                if best.is_none_or(|(best_order, _)| order < best_order) {
                    best = Some((order, slot));
                }
            }
        }
        if let Some((_, slot)) = best {
            return self.place_in_slot(slot, size_bytes);
        }
        // No run certain to fit anywhere: a run of the request's own length bin may still fit
        // (exact fit only).
        (0..self.segments.len()).find_map(|slot| self.place_in_slot(slot, size_bytes))
    }

    fn place_in_slot(&mut self, slot: usize, size_bytes: u64) -> Option<Placement> {
        let segment = self.segments[slot].as_mut()?;
        let allocator = segment.allocator_mut()?;
        let allocation = allocator.allocate(size_bytes).ok()?;
        let allocated_bytes = allocation.allocated_size(allocator.min_block());
        segment.live.insert(
            allocation.offset(),
            Live {
                allocated_bytes,
                requested_bytes: size_bytes,
            },
        );
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: allocation.offset(),
            requested_bytes: size_bytes,
            allocated_bytes,
            class: SegmentClass::Packed,
            inner: Some(allocation),
        };
        self.count_allocation(size_bytes, allocated_bytes);
        Some(placement)
    }

    /// Places a mid-sized request in the tightest free range of the mid-sized class, if any.
    fn place_mid_existing(&mut self, size_bytes: u64, rounded_bytes: u64) -> Option<Placement> {
        let (slot, offset) =
            self.ranges_free[RangeClass::Mid].best_fit(rounded_bytes, |_, _| true)?;
        Some(self.place_large(slot, offset, size_bytes, rounded_bytes))
    }

    fn allocate_large(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let rounded = self.large_rounded(size_bytes);
        if let Some(placement) = self.place_large_existing(size_bytes, rounded) {
            return Ok(placement);
        }
        self.grow_ranges(size_bytes, rounded, rounded, SegmentClass::Large)
    }

    /// The bytes a large request holds: rounded up to `min_block_bytes` (never past the largest
    /// allocation when that is not a multiple of it).
    pub(super) fn large_rounded(&self, size_bytes: u64) -> u64 {
        let rounded =
            size_bytes.div_ceil(self.config.min_block_bytes) * self.config.min_block_bytes;
        rounded.min(self.config.max_allocation_bytes.max(size_bytes))
    }

    /// Places a large request in the tightest free range of the large segments that leaves its
    /// segment at least `large_fill_eighths / 8` full, if there is one.
    fn place_large_existing(&mut self, size_bytes: u64, rounded_bytes: u64) -> Option<Placement> {
        let (slot, offset) =
            self.ranges_free[RangeClass::Large].best_fit(rounded_bytes, |length, slot| {
                let segment = self.segments[slot]
                    .as_ref()
                    .expect("a listed range's segment is held");
                let used = segment
                    .ranges()
                    .map_or(0, |ranges| ranges.allocated_bytes());
                self.large_range_ok(length, used, rounded_bytes, segment.size_bytes)
            })?;
        Some(self.place_large(slot, offset, size_bytes, rounded_bytes))
    }

    /// Whether a free range of `length` bytes in a large segment of `segment_bytes` holding
    /// `used` bytes may serve a large request holding `rounded_bytes`: the segment is then at
    /// least `large_fill_eighths / 8` full, and the range's rest is either usable by another large
    /// request or at most `1 / large_remainder_divisor` of the request.
    pub(super) fn large_range_ok(
        &self,
        length: u64,
        used: u64,
        rounded_bytes: u64,
        segment_bytes: u64,
    ) -> bool {
        let rest = length - rounded_bytes;
        let divisor = self.config.large_remainder_divisor;
        let rest_ok =
            divisor == 0 || rest > self.config.large_above_bytes || rest <= rounded_bytes / divisor;
        rest_ok
            && (used + rounded_bytes).saturating_mul(8)
                >= segment_bytes.saturating_mul(self.config.large_fill_eighths)
    }

    /// A large request: the tightest free range of the large segments, or a new large segment.
    /// When the budget or the device refused the memory for a large request: any free range of
    /// the large segments that fits it, whatever the rules of [`PolicyConfig::large_fill_eighths`](super::PolicyConfig::large_fill_eighths)
    /// and [`PolicyConfig::large_remainder_divisor`](super::PolicyConfig::large_remainder_divisor) (which spare segments for later requests, not
    /// worth a failure). The refusal is then not counted.
    fn place_as_a_last_resort(
        &mut self,
        size_bytes: u64,
        error: PolicyError,
    ) -> Result<Placement, PolicyError> {
        if !matches!(error, PolicyError::OutOfMemory(_)) {
            return Err(error);
        }
        let rounded = self.large_rounded(size_bytes);
        let Some((slot, offset)) =
            self.ranges_free[RangeClass::Large].best_fit(rounded, |_, _| true)
        else {
            return Err(error);
        };
        self.forget_refusal();
        Ok(self.place_large(slot, offset, size_bytes, rounded))
    }

    /// Places a mid-sized or large request at `offset` of the free range it takes in `slot`.
    pub(super) fn place_large(
        &mut self,
        slot: usize,
        offset: u64,
        size_bytes: u64,
        rounded_bytes: u64,
    ) -> Placement {
        let segment = self.segments[slot].as_mut().expect("slot holds a segment");
        let Layout::Ranges(ranges) = &mut segment.layout else {
            panic!("wgpu_pool::policy: a free range listed in a segment not of free ranges");
        };
        let class = ranges.class();
        self.ranges_free[class].take(slot, ranges, offset, rounded_bytes);
        segment.live.insert(
            offset,
            Live {
                allocated_bytes: rounded_bytes,
                requested_bytes: size_bytes,
            },
        );
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: offset,
            requested_bytes: size_bytes,
            allocated_bytes: rounded_bytes,
            class: match class {
                RangeClass::Mid => SegmentClass::Mid,
                RangeClass::Large => SegmentClass::Large,
            },
            inner: None,
        };
        self.count_allocation(size_bytes, rounded_bytes);
        placement
    }

    /// A request of the naive mode: a segment of its own, of the request rounded up to
    /// `min_block_bytes` (never past the largest allocation).
    fn allocate_dedicated(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let segment_bytes =
            size_bytes.div_ceil(self.config.min_block_bytes) * self.config.min_block_bytes;
        let segment_bytes = segment_bytes.min(self.config.max_allocation_bytes.max(size_bytes));
        self.refuse_over_budget(size_bytes, segment_bytes)?;
        let reserved_before = self.stats.reserved_bytes.current;
        let slot = self.grow(
            size_bytes,
            segment_bytes,
            segment_bytes,
            SegmentClass::Dedicated,
            reserved_before,
        )?;
        Ok(self.place_dedicated(slot, size_bytes))
    }

    fn place_dedicated(&mut self, slot: usize, size_bytes: u64) -> Placement {
        let segment = self.segments[slot].as_mut().expect("slot holds a segment");
        let segment_bytes = segment.size_bytes;
        segment.layout = Layout::Dedicated { in_use: true };
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: 0,
            requested_bytes: size_bytes,
            allocated_bytes: segment_bytes,
            class: SegmentClass::Dedicated,
            inner: None,
        };
        self.count_allocation(size_bytes, segment_bytes);
        placement
    }

    /// Gives an allocation back. Its segment stays (cached, for reuse) until `PoolCore::trim` or
    /// growth releases it; a dedicated segment (the naive mode's) is given back at once.
    ///
    /// # Panics
    ///
    /// When `placement` was made by another pool (a bug in the caller).
    pub fn free(&mut self, placement: Placement) {
        let segment = self
            .segments
            .get_mut(placement.slot)
            .and_then(Option::as_mut);
        let segment = match segment {
            Some(segment) if segment.id == placement.segment => segment,
            _ => panic!("wgpu_pool::policy: a placement in segment {:?} was freed into a pool that does not hold it", placement.segment),
        };
        match (&mut segment.layout, placement.inner) {
            (Layout::Packed(allocator), Some(allocation)) => {
                segment.live.remove(&allocation.offset());
                allocator.free(allocation);
            }
            (Layout::Ranges(ranges), None) => {
                segment.live.remove(&placement.offset_bytes);
                self.ranges_free[ranges.class()].give(
                    placement.slot,
                    ranges,
                    placement.offset_bytes,
                    placement.allocated_bytes,
                );
            }
            (Layout::Dedicated { in_use }, None) => *in_use = false,
            _ => panic!(
                "wgpu_pool::policy: placement and segment {:?} disagree on the size class",
                placement.segment
            ),
        }
        self.clock += 1;
        segment.last_used = self.clock;
        self.stats.requested_bytes.sub(placement.requested_bytes);
        self.stats.allocated_bytes.sub(placement.allocated_bytes);
        self.stats.allocations.sub(1);
        if segment.is_dedicated() {
            // The naive mode's: nothing is reused.
            self.destroy_slot(placement.slot);
        }
    }
}
