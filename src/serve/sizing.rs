//! Sizing a server's memory before anything is made: [`MemoryPlan`], what a dry run
//! ([`Server::dry_run`](super::Server::dry_run)) says a server of some options will hold, and
//! what [`Server::new`](super::Server::new) then makes.
//!
//! [`MemoryPlan`] says the rule.

use super::error::ServeError;
use super::kv::KvCache;
use super::model::Gpt2;
use super::options::{check_options, Execution, ServerOptions};
use super::step::{arena_bytes, step_shapes, StepShape};
use crate::compute::{tensor_bytes, Context, DType};
use crate::paging::{BlockManager, StepRows};
use crate::Pool;

/// What a server of given options holds, known before it is made
/// ([`Server::dry_run`](super::Server::dry_run)); [`Server::new`](super::Server::new) makes
/// exactly this ([`Server::memory_plan`](super::Server::memory_plan)). The bytes the pool
/// reserves for each part (`*_reserved_bytes`) are its bytes rounded up to the pool's block, each
/// part in segments sized for it.
///
/// # The rule
///
/// One rule for planned and eager servers. Before the server, the pool reserves `reserved`
/// (the weights and whatever else it holds, its cached empty segments given back). The steps'
/// activations take `activation` bytes: the arena the step plans share, measured from the
/// plans' memory plans without building them (every row count a step is padded to, the most of
/// each arena index). A planned server also keeps its sampled tokens (one pool block). With a
/// budget, the KV cache gets what is left:
///
/// ```text
/// kv_reserved <= budget - reserved - activation_reserved - step_reserved
/// ```
///
/// and takes the most blocks whose tensors fit it. Every server tensor that counts here — each
/// layer's key and value tensor, the plans' arena, the sampled tokens — is made in a segment
/// sized for it ([`Pool::allocate_in_own_segment`](crate::Pool::allocate_in_own_segment)), so
/// the pool reserves each one's bytes rounded up to its block (256 bytes by default) and no
/// more: a planned server's pool then reserves exactly `reserved + activation_reserved +
/// step_reserved + kv_reserved`. Eager steps' intermediates come from the pool as they run: the
/// budget keeps `activation_reserved` for them beside the free space of the segments reserved
/// before the server. So the two modes give the same blocks for the same budget but where the
/// planned server's sampled tokens (one pool block) tip the count: by at most one block where a
/// block is at least a pool block (`block_tokens * n_embd * 4 >= 256` for f32).
///
/// # What a dry run creates
///
/// Measuring the activations records each step's forward over a KV cache, which must exist: a
/// cache of two blocks is made for it (and the symbolic tensors a capture makes, which take no
/// memory), then dropped, and the context trimmed, so that the pool's reservation is what it
/// was less the empty segments it had cached. No arena, no plan, no pipeline is made.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemoryPlan {
    /// Planned or eager steps.
    pub execution: Execution,
    /// The budget, if any.
    pub budget_bytes: Option<u64>,
    /// What the pool reserved before the server: the weights and everything else it holds (its
    /// cached empty segments given back).
    pub reserved_bytes: u64,
    /// The weights' bytes.
    pub weights_bytes: u64,
    /// The steps' activations: the step plans' arena (planned), the least the eager steps'
    /// intermediates need (eager); the same figure in both modes.
    pub activation_bytes: u64,
    /// What the budget counts for the activations: the arena's allocations as the pool
    /// reserves them.
    pub activation_reserved_bytes: u64,
    /// What the pool reserves for the server's own small tensors (a planned server's sampled
    /// tokens; 0 for an eager one).
    pub step_reserved_bytes: u64,
    /// The KV cache's blocks (block 0, kept for padding, included).
    pub kv_blocks: usize,
    /// The KV cache's bytes (its tensors').
    pub kv_bytes: u64,
    /// What the pool reserves for the KV cache's tensors.
    pub kv_reserved_bytes: u64,
    /// The bytes of each arena index of the step plans.
    arena_bytes: Vec<u64>,
    /// The cache's bookkeeping, empty: what [`MemoryPlan::sequences_for`] asks.
    blocks: BlockManager,
    /// The model's context.
    n_ctx: usize,
}

impl MemoryPlan {
    /// How many sequences of `tokens` tokens (prompt and outputs) the KV cache holds at once, as
    /// [`Server::capacity_for`](super::Server::capacity_for) will say: a sequence of `L` tokens
    /// holds `L − 1` in the cache. 0 for fewer than 2 tokens and for more than the model's
    /// context.
    pub fn sequences_for(&self, tokens: usize) -> usize {
        if tokens < 2 || tokens > self.n_ctx {
            return 0;
        }
        self.blocks.capacity_for(tokens - 1)
    }

    /// What the budget counts before the KV cache: `reserved_bytes + activation_reserved_bytes +
    /// step_reserved_bytes`.
    pub fn before_cache_bytes(&self) -> u64 {
        self.reserved_bytes
            .saturating_add(self.activation_reserved_bytes)
            .saturating_add(self.step_reserved_bytes)
    }

