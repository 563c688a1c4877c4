//! The history as a Chrome trace (the JSON object format, `{"traceEvents": [...]}`), which
//! Perfetto (ui.perfetto.dev) and `chrome://tracing` open.
//!
//! - Counter events (`"ph": "C"`) `requested_bytes`, `allocated_bytes` and `reserved_bytes`, one
//!   sample per event that changes them.
//! - One complete event (`"ph": "X"`) per allocation lifetime, from `alloc` to `free_completed`
//!   (while the pool held the memory; `dropped_us` says when it was dropped), on process 1. Slices
//!   are spread over "lanes" (threads) so that no two overlap on one lane. An allocation still live
//!   at the end runs to `end_time_us`; one freed whose `alloc` fell out of the ring starts at the
//!   first event.
//! - One complete event per segment lifetime on process 2, and an instant event (`"ph": "i"`) per
//!   out-of-memory refusal.
//!
//! `ts` and `dur` are in microseconds since the pool was created.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::summary::format_bytes;
use crate::history::{Event, EventKind, History};
use crate::policy::SegmentId;

const ALLOCATIONS_PID: u64 = 1;
const SEGMENTS_PID: u64 = 2;

/// A slice before it is given a lane.
struct Slice {
    name: String,
    start_us: u64,
    end_us: u64,
    args: Value,
}

/// Assigns each slice (sorted by start) the first lane whose last slice has ended.
fn lanes(slices: &mut [Slice]) -> Vec<usize> {
    slices.sort_by_key(|slice| (slice.start_us, slice.end_us));
    let mut lane_ends: Vec<u64> = Vec::new();
    slices
        .iter()
        .map(
            |slice| match lane_ends.iter().position(|&end| end <= slice.start_us) {
                Some(lane) => {
                    lane_ends[lane] = slice.end_us;
                    lane
                }
                None => {
                    lane_ends.push(slice.end_us);
                    lane_ends.len() - 1
                }
            },
        )
        .collect()
}

fn allocation_name(event: &Event) -> String {
    let size = format_bytes(event.size_bytes);
    if event.label.is_empty() {
        format!("alloc {size}")
    } else {
        format!("{} {size}", event.label)
    }
}

fn allocation_args(event: &Event, dropped_us: Option<u64>) -> Value {
    json!({
        "requested_bytes": event.size_bytes,
        "allocated_bytes": event.allocated_bytes,
        "segment": event.segment.map(|s| s.0),
        "offset_bytes": event.offset_bytes,
        "label": &*event.label,
        "op": event.op.as_deref(),
        "dropped_us": dropped_us,
    })
}

/// The Chrome trace of `history`, with live allocations and segments ending at `end_time_us`
/// (e.g. the time of the pool state the trace goes with).
pub fn chrome_trace(history: &History, end_time_us: u64) -> Value {
    let events = history.events();
    let first_us = events.front().map_or(0, |event| event.time_us);
    let end_time_us = end_time_us.max(events.back().map_or(0, |event| event.time_us));
    let mut trace: Vec<Value> = vec![
        json!({"ph": "M", "name": "process_name", "pid": ALLOCATIONS_PID, "tid": 0,
               "args": {"name": "wgpu-pool allocations"}}),
        json!({"ph": "M", "name": "process_name", "pid": SEGMENTS_PID, "tid": 0,
               "args": {"name": "wgpu-pool segments"}}),
    ];
    push_counters(&mut trace, history, first_us);
    let mut lifetimes = Lifetimes::default();
    for event in events {
        match event.segment {
            Some(segment) => lifetimes.record(segment, event, first_us),
            None if event.kind == EventKind::Oom => trace.push(oom_instant(event)),
            None => {}
        }
    }
    let (mut allocations, mut segments) = lifetimes.close(first_us, end_time_us);
    push_slices(&mut trace, ALLOCATIONS_PID, &mut allocations, "allocations");
    push_slices(&mut trace, SEGMENTS_PID, &mut segments, "segments");
    json!({
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "wgpu-pool",
            "dropped_events": history.dropped_events(),
        },
    })
}

