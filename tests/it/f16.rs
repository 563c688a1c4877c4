//! f16 storage with f32 arithmetic: every f16 kernel against its CPU twin on odd shapes (the
//! tiled matmul in its scalar and vec4 forms, with split-K, the narrow matmul with and without a
//! split along K, with epilogues, residuals and the layer-norm prologue; the element-wise ops, casts and row reductions), uploads and
//! read-backs, plans, and the typed errors: operands of mixed element types, and f16 on a device
//! without `SHADER_F16`.
//!
//! Where the test device lacks `SHADER_F16` (llvmpipe on GL), the tests that compute check the
//! typed error instead and say so on stderr; the refusal itself is also checked on Vulkan, on a
//! second device opened without the feature (as a user's own device may be).
//!
//! The twin of an f16 kernel is the f32 twin on the f16 inputs, its result rounded to f16
//! (`cpu::rounded`). WGSL lets a conversion to f16 round to either neighbour, and a device may
//! flush f16 subnormals, so on top of the f32 tolerance of `compute.rs` every result may differ
//! by one f16 ulp and the smallest normal f16: 2⁻¹⁰·|cpu| + 2⁻¹⁴.

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::compute::{
    cpu, Activation, BinaryOp, ComputeError, Context, ContextOptions, DType, Epilogue, Feed,
    MatmulOptions, UnaryOp,
};
use wgpu_pool::Gpu;

use crate::compute::{
    assert_close, check_matmul_epilogue, check_matmul_of, context_with, random, storage_tolerance,
    U,
};
use crate::gpu::gpu;
use crate::transformer::{check_matmul_layer_norm, layer_norm_product_dispatches, LN_EPILOGUES};

/// One f16 ulp of `value` and the smallest normal f16 (see `compute::storage_tolerance`).
fn f16_ulp(value: f32) -> f64 {
    storage_tolerance(DType::F16, value)
}

/// A context on the shared device when it has `SHADER_F16`. Without it, checks that an f16
/// tensor is the typed error, says so, and gives `None`: the caller then has nothing to compute.
fn f16_context(test: &str, options: ContextOptions) -> Option<Context> {
    let context = context_with(gpu(), options);
    if context.supports(DType::F16) {
        return Some(context);
    }
    assert_refused(&context);
    eprintln!(
        "{test}: {} has no SHADER_F16: checked the typed error instead of the numbers",
        gpu().info.name
    );
    None
}

/// Asserts that every way to make an f16 tensor is [`ComputeError::ShaderF16Unavailable`] and
/// records nothing.
fn assert_refused(context: &Context) {
    assert!(!context.supports(DType::F16));
    assert!(context.supports(DType::F32));
    let refused = |result: Result<_, ComputeError>, op: &str| match result {
        Err(ComputeError::ShaderF16Unavailable { op: got }) => {
            assert_eq!(got, op);
        }
        other => panic!("{op}: expected ShaderF16Unavailable, got {other:?}"),
    };
    let x = context.tensor(&[1.0, 2.0, 3.0], &[3]).unwrap();
    context.flush().unwrap();
    let allocated = context.pool().stats().allocated_bytes.current;
    refused(
        context.tensor_with(&[1.0, 2.0, 3.0], &[3], DType::F16),
        "tensor",
    );
    refused(context.zeros_with(&[3], DType::F16), "zeros");
    refused(context.empty_with(&[3], DType::F16), "empty");
    refused(context.cast(&x, DType::F16), "cast");
    let mut capture = context.capture().unwrap();
    refused(capture.input_with(&[3], DType::F16), "input");
    drop(capture);
    assert_eq!(context.pending_dispatches(), 0);
    assert_eq!(context.pool().stats().allocated_bytes.current, allocated);
    let message = context
        .tensor_with(&[1.0], &[1], DType::F16)
        .unwrap_err()
        .to_string();
    assert!(message.contains("SHADER_F16"), "{message}");
}

fn f16(values: &[f32]) -> Vec<f32> {
    cpu::rounded(values, DType::F16)
}

