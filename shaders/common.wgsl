// Helpers shared by the kernels; the host prepends this file (and each kernel's constants) to
// every kernel's source (src/compute/kernels.rs). Keep in sync with the CPU twins in
// src/compute/cpu.rs.

// GELU, tanh approximation (PyTorch's `gelu(approximate="tanh")`). The argument of tanh is
// clamped to [-15, 15], where tanh is ±1 in f32 already: some drivers compute tanh through
// exp and return NaN for large arguments.
fn gelu4(x: vec4<f32>) -> vec4<f32> {
    let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (vec4<f32>(1.0) + tanh(clamp(inner, vec4<f32>(-15.0), vec4<f32>(15.0))));
}

fn relu4(x: vec4<f32>) -> vec4<f32> {
    return max(x, vec4<f32>(0.0));
}

// The fused activation of the matmul epilogue: 0 none, 1 relu, 2 gelu.
// Keep in sync with `Activation` in src/compute/ops/matmul.rs.
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
