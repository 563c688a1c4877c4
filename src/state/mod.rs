//! The pool's memory as plain data, below the pool: the GPU pool fills a [`PoolState`] (its
//! `memory_state`), and the exporters in `report` read it, together with the figures derived from
//! it ([`PoolFigures`]) and its conversion into a PyTorch memory snapshot ([`pytorch_snapshot`]).
//!
//! No wgpu, and nothing of the pool or the report: exporters and tests build these by hand, and
//! the module only reads the policy's statistics, the history and the snapshot format.

#![deny(unsafe_code)]

mod pytorch;

#[cfg(test)]
pub(crate) mod fixtures;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::buddy;
use crate::policy::{PoolStats, SegmentClass, SegmentId};

pub use pytorch::{pytorch_snapshot, SegmentAddresses};

/// Why the crate created a buffer: the rows of the accounting of every buffer the crate holds on
/// a device ([`AccountedBytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferRole {
    /// Segments of every pool on the device (a naive pool's buffers too; a tensor, a plan's
    /// arena and the autotuner's scratch operands are allocations in them).
    PoolSegments,
    /// Pools' read-back staging buffers.
    ReadBack,
    /// Compute contexts' and plans' uniform buffers of kernel parameters.
    Parameters,
    /// Timestamp resolve and read-back buffers of profiled contexts.
    Timestamps,
    /// The buffers plans read their outputs back through (one per context, shared by its plans;
    /// and each plan's for its submitted runs).
    PlanReadBack,
}

impl BufferRole {
    /// Every role, in report order.
    pub const ALL: [BufferRole; 5] = [
        BufferRole::PoolSegments,
        BufferRole::ReadBack,
        BufferRole::Parameters,
        BufferRole::Timestamps,
        BufferRole::PlanReadBack,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::PoolSegments => "pool segments",
            Self::ReadBack => "read-back staging",
            Self::Parameters => "kernel parameters",
            Self::Timestamps => "timestamps",
            Self::PlanReadBack => "plan read-back",
        }
    }
}

/// The buffers of one role that the crate holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleBytes {
    /// What they are for.
    pub role: BufferRole,
    /// Their sizes added up, in bytes.
    pub bytes: u64,
    /// How many there are.
    pub buffers: u64,
}

/// Every buffer the crate holds on a device now, by role (`Gpu::accounted`): what the reports put
/// beside the device's own figure (wgpu's allocator report), so that the difference is named.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AccountedBytes {
    /// One row per role, in [`BufferRole::ALL`]'s order.
    pub roles: Vec<RoleBytes>,
}

impl AccountedBytes {
    /// The bytes of every role, added up.
    pub fn total_bytes(&self) -> u64 {
        self.roles
            .iter()
            .map(|role| role.bytes)
            .fold(0, u64::saturating_add)
    }

    /// The bytes of one role.
    pub fn bytes_of(&self, role: BufferRole) -> u64 {
        self.roles
            .iter()
            .filter(|row| row.role == role)
            .map(|row| row.bytes)
            .sum()
    }
}

/// What a [`Span`] of a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// A live allocation (PyTorch's `active_allocated`).
    Allocated,
    /// A dropped allocation whose range waits for a submission before reuse (PyTorch's
    /// `active_pending_free`).
    PendingFree,
    /// A free buddy block (PyTorch's `inactive`).
    Free,
}

/// A range of a segment: an allocation, a pending free or a free block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Start of the range in its segment, in bytes.
    pub offset_bytes: u64,
    /// Length of the range, in bytes (for an allocation, its size after rounding).
    pub size_bytes: u64,
    /// The size asked for, in bytes (0 for a free block).
    pub requested_bytes: u64,
    /// What the range holds.
    pub kind: SpanKind,
    /// The allocation's label (empty for free blocks and unlabelled allocations).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// The op in scope when the allocation was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

