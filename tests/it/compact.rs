//! Compaction on the GPU (`Context::compact`, `Context::compact_for`,
//! `ContextOptions::compact_on_oom`): canary tensors with known contents survive being moved,
//! including tensors of ops recorded but not submitted and tensors a plan binds; a request refused
//! for fragmentation fits afterwards; the out-of-memory error says when compacting would help;
//! emptied segments are given back; what the context does not own never moves. Every test runs on
//! the backend `WGPU_BACKEND` selects; CI runs them on Vulkan (lavapipe) and GL (llvmpipe).
//!
//! The pools here cut segments of exactly 64 KiB; tensors of 4096 floats take 16 KiB, a quarter
//! of one.

use std::collections::BTreeMap;

use wgpu_pool::compute::{ComputeError, Context, ContextOptions, Feed, Tensor};
use wgpu_pool::history::{EventKind, HistoryOptions};
use wgpu_pool::policy::{PolicyConfig, SegmentId};
use wgpu_pool::state::SpanKind;
use wgpu_pool::{Gpu, Pool, PoolError, PoolOptions};

use crate::gpu::gpu;

const SEGMENT: u64 = 64 << 10;
/// Floats in a quarter of a segment.
const QUARTER: usize = 4096;

fn pool(gpu: &Gpu, budget_bytes: Option<u64>) -> Pool {
    let limits = gpu.device.limits();
    let policy = PolicyConfig {
        min_segment_bytes: SEGMENT,
        max_segment_bytes: SEGMENT,
        growth_divisor: 0,
        large_above_bytes: SEGMENT,
        budget_bytes,
        ..PolicyConfig::for_limits(
            u64::from(limits.min_storage_buffer_offset_alignment),
            limits.max_buffer_size,
        )
    };
    Pool::new(
        gpu,
        PoolOptions {
            policy: Some(policy),
            ..PoolOptions::default()
        },
    )
    .expect("pool")
}

fn context(pool: &Pool, compact_on_oom: bool) -> Context {
    Context::new(
        pool,
        ContextOptions {
            compact_on_oom,
            ..ContextOptions::default()
        },
    )
    .expect("context")
}

/// Known contents, different for every tag.
fn canary(tag: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (tag * 100_000 + i) as f32).collect()
}

/// A tensor of `QUARTER` floats holding `canary(tag)`.
fn canary_tensor(ctx: &Context, tag: usize) -> (usize, Tensor) {
    let tensor = ctx
        .tensor(&canary(tag, QUARTER), &[QUARTER])
        .expect("tensor");
    (tag, tensor)
}

fn check_canaries(what: &str, tensors: &[(usize, Tensor)]) {
    for (tag, tensor) in tensors {
        assert_eq!(
            tensor.to_vec().expect("read"),
            canary(*tag, tensor.len()),
            "{what}: canary {tag}"
        );
    }
}

fn place(tensor: &Tensor) -> (SegmentId, u64) {
    tensor.location().expect("a tensor with memory")
}

/// Sixteen KiB tensors in two segments, with those at offsets 0 and 32 KiB of each dropped: 64
/// KiB free in blocks of 16 KiB, none of 32 KiB. Returns the four kept.
fn two_holed_segments(ctx: &Context) -> Vec<(usize, Tensor)> {
    let tensors: Vec<_> = (0..8).map(|tag| canary_tensor(ctx, tag)).collect();
    assert_eq!(ctx.pool().stats().segments.current, 2);
    tensors
        .into_iter()
        .filter(|(_, t)| !matches!(place(t).1, 0 | 0x8000))
        .collect()
}

fn out_of_memory(result: Result<Tensor, ComputeError>) -> String {
    match result {
        Err(ComputeError::Pool(PoolError::OutOfMemory(oom))) => oom.to_string(),
        Err(other) => panic!("expected out of memory, got {other}"),
        Ok(_) => panic!("expected out of memory, the request was served"),
    }
}

