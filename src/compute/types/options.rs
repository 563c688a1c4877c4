//! The user's choices for kernels: [`ShaderChecks`], the fused [`Activation`], [`Autotune`] and
//! [`MatmulOptions`].

use super::coop::{CoopProbe, CoopTiles};
use super::error::ComputeError;
use super::tiles::MatmulTiles;

/// Whether kernels are compiled with wgpu's injected bounds checks. The WGSL of a kernel is the
/// same in both modes; only its compilation differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShaderChecks {
    /// wgpu's bounds checks in every kernel (the default; tests use it).
    #[default]
    Checked,
    /// No injected bounds checks (`create_shader_module_trusted` with
    /// `ShaderRuntimeChecks::unchecked()`). Sound because every op validates shapes, sizes and
    /// offsets on the host and every kernel masks its own edges;
    /// on an H200 the 4096³ matmul ran at 34.0 TFLOP/s unchecked against 30.6 checked (an
    /// earlier, plainer kernel gained 1.7×). Benchmarks use it.
    Unchecked,
}

/// The activation of a fused epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation (as [`UnaryOp::Gelu`](crate::compute::UnaryOp::Gelu)).
    Gelu,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Self; 3] = [Self::None, Self::Relu, Self::Gelu];

    /// The code the kernels take (`activate4` in `shaders/common.wgsl`): 0 none, 1 relu, 2 gelu.
    pub(crate) fn code(self) -> u32 {
        match self {
            Self::None => 0,
            Self::Relu => 1,
            Self::Gelu => 2,
        }
    }

    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Relu => " +relu",
            Self::Gelu => " +gelu",
        }
    }
}

/// When matmuls choose their tile and split-K by measurement ([`MatmulOptions::autotune`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Autotune {
    /// Never: the rules of `src/compute/ops/matmul` choose.
    Off,
    /// On every adapter that is not a software one ([`wgpu::DeviceType::Cpu`], where timing the
    /// candidates costs seconds and says nothing about a GPU), and not in a browser (where
    /// nothing may wait for the GPU, so nothing can be timed). The default.
    #[default]
    Gpu,
    /// On every adapter, software ones included.
    Always,
}

impl Autotune {
    /// Whether matmuls on an adapter of `device_type` are tuned.
    pub fn applies_to(self, device_type: wgpu::DeviceType) -> bool {
        match self {
            Self::Off => false,
            Self::Gpu => device_type != wgpu::DeviceType::Cpu && !cfg!(target_arch = "wasm32"),
            Self::Always => true,
        }
    }
}

