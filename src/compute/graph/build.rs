//! Building a plan from a capture's (fused) tape: lifetimes of the symbolic tensors, a memory plan
//! of their offsets in the arena, and every step prebuilt (pipelines, parameters).

use std::collections::HashMap;
use std::sync::Arc;
use web_time::Instant;

use super::arena::PlanArena;
use super::fusion::step_storages;
use super::ir::{Binding, CaptureOptions, PlanDispatch, PlanStats, PlanStep, Slot, COPY};
use super::replay::Plan;
use crate::compute::context::Context;
use crate::compute::ops::grid_1d;
use crate::compute::record::ParamsRing;
use crate::compute::shared::{Step, Storage};
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    kernel_u32, ComputeError, ElementwiseParams, ParamsBlock, PARAMS_BYTES,
};
use crate::plan::{greedy_by_size, plan, Buffer, PlanOptions};

/// Builds plans for one context.
pub(super) struct Planner<'a> {
    context: &'a Context,
    capture: u64,
    alignment: u64,
    arena: PlanArena,
}

/// The symbolic tensors of a tape: their ids (in order of first use) and their lifetimes.
struct Lifetimes {
    ids: HashMap<*const Storage, usize>,
    buffers: Vec<Buffer>,
}

/// Where the memory plan put the tensors.
struct Placed {
    ids: HashMap<*const Storage, usize>,
    planned: crate::plan::Plan,
}

impl Placed {
    /// The arena, offset and bytes of `storage` if it is a symbolic tensor of the capture.
    fn place(&self, storage: &Arc<Storage>) -> Option<(usize, u64, u64)> {
        let &id = self.ids.get(&Arc::as_ptr(storage))?;
        let placement = self.planned.placements[id];
        Some((placement.arena, placement.offset, storage.bytes))
    }

    /// Where a step finds `storage`: its range of the arena, or the tensor itself.
    fn binding(&self, storage: &Arc<Storage>) -> Binding {
        match self.place(storage) {
            Some((arena, offset, size)) => Binding::Arena {
                arena,
                offset,
                size,
            },
            None => Binding::Tensor(storage.clone()),
        }
    }

    /// The slot of an input or output.
    fn slot(&self, tensor: &Tensor) -> Slot {
        let (arena, offset, bytes) = self
            .place(&tensor.storage)
            .expect("inputs and outputs have lifetimes");
        Slot {
            arena,
            offset,
            bytes,
            shape: tensor.shape().to_vec(),
            len: tensor.len(),
            dtype: tensor.dtype(),
            copy: (0, [0; 3]),
        }
    }
}

