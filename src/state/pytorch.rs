//! The pool as a PyTorch memory snapshot, for `python -m torch.cuda._memory_viz` and
//! pytorch.org/memory_viz.
//!
//! The mapping:
//!
//! - **Segments** are the pool's segment buffers (and, for the naive baseline, its buffers). Each
//!   gets a synthetic device address from [`SegmentAddresses`]; `segment_type` follows the class:
//!   `"small"` for a packed segment (small requests, as PyTorch's small pool holds requests up to
//!   1 MiB) and `"large"` for the mid-sized, large and dedicated classes.
//! - **Blocks** tile each segment in address order: live allocations are `active_allocated`
//!   (`size` = bytes held after rounding, `requested_size` = bytes asked for), dropped allocations
//!   waiting for a submission are `active_pending_free`, and free buddy blocks are `inactive`
//!   (adjacent free blocks merged into one, as PyTorch's coalesced free blocks are).
//! - **`device_traces[0]`** is the history: `alloc`, `free_requested` (the allocation was
//!   dropped), `free_completed` (its range was released after a submission), `segment_alloc`,
//!   `segment_free` and `oom`. Allocation events carry the requested size, like PyTorch's;
//!   `time_us` is microseconds since the pool was created. An `oom`'s `device_free` is the room left
//!   under the budget, or 0 without one (wgpu cannot tell how much device memory is free).
//! - **Frames**: an allocation's label becomes a frame `label:0:<label>` and its op a frame
//!   `op:0:<op>` (innermost first), so the viewers show them where PyTorch shows the Python stack.

use serde_json::{Map, Value};

use super::{PoolState, Span, SpanKind};
use crate::history::{Event, EventKind, History};
use crate::policy::{SegmentClass, SegmentId};
use crate::snapshot::{
    Block, BlockState, Frame, Segment, Snapshot, TraceAction, TraceEntry, MAX_EXPORTED_VALUE,
};

/// The smallest address stride between segments, in bytes.
const MIN_STRIDE_BYTES: u64 = 2 << 20;
/// The largest address stride (64 TiB), so that there are always at least 127 slots below 2^53.
const MAX_STRIDE_BYTES: u64 = 1 << 46;

/// Synthetic device addresses for segments: segment `id` starts at
/// `(id mod slots + 1) * stride_bytes`, where the stride is the largest segment size rounded up to
/// a power of two (at least 2 MiB) and `slots` is how many strides fit below 2^53 (the largest
/// integer the viewer's JavaScript numbers hold exactly). Segments never overlap unless two live
/// segments' ids differ by a multiple of `slots` (at least 127, and 2^31 with 2 MiB segments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentAddresses {
    /// Distance between two segments' addresses, in bytes; a power of two.
    pub stride_bytes: u64,
    /// Distinct addresses before they repeat.
    pub slots: u64,
}

impl SegmentAddresses {
    /// Addresses for segments of at most `largest_segment_bytes`.
    pub fn for_largest_segment(largest_segment_bytes: u64) -> Self {
        let stride_bytes = largest_segment_bytes
            .max(MIN_STRIDE_BYTES)
            .checked_next_power_of_two()
            .unwrap_or(MAX_STRIDE_BYTES)
            .min(MAX_STRIDE_BYTES);
        Self {
            stride_bytes,
            slots: (MAX_EXPORTED_VALUE + 1) / stride_bytes - 1,
        }
    }

    /// The address of segment `id`'s first byte.
    pub fn address(&self, id: SegmentId) -> u64 {
        (id.0 % self.slots + 1) * self.stride_bytes
    }
}

