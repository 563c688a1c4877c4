//! Placement and growth under the default policy: packed segments shared and cached, growth
//! proportional and bounded, large segments of the request's size, the budget and the device's
//! refusals, and the naive mode.

use crate::policy::*;

use super::fixtures::*;

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
fn large_requests_get_large_segments_of_their_size_cached_on_free() {
    let mut pool = pool(config());
    let big = pool.allocate(100 * MIB + 1).unwrap();
    assert_eq!(big.class(), SegmentClass::Large);
    assert_eq!(big.allocated_size(), 100 * MIB + 256);
    assert_eq!(pool.stats().reserved_bytes.current, 100 * MIB + 256);
    pool.free(big);
    // Cached for later large requests, given back by a trim.
    assert_eq!(pool.stats().reserved_bytes.current, 100 * MIB + 256);
    assert_eq!(pool.stats().empty_segment_bytes, 100 * MIB + 256);
    assert_eq!(pool.trim(), 100 * MIB + 256);
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
                if let Some(allocator) = segment.allocator() {
                    allocator.check_invariants().unwrap();
                }
            }
        }
    }
}

#[test]
fn a_segment_of_the_request_size_is_the_last_resort_before_out_of_memory() {
    // 3 MiB of device: a 2 MiB packed segment holds two requests of 768 KiB; the third cannot
    // get another 2 MiB segment but fits in one of its own size.
    let mut pool = PoolCore::new(config(), SimulatedStorage::new(Some(3 * MIB))).unwrap();
    let request = 768 << 10;
    let a = pool.allocate(request).unwrap();
    let b = pool.allocate(request).unwrap();
    assert_eq!(a.segment(), b.segment());
    assert_eq!(pool.segment(a.slot()).unwrap().size_bytes, 2 * MIB);
    let c = pool.allocate(request).unwrap();
    assert_ne!(a.segment(), c.segment());
    assert_eq!(c.class(), SegmentClass::Packed);
    assert_eq!(pool.segment(c.slot()).unwrap().size_bytes, request);
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB + request);
    assert_eq!(pool.stats().oom_count, 0);
    assert!(matches!(
        pool.allocate(request),
        Err(PolicyError::OutOfMemory(_))
    ));
    assert_eq!(pool.stats().oom_count, 1);
    for placement in [a, b, c] {
        pool.free(placement);
    }
}

#[test]
fn the_naive_mode_gives_every_request_a_segment_of_its_own_and_reuses_nothing() {
    let mut pool = pool(PolicyConfig::naive(4, 256 * MIB));
    let a = pool.allocate(10).unwrap();
    let b = pool.allocate(3 * MIB + 1).unwrap();
    let c = pool.allocate(8).unwrap();
    for (placement, size) in [(&a, 12), (&b, 3 * MIB + 4), (&c, 8)] {
        assert_eq!(placement.offset(), 0);
        assert_eq!(placement.class(), SegmentClass::Dedicated);
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
    let mut pool = pool(PolicyConfig { ..config() });
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
        PolicyConfig { ..config() },
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
