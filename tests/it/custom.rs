//! Kernels of the user's through the context ([`Context::user_kernel`], [`Context::dispatch`],
//! [`Context::dispatch_with`]): checked once against their WGSL, recorded into the context's
//! batches with their tensors' ranges kept, parameters through the context's uniform ring, outputs
//! that take ranges dropped in the batch, bind groups cached, counted in the context's statistics,
//! and captured into plans.

use wgpu_pool::compute::{
    BinaryOp, ComputeError, Context, ContextOptions, Feed, Launch, Tensor, UnaryOp, UserBindGroup,
    UserKernel, UserKernelDesc,
};
use wgpu_pool::{Gpu, Pool, PoolOptions};

use crate::compute::context_with;
use crate::gpu::{gpu, wgsl_pipeline};

fn context(gpu: &Gpu) -> Context {
    context_with(gpu, ContextOptions::default())
}

/// Where a tensor lies: its segment and offset.
fn place(tensor: &Tensor) -> (wgpu_pool::policy::SegmentId, u64) {
    tensor.location().expect("a tensor with memory")
}

/// A kernel of `wgsl` (entry point `main`) binding `tensors` tensors, with parameters of
/// `params_bytes` bytes and `groups` further groups.
fn kernel_of(
    context: &Context,
    wgsl: &str,
    tensors: usize,
    params_bytes: u64,
    groups: &[&wgpu::BindGroupLayout],
) -> Result<UserKernel, ComputeError> {
    context.user_kernel(&UserKernelDesc {
        label: "test kernel",
        wgsl,
        entry_point: "main",
        tensors,
        params_bytes,
        groups,
    })
}

/// The layout of a group holding one uniform buffer at binding 0.
fn uniform_layout(gpu: &Gpu) -> wgpu::BindGroupLayout {
    buffer_layout(gpu, wgpu::BufferBindingType::Uniform)
}

fn buffer_layout(gpu: &Gpu, ty: wgpu::BufferBindingType) -> wgpu::BindGroupLayout {
    gpu.device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("test layout"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        })
}

/// `y = factor · x` with the factor in group 1.
const SCALE_BY_GROUP: &str = "@group(0) @binding(1) var<storage, read_write> x: array<f32>;
     @group(0) @binding(2) var<storage, read_write> y: array<f32>;
     @group(1) @binding(0) var<uniform> factor: vec4<f32>;
     @compute @workgroup_size(64)
     fn main(@builtin(global_invocation_id) id: vec3<u32>) {
         if id.x < arrayLength(&y) { y[id.x] = factor.x * x[id.x]; }
     }";

/// `y = a · x + b` over `len` elements, with its parameters at binding 0.
const AXPB: &str = "struct Params { a: f32, b: f32, len: u32, pad: u32 }
     @group(0) @binding(0) var<uniform> params: Params;
     @group(0) @binding(1) var<storage, read_write> x: array<f32>;
     @group(0) @binding(2) var<storage, read_write> y: array<f32>;
     @compute @workgroup_size(64)
     fn main(@builtin(global_invocation_id) id: vec3<u32>) {
         if id.x < params.len { y[id.x] = params.a * x[id.x] + params.b; }
     }";

/// The parameters of [`AXPB`].
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Axpb {
    a: f32,
    b: f32,
    len: u32,
    pad: u32,
}

/// A kernel of the user's own, outside the context: `y = x` (every storage binding
/// `read_write`), recorded in an encoder of the test's.
fn copy_pipeline(gpu: &Gpu) -> wgpu::ComputePipeline {
    wgsl_pipeline(
        gpu,
        "test copy",
        "@group(0) @binding(0) var<storage, read_write> x: array<f32>;
         @group(0) @binding(1) var<storage, read_write> y: array<f32>;
         @compute @workgroup_size(64)
         fn main(@builtin(global_invocation_id) id: vec3<u32>) {
             if id.x < arrayLength(&y) { y[id.x] = x[id.x]; }
         }",
    )
}

/// The same kernel made by the context: tensors at bindings 1 and 2.
fn copy_kernel(context: &Context) -> UserKernel {
    context
        .user_kernel(&UserKernelDesc {
            label: "test copy",
            wgsl: "@group(0) @binding(1) var<storage, read_write> x: array<f32>;
                   @group(0) @binding(2) var<storage, read_write> y: array<f32>;
                   @compute @workgroup_size(64)
                   fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                       if id.x < arrayLength(&y) { y[id.x] = x[id.x]; }
                   }",
            entry_point: "main",
            tensors: 2,
            ..UserKernelDesc::default()
        })
        .expect("kernel")
}

