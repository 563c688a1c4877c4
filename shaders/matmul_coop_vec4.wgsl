// The storage bindings of matmul_coop.wgsl for K and N multiples of 4 (the host puts this file
// before the kernel when VEC4 is true; matmul_coop_scalar.wgsl otherwise): every row of A, B and
// C is whole vec4s. The loads fill with zeros outside the operands (rows past M, columns past N,
// K past the split's end), so that the staged slabs are whole and the cooperative operations run
// in uniform control flow whatever the shape.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.
@group(0) @binding(1) var<storage, read_write> a: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<Input>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<Output>>;
@group(0) @binding(4) var<storage, read_write> bias: array<vec4<Input>>;

// Four elements of row `row` of A from column `k` (a multiple of 4), zero past M or `k_end`.
fn load_a4(row: u32, k: u32, k_end: u32) -> vec4<f16> {
    if (row < params.m && k < k_end) {
        return vec4<f16>(a[(row * params.k + k) / 4u]);
    }
    return vec4<f16>(0.0h);
}

// Four elements of row `k` of B from column `col` (a multiple of 4), zero past `k_end` or N.
fn load_b4(k: u32, col: u32, k_end: u32) -> vec4<f16> {
    if (k < k_end && col < params.n) {
        return vec4<f16>(b[(k * params.n + col) / 4u]);
    }
    return vec4<f16>(0.0h);
}

// Stores four sums at (row, col) of the z-th M×N slice of C (col a multiple of 4), with the
// fused epilogue, where they are in C.
fn store_c4(row: u32, col: u32, z: u32, sums: vec4<f32>) {
    if (row < params.m && col < params.n) {
        var x = sums;
        if (BIAS) {
            x += vec4<f32>(bias[col / 4u]);
        }
        c[((z * params.m + row) * params.n + col) / 4u] = vec4<Output>(activate4(x, ACT));
    }
}
