//! Unit tests of the scheduler (no GPU): a fake model runs each step's rows against a fake KV
//! cache that holds tokens, so that a wrong table, a block shared too early or overwritten, a
//! fed row taking the wrong token or a lost recompute changes the tokens sampled.

use std::collections::HashMap;

use proptest::prelude::*;
use web_time::Instant;

use super::*;
use crate::paging::{
    AdmitRule, BlockManager, BlockState, KvLayout, PagingError, RequestSpec, StepRows, StreamSpec,
};
use crate::rng::SplitMix64;

const VOCAB: u32 = 1000;

/// The fake model's next token after `tokens`.
fn next_token(tokens: &[u32]) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &token in tokens {
        hash = (hash ^ u64::from(token)).wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(VOCAB)) as u32
}

/// What greedy decoding of `request` gives.
fn reference(request: &RequestSpec) -> Vec<u32> {
    let mut tokens = request.prompt.clone();
    for _ in 0..request.max_new_tokens {
        tokens.push(next_token(&tokens));
    }
    tokens.split_off(request.prompt.len())
}

/// A fake device: a KV cache of tokens by (block, slot), and the last step's samples.
struct FakeModel {
    block_tokens: usize,
    cache: HashMap<(u32, usize), u32>,
    samples: Vec<u32>,
    rows_run: usize,
}

impl FakeModel {
    fn new(block_tokens: usize) -> Self {
        Self {
            block_tokens,
            cache: HashMap::new(),
            samples: Vec::new(),
            rows_run: 0,
        }
    }

    /// Runs a step's rows as the GPU would: writes each row's token into its slot, then reads
    /// every position up to the row's through the table, and samples the sampled rows.
    fn run(&mut self, rows: &StepRows) -> Vec<u32> {
        let max_blocks = rows.max_blocks();
        for row in 0..rows.rows() {
            let fed = rows.fed()[row] != 0.0;
            let token = if fed {
                self.samples[rows.picks()[row] as usize]
            } else {
                rows.ids()[row] as u32
            };
            let position = rows.positions()[row] as usize;
            let block = rows.table()[row * max_blocks + position / self.block_tokens] as u32;
            assert_ne!(block, 0, "a real row writes block 0");
            self.cache
                .insert((block, position % self.block_tokens), token);
        }
        let mut out = Vec::new();
        for &sample in rows.samples() {
            let row = sample as usize;
            let position = rows.positions()[row] as usize;
            let context: Vec<u32> = (0..=position)
                .map(|q| {
                    let block = rows.table()[row * max_blocks + q / self.block_tokens] as u32;
                    self.cache[&(block, q % self.block_tokens)]
                })
                .collect();
            out.push(next_token(&context));
        }
        self.rows_run += rows.rows();
        self.samples = out.clone();
        out
    }
}

fn scheduler(
    block_tokens: usize,
    num_blocks: usize,
    prefix: bool,
    admission: Admission,
    max_batch: usize,
) -> Scheduler {
    let blocks = BlockManager::new(KvLayout::Paged, block_tokens, num_blocks)
        .unwrap()
        .with_prefix_caching(prefix)
        .unwrap();
    let options = SchedulerOptions {
        max_batch,
        max_step_tokens: 64.max(max_batch),
        min_step_rows: 1,
        max_blocks: 256usize.div_ceil(block_tokens),
        admission,
    };
    Scheduler::new(options, blocks).unwrap()
}

/// Serves `requests` to the end on `model`, pipelined (a step scheduled before the one before
/// is finished) or not; checks every output against the reference; returns the completions by
/// id.
fn serve(
    scheduler: &mut Scheduler,
    model: &mut FakeModel,
    requests: &[RequestSpec],
    pipelined: bool,
) -> Vec<Completion> {
    for request in requests {
        scheduler.submit(request, Instant::now()).unwrap();
    }
    let done = drain(scheduler, model, pipelined);
    assert_eq!(done.len(), requests.len());
    for (completion, request) in done.iter().zip(requests) {
        assert_eq!(completion.prompt, request.prompt);
        assert_eq!(completion.output.len(), request.max_new_tokens);
    }
    done
}

