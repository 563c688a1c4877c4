//! What a pool and an allocation are asked to do, and why the pool refuses: [`PoolOptions`],
//! [`ReuseSafety`], [`AllocOptions`], [`PoolError`]. Plain data over the policy's types.

use crate::history::{History, HistoryOptions};
use crate::policy::{CompactionError, OutOfMemory, PolicyConfig, PolicyError};
use crate::snapshot::Snapshot;
use crate::state::{pytorch_snapshot, PoolState};

/// When a dropped allocation's range may be handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReuseSafety {
    /// After the next `Pool::submit` or `Pool::mark_submitted` (the default; see the pool
    /// module's documentation).
    #[default]
    AfterSubmission,
    /// At once. Unsafe for data (a recorded kernel may read a later upload); for measurements and
    /// for tests that show the hazard.
    Immediate,
}

/// How a pool behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOptions {
    /// The policy; `None` derives the default one from the device's limits. `Pool::naive` sets the
    /// naive mode here ([`PolicyConfig::naive`]).
    pub policy: Option<PolicyConfig>,
    /// When freed ranges become reusable.
    pub reuse: ReuseSafety,
    /// Clear freed ranges on the GPU before they are reused.
    pub zero_on_free: bool,
    /// A prefix for the labels of the buffers the pool creates.
    pub label: String,
    /// Record the allocation history from the start (`None`, the default: off; see
    /// `Pool::set_history` to switch it on later).
    pub history: Option<HistoryOptions>,
    /// Write a PyTorch memory snapshot (with the history, when it is on) to this file at the
    /// pool's first out-of-memory refusal: the moment `memory_viz` should show. As PyTorch users
    /// attach an out-of-memory observer that calls `_dump_snapshot`. `None` (the default): none.
    /// A snapshot that cannot be written is logged (`log::warn!`), never an error of the request.
    /// For every refusal, and anything else, see `Pool::set_oom_observer`.
    pub oom_snapshot: Option<std::path::PathBuf>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            policy: None,
            reuse: ReuseSafety::AfterSubmission,
            zero_on_free: false,
            label: "wgpu-pool".into(),
            history: None,
            oom_snapshot: None,
        }
    }
}

/// Options of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocOptions<'a> {
    /// A label for reports and history.
    pub label: &'a str,
    /// Clear the range on the GPU before handing it out.
    pub zeroed: bool,
    /// The allocation will be bound by kernels (the default): it must fit
    /// `max_storage_buffer_binding_size`. Set to `false` for copy-only allocations larger than that.
    pub bindable: bool,
}

impl Default for AllocOptions<'_> {
    fn default() -> Self {
        Self {
            label: "",
            zeroed: false,
            bindable: true,
        }
    }
}

impl<'a> AllocOptions<'a> {
    /// Default options with this label.
    pub fn labeled(label: &'a str) -> Self {
        Self {
            label,
            ..Self::default()
        }
    }
}

