//! Compaction's arithmetic, on plain offsets and sizes: which aligned block of a segment is the
//! cheapest to empty by moving the live allocations that overlap it, and a model of the free blocks
//! of the other segments that says whether those allocations would fit there. The policy
//! (`PoolCore::compaction_plan` in the module above) turns this into a plan of moves.

use std::collections::BTreeMap;

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

/// A live allocation in a segment's index, keyed there by its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    /// Its size after rounding, in bytes: the range it holds.
    pub(crate) allocated_bytes: u64,
    /// The size asked for, in bytes.
    pub(crate) requested_bytes: u64,
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

/// The aligned block of `block_bytes` (a power of two) in a segment of `capacity_bytes` whose
/// overlapping live allocations are the fewest bytes (then the fewest allocations, then the lowest
/// offset), if one can be emptied by moving at most `max_moved` bytes in at most `max_moves`
/// allocations, all of them `movable` (asked by offset). Only blocks that hold some free space are
/// examined: at most two per gap between live allocations (a gap that holds a whole block returns
/// it at once, with nothing to move).
pub(crate) fn cheapest_window(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
    block_bytes: u64,
    max_moved: u64,
    max_moves: usize,
    movable: &dyn Fn(u64) -> bool,
) -> Option<Window> {
    debug_assert!(block_bytes.is_power_of_two());
    if block_bytes > capacity_bytes {
        return None;
    }
    let mut best: Option<Window> = None;
    let mut last_examined = None;
    let mut examine = |index: u64, best: &mut Option<Window>| {
        if last_examined == Some(index) {
            return;
        }
        last_examined = Some(index);
        let start = index * block_bytes;
        let end = start + block_bytes;
        if end > capacity_bytes {
            return;
        }
        let bound = best
            .as_ref()
            .map_or(max_moved, |b| b.moved_bytes.min(max_moved));
        if let Some(window) = window_cost(live, start, end, bound, max_moves, movable) {
            let better = best.as_ref().is_none_or(|b| {
                (window.moved_bytes, window.sources.len()) < (b.moved_bytes, b.sources.len())
            });
            if better {
                *best = Some(window);
            }
        }
    };
    for (gap_start, gap_end) in free_gaps(live, capacity_bytes) {
        // The gap [gap_start, gap_end) is free.
        let whole = gap_start.div_ceil(block_bytes);
        if (whole + 1) * block_bytes <= gap_end.min(capacity_bytes) {
            // A whole aligned block is free: nothing to move.
            return Some(Window {
                offset: whole * block_bytes,
                bytes: block_bytes,
                moved_bytes: 0,
                sources: Vec::new(),
            });
        }
        let first = gap_start / block_bytes;
        let last = (gap_end - 1) / block_bytes;
        examine(first, &mut best);
        examine(last, &mut best);
    }
    best
}

/// The range of `bytes` in a segment of free ranges (mid-sized or large class) of `capacity_bytes`
/// whose overlapping live allocations are the fewest bytes (then the fewest allocations, then the
/// lowest offset), among those `accept` takes, if one can be emptied by moving at most `max_moved`
/// bytes in at most `max_moves` allocations, all of them `movable` (asked by offset). The ranges
/// examined start at a free gap's start or end at its end (at most two per gap), or start at the
/// segment's start or end at its end: each holds some free space, or lies at an edge.
pub(crate) fn cheapest_range_window(
    live: &BTreeMap<u64, Live>,
    capacity_bytes: u64,
    bytes: u64,
    bounds: (u64, usize),
    movable: &dyn Fn(u64) -> bool,
    accept: &dyn Fn(&Window) -> bool,
) -> Option<Window> {
    let (max_moved, max_moves) = bounds;
    if bytes == 0 || bytes > capacity_bytes {
        return None;
    }
    let last_start = capacity_bytes - bytes;
    let mut starts: Vec<u64> = free_gaps(live, capacity_bytes)
        .flat_map(|(start, end)| [start.min(last_start), end.saturating_sub(bytes)])
        .chain([0, last_start])
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let mut best: Option<Window> = None;
    for start in starts {
        let bound = best
            .as_ref()
            .map_or(max_moved, |b| b.moved_bytes.min(max_moved));
        let Some(window) = window_cost(live, start, start + bytes, bound, max_moves, movable)
        else {
            continue;
        };
        let better = best.as_ref().is_none_or(|b| {
            (window.moved_bytes, window.sources.len()) < (b.moved_bytes, b.sources.len())
        });
        if better && accept(&window) {
            best = Some(window);
        }
    }
    best
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
        let window = cheapest_window(&live, 4096, 1024, 4096, 8, &|_| true).unwrap();
        assert_eq!(
            (window.offset, window.moved_bytes, window.sources),
            (1024, 1280, vec![0])
        );
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
