// Softmax over the last dimension of scores [.., queries, cols], scaled and optionally causal:
// z[r, c] = scale · x[r, c]; with the causal mask on, row r (query i = r mod queries) keeps the
// columns c ≤ i + offset and writes 0 at the others; y[r, c] = exp(z[r, c] − max) / Σ exp(z[r, ·] − max)
// over the kept columns (numerically stable: the kept maximum subtracted first). The host passes
// an offset of at most cols, so at least column 0 is kept and nothing overflows.
// One workgroup of 256 invocations per row (a 2-D grid past the x limit), reductions in
// workgroup memory (shaders/workgroup_reduce.wgsl, put before this file). CPU twin:
// `softmax_rows` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what x and y hold; computed in f32.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct SoftmaxRowsParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    scale: f32,
    queries: u32,
    offset: u32,
    causal: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: SoftmaxRowsParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> y: array<Output>;

@compute @workgroup_size(256)
fn softmax_rows(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    var kept = params.cols;
    if (params.causal != 0u) {
        kept = min(params.cols, row % params.queries + params.offset + 1u);
    }
    // -f32::MAX rather than -inf: WGSL has no infinity literal.
    var partial_max = -3.4028234663852886e38;
    for (var col = local; col < kept; col += 256u) {
        partial_max = max(partial_max, params.scale * f32(x[base + col]));
    }
    let row_max = workgroup_max(partial_max, local);
    var partial_sum = 0.0;
    for (var col = local; col < kept; col += 256u) {
        partial_sum += exp(params.scale * f32(x[base + col]) - row_max);
    }
    let denominator = workgroup_sum(partial_sum, local);
    for (var col = local; col < params.cols; col += 256u) {
        var value = 0.0;
        if (col < kept) {
            value = exp(params.scale * f32(x[base + col]) - row_max) / denominator;
        }
        y[base + col] = Output(value);
    }
}
