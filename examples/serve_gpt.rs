//! GPT-2 served three ways under one memory budget: the pool with a paged KV cache, the pool
//! with each request's KV cache reserved contiguously for the longest sequence, and one buffer
//! per tensor with the contiguous cache.
//!
//! ```text
//! cargo run --release --example serve_gpt -- [--model tiny|gpt2] [--weights FILE]
//!     [--write-weights FILE] [--requests N] [--max-batch B] [--budget BYTES] [--seed S]
//!     [--json OUT] [--out DIR] [--sides paged,contiguous,naive] [--eager] [--block-tokens T]
//!     [--max-step-tokens R] [--min-step-rows R] [--profile] [--warm-s S]
//!     [--rate R] [--shared-prefix N:L] [--slo-ttft-ms MS] [--slo-tpot-ms MS]
//!     [--admission reserve|optimistic[:WATERMARK]] [--prefix-caching on|off]
//!     [--dtype f32|f16]
//! ```
//!
//! A seeded stream of requests (`--seed`, default 1): prompt lengths uniform in 32–512 tokens and
//! output lengths uniform in 32–256 (both cut to the model's context; `--model tiny`: 3–40 and
//! 1–24 in a context of 128), prompt tokens uniform over the vocabulary, every request arriving
//! at the start — or, with `--rate R`, Poisson arrivals at R requests a second (exponential gaps
//! of mean 1/R, seeded by `--seed`). `--shared-prefix N:L` starts every prompt with one of N
//! system prompts of L random tokens (each request's chosen uniformly at random, seeded), its own
//! drawn prompt after it (cut first, then the outputs, where the context is passed). A side
//! submits each request as its arrival time passes: while the server is busy it steps, and when
//! idle it sleeps until the next arrival. Each side serves the whole stream with continuous batching (at most
//! `--max-batch` sequences per step, default 16; sequences join and leave between steps) and
//! greedy decoding, every step planned ahead (a plan per row count, one arena):
//!
//! - **paged**: KV blocks of 16 tokens taken as sequences reach them (vLLM's PagedAttention);
//!   admission promises each request the blocks its prompt and outputs can reach
//!   (`--admission reserve`, the default), or admits while 1% of the blocks stay free and
//!   preempts the newest sequence when one needs a block and none is free, recomputing it later
//!   (`--admission optimistic`, or `optimistic:W` for a watermark W in 0..1); prefix caching
//!   shares the whole blocks of prompts that start alike (`--prefix-caching on`, the default;
//!   `off` computes every prompt token);
//! - **contiguous**: each request's KV reserved whole for the model's context at admission (as
//!   Hugging Face's static cache and FasterTransformer do), in the same kind of cache;
//! - **naive**: as contiguous, on a pool that gives every tensor a buffer of its own.
//!
//! Every side admits under `--budget` (bytes; default: the weights and the steps' activations,
//! plus half of what the contiguous cache needs for `--max-batch` sequences of the full context):
//! the KV cache takes what the weights and activations leave, and a request waits until its
//! blocks are free. Planned sides pipeline their steps (`Server::step_ahead`: the next step is
//! submitted before the one in flight is read). `--eager` adds `paged_eager`, the paged side
//! with every step's ops run eagerly, and `paged_sync`, the paged side planned but each step
//! waited for (the planned-versus-eager comparison, and what pipelining adds); both may also be
//! named in `--sides`, which sets the order. `--profile` adds `paged_profile` (eager, GPU
//! timestamps around every dispatch, decode-only steps apart; the paged side's cache, no
//! budget). `--warm-s S` keeps each side's
//! GPU busy with padding steps for S seconds before its stream (clocks that follow the load have
//! risen); each side's `span_unix_s` lets its run be laid beside a clock log.
//!
//! `--dtype f16` stores the weights and the KV cache in f16 (products accumulate in f32; the
//! device must offer `SHADER_F16`) and opens the device with cooperative matrices where the
//! adapter has them, so that prefill products run on the tensor cores (products of up to 16
//! rows, decode steps, stay on the narrow kernel, which folds the layer norm into its loads);
//! the default budget is
//! the f32 one whatever the dtype, so that f16 and f32 runs compare at one budget (f16 holds
//! about twice the sequences). The JSON's `plan_steps` gives each step plan's dispatches (decode-only
//! plans apart).
//!
//! Latencies count from each request's arrival: TTFT (to its first token on the host) and TPOT
//! (per output token after the first), p50 and p99 over requests. Goodput: the requests a second
//! (over the side's wall time) that meet both objectives, TTFT at most `--slo-ttft-ms` (default
//! 1000) and TPOT at most `--slo-tpot-ms` (default 100; a request of one output meets it).
//! On a terminal a progress bar per side (requests done, tokens/s, KV blocks held) shows on
//! stderr, at most ten times a second; not under `--json`, nor where stderr is not a terminal.
//!
//! Weights: `--weights PATH` (a folder as Hugging Face's `save_pretrained` writes it,
//! `model.safetensors` and `config.json`, or a safetensors file in its GPT-2 layout, the
//! configuration in its `__metadata__` or a `config.json` beside it), else seeded random ones (`--seed`); `--write-weights FILE` writes those and
//! exits. The JSON (`--json`) holds the stream (`stream.requests`, `max_batch`: the input of
//! `benches/torch/serve_gpt.py --stream`; each request with its `arrival_s`, seconds after the
//! start, and the traffic in `stream.traffic`), `slo` (the objectives) and `sides.{paged,contiguous,naive}` with throughput,
//! latencies, KV and pool memory, and every request's tokens. `--out DIR` writes each side's
//! memory exports (summary, segment map, snapshot for memory_viz, Perfetto trace) taken when half
//! the requests are done, the KV cache's blocks labelled by sequence. Pool peaks count from the
//! end of each side's warm-up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use wgpu_pool::compute::{Context, ContextOptions, DType, MatmulOptions};
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::model::{Gpt2Config, Gpt2Weights, StoredDtype};
use wgpu_pool::paging::{percentile, KvLayout, RequestSpec, StreamSpec, TimedRequest, Traffic};
use wgpu_pool::report::{write_exports, AllocatorReport};
use wgpu_pool::scheduler::Admission;
use wgpu_pool::serve::{Completion, Execution, Gpt2, KvCache, Server, ServerOptions};
use wgpu_pool::{request_gpu_with, Gpu, GpuOptions, LimitsChoice, Pool, PoolOptions};

