//! The GPU pool: canary churn, reuse hazards, read-only/read-write bindings, limits, budget,
//! zeroing, threads, and the naive baseline. Every test runs on the backend `WGPU_BACKEND`
//! selects; CI runs them on Vulkan (lavapipe) and GL (llvmpipe).

use std::collections::HashMap;

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu::util::DeviceExt;
use wgpu_pool::policy::{PolicyConfig, SegmentClass};
use wgpu_pool::{AllocOptions, Allocation, Gpu, Pool, PoolError, PoolOptions, ReuseSafety};

use crate::gpu::{both, fresh_gpu, gpu, gpu_default_limits};

/// Fills an allocation with `pattern(seed, i)`; copies one allocation into another. Every storage
/// binding is `read_write` (the pool's rule for bindings that may share a segment buffer).
const KERNELS: &str = "
struct Params { seed: u32, len: u32 }
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> source: array<u32>;

fn pattern(seed: u32, i: u32) -> u32 { return (seed * 2654435761u) ^ (i * 2246822519u) ^ 0x5bd1e995u; }

@compute @workgroup_size(64)
fn fill(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.len) { data[id.x] = pattern(params.seed, id.x); }
}

@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.len) { data[id.x] = source[id.x]; }
}
";

/// The same kernel with the source declared `read`: binding it beside a `read_write` range of the
/// same buffer is the usage conflict wgpu rejects.
const READ_ONLY_COPY: &str = "
struct Params { seed: u32, len: u32 }
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> source: array<u32>;
@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.len) { data[id.x] = source[id.x]; }
}
";

fn pattern(seed: u32, i: u32) -> u32 {
    seed.wrapping_mul(2654435761) ^ i.wrapping_mul(2246822519) ^ 0x5bd1e995
}

fn expected(seed: u32, len_words: usize) -> Vec<u32> {
    (0..len_words as u32).map(|i| pattern(seed, i)).collect()
}

struct Kernels {
    fill: wgpu::ComputePipeline,
    copy: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

impl Kernels {
    fn new(gpu: &Gpu) -> Self {
        let device = &gpu.device;
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("test kernels"),
            entries: &[storage_entry(0), uniform_entry(1), storage_entry(2)],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("test kernels"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("test kernels"),
            source: wgpu::ShaderSource::Wgsl(KERNELS.into()),
        });
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Self {
            fill: pipeline("fill"),
            copy: pipeline("copy"),
            layout,
        }
    }

    fn params(gpu: &Gpu, seed: u32, len: u32) -> wgpu::Buffer {
        gpu.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::cast_slice(&[seed, len, 0, 0]),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Records `data[i] = pattern(seed, i)` over the whole allocation.
    fn record_fill(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        target: &Allocation,
        seed: u32,
    ) {
        let len = (target.binding_size() / 4) as u32;
        let params = Self::params(gpu, seed, len);
        // The unused `source` binding gets the target too: both are read_write, so no conflict.
        self.dispatch(gpu, encoder, &self.fill, target, &params, target, len);
    }

    /// Records `target[i] = source[i]`.
    fn record_copy(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        target: &Allocation,
        source: &Allocation,
    ) {
        let len = (target.binding_size() / 4) as u32;
        let params = Self::params(gpu, 0, len);
        self.dispatch(gpu, encoder, &self.copy, target, &params, source, len);
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "a test helper that takes one dispatch's pieces as they are"
    )]
    fn dispatch(
        &self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        pipeline: &wgpu::ComputePipeline,
        target: &Allocation,
        params: &wgpu::Buffer,
        source: &Allocation,
        len: u32,
    ) {
        let bind_group = bind_group(gpu, &self.layout, target, params, source);
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(len.div_ceil(64), 1, 1);
    }
}

/// `data` (binding 0) is `target`, `params` (1) the uniform, `source` (2) the second range.
fn bind_group(
    gpu: &Gpu,
    layout: &wgpu::BindGroupLayout,
    target: &Allocation,
    params: &wgpu::Buffer,
    source: &Allocation,
) -> wgpu::BindGroup {
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("test kernel"),
        layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: target.as_binding_resource(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: params.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: source.as_binding_resource(),
            },
        ],
    })
}

