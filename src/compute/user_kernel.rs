//! Kernels of the user's, compiled and checked once: [`UserKernel`] (made by
//! [`Context::user_kernel`](super::Context::user_kernel)) and the bind groups of its further
//! groups ([`UserBindGroup`]).
//!
//! A user's kernel takes its tensors and parameters as the context's own kernels do (group 0:
//! the parameters' uniform at binding 0, tensors at bindings 1, 2, ...), so that its dispatches
//! go through the context's one recording path: bind groups cached by the ranges they bind,
//! parameters written through the context's uniform ring. Its WGSL is read once (with naga, the
//! WGSL front end wgpu itself uses) when it is made: what wgpu would refuse only at a dispatch —
//! a tensor binding declared read-only, a group without a layout — is refused then, and what a
//! dispatch must give (how many tensors, the least bytes of each, the parameters' size, which
//! groups) is kept and checked on the host at each dispatch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::types::{group0_entries, ComputeError};

/// The op name of a user's kernel in errors.
pub(crate) const OP: &str = "dispatch";

/// What a kernel of the user's is: its WGSL and the interface it declares (see
/// [`Context::user_kernel`](super::Context::user_kernel)).
#[derive(Debug, Clone, Copy, Default)]
pub struct UserKernelDesc<'a> {
    /// The kernel's name, for labels, errors and timings.
    pub label: &'a str,
    /// The WGSL source.
    pub wgsl: &'a str,
    /// The entry point (`@compute fn`).
    pub entry_point: &'a str,
    /// Tensors the kernel binds, at bindings `1..=tensors` of group 0, each declared
    /// `var<storage, read_write>` (every one of them: an undeclared binding is refused).
    pub tensors: usize,
    /// Bytes of the kernel's parameters (a `var<uniform>` at binding 0 of group 0, of at most
    /// this size), `0` when it takes none.
    pub params_bytes: u64,
    /// The layouts of groups `1..` (uniforms, textures and other resources outside the pool), in
    /// group order.
    pub groups: &'a [&'a wgpu::BindGroupLayout],
}

/// A compute kernel of the user's, compiled and checked once for the context's device; cheap to
/// clone. Dispatch it with [`Context::dispatch`](super::Context::dispatch) or
/// [`Context::dispatch_with`](super::Context::dispatch_with).
#[derive(Clone)]
pub struct UserKernel {
    pub(crate) inner: Arc<KernelInner>,
}

pub(crate) struct KernelInner {
    /// Unique in the process: the bind-group cache's key for its layout.
    pub(crate) id: u64,
    pub(crate) label: String,
    pub(crate) device: wgpu::Device,
    pub(crate) pipeline: wgpu::ComputePipeline,
    /// The layout of group 0.
    pub(crate) layout: wgpu::BindGroupLayout,
    /// The layouts of groups `1..`.
    pub(crate) groups: Vec<wgpu::BindGroupLayout>,
    /// The least bytes of each tensor's binding, as its WGSL type needs.
    pub(crate) min_tensor_bytes: Vec<u64>,
    /// Bytes of the parameters' binding (a multiple of 16), 0 without.
    pub(crate) params_binding_bytes: u64,
    /// Bytes of the parameters as declared.
    pub(crate) params_bytes: u64,
}

impl std::fmt::Debug for UserKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserKernel")
            .field("label", &self.inner.label)
            .field("tensors", &self.inner.min_tensor_bytes.len())
            .field("params_bytes", &self.inner.params_bytes)
            .field("groups", &self.inner.groups.len())
            .finish()
    }
}