/// The command line.
#[derive(Debug, Clone)]
struct Args {
    model: String,
    weights: Option<PathBuf>,
    write_weights: Option<PathBuf>,
    requests: usize,
    max_batch: usize,
    budget: Option<u64>,
    seed: u64,
    json: Option<PathBuf>,
    out: Option<PathBuf>,
    sides: Vec<String>,
    eager: bool,
    block_tokens: usize,
    max_step_tokens: usize,
    min_step_rows: usize,
    profile: bool,
    warm_s: f64,
    rate: Option<f64>,
    shared_prefix: Option<(usize, usize)>,
    slo: Slo,
    admission: Admission,
    prefix_caching: bool,
    dtype: DType,
}

/// `reserve`, `optimistic` or `optimistic:W`.
fn parse_admission(text: &str) -> Result<Admission> {
    let watermark = match text.split_once(':') {
        None if text == "reserve" => return Ok(Admission::Reserve),
        None if text == "optimistic" => 0.01,
        Some(("optimistic", w)) => w
            .parse::<f64>()
            .ok()
            .filter(|w| (0.0..1.0).contains(w))
            .with_context(|| {
                format!("--admission optimistic:W takes a watermark in 0..1, not {w:?}")
            })?,
        _ => bail!("--admission is reserve, optimistic or optimistic:W, not {text:?}"),
    };
    Ok(Admission::Optimistic { watermark })
}

/// The serving objectives a request must meet to count in the goodput.
#[derive(Debug, Clone, Copy, Serialize)]
struct Slo {
    /// Time to first token, from arrival.
    ttft_ms: f64,
    /// Time per output token after the first.
    tpot_ms: f64,
}

/// `N:L`: N shared prefixes of L tokens.
fn parse_prefix(text: &str) -> Result<(usize, usize)> {
    let parsed = text
        .split_once(':')
        .and_then(|(n, l)| Some((n.parse().ok()?, l.parse().ok()?)));
    match parsed {
        Some((n, l)) if n > 0 && l > 0 => Ok((n, l)),
        _ => bail!("--shared-prefix is N:L (N prompts of L tokens, both at least 1), not {text:?}"),
    }
}

fn parse_args(arguments: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut args = Args {
        model: "tiny".into(),
        weights: None,
        write_weights: None,
        requests: 16,
        max_batch: 16,
        budget: None,
        seed: 1,
        json: None,
        out: None,
        sides: vec!["paged".into(), "contiguous".into(), "naive".into()],
        eager: false,
        block_tokens: 16,
        max_step_tokens: 512,
        min_step_rows: 1,
        profile: false,
        warm_s: 0.0,
        rate: None,
        shared_prefix: None,
        slo: Slo {
            ttft_ms: 1000.0,
            tpot_ms: 100.0,
        },
        admission: Admission::Reserve,
        prefix_caching: true,
        dtype: DType::F32,
    };
    let mut it = arguments.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value()?,
            "--weights" => args.weights = Some(value()?.into()),
            "--write-weights" => args.write_weights = Some(value()?.into()),
            "--requests" => args.requests = value()?.parse().context("--requests")?,
            "--max-batch" => args.max_batch = value()?.parse().context("--max-batch")?,
            "--budget" => args.budget = Some(value()?.parse().context("--budget")?),
            "--seed" => args.seed = value()?.parse().context("--seed")?,
            "--json" => args.json = Some(value()?.into()),
            "--out" => args.out = Some(value()?.into()),
            "--sides" => args.sides = value()?.split(',').map(str::to_owned).collect(),
            "--eager" => args.eager = true,
            "--profile" => args.profile = true,
            "--warm-s" => args.warm_s = value()?.parse().context("--warm-s")?,
            "--rate" => args.rate = Some(value()?.parse().context("--rate")?),
            "--shared-prefix" => args.shared_prefix = Some(parse_prefix(&value()?)?),
            "--slo-ttft-ms" => args.slo.ttft_ms = value()?.parse().context("--slo-ttft-ms")?,
            "--slo-tpot-ms" => args.slo.tpot_ms = value()?.parse().context("--slo-tpot-ms")?,
            "--admission" => args.admission = parse_admission(&value()?)?,
            "--prefix-caching" => {
                args.prefix_caching = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => bail!("--prefix-caching is on or off, not {other:?}"),
                }
            }
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    other => bail!("--dtype is f32 or f16, not {other:?}"),
                }
            }
            "--min-step-rows" => {
                args.min_step_rows = value()?.parse().context("--min-step-rows")?
            }
            "--block-tokens" => args.block_tokens = value()?.parse().context("--block-tokens")?,
            "--max-step-tokens" => {
                args.max_step_tokens = value()?.parse().context("--max-step-tokens")?
            }
            other => bail!("unknown argument {other:?} (see the example's documentation)"),
        }
    }
    if !matches!(args.model.as_str(), "tiny" | "gpt2") {
        bail!("--model is tiny or gpt2, not {:?}", args.model);
    }
    if let Some(side) = args.sides.iter().find(|s| {
        !matches!(
            s.as_str(),
            "paged" | "contiguous" | "naive" | "paged_eager" | "paged_sync"
        )
    }) {
        bail!("--sides takes paged, contiguous, naive, paged_eager and paged_sync, not {side:?}");
    }
    if !(args.warm_s >= 0.0 && args.warm_s <= 60.0) {
        bail!("--warm-s is 0 to 60 seconds");
    }
    let positive = |ms: f64| ms > 0.0 && ms.is_finite();
    if !(positive(args.slo.ttft_ms) && positive(args.slo.tpot_ms)) {
        bail!("--slo-ttft-ms and --slo-tpot-ms are positive numbers of milliseconds");
    }
    if args.requests == 0 || args.max_batch == 0 {
        bail!("--requests and --max-batch must be at least 1");
    }
    Ok(args)
}

