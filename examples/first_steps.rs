//! First steps: a device, a pool, one allocation doubled by a tiny kernel, and the memory summary.
//!
//! ```text
//! cargo run --example first_steps
//! ```
//!
//! Read this one first; `pool_vs_naive` shows the pool at work on a whole inference server.

use std::error::Error;

use wgpu_pool::report::Report;
use wgpu_pool::{request_gpu, Gpu, LimitsChoice, Pool, PoolOptions};

/// The kernel: each invocation doubles one value. Storage bindings of pool allocations are
/// declared `read_write`, since allocations share buffers (see README's rules).
const DOUBLE: &str = "
@group(0) @binding(0) var<storage, read_write> values: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&values)) {
        values[id.x] = 2.0 * values[id.x];
    }
}
";

fn main() -> Result<(), Box<dyn Error>> {
    // 1. A device: the adapter `WGPU_BACKEND` selects (vulkan, gl, ...), with its own limits.
    let gpu = request_gpu(LimitsChoice::Adapter)?;
    println!("device: {gpu}");
    let doubled = run(&gpu)?;
    println!("doubled on the GPU: {:?} ...", &doubled[..4]);
    Ok(())
}

/// Runs the whole story on `gpu` and returns the values read back: `0, 2, 4, ..., 2046`.
pub fn run(gpu: &Gpu) -> Result<Vec<f32>, Box<dyn Error>> {
    // 2. A pool: it carves large buffers into ranges; the defaults suit most programs.
    let pool = Pool::new(gpu, PoolOptions::default())?;

    // 3. One allocation for 1024 floats (4 KiB), then its contents: 0, 1, 2, ..., 1023.
    let input: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let values = pool.allocate(std::mem::size_of_val(input.as_slice()) as u64)?;
    pool.write(&values, 0, bytemuck::cast_slice(&input))?;

    // 4. The kernel's pipeline; its bind group takes the allocation as (buffer, offset, size).
    let device = &gpu.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("double"),
        source: wgpu::ShaderSource::Wgsl(DOUBLE.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("double"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("double"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: values.as_binding_resource(),
        }],
    });

    // 5. Record one dispatch: 1024 values in workgroups of 64.
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(input.len().div_ceil(64) as u32, 1, 1);
    }

    // 6. Submit through the pool (so that it knows when ranges may be reused) and read back,
    //    in one submission.
    let bytes = pool.submit_and_read([encoder.finish()], &values)?;
    let doubled: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|word| f32::from_le_bytes([word[0], word[1], word[2], word[3]]))
        .collect();

    // 7. Check, then ask the pool to explain its memory (like torch.cuda.memory_summary()).
    for (i, (x, y)) in input.iter().zip(&doubled).enumerate() {
        if *y != 2.0 * x {
            return Err(format!("value {i}: expected {}, read {y}", 2.0 * x).into());
        }
    }
    println!("{}", Report::from_pool(&pool));
    Ok(doubled)
}
