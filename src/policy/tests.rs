//! Tests of the policy over the simulated storage.

use super::*;

const MIB: u64 = 1 << 20;

fn config() -> PolicyConfig {
    PolicyConfig {
        mode: PolicyMode::Pooled,
        min_block_bytes: 256,
        min_segment_bytes: 2 * MIB,
        max_segment_bytes: 64 * MIB,
        growth_divisor: 8,
        dedicated_above_bytes: 64 * MIB,
        dedicated_reuse_divisor: 0,
        max_allocation_bytes: 256 * MIB,
        rounding: Rounding::Exact,
        keep_empty_divisor: 0,
        budget_bytes: None,
        cache_headroom_divisor: 0,
        large_fill_eighths: 0,
        large_remainder_divisor: 0,
        mid_above_bytes: 0,
    }
}

fn pool(config: PolicyConfig) -> PoolCore<SimulatedStorage> {
    PoolCore::new(config, SimulatedStorage::new(None)).unwrap()
}

#[test]
fn limits_derive_the_configuration() {
    let h200 = PolicyConfig::for_limits(32, 4_292_870_144);
    assert_eq!(h200.min_block_bytes, 256);
    assert_eq!(h200.max_segment_bytes, DEFAULT_MAX_SEGMENT_BYTES);
    assert_eq!(h200.max_allocation_bytes, 4_292_870_144);
    let webgpu = PolicyConfig::for_limits(256, 256 * MIB);
    assert_eq!(webgpu.max_segment_bytes, 64 * MIB);
    let small = PolicyConfig::for_limits(256, 48 * MIB);
    assert_eq!(small.max_segment_bytes, 32 * MIB);
    let odd = PolicyConfig::for_limits(1024, 40 * MIB);
    assert_eq!(
        (odd.min_block_bytes, odd.max_segment_bytes),
        (1024, 32 * MIB)
    );
    PoolCore::new(odd, SimulatedStorage::default()).unwrap();
}

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
    // A dedicated segment kept for reuse while unused is empty too (trim gives it back).
    let dedicated = pool.allocate(12 * MIB).unwrap();
    let size = pool
        .segments()
        .find(|segment| segment.class() == SegmentClass::Dedicated)
        .map(|segment| segment.size_bytes)
        .expect("12 MiB is above the dedicated threshold");
    pool.free(dedicated);
    let stats = pool.stats();
    assert!(
        pool.segments()
            .any(|segment| segment.class() == SegmentClass::Dedicated),
        "the dedicated segment is kept for reuse"
    );
    assert_eq!(stats.empty_segment_bytes, stats.reserved_bytes.current);
    assert!(stats.empty_segment_bytes >= size);
    assert_eq!(stats.external_fragmentation(), 0.0);
}

#[test]
fn small_requests_share_one_segment_and_stay_cached() {
    let mut pool = pool(config());
    let a = pool.allocate(1000).unwrap();
    let b = pool.allocate(5000).unwrap();
    assert_eq!(a.segment(), b.segment());
    assert_eq!((a.offset(), a.allocated_size()), (0, 1024));
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes.current, 2 * MIB);
    assert_eq!(stats.requested_bytes.current, 6000);
    assert_eq!(stats.allocated_bytes.current, 1024 + 5120);
    assert_eq!(stats.create_segment_calls, 1);
    pool.free(a);
    pool.free(b);
    // The segment stays for reuse: no new segment for the next request.
    let c = pool.allocate(4096).unwrap();
    assert_eq!(pool.stats().create_segment_calls, 1);
    pool.free(c);
    assert_eq!(pool.trim(), 2 * MIB);
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(pool.stats().reserved_bytes.peak, 2 * MIB);
    assert_eq!(pool.storage().held_bytes, 0);
}

