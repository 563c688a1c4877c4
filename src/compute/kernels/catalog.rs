//! Every WGSL module the crate can generate, listed without a GPU (the naga tests validate each
//! one) and for one device ([`shader_catalog`]): the modules that device could be asked to
//! compile, and those it could not, each with the reason. A browser test hands each module to the
//! browser's own compiler (Tint, in Chromium) and requires it to report no error.

use crate::compute::types::{
    Activation, CoopProbe, CoopTiles, DType, ElementTypes, MatmulOptions, MatmulTiles, Source,
    Variant,
};
use crate::Gpu;

/// One module of [`shader_catalog`]: its name (the kernel, its variant and its element types)
/// and, on demand, its WGSL.
#[derive(Debug, Clone)]
pub struct CatalogShader {
    source: Source,
    variant: Variant,
    types: ElementTypes,
}

impl CatalogShader {
    /// The module's name: the kernel's source, its variant and element types, e.g.
    /// `Matmul 64x64x8/8x8 vec4 +bias +gelu`.
    pub fn name(&self) -> String {
        format!(
            "{:?}{}{}",
            self.source,
            self.variant.label(),
            self.types.label()
        )
    }

    /// The module's WGSL, exactly as the crate hands it to the device.
    pub fn wgsl(&self) -> String {
        super::module_source(self.source, &self.variant, self.types)
    }
}

/// The modules the crate can generate for one device ([`shader_catalog`]).
#[derive(Debug, Clone, Default)]
pub struct ShaderCatalog {
    /// Every module the device could be asked to compile: every kernel in every variant, tile
    /// and epilogue an op could choose on it (also those only forced options choose).
    pub modules: Vec<CatalogShader>,
    /// The modules the device could never be asked to compile, each with the reason: a feature
    /// it lacks (`shader-f16`, subgroups of that size, cooperative matrices) or a tile beyond
    /// its limits.
    pub skipped: Vec<(CatalogShader, String)>,
}

/// Every WGSL module the crate can generate, sorted for `gpu`'s device: those it could be asked
/// to compile, and those skipped with the reason. Hand each module to the device's compiler to
/// find out before a workload does which of the crate's kernels a driver refuses (the browser
/// suite does so with Tint).
pub fn shader_catalog(gpu: &Gpu) -> ShaderCatalog {
    let features = gpu.device.features();
    let limits = gpu.device.limits();
    let subgroup = (features.contains(wgpu::Features::SUBGROUP)
        && gpu.info.subgroup_min_size == gpu.info.subgroup_max_size)
        .then_some(gpu.info.subgroup_min_size);
    let cooperative = gpu.cooperative_matmul_f16();
    let mut catalog = ShaderCatalog::default();
    for (source, variant, types) in every_module() {
        let shader = CatalogShader {
            source,
            variant,
            types,
        };
        match why_not(&shader, features, &limits, subgroup, cooperative) {
            None => catalog.modules.push(shader),
            Some(reason) => catalog.skipped.push((shader, reason)),
        }
    }
    catalog
}

/// Why a device of `features` and `limits` (subgroups of one `subgroup` size, or not; the
/// cooperative matmul or not) is never asked to compile `shader`; `None` if it may be.
fn why_not(
    shader: &CatalogShader,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    subgroup: Option<u32>,
    cooperative: bool,
) -> Option<String> {
    match shader.variant {
        Variant::Coop { .. } if !cooperative => {
            return Some("needs cooperative matrices of 16x16x16 f16 (not offered)".into());
        }
        Variant::Coop { tiles, .. } => {
            if let Err(error) = tiles.check(limits) {
                return Some(format!("tile beyond the device's limits: {error}"));
            }
        }
        Variant::Narrow { subgroup: size, .. } if size != 0 && subgroup != Some(size) => {
            return Some(match subgroup {
                None => "needs subgroups of one fixed size (not offered)".into(),
                Some(offered) => format!("needs subgroups of {size} (the device's are {offered})"),
            });
        }
        Variant::Matmul { tiles, .. } => {
            if let Err(error) = tiles.check(limits) {
                return Some(format!("tile beyond the device's limits: {error}"));
            }
        }
        _ => {}
    }
    let storage = shader.source.storage_bindings() + shader.variant.extra_bindings();
    if storage > limits.max_storage_buffers_per_shader_stage as usize {
        return Some(format!(
            "{storage} storage bindings, beyond the device's {} (the op runs unfused there)",
            limits.max_storage_buffers_per_shader_stage
        ));
    }
    if shader.types.uses_f16() && !features.contains(wgpu::Features::SHADER_F16) {
        return Some("needs shader-f16 (not offered)".into());
    }
    None
}

