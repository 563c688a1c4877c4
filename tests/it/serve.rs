//! GPT-2 served on the pool (`wgpu_pool::serve`): the step's logits against the model's CPU
//! twin (`Gpt2Weights::reference_logits`, f64) within 1e-3 for a prompt and 16 decode steps of
//! two interleaved sequences, eager and planned; the server's greedy tokens against the twin's;
//! admission by KV blocks (paged against contiguous), the budget, the KV labels in the pool's
//! reports, typed refusals, cancelling, pipelined steps, and a failed step (its requests
//! stopped, the waiting ones served after). Every test runs on the backend `WGPU_BACKEND` selects.

use wgpu_pool::compute::{Context, ContextOptions, DType, Feed, Plan};
use wgpu_pool::model::{
    Gpt2Config, Gpt2Weights, StoredDtype, TokensError, WeightsError, CONFIG_JSON, MODEL_FILE,
};
use wgpu_pool::paging::{BlockManager, KvLayout, RequestSpec, StepRows, StreamSpec};
use wgpu_pool::serve::{
    Execution, Gpt2, Head, KvCache, ServeError, Server, ServerOptions, StepTensors,
};

use crate::compute::context_with;
use crate::gpu::{gpu, gpu_default_limits};

/// The issue's tolerance on logits (f32 against the f64 twin).
const LOGIT_TOLERANCE: f64 = 1e-3;

fn weights() -> Gpt2Weights {
    Gpt2Weights::random(&Gpt2Config::tiny(), 11).expect("weights")
}

/// A sequence of the manual test: its tokens so far and whether its prompt is in the cache.
struct Seq {
    id: u64,
    tokens: Vec<u32>,
    in_cache: usize,
}

/// Runs `rows` through the model: eagerly, or through `plans` (captured per row count).
fn step_logits(
    context: &Context,
    model: &Gpt2,
    cache: &KvCache,
    rows: &StepRows,
    plans: Option<&mut Vec<(usize, Plan)>>,
) -> Vec<f32> {
    let n = rows.capacity();
    let samples = rows.sample_capacity();
    let Some(plans) = plans else {
        let ids = context.tensor(rows.ids(), &[n]).unwrap();
        let positions = context.tensor(rows.positions(), &[n]).unwrap();
        let table = context
            .tensor(rows.table(), &[n, rows.max_blocks()])
            .unwrap();
        let sampled = context.tensor(rows.samples(), &[samples]).unwrap();
        let inputs = StepTensors {
            ids: &ids,
            positions: &positions,
            table: &table,
            samples: &sampled,
        };
        return model
            .forward(context, cache, inputs, Head::Logits)
            .unwrap()
            .to_vec()
            .unwrap();
    };
    if !plans.iter().any(|(rows, _)| *rows == n) {
        let mut capture = context.capture().unwrap();
        let ids = capture.input(&[n]).unwrap();
        let positions = capture.input(&[n]).unwrap();
        let table = capture.input(&[n, rows.max_blocks()]).unwrap();
        let sampled = capture.input(&[samples]).unwrap();
        let inputs = StepTensors {
            ids: &ids,
            positions: &positions,
            table: &table,
            samples: &sampled,
        };
        let logits = model.forward(context, cache, inputs, Head::Logits).unwrap();
        plans.push((n, capture.finish(&[&logits]).unwrap()));
    }
    let plan = &mut plans.iter_mut().find(|(rows, _)| *rows == n).unwrap().1;
    let feeds = [
        Feed::Data(rows.ids()),
        Feed::Data(rows.positions()),
        Feed::Data(rows.table()),
        Feed::Data(rows.samples()),
    ];
    plan.run(&feeds).unwrap().swap_remove(0)
}

/// Two sequences (prompts of 19 and 6 tokens) prefilled in one step, then decoded together for
/// 16 steps over blocks of 4 tokens that interleave; after every step each sequence's logits
/// equal the twin's over its tokens so far.
fn prompt_and_16_decode_steps(planned: bool, vocab_size: usize) {
    let config = Gpt2Config {
        vocab_size,
        ..Gpt2Config::tiny()
    };
    let weights = Gpt2Weights::random(&config, 11).expect("weights");
    let config = weights.config;
    let context = context_with(gpu(), ContextOptions::default());
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let block_tokens = 4;
    let cache = KvCache::new(&context, &config, block_tokens, 40, DType::F32).unwrap();
    let mut blocks = BlockManager::new(KvLayout::Paged, block_tokens, 40).unwrap();
    let max_blocks = config.n_ctx / block_tokens;
    let mut seqs: Vec<Seq> = [(0u64, 19usize), (1, 6)]
        .iter()
        .map(|&(id, len)| Seq {
            id,
            tokens: (0..len)
                .map(|i| ((i * 37 + 5 * id as usize) % vocab_size) as u32)
                .collect(),
            in_cache: 0,
        })
        .collect();
    for seq in &seqs {
        assert!(blocks.admit(seq.id, seq.tokens.len() + 16).unwrap());
    }
    let mut plans = planned.then(Vec::new);
    for step in 0..=16 {
        let rows_now: usize = seqs.iter().map(|s| s.tokens.len() - s.in_cache).sum();
        let capacity = if planned {
            StepRows::bucket(rows_now)
        } else {
            rows_now
        };
        let mut rows = StepRows::new(capacity, 2, max_blocks).unwrap();
        for seq in &mut seqs {
            let count = seq.tokens.len() - seq.in_cache;
            let start = blocks.grow(seq.id, count).unwrap();
            let table = blocks.blocks(seq.id).unwrap().to_vec();
            for offset in 0..count {
                let last = offset + 1 == count;
                rows.push(
                    seq.tokens[start + offset],
                    start + offset,
                    &table,
                    block_tokens,
                    last,
                )
                .unwrap();
            }
            seq.in_cache = seq.tokens.len();
        }
        let logits = step_logits(&context, &model, &cache, &rows, plans.as_mut());
        let vocab = config.vocab_size;
        for (i, seq) in seqs.iter_mut().enumerate() {
            let reference = weights.reference_logits(&seq.tokens).unwrap();
            let expected = &reference[(seq.tokens.len() - 1) * vocab..];
            let got = &logits[i * vocab..(i + 1) * vocab];
            crate::compute::assert_close(
                &format!("step {step} sequence {i} (planned {planned})"),
                got,
                expected,
                |_| LOGIT_TOLERANCE,
            );
            let next = wgpu_pool::compute::cpu::argmax_rows(got, vocab)[0];
            seq.tokens.push(next);
        }
    }
    // The blocks interleaved: sequence 1's are not one run.
    let b = blocks.blocks(1).unwrap();
    assert!(b.windows(2).any(|w| w[1] != w[0] + 1), "{b:?}");
}

