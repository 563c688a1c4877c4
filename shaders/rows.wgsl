// Row-wise kernels over the last dimension of a [rows, cols] tensor: `sum` (y[r] = Σ_c x[r, c]),
// `softmax` (numerically stable: y[r, c] = exp(x[r, c] − max_r) / Σ exp(x[r, ·] − max_r)) and
// `take_columns` (y[r, c] = x[r, c] for c < take: y is [rows, take]).
// One workgroup of 256 invocations per row (a 2-D grid past 65,535 rows); each invocation walks
// the row with a stride of 256, then a tree reduction in workgroup memory.
// CPU twins: `sum`, `softmax` and `take_columns` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what x and y hold; sums and the softmax are
// computed in f32. Every storage binding is read_write (pool rule).

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct RowsParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    // The columns `take_columns` keeps (0 for the others).
    aux: u32,
}

@group(0) @binding(0) var<uniform> params: RowsParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> y: array<Output>;

// `workgroup_sum` and `workgroup_max`: shaders/workgroup_reduce.wgsl, put before this file.

@compute @workgroup_size(256)
fn sum(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    var partial = 0.0;
    for (var col = local; col < params.cols; col += 256u) {
        partial += f32(x[base + col]);
    }
    let total = workgroup_sum(partial, local);
    if (local == 0u) {
        y[row] = Output(total);
    }
}

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    // -f32::MAX rather than -inf: WGSL has no infinity literal.
    var partial_max = -3.4028234663852886e38;
    for (var col = local; col < params.cols; col += 256u) {
        partial_max = max(partial_max, f32(x[base + col]));
    }
    let row_max = workgroup_max(partial_max, local);
    var partial_sum = 0.0;
    for (var col = local; col < params.cols; col += 256u) {
        partial_sum += exp(f32(x[base + col]) - row_max);
    }
    let denominator = workgroup_sum(partial_sum, local);
    for (var col = local; col < params.cols; col += 256u) {
        y[base + col] = Output(exp(f32(x[base + col]) - row_max) / denominator);
    }
}

@compute @workgroup_size(256)
fn take_columns(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    for (var col = local; col < params.aux; col += 256u) {
        y[row * params.aux + col] = Output(f32(x[row * params.cols + col]));
    }
}
