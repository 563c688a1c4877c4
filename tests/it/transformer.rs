//! The transformer ops (layer norm, the scaled and causal softmax, the embedding gather, argmax)
//! against their CPU twins on odd shapes, in f32 and f16, eager and replayed in a plan, and
//! their typed errors. Every test runs on the backend `WGPU_BACKEND` selects.
//!
//! Tolerances (the twins compute in f64):
//! - layer_norm: 2e−5·(|cpu| + 1) (two f32 reductions of at most a few thousand terms, then a
//!   division by the standard deviation);
//! - softmax_rows: 1e−5·|cpu| + 1e−7, as `softmax` (masked columns exactly 0);
//! - embedding, argmax_rows: exact (a copy; a comparison);
//! - f16: on top, one f16 ulp and the smallest normal f16 (see `f16.rs`).

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::compute::{cpu, ComputeError, Context, ContextOptions, DType, Feed, Tensor};

use crate::compute::{assert_close, context_with, contexts, random, refused};
use crate::gpu::both;

/// `(rows, cols)`: odd, one column, one row, past one workgroup's stride, several strides, past
/// the four values a layer norm keeps in registers (and argmax's 2,048-column parts).
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (3, 17),
    (17, 3),
    (2, 129),
    (5, 257),
    (2, 1000),
    (3, 3000),
];

fn layer_norm_tolerance(expected: &[f32]) -> impl Fn(usize) -> f64 + '_ {
    |i| 2e-5 * (f64::from(expected[i]).abs() + 1.0)
}

fn softmax_tolerance(expected: &[f32]) -> impl Fn(usize) -> f64 + '_ {
    |i| 1e-5 * f64::from(expected[i]).abs() + 1e-7
}

#[test]
fn layer_norm_matches_its_twin_on_odd_shapes() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(27);
            for (rows, cols) in SHAPES {
                let x = random(&mut rng, rows * cols, -4.0, 4.0);
                let gamma = random(&mut rng, cols, 0.5, 2.0);
                let beta = random(&mut rng, cols, -1.0, 1.0);
                // A 3-D input normalizes its last dimension as well.
                let shape = if rows == 5 {
                    vec![5, 1, cols]
                } else {
                    vec![rows, cols]
                };
                let tx = context.tensor(&x, &shape).unwrap();
                let tg = context.tensor(&gamma, &[cols]).unwrap();
                let tb = context.tensor(&beta, &[cols]).unwrap();
                for eps in [1e-5, 0.5] {
                    let y = context.layer_norm(&tx, &tg, &tb, eps).unwrap();
                    assert_eq!(y.shape(), shape.as_slice());
                    let expected = cpu::layer_norm(&x, &gamma, &beta, cols, eps);
                    assert_close(
                        &format!("layer_norm {rows}x{cols} eps {eps} ({limits})"),
                        &y.to_vec().unwrap(),
                        &expected,
                        layer_norm_tolerance(&expected),
                    );
                }
            }
            // Rows far from 0 with a small spread: the two-pass variance keeps them.
            let x: Vec<f32> = (0..64).map(|i| 1000.0 + (i % 7) as f32 * 0.01).collect();
            let ones = context.tensor(&[1.0; 32], &[32]).unwrap();
            let zeros = context.tensor(&[0.0; 32], &[32]).unwrap();
            let tx = context.tensor(&x, &[2, 32]).unwrap();
            let y = context.layer_norm(&tx, &ones, &zeros, 1e-5).unwrap();
            let expected = cpu::layer_norm(&x, &[1.0; 32], &[0.0; 32], 32, 1e-5);
            // The f32 mean errs by up to 2(⌈cols/256⌉ + 9)·u·mean|x| (the bound of `sum`), which
            // the division by the row's standard deviation σ magnifies: |error| ≤ that / σ ·
            // (1 + |y|), on top of the tolerance of centred rows.
            let mean_bound = 2.0 * 10.0 * crate::compute::U * 1000.1;
            let row_sigma = |row: &[f32]| {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / row.len() as f64;
                let variance = row
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>();
                (variance / row.len() as f64).sqrt()
            };
            let sigmas = [row_sigma(&x[..32]), row_sigma(&x[32..])];
            assert_close(
                &format!("layer_norm of offset rows ({limits})"),
                &y.to_vec().unwrap(),
                &expected,
                |i| {
                    let scale = 1.0 + f64::from(expected[i]).abs();
                    mean_bound / sigmas[i / 32] * scale + layer_norm_tolerance(&expected)(i)
                },
            );
        }
    }
}

