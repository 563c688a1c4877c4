//! Sizing a server's memory: the steps' activations, measured by capturing the largest step,
//! and the largest KV cache the budget leaves room for.

use super::error::ServeError;
use super::kv::KvCache;
use super::model::Gpt2;
use super::options::{Execution, ServerOptions};
use super::step::capture;
use crate::compute::{Context, PlanArena};
use crate::paging::{BlockManager, StepRows};
use crate::{AllocOptions, PoolError};

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
/// and `activation_bytes` more (eager steps), then sets the pool's budget. Sized by trial under
/// that budget, so that the pool's reservation never passes it and the pool packs the cache as
/// it would near its budget: each trial allocates the cache's tensors uninitialised
/// ([`Pool::try_allocate`](crate::Pool), whose refusals are no out-of-memory errors) and gives
/// them back at once. `blocks` bounds the count: from the fewest that serve one sequence of the
/// model's context ([`ServeError::Options`] where one layer's tensors cannot hold them on the
/// device) to `most_blocks`, the most they hold. The trials bisect the count down to a step of
/// 1/64 of it (at most some twenty of them).
pub(super) fn cache_under_budget(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
    activation_bytes: u64,
    most_blocks: usize,
) -> Result<KvCache, ServeError> {
    let config = model.config();
    let probe = BlockManager::new(options.layout, options.block_tokens, 2)?;
    let min_blocks = 1 + probe.admission_blocks(config.n_ctx);
    if most_blocks < min_blocks {
        return Err(ServeError::Options(format!(
            "a sequence of the model's context takes {min_blocks} blocks of {} tokens, but one \
             layer's key tensor holds at most {most_blocks} on this device (its binding limit \
             is {} bytes)",
            options.block_tokens,
            context.limits().max_storage_buffer_binding_size
        )));
    }
    let block_bytes = KvCache::block_bytes(&config, options.block_tokens, model.dtype());
    let budget = options.budget_bytes.unwrap_or(u64::MAX);
    let kept = eager_share(options, activation_bytes);
    let pool = context.pool();
    // Nothing of the context's pending: the trials' ranges are the only ones freed meanwhile.
    context.trim()?;
    let stats = pool.stats();
    let base = stats.reserved_bytes.current;
    pool.set_budget(Some(budget.saturating_sub(kept)));
    // The most the cache could take. Planned: the budget less what allocations hold now (the
    // free space of the segments held counts: the trials may fill it, and the steps take no
    // more memory). Eager: less all the pool reserves, so that the steps' intermediates, which
    // the pool rounds as they come, find that free space and `kept` more.
    let held = match options.execution {
        Execution::Planned => stats.allocated_bytes.current,
        Execution::Eager => base,
    };
    let left = budget.saturating_sub(kept).saturating_sub(held);
    let fits = |blocks: usize| {
        let bytes =
            KvCache::layer_tensor_bytes(&config, options.block_tokens, blocks, model.dtype());
        let mut held = Vec::with_capacity(2 * config.n_layer);
        let mut fit = true;
        for _ in 0..2 * config.n_layer {
            match pool.try_allocate(bytes, AllocOptions::labeled("kv cache sizing"))? {
                Some(allocation) => held.push(allocation),
                None => {
                    fit = false;
                    break;
                }
            }
        }
        // Never used on the GPU: free at once, and the segments made for them given back.
        pool.free_submitted(held);
        pool.trim();
        Ok::<_, PoolError>(fit)
    };
    // What the pool holds already must be within the budget: the trials may fill its free
    // space, but no cache makes it smaller.
    let most = if base.saturating_add(kept) > budget {
        0
    } else {
        left / block_bytes.max(1)
    };
    let most = usize::try_from(most).unwrap_or(usize::MAX).min(most_blocks);
    let result = largest_fitting(min_blocks, most, fits)
        .map_err(|error| ServeError::Compute(error.into()))
        .and_then(|found| match found {
            Some(blocks) => Ok(KvCache::new(
                context,
                &config,
                options.block_tokens,
                blocks,
                model.dtype(),
            )?),
            None => Err(ServeError::Budget {
                budget_bytes: budget,
                reserved_bytes: base.saturating_add(kept),
                weights_bytes: model.bytes(),
                activation_bytes,
                kv_min_bytes: min_blocks as u64 * block_bytes,
            }),
        });
    pool.set_budget(Some(budget));
    result
}

