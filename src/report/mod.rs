//! The reporter: what makes the pool explain itself, the same way on every backend.
//!
//! - [`Report`]: the device ([`DeviceReport`]: adapter, buffer-relevant limits, wgpu's allocator
//!   report and internal counters) side by side with the pool ([`PoolFigures`]: current / peak /
//!   total bytes, fragmentation, largest allocation possible now, free blocks per size, ...) and
//!   its segments. `Display` prints a table in the manner of `torch.cuda.memory_summary()` and a
//!   segment map; serde writes the whole of it as JSON.
//! - Exporters of a [`PoolState`] and a [`History`](crate::history::History): [`pytorch_snapshot`] (for
//!   `python -m torch.cuda._memory_viz` and pytorch.org/memory_viz), [`chrome_trace`] (Perfetto),
//!   [`memory_svg`] and [`segments_svg`] (plots), [`segment_map`] (terminal).
//! - [`write_exports`] writes all of them into a directory.
//!
//! The plain data itself ([`PoolState`], [`SegmentState`], [`Span`], [`PoolFigures`], ...) and
//! [`pytorch_snapshot`] live below the pool, in [`crate::state`], and are re-exported here: the
//! pool fills the state, the report reads it (and reads the pool), never the reverse.
//!
//! Only [`DeviceReport`] (and the functions that read a live pool) talk to wgpu; the exporters work
//! on plain data, so they run and are tested without a GPU.

mod chrome;
mod device;
mod summary;
mod svg;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::state::{
    pytorch_snapshot, AccountedBytes, BufferRole, FreeBlockCount, HistoryStatus, PolicySummary,
    PoolFigures, PoolState, RoleBytes, SegmentAddresses, SegmentState, Span, SpanKind,
};
pub use chrome::chrome_trace;
pub use device::{
    vendor_name, AdapterSummary, AllocatorReport, BufferLimits, DeviceAllocation, DeviceCounters,
    DeviceReport, LARGEST_ALLOCATIONS,
};
pub use summary::{format_bytes, format_bytes_short, segment_line, segment_map, MAP_LEGEND};
pub use svg::{memory_svg, segments_svg, SVG_MAX_SEGMENTS};

use crate::pool::Pool;
use crate::snapshot::SnapshotError;

/// Why a report or an export could not be made or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file (or directory) being written.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The PyTorch snapshot could not be written.
    #[error("cannot export the PyTorch snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// A plot could not be drawn.
    #[error("cannot draw {what}: {reason}")]
    Plot {
        /// Which plot.
        what: &'static str,
        /// What plotters said.
        reason: String,
    },
    /// JSON serialization failed.
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// What the device says is allocated in total (all of wgpu's allocations, the pool's and others).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// Where the figures come from: `"wgpu allocator report"` or `"wgpu counters"`.
    pub source: String,
    /// Bytes allocated on the device.
    pub allocated_bytes: u64,
    /// Bytes of device memory blocks (the allocator report only).
    pub reserved_bytes: Option<u64>,
}

impl DeviceMemory {
    /// The device's totals from its allocator report, else from its counters, else `None`.
    pub fn from_device_report(device: &DeviceReport) -> Option<Self> {
        match (&device.allocator, &device.counters) {
            (
                AllocatorReport::Present {
                    total_allocated_bytes,
                    total_reserved_bytes,
                    ..
                },
                _,
            ) => Some(Self {
                source: "wgpu allocator report".into(),
                allocated_bytes: *total_allocated_bytes,
                reserved_bytes: Some(*total_reserved_bytes),
            }),
            (
                AllocatorReport::Absent { .. },
                DeviceCounters::Enabled {
                    buffer_memory_bytes,
                    texture_memory_bytes,
                    ..
                },
            ) => Some(Self {
                source: "wgpu counters".into(),
                allocated_bytes: u64::try_from(
                    buffer_memory_bytes.saturating_add(*texture_memory_bytes),
                )
                .unwrap_or(0),
                reserved_bytes: None,
            }),
            _ => None,
        }
    }
}

/// The device beside the pool: the whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The device.
    pub device: DeviceReport,
    /// What the device says is allocated in total, when it says.
    pub device_memory: Option<DeviceMemory>,
    /// The pool's figures.
    pub pool: PoolFigures,
    /// The pool's segments, each tiled by its spans.
    pub segments: Vec<SegmentState>,
}

impl Report {
    /// The report of `pool` and its device, now.
    pub fn from_pool(pool: &Pool) -> Self {
        let state = pool.memory_state();
        // After the state, so that the device's figures include every segment the state shows.
        let device = DeviceReport::from_gpu(pool.gpu());
        Self::from_parts(device, state)
    }