#[test]
fn softmax_rows_scaled_and_causal_match_their_twin() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(28);
            // (shape, scale, causal offset): a prefill (offset 0), queries after cached keys,
            // heads of several queries, one query, offsets past the keys, no mask.
            let cases: [(&[usize], f32, Option<usize>); 9] = [
                (&[3, 17], 1.0, None),
                (&[17, 3], 0.125, Some(0)),
                (&[5, 7], 0.5, Some(2)),
                (&[2, 5, 7], -0.75, Some(2)),
                (&[3, 4, 4], 0.25, Some(0)),
                (&[1, 1000], 0.0625, Some(600)),
                (&[129], 1.0, Some(0)),
                (&[2, 257], 2.0, Some(1000)),
                (&[4, 129, 33], 0.3, Some(0)),
            ];
            for (shape, scale, causal) in cases {
                let len: usize = shape.iter().product();
                let cols = shape[shape.len() - 1];
                let queries = if shape.len() > 1 {
                    shape[shape.len() - 2]
                } else {
                    1
                };
                let x = random(&mut rng, len, -8.0, 8.0);
                let tx = context.tensor(&x, shape).unwrap();
                let y = context.softmax_rows(&tx, scale, causal).unwrap();
                assert_eq!(y.shape(), shape);
                let got = y.to_vec().unwrap();
                let expected = cpu::softmax_rows(&x, cols, queries, scale, causal);
                let what = format!("softmax_rows {shape:?} scale {scale} {causal:?} ({limits})");
                assert_close(&what, &got, &expected, softmax_tolerance(&expected));
                for (i, (&g, &c)) in got.iter().zip(&expected).enumerate() {
                    if let Some(offset) = causal {
                        let query = (i / cols) % queries;
                        if i % cols > query + offset {
                            assert!(g == 0.0 && c == 0.0, "{what}: masked element {i} is {g}");
                        }
                    }
                }
            }
            // Large scores: without subtracting the maximum, exp would overflow.
            let x = [1000.0, 1001.0, 999.0, 5000.0];
            let tx = context.tensor(&x, &[1, 4]).unwrap();
            let expected = cpu::softmax_rows(&x, 4, 1, 1.0, Some(2));
            let got = context.softmax_rows(&tx, 1.0, Some(2)).unwrap();
            assert_close(
                &format!("softmax_rows of large values ({limits})"),
                &got.to_vec().unwrap(),
                &expected,
                softmax_tolerance(&expected),
            );
            // Scale 1 without a mask is the plain softmax.
            let x = random(&mut rng, 3 * 17, -8.0, 8.0);
            let tx = context.tensor(&x, &[3, 17]).unwrap();
            assert_eq!(
                cpu::softmax_rows(&x, 17, 3, 1.0, None),
                cpu::softmax(&x, 17)
            );
            let expected = cpu::softmax(&x, 17);
            assert_close(
                &format!("softmax_rows as softmax ({limits})"),
                &context
                    .softmax_rows(&tx, 1.0, None)
                    .unwrap()
                    .to_vec()
                    .unwrap(),
                &expected,
                softmax_tolerance(&expected),
            );
        }
    }
}

/// Asserts `got` equals `expected` bit for bit, NaN where `expected` is NaN.
fn assert_same(what: &str, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths differ");
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            g == e || (g.is_nan() && e.is_nan()),
            "{what}: element {i}: gpu {g} cpu {e}"
        );
    }
}