/// Why the pool refused a request or an operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A request of zero bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A bindable request larger than the device lets one binding be.
    #[error(
        "request of {requested_bytes} bytes exceeds max_storage_buffer_binding_size ({max_storage_buffer_binding_size} bytes): \
         no kernel could bind it. Split it, or ask for a copy-only allocation (AllocOptions {{ bindable: false, .. }})"
    )]
    ExceedsBindingLimit {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's `max_storage_buffer_binding_size`, in bytes.
        max_storage_buffer_binding_size: u64,
    },
    /// A request larger than any buffer the device can create.
    #[error(
        "request of {requested_bytes} bytes exceeds max_buffer_size ({max_buffer_size} bytes, rounded down to a multiple of 4)"
    )]
    ExceedsBufferLimit {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's `max_buffer_size` rounded down to a multiple of 4 (copies and clears move
        /// multiples of 4 bytes), in bytes.
        max_buffer_size: u64,
    },
    /// The budget or the device has no memory for the request.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// A write or read outside the allocation, or not aligned to 4 bytes (its offset, and its
    /// length unless it ends at the allocation's size).
    #[error("access of {len_bytes} bytes at offset {offset_bytes} does not fit an allocation of {size_bytes} bytes, or is not aligned to 4 bytes (the offset, and the length unless the access ends at the allocation's size)")]
    OutOfBounds {
        /// Offset in the allocation, in bytes.
        offset_bytes: u64,
        /// Length of the access, in bytes.
        len_bytes: u64,
        /// The allocation's size, in bytes.
        size_bytes: u64,
    },
    /// An allocation of another pool was passed to this one: no byte of either pool was touched
    /// (work passed with it to `Pool::submit_and_read` was submitted, nothing read).
    #[error(
        "the allocation {label:?} of {size_bytes} bytes belongs to another pool: write, read and free it through its own pool"
    )]
    ForeignAllocation {
        /// The allocation's label.
        label: String,
        /// The allocation's size, in bytes.
        size_bytes: u64,
    },
    /// A typed read or write of elements of `element_bytes` bytes, over an allocation that does
    /// not hold a whole number of them (or of zero-sized elements).
    #[error("an allocation of {size_bytes} bytes does not hold a whole number of {element_bytes}-byte elements")]
    ElementSize {
        /// The allocation's size, in bytes.
        size_bytes: u64,
        /// The size of one element, in bytes.
        element_bytes: u64,
    },
    /// The pool's configuration is not valid.
    #[error("invalid pool configuration: {0}")]
    Config(String),
    /// Reading back from the GPU failed.
    #[error("reading back from the GPU failed: {0}")]
    ReadBack(String),
    /// Parts given to [`Pool::label_parts`](super::Pool::label_parts) overlap, are empty or pass
    /// the allocation's end.
    #[error("invalid parts of an allocation of {size_bytes} bytes: {reason}")]
    InvalidParts {
        /// The allocation's size.
        size_bytes: u64,
        /// What is wrong.
        reason: String,
    },
    /// The device refused a buffer that a request needed (out of memory, or invalid), found by
    /// [`Pool::allocate_async`](super::Pool::allocate_async): the request was undone and the
    /// segment made for it given back; no other allocation was touched.
    #[error("the device refused a segment for a request of {requested_bytes} bytes: {reason}")]
    DeviceRefused {
        /// The size asked for, in bytes.
        requested_bytes: u64,
        /// The device's error, as text.
        reason: String,
    },
    /// The device reported errors outside any error scope since the last read (in a browser,
    /// where the crate keeps them: `Gpu::take_device_errors`): work it refused may have left
    /// its outputs unwritten, so the read is not handed out as a result.
    #[error("the device reported errors (results since may be wrong): {0}")]
    DeviceReported(String),
    /// The policy refused to apply a compaction plan (nothing moved).
    #[error("compaction refused: {0}")]
    Compaction(#[from] CompactionError),
}

impl From<PolicyError> for PoolError {
    fn from(error: PolicyError) -> Self {
        match error {
            PolicyError::ZeroSize => Self::ZeroSize,
            PolicyError::TooLarge {
                requested_bytes,
                max_allocation_bytes,
            } => Self::ExceedsBufferLimit {
                requested_bytes,
                max_buffer_size: max_allocation_bytes,
            },
            PolicyError::OutOfMemory(oom) => Self::OutOfMemory(oom),
            PolicyError::Config(config) => Self::Config(config.to_string()),
            PolicyError::Setting(reason) => Self::Config(reason),
        }
    }
}

/// What an out-of-memory observer is handed ([`PoolOptions::oom_snapshot`], `Pool::set_oom_observer`):
/// the refusal and the pool as it was at that moment, taken under the pool's lock.
#[derive(Debug, Clone)]
pub struct OomReport {
    /// The refusal, with its figures (as the error returned to the request).
    pub error: OutOfMemory,
    /// The pool's memory at the refusal.
    pub state: PoolState,
    /// The history up to the refusal (its last event the `oom`), when history is on.
    pub history: Option<History>,
}

impl OomReport {
    /// The pool at the refusal as a PyTorch memory snapshot (with the history, when it is on),
    /// for `memory_viz`: write it with [`Snapshot::to_pickle_bytes`].
    pub fn snapshot(&self) -> Snapshot {
        pytorch_snapshot(&self.state, self.history.as_ref())
    }
}

/// A function called at every out-of-memory refusal of a pool (`Pool::set_oom_observer`), on
/// the thread that asked, after the pool's lock is released (it may use the pool).
pub type OomObserver = std::sync::Arc<dyn Fn(&OomReport) + Send + Sync>;
