//! The compute layer: every kernel against its CPU twin on odd shapes, typed errors, batching and
//! caching, timing, checked and unchecked kernels, and the lifetime of intermediates in a 3-layer
//! MLP forward. Every test runs on the backend `WGPU_BACKEND` selects; CI runs them on Vulkan
//! (lavapipe) and GL (llvmpipe).
//!
//! Tolerances (u = 2⁻²⁴, the unit roundoff of f32; the twins of accumulating kernels sum in f64):
//! - exact (bit-equal up to the sign of zero): relu, neg, copy, add, sub, mul, maximum, their scalar
//!   forms, add_bias;
//! - div, sqrt: 3 ulp (|gpu − cpu| ≤ 6u·|cpu|, Vulkan allows 2.5 ulp);
//! - exp: (3 + 2|x|) ulp, Vulkan's bound;
//! - gelu: 1e−5·|cpu| + 1e−6 (exp's accuracy is the driver's);
//! - matmul: 2K·u·Σ|a·b| + 2u·|cpu| (the classic bound of a K-term dot product, any order), plus
//!   1e−5·|cpu| + 1e−6 with a GELU epilogue;
//! - sum: 2(⌈cols/256⌉ + 9)·u·Σ|x| (a sequential run per invocation, then an 8-level tree);
//! - softmax: 1e−5·|cpu| + 1e−7.

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::compute::{
    cpu, Activation, Autotune, BinaryOp, ComputeError, Context, ContextOptions, DType, Epilogue,
    KernelTiming, MatmulOptions, MatmulPlan, MatmulTiles, ReshapeError, Tensor, TimestampSupport,
    UnaryOp,
};
use wgpu_pool::history::EventKind;
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::{Gpu, Pool, PoolError, PoolOptions};

use crate::gpu::{both, gpu, history_replays_into_the_counters};

/// The unit roundoff of f32.
pub(crate) const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The odd lengths of the issue.
const LENGTHS: [usize; 5] = [1, 3, 17, 129, 257];

pub(crate) fn context_with(gpu: &Gpu, options: ContextOptions) -> Context {
    let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
    Context::new(&pool, options).expect("context")
}

/// A default context and one whose grids are at most 2 workgroups wide (2-D past that): the
/// transformer and attention tests run on both.
pub(crate) fn contexts(gpu: &Gpu) -> [Context; 2] {
    [
        context_with(gpu, ContextOptions::default()),
        context_with(
            gpu,
            ContextOptions {
                max_grid_x: Some(2),
                ..ContextOptions::default()
            },
        ),
    ]
}

fn context(gpu: &Gpu) -> Context {
    context_with(gpu, ContextOptions::default())
}

/// A context whose matmuls follow the rules' plans: on a GPU the default tunes them by measurement.
fn rules_context(gpu: &Gpu) -> Context {
    context_with(
        gpu,
        ContextOptions {
            matmul: MatmulOptions {
                autotune: Autotune::Off,
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        },
    )
}

pub(crate) fn random(rng: &mut StdRng, len: usize, low: f32, high: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(low..high)).collect()
}

/// Asserts `|gpu[i] − cpu[i]| ≤ tolerance(i)` for every element, naming the first one that is not.
pub(crate) fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tolerance: impl Fn(usize) -> f64) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    let mut worst = 0.0f64;
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let error = (f64::from(g) - f64::from(c)).abs();
        let allowed = tolerance(i);
        assert!(
            error <= allowed,
            "{what}: element {i}: gpu {g} cpu {c}: error {error:e} > tolerance {allowed:e}"
        );
        worst = worst.max(error);
    }
}

fn exact(_: usize) -> f64 {
    0.0
}

fn unary_tolerance(op: UnaryOp, x: &[f32], cpu: &[f32]) -> impl Fn(usize) -> f64 {
    let (x, cpu) = (x.to_vec(), cpu.to_vec());
    move |i| {
        let c = f64::from(cpu[i]).abs();
        match op {
            UnaryOp::Relu | UnaryOp::Neg | UnaryOp::Copy => 0.0,
            UnaryOp::Sqrt => 6.0 * U * c,
            UnaryOp::Exp => (3.0 + 2.0 * f64::from(x[i]).abs()) * 2.0 * U * c,
            UnaryOp::Gelu => 1e-5 * c + 1e-6,
        }
    }
}

fn unary_input(rng: &mut StdRng, op: UnaryOp, len: usize) -> Vec<f32> {
    match op {
        UnaryOp::Sqrt => random(rng, len, 0.0, 100.0),
        _ => random(rng, len, -4.0, 4.0),
    }
}

