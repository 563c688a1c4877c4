//! The rules' plans on described devices (no GPU): the H200, WebGPU's default limits, lavapipe,
//! and a device with cooperative matrices. The expectations are read from the rules of
//! [`crate::compute::ops::matmul`] (module docs), worked out by hand for each shape below; the
//! GPU tests check that a context's plans are these functions' for its own device.

use super::*;
use crate::compute::types::{Autotune, CoopProbe};

/// The rules' options: the default ones (tuning is not the rules' business).
fn rules() -> MatmulOptions {
    MatmulOptions::default()
}

/// An NVIDIA H200 under Vulkan as `request_gpu` opens it (the adapter's limits).
fn h200() -> DeviceCaps {
    let limits = wgpu::Limits {
        max_buffer_size: 4_292_870_144,
        max_storage_buffer_binding_size: 2_147_483_644,
        min_storage_buffer_offset_alignment: 32,
        max_compute_workgroup_storage_size: 49_152,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        max_compute_workgroup_size_y: 1024,
        max_compute_workgroup_size_z: 64,
        max_compute_workgroups_per_dimension: 65_535,
        ..wgpu::Limits::default()
    };
    DeviceCaps {
        max_grid_x: limits.max_compute_workgroups_per_dimension,
        limits,
        features: wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY,
        cooperative_16x16_f16: false,
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        device_type: wgpu::DeviceType::DiscreteGpu,
        backend: wgpu::Backend::Vulkan,
        vendor: 0x10de,
        device: 0x2335,
        name: "NVIDIA H200".into(),
    }
}

/// A GPU in a browser with WebGPU's default limits and no optional feature.
fn webgpu() -> DeviceCaps {
    let limits = wgpu::Limits::default();
    DeviceCaps {
        max_grid_x: limits.max_compute_workgroups_per_dimension,
        limits,
        features: wgpu::Features::empty(),
        cooperative_16x16_f16: false,
        subgroup_min_size: 0,
        subgroup_max_size: 0,
        device_type: wgpu::DeviceType::DiscreteGpu,
        backend: wgpu::Backend::BrowserWebGpu,
        vendor: 0,
        device: 0,
        name: "WebGPU".into(),
    }
}

/// Mesa's lavapipe (a software Vulkan device) as the tests open it (Mesa 22.3.6, LLVM 15, 256-bit
/// vectors): subgroups of a fixed 8 invocations, 32 KiB of workgroup memory, 1024 invocations.
fn lavapipe() -> DeviceCaps {
    let limits = wgpu::Limits {
        max_buffer_size: 2_147_483_647,
        max_storage_buffer_binding_size: 134_217_728,
        min_storage_buffer_offset_alignment: 32,
        max_compute_workgroup_storage_size: 32_768,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        max_compute_workgroup_size_y: 1024,
        max_compute_workgroup_size_z: 1024,
        max_compute_workgroups_per_dimension: 65_535,
        ..wgpu::Limits::default()
    };
    DeviceCaps {
        max_grid_x: limits.max_compute_workgroups_per_dimension,
        limits,
        features: wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
        cooperative_16x16_f16: false,
        subgroup_min_size: 8,
        subgroup_max_size: 8,
        device_type: wgpu::DeviceType::Cpu,
        backend: wgpu::Backend::Vulkan,
        vendor: 0x10005,
        device: 0,
        name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
    }
}

/// The H200 opened with cooperative matrices (`GpuOptions::cooperative_matrix`; its driver
/// offers 16×16×16 f16 → f32, measured, MEASUREMENTS.md).
fn cooperative() -> DeviceCaps {
    let mut caps = h200();
    caps.features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    caps.cooperative_16x16_f16 = true;
    caps
}

/// Shapes (M, N, K) of every kind: narrow, thin, small with and without split-K, large, odd,
/// scalar, beyond the kernels' parameters and beyond the grid.
fn shapes() -> Vec<(usize, usize, usize)> {
    let sizes = [
        1,
        3,
        4,
        8,
        9,
        17,
        32,
        33,
        64,
        100,
        257,
        1024,
        4096,
        16_384,
        1 << 20,
    ];
    let mut shapes = Vec::new();
    for m in sizes {
        for n in sizes {
            for k in sizes {
                shapes.push((m, n, k));
            }
        }
    }
    shapes.extend([(1 << 31, 1 << 31, 1), (1, 1024, 1 << 36), (0, 4, 4)]);
    shapes
}

/// The plan of `(m, n, k)` under the default options, unwrapped.
fn plan_of(caps: &DeviceCaps, (m, n, k): (usize, usize, usize)) -> MatmulPlan {
    plan(&rules(), caps, m, n, k).unwrap_or_else(|e| panic!("{m}x{n}x{k}: {e}"))
}

