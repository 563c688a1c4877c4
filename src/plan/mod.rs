#![deny(unsafe_code)]
//! Memory planning for buffers whose lifetimes are known in advance, the way TFLite's arena
//! planner and MiniMalloc plan a model's intermediates: each [`Buffer`] (size, lifetime
//! `[lower, upper)`) gets an offset in one arena (or in several, each at most
//! [`PlanOptions::max_arena_bytes`], e.g. the device's `max_storage_buffer_binding_size`), aligned
//! to [`PlanOptions::alignment`], so that no two buffers alive at the same time share a byte.
//! Pure offset arithmetic: no GPU, no wgpu, nothing else of the crate.
//!
//! - [`greedy_by_size`] is the baseline: TFLite's greedy-by-size planner.
//! - [`plan`] is the planner: several orderings under best and first fit, randomised bottom-up
//!   skyline constructions that keep lifetimes tileable, an iterated local search over the
//!   ordering, and branch and bound for small instances. It is never worse than the baseline and
//!   is deterministic (the search is bounded by a step count, not a clock, and its random numbers
//!   come from a fixed seed).
//! - [`max_live_bytes`] is the lower bound (the most bytes alive at one step); [`Plan`] reports
//!   the heap beside it, and [`Plan::check`] verifies a plan.
//!
//! Bad input is a [`PlanError`], never a panic: empty or inverted lifetimes, duplicate ids, an
//! alignment that is not a power of two, sizes whose aligned sum overflows `u64`, a buffer larger
//! than the arena limit, a plan above the capacity.
//!
//! ```
//! use wgpu_pool::plan::{greedy_by_size, plan, Buffer, PlanOptions};
//!
//! // (id, lower, upper, size): 0 and 1 are alive together, 2 can reuse the memory of 0.
//! let buffers = [
//!     Buffer::new(0, 0, 2, 1000),
//!     Buffer::new(1, 1, 3, 500),
//!     Buffer::new(2, 2, 4, 800),
//! ];
//! let options = PlanOptions::aligned(256);
//! let planned = plan(&buffers, &options)?;
//! planned.check(&buffers, None)?;
//! assert_eq!(planned.max_live_bytes, 1500);
//! assert!(planned.heap_bytes <= greedy_by_size(&buffers, &options)?.heap_bytes);
//! assert!(planned.placements.iter().all(|p| p.offset % 256 == 0));
//! # Ok::<(), wgpu_pool::plan::PlanError>(())
//! ```
//!
//! # Files
//!
//! Bottom up; each file uses only those above it in this list.
//!
//! - `buffers.rs`: [`Buffer`], [`PlanOptions`], [`Plan`], [`Placement`], [`PlanError`],
//!   [`max_live_bytes`], [`Plan::check`].
//! - `rng.rs`: SplitMix64, the search's random numbers.
//! - `problem.rs`: validation, sizes rounded up to the alignment (with aligned offsets a buffer
//!   blocks exactly its rounded size), conflict lists (the buffers alive at the same time as
//!   each), the lower bound, offsets turned into a [`Plan`].
//! - `place.rs`: the decoder: buffers placed one by one in an order, each at the smallest (best
//!   fit) or lowest (first fit) gap large enough among the buffers placed before it that overlap
//!   it in time, else above them; it looks only at a buffer's conflict list, and re-places only
//!   from the first position of an order that changed.
//! - `skyline.rs`: the skyline construction.
//! - `exact.rs`: branch and bound over plans in which every buffer rests on 0 or on another.
//! - `greedy.rs`: [`greedy_by_size`].
//! - `search.rs`: [`plan`].
//!
//! # Measurements
//!
//! MiniMalloc's public benchmarks (`benchmarks/asplos2024/{A..K}.1048576.csv` of
//! google/minimalloc; `challenging/{B,C,J}` and `challenge/{D,H,K}` hold the same buffers), planned
//! by `cargo run --release --example plan -- FILE` with the default options (alignment 1), on the
//! 2-core Xeon dev machine (no GPU) while three other builds shared it. Heap bytes are exact and
//! repeatable; seconds are the planner's wall time, over three runs.
//!
//! MEASUREMENTS

mod buffers;
mod exact;
mod greedy;
mod place;
mod problem;
mod rng;
mod search;
mod skyline;
#[cfg(test)]
mod tests;

pub use buffers::{max_live_bytes, Buffer, Placement, Plan, PlanError, PlanOptions};
pub use greedy::greedy_by_size;
pub use search::plan;