#[test]
fn f16_support_follows_the_device_features() {
    let gpu = gpu();
    let context = context_with(gpu, ContextOptions::default());
    let device_has = gpu.device.features().contains(wgpu::Features::SHADER_F16);
    assert_eq!(context.supports(DType::F16), device_has);
    // `request_gpu` asks for SHADER_F16 wherever the adapter offers it.
    let adapter = gpu.adapter.as_ref().expect("request_gpu keeps its adapter");
    let adapter_has = adapter.features().contains(wgpu::Features::SHADER_F16);
    assert_eq!(device_has, adapter_has);
    eprintln!(
        "SHADER_F16 on {} ({:?}): {adapter_has}",
        gpu.info.name, gpu.info.backend
    );
}

#[test]
fn f16_is_a_typed_error_on_a_device_without_shader_f16() {
    let shared = gpu();
    if !shared
        .device
        .features()
        .contains(wgpu::Features::SHADER_F16)
    {
        assert_refused(&context_with(shared, ContextOptions::default()));
        return;
    }
    // A second device of the same adapter, opened without the feature (as a device of the
    // user's own may be).
    let adapter = shared
        .adapter
        .as_ref()
        .expect("request_gpu keeps its adapter");
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("without SHADER_F16"),
        required_features: wgpu::Features::empty(),
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("a device without optional features");
    let without = Gpu::from_device(device, queue);
    assert_refused(&context_with(&without, ContextOptions::default()));
}

#[test]
fn f16_tensors_round_on_upload_and_read_back_exactly() {
    let Some(context) = f16_context("round trip", ContextOptions::default()) else {
        return;
    };
    // Ties to even, the largest finite f16, past it, a subnormal, and odd lengths.
    let values = [
        1.0,
        -2.5,
        1.0 + 1.0 / 4096.0,
        1.0 + 3.0 / 4096.0,
        65504.0,
        7e4,
        -3e-6,
        0.1,
        1.0 / 3.0,
    ];
    for len in [1, 3, 5, 8, 9] {
        let data = &values[..len];
        let tensor = context.tensor_with(data, &[len], DType::F16).unwrap();
        assert_eq!(tensor.dtype(), DType::F16);
        assert_eq!(tensor.size_bytes(), 2 * len as u64);
        // Rounded up to 16 bytes: whole vec4s of f16.
        assert_eq!(
            tensor.allocation().size(),
            (2 * len as u64).div_ceil(16) * 16
        );
        assert_eq!(tensor.to_vec().unwrap(), f16(data), "{len} values");
        assert_eq!(
            pollster::block_on(tensor.to_vec_async()).unwrap(),
            f16(data)
        );
        // Overwrites round the same way.
        let negated: Vec<f32> = data.iter().map(|v| -v).collect();
        context.write(&tensor, &negated).unwrap();
        assert_eq!(tensor.to_vec().unwrap(), f16(&negated));
    }
    // A copy keeps every bit: the smallest subnormal, a NaN and infinities too (read back
    // through f32, which holds every f16 exactly, NaN as NaN).
    let special = [
        6e-8,
        -6e-8,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        1.5,
    ];
    let tensor = context.tensor_with(&special, &[7], DType::F16).unwrap();
    for copy in [
        context.copy(&tensor).unwrap(),
        context.cast(&tensor, DType::F16).unwrap(),
    ] {
        let values = copy.to_vec().unwrap();
        assert_eq!(copy.dtype(), DType::F16);
        let bits = |values: &[f32]| -> Vec<u32> { values.iter().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&values), bits(&tensor.to_vec().unwrap()));
        assert_eq!(values[0], 2f32.powi(-24));
        assert!(values[2].is_nan());
    }
    let zeros = context.zeros_with(&[2, 3], DType::F16).unwrap();
    assert_eq!(zeros.to_vec().unwrap(), vec![0.0; 6]);
    let empty = context.empty_with(&[7], DType::F16).unwrap();
    assert_eq!((empty.dtype(), empty.size_bytes()), (DType::F16, 14));
    // A reshape keeps the element type.
    let reshaped = zeros.reshape(&[3, 2]).unwrap();
    assert_eq!(reshaped.dtype(), DType::F16);
}