/// The tiled plan `(tiles, splits, k_chunk, workgroups)` of a shape.
fn tiled(plan: MatmulPlan) -> (MatmulTiles, u32, u32, [u32; 3]) {
    assert_eq!(plan.narrow_lanes, 0, "{plan:?}");
    (plan.tiles, plan.splits, plan.k_chunk, plan.workgroups)
}

/// The narrow plan `(lanes, splits, k_chunk, workgroups, subgroup)` of a shape.
fn narrow(plan: MatmulPlan) -> (u32, u32, u32, [u32; 3], u32) {
    assert!(plan.narrow_lanes > 0, "{plan:?}");
    assert!(plan.vec4 && !plan.edges, "{plan:?}");
    (
        plan.narrow_lanes,
        plan.splits,
        plan.k_chunk,
        plan.workgroups,
        plan.narrow_subgroup,
    )
}

#[test]
fn the_h200_takes_the_48_kib_tile_the_thin_tile_and_subgroups_of_32() {
    let caps = h200();
    let large = MatmulTiles::T128X256X16_8X16;
    assert_eq!(rules().large_tile(&caps.limits), Some(large));
    // 4096²: 32 × 16 = 512 large tiles (at least 264): no split.
    let square = plan_of(&caps, (4096, 4096, 4096));
    assert_eq!(tiled(square), (large, 1, 4096, [16, 32, 1]));
    assert!(square.vec4 && !square.edges);
    // 64 rows: 16 large tiles, past the thin tile's 32 rows: 64 small tiles, K split
    // ⌊528 / 64⌋ = 8 ways of 512.
    let small = MatmulTiles::T64X64X8;
    assert_eq!(
        tiled(plan_of(&caps, (64, 4096, 4096))),
        (small, 8, 512, [64, 1, 8])
    );
    // 32 rows: the thin tile (20 KiB), 32 of them, K split ⌊528 / 32⌋ = 16 ways of 256.
    let thin = MatmulTiles::T32X128X16_4X8;
    assert_eq!(
        tiled(plan_of(&caps, (32, 4096, 4096))),
        (thin, 16, 256, [32, 1, 16])
    );
    assert_eq!(plan_of(&caps, (33, 4096, 4096)).tiles, small);
    // 100 × 3200: 100 small tiles, ⌊528 / 100⌋ = 5 ways (K of 4096 in chunks of 824).
    assert_eq!(
        tiled(plan_of(&caps, (100, 3200, 4096))),
        (small, 5, 824, [50, 2, 5])
    );
    // 192 × 5120: 240 small tiles, 2 ways.
    assert_eq!(plan_of(&caps, (192, 5120, 4096)).splits, 2);
    // Shallow K is not split below min_split_depth.
    assert_eq!(plan_of(&caps, (64, 64, 300)).splits, 1);
    // Few rows: the narrow kernel, as its module docs say. 8 × 1024 × 1024 and 1 × 1024 × 1024:
    // 2 lanes, 128 workgroups, no split, subgroups of 32 (wider than the lanes).
    for m in [1, 8] {
        assert_eq!(
            narrow(plan_of(&caps, (m, 1024, 1024))),
            (2, 1, 1024, [128, 1, 1], 32)
        );
    }
    // 1 × 4096 × 4096 and 8 × 4096 × 4096: 4 lanes, 256 workgroups.
    for m in [1, 8] {
        assert_eq!(
            narrow(plan_of(&caps, (m, 4096, 4096))),
            (4, 1, 4096, [256, 1, 1], 32)
        );
    }
    // 3 × 16384 × 64: 2 lanes over 8 workgroups along N, K split 4 ways.
    assert_eq!(
        narrow(plan_of(&caps, (3, 64, 16_384))),
        (2, 4, 4096, [8, 1, 4], 32)
    );
}