impl PartialEq for UserKernel {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

/// A bind group of one of a kernel's groups `1..`, made by [`UserKernel::bind_group`] (so that a
/// dispatch knows its layout without asking wgpu).
#[derive(Debug, Clone)]
pub struct UserBindGroup {
    pub(crate) group: wgpu::BindGroup,
    pub(crate) layout: wgpu::BindGroupLayout,
}

impl UserBindGroup {
    /// The wgpu bind group.
    pub fn bind_group(&self) -> &wgpu::BindGroup {
        &self.group
    }
}

/// Kernel ids, unique in the process.
static NEXT_KERNEL: AtomicU64 = AtomicU64::new(1);

impl UserKernel {
    /// Reads, checks and compiles `desc` on `device` (see
    /// [`Context::user_kernel`](super::Context::user_kernel)); `max_params_bytes` is the most
    /// the context's uniform ring binds at once.
    pub(crate) fn new(
        device: &wgpu::Device,
        desc: &UserKernelDesc<'_>,
        max_params_bytes: u64,
    ) -> Result<Self, ComputeError> {
        let limits = device.limits();
        let max_tensors = limits.max_storage_buffers_per_shader_stage as usize;
        if !(1..=max_tensors).contains(&desc.tensors) {
            return Err(config(
                desc,
                format!(
                    "binds {} tensors; a kernel binds 1..={max_tensors} on this device",
                    desc.tensors
                ),
            ));
        }
        let params_binding_bytes = desc.params_bytes.next_multiple_of(16);
        let max_params = max_params_bytes.min(limits.max_uniform_buffer_binding_size);
        if params_binding_bytes > max_params {
            return Err(ComputeError::ExceedsLimit {
                op: OP,
                what: "bytes of a kernel's parameters",
                value: desc.params_bytes,
                limit_name: "the context's parameter ring and max_uniform_buffer_binding_size",
                limit: max_params,
            });
        }
        let module = naga::front::wgsl::parse_str(desc.wgsl)
            .map_err(|error| config(desc, error.emit_to_string(desc.wgsl)))?;
        let min_tensor_bytes = check_interface(&module, desc)?;
        let layout = group_layout(device, desc, params_binding_bytes);
        let pipeline = compile(device, desc, &layout)?;
        Ok(Self {
            inner: Arc::new(KernelInner {
                id: NEXT_KERNEL.fetch_add(1, Ordering::Relaxed),
                label: desc.label.to_owned(),
                device: device.clone(),
                pipeline,
                layout,
                groups: desc.groups.iter().map(|&layout| layout.clone()).collect(),
                min_tensor_bytes,
                params_binding_bytes,
                params_bytes: desc.params_bytes,
            }),
        })
    }

    /// The kernel's name.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The compiled pipeline (its layout: group 0 as the context binds it, then the groups of
    /// [`UserKernelDesc::groups`]).
    pub fn pipeline(&self) -> &wgpu::ComputePipeline {
        &self.inner.pipeline
    }

    /// Tensors a dispatch binds.
    pub fn tensors(&self) -> usize {
        self.inner.min_tensor_bytes.len()
    }

