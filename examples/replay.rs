//! Replay a recorded allocation trace through the pool's policy, offline, and compare it with
//! other strategies — "how would this workload fare on a buddy pool?" without a GPU.
//!
//! ```text
//! cargo run --release --example replay -- TRACE [--capacity BYTES] [--limits h200|webgpu|lavapipe]
//!                                              [--json OUT] [--svg OUT]
//! ```
//!
//! TRACE is a PyTorch memory snapshot (`torch.cuda.memory._snapshot()` saved with pickle, or
//! the same as JSON), or a snapshot this crate exported from its own pool's history. The
//! strategies are `pool` (the very policy the GPU pool runs, over simulated segments),
//! `pool_compact` (the same, moving live allocations rather than growing where it can),
//! `pool_pow2` (the same with power-of-two rounding) and `naive` (one buffer per allocation);
//! PyTorch's own reserved memory is read from the trace's segment events.
//!
//! Beside each peak: the segments (buffers) each strategy and PyTorch created over the trace and
//! their bytes ("GiB created"; JSON `segments_created`, `bytes_created`, and at the top level
//! `pytorch_segments_created`, `pytorch_bytes_created`): on a GPU each is a driver allocation plus
//! wgpu's zero-fill, the price that a low peak can hide.
//!
//! Under the table, a reference (JSON `best_fit_heap_peak_bytes`): the peak of one address space
//! growing in place with best-fit placement, as `malloc` places blocks. No wgpu pool can run it (a
//! buffer cannot grow), but it shows what the requests' order and sizes cost by themselves: a pool
//! with few segments reserves about that much or more.
//!
//! `pool_compact` is the pool compacting before it grows: when a request fits nowhere, live
//! allocations of at most the request's size move out of one aligned block so that it fits. Under
//! the table: the bytes it moved, and what it saved against `pool` (peak reserved, segments and
//! bytes created, failed allocations); JSON `compaction` and each strategy's `compactions`,
//! `moves`, `moved_bytes`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use wgpu_pool::replay::{
    replay, LimitsProfile, ReplayEvent, ReplayReport, Strategy, TimelinePoints,
};
use wgpu_pool::snapshot::Snapshot;

struct Args {
    trace: PathBuf,
    capacity_bytes: Option<u64>,
    limits: LimitsProfile,
    json: Option<PathBuf>,
    svg: Option<PathBuf>,
}

const USAGE: &str = "usage: replay TRACE [--capacity BYTES] [--limits h200|webgpu|lavapipe] [--json OUT] [--svg OUT]";

fn parse_args() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut trace = None;
    let mut parsed = Args {
        trace: PathBuf::new(),
        capacity_bytes: None,
        limits: LimitsProfile::H200,
        json: None,
        svg: None,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--capacity" => parsed.capacity_bytes = Some(parse_bytes(&value("--capacity")?)?),
            "--limits" => {
                let name = value("--limits")?;
                parsed.limits = LimitsProfile::by_name(&name).with_context(|| {
                    format!("unknown limits profile {name:?}: h200, webgpu or lavapipe")
                })?;
            }
            "--json" => parsed.json = Some(value("--json")?.into()),
            "--svg" => parsed.svg = Some(value("--svg")?.into()),
            "-h" | "--help" => bail!("{USAGE}"),
            other if other.starts_with("--") => bail!("unknown option {other}\n{USAGE}"),
            other if trace.is_none() => trace = Some(PathBuf::from(other)),
            other => bail!("unexpected argument {other}\n{USAGE}"),
        }
    }
    parsed.trace = trace.with_context(|| format!("no trace given\n{USAGE}"))?;
    Ok(parsed)
}