/// Divisors away from 0, of both signs.
fn divisors(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let magnitude = rng.gen_range(0.25f32..4.0);
            if rng.gen_bool(0.5) {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect()
}

#[test]
fn unary_ops_match_their_cpu_twins_on_odd_lengths() {
    for (limits, gpu) in both() {
        let context = context(gpu);
        let mut rng = StdRng::seed_from_u64(1);
        for len in LENGTHS {
            for op in UnaryOp::ALL {
                let x = unary_input(&mut rng, op, len);
                let tensor = context.tensor(&x, &[len]).unwrap();
                let y = context.unary(op, &tensor).unwrap();
                assert_eq!(y.shape(), [len]);
                let expected = cpu::unary(op, &x);
                assert_close(
                    &format!("{} len {len} ({limits})", op.name()),
                    &y.to_vec().unwrap(),
                    &expected,
                    unary_tolerance(op, &x, &expected),
                );
            }
        }
    }
}

#[test]
fn gelu_is_finite_and_matches_its_twin_at_extremes() {
    let x = [
        -3e38, -1e30, -1e10, -100.0, -40.0, -30.0, -10.0, -3.0, -1e-30, 0.0, 1e-30, 3.0, 10.0,
        30.0, 40.0, 100.0, 1e10, 1e30, 3e38,
    ];
    for (limits, gpu) in both() {
        let context = context(gpu);
        let tensor = context.tensor(&x, &[x.len()]).unwrap();
        for y in [
            context.gelu(&tensor).unwrap().to_vec().unwrap(),
            // The matmul epilogue shares the function: x · 1 with a GELU epilogue.
            context
                .matmul_with(
                    &context.tensor(&x, &[x.len(), 1]).unwrap(),
                    &context.tensor(&[1.0], &[1, 1]).unwrap(),
                    Epilogue {
                        bias: None,
                        activation: Activation::Gelu,
                        ..Default::default()
                    },
                )
                .unwrap()
                .to_vec()
                .unwrap(),
        ] {
            assert!(y.iter().all(|v| v.is_finite()), "{limits}: {y:?}");
            let expected = cpu::gelu(&x);
            assert_close(
                &format!("gelu at extremes ({limits})"),
                &y,
                &expected,
                unary_tolerance(UnaryOp::Gelu, &x, &expected),
            );
        }
    }
}

#[test]
fn binary_ops_and_their_scalar_forms_match_their_cpu_twins() {
    for (limits, gpu) in both() {
        let context = context(gpu);
        let mut rng = StdRng::seed_from_u64(2);
        for len in LENGTHS {
            for op in BinaryOp::ALL {
                let a = random(&mut rng, len, -4.0, 4.0);
                let b = if op == BinaryOp::Div {
                    divisors(&mut rng, len)
                } else {
                    random(&mut rng, len, -4.0, 4.0)
                };
                // Two dimensions: shapes do not matter to element-wise ops, only lengths.
                let shape = [1, len];
                let (ta, tb) = (
                    context.tensor(&a, &shape).unwrap(),
                    context.tensor(&b, &shape).unwrap(),
                );
                let scalar = if op == BinaryOp::Div { -1.75 } else { 0.625 };
                let y = context.binary(op, &ta, &tb).unwrap();
                let ys = context.binary_scalar(op, &ta, scalar).unwrap();
                let expected = cpu::binary(op, &a, &b);
                let expected_scalar = cpu::binary_scalar(op, &a, scalar);
                let tolerance = |expected: &[f32]| {
                    let expected = expected.to_vec();
                    move |i: usize| {
                        if op == BinaryOp::Div {
                            6.0 * U * f64::from(expected[i]).abs()
                        } else {
                            0.0
                        }
                    }
                };
                assert_close(
                    &format!("{} len {len} ({limits})", op.name()),
                    &y.to_vec().unwrap(),
                    &expected,
                    tolerance(&expected),
                );
                assert_close(
                    &format!("{}_scalar len {len} ({limits})", op.name()),
                    &ys.to_vec().unwrap(),
                    &expected_scalar,
                    tolerance(&expected_scalar),
                );
            }
        }
    }
}

#[test]
fn add_bias_broadcasts_over_rows_of_any_length() {
    for (limits, gpu) in both() {
        let context = context(gpu);
        let mut rng = StdRng::seed_from_u64(3);
        for (rows, cols) in [
            (1, 1),
            (3, 17),
            (17, 3),
            (5, 129),
            (3, 257),
            (129, 4),
            (2, 8),
        ] {
            let x = random(&mut rng, rows * cols, -4.0, 4.0);
            let bias = random(&mut rng, cols, -4.0, 4.0);
            let tx = context.tensor(&x, &[rows, cols]).unwrap();
            let tb = context.tensor(&bias, &[cols]).unwrap();
            let y = context.add_bias(&tx, &tb).unwrap();
            assert_eq!(y.shape(), [rows, cols]);
            assert_close(
                &format!("add_bias {rows}x{cols} ({limits})"),
                &y.to_vec().unwrap(),
                &cpu::add_bias(&x, &bias),
                exact,
            );
        }
    }
}

#[test]
fn element_wise_and_row_kernels_use_a_2d_grid_past_the_x_limit() {
    // A cap of 2 workgroups along x: 2,049 elements (513 vec4s, 3 workgroups) need a 2×2 grid,
    // 17 rows a 9×2 one.
    let context = context_with(
        gpu(),
        ContextOptions {
            max_grid_x: Some(2),
            ..ContextOptions::default()
        },
    );
    let mut rng = StdRng::seed_from_u64(4);
    let len = 2049;
    let a = random(&mut rng, len, -4.0, 4.0);
    let b = random(&mut rng, len, -4.0, 4.0);
    let (ta, tb) = (
        context.tensor(&a, &[len]).unwrap(),
        context.tensor(&b, &[len]).unwrap(),
    );
    assert_close(
        "add on a 2-D grid",
        &context.add(&ta, &tb).unwrap().to_vec().unwrap(),
        &cpu::add(&a, &b),
        exact,
    );
    assert_close(
        "relu on a 2-D grid",
        &context.relu(&ta).unwrap().to_vec().unwrap(),
        &cpu::relu(&a),
        exact,
    );
    let (rows, cols) = (17, 5);
    let x = random(&mut rng, rows * cols, -4.0, 4.0);
    let tx = context.tensor(&x, &[rows, cols]).unwrap();
    let sums = context.sum(&tx).unwrap().to_vec().unwrap();
    let expected = cpu::sum(&x, cols);
    assert_close("sum on a 2-D grid", &sums, &expected, |_| 1e-5);
    let probabilities = context.softmax(&tx).unwrap().to_vec().unwrap();
    let expected = cpu::softmax(&x, cols);
    assert_close("softmax on a 2-D grid", &probabilities, &expected, |i| {
        1e-5 * f64::from(expected[i]) + 1e-7
    });
}

#[test]
fn sum_and_softmax_match_their_cpu_twins() {
    for (limits, gpu) in both() {
        let context = context(gpu);
        let mut rng = StdRng::seed_from_u64(5);
        for (rows, cols) in [(1, 1), (3, 17), (17, 3), (1, 129), (129, 257), (2, 1000)] {
            let x = random(&mut rng, rows * cols, -8.0, 8.0);
            let tx = context.tensor(&x, &[rows, cols]).unwrap();
            let sums = context.sum(&tx).unwrap();
            assert_eq!(sums.shape(), [rows]);
            let magnitudes = cpu::sum(&x.iter().map(|v| v.abs()).collect::<Vec<_>>(), cols);
            let sum_bound = 2.0 * (cols.div_ceil(256) + 9) as f64 * U;
            assert_close(
                &format!("sum {rows}x{cols} ({limits})"),
                &sums.to_vec().unwrap(),
                &cpu::sum(&x, cols),
                |i| sum_bound * f64::from(magnitudes[i]),
            );
            let probabilities = context.softmax(&tx).unwrap();
            assert_eq!(probabilities.shape(), [rows, cols]);
            let expected = cpu::softmax(&x, cols);
            assert_close(
                &format!("softmax {rows}x{cols} ({limits})"),
                &probabilities.to_vec().unwrap(),
                &expected,
                |i| 1e-5 * f64::from(expected[i]) + 1e-7,
            );
        }
        // Large inputs: without subtracting the maximum, exp would overflow.
        let x = [1000.0, 1001.0, 999.0];
        let tx = context.tensor(&x, &[1, 3]).unwrap();
        let expected = cpu::softmax(&x, 3);
        assert_close(
            &format!("softmax of large values ({limits})"),
            &context.softmax(&tx).unwrap().to_vec().unwrap(),
            &expected,
            |i| 1e-5 * f64::from(expected[i]) + 1e-7,
        );
    }
}

/// Shapes `(m, k, n)`: the odd ones, non-square ones, exact tiles (no edges), vec4 with edges,
/// and more than 8 rows of tiles (the kernel visits tiles in groups of 8 rows).
const MATMUL_SHAPES: [(usize, usize, usize); 11] = [
    (1100, 4, 70),
    (1, 1, 1),
    (3, 3, 3),
    (17, 17, 17),
    (1, 257, 129),
    (129, 17, 1),
    (257, 511, 129),
    (128, 64, 128),
    (64, 128, 256),
    (20, 44, 36),
    (33, 20, 65),
];

/// Multiplies on the GPU and checks against the twin with the tolerance of the module docs.
fn check_matmul(
    context: &Context,
    what: &str,
    shape: (usize, usize, usize),
    bias: bool,
    activation: Activation,
    rng: &mut StdRng,
) {
    check_matmul_of(context, what, shape, bias, activation, DType::F32, rng);
}

/// How far a result stored as `dtype` may be from its twin's rounding of the same f32 value: 0
/// for f32; for f16 an ulp (WGSL lets a conversion to f16 round to either neighbour) and the
/// smallest normal f16 (a device may flush f16 subnormals to zero): 2⁻¹⁰·|value| + 2⁻¹⁴.
pub(crate) fn storage_tolerance(dtype: DType, value: f32) -> f64 {
    match dtype {
        DType::F32 => 0.0,
        DType::F16 => f64::from(value).abs() / 1024.0 + 1.0 / f64::from(1u32 << 14),
    }
}

/// [`check_matmul`] on tensors of `dtype`: the operands are the `dtype` roundings of random
/// values, the twin computes on them and its result is rounded to `dtype`; the tolerance gains
/// [`storage_tolerance`].
pub(crate) fn check_matmul_of(
    context: &Context,
    what: &str,
    shape: (usize, usize, usize),
    bias: bool,
    activation: Activation,
    dtype: DType,
    rng: &mut StdRng,
) {
    check_matmul_epilogue(context, what, shape, (bias, activation, false), dtype, rng);
}

/// [`check_matmul_of`] with a residual in the epilogue where `residual` (values in [−2, 2]):
/// the tolerance gains u·|c| for its add. Returns the dispatches the product recorded.
pub(crate) fn check_matmul_epilogue(
    context: &Context,
    what: &str,
    (m, k, n): (usize, usize, usize),
    (bias, activation, residual): (bool, Activation, bool),
    dtype: DType,
    rng: &mut StdRng,
) -> u64 {
    let a = cpu::rounded(&random(rng, m * k, -1.0, 1.0), dtype);
    let b = cpu::rounded(&random(rng, k * n, -1.0, 1.0), dtype);
    let bias_values = cpu::rounded(&random(rng, n, -1.0, 1.0), dtype);
    let residual_values = cpu::rounded(&random(rng, m * n, -2.0, 2.0), dtype);
    let ta = context.tensor_with(&a, &[m, k], dtype).unwrap();
    let tb = context.tensor_with(&b, &[k, n], dtype).unwrap();
    let tbias = context.tensor_with(&bias_values, &[n], dtype).unwrap();
    let tresidual = context
        .tensor_with(&residual_values, &[m, n], dtype)
        .unwrap();
    let before = context.stats().dispatches;
    let c = context
        .matmul_with(
            &ta,
            &tb,
            Epilogue {
                bias: bias.then_some(&tbias),
                activation,
                residual: residual.then_some(&tresidual),
            },
        )
        .unwrap();
    let dispatches = context.stats().dispatches - before;
    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], dtype));
    let gpu_values = c.to_vec().unwrap();
    let expected = cpu::rounded(
        &cpu::matmul_with(
            &a,
            &b,
            m,
            k,
            n,
            cpu::Epilogue {
                bias: bias.then_some(&bias_values[..]),
                activation,
                residual: residual.then_some(&residual_values[..]),
            },
        ),
        dtype,
    );
    let magnitude = cpu::matmul_magnitude(&a, &b, m, k, n);
    let gelu = activation == Activation::Gelu;
    assert_close(
        &format!("{what} {m}x{k}·{k}x{n} bias {bias} {activation:?} residual {residual}"),
        &gpu_values,
        &expected,
        |i| {
            let c = f64::from(expected[i]).abs();
            let mut bound = 2.0 * k as f64 * U * f64::from(magnitude[i]) + 2.0 * U * c;
            if gelu {
                bound += 1e-5 * c + 1e-6;
            }
            if residual {
                bound += U * c;
            }
            bound + storage_tolerance(dtype, expected[i])
        },
    );
    dispatches
}

/// A residual in the epilogue on every path of the product: the narrow kernel (unsplit, split
/// along K: the reduction adds it, rows in groups, subgroups), the tiled kernel (vec4, scalar with
/// edges, split along K), each within the product's dispatches (one, or two with a split): no
/// `add` after it. Against the twin, with and without a bias and an activation before it.
#[test]
fn a_residual_epilogue_matches_its_twin_on_every_path_in_the_products_dispatches() {
    let narrow = |lanes, splits, groups| MatmulOptions {
        narrow_lanes: lanes,
        narrow_splits: Some(splits),
        narrow_row_groups: Some(groups),
        ..MatmulOptions::default()
    };
    let tiled = |split_k| MatmulOptions {
        split_k,
        ..MatmulOptions::default()
    };
    // (options, shapes (m, k, n), the kernel: narrow or not)
    let cases = [
        (
            MatmulOptions::default(),
            vec![(1, 64, 36), (16, 768, 64)],
            true,
        ),
        (narrow(None, 3, 1), vec![(3, 768, 36), (16, 260, 12)], true),
        (narrow(Some(4), 1, 2), vec![(8, 64, 36), (16, 64, 64)], true),
        (narrow(Some(1), 2, 4), vec![(16, 64, 12)], true),
        (
            tiled(None),
            vec![(40, 64, 36), (17, 30, 30), (3, 64, 30)],
            false,
        ),
        (tiled(Some(3)), vec![(40, 256, 36), (33, 100, 31)], false),
    ];
    let epilogues = [
        (false, Activation::None),
        (true, Activation::Gelu),
        (true, Activation::Relu),
    ];
    for (limits, gpu) in both() {
        let mut rng = StdRng::seed_from_u64(58);
        for (options, shapes, narrow) in &cases {
            let context = context_with(
                gpu,
                ContextOptions {
                    matmul: options.clone(),
                    ..ContextOptions::default()
                },
            );
            for (index, &(m, k, n)) in shapes.iter().enumerate() {
                let plan = context.matmul_plan(m, n, k).unwrap();
                assert_eq!(plan.narrow_lanes > 0, *narrow, "{m}x{k}x{n}: {plan:?}");
                let (bias, activation) = epilogues[index % epilogues.len()];
                let what = format!(
                    "residual, lanes {} splits {} groups {} ({limits})",
                    plan.narrow_lanes, plan.splits, plan.narrow_row_groups
                );
                let dispatches = check_matmul_epilogue(
                    &context,
                    &what,
                    (m, k, n),
                    (bias, activation, true),
                    DType::F32,
                    &mut rng,
                );
                assert_eq!(dispatches, 1 + u64::from(plan.splits > 1), "{what}");
            }
        }
    }
}

