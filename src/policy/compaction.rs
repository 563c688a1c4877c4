//! Compaction: moving live allocations to make room for a request in the segments held. The
//! policy decides and keeps the books; the caller copies the bytes (the replay only counts them).
//!
//! The algorithm: a packed request of `size` needs a free aligned block of `size` rounded up to a
//! power of two (`B`); once such a block is free, the buddy core serves the request from it (its
//! coalescing is complete, so the block lies within one of the free run's canonical blocks). In
//! every packed segment the blocks of `B` that overlap live allocations are ranked by the bytes of
//! those allocations (then their count, then the offset); an allocation that straddles a block's
//! edge is moved whole. The blocks examined are, for each live allocation, the one holding its
//! start and the next one when it reaches into it: every block that could be cheapest, those with
//! free space and those held whole by allocations alike (issue 26, item 5: a block with no free
//! byte whose allocations are all movable is a window too). A mid-sized or large request needs a
//! free range of its rounded size in a segment of its class: in each, the ranges examined start at
//! the segment's start or at a live allocation's end, or end at a free gap's end or at the
//! segment's end (sliding a range down keeps or shrinks what it overlaps until its start meets an
//! allocation's end), ranked alike; for a large request, only those where the class's own rules
//! (fill and remainder, [`large_fill_eighths`](super::PolicyConfig::large_fill_eighths)) would
//! then take the range the moves free, so that the request lands there. Each segment's [`COMPACTION_CANDIDATES`] cheapest windows
//! that can be emptied within the limits, moving only movable allocations, are candidates; all of
//! them are tried cheapest first (bytes, then allocations, then slot, then offset): the first whose
//! allocations fit, largest first, into the free space of the *other* segments of the class
//! (packed: a model of the buddy core's exact fit; free ranges: best fit, exactly as the
//! reservation takes them) is reserved there for real. The model places by sizes alone, so a window
//! is passed over, untried, when an earlier window of its segment failed at an allocation and the
//! largest allocations of this one, up to that many, have the same sizes (it would fail there too);
//! after [`COMPACTION_CANDIDATES`] failures the planner gives up. A destination in an empty segment
//! of free ranges is taken only where growing would not have given that segment back (within the
//! cache's ceiling with a new segment of the request) or where it is no larger than the request:
//! compacting never holds more than growing would. Destinations are never in the segment made room
//! in, so they never overlap the window, a source or a live allocation. The bound: a plan moves at
//! most `max_moved_factor` times the request's rounded size (1 by default: never more bytes than
//! the request) in at most `max_moves` allocations. Requests of the naive mode (dedicated segments)
//! are never compacted for.
//!
//! The cost, only when a request would otherwise grow the pool: ranking examines at most two
//! windows per live allocation (and per free gap) of the class, each O(log n + m) where m, the
//! allocations of the window looked at, is at most `max_moves + 1` (the count stops at the first
//! bound passed); then at most [`COMPACTION_CANDIDATES`] windows per segment are sorted, each
//! compared with the earlier failures in O(m log m) when its turn comes, and at most
//! [`COMPACTION_CANDIDATES`] model checks run, each O(live allocations of the class + m x
//! segments).

use std::collections::HashMap;

use crate::buddy;

use super::engine::PoolCore;
use super::error::CompactionError;
use super::moves::{CompactionEstimate, CompactionPlan, Move};
use super::ranges::RangeClass;
use super::segment::{Layout, Live, Placement, SegmentClass, SegmentId};
use super::storage::SegmentStorage;
use super::windows::{
    cheapest_range_windows, cheapest_windows, range_after_moves, CompactionLimits, FreeBlocks,
    Window,
};

/// How many candidate windows `PoolCore::compaction_plan` tries and sees fail, cheapest first,
/// before it gives up (windows passed over because an earlier failure says they would fail are not
/// counted), and how many windows of each segment it ranks.
pub const COMPACTION_CANDIDATES: usize = 8;

/// The windows a compaction has tried and failed to make room with, so that it passes over
/// windows that would fail the same way.
#[derive(Default)]
struct Tries {
    /// Per failure the model found: the segment and the sizes of the window's allocations,
    /// largest first, up to the one that fitted nowhere. The model places by sizes alone, largest
    /// first, so a window of that segment whose largest allocations have these sizes fails too.
    misfits: Vec<(usize, Vec<u64>)>,
    /// Per failure of the reservation (where the buddy core parts from the model): the segment
    /// and every allocation's sizes, allocated and requested, largest first.
    refused: Vec<(usize, Vec<(u64, u64)>)>,
}

