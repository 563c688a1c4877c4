//! Scenario tests with exact offsets, and property tests over random interval sets.

use proptest::prelude::*;

use super::buffers::{max_live_bytes, Buffer, Placement, Plan, PlanError, PlanOptions};
use super::greedy::greedy_by_size;
use super::search::plan;

fn b(id: u64, lower: u64, upper: u64, size: u64) -> Buffer {
    Buffer::new(id, lower, upper, size)
}

/// A small budget keeps the property tests quick.
fn quick(alignment: u64) -> PlanOptions {
    PlanOptions {
        alignment,
        search_steps: 200_000,
        ..PlanOptions::default()
    }
}

#[test]
fn max_live_counts_half_open_lifetimes() {
    assert_eq!(max_live_bytes(&[]), 0);
    // [0, 2) and [2, 4) never live together; [1, 3) meets both.
    let buffers = [b(0, 0, 2, 10), b(1, 2, 4, 20), b(2, 1, 3, 5)];
    assert_eq!(max_live_bytes(&buffers), 25);
}

#[test]
fn greedy_by_size_places_as_tflite_does() {
    // Largest first; each next one at the smallest gap among the placed buffers alive with it.
    let buffers = [
        b(10, 0, 4, 40), // placed 1st at 0
        b(11, 2, 6, 30), // 2nd: overlaps 10, at 40
        b(12, 5, 8, 20), // 3rd: overlaps 11 only, below it at 0 (gap [0, 40) fits)
        b(13, 3, 4, 10), // 4th: overlaps 10 and 11, above 11 at 70
        b(14, 6, 7, 10), // 5th: overlaps 12 only ([5, 8)): at 20
    ];
    let plan = greedy_by_size(&buffers, &PlanOptions::default()).unwrap();
    let offsets: Vec<u64> = plan.placements.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, vec![0, 40, 0, 70, 20]);
    assert_eq!(plan.heap_bytes, 80);
    assert_eq!(plan.max_live_bytes, 80);
    plan.check(&buffers, None).unwrap();
}

#[test]
fn alignment_rounds_offsets_up() {
    let buffers = [b(0, 0, 2, 5), b(1, 0, 2, 3), b(2, 1, 3, 1)];
    for planner in [greedy_by_size, plan] {
        let plan = planner(&buffers, &PlanOptions::aligned(8)).unwrap();
        plan.check(&buffers, None).unwrap();
        assert!(plan.placements.iter().all(|p| p.offset % 8 == 0));
        // 5 at 0, 3 at 8, 1 at 16: the heap ends at the last true end.
        assert_eq!(plan.heap_bytes, 17);
    }
}

#[test]
fn bad_input_is_an_error() {
    let ok = b(0, 0, 1, 1);
    let cases: Vec<(Vec<Buffer>, PlanOptions, PlanError)> = vec![
        (
            vec![b(7, 3, 3, 1)],
            PlanOptions::default(),
            PlanError::EmptyLifetime {
                id: 7,
                lower: 3,
                upper: 3,
            },
        ),
        (
            vec![b(7, 4, 3, 1)],
            PlanOptions::default(),
            PlanError::InvertedLifetime {
                id: 7,
                lower: 4,
                upper: 3,
            },
        ),
        (
            vec![ok, b(0, 5, 6, 1)],
            PlanOptions::default(),
            PlanError::DuplicateId(0),
        ),
        (
            vec![ok],
            PlanOptions::aligned(0),
            PlanError::BadAlignment(0),
        ),
        (
            vec![ok],
            PlanOptions::aligned(12),
            PlanError::BadAlignment(12),
        ),
        (
            vec![b(0, 0, 1, u64::MAX), b(1, 0, 1, 1)],
            PlanOptions::default(),
            PlanError::Overflow,
        ),
        (
            vec![b(0, 0, 1, u64::MAX - 2)],
            PlanOptions::aligned(8),
            PlanError::Overflow,
        ),
        (
            vec![b(0, 0, 1, 100)],
            PlanOptions {
                max_arena_bytes: Some(64),
                ..PlanOptions::default()
            },
            PlanError::TooLarge {
                id: 0,
                size: 100,
                max_arena_bytes: 64,
            },
        ),
        (
            vec![b(0, 0, 2, 100), b(1, 1, 3, 100)],
            PlanOptions {
                capacity: Some(150),
                ..PlanOptions::default()
            },
            PlanError::OverCapacity {
                heap_bytes: 200,
                capacity: 150,
                max_live_bytes: 200,
            },
        ),
    ];
    for (buffers, options, error) in cases {
        assert_eq!(greedy_by_size(&buffers, &options), Err(error.clone()));
        assert_eq!(plan(&buffers, &options), Err(error));
    }
}