fn storage_entry(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

fn uniform_entry(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

fn read_words(pool: &Pool, allocation: &Allocation) -> Vec<u32> {
    bytemuck::cast_slice(&pool.read(allocation).expect("read back")).to_vec()
}

fn words_bytes(words: &[u32]) -> &[u8] {
    bytemuck::cast_slice(words)
}

/// Thousands of random allocations and frees of mixed sizes; every live allocation holds its own
/// pattern, written by a kernel or by `queue.write_buffer`; all are checked every few rounds and
/// at the end. Zero corrupted bytes. Returns the number of corrupted words.
fn canary_churn(gpu: &Gpu, options: PoolOptions, seed: u64, rounds: usize) -> usize {
    let pool = Pool::new(gpu, options).unwrap();
    let kernels = Kernels::new(gpu);
    let alignment = u64::from(gpu.device.limits().min_storage_buffer_offset_alignment);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live: Vec<(Allocation, u32)> = Vec::new();
    let mut next_seed = 1u32;
    let mut corrupted = 0;
    let mut allocations = 0;
    let verify = |live: &Vec<(Allocation, u32)>| -> usize {
        live.iter()
            .map(|(allocation, seed)| {
                let got = read_words(&pool, allocation);
                let want = expected(*seed, got.len());
                got.iter().zip(&want).filter(|(g, w)| g != w).count()
            })
            .sum()
    };
    for round in 0..rounds {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..60 {
            if live.is_empty() || rng.gen_bool(0.55) {
                // Sizes from 4 B to 256 KiB, log-uniform, multiples of 4.
                let exponent = rng.gen_range(2..=18);
                let size =
                    (rng.gen_range((1u64 << exponent) / 2..=(1u64 << exponent)) / 4).max(1) * 4;
                let allocation = pool
                    .allocate_with(size, AllocOptions::labeled("canary"))
                    .unwrap();
                assert_eq!(allocation.offset() % alignment, 0);
                let canary = next_seed;
                next_seed += 1;
                if rng.gen_bool(0.5) {
                    kernels.record_fill(gpu, &mut encoder, &allocation, canary);
                } else {
                    let words = expected(canary, (allocation.binding_size() / 4) as usize);
                    pool.write(&allocation, 0, words_bytes(&words)).unwrap();
                }
                live.push((allocation, canary));
                allocations += 1;
            } else {
                let index = rng.gen_range(0..live.len());
                drop(live.swap_remove(index));
            }
        }
        pool.submit([encoder.finish()]);
        if round % 5 == 4 {
            corrupted += verify(&live);
        }
    }
    corrupted += verify(&live);
    let stats = pool.stats();
    assert!(allocations >= 900, "{allocations} allocations");
    assert_eq!(stats.allocations.current, live.len() as u64);
    assert!(stats.reserved_bytes.current >= stats.allocated_bytes.current);
    drop(live);
    pool.mark_submitted();
    assert_eq!(pool.stats().allocated_bytes.current, 0);
    assert_eq!(pool.pending_frees(), (0, 0));
    corrupted
}

#[test]
fn canary_churn_corrupts_nothing_under_both_limit_sets() {
    for (name, gpu) in both() {
        let corrupted = canary_churn(gpu, PoolOptions::default(), 7, 30);
        assert_eq!(corrupted, 0, "{name}: {corrupted} corrupted words");
    }
}

#[test]
fn canary_churn_catches_corruption_without_reuse_safety() {
    // The same churn with the reuse policy switched off corrupts data: the check above can fail.
    let options = PoolOptions {
        reuse: ReuseSafety::Immediate,
        ..PoolOptions::default()
    };
    let corrupted = canary_churn(gpu(), options, 7, 30);
    assert!(
        corrupted > 0,
        "expected corruption with ReuseSafety::Immediate"
    );
}

/// Records a kernel that copies X into Z, drops X, allocates Y (the same size), uploads B into Y
/// with `queue.write_buffer`, then submits the kernel. Returns what Z holds and whether Y reused
/// X's range.
fn recorded_then_freed(gpu: &Gpu, reuse: ReuseSafety) -> (Vec<u32>, bool) {
    let pool = Pool::new(
        gpu,
        PoolOptions {
            reuse,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let kernels = Kernels::new(gpu);
    let a = expected(1, 256);
    let b = expected(2, 256);
    let x = pool.allocate(1024).unwrap();
    let z = pool.allocate(1024).unwrap();
    pool.write(&x, 0, words_bytes(&a)).unwrap();
    pool.submit([]);
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernels.record_copy(gpu, &mut encoder, &z, &x);
    let x_range = (x.segment(), x.offset());
    drop(x);
    let y = pool.allocate(1024).unwrap();
    let reused = (y.segment(), y.offset()) == x_range;
    pool.write(&y, 0, words_bytes(&b)).unwrap();
    pool.submit([encoder.finish()]);
    (read_words(&pool, &z), reused)
}

#[test]
fn a_recorded_kernel_reads_its_data_although_its_input_was_freed_and_reused() {
    for (name, gpu) in both() {
        let (z, reused) = recorded_then_freed(gpu, ReuseSafety::AfterSubmission);
        assert!(
            !reused,
            "{name}: the range was reused before the submission"
        );
        assert_eq!(
            z,
            expected(1, 256),
            "{name}: the kernel read data uploaded after it was recorded"
        );
    }
}

#[test]
fn without_reuse_safety_the_recorded_kernel_reads_the_later_upload() {
    // The hazard is real: with the policy off, the test above would fail.
    let (z, reused) = recorded_then_freed(gpu(), ReuseSafety::Immediate);
    assert!(reused);
    assert_eq!(z, expected(2, 256));
}

#[test]
fn work_still_running_keeps_its_input() {
    let gpu = gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
    let kernels = Kernels::new(gpu);
    let words = 1 << 16;
    let x = pool.allocate(4 * words).unwrap();
    let z = pool.allocate(4 * words).unwrap();
    pool.write(&x, 0, words_bytes(&expected(5, words as usize)))
        .unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernels.record_copy(gpu, &mut encoder, &z, &x);
    pool.submit([encoder.finish()]);
    // No wait: the copy may still be running. Free X, reuse its range, overwrite it.
    drop(x);
    pool.mark_submitted();
    let y = pool.allocate(4 * words).unwrap();
    pool.write(&y, 0, words_bytes(&expected(6, words as usize)))
        .unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernels.record_fill(gpu, &mut encoder, &y, 7);
    pool.submit([encoder.finish()]);
    assert_eq!(read_words(&pool, &z), expected(5, words as usize));
    assert_eq!(read_words(&pool, &y), expected(7, words as usize));
}

#[test]
fn read_write_bindings_of_one_segment_work_and_read_only_ones_conflict() {
    for (name, gpu) in both() {
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let kernels = Kernels::new(gpu);
        let source = pool.allocate(4096).unwrap();
        let target = pool.allocate(4096).unwrap();
        assert_eq!(
            source.segment(),
            target.segment(),
            "{name}: both should share a segment"
        );
        pool.write(&source, 0, words_bytes(&expected(9, 1024)))
            .unwrap();
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        kernels.record_copy(gpu, &mut encoder, &target, &source);
        pool.submit([encoder.finish()]);
        assert!(
            pollster::block_on(scope.pop()).is_none(),
            "{name}: read_write bindings must not conflict"
        );
        assert_eq!(read_words(&pool, &target), expected(9, 1024), "{name}");

        // The same copy with the source declared `read` is rejected by wgpu: the reason for the rule.
        let module = gpu
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("read-only copy"),
                source: wgpu::ShaderSource::Wgsl(READ_ONLY_COPY.into()),
            });
        let pipeline = gpu
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("read-only copy"),
                layout: None,
                module: &module,
                entry_point: Some("copy"),
                compilation_options: Default::default(),
                cache: None,
            });
        let params = Kernels::params(gpu, 0, 1024);
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = bind_group(
            gpu,
            &pipeline.get_bind_group_layout(0),
            &target,
            &params,
            &source,
        );
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(16, 1, 1);
        }
        let commands = encoder.finish();
        let error = pollster::block_on(scope.pop());
        assert!(
            error.is_some(),
            "{name}: expected wgpu to reject read + read_write on one buffer"
        );
        drop(commands);
    }
}

