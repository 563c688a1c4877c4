//! Kernel sources, their compile-time constants, and the layouts and pipelines built from them.
//!
//! A kernel's module is `constants + shaders/common.wgsl + bindings + shaders/<source>.wgsl`; the
//! constants (tile sizes, which edges to mask, the fused epilogue) are WGSL `const` declarations
//! generated here, so each variant is compiled with its branches resolved; the bindings are the
//! tiled matmul's storage bindings, declared as vec4s (`shaders/matmul_vec4.wgsl`) or as elements
//! (`shaders/matmul_scalar.wgsl`, when K or N is not a multiple of 4), empty for other kernels.
//! Modules are cached by `(source, variant)`, pipelines by `(source, entry point, variant)`.
//!
//! Layouts: binding 0 is the op's parameters (a uniform with a dynamic offset into the context's
//! ring), bindings 1.. are the storage ranges, all `read_write`. There is one layout per number of
//! storage bindings, so bind groups are shared by every kernel with that many.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::num::NonZeroU64;

use super::context::ShaderChecks;
use super::ops::matmul::{Activation, MatmulTiles};
use super::ComputeError;

const COMMON: &str = include_str!("../../shaders/common.wgsl");

/// Bytes of every kernel's parameter block (the size of the uniform binding).
pub(crate) const PARAMS_BYTES: u64 = 32;

/// Words of every kernel's parameter block.
pub(crate) const PARAMS_WORDS: usize = (PARAMS_BYTES / 4) as usize;

/// One kernel's parameters, as the uniform's words (floats by their bits).
pub(crate) type Params = [u32; PARAMS_WORDS];

/// Most storage bindings of any kernel.
pub(crate) const MAX_STORAGE_BINDINGS: usize = 4;

/// A WGSL file of `shaders/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Unary,
    Binary,
    Matmul,
    MatmulNarrow,
    MatmulReduce,
    Rows,
}

impl Source {
    fn text(self) -> &'static str {
        match self {
            Self::Unary => include_str!("../../shaders/unary.wgsl"),
            Self::Binary => include_str!("../../shaders/binary.wgsl"),
            Self::Matmul => include_str!("../../shaders/matmul.wgsl"),
            Self::MatmulNarrow => include_str!("../../shaders/matmul_narrow.wgsl"),
            Self::MatmulReduce => include_str!("../../shaders/matmul_reduce.wgsl"),
            Self::Rows => include_str!("../../shaders/rows.wgsl"),
        }
    }

    /// Storage bindings (after the parameters at binding 0).
    pub(crate) fn storage_bindings(self) -> usize {
        match self {
            Self::Unary | Self::Rows => 2,
            Self::Binary | Self::MatmulReduce => 3,
            Self::Matmul | Self::MatmulNarrow => 4,
        }
    }
}

/// The compile-time constants of one variant of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Variant {
    /// No constants.
    Plain,
    /// The matmul kernel.
    Matmul {
        tiles: MatmulTiles,
        group_rows: u32,
        vec4: bool,
        edges: bool,
        bias: bool,
        activation: Activation,
    },
    /// The matmul kernel for a few rows (`shaders/matmul_narrow.wgsl`).
    Narrow {
        rows: u32,
        lanes: u32,
        bias: bool,
        activation: Activation,
    },
    /// The split-K reduction.
    Reduce { bias: bool, activation: Activation },
}

impl Variant {
    /// The WGSL `const` declarations of this variant.
    fn constants(&self) -> String {
        let mut text = String::new();
        let mut int = |name: &str, value: u32| writeln!(text, "const {name}: u32 = {value}u;");
        match *self {
            Self::Plain => {}
            Self::Matmul {
                tiles,
                group_rows,
                vec4,
                edges,
                bias,
                activation,
            } => {
                int("GROUP_M", group_rows).ok();
                int("BM", tiles.bm).ok();
                int("BN", tiles.bn).ok();
                int("BK", tiles.bk).ok();
                int("TM", tiles.tm).ok();
                int("TN", tiles.tn).ok();
                int("THREADS", tiles.threads()).ok();
                int("A_LOADS", tiles.a_loads()).ok();
                int("B_LOADS", tiles.b_loads()).ok();
                int("ACT", activation.code()).ok();
                writeln!(text, "const VEC4: bool = {vec4};").ok();
                writeln!(text, "const EDGES: bool = {edges};").ok();
                writeln!(text, "const BIAS: bool = {bias};").ok();
            }
            Self::Narrow {
                rows,
                lanes,
                bias,
                activation,
            } => {
                int("ROWS", rows).ok();
                int("LANES", lanes).ok();
                int("ACT", activation.code()).ok();
                writeln!(text, "const BIAS: bool = {bias};").ok();
            }
            Self::Reduce { bias, activation } => {
                int("ACT", activation.code()).ok();
                writeln!(text, "const BIAS: bool = {bias};").ok();
            }
        }
        text
    }