#[test]
fn growth_is_proportional_and_bounded() {
    let mut pool = pool(config());
    let mut live = Vec::new();
    for _ in 0..200 {
        live.push(pool.allocate(MIB).unwrap());
    }
    let stats = pool.stats();
    // 200 MiB requested; segments of 2, 2, 4, ... up to 64 MiB: reserved stays within 1/8 + one segment.
    assert!(stats.reserved_bytes.current >= 200 * MIB);
    assert!(
        stats.reserved_bytes.current <= 200 * MIB + 200 * MIB / 8 + 64 * MIB,
        "{stats:?}"
    );
    assert!(pool.segments().all(|s| s.size_bytes <= 64 * MIB));
    assert!(
        stats.create_segment_calls < 64,
        "{}",
        stats.create_segment_calls
    );
    for placement in live {
        pool.free(placement);
    }
    assert_eq!(pool.stats().allocated_bytes.current, 0);
    assert_eq!(pool.stats().requested_bytes.total, 200 * MIB);
}

#[test]
fn large_requests_get_dedicated_segments_given_back_on_free() {
    let mut pool = pool(config());
    let big = pool.allocate(100 * MIB + 1).unwrap();
    assert!(big.is_dedicated());
    assert_eq!(big.allocated_size(), 100 * MIB + 256);
    assert_eq!(pool.stats().reserved_bytes.current, 100 * MIB + 256);
    pool.free(big);
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(pool.segment_count(), 0);
}

#[test]
fn bad_requests_are_typed_errors_and_change_nothing() {
    let mut pool = pool(config());
    assert_eq!(pool.allocate(0).unwrap_err(), PolicyError::ZeroSize);
    assert_eq!(
        pool.allocate(256 * MIB + 1).unwrap_err(),
        PolicyError::TooLarge {
            requested_bytes: 256 * MIB + 1,
            max_allocation_bytes: 256 * MIB
        }
    );
    assert_eq!(pool.stats(), PoolStats::default());
}

#[test]
fn budget_gives_back_empty_segments_then_refuses_with_figures() {
    let mut pool = pool(PolicyConfig {
        budget_bytes: Some(8 * MIB),
        ..config()
    });
    let a = pool.allocate(3 * MIB).unwrap(); // a 4 MiB segment
    let b = pool.allocate(MIB).unwrap(); // in its tail
    assert_eq!(pool.stats().reserved_bytes.current, 4 * MIB);
    let c = pool.allocate(3 * MIB).unwrap(); // a second 4 MiB segment: 8 MiB reserved
    assert_eq!(pool.stats().reserved_bytes.current, 8 * MIB);
    let error = pool.allocate(2 * MIB).unwrap_err();
    let PolicyError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert_eq!(oom.requested_bytes, 2 * MIB);
    assert_eq!(oom.reserved_bytes, 8 * MIB);
    assert_eq!(oom.allocated_bytes, 7 * MIB);
    assert_eq!(oom.budget_bytes, Some(8 * MIB));
    let message = error.to_string();
    assert!(
        message.contains("tried to allocate 2.00 MiB") && message.contains("trim()"),
        "{message}"
    );
    assert_eq!(pool.stats().oom_count, 1);
    // Freeing a whole segment lets the budget serve the request: the empty one is given back first.
    pool.free(c);
    let d = pool.allocate(4 * MIB).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 8 * MIB);
    for placement in [a, b, d] {
        pool.free(placement);
    }
}

#[test]
fn a_refusing_device_is_an_out_of_memory_error() {
    let mut pool = PoolCore::new(config(), SimulatedStorage::new(Some(3 * MIB))).unwrap();
    let a = pool.allocate(MIB).unwrap();
    let error = pool.allocate(2 * MIB).unwrap_err();
    let PolicyError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert!(
        oom.device_error
            .as_deref()
            .unwrap()
            .contains("simulated device"),
        "{error}"
    );
    pool.free(a);
}

#[test]
fn release_on_growth_gives_back_segments_too_small() {
    let mut pool = pool(PolicyConfig {
        growth_divisor: 0,
        ..config()
    });
    let small = pool.allocate(MIB).unwrap();
    pool.free(small);
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB);
    let big = pool.allocate(16 * MIB).unwrap();
    // The empty 2 MiB segment could not serve 16 MiB: it was given back before growing.
    assert_eq!(pool.stats().reserved_bytes.current, 16 * MIB);
    assert_eq!(pool.stats().reserved_bytes.peak, 16 * MIB);
    pool.free(big);
    let events = pool.take_events();
    assert_eq!(events.len(), 3);
}

