//! The pool against one-buffer-per-allocation, on an inference server.
//!
//! ```text
//! cargo run --release --example pool_vs_naive -- [--large] [--out DIR] [--json OUT] [--profile]
//!     [--only small|mlp] [--batch-ops N] [--width W] [--layers L] [--autotune|--no-autotune]
//!     [--cooperative-matrix] [--dtype f32|f16] [--f32-as-f16]
//! ```
//!
//! A server answers requests with an MLP: each request brings a batch of inputs, runs a few
//! layers of matmul + bias + GELU and a softmax, and reads the probabilities back. Every
//! intermediate of every request is allocated as the op needs it and freed when it is dropped —
//! how an eager framework works. We run the same requests twice on the same device:
//!
//! - **pool**: tensors are ranges of the pool's segments; after warm-up no buffer is created;
//! - **naive**: each tensor is a `wgpu::Buffer` of its own, created and dropped — what you write
//!   without a pool (and wgpu zero-fills each new buffer before its first use);
//! - **planned**: the forward captured once per batch size (`Context::capture`), its bias adds
//!   and GELUs fused into the matmuls, its intermediates planned by liveness into one arena that
//!   the plans of every batch size share, and replayed per request (`Plan::run`: the input
//!   written, one pass of prebuilt dispatches, the probabilities read back). The plans of every
//!   batch size the requests draw are built before the timed requests (`plan_build_s`).
//!
//! Every request's input is made before the timed loop. The sides alternate for five rounds
//! (pool, naive, planned, pool, ...) and each reports its median round: on a real GPU the rate of
//! one round varies by tens of percent with the clocks. `benches/torch/serve.py` serves the same
//! workloads with PyTorch, eagerly and with a CUDA graph per batch size.
//!
//! Two workloads: `mlp` (batches of 1 to 512 rows: the GPU's arithmetic dominates) and `small`
//! (batches of 1 to 8 rows through more layers: the cost of allocating dominates). Sizes fit a
//! software GPU by default; `--large` scales them up for a real one.
//!
//! `--out DIR` (default `target/pool_vs_naive`) receives the memory report of the pool's `mlp` run:
//! `memory.svg` and `segments.svg`, `snapshot.pickle` and `snapshot.json` (open them at
//! pytorch.org/memory_viz), `trace.json` (open it in ui.perfetto.dev), `report.txt`; and
//! `plan.csv`, the lifetimes of the largest `mlp` plan's tensors (`cargo run --example plan --
//! DIR/plan.csv` plans them again).
//! `--json OUT` writes the figures of both workloads. `--profile` serves each workload once more
//! with timestamps around every dispatch and prints where a request's GPU time goes, beside the
//! wall time of a request served without them.
//! `--only NAME` runs one workload; `--batch-ops N` submits a request's ops in batches of N;
//! `--width W` and `--layers L` change the `small` workload's layers (W a multiple of 4);
//! Every side's matmuls choose tile and split-K by measurement on a GPU (the library's default);
//! `--no-autotune` leaves it to the rules, `--autotune` tunes on a software GPU too.
//! `--cooperative-matrix` opens the device with cooperative matrices where the adapter has them
//! (JSON `cooperative_matrix`): f16 products of 16 rows and more run on them.
//! `--dtype f16` stores the weights, the inputs and every activation as f16 on every side (pool,
//! naive, planned; the kernels compute in f32 and round once as they store), on a device with
//! `SHADER_F16` (refused otherwise); `benches/torch/serve.py --dtype half` is PyTorch's side of it.
//! `--f32-as-f16` lets the f32 products run on cooperative matrices with their operands rounded
//! to f16 (`MatmulOptions::cooperative_f32_as_f16`, as PyTorch's `allow_tf32`); JSON `dtype` and
//! `f32_as_f16` record both.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::Serialize;
use wgpu_pool::compute::{
    Autotune, CaptureOptions, Context, ContextOptions, DType, Feed, KernelTiming, Plan, Tensor,
};
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::report::{write_exports, AllocatorReport, Report};
use wgpu_pool::{request_gpu_with, Gpu, GpuOptions, LimitsChoice, Pool, PoolOptions};

/// One workload: the layer widths, the batch sizes drawn, and how many requests.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// `mlp` or `small`.
    pub name: &'static str,
    /// Widths from input to output: `widths[i] -> widths[i + 1]` is one layer.
    pub widths: Vec<usize>,
    /// Batch sizes are drawn uniformly from this range (rows per request).
    pub batch: (usize, usize),
    /// Requests served; the first tenth is the warm-up.
    pub requests: usize,
}

/// How big the workloads are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// For the tests: a few tiny requests.
    Test,
    /// Fits a software GPU (lavapipe, llvmpipe) in seconds.
    Default,
    /// For a real GPU.
    Large,
}

impl Scale {
    /// Rounds of each side per workload (alternating pool and naive; the median counts).
    pub fn rounds(self) -> usize {
        match self {
            Scale::Test => 2,
            Scale::Default | Scale::Large => 5,
        }
    }

