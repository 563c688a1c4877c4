//! Which kernel runs: [`Source`], [`Variant`], [`KernelKey`].
//!
//! # A variant's facts, in one place
//!
//! Every fact about a kernel variant is read from `impl Variant` below, and nowhere else:
//!
//! | fact | read by | method |
//! |---|---|---|
//! | its source file and entry point (the generated kernels) | the ops that build keys | [`Variant::kernel`] |
//! | its WGSL constants (name, value), in module order | `kernels.rs` (module text) | [`Variant::constants`] |
//! | its label (reports, errors, pipeline labels) | [`KernelKey::label`] | [`Variant::label`] |
//! | the epilogue it folds (bias, activation, residual), and setting it | fusion in `graph/fusion.rs` | [`Variant::epilogue`], [`Variant::with_epilogue`] |
//! | where that epilogue writes and reads its bias | fusion in `graph/fusion.rs` | [`KernelKey::epilogue_bindings`] |
//! | its storage bindings: how many, and which of them are the residual's and the layer norm's | `kernels.rs` (layouts, WGSL), the context, the plans | [`KernelKey::storage_bindings`], [`Variant::extra_bindings`] |
//! | the columns of the product it writes | fusion in `graph/fusion.rs` | [`KernelKey::product_columns`] |
//! | the activation a unary kernel computes, which an epilogue can fold | fusion in `graph/fusion.rs` | [`KernelKey::activation`] |
//!
//! Adding a field to a variant is then a change to this file (and to the WGSL that reads the
//! constant), plus the op that fills it.

use super::coop::{CoopProbe, CoopTiles};
use super::dtype::ElementTypes;
use super::options::{Activation, MatmulOptions};
use super::params::{MatmulParams, NarrowParams, ParamsBlock, ReduceParams};
use super::tiles::MatmulTiles;

/// A WGSL file of `shaders/` with entry points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Unary,
    Binary,
    Matmul,
    MatmulNarrow,
    MatmulReduce,
    /// `shaders/matmul_coop.wgsl` (after its bindings, `shaders/matmul_coop_vec4.wgsl` or
    /// `shaders/matmul_coop_scalar.wgsl`): the matmul on cooperative matrices.
    MatmulCoop,
    Rows,
    /// `shaders/layer_norm.wgsl` (after `shaders/workgroup_reduce.wgsl`).
    LayerNorm,
    /// `shaders/add_layer_norm.wgsl` (after `shaders/workgroup_reduce.wgsl`): a plan's fusion of
    /// an add and the layer norm of its sum.
    AddLayerNorm,
    /// `shaders/softmax_rows.wgsl` (after `shaders/workgroup_reduce.wgsl`).
    SoftmaxRows,
    /// `shaders/embedding.wgsl`.
    Embedding,
    /// `shaders/embedding_sum.wgsl`: token and position embeddings added in one gather.
    EmbeddingSum,
    /// `shaders/argmax_rows.wgsl`.
    ArgmaxRows,
    /// `shaders/kv_write.wgsl`.
    KvWrite,
    /// `shaders/kv_write_qkv.wgsl`: the key and value from a fused query-key-value tensor.
    KvWriteQkv,
    /// `shaders/paged_attention.wgsl` (after `shaders/workgroup_reduce.wgsl`).
    PagedAttention,
    /// `shaders/paged_attention_vec4.wgsl` (after `shaders/workgroup_reduce.wgsl`): the decode
    /// attention's first pass for a head size that is a multiple of 4.
    PagedAttentionVec4,
}

