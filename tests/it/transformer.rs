//! The transformer ops (layer norm, the layer norm folded into a product, the scaled and causal
//! softmax, the embedding gather, argmax) against their CPU twins on odd shapes, in f32 and f16,
//! eager and replayed in a plan, and their typed errors. Every test runs on the backend
//! `WGPU_BACKEND` selects.
//!
//! Tolerances (the twins compute in f64):
//! - layer_norm: 2e−5·(|cpu| + 1) (two f32 reductions of at most a few thousand terms, then a
//!   division by the standard deviation);
//! - softmax_rows: 1e−5·|cpu| + 1e−7, as `softmax` (masked columns exactly 0);
//! - embedding, argmax_rows: exact (a copy; a comparison);
//! - matmul_layer_norm (the layer norm folded into the narrow product): the layer norm's bound
//!   carried through the product plus the product's (see `check_matmul_layer_norm`), the fused
//!   op and the unfused ops each against the twin;
//! - f16: on top, one f16 ulp and the smallest normal f16 (see `f16.rs`).

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::compute::{
    cpu, Activation, ComputeError, Context, ContextOptions, DType, Epilogue, Feed, MatmulOptions,
    Tensor,
};

use crate::compute::{assert_close, context_with, contexts, random, refused, storage_tolerance, U};
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

/// The epilogues `matmul_layer_norm` is checked with: `(bias, activation, residual)`.
pub(crate) const LN_EPILOGUES: [(bool, Activation, bool); 5] = [
    (false, Activation::None, false),
    (true, Activation::None, false),
    (true, Activation::Gelu, false),
    (true, Activation::None, true),
    (false, Activation::Gelu, true),
];

/// The dispatches `matmul_layer_norm` records for `[m, k] · [k, n]` of `dtype` on `context`: one
/// where the narrow kernel runs (the layer norm its prologue), else the layer norm and the
/// product; one more where K is split (the reduction).
pub(crate) fn layer_norm_product_dispatches(
    context: &Context,
    dtype: DType,
    (m, k, n): Shape,
) -> u64 {
    let plan = context.matmul_plan_for(dtype, m, n, k).unwrap();
    let narrow = plan.narrow_lanes > 0 && plan.cooperative.is_none();
    u64::from(!narrow) + 1 + u64::from(plan.splits > 1)
}

pub(crate) type Shape = (usize, usize, usize);

