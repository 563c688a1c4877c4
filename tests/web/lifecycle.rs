//! What a page does over time: plans of several batch sizes in one arena, a replay fed a
//! tensor, the out-of-memory observer, a bounded history, a bad kernel of the user's, a request
//! cancelled between awaited steps.

use std::sync::{Arc, Mutex};

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::{cpu, CaptureOptions, ComputeError, DType, Feed, UserKernelDesc};
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
use wgpu_pool::paging::RequestSpec;
use wgpu_pool::serve::{Gpt2, Server, ServerOptions};
use wgpu_pool::{Pool, PoolError, PoolOptions};

use crate::support::{assert_close, context, gpu, values};

#[wasm_bindgen_test]
async fn plans_of_several_batch_sizes_share_one_arena() {
    let context = context().await;
    let w = values(71, 32 * 16, -0.3, 0.3);
    let tw = context.tensor(&w, &[32, 16]).unwrap();
    let arena = context.plan_arena();
    let mut plans = Vec::new();
    for batch in [1, 4, 8] {
        let mut capture = context.capture().unwrap();
        let x = capture.input(&[batch, 32]).unwrap();
        let y = context.gelu(&context.matmul(&x, &tw).unwrap()).unwrap();
        let options = CaptureOptions {
            arena: Some(arena.clone()),
            ..CaptureOptions::default()
        };
        plans.push((batch, capture.finish_with(&[&y], options).unwrap()));
    }
    for (batch, plan) in &mut plans {
        let x = values(*batch as u64, *batch * 32, -1.0, 1.0);
        let got = plan.run_async(&[Feed::Data(&x)]).await.unwrap();
        let expected = cpu::gelu(&cpu::matmul(&x, &w, *batch, 32, 16));
        assert_close(&format!("batch {batch}"), &got[0], &expected, 1e-5);
    }
    assert!(plans
        .iter()
        .all(|(_, plan)| plan.arena().bytes() == arena.bytes()));
}

#[wasm_bindgen_test]
async fn a_replay_takes_a_tensor_as_its_input() {
    let context = context().await;
    let mut capture = context.capture().unwrap();
    let x = capture.input(&[64]).unwrap();
    let y = context.exp(&context.neg(&x).unwrap()).unwrap();
    let mut plan = capture.finish(&[&y]).unwrap();
    let data = values(72, 64, -2.0, 2.0);
    let input = context.tensor(&data, &[64]).unwrap();
    let got = plan.run_async(&[Feed::Tensor(&input)]).await.unwrap();
    assert_close("exp(-x)", &got[0], &cpu::exp(&cpu::neg(&data)), 1e-6);
}

#[wasm_bindgen_test]
async fn the_oom_observer_sees_each_refusal_with_its_snapshot() {
    let pool = Pool::new(&gpu().await, PoolOptions::default()).unwrap();
    let seen: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let record = Arc::clone(&seen);
    pool.set_oom_observer(Some(Arc::new(move |report| {
        let blocks = report
            .snapshot()
            .segments
            .iter()
            .map(|segment| segment.blocks.len())
            .sum();
        record
            .lock()
            .unwrap()
            .push((report.error.requested_bytes, blocks));
    })));
    pool.set_budget(Some(2 << 20));
    let _held = pool.allocate(1 << 20).unwrap();
    for size in [4 << 20, 8 << 20] {
        assert!(matches!(
            pool.allocate(size),
            Err(PoolError::OutOfMemory(_))
        ));
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, 4 << 20);
    assert_eq!(seen[1].0, 8 << 20);
    assert!(seen.iter().all(|&(_, blocks)| blocks >= 1), "{seen:?}");
}

#[wasm_bindgen_test]
async fn a_bounded_history_keeps_the_newest_events_and_its_totals() {
    let pool = Pool::new(
        &gpu().await,
        PoolOptions {
            history: Some(HistoryOptions::with_max_events(8)),
            ..PoolOptions::default()
        },
    )
    .unwrap();
    for round in 0..10u64 {
        let allocation = pool.allocate(4096 * (round + 1)).unwrap();
        drop(allocation);
        pool.submit([]);
    }
    let history = pool.history().unwrap();
    assert_eq!(history.len(), 8);
    let sizes: Vec<u64> = history.events().iter().map(|e| e.size_bytes).collect();
    assert!(
        sizes.contains(&(4096 * 10)),
        "the newest events are kept: {sizes:?}"
    );
    assert!(!sizes.contains(&4096), "the oldest are dropped: {sizes:?}");
}

#[wasm_bindgen_test]
async fn a_bad_kernel_of_the_users_is_a_typed_error() {
    let context = context().await;
    let refused = context.user_kernel(&UserKernelDesc {
        label: "broken",
        wgsl: "@compute @workgroup_size(64) fn main() { let x: f32 = ; }",
        entry_point: "main",
        ..UserKernelDesc::default()
    });
    assert!(
        matches!(refused, Err(ComputeError::UserKernel { .. })),
        "{refused:?}"
    );
    // The context still computes.
    let x = context.tensor(&[1.0, 4.0, 9.0, 16.0], &[4]).unwrap();
    assert_eq!(
        context.sqrt(&x).unwrap().to_vec_async().await.unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
}

#[wasm_bindgen_test]
async fn a_request_cancelled_between_awaited_steps_frees_its_blocks() {
    let weights = Gpt2Weights::random(&Gpt2Config::tiny(), 11).unwrap();
    let context = context().await;
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let options = ServerOptions {
        max_batch: 2,
        kv_blocks: Some(20),
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, model, options).unwrap();
    let request = |prompt: Vec<u32>| RequestSpec {
        prompt,
        max_new_tokens: 6,
    };
    let gone = server.submit(&request(vec![1, 2, 3])).unwrap();
    let kept = server.submit(&request(vec![4, 5, 6, 7])).unwrap();
    server.step_ahead_async().await.unwrap();
    server.step_ahead_async().await.unwrap();
    // A step may be in flight: awaited, not waited for.
    server.cancel_async(gone).await.unwrap();
    let done = server.run_async().await.unwrap();
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [kept]);
    assert_eq!(done[0].output.len(), 6);
    assert!(weights
        .greedy_agreement(&[4, 5, 6, 7], &done[0].output, 1e-3)
        .unwrap()
        .agrees());
    assert_eq!(server.blocks().held_blocks(), 0);
}
