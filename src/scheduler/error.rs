//! Why the scheduler refuses: [`SchedulerError`].

use crate::paging::PagingError;

/// Why a request, a step or an option is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// The KV cache's bookkeeping refused (a request the empty cache can never admit, ...).
    #[error(transparent)]
    Paging(#[from] PagingError),
    /// Options that describe no usable scheduler.
    #[error("scheduler options: {0}")]
    Options(&'static str),
    /// A request of no output tokens.
    #[error("request refused: it asks for no output tokens")]
    NoOutputs,
    /// A request of no prompt tokens.
    #[error("request refused: its prompt is empty")]
    EmptyPrompt,
    /// An id the scheduler does not hold (never submitted, cancelled, or finished and taken).
    #[error("request {id} is not waiting, in flight or finished")]
    UnknownRequest {
        /// The id.
        id: u64,
    },
    /// A call that needs no step in flight, or a third step scheduled with two in flight.
    #[error("{0}: finish the step in flight first")]
    StepInFlight(&'static str),
    /// [`Scheduler::finish`](crate::scheduler::Scheduler::finish) with no step in flight.
    #[error("no step is in flight")]
    NoStepInFlight,
    /// A step's tokens that do not cover its sampled rows.
    #[error("a step sampled {samples} rows but {tokens} tokens came back")]
    MissingSamples {
        /// Rows the step sampled.
        samples: usize,
        /// Tokens given.
        tokens: usize,
    },
}