    /// The two workloads at this scale.
    pub fn workloads(self) -> Vec<Workload> {
        let (mlp_widths, mlp_requests, small_widths, small_requests) = match self {
            Scale::Test => (vec![16, 32, 8], 12, vec![16, 16, 16, 4], 20),
            Scale::Default => (vec![256, 512, 512, 64], 40, vec![128; 7], 200),
            Scale::Large => (vec![1024, 4096, 4096, 4096, 1024], 400, vec![1024; 9], 4000),
        };
        let max_batch = if self == Scale::Test { 32 } else { 512 };
        vec![
            Workload {
                name: "mlp",
                widths: mlp_widths,
                batch: (1, max_batch),
                requests: mlp_requests,
            },
            Workload {
                name: "small",
                widths: small_widths,
                batch: (1, 8),
                requests: small_requests,
            },
        ]
    }
}

/// What to run, beyond the scale.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Run only the workload of this name (`small` or `mlp`).
    pub only: Option<String>,
    /// The contexts' `max_ops_per_batch` (`None`: the default): a request's ops are submitted in
    /// batches of this many, so that the GPU starts on the first ops while the CPU records the
    /// next.
    pub max_ops_per_batch: Option<u32>,
    /// The `small` workload's layer width, in place of the scale's (1024 with `--large`).
    pub small_width: Option<usize>,
    /// The `small` workload's number of layers, in place of the scale's (8 with `--large`).
    pub small_layers: Option<usize>,
    /// `MatmulOptions::autotune` of every side (the planned side tunes while it builds its
    /// plans): the library's default (tuned on a GPU), `--autotune` (also on a software GPU) or
    /// `--no-autotune`.
    pub autotune: Autotune,
    /// `--dtype`: the element type of the weights, the inputs and every activation, on every
    /// side ([`DType::F16`] needs a device with `SHADER_F16`).
    pub dtype: DType,
    /// `--f32-as-f16`: `MatmulOptions::cooperative_f32_as_f16` on every side (f32 products on
    /// cooperative matrices, their operands rounded to f16, where the device has them).
    pub f32_as_f16: bool,
}

impl Settings {
    /// The context options of every side: unchecked kernels (every op validates shapes and
    /// offsets on the host), with the matmul options of these settings.
    fn context_options(&self) -> ContextOptions {
        let mut options = ContextOptions::unchecked();
        options.matmul.autotune = self.autotune;
        options.matmul.cooperative_f32_as_f16 = self.f32_as_f16;
        options
    }

    /// The largest relative difference of checksums the sides may show: the planned side fuses
    /// bias and GELU into its matmuls, rounding once where the eager sides round after each op,
    /// which in f16 moves the answers by a few f16 ulps (2⁻¹¹ each).
    pub fn checksum_tolerance(&self) -> f64 {
        match self.dtype {
            DType::F32 if !self.f32_as_f16 => 1e-4,
            _ => 1e-2,
        }
    }

    /// `workload` with the overrides of these settings applied.
    fn apply(&self, mut workload: Workload) -> Workload {
        if workload.name == "small" && (self.small_width.is_some() || self.small_layers.is_some()) {
            let width = self.small_width.unwrap_or(workload.widths[0]);
            let layers = self.small_layers.unwrap_or(workload.widths.len() - 1);
            workload.widths = vec![width; layers + 1];
        }
        workload
    }
}

/// What one side (pool or naive) did with one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Requests served per second, after warm-up: the median round's.
    pub requests_per_s: f64,
    /// Requests per second of every round, in the order they ran.
    pub rounds_requests_per_s: Vec<f64>,
    /// Time per allocation (allocate + free) of the workload's sizes, measured apart, in ns.
    pub alloc_ns: f64,
    /// Buffers created over the whole run (segments for the pool).
    pub create_buffer_calls: u64,
    /// Buffers created after the warm-up.
    pub create_buffer_calls_after_warmup: u64,
    /// Most bytes held in buffers at once.
    pub peak_reserved_bytes: u64,
    /// Most bytes asked for at once.
    pub peak_requested_bytes: u64,
    /// The most the device said it had allocated in total while serving (wgpu's allocator report;
    /// `None` where the backend reports nothing, as on GL and Metal).
    pub device_reported_bytes: Option<u64>,
    /// Every buffer this crate held on the device at the moment `device_reported_bytes` was read
    /// (`Gpu::accounted`: the pools' segments, read-back staging, kernel parameters, plans'
    /// read-back), the largest of those samples; with the device's figure beside it, what
    /// wgpu holds of its own.
    pub accounted_bytes: u64,
    /// Mean CPU time per request spent recording its ops (allocations, bind groups, dispatches)
    /// and uploading its input, in µs, after warm-up (0 for `planned`: see `read_us`).
    pub record_us: f64,
    /// Mean time per request spent in the read-back (submit, wait for the GPU, map, copy), in µs;
    /// for `planned`, the whole replay (input written, dispatches recorded, submit, read-back).
    pub read_us: f64,
    /// `1 - requested / allocated` at the end of the run.
    pub internal_fragmentation: f64,
    /// `1 - largest free block / free` at the end of the run.
    pub external_fragmentation: f64,
    /// A checksum of every probability read back, `Σ p_i · (i mod 7 + 1)` over every request
    /// (the sides must agree).
    pub checksum: f64,
    /// The answers to the first and the last request, compared element by element across the
    /// sides (softmax rows of similar values make the checksum a weak test on its own).
    #[serde(skip)]
    pub probe: Vec<f32>,
    /// `planned` only: the bytes of the arena the plans share (the largest plan's heap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_heap_bytes: Option<u64>,
    /// `planned` only: the most bytes of intermediates alive at once in the largest plan (the
    /// one whose heap sizes the arena; no arena can be smaller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_max_live_bytes: Option<u64>,
    /// `planned` only: what greedy-by-size (TFLite's planner) needs for the largest plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_greedy_by_size_bytes: Option<u64>,
    /// `planned` only: plans built (one per batch size drawn) and the seconds that took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plans: Option<usize>,
    /// `planned` only: seconds spent capturing and planning, before the timed requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_build_s: Option<f64>,
    /// The weights' bytes (each layer's matrix and bias).
    pub weights_bytes: u64,
}

