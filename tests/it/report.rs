//! The reporter on a real device: the device report (wgpu's allocator report present on Vulkan,
//! said to be absent on GL), snapshots taken mid-workload against the pool's statistics, the
//! history, the exports, and the layering of the pure parts. Every test runs on the backend
//! `WGPU_BACKEND` selects; CI runs them on Vulkan (lavapipe) and GL (llvmpipe).

use std::collections::HashMap;
use std::path::Path;

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::history::{EventKind, HistoryOptions, Totals};
use wgpu_pool::policy::PoolStats;
use wgpu_pool::policy::{PolicyConfig, SegmentClass};
use wgpu_pool::report::Report;
use wgpu_pool::report::{
    pytorch_snapshot, write_exports, AllocatorReport, DeviceCounters, DeviceReport, PoolFigures,
    SpanKind,
};
use wgpu_pool::snapshot::{BlockState, Snapshot, TraceAction};
use wgpu_pool::{AllocOptions, Allocation, Pool, PoolError, PoolOptions, ReuseSafety};

use crate::gpu::{both, gpu};

const MIB: u64 = 1 << 20;

fn with_history(max_events: usize) -> PoolOptions {
    PoolOptions {
        history: Some(HistoryOptions::with_max_events(max_events)),
        ..PoolOptions::default()
    }
}

/// A churn of labelled allocations from 4 B to 512 KiB, with drops, submissions and an op scope;
/// returns what is still live.
fn churn(pool: &Pool, seed: u64, steps: usize) -> Vec<Allocation> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live = Vec::new();
    for step in 0..steps {
        let _op = (step % 3 == 0).then(|| pool.op_scope("matmul"));
        if live.is_empty() || rng.gen_bool(0.6) {
            let exponent = rng.gen_range(2..=19);
            let size = rng
                .gen_range((1u64 << exponent) / 2..=(1u64 << exponent))
                .max(1);
            let label = format!("t{step}");
            live.push(
                pool.allocate_with(size, AllocOptions::labeled(&label))
                    .expect("allocate"),
            );
        } else {
            let index = rng.gen_range(0..live.len());
            drop(live.swap_remove(index));
        }
        if step % 17 == 16 {
            pool.submit([]);
        }
    }
    live
}

/// Checks a snapshot against the statistics taken with it: PyTorch's invariants, and the sizes
/// adding up to the pool's own figures.
fn check_snapshot_against_stats(name: &str, snapshot: &Snapshot, stats: &PoolStats, pool: &Pool) {
    snapshot
        .check_invariants()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let sum = |f: fn(&wgpu_pool::snapshot::Segment) -> u64| -> u64 {
        snapshot.segments.iter().map(f).sum()
    };
    assert_eq!(
        sum(|s| s.total_size),
        stats.reserved_bytes.current,
        "{name}: reserved"
    );
    // The pool counts a pending free as allocated until the submission releases it.
    assert_eq!(
        sum(|s| s.active_size),
        stats.allocated_bytes.current,
        "{name}: allocated"
    );
    assert_eq!(
        sum(|s| s.requested_size),
        stats.requested_bytes.current,
        "{name}: requested"
    );
    let blocks = || snapshot.segments.iter().flat_map(|s| &s.blocks);
    let active = blocks().filter(|b| b.state.is_active()).count() as u64;
    assert_eq!(active, stats.allocations.current, "{name}: allocations");
    let (pending_count, pending_bytes) = pool.pending_frees();
    let pending: Vec<_> = blocks()
        .filter(|b| b.state == BlockState::ActivePendingFree)
        .collect();
    assert_eq!(pending.len(), pending_count, "{name}: pending frees");
    assert_eq!(
        (stats.pending_frees, stats.pending_free_bytes),
        (pending_count as u64, pending_bytes),
        "{name}: the statistics' pending frees"
    );
    assert_eq!(
        pending.iter().map(|b| b.size).sum::<u64>(),
        pending_bytes,
        "{name}: pending bytes"
    );
    for block in blocks().filter(|b| b.state.is_active()) {
        assert!(
            block.requested_size <= block.size && block.requested_size > 0,
            "{name}: {block:?}"
        );
    }
    assert_eq!(
        snapshot.segments.len() as u64,
        stats.segments.current,
        "{name}: segments"
    );
}

