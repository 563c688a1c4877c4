//! The server on a GPU with what its scheduler decides: prefix caching (shared blocks, the
//! same tokens with and without, cached blocks labelled in the pool's reports) and optimistic
//! admission with preemption (more in flight than reservation, no out-of-memory error, the same
//! tokens). The scheduler's own decisions are tested with no GPU in `src/scheduler/tests.rs`.

use wgpu_pool::compute::{ContextOptions, DType};
use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
use wgpu_pool::paging::{RequestSpec, StreamSpec, Traffic};
use wgpu_pool::scheduler::Admission;
use wgpu_pool::serve::{Completion, Execution, Gpt2, Server, ServerOptions};

use crate::compute::context_with;
use crate::gpu::gpu;

fn weights() -> Gpt2Weights {
    Gpt2Weights::random(&Gpt2Config::tiny(), 11).expect("weights")
}

/// `requests` requests, each prompt starting with one of 3 system prompts of 40 tokens.
fn shared_prefix_stream(requests: usize) -> Vec<RequestSpec> {
    let spec = StreamSpec {
        requests,
        prompt_tokens: (3, 30),
        output_tokens: (1, 12),
        vocab_size: 256,
        max_tokens: 128,
        seed: 5,
    };
    let traffic = Traffic {
        shared_prefix: Some((3, 40)),
        ..Traffic::default()
    };
    spec.generate_timed(&traffic)
        .unwrap()
        .into_iter()
        .map(|timed| timed.request)
        .collect()
}

/// Serves `requests` on a fresh context and returns the completions (by id), the server's
/// statistics and the pool's out-of-memory count.
fn serve(
    weights: &Gpt2Weights,
    requests: &[RequestSpec],
    options: ServerOptions,
) -> (Vec<Completion>, wgpu_pool::serve::ServerStats, u64) {
    let context = context_with(gpu(), ContextOptions::default());
    let model = Gpt2::upload(&context, weights, DType::F32).unwrap();
    let mut server = Server::new(&context, &model, options).unwrap();
    for request in requests {
        server.submit(request).unwrap();
    }
    let done = server.run().unwrap();
    assert_eq!(done.len(), requests.len());
    assert!(
        done.windows(2).all(|pair| pair[0].id < pair[1].id),
        "run answers by id"
    );
    assert_eq!(server.blocks().held_blocks(), 0, "every block given back");
    let ooms = context.pool().stats().oom_count;
    (done, server.stats().clone(), ooms)
}

fn outputs(done: &[Completion]) -> Vec<Vec<u32>> {
    done.iter()
        .map(|completion| completion.output.clone())
        .collect()
}

#[test]
fn prefix_caching_serves_the_same_tokens_computing_fewer_rows() {
    let weights = weights();
    let requests = shared_prefix_stream(24);
    for execution in [Execution::Planned, Execution::Eager] {
        let options = |prefix_caching| ServerOptions {
            max_batch: 8,
            kv_blocks: Some(120),
            execution,
            prefix_caching,
            ..ServerOptions::default()
        };
        let (with, stats_with, _) = serve(&weights, &requests, options(true));
        let (without, stats_without, _) = serve(&weights, &requests, options(false));
        assert_eq!(outputs(&with), outputs(&without), "{execution:?}");
        for done in &with {
            let agreement = weights
                .greedy_agreement(&done.prompt, &done.output, 1e-3)
                .unwrap();
            assert!(
                agreement.agrees(),
                "{execution:?} request {}: {agreement:?}",
                done.id
            );
        }
        assert!(stats_with.cached_tokens >= 16 * 20, "{stats_with:?}");
        assert_eq!(stats_without.cached_tokens, 0);
        assert!(
            stats_with.rows + stats_with.cached_tokens <= stats_without.rows + 16,
            "with {stats_with:?} without {stats_without:?}"
        );
        assert!(stats_with.rows < stats_without.rows);
        // Requests admitted in the same step as the first of their prefix compute it too.
        assert!(with.iter().filter(|done| done.cached_tokens > 0).count() >= 12);
    }
}

