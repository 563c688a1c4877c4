//! The cache bounded by demand: which empty segments stay, which go before growing, and how
//! empty segments count in the fragmentation figures.

use crate::policy::*;

use super::fixtures::*;

#[test]
fn empty_segments_are_not_external_fragmentation() {
    // Issue 26, item 12: five empty 2 MiB segments read as 80% external fragmentation.
    let mut pool = pool(cached_config());
    let held: Vec<Placement> = (0..5).map(|_| pool.allocate(2 * MIB).unwrap()).collect();
    let segments = pool.stats().segments.current;
    for placement in held {
        pool.free(placement);
    }
    let stats = pool.stats();
    assert_eq!(stats.segments.current, segments, "the segments stay cached");
    assert_eq!(stats.empty_segment_bytes, stats.reserved_bytes.current);
    assert_eq!(stats.free_bytes, stats.reserved_bytes.current);
    assert_eq!(stats.external_fragmentation(), 0.0);
    // Three small allocations in one segment, the middle one freed: the hole it leaves beside
    // the segment's free rest is what counts, not the empty segments.
    let a = pool.allocate(1000).unwrap();
    let b = pool.allocate(1000).unwrap();
    let c = pool.allocate(1000).unwrap();
    pool.free(b);
    let stats = pool.stats();
    let held_free = stats.free_bytes - stats.empty_segment_bytes;
    assert!(held_free > stats.largest_held_free_bytes);
    let expected = 1.0 - stats.largest_held_free_bytes as f64 / held_free as f64;
    assert!((stats.external_fragmentation() - expected).abs() < 1e-12);
    assert!(stats.external_fragmentation() > 0.0);
    pool.free(a);
    pool.free(c);
    assert_eq!(pool.stats().external_fragmentation(), 0.0);
    // A large segment cached while unused is empty too (trim gives it back).
    let large = pool.allocate(12 * MIB).unwrap();
    let size = pool
        .segments()
        .find(|segment| segment.class() == SegmentClass::Large)
        .map(|segment| segment.size_bytes)
        .expect("12 MiB is above the large threshold");
    pool.free(large);
    let stats = pool.stats();
    assert!(
        pool.segments()
            .any(|segment| segment.class() == SegmentClass::Large),
        "the large segment is kept for reuse"
    );
    assert_eq!(stats.empty_segment_bytes, stats.reserved_bytes.current);
    assert!(stats.empty_segment_bytes >= size);
    assert_eq!(stats.external_fragmentation(), 0.0);
}

/// The default's cache with `cache_headroom_divisor` 4, over large segments above 8 MiB reused
/// only by requests that fill them (`large_fill_eighths` 8), so that which segment serves is
/// plain.
fn cached_config() -> PolicyConfig {
    PolicyConfig {
        large_above_bytes: 8 * MIB,
        large_fill_eighths: 8,
        cache_headroom_divisor: 4,
        ..config()
    }
}

#[test]
fn limits_derive_the_cache_headroom_and_the_large_threshold() {
    let h200 = PolicyConfig::for_limits(32, 4_292_870_144);
    assert_eq!(h200.cache_headroom_divisor, 32);
    assert_eq!(h200.large_above_bytes, DEFAULT_MAX_SEGMENT_BYTES / 4);
    assert_eq!(PolicyConfig::naive(4, 1 << 30).cache_headroom_divisor, 0);
}

#[test]
fn empty_segments_stay_cached_within_the_headroom_over_demand() {
    let mut pool = pool(cached_config());
    // Demand reaches 40 MiB: four large segments of 10 MiB.
    let first: Vec<_> = (0..4).map(|_| pool.allocate(10 * MIB).unwrap()).collect();
    for placement in first {
        pool.free(placement);
    }
    // 40 MiB stay cached. An 8.5 MiB request cannot reuse them (it would not fill one); a new
    // segment would take reserved to 48.5 MiB, within 40 + 40 / 4 = 50: nothing is given back.
    let a = pool.allocate(17 * MIB / 2).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 97 * MIB / 2);
    assert_eq!(pool.stats().create_segment_calls, 5);
    // Another would reach 57 MiB: one empty segment (the least recently used) goes, leaving 47.
    let b = pool.allocate(17 * MIB / 2).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 47 * MIB);
    assert_eq!(pool.stats().segments.current, 5);
    // A 10 MiB request reuses a cached segment: nothing is created.
    let c = pool.allocate(10 * MIB).unwrap();
    assert_eq!(pool.stats().create_segment_calls, 6);
    for placement in [a, b, c] {
        pool.free(placement);
    }
}