/// The sizes of a window's allocations, allocated and requested, largest first.
type Sizes = Vec<(u64, u64)>;

impl Tries {
    /// The sizes of `window`'s allocations in `slot` if it is worth a try; `None` when an earlier
    /// failure says it would fail.
    fn admit<S: SegmentStorage>(
        &self,
        pool: &PoolCore<S>,
        slot: usize,
        window: &Window,
    ) -> Option<Sizes> {
        let segment = pool.segments[slot].as_ref()?;
        let mut sizes: Sizes = window
            .sources
            .iter()
            .map(|offset| {
                let live = segment.live[offset];
                (live.allocated_bytes, live.requested_bytes)
            })
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let misfit = self.misfits.iter().any(|(failed_slot, prefix)| {
            *failed_slot == slot
                && prefix.len() <= sizes.len()
                && prefix
                    .iter()
                    .zip(&sizes)
                    .all(|(bytes, (allocated, _))| bytes == allocated)
        });
        let refused = self
            .refused
            .iter()
            .any(|(failed_slot, failed)| *failed_slot == slot && *failed == sizes);
        (!misfit && !refused).then_some(sizes)
    }

    /// The model found no place for the `placed`-th allocation (largest first) of a window.
    fn misfit(&mut self, slot: usize, sizes: &Sizes, placed: usize) {
        let prefix = sizes.iter().take(placed).map(|&(allocated, _)| allocated);
        self.misfits.push((slot, prefix.collect()));
    }

    /// The reservation of a window's moves failed.
    fn refused(&mut self, slot: usize, sizes: Sizes) {
        self.refused.push((slot, sizes));
    }

    /// Whether [`COMPACTION_CANDIDATES`] windows have failed.
    fn exhausted(&self) -> bool {
        self.misfits.len() + self.refused.len() >= COMPACTION_CANDIDATES
    }
}

/// What compaction makes room for: a free aligned block of a packed segment, or a free range of
/// a segment of the mid-sized or large class.
#[derive(Debug, Clone, Copy)]
enum CompactionTarget {
    /// A free aligned block of `block_bytes` in a packed segment.
    Packed { block_bytes: u64 },
    /// A free range of `bytes` in a segment of `class`.
    Ranges { class: RangeClass, bytes: u64 },
}

impl<S: SegmentStorage> PoolCore<S> {
    /// What a compaction within `limits` would move to make room for `size_bytes` in the segments
    /// held, without moving anything: the plan `PoolCore::compaction_plan` would try first. A
    /// prediction (the model of free blocks may differ from the buddy core's choices); `None` when
    /// no block can be emptied within the limits, or for a request compaction cannot serve.
    pub fn compaction_estimate(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
    ) -> Option<CompactionEstimate> {
        self.compaction_estimate_where(size_bytes, limits, |_, _| true)
    }

