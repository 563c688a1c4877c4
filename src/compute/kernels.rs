//! Kernel sources, the WGSL the host writes for each variant, and the layouts and pipelines
//! built from them.
//!
//! # What is generated
//!
//! Every file of `shaders/` is plain WGSL, used as it is. A kernel's module is, in this order:
//!
//! 0. for the cooperative matmul only, the directive `enable wgpu_cooperative_matrix;`;
//! 1. **generated**: the element types ([`element_types`]): `enable f16;` where the variant
//!    loads or stores f16, and the aliases `Input` (what A, B, the bias and the element-wise
//!    inputs hold) and `Output` (what the kernel stores), each `f32` or `f16`; kernels convert
//!    every element they load to f32 and round once when they store, so the f32 variant's
//!    conversions are no-ops;
//! 2. **generated**: the variant's constants, WGSL `const` declarations ([`constants`]): the
//!    tile sizes, which edges to mask and the fused epilogue (bias, activation, residual) of the
//!    tiled matmul, the rows, lanes, subgroup size, split, epilogue and layer-norm prologue of
//!    the narrow one, the epilogue of the split-K reduction (none for the other kernels), so
//!    that each variant is compiled with its branches resolved;
//! 3. `shaders/common.wgsl` (activations, grid indexing, the element-wise parameters);
//! 4. for the tiled matmul, its storage bindings, declared as vec4s (`shaders/matmul_vec4.wgsl`)
//!    or as elements (`shaders/matmul_scalar.wgsl`, when K or N is not a multiple of 4);
//! 5. the kernel's file, `shaders/<source>.wgsl` (for the cooperative matmul,
//!    `shaders/matmul_coop.wgsl` with its storage bindings — `shaders/matmul_coop_vec4.wgsl` or
//!    `shaders/matmul_coop_scalar.wgsl`, which also provide its zero-filling loads and masked
//!    stores — put after its parameters);
//! 6. **generated**, for the matmul kernels (tiled, narrow, cooperative, the split-K
//!    reduction): the optional bindings of their variant ([`optional_bindings`]) — the
//!    residual of the epilogue, after the bias (`residual`, with the accessors `residual_vec4`
//!    and `residual_at` that the stores call; where the variant has none, accessors alone that
//!    give 0, in branches its constants resolve away), and the narrow matmul's layer-norm
//!    `gamma` and `beta` after it;
//! 7. **generated** (in `kernels/matmul.rs`), for the tiled matmul: its entry point `matmul` ([`matmul_entry`]),
//!    whose `BK` steps of K and whose `TM × TN` outputs per invocation are unrolled here into
//!    straight-line code (the driver's compiler then sees it whatever its unrolling heuristics);
//!    for the narrow matmul: its entry point `matmul_narrow` ([`narrow_entry`]), its rows (one
//!    accumulator each), four steps of K and its subgroup shuffles unrolled, and where its
//!    variant has one, the layer-norm prologue (each row's statistics, then A normalized as it
//!    is loaded); for the
//!    cooperative matmul: its entry point `matmul_coop` ([`coop_entry`]), its fragments,
//!    products and epilogue stores unrolled, every cooperative load's and store's index and
//!    stride bound to a `let` (naga 30 panics otherwise, see `shaders/matmul_coop.wgsl`).
//!
//! The WGSL does not depend on [`ShaderChecks`]: only how it is compiled does. Tests (no GPU)
//! parse and validate every variant with naga, check that the parameter struct each kernel reads
//! has the member names, offsets, types and size of its Rust twin in `types/params.rs`, and translate
//! each kind of kernel to SPIR-V with and without bounds checks.
//!
//! Modules are cached by `(source, variant, element types)`, pipelines by `(source, entry point,
//! variant, element types)`.
//!
//! Layouts: binding 0 is the op's parameters (a uniform with a dynamic offset into the context's
//! ring), bindings 1.. are the storage ranges, all `read_write`. There is one layout per number of
//! storage bindings, so bind groups are shared by every kernel with that many.

use std::collections::HashMap;