    /// A bind group of group `group` (1 or more) of the kernel over `entries`, made with the
    /// layout given for it. Errors: [`ComputeError::UserKernel`] for a group the kernel does not
    /// have, or entries its layout does not take.
    pub fn bind_group(
        &self,
        group: u32,
        entries: &[wgpu::BindGroupEntry<'_>],
    ) -> Result<UserBindGroup, ComputeError> {
        let layout = group
            .checked_sub(1)
            .and_then(|index| self.inner.groups.get(index as usize))
            .ok_or_else(|| {
                refused(
                    &self.inner.label,
                    format!(
                        "the kernel has no group {group} (groups 1..={} were given layouts)",
                        self.inner.groups.len()
                    ),
                )
            })?;
        let device = &self.inner.device;
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&self.inner.label),
            layout,
            entries,
        });
        match crate::device::caught(validation) {
            None => Ok(UserBindGroup {
                group: bind_group,
                layout: layout.clone(),
            }),
            Some(error) => Err(refused(
                &self.inner.label,
                format!("group {group} does not take these entries: {error}",),
            )),
        }
    }

    /// Checks what a dispatch gives against what the kernel declared: `params` bytes, the
    /// binding sizes of its tensors, its further groups.
    pub(crate) fn check_dispatch(
        &self,
        params: &[u8],
        tensor_bytes: impl ExactSizeIterator<Item = u64>,
        groups: &[&UserBindGroup],
    ) -> Result<(), ComputeError> {
        let kernel = &*self.inner;
        let label = &kernel.label;
        if tensor_bytes.len() != kernel.min_tensor_bytes.len() {
            return Err(refused(
                label,
                format!(
                    "the kernel binds {} tensors, {} given",
                    kernel.min_tensor_bytes.len(),
                    tensor_bytes.len()
                ),
            ));
        }
        for ((binding, bytes), &least) in (1..).zip(tensor_bytes).zip(&kernel.min_tensor_bytes) {
            if bytes < least {
                return Err(refused(
                    label,
                    format!(
                        "the tensor at binding {binding} has {bytes} bytes; its WGSL \
                     type needs at least {least}"
                    ),
                ));
            }
        }
        let given = params.len() as u64;
        if given > kernel.params_bytes || (kernel.params_bytes > 0) != (given > 0) {
            return Err(refused(
                label,
                format!(
                    "parameters of {given} bytes given; the kernel takes {}",
                    kernel.params_bytes
                ),
            ));
        }
        if groups.len() != kernel.groups.len() {
            return Err(refused(
                label,
                format!(
                    "the kernel takes groups 1..={}, {} bind groups given",
                    kernel.groups.len(),
                    groups.len()
                ),
            ));
        }
        for (index, (group, layout)) in (1..).zip(groups.iter().zip(&kernel.groups)) {
            if group.layout != *layout {
                return Err(refused(
                    label,
                    format!(
                        "the bind group given for group {index} was made for another \
                     layout"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A [`ComputeError::UserKernel`] about the kernel of `desc`, refused as it is made.
fn config(desc: &UserKernelDesc<'_>, message: String) -> ComputeError {
    ComputeError::UserKernel {
        op: "user_kernel",
        kernel: desc.label.to_string(),
        reason: message,
    }
}

/// A [`ComputeError::UserKernel`] about the kernel `label`, refused at a dispatch.
pub(crate) fn refused(label: &str, reason: String) -> ComputeError {
    ComputeError::UserKernel {
        op: OP,
        kernel: label.to_string(),
        reason,
    }
}

/// Checks the bindings `module` declares against `desc` (group 0: the parameters' uniform at
/// binding 0 when there are parameters, `read_write` storage at `1..=tensors`; groups `1..` with
/// layouts), and returns the least bytes of each tensor binding.
fn check_interface(
    module: &naga::Module,
    desc: &UserKernelDesc<'_>,
) -> Result<Vec<u64>, ComputeError> {
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .map_err(|error| config(desc, error.to_string()))?;
    let mut min_bytes: Vec<Option<u64>> = vec![None; desc.tensors];
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        let name = var.name.as_deref().unwrap_or("?");
        let (group, index) = (binding.group, binding.binding);
        let bytes = u64::from(layouter[var.ty].size);
        match (group, index, var.space) {
            (0, 0, naga::AddressSpace::Uniform)
                if bytes <= desc.params_bytes && desc.params_bytes > 0 => {}
            (0, 0, _) => {
                return Err(config(
                    desc,
                    format!(
                        "binding 0 of group 0 (`{name}`, {bytes} bytes) must be the parameters' \
                         `var<uniform>` of at most params_bytes ({}) bytes",
                        desc.params_bytes
                    ),
                ))
            }
            (0, _, naga::AddressSpace::Storage { access }) if (index as usize) <= desc.tensors => {
                if !access.contains(naga::StorageAccess::STORE) {
                    return Err(ComputeError::ReadOnlyBinding {
                        message: format!(
                            "{}: binding {index} of group 0 (`{name}`) is declared \
                             `var<storage, read>`, not `var<storage, read_write>`",
                            desc.label
                        ),
                    });
                }
                min_bytes[index as usize - 1] = Some(bytes);
            }
            (0, _, _) => {
                return Err(config(
                    desc,
                    format!(
                        "binding {index} of group 0 (`{name}`) is not one of the {} tensors' \
                         `var<storage, read_write>` at bindings 1..={}",
                        desc.tensors, desc.tensors
                    ),
                ))
            }
            (group, _, _) if group as usize > desc.groups.len() => {
                return Err(config(
                    desc,
                    format!(
                        "`{name}` is in group {group}, which has no layout (groups 1..={} were \
                         given)",
                        desc.groups.len()
                    ),
                ))
            }
            _ => {}
        }
    }
    // Every tensor the kernel is said to bind is declared: a tensor bound to nothing would be
    // an output never written (unspecified memory) or an input never read.
    min_bytes
        .into_iter()
        .enumerate()
        .map(|(index, bytes)| {
            bytes.ok_or_else(|| {
                config(
                    desc,
                    format!(
                        "binding {} of group 0 is not declared, but the kernel is said to bind {} \
                         tensors (at bindings 1..={})",
                        index + 1,
                        desc.tensors,
                        desc.tensors
                    ),
                )
            })
        })
        .collect()
}

/// The layout of group 0 of a user's kernel: the parameters' uniform (dynamic offset) at binding
/// 0 when it has parameters, `tensors` read-write storage buffers at `1..`.
fn group_layout(
    device: &wgpu::Device,
    desc: &UserKernelDesc<'_>,
    params_binding_bytes: u64,
) -> wgpu::BindGroupLayout {
    let entries = group0_entries(params_binding_bytes, desc.tensors);
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(desc.label),
        entries: &entries,
    })
}

/// The pipeline of `desc` over group 0's `layout` and the given groups' layouts: a shader or
/// pipeline wgpu refuses is [`ComputeError::Kernel`].
fn compile(
    device: &wgpu::Device,
    desc: &UserKernelDesc<'_>,
    layout: &wgpu::BindGroupLayout,
) -> Result<wgpu::ComputePipeline, ComputeError> {
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let layouts: Vec<Option<&wgpu::BindGroupLayout>> = std::iter::once(Some(layout))
        .chain(desc.groups.iter().map(|&layout| Some(layout)))
        .collect();
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(desc.label),
        bind_group_layouts: &layouts,
        immediate_size: 0,
    });
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(desc.label),
        source: wgpu::ShaderSource::Wgsl(desc.wgsl.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(desc.label),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(desc.entry_point),
        compilation_options: Default::default(),
        cache: None,
    });
    match crate::device::caught(validation) {
        None => Ok(pipeline),
        Some(error) => Err(ComputeError::Kernel {
            kernel: desc.label.to_owned(),
            message: error.to_string(),
        }),
    }
}