fn matmul_context(gpu: &Gpu, tiles: Option<MatmulTiles>, split_k: Option<u32>) -> Context {
    context_with(
        gpu,
        ContextOptions {
            matmul: MatmulOptions {
                tiles,
                split_k,
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        },
    )
}

#[test]
fn matmul_matches_its_cpu_twin_with_every_tile_on_odd_shapes() {
    // Every shape for the default tiles; for the others (on the adapter's limits only: every
    // variant is a compile, the slow part on a software GPU), a scalar variant with edges and
    // the fused epilogue, and a vec4 one without edges, each with more than 8 rows of tiles.
    let defaults = MatmulOptions::default();
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(6);
        for tiles in MatmulTiles::ALL {
            let default_tile =
                defaults.large_tiles.contains(&tiles) || tiles == defaults.small_tiles;
            if tiles.check(&gpu.device.limits()).is_err() || (index > 0 && !default_tile) {
                eprintln!("tile {tiles} ({limits}): skipped");
                continue;
            }
            let context = matmul_context(gpu, Some(tiles), Some(1));
            let (bm, bn, bk) = (tiles.bm as usize, tiles.bn as usize, tiles.bk as usize);
            // 9 steps of K, an odd number (the other shapes: 1, and 64 or 32).
            let exact = (9 * bm, 9 * bk, bn);
            let shapes: Vec<(usize, usize, usize)> = if default_tile {
                MATMUL_SHAPES.to_vec()
            } else {
                vec![(257, 511, 129), (1100, 4, 70), exact]
            };
            for shape in shapes {
                let plan = context.matmul_plan(shape.0, shape.2, shape.1).unwrap();
                assert_eq!((plan.tiles, plan.splits), (tiles, 1));
                if shape == exact {
                    assert!(plan.vec4 && !plan.edges, "{plan:?}");
                }
                let epilogue = !default_tile && !plan.vec4;
                check_matmul(
                    &context,
                    &format!("matmul {tiles} ({limits})"),
                    shape,
                    epilogue,
                    if epilogue {
                        Activation::Gelu
                    } else {
                        Activation::None
                    },
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn split_k_matmul_matches_its_cpu_twin() {
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(7);
        // Under the default limits, one configuration (compiles are the slow part).
        let configs: &[(MatmulTiles, u32)] = if index == 0 {
            &[
                (MatmulTiles::T64X64X8, 3),
                (MatmulTiles::T128X128X8, 5),
                (MatmulTiles::T128X128X8_16X8, 3),
            ]
        } else {
            &[(MatmulTiles::T64X64X8, 3)]
        };
        for &(tiles, splits) in configs {
            if tiles.check(&gpu.device.limits()).is_err() {
                eprintln!("split-K {tiles} ({limits}): skipped");
                continue;
            }
            let context = matmul_context(gpu, Some(tiles), Some(splits));
            for shape in [(257, 511, 129), (20, 44, 36), (3, 17, 1), (64, 256, 64)] {
                let plan = context.matmul_plan(shape.0, shape.2, shape.1).unwrap();
                assert!(plan.splits > 1 || shape.1 <= tiles.bk as usize, "{plan:?}");
                check_matmul(
                    &context,
                    &format!("split-K {splits} {tiles} ({limits})"),
                    shape,
                    true,
                    Activation::Gelu,
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn matmul_epilogues_match_their_cpu_twin() {
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let context = matmul_context(gpu, None, Some(1));
        let mut rng = StdRng::seed_from_u64(8);
        let epilogues: &[(bool, Activation)] = if index == 0 {
            &[
                (true, Activation::None),
                (true, Activation::Relu),
                (true, Activation::Gelu),
                (false, Activation::Gelu),
            ]
        } else {
            // Under the default limits, one (compiles are the slow part).
            &[(true, Activation::Gelu)]
        };
        for shape in [(257, 511, 129), (20, 44, 36), (17, 3, 1)] {
            for &(bias, activation) in epilogues {
                check_matmul(
                    &context,
                    &format!("epilogue ({limits})"),
                    shape,
                    bias,
                    activation,
                    &mut rng,
                );
            }
        }
    }
}

/// Shapes `(m, k, n)` of the narrow kernel: 1 to 8 rows, K and N multiples of 4; N not a
/// multiple of a workgroup's columns (idle lanes), K shorter and longer than a workgroup's slices.
const NARROW_SHAPES: [(usize, usize, usize); 7] = [
    (1, 4, 4),
    (3, 20, 36),
    (4, 1024, 132),
    (5, 516, 1028),
    (7, 12, 8),
    (8, 2052, 260),
    (6, 4108, 24),
];

#[test]
fn narrow_matmul_matches_its_cpu_twin() {
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(11);
        // Automatic lanes and the extremes; under the default limits, automatic only (compiles
        // are the slow part on a software GPU).
        let lane_choices: &[Option<u32>] = if index == 0 {
            &[None, Some(1), Some(8), Some(256)]
        } else {
            &[None]
        };
        for &lanes in lane_choices {
            for checks in [ContextOptions::default(), ContextOptions::unchecked()] {
                let context = context_with(
                    gpu,
                    ContextOptions {
                        matmul: MatmulOptions {
                            narrow_lanes: lanes,
                            ..MatmulOptions::default()
                        },
                        ..checks
                    },
                );
                for (i, &(m, k, n)) in NARROW_SHAPES.iter().enumerate() {
                    let plan = context.matmul_plan(m, n, k).unwrap();
                    assert!(plan.narrow_lanes > 0, "{m}x{k}x{n}: {plan:?}");
                    if let Some(lanes) = lanes {
                        assert_eq!(plan.narrow_lanes, lanes);
                    }
                    let (bias, activation) = match i % 3 {
                        0 => (false, Activation::None),
                        1 => (true, Activation::Gelu),
                        _ => (true, Activation::Relu),
                    };
                    check_matmul(
                        &context,
                        &format!(
                            "narrow lanes {lanes:?} {:?} ({limits})",
                            checks.shader_checks
                        ),
                        (m, k, n),
                        bias,
                        activation,
                        &mut rng,
                    );
                }
            }
        }
    }
}

#[test]
fn narrow_matmul_with_rows_in_groups_matches_its_cpu_twin() {
    // Shapes `(m, k, n)` and the groups of rows forced: 16 rows in 2 and 4, 12 in 3 (a grid past
    // the x limit, and the last row of workgroups not full), 6 in 4 (not a divisor: all rows in
    // each workgroup), each also split along K (the reduction adds every group's rows).
    let shapes = [
        (16, 64, 96, 2),
        (16, 516, 36, 4),
        (12, 20, 1028, 3),
        (6, 12, 8, 4),
    ];
    let mut rng = StdRng::seed_from_u64(13);
    for (i, &(m, k, n, groups)) in shapes.iter().enumerate() {
        for splits in [1, 2] {
            let context = context_with(
                gpu(),
                ContextOptions {
                    matmul: MatmulOptions {
                        narrow_lanes: Some(if i % 2 == 0 { 4 } else { 1 }),
                        narrow_splits: Some(splits),
                        narrow_row_groups: Some(groups),
                        ..MatmulOptions::default()
                    },
                    max_grid_x: (i == 2).then_some(5),
                    ..ContextOptions::unchecked()
                },
            );
            let plan = context.matmul_plan(m, n, k).unwrap();
            let expected = if m % groups as usize == 0 { groups } else { 1 };
            assert_eq!(plan.narrow_row_groups, expected, "{m}x{k}x{n}: {plan:?}");
            let (bias, activation) = if splits == 1 {
                (true, Activation::Gelu)
            } else {
                (true, Activation::Relu)
            };
            check_matmul(
                &context,
                &format!("narrow rows in {groups} groups, split {splits}"),
                (m, k, n),
                bias,
                activation,
                &mut rng,
            );
        }
    }
}

/// Shapes `(m, k, n)` of the narrow kernel split along K, and the splits forced: small and
/// large N, deep K, chunks of K not a multiple of the slices, a last chunk shorter than the others.
const NARROW_SPLIT_SHAPES: [(usize, usize, usize, u32); 6] = [
    (3, 8192, 12, 4),
    (3, 8192, 2048, 3),
    (1, 4100, 4, 7),
    (8, 1028, 36, 2),
    (5, 516, 1028, 16),
    (2, 8, 8, 2),
];

#[test]
fn narrow_matmul_split_along_k_matches_its_cpu_twin() {
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(12);
        // Lanes automatic and forced to the extremes; under the default limits, automatic only.
        let lane_choices: &[Option<u32>] = if index == 0 {
            &[None, Some(1), Some(16), Some(256)]
        } else {
            &[None]
        };
        for &lanes in lane_choices {
            for (i, &(m, k, n, splits)) in NARROW_SPLIT_SHAPES.iter().enumerate() {
                let checks = if i % 2 == 0 {
                    ContextOptions::default()
                } else {
                    ContextOptions::unchecked()
                };
                let context = context_with(
                    gpu,
                    ContextOptions {
                        matmul: MatmulOptions {
                            narrow_lanes: lanes,
                            narrow_splits: Some(splits),
                            ..MatmulOptions::default()
                        },
                        ..checks
                    },
                );
                let plan = context.matmul_plan(m, n, k).unwrap();
                assert!(plan.narrow_lanes > 0, "{m}x{k}x{n}: {plan:?}");
                // No empty split: at most the splits asked for, each chunk a whole number of
                // vec4 rows, the last one not empty.
                assert!(plan.splits > 1 && plan.splits <= splits, "{plan:?}");
                assert_eq!(plan.workgroups[2], plan.splits, "{plan:?}");
                assert_eq!(plan.k_chunk % 4, 0, "{plan:?}");
                assert!(
                    (plan.splits as usize - 1) * (plan.k_chunk as usize) < k,
                    "{plan:?}"
                );
                assert!(
                    plan.splits as usize * plan.k_chunk as usize >= k,
                    "{plan:?}"
                );
                // The epilogue runs in the reduction: bias and GELU, bias and ReLU, none.
                let (bias, activation) = match i % 3 {
                    0 => (true, Activation::Gelu),
                    1 => (true, Activation::Relu),
                    _ => (false, Activation::None),
                };
                check_matmul(
                    &context,
                    &format!(
                        "narrow split {splits} lanes {lanes:?} {:?} ({limits})",
                        checks.shader_checks
                    ),
                    (m, k, n),
                    bias,
                    activation,
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn narrow_matmul_adds_slices_by_subgroups_where_the_device_has_them() {
    let gpu = gpu();
    let info = &gpu.info;
    let fixed = gpu.device.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size == info.subgroup_max_size;
    eprintln!(
        "subgroups: {:?}, sizes {} to {}",
        gpu.device.features().contains(wgpu::Features::SUBGROUP),
        info.subgroup_min_size,
        info.subgroup_max_size
    );
    let mut rng = StdRng::seed_from_u64(13);
    for subgroups in [true, false] {
        for (lanes, splits) in [(1, 1), (2, 3), (4, 1)] {
            let context = context_with(
                gpu,
                ContextOptions {
                    matmul: MatmulOptions {
                        narrow_lanes: Some(lanes),
                        narrow_splits: Some(splits),
                        narrow_subgroups: subgroups,
                        ..MatmulOptions::default()
                    },
                    ..ContextOptions::unchecked()
                },
            );
            // Powers of two of rows (the shuffles scatter the rows) and others.
            let shapes = [
                (8, 1040, 20),
                (3, 516, 8),
                (1, 4096, 4),
                (16, 1032, 12),
                (4, 260, 16),
                (2, 132, 8),
            ];
            for (i, &(m, k, n)) in shapes.iter().enumerate() {
                let plan = context.matmul_plan(m, n, k).unwrap();
                let expected = if subgroups && fixed && info.subgroup_min_size > lanes {
                    info.subgroup_min_size
                } else {
                    0
                };
                assert_eq!(plan.narrow_subgroup, expected, "{plan:?}");
                let (bias, activation) = if i == 0 {
                    (true, Activation::Gelu)
                } else {
                    (false, Activation::None)
                };
                check_matmul(
                    &context,
                    &format!("narrow lanes {lanes} splits {splits} subgroups {subgroups}"),
                    (m, k, n),
                    bias,
                    activation,
                    &mut rng,
                );
            }
        }
    }
}

// The rules' plans on described devices (the H200, WebGPU's defaults, lavapipe, cooperative
// matrices) are unit tests without a GPU: src/compute/ops/matmul/select/tests.rs. This test checks
// that a context follows them on the device it runs on, and that the plan computes.
#[test]
fn automatic_plans_use_small_tiles_and_split_k_where_the_large_tile_cannot_fill_the_gpu() {
    // The rules' plans: on a GPU the default tunes by measurement instead.
    let context = rules_context(gpu());
    let limits = context.limits().clone();
    let options = MatmulOptions::default();
    let Some(large_tile) = options.large_tile(&limits) else {
        eprintln!("no large tile fits this device: nothing to check");
        return;
    };
    // The first large tile the device allows.
    let expected = if limits.max_compute_workgroup_storage_size >= 48 << 10 {
        MatmulTiles::T128X256X16_8X16
    } else {
        MatmulTiles::T128X128X8_16X8
    };
    assert_eq!(large_tile, expected);
    // 4096² outputs: at least 512 large tiles, no split.
    let large = context.matmul_plan(4096, 4096, 4096).unwrap();
    assert_eq!((large.tiles, large.splits), (large_tile, 1));
    // 64 × 4096 outputs: 64 small tiles (fewer than 264); K = 4096 is split as many ways as keep
    // the workgroups within 528 (one wave): ⌊528 / 64⌋ = 8 ways.
    let skinny = context.matmul_plan(64, 4096, 4096).unwrap();
    assert_eq!(skinny.tiles, options.small_tiles);
    assert_eq!(skinny.splits, 8);
    assert_eq!(skinny.k_chunk % skinny.tiles.bk, 0);
    // 100 tiles: ⌊528 / 100⌋ = 5 ways, 500 workgroups.
    let hundred = context.matmul_plan(100, 3200, 4096).unwrap();
    assert_eq!((hundred.tiles, hundred.splits), (options.small_tiles, 5));
    // 240 tiles: ⌊528 / 240⌋ = 2 ways, and at least ⌈264 / 240⌉ = 2.
    let two = context.matmul_plan(192, 5120, 4096).unwrap();
    assert_eq!((two.tiles, two.splits), (options.small_tiles, 2));
    // At most 32 rows (past the narrow kernel's): the thin tile, 32 of them along N, K split
    // ⌊528 / 32⌋ = 16 ways (each 256 deep: `min_split_depth`).
    if options.thin_tiles.check(&limits).is_ok() {
        let thin = context.matmul_plan(32, 4096, 4096).unwrap();
        assert_eq!((thin.tiles, thin.splits), (options.thin_tiles, 16));
        let rows_33 = context.matmul_plan(33, 4096, 4096).unwrap();
        assert_eq!(rows_33.tiles, options.small_tiles);
    }
    // Shallow K is never split below min_split_depth.
    let shallow = context.matmul_plan(64, 64, 300).unwrap();
    assert_eq!(shallow.splits, 1);
    // The automatic choice computes the right thing on a shape that splits.
    let mut rng = StdRng::seed_from_u64(9);
    let plan = context.matmul_plan(17, 33, 1031).unwrap();
    assert!(plan.splits > 1, "{plan:?}");
    check_matmul(
        &context,
        "automatic",
        (17, 1031, 33),
        true,
        Activation::Relu,
        &mut rng,
    );
}

#[test]
fn split_k_partials_of_varying_sizes_reuse_one_segment() {
    // A server's batches vary, and so do the split-K partials of its products (16 splits of M ×
    // 8192: 16.5 to 32 MiB here, past the pool's dedicated threshold). Eager partials are rounded
    // up to a power of two, so after the first product no new segment is created.
    let context = matmul_context(gpu(), None, Some(16));
    let mut rng = StdRng::seed_from_u64(12);
    let mut created = None;
    for m in [64, 48, 40, 33, 57] {
        check_matmul(
            &context,
            "varying split-K",
            (m, 512, 8192),
            true,
            Activation::None,
            &mut rng,
        );
        context.sync().unwrap();
        let calls = context.pool().stats().create_segment_calls;
        match created {
            None => created = Some(calls),
            Some(first) => assert_eq!(calls, first, "M = {m} created a segment"),
        }
    }
}

#[test]
fn unchecked_kernels_compute_what_checked_ones_do() {
    let mut rng = StdRng::seed_from_u64(10);
    let checked = context(gpu());
    let unchecked = context_with(gpu(), ContextOptions::unchecked());
    let (m, k, n) = (257, 511, 129);
    let a = random(&mut rng, m * k, -1.0, 1.0);
    let b = random(&mut rng, k * n, -1.0, 1.0);
    let x = random(&mut rng, 257, -4.0, 4.0);
    let run = |context: &Context| {
        let ta = context.tensor(&a, &[m, k]).unwrap();
        let tb = context.tensor(&b, &[k, n]).unwrap();
        let tx = context.tensor(&x, &[1, 257]).unwrap();
        let c = context.matmul(&ta, &tb).unwrap().to_vec().unwrap();
        let g = context.gelu(&tx).unwrap().to_vec().unwrap();
        let s = context.softmax(&tx).unwrap().to_vec().unwrap();
        (c, g, s)
    };
    let (c1, g1, s1) = run(&checked);
    let (c2, g2, s2) = run(&unchecked);
    assert_eq!(c1, c2, "matmul");
    assert_eq!(g1, g2, "gelu");
    assert_eq!(s1, s2, "softmax");
    let expected = cpu::matmul(&a, &b, m, k, n);
    let magnitude = cpu::matmul_magnitude(&a, &b, m, k, n);
    assert_close("unchecked matmul", &c2, &expected, |i| {
        2.0 * k as f64 * U * f64::from(magnitude[i]) + 2.0 * U * f64::from(expected[i]).abs()
    });
}

#[test]
fn shape_mismatches_and_out_of_limit_sizes_are_typed_errors_that_record_nothing() {
    let context = context(gpu());
    let other = context_with(gpu(), ContextOptions::default());
    let a = context.tensor(&[1.0; 6], &[2, 3]).unwrap();
    let b = context.tensor(&[1.0; 6], &[3, 2]).unwrap();
    let v = context.tensor(&[1.0; 3], &[3]).unwrap();
    let foreign = other.tensor(&[1.0; 6], &[2, 3]).unwrap();
    context.flush().unwrap();
    let before = context.pending_dispatches();

    let mismatch = |result: Result<Tensor, ComputeError>| {
        assert!(
            matches!(result, Err(ComputeError::ShapeMismatch { .. })),
            "{result:?}"
        )
    };
    mismatch(context.add(&a, &b));
    mismatch(context.matmul(&a, &a));
    mismatch(context.matmul(&a, &v));
    mismatch(context.add_bias(&a, &a));
    mismatch(context.matmul_with(
        &a,
        &b,
        Epilogue {
            bias: Some(&v),
            activation: Activation::None,
            ..Default::default()
        },
    ));
    assert!(matches!(
        context.add(&a, &foreign),
        Err(ComputeError::ForeignTensor { .. })
    ));
    assert!(matches!(
        context.read(&foreign),
        Err(ComputeError::ForeignTensor { .. })
    ));
    assert!(matches!(
        context.tensor(&[1.0; 5], &[2, 3]),
        Err(ComputeError::DataLength {
            data_len: 5,
            expected_len: 6,
            ..
        })
    ));
    assert!(matches!(
        context.tensor(&[], &[0, 3]),
        Err(ComputeError::InvalidShape { .. })
    ));
    assert!(matches!(
        context.tensor(&[], &[]),
        Err(ComputeError::InvalidShape { .. })
    ));
    assert!(matches!(
        context.tensor(&[], &[usize::MAX, 2]),
        Err(ComputeError::InvalidShape { .. })
    ));
    let reshaped = context.tensor(&[1.0; 6], &[6]).unwrap().reshape(&[4, 2]);
    assert!(matches!(
        reshaped,
        Err(ReshapeError {
            error: ComputeError::ShapeMismatch { .. },
            ..
        })
    ));

    // An output larger than one binding: refused by the pool, before anything is recorded.
    let limits = context.limits().clone();
    let side = ((limits.max_storage_buffer_binding_size / 4) as f64).sqrt() as usize + 2;
    let column = context.tensor(&vec![1.0; side], &[side, 1]).unwrap();
    let row = context.tensor(&vec![1.0; side], &[1, side]).unwrap();
    context.flush().unwrap();
    let result = context.matmul(&column, &row);
    assert!(
        matches!(
            result,
            Err(ComputeError::Pool(PoolError::ExceedsBindingLimit { .. }))
        ),
        "{result:?}"
    );

    // More workgroups along N than a dimension allows (64-wide tiles): no longer refused, the
    // grid is laid over rows of block tiles (see
    // `matmuls_beyond_65535_workgroups_along_m_or_n_split_their_grid`).
    let narrow = matmul_context(gpu(), Some(MatmulTiles::T64X64X8), Some(1));
    let limit = limits.max_compute_workgroups_per_dimension;
    let n = limit as usize * 64 + 1;
    let wide = narrow.matmul_plan(1, n, 1).unwrap();
    assert!(
        wide.workgroups.iter().all(|&count| count <= limit),
        "{wide:?}"
    );
    assert_eq!(
        context.pending_dispatches(),
        before,
        "failed ops record nothing"
    );

    // Options the device cannot run are refused when the context is made.
    let huge_tile = ContextOptions {
        matmul: MatmulOptions {
            tiles: Some(MatmulTiles::new(256, 256, 32)),
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    assert!(matches!(
        Context::new(context.pool(), huge_tile),
        Err(ComputeError::Config(_))
    ));
}

#[test]
fn ops_are_recorded_into_one_pass_and_pipelines_and_bind_groups_are_cached() {
    let context = context(gpu());
    let a = context.tensor(&[1.0; 17], &[17]).unwrap();
    let b = context.tensor(&[2.0; 17], &[17]).unwrap();
    let run = || {
        let mut sum = context.add(&a, &b).unwrap();
        for _ in 0..9 {
            sum = context.add(&sum, &b).unwrap();
        }
        sum.to_vec().unwrap()
    };
    let before = context.stats();
    assert_eq!(run(), vec![21.0; 17]);
    let first = context.stats();
    assert_eq!(first.dispatches - before.dispatches, 10);
    assert_eq!(first.passes - before.passes, 1, "one pass for the batch");
    assert_eq!(
        first.submissions - before.submissions,
        1,
        "one submission, by the read"
    );
    assert_eq!(first.pipelines_created, 1);
    assert!(first.cached_bind_groups > 0, "{first:?}");
    // The same work again: the ranges freed by the first round are reused in the same order, so
    // the bind groups come from the cache.
    assert_eq!(run(), vec![21.0; 17]);
    let second = context.stats();
    assert_eq!(second.pipelines_created, 1);
    assert!(
        second.bind_group_cache_hits - first.bind_group_cache_hits >= 5,
        "{first:?} → {second:?}"
    );
    // Identical parameters share a slot of the ring: one slot per batch here.
    assert_eq!(
        second.params_bytes_written - first.params_bytes_written,
        first.params_bytes_written - before.params_bytes_written
    );
}

#[test]
fn a_batch_is_submitted_when_it_reaches_its_op_limit() {
    let context = context_with(
        gpu(),
        ContextOptions {
            max_ops_per_batch: 4,
            ..ContextOptions::default()
        },
    );
    let x = context.tensor(&[1.0, -2.0, 3.0], &[3]).unwrap();
    let before = context.stats().submissions;
    let mut y = context.neg(&x).unwrap();
    for _ in 0..9 {
        y = context.neg(&y).unwrap();
    }
    // 10 dispatches, 4 per batch: two full batches submitted before the last one's read.
    assert_eq!(context.stats().submissions - before, 2);
    assert_eq!(context.pending_dispatches(), 2);
    assert_eq!(y.to_vec().unwrap(), vec![1.0, -2.0, 3.0]);
}

#[test]
fn an_overwrite_does_not_reach_ops_recorded_before_it() {
    let context = context(gpu());
    let x = context.tensor(&[1.0, -1.0, 2.0], &[3]).unwrap();
    let y = context.relu(&x).unwrap();
    context.write(&x, &[-5.0, 5.0, -5.0]).unwrap();
    let z = context.relu(&x).unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![1.0, 0.0, 2.0]);
    assert_eq!(z.to_vec().unwrap(), vec![0.0, 5.0, 0.0]);
    assert_eq!(x.to_vec().unwrap(), vec![-5.0, 5.0, -5.0]);
}

#[test]
fn profiling_times_every_kernel_with_gpu_timestamps() {
    let context = context_with(
        gpu(),
        ContextOptions {
            profile: true,
            ..ContextOptions::default()
        },
    );
    let support = context.timestamp_support();
    eprintln!("timestamps: {support:?}");
    let a = context.tensor(&[1.0; 1000], &[10, 100]).unwrap();
    let b = context.tensor(&[1.0; 1000], &[100, 10]).unwrap();
    let c = context.matmul(&a, &b).unwrap();
    let d = context.softmax(&c).unwrap();
    let e = context.add(&d, &d).unwrap();
    assert_close(
        "profiled softmax",
        &e.to_vec().unwrap(),
        &[0.2; 100],
        |_| 1e-6,
    );
    let timings = context.take_kernel_timings();
    if support == TimestampSupport::None {
        assert!(timings.is_empty());
        return;
    }
    let names: Vec<&str> = timings
        .iter()
        .map(|t| t.kernel.split(' ').next().unwrap())
        .collect();
    assert_eq!(names, ["matmul", "softmax", "add"], "{timings:?}");
    assert!(timings
        .iter()
        .all(|t| t.gpu_ns.is_finite() && t.gpu_ns >= 0.0));
    // One batch: starts from its first timestamp, in dispatch order (each dispatch depends on
    // the one before); the span covers every dispatch.
    assert_eq!(timings[0].start_ns, 0.0, "{timings:?}");
    assert!(
        timings
            .windows(2)
            .all(|pair| pair[1].start_ns >= pair[0].start_ns && pair[1].start_ns.is_finite()),
        "{timings:?}"
    );
    let span = KernelTiming::span_ns(&timings);
    let last = timings.last().unwrap();
    assert_eq!(span, last.start_ns + last.gpu_ns, "{timings:?}");
    assert!(timings.iter().all(|t| t.gpu_ns <= span), "{timings:?}");
    assert_eq!(KernelTiming::span_ns(&[]), 0.0);
    assert!(context.take_kernel_timings().is_empty(), "taken");
}

/// A 3-layer perceptron: weights and biases live as long as the test; every forward allocates its
/// intermediates from the pool.
struct Mlp {
    dims: [usize; 4],
    weights: Vec<(Vec<f32>, Vec<f32>)>,
    tensors: Vec<(Tensor, Tensor)>,
}

impl Mlp {
    fn new(context: &Context, dims: [usize; 4], rng: &mut StdRng) -> Self {
        let mut weights = Vec::new();
        let mut tensors = Vec::new();
        for layer in 0..3 {
            let (inputs, outputs) = (dims[layer], dims[layer + 1]);
            let scale = 1.0 / (inputs as f32).sqrt();
            let w = random(rng, inputs * outputs, -scale, scale);
            let b = random(rng, outputs, -0.1, 0.1);
            tensors.push((
                context.tensor(&w, &[inputs, outputs]).unwrap(),
                context.tensor(&b, &[outputs]).unwrap(),
            ));
            weights.push((w, b));
        }
        Self {
            dims,
            weights,
            tensors,
        }
    }

    /// The requested bytes of the weights.
    fn bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(w, b)| w.allocation().size() + b.allocation().size())
            .sum()
    }

    /// The forward pass on the GPU, dropping every intermediate as soon as it is consumed.
    /// `fused`: matmul with a bias + GELU epilogue; else matmul, add_bias, gelu.
    fn forward(&self, context: &Context, x: &[f32], batch: usize, fused: bool) -> Vec<f32> {
        let mut h = context.tensor(x, &[batch, self.dims[0]]).unwrap();
        for (layer, (w, b)) in self.tensors.iter().enumerate() {
            let activation = if layer < 2 {
                Activation::Gelu
            } else {
                Activation::None
            };
            h = if fused {
                context
                    .matmul_with(
                        &h,
                        w,
                        Epilogue {
                            bias: Some(b),
                            activation,
                            ..Default::default()
                        },
                    )
                    .unwrap()
            } else {
                let product = context.matmul(&h, w).unwrap();
                let biased = context.add_bias(&product, b).unwrap();
                drop(product);
                if activation == Activation::Gelu {
                    context.gelu(&biased).unwrap()
                } else {
                    biased
                }
            };
        }
        let probabilities = context.softmax(&h).unwrap();
        drop(h);
        probabilities.to_vec().unwrap()
    }

    fn forward_cpu(&self, x: &[f32], batch: usize) -> Vec<f32> {
        let mut h = x.to_vec();
        for (layer, (w, b)) in self.weights.iter().enumerate() {
            let activation = if layer < 2 {
                Activation::Gelu
            } else {
                Activation::None
            };
            h = cpu::matmul_with(
                &h,
                w,
                batch,
                self.dims[layer],
                self.dims[layer + 1],
                cpu::Epilogue {
                    bias: Some(b),
                    activation,
                    ..Default::default()
                },
            );
        }
        cpu::softmax(&h, self.dims[3])
    }
}

/// A tensor made (its bytes, and whether an op made it: an upload is not) or dropped, in a batch.
enum Step {
    Make(u64, bool),
    Drop(u64),
}

/// The most bytes a batch of `steps` holds: nothing dropped goes back to the pool before the
/// batch is submitted, but an op's output takes the memory of a tensor of its size dropped
/// earlier in the batch.
fn batch_peak(steps: &[Step]) -> u64 {
    let mut dropped: Vec<u64> = Vec::new();
    let mut held = 0;
    for step in steps {
        match *step {
            Step::Make(bytes, by_op) => match dropped.iter().position(|&d| d == bytes) {
                Some(index) if by_op => {
                    dropped.swap_remove(index);
                }
                _ => held += bytes,
            },
            Step::Drop(bytes) => dropped.push(bytes),
        }
    }
    held
}

/// Requested bytes of a tensor of `len` elements (rounded up to 16 bytes).
fn tensor_bytes(len: usize) -> u64 {
    (len as u64 * 4).div_ceil(16) * 16
}

#[test]
fn an_mlp_forward_returns_the_pool_to_the_weights_after_every_batch() {
    let dims = [37, 129, 64, 10];
    // (fused epilogue, submit as soon as anything was dropped)
    for (fused, eager) in [(true, false), (false, false), (true, true)] {
        let options = ContextOptions {
            flush_when_freed_bytes_exceed: eager.then_some(0),
            matmul: MatmulOptions {
                split_k: Some(1),
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        };
        let context = context_with(gpu(), options);
        let pool = context.pool().clone();
        let mut rng = StdRng::seed_from_u64(11);
        let mlp = Mlp::new(&context, dims, &mut rng);
        context.flush().unwrap();
        let weights = pool.stats();
        assert_eq!(weights.requested_bytes.current, mlp.bytes());
        for batch in [1, 3, 17, 64, 5] {
            pool.reset_peaks();
            let x = random(&mut rng, batch * dims[0], -1.0, 1.0);
            let probabilities = mlp.forward(&context, &x, batch, fused);
            let expected = mlp.forward_cpu(&x, batch);
            let what = format!("MLP batch {batch} fused {fused} eager {eager}");
            assert_close(&what, &probabilities, &expected, |i| {
                1e-4 * f64::from(expected[i]) + 1e-6
            });
            for row in probabilities.chunks(dims[3]) {
                let total: f32 = row.iter().sum();
                assert!((total - 1.0).abs() < 1e-5, "{what}: a row sums to {total}");
            }

            // Everything the batch allocated is given back once its last use is submitted.
            context.flush().unwrap();
            let after = pool.stats();
            assert_eq!(
                after.requested_bytes.current, weights.requested_bytes.current,
                "{what}: requested bytes back to the weights"
            );
            assert_eq!(
                after.allocated_bytes.current, weights.allocated_bytes.current,
                "{what}: allocated bytes back to the weights"
            );
            assert_eq!(
                after.allocations.current, 6,
                "{what}: only the weights live"
            );

            // The peak, from the forward's tensors in order: (bytes, made by an op) as each is
            // made, and the drops between them.
            let bytes = |layer: usize| tensor_bytes(batch * dims[layer]);
            let mut steps = vec![Step::Make(bytes(0), false)];
            for layer in 1..4 {
                if fused {
                    steps.extend([Step::Make(bytes(layer), true), Step::Drop(bytes(layer - 1))]);
                } else {
                    // product, biased, product dropped; GELU for the first two layers, biased
                    // dropped; the layer's input dropped.
                    steps.extend([
                        Step::Make(bytes(layer), true),
                        Step::Make(bytes(layer), true),
                        Step::Drop(bytes(layer)),
                    ]);
                    if layer < 3 {
                        steps.extend([Step::Make(bytes(layer), true), Step::Drop(bytes(layer))]);
                    }
                    steps.push(Step::Drop(bytes(layer - 1)));
                }
            }
            steps.extend([Step::Make(bytes(3), true), Step::Drop(bytes(3))]);
            let expected_peak = if eager {
                // Each op submits what came before it: only an op's input and output are live.
                let made: Vec<u64> = steps
                    .iter()
                    .filter_map(|step| match step {
                        Step::Make(bytes, _) => Some(*bytes),
                        Step::Drop(_) => None,
                    })
                    .collect();
                made.windows(2).map(|w| w[0] + w[1]).max().unwrap()
            } else {
                batch_peak(&steps)
            };
            assert_eq!(
                after.requested_bytes.peak - weights.requested_bytes.current,
                expected_peak,
                "{what}: peak of the intermediates"
            );
        }
    }
}

/// A tensor's place: its buffer and offset.
fn place(tensor: &Tensor) -> (wgpu_pool::policy::SegmentId, u64) {
    tensor.location().expect("a tensor with memory")
}

#[test]
fn an_op_output_takes_the_memory_of_a_tensor_dropped_in_the_open_batch() {
    for (name, gpu) in both() {
        let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
        pool.set_history(Some(HistoryOptions::default()));
        let context = Context::new(&pool, ContextOptions::default()).expect("context");
        let len = 4096;
        let a_values: Vec<f32> = (0..len).map(|i| i as f32 - 2000.0).collect();
        let b_values: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let a = context.tensor(&a_values, &[len]).unwrap();
        let b = context.tensor(&b_values, &[len]).unwrap();
        let sums: Vec<f32> = a_values.iter().zip(&b_values).map(|(a, b)| a + b).collect();
        let negated: Vec<f32> = sums.iter().map(|v| -v).collect();
        let squares: Vec<f32> = a_values.iter().map(|a| a * a).collect();

        // x is read by y's dispatch in the open batch, then dropped.
        let x = context.add(&a, &b).unwrap();
        let y = context.unary(UnaryOp::Neg, &x).unwrap();
        let x_place = place(&x);
        drop(x);
        // An upload never takes its memory: the data would land before the batch reads x.
        let upload = context.tensor(&b_values, &[len]).unwrap();
        assert_ne!(
            place(&upload),
            x_place,
            "{name}: an upload took a range the batch reads"
        );
        // Nor an op's output of another size.
        let half = context.tensor(&a_values[..len / 2], &[len / 2]).unwrap();
        let other = context.unary(UnaryOp::Relu, &half).unwrap();
        assert_ne!(place(&other), x_place, "{name}: another size took it");
        // An op's output of its size does: the batch orders its write after y's read.
        let z = context.binary(BinaryOp::Mul, &a, &a).unwrap();
        assert_eq!(
            place(&z),
            x_place,
            "{name}: the output did not take the dropped range"
        );
        assert_eq!(y.to_vec().unwrap(), negated, "{name}: y read x's data");
        assert_eq!(z.to_vec().unwrap(), squares, "{name}");

        // Overwritten from the host: the batch that reads the old data is submitted first.
        let x = context.add(&a, &b).unwrap();
        let y = context.unary(UnaryOp::Neg, &x).unwrap();
        let x_place = place(&x);
        drop(x);
        let z = context.binary(BinaryOp::Mul, &a, &a).unwrap();
        assert_eq!(place(&z), x_place, "{name}");
        context.write(&z, &b_values).unwrap();
        assert_eq!(
            y.to_vec().unwrap(),
            negated,
            "{name}: the upload landed before the read"
        );
        assert_eq!(z.to_vec().unwrap(), b_values, "{name}");

        // The history tells the two owners apart: the add freed, the mul made, in one place.
        let history = pool.history().expect("history is on");
        let at_place: Vec<(EventKind, &str)> = history
            .events()
            .iter()
            .filter(|event| {
                event.offset_bytes == x_place.1
                    && matches!(event.kind, EventKind::Alloc | EventKind::FreeCompleted)
            })
            .map(|event| (event.kind, event.label.as_str()))
            .collect();
        assert!(
            at_place
                .windows(2)
                .any(|w| w == [(EventKind::FreeCompleted, "add"), (EventKind::Alloc, "mul")]),
            "{name}: {at_place:?}"
        );

        // A stream of ops of one size holds two ranges, not one per op.
        drop((y, z, upload, half, other));
        context.flush().unwrap();
        pool.reset_peaks();
        let before = pool.stats();
        let mut x = context.add(&a, &b).unwrap();
        for _ in 0..64 {
            x = context.binary(BinaryOp::Add, &x, &b).unwrap();
        }
        let expected: Vec<f32> = sums
            .iter()
            .zip(&b_values)
            .map(|(s, b)| s + 64.0 * b)
            .collect();
        assert_eq!(x.to_vec().unwrap(), expected, "{name}");
        let bytes = (len * 4) as u64;
        assert_eq!(
            pool.stats().requested_bytes.peak - before.requested_bytes.current,
            2 * bytes,
            "{name}: a chain of 65 adds held more than two outputs"
        );
        // Issue 26, item 2: one definition of an allocation. Replayed from the start, the history
        // gives the counters' totals: each hand-over is a free and an allocation in both.
        drop(x);
        context.flush().unwrap();
        history_replays_into_the_counters(name, &pool);
    }
}

#[test]
fn contexts_and_tensors_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Context>();
    assert_send_sync::<Tensor>();
    let context = context(gpu());
    let x = context.tensor(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5]).unwrap();
    let results: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (context, x) = (&context, &x);
                scope.spawn(move || {
                    let y = context.binary_scalar(BinaryOp::Mul, x, i as f32).unwrap();
                    context.read(&y).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, values) in results.iter().enumerate() {
        let expected: Vec<f32> = [1.0, 2.0, 3.0, 4.0, 5.0]
            .iter()
            .map(|v| v * i as f32)
            .collect();
        assert_eq!(values, &expected);
    }
}

#[test]
fn ops_run_on_the_naive_baseline_and_give_its_buffers_back() {
    let pool = Pool::naive(gpu(), PoolOptions::default());
    let context = Context::new(&pool, ContextOptions::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(12);
    let (m, k, n) = (17, 33, 9);
    let a = random(&mut rng, m * k, -1.0, 1.0);
    let b = random(&mut rng, k * n, -1.0, 1.0);
    let ta = context.tensor(&a, &[m, k]).unwrap();
    let tb = context.tensor(&b, &[k, n]).unwrap();
    let c = context.matmul(&ta, &tb).unwrap();
    let probabilities = context.softmax(&c).unwrap();
    drop(c);
    // Every op's output is a new buffer there: no bind group is kept, not even while the batch is
    // open (a kept one would only hold dropped buffers).
    assert!(context.pending_dispatches() > 0, "the batch is still open");
    let open = context.stats();
    assert_eq!(open.cached_bind_groups, 0, "{open:?}");
    assert_eq!(open.bind_groups_created, open.dispatches, "{open:?}");
    let expected = cpu::softmax(&cpu::matmul(&a, &b, m, k, n), n);
    assert_close(
        "naive softmax(matmul)",
        &probabilities.to_vec().unwrap(),
        &expected,
        |i| 1e-5 * f64::from(expected[i]) + 1e-6,
    );
    drop(probabilities);
    context.flush().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.allocations.current, 2, "only the inputs live");
    assert_eq!(stats.segments.current, 2, "one buffer per live tensor");
    let context_stats = context.stats();
    assert_eq!(
        context_stats.bind_groups_created, context_stats.dispatches,
        "{context_stats:?}"
    );
}

/// Sizes at the edges: nothing, one, the u32 and u31 boundaries, far beyond, and `usize::MAX`.
const EXTREMES: [usize; 12] = [
    0,
    1,
    3,
    4,
    65_536,
    (1 << 30) + 1,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    1 << 40,
    usize::MAX - 1,
    usize::MAX,
];

/// A context on a pool of 64 MiB budget, shared by the cases of the property tests: nothing they
/// ask for may allocate more.
fn small_budget_context() -> &'static Context {
    static CONTEXT: std::sync::OnceLock<Context> = std::sync::OnceLock::new();
    CONTEXT.get_or_init(|| {
        let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
        pool.set_budget(Some(64 << 20));
        Context::new(&pool, ContextOptions::default()).expect("context")
    })
}

fn extreme() -> impl proptest::strategy::Strategy<Value = usize> {
    proptest::sample::select(EXTREMES.to_vec())
}

fn extreme_u32() -> impl proptest::strategy::Strategy<Value = u32> {
    proptest::sample::select(vec![
        0,
        1,
        3,
        8,
        16,
        65_535,
        1 << 31,
        u32::MAX - 7,
        u32::MAX,
    ])
}

mod extreme_sizes {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn matmul_plans_of_any_size_are_plans_or_typed_errors(
            m in extreme(), n in extreme(), k in extreme()
        ) {
            let context = small_budget_context();
            if let Ok(plan) = context.matmul_plan(m, n, k) {
                let limit = context.limits().max_compute_workgroups_per_dimension;
                prop_assert!(plan.workgroups.iter().all(|&count| (1..=limit).contains(&count)));
                prop_assert!(m > 0 && n > 0 && k > 0);
            }
        }

        #[test]
        fn tensors_of_any_shape_are_tensors_or_typed_errors(
            shape in proptest::collection::vec(extreme(), 0..4)
        ) {
            let context = small_budget_context();
            let len = shape.iter().try_fold(1usize, |len, &dim| len.checked_mul(dim));
            let data = vec![1.0f32; len.unwrap_or(0).min(64)];
            if let Ok(tensor) = context.tensor(&data, &shape) {
                prop_assert_eq!(tensor.len(), data.len());
                prop_assert_eq!(tensor.shape(), &shape[..]);
                // Ops over the shapes a tensor can have: results or typed errors.
                let _ = context.relu(&tensor);
                let _ = context.add(&tensor, &tensor);
                let _ = context.add_bias(&tensor, &tensor);
                let _ = context.sum(&tensor);
                let _ = context.softmax(&tensor);
                let _ = context.matmul(&tensor, &tensor);
                prop_assert!(context.write(&tensor, &data).is_ok());
            }
            let tensor = context.tensor(&[1.0; 4], &[4]).unwrap();
            match tensor.reshape(&shape) {
                Ok(tensor) => prop_assert_eq!(tensor.len(), 4),
                // Given back whole.
                Err(refused) => {
                    prop_assert_eq!(refused.tensor.shape(), &[4]);
                    prop_assert_eq!(refused.tensor.to_vec().unwrap(), vec![1.0; 4]);
                }
            }
            for tensor in [context.zeros(&shape), context.empty(&shape)].into_iter().flatten() {
                prop_assert_eq!(tensor.shape(), &shape[..]);
            }
        }

        /// Every tile and every option, however extreme, is accepted or refused with
        /// `ComputeError::Config`; every plan of a context made with them is a plan within the
        /// device's grid or one of the typed refusals `Context::matmul_plan` names. A panic fails
        /// the case (proptest catches it).
        #[test]
        fn options_and_tiles_of_any_size_are_accepted_or_typed_errors(
            sizes in proptest::collection::vec(extreme_u32(), 9),
            m in extreme(), n in extreme(), k in extreme(),
        ) {
            let context = small_budget_context();
            let limits = context.limits();
            let tiles = MatmulTiles::new(sizes[0], sizes[1], sizes[2]).per_invocation(sizes[3], sizes[4]);
            prop_assert!(!tiles.to_string().is_empty());
            let tiles_accepted = match tiles.check(limits) {
                Ok(()) => {
                    prop_assert!(tiles.threads() <= limits.max_compute_invocations_per_workgroup);
                    prop_assert!(
                        tiles.workgroup_storage_bytes() <= limits.max_compute_workgroup_storage_size
                    );
                    true
                }
                Err(ComputeError::Config(_)) => false,
                Err(other) => {
                    return Err(TestCaseError::fail(format!("tile {tiles}: refused with {other:?}")));
                }
            };
            // A plan, within the device's grid, or a refusal of the sizes.
            let check_plan = |context: &Context| -> Result<(), TestCaseError> {
                match context.matmul_plan(m, n, k) {
                    Ok(plan) => {
                        let limit = limits.max_compute_workgroups_per_dimension;
                        prop_assert!(plan.workgroups.iter().all(|&count| (1..=limit).contains(&count)));
                        prop_assert!(m > 0 && n > 0 && k > 0);
                    }
                    Err(
                        ComputeError::InvalidShape { .. }
                        | ComputeError::ParameterOverflow { .. }
                        | ComputeError::ExceedsLimit { .. },
                    ) => {}
                    Err(other) => {
                        return Err(TestCaseError::fail(format!("{m}×{n}×{k}: refused with {other:?}")));
                    }
                }
                Ok(())
            };
            let options = ContextOptions {
                max_ops_per_batch: sizes[5],
                max_grid_x: Some(sizes[6]),
                max_cached_bind_groups: m,
                flush_when_freed_bytes_exceed: Some(n as u64),
                matmul: MatmulOptions {
                    tiles: (sizes[7] % 2 == 0).then_some(tiles),
                    split_k: Some(sizes[8]),
                    min_workgroups: sizes[5],
                    split_workgroups: sizes[6],
                    min_split_depth: sizes[6],
                    max_splits: sizes[8],
                    group_rows: sizes[7],
                    narrow_max_rows: sizes[3],
                    narrow_lanes: Some(sizes[4]),
                    narrow_splits: Some(sizes[2]),
                    ..MatmulOptions::default()
                },
                ..ContextOptions::default()
            };
            match Context::new(context.pool(), options.clone()) {
                Ok(made) => {
                    // A forced tile the device refuses never makes a context.
                    prop_assert!(options.matmul.tiles.is_none() || tiles_accepted);
                    check_plan(&made)?;
                }
                Err(ComputeError::Config(_)) => {}
                Err(other) => {
                    return Err(TestCaseError::fail(format!("{options:?}: refused with {other:?}")));
                }
            }
            // The automatic choices with extreme knobs.
            let options = ContextOptions {
                matmul: MatmulOptions {
                    split_k: None,
                    narrow_lanes: None,
                    narrow_splits: None,
                    tiles: None,
                    small_tiles: tiles,
                    ..options.matmul
                },
                ..ContextOptions::default()
            };
            match Context::new(context.pool(), options.clone()) {
                Ok(made) => check_plan(&made)?,
                Err(ComputeError::Config(_)) => {}
                Err(other) => {
                    return Err(TestCaseError::fail(format!("{options:?}: refused with {other:?}")));
                }
            }
        }
    }
}

#[test]
fn matmul_grids_past_the_x_limit_are_split_over_rows_of_workgroups() {
    let mut rng = StdRng::seed_from_u64(31);
    let limited = |tiles: Option<MatmulTiles>, split_k: Option<u32>, lanes: Option<u32>| {
        context_with(
            gpu(),
            ContextOptions {
                max_grid_x: Some(2),
                matmul: MatmulOptions {
                    tiles,
                    split_k,
                    narrow_lanes: lanes,
                    ..MatmulOptions::default()
                },
                ..ContextOptions::default()
            },
        )
    };
    // Tiled (vec4, and scalar with edges), without and with split-K: 3 × 5 block tiles of 64×64
    // laid over rows of 2 workgroups.
    for (split_k, (m, k, n)) in [
        (Some(1), (130, 20, 300)),
        (Some(1), (129, 21, 301)),
        (Some(3), (130, 100, 300)),
    ] {
        let context = limited(Some(MatmulTiles::T64X64X8), split_k, None);
        let plan = context.matmul_plan(m, n, k).unwrap();
        assert_eq!(plan.narrow_lanes, 0);
        assert!(
            plan.workgroups[0] <= 2 && plan.workgroups[1] > 3,
            "{plan:?}"
        );
        assert_eq!(plan.splits, split_k.unwrap());
        for (bias, activation) in [(false, Activation::None), (true, Activation::Relu)] {
            check_matmul(
                &context,
                "split grid",
                (m, k, n),
                bias,
                activation,
                &mut rng,
            );
        }
    }
    // Narrow: 7 workgroups of one vec4 column each, over rows of 2.
    let context = limited(None, None, Some(1));
    let plan = context.matmul_plan(3, 28, 16).unwrap();
    assert_eq!(plan.narrow_lanes, 1);
    assert_eq!(plan.workgroups, [2, 4, 1]);
    check_matmul(
        &context,
        "split narrow grid",
        (3, 16, 28),
        true,
        Activation::Relu,
        &mut rng,
    );
    // Narrow split along K too: the same grid, 3 splits along z.
    let context = context_with(
        gpu(),
        ContextOptions {
            max_grid_x: Some(2),
            matmul: MatmulOptions {
                narrow_lanes: Some(1),
                narrow_splits: Some(3),
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        },
    );
    let plan = context.matmul_plan(3, 28, 48).unwrap();
    assert_eq!(plan.workgroups, [2, 4, 3]);
    check_matmul(
        &context,
        "split narrow grid along K",
        (3, 48, 28),
        true,
        Activation::Gelu,
        &mut rng,
    );
}

#[test]
fn matmuls_beyond_65535_workgroups_along_m_or_n_split_their_grid() {
    let context = context(gpu());
    let limit = context.limits().max_compute_workgroups_per_dimension;
    let mut rng = StdRng::seed_from_u64(32);
    let run = |context: &Context, (m, n): (usize, usize), values: &[f32]| {
        let plan = context.matmul_plan(m, n, 1).unwrap();
        let tiles = m.div_ceil(plan.tiles.bm as usize) * n.div_ceil(plan.tiles.bn as usize);
        assert!(tiles > limit as usize, "{m}x1·1x{n}: {plan:?}");
        assert!(
            plan.workgroups.iter().all(|&count| count <= limit),
            "{plan:?}"
        );
        let a = context.tensor(&values[..m], &[m, 1]).unwrap();
        let b = context.tensor(&values[..n], &[1, n]).unwrap();
        let c = context.matmul(&a, &b).unwrap().to_vec().unwrap();
        let expected = cpu::matmul(&values[..m], &values[..n], m, 1, n);
        assert_close(&format!("{m}x1·1x{n}"), &c, &expected, exact);
    };
    // The fewest rows (columns) of one element past the limit with the 64×64 tile: one more tile
    // than a dimension holds.
    let long = limit as usize * 64 + 1;
    if long > 1 << 26 {
        eprintln!("the device takes {limit} workgroups per dimension: too many rows to test");
        return;
    }
    let values = random(&mut rng, 8_960_000.max(long), -1.0, 1.0);
    let small_tiles = matmul_context(gpu(), Some(MatmulTiles::T64X64X8), Some(1));
    for shape in [(long, 1), (1, long)] {
        run(&small_tiles, shape, &values);
    }
    // The issue's shape with the automatic plan: 8,960,000 rows of one element are 70,000 tiles
    // of the large tile's 128 rows. Run on the GPU only off GL: there one long dispatch holds the
    // device's one context lock for seconds, and wgpu's other threads give up after 6 s (the
    // smaller shapes above run the same grid on GL).
    let issue = 8_960_000;
    if context.gpu().info.backend == wgpu::Backend::Gl {
        let plan = context.matmul_plan(issue, 1, 1).unwrap();
        assert!(
            plan.workgroups.iter().all(|&count| count <= limit),
            "{plan:?}"
        );
    } else {
        run(&context, (issue, 1), &values);
    }
}

#[test]
fn zeros_are_cleared_on_the_gpu_and_empty_tensors_are_allocated_only() {
    let context = context(gpu());
    // Dirty memory first: the range a dropped tensor leaves is what the next one gets.
    for len in LENGTHS {
        let dirty = context.tensor(&vec![7.0; len], &[len]).unwrap();
        drop(dirty);
        context.flush().unwrap();
        let zeros = context.zeros(&[len]).unwrap();
        assert_eq!(zeros.shape(), [len]);
        assert_eq!(zeros.to_vec().unwrap(), vec![0.0; len], "zeros of {len}");
        let empty = context.empty(&[1, len]).unwrap();
        assert_eq!((empty.shape(), empty.len()), (&[1, len][..], len));
    }
    // Zeros feed ops recorded after them in the same batch, and an overwrite lands after the
    // clear (it submits the batch first).
    let x = context.tensor(&[1.0, -2.0, 3.0], &[3]).unwrap();
    let zeros = context.zeros(&[3]).unwrap();
    let sum = context.add(&x, &zeros).unwrap();
    assert_eq!(sum.to_vec().unwrap(), [1.0, -2.0, 3.0]);
    let zeros = context.zeros(&[3]).unwrap();
    context.write(&zeros, &[4.0, 5.0, 6.0]).unwrap();
    assert_eq!(zeros.to_vec().unwrap(), [4.0, 5.0, 6.0]);
    // An empty tensor written by an op.
    let out = context.empty(&[3]).unwrap();
    context.write(&out, &[1.0, 1.0, 1.0]).unwrap();
    assert_eq!(out.to_vec().unwrap(), [1.0; 3]);
    // Typed errors, and sizes refused before anything is allocated.
    let pool = context.pool();
    pool.set_budget(Some(64 << 20));
    for shape in [&[][..], &[0], &[3, 0], &[usize::MAX, 2], &[1 << 29]] {
        let before = pool.stats();
        assert!(context.zeros(shape).is_err(), "{shape:?}");
        assert!(context.empty(shape).is_err(), "{shape:?}");
        assert_eq!(
            pool.stats().allocated_bytes.current,
            before.allocated_bytes.current
        );
    }
    pool.set_budget(None);
}

#[test]
fn a_refused_reshape_gives_the_tensor_back() {
    let context = context(gpu());
    let x = context
        .tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
        .unwrap();
    let refused = x.reshape(&[4, 2]).unwrap_err();
    assert!(matches!(refused.error, ComputeError::ShapeMismatch { .. }));
    assert!(refused.to_string().contains("reshape"), "{refused}");
    let as_compute_error: ComputeError = context
        .tensor(&[1.0], &[1])
        .unwrap()
        .reshape(&[0])
        .unwrap_err()
        .into();
    assert!(matches!(
        as_compute_error,
        ComputeError::InvalidShape { .. }
    ));
    let x = refused.into_tensor();
    assert_eq!(x.shape(), [2, 3]);
    let x = x.reshape(&[3, 2]).unwrap();
    assert_eq!(x.shape(), [3, 2]);
    assert_eq!(x.to_vec().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn cpu_twins_take_extreme_sizes_without_arithmetic_overflow() {
    assert!(cpu::sum(&[], 0).is_empty());
    assert!(cpu::softmax(&[], 0).is_empty());
    assert!(cpu::add_bias(&[], &[]).is_empty());
    assert!(cpu::matmul(&[], &[], 0, usize::MAX, 0).is_empty());
    // Sizes that do not describe the slices are the oracle's precondition: a panic that says
    // so, never an arithmetic overflow.
    for sizes in [
        (usize::MAX, usize::MAX, 1),
        (1 << 40, 1 << 40, 1),
        (2, 3, 5),
    ] {
        let message = std::panic::catch_unwind(|| {
            cpu::matmul(&[1.0; 6], &[1.0; 12], sizes.0, sizes.1, sizes.2)
        })
        .expect_err("sizes that do not fit the slices");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| message.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(message.contains("matmul twin"), "{sizes:?}: {message}");
    }
}

#[test]
fn tensors_read_back_without_blocking_the_thread() {
    // Issue 13, item 12: the context's read as a future, after ops still recorded in the batch.
    let context = context(gpu());
    let a = context
        .tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
        .unwrap();
    let b = context.tensor(&[0.5; 6], &[2, 3]).unwrap();
    let sum = context.add(&a, &b).unwrap(); // recorded, not submitted
    let read = pollster::block_on(sum.to_vec_async()).unwrap();
    assert_eq!(read, [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]);
    assert_eq!(read, sum.to_vec().unwrap());
    let again = pollster::block_on(context.read_async(&sum)).unwrap();
    assert_eq!(again, read);
}

/// The plan of `[m, k] · [k, n]` for `(m, k, n)`, tuned now: tuning runs in a pool of its own, so
/// the context's pool gains no segment from it.
fn tuned_plan(context: &Context, (m, k, n): (usize, usize, usize)) -> MatmulPlan {
    let before = context.pool().stats();
    let plan = context.matmul_plan(m, n, k).unwrap();
    let after = context.pool().stats();
    assert_eq!(
        (after.create_segment_calls, after.reserved_bytes.current),
        (before.create_segment_calls, before.reserved_bytes.current),
        "{:?}",
        (m, k, n)
    );
    plan
}

#[test]
fn autotuned_matmuls_agree_with_the_twin_and_keep_their_choice() {
    let context = context_with(
        gpu(),
        ContextOptions {
            matmul: MatmulOptions {
                autotune: Autotune::Always,
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        },
    );
    let mut rng = StdRng::seed_from_u64(77);
    // Past the narrow kernel's rows; deep K (split candidates), odd sizes (scalar, edges).
    for shape in [(24, 1024, 36), (33, 65, 20), (64, 512, 128)] {
        let (m, k, n) = shape;
        let first = tuned_plan(&context, shape);
        check_matmul(
            &context,
            "autotuned",
            shape,
            true,
            Activation::Gelu,
            &mut rng,
        );
        // The class keeps its choice: the same plan, and for another M of the class too.
        assert_eq!(context.matmul_plan(m, n, k).unwrap(), first);
        let other = context
            .matmul_plan(m.next_power_of_two() - 1, n, k)
            .unwrap();
        assert_eq!(
            (other.tiles, other.splits),
            (first.tiles, first.splits),
            "{shape:?}"
        );
        assert!(first.narrow_lanes == 0);
    }
}

#[test]
fn autotuned_narrow_matmuls_agree_with_the_twin_and_keep_their_choice() {
    let options = ContextOptions {
        matmul: MatmulOptions {
            autotune: Autotune::Always,
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    let context = context_with(gpu(), options.clone());
    let mut rng = StdRng::seed_from_u64(78);
    // Few rows (the narrow kernel), K deep enough for split candidates, N for several lanes.
    for shape in [(1, 512, 256), (8, 256, 512), (5, 64, 96)] {
        let (m, k, n) = shape;
        let first = tuned_plan(&context, shape);
        assert!(
            first.narrow_lanes.is_power_of_two() && first.narrow_lanes <= 128,
            "{shape:?}: {first:?}"
        );
        // Products follow the choice, with the epilogue in the product or in the reduction.
        check_matmul(
            &context,
            "autotuned narrow",
            shape,
            true,
            Activation::Gelu,
            &mut rng,
        );
        check_matmul(
            &context,
            "autotuned narrow",
            shape,
            false,
            Activation::Relu,
            &mut rng,
        );
        // The shape keeps its choice, in this context and in another of the same device and
        // options.
        assert_eq!(context.matmul_plan(m, n, k).unwrap(), first, "{shape:?}");
        let other = context_with(gpu(), options.clone());
        assert_eq!(other.matmul_plan(m, n, k).unwrap(), first, "{shape:?}");
    }
    // Forced lanes and splits are not tuned.
    let forced = context_with(
        gpu(),
        ContextOptions {
            matmul: MatmulOptions {
                autotune: Autotune::Always,
                narrow_lanes: Some(8),
                narrow_splits: Some(2),
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        },
    );
    let plan = forced.matmul_plan(8, 256, 256).unwrap();
    assert_eq!((plan.narrow_lanes, plan.splits), (8, 2));
}

#[test]
fn groups_of_more_tile_rows_than_there_are_visit_every_tile() {
    // GROUP_M · tiles_n once wrapped in a u32 for large group_rows, and some tiles went unwritten.
    let mut rng = StdRng::seed_from_u64(79);
    for group_rows in [1, 3, 1 << 16, 1 << 30, 1 << 31, (1 << 31) + 1, u32::MAX] {
        let context = context_with(
            gpu(),
            ContextOptions {
                matmul: MatmulOptions {
                    group_rows,
                    autotune: Autotune::Off,
                    ..MatmulOptions::default()
                },
                ..ContextOptions::default()
            },
        );
        check_matmul(
            &context,
            &format!("group_rows {group_rows}"),
            (128, 32, 256),
            true,
            Activation::None,
            &mut rng,
        );
    }
}

#[test]
fn contexts_tuning_one_shape_at_once_run_one_plan() {
    // Options of this test alone (an odd `min_workgroups`): a registry no other test fills.
    let options = ContextOptions {
        matmul: MatmulOptions {
            autotune: Autotune::Always,
            min_workgroups: 6,
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    // A narrow shape and a tiled one, each tuned by three contexts at once: the first choice
    // stored is the one every context runs, however their timings came out.
    for (m, k, n) in [(3, 64, 40), (24, 72, 36)] {
        let start = std::sync::Barrier::new(3);
        let plans: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        let context = context_with(gpu(), options.clone());
                        start.wait();
                        context.matmul_plan(m, n, k).unwrap()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(plans.iter().all(|plan| *plan == plans[0]), "{plans:?}");
        let later = context_with(gpu(), options.clone());
        assert_eq!(later.matmul_plan(m, n, k).unwrap(), plans[0]);
    }
}

/// Asserts that `op` fails with an error `expected` accepts, and that it recorded and allocated
/// nothing (shared by the transformer and attention tests).
pub fn refused<T>(
    context: &Context,
    what: &str,
    op: impl FnOnce() -> Result<T, ComputeError>,
    expected: impl Fn(&ComputeError) -> bool,
) {
    let pending = context.pending_dispatches();
    let allocations = context.pool().stats().allocations.total;
    match op() {
        Ok(_) => panic!("{what}: accepted"),
        Err(error) => assert!(expected(&error), "{what}: {error:?}"),
    }
    assert_eq!(context.pending_dispatches(), pending, "{what}: recorded");
    assert_eq!(
        context.pool().stats().allocations.total,
        allocations,
        "{what}: allocated"
    );
}

/// WebGPU refuses one buffer range bound twice in a dispatch where a binding is writable (every
/// binding here is): a tensor given twice is bound the second time through a copy, so `x · x`
/// and `x + x` compute as their twins, eagerly and planned; a matmul without a bias binds a
/// tensor of its own in the bias's place; a cache written in place and given twice is refused.
#[test]
fn a_tensor_given_twice_is_bound_once_and_a_cache_given_twice_is_refused() {
    let context = context_with(gpu(), ContextOptions::default());
    let mut rng = StdRng::seed_from_u64(77);
    let x = random(&mut rng, 24 * 24, -1.0, 1.0);
    let tx = context.tensor(&x, &[24, 24]).unwrap();
    let sum = context.add(&tx, &tx).unwrap().to_vec().unwrap();
    assert_eq!(sum, cpu::add(&x, &x));
    let square = context.matmul(&tx, &tx).unwrap().to_vec().unwrap();
    assert_close("x · x", &square, &cpu::matmul(&x, &x, 24, 24, 24), |i| {
        1e-5 * (f64::from(square[i]).abs() + 1.0)
    });
    let mut capture = context.capture().unwrap();
    let input = capture.input(&[24, 24]).unwrap();
    let doubled = context.mul(&input, &input).unwrap();
    let mut plan = capture.finish(&[&doubled]).unwrap();
    let replayed = plan.run(&[wgpu_pool::compute::Feed::Data(&x)]).unwrap();
    assert_eq!(replayed[0], cpu::mul(&x, &x));
    // A cache written in place may not be another of the op's tensors (here its reshape, as
    // the new token).
    let (k_cache, v_cache) = (
        context.zeros(&[1, 1, 1, 4]).unwrap(),
        context.zeros(&[1, 1, 1, 4]).unwrap(),
    );
    let token = k_cache.clone().reshape(&[1, 1, 4]).unwrap();
    let table = context.tensor(&[0.0], &[1, 1]).unwrap();
    let positions = context.tensor(&[0.0], &[1]).unwrap();
    let pending = context.pending_dispatches();
    assert!(matches!(
        context.kv_write(&k_cache, &v_cache, &token, &token, &table, &positions),
        Err(ComputeError::AliasedCache { op: "kv_write" })
    ));
    assert_eq!(context.pending_dispatches(), pending, "nothing recorded");
    let other = context.zeros(&[1, 1, 4]).unwrap();
    context
        .kv_write(&k_cache, &v_cache, &other, &other, &table, &positions)
        .unwrap();
}