    /// What the budget counts with the KV cache: [`MemoryPlan::before_cache_bytes`] and
    /// `kv_reserved_bytes`. For a planned server, what its pool reserves once it is made.
    pub fn total_bytes(&self) -> u64 {
        self.before_cache_bytes()
            .saturating_add(self.kv_reserved_bytes)
    }

    /// What the budget leaves the KV cache (`None` without a budget).
    pub fn kv_share_bytes(&self) -> Option<u64> {
        self.budget_bytes
            .map(|budget| budget.saturating_sub(self.before_cache_bytes()))
    }

    /// The bytes of each arena index of the step plans.
    pub(super) fn arena_bytes(&self) -> &[u64] {
        &self.arena_bytes
    }
}

/// The dry run: checks `options`, measures the steps' activations and sizes the KV cache by the
/// rule (see [`MemoryPlan`]). Errors: [`ServeError::Options`] for options that serve
/// nothing or a cache past the device's binding limit; [`ServeError::Budget`] when the budget
/// leaves no room for one sequence of the model's context (or for `kv_blocks`); those of the
/// capture.
pub(super) fn memory_plan(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
) -> Result<MemoryPlan, ServeError> {
    let config = model.config();
    check_options(options, config.n_ctx)?;
    let dtype = model.dtype();
    let most_blocks = KvCache::max_blocks(&config, options.block_tokens, dtype, context.limits());
    if most_blocks < 2 {
        return Err(ServeError::Options(format!(
            "blocks of {} tokens: two of them pass one layer's key tensor's binding limit of {} \
             bytes on this device",
            options.block_tokens,
            context.limits().max_storage_buffer_binding_size
        )));
    }
    let empty = BlockManager::new(options.layout, options.block_tokens, 2)?;
    let min_blocks = 1 + empty.admission_blocks(config.n_ctx);
    match options.kv_blocks {
        Some(blocks) if blocks > most_blocks => {
            return Err(ServeError::Options(format!(
                "kv_blocks {blocks}: at most {most_blocks} blocks of {} tokens fit in one layer's \
                 key tensor on this device (its binding limit is {} bytes), and at most 2^24 \
                 blocks in any cache",
                options.block_tokens,
                context.limits().max_storage_buffer_binding_size
            )))
        }
        None if most_blocks < min_blocks => {
            return Err(ServeError::Options(format!(
                "a sequence of the model's context takes {min_blocks} blocks of {} tokens, but \
                 one layer's key tensor holds at most {most_blocks} on this device (its binding \
                 limit is {} bytes)",
                options.block_tokens,
                context.limits().max_storage_buffer_binding_size
            )))
        }
        _ => {}
    }
    // Nothing of the context's pending, no empty segment cached: what the pool reserves is
    // what it holds.
    context.trim()?;
    let pool = context.pool();
    let reserved_bytes = pool.stats().reserved_bytes.current;
    let arenas = measure_activations(context, model, options)?;
    let activation_bytes = arenas.iter().sum();
    let activation_reserved_bytes = arenas.iter().map(|&a| pool.own_segment_bytes(a)).sum();
    let step_reserved_bytes = match options.execution {
        Execution::Planned => pool.own_segment_bytes(tensor_bytes(options.max_batch, DType::F32)),
        Execution::Eager => 0,
    };
    let before_cache = reserved_bytes
        .saturating_add(activation_reserved_bytes)
        .saturating_add(step_reserved_bytes);
    let kv_reserved = |blocks: usize| kv_reserved_bytes(pool, model, options, blocks);
    let kv_blocks = match (options.kv_blocks, options.budget_bytes) {
        (Some(blocks), _) => blocks,
        // `check_options` refuses options of neither.
        (None, budget) => {
            let left = budget.unwrap_or(0).saturating_sub(before_cache);
            let layer_block = KvCache::layer_tensor_bytes(&config, options.block_tokens, 1, dtype);
            largest_blocks(
                left,
                2 * config.n_layer as u64,
                layer_block,
                most_blocks,
                kv_reserved,
            )
        }
    };
    let block_bytes = KvCache::block_bytes(&config, options.block_tokens, dtype);
    if let Some(budget_bytes) = options.budget_bytes {
        let (fits, kv_min_bytes) = match options.kv_blocks {
            Some(blocks) => (
                before_cache.saturating_add(kv_reserved(blocks)) <= budget_bytes,
                blocks as u64 * block_bytes,
            ),
            None => (kv_blocks >= min_blocks, min_blocks as u64 * block_bytes),
        };
        if !fits {
            return Err(ServeError::Budget {
                budget_bytes,
                reserved_bytes: before_cache,
                weights_bytes: model.bytes(),
                activation_bytes,
                kv_min_bytes,
            });
        }
    }
    Ok(MemoryPlan {
        execution: options.execution,
        budget_bytes: options.budget_bytes,
        reserved_bytes,
        weights_bytes: model.bytes(),
        activation_bytes,
        activation_reserved_bytes,
        step_reserved_bytes,
        kv_blocks,
        kv_bytes: kv_blocks as u64 * block_bytes,
        kv_reserved_bytes: kv_reserved(kv_blocks),
        arena_bytes: arenas,
        blocks: BlockManager::new(options.layout, options.block_tokens, kv_blocks)?,
        n_ctx: config.n_ctx,
    })
}

