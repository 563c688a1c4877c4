//! Replay: run a recorded allocation trace offline, on the CPU, through several allocation
//! strategies, and compare the memory each would have reserved.
//!
//! The `pool` strategy is the very policy the GPU pool runs (`crate::policy::PoolCore`), over a
//! `SimulatedStorage`; `pool_pow2` is the same with power-of-two rounding; `naive` is one buffer per
//! allocation, the policy's naive mode over the same storage. PyTorch's own reserved memory comes from the trace's `segment_alloc` and
//! `segment_free` events.
//!
//! `pool_compact` is the pool that, when a request would otherwise grow the pool (or fail), first
//! asks the policy for a compaction plan (`crate::policy::PoolCore::compaction_plan`) and
//! applies it: live allocations move out of an aligned block so that the request fits in the
//! segments held. The replay copies nothing; it counts the bytes the copies would cover.

#![deny(unsafe_code)]

use std::collections::HashMap;

use crate::buddy::Rounding;
use crate::policy::{
    CompactionLimits, Placement, PolicyConfig, PolicyError, PoolCore, SimulatedStorage,
};
use crate::snapshot::{Snapshot, TraceAction, TraceEntry};

/// What happened, in the order it happened. Sizes are in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayEvent {
    /// `size` bytes were allocated at `addr`.
    Alloc {
        /// The address the recording allocator gave; only used to match the free.
        addr: u64,
        /// The size asked for, in bytes.
        size: u64,
    },
    /// The allocation at `addr` was freed (and its memory may be reused).
    Free {
        /// The address of the allocation.
        addr: u64,
    },
    /// The recording allocator reserved a segment of `size` bytes (PyTorch's `segment_alloc`).
    SegmentAlloc {
        /// The segment size, in bytes.
        size: u64,
    },
    /// The recording allocator gave back a segment of `size` bytes (PyTorch's `segment_free`).
    SegmentFree {
        /// The segment size, in bytes.
        size: u64,
    },
}

impl ReplayEvent {
    /// The events of a recorded trace, in order: `alloc`; `free_completed` as the free (or
    /// `free_requested` when the trace has no `free_completed` at all); `segment_alloc` and
    /// `segment_map` as reserving, `segment_free` and `segment_unmap` as giving back. Other actions
    /// (`oom`, `snapshot`, unknown ones) are left out.
    pub fn from_trace(entries: &[TraceEntry]) -> Vec<ReplayEvent> {
        let frees_complete = entries
            .iter()
            .any(|e| e.action == TraceAction::FreeCompleted);
        let free_action = if frees_complete {
            TraceAction::FreeCompleted
        } else {
            TraceAction::FreeRequested
        };
        entries
            .iter()
            .filter_map(|entry| match &entry.action {
                TraceAction::Alloc => Some(ReplayEvent::Alloc {
                    addr: entry.addr,
                    size: entry.size,
                }),
                action if *action == free_action => Some(ReplayEvent::Free { addr: entry.addr }),
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                    Some(ReplayEvent::SegmentAlloc { size: entry.size })
                }
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    Some(ReplayEvent::SegmentFree { size: entry.size })
                }
                _ => None,
            })
            .collect()
    }

    /// The events of every device trace of a snapshot, one device after another.
    pub fn from_snapshot(snapshot: &Snapshot) -> Vec<ReplayEvent> {
        snapshot
            .device_traces
            .iter()
            .flat_map(|trace| Self::from_trace(trace))
            .collect()
    }
}

/// The limits of a device, as far as the pool's policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LimitsProfile {
    /// A short name: `h200`, `webgpu`, `lavapipe`.
    pub name: &'static str,
    /// `min_storage_buffer_offset_alignment`, in bytes.
    pub min_storage_buffer_offset_alignment: u64,
    /// `max_buffer_size`, in bytes.
    pub max_buffer_size: u64,
    /// `max_storage_buffer_binding_size`, in bytes.
    pub max_storage_buffer_binding_size: u64,
}