#[test]
fn check_finds_overlaps_and_misalignment() {
    let buffers = [b(0, 0, 2, 10), b(1, 1, 3, 10)];
    let mut plan = Plan {
        placements: vec![
            Placement {
                id: 0,
                arena: 0,
                offset: 0,
            },
            Placement {
                id: 1,
                arena: 0,
                offset: 5,
            },
        ],
        arena_bytes: vec![15],
        heap_bytes: 15,
        max_live_bytes: 20,
        alignment: 1,
        max_arena_bytes: None,
    };
    assert_eq!(
        plan.check(&buffers, None),
        Err(PlanError::Overlap { a: 0, b: 1 })
    );
    plan.alignment = 4;
    plan.placements[1].offset = 10;
    plan.arena_bytes = vec![20];
    plan.heap_bytes = 20;
    assert!(matches!(
        plan.check(&buffers, None),
        Err(PlanError::Misaligned { id: 1, .. })
    ));
    plan.alignment = 2;
    assert_eq!(plan.check(&buffers, None), Ok(()));
    assert!(matches!(
        plan.check(&buffers, Some(19)),
        Err(PlanError::OverCapacity { .. })
    ));
}

#[test]
fn zero_sized_buffers_take_no_space() {
    let buffers = [b(0, 0, 4, 0), b(1, 0, 4, 8), b(2, 1, 2, 0)];
    let plan = plan(&buffers, &PlanOptions::default()).unwrap();
    plan.check(&buffers, None).unwrap();
    assert_eq!(plan.heap_bytes, 8);
    assert!(plan.placements.iter().all(|p| p.offset == 0));
    let empty = super::search::plan(&[], &PlanOptions::default()).unwrap();
    assert_eq!((empty.heap_bytes, empty.placements.len()), (0, 0));
}

#[test]
fn several_arenas_when_one_cannot_hold_the_plan() {
    // Four buffers of 40 alive together need 160 bytes; arenas of 100 hold two each.
    let buffers: Vec<Buffer> = (0..4).map(|i| b(i, 0, 10, 40)).collect();
    let options = PlanOptions {
        max_arena_bytes: Some(100),
        ..PlanOptions::default()
    };
    for planner in [greedy_by_size, plan] {
        let plan = planner(&buffers, &options).unwrap();
        plan.check(&buffers, None).unwrap();
        assert_eq!(plan.arena_bytes, vec![80, 80]);
        assert_eq!(plan.heap_bytes, 160);
    }
}

/// A perfect tiling: the optimum is the max-live.
#[test]
fn a_perfect_tiling_is_found() {
    //   offset 0..4: A [0, 6)        ; offset 4..6: B [0, 3), C [3, 6)
    //   offset 6..9: D [0, 2), E [2, 6)
    let buffers = [
        b(0, 0, 6, 4),
        b(1, 0, 3, 2),
        b(2, 3, 6, 2),
        b(3, 0, 2, 3),
        b(4, 2, 6, 3),
        b(5, 6, 9, 9),
    ];
    let ours = plan(&buffers, &PlanOptions::default()).unwrap();
    ours.check(&buffers, None).unwrap();
    assert_eq!(ours.heap_bytes, ours.max_live_bytes);
    let greedy = greedy_by_size(&buffers, &PlanOptions::default()).unwrap();
    assert!(ours.heap_bytes <= greedy.heap_bytes);
}

/// Exhaustive search of one-arena plans for tiny instances: every buffer at 0 or on top of
/// another (the optimum is among these), by brute force over the orders of offsets.
fn brute_force(buffers: &[Buffer]) -> u64 {
    fn go(buffers: &[Buffer], offsets: &mut Vec<Option<u64>>, best: &mut u64) {
        let Some(i) = offsets.iter().position(Option::is_none) else {
            let heap = buffers
                .iter()
                .zip(offsets.iter())
                .map(|(b, o)| o.unwrap() + b.size)
                .max()
                .unwrap_or(0);
            *best = (*best).min(heap);
            return;
        };
        let mut candidates = vec![0];
        for (j, o) in offsets.iter().enumerate() {
            if let Some(o) = o {
                candidates.push(o + buffers[j].size);
            }
        }
        for offset in candidates {
            let free = offsets.iter().enumerate().all(|(j, o)| match o {
                Some(o) => {
                    !buffers[i].overlaps_in_time(&buffers[j])
                        || o + buffers[j].size <= offset
                        || offset + buffers[i].size <= *o
                }
                None => true,
            });
            if free {
                offsets[i] = Some(offset);
                go(buffers, offsets, best);
                offsets[i] = None;
            }
        }
    }
    // Any plan can be pushed down so that each buffer rests on 0 or on a buffer below it; the
    // recursion above places buffers in index order, which may miss resting points of buffers
    // placed later, so try every permutation of the index order.
    let n = buffers.len();
    let mut best = u64::MAX;
    let mut perm: Vec<usize> = (0..n).collect();
    permute(&mut perm, 0, &mut |p| {
        let permuted: Vec<Buffer> = p.iter().map(|&i| buffers[i]).collect();
        go(&permuted, &mut vec![None; n], &mut best);
    });
    best
}