/// The PyTorch snapshot of a pool state and, if recorded, its history (device 0's trace).
pub fn pytorch_snapshot(state: &PoolState, history: Option<&History>) -> Snapshot {
    let largest_segment_bytes = state
        .segments
        .iter()
        .map(|segment| segment.size_bytes)
        .chain(history.into_iter().flat_map(|history| {
            history
                .events()
                .iter()
                .filter(|event| {
                    matches!(event.kind, EventKind::SegmentAlloc | EventKind::SegmentFree)
                })
                .map(|event| event.size_bytes)
        }))
        .max()
        .unwrap_or(0);
    let addresses = SegmentAddresses::for_largest_segment(largest_segment_bytes);
    let segments = state
        .segments
        .iter()
        .map(|segment| {
            let address = addresses.address(segment.id);
            let blocks = blocks(address, &segment.spans);
            let sum = |pick: fn(&Block) -> bool, requested: bool| -> u64 {
                blocks
                    .iter()
                    .filter(|block| pick(block))
                    .map(|block| {
                        if requested {
                            block.requested_size
                        } else {
                            block.size
                        }
                    })
                    .fold(0u64, u64::saturating_add)
            };
            Segment {
                device: 0,
                address,
                total_size: segment.size_bytes,
                allocated_size: sum(|b| b.state == BlockState::ActiveAllocated, false),
                active_size: sum(|b| b.state.is_active(), false),
                requested_size: sum(|b| b.state.is_active(), true),
                stream: 0,
                segment_type: if segment.class == SegmentClass::Packed {
                    "small".into()
                } else {
                    "large".into()
                },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: Vec::new(),
                blocks,
            }
        })
        .collect();
    let trace = history
        .map(|history| {
            let budget_bytes = state.policy.as_ref().and_then(|p| p.budget_bytes);
            history
                .events()
                .iter()
                .map(|event| trace_entry(event, &addresses, budget_bytes))
                .collect()
        })
        .unwrap_or_default();
    Snapshot {
        segments,
        device_traces: vec![trace],
        allocator_settings: allocator_settings(state),
    }
}

fn label_frames(label: &str, op: Option<&str>) -> Vec<Frame> {
    let mut frames = Vec::new();
    if !label.is_empty() {
        frames.push(Frame {
            filename: "label".into(),
            line: 0,
            name: label.into(),
        });
    }
    if let Some(op) = op {
        frames.push(Frame {
            filename: "op".into(),
            line: 0,
            name: op.into(),
        });
    }
    frames
}

/// The blocks of one segment: one per allocation or pending free, one per run of free blocks.
fn blocks(segment_address: u64, spans: &[Span]) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::with_capacity(spans.len());
    for span in spans {
        let state = match span.kind {
            SpanKind::Allocated => BlockState::ActiveAllocated,
            SpanKind::PendingFree => BlockState::ActivePendingFree,
            SpanKind::Free => BlockState::Inactive,
        };
        if let Some(last) = blocks.last_mut() {
            if state == BlockState::Inactive && last.state == BlockState::Inactive {
                last.size = last.size.saturating_add(span.size_bytes);
                continue;
            }
        }
        blocks.push(Block {
            address: segment_address.saturating_add(span.offset_bytes),
            size: span.size_bytes,
            requested_size: span.requested_bytes,
            state,
            frames: label_frames(&span.label, span.op.as_deref()),
        });
    }
    blocks
}

fn trace_entry(
    event: &Event,
    addresses: &SegmentAddresses,
    budget_bytes: Option<u64>,
) -> TraceEntry {
    let addr = event.segment.map_or(0, |segment| {
        addresses
            .address(segment)
            .saturating_add(event.offset_bytes)
    });
    let action = match event.kind {
        EventKind::Alloc => TraceAction::Alloc,
        EventKind::FreeRequested => TraceAction::FreeRequested,
        EventKind::FreeCompleted => TraceAction::FreeCompleted,
        EventKind::SegmentAlloc => TraceAction::SegmentAlloc,
        EventKind::SegmentFree => TraceAction::SegmentFree,
        EventKind::Oom => TraceAction::Oom,
    };
    let device_free = (event.kind == EventKind::Oom).then(|| {
        let budget = event
            .oom
            .as_ref()
            .and_then(|oom| oom.budget_bytes)
            .or(budget_bytes);
        let reserved = event.oom.as_ref().map_or(0, |oom| oom.reserved_bytes);
        budget.map_or(0, |budget| budget.saturating_sub(reserved))
    });
    TraceEntry {
        action,
        addr,
        size: event.size_bytes,
        stream: 0,
        time_us: i64::try_from(event.time_us).unwrap_or(i64::MAX),
        frames: label_frames(&event.label, event.op.as_deref()),
        device_free,
    }
}