impl LimitsProfile {
    /// An NVIDIA H200 on Vulkan (wgpu 30, driver 580).
    pub const H200: Self = Self {
        name: "h200",
        min_storage_buffer_offset_alignment: 32,
        max_buffer_size: 4_292_870_144,
        max_storage_buffer_binding_size: 2_147_483_644,
    };
    /// WebGPU's default limits (`wgpu::Limits::default()`).
    pub const WEBGPU: Self = Self {
        name: "webgpu",
        min_storage_buffer_offset_alignment: 256,
        max_buffer_size: 256 << 20,
        max_storage_buffer_binding_size: 128 << 20,
    };
    /// Mesa's lavapipe (Vulkan on the CPU).
    pub const LAVAPIPE: Self = Self {
        name: "lavapipe",
        min_storage_buffer_offset_alignment: 32,
        max_buffer_size: 2 << 30,
        max_storage_buffer_binding_size: 128 << 20,
    };

    /// Every built-in profile.
    pub const ALL: [Self; 3] = [Self::H200, Self::WEBGPU, Self::LAVAPIPE];

    /// The profile called `name`.
    pub fn by_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name == name)
    }

    /// The default policy for these limits.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig::for_limits(
            self.min_storage_buffer_offset_alignment,
            self.max_buffer_size,
        )
    }
}

/// The size granularity of the naive strategy's buffers: wgpu's `COPY_BUFFER_ALIGNMENT`, in
/// bytes.
pub const NAIVE_ALIGNMENT_BYTES: u64 = 4;

/// An allocation strategy to replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// The pool with this policy.
    Pool {
        /// The name to report.
        name: String,
        /// The policy.
        config: PolicyConfig,
    },
    /// One buffer per allocation, sized to the request rounded up to 4 bytes: the policy's
    /// naive mode ([`PolicyConfig::naive`]).
    Naive,
    /// The pool with this policy, compacting within `limits` before it grows.
    PoolCompact {
        /// The name to report.
        name: String,
        /// The policy.
        config: PolicyConfig,
        /// How much one compaction may move.
        limits: CompactionLimits,
    },
}

impl Strategy {
    /// The strategies compared by default for a device: `pool`, `pool_compact` (the same policy,
    /// compacting with [`CompactionLimits::default`]), `pool_pow2`, `naive`.
    pub fn defaults(profile: &LimitsProfile) -> Vec<Self> {
        let pool = profile.policy();
        let pow2 = PolicyConfig {
            rounding: Rounding::PowerOfTwo,
            ..pool.clone()
        };
        vec![
            Self::Pool {
                name: "pool".into(),
                config: pool.clone(),
            },
            Self::PoolCompact {
                name: "pool_compact".into(),
                config: pool,
                limits: CompactionLimits::default(),
            },
            Self::Pool {
                name: "pool_pow2".into(),
                config: pow2,
            },
            Self::Naive,
        ]
    }

    /// The policy replayed for a device with `profile`'s limits: the pool's own, or for `Naive`
    /// [`PolicyConfig::naive`] (buffers sized in multiples of [`NAIVE_ALIGNMENT_BYTES`]).
    pub fn config(&self, profile: &LimitsProfile) -> PolicyConfig {
        match self {
            Self::Pool { config, .. } | Self::PoolCompact { config, .. } => config.clone(),
            Self::Naive => PolicyConfig::naive(NAIVE_ALIGNMENT_BYTES, profile.max_buffer_size),
        }
    }

    /// The compaction limits, for a strategy that compacts.
    pub fn compaction(&self) -> Option<CompactionLimits> {
        match self {
            Self::PoolCompact { limits, .. } => Some(*limits),
            _ => None,
        }
    }

    /// The name reported.
    pub fn name(&self) -> &str {
        match self {
            Self::Pool { name, .. } | Self::PoolCompact { name, .. } => name,
            Self::Naive => "naive",
        }
    }
}

