//! Synthetic pool states and histories for the exporters' unit tests (no GPU).

use crate::history::{Event, EventKind, History, HistoryOptions, OomDetails, Totals};
use crate::policy::{PoolStats, SegmentClass, SegmentId};
use crate::state::{PolicySummary, PoolState, SegmentState, Span, SpanKind};

/// One mebibyte, in bytes.
pub(crate) const MIB: u64 = 1 << 20;

/// A pool with one 4 MiB segment: two live allocations, a pending free, free space, and a
/// history that created them (and an earlier allocation, freed).
// Test data written out whole, event by event and field by field: split, it would read worse.
pub(crate) fn synthetic() -> (PoolState, History) {
    let mut history = History::new(HistoryOptions::default(), Totals::default());
    let seg = Some(SegmentId(0));
    let mut record = |kind, time_us, size, allocated, offset, label: &str| {
        let mut event = Event::new(kind, time_us, size, allocated, seg, offset);
        event.label = label.into();
        if kind != EventKind::SegmentAlloc {
            event.op = Some("matmul".into());
        }
        history.record(event);
    };
    record(EventKind::SegmentAlloc, 10, 4 * MIB, 4 * MIB, 0, "");
    record(EventKind::Alloc, 20, 1000, 1024, 0, "scratch");
    record(EventKind::FreeRequested, 30, 1000, 1024, 0, "scratch");
    record(EventKind::FreeCompleted, 40, 1000, 1024, 0, "scratch");
    record(EventKind::Alloc, 50, MIB - 100, MIB, 0, "a");
    record(EventKind::Alloc, 60, 512, 512, MIB, "b");
    record(EventKind::Alloc, 70, 256, 256, MIB + 512, "c");
    record(EventKind::FreeRequested, 80, 256, 256, MIB + 512, "c");
    let mut oom = Event::new(EventKind::Oom, 90, 64 * MIB, 0, None, 0);
    oom.oom = Some(Box::new(OomDetails {
        segment_bytes: 64 * MIB,
        reserved_bytes: 4 * MIB,
        allocated_bytes: MIB + 768,
        largest_free_bytes: 2 * MIB,
        budget_bytes: Some(8 * MIB),
        device_refused: false,
        released_bytes: 0,
    }));
    history.record(oom);
    let mut stats = PoolStats::default();
    stats.reserved_bytes.add(4 * MIB);
    stats.segments.add(1);
    stats.create_segment_calls = 1;
    stats.oom_count = 1;
    for (requested, allocated) in [(MIB - 100, MIB), (512, 512), (256, 256)] {
        stats.requested_bytes.add(requested);
        stats.allocated_bytes.add(allocated);
        stats.allocations.add(1);
    }
    stats.free_bytes = 4 * MIB - MIB - 768;
    // "c" is dropped and waits for a submission.
    stats.pending_frees = 1;
    stats.pending_free_bytes = 256;
    stats.largest_free_bytes = 2 * MIB;
    let mut a = Span::allocated(0, MIB, MIB - 100);
    a.label = "a".into();
    a.op = Some("matmul".into());
    let mut c = Span::allocated(MIB + 512, 256, 256);
    c.kind = SpanKind::PendingFree;
    let spans = vec![
        a,
        Span::allocated(MIB, 512, 512),
        c,
        Span::free(MIB + 768, 256),
        Span::free(MIB + 1024, 1024),
        Span::free(MIB + 2048, MIB - 2048),
        Span::free(2 * MIB, 2 * MIB),
    ];
    let state = PoolState {
        naive: false,
        time_us: 100,
        stats,
        policy: Some(PolicySummary {
            min_block_bytes: 256,
            min_segment_bytes: 2 * MIB,
            max_segment_bytes: 64 * MIB,
            large_above_bytes: 64 * MIB,
            max_allocation_bytes: 256 * MIB,
            rounding: "Exact".into(),
            budget_bytes: Some(8 * MIB),
        }),
        max_buffer_size: 256 * MIB,
        max_storage_buffer_binding_size: 128 * MIB,
        staging_bytes: 0,
        history: None,
        segments: vec![SegmentState {
            id: SegmentId(0),
            size_bytes: 4 * MIB,
            class: SegmentClass::Packed,
            spans,
        }],
    };
    (state, history)
}