/// The counters: the baseline at the first event, then after every event that changes them.
fn push_counters(trace: &mut Vec<Value>, history: &History, first_us: u64) {
    let counter = |trace: &mut Vec<Value>, time_us: u64, totals: crate::history::Totals| {
        for (name, value) in [
            ("requested_bytes", totals.requested_bytes),
            ("allocated_bytes", totals.allocated_bytes),
            ("reserved_bytes", totals.reserved_bytes),
        ] {
            trace.push(
                json!({"ph": "C", "name": name, "pid": ALLOCATIONS_PID, "tid": 0,
                              "ts": time_us, "args": {"bytes": value}}),
            );
        }
    };
    counter(trace, first_us, history.baseline());
    let mut previous = history.baseline();
    for (time_us, totals) in history.timeline() {
        if totals != previous {
            counter(trace, time_us, totals);
            previous = totals;
        }
    }
}

/// The instant event of an out-of-memory refusal.
fn oom_instant(event: &Event) -> Value {
    let oom = event.oom.as_ref();
    json!({
        "ph": "i", "s": "g", "name": format!("out of memory: {}", format_bytes(event.size_bytes)),
        "pid": ALLOCATIONS_PID, "tid": 0, "ts": event.time_us,
        "args": {
            "requested_bytes": event.size_bytes,
            "segment_bytes": oom.map(|o| o.segment_bytes),
            "reserved_bytes": oom.map(|o| o.reserved_bytes),
            "allocated_bytes": oom.map(|o| o.allocated_bytes),
            "largest_free_bytes": oom.map(|o| o.largest_free_bytes),
            "budget_bytes": oom.and_then(|o| o.budget_bytes),
            "op": event.op.as_deref(),
        }
    })
}

/// The allocation and segment lifetimes of the history, read event by event.
#[derive(Default)]
struct Lifetimes<'h> {
    /// Allocations freed, as slices.
    allocations: Vec<Slice>,
    /// Segments freed, as slices.
    segments: Vec<Slice>,
    /// Allocations not yet freed, by segment and offset: the event that opened each (its
    /// `alloc`, or its `free_requested` when the `alloc` fell out of the ring) and when it was
    /// dropped.
    open: HashMap<(SegmentId, u64), (&'h Event, Option<u64>)>,
    /// Segments not yet freed, with the event that created each.
    open_segments: HashMap<SegmentId, &'h Event>,
}

impl<'h> Lifetimes<'h> {
    /// Reads one event of `segment`.
    fn record(&mut self, segment: SegmentId, event: &'h Event, first_us: u64) {
        let key = (segment, event.offset_bytes);
        match event.kind {
            EventKind::Alloc => {
                self.open.insert(key, (event, None));
            }
            EventKind::FreeRequested => match self.open.get_mut(&key) {
                Some((_, dropped)) => *dropped = Some(event.time_us),
                None => {
                    self.open.insert(key, (event, Some(event.time_us)));
                }
            },
            EventKind::FreeCompleted => {
                let (start, dropped) = self.open.remove(&key).unwrap_or((event, None));
                let (start_us, before_trace) = if start.kind == EventKind::Alloc {
                    (start.time_us, false)
                } else {
                    (first_us, true)
                };
                let mut args = allocation_args(event, dropped.or(Some(event.time_us)));
                args["allocated_before_trace"] = json!(before_trace);
                self.allocations.push(Slice {
                    name: allocation_name(event),
                    start_us,
                    end_us: event.time_us,
                    args,
                });
            }
            EventKind::SegmentAlloc => {
                self.open_segments.insert(segment, event);
            }
            EventKind::SegmentFree => {
                let start_us = self
                    .open_segments
                    .remove(&segment)
                    .map_or(first_us, |start| start.time_us);
                self.segments.push(segment_slice(
                    segment,
                    event.size_bytes,
                    start_us,
                    event.time_us,
                ));
            }
            EventKind::Oom => {}
        }
    }