/// What one strategy did with the trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StrategyOutcome {
    /// The strategy's name.
    pub name: String,
    /// The most bytes reserved at once.
    pub peak_reserved_bytes: u64,
    /// `1 - requested / allocated` at the moment requested bytes peaked.
    pub internal_fragmentation: f64,
    /// `1 - largest_free / free` at the moment requested bytes peaked.
    pub external_fragmentation: f64,
    /// Segments (buffers) created over the whole trace.
    pub segments_created: u64,
    /// Bytes of all the segments created over the trace: on a GPU, what the driver allocated and
    /// wgpu zero-filled, however briefly it was held.
    pub bytes_created: u64,
    /// Index in the event list of the first allocation that failed, if any.
    pub oom_at_event: Option<usize>,
    /// Why that allocation failed.
    pub oom_reason: Option<String>,
    /// Allocations that failed.
    pub failed_allocations: u64,
    /// Requests that would have grown the pool and for which a compaction plan was sought (0 for
    /// a strategy that does not compact).
    pub compaction_attempts: u64,
    /// Compaction plans applied.
    pub compactions: u64,
    /// Allocations moved by them.
    pub moves: u64,
    /// Bytes moved by them (allocated sizes: what the copies would cover).
    pub moved_bytes: u64,
    /// Reserved bytes over the trace as `(event index, bytes)`, at most [`TIMELINE_POINTS`]
    /// points (the maximum of each stretch of events), for plots.
    #[serde(skip)]
    pub reserved_timeline: Vec<(usize, u64)>,
}

impl StrategyOutcome {
    fn empty(name: &str) -> Self {
        Self {
            name: name.to_string(),
            peak_reserved_bytes: 0,
            internal_fragmentation: 0.0,
            external_fragmentation: 0.0,
            segments_created: 0,
            bytes_created: 0,
            oom_at_event: None,
            oom_reason: None,
            failed_allocations: 0,
            compaction_attempts: 0,
            compactions: 0,
            moves: 0,
            moved_bytes: 0,
            reserved_timeline: Vec::new(),
        }
    }
}

/// Points of a timeline: `(event index, bytes)`.
pub type TimelinePoints = Vec<(usize, u64)>;

/// The most points kept in a timeline.
pub const TIMELINE_POINTS: usize = 2000;

/// Keeps the maximum of each stretch of `stride` events.
#[derive(Debug)]
struct Timeline {
    stride: usize,
    points: Vec<(usize, u64)>,
}

impl Timeline {
    fn new(events: usize) -> Self {
        Self {
            stride: events.div_ceil(TIMELINE_POINTS).max(1),
            points: Vec::new(),
        }
    }

    fn record(&mut self, index: usize, value: u64) {
        let bucket = index / self.stride;
        match self.points.last_mut() {
            Some(last) if last.0 / self.stride == bucket => {
                if value >= last.1 {
                    *last = (index, value);
                }
            }
            _ => self.points.push((index, value)),
        }
    }
}