#[test]
fn webgpu_defaults_take_the_16_kib_tile_and_no_subgroups() {
    let caps = webgpu();
    let large = MatmulTiles::T128X128X8_16X8;
    assert_eq!(rules().large_tile(&caps.limits), Some(large));
    // 32 × 32 = 1024 large tiles: no split.
    assert_eq!(
        tiled(plan_of(&caps, (4096, 4096, 4096))),
        (large, 1, 4096, [32, 32, 1])
    );
    // The thin tile needs 20 KiB of the 16: 32 rows take the small tile, split 8 ways.
    let small = MatmulTiles::T64X64X8;
    assert_eq!(
        tiled(plan_of(&caps, (32, 4096, 4096))),
        (small, 8, 512, [64, 1, 8])
    );
    // The narrow kernel without subgroups: workgroup memory only.
    assert_eq!(
        narrow(plan_of(&caps, (8, 1024, 1024))),
        (2, 1, 1024, [128, 1, 1], 0)
    );
    // K is not split where its partial products would not fit WebGPU's 128 MiB binding: the
    // large tile fills the GPU here, and the split is forced.
    let forced = MatmulOptions {
        split_k: Some(4),
        ..rules()
    };
    // 2048 × 4096 × 4 bytes is 32 MiB a split: 3 of them fit (4 would fill 128 MiB and the
    // 16 bytes of rounding more).
    let wide = plan(&forced, &caps, 2048, 4096, 1024).unwrap();
    assert_eq!((wide.splits, wide.k_chunk), (3, 344), "{wide:?}");
}

#[test]
fn lavapipe_plans_for_a_software_gpu() {
    let caps = lavapipe();
    // 32 KiB of workgroup memory: the 16 KiB large tile, and the thin one.
    let large = MatmulTiles::T128X128X8_16X8;
    assert_eq!(rules().large_tile(&caps.limits), Some(large));
    assert_eq!(plan_of(&caps, (32, 4096, 4096)).tiles, rules().thin_tiles);
    // A software GPU: the narrow kernel takes 64 lanes (or what N needs) and never splits.
    assert_eq!(
        narrow(plan_of(&caps, (8, 1024, 1024))),
        (64, 1, 1024, [4, 1, 1], 0)
    );
    assert_eq!(narrow(plan_of(&caps, (3, 64, 16_384))).1, 1);
    // Three vec4 columns: 4 lanes, and subgroups of 8, wider than them, add the slices.
    assert_eq!(
        narrow(plan_of(&caps, (2, 12, 64))),
        (4, 1, 64, [1, 1, 1], 8)
    );
    // Without the option, none.
    let without = MatmulOptions {
        narrow_subgroups: false,
        ..rules()
    };
    let plan = plan(&without, &caps, 2, 12, 64).unwrap();
    assert_eq!(plan.narrow_subgroup, 0);
}

/// No cooperative-matrix kernel exists yet: a device that offers cooperative matrices gets
/// exactly the plans it would get without them. When one lands, this test changes with the rule
/// that chooses it.
/// The cooperative plan `(tiles, splits, k_chunk, workgroups)` of an f16 shape on `caps`.
fn coop(caps: &DeviceCaps, (m, n, k): (usize, usize, usize)) -> (CoopTiles, u32, u32, [u32; 3]) {
    let plan = plan_for(&rules(), caps, DType::F16, m, n, k)
        .unwrap_or_else(|e| panic!("{m}x{n}x{k}: {e}"));
    let tiles = plan
        .cooperative
        .unwrap_or_else(|| panic!("{m}x{n}x{k}: {plan:?}"));
    (tiles, plan.splits, plan.k_chunk, plan.workgroups)
}

