//! Attention over a paged KV cache (`kv_write`, `paged_attention_decode`) against their CPU
//! twins: tokens of three sequences of different lengths written one step at a time through
//! shuffled block tables (blocks neither contiguous nor in order), then one decode step's
//! attention, in f32 and f16; a decode step captured in a plan and replayed; out-of-range
//! positions, lengths and block ids; typed errors that record nothing. Every test runs on the
//! backend `WGPU_BACKEND` selects.
//!
//! Tolerances: the cache is compared exactly (a copy); attention within 1e−5·(|cpu| + 1) (the
//! twin computes in f64; the values are in [−1, 1], so the output's scale is 1).
//! f16: on top, one f16 ulp and the smallest normal f16 (see `f16.rs`).

use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};
use wgpu_pool::compute::cpu::{self, KvLayout};
use wgpu_pool::compute::{BinaryOp, ComputeError, Context, ContextOptions, DType, Feed, Tensor};

use crate::compute::{assert_close, context_with, contexts, random, refused};
use crate::gpu::both;

/// One case: the cache's layout, its blocks, and the sequences' lengths.
struct Case {
    layout: KvLayout,
    num_blocks: usize,
    lens: [usize; 3],
}

const CASES: [Case; 3] = [
    // Odd sizes everywhere.
    Case {
        layout: KvLayout {
            block_tokens: 5,
            n_head: 3,
            head_dim: 7,
        },
        num_blocks: 11,
        lens: [1, 13, 9],
    },
    // GPT-2's head size, a sequence past one chunk of 256 tokens.
    Case {
        layout: KvLayout {
            block_tokens: 16,
            n_head: 2,
            head_dim: 64,
        },
        num_blocks: 25,
        lens: [300, 17, 1],
    },
    // Past the 2,048 scores the kernel keeps (the rest scored twice), a head size that 256 lanes
    // do not divide (two groups of 100 lanes, 56 idle).
    Case {
        layout: KvLayout {
            block_tokens: 64,
            n_head: 1,
            head_dim: 100,
        },
        num_blocks: 40,
        lens: [2100, 5, 300],
    },
];

/// A block table `[3, max_blocks]` giving each sequence the blocks it needs from a shuffled
/// list of all blocks; the entries past a sequence's blocks are out of range (never read).
fn shuffled_table(rng: &mut StdRng, case: &Case) -> (Vec<f32>, usize) {
    let mut blocks: Vec<usize> = (0..case.num_blocks).collect();
    blocks.shuffle(rng);
    let needed: Vec<usize> = case
        .lens
        .iter()
        .map(|len| len.div_ceil(case.layout.block_tokens))
        .collect();
    let max_blocks = *needed.iter().max().unwrap() + 1;
    let mut table = vec![1e6; 3 * max_blocks];
    let mut next = blocks.into_iter();
    for (b, &count) in needed.iter().enumerate() {
        for slot in &mut table[b * max_blocks..][..count] {
            *slot = next.next().expect("enough blocks") as f32;
        }
    }
    (table, max_blocks)
}

