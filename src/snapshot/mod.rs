//! The PyTorch memory snapshot format: the data of `torch.cuda.memory._snapshot()` as
//! Rust types, a safe importer and the exporters.
//!
//! A snapshot is one dict, `{"segments": [...], "device_traces": [[...]],
//! "allocator_settings": {...}}`, that PyTorch pickles (protocol 4) and that
//! [pytorch.org/memory_viz](https://pytorch.org/memory_viz) draws. The field names of
//! [`Snapshot`], [`Segment`], [`Block`], [`TraceEntry`] and [`Frame`] are PyTorch's, so
//! `serde` maps them one to one, in pickle and in JSON.
//!
//! # Importing
//!
//! [`Snapshot::from_pickle_bytes`] never runs the pickle the way Python's `pickle.load`
//! does: it accepts plain data only and fails with [`SnapshotError::ForbiddenOpcode`] at
//! the first opcode that would import a global, call something, build an instance, a set
//! or a buffer. Malformed or truncated input is an error, never a panic, and memory stays
//! linear in the input length (limits under [`Snapshot::from_pickle_bytes`]).
//! [`Snapshot::from_json_str`] reads the same structure as JSON, and
//! [`Snapshot::from_path`] picks the format by content.
//!
//! Import is lenient where PyTorch versions differ: unknown keys (`external_annotations`,
//! `compile_context`, `user_metadata`, `pool_id`, ...) are ignored, and fields that older
//! versions lack (`frames`, `requested_size`, `segment_pool_id`, `is_expandable`,
//! `time_us`, block `address`, ...) take defaults. It is strict on types: a string where a
//! number belongs, a negative size or a non-string dict key is a
//! [`SnapshotError::Schema`]. Unknown actions and block states are kept as
//! [`TraceAction::Other`] and [`BlockState::Other`] (PyTorch adds actions over time, e.g.
//! `user_defined`); [`Snapshot::check_invariants`] reports them.
//!
//! # Exporting
//!
//! [`Snapshot::to_pickle_bytes`] writes pickle protocol 3 through `serde_pickle` (the
//! memory_viz viewer rejects protocol 5), with `segment_pool_id` as a Python tuple and
//! every struct as a dict with string keys; [`Snapshot::to_json_string`] writes JSON. Both
//! refuse addresses and sizes at or above 2^53, which the viewer's JavaScript numbers
//! cannot hold exactly.

#![deny(unsafe_code)]

mod error;
mod invariants;
mod pickle;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use error::SnapshotError;
pub use invariants::{InvariantError, Violation};

/// The largest address or size the exporters write: 2^53 − 1, the largest integer a
/// JavaScript number (the memory_viz viewer) holds exactly, in bytes.
pub const MAX_EXPORTED_VALUE: u64 = (1 << 53) - 1;

/// A PyTorch memory snapshot: the segments the caching allocator held when the snapshot
/// was taken, and the recorded trace of allocator events per device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Every segment (one driver allocation, `cudaMalloc`) the allocator held when the
    /// snapshot was taken, with the blocks that tile it.
    pub segments: Vec<Segment>,
    /// The recorded event history, one list per device index, oldest event first.
    /// Empty when history recording was off. Missing in the input: empty.
    #[serde(default)]
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator configuration at snapshot time (`PYTORCH_CUDA_ALLOC_CONF`,
    /// `max_split_size`, `roundup_power2_divisions`, ...), kept as free-form values
    /// because its keys change between PyTorch versions. Missing in the input: empty.
    #[serde(default)]
    pub allocator_settings: serde_json::Map<String, serde_json::Value>,
}