#[test]
fn cooperative_matrices_take_f16_products_of_16_rows_and_more() {
    let caps = cooperative();
    assert!(caps.cooperative_f16());
    // 4096³: 16 × 32 tiles of 128×256, the largest, fill the GPU, no split.
    assert_eq!(
        coop(&caps, (4096, 4096, 4096)),
        (CoopTiles::T128X256, 1, 4096, [16, 32, 1])
    );
    // 512 rows: 64 tiles of 128×256 and 128 of 128×128 are fewer than 132; 256 of 64×128 are not.
    assert_eq!(
        coop(&caps, (512, 4096, 4096)),
        (CoopTiles::T64X128, 1, 4096, [32, 8, 1])
    );
    // 256 rows: 128 tiles of 64×128 are fewer than 132; 4 × 64 of 64×64 are not.
    assert_eq!(
        coop(&caps, (256, 4096, 4096)),
        (CoopTiles::T64X64, 1, 4096, [64, 4, 1])
    );
    // 64 rows: 64 tiles of 64×64, K split 5 ways (⌈264 / 64⌉) in chunks of 832 (26 slabs).
    assert_eq!(
        coop(&caps, (64, 4096, 4096)),
        (CoopTiles::T64X64, 5, 832, [64, 1, 5])
    );
    // At most 32 rows: 32×128, 32 tiles, K split 9 ways in chunks of 480.
    assert_eq!(
        coop(&caps, (16, 4096, 4096)),
        (CoopTiles::T32X128, 9, 480, [32, 1, 9])
    );
    assert_eq!(
        coop(&caps, (32, 4096, 4096)),
        (CoopTiles::T32X128, 9, 480, [32, 1, 9])
    );
    // Odd shapes: scalar bindings, masked edges; K shorter than a split's depth stays whole.
    let chosen = plan_for(&rules(), &caps, DType::F16, 37, 129, 70).unwrap();
    assert_eq!(chosen.cooperative, Some(CoopTiles::T64X64));
    assert_eq!((chosen.vec4, chosen.edges, chosen.splits), (false, true, 1));
    assert_eq!(chosen.workgroups, [3, 1, 1]);
    let chosen = plan_for(&rules(), &caps, DType::F16, 256, 512, 512).unwrap();
    assert_eq!(chosen.cooperative, Some(CoopTiles::T64X64));
    assert!(chosen.vec4 && !chosen.edges);
    // Fewer than 16 rows, and every f32 product: the portable kernels, as without the feature.
    for (m, n, k) in shapes() {
        if m < 16 {
            assert_eq!(
                plan_for(&rules(), &caps, DType::F16, m, n, k),
                plan(&rules(), &caps, m, n, k),
                "{m}x{n}x{k}"
            );
        }
        assert_eq!(
            plan_for(&rules(), &caps, DType::F32, m, n, k),
            plan(&rules(), &h200(), m, n, k),
            "{m}x{n}x{k}"
        );
    }
    // Asked for at 1 row with a forced tile.
    let forced = MatmulOptions {
        cooperative_tiles: Some(CoopTiles::T128X256),
        ..rules()
    };
    let chosen = plan_for(&forced, &caps, DType::F16, 1, 17, 33).unwrap();
    assert_eq!(chosen.cooperative, Some(CoopTiles::T128X256));
    assert_eq!(chosen.workgroups, [1, 1, 1]);
}

#[test]
fn devices_without_cooperative_matrices_plan_f16_as_before() {
    // The feature without 16×16×16 f16 → f32, without f16, or with subgroups other than 32; the
    // H200 opened without the feature; lavapipe; WebGPU; and the option off.
    let mut no_config = cooperative();
    no_config.cooperative_16x16_f16 = false;
    let mut no_f16 = cooperative();
    no_f16.features.remove(wgpu::Features::SHADER_F16);
    let mut subgroups_64 = cooperative();
    (
        subgroups_64.subgroup_min_size,
        subgroups_64.subgroup_max_size,
    ) = (64, 64);
    let mut varying = cooperative();
    varying.subgroup_min_size = 16;
    let off = MatmulOptions {
        cooperative: false,
        ..rules()
    };
    let profiles = [
        (no_config, rules()),
        (no_f16, rules()),
        (subgroups_64, rules()),
        (varying, rules()),
        (h200(), rules()),
        (lavapipe(), rules()),
        (webgpu(), rules()),
        (cooperative(), off),
    ];
    for (caps, options) in profiles {
        for (m, n, k) in shapes() {
            assert_eq!(
                plan_for(&options, &caps, DType::F16, m, n, k),
                plan(&options, &caps, m, n, k),
                "{}: {m}x{n}x{k}",
                caps.name
            );
        }
    }
}

#[test]
fn cooperative_tiles_follow_the_devices_workgroup_memory() {
    // Cooperative matrices within WebGPU's 16 KiB of workgroup memory: 128×128 (22.5 KiB) does
    // not fit, 64×64 serves; forcing it is a typed error.
    let mut small = cooperative();
    small.limits.max_compute_workgroup_storage_size = 16_384;
    assert_eq!(coop(&small, (4096, 4096, 4096)).0, CoopTiles::T64X64);
    // 24 KiB: the largest that fits, 128×128 (128×256 takes 42.5 KiB).
    let mut medium = cooperative();
    medium.limits.max_compute_workgroup_storage_size = 24_576;
    assert_eq!(coop(&medium, (4096, 4096, 4096)).0, CoopTiles::T128X128);
    // 256 invocations a workgroup: 128×256 (16 subgroups, 512) does not fit, 128×128 serves.
    let mut fewer = cooperative();
    fewer.limits.max_compute_invocations_per_workgroup = 256;
    fewer.limits.max_compute_workgroup_size_x = 256;
    assert_eq!(coop(&fewer, (4096, 4096, 4096)).0, CoopTiles::T128X128);
    let forced = MatmulOptions {
        cooperative_tiles: Some(CoopTiles::T128X128),
        ..rules()
    };
    assert!(matches!(
        plan_for(&forced, &small, DType::F16, 4096, 4096, 4096),
        Err(ComputeError::Config(_))
    ));
    // A tile the kernel does not take is refused by the options' validation.
    let odd = MatmulOptions {
        cooperative_tiles: Some(CoopTiles::new(128, 128, 24, 64)),
        ..rules()
    };
    assert!(odd.validate(&small.limits).is_err());
    assert!(forced.validate(&small.limits).is_ok());
    // A diagnostic probe times one plan: refused with a tuner, taken without one.
    let probe = MatmulOptions {
        cooperative_probe: Some(CoopProbe::NoStaging),
        ..rules()
    };
    assert!(matches!(
        probe.validate(&small.limits),
        Err(ComputeError::Config(_))
    ));
    let untuned = MatmulOptions {
        autotune: Autotune::Off,
        ..probe
    };
    assert!(untuned.validate(&small.limits).is_ok());
}

