//! The pool's allocation history: an opt-in, bounded ring of events (allocations, frees, segment
//! creations and destructions, out-of-memory refusals), each with its time, size, place, label and
//! the op that caused it.
//!
//! This module is plain data: it knows nothing of wgpu, so the exporters in
//! [`report`](crate::report) and the replay can read a history recorded elsewhere (it round-trips
//! through serde, e.g. as JSON).
//!
//! # Cost
//!
//! Recording is off unless [`PoolOptions::history`](crate::PoolOptions::history) (or
//! [`Pool::set_history`](crate::Pool::set_history)) turns it on. Off, the pool pays one branch on an
//! `Option` under the lock it already holds: no allocation and no clock read. On, each event reads
//! the monotonic clock once and copies its label.
//!
//! # Counters over time
//!
//! The ring drops its oldest events when full. So that the running totals stay exact, the
//! history keeps a [`Totals`] baseline — the pool's requested, allocated and reserved bytes just
//! before the oldest event it holds — and folds every dropped event into it.
//! [`History::timeline`] replays the events from there.

#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::policy::{PoolStats, SegmentId};

/// The default bound on recorded events.
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// How history is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryOptions {
    /// The most events kept; older ones are dropped (and counted) when the ring is full. 0 keeps
    /// none but still counts them.
    pub max_events: usize,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        Self {
            max_events: DEFAULT_MAX_EVENTS,
        }
    }
}

impl HistoryOptions {
    /// Keep at most `max_events` events.
    pub fn with_max_events(max_events: usize) -> Self {
        Self { max_events }
    }
}

/// What an [`Event`] records.
///
/// A compaction's move (the pool's `compact_for` and `compact_segments`) is recorded in these
/// words, as PyTorch's trace has none for it: `FreeRequested` and `FreeCompleted` at the old
/// place, then `Alloc` at the new one, at the same time and with the same label and op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An allocation was handed out.
    Alloc,
    /// An allocation was dropped; its range waits for a submission before it can be reused (see
    /// the pool's [`ReuseSafety`](crate::ReuseSafety)). PyTorch's `free_requested`.
    FreeRequested,
    /// A dropped allocation's range was given back to its segment for reuse. PyTorch's
    /// `free_completed`.
    FreeCompleted,
    /// A segment (one `create_buffer`) was created.
    SegmentAlloc,
    /// A segment was given back to the device.
    SegmentFree,
    /// A request was refused for want of memory.
    Oom,
}

impl EventKind {
    /// The name used in exports: `alloc`, `free_requested`, `free_completed`, `segment_alloc`,
    /// `segment_free`, `oom` (PyTorch's action names).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::FreeRequested => "free_requested",
            EventKind::FreeCompleted => "free_completed",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
            EventKind::Oom => "oom",
        }
    }
}

/// The figures of an out-of-memory event, as the pool saw them when it refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomDetails {
    /// The segment the pool tried to create, in bytes.
    pub segment_bytes: u64,
    /// Reserved by the pool, in bytes.
    pub reserved_bytes: u64,
    /// Allocated (rounded) by live allocations, in bytes.
    pub allocated_bytes: u64,
    /// The largest free block in any segment, in bytes.
    pub largest_free_bytes: u64,
    /// The budget, if one was set, in bytes.
    pub budget_bytes: Option<u64>,
    /// True when the device refused the memory (not the budget).
    pub device_refused: bool,
    /// Bytes of empty segments given back while trying (see `OutOfMemory::released_bytes`).
    #[serde(default)]
    pub released_bytes: u64,
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When, in microseconds since the pool was created (monotonic clock).
    pub time_us: u64,
    /// For allocations and frees: the size asked for; for segment events: the segment's size; for
    /// an OOM: the size asked for. In bytes.
    pub size_bytes: u64,
    /// For allocations and frees: the size held after rounding; for segment events: the segment's
    /// size; for an OOM: 0. In bytes.
    pub allocated_bytes: u64,
    /// The segment concerned (`None` for an OOM).
    pub segment: Option<SegmentId>,
    /// Offset of the allocation in its segment, in bytes (0 for segment events and OOMs).
    pub offset_bytes: u64,
    /// The allocation's label (empty when none was given, and for segment events).
    #[serde(default, skip_serializing_if = "Label::is_empty")]
    pub label: Label,
    /// The op in scope when the event happened (see [`Pool::op_scope`](crate::Pool::op_scope)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<Label>,
    /// For an OOM: the pool's figures when it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<Box<OomDetails>>,
}