/// How matmuls choose their tiles and split-K (see `src/compute/ops/matmul`).
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulOptions {
    /// Use this tile for every matmul (`None`: choose per shape, see
    /// `src/compute/ops/matmul`).
    pub tiles: Option<MatmulTiles>,
    /// The tiles for shapes that fill the GPU, in order of preference: the first that the
    /// device's limits allow is used.
    pub large_tiles: Vec<MatmulTiles>,
    /// The tile for smaller shapes, and wherever the large one does not fit the device.
    pub small_tiles: MatmulTiles,
    /// The tile for products of at most its `bm` rows (more than the narrow kernel takes) that
    /// would take the small tile: a 64-row tile would be half empty, and this one's workgroups
    /// of 128 invocations keep more warps busy where the grid is small. On the H200 at
    /// 32 × 4096 × 4096: 57 µs with split-K 8, against 85 for the small tile (MEASUREMENTS.md).
    /// Skipped where the device's limits do not allow it.
    pub thin_tiles: MatmulTiles,
    /// Split K this many ways (`Some(1)`: never; `None`: when the tile leaves the GPU idle). The
    /// split is capped so that no split is empty.
    pub split_k: Option<u32>,
    /// Workgroups that fill the GPU: about two per SM (264 for an H200's 132 SMs). A shape with
    /// fewer large tiles than this takes the small tile, and with fewer small tiles, split-K.
    pub min_workgroups: u32,
    /// Automatic split-K splits K into as many parts as keep the workgroups at most this many
    /// (and at least `min_workgroups` where K allows): about four per SM, one wave; a count past
    /// it starts a second wave of a few workgroups (on the H200, 9 splits of 64 tiles took 88 µs
    /// where 8 took 73 at 256 × 1024 × 4096). On the H200, 64 to 256 rows through a layer of 4096
    /// inputs took 8–20% less time with twice `min_workgroups` than with `min_workgroups`
    /// (MEASUREMENTS.md).
    pub split_workgroups: u32,
    /// Automatic split-K keeps at least this much of K per split.
    pub min_split_depth: u32,
    /// Automatic split-K splits at most this many ways.
    pub max_splits: u32,
    /// Block tiles are visited in groups of this many tile rows, column by column within a
    /// group, so that the workgroups running at once share rows of A and columns of B in L2
    /// (1: row by row).
    pub group_rows: u32,
    /// Matmuls of at most this many rows (and K, N multiples of 4) run the narrow kernel
    /// (`shaders/matmul_narrow.wgsl`), unless `tiles` is forced. At most
    /// [`MatmulOptions::NARROW_MAX_ROWS`]; 0: never.
    pub narrow_max_rows: u32,
    /// vec4 columns of C per workgroup of the narrow kernel: a power of two from 1 to 256
    /// (`None`: on a GPU the largest up to 64 that still gives `min_workgroups / 2` workgroups
    /// along N, at least 2, and no more than N needs; on a software GPU 64, or what N needs).
    pub narrow_lanes: Option<u32>,
    /// Splits of K over workgroups of the narrow kernel, whose partial products the split-K
    /// reduction then adds (`Some(1)`: never; `None`: on a GPU, when the workgroups along N are
    /// fewer than `min_workgroups / 8`, enough splits for about `min_workgroups / 2` workgroups in
    /// all, at most `max_splits`, each invocation taking at least eight vec4 rows of K per split;
    /// on a software GPU never). Capped so that no split is empty.
    pub narrow_splits: Option<u32>,
    /// Groups of rows of the narrow kernel: each workgroup multiplies `M / groups` rows (fewer
    /// sums per invocation, `groups` times the workgroups, B read once from memory and again
    /// from the cache by the other groups). `None`: 1 (all rows in each workgroup) unless the
    /// tuner chooses more; a number that does not divide M counts as 1.
    pub narrow_row_groups: Option<u32>,
    /// The narrow kernel adds the slices of each subgroup by shuffles before workgroup memory,
    /// where the device has [`wgpu::Features::SUBGROUP`] (requested when the adapter has it),
    /// a fixed subgroup size (`subgroup_min_size == subgroup_max_size`, so subgroups are full) and
    /// subgroups wider than the lanes. `false`: workgroup memory only, on every device.
    pub narrow_subgroups: bool,
    /// Whether the tile and split-K of the tiled kernel are chosen by measurement: the first
    /// matmul of a shape class (M rounded up to a power of two, N, K) times a few candidate plans
    /// on the device, and the fastest serves the class from then on, in every context of the
    /// process on the same device (adapter, driver, backend) with the same options
    /// (`src/compute/ops/matmul`). By default ([`Autotune::Gpu`]) on every adapter but a
    /// software one; the first matmul of each class then runs each of its few dozen candidates
    /// eleven times (one warm-up, five rounds of two) before it runs itself. Ignored where
    /// `tiles` or `split_k` is forced, and where the automatic plan is the large tile without a
    /// split. The narrow kernel's lanes and splits are chosen the same way, for each shape (M,
    /// N, K), with its groups of rows, unless `narrow_lanes`, `narrow_splits` or
    /// `narrow_row_groups` is forced.
    pub autotune: Autotune,
    /// f16 matmuls run on cooperative matrices (`shaders/matmul_coop.wgsl`, the tensor cores)
    /// where the device has them (opened with
    /// [`GpuOptions::cooperative_matrix`](crate::GpuOptions::cooperative_matrix), 16×16×16 f16 →
    /// f32, subgroups of 32) and the product has at least `cooperative_min_rows` rows. `false`:
    /// the portable kernels on every device. f32 matmuls do only with
    /// `cooperative_f32_as_f16`.
    pub cooperative: bool,
    /// f32 matmuls may run on cooperative matrices too, their operands rounded to f16 as the
    /// kernel stages them (f32 storage, f32 accumulation, the f32 bias and epilogue, f32 output),
    /// where `cooperative` would run an f16 matmul of the same shape: the opt-in that PyTorch's
    /// `torch.backends.cuda.matmul.allow_tf32` is for TF32. Off by default, never silent.
    ///
    /// f16 keeps TF32's 10-bit mantissa (a relative rounding error of at most 2⁻¹¹ per
    /// operand) but not its range: an operand beyond ±65,504 overflows. **The caller guarantees
    /// the range**: an operand of magnitude from 65,520 (which rounds past 65,504) becomes ±∞ as
    /// the kernel rounds it on IEEE hardware (rounding to nearest overflows to ∞, as f16 storage
    /// does; WGSL itself leaves an out-of-range conversion's value unspecified, and
    /// `tests/it/coop.rs` checks the ∞ where the device runs the kernel), so the products it
    /// enters are ±∞ or NaN, never a silently finite wrong value; magnitudes below 2⁻¹⁴ ≈ 6.1·10⁻⁵ lose precision
    /// (subnormal) and below 2⁻²⁵ become 0. The plan does not check: the operands' range is only
    /// known on the GPU, and a max-|x| pass over them before each product would cost a pass over
    /// the operands plus a wait for the GPU, more than the tensor cores save. Weights and
    /// activations of networks trained in f16 or bf16 with normalised layers are in range; keep it
    /// off where values may exceed ±65,504 (unnormalised sums, large logits, raw counts).
    pub cooperative_f32_as_f16: bool,
    /// f16 matmuls of fewer rows keep the portable kernels (the narrow kernel reads B at the
    /// memory's speed; a 16-row fragment would be mostly empty). Ignored where
    /// `cooperative_tiles` is forced.
    pub cooperative_min_rows: u32,
    /// Use this tile for every cooperative matmul (`None`: choose per shape, see
    /// `src/compute/ops/matmul`). A tile the device's limits do not allow is a typed error.
    pub cooperative_tiles: Option<CoopTiles>,
    /// A diagnostic for the cooperative matmul: `Some(probe)` runs its kernel with part of the
    /// loop over K left out ([`CoopProbe`]), to time the rest, and **its results are not the
    /// product**. `None` (the default) for every use but that measurement; with a probe,
    /// `autotune` must be [`Autotune::Off`] (a [`ComputeError::Config`] otherwise).
    pub cooperative_probe: Option<CoopProbe>,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        Self {
            tiles: None,
            // 48 KiB of workgroup memory where the device has it (the H200 does), else 16 KiB.
            large_tiles: vec![MatmulTiles::T128X256X16_8X16, MatmulTiles::T128X128X8_16X8],
            small_tiles: MatmulTiles::T64X64X8,
            thin_tiles: MatmulTiles::T32X128X16_4X8,
            split_k: None,
            min_workgroups: 264,
            split_workgroups: 528,
            min_split_depth: 256,
            max_splits: 16,
            group_rows: 8,
            narrow_max_rows: Self::NARROW_MAX_ROWS,
            narrow_lanes: None,
            narrow_splits: None,
            narrow_row_groups: None,
            narrow_subgroups: true,
            autotune: Autotune::Gpu,
            cooperative: true,
            cooperative_f32_as_f16: false,
            cooperative_min_rows: 16,
            cooperative_tiles: None,
            cooperative_probe: None,
        }
    }
}