#[test]
fn every_profile_gives_a_plan_or_a_typed_error_within_its_limits() {
    let profiles = [h200(), webgpu(), lavapipe(), cooperative()];
    for (caps, dtype) in profiles
        .into_iter()
        .flat_map(|caps| [(caps.clone(), DType::F32), (caps, DType::F16)])
    {
        for (m, n, k) in shapes() {
            let Ok(plan) = plan_for(&rules(), &caps, dtype, m, n, k) else {
                continue;
            };
            if let Some(tiles) = plan.cooperative {
                assert!(tiles.check(&caps.limits).is_ok(), "{plan:?}");
                assert_eq!(plan.k_chunk % tiles.bk, 0);
                assert_eq!(plan.narrow_lanes, 0);
            }
            let max = caps.limits.max_compute_workgroups_per_dimension;
            assert!(plan.workgroups.iter().all(|&w| (1..=max).contains(&w)));
            assert!(plan.workgroups[0] <= caps.max_grid_x);
            assert_eq!(plan.splits, plan.workgroups[2]);
            assert!(
                plan.k_chunk > 0 && u64::from(plan.k_chunk) * u64::from(plan.splits) >= k as u64
            );
            if plan.narrow_lanes == 0 && plan.cooperative.is_none() {
                assert!(plan.tiles.check(&caps.limits).is_ok(), "{plan:?}");
                assert_eq!(plan.k_chunk % plan.tiles.bk, 0);
            }
            if plan.splits > 1 {
                let partial_bytes = (m * n * plan.splits as usize * 4) as u64;
                assert!(partial_bytes <= caps.limits.max_storage_buffer_binding_size);
            }
        }
    }
}

#[test]
fn a_capped_grid_lays_tiles_over_rows_of_linear_ids() {
    // At most 7 workgroups along x: 8 × 8 small tiles laid out as 64 ids in 10 rows of 7.
    let caps = h200().with_max_grid_x(Some(7));
    assert_eq!(caps.max_grid_x, 7);
    let forced = MatmulOptions {
        tiles: Some(MatmulTiles::T64X64X8),
        split_k: Some(1),
        ..rules()
    };
    let plan = plan(&forced, &caps, 512, 512, 64).unwrap();
    assert_eq!(plan.workgroups, [7, 10, 1]);
    // A cap above the device's limit is the device's limit.
    assert_eq!(h200().with_max_grid_x(Some(1 << 20)).max_grid_x, 65_535);
}

#[test]
fn matmul_plans_cover_vec4_edges_and_exact_tiles() {
    let forced = MatmulOptions {
        tiles: Some(MatmulTiles::T128X128X8),
        split_k: Some(1),
        ..rules()
    };
    for caps in [h200(), webgpu(), lavapipe()] {
        let plan = |m, k, n| plan(&forced, &caps, m, n, k).unwrap();
        let exact_tiles = plan(128, 64, 128);
        assert!(exact_tiles.vec4 && !exact_tiles.edges, "{exact_tiles:?}");
        let vec4_edges = plan(20, 44, 36);
        assert!(vec4_edges.vec4 && vec4_edges.edges, "{vec4_edges:?}");
        let scalar = plan(257, 511, 129);
        assert!(!scalar.vec4 && scalar.edges, "{scalar:?}");
        assert_eq!(scalar.workgroups, [2, 3, 1]);
    }
}

