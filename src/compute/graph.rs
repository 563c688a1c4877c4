//! Planned execution: capture a forward pass once, plan its memory by liveness, replay it with
//! no allocation.
//!
//! A model served many times runs the same ops on the same shapes for every request. Eagerly,
//! each request allocates every intermediate, looks up bind groups and uploads parameters. A
//! [`Capture`] records the ops of one forward instead, on *symbolic* tensors (a shape, no
//! memory): [`Context::capture`] opens it, [`Capture::input`] makes the inputs, the context's
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
//! with [`Context::tensor`]) are bound as they are, and the plan keeps them alive: write new
//! weights with [`Context::write`] and the next replay reads them.
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

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use super::context::{
    check_custom_dispatch, custom_group, Context, ParamsRing, Shared, Step, Storage,
};
use super::ops::grid_1d;
use super::tensor::Tensor;
use super::vocab::{
    decode_elements, element_count, encode_elements, kernel_u32, Activation, ComputeError, DType,
    ElementwiseParams, KernelKey, MatmulParams, NarrowParams, ParamsBlock, ReduceParams, Source,
    Variant, PARAMS_BYTES,
};
use crate::device::AccountedBuffer;
use crate::plan::{greedy_by_size, plan, Buffer, PlanOptions};
use crate::pool::{AllocOptions, Allocation, Pool};

/// How [`Capture::finish_with`] builds a plan.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Fuse bias adds and activations into the matmuls that feed them (default on).
    pub fuse: bool,
    /// The arena to place the plan in, shared with other plans of the context (see
    /// [`PlanArena`]); `None`: an arena of the plan's own. An arena made by another context is
    /// refused ([`ComputeError::ForeignArena`]).
    pub arena: Option<PlanArena>,
    /// The planner's search budget ([`PlanOptions::search_steps`]). Captured graphs are small:
    /// the default, 4,000,000, takes a few milliseconds.
    pub search_steps: u64,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        Self {
            fuse: true,
            arena: None,
            search_steps: 4_000_000,
        }
    }
}

/// An open capture: the context's ops record into it until [`Capture::finish`]; dropped
/// unfinished, it records nothing and the context runs ops again.
///
/// While it is open, every op on the context (from any thread) is recorded, not run: ops make
/// symbolic tensors (no memory), and reading or writing them is [`ComputeError::Symbolic`].
/// Tensors with memory (weights) may be read and written as usual; [`Context::tensor`] makes a
/// constant with memory, which the plan keeps.
#[derive(Debug)]
pub struct Capture {
    context: Context,
    id: u64,
    inputs: Vec<Tensor>,
    open: bool,
}

impl Context {
    /// Opens a capture (see [`super::graph`]): submits the open batch, then records ops until
    /// the capture is finished or dropped. [`ComputeError::Capture`] if one is already open.
    pub fn capture(&self) -> Result<Capture, ComputeError> {
        let id = self.begin_tape()?;
        Ok(Capture {
            context: self.clone(),
            id,
            inputs: Vec::new(),
            open: true,
        })
    }

    /// An empty arena for plans of this context to share (see [`PlanArena`]); captures of
    /// another context refuse it.
    pub fn plan_arena(&self) -> PlanArena {
        PlanArena {
            context: Arc::downgrade(&self.shared),
            inner: Arc::new(Mutex::new(ArenaState {
                pool: self.pool().clone(),
                allocations: Vec::new(),
                generation: 0,
                labelled_heap: 0,
            })),
        }
    }
}

impl Capture {
    /// A symbolic f32 input of `shape`: the plan's input number `self.inputs().len()`, written
    /// by each replay.
    pub fn input(&mut self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        self.input_with(shape, DType::F32)
    }

    /// [`Capture::input`] with elements stored as `dtype`: a replay rounds the values of a
    /// [`Feed::Data`] to it, and takes a [`Feed::Tensor`] of that type only.
    /// [`ComputeError::ShaderF16Unavailable`] for f16 on a device without
    /// [`wgpu::Features::SHADER_F16`].
    pub fn input_with(&mut self, shape: &[usize], dtype: DType) -> Result<Tensor, ComputeError> {
        let len = element_count("input", shape)?;
        self.context.check_dtype("input", dtype)?;
        let tensor = self
            .context
            .allocate("plan input", shape.to_vec(), len, dtype)?;
        self.inputs.push(tensor.clone());
        Ok(tensor)
    }

    /// The inputs made so far, in order.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// Ends the capture and plans it with the default [`CaptureOptions`].
    pub fn finish(self, outputs: &[&Tensor]) -> Result<Plan, ComputeError> {
        self.finish_with(outputs, CaptureOptions::default())
    }

    /// Ends the capture and builds its plan: `outputs` (symbolic tensors of this capture) are
    /// what a replay gives back. Errors: [`ComputeError::Capture`] for an output that is not a
    /// symbolic tensor of this capture; [`ComputeError::ForeignArena`] for an arena another
    /// context made (the capture ends, nothing is allocated and the arena is untouched);
    /// [`ComputeError::Plan`] and [`ComputeError::ExceedsLimit`] when the tensors do not fit the
    /// device's limits; [`ComputeError::Pool`] when the arena cannot be allocated;
    /// [`ComputeError::Config`] when a pipeline of the user's does not take its tensors.
    pub fn finish_with(
        mut self,
        outputs: &[&Tensor],
        options: CaptureOptions,
    ) -> Result<Plan, ComputeError> {
        self.open = false;
        let tape = self
            .context
            .end_tape(self.id)
            .ok_or_else(|| ComputeError::Capture("the capture was closed already".into()))?;
        let started = Instant::now();
        for (index, output) in outputs.iter().enumerate() {
            self.context.check_owner("capture output", output)?;
            if output.storage.capture != Some(self.id) {
                return Err(ComputeError::Capture(format!(
                    "output {index} is not a tensor computed by this capture's ops"
                )));
            }
        }
        if let Some(arena) = &options.arena {
            // The context's lock orders its replays; another context's replays could write the
            // arena's ranges while one of this context's reads them.
            if !arena.is_of(&self.context) {
                return Err(ComputeError::ForeignArena);
            }
            debug_assert!(arena.lock().pool.same_pool(self.context.pool()));
        }
        let mut steps: Vec<Step> = tape.steps;
        let recorded = steps.len();
        let keep: Vec<*const Storage> = self
            .inputs
            .iter()
            .chain(outputs.iter().copied())
            .map(|t| Arc::as_ptr(&t.storage))
            .collect();
        if options.fuse {
            steps = fuse(steps, &keep, self.id);
        }
        let fused = recorded - steps.len();
        Planner::new(&self.context, self.id, &options)?.build(
            steps,
            &self.inputs,
            outputs,
            fused,
            started,
            options,
        )
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.open {
            self.context.end_tape(self.id);
        }
    }
}

