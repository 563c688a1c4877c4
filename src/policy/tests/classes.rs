//! The size classes over the H200's limits: large segments shared under the fill and remainder
//! rules, mid-sized segments with room for two, and the books of free ranges under any workload.

use crate::policy::*;

use super::fixtures::*;

/// The default's classes over the H200's limits: packed up to 1 MiB, mid-sized up to 16 MiB,
/// large above.
fn shared_config() -> PolicyConfig {
    PolicyConfig::for_limits(32, 4_292_870_144)
}

#[test]
fn limits_derive_the_shared_classes() {
    let h200 = shared_config();
    assert_eq!(h200.large_fill_eighths, 6);
    assert_eq!(h200.large_remainder_divisor, 4);
    assert_eq!(h200.mid_above_bytes, MIB);
    assert_eq!(h200.large_above_bytes, 16 * MIB);
    let naive = PolicyConfig::naive(4, 1 << 30);
    assert_eq!(
        (
            naive.large_fill_eighths,
            naive.large_remainder_divisor,
            naive.mid_above_bytes
        ),
        (0, 0, 0)
    );
}

/// The default's classes with a cache as large as the demand: nothing is given back, so that the
/// tests see where requests are placed.
fn roomy_config() -> PolicyConfig {
    PolicyConfig {
        cache_headroom_divisor: 1,
        ..shared_config()
    }
}

#[test]
fn a_freed_large_range_serves_requests_of_other_sizes_and_coalesces() {
    let mut pool = pool(roomy_config());
    let first = pool.allocate(100 * MIB).unwrap();
    let segment = first.segment();
    pool.free(first);
    // 80 MiB leaves 20: enough for another large request, and the segment is 4/5 full.
    let a = pool.allocate(80 * MIB).unwrap();
    assert_eq!(
        (a.segment(), a.offset(), a.allocated_size()),
        (segment, 0, 80 * MIB)
    );
    assert_eq!(a.class(), SegmentClass::Large);
    // 20 MiB fills the rest exactly.
    let b = pool.allocate(20 * MIB).unwrap();
    assert_eq!((b.segment(), b.offset()), (segment, 80 * MIB));
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 100 * MIB);
    assert_eq!(stats.free_bytes, 0);
    pool.free(a);
    pool.free(b);
    // Freed, the two ranges are one again: the whole segment serves 100 MiB.
    let c = pool.allocate(100 * MIB).unwrap();
    assert_eq!((c.segment(), c.offset()), (segment, 0));
    assert_eq!(pool.stats().create_segment_calls, 1);
    pool.free(c);
    assert_eq!(pool.trim(), 100 * MIB);
}

#[test]
fn a_small_request_does_not_pin_a_mostly_free_large_segment() {
    let mut pool = pool(roomy_config());
    let big = pool.allocate(64 * MIB).unwrap();
    let segment = big.segment();
    pool.free(big);
    // 20 MiB would leave the 64 MiB segment under 6/8 full: a segment of its own.
    let small = pool.allocate(20 * MIB).unwrap();
    assert_ne!(small.segment(), segment);
    assert_eq!(pool.stats().create_segment_calls, 2);
    // The cached segment still serves a request of its size whole.
    let again = pool.allocate(60 * MIB).unwrap();
    assert_eq!((again.segment(), again.offset()), (segment, 0));
    assert_eq!(pool.stats().create_segment_calls, 2);
    pool.free(small);
    pool.free(again);
}

#[test]
fn a_remainder_no_large_request_could_use_is_not_left_beside_a_request() {
    let mut pool = pool(roomy_config());
    let big = pool.allocate(40 * MIB).unwrap();
    let segment = big.segment();
    pool.free(big);
    // 30 MiB would fill 3/4 of it but leave 10 MiB: more than a quarter of the request, and too
    // little for any large request.
    let a = pool.allocate(30 * MIB).unwrap();
    assert_ne!(a.segment(), segment);
    // 34 MiB leaves 6 MiB, within a quarter of it: served there.
    let b = pool.allocate(34 * MIB).unwrap();
    assert_eq!((b.segment(), b.offset()), (segment, 0));
    assert_eq!(pool.stats().create_segment_calls, 2);
    pool.free(a);
    pool.free(b);
}

