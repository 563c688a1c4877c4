//! Benchmark of the compute kernels: matmul GFLOP/s, element-wise GB/s, and the CPU cost of
//! recording an op, every result checked against its CPU twin.
//!
//! ```text
//! cargo run --release --example bench_kernels -- [--json OUT] [--large] [--checked]
//!     [--autotune|--no-autotune]
//!     [--only matmul|elementwise|overhead] [--matmul MxNxK]... [--tile BMxBNxBK[/TMxTN]]...
//!     [--group-rows N] [--op add|relu|gelu|sum]... [--n N]... [--serving] [--torch FILE]
//!     [--split N]... [--narrow-lanes L]... [--narrow-splits S]... [--narrow-subgroups on|off]...
//!     [--narrow-row-groups G]
//!     [--dtype f32|f16] [--sustained SECS] [--chain-shape RxW] [--chain-plan LxS]...
//!     [--chain-runs N] [--cooperative-matrix] [--coop-tile NAME]... [--coop-probe NAME]...
//! ```
//!
//! - The default sizes fit a software GPU (lavapipe, llvmpipe); `--large` is for real GPUs: square
//!   matmuls up to 4096³ (also with every tile that fits, to compare them), skinny ones of 4096,
//!   element-wise ops up to 64M elements.
//! - Kernels are compiled unchecked (`ShaderChecks::Unchecked`: the ops validate every shape on
//!   the host); `--checked` keeps wgpu's bounds checks, to measure what they cost. Each case's
//!   context chooses the tiled kernel's tile and split-K by measurement on a GPU (the default of
//!   `MatmulOptions::autotune`; the table shows the choice); `--no-autotune` measures the rules'
//!   plans instead, `--autotune` tunes on a software GPU too.
//! - Runs are recorded back to back into one batch after 100 ms of warm-up. Time is GPU time from
//!   timestamps where the adapter has `TIMESTAMP_QUERY` (around each dispatch with
//!   `TIMESTAMP_QUERY_INSIDE_PASSES`), from a run's first kernel's start to its last kernel's end
//!   (so a split product counts the barrier before its reduction), the median over the runs; else the wall clock around
//!   recording the batch, submitting it and waiting, divided by the runs.
//! - GFLOP/s = 2·M·N·K / time. GB/s counts the bytes read and written (`add`: 12 per element).
//! - Checks: matmuls up to 2^28 multiply-adds against the whole CPU product, larger ones on
//!   sampled rows and columns (corners included). `max_rel_err` of a matmul is the largest
//!   `|gpu − cpu| / Σ_k |a_ik·b_kj|` (the error relative to the magnitude of the terms; the bound
//!   for f32 is about 2K·2⁻²⁴); of an element-wise op, the largest `|gpu − cpu| / |cpu|`.
//! - Op overhead: the CPU time to record one small `add` into an open pass (allocating its
//!   output from the pool, finding its bind group, writing its parameters, dispatching), averaged
//!   over 10,000, with warm caches; also with its share of ending the pass and submitting.
//! - Round trip: the wall time of one tiny `add` recorded, submitted and read back, and what each
//!   further dependent `add` in the same batch adds to it (the floor of a small request).
//! - `--only` runs one section; `--matmul MxNxK` (repeatable) measures these shapes instead of
//!   the default list (with `--large`, also with every tile that fits); `--tile` (repeatable)
//!   measures only these tiles of `MatmulTiles::ALL`, in this order, where `--large` measures
//!   every tile (e.g. `--tile 128x128x8 --tile 128x128x8/16x8`); `--group-rows N` sets
//!   `MatmulOptions::group_rows`; `--op` (repeatable) measures only these element-wise ops, in
//!   this order; `--n N` (repeatable, a multiple of 4096) these sizes instead of the default ones.
//! - The element-wise section also times `sum` over rows of 4096 (`Context::sum`): a pure read,
//!   the floor of a product of one row, which reads its weights once. Each row also gets its time
//!   in a stream (as the matmuls' below: `stream_us`, `stream_gbs`); with `--torch` (the JSON of
//!   `matmul.py --elementwise`), PyTorch's beside it and the ratio.
//! - `--serving` measures the shapes of a server's products ([`SERVING`]: batches of 1 to 512 rows
//!   through 4096-wide layers, and 4096³) with the automatic plans, and the wall time that each
//!   further dependent 8x1024x1024 product adds to a chain read back at its end
//!   (`matmul_chain_step_us`). `--large` includes the serving shapes in its list.
//! - `--chain-shape RxW`: the chain's products are `R × W × W` (8x1024 by default);
//!   `--chain-plan LxS` (repeatable): the planned chain is also timed with the narrow kernel's
//!   lanes and splits forced to L and S, each right after the automatic plan, in three rounds
//!   (JSON `matmul_chain_plans`: `[{"lanes", "splits", "plan_step_us", "automatic_plan_step_us"}]`).
//!   The chain runs with `--serving` or `--chain-plan`, in the matmul section; `--chain-runs N`
//!   times N chains of each length (101 by default; the median counts).
//! - `--split N` (repeatable): with `--large` and `--matmul`, every compared tile is measured with
//!   each of these split-K counts (`MatmulOptions::split_k`) instead of the automatic one.
//! - `--narrow-lanes L`, `--narrow-splits S`, `--narrow-subgroups on|off` (repeatable): each
//!   `--matmul` shape of at most 8 rows is also measured with the narrow kernel's lanes
//!   (`MatmulOptions::narrow_lanes`), splits along K (`MatmulOptions::narrow_splits`) and
//!   subgroup shuffles (`MatmulOptions::narrow_subgroups`) forced, every combination of the
//!   listed values (those not listed automatic), after its automatic plan. Without them,
//!   `--large` measures lanes 1 to 64 with the rest automatic. The kernel column reads
//!   `narrow xL` (L lanes), with `sgS` where subgroups of S add slices by shuffles and `gG` where
//!   the rows are in G groups (`--narrow-row-groups G`: `MatmulOptions::narrow_row_groups` for
//!   every case, which turns the tuning of narrow plans off).
//! - `--dtype f16` measures the matmuls and the element-wise ops on f16 tensors (f32 arithmetic;
//!   the device needs `SHADER_F16`): the operands are the f16 roundings of the same random values,
//!   the twin computes on them and rounds to f16, and the checks allow an f16 ulp more (2⁻¹⁰ of
//!   the magnitude; element-wise errors over results of at least the smallest normal f16, 2⁻¹⁴,
//!   since a device may flush subnormals); GB/s counts 2-byte elements. The chain of dependent products and the op
//!   overhead stay f32.
//! - `--cooperative-matrix` opens the device with cooperative matrices where the adapter has
//!   them (`GpuOptions::cooperative_matrix`; the first lines printed say whether it did): with
//!   `--dtype f16`, products of at least 16 rows then run on them (the tensor cores; kernel
//!   column `coop NAME`, the tile's `CoopTiles::name`). `--coop-tile NAME` (repeatable;
//!   `CoopTiles::ALL`: 128x128, 128x256, 64x128, 64x64, 32x128, and with K in slabs of 64,
//!   128x128x64, 128x128x64w, 64x128x64; or any tile as `BMxBN[xBK]/WMxWN`, e.g.
//!   `128x256/64x64`) also measures each shape with that tile forced, after its automatic plan
//!   (JSON `forced_coop_tiles`; `cooperative` says which kernel ran); a tile the device's limits
//!   refuse is named and left out. `--coop-probe NAME` (repeatable; `no-global-loads`,
//!   `no-staging`, `products-only`: `CoopProbe`) also measures each forced tile (the automatic
//!   one where none is) with that part of its loop over K left out, to say where the time goes;
//!   its results are not the product and are not checked (kernel column `coop NAME PROBE`, JSON
//!   `coop_probe`, `max_rel_err` null).
//! - `--torch FILE` reads the JSON of `benches/torch/matmul.py` (PyTorch on the same GPU, fp32,
//!   TF32 off; with `--dtype f16`, the JSON of `matmul.py --dtype half`, which must match) and prints its time beside ours for each shape with an automatic plan, and the ratio
//!   ours / PyTorch's; the JSON gains `torch_time_us` and `ratio` per product and
//!   `torch_chain_step_us`. Run both in one session of the GPU: its clocks vary between sessions.
//! - A clock probe (a square product, doubled from 256 until it takes at least 20 µs) runs
//!   before and after each matmul measurement; every shape whose probe ran 10% slower than the
//!   fastest probe of the process was measured while the GPU's clock was down (under Vulkan the
//!   H200's SM clock can fall to a quarter for seconds), and is measured again, up to three
//!   times once the probe shows the clock back up (waiting up to 60 s in all), keeping the
//!   measurement with the fastest probe (JSON `clock_probe_us`, `measurements`, `clock_low`
//!   where even the kept one was measured at a lower clock, and `clock_probe`).
//! - In one process, large products measured one after another can slow down for the rest of
//!   the process (on the H200, after about six 4096³ ones; see src/compute/ops/matmul/mod.rs): compare
//!   tiles in separate processes, or early in one.
//! - Each matmul also gets a time per product **in a stream** (`stream (µs)`, JSON `stream_us`):
//!   in a context without timestamps, as many products as take about 2 ms recorded back to back,
//!   the wall clock from their submission until the GPU is done, divided by their number (the
//!   median of five such batches). It counts what a workload pays between dispatches (the
//!   barriers) and nothing of the timestamps, which slow short dispatches down on some drivers
//!   (on the H200 under Vulkan by several µs each). `matmul.py` measures PyTorch's the same way
//!   (CUDA events around the batch); `--torch` prints it and the ratio beside.
//! - `--sustained SECS`: instead of the sections, each `--matmul` shape (4096³ without one) runs
//!   back to back for SECS seconds (batches of about 20 ms of products, each recorded while the
//!   one before runs and submitted when it is done; no timestamps), timed by the wall clock:
//!   TFLOP/s over the run, over its first and last whole second and its slowest; the last product checked against the twin. With `--torch` (the JSON
//!   of `matmul.py --sustained SECS`), PyTorch's figure and the ratio beside. The JSON: `{"adapter",
//!   "backend", "dtype", "sustained": [{"m", "n", "k", "tiles", "seconds", "products", "tflops",
//!   "windows_tflops", "max_rel_err", "torch_tflops", "ratio"}]}`. A GPU whose clock follows its
//!   load (the H200 under Vulkan) shows here what a long job gets, where the short products of
//!   the sections show its peak. With `--narrow-lanes` or `--narrow-splits`, each shape of at
//!   most 8 rows also runs with every listed combination forced (rows marked `(forced)`; JSON
//!   `forced`, and `splits` for every row).
//!
//! The JSON (`--json OUT`): `{"adapter", "backend", "timing", "shader_checks", "dtype" ("f32" or
//! "f16"), "cooperative_matrix" (the device was opened with them), "cooperative_f16" (f16
//! products can run on them), "matmul": [{"m",
//! "n", "k", "gflops", "max_rel_err", "tiles", "splits", "time_us", "forced_tiles",
//! "forced_narrow_lanes", "forced_narrow_splits", "forced_narrow_subgroups",
//! "forced_coop_tiles", "coop_probe", "cooperative", "torch_time_us",
//! "ratio", "stream_us", "torch_stream_us", "stream_ratio", "clock_probe_us", "measurements",
//! "clock_low"}],
//! "clock_probe": {"size", "fastest_us", "slow_ratio"},
//! "elementwise": [{"op", "n", "gbs", "max_rel_err", "time_us", "stream_us", "stream_gbs",
//! "torch_stream_us", "stream_ratio"}], "op_overhead_us",
//! "op_overhead_with_submit_us", "round_trip_us", "chain_step_us", "matmul_chain_single_us",
//! "matmul_chain_step_us", "matmul_plan_chain_single_us", "matmul_plan_chain_step_us",
//! "matmul_chain_shape", "matmul_chain_plans", "torch_chain_step_us"}`. A section not run has an
//! empty list or `null`.
//!
//! On a real GPU: `cargo run --release --example bench_kernels -- --large --json kernels.json`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context as _};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use wgpu_pool::compute::{
    cpu, Autotune, BinaryOp, Context, ContextOptions, CoopProbe, CoopTiles, DType, Feed,
    KernelTiming, MatmulOptions, MatmulPlan, MatmulTiles, ShaderChecks, Tensor, TimestampSupport,
    UnaryOp,
};
use wgpu_pool::{request_gpu_with, Gpu, GpuOptions, LimitsChoice, Pool, PoolOptions};