#[test]
#[should_panic(expected = "does not hold it")]
fn freeing_into_another_pool_panics() {
    let mut first = pool(config());
    let mut second = pool(config());
    let placement = first.allocate(100).unwrap();
    second.free(placement);
}

#[test]
fn random_churn_never_overlaps() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    for seed in 0..20u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut pool = pool(PolicyConfig::for_limits(32, 2 << 30));
        let mut live: Vec<Placement> = Vec::new();
        for step in 0..3000 {
            if live.is_empty() || rng.gen_bool(0.6) {
                let placement = pool.allocate(rng.gen_range(1..100_000)).unwrap();
                let (start, end) = (
                    placement.offset(),
                    placement.offset() + placement.allocated_size(),
                );
                for other in &live {
                    if other.segment() == placement.segment() {
                        let (s, e) = (other.offset(), other.offset() + other.allocated_size());
                        assert!(
                            end <= s || e <= start,
                            "seed {seed} step {step}: [{start}, {end}) overlaps [{s}, {e})"
                        );
                    }
                }
                live.push(placement);
            } else {
                let index = rng.gen_range(0..live.len());
                pool.free(live.swap_remove(index));
            }
            for segment in pool.segments() {
                if let Some(allocator) = &segment.allocator {
                    allocator.check_invariants().unwrap();
                }
            }
        }
    }
}

#[test]
fn a_segment_of_the_request_size_is_the_last_resort_before_out_of_memory() {
    // 110 MiB of device: a 64 MiB segment holds the first 40 MiB; the second 40 MiB cannot get
    // another 64 MiB segment but fits in one of its own size.
    let mut pool = PoolCore::new(config(), SimulatedStorage::new(Some(110 * MIB))).unwrap();
    let a = pool.allocate(40 * MIB).unwrap();
    let b = pool.allocate(40 * MIB).unwrap();
    assert_ne!(a.segment(), b.segment());
    assert_eq!(pool.segment(b.slot()).unwrap().size_bytes, 40 * MIB);
    assert_eq!(pool.stats().reserved_bytes.current, 104 * MIB);
    assert_eq!(pool.stats().oom_count, 0);
    assert!(matches!(
        pool.allocate(40 * MIB),
        Err(PolicyError::OutOfMemory(_))
    ));
    assert_eq!(pool.stats().oom_count, 1);
    pool.free(a);
    pool.free(b);
}

#[test]
fn the_naive_mode_gives_every_request_a_segment_of_its_own_and_reuses_nothing() {
    let mut pool = pool(PolicyConfig::naive(4, 256 * MIB));
    let a = pool.allocate(10).unwrap();
    let b = pool.allocate(3 * MIB + 1).unwrap();
    let c = pool.allocate(8).unwrap();
    for (placement, size) in [(&a, 12), (&b, 3 * MIB + 4), (&c, 8)] {
        assert_eq!(placement.offset(), 0);
        assert!(placement.is_dedicated());
        assert_eq!(placement.allocated_size(), size);
    }
    let ids = [a.segment(), b.segment(), c.segment()];
    assert_eq!(ids, [SegmentId(0), SegmentId(1), SegmentId(2)]);
    let stats = pool.stats();
    assert_eq!(stats.create_segment_calls, 3);
    assert_eq!(stats.segments.current, 3);
    assert_eq!(stats.reserved_bytes.current, 12 + 3 * MIB + 4 + 8);
    assert_eq!(stats.allocated_bytes.current, stats.reserved_bytes.current);
    assert_eq!(stats.requested_bytes.current, 10 + 3 * MIB + 1 + 8);
    assert_eq!((stats.free_bytes, stats.largest_free_bytes), (0, 0));
    // Freed: the segment is given back at once, and never reused.
    let b_slot = b.slot();
    pool.free(b);
    assert_eq!(pool.segment_count(), 2);
    assert_eq!(
        pool.take_events().last(),
        Some(&SegmentEvent::Destroyed {
            id: SegmentId(1),
            size_bytes: 3 * MIB + 4,
        })
    );
    let d = pool.allocate(3 * MIB + 1).unwrap();
    assert_eq!(d.segment(), SegmentId(3));
    assert_eq!(d.slot(), b_slot, "the lowest vacant slot is taken again");
    assert_eq!(pool.stats().create_segment_calls, 4);
    assert_eq!(pool.trim(), 0);
    for placement in [a, c, d] {
        pool.free(placement);
    }
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes.current, 0);
    assert_eq!(stats.segments.current, 0);
    assert_eq!(stats.reserved_bytes.peak, 12 + 3 * MIB + 4 + 8);
    assert!(matches!(
        pool.allocate(256 * MIB + 1),
        Err(PolicyError::TooLarge { .. })
    ));
}

