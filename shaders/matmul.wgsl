// C[M, N] = A[M, K] · B[K, N], row-major, any sizes, stored as f32 or f16 (`Input`, `Output`:
// see matmul_vec4.wgsl), computed in f32; with an optional fused epilogue
// C = act(A·B + bias[N]). CPU twin: `matmul` in src/compute/cpu.rs.
//
// The host puts these constants before this file (src/compute/kernels.rs, from `MatmulTiles`):
//   BM, BN, BK   the block tile: BM×BN outputs per workgroup, BK (8 or 16) deep per step of K
//   TM, TN       outputs per invocation, in registers: TM×TN of 8×8, 16×8, 8×16, 4×8, 8×4,
//                4×16 or 16×4
//   THREADS      (BM / TM) · (BN / TN) invocations
//   A_LOADS, B_LOADS   vec4 global loads per invocation per tile of A and of B (1, 2 or 4)
//   VEC4         K % 4 == 0 and N % 4 == 0: rows of A, B and C are whole vec4s
//   EDGES        some tile is partial (M % BM, N % BN or K % BK is not 0): loads and stores
//                are masked. Without it every access is in bounds by construction.
//   BIAS, ACT    the fused epilogue (bias over columns; 0 none, 1 relu, 2 gelu)
//   GROUP_M      tile rows per group of the order in which block tiles are visited
//
// Split-K: workgroup z computes the partial product over K range [z·k_chunk, (z+1)·k_chunk)
// into the z-th M×N slice of `c`; `matmul_reduce.wgsl` adds the slices (and runs the epilogue).
//
// Layout: invocation (tx, ty) owns rows {I·(4·BM/TM) + ty·4 + e} (I < TM/4, e < 4) and columns
// {J·(4·BN/TN) + tx·4 + j} (J < TN/4, j < 4) of the block tile (for 8×8: rows {ty·4 + e,
// BM/2 + ty·4 + e}): groups of four, so that the vec4 reads of workgroup memory by neighbouring
// invocations are contiguous (no bank conflicts) and the vec4 stores of C are coalesced. The A
// tile is stored transposed ([k][m]) so that four rows of A are one vec4 read. Two tile buffers:
// invocations load the next tile from global memory into registers before the product of the
// current one, and store it into the other buffer after: one barrier per tile.
//
// Block tiles are visited in groups of GROUP_M tile rows (the order of Triton's matmul
// tutorial): workgroups that run at the same time share columns of B and rows of A in L2.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.
//
// The entry point `matmul` follows this file: the host writes it (src/compute/kernels/matmul.rs,
// `matmul_entry`) with its loops over the BK steps of K and over the TM×TN outputs of an
// invocation unrolled into straight-line code. Rolled up, it reads:
//
//   return if block_id(workgroup) ≥ tiles_n · tiles_m (a workgroup past the last tile)
//   tile = block_tile(workgroup); row0 = tile.x · BM; col0 = tile.y · BN
//   [k_begin, k_end) = this split's range of K; tiles = ⌈(k_end − k_begin) / BK⌉
//   tx = tid % (BN / TN); ty = tid / (BN / TN)
//   var acc: array<vec4<f32>, TM · TN / 4>    (acc[(4·I + E)·(TN / 4) + J]: row 4·I + E, column
//                                              group J of the invocation's outputs)
//   stage(0, fetch(the tile at k_begin)); workgroupBarrier()
//   for t < tiles, current = t & 1:
//       staged = fetch(the next tile, or the last one again after the last)
//       for step < BK:
//           aI = tile_a[current·A_TILE + ty + step·(BM / 4) + I·(BM / TM)]  for I < TM / 4
//           bJ = tile_b[current·B_TILE + tx + step·(BN / 4) + J·(BN / TN)]  for J < TN / 4
//           acc[(4·I + E)·(TN / 4) + J] = fma(vec4(aI[E]), bJ, acc[...])   for I, E < 4, J
//       stage(1 − current, staged); workgroupBarrier()
//   store_c(row0 + 4·ty + I·ROW_GROUP + E, col0 + 4·tx + J·COL_GROUP, z, acc[...])  for I, E, J

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    // Depth of K per split (a multiple of BK); k when there is no split.
    k_chunk: u32,
    // Block tiles along N and along M.
    tiles_n: u32,
    tiles_m: u32,
    // Workgroups per row of the grid: the grid is [tiles_n, tiles_m] where the device takes it,
    // else [grid_x, ⌈tiles_n · tiles_m / grid_x⌉], workgroups past the last tile doing nothing.
    grid_x: u32,
    // Unused (0).
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: MatmulParams;
// A, B, C and the bias (bindings 1 to 4) and their accessors `a_vec4`, `a_at`, ...,
// `store_c_at` come from matmul_vec4.wgsl or matmul_scalar.wgsl, which the host puts before
// this file.

