// C[M, N] = A[M, K] · B[K, N] for a few rows of A (M ≤ 8: a small batch), f32, row-major; with
// the optional fused epilogue C = act(A·B + bias[N]). CPU twin: `matmul` in src/compute/cpu.rs.
//
// With few rows the tiled kernel (matmul.wgsl) wastes most of its tile and walks K serially;
// this one is a matrix-vector product: the time is reading B once. A workgroup of 256 owns
// LANES vec4 columns of C and splits K into SLICES = 256 / LANES slices: invocation
// (lane, slice) reads rows 4·kk .. 4·kk + 3 of B for every kk ≡ slice (mod SLICES), one vec4 of
// its column each (neighbouring lanes read neighbouring vec4s: coalesced), with the matching
// vec4 of each row of A, and keeps ROWS vec4 sums in registers. The slices are then added in
// workgroup memory (a halving tree, four rows at a time) and slice 0 stores C.
//
// The host puts before this file the constants ROWS (= M, 1 to 8), LANES (a power of two, 1 to 256), BIAS and ACT (0 none,
// 1 relu, 2 gelu), and uses this kernel only when K and N are multiples of 4. Every access is in
// bounds by construction (ROWS is M exactly; lanes past N do no loads or stores), so the kernel
// may run unchecked.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.

// The Rust struct of the same name (src/compute/vocab.rs) has this layout (a test checks it).
struct NarrowParams {
    n4: u32,
    k4: u32,
    // Workgroups per row of the grid.
    grid_x: u32,
    // Unused (0).
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: NarrowParams;
@group(0) @binding(1) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> bias: array<vec4<f32>>;

const SLICES: u32 = 256u / LANES;

// Four rows of partial sums of every invocation.
var<workgroup> sums: array<vec4<f32>, 1024>;

@compute @workgroup_size(256)
fn matmul_narrow(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let lane = local % LANES;
    let slice = local / LANES;
    let n4 = params.n4;
    let k4 = params.k4;
    // The grid is [groups, 1] where the device takes it, else rows of grid_x workgroups; lanes
    // past N (in workgroups past the last) do no loads or stores.
    let col = (workgroup.y * params.grid_x + workgroup.x) * LANES + lane;
    let in_n = col < n4;

    var acc: array<vec4<f32>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = vec4<f32>(0.0);
    }
    if (in_n) {
        for (var kk = slice; kk < k4; kk += SLICES) {
            let row = kk * 4u * n4 + col;
            let b0 = b[row];
            let b1 = b[row + n4];
            let b2 = b[row + 2u * n4];
            let b3 = b[row + 3u * n4];
            for (var r = 0u; r < ROWS; r++) {
                let x = a[r * k4 + kk];
                acc[r] += x.x * b0 + x.y * b1 + x.z * b2 + x.w * b3;
            }
        }
    }

    for (var first = 0u; first < ROWS; first += 4u) {
        for (var r = 0u; r < 4u; r++) {
            if (first + r < ROWS) {
                sums[r * 256u + local] = acc[first + r];
            }
        }
        workgroupBarrier();
        for (var stride = SLICES / 2u; stride > 0u; stride /= 2u) {
            if (slice < stride) {
                for (var r = 0u; r < 4u; r++) {
                    if (first + r < ROWS) {
                        sums[r * 256u + local] += sums[r * 256u + local + stride * LANES];
                    }
                }
            }
            workgroupBarrier();
        }
        if (slice == 0u && in_n) {
            for (var r = 0u; r < 4u; r++) {
                if (first + r < ROWS) {
                    var v = sums[r * 256u + lane];
                    if (BIAS) {
                        v += bias[col];
                    }
                    c[(first + r) * n4 + col] = activate4(v, ACT);
                }
            }
        }
        workgroupBarrier();
    }
}