/// Steps until nothing is left; checks every finished request's output against the reference
/// and that every block is given back; returns the completions by id.
fn drain(scheduler: &mut Scheduler, model: &mut FakeModel, pipelined: bool) -> Vec<Completion> {
    let mut in_flight: Vec<Vec<u32>> = Vec::new();
    let mut guard = 0;
    while scheduler.busy() {
        guard += 1;
        assert!(guard < 100_000, "no progress");
        let step = scheduler.schedule().unwrap();
        if let Some(step) = &step {
            in_flight.push(model.run(&step.rows));
        }
        if (!pipelined || step.is_none() || in_flight.len() > 1) && !in_flight.is_empty() {
            let tokens = in_flight.remove(0);
            scheduler.finish(&tokens, Instant::now()).unwrap();
        }
        check_blocks(scheduler.blocks());
    }
    let mut done = scheduler.take_finished();
    done.sort_by_key(|c| c.id);
    for completion in &done {
        let asked = request(completion.prompt.clone(), completion.output.len());
        assert_eq!(
            completion.output,
            reference(&asked),
            "request {}",
            completion.id
        );
    }
    assert_eq!(
        scheduler.blocks().held_blocks(),
        0,
        "every block given back"
    );
    assert_eq!(
        scheduler.blocks().available_blocks(),
        scheduler.blocks().num_blocks() - 1
    );
    done
}

/// The block manager's counts agree with its sequences' blocks.
fn check_blocks(blocks: &BlockManager) {
    let mut refs: HashMap<u32, usize> = HashMap::new();
    for (_, held) in blocks.sequences() {
        for &block in held {
            assert_ne!(block, 0);
            *refs.entry(block).or_default() += 1;
        }
    }
    assert_eq!(refs.len(), blocks.held_blocks());
    for (&block, &count) in &refs {
        assert_eq!(blocks.block_state(block), BlockState::Held { refs: count });
    }
    assert!(blocks.available_blocks() + blocks.held_blocks() < blocks.num_blocks());
}

fn stream(requests: usize, seed: u64) -> Vec<RequestSpec> {
    StreamSpec {
        requests,
        prompt_tokens: (1, 40),
        output_tokens: (1, 20),
        vocab_size: VOCAB as usize,
        max_tokens: 64,
        seed,
    }
    .generate()
    .unwrap()
}

/// `requests` each starting with one of `prefixes` prompts of `length` tokens.
fn shared_prefix_stream(requests: usize, prefixes: usize, length: usize) -> Vec<RequestSpec> {
    let mut rng = SplitMix64::new(11);
    let heads: Vec<Vec<u32>> = (0..prefixes)
        .map(|_| {
            (0..length)
                .map(|_| rng.below(u64::from(VOCAB)) as u32)
                .collect()
        })
        .collect();
    (0..requests)
        .map(|i| {
            let mut prompt = heads[i % prefixes].clone();
            let own = 1 + rng.below(10) as usize;
            prompt.extend((0..own).map(|_| rng.below(u64::from(VOCAB)) as u32));
            RequestSpec {
                prompt,
                max_new_tokens: 1 + rng.below(12) as usize,
            }
        })
        .collect()
}

fn request(prompt: Vec<u32>, max_new_tokens: usize) -> RequestSpec {
    RequestSpec {
        prompt,
        max_new_tokens,
    }
}

#[test]
fn reserved_admission_serves_the_reference_tokens_pipelined_or_not() {
    for pipelined in [false, true] {
        let mut s = scheduler(4, 200, false, Admission::Reserve, 8);
        serve(&mut s, &mut FakeModel::new(4), &stream(60, 3), pipelined);
        assert_eq!(s.stats().preemptions, 0);
        if pipelined {
            assert!(
                s.stats().fed_rows > 0,
                "decoding rows took their token on the GPU"
            );
        } else {
            assert_eq!(s.stats().fed_rows, 0);
        }
    }
}