#[test]
fn shared_and_cached_blocks_are_named_in_the_pools_reports() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let options = ServerOptions {
        max_batch: 4,
        kv_blocks: Some(60),
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, &model, options).unwrap();
    let head: Vec<u32> = (0..40).collect(); // two whole blocks of 16 and 8 tokens
    let first = RequestSpec {
        prompt: [head.clone(), vec![200, 201]].concat(),
        max_new_tokens: 2,
    };
    server.submit(&first).unwrap();
    server.run().unwrap();
    // One more request of the same head; another still running beside it.
    for tail in [[210u32, 211], [220, 221]] {
        server
            .submit(&RequestSpec {
                prompt: [head.clone(), tail.to_vec()].concat(),
                max_new_tokens: 6,
            })
            .unwrap();
    }
    server.step().unwrap();
    server.label_kv().unwrap();
    let labels: Vec<String> = context
        .pool()
        .memory_state()
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .map(|span| span.label.clone())
        .collect();
    for wanted in [
        "kv h.0.k: shared by 2 seqs",
        "kv h.1.v: seq 2",
        "kv h.0.v: seq 1",
    ] {
        assert!(
            labels.iter().any(|l| l == wanted),
            "{wanted} not in {labels:?}"
        );
    }
    server.run().unwrap();
    server.label_kv().unwrap();
    let cached = context
        .pool()
        .memory_state()
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .any(|span| span.label == "kv h.1.k: cached prefix");
    assert!(cached, "finished requests' prefix blocks show as cached");
    let summary = wgpu_pool::report::Report::from_pool(context.pool()).to_string();
    // The summary's lines wrap inside its box: its words, read across the borders.
    let words: Vec<&str> = summary
        .split_whitespace()
        .filter(|word| *word != "|")
        .collect();
    let text = words.join(" ");
    assert!(text.contains("Named parts:"), "{summary}");
    assert!(text.contains("cached prefix "), "{summary}");
}

#[test]
fn optimistic_admission_keeps_more_in_flight_preempts_and_serves_the_same_tokens() {
    let weights = weights();
    let requests = StreamSpec {
        requests: 32,
        prompt_tokens: (20, 60),
        output_tokens: (20, 60),
        vocab_size: 256,
        max_tokens: 128,
        seed: 3,
    }
    .generate()
    .unwrap();
    for execution in [Execution::Planned, Execution::Eager] {
        // 24 usable blocks of 16 tokens: half of what 8 contiguous sequences of the context need
        // (8 × 128 / 16 = 64 blocks) and then some less.
        let options = |admission| ServerOptions {
            max_batch: 8,
            kv_blocks: Some(25),
            execution,
            admission,
            prefix_caching: false,
            ..ServerOptions::default()
        };
        let (reserved, reserved_stats, reserved_ooms) =
            serve(&weights, &requests, options(Admission::Reserve));
        let (optimistic, optimistic_stats, optimistic_ooms) = serve(
            &weights,
            &requests,
            options(Admission::Optimistic { watermark: 0.01 }),
        );
        assert_eq!(outputs(&reserved), outputs(&optimistic), "{execution:?}");
        assert_eq!((reserved_ooms, optimistic_ooms), (0, 0));
        assert_eq!(reserved_stats.preemptions, 0);
        assert!(optimistic_stats.preemptions > 0, "{optimistic_stats:?}");
        assert!(optimistic_stats.recomputed_tokens > 0);
        assert!(
            optimistic_stats.in_flight_sum * reserved_stats.steps
                > reserved_stats.in_flight_sum * optimistic_stats.steps,
            "mean in flight: optimistic {optimistic_stats:?} reserved {reserved_stats:?}"
        );
        let preempted: u64 = optimistic
            .iter()
            .map(|done| u64::from(done.preemptions))
            .sum();
        assert_eq!(preempted, optimistic_stats.preemptions);
    }
}

#[test]
fn a_refused_server_leaves_the_model_to_try_again() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let too_small = ServerOptions {
        budget_bytes: Some(model.bytes()),
        ..ServerOptions::default()
    };
    assert!(Server::new(&context, &model, too_small).is_err());
    let options = ServerOptions {
        kv_blocks: Some(20),
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, &model, options).unwrap();
    server
        .submit(&RequestSpec {
            prompt: vec![1, 2, 3],
            max_new_tokens: 3,
        })
        .unwrap();
    assert_eq!(server.run().unwrap()[0].output.len(), 3);
}