#[test]
fn a_snapshot_taken_mid_workload_matches_the_pool_statistics() {
    for (name, gpu) in both() {
        let pool = Pool::new(gpu, with_history(1 << 20)).expect("pool");
        let live = churn(&pool, 3, 400);
        // Mid-workload: some drops are pending (not yet submitted).
        let snapshot = pool.snapshot();
        let stats = pool.stats();
        assert!(
            pool.pending_frees().0 > 0,
            "{name}: the churn leaves pending frees"
        );
        check_snapshot_against_stats(name, &snapshot, &stats, &pool);

        // The history's running totals end at the pool's figures.
        let history = pool.history().expect("history on");
        assert_eq!(history.dropped_events(), 0);
        assert_eq!(history.final_totals(), Totals::of_stats(&stats), "{name}");
        assert_eq!(
            history.count(EventKind::SegmentAlloc) as u64,
            stats.create_segment_calls,
            "{name}"
        );
        let events = history.events();
        assert!(events
            .iter()
            .zip(events.iter().skip(1))
            .all(|(a, b)| a.time_us <= b.time_us));

        // Every allocation still live in the trace is an active block at the same address, with
        // the same requested size.
        let mut open: HashMap<u64, u64> = HashMap::new();
        for entry in snapshot.events() {
            match entry.action {
                TraceAction::Alloc => {
                    assert!(open.insert(entry.addr, entry.size).is_none(), "{name}");
                }
                TraceAction::FreeCompleted => {
                    assert_eq!(open.remove(&entry.addr), Some(entry.size), "{name}");
                }
                _ => {}
            }
        }
        let active: HashMap<u64, u64> = snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.requested_size))
            .collect();
        assert_eq!(open, active, "{name}: trace and blocks disagree");
        // Labels and ops reach the frames.
        let labelled = snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .all(|b| b.frames.first().is_some_and(|f| f.name.starts_with('t')));
        assert!(labelled, "{name}: every live block carries its label");
        assert!(snapshot
            .events()
            .iter()
            .any(|e| e.frames.iter().any(|f| f.name == "matmul")));

        // After submitting, everything dropped is released and the snapshot agrees again.
        drop(live);
        pool.submit([]);
        let snapshot = pool.snapshot();
        check_snapshot_against_stats(name, &snapshot, &pool.stats(), &pool);
        assert_eq!(pool.stats().allocated_bytes.current, 0);
        assert_eq!(
            pool.history().expect("history").final_totals(),
            Totals::of_stats(&pool.stats())
        );
        pool.trim();
        let history = pool.history().expect("history");
        assert_eq!(history.final_totals(), Totals::default(), "{name}");
        assert_eq!(
            history.count(EventKind::SegmentAlloc),
            history.count(EventKind::SegmentFree),
            "{name}"
        );
    }
}

#[test]
fn pickle_and_json_of_a_real_snapshot_carry_the_same_data() {
    let pool = Pool::new(gpu(), with_history(10_000)).expect("pool");
    let _live = churn(&pool, 5, 200);
    let snapshot = pool.snapshot();
    let pickle = snapshot.to_pickle_bytes().expect("pickle");
    assert_eq!(pickle[0], 0x80);
    assert!(pickle[1] <= 4, "pickle protocol {}", pickle[1]);
    let json = snapshot.to_json_string().expect("json");
    let from_pickle = Snapshot::from_pickle_bytes(&pickle).expect("read pickle");
    let from_json = Snapshot::from_json_str(&json).expect("read json");
    assert_eq!(from_pickle, from_json);
    assert_eq!(from_pickle, snapshot);
}