impl Event {
    /// An event of `kind` with sizes and place, no label, op or OOM figures.
    pub fn new(
        kind: EventKind,
        time_us: u64,
        size_bytes: u64,
        allocated_bytes: u64,
        segment: Option<SegmentId>,
        offset_bytes: u64,
    ) -> Self {
        Self {
            kind,
            time_us,
            size_bytes,
            allocated_bytes,
            segment,
            offset_bytes,
            label: Label::default(),
            op: None,
            oom: None,
        }
    }
}

/// Bytes of a label kept inline; longer labels are shared on the heap.
const INLINE_LABEL_BYTES: usize = 30;

/// A label (of an allocation, or an op): text of up to 30 bytes is stored inline, so making,
/// copying and dropping it touch no allocator and no reference count; longer text is shared
/// (`Arc<str>`). Serialized as a string.
#[derive(Clone)]
pub struct Label(LabelRepr);

#[derive(Clone)]
enum LabelRepr {
    Inline {
        len: u8,
        bytes: [u8; INLINE_LABEL_BYTES],
    },
    Shared(Arc<str>),
}

impl Label {
    /// The label `text`.
    pub fn new(text: &str) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE_LABEL_BYTES => {
                let mut bytes = [0; INLINE_LABEL_BYTES];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Self(LabelRepr::Inline { len, bytes })
            }
            _ => Self(LabelRepr::Shared(Arc::from(text))),
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // The bytes are a copy of a `&str` cut at its own length: always UTF-8.
            LabelRepr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            LabelRepr::Shared(text) => text,
        }
    }

    /// True for the empty label.
    pub fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }
}

impl Default for Label {
    fn default() -> Self {
        Self::new("")
    }
}

impl std::ops::Deref for Label {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Label {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Label {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for Label {
    fn from(text: String) -> Self {
        Self::new(&text)
    }
}

impl PartialEq for Label {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Label {}

impl PartialEq<str> for Label {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Label {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::hash::Hash for Label {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Label::from)
    }
}

/// The pool's running byte counts that events change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Bytes asked for by allocations not yet completely freed.
    pub requested_bytes: u64,
    /// Bytes held (after rounding) by allocations not yet completely freed.
    pub allocated_bytes: u64,
    /// Bytes of segments held.
    pub reserved_bytes: u64,
}

impl Totals {
    /// The current values of a pool's statistics.
    pub fn of_stats(stats: &PoolStats) -> Self {
        Self {
            requested_bytes: stats.requested_bytes.current,
            allocated_bytes: stats.allocated_bytes.current,
            reserved_bytes: stats.reserved_bytes.current,
        }
    }

    /// Applies one event: an allocation adds its sizes, a completed free subtracts them (the pool
    /// counts a pending free as allocated until it completes), segment events move the reserved
    /// bytes. Saturates at 0 instead of wrapping on a history that does not add up.
    pub fn apply(&mut self, event: &Event) {
        match event.kind {
            EventKind::Alloc => {
                self.requested_bytes = self.requested_bytes.saturating_add(event.size_bytes);
                self.allocated_bytes = self.allocated_bytes.saturating_add(event.allocated_bytes);
            }
            EventKind::FreeCompleted => {
                self.requested_bytes = self.requested_bytes.saturating_sub(event.size_bytes);
                self.allocated_bytes = self.allocated_bytes.saturating_sub(event.allocated_bytes);
            }
            EventKind::SegmentAlloc => {
                self.reserved_bytes = self.reserved_bytes.saturating_add(event.size_bytes);
            }
            EventKind::SegmentFree => {
                self.reserved_bytes = self.reserved_bytes.saturating_sub(event.size_bytes);
            }
            EventKind::FreeRequested | EventKind::Oom => {}
        }
    }
}

/// A bounded ring of events with the baseline that keeps running totals exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// The bound the ring was made with.
    max_events: usize,
    /// The totals before the oldest event held.
    baseline: Totals,
    /// Events dropped from the front of the ring because it was full.
    dropped_events: u64,
    /// The events, oldest first.
    events: VecDeque<Event>,
}

impl History {
    /// An empty history whose totals start at `baseline` (the pool's figures when recording
    /// starts).
    pub fn new(options: HistoryOptions, baseline: Totals) -> Self {
        Self {
            max_events: options.max_events,
            baseline,
            dropped_events: 0,
            events: VecDeque::new(),
        }
    }

