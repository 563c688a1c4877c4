//! The blocks of a KV cache and the sequences that hold them: [`BlockManager`], with prefix
//! caching ([`BlockManager::with_prefix_caching`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

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

/// What admission asks of the free blocks ([`BlockManager::admit_tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitRule {
    /// Every block the sequence can reach must be free; they are promised to it (taken as its
    /// tokens arrive, or at once in a contiguous layout), so that it never meets a full cache.
    Reserve,
    /// The blocks of the tokens the sequence has now must be free with `watermark` blocks left
    /// over; nothing is promised, so that a later block may find the cache full
    /// ([`PagingError::OutOfBlocks`]) and the caller must free some (preemption). Paged only.
    Watermark {
        /// Blocks that must stay free after admission.
        watermark: usize,
    },
}

/// What one block of the cache holds now ([`BlockManager::block_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Free and empty (or block 0, kept for padding).
    Free,
    /// Held by `refs` sequences (more than one: a prefix they share).
    Held {
        /// Sequences holding it.
        refs: usize,
    },
    /// Held by no sequence, its tokens kept for a later sequence of the same prefix until the
    /// memory is needed (least recently freed first).
    Cached,
}

/// Prefix caching's figures so far ([`BlockManager::prefix_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PrefixStats {
    /// Blocks admission found cached or shared (their tokens not computed again).
    pub hit_blocks: u64,
    /// Full blocks admission looked up.
    pub looked_up_blocks: u64,
    /// Cached blocks given to new tokens (their prefix forgotten).
    pub evictions: u64,
    /// Blocks cached now.
    pub cached_blocks: usize,
    /// Blocks held by more than one sequence now.
    pub shared_blocks: usize,
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
    /// Blocks promised and not taken yet.
    promise: usize,
    /// The chained hash of each full block whose tokens were committed, in order.
    hashes: Vec<u64>,
}

/// A full block's tokens as the prefix cache keys them: its tokens and the chained hash of
/// every token before them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockKey {
    parent: Option<u64>,
    tokens: Vec<u32>,
}

impl BlockKey {
    fn hash(&self) -> u64 {
        // SipHash with fixed keys: the same hash in every process.
        #[allow(deprecated)]
        let mut hasher = std::hash::SipHasher::new();
        self.parent.hash(&mut hasher);
        self.tokens.hash(&mut hasher);
        hasher.finish()
    }
}

/// The bookkeeping of a KV cache of `num_blocks` blocks of `block_tokens` tokens, as the
/// attention kernels read it: block 0 is never given out (steps pad their batches with rows that
/// write there), blocks `1..num_blocks` go to sequences.
///
/// Admission ([`BlockManager::admit_tokens`]) either promises a sequence every block it can
/// reach, so that it never meets a full cache ([`AdmitRule::Reserve`]: [`KvLayout::Paged`]
/// counts the promise without taking the blocks, which are taken as tokens arrive
/// ([`BlockManager::grow`]); [`KvLayout::Contiguous`] takes its run of `max_tokens` at once), or
/// admits while free blocks stay above a watermark ([`AdmitRule::Watermark`]), leaving the
/// caller to free blocks when a sequence needs one and none is left.
///
/// With prefix caching (paged only), a full block is keyed by its tokens and the chained hash of
/// every token before it once its tokens are committed ([`BlockManager::commit`]); a sequence
/// admitted with the same tokens before it shares the block (a reference count) instead of
/// computing it again; a block no sequence holds any more stays cached until its memory is
/// needed, the least recently freed first (a sequence's last blocks before its first). A
/// sequence's first block that differs, and its partly filled last block, are always its own.
/// Keys compare the tokens themselves and a 64-bit hash of the prefix before them.
#[derive(Debug, Clone)]
pub struct BlockManager {
    layout: KvLayout,
    block_tokens: usize,
    num_blocks: usize,
    /// Free, empty block ids.
    free: BTreeSet<u32>,
    /// Blocks promised to admitted sequences and not taken yet.
    promised: usize,
    held: BTreeMap<u64, Held>,
    /// Blocks held by at least one sequence.
    held_blocks: usize,
    /// Tokens in the blocks held.
    used_tokens: usize,
    peak: KvPeak,
    prefix_caching: bool,
    /// Per block: sequences holding it.
    refs: Vec<u32>,
    /// Per block: tokens written in it.
    filled: Vec<u32>,
    /// Cached blocks (no holder, a key), by the tick they were freed at: the first is evicted
    /// first.
    cached: BTreeMap<u64, u32>,
    /// Per block: its tick in `cached` while cached.
    cached_tick: Vec<u64>,
    tick: u64,
    /// Keyed blocks (held or cached) by their hash.
    by_hash: HashMap<u64, u32>,
    /// Each keyed block's key.
    keys: HashMap<u32, (u64, BlockKey)>,
    prefix: PrefixStats,
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

