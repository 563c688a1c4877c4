//! The shared GPU test helper: one device per limits choice for the whole test binary.
//!
//! A GPU test never passes without a GPU: when no adapter is found the helper panics with the
//! message of [`wgpu_pool::DeviceError`], which says what to install.

use std::sync::OnceLock;

use wgpu_pool::Pool;
use wgpu_pool::{request_gpu, Gpu, LimitsChoice};

/// The device with the adapter's own limits.
pub fn gpu() -> &'static Gpu {
    device(LimitsChoice::Adapter)
}

/// A device with WebGPU's default limits (256-byte alignment, 128 MiB bindings).
pub fn gpu_default_limits() -> &'static Gpu {
    device(LimitsChoice::WebGpuDefault)
}

/// The device of `limits` for this test: one for the whole binary, except on GL, where every
/// test thread gets devices of its own. A GL device has one context, which wgpu holds for each
/// submission (llvmpipe runs a dispatch before the call returns) and pipeline compile, and a
/// thread that cannot take it within 6 s panics ("Could not lock adapter context"): on a loaded
/// machine the tests that tune or compile many kernels held it that long and brought down the
/// tests beside them. Devices of their own share no context. (They are leaked: a test thread's
/// device lives as long as the binary, as the shared one does.)
fn device(limits: LimitsChoice) -> &'static Gpu {
    static SHARED: [OnceLock<Gpu>; 2] = [OnceLock::new(), OnceLock::new()];
    let index = usize::from(limits == LimitsChoice::WebGpuDefault);
    let shared = SHARED[index].get_or_init(|| open(limits));
    if shared.info.backend != wgpu::Backend::Gl {
        return shared;
    }
    thread_local! {
        static OWN: std::cell::Cell<[Option<&'static Gpu>; 2]> = const { std::cell::Cell::new([None, None]) };
    }
    OWN.with(|own| {
        let mut devices = own.get();
        let gpu = *devices[index].get_or_insert_with(|| Box::leak(Box::new(open(limits))));
        own.set(devices);
        gpu
    })
}

/// Both devices, for suites that must hold under both limit sets.
pub fn both() -> [(&'static str, &'static Gpu); 2] {
    [
        ("adapter limits", gpu()),
        ("default limits", gpu_default_limits()),
    ]
}

/// A device of its own, for a test that reads device-wide figures (other tests allocate on the
/// shared ones concurrently).
pub fn fresh_gpu() -> Gpu {
    open(LimitsChoice::Adapter)
}

fn open(limits: LimitsChoice) -> Gpu {
    let _ = env_logger::builder().is_test(true).try_init();
    match request_gpu(limits) {
        Ok(gpu) => {
            eprintln!("GPU test device ({limits:?}): {gpu}");
            gpu
        }
        Err(error) => panic!("this test needs a GPU adapter and found none: {error}"),
    }
}

/// Reads `size` bytes at `offset` of `buffer` back to the CPU (the buffer needs `COPY_SRC`).
pub fn read_back(gpu: &Gpu, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Vec<u8> {
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test read-back"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
    gpu.queue.submit([encoder.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |result| {
        result.expect("map for read-back")
    });
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let bytes = staging.get_mapped_range(..).expect("mapped range").to_vec();
    staging.unmap();
    bytes
}

/// A compute pipeline of `wgsl`'s `main`, with the layout wgpu derives from the shader: a user's
/// own kernel, for the tests of `Context::dispatch`.
pub fn wgsl_pipeline(gpu: &Gpu, label: &str, wgsl: &str) -> wgpu::ComputePipeline {
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
    gpu.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        })
}

/// Replays `pool`'s whole history (on since the pool was made, nothing dropped) into counts and
/// compares them with the pool's counters: allocations made and freed, bytes requested and
/// allocated, in total and freed in total.
pub fn history_replays_into_the_counters(name: &str, pool: &Pool) {
    let history = pool.history().expect("history is on");
    assert_eq!(history.dropped_events(), 0, "{name}");
    let stats = pool.stats();
    let (mut made, mut freed) = (0u64, 0u64);
    let (mut requested, mut allocated, mut allocated_freed) = (0u64, 0u64, 0u64);
    for event in history.events() {
        match event.kind {
            wgpu_pool::history::EventKind::Alloc => {
                made += 1;
                requested += event.size_bytes;
                allocated += event.allocated_bytes;
            }
            wgpu_pool::history::EventKind::FreeCompleted => {
                freed += 1;
                allocated_freed += event.allocated_bytes;
            }
            _ => {}
        }
    }
    assert_eq!(made, stats.allocations.total, "{name}: allocations made");
    assert_eq!(freed, stats.allocations.freed, "{name}: allocations freed");
    assert_eq!(requested, stats.requested_bytes.total, "{name}");
    assert_eq!(allocated, stats.allocated_bytes.total, "{name}");
    assert_eq!(allocated_freed, stats.allocated_bytes.freed, "{name}");
}
