//! Replay on small synthetic traces with known answers.

use super::*;
use crate::snapshot::Snapshot;

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
    assert_eq!(report.pytorch_segments_created, None);
    let naive = report.strategy("naive").unwrap();
    assert_eq!(naive.segments_created, 200);
    // Every request a buffer of its own: the bytes created are every request, rounded to 4.
    let requested: u64 = (0..200u64)
        .map(|i| ((i % 8 + 1) * MIB - 100).div_ceil(4) * 4)
        .sum();
    assert_eq!(naive.bytes_created, requested);
    // One buffer per request: naive reserves exactly the live sizes (rounded to 4 bytes).
    assert_eq!(naive.peak_reserved_bytes, report.peak_requested_bytes);
    let pool = report.strategy("pool").unwrap();
    let pow2 = report.strategy("pool_pow2").unwrap();
    assert!(pool.peak_reserved_bytes >= report.peak_requested_bytes);
    assert!(pool.segments_created < 20, "{pool:?}");
    assert!(pool.bytes_created >= pool.peak_reserved_bytes, "{pool:?}");
    assert!(pool.bytes_created < naive.bytes_created, "{pool:?}");
    assert!(pool.internal_fragmentation < 0.001, "{pool:?}");
    assert!(pow2.internal_fragmentation > 0.1, "{pow2:?}");
    assert!(pool.oom_at_event.is_none() && pow2.oom_at_event.is_none());
    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "trace",
        "events",
        "peak_requested_bytes",
        "pytorch_peak_reserved_bytes",
        "pytorch_segments_created",
        "pytorch_bytes_created",
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
        "bytes_created",
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

/// The real traces captured from PyTorch on an H200 (`tests/data/traces`).
fn real_trace(name: &str) -> Vec<ReplayEvent> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces")
        .join(name);
    let snapshot = Snapshot::from_path(&path).unwrap_or_else(|error| {
        panic!(
            "this test replays the real trace {}, expected in tests/data/traces: {error}",
            path.display()
        )
    });
    ReplayEvent::from_snapshot(&snapshot)
}

#[test]
fn the_default_policy_meets_its_target_on_the_real_traces() {
    // Peak reserved within 1.10 x peak requested, and no more than PyTorch reserved.
    for (name, requested, pytorch) in [
        ("gpt_train.pickle", 5_386_548_180u64, 6_712_983_552u64),
        ("frag_churn.pickle", 2_435_842_048, 3_135_242_240),
    ] {
        let events = real_trace(name);
        let profile = LimitsProfile::H200;
        let report = replay(
            name,
            &events,
            profile,
            None,
            &Strategy::defaults(&profile),
            &mut |_| {},
        );
        assert_eq!(report.peak_requested_bytes, requested, "{name}");
        assert_eq!(report.pytorch_peak_reserved_bytes, Some(pytorch), "{name}");
        let pool = report.strategy("pool").unwrap();
        let ratio = pool.peak_reserved_bytes as f64 / requested as f64;
        assert!(
            ratio <= 1.10,
            "{name}: pool reserved {ratio:.3} x peak requested"
        );
        assert!(
            pool.peak_reserved_bytes <= pytorch,
            "{name}: pool reserved more than PyTorch"
        );
        assert!(pool.oom_at_event.is_none(), "{name}: {pool:?}");
        assert_eq!(
            report.strategy("naive").unwrap().peak_reserved_bytes,
            requested,
            "{name}"
        );
        // The plots' timelines end at the trace's end and peak where the figures say.
        assert_eq!(
            pool.reserved_timeline.iter().map(|p| p.1).max(),
            Some(pool.peak_reserved_bytes)
        );
        assert_eq!(
            report.requested_timeline.iter().map(|p| p.1).max(),
            Some(requested)
        );
        assert!(pool.reserved_timeline.len() <= TIMELINE_POINTS);
    }
}

