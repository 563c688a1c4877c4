//! The device report for every adapter found, side by side.
//!
//! For each adapter wgpu finds (all backends, or those `WGPU_BACKEND` names), this opens a device
//! with the adapter's own limits, runs a small workload through a pool with history on, and takes
//! the pool's [`Report`]: the adapter, its buffer-relevant limits, wgpu's allocator report (present
//! on Vulkan and DX12, absent on GL and Metal), wgpu's counters (with `--features counters`), and
//! the pool's figures. Then it prints the devices side by side, and each full summary.
//!
//! ```text
//! cargo run --example device_report [-- --json OUT.json] [--exports DIR]
//! ```
//!
//! `--json OUT` writes the reports as a JSON array; `--exports DIR` writes, for each adapter, every
//! export (summary, report JSON, PyTorch snapshot as pickle and JSON, Chrome trace, SVG plots) into
//! `DIR/<index>-<backend>/`.

use std::path::PathBuf;

use anyhow::Context as _;
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::report::{format_bytes, write_exports, AllocatorReport, DeviceCounters, Report};
use wgpu_pool::{self as device, LimitsChoice};
use wgpu_pool::{AllocOptions, Gpu, Pool, PoolOptions};

/// Command-line options.
struct Args {
    json: Option<PathBuf>,
    exports: Option<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        json: None,
        exports: None,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--json" => args.json = Some(iter.next().context("--json needs a file")?.into()),
            "--exports" => {
                args.exports = Some(iter.next().context("--exports needs a directory")?.into())
            }
            other => anyhow::bail!("unknown argument {other:?}; use --json OUT or --exports DIR"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    env_logger::init();
    let args = parse_args()?;

    // Every adapter the instance finds; `WGPU_BACKEND` narrows the backends.
    let instance = device::instance();
    let adapters = device::adapters(&instance);
    anyhow::ensure!(
        !adapters.is_empty(),
        "no GPU adapter found; on a headless Linux machine install mesa-vulkan-drivers (lavapipe) \
         or libegl-mesa0 and libgl1-mesa-dri (llvmpipe)"
    );

    let mut reports = Vec::new();
    for (index, adapter) in adapters.into_iter().enumerate() {
        let info = adapter.get_info();
        // Opening a device can fail on one adapter and work on another: report and go on.
        let gpu = match device::open(adapter, LimitsChoice::Adapter) {
            Ok(gpu) => gpu,
            Err(error) => {
                eprintln!("skipping {} ({:?}): {error}", info.name, info.backend);
                continue;
            }
        };
        let pool = Pool::new(
            &gpu,
            PoolOptions {
                history: Some(HistoryOptions::default()),
                ..PoolOptions::default()
            },
        )?;
        // Keep the allocations alive while the report is taken, so the pool has something to show.
        let _live = small_workload(&gpu, &pool)?;
        if let Some(dir) = &args.exports {
            let dir = dir.join(format!("{index}-{:?}", info.backend).to_lowercase());
            let written = write_exports(&pool, &dir)?;
            eprintln!(
                "wrote the exports of {} into {}",
                info.name,
                written
                    .summary
                    .parent()
                    .map_or_else(|| dir.display().to_string(), |p| p.display().to_string())
            );
        }
        reports.push(Report::from_pool(&pool));
    }

    println!("{}", side_by_side(&reports));
    for report in &reports {
        println!("{report}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A few labelled allocations of a model-like step: weights, activations, a freed scratch buffer,
/// and one submission so that dropped ranges are released. Returns what stays live.
fn small_workload(gpu: &Gpu, pool: &Pool) -> anyhow::Result<Vec<wgpu_pool::Allocation>> {
    let mut live = Vec::new();
    {
        let _op = pool.op_scope("load");
        live.push(pool.allocate_with(20 << 20, AllocOptions::labeled("weights"))?);
    }
    let _op = pool.op_scope("forward");
    for layer in 0..4 {
        let label = format!("activations {layer}");
        live.push(pool.allocate_with((1500 << 10) + 100, AllocOptions::labeled(&label))?);
        let scratch = pool.allocate_with(600 << 10, AllocOptions::labeled("scratch"))?;
        drop(scratch);
    }
    // The drops above wait for a submission before their ranges are reused.
    let encoder = gpu.device.create_command_encoder(&Default::default());
    pool.submit([encoder.finish()]);
    live.swap_remove(1);
    Ok(live)
}

/// One row per figure, one column per adapter.
fn side_by_side(reports: &[Report]) -> String {
    const NAME: usize = 38;
    const COLUMN: usize = 36;
    type Cell = fn(&Report) -> String;
    let rows: [(&str, Cell); 18] = [
        ("adapter", |r| r.device.adapter.name.clone()),
        ("backend", |r| r.device.adapter.backend.clone()),
        ("device type", |r| r.device.adapter.device_type.clone()),
        ("vendor", |r| {
            let a = &r.device.adapter;
            match &a.vendor_name {
                Some(name) => format!("{name} ({:#x})", a.vendor_id),
                None => format!("{:#x}", a.vendor_id),
            }
        }),
        ("driver", |r| {
            format!(
                "{} {}",
                r.device.adapter.driver, r.device.adapter.driver_info
            )
        }),
        ("max_buffer_size", |r| {
            format_bytes(r.device.limits.max_buffer_size)
        }),
        ("max_storage_buffer_binding_size", |r| {
            format_bytes(r.device.limits.max_storage_buffer_binding_size)
        }),
        ("min_storage_buffer_offset_alignment", |r| {
            format!("{} B", r.device.limits.min_storage_buffer_offset_alignment)
        }),
        ("max_storage_buffers_per_shader_stage", |r| {
            r.device
                .limits
                .max_storage_buffers_per_shader_stage
                .to_string()
        }),
        ("workgroup size (x, y, z)", |r| {
            let l = &r.device.limits;
            format!(
                "{} x {} x {}",
                l.max_compute_workgroup_size_x,
                l.max_compute_workgroup_size_y,
                l.max_compute_workgroup_size_z
            )
        }),
        ("invocations / workgroup storage", |r| {
            let l = &r.device.limits;
            format!(
                "{} / {}",
                l.max_compute_invocations_per_workgroup,
                format_bytes(u64::from(l.max_compute_workgroup_storage_size))
            )
        }),
        ("workgroups per dimension", |r| {
            r.device
                .limits
                .max_compute_workgroups_per_dimension
                .to_string()
        }),
        ("wgpu allocator report", |r| match &r.device.allocator {
            AllocatorReport::Present {
                total_allocated_bytes,
                block_count,
                ..
            } => format!(
                "{} in {block_count} blocks",
                format_bytes(*total_allocated_bytes)
            ),
            AllocatorReport::Absent { .. } => "absent".into(),
        }),
        ("wgpu counters", |r| match &r.device.counters {
            DeviceCounters::Enabled {
                buffers,
                buffer_memory_bytes,
                ..
            } => format!(
                "{buffers} buffers, {}",
                format_bytes(u64::try_from(*buffer_memory_bytes).unwrap_or(0))
            ),
            DeviceCounters::Disabled { .. } => "off (--features counters)".into(),
        }),
        ("pool reserved", |r| {
            format_bytes(r.pool.stats.reserved_bytes.current)
        }),
        ("pool allocated / requested", |r| {
            format!(
                "{} / {}",
                format_bytes(r.pool.stats.allocated_bytes.current),
                format_bytes(r.pool.stats.requested_bytes.current)
            )
        }),
        ("largest allocation now (bindable)", |r| {
            format_bytes(r.pool.largest_bindable_allocation_now_bytes)
        }),
        ("device total allocated", |r| {
            r.device_memory.as_ref().map_or("unknown".into(), |d| {
                format!("{} ({})", format_bytes(d.allocated_bytes), d.source)
            })
        }),
    ];
    let clip = |text: String| -> String {
        if text.chars().count() > COLUMN - 1 {
            let mut clipped: String = text.chars().take(COLUMN - 2).collect();
            clipped.push('~');
            clipped
        } else {
            text
        }
    };
    let mut out = String::new();
    for (name, cell) in rows {
        out.push_str(&format!("{name:<NAME$}"));
        for report in reports {
            out.push_str(&format!("{:<COLUMN$}", clip(cell(report))));
        }
        out.push('\n');
    }
    out
}
