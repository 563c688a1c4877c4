// The write of one new token's keys and values into a paged KV cache (this file: from a
// separate K and V; kv_write_qkv.wgsl: from a fused query-key-value tensor). The caches k_cache and
// v_cache are [num_blocks, block_tokens, n_head, head_dim]; k_new and v_new are
// [batch, n_head, head_dim]; sequence b's token goes to position positions[b], that is block
// table[b, pos / block_tokens], slot pos % block_tokens. Block ids and positions are f32 values
// of exact integers (the crate has no integer element type). A position that is not an integer
// in [0, max_blocks · block_tokens), or a block id that is not an integer in [0, num_blocks),
// writes nothing for that sequence: the kernel never writes outside the caches.
// One invocation per element of k_new (it writes that element of K and of V), workgroups of 256
// (a 2-D grid past the x limit). CPU twin: `kv_write` in src/compute/cpu.rs.
// `Input` (f32 or f16, written by the host): what k_new and v_new hold; `Output`: what the caches
// hold. Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct KvWriteParams {
    batch: u32,
    n_head: u32,
    head_dim: u32,
    block_tokens: u32,
    num_blocks: u32,
    max_blocks: u32,
    grid_x: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: KvWriteParams;
@group(0) @binding(1) var<storage, read_write> k_cache: array<Output>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<Output>;
@group(0) @binding(3) var<storage, read_write> k_new: array<Input>;
@group(0) @binding(4) var<storage, read_write> v_new: array<Input>;
@group(0) @binding(5) var<storage, read_write> block_table: array<f32>;
@group(0) @binding(6) var<storage, read_write> positions: array<f32>;

@compute @workgroup_size(256)
fn kv_write(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    let token_len = params.n_head * params.head_dim;
    if (i >= params.batch * token_len) {
        return;
    }
    let b = i / token_len;
    let inner = i % token_len;
    let pos = positions[b];
    // Exact: the host keeps max_blocks · block_tokens below 2^24.
    if (!(pos >= 0.0 && pos < f32(params.max_blocks * params.block_tokens) && floor(pos) == pos)) {
        return;
    }
    let position = u32(pos);
    let block = block_table[b * params.max_blocks + position / params.block_tokens];
    if (!(block >= 0.0 && block < f32(params.num_blocks) && floor(block) == block)) {
        return;
    }
    let slot = u32(block) * params.block_tokens + position % params.block_tokens;
    let dst = slot * token_len + inner;
    k_cache[dst] = Output(f32(k_new[i]));
    v_cache[dst] = Output(f32(v_new[i]));
}
