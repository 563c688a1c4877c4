//! Compute in a browser: element-wise ops, reductions, matmul at every tile the adapter takes
//! (each against its CPU twin), a kernel of the user's, typed refusals.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::cpu;
use wgpu_pool::compute::{
    Activation, BinaryOp, ComputeError, Context, ContextOptions, DType, Epilogue, Launch,
    MatmulOptions, MatmulTiles, UnaryOp, UserKernelDesc,
};
use wgpu_pool::{Pool, PoolOptions};

use crate::support::{assert_close, context, gpu, values};

#[wasm_bindgen_test]
async fn binary_ops_and_scalars_match_their_twins() {
    let context = context().await;
    let a = values(1, 1003, -2.0, 2.0);
    let b = values(2, 1003, 0.5, 3.0);
    let ta = context.tensor(&a, &[17, 59]).unwrap();
    let tb = context.tensor(&b, &[17, 59]).unwrap();
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
    ] {
        let out = context.binary(op, &ta, &tb).unwrap();
        let got = out.to_vec_async().await.unwrap();
        assert_close(&format!("{op:?}"), &got, &cpu::binary(op, &a, &b), 1e-6);
    }
    let scaled = context.binary_scalar(BinaryOp::Mul, &ta, 0.25).unwrap();
    assert_close(
        "mul scalar",
        &scaled.to_vec_async().await.unwrap(),
        &cpu::mul_scalar(&a, 0.25),
        1e-6,
    );
}

#[wasm_bindgen_test]
async fn unary_ops_match_their_twins() {
    let context = context().await;
    let x = values(3, 777, -3.0, 3.0);
    let tx = context.tensor(&x, &[777]).unwrap();
    for op in [
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::Exp,
        UnaryOp::Neg,
        UnaryOp::Copy,
    ] {
        let got = context
            .unary(op, &tx)
            .unwrap()
            .to_vec_async()
            .await
            .unwrap();
        assert_close(&format!("{op:?}"), &got, &cpu::unary(op, &x), 1e-5);
    }
}

#[wasm_bindgen_test]
async fn bias_sum_and_softmax_match_their_twins() {
    let context = context().await;
    let (rows, cols) = (13, 301);
    let x = values(4, rows * cols, -4.0, 4.0);
    let bias = values(5, cols, -1.0, 1.0);
    let tx = context.tensor(&x, &[rows, cols]).unwrap();
    let tbias = context.tensor(&bias, &[cols]).unwrap();
    let biased = context.add_bias(&tx, &tbias).unwrap();
    assert_close(
        "add_bias",
        &biased.to_vec_async().await.unwrap(),
        &cpu::add_bias(&x, &bias),
        1e-6,
    );
    let sum = context.sum(&tx).unwrap();
    assert_close(
        "sum",
        &sum.to_vec_async().await.unwrap(),
        &cpu::sum(&x, cols),
        1e-4,
    );
    let softmax = context.softmax(&tx).unwrap();
    assert_close(
        "softmax",
        &softmax.to_vec_async().await.unwrap(),
        &cpu::softmax(&x, cols),
        1e-5,
    );
}

/// `[m, k] · [k, n]` on `context` against the twin, with a bias and GELU.
async fn check_matmul(context: &Context, (m, k, n): (usize, usize, usize), what: &str) {
    let a = values(m as u64 * 31 + 7, m * k, -1.0, 1.0);
    let b = values(n as u64 * 17 + 3, k * n, -1.0, 1.0);
    let bias = values(11, n, -0.5, 0.5);
    let ta = context.tensor(&a, &[m, k]).unwrap();
    let tb = context.tensor(&b, &[k, n]).unwrap();
    let tbias = context.tensor(&bias, &[n]).unwrap();
    let plain = context.matmul(&ta, &tb).unwrap();
    assert_close(
        &format!("{what} {m}x{k}x{n}"),
        &plain.to_vec_async().await.unwrap(),
        &cpu::matmul(&a, &b, m, k, n),
        1e-4,
    );
    let fused = context
        .matmul_with(
            &ta,
            &tb,
            Epilogue {
                bias: Some(&tbias),
                activation: Activation::Gelu,
                ..Default::default()
            },
        )
        .unwrap();
    let expected = cpu::unary(
        UnaryOp::Gelu,
        &cpu::add_bias(&cpu::matmul(&a, &b, m, k, n), &bias),
    );
    assert_close(
        &format!("{what} {m}x{k}x{n} +bias +gelu"),
        &fused.to_vec_async().await.unwrap(),
        &expected,
        1e-4,
    );
}

#[wasm_bindgen_test]
async fn matmul_of_odd_and_narrow_shapes_matches_its_twin() {
    let context = context().await;
    for shape in [
        (1, 64, 96),
        (3, 33, 45),
        (16, 128, 72),
        (67, 45, 33),
        (128, 96, 160),
    ] {
        check_matmul(&context, shape, "automatic").await;
    }
}

