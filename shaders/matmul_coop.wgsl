// C[M, N] = A[M, K] · B[K, N] on cooperative matrices (the tensor cores): f16 operands, 16×16×16
// products accumulated in f32, one rounding as C is stored, with the fused epilogue
// C = act(A·B + bias[N]) + residual[M, N]. Needs `EXPERIMENTAL_COOPERATIVE_MATRIX` (16×16×16 f16 × f16 → f32),
// f16, and subgroups of 32 invocations. CPU twin: `matmul` in src/compute/cpu.rs on the
// f16-rounded operands.
//
// The operands' storage type is `Input`: f16, or f32 under `MatmulOptions::cooperative_f32_as_f16`
// (load_a4 and load_b4 round each element to f16 in registers as they fetch the slab, so the
// staging and the fragments are the same; the bias is read as `Input` and added in f32). An f32
// operand beyond ±65,504 becomes ±∞ there on IEEE hardware: the caller guarantees range.
//
// The host puts `enable wgpu_cooperative_matrix;` first and these constants before the bindings
// (src/compute/kernels.rs, from `CoopTiles`):
//   BM, BN         outputs per workgroup
//   WM, WN         outputs per subgroup: (WM / 16) · (WN / 16) accumulators of 16×16
//   BK             depth of K per slab staged in workgroup memory (32 or 64)
//   SUBGROUPS      subgroups per workgroup, SUBGROUPS_N of them along N; THREADS = 32 · SUBGROUPS
//   A_LOADS, B_LOADS   vec4<f16> loads per invocation per slab of A and of B
//   A_STRIDE, B_STRIDE vec4s per staged row of A (BK + 8 elements) and of B (BN + 8)
//   VEC4           K and N multiples of 4 (the bindings file: matmul_coop_vec4.wgsl or
//                  matmul_coop_scalar.wgsl, which provide load_a4, load_b4 and store_c4)
//   BIAS, ACT      the fused epilogue (bias over columns; 0 none, 1 relu, 2 gelu)
//   RESIDUAL       the epilogue adds a residual of C's shape last (binding 5, declared after
//                  this file with its accessors by the host: src/compute/kernels.rs)
//
// Split-K: workgroup z computes the partial product over K range [z·k_chunk, (z+1)·k_chunk)
// into the z-th M×N slice of `c` (f32, no epilogue); `matmul_reduce.wgsl` adds the slices.
//
// Pitfalls of naga 30 and the drivers, worked around here (issue 28, MEASUREMENTS.md):
// - naga 30's SPIR-V writer panics ("Expression … is not cached") on a `coopStore` (and, to be
//   safe, a `coopLoad`) whose stride or pointer index is an expression written inline: every
//   index and stride is bound to a `let` first.
// - `coopLoad` / `coopStore` are column-major; row-major data needs `coopLoadT` / `coopStoreT`.
// - With a pointer to `vec4<f16>` the stride counts vec4s, not elements.
// - naga's `bitcast` cannot change the element width: the slabs are held as `vec4<f16>` rows.
// - Cooperative operations must run in uniform control flow: the loads fill with zeros outside
//   the operands instead of branching around the products, and every loop's trip count is
//   uniform (parameters and workgroup ids only).
// - A fragment is opaque: the epilogue stores each accumulator to workgroup memory
//   (`coopStoreT`), then reads it back with ordinary code to add the bias, activate, mask the
//   edges and round once to f16.
// - To watch: with a cooperative matrix naga 30 declares SPIR-V's Vulkan memory model but marks
//   no workgroup access `NonPrivatePointer`, so strictly only the barriers' control order ties
//   the staged slabs and the scratch to their readers. The probe's staged kernel of this design
//   was exact on the H200 (driver 580); results that look like stale workgroup memory elsewhere
//   would point here.
//
// The entry point `matmul_coop` follows this file: the host writes it (src/compute/kernels/matmul.rs,
// `coop_entry`) with its fragments and accumulators unrolled. Rolled up, it reads:
//
//   return if the workgroup's linear id ≥ tiles_n · tiles_m (a grid of rows of linear ids)
//   row0, col0 = the block tile's corner; [k_begin, k_end) = this split's range of K
//   wm0, wn0 = the subgroup's corner in the block tile
//   acc_I_J = 0 for I < WM / 16, J < WN / 16
//   staged = fetch(the slab at k_begin)
//   for t < slabs:
//       workgroupBarrier(); stage(staged); workgroupBarrier()
//       staged = fetch(the next slab, or the last one again after the last)
//       for s < BK / 16: aI = coopLoadT(A rows wm0 + 16·I, columns 16·s); bJ = coopLoadT(B rows
//           16·s, columns wn0 + 16·J); acc_I_J = coopMultiplyAdd(aI, bJ, acc_I_J)
//   for each acc_I_J: coopStoreT to the subgroup's 16×16 scratch; workgroupBarrier(); each
//       invocation stores 8 of its sums (row lane / 2, columns 8 · (lane % 2) + 0..7) through
//       store_c4; workgroupBarrier()
//
// Diagnostics (`CoopProbe`, not products): the same entry with the fetch, the staging too, or
// all but the products left out of the loop, to time the rest (MEASUREMENTS.md, session 16).

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
    // Workgroups per row of the grid (tiles_n where the device takes the grid as it is).
    grid_x: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: MatmulParams;

