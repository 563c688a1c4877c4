//! Seeded streams of generation requests: [`StreamSpec`], [`RequestSpec`], and when they arrive
//! and what prompts they share: [`Traffic`], [`TimedRequest`].

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

/// When a stream's requests arrive and what their prompts share, apart from the
/// [`StreamSpec`] that draws them ([`StreamSpec::generate_timed`]).
///
/// The default: every request at t = 0, no shared prefix — the requests of
/// [`StreamSpec::generate`] as they are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Poisson arrivals at this many requests a second (gaps drawn from the exponential
    /// distribution of mean `1 / rate`, the first request one gap after t = 0); `None`: every
    /// request at t = 0.
    pub rate: Option<f64>,
    /// `(N, L)`: N system prompts of L tokens each (uniform over the vocabulary), each request's
    /// prompt starting with one of them chosen uniformly at random, followed by the request's
    /// own drawn prompt tokens; `None`: no shared prefix.
    pub shared_prefix: Option<(usize, usize)>,
    /// The seed of the arrivals and of the prefixes (each its own SplitMix64 stream derived from
    /// it, apart from the stream's draws: the same requests' own tokens whatever the traffic).
    pub seed: u64,
}

/// One request of a timed stream: when it arrives and what it asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedRequest {
    /// Seconds after the stream's start (t = 0) at which the request arrives.
    pub arrival_s: f64,
    /// The request (serialized beside `arrival_s`: `{"arrival_s", "prompt", "max_new_tokens"}`).
    #[serde(flatten)]
    pub request: RequestSpec,
}

/// The arrivals' SplitMix64 stream is seeded with `Traffic::seed` mixed with this.
const ARRIVAL_STREAM: u64 = 0x6172_7269_7661_6c73;
/// The shared prefixes' SplitMix64 stream is seeded with `Traffic::seed` mixed with this.
const PREFIX_STREAM: u64 = 0x7072_6566_6978_6573;

/// The choices of prefix are seeded with `Traffic::seed` mixed with this.
const CHOICE_STREAM: u64 = 0x6368_6f69_6365_7321;

/// A uniform draw in `[0, 1)` (53 bits).
fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl StreamSpec {
    /// The requests of [`StreamSpec::generate`] under `traffic`, in order of arrival (arrival
    /// times non-decreasing). With a shared prefix of L tokens, each prompt is the chosen prefix
    /// followed by the request's own drawn prompt; where prefix, own prompt and outputs pass
    /// `max_tokens`, the own prompt is cut first, then the outputs (keeping one).
    ///
    /// Errors: those of [`StreamSpec::generate`]; [`PagingError::Rate`] for a rate that is not a
    /// positive finite number; [`PagingError::Config`] for a shared prefix of no prompts or of
    /// no tokens; [`PagingError::PrefixTooLong`] for a prefix that leaves no room for an output
    /// in `max_tokens`.
    pub fn generate_timed(&self, traffic: &Traffic) -> Result<Vec<TimedRequest>, PagingError> {
        if let Some(rate) = traffic.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(PagingError::Rate {
                    rate: rate.to_string(),
                });
            }
        }
        let requests = self.generate()?;
        let prefixes = match traffic.shared_prefix {
            None => Vec::new(),
            Some((prompts, tokens)) => {
                if prompts == 0 || tokens == 0 {
                    return Err(PagingError::Config(
                        "a shared prefix needs at least one prompt of at least one token",
                    ));
                }
                if tokens >= self.max_tokens {
                    return Err(PagingError::PrefixTooLong {
                        tokens,
                        max_tokens: self.max_tokens,
                    });
                }
                self.prefixes(prompts, tokens, traffic.seed)
            }
        };
        let mut arrivals = SplitMix64::new(traffic.seed ^ ARRIVAL_STREAM);
        let mut choices = SplitMix64::new(traffic.seed ^ CHOICE_STREAM);
        let mut clock = 0.0;
        let mut timed = Vec::with_capacity(requests.len());
        for mut request in requests {
            if let Some(rate) = traffic.rate {
                // Inverse transform: 1 − u is in (0, 1], its logarithm finite.
                clock += -(1.0 - unit(&mut arrivals)).ln() / rate;
            }
            if !prefixes.is_empty() {
                let prefix = &prefixes[choices.below(prefixes.len() as u64) as usize];
                let room = self.max_tokens - prefix.len();
                let max_new_tokens = request.max_new_tokens.min(room);
                let own = request.prompt.len().min(room - max_new_tokens);
                let mut prompt = Vec::with_capacity(prefix.len() + own);
                prompt.extend_from_slice(prefix);
                prompt.extend_from_slice(&request.prompt[..own]);
                request = RequestSpec {
                    prompt,
                    max_new_tokens,
                };
            }
            timed.push(TimedRequest {
                arrival_s: clock,
                request,
            });
        }
        Ok(timed)
    }

    /// `prompts` prefixes of `tokens` tokens each, uniform over the vocabulary.
    /// The vocabulary is not empty ([`StreamSpec::generate`] checked it).
    fn prefixes(&self, prompts: usize, tokens: usize, seed: u64) -> Vec<Vec<u32>> {
        let mut rng = SplitMix64::new(seed ^ PREFIX_STREAM);
        (0..prompts)
            .map(|_| {
                (0..tokens)
                    .map(|_| rng.below(self.vocab_size as u64) as u32)
                    .collect()
            })
            .collect()
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
