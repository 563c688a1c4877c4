// C[M, N] = A[M, K] · B[K, N] for a few rows of A (M ≤ 16: a small batch), f32, row-major; with
// the optional fused epilogue C = act(A·B + bias[N]) + residual[M, N] (the residual added in f32,
// rounded once with the rest) and the optional layer-norm prologue (NORM): A's rows normalized as
// they are loaded, C = LN(A)·B with LN(A)[r, k] = (A[r, k] − mean_r) / √(var_r + eps) · gamma[k]
// + beta[k]. CPU twins: `matmul` and `matmul_layer_norm` in src/compute/cpu.rs.
//
// With few rows the tiled kernel (matmul.wgsl) wastes most of its tile and walks K serially;
// this one is a matrix-vector product: the time is reading B once, so the kernel is about
// keeping many independent loads of B in flight, each coalesced.
//
// A workgroup of 256 owns LANES vec4 columns of C (a tile) of ROWS rows (all M rows, or one of
// M / ROWS groups of rows: several groups give more workgroups with fewer sums each, reading B
// again from the cache) and one chunk of K: the grid's z is the split along K, chunk z covering
// vec4 rows [z · k_chunk4, (z + 1) · k_chunk4) of K (all of K without a split). The chunk is
// dealt to SLICES = 256 / LANES slices: invocation
// (lane, slice) takes the vec4 rows kk ≡ slice (mod SLICES) of its chunk, four at a time and the
// rest in one block (up to 16 independent vec4 loads of B in flight, rows 4·kk .. 4·kk + 3 of its
// column each; neighbouring lanes read neighbouring vec4s: coalesced), with the matching vec4 of
// each row of A, and keeps ROWS vec4 sums in registers (acc0 .. acc{ROWS-1}).
//
// The slices are then added. With subgroups (SUBGROUP, their size, fixed on the device: not 0),
// first within each subgroup, which holds GROUPED = SUBGROUP / LANES slices of each of its lanes
// (invocation ids are subgroup_id · SUBGROUP + subgroup_invocation_id). For a power of two of
// rows, shuffles that scatter the rows: at each, an invocation sends half of the rows it holds
// to its partner and keeps the other half, so that each ends with whole sums of ROWS / GROUPED
// rows (or of one row, then added over the other slices by butterfly shuffles); about 2 · ROWS
// vec4 shuffles in all. Otherwise butterfly shuffles of every row leave its sum in every
// invocation (ROWS · log2(GROUPED) shuffles). The slices that hold a sum store it. Then in
// workgroup memory the STORED = SLICES / GROUPED slices left (all of them without subgroups),
// SUM_ROWS rows at a time: a halving tree down to at most FINAL_SLICES slices, then one
// invocation per output adds those. Without a split it stores C with the epilogue; with one
// (SPLIT) it stores its partial sums P[z, M, N], which matmul_reduce.wgsl adds, running the
// epilogue.
//
// The layer-norm prologue (NORM; src/compute/kernels/matmul.rs, `narrow_norm`): before its loop
// over K each workgroup computes the mean and 1 / √(var + eps) of each of its ROWS rows over the
// whole of K (every split too: each reads its rows of A whole, A being small) in f32, as
// layer_norm.wgsl does — two passes, the mean first, then the (biased) variance of the centred
// values. Its invocations are dealt over the rows, NORM_PER_ROW for each (the rows rounded up to
// a power of two), each summing a strided part of its row; the parts of all rows are added at
// once by one halving tree in the first NORM_SLOTS f32s of `sums` (unused until the loop over K
// ends). Each invocation then keeps every row's mean{r} and inv{r} in registers, and in the loop
// normalizes each vec4 of A it loads with the vec4s of gamma and beta of the same kk, rounded to
// `Input` as layer_norm.wgsl stores it: the product is the one of the two ops, but for the
// order of the statistics' sums.
//
// The entry point `matmul_narrow` is written by the host (src/compute/kernels/matmul.rs,
// `narrow_entry`) with the rows, the four steps of K and the shuffles unrolled: it reads like
//
//     let (group, tile, lane, slice) = ...;  first_row = group · ROWS;  col = tile · LANES + lane
//     accumulate rows 4·kk .. 4·kk + 3 of B into acc0 .. acc{ROWS-1}, four kk at a time, then
//     the three, two or one left in one block
//     with subgroups, the shuffles (masks LANES .. SUBGROUP / 2) that scatter the rows, or
//     acc{r} += subgroupShuffleXor(acc{r}, mask)
//     for each group of SUM_ROWS rows: sums[r][stored slice][lane] = its sum; barrier;
//     reduce_and_store(...)
//
// The host puts before this file the constants ROWS (M or a divisor of it, 1 to 16), LANES (a
// power of two, 1 to 256), SUBGROUP (0, or a power of two from 4 to 128), GROUPED, SUM_ROWS,
// SPLIT, BIAS, ACT (0 none, 1 relu, 2 gelu), RESIDUAL, NORM, NORM_PER_ROW and NORM_VEC4S (64
// with NORM, else 0), and after it the residual's binding (5, with RESIDUAL) and its accessor
// `residual_vec4`, and with NORM gamma and beta (the two bindings after the residual's place;
// src/compute/kernels.rs, `optional_bindings`). It uses this kernel only when K and N are
// multiples of 4. Every access is in bounds by construction (ROWS times the groups is M exactly;
// kk < min(k4, chunk end); lanes past N and workgroups past the last group do no loads or stores;
// with SPLIT the output is the partial products of exactly `splits` = the grid's z chunks), so
// the kernel may run unchecked.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct NarrowParams {
    n4: u32,
    k4: u32,
    // Workgroups per row of the grid.
    grid_x: u32,
    // vec4 rows of K per split (k4 without a split).
    k_chunk4: u32,
    // Workgroups (tiles of LANES vec4 columns) per group of ROWS rows.
    tiles: u32,
    // Rows of A and C (M): ROWS times the groups of rows.
    m: u32,
    // The layer-norm prologue's epsilon (NORM; 0 otherwise).
    eps: f32,
    // Unused (0).
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: NarrowParams;
// `Input` (A, B, the bias) and `Output` (C; f32 partial products with SPLIT) are f32 or f16,
// written by the host; loads convert to f32 and the products accumulate in f32.
@group(0) @binding(1) var<storage, read_write> a: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<Input>>;
// C, or with SPLIT the partial products P[splits, M, N].
@group(0) @binding(3) var<storage, read_write> c: array<vec4<Output>>;
@group(0) @binding(4) var<storage, read_write> bias: array<vec4<Input>>;

