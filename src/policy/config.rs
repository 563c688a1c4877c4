//! The policy's settings: the mode, the size classes' thresholds and rules, the cache and the
//! budget, derived from a device's limits.

use crate::buddy::{BuddyAllocator, Rounding};

use super::error::PolicyError;

/// The default cap on segment size. Before dedicated segments were cached, replaying the traces in
/// `tests/data/traces` (H200 limits) gave peak reserved / peak requested of 1.39 and 1.42 with 1 GiB
/// segments, 1.29 and 1.42 with 256 MiB, and 1.11 and 1.38 with 64 MiB: smaller segments leave
/// less memory stranded in partly used ones.
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// How the policy serves requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PolicyMode {
    /// The pool: segments carved by buddy allocators, grown, cached and reused (the default).
    #[default]
    Pooled,
    /// The naive baseline: every request a segment of its own, of the request rounded up to
    /// `min_block_bytes`, given back as soon as it is freed; nothing is reused. Only
    /// `min_block_bytes`, `max_allocation_bytes` and `budget_bytes` apply.
    Naive,
}

/// The policy's settings. [`PolicyConfig::for_limits`] derives them from a device's limits;
/// [`PolicyConfig::naive`] is the naive baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Pooled (the default) or naive.
    pub mode: PolicyMode,
    /// Smallest block and alignment of every offset, in bytes; a power of two.
    pub min_block_bytes: u64,
    /// Smallest segment created, in bytes; a power of two multiple of `min_block_bytes`.
    pub min_segment_bytes: u64,
    /// Largest packed or mid-sized segment created, in bytes; a power of two multiple of
    /// `min_block_bytes`. Larger requests are large (see `large_above_bytes`).
    pub max_segment_bytes: u64,
    /// New segments are at least `reserved / growth_divisor` (0 turns this off).
    pub growth_divisor: u64,
    /// Requests above this (or above `max_segment_bytes`, whichever is less) are *large*: they
    /// share large segments (see `large_fill_eighths`).
    pub large_above_bytes: u64,
    /// Largest request accepted, in bytes (large requests included): the device's largest
    /// buffer.
    pub max_allocation_bytes: u64,
    /// How requests are rounded inside segments.
    pub rounding: Rounding,
    /// Most bytes that may be reserved at once, or `None` for no budget.
    pub budget_bytes: Option<u64>,
    /// At least 1 (32 by default): empty segments stay cached as long as the pool keeps within a
    /// headroom over its demand: before growing, empty segments are given back (least recently
    /// used first) only while the reserved bytes plus the new segment would pass
    /// `demand + demand / cache_headroom_divisor`, where demand is the most bytes ever allocated
    /// at once, the request at hand included.
    pub cache_headroom_divisor: u64,
    /// From 1 to 8 (6 by default): requests above `large_above_bytes` share *large
    /// segments*, each an exact-fit list of address-ordered free ranges that coalesce on free (a
    /// new one is of the request's size). A request takes the tightest free range of any large
    /// segment that leaves the segment at least `large_fill_eighths / 8` full (and a remainder
    /// allowed by `large_remainder_divisor`), cut from the range's start. So the space one large
    /// request frees serves later requests of other sizes, while a request much smaller than an
    /// empty or mostly free segment does not pin it (that segment drains, and is given back or
    /// reused whole).
    pub large_fill_eighths: u64,
    /// With shared large segments: a free range serves a large request only when what it leaves
    /// is either more than `large_above_bytes` (another large request can use it) or at most
    /// `1 / large_remainder_divisor` of the request (4 by default; 0: any remainder). A remainder
    /// in between could serve no large request and would stay as waste beside it.
    pub large_remainder_divisor: u64,
    /// When not 0 (1 MiB by default: `max_segment_bytes / 64`), requests above this and up to
    /// `large_above_bytes` (*mid-sized*) are placed in segments of their own class, each an
    /// exact-fit list of free ranges like a large segment, best fit over all of them, sized as
    /// packed segments are; when none has room, free space in the packed segments serves before
    /// the pool grows. 0: mid-sized requests are packed by the buddy allocators like small ones.
    pub mid_above_bytes: u64,
}

