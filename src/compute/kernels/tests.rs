//! Tests of the kernels' WGSL (no GPU): every variant parses and validates with naga, reads the
//! parameters of its Rust twin, translates to SPIR-V, and unrolls what it should.

use std::mem::{offset_of, size_of};

use super::catalog::{every_module, every_tile};
use super::matmul::NARROW_STEPS;
use super::*;
use crate::compute::types::{
    narrow_sum_rows, Activation, CoopProbe, CoopTiles, DType, ElementwiseParams, EmbeddingParams,
    EmbeddingSumParams, KvWriteParams, LayerNormParams, MatmulOptions, MatmulParams, MatmulTiles,
    NarrowParams, PagedAttentionParams, ReduceParams, RowsParams, SoftmaxRowsParams,
};

/// A parameter struct as the test compares it: its name, `(member, offset, type)` in order,
/// and its size.
struct Layout {
    name: &'static str,
    members: Vec<(&'static str, usize, &'static str)>,
    size: usize,
}

/// The layout of a `#[repr(C)]` struct of `types/params.rs`, from the compiler.
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
        Source::Matmul | Source::MatmulCoop => layout!(MatmulParams {
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
            tiles: u32,
            m: u32,
            eps: f32,
            pad: u32,
        }),
        Source::MatmulReduce => layout!(ReduceParams {
            len: u32,
            n: u32,
            splits: u32,
            grid_x: u32,
        }),
        Source::LayerNorm | Source::AddLayerNorm => layout!(LayerNormParams {
            rows: u32,
            cols: u32,
            grid_x: u32,
            eps: f32,
        }),
        Source::SoftmaxRows => layout!(SoftmaxRowsParams {
            rows: u32,
            cols: u32,
            grid_x: u32,
            scale: f32,
            queries: u32,
            offset: u32,
            causal: u32,
            pad: u32,
        }),
        Source::EmbeddingSum => layout!(EmbeddingSumParams {
            len: u32,
            width: u32,
            rows: u32,
            grid_x: u32,
            position_rows: u32,
            fed: u32,
            pad0: u32,
            pad1: u32,
        }),
        Source::Embedding => layout!(EmbeddingParams {
            len: u32,
            width: u32,
            rows: u32,
            grid_x: u32,
            first: u32,
            fill: u32,
            pad0: u32,
            pad1: u32,
        }),
        Source::KvWrite | Source::KvWriteQkv => layout!(KvWriteParams {
            batch: u32,
            n_head: u32,
            head_dim: u32,
            block_tokens: u32,
            num_blocks: u32,
            max_blocks: u32,
            grid_x: u32,
            pad: u32,
        }),
        Source::PagedAttention | Source::PagedAttentionVec4 => layout!(PagedAttentionParams {
            batch: u32,
            n_head: u32,
            head_dim_parts: u32,
            block_tokens: u32,
            num_blocks: u32,
            max_blocks: u32,
            grid_x: u32,
            scale: f32,
        }),
        Source::Rows | Source::ArgmaxRows => layout!(RowsParams {
            rows: u32,
            cols: u32,
            grid_x: u32,
            aux: u32,
        }),
    }
}

/// Parses and validates `text` with naga; the error as naga prints it, with the source.
fn validate(text: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(text).map_err(|error| error.emit_to_string(text))?;
    // Subgroup operations, f16 and cooperative matrices are capabilities (the device's
    // SUBGROUP, SHADER_F16 and EXPERIMENTAL_COOPERATIVE_MATRIX features; only the cooperative
    // matmul uses the last).
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::default()
            | naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::COOPERATIVE_MATRIX,
    )
    .validate(&module)
    .map_err(|error| error.emit_to_string(text))?;
    Ok((module, info))
}

/// Checks that the module reads its parameters at binding 0 as a uniform of the struct of
/// `expected`'s name and layout, and has `storage` read-write storage bindings 1 to `storage`.
fn check_bindings(module: &naga::Module, expected: &Layout, storage: usize) -> Result<(), String> {
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
             `{}` {:?} of {} bytes in Rust (src/compute/types/params.rs)",
            expected.name, expected.members, expected.size
        ));
    }
    if expected.size > PARAMS_BYTES as usize {
        return Err(format!("{name} is larger than the uniform binding"));
    }
    Ok(())
}

/// Bytes of workgroup memory the module declares.
fn workgroup_bytes(module: &naga::Module) -> u32 {
    module
        .global_variables
        .iter()
        .filter(|(_, global)| global.space == naga::AddressSpace::WorkGroup)
        .map(|(_, global)| module.types[global.ty].inner.size(module.to_ctx()))
        .sum()
}

