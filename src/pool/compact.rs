//! Compaction on the GPU: the policy's plans (`crate::policy::PoolCore::compaction_plan_where`,
//! `crate::policy::PoolCore::evacuation_plan`) carried out over the allocations a caller hands
//! in — the only ones that may move, since their handles are re-pointed here. Each plan's copies
//! are recorded into one command encoder (`copy_buffer_to_buffer`: a plan's destinations are never
//! in its sources' segment, so never in their buffer) and submitted on the queue, under the pool's
//! lock; only then does the policy free the sources, so every later use of a source range is
//! ordered after the copies on the one queue (the pool's ordered-reuse rule). Work recorded but
//! not yet submitted that binds a moved allocation must not exist: the caller submits it first
//! (the compute context flushes its batch).

use std::collections::{HashMap, HashSet};

use super::allocation::Allocation;
use super::live::{allocation_event, record_segment_events, LiveSlab};
use super::options::PoolError;
use super::shared::{Shared, State};
use crate::history::{EventKind, History};
use crate::policy::{CompactionEstimate, CompactionLimits, CompactionPlan, SegmentId};

/// What a compaction did ([`super::Pool::compact_for`], [`super::Pool::compact_segments`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Allocations moved.
    pub moves: usize,
    /// Bytes copied (the moved allocations' sizes after rounding).
    pub moved_bytes: u64,
    /// Segments emptied and given back to the device.
    pub segments_released: usize,
    /// Their bytes.
    pub released_bytes: u64,
    /// Submissions of copies (one per plan carried out).
    pub submissions: usize,
}

/// The allocations of `shared`'s pool among `allocations`, by `(segment, offset)`: what may move.
fn movable_index(
    shared: &Shared,
    allocations: &[&mut Allocation],
) -> HashMap<(SegmentId, u64), usize> {
    allocations
        .iter()
        .enumerate()
        .filter(|(_, allocation)| allocation.is_of(shared))
        .map(|(index, allocation)| ((allocation.segment(), allocation.offset()), index))
        .collect()
}

/// Moves allocations among `allocations` so that a request of `size_bytes` fits in the segments
/// held (the policy's plan within `limits`, limited to them). Nothing moves when the request
/// already fits, or no plan over them makes room.
pub(super) fn compact_for(
    shared: &Shared,
    size_bytes: u64,
    allocations: &mut [&mut Allocation],
    limits: CompactionLimits,
) -> Result<Compaction, PoolError> {
    let mut guard = shared.lock();
    let index = movable_index(shared, allocations);
    let plan = guard
        .core
        .compaction_plan_where(size_bytes, limits, |segment, offset| {
            index.contains_key(&(segment, offset))
        });
    let mut outcome = Compaction::default();
    if let Some(plan) = plan {
        carry_out(shared, &mut guard, plan, &index, allocations, &mut outcome)?;
    }
    Ok(outcome)
}

/// Empties packed segments and segments of free ranges by moving their allocations (all among
/// `allocations`, at most `limits.max_moves` per segment) into the free space of the others of
/// their kind, least occupied segment first, and gives each emptied segment back; until no
/// further segment can be emptied.
pub(super) fn compact_segments(
    shared: &Shared,
    allocations: &mut [&mut Allocation],
    limits: CompactionLimits,
) -> Result<Compaction, PoolError> {
    let mut guard = shared.lock();
    let mut outcome = Compaction::default();
    // Each round empties a segment that held allocations and gives it back: the rounds end.
    loop {
        let index = movable_index(shared, allocations);
        let mut candidates: Vec<(u64, SegmentId)> = guard
            .core
            .segments()
            .filter(|segment| !segment.is_dedicated() && !segment.is_empty())
            .map(|segment| (guard.core.live_bytes(segment.id), segment.id))
            .collect();
        candidates.sort_unstable();
        let mut emptied = None;
        for (_, id) in candidates {
            let plan = guard.core.evacuation_plan(id, limits, |segment, offset| {
                index.contains_key(&(segment, offset))
            });
            match plan {
                Some(plan) if plan.moves().is_empty() => guard.core.cancel_compaction(plan),
                Some(plan) => {
                    carry_out(shared, &mut guard, plan, &index, allocations, &mut outcome)?;
                    emptied = Some(id);
                    break;
                }
                None => {}
            }
        }
        let Some(id) = emptied else {
            break;
        };
        let released = guard.core.release_if_empty(id);
        if released > 0 {
            outcome.segments_released += 1;
            outcome.released_bytes += released;
        }
        let state = &mut *guard;
        let events = state.core.take_events();
        if let Some(history) = &mut state.history {
            record_segment_events(history, events, shared.now_us());
        }
    }
    Ok(outcome)
}