#[test]
fn mid_sized_requests_share_segments_with_room_for_two_and_small_ones_use_their_free_space() {
    let mut pool = pool(roomy_config());
    // The first request of a pool: twice it would pass half the demand, so the packed size.
    let first = pool.allocate(3 * MIB).unwrap();
    assert_eq!(first.class(), SegmentClass::Mid);
    assert_eq!(pool.segment(first.slot()).unwrap().size_bytes, 4 * MIB);
    let large = pool.allocate(40 * MIB).unwrap();
    // With a demand of 43 MiB and more, a new one has room for two.
    let a = pool.allocate(3 * MIB).unwrap();
    let segment = a.segment();
    assert_eq!(pool.segment(a.slot()).unwrap().size_bytes, 8 * MIB);
    let b = pool.allocate(3 * MIB).unwrap();
    assert_eq!((b.segment(), b.offset()), (segment, 3 * MIB));
    // No packed segment yet: small requests take the mid-sized class's free space, tightest
    // first (the first segment's 1 MiB, then this one's 2 MiB).
    let c = pool.allocate(MIB).unwrap();
    assert_eq!((c.segment(), c.offset()), (first.segment(), 3 * MIB));
    let d = pool.allocate(64 << 10).unwrap();
    assert_eq!((d.segment(), d.offset()), (segment, 6 * MIB));
    assert_eq!(pool.stats().create_segment_calls, 3);
    for placement in [first, large, a, b, c, d] {
        pool.free(placement);
    }
    assert_eq!(pool.stats().allocated_bytes.current, 0);
}

#[test]
fn a_server_of_varying_mid_sized_requests_stops_creating_segments() {
    let mut pool = pool(shared_config());
    // A fixed linear congruential sequence: each request allocates six tensors of 1 to 16 MiB
    // and frees them when it is answered.
    let mut state = 11u64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut created_at_half = 0;
    for request in 0..400 {
        if request == 200 {
            created_at_half = pool.stats().create_segment_calls;
        }
        let rows = next() % 512 + 1;
        let live: Vec<_> = (1..=6u64)
            .map(|k| pool.allocate(rows * k * (5 << 10)).unwrap())
            .collect();
        for placement in live {
            pool.free(placement);
        }
    }
    let created = pool.stats().create_segment_calls;
    assert_eq!(created, created_at_half, "{created_at_half} then {created}");
    let ratio = pool.stats().reserved_bytes.peak as f64 / pool.stats().requested_bytes.peak as f64;
    assert!(ratio < 1.35, "{ratio}");
}

/// One step of a random workload over every class.
#[derive(Debug, Clone)]
enum Step {
    Allocate(u64),
    Free(usize),
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let size = prop_oneof![1u64..MIB, MIB..16 * MIB, 16 * MIB..96 * MIB,];
    proptest::collection::vec(
        prop_oneof![
            size.prop_map(Step::Allocate),
            any::<usize>().prop_map(Step::Free)
        ],
        1..300,
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Over every class (packed, mid-sized, large): placements never overlap, each segment's
    /// books and the pool's counters agree with the live placements, and once all is freed
    /// `trim` gives every segment back.
    #[test]
    fn shared_classes_never_overlap_and_keep_their_books(steps in steps()) {
        let mut pool = pool(shared_config());
        let mut live: Vec<Placement> = Vec::new();
        for step in steps {
            match step {
                Step::Allocate(size) => live.push(pool.allocate(size).unwrap()),
                Step::Free(index) if !live.is_empty() => {
                    let placement = live.swap_remove(index % live.len());
                    pool.free(placement);
                }
                Step::Free(_) => {}
            }
            let mut ranges: Vec<(usize, u64, u64)> = live
                .iter()
                .map(|p| (p.slot(), p.offset(), p.allocated_size()))
                .collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                proptest::prop_assert!(
                    pair[0].0 != pair[1].0 || pair[0].1 + pair[0].2 <= pair[1].1,
                    "{:?}",
                    pair
                );
            }
            for &(slot, offset, bytes) in &ranges {
                let segment = pool.segment(slot).expect("a live placement's segment is held");
                proptest::prop_assert!(offset + bytes <= segment.size_bytes);
            }
            let stats = pool.stats();
            proptest::prop_assert_eq!(
                stats.allocated_bytes.current,
                live.iter().map(Placement::allocated_size).sum::<u64>()
            );
            proptest::prop_assert_eq!(
                stats.requested_bytes.current,
                live.iter().map(Placement::requested_size).sum::<u64>()
            );
            proptest::prop_assert_eq!(stats.allocations.current, live.len() as u64);
            let mut held = 0;
            for slot in 0..pool.segments.len() {
                let Some(segment) = pool.segment(slot) else { continue };
                held += segment.size_bytes;
                let books = segment.stats(256);
                let mine: u64 = ranges
                    .iter()
                    .filter(|r| r.0 == slot)
                    .map(|r| r.2)
                    .sum();
                proptest::prop_assert_eq!(books.allocated_bytes, mine);
                proptest::prop_assert_eq!(books.allocated_bytes + books.free_bytes, segment.size_bytes);
                proptest::prop_assert_eq!(segment.is_empty(), mine == 0);
            }
            proptest::prop_assert_eq!(held, stats.reserved_bytes.current);
            // The index of free ranges lists exactly the segments' free ranges.
            let listed: usize = (0..pool.segments.len())
                .filter_map(|slot| pool.segment(slot)?.ranges())
                .map(|ranges| ranges.free_ranges().count())
                .sum();
            proptest::prop_assert_eq!(pool.ranges_free.len(), listed);
            proptest::prop_assert!(stats.free_bytes + stats.allocated_bytes.current == held);
        }
        for placement in live {
            pool.free(placement);
        }
        pool.trim();
        proptest::prop_assert_eq!(pool.stats().reserved_bytes.current, 0);
        proptest::prop_assert_eq!(pool.segment_count(), 0);
    }
}