impl Source {
    /// Storage bindings (after the parameters at binding 0) of the source's kernels, without the
    /// optional ones a matmul variant adds ([`KernelKey::storage_bindings`] counts those).
    pub(crate) fn storage_bindings(self) -> usize {
        match self {
            Self::Unary | Self::Rows | Self::SoftmaxRows | Self::ArgmaxRows => 2,
            Self::Binary | Self::MatmulReduce | Self::Embedding => 3,
            Self::KvWriteQkv => 5,
            Self::Matmul | Self::MatmulNarrow | Self::MatmulCoop | Self::LayerNorm => 4,
            Self::EmbeddingSum => 8,
            Self::KvWrite
            | Self::PagedAttention
            | Self::PagedAttentionVec4
            | Self::AddLayerNorm => 6,
        }
    }
}

/// The compile-time choices of one variant of a kernel (WGSL constants the host writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Variant {
    /// No constants.
    Plain,
    /// The tiled matmul (`shaders/matmul.wgsl`).
    Matmul {
        tiles: MatmulTiles,
        group_rows: u32,
        vec4: bool,
        edges: bool,
        bias: bool,
        activation: Activation,
        /// A residual of C's shape is added last (binding 5).
        residual: bool,
        /// The grid is laid out as rows of linear workgroup ids (beyond the device's
        /// per-dimension limit): the entry point returns at once for ids past the last tile.
        /// Off, the entry point has no such test.
        linear_grid: bool,
    },
    /// The matmul kernel for a few rows (`shaders/matmul_narrow.wgsl`).
    Narrow {
        /// Rows each workgroup multiplies: M, or M over the plan's groups of rows.
        rows: u32,
        lanes: u32,
        /// The device's subgroup size, fixed, wider than `lanes`: each subgroup adds the slices it
        /// holds by shuffles before workgroup memory. 0: no subgroup operations.
        subgroup: u32,
        /// K is split over the grid's z: the kernel writes partial products (no epilogue) that
        /// the split-K reduction adds.
        split: bool,
        bias: bool,
        activation: Activation,
        /// A residual of C's shape is added last (binding 5; never with `split`).
        residual: bool,
        /// The layer-norm prologue: A's rows are normalized over K (mean and variance of each
        /// whole row, then `gamma` and `beta`, the bindings after the residual's place) as the
        /// kernel loads them.
        norm: bool,
    },
    /// The split-K reduction (`shaders/matmul_reduce.wgsl`).
    Reduce {
        bias: bool,
        activation: Activation,
        /// A residual of C's shape is added last (binding 4).
        residual: bool,
    },
    /// The matmul on cooperative matrices (`shaders/matmul_coop.wgsl`), f16 operands. With a
    /// split of K (the grid's z) it writes f32 partial products and no epilogue (the element
    /// types say so: f32 output), as the tiled kernel does.
    Coop {
        tiles: CoopTiles,
        /// K and N are multiples of 4: A, B and C are bound as `vec4`s.
        vec4: bool,
        bias: bool,
        activation: Activation,
        /// A residual of C's shape is added last (binding 5).
        residual: bool,
        /// A diagnostic that leaves part of the loop over K out (not a product); `None` for
        /// the product.
        probe: Option<CoopProbe>,
    },
}

/// The epilogue a matmul variant folds into its stores: `act(x + bias) + residual`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct FusedEpilogue {
    /// A bias over columns is added.
    pub(crate) bias: bool,
    /// The activation, applied after the bias.
    pub(crate) activation: Activation,
    /// A residual of the product's shape is added after the activation (in f32, before the one
    /// rounding of the store).
    pub(crate) residual: bool,
}

/// The value of one WGSL constant of a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConstantValue {
    /// A `u32`.
    U32(u32),
    /// A `bool`.
    Bool(bool),
}

impl ConstantValue {
    /// The WGSL declaration `const {name}: ... = ...;` of this value, with its newline.
    pub(crate) fn declare(self, name: &str) -> String {
        match self {
            Self::U32(value) => format!("const {name}: u32 = {value}u;\n"),
            Self::Bool(value) => format!("const {name}: bool = {value};\n"),
        }
    }
}

/// vec4s of workgroup memory the narrow matmul adds its slices in: 16 KiB, WebGPU's default
/// limit.
pub(crate) const NARROW_SUM_VEC4S: u32 = 1024;

