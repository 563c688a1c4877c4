// The storage bindings of matmul_coop.wgsl where K or N is not a multiple of 4 (see
// matmul_coop_vec4.wgsl): elements, loaded and stored one by one, zero outside the operands.
//
// Every storage binding is read_write: A, B and C may share one pool segment buffer.
@group(0) @binding(1) var<storage, read_write> a: array<Input>;
@group(0) @binding(2) var<storage, read_write> b: array<Input>;
@group(0) @binding(3) var<storage, read_write> c: array<Output>;
@group(0) @binding(4) var<storage, read_write> bias: array<Input>;

fn load_a4(row: u32, k: u32, k_end: u32) -> vec4<f16> {
    var v = vec4<f16>(0.0h);
    if (row < params.m) {
        for (var e = 0u; e < 4u; e++) {
            if (k + e < k_end) {
                v[e] = f16(a[row * params.k + k + e]);
            }
        }
    }
    return v;
}

fn load_b4(k: u32, col: u32, k_end: u32) -> vec4<f16> {
    var v = vec4<f16>(0.0h);
    if (k < k_end) {
        for (var e = 0u; e < 4u; e++) {
            if (col + e < params.n) {
                v[e] = f16(b[k * params.n + col + e]);
            }
        }
    }
    return v;
}

fn store_c4(row: u32, col: u32, z: u32, sums: vec4<f32>) {
    if (row < params.m) {
        for (var e = 0u; e < 4u; e++) {
            if (col + e < params.n) {
                var x = sums[e];
                if (BIAS) {
                    x += f32(bias[col + e]);
                }
                x = activate4(vec4<f32>(x), ACT).x;
                if (RESIDUAL) {
                    x += residual_at(row * params.n + col + e);
                }
                c[(z * params.m + row) * params.n + col + e] = Output(x);
            }
        }
    }
}