#[test]
fn eager_steps_match_the_cpu_twin() {
    prompt_and_16_decode_steps(false, 256);
}

#[test]
fn planned_steps_match_the_cpu_twin() {
    prompt_and_16_decode_steps(true, 256);
}

/// A vocabulary of no multiple of 4 (GPT-2's 50,257): the output product's padding columns
/// are never chosen, and the logits come without them, eager and planned; the server's greedy
/// tokens are the twin's.
#[test]
fn a_vocabulary_of_no_multiple_of_4_is_padded_and_taken_off() {
    prompt_and_16_decode_steps(false, 253);
    prompt_and_16_decode_steps(true, 253);
    let config = Gpt2Config {
        vocab_size: 253,
        ..Gpt2Config::tiny()
    };
    let weights = Gpt2Weights::random(&config, 5).expect("weights");
    let context = context_with(gpu(), ContextOptions::default());
    let options = ServerOptions {
        max_batch: 4,
        kv_blocks: Some(32),
        ..ServerOptions::default()
    };
    let mut server = server(&context, &weights, options);
    let requests = [vec![252, 0, 7], vec![5; 20], vec![100, 200, 250, 1, 2]];
    for prompt in &requests {
        server
            .submit(&RequestSpec {
                prompt: prompt.clone(),
                max_new_tokens: 12,
            })
            .unwrap();
    }
    for done in server.run().unwrap() {
        assert!(done.output.iter().all(|&t| t < 253), "{:?}", done.output);
        assert_greedy(&weights, "vocab 253", &done.prompt, &done.output);
    }
}

/// Checks that every output is a greedy choice of the twin: the twin's logit of the chosen
/// token is within the tolerance of its largest (so only near-ties may differ).
fn assert_greedy(weights: &Gpt2Weights, what: &str, prompt: &[u32], output: &[u32]) {
    let agreement = weights
        .greedy_agreement(prompt, output, LOGIT_TOLERANCE as f32)
        .unwrap();
    assert!(agreement.agrees(), "{what}: {agreement:?}");
}

fn stream(requests: usize, seed: u64) -> Vec<RequestSpec> {
    StreamSpec {
        requests,
        prompt_tokens: (3, 40),
        output_tokens: (1, 12),
        vocab_size: 256,
        max_tokens: 128,
        seed,
    }
    .generate()
    .unwrap()
}

fn server(context: &Context, weights: &Gpt2Weights, options: ServerOptions) -> Server {
    let model = Gpt2::upload(context, weights, DType::F32).unwrap();
    Server::new(context, model, options).unwrap()
}

/// A server of two sequences at most over a cache of 20 blocks of 16 tokens.
fn small_server(context: &Context, weights: &Gpt2Weights) -> Server {
    let options = ServerOptions {
        max_batch: 2,
        kv_blocks: Some(20),
        ..ServerOptions::default()
    };
    server(context, weights, options)
}

/// Serves one request of `prompt` and `outputs` tokens to its end and checks its tokens are
/// the twin's greedy ones.
fn serves_greedily(
    server: &mut Server,
    weights: &Gpt2Weights,
    what: &str,
    prompt: &[u32],
    outputs: usize,
) {
    server
        .submit(&RequestSpec {
            prompt: prompt.to_vec(),
            max_new_tokens: outputs,
        })
        .unwrap();
    let done = server.run().unwrap();
    assert_eq!(done.len(), 1, "{what}");
    assert_greedy(weights, what, prompt, &done[0].output);
}

/// A `config.json` for `config` with Hugging Face's keys for GPT-2 (a few of its extras among
/// them), untied or not.
fn config_json(config: &Gpt2Config, tie_word_embeddings: bool) -> String {
    format!(
        r#"{{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
"layer_norm_epsilon": 1e-05, "n_inner": null, "bos_token_id": 50256, "resid_pdrop": 0.1,
"n_layer": {}, "n_embd": {}, "n_head": {}, "n_positions": {}, "n_ctx": {}, "vocab_size": {},
"tie_word_embeddings": {tie_word_embeddings}}}"#,
        config.n_layer, config.n_embd, config.n_head, config.n_ctx, config.n_ctx, config.vocab_size
    )
}