use super::types::{
    group0_entries, ComputeError, ElementTypes, KernelKey, ShaderChecks, Source, Variant,
    MAX_STORAGE_BINDINGS, PARAMS_BYTES,
};

mod matmul;

use matmul::{coop_entry, matmul_entry, narrow_entry};

const COMMON: &str = include_str!("../../shaders/common.wgsl");

/// `shaders/matmul_coop.wgsl`, whose bindings' file goes after its parameters (the line
/// [`COOP_PARAMS_END`]).
const COOP: &str = include_str!("../../shaders/matmul_coop.wgsl");

/// The last line of the parameters of `shaders/matmul_coop.wgsl`.
const COOP_PARAMS_END: &str = "@group(0) @binding(0) var<uniform> params: MatmulParams;\n";

/// The WGSL file of `source`.
fn source_text(source: Source) -> &'static str {
    match source {
        Source::Unary => include_str!("../../shaders/unary.wgsl"),
        Source::Binary => include_str!("../../shaders/binary.wgsl"),
        Source::Matmul => include_str!("../../shaders/matmul.wgsl"),
        Source::MatmulNarrow => include_str!("../../shaders/matmul_narrow.wgsl"),
        Source::MatmulReduce => include_str!("../../shaders/matmul_reduce.wgsl"),
        // Written by `module_source` around its bindings.
        Source::MatmulCoop => "",
        Source::Rows => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/rows.wgsl")
        ),
        Source::LayerNorm => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/layer_norm.wgsl")
        ),
        Source::AddLayerNorm => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/add_layer_norm.wgsl")
        ),
        Source::SoftmaxRows => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/softmax_rows.wgsl")
        ),
        Source::Embedding => include_str!("../../shaders/embedding.wgsl"),
        Source::EmbeddingSum => include_str!("../../shaders/embedding_sum.wgsl"),
        Source::ArgmaxRows => include_str!("../../shaders/argmax_rows.wgsl"),
        Source::KvWrite => include_str!("../../shaders/kv_write.wgsl"),
        Source::KvWriteQkv => include_str!("../../shaders/kv_write_qkv.wgsl"),
        Source::PagedAttentionVec4 => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/paged_attention_vec4.wgsl")
        ),
        Source::PagedAttention => concat!(
            include_str!("../../shaders/workgroup_reduce.wgsl"),
            include_str!("../../shaders/paged_attention.wgsl")
        ),
    }
}

/// The WGSL module of `source` in `variant`, loading and storing `types` (see the module docs
/// for its parts).
pub(crate) fn module_source(source: Source, variant: &Variant, types: ElementTypes) -> String {
    let mut text = String::new();
    if let Variant::Coop { .. } = variant {
        // A directive, so before any declaration.
        text.push_str("enable wgpu_cooperative_matrix;\n");
        if !types.uses_f16() {
            // f32 operands rounded to f16 as they are staged: the fragments are f16 still.
            text.push_str("enable f16;\n");
        }
    }
    text.push_str(&element_types(types));
    text.push_str(&constants(variant));
    text.push_str(COMMON);
    if let Variant::Coop { vec4, .. } = *variant {
        // The parameters first: the bindings' accessors read them.
        let (params, kernel) = COOP
            .split_once(COOP_PARAMS_END)
            .expect("matmul_coop.wgsl declares its parameters");
        text.push_str(params);
        text.push_str(COOP_PARAMS_END);
        text.push_str(if vec4 {
            include_str!("../../shaders/matmul_coop_vec4.wgsl")
        } else {
            include_str!("../../shaders/matmul_coop_scalar.wgsl")
        });
        text.push_str(kernel);
    }
    if let Variant::Matmul { vec4, .. } = *variant {
        text.push_str(if vec4 {
            include_str!("../../shaders/matmul_vec4.wgsl")
        } else {
            include_str!("../../shaders/matmul_scalar.wgsl")
        });
    }
    text.push_str(source_text(source));
    text.push_str(&optional_bindings(variant));
    if let Variant::Matmul {
        tiles, linear_grid, ..
    } = variant
    {
        text.push_str(&matmul_entry(tiles, *linear_grid));
    }
    if let Variant::Narrow {
        rows,
        lanes,
        subgroup,
        norm,
        ..
    } = *variant
    {
        text.push_str(&narrow_entry(rows, lanes, subgroup, norm));
    }
    if let Variant::Coop { tiles, probe, .. } = variant {
        text.push_str(&coop_entry(tiles, *probe));
    }
    text
}

