//! The allocator core: a buddy system over the offsets `[0, capacity)` of one segment.
//!
//! This module is pure offset arithmetic. It knows nothing of GPUs or of wgpu (an invariant of the
//! crate, checked by a test), so everything here runs and is tested without a GPU, and the replay
//! drives the very same code offline.
//!
//! # Exact fit
//!
//! A classic buddy allocator rounds every request up to the next power of two, which wastes about
//! a quarter of the allocated bytes on typical size mixes. With [`Rounding::Exact`] (the default) a
//! request is rounded up only to a multiple of `min_block`: the allocator takes the power-of-two
//! block, keeps the smallest run of buddy pieces that covers the request, and gives the unused tail
//! back to the free lists as smaller buddy blocks (what Linux's `alloc_pages_exact` does). Freeing
//! returns every piece, so coalescing stays complete: once everything is freed the whole capacity
//! is again one block at offset 0.
//!
//! A request of `n` units (of `min_block` bytes) is held as the pieces of `n`'s binary digits,
//! largest first: 5 units at offset 0 are a 4-unit block at 0 and a 1-unit block at 4, and the tail
//! `[5, 8)` is free as a 1-unit block at 5 and a 2-unit block at 6.
//!
//! Because a live range is just a run of units, it need not sit inside one aligned block: when no
//! block of the needed order is free, the allocator also tries a free block of half that order
//! together with the free units right after or before it, even across a buddy boundary (at most
//! [`STRADDLE_CANDIDATES`] candidates, lowest address first). A freed range is split into the
//! aligned blocks of its canonical decomposition, each freed and coalesced.
//!
//! # Cost
//!
//! Free blocks are kept in one bitmap per order with summary levels, so a buddy test is one bit
//! test, and finding the lowest-addressed free block of an order is one word read per summary level.
//! `allocate` and `free` cost O(log(capacity / min_block)) bit operations; nothing scans all blocks.
//! The bitmaps take about 2 bits of memory per `min_block` of capacity.
//!
//! # Handles and misuse
//!
//! [`Allocation`] is not `Clone` and [`BuddyAllocator::free`] consumes it, so a double free cannot
//! be written. Each allocator has a process-unique id stored in its handles: freeing a handle into
//! an allocator that did not make it panics with a message naming both ids (a bug in the caller,
//! not bad input).

mod bitmap;

use std::sync::atomic::{AtomicU32, Ordering};

use bitmap::Bitmap;

/// The largest `max_order` accepted: capacities up to `min_block << 32`.
pub const MAX_ORDER_LIMIT: u32 = 32;

/// How a request is rounded before it is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Rounding {
    /// Round up to a multiple of `min_block`; the unused tail of the power-of-two block goes back to
    /// the free lists (the default).
    #[default]
    Exact,
    /// Round up to the next power of two (the classic buddy system), kept for comparison.
    PowerOfTwo,
}

/// Why a [`BuddyAllocator`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `min_block` must be a power of two of at least 1 byte.
    #[error("min_block must be a power of two, got {min_block_bytes} bytes")]
    MinBlockNotPowerOfTwo {
        /// The value given, in bytes.
        min_block_bytes: u64,
    },
    /// `max_order` above [`MAX_ORDER_LIMIT`], or a capacity that does not fit in 64 bits.
    #[error(
        "max_order {max_order} is too large: at most {MAX_ORDER_LIMIT}, with min_block << max_order below 2^64 bytes"
    )]
    MaxOrderTooLarge {
        /// The value given.
        max_order: u32,
    },
    /// A capacity of zero, or one that is not a multiple of `min_block`.
    #[error("capacity {capacity_bytes} bytes is not a nonzero multiple of min_block ({min_block_bytes} bytes)")]
    CapacityNotMultipleOfMinBlock {
        /// The capacity asked for, in bytes.
        capacity_bytes: u64,
        /// The minimum block, in bytes.
        min_block_bytes: u64,
    },
}

