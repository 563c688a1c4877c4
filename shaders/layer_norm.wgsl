// Layer normalization over the last dimension of a [rows, cols] tensor:
// y[r, c] = (x[r, c] − mean_r) / √(var_r + eps) · gamma[c] + beta[c], with mean_r and the
// (biased, as PyTorch's) variance var_r = Σ (x[r, ·] − mean_r)² / cols taken in two passes.
// One workgroup of 256 invocations per row (a 2-D grid past the x limit); each invocation walks
// the row with a stride of 256 (its first four values read once, kept in registers for the three
// passes), then a tree reduction in workgroup memory
// (shaders/workgroup_reduce.wgsl, put before this file). CPU twin: `layer_norm` in
// src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what x, gamma, beta and y hold; the
// statistics and the normalization are computed in f32. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct LayerNormParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: LayerNormParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> gamma: array<Input>;
@group(0) @binding(3) var<storage, read_write> beta: array<Input>;
@group(0) @binding(4) var<storage, read_write> y: array<Output>;

// Values of a row each invocation keeps in registers between the passes.
const CACHED: u32 = 4u;

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    let count = f32(params.cols);
    // The first CACHED values of the invocation's stride are read once and kept for the three
    // passes (all of a row of up to 1,024 columns); the rest are read in each pass.
    var kept: array<f32, CACHED>;
    var partial = 0.0;
    for (var i = 0u; i < CACHED; i++) {
        let col = local + 256u * i;
        if (col < params.cols) {
            kept[i] = f32(x[base + col]);
            partial += kept[i];
        }
    }
    for (var col = local + 256u * CACHED; col < params.cols; col += 256u) {
        partial += f32(x[base + col]);
    }
    let mean = workgroup_sum(partial, local) / count;
    var squares = 0.0;
    for (var i = 0u; i < CACHED; i++) {
        if (local + 256u * i < params.cols) {
            let centered = kept[i] - mean;
            squares += centered * centered;
        }
    }
    for (var col = local + 256u * CACHED; col < params.cols; col += 256u) {
        let centered = f32(x[base + col]) - mean;
        squares += centered * centered;
    }
    let variance = workgroup_sum(squares, local) / count;
    let inverse = 1.0 / sqrt(variance + params.eps);
    for (var i = 0u; i < CACHED; i++) {
        let col = local + 256u * i;
        if (col < params.cols) {
            let normalized = (kept[i] - mean) * inverse;
            y[base + col] = Output(normalized * f32(gamma[col]) + f32(beta[col]));
        }
    }
    for (var col = local + 256u * CACHED; col < params.cols; col += 256u) {
        let normalized = (f32(x[base + col]) - mean) * inverse;
        y[base + col] = Output(normalized * f32(gamma[col]) + f32(beta[col]));
    }
}
