//! Compaction's windows, on plain offsets and sizes: which aligned block (or, for free ranges,
//! which range) of a segment is the cheapest to empty by moving the live allocations that overlap
//! it, within [`CompactionLimits`], and a model of the free blocks of the other segments that says
//! whether those allocations would fit there. The policy (`PoolCore::compaction_plan`, in
//! `compaction.rs`) turns this into a plan of moves.

use std::collections::BTreeMap;

use super::segment::Live;

/// How much one compaction may move. The default moves at most the request's own rounded size, in
/// at most 64 allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompactionLimits {
    /// The bytes moved (allocated sizes, what the copies cover) are at most this many times the
    /// request's rounded size. 1 by default: a compaction never copies more bytes than the request
    /// it makes room for. 0 turns compaction off.
    pub max_moved_factor: u64,
    /// The most allocations moved by one compaction.
    pub max_moves: usize,
}

impl Default for CompactionLimits {
    fn default() -> Self {
        Self {
            max_moved_factor: 1,
            max_moves: 64,
        }
    }
}

/// An aligned block of a segment and the live allocations that overlap it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    /// Its offset in the segment, in bytes (a multiple of its size).
    pub(crate) offset: u64,
    /// Its size, in bytes.
    pub(crate) bytes: u64,
    /// The allocated bytes of the allocations that overlap it.
    pub(crate) moved_bytes: u64,
    /// The offsets of those allocations, in address order.
    pub(crate) sources: Vec<u64>,
}

/// The cheapest aligned blocks of `block_bytes` (a power of two) in a segment of `capacity_bytes`:
/// at most `keep` of them, cheapest first — the fewest bytes of overlapping live allocations, then
/// the fewest allocations, then the lowest offset —, among those that can be emptied by moving
/// at most `bounds.0` bytes in at most `bounds.1` allocations, all of them `movable` (asked by
/// offset). A block that is wholly free is returned alone, with nothing to move.
///
/// Every block that overlaps a live allocation either holds an allocation's start or begins
/// inside the allocation before it, and the blocks of the second kind cost what the first of them
/// after that allocation's own block costs (or more, at a higher offset). So the blocks examined
/// are, for each live allocation, the one holding its start and the next one when the allocation
/// reaches into it: blocks with free space and blocks held whole by allocations alike (issue 26,
/// item 5: a block held only by movable allocations, with no free byte, is a window too). The
/// cost: at most two blocks per live allocation, each O(log n + m) where m, the allocations it
/// overlaps that are looked at, is at most `bounds.1 + 1` (the count stops at the first bound
/// passed), plus O(`keep`) to rank it.
pub(crate) fn cheapest_windows(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
    block_bytes: u64,
    bounds: (u64, usize),
    movable: &dyn Fn(u64) -> bool,
    keep: usize,
) -> Vec<Window> {
    debug_assert!(block_bytes.is_power_of_two());
    let (max_moved, max_moves) = bounds;
    if block_bytes > capacity_bytes || keep == 0 {
        return Vec::new();
    }
    for (gap_start, gap_end) in free_gaps(live, capacity_bytes) {
        // The gap [gap_start, gap_end) is free.
        let whole = gap_start.div_ceil(block_bytes);
        if (whole + 1) * block_bytes <= gap_end.min(capacity_bytes) {
            // A whole aligned block is free: nothing to move.
            return vec![Window {
                offset: whole * block_bytes,
                bytes: block_bytes,
                moved_bytes: 0,
                sources: Vec::new(),
            }];
        }
    }
    let mut best = Cheapest::new(keep);
    let mut last_examined: Option<u64> = None;
    for (&offset, l) in live {
        let first = offset / block_bytes;
        let reaches_next = offset + l.allocated_bytes > (first + 1) * block_bytes;
        // Ascending: an allocation that reaches into the next block ends at or before the next
        // allocation's start.
        for index in std::iter::once(first).chain(reaches_next.then_some(first + 1)) {
            if last_examined.is_some_and(|last| last >= index) {
                continue;
            }
            last_examined = Some(index);
            let start = index * block_bytes;
            if start + block_bytes > capacity_bytes {
                continue;
            }
            let bound = best.bound(max_moved);
            if let Some(window) =
                window_cost(live, start, start + block_bytes, bound, max_moves, movable)
            {
                best.offer(window);
            }
        }
    }
    best.windows
}

