//! The matmul's plan as a function of the options, the device's caps and the shape alone: no
//! context, no GPU (see the module docs of [`crate::compute::ops::matmul`] for the rules). The
//! context's [`Context::matmul_plan`](crate::compute::Context::matmul_plan) calls these with the
//! caps of its device, and the autotuner times their candidates.

use crate::compute::types::{
    element_count, kernel_u32, ComputeError, CoopTiles, DType, DeviceCaps, MatmulOptions,
    MatmulTiles,
};

/// The most lanes the narrow kernel's automatic choice takes.
const NARROW_AUTO_MAX_LANES: u64 = 64;

/// The fewest lanes the narrow kernel's automatic choice takes on a GPU (where N has them): two
/// vec4s, 32 contiguous bytes of a row of B (one DRAM sector). On the H200, 8 × 1024 × 1024 took
/// 10.3 µs with 2 lanes (128 workgroups), 12.2-12.7 with 4 (64), 11.2 with 1.
const NARROW_AUTO_MIN_LANES: u64 = 2;

/// The automatic split of the narrow kernel leaves each invocation at least this many vec4 rows
/// of K per split.
const NARROW_MIN_SPLIT_STEPS: u64 = 8;

/// The narrow kernel splits K automatically only with fewer than `min_workgroups / 2 /` this
/// many workgroups along N: a quarter of them still keep HBM busy (each with sixteen vec4 loads
/// per invocation in flight), and a split costs a second dispatch.
const NARROW_SPLIT_BELOW: u64 = 4;

/// How one matmul runs: its tile, split-K and kernel variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulPlan {
    /// The block tile.
    pub tiles: MatmulTiles,
    /// Splits along K (1: none).
    pub splits: u32,
    /// Depth of K per split, a multiple of `tiles.bk` (of 4 for the narrow kernel; K when there
    /// is no split).
    pub k_chunk: u32,
    /// K and N are multiples of 4: vec4 loads and stores.
    pub vec4: bool,
    /// Some tile is partial: loads and stores are masked.
    pub edges: bool,
    /// Workgroups of the matmul kernel: `[⌈N / bn⌉, ⌈M / bm⌉, splits]`, or of the narrow
    /// kernel: `[⌈N / (4 · narrow_lanes)⌉ · narrow_row_groups, 1, splits]`. Where a dimension
    /// would exceed the device's `max_compute_workgroups_per_dimension` (or [`ContextOptions::max_grid_x`] along x), the
    /// block tiles (or the narrow kernel's workgroups) are laid out over `[x, y]` rows of linear
    /// ids instead, `x · y` at least their number (the kernels skip the ids past it).
    ///
    /// [`ContextOptions::max_grid_x`]: crate::compute::ContextOptions::max_grid_x
    pub workgroups: [u32; 3],
    /// vec4 columns per workgroup of the narrow kernel; 0 when the tiled kernel runs.
    pub narrow_lanes: u32,
    /// The subgroup size by which the narrow kernel adds slices with shuffles (see
    /// [`MatmulOptions::narrow_subgroups`]); 0 when it adds them in workgroup memory only, or
    /// when the tiled kernel runs.
    pub narrow_subgroup: u32,
    /// Groups of rows of the narrow kernel (see [`MatmulOptions::narrow_row_groups`]): each of
    /// its workgroups multiplies `M / narrow_row_groups` rows; 0 when the tiled kernel runs.
    pub narrow_row_groups: u32,
    /// The tile of the matmul on cooperative matrices (f16 operands) when it runs
    /// (`shaders/matmul_coop.wgsl`; `tiles` is then unused, `k_chunk` a multiple of
    /// the tile's `bk`, `workgroups` `[⌈N / bn⌉, ⌈M / bm⌉, splits]` or rows of linear ids);
    /// `None` for the portable kernels.
    pub cooperative: Option<CoopTiles>,
}

