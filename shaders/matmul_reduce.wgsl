// Split-K: sums the `splits` partial products P[s, M, N] written by matmul.wgsl (or the narrow or
// cooperative matmul) into C[M, N] and runs the fused epilogue:
// C = act(Σ_s P[s] + bias[N]) + residual[M, N]. One element per invocation, workgroups of 256,
// a 2-D grid past 65,535 workgroups. CPU twin: `matmul_reduce` in src/compute/cpu.rs.
//
// The host puts the constants BIAS (bool), ACT (0 none, 1 relu, 2 gelu) and RESIDUAL (bool)
// before this file, and after it the residual's binding (4, with RESIDUAL) and its accessor
// `residual_at` (src/compute/kernels.rs, `optional_bindings`).
// The partial products are f32 whatever the operands; `Input` (the bias) and `Output` (C) are
// what the matmul's tensors hold (f32 or f16, written by the host). Every storage binding is
// read_write (pool rule).

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct ReduceParams {
    // M · N.
    len: u32,
    n: u32,
    splits: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> params: ReduceParams;
@group(0) @binding(1) var<storage, read_write> partial: array<f32>;
@group(0) @binding(2) var<storage, read_write> bias: array<Input>;
@group(0) @binding(3) var<storage, read_write> c: array<Output>;

@compute @workgroup_size(256)
fn matmul_reduce(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    if (i >= params.len) {
        return;
    }
    var sum = 0.0;
    for (var s = 0u; s < params.splits; s++) {
        sum += partial[s * params.len + i];
    }
    if (BIAS) {
        sum += f32(bias[i % params.n]);
    }
    sum = activate4(vec4<f32>(sum), ACT).x;
    if (RESIDUAL) {
        sum += residual_at(i);
    }
    c[i] = Output(sum);
}