/// `matmul_layer_norm(x, gamma, beta, eps, w, epilogue)` of random operands of `dtype` against
/// the unfused ops (`layer_norm`, then `matmul_with`) and the twin (`cpu::layer_norm` of the
/// same values, rounded to `dtype` as the layer norm stores it, then `cpu::matmul_with`, rounded
/// to `dtype`); returns the dispatches the fused op recorded.
///
/// Tolerance of element (i, j) against the twin, both results: the layer norm's (2e−5·(|h|+1)
/// per normalized value, as the layer-norm tests allow, plus where `dtype` is f16 an f16 ulp of
/// it, which the kernel may round to the other side: each carried through the product,
/// Σ_k (2e−5·(|h_k|+1) + ulp(h_k))·|w_kj|) and the product's (2K·u·Σ_k |h_k·w_kj| + 2u·|c|: a
/// K-term f32 dot product in any order), ×1.2 through a GELU (its slope stays below 1.13) plus
/// GELU's own 1e−5·|c| + 1e−6; u·|c| more for the residual's add; and an f16 ulp of C. The fused
/// op and the unfused ops, each within that of the twin, are within twice it of each other.
pub(crate) fn check_matmul_layer_norm(
    context: &Context,
    what: &str,
    (m, k, n): Shape,
    eps: f32,
    (bias, activation, residual): (bool, Activation, bool),
    dtype: DType,
    rng: &mut StdRng,
) -> u64 {
    let values =
        |rng: &mut StdRng, len, low, high| cpu::rounded(&random(rng, len, low, high), dtype);
    let x = values(rng, m * k, -4.0, 4.0);
    let gamma = values(rng, k, 0.5, 2.0);
    let beta = values(rng, k, -1.0, 1.0);
    let w = values(rng, k * n, -1.0, 1.0);
    let bias_values = values(rng, n, -1.0, 1.0);
    let residual_values = values(rng, m * n, -2.0, 2.0);
    let tensor =
        |values: &[f32], shape: &[usize]| context.tensor_with(values, shape, dtype).unwrap();
    let (tx, tg, tb, tw) = (
        tensor(&x, &[m, k]),
        tensor(&gamma, &[k]),
        tensor(&beta, &[k]),
        tensor(&w, &[k, n]),
    );
    let (tbias, tresidual) = (
        tensor(&bias_values, &[n]),
        tensor(&residual_values, &[m, n]),
    );
    let epilogue = Epilogue {
        bias: bias.then_some(&tbias),
        activation,
        residual: residual.then_some(&tresidual),
    };
    let before = context.stats().dispatches;
    let fused = context
        .matmul_layer_norm(&tx, &tg, &tb, eps, &tw, epilogue)
        .unwrap();
    let dispatches = context.stats().dispatches - before;
    assert_eq!(
        (fused.shape(), fused.dtype()),
        (&[m, n][..], dtype),
        "{what}"
    );
    let fused = fused.to_vec().unwrap();
    let normalized = context.layer_norm(&tx, &tg, &tb, eps).unwrap();
    let unfused = context
        .matmul_with(&normalized, &tw, epilogue)
        .unwrap()
        .to_vec()
        .unwrap();
    let h = cpu::rounded(&cpu::layer_norm(&x, &gamma, &beta, k, eps), dtype);
    let twin = cpu::Epilogue {
        bias: bias.then_some(&bias_values[..]),
        activation,
        residual: residual.then_some(&residual_values[..]),
    };
    let expected = cpu::rounded(&cpu::matmul_with(&h, &w, m, k, n, twin), dtype);
    let tolerance = |index: usize| {
        let (row, col) = (index / n, index % n);
        let c = f64::from(expected[index]).abs();
        let (mut carried, mut magnitude) = (0.0, 0.0);
        for i in 0..k {
            let (h, w) = (h[row * k + i], f64::from(w[i * n + col]).abs());
            let normalized = 2e-5 * (f64::from(h).abs() + 1.0) + storage_tolerance(dtype, h);
            carried += normalized * w;
            magnitude += f64::from(h).abs() * w;
        }
        let mut bound = carried + 2.0 * k as f64 * U * magnitude + 2.0 * U * c;
        if activation == Activation::Gelu {
            bound = 1.2 * bound + 1e-5 * c + 1e-6;
        }
        if residual {
            bound += U * c;
        }
        bound + storage_tolerance(dtype, expected[index])
    };
    let what = format!(
        "{what} {m}x{k}x{n} eps {eps} bias {bias} {activation:?} residual {residual} {dtype}"
    );
    assert_close(&format!("{what}: fused"), &fused, &expected, tolerance);
    assert_close(&format!("{what}: unfused"), &unfused, &expected, tolerance);
    assert_close(
        &format!("{what}: fused and unfused"),
        &fused,
        &unfused,
        |i| 2.0 * tolerance(i),
    );
    dispatches
}

#[test]
fn matmul_layer_norm_matches_the_unfused_ops_and_its_twin() {
    // Few rows (the narrow kernel, the layer norm its prologue) at GPT-2's width and a small
    // one; and where the narrow kernel does not run: N not a multiple of 4, more than 16 rows.
    let shapes = [
        (1, 64, 36),
        (3, 64, 36),
        (8, 768, 64),
        (16, 768, 36),
        (16, 64, 30),
        (20, 64, 36),
    ];
    for (index, (limits, gpu)) in both().into_iter().enumerate() {
        let context = context_with(gpu, ContextOptions::default());
        let mut rng = StdRng::seed_from_u64(44);
        for &(m, k, n) in &shapes {
            // Under the default limits, two epilogues only.
            let epilogues = if index == 0 {
                &LN_EPILOGUES[..]
            } else {
                &LN_EPILOGUES[2..4]
            };
            for (e, &epilogue) in epilogues.iter().enumerate() {
                // A large eps once (it changes the result by percents: it is honoured).
                let eps = if e == 0 { 0.5 } else { 1e-5 };
                let what = format!("matmul_layer_norm ({limits})");
                let dispatches = check_matmul_layer_norm(
                    &context,
                    &what,
                    (m, k, n),
                    eps,
                    epilogue,
                    DType::F32,
                    &mut rng,
                );
                let expected = layer_norm_product_dispatches(&context, DType::F32, (m, k, n));
                assert_eq!(dispatches, expected, "{what} {m}x{k}x{n}");
                // One dispatch exactly where the narrow kernel runs unsplit.
                let narrow = m <= 16 && n % 4 == 0;
                assert_eq!(expected == 1, narrow, "{what} {m}x{k}x{n}");
            }
        }
    }
}