#[test]
fn narrow_plans_apply_only_to_few_rows_with_vec4_rows() {
    for caps in [h200(), webgpu(), lavapipe()] {
        let software = caps.is_software();
        let plan = |m, k, n| plan(&rules(), &caps, m, n, k).unwrap();
        assert!(plan(8, 1024, 1024).narrow_lanes > 0);
        assert_eq!(plan(8, 1024, 1024).workgroups[1..], [1, 1]);
        // More rows than the narrow kernel takes, or rows that are not whole vec4s, take the
        // tiled kernel.
        let past = MatmulOptions::NARROW_MAX_ROWS as usize + 1;
        for (m, k, n) in [(past, 1024, 1024), (8, 1022, 1024), (8, 1024, 1022)] {
            assert_eq!(plan(m, k, n).narrow_lanes, 0, "{m}x{k}x{n}");
        }
        // Automatic lanes: on a GPU the most columns per workgroup (up to 64) that still give
        // min_workgroups / 2 workgroups, at least 2; on a software GPU 64; never more than N
        // needs.
        let lanes = plan(4, 256, 4096).narrow_lanes as usize;
        if software {
            assert_eq!(lanes, 64);
        } else {
            let wanted = (rules().min_workgroups / 2) as usize;
            assert!((2..=64).contains(&lanes), "{lanes}");
            assert!(lanes == 2 || 4096 / 4 / lanes >= wanted, "{lanes}");
            assert!(
                lanes == 64 || (4096usize / 4).div_ceil(2 * lanes) < wanted,
                "{lanes}"
            );
        }
        assert_eq!(plan(2, 64, 12).narrow_lanes, if software { 4 } else { 2 });
        if !software {
            assert_eq!(plan(8, 1024, 1024).narrow_lanes, 2);
        }
        assert_eq!(plan(2, 64, 4).narrow_lanes, 1);
        // Automatic split along K: never on a software GPU, nor where a quarter of the GPU is
        // busy along N or K is shallow; on a GPU for deep K on few columns.
        assert_eq!(plan(8, 1024, 1024).splits, 1);
        assert_eq!(plan(1, 4096, 4096).splits, 1);
        assert_eq!(plan(4, 4096, 1024).splits, 1);
        assert_eq!(plan(3, 256, 64).splits, 1);
        let deep = plan(3, 16384, 64);
        if software {
            assert_eq!(deep.splits, 1, "{deep:?}");
        } else {
            assert!(deep.splits > 1, "{deep:?}");
            assert!(deep.splits <= rules().max_splits, "{deep:?}");
        }
        // Forced tiles, or narrow_max_rows 0, turn it off.
        for options in [
            MatmulOptions {
                tiles: Some(MatmulTiles::T64X64X8),
                ..rules()
            },
            MatmulOptions {
                narrow_max_rows: 0,
                ..rules()
            },
        ] {
            let other = super::plan(&options, &caps, 8, 1024, 1024).unwrap();
            assert_eq!(other.narrow_lanes, 0);
        }
    }
}

#[test]
fn narrow_row_groups_multiply_the_workgroups_where_they_divide_the_rows() {
    for caps in [h200(), webgpu(), lavapipe()] {
        let grouped = |groups, m| {
            let options = MatmulOptions {
                narrow_lanes: Some(4),
                narrow_splits: Some(1),
                narrow_row_groups: Some(groups),
                ..rules()
            };
            narrow_plan(&options, &caps, m, 2304, 768).unwrap()
        };
        // 2304 / 4 / 4 = 144 tiles along N, for each group of rows.
        assert_eq!(grouped(1, 16).narrow_row_groups, 1);
        assert_eq!(grouped(1, 16).workgroups, [144, 1, 1]);
        assert_eq!(grouped(4, 16).narrow_row_groups, 4);
        assert_eq!(grouped(4, 16).workgroups, [576, 1, 1]);
        assert_eq!(grouped(2, 12).workgroups, [288, 1, 1]);
        // A number of groups that does not divide M counts as 1.
        assert_eq!(grouped(4, 6).narrow_row_groups, 1);
        assert_eq!(grouped(4, 6).workgroups, [144, 1, 1]);
        // The rules' plan keeps all rows in each workgroup.
        assert_eq!(
            plan(&rules(), &caps, 16, 2304, 768)
                .unwrap()
                .narrow_row_groups,
            1
        );
        // The tuner's candidates: groups of rows only from 8 rows, and only where they divide M.
        let shape = (16, 2304, 768);
        let automatic = narrow_plan(&rules(), &caps, shape.0, shape.1, shape.2).unwrap();
        let plans = narrow_candidate_plans(&rules(), &caps, shape, automatic);
        let groups: Vec<u32> = plans.iter().map(|plan| plan.narrow_row_groups).collect();
        for wanted in [1, 2, 4] {
            assert!(groups.contains(&wanted), "{groups:?}");
        }
        let few = (4, 2304, 768);
        let automatic = narrow_plan(&rules(), &caps, few.0, few.1, few.2).unwrap();
        let plans = narrow_candidate_plans(&rules(), &caps, few, automatic);
        assert!(plans.iter().all(|plan| plan.narrow_row_groups == 1));
        let odd = (9, 2304, 768);
        let automatic = narrow_plan(&rules(), &caps, odd.0, odd.1, odd.2).unwrap();
        let plans = narrow_candidate_plans(&rules(), &caps, odd, automatic);
        assert!(plans.iter().all(|plan| plan.narrow_row_groups == 1));
    }
}