/// The cheapest ranges of `bytes` in a segment of free ranges (mid-sized or large class) of
/// `capacity_bytes`, at most `keep` of them, cheapest first (the fewest bytes of overlapping live
/// allocations, then the fewest allocations, then the lowest offset), among those `accept` takes
/// that can be emptied by moving at most `bounds.0` bytes in at most `bounds.1` allocations, all
/// of them `movable` (asked by offset).
///
/// Sliding a range down keeps or shrinks the set of allocations it overlaps until its start meets
/// the end of an allocation (or the segment's start): so the ranges examined start at the segment's
/// start or at a live allocation's end (where a free gap starts, or where the next allocation
/// begins at once: a range held only by allocations, issue 26, item 5), end at a free gap's end,
/// or end at the segment's end. The cost: at most one range per live allocation and gap, plus
/// two, each O(log n + m) as in [`cheapest_windows`], after sorting their starts.
pub(crate) fn cheapest_range_windows(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
    bytes: u64,
    bounds: (u64, usize),
    movable: &dyn Fn(u64) -> bool,
    accept: &dyn Fn(&Window) -> bool,
    keep: usize,
) -> Vec<Window> {
    let (max_moved, max_moves) = bounds;
    if bytes == 0 || bytes > capacity_bytes || keep == 0 {
        return Vec::new();
    }
    let last_start = capacity_bytes - bytes;
    let mut starts: Vec<u64> = live
        .iter()
        .map(|(&offset, l)| (offset + l.allocated_bytes).min(last_start))
        .chain(free_gaps(live, capacity_bytes).map(|(_, end)| end.saturating_sub(bytes)))
        .chain([0, last_start])
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let mut best = Cheapest::new(keep);
    for start in starts {
        let bound = best.bound(max_moved);
        let Some(window) = window_cost(live, start, start + bytes, bound, max_moves, movable)
        else {
            continue;
        };
        if best.would_take(&window) && accept(&window) {
            best.offer(window);
        }
    }
    best.windows
}

/// The `keep` cheapest windows offered so far, cheapest first.
struct Cheapest {
    keep: usize,
    windows: Vec<Window>,
}

impl Cheapest {
    fn new(keep: usize) -> Self {
        Self {
            keep,
            windows: Vec::with_capacity(keep.min(16)),
        }
    }

    fn key(window: &Window) -> (u64, usize, u64) {
        (window.moved_bytes, window.sources.len(), window.offset)
    }

    /// The most bytes a window may move and still be kept.
    fn bound(&self, max_moved: u64) -> u64 {
        match self.windows.last() {
            Some(last) if self.windows.len() == self.keep => last.moved_bytes.min(max_moved),
            _ => max_moved,
        }
    }

    fn would_take(&self, window: &Window) -> bool {
        self.windows.len() < self.keep
            || self
                .windows
                .last()
                .is_some_and(|last| Self::key(window) < Self::key(last))
    }

    fn offer(&mut self, window: Window) {
        if !self.would_take(&window) {
            return;
        }
        let key = Self::key(&window);
        let at = self.windows.partition_point(|w| Self::key(w) < key);
        self.windows.insert(at, window);
        self.windows.truncate(self.keep);
    }
}

/// The free range a segment of `capacity_bytes` would hold around `window` once the window's
/// allocations (its `sources`) moved away, as `(offset, length)`.
pub(crate) fn range_after_moves(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
    window: &Window,
) -> (u64, u64) {
    let moved = |offset: &u64| window.sources.binary_search(offset).is_ok();
    let start = live
        .range(..window.offset)
        .rev()
        .find(|(offset, _)| !moved(offset))
        .map_or(0, |(&offset, l)| offset + l.allocated_bytes);
    let end = live
        .range(window.offset + window.bytes..)
        .find(|(offset, _)| !moved(offset))
        .map_or(capacity_bytes, |(&offset, _)| offset);
    (start, end - start)
}

