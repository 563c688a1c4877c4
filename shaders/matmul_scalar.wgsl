// The storage bindings of matmul.wgsl when K or N is not a multiple of 4 (the host prepends this
// file to the kernel when VEC4 is false; matmul_vec4.wgsl otherwise): rows of A, B and C start
// anywhere, so every element is loaded and stored on its own (one 4-byte access each, coalesced
// across neighbouring invocations). The vec4 accessors below are what the vec4 variant uses;
// here they only keep the kernel's other branch well-typed.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.

@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@group(0) @binding(4) var<storage, read_write> bias: array<f32>;

fn a_at(e: u32) -> f32 {
    return a[e];
}

fn b_at(e: u32) -> f32 {
    return b[e];
}

fn bias_at(e: u32) -> f32 {
    return bias[e];
}

fn store_c_at(e: u32, x: f32) {
    c[e] = x;
}

fn a_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(a[e], a[e + 1u], a[e + 2u], a[e + 3u]);
}

fn b_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(b[e], b[e + 1u], b[e + 2u], b[e + 3u]);
}

fn bias_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(bias[e], bias[e + 1u], bias[e + 2u], bias[e + 3u]);
}

fn store_c_vec4(i: u32, v: vec4<f32>) {
    let e = 4u * i;
    c[e] = v.x;
    c[e + 1u] = v.y;
    c[e + 2u] = v.z;
    c[e + 3u] = v.w;
}
