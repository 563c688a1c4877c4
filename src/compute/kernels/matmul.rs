//! The matmuls' entry points, written on the host for each variant (part 7 of a module, see
//! `kernels.rs`): the tiled matmul's `matmul` ([`matmul_entry`]), the narrow matmul's
//! `matmul_narrow` ([`narrow_entry`]) and the cooperative matmul's `matmul_coop`
//! ([`coop_entry`]), each with its steps of K, its outputs, fragments or rows and its subgroup
//! shuffles unrolled into straight-line WGSL. The helpers they call are in `shaders/matmul.wgsl`,
//! `shaders/matmul_narrow.wgsl` and `shaders/matmul_coop.wgsl`; `kernels.rs` puts each after its
//! file.

use crate::compute::types::{narrow_grouped, narrow_sum_rows, CoopProbe, CoopTiles, MatmulTiles};

/// The cooperative matmul's entry point from its signature up to its loop over the slabs of K
/// (see `shaders/matmul_coop.wgsl`).
const COOP_ENTRY_BEGIN: &str = "
// The entry point, written by the host (src/compute/kernels/matmul.rs, `coop_entry`) with the
// fragments and accumulators unrolled.
@compute @workgroup_size(THREADS)
fn matmul_coop(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) subgroup_id: u32, @builtin(subgroup_invocation_id) subgroup_lane: u32) {
    // The block tile, from the workgroup's linear id (the grid is [tiles_n, tiles_m, splits]
    // where the device takes it, else rows of grid_x workgroups): uniform, before any barrier.
    let id = workgroup.y * params.grid_x + workgroup.x;
    if (id >= params.tiles_n * params.tiles_m) {
        return;
    }
    let row0 = (id / params.tiles_n) * BM;
    let col0 = (id % params.tiles_n) * BN;
    let z = workgroup.z;
    let k_begin = z * params.k_chunk;
    let k_end = min(params.k, k_begin + params.k_chunk);
    // The host never makes an empty split: k_end > k_begin.
    let slabs = (k_end - k_begin + BK - 1u) / BK;
    // The subgroup's corner in the block tile (subgroups of 32: SUBGROUPS of them; clamped all
    // the same, so that no index leaves its array whatever the driver does).
    let sg = min(subgroup_id, SUBGROUPS - 1u);
    let lane = min(subgroup_lane, 31u);
    let wm0 = (sg / SUBGROUPS_N) * WM;
    let wn0 = (sg % SUBGROUPS_N) * WN;
";

/// The cooperative matmul's loop over the slabs of K, up to its products.
const COOP_ENTRY_LOOP: &str = "    var staged = fetch(tid, row0, col0, k_begin, k_end);
    for (var t = 0u; t < slabs; t++) {
        // Everyone is done with the previous slab before it is overwritten.
        workgroupBarrier();
        stage(tid, staged);
        workgroupBarrier();
        // The next slab into registers while this one is multiplied; unconditional (the last
        // slab is fetched again after the last), so the loads sit beside the products.
        staged = fetch(tid, row0, col0, k_begin + min(t + 1u, slabs - 1u) * BK, k_end);
";

/// The loop over the slabs of K of [`CoopProbe::NoGlobalLoads`]: the first slab fetched once,
/// staged again every slab.
const COOP_PROBE_NO_GLOBAL_LOADS: &str = "    let staged = fetch(tid, row0, col0, k_begin, k_end);
    for (var t = 0u; t < slabs; t++) {
        workgroupBarrier();
        stage(tid, staged);
        workgroupBarrier();
";

/// The loop over the slabs of K of [`CoopProbe::NoStaging`]: the first slab staged once, the
/// loop's barriers kept.
const COOP_PROBE_NO_STAGING: &str = "    stage(tid, fetch(tid, row0, col0, k_begin, k_end));
    for (var t = 0u; t < slabs; t++) {
        workgroupBarrier();
        workgroupBarrier();
";

/// The WGSL entry point `matmul_coop` of the cooperative matmul for `tiles`:
/// [`COOP_ENTRY_BEGIN`], the accumulators `acc_{i}_{j}` (`i < wm / 16`, `j < wn / 16`),
/// [`COOP_ENTRY_LOOP`], then for each step of 16 in a slab the fragments `a{i}` and `b{j}` and
/// every product; then the epilogue, one accumulator at a time through the subgroup's scratch.
/// Every pointer index and stride of a cooperative load or store is a `let` (a naga 30 pitfall,
/// see `shaders/matmul_coop.wgsl`). A `probe` leaves part of the loop out (not a product):
/// the loads from storage ([`COOP_PROBE_NO_GLOBAL_LOADS`]), the staging too
/// ([`COOP_PROBE_NO_STAGING`]), or everything but the products, whose fragments
/// (`a{i}_{step}`, `b{j}_{step}`) are then loaded once before the loop.
pub(super) fn coop_entry(tiles: &CoopTiles, probe: Option<CoopProbe>) -> String {
    let mut text = String::from(COOP_ENTRY_BEGIN);
    for (i, j) in coop_accumulators(tiles) {
        text.push_str(&format!("    var acc_{i}_{j} = coop_mat16x16<f32, C>();\n"));
    }
    let strides = "let a_stride = A_STRIDE;\n        let b_stride = B_STRIDE;\n";
    let steps = 0..tiles.bk / 16;
    if probe == Some(CoopProbe::ProductsOnly) {
        text.push_str("    stage(tid, fetch(tid, row0, col0, k_begin, k_end));\n");
        text.push_str("    workgroupBarrier();\n        ");
        text.push_str(strides);
        for step in steps.clone() {
            text.push_str(&coop_fragments(tiles, step, &format!("_{step}"), "    "));
        }
        text.push_str("    for (var t = 0u; t < slabs; t++) {\n");
        for step in steps {
            text.push_str(&coop_products(tiles, &format!("_{step}")));
        }
    } else {
        text.push_str(match probe {
            None => COOP_ENTRY_LOOP,
            Some(CoopProbe::NoGlobalLoads) => COOP_PROBE_NO_GLOBAL_LOADS,
            Some(_) => COOP_PROBE_NO_STAGING,
        });
        text.push_str("        ");
        text.push_str(strides);
        for step in steps {
            text.push_str("        {\n");
            text.push_str(&coop_fragments(tiles, step, "", "            "));
            text.push_str(&coop_products(tiles, ""));
            text.push_str("        }\n");
        }
    }
    text.push_str(
        "    }

    // The epilogue: each accumulator through the subgroup's 16×16 scratch (row-major), then
    // eight sums per invocation: row lane / 2, columns 8 · (lane % 2) + 0..7.
    let base = sg * 256u;
    let scratch_stride = 16u;
    let r = lane / 2u;
    let col_in = (lane % 2u) * 8u;
",
    );
    for (i, j) in coop_accumulators(tiles) {
        text.push_str(&format!(
            "    coopStoreT(acc_{i}_{j}, &scratch[base], scratch_stride);
    workgroupBarrier();
    store_eight(base, r, col_in, row0 + wm0 + {}u + r, col0 + wn0 + {}u + col_in, z);
    workgroupBarrier();
",
            16 * i,
            16 * j
        ));
    }
    text.push_str("}\n");
    text
}

/// The accumulators `(i, j)` of a subgroup of `tiles`: `i < wm / 16`, `j < wn / 16`.
fn coop_accumulators(tiles: &CoopTiles) -> impl Iterator<Item = (u32, u32)> {
    let (fm, fn_) = (tiles.wm / 16, tiles.wn / 16);
    (0..fm).flat_map(move |i| (0..fn_).map(move |j| (i, j)))
}

/// The fragments of step `step` (16 of K) of a slab, `a{i}{suffix}` (rows `wm0 + 16·i`) and
/// `b{j}{suffix}` (columns `wn0 + 16·j`), loaded from the staged slab, each line indented.
fn coop_fragments(tiles: &CoopTiles, step: u32, suffix: &str, indent: &str) -> String {
    let mut text = String::new();
    for i in 0..tiles.wm / 16 {
        // Row wm0 + 16·i of the slab, column 16·step: vec4 index (16·step) / 4.
        text.push_str(&format!(
            "{indent}let pa{i}{suffix} = (wm0 + {}u) * A_STRIDE + {}u;\n{indent}let a{i}{suffix} = coopLoadT<coop_mat16x16<f16, A>>(&tile_a[pa{i}{suffix}], a_stride);\n",
            16 * i,
            4 * step
        ));
    }
    for j in 0..tiles.wn / 16 {
        text.push_str(&format!(
            "{indent}let pb{j}{suffix} = {}u * B_STRIDE + (wn0 + {}u) / 4u;\n{indent}let b{j}{suffix} = coopLoadT<coop_mat16x16<f16, B>>(&tile_b[pb{j}{suffix}], b_stride);\n",
            16 * step,
            16 * j
        ));
    }
    text
}

/// Every product of a step of a slab, on the fragments `a{i}{suffix}` and `b{j}{suffix}`.
fn coop_products(tiles: &CoopTiles, suffix: &str) -> String {
    coop_accumulators(tiles)
        .map(|(i, j)| {
            format!(
                "            acc_{i}_{j} = coopMultiplyAdd(a{i}{suffix}, b{j}{suffix}, acc_{i}_{j});\n"
            )
        })
        .collect()
}

/// The test that opens the tiled matmul's entry point when its grid is laid out as rows of
/// linear workgroup ids.
const MATMUL_ENTRY_PAST_LAST: &str =
    "    // A workgroup past the last tile (a grid of rows of linear ids): uniform, before any
    // barrier.
    if (block_id(workgroup) >= params.tiles_n * params.tiles_m) {
        return;
    }
";

/// The tiled matmul's entry point: its signature, before the body (see `shaders/matmul.wgsl`
/// for the layout and the helpers it calls). Then [`MATMUL_ENTRY_PAST_LAST`] with a linear
/// grid, then [`MATMUL_ENTRY_BEGIN`].
const MATMUL_ENTRY_SIGNATURE: &str = "
// The entry point, written by the host (src/compute/kernels/matmul.rs, `matmul_entry`) with the
// BK steps of K and the TM×TN outputs of an invocation unrolled.
@compute @workgroup_size(THREADS)
fn matmul(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
";

/// The tiled matmul's entry point from the first line of its body up to its steps of K.
const MATMUL_ENTRY_BEGIN: &str = "    let tile = block_tile(workgroup);
    let row0 = tile.x * BM;
    let col0 = tile.y * BN;
    let k_begin = workgroup.z * params.k_chunk;
    let k_end = min(params.k, k_begin + params.k_chunk);
    // The host never makes an empty split: k_end > k_begin.
    let tiles = (k_end - k_begin + BK - 1u) / BK;
    let tx = tid % (BN / TN);
    let ty = tid / (BN / TN);

    // acc[(4·I + E)·(TN/4) + J]: row 4·I + E of the invocation's TM (I < TM/4, E < 4), column
    // group J (J < TN/4). Indexed only by constants, so it lives in registers.
    var acc: array<vec4<f32>, TM * TN / 4u>;

    var staged = fetch(tid, row0, col0, k_begin, k_end);
    stage(0u, staged, tid);
    workgroupBarrier();

    for (var t = 0u; t < tiles; t++) {
        let current = t & 1u;
        // Prefetch the next tile into registers while this one is multiplied. Unconditional, so
        // that the loads sit in the same block as the products (the compiler may interleave
        // them): after the last tile the last tile is fetched and staged again, into the buffer
        // no one reads any more.
        staged = fetch(tid, row0, col0, k_begin + min(t + 1u, tiles - 1u) * BK, k_end);
        // BK steps of K, one block each. Each step is the TM×TN outer product of TM rows of A
        // (TM / 4 vec4s of the transposed tile) and TN columns of B (TN / 4 vec4s): TM · TN / 4
        // vec4 fused multiply-adds.
        let a = current * A_TILE + ty;
        let b = current * B_TILE + tx;
";

/// The tiled matmul's entry point after its steps of K, up to its stores.
const MATMUL_ENTRY_STORES: &str = "        stage(1u - current, staged, tid);
        workgroupBarrier();
    }

    let row = row0 + ty * 4u;
    let col = col0 + tx * 4u;
    let z = workgroup.z;
";

/// The WGSL entry point `matmul` of the tiled matmul for `tiles`: [`MATMUL_ENTRY_SIGNATURE`],
/// [`MATMUL_ENTRY_BEGIN`], then
/// for each step `s < BK` a block that reads `a{I}` (`I < TM / 4`: four rows of the
/// invocation's outputs, one vec4 of the transposed A tile) and `b{J}` (`J < TN / 4`: four
/// columns) at depth `s` and updates every accumulator `acc[(4·I + E)·(TN / 4) + J]`
/// (`E < 4`), then [`MATMUL_ENTRY_STORES`] and one `store_c` per accumulator, in the same order.
///
/// With `linear_grid` (the grid laid out as rows of linear workgroup ids), the entry point first
/// returns for the workgroups past the last tile ([`MATMUL_ENTRY_PAST_LAST`]); a grid that the
/// device takes as it is has no such workgroups, and its entry point no such test.
pub(super) fn matmul_entry(tiles: &MatmulTiles, linear_grid: bool) -> String {
    let (groups_i, groups_j) = (tiles.tm / 4, tiles.tn / 4);
    // (I, E, J, accumulator) of every accumulator, in its order.
    let outputs = || {
        (0..groups_i).flat_map(move |i| {
            (0..4).flat_map(move |e| {
                (0..groups_j).map(move |j| (i, e, j, (4 * i + e) * groups_j + j))
            })
        })
    };
    let mut text = String::from(MATMUL_ENTRY_SIGNATURE);
    if linear_grid {
        text.push_str(MATMUL_ENTRY_PAST_LAST);
    }
    text.push_str(MATMUL_ENTRY_BEGIN);
    for step in 0..tiles.bk {
        text.push_str("        {\n");
        for i in 0..groups_i {
            text.push_str(&format!(
                "            let a{i} = tile_a[a + {step}u * (BM / 4u) + {i}u * (BM / TM)];\n"
            ));
        }
        for j in 0..groups_j {
            text.push_str(&format!(
                "            let b{j} = tile_b[b + {step}u * (BN / 4u) + {j}u * (BN / TN)];\n"
            ));
        }
        for (i, e, j, acc) in outputs() {
            text.push_str(&format!(
                "            acc[{acc}u] = fma(vec4<f32>(a{i}[{e}u]), b{j}, acc[{acc}u]);\n"
            ));
        }
        text.push_str("        }\n");
    }
    text.push_str(MATMUL_ENTRY_STORES);
    for (i, e, j, acc) in outputs() {
        text.push_str(&format!(
            "    store_c(row + {i}u * ROW_GROUP + {e}u, col + {j}u * COL_GROUP, z, acc[{acc}u]);\n"
        ));
    }
    text.push_str("}\n");
    text
}

/// Steps of K that the narrow matmul's main loop takes at once (each loads four vec4s of B).
pub(super) const NARROW_STEPS: u32 = 4;

/// The start of the narrow matmul's entry point, after its signature, up to its accumulators.
const NARROW_ENTRY_BEGIN: &str = "    let lane = local % LANES;
    let slice = local / LANES;
    let n4 = params.n4;
    let k4 = params.k4;
    // The grid is [tiles · groups of rows, 1, splits] where the device takes it, else rows of
    // grid_x workgroups; lanes past N (and the workgroups past the last) do no loads or stores.
    let id = workgroup.y * params.grid_x + workgroup.x;
    let tile = id % params.tiles;
    let first_row = (id / params.tiles) * ROWS;
    let col = select(n4, tile * LANES + lane, first_row < params.m);
    // This split's chunk of K, in vec4 rows; the host makes no empty chunk.
    let k_end = min(k4, (workgroup.z + 1u) * params.k_chunk4);
";

/// The WGSL entry point `matmul_narrow` of the narrow matmul for `rows` rows, `lanes` lanes and
/// subgroups of `subgroup` invocations (0: none; see `shaders/matmul_narrow.wgsl`): with `norm`,
/// the layer-norm prologue's statistics ([`narrow_norm`]); `rows` accumulators `acc{r}`; a main
/// loop that takes [`NARROW_STEPS`] vec4 rows of K at once (all their loads of B first, with
/// `norm` those of gamma and beta too, then for each row of A its vec4s, normalized with `norm`,
/// and four fused multiply-adds per step), then the fewer steps left in one block of the same
/// form (one block per number of steps, chosen by `if`); with subgroups wider than the lanes,
/// butterfly shuffles over the slices each subgroup holds; then for each group of rows that fits
/// workgroup memory, the accumulators kept there and `reduce_and_store`.
pub(super) fn narrow_entry(rows: u32, lanes: u32, subgroup: u32, norm: bool) -> String {
    const { assert!(NARROW_STEPS >= 2) };
    let mut text = String::from(
        "
// The entry point, written by the host (src/compute/kernels/matmul.rs, `narrow_entry`) with the
// rows, the steps of K and the shuffles unrolled.
@compute @workgroup_size(256)
",
    );
    if subgroup > 0 {
        text.push_str(
            "fn matmul_narrow(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(subgroup_id) subgroup_id: u32, @builtin(subgroup_invocation_id) subgroup_lane: u32) {
    // Invocation ids by subgroups, so that a shuffle's partner is known: subgroups are full (the
    // device's subgroup size is fixed and divides 256). Clamped all the same, so that no index
    // leaves its array whatever the driver does.
    let local = min(subgroup_id * SUBGROUP + subgroup_lane, 255u);
",
        );
    } else {
        text.push_str(
            "fn matmul_narrow(@builtin(workgroup_id) workgroup: vec3<u32>, @builtin(local_invocation_index) local: u32) {\n",
        );
    }
    text.push_str(NARROW_ENTRY_BEGIN);
    if norm {
        text.push_str(&narrow_norm(rows));
    }
    for r in 0..rows {
        text.push_str(&format!("    var acc{r} = vec4<f32>(0.0);\n"));
    }
    text.push_str(&narrow_k_loop(rows, norm));
    text.push_str(&narrow_sums(rows, lanes, subgroup));
    text.push_str("}\n");
    text
}

/// The narrow matmul's layer-norm prologue (see `shaders/matmul_narrow.wgsl`): the mean of each
/// of the workgroup's `rows` rows (`mean{r}`), then the variance of its centred values, kept as
/// `inv{r}` = 1 / √(var + eps), each row's added by `norm_sum` and read by every invocation;
/// barriers before the slots are written again (by the second pass, then by the sums after the
/// loop over K).
fn narrow_norm(rows: u32) -> String {
    let mut text = String::from(
        "    // The layer-norm prologue: the mean and 1 / √(var + eps) of each of the workgroup's
    // rows over the whole of K, kept in registers by every invocation.
    let cols = f32(4u * k4);
    norm_sum(local, first_row, false, 0.0);
    let own_mean = norm_slot((local / NORM_PER_ROW) * NORM_PER_ROW) / cols;
",
    );
    for r in 0..rows {
        text.push_str(&format!(
            "    let mean{r} = norm_slot({r}u * NORM_PER_ROW) / cols;\n"
        ));
    }
    text.push_str(
        "    workgroupBarrier();
    norm_sum(local, first_row, true, own_mean);
",
    );
    for r in 0..rows {
        text.push_str(&format!(
            "    let inv{r} = 1.0 / sqrt(norm_slot({r}u * NORM_PER_ROW) / cols + params.eps);\n"
        ));
    }
    text.push_str("    workgroupBarrier();\n");
    text
}

/// The narrow matmul's loop over its slice's steps of K (see [`narrow_entry`]): the main loop,
/// [`NARROW_STEPS`] at a time, then the steps left, in one block chosen by `if`. With `norm`,
/// each vec4 of A is normalized as it is loaded (the prologue's `mean{r}` and `inv{r}`, the
/// step's vec4s of gamma and beta) and rounded to `Input`, as the layer norm stores it.
fn narrow_k_loop(rows: u32, norm: bool) -> String {
    let mut text = String::new();
    // One step of K at `kk + offset` (vec4 rows), its loads of B named b{step}_{0..3} (and of
    // gamma and beta, g{step} and be{step}).
    let loads = |step: u32, offset: &str| {
        let mut code = format!("            let row{step} = (kk{offset}) * 4u * n4 + col;\n");
        for e in 0..4 {
            code.push_str(&format!(
                "            let b{step}_{e} = vec4<f32>(b[row{step} + {e}u * n4]);\n"
            ));
        }
        if norm {
            code.push_str(&format!(
                "            let g{step} = vec4<f32>(gamma[kk{offset}]);\n            let be{step} = vec4<f32>(beta[kk{offset}]);\n"
            ));
        }
        code
    };
    let products = |step: u32, offset: &str| {
        let mut code = String::new();
        for r in 0..rows {
            let load = format!("vec4<f32>(a[(first_row + {r}u) * k4 + kk{offset}])");
            let value = if norm {
                format!(
                    "vec4<f32>(vec4<Input>((({load} - vec4<f32>(mean{r})) * inv{r}) * g{step} + be{step}))"
                )
            } else {
                load
            };
            code.push_str(&format!("            let a{step}_{r} = {value};\n"));
            for (e, component) in ["x", "y", "z", "w"].iter().enumerate() {
                code.push_str(&format!(
                    "            acc{r} = fma(vec4<f32>(a{step}_{r}.{component}), b{step}_{e}, acc{r});\n"
                ));
            }
        }
        code
    };
    let offset = |step: u32| {
        if step == 0 {
            String::new()
        } else {
            format!(" + {step}u * SLICES")
        }
    };
    text.push_str("    if (col < n4) {\n");
    text.push_str("        var kk = workgroup.z * params.k_chunk4 + slice;\n");
    text.push_str(&format!(
        "        // {NARROW_STEPS} steps at a time: their loads of B first, all independent.\n"
    ));
    text.push_str(&format!(
        "        while (kk + {}u * SLICES < k_end) {{\n",
        NARROW_STEPS - 1
    ));
    for step in 0..NARROW_STEPS {
        text.push_str(&loads(step, &offset(step)));
    }
    for step in 0..NARROW_STEPS {
        text.push_str(&products(step, &offset(step)));
    }
    text.push_str(&format!("            kk += {NARROW_STEPS}u * SLICES;\n"));
    text.push_str("        }\n");
    // The fewer than NARROW_STEPS steps left, in one block of independent loads too.
    text.push_str(
        "        // The steps left (fewer than the main loop's), their loads of B first as well.\n",
    );
    for left in (1..NARROW_STEPS).rev() {
        let test = if left == 1 {
            "kk < k_end".to_string()
        } else {
            format!("kk + {}u * SLICES < k_end", left - 1)
        };
        let keyword = if left == NARROW_STEPS - 1 {
            "        if"
        } else {
            " else if"
        };
        text.push_str(&format!("{keyword} ({test}) {{\n"));
        for step in 0..left {
            text.push_str(&loads(step, &offset(step)));
        }
        for step in 0..left {
            text.push_str(&products(step, &offset(step)));
        }
        text.push_str("        }");
    }
    text.push_str("\n    }\n");
    text
}

/// The end of the narrow matmul's entry point (see [`narrow_entry`]): the subgroup shuffles,
/// then each group of rows kept in workgroup memory and reduced. With subgroups wider than the
/// lanes and a power of two of rows, the shuffles scatter the rows ([`narrow_scatter`]);
/// otherwise every invocation adds every row ([`narrow_butterfly`]).
fn narrow_sums(rows: u32, lanes: u32, subgroup: u32) -> String {
    let grouped = narrow_grouped(lanes, subgroup);
    let (mut text, held) = if grouped > 1 && rows > 1 && rows.is_power_of_two() {
        narrow_scatter(rows, lanes, subgroup)
    } else {
        narrow_butterfly(rows, lanes, subgroup)
    };
    let sum_rows = narrow_sum_rows(rows, lanes, subgroup);
    for first in (0..rows).step_by(sum_rows as usize) {
        let count = (rows - first).min(sum_rows);
        text.push_str(&format!("    // Rows {first} to {}.\n", first + count - 1));
        text.push_str(&held.stores(first, count, rows));
        text.push_str("    workgroupBarrier();\n");
        text.push_str(&format!(
            "    reduce_and_store({first}u, {count}u, local, tile, first_row, workgroup.z);\n"
        ));
    }
    text
}

/// Which sums an invocation of the narrow matmul holds after its subgroup's shuffles, and how
/// it puts them into workgroup memory.
enum NarrowHeld {
    /// Every row's: `acc{r}`, stored by every invocation (no subgroups) or by the first slice
    /// of each subgroup (`keeps`, `stored`).
    All { shuffled: bool },
    /// `count` rows from the WGSL value `row_base` on: `held{i}` is row `row_base + i`;
    /// stored where `keeps` (where the rows outnumber the slices, every invocation).
    Scattered { count: u32 },
}

impl NarrowHeld {
    /// The WGSL that stores the held sums of rows `first .. first + count` (of `rows`) into
    /// `sums`.
    fn stores(&self, first: u32, count: u32, rows: u32) -> String {
        let mut text = String::new();
        match *self {
            Self::All { shuffled } => {
                let (open, index, indent) = if shuffled {
                    ("    if (keeps) {\n", "stored", "        ")
                } else {
                    ("", "local", "    ")
                };
                text.push_str(open);
                for r in 0..count {
                    text.push_str(&format!(
                        "{indent}sums[{r}u * ROW_STRIDE + {index}] = acc{};\n",
                        first + r
                    ));
                }
                if shuffled {
                    text.push_str("    }\n");
                }
            }
            Self::Scattered { count: held } => {
                for i in 0..held {
                    let row = format!("row_base + {i}u");
                    // One pass over every row needs no test of the row.
                    let test = if count == rows {
                        "keeps".to_string()
                    } else {
                        format!("keeps && {row} >= {first}u && {row} < {}u", first + count)
                    };
                    text.push_str(&format!(
                        "    if ({test}) {{\n        sums[({row} - {first}u) * ROW_STRIDE + stored] = held{i};\n    }}\n"
                    ));
                }
            }
        }
        text
    }
}

/// The narrow matmul's subgroup sums where every invocation adds every row: butterfly shuffles
/// of each accumulator (with subgroups wider than the lanes), the first slice of each subgroup
/// keeping them.
fn narrow_butterfly(rows: u32, lanes: u32, subgroup: u32) -> (String, NarrowHeld) {
    let grouped = narrow_grouped(lanes, subgroup);
    let mut text = String::new();
    if grouped == 1 {
        return (text, NarrowHeld::All { shuffled: false });
    }
    text.push_str(&format!(
        "    // The {grouped} slices of each lane in a subgroup added by butterfly shuffles (uniform\n    // control flow: every invocation takes part).\n"
    ));
    let mut mask = lanes;
    while mask < subgroup {
        for r in 0..rows {
            text.push_str(&format!(
                "    acc{r} += subgroupShuffleXor(acc{r}, {mask}u);\n"
            ));
        }
        mask *= 2;
    }
    text.push_str(
        "    // The first slice of each subgroup keeps its sums, at its subgroup's slice.
    let keeps = subgroup_lane < LANES;
    let stored = min(subgroup_id, STORED - 1u) * LANES + subgroup_lane;
",
    );
    (text, NarrowHeld::All { shuffled: true })
}

/// The narrow matmul's subgroup sums for `rows` a power of two (2 to 16) and subgroups wider
/// than the lanes: at each shuffle an invocation sends half of the rows it holds to its partner
/// and keeps the other half (a reduce-scatter), so that after log2(min(rows, GROUPED)) shuffles
/// each holds whole sums of rows / GROUPED rows (at least one): about twice rows vec4 shuffles
/// in all, where adding every row in every invocation takes rows · log2(GROUPED). Where the
/// slices outnumber the rows, the one row left is added by butterfly shuffles over the other
/// slices and stored by the first of them.
fn narrow_scatter(rows: u32, lanes: u32, subgroup: u32) -> (String, NarrowHeld) {
    let grouped = narrow_grouped(lanes, subgroup);
    let scatters = rows.min(grouped).trailing_zeros();
    let mut text = format!(
        "    // The {grouped} slices of each lane in a subgroup added by shuffles that scatter the rows:
    // each sends half of the rows it holds and keeps the other half (uniform control flow:
    // every invocation takes part, the halves chosen by `select`). `slice` bit j picks the
    // half at shuffle j.
    let slice_bits = subgroup_lane / LANES;
"
    );
    // The values held, by name: the accumulators first.
    let mut held: Vec<String> = (0..rows).map(|r| format!("acc{r}")).collect();
    let mut base_terms = Vec::new();
    for j in 0..scatters {
        let mask = lanes << j;
        let half = held.len() / 2;
        text.push_str(&format!(
            "    let upper{j} = ((slice_bits >> {j}u) & 1u) == 1u;\n"
        ));
        let mut next = Vec::with_capacity(half);
        for i in 0..half {
            let (low, high) = (&held[i], &held[half + i]);
            text.push_str(&format!(
                "    let s{j}_{i} = select({low}, {high}, upper{j}) + subgroupShuffleXor(select({high}, {low}, upper{j}), {mask}u);\n"
            ));
            next.push(format!("s{j}_{i}"));
        }
        base_terms.push(format!("select(0u, {half}u, upper{j})"));
        held = next;
    }
    text.push_str(&format!(
        "    // Rows row_base .. row_base + {} are this invocation's.\n    let row_base = {};\n",
        held.len() - 1,
        base_terms.join(" + ")
    ));
    let mut mask = lanes << scatters;
    if mask < subgroup {
        text.push_str(
            "    // One row left: the other slices' sums of it added by butterfly shuffles.\n",
        );
    }
    while mask < subgroup {
        let value = &held[0];
        text.push_str(&format!(
            "    let b{mask} = {value} + subgroupShuffleXor({value}, {mask}u);\n"
        ));
        held[0] = format!("b{mask}");
        mask *= 2;
    }
    for (i, value) in held.iter().enumerate() {
        text.push_str(&format!("    let held{i} = {value};\n"));
    }
    text.push_str(&format!(
        "    // Stored by the slices whose bits past the scattering are 0, at their subgroup's slice.
    let keeps = (slice_bits >> {scatters}u) == 0u;
    let stored = min(subgroup_id, STORED - 1u) * LANES + subgroup_lane % LANES;
"
    ));
    (
        text,
        NarrowHeld::Scattered {
            count: held.len() as u32,
        },
    )
}
