//! A segment and its layout by size class (a buddy allocator, free ranges of a class, or one
//! request's own), where an allocation lives in it, and the events of segments.

use std::collections::BTreeMap;

use crate::buddy::{self, BuddyAllocator, Rounding};

use super::ranges::{RangeClass, Ranges};

/// A live allocation in a segment's index, keyed there by its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    /// Its size after rounding, in bytes: the range it holds.
    pub(crate) allocated_bytes: u64,
    /// The size asked for, in bytes.
    pub(crate) requested_bytes: u64,
}

/// A process-unique id of a segment, stable for its lifetime.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SegmentId(pub u64);

/// Which of the policy's size classes a segment serves: how its space is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentClass {
    /// Small requests (up to `mid_above_bytes`, 1 MiB by default), packed by a buddy allocator.
    Packed,
    /// Mid-sized requests (1–16 MiB by default) in exact-fit free ranges that coalesce.
    Mid,
    /// Large requests (above `large_above_bytes`, 16 MiB by default) in exact-fit free ranges
    /// that coalesce.
    Large,
    /// One request's own segment: the naive baseline's every buffer.
    Dedicated,
}

impl SegmentClass {
    /// Its name in reports: `"packed"`, `"mid"`, `"large"` or `"dedicated"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Packed => "packed",
            Self::Mid => "mid",
            Self::Large => "large",
            Self::Dedicated => "dedicated",
        }
    }

    /// The class of free ranges of a mid-sized or large segment.
    pub(crate) fn ranges(self) -> Option<RangeClass> {
        match self {
            Self::Mid => Some(RangeClass::Mid),
            Self::Large => Some(RangeClass::Large),
            Self::Packed | Self::Dedicated => None,
        }
    }
}

/// How a segment's space is handed out: one variant per size class.
// Inline, as the allocator was before the enum: a box would add an indirection to every packed
// allocation, for the few segments of the other classes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Layout {
    /// Packed by a buddy allocator.
    Packed(BuddyAllocator),
    /// Exact-fit free ranges of the mid-sized or the large class.
    Ranges(Ranges),
    /// One request's own: whether its allocation is live.
    Dedicated {
        /// Whether its one allocation is live.
        in_use: bool,
    },
}

/// One segment: its memory, and how its offsets are handed out (its layout, by size class).
#[derive(Debug)]
pub struct Segment<M> {
    /// The segment's id.
    pub id: SegmentId,
    /// The storage's handle to its memory.
    pub memory: M,
    /// Its size, in bytes.
    pub size_bytes: u64,
    /// How its space is handed out.
    pub(super) layout: Layout,
    /// The pool's clock when the segment was created or last had an allocation freed.
    pub(super) last_used: u64,
    /// The live allocations of a packed segment or one of free ranges (and destinations a
    /// compaction plan holds), by offset: what compaction moves.
    pub(super) live: BTreeMap<u64, Live>,
}

impl<M> Segment<M> {
    /// A new segment of `class`, all free. `min_block_bytes` and `rounding` set up a packed one's
    /// buddy allocator (its size a validated power of two).
    pub(super) fn new(
        id: SegmentId,
        memory: M,
        size_bytes: u64,
        class: SegmentClass,
        (min_block_bytes, rounding): (u64, Rounding),
        clock: u64,
    ) -> Self {
        let layout = match class {
            SegmentClass::Packed => Layout::Packed(
                BuddyAllocator::with_capacity(min_block_bytes, size_bytes, rounding)
                    .expect("segment sizes are validated powers of two"),
            ),
            SegmentClass::Mid => Layout::Ranges(Ranges::new(size_bytes, RangeClass::Mid)),
            SegmentClass::Large => Layout::Ranges(Ranges::new(size_bytes, RangeClass::Large)),
            SegmentClass::Dedicated => Layout::Dedicated { in_use: false },
        };
        Self {
            id,
            memory,
            size_bytes,
            layout,
            last_used: clock,
            live: BTreeMap::new(),
        }
    }