#[test]
fn limits_decide_what_can_be_allocated() {
    for (name, gpu) in both() {
        let limits = gpu.device.limits();
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let policy = pool.policy();
        assert!(
            policy.min_block_bytes >= u64::from(limits.min_storage_buffer_offset_alignment),
            "{name}"
        );
        assert!(policy.max_segment_bytes <= limits.max_buffer_size, "{name}");
        let binding_limit = limits.max_storage_buffer_binding_size;
        assert_eq!(
            pool.allocate(binding_limit + 4).unwrap_err(),
            PoolError::ExceedsBindingLimit {
                requested_bytes: binding_limit + 4,
                max_storage_buffer_binding_size: binding_limit
            },
            "{name}"
        );
        assert!(matches!(
            pool.allocate_with(
                limits.max_buffer_size + 1,
                AllocOptions {
                    bindable: false,
                    ..Default::default()
                }
            ),
            Err(PoolError::ExceedsBufferLimit { .. })
        ));
        assert_eq!(pool.allocate(0).unwrap_err(), PoolError::ZeroSize);
        // Nothing was reserved by the refusals.
        assert_eq!(pool.stats().reserved_bytes.current, 0, "{name}");
    }
    // Under WebGPU's defaults, a copy-only allocation above the 128 MiB binding limit is allowed.
    let gpu = gpu_default_limits();
    let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
    let binding_limit = gpu.device.limits().max_storage_buffer_binding_size;
    let big = pool
        .allocate_with(
            binding_limit + 1024,
            AllocOptions {
                bindable: false,
                label: "copy-only",
                zeroed: false,
            },
        )
        .unwrap();
    assert!(big.allocated_size() >= binding_limit + 1024);
    pool.write(&big, binding_limit, &[7u8; 1024]).unwrap();
    assert!(matches!(
        pool.write(&big, binding_limit + 1024, &[0u8; 4]),
        Err(PoolError::OutOfBounds { .. })
    ));
    assert!(matches!(
        pool.write(&big, 2, &[0u8; 4]),
        Err(PoolError::OutOfBounds { .. })
    ));
}

#[test]
fn a_budget_refuses_with_figures_and_trim_gives_memory_back() {
    let gpu = gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
    pool.set_budget(Some(4 << 20));
    let a = pool.allocate(3 << 20).unwrap();
    let error = pool.allocate(3 << 20).unwrap_err();
    let PoolError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert_eq!(oom.requested_bytes, 3 << 20);
    assert_eq!(oom.budget_bytes, Some(4 << 20));
    assert!(error.to_string().contains("trim()"), "{error}");
    assert_eq!(pool.stats().oom_count, 1);
    drop(a);
    pool.mark_submitted();
    assert_eq!(pool.trim(), 4 << 20);
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    pool.set_budget(None);
    let _b = pool.allocate(3 << 20).unwrap();
}

#[test]
fn reused_memory_holds_old_data_unless_zeroed() {
    let gpu = gpu();
    for zero_on_free in [false, true] {
        let pool = Pool::new(
            gpu,
            PoolOptions {
                zero_on_free,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let secret = expected(11, 1024);
        let x = pool.allocate(4096).unwrap();
        let range = (x.segment(), x.offset());
        pool.write(&x, 0, words_bytes(&secret)).unwrap();
        drop(x);
        pool.submit([]);
        let y = pool.allocate(4096).unwrap();
        assert_eq!((y.segment(), y.offset()), range);
        let expected_contents = if zero_on_free {
            vec![0; 1024]
        } else {
            secret.clone()
        };
        assert_eq!(
            read_words(&pool, &y),
            expected_contents,
            "zero_on_free {zero_on_free}"
        );
        pool.write(&y, 0, words_bytes(&secret)).unwrap();
        drop(y);
        pool.submit([]);
        let zeroed = pool
            .allocate_with(
                4096,
                AllocOptions {
                    zeroed: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(zeroed.offset(), range.1);
        assert_eq!(read_words(&pool, &zeroed), vec![0; 1024]);
    }
}

#[test]
fn eight_threads_churn_without_overlap_and_trim_gives_every_buffer_back() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pool>();
    assert_send_sync::<Allocation>();
    // A device of its own: the device-wide allocator figures below must not see other tests.
    let gpu = &fresh_gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
    // Every live range, by (segment, offset) -> end: an insertion that overlaps a neighbour fails.
    let ranges = std::sync::Mutex::new(std::collections::BTreeMap::new());
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let pool = pool.clone();
            let ranges = &ranges;
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(thread);
                let mut live: Vec<Allocation> = Vec::new();
                for _ in 0..400 {
                    if live.is_empty() || rng.gen_bool(0.6) {
                        let allocation = pool.allocate(rng.gen_range(1..100_000)).unwrap();
                        let key = (allocation.segment(), allocation.offset());
                        let end = allocation.offset() + allocation.allocated_size();
                        let mut ranges = ranges.lock().unwrap();
                        if let Some((&(segment, _), &previous_end)) =
                            ranges.range(..key).next_back()
                        {
                            assert!(
                                segment != key.0 || previous_end <= key.1,
                                "overlap before {key:?}"
                            );
                        }
                        if let Some((&(segment, offset), _)) = ranges.range(key..).next() {
                            assert!(segment != key.0 || end <= offset, "overlap after {key:?}");
                        }
                        ranges.insert(key, end);
                        drop(ranges);
                        live.push(allocation);
                    } else {
                        let allocation = live.swap_remove(rng.gen_range(0..live.len()));
                        ranges
                            .lock()
                            .unwrap()
                            .remove(&(allocation.segment(), allocation.offset()));
                    }
                    if rng.gen_bool(0.1) {
                        pool.mark_submitted();
                    }
                }
                // Forget the ranges before they go back to the pool.
                let mut ranges = ranges.lock().unwrap();
                for allocation in &live {
                    ranges.remove(&(allocation.segment(), allocation.offset()));
                }
            });
        }
    });
    pool.mark_submitted();
    let stats = pool.stats();
    assert_eq!(stats.allocations.current, 0);
    assert_eq!(stats.allocated_bytes.current, 0);
    assert_eq!(stats.requested_bytes.current, 0);
    assert_eq!(stats.allocations.total, stats.allocations.freed);
    assert!(stats.allocations.total > 8 * 200);
    // Every range of every segment is free again.
    for segment in pool.segments() {
        assert_eq!(
            segment.free_blocks,
            vec![(0, segment.size_bytes)],
            "{segment:?}"
        );
    }
    let device_before = gpu
        .device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes);
    let reserved = stats.reserved_bytes.current;
    assert!(reserved > 0);
    assert_eq!(pool.trim(), reserved);
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert!(pool.segments().is_empty());
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
    // Where the backend reports its own allocations (Vulkan, DX12), the buffers are gone there too.
    if let (Some(before), Some(after)) = (
        device_before,
        gpu.device
            .generate_allocator_report()
            .map(|r| r.total_allocated_bytes),
    ) {
        assert!(
            after + reserved <= before,
            "device allocated {before} -> {after} bytes after trimming {reserved}"
        );
    }
}