/// A checkpoint whose `lm_head.weight` is untied, in a folder with its `config.json`:
/// `Gpt2::load` serves it, and the greedy tokens are its twin's, with the untied head (the tied
/// twin's are others); `Gpt2::from_bytes` serves the same; a folder whose `config.json`
/// disagrees with the file is refused.
#[test]
fn an_untied_head_loaded_from_a_folder_serves_the_twins_greedy_tokens() {
    let tied = weights();
    let head = Gpt2Weights::random(&tied.config, 12).expect("weights").wte;
    let weights = Gpt2Weights {
        untied_lm_head: Some(head),
        ..tied.clone()
    };
    let dir = std::env::temp_dir().join(format!("wgpu-pool-untied-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    weights
        .write(dir.join(MODEL_FILE), StoredDtype::F32)
        .unwrap();
    let json = config_json(&weights.config, false);
    std::fs::write(dir.join(CONFIG_JSON), &json).unwrap();
    let context = context_with(gpu(), ContextOptions::default());
    let options = ServerOptions {
        max_batch: 4,
        kv_blocks: Some(32),
        ..ServerOptions::default()
    };
    let requests = stream(6, 21);
    let mut outputs = Vec::new();
    let bytes = std::fs::read(dir.join(MODEL_FILE)).unwrap();
    for (name, model) in [
        ("load", Gpt2::load(&context, &dir, DType::F32).unwrap()),
        (
            "from_bytes",
            Gpt2::from_bytes(&context, &bytes, Some(&json), DType::F32).unwrap(),
        ),
    ] {
        let mut server = Server::new(&context, model, options.clone()).unwrap();
        for request in &requests {
            server.submit(request).unwrap();
        }
        let mut done = server.run().unwrap();
        done.sort_by_key(|c| c.id);
        assert_eq!(done.len(), requests.len(), "{name}");
        let mut tied_disagreements = 0;
        for completion in &done {
            assert_greedy(&weights, name, &completion.prompt, &completion.output);
            tied_disagreements += tied
                .greedy_agreement(
                    &completion.prompt,
                    &completion.output,
                    LOGIT_TOLERANCE as f32,
                )
                .unwrap()
                .disagreements;
        }
        assert!(
            tied_disagreements > 0,
            "{name}: the tied head gives the same tokens"
        );
        outputs.push(done.into_iter().map(|c| c.output).collect::<Vec<_>>());
    }
    assert_eq!(outputs[0], outputs[1]);
    // config.json saying the head is tied, while the file's differs; then another width.
    std::fs::write(dir.join(CONFIG_JSON), config_json(&weights.config, true)).unwrap();
    let error = Gpt2::load(&context, &dir, DType::F32).expect_err("tied but differs");
    assert!(
        matches!(
            error,
            ServeError::Weights(WeightsError::TiedHeadDiffers { .. })
        ),
        "{error}"
    );
    let wider = Gpt2Config {
        n_embd: 128,
        ..weights.config
    };
    std::fs::write(dir.join(CONFIG_JSON), config_json(&wider, false)).unwrap();
    let error = Gpt2::load(&context, &dir, DType::F32).expect_err("mismatch");
    assert!(
        matches!(
            error,
            ServeError::Weights(WeightsError::ConfigMismatch { key: "n_embd", .. })
        ),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_server_generates_the_twins_greedy_tokens_planned_eager_and_contiguous() {
    let weights = weights();
    let requests = stream(7, 5);
    for (name, layout, execution, min_step_rows) in [
        ("paged planned", KvLayout::Paged, Execution::Planned, 1),
        ("paged eager", KvLayout::Paged, Execution::Eager, 1),
        (
            "contiguous planned",
            KvLayout::Contiguous { max_tokens: 64 },
            Execution::Planned,
            1,
        ),
        // Every decode step at the largest batch's plan.
        (
            "paged, steps of 4 rows or more",
            KvLayout::Paged,
            Execution::Planned,
            4,
        ),
    ] {
        let context = context_with(gpu(), ContextOptions::default());
        let options = ServerOptions {
            max_batch: 4,
            layout,
            block_tokens: 8,
            max_step_tokens: 32, // prompts of more than 28 tokens fill over two steps
            kv_blocks: Some(48),
            execution,
            min_step_rows,
            ..ServerOptions::default()
        };
        let mut server = server(&context, &weights, options);
        for request in &requests {
            server.submit(request).unwrap();
        }
        let done = server.run().unwrap();
        assert_eq!(done.len(), requests.len(), "{name}");
        for completion in &done {
            let request = &requests[completion.id as usize];
            assert_eq!(completion.prompt, request.prompt);
            assert_eq!(completion.output.len(), request.max_new_tokens, "{name}");
            assert!(completion.time_to_first_token <= completion.time_to_last_token);
            assert_greedy(&weights, name, &request.prompt, &completion.output);
        }
        let stats = server.stats();
        assert_eq!(
            stats.generated_tokens as usize,
            requests.iter().map(|r| r.max_new_tokens).sum::<usize>()
        );
        assert!(
            stats.in_flight_max <= 4 && stats.in_flight_max >= 2,
            "{name}: {stats:?}"
        );
        assert_eq!(server.blocks().held_blocks(), 0, "{name}: blocks freed");
        assert_eq!(context.pool().stats().oom_count, 0, "{name}");
    }
}

#[test]
fn paged_admission_keeps_twice_the_sequences_in_flight_of_contiguous() {
    let weights = weights();
    let requests = stream(24, 9);
    let mut in_flight = Vec::new();
    for layout in [KvLayout::Paged, KvLayout::Contiguous { max_tokens: 128 }] {
        let context = context_with(gpu(), ContextOptions::default());
        let options = ServerOptions {
            max_batch: 16,
            layout,
            kv_blocks: Some(33), // 32 usable blocks of 16: four contiguous sequences of 128
            ..ServerOptions::default()
        };
        let mut server = server(&context, &weights, options);
        assert_eq!(server.capacity_for(128), 4);
        assert_eq!(
            server.capacity_for(32),
            if layout == KvLayout::Paged { 16 } else { 4 }
        );
        for request in &requests {
            server.submit(request).unwrap();
        }
        let done = server.run().unwrap();
        assert_eq!(done.len(), requests.len());
        let stats = server.stats().clone();
        assert!(
            stats.waits > 0,
            "{layout:?}: the cache was meant to be short: {stats:?}"
        );
        assert_eq!(stats.preemptions, 0);
        assert_eq!(context.pool().stats().oom_count, 0);
        let peak = stats.kv_peak;
        let waste = 1.0 - peak.used_tokens as f64 / (peak.held_blocks * 16) as f64;
        if layout == KvLayout::Paged {
            assert!(waste < 0.5, "paged waste {waste}");
        } else {
            assert!(waste > 0.5, "contiguous waste {waste}");
        }
        in_flight.push(stats.in_flight_max);
    }
    assert!(
        in_flight[0] >= 2 * in_flight[1],
        "paged {} contiguous {}",
        in_flight[0],
        in_flight[1]
    );
}

#[test]
fn a_budget_sizes_the_cache_and_bounds_the_pool() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let budget = 48 << 20;
    let options = ServerOptions {
        budget_bytes: Some(budget),
        ..ServerOptions::default()
    };
    let mut server = server(&context, &weights, options);
    assert!(
        server.cache().num_blocks() > 9,
        "{}",
        server.cache().num_blocks()
    );
    // Sized under the budget: never past it, no refusal counted, and the cache takes most of
    // what the weights and activations left (its tensors each in a segment sized for it).
    let built = context.pool().stats();
    assert!(built.reserved_bytes.peak <= budget, "{built:?}");
    assert_eq!(built.oom_count, 0);
    let cache = server.cache().bytes();
    let before_cache = built.reserved_bytes.current - cache;
    assert!(
        cache * 100 >= (budget - before_cache) * 97,
        "the cache takes {cache} of the {} bytes left",
        budget - before_cache
    );
    assert!(server.activation_bytes() > 0);
    for request in stream(5, 2) {
        server.submit(&request).unwrap();
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
        "kv h.1.v: seq 0",
        "kv h.0.k: seq 4",
        "gpt2 h.1.mlp.c_fc.weight",
    ] {
        assert!(
            labels.iter().any(|l| l == wanted),
            "{wanted} not in {labels:?}"
        );
    }
    server.run().unwrap();
    let stats = context.pool().stats();
    assert!(stats.reserved_bytes.peak <= budget, "{stats:?}");
    assert_eq!(stats.oom_count, 0);
    // A budget and a count of blocks: the budget must hold them.
    for (blocks, fits) in [(40, true), (4000, false)] {
        let context = context_with(gpu(), ContextOptions::default());
        let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
        let options = ServerOptions {
            budget_bytes: Some(8 << 20),
            kv_blocks: Some(blocks),
            ..ServerOptions::default()
        };
        match Server::new(&context, model, options) {
            Ok(server) => {
                assert!(fits, "{blocks} blocks");
                assert_eq!(server.cache().num_blocks(), blocks);
                assert!(context.pool().stats().reserved_bytes.current <= 8 << 20);
            }
            Err(ServeError::Budget { kv_min_bytes, .. }) => {
                assert!(!fits, "{blocks} blocks");
                assert_eq!(kv_min_bytes, blocks as u64 * 16 * 64 * 4 * 4);
            }
            Err(error) => panic!("{blocks} blocks: {error}"),
        }
    }
    // Too small a budget is a typed refusal, not an out-of-memory later.
    let small = ServerOptions {
        budget_bytes: Some(1 << 16),
        ..ServerOptions::default()
    };
    let model = Gpt2::upload(
        &context_with(gpu(), ContextOptions::default()),
        &weights,
        DType::F32,
    );
    let context2 = context_with(gpu(), ContextOptions::default());
    drop(model);
    let model = Gpt2::upload(&context2, &weights, DType::F32).unwrap();
    match Server::new(&context2, model, small) {
        Err(ServeError::Budget {
            reserved_bytes,
            weights_bytes,
            budget_bytes,
            ..
        }) => assert!(reserved_bytes >= weights_bytes && budget_bytes == 1 << 16),
        Err(ServeError::Compute(_)) => {}
        other => panic!("{:?}", other.map(|_| "a server")),
    }
}

#[test]
fn a_servers_budget_lasts_as_long_as_the_server() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let budget = |context: &Context| context.pool().policy().budget_bytes;
    let upload = |context: &Context| Gpt2::upload(context, &weights, DType::F32).unwrap();
    // A refused server leaves the pool's budget as it was: none, then the user's own.
    for before in [None, Some(1u64 << 30)] {
        context.pool().set_budget(before);
        let small = ServerOptions {
            budget_bytes: Some(1 << 16),
            ..ServerOptions::default()
        };
        assert!(Server::new(&context, upload(&context), small).is_err());
        assert_eq!(budget(&context), before);
    }
    context.pool().set_budget(None);
    // A server's budget is the pool's while it lives, and goes when it is dropped.
    let options = ServerOptions {
        budget_bytes: Some(32 << 20),
        max_batch: 4,
        ..ServerOptions::default()
    };
    let server = Server::new(&context, upload(&context), options.clone()).unwrap();
    assert_eq!(budget(&context), Some(32 << 20));
    drop(server);
    assert_eq!(budget(&context), None);
    context.trim().unwrap();
    // So a server without a budget, made after it, may take more than it allowed.
    let unbudgeted = ServerOptions {
        kv_blocks: Some(2100),
        max_batch: 4,
        ..ServerOptions::default()
    };
    assert!(KvCache::block_bytes(&Gpt2Config::tiny(), 16, DType::F32) * 2100 > 32 << 20);
    let server = Server::new(&context, upload(&context), unbudgeted).unwrap();
    assert_eq!(budget(&context), None);
    drop(server);
    context.trim().unwrap();
    // A budget the user set while a server lived is not the server's to take back.
    let server = Server::new(&context, upload(&context), options.clone()).unwrap();
    context.pool().set_budget(Some(64 << 20));
    drop(server);
    assert_eq!(budget(&context), Some(64 << 20));
}

#[test]
fn a_budget_that_holds_a_cache_of_blocks_also_sizes_one() {
    // The smallest cache a budget must hold: one sequence of the model's context, block 0 aside.
    let weights = weights();
    let config = Gpt2Config::tiny();
    let min_blocks = 1 + config.n_ctx.div_ceil(16);
    for execution in [Execution::Planned, Execution::Eager] {
        let options = ServerOptions {
            max_batch: 4,
            execution,
            ..ServerOptions::default()
        };
        // What a server of that cache holds, with no budget: its pool's reservation (and, for
        // eager steps, their activations, which the budget keeps beside the cache) is a budget
        // that holds it.
        let context = context_with(gpu(), ContextOptions::default());
        let explicit = ServerOptions {
            kv_blocks: Some(min_blocks),
            ..options.clone()
        };
        let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
        let server = Server::new(&context, model, explicit.clone()).unwrap();
        let mut held = context.pool().stats().reserved_bytes.current;
        if execution == Execution::Eager {
            // The budget keeps the eager steps' share beside what the pool reserves (the free
            // space of its segments is the steps' too).
            held += server.memory_plan().activation_reserved_bytes;
        }
        drop(server);
        // A server under a budget, and the most its pool reserved meanwhile.
        let budgeted = |options: ServerOptions| {
            let context = context_with(gpu(), ContextOptions::default());
            let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
            let server = Server::new(&context, model, options);
            (server, context.pool().stats().reserved_bytes.peak)
        };
        let budget = held + KvCache::block_bytes(&config, 16, DType::F32) * 2;
        let (with_blocks, _) = budgeted(ServerOptions {
            budget_bytes: Some(budget),
            ..explicit
        });
        assert!(
            with_blocks.is_ok(),
            "{execution:?}: {:?}",
            with_blocks.err()
        );
        // Sized by the same budget: at least that cache.
        let (sized, peak) = budgeted(ServerOptions {
            budget_bytes: Some(budget),
            ..options.clone()
        });
        match sized {
            Ok(server) => assert!(server.cache().num_blocks() >= min_blocks),
            Err(error) => panic!("{execution:?}: a budget of {budget} bytes: {error}"),
        }
        assert!(
            peak <= budget,
            "{execution:?}: reserved {peak} under {budget}"
        );
        // Below what the pool reserves for the weights and activations, with room for the cache
        // in their segments' free space: refused, the pool already holding more than the budget.
        for below in [held / 2, held * 3 / 4] {
            let (sized, _) = budgeted(ServerOptions {
                budget_bytes: Some(below),
                ..options.clone()
            });
            assert!(
                matches!(sized, Err(ServeError::Budget { .. })),
                "{execution:?}: a budget of {below} bytes: {:?}",
                sized.map(|server| server.cache().num_blocks())
            );
        }
    }
}

/// The smallest budget (to within 16 KiB) under which `Server::new` takes `options` (their
/// budget replaced), each try on a fresh context; and a server made under it.
fn smallest_budget(weights: &Gpt2Weights, options: &ServerOptions) -> (u64, Context, Server) {
    let made = |budget| {
        let context = context_with(gpu(), ContextOptions::default());
        let model = Gpt2::upload(&context, weights, DType::F32).unwrap();
        let options = ServerOptions {
            budget_bytes: Some(budget),
            ..options.clone()
        };
        Server::new(&context, model, options).map(|server| (context, server))
    };
    let (mut low, mut high) = (1u64 << 16, 64u64 << 20);
    assert!(made(low).is_err() && made(high).is_ok(), "{options:?}");
    while high - low > 16 << 10 {
        let middle = low + (high - low) / 2;
        if made(middle).is_ok() {
            high = middle;
        } else {
            low = middle;
        }
    }
    let (context, server) = made(high).unwrap();
    (high, context, server)
}

#[test]
fn the_smallest_budget_a_server_takes_serves_without_running_out_of_memory() {
    let weights = weights();
    for execution in [Execution::Planned, Execution::Eager] {
        // The cache sized by the budget, and one of a single sequence of the context.
        for kv_blocks in [None, Some(1 + 128 / 16)] {
            let options = ServerOptions {
                max_batch: 4,
                execution,
                kv_blocks,
                ..ServerOptions::default()
            };
            let (budget, context, mut server) = smallest_budget(&weights, &options);
            let what = format!("{execution:?}, {kv_blocks:?} blocks, at {budget} bytes");
            assert!(server.capacity_for(128) >= 1, "{what}");
            // Long prompts: steps of many rows, the eager ones' intermediates at their largest.
            let requests = StreamSpec {
                requests: 8,
                prompt_tokens: (64, 120),
                output_tokens: (1, 8),
                vocab_size: 256,
                max_tokens: 128,
                seed: 5,
            };
            for request in requests.generate().unwrap() {
                server.submit(&request).unwrap();
            }
            if let Err(error) = server.run() {
                panic!("{what}: {error}");
            }
            let stats = context.pool().stats();
            assert_eq!(stats.oom_count, 0, "{what}");
            assert!(stats.reserved_bytes.peak <= budget, "{what}: {stats:?}");
        }
    }
}

#[test]
fn bad_requests_and_options_are_typed_errors() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let mut server = server(
        &context,
        &weights,
        ServerOptions {
            kv_blocks: Some(9),
            ..ServerOptions::default()
        },
    );
    let refuse = |server: &mut Server, prompt: Vec<u32>, max_new_tokens| {
        server
            .submit(&RequestSpec {
                prompt,
                max_new_tokens,
            })
            .unwrap_err()
    };
    assert!(matches!(
        refuse(&mut server, vec![], 3),
        ServeError::Tokens(_)
    ));
    assert!(matches!(
        refuse(&mut server, vec![256], 3),
        ServeError::Tokens(_)
    ));
    assert!(matches!(
        refuse(&mut server, vec![1; 100], 29),
        ServeError::Tokens(_)
    ));
    assert!(matches!(
        refuse(&mut server, vec![1], 0),
        ServeError::NoOutputs
    ));
    // Outputs past usize's range: too long, not an overflow.
    for (prompt, outputs) in [(2, usize::MAX), (3, usize::MAX - 1), (1, usize::MAX)] {
        assert!(matches!(
            refuse(&mut server, vec![1; prompt], outputs),
            ServeError::Tokens(TokensError::TooLong { .. })
        ));
    }
    assert_eq!(server.waiting(), 0, "nothing refused is queued");
    assert_eq!((server.capacity_for(0), server.capacity_for(129)), (0, 0));
    // No request has fewer than 2 tokens (a prompt token and an output).
    assert_eq!(server.capacity_for(1), 0);
    assert!(server.capacity_for(2) >= server.capacity_for(128));
    assert_eq!(server.capacity_for(128), 1);
    assert!(matches!(
        server.cancel(99),
        Err(ServeError::UnknownRequest { id: 99 })
    ));
    // 8 usable blocks of 16: 128 tokens fit, not 129 (the context is 128 anyway).
    assert!(server
        .submit(&RequestSpec {
            prompt: vec![1; 100],
            max_new_tokens: 28
        })
        .is_ok());
    assert!(server.busy());
    for options in [
        ServerOptions {
            max_batch: 0,
            kv_blocks: Some(9),
            ..ServerOptions::default()
        },
        ServerOptions {
            max_step_tokens: 4,
            max_batch: 8,
            kv_blocks: Some(9),
            ..ServerOptions::default()
        },
        ServerOptions {
            layout: KvLayout::Contiguous { max_tokens: 129 },
            kv_blocks: Some(9),
            ..ServerOptions::default()
        },
        ServerOptions {
            min_step_rows: 0,
            kv_blocks: Some(9),
            ..ServerOptions::default()
        },
        ServerOptions {
            kv_blocks: Some(1),
            ..ServerOptions::default()
        },
        // Blocks past what one layer's tensor may bind, or past 2^24.
        ServerOptions {
            kv_blocks: Some(usize::MAX),
            ..ServerOptions::default()
        },
        ServerOptions {
            kv_blocks: Some((1 << 24) + 1),
            block_tokens: 1,
            ..ServerOptions::default()
        },
        ServerOptions {
            block_tokens: usize::MAX / 2,
            budget_bytes: Some(64 << 20),
            ..ServerOptions::default()
        },
        ServerOptions::default(),
    ] {
        let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
        let what = format!("{options:?}");
        match Server::new(&context, model, options) {
            Err(ServeError::Options(_)) => {}
            other => panic!("{what}: {:?}", other.map(|_| "a server")),
        }
    }
}

#[test]
fn an_f16_model_serves_the_twins_greedy_tokens_within_f16_rounding() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    if !context.supports(DType::F16) {
        eprintln!("f16 serving NOT TESTED: the device has no SHADER_F16; checking the refusal");
        assert!(Gpt2::upload(&context, &weights, DType::F16).is_err());
        return;
    }
    let model = Gpt2::upload(&context, &weights, DType::F16).unwrap();
    let options = ServerOptions {
        max_batch: 4,
        kv_blocks: Some(40),
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, model, options).unwrap();
    let requests = stream(6, 12);
    for request in &requests {
        server.submit(request).unwrap();
    }
    let done = server.run().unwrap();
    assert_eq!(done.len(), requests.len());
    // Teacher forcing: the f64 twin reads the prompt and the server's own tokens, and each
    // token the server chose must be the twin's greedy choice after the same tokens, or a
    // near-tie: its logit within NEAR_TIE of the best (f16 weights, activations and KV cache
    // round each logit by a few hundredths at most on this model).
    const NEAR_TIE: f32 = 0.05;
    let vocab = weights.config.vocab_size;
    let (mut tokens, mut equal) = (0, 0);
    for completion in &done {
        let request = &requests[completion.id as usize];
        assert_eq!(completion.output.len(), request.max_new_tokens);
        let mut sequence = request.prompt.clone();
        sequence.extend_from_slice(&completion.output[..completion.output.len() - 1]);
        let logits = weights.reference_logits(&sequence).unwrap();
        for (i, &token) in completion.output.iter().enumerate() {
            let row = &logits[(request.prompt.len() - 1 + i) * vocab..][..vocab];
            let best = row.iter().copied().fold(f32::MIN, f32::max);
            let chosen = row[token as usize];
            assert!(
                best - chosen <= NEAR_TIE,
                "request {} token {i}: {token} has logit {chosen}, the twin's best {best}",
                completion.id
            );
            tokens += 1;
            equal += usize::from(chosen == best);
        }
    }
    eprintln!(
        "f16 serving: {equal} of {tokens} tokens the twin's greedy choice, the rest near-ties"
    );
    assert!(tokens >= 30);
}

