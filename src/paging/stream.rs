//! Seeded streams of generation requests: [`StreamSpec`], [`RequestSpec`].

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

use super::error::PagingError;

/// One request: its prompt's token ids and how many tokens to generate (greedily, all of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate.
    pub max_new_tokens: usize,
}

impl RequestSpec {
    /// The most tokens the request's sequence reaches: its prompt and its outputs (`usize::MAX`
    /// where their sum would pass it). The cache holds one fewer: the last output is sampled
    /// and never run through the model.
    pub fn reach_tokens(&self) -> usize {
        self.prompt.len().saturating_add(self.max_new_tokens)
    }
}

/// A stream of requests drawn from a stated distribution: prompt lengths uniform in
/// `prompt_tokens` (inclusive), output lengths uniform in `output_tokens` (inclusive), each
/// prompt token uniform in `0..vocab_size`; where a draw passes `max_tokens`, the output is cut
/// to fit (then the prompt, keeping one output token). Seeded: one SplitMix64 stream, the same
/// requests for the same spec everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSpec {
    /// Requests.
    pub requests: usize,
    /// Prompt lengths, inclusive.
    pub prompt_tokens: (usize, usize),
    /// Output lengths, inclusive.
    pub output_tokens: (usize, usize),
    /// Token ids are drawn below this.
    pub vocab_size: usize,
    /// The longest sequence (prompt and output), the model's context.
    pub max_tokens: usize,
    /// The seed.
    pub seed: u64,
}

impl StreamSpec {
    /// The stream issue 27 states for GPT-2 small: prompts of 32–512 tokens, outputs of 32–256,
    /// within a context of `max_tokens`.
    pub fn gpt2_serving(requests: usize, vocab_size: usize, max_tokens: usize, seed: u64) -> Self {
        Self {
            requests,
            prompt_tokens: (32, 512),
            output_tokens: (32, 256),
            vocab_size,
            max_tokens,
            seed,
        }
    }

    /// The requests. [`PagingError::Config`] for empty or reversed ranges, a vocabulary of no
    /// tokens or a context below 2 tokens.
    pub fn generate(&self) -> Result<Vec<RequestSpec>, PagingError> {
        let (p_lo, p_hi) = self.prompt_tokens;
        let (o_lo, o_hi) = self.output_tokens;
        if p_lo == 0 || p_lo > p_hi || o_lo == 0 || o_lo > o_hi {
            return Err(PagingError::Config(
                "prompt and output ranges must be 1 ≤ lo ≤ hi",
            ));
        }
        if self.vocab_size == 0 || self.max_tokens < 2 {
            return Err(PagingError::Config(
                "a stream needs a vocabulary and a context of 2 tokens",
            ));
        }
        let mut rng = SplitMix64::new(self.seed);
        let mut draw = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
        let mut requests = Vec::with_capacity(self.requests);
        for _ in 0..self.requests {
            let mut prompt_len = draw(p_lo, p_hi).min(self.max_tokens - 1);
            let output = draw(o_lo, o_hi);
            let max_new_tokens = output.min(self.max_tokens - prompt_len).max(1);
            prompt_len = prompt_len.min(self.max_tokens - max_new_tokens);
            let prompt = (0..prompt_len)
                .map(|_| draw(0, self.vocab_size - 1) as u32)
                .collect();
            requests.push(RequestSpec {
                prompt,
                max_new_tokens,
            });
        }
        Ok(requests)
    }
}

/// The value at percentile `p` (0–100) of `values` by the nearest-rank method: the sorted value
/// at index `⌈p/100 · n⌉ − 1` (the smallest at `p` 0). `None` for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
}