/// The WGSL element types of a module: `enable f16;` (a directive, so first in the module) where
/// it loads or stores f16, then the aliases `Input` and `Output`.
fn element_types(types: ElementTypes) -> String {
    let mut text = String::new();
    if types.uses_f16() {
        text.push_str("enable f16;\n");
    }
    text.push_str(&format!(
        "alias Input = {};\nalias Output = {};\n",
        types.input, types.output
    ));
    text
}

/// The optional storage bindings of a matmul variant and their accessors (part 6 of a module,
/// see the module docs), at the indices [`Variant::residual_binding`] and
/// [`Variant::norm_bindings`] give: the residual (`Input` elements, as vec4s where the variant
/// binds its operands as vec4s) read through `residual_vec4(i)` (vec4 `i`) and `residual_at(e)`
/// (element `e`) as f32, accessors that give 0 where there is no residual; the layer norm's
/// `gamma` and `beta` (vec4s of `Input`). Nothing for the other kernels.
fn optional_bindings(variant: &Variant) -> String {
    let vec4 = match *variant {
        Variant::Matmul { vec4, .. } | Variant::Coop { vec4, .. } => vec4,
        Variant::Narrow { .. } => true,
        Variant::Reduce { .. } => false,
        Variant::Plain => return String::new(),
    };
    let mut text = String::from(
        "
// Generated: the epilogue's residual (src/compute/kernels.rs, `optional_bindings`).
",
    );
    match (variant.residual_binding(), vec4) {
        (None, _) => text.push_str(
            "fn residual_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

             fn residual_at(e: u32) -> f32 {
    return 0.0;
}
",
        ),
        (Some(index), true) => text.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> residual: array<vec4<Input>>;

             fn residual_vec4(i: u32) -> vec4<f32> {{
    return vec4<f32>(residual[i]);
}}

             fn residual_at(e: u32) -> f32 {{
    return f32(residual[e / 4u][e % 4u]);
}}
",
            index + 1
        )),
        (Some(index), false) => text.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> residual: array<Input>;

             fn residual_at(e: u32) -> f32 {{
    return f32(residual[e]);
}}

             fn residual_vec4(i: u32) -> vec4<f32> {{
    let e = 4u * i;
                 return vec4<f32>(f32(residual[e]), f32(residual[e + 1u]), f32(residual[e + 2u]), f32(residual[e + 3u]));
}}
",
            index + 1
        )),
    }
    if let Some((gamma, beta)) = variant.norm_bindings() {
        text.push_str(&format!(
            "
// Generated: the layer-norm prologue's gamma and beta.
             @group(0) @binding({}) var<storage, read_write> gamma: array<vec4<Input>>;
             @group(0) @binding({}) var<storage, read_write> beta: array<vec4<Input>>;
",
            gamma + 1,
            beta + 1
        ));
    }
    text
}

/// The WGSL `const` declarations of `variant` ([`Variant::constants`]).
fn constants(variant: &Variant) -> String {
    variant
        .constants()
        .into_iter()
        .map(|(name, value)| value.declare(name))
        .collect()
}

/// The layouts for kernels with `n` storage bindings.
pub(crate) struct Layouts {
    pub(crate) bind_group: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
}

/// Modules, layouts and pipelines, created on first use and kept.
pub(crate) struct Kernels {
    device: wgpu::Device,
    checks: ShaderChecks,
    modules: HashMap<(Source, Variant, ElementTypes), wgpu::ShaderModule>,
    pipelines: HashMap<KernelKey, wgpu::ComputePipeline>,
    layouts: Vec<Layouts>,
    /// Pipelines created so far.
    pub(crate) pipelines_created: u64,
}

