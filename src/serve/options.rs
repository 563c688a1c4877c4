//! How a server serves: [`ServerOptions`], [`Execution`], and the check that refuses options
//! that serve nothing.

use super::error::ServeError;
use crate::paging::KvLayout;
use crate::scheduler::Admission;

/// How a server runs its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Execution {
    /// Each step replays a plan captured for its row count (a power of two), all plans in one
    /// arena: the activations' memory is known before the first request and never grows.
    #[default]
    Planned,
    /// Each step's ops run eagerly; their intermediates come from the pool as they are made.
    /// Steps are padded to the same row counts as planned ones.
    Eager,
}

/// How a [`Server`](crate::serve::Server) serves.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOptions {
    /// The most sequences in one step (and so in flight).
    pub max_batch: usize,
    /// How the KV cache gives blocks to sequences.
    pub layout: KvLayout,
    /// Tokens per KV block (a block of the cache's tensors within the device's binding limit).
    pub block_tokens: usize,
    /// The most token rows in one step (decode rows and prompt rows); longer prompts are filled
    /// over several steps. At least `max_batch`.
    pub max_step_tokens: usize,
    /// Steps are padded to at least this many rows (rounded up to a power of two): 1 (the
    /// default) plans a step for every power of two; `max_batch` runs every decode step at the
    /// largest batch's plan (fewer plans, more padding).
    pub min_step_rows: usize,
    /// The most bytes the pool may reserve (set on the pool while the server lives, a
    /// [`BudgetScope`](crate::BudgetScope): one server's budget per pool; the pool's earlier
    /// budget is put back when it is dropped). The KV cache takes what the budget leaves after
    /// what the pool reserves already (the weights), the steps' activations and a planned
    /// server's sampled tokens — one rule for planned and eager servers — the most blocks whose
    /// tensors, each in a segment sized for it, fit: at least 97% of what is left once that is
    /// more than a few blocks. [`Server::dry_run`](crate::serve::Server::dry_run) says what a
    /// budget gives before anything is made ([`MemoryPlan`](crate::serve::MemoryPlan));
    /// [`Server::new`](crate::serve::Server::new) makes exactly that. `None`: the cache has
    /// `kv_blocks` blocks and the pool's budget is left as it is.
    pub budget_bytes: Option<u64>,
    /// The KV cache's blocks (block 0, kept for padding, included; at least 2), which the
    /// budget, if any, must then hold. Each layer's key and value tensor must fit the device's
    /// storage binding limit ([`KvCache::max_blocks`](crate::serve::KvCache::max_blocks)).
    pub kv_blocks: Option<usize>,
    /// Planned or eager steps.
    pub execution: Execution,
    /// How requests are admitted: every block they can reach reserved (the default), or
    /// optimistically with preemption ([`Admission`]).
    pub admission: Admission,
    /// Prefix caching (paged layout only; on by default): requests that start with the same
    /// tokens share those whole blocks of the cache, and finished requests' blocks keep their
    /// tokens until the memory is needed
    /// ([`BlockManager::with_prefix_caching`](crate::paging::BlockManager::with_prefix_caching)).
    pub prefix_caching: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_batch: 16,
            layout: KvLayout::Paged,
            block_tokens: 16,
            max_step_tokens: 512,
            min_step_rows: 1,
            budget_bytes: None,
            kv_blocks: None,
            execution: Execution::Planned,
            admission: Admission::Reserve,
            prefix_caching: true,
        }
    }
}

/// Refuses options that serve nothing.
pub(super) fn check_options(options: &ServerOptions, n_ctx: usize) -> Result<(), ServeError> {
    let refuse = |reason: &str| Err(ServeError::Options(reason.into()));
    if options.max_batch == 0 || options.block_tokens == 0 {
        return refuse("max_batch and block_tokens must be at least 1");
    }
    if options.min_step_rows == 0 || options.min_step_rows > options.max_step_tokens {
        return refuse("min_step_rows must be in 1..=max_step_tokens");
    }
    if options.max_step_tokens < options.max_batch {
        return refuse(
            "max_step_tokens must be at least max_batch (one row per decoding sequence)",
        );
    }
    if let KvLayout::Contiguous { max_tokens } = options.layout {
        if max_tokens == 0 || max_tokens > n_ctx {
            return refuse("a contiguous layout's max_tokens must be in 1..=n_ctx");
        }
    }
    if options.kv_blocks.is_some_and(|blocks| blocks < 2) {
        return refuse("kv_blocks must be at least 2 (block 0 is kept for padding)");
    }
    if let crate::scheduler::Admission::Optimistic { watermark } = options.admission {
        if !(0.0..1.0).contains(&watermark) {
            return refuse("an optimistic admission's watermark must be in 0..1");
        }
        if options.layout != KvLayout::Paged {
            return refuse("optimistic admission needs the paged layout");
        }
    }
    if options.budget_bytes.is_none() && options.kv_blocks.is_none() {
        return refuse("give a budget_bytes or kv_blocks");
    }
    Ok(())
}
