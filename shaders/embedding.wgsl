// Embedding gather: y[t, c] = table[ids[t], c] for a table [vocab, width] and token ids stored as
// f32 values of exact integers (the crate has no integer element type). A table too large for
// one binding comes as blocks of rows, one dispatch each: this dispatch's `table` holds the rows
// [first, first + rows); it writes the outputs of the ids among them, and, where `fill` is 1
// (the first block's dispatch), NaN for every other id, which a later block overwrites if the id
// is one of its rows. So an id that is not an integer row of the whole table (negative,
// fractional, too large, NaN) gives a row of NaN, and the kernel never reads outside its block.
// One invocation per element of y, workgroups of 256 (a 2-D grid past the x limit). CPU twin:
// `embedding` in src/compute/cpu.rs (of the whole table).
// `Input`, `Output` (f32 or f16, written by the host): what the table and y hold; the ids are
// always f32. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct EmbeddingParams {
    len: u32,
    width: u32,
    rows: u32,
    grid_x: u32,
    first: u32,
    fill: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: EmbeddingParams;
@group(0) @binding(1) var<storage, read_write> table: array<Input>;
@group(0) @binding(2) var<storage, read_write> ids: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<Output>;

@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i >= params.len) {
        return;
    }
    let token = i / params.width;
    let col = i % params.width;
    // The id's row within this block (exact: the host keeps rows below 2^24).
    let row = ids[token] - f32(params.first);
    if (row >= 0.0 && row < f32(params.rows) && floor(row) == row) {
        y[i] = Output(f32(table[u32(row) * params.width + col]));
    } else if (params.fill != 0u) {
        y[i] = Output(quiet_nan());
    }
}