#[wasm_bindgen_test]
async fn matmul_at_every_tile_the_adapter_takes_matches_its_twin() {
    let gpu = gpu().await;
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let limits = gpu.device.limits();
    let (mut taken, mut refused) = (Vec::new(), Vec::new());
    for tiles in MatmulTiles::ALL {
        if tiles.check(&limits).is_err() {
            refused.push(tiles.to_string());
            continue;
        }
        let options = ContextOptions {
            matmul: MatmulOptions {
                tiles: Some(tiles),
                narrow_max_rows: 0,
                ..MatmulOptions::default()
            },
            ..ContextOptions::default()
        };
        let context = Context::new(&pool, options).unwrap();
        check_matmul(&context, (70, 36, 75), &tiles.to_string()).await;
        taken.push(tiles.to_string());
    }
    web_sys::console::log_1(
        &format!("matmul tiles taken: {taken:?}; beyond the adapter's limits: {refused:?}").into(),
    );
    assert!(taken.len() >= 8, "taken {taken:?}, refused {refused:?}");
}

#[wasm_bindgen_test]
async fn a_kernel_of_the_users_runs_as_an_op() {
    let context = context().await;
    let kernel = context
        .user_kernel(&UserKernelDesc {
            label: "triple",
            wgsl: r#"
@group(0) @binding(0) var<uniform> params: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.x) { y[id.x] = 3.0 * x[id.x]; }
}
"#,
            entry_point: "main",
            tensors: 2,
            params_bytes: 16,
            ..UserKernelDesc::default()
        })
        .unwrap();
    let x = values(8, 200, -1.0, 1.0);
    let tx = context.tensor(&x, &[200]).unwrap();
    let params = [200u32, 0, 0, 0];
    let y = context
        .dispatch_with(
            &kernel,
            &Launch::new([4, 1, 1])
                .params(&params)
                .tensors(&[&tx])
                .output(&[200]),
        )
        .unwrap();
    assert_close(
        "triple",
        &y[0].to_vec_async().await.unwrap(),
        &cpu::mul_scalar(&x, 3.0),
        1e-6,
    );
}

#[wasm_bindgen_test]
async fn refusals_are_typed_and_lose_nothing() {
    let context = context().await;
    let x = context.tensor(&[1.0, 2.0, 3.0], &[3]).unwrap();
    let y = context.tensor(&[1.0, 2.0], &[2]).unwrap();
    assert!(matches!(
        context.add(&x, &y),
        Err(ComputeError::ShapeMismatch { .. })
    ));
    if !context.supports(DType::F16) {
        assert!(matches!(
            context.tensor_with(&[1.0], &[1], DType::F16),
            Err(ComputeError::ShaderF16Unavailable { .. })
        ));
    }
    assert_eq!(x.to_vec_async().await.unwrap(), [1.0, 2.0, 3.0]);
    // A blocking read names the async form.
    let error = x.to_vec().expect_err("a browser cannot block");
    assert!(error.to_string().contains("_async"), "{error}");
    assert_eq!(x.to_vec_async().await.unwrap(), [1.0, 2.0, 3.0]);
}

#[wasm_bindgen_test]
async fn sync_async_waits_for_the_work_submitted() {
    let context = context().await;
    let x = context.tensor(&values(9, 4096, 0.0, 1.0), &[4096]).unwrap();
    let _y = context.exp(&x).unwrap();
    assert!(context.pending_dispatches() > 0);
    context.sync_async().await.unwrap();
    assert_eq!(context.pending_dispatches(), 0);
    assert!(context.sync().is_err(), "a blocking sync in a browser");
}

/// WebGPU refuses a range bound twice in a dispatch (every binding is writable): a tensor given
/// twice is bound through a copy, eagerly and in a plan; the results are the twins'.
#[wasm_bindgen_test]
async fn a_tensor_given_twice_computes_as_its_twin() {
    let context = context().await;
    let x = values(12, 24 * 24, -1.0, 1.0);
    let tx = context.tensor(&x, &[24, 24]).unwrap();
    let sum = context.add(&tx, &tx).unwrap();
    assert_eq!(sum.to_vec_async().await.unwrap(), cpu::add(&x, &x));
    let square = context.matmul(&tx, &tx).unwrap();
    assert_close(
        "x · x",
        &square.to_vec_async().await.unwrap(),
        &cpu::matmul(&x, &x, 24, 24, 24),
        1e-5,
    );
    let mut capture = context.capture().unwrap();
    let input = capture.input(&[24, 24]).unwrap();
    let product = context.mul(&input, &input).unwrap();
    let mut plan = capture.finish(&[&product]).unwrap();
    let replayed = plan
        .run_async(&[wgpu_pool::compute::Feed::Data(&x)])
        .await
        .unwrap();
    assert_eq!(replayed[0], cpu::mul(&x, &x));
    // The operand itself is untouched.
    assert_eq!(tx.to_vec_async().await.unwrap(), x);
}