#[test]
fn ids_count_up_in_submission_order_and_bad_requests_are_refused() {
    let mut s = scheduler(4, 20, false, Admission::Reserve, 4);
    let now = Instant::now();
    assert_eq!(s.submit(&request(vec![1], 1), now), Ok(0));
    assert_eq!(s.submit(&request(vec![1, 2], 3), now), Ok(1));
    assert_eq!(
        s.submit(&request(vec![], 3), now),
        Err(SchedulerError::EmptyPrompt)
    );
    assert_eq!(
        s.submit(&request(vec![1], 0), now),
        Err(SchedulerError::NoOutputs)
    );
    // 19 usable blocks of 4 tokens: 76 tokens at most.
    assert!(matches!(
        s.submit(&request(vec![1; 70], 8), now),
        Err(SchedulerError::Paging(PagingError::NeverFits { .. }))
    ));
    assert_eq!(s.waiting(), 2, "refused requests are not queued");
    assert_eq!(s.submit(&request(vec![1], 1), now), Ok(2));
}

#[test]
fn a_request_wider_than_the_block_table_is_refused() {
    let blocks = BlockManager::new(KvLayout::Paged, 4, 100).unwrap();
    let options = SchedulerOptions {
        max_blocks: 3,
        ..SchedulerOptions::default()
    };
    let mut s = Scheduler::new(options, blocks).unwrap();
    assert!(matches!(
        s.submit(&request(vec![1; 12], 2), Instant::now()),
        Err(SchedulerError::Paging(PagingError::StepFull { .. }))
    ));
    assert!(s.submit(&request(vec![1; 12], 1), Instant::now()).is_ok());
}

#[test]
fn options_that_schedule_nothing_are_refused() {
    let blocks = || BlockManager::new(KvLayout::Paged, 4, 10).unwrap();
    let bad = [
        SchedulerOptions {
            max_batch: 0,
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            max_step_tokens: 4,
            max_batch: 8,
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            min_step_rows: 0,
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            min_step_rows: 1024,
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            max_blocks: 0,
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            admission: Admission::Optimistic { watermark: 1.0 },
            ..SchedulerOptions::default()
        },
        SchedulerOptions {
            admission: Admission::Optimistic {
                watermark: f64::NAN,
            },
            ..SchedulerOptions::default()
        },
    ];
    for options in bad {
        assert!(
            matches!(
                Scheduler::new(options.clone(), blocks()),
                Err(SchedulerError::Options(_))
            ),
            "{options:?}"
        );
    }
    let contiguous = BlockManager::new(KvLayout::Contiguous { max_tokens: 8 }, 4, 10).unwrap();
    let optimistic = SchedulerOptions {
        admission: Admission::Optimistic { watermark: 0.0 },
        ..SchedulerOptions::default()
    };
    assert!(Scheduler::new(optimistic, contiguous.clone()).is_err());
    assert!(matches!(
        contiguous.with_prefix_caching(true),
        Err(PagingError::Config(_))
    ));
}

#[test]
fn admission_is_first_come_first_served_and_waits_for_reserved_blocks() {
    // 9 usable blocks of 4 tokens.
    let mut s = scheduler(4, 10, false, Admission::Reserve, 8);
    let now = Instant::now();
    s.submit(&request(vec![1; 20], 9), now).unwrap(); // reaches 28 tokens: 7 blocks
    s.submit(&request(vec![2; 8], 5), now).unwrap(); // 12 tokens: 3 blocks, does not fit
    s.submit(&request(vec![3; 2], 2), now).unwrap(); // 3 tokens: 1 block, would fit
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.admitted, vec![0], "the head blocks those behind it");
    assert_eq!(s.waiting(), 2);
    assert_eq!(s.stats().waits, 1);
    assert_eq!(s.blocks().available_blocks(), 2);
}

#[test]
fn the_batch_limit_caps_the_sequences_running() {
    let mut s = scheduler(4, 200, false, Admission::Reserve, 3);
    for _ in 0..5 {
        s.submit(&request(vec![1, 2], 4), Instant::now()).unwrap();
    }
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.admitted.len(), 3);
    assert_eq!(step.sequences, 3);
    assert_eq!(s.running(), 3);
    assert_eq!(step.samples, vec![0, 1, 2]);
}

