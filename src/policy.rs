//! The pool's policy: which segment serves a request, when to grow and by how much, when to give
//! segments back, and the budget. It owns one [`BuddyAllocator`] per segment and asks a
//! [`SegmentStorage`] for the memory behind each segment.
//!
//! Like the allocator core, this module knows nothing of wgpu: the GPU pool plugs in a storage
//! that creates `wgpu::Buffer`s, and the replay plugs in a simulated one, so that both run the very
//! same decisions.
//!
//! # The default policy
//!
//! Requests fall in three classes by size, each with its own kind of segment:
//!
//! - **Packed** (up to `mid_above_bytes`, 1 MiB by default): among the buddy-packed segments,
//!   the one whose smallest sufficient free block has the lowest order (a best fit by block size;
//!   ties go to the oldest segment); within a segment, the buddy core cuts it from the first-listed
//!   free run of the tightest class (see [`crate::buddy`]). When no aligned block is free
//!   anywhere, a run straddling buddy boundaries is tried, then the free ranges of the mid-sized
//!   class, before growing. **Growth**: a new segment of `next_power_of_two(request)`, but at
//!   least `min_segment_bytes` and at least `reserved / growth_divisor` (rounded down to a power of
//!   two), never above `max_segment_bytes`. Small pools grow in small steps; a large pool grows in
//!   steps proportional to its size.
//! - **Mid-sized** (above 1 MiB, up to `dedicated_above_bytes`, 16 MiB by default): segments of
//!   exact-fit free ranges (address-ordered, coalescing on free; `large.rs`), the tightest free
//!   range of any of them, cut from its start; then free space of the packed segments, before
//!   growing. A new one is sized as a packed one but holds at least two requests of the size that
//!   made it (rounded up to a power of two, at most `max_segment_bytes` and half the demand).
//!   Packed in buddy blocks, requests of 1-16 MiB left the packed segments 72% and 55% full at
//!   the peaks of `gpt_train` and `vit_train` (1.4 GiB holding 1.0; 1.8 holding 1.0).
//! - **Large** (above `dedicated_above_bytes`): segments of exact-fit free ranges too, each created
//!   of the request's size, shared by later large requests: a request takes the tightest free range
//!   of any large segment that leaves the segment at least `large_fill_eighths / 8` (6/8) full and
//!   leaves beside it either a remainder another large request could use (above
//!   `dedicated_above_bytes`) or one of at most `1 / large_remainder_divisor` (1/4) of the request.
//!   So the space one large request frees serves requests of other sizes, and a freed range
//!   coalesces with its neighbours; but a small request does not pin a mostly free segment that a
//!   later large request would reuse whole, and a remainder that no large request could use is not
//!   left as waste. When nothing fits, a new segment of the request's size. When the budget or the
//!   device refuses it, any free range that fits serves the request whatever the two rules.
//!   (With `large_fill_eighths` 0, the older rule: a dedicated segment per request, reused once
//!   freed by a later request of at least 7/8 of its size.)
//! - **A cache bounded by demand**: empty segments stay cached while the pool keeps within a
//!   headroom of `1 / cache_headroom_divisor` (1/32 by default) over its demand, the most bytes
//!   ever allocated at once. Before a new segment is created, empty segments (which could not
//!   serve the request) are given back, least recently used first, only while the reserved bytes
//!   with the new segment would pass `demand * (1 + 1/32)`. So the peak reserved is at most
//!   demand plus the headroom, or what the segments holding live allocations force, whichever is
//!   more; below that ceiling nothing is given back, which spares `create_buffer` calls and zero
//!   fills. (With `cache_headroom_divisor` 0, the older rule: empty segments are given back,
//!   largest first, until at most `reserved / keep_empty_divisor` bytes stay empty.)
//! - **Budget and out of memory**: when a new segment would pass the budget, or the storage
//!   refuses it, every empty segment is given back and the request is tried again with a segment
//!   of exactly its rounded size (as PyTorch frees its cache and retries). When the budget would
//!   refuse that too, nothing is given back: the refusal leaves the statistics as they were (but
//!   for the OOM count). When the storage refuses, the empty segments given back while trying stay
//!   given back, and the error says how many bytes that was ([`OutOfMemory::released_bytes`]).
//! - **Compaction**, when the caller asks for it: [`PoolCore::compaction_plan`] moves live
//!   allocations (at most the request's size by default) out of one range of a segment of the
//!   request's class (an aligned block of a packed segment; a range of the request's size of a
//!   mid-sized or large one) into free space of the other segments of that class, so that a
//!   request fits without a new segment; the caller copies the bytes and applies the plan
//!   ([`PoolCore::apply_moves`]). The pool does not compact on its own; the replay's
//!   `pool_compact` does before every growth.
//!
//! # The naive mode
//!
//! [`PolicyConfig::naive`] is the baseline "one buffer per allocation", as a mode of the same
//! policy ([`PolicyMode::Naive`]): every request gets a segment of its own, of the request rounded
//! up to `min_block_bytes` (the copy alignment, 4 bytes on a GPU), given back as soon as it is
//! freed; nothing is reused or cached. The GPU pool, the replay and the reports run it through the
//! same [`PoolCore`] as the pool, so their figures are counted the same way.
//!
//! # The figures that chose it
//!
//! Replaying real PyTorch traces of an H200 (the replay example, H200 limits; the first five in
//! the shared trace folder, the last four captured later and used to validate the choices among
//! variants; MEASUREMENTS.md, 2026-12-02), peak reserved over peak requested, segments created:
//!
//! | trace | this policy | before: packed to 16 MiB, dedicated above | PyTorch |
//! |---|---|---|---|
//! | gpt_train | 1.031, 158 | 1.082, 188 | 1.246, 57 |
//! | frag_churn | 1.046, 822 | 1.064, 920 | 1.287, 68 |
//! | bert_varlen_infer | 1.031, 477 | 1.081, 733 | 2.097, 24 |
//! | vit_train | 1.080, 348 | 1.164, 482 | 1.094, 143 |
//! | mixed_serving | 1.071, 638 | 1.071, 732 | 3.209, 20 |
//! | gpt_decode | 1.091, 37 | 1.071, 40 | 1.171, 43 |
//! | llm_prefill_varlen | 1.036, 228 | 1.031, 360 | 1.587, 30 |
//! | mlp_varbatch_serve | 1.071, 7 | 1.071, 8 | 1.024, 8 |
//! | resnet_train | 1.031, 380 | 1.044, 508 | 1.285, 133 |
//! | the `mlp` server's sequence | 1.064, 9 | 1.196, 12 | |
//!
//! Fewer segments on every trace (by 7-37%); peaks lower on five, the same on two, higher on two
//! (`gpt_decode`, `llm_prefill_varlen`, within 1.10 and PyTorch's). The mid-sized class brought the two peaks the old
//! policy left above PyTorch's or CubeCL's down (`gpt_train`, `vit_train`); sharing large
//! segments cut most of the segments. Segments created stay far above PyTorch's, which never
//! gives memory back: within 1/32 over the demand, a request that no cached range fits still
//! means a new segment. A server whose requests above 16 MiB vary in size (split-K partials of
//! 16-40 MiB with batches of 1 to 512, replayed) keeps creating segments under this policy as
//! under the one before (1,135 and 1,411 over 400 requests, half of them in the second half);
//! even a headroom of 1/4 did not stop it (351).
//!
//! Tried and not kept (figures over the five shared traces, then worst held-out one):
//! - large requests sharing every free range that fits (no fill or remainder rule): 1.20-1.44
//!   with 34-257 segments: small requests pin large segments, whose free ranges the next large
//!   request cannot use; with new large segments of `demand / 16` within the headroom, the same.
//! - the fill rule alone, with mid-sized requests packed: at 4/8 1.081-1.166 with 119-504
//!   segments, at 5/8 up to 1.167; at 7/8 the old figures; at 6/8 `gpt_decode` rose to 1.119 (22
//!   MiB requests in 30 MiB segments left 7 MiB that no large request fits: hence the remainder
//!   rule). Remainder rules of 1/2 and 1/8 with the final classes: `gpt_decode` 1.139, and up to
//!   24% more segments.
//! - giving the fill rule up when the pool is at its cache ceiling (sharing rather than giving
//!   back and creating): 1.08-1.37, 95-341 segments.
//! - merging the empty large segments into the new one: 1.17-1.48 with every range shared, up to
//!   1.91 with the fill rule.
//! - dedicated above 8 MiB with shared large segments: every ratio target met on the five
//!   (1.031-1.071) but `gpt_decode` 562 segments (a KV cache of 8-16 MiB tensors growing by a
//!   step), against 40.
//! - mid-sized segments of the packed size, with room for one request: a churn of 1-8 MiB
//!   requests created 56 segments where the buddy allocators created 9 (small requests not using
//!   the mid-sized free space) and `gpt_decode` rose to 1.152 (using it); room for at least four:
//!   small pools 1.19-1.87 (the `mlp` server, a churn of 1-8 MiB); mid-sized segments of 64 MiB:
//!   the `mlp` server 59 segments.
//! - a headroom of 1/16 with these rules: up to 14% fewer segments, peaks 1.06-1.09, `gpt_train`
//!   1.061 (above CubeCL's 1.037); of 1/10: peaks up to 1.10, up to 31% fewer segments.
//!
//! Before (figures of that policy): the cache cut segments created by 10–68% at the same or lower
//! peaks; dedicated segments above an eighth lowered three peaks but made the `mlp` server create
//! 503 segments. Tried then and not kept: segments of 256 MiB to 2 GiB packed by the core
//! (1.6-2.2: a few long-lived small allocations pin large segments), size classes for dedicated
//! segments (1.08-1.15, no fewer segments), reusing cached dedicated segments with up to twice the
//! slack (1.17-1.19), placing in the fullest segment (no change with the cache), and a headroom of
//! 1/20 (1.05-1.07, up to 8% fewer segments) or 1/10 (1.10-1.12).

#![deny(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::buddy::{self, BuddyAllocator, Rounding};

mod compact;
mod large;

pub use compact::CompactionLimits;
use compact::{
    cheapest_range_windows, cheapest_windows, range_after_moves, FreeBlocks, Live, Window,
};
use large::{FreeIndex, Ranges};

/// What a segment's memory comes from: GPU buffers in the pool, nothing but bookkeeping in the
/// replay.
pub trait SegmentStorage {
    /// The storage's handle to one segment's memory.
    type Segment;

    /// Creates the memory of one segment of `size_bytes`. `dedicated` is true for a segment made
    /// for one large request. An error means the device (or simulated device) is out of memory.
    fn create_segment(
        &mut self,
        size_bytes: u64,
        dedicated: bool,
    ) -> Result<Self::Segment, StorageError>;

    /// Gives a segment's memory back. It holds no live allocation.
    fn destroy_segment(&mut self, segment: Self::Segment);
}

/// A storage's refusal to create a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the device could not allocate {size_bytes} bytes: {reason}")]
pub struct StorageError {
    /// The size that was refused, in bytes.
    pub size_bytes: u64,
    /// What the device said.
    pub reason: String,
}

