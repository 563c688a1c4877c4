//! The reporter: what makes the pool explain itself, the same way on every backend.
//!
//! - [`Report`]: the device ([`DeviceReport`]: adapter, buffer-relevant limits, wgpu's allocator
//!   report and internal counters) side by side with the pool ([`PoolFigures`]: current / peak /
//!   total bytes, fragmentation, largest allocation possible now, free blocks per size, ...) and
//!   its segments. `Display` prints a table in the manner of `torch.cuda.memory_summary()` and a
//!   segment map; serde writes the whole of it as JSON.
//! - Exporters of a [`PoolState`] and a [`History`]: [`pytorch_snapshot`] (for
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

use std::path::{Path, PathBuf};

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

use crate::history::History;
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

fn write_file(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf, ReportError> {
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Writes every export of `pool` into `dir` (created if needed): the summary, the report as JSON,
/// the PyTorch snapshot (pickle and JSON), the segment map SVG, and — when history is on — the
/// history, the Chrome trace and the memory-over-time SVG.
///
/// # Errors
///
/// [`ReportError::Io`] when a file cannot be written, [`ReportError::Snapshot`] when the snapshot
/// cannot be exported, [`ReportError::Plot`] when a plot cannot be drawn.
pub fn write_exports(pool: &Pool, dir: impl AsRef<Path>) -> Result<Exports, ReportError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let (state, history) = pool.state_and_history();
    let snapshot = pytorch_snapshot(&state, history.as_ref());
    let device = DeviceReport::from_gpu(pool.gpu());
    let segments_plot = segments_svg(&state)?;
    let time_us = state.time_us;
    let report = Report::from_parts(device, state);
    let summary = write_file(dir, "report.txt", report.to_string().as_bytes())?;
    let report_json = write_file(dir, "report.json", report.to_json()?.as_bytes())?;
    let snapshot_pickle = write_file(dir, "snapshot.pickle", &snapshot.to_pickle_bytes()?)?;
    let snapshot_json = write_file(dir, "snapshot.json", &snapshot.to_json_bytes()?)?;
    let segments_svg = write_file(dir, "segments.svg", segments_plot.as_bytes())?;
    let history = match history {
        Some(history) => Some(write_history(dir, &history, time_us)?),
        None => None,
    };
    Ok(Exports {
        summary,
        report_json,
        snapshot_pickle,
        snapshot_json,
        segments_svg,
        history,
    })
}

fn write_history(
    dir: &Path,
    history: &History,
    end_time_us: u64,
) -> Result<HistoryExports, ReportError> {
    Ok(HistoryExports {
        history_json: write_file(
            dir,
            "history.json",
            serde_json::to_string(history)?.as_bytes(),
        )?,
        chrome_trace: write_file(
            dir,
            "trace.json",
            serde_json::to_string(&chrome_trace(history, end_time_us))?.as_bytes(),
        )?,
        memory_svg: write_file(
            dir,
            "memory.svg",
            memory_svg(history, end_time_us)?.as_bytes(),
        )?,
    })
}
