//! The structural invariants PyTorch's `snapshot()` guarantees, as a checker.
//!
//! PyTorch builds each segment by walking its block list from the head block, so blocks
//! tile the segment by construction, and it sums `total_size`, `allocated_size`
//! (allocated blocks), `active_size` and `requested_size` (allocated or pending-free
//! blocks) in the same walk (`c10/cuda/CUDACachingAllocator.cpp`, `snapshot()`).

use std::fmt;

use super::{BlockState, Segment, Snapshot, TraceAction};

/// One broken invariant; indices point into [`Snapshot::segments`], `blocks` and
/// [`Snapshot::device_traces`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A segment has no blocks.
    NoBlocks {
        /// Index of the segment.
        segment_index: usize,
    },
    /// A block does not start where the previous one ended (a gap if `found_address` is
    /// greater than `expected_address`, an overlap or disorder if smaller).
    BlockNotContiguous {
        /// Index of the segment.
        segment_index: usize,
        /// Index of the block within the segment.
        block_index: usize,
        /// Where the block should start: the segment's address plus the sizes of the
        /// blocks before it.
        expected_address: u64,
        /// Where it starts.
        found_address: u64,
    },
    /// The block sizes do not add up to the segment's `total_size`.
    BlockSizesMismatch {
        /// Index of the segment.
        segment_index: usize,
        /// Sum of the block sizes, in bytes.
        blocks_bytes: u128,
        /// The segment's `total_size`, in bytes.
        total_size_bytes: u64,
    },
    /// `allocated_size` differs from the sum of the `active_allocated` block sizes.
    AllocatedSizeMismatch {
        /// Index of the segment.
        segment_index: usize,
        /// The segment's `allocated_size`, in bytes.
        recorded_bytes: u64,
        /// What the blocks add up to, in bytes.
        computed_bytes: u128,
    },
    /// `active_size` differs from the sum of the active (allocated or pending-free)
    /// block sizes.
    ActiveSizeMismatch {
        /// Index of the segment.
        segment_index: usize,
        /// The segment's `active_size`, in bytes.
        recorded_bytes: u64,
        /// What the blocks add up to, in bytes.
        computed_bytes: u128,
    },
    /// `requested_size` differs from the sum of the active blocks' `requested_size`.
    RequestedSizeMismatch {
        /// Index of the segment.
        segment_index: usize,
        /// The segment's `requested_size`, in bytes.
        recorded_bytes: u64,
        /// What the blocks add up to, in bytes.
        computed_bytes: u128,
    },
    /// Two segments of one device overlap.
    SegmentsOverlap {
        /// Index of the segment that starts first.
        first_index: usize,
        /// Index of the segment that starts inside it.
        second_index: usize,
    },
    /// `segment_type` is neither `"small"` nor `"large"`.
    UnknownSegmentType {
        /// Index of the segment.
        segment_index: usize,
        /// The type as written.
        segment_type: String,
    },
    /// A block's state is not one PyTorch defines.
    UnknownBlockState {
        /// Index of the segment.
        segment_index: usize,
        /// Index of the block within the segment.
        block_index: usize,
        /// The state as written.
        state: String,
    },
    /// A trace entry's action is not one this crate knows.
    UnknownAction {
        /// Index into [`Snapshot::device_traces`].
        device_index: usize,
        /// Index of the entry within that trace.
        event_index: usize,
        /// The action as written.
        action: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NoBlocks { segment_index } => write!(f, "segment {segment_index} has no blocks"),
            Violation::BlockNotContiguous { segment_index, block_index, expected_address, found_address } => {
                let what = if found_address > expected_address { "leaves a gap" } else { "overlaps" };
                write!(
                    f,
                    "segment {segment_index} block {block_index} starts at {found_address:#x}, \
                     expected {expected_address:#x}: it {what}"
                )
            }
            Violation::BlockSizesMismatch { segment_index, blocks_bytes, total_size_bytes } => write!(
                f,
                "segment {segment_index}: blocks add up to {blocks_bytes} bytes, total_size is {total_size_bytes}"
            ),
            Violation::AllocatedSizeMismatch { segment_index, recorded_bytes, computed_bytes } => write!(
                f,
                "segment {segment_index}: allocated_size is {recorded_bytes} bytes, its active_allocated \
                 blocks add up to {computed_bytes}"
            ),
            Violation::ActiveSizeMismatch { segment_index, recorded_bytes, computed_bytes } => write!(
                f,
                "segment {segment_index}: active_size is {recorded_bytes} bytes, its active blocks add up \
                 to {computed_bytes}"
            ),
            Violation::RequestedSizeMismatch { segment_index, recorded_bytes, computed_bytes } => write!(
                f,
                "segment {segment_index}: requested_size is {recorded_bytes} bytes, its active blocks \
                 requested {computed_bytes}"
            ),
            Violation::SegmentsOverlap { first_index, second_index } => {
                write!(f, "segments {first_index} and {second_index} overlap")
            }
            Violation::UnknownSegmentType { segment_index, segment_type } => {
                write!(f, "segment {segment_index} has unknown segment_type {segment_type:?}")
            }
            Violation::UnknownBlockState { segment_index, block_index, state } => {
                write!(f, "segment {segment_index} block {block_index} has unknown state {state:?}")
            }
            Violation::UnknownAction { device_index, event_index, action } => {
                write!(f, "device {device_index} event {event_index} has unknown action {action:?}")
            }
        }
    }
}

