#![deny(unsafe_code)]
//! What a server runs next, decided on the host with no GPU: the queues of requests, their
//! admission into the KV cache, preemption, prefix sharing and each step's rows. Pure: no wgpu;
//! [`crate::serve`] executes the steps this returns and hands back their sampled tokens.
//!
//! - [`Scheduler`]: requests wait in order of submission; each [`Scheduler::schedule`] admits
//!   what fits ([`Admission::Reserve`]: every block a request can reach must be free;
//!   [`Admission::Optimistic`]: free blocks stay above a watermark), gives every running
//!   sequence its rows (the newest token of each decoding one, then prompt chunks up to
//!   [`SchedulerOptions::max_step_tokens`]), preempts the newest sequence when one needs a
//!   block and none is free (its blocks freed, its prompt and the tokens it has recomputed
//!   when it is admitted again), and returns a [`ScheduledStep`]; [`Scheduler::finish`] takes
//!   the step's sampled tokens and retires the sequences that have all theirs.
//! - Prefix caching is the block manager's ([`BlockManager::with_prefix_caching`]): admission
//!   finds the whole blocks of a prompt already in the cache, and the sequence starts after
//!   them.
//! - Steps may be pipelined: a step may be scheduled while the one before is in flight, its
//!   decoding rows taking their newest token on the GPU from that step's samples
//!   ([`StepRows::push_fed`](crate::paging::StepRows::push_fed)).
//!
//! ```
//! use web_time::Instant;
//! use wgpu_pool::paging::{BlockManager, KvLayout, RequestSpec};
//! use wgpu_pool::scheduler::{Scheduler, SchedulerOptions};
//!
//! let blocks = BlockManager::new(KvLayout::Paged, 4, 64)?.with_prefix_caching(true)?;
//! let options = SchedulerOptions { max_blocks: 8, ..SchedulerOptions::default() };
//! let mut scheduler = Scheduler::new(options, blocks)?;
//! let id = scheduler.submit(&RequestSpec { prompt: vec![5, 6, 7], max_new_tokens: 2 }, Instant::now())?;
//! while let Some(step) = scheduler.schedule()? {
//!     // A model would run `step.rows` here; say it samples token 9 for every sampled row.
//!     let tokens = vec![9; step.samples.len()];
//!     scheduler.finish(&tokens, Instant::now())?;
//! }
//! assert_eq!(scheduler.take_finished()[0].output, vec![9, 9]);
//! assert_eq!(scheduler.tokens(id), None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Files
//!
//! - `error.rs`: [`SchedulerError`].
//! - `options.rs`: [`SchedulerOptions`], [`Admission`].
//! - `sequence.rs`: a request's state, [`Completion`].
//! - `engine.rs`: [`Scheduler`], [`ScheduledStep`], [`SchedulerStats`].

mod engine;
mod error;
mod options;
mod sequence;
#[cfg(test)]
mod tests;

pub use engine::{ScheduledStep, Scheduler, SchedulerStats};
pub use error::SchedulerError;
pub use options::{Admission, SchedulerOptions};
pub use sequence::Completion;

#[cfg(doc)]
use crate::paging::BlockManager;