#[test]
fn a_request_refused_for_fragmentation_fits_after_compact_for() {
    let pool = pool(gpu(), Some(2 * SEGMENT));
    let ctx = context(&pool, false);
    let mut kept = two_holed_segments(&ctx);
    assert_eq!(kept.len(), 4);
    // An op recorded and not submitted: it reads two canaries and writes a new tensor, in one
    // of the holes (the policy moves allocations only between segments: with both holes left in
    // one segment nothing could make room).
    let sum = ctx.add(&kept[0].1, &kept[1].1).expect("add");
    assert!(ctx.pending_dispatches() > 0);
    let want_sum: Vec<f32> = canary(kept[0].0, QUARTER)
        .iter()
        .zip(canary(kept[1].0, QUARTER))
        .map(|(a, b)| a + b)
        .collect();
    // 48 KiB free, no block of 32 KiB, and the budget refuses a third segment.
    let message = out_of_memory(ctx.empty(&[2 * QUARTER]));
    assert!(
        message.contains("compacting (moving 0.02 MiB in 1 allocation"),
        "{message}"
    );
    assert!(message.contains("would make it fit"), "{message}");
    assert!(message.contains("Try: compact"), "{message}");
    let estimate = ctx
        .compaction_estimate(2 * QUARTER as u64 * 4)
        .expect("moving a tensor makes room");
    assert_eq!(estimate.moves, 1);
    let places = || -> Vec<_> {
        kept.iter()
            .map(|(_, t)| place(t))
            .chain([place(&sum)])
            .collect()
    };
    let before = places();
    let outcome = ctx.compact_for(2 * QUARTER as u64 * 4).expect("compact");
    assert_eq!(outcome.moves, 1, "{outcome:?}");
    assert_eq!(outcome.moved_bytes, 16 << 10);
    assert_eq!(ctx.pending_dispatches(), 0, "the batch was submitted first");
    let after = places();
    assert_eq!(
        before.iter().zip(&after).filter(|(b, a)| b != a).count(),
        1,
        "one tensor moved: {before:?} -> {after:?}"
    );
    let big = ctx.empty(&[2 * QUARTER]).expect("the request fits now");
    assert_eq!(pool.stats().segments.current, 2, "no segment was added");
    assert_eq!(sum.to_vec().expect("read"), want_sum);
    check_canaries("after compact_for", &kept);
    // The big tensor is usable, and so are the moved ones.
    ctx.write(&big, &canary(99, 2 * QUARTER)).expect("write");
    let again = ctx.add(&kept[3].1, &kept[0].1).expect("add");
    let want: Vec<f32> = canary(kept[3].0, QUARTER)
        .iter()
        .zip(canary(kept[0].0, QUARTER))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(again.to_vec().expect("read"), want);
    assert_eq!(big.to_vec().expect("read"), canary(99, 2 * QUARTER));
    kept.clear();
}

#[test]
fn compact_on_oom_compacts_and_retries_once() {
    let pool = pool(gpu(), Some(2 * SEGMENT));
    let ctx = context(&pool, true);
    let kept = two_holed_segments(&ctx);
    let pending = ctx.add(&kept[1].1, &kept[3].1).expect("add");
    let big = ctx
        .tensor(&canary(7, 2 * QUARTER), &[2 * QUARTER])
        .expect("served after compacting");
    assert_eq!(pool.stats().segments.current, 2);
    check_canaries("after compact_on_oom", &kept);
    assert_eq!(big.to_vec().expect("read"), canary(7, 2 * QUARTER));
    let want: Vec<f32> = canary(kept[1].0, QUARTER)
        .iter()
        .zip(canary(kept[3].0, QUARTER))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(pending.to_vec().expect("read"), want);
    // Nothing is left to move into: a second one is refused, and compaction would not help.
    let message = out_of_memory(ctx.empty(&[2 * QUARTER]));
    assert!(!message.contains("compacting"), "{message}");
}

