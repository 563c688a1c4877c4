//! What a plan is made of: the options of a build, its statistics, its prebuilt steps and the
//! slots of its inputs and outputs.

use std::sync::Arc;

use super::arena::PlanArena;
use crate::compute::record::Range;
use crate::compute::shared::Storage;
use crate::compute::types::{DType, KernelKey, Source};

/// How [`Capture::finish_with`](super::Capture::finish_with) builds a plan.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Fuse bias adds and activations into the matmuls that feed them (default on).
    pub fuse: bool,
    /// The arena to place the plan in, shared with other plans of the context (see
    /// [`PlanArena`]); `None`: an arena of the plan's own. An arena made by another context is
    /// refused ([`ComputeError::ForeignArena`](crate::compute::ComputeError::ForeignArena)).
    pub arena: Option<PlanArena>,
    /// The planner's search budget ([`PlanOptions::search_steps`](crate::plan::PlanOptions::search_steps)). Captured graphs are small:
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

/// Where a plan's step finds one of its tensors.
#[derive(Clone)]
pub(super) enum Binding {
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
pub(super) enum PlanStep {
    /// A dispatch: a kernel of the context's or of the user's.
    Dispatch(PlanDispatch),
    /// A clear to zeros.
    Clear(Binding),
}

/// A prebuilt dispatch: what group 0 is made of (for each arena the plan is bound to) and what
/// is set around it.
pub(super) struct PlanDispatch {
    pub(super) pipeline: wgpu::ComputePipeline,
    /// Group 0's layout.
    pub(super) layout: wgpu::BindGroupLayout,
    /// The dynamic offset of the step's parameters in the plan's uniform buffer and the bytes of
    /// their binding; `None` for a user's kernel without parameters.
    pub(super) params: Option<(u32, u64)>,
    pub(super) bindings: Vec<Binding>,
    /// A user's kernel's groups `1..`.
    pub(super) more_groups: Vec<wgpu::BindGroup>,
    pub(super) workgroups: [u32; 3],
}

/// A plan's input or output: its range in the arena and its shape.
#[derive(Clone)]
pub(super) struct Slot {
    pub(super) arena: usize,
    pub(super) offset: u64,
    pub(super) bytes: u64,
    pub(super) shape: Vec<usize>,
    pub(super) len: usize,
    pub(super) dtype: DType,
    /// The copy kernel's parameters (offset in the plan's uniform buffer) and grid, for a
    /// tensor fed in or taken out that lies in the arena's own buffer (a buffer cannot be
    /// copied into itself).
    pub(super) copy: (u32, [u32; 3]),
}

impl Slot {
    /// What a read-back decodes of this output: `(len, dtype, bytes)`.
    pub(super) fn output(&self) -> (usize, DType, u64) {
        (self.len, self.dtype, self.bytes)
    }
}

/// The copy kernel: `y = x` over vec4s.
pub(super) const COPY: KernelKey = KernelKey::plain(Source::Unary, "copy");

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

/// The range a plan binds for `binding`, over the arena's `(buffer, offset)` per index:
/// `(buffer, offset, size)`.
pub(super) fn binding_range(binding: &Binding, arenas: &[(wgpu::Buffer, u64)]) -> Range {
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