    /// The ranges held in a packed segment or one of free ranges as `(offset, allocated bytes)`,
    /// in address order: its live allocations, and the destinations of a compaction plan not yet
    /// applied or cancelled. Empty for a dedicated segment.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by the policy's tests only")
    )]
    pub fn live_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live
            .iter()
            .map(|(&offset, live)| (offset, live.allocated_bytes))
    }

    /// True for a segment of one request's own ([`SegmentClass::Dedicated`], the naive mode's).
    /// Compaction never moves its allocation.
    pub fn is_dedicated(&self) -> bool {
        matches!(self.layout, Layout::Dedicated { .. })
    }

    /// Which of the policy's size classes the segment serves.
    pub fn class(&self) -> SegmentClass {
        match &self.layout {
            Layout::Packed(_) => SegmentClass::Packed,
            Layout::Ranges(ranges) => match ranges.class() {
                RangeClass::Mid => SegmentClass::Mid,
                RangeClass::Large => SegmentClass::Large,
            },
            Layout::Dedicated { .. } => SegmentClass::Dedicated,
        }
    }

    /// The buddy allocator of a packed segment (`None` for the other classes).
    pub fn allocator(&self) -> Option<&BuddyAllocator> {
        match &self.layout {
            Layout::Packed(allocator) => Some(allocator),
            _ => None,
        }
    }

    /// The buddy allocator of a packed segment, to change.
    pub(super) fn allocator_mut(&mut self) -> Option<&mut BuddyAllocator> {
        match &mut self.layout {
            Layout::Packed(allocator) => Some(allocator),
            _ => None,
        }
    }

    /// The free ranges of a mid-sized or large segment.
    pub(super) fn ranges(&self) -> Option<&Ranges> {
        match &self.layout {
            Layout::Ranges(ranges) => Some(ranges),
            _ => None,
        }
    }

    /// Its free space as `(offset_bytes, size_bytes)` in address order: the free buddy blocks of
    /// a packed segment, the free ranges of a segment of the mid-sized or large class, the whole
    /// segment when a dedicated one is unused. With the live ranges these tile the segment.
    pub fn free_spans(&self) -> Vec<(u64, u64)> {
        match &self.layout {
            Layout::Packed(allocator) => allocator.free_blocks(),
            Layout::Ranges(ranges) => ranges.free_ranges().collect(),
            Layout::Dedicated { in_use: false } => vec![(0, self.size_bytes)],
            Layout::Dedicated { in_use: true } => Vec::new(),
        }
    }

    /// True when no allocation lives in this segment.
    pub fn is_empty(&self) -> bool {
        match &self.layout {
            Layout::Packed(allocator) => allocator.is_empty(),
            Layout::Ranges(ranges) => ranges.is_empty(),
            Layout::Dedicated { in_use } => !in_use,
        }
    }

    /// Its free bytes and its largest free block or range, in bytes.
    pub(super) fn free_and_largest_bytes(&self) -> (u64, u64) {
        match &self.layout {
            Layout::Packed(allocator) => (allocator.free_bytes(), allocator.largest_free_bytes()),
            Layout::Ranges(ranges) => (ranges.free_bytes(), ranges.largest_free_bytes()),
            Layout::Dedicated { in_use: true } => (0, 0),
            Layout::Dedicated { in_use: false } => (self.size_bytes, self.size_bytes),
        }
    }

    /// Counters of the offsets allocator (a segment of free ranges or a dedicated one reports
    /// itself in the same terms, with no free block per order).
    pub fn stats(&self, min_block_bytes: u64) -> buddy::Stats {
        let (allocated_bytes, allocation_count) = match &self.layout {
            Layout::Packed(allocator) => return allocator.stats(),
            Layout::Ranges(ranges) => (ranges.allocated_bytes(), ranges.allocations()),
            Layout::Dedicated { in_use } => (
                if *in_use { self.size_bytes } else { 0 },
                u64::from(*in_use),
            ),
        };
        let (free_bytes, largest_free_bytes) = self.free_and_largest_bytes();
        buddy::Stats {
            capacity_bytes: self.size_bytes,
            allocated_bytes,
            requested_bytes: 0,
            free_bytes,
            largest_free_bytes,
            min_block_bytes,
            free_blocks_per_order: [0; buddy::MAX_ORDER_LIMIT as usize + 1],
            allocation_count,
        }
    }
}

/// Where an allocation lives. Not `Clone`: give it back with `PoolCore::free`.
#[derive(Debug)]
#[must_use = "a placement that is dropped instead of freed stays allocated"]
pub struct Placement {
    pub(super) segment: SegmentId,
    pub(super) slot: usize,
    pub(super) offset_bytes: u64,
    pub(super) requested_bytes: u64,
    pub(super) allocated_bytes: u64,
    /// The class of its segment (a compaction moves it within its class).
    pub(super) class: SegmentClass,
    /// Its buddy allocation, in a packed segment.
    pub(super) inner: Option<buddy::Allocation>,
}

impl Placement {
    /// The segment holding the allocation.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The index of the segment in `PoolCore::segments`.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Offset in the segment, in bytes.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size asked for, in bytes.
    pub fn requested_size(&self) -> u64 {
        self.requested_bytes
    }

    /// The size held after rounding, in bytes.
    pub fn allocated_size(&self) -> u64 {
        self.allocated_bytes
    }

    /// Which of the policy's size classes its segment serves. Compaction moves allocations of
    /// packed segments and of segments of free ranges, never of dedicated ones.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by the policy's tests only")
    )]
    pub fn class(&self) -> SegmentClass {
        self.class
    }
}

/// A change to the segments, reported to the caller so that history and the GPU layer can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentEvent {
    /// A segment was created.
    Created {
        /// Its id.
        id: SegmentId,
        /// Its size, in bytes.
        size_bytes: u64,
    },
    /// A segment was given back.
    Destroyed {
        /// Its id.
        id: SegmentId,
        /// Its size, in bytes.
        size_bytes: u64,
    },
}