/// The comparison of all strategies on one trace (the replay example's JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// The trace's name (its file name).
    pub trace: String,
    /// The limits profile used.
    pub limits: LimitsProfile,
    /// The capacity of the simulated device, if one was given, in bytes.
    pub capacity_bytes: Option<u64>,
    /// Alloc and free events replayed.
    pub events: usize,
    /// The peak of live requested bytes.
    pub peak_requested_bytes: u64,
    /// The peak of PyTorch's reserved bytes (`segment_alloc` minus `segment_free`), when the trace
    /// has segment events.
    pub pytorch_peak_reserved_bytes: Option<u64>,
    /// Segments PyTorch created over the trace (`segment_alloc` and `segment_map` events), when
    /// the trace has segment events.
    pub pytorch_segments_created: Option<u64>,
    /// Bytes of the segments PyTorch created over the trace, when it has segment events.
    pub pytorch_bytes_created: Option<u64>,
    /// A reference, not a strategy: the peak of one address space that grows and shrinks at its
    /// top, best fit over coalesced free ranges, requests rounded to the pool's smallest block (a
    /// `malloc`'s placement, which no wgpu pool can run: a buffer cannot grow in place). What the
    /// order and sizes of the requests cost with one segment that never needs re-creating.
    /// Requests above the device's largest buffer are skipped (every strategy refuses them); a
    /// capacity does not bound it.
    pub best_fit_heap_peak_bytes: u64,
    /// One outcome per strategy.
    pub strategies: Vec<StrategyOutcome>,
    /// What `pool_compact` moved and saved against `pool`, when both were replayed.
    pub compaction: Option<CompactionSavings>,
    /// Live requested bytes over the trace, sampled like the strategies' timelines.
    #[serde(skip)]
    pub requested_timeline: Vec<(usize, u64)>,
    /// PyTorch's reserved bytes over the trace, sampled likewise (empty without segment events).
    #[serde(skip)]
    pub pytorch_reserved_timeline: Vec<(usize, u64)>,
}

/// What compaction cost and saved on one trace: `pool_compact` against `pool`. Savings are
/// `pool`'s figure minus `pool_compact`'s (negative when compaction cost more).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CompactionSavings {
    /// Compaction plans applied.
    pub compactions: u64,
    /// Allocations moved.
    pub moves: u64,
    /// Bytes moved.
    pub moved_bytes: u64,
    /// Peak reserved bytes saved.
    pub peak_reserved_saved_bytes: i64,
    /// Segments created saved.
    pub segments_created_saved: i64,
    /// Bytes of segments created saved.
    pub bytes_created_saved: i64,
    /// Failed allocations saved (under a capacity).
    pub failed_allocations_saved: i64,
}

impl CompactionSavings {
    /// `compacted` against `baseline`.
    pub fn of(compacted: &StrategyOutcome, baseline: &StrategyOutcome) -> Self {
        let saved = |base: u64, with: u64| base as i64 - with as i64;
        Self {
            compactions: compacted.compactions,
            moves: compacted.moves,
            moved_bytes: compacted.moved_bytes,
            peak_reserved_saved_bytes: saved(
                baseline.peak_reserved_bytes,
                compacted.peak_reserved_bytes,
            ),
            segments_created_saved: saved(baseline.segments_created, compacted.segments_created),
            bytes_created_saved: saved(baseline.bytes_created, compacted.bytes_created),
            failed_allocations_saved: saved(
                baseline.failed_allocations,
                compacted.failed_allocations,
            ),
        }
    }
}

impl ReplayReport {
    /// The outcome of the strategy called `name`.
    pub fn strategy(&self, name: &str) -> Option<&StrategyOutcome> {
        self.strategies.iter().find(|s| s.name == name)
    }
}

/// Peak live requested bytes, the index of the event where it is first reached, and the peak of
/// reserved bytes from segment events (`None` without any).
pub fn trace_peaks(events: &[ReplayEvent]) -> (u64, usize, Option<u64>) {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut requested, mut peak_requested, mut peak_at) = (0u128, 0u128, 0usize);
    let (mut reserved, mut peak_reserved, mut any_segment) = (0i128, 0i128, false);
    for (index, event) in events.iter().enumerate() {
        match *event {
            ReplayEvent::Alloc { addr, size } => {
                if let Some(previous) = live.insert(addr, size) {
                    requested -= u128::from(previous);
                }
                requested += u128::from(size);
                if requested > peak_requested {
                    peak_requested = requested;
                    peak_at = index;
                }
            }
            ReplayEvent::Free { addr } => {
                requested -= u128::from(live.remove(&addr).unwrap_or(0));
            }
            ReplayEvent::SegmentAlloc { size } => {
                any_segment = true;
                reserved += i128::from(size);
                peak_reserved = peak_reserved.max(reserved);
            }
            ReplayEvent::SegmentFree { size } => reserved -= i128::from(size),
        }
    }
    (
        saturated(peak_requested),
        peak_at,
        any_segment.then_some(saturated(peak_reserved.max(0) as u128)),
    )
}