#[test]
fn a_capacity_below_the_peak_gives_an_oom_on_the_real_trace() {
    let events = real_trace("frag_churn.pickle");
    let profile = LimitsProfile::H200;
    let report = replay(
        "frag_churn",
        &events,
        profile,
        Some(2 << 30),
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    for strategy in &report.strategies {
        assert!(strategy.oom_at_event.is_some(), "{strategy:?}");
        assert!(strategy.peak_reserved_bytes <= 2 << 30, "{strategy:?}");
    }
    // Under WebGPU's limits the 823 MB logits of gpt_train cannot be one buffer at all.
    let events = real_trace("gpt_train.pickle");
    let report = replay(
        "gpt_train",
        &events,
        LimitsProfile::WEBGPU,
        None,
        &Strategy::defaults(&LimitsProfile::WEBGPU),
        &mut |_| {},
    );
    let pool = report.strategy("pool").unwrap();
    assert!(
        pool.oom_reason
            .as_deref()
            .unwrap()
            .contains("largest buffer"),
        "{pool:?}"
    );
}

#[test]
fn trace_entries_become_replay_events() {
    use crate::snapshot::{TraceAction, TraceEntry};
    let entry = |action: TraceAction, addr: u64, size: u64| TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        frames: Vec::new(),
        device_free: None,
    };
    let with_completed = [
        entry(TraceAction::SegmentAlloc, 0, 100),
        entry(TraceAction::Alloc, 8, 10),
        entry(TraceAction::FreeRequested, 8, 10),
        entry(TraceAction::FreeCompleted, 8, 10),
        entry(TraceAction::Oom, 0, 5),
        entry(TraceAction::SegmentUnmap, 0, 100),
    ];
    assert_eq!(
        ReplayEvent::from_trace(&with_completed),
        vec![
            ReplayEvent::SegmentAlloc { size: 100 },
            alloc(8, 10),
            free(8),
            ReplayEvent::SegmentFree { size: 100 }
        ]
    );
    // Without free_completed, free_requested is the free.
    let requested_only = [
        entry(TraceAction::Alloc, 8, 10),
        entry(TraceAction::FreeRequested, 8, 10),
    ];
    assert_eq!(
        ReplayEvent::from_trace(&requested_only),
        vec![alloc(8, 10), free(8)]
    );
}

