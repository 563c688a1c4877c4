//! The blocks of a KV cache and the sequences that hold them: [`BlockManager`].

use std::collections::{BTreeMap, BTreeSet};

use super::error::PagingError;

/// How a KV cache gives its blocks to sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// Blocks one at a time, as a sequence reaches them, anywhere in the cache (vLLM's
    /// PagedAttention): a sequence holds at most one partly filled block.
    Paged,
    /// One run of consecutive blocks per sequence, reserved whole at admission for `max_tokens`
    /// tokens whatever the sequence will reach (as Hugging Face's static cache and
    /// FasterTransformer reserve each request's maximum length).
    Contiguous {
        /// Tokens reserved for every sequence.
        max_tokens: usize,
    },
}

/// The block ids and tokens of one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// Its blocks, in token order.
    blocks: Vec<u32>,
    /// Tokens written (or about to be) into them.
    tokens: usize,
    /// The most tokens it may reach (prompt and every output).
    reach_tokens: usize,
}

/// The bookkeeping of a KV cache of `num_blocks` blocks of `block_tokens` tokens, as the
/// attention kernels read it: block 0 is never given out (steps pad their batches with rows that
/// write there), blocks `1..num_blocks` go to sequences.
///
/// Admission promises a sequence every block it can reach (its prompt and its outputs), so that
/// an admitted sequence never meets a full cache: [`KvLayout::Paged`] counts the promise without
/// taking the blocks, which are taken as tokens arrive ([`BlockManager::grow`]);
/// [`KvLayout::Contiguous`] takes its run of `max_tokens` at once.
#[derive(Debug, Clone)]
pub struct BlockManager {
    layout: KvLayout,
    block_tokens: usize,
    num_blocks: usize,
    /// Free block ids.
    free: BTreeSet<u32>,
    /// Blocks promised to admitted sequences and not taken yet (paged).
    promised: usize,
    held: BTreeMap<u64, Held>,
    held_blocks: usize,
    used_tokens: usize,
    peak: KvPeak,
}

/// The cache's fill at the moment the most blocks were held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct KvPeak {
    /// Blocks held by sequences at that moment (the most ever held).
    pub held_blocks: usize,
    /// Tokens those blocks held at that moment.
    pub used_tokens: usize,
}

impl BlockManager {
    /// The most blocks a cache may have: block ids travel to the kernels as f32 integers, exact
    /// below 2^24.
    pub const MAX_BLOCKS: usize = 1 << 24;

    /// A cache of `num_blocks` blocks (block 0 included) of `block_tokens` tokens.
    /// [`PagingError::Config`] for a block of no tokens, fewer than 2 blocks, more than 2²⁴
    /// blocks (ids travel as exact f32 integers), or a contiguous layout of no tokens.
    pub fn new(
        layout: KvLayout,
        block_tokens: usize,
        num_blocks: usize,
    ) -> Result<Self, PagingError> {
        if block_tokens == 0 {
            return Err(PagingError::Config("a block holds no tokens"));
        }
        if num_blocks < 2 {
            return Err(PagingError::Config(
                "fewer than 2 blocks (block 0 is kept for padding)",
            ));
        }
        if num_blocks > Self::MAX_BLOCKS {
            return Err(PagingError::Config(
                "more than 2^24 blocks (ids are exact f32 integers)",
            ));
        }
        if let KvLayout::Contiguous { max_tokens: 0 } = layout {
            return Err(PagingError::Config(
                "a contiguous layout of 0 tokens per sequence",
            ));
        }
        Ok(Self {
            layout,
            block_tokens,
            num_blocks,
            free: (1..num_blocks as u32).collect(),
            promised: 0,
            held: BTreeMap::new(),
            held_blocks: 0,
            used_tokens: 0,
            peak: KvPeak::default(),
        })
    }