impl Span {
    /// A free block.
    pub fn free(offset_bytes: u64, size_bytes: u64) -> Self {
        Self {
            offset_bytes,
            size_bytes,
            requested_bytes: 0,
            kind: SpanKind::Free,
            label: String::new(),
            op: None,
        }
    }

    /// A live allocation of `requested_bytes` holding `size_bytes`.
    pub fn allocated(offset_bytes: u64, size_bytes: u64, requested_bytes: u64) -> Self {
        Self {
            offset_bytes,
            size_bytes,
            requested_bytes,
            kind: SpanKind::Allocated,
            label: String::new(),
            op: None,
        }
    }

    /// One past the last byte of the range, in bytes from the segment's start.
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes.saturating_add(self.size_bytes)
    }
}

/// One segment (one `wgpu::Buffer`) and the spans that tile it, in address order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentState {
    /// The segment's id.
    pub id: SegmentId,
    /// Its size, in bytes.
    pub size_bytes: u64,
    /// Which of the policy's size classes it serves (every buffer of the naive baseline is
    /// [`SegmentClass::Dedicated`]).
    pub class: SegmentClass,
    /// Allocations, pending frees and free blocks, in address order, tiling `[0, size_bytes)`.
    pub spans: Vec<Span>,
}

impl SegmentState {
    /// Its class's name: `"packed"`, `"mid"`, `"large"` or `"dedicated"`.
    pub fn kind(&self) -> &'static str {
        self.class.name()
    }

    fn sum(&self, kind: SpanKind, requested: bool) -> u64 {
        self.spans
            .iter()
            .filter(|span| span.kind == kind)
            .map(|span| {
                if requested {
                    span.requested_bytes
                } else {
                    span.size_bytes
                }
            })
            .fold(0, u64::saturating_add)
    }

    /// Bytes held by live allocations, after rounding.
    pub fn allocated_bytes(&self) -> u64 {
        self.sum(SpanKind::Allocated, false)
    }

    /// Bytes asked for by live allocations.
    pub fn requested_bytes(&self) -> u64 {
        self.sum(SpanKind::Allocated, true)
    }

    /// Bytes of pending frees.
    pub fn pending_free_bytes(&self) -> u64 {
        self.sum(SpanKind::PendingFree, false)
    }

    /// Bytes of free blocks.
    pub fn free_bytes(&self) -> u64 {
        self.sum(SpanKind::Free, false)
    }

    /// The largest free block, in bytes.
    pub fn largest_free_bytes(&self) -> u64 {
        self.spans
            .iter()
            .filter(|span| span.kind == SpanKind::Free)
            .map(|span| span.size_bytes)
            .max()
            .unwrap_or(0)
    }

    /// True when the segment holds no allocation and no pending free.
    pub fn is_empty(&self) -> bool {
        self.spans.iter().all(|span| span.kind == SpanKind::Free)
    }

    /// Checks that the spans tile `[0, size_bytes)` in address order with no gap or overlap.
    ///
    /// # Errors
    ///
    /// A sentence naming the first span out of place.
    pub fn check_tiling(&self) -> Result<(), String> {
        let mut expected = 0;
        for (index, span) in self.spans.iter().enumerate() {
            if span.offset_bytes != expected || span.size_bytes == 0 {
                return Err(format!(
                    "segment {}: span {index} is [{}, +{}), expected it to start at {expected}",
                    self.id.0, span.offset_bytes, span.size_bytes
                ));
            }
            expected = span
                .offset_bytes
                .checked_add(span.size_bytes)
                .ok_or_else(|| {
                    format!(
                        "segment {}: span {index} is [{}, +{}), past 2^64 bytes",
                        self.id.0, span.offset_bytes, span.size_bytes
                    )
                })?;
        }
        if expected == self.size_bytes {
            Ok(())
        } else {
            Err(format!(
                "segment {}: spans end at {expected}, the segment at {}",
                self.id.0, self.size_bytes
            ))
        }
    }
}