#[test]
fn the_segments_a_trace_created_are_counted() {
    let events = [
        ReplayEvent::SegmentAlloc { size: 2 * MIB },
        alloc(1, MIB),
        ReplayEvent::SegmentAlloc { size: 20 * MIB },
        free(1),
        ReplayEvent::SegmentFree { size: 2 * MIB },
        ReplayEvent::SegmentAlloc { size: 2 * MIB },
    ];
    assert_eq!(trace_segments_created(&events), Some((3, 24 * MIB)));
    assert_eq!(trace_segments_created(&[alloc(1, MIB), free(1)]), None);
    let profile = LimitsProfile::H200;
    let report = replay(
        "segments",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    assert_eq!(report.pytorch_segments_created, Some(3));
    assert_eq!(report.pytorch_bytes_created, Some(24 * MIB));
}

/// The allocation sequence of a server whose requests vary in size (the `mlp` workload of
/// `pool_vs_naive --large`: layers 1024-4096-4096-4096-1024, batches of 1 to 512 rows, each
/// request's intermediates freed when it is answered, split-K partials of two to five times an
/// output): after the first requests the pool must serve every request from what it holds.
#[test]
fn a_server_of_varying_batches_stops_creating_segments() {
    let widths = [1024u64, 4096, 4096, 4096, 1024];
    let mut events = Vec::new();
    let mut next = 0u64;
    let mut alloc_at = |events: &mut Vec<ReplayEvent>, size: u64| {
        next += 1;
        events.push(alloc(next, size.div_ceil(16) * 16));
        next
    };
    for pair in widths.windows(2) {
        alloc_at(&mut events, pair[0] * pair[1] * 4);
        alloc_at(&mut events, pair[1] * 4);
    }
    // A fixed linear congruential sequence of batch sizes in 1..=512.
    let mut state = 7u64;
    let mut requests_events = Vec::new();
    for _ in 0..400 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let rows = (state >> 33) % 512 + 1;
        let mut live = vec![alloc_at(&mut events, rows * widths[0] * 4)];
        for pair in widths.windows(2) {
            let out = rows * pair[1] * 4;
            live.push(alloc_at(&mut events, out));
            let splits = match rows {
                1..=96 => 5,
                97..=192 => 3,
                193..=320 => 2,
                _ => 1,
            };
            if splits > 1 {
                live.push(alloc_at(&mut events, splits * out));
            }
            live.push(alloc_at(&mut events, out));
            live.push(alloc_at(&mut events, out));
        }
        events.extend(live.into_iter().map(free));
        requests_events.push(events.len());
    }
    let profile = LimitsProfile::H200;
    let report = replay(
        "serving",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    let pool = &report.strategies[0];
    let naive = report
        .strategies
        .iter()
        .find(|s| s.name == "naive")
        .expect("naive");
    assert!(naive.segments_created > 5_000, "{}", naive.segments_created);
    assert!(
        pool.segments_created <= 20,
        "the pool kept creating segments: {} (peak {:.3} of requested)",
        pool.segments_created,
        pool.peak_reserved_bytes as f64 / report.peak_requested_bytes as f64
    );
    let ratio = pool.peak_reserved_bytes as f64 / report.peak_requested_bytes as f64;
    // Packed segments of 64 MiB hold the varying intermediates beside 160 MiB of weights.
    assert!(
        ratio <= 1.25,
        "peak reserved {ratio:.3} of requested, {} segments",
        pool.segments_created
    );
}

/// The reference heap's peak for `events` with blocks of `block` bytes and no size limit.
fn heap_peak(events: &[ReplayEvent], block: u64) -> u64 {
    heap::best_fit_heap_peak(events, block, u64::MAX)
}

#[test]
fn the_reference_heap_places_by_best_fit() {
    // Holes of 100 (at 0) and 50 (at 110): 40 takes the 50-byte hole, so 100 still fits below
    // the top (170). First fit would put 40 at 0 and 100 at the top (270).
    let events = [
        alloc(1, 100),
        alloc(2, 10),
        alloc(3, 50),
        alloc(4, 10),
        free(1),
        free(3),
        alloc(5, 40),
        alloc(6, 100),
    ];
    assert_eq!(heap_peak(&events, 1), 170);
    let events = [events.as_slice(), &[alloc(7, 10)]].concat();
    // 10 more: the 10-byte rest of the 50-byte hole (at 150), tightest of the two.
    assert_eq!(heap_peak(&events, 1), 170);
}

#[test]
fn the_reference_heap_coalesces_and_lowers_its_top() {
    // Two freed neighbours hold a request of both their sizes.
    let events = [
        alloc(1, 10),
        alloc(2, 10),
        alloc(3, 10),
        free(1),
        free(2),
        alloc(4, 20),
    ];
    assert_eq!(heap_peak(&events, 1), 30);
    // Freed in the other order.
    let events = [
        alloc(1, 10),
        alloc(2, 10),
        alloc(3, 10),
        free(2),
        free(1),
        alloc(4, 20),
    ];
    assert_eq!(heap_peak(&events, 1), 30);
    // A free at the top lowers it, together with the free range below it.
    let events = [
        alloc(1, 10),
        alloc(2, 30),
        alloc(3, 10),
        free(2),
        free(3),
        alloc(4, 45),
    ];
    // The top fell to 10: 45 more reach 55 (a free range kept below a top of 50 would not hold
    // them: 95).
    assert_eq!(heap_peak(&events, 1), 55);
}

#[test]
fn the_reference_heap_rounds_to_the_block_and_skips_what_no_pool_takes() {
    // One byte holds a 256-byte block; zero bytes and a size whose rounding overflows hold none.
    let events = [alloc(1, 1), alloc(2, 0), alloc(3, u64::MAX), alloc(4, 300)];
    assert_eq!(heap_peak(&events, 256), 256 + 512);
    // A re-used address frees the earlier allocation there, as the replay does; an unknown
    // free changes nothing.
    let events = [alloc(1, 100), alloc(1, 100), free(9), alloc(2, 100)];
    assert_eq!(heap_peak(&events, 1), 200);
    // A request above the largest allocation is skipped, as the pool refuses it.
    let events = [alloc(1, 100), alloc(2, 1000), alloc(3, 100)];
    assert_eq!(heap::best_fit_heap_peak(&events, 1, 999), 200);
}

#[test]
fn the_reference_heap_is_in_the_report_and_holds_at_least_the_peak() {
    let events = real_trace("frag_churn.pickle");
    let profile = LimitsProfile::H200;
    let report = replay("frag_churn", &events, profile, None, &[], &mut |_| {});
    let policy = profile.policy();
    assert_eq!(
        report.best_fit_heap_peak_bytes,
        heap::best_fit_heap_peak(&events, policy.min_block_bytes, policy.max_allocation_bytes)
    );
    assert!(report.best_fit_heap_peak_bytes >= report.peak_requested_bytes);
}

#[test]
fn sums_of_a_trace_past_u64_saturate() {
    let events = [
        alloc(1, 1 << 63),
        alloc(2, 1 << 63),
        alloc(3, 1 << 63),
        free(1),
        ReplayEvent::SegmentAlloc { size: u64::MAX },
        ReplayEvent::SegmentAlloc { size: u64::MAX },
    ];
    let (peak, _, reserved) = trace_peaks(&events);
    assert_eq!(peak, u64::MAX);
    assert_eq!(reserved, Some(u64::MAX));
    let profile = LimitsProfile::H200;
    let report = replay(
        "huge",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    // Every request passes the device's largest buffer: refused, counted, nothing placed.
    let pool = report.strategy("pool").unwrap();
    assert_eq!(pool.failed_allocations, 3);
    assert_eq!(pool.peak_reserved_bytes, 0);
    // The heap skips them too; without a size limit its top would pass u64.
    assert_eq!(report.best_fit_heap_peak_bytes, 0);
    assert_eq!(heap_peak(&events, 256), u64::MAX);
}
