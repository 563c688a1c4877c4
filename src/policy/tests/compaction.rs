//! Compaction: plans that make room without growing, in every size class, pinned allocations,
//! evacuation, and the out-of-memory text that says what compacting would do.

use std::collections::HashMap;

use crate::policy::*;

use super::fixtures::*;

/// Small segments of 64 KiB in 256-byte blocks: holes appear after a few frees.
fn compaction_config() -> PolicyConfig {
    PolicyConfig {
        min_segment_bytes: 64 << 10,
        max_segment_bytes: 64 << 10,
        growth_divisor: 0,
        large_above_bytes: 64 << 10,
        ..config()
    }
}

/// `compaction_config` (0), with requests above 4 KiB mid-sized (1), or large under the default
/// rules (2) or sharing every range (3), or both classes: mid-sized above 4 KiB, large above 8
/// KiB sharing every range (4).
fn ranges_compaction_config(class: u8) -> PolicyConfig {
    let packed = compaction_config();
    match class {
        0 => packed,
        1 => PolicyConfig {
            mid_above_bytes: 4 << 10,
            ..packed
        },
        4 => PolicyConfig {
            mid_above_bytes: 4 << 10,
            large_above_bytes: 8 << 10,
            ..ranges_compaction_config(3)
        },
        // Empty large segments stay cached within the default headroom, for later requests to
        // share.
        _ => PolicyConfig {
            large_above_bytes: 4 << 10,
            large_fill_eighths: if class == 2 { 6 } else { 1 },
            large_remainder_divisor: if class == 2 { 4 } else { 0 },
            ..packed
        },
    }
}

/// Four 16 KiB allocations in each of two segments, with the first and third of each freed: 64 KiB
/// free in blocks of 16 KiB, none of 32 KiB.
fn two_holed_segments(pool: &mut PoolCore<SimulatedStorage>) -> Vec<Placement> {
    let placements: Vec<Placement> = (0..8).map(|_| pool.allocate(16 << 10).unwrap()).collect();
    assert_eq!(pool.segment_count(), 2);
    let (freed, kept): (Vec<_>, Vec<_>) = placements
        .into_iter()
        .partition(|p| p.offset() == 0 || p.offset() == 32 << 10);
    assert_eq!(freed.len(), 4);
    for placement in freed {
        pool.free(placement);
    }
    kept
}

#[test]
fn a_compaction_plan_makes_room_without_growing() {
    let mut pool = pool(compaction_config());
    let mut live = two_holed_segments(&mut pool);
    let before = pool.counters();
    assert!(pool.allocate_existing(32 << 10).is_none());
    let plan = pool
        .compaction_plan(32 << 10, CompactionLimits::default())
        .unwrap();
    assert_eq!(plan.moves().len(), 1);
    assert_eq!(plan.moved_bytes(), 16 << 10);
    let m = plan.moves()[0];
    assert_ne!(m.to_segment, plan.estimate().segment);
    assert_eq!((m.from_offset, m.bytes), (16 << 10, 16 << 10));
    assert!(live.iter().filter(|p| plan.moves_placement(p)).count() == 1);
    // A plan that misses a placement is refused and cancelled.
    assert_eq!(
        pool.apply_moves(plan, live.iter_mut().take(0)),
        Err(CompactionError::MissingPlacement {
            segment: m.from_segment,
            offset: m.from_offset
        })
    );
    assert_eq!(pool.counters(), before);
    let plan = pool
        .compaction_plan(32 << 10, CompactionLimits::default())
        .unwrap();
    let m = plan.moves()[0];
    assert_eq!(pool.apply_moves(plan, live.iter_mut()), Ok(16 << 10));
    assert_eq!(pool.counters(), before, "moving changes no counter");
    assert_eq!(pool.stats().largest_free_bytes, 32 << 10);
    let moved = live
        .iter()
        .find(|p| p.segment() == m.to_segment && p.offset() == m.to_offset);
    assert_eq!(moved.map(Placement::allocated_size), Some(16 << 10));
    let placement = pool
        .allocate_existing(32 << 10)
        .expect("the request fits now");
    assert_eq!(placement.slot(), m.from_slot);
    assert_eq!(pool.stats().create_segment_calls, 2);
    // A bound below the bytes to move refuses.
    live.push(placement);
    for placement in live {
        pool.free(placement);
    }
    let mut pool = pool_with(compaction_config());
    let _live = two_holed_segments(&mut pool);
    let tight = CompactionLimits {
        max_moves: 0,
        ..CompactionLimits::default()
    };
    assert!(pool.compaction_plan(32 << 10, tight).is_none());
    assert!(pool.compaction_estimate(32 << 10, tight).is_none());
}

