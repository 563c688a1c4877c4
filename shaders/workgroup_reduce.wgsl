// Workgroup reductions of f32 over 256 invocations, shared by the row kernels (rows.wgsl,
// layer_norm.wgsl, softmax_rows.wgsl): the host puts this file before each of them
// (src/compute/kernels.rs).

var<workgroup> scratch: array<f32, 256>;

// The sum of `value` over the workgroup, returned to every invocation.
fn workgroup_sum(value: f32, local: u32) -> f32 {
    scratch[local] = value;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (local < stride) {
            scratch[local] += scratch[local + stride];
        }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

// The maximum of `value` over the workgroup, returned to every invocation.
fn workgroup_max(value: f32, local: u32) -> f32 {
    scratch[local] = value;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (local < stride) {
            scratch[local] = max(scratch[local], scratch[local + stride]);
        }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}