/// Where a kernel step writes its result and reads its bias: `(output, bias)` binding indices,
/// for the matmul kernels whose epilogue can take a bias and an activation.
fn epilogue_slots(kernel: &KernelKey) -> Option<(usize, usize, bool, Activation)> {
    match kernel.variant {
        Variant::Matmul {
            bias, activation, ..
        }
        | Variant::Narrow {
            bias, activation, ..
        } => Some((2, 3, bias, activation)),
        Variant::Reduce { bias, activation } => Some((2, 1, bias, activation)),
        Variant::Plain => None,
    }
}

/// The epilogue of `kernel` set to `bias` and `activation`.
fn with_epilogue(mut kernel: KernelKey, with_bias: bool, with: Activation) -> KernelKey {
    match &mut kernel.variant {
        Variant::Matmul {
            bias, activation, ..
        }
        | Variant::Narrow {
            bias, activation, ..
        }
        | Variant::Reduce { bias, activation } => {
            *bias = with_bias;
            *activation = with;
        }
        Variant::Plain => {}
    }
    kernel
}

/// The activation a unary kernel computes, if the matmul epilogue has it.
fn activation_of(kernel: &KernelKey) -> Option<Activation> {
    match (kernel.source, kernel.entry) {
        (Source::Unary, "relu") => Some(Activation::Relu),
        (Source::Unary, "gelu") => Some(Activation::Gelu),
        _ => None,
    }
}

/// Folds bias adds and activations into the matmul (or split-K reduction) that produces their
/// operand, when nothing else uses the intermediate (`keep`: inputs and outputs) — the same
/// kernels the eager `matmul_with` runs with an epilogue.
fn fuse(steps: Vec<Step>, keep: &[*const Storage], capture: u64) -> Vec<Step> {
    let mut uses: HashMap<*const Storage, usize> = HashMap::new();
    for step in &steps {
        for storage in step_storages(step) {
            *uses.entry(Arc::as_ptr(storage)).or_default() += 1;
        }
    }
    let mut steps: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    // The step that wrote each storage through a fusable epilogue, by pointer.
    let mut producer: HashMap<*const Storage, usize> = HashMap::new();
    for index in 0..steps.len() {
        let (operand, extra, activation) = match &steps[index] {
            Some(Step::Kernel {
                kernel, bindings, ..
            }) => {
                if let Some((out, _, _, _)) = epilogue_slots(kernel) {
                    producer.insert(Arc::as_ptr(&bindings[out]), index);
                    continue;
                }
                match (kernel.source, kernel.entry, activation_of(kernel)) {
                    (Source::Binary, "add_bias", _) => (
                        bindings[0].clone(),
                        Some((bindings[1].clone(), bindings[2].clone())),
                        None,
                    ),
                    (_, _, Some(activation)) => (
                        bindings[0].clone(),
                        None,
                        Some((activation, bindings[1].clone())),
                    ),
                    _ => continue,
                }
            }
            _ => continue,
        };
        let operand_ptr = Arc::as_ptr(&operand);
        let private = operand.capture == Some(capture)
            && uses.get(&operand_ptr) == Some(&2)
            && !keep.contains(&operand_ptr);
        let Some(&at) = producer.get(&operand_ptr).filter(|_| private) else {
            continue;
        };
        let Some(Step::Kernel { kernel, .. }) = &steps[at] else {
            continue;
        };
        let Some((out, bias_slot, has_bias, has_activation)) = epilogue_slots(kernel) else {
            continue;
        };
        if has_activation != Activation::None {
            continue;
        }
        // The fused step writes the result where the producer ran, earlier than the op did:
        // nothing between may bind the result or (for a bias) write the bias, and a bias add
        // must add along the product's own columns (not a reshape of them).
        let bound_between = |storage: &Arc<Storage>| {
            let ptr = Arc::as_ptr(storage);
            steps[at + 1..index]
                .iter()
                .flatten()
                .any(|step| step_storages(step).iter().any(|s| Arc::as_ptr(s) == ptr))
        };
        let movable = match (&extra, &activation) {
            (Some((bias, result)), None) => {
                !bound_between(bias)
                    && !bound_between(result)
                    && steps[index].as_ref().and_then(bias_columns)
                        == steps[at].as_ref().and_then(product_columns)
            }
            (None, Some((_, result))) => !bound_between(result),
            _ => false,
        };
        if !movable {
            continue;
        }
        let Some(Step::Kernel {
            kernel, bindings, ..
        }) = &mut steps[at]
        else {
            continue;
        };
        let result = match (extra, activation) {
            (Some((bias, result)), None) if !has_bias => {
                *kernel = with_epilogue(*kernel, true, Activation::None);
                bindings[bias_slot] = bias;
                result
            }
            (None, Some((activation, result))) => {
                *kernel = with_epilogue(*kernel, has_bias, activation);
                result
            }
            _ => continue,
        };
        producer.remove(&operand_ptr);
        uses.remove(&operand_ptr);
        producer.insert(Arc::as_ptr(&result), at);
        bindings[out] = result;
        steps[index] = None;
    }
    steps.into_iter().flatten().collect()
}