#[test]
fn under_a_budget_a_large_request_takes_a_range_its_rules_would_spare() {
    let mut pool = pool(PolicyConfig {
        budget_bytes: Some(100 * MIB),
        ..roomy_config()
    });
    let a = pool.allocate(100 * MIB).unwrap();
    let segment = a.segment();
    pool.free(a);
    let b = pool.allocate(78 * MIB).unwrap();
    assert_eq!((b.segment(), b.offset()), (segment, 0));
    // 17 MiB in the 22 MiB left would leave 5: more than a quarter of it, and too little for a
    // large request, so the rules ask for a new segment; the budget has no room for one.
    let c = pool.allocate(17 * MIB).unwrap();
    assert_eq!((c.segment(), c.offset()), (segment, 78 * MIB));
    let stats = pool.stats();
    assert_eq!((stats.oom_count, stats.create_segment_calls), (0, 1));
    // With nothing left that fits, the refusal stands and is counted.
    assert!(matches!(
        pool.allocate(17 * MIB),
        Err(PolicyError::OutOfMemory(_))
    ));
    assert_eq!(pool.stats().oom_count, 1);
    pool.free(b);
    pool.free(c);
}

/// `PoolCore::allocate_own_segment`: a packed-sized, a mid-sized and a large request each get
/// a large segment of exactly their size rounded to a block (what `own_segment_bytes` says), two
/// of one mid size no power-of-two segment to share; under a budget, the sum of those sizes is
/// what fits. The naive mode gives each its own segment as ever.
#[test]
fn a_request_in_its_own_segment_reserves_its_rounded_size() {
    let mut core = pool(shared_config());
    let block = core.config().min_block_bytes;
    let mut placements = Vec::new();
    for size in [1000, 3 * MIB + 1, 3 * MIB + 1, 20 * MIB + 7] {
        let before = core.stats().reserved_bytes.current;
        let placement = core.allocate_own_segment(size).unwrap();
        let rounded = size.div_ceil(block) * block;
        assert_eq!(core.own_segment_bytes(size), rounded);
        assert_eq!(
            core.stats().reserved_bytes.current - before,
            rounded,
            "{size}"
        );
        assert_eq!(placement.class, SegmentClass::Large, "{size}");
        assert_eq!(placement.allocated_bytes, rounded, "{size}");
        placements.push(placement);
    }
    for placement in placements {
        core.free(placement);
    }
    core.trim();
    assert_eq!(core.stats().reserved_bytes.current, 0);
    // Under a budget of exactly two rounded requests: both fit, a third byte does not.
    let size = 5 * MIB + 3;
    let rounded = core.own_segment_bytes(size);
    core.set_budget(Some(2 * rounded));
    let first = core.allocate_own_segment(size).unwrap();
    let second = core.allocate_own_segment(size).unwrap();
    assert_eq!(core.stats().reserved_bytes.current, 2 * rounded);
    assert!(matches!(
        core.allocate_own_segment(1),
        Err(PolicyError::OutOfMemory(_))
    ));
    core.free(first);
    core.free(second);
    let mut naive = pool(PolicyConfig::naive(4, 1 << 30));
    let placement = naive.allocate_own_segment(10).unwrap();
    assert_eq!(placement.class, SegmentClass::Dedicated);
    assert_eq!(naive.stats().reserved_bytes.current, 12);
}