#[test]
fn a_users_kernel_recorded_through_the_context_keeps_its_tensors_ranges() {
    let gpu = gpu();
    let context = context(gpu);
    let pipeline = copy_pipeline(gpu);
    let kernel = copy_kernel(&context);
    let data: Vec<f32> = (1..=64).map(|i| i as f32).collect();
    let other = vec![-1.0f32; 64];

    // Issue 26, item 11: a tensor whose allocation the user bound in an encoder of their own,
    // then dropped before that encoder is submitted, keeps its range until the pool's next
    // submission: neither an upload made while no batch is open (which used to take the range
    // at once and land before the user's kernel read it) nor an op's output in the open batch
    // (which used to take the range of a same-size tensor dropped in the batch) gets it.
    let user_kernel = |x: &Tensor, y: &Tensor| {
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: x.allocation().as_binding_resource(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: y.allocation().as_binding_resource(),
                },
            ],
        });
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        encoder.finish()
    };
    // No batch open: an upload.
    let x = context.tensor(&data, &[64]).unwrap();
    let y = context.tensor(&[0.0; 64], &[64]).unwrap();
    let work = user_kernel(&x, &y);
    let x_range = place(&x);
    assert_eq!(context.pending_dispatches(), 0);
    drop(x);
    let z = context.tensor(&other, &[64]).unwrap();
    assert_ne!(
        place(&z),
        x_range,
        "an upload took a range the user's work reads"
    );
    context.pool().submit([work]);
    assert_eq!(
        y.to_vec().unwrap(),
        data,
        "the user's kernel read another tensor's data"
    );
    drop((y, z));
    // A batch open: an op's output of the same size.
    let x = context.tensor(&data, &[64]).unwrap();
    let y = context.tensor(&[0.0; 64], &[64]).unwrap();
    let ones = context.tensor(&[1.0; 64], &[64]).unwrap();
    let opened = context.binary_scalar(BinaryOp::Mul, &ones, 3.0).unwrap();
    assert!(context.pending_dispatches() > 0, "a batch is open");
    let work = user_kernel(&x, &y);
    let x_range = place(&x);
    drop(x);
    let output = context.binary_scalar(BinaryOp::Mul, &ones, 2.0).unwrap();
    assert_ne!(
        place(&output),
        x_range,
        "an op's output took a range the user's work reads"
    );
    // The same without handing out the allocation: the output does take the dropped range.
    let unexposed = context.binary_scalar(BinaryOp::Mul, &ones, 4.0).unwrap();
    let unexposed_range = place(&unexposed);
    drop(unexposed);
    let taker = context.binary_scalar(BinaryOp::Mul, &ones, 5.0).unwrap();
    assert_eq!(place(&taker), unexposed_range, "in-batch reuse still works");
    // Reading a tensor back is the context's own use, not a hand-out: its range is still handed
    // on once it is dropped in an open batch.
    let read = context.binary_scalar(BinaryOp::Mul, &ones, 6.0).unwrap();
    assert_eq!(read.to_vec().unwrap(), vec![6.0; 64]);
    let reader = context.unary(UnaryOp::Neg, &read).unwrap();
    let read_range = place(&read);
    drop(read);
    let after_read = context.unary(UnaryOp::Neg, &reader).unwrap();
    assert_eq!(
        place(&after_read),
        read_range,
        "a tensor read back was taken as handed out"
    );
    assert_eq!(after_read.to_vec().unwrap(), vec![6.0; 64]);
    drop((reader, after_read));
    assert_eq!(output.to_vec().unwrap(), vec![2.0; 64]);
    context.pool().submit([work]);
    assert_eq!(
        y.to_vec().unwrap(),
        data,
        "the user's kernel read another tensor's data"
    );
    assert_eq!(opened.to_vec().unwrap(), vec![3.0; 64]);
    assert_eq!(taker.to_vec().unwrap(), vec![5.0; 64]);
    drop((y, ones, opened, output, taker));

    // Through the context: the dispatch joins the batch, the dropped input keeps its range until
    // the batch is submitted, and the kernel reads its own data.
    let x = context.tensor(&data, &[64]).unwrap();
    let y = context.tensor(&[0.0; 64], &[64]).unwrap();
    let x_range = place(&x);
    context.dispatch(&kernel, &[&x, &y], [1, 1, 1]).unwrap();
    assert_eq!(context.pending_dispatches(), 1);
    drop(x);
    let z = context.tensor(&other, &[64]).unwrap();
    assert_ne!(
        place(&z),
        x_range,
        "a range the open batch reads was reused"
    );
    assert_eq!(y.to_vec().unwrap(), data);
    // Mixed with the context's own ops in one batch, and after it the range is reusable.
    let doubled = context.binary_scalar(BinaryOp::Mul, &y, 2.0).unwrap();
    let w = context.tensor(&[0.0; 64], &[64]).unwrap();
    context
        .dispatch(&kernel, &[&doubled, &w], [1, 1, 1])
        .unwrap();
    let expected: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
    assert_eq!(w.to_vec().unwrap(), expected);
    drop(z);

    // Typed errors that record nothing.
    let pending = context.pending_dispatches();
    let foreign_context = context_with(gpu, ContextOptions::default());
    let foreign = foreign_context.tensor(&data, &[64]).unwrap();
    assert_eq!(
        context.dispatch(&kernel, &[&foreign, &y], [1, 1, 1]),
        Err(ComputeError::ForeignTensor { op: "dispatch" })
    );
    let too_many = context.limits().max_compute_workgroups_per_dimension + 1;
    let beyond = context.dispatch(&kernel, &[&w, &y], [too_many, 1, 1]);
    assert!(
        matches!(beyond, Err(ComputeError::ExceedsLimit { .. })),
        "{beyond:?}"
    );
    let wrong_layout = context.dispatch(&kernel, &[&w], [1, 1, 1]);
    assert!(
        matches!(wrong_layout, Err(ComputeError::UserKernel { .. })),
        "{wrong_layout:?}"
    );
    assert_eq!(context.pending_dispatches(), pending);
}