/// The columns of the product a matmul, narrow or reduction step writes (its N).
fn product_columns(step: &Step) -> Option<u32> {
    let Step::Kernel { kernel, params, .. } = step else {
        return None;
    };
    match kernel.variant {
        Variant::Matmul { .. } => Some(params.read::<MatmulParams>().n),
        Variant::Narrow { .. } => Some(params.read::<NarrowParams>().n4.saturating_mul(4)),
        Variant::Reduce { .. } => Some(params.read::<ReduceParams>().n),
        Variant::Plain => None,
    }
}

/// The columns (bias length) an `add_bias` step adds along.
fn bias_columns(step: &Step) -> Option<u32> {
    let Step::Kernel { params, .. } = step else {
        return None;
    };
    Some(params.read::<ElementwiseParams>().cols)
}

/// The storages a step binds.
fn step_storages(step: &Step) -> Vec<&Arc<Storage>> {
    match step {
        Step::Kernel { bindings, .. } => bindings.iter().collect(),
        Step::Clear(storage) => vec![storage],
        Step::Custom { storage, .. } => storage.iter().collect(),
    }
}

/// Where a plan's step finds one of its tensors.
#[derive(Clone)]
enum Binding {
    /// A range of arena `arena` at `offset` (from the arena's start), `size` bytes.
    Arena {
        arena: usize,
        offset: u64,
        size: u64,
    },
    /// A tensor with memory (weights, constants), kept alive by the plan.
    Tensor(Arc<Storage>),
}

/// One prebuilt step.
enum PlanStep {
    Kernel {
        pipeline: wgpu::ComputePipeline,
        /// The entry point, to set a pipeline only when it changes.
        key: KernelKey,
        /// The dynamic offset of the step's parameters in the plan's uniform buffer.
        params_offset: u32,
        storage: usize,
        bindings: Vec<Binding>,
        workgroups: [u32; 3],
    },
    Clear(Binding),
    Custom {
        pipeline: wgpu::ComputePipeline,
        bindings: Vec<Binding>,
        groups: Vec<wgpu::BindGroup>,
        workgroups: [u32; 3],
    },
}

/// A plan's input or output: its range in the arena and its shape.
#[derive(Clone)]
struct Slot {
    arena: usize,
    offset: u64,
    bytes: u64,
    shape: Vec<usize>,
    len: usize,
    dtype: DType,
    /// The copy kernel's parameters (offset in the plan's uniform buffer) and grid, for a
    /// tensor fed in or taken out that lies in the arena's own buffer (a buffer cannot be
    /// copied into itself).
    copy: (u32, [u32; 3]),
}

/// The copy kernel: `y = x` over vec4s.
const COPY: KernelKey = KernelKey::plain(Source::Unary, "copy");

/// What building a plan found and cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanStats {
    /// Steps recorded by the capture.
    pub recorded_steps: usize,
    /// Steps removed by fusion.
    pub fused_steps: usize,
    /// Steps a replay runs (dispatches and clears).
    pub steps: usize,
    /// Symbolic tensors placed in the arena.
    pub buffers: usize,
    /// Bytes the plan's arenas need: the sum of their sizes.
    pub heap_bytes: u64,
    /// The most bytes of tensors alive at one step: no plan needs less.
    pub max_live_bytes: u64,
    /// What TFLite's greedy-by-size planner needs for the same tensors, for comparison.
    pub greedy_by_size_heap_bytes: u64,
    /// Arenas (more than one only beyond the device's `max_buffer_size`).
    pub arenas: usize,
    /// Seconds spent building the plan (fusion, planning, pipelines, bind groups).
    pub build_seconds: f64,
}

/// An arena for plans: pool allocations (one per arena index) that plans place their tensors
/// in. Plans that share one arena are never replayed at the same time: they are all of the
/// context that made it ([`Context::plan_arena`]; a capture of another context refuses it with
/// [`ComputeError::ForeignArena`]), whose replays are ordered, one after another. So it holds as
/// much as its largest plan needs; building a larger plan replaces an allocation (the old range
/// is given back after the submissions that use it) and the plans bound to it make their bind
/// groups again at their next replay.
#[derive(Clone)]
pub struct PlanArena {
    /// The context that made it: the only one whose plans may use it.
    context: Weak<Shared>,
    inner: Arc<Mutex<ArenaState>>,
}

impl std::fmt::Debug for PlanArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanArena")
            .field("bytes", &self.bytes())
            .finish()
    }
}

struct ArenaState {
    pool: Pool,
    allocations: Vec<Allocation>,
    /// Bumped whenever an allocation is replaced.
    generation: u64,
    /// The heap of the plan whose tensors label the arena's ranges.
    labelled_heap: u64,
}

impl PlanArena {
    /// Whether `context` made this arena. (The weak reference keeps the context's allocation,
    /// so no later context can have its address.)
    fn is_of(&self, context: &Context) -> bool {
        std::ptr::eq(self.context.as_ptr(), Arc::as_ptr(&context.shared))
    }

    fn lock(&self) -> MutexGuard<'_, ArenaState> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes of the arena's allocations.
    pub fn bytes(&self) -> u64 {
        self.lock().allocations.iter().map(Allocation::size).sum()
    }

    /// Grows the arena to hold `sizes` (one per arena index).
    fn reserve(&self, sizes: &[u64], label: &str) -> Result<(), ComputeError> {
        let mut state = self.lock();
        for (index, &size) in sizes.iter().enumerate() {
            let have = state.allocations.get(index).map_or(0, Allocation::size);
            if have >= size {
                continue;
            }
            let allocation = state.pool.allocate_with(
                size,
                AllocOptions {
                    label,
                    bindable: false,
                    ..AllocOptions::default()
                },
            )?;
            if index < state.allocations.len() {
                state.allocations[index] = allocation;
            } else {
                state.allocations.push(allocation);
            }
            state.generation += 1;
        }
        Ok(())
    }
}