    /// `PoolCore::compaction_estimate` moving only the allocations for which `movable(segment,
    /// offset)` is true: a block that overlaps another one is never chosen.
    pub fn compaction_estimate_where(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionEstimate> {
        let mut tries = Tries::default();
        for (window, slot) in self.compaction_candidates(size_bytes, limits, &movable) {
            let Some(sizes) = tries.admit(self, slot, &window) else {
                continue;
            };
            match self.predicted_destinations(slot, &window) {
                Ok(_) => return Some(self.estimate_of(slot, &window)),
                Err(placed) => tries.misfit(slot, &sizes, placed),
            }
            if tries.exhausted() {
                break;
            }
        }
        None
    }

    /// Plans moves that make room for a request of `size_bytes` in the segments held, and
    /// reserves their destinations (see the algorithm above). `None` when no window of any segment
    /// of the request's class can be emptied within `limits`, or for a request compaction cannot
    /// serve (0 bytes, too large, or in the naive mode). A plan with no moves means a free block already holds the
    /// request. Apply it with `PoolCore::apply_moves` once the bytes are copied, or cancel it
    /// with `PoolCore::cancel_compaction`; until then, allocate nothing else.
    pub fn compaction_plan(
        &mut self,
        size_bytes: u64,
        limits: CompactionLimits,
    ) -> Option<CompactionPlan> {
        self.compaction_plan_where(size_bytes, limits, |_, _| true)
    }

    /// `PoolCore::compaction_plan` moving only the allocations for which `movable(segment,
    /// offset)` is true (the GPU pool moves only those whose owner can follow them: a compute
    /// context's tensors).
    pub fn compaction_plan_where(
        &mut self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionPlan> {
        let candidates = self.compaction_candidates(size_bytes, limits, &movable);
        let mut tries = Tries::default();
        for (window, slot) in candidates {
            let Some(sizes) = tries.admit(self, slot, &window) else {
                continue;
            };
            match self.predicted_destinations(slot, &window) {
                Ok(destinations) => match self.reserve_moves(slot, &window, destinations) {
                    Some(plan) => return Some(plan),
                    None => tries.refused(slot, sizes),
                },
                Err(placed) => tries.misfit(slot, &sizes, placed),
            }
            if tries.exhausted() {
                break;
            }
        }
        None
    }

    /// Carries out `plan` in the books: each moved placement (found among `placements` by its
    /// segment and offset; others are passed over) now names its destination, and its source
    /// range is freed. Call it once the caller has copied every move's bytes. Afterwards the
    /// request fits in the plan's segment: `PoolCore::allocate` places it without growing. The
    /// statistics do not change (the same allocations hold the same bytes). Returns the bytes
    /// moved.
    ///
    /// # Errors
    ///
    /// [`CompactionError::MissingPlacement`] when a placement the plan moves was not given; the
    /// plan is then cancelled and nothing moves.
    pub fn apply_moves<'a>(
        &mut self,
        plan: CompactionPlan,
        placements: impl IntoIterator<Item = &'a mut Placement>,
    ) -> Result<u64, CompactionError> {
        let mut wanted: HashMap<(SegmentId, u64), usize> = plan
            .moves
            .iter()
            .enumerate()
            .map(|(index, m)| ((m.from_segment, m.from_offset), index))
            .collect();
        let mut matched: Vec<Option<&'a mut Placement>> = plan.moves.iter().map(|_| None).collect();
        for placement in placements {
            if wanted.is_empty() {
                break;
            }
            // A plan's sources are in packed segments or segments of free ranges, never in a
            // dedicated one: `(segment, offset)` names one placement.
            if let Some(index) = wanted.remove(&(placement.segment, placement.offset_bytes)) {
                matched[index] = Some(placement);
            }
        }
        if let Some(&(segment, offset)) = wanted.keys().min() {
            self.cancel_compaction(plan);
            return Err(CompactionError::MissingPlacement { segment, offset });
        }
        let CompactionPlan {
            moves,
            reserved,
            estimate,
            ..
        } = plan;
        for ((m, destination), placement) in moves.iter().zip(reserved).zip(matched) {
            let placement = placement.expect("every move was matched");
            assert_eq!(
                placement.allocated_bytes, m.bytes,
                "wgpu_pool::policy: the placement at offset {} of segment {:?} is not the allocation the plan moves",
                m.from_offset, m.from_segment
            );
            placement.segment = m.to_segment;
            placement.slot = m.to_slot;
            placement.offset_bytes = m.to_offset;
            match destination {
                Some(destination) => {
                    let source = placement
                        .inner
                        .replace(destination)
                        .expect("a moved placement is packed");
                    self.free_packed(m.from_slot, source);
                }
                None => {
                    assert!(
                        placement.inner.is_none(),
                        "wgpu_pool::policy: a packed placement in a plan's move between ranges"
                    );
                    self.give_range(m.from_slot, m.from_offset, m.bytes);
                }
            }
        }
        Ok(estimate.moved_bytes)
    }

    /// Drops `plan` without moving anything: its reserved destinations are freed.
    pub fn cancel_compaction(&mut self, plan: CompactionPlan) {
        self.release_reserved(&plan.moves, plan.reserved);
    }

    /// Plans moves that empty the segment `id` (packed, or of free ranges): every live allocation
    /// in it, each `movable(segment, offset)`, moved into free space of the other segments of its
    /// kind (as `PoolCore::compaction_plan` places them), at most `limits.max_moves` of them.
    /// `None` when the slot holds a dedicated segment or none, one of its allocations is not
    /// movable, there are too many, or they do not fit elsewhere. An empty segment gives a plan with no moves. Apply it
    /// with `PoolCore::apply_moves`; the emptied segment can then be given back
    /// (`PoolCore::release_if_empty`).
    pub fn evacuation_plan(
        &mut self,
        id: SegmentId,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionPlan> {
        let slot = self.slot_of(id)?;
        let segment = self.segments[slot].as_ref()?;
        if segment.is_dedicated() {
            return None;
        }
        if segment.live.len() > limits.max_moves
            || segment
                .live
                .keys()
                .any(|&offset| !movable(segment.id, offset))
        {
            return None;
        }
        let window = Window {
            offset: 0,
            bytes: segment.size_bytes,
            moved_bytes: segment.live.values().map(|l| l.allocated_bytes).sum(),
            sources: segment.live.keys().copied().collect(),
        };
        let destinations = self.predicted_destinations(slot, &window).ok()?;
        self.reserve_moves(slot, &window, destinations)
    }

    /// What a request of `size_bytes` needs free, or `None` for a request compaction cannot serve.
    fn compaction_target(&self, size_bytes: u64) -> Option<CompactionTarget> {
        if !self.placeable(size_bytes) {
            return None;
        }
        match self.class_of(size_bytes) {
            SegmentClass::Dedicated => None,
            SegmentClass::Large => Some(CompactionTarget::Ranges {
                class: RangeClass::Large,
                bytes: self.large_rounded(size_bytes),
            }),
            SegmentClass::Mid => Some(CompactionTarget::Ranges {
                class: RangeClass::Mid,
                bytes: self.rounded_size(size_bytes),
            }),
            SegmentClass::Packed => {
                let units = size_bytes.div_ceil(self.config.min_block_bytes).max(1);
                Some(CompactionTarget::Packed {
                    block_bytes: units.next_power_of_two() * self.config.min_block_bytes,
                })
            }
        }
    }

    /// The cheapest windows of each segment of the request's class that can be emptied within
    /// `limits` (at most [`COMPACTION_CANDIDATES`] per segment), all of them cheapest first
    /// (bytes, then allocations, then slot, then offset), each with its slot.
    fn compaction_candidates(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: &dyn Fn(SegmentId, u64) -> bool,
    ) -> Vec<(Window, usize)> {
        let Some(target) = self.compaction_target(size_bytes) else {
            return Vec::new();
        };
        if limits.max_moved_factor == 0 {
            return Vec::new();
        }
        let max_moved = self
            .rounded_size(size_bytes)
            .saturating_mul(limits.max_moved_factor);
        let mut candidates: Vec<(Window, usize)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(slot, segment)| {
                let segment = segment.as_ref()?;
                let id = segment.id;
                let movable = |offset| movable(id, offset);
                let windows = match target {
                    CompactionTarget::Packed { block_bytes } => {
                        segment.allocator()?;
                        cheapest_windows(
                            &segment.live,
                            segment.size_bytes,
                            block_bytes,
                            (max_moved, limits.max_moves),
                            &movable,
                            COMPACTION_CANDIDATES,
                        )
                    }
                    CompactionTarget::Ranges { class, bytes } => {
                        let ranges = segment.ranges().filter(|r| r.class() == class)?;
                        // The request is placed by the class's own rule once the window is free:
                        // a large one only where that rule takes the range the window frees.
                        let accept = |window: &Window| {
                            class == RangeClass::Mid || {
                                let (_, length) =
                                    range_after_moves(&segment.live, segment.size_bytes, window);
                                let used = ranges.allocated_bytes() - window.moved_bytes;
                                self.large_range_ok(length, used, bytes, segment.size_bytes)
                            }
                        };
                        cheapest_range_windows(
                            &segment.live,
                            segment.size_bytes,
                            bytes,
                            (max_moved, limits.max_moves),
                            &movable,
                            &accept,
                            COMPACTION_CANDIDATES,
                        )
                    }
                };
                Some(windows.into_iter().map(move |window| (window, slot)))
            })
            .flatten()
            .collect();
        candidates.sort_by_key(|(window, slot)| {
            (
                window.moved_bytes,
                window.sources.len(),
                *slot,
                window.offset,
            )
        });
        candidates
    }

    /// The allocations overlapping `window` in `slot`, largest first, each with the other segment
    /// of its class the model of free space places it in (packed: the tightest fit, as the policy
    /// places; free ranges: best fit). `Err(n)` when one of them fits nowhere: the `n`-th, counted
    /// from 1, largest first. The model decides by sizes alone, so any window of the same segment
    /// whose `n` largest allocations have these sizes fails the same way.
    fn predicted_destinations(
        &self,
        slot: usize,
        window: &Window,
    ) -> Result<Vec<(u64, Live, usize)>, usize> {
        let min_block = self.config.min_block_bytes;
        let Some(segment) = self.segments[slot].as_ref() else {
            return Err(0);
        };
        let mut sources: Vec<(u64, Live)> = window
            .sources
            .iter()
            .map(|offset| (*offset, segment.live[offset]))
            .collect();
        sources.sort_by_key(|(offset, live)| (std::cmp::Reverse(live.allocated_bytes), *offset));
        if sources.is_empty() {
            return Ok(Vec::new());
        }
        let mut destinations = Vec::with_capacity(sources.len());
        if let Some(ranges) = segment.ranges() {
            // Best fit over the free ranges of the class's other segments, as `reserve_range`
            // takes them: the model is exact.
            let mut model = self.ranges_free[ranges.class()]
                .without(|other| other == slot || !self.destination_ok(other, window.bytes));
            for (offset, live) in sources {
                let Some((to_slot, _)) = model.take_best_fit(live.allocated_bytes) else {
                    return Err(destinations.len() + 1);
                };
                destinations.push((offset, live, to_slot));
            }
            return Ok(destinations);
        }
        let mut models: Vec<(usize, FreeBlocks)> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != slot)
            .filter_map(|(other, s)| {
                let s = s.as_ref().filter(|s| s.allocator().is_some())?;
                Some((other, FreeBlocks::of(&s.live, s.size_bytes, min_block)))
            })
            .collect();
        for (offset, live) in sources {
            let units = live.allocated_bytes / min_block;
            let Some((index, order)) = models
                .iter()
                .enumerate()
                .filter_map(|(index, (_, model))| Some((index, model.smallest_fit(units)?)))
                .min_by_key(|&(index, order)| (order, index))
            else {
                return Err(destinations.len() + 1);
            };
            models[index].1.take(order, units);
            destinations.push((offset, live, models[index].0));
        }
        Ok(destinations)
    }

