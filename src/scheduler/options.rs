//! How a scheduler admits and batches: [`SchedulerOptions`], [`Admission`].

use super::error::SchedulerError;

/// How requests are admitted into the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Admission {
    /// A request is admitted when every block it can reach (its prompt and all its outputs) is
    /// free; the blocks are promised to it, so no sequence is ever preempted.
    #[default]
    Reserve,
    /// A request is admitted when the blocks of its prompt are free with `watermark` of the
    /// cache's blocks left over (vLLM's way); when a running sequence needs a block and none is
    /// free, the newest running sequence is preempted: its blocks freed, and its prompt and the
    /// tokens it has recomputed when it is admitted again. More sequences in flight, never an
    /// out-of-memory error. Paged layouts only.
    Optimistic {
        /// The share of the cache's blocks (0 ≤ watermark < 1) that admission leaves free.
        watermark: f64,
    },
}

/// How a [`Scheduler`](crate::scheduler::Scheduler) batches.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerOptions {
    /// The most sequences running at once (and so sampled in one step).
    pub max_batch: usize,
    /// The most token rows in one step (decode rows and prompt rows); at least `max_batch`.
    pub max_step_tokens: usize,
    /// Steps are padded to at least this many rows (then to a power of two).
    pub min_step_rows: usize,
    /// Block table columns: the most blocks one sequence holds (the model's context in blocks).
    pub max_blocks: usize,
    /// How requests are admitted.
    pub admission: Admission,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            max_batch: 16,
            max_step_tokens: 512,
            min_step_rows: 1,
            max_blocks: 64,
            admission: Admission::Reserve,
        }
    }
}

impl SchedulerOptions {
    /// Refuses options that schedule nothing.
    pub fn check(&self) -> Result<(), SchedulerError> {
        let refuse = |reason| Err(SchedulerError::Options(reason));
        if self.max_batch == 0 || self.max_blocks == 0 {
            return refuse("max_batch and max_blocks must be at least 1");
        }
        if self.max_step_tokens < self.max_batch {
            return refuse(
                "max_step_tokens must be at least max_batch (one row per decoding sequence)",
            );
        }
        if self.min_step_rows == 0 || self.min_step_rows > self.max_step_tokens {
            return refuse("min_step_rows must be in 1..=max_step_tokens");
        }
        if let Admission::Optimistic { watermark } = self.admission {
            if !(0.0..1.0).contains(&watermark) {
                return refuse("an optimistic admission's watermark must be in 0..1");
            }
        }
        Ok(())
    }
}