/// The default cap on segment size. Before dedicated segments were cached, replaying the traces in
/// `tests/data/traces` (H200 limits) gave peak reserved / peak requested of 1.39 and 1.42 with 1 GiB
/// segments, 1.29 and 1.42 with 256 MiB, and 1.11 and 1.38 with 64 MiB: smaller segments leave
/// less memory stranded in partly used ones.
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// A new segment of the mid-sized class holds at least this many requests of the size that made
/// it (rounded up to a power of two, at most `max_segment_bytes` and at most half the demand,
/// rounded down to a power of two): with room for one request only, a pool at its cache ceiling
/// gave back and created a segment for every few requests of sizes cycling from 1 to 8 MiB (56
/// segments where the buddy allocators created 9).
const MID_SEGMENT_REQUESTS: u64 = 2;

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
    /// Largest segment created, in bytes; a power of two multiple of `min_block_bytes`. Larger
    /// requests get dedicated segments.
    pub max_segment_bytes: u64,
    /// New segments are at least `reserved / growth_divisor` (0 turns this off).
    pub growth_divisor: u64,
    /// Requests above this (at most `max_segment_bytes`) are *large*: they share large segments
    /// (see `large_fill_eighths`), or, when `large_fill_eighths` is 0, each gets a dedicated
    /// segment.
    pub dedicated_above_bytes: u64,
    /// With dedicated segments (`large_fill_eighths` 0): a freed one is kept and reused for a
    /// later request of at least `size * (1 - 1 / dedicated_reuse_divisor)` bytes. With shared
    /// large segments only 0 matters. 0: a dedicated or large segment is given back as soon as no
    /// allocation lives in it.
    pub dedicated_reuse_divisor: u64,
    /// Largest request accepted, in bytes (dedicated segments included): the device's largest
    /// buffer.
    pub max_allocation_bytes: u64,
    /// How requests are rounded inside segments.
    pub rounding: Rounding,
    /// When `cache_headroom_divisor` is 0: before growing, empty segments are given back (largest
    /// first) until at most `reserved / keep_empty_divisor` bytes stay empty; 0 gives back every
    /// empty segment.
    pub keep_empty_divisor: u64,
    /// Most bytes that may be reserved at once, or `None` for no budget.
    pub budget_bytes: Option<u64>,
    /// When not 0, empty segments stay cached as long as the pool keeps within a headroom over its
    /// demand, and `keep_empty_divisor` is not used: before growing, empty segments are given back
    /// (least recently used first) only while the reserved bytes plus the new segment would pass
    /// `demand + demand / cache_headroom_divisor`, where demand is the most bytes ever allocated
    /// at once, the request at hand included.
    pub cache_headroom_divisor: u64,
    /// From 1 to 8 (6 by default): requests above `dedicated_above_bytes` share *large
    /// segments*, each an exact-fit list of address-ordered free ranges that coalesce on free (a
    /// new one is of the request's size). A request takes the tightest free range of any large
    /// segment that leaves the segment at least `large_fill_eighths / 8` full (and a remainder
    /// allowed by `large_remainder_divisor`), cut from the range's start. So the space one large
    /// request frees serves later requests of other sizes, while a request much smaller than an
    /// empty or mostly free segment does not pin it (that segment drains, and is given back or
    /// reused whole). 0: the older rule, a dedicated segment per request, which once freed serves
    /// one later request of at least `1 - 1 / dedicated_reuse_divisor` of its size.
    pub large_fill_eighths: u64,
    /// With shared large segments: a free range serves a large request only when what it leaves
    /// is either more than `dedicated_above_bytes` (another large request can use it) or at most
    /// `1 / large_remainder_divisor` of the request (4 by default; 0: any remainder). A remainder
    /// in between could serve no large request and would stay as waste beside it.
    pub large_remainder_divisor: u64,
    /// When not 0 (1 MiB by default: `max_segment_bytes / 64`), requests above this and up to
    /// `dedicated_above_bytes` (*mid-sized*) are placed in segments of their own class, each an
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
            dedicated_above_bytes: (max_segment_bytes / 4).max(min_block_bytes),
            dedicated_reuse_divisor: 8,
            max_allocation_bytes: max_buffer_size,
            rounding: Rounding::Exact,
            keep_empty_divisor: 32,
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
            dedicated_above_bytes: 0,
            dedicated_reuse_divisor: 0,
            max_allocation_bytes: max_buffer_size,
            rounding: Rounding::Exact,
            keep_empty_divisor: 0,
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
    /// segment no larger than the largest) and the fill rule (at most 8/8); `PoolCore::new` calls
    /// it. Other fields are taken as capped where their documentation says so.
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
        if self.large_fill_eighths > 8 {
            return Err(PolicyError::Setting(format!(
                "large_fill_eighths is at most 8, got {}",
                self.large_fill_eighths
            )));
        }
        Ok(())
    }
}

/// Why the policy refused a request. Each variant carries the figures that explain it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A request of zero bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A request larger than any buffer the device can create.
    #[error("request of {requested_bytes} bytes exceeds the largest buffer this device can create ({max_allocation_bytes} bytes)")]
    TooLarge {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's largest buffer, in bytes.
        max_allocation_bytes: u64,
    },
    /// Out of memory: the budget or the device refused the memory the request needs.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// The configuration is not valid.
    #[error("invalid pool configuration: {0}")]
    Config(#[from] buddy::ConfigError),
    /// A setting breaks a rule its documentation states (segment sizes, the fill rule).
    #[error("invalid pool configuration: {0}")]
    Setting(String),
}

/// The figures of an out-of-memory refusal, in the manner of PyTorch's OOM message.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    /// The size asked for, in bytes.
    pub requested_bytes: u64,
    /// The segment the pool tried to create, in bytes.
    pub segment_bytes: u64,
    /// Reserved by the pool when it failed, in bytes.
    pub reserved_bytes: u64,
    /// Allocated (rounded) by live allocations, in bytes.
    pub allocated_bytes: u64,
    /// The largest free block in any segment, in bytes.
    pub largest_free_bytes: u64,
    /// External fragmentation of the free memory in segments (`1 - largest_free / free`).
    pub external_fragmentation: f64,
    /// The budget, if one is set, in bytes.
    pub budget_bytes: Option<u64>,
    /// What the storage said, when it was the device that refused.
    pub device_error: Option<String>,
    /// Bytes of empty segments given back while trying (0 when the budget refused: a refusal the
    /// empty segments could not have avoided gives nothing back). Already out of
    /// `reserved_bytes`.
    pub released_bytes: u64,
    /// Free bytes in all segments when it failed.
    pub free_bytes: u64,
    /// When moving live allocations within [`CompactionLimits::default`] would have made room for
    /// the request in the segments held (see [`PoolCore::compaction_estimate`]): what it would
    /// move. `None` when it would not, or for a request compaction cannot serve (a dedicated one).
    pub compaction: Option<CompactionEstimate>,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "out of memory: tried to allocate {:.2} MiB (a new segment of {:.2} MiB); the pool has {:.2} MiB reserved, \
             of which {:.2} MiB allocated and {:.2} MiB reserved but unallocated; the largest free block is {:.2} MiB \
             (external fragmentation {:.1}%)",
            mib(self.requested_bytes),
            mib(self.segment_bytes),
            mib(self.reserved_bytes),
            mib(self.allocated_bytes),
            mib(self.reserved_bytes - self.allocated_bytes.min(self.reserved_bytes)),
            mib(self.largest_free_bytes),
            self.external_fragmentation * 100.0
        )?;
        match (self.budget_bytes, &self.device_error) {
            (_, Some(device)) => write!(f, "; the device refused: {device}")?,
            (Some(budget), None) => write!(f, "; the budget is {:.2} MiB", mib(budget))?,
            (None, None) => {}
        }
        if self.released_bytes > 0 {
            write!(
                f,
                "; the pool gave back {:.2} MiB of empty segments while trying",
                mib(self.released_bytes)
            )?;
        }
        if self.free_bytes > 0 {
            write!(
                f,
                "; free space in segments totals {:.2} MiB, the largest block {:.2} MiB",
                mib(self.free_bytes),
                mib(self.largest_free_bytes)
            )?;
            if let Some(compaction) = &self.compaction {
                write!(
                    f,
                    "; compacting (moving {:.2} MiB in {} allocation{} out of a block of {:.2} MiB in segment {}) would make it fit",
                    mib(compaction.moved_bytes),
                    compaction.moves,
                    if compaction.moves == 1 { "" } else { "s" },
                    mib(compaction.window_bytes),
                    compaction.segment.0
                )?;
            }
        }
        write!(f, ". Try: ")?;
        if self.compaction.is_some() {
            write!(
                f,
                "compact (a compute context's compact_for moves its tensors; ContextOptions::compact_on_oom does it \
                 before an allocation fails), "
            )?;
        }
        write!(
            f,
            "free or drop allocations you no longer need, call trim() to give back empty segments, \
             raise the budget, or split the work into smaller requests"
        )
    }
}

/// A counter's current value, its peak, and its running total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counter {
    /// The value now.
    pub current: u64,
    /// The highest value seen.
    pub peak: u64,
    /// The sum of every increase (allocated in total).
    pub total: u64,
    /// The sum of every decrease (freed in total).
    pub freed: u64,
}

impl Counter {
    pub(crate) fn add(&mut self, amount: u64) {
        self.current += amount;
        self.total += amount;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn sub(&mut self, amount: u64) {
        self.current -= amount;
        self.freed += amount;
    }

    /// Starts a new peak from the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// The pool's statistics as plain data.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Bytes of segments held (the memory the pool took from the device).
    pub reserved_bytes: Counter,
    /// Bytes held by allocations after rounding: live ones, and (in the GPU pool) dropped ones
    /// whose ranges wait for a submission before reuse (`pending_free_bytes` of them; see
    /// [`PoolStats::live_allocated_bytes`]).
    pub allocated_bytes: Counter,
    /// Bytes asked for by live allocations.
    pub requested_bytes: Counter,
    /// Allocations holding a range: live ones and pending frees (see
    /// [`PoolStats::live_allocations`]).
    pub allocations: Counter,
    /// Segments held (dedicated ones included).
    pub segments: Counter,
    /// Calls to the storage's `create_segment` that succeeded (each a `create_buffer` on a GPU).
    pub create_segment_calls: u64,
    /// Out-of-memory errors returned.
    pub oom_count: u64,
    /// The largest free block in any segment now, in bytes.
    pub largest_free_bytes: u64,
    /// Free bytes in all segments now, in bytes.
    pub free_bytes: u64,
    /// Bytes of segments that hold no allocation now (what `trim` would give back), counted in
    /// `free_bytes`.
    #[serde(default)]
    pub empty_segment_bytes: u64,
    /// The largest free block now in a segment that holds an allocation, in bytes (what is free
    /// but would not be given back).
    #[serde(default)]
    pub largest_held_free_bytes: u64,
    /// Dropped allocations whose ranges wait for a submission before reuse (PyTorch's
    /// `active_pending_free` blocks), counted in `allocations` (0 where nothing waits: the policy
    /// alone, the replay, the naive baseline).
    #[serde(default)]
    pub pending_frees: u64,
    /// Their bytes after rounding, counted in `allocated_bytes`.
    #[serde(default)]
    pub pending_free_bytes: u64,
}

impl PoolStats {
    /// Bytes held by live allocations, after rounding: `allocated_bytes` without the pending
    /// frees (what PyTorch's `memory_allocated` counts: it drops at free).
    pub fn live_allocated_bytes(&self) -> u64 {
        self.allocated_bytes
            .current
            .saturating_sub(self.pending_free_bytes)
    }

    /// Live allocations: `allocations` without the pending frees.
    pub fn live_allocations(&self) -> u64 {
        self.allocations.current.saturating_sub(self.pending_frees)
    }

    /// Starts new peaks from the current values of every counter.
    pub fn reset_peaks(&mut self) {
        for counter in [
            &mut self.reserved_bytes,
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.allocations,
            &mut self.segments,
        ] {
            counter.reset_peak();
        }
    }

    /// `1 - requested / allocated` over live allocations (0 when none).
    pub fn internal_fragmentation(&self) -> f64 {
        ratio_complement(self.requested_bytes.current, self.allocated_bytes.current)
    }

