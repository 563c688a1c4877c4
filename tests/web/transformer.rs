//! A transformer's ops in a browser against their CPU twins: softmax over rows (scaled,
//! causal), layer norm, embedding, argmax, and the paged KV cache's write and decode attention.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::cpu::{self, KvLayout};

use crate::support::{assert_close, context, values};

#[wasm_bindgen_test]
async fn softmax_rows_scaled_and_causal_matches_its_twin() {
    let context = context().await;
    let (heads, queries, cols) = (3, 7, 11);
    let x = values(21, heads * queries * cols, -8.0, 8.0);
    let tx = context.tensor(&x, &[heads, queries, cols]).unwrap();
    for (scale, causal) in [(1.0, None), (0.125, Some(4)), (0.5, Some(0))] {
        let got = context
            .softmax_rows(&tx, scale, causal)
            .unwrap()
            .to_vec_async()
            .await
            .unwrap();
        let expected = cpu::softmax_rows(&x, cols, queries, scale, causal);
        assert_close(
            &format!("softmax_rows {scale} {causal:?}"),
            &got,
            &expected,
            1e-5,
        );
    }
}

#[wasm_bindgen_test]
async fn layer_norm_matches_its_twin() {
    let context = context().await;
    for (rows, cols) in [(5, 768), (9, 37), (1, 1024)] {
        let x = values(rows as u64, rows * cols, -3.0, 5.0);
        let gamma = values(31, cols, 0.5, 1.5);
        let beta = values(32, cols, -0.5, 0.5);
        let tx = context.tensor(&x, &[rows, cols]).unwrap();
        let tg = context.tensor(&gamma, &[cols]).unwrap();
        let tb = context.tensor(&beta, &[cols]).unwrap();
        let got = context
            .layer_norm(&tx, &tg, &tb, 1e-5)
            .unwrap()
            .to_vec_async()
            .await
            .unwrap();
        assert_close(
            &format!("layer_norm {rows}x{cols}"),
            &got,
            &cpu::layer_norm(&x, &gamma, &beta, cols, 1e-5),
            1e-4,
        );
    }
}

#[wasm_bindgen_test]
async fn embedding_and_argmax_are_exact() {
    let context = context().await;
    let (vocab, width) = (50, 24);
    let table = values(41, vocab * width, -1.0, 1.0);
    let ids = [3.0, 0.0, 49.0, 17.0, 3.0];
    let tt = context.tensor(&table, &[vocab, width]).unwrap();
    let ti = context.tensor(&ids, &[ids.len()]).unwrap();
    let rows = context.embedding(&tt, &ti).unwrap();
    assert_eq!(
        rows.to_vec_async().await.unwrap(),
        cpu::embedding(&table, width, &ids)
    );
    let scores = values(42, 6 * 333, -5.0, 5.0);
    let ts = context.tensor(&scores, &[6, 333]).unwrap();
    let best = context
        .argmax_rows(&ts)
        .unwrap()
        .to_vec_async()
        .await
        .unwrap();
    let expected: Vec<f32> = cpu::argmax_rows(&scores, 333)
        .into_iter()
        .map(|index| index as f32)
        .collect();
    assert_eq!(best, expected);
}

/// Writes tokens of three sequences through a shuffled block table, then one decode step of
/// attention, each against the twins: the caches exactly, attention within 1e-5.
#[wasm_bindgen_test]
async fn paged_kv_writes_and_decode_attention_match_their_twins() {
    let context = context().await;
    for (layout, num_blocks, lens) in [
        (
            KvLayout {
                block_tokens: 5,
                n_head: 3,
                head_dim: 7,
            },
            11,
            [1usize, 13, 9],
        ),
        (
            KvLayout {
                block_tokens: 16,
                n_head: 2,
                head_dim: 64,
            },
            25,
            [300, 17, 1],
        ),
    ] {
        let token_len = layout.token_len();
        let cache_len = num_blocks * layout.block_tokens * token_len;
        let shape = [
            num_blocks,
            layout.block_tokens,
            layout.n_head,
            layout.head_dim,
        ];
        // Blocks in a scrambled order, none contiguous with the one before.
        let order: Vec<usize> = (0..num_blocks).map(|i| (i * 7 + 3) % num_blocks).collect();
        let needed: Vec<usize> = lens
            .iter()
            .map(|l| l.div_ceil(layout.block_tokens))
            .collect();
        let max_blocks = needed.iter().max().unwrap() + 1;
        let mut table = vec![1e6f32; 3 * max_blocks];
        let mut next = order.into_iter();
        for (b, &count) in needed.iter().enumerate() {
            for slot in &mut table[b * max_blocks..][..count] {
                *slot = next.next().unwrap() as f32;
            }
        }
        let mut k_cpu = values(51, cache_len, -1.0, 1.0);
        let mut v_cpu = values(52, cache_len, -1.0, 1.0);
        let k_cache = context.tensor(&k_cpu, &shape).unwrap();
        let v_cache = context.tensor(&v_cpu, &shape).unwrap();
        let t_table = context.tensor(&table, &[3, max_blocks]).unwrap();
        let token_shape = [3, layout.n_head, layout.head_dim];
        for step in 0..*lens.iter().max().unwrap() {
            let positions: Vec<f32> = lens
                .iter()
                .map(|&len| if step < len { step as f32 } else { -1.0 })
                .collect();
            let k_new = values(1000 + step as u64, 3 * token_len, -1.0, 1.0);
            let v_new = values(5000 + step as u64, 3 * token_len, -1.0, 1.0);
            let tk = context.tensor(&k_new, &token_shape).unwrap();
            let tv = context.tensor(&v_new, &token_shape).unwrap();
            let tp = context.tensor(&positions, &[3]).unwrap();
            context
                .kv_write(&k_cache, &v_cache, &tk, &tv, &t_table, &tp)
                .unwrap();
            cpu::kv_write(
                &mut k_cpu, &mut v_cpu, &k_new, &v_new, &table, &positions, layout,
            );
        }
        assert_eq!(
            k_cache.to_vec_async().await.unwrap(),
            k_cpu,
            "{layout:?}: K"
        );
        assert_eq!(
            v_cache.to_vec_async().await.unwrap(),
            v_cpu,
            "{layout:?}: V"
        );
        let q = values(53, 3 * token_len, -1.0, 1.0);
        let seq_lens: Vec<f32> = lens.iter().map(|&l| l as f32).collect();
        let scale = 1.0 / (layout.head_dim as f32).sqrt();
        let tq = context.tensor(&q, &token_shape).unwrap();
        let tl = context.tensor(&seq_lens, &[3]).unwrap();
        let out = context
            .paged_attention_decode(&tq, &k_cache, &v_cache, &t_table, &tl, scale)
            .unwrap();
        let expected =
            cpu::paged_attention_decode(&q, &k_cpu, &v_cpu, &table, &seq_lens, layout, scale);
        assert_close(
            &format!("{layout:?}: attention"),
            &out.to_vec_async().await.unwrap(),
            &expected,
            1e-5,
        );
    }
}