/// Command-line options.
struct Args {
    json: Option<PathBuf>,
    large: bool,
    checks: ShaderChecks,
    /// Run only this section: `matmul`, `elementwise` or `overhead`.
    only: Option<String>,
    /// Matmul shapes `(m, n, k)` to measure instead of the default list.
    matmuls: Vec<(usize, usize, usize)>,
    /// `MatmulOptions::group_rows`, if not the default.
    group_rows: Option<u32>,
    narrow_row_groups: Option<u32>,
    /// With `--large`, the tiles to compare (empty: every tile of `MatmulTiles::ALL`).
    tiles: Vec<MatmulTiles>,
    /// The element-wise ops to measure, in this order (empty: add, relu, gelu).
    ops: Vec<String>,
    /// Measure the serving shapes and the chain of dependent products.
    serving: bool,
    /// With `--large`, the split-K counts to force with each tile (empty: automatic).
    splits: Vec<u32>,
    /// PyTorch's figures (`benches/torch/matmul.py --json`) to print beside ours.
    torch: Option<PathBuf>,
    /// The narrow kernel's lanes to force on shapes of at most 8 rows.
    narrow_lanes: Vec<u32>,
    /// The narrow kernel's splits along K to force on shapes of at most 8 rows.
    narrow_splits: Vec<u32>,
    /// Whether the narrow kernel uses subgroups, forced on shapes of at most 8 rows.
    narrow_subgroups: Vec<bool>,
    /// `MatmulOptions::autotune`: the library's default (tuned on a GPU), `--autotune` (also on a
    /// software GPU) or `--no-autotune` (the rules alone).
    autotune: Autotune,
    /// What the matmuls' and element-wise ops' tensors hold (`--dtype`).
    dtype: DType,
    /// `--sustained SECS`: back-to-back products of each shape for this long, instead of the
    /// sections.
    sustained: Option<f64>,
    /// `--n N`: the element-wise sizes (empty: the defaults).
    sizes: Vec<usize>,
    /// `--chain-shape RxW`: the chain's rows and width (8 × 1024 by default).
    chain_shape: (usize, usize),
    /// `--chain-plan LxS`: narrow plans (lanes, splits) whose planned chains are timed beside
    /// the automatic plan's.
    chain_plans: Vec<(u32, u32)>,
    /// `--chain-runs N`: chains of each length timed per matmul chain figure (101).
    chain_runs: usize,
    /// `--cooperative-matrix`: the device is opened with cooperative matrices
    /// (`GpuOptions::cooperative_matrix`), so f16 products may run on them.
    cooperative_matrix: bool,
    /// `--coop-tile NAME` (repeatable): each shape is also measured with this tile of the
    /// cooperative matmul forced (`MatmulOptions::cooperative_tiles`).
    coop_tiles: Vec<CoopTiles>,
    /// `--coop-probe NAME` (repeatable): each cooperative case is also measured with this
    /// diagnostic (`MatmulOptions::cooperative_probe`; not a product, so not checked).
    coop_probes: Vec<CoopProbe>,
}

impl Args {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == section)
    }

    /// The tiles `--large` compares: those of `--tile` in their order, or all, where they fit
    /// the device.
    fn compared_tiles(&self, limits: &wgpu::Limits) -> Vec<MatmulTiles> {
        let tiles: &[MatmulTiles] = if self.tiles.is_empty() {
            &MatmulTiles::ALL
        } else {
            &self.tiles
        };
        tiles
            .iter()
            .copied()
            .filter(|tiles| tiles.check(limits).is_ok())
            .collect()
    }
}