/// The free gaps `[start, end)` between the live allocations of a segment of `capacity_bytes`,
/// in address order.
fn free_gaps(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut previous_end = 0u64;
    live.iter()
        .map(|(&offset, l)| (offset, offset + l.allocated_bytes))
        .chain(std::iter::once((capacity_bytes, capacity_bytes)))
        .filter_map(move |(start, end)| {
            let gap = (start > previous_end).then_some((previous_end, start));
            previous_end = previous_end.max(end);
            gap
        })
}

/// The allocations overlapping `[start, end)`, or `None` when they pass the bounds or one of them
/// is not `movable`.
fn window_cost(
    live: &BTreeMap<u64, Live>,
    start: u64,
    end: u64,
    max_moved: u64,
    max_moves: usize,
    movable: &dyn Fn(u64) -> bool,
) -> Option<Window> {
    let mut window = Window {
        offset: start,
        bytes: end - start,
        moved_bytes: 0,
        sources: Vec::new(),
    };
    let before = live
        .range(..start)
        .next_back()
        .filter(|(&offset, l)| offset + l.allocated_bytes > start);
    for (&offset, l) in before.into_iter().chain(live.range(start..end)) {
        window.moved_bytes += l.allocated_bytes;
        window.sources.push(offset);
        if window.moved_bytes > max_moved || window.sources.len() > max_moves || !movable(offset) {
            return None;
        }
    }
    Some(window)
}

/// A segment's free space as counts of free blocks per order (a block of order `k` is
/// `min_block << k` bytes), read from the gaps between its live allocations: the blocks a buddy
/// allocator whose coalescing is complete holds. Used to predict whether moved allocations fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FreeBlocks {
    counts: [u64; 64],
    min_block_shift: u32,
}

impl FreeBlocks {
    /// The free blocks of a segment of `capacity_bytes` with these live allocations.
    pub(crate) fn of(
        live: &BTreeMap<u64, Live>,
        capacity_bytes: u64,
        min_block_bytes: u64,
    ) -> Self {
        let mut blocks = Self {
            counts: [0; 64],
            min_block_shift: min_block_bytes.trailing_zeros(),
        };
        for (start, end) in free_gaps(live, capacity_bytes) {
            blocks.add_run(
                start >> blocks.min_block_shift,
                end >> blocks.min_block_shift,
            );
        }
        blocks
    }

    /// Adds the maximal aligned blocks of the free units `[start, end)`.
    fn add_run(&mut self, mut start: u64, end: u64) {
        while start < end {
            let align = if start == 0 {
                63
            } else {
                start.trailing_zeros()
            };
            let fits = 63 - (end - start).leading_zeros();
            let order = align.min(fits);
            self.counts[order as usize] += 1;
            start += 1 << order;
        }
    }

    /// The order of the smallest free block that holds `units` units, if any.
    pub(crate) fn smallest_fit(&self, units: u64) -> Option<u32> {
        let needed = units.next_power_of_two().trailing_zeros();
        (needed..64).find(|&order| self.counts[order as usize] > 0)
    }