/// The plan the rules choose for `[m, k] · [k, n]` under `options` on a device of `caps`: the
/// narrow kernel where it applies ([`narrow_plan`]), else the tiled one ([`tiled_plan`]).
///
/// Any sizes give a plan or a typed error, never a panic: [`ComputeError::InvalidShape`] for
/// a size of 0 or operands of more elements than a tensor holds,
/// [`ComputeError::ParameterOverflow`] for sizes beyond the kernels' 32-bit parameters,
/// [`ComputeError::ExceedsLimit`] for a grid the device cannot dispatch.
pub(crate) fn plan(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    m: usize,
    n: usize,
    k: usize,
) -> Result<MatmulPlan, ComputeError> {
    check_sizes(m, n, k)?;
    let plan = match narrow_plan(options, caps, m, n, k) {
        Some(plan) => plan,
        None => tiled_plan(options, caps, m, n, k)?,
    };
    check_operands(m, n, k)?;
    Ok(plan)
}

/// The plan for `[m, k] · [k, n]` of `dtype` operands: the cooperative matmul's where it
/// applies ([`cooperative_plan`]: f16 on a device with cooperative matrices), else [`plan`]'s
/// (the rules, untuned: what the tests describe; the context's choice is
/// `Context::matmul_plan_for`).
#[cfg(test)]
pub(crate) fn plan_for(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
) -> Result<MatmulPlan, ComputeError> {
    check_sizes(m, n, k)?;
    match cooperative_plan(options, caps, dtype, m, n, k)? {
        Some(plan) => {
            check_operands(m, n, k)?;
            Ok(plan)
        }
        None => plan(options, caps, m, n, k),
    }
}

