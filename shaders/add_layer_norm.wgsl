// A residual add and the layer normalization of its sum, in one pass over each row: what a plan
// makes of an `add` whose result the next step, a `layer_norm`, normalizes
// (src/compute/graph/fusion.rs). s = x + r is written out (a transformer's residual stream goes
// on from it), rounded to `Output` as the `add` kernel stores it, and
// y[r, c] = (s[r, c] − mean_r) / √(var_r + eps) · gamma[c] + beta[c] is computed from those
// stored values exactly as shaders/layer_norm.wgsl does (the same passes and reductions), so the
// fused plan gives the bits of the two ops. One workgroup of 256 invocations per row (a 2-D
// grid past the x limit); each invocation walks the row with a stride of 256, reading back its
// own stores of s. Reductions in workgroup memory (shaders/workgroup_reduce.wgsl, put before
// this file). CPU twin: `add_layer_norm` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what x, r, gamma and beta hold, what s and
// y hold. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct LayerNormParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: LayerNormParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> r: array<Input>;
@group(0) @binding(3) var<storage, read_write> gamma: array<Input>;
@group(0) @binding(4) var<storage, read_write> beta: array<Input>;
@group(0) @binding(5) var<storage, read_write> y: array<Output>;
@group(0) @binding(6) var<storage, read_write> s: array<Output>;

const CACHED: u32 = 4u;

@compute @workgroup_size(256)
fn add_layer_norm(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    let count = f32(params.cols);
    // As layer_norm.wgsl: the first CACHED sums of the stride kept in registers.
    var kept: array<f32, CACHED>;
    var partial = 0.0;
    for (var i = 0u; i < CACHED; i++) {
        let col = local + 256u * i;
        if (col < params.cols) {
            let sum = Output(f32(x[base + col]) + f32(r[base + col]));
            s[base + col] = sum;
            kept[i] = f32(sum);
            partial += kept[i];
        }
    }
    for (var col = local + 256u * CACHED; col < params.cols; col += 256u) {
        let sum = Output(f32(x[base + col]) + f32(r[base + col]));
        s[base + col] = sum;
        partial += f32(sum);
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
        let centered = f32(s[base + col]) - mean;
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
        let normalized = (f32(s[base + col]) - mean) * inverse;
        y[base + col] = Output(normalized * f32(gamma[col]) + f32(beta[col]));
    }
}