#[test]
fn requests_stream_their_tokens_and_can_be_cancelled() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let mut server = small_server(&context, &weights);
    let request = |len: usize| RequestSpec {
        prompt: (0..len as u32).collect(),
        max_new_tokens: 10,
    };
    let (a, b, c) = (
        server.submit(&request(5)).unwrap(),
        server.submit(&request(7)).unwrap(),
        server.submit(&request(9)).unwrap(),
    );
    server.step().unwrap(); // a and b admitted and prefilled: one token each
    assert_eq!(server.tokens(a).map(<[u32]>::len), Some(1));
    assert_eq!(
        server.tokens(c).map(<[u32]>::len),
        Some(0),
        "c waits (batch of 2)"
    );
    let held = server.blocks().held_blocks();
    server.cancel(b).unwrap();
    assert!(server.blocks().held_blocks() < held, "b's blocks freed");
    assert!(
        matches!(server.cancel(b), Err(ServeError::UnknownRequest { .. })),
        "b is gone"
    );
    server.cancel(c).unwrap();
    let done = server.run().unwrap();
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), vec![a]);
    assert_eq!(done[0].output.len(), 10);
    assert_eq!(server.tokens(b), None);
    assert_eq!(server.blocks().held_blocks(), 0);

    // A request finished by the step a cancel waits for is dropped all the same.
    let d = server.submit(&request(4)).unwrap();
    while server.tokens(d).map(<[u32]>::len) != Some(9) {
        server.step().unwrap();
    }
    server.step_ahead().unwrap(); // the last token in flight
    server.cancel(d).unwrap();
    assert!(server.take_finished().is_empty(), "d is not listed");
    assert_eq!(server.blocks().held_blocks(), 0);
    assert!(!server.busy());
}