// vec4s of one tile buffer of A (BK × BM, transposed) and of B (BK × BN).
const A_TILE: u32 = BK * BM / 4u;
const B_TILE: u32 = BK * BN / 4u;

// Distance between an invocation's groups of four rows, of four columns (see Layout).
const ROW_GROUP: u32 = 4u * BM / TM;
const COL_GROUP: u32 = 4u * BN / TN;

var<workgroup> tile_a: array<vec4<f32>, 2u * A_TILE>;
var<workgroup> tile_b: array<vec4<f32>, 2u * B_TILE>;

// A[row, col .. col + 4] (col a multiple of 4), zero past M or past `k_end`.
fn load_a(row: u32, col: u32, k_end: u32) -> vec4<f32> {
    if (VEC4) {
        if (EDGES && (row >= params.m || col >= k_end)) {
            return vec4<f32>(0.0);
        }
        return a_vec4((row * params.k + col) / 4u);
    }
    var v = vec4<f32>(0.0);
    if (row < params.m) {
        let e = row * params.k + col;
        if (col < k_end) {
            v.x = a_at(e);
        }
        if (col + 1u < k_end) {
            v.y = a_at(e + 1u);
        }
        if (col + 2u < k_end) {
            v.z = a_at(e + 2u);
        }
        if (col + 3u < k_end) {
            v.w = a_at(e + 3u);
        }
    }
    return v;
}

// B[row, col .. col + 4] (col a multiple of 4), zero past `k_end` or past N.
fn load_b(row: u32, col: u32, k_end: u32) -> vec4<f32> {
    if (VEC4) {
        if (EDGES && (row >= k_end || col >= params.n)) {
            return vec4<f32>(0.0);
        }
        return b_vec4((row * params.n + col) / 4u);
    }
    var v = vec4<f32>(0.0);
    if (row < k_end) {
        let e = row * params.n + col;
        if (col < params.n) {
            v.x = b_at(e);
        }
        if (col + 1u < params.n) {
            v.y = b_at(e + 1u);
        }
        if (col + 2u < params.n) {
            v.z = b_at(e + 2u);
        }
        if (col + 3u < params.n) {
            v.w = b_at(e + 3u);
        }
    }
    return v;
}

// The `load`-th vec4 of the A tile an invocation carries: (row in tile, column in tile).
fn a_slot(load: u32, tid: u32) -> vec2<u32> {
    let l = tid + load * THREADS;
    return vec2<u32>(l / (BK / 4u), (l % (BK / 4u)) * 4u);
}

fn b_slot(load: u32, tid: u32) -> vec2<u32> {
    let l = tid + load * THREADS;
    return vec2<u32>(l / (BN / 4u), (l % (BN / 4u)) * 4u);
}

// Stores A[row, k .. k + 4] transposed: tile_a[buffer][k + j][row].
fn store_a(buffer: u32, slot: vec2<u32>, v: vec4<f32>) {
    let base = buffer * A_TILE * 4u + slot.y * BM + slot.x;
    tile_a[base / 4u][base % 4u] = v.x;
    tile_a[(base + BM) / 4u][base % 4u] = v.y;
    tile_a[(base + 2u * BM) / 4u][base % 4u] = v.z;
    tile_a[(base + 3u * BM) / 4u][base % 4u] = v.w;
}

fn store_b(buffer: u32, slot: vec2<u32>, v: vec4<f32>) {
    tile_b[buffer * B_TILE + (slot.x * BN + slot.y) / 4u] = v;
}

// This invocation's share of a tile pair, carried from global to workgroup memory: A_LOADS
// vec4s of A, B_LOADS of B (the others stay unused). Passed by value, so it lives in registers.
struct Staged {
    a0: vec4<f32>,
    a1: vec4<f32>,
    a2: vec4<f32>,
    a3: vec4<f32>,
    b0: vec4<f32>,
    b1: vec4<f32>,
    b2: vec4<f32>,
    b3: vec4<f32>,
}

