//! Plans buffer lifetimes read from a CSV file in MiniMalloc's format, with the crate's planner
//! and with greedy-by-size (TFLite's arena planner), checks both plans and prints the figures.
//!
//! ```text
//! cargo run --release --example plan -- BUFFERS.csv [--alignment BYTES] [--capacity BYTES]
//!     [--max-arena BYTES] [--json OUT.json]
//! ```
//!
//! The CSV has one buffer a line, `id,lower,upper,size`, alive over `[lower, upper)`; a header line
//! naming the columns (`id,lower,upper,size`, or `buffer,start,end,size` as in MiniMalloc's
//! benchmarks) is optional and may order them differently; other columns are refused. Empty lines
//! and lines starting with `#` are skipped. Runs without a GPU.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use wgpu_pool::plan::{greedy_by_size, max_live_bytes, plan, Buffer, Plan, PlanOptions};

/// The command line.
#[derive(Debug, Default)]
pub struct Args {
    /// The CSV file.
    pub input: PathBuf,
    /// Where to write the JSON figures and offsets.
    pub json: Option<PathBuf>,
    /// Fail when the plan needs more bytes than this.
    pub capacity: Option<u64>,
    /// The offset alignment (default 1).
    pub alignment: u64,
    /// The largest arena (several arenas when one cannot hold the plan).
    pub max_arena: Option<u64>,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The buffers read.
    pub buffers: Vec<Buffer>,
    /// The crate's plan.
    pub plan: Plan,
    /// Greedy-by-size's plan of the same buffers.
    pub greedy: Plan,
    /// Seconds the crate's planner took.
    pub seconds: f64,
    /// Seconds greedy-by-size took.
    pub greedy_seconds: f64,
}

const USAGE: &str = "usage: plan BUFFERS.csv [--alignment BYTES] [--capacity BYTES] \
                     [--max-arena BYTES] [--json OUT.json]";

/// Parses the command line (without the program name).
pub fn parse_args(args: &[String]) -> Result<Args> {
    let mut parsed = Args {
        alignment: 1,
        ..Args::default()
    };
    let mut input = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
                .cloned()
        };
        let bytes = |name: &str, text: String| -> Result<u64> {
            text.parse()
                .with_context(|| format!("{name} takes a number of bytes, not {text:?}"))
        };
        match arg.as_str() {
            "--json" => parsed.json = Some(PathBuf::from(value("--json")?)),
            "--capacity" => parsed.capacity = Some(bytes("--capacity", value("--capacity")?)?),
            "--alignment" => parsed.alignment = bytes("--alignment", value("--alignment")?)?,
            "--max-arena" => parsed.max_arena = Some(bytes("--max-arena", value("--max-arena")?)?),
            "-h" | "--help" => bail!("{USAGE}"),
            flag if flag.starts_with("--") => bail!("unknown option {flag}\n{USAGE}"),
            path if input.is_none() => input = Some(PathBuf::from(path)),
            extra => bail!("unexpected argument {extra:?}\n{USAGE}"),
        }
    }
    parsed.input = input.with_context(|| format!("no input file\n{USAGE}"))?;
    Ok(parsed)
}

/// Reads buffers from MiniMalloc's CSV format.
pub fn parse_csv(text: &str) -> Result<Vec<Buffer>> {
    // Column positions of id, lower, upper, size.
    let mut columns = [0usize, 1, 2, 3];
    let mut width = 4;
    let mut buffers = Vec::new();
    let mut first = true;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let header = first && fields.iter().any(|f| f.parse::<u64>().is_err());
        first = false;
        if header {
            width = fields.len();
            for (slot, names) in [
                &["id", "buffer"][..],
                &["lower", "start", "begin"],
                &["upper", "end"],
                &["size"],
            ]
            .iter()
            .enumerate()
            {
                columns[slot] = fields
                    .iter()
                    .position(|f| names.contains(&f.to_ascii_lowercase().as_str()))
                    .with_context(|| format!("the header {line:?} has no column {}", names[0]))?;
            }
            if width != 4 {
                bail!("the header {line:?} has {width} columns; expected id,lower,upper,size");
            }
            continue;
        }
        if fields.len() != width {
            bail!(
                "line {}: {} fields, expected {width}: {line:?}",
                number + 1,
                fields.len()
            );
        }
        let field = |slot: usize| -> Result<u64> {
            let text = fields[columns[slot]];
            text.parse().with_context(|| {
                format!(
                    "line {}: {text:?} is not a non-negative integer",
                    number + 1
                )
            })
        };
        buffers.push(Buffer::new(field(0)?, field(1)?, field(2)?, field(3)?));
    }
    Ok(buffers)
}