/// Slices of each lane that one subgroup of the narrow matmul holds and adds by shuffles (1:
/// none, without subgroups or with a subgroup no wider than the lanes).
pub(crate) fn narrow_grouped(lanes: u32, subgroup: u32) -> u32 {
    if subgroup > lanes {
        subgroup / lanes.max(1)
    } else {
        1
    }
}

/// Rows of the narrow matmul whose slices are added at once in workgroup memory: as many as
/// [`NARROW_SUM_VEC4S`] hold, each taking `256 / grouped` vec4s.
pub(crate) fn narrow_sum_rows(rows: u32, lanes: u32, subgroup: u32) -> u32 {
    let row_vec4s = MatmulOptions::NARROW_THREADS / narrow_grouped(lanes, subgroup);
    rows.min(NARROW_SUM_VEC4S / row_vec4s).max(1)
}

/// f32 slots of workgroup memory (the first of the narrow matmul's sums, before its loop over
/// K uses them) in which its layer-norm prologue adds each row's statistics.
pub(crate) const NARROW_NORM_SLOTS: u32 = MatmulOptions::NARROW_THREADS;

/// Invocations of the narrow matmul that add the statistics of one of its `rows` rows in its
/// layer-norm prologue: the workgroup dealt over the rows rounded up to a power of two.
pub(crate) fn narrow_norm_per_row(rows: u32) -> u32 {
    NARROW_NORM_SLOTS / rows.max(1).next_power_of_two().min(NARROW_NORM_SLOTS)
}

/// The label of a residual epilogue.
fn residual_suffix(residual: bool) -> &'static str {
    if residual {
        " +residual"
    } else {
        ""
    }
}

impl Variant {
    /// The source file and entry point of a generated variant (every one but
    /// [`Variant::Plain`], whose ops name their entry point).
    pub(crate) fn kernel(&self) -> Option<(Source, &'static str)> {
        match self {
            Self::Plain => None,
            Self::Matmul { .. } => Some((Source::Matmul, "matmul")),
            Self::Narrow { .. } => Some((Source::MatmulNarrow, "matmul_narrow")),
            Self::Reduce { .. } => Some((Source::MatmulReduce, "matmul_reduce")),
            Self::Coop { .. } => Some((Source::MatmulCoop, "matmul_coop")),
        }
    }