#[test]
fn long_prompts_are_chunked_and_decoding_rows_come_first() {
    let blocks = BlockManager::new(KvLayout::Paged, 4, 100).unwrap();
    let options = SchedulerOptions {
        max_batch: 4,
        max_step_tokens: 8,
        min_step_rows: 1,
        max_blocks: 64,
        admission: Admission::Reserve,
    };
    let mut s = Scheduler::new(options, blocks).unwrap();
    let mut model = FakeModel::new(4);
    s.submit(&request(vec![1, 2], 5), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    s.submit(&request((0..20).collect(), 2), Instant::now())
        .unwrap();
    // Request 0 decodes (one row); request 1's 20 prompt tokens fill the other 7 rows.
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.rows.rows(), 8);
    assert_eq!(
        step.rows.ids()[0],
        s.tokens(0).unwrap()[0] as f32,
        "the decode row first"
    );
    assert_eq!(
        step.samples,
        vec![0],
        "a chunk that does not end its prompt samples nothing"
    );
    assert!(!step.decode_only);
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.rows.rows(), 8);
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    // 1 decode row, the last 6 prompt tokens, sampled.
    assert_eq!(step.rows.rows(), 7);
    assert_eq!(step.rows.capacity(), 8, "padded to a power of two");
    assert_eq!(step.samples, vec![0, 1]);
}

#[test]
fn steps_are_padded_to_min_step_rows() {
    let blocks = BlockManager::new(KvLayout::Paged, 4, 100).unwrap();
    let options = SchedulerOptions {
        max_batch: 4,
        max_step_tokens: 64,
        min_step_rows: 5,
        max_blocks: 64,
        admission: Admission::Reserve,
    };
    let mut s = Scheduler::new(options, blocks).unwrap();
    s.submit(&request(vec![1], 3), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    assert_eq!((step.rows.rows(), step.rows.capacity()), (1, 8));
    assert_eq!(s.step_row_counts(), vec![8, 16, 32, 64]);
    assert!(s
        .padding_steps()
        .unwrap()
        .iter()
        .all(|rows| rows.rows() == 0));
}

#[test]
fn a_pipelined_decode_row_takes_the_token_in_flight() {
    let mut s = scheduler(4, 100, false, Admission::Reserve, 4);
    s.submit(&request(vec![7, 8, 9], 4), Instant::now())
        .unwrap();
    s.submit(&request(vec![5], 4), Instant::now()).unwrap();
    let first = s.schedule().unwrap().unwrap();
    assert_eq!(first.samples, vec![0, 1]);
    let second = s.schedule().unwrap().unwrap();
    assert_eq!(second.rows.fed_rows(), 2);
    assert_eq!(&second.rows.picks()[..2], &[0.0, 1.0]);
    assert_eq!(&second.rows.positions()[..2], &[3.0, 1.0]);
    assert!(second.decode_only);
    assert!(matches!(s.schedule(), Err(SchedulerError::StepInFlight(_))));
    s.finish(&[11, 12], Instant::now()).unwrap();
    assert_eq!(s.tokens(0), Some(&[11][..]));
}

#[test]
fn finish_refuses_missing_samples_and_changes_nothing() {
    let mut s = scheduler(4, 100, false, Admission::Reserve, 4);
    s.submit(&request(vec![1], 2), Instant::now()).unwrap();
    s.submit(&request(vec![2], 2), Instant::now()).unwrap();
    assert_eq!(
        s.finish(&[1], Instant::now()),
        Err(SchedulerError::NoStepInFlight)
    );
    s.schedule().unwrap().unwrap();
    assert_eq!(
        s.finish(&[1], Instant::now()),
        Err(SchedulerError::MissingSamples {
            samples: 2,
            tokens: 1
        })
    );
    assert_eq!(s.steps_in_flight(), 1);
    assert_eq!(s.tokens(0), Some(&[][..]));
    assert_eq!(s.finish(&[4, 5], Instant::now()), Ok(vec![]));
    assert_eq!(s.tokens(1), Some(&[5][..]));
}

#[test]
fn cancel_frees_what_a_request_holds_and_refuses_while_a_step_is_in_flight() {
    let mut s = scheduler(4, 100, false, Admission::Reserve, 1);
    let a = s.submit(&request(vec![1; 9], 3), Instant::now()).unwrap();
    let b = s.submit(&request(vec![2; 9], 3), Instant::now()).unwrap();
    s.schedule().unwrap().unwrap();
    assert!(matches!(s.cancel(a), Err(SchedulerError::StepInFlight(_))));
    s.finish(&[1], Instant::now()).unwrap();
    assert!(s.blocks().held_blocks() > 0);
    s.cancel(a).unwrap();
    assert_eq!(s.blocks().held_blocks(), 0);
    assert_eq!(s.blocks().available_blocks(), 99);
    s.cancel(b).unwrap();
    assert!(!s.busy());
    assert_eq!(s.cancel(b), Err(SchedulerError::UnknownRequest { id: b }));
    assert_eq!(s.cancel(99), Err(SchedulerError::UnknownRequest { id: 99 }));
}

#[test]
fn a_failed_step_stops_the_running_and_keeps_the_waiting() {
    let mut s = scheduler(4, 100, false, Admission::Reserve, 2);
    let mut model = FakeModel::new(4);
    for prompt in [1, 2, 3] {
        s.submit(&request(vec![prompt; 5], 3), Instant::now())
            .unwrap();
    }
    let step = s.schedule().unwrap().unwrap();
    model.run(&step.rows);
    assert_eq!(s.abort_running(), vec![0, 1]);
    assert_eq!(s.blocks().held_blocks(), 0);
    assert_eq!(s.blocks().available_blocks(), 99);
    assert_eq!((s.running(), s.waiting(), s.steps_in_flight()), (0, 1, 0));
    let done = drain(&mut s, &mut model, false);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].id, 2);
}

