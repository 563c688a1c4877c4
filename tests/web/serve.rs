//! GPT-2 served in a browser: the tiny model with a paged KV cache, planned and eager, every
//! request's greedy tokens against the f64 twin (`Gpt2Weights::reference_logits`), admission
//! under a budget, typed refusals.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::DType;
use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
use wgpu_pool::paging::{KvLayout, RequestSpec, StreamSpec};
use wgpu_pool::serve::{Execution, Gpt2, ServeError, Server, ServerOptions};

use crate::support::context;

/// f32 logits against the f64 twin.
const LOGIT_TOLERANCE: f32 = 1e-3;

fn weights() -> Gpt2Weights {
    Gpt2Weights::random(&Gpt2Config::tiny(), 11).unwrap()
}

/// Every output is a greedy choice of the twin: its logit within the tolerance of the best.
fn assert_greedy(weights: &Gpt2Weights, what: &str, prompt: &[u32], output: &[u32]) {
    let agreement = weights
        .greedy_agreement(prompt, output, LOGIT_TOLERANCE)
        .unwrap();
    assert!(agreement.agrees(), "{what}: {agreement:?}");
    assert_eq!(agreement.equal + agreement.near_ties, output.len());
}

fn stream(requests: usize, seed: u64) -> Vec<RequestSpec> {
    StreamSpec {
        requests,
        prompt_tokens: (3, 30),
        output_tokens: (1, 10),
        vocab_size: 256,
        max_tokens: 128,
        seed,
    }
    .generate()
    .unwrap()
}

async fn serve(execution: Execution) {
    let weights = weights();
    let context = context().await;
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let options = ServerOptions {
        max_batch: 4,
        layout: KvLayout::Paged,
        block_tokens: 8,
        max_step_tokens: 32,
        kv_blocks: Some(48),
        execution,
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, model, options).unwrap();
    server.warm_up_async().await.unwrap();
    let requests = stream(6, 5);
    for request in &requests {
        server.submit(request).unwrap();
    }
    let done = server.run_async().await.unwrap();
    assert_eq!(done.len(), requests.len());
    for completion in &done {
        let request = &requests[completion.id as usize];
        assert_eq!(completion.output.len(), request.max_new_tokens);
        assert!(completion.time_to_first_token <= completion.time_to_last_token);
        assert_greedy(
            &weights,
            &format!("{execution:?}"),
            &request.prompt,
            &completion.output,
        );
    }
    assert_eq!(server.blocks().held_blocks(), 0, "blocks freed");
    assert!(server.stats().in_flight_max >= 2, "{:?}", server.stats());
    assert_eq!(context.pool().stats().oom_count, 0);
}

#[wasm_bindgen_test]
async fn the_tiny_gpt2_served_planned_gives_the_twins_greedy_tokens() {
    serve(Execution::Planned).await;
}

#[wasm_bindgen_test]
async fn the_tiny_gpt2_served_eagerly_gives_the_twins_greedy_tokens() {
    serve(Execution::Eager).await;
}

#[wasm_bindgen_test]
async fn a_budget_sizes_the_cache_and_bad_requests_are_typed() {
    let weights = weights();
    let context = context().await;
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let options = ServerOptions {
        max_batch: 2,
        budget_bytes: Some(24 << 20),
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, model, options).unwrap();
    assert!(server.capacity_for(64) >= 1, "the budget holds a sequence");
    assert_eq!(server.capacity_for(1), 0);
    assert!(matches!(
        server.submit(&RequestSpec {
            prompt: vec![],
            max_new_tokens: 1
        }),
        Err(ServeError::Tokens(_))
    ));
    assert!(matches!(
        server.submit(&RequestSpec {
            prompt: vec![1, 2],
            max_new_tokens: 0
        }),
        Err(ServeError::NoOutputs)
    ));
    let id = server
        .submit(&RequestSpec {
            prompt: vec![5, 6, 7],
            max_new_tokens: 4,
        })
        .unwrap();
    let done = server.run_async().await.unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].id, id);
    assert_greedy(&weights, "budget", &[5, 6, 7], &done[0].output);
    // A blocking step is refused (the running requests are stopped and named), and the server
    // serves what is queued after it.
    let blocked = server
        .submit(&RequestSpec {
            prompt: vec![9, 9],
            max_new_tokens: 3,
        })
        .unwrap();
    match server.step() {
        Err(error @ ServeError::StepFailed { .. }) => {
            assert!(error.to_string().contains("_async"), "{error}");
            let ServeError::StepFailed { stopped, .. } = error else {
                unreachable!()
            };
            assert_eq!(stopped, [blocked]);
        }
        other => panic!("a blocking step in a browser: {other:?}"),
    }
    server
        .submit(&RequestSpec {
            prompt: vec![1, 2, 3],
            max_new_tokens: 2,
        })
        .unwrap();
    let after = server.run_async().await.unwrap();
    assert!(after.iter().any(|done| done.prompt == [1, 2, 3]));
}