#[test]
fn embedding_gathers_the_rows_of_its_ids() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(29);
            for (vocab, width, tokens) in [(1, 1, 1), (3, 17, 5), (1000, 3, 129), (11, 257, 7)] {
                let table = random(&mut rng, vocab * width, -4.0, 4.0);
                let tt = context.tensor(&table, &[vocab, width]).unwrap();
                let ids: Vec<u32> = (0..tokens)
                    .map(|_| rng.gen_range(0..vocab as u32))
                    .collect();
                let values: Vec<f32> = ids.iter().map(|&id| id as f32).collect();
                let expected = cpu::embedding(&table, width, &values);
                let what = format!("embedding {vocab}x{width} of {tokens} ({limits})");
                let y = context.embedding_ids(&tt, &ids).unwrap();
                assert_eq!(y.shape(), [tokens, width]);
                assert_same(&what, &y.to_vec().unwrap(), &expected);
                // Ids on the GPU, of any shape: the output adds the width.
                let tids = context.tensor(&values, &[1, tokens]).unwrap();
                let y = context.embedding(&tt, &tids).unwrap();
                assert_eq!(y.shape(), [1, tokens, width]);
                assert_same(&what, &y.to_vec().unwrap(), &expected);
            }
            // A table in blocks of rows (as one beyond the largest binding): the same rows.
            let (vocab, width) = (23, 9);
            let table = random(&mut rng, vocab * width, -4.0, 4.0);
            let blocks: Vec<Tensor> = [(0, 10), (10, 11), (11, 23)]
                .iter()
                .map(|&(from, to)| {
                    let rows = &table[from * width..to * width];
                    context.tensor(rows, &[to - from, width]).unwrap()
                })
                .collect();
            let ids = [22.0, 0.0, 10.0, 9.0, 11.0, 23.0, -1.0, 10.5, 5.0];
            let tids = context.tensor(&ids, &[3, 3]).unwrap();
            let y = context
                .embedding_blocks(&blocks.iter().collect::<Vec<_>>(), &tids)
                .unwrap();
            assert_eq!(y.shape(), [3, 3, width]);
            assert_same(
                &format!("embedding in blocks ({limits})"),
                &y.to_vec().unwrap(),
                &cpu::embedding(&table, width, &ids),
            );
            // Ids on the GPU that are no row give NaN rows, the others their rows.
            let table = random(&mut rng, 11 * 5, -4.0, 4.0);
            let tt = context.tensor(&table, &[11, 5]).unwrap();
            let ids = [3.0, -1.0, 2.5, 11.0, f32::NAN, 10.0, 1e9, 0.0];
            let tids = context.tensor(&ids, &[8]).unwrap();
            let expected = cpu::embedding(&table, 5, &ids);
            assert!(expected[5..25].iter().all(|v| v.is_nan()));
            assert_eq!(expected[25..30], table[50..55]);
            assert_same(
                &format!("embedding of invalid ids ({limits})"),
                &context.embedding(&tt, &tids).unwrap().to_vec().unwrap(),
                &expected,
            );
        }
    }
}

#[test]
fn argmax_rows_picks_the_first_largest() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(30);
            for (rows, cols) in SHAPES {
                let mut x = random(&mut rng, rows * cols, -4.0, 4.0);
                // Ties: the row's maximum copied to a later column (and to an earlier one in
                // the next row), so that "first" decides.
                for row in 0..rows {
                    let slice = &mut x[row * cols..(row + 1) * cols];
                    let best = cpu::argmax_rows(slice, cols)[0] as usize;
                    let other = (best + 1 + row * 131) % cols;
                    slice[other] = slice[best];
                }
                let tx = context.tensor(&x, &[rows, cols]).unwrap();
                let expected = cpu::argmax_rows(&x, cols);
                let what = format!("argmax_rows {rows}x{cols} ({limits})");
                let y = context.argmax_rows(&tx).unwrap();
                assert_eq!(y.shape(), [rows]);
                let as_f32: Vec<f32> = expected.iter().map(|&i| i as f32).collect();
                assert_same(&what, &y.to_vec().unwrap(), &as_f32);
                assert_eq!(context.argmax_rows_ids(&tx).unwrap(), expected, "{what}");
            }
            // Wide rows (four columns a step in the kernel): the maximum tied at several of the
            // columns one invocation reads in one step, and far apart.
            let cols = 5003;
            let mut x = random(&mut rng, 4 * cols, -4.0, 4.0);
            for (row, ties) in [
                [700, 1724, 4000],
                [1, 257, 513],
                [4999, 3000, 3256],
                [2048, 1024, 5002],
            ]
            .iter()
            .enumerate()
            {
                for &col in ties {
                    x[row * cols + col] = 9.0;
                }
            }
            let tx = context.tensor(&x, &[4, cols]).unwrap();
            let expected = cpu::argmax_rows(&x, cols);
            assert_eq!(expected, [700, 1, 3000, 1024]);
            assert_eq!(
                context.argmax_rows_ids(&tx).unwrap(),
                expected,
                "wide ({limits})"
            );
            // Equal rows give 0; −∞ everywhere but one; the maximum last; a 1-D tensor.
            let mut x = vec![2.0f32; 300];
            x.extend(std::iter::repeat_n(f32::NEG_INFINITY, 299));
            x.push(-1e30);
            x.extend((0..300).map(|i| i as f32));
            let tx = context.tensor(&x, &[3, 300]).unwrap();
            assert_eq!(
                context.argmax_rows_ids(&tx).unwrap(),
                [0, 299, 299],
                "argmax_rows edge rows ({limits})"
            );
            assert_eq!(cpu::argmax_rows(&x, 300), [0, 299, 299]);
            let tx = context.tensor(&[1.0, 5.0, 5.0], &[3]).unwrap();
            let y = context.argmax_rows(&tx).unwrap();
            assert_eq!(y.shape(), [1]);
            assert_eq!(y.to_vec().unwrap(), [1.0]);
        }
    }
}