fn fetch_a(load: u32, tid: u32, row0: u32, k0: u32, k_end: u32) -> vec4<f32> {
    let slot = a_slot(load, tid);
    return load_a(row0 + slot.x, k0 + slot.y, k_end);
}

fn fetch_b(load: u32, tid: u32, col0: u32, k0: u32, k_end: u32) -> vec4<f32> {
    let slot = b_slot(load, tid);
    return load_b(k0 + slot.x, col0 + slot.y, k_end);
}

// Loads this invocation's share of the tiles of A and B at depth `k0`.
fn fetch(tid: u32, row0: u32, col0: u32, k0: u32, k_end: u32) -> Staged {
    var s: Staged;
    s.a0 = fetch_a(0u, tid, row0, k0, k_end);
    if (A_LOADS > 1u) {
        s.a1 = fetch_a(1u, tid, row0, k0, k_end);
    }
    if (A_LOADS > 2u) {
        s.a2 = fetch_a(2u, tid, row0, k0, k_end);
        s.a3 = fetch_a(3u, tid, row0, k0, k_end);
    }
    s.b0 = fetch_b(0u, tid, col0, k0, k_end);
    if (B_LOADS > 1u) {
        s.b1 = fetch_b(1u, tid, col0, k0, k_end);
    }
    if (B_LOADS > 2u) {
        s.b2 = fetch_b(2u, tid, col0, k0, k_end);
        s.b3 = fetch_b(3u, tid, col0, k0, k_end);
    }
    return s;
}

// Stores what `fetch` loaded into tile buffer `buffer`.
fn stage(buffer: u32, s: Staged, tid: u32) {
    store_a(buffer, a_slot(0u, tid), s.a0);
    if (A_LOADS > 1u) {
        store_a(buffer, a_slot(1u, tid), s.a1);
    }
    if (A_LOADS > 2u) {
        store_a(buffer, a_slot(2u, tid), s.a2);
        store_a(buffer, a_slot(3u, tid), s.a3);
    }
    store_b(buffer, b_slot(0u, tid), s.b0);
    if (B_LOADS > 1u) {
        store_b(buffer, b_slot(1u, tid), s.b1);
    }
    if (B_LOADS > 2u) {
        store_b(buffer, b_slot(2u, tid), s.b2);
        store_b(buffer, b_slot(3u, tid), s.b3);
    }
}

// Writes four outputs C[row, col .. col + 4] of split `split` through the epilogue.
fn store_c(row: u32, col: u32, split: u32, v_in: vec4<f32>) {
    if (EDGES && row >= params.m) {
        return;
    }
    let base = split * params.m * params.n + row * params.n + col;
    if (VEC4) {
        if (EDGES && col >= params.n) {
            return;
        }
        var v = v_in;
        if (BIAS) {
            v += bias_vec4(col / 4u);
        }
        store_c_vec4(base / 4u, activate4(v, ACT));
        return;
    }
    var v = v_in;
    if (BIAS) {
        for (var j = 0u; j < 4u; j++) {
            if (col + j < params.n) {
                v[j] += bias_at(col + j);
            }
        }
    }
    v = activate4(v, ACT);
    if (col < params.n) {
        store_c_at(base, v.x);
    }
    if (col + 1u < params.n) {
        store_c_at(base + 1u, v.y);
    }
    if (col + 2u < params.n) {
        store_c_at(base + 2u, v.z);
    }
    if (col + 3u < params.n) {
        store_c_at(base + 3u, v.w);
    }
}

// The linear id of workgroup (x, y) in the grid of rows of grid_x workgroups.
fn block_id(workgroup: vec3<u32>) -> u32 {
    return workgroup.y * params.grid_x + workgroup.x;
}

// The block tile (row, column) of workgroup (x, y): the linear id walks GROUP_M tile rows
// column by column. A bijection of the ids below tiles_n · tiles_m onto the tiles (the entry
// point returns at once for the ids past them). A group of more rows than there are is all of
// them, so that the product below stays within tiles_n · tiles_m (which fits a u32).
fn block_tile(workgroup: vec3<u32>) -> vec2<u32> {
    let id = block_id(workgroup);
    let group = min(GROUP_M, params.tiles_m);
    let per_group = group * params.tiles_n;
    let first_row = (id / per_group) * group;
    let rows = min(params.tiles_m - first_row, group);
    let in_group = id % per_group;
    return vec2<u32>(first_row + in_group % rows, in_group / rows);
}