/// Writes the tokens of `case` step by step into caches of `dtype` (values rounded to it, as
/// uploaded) and attends to them, each against the twins: the caches exactly, attention within
/// 1e−5·(|cpu| + 1) and, for f16, one f16 ulp and the smallest normal f16 on top.
fn check_case(context: &Context, rng: &mut StdRng, case: &Case, dtype: DType, limits: &str) {
    let layout = case.layout;
    let token_len = layout.token_len();
    let cache_len = case.num_blocks * layout.block_tokens * token_len;
    let cache_shape = [
        case.num_blocks,
        layout.block_tokens,
        layout.n_head,
        layout.head_dim,
    ];
    let values = |rng: &mut StdRng, len| cpu::rounded(&random(rng, len, -1.0, 1.0), dtype);
    let upload =
        |values: &[f32], shape: &[usize]| context.tensor_with(values, shape, dtype).unwrap();
    let (table, max_blocks) = shuffled_table(rng, case);
    let mut k_cpu = values(rng, cache_len);
    let mut v_cpu = values(rng, cache_len);
    let k_cache = upload(&k_cpu, &cache_shape);
    let v_cache = upload(&v_cpu, &cache_shape);
    let t_table = context.tensor(&table, &[3, max_blocks]).unwrap();
    let steps = *case.lens.iter().max().unwrap();
    let token_shape = [3, layout.n_head, layout.head_dim];
    for step in 0..steps {
        // A finished sequence's position is out of range: nothing is written.
        let positions: Vec<f32> = case
            .lens
            .iter()
            .map(|&len| if step < len { step as f32 } else { -1.0 })
            .collect();
        let k_new = values(rng, 3 * token_len);
        let v_new = values(rng, 3 * token_len);
        let tk = upload(&k_new, &token_shape);
        let tv = upload(&v_new, &token_shape);
        let tp = context.tensor(&positions, &[3]).unwrap();
        if step % 2 == 0 {
            context
                .kv_write(&k_cache, &v_cache, &tk, &tv, &t_table, &tp)
                .unwrap();
            cpu::kv_write(
                &mut k_cpu, &mut v_cpu, &k_new, &v_new, &table, &positions, layout,
            );
        } else {
            // Odd steps from a fused query-key-value tensor.
            let qkv = fuse_qkv(&values(rng, 3 * token_len), &k_new, &v_new, token_len);
            let fused = upload(&qkv, &[3, 3, layout.n_head, layout.head_dim]);
            context
                .kv_write_qkv(&k_cache, &v_cache, &fused, &t_table, &tp)
                .unwrap();
            cpu::kv_write_qkv(&mut k_cpu, &mut v_cpu, &qkv, &table, &positions, layout);
        }
    }
    let what = format!("{limits}: {dtype:?} {cache_shape:?} lens {:?}", case.lens);
    assert_eq!(context.read(&k_cache).unwrap(), k_cpu, "{what}: K cache");
    assert_eq!(context.read(&v_cache).unwrap(), v_cpu, "{what}: V cache");

    let q = values(rng, 3 * token_len);
    let lens: Vec<f32> = case.lens.iter().map(|&len| len as f32).collect();
    let scale = 1.0 / (layout.head_dim as f32).sqrt();
    let tq = upload(&q, &token_shape);
    let tl = context.tensor(&lens, &[3]).unwrap();
    let out = context
        .paged_attention_decode(&tq, &k_cache, &v_cache, &t_table, &tl, scale)
        .unwrap();
    assert_eq!(out.shape(), token_shape);
    assert_eq!(out.dtype(), dtype);
    let exact = cpu::paged_attention_decode(&q, &k_cpu, &v_cpu, &table, &lens, layout, scale);
    let expected = cpu::rounded(&exact, dtype);
    assert!(expected.iter().all(|v| v.is_finite()), "{what}");
    let ulp = |v: f32| match dtype {
        DType::F32 => 0.0,
        DType::F16 => 2f64.powi(-10) * f64::from(v).abs() + 2f64.powi(-14),
    };
    assert_close(
        &format!("{what}: attention"),
        &context.read(&out).unwrap(),
        &expected,
        |i| 1e-5 * (f64::from(expected[i]).abs() + 1.0) + ulp(expected[i]),
    );
    // The same queries from a fused query-key-value tensor: the same bits.
    let qkv = fuse_qkv(
        &q,
        &values(rng, 3 * token_len),
        &values(rng, 3 * token_len),
        token_len,
    );
    let fused = upload(&qkv, &[3, 3, layout.n_head, layout.head_dim]);
    assert_eq!(cpu::split_qkv(&qkv, token_len)[0], q);
    let from_fused = context
        .paged_attention_decode_qkv(&fused, &k_cache, &v_cache, &t_table, &tl, scale)
        .unwrap();
    assert_eq!(from_fused.shape(), token_shape);
    assert_eq!(
        context.read(&from_fused).unwrap(),
        context.read(&out).unwrap(),
        "{what}: attention from a fused tensor"
    );
}