#[test]
fn pinned_allocations_are_never_moved() {
    let mut pool = pool(compaction_config());
    let mut live = two_holed_segments(&mut pool);
    // Every allocation pinned: no plan, no estimate.
    assert!(pool
        .compaction_plan_where(32 << 10, CompactionLimits::default(), |_, _| false)
        .is_none());
    assert!(pool
        .compaction_estimate_where(32 << 10, CompactionLimits::default(), |_, _| false)
        .is_none());
    // The allocation the unrestricted plan moves pinned: the plan moves another.
    let first = pool
        .compaction_plan(32 << 10, CompactionLimits::default())
        .unwrap();
    let pinned = first.moves()[0];
    pool.cancel_compaction(first);
    let plan = pool
        .compaction_plan_where(32 << 10, CompactionLimits::default(), |segment, offset| {
            (segment, offset) != (pinned.from_segment, pinned.from_offset)
        })
        .unwrap();
    assert_eq!(plan.moves().len(), 1);
    assert_ne!(
        (plan.moves()[0].from_segment, plan.moves()[0].from_offset),
        (pinned.from_segment, pinned.from_offset)
    );
    assert_eq!(pool.apply_moves(plan, live.iter_mut()), Ok(16 << 10));
    for placement in live {
        pool.free(placement);
    }
}

#[test]
fn an_evacuation_plan_empties_a_segment_that_is_then_given_back() {
    let mut pool = pool(compaction_config());
    let mut live = two_holed_segments(&mut pool);
    let before = pool.counters();
    let slot = live[0].slot();
    let id = live[0].segment();
    assert_eq!(pool.live_bytes(id), 32 << 10);
    // Pinned: refused.
    assert!(pool
        .evacuation_plan(id, CompactionLimits::default(), |_, _| false)
        .is_none());
    // Too many moves: refused.
    let one = CompactionLimits {
        max_moves: 1,
        ..CompactionLimits::default()
    };
    assert!(pool.evacuation_plan(id, one, |_, _| true).is_none());
    let plan = pool
        .evacuation_plan(id, CompactionLimits::default(), |_, _| true)
        .unwrap();
    assert_eq!(plan.moves().len(), 2);
    assert!(plan.moves().iter().all(|m| m.to_slot != slot));
    assert_eq!(plan.estimate().segment, id);
    assert_eq!(pool.apply_moves(plan, live.iter_mut()), Ok(32 << 10));
    assert_eq!(pool.counters(), before, "moving changes no counter");
    assert_eq!(pool.live_bytes(id), 0);
    assert!(live.iter().all(|p| p.segment() != id));
    assert_eq!(pool.release_if_empty(id), 64 << 10);
    assert_eq!(pool.segment_count(), 1);
    assert_eq!(pool.stats().free_bytes, 0);
    // The other segment is full now: nothing to evacuate it into.
    let other = live[0].segment();
    assert!(pool
        .evacuation_plan(other, CompactionLimits::default(), |_, _| true)
        .is_none());
    let remaining = pool.segments().next().unwrap().id;
    assert_eq!(pool.release_if_empty(remaining), 0);
    for placement in live {
        pool.free(placement);
    }
}