/// One segment: a single driver allocation that the allocator splits into blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Device index (CUDA ordinal). Missing in the input: 0.
    #[serde(default)]
    pub device: i64,
    /// Device address of the segment's first byte.
    pub address: u64,
    /// Size of the segment, in bytes; equal to the sum of its blocks' sizes.
    pub total_size: u64,
    /// Sum of the sizes of the blocks in state `active_allocated`, in bytes.
    pub allocated_size: u64,
    /// Sum of the sizes of the active blocks (`active_allocated` and
    /// `active_pending_free`), in bytes.
    pub active_size: u64,
    /// Sum of the `requested_size` of the active blocks, in bytes. Missing in the input
    /// (older PyTorch): 0.
    #[serde(default)]
    pub requested_size: u64,
    /// The CUDA stream the segment belongs to, as PyTorch's integer handle (0: the
    /// default stream). Missing in the input: 0.
    #[serde(default)]
    pub stream: i64,
    /// `"small"` (the pool for requests up to 1 MiB, 2 MiB segments) or `"large"`.
    pub segment_type: String,
    /// The private memory pool (CUDA graphs, `MemPool`) that owns the segment, as a
    /// Python tuple; `(0, 0)` for the default pool. Missing in the input: `(0, 0)`.
    #[serde(default)]
    pub segment_pool_id: (i64, i64),
    /// Whether the segment is part of an expandable segment (`expandable_segments:True`);
    /// PyTorch then reports one segment per contiguous mapped range. Missing: `false`.
    #[serde(default)]
    pub is_expandable: bool,
    /// The stack at the time the segment was allocated, innermost frame first; often
    /// empty. Missing in the input: empty.
    #[serde(default)]
    pub frames: Vec<Frame>,
    /// The blocks that tile the segment, in address order with no gaps.
    pub blocks: Vec<Block>,
}

/// One block of a segment: a range that is allocated, waiting for its stream to finish
/// with it, or free.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Device address of the block's first byte. Missing in the input (PyTorch before
    /// 2.1): derived from the segment's address and the sizes of the blocks before it.
    #[serde(default = "unset_address")]
    pub address: u64,
    /// Size of the block, in bytes (the request rounded up by the allocator).
    pub size: u64,
    /// The size the program asked for, in bytes. PyTorch keeps the last request's value
    /// in `inactive` blocks too, so it is only meaningful for active ones. Missing: 0.
    #[serde(default)]
    pub requested_size: u64,
    /// Whether the block is allocated, pending free, or free.
    pub state: BlockState,
    /// The stack at the time the block was allocated, innermost frame first. Missing in
    /// the input: empty.
    #[serde(default)]
    pub frames: Vec<Frame>,
}

/// One event of the allocator's recorded history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Device address the event concerns (block for `alloc`/`free_*`, segment for
    /// `segment_*`). PyTorch writes no `addr` for `oom` (it writes `device_free`
    /// instead); missing in the input: 0.
    #[serde(default)]
    pub addr: u64,
    /// Size of the event, in bytes: the requested size for `alloc` and `free_*`, the
    /// segment size for `segment_*`, the request that failed for `oom`.
    pub size: u64,
    /// The CUDA stream, as PyTorch's integer handle. Missing in the input: 0.
    #[serde(default)]
    pub stream: i64,
    /// When the event happened, in microseconds since an arbitrary epoch (PyTorch's
    /// approximate clock). Missing in the input (older PyTorch): 0.
    #[serde(default)]
    pub time_us: i64,
    /// The stack at the event, innermost frame first. Missing in the input: empty.
    #[serde(default)]
    pub frames: Vec<Frame>,
    /// Free device memory reported by the driver when an `oom` happened, in bytes;
    /// `None` for every other action. Written only when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// One stack frame (Python or C++).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Frame {
    /// Source file name.
    pub filename: String,
    /// Line number (0 for C++ frames without line information).
    pub line: i64,
    /// Function name.
    pub name: String,
}

