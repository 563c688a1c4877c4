// Attention of one new token per sequence over a paged KV cache (decode). q and out are
// [batch, n_head, head_dim] (q may be the first third of each row of a fused
// [batch, 3, n_head, head_dim] query-key-value tensor: `q_stride` elements a sequence); the caches k_cache and v_cache are
// [num_blocks, block_tokens, n_head, head_dim]; sequence b's token t (t < seq_lens[b]) is at
// block table[b, t / block_tokens], slot t % block_tokens. For each (b, h):
// s_t = scale · Σ_d q[b, h, d] · K[t, h, d]; p_t = exp(s_t − max_t s_t) / Σ_t exp(s_t − max);
// out[b, h, d] = Σ_t p_t · V[t, h, d]. Block ids and lengths are f32 values of exact integers.
// A length that is not an integer in [1, max_blocks · block_tokens], or a block id the sequence
// uses that is not an integer in [0, num_blocks), gives a row of NaN for every head of that
// sequence: the kernel reads block 0 in its place, never outside the caches.
// One workgroup of 256 invocations per (sequence, head) and share of its tokens (`parts`
// shares: the host splits long sequences over several workgroups when the batch alone would not
// fill the GPU; their partial records are added by `paged_attention_combine`, below; a 2-D grid
// past the x limit); the host
// keeps head_dim ≤ 256. Tokens go by chunks of 256: each invocation scores one token of the
// chunk (the query read once into workgroup memory, the first 2,048 scores kept from the max
// pass), then 256 / head_dim groups of head_dim output lanes each add a share of the chunk's
// weighted values, their partial sums added at the end. Reductions in workgroup memory (shaders/workgroup_reduce.wgsl, put before this
// file). CPU twin: `paged_attention_decode` in src/compute/cpu.rs.
// `Input`, `Output` (f32 or f16, written by the host): what q and the caches hold, what out
// holds; computed in f32. Every storage binding is read_write.

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

