//! How an allocator is built: the largest order, the rounding of requests and why a
//! configuration is refused.

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

/// Why a [`BuddyAllocator`](super::BuddyAllocator) could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