    /// Declarations the kernel's text leaves to the variant: the storage bindings of the matmul,
    /// as vec4s (`shaders/matmul_vec4.wgsl`) or as elements (`shaders/matmul_scalar.wgsl`).
    fn bindings(&self) -> &'static str {
        match self {
            Self::Matmul { vec4: true, .. } => include_str!("../../shaders/matmul_vec4.wgsl"),
            Self::Matmul { vec4: false, .. } => include_str!("../../shaders/matmul_scalar.wgsl"),
            _ => "",
        }
    }

    /// The kernel's text with the host's unrolling applied. In the matmul kernel: the block
    /// between `// BEGIN STEP` and `// END STEP` repeated for `STEP` = `0u` .. `BK - 1u`, and
    /// each line that ends in `// each` and some of `I`, `E`, `J` repeated for every value of
    /// them (outer to inner, in the order named), `{I}`, `{E}`, `{J}` replaced by the values:
    /// `I` < `TM / 4` (a group of four rows of an invocation's outputs), `E` < 4 (a row of the
    /// group), `J` < `TN / 4` (a group of four columns); and `{A}` by `(4·I + E)·(TN / 4) + J`,
    /// the index of that row and column group in the accumulators.
    fn expand<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Self::Matmul { tiles, .. } = self else {
            return Cow::Borrowed(text);
        };
        const BEGIN: &str = "        // BEGIN STEP\n";
        const END: &str = "        // END STEP\n";
        let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
            return Cow::Borrowed(text);
        };
        let block = &text[begin + BEGIN.len()..end];
        let mut expanded = String::with_capacity(text.len() + block.len() * tiles.bk as usize);
        expanded.push_str(&text[..begin]);
        for step in 0..tiles.bk {
            expanded.push_str(&block.replace("STEP", &format!("{step}u")));
        }
        expanded.push_str(&text[end + END.len()..]);
        let mut lines = String::with_capacity(expanded.len() * 2);
        for line in expanded.lines() {
            expand_each(line, tiles, &mut lines);
        }
        Cow::Owned(lines)
    }

    /// A short label for reports and errors.
    pub(crate) fn label(&self) -> String {
        match *self {
            Self::Plain => String::new(),
            Self::Matmul {
                tiles,
                group_rows: _,
                vec4,
                edges,
                bias,
                activation,
            } => format!(
                " {tiles}{}{}{}{}",
                if vec4 { " vec4" } else { " scalar" },
                if edges { " edges" } else { "" },
                if bias { " +bias" } else { "" },
                activation.suffix()
            ),
            Self::Narrow {
                rows,
                lanes,
                bias,
                activation,
            } => format!(
                " {rows} rows x{lanes} lanes{}{}",
                if bias { " +bias" } else { "" },
                activation.suffix()
            ),
            Self::Reduce { bias, activation } => format!(
                "{}{}",
                if bias { " +bias" } else { "" },
                activation.suffix()
            ),
        }
    }
}

/// Appends `line` to `out`, repeated as its `// each` suffix asks (see [`Variant::expand`]);
/// a line without one (a suffix of names other than `I`, `E`, `J` is none) once.
fn expand_each(line: &str, tiles: &MatmulTiles, out: &mut String) {
    const EACH: &str = "// each ";
    let marker = line.rfind(EACH).filter(|&at| {
        let names = &line[at + EACH.len()..];
        names
            .split_whitespace()
            .all(|name| ["I", "E", "J"].contains(&name))
    });
    let Some(at) = marker else {
        out.push_str(line);
        out.push('\n');
        return;
    };
    let (groups_i, groups_j) = (tiles.tm / 4, tiles.tn / 4);
    // The values of (I, E, J) of each copy, outer to inner in the order the line names them.
    let mut copies = vec![[0u32; 3]];
    for name in line[at + EACH.len()..].split_whitespace() {
        let (slot, count) = match name {
            "I" => (0, groups_i),
            "E" => (1, 4),
            _ => (2, groups_j),
        };
        copies = copies
            .iter()
            .flat_map(|copy| {
                (0..count).map(move |value| {
                    let mut copy = *copy;
                    copy[slot] = value;
                    copy
                })
            })
            .collect();
    }
    let body = line[..at].trim_end();
    for [i, e, j] in copies {
        let accumulator = (4 * i + e) * groups_j + j;
        let copy = body
            .replace("{I}", &i.to_string())
            .replace("{E}", &e.to_string())
            .replace("{J}", &j.to_string())
            .replace("{A}", &accumulator.to_string());
        out.push_str(&copy);
        out.push('\n');
    }
}

/// Which kernel: a source, an entry point and a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KernelKey {
    pub(crate) source: Source,
    pub(crate) entry: &'static str,
    pub(crate) variant: Variant,
}

impl KernelKey {
    pub(crate) const fn plain(source: Source, entry: &'static str) -> Self {
        Self {
            source,
            entry,
            variant: Variant::Plain,
        }
    }

    pub(crate) fn label(&self) -> String {
        format!("{}{}", self.entry, self.variant.label())
    }
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
    modules: HashMap<(Source, Variant), wgpu::ShaderModule>,
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
        let module = match self.modules.get(&(key.source, key.variant)) {
            Some(module) => module.clone(),
            None => {
                let source = format!(
                    "{}{}{}{}",
                    key.variant.constants(),
                    COMMON,
                    key.variant.bindings(),
                    key.variant.expand(key.source.text())
                );
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
                self.modules
                    .insert((key.source, key.variant), module.clone());
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
        match pollster::block_on(validation.pop()) {
            None => Ok(pipeline),
            Some(error) => {
                // A module that failed to compile would fail again: forget it.
                self.modules.remove(&(key.source, key.variant));
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
    use super::*;

    fn expanded(tiles: MatmulTiles) -> String {
        let variant = Variant::Matmul {
            tiles,
            group_rows: 8,
            vec4: true,
            edges: false,
            bias: false,
            activation: Activation::None,
        };
        variant.expand(Source::Matmul.text()).into_owned()
    }

    #[test]
    fn matmul_steps_and_outputs_are_unrolled_for_every_tile() {
        for tiles in MatmulTiles::ALL {
            // The code, without comments.
            let text: String = expanded(tiles)
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            let accumulators = tiles.tm * tiles.tn / 4;
            for placeholder in ["STEP", "{I}", "{E}", "{J}", "{A}"] {
                assert!(!text.contains(placeholder), "{tiles}: {placeholder} left");
            }
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
}