// The head size, the shares per (sequence, head) and whether q is fused, packed in
// `head_dim_parts`.
fn head_dim() -> u32 {
    return params.head_dim_parts & 0xffffu;
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
@group(0) @binding(1) var<storage, read_write> q: array<Input>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<Input>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<Input>;
@group(0) @binding(4) var<storage, read_write> block_table: array<f32>;
@group(0) @binding(5) var<storage, read_write> seq_lens: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<Output>;

// The chunk's weights exp(s_t − max) and the first element of each of its tokens' rows.
var<workgroup> weights: array<f32, 256>;
var<workgroup> rows: array<u32, 256>;
// The query, read once.
var<workgroup> query_values: array<f32, 256>;
// The scores of the first SCORES_CACHED tokens, kept from the first pass for the second.
const SCORES_CACHED: u32 = 2048u;
var<workgroup> scores: array<f32, 2048>;
// Each output lane's partial sums, one per group of lanes, added at the end.
var<workgroup> partial: array<f32, 256>;
// The sequence's tokens to attend to (0 for a length out of range), made uniform.
var<workgroup> token_count: u32;

// The first element of token t's row of head h in the caches, and whether its block id is
// valid (block 0 is read in place of an invalid one).
fn token_row(b: u32, h: u32, t: u32) -> vec2<u32> {
    let block = block_table[b * params.max_blocks + t / params.block_tokens];
    var id = 0u;
    var valid = 0u;
    if (block >= 0.0 && block < f32(params.num_blocks) && floor(block) == block) {
        id = u32(block);
        valid = 1u;
    }
    let slot = id * params.block_tokens + t % params.block_tokens;
    return vec2<u32>((slot * params.n_head + h) * head_dim(), valid);
}

// scale · q[b, h, ·] · K[row ..] (the query from workgroup memory), four independent sums so
// that four loads are in flight at once.
fn score(row: u32) -> f32 {
    var dot = vec4<f32>(0.0);
    var d = 0u;
    for (; d + 4u <= head_dim(); d += 4u) {
        dot += vec4<f32>(query_values[d], query_values[d + 1u], query_values[d + 2u], query_values[d + 3u])
            * vec4<f32>(f32(k_cache[row + d]), f32(k_cache[row + d + 1u]), f32(k_cache[row + d + 2u]), f32(k_cache[row + d + 3u]));
    }
    for (; d < head_dim(); d++) {
        dot.x += query_values[d] * f32(k_cache[row + d]);
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
    let query = pair * head_dim();
    var len = seq_lens[b];
    if (lengths_from_positions()) {
        len += 1.0;
    }
    // Exact: the host keeps max_blocks · block_tokens below 2^24.
    var bad = 0.0;
    if (local == 0u) {
        if (len >= 1.0 && len <= f32(params.max_blocks * params.block_tokens) && floor(len) == len) {
            token_count = u32(len);
        } else {
            token_count = 0u;
        }
    }
    if (local < head_dim()) {
        query_values[local] = f32(q[b * q_stride() + h * head_dim() + local]);
    }
    let count = workgroupUniformLoad(&token_count);
    if (count == 0u) {
        bad = 1.0;
    }
    // This workgroup's share of the tokens: [first, end).
    let share = (count + parts() - 1u) / parts();
    let first = min(count, part * share);
    let end = min(count, first + share);
    // The new token's key and value, written by the share that holds it (see
    // `writes_new_token`); read back below by this workgroup only, after the barrier.
    if (writes_new_token() && count > 0u && first < end && end == count) {
        let row = token_row(b, h, count - 1u);
        let token = params.n_head * head_dim();
        let new_key = b * q_stride() + token + h * head_dim();
        if (row.y == 1u && local < head_dim()) {
            k_cache[row.x + local] = q[new_key + local];
            v_cache[row.x + local] = q[new_key + token + local];
        }
    }
    storageBarrier();
    // -f32::MAX rather than -inf: WGSL has no infinity literal.
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
    // Output lane d = local % head_dim of group local / head_dim adds every groups-th token of
    // a chunk (groups = 256 / head_dim): the chunk's tokens split over the groups, whose partial
    // sums meet at the end.
    let groups = 256u / head_dim();
    let group = local / head_dim();
    let lane = local % head_dim();
    var partial_sum = 0.0;
    var acc = 0.0;
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
            // Four tokens a step (independent loads in flight), then the rest.
            var j = group;
            for (; j + 3u * groups < in_chunk; j += 4u * groups) {
                let j1 = j + groups;
                let j2 = j1 + groups;
                let j3 = j2 + groups;
                acc += weights[j] * f32(v_cache[rows[j] + lane]) + weights[j1] * f32(v_cache[rows[j1] + lane])
                    + weights[j2] * f32(v_cache[rows[j2] + lane]) + weights[j3] * f32(v_cache[rows[j3] + lane]);
            }
            for (; j < in_chunk; j += groups) {
                acc += weights[j] * f32(v_cache[rows[j] + lane]);
            }
        }
        workgroupBarrier();
    }
    partial[local] = acc;
    workgroupBarrier();
    let total = workgroup_sum(partial_sum, local);
    let any_bad = workgroup_max(bad, local);
    if (local < head_dim()) {
        var value = 0.0;
        for (var g = 0u; g < groups; g++) {
            value += partial[g * head_dim() + local];
        }
        if (parts() == 1u) {
            value = value / total;
        }
        if (any_bad > 0.0) {
            value = quiet_nan();
        }
        if (parts() == 1u) {
            out[query + local] = Output(value);
        } else {
            // A partial record: the unnormalised sums, then the share's max and sum of weights.
            let record = linear * (head_dim() + 2u);
            out[record + local] = Output(value);
            if (local == 0u) {
                out[record + head_dim()] = Output(top);
                out[record + head_dim() + 1u] = Output(total);
            }
        }
    }
}

// Adds the partial records of a (sequence, head)'s `parts` shares (read through `q`, f32):
// out = Σ_p acc_p · e^(m_p − M) / Σ_p s_p · e^(m_p − M), M the largest share max (an empty
// share has max −f32::MAX and weight 0). A NaN in any share's sums gives NaN.
@compute @workgroup_size(64)
fn paged_attention_combine(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {
    let pair = workgroup.y * params.grid_x + workgroup.x;
    if (pair >= params.batch * params.n_head) {
        return;
    }
    let record = head_dim() + 2u;
    let base = pair * parts() * record;
    var top = -3.4028234663852886e38;
    for (var p = 0u; p < parts(); p++) {
        top = max(top, f32(q[base + p * record + head_dim()]));
    }
    var total = 0.0;
    for (var p = 0u; p < parts(); p++) {
        let at = base + p * record;
        total += f32(q[at + head_dim() + 1u]) * exp(f32(q[at + head_dim()]) - top);
    }
    for (var d = local; d < head_dim(); d += 64u) {
        var value = 0.0;
        for (var p = 0u; p < parts(); p++) {
            let at = base + p * record;
            value += f32(q[at + d]) * exp(f32(q[at + head_dim()]) - top);
        }
        out[pair * head_dim() + d] = Output(value / total);
    }
}
