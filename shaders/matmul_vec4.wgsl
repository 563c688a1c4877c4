// The storage bindings of matmul.wgsl for K and N multiples of 4 (the host prepends this file to
// the kernel when VEC4 is true; matmul_scalar.wgsl otherwise): every row of A, B and C is whole
// vec4s, loaded and stored as such. The element accessors below are what the scalar variant
// uses; here they only keep the kernel's other branch well-typed.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.

// `Input` (A, B, the bias) and `Output` (C, or the f32 partial products of a split) are f32 or
// f16, written by the host: the accessors convert to and from the kernel's f32.
@group(0) @binding(1) var<storage, read_write> a: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<Input>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<Output>>;
@group(0) @binding(4) var<storage, read_write> bias: array<vec4<Input>>;

fn a_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(a[i]);
}

fn b_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(b[i]);
}

fn bias_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(bias[i]);
}

fn store_c_vec4(i: u32, v: vec4<f32>) {
    c[i] = vec4<Output>(v);
}

fn a_at(e: u32) -> f32 {
    return f32(a[e / 4u][e % 4u]);
}

fn b_at(e: u32) -> f32 {
    return f32(b[e / 4u][e % 4u]);
}

fn bias_at(e: u32) -> f32 {
    return f32(bias[e / 4u][e % 4u]);
}

fn store_c_at(e: u32, x: f32) {
    c[e / 4u][e % 4u] = Output(x);
}