#[test]
fn the_naive_baseline_has_the_same_interface() {
    let gpu = gpu();
    let naive = Pool::naive(gpu, PoolOptions::default());
    assert!(naive.is_naive());
    let kernels = Kernels::new(gpu);
    let mut live = HashMap::new();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    for seed in 1..=20u32 {
        let allocation = naive.allocate(u64::from(seed) * 100).unwrap();
        assert_eq!(allocation.offset(), 0);
        kernels.record_fill(gpu, &mut encoder, &allocation, seed);
        live.insert(seed, allocation);
    }
    naive.submit([encoder.finish()]);
    for (seed, allocation) in &live {
        let words = read_words(&naive, allocation);
        assert_eq!(words, expected(*seed, words.len()));
    }
    let stats = naive.stats();
    assert_eq!(stats.create_segment_calls, 20);
    // One code path: the naive mode of the policy, with every buffer a dedicated segment.
    assert!(naive.policy().is_naive());
    let segments = naive.segments();
    assert_eq!(segments.len(), 20);
    assert!(segments
        .iter()
        .all(|segment| segment.class == SegmentClass::Dedicated));
    assert_eq!(
        segments
            .iter()
            .map(|segment| segment.size_bytes)
            .sum::<u64>(),
        stats.reserved_bytes.current
    );
    assert_eq!(naive.trim(), 0);
    assert_eq!(
        stats.requested_bytes.current,
        (1..=20).map(|s| s * 100).sum::<u64>()
    );
    assert_eq!(stats.reserved_bytes.current, stats.allocated_bytes.current);
    drop(live);
    assert_eq!(naive.pending_frees(), (0, 0), "naive frees are immediate");
    assert!(naive.segments().is_empty());
    assert_eq!(naive.stats().reserved_bytes.current, 0);
    assert_eq!(
        naive.stats().reserved_bytes.peak,
        stats.reserved_bytes.current
    );
}

#[test]
fn a_custom_policy_must_fit_the_device() {
    let gpu = gpu();
    let limits = gpu.device.limits();
    let too_small_block = PolicyConfig {
        min_block_bytes: 16,
        ..PolicyConfig::for_limits(256, limits.max_buffer_size)
    };
    if limits.min_storage_buffer_offset_alignment > 16 {
        assert!(matches!(
            Pool::new(
                gpu,
                PoolOptions {
                    policy: Some(too_small_block),
                    ..PoolOptions::default()
                }
            ),
            Err(PoolError::Config(_))
        ));
    }
    let too_big = PolicyConfig {
        max_allocation_bytes: limits.max_buffer_size * 2,
        ..PolicyConfig::for_limits(256, limits.max_buffer_size)
    };
    assert!(matches!(
        Pool::new(
            gpu,
            PoolOptions {
                policy: Some(too_big),
                ..PoolOptions::default()
            }
        ),
        Err(PoolError::Config(_))
    ));
    // A naive pool's buffers are sized in blocks: a block below wgpu's copy alignment (4 bytes)
    // would give a 5-byte buffer an 8-byte binding. Refused with a message, as is a setting
    // that breaks the policy's own rules.
    for block in [1, 2] {
        let refused = Pool::new(
            gpu,
            PoolOptions {
                policy: Some(PolicyConfig::naive(block, limits.max_buffer_size)),
                ..PoolOptions::default()
            },
        );
        match refused {
            Err(PoolError::Config(message)) => {
                assert!(message.contains("COPY_BUFFER_ALIGNMENT"), "{message}")
            }
            other => panic!("a naive block of {block} bytes: {:?}", other.map(drop)),
        }
    }
    let odd_segment = PolicyConfig {
        max_segment_bytes: 48 << 20,
        ..PolicyConfig::for_limits(256, limits.max_buffer_size)
    };
    assert!(matches!(
        Pool::new(
            gpu,
            PoolOptions {
                policy: Some(odd_segment),
                ..PoolOptions::default()
            }
        ),
        Err(PoolError::Config(_))
    ));
}

