#![deny(unsafe_code)]
//! The bookkeeping of serving a decoder with a paged KV cache, on the host: which blocks of the
//! cache each sequence holds, what a step's rows are, and the streams of requests a server is
//! measured on. Pure: no GPU, no wgpu; [`crate::serve`] runs the steps.
//!
//! - [`BlockManager`]: a cache of fixed-size blocks given to sequences, [`KvLayout::Paged`]
//!   (block by block, anywhere) or [`KvLayout::Contiguous`] (one run per sequence for its
//!   maximum length); admission promises each sequence every block it can reach, so that an
//!   admitted sequence never meets a full cache; [`BlockManager::capacity_for`] answers "how
//!   many sequences of length L fit?"; [`KvPeak`] is the fill at its peak (KV waste).
//! - [`StepRows`]: one step's token rows (prompt tokens and decode tokens mixed), their
//!   positions and block tables, and the rows sampled, padded to a planned row count.
//! - [`StreamSpec`], [`RequestSpec`]: seeded request streams; [`Traffic`], [`TimedRequest`]:
//!   their arrivals (all at once, or Poisson at a rate) and shared prompt prefixes;
//!   [`percentile`].
//!
//! # Files
//!
//! - `error.rs`: [`PagingError`].
//! - `blocks.rs`: [`BlockManager`], [`KvLayout`], [`KvPeak`].
//! - `step.rs`: [`StepRows`].
//! - `stream.rs`: [`StreamSpec`], [`RequestSpec`], [`Traffic`], [`TimedRequest`], [`percentile`].

mod blocks;
mod error;
mod step;
mod stream;
#[cfg(test)]
mod tests;

pub use blocks::{AdmitRule, BlockManager, BlockState, KvLayout, KvPeak, PrefixStats};
pub use error::PagingError;
pub use step::StepRows;
pub use stream::{percentile, RequestSpec, StreamSpec, TimedRequest, Traffic};