#[test]
fn the_device_report_says_what_the_backend_offers() {
    let gpu = gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
    let _a = pool.allocate(3 * MIB).expect("allocate");
    let report = Report::from_pool(&pool);
    let device = &report.device;
    assert_eq!(device.adapter.name, gpu.info.name);
    assert_eq!(
        device.limits.max_storage_buffer_binding_size,
        gpu.device.limits().max_storage_buffer_binding_size
    );
    let text = report.to_string();
    match (gpu.info.backend, &device.allocator) {
        (
            wgpu::Backend::Vulkan,
            AllocatorReport::Present {
                total_reserved_bytes,
                ..
            },
        ) => {
            // The pool's segment is among wgpu's allocations.
            assert!(*total_reserved_bytes >= report.pool.stats.reserved_bytes.current);
            assert!(text.contains("wgpu allocator report: "), "{text}");
            assert!(report.device_memory.is_some());
        }
        (wgpu::Backend::Gl, AllocatorReport::Absent { reason }) => {
            assert!(reason.contains("Gl"), "{reason}");
            assert!(
                text.contains(
                    "wgpu allocator report: absent: wgpu's Gl backend has no allocator report"
                ),
                "{text}"
            );
        }
        (wgpu::Backend::Vulkan | wgpu::Backend::Gl, other) => {
            panic!(
                "{:?}: unexpected allocator report {other:?}",
                gpu.info.backend
            )
        }
        _ => {}
    }
    let counters_built = cfg!(feature = "counters");
    match (&device.counters, counters_built) {
        (DeviceCounters::Enabled { buffers, .. }, true) => {
            assert!(*buffers >= 1, "the pool's segment is a live buffer");
        }
        (DeviceCounters::Disabled { .. }, false) => {
            assert!(text.contains("wgpu counters: off"), "{text}");
        }
        (counters, built) => panic!("counters feature {built}, report {counters:?}"),
    }
    // The table, the map and the JSON carry the pool's figures.
    assert!(text.contains("Reserved memory"), "{text}");
    assert!(text.contains("seg    0"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json().expect("json")).unwrap();
    assert_eq!(
        json["pool"]["stats"]["reserved_bytes"]["current"],
        report.pool.stats.reserved_bytes.current
    );
    assert_eq!(json["device"]["adapter"]["name"], gpu.info.name.as_str());
    // DeviceReport alone prints too.
    assert!(DeviceReport::from_gpu(gpu)
        .to_string()
        .contains(&gpu.info.name));
}

#[test]
fn largest_allocation_now_follows_the_binding_limit_and_the_budget() {
    let gpu = gpu();
    let limits = gpu.device.limits();
    let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
    let min_block = pool.policy().min_block_bytes;
    let figures = PoolFigures::from_state(&pool.memory_state());
    assert_eq!(
        figures.largest_allocation_now_bytes,
        limits.max_buffer_size / min_block * min_block
    );
    assert_eq!(
        figures.largest_bindable_allocation_now_bytes,
        limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size / min_block * min_block)
    );
    let _a = pool.allocate(MIB).expect("allocate");
    let reserved = pool.stats().reserved_bytes.current;
    pool.set_budget(Some(reserved + 4 * MIB));
    let figures = PoolFigures::from_state(&pool.memory_state());
    assert_eq!(figures.budget_headroom_bytes, Some(4 * MIB));
    // 4 MiB of room: a 4 MiB segment, or the 1 MiB left in the first one, whichever is larger.
    assert_eq!(figures.largest_allocation_now_bytes, 4 * MIB);
    let _b = pool
        .allocate(figures.largest_allocation_now_bytes)
        .expect("the largest allocation possible now succeeds");
}

#[test]
fn an_oom_is_recorded_with_the_figures_of_its_error() {
    let pool = Pool::new(gpu(), with_history(1000)).expect("pool");
    let _a = pool.allocate(MIB).expect("allocate");
    pool.set_budget(Some(pool.stats().reserved_bytes.current));
    let error = {
        let _op = pool.op_scope("conv");
        pool.allocate(8 * MIB).expect_err("over budget")
    };
    let PoolError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    let history = pool.history().expect("history");
    let event = history.events().back().expect("an event");
    assert_eq!(event.kind, EventKind::Oom);
    assert_eq!(event.size_bytes, oom.requested_bytes);
    assert_eq!(event.op.as_deref(), Some("conv"));
    let details = event.oom.as_deref().expect("oom details");
    assert_eq!(details.reserved_bytes, oom.reserved_bytes);
    assert_eq!(details.largest_free_bytes, oom.largest_free_bytes);
    assert_eq!(details.budget_bytes, oom.budget_bytes);
    // The error text states the same figures the report prints.
    let text = error.to_string();
    assert!(text.contains("tried to allocate 8.00 MiB"), "{text}");
    assert!(text.contains("Try:"), "{text}");
    let report = Report::from_pool(&pool).to_string();
    assert!(report.contains("OOMs: 1"), "{report}");
    // In the PyTorch trace: an `oom` with `device_free` (the room left under the budget: none).
    let snapshot = pool.snapshot();
    let oom_entry = snapshot.events().last().expect("trace");
    assert_eq!(oom_entry.action, TraceAction::Oom);
    assert_eq!(oom_entry.device_free, Some(0));
    assert_eq!(pool.op(), None, "the op scope ended");
}