    /// `1 - largest free block / free bytes` over the segments that hold an allocation: the
    /// share of free memory that would not be given back by trimming and lies outside the
    /// largest free block (0 when nothing is free there). Empty segments are apart
    /// (`empty_segment_bytes`): a pool of empty segments is not fragmented.
    pub fn external_fragmentation(&self) -> f64 {
        ratio_complement(
            self.largest_held_free_bytes,
            self.free_bytes.saturating_sub(self.empty_segment_bytes),
        )
    }
}

fn ratio_complement(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        1.0 - part as f64 / whole as f64
    }
}

/// A process-unique id of a segment, stable for its lifetime.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SegmentId(pub u64);

/// One segment: its memory, and the buddy allocator of its offsets (none for a dedicated one, or
/// one of free ranges of the large or mid-sized class).
#[derive(Debug)]
pub struct Segment<M> {
    /// The segment's id.
    pub id: SegmentId,
    /// The storage's handle to its memory.
    pub memory: M,
    /// Its size, in bytes.
    pub size_bytes: u64,
    /// The offsets allocator; `None` for a dedicated segment or one of free ranges.
    pub allocator: Option<BuddyAllocator>,
    /// For a dedicated segment: whether its one allocation is live.
    dedicated_in_use: bool,
    /// For a segment of the large or the mid-sized class: its free ranges.
    large: Option<Ranges>,
    /// The pool's clock when the segment was created or last had an allocation freed.
    last_used: u64,
    /// The live allocations of a packed segment or one of free ranges (and destinations a
    /// compaction plan holds), by offset: what compaction moves.
    live: BTreeMap<u64, Live>,
}

impl<M> Segment<M> {
    /// The ranges held in a packed segment or one of free ranges as `(offset, allocated bytes)`,
    /// in address order: its live allocations, and the destinations of a compaction plan not yet
    /// applied or cancelled. Empty for a dedicated segment.
    pub fn live_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live
            .iter()
            .map(|(&offset, live)| (offset, live.allocated_bytes))
    }

    /// True for a segment of one request's own (the naive mode's, or a large request's when large
    /// requests do not share): neither buddy-packed nor of free ranges. Compaction never moves
    /// its allocation.
    pub fn is_dedicated(&self) -> bool {
        self.allocator.is_none() && self.large.is_none()
    }

    /// Which of the policy's size classes the segment serves.
    pub fn class(&self) -> SegmentClass {
        match (&self.allocator, &self.large) {
            (Some(_), _) => SegmentClass::Packed,
            (None, Some(large)) if large.is_mid() => SegmentClass::Mid,
            (None, Some(_)) => SegmentClass::Large,
            (None, None) => SegmentClass::Dedicated,
        }
    }

    /// Its free space as `(offset_bytes, size_bytes)` in address order: the free buddy blocks of
    /// a packed segment, the free ranges of a segment of the mid-sized or large class, the whole
    /// segment when a dedicated one is unused. With the live ranges these tile the segment.
    pub fn free_spans(&self) -> Vec<(u64, u64)> {
        match (&self.allocator, &self.large) {
            (Some(allocator), _) => allocator.free_blocks(),
            (None, Some(large)) => large.free_ranges().collect(),
            (None, None) if !self.dedicated_in_use => vec![(0, self.size_bytes)],
            (None, None) => Vec::new(),
        }
    }

    /// True when no allocation lives in this segment.
    pub fn is_empty(&self) -> bool {
        match (&self.allocator, &self.large) {
            (Some(allocator), _) => allocator.is_empty(),
            (None, Some(large)) => large.is_empty(),
            (None, None) => !self.dedicated_in_use,
        }
    }

    /// Counters of the offsets allocator (a dedicated segment reports itself as one block).
    pub fn stats(&self, min_block_bytes: u64) -> buddy::Stats {
        if let Some(large) = &self.large {
            return buddy::Stats {
                capacity_bytes: self.size_bytes,
                allocated_bytes: large.allocated_bytes(),
                requested_bytes: 0,
                free_bytes: large.free_bytes(),
                largest_free_bytes: large.largest_free_bytes(),
                min_block_bytes,
                free_blocks_per_order: [0; buddy::MAX_ORDER_LIMIT as usize + 1],
                allocation_count: large.allocations(),
            };
        }
        match &self.allocator {
            Some(allocator) => allocator.stats(),
            None => buddy::Stats {
                capacity_bytes: self.size_bytes,
                allocated_bytes: if self.dedicated_in_use {
                    self.size_bytes
                } else {
                    0
                },
                requested_bytes: 0,
                free_bytes: if self.dedicated_in_use {
                    0
                } else {
                    self.size_bytes
                },
                largest_free_bytes: if self.dedicated_in_use {
                    0
                } else {
                    self.size_bytes
                },
                min_block_bytes,
                free_blocks_per_order: [0; buddy::MAX_ORDER_LIMIT as usize + 1],
                allocation_count: u64::from(self.dedicated_in_use),
            },
        }
    }
}

/// Where an allocation lives. Not `Clone`: give it back with [`PoolCore::free`].
#[derive(Debug)]
#[must_use = "a placement that is dropped instead of freed stays allocated"]
pub struct Placement {
    segment: SegmentId,
    slot: usize,
    offset_bytes: u64,
    requested_bytes: u64,
    allocated_bytes: u64,
    inner: Option<buddy::Allocation>,
}

impl Placement {
    /// The segment holding the allocation.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The index of the segment in [`PoolCore::segments`].
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Offset in the segment, in bytes.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size asked for, in bytes.
    pub fn requested_size(&self) -> u64 {
        self.requested_bytes
    }

    /// The size held after rounding, in bytes.
    pub fn allocated_size(&self) -> u64 {
        self.allocated_bytes
    }

    /// True when the allocation is not in a buddy-packed segment: in a dedicated segment, or in
    /// a segment of free ranges (the large or the mid-sized class). Compaction moves allocations
    /// of packed segments and of segments of free ranges, never of dedicated ones.
    pub fn is_dedicated(&self) -> bool {
        self.inner.is_none()
    }
}

/// One move of a [`CompactionPlan`]: a live allocation's bytes copied from one range to another.
/// The destination is reserved by the plan: free before it, disjoint from every live allocation
/// (the one moved included) and from the other moves' destinations, and never in the segment the
/// plan makes room in. So the copies of a plan may run in any order, or at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Move {
    /// The segment the allocation is in.
    pub from_segment: SegmentId,
    /// That segment's slot ([`Placement::slot`]).
    pub from_slot: usize,
    /// The allocation's offset there, in bytes (with `from_segment`, it names the allocation).
    pub from_offset: u64,
    /// The segment it moves to.
    pub to_segment: SegmentId,
    /// That segment's slot.
    pub to_slot: usize,
    /// Its offset there, in bytes.
    pub to_offset: u64,
    /// The range to copy: the allocation's size after rounding, in bytes.
    pub bytes: u64,
    /// The size the allocation asked for, in bytes (a copy of the data alone needs only these,
    /// rounded up to the device's copy alignment).
    pub requested_bytes: u64,
}

/// What compaction would do to make room for a request, without doing it
/// ([`PoolCore::compaction_estimate`], [`OutOfMemory::compaction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CompactionEstimate {
    /// The segment the request would fit in.
    pub segment: SegmentId,
    /// The offset of the range emptied for it, in bytes.
    pub window_offset: u64,
    /// The size of that range, in bytes: for a packed request, an aligned block of the request
    /// rounded up to a power of two; for a mid-sized or large one, the request after rounding.
    pub window_bytes: u64,
    /// The allocations moved out of it.
    pub moves: usize,
    /// Their bytes after rounding: what the copies cover.
    pub moved_bytes: u64,
}

/// Moves that make room for one request in the segments held ([`PoolCore::compaction_plan`]).
/// Their destinations are reserved in the pool until the plan is applied
/// ([`PoolCore::apply_moves`]) or cancelled ([`PoolCore::cancel_compaction`]): the caller copies
/// each move's bytes while the sources are still live, then applies the plan, which updates the
/// moved placements and frees the sources. Not `Clone`; dropping it keeps the destinations
/// reserved.
#[derive(Debug)]
#[must_use = "a compaction plan holds its destinations until it is applied or cancelled"]
pub struct CompactionPlan {
    request_bytes: u64,
    estimate: CompactionEstimate,
    slot: usize,
    moves: Vec<Move>,
    /// The destinations, one per move, in the same order: the buddy allocation of a packed one,
    /// `None` for a range of a segment of free ranges (the move names it).
    reserved: Vec<Option<buddy::Allocation>>,
}

impl CompactionPlan {
    /// The moves, largest first.
    pub fn moves(&self) -> &[Move] {
        &self.moves
    }

    /// The bytes all the moves copy (allocated sizes).
    pub fn moved_bytes(&self) -> u64 {
        self.estimate.moved_bytes
    }

    /// The request the plan makes room for, in bytes.
    pub fn request_bytes(&self) -> u64 {
        self.request_bytes
    }

    /// The segment, block and cost of the plan.
    pub fn estimate(&self) -> CompactionEstimate {
        self.estimate
    }

    /// The slot of the segment the request will fit in.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// True when the plan moves `placement`.
    pub fn moves_placement(&self, placement: &Placement) -> bool {
        self.moves
            .iter()
            .any(|m| m.from_segment == placement.segment && m.from_offset == placement.offset_bytes)
    }
}

/// Why [`PoolCore::apply_moves`] refused a plan. The plan is cancelled: nothing moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactionError {
    /// The placements given did not include an allocation the plan moves.
    #[error("the placement at offset {offset} of segment {segment:?}, which the plan moves, was not given")]
    MissingPlacement {
        /// Its segment.
        segment: SegmentId,
        /// Its offset, in bytes.
        offset: u64,
    },
}

/// How many candidate windows [`PoolCore::compaction_plan`] tries and sees fail, cheapest first,
/// before it gives up (windows passed over because an earlier failure says they would fail are not
/// counted), and how many windows of each segment it ranks.
pub const COMPACTION_CANDIDATES: usize = 8;

/// The windows a compaction has tried and failed to make room with, so that it passes over
/// windows that would fail the same way.
#[derive(Default)]
struct Tries {
    /// Per failure the model found: the segment and the sizes of the window's allocations,
    /// largest first, up to the one that fitted nowhere. The model places by sizes alone, largest
    /// first, so a window of that segment whose largest allocations have these sizes fails too.
    misfits: Vec<(usize, Vec<u64>)>,
    /// Per failure of the reservation (where the buddy core parts from the model): the segment
    /// and every allocation's sizes, allocated and requested, largest first.
    refused: Vec<(usize, Vec<(u64, u64)>)>,
}

/// The sizes of a window's allocations, allocated and requested, largest first.
type Sizes = Vec<(u64, u64)>;

impl Tries {
    /// The sizes of `window`'s allocations in `slot` if it is worth a try; `None` when an earlier
    /// failure says it would fail.
    fn admit<S: SegmentStorage>(
        &self,
        pool: &PoolCore<S>,
        slot: usize,
        window: &Window,
    ) -> Option<Sizes> {
        let segment = pool.segments[slot].as_ref()?;
        let mut sizes: Sizes = window
            .sources
            .iter()
            .map(|offset| {
                let live = segment.live[offset];
                (live.allocated_bytes, live.requested_bytes)
            })
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let misfit = self.misfits.iter().any(|(failed_slot, prefix)| {
            *failed_slot == slot
                && prefix.len() <= sizes.len()
                && prefix
                    .iter()
                    .zip(&sizes)
                    .all(|(bytes, (allocated, _))| bytes == allocated)
        });
        let refused = self
            .refused
            .iter()
            .any(|(failed_slot, failed)| *failed_slot == slot && *failed == sizes);
        (!misfit && !refused).then_some(sizes)
    }

