//! Replaying a plan: [`Plan`] binds its arena (bind groups made again when the arena grew or its
//! tensors moved) and records each replay through the context's one recording path.

use super::arena::PlanArena;
use super::ir::{binding_range, Binding, PlanStats, PlanStep, Slot};
use crate::compute::context::Context;
use crate::compute::record::{storage_group, Encoded, PassRecorder, Range};
use crate::compute::shared::lock_ignoring_poison;
use crate::compute::tensor::Tensor;
use crate::compute::types::DType;
use crate::compute::types::{decode_elements, encode_elements, ComputeError, PARAMS_BYTES};
use crate::device::AccountedBuffer;
use crate::plan::Buffer;
use crate::state::BufferRole;
use std::sync::{Arc, Mutex};

/// The bind groups of a plan over one generation of its arena.
pub(super) struct Bound {
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

/// Where a replay puts its outputs: into tensors of the caller's, into a read-back buffer (one
/// after another), or both.
#[derive(Clone, Copy)]
struct Outputs<'a> {
    /// Copied into these tensors ([`Plan::run_into`], [`Plan::submit`]); empty for none.
    tensors: &'a [&'a Tensor],
    /// Copied one after another into this buffer, to be read back ([`Plan::run`],
    /// [`Plan::submit`]).
    read_back: Option<&'a wgpu::Buffer>,
}

