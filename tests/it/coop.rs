//! f16 matmuls on cooperative matrices (`shaders/matmul_coop.wgsl`, the tensor cores), on a
//! device opened with `GpuOptions::cooperative_matrix`: every tile against the CPU twin (the f32
//! twin on the f16 inputs, rounded to f16) on odd shapes, with and without the fused bias, GELU
//! and residual, with a split of K, with and without wgpu's bounds checks.
//!
//! Where the adapter offers no cooperative matrices (lavapipe, llvmpipe, most GPUs but recent
//! NVIDIA and AMD ones under Vulkan), the tests check what they can — the device was opened
//! without the feature, the plans fall back to the portable kernels, whose numbers they check —
//! and say so on stderr: they never pass as if the cooperative kernel had been tested. (naga
//! validates and translates every variant of the kernel without a GPU: `src/compute/kernels`.)

use rand::{rngs::StdRng, SeedableRng};
use wgpu_pool::compute::{
    cpu, Activation, Context, ContextOptions, CoopTiles, DType, Epilogue, MatmulOptions,
};
use wgpu_pool::{request_gpu_with, Gpu, GpuOptions};

use crate::compute::{assert_close, context_with, random, storage_tolerance, U};
use crate::gpu::gpu;

/// The odd shapes (M, N, K) of issue 28: rows below a fragment, partial tiles everywhere, K
/// not a multiple of 4 (scalar bindings), and a whole one.
const SHAPES: [(usize, usize, usize); 5] = [
    (1, 17, 33),
    (37, 129, 70),
    (130, 250, 96),
    (16, 64, 100),
    (256, 512, 512),
];

/// A device of this test's own, opened with cooperative matrices where the adapter has them.
/// Panics without an adapter (a GPU test never passes without a GPU).
fn cooperative_gpu() -> Gpu {
    let _ = env_logger::builder().is_test(true).try_init();
    let options = GpuOptions::default().with_cooperative_matrix(true);
    match request_gpu_with(options) {
        Ok(gpu) => {
            eprintln!(
                "cooperative test device: {gpu} (cooperative matrices: {})",
                gpu.cooperative_matrix()
            );
            gpu
        }
        Err(error) => panic!("this test needs a GPU adapter and found none: {error}"),
    }
}

/// Whether the matmul's choice takes the cooperative kernel on `gpu` for f16: the feature with
/// 16×16×16 f16 → f32 and subgroups of a fixed 32 (see `DeviceCaps::cooperative_f16`).
fn runs_cooperative(gpu: &Gpu) -> bool {
    gpu.cooperative_matmul_f16()
        && gpu.device.features().contains(wgpu::Features::SUBGROUP)
        && gpu.info.subgroup_min_size == CoopTiles::SUBGROUP_SIZE
        && gpu.info.subgroup_max_size == CoopTiles::SUBGROUP_SIZE
}

fn options(matmul: MatmulOptions) -> ContextOptions {
    ContextOptions {
        matmul,
        ..ContextOptions::default()
    }
}

/// `act(A · B + bias) + residual` of f16 operands on `context` against the twin. The
/// tolerance: twice the tiled kernels' f32 bound (a tensor core's f32 sums may truncate rather
/// than round, and add in another order), u·|c| for the residual's add, plus one f16 ulp of the
/// stored result.
fn check(
    context: &Context,
    what: &str,
    (m, n, k): (usize, usize, usize),
    (bias, activation, residual): (bool, Activation, bool),
    rng: &mut StdRng,
) {
    let dtype = DType::F16;
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
    let epilogue = Epilogue {
        bias: bias.then_some(&tbias),
        activation,
        residual: residual.then_some(&tresidual),
    };
    let c = context.matmul_with(&ta, &tb, epilogue).unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], dtype));
    let got = c.to_vec().unwrap();
    let twin = cpu::matmul_with(
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
    );
    let expected = cpu::rounded(&twin, dtype);
    let magnitude = cpu::matmul_magnitude(&a, &b, m, k, n);
    assert_close(
        &format!("{what} {m}x{n}x{k} bias {bias} {activation:?} residual {residual}"),
        &got,
        &expected,
        |i| {
            let c = f64::from(expected[i]).abs();
            let mut bound = 4.0 * k as f64 * U * f64::from(magnitude[i]) + 2.0 * U * c;
            if activation == Activation::Gelu {
                bound += 1e-5 * c + 1e-6;
            }
            if residual {
                bound += U * c;
            }
            bound + storage_tolerance(dtype, expected[i])
        },
    );
}