/// The plan of the matmul on cooperative matrices, where it applies: f16 operands (or f32 ones
/// under [`MatmulOptions::cooperative_f32_as_f16`], rounded to f16 as the kernel stages them),
/// [`MatmulOptions::cooperative`], a device with cooperative matrices
/// ([`DeviceCaps::cooperative_f16`]), at least [`MatmulOptions::cooperative_min_rows`] rows
/// (unless the tile is forced) and a tile the device takes. The tile: the forced one
/// ([`MatmulOptions::cooperative_tiles`]; one the device's limits refuse is a
/// [`ComputeError::Config`]), else 32×128 for at most 32 rows, else the largest of 128×256,
/// 128×128 and 64×128 that the device takes and that gives at least `min_workgroups / 2` block
/// tiles (one per SM of an H200) unsplit, else 64×64, else 32×128. K is split (as for the
/// tiled kernel, the split-K reduction adding f32 partial products) where the block tiles are
/// fewer than `min_workgroups / 2`: enough splits for `min_workgroups`, each at least
/// `min_split_depth` deep, at most `max_splits` (or [`MatmulOptions::split_k`] where forced).
/// `m`, `n`, `k` are not 0.
pub(crate) fn cooperative_plan(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Option<MatmulPlan>, ComputeError> {
    let operands = match dtype {
        DType::F16 => true,
        DType::F32 => options.cooperative_f32_as_f16,
    };
    if !operands || !options.cooperative || !caps.cooperative_f16() {
        return Ok(None);
    }
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let Some(tiles) = cooperative_tile(options, &caps.limits, m64, n64)? else {
        return Ok(None);
    };
    let blocks = n64
        .div_ceil(u64::from(tiles.bn))
        .saturating_mul(m64.div_ceil(u64::from(tiles.bm)));
    let wanted = cooperative_splits(options, blocks, k64);
    let grid = block_grid(
        caps,
        (
            u64::from(tiles.bm),
            u64::from(tiles.bn),
            u64::from(tiles.bk),
        ),
        (m64, n64, k64),
        wanted,
    )?;
    Ok(Some(MatmulPlan {
        tiles: options.small_tiles,
        splits: grid.splits,
        k_chunk: grid.k_chunk,
        vec4: k.is_multiple_of(4) && n.is_multiple_of(4),
        edges: grid.edges,
        workgroups: grid.workgroups,
        narrow_lanes: 0,
        narrow_subgroup: 0,
        narrow_row_groups: 0,
        cooperative: Some(tiles),
    }))
}

/// The cooperative matmul's tile for an `m × n` product (see [`cooperative_plan`]): the forced
/// one (checked against the device's limits), else by rows and block tiles; `None` where the
/// rows are too few or no tile fits the device.
fn cooperative_tile(
    options: &MatmulOptions,
    limits: &wgpu::Limits,
    m: u64,
    n: u64,
) -> Result<Option<CoopTiles>, ComputeError> {
    if let Some(tiles) = options.cooperative_tiles {
        tiles.check(limits)?;
        return Ok(Some(tiles));
    }
    if m < u64::from(options.cooperative_min_rows) {
        return Ok(None);
    }
    let blocks = |t: CoopTiles| {
        m.div_ceil(u64::from(t.bm))
            .saturating_mul(n.div_ceil(u64::from(t.bn)))
    };
    let wave = u64::from(options.min_workgroups / 2).max(1);
    let fits = |tiles: &CoopTiles| tiles.check(limits).is_ok();
    // Larger tiles read each operand fewer times; measured on the H100 and the H200, the
    // largest that still fills the GPU without a split is the fastest of the 32-deep tiles at
    // every serving shape (MEASUREMENTS.md, sessions 15 and 16).
    let large = [CoopTiles::T128X256, CoopTiles::T128X128, CoopTiles::T64X128];
    let first = if m <= 32 {
        CoopTiles::T32X128
    } else {
        large
            .into_iter()
            .filter(fits)
            .find(|&tiles| blocks(tiles) >= wave)
            .unwrap_or(CoopTiles::T64X64)
    };
    Ok([first, CoopTiles::T64X64, CoopTiles::T32X128]
        .into_iter()
        .find(fits))
}

/// The splits of K the cooperative matmul wants over `blocks` block tiles (before the limits
/// cap them): the forced number, else none where the tiles give `min_workgroups / 2`, else
/// enough for `min_workgroups`, each at least `min_split_depth` deep, at most `max_splits`.
fn cooperative_splits(options: &MatmulOptions, blocks: u64, k: u64) -> u64 {
    match options.split_k {
        Some(splits) => u64::from(splits.max(1)),
        None if blocks >= u64::from(options.min_workgroups / 2) => 1,
        None => u64::from(options.min_workgroups)
            .div_ceil(blocks.max(1))
            .min(k / u64::from(options.min_split_depth.max(1)))
            .min(u64::from(options.max_splits))
            .max(1),
    }
}

/// Refuses a matmul with a size of 0 ([`ComputeError::InvalidShape`]).
pub(crate) fn check_sizes(m: usize, n: usize, k: usize) -> Result<(), ComputeError> {
    if m == 0 || n == 0 || k == 0 {
        return Err(ComputeError::InvalidShape {
            op: "matmul",
            shape: vec![m, n, k],
            reason: "M, N and K of a matmul must not be 0",
        });
    }
    Ok(())
}

/// Refuses operands of more elements than a tensor holds: A, B and C are tensors, and a plan
/// refuses what no tensor holds, as the matmul would.
pub(crate) fn check_operands(m: usize, n: usize, k: usize) -> Result<(), ComputeError> {
    for shape in [[m, k], [k, n], [m, n]] {
        element_count("matmul", &shape)?;
    }
    Ok(())
}

/// The plan of the tiled kernel (with split-K where the tile leaves the GPU idle); `m`, `n`,
/// `k` are not 0. Every product saturates: a saturated size is refused below by a limit.
pub(crate) fn tiled_plan(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    m: usize,
    n: usize,
    k: usize,
) -> Result<MatmulPlan, ComputeError> {
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let tiles = tiled_tile(options, &caps.limits, m64, n64);
    let wanted = tiled_splits(options, tiles, m64, n64, k64);
    let grid = block_grid(
        caps,
        (
            u64::from(tiles.bm),
            u64::from(tiles.bn),
            u64::from(tiles.bk),
        ),
        (m64, n64, k64),
        wanted,
    )?;
    Ok(MatmulPlan {
        tiles,
        splits: grid.splits,
        k_chunk: grid.k_chunk,
        vec4: k.is_multiple_of(4) && n.is_multiple_of(4),
        edges: grid.edges,
        workgroups: grid.workgroups,
        narrow_lanes: 0,
        narrow_subgroup: 0,
        narrow_row_groups: 0,
        cooperative: None,
    })
}

/// The split along K, grid and edges of a product by block tiles.
struct BlockGrid {
    splits: u32,
    k_chunk: u32,
    workgroups: [u32; 3],
    edges: bool,
}

/// The grid of an `m × n × k` product by block tiles of `bm × bn` walking K by `bk`, split at
/// most `wanted` ways along K: as many splits as keep their f32 partial products within one
/// binding, each a multiple of `bk` deep; the block tiles as the grid where the device takes it,
/// else laid over rows of linear ids (the kernels map both through `block_id`). Errors: more
/// splits or block tiles than the device's grid or the kernels' `u32`s take.
fn block_grid(
    caps: &DeviceCaps,
    (bm, bn, bk): (u64, u64, u64),
    (m, n, k): (u64, u64, u64),
    wanted: u64,
) -> Result<BlockGrid, ComputeError> {
    const OP: &str = "matmul";
    let limits = &caps.limits;
    let (bm, bn, bk) = (bm.max(1), bn.max(1), bk.max(1));
    // The partial products (rounded up to 16 bytes) must fit one binding.
    let max_binding_splits = (limits.max_storage_buffer_binding_size.saturating_sub(16)
        / m.saturating_mul(n).saturating_mul(4))
    .max(1);
    let wanted = wanted.min(max_binding_splits);
    // At least `bk` (K is not 0), so the division below is sound.
    let k_chunk = k.div_ceil(wanted).div_ceil(bk).saturating_mul(bk);
    let splits = k.div_ceil(k_chunk);
    let max = u64::from(limits.max_compute_workgroups_per_dimension);
    if splits > max {
        return Err(ComputeError::ExceedsLimit {
            op: OP,
            what: "splits along K",
            value: splits,
            limit_name: "max_compute_workgroups_per_dimension",
            limit: max,
        });
    }
    let (tiles_n, tiles_m) = (n.div_ceil(bn), m.div_ceil(bm));
    let blocks = tiles_n.saturating_mul(tiles_m);
    let (x, y) = if tiles_n <= u64::from(caps.max_grid_x) && tiles_m <= max {
        (tiles_n, tiles_m)
    } else {
        let (grid, _) = caps.grid_1d(OP, blocks)?;
        (u64::from(grid[0]), u64::from(grid[1]))
    };
    // The kernel multiplies them in a u32.
    kernel_u32(OP, "block tiles", blocks)?;
    Ok(BlockGrid {
        splits: kernel_u32(OP, "splits along K", splits)?,
        k_chunk: kernel_u32(OP, "depth of K per split", k_chunk)?,
        workgroups: [
            kernel_u32(OP, "workgroups along N", x)?,
            kernel_u32(OP, "workgroups along M", y)?,
            kernel_u32(OP, "splits along K", splits)?,
        ],
        edges: !m.is_multiple_of(bm) || !n.is_multiple_of(bn) || !k.is_multiple_of(bk),
    })
}

/// The plan of the narrow kernel under `options`, where it applies: few rows, K and N
/// multiples of 4, tiles not forced, K within the kernels' `u32` parameters and a grid the
/// device takes.
pub(crate) fn narrow_plan(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    m: usize,
    n: usize,
    k: usize,
) -> Option<MatmulPlan> {
    let applies = options.tiles.is_none()
        && m >= 1
        && m as u64 <= u64::from(options.narrow_max_rows)
        && k.is_multiple_of(4)
        && n.is_multiple_of(4);
    if !applies {
        return None;
    }
    let limits = &caps.limits;
    let (n4, k4) = ((n / 4) as u64, (k / 4) as u64);
    // A software GPU runs invocations one after another: fewer slices (fewer barriers in
    // the reduction) and no split win there, whatever the number of workgroups.
    let software = caps.is_software();
    let wanted = u64::from(options.min_workgroups / 2).max(1);
    let lanes = narrow_lanes(options, software, n4);
    let groups = match options.narrow_row_groups {
        Some(groups) if groups >= 1 && (m as u64).is_multiple_of(u64::from(groups)) => {
            u64::from(groups)
        }
        _ => 1,
    };
    // Workgroups along N for each group of rows, and in all.
    let tiles = n4.div_ceil(lanes);
    let group_tiles = tiles.saturating_mul(groups);
    let slices = u64::from(MatmulOptions::NARROW_THREADS) / lanes;
    let wanted_splits = match options.narrow_splits {
        Some(splits) => u64::from(splits),
        None if software || group_tiles.saturating_mul(NARROW_SPLIT_BELOW) >= wanted => 1,
        None => wanted
            .div_ceil(group_tiles)
            .min(u64::from(options.max_splits))
            .min(k4 / (slices * NARROW_MIN_SPLIT_STEPS))
            .max(1),
    };
    // The partial products (rounded up to 16 bytes) must fit one binding, and the splits
    // the grid's z.
    let max_binding_splits = (limits.max_storage_buffer_binding_size.saturating_sub(16)
        / (m as u64).saturating_mul(n as u64).saturating_mul(4))
    .max(1);
    let wanted_splits = wanted_splits
        .min(max_binding_splits)
        .min(u64::from(limits.max_compute_workgroups_per_dimension))
        .clamp(1, k4.max(1));
    // vec4 rows of K per split, then splits without an empty one.
    let k_chunk4 = k4.div_ceil(wanted_splits).max(1);
    let splits = k4.div_ceil(k_chunk4).max(1);
    // Subgroups, where the device has them with a fixed size (so they are full) wider than the
    // lanes (else each holds a single slice: nothing to add).
    let subgroup = match caps.fixed_subgroup_size() {
        Some(size) if options.narrow_subgroups && u64::from(size) > lanes => size,
        _ => 0,
    };
    // Past the x limit, rows of workgroups (lanes past N do nothing).
    let (mut workgroups, _) = caps.grid_1d("matmul", group_tiles).ok()?;
    workgroups[2] = u32::try_from(splits).ok()?;
    Some(MatmulPlan {
        tiles: options.small_tiles,
        splits: workgroups[2],
        k_chunk: u32::try_from(k_chunk4 * 4).ok()?,
        vec4: true,
        edges: false,
        workgroups,
        narrow_lanes: u32::try_from(lanes).ok()?,
        narrow_subgroup: subgroup,
        narrow_row_groups: u32::try_from(groups).ok()?,
        cooperative: None,
    })
}

/// The block tiles of `tiles` over an `m × n` product (saturating).
fn blocks(tiles: MatmulTiles, m: u64, n: u64) -> u64 {
    m.div_ceil(u64::from(tiles.bm.max(1)))
        .saturating_mul(n.div_ceil(u64::from(tiles.bn.max(1))))
}

/// The tile of the tiled kernel for an `m × n` product: the forced one, else the large one
/// where it gives `min_workgroups` block tiles (or the small one does not fit), else the thin
/// one for at most its rows where it fits, else the small one.
fn tiled_tile(options: &MatmulOptions, limits: &wgpu::Limits, m: u64, n: u64) -> MatmulTiles {
    if let Some(tiles) = options.tiles {
        return tiles;
    }
    let min_workgroups = u64::from(options.min_workgroups);
    let small_fits = options.small_tiles.check(limits).is_ok();
    let thin = options.thin_tiles;
    match options.large_tile(limits) {
        Some(large) if blocks(large, m, n) >= min_workgroups || !small_fits => large,
        _ if m <= u64::from(thin.bm) && thin.check(limits).is_ok() => thin,
        _ => options.small_tiles,
    }
}

/// The splits of K the tiled kernel wants with `tiles` (before the limits cap them): the forced
/// number, else none where the tiles fill the GPU, else as many as keep the workgroups within
/// `split_workgroups` (one wave) but at least enough for `min_workgroups`, each at least
/// `min_split_depth` deep, at most `max_splits`.
fn tiled_splits(options: &MatmulOptions, tiles: MatmulTiles, m: u64, n: u64, k: u64) -> u64 {
    let min_workgroups = u64::from(options.min_workgroups);
    let blocks = blocks(tiles, m, n);
    match options.split_k {
        Some(splits) => u64::from(splits.max(1)),
        None if blocks >= min_workgroups => 1,
        None => (u64::from(options.split_workgroups) / blocks.max(1))
            .max(min_workgroups.div_ceil(blocks.max(1)))
            .min(k / u64::from(options.min_split_depth.max(1)))
            .min(u64::from(options.max_splits))
            .max(1),
    }
}

/// The narrow kernel's lanes for `n4` vec4 columns: the forced number, else on a software GPU
/// 64 (or what N needs), else the widest (up to 64) that still gives `min_workgroups / 2`
/// workgroups, at least 2: coalescing wants wide rows of B per workgroup, filling the GPU many
/// workgroups (at least 2 vec4s: 32 contiguous bytes of each row of B).
fn narrow_lanes(options: &MatmulOptions, software: bool, n4: u64) -> u64 {
    let wanted = u64::from(options.min_workgroups / 2).max(1);
    // No more lanes than N needs (lanes past N idle).
    let needed = n4
        .next_power_of_two()
        .min(u64::from(MatmulOptions::NARROW_MAX_LANES));
    match options.narrow_lanes {
        Some(lanes) => u64::from(lanes),
        None if software => NARROW_AUTO_MAX_LANES.min(needed),
        None => {
            let mut lanes = NARROW_AUTO_MAX_LANES.min(needed);
            while lanes > NARROW_AUTO_MIN_LANES && n4.div_ceil(lanes) < wanted {
                lanes /= 2;
            }
            lanes
        }
    }
}

/// The plans of the tiled kernel that the autotuner times for `[m, k] · [k, n]`, the rules'
/// plan `automatic` first: the large, small, thin and three medium tiles the device takes, each
/// with 1, 2, 4, 8 and 16 splits of at least `min_split_depth` of K, as far as the device takes
/// them (see [`tiled_plan`]).
pub(crate) fn tiled_candidates(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    (m, n, k): (usize, usize, usize),
    automatic: MatmulPlan,
) -> Vec<MatmulPlan> {
    let limits = &caps.limits;
    let mut tiles: Vec<MatmulTiles> = vec![automatic.tiles];
    let more = options.large_tiles.iter().copied().chain([
        options.small_tiles,
        options.thin_tiles,
        MatmulTiles::T64X128X16,
        MatmulTiles::T64X128X16_4X8,
        MatmulTiles::T128X64X16,
    ]);
    for candidate in more {
        if candidate.check(limits).is_ok() && !tiles.contains(&candidate) {
            tiles.push(candidate);
        }
    }
    let mut candidates = vec![(automatic.tiles, automatic.splits)];
    for &tile in &tiles {
        for splits in [1u32, 2, 4, 8, 16] {
            let deep_enough = k as u64 >= u64::from(splits) * u64::from(options.min_split_depth);
            if (splits == 1 || deep_enough) && !candidates.contains(&(tile, splits)) {
                candidates.push((tile, splits));
            }
        }
    }
    // The plans the device takes, the automatic one first.
    let mut plans = vec![automatic];
    for (tile, splits) in candidates.into_iter().skip(1) {
        let forced = MatmulOptions {
            tiles: Some(tile),
            split_k: Some(splits),
            ..options.clone()
        };
        if let Ok(plan) = tiled_plan(&forced, caps, m, n, k) {
            plans.push(plan);
        }
    }
    plans
}

/// The plans of the cooperative matmul that the autotuner times for `[m, k] · [k, n]` of
/// `dtype` operands, the rules' plan `automatic` first: every tile of [`CoopTiles::ALL`] the
/// device takes, unsplit, and those giving fewer than `min_workgroups` block tiles also with 2,
/// 4, 8 and 16 splits of at least `min_split_depth` of K; each plan once.
pub(crate) fn cooperative_candidates(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    automatic: MatmulPlan,
) -> Vec<MatmulPlan> {
    let mut plans = vec![automatic];
    for tiles in CoopTiles::ALL {
        // A tile that fills the GPU is not split (its partial products would be as many
        // products' worth of memory for nothing).
        let blocks = (m as u64)
            .div_ceil(u64::from(tiles.bm))
            .saturating_mul((n as u64).div_ceil(u64::from(tiles.bn)));
        let fills = blocks >= u64::from(options.min_workgroups);
        for splits in [1u32, 2, 4, 8, 16] {
            let deep_enough = k as u64 >= u64::from(splits) * u64::from(options.min_split_depth);
            if splits > 1 && (fills || !deep_enough) {
                continue;
            }
            let forced = MatmulOptions {
                cooperative_tiles: Some(tiles),
                split_k: Some(splits),
                ..options.clone()
            };
            if let Ok(Some(plan)) = cooperative_plan(&forced, caps, dtype, m, n, k) {
                if !plans.contains(&plan) {
                    plans.push(plan);
                }
            }
        }
    }
    plans
}

/// The plans of the narrow kernel that the autotuner times for `[m, k] · [k, n]`, the rules'
/// plan `automatic` first: for all rows in each workgroup, and with at least
/// [`NARROW_GROUPS_MIN_ROWS`] rows also for 2 and 4 groups of rows where they divide M, those
/// of [`narrow_candidates`] the device takes, each once.
pub(crate) fn narrow_candidate_plans(
    options: &MatmulOptions,
    caps: &DeviceCaps,
    (m, n, k): (usize, usize, usize),
    automatic: MatmulPlan,
) -> Vec<MatmulPlan> {
    let mut plans = vec![automatic];
    let (n4, k4) = ((n / 4) as u64, (k / 4) as u64);
    for groups in [1u32, 2, 4] {
        let divides = m.is_multiple_of(groups as usize);
        if groups > 1 && (m < NARROW_GROUPS_MIN_ROWS || !divides) {
            continue;
        }
        for (lanes, splits) in narrow_candidates(n4, k4, groups, options.min_workgroups) {
            let forced = MatmulOptions {
                narrow_lanes: Some(lanes),
                narrow_splits: Some(splits),
                narrow_row_groups: Some(groups),
                ..options.clone()
            };
            if let Some(plan) = narrow_plan(&forced, caps, m, n, k) {
                if !plans.contains(&plan) {
                    plans.push(plan);
                }
            }
        }
    }
    plans
}

/// The tuner times the narrow kernel with its rows in groups only for products of at least this
/// many rows: fewer rows keep few sums per invocation anyway.
pub(crate) const NARROW_GROUPS_MIN_ROWS: usize = 8;

/// The narrow kernel's `(lanes, splits)` the autotuner times beside the automatic plan, for `n4`
/// vec4 columns, `k4` vec4 rows of K and `groups` groups of rows: every power of two of lanes
/// from 2 to 128 that N fills (no more than twice the columns), each unsplit and with the powers
/// of two of splits up to 64 that leave every invocation at least one vec4 row of K and give
/// from a quarter to twice `min_workgroups` workgroups.
pub(crate) fn narrow_candidates(
    n4: u64,
    k4: u64,
    groups: u32,
    min_workgroups: u32,
) -> Vec<(u32, u32)> {
    let fill = u64::from(min_workgroups.max(4));
    let (fewest, most) = (fill / 4, fill * 2);
    let mut candidates = Vec::new();
    let mut lanes = 2u32;
    while lanes <= MatmulOptions::NARROW_MAX_LANES / 2 && u64::from(lanes / 2) < n4 {
        let tiles = n4.div_ceil(u64::from(lanes)) * u64::from(groups.max(1));
        let slices = u64::from(MatmulOptions::NARROW_THREADS / lanes);
        let mut splits = 1u32;
        while splits <= 64 && (splits == 1 || k4 / u64::from(splits) >= slices) {
            if splits == 1 || (fewest..=most).contains(&(tiles * u64::from(splits))) {
                candidates.push((lanes, splits));
            }
            splits *= 2;
        }
        lanes *= 2;
    }
    candidates
}

#[cfg(test)]
mod tests;