/// The subgroup sizes of the narrow matmul's variants (0: none).
const NARROW_SUBGROUPS: [u32; 7] = [0, 4, 8, 16, 32, 64, 128];

/// Every tile the kernel takes ([`MatmulTiles::check`] on a device without limits): 8×8,
/// 16×8, 8×16, 4×8, 8×4, 4×16 or 16×4 outputs per invocation, 8 or 16 deep, 1, 2 or 4 loads of each tile.
pub(crate) fn every_tile() -> Vec<MatmulTiles> {
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
/// block tiles (`group_rows`, the value of one constant) with one tile. A residual in the
/// epilogue (one binding more, read by the stores: its code does not touch the tile's) with
/// one epilogue beside it, and the narrow matmul's layer-norm prologue for every rows and
/// lanes, split and not, with and without a residual, and with each subgroup size.
///
/// Each in f32, and those of [`f16_types`] in f16.
pub(crate) fn every_module() -> Vec<(Source, Variant, ElementTypes)> {
    let mut modules = vec![
        (Source::Unary, Variant::Plain),
        (Source::Binary, Variant::Plain),
        (Source::Rows, Variant::Plain),
        (Source::LayerNorm, Variant::Plain),
        (Source::AddLayerNorm, Variant::Plain),
        (Source::SoftmaxRows, Variant::Plain),
        (Source::Embedding, Variant::Plain),
        (Source::EmbeddingSum, Variant::Plain),
        (Source::ArgmaxRows, Variant::Plain),
        (Source::KvWrite, Variant::Plain),
        (Source::KvWriteQkv, Variant::Plain),
        (Source::PagedAttention, Variant::Plain),
        (Source::PagedAttentionVec4, Variant::Plain),
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
                                residual: false,
                                linear_grid,
                            };
                            modules.push((Source::Matmul, variant));
                            // The residual, with one epilogue, for the main tiles.
                            if bias
                                && activation == Activation::Gelu
                                && !linear_grid
                                && main_tiles.contains(&tiles)
                            {
                                let variant = Variant::Matmul {
                                    tiles,
                                    group_rows,
                                    vec4,
                                    edges,
                                    bias,
                                    activation,
                                    residual: true,
                                    linear_grid,
                                };
                                modules.push((Source::Matmul, variant));
                            }
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
                    residual: false,
                    norm: false,
                };
                modules.push((Source::MatmulNarrow, variant));
            }
            // The residual and the layer-norm prologue, with one epilogue; the prologue split
            // too (no epilogue: the reduction runs it).
            for (split, residual, norm) in [
                (false, true, false),
                (false, false, true),
                (false, true, true),
                (true, false, true),
            ] {
                let variant = Variant::Narrow {
                    rows,
                    lanes,
                    subgroup: 0,
                    split,
                    bias: !split,
                    activation: if split {
                        Activation::None
                    } else {
                        Activation::Gelu
                    },
                    residual,
                    norm,
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
                    // With subgroups, the layer-norm prologue (and a residual) beside.
                    let norms: &[bool] = if subgroup == 0 {
                        &[false]
                    } else {
                        &[false, true]
                    };
                    for &norm in norms {
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
                            residual: norm && !split,
                            norm,
                        };
                        modules.push((Source::MatmulNarrow, variant));
                    }
                }
            }
        }
    }
    for (bias, activation) in epilogues() {
        for residual in [false, true] {
            let variant = Variant::Reduce {
                bias,
                activation,
                residual,
            };
            modules.push((Source::MatmulReduce, variant));
        }
    }
    // The cooperative matmul runs on f16 operands only: its modules are listed below, f16 in.
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
        .chain(coop_modules())
        .collect()
}