#[test]
fn cooperative_matrices_are_opened_only_when_asked_for_and_offered() {
    let asked = cooperative_gpu();
    let adapter = asked
        .adapter
        .as_ref()
        .expect("request_gpu_with keeps its adapter");
    let offered = adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
    assert_eq!(asked.cooperative_matrix(), offered);
    assert!(!asked.cooperative_matmul_f16() || offered);
    // Never silently: a device opened without the option has no experimental feature.
    assert!(!gpu().cooperative_matrix());
    assert!(!gpu().cooperative_matmul_f16());
    if !offered {
        eprintln!(
            "cooperative matrices: {} offers none: checked that the device was opened without \
             them",
            asked.info.name
        );
    }
    // A device handed in keeps what it was opened with.
    let adopted = Gpu::from_device(asked.device.clone(), asked.queue.clone());
    assert_eq!(adopted.cooperative_matrix(), offered);
}

#[test]
fn f16_matmul_on_cooperative_matrices_matches_its_twin() {
    let gpu = cooperative_gpu();
    let mut rng = StdRng::seed_from_u64(28);
    let automatic = context_with(&gpu, ContextOptions::default());
    if !automatic.supports(DType::F16) {
        // The plans of f16 products are the portable kernels' all the same.
        for (m, n, k) in SHAPES {
            let plan = automatic.matmul_plan_for(DType::F16, m, n, k).unwrap();
            assert_eq!(plan, automatic.matmul_plan(m, n, k).unwrap());
            assert_eq!(plan.cooperative, None);
        }
        eprintln!(
            "cooperative matmul: {} has no SHADER_F16: checked that f16 plans fall back to the \
             portable kernels, nothing to multiply (the typed error is checked in f16.rs)",
            gpu.info.name
        );
        return;
    }
    let coop = runs_cooperative(&gpu);
    if !coop {
        eprintln!(
            "cooperative matmul NOT TESTED: {} (cooperative matrices: {}, 16x16x16 f16 -> f32: \
             {}, subgroups {}-{}) does not run the cooperative kernel; checked instead that f16 \
             plans fall back to the portable kernels and that those match the twin",
            gpu.info.name,
            gpu.cooperative_matrix(),
            gpu.cooperative_matmul_f16(),
            gpu.info.subgroup_min_size,
            gpu.info.subgroup_max_size
        );
    }
    let limits = gpu.device.limits();
    // (name, context, the tile its plans must have where the kernel runs: None for the rules'
    // choice, which takes it from 16 rows on)
    let mut cases: Vec<(String, Context, Option<CoopTiles>)> =
        vec![("automatic".into(), automatic, None)];
    for tiles in CoopTiles::ALL {
        if tiles.check(&limits).is_err() {
            eprintln!("cooperative matmul: {tiles} does not fit {}", gpu.info.name);
            continue;
        }
        let forced = MatmulOptions {
            cooperative_tiles: Some(tiles),
            ..MatmulOptions::default()
        };
        cases.push((
            format!("{tiles}"),
            context_with(&gpu, options(forced)),
            Some(tiles),
        ));
    }
    // A split of K (f32 partial products, the reduction runs the epilogue), and the kernel
    // without wgpu's bounds checks (as benchmarks run it).
    let split = MatmulOptions {
        cooperative_tiles: Some(CoopTiles::T64X64),
        split_k: Some(3),
        ..MatmulOptions::default()
    };
    cases.push((
        "64x64 split 3".into(),
        context_with(&gpu, options(split)),
        Some(CoopTiles::T64X64),
    ));
    let unchecked = ContextOptions::unchecked();
    cases.push(("unchecked".into(), context_with(&gpu, unchecked), None));
    for (name, context, forced) in &cases {
        for (m, n, k) in SHAPES {
            let plan = context.matmul_plan_for(DType::F16, m, n, k).unwrap();
            let expected = match forced {
                _ if !coop => None,
                Some(tiles) => Some(*tiles),
                None if m >= 16 => plan.cooperative,
                None => None,
            };
            assert_eq!(plan.cooperative, expected, "{name} {m}x{n}x{k}: {plan:?}");
            if coop && forced.is_none() && m >= 16 {
                assert!(plan.cooperative.is_some(), "{name} {m}x{n}x{k}: {plan:?}");
            }
            if !coop {
                // The portable kernels' plan, exactly.
                assert_eq!(plan, context.matmul_plan(m, n, k).unwrap(), "{name}");
            }
            if name.contains("split") && coop && k >= 3 * CoopTiles::BK as usize {
                assert!(plan.splits > 1, "{name} {m}x{n}x{k}: {plan:?}");
            }
            // No epilogue, a bias and GELU, and a residual after them.
            for epilogue in [
                (false, Activation::None, false),
                (true, Activation::Gelu, false),
                (true, Activation::Gelu, true),
            ] {
                check(context, name, (m, n, k), epilogue, &mut rng);
            }
        }
    }
}