    /// The model found no place for the `placed`-th allocation (largest first) of a window.
    fn misfit(&mut self, slot: usize, sizes: &Sizes, placed: usize) {
        let prefix = sizes.iter().take(placed).map(|&(allocated, _)| allocated);
        self.misfits.push((slot, prefix.collect()));
    }

    /// The reservation of a window's moves failed.
    fn refused(&mut self, slot: usize, sizes: Sizes) {
        self.refused.push((slot, sizes));
    }

    /// Whether [`COMPACTION_CANDIDATES`] windows have failed.
    fn exhausted(&self) -> bool {
        self.misfits.len() + self.refused.len() >= COMPACTION_CANDIDATES
    }
}

/// What compaction makes room for: a free aligned block of a packed segment, or a free range of
/// a segment of the mid-sized or large class.
#[derive(Debug, Clone, Copy)]
enum CompactionTarget {
    Packed { block_bytes: u64 },
    Ranges { mid: bool, bytes: u64 },
}

/// Which of the policy's size classes a segment serves: how its space is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentClass {
    /// Small requests (up to the packed limit, 1 MiB by default), packed by a buddy allocator.
    Packed,
    /// Mid-sized requests (1–16 MiB by default) in exact-fit free ranges that coalesce.
    Mid,
    /// Large requests in exact-fit free ranges that coalesce.
    Large,
    /// One request's own segment (the naive baseline's every buffer, and a large request's
    /// when large requests do not share).
    Dedicated,
}

impl SegmentClass {
    /// Its name in reports: `"packed"`, `"mid"`, `"large"` or `"dedicated"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Packed => "packed",
            Self::Mid => "mid",
            Self::Large => "large",
            Self::Dedicated => "dedicated",
        }
    }
}

/// What a new segment is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Packed by a buddy allocator.
    Packed,
    /// One request's own (the naive mode, and large requests when they do not share).
    Dedicated,
    /// Free ranges shared by large requests (`mid` false) or by mid-sized ones (`mid` true).
    Ranges { mid: bool },
}

/// A change to the segments, reported to the caller so that history and the GPU layer can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentEvent {
    /// A segment was created.
    Created {
        /// Its id.
        id: SegmentId,
        /// Its size, in bytes.
        size_bytes: u64,
    },
    /// A segment was given back.
    Destroyed {
        /// Its id.
        id: SegmentId,
        /// Its size, in bytes.
        size_bytes: u64,
    },
}

/// The policy engine: segments, their buddy allocators, and the statistics.
pub struct PoolCore<S: SegmentStorage> {
    config: PolicyConfig,
    storage: S,
    segments: Vec<Option<Segment<S::Segment>>>,
    /// The slots of `segments` that hold no segment, so that a new segment takes the lowest one
    /// without a scan.
    vacant_slots: BTreeSet<usize>,
    next_segment_id: u64,
    stats: PoolStats,
    events: Vec<SegmentEvent>,
    /// The most bytes ever allocated at once (not reset with the peaks): the demand that
    /// `cache_headroom_divisor` measures the cache against.
    demand_high_water: u64,
    /// Counts the frees: segments are given back least recently used first.
    clock: u64,
    /// The free ranges of the large segments (`[0]`) and of the mid-sized class's (`[1]`), by
    /// size.
    ranges_free: [FreeIndex; 2],
}