fn parse_args(list: &[String]) -> anyhow::Result<Args> {
    let mut args = Args {
        json: None,
        large: false,
        checks: ShaderChecks::Unchecked,
        only: None,
        ops: Vec::new(),
        matmuls: Vec::new(),
        group_rows: None,
        narrow_row_groups: None,
        tiles: Vec::new(),
        serving: false,
        torch: None,
        splits: Vec::new(),
        narrow_lanes: Vec::new(),
        narrow_splits: Vec::new(),
        narrow_subgroups: Vec::new(),
        autotune: Autotune::default(),
        dtype: DType::F32,
        sustained: None,
        sizes: Vec::new(),
        chain_shape: (8, 1024),
        chain_plans: Vec::new(),
        chain_runs: 101,
        cooperative_matrix: false,
        coop_tiles: Vec::new(),
        coop_probes: Vec::new(),
    };
    let mut iter = list.iter().cloned();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--json" => args.json = Some(iter.next().context("--json needs a file")?.into()),
            "--large" => args.large = true,
            "--serving" => args.serving = true,
            "--cooperative-matrix" => args.cooperative_matrix = true,
            "--coop-tile" => {
                let name = iter
                    .next()
                    .context("--coop-tile needs BMxBN[xBK][/WMxWN]")?;
                let tiles = CoopTiles::named(&name).with_context(|| {
                    let all: Vec<String> = CoopTiles::ALL.iter().map(CoopTiles::name).collect();
                    format!(
                        "--coop-tile {name:?}: not one of {} nor BMxBN[xBK]/WMxWN",
                        all.join(", ")
                    )
                })?;
                args.coop_tiles.push(tiles);
            }
            "--coop-probe" => {
                let name = iter.next().context("--coop-probe needs a name")?;
                let probe = CoopProbe::named(&name).with_context(|| {
                    let all: Vec<&str> = CoopProbe::ALL.iter().map(|p| p.name()).collect();
                    format!("--coop-probe {name:?}: not one of {}", all.join(", "))
                })?;
                args.coop_probes.push(probe);
            }
            "--split" => {
                let splits = iter.next().context("--split needs a number")?;
                let splits: u32 = splits.parse().context("--split needs a number")?;
                if splits == 0 {
                    bail!("--split needs a number of at least 1");
                }
                args.splits.push(splits);
            }
            "--torch" => args.torch = Some(iter.next().context("--torch needs a file")?.into()),
            "--narrow-lanes" => {
                let lanes = iter.next().context("--narrow-lanes needs a number")?;
                let lanes: u32 = lanes.parse().context("--narrow-lanes needs a number")?;
                if !lanes.is_power_of_two() || lanes > 256 {
                    bail!("--narrow-lanes needs a power of two from 1 to 256");
                }
                args.narrow_lanes.push(lanes);
            }
            "--narrow-splits" => {
                let splits = iter.next().context("--narrow-splits needs a number")?;
                let splits: u32 = splits.parse().context("--narrow-splits needs a number")?;
                if splits == 0 {
                    bail!("--narrow-splits needs a number of at least 1");
                }
                args.narrow_splits.push(splits);
            }
            "--narrow-subgroups" => {
                let choice = iter.next().context("--narrow-subgroups needs on or off")?;
                args.narrow_subgroups.push(match choice.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => bail!("--narrow-subgroups takes on or off, not {choice:?}"),
                });
            }
            "--dtype" => {
                let dtype = iter.next().context("--dtype needs f32 or f16")?;
                args.dtype = DType::ALL
                    .into_iter()
                    .find(|candidate| candidate.name() == dtype)
                    .with_context(|| format!("--dtype takes f32 or f16, not {dtype:?}"))?;
            }
            "--sustained" => {
                let seconds = iter.next().context("--sustained needs seconds")?;
                let seconds: f64 = seconds.parse().context("--sustained needs seconds")?;
                if !(seconds.is_finite() && seconds > 0.0) {
                    bail!("--sustained needs a positive number of seconds");
                }
                args.sustained = Some(seconds);
            }
            "--checked" => args.checks = ShaderChecks::Checked,
            "--autotune" => args.autotune = Autotune::Always,
            "--no-autotune" => args.autotune = Autotune::Off,
            "--matmul" => {
                let shape = iter.next().context("--matmul needs MxNxK")?;
                let Some([m, n, k]) = dims::<usize, 3>(&shape) else {
                    bail!("--matmul {shape:?}: not MxNxK");
                };
                args.matmuls.push((m, n, k));
            }
            "--tile" => {
                let name = iter.next().context("--tile needs BMxBNxBK[/TMxTN]")?;
                let tiles = MatmulTiles::ALL
                    .into_iter()
                    .find(|tiles| tiles.to_string() == name)
                    .with_context(|| {
                        let all: Vec<String> =
                            MatmulTiles::ALL.iter().map(ToString::to_string).collect();
                        format!("--tile {name:?}: not one of {}", all.join(", "))
                    })?;
                args.tiles.push(tiles);
            }
            "--narrow-row-groups" => {
                let groups = iter.next().context("--narrow-row-groups needs a number")?;
                let groups: u32 = groups
                    .parse()
                    .context("--narrow-row-groups needs a number")?;
                if !(1..=MatmulOptions::NARROW_MAX_ROWS).contains(&groups) {
                    bail!(
                        "--narrow-row-groups needs a number from 1 to {}",
                        MatmulOptions::NARROW_MAX_ROWS
                    );
                }
                args.narrow_row_groups = Some(groups);
            }
            "--group-rows" => {
                let rows = iter.next().context("--group-rows needs a number")?;
                args.group_rows = Some(rows.parse().context("--group-rows needs a number")?);
            }
            "--op" => {
                let op = iter.next().context("--op needs add, relu, gelu or sum")?;
                if !["add", "relu", "gelu", "sum"].contains(&op.as_str()) {
                    bail!("--op takes add, relu, gelu or sum, not {op:?}");
                }
                args.ops.push(op);
            }
            "--n" => {
                let n = iter.next().context("--n needs a number of elements")?;
                let n: usize = n.parse().context("--n needs a number of elements")?;
                if n == 0 || !n.is_multiple_of(SUM_COLS) {
                    bail!("--n needs a positive multiple of {SUM_COLS} (the row of `sum`)");
                }
                args.sizes.push(n);
            }
            "--chain-shape" => {
                let shape = iter.next().context("--chain-shape needs RxW")?;
                match dims::<usize, 2>(&shape) {
                    Some([rows, width]) if rows > 0 && width > 0 => {
                        args.chain_shape = (rows, width)
                    }
                    _ => bail!("--chain-shape {shape:?}: not RxW (rows x width, not 0)"),
                }
            }
            "--chain-runs" => {
                let runs = iter.next().context("--chain-runs needs a number")?;
                let runs: usize = runs.parse().context("--chain-runs needs a number")?;
                if runs == 0 {
                    bail!("--chain-runs needs a number of at least 1");
                }
                args.chain_runs = runs;
            }
            "--chain-plan" => {
                let plan = iter.next().context("--chain-plan needs LxS")?;
                match dims::<u32, 2>(&plan) {
                    Some([lanes, splits])
                        if lanes.is_power_of_two() && lanes <= 256 && splits >= 1 =>
                    {
                        args.chain_plans.push((lanes, splits))
                    }
                    _ => bail!(
                        "--chain-plan {plan:?}: not LxS (lanes a power of two from 1 to 256, \
                         splits at least 1)"
                    ),
                }
            }
            "--only" => {
                let section = iter.next().context("--only needs a section")?;
                if !["matmul", "elementwise", "overhead"].contains(&section.as_str()) {
                    bail!("--only takes matmul, elementwise or overhead, not {section:?}");
                }
                args.only = Some(section);
            }
            "-h" | "--help" => {
                println!(
                    "bench_kernels [--json OUT] [--large] [--checked] [--autotune|--no-autotune] \
                     [--only matmul|elementwise|overhead] [--matmul MxNxK]... \
                     [--tile BMxBNxBK[/TMxTN]]... [--group-rows N] \
                     [--op add|relu|gelu|sum]... [--n N]... [--serving] [--torch FILE] \
                     [--split N]... [--narrow-lanes L]... [--narrow-splits S]... \
                     [--narrow-subgroups on|off]... [--dtype f32|f16] [--sustained SECS] \
                     [--chain-shape RxW] [--chain-plan LxS]... [--chain-runs N] \
                     [--cooperative-matrix] [--coop-tile NAME]... [--coop-probe NAME]..."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if args.serving && args.matmuls.is_empty() {
        args.matmuls = SERVING.to_vec();
    }
    Ok(args)
}

/// `N` numbers written `AxBx...` (`8x1024x1024`), or `None`.
fn dims<T: std::str::FromStr, const N: usize>(text: &str) -> Option<[T; N]> {
    let parsed: Option<Vec<T>> = text.split('x').map(|part| part.parse().ok()).collect();
    parsed?.try_into().ok()
}

/// The values of a repeatable option to force, or the automatic choice (`None`) alone when none
/// is listed.
fn forced_or_automatic<T: Copy>(listed: &[T]) -> Vec<Option<T>> {
    if listed.is_empty() {
        vec![None]
    } else {
        listed.iter().copied().map(Some).collect()
    }
}

/// The shapes `(m, n, k)` of a server's products: a batch of `m` rows through a layer of `k`
/// inputs and `n` outputs.
const SERVING: [(usize, usize, usize); 10] = [
    (1, 4096, 4096),
    (8, 4096, 4096),
    (64, 4096, 4096),
    (128, 4096, 4096),
    (256, 4096, 4096),
    (512, 4096, 4096),
    (256, 4096, 1024),
    (256, 1024, 4096),
    (8, 1024, 1024),
    (4096, 4096, 4096),
];

/// PyTorch's figures from `benches/torch/matmul.py --json`.
struct Torch {
    /// PyTorch's name of the operands' type: `float32` (files without one) or `float16`.
    dtype: String,
    /// Time per product by shape, in µs (the median).
    products: std::collections::HashMap<(usize, usize, usize), f64>,
    /// Time per product in a stream by shape, in µs (files with `stream_us`).
    stream: std::collections::HashMap<(usize, usize, usize), f64>,
    chain_step_us: Option<f64>,
    /// TFLOP/s over `--sustained` runs by shape.
    sustained: std::collections::HashMap<(usize, usize, usize), f64>,
    /// Time per element-wise op in a stream by (op, elements), in µs (files of `matmul.py
    /// --elementwise`).
    elementwise: std::collections::HashMap<(String, usize), f64>,
}

impl Torch {
    fn read(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        let mut products = std::collections::HashMap::new();
        let mut stream = std::collections::HashMap::new();
        for entry in json["matmul"]
            .as_array()
            .with_context(|| format!("{}: no \"matmul\" list", path.display()))?
        {
            let dim = |name: &str| {
                entry[name]
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .with_context(|| format!("{}: a product without {name:?}", path.display()))
            };
            let time_us = entry["time_us"]
                .as_f64()
                .with_context(|| format!("{}: a product without \"time_us\"", path.display()))?;
            let shape = (dim("m")?, dim("n")?, dim("k")?);
            products.insert(shape, time_us);
            if let Some(stream_us) = entry["stream_us"].as_f64() {
                stream.insert(shape, stream_us);
            }
        }
        let mut sustained = std::collections::HashMap::new();
        for entry in json["sustained"].as_array().into_iter().flatten() {
            let dim = |name: &str| entry[name].as_u64().and_then(|v| usize::try_from(v).ok());
            if let (Some(m), Some(n), Some(k), Some(tflops)) =
                (dim("m"), dim("n"), dim("k"), entry["tflops"].as_f64())
            {
                sustained.insert((m, n, k), tflops);
            }
        }
        let mut elementwise = std::collections::HashMap::new();
        for entry in json["elementwise"].as_array().into_iter().flatten() {
            let n = entry["n"].as_u64().and_then(|v| usize::try_from(v).ok());
            if let (Some(op), Some(n), Some(stream_us)) =
                (entry["op"].as_str(), n, entry["stream_us"].as_f64())
            {
                elementwise.insert((op.to_string(), n), stream_us);
            }
        }
        Ok(Self {
            dtype: json["dtype"].as_str().unwrap_or("float32").to_string(),
            products,
            stream,
            chain_step_us: json["chain_step_us"].as_f64(),
            sustained,
            elementwise,
        })
    }
}

/// One matmul shape to measure, optionally with a forced tile.
#[derive(Clone, Copy)]
struct MatmulCase {
    m: usize,
    n: usize,
    k: usize,
    tiles: Option<MatmulTiles>,
    /// The narrow kernel's lanes, forced.
    narrow_lanes: Option<u32>,
    /// The narrow kernel's splits along K, forced.
    narrow_splits: Option<u32>,
    /// Whether the narrow kernel uses subgroups, forced.
    narrow_subgroups: Option<bool>,
    /// Split-K, forced (`MatmulOptions::split_k`).
    splits: Option<u32>,
    /// The cooperative matmul's tile, forced (`MatmulOptions::cooperative_tiles`).
    coop_tiles: Option<CoopTiles>,
    /// A diagnostic of the cooperative matmul (`MatmulOptions::cooperative_probe`): timed,
    /// not checked.
    coop_probe: Option<CoopProbe>,
}

fn matmul_cases(large: bool, compared: &[MatmulTiles]) -> Vec<MatmulCase> {
    let case = |m, n, k| MatmulCase {
        m,
        n,
        k,
        tiles: None,
        narrow_lanes: None,
        narrow_splits: None,
        narrow_subgroups: None,
        splits: None,
        coop_tiles: None,
        coop_probe: None,
    };
    let mut cases = Vec::new();
    let squares: &[usize] = if large {
        &[256, 512, 1024, 2048, 4096]
    } else {
        &[128, 256, 512, 1024]
    };
    cases.extend(squares.iter().map(|&s| case(s, s, s)));
    // Skinny: few rows (a small batch: the narrow kernel up to 8), shallow K, and deep K on a
    // small output (split-K); with `large`, also the serving shapes (4096³ is among the squares).
    let serving = SERVING
        .iter()
        .copied()
        .filter(|&shape| shape != (4096, 4096, 4096));
    let large_skinny: Vec<(usize, usize, usize)> = [(1, 1024, 1024)]
        .into_iter()
        .chain(serving)
        .chain([(4096, 64, 4096), (4096, 4096, 64), (256, 256, 16384)])
        .collect();
    let skinny: &[(usize, usize, usize)] = if large {
        &large_skinny
    } else {
        &[
            (8, 1024, 1024),
            (32, 1024, 1024),
            (1024, 1024, 32),
            (128, 128, 8192),
        ]
    };
    cases.extend(skinny.iter().map(|&(m, n, k)| case(m, n, k)));
    if large {
        // Every tile at 4096³, for comparison.
        for &tiles in compared {
            cases.push(MatmulCase {
                tiles: Some(tiles),
                ..case(4096, 4096, 4096)
            });
        }
    }
    cases
}

/// Runs of each measurement.
const RUNS: usize = 9;

/// The context and how it measures time.
struct Bench {
    gpu: Gpu,
    pool: Pool,
    checks: ShaderChecks,
    support: TimestampSupport,
    matmul: MatmulOptions,
    /// What the measured tensors hold.
    dtype: DType,
    /// Chains of each length timed for a matmul chain's figures (`--chain-runs`).
    chain_runs: usize,
}

impl Bench {
    fn context(&self, matmul: MatmulOptions) -> anyhow::Result<Context> {
        Ok(Context::new(
            &self.pool,
            ContextOptions {
                shader_checks: self.checks,
                profile: self.support != TimestampSupport::None,
                matmul,
                ..ContextOptions::default()
            },
        )?)
    }

    /// A context without timestamps, as a workload runs.
    fn plain_context(&self, matmul: MatmulOptions) -> anyhow::Result<Context> {
        Ok(Context::new(
            &self.pool,
            ContextOptions {
                shader_checks: self.checks,
                matmul,
                ..ContextOptions::default()
            },
        )?)
    }

    /// The time of one run of `op` in a stream, in microseconds: as many runs as take about 2 ms
    /// recorded back to back into one batch, the wall clock from its submission until the GPU is
    /// done, divided by the runs; the median of five batches. `context` must not profile
    /// (timestamps around every dispatch slow a stream of short dispatches down): every barrier
    /// between dispatches counts, as in a workload, and no timestamp does.
    fn stream_us(
        &self,
        context: &Context,
        op: &dyn Fn() -> anyhow::Result<Tensor>,
    ) -> anyhow::Result<f64> {
        let batch = |runs: usize| -> anyhow::Result<f64> {
            for _ in 0..runs {
                drop(op()?);
            }
            let started = Instant::now();
            context.sync()?;
            Ok(started.elapsed().as_secs_f64())
        };
        batch(1)?;
        let each = batch(4)? / 4.0;
        let runs = ((2e-3 / each.max(1e-9)).ceil() as usize).clamp(4, 4096);
        let mut times = (0..5)
            .map(|_| Ok(batch(runs)? * 1e6 / runs as f64))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times[2])
    }

    /// The time of one run of `op` in microseconds. Runs are recorded back to back into one
    /// batch, as a workload would: with timestamps, the median over [`RUNS`] runs of the GPU time
    /// from a run's first kernel's start to its last kernel's end (the barrier between a split
    /// product and its reduction included); without, the wall clock of the batch (record, submit, wait) divided by
    /// the runs.
    fn time_us(
        &self,
        context: &Context,
        op: &dyn Fn() -> anyhow::Result<Tensor>,
    ) -> anyhow::Result<f64> {
        // Warm up: compile the pipelines, create the bind groups, and keep the GPU busy for
        // 100 ms so that its clocks rise (unless one run is slow already, as on a software GPU).
        let started = Instant::now();
        drop(op()?);
        context.sync()?;
        if started.elapsed().as_millis() < 20 {
            while started.elapsed().as_millis() < 100 {
                for _ in 0..RUNS {
                    drop(op()?);
                }
                context.sync()?;
            }
        }
        self.median_us(context, op)
    }

    /// [`Bench::time_us`] without its warm-up: the median over [`RUNS`] runs recorded back to
    /// back (the pipelines must be compiled already for a fair figure).
    fn median_us(
        &self,
        context: &Context,
        op: &dyn Fn() -> anyhow::Result<Tensor>,
    ) -> anyhow::Result<f64> {
        context.take_kernel_timings();
        let started = Instant::now();
        for _ in 0..RUNS {
            drop(op()?);
        }
        context.sync()?;
        if self.support == TimestampSupport::None {
            return Ok(started.elapsed().as_secs_f64() * 1e6 / RUNS as f64);
        }
        let timings = context.take_kernel_timings();
        let per_run = timings.len() / RUNS;
        anyhow::ensure!(
            per_run > 0 && timings.len() == per_run * RUNS,
            "expected the same number of timed kernels in each of {RUNS} runs, got {}",
            timings.len()
        );
        let mut runs: Vec<f64> = timings
            .chunks_exact(per_run)
            .map(|run| KernelTiming::span_ns(run) / 1e3)
            .collect();
        runs.sort_by(f64::total_cmp);
        Ok(runs[RUNS / 2])
    }
}