#[test]
fn work_and_its_read_back_go_in_one_submission() {
    let gpu = gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
    let kernels = Kernels::new(gpu);
    let dropped = pool.allocate(4096).unwrap();
    let target = pool.allocate(4096).unwrap();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    kernels.record_fill(gpu, &mut encoder, &target, 21);
    drop(dropped);
    assert_eq!(pool.pending_frees().0, 1);
    let bytes = pool.submit_and_read([encoder.finish()], &target).unwrap();
    assert_eq!(
        bytemuck::cast_slice::<u8, u32>(&bytes),
        expected(21, 1024).as_slice()
    );
    // Like `submit`, it released the range dropped before it; a plain `read` would not have.
    assert_eq!(pool.pending_frees(), (0, 0));
    let again = pool.allocate(4096).unwrap();
    drop(again);
    pool.read(&target).unwrap();
    assert_eq!(pool.pending_frees().0, 1);
}

#[test]
fn another_submitter_cannot_release_a_tensor_the_open_batch_still_reads() {
    use wgpu_pool::compute::{Context, ContextOptions};
    for (limits, gpu) in both() {
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let context = Context::new(&pool, ContextOptions::default()).unwrap();
        let len = 1024;
        let x_values: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let x = context.tensor(&x_values, &[len]).unwrap();
        let ones = context.tensor(&vec![1.0; len], &[len]).unwrap();
        // Recorded, not submitted: the open batch reads x.
        let y = context.add(&x, &ones).unwrap();
        drop(x);
        // Someone else submits through the same pool (that must not release x's range), then
        // allocates x's size, uploads and submits again.
        pool.submit([]);
        let other = pool.allocate(4 * len as u64).unwrap();
        pool.write(&other, 0, bytemuck::cast_slice(&vec![-7.0f32; len]))
            .unwrap();
        pool.submit([]);
        let got = context.read(&y).unwrap();
        let wrong = (0..len).filter(|&i| got[i] != x_values[i] + 1.0).count();
        assert_eq!(
            wrong, 0,
            "{limits}: {wrong} of {len} values wrong, e.g. {}",
            got[0]
        );
        // After the batch is submitted x's range is free again: the pool reuses it.
        drop(other);
        pool.submit([]);
        assert!(
            pool.pending_frees().0 == 0,
            "{limits}: {:?}",
            pool.pending_frees()
        );
    }
}

#[test]
fn free_submitted_releases_at_once_and_zeroes_when_asked() {
    for (limits, gpu) in both() {
        // Without zeroing: the range is free without waiting for a submission.
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let first = pool.allocate(4096).unwrap();
        let offset = first.offset();
        drop(pool.allocate(4096).unwrap());
        assert_eq!(
            pool.pending_frees().0,
            1,
            "{limits}: a drop waits for a submission"
        );
        pool.free_submitted([first]);
        assert_eq!(
            pool.pending_frees().0,
            1,
            "{limits}: only the dropped one waits"
        );
        let again = pool.allocate(4096).unwrap();
        assert_eq!(
            again.offset(),
            offset,
            "{limits}: the range is reused at once"
        );

        // With zero_on_free: cleared before it is reused.
        let pool = Pool::new(
            gpu,
            PoolOptions {
                zero_on_free: true,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let first = pool.allocate(4096).unwrap();
        pool.write(&first, 0, &[0xAB; 4096]).unwrap();
        pool.submit([]);
        pool.free_submitted([first]);
        assert_eq!(pool.pending_frees().0, 0, "{limits}");
        let again = pool.allocate(4096).unwrap();
        assert!(
            pool.read(&again).unwrap().iter().all(|&b| b == 0),
            "{limits}: zeroed"
        );
    }
}

/// A device of its own on the shared adapter with `max_buffer_size` lowered to `max_buffer_size`
/// (and bindings to 16 MiB), to test the logic near the buffer limit without allocating gigabytes.
fn gpu_with_max_buffer_size(max_buffer_size: u64) -> Gpu {
    let base = gpu();
    let adapter = base
        .adapter
        .as_ref()
        .expect("the test device has its adapter");
    let required_limits = wgpu::Limits {
        max_buffer_size,
        max_storage_buffer_binding_size: 16 << 20,
        ..adapter.limits()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("lowered max_buffer_size"),
        required_limits,
        ..Default::default()
    }))
    .expect("a device with lowered limits");
    let mut gpu = Gpu::from_device(device, queue);
    gpu.adapter = base.adapter.clone();
    gpu.info = base.info.clone();
    gpu
}

#[test]
fn another_pools_allocation_is_refused() {
    // Issue 13, item 1: two pools on two devices, and two pools on one device.
    let pool_a = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let other_device = fresh_gpu();
    for pool_b in [
        Pool::new(&other_device, PoolOptions::default()).unwrap(),
        Pool::new(gpu(), PoolOptions::default()).unwrap(),
    ] {
        let a = pool_a.allocate(1024).unwrap();
        pool_a.write(&a, 0, &[7u8; 1024]).unwrap();
        let _b = pool_b.allocate(1024).unwrap();
        let foreign = |result: Result<_, PoolError>| {
            matches!(
                result,
                Err(PoolError::ForeignAllocation {
                    size_bytes: 1024,
                    ..
                })
            )
        };
        assert!(foreign(pool_b.write(&a, 0, &[1u8; 4]).map(drop)), "write");
        assert!(foreign(pool_b.read(&a).map(drop)), "read");
        assert!(
            foreign(pool_b.submit_and_read([], &a).map(drop)),
            "submit_and_read"
        );
        // Nothing landed anywhere: A's bytes are intact.
        assert_eq!(pool_a.read(&a).unwrap(), vec![7u8; 1024]);
        // Freed through the wrong pool, the range waits for its own pool's next submission.
        let pending = pool_a.pending_frees().0;
        pool_b.free_submitted([a]);
        assert_eq!(pool_a.pending_frees().0, pending + 1);
        pool_a.submit([]);
        assert_eq!(pool_a.pending_frees().0, 0);
    }
}