impl<S: SegmentStorage> fmt::Debug for PoolCore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCore")
            .field("config", &self.config)
            .field("segments", &self.segment_count())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<S: SegmentStorage> PoolCore<S> {
    /// A pool with no segments yet.
    pub fn new(config: PolicyConfig, storage: S) -> Result<Self, PolicyError> {
        config.validate()?;
        Ok(Self {
            config,
            storage,
            segments: Vec::new(),
            vacant_slots: BTreeSet::new(),
            next_segment_id: 0,
            stats: PoolStats::default(),
            events: Vec::new(),
            demand_high_water: 0,
            clock: 0,
            ranges_free: [FreeIndex::default(), FreeIndex::default()],
        })
    }

    /// The settings.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Sets or clears the budget on reserved bytes. Segments already held stay.
    pub fn set_budget(&mut self, budget_bytes: Option<u64>) {
        self.config.budget_bytes = budget_bytes;
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The storage, to change its settings (the GPU pool names the next naive buffer).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    /// The segments, by slot; a slot is `None` after its segment was given back.
    pub fn segments(&self) -> impl Iterator<Item = &Segment<S::Segment>> {
        self.segments.iter().flatten()
    }

    /// The segment in `slot`, if it is held.
    pub fn segment(&self, slot: usize) -> Option<&Segment<S::Segment>> {
        self.segments.get(slot).and_then(Option::as_ref)
    }

    /// The number of segments held.
    pub fn segment_count(&self) -> usize {
        self.segments.len() - self.vacant_slots.len()
    }

    /// The segment events since the last call (creations and destructions, in order).
    pub fn take_events(&mut self) -> Vec<SegmentEvent> {
        std::mem::take(&mut self.events)
    }

    /// The statistics, with the free-space figures brought up to date. O(segments) in a pool,
    /// O(1) in the naive mode (which has no free space).
    pub fn stats(&self) -> PoolStats {
        let mut stats = self.stats;
        stats.free_bytes = 0;
        stats.largest_free_bytes = 0;
        stats.empty_segment_bytes = 0;
        stats.largest_held_free_bytes = 0;
        if self.config.is_naive() {
            return stats;
        }
        for segment in self.segments.iter().flatten() {
            let (free, largest) = match (&segment.allocator, &segment.large) {
                (Some(allocator), _) => (allocator.free_bytes(), allocator.largest_free_bytes()),
                (None, Some(large)) => (large.free_bytes(), large.largest_free_bytes()),
                // A dedicated segment kept for reuse while unused: free, and given back by trim.
                (None, None) if segment.is_empty() => {
                    stats.free_bytes += segment.size_bytes;
                    stats.empty_segment_bytes += segment.size_bytes;
                    continue;
                }
                (None, None) => continue,
            };
            stats.free_bytes += free;
            stats.largest_free_bytes = stats.largest_free_bytes.max(largest);
            if segment.is_empty() {
                stats.empty_segment_bytes += segment.size_bytes;
            } else {
                stats.largest_held_free_bytes = stats.largest_held_free_bytes.max(largest);
            }
        }
        stats
    }

    /// The counters of the statistics, without the free-space figures (`free_bytes` and
    /// `largest_free_bytes` are 0): O(1).
    pub fn counters(&self) -> PoolStats {
        PoolStats {
            free_bytes: 0,
            largest_free_bytes: 0,
            ..self.stats
        }
    }

    /// Starts new peaks from the current values.
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// The bytes a request of `size_bytes` would hold once placed in a segment.
    /// `u64::MAX` when the rounding passes it (such a request is refused as too large).
    pub fn rounded_size(&self, size_bytes: u64) -> u64 {
        self.checked_rounded_size(size_bytes).unwrap_or(u64::MAX)
    }

    /// [`Self::rounded_size`], or `None` when the rounding passes `u64::MAX`.
    fn checked_rounded_size(&self, size_bytes: u64) -> Option<u64> {
        let units = size_bytes.div_ceil(self.config.min_block_bytes).max(1);
        let units = match self.config.rounding {
            Rounding::Exact => units,
            Rounding::PowerOfTwo => units.checked_next_power_of_two()?,
        };
        units.checked_mul(self.config.min_block_bytes)
    }

    /// Whether a request of `size_bytes` can be placed at all: not zero, within the largest
    /// allocation, and its rounded size within `u64`.
    fn placeable(&self, size_bytes: u64) -> bool {
        size_bytes > 0
            && size_bytes <= self.config.max_allocation_bytes
            && self.checked_rounded_size(size_bytes).is_some()
    }

    /// Places a request of `size_bytes`, growing the pool if needed.
    pub fn allocate(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        if size_bytes == 0 {
            return Err(PolicyError::ZeroSize);
        }
        if !self.placeable(size_bytes) {
            return Err(PolicyError::TooLarge {
                requested_bytes: size_bytes,
                max_allocation_bytes: self.config.max_allocation_bytes,
            });
        }
        if self.takes_dedicated(size_bytes) {
            return if self.shares_large() {
                self.allocate_large(size_bytes)
                    .or_else(|error| self.place_as_a_last_resort(size_bytes, error))
            } else {
                self.allocate_dedicated(size_bytes)
            };
        }
        // The request's own class first, then free space of the other class, before growing.
        if let Some(placement) = self.place_packed_or_mid_existing(size_bytes) {
            return Ok(placement);
        }
        if self.takes_mid(size_bytes) {
            return self.allocate_mid(size_bytes);
        }
        let rounded = self.rounded_size(size_bytes);
        let segment_bytes = self.packed_segment_bytes(rounded);
        // When the budget or the device refuses, the fallback is a segment of exactly the rounded
        // request.
        let slot = self.grow_for(size_bytes, rounded, segment_bytes, Kind::Packed)?;
        Ok(self
            .place_in_slot(slot, size_bytes)
            .expect("a new segment sized for the request has room for it"))
    }

    /// Whether a request of `size_bytes` goes to the mid-sized class.
    fn takes_mid(&self, size_bytes: u64) -> bool {
        self.config.mid_above_bytes > 0
            && !self.config.is_naive()
            && size_bytes > self.config.mid_above_bytes
            && !self.takes_dedicated(size_bytes)
    }

    /// A mid-sized request that fits nowhere now: a new segment of the mid-sized class, sized as a
    /// packed one would be, and with room for at least [`MID_SEGMENT_REQUESTS`] such requests.
    fn allocate_mid(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let rounded = self.rounded_size(size_bytes);
        let packed = self.packed_segment_bytes(rounded);
        // At most half the demand, rounded down to a power of two: a small pool does not grow
        // by segments twice its requests.
        let half_demand = (self.demand_with(rounded) / 2).max(1);
        let half_demand = 1u64 << (63 - half_demand.leading_zeros());
        let roomy = packed.max(
            rounded
                .saturating_mul(MID_SEGMENT_REQUESTS)
                .checked_next_power_of_two()
                .unwrap_or(u64::MAX)
                .min(self.config.max_segment_bytes)
                .min(half_demand),
        );
        // When the roomier segment would pass the budget, the size a packed request would get
        // (then, if that passes it too, the request's own).
        let with_roomy = self.stats.reserved_bytes.current.saturating_add(roomy);
        let over_budget = self
            .config
            .budget_bytes
            .is_some_and(|budget| with_roomy > budget);
        let segment_bytes = if over_budget { packed } else { roomy };
        self.grow_ranges(size_bytes, rounded, segment_bytes, true)
    }

    /// Grows the pool by a segment of free ranges (mid-sized or large) of `segment_bytes` and
    /// places the request at its start.
    fn grow_ranges(
        &mut self,
        size_bytes: u64,
        rounded: u64,
        segment_bytes: u64,
        mid: bool,
    ) -> Result<Placement, PolicyError> {
        let slot = self.grow_for(size_bytes, rounded, segment_bytes, Kind::Ranges { mid })?;
        Ok(self.place_large(slot, 0, size_bytes, rounded))
    }

    /// A new segment of `kind` and `segment_bytes` for a request (`rounded` the fallback size):
    /// refused over the budget, after giving back what the cache must. Returns its slot.
    fn grow_for(
        &mut self,
        size_bytes: u64,
        rounded: u64,
        segment_bytes: u64,
        kind: Kind,
    ) -> Result<usize, PolicyError> {
        self.refuse_over_budget(size_bytes, rounded)?;
        let reserved_before = self.stats.reserved_bytes.current;
        self.release_for_growth(rounded, segment_bytes);
        self.grow(size_bytes, segment_bytes, rounded, kind, reserved_before)
    }

    fn place_mid_existing(&mut self, size_bytes: u64, rounded_bytes: u64) -> Option<Placement> {
        let (slot, offset) = self.ranges_free[1].best_fit(rounded_bytes, |_, _| true)?;
        Some(self.place_large(slot, offset, size_bytes, rounded_bytes))
    }

    /// The size of a new packed segment for a request holding `rounded` bytes:
    /// `next_power_of_two(rounded)`, at least `min_segment_bytes` and `reserved / growth_divisor`
    /// (rounded down to a power of two), at most `max_segment_bytes`, and at least `rounded`.
    fn packed_segment_bytes(&self, rounded: u64) -> u64 {
        let mut segment_bytes = rounded
            .next_power_of_two()
            .max(self.config.min_segment_bytes);
        if let Some(proportional) = self
            .stats
            .reserved_bytes
            .current
            .checked_div(self.config.growth_divisor)
        {
            // Round down, so that growth stays under reserved / divisor.
            let proportional = proportional.max(1);
            segment_bytes = segment_bytes.max(1u64 << (63 - proportional.leading_zeros()));
        }
        segment_bytes
            .min(self.config.max_segment_bytes)
            .max(rounded)
    }

    /// Refuses at once, giving nothing back, when even a segment of `fallback_bytes` after giving
    /// back every empty segment would pass the budget: the refusal then changes nothing.
    fn refuse_over_budget(
        &mut self,
        requested_bytes: u64,
        fallback_bytes: u64,
    ) -> Result<(), PolicyError> {
        let Some(budget) = self.config.budget_bytes else {
            return Ok(());
        };
        // A naive pool holds no empty segment (each is given back when freed): no scan.
        let empty_bytes: u64 = if self.config.is_naive() {
            0
        } else {
            self.segments
                .iter()
                .flatten()
                .filter(|s| s.is_empty())
                .map(|s| s.size_bytes)
                .sum()
        };
        let least_reserved = self.stats.reserved_bytes.current - empty_bytes;
        if least_reserved.saturating_add(fallback_bytes) > budget {
            return Err(self.out_of_memory(requested_bytes, fallback_bytes, None, 0));
        }
        Ok(())
    }

    /// Before growing by a segment of `segment_bytes` for a request that holds `rounded_bytes`:
    /// gives back empty segments (none of which could serve the request). With a
    /// `cache_headroom_divisor`, least recently used first until the pool with the new segment
    /// keeps within the headroom over its demand; otherwise largest first, until what stays empty
    /// is at most `reserved / keep_empty_divisor` (all of them when that divisor is 0).
    /// The empty segments as `(key, slot)`.
    fn empty_segments(&self, key: impl Fn(&Segment<S::Segment>) -> u64) -> Vec<(u64, usize)> {
        self.segments
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().filter(|s| s.is_empty()).map(|s| (key(s), slot)))
            .collect()
    }

    fn release_for_growth(&mut self, rounded_bytes: u64, segment_bytes: u64) {
        if self.config.is_naive() {
            // Nothing to give back: a naive segment is given back as soon as it is freed.
            return;
        }
        if self.config.cache_headroom_divisor > 0 {
            let cap = self.cache_ceiling(rounded_bytes);
            let mut empty = self.empty_segments(|s| s.last_used);
            empty.sort_unstable();
            for (_, slot) in empty {
                if self.stats.reserved_bytes.current + segment_bytes <= cap {
                    break;
                }
                self.destroy_slot(slot);
            }
            return;
        }
        let mut empty = self.empty_segments(|s| s.size_bytes);
        let mut empty_bytes: u64 = empty.iter().map(|e| e.0).sum();
        empty.sort_unstable_by(|a, b| b.cmp(a));
        for (size_bytes, slot) in empty {
            let keep = self
                .stats
                .reserved_bytes
                .current
                .checked_div(self.config.keep_empty_divisor)
                .unwrap_or(0);
            if empty_bytes <= keep {
                break;
            }
            self.destroy_slot(slot);
            empty_bytes -= size_bytes;
        }
    }

    fn place_in_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        let mut best: Option<(u32, usize)> = None;
        for (slot, segment) in self.segments.iter().enumerate() {
            let Some(allocator) = segment.as_ref().and_then(|s| s.allocator.as_ref()) else {
                continue;
            };
            if let Some(order) = allocator.fit_order(size_bytes) {
                if best.is_none_or(|(best_order, _)| order < best_order) {
                    best = Some((order, slot));
                }
            }
        }
        if let Some((_, slot)) = best {
            return self.place_in_slot(slot, size_bytes);
        }
        // No run certain to fit anywhere: a run of the request's own length bin may still fit
        // (exact fit only).
        (0..self.segments.len()).find_map(|slot| self.place_in_slot(slot, size_bytes))
    }

    fn place_in_slot(&mut self, slot: usize, size_bytes: u64) -> Option<Placement> {
        let segment = self.segments[slot].as_mut()?;
        let allocator = segment.allocator.as_mut()?;
        let allocation = allocator.allocate(size_bytes).ok()?;
        let allocated_bytes = allocation.allocated_size(allocator.min_block());
        segment.live.insert(
            allocation.offset(),
            Live {
                allocated_bytes,
                requested_bytes: size_bytes,
            },
        );
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: allocation.offset(),
            requested_bytes: size_bytes,
            allocated_bytes,
            inner: Some(allocation),
        };
        self.count_allocation(size_bytes, allocated_bytes);
        Some(placement)
    }

    /// True when large requests share large segments (`large_fill_eighths` from 1 to 8).
    fn shares_large(&self) -> bool {
        !self.config.is_naive() && self.config.large_fill_eighths > 0
    }

    fn allocate_dedicated(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let segment_bytes =
            size_bytes.div_ceil(self.config.min_block_bytes) * self.config.min_block_bytes;
        let segment_bytes = segment_bytes.min(self.config.max_allocation_bytes.max(size_bytes));
        let slot = match self.cached_dedicated(size_bytes) {
            Some(slot) => slot,
            None => {
                self.refuse_over_budget(size_bytes, segment_bytes)?;
                let reserved_before = self.stats.reserved_bytes.current;
                self.release_for_growth(segment_bytes, segment_bytes);
                self.grow(
                    size_bytes,
                    segment_bytes,
                    segment_bytes,
                    Kind::Dedicated,
                    reserved_before,
                )?
            }
        };
        Ok(self.place_dedicated(slot, size_bytes))
    }

    fn place_dedicated(&mut self, slot: usize, size_bytes: u64) -> Placement {
        let segment = self.segments[slot].as_mut().expect("slot holds a segment");
        let segment_bytes = segment.size_bytes;
        segment.dedicated_in_use = true;
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: 0,
            requested_bytes: size_bytes,
            allocated_bytes: segment_bytes,
            inner: None,
        };
        self.count_allocation(size_bytes, segment_bytes);
        placement
    }

    /// The smallest empty dedicated segment that can serve `size_bytes` within the reuse slack.
    fn cached_dedicated(&self, size_bytes: u64) -> Option<usize> {
        let divisor = self.config.dedicated_reuse_divisor;
        if divisor == 0 || self.config.is_naive() {
            return None;
        }
        self.segments
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().map(|s| (slot, s)))
            .filter(|(_, s)| s.allocator.is_none() && s.large.is_none() && !s.dedicated_in_use)
            .filter(|(_, s)| {
                s.size_bytes >= size_bytes && s.size_bytes - s.size_bytes / divisor <= size_bytes
            })
            .min_by_key(|(_, s)| s.size_bytes)
            .map(|(slot, _)| slot)
    }

    /// A large request: the tightest free range of the large segments, or a new large segment.
    /// When the budget or the device refused the memory for a large request: any free range of
    /// the large segments that fits it, whatever the rules of [`PolicyConfig::large_fill_eighths`]
    /// and [`PolicyConfig::large_remainder_divisor`] (which spare segments for later requests, not
    /// worth a failure). The refusal is then not counted.
    fn place_as_a_last_resort(
        &mut self,
        size_bytes: u64,
        error: PolicyError,
    ) -> Result<Placement, PolicyError> {
        if !matches!(error, PolicyError::OutOfMemory(_)) {
            return Err(error);
        }
        let rounded = self.large_rounded(size_bytes);
        let Some((slot, offset)) = self.ranges_free[0].best_fit(rounded, |_, _| true) else {
            return Err(error);
        };
        self.stats.oom_count -= 1;
        Ok(self.place_large(slot, offset, size_bytes, rounded))
    }

    fn allocate_large(&mut self, size_bytes: u64) -> Result<Placement, PolicyError> {
        let rounded = self.large_rounded(size_bytes);
        if let Some(placement) = self.place_large_existing(size_bytes, rounded) {
            return Ok(placement);
        }
        self.grow_ranges(size_bytes, rounded, rounded, false)
    }

    /// The bytes a large request holds: rounded up to `min_block_bytes` (never past the largest
    /// allocation when that is not a multiple of it).
    fn large_rounded(&self, size_bytes: u64) -> u64 {
        let rounded =
            size_bytes.div_ceil(self.config.min_block_bytes) * self.config.min_block_bytes;
        rounded.min(self.config.max_allocation_bytes.max(size_bytes))
    }

    /// Places a large request in the tightest free range of the large segments that leaves its
    /// segment at least `large_fill_eighths / 8` full, if there is one.
    fn place_large_existing(&mut self, size_bytes: u64, rounded_bytes: u64) -> Option<Placement> {
        let (slot, offset) = self.ranges_free[0].best_fit(rounded_bytes, |length, slot| {
            let segment = self.segments[slot]
                .as_ref()
                .expect("a listed range's segment is held");
            let used = segment.large.as_ref().map_or(0, Ranges::allocated_bytes);
            self.large_range_ok(length, used, rounded_bytes, segment.size_bytes)
        })?;
        Some(self.place_large(slot, offset, size_bytes, rounded_bytes))
    }

    /// Whether a free range of `length` bytes in a large segment of `segment_bytes` holding
    /// `used` bytes may serve a large request holding `rounded_bytes`: the segment is then at
    /// least `large_fill_eighths / 8` full, and the range's rest is either usable by another large
    /// request or at most `1 / large_remainder_divisor` of the request.
    fn large_range_ok(
        &self,
        length: u64,
        used: u64,
        rounded_bytes: u64,
        segment_bytes: u64,
    ) -> bool {
        let rest = length - rounded_bytes;
        let divisor = self.config.large_remainder_divisor;
        let rest_ok = divisor == 0
            || rest > self.config.dedicated_above_bytes
            || rest <= rounded_bytes / divisor;
        rest_ok
            && (used + rounded_bytes).saturating_mul(8)
                >= segment_bytes.saturating_mul(self.config.large_fill_eighths)
    }

    fn place_large(
        &mut self,
        slot: usize,
        offset: u64,
        size_bytes: u64,
        rounded_bytes: u64,
    ) -> Placement {
        let segment = self.segments[slot].as_mut().expect("slot holds a segment");
        let ranges = segment.large.as_mut().expect("a large segment");
        self.ranges_free[usize::from(ranges.is_mid())].take(slot, ranges, offset, rounded_bytes);
        segment.live.insert(
            offset,
            Live {
                allocated_bytes: rounded_bytes,
                requested_bytes: size_bytes,
            },
        );
        let placement = Placement {
            segment: segment.id,
            slot,
            offset_bytes: offset,
            requested_bytes: size_bytes,
            allocated_bytes: rounded_bytes,
            inner: None,
        };
        self.count_allocation(size_bytes, rounded_bytes);
        placement
    }

    /// The demand once a request holding `rounded_bytes` is placed: the most bytes ever allocated
    /// at once, this request included.
    fn demand_with(&self, rounded_bytes: u64) -> u64 {
        self.demand_high_water.max(
            self.stats
                .allocated_bytes
                .current
                .saturating_add(rounded_bytes),
        )
    }

    /// The most bytes the pool may hold, cache included, once a request holding `rounded_bytes`
    /// is placed: its demand (the most bytes ever allocated at once, this request included) plus
    /// `1 / cache_headroom_divisor` of it.
    fn cache_ceiling(&self, rounded_bytes: u64) -> u64 {
        let demand = self.demand_with(rounded_bytes);
        demand + demand / self.config.cache_headroom_divisor.max(1)
    }

    /// Counts the hand-over of `placement` from one owner to the next (the compute context's
    /// reuse of a range within its batch), or its move by a compaction, as what it is in the
    /// history: a free and an allocation of the same bytes. The current values and peaks do not move; the totals and the
    /// freed totals grow, so that the counters and a replay of the history agree.
    pub fn count_hand_over(&mut self, placement: &Placement) {
        self.stats.requested_bytes.sub(placement.requested_bytes);
        self.stats.allocated_bytes.sub(placement.allocated_bytes);
        self.stats.allocations.sub(1);
        self.count_allocation(placement.requested_bytes, placement.allocated_bytes);
    }

    fn count_allocation(&mut self, requested_bytes: u64, allocated_bytes: u64) {
        self.stats.requested_bytes.add(requested_bytes);
        self.stats.allocated_bytes.add(allocated_bytes);
        self.demand_high_water = self
            .demand_high_water
            .max(self.stats.allocated_bytes.current);
        self.stats.allocations.add(1);
    }

    /// Creates a segment of `segment_bytes` (or, when the budget or the device refuses, of
    /// `fallback_bytes` after giving back every empty segment) and returns its slot. On failure the
    /// error reports the bytes given back since `reserved_before`.
    fn grow(
        &mut self,
        requested_bytes: u64,
        segment_bytes: u64,
        fallback_bytes: u64,
        kind: Kind,
        reserved_before: u64,
    ) -> Result<usize, PolicyError> {
        match self.try_create(segment_bytes, kind) {
            Ok(slot) => Ok(slot),
            Err(first_error) => {
                if !self.config.is_naive() {
                    self.release_empty(|_| true);
                }
                self.try_create(fallback_bytes, kind)
                    .map_err(|device_error| {
                        let error = device_error.or(first_error);
                        // No segment was created on this path: reserved only went down.
                        let released = reserved_before - self.stats.reserved_bytes.current;
                        self.out_of_memory(requested_bytes, fallback_bytes, error, released)
                    })
            }
        }
    }

    /// `Err(None)`: over budget; `Err(Some(reason))`: the storage refused.
    fn try_create(&mut self, size_bytes: u64, kind: Kind) -> Result<usize, Option<String>> {
        let dedicated = matches!(kind, Kind::Dedicated | Kind::Ranges { mid: false });
        if let Some(budget) = self.config.budget_bytes {
            if self.stats.reserved_bytes.current + size_bytes > budget {
                return Err(None);
            }
        }
        let memory = self
            .storage
            .create_segment(size_bytes, dedicated)
            .map_err(|e| Some(e.reason))?;
        let allocator = if kind != Kind::Packed {
            None
        } else {
            Some(
                BuddyAllocator::with_capacity(
                    self.config.min_block_bytes,
                    size_bytes,
                    self.config.rounding,
                )
                .expect("segment sizes are validated powers of two"),
            )
        };
        let id = SegmentId(self.next_segment_id);
        self.next_segment_id += 1;
        let segment = Segment {
            id,
            memory,
            size_bytes,
            allocator,
            dedicated_in_use: false,
            large: match kind {
                Kind::Ranges { mid } => Some(Ranges::new(size_bytes, mid)),
                _ => None,
            },
            last_used: self.clock,
            live: BTreeMap::new(),
        };
        self.stats.create_segment_calls += 1;
        self.stats.reserved_bytes.add(size_bytes);
        self.stats.segments.add(1);
        self.events.push(SegmentEvent::Created { id, size_bytes });
        let slot = match self.vacant_slots.pop_first() {
            Some(slot) => {
                self.segments[slot] = Some(segment);
                slot
            }
            None => {
                self.segments.push(Some(segment));
                self.segments.len() - 1
            }
        };
        if let Kind::Ranges { mid } = kind {
            self.ranges_free[usize::from(mid)].add_segment(slot, size_bytes);
        }
        Ok(slot)
    }

    fn out_of_memory(
        &mut self,
        requested_bytes: u64,
        segment_bytes: u64,
        device_error: Option<String>,
        released_bytes: u64,
    ) -> PolicyError {
        self.stats.oom_count += 1;
        let stats = self.stats();
        PolicyError::OutOfMemory(Box::new(OutOfMemory {
            requested_bytes,
            segment_bytes,
            reserved_bytes: stats.reserved_bytes.current,
            allocated_bytes: stats.allocated_bytes.current,
            largest_free_bytes: stats.largest_free_bytes,
            external_fragmentation: stats.external_fragmentation(),
            budget_bytes: self.config.budget_bytes,
            device_error,
            released_bytes,
            free_bytes: stats.free_bytes,
            compaction: self.compaction_estimate(requested_bytes, CompactionLimits::default()),
        }))
    }

    /// Gives an allocation back. Its segment stays (cached, for reuse) until [`PoolCore::trim`] or
    /// growth releases it; a dedicated segment is given back at once when
    /// `dedicated_reuse_divisor` is 0.
    ///
    /// # Panics
    ///
    /// When `placement` was made by another pool (a bug in the caller).
    pub fn free(&mut self, placement: Placement) {
        let segment = self
            .segments
            .get_mut(placement.slot)
            .and_then(Option::as_mut);
        let segment = match segment {
            Some(segment) if segment.id == placement.segment => segment,
            _ => panic!("wgpu_pool::policy: a placement in segment {:?} was freed into a pool that does not hold it", placement.segment),
        };
        match (placement.inner, segment.allocator.as_mut()) {
            (Some(allocation), Some(allocator)) => {
                segment.live.remove(&allocation.offset());
                allocator.free(allocation);
            }
            (None, None) => match segment.large.as_mut() {
                Some(ranges) => {
                    segment.live.remove(&placement.offset_bytes);
                    self.ranges_free[usize::from(ranges.is_mid())].give(
                        placement.slot,
                        ranges,
                        placement.offset_bytes,
                        placement.allocated_bytes,
                    );
                }
                None => segment.dedicated_in_use = false,
            },
            _ => panic!(
                "wgpu_pool::policy: placement and segment {:?} disagree on being dedicated",
                placement.segment
            ),
        }
        self.clock += 1;
        segment.last_used = self.clock;
        self.stats.requested_bytes.sub(placement.requested_bytes);
        self.stats.allocated_bytes.sub(placement.allocated_bytes);
        self.stats.allocations.sub(1);
        if segment.allocator.is_none()
            && segment.is_empty()
            && (self.config.dedicated_reuse_divisor == 0 || self.config.is_naive())
        {
            self.destroy_slot(placement.slot);
        }
    }

    /// Gives back every empty segment (PyTorch's `empty_cache`). Returns the bytes given back.
    pub fn trim(&mut self) -> u64 {
        if self.config.is_naive() {
            // No segment of the naive mode outlives its allocation.
            return 0;
        }
        self.release_empty(|_| true)
    }

    fn release_empty(&mut self, mut which: impl FnMut(&Segment<S::Segment>) -> bool) -> u64 {
        let mut released = 0;
        for slot in 0..self.segments.len() {
            if self.segments[slot]
                .as_ref()
                .is_some_and(|s| s.is_empty() && which(s))
            {
                released += self.destroy_slot(slot);
            }
        }
        released
    }

    fn destroy_slot(&mut self, slot: usize) -> u64 {
        let segment = self.segments[slot].take().expect("slot holds a segment");
        if let Some(ranges) = &segment.large {
            self.ranges_free[usize::from(ranges.is_mid())].remove_segment(slot, ranges);
        }
        self.vacant_slots.insert(slot);
        self.stats.reserved_bytes.sub(segment.size_bytes);
        self.stats.segments.sub(1);
        self.events.push(SegmentEvent::Destroyed {
            id: segment.id,
            size_bytes: segment.size_bytes,
        });
        self.storage.destroy_segment(segment.memory);
        segment.size_bytes
    }
}