#[test]
fn borrowed_tensors_and_plain_pool_allocations_never_move() {
    let pool = pool(gpu(), Some(2 * SEGMENT));
    let ctx = context(&pool, false);
    let kept = two_holed_segments(&ctx);
    // Every tensor borrowed: the pool's estimate would move one, the context's cannot.
    let guards: Vec<_> = kept.iter().map(|(_, t)| t.allocation()).collect();
    assert_eq!(ctx.compaction_estimate(32 << 10), None);
    let message = out_of_memory(ctx.empty(&[2 * QUARTER]));
    assert!(!message.contains("compacting"), "{message}");
    let outcome = ctx.compact_for(32 << 10).expect("compact");
    assert_eq!(outcome.moves, 0);
    drop(guards);
    // Plain pool allocations fill the holes: now nothing the context owns can make room.
    let plain: Vec<_> = (0..4)
        .map(|i| {
            let allocation = pool.allocate(16 << 10).expect("allocate");
            pool.write_slice(&allocation, 0, &canary(50 + i, QUARTER))
                .expect("write");
            allocation
        })
        .collect();
    let places: Vec<_> = plain.iter().map(|a| (a.segment(), a.offset())).collect();
    let outcome = ctx.compact().expect("compact");
    assert_eq!(outcome.moves, 0, "{outcome:?}");
    assert_eq!(
        plain
            .iter()
            .map(|a| (a.segment(), a.offset()))
            .collect::<Vec<_>>(),
        places
    );
    for (i, allocation) in plain.iter().enumerate() {
        assert_eq!(
            pool.read_vec::<f32>(allocation).expect("read"),
            canary(50 + i, QUARTER)
        );
    }
    check_canaries("unmoved", &kept);
}

#[test]
fn compact_empties_sparse_segments_and_gives_them_back() {
    let pool = pool(gpu(), None);
    let ctx = context(&pool, false);
    let tensors: Vec<_> = (0..16).map(|tag| canary_tensor(&ctx, tag)).collect();
    assert_eq!(pool.stats().segments.current, 4);
    // Keep one tensor in two segments and two in the other two: 6 × 16 KiB fit in two segments.
    let mut by_segment: BTreeMap<SegmentId, Vec<(usize, Tensor)>> = BTreeMap::new();
    for (tag, tensor) in tensors {
        by_segment
            .entry(place(&tensor).0)
            .or_default()
            .push((tag, tensor));
    }
    let mut kept = Vec::new();
    for (index, (_, mut tensors)) in by_segment.into_iter().enumerate() {
        tensors.truncate(if index < 2 { 1 } else { 2 });
        kept.extend(tensors);
    }
    assert_eq!(kept.len(), 6);
    // One of them read by an op recorded but not submitted.
    let pending = ctx.relu(&kept[0].1).expect("relu");
    let created_before = pool.stats().create_segment_calls;
    let outcome = ctx.compact().expect("compact");
    assert_eq!(outcome.segments_released, 2, "{outcome:?}");
    assert_eq!(outcome.released_bytes, 2 * SEGMENT);
    assert!(outcome.moves >= 2, "{outcome:?}");
    let stats = pool.stats();
    assert_eq!(stats.segments.current, 2);
    assert_eq!(stats.reserved_bytes.current, 2 * SEGMENT);
    assert_eq!(stats.create_segment_calls, created_before);
    assert_eq!(stats.allocations.current, 7, "the same allocations, moved");
    check_canaries("after compact", &kept);
    assert_eq!(
        pending.to_vec().expect("read"),
        canary(kept[0].0, QUARTER)
            .iter()
            .map(|v| v.max(0.0))
            .collect::<Vec<_>>()
    );
    // Nothing further to empty: a second compaction moves nothing.
    assert_eq!(ctx.compact().expect("compact").moves, 0);
    // The state still tiles every segment.
    let state = pool.memory_state();
    assert_eq!(state.segments.len(), 2);
    check_canaries("after a second compact", &kept);
}