/// One side's figures.
#[derive(Debug, Serialize)]
struct Side {
    layout: String,
    execution: String,
    /// Steps pipelined (`Server::step_ahead`), and the rows fed on the GPU so.
    pipelined: bool,
    fed_rows: u64,
    generated_tokens: u64,
    wall_s: f64,
    /// When the stream started and ended (seconds since the Unix epoch).
    span_unix_s: [f64; 2],
    generated_tokens_per_s: f64,
    ttft_ms_p50: f64,
    ttft_ms_p99: f64,
    tpot_ms_p50: f64,
    tpot_ms_p99: f64,
    /// Requests finished a second over `wall_s`.
    requests_per_s: f64,
    /// Requests meeting the objectives (`slo`), and those a second over `wall_s`.
    slo_met: usize,
    goodput_rps: f64,
    decode_step_ms_mean: f64,
    decode_steps: u64,
    steps: u64,
    /// Planned sides: the dispatches of each step plan, by `"N decode"` (decode-only steps of N
    /// rows) and `"N any"` (steps of any N rows; N the row counts steps are padded to).
    plan_steps: std::collections::BTreeMap<String, usize>,
    kv_blocks: usize,
    kv_cache_bytes: u64,
    kv_reserved_bytes_peak: u64,
    kv_used_bytes_peak: u64,
    kv_waste: f64,
    capacity_at_max_length: usize,
    weights_bytes: u64,
    activation_bytes: u64,
    peak_reserved_bytes: u64,
    peak_requested_bytes: u64,
    in_flight_mean: f64,
    in_flight_max: usize,
    waits: u64,
    preemptions: u64,
    /// Tokens computed again after preemption.
    recomputed_tokens: u64,
    /// Prompt tokens found in the cache (prefix caching).
    cached_tokens: u64,
    oom_errors: u64,
    /// Segments the pool created while serving the stream (building the server apart).
    segments_created: u64,
    device_reported_bytes: Option<u64>,
    accounted_bytes: u64,
    build_s: f64,
    /// `--profile`: GPU time per kernel, most first, over the decode-only steps and over the
    /// others (those with prompt rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<Profile>,
    requests: Vec<RequestTokens>,
}

/// A profiled run's GPU time per kernel, decode-only steps apart.
#[derive(Debug, Serialize)]
struct Profile {
    decode_steps: Vec<KernelShare>,
    other_steps: Vec<KernelShare>,
}

/// The kernel timings of a profiled run, by the kind of step they came from.
#[derive(Debug, Default)]
struct Timings {
    decode: Vec<wgpu_pool::compute::KernelTiming>,
    decode_steps: u64,
    other: Vec<wgpu_pool::compute::KernelTiming>,
    other_steps: u64,
}

/// One kernel's GPU time in a profiled run.
#[derive(Debug, Serialize)]
struct KernelShare {
    kernel: String,
    dispatches: u64,
    gpu_ms: f64,
    gpu_us_per_step: f64,
}

/// GPU time per kernel (timestamps around every dispatch), most first.
fn kernel_profile(
    what: &str,
    timings: &[wgpu_pool::compute::KernelTiming],
    steps: u64,
) -> Vec<KernelShare> {
    let mut by_kernel: std::collections::BTreeMap<&str, (u64, f64)> = Default::default();
    for timing in timings {
        let entry = by_kernel.entry(timing.kernel.as_str()).or_default();
        entry.0 += 1;
        entry.1 += timing.gpu_ns;
    }
    let mut shares: Vec<KernelShare> = by_kernel
        .into_iter()
        .map(|(kernel, (dispatches, ns))| KernelShare {
            kernel: kernel.to_owned(),
            dispatches,
            gpu_ms: ns / 1e6,
            gpu_us_per_step: ns / 1e3 / steps.max(1) as f64,
        })
        .collect();
    shares.sort_by(|a, b| b.gpu_ms.total_cmp(&a.gpu_ms));
    let total: f64 = shares.iter().map(|share| share.gpu_us_per_step).sum();
    println!("  {what}: {steps} steps, {total:.1} µs of kernels a step");
    for share in shares.iter().take(12) {
        println!(
            "  {:>9.1} µs/step {:>6} dispatches  {}",
            share.gpu_us_per_step, share.dispatches, share.kernel
        );
    }
    shares
}