/// Compaction: moving live allocations to make room for a request in the segments held. The
/// policy decides and keeps the books; the caller copies the bytes (the replay only counts them).
///
/// The algorithm: a packed request of `size` needs a free aligned block of `size` rounded up to a
/// power of two (`B`); once such a block is free, the buddy core serves the request from it (its
/// coalescing is complete, so the block lies within one of the free run's canonical blocks). In
/// every packed segment the blocks of `B` that overlap live allocations are ranked by the bytes of
/// those allocations (then their count, then the offset); an allocation that straddles a block's
/// edge is moved whole. The blocks examined are, for each live allocation, the one holding its
/// start and the next one when it reaches into it: every block that could be cheapest, those with
/// free space and those held whole by allocations alike (issue 26, item 5: a block with no free
/// byte whose allocations are all movable is a window too). A mid-sized or large request needs a
/// free range of its rounded size in a segment of its class: in each, the ranges examined start at
/// the segment's start or at a live allocation's end, or end at a free gap's end or at the
/// segment's end (sliding a range down keeps or shrinks what it overlaps until its start meets an
/// allocation's end), ranked alike; for a large request, only those where the class's own rules
/// (fill and remainder, [`PolicyConfig::large_fill_eighths`]) would then take the range the moves
/// free, so that the request lands there. Each segment's [`COMPACTION_CANDIDATES`] cheapest windows
/// that can be emptied within the limits, moving only movable allocations, are candidates; all of
/// them are tried cheapest first (bytes, then allocations, then slot, then offset): the first whose
/// allocations fit, largest first, into the free space of the *other* segments of the class
/// (packed: a model of the buddy core's exact fit; free ranges: best fit, exactly as the
/// reservation takes them) is reserved there for real. The model places by sizes alone, so a window
/// is passed over, untried, when an earlier window of its segment failed at an allocation and the
/// largest allocations of this one, up to that many, have the same sizes (it would fail there too);
/// after [`COMPACTION_CANDIDATES`] failures the planner gives up. A destination in an empty segment
/// of free ranges is taken only where growing would not have given that segment back (within the
/// cache's ceiling with a new segment of the request) or where it is no larger than the request:
/// compacting never holds more than growing would. Destinations are never in the segment made room
/// in, so they never overlap the window, a source or a live allocation. The bound: a plan moves at
/// most `max_moved_factor` times the request's rounded size (1 by default: never more bytes than
/// the request) in at most `max_moves` allocations. Requests of dedicated segments and the naive
/// mode are never compacted for.
///
/// The cost, only when a request would otherwise grow the pool: ranking examines at most two
/// windows per live allocation (and per free gap) of the class, each O(log n + m) where m, the
/// allocations of the window looked at, is at most `max_moves + 1` (the count stops at the first
/// bound passed); then at most [`COMPACTION_CANDIDATES`] windows per segment are sorted, each
/// compared with the earlier failures in O(m log m) when its turn comes, and at most
/// [`COMPACTION_CANDIDATES`] model checks run, each O(live allocations of the class + m x
/// segments).
impl<S: SegmentStorage> PoolCore<S> {
    /// Places a request only where the pool has room now (a free range of a packed segment, or a
    /// cached dedicated segment): never creates or gives back a segment. `None` when it would have
    /// to grow, or for a request of 0 bytes or too large (which [`PoolCore::allocate`] explains).
    pub fn allocate_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        if !self.placeable(size_bytes) {
            return None;
        }
        if self.takes_dedicated(size_bytes) {
            if self.shares_large() {
                let rounded = self.large_rounded(size_bytes);
                return self.place_large_existing(size_bytes, rounded);
            }
            let slot = self.cached_dedicated(size_bytes)?;
            return Some(self.place_dedicated(slot, size_bytes));
        }
        self.place_packed_or_mid_existing(size_bytes)
    }

    /// Places a packed or mid-sized request where the pool has room now, in the order
    /// [`PoolCore::allocate`] tries: the request's own class first, then the other's free space.
    fn place_packed_or_mid_existing(&mut self, size_bytes: u64) -> Option<Placement> {
        if self.config.is_naive() {
            return None;
        }
        let mid = self.config.mid_above_bytes > 0;
        let rounded = self.rounded_size(size_bytes);
        if self.takes_mid(size_bytes) {
            self.place_mid_existing(size_bytes, rounded)
                .or_else(|| self.place_in_existing(size_bytes))
        } else {
            self.place_in_existing(size_bytes)
                .or_else(|| mid.then(|| self.place_mid_existing(size_bytes, rounded))?)
        }
    }

    /// What a compaction within `limits` would move to make room for `size_bytes` in the segments
    /// held, without moving anything: the plan [`PoolCore::compaction_plan`] would try first. A
    /// prediction (the model of free blocks may differ from the buddy core's choices); `None` when
    /// no block can be emptied within the limits, or for a request compaction cannot serve.
    pub fn compaction_estimate(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
    ) -> Option<CompactionEstimate> {
        self.compaction_estimate_where(size_bytes, limits, |_, _| true)
    }

    /// [`PoolCore::compaction_estimate`] moving only the allocations for which `movable(segment,
    /// offset)` is true: a block that overlaps another one is never chosen.
    pub fn compaction_estimate_where(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionEstimate> {
        let mut tries = Tries::default();
        for (window, slot) in self.compaction_candidates(size_bytes, limits, &movable) {
            let Some(sizes) = tries.admit(self, slot, &window) else {
                continue;
            };
            match self.predicted_destinations(slot, &window) {
                Ok(_) => return Some(self.estimate_of(slot, &window)),
                Err(placed) => tries.misfit(slot, &sizes, placed),
            }
            if tries.exhausted() {
                break;
            }
        }
        None
    }

    /// Plans moves that make room for a request of `size_bytes` in the segments held, and
    /// reserves their destinations (see the algorithm above). `None` when no window of any segment
    /// of the request's class can be emptied within `limits`, or for a request compaction cannot
    /// serve (0 bytes, too large, dedicated, naive mode). A plan with no moves means a free block already holds the
    /// request. Apply it with [`PoolCore::apply_moves`] once the bytes are copied, or cancel it
    /// with [`PoolCore::cancel_compaction`]; until then, allocate nothing else.
    pub fn compaction_plan(
        &mut self,
        size_bytes: u64,
        limits: CompactionLimits,
    ) -> Option<CompactionPlan> {
        self.compaction_plan_where(size_bytes, limits, |_, _| true)
    }

    /// [`PoolCore::compaction_plan`] moving only the allocations for which `movable(segment,
    /// offset)` is true (the GPU pool moves only those whose owner can follow them: a compute
    /// context's tensors).
    pub fn compaction_plan_where(
        &mut self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionPlan> {
        let candidates = self.compaction_candidates(size_bytes, limits, &movable);
        let mut tries = Tries::default();
        for (window, slot) in candidates {
            let Some(sizes) = tries.admit(self, slot, &window) else {
                continue;
            };
            match self.predicted_destinations(slot, &window) {
                Ok(destinations) => {
                    match self.reserve_moves(size_bytes, slot, &window, destinations) {
                        Some(plan) => return Some(plan),
                        None => tries.refused(slot, sizes),
                    }
                }
                Err(placed) => tries.misfit(slot, &sizes, placed),
            }
            if tries.exhausted() {
                break;
            }
        }
        None
    }

    /// Carries out `plan` in the books: each moved placement (found among `placements` by its
    /// segment and offset; others are passed over) now names its destination, and its source
    /// range is freed. Call it once the caller has copied every move's bytes. Afterwards the
    /// request fits in the plan's segment: [`PoolCore::allocate`] places it without growing. The
    /// statistics do not change (the same allocations hold the same bytes). Returns the bytes
    /// moved.
    ///
    /// # Errors
    ///
    /// [`CompactionError::MissingPlacement`] when a placement the plan moves was not given; the
    /// plan is then cancelled and nothing moves.
    pub fn apply_moves<'a>(
        &mut self,
        plan: CompactionPlan,
        placements: impl IntoIterator<Item = &'a mut Placement>,
    ) -> Result<u64, CompactionError> {
        let mut wanted: HashMap<(SegmentId, u64), usize> = plan
            .moves
            .iter()
            .enumerate()
            .map(|(index, m)| ((m.from_segment, m.from_offset), index))
            .collect();
        let mut matched: Vec<Option<&'a mut Placement>> = plan.moves.iter().map(|_| None).collect();
        for placement in placements {
            if wanted.is_empty() {
                break;
            }
            // A plan's sources are in packed segments or segments of free ranges, never in a
            // dedicated one: `(segment, offset)` names one placement.
            if let Some(index) = wanted.remove(&(placement.segment, placement.offset_bytes)) {
                matched[index] = Some(placement);
            }
        }
        if let Some(&(segment, offset)) = wanted.keys().min() {
            self.cancel_compaction(plan);
            return Err(CompactionError::MissingPlacement { segment, offset });
        }
        let CompactionPlan {
            moves,
            reserved,
            estimate,
            ..
        } = plan;
        for ((m, destination), placement) in moves.iter().zip(reserved).zip(matched) {
            let placement = placement.expect("every move was matched");
            assert_eq!(
                placement.allocated_bytes, m.bytes,
                "wgpu_pool::policy: the placement at offset {} of segment {:?} is not the allocation the plan moves",
                m.from_offset, m.from_segment
            );
            placement.segment = m.to_segment;
            placement.slot = m.to_slot;
            placement.offset_bytes = m.to_offset;
            match destination {
                Some(destination) => {
                    let source = placement
                        .inner
                        .replace(destination)
                        .expect("a moved placement is packed");
                    self.free_packed(m.from_slot, source);
                }
                None => {
                    assert!(
                        placement.inner.is_none(),
                        "wgpu_pool::policy: a packed placement in a plan's move between ranges"
                    );
                    self.give_range(m.from_slot, m.from_offset, m.bytes);
                }
            }
        }
        Ok(estimate.moved_bytes)
    }

    /// Drops `plan` without moving anything: its reserved destinations are freed.
    pub fn cancel_compaction(&mut self, plan: CompactionPlan) {
        self.release_reserved(&plan.moves, plan.reserved);
    }

    /// Plans moves that empty the segment `id` (packed, or of free ranges): every live allocation
    /// in it, each `movable(segment, offset)`, moved into free space of the other segments of its
    /// kind (as [`PoolCore::compaction_plan`] places them), at most `limits.max_moves` of them.
    /// `None` when the slot holds a dedicated segment or none, one of its allocations is not
    /// movable, there are too many, or they do not fit elsewhere. An empty segment gives a plan with no moves. Apply it
    /// with [`PoolCore::apply_moves`]; the emptied segment can then be given back
    /// ([`PoolCore::release_if_empty`]).
    pub fn evacuation_plan(
        &mut self,
        id: SegmentId,
        limits: CompactionLimits,
        movable: impl Fn(SegmentId, u64) -> bool,
    ) -> Option<CompactionPlan> {
        let slot = self.slot_of(id)?;
        let segment = self.segments[slot].as_ref()?;
        if segment.is_dedicated() {
            return None;
        }
        if segment.live.len() > limits.max_moves
            || segment
                .live
                .keys()
                .any(|&offset| !movable(segment.id, offset))
        {
            return None;
        }
        let window = Window {
            offset: 0,
            bytes: segment.size_bytes,
            moved_bytes: segment.live.values().map(|l| l.allocated_bytes).sum(),
            sources: segment.live.keys().copied().collect(),
        };
        let size_bytes = segment.size_bytes;
        let destinations = self.predicted_destinations(slot, &window).ok()?;
        self.reserve_moves(size_bytes, slot, &window, destinations)
    }

    /// Gives back the segment `id` if it is held and empty (a packed one made empty by
    /// compaction, say). Returns the bytes given back (0 when it is not).
    pub fn release_if_empty(&mut self, id: SegmentId) -> u64 {
        if self.config.is_naive() {
            return 0;
        }
        self.release_empty(|segment| segment.id == id)
    }

    /// Bytes of the live allocations in the packed segment or segment of free ranges `id` (0 for
    /// none, or a dedicated one).
    pub fn live_bytes(&self, id: SegmentId) -> u64 {
        self.slot_of(id)
            .and_then(|slot| self.segments[slot].as_ref())
            .map_or(0, |s| s.live.values().map(|l| l.allocated_bytes).sum())
    }

    /// The slot of the segment `id`, if it is held.
    fn slot_of(&self, id: SegmentId) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id))
    }

    /// Whether a request of `size_bytes` gets a segment of its own (always in the naive mode).
    fn takes_dedicated(&self, size_bytes: u64) -> bool {
        self.config.is_naive()
            || size_bytes
                > self
                    .config
                    .dedicated_above_bytes
                    .min(self.config.max_segment_bytes)
    }

    /// What a request of `size_bytes` needs free, or `None` for a request compaction cannot serve.
    fn compaction_target(&self, size_bytes: u64) -> Option<CompactionTarget> {
        if !self.placeable(size_bytes) || self.config.is_naive() {
            return None;
        }
        if self.takes_dedicated(size_bytes) {
            return self.shares_large().then(|| CompactionTarget::Ranges {
                mid: false,
                bytes: self.large_rounded(size_bytes),
            });
        }
        if self.takes_mid(size_bytes) {
            return Some(CompactionTarget::Ranges {
                mid: true,
                bytes: self.rounded_size(size_bytes),
            });
        }
        let units = size_bytes.div_ceil(self.config.min_block_bytes).max(1);
        Some(CompactionTarget::Packed {
            block_bytes: units.next_power_of_two() * self.config.min_block_bytes,
        })
    }

    /// The cheapest windows of each segment of the request's class that can be emptied within
    /// `limits` (at most [`COMPACTION_CANDIDATES`] per segment), all of them cheapest first
    /// (bytes, then allocations, then slot, then offset), each with its slot.
    fn compaction_candidates(
        &self,
        size_bytes: u64,
        limits: CompactionLimits,
        movable: &dyn Fn(SegmentId, u64) -> bool,
    ) -> Vec<(Window, usize)> {
        let Some(target) = self.compaction_target(size_bytes) else {
            return Vec::new();
        };
        if limits.max_moved_factor == 0 {
            return Vec::new();
        }
        let max_moved = self
            .rounded_size(size_bytes)
            .saturating_mul(limits.max_moved_factor);
        let mut candidates: Vec<(Window, usize)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(slot, segment)| {
                let segment = segment.as_ref()?;
                let id = segment.id;
                let movable = |offset| movable(id, offset);
                let windows = match target {
                    CompactionTarget::Packed { block_bytes } => {
                        segment.allocator.as_ref()?;
                        cheapest_windows(
                            &segment.live,
                            segment.size_bytes,
                            block_bytes,
                            (max_moved, limits.max_moves),
                            &movable,
                            COMPACTION_CANDIDATES,
                        )
                    }
                    CompactionTarget::Ranges { mid, bytes } => {
                        let ranges = segment.large.as_ref().filter(|r| r.is_mid() == mid)?;
                        // The request is placed by the class's own rule once the window is free:
                        // a large one only where that rule takes the range the window frees.
                        let accept = |window: &Window| {
                            mid || {
                                let (_, length) =
                                    range_after_moves(&segment.live, segment.size_bytes, window);
                                let used = ranges.allocated_bytes() - window.moved_bytes;
                                self.large_range_ok(length, used, bytes, segment.size_bytes)
                            }
                        };
                        cheapest_range_windows(
                            &segment.live,
                            segment.size_bytes,
                            bytes,
                            (max_moved, limits.max_moves),
                            &movable,
                            &accept,
                            COMPACTION_CANDIDATES,
                        )
                    }
                };
                Some(windows.into_iter().map(move |window| (window, slot)))
            })
            .flatten()
            .collect();
        candidates.sort_by_key(|(window, slot)| {
            (
                window.moved_bytes,
                window.sources.len(),
                *slot,
                window.offset,
            )
        });
        candidates
    }

    /// The allocations overlapping `window` in `slot`, largest first, each with the other segment
    /// of its class the model of free space places it in (packed: the tightest fit, as the policy
    /// places; free ranges: best fit). `Err(n)` when one of them fits nowhere: the `n`-th, counted
    /// from 1, largest first. The model decides by sizes alone, so any window of the same segment
    /// whose `n` largest allocations have these sizes fails the same way.
    fn predicted_destinations(
        &self,
        slot: usize,
        window: &Window,
    ) -> Result<Vec<(u64, Live, usize)>, usize> {
        let min_block = self.config.min_block_bytes;
        let Some(segment) = self.segments[slot].as_ref() else {
            return Err(0);
        };
        let mut sources: Vec<(u64, Live)> = window
            .sources
            .iter()
            .map(|offset| (*offset, segment.live[offset]))
            .collect();
        sources.sort_by_key(|(offset, live)| (std::cmp::Reverse(live.allocated_bytes), *offset));
        if sources.is_empty() {
            return Ok(Vec::new());
        }
        let mut destinations = Vec::with_capacity(sources.len());
        if let Some(ranges) = &segment.large {
            // Best fit over the free ranges of the class's other segments, as `reserve_range`
            // takes them: the model is exact.
            let mut model = self.ranges_free[usize::from(ranges.is_mid())]
                .without(|other| other == slot || !self.destination_ok(other, window.bytes));
            for (offset, live) in sources {
                let Some((to_slot, _)) = model.take_best_fit(live.allocated_bytes) else {
                    return Err(destinations.len() + 1);
                };
                destinations.push((offset, live, to_slot));
            }
            return Ok(destinations);
        }
        let mut models: Vec<(usize, FreeBlocks)> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != slot)
            .filter_map(|(other, s)| {
                let s = s.as_ref().filter(|s| s.allocator.is_some())?;
                Some((other, FreeBlocks::of(&s.live, s.size_bytes, min_block)))
            })
            .collect();
        for (offset, live) in sources {
            let units = live.allocated_bytes / min_block;
            let Some((index, order)) = models
                .iter()
                .enumerate()
                .filter_map(|(index, (_, model))| Some((index, model.smallest_fit(units)?)))
                .min_by_key(|&(index, order)| (order, index))
            else {
                return Err(destinations.len() + 1);
            };
            models[index].1.take(order, units);
            destinations.push((offset, live, models[index].0));
        }
        Ok(destinations)
    }

    fn estimate_of(&self, slot: usize, window: &Window) -> CompactionEstimate {
        CompactionEstimate {
            segment: self.segments[slot]
                .as_ref()
                .expect("a candidate's segment is held")
                .id,
            window_offset: window.offset,
            window_bytes: window.bytes,
            moves: window.sources.len(),
            moved_bytes: window.moved_bytes,
        }
    }

    /// Reserves the destinations of `window`'s allocations, in the predicted segments (or, when
    /// the buddy core's choices part from the model, in the tightest other packed segment). On
    /// failure, gives back what it reserved and returns `None`.
    fn reserve_moves(
        &mut self,
        size_bytes: u64,
        slot: usize,
        window: &Window,
        destinations: Vec<(u64, Live, usize)>,
    ) -> Option<CompactionPlan> {
        let estimate = self.estimate_of(slot, window);
        let mut moves = Vec::with_capacity(destinations.len());
        let mut reserved = Vec::with_capacity(destinations.len());
        let ranges_class = self.segments[slot]
            .as_ref()
            .and_then(|s| s.large.as_ref())
            .map(Ranges::is_mid);
        for (offset, live, predicted) in destinations {
            let destination = match ranges_class {
                Some(mid) => self
                    .reserve_range(mid, slot, window.bytes, live)
                    .map(|(to_slot, to_offset)| (to_slot, to_offset, None)),
                None => self
                    .reserve_in(predicted, live)
                    .or_else(|| {
                        let fallback = self.tightest_other(slot, live.requested_bytes)?;
                        self.reserve_in(fallback, live)
                    })
                    .map(|(to_slot, allocation)| (to_slot, allocation.offset(), Some(allocation))),
            };
            let Some((to_slot, to_offset, allocation)) = destination else {
                self.release_reserved(&moves, reserved);
                return None;
            };
            moves.push(Move {
                from_segment: estimate.segment,
                from_slot: slot,
                from_offset: offset,
                to_segment: self.segments[to_slot].as_ref().expect("held").id,
                to_slot,
                to_offset,
                bytes: live.allocated_bytes,
                requested_bytes: live.requested_bytes,
            });
            reserved.push(allocation);
        }
        Some(CompactionPlan {
            request_bytes: size_bytes,
            estimate,
            slot,
            moves,
            reserved,
        })
    }

    /// Whether a compaction that makes room for `request_bytes` may move an allocation into the
    /// segment of free ranges in `slot`: one that holds allocations, or an empty one that growing
    /// would not have given back (within the cache's ceiling with a new segment of the request)
    /// or that is no larger than the request. So compacting never holds more than growing would.
    fn destination_ok(&self, slot: usize, request_bytes: u64) -> bool {
        let Some(segment) = self.segments[slot].as_ref() else {
            return false;
        };
        !segment.is_empty()
            || segment.size_bytes <= request_bytes
            || (self.config.cache_headroom_divisor > 0
                && self.stats.reserved_bytes.current + request_bytes
                    <= self.cache_ceiling(request_bytes))
    }

    /// Reserves a destination for an allocation like `live` in the tightest free range of the
    /// mid-sized (`mid`) or large class outside the segment in `excluded`, where
    /// [`PoolCore::destination_ok`] allows it for a request of `request_bytes`: `(slot, offset)`.
    fn reserve_range(
        &mut self,
        mid: bool,
        excluded: usize,
        request_bytes: u64,
        live: Live,
    ) -> Option<(usize, u64)> {
        let (slot, offset) = self.ranges_free[usize::from(mid)]
            .best_fit(live.allocated_bytes, |_, slot| {
                slot != excluded && self.destination_ok(slot, request_bytes)
            })?;
        let index = &mut self.ranges_free[usize::from(mid)];
        let segment = self.segments[slot].as_mut()?;
        let ranges = segment.large.as_mut()?;
        index.take(slot, ranges, offset, live.allocated_bytes);
        segment.live.insert(offset, live);
        Some((slot, offset))
    }

    /// Reserves a destination for an allocation like `live` in `slot`.
    fn reserve_in(&mut self, slot: usize, live: Live) -> Option<(usize, buddy::Allocation)> {
        let segment = self.segments[slot].as_mut()?;
        let allocator = segment.allocator.as_mut()?;
        let allocation = allocator.allocate(live.requested_bytes).ok()?;
        debug_assert_eq!(
            allocation.allocated_size(allocator.min_block()),
            live.allocated_bytes
        );
        segment.live.insert(allocation.offset(), live);
        Some((slot, allocation))
    }

    /// The packed segment other than `excluded` with the tightest aligned fit for `size_bytes`.
    fn tightest_other(&self, excluded: usize, size_bytes: u64) -> Option<usize> {
        self.segments
            .iter()
            .enumerate()
            .filter(|(slot, _)| *slot != excluded)
            .filter_map(|(slot, s)| {
                Some((s.as_ref()?.allocator.as_ref()?.fit_order(size_bytes)?, slot))
            })
            .min()
            .map(|(_, slot)| slot)
    }

    fn release_reserved(&mut self, moves: &[Move], reserved: Vec<Option<buddy::Allocation>>) {
        for (m, allocation) in moves.iter().zip(reserved) {
            match allocation {
                Some(allocation) => self.free_packed(m.to_slot, allocation),
                None => self.give_range(m.to_slot, m.to_offset, m.bytes),
            }
        }
    }

    /// Frees `allocation` in the packed segment in `slot` and forgets its live entry (a moved
    /// source, or a plan's reserved destination): no statistics change.
    fn free_packed(&mut self, slot: usize, allocation: buddy::Allocation) {
        let segment = self.segments[slot]
            .as_mut()
            .expect("a plan's segment is held");
        segment.live.remove(&allocation.offset());
        segment
            .allocator
            .as_mut()
            .expect("a packed segment")
            .free(allocation);
    }

    /// Gives back `bytes` at `offset` of the segment of free ranges in `slot` and forgets its
    /// live entry (a moved source, or a plan's reserved destination): no statistics change.
    fn give_range(&mut self, slot: usize, offset: u64, bytes: u64) {
        let segment = self.segments[slot]
            .as_mut()
            .expect("a plan's segment is held");
        segment.live.remove(&offset);
        let ranges = segment.large.as_mut().expect("a segment of free ranges");
        self.ranges_free[usize::from(ranges.is_mid())].give(slot, ranges, offset, bytes);
    }
}

