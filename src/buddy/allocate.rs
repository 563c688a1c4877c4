//! Allocating and freeing: placing a request in a free run, splitting the run, and merging a
//! freed range with the free runs beside it.

use std::num::NonZeroU64;

use super::allocation::{AllocError, Allocation};
use super::allocator::BuddyAllocator;
use super::bins::{length_bin, Region, BINS, HELD, LENGTH_BITS, NIL};
use super::config::Rounding;
use super::run::{Delta, Pieces};

/// How many free runs of a request's own length bin a placement examines, when no run of a
/// larger bin is free, before it gives up (exact fit only).
pub const STRADDLE_CANDIDATES: usize = 32;

impl BuddyAllocator {
    /// Places a request of `size_bytes` (see the module documentation): under exact fit at the
    /// start of the free run listed first in the smallest length bin whose runs all hold it, under
    /// power-of-two rounding at the start of the smallest sufficient block of the free run listed
    /// first among those whose largest block fits most tightly. Costs O(1), plus at most
    /// [`STRADDLE_CANDIDATES`] runs examined when no such run is free.
    #[inline]
    pub fn allocate(&mut self, size_bytes: u64) -> Result<Allocation, AllocError> {
        // This part is inlined where it is called, so that the handle is built in registers there
        // rather than copied out of a returned value; the rest is in functions that are not.
        let (offset_bytes, owner, units) = match self.place(size_bytes) {
            Some(placed) => placed,
            None => {
                let allocation = self.allocate_slowly(size_bytes)?;
                (allocation.offset_bytes, allocation.owner, allocation.units)
            }
        };
        // Only the three words of the placement come out of the slow path, so that the handle is
        // put together here from registers on every path. (A request of 0 bytes failed above.)
        Ok(Allocation {
            offset_bytes,
            requested_bytes: NonZeroU64::new(size_bytes).unwrap_or(NonZeroU64::MIN),
            units,
            owner,
        })
    }

    /// The common case of [`Self::allocate`]: `(offset_bytes, owner, units)`, or `None` when the
    /// size is 0 or above the capacity, or no run certain to hold the request is free.
    #[inline(always)]
    fn place(&mut self, size_bytes: u64) -> Option<(u64, u64, u64)> {
        if size_bytes.wrapping_sub(1) >= self.capacity() {
            return None;
        }
        let whole_units = (size_bytes >> self.min_block_shift)
            + u64::from(size_bytes & (self.min_block() - 1) != 0);
        match self.rounding {
            Rounding::Exact => {
                // The first bin past the one of `whole_units - 1`: every run there is long enough.
                let bin = self.first_bin_from(length_bin(whole_units - 1) + 1)?;
                let run = self.heads[bin as usize % BINS];
                let (offset_bytes, owner) = self.take_run(run, bin, whole_units, size_bytes);
                Some((offset_bytes, owner, whole_units))
            }
            Rounding::PowerOfTwo => {
                // The order of the smallest block that holds the request.
                let order = 64 - (whole_units - 1).leading_zeros();
                // (A rounded size above the capacity has an order above every run's largest block.)
                let bin = self.first_bin_from(order << LENGTH_BITS)?;
                let units = 1u64 << order;
                let (offset_bytes, owner) =
                    self.take_aligned(bin >> LENGTH_BITS, order, units, size_bytes);
                Some((offset_bytes, owner, units))
            }
        }
    }

    /// [`Self::allocate`] when the size is 0 or above the capacity, or no run certain to hold the
    /// request is free: a run of the request's own length bin that is long enough, or an error.
    #[cold]
    #[inline(never)]
    fn allocate_slowly(&mut self, size_bytes: u64) -> Result<Allocation, AllocError> {
        let requested_bytes = NonZeroU64::new(size_bytes).ok_or(AllocError::ZeroSize)?;
        if size_bytes > self.capacity() || self.units_for(size_bytes) > self.capacity_units {
            return Err(AllocError::TooLarge {
                requested_bytes: size_bytes,
                capacity_bytes: self.capacity(),
            });
        }
        let order = self.order_for(size_bytes);
        let units = self.units_for(size_bytes);
        if let Some(run) = self.find_short_run(units) {
            let (offset_bytes, owner) = self.take_run(run, length_bin(units), units, size_bytes);
            return Ok(Allocation {
                offset_bytes,
                requested_bytes,
                units,
                owner,
            });
        }
        Err(AllocError::OutOfSpace {
            requested_bytes: size_bytes,
            needed_block_bytes: 1u64 << (order + self.min_block_shift),
            largest_free_bytes: self.largest_free_bytes(),
            free_bytes: self.free_bytes(),
        })
    }