#[test]
fn f16_element_wise_ops_casts_and_rows_match_their_twins() {
    let Some(context) = f16_context("element-wise", ContextOptions::default()) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(16);
    for len in [1, 3, 17, 129, 257] {
        let x = f16(&random(&mut rng, len, -4.0, 4.0));
        let positive = f16(&random(&mut rng, len, 0.0, 100.0));
        let y = f16(&random(&mut rng, len, -4.0, 4.0));
        let divisors: Vec<f32> = f16(&random(&mut rng, len, 0.25, 4.0))
            .into_iter()
            .map(|v| if rng.gen_bool(0.5) { v } else { -v })
            .collect();
        let tx = context.tensor_with(&x, &[len], DType::F16).unwrap();
        let tpositive = context.tensor_with(&positive, &[len], DType::F16).unwrap();
        let ty = context.tensor_with(&y, &[len], DType::F16).unwrap();
        let tdivisors = context.tensor_with(&divisors, &[len], DType::F16).unwrap();
        for op in UnaryOp::ALL {
            let (input, tensor) = if op == UnaryOp::Sqrt {
                (&positive, &tpositive)
            } else {
                (&x, &tx)
            };
            let out = context.unary(op, tensor).unwrap();
            assert_eq!(out.dtype(), DType::F16);
            let expected = f16(&cpu::unary(op, input));
            // The f32 twin's own tolerance (compute.rs) is far below an f16 ulp, but exp's and
            // gelu's: allowed on top.
            let f32_error = |i: usize| match op {
                UnaryOp::Exp => (3.0 + 2.0 * f64::from(input[i]).abs()) * 2.0 * U,
                UnaryOp::Gelu => 1e-5,
                _ => 6.0 * U,
            } * f64::from(expected[i]).abs()
                + 1e-6 * f64::from(u8::from(op == UnaryOp::Gelu));
            assert_close(
                &format!("f16 {} of {len}", op.name()),
                &out.to_vec().unwrap(),
                &expected,
                |i| f16_ulp(expected[i]) + f32_error(i),
            );
        }
        for op in BinaryOp::ALL {
            let b = if op == BinaryOp::Div { &tdivisors } else { &ty };
            let b_values = if op == BinaryOp::Div { &divisors } else { &y };
            let out = context.binary(op, &tx, b).unwrap();
            assert_eq!(out.dtype(), DType::F16);
            let scalar = 1.75;
            let scalar_out = context.binary_scalar(op, &tx, scalar).unwrap();
            for (form, out, expected) in [
                ("", out, cpu::binary(op, &x, b_values)),
                (" scalar", scalar_out, cpu::binary_scalar(op, &x, scalar)),
            ] {
                let expected = f16(&expected);
                assert_close(
                    &format!("f16 {}{form} of {len}", op.name()),
                    &out.to_vec().unwrap(),
                    &expected,
                    |i| f16_ulp(expected[i]) + 6.0 * U * f64::from(expected[i]).abs(),
                );
            }
        }
        // Casts: to f32 exactly, back to f16 as uploaded.
        let wide = context.cast(&tx, DType::F32).unwrap();
        assert_eq!(wide.dtype(), DType::F32);
        assert_eq!(wide.to_vec().unwrap(), x);
        let raw = random(&mut rng, len, -1000.0, 1000.0);
        let narrow = context
            .cast(&context.tensor(&raw, &[len]).unwrap(), DType::F16)
            .unwrap();
        assert_eq!(narrow.dtype(), DType::F16);
        let expected = f16(&raw);
        assert_close(
            &format!("cast to f16 of {len}"),
            &narrow.to_vec().unwrap(),
            &expected,
            |i| f16_ulp(expected[i]),
        );
    }
    // The bias add and the row reductions over rows of odd lengths.
    for (rows, cols) in [(1, 1), (3, 5), (7, 17), (4, 300)] {
        let x = f16(&random(&mut rng, rows * cols, -4.0, 4.0));
        let bias = f16(&random(&mut rng, cols, -4.0, 4.0));
        let tx = context.tensor_with(&x, &[rows, cols], DType::F16).unwrap();
        let tbias = context.tensor_with(&bias, &[cols], DType::F16).unwrap();
        let out = context.add_bias(&tx, &tbias).unwrap();
        let expected = f16(&cpu::add_bias(&x, &bias));
        assert_close(
            &format!("f16 add_bias {rows}x{cols}"),
            &out.to_vec().unwrap(),
            &expected,
            |i| f16_ulp(expected[i]) + 2.0 * U * f64::from(expected[i]).abs(),
        );
        let sum = context.sum(&tx).unwrap();
        assert_eq!(sum.dtype(), DType::F16);
        let expected = f16(&cpu::sum(&x, cols));
        let magnitudes = cpu::sum(&x.iter().map(|v| v.abs()).collect::<Vec<_>>(), cols);
        let levels = (cols.div_ceil(256) + 9) as f64;
        assert_close(
            &format!("f16 sum {rows}x{cols}"),
            &sum.to_vec().unwrap(),
            &expected,
            |i| f16_ulp(expected[i]) + 2.0 * levels * U * f64::from(magnitudes[i]),
        );
        let softmax = context.softmax(&tx).unwrap();
        let expected = f16(&cpu::softmax(&x, cols));
        assert_close(
            &format!("f16 softmax {rows}x{cols}"),
            &softmax.to_vec().unwrap(),
            &expected,
            |i| f16_ulp(expected[i]) + 1e-5 * f64::from(expected[i]).abs() + 1e-7,
        );
    }
}