    /// The allocation and segment slices, those still open ending at `end_time_us`.
    fn close(mut self, first_us: u64, end_time_us: u64) -> (Vec<Slice>, Vec<Slice>) {
        for ((_, _), (event, dropped)) in self.open {
            let mut args = allocation_args(event, dropped);
            args["live_at_end"] = json!(true);
            self.allocations.push(Slice {
                name: allocation_name(event),
                start_us: if event.kind == EventKind::Alloc {
                    event.time_us
                } else {
                    first_us
                },
                end_us: end_time_us,
                args,
            });
        }
        for (segment, event) in self.open_segments {
            self.segments.push(segment_slice(
                segment,
                event.size_bytes,
                event.time_us,
                end_time_us,
            ));
        }
        (self.allocations, self.segments)
    }
}

/// The slices of process `pid`, spread over lanes named `lane_name 0`, `lane_name 1`, ...
fn push_slices(trace: &mut Vec<Value>, pid: u64, slices: &mut [Slice], lane_name: &str) {
    let lanes = lanes(slices);
    let lane_count = lanes.iter().max().map_or(0, |&max| max + 1);
    for lane in 0..lane_count {
        trace.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane + 1,
                          "args": {"name": format!("{lane_name} {lane}")}}),
        );
    }
    for (slice, lane) in slices.iter().zip(lanes) {
        trace.push(json!({
            "ph": "X", "name": slice.name, "cat": lane_name, "pid": pid, "tid": lane + 1,
            "ts": slice.start_us, "dur": slice.end_us.saturating_sub(slice.start_us),
            "args": slice.args,
        }));
    }
}

fn segment_slice(segment: SegmentId, size_bytes: u64, start_us: u64, end_us: u64) -> Slice {
    Slice {
        name: format!("segment {} {}", segment.0, format_bytes(size_bytes)),
        start_us,
        end_us,
        args: json!({"segment": segment.0, "size_bytes": size_bytes}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fixtures::{synthetic, MIB};

    #[test]
    fn counters_slices_and_lanes() {
        let (state, history) = synthetic();
        let trace = chrome_trace(&history, state.time_us);
        let events = trace["traceEvents"].as_array().expect("array");
        let slices: Vec<&Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "allocations")
            .collect();
        // scratch (freed), a, b (live), c (dropped, pending).
        assert_eq!(slices.len(), 4);
        let scratch = slices
            .iter()
            .find(|e| e["args"]["label"] == "scratch")
            .expect("scratch");
        assert_eq!(scratch["ts"], 20);
        assert_eq!(scratch["dur"], 20);
        assert_eq!(scratch["args"]["dropped_us"], 30);
        let c = slices
            .iter()
            .find(|e| e["args"]["label"] == "c")
            .expect("c");
        assert_eq!(c["args"]["dropped_us"], 80);
        assert_eq!(c["args"]["live_at_end"], true);
        assert_eq!(c["ts"].as_u64().unwrap() + c["dur"].as_u64().unwrap(), 100);
        // No two slices of one lane overlap.
        let mut by_lane: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for slice in &slices {
            let ts = slice["ts"].as_u64().unwrap();
            by_lane
                .entry(slice["tid"].as_u64().unwrap())
                .or_default()
                .push((ts, ts + slice["dur"].as_u64().unwrap()));
        }
        for spans in by_lane.values_mut() {
            spans.sort();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
        }
        // The last counter samples are the final totals.
        let last = |name: &str| {
            events
                .iter()
                .rev()
                .find(|e| e["ph"] == "C" && e["name"] == name)
                .map(|e| e["args"]["bytes"].as_u64().unwrap())
        };
        assert_eq!(last("allocated_bytes"), Some(MIB + 768));
        assert_eq!(last("reserved_bytes"), Some(4 * MIB));
        assert_eq!(last("requested_bytes"), Some(MIB - 100 + 512 + 256));
        assert!(events.iter().any(|e| e["ph"] == "i"), "the oom instant");
        assert!(events
            .iter()
            .any(|e| e["ph"] == "X" && e["cat"] == "segments"));
    }

    #[test]
    fn lanes_never_overlap() {
        let mut slices: Vec<Slice> = [(0, 10), (5, 15), (10, 20), (12, 13), (15, 30)]
            .into_iter()
            .map(|(start_us, end_us)| Slice {
                name: String::new(),
                start_us,
                end_us,
                args: Value::Null,
            })
            .collect();
        let lanes = lanes(&mut slices);
        assert_eq!(lanes, [0, 1, 0, 2, 1]);
    }
}