/// Tiles beyond the named ones that the kernel takes (`CoopTiles::named` reads them from a
/// command line): the earlier 128×256 and 64×128 (eight and four subgroups), 256 rows, 16
/// subgroups of 64×32, subgroups of 32×64.
const OTHER_COOP_TILES: [&str; 6] = [
    "128x256/64x64",
    "64x128/32x64",
    "256x128/64x32",
    "256x128/64x64",
    "64x256/32x64",
    "128x128/32x64",
];

/// Every variant of the cooperative matmul: each named tile and [`OTHER_COOP_TILES`], vec4 and
/// scalar, with every
/// epilogue storing f16, and without one storing f32 partial products (split-K), of f16
/// operands; and of f32 operands rounded to f16 as they are staged
/// (`MatmulOptions::cooperative_f32_as_f16`), with every epilogue storing f32 (split-K's partial
/// products are the same f32 module without an epilogue).
fn coop_modules() -> Vec<(Source, Variant, ElementTypes)> {
    let f16 = ElementTypes::same(DType::F16);
    let partials = ElementTypes {
        input: DType::F16,
        output: DType::F32,
    };
    let mut modules = Vec::new();
    let others = OTHER_COOP_TILES.map(|name| CoopTiles::named(name).unwrap());
    for tiles in CoopTiles::ALL.into_iter().chain(others) {
        for vec4 in [false, true] {
            for bias in [false, true] {
                for activation in Activation::ALL {
                    let variant = Variant::Coop {
                        tiles,
                        vec4,
                        bias,
                        activation,
                        residual: false,
                        probe: None,
                    };
                    modules.push((Source::MatmulCoop, variant, f16));
                    if !bias && activation == Activation::None {
                        modules.push((Source::MatmulCoop, variant, partials));
                    }
                    modules.push((Source::MatmulCoop, variant, ElementTypes::F32));
                }
            }
            // A residual, with one epilogue.
            let variant = Variant::Coop {
                tiles,
                vec4,
                bias: true,
                activation: Activation::Gelu,
                residual: true,
                probe: None,
            };
            modules.push((Source::MatmulCoop, variant, f16));
            modules.push((Source::MatmulCoop, variant, ElementTypes::F32));
        }
    }
    // The diagnostic probes of each named tile (`CoopProbe`), vec4 and scalar, storing f16.
    for tiles in CoopTiles::ALL {
        for vec4 in [false, true] {
            for probe in CoopProbe::ALL {
                let variant = Variant::Coop {
                    tiles,
                    vec4,
                    bias: false,
                    activation: Activation::None,
                    residual: false,
                    probe: Some(probe),
                };
                modules.push((Source::MatmulCoop, variant, f16));
            }
        }
    }
    modules
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
        // Indices are stored as f32 whatever the input.
        Variant::Plain if source == Source::ArgmaxRows => vec![partials],
        Variant::Plain | Variant::Reduce { .. } => vec![f16],
        Variant::Matmul {
            tiles,
            group_rows,
            bias,
            activation,
            residual,
            ..
        } if MatmulTiles::ALL.contains(&tiles)
            && group_rows == MatmulOptions::default().group_rows =>
        {
            if !bias && activation == Activation::None && !residual {
                vec![f16, partials]
            } else {
                vec![f16]
            }
        }
        Variant::Matmul { .. } => vec![],
        Variant::Narrow { split, .. } => vec![if split { partials } else { f16 }],
        // Listed by `coop_modules`.
        Variant::Coop { .. } => vec![],
    }
}
