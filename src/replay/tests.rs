//! Replay on small synthetic traces with known answers.

use super::*;

const MIB: u64 = 1 << 20;

fn alloc(addr: u64, size: u64) -> ReplayEvent {
    ReplayEvent::Alloc { addr, size }
}

fn free(addr: u64) -> ReplayEvent {
    ReplayEvent::Free { addr }
}

#[test]
fn peaks_of_a_trace() {
    let events = [
        ReplayEvent::SegmentAlloc { size: 20 * MIB },
        alloc(1, 3 * MIB),
        alloc(2, 5 * MIB),
        free(1),
        alloc(3, MIB),
        ReplayEvent::SegmentAlloc { size: 20 * MIB },
        ReplayEvent::SegmentFree { size: 20 * MIB },
        free(42), // unknown: ignored
    ];
    assert_eq!(trace_peaks(&events), (8 * MIB, 2, Some(40 * MIB)));
    assert_eq!(trace_peaks(&events[1..5]).2, None);
}

#[test]
fn every_strategy_replays_a_churn() {
    // 200 allocations of 1..=8 MiB, each freed four allocations later.
    let mut events = Vec::new();
    for i in 0..200u64 {
        events.push(alloc(i, (i % 8 + 1) * MIB - 100));
        if i >= 4 {
            events.push(free(i - 4));
        }
    }
    let profile = LimitsProfile::H200;
    let mut progress_calls = 0;
    let report = replay(
        "churn",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| progress_calls += 1,
    );
    assert!(progress_calls >= 3);
    assert_eq!(report.events, events.len());
    assert_eq!(report.pytorch_peak_reserved_bytes, None);
    let naive = report.strategy("naive").unwrap();
    assert_eq!(naive.segments_created, 200);
    // One buffer per request: naive reserves exactly the live sizes (rounded to 4 bytes).
    assert_eq!(naive.peak_reserved_bytes, report.peak_requested_bytes);
    let pool = report.strategy("pool").unwrap();
    let pow2 = report.strategy("pool_pow2").unwrap();
    assert!(pool.peak_reserved_bytes >= report.peak_requested_bytes);
    assert!(pool.segments_created < 20, "{pool:?}");
    assert!(pool.internal_fragmentation < 0.001, "{pool:?}");
    assert!(pow2.internal_fragmentation > 0.1, "{pow2:?}");
    assert!(pool.oom_at_event.is_none() && pow2.oom_at_event.is_none());
    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "trace",
        "events",
        "peak_requested_bytes",
        "pytorch_peak_reserved_bytes",
        "strategies",
    ] {
        assert!(json.get(key).is_some(), "{key} missing from {json}");
    }
    for key in [
        "name",
        "peak_reserved_bytes",
        "internal_fragmentation",
        "external_fragmentation",
        "segments_created",
        "oom_at_event",
    ] {
        assert!(json["strategies"][0].get(key).is_some(), "{key} missing");
    }
}

#[test]
fn a_capacity_gives_the_first_oom() {
    let events = [
        alloc(1, 30 * MIB),
        alloc(2, 30 * MIB),
        alloc(3, 30 * MIB),
        alloc(4, 30 * MIB),
    ];
    let profile = LimitsProfile::H200;
    let report = replay(
        "oom",
        &events,
        profile,
        Some(100 * MIB),
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    for strategy in &report.strategies {
        assert_eq!(strategy.oom_at_event, Some(3), "{strategy:?}");
        assert_eq!(strategy.failed_allocations, 1);
        assert!(
            strategy
                .oom_reason
                .as_deref()
                .unwrap()
                .contains("out of memory")
                || strategy.name == "naive"
        );
    }
}

#[test]
fn webgpu_limits_refuse_what_no_buffer_can_hold() {
    let events = [alloc(1, 300 * MIB), alloc(2, MIB)];
    let profile = LimitsProfile::WEBGPU;
    let report = replay(
        "big",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    for strategy in &report.strategies {
        assert_eq!(strategy.oom_at_event, Some(0), "{strategy:?}");
        assert!(
            strategy
                .oom_reason
                .as_deref()
                .unwrap()
                .contains("largest buffer"),
            "{strategy:?}"
        );
    }
    assert_eq!(
        LimitsProfile::by_name("webgpu"),
        Some(LimitsProfile::WEBGPU)
    );
    assert_eq!(LimitsProfile::by_name("nope"), None);
}