#[test]
fn bad_input_is_a_typed_error_that_records_nothing() {
    let (_, gpu) = both()[0];
    let context = context_with(gpu, ContextOptions::default());
    let x = context.tensor(&[1.0; 12], &[3, 4]).unwrap();
    let four = context.tensor(&[1.0; 4], &[4]).unwrap();
    let three = context.tensor(&[1.0; 3], &[3]).unwrap();
    let square = context.tensor(&[1.0; 16], &[4, 4]).unwrap();
    let wide = context.tensor(&[1.0; 12], &[2, 6]).unwrap();
    context.flush().unwrap();
    let shape = |e: &ComputeError| matches!(e, ComputeError::ShapeMismatch { .. });
    let scalar = |e: &ComputeError| matches!(e, ComputeError::InvalidScalar { .. });
    let invalid = |e: &ComputeError| matches!(e, ComputeError::InvalidShape { .. });
    refused(
        &context,
        "gamma of another length",
        || context.layer_norm(&x, &three, &four, 1e-5),
        shape,
    );
    refused(
        &context,
        "beta of another rank",
        || context.layer_norm(&x, &four, &square, 1e-5),
        shape,
    );
    for eps in [f32::NAN, f32::INFINITY, -1e-5] {
        refused(
            &context,
            "eps",
            || context.layer_norm(&x, &four, &four, eps),
            scalar,
        );
    }
    for scale in [f32::NAN, f32::NEG_INFINITY] {
        refused(
            &context,
            "scale",
            || context.softmax_rows(&x, scale, Some(0)),
            scalar,
        );
    }
    refused(
        &context,
        "a 1-D table",
        || context.embedding(&four, &three),
        invalid,
    );
    let cube = context.tensor(&[1.0; 8], &[2, 2, 2]).unwrap();
    context.flush().unwrap();
    refused(
        &context,
        "a 3-D table",
        || context.embedding_ids(&cube, &[0]),
        invalid,
    );
    refused(
        &context,
        "no ids",
        || context.embedding_ids(&x, &[]),
        invalid,
    );
    refused(
        &context,
        "no blocks",
        || context.embedding_blocks(&[], &three),
        invalid,
    );
    refused(
        &context,
        "blocks of two widths",
        || context.embedding_blocks(&[&x, &wide], &three),
        shape,
    );
    refused(
        &context,
        "an id past the table",
        || context.embedding_ids(&x, &[0, 2, 3, 1]),
        |e| {
            *e == ComputeError::IndexOutOfRange {
                op: "embedding_ids",
                position: 2,
                index: 3,
                len: 3,
            }
        },
    );
    // A tensor of another context.
    let other = context_with(gpu, ContextOptions::default());
    refused(
        &other,
        "a foreign tensor",
        || other.argmax_rows(&x),
        |e| matches!(e, ComputeError::ForeignTensor { .. }),
    );
    if context.supports(DType::F16) {
        let half = context.tensor_with(&[1.0; 4], &[4], DType::F16).unwrap();
        context.flush().unwrap();
        let mismatch = |e: &ComputeError| matches!(e, ComputeError::DTypeMismatch { .. });
        refused(
            &context,
            "f16 gamma",
            || context.layer_norm(&x, &half, &four, 1e-5),
            mismatch,
        );
        refused(
            &context,
            "f16 ids",
            || context.embedding(&x, &half),
            mismatch,
        );
    }
}

