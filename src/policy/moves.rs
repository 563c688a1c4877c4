//! What a compaction does, as data: the moves of a plan, the plan that holds their destinations,
//! and the estimate of what it would move.

use crate::buddy;

use super::segment::SegmentId;

/// One move of a `CompactionPlan`: a live allocation's bytes copied from one range to another.
/// The destination is reserved by the plan: free before it, disjoint from every live allocation
/// (the one moved included) and from the other moves' destinations, and never in the segment the
/// plan makes room in. So the copies of a plan may run in any order, or at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Move {
    /// The segment the allocation is in.
    pub from_segment: SegmentId,
    /// That segment's slot (`Placement::slot`).
    pub from_slot: usize,
    /// The allocation's offset there, in bytes (with `from_segment`, it names the allocation).
    pub from_offset: u64,
    /// The segment it moves to.
    pub to_segment: SegmentId,
    /// That segment's slot.
    pub to_slot: usize,
    /// Its offset there, in bytes.
    pub to_offset: u64,
    /// The range to copy: the allocation's size after rounding, in bytes.
    pub bytes: u64,
    /// The size the allocation asked for, in bytes (a copy of the data alone needs only these,
    /// rounded up to the device's copy alignment).
    pub requested_bytes: u64,
}

/// What compaction would do to make room for a request, without doing it
/// (`PoolCore::compaction_estimate`, [`OutOfMemory::compaction`](super::OutOfMemory::compaction)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CompactionEstimate {
    /// The segment the request would fit in.
    pub segment: SegmentId,
    /// The offset of the range emptied for it, in bytes.
    pub window_offset: u64,
    /// The size of that range, in bytes: for a packed request, an aligned block of the request
    /// rounded up to a power of two; for a mid-sized or large one, the request after rounding.
    pub window_bytes: u64,
    /// The allocations moved out of it.
    pub moves: usize,
    /// Their bytes after rounding: what the copies cover.
    pub moved_bytes: u64,
}

/// Moves that make room for one request in the segments held (`PoolCore::compaction_plan`).
/// Their destinations are reserved in the pool until the plan is applied
/// (`PoolCore::apply_moves`) or cancelled (`PoolCore::cancel_compaction`): the caller copies
/// each move's bytes while the sources are still live, then applies the plan, which updates the
/// moved placements and frees the sources. Not `Clone`; dropping it keeps the destinations
/// reserved.
#[derive(Debug)]
#[must_use = "a compaction plan holds its destinations until it is applied or cancelled"]
pub struct CompactionPlan {
    pub(super) estimate: CompactionEstimate,
    pub(super) moves: Vec<Move>,
    /// The destinations, one per move, in the same order: the buddy allocation of a packed one,
    /// `None` for a range of a segment of free ranges (the move names it).
    pub(super) reserved: Vec<Option<buddy::Allocation>>,
}

/// `moves` serves the pool and the replay; the other accessors serve the policy's tests, which
/// read a plan without applying it.
impl CompactionPlan {
    /// The moves, largest first.
    pub fn moves(&self) -> &[Move] {
        &self.moves
    }

    /// The bytes all the moves copy (allocated sizes).
    #[cfg(test)]
    pub fn moved_bytes(&self) -> u64 {
        self.estimate.moved_bytes
    }

    /// The segment, block and cost of the plan.
    #[cfg(test)]
    pub fn estimate(&self) -> CompactionEstimate {
        self.estimate
    }

    /// True when the plan moves `placement`.
    #[cfg(test)]
    pub fn moves_placement(&self, placement: &super::segment::Placement) -> bool {
        self.moves
            .iter()
            .any(|m| m.from_segment == placement.segment() && m.from_offset == placement.offset())
    }
}