#[derive(Debug, Serialize)]
struct RequestTokens {
    prompt: Vec<u32>,
    output: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct Stream<'a> {
    spec: &'a StreamSpec,
    traffic: &'a Traffic,
    requests: &'a [TimedRequest],
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    adapter: String,
    backend: String,
    model: Gpt2Config,
    weights: String,
    max_batch: usize,
    block_tokens: usize,
    budget_bytes: u64,
    budget_rule: &'static str,
    slo: Slo,
    /// The paged sides' admission (`reserve`, or `optimistic` and its watermark).
    admission: String,
    /// Whether the paged sides cache prefixes.
    prefix_caching: bool,
    /// The weights' and KV cache's element type (`--dtype`).
    dtype: String,
    stream: Stream<'a>,
    sides: serde_json::Map<String, serde_json::Value>,
}

fn main() -> Result<()> {
    let list: Vec<String> = std::env::args().skip(1).collect();
    let args = parse_args(list.clone())?;
    if args.write_weights.is_none() {
        // f16: the prefill products on cooperative matrices (tensor cores) where offered.
        let options = GpuOptions::default()
            .with_limits(LimitsChoice::Adapter)
            .with_cooperative_matrix(args.dtype == DType::F16);
        let gpu = request_gpu_with(options)?;
        return serve(Some(&gpu), &list, true);
    }
    serve(None, &list, true)
}

/// The example on `gpu` with the command line `list` (no GPU is needed for `--write-weights`),
/// no progress bar.
pub fn run(gpu: Option<&Gpu>, list: &[String]) -> Result<()> {
    serve(gpu, list, false)
}