#[test]
fn f16_matmul_matches_its_twin_on_every_path() {
    let mut rng = StdRng::seed_from_u64(61);
    let split_tiled = ContextOptions {
        matmul: MatmulOptions {
            split_k: Some(3),
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    let split_narrow = ContextOptions {
        matmul: MatmulOptions {
            narrow_splits: Some(3),
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    let Some(context) = f16_context("matmul", ContextOptions::default()) else {
        return;
    };
    let split_tiled = context_with(gpu(), split_tiled);
    let split_narrow = context_with(gpu(), split_narrow);
    // Without wgpu's bounds checks (as benchmarks run): the f16 kernels mask their edges too.
    let unchecked = context_with(gpu(), ContextOptions::unchecked());
    // (context, name, shapes (M, K, N), what the plan must be: narrow, split)
    type Case<'a> = (&'a Context, &'a str, Vec<(usize, usize, usize)>, bool, bool);
    let cases: [Case<'_>; 6] = [
        // The tiled kernel: scalar (K or N not a multiple of 4) and vec4 with edges.
        (
            &context,
            "tiled",
            vec![(1, 7, 5), (33, 65, 17), (130, 70, 129), (20, 44, 36)],
            false,
            false,
        ),
        (
            &split_tiled,
            "tiled split-K",
            vec![(33, 65, 17), (130, 70, 129), (20, 44, 36)],
            false,
            true,
        ),
        (
            &context,
            "narrow",
            vec![(1, 68, 20), (5, 132, 36), (8, 64, 260)],
            true,
            false,
        ),
        (
            &split_narrow,
            "narrow split",
            vec![(3, 96, 20), (7, 132, 12)],
            true,
            true,
        ),
        (
            &unchecked,
            "tiled unchecked",
            vec![(33, 65, 17), (20, 44, 36)],
            false,
            false,
        ),
        (
            &unchecked,
            "narrow unchecked",
            vec![(5, 132, 36)],
            true,
            false,
        ),
    ];
    for (context, name, shapes, narrow, split) in cases {
        for (m, k, n) in shapes {
            let plan = context.matmul_plan(m, n, k).unwrap();
            assert_eq!(
                (plan.narrow_lanes > 0, plan.splits > 1),
                (narrow, split),
                "{name} {m}x{k}x{n}: {plan:?}"
            );
            // Without an epilogue, and with a bias and GELU fused.
            for (bias, activation) in [(false, Activation::None), (true, Activation::Gelu)] {
                let what = format!("f16 {name}");
                let shape = (m, k, n);
                check_matmul_of(
                    context,
                    &what,
                    shape,
                    bias,
                    activation,
                    DType::F16,
                    &mut rng,
                );
            }
        }
    }
}

/// A residual in the product's epilogue and the layer norm folded into the narrow product, on
/// f16 tensors: each on the narrow kernel (split along K too) and the tiled one, against its
/// twin (the tolerances of `compute.rs` and `transformer.rs`, with the f16 ulps they name).
#[test]
fn f16_residual_epilogues_and_layer_norm_prologues_match_their_twins() {
    let options = |matmul: MatmulOptions| ContextOptions {
        matmul,
        ..ContextOptions::default()
    };
    let test = "f16 residual and layer-norm prologue";
    let Some(context) = f16_context(test, ContextOptions::default()) else {
        return;
    };
    let split = f16_context(
        test,
        options(MatmulOptions {
            narrow_splits: Some(2),
            split_k: Some(3),
            ..MatmulOptions::default()
        }),
    )
    .expect("the device has SHADER_F16");
    let mut rng = StdRng::seed_from_u64(59);
    for (context, name) in [(&context, "f16"), (&split, "f16 split")] {
        for (m, k, n) in [(5, 132, 36), (40, 256, 36), (17, 30, 30)] {
            let plan = context.matmul_plan_for(DType::F16, m, n, k).unwrap();
            let dispatches = check_matmul_epilogue(
                context,
                &format!("{name} residual"),
                (m, k, n),
                (true, Activation::Gelu, true),
                DType::F16,
                &mut rng,
            );
            assert_eq!(
                dispatches,
                1 + u64::from(plan.splits > 1),
                "{name} {m}x{k}x{n}"
            );
        }
        for (index, (m, k, n)) in [(16, 768, 64), (3, 64, 36), (20, 64, 36)]
            .into_iter()
            .enumerate()
        {
            let dispatches = check_matmul_layer_norm(
                context,
                &format!("{name} matmul_layer_norm"),
                (m, k, n),
                1e-5,
                LN_EPILOGUES[3 + index % 2],
                DType::F16,
                &mut rng,
            );
            let expected = layer_norm_product_dispatches(context, DType::F16, (m, k, n));
            assert_eq!(dispatches, expected, "{name} {m}x{k}x{n}");
        }
    }
}

#[test]
fn f16_and_f32_operands_are_a_typed_error_that_records_nothing() {
    let Some(context) = f16_context("mixed types", ContextOptions::default()) else {
        return;
    };
    let half = context
        .tensor_with(&[1.0; 12], &[3, 4], DType::F16)
        .unwrap();
    let single = context.tensor(&[1.0; 12], &[3, 4]).unwrap();
    let square = context.tensor(&[1.0; 16], &[4, 4]).unwrap();
    let bias = context.tensor(&[1.0; 4], &[4]).unwrap();
    let half_square = context
        .tensor_with(&[1.0; 16], &[4, 4], DType::F16)
        .unwrap();
    context.flush().unwrap();
    let mismatch = |result: Result<_, ComputeError>, op: &str, left, right| match result {
        Err(ComputeError::DTypeMismatch {
            op: got,
            left: got_left,
            right: got_right,
        }) => assert_eq!((got, got_left, got_right), (op, left, right)),
        other => panic!("{op}: expected DTypeMismatch, got {other:?}"),
    };
    use DType::{F16, F32};
    mismatch(context.add(&half, &single), "add", F16, F32);
    mismatch(context.maximum(&single, &half), "maximum", F32, F16);
    mismatch(context.add_bias(&half, &bias), "add_bias", F16, F32);
    mismatch(context.matmul(&half, &square), "matmul", F16, F32);
    mismatch(context.matmul(&single, &half_square), "matmul", F32, F16);
    let half_bias = Epilogue {
        bias: Some(&bias),
        activation: Activation::None,
        ..Default::default()
    };
    mismatch(
        context.matmul_with(&half, &half_square, half_bias),
        "matmul",
        F16,
        F32,
    );
    assert_eq!(context.pending_dispatches(), 0);
    let message = context.add(&half, &single).unwrap_err().to_string();
    assert!(message.contains("f16 and f32"), "{message}");
    // Made to agree, they compute.
    let sum = context
        .add(&context.cast(&half, F32).unwrap(), &single)
        .unwrap();
    assert_eq!(sum.to_vec().unwrap(), vec![2.0; 12]);
}

#[test]
fn f16_plans_replay_what_the_twin_computes_in_half_the_arena() {
    // No split along K (its partial products are f32 in both types).
    let options = ContextOptions {
        matmul: MatmulOptions {
            split_k: Some(1),
            narrow_splits: Some(1),
            ..MatmulOptions::default()
        },
        ..ContextOptions::default()
    };
    let Some(context) = f16_context("plan", options) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(7);
    // Two layers, [8, 64] · [64, 64] → bias, gelu → [64, 16] → softmax; and the same in f32,
    // whose arena is twice as large (every tensor's bytes are multiples of 256 in both types, so
    // no alignment rounds them).
    let (m, k, hidden, n) = (8, 64, 64, 16);
    let w1 = f16(&random(&mut rng, k * hidden, -0.5, 0.5));
    let b1 = f16(&random(&mut rng, hidden, -0.5, 0.5));
    let w2 = f16(&random(&mut rng, hidden * n, -0.5, 0.5));
    let x = f16(&random(&mut rng, m * k, -1.0, 1.0));
    let mut stats = Vec::new();
    for dtype in [DType::F16, DType::F32] {
        let tw1 = context.tensor_with(&w1, &[k, hidden], dtype).unwrap();
        let tb1 = context.tensor_with(&b1, &[hidden], dtype).unwrap();
        let tw2 = context.tensor_with(&w2, &[hidden, n], dtype).unwrap();
        let mut capture = context.capture().unwrap();
        let input = capture.input_with(&[m, k], dtype).unwrap();
        let h = context
            .gelu(
                &context
                    .add_bias(&context.matmul(&input, &tw1).unwrap(), &tb1)
                    .unwrap(),
            )
            .unwrap();
        let y = context.softmax(&context.matmul(&h, &tw2).unwrap()).unwrap();
        assert_eq!(y.dtype(), dtype);
        let mut plan = capture.finish(&[&y]).unwrap();
        // The fused first layer rounds once (bias and GELU in registers), the second twice.
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
            dtype,
        );
        let logits = cpu::rounded(&cpu::matmul(&h_expected, &w2, m, hidden, n), dtype);
        let expected = cpu::rounded(&cpu::softmax(&logits, n), dtype);
        for _ in 0..2 {
            let outputs = plan.run(&[Feed::Data(&x)]).unwrap();
            // A hidden value an f16 ulp off moves a logit by up to Σ|w2|·2⁻¹⁰, and the logit's
            // probability by as much relatively.
            assert_close(
                &format!("{dtype} plan"),
                &outputs[0],
                &expected,
                |i| match dtype {
                    DType::F16 => 5e-2 * f64::from(expected[i]) + 1e-4,
                    DType::F32 => 1e-4 * f64::from(expected[i]) + 1e-6,
                },
            );
        }
        // An input tensor of the other type is refused.
        let other = if dtype == DType::F16 {
            DType::F32
        } else {
            DType::F16
        };
        let wrong = context.tensor_with(&x, &[m, k], other).unwrap();
        match plan.run(&[Feed::Tensor(&wrong)]) {
            Err(ComputeError::DTypeMismatch { left, right, .. }) => {
                assert_eq!((left, right), (dtype, other))
            }
            other => panic!("expected DTypeMismatch, got {other:?}"),
        }
        stats.push(plan.stats().clone());
    }
    // Half the bytes of every tensor: half the arena.
    assert_eq!(2 * stats[0].max_live_bytes, stats[1].max_live_bytes);
}