#[test]
fn history_is_off_by_default_and_can_be_switched_on() {
    let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    let a = pool
        .allocate_with(1000, AllocOptions::labeled("a"))
        .expect("a");
    assert!(pool.history().is_none());
    // The snapshot still carries the segments, with labels and requested sizes.
    let snapshot = pool.snapshot();
    assert_eq!(snapshot.device_traces, vec![Vec::new()]);
    let block = &snapshot.segments[0].blocks[0];
    assert_eq!(block.requested_size, 1000);
    assert_eq!(block.frames[0].name, "a");
    // Switched on later: the totals start from the pool's figures.
    pool.set_history(Some(HistoryOptions::default()));
    drop(a);
    pool.mark_submitted();
    let history = pool.history().expect("on");
    assert_eq!(history.baseline().requested_bytes, 1000);
    assert_eq!(history.final_totals().requested_bytes, 0);
    let kinds: Vec<EventKind> = history.events().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::FreeRequested, EventKind::FreeCompleted]);
    assert_eq!(history.events()[0].label, "a");
    pool.set_history(None);
    assert!(pool.history().is_none());
}

#[test]
fn a_bounded_ring_keeps_the_newest_events_and_exact_totals() {
    let pool = Pool::new(gpu(), with_history(50)).expect("pool");
    let _live = churn(&pool, 9, 300);
    let history = pool.history().expect("history");
    assert_eq!(history.len(), 50);
    assert!(history.dropped_events() > 0);
    assert_eq!(history.final_totals(), Totals::of_stats(&pool.stats()));
    // A truncated trace is still a valid snapshot.
    pool.snapshot().check_invariants().expect("invariants");
}

#[test]
fn immediate_reuse_large_segments_and_the_naive_baseline_export_valid_snapshots() {
    let gpu = gpu();
    let limits = gpu.device.limits();
    // Small segments, so that 3 MiB gets a segment of its own (of the large class); cached when
    // freed, given back by a trim.
    let policy = PolicyConfig {
        max_segment_bytes: 2 * MIB,
        large_above_bytes: 2 * MIB,
        ..PolicyConfig::for_limits(
            u64::from(limits.min_storage_buffer_offset_alignment),
            limits.max_buffer_size,
        )
    };
    let pool = Pool::new(
        gpu,
        PoolOptions {
            policy: Some(policy),
            reuse: ReuseSafety::Immediate,
            history: Some(HistoryOptions::default()),
            ..PoolOptions::default()
        },
    )
    .expect("pool");
    let big = pool
        .allocate_with(3 * MIB, AllocOptions::labeled("big"))
        .expect("big");
    let small = pool.allocate(1000).expect("small");
    let state = pool.memory_state();
    let large = state
        .segments
        .iter()
        .find(|s| s.class == SegmentClass::Large)
        .expect("a segment of the large class");
    assert_eq!(large.spans.len(), 1);
    assert_eq!(large.spans[0].kind, SpanKind::Allocated);
    for segment in &state.segments {
        segment.check_tiling().expect("tiling");
    }
    check_snapshot_against_stats("immediate", &pool.snapshot(), &pool.stats(), &pool);
    drop(big);
    drop(small);
    // Immediate reuse: released at the drop, no pending free; the segments stay cached until a
    // trim gives them back (the large one and the packed one).
    assert_eq!(pool.pending_frees(), (0, 0));
    check_snapshot_against_stats("immediate, freed", &pool.snapshot(), &pool.stats(), &pool);
    assert_eq!(pool.trim(), pool.stats().reserved_bytes.peak);
    let history = pool.history().expect("history");
    let tail: Vec<EventKind> = history
        .events()
        .iter()
        .rev()
        .take(3)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        tail,
        [
            EventKind::SegmentFree,
            EventKind::SegmentFree,
            EventKind::FreeCompleted
        ]
    );
    check_snapshot_against_stats("immediate, trimmed", &pool.snapshot(), &pool.stats(), &pool);

    let naive = Pool::naive(gpu, with_history(1000));
    let live = churn(&naive, 11, 60);
    let snapshot = naive.snapshot();
    check_snapshot_against_stats("naive", &snapshot, &naive.stats(), &naive);
    let state = naive.memory_state();
    assert!(state.naive && state.policy.is_none());
    assert!(state.segments.windows(2).all(|w| w[0].id < w[1].id));
    assert!(state
        .segments
        .iter()
        .all(|s| s.class == SegmentClass::Dedicated && s.spans.len() == 1));
    assert_eq!(snapshot.segments.len(), live.len());
    drop(live);
    let history = naive.history().expect("history");
    assert_eq!(history.final_totals(), Totals::default());
    assert_eq!(
        history.count(EventKind::SegmentAlloc),
        history.count(EventKind::Alloc)
    );
}