/// Both sides of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The workload.
    pub workload: Workload,
    /// With the pool.
    pub pool: Side,
    /// One buffer per allocation.
    pub naive: Side,
    /// Captured, planned and replayed.
    pub planned: Side,
    /// The pool's requests/s over naive's.
    pub speedup: f64,
    /// Planned requests/s over the pool's.
    pub planned_speedup: f64,
    /// The element type of the weights, inputs and activations (`f32` or `f16`).
    pub dtype: &'static str,
}

/// The whole run, as `--json` writes it: the `small` workload's figures at the top (the one where
/// allocation costs dominate), every workload under `workloads`.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    adapter: String,
    backend: String,
    /// The device was opened with cooperative matrices (`--cooperative-matrix`).
    cooperative_matrix: bool,
    /// The element type of the weights, inputs and activations (`--dtype`).
    dtype: &'static str,
    /// f32 products may run on cooperative matrices with f16 operands (`--f32-as-f16`).
    f32_as_f16: bool,
    pool: &'a Side,
    naive: &'a Side,
    planned: &'a Side,
    speedup: f64,
    workloads: &'a [Comparison],
}

/// The command line, parsed.
#[derive(Debug)]
pub struct Args {
    /// `--large`: [`Scale::Large`], else [`Scale::Default`].
    pub scale: Scale,
    /// `--out DIR`: where the memory report goes.
    pub out: PathBuf,
    /// `--json OUT`.
    pub json: Option<PathBuf>,
    /// `--profile`.
    pub profile: bool,
    /// `--cooperative-matrix`: open the device with cooperative matrices where the adapter has
    /// them (`GpuOptions::cooperative_matrix`): f16 products of 16 rows and more run on them
    /// (with `--dtype f16`, or f32 ones with `--f32-as-f16`); f32 figures do not change otherwise.
    pub cooperative_matrix: bool,
    /// `--only`, `--batch-ops`, `--width`, `--layers`.
    pub settings: Settings,
}

/// The widest `--width` accepted here; the device's binding limit is checked in [`run`].
pub const MAX_WIDTH: usize = 1 << 16;
/// The most `--layers` accepted.
pub const MAX_LAYERS: usize = 1024;

/// Parses the arguments after the program's name.
pub fn parse_args(arguments: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut args = Args {
        scale: Scale::Default,
        out: PathBuf::from("target/pool_vs_naive"),
        json: None,
        profile: false,
        cooperative_matrix: false,
        settings: Settings::default(),
    };
    // A positive number following a flag.
    let positive = |flag: &str, value: Option<String>| -> Result<usize> {
        let value = value.with_context(|| format!("{flag} needs a number"))?;
        match value.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("{flag} needs a positive number, not {value:?}"),
        }
    };
    let mut iter = arguments.into_iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--large" => args.scale = Scale::Large,
            "--out" => args.out = iter.next().context("--out needs a directory")?.into(),
            "--json" => args.json = Some(iter.next().context("--json needs a file")?.into()),
            "--profile" => args.profile = true,
            "--cooperative-matrix" => args.cooperative_matrix = true,
            "--autotune" => args.settings.autotune = Autotune::Always,
            "--no-autotune" => args.settings.autotune = Autotune::Off,
            "--f32-as-f16" => args.settings.f32_as_f16 = true,
            "--dtype" => {
                let name = iter.next().context("--dtype needs a type: f32 or f16")?;
                args.settings.dtype = match name.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    _ => bail!("--dtype takes f32 or f16, not {name:?}"),
                };
            }
            "--batch-ops" => {
                let ops = iter.next().context("--batch-ops needs a number")?;
                args.settings.max_ops_per_batch =
                    Some(ops.parse().context("--batch-ops needs a number")?);
            }
            "--width" => {
                let width = positive("--width", iter.next())?;
                if width % 4 != 0 || width > MAX_WIDTH {
                    bail!("--width needs a multiple of 4 up to {MAX_WIDTH}, not {width}");
                }
                args.settings.small_width = Some(width);
            }
            "--layers" => {
                let layers = positive("--layers", iter.next())?;
                if layers > MAX_LAYERS {
                    bail!("--layers takes at most {MAX_LAYERS}, not {layers}");
                }
                args.settings.small_layers = Some(layers);
            }
            "--only" => {
                let name = iter
                    .next()
                    .context("--only needs a workload: small or mlp")?;
                if name != "small" && name != "mlp" {
                    bail!("--only takes small or mlp, not {name:?}");
                }
                args.settings.only = Some(name);
            }
            other => bail!(
                "unknown argument {other}\n\
                 usage: pool_vs_naive [--large] [--out DIR] [--json OUT] [--profile] \
                 [--only small|mlp] [--batch-ops N] [--width W] [--layers L] [--autotune|--no-autotune] \
                 [--cooperative-matrix] [--dtype f32|f16] [--f32-as-f16]"
            ),
        }
    }
    let shaped = args.settings.small_width.is_some() || args.settings.small_layers.is_some();
    if shaped && args.settings.only.as_deref() == Some("mlp") {
        bail!("--width and --layers shape the small workload, which --only mlp leaves out");
    }
    Ok(args)
}