#[test]
fn f16_plans_on_cooperative_matrices_fuse_the_epilogue_and_replay_the_twin() {
    let gpu = cooperative_gpu();
    let context = context_with(&gpu, ContextOptions::default());
    if !context.supports(DType::F16) {
        eprintln!(
            "cooperative plan NOT TESTED: {} has no SHADER_F16 (see f16.rs)",
            gpu.info.name
        );
        return;
    }
    let mut rng = StdRng::seed_from_u64(29);
    // [48, 96] · [96, 72] → bias, gelu (fused into the product's stores) → [72, 20].
    let (m, k, hidden, n) = (48, 96, 72, 20);
    let coop = runs_cooperative(&gpu);
    let planned = context.matmul_plan_for(DType::F16, m, hidden, k).unwrap();
    assert_eq!(planned.cooperative.is_some(), coop, "{planned:?}");
    if !coop {
        eprintln!(
            "cooperative plan NOT TESTED: {} runs no cooperative kernel; checked the portable \
             kernels' plan instead",
            gpu.info.name
        );
    }
    let f16 = |values: Vec<f32>| cpu::rounded(&values, DType::F16);
    let w1 = f16(random(&mut rng, k * hidden, -0.5, 0.5));
    let b1 = f16(random(&mut rng, hidden, -0.5, 0.5));
    let w2 = f16(random(&mut rng, hidden * n, -0.5, 0.5));
    let x = f16(random(&mut rng, m * k, -1.0, 1.0));
    let tw1 = context.tensor_with(&w1, &[k, hidden], DType::F16).unwrap();
    let tb1 = context.tensor_with(&b1, &[hidden], DType::F16).unwrap();
    let tw2 = context.tensor_with(&w2, &[hidden, n], DType::F16).unwrap();
    let mut capture = context.capture().unwrap();
    let input = capture.input_with(&[m, k], DType::F16).unwrap();
    let product = context.matmul(&input, &tw1).unwrap();
    let h = context
        .gelu(&context.add_bias(&product, &tb1).unwrap())
        .unwrap();
    let y = context.matmul(&h, &tw2).unwrap();
    let mut plan = capture.finish(&[&y]).unwrap();
    let h_expected = cpu::rounded(
        &cpu::matmul_with(
            &x,
            &w1,
            m,
            k,
            hidden,
            cpu::Epilogue {
                bias: Some(&b1),
                activation: Activation::Gelu,
                ..Default::default()
            },
        ),
        DType::F16,
    );
    let expected = cpu::rounded(&cpu::matmul(&h_expected, &w2, m, hidden, n), DType::F16);
    for _ in 0..2 {
        let outputs = plan.run(&[wgpu_pool::compute::Feed::Data(&x)]).unwrap();
        // Each hidden value may be an f16 ulp off (another order of sums before its rounding):
        // an output moves by up to Σ_j |w2[j]| · ulp(h[j]), plus its own sums and rounding.
        let bound = |i: usize| {
            let (row, column) = (i / n, i % n);
            let moved: f64 = (0..hidden)
                .map(|j| {
                    let h = h_expected[row * hidden + j];
                    f64::from(w2[j * n + column].abs()) * storage_tolerance(DType::F16, h)
                })
                .sum();
            2.0 * moved
                + 1e-3 * f64::from(expected[i].abs())
                + storage_tolerance(DType::F16, expected[i])
        };
        assert_close("f16 plan", &outputs[0], &expected, bound);
    }
}