    /// Counts a new allocation of `units` at `offset_units` in `region`; returns the handle's
    /// offset in bytes and owner word.
    #[inline(always)]
    fn record(
        &mut self,
        size_bytes: u64,
        units: u64,
        region: u32,
        offset_units: u64,
    ) -> (u64, u64) {
        self.allocated_units += units;
        self.requested_bytes += size_bytes;
        self.allocation_count += 1;
        (
            offset_units << self.min_block_shift,
            u64::from(self.id) << 32 | u64::from(region),
        )
    }

    /// Takes the smallest block of at least `order` from the first free run of class `class`
    /// (power-of-two rounding), keeps its first `units` and leaves the tail free. Returns the
    /// handle's offset and owner word.
    #[inline(never)]
    fn take_aligned(&mut self, class: u32, order: u32, units: u64, size_bytes: u64) -> (u64, u64) {
        let run = self.heads[(class << LENGTH_BITS) as usize % BINS];
        let found = self.regions[run as usize];
        let pieces = found.pieces();
        let block_order = order + (pieces.orders() >> order).trailing_zeros();
        let start = pieces.block_start(block_order);
        let region =
            self.split_run::<false>(run, found, class << LENGTH_BITS, start, start + units);
        // The blocks before and after the one taken stay as they are (a run's decomposition is
        // greedy from its start); the block leaves, and its tail comes back as the blocks of the
        // binary digits of its length.
        self.free_counts
            .add(&Delta::split(block_order, (1u64 << block_order) - units));
        self.record(size_bytes, units, region, start)
    }

    /// Takes `units` from the free run `run`, which is at least that long, and leaves the rest
    /// free (exact fit): from the start of the run when the request is at least the mean size of
    /// the live allocations (or nothing is live), else from its end. Returns the handle's offset
    /// and owner word.
    ///
    /// Not inlined: [`Self::allocate`] stays small enough to be inlined where it is called, so that
    /// the handle is built in registers there instead of being copied out of a returned value.
    #[inline(never)]
    fn take_run(&mut self, run: u32, bin: u32, units: u64, size_bytes: u64) -> (u64, u64) {
        let found = self.regions[run as usize];
        debug_assert!(units <= found.end - found.start);
        // `units < allocated_units / allocation_count`, without the division (and false when
        // nothing is allocated).
        // (A product that saturates is above any count of units.)
        let small = units.saturating_mul(self.allocation_count) < self.allocated_units;
        let start = if small {
            found.end - units
        } else {
            found.start
        };
        let end = start + units;
        // The blocks of what is left of the run, on the side not taken (none when the request
        // takes it whole), replace the run's: a fixed sequence of word operations, with no branch
        // on where the cut falls.
        let (left_start, left_end) = if small {
            (found.start, start)
        } else {
            (end, found.end)
        };
        let delta = Delta::swap(Pieces::of(left_start, left_end), found.pieces());
        self.free_counts.add(&delta);
        let region = self.split_run::<true>(run, found, bin, start, end);
        self.record(size_bytes, units, region, start)
    }

    /// When no run certain to hold `units` is free (exact fit): a free run of the length bin of
    /// `units` that is at least that long. At most [`STRADDLE_CANDIDATES`] runs are examined.
    fn find_short_run(&self, units: u64) -> Option<u32> {
        if self.rounding != Rounding::Exact {
            return None;
        }
        let mut run = self.heads[length_bin(units) as usize % BINS];
        let mut budget = STRADDLE_CANDIDATES;
        while run != NIL && budget > 0 {
            budget -= 1;
            let region = &self.regions[run as usize];
            if region.end - region.start >= units {
                return Some(run);
            }
            run = region.list_next;
        }
        None
    }