/// Checks, independently of the planner's own check, that no two buffers alive at the same time
/// share a byte of the same arena and that every offset is aligned.
pub fn verify(buffers: &[Buffer], plan: &Plan, alignment: u64) -> Result<()> {
    if plan.placements.len() != buffers.len() {
        bail!(
            "{} placements for {} buffers",
            plan.placements.len(),
            buffers.len()
        );
    }
    for (i, (a, pa)) in buffers.iter().zip(&plan.placements).enumerate() {
        if pa.id != a.id || pa.offset % alignment != 0 {
            bail!("buffer {} is misplaced: {pa:?}", a.id);
        }
        for (b, pb) in buffers[i + 1..].iter().zip(&plan.placements[i + 1..]) {
            let in_time = a.lower < b.upper && b.lower < a.upper;
            let in_memory = pa.offset < pb.offset + b.size && pb.offset < pa.offset + a.size;
            if pa.arena == pb.arena && in_time && in_memory && a.size > 0 && b.size > 0 {
                bail!(
                    "buffers {} and {} overlap in time and in memory",
                    a.id,
                    b.id
                );
            }
        }
    }
    plan.check(buffers, None)?;
    Ok(())
}

/// Reads, plans, verifies, prints and writes what the arguments ask for.
pub fn run(args: &[String]) -> Result<Outcome> {
    let args = parse_args(args)?;
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("read {}", args.input.display()))?;
    let buffers = parse_csv(&text).with_context(|| format!("parse {}", args.input.display()))?;
    let options = PlanOptions {
        alignment: args.alignment,
        max_arena_bytes: args.max_arena,
        ..PlanOptions::default()
    };
    let started = Instant::now();
    let greedy = greedy_by_size(&buffers, &options).context("greedy-by-size")?;
    let greedy_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let planned = plan(&buffers, &options);
    let seconds = started.elapsed().as_secs_f64();
    let planned = planned.context("plan")?;
    verify(&buffers, &greedy, args.alignment).context("greedy-by-size's plan is invalid")?;
    verify(&buffers, &planned, args.alignment).context("the plan is invalid")?;
    let outcome = Outcome {
        buffers,
        plan: planned,
        greedy,
        seconds,
        greedy_seconds,
    };
    print!("{}", report(&args.input, &outcome));
    if let Some(path) = &args.json {
        write_json(path, &outcome)?;
    }
    if let Some(capacity) = args.capacity {
        if outcome.plan.heap_bytes > capacity {
            bail!(
                "the plan needs {} bytes, above the capacity of {capacity} bytes \
                 (the buffers alive at once already need {})",
                outcome.plan.heap_bytes,
                outcome.plan.max_live_bytes
            );
        }
    }
    Ok(outcome)
}

/// The figures as text.
pub fn report(input: &Path, o: &Outcome) -> String {
    let live = o.plan.max_live_bytes;
    debug_assert_eq!(live, max_live_bytes(&o.buffers));
    let ratio = |bytes: u64| bytes as f64 / live.max(1) as f64;
    let mut text = format!("{}: {} buffers\n", input.display(), o.buffers.len());
    text += &format!("  max-live          {live:>12} bytes (the lower bound)\n");
    for (name, plan, seconds) in [
        ("greedy-by-size", &o.greedy, o.greedy_seconds),
        ("plan", &o.plan, o.seconds),
    ] {
        text += &format!(
            "  {name:<16}  {:>12} bytes  {:.4} x max-live  waste {:>10}  {seconds:.3} s\n",
            plan.heap_bytes,
            ratio(plan.heap_bytes),
            plan.waste_bytes(),
        );
    }
    text += &format!(
        "  plan / greedy     {:.4} ({:+.2}%)\n",
        o.plan.heap_bytes as f64 / o.greedy.heap_bytes.max(1) as f64,
        100.0 * (o.plan.heap_bytes as f64 / o.greedy.heap_bytes.max(1) as f64 - 1.0)
    );
    if o.plan.arena_bytes.len() > 1 {
        text += &format!("  arenas            {:?}\n", o.plan.arena_bytes);
    }
    text
}

/// Writes the figures and offsets as JSON.
pub fn write_json(path: &Path, o: &Outcome) -> Result<()> {
    let several = o.plan.arena_bytes.len() > 1;
    let offsets: Vec<serde_json::Value> = o
        .plan
        .placements
        .iter()
        .map(|p| {
            if several {
                serde_json::json!({ "id": p.id, "offset": p.offset, "arena": p.arena })
            } else {
                serde_json::json!({ "id": p.id, "offset": p.offset })
            }
        })
        .collect();
    let mut json = serde_json::json!({
        "buffers": o.buffers.len(),
        "max_live_bytes": o.plan.max_live_bytes,
        "heap_bytes": o.plan.heap_bytes,
        "greedy_by_size_heap_bytes": o.greedy.heap_bytes,
        "seconds": o.seconds,
        "offsets": offsets,
    });
    if several {
        json["arena_bytes"] = serde_json::json!(o.plan.arena_bytes);
    }
    let text = serde_json::to_string_pretty(&json)?;
    std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(error) = run(&args) {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
