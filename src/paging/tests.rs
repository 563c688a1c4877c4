//! Unit tests of the paging layer (no GPU).

use proptest::prelude::*;

use super::*;

#[test]
fn paged_takes_blocks_as_tokens_arrive_and_keeps_block_zero() {
    let mut cache = BlockManager::new(KvLayout::Paged, 4, 6).unwrap();
    assert!(cache.admit(7, 10).unwrap()); // promises 3 of the 5 blocks
    assert_eq!(cache.available_blocks(), 2);
    assert_eq!(cache.held_blocks(), 0);
    assert_eq!(cache.grow(7, 5).unwrap(), 0);
    assert_eq!(cache.blocks(7).unwrap(), &[1, 2]);
    assert_eq!(cache.grow(7, 1).unwrap(), 5);
    assert_eq!(cache.blocks(7).unwrap(), &[1, 2]);
    // A second sequence of 3 blocks does not fit the 2 left unpromised; one of 2 does.
    assert!(!cache.admit(8, 9).unwrap());
    assert!(cache.admit(9, 8).unwrap());
    assert_eq!(cache.available_blocks(), 0);
    assert_eq!(
        cache.grow(7, 5),
        Err(PagingError::Sequence {
            id: 7,
            reason: "grows past the tokens it was admitted for"
        })
    );
    cache.release(7).unwrap();
    assert_eq!(cache.available_blocks(), 3);
    assert_eq!(cache.held_blocks(), 0);
    assert_eq!(
        cache.peak(),
        KvPeak {
            held_blocks: 2,
            used_tokens: 6
        }
    );
    assert!(!cache.blocks(9).unwrap().contains(&0));
}

#[test]
fn contiguous_reserves_a_run_of_the_maximum_and_fragments() {
    let mut cache = BlockManager::new(KvLayout::Contiguous { max_tokens: 8 }, 4, 8).unwrap();
    // 7 usable blocks: three runs of 2.
    for id in 0..3 {
        assert!(cache.admit(id, 3).unwrap());
    }
    assert_eq!(cache.blocks(1).unwrap(), &[3, 4]);
    assert!(!cache.admit(3, 3).unwrap());
    cache.release(0).unwrap();
    cache.release(2).unwrap();
    // Blocks 1, 2 and 5, 6, 7 free.
    assert!(cache.admit(4, 8).unwrap());
    assert_eq!(cache.blocks(4).unwrap(), &[1, 2]);
    assert_eq!(cache.held_blocks(), 4);
    assert_eq!(cache.capacity_for(8), 3);
    assert_eq!(cache.capacity_for(9), 0);
    assert_eq!(
        cache.admit(5, 9),
        Err(PagingError::PassesMaxTokens {
            tokens: 9,
            max_tokens: 8
        })
    );
    // A layout whose one sequence takes more blocks than the cache has.
    let mut small = BlockManager::new(KvLayout::Contiguous { max_tokens: 64 }, 4, 11).unwrap();
    assert_eq!(
        small.admit(1, 17),
        Err(PagingError::NeverFits {
            tokens: 17,
            blocks: 16,
            capacity_blocks: 10
        })
    );
    assert_eq!(small.never_admits(17), small.admit(1, 17).err());
    let paged = BlockManager::new(KvLayout::Paged, 4, 11).unwrap();
    assert_eq!(paged.never_admits(40), None);
    assert!(matches!(
        paged.never_admits(41),
        Some(PagingError::NeverFits { blocks: 11, .. })
    ));
}

#[test]
fn capacity_counts_what_admission_takes() {
    let paged = BlockManager::new(KvLayout::Paged, 16, 101).unwrap();
    assert_eq!(paged.capacity_for(160), 10);
    assert_eq!(paged.capacity_for(161), 9);
    assert_eq!(paged.capacity_for(0), 0);
    assert_eq!(paged.capacity_for(1601), 0);
    let contiguous = BlockManager::new(KvLayout::Contiguous { max_tokens: 1024 }, 16, 101).unwrap();
    assert_eq!(contiguous.capacity_for(100), 1);
}