/// Issue 26, item 5: segments of 64 KiB, a budget of two; `a` and `b` (8 KiB each) fill `[0, 16
/// KiB)` of the first, pinned allocations of 8 KiB every other slot, and four of those in the
/// second are freed, one in every block of 16 KiB. No block with free space can be emptied (each
/// holds a pinned allocation), but the block that `a` and `b` hold, with no free byte in it, can:
/// they move into two of the holes.
#[test]
fn a_window_held_only_by_movable_allocations_is_emptied() {
    let mut pool = pool(PolicyConfig {
        budget_bytes: Some(128 << 10),
        ..compaction_config()
    });
    let mut movable: Vec<Placement> = (0..2).map(|_| pool.allocate(8 << 10).unwrap()).collect();
    let pinned: Vec<Placement> = (0..14).map(|_| pool.allocate(8 << 10).unwrap()).collect();
    assert_eq!(pool.segment_count(), 2);
    let first = movable[0].segment();
    let mut at: Vec<u64> = movable.iter().map(Placement::offset).collect();
    at.sort_unstable();
    assert_eq!(at, [0, 8 << 10]);
    assert!(movable.iter().all(|p| p.segment() == first));
    let (freed, mut pinned): (Vec<_>, Vec<_>) = pinned
        .into_iter()
        .partition(|p| p.segment() != first && p.offset() % (16 << 10) == 0);
    assert_eq!(freed.len(), 4);
    for placement in freed {
        pool.free(placement);
    }
    assert_eq!(pool.stats().largest_free_bytes, 8 << 10);
    let is_movable = |segment: SegmentId, offset: u64| segment == first && offset < 16 << 10;
    let estimate = pool
        .compaction_estimate_where(16 << 10, CompactionLimits::default(), is_movable)
        .expect("moving a and b empties their block");
    assert_eq!(
        (estimate.segment, estimate.window_offset, estimate.moves),
        (first, 0, 2)
    );
    // The pool's own estimate (everything movable) finds it too.
    let Err(PolicyError::OutOfMemory(oom)) = pool.allocate(16 << 10) else {
        panic!("the budget refuses a third segment");
    };
    assert!(oom.compaction.is_some(), "{oom}");
    let before = pool.counters();
    let plan = pool
        .compaction_plan_where(16 << 10, CompactionLimits::default(), is_movable)
        .expect("a plan moves a and b");
    assert_eq!(plan.moves().len(), 2);
    assert_eq!(plan.moved_bytes(), 16 << 10);
    assert!(plan.moves().iter().all(|m| m.to_segment != first));
    assert_eq!(pool.apply_moves(plan, movable.iter_mut()), Ok(16 << 10));
    assert_eq!(pool.counters(), before, "moving changes no counter");
    let placement = pool
        .allocate_existing(16 << 10)
        .expect("the request fits now");
    assert_eq!((placement.segment(), placement.offset()), (first, 0));
    assert_eq!(pool.segment_count(), 2);
    pinned.push(placement);
    for placement in pinned.into_iter().chain(movable) {
        pool.free(placement);
    }
    assert_eq!(pool.stats().allocated_bytes.current, 0);
}

fn pool_with(config: PolicyConfig) -> PoolCore<SimulatedStorage> {
    pool(config)
}