    fn estimate_of(&self, slot: usize, window: &Window) -> CompactionEstimate {
        CompactionEstimate {
            segment: self.segments[slot]
                .as_ref()
                .expect("a candidate's segment is held")
                .id,
            window_offset: window.offset,
            window_bytes: window.bytes,
            moves: window.sources.len(),
            moved_bytes: window.moved_bytes,
        }
    }

    /// Reserves the destinations of `window`'s allocations, in the predicted segments (or, when
    /// the buddy core's choices part from the model, in the tightest other packed segment). On
    /// failure, gives back what it reserved and returns `None`.
    fn reserve_moves(
        &mut self,
        slot: usize,
        window: &Window,
        destinations: Vec<(u64, Live, usize)>,
    ) -> Option<CompactionPlan> {
        let estimate = self.estimate_of(slot, window);
        let mut moves = Vec::with_capacity(destinations.len());
        let mut reserved = Vec::with_capacity(destinations.len());
        let ranges_class = self.segments[slot]
            .as_ref()
            .and_then(|s| s.ranges())
            .map(|ranges| ranges.class());
        for (offset, live, predicted) in destinations {
            let destination = match ranges_class {
                Some(class) => self
                    .reserve_range(class, slot, window.bytes, live)
                    .map(|(to_slot, to_offset)| (to_slot, to_offset, None)),
                None => self
                    .reserve_in(predicted, live)
                    .or_else(|| {
                        let fallback = self.tightest_other(slot, live.requested_bytes)?;
                        self.reserve_in(fallback, live)
                    })
                    .map(|(to_slot, allocation)| (to_slot, allocation.offset(), Some(allocation))),
            };
            let Some((to_slot, to_offset, allocation)) = destination else {
                self.release_reserved(&moves, reserved);
                return None;
            };
            moves.push(Move {
                from_segment: estimate.segment,
                from_slot: slot,
                from_offset: offset,
                to_segment: self.segments[to_slot].as_ref().expect("held").id,
                to_slot,
                to_offset,
                bytes: live.allocated_bytes,
                requested_bytes: live.requested_bytes,
            });
            reserved.push(allocation);
        }
        Some(CompactionPlan {
            estimate,
            moves,
            reserved,
        })
    }