fn allocator_settings(state: &PoolState) -> Map<String, Value> {
    let mut settings = Map::new();
    settings.insert("allocator".into(), Value::from("wgpu-pool"));
    settings.insert(
        "strategy".into(),
        Value::from(if state.naive {
            "naive (one buffer per allocation)"
        } else {
            "buddy"
        }),
    );
    if let Some(policy) = &state.policy {
        settings.insert(
            "min_block_bytes".into(),
            Value::from(policy.min_block_bytes),
        );
        settings.insert(
            "min_segment_bytes".into(),
            Value::from(policy.min_segment_bytes),
        );
        settings.insert(
            "max_segment_bytes".into(),
            Value::from(policy.max_segment_bytes),
        );
        settings.insert("rounding".into(), Value::from(policy.rounding.clone()));
        if let Some(budget) = policy.budget_bytes {
            settings.insert("budget_bytes".into(), Value::from(budget));
        }
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::state::fixtures::{synthetic, MIB};

    #[test]
    fn blocks_tile_segments_and_sizes_add_up() {
        let (state, history) = synthetic();
        let snapshot = pytorch_snapshot(&state, Some(&history));
        snapshot.check_invariants().expect("invariants");
        let segment = &snapshot.segments[0];
        assert_eq!(segment.total_size, 4 * MIB);
        assert_eq!(segment.allocated_size, MIB + 512);
        assert_eq!(segment.active_size, MIB + 768);
        assert_eq!(segment.requested_size, MIB - 100 + 512 + 256);
        // A packed segment is PyTorch's small pool, whatever its size.
        assert_eq!(segment.segment_type, "small");
        // Free runs are merged: a, b, c, one inactive block.
        let states: Vec<&str> = segment.blocks.iter().map(|b| b.state.as_str()).collect();
        assert_eq!(
            states,
            [
                "active_allocated",
                "active_allocated",
                "active_pending_free",
                "inactive"
            ]
        );
        assert_eq!(segment.blocks[0].frames[0].name, "a");
        assert_eq!(segment.blocks[0].frames[1].name, "matmul");
    }

    #[test]
    fn trace_addresses_match_segment_addresses_and_offsets() {
        let (state, history) = synthetic();
        let snapshot = pytorch_snapshot(&state, Some(&history));
        let base = snapshot.segments[0].address;
        assert!(base > 0 && base + 4 * MIB <= MAX_EXPORTED_VALUE);
        let trace = snapshot.events();
        assert_eq!(trace.len(), history.len());
        assert_eq!(trace[0].action, TraceAction::SegmentAlloc);
        assert_eq!(trace[0].addr, base);
        let live: Vec<u64> = snapshot.segments[0]
            .blocks
            .iter()
            .filter(|b| b.state.is_active())
            .map(|b| b.address)
            .collect();
        let allocs: Vec<u64> = trace[4..7].iter().map(|e| e.addr).collect();
        assert_eq!(live, allocs);
        assert_eq!(trace[5].size, 512);
        let oom = trace.last().expect("oom");
        assert_eq!(oom.action, TraceAction::Oom);
        assert_eq!(oom.device_free, Some(4 * MIB));
        assert_eq!(oom.time_us, 90);
        // Peaks computed from the trace agree with the history's.
        assert_eq!(
            snapshot.trace_peaks().peak_requested_bytes,
            history.peaks().requested_bytes
        );
        assert_eq!(
            snapshot.trace_peaks().peak_reserved_bytes,
            history.peaks().reserved_bytes
        );
    }

    #[test]
    fn json_and_pickle_carry_the_same_data() {
        let (state, history) = synthetic();
        let snapshot = pytorch_snapshot(&state, Some(&history));
        let pickle = snapshot.to_pickle_bytes().expect("pickle");
        assert_eq!(pickle[0], 0x80, "protocol marker");
        assert!(pickle[1] <= 4, "protocol {} > 4", pickle[1]);
        let json = snapshot.to_json_string().expect("json");
        let from_pickle = Snapshot::from_pickle_bytes(&pickle).expect("read pickle");
        let from_json = Snapshot::from_json_str(&json).expect("read json");
        assert_eq!(from_pickle, from_json);
        assert_eq!(from_pickle, snapshot);
    }

    #[test]
    fn addresses_stay_below_2_pow_53_and_apart() {
        for largest in [0, 1, 2 * MIB, 64 * MIB + 1, 4 << 30, u64::MAX] {
            let addresses = SegmentAddresses::for_largest_segment(largest);
            assert!(addresses.slots >= 127);
            let last = addresses.address(SegmentId(addresses.slots - 1));
            assert!(last + addresses.stride_bytes - 1 <= MAX_EXPORTED_VALUE);
            assert_eq!(
                addresses.address(SegmentId(1)) - addresses.address(SegmentId(0)),
                addresses.stride_bytes
            );
            assert!(addresses.stride_bytes >= largest.min(MAX_STRIDE_BYTES));
        }
    }

    #[test]
    fn an_empty_pool_without_history_is_a_valid_snapshot() {
        let (mut state, _) = synthetic();
        state.segments.clear();
        let snapshot = pytorch_snapshot(&state, None);
        snapshot.check_invariants().expect("invariants");
        assert_eq!(snapshot.device_traces, vec![Vec::new()]);
        snapshot.to_pickle_bytes().expect("pickle");
    }
}