#[test]
fn a_users_kernel_takes_its_own_bind_groups_after_the_tensors() {
    let gpu = gpu();
    let context = context(gpu);
    let layout = uniform_layout(gpu);
    let kernel = kernel_of(&context, SCALE_BY_GROUP, 2, 0, &[&layout]).unwrap();
    let factor = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test factor"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    gpu.queue
        .write_buffer(&factor, 0, bytemuck::cast_slice(&[3.0f32, 0.0, 0.0, 0.0]));
    let group = kernel
        .bind_group(
            1,
            &[wgpu::BindGroupEntry {
                binding: 0,
                resource: factor.as_entire_binding(),
            }],
        )
        .unwrap();
    let data: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
    let x = context.tensor(&data, &[10, 10]).unwrap();
    let y = context.empty(&[10, 10]).unwrap();
    let groups: [&UserBindGroup; 1] = [&group];
    context
        .dispatch_with(
            &kernel,
            &Launch::new([2, 1, 1]).tensors(&[&x, &y]).groups(&groups),
        )
        .unwrap();
    // An op of the context after it, in the same batch, on what it wrote.
    let z = context.neg(&y).unwrap();
    let expected: Vec<f32> = data.iter().map(|v| -3.0 * v).collect();
    assert_eq!(z.to_vec().unwrap(), expected);
    assert!(matches!(
        context.dispatch_with(&kernel, &Launch::new([1, 1, 1]).groups(&groups)),
        Err(ComputeError::UserKernel { .. })
    ));

    // What wgpu checks only at a dispatch is refused at the call, and the open batch survives:
    // an op recorded before the refusals is read back after them.
    let before = context.neg(&x).unwrap();
    let pending = context.pending_dispatches();
    let missing = context.dispatch(&kernel, &[&x, &y], [2, 1, 1]);
    let Err(ComputeError::UserKernel {
        reason: message, ..
    }) = missing
    else {
        panic!("a dispatch without group 1: {missing:?}");
    };
    assert!(message.contains("groups 1..=1"), "{message}");
    // A group made for another layout at group 1: a storage buffer where the kernel takes a
    // uniform.
    let storage_layout = buffer_layout(gpu, wgpu::BufferBindingType::Storage { read_only: true });
    let other_kernel = kernel_of(
        &context,
        &SCALE_BY_GROUP.replace(
            "var<uniform> factor: vec4<f32>",
            "var<storage, read> factor: vec4<f32>",
        ),
        2,
        0,
        &[&storage_layout],
    )
    .unwrap();
    let other = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test storage"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let other_group = other_kernel
        .bind_group(
            1,
            &[wgpu::BindGroupEntry {
                binding: 0,
                resource: other.as_entire_binding(),
            }],
        )
        .unwrap();
    let wrong = context.dispatch_with(
        &kernel,
        &Launch::new([2, 1, 1])
            .tensors(&[&x, &y])
            .groups(&[&other_group]),
    );
    assert!(
        matches!(wrong, Err(ComputeError::UserKernel { .. })),
        "{wrong:?}"
    );
    // A bind group of a group the kernel does not have, or of entries its layout refuses.
    assert!(matches!(
        kernel.bind_group(2, &[]),
        Err(ComputeError::UserKernel { .. })
    ));
    assert!(matches!(
        kernel.bind_group(
            1,
            &[wgpu::BindGroupEntry {
                binding: 0,
                resource: other.as_entire_binding(),
            }]
        ),
        Err(ComputeError::UserKernel { .. })
    ));
    assert_eq!(context.pending_dispatches(), pending, "a refusal recorded");
    let negated: Vec<f32> = data.iter().map(|v| -v).collect();
    assert_eq!(before.to_vec().unwrap(), negated);
}