    /// Whether a compaction that makes room for `request_bytes` may move an allocation into the
    /// segment of free ranges in `slot`: one that holds allocations, or an empty one that growing
    /// would not have given back (within the cache's ceiling with a new segment of the request)
    /// or that is no larger than the request. So compacting never holds more than growing would.
    fn destination_ok(&self, slot: usize, request_bytes: u64) -> bool {
        let Some(segment) = self.segments[slot].as_ref() else {
            return false;
        };
        !segment.is_empty()
            || segment.size_bytes <= request_bytes
            || self.stats.reserved_bytes.current + request_bytes
                <= self.cache_ceiling(request_bytes)
    }

    /// Reserves a destination for an allocation like `live` in the tightest free range of the
    /// class of free ranges `class` outside the segment in `excluded`, where
    /// `PoolCore::destination_ok` allows it for a request of `request_bytes`: `(slot, offset)`.
    fn reserve_range(
        &mut self,
        class: RangeClass,
        excluded: usize,
        request_bytes: u64,
        live: Live,
    ) -> Option<(usize, u64)> {
        let (slot, offset) = self.ranges_free[class]
            .best_fit(live.allocated_bytes, |_, slot| {
                slot != excluded && self.destination_ok(slot, request_bytes)
            })?;
        let index = &mut self.ranges_free[class];
        let segment = self.segments[slot].as_mut()?;
        let Layout::Ranges(ranges) = &mut segment.layout else {
            return None;
        };
        index.take(slot, ranges, offset, live.allocated_bytes);
        segment.live.insert(offset, live);
        Some((slot, offset))
    }