/// Every invariant [`Snapshot::check_invariants`] found broken, in snapshot order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} snapshot invariant violation(s), the first: {}",
    violations.len(),
    violations.first().map(ToString::to_string).unwrap_or_default()
)]
pub struct InvariantError {
    /// The violations, never empty.
    pub violations: Vec<Violation>,
}

/// Every broken invariant of `snapshot`, in snapshot order: each segment's, then the overlaps
/// of segments, then the unknown actions of the traces.
pub(crate) fn check(snapshot: &Snapshot) -> Result<(), InvariantError> {
    let mut violations = Vec::new();
    for (segment_index, segment) in snapshot.segments.iter().enumerate() {
        check_segment(segment_index, segment, &mut violations);
    }
    check_overlaps(&snapshot.segments, &mut violations);
    for (device_index, trace) in snapshot.device_traces.iter().enumerate() {
        for (event_index, event) in trace.iter().enumerate() {
            if let TraceAction::Other(action) = &event.action {
                violations.push(Violation::UnknownAction {
                    device_index,
                    event_index,
                    action: action.clone(),
                });
            }
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(InvariantError { violations })
    }
}

/// The bytes of a segment's blocks, summed by state as PyTorch sums them.
#[derive(Default)]
struct BlockSums {
    /// The sizes of the `active_allocated` blocks, in bytes.
    allocated_bytes: u128,
    /// The sizes of the active (allocated or pending-free) blocks, in bytes.
    active_bytes: u128,
    /// The `requested_size` of the active blocks, in bytes.
    requested_bytes: u128,
}

/// The invariants of one segment: a known type, blocks that tile it in known states, and sizes
/// that add up.
fn check_segment(segment_index: usize, segment: &Segment, violations: &mut Vec<Violation>) {
    if !matches!(segment.segment_type.as_str(), "small" | "large") {
        violations.push(Violation::UnknownSegmentType {
            segment_index,
            segment_type: segment.segment_type.clone(),
        });
    }
    if segment.blocks.is_empty() {
        violations.push(Violation::NoBlocks { segment_index });
    }
    let sums = check_blocks(segment_index, segment, violations);
    let blocks_bytes: u128 = segment
        .blocks
        .iter()
        .map(|block| u128::from(block.size))
        .sum();
    if blocks_bytes != u128::from(segment.total_size) {
        violations.push(Violation::BlockSizesMismatch {
            segment_index,
            blocks_bytes,
            total_size_bytes: segment.total_size,
        });
    }
    if sums.allocated_bytes != u128::from(segment.allocated_size) {
        violations.push(Violation::AllocatedSizeMismatch {
            segment_index,
            recorded_bytes: segment.allocated_size,
            computed_bytes: sums.allocated_bytes,
        });
    }
    if sums.active_bytes != u128::from(segment.active_size) {
        violations.push(Violation::ActiveSizeMismatch {
            segment_index,
            recorded_bytes: segment.active_size,
            computed_bytes: sums.active_bytes,
        });
    }
    if sums.requested_bytes != u128::from(segment.requested_size) {
        violations.push(Violation::RequestedSizeMismatch {
            segment_index,
            recorded_bytes: segment.requested_size,
            computed_bytes: sums.requested_bytes,
        });
    }
}

/// The blocks of one segment, in order: each starts where the one before ended and has a known
/// state. Returns their sums.
fn check_blocks(
    segment_index: usize,
    segment: &Segment,
    violations: &mut Vec<Violation>,
) -> BlockSums {
    let mut expected_address = u128::from(segment.address);
    let mut sums = BlockSums::default();
    for (block_index, block) in segment.blocks.iter().enumerate() {
        if u128::from(block.address) != expected_address {
            violations.push(Violation::BlockNotContiguous {
                segment_index,
                block_index,
                expected_address: u64::try_from(expected_address).unwrap_or(u64::MAX),
                found_address: block.address,
            });
        }
        expected_address = u128::from(block.address) + u128::from(block.size);
        if let BlockState::Other(state) = &block.state {
            violations.push(Violation::UnknownBlockState {
                segment_index,
                block_index,
                state: state.clone(),
            });
        }
        if block.state == BlockState::ActiveAllocated {
            sums.allocated_bytes += u128::from(block.size);
        }
        if block.state.is_active() {
            sums.active_bytes += u128::from(block.size);
            sums.requested_bytes += u128::from(block.requested_size);
        }
    }
    sums
}

/// The segments of one device that overlap. Sorted by (device, address), a segment overlaps an
/// earlier one exactly when it starts before the furthest end seen so far on its device.
fn check_overlaps(segments: &[Segment], violations: &mut Vec<Violation>) {
    let mut by_address: Vec<usize> = (0..segments.len()).collect();
    by_address.sort_by_key(|&index| (segments[index].device, segments[index].address));
    let mut furthest: Option<(i64, u128, usize)> = None;
    for &index in &by_address {
        let segment = &segments[index];
        let end = u128::from(segment.address) + u128::from(segment.total_size);
        match furthest {
            Some((device, furthest_end, first_index)) if device == segment.device => {
                if u128::from(segment.address) < furthest_end {
                    violations.push(Violation::SegmentsOverlap {
                        first_index,
                        second_index: index,
                    });
                }
                if end > furthest_end {
                    furthest = Some((device, end, index));
                }
            }
            _ => furthest = Some((segment.device, end, index)),
        }
    }
}