    /// Appends an event, dropping the oldest one (folded into the baseline) when the ring is full.
    pub fn record(&mut self, event: Event) {
        if self.max_events == 0 {
            self.baseline.apply(&event);
            self.dropped_events += 1;
            return;
        }
        while self.events.len() >= self.max_events {
            if let Some(oldest) = self.events.pop_front() {
                self.baseline.apply(&oldest);
                self.dropped_events += 1;
            }
        }
        self.events.push_back(event);
    }

    /// The events held, oldest first.
    pub fn events(&self) -> &VecDeque<Event> {
        &self.events
    }

    /// The number of events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when no event is held.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The bound on events held.
    pub fn max_events(&self) -> usize {
        self.max_events
    }

    /// Events dropped because the ring was full.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// The totals just before the oldest event held.
    pub fn baseline(&self) -> Totals {
        self.baseline
    }

    /// The totals after the newest event held (the pool's current figures, if the history is
    /// the pool's own).
    pub fn final_totals(&self) -> Totals {
        let mut totals = self.baseline;
        for event in &self.events {
            totals.apply(event);
        }
        totals
    }

    /// The totals after each event held, with the event's time in microseconds.
    pub fn timeline(&self) -> Vec<(u64, Totals)> {
        let mut totals = self.baseline;
        self.events
            .iter()
            .map(|event| {
                totals.apply(event);
                (event.time_us, totals)
            })
            .collect()
    }

    /// The peak of each total over the events held (and the baseline).
    pub fn peaks(&self) -> Totals {
        let mut peak = self.baseline;
        for (_, totals) in self.timeline() {
            peak.requested_bytes = peak.requested_bytes.max(totals.requested_bytes);
            peak.allocated_bytes = peak.allocated_bytes.max(totals.allocated_bytes);
            peak.reserved_bytes = peak.reserved_bytes.max(totals.reserved_bytes);
        }
        peak
    }

    /// How many events of each kind are held.
    pub fn count(&self, kind: EventKind) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(time_us: u64, size: u64, allocated: u64, offset: u64) -> Event {
        Event::new(
            EventKind::Alloc,
            time_us,
            size,
            allocated,
            Some(SegmentId(0)),
            offset,
        )
    }

    fn with_kind(mut event: Event, kind: EventKind) -> Event {
        event.kind = kind;
        event
    }

    #[test]
    fn totals_follow_allocations_pending_frees_and_segments() {
        let mut history = History::new(HistoryOptions::default(), Totals::default());
        history.record(Event::new(
            EventKind::SegmentAlloc,
            0,
            1024,
            1024,
            Some(SegmentId(0)),
            0,
        ));
        history.record(alloc(1, 100, 256, 0));
        history.record(with_kind(alloc(2, 100, 256, 0), EventKind::FreeRequested));
        let pending = history.final_totals();
        assert_eq!(
            pending,
            Totals {
                requested_bytes: 100,
                allocated_bytes: 256,
                reserved_bytes: 1024
            },
            "a pending free still counts as allocated"
        );
        history.record(with_kind(alloc(3, 100, 256, 0), EventKind::FreeCompleted));
        history.record(Event::new(
            EventKind::SegmentFree,
            4,
            1024,
            1024,
            Some(SegmentId(0)),
            0,
        ));
        assert_eq!(history.final_totals(), Totals::default());
        assert_eq!(
            history.peaks(),
            Totals {
                requested_bytes: 100,
                allocated_bytes: 256,
                reserved_bytes: 1024
            }
        );
        assert_eq!(history.timeline().len(), 5);
        assert_eq!(history.count(EventKind::Alloc), 1);
    }