/// The policy's settings that the report needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySummary {
    /// Smallest block and alignment of every offset, in bytes.
    pub min_block_bytes: u64,
    /// Smallest segment created, in bytes.
    pub min_segment_bytes: u64,
    /// Largest pooled segment, in bytes.
    pub max_segment_bytes: u64,
    /// Requests above this are large (they share large segments), in bytes. Read from older
    /// files under its former name, `dedicated_above_bytes`.
    #[serde(alias = "dedicated_above_bytes")]
    pub large_above_bytes: u64,
    /// Largest request accepted, in bytes.
    pub max_allocation_bytes: u64,
    /// How requests are rounded (`Exact` or `PowerOfTwo`).
    pub rounding: String,
    /// The budget on reserved bytes, if any.
    pub budget_bytes: Option<u64>,
}

/// Whether history is being recorded, and how much of it is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryStatus {
    /// The ring's bound.
    pub max_events: usize,
    /// Events held.
    pub events: usize,
    /// Events dropped because the ring was full.
    pub dropped_events: u64,
}

/// The pool's memory as plain data, taken under one lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolState {
    /// True for the naive baseline (one buffer per allocation).
    pub naive: bool,
    /// When it was taken, in microseconds since the pool was created.
    pub time_us: u64,
    /// The pool's statistics.
    pub stats: PoolStats,
    /// The policy (`None` for the naive baseline).
    pub policy: Option<PolicySummary>,
    /// The device's `max_buffer_size`, in bytes.
    pub max_buffer_size: u64,
    /// The device's `max_storage_buffer_binding_size`, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// The read-back staging buffer the pool keeps between reads, in bytes (0: none). Device
    /// memory outside the segments and the statistics; `trim()` gives it back.
    #[serde(default)]
    pub staging_bytes: u64,
    /// History recording (`None`: off).
    pub history: Option<HistoryStatus>,
    /// Every segment, in id order, with its spans.
    pub segments: Vec<SegmentState>,
}

/// One segment's figures, for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentInfo {
    /// The segment's id.
    pub id: SegmentId,
    /// Its size, in bytes.
    pub size_bytes: u64,
    /// Which of the policy's size classes it serves.
    pub class: SegmentClass,
    /// Its buddy statistics.
    pub stats: buddy::Stats,
    /// Its free blocks as `(offset_bytes, size_bytes)`, in address order.
    pub free_blocks: Vec<(u64, u64)>,
}

/// How many free blocks of one size there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeBlockCount {
    /// The block size, in bytes.
    pub size_bytes: u64,
    /// How many free blocks have it.
    pub count: u64,
}

