//! The live allocations (and dropped ones waiting for a submission) in a slab, each record owning
//! its `Placement`; the history events made from them; and the filling of the plain-data
//! [`PoolState`] and [`SegmentInfo`]s from the policy's segments and these records.

use std::collections::HashMap;

use crate::history::{Event, EventKind, History, Label, OomDetails};
use crate::policy::{OutOfMemory, Placement, PoolCore, SegmentEvent, SegmentId, SegmentStorage};
use crate::state::{
    HistoryStatus, PolicySummary, PoolState, SegmentInfo, SegmentState, Span, SpanKind,
};

/// What the pool remembers of a live allocation (or one dropped and waiting for a submission):
/// where it lives, for freeing it, and its label and op, for snapshots and history.
#[derive(Debug)]
pub(super) struct LiveAllocation {
    /// Where it lives; given back to the policy when the record is removed.
    pub(super) placement: Placement,
    pub(super) label: Label,
    pub(super) op: Option<Label>,
    /// Dropped, waiting for the submission that releases it.
    pub(super) pending: bool,
    /// Labelled parts `(offset from the allocation's start, bytes, label)`, in address order and
    /// disjoint ([`super::Pool::label_parts`]); empty: the allocation is one span.
    pub(super) parts: Vec<(u64, u64, String)>,
}

/// The live allocations in a slab: each handle (and each pending free) holds its record's index,
/// so keeping the records costs a vector write per allocation and no hashing.
#[derive(Debug, Default)]
pub(super) struct LiveSlab {
    slots: Vec<Option<LiveAllocation>>,
    vacant: Vec<usize>,
}