    /// The WGSL constants of the variant, in the order the module declares them: `(name,
    /// value)`.
    pub(crate) fn constants(&self) -> Vec<(&'static str, ConstantValue)> {
        use ConstantValue::{Bool, U32};
        match *self {
            Self::Plain => Vec::new(),
            Self::Matmul {
                tiles,
                group_rows,
                vec4,
                edges,
                bias,
                activation,
                residual,
                linear_grid: _,
            } => vec![
                ("GROUP_M", U32(group_rows)),
                ("BM", U32(tiles.bm)),
                ("BN", U32(tiles.bn)),
                ("BK", U32(tiles.bk)),
                ("TM", U32(tiles.tm)),
                ("TN", U32(tiles.tn)),
                ("THREADS", U32(tiles.threads())),
                ("A_LOADS", U32(tiles.a_loads())),
                ("B_LOADS", U32(tiles.b_loads())),
                ("ACT", U32(activation.code())),
                ("VEC4", Bool(vec4)),
                ("EDGES", Bool(edges)),
                ("BIAS", Bool(bias)),
                ("RESIDUAL", Bool(residual)),
            ],
            Self::Narrow {
                rows,
                lanes,
                subgroup,
                split,
                bias,
                activation,
                residual,
                norm,
            } => vec![
                ("ROWS", U32(rows)),
                ("LANES", U32(lanes)),
                ("SUBGROUP", U32(subgroup)),
                ("GROUPED", U32(narrow_grouped(lanes, subgroup))),
                ("SUM_ROWS", U32(narrow_sum_rows(rows, lanes, subgroup))),
                ("ACT", U32(activation.code())),
                ("SPLIT", Bool(split)),
                ("BIAS", Bool(bias)),
                ("RESIDUAL", Bool(residual)),
                ("NORM", Bool(norm)),
                ("NORM_PER_ROW", U32(narrow_norm_per_row(rows))),
                (
                    "NORM_VEC4S",
                    U32(if norm { NARROW_NORM_SLOTS / 4 } else { 0 }),
                ),
            ],
            Self::Reduce {
                bias,
                activation,
                residual,
            } => vec![
                ("ACT", U32(activation.code())),
                ("BIAS", Bool(bias)),
                ("RESIDUAL", Bool(residual)),
            ],
            Self::Coop {
                tiles,
                vec4,
                bias,
                activation,
                residual,
                probe: _,
            } => vec![
                ("BM", U32(tiles.bm)),
                ("BN", U32(tiles.bn)),
                ("WM", U32(tiles.wm)),
                ("WN", U32(tiles.wn)),
                ("BK", U32(tiles.bk)),
                ("SUBGROUPS", U32(tiles.subgroups())),
                ("SUBGROUPS_N", U32(tiles.bn / tiles.wn)),
                ("THREADS", U32(tiles.threads())),
                ("A_LOADS", U32(tiles.a_loads())),
                ("B_LOADS", U32(tiles.b_loads())),
                ("A_STRIDE", U32((tiles.bk + CoopTiles::PAD) / 4)),
                ("B_STRIDE", U32((tiles.bn + CoopTiles::PAD) / 4)),
                ("ACT", U32(activation.code())),
                ("VEC4", Bool(vec4)),
                ("BIAS", Bool(bias)),
                ("RESIDUAL", Bool(residual)),
            ],
        }
    }