/// What a [`TraceEntry`] records. Serialized as PyTorch's lower-case name.
///
/// Unknown names are kept as [`Other`](Self::Other) on import rather than refused, since
/// PyTorch adds actions over time (`user_defined` in recent versions);
/// [`Snapshot::check_invariants`] reports them, and [`TracePeaks`] ignores them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// `alloc`: a block was handed to the program.
    Alloc,
    /// `free_requested`: the program freed a block; streams may still use it.
    FreeRequested,
    /// `free_completed`: the block is free for reuse.
    FreeCompleted,
    /// `segment_alloc`: a new segment was allocated from the driver (`cudaMalloc`).
    SegmentAlloc,
    /// `segment_free`: a segment was returned to the driver (`cudaFree`).
    SegmentFree,
    /// `segment_map`: memory was mapped into an expandable segment.
    SegmentMap,
    /// `segment_unmap`: memory was unmapped from an expandable segment.
    SegmentUnmap,
    /// `snapshot`: a snapshot was taken at this point.
    Snapshot,
    /// `oom`: an allocation failed; [`TraceEntry::device_free`] holds the free memory.
    Oom,
    /// Any other name, kept as written.
    Other(String),
}

impl TraceAction {
    /// Every action this crate knows, in PyTorch's order.
    pub const KNOWN: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// PyTorch's name for the action, e.g. `"segment_alloc"`.
    pub fn as_str(&self) -> &str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
            TraceAction::Other(name) => name,
        }
    }

    /// The action PyTorch calls `name`; [`Other`](Self::Other) if it is none of the known.
    pub fn from_name(name: &str) -> TraceAction {
        TraceAction::KNOWN
            .into_iter()
            .find(|action| action.as_str() == name)
            .unwrap_or_else(|| TraceAction::Other(name.to_owned()))
    }
}

/// The state of a [`Block`]. Serialized as PyTorch's name.
///
/// Unknown names are kept as [`Other`](Self::Other) on import;
/// [`Snapshot::check_invariants`] reports them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// `active_allocated`: handed to the program.
    ActiveAllocated,
    /// `active_pending_free`: freed by the program, but a stream may still use it.
    ActivePendingFree,
    /// `inactive`: free, cached for reuse.
    Inactive,
    /// Any other name, kept as written.
    Other(String),
}

impl BlockState {
    /// PyTorch's name for the state, e.g. `"active_allocated"`.
    pub fn as_str(&self) -> &str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Other(name) => name,
        }
    }

    /// The state PyTorch calls `name`; [`Other`](Self::Other) if it is none of the known.
    pub fn from_name(name: &str) -> BlockState {
        match name {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => BlockState::Other(other.to_owned()),
        }
    }

    /// Whether PyTorch counts the block as active (in `active_size` and
    /// `requested_size`): allocated or pending free.
    pub fn is_active(&self) -> bool {
        matches!(
            self,
            BlockState::ActiveAllocated | BlockState::ActivePendingFree
        )
    }
}

/// Implements string (de)serialization through `as_str` / `from_name`.
macro_rules! serde_as_name {
    ($type:ty, $expecting:literal) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct NameVisitor;

                impl serde::de::Visitor<'_> for NameVisitor {
                    type Value = $type;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }

                    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<$type, E> {
                        Ok(<$type>::from_name(name))
                    }
                }

                deserializer.deserialize_str(NameVisitor)
            }
        }
    };
}

serde_as_name!(TraceAction, "an action name such as \"alloc\"");
serde_as_name!(BlockState, "a block state such as \"active_allocated\"");

/// Marks a block whose `address` was missing in the input, until
/// [`Snapshot::fill_missing_block_addresses`] derives it.
const UNSET_ADDRESS: u64 = u64::MAX;

fn unset_address() -> u64 {
    UNSET_ADDRESS
}

/// The two peaks the replay compares against, computed from a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracePeaks {
    /// Peak of the live requested bytes: the running sum of `alloc` sizes minus
    /// `free_completed` sizes, in bytes. Matches `memory_stats()["requested_bytes.all.peak"]`
    /// when recording started before the first allocation.
    pub peak_requested_bytes: u64,
    /// Peak of the memory reserved from the driver: the running sum of `segment_alloc`
    /// and `segment_map` sizes minus `segment_free` and `segment_unmap` sizes, in bytes.
    /// Matches `memory_stats()["reserved_bytes.all.peak"]` under the same condition.
    pub peak_reserved_bytes: u64,
}