impl LiveSlab {
    pub(super) fn insert(&mut self, entry: LiveAllocation) -> usize {
        match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        }
    }

    pub(super) fn get(&self, slot: usize) -> Option<&LiveAllocation> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, slot: usize) -> Option<&mut LiveAllocation> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Removes the record in `slot`.
    ///
    /// # Panics
    ///
    /// When the slot is vacant: every handle and pending free keeps its record until it is removed
    /// here, once.
    pub(super) fn remove(&mut self, slot: usize) -> LiveAllocation {
        let entry = self
            .slots
            .get_mut(slot)
            .and_then(Option::take)
            .expect("a live allocation keeps its record until it is freed");
        self.vacant.push(slot);
        entry
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &LiveAllocation> {
        self.slots.iter().flatten()
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut LiveAllocation> {
        self.slots.iter_mut().flatten()
    }
}

/// An event about a live allocation, with its label and op.
pub(super) fn allocation_event(kind: EventKind, time_us: u64, live: &LiveAllocation) -> Event {
    let placement = &live.placement;
    let mut event = Event::new(
        kind,
        time_us,
        placement.requested_size(),
        placement.allocated_size(),
        Some(placement.segment()),
        placement.offset(),
    );
    event.label = live.label.clone();
    event.op = live.op.clone();
    event
}

/// Records the policy's segment events.
pub(super) fn record_segment_events(
    history: &mut History,
    events: Vec<SegmentEvent>,
    time_us: u64,
) {
    for event in events {
        let (kind, id, size_bytes) = match event {
            SegmentEvent::Created { id, size_bytes } => (EventKind::SegmentAlloc, id, size_bytes),
            SegmentEvent::Destroyed { id, size_bytes } => (EventKind::SegmentFree, id, size_bytes),
        };
        history.record(Event::new(
            kind,
            time_us,
            size_bytes,
            size_bytes,
            Some(id),
            0,
        ));
    }
}

/// Records an out-of-memory refusal.
pub(super) fn record_oom(
    history: &mut History,
    time_us: u64,
    oom: &OutOfMemory,
    op: Option<&Label>,
) {
    let mut event = Event::new(EventKind::Oom, time_us, oom.requested_bytes, 0, None, 0);
    event.op = op.cloned();
    event.oom = Some(Box::new(OomDetails {
        segment_bytes: oom.segment_bytes,
        reserved_bytes: oom.reserved_bytes,
        allocated_bytes: oom.allocated_bytes,
        largest_free_bytes: oom.largest_free_bytes,
        budget_bytes: oom.budget_bytes,
        device_refused: oom.device_error.is_some(),
        released_bytes: oom.released_bytes,
    }));
    history.record(event);
}

/// The device's limits that a [`PoolState`] reports.
#[derive(Debug, Clone, Copy)]
pub(super) struct StateLimits {
    pub(super) max_buffer_size: u64,
    pub(super) max_storage_buffer_binding_size: u64,
    /// The read-back staging buffer's size (0: none).
    pub(super) staging_bytes: u64,
}

/// The pool's memory as plain data: the policy's statistics and settings, and every segment tiled,
/// in address order, by its allocations, pending frees and free blocks; segments in id order.
/// O(segments + live allocations + free blocks), plus sorting the segments.
pub(super) fn fill_state<S: SegmentStorage>(
    core: &PoolCore<S>,
    live: &LiveSlab,
    history: Option<&History>,
    time_us: u64,
    limits: StateLimits,
) -> PoolState {
    let mut stats = core.stats();
    let mut by_segment: HashMap<SegmentId, Vec<Span>> = HashMap::new();
    for live in live.iter() {
        if live.pending {
            stats.pending_frees += 1;
            stats.pending_free_bytes += live.placement.allocated_size();
        }
        let spans = by_segment.entry(live.placement.segment()).or_default();
        push_live_spans(live, spans);
    }
    let segments = tiled_segments(core, by_segment);
    let config = core.config();
    let policy = (!config.is_naive()).then(|| PolicySummary {
        min_block_bytes: config.min_block_bytes,
        min_segment_bytes: config.min_segment_bytes,
        max_segment_bytes: config.max_segment_bytes,
        large_above_bytes: config.large_above_bytes,
        max_allocation_bytes: config.max_allocation_bytes,
        rounding: format!("{:?}", config.rounding),
        budget_bytes: config.budget_bytes,
    });
    PoolState {
        naive: config.is_naive(),
        time_us,
        stats,
        policy,
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        staging_bytes: limits.staging_bytes,
        history: history.map(|history| HistoryStatus {
            max_events: history.max_events(),
            events: history.len(),
            dropped_events: history.dropped_events(),
        }),
        segments,
    }
}

/// The spans of one live allocation: one for the whole, or for an allocation of parts (a plan
/// arena) one per part and one per gap between them (and for the rounding at the end), so that
/// its spans still tile its range and hold its requested bytes.
fn push_live_spans(live: &LiveAllocation, spans: &mut Vec<Span>) {
    let placement = &live.placement;
    let kind = if live.pending {
        SpanKind::PendingFree
    } else {
        SpanKind::Allocated
    };
    let op = live.op.as_ref().map(|op| op.to_string());
    if live.parts.is_empty() {
        spans.push(Span {
            offset_bytes: placement.offset(),
            size_bytes: placement.allocated_size(),
            requested_bytes: placement.requested_size(),
            kind,
            label: live.label.to_string(),
            op,
        });
        return;
    }
    let mut at = 0;
    let mut requested_left = placement.requested_size();
    let ends = live
        .parts
        .iter()
        .map(|(offset, size, label)| (*offset, *size, format!("{}: {label}", live.label)))
        .chain(std::iter::once((
            placement.allocated_size(),
            0,
            String::new(),
        )));
    for (offset, size, label) in ends {
        for (start, bytes, label) in [
            (at, offset - at, format!("{} (between parts)", live.label)),
            (offset, size, label),
        ] {
            if bytes == 0 {
                continue;
            }
            let requested = bytes.min(requested_left);
            requested_left -= requested;
            spans.push(Span {
                offset_bytes: placement.offset() + start,
                size_bytes: bytes,
                requested_bytes: requested,
                kind,
                label,
                op: op.clone(),
            });
        }
        at = offset + size;
    }
}

/// Every segment tiled, in address order, by the spans of its live allocations (`by_segment`)
/// and its free spans; segments in id order.
fn tiled_segments<S: SegmentStorage>(
    core: &PoolCore<S>,
    mut by_segment: HashMap<SegmentId, Vec<Span>>,
) -> Vec<SegmentState> {
    let mut segments: Vec<SegmentState> = core
        .segments()
        .map(|segment| {
            let mut spans = by_segment.remove(&segment.id).unwrap_or_default();
            spans.extend(
                segment
                    .free_spans()
                    .into_iter()
                    .map(|(offset_bytes, size_bytes)| Span::free(offset_bytes, size_bytes)),
            );
            spans.sort_unstable_by_key(|span| span.offset_bytes);
            SegmentState {
                id: segment.id,
                size_bytes: segment.size_bytes,
                class: segment.class(),
                spans,
            }
        })
        .collect();
    segments.sort_unstable_by_key(|segment| segment.id);
    segments
}

/// Per-segment figures: id, size, class, the buddy statistics and the free spans, in slot order.
pub(super) fn segment_infos<S: SegmentStorage>(core: &PoolCore<S>) -> Vec<SegmentInfo> {
    let min_block = core.config().min_block_bytes;
    core.segments()
        .map(|segment| SegmentInfo {
            id: segment.id,
            size_bytes: segment.size_bytes,
            class: segment.class(),
            stats: segment.stats(min_block),
            free_blocks: segment.free_spans(),
        })
        .collect()
}