impl PlanArena {
    /// Labels the arena's ranges with the tensors of `planned` that use them, if it is the
    /// largest plan placed in the arena so far (the one that sized it).
    fn label(
        &self,
        planned: &crate::plan::Plan,
        buffers: &[Buffer],
        names: &[String],
    ) -> Result<(), ComputeError> {
        let mut state = self.lock();
        if planned.heap_bytes < state.labelled_heap {
            return Ok(());
        }
        state.labelled_heap = planned.heap_bytes;
        for (arena, allocation) in state.allocations.iter().enumerate() {
            // Elementary ranges between the ends of the tensors placed in this arena.
            let placed: Vec<(u64, u64, usize)> = planned
                .placements
                .iter()
                .zip(buffers)
                .enumerate()
                .filter(|(_, (placement, buffer))| placement.arena == arena && buffer.size > 0)
                .map(|(id, (placement, buffer))| {
                    (placement.offset, placement.offset + buffer.size, id)
                })
                .collect();
            let mut bounds: Vec<u64> = placed.iter().flat_map(|&(a, b, _)| [a, b]).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let mut parts: Vec<(u64, u64, String)> = Vec::new();
            for pair in bounds.windows(2) {
                let (start, end) = (pair[0], pair[1]);
                let users: Vec<&str> = placed
                    .iter()
                    .filter(|&&(a, b, _)| a <= start && end <= b)
                    .map(|&(_, _, id)| names[id].as_str())
                    .collect();
                if users.is_empty() {
                    continue;
                }
                let label = match users.len() {
                    1..=4 => users.join(", "),
                    n => format!("{}, +{} more", users[..3].join(", "), n - 3),
                };
                match parts.last_mut() {
                    Some(last) if last.0 + last.1 == start && last.2 == label => {
                        last.1 += end - start
                    }
                    _ => parts.push((start, end - start, label)),
                }
            }
            state.pool.label_parts(allocation, &parts)?;
        }
        Ok(())
    }
}

/// Builds plans for one context.
struct Planner<'a> {
    context: &'a Context,
    capture: u64,
    alignment: u64,
    arena: PlanArena,
}

impl<'a> Planner<'a> {
    fn new(
        context: &'a Context,
        capture: u64,
        options: &CaptureOptions,
    ) -> Result<Self, ComputeError> {
        let limits = context.limits();
        let alignment = u64::from(limits.min_storage_buffer_offset_alignment).max(16);
        Ok(Self {
            context,
            capture,
            alignment,
            arena: options
                .arena
                .clone()
                .unwrap_or_else(|| context.plan_arena()),
        })
    }