#[test]
fn reservation_never_preempts_where_optimism_does() {
    // 31 usable blocks of 4 tokens, requests of 40–60 tokens: 3 fit reserved.
    let requests: Vec<RequestSpec> = (0..12)
        .map(|i| request(vec![i as u32 + 1; 30], 10 + 2 * (i % 5)))
        .collect();
    let mut reserved = scheduler(4, 32, false, Admission::Reserve, 8);
    serve(&mut reserved, &mut FakeModel::new(4), &requests, true);
    let mut optimistic = scheduler(4, 32, false, Admission::Optimistic { watermark: 0.0 }, 8);
    let done = serve(&mut optimistic, &mut FakeModel::new(4), &requests, true);
    assert_eq!(reserved.stats().preemptions, 0);
    assert!(
        optimistic.stats().preemptions > 0,
        "{:?}",
        optimistic.stats()
    );
    assert!(optimistic.stats().recomputed_tokens > 0);
    assert!(
        optimistic.stats().in_flight_max > reserved.stats().in_flight_max,
        "optimistic {} reserved {}",
        optimistic.stats().in_flight_max,
        reserved.stats().in_flight_max
    );
    let preempted: u32 = done.iter().map(|c| c.preemptions).sum();
    assert_eq!(u64::from(preempted), optimistic.stats().preemptions);
}

#[test]
fn preemption_takes_the_newest_and_puts_it_first_in_line() {
    // 6 usable blocks of 2 tokens.
    let mut s = scheduler(2, 7, false, Admission::Optimistic { watermark: 0.0 }, 4);
    let mut model = FakeModel::new(2);
    for prompt in [1, 2, 3] {
        s.submit(&request(vec![prompt; 4], 6), Instant::now())
            .unwrap();
    }
    s.submit(&request(vec![9], 1), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(
        step.admitted,
        vec![0, 1, 2],
        "2 blocks each, none left for the fourth"
    );
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    // Each sequence now needs a third block for its fifth token: sequences 0 and 1 get the
    // blocks sequence 2 frees.
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.preempted, vec![2]);
    assert!(
        step.admitted.is_empty(),
        "no admission in a step that preempts"
    );
    assert_eq!(step.samples, vec![0, 1]);
    assert_eq!(s.waiting(), 2);
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    let done = drain(&mut s, &mut model, false);
    assert_eq!(done.len(), 4);
    let all = [
        request(vec![1; 4], 6),
        request(vec![2; 4], 6),
        request(vec![3; 4], 6),
        request(vec![9], 1),
    ];
    for (completion, request) in done.iter().zip(&all) {
        assert_eq!(completion.output, reference(request));
    }
    assert_eq!(done[2].preemptions, 1);
}

#[test]
fn a_lone_sequence_is_admitted_whatever_the_watermark() {
    let mut s = scheduler(4, 11, false, Admission::Optimistic { watermark: 0.5 }, 4);
    // 40 tokens take all 10 usable blocks: above the watermark only when nothing else runs.
    serve(
        &mut s,
        &mut FakeModel::new(4),
        &[request(vec![5; 30], 11), request(vec![6; 3], 2)],
        true,
    );
    assert_eq!(s.stats().preemptions, 0);
}