// The slab of A (BM rows of BK, padded) and of B (BK rows of BN, padded), row-major.
var<workgroup> tile_a: array<vec4<f16>, BM * A_STRIDE>;
var<workgroup> tile_b: array<vec4<f16>, BK * B_STRIDE>;
// One 16×16 f32 accumulator per subgroup, for the epilogue.
var<workgroup> scratch: array<f32, SUBGROUPS * 256u>;

// One invocation's share of a slab, in registers.
struct Staged {
    a: array<vec4<f16>, A_LOADS>,
    b: array<vec4<f16>, B_LOADS>,
}

// Invocation `tid`'s share of the slab at depth `k0` of the block tile at (row0, col0), zero
// outside the operands and past `k_end`.
fn fetch(tid: u32, row0: u32, col0: u32, k0: u32, k_end: u32) -> Staged {
    var staged: Staged;
    for (var l = 0u; l < A_LOADS; l++) {
        let i = tid + l * THREADS;
        staged.a[l] = load_a4(row0 + i / (BK / 4u), k0 + (i % (BK / 4u)) * 4u, k_end);
    }
    for (var l = 0u; l < B_LOADS; l++) {
        let i = tid + l * THREADS;
        staged.b[l] = load_b4(k0 + i / (BN / 4u), col0 + (i % (BN / 4u)) * 4u, k_end);
    }
    return staged;
}

// Stores invocation `tid`'s share of a slab into workgroup memory.
fn stage(tid: u32, staged: Staged) {
    for (var l = 0u; l < A_LOADS; l++) {
        let i = tid + l * THREADS;
        tile_a[(i / (BK / 4u)) * A_STRIDE + i % (BK / 4u)] = staged.a[l];
    }
    for (var l = 0u; l < B_LOADS; l++) {
        let i = tid + l * THREADS;
        tile_b[(i / (BN / 4u)) * B_STRIDE + i % (BN / 4u)] = staged.b[l];
    }
}

// Eight sums of the subgroup's scratch (row `r`, columns `col`..`col + 7`) stored at (row, col)
// of C through store_c4.
fn store_eight(base: u32, r: u32, col_in: u32, row: u32, col: u32, z: u32) {
    let i = base + r * 16u + col_in;
    store_c4(row, col, z, vec4<f32>(scratch[i], scratch[i + 1u], scratch[i + 2u], scratch[i + 3u]));
    store_c4(row, col + 4u, z, vec4<f32>(scratch[i + 4u], scratch[i + 5u], scratch[i + 6u], scratch[i + 7u]));
}
