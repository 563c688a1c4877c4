//! What a server reports: each finished request ([`Completion`]) and its running totals
//! ([`ServerStats`]).

use crate::paging::KvPeak;

pub use crate::scheduler::Completion;

/// What a server has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ServerStats {
    /// Steps run.
    pub steps: u64,
    /// Token rows run, padding apart.
    pub rows: u64,
    /// Token rows run, padding included.
    pub padded_rows: u64,
    /// Token rows whose token the GPU took from the step before, unread by the host
    /// (pipelined steps, [`Server::step_ahead`](crate::serve::Server::step_ahead)).
    pub fed_rows: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Sequences in each step, summed (over `steps` for the mean).
    pub in_flight_sum: u64,
    /// The most sequences in one step.
    pub in_flight_max: usize,
    /// Requests admission kept waiting for memory at least once. Pipelined steps admit before
    /// the step in flight retires the sequences it finishes, so a request may wait a step more
    /// than with synchronous ones.
    pub waits: u64,
    /// Steps at which a request waited for memory.
    pub wait_steps: u64,
    /// Sequences preempted to free memory (never with
    /// [`Admission::Reserve`](crate::scheduler::Admission::Reserve), which promises every block
    /// a sequence can reach).
    pub preemptions: u64,
    /// Tokens computed again after preemption.
    pub recomputed_tokens: u64,
    /// Prompt tokens whose keys and values admission found in the cache (prefix caching).
    pub cached_tokens: u64,
    /// KV blocks held at the cache's peak, and the tokens they held then.
    pub kv_peak: KvPeak,
    /// Seconds spent in steps (host and GPU).
    pub step_seconds: f64,
    /// Seconds spent in decode-only steps, and their count: the decode step's cost. Pipelined
    /// ([`Server::step_ahead`](crate::serve::Server::step_ahead)), a call's time — submitting one step and finishing the one
    /// before — counts to the step it submits.
    pub decode_step_seconds: f64,
    /// Decode-only steps.
    pub decode_steps: u64,
}