/// [`run`], with a progress bar per side where `progress` and stderr is a terminal (never under
/// `--json`).
fn serve(gpu: Option<&Gpu>, list: &[String], progress: bool) -> Result<()> {
    let args = parse_args(list.iter().cloned())?;
    let progress = progress && args.json.is_none();
    let (weights, source) = weights(&args)?;
    if let Some(path) = &args.write_weights {
        weights.write(path, StoredDtype::F32)?;
        println!(
            "wrote {} ({} weights, {source})",
            path.display(),
            args.model
        );
        return Ok(());
    }
    let config = weights.config;
    let stream_spec = stream_spec(&args, &config);
    let traffic = Traffic {
        rate: args.rate,
        shared_prefix: args.shared_prefix,
        seed: args.seed,
    };
    let requests = stream_spec.generate_timed(&traffic)?;
    let gpu = gpu.context("serving needs a GPU")?;
    println!(
        "{} ({:?}): GPT-2 {} layers × {} wide, {:?}, {} requests, at most {} in flight",
        gpu.info.name,
        gpu.info.backend,
        config.n_layer,
        config.n_embd,
        args.dtype,
        args.requests,
        args.max_batch
    );
    println!(
        "arrivals {}{}; objectives: TTFT ≤ {} ms, TPOT ≤ {} ms",
        match args.rate {
            Some(rate) => format!("Poisson at {rate} requests/s"),
            None => "all at t = 0".into(),
        },
        match args.shared_prefix {
            Some((n, l)) => format!(", prompts after one of {n} shared prefixes of {l} tokens"),
            None => String::new(),
        },
        args.slo.ttft_ms,
        args.slo.tpot_ms
    );
    let budget = match args.budget {
        Some(budget) => budget,
        None => default_budget(gpu, &weights, &args)?,
    };
    let mut sides = serde_json::Map::new();
    let specs = side_specs(&args, config.n_ctx);
    // The eager sides take the paged side's cache, whichever side comes first.
    let paged_blocks = if specs.iter().any(|spec| spec.execution == Execution::Eager) {
        Some(paged_cache_blocks(gpu, &weights, &args, budget)?)
    } else {
        None
    };
    for spec in specs {
        let name = spec.name.clone();
        let served = serve_side(
            gpu,
            &weights,
            &requests,
            &args,
            budget,
            &spec,
            paged_blocks,
            progress,
        );
        match served {
            Ok(side) => {
                print_side(&name, &side);
                sides.insert(name, serde_json::to_value(side)?);
            }
            Err(error) => {
                // A side that cannot serve under the budget is a result, not the end of the run.
                println!("{name:>12}: refused: {error:#}");
                sides.insert(name, serde_json::json!({ "error": format!("{error:#}") }));
            }
        }
    }
    let Some(path) = &args.json else {
        return Ok(());
    };
    let output = Output {
        adapter: gpu.info.name.clone(),
        backend: format!("{:?}", gpu.info.backend),
        model: config,
        weights: source,
        max_batch: args.max_batch,
        block_tokens: args.block_tokens,
        budget_bytes: budget,
        budget_rule: if args.budget.is_some() {
            "--budget"
        } else {
            "weights + activations + half the contiguous cache of max_batch full contexts"
        },
        slo: args.slo,
        admission: match args.admission {
            Admission::Reserve => "reserve".to_owned(),
            Admission::Optimistic { watermark } => format!("optimistic:{watermark}"),
        },
        prefix_caching: args.prefix_caching,
        dtype: format!("{:?}", args.dtype).to_lowercase(),
        stream: Stream {
            spec: &stream_spec,
            traffic: &traffic,
            requests: &requests,
        },
        sides,
    };
    std::fs::write(path, serde_json::to_string_pretty(&output)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The weights (`--weights`, else seeded random ones of `--model`) and where they came from.
fn weights(args: &Args) -> Result<(Gpt2Weights, String)> {
    match &args.weights {
        Some(path) => {
            let loaded = Gpt2Weights::load(path, None)
                .with_context(|| format!("reading {}", path.display()))?;
            Ok((loaded.weights, path.display().to_string()))
        }
        None => {
            let config = match args.model.as_str() {
                "gpt2" => Gpt2Config::gpt2_small(),
                _ => Gpt2Config::tiny(),
            };
            let weights = Gpt2Weights::random(&config, args.seed)?;
            Ok((weights, format!("random, seed {}", args.seed)))
        }
    }
}

/// The stream of `--model`'s distribution over `config` (the weights' configuration).
fn stream_spec(args: &Args, config: &Gpt2Config) -> StreamSpec {
    match args.model.as_str() {
        "gpt2" => {
            StreamSpec::gpt2_serving(args.requests, config.vocab_size, config.n_ctx, args.seed)
        }
        _ => StreamSpec {
            requests: args.requests,
            prompt_tokens: (3, 40),
            output_tokens: (1, 24),
            vocab_size: config.vocab_size,
            max_tokens: config.n_ctx,
            seed: args.seed,
        },
    }
}

/// The options of a side.
fn options(
    args: &Args,
    budget: Option<u64>,
    layout: KvLayout,
    execution: Execution,
) -> ServerOptions {
    ServerOptions {
        max_batch: args.max_batch,
        layout,
        block_tokens: args.block_tokens,
        max_step_tokens: args.max_step_tokens.max(args.max_batch),
        min_step_rows: args.min_step_rows,
        budget_bytes: budget,
        kv_blocks: budget.is_none().then_some(2),
        execution,
        // The paged sides admit and share prefixes as asked; the contiguous ones reserve.
        admission: match layout {
            KvLayout::Paged => args.admission,
            KvLayout::Contiguous { .. } => Admission::Reserve,
        },
        prefix_caching: args.prefix_caching,
    }
}

/// What the pool reserves before the KV cache (the weights, the planned steps' activations and
/// sampled tokens, by the dry run of a two-block cache), plus half the contiguous cache of
/// `max_batch` sequences of the full context.
fn default_budget(gpu: &Gpu, weights: &Gpt2Weights, args: &Args) -> Result<u64> {
    let pool = Pool::new(gpu, PoolOptions::default())?;
    let context = Context::new(&pool, ContextOptions::default())?;
    let model = Gpt2::upload(&context, weights, DType::F32)?;
    let options = options(args, None, KvLayout::Paged, Execution::Planned);
    let fixed = Server::dry_run(&context, &model, &options)?.before_cache_bytes();
    let config = weights.config;
    let block_bytes = KvCache::block_bytes(&config, args.block_tokens, DType::F32);
    let contiguous =
        args.max_batch as u64 * config.n_ctx.div_ceil(args.block_tokens) as u64 * block_bytes;
    Ok(fixed + contiguous / 2)
}

/// The blocks of the paged side's KV cache under `budget` (its dry run): what the eager sides'
/// caches get.
fn paged_cache_blocks(gpu: &Gpu, weights: &Gpt2Weights, args: &Args, budget: u64) -> Result<usize> {
    let pool = Pool::new(gpu, PoolOptions::default())?;
    let context = Context::new(&pool, ContextOptions::default())?;
    let model = Gpt2::upload(&context, weights, args.dtype)?;
    let options = options(args, Some(budget), KvLayout::Paged, Execution::Planned);
    Ok(Server::dry_run(&context, &model, &options)?.kv_blocks)
}

/// One side: its name, cache layout, execution and pool, and whether its steps are pipelined.
#[derive(Debug, Clone)]
struct SideSpec {
    name: String,
    layout: KvLayout,
    execution: Execution,
    naive: bool,
    pipelined: bool,
}

/// The sides the command line asks for.
fn side_specs(args: &Args, n_ctx: usize) -> Vec<SideSpec> {
    let spec = |name: &str, layout, execution, naive| SideSpec {
        name: name.to_owned(),
        layout,
        execution,
        naive,
        pipelined: execution == Execution::Planned,
    };
    let contiguous = KvLayout::Contiguous { max_tokens: n_ctx };
    let mut specs: Vec<SideSpec> = args
        .sides
        .iter()
        .map(|side| match side.as_str() {
            "paged" => spec(side, KvLayout::Paged, Execution::Planned, false),
            "contiguous" => spec(side, contiguous, Execution::Planned, false),
            "paged_eager" => spec(side, KvLayout::Paged, Execution::Eager, false),
            "paged_sync" => SideSpec {
                pipelined: false,
                ..spec(side, KvLayout::Paged, Execution::Planned, false)
            },
            _ => spec(side, contiguous, Execution::Planned, true),
        })
        .collect();
    if args.eager {
        for name in ["paged_eager", "paged_sync"] {
            if !specs.iter().any(|spec| spec.name == name) {
                let (execution, pipelined) = match name {
                    "paged_eager" => (Execution::Eager, false),
                    _ => (Execution::Planned, false),
                };
                specs.push(SideSpec {
                    pipelined,
                    ..spec(name, KvLayout::Paged, execution, false)
                });
            }
        }
    }
    if args.profile {
        // Timestamps around every dispatch: the eager path records them (a plan replays its
        // prebuilt dispatches untimed); its kernels are the planned step's.
        specs.push(spec(
            "paged_profile",
            KvLayout::Paged,
            Execution::Eager,
            false,
        ));
    }
    specs
}

/// A side's pool, context and server, warmed up, with the weights' bytes and the seconds it
/// took. The eager sides get the paged side's cache (its blocks from the same budget, which
/// their own dry run would give them too, or one block more: the rule is the same for both
/// modes) so that their steps are the same work, under the same budget, which keeps room for
/// their intermediates beside the cache.
fn start_side(
    gpu: &Gpu,
    weights: &Gpt2Weights,
    args: &Args,
    budget: u64,
    spec: &SideSpec,
    paged_blocks: Option<usize>,
) -> Result<(Pool, Context, Server, u64, f64)> {
    let history = args.out.is_some().then(HistoryOptions::default);
    let pool_options = PoolOptions {
        history,
        ..PoolOptions::default()
    };
    let pool = if spec.naive {
        Pool::naive(gpu, pool_options)
    } else {
        Pool::new(gpu, pool_options)?
    };
    let defaults = ContextOptions::default();
    let context_options = ContextOptions {
        profile: spec.name == "paged_profile",
        // f16: products of up to 16 rows (decode steps) on the narrow kernel, whose loads fold
        // the layer norm in, rather than on cooperative matrices (a 16-row tile half empty).
        matmul: MatmulOptions {
            cooperative_min_rows: MatmulOptions::NARROW_MAX_ROWS + 1,
            ..defaults.matmul.clone()
        },
        ..defaults
    };
    let context = Context::new(&pool, context_options)?;
    let built = Instant::now();
    let model = Gpt2::upload(&context, weights, args.dtype)?;
    let weights_bytes = model.bytes();
    let side_options = match (spec.execution, paged_blocks) {
        // The profile is a diagnostic of the kernels: the paged side's cache, no budget (eager
        // steps' intermediates, each a pool allocation, need more than the plans' arena that
        // the budget leaves them; at GPT-2 small's default budget they run out of memory).
        (Execution::Eager, Some(blocks)) if spec.name == "paged_profile" => ServerOptions {
            kv_blocks: Some(blocks),
            ..options(args, None, spec.layout, spec.execution)
        },
        (Execution::Eager, Some(blocks)) => ServerOptions {
            kv_blocks: Some(blocks),
            ..options(args, Some(budget), spec.layout, spec.execution)
        },
        _ => options(args, Some(budget), spec.layout, spec.execution),
    };
    let server = Server::new(&context, model, side_options)?;
    let build_s = built.elapsed().as_secs_f64();
    Ok((pool, context, server, weights_bytes, build_s))
}

/// What serving the stream gave: the finished requests (in id order), the seconds, and the
/// device's and the crate's largest figures read at one moment every 16 steps.
struct Served {
    done: Vec<Completion>,
    /// By request id: from its arrival to its submission (the step in flight when it arrived).
    lags: std::collections::HashMap<u64, Duration>,
    timings: Option<Timings>,
    wall_s: f64,
    /// When the stream started and ended (seconds since the Unix epoch), to lay beside a clock log.
    span_unix_s: [f64; 2],
    device_reported: Option<u64>,
    accounted: u64,
    ooms: u64,
    /// Segments the pool created while serving.
    segments: u64,
}

/// Serves `requests` to the end, each submitted once its arrival time has passed: everything
/// arrived is submitted, then the server steps while busy, and sleeps until the next arrival
/// when idle. Exports the memory at half of them; shows progress on `bar`.
#[allow(clippy::too_many_arguments)] // one side's run: its server, stream and outputs
fn serve_stream(
    gpu: &Gpu,
    pool: &Pool,
    server: &mut Server,
    requests: &[TimedRequest],
    spec: &SideSpec,
    profiled: Option<&Context>,
    out: Option<&std::path::Path>,
    bar: &ProgressBar,
) -> Result<Served> {
    let (ooms_before, segments_before) = (pool.stats().oom_count, pool.stats().segments.total);
    let mut timings = profiled.map(|_| Timings::default());
    let start = Instant::now();
    let from_unix_s = unix_seconds();
    let (mut device_reported, mut accounted, mut exported) = (None, 0, false);
    let mut done: Vec<Completion> = Vec::new();
    let mut lags = std::collections::HashMap::new();
    let (mut next, mut shown) = (0, start);
    loop {
        while let Some(timed) = requests.get(next) {
            let arrival = Duration::from_secs_f64(timed.arrival_s);
            let now = start.elapsed();
            if arrival > now {
                break;
            }
            let id = server.submit(&timed.request)?;
            lags.insert(id, now - arrival);
            next += 1;
        }
        if !server.busy() {
            let Some(timed) = requests.get(next) else {
                break;
            };
            let arrival = Duration::from_secs_f64(timed.arrival_s);
            std::thread::sleep(arrival.saturating_sub(start.elapsed()));
            continue;
        }
        let decode_steps = server.stats().decode_steps;
        if spec.pipelined {
            server.step_ahead()?;
        } else {
            server.step()?;
        }
        if let (Some(context), Some(timings)) = (profiled, timings.as_mut()) {
            let step = context.take_kernel_timings();
            if server.stats().decode_steps > decode_steps {
                timings.decode.extend(step);
                timings.decode_steps += 1;
            } else {
                timings.other.extend(step);
                timings.other_steps += 1;
            }
        }
        done.extend(server.take_finished());
        if server.stats().steps % 16 == 1 {
            accounted = accounted.max(gpu.accounted().total_bytes());
            if let Some(bytes) =
                AllocatorReport::from_device(&gpu.device, gpu.info.backend).total_allocated_bytes()
            {
                device_reported = Some(device_reported.unwrap_or(0).max(bytes));
            }
        }
        if !exported && done.len() * 2 >= requests.len() {
            exported = true;
            if let Some(dir) = out {
                server.label_kv()?;
                write_exports(pool, dir)?;
            }
        }
        if !bar.is_hidden() && shown.elapsed() >= Duration::from_millis(100) {
            shown = Instant::now();
            let blocks = server.blocks();
            bar.set_position(done.len() as u64);
            bar.set_message(format!(
                "{:.1} tokens/s  KV blocks {}/{}",
                server.stats().generated_tokens as f64 / start.elapsed().as_secs_f64(),
                blocks.held_blocks(),
                blocks.num_blocks()
            ));
        }
    }
    bar.finish_and_clear();
    let wall_s = start.elapsed().as_secs_f64();
    let span_unix_s = [from_unix_s, unix_seconds()];
    done.sort_by_key(|c| c.id);
    Ok(Served {
        done,
        lags,
        timings,
        span_unix_s,
        wall_s,
        device_reported,
        accounted,
        ooms: pool.stats().oom_count - ooms_before,
        segments: pool.stats().segments.total - segments_before,
    })
}

/// Serves `requests` on a new pool and server, with a progress bar on a terminal where
/// `progress`; returns the side's figures.
#[allow(clippy::too_many_arguments)] // the run's parts a side reads
fn serve_side(
    gpu: &Gpu,
    weights: &Gpt2Weights,
    requests: &[TimedRequest],
    args: &Args,
    budget: u64,
    spec: &SideSpec,
    paged_blocks: Option<usize>,
    progress: bool,
) -> Result<Side> {
    let (pool, context, mut server, weights_bytes, mut build_s) =
        start_side(gpu, weights, args, budget, spec, paged_blocks)?;
    let warm = Instant::now();
    // Warm-up: a padding step of every planned row count (pipelines compiled at first use),
    // then the first request's prompt and two outputs.
    server.warm_up()?;
    server.submit(&RequestSpec {
        prompt: requests[0].request.prompt.clone(),
        max_new_tokens: 2,
    })?;
    server.run()?;
    // `--warm-s`: padding steps for that long, so that the GPU's clock, which follows its load
    // on some machines (the lent H200 under Vulkan), has risen before the stream.
    let warming = Instant::now();
    while warming.elapsed().as_secs_f64() < args.warm_s {
        server.warm_up()?;
    }
    server.reset_stats();
    // Peaks from here: the serving's (building made the cache, the plans and the warm-up's
    // intermediates).
    pool.reset_peaks();
    build_s += warm.elapsed().as_secs_f64();
    let out = args.out.as_ref().map(|dir| dir.join(&spec.name));
    let profiled = (spec.name == "paged_profile").then_some(&context);
    // Warm-up's timings apart.
    drop(context.take_kernel_timings());
    let bar = progress_bar(&spec.name, requests.len(), progress)?;
    let mut served = serve_stream(
        gpu,
        &pool,
        &mut server,
        requests,
        spec,
        profiled,
        out.as_deref(),
        &bar,
    )?;
    let profile = served.timings.take().map(|timings| Profile {
        decode_steps: kernel_profile("decode-only steps", &timings.decode, timings.decode_steps),
        other_steps: kernel_profile(
            "steps with prompt rows",
            &timings.other,
            timings.other_steps,
        ),
    });
    Ok(side_figures(
        &server,
        &pool,
        served,
        spec,
        weights_bytes,
        build_s,
        profile,
        weights.config.n_ctx,
        args.slo,
    ))
}

/// A side's progress bar on stderr, redrawn at most ten times a second: hidden unless
/// `progress` and stderr is a terminal.
fn progress_bar(name: &str, requests: usize, progress: bool) -> Result<ProgressBar> {
    if !progress {
        return Ok(ProgressBar::hidden());
    }
    let bar = ProgressBar::with_draw_target(
        Some(requests as u64),
        ProgressDrawTarget::stderr_with_hz(10),
    );
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} requests  {msg}")?
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_owned());
    Ok(bar)
}