/// The forward the plan test captures: layer norm, causal scaled softmax, argmax, embedding of
/// a table in two blocks.
fn forward(context: &Context, x: &Tensor, ids: &Tensor, weights: &[Tensor; 4]) -> [Tensor; 3] {
    let [gamma, beta, low, high] = weights;
    let normed = context.layer_norm(x, gamma, beta, 1e-5).unwrap();
    let probabilities = context.softmax_rows(&normed, 0.5, Some(1)).unwrap();
    let next = context.argmax_rows(&probabilities).unwrap();
    let embedded = context.embedding_blocks(&[low, high], ids).unwrap();
    [probabilities, next, embedded]
}

#[test]
fn the_transformer_ops_replay_in_a_plan_as_eagerly() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        let mut rng = StdRng::seed_from_u64(31);
        let (rows, cols, vocab, tokens) = (5, 17, 13, 7);
        let weights = [
            context
                .tensor(&random(&mut rng, cols, 0.5, 2.0), &[cols])
                .unwrap(),
            context
                .tensor(&random(&mut rng, cols, -1.0, 1.0), &[cols])
                .unwrap(),
            context
                .tensor(&random(&mut rng, 6 * cols, -1.0, 1.0), &[6, cols])
                .unwrap(),
            context
                .tensor(
                    &random(&mut rng, (vocab - 6) * cols, -1.0, 1.0),
                    &[vocab - 6, cols],
                )
                .unwrap(),
        ];
        let mut capture = context.capture().unwrap();
        let x = capture.input(&[rows, cols]).unwrap();
        let ids = capture.input(&[tokens]).unwrap();
        let outputs = forward(&context, &x, &ids, &weights);
        let mut plan = capture.finish(&outputs.each_ref()).unwrap();
        for round in 0..3 {
            let input = random(&mut rng, rows * cols, -4.0, 4.0);
            let id_values: Vec<f32> = (0..tokens)
                .map(|_| rng.gen_range(0..vocab) as f32)
                .collect();
            let got = plan
                .run(&[Feed::Data(&input), Feed::Data(&id_values)])
                .unwrap();
            let tx = context.tensor(&input, &[rows, cols]).unwrap();
            let tids = context.tensor(&id_values, &[tokens]).unwrap();
            let eager = forward(&context, &tx, &tids, &weights);
            for (index, (replayed, eager)) in got.iter().zip(&eager).enumerate() {
                assert_eq!(
                    replayed,
                    &eager.to_vec().unwrap(),
                    "output {index}, round {round} ({limits})"
                );
            }
            // And the eager ops match their twins.
            let normed = cpu::layer_norm(
                &input,
                &weights[0].to_vec().unwrap(),
                &weights[1].to_vec().unwrap(),
                cols,
                1e-5,
            );
            let expected = cpu::softmax_rows(&normed, cols, rows, 0.5, Some(1));
            assert_close(
                &format!("planned softmax_rows ({limits})"),
                &got[0],
                &expected,
                |i| 1e-4 * f64::from(expected[i]).abs() + 1e-6,
            );
            assert_eq!(
                got[1],
                cpu::argmax_rows(&got[0], cols)
                    .iter()
                    .map(|&i| i as f32)
                    .collect::<Vec<_>>(),
                "planned argmax_rows ({limits})"
            );
            let mut table = weights[2].to_vec().unwrap();
            table.extend(weights[3].to_vec().unwrap());
            assert_same(
                "planned embedding",
                &got[2],
                &cpu::embedding(&table, cols, &id_values),
            );
        }
    }
}