/// How far a result stored as `dtype` may be from its twin's rounding, relative to it: an f16
/// ulp (a conversion to f16 may round either way), nothing for f32.
fn f16_ulp_relative(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 0.0,
        DType::F16 => 1.0 / 1024.0,
    }
}

fn random(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Rows or columns to check of a dimension of `len`: all of them, or a sample with both ends.
fn sample(len: usize, full: bool) -> Vec<usize> {
    if full || len <= 24 {
        return (0..len).collect();
    }
    let mut picks: Vec<usize> = (0..16).map(|i| i * (len - 1) / 15).collect();
    picks.extend([1, len / 2 + 1, len - 2]);
    picks.sort_unstable();
    picks.dedup();
    picks
}

/// The kernel of a plan as the tables name it: the tile, or `narrow xL` (L lanes) with `sgS`
/// where subgroups of S add its slices and `gG` where its rows are in G groups.
fn kernel_name(plan: &MatmulPlan) -> String {
    if let Some(tiles) = plan.cooperative {
        return format!("coop {}", tiles.name());
    }
    let groups = match plan.narrow_row_groups {
        0 | 1 => String::new(),
        groups => format!(" g{groups}"),
    };
    match (plan.narrow_lanes, plan.narrow_subgroup) {
        (0, _) => plan.tiles.to_string(),
        (lanes, 0) => format!("narrow x{lanes}{groups}"),
        (lanes, subgroup) => format!("narrow x{lanes} sg{subgroup}{groups}"),
    }
}

/// The largest error of the product `c` of `[m, k] · [k, n]` against the CPU twin, relative to
/// the magnitude of the terms, over sampled rows and columns (all of them with `full`), and
/// whether it keeps the bound: about 2K·2⁻²⁴ for f32, and an f16 ulp more for f16 (a result may
/// round to either neighbour).
fn matmul_error(
    bench: &Bench,
    c: &[f32],
    a_values: &[f32],
    b_values: &[f32],
    (m, n, k): (usize, usize, usize),
    full: bool,
) -> (f64, bool) {
    let bound = 2.0 * k as f64 / f64::from(1u32 << 24) + f16_ulp_relative(bench.dtype);
    let (mut max_rel_err, mut ok) = (0.0f64, true);
    for row in sample(m, full) {
        for col in sample(n, full) {
            let (expected, magnitude) = cpu::matmul_element(a_values, b_values, k, n, row, col);
            let error =
                (f64::from(c[row * n + col]) - expected).abs() / magnitude.max(f64::MIN_POSITIVE);
            max_rel_err = max_rel_err.max(error);
            // Each error on its own: a NaN fails here, where `max` would pass over it.
            ok &= error <= bound;
        }
    }
    (max_rel_err, ok)
}

struct MatmulResult {
    m: usize,
    n: usize,
    k: usize,
    /// The tile, or `narrow xL` for the narrow kernel with L lanes.
    kernel: String,
    splits: u32,
    time_us: f64,
    /// Per product in a stream ([`Bench::stream_us`]).
    stream_us: f64,
    gflops: f64,
    max_rel_err: f64,
    ok: bool,
}

fn bench_matmul(
    bench: &Bench,
    case: &MatmulCase,
    rng: &mut StdRng,
) -> anyhow::Result<MatmulResult> {
    let (m, n, k) = (case.m, case.n, case.k);
    let context = bench.context(MatmulOptions {
        tiles: case.tiles,
        narrow_lanes: case.narrow_lanes.or(bench.matmul.narrow_lanes),
        narrow_splits: case.narrow_splits.or(bench.matmul.narrow_splits),
        narrow_subgroups: case
            .narrow_subgroups
            .unwrap_or(bench.matmul.narrow_subgroups),
        split_k: case.splits.or(bench.matmul.split_k),
        cooperative_tiles: case.coop_tiles.or(bench.matmul.cooperative_tiles),
        cooperative_probe: case.coop_probe,
        // A probe times one plan (MatmulOptions::validate refuses it with a tuner).
        autotune: match case.coop_probe {
            Some(_) => Autotune::Off,
            None => bench.matmul.autotune,
        },
        ..bench.matmul.clone()
    })?;
    let plan = context.matmul_plan_for(bench.dtype, m, n, k)?;
    // The values the tensors hold (rounded to f16 for f16), which the twin computes on.
    let a_values = cpu::rounded(&random(rng, m * k), bench.dtype);
    let b_values = cpu::rounded(&random(rng, k * n), bench.dtype);
    let a = context.tensor_with(&a_values, &[m, k], bench.dtype)?;
    let b = context.tensor_with(&b_values, &[k, n], bench.dtype)?;
    let time_us = bench.time_us(&context, &|| Ok(context.matmul(&a, &b)?))?;
    // The same products in a stream, without timestamps (the same options: the same plan).
    let plain = bench.plain_context(context.options().matmul.clone())?;
    anyhow::ensure!(
        plain.matmul_plan_for(bench.dtype, m, n, k)? == plan,
        "an unprofiled context chose another plan"
    );
    let (plain_a, plain_b) = (
        plain.tensor_with(&a_values, &[m, k], bench.dtype)?,
        plain.tensor_with(&b_values, &[k, n], bench.dtype)?,
    );
    let stream_us = bench.stream_us(&plain, &|| Ok(plain.matmul(&plain_a, &plain_b)?))?;
    drop((plain_a, plain_b));
    let c = context.matmul(&a, &b)?.to_vec()?;
    let full = (m * n * k) as u64 <= 1 << 28;
    // A diagnostic probe's results are not the product: timed only.
    let (max_rel_err, ok) = match (case.coop_probe, plan.cooperative) {
        (Some(_), Some(_)) => (f64::NAN, true),
        _ => matmul_error(bench, &c, &a_values, &b_values, (m, n, k), full),
    };
    Ok(MatmulResult {
        m,
        n,
        k,
        kernel: kernel_name(&plan),
        splits: plan.splits,
        time_us,
        stream_us,
        gflops: 2.0 * (m * n * k) as f64 / (time_us * 1e3),
        max_rel_err,
        ok,
    })
}

/// A fixed product timed before and after each matmul measurement: its time follows the GPU's
/// clock. A GPU whose clock follows load (the lent H200 under Vulkan fell to 345-510 MHz for
/// seconds, inside one process) would otherwise leave one shape's figure measured in a dip; the
/// probe's times show which ones, and [`measure_matmuls`] measures those again.
struct ClockProbe {
    context: Context,
    a: Tensor,
    b: Tensor,
    /// The probe is `size × size × size`.
    size: usize,
}

/// A probe shorter than this, in microseconds, is dominated by the launch rather than the clock:
/// [`ClockProbe::new`] doubles the product's size until it takes at least this long.
const PROBE_MIN_US: f64 = 20.0;

/// A measurement whose probe ran this much slower than the fastest probe of the process was
/// taken at a lower clock: it is measured again.
const PROBE_SLOW_RATIO: f64 = 1.10;

/// How many times the shapes measured at a lower clock are measured again, at most.
const PROBE_ROUNDS: usize = 3;

/// How long a process waits, in all, for its clock to come back up before measuring again.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl ClockProbe {
    fn new(bench: &Bench, rng: &mut StdRng) -> anyhow::Result<Self> {
        let mut context = bench.context(bench.matmul.clone())?;
        let mut size = 256;
        loop {
            let a = context.tensor(&random(rng, size * size), &[size, size])?;
            let b = context.tensor(&random(rng, size * size), &[size, size])?;
            let probe = ClockProbe {
                context,
                a,
                b,
                size,
            };
            let time_us = bench.time_us(&probe.context, &|| {
                Ok(probe.context.matmul(&probe.a, &probe.b)?)
            })?;
            if time_us >= PROBE_MIN_US || size >= 2048 {
                return Ok(probe);
            }
            size *= 2;
            context = probe.context;
        }
    }

    /// Runs the probe every 100 ms until it takes at most [`PROBE_SLOW_RATIO`] × `fastest_us`
    /// (the clock is back up), or until [`PROBE_WAIT`] has passed since `since`; false then.
    fn wait_for_clock(
        &self,
        bench: &Bench,
        fastest_us: f64,
        since: Instant,
    ) -> anyhow::Result<bool> {
        loop {
            if self.time_us(bench)? <= fastest_us * PROBE_SLOW_RATIO {
                return Ok(true);
            }
            if since.elapsed() > PROBE_WAIT {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The probe's time now, in microseconds (its pipelines are compiled: no warm-up).
    fn time_us(&self, bench: &Bench) -> anyhow::Result<f64> {
        bench.median_us(&self.context, &|| {
            Ok(self.context.matmul(&self.a, &self.b)?)
        })
    }
}

/// The indices of the measurements whose clock probe (`probe_us`, one per measurement) ran
/// [`PROBE_SLOW_RATIO`] slower than the fastest: those taken while the clock was down.
pub fn measured_in_a_dip(probe_us: &[f64]) -> Vec<usize> {
    let fastest = probe_us.iter().copied().fold(f64::INFINITY, f64::min);
    (0..probe_us.len())
        .filter(|&i| probe_us[i] > fastest * PROBE_SLOW_RATIO)
        .collect()
}

/// The clock probe's size (a `size³` product) and its fastest time in microseconds.
type ProbeFigures = (usize, f64);

/// One matmul case measured, with the clock probe's slower time around it.
struct Measured {
    case: MatmulCase,
    result: MatmulResult,
    probe_us: f64,
    /// How many times the case was measured (more than once after a clock dip).
    measurements: usize,
}

/// Measures every case, each between two runs of the probe, then measures again, up to
/// [`PROBE_ROUNDS`] times, every case whose probe ran [`PROBE_SLOW_RATIO`] slower than the
/// fastest probe of all: a later measurement replaces an earlier one when its probe was faster.
/// Returns the cases in order and the probe's fastest time.
fn measure_matmuls(
    bench: &Bench,
    cases: Vec<MatmulCase>,
    rng: &mut StdRng,
) -> anyhow::Result<(Vec<Measured>, Option<ProbeFigures>)> {
    if cases.is_empty() {
        return Ok((Vec::new(), None));
    }
    let probe = ClockProbe::new(bench, rng)?;
    let measure = |case: &MatmulCase, rng: &mut StdRng| -> anyhow::Result<(MatmulResult, f64)> {
        let before = probe.time_us(bench)?;
        let result = bench_matmul(bench, case, rng)
            .with_context(|| format!("matmul {}x{}x{}", case.m, case.n, case.k))?;
        let after = probe.time_us(bench)?;
        Ok((result, before.max(after)))
    };
    let mut measured = Vec::with_capacity(cases.len());
    for case in cases {
        let (result, probe_us) = measure(&case, rng)?;
        measured.push(Measured {
            case,
            result,
            probe_us,
            measurements: 1,
        });
    }
    let waited = Instant::now();
    for _ in 0..PROBE_ROUNDS {
        let probes: Vec<f64> = measured.iter().map(|m| m.probe_us).collect();
        let slow = measured_in_a_dip(&probes);
        if slow.is_empty() {
            break;
        }
        let fastest = probes.iter().copied().fold(f64::INFINITY, f64::min);
        for i in slow {
            // A dip lasts seconds: measuring again at once would fall in it again.
            if !probe.wait_for_clock(bench, fastest, waited)? {
                break;
            }
            let (result, probe_us) = measure(&measured[i].case, rng)?;
            let entry = &mut measured[i];
            entry.measurements += 1;
            if probe_us < entry.probe_us {
                entry.result = result;
                entry.probe_us = probe_us;
            }
        }
    }
    let fastest = measured
        .iter()
        .map(|m| m.probe_us)
        .fold(f64::INFINITY, f64::min);
    Ok((measured, Some((probe.size, fastest))))
}

/// The row length of the `sum` measured beside the element-wise ops (rows of 4096 columns: a
/// read of the whole tensor, as a product of one row reads its weights).
const SUM_COLS: usize = 4096;

/// An element-wise op of the benchmark, or the row sum (`Context::sum` over rows of
/// [`SUM_COLS`]): the pure read.
#[derive(Clone, Copy)]
enum Elementwise {
    Binary(BinaryOp),
    Unary(UnaryOp),
    Sum,
}

impl Elementwise {
    fn name(self) -> &'static str {
        match self {
            Self::Binary(op) => op.name(),
            Self::Unary(op) => op.name(),
            Self::Sum => "sum",
        }
    }

    /// Bytes read and written per element of `dtype`.
    fn bytes_per_element(self, dtype: DType) -> f64 {
        let accesses = match self {
            Self::Binary(_) => 3.0,
            Self::Unary(_) => 2.0,
            Self::Sum => 1.0 + 1.0 / SUM_COLS as f64,
        };
        accesses * dtype.size_bytes() as f64
    }
}

struct ElementwiseResult {
    op: &'static str,
    n: usize,
    time_us: f64,
    gbs: f64,
    /// Per op in a stream ([`Bench::stream_us`]).
    stream_us: f64,
    stream_gbs: f64,
    max_rel_err: f64,
}

fn bench_elementwise(
    bench: &Bench,
    op: Elementwise,
    n: usize,
    rng: &mut StdRng,
) -> anyhow::Result<ElementwiseResult> {
    let a_values = cpu::rounded(&random(rng, n), bench.dtype);
    let b_values = cpu::rounded(&random(rng, n), bench.dtype);
    // The tensors of one context, and `op` on them.
    let operands = |context: &Context| -> anyhow::Result<(Tensor, Tensor)> {
        let shape = match op {
            Elementwise::Sum => vec![n / SUM_COLS, SUM_COLS],
            _ => vec![n],
        };
        Ok((
            context.tensor_with(&a_values, &shape, bench.dtype)?,
            context.tensor_with(&b_values, &shape, bench.dtype)?,
        ))
    };
    let apply = |context: &Context, a: &Tensor, b: &Tensor| -> anyhow::Result<Tensor> {
        Ok(match op {
            Elementwise::Binary(op) => context.binary(op, a, b)?,
            Elementwise::Unary(op) => context.unary(op, a)?,
            Elementwise::Sum => context.sum(a)?,
        })
    };
    let stream_us = {
        let plain = bench.plain_context(MatmulOptions::default())?;
        let (a, b) = operands(&plain)?;
        bench.stream_us(&plain, &|| apply(&plain, &a, &b))?
    };
    let context = bench.context(MatmulOptions::default())?;
    let (a, b) = operands(&context)?;
    let run = || apply(&context, &a, &b);
    let time_us = bench.time_us(&context, &run)?;
    let values = run()?.to_vec()?;
    let expected = cpu::rounded(
        &match op {
            Elementwise::Binary(op) => cpu::binary(op, &a_values, &b_values),
            Elementwise::Unary(op) => cpu::unary(op, &a_values),
            Elementwise::Sum => cpu::sum(&a_values, SUM_COLS),
        },
        bench.dtype,
    );
    // Over normal results only in f16: a device may flush f16 subnormals to zero.
    let smallest = match bench.dtype {
        DType::F32 => 0.0,
        DType::F16 => 1.0 / f32::from(1u16 << 14),
    };
    // A sum's error relative to the magnitude of its terms (Σ|x|; the sum itself may be near
    // 0), as a matmul's.
    let magnitudes: Vec<f64> = match op {
        Elementwise::Sum => a_values
            .chunks(SUM_COLS)
            .map(|row| row.iter().map(|&x| f64::from(x.abs())).sum())
            .collect(),
        _ => expected.iter().map(|&c| f64::from(c.abs())).collect(),
    };
    let max_rel_err = values
        .iter()
        .zip(&expected)
        .zip(&magnitudes)
        .filter(|((_, c), _)| c.abs() >= smallest)
        .map(|((&g, &c), &magnitude)| (f64::from(g) - f64::from(c)).abs() / magnitude.max(1e-30))
        .fold(0.0, f64::max);
    let bytes = op.bytes_per_element(bench.dtype) * n as f64;
    Ok(ElementwiseResult {
        op: op.name(),
        n,
        time_us,
        gbs: bytes / (time_us * 1e3),
        stream_us,
        stream_gbs: bytes / (stream_us * 1e3),
        max_rel_err,
    })
}

/// The CPU cost of one small `add`, in microseconds.
struct Overhead {
    /// Recording it into an open pass: allocating its output, finding its bind group, writing
    /// its parameters, dispatching.
    record_us: f64,
    /// The same plus its share of ending the pass, finishing the encoder and submitting (wgpu
    /// validates a pass's commands when it ends).
    with_submit_us: f64,
    /// Wall time of one tiny `add` recorded, submitted and read back (the round trip a request
    /// of a server pays at least once).
    round_trip_us: f64,
    /// Wall time each further dependent tiny `add` adds to that round trip: recording, the
    /// barrier between dispatches, the launch.
    chain_step_us: f64,
    /// The round trip of a plan of one tiny `add` (`Plan::run`: input written, one dispatch,
    /// read back).
    plan_round_trip_us: f64,
    /// Each further dependent `add` of a plan.
    plan_chain_step_us: f64,
}

/// Chains of dependent ops, each read back at its end: the median wall time (of `repeats`, after
/// 10 warm-ups, or `repeats` where fewer) of a chain of one op, and what each further op adds
/// (chains of 1 and 65).
/// `chain(length)` records a chain of `length` ops and reads it back; `check` then checks the
/// values (outside the time).
fn chain_times_us(
    repeats: usize,
    chain: &dyn Fn(usize) -> anyhow::Result<Vec<f32>>,
    check: &dyn Fn(usize, &[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    const STEPS: usize = 64;
    let repeats = repeats.max(1);
    let warmups = repeats.min(10);
    let median_us = |length: usize| -> anyhow::Result<f64> {
        let mut times = Vec::with_capacity(repeats);
        for round in 0..repeats + warmups {
            let started = Instant::now();
            let values = chain(length)?;
            let elapsed = started.elapsed().as_secs_f64() * 1e6;
            check(length, &values)?;
            if round >= warmups {
                times.push(elapsed);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[repeats / 2])
    };
    let single = median_us(1)?;
    let long = median_us(1 + STEPS)?;
    Ok((single, (long - single) / STEPS as f64))
}

/// [`chain_times_us`] for planned chains: each length captured once (`link` applied to the
/// previous result, starting from the plan's input of `shape`), replayed with `input`.
fn plan_chain_us(
    repeats: usize,
    context: &Context,
    shape: &[usize],
    input: &[f32],
    link: &dyn Fn(&Tensor) -> anyhow::Result<Tensor>,
    check: &dyn Fn(usize, &[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    let mut plans = std::collections::HashMap::new();
    for length in [1, 65] {
        let mut capture = context.capture()?;
        let mut x = capture.input(shape)?;
        for _ in 0..length {
            x = link(&x)?;
        }
        plans.insert(length, capture.finish(&[&x])?);
    }
    let plans = std::cell::RefCell::new(plans);
    chain_times_us(
        repeats,
        &|length| {
            let mut plans = plans.borrow_mut();
            let plan = plans.get_mut(&length).context("a plan per length")?;
            Ok(plan.run(&[Feed::Data(input)])?.swap_remove(0))
        },
        check,
    )
}

/// A chain's check: every value of its result finite.
fn check_finite(length: usize, values: &[f32]) -> anyhow::Result<()> {
    anyhow::ensure!(
        values.iter().all(|v| v.is_finite()),
        "chain of {length}: values not finite"
    );
    Ok(())
}

/// The operands of a chain of `rows × width` products: `x0` and `W` (scaled so that values stay
/// finite along the chain).
fn chain_operands((rows, width): (usize, usize)) -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(7);
    let x_values = random(&mut rng, rows * width);
    let scale = (width as f32).sqrt();
    let w_values: Vec<f32> = random(&mut rng, width * width)
        .into_iter()
        .map(|v| v / scale)
        .collect();
    (x_values, w_values)
}

/// The planned chain of dependent `rows × width × width` products `x = x · W`
/// ([`plan_chain_us`]) under `matmul`: the time of one and of each further product.
fn matmul_plan_chain_us(
    bench: &Bench,
    shape: (usize, usize),
    matmul: MatmulOptions,
) -> anyhow::Result<(f64, f64)> {
    let context = bench.plain_context(matmul)?;
    let (rows, width) = shape;
    let (x_values, w_values) = chain_operands(shape);
    let w = context.tensor(&w_values, &[width, width])?;
    plan_chain_us(
        bench.chain_runs,
        &context,
        &[rows, width],
        &x_values,
        &|x| Ok(context.matmul(x, &w)?),
        &check_finite,
    )
}

/// A forced narrow plan's planned chain steps beside the automatic plan's ([`chain_plan_steps`]).
struct ChainPlanSteps {
    lanes: u32,
    splits: u32,
    /// The automatic plan's step in each round, in µs.
    automatic: Vec<f64>,
    /// The forced plan's, right after.
    forced: Vec<f64>,
}

/// The planned chain's step ([`matmul_plan_chain_us`]) with each forced narrow plan `(lanes,
/// splits)` of `plans`, each timed right after the automatic plan's, in [`CHAIN_ROUNDS`] rounds.
fn chain_plan_steps(
    bench: &Bench,
    shape: (usize, usize),
    plans: &[(u32, u32)],
) -> anyhow::Result<Vec<ChainPlanSteps>> {
    let mut steps: Vec<ChainPlanSteps> = plans
        .iter()
        .map(|&(lanes, splits)| ChainPlanSteps {
            lanes,
            splits,
            automatic: Vec::new(),
            forced: Vec::new(),
        })
        .collect();
    for _ in 0..CHAIN_ROUNDS {
        for entry in &mut steps {
            let (_, automatic) = matmul_plan_chain_us(bench, shape, bench.matmul.clone())?;
            let forced = MatmulOptions {
                narrow_lanes: Some(entry.lanes),
                narrow_splits: Some(entry.splits),
                ..bench.matmul.clone()
            };
            let (_, step) = matmul_plan_chain_us(bench, shape, forced)?;
            entry.automatic.push(automatic);
            entry.forced.push(step);
        }
    }
    Ok(steps)
}

/// Chains of each length timed for the op overhead's round trips.
const OVERHEAD_CHAINS: usize = 101;

/// Rounds of [`chain_plan_steps`].
const CHAIN_ROUNDS: usize = 3;

/// Chains of dependent `rows × width × width` products `x = x · W` ([`chain_times_us`]): eager,
/// then planned.
fn matmul_chain_us(bench: &Bench, shape: (usize, usize)) -> anyhow::Result<[f64; 4]> {
    // Wall-clock figures: no timestamps, as a workload runs.
    let context = bench.plain_context(bench.matmul.clone())?;
    let (rows, width) = shape;
    let (x_values, w_values) = chain_operands(shape);
    let x0 = context.tensor(&x_values, &[rows, width])?;
    let w = context.tensor(&w_values, &[width, width])?;
    let (single, step) = chain_times_us(
        bench.chain_runs,
        &|length| {
            let mut x = context.matmul(&x0, &w)?;
            for _ in 1..length {
                x = context.matmul(&x, &w)?;
            }
            Ok(context.read(&x)?)
        },
        &check_finite,
    )?;
    let (plan_single, plan_step) = matmul_plan_chain_us(bench, shape, bench.matmul.clone())?;
    Ok([single, step, plan_single, plan_step])
}

/// Where one round trip's time goes, on plain wgpu (one tiny dispatch, its result copied to a
/// staging buffer, mapped, copied out): medians in µs of recording (encoder, pass, dispatch,
/// copy, finish), `queue.submit`, the wait until the map callback ran, and the copy out and
/// unmap; the wait once blocking in `device.poll(Wait)` for the submission, once spinning on
/// `device.poll(Poll)` until the callback ran.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Phases {
    record_us: f64,
    submit_us: f64,
    blocking_wait_us: f64,
    blocking_total_us: f64,
    spin_wait_us: f64,
    spin_total_us: f64,
    map_copy_us: f64,
}

fn round_trip_phases(gpu: &Gpu) -> anyhow::Result<Phases> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let device = &gpu.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("round trip"),
        source: wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<storage, read_write> x: array<f32>;
             @compute @workgroup_size(1) fn main() { x[0] = x[0] + 1.0; }"
                .into(),
        ),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("round trip"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let storage = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("round trip"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("round trip staging"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: storage.as_entire_binding(),
        }],
    });
    const ROUNDS: usize = 400;
    let mut times: [Vec<f64>; 7] = Default::default();
    for round in 0..ROUNDS + 40 {
        let spin = round % 2 == 1;
        let started = Instant::now();
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        encoder.copy_buffer_to_buffer(&storage, 0, &staging, 0, 16);
        let commands = encoder.finish();
        let recorded = started.elapsed();
        let index = gpu.queue.submit([commands]);
        let submitted = started.elapsed();
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        staging.map_async(wgpu::MapMode::Read, .., move |result| {
            result.expect("map");
            flag.store(true, Ordering::Release);
        });
        if spin {
            while !done.load(Ordering::Acquire) {
                device.poll(wgpu::PollType::Poll)?;
            }
        } else {
            device.poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })?;
            anyhow::ensure!(done.load(Ordering::Acquire), "the map callback did not run");
        }
        let waited = started.elapsed();
        let value = bytemuck::pod_read_unaligned::<f32>(&staging.get_mapped_range(..)?[..4]);
        staging.unmap();
        let total = started.elapsed();
        anyhow::ensure!(value >= 1.0, "round trip read {value}");
        if round < 40 {
            continue;
        }
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
        times[0].push(us(recorded));
        times[1].push(us(submitted - recorded));
        let (wait, whole) = if spin { (4, 5) } else { (2, 3) };
        times[wait].push(us(waited - submitted));
        times[whole].push(us(total));
        times[6].push(us(total - waited));
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let [record, submit, blocking, blocking_total, spin, spin_total, copy] = &mut times;
    Ok(Phases {
        record_us: median(record),
        submit_us: median(submit),
        blocking_wait_us: median(blocking),
        blocking_total_us: median(blocking_total),
        spin_wait_us: median(spin),
        spin_total_us: median(spin_total),
        map_copy_us: median(copy),
    })
}

/// The CPU cost of small `add`s recorded into one open pass, with warm caches.
fn op_overhead_us(bench: &Bench) -> anyhow::Result<Overhead> {
    const OPS: u32 = 10_000;
    let context = Context::new(
        &bench.pool,
        ContextOptions {
            shader_checks: bench.checks,
            max_ops_per_batch: OPS,
            max_cached_bind_groups: 2 * OPS as usize,
            ..ContextOptions::default()
        },
    )?;
    let a = context.tensor(&[1.0; 256], &[256])?;
    let b = context.tensor(&[2.0; 256], &[256])?;
    let mut overhead = Overhead {
        record_us: 0.0,
        with_submit_us: 0.0,
        round_trip_us: 0.0,
        chain_step_us: 0.0,
        plan_round_trip_us: 0.0,
        plan_chain_step_us: 0.0,
    };
    // The first round compiles the kernel and fills the bind-group cache (the second round's
    // outputs get the same ranges, in the same order); the second is measured.
    for _ in 0..2 {
        context.sync()?;
        let started = Instant::now();
        for _ in 0..OPS {
            drop(context.add(&a, &b)?);
        }
        let recorded = started.elapsed();
        context.flush()?;
        let submitted = started.elapsed();
        overhead = Overhead {
            record_us: recorded.as_secs_f64() * 1e6 / f64::from(OPS),
            with_submit_us: submitted.as_secs_f64() * 1e6 / f64::from(OPS),
            ..overhead
        };
    }
    context.sync()?;

    // Chains of dependent tiny adds, each read back.
    let (single, step) = chain_times_us(
        OVERHEAD_CHAINS,
        &|length| {
            let mut x = context.add(&a, &b)?;
            for _ in 1..length {
                x = context.add(&x, &b)?;
            }
            Ok(context.read(&x)?)
        },
        &|length, values| {
            anyhow::ensure!(values[0] == 1.0 + 2.0 * length as f32, "chain of {length}");
            Ok(())
        },
    )?;
    let (plan_single, plan_step) = plan_chain_us(
        OVERHEAD_CHAINS,
        &context,
        &[256],
        &[1.0; 256],
        &|x| Ok(context.add(x, &b)?),
        &|length, values| {
            anyhow::ensure!(
                values[0] == 1.0 + 2.0 * length as f32,
                "planned chain of {length}"
            );
            Ok(())
        },
    )?;
    Ok(Overhead {
        round_trip_us: single,
        chain_step_us: step,
        plan_round_trip_us: plan_single,
        plan_chain_step_us: plan_step,
        ..overhead
    })
}

/// One shape's `--sustained` run.
struct Sustained {
    m: usize,
    n: usize,
    k: usize,
    seconds: f64,
    products: u64,
    /// Over the whole run.
    tflops: f64,
    /// Over each whole second of it.
    windows_tflops: Vec<f64>,
    /// The plan's kernel, as the matmul table names it.
    kernel: String,
    /// Its splits along K.
    splits: u32,
    max_rel_err: f64,
    ok: bool,
}

/// Back-to-back products of `[m, k] · [k, n]` for `seconds`: batches of about 20 ms of products,
/// each recorded while the one before runs and submitted as soon as that one is done (the GPU
/// idles only for a submission), timed by the wall clock; TFLOP/s over the run and over each
/// whole second; without timestamps (a profiled context brackets every dispatch with them). The
/// last product is checked against the CPU twin (sampled rows and columns).
fn sustained_matmul(
    bench: &Bench,
    (m, n, k): (usize, usize, usize),
    seconds: f64,
    matmul: MatmulOptions,
    rng: &mut StdRng,
) -> anyhow::Result<Sustained> {
    // Without timestamps, as a workload runs (wall clock only).
    let context = bench.plain_context(matmul)?;
    let plan = context.matmul_plan_for(bench.dtype, m, n, k)?;
    let a_values = cpu::rounded(&random(rng, m * k), bench.dtype);
    let b_values = cpu::rounded(&random(rng, k * n), bench.dtype);
    let a = context.tensor_with(&a_values, &[m, k], bench.dtype)?;
    let b = context.tensor_with(&b_values, &[k, n], bench.dtype)?;
    // Compile, and find how many products take about 20 ms.
    drop(context.matmul(&a, &b)?);
    context.sync()?;
    let started = Instant::now();
    for _ in 0..4 {
        drop(context.matmul(&a, &b)?);
    }
    context.sync()?;
    let each = started.elapsed().as_secs_f64() / 4.0;
    let batch = ((0.02 / each.max(1e-9)).ceil() as u64).clamp(1, 10_000);
    let flops = 2.0 * (m * n * k) as f64;
    let mut windows = Vec::new();
    let (mut products, mut window_products) = (0u64, 0u64);
    let started = Instant::now();
    let mut window_start = 0.0;
    // The first batch; then each batch is recorded while the one before runs, and submitted as
    // soon as that one is done.
    for _ in 0..batch {
        drop(context.matmul(&a, &b)?);
    }
    context.flush()?;
    loop {
        for _ in 0..batch {
            drop(context.matmul(&a, &b)?);
        }
        bench
            .gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| anyhow::anyhow!("waiting for the GPU: {e}"))?;
        context.flush()?;
        products += batch;
        window_products += batch;
        let now = started.elapsed().as_secs_f64();
        if now - window_start >= 1.0 {
            windows.push(window_products as f64 * flops / (now - window_start) / 1e12);
            window_start = now;
            window_products = 0;
        }
        if now >= seconds {
            break;
        }
    }
    context.sync()?;
    products += batch;
    let elapsed = started.elapsed().as_secs_f64();
    let c = context.matmul(&a, &b)?.to_vec()?;
    let (max_rel_err, ok) = matmul_error(bench, &c, &a_values, &b_values, (m, n, k), false);
    Ok(Sustained {
        m,
        n,
        k,
        seconds: elapsed,
        products,
        tflops: products as f64 * flops / elapsed / 1e12,
        windows_tflops: windows,
        kernel: kernel_name(&plan),
        splits: plan.splits,
        max_rel_err,
        ok,
    })
}