/// Why a request could not be served. Every variant carries the figures needed to explain it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A request of zero bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A request larger than the whole capacity once rounded: it can never fit.
    #[error("request of {requested_bytes} bytes (once rounded) exceeds the capacity of {capacity_bytes} bytes")]
    TooLarge {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The allocator's whole capacity, in bytes.
        capacity_bytes: u64,
    },
    /// No free block is large enough now; freeing may make room.
    #[error(
        "no room for {requested_bytes} bytes (needs a free block of {needed_block_bytes} bytes): \
         {free_bytes} bytes free, largest free block {largest_free_bytes} bytes"
    )]
    OutOfSpace {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The power-of-two block the request needs, in bytes.
        needed_block_bytes: u64,
        /// The largest free block, in bytes.
        largest_free_bytes: u64,
        /// All free bytes, in bytes.
        free_bytes: u64,
    },
}

/// A range handed out by a [`BuddyAllocator`]. Not `Clone`: give it back with
/// [`BuddyAllocator::free`], which consumes it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an allocation that is dropped instead of freed stays allocated"]
pub struct Allocation {
    offset_bytes: u64,
    requested_bytes: u64,
    units: u64,
    allocator_id: u32,
}

impl Allocation {
    /// Start of the range, in bytes from the start of the segment; a multiple of `min_block`.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size that was asked for, in bytes.
    pub fn requested_size(&self) -> u64 {
        self.requested_bytes
    }

    /// The size held for this request after rounding (a multiple of `min_block`), in bytes.
    pub fn allocated_size(&self, min_block_bytes: u64) -> u64 {
        self.units * min_block_bytes
    }

    /// The number of `min_block` units held.
    pub fn units(&self) -> u64 {
        self.units
    }
}

/// Counters of one allocator, as plain data. Reading them costs O(1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// The whole range managed, in bytes.
    pub capacity_bytes: u64,
    /// Bytes held by live allocations after rounding, in bytes.
    pub allocated_bytes: u64,
    /// Bytes asked for by live allocations, in bytes.
    pub requested_bytes: u64,
    /// `capacity_bytes - allocated_bytes`, in bytes.
    pub free_bytes: u64,
    /// The largest free block, in bytes (0 when nothing is free).
    pub largest_free_bytes: u64,
    /// The smallest block, in bytes; block sizes are `min_block_bytes << order`.
    pub min_block_bytes: u64,
    /// `free_blocks_per_order[k]` counts the free blocks of `min_block_bytes << k` bytes; entries
    /// past `max_order` are 0.
    pub free_blocks_per_order: [u64; MAX_ORDER_LIMIT as usize + 1],
    /// Live allocations.
    pub allocation_count: u64,
}

impl Stats {
    /// `1 - requested / allocated`: the share of allocated bytes lost to rounding (0 when nothing is
    /// allocated).
    pub fn internal_fragmentation(&self) -> f64 {
        if self.allocated_bytes == 0 {
            0.0
        } else {
            1.0 - self.requested_bytes as f64 / self.allocated_bytes as f64
        }
    }

    /// `1 - largest_free / free`: how much of the free memory is outside the largest free block
    /// (0 when nothing is free).
    pub fn external_fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_bytes as f64 / self.free_bytes as f64
        }
    }
}

/// How many free blocks a straddling placement examines before it gives up.
pub const STRADDLE_CANDIDATES: usize = 32;

/// Calls `f(start, order)` for each aligned block of the canonical decomposition of `[start, end)`
/// into buddy blocks, in address order (at most `2 * max_order + 2` blocks).
fn for_each_piece(start: u64, end: u64, max_order: u32, mut f: impl FnMut(u64, u32)) {
    let mut position = start;
    while position < end {
        let alignment = if position == 0 {
            63
        } else {
            position.trailing_zeros()
        };
        let fits = 63 - (end - position).leading_zeros();
        let order = alignment.min(fits).min(max_order);
        f(position, order);
        position += 1u64 << order;
    }
}

static NEXT_ALLOCATOR_ID: AtomicU32 = AtomicU32::new(1);