const SLICES: u32 = 256u / LANES;
// Slices left for workgroup memory, and the vec4s each row takes there.
const STORED: u32 = SLICES / GROUPED;
const ROW_STRIDE: u32 = STORED * LANES;
// The tree stops at this many slices; one invocation per output adds them.
const FINAL_SLICES: u32 = min(STORED, 8u);

// Partial sums: sums[r · ROW_STRIDE + slice · LANES + lane] for SUM_ROWS rows at a time (at most
// 1024 vec4s: 16 KiB); before the loop over K, with NORM, the NORM_SLOTS f32s of the prologue's
// statistics (NORM_VEC4S vec4s).
var<workgroup> sums: array<vec4<f32>, max(SUM_ROWS * ROW_STRIDE, NORM_VEC4S)>;

// f32 slots of `sums` in which the layer-norm prologue adds its rows' statistics: one per
// invocation.
const NORM_SLOTS: u32 = 256u;

// Slot i of the prologue's statistics.
fn norm_slot(i: u32) -> f32 {
    return sums[i / 4u][i % 4u];
}

// The sum over K of row r of the workgroup's rows (r = local / NORM_PER_ROW) of A's values, or
// with `squares` of (value − mean)², added by the NORM_PER_ROW invocations of the row: each takes
// the vec4s kk ≡ local (mod NORM_PER_ROW) of the row, then their parts are added by a halving
// tree in the slots. Left in slot r · NORM_PER_ROW. Called by every invocation of the workgroup
// (barriers); ends with a barrier, so that the sums may be read.
fn norm_sum(local: u32, first_row: u32, squares: bool, mean: f32) {
    let r = local / NORM_PER_ROW;
    let part = local % NORM_PER_ROW;
    let row = first_row + r;
    var partial = 0.0;
    if (r < ROWS && row < params.m) {
        for (var kk = part; kk < params.k4; kk += NORM_PER_ROW) {
            let x = vec4<f32>(a[row * params.k4 + kk]);
            if (squares) {
                let centered = x - vec4<f32>(mean);
                partial += dot(centered, centered);
            } else {
                partial += x.x + x.y + x.z + x.w;
            }
        }
    }
    sums[local / 4u][local % 4u] = partial;
    workgroupBarrier();
    for (var stride = NORM_PER_ROW / 2u; stride > 0u; stride >>= 1u) {
        if (part < stride) {
            sums[local / 4u][local % 4u] += norm_slot(local + stride);
        }
        workgroupBarrier();
    }
}

// Adds the slices of the workgroup's rows first .. first + count - 1 (count ≤ SUM_ROWS, already
// in `sums`; rows first_row + first .. of C) and stores them: C with the epilogue, or with SPLIT
// the partial products of split z. Called by every invocation of the workgroup (it has
// barriers); ends with a barrier, so `sums` may be written again after it.
fn reduce_and_store(first: u32, count: u32, local: u32, tile: u32, first_row: u32, z: u32) {
    var live = STORED;
    while (live > FINAL_SLICES) {
        live = live / 2u;
        if (local < live * LANES) {
            for (var r = 0u; r < count; r++) {
                sums[r * ROW_STRIDE + local] += sums[r * ROW_STRIDE + local + live * LANES];
            }
        }
        workgroupBarrier();
    }
    let n4 = params.n4;
    // One invocation per output (row r, lane), LANES · count of them (up to 1024: a loop).
    for (var output = local; output < count * LANES; output += 256u) {
        let r = output / LANES;
        let lane = output % LANES;
        let col = tile * LANES + lane;
        if (col < n4 && first_row < params.m) {
            var v = sums[r * ROW_STRIDE + lane];
            for (var s = 1u; s < FINAL_SLICES; s++) {
                v += sums[r * ROW_STRIDE + s * LANES + lane];
            }
            let row = first_row + first + r;
            if (SPLIT) {
                c[(z * params.m + row) * n4 + col] = vec4<Output>(v);
            } else {
                if (BIAS) {
                    v += vec4<f32>(bias[col]);
                }
                v = activate4(v, ACT);
                if (RESIDUAL) {
                    v += residual_vec4(row * n4 + col);
                }
                c[row * n4 + col] = vec4<Output>(v);
            }
        }
    }
    workgroupBarrier();
}