/// Bytes, with an optional binary suffix: `80GiB`, `512MiB`, `1024`.
fn parse_bytes(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .with_context(|| format!("not a size: {text:?}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        other => bail!("unknown unit {other:?} in {text:?}: use B, KiB, MiB, GiB or TiB"),
    };
    number
        .checked_mul(1u64 << shift)
        .with_context(|| format!("{text:?} is too large"))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("replay: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = parse_args()?;

    // 1. Read the trace. The pickle reader accepts plain data only: nothing in the file runs.
    let snapshot = Snapshot::from_path(&args.trace)
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let events = ReplayEvent::from_snapshot(&snapshot);
    if events.is_empty() {
        bail!(
            "{} holds no allocation events (was memory history recorded?)",
            args.trace.display()
        );
    }

    // 2. Replay it through every strategy, with a progress bar for long traces.
    let strategies = Strategy::defaults(&args.limits);
    let bar = ProgressBar::new((events.len() * strategies.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events")
            .expect("a valid template"),
    );
    bar.set_message("replaying");
    let name = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let report = replay(
        &name,
        &events,
        args.limits,
        args.capacity_bytes,
        &strategies,
        &mut |done| bar.set_position(done as u64),
    );
    bar.finish_and_clear();

    // 3. Say what happened.
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        plot(&report, path).with_context(|| format!("plotting {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn print_report(report: &ReplayReport) {
    println!(
        "trace {}: {} alloc/free events, limits {}",
        report.trace, report.events, report.limits.name
    );
    if let Some(capacity) = report.capacity_bytes {
        println!("simulated device capacity: {:.3} GiB", gib(capacity));
    }
    let peak = report.peak_requested_bytes;
    println!("peak requested: {:.3} GiB", gib(peak));
    let ratio = |bytes: u64| {
        if peak == 0 {
            0.0
        } else {
            bytes as f64 / peak as f64
        }
    };
    println!();
    println!(
        "{:<12} {:>14} {:>8} {:>10} {:>10} {:>9} {:>12} {:>10}",
        "strategy",
        "peak reserved",
        "ratio",
        "int. frag",
        "ext. frag",
        "segments",
        "GiB created",
        "first OOM"
    );
    if let Some(pytorch) = report.pytorch_peak_reserved_bytes {
        println!(
            "{:<12} {:>10.3} GiB {:>8.3} {:>10} {:>10} {:>9} {:>12.3} {:>10}",
            "pytorch",
            gib(pytorch),
            ratio(pytorch),
            "-",
            "-",
            report.pytorch_segments_created.unwrap_or(0),
            gib(report.pytorch_bytes_created.unwrap_or(0)),
            "-"
        );
    }
    for s in &report.strategies {
        let oom = s
            .oom_at_event
            .map_or_else(|| "none".to_string(), |e| format!("event {e}"));
        println!(
            "{:<12} {:>10.3} GiB {:>8.3} {:>9.1}% {:>9.1}% {:>9} {:>12.3} {:>10}",
            s.name,
            gib(s.peak_reserved_bytes),
            ratio(s.peak_reserved_bytes),
            s.internal_fragmentation * 100.0,
            s.external_fragmentation * 100.0,
            s.segments_created,
            gib(s.bytes_created),
            oom
        );
    }
    let heap = report.best_fit_heap_peak_bytes;
    println!(
        "reference: one best-fit heap growing in place (no wgpu pool can): {:.3} GiB, ratio {:.3}",
        gib(heap),
        ratio(heap)
    );
    if let Some(c) = &report.compaction {
        let mib = |bytes: i64| bytes as f64 / (1u64 << 20) as f64;
        let attempts = report
            .strategy("pool_compact")
            .map_or(0, |s| s.compaction_attempts);
        println!(
            "\npool_compact: {} compactions of {} requests that would have grown the pool, {} allocations moved, {:.1} MiB moved",
            c.compactions,
            attempts,
            c.moves,
            mib(c.moved_bytes as i64)
        );
        println!(
            "  saved against pool: peak reserved {:.1} MiB, segments created {}, bytes created {:.1} MiB, failed allocations {}",
            mib(c.peak_reserved_saved_bytes),
            c.segments_created_saved,
            mib(c.bytes_created_saved),
            c.failed_allocations_saved
        );
    }
    for s in report.strategies.iter().filter(|s| s.oom_reason.is_some()) {
        println!(
            "\n{} first failed ({} failures): {}",
            s.name,
            s.failed_allocations,
            s.oom_reason.as_deref().unwrap_or("")
        );
    }
    println!("\nfragmentation is measured when requested bytes peak; ratio = peak reserved / peak requested");
}

/// Bytes over the trace: requested, PyTorch's reserved, and each strategy's reserved.
fn plot(report: &ReplayReport, path: &std::path::Path) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_bytes = report
        .strategies
        .iter()
        .flat_map(|s| s.reserved_timeline.iter())
        .chain(report.requested_timeline.iter())
        .chain(report.pytorch_reserved_timeline.iter())
        .map(|p| p.1)
        .max()
        .unwrap_or(1);
    let events = report.requested_timeline.last().map_or(1, |p| p.0 + 1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: bytes over the trace ({} limits)",
                report.trace, report.limits.name
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0usize..events, 0f64..gib(max_bytes) * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("event")
        .y_desc("GiB")
        .draw()?;
    let mut series: Vec<(String, &TimelinePoints, RGBColor)> = Vec::new();
    if !report.pytorch_reserved_timeline.is_empty() {
        series.push((
            "pytorch reserved".into(),
            &report.pytorch_reserved_timeline,
            RGBColor(150, 150, 150),
        ));
    }
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    for (strategy, color) in report.strategies.iter().zip(palette) {
        series.push((
            format!("{} reserved", strategy.name),
            &strategy.reserved_timeline,
            color,
        ));
    }
    // Last, so that it stays visible where naive's reserved bytes equal it.
    series.push(("requested".into(), &report.requested_timeline, BLACK));
    for (label, points, color) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, y)| (x, gib(y))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
