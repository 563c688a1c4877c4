// Element-wise kernels of one input: y = f(x), and y = x ∘ s with a scalar s.
// One vec4 per invocation, workgroups of 256, a 2-D grid past 65,535 workgroups.
//
// Tensors are allocated rounded up to 16 bytes, so the last vec4 is always in bounds; its lanes
// past the logical length hold whatever the memory held and produce values nobody reads.
// `Input` and `Output` (f32 or f16, written by the host before this file): what x and y hold;
// the arithmetic is f32 (`load` converts, `store` rounds once). A cast is `copy` from one type
// to the other.
// Every storage binding is read_write: input and output may share one pool segment buffer.
// CPU twins: src/compute/cpu.rs, same names.

// `ElementwiseParams`: shaders/common.wgsl.
@group(0) @binding(0) var<uniform> params: ElementwiseParams;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<Output>>;

fn load(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i]);
}

fn store(i: u32, v: vec4<f32>) {
    y[i] = vec4<Output>(v);
}

@compute @workgroup_size(256)
fn relu(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, relu4(load(i)));
    }
}

@compute @workgroup_size(256)
fn gelu(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, gelu4(load(i)));
    }
}

@compute @workgroup_size(256)
fn exp_kernel(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, exp(load(i)));
    }
}

@compute @workgroup_size(256)
fn neg(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, -load(i));
    }
}

@compute @workgroup_size(256)
fn sqrt_kernel(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, sqrt(load(i)));
    }
}

@compute @workgroup_size(256)
fn copy(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load(i));
    }
}

@compute @workgroup_size(256)
fn add_scalar(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load(i) + params.scalar);
    }
}

@compute @workgroup_size(256)
fn sub_scalar(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load(i) - params.scalar);
    }
}

@compute @workgroup_size(256)
fn mul_scalar(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load(i) * params.scalar);
    }
}

@compute @workgroup_size(256)
fn div_scalar(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load(i) / params.scalar);
    }
}

@compute @workgroup_size(256)
fn maximum_scalar(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, max(load(i), vec4<f32>(params.scalar)));
    }
}