/// `[batch, 3, token_len]` from the queries, keys and values of a batch.
fn fuse_qkv(q: &[f32], k: &[f32], v: &[f32], token_len: usize) -> Vec<f32> {
    q.chunks_exact(token_len)
        .zip(k.chunks_exact(token_len))
        .zip(v.chunks_exact(token_len))
        .flat_map(|((q, k), v)| q.iter().chain(k).chain(v).copied())
        .collect()
}

#[test]
fn paged_writes_and_decode_attention_match_their_twins() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(27);
            for case in &CASES {
                check_case(&context, &mut rng, case, DType::F32, limits);
            }
        }
    }
}

#[test]
fn f16_paged_writes_and_decode_attention_match_their_twins() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        if !context.supports(DType::F16) {
            eprintln!("f16 paged attention: {limits} has no SHADER_F16; f32 only");
            continue;
        }
        let mut rng = StdRng::seed_from_u64(30);
        for case in &CASES {
            check_case(&context, &mut rng, case, DType::F16, limits);
        }
    }
}

#[test]
fn out_of_range_tables_write_nothing_and_attend_to_nan() {
    // A head of 3 (scalar kernel) and of 4 (the vec4 kernel).
    for head_dim in [3, 4] {
        out_of_range_tables(head_dim);
    }
}

fn out_of_range_tables(head_dim: usize) {
    let (_, gpu) = both()[0];
    let context = context_with(gpu, ContextOptions::default());
    let layout = KvLayout {
        block_tokens: 4,
        n_head: 2,
        head_dim,
    };
    let token = 2 * head_dim;
    let mut rng = StdRng::seed_from_u64(28);
    let cache_len = 3 * 4 * token;
    let mut k_cpu = random(&mut rng, cache_len, -1.0, 1.0);
    let mut v_cpu = random(&mut rng, cache_len, -1.0, 1.0);
    let k_cache = context.tensor(&k_cpu, &[3, 4, 2, head_dim]).unwrap();
    let v_cache = context.tensor(&v_cpu, &[3, 4, 2, head_dim]).unwrap();
    // Four sequences, two blocks each: in range; a block id past the cache; a negative one;
    // a fractional one.
    let table = [2.0, 0.0, 3.0, 1.0, -1.0, 1.0, 0.5, 1.0];
    let t_table = context.tensor(&table, &[4, 2]).unwrap();
    // Positions: in range, in the bad block, in the bad block, and past the table (8 slots).
    let positions = [5.0, 1.0, 2.0, 8.0];
    let k_new = random(&mut rng, 4 * token, -1.0, 1.0);
    let v_new = random(&mut rng, 4 * token, -1.0, 1.0);
    let tk = context.tensor(&k_new, &[4, 2, head_dim]).unwrap();
    let tv = context.tensor(&v_new, &[4, 2, head_dim]).unwrap();
    let tp = context.tensor(&positions, &[4]).unwrap();
    context
        .kv_write(&k_cache, &v_cache, &tk, &tv, &t_table, &tp)
        .unwrap();
    let before = k_cpu.clone();
    cpu::kv_write(
        &mut k_cpu, &mut v_cpu, &k_new, &v_new, &table, &positions, layout,
    );
    // Only sequence 0's token was written: block 0, slot 1.
    let changed: Vec<usize> = (0..cache_len).filter(|&i| k_cpu[i] != before[i]).collect();
    assert_eq!(changed, (token..2 * token).collect::<Vec<_>>());
    assert_eq!(context.read(&k_cache).unwrap(), k_cpu);
    assert_eq!(context.read(&v_cache).unwrap(), v_cpu);

    // Lengths: in range (reads block 2 then 0); through the bad block; 0; past the table.
    let lens = [6.0, 6.0, 0.0, 9.0];
    let q = random(&mut rng, 4 * token, -1.0, 1.0);
    let tq = context.tensor(&q, &[4, 2, head_dim]).unwrap();
    let tl = context.tensor(&lens, &[4]).unwrap();
    let out = context
        .paged_attention_decode(&tq, &k_cache, &v_cache, &t_table, &tl, 0.5)
        .unwrap();
    let got = context.read(&out).unwrap();
    let expected = cpu::paged_attention_decode(&q, &k_cpu, &v_cpu, &table, &lens, layout, 0.5);
    assert!(expected[..token].iter().all(|v| v.is_finite()));
    assert!(expected[token..].iter().all(|v| v.is_nan()));
    assert!(
        got[token..].iter().all(|v| v.is_nan()),
        "{head_dim}: {got:?}"
    );
    assert_close("in range", &got[..token], &expected[..token], |i| {
        1e-5 * (f64::from(expected[i]).abs() + 1.0)
    });
}

