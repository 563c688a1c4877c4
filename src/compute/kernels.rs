//! Kernel sources, the WGSL the host writes for each variant, and the layouts and pipelines
//! built from them.
//!
//! # What is generated
//!
//! Every file of `shaders/` is plain WGSL, used as it is. A kernel's module is, in this order:
//!
//! 1. **generated**: the element types ([`element_types`]): `enable f16;` where the variant
//!    loads or stores f16, and the aliases `Input` (what A, B, the bias and the element-wise
//!    inputs hold) and `Output` (what the kernel stores), each `f32` or `f16`; kernels convert
//!    every element they load to f32 and round once when they store, so the f32 variant's
//!    conversions are no-ops;
//! 2. **generated**: the variant's constants, WGSL `const` declarations ([`constants`]): the
//!    tile sizes, which edges to mask and the fused epilogue of the tiled matmul, the rows,
//!    lanes, subgroup size, split and epilogue of the narrow one, the epilogue of the split-K
//!    reduction (none for the other kernels), so that each variant is compiled with its branches
//!    resolved;
//! 3. `shaders/common.wgsl` (activations, grid indexing, the element-wise parameters);
//! 4. for the tiled matmul, its storage bindings, declared as vec4s (`shaders/matmul_vec4.wgsl`)
//!    or as elements (`shaders/matmul_scalar.wgsl`, when K or N is not a multiple of 4);
//! 5. the kernel's file, `shaders/<source>.wgsl`;
//! 6. **generated**, for the tiled matmul: its entry point `matmul` ([`matmul_entry`]),
//!    whose `BK` steps of K and whose `TM × TN` outputs per invocation are unrolled here into
//!    straight-line code (the driver's compiler then sees it whatever its unrolling heuristics);
//!    for the narrow matmul: its entry point `matmul_narrow` ([`narrow_entry`]), its rows (one
//!    accumulator each), four steps of K and its subgroup shuffles unrolled.
//!
//! The WGSL does not depend on [`ShaderChecks`]: only how it is compiled does. Tests (no GPU)
//! parse and validate every variant with naga, check that the parameter struct each kernel reads
//! has the member names, offsets, types and size of its Rust twin in `vocab.rs`, and translate
//! each kind of kernel to SPIR-V with and without bounds checks.
//!
//! Modules are cached by `(source, variant, element types)`, pipelines by `(source, entry point,
//! variant, element types)`.
//!
//! Layouts: binding 0 is the op's parameters (a uniform with a dynamic offset into the context's
//! ring), bindings 1.. are the storage ranges, all `read_write`. There is one layout per number of
//! storage bindings, so bind groups are shared by every kernel with that many.

use std::collections::HashMap;
use std::num::NonZeroU64;

use super::vocab::{
    ComputeError, ElementTypes, KernelKey, MatmulOptions, MatmulTiles, ShaderChecks, Source,
    Variant, MAX_STORAGE_BINDINGS, PARAMS_BYTES,
};

const COMMON: &str = include_str!("../../shaders/common.wgsl");

/// The WGSL file of `source`.
fn source_text(source: Source) -> &'static str {
    match source {
        Source::Unary => include_str!("../../shaders/unary.wgsl"),
        Source::Binary => include_str!("../../shaders/binary.wgsl"),
        Source::Matmul => include_str!("../../shaders/matmul.wgsl"),
        Source::MatmulNarrow => include_str!("../../shaders/matmul_narrow.wgsl"),
        Source::MatmulReduce => include_str!("../../shaders/matmul_reduce.wgsl"),
        Source::Rows => include_str!("../../shaders/rows.wgsl"),
    }
}