#[test]
fn the_naive_mode_runs_out_of_memory_with_figures() {
    let mut pool = PoolCore::new(
        PolicyConfig::naive(4, 256 * MIB),
        SimulatedStorage::new(Some(MIB)),
    )
    .unwrap();
    let a = pool.allocate(MIB / 2).unwrap();
    let error = pool.allocate(MIB).unwrap_err();
    let PolicyError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert_eq!(oom.segment_bytes, MIB);
    assert_eq!(oom.reserved_bytes, MIB / 2);
    assert_eq!(oom.allocated_bytes, MIB / 2);
    assert!(oom.device_error.is_some());
    pool.free(a);
    assert!(pool.allocate(MIB).is_ok());
}

#[test]
fn a_budget_refusal_keeps_the_cached_segments_it_could_not_use() {
    // Issue 13, item 3: giving back the empty segment cannot bring the request under the budget,
    // so the refusal gives back nothing: the statistics stay as they were.
    let mut pool = pool(PolicyConfig {
        keep_empty_divisor: 32,
        ..config()
    });
    let a = pool.allocate(3 * MIB / 2).unwrap(); // a 2 MiB segment
    let b = pool.allocate(3 * MIB / 2).unwrap(); // a second one
    pool.free(b);
    assert_eq!(pool.stats().reserved_bytes.current, 4 * MIB);
    pool.set_budget(Some(5 * MIB));
    let before = pool.stats();
    let error = pool.allocate(4 * MIB).unwrap_err();
    let PolicyError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    let after = pool.stats();
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert_eq!(after.segments, before.segments);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.oom_count, before.oom_count + 1);
    assert_eq!(oom.reserved_bytes, 4 * MIB);
    pool.free(a);
}

#[test]
fn a_device_refusal_reports_the_empty_segments_it_gave_back() {
    // When the device refuses, the empty segments are given back and the request is tried again
    // (as PyTorch frees its cache and retries): the error says how much was given back.
    let mut pool = PoolCore::new(
        PolicyConfig {
            keep_empty_divisor: 32,
            ..config()
        },
        SimulatedStorage::new(Some(5 * MIB)),
    )
    .unwrap();
    let a = pool.allocate(3 * MIB / 2).unwrap();
    let b = pool.allocate(3 * MIB / 2).unwrap();
    pool.free(b);
    let error = pool.allocate(4 * MIB).unwrap_err();
    let PolicyError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert_eq!(oom.released_bytes, 2 * MIB);
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB);
    assert!(error.to_string().contains("gave back 2.00 MiB"), "{error}");
    pool.free(a);
}

/// The default's cache: `cache_headroom_divisor` 4 over the test configuration, dedicated
/// segments reused within 1/8.
fn cached_config() -> PolicyConfig {
    PolicyConfig {
        dedicated_above_bytes: 8 * MIB,
        dedicated_reuse_divisor: 8,
        keep_empty_divisor: 0,
        cache_headroom_divisor: 4,
        ..config()
    }
}

#[test]
fn limits_derive_the_cache_headroom_and_the_dedicated_threshold() {
    let h200 = PolicyConfig::for_limits(32, 4_292_870_144);
    assert_eq!(h200.cache_headroom_divisor, 32);
    assert_eq!(h200.dedicated_above_bytes, DEFAULT_MAX_SEGMENT_BYTES / 4);
    assert_eq!(PolicyConfig::naive(4, 1 << 30).cache_headroom_divisor, 0);
}

