//! Kernels of your own on tensors, recorded through the context as its own ops are:
//! [`Context::user_kernel`] compiles and checks a kernel once, [`Context::dispatch`] and
//! [`Context::dispatch_with`] record it.
//!
//! A user's kernel binds what the context's kernels bind, where they bind it: group 0 holds its
//! parameters' `var<uniform>` at binding 0 (when it has parameters) and its tensors at bindings
//! 1, 2, ..., each declared `var<storage, read_write>` (tensors may share one segment buffer, and
//! wgpu refuses a buffer bound read-only and read-write in one dispatch); groups 1.. hold whatever
//! else it takes (made with [`UserKernel::bind_group`]). Its dispatches then go the context's one
//! recording path: the bind group of group 0 is cached by the ranges it binds, the parameters are
//! a slot of the context's uniform ring (no buffer of yours, no write of yours), its outputs
//! ([`Launch::output`]) may take the range of a tensor dropped earlier in the batch, and
//! [`ContextStats`](crate::compute::ContextStats) counts them. What a dispatch gives is checked
//! on the host against what the kernel declared; nothing is encoded to check it.
//!
//! A dispatch recorded this way joins the context's open batch, so it follows the rules of the
//! context's own ops: a tensor it binds and that is dropped afterwards keeps its range until the
//! batch carrying the dispatch is submitted, and reading or overwriting a tensor submits the batch
//! first. Binding [`Tensor::allocation`] in work recorded elsewhere (your own encoder) gives none
//! of that: a tensor dropped while no batch of the context is open is reusable at once, and an
//! allocation made then can take its range and have its upload land before your work runs.
//!
//! ```no_run
//! use wgpu_pool::compute::{Context, ContextOptions, Launch, UserKernelDesc};
//! use wgpu_pool::{request_gpu, LimitsChoice, Pool, PoolOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = request_gpu(LimitsChoice::Adapter)?;
//! let pool = Pool::new(&gpu, PoolOptions::default())?;
//! let context = Context::new(&pool, ContextOptions::default())?;
//! let scale = context.user_kernel(&UserKernelDesc {
//!     label: "scale",
//!     wgsl: "struct Params { factor: f32, len: u32 }
//!            @group(0) @binding(0) var<uniform> params: Params;
//!            @group(0) @binding(1) var<storage, read_write> x: array<f32>;
//!            @group(0) @binding(2) var<storage, read_write> y: array<f32>;
//!            @compute @workgroup_size(64)
//!            fn main(@builtin(global_invocation_id) id: vec3<u32>) {
//!                if id.x < params.len { y[id.x] = params.factor * x[id.x]; }
//!            }",
//!     entry_point: "main",
//!     tensors: 2,
//!     params_bytes: 8,
//!     groups: &[],
//! })?;
//! #[repr(C)]
//! #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
//! struct Params { factor: f32, len: u32 }
//! let x = context.tensor(&[1.0, 2.0, 3.0, 4.0], &[4])?;
//! let params = Params { factor: 2.0, len: 4 };
//! let launch = Launch::new([1, 1, 1]).params(&params).tensors(&[&x]).output(&[4]);
//! let y = context.dispatch_with(&scale, &launch)?.remove(0); // recorded into the open batch
//! drop(x); // kept until the batch is submitted
//! assert_eq!(y.to_vec()?, [2.0, 4.0, 6.0, 8.0]);
//! # Ok(())
//! # }
//! ```

use crate::compute::context::Context;
use crate::compute::tensor::Tensor;
use crate::compute::types::{element_count, tensor_bytes, ComputeError, DType, PARAMS_BYTES};
use crate::compute::user_kernel::{refused, UserBindGroup, UserKernel, UserKernelDesc};

/// One dispatch of a user's kernel ([`Context::dispatch_with`]): its grid, parameters, tensors,
/// outputs and further groups. The kernel binds `tensors` and then the outputs, in order, at
/// bindings 1, 2, ... of group 0.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    workgroups: [u32; 3],
    params: &'a [u8],
    tensors: Vec<&'a Tensor>,
    outputs: Vec<(Vec<usize>, DType)>,
    groups: Vec<&'a UserBindGroup>,
}