#[test]
fn narrow_options_out_of_range_are_config_errors() {
    for options in [
        MatmulOptions {
            narrow_lanes: Some(3),
            ..rules()
        },
        MatmulOptions {
            narrow_lanes: Some(512),
            ..rules()
        },
        MatmulOptions {
            narrow_max_rows: MatmulOptions::NARROW_MAX_ROWS + 1,
            ..rules()
        },
        MatmulOptions {
            narrow_splits: Some(0),
            ..rules()
        },
        MatmulOptions {
            narrow_row_groups: Some(0),
            ..rules()
        },
        MatmulOptions {
            narrow_row_groups: Some(MatmulOptions::NARROW_MAX_ROWS + 1),
            ..rules()
        },
    ] {
        for caps in [h200(), webgpu(), lavapipe()] {
            let result = options.validate(&caps.limits);
            assert!(matches!(result, Err(ComputeError::Config(_))), "{result:?}");
        }
    }
}

#[test]
fn plans_beyond_the_kernels_u32_parameters_are_typed_errors() {
    // K of 2^36: no split of at most 16 ways brings it within a u32 (the plans used to truncate
    // the depth per split to 0).
    let k = 1usize << 36;
    for caps in [h200(), webgpu(), lavapipe()] {
        for m in [1, 8, 64, 4096] {
            let result = plan(&rules(), &caps, m, 1024, k);
            let overflows = matches!(result, Err(ComputeError::ParameterOverflow { .. }));
            assert!(overflows, "{m}x{k}x1024: {result:?}");
        }
        for (m, n, k) in [
            (1 << 31, 1 << 31, 1),
            (1 << 40, 1 << 40, 1),
            (0, 4, 4),
            (4, 4, 0),
        ] {
            let result = plan(&rules(), &caps, m, n, k);
            assert!(result.is_err(), "{m}x{n}x{k}: {result:?}");
        }
    }
}

#[test]
fn the_tuners_candidates_start_with_the_rules_plan_and_fit_the_device() {
    for caps in [h200(), webgpu(), lavapipe()] {
        let shape = (64, 4096, 4096);
        let automatic = tiled_plan(&rules(), &caps, shape.0, shape.1, shape.2).unwrap();
        let plans = tiled_candidates(&rules(), &caps, shape, automatic);
        assert_eq!(plans[0], automatic);
        assert!(plans.len() > 5, "{}", plans.len());
        for plan in &plans {
            assert!(plan.tiles.check(&caps.limits).is_ok());
            assert!(plan.splits == 1 || plan.k_chunk >= rules().min_split_depth);
        }
        let shape = (8, 4096, 4096);
        let automatic = narrow_plan(&rules(), &caps, shape.0, shape.1, shape.2).unwrap();
        let plans = narrow_candidate_plans(&rules(), &caps, shape, automatic);
        assert_eq!(plans[0], automatic);
        for (i, plan) in plans.iter().enumerate() {
            assert!(plan.narrow_lanes > 0);
            assert!(!plans[..i].contains(plan), "twice: {plan:?}");
        }
    }
}

#[test]
fn narrow_candidates_fill_the_gpu_without_empty_slices() {
    // 1 × 4096 × 4096 with the H200's 264: the plans measured fastest at 8 rows are there.
    let candidates = narrow_candidates(1024, 1024, 1, 264);
    for wanted in [
        (2, 1),
        (4, 1),
        (16, 4),
        (32, 8),
        (32, 16),
        (64, 16),
        (128, 32),
    ] {
        assert!(candidates.contains(&wanted), "{wanted:?} in {candidates:?}");
    }
    for &(lanes, splits) in &candidates {
        assert!(lanes.is_power_of_two() && (2..=128).contains(&lanes));
        assert!(splits.is_power_of_two() && splits <= 64);
        let workgroups = 1024u64.div_ceil(u64::from(lanes)) * u64::from(splits);
        assert!(
            splits == 1 || (66..=528).contains(&workgroups),
            "{lanes} {splits}"
        );
        // Every invocation keeps at least one vec4 row of K per split.
        assert!(
            1024 / u64::from(splits) >= u64::from(256 / lanes),
            "{lanes} {splits}"
        );
    }
    // No lanes past what N fills: three vec4 columns take 2 and 4 lanes, one takes none.
    let few: Vec<u32> = narrow_candidates(3, 16, 1, 264)
        .iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(few, [2, 4]);
    assert!(narrow_candidates(1, 1024, 1, 264).is_empty());
    // Shallow K: no split leaves a slice without rows.
    assert!(narrow_candidates(256, 16, 1, 264).iter().all(|c| c.1 == 1));
}

