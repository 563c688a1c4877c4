// The index of each row's largest value over the last dimension of a [rows, cols] tensor, the
// first on ties, stored as an f32 (exact: the host refuses rows of more than 2^24 columns).
// Rows holding NaN give an unspecified index of the row. One workgroup of 256 invocations per row
// (a 2-D grid past the x limit): each invocation keeps its first largest value of a stride of
// 256, then a tree reduction keeps the larger value, and the lower index on ties.
// CPU twin: `argmax_rows` in src/compute/cpu.rs.
// `Input` (f32 or f16, written by the host): what x holds; `Output` is f32. Every storage
// binding is read_write.

// The Rust struct of the same name (src/compute/vocab/params.rs) has this layout (a test checks it).
struct RowsParams {
    rows: u32,
    cols: u32,
    grid_x: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: RowsParams;
@group(0) @binding(1) var<storage, read_write> x: array<Input>;
@group(0) @binding(2) var<storage, read_write> y: array<Output>;

// No index yet (an invocation past the row's end).
const NO_INDEX: u32 = 0xffffffffu;

var<workgroup> best_values: array<f32, 256>;
var<workgroup> best_indices: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax_rows(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let row = workgroup.y * params.grid_x + workgroup.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    var value = 0.0;
    var index = NO_INDEX;
    for (var col = local; col < params.cols; col += 256u) {
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
            let mine = best_indices[local];
            let v = best_values[local + stride];
            let better = v > best_values[local] || (v == best_values[local] && other < mine);
            if (other != NO_INDEX && (mine == NO_INDEX || better)) {
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