/// A buddy allocator of the offsets `[0, capacity)`. The capacity is any multiple of `min_block`:
/// it starts as the blocks of its binary digits (40 units are a 32-unit root at 0 and an 8-unit root
/// at 32), which never merge with each other, though a request may straddle them.
#[derive(Debug)]
pub struct BuddyAllocator {
    id: u32,
    min_block_shift: u32,
    /// The order of the largest root block: `floor(log2(capacity_units))`.
    max_order: u32,
    capacity_units: u64,
    rounding: Rounding,
    /// `free[k]` holds `offset_units >> k` for every free block of order `k`; one spare bit past
    /// the end keeps every buddy index in bounds.
    free: Vec<Bitmap>,
    free_counts: [u64; MAX_ORDER_LIMIT as usize + 1],
    /// Bit `k` is set when `free[k]` is not empty.
    nonempty_orders: u64,
    allocated_units: u64,
    requested_bytes: u64,
    allocation_count: u64,
}

impl BuddyAllocator {
    /// An allocator of `min_block_bytes << max_order` bytes, all free.
    pub fn new(
        min_block_bytes: u64,
        max_order: u32,
        rounding: Rounding,
    ) -> Result<Self, ConfigError> {
        if max_order > MAX_ORDER_LIMIT || max_order >= 64 {
            return Err(ConfigError::MaxOrderTooLarge { max_order });
        }
        let capacity_bytes = min_block_bytes
            .checked_shl(max_order)
            .filter(|c| c >> max_order == min_block_bytes)
            .ok_or(ConfigError::MaxOrderTooLarge { max_order })?;
        Self::with_capacity(min_block_bytes, capacity_bytes, rounding)
    }

    /// An allocator of exactly `capacity_bytes`, a nonzero multiple of `min_block_bytes` of at most
    /// `min_block_bytes << (MAX_ORDER_LIMIT + 1)` bytes.
    pub fn with_capacity(
        min_block_bytes: u64,
        capacity_bytes: u64,
        rounding: Rounding,
    ) -> Result<Self, ConfigError> {
        if !min_block_bytes.is_power_of_two() {
            return Err(ConfigError::MinBlockNotPowerOfTwo { min_block_bytes });
        }
        let capacity_units = capacity_bytes / min_block_bytes;
        if capacity_units == 0 || !capacity_bytes.is_multiple_of(min_block_bytes) {
            return Err(ConfigError::CapacityNotMultipleOfMinBlock {
                capacity_bytes,
                min_block_bytes,
            });
        }
        let max_order = 63 - capacity_units.leading_zeros();
        if max_order > MAX_ORDER_LIMIT {
            return Err(ConfigError::MaxOrderTooLarge { max_order });
        }
        let free = (0..=max_order)
            .map(|order| Bitmap::new((capacity_units >> order) as usize + 1))
            .collect();
        let mut allocator = Self {
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            min_block_shift: min_block_bytes.trailing_zeros(),
            max_order,
            capacity_units,
            rounding,
            free,
            free_counts: [0; MAX_ORDER_LIMIT as usize + 1],
            nonempty_orders: 0,
            allocated_units: 0,
            requested_bytes: 0,
            allocation_count: 0,
        };
        for_each_piece(0, capacity_units, max_order, |start, order| {
            allocator.insert_free(order, (start >> order) as usize)
        });
        Ok(allocator)
    }

