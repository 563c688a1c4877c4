//! The twins' names against the kernels' entry points, and the twins that no GPU test reaches
//! (no GPU).

use super::*;
use crate::compute::kernels::module_source;
use crate::compute::types::{CoopTiles, ElementTypes, MatmulTiles, Source, Variant};

/// Entry points without a twin of their name, each with its reason.
const EXCEPTIONS: [(&str, &str); 7] = [
    (
        "exp_kernel",
        "WGSL's builtin `exp` cannot be both called and shadowed: the twin is `exp`",
    ),
    (
        "sqrt_kernel",
        "WGSL's builtin `sqrt` cannot be both called and shadowed: the twin is `sqrt`",
    ),
    (
        "matmul_narrow",
        "the same product as `matmul` for few rows (another kernel, not another formula): the \
         twin is `matmul` / `matmul_with`, and with its layer-norm prologue `matmul_layer_norm`",
    ),
    (
        "matmul_coop",
        "the same product as `matmul` on cooperative matrices (f16 operands, f32 sums): the \
         twin is `matmul` / `matmul_with` on the f16-rounded operands",
    ),
    (
        "paged_attention_combine",
        "the second pass of `paged_attention_decode` where a sequence's tokens are split over \
         several workgroups (it adds their partial softmax records): the twin is \
         `paged_attention_decode`",
    ),
    (
        "argmax_rows_partial",
        "the first pass of `argmax_rows` over rows of more than 2,048 columns (each part's first \
         largest value and index): the twin is `argmax_rows`",
    ),
    (
        "argmax_rows_combine",
        "the second pass of `argmax_rows` over rows of more than 2,048 columns (the parts' \
         records reduced): the twin is `argmax_rows`",
    ),
];

/// One variant of every source, so that every kernel module is written whole: the generated
/// entry points (`matmul`, `matmul_narrow`) are in its text only.
fn every_source() -> Vec<(Source, Variant)> {
    let sources = [
        Source::Unary,
        Source::Binary,
        Source::Matmul,
        Source::MatmulNarrow,
        Source::MatmulReduce,
        Source::MatmulCoop,
        Source::Rows,
        Source::LayerNorm,
        Source::AddLayerNorm,
        Source::SoftmaxRows,
        Source::Embedding,
        Source::EmbeddingSum,
        Source::ArgmaxRows,
        Source::KvWrite,
        Source::KvWriteQkv,
        Source::PagedAttention,
        Source::PagedAttentionVec4,
    ];
    sources
        .into_iter()
        .map(|source| {
            // Exhaustive: a new source must be listed above.
            let variant = match source {
                Source::Unary
                | Source::Binary
                | Source::Rows
                | Source::LayerNorm
                | Source::AddLayerNorm
                | Source::SoftmaxRows
                | Source::Embedding
                | Source::EmbeddingSum
                | Source::ArgmaxRows
                | Source::KvWrite
                | Source::KvWriteQkv
                | Source::PagedAttention
                | Source::PagedAttentionVec4 => Variant::Plain,
                Source::Matmul => Variant::Matmul {
                    tiles: MatmulTiles::T64X64X8,
                    group_rows: 8,
                    vec4: true,
                    edges: false,
                    bias: false,
                    activation: Activation::None,
                    residual: false,
                    linear_grid: false,
                },
                Source::MatmulNarrow => Variant::Narrow {
                    rows: 1,
                    lanes: 4,
                    subgroup: 0,
                    split: false,
                    bias: false,
                    activation: Activation::None,
                    residual: false,
                    norm: false,
                },
                Source::MatmulReduce => Variant::Reduce {
                    bias: false,
                    activation: Activation::None,
                    residual: false,
                },
                Source::MatmulCoop => Variant::Coop {
                    tiles: CoopTiles::T64X64,
                    vec4: true,
                    bias: false,
                    activation: Activation::None,
                    residual: false,
                    probe: None,
                },
            };
            (source, variant)
        })
        .collect()
}

/// The names of the functions declared `@compute` in `text`.
fn entry_points(text: &str) -> Vec<String> {
    text.split("@compute")
        .skip(1)
        .filter_map(|rest| {
            let after = &rest[rest.find("fn ")? + 3..];
            Some(after[..after.find('(')?].trim().to_owned())
        })
        .collect()
}