    /// A cache of `num_blocks` blocks (block 0 included) of `block_tokens` tokens, no prefix
    /// caching. [`PagingError::Config`] for a block of no tokens, fewer than 2 blocks, more than
    /// 2²⁴ blocks (ids travel as exact f32 integers), or a contiguous layout of no tokens.
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
            prefix_caching: false,
            refs: vec![0; num_blocks],
            filled: vec![0; num_blocks],
            cached: BTreeMap::new(),
            cached_tick: vec![0; num_blocks],
            tick: 0,
            by_hash: HashMap::new(),
            keys: HashMap::new(),
            prefix: PrefixStats::default(),
        })
    }

    /// The cache with prefix caching on or off. [`PagingError::Config`] for prefix caching in a
    /// contiguous layout (its runs are reserved whole) or once a sequence is admitted.
    pub fn with_prefix_caching(mut self, on: bool) -> Result<Self, PagingError> {
        if on && self.layout != KvLayout::Paged {
            return Err(PagingError::Config("prefix caching needs the paged layout"));
        }
        if !self.held.is_empty() {
            return Err(PagingError::Config(
                "prefix caching is switched before any sequence is admitted",
            ));
        }
        self.prefix_caching = on;
        Ok(self)
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
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
    /// sequence of that length can never be admitted), sharing no prefix.
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

    /// Admits sequence `id`, which can reach `reach_tokens`, if its blocks are free now
    /// ([`AdmitRule::Reserve`], no tokens known): returns whether it was admitted. Errors as
    /// [`BlockManager::admit_tokens`].
    pub fn admit(&mut self, id: u64, reach_tokens: usize) -> Result<bool, PagingError> {
        Ok(self
            .admit_tokens(id, &[], reach_tokens, AdmitRule::Reserve)?
            .is_some())
    }

    /// Admits sequence `id`, whose known tokens are `tokens` (its prompt, and the outputs it has
    /// when it is admitted again after preemption) and which can reach `reach_tokens`, if
    /// `rule` lets it now. Returns `None` when it must wait, else the tokens whose keys and
    /// values it finds in the cache already (prefix caching: whole blocks, always fewer than
    /// `tokens`, so that its last known token is run), which it holds from then on.
    ///
    /// [`PagingError::Sequence`] for an id already admitted, a sequence of no tokens, or known
    /// tokens past `reach_tokens`; [`PagingError::PassesMaxTokens`] or
    /// [`PagingError::NeverFits`] for one the empty cache cannot admit
    /// ([`Self::never_admits`]); [`PagingError::Config`] for [`AdmitRule::Watermark`] in a
    /// contiguous layout.
    pub fn admit_tokens(
        &mut self,
        id: u64,
        tokens: &[u32],
        reach_tokens: usize,
        rule: AdmitRule,
    ) -> Result<Option<usize>, PagingError> {
        let refuse = |reason| Err(PagingError::Sequence { id, reason });
        if self.held.contains_key(&id) {
            return refuse("already admitted");
        }
        if reach_tokens == 0 {
            return refuse("reaches no tokens");
        }
        if tokens.len() > reach_tokens {
            return refuse("has more tokens than it can reach");
        }
        if let Some(error) = self.never_admits(reach_tokens) {
            return Err(error);
        }
        if let KvLayout::Contiguous { .. } = self.layout {
            if rule != AdmitRule::Reserve {
                return Err(PagingError::Config(
                    "a contiguous layout reserves every sequence's run",
                ));
            }
            let needed = self.admission_blocks(reach_tokens);
            let Some(first) = self.first_run(needed) else {
                return Ok(None);
            };
            let run: Vec<u32> = (first..first + needed as u32).collect();
            for &block in &run {
                self.free.remove(&block);
                self.refs[block as usize] = 1;
            }
            self.held_blocks += needed;
            self.insert(id, run, 0, reach_tokens, 0, Vec::new());
            return Ok(Some(0));
        }
        let (hits, hashes) = self.lookup(tokens);
        // Cached hits leave the cache's free blocks: they count against what is available.
        let cached_hits = hits
            .iter()
            .filter(|&&block| self.refs[block as usize] == 0)
            .count();
        // Taking cached blocks promised (by count) to others would break their promise.
        let Some(available) = self.available_blocks().checked_sub(cached_hits) else {
            return Ok(None);
        };
        let promise = match rule {
            AdmitRule::Reserve => {
                let needed = self.blocks_for(reach_tokens) - hits.len();
                if available < needed {
                    return Ok(None);
                }
                needed
            }
            AdmitRule::Watermark { watermark } => {
                let needed = self.blocks_for(tokens.len().max(1)) - hits.len();
                if available < needed + watermark {
                    return Ok(None);
                }
                0
            }
        };
        if self.prefix_caching {
            self.prefix.looked_up_blocks +=
                (tokens.len().saturating_sub(1) / self.block_tokens) as u64;
            self.prefix.hit_blocks += hits.len() as u64;
        }
        for &block in &hits {
            self.hold(block);
        }
        self.promised += promise;
        let cached_tokens = hits.len() * self.block_tokens;
        self.insert(id, hits, cached_tokens, reach_tokens, promise, hashes);
        Ok(Some(cached_tokens))
    }

    fn insert(
        &mut self,
        id: u64,
        blocks: Vec<u32>,
        tokens: usize,
        reach_tokens: usize,
        promise: usize,
        hashes: Vec<u64>,
    ) {
        self.held.insert(
            id,
            Held {
                blocks,
                tokens,
                reach_tokens,
                promise,
                hashes,
            },
        );
        self.note_peak();
    }

    /// The cached or held blocks that hold `tokens`' first whole blocks (at most those before
    /// its last token), and their chained hashes.
    fn lookup(&self, tokens: &[u32]) -> (Vec<u32>, Vec<u64>) {
        let mut hits = Vec::new();
        let mut hashes = Vec::new();
        if !self.prefix_caching {
            return (hits, hashes);
        }
        let mut parent = None;
        for chunk in tokens[..tokens.len().saturating_sub(1)].chunks_exact(self.block_tokens) {
            let key = BlockKey {
                parent,
                tokens: chunk.to_vec(),
            };
            let hash = key.hash();
            match self.by_hash.get(&hash) {
                Some(&block) if self.keys.get(&block).is_some_and(|(_, k)| *k == key) => {
                    hits.push(block);
                    hashes.push(hash);
                    parent = Some(hash);
                }
                _ => break,
            }
        }
        (hits, hashes)
    }

    /// One more holder of `block` (shared, or taken back from the cached ones).
    fn hold(&mut self, block: u32) {
        let index = block as usize;
        if self.refs[index] == 0 {
            self.cached.remove(&self.cached_tick[index]);
            self.held_blocks += 1;
            self.used_tokens += self.filled[index] as usize;
        }
        self.refs[index] += 1;
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

    /// Blocks sequence `id` must take to grow by `tokens` tokens beyond those promised to it
    /// (0 for an unknown sequence).
    pub fn blocks_to_grow(&self, id: u64, tokens: usize) -> usize {
        self.held.get(&id).map_or(0, |held| {
            (held.tokens + tokens)
                .div_ceil(self.block_tokens)
                .saturating_sub(held.blocks.len())
                .saturating_sub(held.promise)
        })
    }

    /// Makes room in sequence `id` for `tokens` more tokens, taking blocks as needed (paged: its
    /// promised ones, else free ones, else the least recently freed cached ones), and returns
    /// the position of the first. [`PagingError::Sequence`] for an unknown sequence or one that
    /// would pass the tokens it was admitted for; [`PagingError::OutOfBlocks`] when it needs
    /// more blocks than are free and not promised (sequences admitted by
    /// [`AdmitRule::Watermark`]); nothing changes then.
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
        let from_promise = missing.min(held.promise);
        let unpromised = missing - from_promise;
        if unpromised > self.available_blocks() {
            return Err(PagingError::OutOfBlocks {
                id,
                needed: unpromised,
                available: self.available_blocks(),
            });
        }
        let taken: Vec<u32> = (0..missing).map(|_| self.take_block()).collect();
        self.promised -= from_promise;
        self.held_blocks += missing;
        self.used_tokens += tokens;
        let held = self.held.get_mut(&id).expect("checked above");
        held.promise -= from_promise;
        held.blocks.extend(&taken);
        held.tokens = end;
        // The tokens written: the last partly filled block and the new ones.
        let first_block = start / block_tokens;
        for (index, &block) in held
            .blocks
            .iter()
            .enumerate()
            .take(end.div_ceil(block_tokens))
            .skip(first_block)
        {
            let block_end = ((index + 1) * block_tokens).min(end);
            self.filled[block as usize] = (block_end - index * block_tokens) as u32;
        }
        for &block in &taken {
            self.refs[block as usize] = 1;
        }
        self.note_peak();
        Ok(start)
    }

    /// A free block, else the least recently freed cached one (its key forgotten).
    fn take_block(&mut self) -> u32 {
        if let Some(block) = self.free.pop_first() {
            return block;
        }
        let (_, block) = self
            .cached
            .pop_first()
            .expect("callers check the available blocks");
        if let Some((hash, _)) = self.keys.remove(&block) {
            self.by_hash.remove(&hash);
        }
        self.filled[block as usize] = 0;
        self.prefix.evictions += 1;
        block
    }

    /// Keys sequence `id`'s full blocks whose tokens are now known — `tokens` are its tokens
    /// from the first, at least as many as it holds — so that later sequences with the same
    /// prefix share them (prefix caching; nothing otherwise). A block whose key another block
    /// has already stays the sequence's own. [`PagingError::Sequence`] for an unknown sequence.
    pub fn commit(&mut self, id: u64, tokens: &[u32]) -> Result<(), PagingError> {
        let block_tokens = self.block_tokens;
        let held = self.held.get_mut(&id).ok_or(PagingError::Sequence {
            id,
            reason: "not admitted",
        })?;
        if !self.prefix_caching {
            return Ok(());
        }
        let full = tokens.len().min(held.tokens) / block_tokens;
        while held.hashes.len() < full {
            let index = held.hashes.len();
            let key = BlockKey {
                parent: held.hashes.last().copied(),
                tokens: tokens[index * block_tokens..(index + 1) * block_tokens].to_vec(),
            };
            let hash = key.hash();
            held.hashes.push(hash);
            let block = held.blocks[index];
            if self.keys.contains_key(&block) || self.by_hash.contains_key(&hash) {
                continue;
            }
            self.by_hash.insert(hash, block);
            self.keys.insert(block, (hash, key));
        }
        Ok(())
    }

    /// Gives back sequence `id`'s blocks and the promise of those it had not taken: each block
    /// no other sequence holds is cached if keyed (its last blocks the first to go when memory
    /// is needed), else free. [`PagingError::Sequence`] for an unknown sequence.
    pub fn release(&mut self, id: u64) -> Result<(), PagingError> {
        let held = self.held.remove(&id).ok_or(PagingError::Sequence {
            id,
            reason: "not admitted",
        })?;
        self.promised -= held.promise;
        for &block in held.blocks.iter().rev() {
            let index = block as usize;
            self.refs[index] -= 1;
            if self.refs[index] > 0 {
                continue;
            }
            self.held_blocks -= 1;
            self.used_tokens -= self.filled[index] as usize;
            if self.keys.contains_key(&block) {
                self.tick += 1;
                self.cached_tick[index] = self.tick;
                self.cached.insert(self.tick, block);
            } else {
                self.filled[index] = 0;
                self.free.insert(block);
            }
        }
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

    /// What block `block` holds now ([`BlockState::Free`] for an id past the cache).
    pub fn block_state(&self, block: u32) -> BlockState {
        let index = block as usize;
        match self.refs.get(index) {
            Some(&refs) if refs > 0 => BlockState::Held {
                refs: refs as usize,
            },
            Some(_) if self.keys.contains_key(&block) => BlockState::Cached,
            _ => BlockState::Free,
        }
    }

    /// Prefix caching's figures so far.
    pub fn prefix_stats(&self) -> PrefixStats {
        PrefixStats {
            cached_blocks: self.cached.len(),
            shared_blocks: self.refs.iter().filter(|&&refs| refs > 1).count(),
            ..self.prefix
        }
    }

    /// Blocks held by sequences now (a block shared by several counted once).
    pub fn held_blocks(&self) -> usize {
        self.held_blocks
    }

    /// Tokens in the blocks held now (a shared block's counted once).
    pub fn used_tokens(&self) -> usize {
        self.used_tokens
    }

    /// Blocks free or cached and not promised to an admitted sequence: those a sequence may
    /// still take.
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.cached.len() - self.promised
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
