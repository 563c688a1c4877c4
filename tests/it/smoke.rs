//! The GPU smoke test: a small WGSL compute shader runs and its result reads back.

use wgpu::util::DeviceExt;

use crate::gpu::{gpu, read_back};

#[test]
fn a_compute_shader_runs_and_reads_back() {
    let gpu = gpu();
    eprintln!(
        "smoke test on {:?} backend, adapter {:?}",
        gpu.info.backend, gpu.info.name
    );
    let input: Vec<u32> = (0..1000).collect();
    let buffer = gpu
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("smoke data"),
            contents: bytemuck::cast_slice(&input),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        });
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("smoke"),
            source: wgpu::ShaderSource::Wgsl(
                "@group(0) @binding(0) var<storage, read_write> data: array<u32>;
             @compute @workgroup_size(64)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                 if (id.x < arrayLength(&data)) { data[id.x] = data[id.x] * 3u + 1u; }
             }"
                .into(),
            ),
        });
    let pipeline = gpu
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("smoke"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("smoke"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: buffer.as_entire_binding(),
        }],
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(input.len().div_ceil(64) as u32, 1, 1);
    }
    gpu.queue.submit([encoder.finish()]);
    let bytes = read_back(gpu, &buffer, 0, buffer.size());
    let output: &[u32] = bytemuck::cast_slice(&bytes);
    let expected: Vec<u32> = input.iter().map(|x| x * 3 + 1).collect();
    assert_eq!(output, expected.as_slice());
}