impl MatmulOptions {
    /// The most rows the narrow kernel takes.
    pub const NARROW_MAX_ROWS: u32 = 16;

    /// The most vec4 columns per workgroup of the narrow kernel.
    pub(crate) const NARROW_MAX_LANES: u32 = 256;

    /// Invocations per workgroup of the narrow kernel (lanes × slices).
    pub(crate) const NARROW_THREADS: u32 = 256;

    /// Checks that the forced tile (or at least one of the automatic ones) runs on the device.
    pub(crate) fn validate(&self, limits: &wgpu::Limits) -> Result<(), ComputeError> {
        if let (Some(probe), Autotune::Gpu | Autotune::Always) =
            (self.cooperative_probe, self.autotune)
        {
            // A tuner timing probes would choose among kernels that compute nothing.
            return Err(ComputeError::Config(format!(
                "cooperative_probe {} times one plan: set autotune to Autotune::Off",
                probe.name()
            )));
        }
        if cfg!(target_arch = "wasm32") && self.autotune == Autotune::Always {
            return Err(ComputeError::Config(
                "Autotune::Always times matmuls by waiting for the GPU, which a browser cannot do: \
                 use Autotune::Gpu or Off"
                    .into(),
            ));
        }
        if self.split_k == Some(0) {
            return Err(ComputeError::Config("split_k must be at least 1".into()));
        }
        if self.group_rows == 0 {
            return Err(ComputeError::Config("group_rows must be at least 1".into()));
        }
        if self.narrow_max_rows > Self::NARROW_MAX_ROWS {
            return Err(ComputeError::Config(format!(
                "narrow_max_rows must be at most {}, got {}",
                Self::NARROW_MAX_ROWS,
                self.narrow_max_rows
            )));
        }
        if self.narrow_splits == Some(0) {
            return Err(ComputeError::Config(
                "narrow_splits must be at least 1".into(),
            ));
        }
        if matches!(self.narrow_row_groups, Some(groups) if groups == 0 || groups > Self::NARROW_MAX_ROWS)
        {
            return Err(ComputeError::Config(format!(
                "narrow_row_groups must be from 1 to {}, got {:?}",
                Self::NARROW_MAX_ROWS,
                self.narrow_row_groups
            )));
        }
        if let Some(lanes) = self.narrow_lanes {
            if !lanes.is_power_of_two() || lanes > Self::NARROW_MAX_LANES {
                return Err(ComputeError::Config(format!(
                    "narrow_lanes must be a power of two from 1 to {}, got {lanes}",
                    Self::NARROW_MAX_LANES
                )));
            }
        }
        if let Some(tiles) = self.cooperative_tiles {
            // Checked for its shape here; the device's limits where a plan takes it (a device
            // without cooperative matrices never does).
            tiles.check(&wgpu::Limits {
                max_compute_workgroup_storage_size: u32::MAX,
                max_compute_invocations_per_workgroup: u32::MAX,
                max_compute_workgroup_size_x: u32::MAX,
                ..limits.clone()
            })?;
        }
        match self.tiles {
            Some(tiles) => tiles.check(limits),
            None if self.large_tile(limits).is_some() => Ok(()),
            None => self.small_tiles.check(limits),
        }
    }

    /// The first of [`MatmulOptions::large_tiles`] that the device's limits allow.
    pub fn large_tile(&self, limits: &wgpu::Limits) -> Option<MatmulTiles> {
        self.large_tiles
            .iter()
            .copied()
            .find(|tiles| tiles.check(limits).is_ok())
    }
}
