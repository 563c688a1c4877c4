//! Why the policy refused a request, with the figures that explain it (the out-of-memory message
//! in the manner of PyTorch's), and why a compaction plan was refused.

use std::fmt;

use crate::buddy;

use super::moves::CompactionEstimate;
use super::segment::SegmentId;

/// Why the policy refused a request. Each variant carries the figures that explain it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A request of zero bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A request larger than any buffer the device can create.
    #[error("request of {requested_bytes} bytes exceeds the largest buffer this device can create ({max_allocation_bytes} bytes)")]
    TooLarge {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's largest buffer, in bytes.
        max_allocation_bytes: u64,
    },
    /// Out of memory: the budget or the device refused the memory the request needs.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// The configuration is not valid.
    #[error("invalid pool configuration: {0}")]
    Config(#[from] buddy::ConfigError),
    /// A setting breaks a rule its documentation states (segment sizes, the fill rule).
    #[error("invalid pool configuration: {0}")]
    Setting(String),
}

/// The figures of an out-of-memory refusal, in the manner of PyTorch's OOM message.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    /// The size asked for, in bytes.
    pub requested_bytes: u64,
    /// The segment the pool tried to create, in bytes.
    pub segment_bytes: u64,
    /// Reserved by the pool when it failed, in bytes.
    pub reserved_bytes: u64,
    /// Allocated (rounded) by live allocations, in bytes.
    pub allocated_bytes: u64,
    /// The largest free block in any segment, in bytes.
    pub largest_free_bytes: u64,
    /// External fragmentation of the free memory in segments (`1 - largest_free / free`).
    pub external_fragmentation: f64,
    /// The budget, if one is set, in bytes.
    pub budget_bytes: Option<u64>,
    /// What the storage said, when it was the device that refused.
    pub device_error: Option<String>,
    /// Bytes of empty segments given back while trying (0 when the budget refused: a refusal the
    /// empty segments could not have avoided gives nothing back). Already out of
    /// `reserved_bytes`.
    pub released_bytes: u64,
    /// Free bytes in all segments when it failed.
    pub free_bytes: u64,
    /// When moving live allocations within [`CompactionLimits::default`](super::CompactionLimits::default) would have made room for
    /// the request in the segments held (see `PoolCore::compaction_estimate`): what it would
    /// move. `None` when it would not, or for a request compaction cannot serve (the naive mode's).
    pub compaction: Option<CompactionEstimate>,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "out of memory: tried to allocate {:.2} MiB (a new segment of {:.2} MiB); the pool has {:.2} MiB reserved, \
             of which {:.2} MiB allocated and {:.2} MiB reserved but unallocated; the largest free block is {:.2} MiB \
             (external fragmentation {:.1}%)",
            mib(self.requested_bytes),
            mib(self.segment_bytes),
            mib(self.reserved_bytes),
            mib(self.allocated_bytes),
            mib(self.reserved_bytes - self.allocated_bytes.min(self.reserved_bytes)),
            mib(self.largest_free_bytes),
            self.external_fragmentation * 100.0
        )?;
        match (self.budget_bytes, &self.device_error) {
            (_, Some(device)) => write!(f, "; the device refused: {device}")?,
            (Some(budget), None) => write!(f, "; the budget is {:.2} MiB", mib(budget))?,
            (None, None) => {}
        }
        if self.released_bytes > 0 {
            write!(
                f,
                "; the pool gave back {:.2} MiB of empty segments while trying",
                mib(self.released_bytes)
            )?;
        }
        if self.free_bytes > 0 {
            write!(
                f,
                "; free space in segments totals {:.2} MiB, the largest block {:.2} MiB",
                mib(self.free_bytes),
                mib(self.largest_free_bytes)
            )?;
            if let Some(compaction) = &self.compaction {
                write!(
                    f,
                    "; compacting (moving {:.2} MiB in {} allocation{} out of a block of {:.2} MiB in segment {}) would make it fit",
                    mib(compaction.moved_bytes),
                    compaction.moves,
                    if compaction.moves == 1 { "" } else { "s" },
                    mib(compaction.window_bytes),
                    compaction.segment.0
                )?;
            }
        }
        write!(f, ". Try: ")?;
        if self.compaction.is_some() {
            write!(
                f,
                "compact (a compute context's compact_for moves its tensors; ContextOptions::compact_on_oom does it \
                 before an allocation fails), "
            )?;
        }
        write!(
            f,
            "free or drop allocations you no longer need, call trim() to give back empty segments, \
             raise the budget, or split the work into smaller requests"
        )
    }
}

/// Why `PoolCore::apply_moves` refused a plan. The plan is cancelled: nothing moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompactionError {
    /// The placements given did not include an allocation the plan moves.
    #[error("the placement at offset {offset} of segment {segment:?}, which the plan moves, was not given")]
    MissingPlacement {
        /// Its segment.
        segment: SegmentId,
        /// Its offset, in bytes.
        offset: u64,
    },
}