/// A refused call: what it tests, its operands (`k`, `v`, the tokens, the table, the
/// per-sequence values) and the error expected.
type Refusal<'a> = (
    &'a str,
    &'a Tensor,
    &'a Tensor,
    &'a Tensor,
    &'a Tensor,
    &'a Tensor,
    &'a dyn Fn(&ComputeError) -> bool,
);

#[test]
fn bad_shapes_are_typed_errors_that_record_nothing() {
    let (_, gpu) = both()[0];
    let context = context_with(gpu, ContextOptions::default());
    let t = |shape: &[usize]| -> Tensor {
        let len = shape.iter().product();
        context.tensor(&vec![0.0; len], shape).unwrap()
    };
    let (k, v) = (t(&[4, 2, 3, 5]), t(&[4, 2, 3, 5]));
    let new = t(&[2, 3, 5]);
    let table = t(&[2, 3]);
    let per = t(&[2]);
    let (other_cache, three_d) = (t(&[4, 2, 3, 6]), t(&[4, 6, 5]));
    let (wrong_heads, wrong_batch) = (t(&[2, 4, 5]), t(&[3, 3, 5]));
    let (table_1d, three) = (t(&[6]), t(&[3]));
    let (wide_k, wide_v, wide_q) = (t(&[2, 1, 1, 300]), t(&[2, 1, 1, 300]), t(&[1, 1, 300]));
    let (one_row, one) = (t(&[1, 1]), t(&[1]));
    context.flush().unwrap();
    let shape = |e: &ComputeError| matches!(e, ComputeError::ShapeMismatch { .. });
    let invalid = |e: &ComputeError| matches!(e, ComputeError::InvalidShape { .. });
    let scalar = |e: &ComputeError| matches!(e, ComputeError::InvalidScalar { .. });
    let write = |k: &Tensor, v: &Tensor, new: &Tensor, table: &Tensor, per: &Tensor| {
        context.kv_write(k, v, new, new, table, per)
    };
    let decode = |q: &Tensor, k: &Tensor, v: &Tensor, table: &Tensor, per: &Tensor| {
        context.paged_attention_decode(q, k, v, table, per, 1.0)
    };
    // The good shapes are accepted (so each refusal below is for its one fault).
    write(&k, &v, &new, &table, &per).unwrap();
    decode(&new, &k, &v, &table, &per).unwrap();
    context.flush().unwrap();
    let cases: [Refusal; 8] = [
        (
            "caches of two shapes",
            &k,
            &other_cache,
            &new,
            &table,
            &per,
            &shape,
        ),
        ("one tensor for K and V", &k, &k, &new, &table, &per, &shape),
        (
            "a 3-D cache",
            &three_d,
            &three_d,
            &new,
            &table,
            &per,
            &invalid,
        ),
        (
            "tokens of other heads",
            &k,
            &v,
            &wrong_heads,
            &table,
            &per,
            &shape,
        ),
        (
            "tokens of another batch",
            &k,
            &v,
            &wrong_batch,
            &table,
            &per,
            &shape,
        ),
        ("a 1-D table", &k, &v, &new, &table_1d, &per, &invalid),
        (
            "a table of another batch",
            &k,
            &v,
            &new,
            &one_row,
            &per,
            &shape,
        ),
        (
            "per-sequence values of another batch",
            &k,
            &v,
            &new,
            &table,
            &three,
            &shape,
        ),
    ];
    for (what, k, v, new, table, per, expected) in cases {
        refused(&context, what, || write(k, v, new, table, per), expected);
        refused(&context, what, || decode(new, k, v, table, per), expected);
    }
    // Fused query-key-value tensors: [batch, 3, n_head, head_dim] accepted, others refused.
    let (fused, unfused, fused_heads) = (t(&[2, 3, 3, 5]), t(&[2, 2, 3, 5]), t(&[2, 3, 4, 5]));
    context.flush().unwrap();
    context.kv_write_qkv(&k, &v, &fused, &table, &per).unwrap();
    context
        .paged_attention_decode_qkv(&fused, &k, &v, &table, &per, 1.0)
        .unwrap();
    context.flush().unwrap();
    for (what, tokens, expected) in [
        (
            "a fused tensor of two parts",
            &unfused,
            &invalid as &dyn Fn(&ComputeError) -> bool,
        ),
        ("a separate key as a fused tensor", &new, &invalid),
        ("a fused tensor of other heads", &fused_heads, &shape),
    ] {
        refused(
            &context,
            what,
            || context.kv_write_qkv(&k, &v, tokens, &table, &per),
            expected,
        );
        refused(
            &context,
            what,
            || context.paged_attention_decode_qkv(tokens, &k, &v, &table, &per, 1.0),
            expected,
        );
    }
    // Heads of more than 256 values: written, not attended to.
    write(&wide_k, &wide_v, &wide_q, &one_row, &one).unwrap();
    context.flush().unwrap();
    refused(
        &context,
        "head_dim above 256",
        || decode(&wide_q, &wide_k, &wide_v, &one_row, &one),
        invalid,
    );
    if context.supports(DType::F16) {
        let half = |shape: &[usize]| -> Tensor {
            let len = shape.iter().product();
            context
                .tensor_with(&vec![0.0; len], shape, DType::F16)
                .unwrap()
        };
        let (half_table, half_per, half_new) = (half(&[2, 3]), half(&[2]), half(&[2, 3, 5]));
        context.flush().unwrap();
        let dtype = |e: &ComputeError| matches!(e, ComputeError::DTypeMismatch { .. });
        let cases: [Refusal; 3] = [
            (
                "an f16 block table",
                &k,
                &v,
                &new,
                &half_table,
                &per,
                &dtype,
            ),
            (
                "f16 per-sequence values",
                &k,
                &v,
                &new,
                &table,
                &half_per,
                &dtype,
            ),
            (
                "f16 tokens for f32 caches",
                &k,
                &v,
                &half_new,
                &table,
                &per,
                &dtype,
            ),
        ];
        for (what, k, v, new, table, per, expected) in cases {
            refused(&context, what, || write(k, v, new, table, per), expected);
            refused(&context, what, || decode(new, k, v, table, per), expected);
        }
    }
    for scale in [f32::NAN, f32::INFINITY] {
        refused(
            &context,
            "scale",
            || context.paged_attention_decode(&new, &k, &v, &table, &per, scale),
            scalar,
        );
    }
}