    /// The report of a device report and a pool state (no GPU needed).
    pub fn from_parts(device: DeviceReport, state: PoolState) -> Self {
        Self {
            device_memory: DeviceMemory::from_device_report(&device),
            device,
            pool: PoolFigures::from_state(&state),
            segments: state.segments,
        }
    }

    /// The report as pretty-printed JSON.
    ///
    /// # Errors
    ///
    /// [`ReportError::Json`] if serialization fails (it does not for reports the pool makes).
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

/// The files [`write_exports`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exports {
    /// `report.txt`: the summary table and the segment map.
    pub summary: PathBuf,
    /// `report.json`: the whole report.
    pub report_json: PathBuf,
    /// `snapshot.pickle`: the PyTorch snapshot, pickle protocol 3.
    pub snapshot_pickle: PathBuf,
    /// `snapshot.json`: the same as JSON.
    pub snapshot_json: PathBuf,
    /// `segments.svg`: the segment occupancy map.
    pub segments_svg: PathBuf,
    /// `history.json`, `trace.json` (Chrome trace) and `memory.svg`, when history is on.
    pub history: Option<HistoryExports>,
}

/// The files written from the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryExports {
    /// `history.json`: the events as recorded.
    pub history_json: PathBuf,
    /// `trace.json`: the Chrome trace.
    pub chrome_trace: PathBuf,
    /// `memory.svg`: bytes over time.
    pub memory_svg: PathBuf,
}

/// One export of a pool as bytes ([`export_files`]): the file name it is written under and its
/// contents, for a page to offer as a download or a caller to store where it likes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFile {
    /// The file's name: `report.txt`, `report.json`, `snapshot.pickle`, `snapshot.json`,
    /// `segments.svg`, and with history `history.json`, `trace.json`, `memory.svg`.
    pub name: &'static str,
    /// The file's contents.
    pub bytes: Vec<u8>,
}

/// Every export of `pool` as bytes, in this order: the summary (`report.txt`), the report as
/// JSON, the PyTorch snapshot (pickle protocol 3, and JSON), the segment map SVG, and — when
/// history is on — the history, the Chrome trace (`trace.json`, for Perfetto) and the
/// memory-over-time SVG. Touches no file system, so it works in a browser too;
/// [`write_exports`] writes them into a folder.
///
/// # Errors
///
/// [`ReportError::Snapshot`] when the snapshot cannot be exported, [`ReportError::Plot`] when a
/// plot cannot be drawn, [`ReportError::Json`] when JSON cannot be written.
pub fn export_files(pool: &Pool) -> Result<Vec<ExportFile>, ReportError> {
    let (state, history) = pool.state_and_history();
    let snapshot = pytorch_snapshot(&state, history.as_ref());
    let device = DeviceReport::from_gpu(pool.gpu());
    let segments_plot = segments_svg(&state)?;
    let time_us = state.time_us;
    let report = Report::from_parts(device, state);
    let file = |name, bytes| ExportFile { name, bytes };
    let mut files = vec![
        file("report.txt", report.to_string().into_bytes()),
        file("report.json", report.to_json()?.into_bytes()),
        file("snapshot.pickle", snapshot.to_pickle_bytes()?),
        file("snapshot.json", snapshot.to_json_bytes()?),
        file("segments.svg", segments_plot.into_bytes()),
    ];
    if let Some(history) = history {
        files.extend([
            file("history.json", serde_json::to_vec(&history)?),
            file(
                "trace.json",
                serde_json::to_vec(&chrome_trace(&history, time_us))?,
            ),
            file("memory.svg", memory_svg(&history, time_us)?.into_bytes()),
        ]);
    }
    Ok(files)
}

/// Writes every export of `pool` ([`export_files`]) into `dir` (created if needed). Native
/// only: in a browser take the bytes from [`export_files`].
///
/// # Errors
///
/// [`ReportError::Io`] when a file cannot be written, and the errors of [`export_files`].
#[cfg(not(target_arch = "wasm32"))]
pub fn write_exports(
    pool: &Pool,
    dir: impl AsRef<std::path::Path>,
) -> Result<Exports, ReportError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let files = export_files(pool)?;
    for file in &files {
        let path = dir.join(file.name);
        std::fs::write(&path, &file.bytes).map_err(|source| ReportError::Io { path, source })?;
    }
    let path = |name: &str| dir.join(name);
    let history = files
        .iter()
        .any(|file| file.name == "history.json")
        .then(|| HistoryExports {
            history_json: path("history.json"),
            chrome_trace: path("trace.json"),
            memory_svg: path("memory.svg"),
        });
    Ok(Exports {
        summary: path("report.txt"),
        report_json: path("report.json"),
        snapshot_pickle: path("snapshot.pickle"),
        snapshot_json: path("snapshot.json"),
        segments_svg: path("segments.svg"),
        history,
    })
}
