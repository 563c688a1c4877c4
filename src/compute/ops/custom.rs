//! Kernels of your own on tensors, recorded through the context: [`Context::dispatch`] and
//! [`Context::dispatch_with`].
//!
//! A dispatch recorded this way joins the context's open batch, so it follows the rules of the
//! context's own ops: a tensor it binds and that is dropped afterwards keeps its range until the
//! batch carrying the dispatch is submitted, and reading or overwriting a tensor submits the batch
//! first. Binding [`Tensor::allocation`] in work recorded elsewhere (your own encoder) gives none
//! of that: a tensor dropped while no batch of the context is open is reusable at once, and an
//! allocation made then can take its range and have its upload land before your work runs.
//!
//! ```no_run
//! use wgpu_pool::compute::{Context, ContextOptions};
//! use wgpu_pool::{request_gpu, LimitsChoice, Pool, PoolOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = request_gpu(LimitsChoice::Adapter)?;
//! let pool = Pool::new(&gpu, PoolOptions::default())?;
//! let context = Context::new(&pool, ContextOptions::default())?;
//! // Every storage binding `read_write`: tensors may share one segment buffer.
//! let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
//!     label: Some("double"),
//!     source: wgpu::ShaderSource::Wgsl(
//!         "@group(0) @binding(0) var<storage, read_write> x: array<f32>;
//!          @group(0) @binding(1) var<storage, read_write> y: array<f32>;
//!          @compute @workgroup_size(64)
//!          fn main(@builtin(global_invocation_id) id: vec3<u32>) {
//!              if id.x < arrayLength(&x) { y[id.x] = 2.0 * x[id.x]; }
//!          }"
//!         .into(),
//!     ),
//! });
//! let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
//!     label: Some("double"),
//!     layout: None,
//!     module: &module,
//!     entry_point: Some("main"),
//!     compilation_options: Default::default(),
//!     cache: None,
//! });
//! let x = context.tensor(&[1.0, 2.0, 3.0, 4.0], &[4])?;
//! let y = context.empty(&[4])?; // written whole by the kernel
//! context.dispatch(&pipeline, &[&x, &y], [1, 1, 1])?; // recorded into the open batch
//! drop(x); // kept until the batch is submitted
//! assert_eq!(y.to_vec()?, [2.0, 4.0, 6.0, 8.0]);
//! # Ok(())
//! # }
//! ```

use crate::compute::context::Context;
use crate::compute::tensor::Tensor;
use crate::compute::vocab::ComputeError;

impl Context {
    /// Records a dispatch of `pipeline` (a compute pipeline of your own on the context's device)
    /// into the context's open batch, with `tensors` bound at bindings `0..tensors.len()` of group
    /// 0. See [`Context::dispatch_with`].
    pub fn dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        tensors: &[&Tensor],
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        self.dispatch_with(pipeline, tensors, &[], workgroups)
    }

    /// Records a dispatch of `pipeline` into the context's open batch: `tensors` bound at
    /// bindings `0..tensors.len()` of group 0 (the context makes that bind group from the
    /// pipeline's layout of group 0), then `bind_groups` at groups `1..` (for uniforms and other
    /// resources outside the pool).
    ///
    /// The dispatch joins the batch's lifetime tracking: a tensor of `tensors` dropped after this
    /// call keeps its range until the batch carrying the dispatch is submitted, whoever submits
    /// to the pool meanwhile, so no allocation can take it before the kernel has run. Declare
    /// every storage binding of the tensors `var<storage, read_write>` (tensors may share a
    /// segment buffer, and wgpu refuses read-only and read-write bindings of one buffer in one
    /// dispatch). `bind_groups` must not bind pool memory: only `tensors` are tracked.
    ///
    /// The dispatch is submitted with the batch (see [`crate::compute::context`]); reading or
    /// overwriting a tensor submits it first, so a read sees what the kernel wrote.
    ///
    /// Errors: [`ComputeError::ForeignTensor`] for a tensor of another context;
    /// [`ComputeError::ExceedsLimit`] for a grid beyond the device's
    /// `max_compute_workgroups_per_dimension`; [`ComputeError::Config`] when `tensors` is empty,
    /// group 0 of the pipeline does not take them, or wgpu refuses the dispatch itself (a group
    /// the pipeline expects missing from `bind_groups` or of another layout, a tensor bound
    /// read-only in a segment another binds read-write): each call encodes the dispatch once
    /// into a command buffer that is never submitted, so that these come back here rather than
    /// as a validation error that would lose the batch. Nothing is recorded on error. In a
    /// capture the same checks run when the plan binds its arena. (On wasm32, where wgpu's error
    /// scopes resolve asynchronously, the dispatch itself is not checked.)
    pub fn dispatch_with(
        &self,
        pipeline: &wgpu::ComputePipeline,
        tensors: &[&Tensor],
        bind_groups: &[&wgpu::BindGroup],
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        for tensor in tensors {
            self.check_owner("dispatch", tensor)?;
        }
        let storage: Vec<_> = tensors.iter().map(|tensor| &tensor.storage).collect();
        self.record_custom(pipeline, &storage, bind_groups, workgroups)
    }
}
