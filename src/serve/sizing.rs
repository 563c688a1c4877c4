//! Sizing a server's memory: the steps' activations, measured by capturing the largest step,
//! and the largest KV cache the budget leaves room for.

use std::ops::RangeInclusive;

use super::error::ServeError;
use super::kv::KvCache;
use super::model::Gpt2;
use super::options::{Execution, ServerOptions};
use super::step::capture;
use crate::compute::{Context, PlanArena};
use crate::paging::StepRows;

/// The steps' activation bytes, measured by capturing the largest step over a cache of two
/// blocks: planned, its plan is built in `arena`, which keeps that memory for the real plans;
/// eager, its plan's heap (what the eager step's intermediates need at least: they are not
/// planned, so the pool may round them above it).
pub(super) fn activation_bytes(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
    max_blocks: usize,
    arena: &PlanArena,
) -> Result<u64, ServeError> {
    let config = model.config();
    let probe = KvCache::new(context, &config, options.block_tokens, 2, model.dtype())?;
    let rows = StepRows::bucket(options.max_step_tokens);
    let planned = options.execution == Execution::Planned;
    let plan = capture(
        context,
        model,
        &probe,
        rows,
        options.max_batch,
        max_blocks,
        planned.then_some(arena),
    )?;
    let activation_bytes = if planned {
        arena.bytes()
    } else {
        plan.stats().heap_bytes
    };
    drop(plan);
    drop(probe);
    context.trim()?;
    Ok(activation_bytes)
}

/// The largest KV cache that fits under `options.budget_bytes` after what the pool reserves now
/// and `activation_bytes` more (eager steps), then sets the pool's budget. Sized without a
/// budget on the pool (so that no refusal is counted or reported): its blocks from the bytes
/// left, scaled by the rounding the pool's segments gave a one-layer cache of that size, then,
/// while the pool still reserved more than the budget for it, fewer in proportion, until it
/// fits. `blocks` bounds the count: from the fewest that serve one sequence of the model's
/// context to the most one layer's tensors take on the device. While sizing, the pool's
/// reservation may pass the budget (its peak shows it); the cache returned is within it.
pub(super) fn cache_under_budget(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
    activation_bytes: u64,
    blocks: RangeInclusive<usize>,
    block_bytes: u64,
) -> Result<KvCache, ServeError> {
    let (min_blocks, most_blocks) = blocks.into_inner();
    let config = model.config();
    let budget = options.budget_bytes.unwrap_or(u64::MAX);
    let pool = context.pool();
    pool.set_budget(None);
    let base = pool.stats().reserved_bytes.current;
    let kept = match options.execution {
        Execution::Planned => 0,
        Execution::Eager => activation_bytes,
    };
    let left = budget.saturating_sub(base).saturating_sub(kept);
    // What the pool reserves for one layer's key tensor of the size the bytes left allow, over
    // its size: the segments' rounding, applied to the whole cache's first size.
    let mut blocks = usize::try_from(left / block_bytes.max(1))
        .unwrap_or(usize::MAX)
        .min(most_blocks);
    if blocks >= min_blocks {
        let one = KvCache::new(
            context,
            &crate::model::Gpt2Config {
                n_layer: 1,
                ..config
            },
            options.block_tokens,
            blocks,
            model.dtype(),
        )?;
        let took = pool.stats().reserved_bytes.current.saturating_sub(base);
        let asked = one.bytes();
        drop(one);
        context.trim()?;
        if took > asked {
            blocks = (blocks as u128 * u128::from(asked) / u128::from(took)) as usize;
        }
    }
    let result = loop {
        if blocks < min_blocks {
            break Err(ServeError::Budget {
                budget_bytes: budget,
                reserved_bytes: base.saturating_add(kept),
                weights_bytes: model.bytes(),
                activation_bytes,
                kv_min_bytes: min_blocks as u64 * block_bytes,
            });
        }
        let cache = KvCache::new(
            context,
            &config,
            options.block_tokens,
            blocks,
            model.dtype(),
        )?;
        let took = pool.stats().reserved_bytes.current.saturating_sub(base);
        if took <= left {
            break Ok(cache);
        }
        drop(cache);
        context.trim()?;
        let scaled = (blocks as u128 * u128::from(left) / u128::from(took)) as usize;
        blocks = scaled.min(blocks - 1);
    };
    pool.set_budget(Some(budget));
    result
}
