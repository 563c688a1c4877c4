// Helpers shared by the kernels; the host puts this file (after each kernel's constants) before
// every kernel's source (src/compute/kernels.rs). The CPU twins in src/compute/cpu.rs compute
// the same functions.

// GELU, tanh approximation (PyTorch's `gelu(approximate="tanh")`), computed as
// x · sigmoid(t) = x / (1 + e^(−t)) with t = 2·√(2/π)·(x + 0.044715·x³): the same function as
// 0.5·x·(1 + tanh(t / 2)), with one exp and one division instead of a tanh (slow on some drivers,
// NaN for large arguments on others), and without the cancellation of 1 + tanh for negative
// arguments. t is clamped to [−80, 80] so that e^(−t) stays finite; below −80 the result is 0
// (as PyTorch's f32 formula gives there). CPU twin: `gelu` in src/compute/cpu.rs.
fn gelu4(x: vec4<f32>) -> vec4<f32> {
    let t = 1.5957691216057308 * (x + 0.044715 * x * x * x);
    let g = x / (vec4<f32>(1.0) + exp(-clamp(t, vec4<f32>(-80.0), vec4<f32>(80.0))));
    return select(g, vec4<f32>(0.0), t < vec4<f32>(-80.0));
}

fn relu4(x: vec4<f32>) -> vec4<f32> {
    return max(x, vec4<f32>(0.0));
}

// The fused activation of the matmul epilogue: 0 none, 1 relu, 2 gelu (`Activation::code` in
// src/compute/types/options.rs).
fn activate4(x: vec4<f32>, activation: u32) -> vec4<f32> {
    if (activation == 1u) {
        return relu4(x);
    }
    if (activation == 2u) {
        return gelu4(x);
    }
    return x;
}

// The linear index of invocation `local` of workgroup `workgroup` in a 2-D grid of `grid_x`
// workgroups per row, each of `size` invocations (grids past 65,535 workgroups are 2-D).
fn linear_index(workgroup: vec3<u32>, local: u32, grid_x: u32, size: u32) -> u32 {
    return (workgroup.y * grid_x + workgroup.x) * size + local;
}

// The parameters of the element-wise kernels (unary.wgsl, binary.wgsl): the Rust struct of the
// same name in src/compute/types/params.rs, whose layout a test checks against this one.
struct ElementwiseParams {
    len_vec4: u32,
    grid_x: u32,
    cols: u32,
    scalar: f32,
}

// A quiet NaN's bits. WGSL has no NaN literal, and a NaN made by a constant expression (a bitcast
// of these bits written in place) is an error in Tint (Chromium's compiler), which evaluates
// constant expressions when the module is created: reading a private variable makes the bitcast
// a run-time one.
var<private> NAN_BITS: u32 = 0x7fc00000u;

// A quiet NaN (see NAN_BITS).
fn quiet_nan() -> f32 {
    return bitcast<f32>(NAN_BITS);
}