    /// Reserves a destination for an allocation like `live` in `slot`.
    fn reserve_in(&mut self, slot: usize, live: Live) -> Option<(usize, buddy::Allocation)> {
        let segment = self.segments[slot].as_mut()?;
        let allocator = segment.allocator_mut()?;
        let allocation = allocator.allocate(live.requested_bytes).ok()?;
        debug_assert_eq!(
            allocation.allocated_size(allocator.min_block()),
            live.allocated_bytes
        );
        segment.live.insert(allocation.offset(), live);
        Some((slot, allocation))
    }

    /// The packed segment other than `excluded` with the tightest aligned fit for `size_bytes`.
    fn tightest_other(&self, excluded: usize, size_bytes: u64) -> Option<usize> {
        self.segments
            .iter()
            .enumerate()
            .filter(|(slot, _)| *slot != excluded)
            .filter_map(|(slot, s)| Some((s.as_ref()?.allocator()?.fit_order(size_bytes)?, slot)))
            .min()
            .map(|(_, slot)| slot)
    }

    fn release_reserved(&mut self, moves: &[Move], reserved: Vec<Option<buddy::Allocation>>) {
        for (m, allocation) in moves.iter().zip(reserved) {
            match allocation {
                Some(allocation) => self.free_packed(m.to_slot, allocation),
                None => self.give_range(m.to_slot, m.to_offset, m.bytes),
            }
        }
    }

    /// Frees `allocation` in the packed segment in `slot` and forgets its live entry (a moved
    /// source, or a plan's reserved destination): no statistics change.
    fn free_packed(&mut self, slot: usize, allocation: buddy::Allocation) {
        let segment = self.segments[slot]
            .as_mut()
            .expect("a plan's segment is held");
        segment.live.remove(&allocation.offset());
        segment
            .allocator_mut()
            .expect("a packed segment")
            .free(allocation);
    }

    /// Gives back `bytes` at `offset` of the segment of free ranges in `slot` and forgets its
    /// live entry (a moved source, or a plan's reserved destination): no statistics change.
    fn give_range(&mut self, slot: usize, offset: u64, bytes: u64) {
        let segment = self.segments[slot]
            .as_mut()
            .expect("a plan's segment is held");
        segment.live.remove(&offset);
        let Layout::Ranges(ranges) = &mut segment.layout else {
            panic!("wgpu_pool::policy: a range given back to a segment not of free ranges");
        };
        self.ranges_free[ranges.class()].give(slot, ranges, offset, bytes);
    }
}