#[test]
fn empty_segments_stay_cached_within_the_headroom_over_demand() {
    let mut pool = pool(cached_config());
    // Demand reaches 40 MiB: four dedicated segments of 10 MiB.
    let first: Vec<_> = (0..4).map(|_| pool.allocate(10 * MIB).unwrap()).collect();
    for placement in first {
        pool.free(placement);
    }
    // 40 MiB stay cached. An 8.5 MiB request cannot reuse them (10 MiB is beyond 1/8 of slack); a
    // new segment would take reserved to 48.5 MiB, within 40 + 40 / 4 = 50: nothing is given back.
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

/// Small segments of 64 KiB in 256-byte blocks: holes appear after a few frees.
fn compaction_config() -> PolicyConfig {
    PolicyConfig {
        min_segment_bytes: 64 << 10,
        max_segment_bytes: 64 << 10,
        growth_divisor: 0,
        dedicated_above_bytes: 64 << 10,
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
            dedicated_above_bytes: 8 << 10,
            ..ranges_compaction_config(3)
        },
        // Empty large segments stay cached within the default headroom, for later requests to
        // share.
        _ => PolicyConfig {
            dedicated_above_bytes: 4 << 10,
            large_fill_eighths: if class == 2 { 6 } else { 1 },
            large_remainder_divisor: if class == 2 { 4 } else { 0 },
            dedicated_reuse_divisor: 8,
            cache_headroom_divisor: 32,
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
    assert_ne!(m.to_slot, plan.slot());
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
    // A dedicated request is never compacted for.
    let Err(PolicyError::OutOfMemory(oom)) = pool.allocate(80 << 10) else {
        panic!("the budget refuses a dedicated segment");
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
                        proptest::prop_assert_ne!(m.to_slot, plan.slot());
                        // Between segments of one kind: packed, mid-sized ranges or large ranges.
                        let kind = |slot: usize| {
                            let segment = pool.segment(slot).expect("a plan's segment is held");
                            (segment.allocator.is_some(), segment.large.as_ref().map(Ranges::is_mid))
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

/// Checks `plan` against the placements `live` (whose sources must all be `movable`) and applies
/// it: every move from a movable allocation of the plan's segment into another segment of its
/// kind, the destinations overlapping nothing live and one another, within `limits`; afterwards
/// every allocation once, with its size, as the books say, and `request` fits without growing.
fn apply_checked(
    pool: &mut PoolCore<SimulatedStorage>,
    plan: CompactionPlan,
    live: &mut Vec<Placement>,
    movable: &dyn Fn(SegmentId, u64) -> bool,
    limits: CompactionLimits,
) {
    let request = plan.request_bytes();
    assert!(plan.moved_bytes() <= pool.rounded_size(request) * limits.max_moved_factor);
    assert!(plan.moves().len() <= limits.max_moves);
    let kind = |pool: &PoolCore<SimulatedStorage>, slot: usize| {
        let segment = pool.segment(slot).expect("a plan's segment is held");
        (
            segment.allocator.is_some(),
            segment.large.as_ref().map(Ranges::is_mid),
        )
    };
    for (i, m) in plan.moves().iter().enumerate() {
        assert_ne!(m.to_slot, plan.slot());
        assert_eq!(m.from_slot, plan.slot());
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
        apply_checked(&mut pool, plan.unwrap(), &mut live, &movable, limits);
        for placement in live {
            pool.free(placement);
        }
        proptest::prop_assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
}

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
    assert_eq!(h200.dedicated_above_bytes, 16 * MIB);
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
    assert!(a.is_dedicated());
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
    assert!(
        first.is_dedicated(),
        "a mid-sized placement is in a free-range segment"
    );
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
                .filter_map(|slot| pool.segment(slot)?.large.as_ref())
                .map(|ranges| ranges.free_ranges().count())
                .sum();
            proptest::prop_assert_eq!(pool.ranges_free[0].len() + pool.ranges_free[1].len(), listed);
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

#[test]
fn any_limits_give_a_policy_the_pool_accepts() {
    for alignment in [0, 1, 32, 256, 1 << 27, 1 << 40, 1 << 63, u64::MAX] {
        for max_buffer in [0, 4, 256, MIB, 4_292_870_144, 1 << 63, u64::MAX] {
            let config = PolicyConfig::for_limits(alignment, max_buffer);
            assert!(config.min_segment_bytes <= config.max_segment_bytes);
            let mut pool = PoolCore::new(config, SimulatedStorage::new(None))
                .unwrap_or_else(|e| panic!("for_limits({alignment}, {max_buffer}): {e}"));
            // A byte is placed, or refused with a typed error when no buffer can hold it.
            match pool.allocate(1) {
                Ok(placement) => pool.free(placement),
                Err(error) => assert!(
                    matches!(error, PolicyError::TooLarge { .. }),
                    "for_limits({alignment}, {max_buffer}): {error}"
                ),
            }
        }
    }
}

#[test]
fn sizes_whose_rounding_passes_u64_are_refused_as_too_large() {
    let open = PolicyConfig {
        max_allocation_bytes: u64::MAX,
        ..config()
    };
    let configs = [
        PolicyConfig::naive(4, u64::MAX),
        open.clone(),
        PolicyConfig {
            rounding: Rounding::PowerOfTwo,
            ..open.clone()
        },
        PolicyConfig::for_limits(32, u64::MAX),
    ];
    for config in configs {
        let mut pool = pool(config.clone());
        for size in [u64::MAX, u64::MAX - 1, (1 << 63) + 1] {
            let refused = pool.allocate(size);
            if config.rounding == Rounding::Exact && size == (1 << 63) + 1 {
                // Exact rounding of 2^63 + 1 to 256 bytes fits in u64: a typed refusal or a
                // placement, never a panic (the simulated storage has no capacity).
                if let Ok(placement) = refused {
                    pool.free(placement);
                }
                continue;
            }
            assert!(
                matches!(refused, Err(PolicyError::TooLarge { .. })),
                "{size}: {refused:?} under {config:?}"
            );
            assert!(pool.allocate_existing(size).is_none());
            assert_eq!(
                pool.compaction_estimate(size, CompactionLimits::default()),
                None
            );
            assert_eq!(pool.rounded_size(size), u64::MAX);
        }
        assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
    let buddy = BuddyAllocator::with_capacity(256, 256 * MIB, Rounding::PowerOfTwo).unwrap();
    assert_eq!(buddy.rounded_size(u64::MAX), u64::MAX);
    assert_eq!(buddy.rounded_size((1 << 63) + 1), u64::MAX);
    let exact = BuddyAllocator::with_capacity(256, 256 * MIB, Rounding::Exact).unwrap();
    assert_eq!(exact.rounded_size(u64::MAX), u64::MAX);
    assert_eq!(exact.rounded_size(300), 512);
}

#[test]
fn settings_that_break_their_documented_rules_are_refused() {
    let cases = [
        PolicyConfig {
            max_segment_bytes: 3 << 31,
            ..config()
        },
        PolicyConfig {
            min_segment_bytes: 3 * MIB,
            ..config()
        },
        PolicyConfig {
            min_segment_bytes: 128 * MIB,
            ..config()
        },
        PolicyConfig {
            large_fill_eighths: 9,
            ..config()
        },
    ];
    for case in cases {
        let refused = PoolCore::new(case.clone(), SimulatedStorage::new(None)).map(drop);
        assert!(
            matches!(refused, Err(PolicyError::Setting(_))),
            "{refused:?} for {case:?}"
        );
        assert_eq!(case.validate(), refused);
    }
    // A block that is no power of two is the buddy's refusal.
    let odd_block = PolicyConfig {
        min_block_bytes: 300,
        ..config()
    };
    assert!(matches!(odd_block.validate(), Err(PolicyError::Config(_))));
    assert_eq!(config().validate(), Ok(()));
}

#[test]
fn a_simulated_storage_set_past_its_capacity_refuses_with_a_message() {
    let mut storage = SimulatedStorage::new(Some(MIB));
    storage.held_bytes = 2 * MIB;
    let error = storage.create_segment(MIB, false).unwrap_err();
    assert!(error.reason.contains("0 bytes free"), "{}", error.reason);
    storage.held_bytes = u64::MAX;
    assert!(storage.create_segment(1, false).is_err());
    storage.held_bytes = 0;
    storage.destroy_segment(MIB);
    assert_eq!(storage.held_bytes, 0);
}
