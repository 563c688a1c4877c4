//! Host time of one dispatch of a kernel of the user's against one `add`, in a stream.
//!
//! Both record `y = a + b` over `--len` f32 elements into a new output, `--ops` times in one batch
//! (fewer than `max_ops_per_batch`, so that nothing is submitted while the clock runs), dropping
//! the previous output (so that the next one can take its range); a sync ends each round, off the
//! clock. The figure is the host time of recording divided by the dispatches: what a crate author
//! pays per dispatch on the CPU, the submission aside (it is the same for both).
//!
//! ```text
//! cargo run --release --example dispatch_cost [-- --ops N] [--len N] [--rounds N]
//! ```
//!
//! Prints one JSON object: nanoseconds per dispatch (median of the rounds) for `add` and for the
//! user's kernel, their ratio, and the context's statistics after the user's dispatches.

use std::time::Instant;

use anyhow::Context as _;
use wgpu_pool::compute::{Context, ContextOptions, Launch, Tensor, UserKernel, UserKernelDesc};
use wgpu_pool::{request_gpu, Gpu, LimitsChoice, Pool, PoolOptions};

/// The user's kernel: `y = a + b` (tensors at bindings 1, 2 and 3 of group 0, the convention of
/// the context's own kernels; the parameters' uniform at binding 0).
const USER_ADD: &str = "
struct Params { len: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if id.x < params.len { y[id.x] = a[id.x] + b[id.x]; }
}
";

/// The kernel's parameters.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    len: u32,
    pad: [u32; 3],
}

struct Args {
    ops: usize,
    len: usize,
    rounds: usize,
}

fn parse_args(list: &[String]) -> anyhow::Result<Args> {
    let mut args = Args {
        ops: 1000,
        len: 1024,
        rounds: 21,
    };
    let mut iter = list.iter();
    while let Some(arg) = iter.next() {
        let mut value =
            || -> anyhow::Result<usize> { Ok(iter.next().context("a number")?.parse()?) };
        match arg.as_str() {
            "--ops" => args.ops = value()?,
            "--len" => args.len = value()?,
            "--rounds" => args.rounds = value()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

/// Nanoseconds per op of `ops` calls of `op` (each making a new output, the last dropped), after
/// a warm-up, with a sync at the end of each round: the median of `rounds`.
fn time_stream(
    context: &Context,
    args: &Args,
    mut op: impl FnMut() -> anyhow::Result<Tensor>,
) -> anyhow::Result<f64> {
    for _ in 0..64 {
        drop(op()?);
    }
    context.sync()?;
    let mut rounds = Vec::with_capacity(args.rounds);
    for _ in 0..args.rounds {
        let started = Instant::now();
        let mut last = None;
        for _ in 0..args.ops {
            last = Some(op()?);
        }
        drop(last);
        let elapsed = started.elapsed();
        context.sync()?;
        rounds.push(elapsed.as_nanos() as f64 / args.ops as f64);
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[rounds.len() / 2])
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let report = run(&request_gpu(LimitsChoice::Adapter)?, &args)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// The measurement on `gpu` with these command-line arguments (without the program's name): the
/// JSON object `main` prints.
pub fn run(gpu: &Gpu, list: &[String]) -> anyhow::Result<serde_json::Value> {
    let args = parse_args(list)?;
    anyhow::ensure!(
        args.ops > 0 && args.len > 0 && args.rounds > 0,
        "--ops, --len and --rounds must be at least 1"
    );
    let pool = Pool::new(gpu, PoolOptions::default())?;
    let context = Context::new(&pool, ContextOptions::default())?;
    anyhow::ensure!(
        args.ops < context.options().max_ops_per_batch as usize,
        "--ops must stay below max_ops_per_batch ({})",
        context.options().max_ops_per_batch
    );
    let data: Vec<f32> = (0..args.len).map(|i| i as f32).collect();
    let a = context.tensor(&data, &[args.len])?;
    let b = context.tensor(&data, &[args.len])?;
    let add_ns = time_stream(&context, &args, || Ok(context.add(&a, &b)?))?;

    let kernel = user_kernel(&context)?;
    let params = Params {
        len: u32::try_from(args.len)?,
        pad: [0; 3],
    };
    let workgroups = [u32::try_from(args.len.div_ceil(256))?, 1, 1];
    let before = context.stats();
    let user_ns = time_stream(&context, &args, || {
        user_dispatch(&context, &kernel, &params, &a, &b, workgroups)
    })?;
    let after = context.stats();
    let check = user_dispatch(&context, &kernel, &params, &a, &b, workgroups)?;
    let doubled: Vec<f32> = data.iter().map(|v| 2.0 * v).collect();
    anyhow::ensure!(
        check.to_vec()? == doubled,
        "the user's kernel computed a wrong sum"
    );
    let report = serde_json::json!({
        "adapter": gpu.adapter.as_ref().map(|adapter| adapter.get_info().name),
        "ops": args.ops,
        "len": args.len,
        "rounds": args.rounds,
        "add_ns_per_dispatch": add_ns,
        "user_ns_per_dispatch": user_ns,
        "user_over_add": user_ns / add_ns,
        "user_dispatches": after.dispatches - before.dispatches,
        "user_bind_groups_created": after.bind_groups_created - before.bind_groups_created,
        "user_bind_group_cache_hits": after.bind_group_cache_hits - before.bind_group_cache_hits,
    });
    Ok(report)
}

/// The user's kernel, made by the context.
fn user_kernel(context: &Context) -> anyhow::Result<UserKernel> {
    Ok(context.user_kernel(&UserKernelDesc {
        label: "user add",
        wgsl: USER_ADD,
        entry_point: "main",
        tensors: 3,
        params_bytes: std::mem::size_of::<Params>() as u64,
        groups: &[],
    })?)
}

/// One dispatch of the user's kernel over `a` and `b` into a new output.
fn user_dispatch(
    context: &Context,
    kernel: &UserKernel,
    params: &Params,
    a: &Tensor,
    b: &Tensor,
    workgroups: [u32; 3],
) -> anyhow::Result<Tensor> {
    let launch = Launch::new(workgroups)
        .params(params)
        .tensors(&[a, b])
        .output(a.shape());
    Ok(context.dispatch_with(kernel, &launch)?.remove(0))
}