#[test]
fn bad_options_and_sequences_are_typed_errors() {
    assert!(BlockManager::new(KvLayout::Paged, 0, 4).is_err());
    assert!(BlockManager::new(KvLayout::Paged, 4, 1).is_err());
    assert!(BlockManager::new(KvLayout::Contiguous { max_tokens: 0 }, 4, 4).is_err());
    let mut cache = BlockManager::new(KvLayout::Paged, 4, 4).unwrap();
    assert!(cache.grow(1, 1).is_err());
    assert!(cache.release(1).is_err());
    assert!(cache.admit(1, 0).is_err());
    assert!(cache.admit(1, 4).unwrap());
    assert!(cache.admit(1, 4).is_err());
}

#[test]
fn step_rows_pad_with_block_zero_and_record_samples() {
    assert_eq!(StepRows::bucket(0), 1);
    assert_eq!(StepRows::bucket(5), 8);
    let mut step = StepRows::new(4, 2, 3).unwrap();
    assert_eq!(step.push(9, 0, &[5], 4, false).unwrap(), None);
    assert_eq!(step.push(11, 5, &[5, 2], 4, true).unwrap(), Some(0));
    assert_eq!(step.ids(), &[9.0, 11.0, 0.0, 0.0]);
    assert_eq!(step.positions(), &[0.0, 5.0, 0.0, 0.0]);
    assert_eq!(
        step.table(),
        &[5.0, 0.0, 0.0, 5.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(step.samples(), &[1.0, 0.0]);
    assert!(
        step.push(1, 8, &[5, 2], 4, false).is_err(),
        "position past the blocks"
    );
    assert!(
        step.push(1, 0, &[1, 2, 3, 4], 4, false).is_err(),
        "table too long"
    );
    step.push(1, 0, &[1], 4, true).unwrap();
    assert!(matches!(
        step.push(1, 0, &[1], 4, true),
        Err(PagingError::StepFull { .. })
    ));
}

#[test]
fn fed_rows_take_their_token_from_the_previous_samples() {
    let mut step = StepRows::new(4, 2, 2).unwrap();
    step.push(7, 0, &[3], 4, false).unwrap();
    assert_eq!(step.push_fed(1, 4, &[3, 6], 4, true).unwrap(), Some(0));
    assert!(
        step.push_fed(2, 0, &[3], 4, false).is_err(),
        "previous sample past the sampled rows"
    );
    assert!(
        step.push_fed(0, 9, &[3], 4, false).is_err(),
        "position past the blocks"
    );
    assert_eq!(step.rows(), 2, "refused rows add nothing");
    assert_eq!(step.ids(), &[7.0, 0.0, 0.0, 0.0]);
    assert_eq!(step.picks(), &[0.0, 1.0, 0.0, 0.0]);
    assert_eq!(step.fed(), &[0.0, 1.0, 0.0, 0.0]);
    assert_eq!(step.fed_rows(), 1);
    assert_eq!(step.samples(), &[1.0, 0.0]);
}

#[test]
fn streams_are_seeded_and_stay_within_the_context() {
    let spec = StreamSpec::gpt2_serving(200, 50257, 600, 3);
    let a = spec.generate().unwrap();
    assert_eq!(a, spec.generate().unwrap());
    assert_ne!(
        a,
        StreamSpec {
            seed: 4,
            ..spec.clone()
        }
        .generate()
        .unwrap()
    );
    for request in &a {
        assert!(request.reach_tokens() <= 600);
        assert!(request.max_new_tokens >= 1 && request.prompt.len() >= 32);
        assert!(request.prompt.iter().all(|&t| t < 50257));
    }
    let lengths: Vec<usize> = a.iter().map(|r| r.prompt.len()).collect();
    assert!(lengths.iter().any(|&l| l < 100) && lengths.iter().any(|&l| l > 400));
    assert!(StreamSpec {
        prompt_tokens: (5, 4),
        ..spec
    }
    .generate()
    .is_err());
}

#[test]
fn timed_streams_are_seeded_and_keep_the_requests_without_a_prefix() {
    let spec = StreamSpec::gpt2_serving(50, 50257, 600, 3);
    let traffic = Traffic {
        rate: Some(4.0),
        shared_prefix: None,
        seed: 9,
    };
    let a = spec.generate_timed(&traffic).unwrap();
    assert_eq!(a, spec.generate_timed(&traffic).unwrap());
    // Arrivals only: the requests are generate()'s, arriving in order, none at t = 0.
    let requests: Vec<RequestSpec> = a.iter().map(|t| t.request.clone()).collect();
    assert_eq!(requests, spec.generate().unwrap());
    assert!(a[0].arrival_s > 0.0);
    assert!(a.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    // Another traffic seed: other arrivals, the same requests.
    let b = spec
        .generate_timed(&Traffic {
            seed: 10,
            ..traffic.clone()
        })
        .unwrap();
    assert_ne!(a[0].arrival_s, b[0].arrival_s);
    assert_eq!(a[7].request, b[7].request);
    // The default traffic: everything at t = 0.
    let at_once = spec.generate_timed(&Traffic::default()).unwrap();
    assert!(at_once.iter().all(|t| t.arrival_s == 0.0));
    assert_eq!(at_once.len(), 50);
}

#[test]
fn poisson_gaps_have_the_rates_mean_and_an_exponentials_spread() {
    // 10,000 gaps at 8 requests a second: the mean within 10% of 1/8 (the standard error is 1%
    // of it) and the variance within 20% of 1/64 (an exponential's; its standard error is about
    // 3%): constant or uniform gaps of the right mean fail the second bound.
    let spec = StreamSpec {
        requests: 10_000,
        prompt_tokens: (1, 1),
        output_tokens: (1, 1),
        vocab_size: 2,
        max_tokens: 2,
        seed: 1,
    };
    let rate = 8.0;
    let timed = spec
        .generate_timed(&Traffic {
            rate: Some(rate),
            shared_prefix: None,
            seed: 5,
        })
        .unwrap();
    let mut gaps = vec![timed[0].arrival_s];
    gaps.extend(timed.windows(2).map(|w| w[1].arrival_s - w[0].arrival_s));
    assert!(gaps.iter().all(|&gap| gap >= 0.0 && gap.is_finite()));
    let n = gaps.len() as f64;
    let mean = gaps.iter().sum::<f64>() / n;
    let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
    assert!((mean * rate - 1.0).abs() < 0.1, "mean gap {mean}");
    assert!(
        (variance * rate * rate - 1.0).abs() < 0.2,
        "gap variance {variance}"
    );
}

#[test]
fn shared_prefixes_start_every_prompt_and_stay_within_the_context() {
    let spec = StreamSpec::gpt2_serving(200, 50257, 600, 3);
    let (n, l) = (4, 100);
    let traffic = Traffic {
        rate: None,
        shared_prefix: Some((n, l)),
        seed: 2,
    };
    let timed = spec.generate_timed(&traffic).unwrap();
    assert_eq!(timed, spec.generate_timed(&traffic).unwrap());
    let own = spec.generate().unwrap();
    let mut prefixes: Vec<&[u32]> = Vec::new();
    for (t, own) in timed.iter().zip(&own) {
        let request = &t.request;
        assert!(request.reach_tokens() <= 600, "{}", request.reach_tokens());
        assert!(request.max_new_tokens >= 1 && request.prompt.len() >= l);
        assert!(request.prompt.iter().all(|&token| token < 50257));
        let prefix = &request.prompt[..l];
        if !prefixes.contains(&prefix) {
            prefixes.push(prefix);
        }
        // The request's own drawn prompt follows the prefix (cut at its end to fit).
        let rest = &request.prompt[l..];
        assert_eq!(rest, &own.prompt[..rest.len()]);
        assert!(request.max_new_tokens <= own.max_new_tokens);
        if request.prompt.len() + own.max_new_tokens <= 600 {
            assert_eq!(request.max_new_tokens, own.max_new_tokens);
        }
    }
    // Every prompt starts with one of N prefixes, and all N are used.
    assert_eq!(prefixes.len(), n, "prefixes used");
    // Some requests were cut to fit (prompts reach 512 and outputs 256 in a context of 600).
    assert!(timed
        .iter()
        .zip(&own)
        .any(|(t, own)| t.request.prompt.len() < l + own.prompt.len()));
    // A prefix that fills the context refuses; one that leaves a token for the output serves.
    let long = |tokens| {
        spec.generate_timed(&Traffic {
            shared_prefix: Some((2, tokens)),
            ..traffic.clone()
        })
    };
    assert_eq!(
        long(600).unwrap_err(),
        PagingError::PrefixTooLong {
            tokens: 600,
            max_tokens: 600
        }
    );
    let tight = long(599).unwrap();
    assert!(tight
        .iter()
        .all(|t| t.request.prompt.len() == 599 && t.request.max_new_tokens == 1));
    for prefix in [(0, 8), (3, 0)] {
        let refused = spec.generate_timed(&Traffic {
            shared_prefix: Some(prefix),
            ..traffic.clone()
        });
        assert!(matches!(refused, Err(PagingError::Config(_))), "{prefix:?}");
    }
}

#[test]
fn arrival_rates_must_be_positive_and_finite() {
    let spec = StreamSpec::gpt2_serving(3, 50257, 600, 3);
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let error = spec
            .generate_timed(&Traffic {
                rate: Some(rate),
                ..Traffic::default()
            })
            .unwrap_err();
        assert!(matches!(error, PagingError::Rate { .. }), "{rate}: {error}");
        assert!(error.to_string().contains("positive"), "{error}");
    }
}

#[test]
fn percentiles_by_nearest_rank() {
    let values: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&values, 50.0), Some(50.0));
    assert_eq!(percentile(&values, 99.0), Some(99.0));
    assert_eq!(percentile(&values, 100.0), Some(100.0));
    assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
    assert_eq!(percentile(&[], 50.0), None);
}

