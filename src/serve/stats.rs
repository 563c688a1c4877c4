//! What a server reports: each finished request ([`Completion`]) and its running totals
//! ([`ServerStats`]).

use std::time::Duration;

use crate::paging::KvPeak;

/// A finished request: its tokens and when they came.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The id [`Server::submit`](crate::serve::Server::submit) returned.
    pub id: u64,
    /// The prompt.
    pub prompt: Vec<u32>,
    /// The generated tokens (greedy), `max_new_tokens` of them.
    pub output: Vec<u32>,
    /// From submission to the first generated token on the host.
    pub time_to_first_token: Duration,
    /// From submission to the last.
    pub time_to_last_token: Duration,
    /// Whether admission made it wait for memory at least once.
    pub waited: bool,
}

impl Completion {
    /// Time per output token after the first: `(last − first) / (outputs − 1)`; `None` for one
    /// output.
    pub fn time_per_output_token(&self) -> Option<Duration> {
        let later = self.output.len().checked_sub(1).filter(|&n| n > 0)?;
        Some((self.time_to_last_token - self.time_to_first_token) / later as u32)
    }
}

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
    /// Sequences stopped to free memory (never: admission promises every block a sequence can
    /// reach).
    pub preemptions: u64,
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