    fn build(
        self,
        steps: Vec<Step>,
        inputs: &[Tensor],
        outputs: &[&Tensor],
        fused: usize,
        started: Instant,
        options: CaptureOptions,
    ) -> Result<Plan, ComputeError> {
        let limits = self.context.limits().clone();
        // 1. Lifetimes: the symbolic tensors, numbered in order of first use.
        let mut ids: HashMap<*const Storage, usize> = HashMap::new();
        let mut lives: Vec<(u64, u64, u64)> = Vec::new(); // (first, last + 1, bytes)
        let end = steps.len() as u64 + 1;
        let mut touch = |storage: &Arc<Storage>, lower: u64, upper: u64| {
            if storage.capture != Some(self.capture) {
                return;
            }
            let id = *ids.entry(Arc::as_ptr(storage)).or_insert_with(|| {
                lives.push((lower, upper, storage.bytes));
                lives.len() - 1
            });
            let life = &mut lives[id];
            life.0 = life.0.min(lower);
            life.1 = life.1.max(upper);
        };
        for input in inputs {
            touch(&input.storage, 0, 1);
        }
        for (index, step) in steps.iter().enumerate() {
            let index = index as u64 + 1;
            for storage in step_storages(step) {
                touch(storage, index, index + 1);
            }
        }
        for output in outputs {
            touch(&output.storage, end, end + 1);
        }
        let max_binding = limits.max_storage_buffer_binding_size;
        if let Some(&(_, _, bytes)) = lives.iter().find(|life| life.2 > max_binding) {
            return Err(ComputeError::ExceedsLimit {
                op: "capture",
                what: "bytes of a captured tensor",
                value: bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit: max_binding,
            });
        }
        let buffers: Vec<Buffer> = lives
            .iter()
            .enumerate()
            .map(|(id, &(lower, upper, bytes))| Buffer::new(id as u64, lower, upper, bytes))
            .collect();

        // 2. Offsets.
        let max_arena = (limits.max_buffer_size / self.alignment) * self.alignment;
        let plan_options = PlanOptions {
            alignment: self.alignment,
            max_arena_bytes: Some(max_arena),
            search_steps: options.search_steps,
            ..PlanOptions::default()
        };
        let planned = plan(&buffers, &plan_options)?;
        let greedy = greedy_by_size(&buffers, &plan_options)?;
        let place = |storage: &Arc<Storage>| -> Option<(usize, u64, u64)> {
            let &id = ids.get(&Arc::as_ptr(storage))?;
            let placement = planned.placements[id];
            Some((placement.arena, placement.offset, storage.bytes))
        };
        let binding = |storage: &Arc<Storage>| match place(storage) {
            Some((arena, offset, size)) => Binding::Arena {
                arena,
                offset,
                size,
            },
            None => Binding::Tensor(storage.clone()),
        };
        let slot = |tensor: &Tensor| -> Slot {
            let (arena, offset, bytes) =
                place(&tensor.storage).expect("inputs and outputs have lifetimes");
            Slot {
                arena,
                offset,
                bytes,
                shape: tensor.shape().to_vec(),
                len: tensor.len(),
                dtype: tensor.dtype(),
                copy: (0, [0; 3]),
            }
        };
        let label = format!(
            "plan arena ({} tensors, max-live {} B)",
            buffers.len(),
            planned.max_live_bytes
        );
        self.arena.reserve(&planned.arena_bytes, &label)?;
        // What each range of the arena holds, by tensor: the name of a tensor is its number and
        // the op that first writes it.
        let names: Vec<String> = {
            let mut names = vec![String::new(); buffers.len()];
            for input in inputs {
                if let Some(&id) = ids.get(&Arc::as_ptr(&input.storage)) {
                    names[id] = format!("t{id} input");
                }
            }
            for step in &steps {
                let op = match step {
                    Step::Kernel { kernel, .. } => kernel.entry,
                    Step::Clear(_) => "zeros",
                    Step::Custom { .. } => "dispatch",
                };
                for storage in step_storages(step) {
                    if let Some(&id) = ids.get(&Arc::as_ptr(storage)) {
                        if names[id].is_empty() {
                            names[id] = format!("t{id} {op}");
                        }
                    }
                }
            }
            names
        };
        self.arena.label(&planned, &buffers, &names)?;

        // 3. Pipelines and parameters.
        // A slot per step and per input and output copy, identical parameters sharing one.
        let gpu = self.context.gpu();
        let slots = u32::try_from(steps.len() + inputs.len() + outputs.len())
            .ok()
            .filter(|&slots| slots <= ParamsRing::MAX_SLOTS)
            .ok_or_else(|| {
                ComputeError::Capture(format!(
                    "a plan takes at most {} steps, inputs and outputs",
                    ParamsRing::MAX_SLOTS
                ))
            })?;
        let mut params = ParamsRing::new(
            gpu,
            slots.max(1),
            limits.min_uniform_buffer_offset_alignment,
        );
        let mut built = Vec::with_capacity(steps.len());
        for step in &steps {
            built.push(match step {
                Step::Kernel {
                    kernel,
                    params: block,
                    bindings,
                    workgroups,
                } => {
                    let pipeline = self.context.pipeline(kernel)?;
                    let params_offset = params.push(block);
                    PlanStep::Kernel {
                        pipeline,
                        key: *kernel,
                        params_offset,
                        storage: kernel.source.storage_bindings(),
                        bindings: bindings.iter().map(binding).collect(),
                        workgroups: *workgroups,
                    }
                }
                Step::Clear(storage) => PlanStep::Clear(binding(storage)),
                Step::Custom {
                    pipeline,
                    storage,
                    groups,
                    workgroups,
                } => PlanStep::Custom {
                    pipeline: pipeline.clone(),
                    bindings: storage.iter().map(binding).collect(),
                    groups: groups.clone(),
                    workgroups: *workgroups,
                },
            });
        }
        let mut inputs: Vec<Slot> = inputs.iter().map(slot).collect();
        let mut outputs: Vec<Slot> = outputs.iter().map(|t| slot(t)).collect();
        let copy = self.context.pipeline(&COPY)?;
        for slot in inputs.iter_mut().chain(outputs.iter_mut()) {
            let len_vec4 = slot.bytes / 16;
            let (workgroups, grid_x) = grid_1d(self.context, "copy", len_vec4.div_ceil(256))?;
            let block = ParamsBlock::new(&ElementwiseParams {
                len_vec4: kernel_u32("copy", "vec4s", len_vec4 as usize)?,
                grid_x,
                cols: 0,
                scalar: 0.0,
            });
            slot.copy = (params.push(&block), workgroups);
        }
        // Written once: lands before the first replay.
        params.write(&gpu.queue);

        let output_bytes: u64 = outputs.iter().map(|slot| slot.bytes).sum();
        let mut plan = Plan {
            context: self.context.clone(),
            steps: built,
            inputs,
            outputs,
            arena: self.arena,
            bound: None,
            params: params.buffer,
            copy,
            output_bytes,
            stats: PlanStats {
                recorded_steps: steps.len() + fused,
                fused_steps: fused,
                steps: steps.len(),
                buffers: buffers.len(),
                heap_bytes: planned.heap_bytes,
                max_live_bytes: planned.max_live_bytes,
                greedy_by_size_heap_bytes: greedy.heap_bytes,
                arenas: planned.arena_bytes.len(),
                build_seconds: 0.0,
            },
            bind_groups_created: 0,
            lifetimes: buffers,
        };
        // The bind groups now, so that a pipeline of the user's that does not take its tensors
        // is an error of the build, not of the first replay.
        plan.bind()?;
        plan.stats.build_seconds = started.elapsed().as_secs_f64();
        Ok(plan)
    }
}

/// The bind groups of a plan over one generation of its arena.
struct Bound {
    generation: u64,
    /// The context's count of compactions that moved tensors, when the groups were made: the
    /// tensors the plan binds (weights) may have moved since.
    moved: u64,
    /// The arena's allocations: `(buffer, offset)` per arena index.
    arenas: Vec<(wgpu::Buffer, u64)>,
    /// One per step (`None` for clears).
    groups: Vec<Option<wgpu::BindGroup>>,
}

/// Where an input of a replay comes from.
#[derive(Debug, Clone, Copy)]
pub enum Feed<'a> {
    /// Values uploaded into the input's range (`queue.write_buffer`).
    Data(&'a [f32]),
    /// A tensor of the context, copied into the input's range on the GPU.
    Tensor(&'a Tensor),
}

/// Where a replay puts its outputs.
#[derive(Clone, Copy)]
enum Outputs<'a> {
    /// Copied into these tensors ([`Plan::run_into`]).
    Tensors(&'a [&'a Tensor]),
    /// Copied one after another into this buffer, to be read back ([`Plan::run`]).
    ReadBack(&'a wgpu::Buffer),
}