/// A captured forward, planned: see [`Context::capture`](crate::compute::Context::capture) and the `compute` module's documentation.
pub struct Plan {
    pub(super) context: Context,
    pub(super) steps: Vec<PlanStep>,
    pub(super) inputs: Vec<Slot>,
    pub(super) outputs: Vec<Slot>,
    pub(super) arena: PlanArena,
    pub(super) bound: Option<Bound>,
    pub(super) params: AccountedBuffer,
    /// The copy kernel's pipeline and layout.
    pub(super) copy: wgpu::ComputePipeline,
    pub(super) copy_layout: wgpu::BindGroupLayout,
    /// The outputs' bytes: what [`Plan::run`] reads back (through the context's read-back
    /// buffer, shared by its plans).
    pub(super) output_bytes: u64,
    pub(super) stats: PlanStats,
    pub(super) bind_groups_created: u64,
    /// The tensors' lifetimes and sizes, as planned (ids in order of first use).
    pub(super) lifetimes: Vec<Buffer>,
    /// Read-back buffers of [`Plan::submit`]'s runs, given back when a run is dropped.
    pub(super) spare: Arc<Mutex<Vec<AccountedBuffer>>>,
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
    /// widened exactly): one submission (after the context's open batch), then waits for it.
    /// Errors: [`ComputeError::Capture`] when the inputs are not one per input,
    /// [`ComputeError::DataLength`] or [`ComputeError::ShapeMismatch`] for an input of the wrong
    /// size, and the errors of a read. Nothing is submitted on a refused input.
    pub fn run(&mut self, inputs: &[Feed<'_>]) -> Result<Vec<Vec<f32>>, ComputeError> {
        // The context's read-back buffer, shared by its plans, held from the copies to the read.
        let context = self.context.clone();
        let read_back = context.plan_read_back(self.output_bytes);
        self.replay(
            inputs,
            Outputs {
                tensors: &[],
                read_back: Some(&read_back),
            },
        )?;
        let outputs = &self.outputs;
        // Straight from the mapped read-back buffer into the outputs' vectors.
        let read = crate::device::read_mapped_with(
            &self.context.gpu().device,
            &read_back,
            self.output_bytes,
            |bytes| decode_outputs(bytes, outputs.iter().map(Slot::output)),
        );
        if read.is_err() {
            read_back.discard();
        }
        read.map_err(ComputeError::Wait)
    }

    /// [`Plan::run`] as a future that does not block the thread (for async code and browsers):
    /// submits the replay at once and resolves when its outputs are read back
    /// ([`Plan::submit`], then [`PlanRun::wait_async`]). Errors as [`Plan::run`].
    pub async fn run_async(&mut self, inputs: &[Feed<'_>]) -> Result<Vec<Vec<f32>>, ComputeError> {
        self.submit(inputs, &[])?.wait_async().await
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
        self.check_outputs(outputs)?;
        self.replay(
            inputs,
            Outputs {
                tensors: outputs,
                read_back: None,
            },
        )?;
        Ok(())
    }

    /// Replays the forward on `inputs` without waiting for it: the outputs are copied into
    /// `keep` (tensors of the context with the outputs' lengths and element types, one per
    /// output; or none) and into a read-back buffer of the plan's, which [`PlanRun::wait`] reads.
    /// So the host can record and submit the next replay (which may take `keep` as a
    /// [`Feed::Tensor`]) while this one runs. Errors as [`Plan::run_into`]; nothing is submitted
    /// on a refused input or output.
    pub fn submit(
        &mut self,
        inputs: &[Feed<'_>],
        keep: &[&Tensor],
    ) -> Result<PlanRun, ComputeError> {
        if !keep.is_empty() {
            self.check_outputs(keep)?;
        }
        let buffer = self.spare_read_back();
        let index = self.replay(
            inputs,
            Outputs {
                tensors: keep,
                read_back: Some(&buffer),
            },
        )?;
        Ok(PlanRun {
            context: self.context.clone(),
            buffer: Some(buffer),
            spare: self.spare.clone(),
            outputs: self.outputs.iter().map(Slot::output).collect(),
            bytes: self.output_bytes,
            index,
        })
    }

    /// A read-back buffer of the outputs' size for [`Plan::submit`]: one a finished run gave
    /// back, or a new one.
    fn spare_read_back(&self) -> AccountedBuffer {
        if let Some(buffer) = lock_ignoring_poison(&self.spare).pop() {
            return buffer;
        }
        self.context.gpu().create_accounted_buffer(
            BufferRole::PlanReadBack,
            &wgpu::BufferDescriptor {
                label: Some("wgpu-pool plan run read-back"),
                size: self.output_bytes.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            },
        )
    }

    /// Checks that `outputs` are one tensor per output, each fit for it.
    fn check_outputs(&self, outputs: &[&Tensor]) -> Result<(), ComputeError> {
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
        Ok(())
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
    pub(super) fn bind(&mut self) -> Result<(), ComputeError> {
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
        let groups: Vec<Option<wgpu::BindGroup>> = self
            .steps
            .iter()
            .map(|step| match step {
                PlanStep::Dispatch(dispatch) => {
                    let ranges: Vec<Range> = dispatch
                        .bindings
                        .iter()
                        .map(|binding| binding_range(binding, &arenas))
                        .collect();
                    let params = dispatch.params.map(|(_, bytes)| (&*self.params, bytes));
                    Some(storage_group(
                        device,
                        "wgpu-pool plan",
                        &dispatch.layout,
                        params,
                        &ranges,
                    ))
                }
                PlanStep::Clear(_) => None,
            })
            .collect();
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
    fn replay(
        &mut self,
        feeds: &[Feed<'_>],
        outputs: Outputs<'_>,
    ) -> Result<wgpu::SubmissionIndex, ComputeError> {
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
            if let Some(index) = self.record_and_submit(feeds, outputs)? {
                return Ok(index);
            }
        }
        Err(ComputeError::Capture(
            "the plan's tensors were moved by compactions 8 times while it was being replayed"
                .into(),
        ))
    }

    /// Binds, records and submits one replay (see [`Plan::replay`]); `None` when a compaction
    /// moved tensors since the bind groups were made, and nothing was submitted.
    fn record_and_submit(
        &mut self,
        feeds: &[Feed<'_>],
        outputs: Outputs<'_>,
    ) -> Result<Option<wgpu::SubmissionIndex>, ComputeError> {
        self.bind()?;
        let bound = self.bound.as_ref().expect("bound above");
        let device = &self.context.gpu().device;
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-pool plan replay"),
        });
        let mut recorder = PassRecorder::default();
        // Tensors copied in and out: with a buffer copy, or with the copy kernel where the tensor
        // lies in the arena's own buffer.
        let copies_in: Vec<(&Slot, &Tensor)> = feeds
            .iter()
            .zip(&self.inputs)
            .filter_map(|(feed, slot)| match feed {
                Feed::Tensor(tensor) => Some((slot, *tensor)),
                Feed::Data(_) => None,
            })
            .collect();
        let copies_out: Vec<(&Slot, &Tensor)> = self
            .outputs
            .iter()
            .zip(outputs.tensors.iter().copied())
            .collect();
        for &(slot, tensor) in &copies_in {
            self.copy_tensor(
                bound,
                &mut encoder,
                &mut recorder,
                slot,
                tensor,
                Direction::In,
            );
        }
        self.record_steps(bound, &mut encoder, &mut recorder);
        for &(slot, tensor) in &copies_out {
            self.copy_tensor(
                bound,
                &mut encoder,
                &mut recorder,
                slot,
                tensor,
                Direction::Out,
            );
        }
        recorder.end();
        if let Some(read_back) = outputs.read_back {
            let mut at = 0;
            for slot in &self.outputs {
                let (buffer, offset, _) = slot_range(slot, bound);
                encoder.copy_buffer_to_buffer(&buffer, offset, read_back, at, slot.bytes);
                at += slot.bytes;
            }
        }
        let commands = encoder.finish();
        let queue = &self.context.gpu().queue;
        let writes = || {
            for (feed, slot) in feeds.iter().zip(&self.inputs) {
                if let Feed::Data(data) = feed {
                    let (buffer, offset, _) = slot_range(slot, bound);
                    queue.write_buffer(&buffer, offset, &encode_elements(data, slot.dtype));
                }
            }
            Ok(())
        };
        self.context
            .submit_after_batch(writes, vec![commands], bound.moved)
    }

    /// Records the plan's steps through the one recording path: dispatches into the open pass,
    /// clears between passes.
    fn record_steps(
        &self,
        bound: &Bound,
        encoder: &mut wgpu::CommandEncoder,
        recorder: &mut PassRecorder,
    ) {
        for (step, group) in self.steps.iter().zip(&bound.groups) {
            match (step, group) {
                (PlanStep::Dispatch(dispatch), Some(group)) => recorder.dispatch(
                    encoder,
                    "wgpu-pool plan",
                    &Encoded {
                        pipeline: &dispatch.pipeline,
                        group,
                        params_offset: dispatch.params.map(|(offset, _)| offset),
                        more_groups: &dispatch.more_groups,
                        workgroups: dispatch.workgroups,
                    },
                    None,
                ),
                (PlanStep::Clear(binding), _) => {
                    recorder.end();
                    let (buffer, offset, size) = binding_range(binding, &bound.arenas);
                    encoder.clear_buffer(&buffer, offset, Some(size));
                }
                (PlanStep::Dispatch(_), None) => unreachable!("bind makes a group per dispatch"),
            }
        }
    }

    /// Copies `tensor` into (or out of) the arena's range of `slot`: a buffer copy between
    /// passes, or the copy kernel (with a bind group made for this replay) where the tensor lies
    /// in the arena's own buffer (a buffer cannot be copied into itself). Inputs are copied before
    /// the steps; outputs after them, by the kernel first and then by buffer copies once the pass
    /// has ended.
    fn copy_tensor(
        &self,
        bound: &Bound,
        encoder: &mut wgpu::CommandEncoder,
        recorder: &mut PassRecorder,
        slot: &Slot,
        tensor: &Tensor,
        direction: Direction,
    ) {
        let arena = slot_range(slot, bound);
        let allocation = tensor
            .storage
            .allocation()
            .expect("a plan's inputs and outputs have memory");
        let outside = (allocation.buffer().clone(), allocation.offset(), slot.bytes);
        let (from, to) = match direction {
            Direction::In => (outside, arena),
            Direction::Out => (arena, outside),
        };
        drop(allocation);
        if from.0 != to.0 {
            // Outputs are copied once the pass has ended (see `record_and_submit`): a copy ends
            // the pass anyway.
            recorder.end();
            encoder.copy_buffer_to_buffer(&from.0, from.1, &to.0, to.1, slot.bytes);
            return;
        }
        let device = &self.context.gpu().device;
        let params = Some((&*self.params, PARAMS_BYTES));
        let group = storage_group(
            device,
            "wgpu-pool plan copy",
            &self.copy_layout,
            params,
            &[from, to],
        );
        recorder.dispatch(
            encoder,
            "wgpu-pool plan",
            &Encoded {
                pipeline: &self.copy,
                group: &group,
                params_offset: Some(slot.copy.0),
                more_groups: &[],
                workgroups: slot.copy.1,
            },
            None,
        );
    }
}

/// A replay [`Plan::submit`] submitted, whose outputs are read by [`PlanRun::wait`]. Dropped
/// unread, it gives its read-back buffer back to the plan all the same.
#[must_use = "a submitted replay's outputs are read by `wait`"]
pub struct PlanRun {
    context: Context,
    /// `Some` until the run is dropped or its wait fails.
    buffer: Option<AccountedBuffer>,
    /// The plan's spare read-back buffers, where this one goes back.
    spare: Arc<Mutex<Vec<AccountedBuffer>>>,
    /// Each output's length, element type and bytes, in order.
    outputs: Vec<(usize, DType, u64)>,
    bytes: u64,
    index: wgpu::SubmissionIndex,
}

impl std::fmt::Debug for PlanRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanRun")
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

impl PlanRun {
    /// Waits for this replay only (not for what was submitted after it) and reads its outputs
    /// back as f32 values (f16 outputs widened exactly). Errors: [`ComputeError::Wait`] (the
    /// read-back buffer, whose mapping may still be pending, is then freed rather than used
    /// again).
    pub fn wait(mut self) -> Result<Vec<Vec<f32>>, ComputeError> {
        let buffer = self.buffer.as_ref().expect("held until dropped");
        let outputs = &self.outputs;
        let read = crate::device::read_mapped_after(
            &self.context.gpu().device,
            buffer,
            self.bytes.max(4),
            Some(self.index.clone()),
            |bytes| decode_outputs(bytes, outputs.iter().copied()),
        )
        .map_err(ComputeError::Wait);
        if read.is_err() {
            self.buffer = None;
        }
        read
    }

    /// [`PlanRun::wait`] as a future that does not block the thread (for async code and
    /// browsers). Errors as [`PlanRun::wait`].
    pub async fn wait_async(mut self) -> Result<Vec<Vec<f32>>, ComputeError> {
        let buffer = self.buffer.as_ref().expect("held until dropped");
        let outputs = &self.outputs;
        let read = crate::device::read_mapped_with_async(
            &self.context.gpu().device,
            buffer,
            self.bytes.max(4),
            |bytes| decode_outputs(bytes, outputs.iter().copied()),
        )
        .await
        .map_err(ComputeError::Wait);
        if read.is_err() {
            self.buffer = None;
        }
        match self.context.gpu().reported_errors() {
            Some(errors) => Err(crate::pool::PoolError::DeviceReported(errors).into()),
            None => read,
        }
    }
}

/// The outputs of a replay, each `(len, dtype, bytes)` in order, decoded from the read-back
/// buffer's mapped `bytes` into f32 vectors.
fn decode_outputs(
    bytes: &[u8],
    outputs: impl Iterator<Item = (usize, DType, u64)>,
) -> Vec<Vec<f32>> {
    let mut start = 0usize;
    outputs
        .map(|(len, dtype, bytes_of)| {
            let values = decode_elements(&bytes[start..], len, dtype);
            start += bytes_of as usize;
            values
        })
        .collect()
}

impl Drop for PlanRun {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            lock_ignoring_poison(&self.spare).push(buffer);
        }
    }
}

/// Which way [`Plan::copy_tensor`] copies.
#[derive(Clone, Copy)]
enum Direction {
    /// From a fed tensor into the arena.
    In,
    /// From the arena into a tensor of the caller's.
    Out,
}

/// The range of the arena a slot takes, in the bound arena.
fn slot_range(slot: &Slot, bound: &Bound) -> Range {
    binding_range(
        &Binding::Arena {
            arena: slot.arena,
            offset: slot.offset,
            size: slot.bytes,
        },
        &bound.arenas,
    )
}