/// The side's figures from its server, pool and run.
#[allow(clippy::too_many_arguments)] // the parts of one side's figures, read once
fn side_figures(
    server: &Server,
    pool: &Pool,
    served: Served,
    spec: &SideSpec,
    weights_bytes: u64,
    build_s: f64,
    profile: Option<Profile>,
    n_ctx: usize,
    slo: Slo,
) -> Side {
    let stats = server.stats().clone();
    let pool_stats = pool.stats();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // From arrival: the server counts from submission, which waits for the step in flight.
    let ttft: Vec<f64> = served
        .done
        .iter()
        .map(|c| ms(c.time_to_first_token + served.lags.get(&c.id).copied().unwrap_or_default()))
        .collect();
    let tpots: Vec<Option<f64>> = served
        .done
        .iter()
        .map(|c| c.time_per_output_token().map(ms))
        .collect();
    let tpot: Vec<f64> = tpots.iter().flatten().copied().collect();
    let slo_met = ttft
        .iter()
        .zip(&tpots)
        .filter(|(&ttft, tpot)| ttft <= slo.ttft_ms && tpot.is_none_or(|tpot| tpot <= slo.tpot_ms))
        .count();
    let block_bytes = server.cache().bytes_per_block();
    let token_bytes = block_bytes / server.options().block_tokens as u64;
    let kv_reserved = stats.kv_peak.held_blocks as u64 * block_bytes;
    let kv_used = stats.kv_peak.used_tokens as u64 * token_bytes;
    Side {
        layout: format!("{:?}", spec.layout),
        execution: format!("{:?}", spec.execution),
        pipelined: spec.pipelined,
        fed_rows: stats.fed_rows,
        generated_tokens: stats.generated_tokens,
        wall_s: served.wall_s,
        span_unix_s: served.span_unix_s,
        generated_tokens_per_s: stats.generated_tokens as f64 / served.wall_s,
        ttft_ms_p50: percentile(&ttft, 50.0).unwrap_or(0.0),
        ttft_ms_p99: percentile(&ttft, 99.0).unwrap_or(0.0),
        tpot_ms_p50: percentile(&tpot, 50.0).unwrap_or(0.0),
        tpot_ms_p99: percentile(&tpot, 99.0).unwrap_or(0.0),
        requests_per_s: served.done.len() as f64 / served.wall_s,
        slo_met,
        goodput_rps: slo_met as f64 / served.wall_s,
        decode_step_ms_mean: stats.decode_step_seconds * 1e3 / stats.decode_steps.max(1) as f64,
        decode_steps: stats.decode_steps,
        steps: stats.steps,
        plan_steps: server
            .plan_stats()
            .map(|(rows, decode, plan)| {
                let kind = if decode { "decode" } else { "any" };
                (format!("{rows} {kind}"), plan.steps)
            })
            .collect(),
        kv_blocks: server.cache().num_blocks(),
        kv_cache_bytes: server.cache().bytes(),
        kv_reserved_bytes_peak: kv_reserved,
        kv_used_bytes_peak: kv_used,
        kv_waste: if kv_reserved == 0 {
            0.0
        } else {
            1.0 - kv_used as f64 / kv_reserved as f64
        },
        capacity_at_max_length: server.capacity_for(n_ctx),
        weights_bytes,
        activation_bytes: server.activation_bytes(),
        peak_reserved_bytes: pool_stats.reserved_bytes.peak,
        peak_requested_bytes: pool_stats.requested_bytes.peak,
        in_flight_mean: stats.in_flight_sum as f64 / stats.steps.max(1) as f64,
        in_flight_max: stats.in_flight_max,
        waits: stats.waits,
        preemptions: stats.preemptions,
        recomputed_tokens: stats.recomputed_tokens,
        cached_tokens: stats.cached_tokens,
        oom_errors: served.ooms,
        segments_created: served.segments,
        device_reported_bytes: served.device_reported,
        accounted_bytes: served.accounted,
        build_s,
        profile,
        requests: served
            .done
            .into_iter()
            .map(|c| RequestTokens {
                prompt: c.prompt,
                output: c.output,
            })
            .collect(),
    }
}

fn print_side(name: &str, side: &Side) {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!(
        "{name:>12}: {:8.1} tokens/s  ttft p50 {:7.1} ms p99 {:7.1}  tpot p50 {:6.2} ms p99 {:6.2}  \
         goodput {:6.2} req/s ({}/{} within SLO)  decode step {:6.2} ms  in flight {:5.2} (max {:2})  waits {:3}  preempted {:3}  cached {:6} tokens  KV reserved {:7.1} MiB used {:7.1} (waste {:4.1}%)  \
         peak reserved {:7.1} MiB  OOM {}",
        side.generated_tokens_per_s,
        side.ttft_ms_p50,
        side.ttft_ms_p99,
        side.tpot_ms_p50,
        side.tpot_ms_p99,
        side.goodput_rps,
        side.slo_met,
        side.requests.len(),
        side.decode_step_ms_mean,
        side.in_flight_mean,
        side.in_flight_max,
        side.waits,
        side.preemptions,
        side.cached_tokens,
        mib(side.kv_reserved_bytes_peak),
        mib(side.kv_used_bytes_peak),
        side.kv_waste * 100.0,
        mib(side.peak_reserved_bytes),
        side.oom_errors
    );
}

/// Seconds since the Unix epoch (0 on a clock before it).
fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