#[test]
fn plans_that_bind_moved_tensors_give_the_same_answers() {
    let pool = pool(gpu(), None);
    let ctx = context(&pool, false);
    let (rows, width) = (512, 64);
    let weights: Vec<f32> = (0..width * width)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.25)
        .collect();
    let bias: Vec<f32> = (0..width).map(|i| i as f32 * 0.5).collect();
    let w = ctx.tensor(&weights, &[width, width]).expect("weights");
    let b = ctx.tensor(&bias, &[width]).expect("bias");
    // Fillers: two beside the weights, two in a second segment.
    let fillers: Vec<_> = (0..4).map(|tag| canary_tensor(&ctx, 10 + tag)).collect();
    let input: Vec<f32> = (0..rows * width).map(|i| (i % 13) as f32 - 6.0).collect();
    let eager = {
        let x = ctx.tensor(&input, &[rows, width]).expect("x");
        let y = ctx.matmul(&x, &w).expect("matmul");
        ctx.add_bias(&y, &b).expect("bias").to_vec().expect("read")
    };
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[rows, width]).expect("input");
    let y = ctx.matmul(&x, &w).expect("matmul");
    let out = ctx.add_bias(&y, &b).expect("bias");
    let mut plan = capture.finish(&[&out]).expect("plan");
    drop((x, y, out));
    let first = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_eq!(first[0], eager);
    // The arena (128 KiB and more) has a segment of its own; the weights' segment keeps only
    // the weights and the bias once the fillers beside them are dropped.
    let weights_segment = place(&w).0;
    let (beside, elsewhere): (Vec<_>, Vec<_>) = fillers
        .into_iter()
        .partition(|(_, t)| place(t).0 == weights_segment);
    drop(beside);
    assert!(!elsewhere.is_empty());
    let groups = plan.bind_groups_created();
    let outcome = ctx.compact().expect("compact");
    assert!(outcome.segments_released >= 1, "{outcome:?}");
    assert_ne!(place(&w).0, weights_segment, "the weights moved");
    check_canaries("fillers", &elsewhere);
    let second = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_eq!(second[0], eager, "the replay after compaction");
    assert!(
        plan.bind_groups_created() > groups,
        "the plan made its bind groups again"
    );
    // Eager ops over the moved weights agree too (the context's cached groups were dropped).
    let x = ctx.tensor(&input, &[rows, width]).expect("x");
    let y = ctx.matmul(&x, &w).expect("matmul");
    assert_eq!(ctx.add_bias(&y, &b).expect("bias").to_vec().unwrap(), eager);
}

/// Tensors of a quarter segment in the mid-sized or the large class (segments of free ranges,
/// not buddy-packed): a pool under a budget of two segments, whose classes are scaled so that
/// 16 KiB is a mid-sized request (above 8 KiB) or a large one (large requests sharing any range).
fn ranges_pool(gpu: &Gpu, large: bool) -> Pool {
    let limits = gpu.device.limits();
    let base = PolicyConfig {
        min_segment_bytes: SEGMENT,
        max_segment_bytes: SEGMENT,
        growth_divisor: 0,
        budget_bytes: Some(2 * SEGMENT),
        ..PolicyConfig::for_limits(
            u64::from(limits.min_storage_buffer_offset_alignment),
            limits.max_buffer_size,
        )
    };
    let policy = if large {
        PolicyConfig {
            mid_above_bytes: 0,
            large_above_bytes: 8 << 10,
            large_fill_eighths: 1,
            large_remainder_divisor: 0,
            ..base
        }
    } else {
        PolicyConfig {
            mid_above_bytes: 8 << 10,
            large_above_bytes: SEGMENT,
            ..base
        }
    };
    Pool::new(
        gpu,
        PoolOptions {
            policy: Some(policy),
            history: Some(HistoryOptions::default()),
            ..PoolOptions::default()
        },
    )
    .expect("pool")
}

/// Replays the pool's history (allocations and completed frees, by segment and offset) and
/// checks it ends at the allocations the pool holds: a move must show as a free at the old place
/// and an allocation at the new one.
fn check_history_follows_moves(what: &str, pool: &Pool) {
    // Issue 26: the counters count a move as the history does, a free and an allocation.
    crate::gpu::history_replays_into_the_counters(what, pool);
    let (state, history) = pool.state_and_history();
    let history = history.expect("history is on");
    assert_eq!(history.dropped_events(), 0, "{what}");
    let mut live = std::collections::BTreeSet::new();
    for event in history.events() {
        let place = (event.segment, event.offset_bytes);
        match event.kind {
            EventKind::Alloc => assert!(live.insert(place), "{what}: {event:?} over a live one"),
            EventKind::FreeCompleted => assert!(live.remove(&place), "{what}: {event:?} of none"),
            _ => {}
        }
    }
    let held: std::collections::BTreeSet<_> = state
        .segments
        .iter()
        .flat_map(|segment| {
            segment
                .spans
                .iter()
                .filter(|span| span.kind != SpanKind::Free)
                .map(move |span| (Some(segment.id), span.offset_bytes))
        })
        .collect();
    assert_eq!(
        live, held,
        "{what}: the history ends at the pool's allocations"
    );
}