    /// Takes `units` units from the start of a free block of `order`, as the buddy core's exact fit
    /// does: the tail goes back as its binary pieces.
    pub(crate) fn take(&mut self, order: u32, units: u64) {
        debug_assert!(self.counts[order as usize] > 0 && units <= 1 << order);
        self.counts[order as usize] -= 1;
        let tail = (1u64 << order) - units;
        for piece in 0..order {
            if tail & (1 << piece) != 0 {
                self.counts[piece as usize] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cheapest window alone.
    fn cheapest_window(
        live: &BTreeMap<u64, Live>,
        capacity_bytes: u64,
        block_bytes: u64,
        max_moved: u64,
        max_moves: usize,
        movable: &dyn Fn(u64) -> bool,
    ) -> Option<Window> {
        cheapest_windows(
            live,
            capacity_bytes,
            block_bytes,
            (max_moved, max_moves),
            movable,
            1,
        )
        .into_iter()
        .next()
    }

    fn index(allocations: &[(u64, u64)]) -> BTreeMap<u64, Live> {
        allocations
            .iter()
            .map(|&(offset, bytes)| {
                (
                    offset,
                    Live {
                        allocated_bytes: bytes,
                        requested_bytes: bytes,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_cheapest_aligned_block_is_chosen() {
        // A 4 KiB segment of 256-byte units: blocks of 1 KiB at 0, 1024, 2048, 3072.
        let live = index(&[
            (0, 768),
            (1024, 256),
            (1536, 256),
            (2048, 768),
            (3072, 1024),
        ]);
        let window = cheapest_window(&live, 4096, 1024, 1024, 8, &|_| true).unwrap();
        assert_eq!(
            (window.offset, window.moved_bytes, window.sources),
            (1024, 512, vec![1024, 1536])
        );
        // At most one move: [0, 1024) and [2048, 3072) tie on bytes, the lower offset wins.
        let window = cheapest_window(&live, 4096, 1024, 1024, 1, &|_| true).unwrap();
        assert_eq!((window.offset, window.sources), (0, vec![0]));
        // Pinned allocations are never moved: with the one at 0 pinned, [2048, 3072) is next.
        let window = cheapest_window(&live, 4096, 1024, 1024, 1, &|offset| offset != 0).unwrap();
        assert_eq!((window.offset, window.sources), (2048, vec![2048]));
        // The bound refuses every block.
        assert_eq!(cheapest_window(&live, 4096, 1024, 256, 8, &|_| true), None);
    }

    #[test]
    fn an_allocation_straddling_the_block_is_moved_whole() {
        let live = index(&[(0, 1280), (2048, 2048)]);
        // [0, 1024) and [1024, 2048) both move the allocation at 0, whole: the lower wins.
        let window = cheapest_window(&live, 4096, 1024, 4096, 8, &|_| true).unwrap();
        assert_eq!(
            (window.offset, window.moved_bytes, window.sources),
            (0, 1280, vec![0])
        );
        let windows = cheapest_windows(&live, 4096, 1024, (4096, 8), &|_| true, 4);
        let ranked: Vec<_> = windows.iter().map(|w| (w.offset, w.moved_bytes)).collect();
        assert_eq!(
            ranked,
            [(0, 1280), (1024, 1280), (2048, 2048), (3072, 2048)]
        );
    }

    #[test]
    fn a_block_held_whole_by_movable_allocations_is_a_window() {
        // Not a free byte in the segment; only the allocations in [0, 1024) may move.
        let live = index(&[
            (0, 512),
            (512, 512),
            (1024, 1024),
            (2048, 1024),
            (3072, 1024),
        ]);
        let movable = |offset: u64| offset < 1024;
        let window = cheapest_window(&live, 4096, 1024, 1024, 8, &movable).unwrap();
        assert_eq!(
            (window.offset, window.moved_bytes, window.sources),
            (0, 1024, vec![0, 512])
        );
        // Ranges of a segment of free ranges: [1024, 2048) begins where an allocation ends, with
        // no gap anywhere.
        let live = index(&[(0, 1024), (1024, 512), (1536, 512), (2048, 2048)]);
        let movable = |offset: u64| matches!(offset, 1024 | 1536);
        let windows = cheapest_range_windows(&live, 4096, 1024, (1024, 8), &movable, &|_| true, 4);
        let found: Vec<_> = windows
            .iter()
            .map(|w| (w.offset, w.sources.clone()))
            .collect();
        assert_eq!(found, [(1024, vec![1024, 1536])]);
    }

    #[test]
    fn a_free_block_needs_no_move() {
        let live = index(&[(0, 256), (3072, 256)]);
        let window = cheapest_window(&live, 4096, 1024, 0, 0, &|_| true).unwrap();
        assert_eq!((window.offset, window.moved_bytes), (1024, 0));
    }

    #[test]
    fn free_blocks_follow_the_gaps_and_exact_fit() {
        // Gaps: [256, 1024) = 256 + 512; [1280, 4096) = 256 + 512 + 2048.
        let live = index(&[(0, 256), (1024, 256)]);
        let mut blocks = FreeBlocks::of(&live, 4096, 256);
        assert_eq!(&blocks.counts[..4], &[2, 2, 0, 1]);
        assert_eq!(blocks.smallest_fit(3), Some(3));
        assert_eq!(blocks.smallest_fit(2), Some(1));
        // Three units from the 8-unit block: 5 go back as 1 + 4.
        blocks.take(3, 3);
        assert_eq!(&blocks.counts[..4], &[3, 2, 1, 0]);
        assert_eq!(blocks.smallest_fit(5), None);
    }
}
