//! Planned execution in a browser: a forward captured once and replayed (awaited), against the
//! same ops run eagerly; replays pipelined with `submit` and `wait_async`; outputs kept in
//! tensors; the blocking `run` refused with the async form named.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::{Context, Feed, Tensor};

use crate::support::{assert_close, context, values};

/// An MLP's layers: `(weights [in, out], bias [out])`.
fn layers(context: &Context, widths: &[usize]) -> Vec<(Tensor, Tensor)> {
    widths
        .windows(2)
        .enumerate()
        .map(|(i, pair)| {
            let w = values(100 + i as u64, pair[0] * pair[1], -0.2, 0.2);
            let b = values(200 + i as u64, pair[1], -0.1, 0.1);
            (
                context.tensor(&w, &[pair[0], pair[1]]).unwrap(),
                context.tensor(&b, &[pair[1]]).unwrap(),
            )
        })
        .collect()
}

/// matmul + bias + GELU per hidden layer, matmul + bias, softmax.
fn forward(context: &Context, x: &Tensor, layers: &[(Tensor, Tensor)]) -> Tensor {
    let mut h = x.clone();
    for (index, (w, b)) in layers.iter().enumerate() {
        let biased = context
            .add_bias(&context.matmul(&h, w).unwrap(), b)
            .unwrap();
        h = if index + 1 < layers.len() {
            context.gelu(&biased).unwrap()
        } else {
            biased
        };
    }
    context.softmax(&h).unwrap()
}

#[wasm_bindgen_test]
async fn a_captured_forward_replays_as_the_eager_one_computes() {
    let context = context().await;
    let layers = layers(&context, &[48, 96, 64, 10]);
    let mut capture = context.capture().unwrap();
    let x = capture.input(&[5, 48]).unwrap();
    let y = forward(&context, &x, &layers);
    let mut plan = capture.finish(&[&y]).unwrap();
    assert!(plan.stats().fused_steps > 0, "{:?}", plan.stats());
    for seed in [1, 2, 3] {
        let input = values(seed, 5 * 48, -1.0, 1.0);
        let replayed = plan
            .run_async(&[Feed::Data(&input)])
            .await
            .unwrap()
            .swap_remove(0);
        let eager = forward(
            &context,
            &context.tensor(&input, &[5, 48]).unwrap(),
            &layers,
        );
        assert_close(
            &format!("replay {seed}"),
            &replayed,
            &eager.to_vec_async().await.unwrap(),
            1e-5,
        );
    }
    // A replay allocates nothing and makes no bind group.
    let before = (
        context.pool().stats().allocations.total,
        plan.bind_groups_created(),
    );
    let input = values(9, 5 * 48, -1.0, 1.0);
    plan.run_async(&[Feed::Data(&input)]).await.unwrap();
    assert_eq!(
        (
            context.pool().stats().allocations.total,
            plan.bind_groups_created()
        ),
        before
    );
}

#[wasm_bindgen_test]
async fn replays_pipeline_and_keep_outputs_in_tensors() {
    let context = context().await;
    let layers = layers(&context, &[32, 64, 16]);
    let mut capture = context.capture().unwrap();
    let x = capture.input(&[4, 32]).unwrap();
    let y = forward(&context, &x, &layers);
    let mut plan = capture.finish(&[&y]).unwrap();
    let inputs: Vec<Vec<f32>> = (0..3).map(|s| values(40 + s, 4 * 32, -1.0, 1.0)).collect();
    let kept = context.zeros(&[4, 16]).unwrap();
    // Three replays in flight before the first is read.
    let runs: Vec<_> = inputs
        .iter()
        .map(|input| plan.submit(&[Feed::Data(input)], &[&kept]).unwrap())
        .collect();
    let mut outputs = Vec::new();
    for run in runs {
        outputs.push(run.wait_async().await.unwrap().swap_remove(0));
    }
    for (input, output) in inputs.iter().zip(&outputs) {
        let eager = forward(&context, &context.tensor(input, &[4, 32]).unwrap(), &layers);
        assert_close(
            "pipelined",
            output,
            &eager.to_vec_async().await.unwrap(),
            1e-5,
        );
    }
    // The kept tensor holds the last replay's output.
    assert_close(
        "kept",
        &kept.to_vec_async().await.unwrap(),
        outputs.last().unwrap(),
        0.0,
    );
}

#[wasm_bindgen_test]
async fn a_plans_blocking_run_is_refused_and_the_plan_still_serves() {
    let context = context().await;
    let layers = layers(&context, &[8, 8]);
    let mut capture = context.capture().unwrap();
    let x = capture.input(&[2, 8]).unwrap();
    let y = forward(&context, &x, &layers);
    let mut plan = capture.finish(&[&y]).unwrap();
    let input = values(7, 16, -1.0, 1.0);
    let error = plan
        .run(&[Feed::Data(&input)])
        .expect_err("a browser cannot block");
    assert!(error.to_string().contains("_async"), "{error}");
    let answer = plan.run_async(&[Feed::Data(&input)]).await.unwrap();
    assert_eq!(answer[0].len(), 16);
    // A refused input submits nothing and is typed.
    assert!(plan.run_async(&[Feed::Data(&input[..3])]).await.is_err());
}