impl<'a> Launch<'a> {
    /// A dispatch of `workgroups` workgroups, binding nothing yet.
    pub fn new(workgroups: [u32; 3]) -> Self {
        Self {
            workgroups,
            params: &[],
            tensors: Vec::new(),
            outputs: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// The kernel's parameters: `params`' bytes in a slot of the context's uniform ring, bound at
    /// binding 0 of group 0 (at most the kernel's
    /// [`params_bytes`](crate::compute::UserKernelDesc::params_bytes)).
    pub fn params<P: bytemuck::Pod>(mut self, params: &'a P) -> Self {
        self.params = bytemuck::bytes_of(params);
        self
    }

    /// Tensors of the context bound first, at bindings `1..=tensors.len()` (after those given
    /// before).
    pub fn tensors(mut self, tensors: &[&'a Tensor]) -> Self {
        self.tensors.extend_from_slice(tensors);
        self
    }

    /// One more output: an f32 tensor of `shape`, made by the dispatch and bound after the
    /// tensors and the outputs before it. The kernel must write it whole: its memory may be a
    /// range dropped earlier in the batch, as for the context's own ops.
    pub fn output(self, shape: &[usize]) -> Self {
        self.output_with(shape, DType::F32)
    }

    /// [`Launch::output`] with elements stored as `dtype`.
    pub fn output_with(mut self, shape: &[usize], dtype: DType) -> Self {
        self.outputs.push((shape.to_vec(), dtype));
        self
    }

    /// The bind groups of the kernel's groups `1..`, in order (after those given before).
    pub fn groups(mut self, groups: &[&'a UserBindGroup]) -> Self {
        self.groups.extend_from_slice(groups);
        self
    }
}

impl Context {
    /// Compiles a kernel of the user's for this context's device, checking once what wgpu
    /// would otherwise check at each dispatch (see [`Context::user_kernel`](crate::compute::Context::user_kernel)).
    ///
    /// Errors: [`ComputeError::ReadOnlyBinding`] for a tensor binding declared
    /// `var<storage, read>`; [`ComputeError::ExceedsLimit`] for parameters larger than the
    /// context's uniform ring binds (its slots times `max_ops_per_batch`) or than the device's
    /// `max_uniform_buffer_binding_size`; [`ComputeError::UserKernel`] for WGSL that does not parse,
    /// a binding of group 0 other than the parameters' uniform and the tensors, a group without
    /// a layout, or a tensor count beyond the device's `max_storage_buffers_per_shader_stage`;
    /// [`ComputeError::Kernel`] when wgpu refuses the shader or the pipeline.
    pub fn user_kernel(&self, desc: &UserKernelDesc<'_>) -> Result<UserKernel, ComputeError> {
        let alignment = u64::from(self.limits().min_uniform_buffer_offset_alignment);
        let ring_bytes = PARAMS_BYTES.max(alignment) * u64::from(self.options().max_ops_per_batch);
        let kernel = UserKernel::new(&self.gpu().device, desc, ring_bytes)?;
        self.count_user_kernel();
        Ok(kernel)
    }

    /// Records a dispatch of `kernel` without parameters, outputs or further groups into the
    /// context's open batch, with `tensors` at bindings `1..` of group 0. See
    /// [`Context::dispatch_with`].
    pub fn dispatch(
        &self,
        kernel: &UserKernel,
        tensors: &[&Tensor],
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        self.dispatch_with(kernel, &Launch::new(workgroups).tensors(tensors))
            .map(drop)
    }

    /// Records a dispatch of `kernel` into the context's open batch (or the open capture) as
    /// `launch` describes it, and returns its outputs.
    ///
    /// The dispatch joins the batch's lifetime tracking: a tensor it binds and that is dropped
    /// after this call keeps its range until the batch carrying the dispatch is submitted,
    /// whoever submits to the pool meanwhile, so no allocation can take it before the kernel has
    /// run. Reading or overwriting a tensor submits the batch first, so a read sees what the
    /// kernel wrote. In a capture, the dispatch is a step of the plan like any op.
    ///
    /// Errors, with nothing recorded: [`ComputeError::ForeignTensor`] for a tensor of another
    /// context; [`ComputeError::ExceedsLimit`] for a grid beyond the device's
    /// `max_compute_workgroups_per_dimension`; [`ComputeError::UserKernel`] for a kernel of another
    /// device, another number of tensors than the kernel binds, a tensor smaller than its WGSL
    /// type, parameters missing or larger than the kernel's, or bind groups other than one per
    /// group `1..` made for that group; the errors of making the outputs.
    pub fn dispatch_with(
        &self,
        kernel: &UserKernel,
        launch: &Launch<'_>,
    ) -> Result<Vec<Tensor>, ComputeError> {
        const OP: &str = "dispatch";
        if kernel.inner.device != self.gpu().device {
            return Err(refused(
                kernel.label(),
                "the kernel was made for another device".to_string(),
            ));
        }
        for tensor in &launch.tensors {
            self.check_owner(OP, tensor)?;
        }
        let mut lens = Vec::with_capacity(launch.outputs.len());
        for (shape, dtype) in &launch.outputs {
            lens.push(element_count(OP, shape)?);
            self.check_dtype(OP, *dtype)?;
        }
        // Checked before the outputs are made: a refused dispatch allocates nothing.
        let given = launch.tensors.iter().map(|tensor| tensor.storage.bytes);
        let made =
            (launch.outputs.iter().zip(&lens)).map(|((_, dtype), &len)| tensor_bytes(len, *dtype));
        let bytes: Vec<u64> = given.chain(made).collect();
        kernel.check_dispatch(launch.params, bytes.into_iter(), &launch.groups)?;
        self.check_workgroups(OP, launch.workgroups)?;
        if !launch.outputs.is_empty() {
            self.before_op()?;
        }
        let outputs = (launch.outputs.iter().zip(lens))
            .map(|((shape, dtype), len)| self.allocate_output(OP, shape.clone(), len, *dtype))
            .collect::<Result<Vec<Tensor>, _>>()?;
        let storage: Vec<_> = (launch.tensors.iter().copied().chain(&outputs))
            .map(|tensor| &tensor.storage)
            .collect();
        self.record_user(
            kernel,
            launch.params,
            &storage,
            &launch.groups,
            launch.workgroups,
        )?;
        Ok(outputs)
    }
}