#[test]
fn the_watermark_keeps_free_blocks_at_admission() {
    let mut s = scheduler(4, 21, false, Admission::Optimistic { watermark: 0.25 }, 8);
    for _ in 0..4 {
        s.submit(&request(vec![1; 16], 1), Instant::now()).unwrap(); // 4 blocks each
    }
    let step = s.schedule().unwrap().unwrap();
    // 20 usable, a watermark of 5: 4 + 4 + 4 = 12 ≤ 15, a fourth would leave 4 < 5.
    assert_eq!(step.admitted, vec![0, 1, 2]);
}

#[test]
fn prefix_caching_shares_whole_blocks_and_keeps_the_rest_private() {
    let mut s = scheduler(4, 100, true, Admission::Reserve, 4);
    let mut model = FakeModel::new(4);
    let head: Vec<u32> = (100..110).collect(); // 2 whole blocks and 2 tokens
    let mut a = head.clone();
    a.extend([1, 2, 3]);
    let mut b = head.clone();
    b.extend([4, 5, 6]);
    s.submit(&request(a.clone(), 3), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    s.submit(&request(b.clone(), 3), Instant::now()).unwrap();
    let step = s.schedule().unwrap().unwrap();
    assert_eq!(step.admitted, vec![1]);
    let (blocks_a, blocks_b) = (s.blocks().blocks(0).unwrap(), s.blocks().blocks(1).unwrap());
    assert_eq!(
        blocks_a[..2],
        blocks_b[..2],
        "the two whole blocks of the prefix are shared"
    );
    assert_ne!(
        blocks_a[2], blocks_b[2],
        "the first block that differs is private"
    );
    assert_eq!(
        s.blocks().block_state(blocks_a[0]),
        BlockState::Held { refs: 2 }
    );
    assert_eq!(
        s.blocks().block_state(blocks_a[2]),
        BlockState::Held { refs: 1 }
    );
    assert_eq!(s.stats().cached_tokens, 8);
    // b's rows start after the shared blocks: 1 decode row of a, 5 prompt rows of b.
    assert_eq!(step.rows.rows(), 6);
    assert_eq!(step.rows.positions()[1], 8.0);
    s.finish(&model.run(&step.rows), Instant::now()).unwrap();
    let done = drain(&mut s, &mut model, false);
    assert_eq!(done[0].output, reference(&request(a, 3)));
    assert_eq!(done[1].output, reference(&request(b, 3)));
    assert_eq!(done[1].cached_tokens, 8);
}

#[test]
fn the_last_prompt_token_is_always_run() {
    let mut s = scheduler(4, 100, true, Admission::Reserve, 4);
    let mut model = FakeModel::new(4);
    let prompt: Vec<u32> = (0..8).collect(); // exactly 2 blocks
    serve(&mut s, &mut model, &[request(prompt.clone(), 2)], false);
    let id = s
        .submit(&request(prompt.clone(), 2), Instant::now())
        .unwrap();
    let step = s.schedule().unwrap().unwrap();
    // Block 0 hits; block 1 holds the last prompt token, which must run to sample.
    assert_eq!(s.stats().cached_tokens, 4);
    assert_eq!(step.rows.rows(), 4);
    assert_eq!(step.samples, vec![id]);
}

#[test]
fn finished_sequences_leave_their_blocks_cached_until_memory_is_needed() {
    let mut s = scheduler(4, 9, true, Admission::Reserve, 4);
    let mut model = FakeModel::new(4);
    let a = request((0..9).collect(), 3); // 11 tokens in the cache: blocks of 4, 4, 3
    serve(&mut s, &mut model, std::slice::from_ref(&a), false);
    let stats = s.blocks().prefix_stats();
    assert_eq!(stats.cached_blocks, 2, "its two whole blocks");
    assert_eq!(s.blocks().held_blocks(), 0);
    assert_eq!(
        s.blocks().available_blocks(),
        8,
        "cached blocks count as available"
    );
    // The same prompt again finds them.
    serve(&mut s, &mut model, std::slice::from_ref(&a), false);
    assert_eq!(s.stats().cached_tokens, 8);
    // A stream of other prompts needs the memory: the cached blocks are evicted.
    let others: Vec<RequestSpec> = (0..3).map(|i| request(vec![500 + i; 20], 8)).collect();
    serve(&mut s, &mut model, &others, false);
    assert!(s.blocks().prefix_stats().evictions > 0);
}

#[test]
fn the_least_recently_freed_cached_block_goes_first_and_a_tail_before_its_head() {
    let mut blocks = BlockManager::new(KvLayout::Paged, 2, 6)
        .unwrap()
        .with_prefix_caching(true)
        .unwrap();
    let a = [1, 2, 3, 4];
    let b = [5, 6, 7, 8];
    for (id, tokens) in [(1, &a), (2, &b)] {
        blocks
            .admit_tokens(id, tokens, 4, AdmitRule::Reserve)
            .unwrap()
            .unwrap();
        blocks.grow(id, 4).unwrap();
        blocks.commit(id, tokens).unwrap();
    }
    let (a_blocks, b_blocks) = (
        blocks.blocks(1).unwrap().to_vec(),
        blocks.blocks(2).unwrap().to_vec(),
    );
    blocks.release(1).unwrap();
    blocks.release(2).unwrap();
    assert_eq!(blocks.prefix_stats().cached_blocks, 4);
    // The free block first, then a's tail; a's head and b's blocks stay cached.
    blocks
        .admit_tokens(3, &[9; 4], 4, AdmitRule::Reserve)
        .unwrap()
        .unwrap();
    blocks.grow(3, 4).unwrap();
    assert_eq!(blocks.blocks(3).unwrap(), &[5, a_blocks[1]]);
    assert_eq!(blocks.block_state(a_blocks[0]), BlockState::Cached);
    assert_eq!(blocks.block_state(b_blocks[1]), BlockState::Cached);
    assert_eq!(blocks.prefix_stats().evictions, 1);
    // b's prefix still hits; a's whole prefix does not (its second block is gone).
    assert_eq!(
        blocks.admit_tokens(4, &[5, 6, 7, 8, 1], 5, AdmitRule::Reserve),
        Ok(Some(4))
    );
    assert_eq!(
        blocks.admit_tokens(5, &[1, 2, 3, 4, 1], 5, AdmitRule::Reserve),
        Ok(None)
    );
}

#[test]
fn shared_prefixes_serve_the_reference_tokens_with_fewer_rows() {
    let requests = shared_prefix_stream(40, 3, 24);
    let mut off = scheduler(4, 120, false, Admission::Reserve, 8);
    let mut model = FakeModel::new(4);
    serve(&mut off, &mut model, &requests, true);
    let rows_off = model.rows_run;
    let mut on = scheduler(4, 120, true, Admission::Reserve, 8);
    let mut model = FakeModel::new(4);
    serve(&mut on, &mut model, &requests, true);
    let rows_on = model.rows_run;
    assert!(on.stats().cached_tokens > 0);
    assert!(rows_on < rows_off, "on {rows_on} off {rows_off}");
}

#[test]
fn preemption_prefix_caching_and_pipelining_together_keep_the_tokens() {
    for seed in 0..6 {
        for pipelined in [false, true] {
            let mut requests = stream(30, seed);
            requests.extend(shared_prefix_stream(20, 2, 13));
            let mut s = scheduler(4, 40, true, Admission::Optimistic { watermark: 0.05 }, 6);
            serve(&mut s, &mut FakeModel::new(4), &requests, pipelined);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_cache_and_batch_serves_the_reference_tokens(
        block_tokens in 1usize..6,
        extra_blocks in 0usize..40,
        max_batch in 1usize..6,
        prefix in any::<bool>(),
        optimistic in any::<bool>(),
        pipelined in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let requests = stream(12, seed);
        // Room for the longest request at least.
        let num_blocks = 1 + 64usize.div_ceil(block_tokens) + extra_blocks;
        let admission = if optimistic {
            Admission::Optimistic { watermark: 0.01 }
        } else {
            Admission::Reserve
        };
        let mut s = scheduler(block_tokens, num_blocks, prefix, admission, max_batch);
        serve(&mut s, &mut FakeModel::new(block_tokens), &requests, pipelined);
        if !optimistic {
            prop_assert_eq!(s.stats().preemptions, 0);
        }
    }
}
