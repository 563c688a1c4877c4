//! The pool's policy: which segment serves a request, when to grow and by how much, when to give
//! segments back, and the budget. It lays each segment out by the size class it serves
//! ([`SegmentClass`]: a [`BuddyAllocator`](crate::buddy::BuddyAllocator) for packed ones, free
//! ranges for mid-sized and large ones) and asks a `SegmentStorage` for the memory behind each
//! segment.
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
//! - **Mid-sized** (above 1 MiB, up to `large_above_bytes`, 16 MiB by default): segments of
//!   exact-fit free ranges (address-ordered, coalescing on free; `ranges.rs`), the tightest free
//!   range of any of them, cut from its start; then free space of the packed segments, before
//!   growing. A new one is sized as a packed one but holds at least two requests of the size that
//!   made it (rounded up to a power of two, at most `max_segment_bytes` and half the demand).
//!   Packed in buddy blocks, requests of 1-16 MiB left the packed segments 72% and 55% full at
//!   the peaks of `gpt_train` and `vit_train` (1.4 GiB holding 1.0; 1.8 holding 1.0).
//! - **Large** (above `large_above_bytes`): segments of exact-fit free ranges too, each created
//!   of the request's size, shared by later large requests: a request takes the tightest free range
//!   of any large segment that leaves the segment at least `large_fill_eighths / 8` (6/8) full and
//!   leaves beside it either a remainder another large request could use (above
//!   `large_above_bytes`) or one of at most `1 / large_remainder_divisor` (1/4) of the request.
//!   So the space one large request frees serves requests of other sizes, and a freed range
//!   coalesces with its neighbours; but a small request does not pin a mostly free segment that a
//!   later large request would reuse whole, and a remainder that no large request could use is not
//!   left as waste. When nothing fits, a new segment of the request's size. When the budget or the
//!   device refuses it, any free range that fits serves the request whatever the two rules.
//!   `PoolCore::allocate_own_segment` places a request of any size this way (the pool's
//!   `allocate_in_own_segment`), so that what it reserves is known beforehand: its size rounded
//!   to a block.
//! - **A cache bounded by demand**: empty segments stay cached while the pool keeps within a
//!   headroom of `1 / cache_headroom_divisor` (1/32 by default) over its demand, the most bytes
//!   ever allocated at once. Before a new segment is created, empty segments (which could not
//!   serve the request) are given back, least recently used first, only while the reserved bytes
//!   with the new segment would pass `demand * (1 + 1/32)`. So the peak reserved is at most
//!   demand plus the headroom, or what the segments holding live allocations force, whichever is
//!   more; below that ceiling nothing is given back, which spares `create_buffer` calls and zero
//!   fills.
//! - **Budget and out of memory**: when a new segment would pass the budget, or the storage
//!   refuses it, every empty segment is given back and the request is tried again with a segment
//!   of exactly its rounded size (as PyTorch frees its cache and retries). When the budget would
//!   refuse that too, nothing is given back: the refusal leaves the statistics as they were (but
//!   for the OOM count). When the storage refuses, the empty segments given back while trying stay
//!   given back, and the error says how many bytes that was ([`OutOfMemory::released_bytes`]).
//! - **Compaction**, when the caller asks for it: `PoolCore::compaction_plan` moves live
//!   allocations (at most the request's size by default) out of one range of a segment of the
//!   request's class (an aligned block of a packed segment; a range of the request's size of a
//!   mid-sized or large one) into free space of the other segments of that class, so that a
//!   request fits without a new segment; the caller copies the bytes and applies the plan
//!   (`PoolCore::apply_moves`). The pool does not compact on its own; the replay's
//!   `pool_compact` does before every growth.
//!
//! # The naive mode
//!
//! [`PolicyConfig::naive`] is the baseline "one buffer per allocation", as a mode of the same
//! policy ([`PolicyMode::Naive`]): every request gets a segment of its own
//! ([`SegmentClass::Dedicated`], the only class of that mode), of the request rounded
//! up to `min_block_bytes` (the copy alignment, 4 bytes on a GPU), given back as soon as it is
//! freed; nothing is reused or cached. The GPU pool, the replay and the reports run it through the
//! same `PoolCore` as the pool, so their figures are counted the same way.
//!
//! # Where it is written
//!
//! One concern a file: `config.rs` (the settings), `error.rs` (refusals and the out-of-memory
//! text), `stats.rs` (the counters), `storage.rs` (the storage trait and the simulated one),
//! `segment.rs` (a segment's layout by class, placements), `ranges.rs` (free ranges of the
//! mid-sized and large classes), `engine.rs` (the books: segments held, creation, destruction),
//! `place.rs` (which class a request is in, and placement within each class), `growth.rs` (new
//! segments' sizes, the cache, the budget, out of memory), `windows.rs` (compaction's
//! arithmetic: the cheapest windows to empty, the model of where their allocations fit),
//! `compaction.rs` (compaction's planner), `moves.rs` (a plan's moves as data).
//!
//! # The figures that chose it
//!
//! The replays that chose these rules (peak reserved over peak requested and segments created on
//! nine PyTorch traces of an H200), and the variants tried and not kept, are in MEASUREMENTS.md
//! (under "Replay of real PyTorch traces": "The policy's research log").

#![deny(unsafe_code)]

mod compaction;
mod config;
mod engine;
mod error;
mod growth;
mod moves;
mod place;
mod ranges;
mod segment;
mod stats;
mod storage;
mod windows;

#[cfg(test)]
mod tests;

pub use compaction::COMPACTION_CANDIDATES;
pub use config::{PolicyConfig, PolicyMode, DEFAULT_MAX_SEGMENT_BYTES};
pub(crate) use engine::PoolCore;
pub use error::{CompactionError, OutOfMemory, PolicyError};
pub use moves::CompactionEstimate;
pub(crate) use moves::CompactionPlan;
pub(crate) use segment::{Placement, SegmentEvent};
pub use segment::{SegmentClass, SegmentId};
pub use stats::{Counter, PoolStats};
pub(crate) use storage::{SegmentStorage, SimulatedStorage, StorageError};
pub use windows::CompactionLimits;