#[test]
fn pipelined_steps_feed_tokens_on_the_gpu_and_match_synchronous_ones() {
    let weights = weights();
    let requests = stream(10, 5);
    let mut outputs = Vec::new();
    for ahead in [false, true] {
        let context = context_with(gpu(), ContextOptions::default());
        let options = ServerOptions {
            max_batch: 4,
            block_tokens: 8,
            max_step_tokens: 32,
            kv_blocks: Some(48),
            ..ServerOptions::default()
        };
        let mut server = server(&context, &weights, options);
        for request in &requests {
            server.submit(request).unwrap();
        }
        let mut done = Vec::new();
        while server.busy() {
            if ahead {
                server.step_ahead().unwrap();
            } else {
                server.step().unwrap();
            }
            done.extend(server.take_finished());
        }
        assert_eq!(server.sync().unwrap(), 0, "nothing left in flight");
        done.sort_by_key(|completion| completion.id);
        let stats = server.stats();
        if ahead {
            assert!(
                stats.fed_rows > 0,
                "decoding rows fed on the GPU: {stats:?}"
            );
        } else {
            assert_eq!(stats.fed_rows, 0, "{stats:?}");
        }
        for completion in &done {
            let request = &requests[completion.id as usize];
            assert_eq!(completion.output.len(), request.max_new_tokens);
            assert_greedy(&weights, "pipelined", &request.prompt, &completion.output);
        }
        assert_eq!(server.blocks().held_blocks(), 0);
        outputs.push(done.into_iter().map(|c| c.output).collect::<Vec<_>>());
    }
    assert_eq!(outputs[0], outputs[1], "the same tokens, pipelined or not");

    // A step left in flight shows its tokens after the next call, or after `sync`.
    let context = context_with(gpu(), ContextOptions::default());
    let mut server = small_server(&context, &weights);
    let id = server
        .submit(&RequestSpec {
            prompt: vec![3, 1, 4],
            max_new_tokens: 5,
        })
        .unwrap();
    assert_eq!(server.step_ahead().unwrap(), 0, "the prefill is in flight");
    assert_eq!(server.tokens(id).map(<[u32]>::len), Some(0));
    assert_eq!(server.step_ahead().unwrap(), 1, "the prefill's token read");
    assert_eq!(server.sync().unwrap(), 1, "the first decode step's token");
    assert_eq!(server.tokens(id).map(<[u32]>::len), Some(2));
    let done = server.run().unwrap();
    assert_eq!(done[0].output.len(), 5);
    assert_greedy(&weights, "step_ahead", &[3, 1, 4], &done[0].output);
}