/// What [`compact_for`] would move, without moving anything.
pub(super) fn estimate(
    shared: &Shared,
    size_bytes: u64,
    allocations: &[&Allocation],
) -> Option<CompactionEstimate> {
    let movable: HashMap<(SegmentId, u64), ()> = allocations
        .iter()
        .filter(|allocation| allocation.is_of(shared))
        .map(|allocation| ((allocation.segment(), allocation.offset()), ()))
        .collect();
    shared.lock().core.compaction_estimate_where(
        size_bytes,
        CompactionLimits::default(),
        |segment, offset| movable.contains_key(&(segment, offset)),
    )
}

/// Copies `plan`'s moves in one submission, then applies it (the sources are freed) and
/// re-points the moved handles.
fn carry_out(
    shared: &Shared,
    state: &mut State,
    plan: CompactionPlan,
    index: &HashMap<(SegmentId, u64), usize>,
    allocations: &mut [&mut Allocation],
    outcome: &mut Compaction,
) -> Result<(), PoolError> {
    let moves = plan.moves().to_vec();
    if moves.is_empty() {
        state.core.cancel_compaction(plan);
        return Ok(());
    }
    let buffer = |slot: usize| {
        state
            .core
            .segment(slot)
            .expect("a plan's segments are held")
            .memory
            .clone()
    };
    let mut encoder = shared
        .gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-pool compaction"),
        });
    let mut targets = Vec::with_capacity(moves.len());
    for m in &moves {
        let (from, to) = (buffer(m.from_slot), buffer(m.to_slot));
        debug_assert!(from != to, "a plan never moves within a segment");
        // Sizes and offsets are multiples of `min_block` (at least 256 bytes).
        encoder.copy_buffer_to_buffer(&from, m.from_offset, &to, m.to_offset, m.bytes);
        targets.push(to);
    }
    shared.gpu.queue.submit([encoder.finish()]);
    outcome.submissions += 1;
    // Only now are the sources freed: any later use of them is ordered after the copies.
    let State {
        core,
        live,
        history,
        ..
    } = state;
    // History speaks PyTorch's vocabulary, which has no move: a moved allocation is freed at its
    // old place and allocated at its new one, at the same time, with its label and op.
    let time_us = history.as_ref().map(|_| shared.now_us());
    let sources = moves.iter().map(|m| (m.from_segment, m.from_offset));
    let freed = [EventKind::FreeRequested, EventKind::FreeCompleted];
    record_at(history.as_mut(), time_us, live, sources, &freed);
    let moved = core.apply_moves(plan, live.iter_mut().map(|entry| &mut entry.placement))?;
    // The counters count a move as the history does: a free and an allocation.
    let arrived: HashSet<(SegmentId, u64)> =
        moves.iter().map(|m| (m.to_segment, m.to_offset)).collect();
    for entry in live
        .iter()
        .filter(|e| arrived.contains(&(e.placement.segment(), e.placement.offset())))
    {
        core.count_hand_over(&entry.placement);
    }
    let destinations = moves.iter().map(|m| (m.to_segment, m.to_offset));
    record_at(
        history.as_mut(),
        time_us,
        live,
        destinations,
        &[EventKind::Alloc],
    );
    for (m, to) in moves.iter().zip(targets) {
        if let Some(&handle) = index.get(&(m.from_segment, m.from_offset)) {
            allocations[handle].relocate(to, m.to_segment, m.to_offset);
        }
    }
    outcome.moves += moves.len();
    outcome.moved_bytes += moved;
    Ok(())
}

/// Records `kinds` (in order) for each live allocation at one of `places`, when history is on.
fn record_at(
    history: Option<&mut History>,
    time_us: Option<u64>,
    live: &LiveSlab,
    places: impl Iterator<Item = (SegmentId, u64)>,
    kinds: &[EventKind],
) {
    let (Some(history), Some(time_us)) = (history, time_us) else {
        return;
    };
    let places: HashSet<(SegmentId, u64)> = places.collect();
    for entry in live
        .iter()
        .filter(|e| places.contains(&(e.placement.segment(), e.placement.offset())))
    {
        for &kind in kinds {
            history.record(allocation_event(kind, time_us, entry));
        }
    }
}