#[derive(Debug, Clone)]
enum Op {
    Admit(u64, usize),
    Grow(u64, usize),
    Release(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..8, 1usize..40).prop_map(|(id, t)| Op::Admit(id, t)),
        (0u64..8, 1usize..12).prop_map(|(id, t)| Op::Grow(id, t)),
        (0u64..8).prop_map(Op::Release),
    ]
}

proptest! {
    /// Whatever the order of admissions, growths and releases: no block is held twice, block 0
    /// is never held, the held and free blocks make the cache, and a sequence admitted can grow
    /// to what it was admitted for (the promise is kept).
    #[test]
    fn blocks_are_never_shared_and_promises_are_kept(
        contiguous in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let layout = if contiguous { KvLayout::Contiguous { max_tokens: 40 } } else { KvLayout::Paged };
        let mut cache = BlockManager::new(layout, 4, 30).unwrap();
        let mut reach = std::collections::BTreeMap::new();
        for op in ops {
            match op {
                Op::Admit(id, tokens) => {
                    if let Ok(true) = cache.admit(id, tokens) {
                        reach.insert(id, tokens);
                    }
                }
                Op::Grow(id, tokens) => {
                    let before = cache.tokens(id);
                    let result = cache.grow(id, tokens);
                    match (before, reach.get(&id)) {
                        (Some(have), Some(&limit)) if have + tokens <= limit => prop_assert!(result.is_ok()),
                        _ => prop_assert!(result.is_err()),
                    }
                }
                Op::Release(id) => {
                    prop_assert_eq!(cache.release(id).is_ok(), reach.remove(&id).is_some());
                }
            }
            let mut seen = std::collections::BTreeSet::new();
            for (id, blocks) in cache.sequences() {
                prop_assert!(blocks.len() * 4 >= cache.tokens(id).unwrap());
                for &block in blocks {
                    prop_assert!(block != 0 && (block as usize) < 30);
                    prop_assert!(seen.insert(block), "block {} held twice", block);
                }
            }
            prop_assert_eq!(seen.len(), cache.held_blocks());
            prop_assert!(cache.available_blocks() + cache.held_blocks() <= 29);
        }
    }
}