#[test]
fn a_failed_step_stops_the_running_requests_and_keeps_the_waiting_ones() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let options = ServerOptions {
        max_batch: 1,
        kv_blocks: Some(20),
        execution: Execution::Eager,
        ..ServerOptions::default()
    };
    let mut server = server(&context, &weights, options);
    let request = |first: u32| RequestSpec {
        prompt: (first..first + 6).collect(),
        max_new_tokens: 4,
    };
    let (a, b) = (
        server.submit(&request(0)).unwrap(),
        server.submit(&request(9)).unwrap(),
    );
    // The pool may reserve no more, and what it holds is all taken: the step's first tensor
    // is refused.
    let pool = context.pool();
    pool.set_budget(Some(pool.stats().reserved_bytes.current));
    let mut held = Vec::new();
    while pool.stats().largest_free_bytes > 0 {
        match pool.allocate(pool.stats().largest_free_bytes) {
            Ok(allocation) => held.push(allocation),
            Err(_) => break,
        }
    }
    let error = server.step().unwrap_err();
    let ServeError::StepFailed { source, stopped } = &error else {
        panic!("a step's failure is StepFailed: {error:?}");
    };
    assert_eq!(stopped, &[a], "{error}");
    assert!(
        matches!(**source, ServeError::Compute(_)),
        "the pool's refusal: {source:?}"
    );
    assert_eq!(server.tokens(a), None, "a is stopped");
    assert_eq!(server.blocks().held_blocks(), 0, "a's blocks freed");
    assert_eq!((server.running(), server.waiting()), (0, 1));
    // With memory back, the waiting request is served as if nothing had happened.
    drop(held);
    pool.set_budget(None);
    let done = server.run().unwrap();
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), vec![b]);
    assert_greedy(
        &weights,
        "after a failed step",
        &request(9).prompt,
        &done[0].output,
    );
    assert!(server.cancel(a).is_err(), "a is gone");
}

