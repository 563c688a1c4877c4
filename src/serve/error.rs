//! Why serving refuses: [`ServeError`].

use crate::compute::ComputeError;
use crate::model::{TokensError, WeightsError};
use crate::paging::PagingError;
use crate::scheduler::SchedulerError;

/// Why a model, a KV cache, a server or a request is refused, or a step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A kernel, tensor or plan failed (out of memory included).
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// Weights that cannot serve this model.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// A request's tokens cannot be run.
    #[error("request refused: {0}")]
    Tokens(#[from] TokensError),
    /// The KV cache's bookkeeping refused.
    #[error(transparent)]
    Paging(#[from] PagingError),
    /// A step failed (the device lost, a wait timed out, an op refused): the requests the
    /// server was running were stopped, their KV blocks freed, so that what it holds stays
    /// consistent; the waiting ones are kept, and steps go on with them.
    #[error("a step failed and stopped requests {stopped:?}: {source}")]
    StepFailed {
        /// Why.
        source: Box<ServeError>,
        /// The requests stopped, in the order they were admitted.
        stopped: Vec<u64>,
    },
    /// A request of no output tokens.
    #[error("request refused: it asks for no output tokens")]
    NoOutputs,
    /// An id the server does not hold (never submitted, cancelled, or finished and taken).
    #[error("request {id} is not waiting, in flight or finished")]
    UnknownRequest {
        /// The id.
        id: u64,
    },
    /// Options that describe no usable server.
    #[error("server options: {0}")]
    Options(String),
    /// The scheduler refused (a step scheduled or finished out of turn, its options).
    #[error(transparent)]
    Scheduler(SchedulerError),
    /// A step's sampled token that is no id of the vocabulary (missing, not an integer, out of
    /// range): never turned into a token.
    #[error("sample {sample} of a step came back as {value}, no token of the vocabulary")]
    BadSample {
        /// Its index among the step's sampled rows.
        sample: usize,
        /// What came back (NaN where nothing did).
        value: f32,
    },
    /// A step of a row count no plan was captured for.
    #[error("no step plan of {rows} rows")]
    NoPlan {
        /// The step's rows.
        rows: usize,
    },
    /// An eager step given rows whose tokens the GPU should take from the step before: eager
    /// steps read their tokens.
    #[error("eager steps read their tokens: no row is fed on the GPU")]
    FedEagerStep,
    /// A step that changed nothing while requests remain (it would loop forever).
    #[error("a step made no progress")]
    NoProgress,
    /// The memory budget leaves no room for the KV cache the options need.
    #[error("budget of {budget_bytes} bytes: weights {weights_bytes}, step activations {activation_bytes}, and a KV cache of at least {kv_min_bytes} do not fit (the pool reserved {reserved_bytes} before the cache, its segments rounding the weights and activations up)")]
    Budget {
        /// The budget.
        budget_bytes: u64,
        /// What the pool reserved before the cache (the weights, the planned activations and
        /// the eager steps' share, as its segments round them).
        reserved_bytes: u64,
        /// The weights' bytes.
        weights_bytes: u64,
        /// The planned steps' activations.
        activation_bytes: u64,
        /// The smallest KV cache that serves one sequence of the model's context (or the cache
        /// of `kv_blocks` blocks, when given with the budget).
        kv_min_bytes: u64,
    },
}

impl From<SchedulerError> for ServeError {
    fn from(error: SchedulerError) -> Self {
        match error {
            SchedulerError::Paging(error) => ServeError::Paging(error),
            SchedulerError::NoOutputs => ServeError::NoOutputs,
            SchedulerError::UnknownRequest { id } => ServeError::UnknownRequest { id },
            other => ServeError::Scheduler(other),
        }
    }
}
