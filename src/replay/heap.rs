//! A reference for what placement alone costs on a trace: one address space that grows and
//! shrinks at its top, best fit over coalesced free ranges, as a `malloc` places blocks.
//!
//! No wgpu pool can run this: a `wgpu::Buffer` cannot grow in place and wgpu exposes no sparse
//! binding, so a pool is made of separate segments, and a hole in the middle of one is given back
//! only by giving back the whole segment. The figure says how much of a strategy's peak comes from
//! the order and sizes of the trace's requests rather than from its segments: a pool that keeps
//! few segments holds about what this heap holds or more, since each segment boundary is one more
//! place a request cannot straddle.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::ReplayEvent;

/// Free ranges below a top that moves; `peak_top` is the highest top reached, in bytes.
#[derive(Debug, Default)]
struct Heap {
    /// Free ranges below the top by start: their lengths.
    by_start: BTreeMap<u64, u64>,
    /// The same ranges as `(length, start)`: the smallest that fits, lowest address first.
    by_length: BTreeSet<(u64, u64)>,
    top: u64,
    peak_top: u64,
}

impl Heap {
    fn insert_free(&mut self, start: u64, length: u64) {
        self.by_start.insert(start, length);
        self.by_length.insert((length, start));
    }

    fn remove_free(&mut self, start: u64, length: u64) {
        self.by_start.remove(&start);
        self.by_length.remove(&(length, start));
    }

    /// Places `length` bytes: the tightest free range that holds them (the lowest of equals),
    /// else at the top. Returns the start, or `None` when the top would pass `u64::MAX` (the
    /// peak is then `u64::MAX` and the request is not placed).
    fn allocate(&mut self, length: u64) -> Option<u64> {
        if let Some(&(free_length, start)) = self.by_length.range((length, 0)..).next() {
            self.remove_free(start, free_length);
            if free_length > length {
                self.insert_free(start + length, free_length - length);
            }
            return Some(start);
        }
        // No free range ends at the top (freeing one lowers the top): place at the top.
        let start = self.top;
        let Some(top) = start.checked_add(length) else {
            self.peak_top = u64::MAX;
            return None;
        };
        self.top = top;
        self.peak_top = self.peak_top.max(top);
        Some(start)
    }

    /// Frees `[start, start + length)`, coalescing with its neighbours; a range that ends at the
    /// top lowers the top.
    fn free(&mut self, mut start: u64, mut length: u64) {
        if let Some((&after, &after_length)) = self.by_start.range(start + length..).next() {
            if after == start + length {
                self.remove_free(after, after_length);
                length += after_length;
            }
        }
        if let Some((&before, &before_length)) = self.by_start.range(..start).next_back() {
            if before + before_length == start {
                self.remove_free(before, before_length);
                start = before;
                length += before_length;
            }
        }
        if start + length == self.top {
            self.top = start;
        } else {
            self.insert_free(start, length);
        }
    }
}

/// The peak top of one best-fit heap over `events`, each request rounded up to a multiple of
/// `block_bytes` (a power of two: the pool's smallest block). Requests the pool refuses whatever
/// it holds — zero bytes, above `max_request_bytes` (the device's largest buffer), or whose
/// rounding overflows — are skipped, so the heap places the requests a pool can; the simulated
/// device's capacity does not bound it.
pub(super) fn best_fit_heap_peak(
    events: &[ReplayEvent],
    block_bytes: u64,
    max_request_bytes: u64,
) -> u64 {
    let mask = block_bytes.max(1) - 1;
    let mut heap = Heap::default();
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    for event in events {
        match *event {
            ReplayEvent::Alloc { addr, size } => {
                let length = match size.checked_add(mask) {
                    Some(padded) if padded & !mask > 0 && size <= max_request_bytes => {
                        padded & !mask
                    }
                    // Nothing to place, or a size no pool accepts.
                    _ => continue,
                };
                let placed = heap.allocate(length).map(|start| (start, length));
                let previous = match placed {
                    Some(range) => live.insert(addr, range),
                    None => live.remove(&addr),
                };
                if let Some((old_start, old_length)) = previous {
                    heap.free(old_start, old_length);
                }
            }
            ReplayEvent::Free { addr } => {
                if let Some((start, length)) = live.remove(&addr) {
                    heap.free(start, length);
                }
            }
            ReplayEvent::SegmentAlloc { .. } | ReplayEvent::SegmentFree { .. } => {}
        }
    }
    heap.peak_top
}