/// A server, its model and its cache move to another thread (a serving loop of its own), and
/// its statistics and completions are plain data.
#[test]
fn a_server_moves_to_another_thread() {
    fn send<T: Send>() {}
    fn shared<T: Send + Sync>() {}
    send::<Server>();
    shared::<Gpt2>();
    shared::<KvCache>();
    shared::<wgpu_pool::serve::ServerStats>();
    shared::<wgpu_pool::serve::Completion>();
    shared::<ServeError>();
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let mut server = small_server(&context, &weights);
    let prompt = vec![7, 3, 9];
    server
        .submit(&RequestSpec {
            prompt: prompt.clone(),
            max_new_tokens: 4,
        })
        .unwrap();
    let done = std::thread::spawn(move || server.run().unwrap())
        .join()
        .unwrap();
    assert_greedy(&weights, "another thread", &prompt, &done[0].output);
}

/// Weights whose fields disagree with their configuration are refused at upload, naming what
/// is wrong; a budget larger than one layer's tensors may bind gives a cache within the
/// device's binding limit.
#[test]
fn inconsistent_weights_and_large_budgets() {
    let context = context_with(gpu(), ContextOptions::default());
    let mut short = weights();
    short.blocks.pop();
    assert!(matches!(
        Gpt2::upload(&context, &short, DType::F32),
        Err(ServeError::Weights(WeightsError::Layers {
            expected: 2,
            found: 1
        }))
    ));
    let mut narrow = weights();
    narrow.blocks[0].attn_c_proj_bias.truncate(3);
    let error = Gpt2::upload(&context, &narrow, DType::F32).unwrap_err();
    assert!(
        matches!(&error, ServeError::Weights(WeightsError::Length { tensor, .. })
            if tensor == "h.0.attn.c_proj.bias"),
        "{error}"
    );

    // WebGPU's default limits: bindings of at most 128 MiB, so that the cache stays small.
    let context = context_with(gpu_default_limits(), ContextOptions::default());
    let weights = weights();
    let limit = context.limits().max_storage_buffer_binding_size;
    let budget = 4 * limit + (64 << 20);
    let options = ServerOptions {
        budget_bytes: Some(budget),
        max_batch: 2,
        max_step_tokens: 16,
        ..ServerOptions::default()
    };
    let mut server = server(&context, &weights, options);
    let (k, _) = server.cache().layer(0);
    assert!(k.size_bytes() <= limit, "{} > {limit}", k.size_bytes());
    let most = KvCache::max_blocks(&weights.config, 16, DType::F32, context.limits());
    let blocks = server.cache().num_blocks();
    assert!(
        blocks <= most && 2 * blocks > most,
        "{blocks} blocks of at most {most}"
    );
    assert!(context.pool().stats().reserved_bytes.current <= budget);
    serves_greedily(&mut server, &weights, "large budget", &[5, 6, 7], 3);
}

/// A block of more tokens than the model's context (one block a sequence) serves as well.
#[test]
fn a_block_longer_than_the_context_serves() {
    let weights = weights();
    let context = context_with(gpu(), ContextOptions::default());
    let options = ServerOptions {
        block_tokens: 200,
        kv_blocks: Some(4),
        max_batch: 2,
        ..ServerOptions::default()
    };
    let mut server = server(&context, &weights, options);
    assert_eq!(server.capacity_for(128), 3);
    serves_greedily(&mut server, &weights, "blocks of 200", &[9, 8, 7, 6], 5);
}

/// A model wider and deeper than the tiny one (3 layers of 128).
fn wide_weights() -> Gpt2Weights {
    let config = Gpt2Config {
        n_layer: 3,
        n_embd: 128,
        n_head: 4,
        ..Gpt2Config::tiny()
    };
    Gpt2Weights::random(&config, 13).expect("weights")
}

/// A fresh context with `weights` uploaded.
fn uploaded(weights: &Gpt2Weights) -> (Context, Gpt2) {
    let context = context_with(gpu(), ContextOptions::default());
    let model = Gpt2::upload(&context, weights, DType::F32).unwrap();
    (context, model)
}

/// The options of the sweep: few step sizes, so that it stays quick on a software device.
fn sweep_options(execution: Execution, budget_bytes: Option<u64>) -> ServerOptions {
    ServerOptions {
        max_batch: 4,
        max_step_tokens: 64,
        budget_bytes,
        execution,
        ..ServerOptions::default()
    }
}

/// The smallest budget that serves one sequence of the model's context, by the dry run of the
/// fewest blocks that do (no budget): what the budget counts with that cache.
fn just_enough(weights: &Gpt2Weights, execution: Execution) -> u64 {
    let (context, model) = uploaded(weights);
    let min_blocks = 1 + weights.config.n_ctx.div_ceil(16);
    let options = ServerOptions {
        kv_blocks: Some(min_blocks),
        ..sweep_options(execution, None)
    };
    Server::dry_run(&context, &model, &options)
        .unwrap()
        .total_bytes()
}