/// `act(A · B + bias)` of f32 operands on `context` (opted in to
/// `MatmulOptions::cooperative_f32_as_f16`): where `rounds` (the cooperative kernel runs) against
/// the twin of the operands rounded to f16 (the bias and the result stay f32), else against the
/// twin of the operands as they are (the portable f32 kernels). The tolerance: twice the tiled
/// kernels' f32 bound (see [`check`]).
fn check_f32_as_f16(
    context: &Context,
    what: &str,
    (m, n, k): (usize, usize, usize),
    bias: bool,
    activation: Activation,
    rounds: bool,
    rng: &mut StdRng,
) {
    // Not f16 values: the kernel must round them.
    let a = random(rng, m * k, -1.0, 1.0);
    let b = random(rng, k * n, -1.0, 1.0);
    let bias_values = random(rng, n, -1.0, 1.0);
    let ta = context.tensor(&a, &[m, k]).unwrap();
    let tb = context.tensor(&b, &[k, n]).unwrap();
    let tbias = context.tensor(&bias_values, &[n]).unwrap();
    let epilogue = Epilogue {
        bias: bias.then_some(&tbias),
        activation,
        ..Default::default()
    };
    let c = context.matmul_with(&ta, &tb, epilogue).unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], DType::F32));
    let got = c.to_vec().unwrap();
    let (a, b) = if rounds {
        (cpu::rounded(&a, DType::F16), cpu::rounded(&b, DType::F16))
    } else {
        (a, b)
    };
    let expected = cpu::matmul_with(
        &a,
        &b,
        m,
        k,
        n,
        cpu::Epilogue {
            bias: bias.then_some(&bias_values[..]),
            activation,
            ..Default::default()
        },
    );
    let magnitude = cpu::matmul_magnitude(&a, &b, m, k, n);
    assert_close(
        &format!("{what} {m}x{n}x{k} bias {bias} {activation:?}"),
        &got,
        &expected,
        |i| {
            let c = f64::from(expected[i]).abs();
            let mut bound = 4.0 * k as f64 * U * f64::from(magnitude[i]) + 2.0 * U * c;
            if activation == Activation::Gelu {
                bound += 1e-5 * c + 1e-6;
            }
            bound
        },
    );
}

#[test]
fn f32_matmul_opted_in_to_f16_operands_matches_the_twin_of_rounded_operands() {
    let gpu = cooperative_gpu();
    let mut rng = StdRng::seed_from_u64(30);
    let opted = MatmulOptions {
        cooperative_f32_as_f16: true,
        ..MatmulOptions::default()
    };
    let automatic = context_with(&gpu, options(opted.clone()));
    let coop = runs_cooperative(&gpu) && automatic.supports(DType::F16);
    if !coop {
        eprintln!(
            "f32 matmul on cooperative matrices (cooperative_f32_as_f16) NOT TESTED: {} runs no \
             cooperative kernel; checked instead that f32 plans keep the portable kernels and \
             match the f32 twin of the unrounded operands",
            gpu.info.name
        );
    }
    let split = MatmulOptions {
        cooperative_tiles: Some(CoopTiles::T64X64),
        split_k: Some(3),
        ..opted.clone()
    };
    let cases = [
        ("f32 as f16 automatic", automatic),
        (
            "f32 as f16 64x64 split 3",
            context_with(&gpu, options(split)),
        ),
    ];
    for (name, context) in &cases {
        for (m, n, k) in SHAPES {
            let plan = context.matmul_plan_for(DType::F32, m, n, k).unwrap();
            let forced = name.contains("split");
            // As an f16 product of its shape would: from 16 rows on, or with a forced tile.
            let rounds = coop && (forced || m >= 16);
            assert_eq!(plan.cooperative.is_some(), rounds, "{name} {m}x{n}x{k}");
            if !rounds {
                assert_eq!(plan, context.matmul_plan(m, n, k).unwrap(), "{name}");
            }
            for (bias, activation) in [(false, Activation::None), (true, Activation::Gelu)] {
                check_f32_as_f16(context, name, (m, n, k), bias, activation, rounds, &mut rng);
            }
        }
    }
    // Off by default: an f32 product never rounds its operands unasked.
    let default = context_with(&gpu, ContextOptions::default());
    for (m, n, k) in SHAPES {
        let plan = default.matmul_plan_for(DType::F32, m, n, k).unwrap();
        assert_eq!(plan.cooperative, None, "{m}x{n}x{k}");
    }
    if !coop {
        return;
    }
    // Range: the caller guarantees it. An operand beyond ±65,504 becomes ±∞ as the kernel
    // rounds it (documented at `MatmulOptions::cooperative_f32_as_f16`): its row of C is not
    // finite, never silently finite and wrong; the other rows are as before.
    let (m, n, k) = (32, 64, 64);
    let mut a = random(&mut rng, m * k, -1.0, 1.0);
    a[3] = 1.0e5;
    let b: Vec<f32> = random(&mut rng, k * n, 0.5, 1.0);
    let c = cases[0]
        .1
        .matmul(
            &cases[0].1.tensor(&a, &[m, k]).unwrap(),
            &cases[0].1.tensor(&b, &[k, n]).unwrap(),
        )
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(c[..n].iter().all(|x| !x.is_finite()), "{:?}", &c[..n]);
    assert!(c[n..].iter().all(|x| x.is_finite()));
}
