// Embedding gather: y[t, c] = table[ids[t], c] for a table [vocab, width] and token ids stored as
// f32 values of exact integers (the crate has no integer element type). An id that is not an
// integer in [0, vocab) (negative, fractional, too large, NaN) gives a row of NaN: the kernel
// never reads outside the table. One invocation per element of y, workgroups of 256 (a 2-D grid
// past the x limit). CPU twin: `embedding` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what the table and y hold; the ids are
// always f32. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/vocab/params.rs) has this layout (a test checks it).
struct EmbeddingParams {
    len: u32,
    width: u32,
    vocab: u32,
    grid_x: u32,
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
    let id = ids[token];
    // A quiet NaN, as bits: WGSL has no NaN literal.
    var value = bitcast<f32>(0x7fc00000u);
    if (id >= 0.0 && id < f32(params.vocab) && floor(id) == id) {
        value = f32(table[u32(id) * params.width + col]);
    }
    y[i] = Output(value);
}
