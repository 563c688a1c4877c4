//! The allocator's counters as plain data, and the reports read from its regions.

use super::allocator::BuddyAllocator;
use super::bins::Region;
use super::config::MAX_ORDER_LIMIT;
use super::run::for_each_piece;

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

impl BuddyAllocator {
    /// All free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.capacity() - (self.allocated_units << self.min_block_shift)
    }

    /// The largest free block, in bytes (0 when nothing is free). O(1).
    pub fn largest_free_bytes(&self) -> u64 {
        let orders = self.free_counts.orders();
        if orders == 0 {
            0
        } else {
            1u64 << (63 - orders.leading_zeros() + self.min_block_shift)
        }
    }

    /// The counters, as plain data. O(1).
    pub fn stats(&self) -> Stats {
        let free_blocks_per_order = std::array::from_fn(|order| self.free_counts.get(order as u32));
        Stats {
            capacity_bytes: self.capacity(),
            allocated_bytes: self.allocated_units << self.min_block_shift,
            requested_bytes: self.requested_bytes,
            free_bytes: self.free_bytes(),
            largest_free_bytes: self.largest_free_bytes(),
            min_block_bytes: self.min_block(),
            free_blocks_per_order,
            allocation_count: self.allocation_count,
        }
    }

    /// The regions in address order, from offset 0.
    fn regions_in_order(&self) -> impl Iterator<Item = &Region> + '_ {
        let mut index = 0u32;
        std::iter::from_fn(move || {
            let region = self.regions.get(index as usize)?;
            index = region.next;
            Some(region)
        })
        .take(self.regions.len())
    }

    /// Every free block as `(offset_bytes, size_bytes)`, in address order. Walks every region: for
    /// reports and snapshots, not for hot paths.
    pub fn free_blocks(&self) -> Vec<(u64, u64)> {
        let mut blocks = Vec::new();
        for region in self.regions_in_order().filter(|r| r.is_free()) {
            for_each_piece(region.start, region.end, self.max_order, |start, order| {
                blocks.push((
                    start << self.min_block_shift,
                    1u64 << (order + self.min_block_shift),
                ))
            });
        }
        blocks
    }

    /// Heap bytes this allocator uses for its own bookkeeping.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.regions.capacity() * std::mem::size_of::<Region>()
    }
}