#[test]
fn a_refused_allocation_leaves_the_statistics_as_they_were() {
    // Issue 13, item 3, as reported.
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let a = pool.allocate(3 << 19).unwrap();
    drop(pool.allocate(3 << 19).unwrap());
    pool.submit([]);
    assert_eq!(pool.stats().reserved_bytes.current, 4 << 20);
    pool.set_budget(Some(5 << 20));
    pool.set_history(Some(Default::default()));
    let before = pool.stats();
    let error = pool.allocate(4 << 20).unwrap_err();
    let PoolError::OutOfMemory(oom) = &error else {
        panic!("{error}")
    };
    assert_eq!(oom.released_bytes, 0, "nothing given back");
    let history = pool.history().unwrap();
    let events = history.events();
    let recorded = events.back().and_then(|event| event.oom.as_deref());
    assert_eq!(recorded.map(|oom| oom.released_bytes), Some(0));
    let after = pool.stats();
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert_eq!(after.segments, before.segments);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.oom_count, before.oom_count + 1);
    drop(a);
}

#[test]
fn reads_above_the_staging_limit_go_in_pieces() {
    // Issue 13, item 4: the staging buffer never exceeds max_buffer_size, and a read larger than
    // it goes in pieces. 40 MiB + 4 B would round to a 64 MiB staging buffer, above 48 MiB.
    let gpu = gpu_with_max_buffer_size(48 << 20);
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let size = (40 << 20) + 4;
    let allocation = pool
        .allocate_with(
            size,
            AllocOptions {
                bindable: false,
                ..Default::default()
            },
        )
        .unwrap();
    let words: Vec<u32> = (0..(size / 4) as u32).map(|i| pattern(3, i)).collect();
    pool.write(&allocation, 0, words_bytes(&words)).unwrap();
    let bytes = pool.read(&allocation).unwrap();
    assert_eq!(bytes.len() as u64, size);
    assert!(bytes == words_bytes(&words), "the bytes read back differ");
    let bytes = pool.submit_and_read([], &allocation).unwrap();
    assert!(bytes == words_bytes(&words), "the bytes read back differ");
}

#[test]
fn a_zeroed_allocation_at_the_buffer_limit_clears_whole_words() {
    // Issue 13, item 5: with max_buffer_size not a multiple of 4, a dedicated segment rounded up
    // to the block size and clamped to the limit used to be cleared by an unaligned size.
    let max = (48 << 20) - 1;
    let gpu = gpu_with_max_buffer_size(max);
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let copy_only = |zeroed| AllocOptions {
        bindable: false,
        zeroed,
        ..Default::default()
    };
    let allocation = pool.allocate_with(max - 47, copy_only(true)).unwrap();
    assert_eq!(allocation.allocated_size() % 4, 0);
    assert!(allocation.allocated_size() <= max);
    let bytes = pool.read(&allocation).unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "zeroed");
    drop(allocation);
    pool.submit([]);
    // The last bytes below the limit cannot be copied whole: a typed error, not a panic.
    assert!(matches!(
        pool.allocate_with(max, copy_only(false)),
        Err(PoolError::ExceedsBufferLimit { .. })
    ));
}

#[test]
fn trim_gives_the_read_back_staging_buffer_back() {
    // Issue 13, item 7: after a read, trim gives back the staging buffer as well as the segments.
    let gpu = fresh_gpu();
    let allocated = |gpu: &Gpu| {
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
        gpu.device
            .generate_allocator_report()
            .map(|report| report.total_allocated_bytes)
    };
    let before = allocated(&gpu);
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let allocation = pool.allocate(6 << 20).unwrap();
    pool.read(&allocation).unwrap();
    // The staging buffer is device memory outside the statistics: the state shows it.
    let staging = pool.memory_state().staging_bytes;
    assert_eq!(staging, 8 << 20, "a power of two above the read");
    let summary = wgpu_pool::report::Report::from_pool(&pool).to_string();
    assert!(
        summary.contains("Read-back staging buffer: 8.00 MiB"),
        "{summary}"
    );
    drop(allocation);
    pool.submit([]);
    let reserved = pool.stats().reserved_bytes.current;
    assert_eq!(
        pool.trim(),
        reserved,
        "trim counts the segments, as the statistics do"
    );
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(pool.memory_state().staging_bytes, 0);
    // The device's own figures, where the backend has an allocator report (Vulkan does).
    let after = allocated(&gpu);
    assert!(
        after <= before,
        "wgpu's allocator report after trim: {after:?}, before the pool: {before:?}"
    );
}