    /// The layout.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks, block 0 included.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks for `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_tokens)
    }

    /// The blocks admission takes or promises for a sequence that can reach `reach_tokens`.
    pub fn admission_blocks(&self, reach_tokens: usize) -> usize {
        match self.layout {
            KvLayout::Paged => self.blocks_for(reach_tokens),
            KvLayout::Contiguous { max_tokens } => self.blocks_for(max_tokens),
        }
    }

    /// How many sequences of `tokens` tokens the empty cache admits at once (0 where one
    /// sequence of that length can never be admitted).
    pub fn capacity_for(&self, tokens: usize) -> usize {
        if tokens == 0 || !self.can_ever_admit(tokens) {
            return 0;
        }
        (self.num_blocks - 1) / self.admission_blocks(tokens).max(1)
    }

    /// Whether a sequence of `reach_tokens` can be admitted when the cache is empty.
    pub fn can_ever_admit(&self, reach_tokens: usize) -> bool {
        self.never_admits(reach_tokens).is_none()
    }

    /// Why the empty cache can never admit a sequence of `reach_tokens`, if it cannot:
    /// [`PagingError::PassesMaxTokens`] for one longer than the contiguous layout reserves,
    /// [`PagingError::NeverFits`] for one that needs more blocks than the cache has.
    pub fn never_admits(&self, reach_tokens: usize) -> Option<PagingError> {
        match self.layout {
            KvLayout::Contiguous { max_tokens } if reach_tokens > max_tokens => {
                Some(PagingError::PassesMaxTokens {
                    tokens: reach_tokens,
                    max_tokens,
                })
            }
            _ => {
                let blocks = self.admission_blocks(reach_tokens);
                (blocks >= self.num_blocks).then(|| PagingError::NeverFits {
                    tokens: reach_tokens,
                    blocks,
                    capacity_blocks: self.num_blocks - 1,
                })
            }
        }
    }

    /// Admits sequence `id`, which can reach `reach_tokens`, if its blocks are free now: returns
    /// whether it was admitted. [`PagingError::Sequence`] for an id already admitted or a
    /// sequence of no tokens; [`PagingError::PassesMaxTokens`] or [`PagingError::NeverFits`]
    /// for one the empty cache cannot admit ([`Self::never_admits`]).
    pub fn admit(&mut self, id: u64, reach_tokens: usize) -> Result<bool, PagingError> {
        if self.held.contains_key(&id) {
            return Err(PagingError::Sequence {
                id,
                reason: "already admitted",
            });
        }
        if reach_tokens == 0 {
            return Err(PagingError::Sequence {
                id,
                reason: "reaches no tokens",
            });
        }
        if let Some(error) = self.never_admits(reach_tokens) {
            return Err(error);
        }
        let needed = self.admission_blocks(reach_tokens);
        let blocks = match self.layout {
            KvLayout::Paged => {
                if self.free.len() < self.promised + needed {
                    return Ok(false);
                }
                self.promised += needed;
                Vec::new()
            }
            KvLayout::Contiguous { .. } => match self.first_run(needed) {
                Some(first) => {
                    let run: Vec<u32> = (first..first + needed as u32).collect();
                    for block in &run {
                        self.free.remove(block);
                    }
                    self.held_blocks += needed;
                    run
                }
                None => return Ok(false),
            },
        };
        self.held.insert(
            id,
            Held {
                blocks,
                tokens: 0,
                reach_tokens,
            },
        );
        self.note_peak();
        Ok(true)
    }

    /// The first block of the lowest run of `count` free consecutive blocks.
    fn first_run(&self, count: usize) -> Option<u32> {
        let mut start = None;
        let mut length = 0usize;
        for &block in &self.free {
            match start {
                Some(first) if first + length as u32 == block => length += 1,
                _ => {
                    start = Some(block);
                    length = 1;
                }
            }
            if length == count {
                return start;
            }
        }
        None
    }

    /// Makes room in sequence `id` for `tokens` more tokens, taking blocks as needed (paged),
    /// and returns the position of the first. [`PagingError::Sequence`] for an unknown sequence
    /// or one that would pass the tokens it was admitted for; nothing changes then.
    pub fn grow(&mut self, id: u64, tokens: usize) -> Result<usize, PagingError> {
        let block_tokens = self.block_tokens;
        let held = self.held.get(&id).ok_or(PagingError::Sequence {
            id,
            reason: "not admitted",
        })?;
        let start = held.tokens;
        let end = start + tokens;
        if end > held.reach_tokens {
            return Err(PagingError::Sequence {
                id,
                reason: "grows past the tokens it was admitted for",
            });
        }
        let missing = end.div_ceil(block_tokens).saturating_sub(held.blocks.len());
        // Paged: every missing block was promised at admission, so the free set has it.
        let taken: Vec<u32> = self.free.iter().take(missing).copied().collect();
        debug_assert_eq!(taken.len(), missing, "admission promised these blocks");
        for block in &taken {
            self.free.remove(block);
        }
        self.promised -= missing;
        self.held_blocks += missing;
        self.used_tokens += tokens;
        let held = self.held.get_mut(&id).expect("checked above");
        held.blocks.extend(taken);
        held.tokens = end;
        self.note_peak();
        Ok(start)
    }

    /// Gives back sequence `id`'s blocks and the promise of those it had not taken.
    /// [`PagingError::Sequence`] for an unknown sequence.
    pub fn release(&mut self, id: u64) -> Result<(), PagingError> {
        let held = self.held.remove(&id).ok_or(PagingError::Sequence {
            id,
            reason: "not admitted",
        })?;
        if self.layout == KvLayout::Paged {
            self.promised -= self.blocks_for(held.reach_tokens) - held.blocks.len();
        }
        self.held_blocks -= held.blocks.len();
        self.used_tokens -= held.tokens;
        self.free.extend(held.blocks);
        Ok(())
    }

    /// Sequence `id`'s blocks in token order (`None` for an unknown sequence).
    pub fn blocks(&self, id: u64) -> Option<&[u32]> {
        self.held.get(&id).map(|held| held.blocks.as_slice())
    }

    /// Sequence `id`'s tokens so far.
    pub fn tokens(&self, id: u64) -> Option<usize> {
        self.held.get(&id).map(|held| held.tokens)
    }

    /// The admitted sequences and their blocks, in id order.
    pub fn sequences(&self) -> impl Iterator<Item = (u64, &[u32])> {
        self.held
            .iter()
            .map(|(&id, held)| (id, held.blocks.as_slice()))
    }

    /// Blocks held by sequences now.
    pub fn held_blocks(&self) -> usize {
        self.held_blocks
    }

    /// Tokens held now.
    pub fn used_tokens(&self) -> usize {
        self.used_tokens
    }

    /// Free blocks not promised to an admitted sequence.
    pub fn available_blocks(&self) -> usize {
        self.free.len() - self.promised
    }

    /// The fill at the moment the most blocks were held.
    pub fn peak(&self) -> KvPeak {
        self.peak
    }

    /// Starts a new peak from the current fill.
    pub fn reset_peak(&mut self) {
        self.peak = KvPeak {
            held_blocks: self.held_blocks,
            used_tokens: self.used_tokens,
        };
    }

    fn note_peak(&mut self) {
        if self.held_blocks > self.peak.held_blocks
            || (self.held_blocks == self.peak.held_blocks
                && self.used_tokens > self.peak.used_tokens)
        {
            self.peak = KvPeak {
                held_blocks: self.held_blocks,
                used_tokens: self.used_tokens,
            };
        }
    }
}
