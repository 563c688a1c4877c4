// kv_write.wgsl's write of each sequence's new token into a paged KV cache, its key and value
// taken from a fused [batch, 3, n_head, head_dim] query-key-value tensor (GPT-2's c_attn
// product: per row the query, then the key, then the value), so that one product serves the
// three. The same checks: a position or block id out of range writes nothing for that sequence.
// One invocation per element of a key, workgroups of 256 (a 2-D grid past the x limit).
// CPU twin: `kv_write_qkv` in src/compute/cpu.rs.
// `Input` (f32 or f16, written by the host): what qkv holds; `Output`: what the caches hold.
// Every storage binding is read_write.

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
@group(0) @binding(3) var<storage, read_write> qkv: array<Input>;
@group(0) @binding(4) var<storage, read_write> block_table: array<f32>;
@group(0) @binding(5) var<storage, read_write> positions: array<f32>;

@compute @workgroup_size(256)
fn kv_write_qkv(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let i = linear_index(workgroup, local, params.grid_x, 256u);
    let token_len = params.n_head * params.head_dim;
    if (i >= params.batch * token_len) {
        return;
    }
    let b = i / token_len;
    let inner = i % token_len;
    let pos = positions[b];
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
    let src = (3u * b + 1u) * token_len + inner;
    k_cache[dst] = Output(f32(qkv[src]));
    v_cache[dst] = Output(f32(qkv[src + token_len]));
}