    /// Splits the free run `run` (read as `found`, listed in bin `bin`) into the held region
    /// `[start, end)` and the free runs before and after it, if any. Returns the held region. The
    /// free counts are the caller's.
    #[inline(always)]
    fn split_run<const BY_LENGTH: bool>(
        &mut self,
        run: u32,
        found: Region,
        bin: u32,
        start: u64,
        end: u64,
    ) -> u32 {
        let Region {
            start: run_start,
            end: run_end,
            next: run_next,
            list_prev,
            list_next,
            ..
        } = found;
        debug_assert!(run_start <= start && start < end && end <= run_end);
        // The new regions first (the arena may grow), each written once and whole.
        let has_after = end < run_end;
        let has_before = run_start < start;
        let after = if has_after {
            self.new_region(Region {
                start: end,
                end: run_end,
                prev: NIL,
                next: run_next,
                list_prev: NIL,
                list_next: NIL,
            })
        } else {
            run_next
        };
        let held = if has_before {
            self.new_region(Region {
                start,
                end,
                prev: run,
                next: after,
                list_prev: HELD,
                list_next: NIL,
            })
        } else {
            run
        };
        let mut links = self.links::<BY_LENGTH>();
        if has_after {
            links.unlink_from(bin, list_prev, list_next);
            links.regions[after as usize].prev = held;
            if run_next != NIL {
                links.regions[run_next as usize].prev = after;
            }
            links.list(after);
        } else if run_next != NIL {
            links.regions[run_next as usize].prev = held;
        }
        if has_before {
            let region = &mut links.regions[run as usize];
            region.end = start;
            region.next = held;
            if has_after {
                links.list(run);
            } else {
                links.relist(run, bin, list_prev, list_next);
            }
        } else {
            if !has_after {
                links.unlink_from(bin, list_prev, list_next);
            }
            let region = &mut links.regions[run as usize];
            region.end = end;
            region.next = after;
            region.list_prev = HELD;
        }
        held
    }

    /// A new region of the arena, not yet linked in address order.
    #[inline(always)]
    fn new_region(&mut self, region: Region) -> u32 {
        if self.spare != NIL {
            let index = self.spare;
            let entry = &mut self.regions[index as usize];
            self.spare = entry.next;
            *entry = region;
            index
        } else {
            let index = u32::try_from(self.regions.len())
                .ok()
                .filter(|&i| i < HELD)
                .expect("fewer than 2^32 - 2 regions");
            self.regions.push(region);
            index
        }
    }

    /// Gives an allocation back and merges it with the free runs beside it. Costs O(1).
    ///
    /// # Panics
    ///
    /// When `allocation` was made by another allocator: that is a bug in the caller.
    #[inline]
    pub fn free(&mut self, allocation: Allocation) {
        assert_eq!(
            (allocation.owner >> 32) as u32,
            self.id,
            "wgpu_pool::buddy: an allocation made by allocator #{} was freed into allocator #{}",
            allocation.owner >> 32,
            self.id
        );
        debug_assert_eq!(
            self.regions[allocation.owner as u32 as usize].start,
            allocation.offset_bytes >> self.min_block_shift
        );
        self.release(
            allocation.owner as u32,
            allocation.units,
            allocation.requested_bytes.get(),
        );
    }

    /// Frees the held region `index` and merges it with the free runs beside it.
    #[inline(never)]
    fn release(&mut self, index: u32, units: u64, requested_bytes: u64) {
        self.allocated_units -= units;
        self.requested_bytes -= requested_bytes;
        self.allocation_count -= 1;
        // One copy of the merge for each way of listing runs, so that no test of the rounding is
        // left inside it.
        let delta = match self.rounding {
            Rounding::Exact => self.links::<true>().merge(index),
            Rounding::PowerOfTwo => self.links::<false>().merge(index),
        };
        self.free_counts.add(&delta);
    }
}