fn permute(items: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k == items.len() {
        f(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permute(items, k + 1, f);
        items.swap(k, i);
    }
}

/// Greedy by size written plainly: every placed buffer is compared with every other.
fn plain_greedy(buffers: &[Buffer], alignment: u64) -> Vec<u64> {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(buffers[i].size), buffers[i].lower, i));
    let mut offsets: Vec<Option<u64>> = vec![None; buffers.len()];
    for &i in &order {
        let mut below: Vec<(u64, u64)> = (0..buffers.len())
            .filter_map(|j| {
                let o = offsets[j]?;
                buffers[i]
                    .overlaps_in_time(&buffers[j])
                    .then_some((o, o + buffers[j].size))
            })
            .collect();
        below.sort_unstable();
        let (mut end, mut best): (u64, Option<(u64, u64)>) = (0, None);
        for (o, e) in below {
            let start = end.next_multiple_of(alignment);
            if o >= start && o - start >= buffers[i].size && best.is_none_or(|(g, _)| o - start < g)
            {
                best = Some((o - start, start));
            }
            end = end.max(e);
        }
        offsets[i] = Some(best.map_or(end.next_multiple_of(alignment), |(_, o)| o));
    }
    offsets.into_iter().map(|o| o.unwrap_or(0)).collect()
}

fn interval_set(max_len: usize) -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0u64..40, 1u64..20, 1u64..100), 0..max_len).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (lower, len, size))| b(1000 + i as u64, lower, lower + len, size))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn plans_are_valid_aligned_bounded_and_deterministic(
        buffers in interval_set(60),
        alignment in prop::sample::select(vec![1u64, 4, 256]),
    ) {
        let options = quick(alignment);
        let greedy = greedy_by_size(&buffers, &options).unwrap();
        let ours = plan(&buffers, &options).unwrap();
        for plan in [&greedy, &ours] {
            plan.check(&buffers, None).unwrap();
            prop_assert!(plan.placements.iter().all(|p| p.offset % alignment == 0));
            prop_assert!(plan.heap_bytes >= plan.max_live_bytes);
            prop_assert_eq!(plan.max_live_bytes, max_live_bytes(&buffers));
            prop_assert_eq!(plan.arena_bytes.len(), usize::from(!buffers.is_empty()));
        }
        prop_assert!(ours.heap_bytes <= greedy.heap_bytes);
        prop_assert_eq!(&plan(&buffers, &options).unwrap(), &ours);
        // Without a budget only the starting orderings remain, greedy-by-size's among them.
        let unsearched = plan(&buffers, &PlanOptions { search_steps: 0, ..options.clone() }).unwrap();
        unsearched.check(&buffers, None).unwrap();
        prop_assert!(unsearched.heap_bytes <= greedy.heap_bytes);
        prop_assert_eq!(&greedy_by_size(&buffers, &options).unwrap(), &greedy);
    }

    #[test]
    fn greedy_by_size_matches_a_plain_implementation(
        buffers in interval_set(60),
        alignment in prop::sample::select(vec![1u64, 8, 64]),
    ) {
        let greedy = greedy_by_size(&buffers, &PlanOptions::aligned(alignment)).unwrap();
        let offsets: Vec<u64> = greedy.placements.iter().map(|p| p.offset).collect();
        prop_assert_eq!(offsets, plain_greedy(&buffers, alignment));
    }

    #[test]
    fn several_arenas_hold_every_buffer_within_the_limit(
        buffers in interval_set(40),
        limit in 100u64..400,
    ) {
        let options = PlanOptions { max_arena_bytes: Some(limit), ..quick(4) };
        for plan in [greedy_by_size(&buffers, &options).unwrap(), plan(&buffers, &options).unwrap()] {
            plan.check(&buffers, None).unwrap();
            prop_assert!(plan.arena_bytes.iter().all(|&bytes| bytes <= limit));
            prop_assert!(plan.heap_bytes >= plan.max_live_bytes);
        }
    }

    #[test]
    fn small_instances_are_solved_exactly(buffers in interval_set(6)) {
        // interval_set(6) gives at most 5 buffers.
        let ours = plan(&buffers, &PlanOptions::default()).unwrap();
        ours.check(&buffers, None).unwrap();
        prop_assert_eq!(ours.heap_bytes, if buffers.is_empty() { 0 } else { brute_force(&buffers) });
    }
}