/// Checks that the module's workgroup memory is what the host checks against the device's
/// limit: a matmul tile's own count (its `check` compares that with the device's limit), and for
/// every other kernel, which runs whatever the device, at most WebGPU's default limit (16,384
/// bytes, `Limits::default`; the crate asks a device for no more).
fn check_workgroup_memory(module: &naga::Module, variant: &Variant) -> Result<(), String> {
    let bytes = workgroup_bytes(module);
    let (allowed, what) = match variant {
        Variant::Matmul { tiles, .. } => (tiles.workgroup_storage_bytes(), format!("tile {tiles}")),
        Variant::Coop { tiles, .. } => (tiles.workgroup_storage_bytes(), format!("tile {tiles}")),
        _ => (
            wgpu::Limits::default().max_compute_workgroup_storage_size,
            "WebGPU's default limit".to_string(),
        ),
    };
    if bytes > allowed {
        return Err(format!(
            "{bytes} bytes of workgroup memory, more than the {allowed} of {what}"
        ));
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
                            check_bindings(
                                &module,
                                &layout,
                                source.storage_bindings() + variant.extra_bindings(),
                            )?;
                            check_workgroup_memory(&module, variant)
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

/// No module makes a NaN from a constant expression: Tint (Chromium's compiler) evaluates
/// constant expressions when the module is created and refuses one that gives NaN, which naga
/// accepts (`shaders/common.wgsl`'s `quiet_nan` makes it at run time).
#[test]
fn no_module_makes_a_nan_from_a_constant_expression() {
    for (source, variant, types) in every_module() {
        let text = module_source(source, &variant, types);
        for pattern in [
            "bitcast<f32>(0x7f",
            "bitcast<f32>(0xff",
            "0.0 / 0.0",
            "0.0/0.0",
        ] {
            assert!(
                !text.contains(pattern),
                "{source:?}{}: `{pattern}` makes a NaN at compile time",
                variant.label()
            );
        }
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
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
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
            Variant::Plain | Variant::Reduce { .. } | Variant::Coop { .. } => true,
        });
    for (source, variant, types) in modules {
        let text = module_source(source, &variant, types);
        let (module, info) = validate(&text).unwrap_or_else(|error| panic!("{error}"));
        for checks in [ShaderChecks::Checked, ShaderChecks::Unchecked] {
            let mut options = spirv_options(checks);
            if source == Source::MatmulCoop {
                // What wgpu-hal 30 asks on a Vulkan 1.3 device with cooperative matrices (the
                // H200's): SPIR-V 1.6.
                options.lang_version = (1, 6);
            }
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
            residual: false,
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
        for (lanes, subgroup, shuffles, sum_rows) in [
            (8, 0, 0, 4),
            (4, 32, 3, 32),
            (1, 8, 3, 32),
            (16, 8, 0, 4),
            (16, 32, 1, 8),
        ] {
            let variant = Variant::Narrow {
                rows,
                lanes,
                subgroup,
                split: false,
                bias: true,
                activation: Activation::Gelu,
                residual: false,
                norm: false,
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
            // Shuffles: with a power of two of rows, those that scatter the rows (half of the
            // rows held at each) and the butterfly of the one row left; otherwise
            // log2(subgroup / lanes) per row.
            let scattered = shuffles > 0 && rows > 1 && rows.is_power_of_two();
            let expected = if scattered {
                let scatters = rows.min(1 << shuffles).trailing_zeros();
                (0..scatters).map(|j| rows >> (j + 1)).sum::<u32>() + shuffles - scatters
            } else {
                rows * shuffles
            };
            assert_eq!(
                text.matches("subgroupShuffleXor(").count() as u32,
                expected,
                "{rows} rows, {lanes} lanes, subgroup {subgroup}"
            );
            // Every row is reduced and stored once, in groups of as many as fit.
            assert_eq!(narrow_sum_rows(rows, lanes, subgroup), rows.min(sum_rows));
            let passes = rows.div_ceil(sum_rows);
            assert_eq!(text.matches("    reduce_and_store(").count() as u32, passes);
            if scattered {
                // Each invocation stores the rows it holds, in each pass.
                let held = (rows >> shuffles).max(1);
                assert!(text.contains("let row_base = "), "{rows} rows");
                assert_eq!(text.matches("] = held").count() as u32, held * passes);
            } else {
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
    // The shuffles of 16 rows: 8 + 4 + 2 that scatter them over 8 slices (48 to add every row in
    // every slice); 4 rows over 8 slices: 2 + 1, then 1 for the row left.
    let shuffles = |rows, lanes, subgroup| {
        let variant = Variant::Narrow {
            rows,
            lanes,
            subgroup,
            split: true,
            bias: false,
            activation: Activation::None,
            residual: false,
            norm: false,
        };
        module_source(Source::MatmulNarrow, &variant, ElementTypes::F32)
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .map(|code| code.matches("subgroupShuffleXor(").count())
            .sum::<usize>()
    };
    assert_eq!(shuffles(16, 4, 32), 14);
    assert_eq!(shuffles(16, 8, 32), 12);
    assert_eq!(shuffles(8, 4, 32), 7);
    assert_eq!(shuffles(4, 4, 32), 4);
    assert_eq!(shuffles(2, 4, 32), 3);
    assert_eq!(shuffles(3, 4, 32), 9);
    assert_eq!(shuffles(16, 32, 32), 0);
}

#[test]
fn coop_fragments_products_and_epilogue_are_unrolled_with_bound_indices() {
    for tiles in CoopTiles::ALL {
        let variant = Variant::Coop {
            tiles,
            vec4: true,
            bias: true,
            activation: Activation::Gelu,
            residual: false,
            probe: None,
        };
        let text = module_source(Source::MatmulCoop, &variant, ElementTypes::same(DType::F16));
        assert!(text.starts_with("enable wgpu_cooperative_matrix;\nenable f16;\n"));
        let accumulators = (tiles.wm / 16) * (tiles.wn / 16);
        let steps = tiles.bk / 16;
        // The code, without the comments (which name the functions too).
        let code: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let count = |pattern: &str| code.matches(pattern).count() as u32;
        assert_eq!(count("coop_mat16x16<f32, C>()"), accumulators, "{tiles}");
        assert_eq!(count("coopMultiplyAdd("), accumulators * steps, "{tiles}");
        assert_eq!(
            count("coopLoadT<coop_mat16x16<f16, A>>"),
            steps * tiles.wm / 16
        );
        assert_eq!(
            count("coopLoadT<coop_mat16x16<f16, B>>"),
            steps * tiles.wn / 16
        );
        assert_eq!(count("coopStoreT("), accumulators, "{tiles}");
        // naga 30 pitfall: every cooperative load's and store's pointer index and stride are
        // `let`s (a name, not an expression).
        for line in code
            .lines()
            .filter(|line| line.contains("coopLoadT<") || line.contains("coopStoreT("))
        {
            let args = &line[line.find('&').expect("a pointer argument") + 1..];
            let index = &args[args.find('[').unwrap() + 1..args.find(']').unwrap()];
            let stride = args[args.find(',').unwrap() + 1..args.rfind(')').unwrap()].trim();
            let is_name = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            assert!(is_name(index) && is_name(stride), "{line}");
        }
    }
}

#[test]
fn coop_of_f32_operands_enables_f16_and_rounds_them_as_it_fetches() {
    // `MatmulOptions::cooperative_f32_as_f16`: f32 storage, f16 fragments.
    for vec4 in [false, true] {
        let variant = Variant::Coop {
            tiles: CoopTiles::ALL[0],
            vec4,
            bias: true,
            activation: Activation::Gelu,
            residual: false,
            probe: None,
        };
        let text = module_source(Source::MatmulCoop, &variant, ElementTypes::F32);
        assert!(
            text.starts_with("enable wgpu_cooperative_matrix;\nenable f16;\n"),
            "{vec4}"
        );
        assert!(text.contains("alias Input = f32;\nalias Output = f32;\n"));
        // The slabs and fragments stay f16: the operands are rounded in load_a4 and load_b4.
        assert!(text.contains("var<workgroup> tile_a: array<vec4<f16>"));
        assert!(text.contains("coopLoadT<coop_mat16x16<f16, A>>"));
        validate(&text).unwrap_or_else(|error| panic!("{error}"));
    }
}

#[test]
fn coop_probes_leave_out_of_the_loop_what_they_name() {
    let tiles = CoopTiles::T128X128;
    // The loop over the slabs of K of the entry point: from its `for` to the epilogue.
    let body = |probe: Option<CoopProbe>| {
        let variant = Variant::Coop {
            tiles,
            vec4: true,
            bias: false,
            activation: Activation::None,
            residual: false,
            probe,
        };
        let text = module_source(Source::MatmulCoop, &variant, ElementTypes::same(DType::F16));
        let entry = &text[text.find("fn matmul_coop(").unwrap()..];
        let begin = entry.find("for (var t = 0u; t < slabs; t++)").unwrap();
        let end = entry.find("// The epilogue").unwrap();
        entry[begin..end].to_string()
    };
    let fragments = (tiles.bk / 16) * (tiles.wm / 16 + tiles.wn / 16);
    let products = (tiles.bk / 16) * (tiles.wm / 16) * (tiles.wn / 16);
    // (fetches, stagings, barriers, fragment loads) in the loop; the products are all there.
    let expected = [
        (None, (1, 1, 2, fragments)),
        (Some(CoopProbe::NoGlobalLoads), (0, 1, 2, fragments)),
        (Some(CoopProbe::NoStaging), (0, 0, 2, fragments)),
        (Some(CoopProbe::ProductsOnly), (0, 0, 0, 0)),
    ];
    for (probe, (fetches, stagings, barriers, loads)) in expected {
        let body = body(probe);
        let count = |pattern: &str| body.matches(pattern).count() as u32;
        let found = (
            count("fetch("),
            count("stage("),
            count("workgroupBarrier()"),
            count("coopLoadT<"),
        );
        assert_eq!(found, (fetches, stagings, barriers, loads), "{probe:?}");
        assert_eq!(count("coopMultiplyAdd("), products, "{probe:?}");
    }
}