/// The cache of `blocks` blocks (`kv_blocks`): [`ServeError::Options`] past `most_blocks`, the
/// most one layer's tensors hold on the device; with a budget too, refused with
/// [`ServeError::Budget`] unless the pool then holds it within the budget (the eager steps'
/// share kept), and the pool's budget set.
pub(super) fn cache_of_blocks(
    context: &Context,
    model: &Gpt2,
    options: &ServerOptions,
    blocks: usize,
    most_blocks: usize,
    activation_bytes: u64,
) -> Result<KvCache, ServeError> {
    if blocks > most_blocks {
        return Err(ServeError::Options(format!(
            "kv_blocks {blocks}: at most {most_blocks} blocks of {} tokens fit in one layer's key \
             tensor on this device (its binding limit is {} bytes), and at most 2^24 blocks in \
             any cache",
            options.block_tokens,
            context.limits().max_storage_buffer_binding_size
        )));
    }
    let before = context.pool().stats().reserved_bytes.current;
    let cache = KvCache::new(
        context,
        &model.config(),
        options.block_tokens,
        blocks,
        model.dtype(),
    )?;
    let Some(budget_bytes) = options.budget_bytes else {
        return Ok(cache);
    };
    let kept = eager_share(options, activation_bytes);
    // Planned: what the pool reserves with the cache. Eager: what it reserved before, and the
    // cache's bytes beside, as the sizing by budget counts them (the free space of the segments
    // held is the eager steps').
    let reserved = match options.execution {
        Execution::Planned => context.pool().stats().reserved_bytes.current,
        Execution::Eager => before.saturating_add(cache.bytes()),
    };
    if reserved.saturating_add(kept) > budget_bytes {
        return Err(ServeError::Budget {
            budget_bytes,
            reserved_bytes: before.saturating_add(kept),
            weights_bytes: model.bytes(),
            activation_bytes,
            kv_min_bytes: cache.bytes(),
        });
    }
    context.pool().set_budget(Some(budget_bytes));
    Ok(cache)
}

/// What the budget keeps beside the cache for the steps' activations: eager steps' intermediates
/// come from the pool as they run; planned ones' arena is reserved already.
fn eager_share(options: &ServerOptions, activation_bytes: u64) -> u64 {
    match options.execution {
        Execution::Planned => 0,
        Execution::Eager => activation_bytes,
    }
}

/// The largest count in `low..=high` for which `fits` holds, found by bisection down to a step
/// of 1/64 of the count found (`fits` is taken as monotone; where it is not, a fitting count
/// all the same); `None` when `low` does not fit or the range is empty.
fn largest_fitting<E>(
    low: usize,
    high: usize,
    mut fits: impl FnMut(usize) -> Result<bool, E>,
) -> Result<Option<usize>, E> {
    if high < low || !fits(low)? {
        return Ok(None);
    }
    if fits(high)? {
        return Ok(Some(high));
    }
    // `good` fits, `bad` does not.
    let (mut good, mut bad) = (low, high);
    while bad - good > (good / 64).max(1) {
        let middle = good + (bad - good) / 2;
        if fits(middle)? {
            good = middle;
        } else {
            bad = middle;
        }
    }
    Ok(Some(good))
}

#[cfg(test)]
mod tests {
    use super::largest_fitting;

    #[test]
    fn the_largest_fitting_count_is_found_within_a_64th() {
        for limit in [1, 2, 3, 63, 64, 65, 1000, 4097, 100_000] {
            let mut trials = 0;
            let found = largest_fitting(1, 200_000, |n| {
                trials += 1;
                Ok::<_, ()>(n <= limit)
            })
            .unwrap()
            .unwrap();
            assert!(
                found <= limit && found >= limit - limit / 64,
                "{limit}: {found}"
            );
            assert!(trials <= 24, "{limit}: {trials} trials");
        }
        assert_eq!(largest_fitting(5, 9, |_| Ok::<_, ()>(true)), Ok(Some(9)));
        assert_eq!(largest_fitting(5, 9, |n| Ok::<_, ()>(n < 5)), Ok(None));
        assert_eq!(largest_fitting(9, 5, |_| Ok::<_, ()>(true)), Ok(None));
        assert_eq!(largest_fitting(1, 9, |_| Err::<bool, _>("e")), Err("e"));
    }
}
