// The index of each row's largest value over the last dimension of a [rows, cols] tensor, the
// first on ties, stored as an f32 (exact: the host refuses rows of more than 2^24 columns).
// Rows holding NaN give an unspecified index of the row. One workgroup of 256 invocations per row
// (a 2-D grid past the x limit): each invocation keeps its first largest value of a stride of
// 256 (four loads in flight), then a tree reduction keeps the larger value, and the lower index
// on ties.
// Rows of more than 2,048 columns go in two passes instead: `argmax_rows_partial`, one
// workgroup per 2,048 columns of a row (the `aux` parts), each storing its first largest value
// and its index (as f32) into y = [rows, parts, 2]; then `argmax_rows_combine`, one workgroup
// per row, reading those records through x, keeps the largest, the lowest index on ties.
// CPU twin: `argmax_rows` in src/compute/cpu.rs (both passes together).
// `Input` (f32 or f16, written by the host): what x holds; `Output` is f32. Every storage
// binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct RowsParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    // The parts of a row (argmax_rows_partial, argmax_rows_combine); 0 for argmax_rows.
    aux: u32,
}

@group(0) @binding(0) var<uniform> params: RowsParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> y: array<Output>;

// No index yet (an invocation past the row's end).
const NO_INDEX: u32 = 0xffffffffu;

// Whether (v, i) beats (best, best_index): an index, and a larger value or the same at a lower
// index.
fn better(v: f32, i: u32, best: f32, best_index: u32) -> bool {
    return i != NO_INDEX && (best_index == NO_INDEX || v > best || (v == best && i < best_index));
}

var<workgroup> best_values: array<f32, 256>;
var<workgroup> best_indices: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax_rows(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    // Four columns a step (col, +256, +512, +768: four loads in flight), each with its own
    // first largest value, then the rest; the four merged at the end.
    var values = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var indices = array<u32, 4>(NO_INDEX, NO_INDEX, NO_INDEX, NO_INDEX);
    var col = local;
    for (; col + 768u < params.cols; col += 1024u) {
        let v = vec4<f32>(f32(x[base + col]), f32(x[base + col + 256u]), f32(x[base + col + 512u]), f32(x[base + col + 768u]));
        for (var j = 0u; j < 4u; j++) {
            if (indices[j] == NO_INDEX || v[j] > values[j]) {
                values[j] = v[j];
                indices[j] = col + 256u * j;
            }
        }
    }
    for (; col < params.cols; col += 256u) {
        let v = f32(x[base + col]);
        if (indices[0] == NO_INDEX || v > values[0]) {
            values[0] = v;
            indices[0] = col;
        }
    }
    var value = values[0];
    var index = indices[0];
    for (var j = 1u; j < 4u; j++) {
        if (better(values[j], indices[j], value, index)) {
            value = values[j];
            index = indices[j];
        }
    }
    best_values[local] = value;
    best_indices[local] = index;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (local < stride) {
            let other = best_indices[local + stride];
            let v = best_values[local + stride];
            if (better(v, other, best_values[local], best_indices[local])) {
                best_values[local] = v;
                best_indices[local] = other;
            }
        }
        workgroupBarrier();
    }
    if (local == 0u) {
        y[row] = Output(f32(best_indices[0]));
    }
}

// The first largest value of x[row, first .. end) and its index, over the workgroup (every
// invocation reads a stride of 256 from first + local).
fn chunk_best(base: u32, first: u32, end: u32, local: u32) -> vec2<f32> {
    var value = 0.0;
    var index = NO_INDEX;
    for (var col = first + local; col < end; col += 256u) {
        let v = f32(x[base + col]);
        if (index == NO_INDEX || v > value) {
            value = v;
            index = col;
        }
    }
    best_values[local] = value;
    best_indices[local] = index;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (local < stride) {
            let other = best_indices[local + stride];
            let v = best_values[local + stride];
            if (better(v, other, best_values[local], best_indices[local])) {
                best_values[local] = v;
                best_indices[local] = other;
            }
        }
        workgroupBarrier();
    }
    return vec2<f32>(best_values[0], f32(best_indices[0]));
}

@compute @workgroup_size(256)
fn argmax_rows_partial(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let linear = workgroup.y * params.grid_x + workgroup.x;
    if (linear >= params.rows * params.aux) {
        return;
    }
    let row = linear / params.aux;
    let first = (linear % params.aux) * 2048u;
    let best = chunk_best(row * params.cols, first, min(first + 2048u, params.cols), local);
    if (local == 0u) {
        y[2u * linear] = Output(best.x);
        y[2u * linear + 1u] = Output(best.y);
    }
}

@compute @workgroup_size(256)
fn argmax_rows_combine(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    var value = 0.0;
    var index = NO_INDEX;
    for (var part = local; part < params.aux; part += 256u) {
        let at = 2u * (row * params.aux + part);
        let v = f32(x[at]);
        let i = u32(f32(x[at + 1u]));
        if (better(v, i, value, index)) {
            value = v;
            index = i;
        }
    }
    best_values[local] = value;
    best_indices[local] = index;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (local < stride) {
            let other = best_indices[local + stride];
            let v = best_values[local + stride];
            if (better(v, other, best_values[local], best_indices[local])) {
                best_values[local] = v;
                best_indices[local] = other;
            }
        }
        workgroupBarrier();
    }
    if (local == 0u) {
        y[row] = Output(f32(best_indices[0]));
    }
}