#[test]
fn a_read_only_binding_is_refused_whatever_the_placement() {
    // Issue 26, item 10: a kernel declaring an input `var<storage, read>` ran while its tensors
    // lay in different buffers and failed once the pool put them in one segment. The kernel is
    // now refused when it is made, from its WGSL, wherever its tensors would lie.
    let gpu = gpu();
    let source = "@group(0) @binding(1) var<storage, read> x: array<f32>;
                 @group(0) @binding(2) var<storage, read_write> y: array<f32>;
                 @compute @workgroup_size(64)
                 fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                     if id.x < arrayLength(&y) { y[id.x] = 2.0 * x[id.x]; }
                 }";
    let data: Vec<f32> = (0..64).map(|i| i as f32).collect();
    // Every tensor a buffer of its own (the naive pool), and tensors of two classes in two
    // segments of a pool: refused all the same, with nothing recorded.
    let naive = Pool::naive(gpu, PoolOptions::default());
    let pooled = Pool::new(gpu, PoolOptions::default()).unwrap();
    for (name, pool, y_len) in [("naive", &naive, 64), ("pooled", &pooled, 1 << 20)] {
        let context = Context::new(pool, ContextOptions::default()).unwrap();
        let x = context.tensor(&data, &[64]).unwrap();
        let y = context.zeros(&[y_len]).unwrap();
        assert_ne!(
            place(&x).0,
            place(&y).0,
            "{name}: the test needs tensors in two buffers"
        );
        let pending = context.pending_dispatches();
        let refused = kernel_of(&context, source, 2, 0, &[]);
        let Err(ComputeError::ReadOnlyBinding { .. }) = &refused else {
            panic!("{name}: {refused:?}");
        };
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("read_write"), "{name}: {message}");
        assert_eq!(context.pending_dispatches(), pending, "{name}: recorded");
        // And again.
        assert!(matches!(
            kernel_of(&context, source, 2, 0, &[]),
            Err(ComputeError::ReadOnlyBinding { .. })
        ));
        // The same kernel declared read_write runs, on both.
        let fixed = kernel_of(
            &context,
            &source.replace("var<storage, read> x", "var<storage, read_write> x"),
            2,
            0,
            &[],
        )
        .unwrap();
        context.dispatch(&fixed, &[&x, &y], [1, 1, 1]).unwrap();
        let doubled: Vec<f32> = data.iter().map(|v| 2.0 * v).collect();
        assert_eq!(y.to_vec().unwrap()[..64], doubled, "{name}");
    }
}