/// The segments a trace's allocator created and their bytes (`None` without segment events).
pub fn trace_segments_created(events: &[ReplayEvent]) -> Option<(u64, u64)> {
    let created = events.iter().filter_map(|event| match *event {
        ReplayEvent::SegmentAlloc { size } => Some(size),
        _ => None,
    });
    let (segments, bytes) = created.fold((0u64, 0u64), |(count, total), size| {
        (count + 1, total.saturating_add(size))
    });
    (segments > 0).then_some((segments, bytes))
}

/// Replays `events` through every strategy. `progress` is called with the number of events done
/// (of `events.len() * strategies.len()`), every few thousand events.
pub fn replay(
    trace: &str,
    events: &[ReplayEvent],
    profile: LimitsProfile,
    capacity_bytes: Option<u64>,
    strategies: &[Strategy],
    progress: &mut dyn FnMut(usize),
) -> ReplayReport {
    let (peak_requested_bytes, peak_at, pytorch_peak_reserved_bytes) = trace_peaks(events);
    let pytorch_created = trace_segments_created(events);
    let (requested_timeline, pytorch_reserved_timeline) = trace_timelines(events);
    let outcomes = strategies
        .iter()
        .enumerate()
        .map(|(i, strategy)| {
            let mut local = |done: usize| progress(i * events.len() + done);
            // One code path for every strategy: the naive one is the policy's naive mode.
            replay_pool(
                strategy.name(),
                strategy.config(&profile),
                strategy.compaction(),
                events,
                peak_at,
                capacity_bytes,
                &mut local,
            )
        })
        .collect::<Vec<StrategyOutcome>>();
    let compaction = match (
        outcomes.iter().find(|s| s.name == "pool_compact"),
        outcomes.iter().find(|s| s.name == "pool"),
    ) {
        (Some(compacted), Some(baseline)) => Some(CompactionSavings::of(compacted, baseline)),
        _ => None,
    };
    ReplayReport {
        trace: trace.to_string(),
        limits: profile,
        capacity_bytes,
        events: events
            .iter()
            .filter(|e| matches!(e, ReplayEvent::Alloc { .. } | ReplayEvent::Free { .. }))
            .count(),
        peak_requested_bytes,
        pytorch_peak_reserved_bytes,
        pytorch_segments_created: pytorch_created.map(|(segments, _)| segments),
        pytorch_bytes_created: pytorch_created.map(|(_, bytes)| bytes),
        best_fit_heap_peak_bytes: {
            let policy = profile.policy();
            heap::best_fit_heap_peak(events, policy.min_block_bytes, policy.max_allocation_bytes)
        },
        strategies: outcomes,
        compaction,
        requested_timeline,
        pytorch_reserved_timeline: if pytorch_peak_reserved_bytes.is_some() {
            pytorch_reserved_timeline
        } else {
            Vec::new()
        },
    }
}

/// Live requested bytes and PyTorch's reserved bytes over the trace, sampled for plots.
fn trace_timelines(events: &[ReplayEvent]) -> (TimelinePoints, TimelinePoints) {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut requested, mut reserved) = (0u128, 0i128);
    let (mut requested_line, mut reserved_line) =
        (Timeline::new(events.len()), Timeline::new(events.len()));
    for (index, event) in events.iter().enumerate() {
        match *event {
            ReplayEvent::Alloc { addr, size } => {
                requested -= u128::from(live.insert(addr, size).unwrap_or(0));
                requested += u128::from(size);
            }
            ReplayEvent::Free { addr } => {
                requested -= u128::from(live.remove(&addr).unwrap_or(0));
            }
            ReplayEvent::SegmentAlloc { size } => reserved += i128::from(size),
            ReplayEvent::SegmentFree { size } => reserved -= i128::from(size),
        }
        requested_line.record(index, saturated(requested));
        reserved_line.record(index, saturated(reserved.max(0) as u128));
    }
    (requested_line.points, reserved_line.points)
}