#[test]
fn compaction_moves_tensors_of_the_mid_sized_and_large_classes() {
    for large in [false, true] {
        let class = if large { "large" } else { "mid-sized" };
        let pool = ranges_pool(gpu(), large);
        let ctx = context(&pool, false);
        let mut tensors = Vec::new();
        for segment in 0..2 {
            if large {
                // A large segment is made of its first request's size: a tensor of a whole
                // segment, dropped, leaves it empty for four quarters.
                drop(ctx.empty(&[4 * QUARTER]).expect("a segment's worth"));
            }
            tensors.extend((0..4).map(|i| canary_tensor(&ctx, 4 * segment + i)));
        }
        assert_eq!(pool.stats().segments.current, 2, "{class}");
        let mut kept: Vec<_> = tensors
            .into_iter()
            .filter(|(_, t)| !matches!(place(t).1, 0 | 0x8000))
            .collect();
        assert_eq!(kept.len(), 4, "{class}");
        // 64 KiB free in ranges of 16 KiB, and the budget refuses a third segment.
        let message = out_of_memory(ctx.empty(&[2 * QUARTER]));
        assert!(
            message.contains("compacting (moving 0.02 MiB in 1 allocation"),
            "{class}: {message}"
        );
        let before: Vec<_> = kept.iter().map(|(_, t)| place(t)).collect();
        let outcome = ctx.compact_for(2 * QUARTER as u64 * 4).expect("compact");
        assert_eq!(
            (outcome.moves, outcome.moved_bytes),
            (1, 16 << 10),
            "{class}"
        );
        let after: Vec<_> = kept.iter().map(|(_, t)| place(t)).collect();
        assert_eq!(
            before.iter().zip(&after).filter(|(b, a)| b != a).count(),
            1,
            "{class}: one tensor moved: {before:?} -> {after:?}"
        );
        check_history_follows_moves(class, &pool);
        let big = ctx.empty(&[2 * QUARTER]).expect("the request fits now");
        assert_eq!(
            pool.stats().segments.current,
            2,
            "{class}: no segment added"
        );
        ctx.write(&big, &canary(99, 2 * QUARTER)).expect("write");
        check_canaries(class, &kept);
        assert_eq!(big.to_vec().expect("read"), canary(99, 2 * QUARTER));
        // The moved tensor is usable by kernels at its new place.
        let sum = ctx.add(&kept[0].1, &kept[3].1).expect("add");
        let want: Vec<f32> = canary(kept[0].0, QUARTER)
            .iter()
            .zip(canary(kept[3].0, QUARTER))
            .map(|(a, b)| a + b)
            .collect();
        assert_eq!(sum.to_vec().expect("read"), want, "{class}");
        // With the big tensor and the sum gone, compact() empties one segment into the other
        // and gives it back.
        drop((big, sum));
        let outcome = ctx.compact().expect("compact");
        assert_eq!(outcome.segments_released, 1, "{class}: {outcome:?}");
        assert_eq!(pool.stats().segments.current, 1, "{class}");
        check_canaries(class, &kept);
        check_history_follows_moves(class, &pool);
        kept.clear();
    }
}

/// Floats in 8 KiB.
const EIGHTH: usize = 2048;

/// Plain pool allocations holding `canary(tag, EIGHTH)`, with their tags.
type PlainCanaries = Vec<(usize, wgpu_pool::Allocation)>;