#[test]
fn a_users_kernel_takes_parameters_through_the_ring_and_makes_its_outputs() {
    let gpu = gpu();
    let context = context(gpu);
    let kernel = kernel_of(&context, AXPB, 2, 16, &[]).unwrap();
    let made = context.stats();
    assert_eq!(made.user_kernels, 1, "{made:?}");
    let data: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let x = context.tensor(&data, &[100]).unwrap();
    let ones = context.tensor(&[1.0; 100], &[100]).unwrap();
    let before = context.stats();
    // Two dispatches of one batch with different parameters, each with an output of its own.
    let first = Axpb {
        a: 2.0,
        b: 1.0,
        len: 100,
        pad: 0,
    };
    let second = Axpb {
        a: -1.0,
        b: 0.5,
        len: 100,
        pad: 0,
    };
    let inputs = [&x];
    let launch = |params| {
        Launch::new([2, 1, 1])
            .params(params)
            .tensors(&inputs)
            .output(&[100])
    };
    let y = context
        .dispatch_with(&kernel, &launch(&first))
        .unwrap()
        .remove(0);
    let z = context
        .dispatch_with(&kernel, &launch(&second))
        .unwrap()
        .remove(0);
    assert_eq!(y.shape(), [100]);
    // An output takes the range of a tensor of its size dropped in the open batch, as an op's
    // output does.
    let dropped = context.binary_scalar(BinaryOp::Mul, &ones, 3.0).unwrap();
    let dropped_range = place(&dropped);
    drop(dropped);
    let w = context
        .dispatch_with(&kernel, &launch(&first))
        .unwrap()
        .remove(0);
    assert_eq!(
        place(&w),
        dropped_range,
        "the output did not take the dropped range"
    );
    let after = context.stats();
    assert_eq!(
        after.user_dispatches - before.user_dispatches,
        3,
        "{after:?}"
    );
    assert_eq!(after.dispatches - before.dispatches, 4, "{after:?}");
    assert!(
        after.params_bytes_written == before.params_bytes_written,
        "nothing written before the batch is submitted"
    );
    let want = |p: Axpb| -> Vec<f32> { data.iter().map(|v| p.a * v + p.b).collect() };
    assert_eq!(y.to_vec().unwrap(), want(first));
    assert_eq!(z.to_vec().unwrap(), want(second));
    assert_eq!(w.to_vec().unwrap(), want(first));
    let read = context.stats();
    assert!(
        read.params_bytes_written >= before.params_bytes_written + 3 * 16,
        "{read:?}"
    );
    // Group 0 is cached by the ranges it binds, as the context's own ops' are: the same tensors
    // again find their bind group.
    let out = context.empty(&[100]).unwrap();
    context
        .dispatch_with(
            &kernel,
            &Launch::new([2, 1, 1]).params(&first).tensors(&[&x, &out]),
        )
        .unwrap();
    let once = context.stats();
    context
        .dispatch_with(
            &kernel,
            &Launch::new([2, 1, 1]).params(&second).tensors(&[&x, &out]),
        )
        .unwrap();
    let twice = context.stats();
    assert_eq!(
        twice.bind_groups_created, once.bind_groups_created,
        "{twice:?}"
    );
    assert_eq!(
        twice.bind_group_cache_hits,
        once.bind_group_cache_hits + 1,
        "{twice:?}"
    );
    assert_eq!(out.to_vec().unwrap(), want(second));
}