/// `bytes`, or `u64::MAX` when a trace's sums pass it (sizes come unchecked from the file).
fn saturated(bytes: u128) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

const PROGRESS_EVERY: usize = 4096;

fn replay_pool(
    name: &str,
    config: PolicyConfig,
    compaction: Option<CompactionLimits>,
    events: &[ReplayEvent],
    peak_at: usize,
    capacity_bytes: Option<u64>,
    progress: &mut dyn FnMut(usize),
) -> StrategyOutcome {
    let mut outcome = StrategyOutcome::empty(name);
    let mut timeline = Timeline::new(events.len());
    let mut pool = match PoolCore::new(config, SimulatedStorage::new(capacity_bytes)) {
        Ok(pool) => pool,
        Err(error) => {
            outcome.oom_reason = Some(error.to_string());
            return outcome;
        }
    };
    let mut live = HashMap::new();
    for (index, event) in events.iter().enumerate() {
        match *event {
            ReplayEvent::Alloc { addr, size } => {
                match allocate(&mut pool, size, compaction, &mut live, &mut outcome) {
                    Ok(placement) => {
                        if let Some(previous) = live.insert(addr, placement) {
                            pool.free(previous);
                        }
                    }
                    Err(error) => record_failure(&mut outcome, index, &error),
                }
            }
            ReplayEvent::Free { addr } => {
                if let Some(placement) = live.remove(&addr) {
                    pool.free(placement);
                }
            }
            ReplayEvent::SegmentAlloc { .. } | ReplayEvent::SegmentFree { .. } => {}
        }
        if index == peak_at {
            let stats = pool.stats();
            outcome.internal_fragmentation = stats.internal_fragmentation();
            outcome.external_fragmentation = stats.external_fragmentation();
        }
        // The counters alone: O(1), where `stats()` would scan the segments at every event.
        timeline.record(index, pool.counters().reserved_bytes.current);
        if index % PROGRESS_EVERY == 0 {
            progress(index);
        }
    }
    progress(events.len());
    outcome.reserved_timeline = timeline.points;
    let stats = pool.stats();
    outcome.peak_reserved_bytes = stats.reserved_bytes.peak;
    outcome.segments_created = stats.create_segment_calls;
    // The reserved counter's running total is the sum of every segment created.
    outcome.bytes_created = stats.reserved_bytes.total;
    outcome
}

/// Allocates `size`; with `compaction`, when the request would grow the pool, first applies a
/// compaction plan to the live placements.
fn allocate(
    pool: &mut PoolCore<SimulatedStorage>,
    size: u64,
    compaction: Option<CompactionLimits>,
    live: &mut HashMap<u64, Placement>,
    outcome: &mut StrategyOutcome,
) -> Result<Placement, PolicyError> {
    let Some(limits) = compaction else {
        return pool.allocate(size);
    };
    if let Some(placement) = pool.allocate_existing(size) {
        return Ok(placement);
    }
    outcome.compaction_attempts += 1;
    if let Some(plan) = pool.compaction_plan(size, limits) {
        let moves = plan.moves().len() as u64;
        let moved = pool
            .apply_moves(plan, live.values_mut())
            .expect("the replay gives every live placement");
        outcome.compactions += u64::from(moves > 0);
        outcome.moves += moves;
        outcome.moved_bytes += moved;
    }
    pool.allocate(size)
}

fn record_failure(outcome: &mut StrategyOutcome, index: usize, error: &PolicyError) {
    outcome.failed_allocations += 1;
    if outcome.oom_at_event.is_none() {
        outcome.oom_at_event = Some(index);
        outcome.oom_reason = Some(error.to_string());
    }
}

mod heap;
#[cfg(test)]
mod tests;