#[test]
fn f16_transformer_ops_match_their_twins() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        if !context.supports(DType::F16) {
            eprintln!("f16 transformer ops: {limits} has no SHADER_F16; f32 only");
            continue;
        }
        let f16 = |values: &[f32]| cpu::rounded(values, DType::F16);
        let ulp = |v: f32| 2f64.powi(-10) * f64::from(v).abs() + 2f64.powi(-14);
        let upload = |values: &[f32], shape: &[usize]| {
            context.tensor_with(values, shape, DType::F16).unwrap()
        };
        let mut rng = StdRng::seed_from_u64(32);
        for (rows, cols) in SHAPES {
            let x = f16(&random(&mut rng, rows * cols, -4.0, 4.0));
            let gamma = f16(&random(&mut rng, cols, 0.5, 2.0));
            let beta = f16(&random(&mut rng, cols, -1.0, 1.0));
            let (tx, tg, tb) = (
                upload(&x, &[rows, cols]),
                upload(&gamma, &[cols]),
                upload(&beta, &[cols]),
            );
            let y = context.layer_norm(&tx, &tg, &tb, 1e-5).unwrap();
            assert_eq!(y.dtype(), DType::F16);
            let expected = f16(&cpu::layer_norm(&x, &gamma, &beta, cols, 1e-5));
            assert_close(
                &format!("f16 layer_norm {rows}x{cols} ({limits})"),
                &y.to_vec().unwrap(),
                &expected,
                |i| layer_norm_tolerance(&expected)(i) + ulp(expected[i]),
            );
            let y = context.softmax_rows(&tx, 0.5, Some(1)).unwrap();
            let expected = f16(&cpu::softmax_rows(&x, cols, rows, 0.5, Some(1)));
            assert_close(
                &format!("f16 softmax_rows {rows}x{cols} ({limits})"),
                &y.to_vec().unwrap(),
                &expected,
                |i| softmax_tolerance(&expected)(i) + ulp(expected[i]),
            );
            let y = context.argmax_rows(&tx).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            assert_eq!(
                context.argmax_rows_ids(&tx).unwrap(),
                cpu::argmax_rows(&x, cols),
                "f16 argmax_rows {rows}x{cols} ({limits})"
            );
            let ids: Vec<u32> = (0..3).map(|_| rng.gen_range(0..rows as u32)).collect();
            let values: Vec<f32> = ids.iter().map(|&id| id as f32).collect();
            let y = context.embedding_ids(&tx, &ids).unwrap();
            assert_eq!(y.dtype(), DType::F16);
            assert_same(
                &format!("f16 embedding {rows}x{cols} ({limits})"),
                &y.to_vec().unwrap(),
                &cpu::embedding(&x, cols, &values),
            );
        }
    }
}

#[test]
fn take_columns_keeps_the_first_columns_of_each_row() {
    for (limits, gpu) in both() {
        for context in contexts(gpu) {
            let mut rng = StdRng::seed_from_u64(31);
            for (rows, cols, take) in [(1, 1, 1), (3, 17, 5), (2, 1000, 999), (4, 300, 300)] {
                let x = random(&mut rng, rows * cols, -4.0, 4.0);
                let tx = context.tensor(&x, &[rows, cols]).unwrap();
                let y = context.take_columns(&tx, take).unwrap();
                assert_eq!(y.shape(), [rows, take]);
                let expected = cpu::take_columns(&x, cols, take);
                assert_same(
                    &format!("take_columns {rows}x{cols} {take} ({limits})"),
                    &y.to_vec().unwrap(),
                    &expected,
                );
            }
            let tx = context.tensor(&[1.0; 12], &[2, 2, 3]).unwrap();
            let y = context.take_columns(&tx, 2).unwrap();
            assert_eq!(y.shape(), [2, 2, 2]);
            for take in [0, 4] {
                assert!(matches!(
                    context.take_columns(&tx, take),
                    Err(ComputeError::InvalidShape { .. })
                ));
            }
        }
    }
}