impl Kernels {
    pub(crate) fn new(device: &wgpu::Device, checks: ShaderChecks) -> Self {
        // Only the layouts the device takes (kernels of more storage bindings are refused when
        // first asked for, not at the context's creation).
        let max_storage =
            MAX_STORAGE_BINDINGS.min(device.limits().max_storage_buffers_per_shader_stage as usize);
        let layouts = (0..=max_storage)
            .map(|storage| layouts(device, storage))
            .collect();
        Self {
            device: device.clone(),
            checks,
            modules: HashMap::new(),
            pipelines: HashMap::new(),
            layouts,
            pipelines_created: 0,
        }
    }

    /// The layouts of kernels with `storage` storage bindings (a kernel of that many has been
    /// compiled: [`Kernels::pipeline`] refuses those the device does not take).
    pub(crate) fn layouts(&self, storage: usize) -> &Layouts {
        &self.layouts[storage]
    }

    /// The pipeline of `key`, compiled on first use. A kernel the device refuses is an error,
    /// not a panic.
    pub(crate) fn pipeline(
        &mut self,
        key: &KernelKey,
    ) -> Result<&wgpu::ComputePipeline, ComputeError> {
        if !self.pipelines.contains_key(key) {
            let pipeline = self.create_pipeline(key)?;
            self.pipelines.insert(*key, pipeline);
            self.pipelines_created += 1;
        }
        Ok(&self.pipelines[key])
    }

    fn create_pipeline(&mut self, key: &KernelKey) -> Result<wgpu::ComputePipeline, ComputeError> {
        let storage = key.storage_bindings();
        if storage >= self.layouts.len() {
            return Err(ComputeError::ExceedsLimit {
                op: key.entry,
                what: "storage bindings",
                value: storage as u64,
                limit_name: "max_storage_buffers_per_shader_stage",
                limit: self.layouts.len().saturating_sub(1) as u64,
            });
        }
        let device = self.device.clone();
        let label = key.label();
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module_key = (key.source, key.variant, key.types);
        let module = match self.modules.get(&module_key) {
            Some(module) => module.clone(),
            None => {
                let source = module_source(key.source, &key.variant, key.types);
                let descriptor = wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                };
                let module = match self.checks {
                    ShaderChecks::Checked => device.create_shader_module(descriptor),
                    // SAFETY: the kernels of `shaders/` stay inside their bindings and terminate:
                    // every op validates shapes, sizes and grids on the host before recording,
                    // binds ranges of at least the sizes the kernel indexes (tensors are rounded
                    // up to 16 bytes), and every kernel masks its edges and bounds its loops by
                    // its parameters (see `compute` module docs, "Unchecked kernels").
                    ShaderChecks::Unchecked => unsafe {
                        device.create_shader_module_trusted(
                            descriptor,
                            wgpu::ShaderRuntimeChecks::unchecked(),
                        )
                    },
                };
                self.modules.insert(module_key, module.clone());
                module
            }
        };
        let layouts = &self.layouts[storage];
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&layouts.pipeline),
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every kernel writes workgroup memory before it reads it, so WebGPU's zeroing
                // is not needed. It is also costly: on GL, naga zeroes a workgroup array with one
                // array constructor of all its elements, which llvmpipe takes seconds to compile
                // (4–14 s per matmul variant, measured), holding wgpu's GL context lock meanwhile.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        match crate::device::caught(validation) {
            None => Ok(pipeline),
            Some(error) => {
                // A module that failed to compile would fail again: forget it.
                self.modules.remove(&module_key);
                Err(ComputeError::Kernel {
                    kernel: label,
                    message: error.to_string(),
                })
            }
        }
    }
}

fn layouts(device: &wgpu::Device, storage: usize) -> Layouts {
    let entries = group0_entries(PARAMS_BYTES, storage);
    let label = format!("wgpu-pool compute: {storage} storage bindings");
    let bind_group = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&label),
        entries: &entries,
    });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&label),
        bind_group_layouts: &[Some(&bind_group)],
        immediate_size: 0,
    });
    Layouts {
        bind_group,
        pipeline,
    }
}

pub(super) mod catalog;
#[cfg(test)]
mod tests;
