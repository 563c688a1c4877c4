// The input of a transformer's first block in one gather: y[t, c] = table[id(t), c] +
// positions_table[positions[t], c], for token and position tables [rows, width] and ids and
// positions stored as f32 values of exact integers (the crate has no integer element type).
// With `fed` (the number of entries of `previous`, 0 for none) a row's id may come from the
// GPU: id(t) = ids[t] + fed_rows[t] · previous[picks[t]] where fed_rows[t] ≠ 0 (a decode row
// whose token is the previous step's sample), else ids[t]. A row whose id is not an integer row
// of the token table, whose position is not one of the position table, or whose pick is not an
// index of `previous`, gives a row of NaN; the kernel never reads outside its bindings. One
// invocation per element of y, workgroups of 256 (a 2-D grid past the x limit). CPU twin:
// `embedding_sum` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what the tables and y hold; ids,
// positions, fed_rows, previous and picks are always f32. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct EmbeddingSumParams {
    len: u32,
    width: u32,
    rows: u32,
    grid_x: u32,
    position_rows: u32,
    fed: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: EmbeddingSumParams;
@group(0) @binding(1) var<storage, read_write> table: array<Input>;
@group(0) @binding(2) var<storage, read_write> ids: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<Output>;
@group(0) @binding(4) var<storage, read_write> positions_table: array<Input>;
@group(0) @binding(5) var<storage, read_write> positions: array<f32>;
// Without `fed`, these three are bound to `ids` and never read.
@group(0) @binding(6) var<storage, read_write> fed_rows: array<f32>;
@group(0) @binding(7) var<storage, read_write> previous: array<f32>;
@group(0) @binding(8) var<storage, read_write> picks: array<f32>;

// Whether `v` is an integer in [0, rows) (exact: the host keeps rows below 2^24).
fn is_row(v: f32, rows: u32) -> bool {
    return v >= 0.0 && v < f32(rows) && floor(v) == v;
}

@compute @workgroup_size(256)
fn embedding_sum(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i >= params.len) {
        return;
    }
    let token = i / params.width;
    let col = i % params.width;
    var id = ids[token];
    if (params.fed != 0u) {
        let weight = fed_rows[token];
        if (weight != 0.0) {
            let pick = picks[token];
            if (is_row(pick, params.fed)) {
                id += weight * previous[u32(pick)];
            } else {
                id = -1.0;
            }
        }
    }
    let position = positions[token];
    if (is_row(id, params.rows) && is_row(position, params.position_rows)) {
        let value = f32(table[u32(id) * params.width + col])
            + f32(positions_table[u32(position) * params.width + col]);
        y[i] = Output(value);
    } else {
        y[i] = Output(quiet_nan());
    }
}
