// paged_attention.wgsl's decode attention for a head size that is a multiple of 4 (GPT-2's 64):
// the same sums over the same tokens, with q and the caches read as vec4s. The query's quads
// (head_dim / 4 vec4s) and every token's row of K and V are then a few 16-byte loads: scoring a
// token takes head_dim / 4 loads, four in flight at a time, instead of head_dim; and the
// weighted sum of V goes over 256 / quads groups of quads lanes (16 groups for a head of 64)
// rather than 256 / head_dim, so that each group walks fewer of the chunk's tokens. Everything
// else — one workgroup of 256 per (sequence, head) and share, the scores kept from the max pass,
// the partial records of a split added by `paged_attention_combine` (paged_attention.wgsl), the
// NaN rows for a bad length or block id — is as in paged_attention.wgsl, whose header says it.
// Sums are in another order than there, so results agree to rounding. CPU twin:
// `paged_attention_decode` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host). Every storage binding is read_write.

// The Rust struct of the same name (src/compute/types/params.rs) has this layout (a test checks it).
struct PagedAttentionParams {
    batch: u32,
    n_head: u32,
    head_dim_parts: u32,
    block_tokens: u32,
    num_blocks: u32,
    max_blocks: u32,
    grid_x: u32,
    scale: f32,
}

fn head_dim() -> u32 {
    return params.head_dim_parts & 0xffffu;
}

// vec4s per head.
fn quads() -> u32 {
    return head_dim() / 4u;
}

fn parts() -> u32 {
    return (params.head_dim_parts >> 16u) & 0x1fffu;
}

// Bit 30 of `head_dim_parts`: `seq_lens` holds each sequence's position of its new token, so
// that its length is that plus one.
fn lengths_from_positions() -> bool {
    return ((params.head_dim_parts >> 30u) & 1u) == 1u;
}

// Bit 29 (with a fused q and bit 30): the workgroup whose share holds a sequence's new token
// first writes that token's key and value of its head (from the fused tensor) into the caches,
// so that no separate cache write runs before the attention. Correct only when no two rows of
// the dispatch write or read each other's new token: each row a different sequence (decode).
fn writes_new_token() -> bool {
    return ((params.head_dim_parts >> 29u) & 1u) == 1u;
}

// Elements from one sequence's query to the next: n_head · head_dim, or three times that where
// q is a fused [batch, 3, n_head, head_dim] query-key-value tensor (the top bit of
// `head_dim_parts`).
fn q_stride() -> u32 {
    let token = params.n_head * head_dim();
    if ((params.head_dim_parts >> 31u) == 1u) {
        return 3u * token;
    }
    return token;
}

@group(0) @binding(0) var<uniform> params: PagedAttentionParams;
@group(0) @binding(1) var<storage, read_write> q: array<vec4<Input>>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<vec4<Input>>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<vec4<Input>>;
@group(0) @binding(4) var<storage, read_write> block_table: array<f32>;
@group(0) @binding(5) var<storage, read_write> seq_lens: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<Output>;

var<workgroup> weights: array<f32, 256>;
// The first vec4 of each of the chunk's tokens' rows.
var<workgroup> rows: array<u32, 256>;
var<workgroup> query_values: array<vec4<f32>, 64>;
const SCORES_CACHED: u32 = 2048u;
// The scores of the share's first 2,048 tokens; once the weighted sums are made, each
// invocation's vec4 of them (scores[4 · local ..]), so that the workgroup's memory stays within
// WebGPU's default limit (16,384 bytes).
var<workgroup> scores: array<f32, 2048>;
var<workgroup> token_count: u32;

// The first vec4 of token t's row of head h, and whether its block id is valid (block 0 is read
// in place of an invalid one).
fn token_row(b: u32, h: u32, t: u32) -> vec2<u32> {
    let block = block_table[b * params.max_blocks + t / params.block_tokens];
    var id = 0u;
    var valid = 0u;
    if (block >= 0.0 && block < f32(params.num_blocks) && floor(block) == block) {
        id = u32(block);
        valid = 1u;
    }
    let slot = id * params.block_tokens + t % params.block_tokens;
    return vec2<u32>((slot * params.n_head + h) * quads(), valid);
}

// scale · q · K[row ..], four vec4 loads in flight.
fn score(row: u32) -> f32 {
    var dot = vec4<f32>(0.0);
    let n = quads();
    var d = 0u;
    for (; d + 4u <= n; d += 4u) {
        let k0 = vec4<f32>(k_cache[row + d]);
        let k1 = vec4<f32>(k_cache[row + d + 1u]);
        let k2 = vec4<f32>(k_cache[row + d + 2u]);
        let k3 = vec4<f32>(k_cache[row + d + 3u]);
        dot += query_values[d] * k0 + query_values[d + 1u] * k1 + query_values[d + 2u] * k2
            + query_values[d + 3u] * k3;
    }
    for (; d < n; d++) {
        dot += query_values[d] * vec4<f32>(k_cache[row + d]);
    }
    return params.scale * (dot.x + dot.y + dot.z + dot.w);
}