/// The WGSL module of `source` in `variant`, loading and storing `types` (see the module docs
/// for its parts).
pub(crate) fn module_source(source: Source, variant: &Variant, types: ElementTypes) -> String {
    let mut text = element_types(types);
    text.push_str(&constants(variant));
    text.push_str(COMMON);
    if let Variant::Matmul { vec4, .. } = *variant {
        text.push_str(if vec4 {
            include_str!("../../shaders/matmul_vec4.wgsl")
        } else {
            include_str!("../../shaders/matmul_scalar.wgsl")
        });
    }
    text.push_str(source_text(source));
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
        ..
    } = *variant
    {
        text.push_str(&narrow_entry(rows, lanes, subgroup));
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

/// The WGSL `const` declarations of `variant`.
fn constants(variant: &Variant) -> String {
    let int = |name: &str, value: u32| format!("const {name}: u32 = {value}u;\n");
    let bool = |name: &str, value: bool| format!("const {name}: bool = {value};\n");
    match *variant {
        Variant::Plain => String::new(),
        Variant::Matmul {
            tiles,
            group_rows,
            vec4,
            edges,
            bias,
            activation,
            linear_grid: _,
        } => [
            int("GROUP_M", group_rows),
            int("BM", tiles.bm),
            int("BN", tiles.bn),
            int("BK", tiles.bk),
            int("TM", tiles.tm),
            int("TN", tiles.tn),
            int("THREADS", tiles.threads()),
            int("A_LOADS", tiles.a_loads()),
            int("B_LOADS", tiles.b_loads()),
            int("ACT", activation.code()),
            bool("VEC4", vec4),
            bool("EDGES", edges),
            bool("BIAS", bias),
        ]
        .concat(),
        Variant::Narrow {
            rows,
            lanes,
            subgroup,
            split,
            bias,
            activation,
        } => [
            int("ROWS", rows),
            int("LANES", lanes),
            int("SUBGROUP", subgroup),
            int("GROUPED", narrow_grouped(lanes, subgroup)),
            int("SUM_ROWS", narrow_sum_rows(rows, lanes, subgroup)),
            int("ACT", activation.code()),
            bool("SPLIT", split),
            bool("BIAS", bias),
        ]
        .concat(),
        Variant::Reduce { bias, activation } => {
            [int("ACT", activation.code()), bool("BIAS", bias)].concat()
        }
    }
}

/// The test that opens the tiled matmul's entry point when its grid is laid out as rows of
/// linear workgroup ids.
const MATMUL_ENTRY_PAST_LAST: &str =
    "    // A workgroup past the last tile (a grid of rows of linear ids): uniform, before any
    // barrier.
    if (block_id(workgroup) >= params.tiles_n * params.tiles_m) {
        return;
    }
";

/// The tiled matmul's entry point up to its steps of K (see `shaders/matmul.wgsl` for the
/// layout and the helpers it calls).
const MATMUL_ENTRY_BEGIN: &str = "
// The entry point, written by the host (src/compute/kernels.rs, `matmul_entry`) with the BK
// steps of K and the TM×TN outputs of an invocation unrolled.
@compute @workgroup_size(THREADS)
fn matmul(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let tile = block_tile(workgroup);
    let row0 = tile.x * BM;
    let col0 = tile.y * BN;
    let k_begin = workgroup.z * params.k_chunk;
    let k_end = min(params.k, k_begin + params.k_chunk);
    // The host never makes an empty split: k_end > k_begin.
    let tiles = (k_end - k_begin + BK - 1u) / BK;
    let tx = tid % (BN / TN);
    let ty = tid / (BN / TN);

    // acc[(4·I + E)·(TN/4) + J]: row 4·I + E of the invocation's TM (I < TM/4, E < 4), column
    // group J (J < TN/4). Indexed only by constants, so it lives in registers.
    var acc: array<vec4<f32>, TM * TN / 4u>;

    var staged = fetch(tid, row0, col0, k_begin, k_end);
    stage(0u, staged, tid);
    workgroupBarrier();

    for (var t = 0u; t < tiles; t++) {
        let current = t & 1u;
        // Prefetch the next tile into registers while this one is multiplied. Unconditional, so
        // that the loads sit in the same block as the products (the compiler may interleave
        // them): after the last tile the last tile is fetched and staged again, into the buffer
        // no one reads any more.
        staged = fetch(tid, row0, col0, k_begin + min(t + 1u, tiles - 1u) * BK, k_end);
        // BK steps of K, one block each. Each step is the TM×TN outer product of TM rows of A
        // (TM / 4 vec4s of the transposed tile) and TN columns of B (TN / 4 vec4s): TM · TN / 4
        // vec4 fused multiply-adds.
        let a = current * A_TILE + ty;
        let b = current * B_TILE + tx;
";

/// The tiled matmul's entry point after its steps of K, up to its stores.
const MATMUL_ENTRY_STORES: &str = "        stage(1u - current, staged, tid);
        workgroupBarrier();
    }

    let row = row0 + ty * 4u;
    let col = col0 + tx * 4u;
    let z = workgroup.z;
";

/// The WGSL entry point `matmul` of the tiled matmul for `tiles`: [`MATMUL_ENTRY_BEGIN`], then
/// for each step `s < BK` a block that reads `a{I}` (`I < TM / 4`: four rows of the
/// invocation's outputs, one vec4 of the transposed A tile) and `b{J}` (`J < TN / 4`: four
/// columns) at depth `s` and updates every accumulator `acc[(4·I + E)·(TN / 4) + J]`
/// (`E < 4`), then [`MATMUL_ENTRY_STORES`] and one `store_c` per accumulator, in the same order.
///
/// With `linear_grid` (the grid laid out as rows of linear workgroup ids), the entry point first
/// returns for the workgroups past the last tile ([`MATMUL_ENTRY_PAST_LAST`]); a grid that the
/// device takes as it is has no such workgroups, and its entry point no such test.
fn matmul_entry(tiles: &MatmulTiles, linear_grid: bool) -> String {
    let (groups_i, groups_j) = (tiles.tm / 4, tiles.tn / 4);
    // (I, E, J, accumulator) of every accumulator, in its order.
    let outputs = || {
        (0..groups_i).flat_map(move |i| {
            (0..4).flat_map(move |e| {
                (0..groups_j).map(move |j| (i, e, j, (4 * i + e) * groups_j + j))
            })
        })
    };
    let mut text = String::from(MATMUL_ENTRY_BEGIN);
    if linear_grid {
        let head = text
            .find("    let tile = ")
            .expect("the entry point's first line");
        text.insert_str(head, MATMUL_ENTRY_PAST_LAST);
    }
    for step in 0..tiles.bk {
        text.push_str("        {\n");
        for i in 0..groups_i {
            text.push_str(&format!(
                "            let a{i} = tile_a[a + {step}u * (BM / 4u) + {i}u * (BM / TM)];\n"
            ));
        }
        for j in 0..groups_j {
            text.push_str(&format!(
                "            let b{j} = tile_b[b + {step}u * (BN / 4u) + {j}u * (BN / TN)];\n"
            ));
        }
        for (i, e, j, acc) in outputs() {
            text.push_str(&format!(
                "            acc[{acc}u] = fma(vec4<f32>(a{i}[{e}u]), b{j}, acc[{acc}u]);\n"
            ));
        }
        text.push_str("        }\n");
    }
    text.push_str(MATMUL_ENTRY_STORES);
    for (i, e, j, acc) in outputs() {
        text.push_str(&format!(
            "    store_c(row + {i}u * ROW_GROUP + {e}u, col + {j}u * COL_GROUP, z, acc[{acc}u]);\n"
        ));
    }
    text.push_str("}\n");
    text
}

/// vec4s of workgroup memory the narrow matmul adds its slices in: 16 KiB, WebGPU's default
/// limit.
const NARROW_SUM_VEC4S: u32 = 1024;

/// Steps of K that the narrow matmul's main loop takes at once (each loads four vec4s of B).
const NARROW_STEPS: u32 = 4;

/// Slices of each lane that one subgroup of the narrow matmul holds and adds by shuffles (1:
/// none, without subgroups or with a subgroup no wider than the lanes).
fn narrow_grouped(lanes: u32, subgroup: u32) -> u32 {
    if subgroup > lanes {
        subgroup / lanes.max(1)
    } else {
        1
    }
}

/// Rows of the narrow matmul whose slices are added at once in workgroup memory: as many as
/// [`NARROW_SUM_VEC4S`] hold, each taking `256 / grouped` vec4s.
fn narrow_sum_rows(rows: u32, lanes: u32, subgroup: u32) -> u32 {
    let row_vec4s = MatmulOptions::NARROW_THREADS / narrow_grouped(lanes, subgroup);
    rows.min(NARROW_SUM_VEC4S / row_vec4s).max(1)
}

/// The start of the narrow matmul's entry point, after its signature, up to its accumulators.
const NARROW_ENTRY_BEGIN: &str = "    let lane = local % LANES;
    let slice = local / LANES;
    let n4 = params.n4;
    let k4 = params.k4;
    // The grid is [tiles, 1, splits] where the device takes it, else rows of grid_x workgroups;
    // lanes past N (in workgroups past the last) do no loads or stores.
    let tile = workgroup.y * params.grid_x + workgroup.x;
    let col = tile * LANES + lane;
    // This split's chunk of K, in vec4 rows; the host makes no empty chunk.
    let k_end = min(k4, (workgroup.z + 1u) * params.k_chunk4);
";

/// The WGSL entry point `matmul_narrow` of the narrow matmul for `rows` rows, `lanes` lanes and
/// subgroups of `subgroup` invocations (0: none; see `shaders/matmul_narrow.wgsl`): `rows`
/// accumulators `acc{r}`; a main loop that takes [`NARROW_STEPS`] vec4 rows of K at once (all
/// their loads of B first, then for each row of A its vec4s and four fused multiply-adds per
/// step), then the fewer steps left in one block of the same form (one block per number of
/// steps, chosen by `if`); with subgroups wider than the lanes, butterfly
/// shuffles over the slices each subgroup holds; then for each group of rows that fits workgroup
/// memory, the accumulators kept there and `reduce_and_store`.
fn narrow_entry(rows: u32, lanes: u32, subgroup: u32) -> String {
    const { assert!(NARROW_STEPS >= 2) };
    let grouped = narrow_grouped(lanes, subgroup);
    let mut text = String::from(
        "
// The entry point, written by the host (src/compute/kernels.rs, `narrow_entry`) with the rows, the
// steps of K and the shuffles unrolled.
@compute @workgroup_size(256)
",
    );
    if subgroup > 0 {
        text.push_str(
            "fn matmul_narrow(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(subgroup_id) subgroup_id: u32, @builtin(subgroup_invocation_id) subgroup_lane: u32) {
    // Invocation ids by subgroups, so that a shuffle's partner is known: subgroups are full (the
    // device's subgroup size is fixed and divides 256). Clamped all the same, so that no index
    // leaves its array whatever the driver does.
    let local = min(subgroup_id * SUBGROUP + subgroup_lane, 255u);
",
        );
    } else {
        text.push_str(
            "fn matmul_narrow(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {\n",
        );
    }
    text.push_str(NARROW_ENTRY_BEGIN);
    for r in 0..rows {
        text.push_str(&format!("    var acc{r} = vec4<f32>(0.0);\n"));
    }
    // One step of K at `kk + offset` (vec4 rows), its loads of B named b{step}_{0..3}.
    let loads = |step: u32, offset: &str| {
        let mut code = format!("            let row{step} = (kk{offset}) * 4u * n4 + col;\n");
        for e in 0..4 {
            code.push_str(&format!(
                "            let b{step}_{e} = vec4<f32>(b[row{step} + {e}u * n4]);\n"
            ));
        }
        code
    };
    let products = |step: u32, offset: &str| {
        let mut code = String::new();
        for r in 0..rows {
            code.push_str(&format!(
                "            let a{step}_{r} = vec4<f32>(a[{r}u * k4 + kk{offset}]);\n"
            ));
            for (e, component) in ["x", "y", "z", "w"].iter().enumerate() {
                code.push_str(&format!(
                    "            acc{r} = fma(vec4<f32>(a{step}_{r}.{component}), b{step}_{e}, acc{r});\n"
                ));
            }
        }
        code
    };
    let offset = |step: u32| {
        if step == 0 {
            String::new()
        } else {
            format!(" + {step}u * SLICES")
        }
    };
    text.push_str("    if (col < n4) {\n");
    text.push_str("        var kk = workgroup.z * params.k_chunk4 + slice;\n");
    text.push_str(&format!(
        "        // {NARROW_STEPS} steps at a time: their loads of B first, all independent.\n"
    ));
    text.push_str(&format!(
        "        while (kk + {}u * SLICES < k_end) {{\n",
        NARROW_STEPS - 1
    ));
    for step in 0..NARROW_STEPS {
        text.push_str(&loads(step, &offset(step)));
    }
    for step in 0..NARROW_STEPS {
        text.push_str(&products(step, &offset(step)));
    }
    text.push_str(&format!("            kk += {NARROW_STEPS}u * SLICES;\n"));
    text.push_str("        }\n");
    // The fewer than NARROW_STEPS steps left, in one block of independent loads too.
    text.push_str(
        "        // The steps left (fewer than the main loop's), their loads of B first as well.\n",
    );
    for left in (1..NARROW_STEPS).rev() {
        let test = if left == 1 {
            "kk < k_end".to_string()
        } else {
            format!("kk + {}u * SLICES < k_end", left - 1)
        };
        let keyword = if left == NARROW_STEPS - 1 {
            "        if"
        } else {
            " else if"
        };
        text.push_str(&format!("{keyword} ({test}) {{\n"));
        for step in 0..left {
            text.push_str(&loads(step, &offset(step)));
        }
        for step in 0..left {
            text.push_str(&products(step, &offset(step)));
        }
        text.push_str("        }");
    }
    text.push_str("\n    }\n");
    if grouped > 1 {
        text.push_str(&format!(
            "    // The {grouped} slices of each lane in a subgroup added by butterfly shuffles (uniform\n    // control flow: every invocation takes part).\n"
        ));
        let mut mask = lanes;
        while mask < subgroup {
            for r in 0..rows {
                text.push_str(&format!(
                    "    acc{r} += subgroupShuffleXor(acc{r}, {mask}u);\n"
                ));
            }
            mask *= 2;
        }
        text.push_str(
            "    // The first slice of each subgroup keeps its sums, at its subgroup's slice.
    let keeps = subgroup_lane < LANES;
    let stored = min(subgroup_id, STORED - 1u) * LANES + subgroup_lane;
",
        );
    }
    let sum_rows = narrow_sum_rows(rows, lanes, subgroup);
    for first in (0..rows).step_by(sum_rows as usize) {
        let count = (rows - first).min(sum_rows);
        text.push_str(&format!("    // Rows {first} to {}.\n", first + count - 1));
        if grouped > 1 {
            text.push_str("    if (keeps) {\n");
            for r in 0..count {
                text.push_str(&format!(
                    "        sums[{r}u * ROW_STRIDE + stored] = acc{};\n",
                    first + r
                ));
            }
            text.push_str("    }\n");
        } else {
            for r in 0..count {
                text.push_str(&format!(
                    "    sums[{r}u * ROW_STRIDE + local] = acc{};\n",
                    first + r
                ));
            }
        }
        text.push_str("    workgroupBarrier();\n");
        text.push_str(&format!(
            "    reduce_and_store({first}u, {count}u, local, tile, workgroup.z);\n"
        ));
    }
    text.push_str("}\n");
    text
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
        let layouts = (0..=MAX_STORAGE_BINDINGS)
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

    /// The layouts of kernels with `storage` storage bindings.
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
        let layouts = &self.layouts[key.source.storage_bindings()];
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
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: NonZeroU64::new(PARAMS_BYTES),
        },
        count: None,
    }];
    for binding in 1..=storage as u32 {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                // read_write always: see the module docs of `compute`.
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
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

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;
    use crate::compute::vocab::{
        Activation, DType, ElementwiseParams, MatmulParams, NarrowParams, ReduceParams, RowsParams,
    };

    /// The subgroup sizes of the narrow matmul's variants (0: none).
    const NARROW_SUBGROUPS: [u32; 7] = [0, 4, 8, 16, 32, 64, 128];

    /// Every tile the kernel takes ([`MatmulTiles::check`] on a device without limits): 8×8,
    /// 16×8, 8×16, 4×8, 8×4, 4×16 or 16×4 outputs per invocation, 8 or 16 deep, 1, 2 or 4 loads of each tile.
    fn every_tile() -> Vec<MatmulTiles> {
        let unlimited = wgpu::Limits {
            max_compute_invocations_per_workgroup: u32::MAX,
            max_compute_workgroup_size_x: u32::MAX,
            max_compute_workgroup_storage_size: u32::MAX,
            ..wgpu::Limits::default()
        };
        let mut tiles = Vec::new();
        for (tm, tn) in [(8, 8), (16, 8), (8, 16), (4, 8), (8, 4), (4, 16), (16, 4)] {
            for bk in [8, 16] {
                for bm in (8..=1024).step_by(8) {
                    for bn in (8..=1024).step_by(8) {
                        let tile = MatmulTiles::new(bm, bn, bk).per_invocation(tm, tn);
                        if tile.check(&unlimited).is_ok() {
                            tiles.push(tile);
                        }
                    }
                }
            }
        }
        tiles
    }

    /// Every module the crate compiles: each kernel in every variant an op can ask for, with
    /// every tile of [`MatmulTiles::ALL`] and of the defaults; the other tiles the kernel takes
    /// (which only a forced [`MatmulOptions::tiles`] runs) with one epilogue, and the order of
    /// block tiles (`group_rows`, the value of one constant) with one tile.
    ///
    /// Each in f32, and those of [`f16_types`] in f16.
    fn every_module() -> Vec<(Source, Variant, ElementTypes)> {
        let mut modules = vec![
            (Source::Unary, Variant::Plain),
            (Source::Binary, Variant::Plain),
            (Source::Rows, Variant::Plain),
        ];
        let epilogues = || {
            [false, true]
                .into_iter()
                .flat_map(|bias| Activation::ALL.map(|activation| (bias, activation)))
        };
        let defaults = MatmulOptions::default();
        let mut main_tiles = MatmulTiles::ALL.to_vec();
        main_tiles.extend(defaults.large_tiles.iter().chain([&defaults.small_tiles]));
        for tiles in every_tile() {
            let group_rows: &[u32] = if tiles == MatmulTiles::ALL[0] {
                &[1, defaults.group_rows]
            } else {
                &[defaults.group_rows]
            };
            let epilogues: Vec<_> = if main_tiles.contains(&tiles) {
                epilogues().collect()
            } else {
                vec![(true, Activation::Gelu)]
            };
            for &group_rows in group_rows {
                for vec4 in [false, true] {
                    for edges in [false, true] {
                        for &(bias, activation) in &epilogues {
                            // The linear grid's test at the entry point, with one epilogue.
                            let grids: &[bool] = if bias && activation == Activation::Gelu {
                                &[false, true]
                            } else {
                                &[false]
                            };
                            for &linear_grid in grids {
                                let variant = Variant::Matmul {
                                    tiles,
                                    group_rows,
                                    vec4,
                                    edges,
                                    bias,
                                    activation,
                                    linear_grid,
                                };
                                modules.push((Source::Matmul, variant));
                            }
                        }
                    }
                }
            }
        }
        for rows in 1..=MatmulOptions::NARROW_MAX_ROWS {
            for lanes in (0..=MatmulOptions::NARROW_MAX_LANES.ilog2()).map(|power| 1 << power) {
                for (bias, activation) in epilogues() {
                    let variant = Variant::Narrow {
                        rows,
                        lanes,
                        subgroup: 0,
                        split: false,
                        bias,
                        activation,
                    };
                    modules.push((Source::MatmulNarrow, variant));
                }
                // Split along K: partial products, no epilogue (the reduction runs it); and
                // subgroups of every size wider than the lanes (the host asks for no other), with
                // one epilogue and split.
                for subgroup in NARROW_SUBGROUPS {
                    if subgroup != 0 && subgroup <= lanes {
                        continue;
                    }
                    for split in [false, true] {
                        if subgroup == 0 && !split {
                            continue;
                        }
                        let variant = Variant::Narrow {
                            rows,
                            lanes,
                            subgroup,
                            split,
                            bias: !split,
                            activation: if split {
                                Activation::None
                            } else {
                                Activation::Gelu
                            },
                        };
                        modules.push((Source::MatmulNarrow, variant));
                    }
                }
            }
        }
        for (bias, activation) in epilogues() {
            modules.push((Source::MatmulReduce, Variant::Reduce { bias, activation }));
        }
        let f16_modules: Vec<_> = modules
            .iter()
            .flat_map(|&(source, variant)| {
                f16_types(source, &variant)
                    .into_iter()
                    .map(move |types| (source, variant, types))
            })
            .collect();
        modules
            .into_iter()
            .map(|(source, variant)| (source, variant, ElementTypes::F32))
            .chain(f16_modules)
            .collect()
    }

    /// The f16 element types an op asks for with `variant` of `source`: f16 in and out; f16 in
    /// and f32 out for the matmul kernels that write partial products (and the cast to f32),
    /// f32 in and f16 out for the cast to f16. The tiled matmul's with the tiles of
    /// [`MatmulTiles::ALL`] and the default order of block tiles only (the types do not touch
    /// the tile code).
    fn f16_types(source: Source, variant: &Variant) -> Vec<ElementTypes> {
        let f16 = ElementTypes::same(DType::F16);
        let partials = ElementTypes {
            input: DType::F16,
            output: DType::F32,
        };
        match *variant {
            Variant::Plain if source == Source::Unary => vec![
                f16,
                partials,
                ElementTypes {
                    input: DType::F32,
                    output: DType::F16,
                },
            ],
            Variant::Plain | Variant::Reduce { .. } => vec![f16],
            Variant::Matmul {
                tiles,
                group_rows,
                bias,
                activation,
                ..
            } if MatmulTiles::ALL.contains(&tiles)
                && group_rows == MatmulOptions::default().group_rows =>
            {
                if !bias && activation == Activation::None {
                    vec![f16, partials]
                } else {
                    vec![f16]
                }
            }
            Variant::Matmul { .. } => vec![],
            Variant::Narrow { split, .. } => vec![if split { partials } else { f16 }],
        }
    }

    /// A parameter struct as the test compares it: its name, `(member, offset, type)` in order,
    /// and its size.
    struct Layout {
        name: &'static str,
        members: Vec<(&'static str, usize, &'static str)>,
        size: usize,
    }

    /// The layout of a `#[repr(C)]` struct of `vocab.rs`, from the compiler.
    macro_rules! layout {
        ($name:ident { $($member:ident: $ty:ident),* $(,)? }) => {{
            // The members listed here are the struct's: a struct literal names every one.
            let _complete = |value: $name| $name { $($member: value.$member),* };
            Layout {
                name: stringify!($name),
                members: vec![$((stringify!($member), offset_of!($name, $member), stringify!($ty))),*],
                size: size_of::<$name>(),
            }
        }};
    }

    /// The Rust twin of the parameter struct that `source` reads at binding 0.
    fn params_layout(source: Source) -> Layout {
        match source {
            Source::Unary | Source::Binary => layout!(ElementwiseParams {
                len_vec4: u32,
                grid_x: u32,
                cols: u32,
                scalar: f32,
            }),
            Source::Matmul => layout!(MatmulParams {
                m: u32,
                n: u32,
                k: u32,
                k_chunk: u32,
                tiles_n: u32,
                tiles_m: u32,
                grid_x: u32,
                pad: u32,
            }),
            Source::MatmulNarrow => layout!(NarrowParams {
                n4: u32,
                k4: u32,
                grid_x: u32,
                k_chunk4: u32,
            }),
            Source::MatmulReduce => layout!(ReduceParams {
                len: u32,
                n: u32,
                splits: u32,
                grid_x: u32,
            }),
            Source::Rows => layout!(RowsParams {
                rows: u32,
                cols: u32,
                grid_x: u32,
                pad: u32,
            }),
        }
    }

    /// Parses and validates `text` with naga; the error as naga prints it, with the source.
    fn validate(text: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
        let module =
            naga::front::wgsl::parse_str(text).map_err(|error| error.emit_to_string(text))?;
        // Subgroup operations and f16 are capabilities (the device's SUBGROUP and SHADER_F16
        // features).
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default()
                | naga::valid::Capabilities::SUBGROUP
                | naga::valid::Capabilities::SHADER_FLOAT16,
        )
        .validate(&module)
        .map_err(|error| error.emit_to_string(text))?;
        Ok((module, info))
    }

    /// Checks that the module reads its parameters at binding 0 as a uniform of the struct of
    /// `expected`'s name and layout, and has `storage` read-write storage bindings 1 to `storage`.
    fn check_bindings(
        module: &naga::Module,
        expected: &Layout,
        storage: usize,
    ) -> Result<(), String> {
        let mut uniform = None;
        let mut storage_bindings = Vec::new();
        for (_, global) in module.global_variables.iter() {
            let Some(binding) = &global.binding else {
                continue;
            };
            if binding.group != 0 {
                return Err(format!("binding in group {}", binding.group));
            }
            match global.space {
                naga::AddressSpace::Uniform if binding.binding == 0 => uniform = Some(global.ty),
                naga::AddressSpace::Storage { access }
                    if access.contains(naga::StorageAccess::LOAD | naga::StorageAccess::STORE) =>
                {
                    storage_bindings.push(binding.binding)
                }
                space => return Err(format!("binding {} in {space:?}", binding.binding)),
            }
        }
        storage_bindings.sort_unstable();
        if storage_bindings != (1..=storage as u32).collect::<Vec<_>>() {
            return Err(format!(
                "read_write storage bindings {storage_bindings:?}, expected 1 to {storage}"
            ));
        }
        let ty = &module.types[uniform.ok_or("no uniform at binding 0")?];
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            return Err(format!("the uniform at binding 0 is a {:?}", ty.inner));
        };
        let name = ty.name.as_deref().unwrap_or_default();
        let wgsl: Vec<_> = members
            .iter()
            .map(|member| {
                let ty = match module.types[member.ty].inner {
                    naga::TypeInner::Scalar(naga::Scalar::U32) => "u32",
                    naga::TypeInner::Scalar(naga::Scalar::I32) => "i32",
                    naga::TypeInner::Scalar(naga::Scalar::F32) => "f32",
                    _ => "another type",
                };
                let name = member.name.as_deref().unwrap_or_default();
                (name, member.offset as usize, ty)
            })
            .collect();
        if name != expected.name || wgsl != expected.members || *span as usize != expected.size {
            return Err(format!(
                "the parameters at binding 0 are `{name}` {wgsl:?} of {span} bytes in WGSL, but \
                 `{}` {:?} of {} bytes in Rust (src/compute/vocab.rs)",
                expected.name, expected.members, expected.size
            ));
        }
        if expected.size > PARAMS_BYTES as usize {
            return Err(format!("{name} is larger than the uniform binding"));
        }
        Ok(())
    }

    #[test]
    fn every_variant_is_valid_wgsl_with_the_parameters_of_its_rust_struct() {
        let modules = every_module();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let failures: Vec<String> = std::thread::scope(|scope| {
            let workers: Vec<_> = modules
                .chunks(modules.len().div_ceil(threads))
                .map(|chunk| {
                    scope.spawn(move || {
                        let mut failures = Vec::new();
                        for (source, variant, types) in chunk {
                            let text = module_source(*source, variant, *types);
                            let checked = validate(&text).and_then(|(module, _)| {
                                let layout = params_layout(*source);
                                check_bindings(&module, &layout, source.storage_bindings())
                            });
                            if let Err(error) = checked {
                                failures.push(format!(
                                    "{source:?}{}{}: {error}",
                                    variant.label(),
                                    types.label()
                                ));
                            }
                        }
                        failures
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|worker| worker.join().expect("a validating thread panicked"))
                .collect()
        });
        assert!(
            failures.is_empty(),
            "{} of {} modules failed; the first:\n{}",
            failures.len(),
            modules.len(),
            failures[..failures.len().min(8)].join("\n")
        );
        // Every tile of `MatmulTiles::ALL` and of the defaults is among those checked.
        let tiles = every_tile();
        let defaults = MatmulOptions::default();
        for tile in MatmulTiles::ALL
            .iter()
            .chain(&defaults.large_tiles)
            .chain([&defaults.small_tiles])
        {
            assert!(tiles.contains(tile), "{tile} is not checked");
        }
    }

    /// What wgpu's Vulkan backend asks of naga in each mode (wgpu-hal 30 on a device without
    /// robust buffer access; the pipelines do not zero workgroup memory).
    fn spirv_options(checks: ShaderChecks) -> naga::back::spv::Options<'static> {
        use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
        let policy = match checks {
            ShaderChecks::Checked => BoundsCheckPolicy::Restrict,
            ShaderChecks::Unchecked => BoundsCheckPolicy::Unchecked,
        };
        naga::back::spv::Options {
            lang_version: (1, 3),
            bounds_check_policies: BoundsCheckPolicies {
                index: policy,
                buffer: policy,
                image_load: policy,
                binding_array: BoundsCheckPolicy::Unchecked,
            },
            force_loop_bounding: checks == ShaderChecks::Checked,
            zero_initialize_workgroup_memory:
                naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
            ..Default::default()
        }
    }

    #[test]
    fn kernels_translate_to_spirv_with_and_without_bounds_checks() {
        // The tiled matmul with every tile of `MatmulTiles::ALL` in its vec4, scalar and edge
        // forms, the narrow one with every number of rows: the code the checks act on.
        let modules = every_module()
            .into_iter()
            .filter(|(_, variant, _)| match *variant {
                Variant::Matmul {
                    tiles,
                    group_rows,
                    bias,
                    activation,
                    ..
                } => {
                    MatmulTiles::ALL.contains(&tiles)
                        && group_rows == MatmulOptions::default().group_rows
                        && bias
                        && activation == Activation::Gelu
                }
                Variant::Narrow {
                    lanes,
                    subgroup,
                    split,
                    bias,
                    activation,
                    ..
                } => {
                    [1, 4, 64, 256].contains(&lanes)
                        && (split || subgroup > 0 || (bias && activation == Activation::Gelu))
                }
                Variant::Plain | Variant::Reduce { .. } => true,
            });
        for (source, variant, types) in modules {
            let text = module_source(source, &variant, types);
            let (module, info) = validate(&text).unwrap_or_else(|error| panic!("{error}"));
            for checks in [ShaderChecks::Checked, ShaderChecks::Unchecked] {
                let options = spirv_options(checks);
                if let Err(error) = naga::back::spv::write_vec(&module, &info, &options, None) {
                    panic!(
                        "{source:?}{}{} {checks:?}: {error}",
                        variant.label(),
                        types.label()
                    );
                }
            }
        }
    }

    #[test]
    fn matmul_steps_and_outputs_are_unrolled_for_every_tile() {
        for tiles in MatmulTiles::ALL {
            let variant = Variant::Matmul {
                tiles,
                group_rows: 8,
                vec4: true,
                edges: false,
                bias: false,
                activation: Activation::None,
                linear_grid: false,
            };
            // The code, without comments.
            let text: String = module_source(Source::Matmul, &variant, ElementTypes::F32)
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            let accumulators = tiles.tm * tiles.tn / 4;
            let fmas = text.matches("] = fma(").count() as u32;
            assert_eq!(fmas, accumulators * tiles.bk, "{tiles}");
            assert_eq!(
                text.matches("    store_c(").count() as u32,
                accumulators,
                "{tiles}"
            );
            let last = accumulators - 1;
            let (i, j) = (tiles.tm / 4 - 1, tiles.tn / 4 - 1);
            let line = format!("acc[{last}u] = fma(vec4<f32>(a{i}[3u]), b{j}, acc[{last}u]);");
            assert!(text.contains(&line), "{tiles}: no {line}");
        }
    }

    #[test]
    fn narrow_rows_steps_and_shuffles_are_unrolled() {
        for rows in 1..=MatmulOptions::NARROW_MAX_ROWS {
            for (lanes, subgroup, shuffles, sum_rows) in
                [(8, 0, 0, 4), (4, 32, 3, 8), (1, 8, 3, 8), (16, 8, 0, 4)]
            {
                let variant = Variant::Narrow {
                    rows,
                    lanes,
                    subgroup,
                    split: false,
                    bias: true,
                    activation: Activation::Gelu,
                };
                let text = module_source(Source::MatmulNarrow, &variant, ElementTypes::F32);
                if std::env::var_os("PRINT_NARROW").is_some() && rows == 5 {
                    println!("{text}");
                }
                // The code, without comments.
                let text: String = text
                    .lines()
                    .map(|line| line.split("//").next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n");
                // Four multiply-adds per row and step: the main loop's steps and the blocks of
                // the steps left (NARROW_STEPS - 1 down to 1).
                let fmas = text.matches(" = fma(vec4<f32>(a").count() as u32;
                let steps = NARROW_STEPS + NARROW_STEPS * (NARROW_STEPS - 1) / 2;
                assert_eq!(fmas, rows * 4 * steps, "{rows} rows");
                assert_eq!(text.matches("    var acc").count() as u32, rows);
                // log2(subgroup / lanes) shuffles per row.
                assert_eq!(
                    text.matches("= subgroupShuffleXor(").count() as u32,
                    rows * shuffles,
                    "{rows} rows, {lanes} lanes, subgroup {subgroup}"
                );
                // Every row is reduced and stored once, in groups of as many as fit.
                assert_eq!(narrow_sum_rows(rows, lanes, subgroup), rows.min(sum_rows));
                assert_eq!(
                    text.matches("    reduce_and_store(").count() as u32,
                    rows.div_ceil(sum_rows)
                );
                for r in 0..rows {
                    assert_eq!(
                        text.matches(&format!("= acc{r};")).count(),
                        1,
                        "{rows} rows"
                    );
                }
            }
        }
    }
}
