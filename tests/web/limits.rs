//! WebGPU's default limits in a browser (128 MiB bindings, 256 MiB buffers, 8 storage buffers
//! per stage, 16 KiB of workgroup storage): the pool's segments, the kernels' bindings and the
//! server's cache stay within what the adapter grants; requests beyond get the typed error that
//! names the limit.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::{cpu, Context, ContextOptions, DType};
use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
use wgpu_pool::paging::RequestSpec;
use wgpu_pool::serve::{Gpt2, KvCache, Server, ServerOptions};
use wgpu_pool::{AllocOptions, Gpu, LimitsChoice, Pool, PoolError, PoolOptions};

use crate::support::{assert_close, gpu_with, values};

const MIB: u64 = 1 << 20;

async fn default_limits() -> Gpu {
    let gpu = gpu_with(LimitsChoice::WebGpuDefault).await;
    let limits = gpu.device.limits();
    assert_eq!(limits.max_storage_buffer_binding_size, 128 * MIB);
    assert_eq!(limits.max_buffer_size, 256 * MIB);
    assert_eq!(limits.max_storage_buffers_per_shader_stage, 8);
    assert_eq!(limits.max_compute_workgroup_storage_size, 16 << 10);
    gpu
}

#[wasm_bindgen_test]
async fn the_pool_keeps_the_default_limits_and_names_them_when_refusing() {
    let gpu = default_limits().await;
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let held: Vec<_> = (0..3).map(|_| pool.allocate(100 * MIB).unwrap()).collect();
    for segment in pool.segments() {
        assert!(segment.size_bytes <= 256 * MIB, "{segment:?}");
    }
    let error = pool.allocate(128 * MIB + 4).unwrap_err();
    assert!(
        matches!(error, PoolError::ExceedsBindingLimit { max_storage_buffer_binding_size, .. }
            if max_storage_buffer_binding_size == 128 * MIB),
        "{error:?}"
    );
    assert!(error
        .to_string()
        .contains("max_storage_buffer_binding_size"));
    let copy_only = AllocOptions {
        bindable: false,
        ..AllocOptions::default()
    };
    let error = pool.allocate_with(300 * MIB, copy_only).unwrap_err();
    assert!(
        matches!(error, PoolError::ExceedsBufferLimit { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("max_buffer_size"));
    // A copy-only allocation past the binding limit but within a buffer is served.
    let large = pool.allocate_with(200 * MIB, copy_only).unwrap();
    assert_eq!(large.size(), 200 * MIB);
    assert_eq!(pool.stats().allocations.current, held.len() as u64 + 1);
}

#[wasm_bindgen_test]
async fn kernels_of_the_most_bindings_run_under_the_default_limits() {
    let gpu = default_limits().await;
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let context = Context::new(&pool, ContextOptions::default()).unwrap();
    // The matmul at its largest default tiles, with a bias (4 storage bindings).
    let (m, k, n) = (130, 70, 150);
    let a = values(61, m * k, -1.0, 1.0);
    let b = values(62, k * n, -1.0, 1.0);
    let product = context
        .matmul(
            &context.tensor(&a, &[m, k]).unwrap(),
            &context.tensor(&b, &[k, n]).unwrap(),
        )
        .unwrap();
    assert_close(
        "matmul",
        &product.to_vec_async().await.unwrap(),
        &cpu::matmul(&a, &b, m, k, n),
        1e-4,
    );
    // The cache write from a fused query-key-value tensor (5 storage bindings).
    let layout = cpu::KvLayout {
        block_tokens: 4,
        n_head: 2,
        head_dim: 8,
    };
    let token = layout.token_len();
    let mut k_cpu = vec![0.0; 3 * 4 * token];
    let mut v_cpu = k_cpu.clone();
    let k_cache = context.zeros(&[3, 4, 2, 8]).unwrap();
    let v_cache = context.zeros(&[3, 4, 2, 8]).unwrap();
    let table = [2.0, 0.0];
    let positions = [5.0];
    let qkv = values(63, 3 * token, -1.0, 1.0);
    context
        .kv_write_qkv(
            &k_cache,
            &v_cache,
            &context.tensor(&qkv, &[1, 3, 2, 8]).unwrap(),
            &context.tensor(&table, &[1, 2]).unwrap(),
            &context.tensor(&positions, &[1]).unwrap(),
        )
        .unwrap();
    cpu::kv_write_qkv(&mut k_cpu, &mut v_cpu, &qkv, &table, &positions, layout);
    assert_eq!(k_cache.to_vec_async().await.unwrap(), k_cpu);
    assert_eq!(v_cache.to_vec_async().await.unwrap(), v_cpu);
}

#[wasm_bindgen_test]
async fn the_servers_cache_stays_within_the_binding_limit() {
    let gpu = default_limits().await;
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let context = Context::new(&pool, ContextOptions::default()).unwrap();
    let weights = Gpt2Weights::random(&Gpt2Config::tiny(), 11).unwrap();
    let limit = context.limits().max_storage_buffer_binding_size;
    let most = KvCache::max_blocks(&weights.config, 16, DType::F32, context.limits());
    // More blocks than a binding holds: refused, naming the blocks, with the model kept.
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let too_many = ServerOptions {
        kv_blocks: Some(most + 1),
        ..ServerOptions::default()
    };
    let refused = Server::new(&context, model, too_many);
    assert!(refused.is_err(), "{most} + 1 blocks past the binding limit");
    // A budget of more than the cache's bindings allow: the cache stops at the limit.
    let budget = 4 * limit + 64 * MIB;
    let model = Gpt2::upload(&context, &weights, DType::F32).unwrap();
    let options = ServerOptions {
        budget_bytes: Some(budget),
        max_batch: 2,
        max_step_tokens: 16,
        ..ServerOptions::default()
    };
    let mut server = Server::new(&context, model, options).unwrap();
    let (k, v) = server.cache().layer(0);
    assert!(k.size_bytes() <= limit && v.size_bytes() <= limit);
    let blocks = server.cache().num_blocks();
    assert!(
        blocks <= most && 2 * blocks > most,
        "{blocks} of at most {most}"
    );
    assert!(context.pool().stats().reserved_bytes.current <= budget);
    server
        .submit(&RequestSpec {
            prompt: vec![5, 6, 7],
            max_new_tokens: 3,
        })
        .unwrap();
    let done = server.run_async().await.unwrap();
    assert_eq!(done[0].output.len(), 3);
}