fn main() -> Result<()> {
    env_logger::init();
    let args = parse_args(std::env::args().skip(1))?;
    // Getting the device is kept apart from using it: the tests call `run` on their own device.
    let options = GpuOptions::default()
        .with_limits(LimitsChoice::Adapter)
        .with_cooperative_matrix(args.cooperative_matrix);
    let gpu = request_gpu_with(options)?;
    println!("adapter: {gpu}");
    println!("cooperative matrices: {}", gpu.cooperative_matrix());
    println!(
        "element type: {}{}",
        args.settings.dtype.name(),
        if args.settings.f32_as_f16 {
            " (f32 products on cooperative matrices with f16 operands where the device has them)"
        } else {
            ""
        }
    );
    let settings = args.settings;
    let comparisons = run(&gpu, args.scale, &settings, Some(&args.out), true)?;
    if args.profile {
        for comparison in &comparisons {
            let name = comparison.workload.name;
            let rows = profile(&gpu, args.scale, &settings, name)?;
            if rows.is_empty() {
                println!("\n--profile: this adapter has no timestamp queries");
                break;
            }
            let total: f64 = rows.iter().map(|row| row.2).sum();
            println!("\n== GPU time of a {name} request, by kernel (pool, timestamps)");
            for (kernel, count, us) in &rows {
                println!("{kernel:<44} {count:>6.2} per request {us:>9.1} µs");
            }
            println!("{:<44} {:>19} {total:>9.1} µs", "total", "");
            let wall = 1e6 / comparison.pool.requests_per_s;
            println!(
                "{:<44} {:>19} {wall:>9.1} µs (GPU busy {:.0}%)",
                "a request's wall time when served above",
                "",
                100.0 * total / wall
            );
        }
    }

    if let Some(path) = &args.json {
        // The top-level sides: the small workload's, or the one workload run (`--only`).
        let main = comparisons
            .iter()
            .find(|c| c.workload.name == "small")
            .or_else(|| comparisons.first())
            .context("--json needs a workload")?;
        let report = JsonReport {
            adapter: gpu.info.name.clone(),
            backend: format!("{:?}", gpu.info.backend),
            cooperative_matrix: gpu.cooperative_matrix(),
            dtype: settings.dtype.name(),
            f32_as_f16: settings.f32_as_f16,
            pool: &main.pool,
            naive: &main.naive,
            planned: &main.planned,
            speedup: main.speedup,
            workloads: &comparisons,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs every workload of `scale` with the pool and naively; writes the pool's memory report of
/// the `mlp` workload into `out` when given.
pub fn run(
    gpu: &Gpu,
    scale: Scale,
    settings: &Settings,
    out: Option<&std::path::Path>,
    verbose: bool,
) -> Result<Vec<Comparison>> {
    let mut comparisons = Vec::new();
    if settings.dtype == DType::F16 && !gpu.device.features().contains(wgpu::Features::SHADER_F16) {
        bail!(
            "--dtype f16 needs a device with SHADER_F16, which {} ({:?}) was not opened with",
            gpu.info.name,
            gpu.info.backend
        );
    }
    let max_binding = gpu.device.limits().max_storage_buffer_binding_size;
    for workload in scale.workloads() {
        let workload = settings.apply(workload);
        // A layer's weights are one tensor: it must fit a binding of this device.
        let widest = workload.widths.iter().max().copied().unwrap_or(0) as u64;
        let weight_bytes = widest
            .saturating_mul(widest)
            .saturating_mul(settings.dtype.size_bytes());
        if weight_bytes > max_binding {
            bail!(
                "{}: a {widest} x {widest} layer of weights takes {weight_bytes} bytes, above this \
                 device's max_storage_buffer_binding_size of {max_binding}",
                workload.name
            );
        }
        if settings
            .only
            .as_ref()
            .is_some_and(|name| name != workload.name)
        {
            continue;
        }
        if verbose {
            println!(
                "\n== {}: widths {:?}, batches of {} to {} rows, {} requests",
                workload.name,
                workload.widths,
                workload.batch.0,
                workload.batch.1,
                workload.requests
            );
        }
        // The sides alternate (pool, naive, pool, naive, ...) for a few rounds, and each reports
        // its median round by requests/s: the GPU's clocks and the machine's other load vary
        // from second to second, and alternating exposes both sides to them alike.
        let rounds = scale.rounds();
        let mut pooled_rounds = Vec::new();
        let mut naive_rounds = Vec::new();
        let mut planned_rounds = Vec::new();
        for round in 0..rounds {
            // 1. The pool. For the workload whose memory report is written it records its history,
            //    so that the report can draw it (history is off by default; on, it costs about
            //    0.15 µs per allocation).
            let history = (workload.name == "mlp").then(HistoryOptions::default);
            let pool = Pool::new(
                gpu,
                PoolOptions {
                    history,
                    ..PoolOptions::default()
                },
            )?;
            let (side, sizes) = serve(&pool, &workload, settings)?;
            let last_round = round + 1 == rounds;
            if verbose && last_round {
                println!("\n{}", Report::from_pool(&pool));
            }
            if let (Some(dir), "mlp", true) = (out, workload.name, last_round) {
                write_exports(&pool, dir)?;
                if verbose {
                    println!(
                        "the memory report of the pool's run is in {}",
                        dir.display()
                    );
                }
            }
            pool.set_history(None);
            pooled_rounds.push(Side {
                alloc_ns: time_allocations(&pool, &sizes),
                ..side
            });
            drop(pool);

            // 2. The same requests, one buffer per tensor.
            let naive = Pool::naive(gpu, PoolOptions::default());
            let (side, _) = serve(&naive, &workload, settings)?;
            naive_rounds.push(Side {
                alloc_ns: time_allocations(&naive, &sizes),
                ..side
            });
            drop(naive);

            // 3. The same requests, captured, planned and replayed. Nothing is allocated per
            //    request: the weights and the arena are allocated once, each a buffer of its exact
            //    size (the pool's exact mode, `Pool::naive`), so the memory is theirs alone.
            let pool = Pool::naive(gpu, PoolOptions::default());
            let (side, csv) = serve_planned(&pool, &workload, settings)?;
            planned_rounds.push(side);
            if let (Some(dir), "mlp", true) = (out, workload.name, last_round) {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join("plan.csv"), csv)?;
            }
        }
        let pooled = median_round(pooled_rounds)?;
        let naive_side = median_round(naive_rounds)?;
        let planned = median_round(planned_rounds)?;
        for (name, side) in [("naive", &naive_side), ("planned", &planned)] {
            let relative = (pooled.checksum - side.checksum).abs() / side.checksum.abs().max(1.0);
            if relative > settings.checksum_tolerance() {
                bail!(
                    "the pool and {name} runs disagree: checksums {} and {}",
                    pooled.checksum,
                    side.checksum
                );
            }
        }
        let speedup = pooled.requests_per_s / naive_side.requests_per_s;
        let planned_speedup = planned.requests_per_s / pooled.requests_per_s;
        if verbose {
            print_table(&[
                ("pool", &pooled),
                ("naive", &naive_side),
                ("planned", &planned),
            ]);
            println!("speedup (pool requests/s over naive): {speedup:.2}x");
            println!("planned requests/s over the pool's: {planned_speedup:.2}x");
            if gpu.info.device_type == wgpu::DeviceType::Cpu {
                println!(
                    "note: {} is a software GPU: its buffers are host memory, cheap to create, \
                     so one buffer per tensor costs little here and the pool gains little in \
                     speed; its gains are in memory (above) and, on a real GPU, in the \
                     allocations' cost",
                    gpu.info.name
                );
            }
        }
        comparisons.push(Comparison {
            workload,
            pool: pooled,
            naive: naive_side,
            planned,
            speedup,
            planned_speedup,
            dtype: settings.dtype.name(),
        });
    }
    Ok(comparisons)
}

/// Serves the workload's requests on `pool`; returns the figures and every size allocated.
fn serve(pool: &Pool, workload: &Workload, settings: &Settings) -> Result<(Side, Vec<u64>)> {
    let mut options = settings.context_options();
    if let Some(ops) = settings.max_ops_per_batch {
        options.max_ops_per_batch = ops;
    }
    serve_with(pool, workload, options, settings.dtype).map(|(side, sizes, _)| (side, sizes))
}

/// [`serve`] with the given context options and tensors of `dtype`; also returns the context's
/// kernel timings (empty unless `options.profile`).
fn serve_with(
    pool: &Pool,
    workload: &Workload,
    options: ContextOptions,
    dtype: DType,
) -> Result<(Side, Vec<u64>, Vec<KernelTiming>)> {
    let gpu = pool.gpu();
    let ctx = Context::new(pool, options)?;
    let (layers, requests) = model_and_requests(&ctx, workload, dtype)?;

    let warmup = (workload.requests / 10).max(1);
    let mut checksum = 0.0f64;
    let mut probe = Vec::new();
    let mut device_reported: Option<u64> = None;
    let mut accounted = 0;
    let mut start = Instant::now();
    let mut creates_at_warmup = 0;
    let mut sizes = Vec::new();
    let (mut record_time, mut read_time) = (Duration::ZERO, Duration::ZERO);
    let sample_every = (workload.requests / 10).max(1);
    for (request, (rows, input)) in requests.iter().enumerate() {
        if request == warmup {
            ctx.sync()?;
            creates_at_warmup = pool.stats().create_segment_calls;
            start = Instant::now();
        }
        // A request: a batch of inputs, then the layers; every intermediate is a new tensor,
        // dropped as soon as the next one exists.
        let request_start = Instant::now();
        let mut x = ctx.tensor_with(input, &[*rows, workload.widths[0]], dtype)?;
        sizes.push(x.size_bytes());
        for (index, (weights, bias)) in layers.iter().enumerate() {
            let product = ctx.matmul(&x, weights)?;
            let biased = ctx.add_bias(&product, bias)?;
            sizes.extend([product.size_bytes(), biased.size_bytes()]);
            x = if index + 1 < layers.len() {
                let activated = ctx.gelu(&biased)?;
                sizes.push(activated.size_bytes());
                activated
            } else {
                biased
            };
        }
        let probabilities = ctx.softmax(&x)?;
        sizes.push(probabilities.size_bytes());
        drop(x);
        // The server answers: read the probabilities back.
        let read_start = Instant::now();
        let answer = ctx.read(&probabilities)?;
        if request >= warmup {
            record_time += read_start - request_start;
            read_time += read_start.elapsed();
        }
        checksum += answer_checksum(&answer);
        if request == 0 || request + 1 == workload.requests {
            probe.extend_from_slice(&answer);
        }
        if request % sample_every == 0 {
            // The crate's buffers and the device's figure read at one moment.
            accounted = accounted.max(gpu.accounted().total_bytes());
            if let Some(bytes) =
                AllocatorReport::from_device(&gpu.device, gpu.info.backend).total_allocated_bytes()
            {
                device_reported = Some(device_reported.unwrap_or(0).max(bytes));
            }
        }
    }
    ctx.sync()?;
    let elapsed = start.elapsed().max(Duration::from_nanos(1));
    let timings = ctx.take_kernel_timings();
    let stats = pool.stats();
    let served = (workload.requests - warmup) as f64;
    let side = Side {
        requests_per_s: served / elapsed.as_secs_f64(),
        rounds_requests_per_s: Vec::new(),
        record_us: record_time.as_secs_f64() * 1e6 / served,
        read_us: read_time.as_secs_f64() * 1e6 / served,
        alloc_ns: 0.0,
        create_buffer_calls: stats.create_segment_calls,
        create_buffer_calls_after_warmup: stats.create_segment_calls - creates_at_warmup,
        peak_reserved_bytes: stats.reserved_bytes.peak,
        peak_requested_bytes: stats.requested_bytes.peak,
        device_reported_bytes: device_reported,
        accounted_bytes: accounted,
        internal_fragmentation: stats.internal_fragmentation(),
        external_fragmentation: stats.external_fragmentation(),
        checksum,
        probe,
        plan_heap_bytes: None,
        plan_max_live_bytes: None,
        plan_greedy_by_size_bytes: None,
        plans: None,
        plan_build_s: None,
        weights_bytes: weights_bytes(&layers),
    };
    Ok((side, sizes, timings))
}

/// The model's layers (weights `[fan_in, fan_out]` and bias, stored as `dtype`) and every
/// request's `(rows, input)`, made before any request is served, from one seeded generator:
/// every side serves the same model and the same requests.
#[expect(clippy::type_complexity, reason = "two plain lists")]
fn model_and_requests(
    ctx: &Context,
    workload: &Workload,
    dtype: DType,
) -> Result<(Vec<(Tensor, Tensor)>, Vec<(usize, Vec<f32>)>)> {
    let mut rng = StdRng::seed_from_u64(7);
    // The model's weights live as long as the server: loaded once, before the first request.
    let layers: Vec<(Tensor, Tensor)> = workload
        .widths
        .windows(2)
        .map(|pair| {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let scale = (1.0 / fan_in as f32).sqrt();
            let weights: Vec<f32> = (0..fan_in * fan_out)
                .map(|_| rng.gen_range(-scale..scale))
                .collect();
            let bias: Vec<f32> = (0..fan_out).map(|_| rng.gen_range(-0.1..0.1)).collect();
            Ok((
                ctx.tensor_with(&weights, &[fan_in, fan_out], dtype)?,
                ctx.tensor_with(&bias, &[fan_out], dtype)?,
            ))
        })
        .collect::<Result<_>>()?;
    let requests = (0..workload.requests)
        .map(|request| {
            let rows = rng.gen_range(workload.batch.0..=workload.batch.1);
            let input: Vec<f32> = (0..rows * workload.widths[0])
                .map(|i| ((i * 31 + request) % 17) as f32 / 17.0 - 0.5)
                .collect();
            (rows, input)
        })
        .collect();
    Ok((layers, requests))
}

fn weights_bytes(layers: &[(Tensor, Tensor)]) -> u64 {
    layers
        .iter()
        .map(|(w, b)| w.size_bytes() + b.size_bytes())
        .sum()
}

/// `Σ p_i · (i mod 7 + 1)` over one answer.
fn answer_checksum(answer: &[f32]) -> f64 {
    // Sums of the elements of each residue mod 7, 28 independent sums at a time (index i adds to
    // sum i mod 28, whose residue mod 7 is i's), then weighted: no division and no single chain
    // of additions per element. A `%` per element and one running sum took 430-550 µs per 256K
    // elements on the dev machine (this: 70), where `serve.py` takes one vectorised dot product.
    let mut sums = [0.0f64; 28];
    let mut chunks = answer.chunks_exact(28);
    for chunk in &mut chunks {
        for (sum, &p) in sums.iter_mut().zip(chunk) {
            *sum += f64::from(p);
        }
    }
    for (sum, &p) in sums.iter_mut().zip(chunks.remainder()) {
        *sum += f64::from(p);
    }
    sums.iter()
        .enumerate()
        .map(|(i, sum)| sum * ((i % 7) as f64 + 1.0))
        .sum()
}

/// The forward of one request: matmul + bias + GELU per layer but the last, matmul + bias, and
/// the softmax. The eager sides run it per request; the planned side captures it once per batch
/// size.
fn forward(ctx: &Context, x: &Tensor, layers: &[(Tensor, Tensor)]) -> Result<Tensor> {
    let mut x = x.clone();
    for (index, (weights, bias)) in layers.iter().enumerate() {
        let product = ctx.matmul(&x, weights)?;
        let biased = ctx.add_bias(&product, bias)?;
        x = if index + 1 < layers.len() {
            ctx.gelu(&biased)?
        } else {
            biased
        };
    }
    Ok(ctx.softmax(&x)?)
}

/// Serves the workload's requests with plans: one per batch size drawn, captured and planned
/// before the timed requests, sharing one arena.
/// Also returns the largest plan's tensor lifetimes as MiniMalloc's CSV.
fn serve_planned(pool: &Pool, workload: &Workload, settings: &Settings) -> Result<(Side, String)> {
    let ctx = Context::new(pool, settings.context_options())?;
    let (layers, requests) = model_and_requests(&ctx, workload, settings.dtype)?;
    let build_start = Instant::now();
    let arena = ctx.plan_arena();
    let mut plans: std::collections::BTreeMap<usize, Plan> = Default::default();
    let sizes: std::collections::BTreeSet<usize> = requests.iter().map(|(rows, _)| *rows).collect();
    // Largest first: the arena is allocated once, at the size of the largest plan.
    for rows in sizes.iter().rev() {
        let mut capture = ctx.capture()?;
        let x = capture.input_with(&[*rows, workload.widths[0]], settings.dtype)?;
        let probabilities = forward(&ctx, &x, &layers)?;
        let options = CaptureOptions {
            arena: Some(arena.clone()),
            ..CaptureOptions::default()
        };
        plans.insert(*rows, capture.finish_with(&[&probabilities], options)?);
    }
    let plan_build_s = build_start.elapsed().as_secs_f64();
    let largest_plan = plans
        .values()
        .max_by_key(|plan| plan.stats().heap_bytes)
        .context("no request")?;
    let largest = largest_plan.stats().clone();
    let csv = largest_plan.lifetimes_csv();

    let warmup = (workload.requests / 10).max(1);
    let mut checksum = 0.0f64;
    let mut probe = Vec::new();
    let mut start = Instant::now();
    let mut creates_at_warmup = 0;
    let mut run_time = Duration::ZERO;
    for (request, (rows, input)) in requests.iter().enumerate() {
        if request == warmup {
            ctx.sync()?;
            creates_at_warmup = pool.stats().create_segment_calls;
            start = Instant::now();
        }
        let plan = plans.get_mut(rows).context("a plan per batch size")?;
        let run_start = Instant::now();
        let answer = plan.run(&[Feed::Data(input)])?;
        if request >= warmup {
            run_time += run_start.elapsed();
        }
        checksum += answer_checksum(&answer[0]);
        if request == 0 || request + 1 == requests.len() {
            probe.extend_from_slice(&answer[0]);
        }
    }
    let elapsed = start.elapsed().max(Duration::from_nanos(1));
    let stats = pool.stats();
    let served = (workload.requests - warmup) as f64;
    let side = Side {
        requests_per_s: served / elapsed.as_secs_f64(),
        rounds_requests_per_s: Vec::new(),
        alloc_ns: 0.0,
        create_buffer_calls: stats.create_segment_calls,
        create_buffer_calls_after_warmup: stats.create_segment_calls - creates_at_warmup,
        peak_reserved_bytes: stats.reserved_bytes.peak,
        peak_requested_bytes: stats.requested_bytes.peak,
        accounted_bytes: pool.gpu().accounted().total_bytes(),
        device_reported_bytes: AllocatorReport::from_device(
            &pool.gpu().device,
            pool.gpu().info.backend,
        )
        .total_allocated_bytes(),
        record_us: 0.0,
        read_us: run_time.as_secs_f64() * 1e6 / served,
        internal_fragmentation: stats.internal_fragmentation(),
        external_fragmentation: stats.external_fragmentation(),
        checksum,
        probe,
        plan_heap_bytes: Some(arena.bytes()),
        plan_max_live_bytes: Some(largest.max_live_bytes),
        plan_greedy_by_size_bytes: Some(largest.greedy_by_size_heap_bytes),
        plans: Some(plans.len()),
        plan_build_s: Some(plan_build_s),
        weights_bytes: weights_bytes(&layers),
    };
    Ok((side, csv))
}

/// Where a request's GPU time goes: the workload `name` of `scale` (with the overrides of
/// `settings`) served by the pool with
/// timestamps around every dispatch. Returns `(kernel, dispatches per request, GPU µs per
/// request)`, most expensive first; empty where the adapter has no timestamps.
pub fn profile(
    gpu: &Gpu,
    scale: Scale,
    settings: &Settings,
    name: &str,
) -> Result<Vec<(String, f64, f64)>> {
    let workload = scale
        .workloads()
        .into_iter()
        .find(|w| w.name == name)
        .map(|w| settings.apply(w))
        .with_context(|| format!("no workload {name}"))?;
    let pool = Pool::new(gpu, PoolOptions::default())?;
    let options = ContextOptions {
        profile: true,
        ..settings.context_options()
    };
    let (_, _, timings) = serve_with(&pool, &workload, options, settings.dtype)?;
    let requests = workload.requests as f64;
    let mut by_kernel: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for timing in timings {
        let entry = by_kernel.entry(timing.kernel).or_default();
        entry.0 += 1.0 / requests;
        entry.1 += timing.gpu_ns / 1e3 / requests;
    }
    let mut rows: Vec<_> = by_kernel
        .into_iter()
        .map(|(kernel, (count, us))| (kernel, count, us))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    Ok(rows)
}

/// The round with the median requests/s, holding every round's requests/s.
fn median_round(mut rounds: Vec<Side>) -> Result<Side> {
    let all: Vec<f64> = rounds.iter().map(|side| side.requests_per_s).collect();
    rounds.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
    let middle = rounds.len().checked_sub(1).context("no round ran")? / 2;
    Ok(Side {
        rounds_requests_per_s: all,
        ..rounds.swap_remove(middle)
    })
}

/// ns per allocate + free of the workload's sizes, on their own (no kernels): the pool's cost
/// against `create_buffer` and drop.
fn time_allocations(pool: &Pool, sizes: &[u64]) -> f64 {
    let count = sizes.len().min(20_000);
    let start = Instant::now();
    for (i, &size) in sizes.iter().take(count).enumerate() {
        let allocation = pool
            .allocate(size)
            .expect("the workload's sizes were served before");
        drop(allocation);
        if i % 16 == 15 {
            pool.mark_submitted();
        }
    }
    pool.mark_submitted();
    start.elapsed().as_nanos() as f64 / count.max(1) as f64
}

fn print_table(sides: &[(&str, &Side)]) {
    // One row: a label and each side's figure, formatted by `show`.
    let row = |label: &str, show: &dyn Fn(&Side) -> String| {
        let cells: String = sides
            .iter()
            .map(|(_, side)| format!(" {:>16}", show(side)))
            .collect();
        println!("{label:<34}{cells}");
    };
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64);
    let percent = |x: f64| format!("{:.1}%", x * 100.0);
    println!();
    let names: String = sides
        .iter()
        .map(|(name, _)| format!(" {name:>16}"))
        .collect();
    println!("{:<34}{names}", "");
    row("requests/s (median round)", &|s| {
        format!("{:.1}", s.requests_per_s)
    });
    for (name, side) in sides {
        let rounds: Vec<String> = side
            .rounds_requests_per_s
            .iter()
            .map(|rate| format!("{rate:.0}"))
            .collect();
        println!("  every round, {name}: {}", rounds.join(", "));
    }
    row("  µs recording a request", &|s| {
        format!("{:.1}", s.record_us)
    });
    row("  µs reading its answer back", &|s| {
        format!("{:.1}", s.read_us)
    });
    row("ns per allocation (apart)", &|s| {
        format!("{:.0}", s.alloc_ns)
    });
    row("create_buffer calls", &|s| {
        s.create_buffer_calls.to_string()
    });
    row("  after warm-up", &|s| {
        s.create_buffer_calls_after_warmup.to_string()
    });
    row("peak reserved", &|s| mib(s.peak_reserved_bytes));
    row("peak requested", &|s| mib(s.peak_requested_bytes));
    row("  of which weights", &|s| mib(s.weights_bytes));
    row(
        "plan arena / max-live",
        &|s| match (s.plan_heap_bytes, s.plan_max_live_bytes) {
            (Some(heap), Some(live)) => format!("{} / {}", mib(heap), mib(live)),
            _ => "-".into(),
        },
    );
    row("device reports allocated (max)", &|s| {
        s.device_reported_bytes
            .map_or_else(|| "not reported".into(), mib)
    });
    row("  of which this crate's buffers", &|s| {
        mib(s.accounted_bytes)
    });
    row("internal / external fragmentation", &|s| {
        percent(s.internal_fragmentation)
    });
    row("", &|s| percent(s.external_fragmentation));
}