/// The bytes of each arena index the steps' plans need: every row count a step is padded to
/// (powers of two from `min_step_rows` to `max_step_tokens`), and the decode-only plans of
/// those up to `max_batch`'s (`step_shapes`), measured over a KV cache of two
/// blocks made for it and given back (with the context trimmed after it), the most of each
/// index. Nothing else is made.
fn measure_activations(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
) -> Result<Vec<u64>, ServeError> {
    let config = model.config();
    let max_blocks = config.n_ctx.div_ceil(options.block_tokens);
    let probe = KvCache::new(context, &config, options.block_tokens, 2, model.dtype())?;
    let counts = StepRows::buckets(options.min_step_rows, options.max_step_tokens);
    let mut most: Vec<u64> = Vec::new();
    let mut measured = Ok(());
    for (rows, kind) in step_shapes(options, counts) {
        let shape = StepShape {
            rows,
            samples: options.max_batch,
            max_blocks,
            kind,
        };
        let arenas = match arena_bytes(context, model, &probe, shape) {
            Ok(arenas) => arenas,
            Err(error) => {
                measured = Err(error);
                break;
            }
        };
        if most.len() < arenas.len() {
            most.resize(arenas.len(), 0);
        }
        for (most, bytes) in most.iter_mut().zip(arenas) {
            *most = (*most).max(bytes);
        }
    }
    let measured = measured.map(|()| most);
    drop(probe);
    context.trim()?;
    measured
}

/// What the pool reserves for a cache of `blocks` blocks: each of the `2 * n_layer` tensors in
/// a segment sized for it.
fn kv_reserved_bytes(pool: &Pool, model: &Gpt2, options: &ServerOptions, blocks: usize) -> u64 {
    let config = model.config();
    let tensor = KvCache::layer_tensor_bytes(&config, options.block_tokens, blocks, model.dtype());
    (2 * config.n_layer as u64).saturating_mul(pool.own_segment_bytes(tensor))
}

/// The most blocks, at most `most`, whose `tensors` tensors of `layer_block` bytes a block
/// take `reserved(blocks)` bytes within `left` (0 where not even one fits). `reserved` is
/// monotone and at least `tensors * layer_block * blocks`, so `left / (tensors * layer_block)`
/// bounds the answer; the rounding `reserved` adds may take some blocks off it, found by
/// bisection below that bound.
fn largest_blocks(
    left: u64,
    tensors: u64,
    layer_block: u64,
    most: usize,
    reserved: impl Fn(usize) -> u64,
) -> usize {
    let per_block = tensors.saturating_mul(layer_block).max(1);
    let bound = usize::try_from(left / per_block)
        .unwrap_or(usize::MAX)
        .min(most);
    if reserved(bound) <= left {
        return bound;
    }
    // `good` fits (0 always does), `bad` does not.
    let (mut good, mut bad) = (0, bound);
    while bad - good > 1 {
        let middle = good + (bad - good) / 2;
        if reserved(middle) <= left {
            good = middle;
        } else {
            bad = middle;
        }
    }
    good
}

#[cfg(test)]
mod tests {
    use super::largest_blocks;

    /// The most blocks whose tensors, rounded up to a block of `round` bytes each, fit `left`:
    /// counted one by one.
    fn by_counting(left: u64, tensors: u64, layer_block: u64, round: u64) -> usize {
        let reserved = |n: u64| tensors * (n * layer_block).div_ceil(round) * round;
        (0..)
            .take_while(|&n| reserved(n) <= left)
            .last()
            .unwrap_or(0) as usize
    }

    #[test]
    fn the_largest_block_count_is_found_under_the_rounding() {
        for (tensors, layer_block, round) in [
            (4, 4096, 256),
            (8, 100, 256),
            (2, 96, 1024),
            (24, 1536, 256),
        ] {
            for left in [
                0,
                1,
                255,
                4096,
                16_383,
                16_384,
                100_000,
                1 << 20,
                (5 << 20) + 77,
            ] {
                let reserved =
                    |n: usize| tensors * (n as u64 * layer_block).div_ceil(round) * round;
                let expected = by_counting(left, tensors, layer_block, round);
                assert_eq!(
                    largest_blocks(left, tensors, layer_block, usize::MAX, reserved),
                    expected,
                    "{tensors} tensors of {layer_block} a block, rounded to {round}, in {left}"
                );
                assert_eq!(
                    largest_blocks(left, tensors, layer_block, 3, reserved),
                    expected.min(3)
                );
            }
        }
    }
}