    /// The whole range managed, in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity_units << self.min_block_shift
    }

    /// The smallest block, in bytes.
    pub fn min_block(&self) -> u64 {
        1u64 << self.min_block_shift
    }

    /// The order of the largest root block: `min_block << max_order` is the largest power of two
    /// not above the capacity.
    pub fn max_order(&self) -> u32 {
        self.max_order
    }

    /// The rounding mode this allocator was built with.
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// True when nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.allocation_count == 0
    }

    /// The process-unique id stored in this allocator's handles.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The order of the free block an allocation of `size_bytes` would be cut from now, or `None`
    /// when it does not fit (or is 0 or larger than the capacity). O(1). A lower order is a tighter
    /// fit; the pool uses this to choose among segments.
    pub fn fit_order(&self, size_bytes: u64) -> Option<u32> {
        if size_bytes == 0
            || size_bytes > self.capacity()
            || self.units_for(size_bytes) > self.capacity_units
        {
            return None;
        }
        let order = self.order_for(size_bytes);
        let candidates = self.nonempty_orders >> order;
        (candidates != 0).then(|| order + candidates.trailing_zeros())
    }

    /// The bytes a request of `size_bytes` holds once placed (rounded to `min_block`, or to a power
    /// of two under [`Rounding::PowerOfTwo`]).
    pub fn rounded_size(&self, size_bytes: u64) -> u64 {
        self.units_for(size_bytes) << self.min_block_shift
    }

    fn units_for(&self, size_bytes: u64) -> u64 {
        let units = size_bytes.div_ceil(self.min_block()).max(1);
        match self.rounding {
            Rounding::Exact => units,
            Rounding::PowerOfTwo => units.next_power_of_two(),
        }
    }

    fn order_for(&self, size_bytes: u64) -> u32 {
        let units = size_bytes.div_ceil(self.min_block()).max(1);
        units.next_power_of_two().trailing_zeros()
    }

    /// Places a request of `size_bytes`. The lowest-addressed block of the smallest sufficient order
    /// is used. Costs O(log(capacity / min_block)).
    pub fn allocate(&mut self, size_bytes: u64) -> Result<Allocation, AllocError> {
        if size_bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        if size_bytes > self.capacity() || self.units_for(size_bytes) > self.capacity_units {
            return Err(AllocError::TooLarge {
                requested_bytes: size_bytes,
                capacity_bytes: self.capacity(),
            });
        }
        let order = self.order_for(size_bytes);
        let units = self.units_for(size_bytes);
        let candidates = self.nonempty_orders >> order;
        let offset_units = if candidates != 0 {
            let block_order = order + candidates.trailing_zeros();
            let block_index = self.free[block_order as usize]
                .first()
                .expect("nonempty_orders says this order has a free block");
            self.take_aligned(block_order, block_index, units)
        } else {
            match self.find_straddling_run(order, units) {
                Some(start_units) => {
                    self.carve(start_units, start_units + units);
                    start_units
                }
                None => {
                    return Err(AllocError::OutOfSpace {
                        requested_bytes: size_bytes,
                        needed_block_bytes: 1u64 << (order + self.min_block_shift),
                        largest_free_bytes: self.largest_free_bytes(),
                        free_bytes: self.free_bytes(),
                    })
                }
            }
        };

        self.allocated_units += units;
        self.requested_bytes += size_bytes;
        self.allocation_count += 1;
        Ok(Allocation {
            offset_bytes: offset_units << self.min_block_shift,
            requested_bytes: size_bytes,
            units,
            allocator_id: self.id,
        })
    }

    /// Takes the free block `(block_order, block_index)`, keeps its first `units` and gives the tail
    /// back as buddy blocks. Returns the start, in units.
    fn take_aligned(&mut self, mut block_order: u32, block_index: usize, units: u64) -> u64 {
        self.remove_free(block_order, block_index);
        let offset_units = (block_index as u64) << block_order;
        // Split: every upper half not needed goes back as a free block; a lower half that is
        // needed whole stays allocated and the walk continues in the upper half.
        let mut start = offset_units;
        let mut remaining = units;
        while remaining < (1u64 << block_order) {
            block_order -= 1;
            let half = 1u64 << block_order;
            if remaining <= half {
                self.insert_free(block_order, ((start + half) >> block_order) as usize);
            } else {
                start += half;
                remaining -= half;
            }
        }
        offset_units
    }

    /// When no block of `order` is free (exact fit only): a run of `units` free units made of a
    /// free block of `order - 1` and the free units right after or right before it, which need not
    /// be its buddy. At most [`STRADDLE_CANDIDATES`] blocks are examined, lowest address first, each
    /// in O(log² (capacity / min_block)).
    fn find_straddling_run(&self, order: u32, units: u64) -> Option<u64> {
        if self.rounding != Rounding::Exact || order == 0 || units == 1u64 << order {
            return None;
        }
        let half_order = order - 1;
        let half = 1u64 << half_order;
        let rest = units - half;
        let capacity_units = self.capacity_units;
        let bitmap = &self.free[half_order as usize];
        let mut from = 0usize;
        for _ in 0..STRADDLE_CANDIDATES {
            let index = bitmap.next_from(from)?;
            from = index + 1;
            let start = (index as u64) << half_order;
            if start + half + rest <= capacity_units
                && self.range_is_free(start + half, start + half + rest)
            {
                return Some(start);
            }
            if start >= rest && self.range_is_free(start - rest, start) {
                return Some(start - rest);
            }
        }
        None
    }

    /// The free block `(order, index)` that contains the aligned block of `order` at `start_units`.
    fn covering_free_block(&self, order: u32, start_units: u64) -> Option<(u32, usize)> {
        (order..=self.max_order)
            .map(|o| (o, (start_units >> o) as usize))
            .find(|&(o, index)| self.free[o as usize].contains(index))
    }

    /// Whether every unit of `[start, end)` is free.
    fn range_is_free(&self, start: u64, end: u64) -> bool {
        let mut free = true;
        for_each_piece(start, end, self.max_order, |piece_start, order| {
            free = free && self.covering_free_block(order, piece_start).is_some();
        });
        free
    }

    /// Marks the free units `[start, end)` allocated: every free block that covers a piece of the
    /// range is split, and the parts outside the range go back to the free lists.
    fn carve(&mut self, start: u64, end: u64) {
        let max_order = self.max_order;
        for_each_piece(start, end, max_order, |piece_start, piece_order| {
            self.carve_piece(piece_start, piece_order)
        });
    }

    fn carve_piece(&mut self, piece_start: u64, piece_order: u32) {
        let (mut order, index) = self
            .covering_free_block(piece_order, piece_start)
            .expect("carve is only called on free ranges");
        self.remove_free(order, index);
        let mut block_start = (index as u64) << order;
        while order > piece_order {
            order -= 1;
            let half = 1u64 << order;
            if piece_start >= block_start + half {
                self.insert_free(order, (block_start >> order) as usize);
                block_start += half;
            } else {
                self.insert_free(order, ((block_start + half) >> order) as usize);
            }
        }
    }

    /// Gives an allocation back and coalesces it with its free buddies. Costs
    /// O(log(capacity / min_block)).
    ///
    /// # Panics
    ///
    /// When `allocation` was made by another allocator: that is a bug in the caller.
    pub fn free(&mut self, allocation: Allocation) {
        assert_eq!(
            allocation.allocator_id, self.id,
            "wgpu_pool::buddy: an allocation made by allocator #{} was freed into allocator #{}",
            allocation.allocator_id, self.id
        );
        let offset_units = allocation.offset_bytes >> self.min_block_shift;
        let units = allocation.units;
        // The range is a run of aligned buddy blocks. Walk it from its end: each block is
        // coalesced with its free buddies, and the merged block is carried (not inserted) while it
        // is the buddy of the next block to the left, so an untouched tail and the allocation's own
        // pieces merge without a round trip through the free lists. Coalescing is confluent, so the
        // result is the same as freeing the blocks one by one.
        let mut carry: Option<(u32, u64)> = None;
        let mut position = offset_units + units;
        while position > offset_units {
            let order = position
                .trailing_zeros()
                .min(63 - (position - offset_units).leading_zeros())
                .min(self.max_order);
            let start = position - (1u64 << order);
            position = start;
            let block = match carry {
                Some((carry_order, carry_start))
                    if carry_order == order
                        && carry_start == start + (1u64 << order)
                        && (start >> order) & 1 == 0 =>
                {
                    (order + 1, start)
                }
                Some((carry_order, carry_start)) => {
                    self.insert_free(carry_order, (carry_start >> carry_order) as usize);
                    (order, start)
                }
                None => (order, start),
            };
            carry = Some(self.coalesce(block.0, block.1));
        }
        if let Some((order, start)) = carry {
            self.insert_free(order, (start >> order) as usize);
        }
        self.allocated_units -= units;
        self.requested_bytes -= allocation.requested_bytes;
        self.allocation_count -= 1;
    }

    /// Merges the free block `(order, start_units)` with its free buddies, removing them from the
    /// free lists; returns the merged block, which the caller inserts.
    #[inline]
    fn coalesce(&mut self, mut order: u32, mut start_units: u64) -> (u32, u64) {
        while order < self.max_order {
            let buddy_index = ((start_units >> order) ^ 1) as usize;
            if !self.free[order as usize].contains(buddy_index) {
                break;
            }
            self.remove_free(order, buddy_index);
            start_units &= !(1u64 << order);
            order += 1;
        }
        (order, start_units)
    }

    #[inline]
    fn insert_free(&mut self, order: u32, index: usize) {
        self.free[order as usize].insert(index);
        self.free_counts[order as usize] += 1;
        self.nonempty_orders |= 1u64 << order;
    }

    #[inline]
    fn remove_free(&mut self, order: u32, index: usize) {
        self.free[order as usize].remove(index);
        self.free_counts[order as usize] -= 1;
        if self.free_counts[order as usize] == 0 {
            self.nonempty_orders &= !(1u64 << order);
        }
    }

    /// All free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.capacity() - (self.allocated_units << self.min_block_shift)
    }

    /// The largest free block, in bytes (0 when nothing is free). O(1).
    pub fn largest_free_bytes(&self) -> u64 {
        if self.nonempty_orders == 0 {
            0
        } else {
            1u64 << (63 - self.nonempty_orders.leading_zeros() + self.min_block_shift)
        }
    }

    /// The counters, as plain data. O(1).
    pub fn stats(&self) -> Stats {
        Stats {
            capacity_bytes: self.capacity(),
            allocated_bytes: self.allocated_units << self.min_block_shift,
            requested_bytes: self.requested_bytes,
            free_bytes: self.free_bytes(),
            largest_free_bytes: self.largest_free_bytes(),
            min_block_bytes: self.min_block(),
            free_blocks_per_order: self.free_counts,
            allocation_count: self.allocation_count,
        }
    }

    /// Every free block as `(offset_bytes, size_bytes)`, in address order. Scans the bitmaps: for
    /// reports and snapshots, not for hot paths.
    pub fn free_blocks(&self) -> Vec<(u64, u64)> {
        let mut blocks: Vec<(u64, u64)> = (0..=self.max_order)
            .flat_map(|order| {
                self.free[order as usize].iter().map(move |index| {
                    (
                        ((index as u64) << order) << self.min_block_shift,
                        1u64 << (order + self.min_block_shift),
                    )
                })
            })
            .collect();
        blocks.sort_unstable();
        blocks
    }

    /// Heap bytes this allocator uses for its own bookkeeping.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.free.iter().map(Bitmap::heap_bytes).sum()
    }

    /// Checks the structure (for tests): no free block has a free buddy of the same order, free
    /// blocks do not overlap, counts match the bitmaps, and free bytes match the counters.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut total_free_units = 0u64;
        for order in 0..=self.max_order {
            let indices: Vec<usize> = self.free[order as usize].iter().collect();
            if indices.len() as u64 != self.free_counts[order as usize] {
                return Err(format!(
                    "order {order}: count {} but {} bits set",
                    self.free_counts[order as usize],
                    indices.len()
                ));
            }
            if (self.nonempty_orders >> order & 1 == 1) == indices.is_empty() {
                return Err(format!("order {order}: nonempty mask disagrees"));
            }
            if self.free[order as usize].next_from(0) != indices.first().copied() {
                return Err(format!(
                    "order {order}: next_from(0) disagrees with the leaves"
                ));
            }
            for &index in &indices {
                if order < self.max_order && self.free[order as usize].contains(index ^ 1) {
                    return Err(format!(
                        "order {order}: blocks {index} and {} are free buddies",
                        index ^ 1
                    ));
                }
                total_free_units += 1u64 << order;
            }
        }
        let blocks = self.free_blocks();
        for pair in blocks.windows(2) {
            if pair[0].0 + pair[0].1 > pair[1].0 {
                return Err(format!(
                    "free blocks {:?} and {:?} overlap",
                    pair[0], pair[1]
                ));
            }
        }
        if total_free_units + self.allocated_units != self.capacity_units {
            return Err(format!(
                "free units {total_free_units} + allocated units {} != capacity units {}",
                self.allocated_units, self.capacity_units
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
