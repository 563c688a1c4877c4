//! What every browser test shares: the device, contexts, seeded values, tolerances.

use wgpu_pool::compute::{Context, ContextOptions};
use wgpu_pool::{request_gpu_async, Gpu, LimitsChoice, Pool, PoolOptions};

/// A device with `limits`, or a failure that says how to get an adapter: a GPU test never
/// passes without one.
pub async fn gpu_with(limits: LimitsChoice) -> Gpu {
    match request_gpu_async(limits).await {
        Ok(gpu) => gpu,
        Err(error) => panic!(
            "this test needs a WebGPU adapter and the browser offered none ({error}). Run the \
             suite with `sh tests/web/run.sh`: headless Chromium with --enable-unsafe-webgpu and \
             SwiftShader (webdriver.json), or a browser with WebGPU enabled"
        ),
    }
}

/// A device with the adapter's own limits.
pub async fn gpu() -> Gpu {
    gpu_with(LimitsChoice::Adapter).await
}

/// A pool with default options on a new device.
pub async fn pool() -> Pool {
    Pool::new(&gpu().await, PoolOptions::default()).expect("a pool")
}

/// A compute context with default options on a new device.
pub async fn context() -> Context {
    Context::new(&pool().await, ContextOptions::default()).expect("a context")
}

/// Seeded values in `[low, high)` (SplitMix64): the same on every run.
pub fn values(seed: u64, len: usize, low: f32, high: f32) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
            low + unit * (high - low)
        })
        .collect()
}

/// Asserts `gpu` within `tolerance · (|cpu| + 1)` of `cpu`, element by element.
pub fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tolerance: f32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            (g - c).abs() <= tolerance * (c.abs() + 1.0),
            "{what}: element {i} is {g}, the CPU twin's {c}"
        );
    }
}