#[test]
fn matmul_layer_norm_splits_k_groups_rows_and_adds_by_subgroups() {
    let gpu = crate::gpu::gpu();
    let info = &gpu.info;
    let fixed = gpu.device.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size == info.subgroup_max_size;
    let mut rng = StdRng::seed_from_u64(45);
    // (lanes, splits, groups of rows, subgroups, shapes)
    type Case = (Option<u32>, u32, u32, bool, &'static [Shape]);
    let cases: [Case; 6] = [
        (None, 3, 1, true, &[(3, 768, 36), (16, 768, 64)]),
        (Some(4), 2, 2, true, &[(8, 768, 36), (16, 64, 64)]),
        (Some(16), 1, 4, true, &[(16, 64, 64), (8, 772, 12)]),
        (Some(1), 1, 1, true, &[(16, 768, 12), (5, 64, 8)]),
        (Some(2), 4, 1, true, &[(4, 768, 8), (1, 64, 4)]),
        (Some(1), 2, 1, false, &[(16, 768, 12), (3, 64, 8)]),
    ];
    for (lanes, splits, groups, subgroups, shapes) in cases {
        let context = context_with(
            gpu,
            ContextOptions {
                matmul: MatmulOptions {
                    narrow_lanes: lanes,
                    narrow_splits: Some(splits),
                    narrow_row_groups: Some(groups),
                    narrow_subgroups: subgroups,
                    ..MatmulOptions::default()
                },
                ..ContextOptions::unchecked()
            },
        );
        for (index, &(m, k, n)) in shapes.iter().enumerate() {
            let plan = context.matmul_plan(m, n, k).unwrap();
            assert!(plan.narrow_lanes > 0, "{plan:?}");
            assert_eq!(plan.splits > 1, splits > 1, "{plan:?}");
            let expected_groups = if m % groups as usize == 0 { groups } else { 1 };
            assert_eq!(plan.narrow_row_groups, expected_groups, "{plan:?}");
            let by_subgroups = subgroups && fixed && info.subgroup_min_size > plan.narrow_lanes;
            assert_eq!(plan.narrow_subgroup > 0, by_subgroups, "{plan:?}");
            let epilogue = LN_EPILOGUES[if index == 0 { 4 } else { 3 }];
            let what = format!(
                "matmul_layer_norm lanes {lanes:?} splits {splits} groups {groups} subgroup {}",
                plan.narrow_subgroup
            );
            let dispatches = check_matmul_layer_norm(
                &context,
                &what,
                (m, k, n),
                1e-5,
                epilogue,
                DType::F32,
                &mut rng,
            );
            assert_eq!(dispatches, 1 + u64::from(plan.splits > 1), "{what}");
        }
    }
}

/// A transformer layer's `x = x + proj(attended); f = gelu(LN(x) · W_fc + b_fc)`, the way the
/// issue asks (`residual`: the residual in the projection's epilogue, the layer norm the fc
/// product's prologue), or the way before (the projection with its bias, then `add`,
/// `layer_norm` and the fc product). Returns `[x, f]`.
fn layer(
    context: &Context,
    x: &Tensor,
    attended: &Tensor,
    weights: &[Tensor; 6],
    residual: bool,
) -> [Tensor; 2] {
    let [w_proj, b_proj, gamma, beta, w_fc, b_fc] = weights;
    let fc = Epilogue {
        bias: Some(b_fc),
        activation: Activation::Gelu,
        ..Default::default()
    };
    if residual {
        let proj = Epilogue {
            bias: Some(b_proj),
            residual: Some(x),
            ..Default::default()
        };
        let x = context.matmul_with(attended, w_proj, proj).unwrap();
        let f = context
            .matmul_layer_norm(&x, gamma, beta, 1e-5, w_fc, fc)
            .unwrap();
        return [x, f];
    }
    let proj = Epilogue {
        bias: Some(b_proj),
        ..Default::default()
    };
    let projected = context.matmul_with(attended, w_proj, proj).unwrap();
    let x = context.add(x, &projected).unwrap();
    let h = context.layer_norm(&x, gamma, beta, 1e-5).unwrap();
    let f = context.matmul_with(&h, w_fc, fc).unwrap();
    [x, f]
}

#[test]
fn a_transformer_layer_runs_in_two_dispatches_planned_and_eagerly() {
    for (limits, gpu) in both() {
        let context = context_with(gpu, ContextOptions::default());
        let mut rng = StdRng::seed_from_u64(46);
        let (e, hidden) = (64, 256);
        let weights = [
            context
                .tensor(&random(&mut rng, e * e, -0.2, 0.2), &[e, e])
                .unwrap(),
            context
                .tensor(&random(&mut rng, e, -0.5, 0.5), &[e])
                .unwrap(),
            context
                .tensor(&random(&mut rng, e, 0.5, 2.0), &[e])
                .unwrap(),
            context
                .tensor(&random(&mut rng, e, -1.0, 1.0), &[e])
                .unwrap(),
            context
                .tensor(&random(&mut rng, e * hidden, -0.2, 0.2), &[e, hidden])
                .unwrap(),
            context
                .tensor(&random(&mut rng, hidden, -0.5, 0.5), &[hidden])
                .unwrap(),
        ];
        let host: Vec<Vec<f32>> = weights.iter().map(|t| t.to_vec().unwrap()).collect();
        // 16 rows: a decode step of the narrow kernel; 20: the tiled kernel.
        for (rows, new_steps, old_steps) in [(16, 2, 3), (20, 3, 3)] {
            for residual in [true, false] {
                let mut capture = context.capture().unwrap();
                let x = capture.input(&[rows, e]).unwrap();
                let attended = capture.input(&[rows, e]).unwrap();
                let outputs = layer(&context, &x, &attended, &weights, residual);
                let mut plan = capture.finish(&outputs.each_ref()).unwrap();
                let steps = if residual { new_steps } else { old_steps };
                let what = format!("{rows} rows, residual epilogue {residual} ({limits})");
                // Before: the projection, the add joined to the layer norm, the fc product.
                assert_eq!(plan.stats().steps, steps, "{what}: {:?}", plan.stats());
                for round in 0..2 {
                    let x_values = random(&mut rng, rows * e, -2.0, 2.0);
                    let attended_values = random(&mut rng, rows * e, -1.0, 1.0);
                    let got = plan
                        .run(&[Feed::Data(&x_values), Feed::Data(&attended_values)])
                        .unwrap();
                    let tx = context.tensor(&x_values, &[rows, e]).unwrap();
                    let ta = context.tensor(&attended_values, &[rows, e]).unwrap();
                    let before = context.stats().dispatches;
                    let eager = layer(&context, &tx, &ta, &weights, residual);
                    if residual {
                        assert_eq!(context.stats().dispatches - before, steps as u64, "{what}");
                    }
                    let eager: Vec<Vec<f32>> = eager.iter().map(|t| t.to_vec().unwrap()).collect();
                    if residual {
                        // A replay computes the eager ops' bits (no fusion applies).
                        assert_eq!(got, eager, "{what}, round {round}");
                    }
                    // x against its twin: the product's bound and the residual's add.
                    let epilogue = cpu::Epilogue {
                        bias: Some(&host[1]),
                        activation: Activation::None,
                        residual: Some(&x_values),
                    };
                    let x_twin = cpu::matmul_with(&attended_values, &host[0], rows, e, e, epilogue);
                    let magnitude = cpu::matmul_magnitude(&attended_values, &host[0], rows, e, e);
                    assert_close(&format!("{what}: x"), &got[0], &x_twin, |i| {
                        let c = f64::from(x_twin[i]).abs();
                        2.0 * e as f64 * U * f64::from(magnitude[i]) + 3.0 * U * c
                    });
                    // f against the twin of the GPU's x: the layer norm's and the product's bounds.
                    let f_twin = cpu::matmul_layer_norm(
                        &got[0],
                        &host[2],
                        &host[3],
                        1e-5,
                        &host[4],
                        (rows, e, hidden),
                        cpu::Epilogue {
                            bias: Some(&host[5]),
                            activation: Activation::Gelu,
                            residual: None,
                        },
                    );
                    let h = cpu::layer_norm(&got[0], &host[2], &host[3], e, 1e-5);
                    assert_close(&format!("{what}: f"), &got[1], &f_twin, |i| {
                        let (row, col) = (i / hidden, i % hidden);
                        let c = f64::from(f_twin[i]).abs();
                        let (mut carried, mut magnitude) = (0.0, 0.0);
                        for k in 0..e {
                            let (h, w) = (
                                f64::from(h[row * e + k]).abs(),
                                f64::from(host[4][k * hidden + col]).abs(),
                            );
                            carried += 2e-5 * (h + 1.0) * w;
                            magnitude += h * w;
                        }
                        1.2 * (carried + 2.0 * e as f64 * U * magnitude + 2.0 * U * c)
                            + 1e-5 * c
                            + 1e-6
                    });
                }
            }
        }
        // Where the narrow kernel does not run, `matmul_layer_norm` records the layer norm, and
        // a plan joins the residual add before it to that layer norm, as before.
        let rows = 20;
        let mut capture = context.capture().unwrap();
        let x = capture.input(&[rows, e]).unwrap();
        let r = capture.input(&[rows, e]).unwrap();
        let sum = context.add(&x, &r).unwrap();
        let fc = Epilogue {
            bias: Some(&weights[5]),
            ..Default::default()
        };
        let f = context
            .matmul_layer_norm(&sum, &weights[2], &weights[3], 1e-5, &weights[4], fc)
            .unwrap();
        let plan = capture.finish(&[&sum, &f]).unwrap();
        assert_eq!(plan.stats().recorded_steps, 3, "{:?}", plan.stats());
        assert_eq!(
            plan.stats().steps,
            2,
            "the add joined to the layer norm ({limits})"
        );
    }
}

#[test]
fn matmul_layer_norm_refuses_bad_operands_with_typed_errors() {
    let context = context_with(crate::gpu::gpu(), ContextOptions::default());
    let (m, k, n) = (3, 8, 4);
    let x = context.tensor(&vec![1.0; m * k], &[m, k]).unwrap();
    let w = context.tensor(&vec![1.0; k * n], &[k, n]).unwrap();
    let gamma = context.tensor(&[1.0; 8], &[k]).unwrap();
    let beta = context.tensor(&[0.0; 8], &[k]).unwrap();
    let short = context.tensor(&[1.0; 7], &[7]).unwrap();
    let bias = context.tensor(&[0.0; 4], &[n]).unwrap();
    let wrong_residual = context.tensor(&[0.0; 12], &[n, m]).unwrap();
    let flat_residual = context.tensor(&[0.0; 12], &[m * n]).unwrap();
    let shape_error = |op: &'static str| move |error: &ComputeError| matches!(error, ComputeError::ShapeMismatch { op: got, .. } if *got == op);
    const OP: &str = "matmul_layer_norm";
    refused(
        &context,
        "short gamma",
        || context.matmul_layer_norm(&x, &short, &beta, 1e-5, &w, Epilogue::default()),
        shape_error(OP),
    );
    refused(
        &context,
        "short beta",
        || context.matmul_layer_norm(&x, &gamma, &short, 1e-5, &w, Epilogue::default()),
        shape_error(OP),
    );
    refused(
        &context,
        "w of other rows",
        || {
            context.matmul_layer_norm(
                &x,
                &gamma,
                &beta,
                1e-5,
                &bias.clone().reshape(&[4, 1]).unwrap(),
                Epilogue::default(),
            )
        },
        shape_error(OP),
    );
    refused(
        &context,
        "x of three dimensions",
        || {
            context.matmul_layer_norm(
                &x.clone().reshape(&[1, m, k]).unwrap(),
                &gamma,
                &beta,
                1e-5,
                &w,
                Epilogue::default(),
            )
        },
        shape_error(OP),
    );
    for residual in [&wrong_residual, &flat_residual] {
        let epilogue = Epilogue {
            residual: Some(residual),
            ..Default::default()
        };
        refused(
            &context,
            "a residual of another shape",
            || context.matmul_layer_norm(&x, &gamma, &beta, 1e-5, &w, epilogue),
            shape_error(OP),
        );
        refused(
            &context,
            "a residual of another shape (matmul)",
            || context.matmul_with(&x, &w, epilogue),
            shape_error("matmul"),
        );
    }
    let short_bias = Epilogue {
        bias: Some(&short),
        ..Default::default()
    };
    refused(
        &context,
        "a bias of another length",
        || context.matmul_layer_norm(&x, &gamma, &beta, 1e-5, &w, short_bias),
        shape_error(OP),
    );
    for eps in [f32::NAN, -1.0, f32::INFINITY] {
        refused(
            &context,
            "eps",
            || context.matmul_layer_norm(&x, &gamma, &beta, eps, &w, Epilogue::default()),
            |error| {
                matches!(
                    error,
                    ComputeError::InvalidScalar {
                        op: OP,
                        what: "eps",
                        ..
                    }
                )
            },
        );
    }
    if context.supports(DType::F16) {
        let half = |t: &Tensor| context.cast(t, DType::F16).unwrap();
        let (x16, gamma16, residual16) = (
            half(&x),
            half(&gamma),
            half(&context.tensor(&[0.0; 12], &[m, n]).unwrap()),
        );
        let mismatch = |error: &ComputeError| matches!(error, ComputeError::DTypeMismatch { .. });
        refused(
            &context,
            "f16 gamma",
            || context.matmul_layer_norm(&x, &gamma16, &beta, 1e-5, &w, Epilogue::default()),
            mismatch,
        );
        refused(
            &context,
            "f16 x",
            || context.matmul_layer_norm(&x16, &gamma, &beta, 1e-5, &w, Epilogue::default()),
            mismatch,
        );
        let epilogue = Epilogue {
            residual: Some(&residual16),
            ..Default::default()
        };
        refused(
            &context,
            "f16 residual",
            || context.matmul_layer_norm(&x, &gamma, &beta, 1e-5, &w, epilogue),
            mismatch,
        );
        refused(
            &context,
            "f16 residual (matmul)",
            || context.matmul_with(&x, &w, epilogue),
            mismatch,
        );
    }
    // A tensor of another context.
    let other = context_with(crate::gpu::gpu(), ContextOptions::default());
    let foreign = other.tensor(&[1.0; 8], &[k]).unwrap();
    refused(
        &context,
        "a foreign gamma",
        || context.matmul_layer_norm(&x, &foreign, &beta, 1e-5, &w, Epilogue::default()),
        |error| matches!(error, ComputeError::ForeignTensor { .. }),
    );
}

/// On a device that binds fewer storage buffers per stage than the fused kernels take (WebGPU
/// allows 8, the narrow kernel with a residual and a layer-norm prologue takes 7), the ops give
/// the same results through the unfused ones: the residual by an `add` after the product where
/// the product's kernel cannot bind it, the layer norm before the product where the prologue's
/// kernel cannot bind everything.
#[test]
fn a_device_that_binds_fewer_buffers_runs_the_unfused_ops() {
    use crate::compute::check_matmul_epilogue;
    let shared = crate::gpu::gpu();
    let adapter = shared
        .adapter
        .as_ref()
        .expect("request_gpu keeps its adapter");
    let mut rng = StdRng::seed_from_u64(47);
    // (storage buffers per stage; dispatches of matmul_with with a residual, of matmul_layer_norm
    // without and with one), for a narrow product of 8 rows.
    for (buffers, residual, norm, both) in [(6, 1, 1, 2), (5, 1, 2, 2), (4, 2, 2, 3)] {
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("fewer storage buffers"),
            required_features: shared.device.features(),
            required_limits: wgpu::Limits {
                max_storage_buffers_per_shader_stage: buffers,
                ..adapter.limits()
            },
            ..Default::default()
        }))
        .expect("a device of fewer storage buffers");
        let gpu = wgpu_pool::Gpu::from_device(device, queue);
        let context = context_with(&gpu, ContextOptions::default());
        let what = format!("{buffers} storage buffers");
        let shape = (8, 64, 36);
        let with_residual = (true, Activation::Gelu, true);
        let dispatches =
            check_matmul_epilogue(&context, &what, shape, with_residual, DType::F32, &mut rng);
        assert_eq!(dispatches, residual, "{what}: matmul_with");
        for (epilogue, expected) in [(LN_EPILOGUES[2], norm), (LN_EPILOGUES[3], both)] {
            let dispatches = check_matmul_layer_norm(
                &context,
                &what,
                shape,
                1e-5,
                epilogue,
                DType::F32,
                &mut rng,
            );
            assert_eq!(
                dispatches, expected,
                "{what}: matmul_layer_norm {epilogue:?}"
            );
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
