//! A request's state in the scheduler, and what it reports when done: [`Completion`].

use std::time::Duration;
use web_time::Instant;

/// A finished request: its tokens and when they came.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The id `submit` returned.
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
    /// Times it was preempted (its blocks freed and its tokens recomputed).
    pub preemptions: u32,
    /// Prompt tokens whose keys and values it found in the cache (prefix caching), at its
    /// first admission.
    pub cached_tokens: usize,
}

impl Completion {
    /// Time per output token after the first: `(last − first) / (outputs − 1)`; `None` for one
    /// output.
    pub fn time_per_output_token(&self) -> Option<Duration> {
        let later = self.output.len().checked_sub(1).filter(|&n| n > 0)?;
        Some((self.time_to_last_token - self.time_to_first_token) / later as u32)
    }
}

/// A request waiting or running.
#[derive(Debug, Clone)]
pub(super) struct Sequence {
    pub(super) id: u64,
    pub(super) prompt: Vec<u32>,
    pub(super) max_new_tokens: usize,
    pub(super) output: Vec<u32>,
    /// Tokens (prompt, then outputs) whose keys and values are in the cache or being written
    /// by a step submitted.
    pub(super) computed: usize,
    /// Whether a step in flight samples its next token.
    pub(super) pending: bool,
    /// Full blocks whose tokens were committed to the prefix cache.
    pub(super) committed_blocks: usize,
    pub(super) submitted: Instant,
    pub(super) first: Option<Instant>,
    pub(super) waited: bool,
    pub(super) preemptions: u32,
    pub(super) cached_tokens: Option<usize>,
}

impl Sequence {
    /// Tokens known on the host: the prompt and the outputs read.
    pub(super) fn known(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Known tokens and the one a step in flight samples.
    pub(super) fn reached(&self) -> usize {
        self.known() + usize::from(self.pending)
    }

    /// Token `index` of the prompt and outputs.
    pub(super) fn token(&self, index: usize) -> u32 {
        match index.checked_sub(self.prompt.len()) {
            None => self.prompt[index],
            Some(output) => self.output[output],
        }
    }

    /// The prompt and the outputs read.
    pub(super) fn tokens(&self) -> Vec<u32> {
        let mut tokens = self.prompt.clone();
        tokens.extend(&self.output);
        tokens
    }

    /// The most tokens it holds in the cache (the last output is sampled, never run).
    pub(super) fn reach(&self) -> usize {
        self.prompt.len() + self.max_new_tokens - 1
    }

    /// Whether every output is read, or sampled by the step in flight.
    pub(super) fn sampled_all(&self) -> bool {
        self.output.len() + usize::from(self.pending) >= self.max_new_tokens
    }

    /// Whether every output is read.
    pub(super) fn done(&self) -> bool {
        self.output.len() >= self.max_new_tokens
    }

    /// The report of a finished request.
    pub(super) fn complete(self, now: Instant) -> Completion {
        let first = self.first.unwrap_or(now);
        Completion {
            id: self.id,
            prompt: self.prompt,
            output: self.output,
            time_to_first_token: first - self.submitted,
            time_to_last_token: now - self.submitted,
            waited: self.waited,
            preemptions: self.preemptions,
            cached_tokens: self.cached_tokens.unwrap_or(0),
        }
    }
}