#[test]
fn a_users_kernel_is_checked_once_against_its_wgsl() {
    let gpu = gpu();
    let context = context(gpu);
    let config = |result: Result<UserKernel, ComputeError>| match result {
        Err(ComputeError::UserKernel {
            reason: message, ..
        }) => message,
        other => panic!("{other:?}"),
    };
    // Refused when made: WGSL that does not parse, a group without a layout, binding 0 not the
    // parameters' uniform, a binding past the tensors, no tensors, a missing entry point,
    // parameters larger than the ring binds.
    config(kernel_of(&context, "fn main( {", 1, 0, &[]));
    let message = config(kernel_of(&context, SCALE_BY_GROUP, 2, 0, &[]));
    assert!(message.contains("group 1"), "{message}");
    config(kernel_of(&context, AXPB, 2, 0, &[]));
    config(kernel_of(&context, AXPB, 1, 16, &[]));
    config(kernel_of(&context, AXPB, 0, 16, &[]));
    // More tensors than the WGSL declares (one would be bound to nothing), and parameters
    // smaller than the uniform (its last bytes never given).
    let message = config(kernel_of(&context, AXPB, 3, 16, &[]));
    assert!(message.contains("binding 3"), "{message}");
    let message = config(kernel_of(&context, AXPB, 2, 8, &[]));
    assert!(message.contains("params_bytes (8)"), "{message}");
    let missing_entry = context.user_kernel(&UserKernelDesc {
        label: "test",
        wgsl: AXPB,
        entry_point: "absent",
        tensors: 2,
        params_bytes: 16,
        groups: &[],
    });
    assert!(
        matches!(missing_entry, Err(ComputeError::Kernel { .. })),
        "{missing_entry:?}"
    );
    assert!(matches!(
        kernel_of(&context, AXPB, 2, 1 << 40, &[]),
        Err(ComputeError::ExceedsLimit { .. })
    ));

    // Refused at a dispatch, on the host, with nothing recorded and nothing allocated.
    let kernel = kernel_of(&context, AXPB, 2, 16, &[]).unwrap();
    let fixed = kernel_of(
        &context,
        "@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>, 64>;
         @compute @workgroup_size(64)
         fn main(@builtin(global_invocation_id) id: vec3<u32>) { x[id.x] = vec4<f32>(1.0); }",
        1,
        0,
        &[],
    )
    .unwrap();
    let x = context.tensor(&[1.0; 100], &[100]).unwrap();
    let y = context.empty(&[100]).unwrap();
    let pending = context.pending_dispatches();
    let live = context.pool().stats().allocations.current;
    let params = Axpb {
        a: 1.0,
        b: 0.0,
        len: 100,
        pad: 0,
    };
    let too_large = [0u32; 8];
    for (what, launch) in [
        ("no parameters", Launch::new([2, 1, 1]).tensors(&[&x, &y])),
        (
            "parameters too large",
            Launch::new([2, 1, 1]).params(&too_large).tensors(&[&x, &y]),
        ),
        (
            "one tensor",
            Launch::new([2, 1, 1]).params(&params).tensors(&[&x]),
        ),
        (
            "three tensors",
            Launch::new([2, 1, 1])
                .params(&params)
                .tensors(&[&x])
                .output(&[4])
                .output(&[4]),
        ),
    ] {
        let refused = context.dispatch_with(&kernel, &launch);
        assert!(
            matches!(refused, Err(ComputeError::UserKernel { .. })),
            "{what}: {refused:?}"
        );
    }
    // A tensor smaller than its binding's WGSL type (64 vec4s).
    let small = context.dispatch(&fixed, &[&x], [1, 1, 1]);
    assert!(
        matches!(small, Err(ComputeError::UserKernel { .. })),
        "{small:?}"
    );
    assert_eq!(context.pending_dispatches(), pending, "a refusal recorded");
    assert_eq!(
        context.pool().stats().allocations.current,
        live,
        "a refusal allocated"
    );
    let big = context.empty(&[256]).unwrap();
    context.dispatch(&fixed, &[&big], [1, 1, 1]).unwrap();
    assert_eq!(big.to_vec().unwrap(), vec![1.0; 256]);
    // A kernel serves every context of its device.
    let other = context_with(gpu, ContextOptions::default());
    other
        .dispatch(&fixed, &[&other.empty(&[256]).unwrap()], [1, 1, 1])
        .unwrap();
}

#[test]
fn a_users_kernel_with_parameters_and_outputs_is_captured() {
    let gpu = gpu();
    let context = context(gpu);
    let kernel = kernel_of(&context, AXPB, 2, 16, &[]).unwrap();
    let params = Axpb {
        a: 3.0,
        b: -1.0,
        len: 8,
        pad: 0,
    };
    let mut capture = context.capture().unwrap();
    let x = capture.input(&[8]).unwrap();
    let y = context
        .dispatch_with(
            &kernel,
            &Launch::new([1, 1, 1])
                .params(&params)
                .tensors(&[&x])
                .output(&[8]),
        )
        .unwrap()
        .remove(0);
    let z = context.neg(&y).unwrap();
    let mut plan = capture.finish(&[&z]).unwrap();
    for round in 0..3 {
        let input: Vec<f32> = (0..8).map(|i| (i + round) as f32).collect();
        let got = plan.run(&[Feed::Data(&input)]).unwrap();
        let want: Vec<f32> = input.iter().map(|v| -(3.0 * v - 1.0)).collect();
        assert_eq!(got[0], want, "round {round}");
    }
}