    #[test]
    fn a_full_ring_drops_the_oldest_and_keeps_totals_exact() {
        let mut bounded = History::new(HistoryOptions::with_max_events(3), Totals::default());
        let mut unbounded = History::new(HistoryOptions::default(), Totals::default());
        for i in 0..10u64 {
            let event = if i % 3 == 2 {
                with_kind(alloc(i, 10, 256, (i - 2) * 256), EventKind::FreeCompleted)
            } else {
                alloc(i, 10, 256, i * 256)
            };
            bounded.record(event.clone());
            unbounded.record(event);
        }
        assert_eq!(bounded.len(), 3);
        assert_eq!(bounded.dropped_events(), 7);
        assert_eq!(bounded.events().front().map(|e| e.time_us), Some(7));
        assert_eq!(bounded.final_totals(), unbounded.final_totals());
        let zero = {
            let mut h = History::new(HistoryOptions::with_max_events(0), Totals::default());
            h.record(alloc(0, 10, 256, 0));
            h
        };
        assert!(zero.is_empty());
        assert_eq!(zero.dropped_events(), 1);
        assert_eq!(zero.final_totals().allocated_bytes, 256);
    }

    #[test]
    fn labels_are_inline_up_to_30_bytes_and_shared_beyond() {
        let short = Label::new("activations 12");
        assert!(matches!(short.0, LabelRepr::Inline { .. }));
        assert_eq!(short, "activations 12");
        let long_text = "a label that is longer than thirty bytes, é";
        let long = Label::from(long_text);
        assert!(matches!(long.0, LabelRepr::Shared(_)));
        assert_eq!(long.as_str(), long_text);
        let exactly = "é".repeat(15);
        assert_eq!(Label::new(&exactly).as_str(), exactly);
        assert!(Label::default().is_empty());
        assert_eq!(std::mem::size_of::<Label>(), 32);
        assert_eq!(std::mem::size_of::<Option<Label>>(), 32);
    }

    #[test]
    fn history_round_trips_through_json() {
        let mut history = History::new(
            HistoryOptions::with_max_events(8),
            Totals {
                requested_bytes: 1,
                allocated_bytes: 256,
                reserved_bytes: 4096,
            },
        );
        let mut event = alloc(5, 300, 512, 256);
        event.label = "weights".into();
        event.op = Some("matmul".into());
        history.record(event);
        let mut oom = Event::new(EventKind::Oom, 6, 1 << 30, 0, None, 0);
        oom.oom = Some(Box::new(OomDetails {
            segment_bytes: 1 << 30,
            reserved_bytes: 4096,
            allocated_bytes: 768,
            largest_free_bytes: 2048,
            budget_bytes: Some(8192),
            device_refused: false,
            released_bytes: 0,
        }));
        history.record(oom);
        let json = serde_json::to_string(&history).expect("serialize");
        assert!(json.contains("\"kind\":\"alloc\""), "{json}");
        let back: History = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, history);
    }

    #[test]
    fn totals_saturate_at_sizes_past_u64() {
        let mut history = History::new(HistoryOptions::with_max_events(2), Totals::default());
        for time_us in [1, 2, 3] {
            history.record(alloc(time_us, u64::MAX, u64::MAX, 0));
            history.record(Event::new(
                EventKind::SegmentAlloc,
                u64::MAX,
                u64::MAX,
                u64::MAX,
                Some(SegmentId(time_us)),
                0,
            ));
        }
        let totals = history.final_totals();
        assert_eq!(totals.requested_bytes, u64::MAX);
        assert_eq!(totals.allocated_bytes, u64::MAX);
        assert_eq!(totals.reserved_bytes, u64::MAX);
        assert_eq!(history.peaks().reserved_bytes, u64::MAX);
        assert!(!history.timeline().is_empty());
    }
}