/// The invariant "a budget-sized server creates what its dry run says", over ten budgets from
/// just enough to generous, for two models, planned and eager: the server's blocks, activation
/// bytes and capacities are the dry run's; a planned server's pool reserves exactly what the
/// dry run counts (an eager one, that less the activations it keeps room for); the cache takes
/// at least 97% of what the budget leaves after the weights and activations; the two modes give
/// the same blocks but where the planned server's sampled tokens tip the count; and the pool
/// never passes the budget, also serving requests. The dry run leaves the pool's reservation
/// as it was.
#[test]
fn a_budget_sized_server_creates_what_its_dry_run_says() {
    for (name, weights) in [("tiny", weights()), ("wide", wide_weights())] {
        let low =
            just_enough(&weights, Execution::Planned).max(just_enough(&weights, Execution::Eager));
        let high = low + (48 << 20);
        for step in 0..10u64 {
            let budget = low + (high - low) * step * step / 81;
            let mut plans = Vec::new();
            for execution in [Execution::Planned, Execution::Eager] {
                let what = format!("{name}, {execution:?}, budget {budget}");
                let (context, model) = uploaded(&weights);
                let options = sweep_options(execution, Some(budget));
                context.trim().unwrap();
                let before = context.pool().stats().reserved_bytes.current;
                let plan = Server::dry_run(&context, &model, &options).unwrap();
                assert_eq!(
                    context.pool().stats().reserved_bytes.current,
                    before,
                    "{what}"
                );
                assert_eq!(plan.reserved_bytes, before, "{what}");
                assert_eq!(plan.weights_bytes, model.bytes(), "{what}");
                assert_eq!(
                    context.pool().budget(),
                    None,
                    "{what}: the dry run sets no budget"
                );
                let mut server = Server::new(&context, model, options).unwrap();
                assert_eq!(server.cache().num_blocks(), plan.kv_blocks, "{what}");
                assert_eq!(server.memory_plan().kv_blocks, plan.kv_blocks, "{what}");
                assert_eq!(server.cache().bytes(), plan.kv_bytes, "{what}");
                assert_eq!(server.activation_bytes(), plan.activation_bytes, "{what}");
                for tokens in [0, 1, 2, 17, 64, 128, 129] {
                    assert_eq!(
                        server.capacity_for(tokens),
                        plan.sequences_for(tokens),
                        "{what}: {tokens} tokens"
                    );
                }
                assert!(plan.sequences_for(128) >= 1, "{what}");
                let reserved = context.pool().stats().reserved_bytes.current;
                let expected = match execution {
                    Execution::Planned => plan.total_bytes(),
                    Execution::Eager => plan.total_bytes() - plan.activation_reserved_bytes,
                };
                assert_eq!(reserved, expected, "{what}: {plan:?}");
                assert!(plan.total_bytes() <= budget, "{what}");
                // At least 97% of what the budget leaves after the weights and activations (as
                // the pool reserves them), once that is more than a few blocks.
                let share = plan.kv_share_bytes().unwrap();
                if share >= 64 * KvCache::block_bytes(&weights.config, 16, DType::F32) {
                    assert!(
                        plan.kv_bytes as f64 >= 0.97 * share as f64,
                        "{what}: the cache takes {} of {share}",
                        plan.kv_bytes
                    );
                }
                // Serving a few requests keeps the pool within the budget (every budget of the
                // sweep's ends, and one between).
                if [0, 4, 9].contains(&step) {
                    for request in stream(6, step) {
                        server.submit(&request).unwrap();
                    }
                    server.run().unwrap();
                }
                let stats = context.pool().stats();
                assert!(stats.reserved_bytes.peak <= budget, "{what}: {stats:?}");
                assert_eq!(stats.oom_count, 0, "{what}");
                plans.push(plan);
            }
            let (planned, eager) = (&plans[0], &plans[1]);
            assert_eq!(
                planned.activation_bytes, eager.activation_bytes,
                "{name} {budget}"
            );
            assert_eq!(
                planned.reserved_bytes, eager.reserved_bytes,
                "{name} {budget}"
            );
            // The rule: the same share less the sampled tokens' block.
            let room = eager.kv_share_bytes().unwrap() - planned.step_reserved_bytes;
            if eager.kv_reserved_bytes <= room {
                assert_eq!(planned.kv_blocks, eager.kv_blocks, "{name} {budget}");
            } else {
                assert_eq!(planned.kv_blocks + 1, eager.kv_blocks, "{name} {budget}");
            }
        }
    }
}

/// A budget one byte short of what one sequence of the context needs is refused by the dry run
/// and by `Server::new` alike, with the dry run's figures; the pool's budget is put back after
/// the refusal and after a server drops.
#[test]
fn a_refused_budget_says_the_dry_runs_figures_and_leaves_the_pools_budget() {
    let weights = weights();
    let min_blocks = 1 + weights.config.n_ctx.div_ceil(16);
    for execution in [Execution::Planned, Execution::Eager] {
        let (context, model) = uploaded(&weights);
        let smallest = Server::dry_run(
            &context,
            &model,
            &ServerOptions {
                kv_blocks: Some(min_blocks),
                ..sweep_options(execution, None)
            },
        )
        .unwrap();
        let budget = smallest.total_bytes();
        let short = sweep_options(execution, Some(budget - 1));
        let figures = |error: ServeError| match error {
            ServeError::Budget {
                budget_bytes,
                reserved_bytes,
                weights_bytes,
                activation_bytes,
                kv_min_bytes,
            } => (
                budget_bytes,
                reserved_bytes,
                weights_bytes,
                activation_bytes,
                kv_min_bytes,
            ),
            other => panic!("{execution:?}: {other}"),
        };
        let dry = figures(Server::dry_run(&context, &model, &short).unwrap_err());
        assert_eq!(
            dry,
            (
                budget - 1,
                smallest.before_cache_bytes(),
                smallest.weights_bytes,
                smallest.activation_bytes,
                smallest.kv_bytes
            ),
            "{execution:?}"
        );
        let user = Some(1u64 << 30);
        context.pool().set_budget(user);
        let made = figures(Server::new(&context, model, short).unwrap_err());
        assert_eq!(made, dry, "{execution:?}");
        assert_eq!(context.pool().budget(), user, "{execution:?}");
        // Just enough: the fewest blocks, the pool's budget the server's while it lives.
        let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
        let server = Server::new(&context, model, sweep_options(execution, Some(budget))).unwrap();
        assert_eq!(server.cache().num_blocks(), min_blocks, "{execution:?}");
        assert_eq!(context.pool().budget(), Some(budget), "{execution:?}");
        drop(server);
        assert_eq!(context.pool().budget(), user, "{execution:?}");
    }
}