/// A captured forward, planned: see the [module documentation](self).
pub struct Plan {
    context: Context,
    steps: Vec<PlanStep>,
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
    arena: PlanArena,
    bound: Option<Bound>,
    params: AccountedBuffer,
    /// The copy kernel's pipeline.
    copy: wgpu::ComputePipeline,
    /// The outputs' bytes: what [`Plan::run`] reads back (through the context's read-back
    /// buffer, shared by its plans).
    output_bytes: u64,
    stats: PlanStats,
    bind_groups_created: u64,
    /// The tensors' lifetimes and sizes, as planned (ids in order of first use).
    lifetimes: Vec<Buffer>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("inputs", &self.input_shapes())
            .field("outputs", &self.output_shapes())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Plan {
    /// What building the plan found and cost.
    pub fn stats(&self) -> &PlanStats {
        &self.stats
    }

    /// The arena the plan's tensors live in.
    pub fn arena(&self) -> &PlanArena {
        &self.arena
    }

    /// The shapes of the inputs, in order.
    pub fn input_shapes(&self) -> Vec<&[usize]> {
        self.inputs
            .iter()
            .map(|slot| slot.shape.as_slice())
            .collect()
    }

    /// The shapes of the outputs, in order.
    pub fn output_shapes(&self) -> Vec<&[usize]> {
        self.outputs
            .iter()
            .map(|slot| slot.shape.as_slice())
            .collect()
    }

    /// The planned tensors: sizes in bytes and lifetimes `[lower, upper)` in steps (0: the inputs
    /// written; step `i` is the `i`-th dispatch or clear; the last: the outputs read), ids in order
    /// of first use.
    pub fn lifetimes(&self) -> &[Buffer] {
        &self.lifetimes
    }

    /// [`Plan::lifetimes`] as MiniMalloc's CSV (`id,lower,upper,size` and a line per tensor), the
    /// format `examples/plan.rs` reads.
    pub fn lifetimes_csv(&self) -> String {
        let mut csv = String::from("id,lower,upper,size\n");
        for buffer in &self.lifetimes {
            csv.push_str(&format!(
                "{},{},{},{}\n",
                buffer.id, buffer.lower, buffer.upper, buffer.size
            ));
        }
        csv
    }

    /// Bind groups made since the plan was built (at build, and again after its arena grew).
    pub fn bind_groups_created(&self) -> u64 {
        self.bind_groups_created
    }

    /// Replays the forward on `inputs` and reads the outputs back as f32 values (f16 outputs
    /// widened exactly): one submission (after the context's open batch), then waits for it. Errors: [`ComputeError::Capture`] when the
    /// inputs are not one per input, [`ComputeError::DataLength`] or
    /// [`ComputeError::ShapeMismatch`] for an input of the wrong size, [`ComputeError::Config`]
    /// when binding the arena finds a captured dispatch of the user's that wgpu refuses (see
    /// [`Context::dispatch_with`]), and the errors of a read. Nothing is submitted on a refused
    /// input.
    pub fn run(&mut self, inputs: &[Feed<'_>]) -> Result<Vec<Vec<f32>>, ComputeError> {
        // The context's read-back buffer, shared by its plans, held from the copies to the read.
        let context = self.context.clone();
        let read_back = context.plan_read_back(self.output_bytes);
        self.replay(inputs, Outputs::ReadBack(&read_back))?;
        let outputs = &self.outputs;
        // Straight from the mapped read-back buffer into the outputs' vectors.
        let read = crate::device::read_mapped_with(
            &self.context.gpu().device,
            &read_back,
            self.output_bytes,
            |bytes| {
                let mut start = 0usize;
                outputs
                    .iter()
                    .map(|slot| {
                        let values = decode_elements(&bytes[start..], slot.len, slot.dtype);
                        start += slot.bytes as usize;
                        values
                    })
                    .collect()
            },
        );
        if read.is_err() {
            read_back.discard();
        }
        read.map_err(ComputeError::Wait)
    }

    /// Replays the forward on `inputs` and copies the outputs into `outputs` (tensors of the
    /// context with the outputs' lengths and element types), without waiting: read them when
    /// needed. Errors as [`Plan::run`], [`ComputeError::ShapeMismatch`] for an output tensor of
    /// another length and [`ComputeError::DTypeMismatch`] for one of another element type.
    pub fn run_into(
        &mut self,
        inputs: &[Feed<'_>],
        outputs: &[&Tensor],
    ) -> Result<(), ComputeError> {
        if outputs.len() != self.outputs.len() {
            return Err(ComputeError::Capture(format!(
                "the plan has {} outputs, {} tensors given",
                self.outputs.len(),
                outputs.len()
            )));
        }
        for (tensor, slot) in outputs.iter().zip(&self.outputs) {
            self.check_tensor("plan output", tensor, slot)?;
        }
        self.replay(inputs, Outputs::Tensors(outputs))
    }

    /// Checks that `tensor` has memory, belongs to the plan's context and has `slot`'s length.
    fn check_tensor(
        &self,
        op: &'static str,
        tensor: &Tensor,
        slot: &Slot,
    ) -> Result<(), ComputeError> {
        self.context.check_owner(op, tensor)?;
        if tensor.is_symbolic() {
            return Err(ComputeError::Symbolic { op });
        }
        if tensor.len() != slot.len {
            return Err(ComputeError::ShapeMismatch {
                op,
                left: tensor.shape().to_vec(),
                right: slot.shape.clone(),
                expected: "as many elements as the plan's tensor",
            });
        }
        if tensor.dtype() != slot.dtype {
            return Err(ComputeError::DTypeMismatch {
                op,
                left: slot.dtype,
                right: tensor.dtype(),
            });
        }
        Ok(())
    }

    /// Makes the bind groups if the arena changed since they were made.
    fn bind(&mut self) -> Result<(), ComputeError> {
        // Read before the tensors' ranges are: a compaction after this makes the next bind redo
        // the groups.
        let moved = self.context.moved_generation();
        let (generation, arenas) =
            {
                let state = self.arena.lock();
                if self.bound.as_ref().is_some_and(|bound| {
                    bound.generation == state.generation && bound.moved == moved
                }) {
                    return Ok(());
                }
                let arenas: Vec<(wgpu::Buffer, u64)> = state
                    .allocations
                    .iter()
                    .map(|a| (a.buffer().clone(), a.offset()))
                    .collect();
                (state.generation, arenas)
            };
        let device = &self.context.gpu().device;
        let resolve = |bindings: &[Binding]| -> Vec<(wgpu::Buffer, u64, u64)> {
            bindings
                .iter()
                .map(|binding| binding_range(binding, &arenas))
                .collect()
        };
        let mut groups = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            groups.push(match step {
                PlanStep::Kernel {
                    storage, bindings, ..
                } => {
                    let layout = self.context.kernel_layout(*storage);
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &self.params,
                            offset: 0,
                            size: NonZeroU64::new(PARAMS_BYTES),
                        }),
                    }];
                    let ranges = resolve(bindings);
                    entries.extend((1u32..).zip(&ranges).map(|(index, range)| {
                        wgpu::BindGroupEntry {
                            binding: index,
                            resource: range_resource(range),
                        }
                    }));
                    Some(device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("wgpu-pool plan"),
                        layout: &layout,
                        entries: &entries,
                    }))
                }
                PlanStep::Clear(_) => None,
                PlanStep::Custom {
                    pipeline,
                    bindings,
                    groups: others,
                    ..
                } => {
                    let ranges = resolve(bindings);
                    let own = custom_group(
                        device,
                        pipeline,
                        ranges.iter().map(range_resource).collect(),
                    )?;
                    let all: Vec<&wgpu::BindGroup> =
                        std::iter::once(&own).chain(others.iter()).collect();
                    check_custom_dispatch(device, pipeline, &all)?;
                    Some(own)
                }
            });
        }
        self.bind_groups_created += groups.iter().flatten().count() as u64;
        self.bound = Some(Bound {
            generation,
            moved,
            arenas,
            groups,
        });
        Ok(())
    }

    /// Records and submits one replay: inputs in, the steps, outputs out (to `outputs`, or to
    /// the read-back buffer).
    fn replay(&mut self, feeds: &[Feed<'_>], outputs: Outputs<'_>) -> Result<(), ComputeError> {
        if feeds.len() != self.inputs.len() {
            return Err(ComputeError::Capture(format!(
                "the plan has {} inputs, {} given",
                self.inputs.len(),
                feeds.len()
            )));
        }
        for (feed, slot) in feeds.iter().zip(&self.inputs) {
            match feed {
                Feed::Data(data) if data.len() != slot.len => {
                    return Err(ComputeError::DataLength {
                        shape: slot.shape.clone(),
                        data_len: data.len(),
                        expected_len: slot.len,
                    })
                }
                Feed::Data(_) => {}
                Feed::Tensor(tensor) => self.check_tensor("plan input", tensor, slot)?,
            }
        }
        // A compaction on another thread between binding and submitting moves tensors the
        // replay names: record it again over their new ranges (bounded, in case they keep moving).
        for _ in 0..8 {
            if self.record_and_submit(feeds, outputs)? {
                return Ok(());
            }
        }
        Err(ComputeError::Capture(
            "the plan's tensors were moved by compactions 8 times while it was being replayed"
                .into(),
        ))
    }

    /// Binds, records and submits one replay (see [`Plan::replay`]); `false` when a compaction
    /// moved tensors since the bind groups were made, and nothing was submitted.
    fn record_and_submit(
        &mut self,
        feeds: &[Feed<'_>],
        outputs: Outputs<'_>,
    ) -> Result<bool, ComputeError> {
        self.bind()?;
        let bound = self.bound.as_ref().expect("bound above");
        let device = &self.context.gpu().device;
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-pool plan replay"),
        });
        let range = |binding: &Binding| binding_range(binding, &bound.arenas);
        let slot_range = |slot: &Slot| {
            range(&Binding::Arena {
                arena: slot.arena,
                offset: slot.offset,
                size: slot.bytes,
            })
        };
        // Tensors copied in and out: with a buffer copy, or with the copy kernel (and a bind
        // group made for this replay) where the tensor lies in the arena's own buffer.
        let copies_in: Vec<(&Slot, &Tensor)> = feeds
            .iter()
            .zip(&self.inputs)
            .filter_map(|(feed, slot)| match feed {
                Feed::Tensor(tensor) => Some((slot, *tensor)),
                Feed::Data(_) => None,
            })
            .collect();
        let copies_out: Vec<(&Slot, &Tensor)> = match outputs {
            Outputs::Tensors(tensors) => self.outputs.iter().zip(tensors.iter().copied()).collect(),
            Outputs::ReadBack(_) => Vec::new(),
        };
        let same_buffer = |slot: &Slot, tensor: &Tensor| {
            bound.arenas[slot.arena].0
                == *tensor
                    .storage
                    .allocation()
                    .expect("a plan's inputs and outputs have memory")
                    .buffer()
        };
        let copy_group = |slot: &Slot, from: (&wgpu::Buffer, u64), to: (&wgpu::Buffer, u64)| {
            let layout = self.context.kernel_layout(2);
            let entries = [
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.params,
                        offset: 0,
                        size: NonZeroU64::new(PARAMS_BYTES),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: from.0,
                        offset: from.1,
                        size: NonZeroU64::new(slot.bytes),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: to.0,
                        offset: to.1,
                        size: NonZeroU64::new(slot.bytes),
                    }),
                },
            ];
            device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-pool plan copy"),
                layout: &layout,
                entries: &entries,
            })
        };
        for &(slot, tensor) in &copies_in {
            if !same_buffer(slot, tensor) {
                let (buffer, offset, _) = slot_range(slot);
                let source = tensor
                    .storage
                    .allocation()
                    .expect("a plan's inputs and outputs have memory");
                encoder.copy_buffer_to_buffer(
                    source.buffer(),
                    source.offset(),
                    &buffer,
                    offset,
                    slot.bytes,
                );
            }
        }
        let mut pass: Option<wgpu::ComputePass<'_>> = None;
        let mut current: Option<KernelKey> = None;
        let open = |pass: &mut Option<wgpu::ComputePass<'static>>,
                    encoder: &mut wgpu::CommandEncoder| {
            if pass.is_none() {
                *pass = Some(
                    encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("wgpu-pool plan"),
                            timestamp_writes: None,
                        })
                        .forget_lifetime(),
                );
            }
        };
        let kernel_copy = |pass: &mut wgpu::ComputePass<'static>, slot: &Slot, group| {
            pass.set_pipeline(&self.copy);
            pass.set_bind_group(0, &group, &[slot.copy.0]);
            let [x, y, z] = slot.copy.1;
            pass.dispatch_workgroups(x, y, z);
        };
        for &(slot, tensor) in &copies_in {
            if same_buffer(slot, tensor) {
                let (buffer, offset, _) = slot_range(slot);
                let source = tensor
                    .storage
                    .allocation()
                    .expect("a plan's inputs and outputs have memory");
                let group = copy_group(slot, (source.buffer(), source.offset()), (&buffer, offset));
                open(&mut pass, &mut encoder);
                kernel_copy(pass.as_mut().expect("opened"), slot, group);
            }
        }
        for (step, group) in self.steps.iter().zip(&bound.groups) {
            match step {
                PlanStep::Kernel {
                    pipeline,
                    key,
                    params_offset,
                    workgroups,
                    ..
                } => {
                    if pass.is_none() {
                        current = None;
                    }
                    open(&mut pass, &mut encoder);
                    let pass = pass.as_mut().expect("opened");
                    if current != Some(*key) {
                        pass.set_pipeline(pipeline);
                        current = Some(*key);
                    }
                    pass.set_bind_group(0, group.as_ref(), &[*params_offset]);
                    let [x, y, z] = *workgroups;
                    pass.dispatch_workgroups(x, y, z);
                }
                PlanStep::Custom {
                    pipeline,
                    groups,
                    workgroups,
                    ..
                } => {
                    open(&mut pass, &mut encoder);
                    let pass = pass.as_mut().expect("opened");
                    current = None;
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, group.as_ref(), &[]);
                    for (index, group) in (1u32..).zip(groups) {
                        pass.set_bind_group(index, group, &[]);
                    }
                    let [x, y, z] = *workgroups;
                    pass.dispatch_workgroups(x, y, z);
                }
                PlanStep::Clear(binding) => {
                    pass = None;
                    let (buffer, offset, size) = range(binding);
                    encoder.clear_buffer(&buffer, offset, Some(size));
                }
            }
        }
        for &(slot, tensor) in &copies_out {
            if same_buffer(slot, tensor) {
                let (buffer, offset, _) = slot_range(slot);
                let target = tensor
                    .storage
                    .allocation()
                    .expect("a plan's inputs and outputs have memory");
                let group = copy_group(slot, (&buffer, offset), (target.buffer(), target.offset()));
                open(&mut pass, &mut encoder);
                kernel_copy(pass.as_mut().expect("opened"), slot, group);
            }
        }
        drop(pass);
        for &(slot, tensor) in &copies_out {
            if !same_buffer(slot, tensor) {
                let (buffer, offset, _) = slot_range(slot);
                let target = tensor
                    .storage
                    .allocation()
                    .expect("a plan's inputs and outputs have memory");
                encoder.copy_buffer_to_buffer(
                    &buffer,
                    offset,
                    target.buffer(),
                    target.offset(),
                    slot.bytes,
                );
            }
        }
        if let Outputs::ReadBack(read_back) = outputs {
            let mut at = 0;
            for slot in &self.outputs {
                let (buffer, offset, _) = slot_range(slot);
                encoder.copy_buffer_to_buffer(&buffer, offset, read_back, at, slot.bytes);
                at += slot.bytes;
            }
        }
        let commands = encoder.finish();
        let queue = &self.context.gpu().queue;
        let writes = || {
            for (feed, slot) in feeds.iter().zip(&self.inputs) {
                if let Feed::Data(data) = feed {
                    let (buffer, offset, _) = slot_range(slot);
                    queue.write_buffer(&buffer, offset, &encode_elements(data, slot.dtype));
                }
            }
            Ok(())
        };
        let submitted = self
            .context
            .submit_after_batch(writes, vec![commands], bound.moved)?;
        Ok(submitted.is_some())
    }
}

/// The range a plan binds for `binding`, over the arena's `(buffer, offset)` per index:
/// `(buffer, offset, size)`.
fn binding_range(binding: &Binding, arenas: &[(wgpu::Buffer, u64)]) -> (wgpu::Buffer, u64, u64) {
    match binding {
        Binding::Arena {
            arena,
            offset,
            size,
        } => (arenas[*arena].0.clone(), arenas[*arena].1 + offset, *size),
        Binding::Tensor(storage) => {
            let allocation = storage
                .allocation()
                .expect("tensors bound by a plan have memory");
            (
                allocation.buffer().clone(),
                allocation.offset(),
                allocation.binding_size(),
            )
        }
    }
}

/// A bind-group resource over a `(buffer, offset, size)` range.
fn range_resource(range: &(wgpu::Buffer, u64, u64)) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: &range.0,
        offset: range.1,
        size: NonZeroU64::new(range.2),
    })
}