impl<'a> Planner<'a> {
    pub(super) fn new(
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

    /// The bytes of each arena the plan of `steps` over `inputs` and `outputs` needs, as
    /// [`Planner::build`] would place them; nothing is allocated.
    pub(super) fn arena_bytes(
        &self,
        steps: &[Step],
        inputs: &[Tensor],
        outputs: &[&Tensor],
        options: &CaptureOptions,
    ) -> Result<Vec<u64>, ComputeError> {
        let lifetimes = self.lifetimes(steps, inputs, outputs)?;
        Ok(plan(&lifetimes.buffers, &self.plan_options(options))?.arena_bytes)
    }

    /// The memory plan's options for a capture of `options`.
    fn plan_options(&self, options: &CaptureOptions) -> PlanOptions {
        PlanOptions {
            alignment: self.alignment,
            max_arena_bytes: Some(
                (self.context.limits().max_buffer_size / self.alignment) * self.alignment,
            ),
            search_steps: options.search_steps,
            ..PlanOptions::default()
        }
    }

    /// The plan of `steps` (the fused tape) over `inputs` and `outputs`: places the symbolic
    /// tensors in the arena, prebuilds every step, and binds them.
    pub(super) fn build(
        self,
        steps: Vec<Step>,
        inputs: &[Tensor],
        outputs: &[&Tensor],
        fused: usize,
        started: Instant,
        options: CaptureOptions,
    ) -> Result<Plan, ComputeError> {
        let lifetimes = self.lifetimes(&steps, inputs, outputs)?;
        let plan_options = self.plan_options(&options);
        let planned = plan(&lifetimes.buffers, &plan_options)?;
        let greedy = greedy_by_size(&lifetimes.buffers, &plan_options)?;
        let label = format!(
            "plan arena ({} tensors, max-live {} B)",
            lifetimes.buffers.len(),
            planned.max_live_bytes
        );
        self.arena.reserve(&planned.arena_bytes, &label)?;
        let names = names(&lifetimes.ids, &steps, inputs, lifetimes.buffers.len());
        self.arena.label(&planned, &lifetimes.buffers, &names)?;
        let stats = PlanStats {
            recorded_steps: steps.len() + fused,
            fused_steps: fused,
            steps: steps.len(),
            buffers: lifetimes.buffers.len(),
            heap_bytes: planned.heap_bytes,
            max_live_bytes: planned.max_live_bytes,
            greedy_by_size_heap_bytes: greedy.heap_bytes,
            arenas: planned.arena_bytes.len(),
            build_seconds: 0.0,
        };
        let placed = Placed {
            ids: lifetimes.ids,
            planned,
        };
        let mut plan = self.prebuild(&steps, inputs, outputs, &placed, stats)?;
        plan.lifetimes = lifetimes.buffers;
        // The bind groups now: what binding the arena refuses is an error of the build, not of
        // the first replay.
        plan.bind()?;
        plan.stats.build_seconds = started.elapsed().as_secs_f64();
        Ok(plan)
    }

    /// The lifetimes of the capture's symbolic tensors: inputs from the start, outputs to the
    /// end, every other from the first step that binds it to the last.
    fn lifetimes(
        &self,
        steps: &[Step],
        inputs: &[Tensor],
        outputs: &[&Tensor],
    ) -> Result<Lifetimes, ComputeError> {
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
        for (index, step) in (1u64..).zip(steps) {
            for storage in step_storages(step) {
                touch(storage, index, index + 1);
            }
        }
        for output in outputs {
            touch(&output.storage, end, end + 1);
        }
        let max_binding = self.context.limits().max_storage_buffer_binding_size;
        if let Some(&(_, _, bytes)) = lives.iter().find(|life| life.2 > max_binding) {
            return Err(ComputeError::ExceedsLimit {
                op: "capture",
                what: "bytes of a captured tensor",
                value: bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit: max_binding,
            });
        }
        let buffers = (0u64..)
            .zip(&lives)
            .map(|(id, &(lower, upper, bytes))| Buffer::new(id, lower, upper, bytes))
            .collect();
        Ok(Lifetimes { ids, buffers })
    }

    /// The plan with every step prebuilt: pipelines, layouts, parameters in one uniform buffer
    /// (written once here), bindings, and the copies of inputs and outputs.
    fn prebuild(
        self,
        steps: &[Step],
        inputs: &[Tensor],
        outputs: &[&Tensor],
        placed: &Placed,
        stats: PlanStats,
    ) -> Result<Plan, ComputeError> {
        let gpu = self.context.gpu();
        let alignment = self.context.limits().min_uniform_buffer_offset_alignment;
        let mut params = ParamsRing::new(
            gpu,
            params_slots(steps, inputs, outputs, alignment)?,
            alignment,
        );
        let mut built = Vec::with_capacity(steps.len());
        for step in steps {
            built.push(self.prebuild_step(step, placed, &mut params)?);
        }
        let mut inputs: Vec<Slot> = inputs.iter().map(|t| placed.slot(t)).collect();
        let mut outputs: Vec<Slot> = outputs.iter().map(|t| placed.slot(t)).collect();
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
        Ok(Plan {
            context: self.context.clone(),
            steps: built,
            inputs,
            outputs,
            arena: self.arena,
            bound: None,
            params: params.buffer,
            copy: self.context.pipeline(&COPY)?,
            copy_layout: self.context.kernel_layout(2),
            output_bytes,
            stats,
            bind_groups_created: 0,
            lifetimes: Vec::new(),
            spare: Default::default(),
        })
    }

    /// One step prebuilt, its parameters pushed into `params`.
    fn prebuild_step(
        &self,
        step: &Step,
        placed: &Placed,
        params: &mut ParamsRing,
    ) -> Result<PlanStep, ComputeError> {
        let binding = |storage: &Arc<Storage>| placed.binding(storage);
        Ok(match step {
            Step::Kernel {
                kernel,
                params: block,
                bindings,
                workgroups,
            } => PlanStep::Dispatch(PlanDispatch {
                pipeline: self.context.pipeline(kernel)?,
                layout: self.context.kernel_layout(kernel.storage_bindings()),
                params: Some((params.push(block), PARAMS_BYTES)),
                bindings: bindings.iter().map(binding).collect(),
                more_groups: Vec::new(),
                workgroups: *workgroups,
            }),
            Step::Clear(storage) => PlanStep::Clear(binding(storage)),
            Step::Custom {
                kernel,
                params: bytes,
                storage,
                groups,
                workgroups,
            } => {
                let inner = &*kernel.inner;
                PlanStep::Dispatch(PlanDispatch {
                    pipeline: inner.pipeline.clone(),
                    layout: inner.layout.clone(),
                    params: (inner.params_bytes > 0).then(|| {
                        let binding = inner.params_binding_bytes;
                        (params.push_bytes(bytes, binding), binding)
                    }),
                    bindings: storage.iter().map(binding).collect(),
                    more_groups: groups.iter().map(|group| group.group.clone()).collect(),
                    workgroups: *workgroups,
                })
            }
        })
    }
}

/// The slots of a plan's uniform buffer: one per step and per input and output copy (a user's
/// kernel's parameters may take more), identical parameters of the context's kernels sharing one.
fn params_slots(
    steps: &[Step],
    inputs: &[Tensor],
    outputs: &[&Tensor],
    alignment: u32,
) -> Result<u32, ComputeError> {
    let slot_bytes = ParamsRing::slot_bytes(alignment);
    let user: u64 = steps
        .iter()
        .map(|step| match step {
            Step::Custom { kernel, .. } => kernel
                .inner
                .params_binding_bytes
                .div_ceil(slot_bytes)
                .max(1),
            _ => 1,
        })
        .sum();
    u32::try_from(user + (inputs.len() + outputs.len()) as u64)
        .ok()
        .filter(|&slots| slots <= ParamsRing::MAX_SLOTS)
        .map(|slots| slots.max(1))
        .ok_or_else(|| {
            ComputeError::Capture(format!(
                "a plan takes at most {} steps, inputs and outputs",
                ParamsRing::MAX_SLOTS
            ))
        })
}

/// What each range of the arena holds, by tensor: the name of a tensor is its number and the op
/// that first writes it.
fn names(
    ids: &HashMap<*const Storage, usize>,
    steps: &[Step],
    inputs: &[Tensor],
    count: usize,
) -> Vec<String> {
    let mut names = vec![String::new(); count];
    for input in inputs {
        if let Some(&id) = ids.get(&Arc::as_ptr(&input.storage)) {
            names[id] = format!("t{id} input");
        }
    }
    for step in steps {
        let op = match step {
            Step::Kernel { kernel, .. } => kernel.entry,
            Step::Clear(_) => "zeros",
            Step::Custom { kernel, .. } => kernel.inner.label.as_str(),
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
}