/// The labelled parts of allocations that share a name once their numbers are put aside
/// (`seq 3` and `seq 12` are `seq N`): e.g. a KV cache's blocks by what holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedParts {
    /// The part's name, each run of digits written `N`.
    pub name: String,
    /// Spans of that name.
    pub spans: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The pool's figures, derived from a [`PoolState`]: what the summary table prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolFigures {
    /// True for the naive baseline.
    pub naive: bool,
    /// Current, peak and total of reserved, allocated and requested bytes, allocations and
    /// segments; `create_buffer` calls; OOMs.
    pub stats: PoolStats,
    /// `1 - requested / allocated` over live allocations.
    pub internal_fragmentation: f64,
    /// `1 - largest_free / free` over the segments that hold allocations (empty segments apart:
    /// see [`PoolStats::external_fragmentation`]).
    pub external_fragmentation: f64,
    /// The largest free block in any pooled segment, in bytes: the largest request served
    /// without creating a segment.
    pub largest_free_block_bytes: u64,
    /// Every request up to this size can be served now, growing the pool within the budget if
    /// needed (the device permitting: wgpu cannot tell how much memory it has left), in bytes.
    pub largest_allocation_now_bytes: u64,
    /// The same, capped by `max_storage_buffer_binding_size`: the largest allocation a kernel
    /// could bind, in bytes.
    pub largest_bindable_allocation_now_bytes: u64,
    /// The device's `max_storage_buffer_binding_size`, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// The budget on reserved bytes, if one is set.
    pub budget_bytes: Option<u64>,
    /// `budget - reserved`, in bytes, when a budget is set.
    pub budget_headroom_bytes: Option<u64>,
    /// Bytes of segments that hold nothing (given back by `trim()`).
    pub empty_segment_bytes: u64,
    /// Dropped allocations waiting for a submission (one for an allocation of labelled parts).
    pub pending_free_count: u64,
    /// Their bytes (after rounding).
    pub pending_free_bytes: u64,
    /// The read-back staging buffer, in bytes (outside the segments; given back by `trim()`).
    pub staging_bytes: u64,
    /// Free blocks per size, smallest first.
    pub free_blocks_per_size: Vec<FreeBlockCount>,
    /// Live allocations' labelled parts (spans labelled `tensor: part`), by part name, most
    /// bytes first.
    #[serde(default)]
    pub named_parts: Vec<NamedParts>,
    /// The policy (`None` for the naive baseline).
    pub policy: Option<PolicySummary>,
    /// History recording (`None`: off).
    pub history: Option<HistoryStatus>,
}

impl PoolFigures {
    /// Derives the figures from a state.
    pub fn from_state(state: &PoolState) -> Self {
        let stats = state.stats;
        let mut free_blocks: BTreeMap<u64, u64> = BTreeMap::new();
        let mut largest_free_block_bytes = 0;
        let mut empty_segment_bytes = 0;
        let (mut pending_free_count, mut pending_free_bytes) = (0, 0);
        let mut parts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for segment in &state.segments {
            if segment.is_empty() {
                empty_segment_bytes += segment.size_bytes;
            }
            for span in &segment.spans {
                if let (SpanKind::Allocated, Some((_, part))) =
                    (span.kind, span.label.rsplit_once(": "))
                {
                    let entry = parts.entry(numbers_aside(part)).or_default();
                    entry.0 += 1;
                    entry.1 += span.size_bytes;
                }
                match span.kind {
                    SpanKind::Free if segment.class != SegmentClass::Dedicated => {
                        *free_blocks.entry(span.size_bytes).or_default() += 1;
                        largest_free_block_bytes = largest_free_block_bytes.max(span.size_bytes);
                    }
                    SpanKind::PendingFree => {
                        pending_free_count += 1;
                        pending_free_bytes += span.size_bytes;
                    }
                    _ => {}
                }
            }
        }
        // An allocation with labelled parts shows as several spans: a live pool's statistics
        // count its pending frees as allocations; a state imported without them (PyTorch's
        // snapshots have no parts) by its spans.
        if stats.pending_frees > 0 {
            pending_free_count = stats.pending_frees;
        }
        let budget_bytes = state.policy.as_ref().and_then(|p| p.budget_bytes);
        let largest_allocation_now_bytes = match &state.policy {
            None => state.max_buffer_size,
            Some(policy) => largest_fresh_allocation(
                policy,
                budget_bytes.map(|budget| {
                    budget.saturating_sub(stats.reserved_bytes.current) + empty_segment_bytes
                }),
            )
            .max(largest_free_block_bytes),
        };
        Self {
            naive: state.naive,
            stats,
            internal_fragmentation: stats.internal_fragmentation(),
            external_fragmentation: stats.external_fragmentation(),
            largest_free_block_bytes,
            largest_allocation_now_bytes,
            largest_bindable_allocation_now_bytes: largest_allocation_now_bytes
                .min(state.max_storage_buffer_binding_size),
            max_storage_buffer_binding_size: state.max_storage_buffer_binding_size,
            budget_bytes,
            budget_headroom_bytes: budget_bytes
                .map(|budget| budget.saturating_sub(stats.reserved_bytes.current)),
            empty_segment_bytes,
            pending_free_count,
            pending_free_bytes,
            staging_bytes: state.staging_bytes,
            free_blocks_per_size: free_blocks
                .into_iter()
                .map(|(size_bytes, count)| FreeBlockCount { size_bytes, count })
                .collect(),
            named_parts: {
                let mut named: Vec<NamedParts> = parts
                    .into_iter()
                    .map(|(name, (spans, bytes))| NamedParts { name, spans, bytes })
                    .collect();
                named.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
                named
            },
            policy: state.policy.clone(),
            history: state.history,
        }
    }
}