/// Issue 26, item 5: in a pool of two 64 KiB segments (the budget), tensors `a` and `b` of 8 KiB
/// fill `[0, 16 KiB)` of the first; plain pool allocations of 8 KiB fill every other slot; the
/// four at offsets 0, 16, 32 and 48 KiB of the second are dropped. 32 KiB are free, in holes of
/// 8 KiB: a 16 KiB request needs `a` and `b` moved into two of them. Returns the tensors and the
/// plain allocations kept, with their canaries' tags.
fn movable_only_window(pool: &Pool, ctx: &Context) -> (Vec<(usize, Tensor)>, PlainCanaries) {
    let tensors: Vec<(usize, Tensor)> = (0..2)
        .map(|tag| {
            let tensor = ctx.tensor(&canary(tag, EIGHTH), &[EIGHTH]).expect("tensor");
            (tag, tensor)
        })
        .collect();
    ctx.flush().expect("flush");
    let first = place(&tensors[0].1).0;
    let mut at: Vec<_> = tensors.iter().map(|(_, t)| place(t)).collect();
    at.sort_unstable();
    assert_eq!(
        at,
        [(first, 0), (first, 8 << 10)],
        "a and b fill [0, 16 KiB)"
    );
    let plain: PlainCanaries = (0..14)
        .map(|i| {
            let allocation = pool.allocate(8 << 10).expect("allocate");
            pool.write_slice(&allocation, 0, &canary(10 + i, EIGHTH))
                .expect("write");
            (10 + i, allocation)
        })
        .collect();
    assert_eq!(pool.stats().segments.current, 2);
    let (dropped, kept): (Vec<_>, Vec<_>) = plain
        .into_iter()
        .partition(|(_, a)| a.segment() != first && a.offset() % (16 << 10) == 0);
    assert_eq!(dropped.len(), 4);
    drop(dropped);
    pool.submit(Vec::new());
    (tensors, kept)
}

fn check_plain(pool: &Pool, plain: &[(usize, wgpu_pool::Allocation)]) {
    for (tag, allocation) in plain {
        assert_eq!(
            pool.read_vec::<f32>(allocation).expect("read"),
            canary(*tag, EIGHTH),
            "plain allocation {tag}"
        );
    }
}

#[test]
fn a_window_held_only_by_tensors_is_emptied_for_a_request() {
    let pool = pool(gpu(), Some(2 * SEGMENT));
    let ctx = context(&pool, false);
    let (tensors, plain) = movable_only_window(&pool, &ctx);
    let first = place(&tensors[0].1).0;
    let plain_places: Vec<_> = plain
        .iter()
        .map(|(_, a)| (a.segment(), a.offset()))
        .collect();
    // Refused, and the error says that compacting the context's tensors would make room.
    let message = out_of_memory(ctx.zeros(&[QUARTER]));
    assert!(
        message.contains("compacting (moving 0.02 MiB in 2 allocations"),
        "{message}"
    );
    let estimate = ctx
        .compaction_estimate(16 << 10)
        .expect("moving a and b makes room");
    assert_eq!(
        (estimate.segment, estimate.window_offset, estimate.moves),
        (first, 0, 2)
    );
    let outcome = ctx.compact_for(16 << 10).expect("compact");
    assert_eq!(
        (outcome.moves, outcome.moved_bytes),
        (2, 16 << 10),
        "{outcome:?}"
    );
    assert!(tensors.iter().all(|(_, t)| place(t).0 != first));
    let zeros = ctx.zeros(&[QUARTER]).expect("the request fits now");
    assert_eq!(place(&zeros), (first, 0));
    assert_eq!(pool.stats().segments.current, 2, "no segment was added");
    assert_eq!(zeros.to_vec().expect("read"), vec![0.0; QUARTER]);
    check_canaries("after compact_for", &tensors);
    check_plain(&pool, &plain);
    assert_eq!(
        plain
            .iter()
            .map(|(_, a)| (a.segment(), a.offset()))
            .collect::<Vec<_>>(),
        plain_places,
        "plain allocations never move"
    );
    // The moved tensors are usable.
    let sum = ctx.add(&tensors[0].1, &tensors[1].1).expect("add");
    drop(zeros);
    let want: Vec<f32> = canary(0, EIGHTH)
        .iter()
        .zip(canary(1, EIGHTH))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(sum.to_vec().expect("read"), want);
}

#[test]
fn compact_on_oom_empties_a_window_held_only_by_tensors() {
    let pool = pool(gpu(), Some(2 * SEGMENT));
    let ctx = context(&pool, true);
    let (tensors, plain) = movable_only_window(&pool, &ctx);
    let first = place(&tensors[0].1).0;
    let zeros = ctx.zeros(&[QUARTER]).expect("served after compacting");
    assert_eq!(place(&zeros), (first, 0));
    assert_eq!(pool.stats().segments.current, 2);
    assert_eq!(zeros.to_vec().expect("read"), vec![0.0; QUARTER]);
    check_canaries("after compact_on_oom", &tensors);
    check_plain(&pool, &plain);
}
