//! What a request gives: the handle of an allocation, or why there is none.

use std::num::NonZeroU64;

/// Why a request could not be served. Every variant carries the figures needed to explain it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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

/// A range handed out by a [`BuddyAllocator`](super::BuddyAllocator). Not `Clone`: give it back with
/// [`BuddyAllocator::free`](super::BuddyAllocator::free), which consumes it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an allocation that is dropped instead of freed stays allocated"]
pub struct Allocation {
    pub(super) offset_bytes: u64,
    /// Never zero, which gives `Option<Allocation>` a niche: it is as small as the handle.
    pub(super) requested_bytes: NonZeroU64,
    pub(super) units: u64,
    /// The id of the allocator that made it (high 32 bits) and the index of its region there (low
    /// 32 bits), in one word so that the handle is written and read back in whole words.
    pub(super) owner: u64,
}

impl Allocation {
    /// Start of the range, in bytes from the start of the segment; a multiple of `min_block`.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size that was asked for, in bytes.
    pub fn requested_size(&self) -> u64 {
        self.requested_bytes.get()
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
