// Element-wise kernels of two inputs: y = a ∘ b (same shapes), and the row-broadcast bias add
// y[r, c] = a[r, c] + b[c]. One vec4 per invocation, workgroups of 256, a 2-D grid past 65,535
// workgroups. Tails and the element types `Input` and `Output`: see unary.wgsl. Every storage
// binding is read_write (pool rule).
// CPU twins: src/compute/cpu.rs, same names.

// `ElementwiseParams`: shaders/common.wgsl.
@group(0) @binding(0) var<uniform> params: ElementwiseParams;
@group(0) @binding(1) var<storage, read_write> a: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<Input>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<Output>>;

fn load_a(i: u32) -> vec4<f32> {
    return vec4<f32>(a[i]);
}

fn load_b(i: u32) -> vec4<f32> {
    return vec4<f32>(b[i]);
}

fn store(i: u32, v: vec4<f32>) {
    y[i] = vec4<Output>(v);
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load_a(i) + load_b(i));
    }
}

@compute @workgroup_size(256)
fn sub(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load_a(i) - load_b(i));
    }
}

@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load_a(i) * load_b(i));
    }
}

@compute @workgroup_size(256)
fn div(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, load_a(i) / load_b(i));
    }
}

@compute @workgroup_size(256)
fn maximum(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i < params.len_vec4) {
        store(i, max(load_a(i), load_b(i)));
    }
}

// `b` is the bias of `params.cols` values, rounded up to 16 bytes like every tensor.
@compute @workgroup_size(256)
fn add_bias(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i >= params.len_vec4) {
        return;
    }
    let cols = params.cols;
    if (cols % 4u == 0u) {
        // A vec4 never straddles two rows: one vec4 of the bias.
        store(i, load_a(i) + load_b(i % (cols / 4u)));
        return;
    }
    // A vec4 may straddle rows: the bias element of each lane.
    var bias = vec4<f32>(0.0);
    for (var lane = 0u; lane < 4u; lane++) {
        let col = (4u * i + lane) % cols;
        bias[lane] = f32(b[col / 4u][col % 4u]);
    }
    store(i, load_a(i) + bias);
}