#[test]
fn the_tuners_cooperative_candidates_start_with_the_rules_plan_and_fit_the_device() {
    let caps = cooperative();
    for shape in [
        (4096, 4096, 4096),
        (64, 4096, 4096),
        (16, 4096, 1024),
        (37, 129, 70),
    ] {
        let (m, n, k) = shape;
        let automatic = plan_for(&rules(), &caps, DType::F16, m, n, k).unwrap();
        let candidates = cooperative_candidates(&rules(), &caps, DType::F16, shape, automatic);
        assert_eq!(candidates[0], automatic);
        for (i, candidate) in candidates.iter().enumerate() {
            let tiles = candidate.cooperative.expect("a cooperative plan");
            assert!(tiles.check(&caps.limits).is_ok());
            assert_eq!(candidate.k_chunk % tiles.bk, 0);
            assert!(!candidates[..i].contains(candidate), "{candidate:?} twice");
            if candidate.splits > 1 {
                assert!(k >= candidate.splits as usize * 256, "{candidate:?}");
            }
        }
        // Every named tile, unsplit.
        for tiles in CoopTiles::ALL {
            assert!(
                candidates
                    .iter()
                    .any(|c| c.cooperative == Some(tiles) && c.splits == 1),
                "{tiles} at {m}x{n}x{k}"
            );
        }
    }
    // 4096³: every tile fills the GPU, unsplit; 64 rows: every tile also with 2 to 16 splits.
    let automatic = plan_for(&rules(), &caps, DType::F16, 4096, 4096, 4096).unwrap();
    let all = cooperative_candidates(&rules(), &caps, DType::F16, (4096, 4096, 4096), automatic);
    assert_eq!(all.len(), CoopTiles::ALL.len());
    assert!(all.iter().all(|c| c.splits == 1));
    let automatic = plan_for(&rules(), &caps, DType::F16, 64, 4096, 4096).unwrap();
    let few = cooperative_candidates(&rules(), &caps, DType::F16, (64, 4096, 4096), automatic);
    assert_eq!(few.len(), 5 * CoopTiles::ALL.len() + 1, "{few:?}");
    // Within 16 KiB of workgroup memory, the two tiles that fit.
    let mut small = cooperative();
    small.limits.max_compute_workgroup_storage_size = 16_384;
    let automatic = plan_for(&rules(), &small, DType::F16, 256, 256, 100).unwrap();
    let fitting = cooperative_candidates(&rules(), &small, DType::F16, (256, 256, 100), automatic);
    let tiles: Vec<_> = fitting.iter().filter_map(|c| c.cooperative).collect();
    assert!(tiles
        .iter()
        .all(|t| [CoopTiles::T64X64, CoopTiles::T32X128].contains(t)));
    assert_eq!(fitting.len(), 2);
}

#[test]
fn f32_products_take_cooperative_matrices_only_when_opted_in() {
    let caps = cooperative();
    let opted = MatmulOptions {
        cooperative_f32_as_f16: true,
        ..rules()
    };
    assert!(!rules().cooperative_f32_as_f16, "off by default");
    for (m, n, k) in shapes() {
        // Opted in, an f32 product takes the plan an f16 one of its shape takes (the kernel
        // rounds its operands to f16 as it stages them)...
        assert_eq!(
            plan_for(&opted, &caps, DType::F32, m, n, k),
            plan_for(&rules(), &caps, DType::F16, m, n, k),
            "{m}x{n}x{k}"
        );
        // ...and, without cooperative matrices or with `cooperative` off, the portable one.
        assert_eq!(
            plan_for(&opted, &h200(), DType::F32, m, n, k),
            plan(&rules(), &h200(), m, n, k),
            "{m}x{n}x{k}"
        );
        let off = MatmulOptions {
            cooperative: false,
            ..opted.clone()
        };
        assert_eq!(
            plan_for(&off, &caps, DType::F32, m, n, k),
            plan(&off, &caps, m, n, k),
            "{m}x{n}x{k}"
        );
    }
    let chosen = plan_for(&opted, &caps, DType::F32, 4096, 4096, 4096).unwrap();
    assert_eq!(chosen.cooperative, Some(CoopTiles::T128X256));
}