#[test]
fn exports_are_written_and_read_back() {
    let pool = Pool::new(gpu(), with_history(10_000)).expect("pool");
    let _live = churn(&pool, 13, 150);
    let dir = std::env::temp_dir().join(format!("wgpu-pool-report-{}", std::process::id()));
    let exports = write_exports(&pool, &dir).expect("exports");
    let read = |path: &Path| std::fs::read(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let from_pickle = Snapshot::from_path(&exports.snapshot_pickle).expect("pickle");
    let from_json = Snapshot::from_path(&exports.snapshot_json).expect("json");
    assert_eq!(from_pickle, from_json);
    from_pickle.check_invariants().expect("invariants");
    let history = exports.history.expect("history exports");
    let trace: serde_json::Value =
        serde_json::from_slice(&read(&history.chrome_trace)).expect("chrome trace json");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    assert!(events.iter().any(|e| e["ph"] == "C"));
    assert!(events.iter().any(|e| e["ph"] == "X"));
    for svg in [&history.memory_svg, &exports.segments_svg] {
        let text = String::from_utf8(read(svg)).expect("utf-8");
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    }
    let recorded: wgpu_pool::history::History =
        serde_json::from_slice(&read(&history.history_json)).expect("history json");
    assert_eq!(Some(recorded), pool.history());
    let report: serde_json::Value =
        serde_json::from_slice(&read(&exports.report_json)).expect("report json");
    assert!(report["segments"].as_array().is_some_and(|s| !s.is_empty()));
    assert!(String::from_utf8(read(&exports.summary))
        .expect("utf-8")
        .contains("Allocated memory"));
    // The exporters of a state and a history need no pool.
    let state = pool.memory_state();
    let snapshot = pytorch_snapshot(&state, None);
    snapshot.check_invariants().expect("invariants");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_replay_reads_the_pools_own_recorded_history() {
    use wgpu_pool::replay::{replay, LimitsProfile, ReplayEvent, Strategy};
    use wgpu_pool::snapshot::Snapshot;
    let gpu = crate::gpu::gpu();
    let pool = wgpu_pool::Pool::new(
        gpu,
        wgpu_pool::PoolOptions {
            history: Some(wgpu_pool::history::HistoryOptions::default()),
            ..Default::default()
        },
    )
    .unwrap();
    let mut live = Vec::new();
    for i in 0..200u64 {
        live.push(pool.allocate(1000 + (i % 13) * 4096).unwrap());
        if i % 3 == 2 {
            live.swap_remove((i as usize * 7) % live.len());
        }
        if i % 10 == 9 {
            pool.mark_submitted();
        }
    }
    drop(live);
    pool.mark_submitted();
    let stats = pool.stats();
    // Exported as a PyTorch snapshot, read back as a trace: the same peak of requested bytes.
    let snapshot =
        Snapshot::from_pickle_bytes(&pool.snapshot().to_pickle_bytes().unwrap()).unwrap();
    let events = ReplayEvent::from_snapshot(&snapshot);
    let allocs = events
        .iter()
        .filter(|e| matches!(e, ReplayEvent::Alloc { .. }))
        .count();
    assert_eq!(allocs, 200);
    let profile = LimitsProfile::LAVAPIPE;
    let report = replay(
        "own",
        &events,
        profile,
        None,
        &Strategy::defaults(&profile),
        &mut |_| {},
    );
    assert_eq!(report.peak_requested_bytes, stats.requested_bytes.peak);
    // The pool's own segments, from its segment events.
    assert_eq!(
        report.pytorch_peak_reserved_bytes,
        Some(stats.reserved_bytes.peak)
    );
}

/// Every segment of `pool`'s memory state tiled by its spans, its summary's largest free block the
/// largest free span, and its snapshot (with history) valid and adding up to the statistics.
fn check_tiled(name: &str, pool: &Pool) {
    let (state, history) = pool.state_and_history();
    let snapshot = check_spans(name, &state, history.as_ref());
    check_snapshot_against_stats(name, &snapshot, &state.stats, pool);
}

/// The checks of [`check_tiled`] that need only the state and history taken together (while
/// other threads allocate); returns the snapshot.
fn check_spans(
    name: &str,
    state: &wgpu_pool::report::PoolState,
    history: Option<&wgpu_pool::history::History>,
) -> Snapshot {
    for segment in &state.segments {
        segment
            .check_tiling()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let largest_free_span = state
        .segments
        .iter()
        .filter(|segment| segment.class != SegmentClass::Dedicated)
        .flat_map(|segment| &segment.spans)
        .filter(|span| span.kind == SpanKind::Free)
        .map(|span| span.size_bytes)
        .max()
        .unwrap_or(0);
    assert_eq!(
        PoolFigures::from_state(state).largest_free_block_bytes,
        largest_free_span,
        "{name}"
    );
    let snapshot = pytorch_snapshot(state, history);
    snapshot
        .check_invariants()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (segment, exported) in state.segments.iter().zip(&snapshot.segments) {
        let expected = if segment.class == SegmentClass::Packed {
            "small"
        } else {
            "large"
        };
        assert_eq!(exported.segment_type, expected, "{name}: {segment:?}");
    }
    snapshot
}

#[test]
fn spans_tile_every_segment_of_every_class() {
    // Issue 26, item 3: the free tail of a segment of the mid-sized class had no span.
    for (name, gpu) in both() {
        let pool = Pool::new(gpu, with_history(1 << 16)).expect("pool");
        let a = pool.allocate(3 * MIB / 2).unwrap();
        let state = pool.memory_state();
        let segment = state
            .segments
            .iter()
            .find(|segment| segment.class == SegmentClass::Mid)
            .expect("1.5 MiB goes to the mid-sized class");
        assert_eq!(
            segment.free_bytes(),
            segment.size_bytes - a.allocated_size(),
            "{name}"
        );
        check_tiled(name, &pool);
        let summary = Report::from_pool(&pool).to_string();
        assert!(
            !summary.contains("Largest free block: 0 B"),
            "{name}: {summary}"
        );
        drop(a);
        pool.submit([]);
        check_tiled(name, &pool);
    }

    // Churn over every class (4 B to 40 MiB), under both roundings, checked at every 25th step
    // and after compaction.
    for rounding in [
        wgpu_pool::buddy::Rounding::Exact,
        wgpu_pool::buddy::Rounding::PowerOfTwo,
    ] {
        let gpu = gpu();
        let limits = gpu.device.limits();
        let policy = PolicyConfig {
            rounding,
            ..PolicyConfig::for_limits(
                u64::from(limits.min_storage_buffer_offset_alignment),
                limits.max_buffer_size,
            )
        };
        let pool = Pool::new(
            gpu,
            PoolOptions {
                policy: Some(policy),
                ..with_history(1 << 20)
            },
        )
        .expect("pool");
        let name = format!("{rounding:?}");
        let mut rng = StdRng::seed_from_u64(26);
        let mut live: Vec<Allocation> = Vec::new();
        for step in 0..300 {
            if live.is_empty() || rng.gen_bool(0.55) {
                let exponent = rng.gen_range(2..=25);
                let size = rng.gen_range((1u64 << exponent) / 2 + 1..=(1u64 << exponent));
                live.push(pool.allocate(size).expect("allocate"));
            } else {
                let index = rng.gen_range(0..live.len());
                drop(live.swap_remove(index));
            }
            if step % 7 == 6 {
                pool.submit([]);
            }
            if step % 25 == 24 {
                check_tiled(&format!("{name} step {step}"), &pool);
            }
        }
        pool.submit([]);
        let mut movable: Vec<&mut Allocation> = live.iter_mut().collect();
        pool.compact_segments(&mut movable, Default::default())
            .expect("compaction");
        check_tiled(&format!("{name} after compaction"), &pool);
    }

    // Eight threads allocating while the state is taken.
    let pool = Pool::new(gpu(), with_history(1 << 20)).expect("pool");
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let pool = &pool;
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(thread);
                let mut live = Vec::new();
                for _ in 0..60 {
                    if live.is_empty() || rng.gen_bool(0.6) {
                        let size = rng.gen_range(1..=3 * MIB);
                        live.push(pool.allocate(size).expect("allocate"));
                    } else {
                        let index = rng.gen_range(0..live.len());
                        drop(live.swap_remove(index));
                    }
                }
            });
        }
        for round in 0..40 {
            let (state, history) = pool.state_and_history();
            check_spans(&format!("threads, round {round}"), &state, history.as_ref());
        }
    });
    check_tiled("threads, at the end", &pool);
}

