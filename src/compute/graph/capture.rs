//! Capturing a forward: [`Capture`] records the context's ops into a tape, and
//! [`Capture::finish`] fuses and plans it into a [`Plan`].

use std::sync::Arc;
use web_time::Instant;

use super::build::Planner;
use super::fusion::fuse;
use super::ir::CaptureOptions;
use super::replay::Plan;
use crate::compute::context::Context;
use crate::compute::shared::{Step, Storage};
use crate::compute::tensor::Tensor;
use crate::compute::types::{element_count, ComputeError, DType};

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
    /// Opens a capture (see [`Plan`](crate::compute::Plan)): submits the open batch, then records ops until
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
}

impl Capture {
    /// A symbolic f32 input of `shape`: the plan's input number `self.inputs().len()`, written
    /// by each replay.
    pub fn input(&mut self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        self.input_with(shape, DType::F32)
    }

    /// [`Capture::input`] with elements stored as `dtype`: a replay rounds the values of a
    /// [`Feed::Data`](crate::compute::Feed::Data) to it, and takes a [`Feed::Tensor`](crate::compute::Feed::Tensor) of that type only.
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
    /// device's limits; [`ComputeError::Pool`] when the arena cannot be allocated. (A user's
    /// kernel's dispatch was checked when it was recorded.)
    pub fn finish_with(
        mut self,
        outputs: &[&Tensor],
        options: CaptureOptions,
    ) -> Result<Plan, ComputeError> {
        let (steps, fused, started) = self.end(outputs, &options)?;
        Planner::new(&self.context, self.id, &options)?.build(
            steps,
            &self.inputs,
            outputs,
            fused,
            started,
            options,
        )
    }

    /// Ends the capture and says the bytes its plan's arena would need (one figure per arena
    /// index, as [`PlanStats::arenas`](crate::compute::PlanStats::arenas) counts them; their sum
    /// is its `heap_bytes`) under `options`, without building the plan: no arena is allocated
    /// (`options.arena` is only checked), no pipeline or bind group made. So a caller can know
    /// what a plan will hold before anything is made for it. Errors as
    /// [`Capture::finish_with`]'s but for those of the arena's allocation.
    pub fn arena_bytes(
        mut self,
        outputs: &[&Tensor],
        options: CaptureOptions,
    ) -> Result<Vec<u64>, ComputeError> {
        let (steps, _, _) = self.end(outputs, &options)?;
        Planner::new(&self.context, self.id, &options)?.arena_bytes(
            &steps,
            &self.inputs,
            outputs,
            &options,
        )
    }

    /// Ends the capture: checks the outputs and the arena, and gives the (fused) tape, the count
    /// of steps fusion removed, and when this began.
    fn end(
        &mut self,
        outputs: &[&Tensor],
        options: &CaptureOptions,
    ) -> Result<(Vec<Step>, usize, Instant), ComputeError> {
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
        Ok((steps, fused, started))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.open {
            self.context.end_tape(self.id);
        }
    }
}