/// One decode step: the new tokens written, then attention over the caches.
fn decode_step(context: &Context, caches: [&Tensor; 2], step: [&Tensor; 5]) -> Tensor {
    let [k_cache, v_cache] = caches;
    let [k_new, v_new, q, table, positions] = step;
    context
        .kv_write(k_cache, v_cache, k_new, v_new, table, positions)
        .unwrap();
    let lens = context
        .binary_scalar(BinaryOp::Add, positions, 1.0)
        .unwrap();
    context
        .paged_attention_decode(q, k_cache, v_cache, table, &lens, 0.25)
        .unwrap()
}

#[test]
fn a_captured_decode_step_replays_as_eagerly() {
    let (_, gpu) = both()[0];
    let context = context_with(gpu, ContextOptions::default());
    let mut rng = StdRng::seed_from_u64(29);
    let shape = [6, 3, 2, 5];
    let cache_len = 6 * 3 * 2 * 5;
    let init = random(&mut rng, cache_len, -1.0, 1.0);
    // Two copies of the cache: one the plan writes, one the eager ops write.
    let planned = [0, 1].map(|_| context.tensor(&init, &shape).unwrap());
    let eager = [0, 1].map(|_| context.tensor(&init, &shape).unwrap());
    let table = [4.0, 1.0, 5.0, 0.0, 3.0, 2.0];
    let t_table = context.tensor(&table, &[2, 3]).unwrap();
    let mut capture = context.capture().unwrap();
    let k_new = capture.input(&[2, 2, 5]).unwrap();
    let v_new = capture.input(&[2, 2, 5]).unwrap();
    let q = capture.input(&[2, 2, 5]).unwrap();
    let positions = capture.input(&[2]).unwrap();
    let out = decode_step(
        &context,
        [&planned[0], &planned[1]],
        [&k_new, &v_new, &q, &t_table, &positions],
    );
    let mut plan = capture.finish(&[&out]).unwrap();
    for step in 0..7usize {
        let values: Vec<Vec<f32>> = (0..3).map(|_| random(&mut rng, 20, -1.0, 1.0)).collect();
        let positions = [step as f32, (step / 2) as f32];
        let feeds: Vec<Feed<'_>> = values
            .iter()
            .map(|v| Feed::Data(v))
            .chain([Feed::Data(&positions)])
            .collect();
        let got = plan.run(&feeds).unwrap();
        let step_tensors: Vec<Tensor> = values
            .iter()
            .map(|v| context.tensor(v, &[2, 2, 5]).unwrap())
            .collect();
        let tp = context.tensor(&positions, &[2]).unwrap();
        let expected = decode_step(
            &context,
            [&eager[0], &eager[1]],
            [
                &step_tensors[0],
                &step_tensors[1],
                &step_tensors[2],
                &t_table,
                &tp,
            ],
        );
        assert_eq!(got[0], context.read(&expected).unwrap(), "step {step}");
    }
    for (planned, eager) in planned.iter().zip(&eager) {
        assert_eq!(context.read(planned).unwrap(), context.read(eager).unwrap());
    }
}