impl PolicyConfig {
    /// The default policy for a device with these limits: `min_block` is at least 256 bytes and at
    /// least the storage offset alignment, segments are at most the largest power of two not above
    /// `max_buffer_size` and at most [`DEFAULT_MAX_SEGMENT_BYTES`], and the first segment is 2 MiB.
    /// Requests above a quarter of the largest segment (16 MiB) share large segments (6/8 full,
    /// remainders within 1/4), requests above 1/64 of it (1 MiB) segments of the mid-sized class,
    /// the rest buddy-packed segments; empty segments stay cached within 1/32 over the pool's
    /// demand.
    pub fn for_limits(min_storage_buffer_offset_alignment: u64, max_buffer_size: u64) -> Self {
        let min_block_bytes = min_storage_buffer_offset_alignment
            .max(256)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63);
        let largest_power_of_two = if max_buffer_size == 0 {
            0
        } else {
            1u64 << (63 - max_buffer_size.leading_zeros())
        };
        // At least one block, even where the alignment passes the default largest segment.
        let max_segment_bytes = largest_power_of_two
            .min(DEFAULT_MAX_SEGMENT_BYTES)
            .max(min_block_bytes);
        Self {
            mode: PolicyMode::Pooled,
            min_block_bytes,
            min_segment_bytes: (2u64 << 20).clamp(min_block_bytes, max_segment_bytes),
            max_segment_bytes,
            growth_divisor: 8,
            large_above_bytes: (max_segment_bytes / 4).max(min_block_bytes),
            max_allocation_bytes: max_buffer_size,
            rounding: Rounding::Exact,
            budget_bytes: None,
            cache_headroom_divisor: 32,
            large_fill_eighths: 6,
            large_remainder_divisor: 4,
            mid_above_bytes: (max_segment_bytes / 64).max(min_block_bytes),
        }
    }

    /// The naive baseline ([`PolicyMode::Naive`]) for a device whose buffers are sized in
    /// multiples of `alignment_bytes` (a power of two: `wgpu::COPY_BUFFER_ALIGNMENT`, 4 bytes, on a
    /// GPU) and at most `max_buffer_size` bytes: every request gets a segment of its own, of the
    /// request rounded up to `alignment_bytes`, given back as soon as it is freed.
    pub fn naive(alignment_bytes: u64, max_buffer_size: u64) -> Self {
        Self {
            mode: PolicyMode::Naive,
            min_block_bytes: alignment_bytes,
            min_segment_bytes: alignment_bytes,
            max_segment_bytes: alignment_bytes,
            growth_divisor: 0,
            large_above_bytes: 0,
            max_allocation_bytes: max_buffer_size,
            rounding: Rounding::Exact,
            budget_bytes: None,
            cache_headroom_divisor: 0,
            large_fill_eighths: 0,
            large_remainder_divisor: 0,
            mid_above_bytes: 0,
        }
    }

    /// True for the naive baseline.
    pub fn is_naive(&self) -> bool {
        self.mode == PolicyMode::Naive
    }

    /// Checks the block and segment sizes (powers of two, segments whole blocks, the smallest
    /// segment no larger than the largest), the fill rule (from 1/8 to 8/8) and the cache's
    /// headroom (at least 1); `PoolCore::new` calls it. Other fields are taken as capped where their documentation says so.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.is_naive() {
            // Segments are sized by requests; only the block size must be valid.
            BuddyAllocator::with_capacity(
                self.min_block_bytes,
                self.min_block_bytes,
                self.rounding,
            )?;
            return Ok(());
        }
        for (name, size) in [
            ("min_segment_bytes", self.min_segment_bytes),
            ("max_segment_bytes", self.max_segment_bytes),
        ] {
            BuddyAllocator::with_capacity(self.min_block_bytes, size, self.rounding)?;
            if !size.is_power_of_two() {
                return Err(PolicyError::Setting(format!(
                    "{name} must be a power of two, got {size} bytes"
                )));
            }
        }
        if self.min_segment_bytes > self.max_segment_bytes {
            return Err(PolicyError::Setting(format!(
                "min_segment_bytes ({}) is above max_segment_bytes ({})",
                self.min_segment_bytes, self.max_segment_bytes
            )));
        }
        if !(1..=8).contains(&self.large_fill_eighths) {
            return Err(PolicyError::Setting(format!(
                "large_fill_eighths is from 1 to 8, got {}",
                self.large_fill_eighths
            )));
        }
        if self.cache_headroom_divisor == 0 {
            return Err(PolicyError::Setting(
                "cache_headroom_divisor is at least 1, got 0".into(),
            ));
        }
        Ok(())
    }
}