#[cfg(test)]
mod tests;

/// A storage that only counts: the replay's stand-in for a device. With a capacity, it refuses a
/// segment that would take its total past it, as a device out of memory would.
#[derive(Debug, Clone, Default)]
pub struct SimulatedStorage {
    /// The device memory available, in bytes; `None` for unlimited.
    pub capacity_bytes: Option<u64>,
    /// Bytes of segments now held, in bytes.
    pub held_bytes: u64,
}

impl SimulatedStorage {
    /// A simulated device of `capacity_bytes` (or unlimited).
    pub fn new(capacity_bytes: Option<u64>) -> Self {
        Self {
            capacity_bytes,
            held_bytes: 0,
        }
    }
}

impl SegmentStorage for SimulatedStorage {
    type Segment = u64;

    fn create_segment(&mut self, size_bytes: u64, _dedicated: bool) -> Result<u64, StorageError> {
        if let Some(capacity) = self.capacity_bytes {
            if self.held_bytes.saturating_add(size_bytes) > capacity {
                return Err(StorageError {
                    size_bytes,
                    reason: format!(
                        "simulated device of {capacity} bytes has {} bytes free",
                        capacity.saturating_sub(self.held_bytes)
                    ),
                });
            }
        }
        self.held_bytes = self.held_bytes.saturating_add(size_bytes);
        Ok(size_bytes)
    }

    fn destroy_segment(&mut self, segment: u64) {
        self.held_bytes = self.held_bytes.saturating_sub(segment);
    }
}