/// `text` with each run of digits written `N`.
fn numbers_aside(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// The largest request a new segment could serve when `room_bytes` may still be reserved (`None`:
/// no budget). Requests up to `max_segment_bytes` need a power-of-two segment of at least
/// `min_segment_bytes`; larger ones a dedicated segment of their size rounded to `min_block_bytes`.
fn largest_fresh_allocation(policy: &PolicySummary, room_bytes: Option<u64>) -> u64 {
    let room = room_bytes.unwrap_or(u64::MAX);
    let dedicated_limit = policy.max_allocation_bytes.min(room);
    if dedicated_limit > policy.max_segment_bytes {
        return dedicated_limit / policy.min_block_bytes.max(1) * policy.min_block_bytes.max(1);
    }
    let pooled_limit = room.min(policy.max_segment_bytes);
    if pooled_limit < policy.min_segment_bytes || pooled_limit == 0 {
        return 0;
    }
    1u64 << (63 - pooled_limit.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(budget_bytes: Option<u64>) -> PolicySummary {
        PolicySummary {
            min_block_bytes: 256,
            min_segment_bytes: 2 << 20,
            max_segment_bytes: 64 << 20,
            large_above_bytes: 64 << 20,
            max_allocation_bytes: 2 << 30,
            rounding: "Exact".into(),
            budget_bytes,
        }
    }

    #[test]
    fn largest_fresh_allocation_follows_the_policy_and_the_budget() {
        assert_eq!(largest_fresh_allocation(&policy(None), None), 2 << 30);
        // 48 MiB of room: a pooled segment of 32 MiB is the largest that fits.
        assert_eq!(
            largest_fresh_allocation(&policy(None), Some(48 << 20)),
            32 << 20
        );
        // Past the largest segment, a dedicated segment takes the room, rounded to min_block.
        assert_eq!(
            largest_fresh_allocation(&policy(None), Some((100 << 20) + 100)),
            100 << 20
        );
        // Less room than the smallest segment: nothing new fits.
        assert_eq!(largest_fresh_allocation(&policy(None), Some(1 << 20)), 0);
    }

    #[test]
    fn tiling_is_checked() {
        let mut segment = SegmentState {
            id: SegmentId(3),
            size_bytes: 1024,
            class: SegmentClass::Packed,
            spans: vec![Span::allocated(0, 512, 500), Span::free(512, 512)],
        };
        assert_eq!(segment.check_tiling(), Ok(()));
        assert_eq!(segment.allocated_bytes(), 512);
        assert_eq!(segment.requested_bytes(), 500);
        assert_eq!(segment.largest_free_bytes(), 512);
        segment.spans[1].offset_bytes = 768;
        assert!(segment.check_tiling().is_err());
    }

    #[test]
    fn spans_past_u64_fail_the_tiling_check() {
        let segment = SegmentState {
            id: SegmentId(1),
            size_bytes: u64::MAX,
            class: SegmentClass::Packed,
            spans: vec![Span::free(0, u64::MAX), Span::free(u64::MAX, 1)],
        };
        let error = segment.check_tiling().unwrap_err();
        assert!(error.contains("past 2^64"), "{error}");
        assert_eq!(segment.spans[1].end_bytes(), u64::MAX);
    }
}