@compute @workgroup_size(256)
fn paged_attention_decode(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let linear = workgroup.y * params.grid_x + workgroup.x;
    if (linear >= params.batch * params.n_head * parts()) {
        return;
    }
    let pair = linear / parts();
    let part = linear % parts();
    let b = pair / params.n_head;
    let h = pair % params.n_head;
    let n = quads();
    var len = seq_lens[b];
    if (lengths_from_positions()) {
        len += 1.0;
    }
    var bad = 0.0;
    if (local == 0u) {
        if (len >= 1.0 && len <= f32(params.max_blocks * params.block_tokens) && floor(len) == len) {
            token_count = u32(len);
        } else {
            token_count = 0u;
        }
    }
    if (local < n) {
        query_values[local] = vec4<f32>(q[b * q_stride() / 4u + h * n + local]);
    }
    let count = workgroupUniformLoad(&token_count);
    if (count == 0u) {
        bad = 1.0;
    }
    let share = (count + parts() - 1u) / parts();
    let first = min(count, part * share);
    let end = min(count, first + share);
    // The new token's key and value, written by the share that holds it (see
    // `writes_new_token`); read back below by this workgroup only, after the barrier.
    if (writes_new_token() && count > 0u && first < end && end == count) {
        let row = token_row(b, h, count - 1u);
        let token = params.n_head * n;
        let new_key = b * q_stride() / 4u + token + h * n;
        if (row.y == 1u && local < n) {
            k_cache[row.x + local] = q[new_key + local];
            v_cache[row.x + local] = q[new_key + token + local];
        }
    }
    storageBarrier();
    var partial_max = -3.4028234663852886e38;
    for (var t = first + local; t < end; t += 256u) {
        let row = token_row(b, h, t);
        let s = score(row.x);
        if (t - first < SCORES_CACHED) {
            scores[t - first] = s;
        }
        partial_max = max(partial_max, s);
        if (row.y == 0u) {
            bad = 1.0;
        }
    }
    let top = workgroup_max(partial_max, local);
    // Lane `lane` (a vec4 of the head) of group `group` adds every groups-th token of a chunk.
    let groups = 256u / n;
    let group = local / n;
    let lane = local % n;
    var partial_sum = 0.0;
    var acc = vec4<f32>(0.0);
    let chunks = (end - first + 255u) / 256u;
    for (var chunk = 0u; chunk < chunks; chunk++) {
        let t = first + chunk * 256u + local;
        var weight = 0.0;
        var row = 0u;
        if (t < end) {
            row = token_row(b, h, t).x;
            var s = 0.0;
            if (t - first < SCORES_CACHED) {
                s = scores[t - first];
            } else {
                s = score(row);
            }
            weight = exp(s - top);
        }
        partial_sum += weight;
        weights[local] = weight;
        rows[local] = row;
        workgroupBarrier();
        if (group < groups) {
            let in_chunk = min(256u, end - first - chunk * 256u);
            var j = group;
            for (; j + 3u * groups < in_chunk; j += 4u * groups) {
                let j1 = j + groups;
                let j2 = j1 + groups;
                let j3 = j2 + groups;
                let v0 = vec4<f32>(v_cache[rows[j] + lane]);
                let v1 = vec4<f32>(v_cache[rows[j1] + lane]);
                let v2 = vec4<f32>(v_cache[rows[j2] + lane]);
                let v3 = vec4<f32>(v_cache[rows[j3] + lane]);
                acc += weights[j] * v0 + weights[j1] * v1 + weights[j2] * v2 + weights[j3] * v3;
            }
            for (; j < in_chunk; j += groups) {
                acc += weights[j] * vec4<f32>(v_cache[rows[j] + lane]);
            }
        }
        workgroupBarrier();
    }
    // The last chunk's barrier is behind every read of the scores.
    scores[4u * local] = acc.x;
    scores[4u * local + 1u] = acc.y;
    scores[4u * local + 2u] = acc.z;
    scores[4u * local + 3u] = acc.w;
    workgroupBarrier();
    let total = workgroup_sum(partial_sum, local);
    let any_bad = workgroup_max(bad, local);
    if (local < n) {
        var value = vec4<f32>(0.0);
        for (var g = 0u; g < groups; g++) {
            let at = 4u * (g * n + local);
            value += vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]);
        }
        if (parts() == 1u) {
            value = value / total;
        }
        if (any_bad > 0.0) {
            value = vec4<f32>(quiet_nan());
        }
        // A partial record (parts > 1): the unnormalised sums, then the share's max and sum.
        var at = pair * head_dim() + 4u * local;
        if (parts() > 1u) {
            at = linear * (head_dim() + 2u) + 4u * local;
        }
        out[at] = Output(value.x);
        out[at + 1u] = Output(value.y);
        out[at + 2u] = Output(value.z);
        out[at + 3u] = Output(value.w);
        if (parts() > 1u && local == 0u) {
            let record = linear * (head_dim() + 2u);
            out[record + head_dim()] = Output(top);
            out[record + head_dim() + 1u] = Output(total);
        }
    }
}