#[test]
fn the_least_recently_used_empty_segment_is_given_back_first() {
    let mut pool = pool(cached_config());
    let old = pool.allocate(12 * MIB).unwrap();
    let recent = pool.allocate(10 * MIB).unwrap();
    let (old_id, recent_id) = (old.segment(), recent.segment());
    pool.free(old);
    pool.free(recent);
    // Demand stays 22 MiB (20 MiB with nothing live is less): the ceiling is 27.5 MiB. A new
    // 20 MiB segment needs both empty ones gone (22 + 20 and 10 + 20 pass it): the older first.
    let big = pool.allocate(20 * MIB).unwrap();
    let destroyed: Vec<_> = pool
        .take_events()
        .into_iter()
        .filter_map(|event| match event {
            SegmentEvent::Destroyed { id, .. } => Some(id),
            SegmentEvent::Created { .. } => None,
        })
        .collect();
    assert_eq!(destroyed, vec![old_id, recent_id]);
    pool.free(big);
}

#[test]
fn the_headroom_measures_demand_not_the_current_allocation() {
    let mut pool = pool(cached_config());
    // Demand peaks at 32 MiB, then falls to nothing: the empty segments stay cached.
    let peak: Vec<_> = (0..2).map(|_| pool.allocate(16 * MIB).unwrap()).collect();
    for placement in peak {
        pool.free(placement);
    }
    // A small request grows a packed segment (of reserved / 8): 32 + 4 <= 40, nothing given back.
    let small = pool.allocate(MIB).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 36 * MIB);
    assert_eq!(pool.stats().segments.current, 3);
    pool.free(small);
    // Peaks reset by the caller do not shrink the cache.
    pool.reset_peaks();
    let again = pool.allocate(MIB).unwrap();
    assert_eq!(pool.stats().segments.current, 3);
    pool.free(again);
}

proptest::proptest! {
    /// Whatever the churn: reserved never passes the ceiling of the headroom over demand by more
    /// than the live segments force it to (the segments holding allocations plus the one created),
    /// and under a budget the cached segments are given back rather than refusing a request that
    /// fits once they are gone.
    #[test]
    fn cached_segments_are_given_back_under_pressure(
        sizes in proptest::collection::vec((1u64..24 * MIB, proptest::bool::ANY), 1..200),
        budget_mib in 48u64..160,
    ) {
        let budget = budget_mib * MIB;
        let mut pool = pool(PolicyConfig {
            budget_bytes: Some(budget),
            ..cached_config()
        });
        let mut live: Vec<Placement> = Vec::new();
        let mut demand = 0u64;
        for (size, free_first) in sizes {
            if free_first && !live.is_empty() {
                pool.free(live.remove(0));
            }
            let before = pool.stats();
            let busy: u64 = pool.segments().filter(|s| !s.is_empty()).map(|s| s.size_bytes).sum();
            match pool.allocate(size) {
                Ok(placement) => {
                    let after = pool.stats();
                    demand = demand.max(after.allocated_bytes.current);
                    proptest::prop_assert!(after.reserved_bytes.current <= budget);
                    if after.create_segment_calls > before.create_segment_calls {
                        let created = pool.segment(placement.slot()).unwrap().size_bytes;
                        let ceiling = demand + demand / 4;
                        proptest::prop_assert!(
                            after.reserved_bytes.current <= ceiling.max(busy + created),
                            "reserved {} ceiling {} busy {} created {}",
                            after.reserved_bytes.current, ceiling, busy, created
                        );
                    }
                    live.push(placement);
                }
                Err(PolicyError::OutOfMemory(oom)) => {
                    // Refused only when the busy segments leave no room even with the cache gone.
                    proptest::prop_assert!(busy + pool.rounded_size(size) > budget, "{oom:?}");
                    proptest::prop_assert!(pool.stats().reserved_bytes.current <= budget);
                }
                Err(other) => proptest::prop_assert!(false, "{other}"),
            }
        }
        for placement in live {
            pool.free(placement);
        }
        proptest::prop_assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
}
