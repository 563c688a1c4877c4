// The storage bindings of matmul.wgsl when K or N is not a multiple of 4 (the host prepends this
// file to the kernel when VEC4 is false; matmul_vec4.wgsl otherwise): rows of A, B and C start
// anywhere, so every element is loaded and stored on its own (one 4-byte access each, coalesced
// across neighbouring invocations). The vec4 accessors below are what the vec4 variant uses;
// here they only keep the kernel's other branch well-typed.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.

// `Input` (A, B, the bias) and `Output` (C, or the f32 partial products of a split) are f32 or
// f16, written by the host: the accessors convert to and from the kernel's f32.
@group(0) @binding(1) var<storage, read_write> a: array<Input>;
@group(0) @binding(2) var<storage, read_write> b: array<Input>;
@group(0) @binding(3) var<storage, read_write> c: array<Output>;
@group(0) @binding(4) var<storage, read_write> bias: array<Input>;

fn a_at(e: u32) -> f32 {
    return f32(a[e]);
}

fn b_at(e: u32) -> f32 {
    return f32(b[e]);
}

fn bias_at(e: u32) -> f32 {
    return f32(bias[e]);
}

fn store_c_at(e: u32, x: f32) {
    c[e] = Output(x);
}

fn a_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(f32(a[e]), f32(a[e + 1u]), f32(a[e + 2u]), f32(a[e + 3u]));
}

fn b_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(f32(b[e]), f32(b[e + 1u]), f32(b[e + 2u]), f32(b[e + 3u]));
}

fn bias_vec4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    return vec4<f32>(f32(bias[e]), f32(bias[e + 1u]), f32(bias[e + 2u]), f32(bias[e + 3u]));
}

fn store_c_vec4(i: u32, v: vec4<f32>) {
    let e = 4u * i;
    c[e] = Output(v.x);
    c[e + 1u] = Output(v.y);
    c[e + 2u] = Output(v.z);
    c[e + 3u] = Output(v.w);
}