#[test]
fn bytes_of_any_length_go_in_and_come_back_exactly() {
    // Issue 13, item 9: a write may end at the allocation's end on any byte (the pool pads it to
    // whole words), and a read returns exactly `size()` bytes.
    for (limits, gpu) in both() {
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let allocation = pool.allocate(6).unwrap();
        pool.write(&allocation, 0, &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(
            pool.read(&allocation).unwrap(),
            [1, 2, 3, 4, 5, 6],
            "{limits}"
        );
        pool.write(&allocation, 4, &[9, 8]).unwrap();
        assert_eq!(
            pool.submit_and_read([], &allocation).unwrap(),
            [1, 2, 3, 4, 9, 8],
            "{limits}"
        );
        // Ending inside the allocation on a partial word would pad over bytes not written.
        assert!(matches!(
            pool.write(&allocation, 0, &[1, 2, 3]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.write(&allocation, 4, &[1, 2, 3]),
            Err(PoolError::OutOfBounds { .. })
        ));
        // Issue 26, item 6: the bounds are the size itself, not the size rounded up to 4: a whole
        // word at offset 4 of 6 bytes (two bytes past the end) and any write at 8 are refused,
        // and the bytes written before stay.
        assert!(matches!(
            pool.write(&allocation, 4, &[1, 2, 3, 4]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.write(&allocation, 8, &[]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.write(&allocation, 8, &[1, 2, 3, 4]),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert_eq!(
            pool.read(&allocation).unwrap(),
            [1, 2, 3, 4, 9, 8],
            "{limits}: nothing written by the refusals"
        );
    }
}

#[test]
fn typed_reads_and_writes_of_pod_elements() {
    // Issue 13, item 9: `&[T]` in, `Vec<T>` out, for any `T: Pod`, with typed errors.
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let floats = pool.allocate(5 * 4).unwrap();
    let values = [1.5f32, -2.0, 3.25, 0.0, 7.0];
    pool.write_slice(&floats, 0, &values).unwrap();
    assert_eq!(pool.read_vec::<f32>(&floats).unwrap(), values);
    // Three-byte elements: 9 bytes, padded by the pool.
    let triples = pool.allocate(9).unwrap();
    let data = [[1u8, 2, 3], [4, 5, 6], [7, 8, 9]];
    pool.write_slice(&triples, 0, &data).unwrap();
    assert_eq!(pool.read_vec::<[u8; 3]>(&triples).unwrap(), data);
    assert_eq!(
        pool.submit_and_read_vec::<[u8; 3], _>([], &triples)
            .unwrap(),
        data
    );
    // u64s at an 8-byte offset.
    let longs = pool.allocate(24).unwrap();
    pool.write_slice(&longs, 8, &[u64::MAX, 42]).unwrap();
    assert_eq!(pool.read_vec::<u64>(&longs).unwrap()[1..], [u64::MAX, 42]);
    // Typed errors: a size that is not a whole number of elements, data that does not fit.
    assert_eq!(
        pool.read_vec::<u64>(&floats).unwrap_err(),
        PoolError::ElementSize {
            size_bytes: 20,
            element_bytes: 8
        }
    );
    assert!(matches!(
        pool.submit_and_read_vec::<u64, _>([], &floats),
        Err(PoolError::ElementSize { .. })
    ));
    assert!(matches!(
        pool.write_slice(&floats, 0, &[0f32; 6]),
        Err(PoolError::OutOfBounds { .. })
    ));
    assert_eq!(
        pool.read_vec::<f32>(&floats).unwrap(),
        values,
        "nothing written"
    );
}

#[test]
fn statistics_tell_live_allocations_from_pending_frees() {
    // Issue 13, item 10: a dropped allocation waiting for a submission still holds its range
    // (allocated), but the statistics say which part of allocated is live and which pending.
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let live = pool.allocate(4096).unwrap();
    let dropped = pool.allocate(1 << 20).unwrap();
    let dropped_bytes = dropped.allocated_size();
    drop(dropped);
    let stats = pool.stats();
    assert_eq!(stats.pending_free_bytes, dropped_bytes);
    assert_eq!(stats.pending_frees, 1);
    assert_eq!(stats.live_allocated_bytes(), live.allocated_size());
    assert_eq!(stats.live_allocations(), 1);
    // The state (and so the JSON and the snapshot) carries the same figures.
    let state = pool.memory_state();
    assert_eq!(state.stats.pending_free_bytes, dropped_bytes);
    let json = wgpu_pool::report::Report::from_pool(&pool)
        .to_json()
        .unwrap();
    assert!(json.contains("\"pending_free_bytes\""), "{json}");
    let summary = wgpu_pool::report::Report::from_pool(&pool).to_string();
    assert!(
        summary.contains("Live allocated memory: 4.00 KiB"),
        "{summary}"
    );
    pool.submit([]);
    let stats = pool.stats();
    assert_eq!((stats.pending_frees, stats.pending_free_bytes), (0, 0));
    assert_eq!(stats.allocated_bytes.current, live.allocated_size());
}

#[test]
fn a_pool_over_a_device_made_elsewhere() {
    // Issue 13, item 8: another crate opened the device; the pool (and a compute context on it)
    // takes the device and queue as they are handed out, without an adapter.
    let base = gpu();
    let (device, queue) = pollster::block_on(
        base.adapter
            .as_ref()
            .expect("requested here")
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("made elsewhere"),
                required_limits: wgpu::Limits::default()
                    .or_worse_values_from(&base.device.limits()),
                ..Default::default()
            }),
    )
    .expect("a device");
    let elsewhere = Gpu::from_device(device, queue);
    assert!(elsewhere.adapter.is_none());
    assert_eq!(elsewhere.info.name, base.info.name);
    let pool = Pool::new(&elsewhere, PoolOptions::default()).unwrap();
    let allocation = pool.allocate(64).unwrap();
    pool.write_slice(&allocation, 0, &[5u32; 16]).unwrap();
    assert_eq!(pool.read_vec::<u32>(&allocation).unwrap(), [5u32; 16]);
    let context =
        wgpu_pool::compute::Context::new(&pool, wgpu_pool::compute::ContextOptions::default())
            .unwrap();
    let x = context.tensor(&[1.0, -2.0, 3.0], &[3]).unwrap();
    let y = context.add(&x, &x).unwrap();
    assert_eq!(context.read(&y).unwrap(), [2.0, -4.0, 6.0]);
    let report = wgpu_pool::report::Report::from_pool(&pool).to_string();
    assert!(report.contains(&base.info.name), "{report}");
}

#[test]
fn async_reads_return_what_the_blocking_ones_do() {
    // Issue 13, item 12: a read as a future (any executor; here pollster's), in pieces too.
    let gpu = gpu_with_max_buffer_size(48 << 20);
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let small = pool.allocate(10).unwrap();
    pool.write(&small, 0, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
        .unwrap();
    assert_eq!(
        pollster::block_on(pool.read_async(&small)).unwrap(),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    );
    let size = (40 << 20) + 8;
    let big = pool
        .allocate_with(
            size,
            AllocOptions {
                bindable: false,
                ..Default::default()
            },
        )
        .unwrap();
    let words: Vec<u32> = (0..(size / 4) as u32).map(|i| pattern(5, i)).collect();
    pool.write_slice(&big, 0, &words).unwrap();
    assert!(pollster::block_on(pool.read_vec_async::<u32>(&big)).unwrap() == words);
    assert!(matches!(
        pollster::block_on(pool.read_vec_async::<u64>(&small)),
        Err(PoolError::ElementSize { .. })
    ));
    let other = Pool::new(&gpu, PoolOptions::default()).unwrap();
    assert!(matches!(
        pollster::block_on(other.read_async(&small)),
        Err(PoolError::ForeignAllocation { .. })
    ));
}

#[test]
fn a_device_can_be_had_without_blocking() {
    // Issue 13, item 12: the device request as a future (what a browser runs).
    let gpu = pollster::block_on(wgpu_pool::request_gpu_async(
        wgpu_pool::LimitsChoice::WebGpuDefault,
    ))
    .unwrap_or_else(|error| panic!("this test needs a GPU adapter and found none: {error}"));
    let pool = Pool::new(&gpu, PoolOptions::default()).unwrap();
    let allocation = pool.allocate(8).unwrap();
    pool.write_slice(&allocation, 0, &[3u32, 4]).unwrap();
    assert_eq!(
        pollster::block_on(pool.read_vec_async::<u32>(&allocation)).unwrap(),
        [3, 4]
    );
}

#[test]
fn request_gpu_shares_one_instance() {
    // Issue 13, item 8: one instance per process, which `request_gpu` takes its adapters from
    // (on GL each device needs an instance of its own: `device::fresh_instance`).
    let shared = wgpu_pool::instance();
    assert!(shared == wgpu_pool::instance(), "instance() is shared");
    assert!(shared != wgpu_pool::fresh_instance());
    // Two devices from it at once, each with a pool that works.
    let gpus: Vec<_> = (0..2)
        .map(|_| {
            wgpu_pool::request_gpu(wgpu_pool::LimitsChoice::WebGpuDefault).unwrap_or_else(|error| {
                panic!("this test needs a GPU adapter and found none: {error}")
            })
        })
        .collect();
    for (i, gpu) in gpus.iter().enumerate() {
        let pool = Pool::new(gpu, PoolOptions::default()).unwrap();
        let allocation = pool.allocate(4).unwrap();
        pool.write_slice(&allocation, 0, &[i as u32 + 7]).unwrap();
        assert_eq!(pool.read_vec::<u32>(&allocation).unwrap(), [i as u32 + 7]);
    }
}

/// `Pool::budget_scope`: nested scopes put back the budget before each, in order; a budget
/// set by hand meanwhile is left as it is; a scope's budget binds the pool while it lives.
#[test]
fn budget_scopes_nest_and_put_back_the_budget_before_them() {
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    assert_eq!(pool.budget(), None);
    {
        let outer = pool.budget_scope(Some(8 << 20));
        assert_eq!(pool.budget(), Some(8 << 20));
        assert_eq!(
            (outer.budget_bytes(), outer.previous_bytes()),
            (Some(8 << 20), None)
        );
        {
            let _inner = pool.budget_scope(Some(4 << 20));
            assert_eq!(pool.budget(), Some(4 << 20));
            // The inner budget binds: 5 MiB more than it allows is refused.
            assert!(matches!(
                pool.allocate(5 << 20),
                Err(PoolError::OutOfMemory(_))
            ));
            {
                let _none = pool.budget_scope(None);
                assert_eq!(pool.budget(), None);
            }
            assert_eq!(pool.budget(), Some(4 << 20));
        }
        assert_eq!(pool.budget(), Some(8 << 20));
        let held = pool.allocate(5 << 20).unwrap();
        drop(held);
        drop(outer);
    }
    assert_eq!(pool.budget(), None);
    // A budget set by hand while a scope lives is not the scope's to take back.
    let scope = pool.budget_scope(Some(1 << 20));
    pool.set_budget(Some(3 << 20));
    drop(scope);
    assert_eq!(pool.budget(), Some(3 << 20));
    // The scope holds a clone of the pool: it outlives the handle it came from.
    let clone = pool.clone();
    let scope = clone.budget_scope(Some(2 << 20));
    drop(clone);
    assert_eq!(pool.budget(), Some(2 << 20));
    drop(scope);
    assert_eq!(pool.budget(), Some(3 << 20));
}

/// `Pool::allocate_in_own_segment`: a request of any size class gets a segment of exactly its
/// size rounded up to a block (what `own_segment_bytes` says), where `allocate` would give a
/// mid-sized request a power-of-two segment with room for two.
#[test]
fn an_allocation_in_its_own_segment_reserves_its_rounded_size() {
    let pool = Pool::new(gpu(), PoolOptions::default()).unwrap();
    let block = pool.policy().min_block_bytes;
    for size in [100, 70_000, (3 << 20) + 12, 20 << 20] {
        let before = pool.stats().reserved_bytes.current;
        let allocation = pool
            .allocate_in_own_segment(size, AllocOptions::labeled("own"))
            .unwrap();
        let reserved = pool.stats().reserved_bytes.current - before;
        assert_eq!(reserved, size.div_ceil(block) * block, "{size} bytes");
        assert_eq!(pool.own_segment_bytes(size), reserved, "{size} bytes");
        assert_eq!(allocation.size(), size);
        drop(allocation);
        pool.submit([]);
        pool.trim();
        assert_eq!(pool.stats().reserved_bytes.current, before, "{size} bytes");
    }
    // Under a budget, a request whose rounded size fits is placed, one byte more is refused.
    let base = pool.stats().reserved_bytes.current;
    let _scope = pool.budget_scope(Some(base + (3 << 20)));
    let size = (3 << 20) - block + 1;
    let fits = pool.allocate_in_own_segment(size, AllocOptions::default());
    assert!(fits.is_ok());
    assert!(matches!(
        pool.allocate_in_own_segment(block + 1, AllocOptions::default()),
        Err(PoolError::OutOfMemory(_))
    ));
}
