//! Planned execution: capture a forward pass once, plan its memory by liveness, replay it with
//! no allocation.
//!
//! A model served many times runs the same ops on the same shapes for every request. Eagerly,
//! each request allocates every intermediate, looks up bind groups and uploads parameters. A
//! [`Capture`] records the ops of one forward instead, on *symbolic* tensors (a shape, no
//! memory): [`Context::capture`](crate::compute::Context::capture) opens it, [`Capture::input`] makes the inputs, the context's
//! ordinary ops (the same code that runs eagerly) record into it, and [`Capture::finish`] turns
//! the recording into a [`Plan`]:
//!
//! 1. **Fusion.** A matmul whose result only a bias add reads, and a bias add or matmul whose
//!    result only an activation (`relu`, `gelu`) reads, become one matmul with the fused
//!    epilogue the kernels already have (with split-K, the reduction runs it).
//! 2. **Liveness.** Every symbolic tensor lives from the first step that uses it to the last
//!    (inputs from the start, outputs to the end): a [`crate::plan::Buffer`].
//! 3. **Memory plan.** [`crate::plan::plan`] gives each an offset in one arena (or a few, each
//!    at most the device's `max_buffer_size`), aligned to the device's storage offset alignment;
//!    the arena is one pool allocation ([`PlanArena`]; plans may share one).
//! 4. **Prebuilt dispatches.** Every step's pipeline, bind group (over the arena's ranges and
//!    the tensors the forward bound, e.g. weights) and parameters (one uniform buffer written
//!    once) are made here.
//!
//! [`Plan::run`] then writes the inputs, records one compute pass of prebuilt dispatches, copies
//! the outputs to a staging buffer, submits once and reads back: no allocation, no bind group,
//! no parameter upload. [`Plan::run_into`] takes inputs from tensors and leaves the outputs in
//! tensors of the caller's, without waiting. Replays go through the context: each is ordered
//! after the work recorded before it (its open batch is submitted first) and before the work
//! recorded after; replays of one plan (and of plans sharing an arena, all of one context: an
//! arena of another context is refused) run one after another in queue order, and a replay in
//! flight keeps its arena (a replaced arena's range returns to the pool only after the
//! submissions that use it).
//!
//! Tensors the forward binds that existed before the capture (weights, constants made during it
//! with [`Context::tensor`](crate::compute::Context::tensor)) are bound as they are, and the plan keeps them alive: write new
//! weights with [`Context::write`](crate::compute::Context::write) and the next replay reads them.
//!
//! Batches of varying size: capture one plan per size, all in one [`PlanArena`]
//! ([`CaptureOptions::arena`]). Each size keeps the matmul plan chosen for its shape (the narrow
//! kernel for a few rows, tiles and split-K for more), and the arena is as large as the largest
//! plan, not their sum.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use wgpu_pool::compute::{Context, ContextOptions, Feed};
//! use wgpu_pool::{request_gpu, LimitsChoice, Pool, PoolOptions};
//!
//! let gpu = request_gpu(LimitsChoice::Adapter)?;
//! let pool = Pool::new(&gpu, PoolOptions::default())?;
//! let ctx = Context::new(&pool, ContextOptions::default())?;
//! let w = ctx.tensor(&vec![0.01; 64 * 32], &[64, 32])?;
//! let b = ctx.tensor(&vec![0.1; 32], &[32])?;
//!
//! let mut capture = ctx.capture()?;
//! let x = capture.input(&[8, 64])?;
//! let y = ctx.softmax(&ctx.gelu(&ctx.add_bias(&ctx.matmul(&x, &w)?, &b)?)?)?;
//! let mut plan = capture.finish(&[&y])?;
//!
//! let answer = plan.run(&[Feed::Data(&vec![1.0; 8 * 64])])?;
//! assert_eq!(answer[0].len(), 8 * 32);
//! # Ok(())
//! # }
//! ```
//!
//! # Files
//!
//! Bottom up, each using only those before it: `arena` ([`PlanArena`]: the pool allocations plans
//! place their tensors in), `ir` (what a plan is made of: [`CaptureOptions`], [`PlanStats`], its
//! prebuilt steps and slots), `fusion` (folding bias adds and activations into the matmuls that
//! feed them), `replay` ([`Plan`]: binding its arena and recording a replay through the context's
//! one recording path), `build` (liveness, the memory plan and the prebuilt steps of a plan) and
//! `capture` ([`Capture`]: recording ops into a tape and finishing it into a plan).

mod arena;
mod build;
mod capture;
mod fusion;
mod ir;
mod replay;

pub use arena::PlanArena;
pub use capture::Capture;
pub use ir::{CaptureOptions, PlanStats};
pub use replay::{Feed, Plan, PlanRun};