#[test]
fn out_of_memory_says_when_compacting_would_make_the_request_fit() {
    let mut pool = pool(PolicyConfig {
        budget_bytes: Some(128 << 10),
        ..compaction_config()
    });
    let _live = two_holed_segments(&mut pool);
    let Err(PolicyError::OutOfMemory(oom)) = pool.allocate(32 << 10) else {
        panic!("the budget refuses a third segment");
    };
    assert_eq!(oom.free_bytes, 64 << 10);
    assert_eq!(oom.largest_free_bytes, 16 << 10);
    let estimate = oom.compaction.expect("moving one allocation makes room");
    assert_eq!((estimate.moves, estimate.moved_bytes), (1, 16 << 10));
    assert_eq!(estimate.window_bytes, 32 << 10);
    let text = oom.to_string();
    assert!(
        text.contains("free space in segments totals 0.06 MiB, the largest block 0.02 MiB"),
        "{text}"
    );
    assert!(
        text.contains(
            "compacting (moving 0.02 MiB in 1 allocation out of a block of 0.03 MiB in segment"
        ),
        "{text}"
    );
    assert!(text.contains("would make it fit"), "{text}");
    // 48 KiB needs a whole segment: its two allocations move into the other's holes.
    let Err(PolicyError::OutOfMemory(oom)) = pool.allocate(48 << 10) else {
        panic!("the budget refuses a third segment");
    };
    let estimate = oom.compaction.unwrap();
    assert_eq!((estimate.moves, estimate.moved_bytes), (2, 32 << 10));
    // A large request, with no segment of its class held, has nothing to compact.
    let Err(PolicyError::OutOfMemory(oom)) = pool.allocate(80 << 10) else {
        panic!("the budget refuses a large segment");
    };
    assert_eq!(oom.compaction, None);
    assert!(!oom.to_string().contains("compacting"), "{oom}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// After a plan is applied every live allocation is there exactly once, with its size, in a
    /// range no other holds; the moves' destinations overlapped nothing live; the bound held; and
    /// the request fits without growing. In packed segments, in segments of free ranges of the
    /// mid-sized class, and of the large class with its default rules and sharing every range;
    /// with every allocation movable, or every third pinned (a plan never moves a pinned one).
    #[test]
    fn applied_compaction_plans_keep_every_allocation_and_make_room(
        class in 0u8..5,
        ops in proptest::collection::vec((1u64..12 << 10, 0u8..4, 1u64..40 << 10, 1u64..3), 1..300),
        pin in 0usize..3,
    ) {
        let mut pool = pool(ranges_compaction_config(class));
        // (tag, placement); sizes by tag.
        let mut live: Vec<(usize, Placement)> = Vec::new();
        let mut sizes: Vec<u64> = Vec::new();
        let mut compactions = 0;
        for (size, action, request, factor) in ops {
            match action {
                0 | 1 => {
                    // Some large segments of several requests' size, for the large classes.
                    let size = if class >= 2 && action == 1 { 4 * size } else { size };
                    let placement = pool.allocate(size).unwrap();
                    sizes.push(placement.allocated_size());
                    live.push((sizes.len() - 1, placement));
                }
                2 if !live.is_empty() => {
                    let (_, placement) = live.swap_remove(size as usize % live.len());
                    pool.free(placement);
                }
                _ => {
                    // Large segments are of their first request's size: requests of the sizes
                    // allocated find windows in them.
                    let request = if class >= 2 { (4 << 10) + request % (20 << 10) } else { request };
                    let limits = CompactionLimits { max_moved_factor: factor, max_moves: 64 };
                    let before = pool.stats();
                    // With `pin` > 0, every third allocation (by tag) is pinned.
                    let tags: HashMap<(SegmentId, u64), usize> =
                        live.iter().map(|(tag, p)| ((p.segment(), p.offset()), *tag)).collect();
                    let movable = |segment: SegmentId, offset: u64| {
                        pin == 0
                            || tags.get(&(segment, offset)).is_some_and(|tag| tag % 3 != pin - 1)
                    };
                    let Some(plan) = pool.compaction_plan_where(request, limits, movable) else {
                        continue;
                    };
                    proptest::prop_assert!(plan.moved_bytes() <= pool.rounded_size(request) * factor);
                    proptest::prop_assert!(plan.moves().len() <= 64);
                    for (i, m) in plan.moves().iter().enumerate() {
                        proptest::prop_assert_ne!(m.to_segment, plan.estimate().segment);
                        // Between segments of one kind: packed, mid-sized ranges or large ranges.
                        let kind = |slot: usize| {
                            pool.segment(slot).expect("a plan's segment is held").class()
                        };
                        proptest::prop_assert_eq!(kind(m.to_slot), kind(m.from_slot));
                        let sources = live.iter().filter(|(_, p)| p.segment() == m.from_segment && p.offset() == m.from_offset).count();
                        proptest::prop_assert_eq!(sources, 1);
                        proptest::prop_assert!(movable(m.from_segment, m.from_offset));
                        // The destination overlaps no live allocation and no other destination.
                        let overlaps = |segment: SegmentId, offset: u64, bytes: u64| {
                            segment == m.to_segment && offset < m.to_offset + m.bytes && m.to_offset < offset + bytes
                        };
                        proptest::prop_assert!(!live.iter().any(|(_, p)| overlaps(p.segment(), p.offset(), p.allocated_size())));
                        proptest::prop_assert!(!plan.moves()[..i].iter().any(|o| overlaps(o.to_segment, o.to_offset, o.bytes)));
                    }
                    let moves = plan.moves().len();
                    pool.apply_moves(plan, live.iter_mut().map(|(_, p)| p)).unwrap();
                    compactions += usize::from(moves > 0);
                    proptest::prop_assert_eq!(pool.stats().allocated_bytes, before.allocated_bytes);
                    let placement = pool.allocate_existing(request);
                    proptest::prop_assert!(placement.is_some(), "the request fits after the plan");
                    let placement = placement.unwrap();
                    sizes.push(placement.allocated_size());
                    live.push((sizes.len() - 1, placement));
                }
            }
            // Every live allocation once, with its size, in a range of its own, as the segments'
            // books say.
            let mut ranges: Vec<(usize, u64, u64)> = live
                .iter()
                .map(|(tag, p)| {
                    assert_eq!(p.allocated_size(), sizes[*tag]);
                    (p.slot(), p.offset(), p.allocated_size())
                })
                .collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                proptest::prop_assert!(pair[0].0 != pair[1].0 || pair[0].1 + pair[0].2 <= pair[1].1, "{:?}", pair);
            }
            let mut books: Vec<(usize, u64, u64)> = (0..pool.segments.len())
                .filter_map(|slot| pool.segment(slot).map(|s| (slot, s)))
                .flat_map(|(slot, s)| s.live_ranges().map(move |(o, b)| (slot, o, b)))
                .collect();
            books.sort_unstable();
            proptest::prop_assert_eq!(&books, &ranges);
        }
        let _ = compactions;
        for (_, placement) in live {
            pool.free(placement);
        }
        proptest::prop_assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
}

/// Checks `plan`, made for `request` bytes, against the placements `live` (whose sources must all
/// be `movable`) and applies it: every move from a movable allocation of the plan's segment into another segment of its
/// kind, the destinations overlapping nothing live and one another, within `limits`; afterwards
/// every allocation once, with its size, as the books say, and `request` fits without growing.
fn apply_checked(
    pool: &mut PoolCore<SimulatedStorage>,
    plan: CompactionPlan,
    request: u64,
    live: &mut Vec<Placement>,
    movable: &dyn Fn(SegmentId, u64) -> bool,
    limits: CompactionLimits,
) {
    assert!(plan.moved_bytes() <= pool.rounded_size(request) * limits.max_moved_factor);
    assert!(plan.moves().len() <= limits.max_moves);
    let kind = |pool: &PoolCore<SimulatedStorage>, slot: usize| {
        pool.segment(slot)
            .expect("a plan's segment is held")
            .class()
    };
    for (i, m) in plan.moves().iter().enumerate() {
        assert_ne!(m.to_segment, plan.estimate().segment);
        assert_eq!(m.from_segment, plan.estimate().segment);
        assert!(
            movable(m.from_segment, m.from_offset),
            "{m:?} moves a pinned allocation"
        );
        assert_eq!(kind(pool, m.to_slot), kind(pool, m.from_slot));
        let sources = live
            .iter()
            .filter(|p| p.segment() == m.from_segment && p.offset() == m.from_offset)
            .count();
        assert_eq!(sources, 1);
        let overlaps = |segment: SegmentId, offset: u64, bytes: u64| {
            segment == m.to_segment
                && offset < m.to_offset + m.bytes
                && m.to_offset < offset + bytes
        };
        assert!(!live
            .iter()
            .any(|p| overlaps(p.segment(), p.offset(), p.allocated_size())));
        assert!(!plan.moves()[..i]
            .iter()
            .any(|o| overlaps(o.to_segment, o.to_offset, o.bytes)));
    }
    let sizes: Vec<u64> = live.iter().map(Placement::allocated_size).collect();
    let before = pool.stats();
    pool.apply_moves(plan, live.iter_mut()).unwrap();
    assert_eq!(pool.stats().allocated_bytes, before.allocated_bytes);
    let placement = pool
        .allocate_existing(request)
        .expect("the request fits after the plan");
    let segments = pool.segment_count();
    live.push(placement);
    assert_eq!(pool.segment_count(), segments);
    let mut ranges: Vec<(usize, u64, u64)> = live
        .iter()
        .zip(sizes.iter().chain([&live.last().unwrap().allocated_size()]))
        .map(|(p, &size)| {
            assert_eq!(p.allocated_size(), size);
            (p.slot(), p.offset(), size)
        })
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(
            pair[0].0 != pair[1].0 || pair[0].1 + pair[0].2 <= pair[1].1,
            "{pair:?}"
        );
    }
    let mut books: Vec<(usize, u64, u64)> = (0..pool.segments.len())
        .filter_map(|slot| pool.segment(slot).map(|s| (slot, s)))
        .flat_map(|(slot, s)| s.live_ranges().map(move |(o, b)| (slot, o, b)))
        .collect();
    books.sort_unstable();
    assert_eq!(books, ranges);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// Issue 26, item 5, at random: full segments of allocations of one size (packed, or
    /// mid-sized in segments of free ranges), a window of the request's size in one of them held
    /// only by movable allocations, other allocations movable or pinned at random, and at least
    /// as many freed elsewhere as the window holds: a plan is found (though no free byte need lie
    /// in the window), and it is valid.
    #[test]
    fn a_window_held_only_by_movable_allocations_is_always_found(
        class in 0u8..2,
        size_pick in 0usize..4,
        segments in 2usize..5,
        target_pick in 0usize..4,
        block in 0u64..4,
        movable_bits in proptest::collection::vec(proptest::bool::weighted(0.3), 64),
        freed_bits in proptest::collection::vec(proptest::bool::weighted(0.08), 64),
    ) {
        const WINDOW: u64 = 16 << 10;
        const SEGMENT: u64 = 64 << 10;
        let sizes: [u64; 4] = if class == 0 {
            [1 << 10, 2 << 10, 4 << 10, 8 << 10]
        } else {
            [8 << 10, 8 << 10, 8 << 10, 16 << 10]
        };
        let size = sizes[size_pick];
        let mut pool = pool(ranges_compaction_config(class));
        let count = segments * (SEGMENT / size) as usize;
        let all: Vec<Placement> = (0..count).map(|_| pool.allocate(size).unwrap()).collect();
        let slack = SEGMENT % size;
        proptest::prop_assert_eq!(pool.segment_count(), segments);
        proptest::prop_assert_eq!(pool.stats().free_bytes, slack * segments as u64);
        let mut ids: Vec<SegmentId> = pool.segments().map(|s| s.id).collect();
        ids.sort_unstable();
        let target = ids[target_pick % segments];
        // A window of the request's size held whole by allocations: for the packed class an
        // aligned block; for free ranges the allocations from the first at or after `block`
        // quarters that cover WINDOW bytes.
        let start = block * WINDOW;
        let mut in_target: Vec<&Placement> =
            all.iter().filter(|p| p.segment() == target).collect();
        in_target.sort_by_key(|p| p.offset());
        let held = WINDOW.div_ceil(size) as usize;
        let window: Vec<(SegmentId, u64)> = if class == 0 {
            in_target
                .iter()
                .filter(|p| p.offset() / WINDOW == block)
                .map(|p| (target, p.offset()))
                .collect()
        } else {
            let first = in_target
                .iter()
                .position(|p| p.offset() >= start.min(SEGMENT - WINDOW - slack))
                .unwrap_or(0)
                .min(in_target.len() - held);
            in_target[first..first + held].iter().map(|p| (target, p.offset())).collect()
        };
        let moved: u64 = window.len() as u64 * size;
        proptest::prop_assume!(moved <= pool.rounded_size(WINDOW));
        let is_movable = |segment: SegmentId, offset: u64, index: usize| {
            window.contains(&(segment, offset)) || movable_bits[index % movable_bits.len()]
        };
        let movable_set: std::collections::HashSet<(SegmentId, u64)> = all
            .iter()
            .enumerate()
            .filter(|(index, p)| is_movable(p.segment(), p.offset(), *index))
            .map(|(_, p)| (p.segment(), p.offset()))
            .collect();
        // Frees: at random outside the window, and enough outside the target segment for the
        // window's allocations.
        let mut freed: Vec<bool> = all
            .iter()
            .enumerate()
            .map(|(index, p)| {
                !window.contains(&(p.segment(), p.offset()))
                    && freed_bits[index % freed_bits.len()]
            })
            .collect();
        let mut outside =
            all.iter().zip(&freed).filter(|(p, &f)| f && p.segment() != target).count();
        for (index, p) in all.iter().enumerate() {
            if outside >= window.len() {
                break;
            }
            if p.segment() != target && !freed[index] {
                freed[index] = true;
                outside += 1;
            }
        }
        let mut live = Vec::new();
        for (placement, free) in all.into_iter().zip(freed) {
            if free {
                pool.free(placement);
            } else {
                live.push(placement);
            }
        }
        let movable = |segment: SegmentId, offset: u64| movable_set.contains(&(segment, offset));
        let limits = CompactionLimits::default();
        let estimate = pool.compaction_estimate_where(WINDOW, limits, movable);
        let plan = pool.compaction_plan_where(WINDOW, limits, movable);
        proptest::prop_assert!(plan.is_some(), "no plan; estimate {:?}", estimate);
        proptest::prop_assert!(estimate.is_some());
        apply_checked(&mut pool, plan.unwrap(), WINDOW, &mut live, &movable, limits);
        for placement in live {
            pool.free(placement);
        }
        proptest::prop_assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
}