/// `--sustained`: [`sustained_matmul`] for each `--matmul` shape (4096³ without one), a table,
/// and the JSON.
fn run_sustained(
    args: &Args,
    bench: &Bench,
    seconds: f64,
    torch: Option<&Torch>,
) -> anyhow::Result<()> {
    let shapes = if args.matmuls.is_empty() {
        vec![(4096, 4096, 4096)]
    } else {
        args.matmuls.clone()
    };
    let mut rng = StdRng::seed_from_u64(42);
    println!();
    println!(
        "{:>6} {:>6} {:>6}  {:<28} {:>9} {:>8} {:>8} {:>8} {:>8}  check{}",
        "M",
        "N",
        "K",
        "tiles",
        "products",
        "TFLOP/s",
        "first s",
        "last s",
        "min s",
        if torch.is_some() {
            "  torch TFLOP/s  ours/torch"
        } else {
            ""
        }
    );
    let mut rows = Vec::new();
    let mut failures = 0;
    // The automatic plan of each shape, then for few rows each forced narrow plan.
    let mut runs: Vec<((usize, usize, usize), MatmulOptions, bool)> = Vec::new();
    for &shape in &shapes {
        runs.push((shape, bench.matmul.clone(), false));
        let forced = !args.narrow_lanes.is_empty() || !args.narrow_splits.is_empty();
        if forced && shape.0 <= MatmulOptions::NARROW_MAX_ROWS as usize {
            let (lanes, splits) = (
                forced_or_automatic(&args.narrow_lanes),
                forced_or_automatic(&args.narrow_splits),
            );
            for &narrow_lanes in &lanes {
                for &narrow_splits in &splits {
                    let options = MatmulOptions {
                        narrow_lanes,
                        narrow_splits,
                        ..bench.matmul.clone()
                    };
                    runs.push((shape, options, true));
                }
            }
        }
    }
    for (shape, options, forced) in runs {
        let r = sustained_matmul(bench, shape, seconds, options, &mut rng)
            .with_context(|| format!("sustained matmul {}x{}x{}", shape.0, shape.1, shape.2))?;
        let first = r.windows_tflops.first().copied().unwrap_or(r.tflops);
        let last = r.windows_tflops.last().copied().unwrap_or(r.tflops);
        let min = r.windows_tflops.iter().copied().fold(r.tflops, f64::min);
        let theirs = torch.and_then(|t| t.sustained.get(&shape).copied());
        let kernel = format!(
            "{}{}{}",
            r.kernel,
            if r.splits > 1 {
                format!(" /{}", r.splits)
            } else {
                String::new()
            },
            if forced { " (forced)" } else { "" }
        );
        println!(
            "{:>6} {:>6} {:>6}  {:<28} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>8.2}  {:<5}{}",
            r.m,
            r.n,
            r.k,
            kernel,
            r.products,
            r.tflops,
            first,
            last,
            min,
            if r.ok { "ok" } else { "FAIL" },
            theirs.map_or(String::new(), |t| format!(
                " {t:>14.2} {:>11.2}",
                r.tflops / t
            ))
        );
        failures += usize::from(!r.ok);
        rows.push(json!({
            "m": r.m, "n": r.n, "k": r.k, "tiles": r.kernel, "splits": r.splits,
            "forced": forced, "seconds": r.seconds,
            "products": r.products, "tflops": r.tflops, "windows_tflops": r.windows_tflops,
            "max_rel_err": r.max_rel_err, "torch_tflops": theirs,
            "ratio": theirs.map(|t| r.tflops / t),
        }));
    }
    if let Some(path) = &args.json {
        let report = json!({
            "adapter": bench.gpu.info.name,
            "backend": format!("{:?}", bench.gpu.info.backend),
            "dtype": args.dtype.name(),
            "sustained": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if failures > 0 {
        bail!("{failures} results differ from their CPU twins");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The device's options before the rest is parsed (`run` parses it all again).
    let options = GpuOptions::default()
        .with_limits(LimitsChoice::Adapter)
        .with_cooperative_matrix(parse_args(&args)?.cooperative_matrix);
    run(&request_gpu_with(options)?, &args)
}

/// The benchmark on `gpu` with these command-line arguments (without the program's name).
pub fn run(gpu: &Gpu, list: &[String]) -> anyhow::Result<()> {
    let args = parse_args(list)?;
    let pool = Pool::new(gpu, PoolOptions::default())?;
    let support = TimestampSupport::of(&gpu.device);
    let bench = Bench {
        gpu: gpu.clone(),
        pool,
        checks: args.checks,
        support,
        matmul: MatmulOptions {
            group_rows: args
                .group_rows
                .unwrap_or(MatmulOptions::default().group_rows),
            autotune: args.autotune,
            narrow_row_groups: args.narrow_row_groups,
            ..MatmulOptions::default()
        },
        dtype: args.dtype,
        chain_runs: args.chain_runs,
    };
    let timing = match support {
        TimestampSupport::InsidePasses => "GPU timestamps inside passes",
        TimestampSupport::PassBoundaries => "GPU timestamps, one pass per kernel",
        TimestampSupport::None => "wall clock around submit and wait",
    };
    println!("adapter: {gpu}");
    println!(
        "cooperative matrices: asked {}, device {}, f16 matmuls on them {}",
        args.cooperative_matrix,
        gpu.cooperative_matrix(),
        gpu.cooperative_matmul_f16()
    );
    println!(
        "timing: {timing}, median of {RUNS}; kernels: {:?}; tensors: {}",
        args.checks, args.dtype
    );
    let mut rng = StdRng::seed_from_u64(42);
    let torch = args.torch.as_deref().map(Torch::read).transpose()?;
    if let Some(torch) = &torch {
        let wanted = match args.dtype {
            DType::F32 => "float32",
            DType::F16 => "float16",
        };
        if torch.dtype != wanted {
            bail!(
                "--torch holds PyTorch's {} products, but these are {}: run \
                 benches/torch/matmul.py --dtype {}",
                torch.dtype,
                args.dtype,
                if args.dtype == DType::F16 {
                    "half"
                } else {
                    "float"
                }
            );
        }
    }
    if let Some(seconds) = args.sustained {
        return run_sustained(&args, &bench, seconds, torch.as_ref());
    }

    println!();
    println!(
        "{:>6} {:>6} {:>6}  {:<17} {:>5} {:>11} {:>10} {:>11}  check{} {:>11}{}",
        "M",
        "N",
        "K",
        "tiles",
        "split",
        "time (µs)",
        "GFLOP/s",
        "max_rel_err",
        if torch.is_some() {
            "  torch (µs)  ours/torch"
        } else {
            ""
        },
        "stream (µs)",
        if torch.is_some() {
            "  torch stream  ours/torch"
        } else {
            ""
        }
    );
    let mut matmuls = Vec::new();
    let mut failures = 0;
    let cases = if !args.matmuls.is_empty() {
        let limits = bench.gpu.device.limits();
        let compared = args.compared_tiles(&limits);
        // A forced cooperative tile the device's limits refuse is named and left out.
        let usable_coop_tiles: Vec<CoopTiles> = (args.coop_tiles.iter().copied())
            .filter(|tile| match tile.check(&limits) {
                Ok(()) => true,
                Err(error) => {
                    println!("--coop-tile {}: left out: {error}", tile.name());
                    false
                }
            })
            .collect();
        let mut cases = Vec::new();
        for &(m, n, k) in &args.matmuls {
            // The automatic choice, then (with --large) every tile that fits, and for few rows
            // the narrow kernel with each number of lanes.
            let case = MatmulCase {
                m,
                n,
                k,
                tiles: None,
                narrow_lanes: None,
                narrow_splits: None,
                narrow_subgroups: None,
                splits: None,
                coop_tiles: None,
                coop_probe: None,
            };
            cases.push(case);
            // Each forced tile of the cooperative matmul (f16 on a device with cooperative
            // matrices; elsewhere the portable kernels run, and the kernel column says so).
            for &coop_tiles in &usable_coop_tiles {
                cases.push(MatmulCase {
                    coop_tiles: Some(coop_tiles),
                    ..case
                });
            }
            // Each diagnostic probe of each forced tile (of the automatic one where none is).
            let probed: Vec<Option<CoopTiles>> = if usable_coop_tiles.is_empty() {
                vec![None]
            } else {
                usable_coop_tiles.iter().copied().map(Some).collect()
            };
            for &coop_tiles in &probed {
                for &probe in &args.coop_probes {
                    cases.push(MatmulCase {
                        coop_tiles,
                        coop_probe: Some(probe),
                        ..case
                    });
                }
            }
            if m <= MatmulOptions::NARROW_MAX_ROWS as usize {
                // The forced lanes (with --large and none listed: 1 to 64) crossed with the
                // forced splits; automatic where none is listed.
                let lanes: Vec<Option<u32>> = if !args.narrow_lanes.is_empty() {
                    args.narrow_lanes.iter().copied().map(Some).collect()
                } else if args.large {
                    [1, 2, 4, 8, 16, 32, 64].map(Some).to_vec()
                } else {
                    vec![None]
                };
                let splits = forced_or_automatic(&args.narrow_splits);
                let subgroups = forced_or_automatic(&args.narrow_subgroups);
                for &narrow_lanes in &lanes {
                    for &narrow_splits in &splits {
                        for &narrow_subgroups in &subgroups {
                            let forced = narrow_lanes.is_some()
                                || narrow_splits.is_some()
                                || narrow_subgroups.is_some();
                            if forced {
                                cases.push(MatmulCase {
                                    narrow_lanes,
                                    narrow_splits,
                                    narrow_subgroups,
                                    ..case
                                });
                            }
                        }
                    }
                }
            }
            if args.large {
                // Every tile, with each `--split` (or the automatic split).
                let splits: Vec<Option<u32>> = if args.splits.is_empty() {
                    vec![None]
                } else {
                    args.splits.iter().copied().map(Some).collect()
                };
                for &tiles in &compared {
                    cases.extend(splits.iter().map(|&splits| MatmulCase {
                        m,
                        n,
                        k,
                        tiles: Some(tiles),
                        narrow_lanes: None,
                        narrow_splits: None,
                        narrow_subgroups: None,
                        splits,
                        coop_tiles: None,
                        coop_probe: None,
                    }));
                }
            }
        }
        cases
    } else if args.runs("matmul") {
        matmul_cases(args.large, &args.compared_tiles(&bench.gpu.device.limits()))
    } else {
        Vec::new()
    };
    let (measured, probe) = measure_matmuls(&bench, cases, &mut rng)?;
    for Measured {
        case,
        result: r,
        probe_us,
        measurements,
    } in measured
    {
        // PyTorch's time beside the automatic plan's.
        let automatic = case.tiles.is_none()
            && case.coop_tiles.is_none()
            && case.coop_probe.is_none()
            && case.narrow_lanes.is_none()
            && case.narrow_splits.is_none()
            && case.narrow_subgroups.is_none();
        let torch_us = torch
            .as_ref()
            .filter(|_| automatic)
            .and_then(|t| t.products.get(&(r.m, r.n, r.k)).copied());
        let ratio = torch_us.map(|theirs| r.time_us / theirs);
        let torch_stream_us = torch
            .as_ref()
            .filter(|_| automatic)
            .and_then(|t| t.stream.get(&(r.m, r.n, r.k)).copied());
        let stream_ratio = torch_stream_us.map(|theirs| r.stream_us / theirs);
        // The probe that ran (none where the portable kernels ran instead).
        let coop_probe = case.coop_probe.filter(|_| r.kernel.starts_with("coop"));
        println!(
            "{:>6} {:>6} {:>6}  {:<17} {:>5} {:>11.1} {:>10.1} {:>11.2e}  {:<5}{} {:>11.1}{}",
            r.m,
            r.n,
            r.k,
            match coop_probe {
                Some(probe) => format!("{} {}", r.kernel, probe.name()),
                None => r.kernel.clone(),
            },
            r.splits,
            r.time_us,
            r.gflops,
            r.max_rel_err,
            if r.ok { "ok" } else { "FAIL" },
            match (torch_us, ratio) {
                (Some(theirs), Some(ratio)) => format!(" {theirs:>11.1} {ratio:>11.2}"),
                _ if torch.is_some() => format!(" {:>11} {:>11}", "", ""),
                _ => String::new(),
            },
            r.stream_us,
            match (torch_stream_us, stream_ratio) {
                (Some(theirs), Some(ratio)) => format!(" {theirs:>13.1} {ratio:>11.2}"),
                _ => String::new(),
            }
        );
        failures += usize::from(!r.ok);
        matmuls.push(json!({
            "m": r.m, "n": r.n, "k": r.k, "gflops": r.gflops, "max_rel_err": r.max_rel_err,
            "tiles": r.kernel, "splits": r.splits, "time_us": r.time_us,
            "forced_tiles": case.tiles.is_some(), "forced_narrow_lanes": case.narrow_lanes,
            "forced_narrow_splits": case.narrow_splits,
            "forced_narrow_subgroups": case.narrow_subgroups,
            "forced_coop_tiles": case.coop_tiles.map(|t| t.name()),
            "coop_probe": coop_probe.map(CoopProbe::name),
            "cooperative": r.kernel.starts_with("coop"),
            "torch_time_us": torch_us, "ratio": ratio, "stream_us": r.stream_us,
            "torch_stream_us": torch_stream_us, "stream_ratio": stream_ratio,
            "clock_probe_us": probe_us, "measurements": measurements,
            "clock_low": probe.is_some_and(|(_, fastest)| probe_us > fastest * PROBE_SLOW_RATIO),
        }));
    }
    if let Some((size, fastest_us)) = probe {
        let again = matmuls
            .iter()
            .filter(|m| m["measurements"].as_u64() > Some(1))
            .count();
        let low = matmuls
            .iter()
            .filter(|m| m["clock_low"].as_bool() == Some(true))
            .count();
        println!(
            "clock probe ({size}³ product around each shape): fastest {fastest_us:.1} µs; \
             {again} shape(s) measured again after a probe {:.0}% slower; {low} still measured \
             at a lower clock (JSON clock_low)",
            (PROBE_SLOW_RATIO - 1.0) * 100.0
        );
    }
    let chains = (args.serving || !args.chain_plans.is_empty()) && args.runs("matmul");
    let (rows, width) = args.chain_shape;
    let matmul_chain = if chains {
        let [single, step, plan_single, plan_step] = matmul_chain_us(&bench, args.chain_shape)?;
        println!(
            "chain of {rows}x{width}x{width} products read back: {single:.1} µs for one, \
             {step:.2} µs per further dependent product{}; planned: {plan_single:.1} µs for one, \
             {plan_step:.2} µs per further product",
            match torch.as_ref().and_then(|t| t.chain_step_us) {
                Some(theirs) if args.chain_shape == (8, 1024) => {
                    format!(" (PyTorch: {theirs:.2} µs)")
                }
                _ => String::new(),
            }
        );
        Some((single, step, plan_single, plan_step))
    } else {
        None
    };
    let mut chain_plans = Vec::new();
    if chains && !args.chain_plans.is_empty() {
        println!(
            "planned chains, µs per further product, each forced narrow plan right after the \
             automatic one ({CHAIN_ROUNDS} rounds):"
        );
        for ChainPlanSteps {
            lanes,
            splits,
            automatic,
            forced,
        } in chain_plan_steps(&bench, args.chain_shape, &args.chain_plans)?
        {
            let list = |steps: &[f64]| {
                steps
                    .iter()
                    .map(|step| format!("{step:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            println!(
                "  {lanes:>3} lanes, {splits:>2} splits: {}  (automatic: {})",
                list(&forced),
                list(&automatic)
            );
            chain_plans.push(json!({
                "lanes": lanes, "splits": splits, "plan_step_us": forced,
                "automatic_plan_step_us": automatic,
            }));
        }
    }

    let sizes: &[usize] = if !args.sizes.is_empty() {
        &args.sizes
    } else if args.large {
        &[1 << 20, 1 << 22, 1 << 24, 1 << 26]
    } else {
        &[1 << 20, 1 << 22, 1 << 24]
    };
    let all_ops = [
        Elementwise::Binary(BinaryOp::Add),
        Elementwise::Unary(UnaryOp::Relu),
        Elementwise::Unary(UnaryOp::Gelu),
        Elementwise::Sum,
    ];
    let ops: Vec<Elementwise> = if !args.runs("elementwise") {
        Vec::new()
    } else if args.ops.is_empty() {
        all_ops.to_vec()
    } else {
        args.ops
            .iter()
            .filter_map(|name| all_ops.iter().copied().find(|op| op.name() == name))
            .collect()
    };
    if !ops.is_empty() {
        println!();
        println!(
            "{:<8} {:>10} {:>11} {:>9} {:>11} {:>11} {:>9}{}",
            "op",
            "n",
            "time (µs)",
            "GB/s",
            "max_rel_err",
            "stream (µs)",
            "GB/s",
            if torch.is_some() {
                "  torch stream  ours/torch"
            } else {
                ""
            }
        );
    }
    let mut elementwise = Vec::new();
    for op in ops {
        for &n in sizes {
            let r = bench_elementwise(&bench, op, n, &mut rng)
                .with_context(|| format!("{} of {n}", op.name()))?;
            let torch_stream_us = torch
                .as_ref()
                .and_then(|t| t.elementwise.get(&(r.op.to_string(), n)).copied());
            let stream_ratio = torch_stream_us.map(|theirs| r.stream_us / theirs);
            println!(
                "{:<8} {:>10} {:>11.1} {:>9.1} {:>11.2e} {:>11.1} {:>9.1}{}",
                r.op,
                r.n,
                r.time_us,
                r.gbs,
                r.max_rel_err,
                r.stream_us,
                r.stream_gbs,
                match (torch_stream_us, stream_ratio) {
                    (Some(theirs), Some(ratio)) => format!("  {theirs:>12.1}  {ratio:>10.2}"),
                    _ if torch.is_some() => format!("  {:>12}  {:>10}", "-", "-"),
                    _ => String::new(),
                }
            );
            // Exact for add and relu; GELU's exp is the driver's; a sum's order of additions
            // differs from the twin's (the f32 bound, relative to Σ|x|: 2⁻²⁴ per term); f16
            // stores may round to either neighbour.
            let tolerance = match op {
                Elementwise::Unary(UnaryOp::Gelu) => 1e-5,
                Elementwise::Sum => SUM_COLS as f64 / f64::from(1u32 << 24),
                _ => 0.0,
            } + f16_ulp_relative(args.dtype);
            if r.max_rel_err > tolerance {
                println!("  FAIL: {} differs from its CPU twin", r.op);
                failures += 1;
            }
            elementwise.push(json!({
                "op": r.op, "n": r.n, "gbs": r.gbs, "max_rel_err": r.max_rel_err,
                "time_us": r.time_us, "stream_us": r.stream_us, "stream_gbs": r.stream_gbs,
                "torch_stream_us": torch_stream_us, "stream_ratio": stream_ratio,
            }));
        }
    }

    let overhead = if args.runs("overhead") {
        let overhead = op_overhead_us(&bench)?;
        println!();
        println!(
            "op overhead: {:.2} µs of CPU to record one add into an open pass; {:.2} µs with its \
             share of ending the pass and submitting (10,000 ops per batch, warm caches)",
            overhead.record_us, overhead.with_submit_us
        );
        println!(
            "round trip: {:.1} µs to record one tiny add, submit it and read it back; each \
             further dependent add adds {:.2} µs (median of 101 chains of 1 and of 65)",
            overhead.round_trip_us, overhead.chain_step_us
        );
        println!(
            "planned: {:.1} µs for a plan of one tiny add, written, run and read back; each \
             further dependent add adds {:.2} µs",
            overhead.plan_round_trip_us, overhead.plan_chain_step_us
        );
        let phases = round_trip_phases(gpu)?;
        println!(
            "round trip on plain wgpu (medians): record {:.1} µs, submit {:.1}, wait {:.1} \
             blocking ({:.1} in all) or {:.1} spinning on poll ({:.1} in all), map copy {:.1}",
            phases.record_us,
            phases.submit_us,
            phases.blocking_wait_us,
            phases.blocking_total_us,
            phases.spin_wait_us,
            phases.spin_total_us,
            phases.map_copy_us
        );
        Some((overhead, phases))
    } else {
        None
    };
    let (overhead, phases) = match overhead {
        Some((overhead, phases)) => (Some(overhead), Some(phases)),
        None => (None, None),
    };

    if let Some(path) = &args.json {
        let report = json!({
            "adapter": gpu.info.name,
            "backend": format!("{:?}", gpu.info.backend),
            "timing": timing,
            "shader_checks": format!("{:?}", args.checks),
            "dtype": args.dtype.name(),
            "cooperative_matrix": gpu.cooperative_matrix(),
            "cooperative_f16": gpu.cooperative_matmul_f16(),
            "matmul": matmuls,
            "clock_probe": probe.map(|(size, fastest_us)| json!({
                "size": size, "fastest_us": fastest_us, "slow_ratio": PROBE_SLOW_RATIO,
            })),
            "elementwise": elementwise,
            "op_overhead_us": overhead.as_ref().map(|o| o.record_us),
            "op_overhead_with_submit_us": overhead.as_ref().map(|o| o.with_submit_us),
            "round_trip_us": overhead.as_ref().map(|o| o.round_trip_us),
            "chain_step_us": overhead.as_ref().map(|o| o.chain_step_us),
            "plan_round_trip_us": overhead.as_ref().map(|o| o.plan_round_trip_us),
            "plan_chain_step_us": overhead.as_ref().map(|o| o.plan_chain_step_us),
            "round_trip_phases": phases,
            "matmul_chain_single_us": matmul_chain.map(|c| c.0),
            "matmul_chain_step_us": matmul_chain.map(|c| c.1),
            "matmul_plan_chain_single_us": matmul_chain.map(|c| c.2),
            "matmul_plan_chain_step_us": matmul_chain.map(|c| c.3),
            "matmul_chain_shape": matmul_chain.map(|_| [rows, width]),
            "matmul_chain_plans": chain_plans,
            "torch_chain_step_us": torch.as_ref().and_then(|t| t.chain_step_us),
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if failures > 0 {
        bail!("{failures} results differ from their CPU twins");
    }
    Ok(())
}