    /// The epilogue the variant folds into its stores; `None` for a kernel that folds none.
    pub(crate) fn epilogue(&self) -> Option<FusedEpilogue> {
        match *self {
            Self::Matmul {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Narrow {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Coop {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Reduce {
                bias,
                activation,
                residual,
            } => Some(FusedEpilogue {
                bias,
                activation,
                residual,
            }),
            Self::Plain => None,
        }
    }

    /// Which of the variant's storage bindings (indices from 0, WGSL binding index + 1) its
    /// residual is: after A, B, C and the bias (after the partial products, the bias and C for
    /// the reduction); `None` without a residual.
    pub(crate) fn residual_binding(&self) -> Option<usize> {
        match *self {
            Self::Matmul { residual, .. }
            | Self::Narrow { residual, .. }
            | Self::Coop { residual, .. } => residual.then_some(4),
            Self::Reduce { residual, .. } => residual.then_some(3),
            Self::Plain => None,
        }
    }

    /// Which of the variant's storage bindings its layer norm's `gamma` and `beta` are: after
    /// the residual's place (the narrow matmul's prologue); `None` without one.
    pub(crate) fn norm_bindings(&self) -> Option<(usize, usize)> {
        match *self {
            Self::Narrow {
                norm: true,
                residual,
                ..
            } => {
                let gamma = 4 + usize::from(residual);
                Some((gamma, gamma + 1))
            }
            _ => None,
        }
    }

    /// Storage bindings the variant adds to its source's (see [`Source::storage_bindings`]): its
    /// residual's, its layer norm's `gamma` and `beta`.
    pub(crate) fn extra_bindings(&self) -> usize {
        usize::from(self.residual_binding().is_some())
            + if self.norm_bindings().is_some() { 2 } else { 0 }
    }

    /// The variant folding `epilogue` instead of its own (a kernel that folds none is
    /// returned as it is).
    pub(crate) fn with_epilogue(mut self, epilogue: FusedEpilogue) -> Self {
        match &mut self {
            Self::Matmul {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Narrow {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Coop {
                bias,
                activation,
                residual,
                ..
            }
            | Self::Reduce {
                bias,
                activation,
                residual,
            } => {
                *bias = epilogue.bias;
                *activation = epilogue.activation;
                *residual = epilogue.residual;
            }
            Self::Plain => {}
        }
        self
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
                residual,
                linear_grid,
            } => format!(
                " {tiles}{}{}{}{}{}{}",
                if vec4 { " vec4" } else { " scalar" },
                if edges { " edges" } else { "" },
                if bias { " +bias" } else { "" },
                activation.suffix(),
                residual_suffix(residual),
                if linear_grid { " linear grid" } else { "" }
            ),
            Self::Narrow {
                rows,
                lanes,
                subgroup,
                split,
                bias,
                activation,
                residual,
                norm,
            } => format!(
                " {rows} rows per workgroup x{lanes} lanes{}{}{}{}{}{}",
                if subgroup > 0 {
                    format!(" subgroup {subgroup}")
                } else {
                    String::new()
                },
                if norm { " layer-norm prologue" } else { "" },
                if split { " split" } else { "" },
                if bias { " +bias" } else { "" },
                activation.suffix(),
                residual_suffix(residual)
            ),
            Self::Reduce {
                bias,
                activation,
                residual,
            } => format!(
                "{}{}{}",
                if bias { " +bias" } else { "" },
                activation.suffix(),
                residual_suffix(residual)
            ),
            Self::Coop {
                tiles,
                vec4,
                bias,
                activation,
                residual,
                probe,
            } => format!(
                " {tiles}{}{}{}{}{}",
                if vec4 { " vec4" } else { " scalar" },
                if bias { " +bias" } else { "" },
                activation.suffix(),
                residual_suffix(residual),
                probe.map_or(String::new(), |p| format!(" probe {}", p.name()))
            ),
        }
    }
}

/// Which kernel: a source, an entry point and a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KernelKey {
    pub(crate) source: Source,
    pub(crate) entry: &'static str,
    pub(crate) variant: Variant,
    /// What the kernel loads and stores.
    pub(crate) types: ElementTypes,
}

impl KernelKey {
    /// A kernel without constants, on f32.
    pub(crate) const fn plain(source: Source, entry: &'static str) -> Self {
        Self {
            source,
            entry,
            variant: Variant::Plain,
            types: ElementTypes::F32,
        }
    }

    /// The kernel of a generated `variant` (see [`Variant::kernel`]) loading and storing
    /// `types`; `None` for a [`Variant::Plain`], which names no kernel of its own.
    pub(crate) fn generated(variant: Variant, types: ElementTypes) -> Option<Self> {
        let (source, entry) = variant.kernel()?;
        Some(Self {
            source,
            entry,
            variant,
            types,
        })
    }

    /// This kernel folding `epilogue` instead of its own ([`Variant::with_epilogue`]).
    pub(crate) fn with_epilogue(self, epilogue: FusedEpilogue) -> Self {
        Self {
            variant: self.variant.with_epilogue(epilogue),
            ..self
        }
    }

    /// Storage bindings of the kernel (after the parameters at binding 0): its source's, and
    /// those its variant adds ([`Variant::extra_bindings`]).
    pub(crate) fn storage_bindings(&self) -> usize {
        self.source.storage_bindings() + self.variant.extra_bindings()
    }

    /// Where the kernel's epilogue writes and reads its bias: `(output, bias)` indices of its
    /// storage bindings, for the kernels whose variants fold an epilogue (its residual, if any,
    /// is at [`Variant::residual_binding`]).
    pub(crate) fn epilogue_bindings(&self) -> Option<(usize, usize)> {
        match self.variant {
            Variant::Matmul { .. } | Variant::Narrow { .. } | Variant::Coop { .. } => Some((2, 3)),
            Variant::Reduce { .. } => Some((2, 1)),
            Variant::Plain => None,
        }
    }

    /// The columns (N) of the product a matmul, narrow or reduction kernel writes, read from
    /// its parameters; `None` for the other kernels.
    pub(crate) fn product_columns(&self, params: &ParamsBlock) -> Option<u32> {
        match self.variant {
            Variant::Matmul { .. } | Variant::Coop { .. } => Some(params.read::<MatmulParams>().n),
            Variant::Narrow { .. } => Some(params.read::<NarrowParams>().n4.saturating_mul(4)),
            Variant::Reduce { .. } => Some(params.read::<ReduceParams>().n),
            Variant::Plain => None,
        }
    }

    /// The activation a unary kernel computes, where a matmul's epilogue can fold it.
    pub(crate) fn activation(&self) -> Option<Activation> {
        match (self.source, self.entry) {
            (Source::Unary, "relu") => Some(Activation::Relu),
            (Source::Unary, "gelu") => Some(Activation::Gelu),
            _ => None,
        }
    }

    /// This kernel loading and storing `types`.
    pub(crate) const fn typed(self, types: ElementTypes) -> Self {
        Self { types, ..self }
    }

    /// The kernel's label: its entry point, its variant's label and its element types'.
    pub(crate) fn label(&self) -> String {
        format!(
            "{}{}{}",
            self.entry,
            self.variant.label(),
            self.types.label()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::types::DType;

    /// One variant of each kind, epilogue off.
    fn variants() -> [Variant; 5] {
        [
            Variant::Plain,
            Variant::Matmul {
                tiles: MatmulTiles::T64X64X8,
                group_rows: 8,
                vec4: true,
                edges: true,
                bias: false,
                activation: Activation::None,
                residual: false,
                linear_grid: true,
            },
            Variant::Narrow {
                rows: 3,
                lanes: 4,
                subgroup: 32,
                split: false,
                bias: false,
                activation: Activation::None,
                residual: false,
                norm: false,
            },
            Variant::Reduce {
                bias: false,
                activation: Activation::None,
                residual: false,
            },
            Variant::Coop {
                tiles: CoopTiles::T128X128,
                vec4: true,
                bias: false,
                activation: Activation::None,
                residual: false,
                probe: None,
            },
        ]
    }

    #[test]
    fn every_generated_variant_folds_every_epilogue_and_names_its_kernel() {
        for variant in variants() {
            let key = KernelKey::generated(variant, ElementTypes::same(DType::F16));
            assert_eq!(key.is_some(), variant != Variant::Plain);
            assert_eq!(variant.epilogue().is_some(), variant != Variant::Plain);
            for (bias, residual) in [(false, false), (true, false), (false, true), (true, true)] {
                for activation in Activation::ALL {
                    let epilogue = FusedEpilogue {
                        bias,
                        activation,
                        residual,
                    };
                    let folded = variant.with_epilogue(epilogue);
                    if variant == Variant::Plain {
                        assert_eq!(folded, variant);
                        continue;
                    }
                    assert_eq!(folded.epilogue(), Some(epilogue));
                    // The constants and the label say so.
                    let constants = folded.constants();
                    assert!(constants.contains(&("BIAS", ConstantValue::Bool(bias))));
                    assert!(constants.contains(&("RESIDUAL", ConstantValue::Bool(residual))));
                    let act = ConstantValue::U32(activation.code());
                    assert!(constants.contains(&("ACT", act)));
                    assert_eq!(folded.label().contains(" +bias"), bias);
                    assert_eq!(folded.label().contains(" +residual"), residual);
                    assert!(folded.label().contains(activation.suffix()));
                    let key = KernelKey::generated(folded, ElementTypes::F32).unwrap();
                    assert_eq!(key.with_epilogue(FusedEpilogue::default()).variant, variant);
                    assert!(key.epilogue_bindings().is_some());
                    // A residual is one binding more, after the bias (the reduction's after C).
                    let base = key.source.storage_bindings();
                    assert_eq!(key.storage_bindings(), base + usize::from(residual));
                    assert_eq!(folded.residual_binding(), residual.then_some(base));
                }
            }
        }
        let names: Vec<_> = variants().iter().filter_map(Variant::kernel).collect();
        assert_eq!(
            names,
            [
                (Source::Matmul, "matmul"),
                (Source::MatmulNarrow, "matmul_narrow"),
                (Source::MatmulReduce, "matmul_reduce"),
                (Source::MatmulCoop, "matmul_coop")
            ]
        );
    }

    #[test]
    fn a_layer_norm_prologue_binds_gamma_and_beta_after_the_residual() {
        for residual in [false, true] {
            let variant = Variant::Narrow {
                rows: 16,
                lanes: 4,
                subgroup: 0,
                split: false,
                bias: true,
                activation: Activation::Gelu,
                residual,
                norm: true,
            };
            let key = KernelKey::generated(variant, ElementTypes::F32).unwrap();
            // A, B, C, bias, [residual], gamma, beta.
            assert_eq!(key.storage_bindings(), 6 + usize::from(residual));
            let gamma = 4 + usize::from(residual);
            assert_eq!(variant.norm_bindings(), Some((gamma, gamma + 1)));
            assert!(variant.label().contains("layer-norm prologue"));
            let constants = variant.constants();
            assert!(constants.contains(&("NORM", ConstantValue::Bool(true))));
            assert!(constants.contains(&("NORM_PER_ROW", ConstantValue::U32(16))));
            // Folding an epilogue keeps the prologue.
            let folded = variant.with_epilogue(FusedEpilogue::default());
            assert_eq!(folded.norm_bindings(), Some((4, 5)));
        }
        assert_eq!(narrow_norm_per_row(1), 256);
        assert_eq!(narrow_norm_per_row(3), 64);
        assert_eq!(narrow_norm_per_row(16), 16);
    }

    #[test]
    fn fusion_reads_bindings_columns_and_activations_from_the_keys() {
        let [_, matmul, narrow, reduce, coop] = variants();
        let key = |variant| KernelKey::generated(variant, ElementTypes::F32).unwrap();
        assert_eq!(key(matmul).epilogue_bindings(), Some((2, 3)));
        assert_eq!(key(narrow).epilogue_bindings(), Some((2, 3)));
        assert_eq!(key(reduce).epilogue_bindings(), Some((2, 1)));
        assert_eq!(key(coop).epilogue_bindings(), Some((2, 3)));
        let plain = KernelKey::plain(Source::Unary, "relu");
        assert_eq!(plain.epilogue_bindings(), None);
        assert_eq!(plain.activation(), Some(Activation::Relu));
        assert_eq!(
            KernelKey::plain(Source::Unary, "gelu").activation(),
            Some(Activation::Gelu)
        );
        assert_eq!(
            KernelKey::plain(Source::Unary, "exp_kernel").activation(),
            None
        );
        assert_eq!(KernelKey::plain(Source::Binary, "relu").activation(), None);
        let params = ParamsBlock::new(&MatmulParams {
            m: 1,
            n: 7,
            k: 2,
            k_chunk: 2,
            tiles_n: 1,
            tiles_m: 1,
            grid_x: 1,
            pad: 0,
        });
        assert_eq!(key(matmul).product_columns(&params), Some(7));
        assert_eq!(key(coop).product_columns(&params), Some(7));
        let params = ParamsBlock::new(&NarrowParams {
            n4: 3,
            k4: 1,
            grid_x: 1,
            k_chunk4: 1,
            tiles: 1,
            m: 1,
            eps: 0.0,
            pad: 0,
        });
        assert_eq!(key(narrow).product_columns(&params), Some(12));
        let params = ParamsBlock::new(&ReduceParams {
            len: 10,
            n: 5,
            splits: 2,
            grid_x: 1,
        });
        assert_eq!(key(reduce).product_columns(&params), Some(5));
        assert_eq!(plain.product_columns(&params), None);
    }
}