#[test]
fn an_out_of_memory_refusal_writes_a_snapshot_and_calls_the_observer() {
    // Issue 26, item 8: PyTorch users dump a snapshot from an out-of-memory observer.
    let dir = std::env::temp_dir().join(format!("wgpu-pool-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oom_snapshot.pickle");
    let _ = std::fs::remove_file(&path);
    let pool = Pool::new(
        gpu(),
        PoolOptions {
            oom_snapshot: Some(path.clone()),
            ..with_history(1 << 16)
        },
    )
    .expect("pool");
    pool.set_budget(Some(4 * MIB));
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reports.clone();
    let observing = pool.clone();
    pool.set_oom_observer(Some(std::sync::Arc::new(move |report| {
        // The observer may use the pool: its lock is released.
        let _ = observing.stats();
        seen.lock().unwrap().push(report.clone());
    })));
    let held = pool
        .allocate_with(3 * MIB, AllocOptions::labeled("held"))
        .unwrap();
    assert!(!path.exists(), "no refusal yet");
    let refused = pool.allocate_with(3 * MIB, AllocOptions::labeled("refused"));
    let Err(PoolError::OutOfMemory(oom)) = refused else {
        panic!("{refused:?}")
    };
    // The observer saw the refusal and the pool at that moment.
    {
        let reports = reports.lock().unwrap();
        assert_eq!(reports.len(), 1);
        let report = &reports[0];
        assert_eq!(report.error, *oom);
        let snapshot = report.snapshot();
        snapshot.check_invariants().unwrap();
        let last = report
            .history
            .as_ref()
            .unwrap()
            .events()
            .back()
            .unwrap()
            .kind;
        assert_eq!(last, EventKind::Oom);
        assert!(snapshot
            .events()
            .iter()
            .any(|event| event.action == TraceAction::Oom));
        assert_eq!(
            report.state.stats.allocated_bytes.current,
            held.allocated_size()
        );
    }
    // The file holds the same snapshot, as memory_viz reads it.
    let written = Snapshot::from_path(&path).expect("the snapshot was written");
    written.check_invariants().unwrap();
    assert_eq!(written.segments.len(), 1);
    assert!(written
        .segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .any(|block| block.state == BlockState::ActiveAllocated));
    // A second refusal calls the observer again but leaves the first snapshot.
    std::fs::remove_file(&path).unwrap();
    assert!(pool.allocate(3 * MIB).is_err());
    assert_eq!(reports.lock().unwrap().len(), 2);
    assert!(
        !path.exists(),
        "the snapshot is written at the first refusal only"
    );
    // No observer: nothing is called.
    pool.set_oom_observer(None);
    assert!(pool.allocate(3 * MIB).is_err());
    assert_eq!(reports.lock().unwrap().len(), 2);
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_buffer_the_crate_creates_is_accounted() {
    // Issue 26, item 1: buffers outside the pool (read-back staging, the contexts' parameter
    // rings, timestamps, plans' read-back, the tuner's scratch pool) were in no report line.
    use wgpu_pool::compute::{CaptureOptions, Context, ContextOptions, Feed};
    use wgpu_pool::report::{BufferRole, DeviceReport};
    let gpu = crate::gpu::fresh_gpu();
    let bytes = |role| gpu.accounted().bytes_of(role);
    let buffers = |role| {
        gpu.accounted()
            .roles
            .iter()
            .find(|row| row.role == role)
            .map_or(0, |row| row.buffers)
    };
    assert_eq!(gpu.accounted().total_bytes(), 0, "a new device");
    let pool = Pool::new(&gpu, PoolOptions::default()).expect("pool");
    let small = pool.allocate(1000).unwrap();
    let large = pool.allocate(3 * MIB).unwrap();
    assert_eq!(
        bytes(BufferRole::PoolSegments),
        pool.stats().reserved_bytes.current
    );
    pool.read(&small).unwrap();
    assert_eq!(
        bytes(BufferRole::ReadBack),
        pool.memory_state().staging_bytes
    );
    // A second pool on the device is counted too; a naive pool's buffers as well.
    let naive = Pool::naive(&gpu, PoolOptions::default());
    let own = naive.allocate(5000).unwrap();
    assert_eq!(
        bytes(BufferRole::PoolSegments),
        pool.stats().reserved_bytes.current + naive.stats().reserved_bytes.current
    );
    drop(own);

    // A context's parameter ring; plans of many batch sizes share one read-back buffer.
    let context = Context::new(&pool, ContextOptions::default()).unwrap();
    assert!(bytes(BufferRole::Parameters) > 0);
    let weights = context.tensor(&[0.5; 64], &[8, 8]).unwrap();
    let arena = context.plan_arena();
    let mut plans = Vec::new();
    for rows in [1usize, 3, 8, 5] {
        let mut capture = context.capture().unwrap();
        let x = capture.input(&[rows, 8]).unwrap();
        let y = context.matmul(&x, &weights).unwrap();
        let options = CaptureOptions {
            arena: Some(arena.clone()),
            ..CaptureOptions::default()
        };
        plans.push((rows, capture.finish_with(&[&y], options).unwrap()));
    }
    let parameters_of_plans = bytes(BufferRole::Parameters);
    for (rows, plan) in &mut plans {
        let out = plan.run(&[Feed::Data(&vec![1.0; *rows * 8])]).unwrap();
        assert_eq!(out[0], vec![4.0; *rows * 8]);
    }
    assert_eq!(buffers(BufferRole::PlanReadBack), 1, "one per context");
    assert!(bytes(BufferRole::PlanReadBack) >= 8 * 8 * 4);
    assert_eq!(bytes(BufferRole::Parameters), parameters_of_plans);
    drop(plans);
    assert!(
        bytes(BufferRole::Parameters) < parameters_of_plans,
        "plans' rings given back"
    );

    // A profiled context's timestamp buffers, where the adapter has timestamps.
    let profiled = Context::new(
        &pool,
        ContextOptions {
            profile: true,
            ..ContextOptions::default()
        },
    )
    .unwrap();
    let timestamps = !matches!(
        wgpu_pool::compute::TimestampSupport::of(&gpu.device),
        wgpu_pool::compute::TimestampSupport::None
    );
    assert_eq!(bytes(BufferRole::Timestamps) > 0, timestamps);
    drop(profiled);
    assert_eq!(bytes(BufferRole::Timestamps), 0);

    // The report puts them beside wgpu's allocator report and names the difference.
    let report = DeviceReport::from_gpu(&gpu);
    let accounted = report.accounted.clone().expect("from_gpu accounts");
    assert_eq!(accounted, gpu.accounted());
    let summary = Report::from_pool(&pool).to_string();
    assert!(
        summary.contains("This crate's buffers on the device"),
        "{summary}"
    );
    if let Some(device) = report.allocator.total_allocated_bytes() {
        eprintln!(
            "allocator report {device} B, accounted {} B",
            accounted.total_bytes()
        );
        assert!(device >= accounted.total_bytes(), "{summary}");
    }

    // Everything given back: nothing is left in the accounting.
    drop((small, large, weights, arena, context));
    drop(pool);
    drop(naive);
    assert_eq!(gpu.accounted().total_bytes(), 0, "{:?}", gpu.accounted());
    assert!(gpu.accounted().roles.iter().all(|row| row.buffers == 0));
}

/// An allocation of labelled parts (a plan's arena) waiting for a submission is one pending free
/// in the report, as in the pool's statistics, however many spans its parts make.
#[test]
fn a_pending_allocation_of_parts_is_one_pending_free() {
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let allocation = pool
        .allocate_with(4096, AllocOptions::labeled("arena"))
        .unwrap();
    pool.label_parts(
        &allocation,
        &[(0, 256, "t0".to_owned()), (1024, 512, "t1".to_owned())],
    )
    .unwrap();
    drop(allocation);
    let stats = pool.stats();
    assert_eq!(stats.pending_frees, 1);
    let report = Report::from_pool(&pool);
    assert_eq!(report.pool.pending_free_count, 1);
    assert_eq!(report.pool.pending_free_bytes, stats.pending_free_bytes);
    let spans = pool
        .memory_state()
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .filter(|span| span.kind == wgpu_pool::state::SpanKind::PendingFree)
        .count();
    assert!(spans > 1, "the parts show as spans: {spans}");
    assert!(report.to_string().contains("Pending frees: 1 "), "{report}");
}