/// `embedding_sum` (token and position rows added in one gather, ids optionally fed from a
/// previous step's samples) equals its twin bit for bit, in f32 and f16, eager and in a plan,
/// where it is one dispatch (the device takes 8 storage bindings); ids, positions and picks out
/// of range give rows of NaN; bad shapes and types are typed errors.
#[test]
fn embedding_sum_adds_token_and_position_rows_with_fed_ids_as_its_twin() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        let mut rng = StdRng::seed_from_u64(44);
        for dtype in [DType::F32, DType::F16] {
            if !context.supports(dtype) {
                eprintln!("embedding_sum {dtype:?} NOT TESTED on {limits}: no SHADER_F16");
                continue;
            }
            for width in [1, 5, 257] {
                let (vocab, places) = (11, 7);
                let table = cpu::rounded(&random(&mut rng, vocab * width, -4.0, 4.0), dtype);
                let positions_table =
                    cpu::rounded(&random(&mut rng, places * width, -4.0, 4.0), dtype);
                let tt = context.tensor_with(&table, &[vocab, width], dtype).unwrap();
                let tp = context
                    .tensor_with(&positions_table, &[places, width], dtype)
                    .unwrap();
                // Rows: plain ids, fed ids (their host id 0, or an offset), and every kind of
                // index out of range.
                let ids = [3.0, 0.0, 10.0, 0.0, 1.0, 11.0, -1.0, 2.5, 0.0, 0.0, 4.0];
                let positions = [0.0, 6.0, 2.0, 3.0, 1.0, 0.0, 0.0, 0.0, 7.0, 2.0, 1.0];
                let fed = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
                let picks = [0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0, 9.0];
                let previous = [5.0, 10.0, 9.0];
                let n = ids.len();
                let upload = |values: &[f32]| context.tensor(values, &[values.len()]).unwrap();
                let (t_ids, t_pos, t_fed, t_prev, t_picks) = (
                    upload(&ids),
                    upload(&positions),
                    upload(&fed),
                    upload(&previous),
                    upload(&picks),
                );
                let fed_ids = wgpu_pool::compute::FedIds {
                    fed: &t_fed,
                    previous: &t_prev,
                    picks: &t_picks,
                };
                let what = format!("embedding_sum {dtype:?} width {width} ({limits})");
                for with_fed in [false, true] {
                    let expected = cpu::rounded(
                        &cpu::embedding_sum(
                            &table,
                            &positions_table,
                            width,
                            &ids,
                            &positions,
                            with_fed.then_some((&fed[..], &previous[..], &picks[..])),
                        ),
                        dtype,
                    );
                    let y = context
                        .embedding_sum(&tt, &t_ids, &tp, &t_pos, with_fed.then_some(fed_ids))
                        .unwrap();
                    assert_eq!(y.shape(), [n, width]);
                    assert_eq!(y.dtype(), dtype);
                    assert_same(&what, &y.to_vec().unwrap(), &expected);
                    // Rows 5 to 8 (id 11, −1, 2.5; position 7) and, fed, row 9 (pick 3): NaN.
                    let bad =
                        |row: usize| expected[row * width..][..width].iter().all(|v| v.is_nan());
                    assert!((5..9).all(bad), "{what}");
                    assert_eq!(bad(9), with_fed, "{what}");
                    assert!(!bad(1) && !bad(10), "{what}");
                }
                // Captured: one dispatch where the device takes 8 storage bindings.
                let mut capture = context.capture().unwrap();
                let inputs: Vec<Tensor> = (0..4).map(|_| capture.input(&[n]).unwrap()).collect();
                let prev = capture.input(&[previous.len()]).unwrap();
                let y = context
                    .embedding_sum(
                        &tt,
                        &inputs[0],
                        &tp,
                        &inputs[1],
                        Some(wgpu_pool::compute::FedIds {
                            fed: &inputs[2],
                            previous: &prev,
                            picks: &inputs[3],
                        }),
                    )
                    .unwrap();
                let mut plan = capture.finish(&[&y]).unwrap();
                if context.limits().max_storage_buffers_per_shader_stage >= 8 {
                    assert_eq!(plan.stats().steps, 1, "{what}");
                }
                let out = plan
                    .run(&[
                        Feed::Data(&ids),
                        Feed::Data(&positions),
                        Feed::Data(&fed),
                        Feed::Data(&picks),
                        Feed::Data(&previous),
                    ])
                    .unwrap();
                let expected = cpu::rounded(
                    &cpu::embedding_sum(
                        &table,
                        &positions_table,
                        width,
                        &ids,
                        &positions,
                        Some((&fed[..], &previous[..], &picks[..])),
                    ),
                    dtype,
                );
                assert_same(&format!("{what}, planned"), &out[0], &expected);
            }
        }
        // Typed errors.
        let table = context.tensor(&[0.0; 12], &[4, 3]).unwrap();
        let narrow = context.tensor(&[0.0; 8], &[4, 2]).unwrap();
        let ids = context.tensor(&[0.0, 1.0], &[2]).unwrap();
        let three = context.tensor(&[0.0, 1.0, 2.0], &[3]).unwrap();
        assert!(matches!(
            context.embedding_sum(&table, &ids, &narrow, &ids, None),
            Err(ComputeError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            context.embedding_sum(&table, &ids, &table, &three, None),
            Err(ComputeError::ShapeMismatch { .. })
        ));
        let flat = context.tensor(&[0.0; 12], &[12]).unwrap();
        assert!(matches!(
            context.embedding_sum(&flat, &ids, &table, &ids, None),
            Err(ComputeError::InvalidShape { .. })
        ));
    }
}