impl TracePeaks {
    /// Computes both peaks over `events` in order. Running sums that go below zero (a
    /// trace that starts after some allocations) count as zero for the peak.
    pub fn from_events(events: &[TraceEntry]) -> TracePeaks {
        let (mut requested, mut reserved) = (0_i128, 0_i128);
        let (mut peak_requested, mut peak_reserved) = (0_i128, 0_i128);
        for event in events {
            let size = i128::from(event.size);
            match event.action {
                TraceAction::Alloc => requested += size,
                TraceAction::FreeCompleted => requested -= size,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => reserved += size,
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => reserved -= size,
                _ => {}
            }
            peak_requested = peak_requested.max(requested);
            peak_reserved = peak_reserved.max(reserved);
        }
        let clamp = |peak: i128| u64::try_from(peak).unwrap_or(u64::MAX);
        TracePeaks {
            peak_requested_bytes: clamp(peak_requested),
            peak_reserved_bytes: clamp(peak_reserved),
        }
    }
}

impl Snapshot {
    /// Reads a pickled snapshot (protocol 0 to 5) as plain data, without running it.
    ///
    /// Only the data opcodes are run, on a private stack machine; nothing is imported,
    /// called or looked up. Every length prefix is checked against the remaining input
    /// before use and string data is borrowed, so decoding needs memory linear in
    /// `bytes.len()` (a few tens of bytes per input byte at worst). Values shared through
    /// the pickle memo are copied into the result, which is charged against a budget of
    /// 16 MiB plus 64 bytes per input byte (the real traces use about 11 per byte), and
    /// containers may nest at most 64 levels. Keys the snapshot types do not have are
    /// skipped without being walked. Bytes after `STOP` are an error.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::ForbiddenOpcode`] at the first opcode that would import or call
    /// Python code (or build a set or buffer); [`SnapshotError::MalformedPickle`] for
    /// truncated or invalid input; [`SnapshotError::LimitExceeded`] when shared values
    /// expand too far or nest too deep; [`SnapshotError::Schema`] when the data is not a
    /// snapshot.
    pub fn from_pickle_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let decoded = pickle::decode(bytes)?;
        let mut snapshot: Snapshot = pickle::deserialize(&decoded)?;
        snapshot.fill_missing_block_addresses();
        Ok(snapshot)
    }

    /// Reads a snapshot from JSON text with the same structure as the pickle (tuples as
    /// arrays).
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Json`] for invalid JSON, [`SnapshotError::Schema`] when it is not
    /// a snapshot.
    pub fn from_json_str(text: &str) -> Result<Snapshot, SnapshotError> {
        let mut snapshot: Snapshot =
            serde_json::from_str(text).map_err(SnapshotError::from_json)?;
        snapshot.fill_missing_block_addresses();
        Ok(snapshot)
    }

    /// Reads a snapshot from JSON bytes (UTF-8); see [`Snapshot::from_json_str`].
    ///
    /// # Errors
    ///
    /// As [`Snapshot::from_json_str`].
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut snapshot: Snapshot =
            serde_json::from_slice(bytes).map_err(SnapshotError::from_json)?;
        snapshot.fill_missing_block_addresses();
        Ok(snapshot)
    }

    /// Reads a snapshot file, pickle or JSON, chosen by content: JSON if the first byte
    /// that is not whitespace is `{`, a pickle otherwise (protocol 2 and later start with
    /// the `PROTO` byte 0x80; protocols 0 and 1 with `(` or `}`).
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Io`] if the file cannot be read, then as
    /// [`Snapshot::from_pickle_bytes`] or [`Snapshot::from_json_bytes`].
    /// Native only: in a browser use the bytes.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_path(path: impl AsRef<std::path::Path>) -> Result<Snapshot, SnapshotError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| SnapshotError::Io {
            path: path.to_owned(),
            source,
        })?;
        if bytes.trim_ascii_start().starts_with(b"{") {
            Snapshot::from_json_bytes(&bytes)
        } else {
            Snapshot::from_pickle_bytes(&bytes)
        }
    }

    /// Writes the snapshot as a pickle, protocol 3 (which Python 3 and the memory_viz
    /// viewer read; the viewer rejects protocol 5). Structs become dicts with string
    /// keys, `segment_pool_id` a tuple, and the output holds no `GLOBAL` or `REDUCE`, so
    /// [`Snapshot::from_pickle_bytes`] reads it back. Shared strings are not memoized, so
    /// a trace with deep stacks comes out larger than PyTorch's own file.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::NotRepresentable`] if an address or size is at or above 2^53;
    /// [`SnapshotError::PickleWrite`] if `serde_pickle` fails.
    pub fn to_pickle_bytes(&self) -> Result<Vec<u8>, SnapshotError> {
        self.check_exportable()?;
        serde_pickle::to_vec(self, serde_pickle::SerOptions::new())
            .map_err(SnapshotError::PickleWrite)
    }

    /// Writes the snapshot as compact JSON (tuples as arrays).
    ///
    /// # Errors
    ///
    /// [`SnapshotError::NotRepresentable`] if an address or size is at or above 2^53.
    pub fn to_json_string(&self) -> Result<String, SnapshotError> {
        self.check_exportable()?;
        serde_json::to_string(self).map_err(SnapshotError::Json)
    }

    /// Writes the snapshot as compact JSON, UTF-8 bytes; see [`Snapshot::to_json_string`].
    ///
    /// # Errors
    ///
    /// As [`Snapshot::to_json_string`].
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, SnapshotError> {
        self.to_json_string().map(String::into_bytes)
    }

    /// The trace of device 0, oldest event first; empty if nothing was recorded. Use
    /// [`Snapshot::device_traces`] for other devices.
    pub fn events(&self) -> &[TraceEntry] {
        self.device_traces.first().map_or(&[], Vec::as_slice)
    }

    /// [`TracePeaks`] of [`Snapshot::events`] (device 0).
    pub fn trace_peaks(&self) -> TracePeaks {
        TracePeaks::from_events(self.events())
    }

    /// Checks the structure PyTorch guarantees: blocks tile each segment in address order
    /// with no gap or overlap, their sizes add up to `total_size`, `allocated_size`,
    /// `active_size` and `requested_size` match the blocks' states, segments of one
    /// device do not overlap, and every segment type, block state and action is one
    /// PyTorch defines.
    ///
    /// # Errors
    ///
    /// [`InvariantError`] listing every [`Violation`] found.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        invariants::check(self)
    }

    /// Gives blocks imported without an `address` (PyTorch before 2.1) the address that
    /// tiling implies: the segment's address plus the sizes of the blocks before them.
    fn fill_missing_block_addresses(&mut self) {
        for segment in &mut self.segments {
            let mut address = segment.address;
            for block in &mut segment.blocks {
                if block.address == UNSET_ADDRESS {
                    block.address = address;
                }
                address = block.address.wrapping_add(block.size);
            }
        }
    }

    /// Refuses values the viewer's JavaScript numbers cannot hold exactly.
    fn check_exportable(&self) -> Result<(), SnapshotError> {
        let check = |field: &dyn Fn() -> String, value: u64| {
            if value > MAX_EXPORTED_VALUE {
                Err(SnapshotError::NotRepresentable {
                    field: field(),
                    value,
                })
            } else {
                Ok(())
            }
        };
        for (s, segment) in self.segments.iter().enumerate() {
            check(&|| format!("segments[{s}].address"), segment.address)?;
            check(&|| format!("segments[{s}].total_size"), segment.total_size)?;
            for (b, block) in segment.blocks.iter().enumerate() {
                check(
                    &|| format!("segments[{s}].blocks[{b}].address"),
                    block.address,
                )?;
                check(&|| format!("segments[{s}].blocks[{b}].size"), block.size)?;
            }
        }
        for (d, trace) in self.device_traces.iter().enumerate() {
            for (e, entry) in trace.iter().enumerate() {
                check(&|| format!("device_traces[{d}][{e}].addr"), entry.addr)?;
                check(&|| format!("device_traces[{d}][{e}].size"), entry.size)?;
            }
        }
        Ok(())
    }
}