/// The decode rows' fused cache write and attention (`paged_attention_decode_write_qkv`) against
/// the two ops it replaces and against its twin, over the cases' shuffled tables (one, two and
/// nine shares of the attention): four decode steps at the end of each sequence, each row a
/// different sequence, the caches compared exactly and the attention bit for bit with the two
/// ops' (the same sums over the same stored values), within the twin's tolerance; a row whose
/// position is out of range writes nothing and gives NaN. Captured, the fused step is one
/// dispatch fewer.
#[test]
fn decode_rows_write_and_attend_in_one_dispatch_as_the_two_ops_do() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        let mut rng = StdRng::seed_from_u64(44);
        for case in &CASES {
            let layout = case.layout;
            let token_len = layout.token_len();
            let cache_len = case.num_blocks * layout.block_tokens * token_len;
            let cache_shape = [
                case.num_blocks,
                layout.block_tokens,
                layout.n_head,
                layout.head_dim,
            ];
            let (table, max_blocks) = shuffled_table(&mut rng, case);
            let mut k_cpu = random(&mut rng, cache_len, -1.0, 1.0);
            let mut v_cpu = random(&mut rng, cache_len, -1.0, 1.0);
            let caches = || {
                (
                    context.tensor(&k_cpu, &cache_shape).unwrap(),
                    context.tensor(&v_cpu, &cache_shape).unwrap(),
                )
            };
            let (k_fused, v_fused) = caches();
            let (k_two, v_two) = caches();
            let t_table = context.tensor(&table, &[3, max_blocks]).unwrap();
            let scale = 1.0 / (layout.head_dim as f32).sqrt();
            for step in 0..4 {
                // The last four tokens of each sequence; the first row's position is out of
                // range in the last step.
                let mut positions: Vec<f32> = case
                    .lens
                    .iter()
                    .map(|&len| len.saturating_sub(4 - step) as f32)
                    .collect();
                if step == 3 {
                    positions[0] = (max_blocks * layout.block_tokens) as f32;
                }
                let qkv = random(&mut rng, 3 * 3 * token_len, -1.0, 1.0);
                let fused = context
                    .tensor(&qkv, &[3, 3, layout.n_head, layout.head_dim])
                    .unwrap();
                let tp = context.tensor(&positions, &[3]).unwrap();
                let out = context
                    .paged_attention_decode_write_qkv(
                        &fused, &k_fused, &v_fused, &t_table, &tp, scale,
                    )
                    .unwrap();
                context
                    .kv_write_qkv(&k_two, &v_two, &fused, &t_table, &tp)
                    .unwrap();
                let lengths = context.binary_scalar(BinaryOp::Add, &tp, 1.0).unwrap();
                let two = context
                    .paged_attention_decode_qkv(&fused, &k_two, &v_two, &t_table, &lengths, scale)
                    .unwrap();
                let expected = cpu::paged_attention_decode_write_qkv(
                    &mut k_cpu, &mut v_cpu, &qkv, &table, &positions, layout, scale,
                );
                let what = format!("{limits}: {cache_shape:?} step {step} at {positions:?}");
                let got = context.read(&out).unwrap();
                assert_eq!(context.read(&k_fused).unwrap(), k_cpu, "{what}: K cache");
                assert_eq!(context.read(&v_fused).unwrap(), v_cpu, "{what}: V cache");
                assert_eq!(
                    context.read(&k_two).unwrap(),
                    k_cpu,
                    "{what}: the two ops' K"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&context.read(&two).unwrap()), "{what}");
                // The row out of range is NaN on both sides, the others finite and close.
                let bad_rows = if step == 3 { token_len } else { 0 };
                assert!(got[..bad_rows].iter().all(|v| v.is_nan()), "{what}");
                assert!(expected[..bad_rows].iter().all(|v| v.is_nan()), "{what}");
                let (got, expected) = (&got[bad_rows..], &expected[bad_rows..]);
                assert!(expected.iter().all(|v| v.is_finite()), "{what}");
                assert_close(&what, got, expected, |i| {
                    1e-5 * (f64::from(expected[i]).abs() + 1.0)
                });
            }
            // Captured: the fused step records one dispatch fewer than the two ops.
            let steps = |write_apart: bool| {
                let mut capture = context.capture().unwrap();
                let qkv = capture
                    .input(&[3, 3, layout.n_head, layout.head_dim])
                    .unwrap();
                let positions = capture.input(&[3]).unwrap();
                let out = if write_apart {
                    context
                        .kv_write_qkv(&k_two, &v_two, &qkv, &t_table, &positions)
                        .unwrap();
                    let lengths = context
                        .binary_scalar(BinaryOp::Add, &positions, 1.0)
                        .unwrap();
                    context
                        .paged_attention_decode_qkv(&qkv, &k_two, &v_two, &t_table, &lengths, scale)
                        .unwrap()
                } else {
                    context
                        .paged_attention_decode_write_qkv(
                            &qkv, &k_fused, &v_fused, &t_table, &positions, scale,
                        )
                        .unwrap()
                };
                capture.finish(&[&out]).unwrap().stats().steps
            };
            assert_eq!(steps(false) + 2, steps(true), "{limits}: {cache_shape:?}");
        }
    }
}
