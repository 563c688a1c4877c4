//! The allocator: its state, how it is built, what it reports of its configuration, and where a
//! request would fit.

use std::sync::atomic::{AtomicU32, Ordering};

use super::bins::{length_bin, Links, Region, BINS, GROUP_BINS, LENGTH_BITS, NIL};
use super::config::{ConfigError, Rounding, MAX_ORDER_LIMIT};
use super::run::{Counts, Delta, Pieces, Tally};

static NEXT_ALLOCATOR_ID: AtomicU32 = AtomicU32::new(1);

/// A buddy allocator of the offsets `[0, capacity)`. The capacity is any multiple of `min_block`:
/// it starts as the blocks of its binary digits (40 units are a 32-unit root at 0 and an 8-unit root
/// at 32), which never merge with each other, though a request may straddle them.
#[derive(Debug)]
pub struct BuddyAllocator {
    pub(super) id: u32,
    pub(super) min_block_shift: u32,
    /// The order of the largest root block: `floor(log2(capacity_units))`.
    pub(super) max_order: u32,
    pub(super) capacity_units: u64,
    pub(super) rounding: Rounding,
    /// The arena of regions, indexed by `u32`; `regions[0]` always starts at offset 0.
    pub(super) regions: Vec<Region>,
    /// The first spare entry of `regions`, or [`NIL`].
    pub(super) spare: u32,
    /// The free runs are listed by bin: by length under exact fit
    /// ([`length_bin`](super::bins::length_bin)), by the order of their largest block under
    /// power-of-two rounding (bin `order << LENGTH_BITS`).
    /// `heads[b]`: the free run listed first in bin `b` (in the order the runs were listed).
    pub(super) heads: [u32; BINS],
    /// `tails[b]`: the free run listed last in bin `b`.
    pub(super) tails: [u32; BINS],
    /// Bit `g` is set when a bin of group `g` (bins `g << LENGTH_BITS ..`) lists a run.
    pub(super) groups: u64,
    /// Bit `m` of `bins[g]` is set when bin `g << LENGTH_BITS | m` lists a run.
    pub(super) bins: [u64; 64],
    /// `free_counts[k]`: the free blocks of order `k`, over all free runs.
    pub(super) free_counts: Counts,
    /// Units held by live allocations.
    pub(super) allocated_units: u64,
    /// Bytes asked for by live allocations.
    pub(super) requested_bytes: u64,
    /// Live allocations.
    pub(super) allocation_count: u64,
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
        let mut allocator = Self {
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            min_block_shift: min_block_bytes.trailing_zeros(),
            max_order,
            capacity_units,
            rounding,
            regions: vec![Region {
                start: 0,
                end: capacity_units,
                prev: NIL,
                next: NIL,
                list_prev: NIL,
                list_next: NIL,
            }],
            spare: NIL,
            heads: [NIL; BINS],
            tails: [NIL; BINS],
            groups: 0,
            bins: [0; 64],
            free_counts: Counts::new(),
            allocated_units: 0,
            requested_bytes: 0,
            allocation_count: 0,
        };
        let mut roots = Tally::default();
        roots.add(Pieces::of(0, capacity_units));
        allocator
            .free_counts
            .add(&Delta::between(&roots, &Tally::default()));
        match rounding {
            Rounding::Exact => allocator.links::<true>().list(0),
            Rounding::PowerOfTwo => allocator.links::<false>().list(0),
        }
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

    /// How tightly an allocation of `size_bytes` would fit now, or `None` when no free run is
    /// certain to hold it (or the size is 0 or larger than the capacity). O(1). A lower order is a
    /// tighter fit; the pool uses this to choose among segments. Under exact fit it is the order
    /// `k` such that the free run the allocation would be cut from holds `2^k` to `2^(k+1) - 1`
    /// units; under power-of-two rounding, the order of the free block it would be cut from. A
    /// request may still succeed where this is `None`: a run of the request's own length bin may
    /// be long enough.
    pub fn fit_order(&self, size_bytes: u64) -> Option<u32> {
        if size_bytes == 0
            || size_bytes > self.capacity()
            || self.units_for(size_bytes) > self.capacity_units
        {
            return None;
        }
        let units = self.units_for(size_bytes);
        match self.rounding {
            Rounding::Exact => {
                let bin = self.first_bin_from(length_bin(units - 1) + 1)?;
                let region = &self.regions[self.heads[bin as usize] as usize];
                Some(63 - (region.end - region.start).leading_zeros())
            }
            Rounding::PowerOfTwo => {
                let order = units.trailing_zeros();
                let bin = self.first_bin_from(order << LENGTH_BITS)?;
                let pieces = self.regions[self.heads[bin as usize] as usize].pieces();
                Some(order + (pieces.orders() >> order).trailing_zeros())
            }
        }
    }

    /// The bytes a request of `size_bytes` holds once placed (rounded to `min_block`, or to a power
    /// of two under [`Rounding::PowerOfTwo`]).
    /// `u64::MAX` when the rounding passes it.
    pub fn rounded_size(&self, size_bytes: u64) -> u64 {
        self.units_for(size_bytes).saturating_mul(self.min_block())
    }

    /// Blocks a request holds; `u64::MAX` when power-of-two rounding passes it (the request is
    /// then larger than any capacity).
    pub(super) fn units_for(&self, size_bytes: u64) -> u64 {
        let units = size_bytes.div_ceil(self.min_block()).max(1);
        match self.rounding {
            Rounding::Exact => units,
            Rounding::PowerOfTwo => units.checked_next_power_of_two().unwrap_or(u64::MAX),
        }
    }

    pub(super) fn order_for(&self, size_bytes: u64) -> u32 {
        let units = size_bytes.div_ceil(self.min_block()).max(1);
        units.next_power_of_two().trailing_zeros()
    }

    /// The first bin at or after `bin` that lists a free run. O(1): two bit scans.
    #[inline(always)]
    pub(super) fn first_bin_from(&self, bin: u32) -> Option<u32> {
        let group = bin >> LENGTH_BITS;
        let here = self.bins[group as usize % 64] >> (bin & (GROUP_BINS - 1));
        if here != 0 {
            return Some(bin + here.trailing_zeros());
        }
        let above = self.groups >> group >> 1;
        if above == 0 {
            return None;
        }
        let group = group + 1 + above.trailing_zeros();
        Some(group << LENGTH_BITS | self.bins[group as usize % 64].trailing_zeros())
    }

    /// The address and bin links, borrowed apart from the rest of the allocator, with runs
    /// listed by length (`BY_LENGTH`, exact fit) or by their largest block (power of two).
    #[inline(always)]
    pub(super) fn links<const BY_LENGTH: bool>(&mut self) -> Links<'_, BY_LENGTH> {
        debug_assert_eq!(BY_LENGTH, self.rounding == Rounding::Exact);
        Links {
            regions: &mut self.regions,
            heads: &mut self.heads,
            tails: &mut self.tails,
            groups: &mut self.groups,
            bins: &mut self.bins,
            spare: &mut self.spare,
        }
    }
}