#[test]
fn every_entry_point_has_a_cpu_twin_of_its_name_or_a_reason() {
    let twins: Vec<String> = include_str!("../cpu.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("pub fn "))
        .filter_map(|rest| rest.split(['(', '<']).next())
        .map(str::to_owned)
        .collect();
    let mut entries = Vec::new();
    for (source, variant) in every_source() {
        entries.extend(entry_points(&module_source(
            source,
            &variant,
            ElementTypes::F32,
        )));
    }
    // Every kind of kernel is seen: the generated entry points as well as the files'.
    for expected in [
        "matmul",
        "matmul_narrow",
        "matmul_reduce",
        "matmul_coop",
        "add",
        "relu",
        "softmax",
        "layer_norm",
        "softmax_rows",
        "embedding",
        "argmax_rows",
        "kv_write",
        "paged_attention_decode",
        "paged_attention_combine",
    ] {
        assert!(
            entries.iter().any(|e| e == expected),
            "{expected}: {entries:?}"
        );
    }
    assert!(entries.len() >= 22, "{entries:?}");
    for entry in &entries {
        let excepted = EXCEPTIONS.iter().any(|(name, _)| name == entry);
        let twinned = twins.contains(entry);
        assert!(
            twinned || excepted,
            "kernel {entry} has no CPU twin of its name in src/compute/cpu.rs and no listed reason"
        );
        assert!(
            !(twinned && excepted),
            "{entry} has a twin: drop its exception"
        );
    }
    for (name, _) in EXCEPTIONS {
        assert!(
            entries.iter().any(|e| e == name),
            "exception {name} names no kernel"
        );
    }
}

#[test]
fn the_reduction_twin_adds_split_products_and_runs_the_epilogue() {
    let (m, k, n, splits) = (3, 8, 5, 4);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
    let bias: Vec<f32> = (0..n).map(|i| i as f32 - 2.0).collect();
    // Split K in `splits` chunks of 2: each chunk's product, one after another.
    let chunk = k / splits;
    let mut partials = Vec::new();
    for s in 0..splits {
        let a_chunk: Vec<f32> = (0..m)
            .flat_map(|row| a[row * k + s * chunk..row * k + (s + 1) * chunk].to_vec())
            .collect();
        let b_chunk = &b[s * chunk * n..(s + 1) * chunk * n];
        partials.extend(matmul(&a_chunk, b_chunk, m, chunk, n));
    }
    // The scratch may be longer than the partials.
    partials.extend([f32::NAN; 3]);
    let residual: Vec<f32> = (0..m * n).map(|i| (i % 3) as f32 * 0.25).collect();
    for activation in Activation::ALL {
        for residual in [None, Some(&residual[..])] {
            let epilogue = Epilogue {
                bias: Some(&bias),
                activation,
                residual,
            };
            let reduced = matmul_reduce(&partials, splits, m, n, epilogue);
            let whole = matmul_with(&a, &b, m, k, n, epilogue);
            assert_eq!(reduced, whole, "{activation:?}");
            // The residual is added after the activation.
            let without = matmul_with(
                &a,
                &b,
                m,
                k,
                n,
                Epilogue {
                    residual: None,
                    ..epilogue
                },
            );
            let added: Vec<f32> = match residual {
                Some(r) => without.iter().zip(r).map(|(x, r)| x + r).collect(),
                None => without,
            };
            assert_eq!(whole, added, "{activation:?}");
        }
    }
    // The layer norm's product is the product of the layer norm.
    let (gamma, beta): (Vec<f32>, Vec<f32>) = (0..k).map(|i| (1.0 + i as f32 * 0.1, -0.5)).unzip();
    let epilogue = Epilogue {
        bias: Some(&bias),
        ..Epilogue::default()
    };
    assert_eq!(
        matmul_layer_norm(&a, &gamma, &beta, 1e-5, &b, (m, k, n), epilogue),
        matmul_with(
            &layer_norm(&a, &gamma, &beta, k, 1e-5),
            &b,
            m,
            k,
            n,
            epilogue
        )
    );
    // The scalar twins are the binary ones with a scalar.
    let x = [1.5, -2.0, 0.0];
    assert_eq!(add_scalar(&x, 2.0), [3.5, 0.0, 2.0]);
    assert_eq!(sub_scalar(&x, 2.0), [-0.5, -4.0, -2.0]);
    assert_eq!(mul_scalar(&x, 2.0), [3.0, -4.0, 0.0]);
    assert_eq!(div_scalar(&x, 2.0), [0.75, -1.0, 0.0]);
    assert_eq!(maximum_scalar(&x, 1.0), [1.5, 1.0, 1.0]);
}
