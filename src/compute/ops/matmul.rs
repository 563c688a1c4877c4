//! Matmul, f32: `C[M, N] = A[M, K] · B[K, N]`, row-major, any sizes, with an optional fused
//! epilogue (bias over columns, activation). Kernels: `shaders/matmul.wgsl` and, for split-K,
//! `shaders/matmul_reduce.wgsl`. CPU twin: [`crate::compute::cpu::matmul`].
//!
//! # Tiles
//!
//! A workgroup computes a `bm × bn` block of C with `(bm / tm) · (bn / tn)` invocations, each
//! holding `tm × tn` outputs in registers (8×8, 16×8 or 8×16; see [`MatmulTiles::ALL`]); it
//! walks K in steps of `bk` through two workgroup-memory buffers (A stored transposed for vec4
//! reads). The large tile — the first of [`MatmulOptions::large_tiles`] the device allows:
//! 128×256×16 with 8×16 outputs per invocation (256 invocations, 48 KiB of workgroup memory)
//! where the device has 48 KiB, else 128×128×8 with 16×8 (128 invocations, 16 KiB, which every
//! WebGPU device has) — is used when it yields at least [`MatmulOptions::min_workgroups`]
//! workgroups; otherwise the small one (64×64×8: 64
//! invocations, 8 KiB), and when even that leaves the GPU idle, split-K: `splits` workgroups
//! along K each write a partial product, and a second kernel adds them and runs the epilogue.
//! Tiles that do not fit the device's limits (workgroup memory, invocations) are skipped.
//!
//! # Few rows
//!
//! With at most [`MatmulOptions::NARROW_MAX_ROWS`] rows (a small batch) and K, N multiples of 4,
//! a tile would be mostly empty and would walk K serially; the narrow kernel
//! (`shaders/matmul_narrow.wgsl`) computes a matrix-vector style product instead: each workgroup
//! owns `narrow_lanes` vec4 columns of C and splits K over its invocations, which add their sums
//! in workgroup memory. One dispatch, no split-K partials. On the H200 (`bench_kernels --large
//! --matmul 8x1024x1024`): 15 µs against 41 µs for the 64×64 tile with split-K 4 at
//! 8×1024×1024, 8.5 against 40 µs at 1×1024×1024, 76 against 766 µs at 8×4096×4096.
//!
//! Each variant is compiled for its case: `vec4` (K and N multiples of 4: vec4 loads of A and B,
//! vec4 stores of C) or element loads and stores (the bindings declared as `array<f32>`);
//! `edges` (a partial tile somewhere: masked loads and stores) or none. The K steps of a tile are unrolled on the host (see `shaders/matmul.wgsl`).
//!
//! # Measured on an H200 (Vulkan, driver 580, `bench_kernels`)
//!
//! The lent H200 holds its 1,980 MHz SM clock for about 3 s of load, then runs at 660–900 MHz
//! (cool and far below its power limit; `nvidia-smi` beside the benchmark), so the later cases of
//! one long `bench_kernels --large` process run 35–60% slower whatever the tile. Tiles are
//! compared at boost clock, in fresh processes: `bench_kernels --large --only matmul --matmul
//! 4096x4096x4096 --tile T`, one process per tile, every tile twice.
//!
//! The main loop fetches the next tile from global memory unconditionally (the last tile is
//! fetched again rather than branching around the fetch), so the driver's compiler can
//! interleave those loads with the products of the current tile. That alone took 128×128×8 from
//! 34.0 to 39.4 TFLOP/s and 128×128×8/16×8 from 39.7 to 40.4 at 4096³. With it (two fresh
//! processes per tile, the figures of a tile within 0.1):
//!
//! | tile (outputs per invocation) | invocations | workgroup memory | TFLOP/s at 4096³ |
//! |---|---|---|---|
//! | 128×256×16/8×16 (the default where 48 KiB fit) | 256 | 48 KiB | 45.2 |
//! | 256×128×8/16×8 | 256 | 24 KiB | 43.0 |
//! | 64×256×8/8×16 | 128 | 20 KiB | 42.6 |
//! | 128×128×8/16×8 (the default under 48 KiB) | 128 | 16 KiB | 40.4 |
//! | 128×128×8/8×16 | 128 | 16 KiB | 40.3 |
//! | 256×128×16/16×8 | 256 | 48 KiB | 40.1 |
//! | 128×128×16 | 256 | 32 KiB | 39.7–39.8 |
//! | 128×128×8 | 256 | 16 KiB | 39.4 |
//! | 256×64×8/16×8 | 128 | 20 KiB | 38.0 |
//! | 64×128×8 | 128 | 12 KiB | 37.4–37.5 |
//! | 128×64×8 | 64 | 12 KiB | 35.3 |
//! | 128×128×16/16×8 | 128 | 32 KiB | 24.2 |
//!
//! With the automatic plan: 45.2 at 4096³ (38.0 with wgpu's bounds checks), 45.9 at 8192³, 34.6
//! at 2048³ (64×64×8), 28.7 at 1024³ (64×64×8, split-K 2), 19.4 at 64×4096×4096 (64×64×8,
//! split-K 5). cuBLAS without TF32 reaches about 51. Tried and dropped: an XOR-swizzled and a
//! padded A tile in workgroup memory (no gain), global loads two tiles ahead (slower).

use std::fmt;

use super::grid_1d;
use crate::compute::context::{element_count, tensor_bytes, Dispatch};
use crate::compute::kernels::{KernelKey, Params, Source, Variant};
use crate::compute::{ComputeError, Context, Tensor};

/// The activation of a fused epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation (as [`crate::compute::UnaryOp::Gelu`]).
    Gelu,
}

impl Activation {
    /// The code the kernels use. Keep in sync with `activate4` in `shaders/common.wgsl`.
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

/// What a matmul does to its result before storing it: `act(A·B + bias)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// A bias of shape `[N]`, added to every row.
    pub bias: Option<&'a Tensor>,
    /// The activation applied last.
    pub activation: Activation,
}

/// A block tile of the matmul kernel: `bm × bn` outputs per workgroup, `bk` deep per step,
/// `tm × tn` outputs per invocation (in registers), so a workgroup has `(bm / tm) · (bn / tn)`
/// invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulTiles {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Depth of K per step (through workgroup memory).
    pub bk: u32,
    /// Rows of C per invocation: 8 or 16.
    pub tm: u32,
    /// Columns of C per invocation: 8 or 16 (not both 16: too many registers).
    pub tn: u32,
}

impl fmt::Display for MatmulTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.bm, self.bn, self.bk)?;
        if (self.tm, self.tn) != (8, 8) {
            write!(f, "/{}x{}", self.tm, self.tn)?;
        }
        Ok(())
    }
}

impl MatmulTiles {
    /// 128×128, 8 deep: 256 invocations, 16 KiB of workgroup memory. The default large tile.
    pub const T128X128X8: Self = Self::new(128, 128, 8);
    /// 128×128, 16 deep: 256 invocations, 32 KiB of workgroup memory (half the barriers).
    pub const T128X128X16: Self = Self::new(128, 128, 16);
    /// 128×64, 8 deep: 128 invocations, 12 KiB.
    pub const T128X64X8: Self = Self::new(128, 64, 8);
    /// 64×128, 8 deep: 128 invocations, 12 KiB.
    pub const T64X128X8: Self = Self::new(64, 128, 8);
    /// 128×64, 16 deep: 128 invocations, 24 KiB.
    pub const T128X64X16: Self = Self::new(128, 64, 16);
    /// 64×128, 16 deep: 128 invocations, 24 KiB.
    pub const T64X128X16: Self = Self::new(64, 128, 16);
    /// 64×64, 8 deep: 64 invocations, 8 KiB. The default small tile.
    pub const T64X64X8: Self = Self::new(64, 64, 8);
    /// 64×64, 16 deep: 64 invocations, 16 KiB.
    pub const T64X64X16: Self = Self::new(64, 64, 16);
    /// 256×128, 8 deep, 16×8 outputs per invocation: 256 invocations, 24 KiB.
    pub const T256X128X8_16X8: Self = Self::new(256, 128, 8).per_invocation(16, 8);
    /// 128×256, 8 deep, 8×16 outputs per invocation: 256 invocations, 24 KiB.
    pub const T128X256X8_8X16: Self = Self::new(128, 256, 8).per_invocation(8, 16);
    /// 128×128, 8 deep, 16×8 outputs per invocation: 128 invocations, 16 KiB.
    pub const T128X128X8_16X8: Self = Self::new(128, 128, 8).per_invocation(16, 8);
    /// 128×128, 8 deep, 8×16 outputs per invocation: 128 invocations, 16 KiB.
    pub const T128X128X8_8X16: Self = Self::new(128, 128, 8).per_invocation(8, 16);
    /// 128×128, 16 deep, 16×8 outputs per invocation: 128 invocations, 32 KiB.
    pub const T128X128X16_16X8: Self = Self::new(128, 128, 16).per_invocation(16, 8);
    /// 256×128, 16 deep, 16×8 outputs per invocation: 256 invocations, 48 KiB.
    pub const T256X128X16_16X8: Self = Self::new(256, 128, 16).per_invocation(16, 8);
    /// 128×256, 16 deep, 8×16 outputs per invocation: 256 invocations, 48 KiB.
    pub const T128X256X16_8X16: Self = Self::new(128, 256, 16).per_invocation(8, 16);

    /// 256×64, 8 deep, 16×8 outputs per invocation: 128 invocations, 20 KiB.
    pub const T256X64X8_16X8: Self = Self::new(256, 64, 8).per_invocation(16, 8);
    /// 64×256, 8 deep, 8×16 outputs per invocation: 128 invocations, 20 KiB.
    pub const T64X256X8_8X16: Self = Self::new(64, 256, 8).per_invocation(8, 16);
    /// 128×64, 8 deep, 16×8 outputs per invocation: 64 invocations, 12 KiB.
    pub const T128X64X8_16X8: Self = Self::new(128, 64, 8).per_invocation(16, 8);
    /// 64×128, 8 deep, 8×16 outputs per invocation: 64 invocations, 12 KiB.
    pub const T64X128X8_8X16: Self = Self::new(64, 128, 8).per_invocation(8, 16);

    /// Every tile the kernel supports.
    pub const ALL: [Self; 19] = [
        Self::T128X128X8,
        Self::T128X128X16,
        Self::T128X64X8,
        Self::T128X64X16,
        Self::T64X128X8,
        Self::T64X128X16,
        Self::T64X64X8,
        Self::T64X64X16,
        Self::T256X128X8_16X8,
        Self::T128X256X8_8X16,
        Self::T128X128X8_16X8,
        Self::T128X128X8_8X16,
        Self::T128X128X16_16X8,
        Self::T256X128X16_16X8,
        Self::T128X256X16_8X16,
        Self::T256X64X8_16X8,
        Self::T64X256X8_8X16,
        Self::T128X64X8_16X8,
        Self::T64X128X8_8X16,
    ];

    /// A tile of 8×8 outputs per invocation; see [`MatmulTiles::check`] for the shapes the
    /// kernel takes.
    pub const fn new(bm: u32, bn: u32, bk: u32) -> Self {
        Self {
            bm,
            bn,
            bk,
            tm: 8,
            tn: 8,
        }
    }

    /// This tile with `tm × tn` outputs per invocation.
    pub const fn per_invocation(self, tm: u32, tn: u32) -> Self {
        Self { tm, tn, ..self }
    }

    /// Invocations per workgroup: `(bm / tm) · (bn / tn)`.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// vec4 loads of the A tile per invocation.
    pub(crate) fn a_loads(&self) -> u32 {
        self.bm * self.bk / 4 / self.threads().max(1)
    }

    /// vec4 loads of the B tile per invocation.
    pub(crate) fn b_loads(&self) -> u32 {
        self.bk * self.bn / 4 / self.threads().max(1)
    }

    /// Workgroup memory of the two tile buffers, in bytes.
    pub fn workgroup_storage_bytes(&self) -> u32 {
        2 * self.bk * (self.bm + self.bn) * 4
    }

    /// Whether the kernel takes this tile (`tm`, `tn` 8 or 16 but not both 16; `bm`, `bn`
    /// multiples of `tm`, `tn`; `bk` 8 or 16; each invocation loads one, two or four vec4s of
    /// each tile) and the device runs it (invocations, workgroup size, workgroup memory).
    pub fn check(&self, limits: &wgpu::Limits) -> Result<(), ComputeError> {
        let shape_ok = [8, 16].contains(&self.tm)
            && [8, 16].contains(&self.tn)
            && self.tm * self.tn <= 128
            && self.bm > 0
            && self.bn > 0
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bk == 8 || self.bk == 16)
            && (self.bm * self.bk / 4).is_multiple_of(self.threads())
            && (self.bk * self.bn / 4).is_multiple_of(self.threads())
            && [1, 2, 4].contains(&self.a_loads())
            && [1, 2, 4].contains(&self.b_loads());
        if !shape_ok {
            return Err(ComputeError::Config(format!(
                "matmul tile {self}: the kernel takes tm × tn outputs per invocation of 8×8, 16×8 \
                 or 8×16, bm, bn multiples of tm, tn, bk 8 or 16, and 1, 2 or 4 vec4 loads of \
                 each tile per invocation (e.g. {}, {}, {})",
                Self::T128X128X8,
                Self::T64X64X8,
                Self::T256X128X8_16X8
            )));
        }
        let threads = self.threads();
        let device_ok = threads <= limits.max_compute_invocations_per_workgroup
            && threads <= limits.max_compute_workgroup_size_x
            && self.workgroup_storage_bytes() <= limits.max_compute_workgroup_storage_size;
        if !device_ok {
            return Err(ComputeError::Config(format!(
                "matmul tile {self} needs {threads} invocations and {} bytes of workgroup memory; \
                 the device allows {} invocations and {} bytes",
                self.workgroup_storage_bytes(),
                limits.max_compute_invocations_per_workgroup,
                limits.max_compute_workgroup_storage_size
            )));
        }
        Ok(())
    }
}

/// The most lanes the narrow kernel's automatic choice takes.
const NARROW_AUTO_MAX_LANES: u32 = 64;

/// How matmuls choose their tiles and split-K.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulOptions {
    /// Use this tile for every matmul (`None`: choose per shape, see the module docs).
    pub tiles: Option<MatmulTiles>,
    /// The tiles for shapes that fill the GPU, in order of preference: the first that the
    /// device's limits allow is used.
    pub large_tiles: Vec<MatmulTiles>,
    /// The tile for smaller shapes, and wherever the large one does not fit the device.
    pub small_tiles: MatmulTiles,
    /// Split K this many ways (`Some(1)`: never; `None`: when the tile leaves the GPU idle). The
    /// split is capped so that no split is empty.
    pub split_k: Option<u32>,
    /// Workgroups that fill the GPU: about two per SM (264 for an H200's 132 SMs).
    pub min_workgroups: u32,
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
    /// (`None`: on a GPU the largest up to 64 that still gives `min_workgroups / 2` workgroups,
    /// at least 2; on a software GPU 64).
    pub narrow_lanes: Option<u32>,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        Self {
            tiles: None,
            // 48 KiB of workgroup memory where the device has it (the H200 does), else 16 KiB.
            large_tiles: vec![MatmulTiles::T128X256X16_8X16, MatmulTiles::T128X128X8_16X8],
            small_tiles: MatmulTiles::T64X64X8,
            split_k: None,
            min_workgroups: 264,
            min_split_depth: 256,
            max_splits: 16,
            group_rows: 8,
            narrow_max_rows: Self::NARROW_MAX_ROWS,
            narrow_lanes: None,
        }
    }
}

impl MatmulOptions {
    /// The most rows the narrow kernel takes.
    pub const NARROW_MAX_ROWS: u32 = 8;

    /// Checks that the forced tile (or at least one of the automatic ones) runs on the device.
    pub(crate) fn validate(&self, limits: &wgpu::Limits) -> Result<(), ComputeError> {
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
        if let Some(lanes) = self.narrow_lanes {
            if !lanes.is_power_of_two() || lanes > 256 {
                return Err(ComputeError::Config(format!(
                    "narrow_lanes must be a power of two from 1 to 256, got {lanes}"
                )));
            }
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

/// How one matmul runs: its tile, split-K and kernel variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulPlan {
    /// The block tile.
    pub tiles: MatmulTiles,
    /// Splits along K (1: none).
    pub splits: u32,
    /// Depth of K per split, a multiple of `tiles.bk` (K when there is no split).
    pub k_chunk: u32,
    /// K and N are multiples of 4: vec4 loads and stores.
    pub vec4: bool,
    /// Some tile is partial: loads and stores are masked.
    pub edges: bool,
    /// Workgroups of the matmul kernel: `[⌈N / bn⌉, ⌈M / bm⌉, splits]`, or of the narrow
    /// kernel: `[⌈N / (4 · narrow_lanes)⌉, 1, 1]`.
    pub workgroups: [u32; 3],
    /// vec4 columns per workgroup of the narrow kernel; 0 when the tiled kernel runs.
    pub narrow_lanes: u32,
}

impl Context {
    /// The plan [`Context::matmul`] follows for `[m, k] · [k, n]` under the context's options.
    pub fn matmul_plan(&self, m: usize, n: usize, k: usize) -> Result<MatmulPlan, ComputeError> {
        let options = &self.options().matmul;
        let limits = self.limits();
        if let Some(plan) = self.narrow_plan(m, n, k) {
            return Ok(plan);
        }
        let blocks = |tiles: MatmulTiles| {
            (m as u64).div_ceil(u64::from(tiles.bm)) * (n as u64).div_ceil(u64::from(tiles.bn))
        };
        let min_workgroups = u64::from(options.min_workgroups);
        let tiles = match options.tiles {
            Some(tiles) => tiles,
            None => {
                let small_fits = options.small_tiles.check(limits).is_ok();
                match options.large_tile(limits) {
                    Some(large) if blocks(large) >= min_workgroups || !small_fits => large,
                    _ => options.small_tiles,
                }
            }
        };
        let bk = u64::from(tiles.bk);
        let (m64, n64, k64) = (m as u64, n as u64, k as u64);
        let wanted = match options.split_k {
            Some(splits) => u64::from(splits.max(1)),
            None if blocks(tiles) >= min_workgroups => 1,
            None => min_workgroups
                .div_ceil(blocks(tiles))
                .min(k64 / u64::from(options.min_split_depth.max(1)))
                .min(u64::from(options.max_splits))
                .max(1),
        };
        // The partial products (rounded up to 16 bytes) must fit one binding.
        let max_binding_splits = (limits.max_storage_buffer_binding_size.saturating_sub(16)
            / (m64 * n64 * 4).max(1))
        .max(1);
        let wanted = wanted.min(max_binding_splits);
        let k_chunk = k64.div_ceil(wanted).div_ceil(bk) * bk;
        let splits = k64.div_ceil(k_chunk);
        let workgroups = [
            n64.div_ceil(u64::from(tiles.bn)),
            m64.div_ceil(u64::from(tiles.bm)),
            splits,
        ];
        let max = u64::from(limits.max_compute_workgroups_per_dimension);
        for (count, what) in
            workgroups
                .iter()
                .zip(["workgroups along N", "workgroups along M", "splits along K"])
        {
            if *count > max {
                return Err(ComputeError::ExceedsLimit {
                    op: "matmul",
                    what,
                    value: *count,
                    limit_name: "max_compute_workgroups_per_dimension",
                    limit: max,
                });
            }
        }
        Ok(MatmulPlan {
            tiles,
            splits: splits as u32,
            k_chunk: k_chunk as u32,
            vec4: k.is_multiple_of(4) && n.is_multiple_of(4),
            edges: !m64.is_multiple_of(u64::from(tiles.bm))
                || !n64.is_multiple_of(u64::from(tiles.bn))
                || !k64.is_multiple_of(bk),
            workgroups: workgroups.map(|count| count as u32),
            narrow_lanes: 0,
        })
    }

    /// The plan of the narrow kernel, where it applies: few rows, K and N multiples of 4, tiles
    /// not forced, and a grid the device takes.
    fn narrow_plan(&self, m: usize, n: usize, k: usize) -> Option<MatmulPlan> {
        let options = &self.options().matmul;
        let applies = options.tiles.is_none()
            && m >= 1
            && m as u64 <= u64::from(options.narrow_max_rows)
            && k.is_multiple_of(4)
            && n.is_multiple_of(4);
        if !applies {
            return None;
        }
        let n4 = (n / 4) as u64;
        let lanes = options.narrow_lanes.unwrap_or_else(|| {
            // A software GPU runs invocations one after another: fewer slices (fewer barriers
            // in the reduction) win there, whatever the number of workgroups.
            if self.gpu().info.device_type == wgpu::DeviceType::Cpu {
                return NARROW_AUTO_MAX_LANES;
            }
            let wanted = u64::from(options.min_workgroups / 2).max(1);
            let mut lanes = NARROW_AUTO_MAX_LANES;
            while lanes > 2 && n4.div_ceil(u64::from(lanes)) < wanted {
                lanes /= 2;
            }
            lanes
        });
        let workgroups = n4.div_ceil(u64::from(lanes));
        if workgroups > u64::from(self.limits().max_compute_workgroups_per_dimension) {
            return None;
        }
        Some(MatmulPlan {
            tiles: options.small_tiles,
            splits: 1,
            k_chunk: k as u32,
            vec4: true,
            edges: false,
            workgroups: [workgroups as u32, 1, 1],
            narrow_lanes: lanes,
        })
    }

    /// `C = A · B` for `A` of shape `[M, K]` and `B` of shape `[K, N]`.
    pub fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.matmul_with(a, b, Epilogue::default())
    }

    /// `C = act(A · B + bias)`, the epilogue fused into the matmul's stores.
    pub fn matmul_with(
        &self,
        a: &Tensor,
        b: &Tensor,
        epilogue: Epilogue<'_>,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "matmul";
        self.check_owner(OP, a)?;
        self.check_owner(OP, b)?;
        let (&[m, k], &[k_b, n]) = (a.shape(), b.shape()) else {
            return Err(ComputeError::ShapeMismatch {
                op: OP,
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "A of shape [M, K] and B of shape [K, N]",
            });
        };
        if k != k_b {
            return Err(ComputeError::ShapeMismatch {
                op: OP,
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "A's columns equal to B's rows",
            });
        }
        if let Some(bias) = epilogue.bias {
            self.check_owner(OP, bias)?;
            if bias.shape() != [n] {
                return Err(ComputeError::ShapeMismatch {
                    op: OP,
                    left: vec![m, n],
                    right: bias.shape().to_vec(),
                    expected: "bias of shape [N]",
                });
            }
        }
        let len = element_count(OP, &[m, n])?;
        let plan = self.matmul_plan(m, n, k)?;
        let has_bias = epilogue.bias.is_some();
        let split = plan.splits > 1;
        let (kernel, matmul_params) = if plan.narrow_lanes > 0 {
            let kernel = KernelKey {
                source: Source::MatmulNarrow,
                entry: "matmul_narrow",
                variant: Variant::Narrow {
                    rows: m as u32,
                    lanes: plan.narrow_lanes,
                    bias: has_bias,
                    activation: epilogue.activation,
                },
            };
            let mut words = Params::default();
            words[..2].copy_from_slice(&[(n / 4) as u32, (k / 4) as u32]);
            (kernel, words)
        } else {
            let kernel = KernelKey {
                source: Source::Matmul,
                entry: "matmul",
                variant: Variant::Matmul {
                    tiles: plan.tiles,
                    group_rows: self.options().matmul.group_rows,
                    vec4: plan.vec4,
                    edges: plan.edges,
                    // With split-K the reduction runs the epilogue.
                    bias: has_bias && !split,
                    activation: if split {
                        Activation::None
                    } else {
                        epilogue.activation
                    },
                },
            };
            let mut words = Params::default();
            words[..6].copy_from_slice(&[
                m as u32,
                n as u32,
                k as u32,
                plan.k_chunk,
                plan.workgroups[0],
                plan.workgroups[1],
            ]);
            (kernel, words)
        };
        // Compile before recording anything, so that a refused kernel records nothing.
        self.prepare(&kernel)?;
        // The matmul (or narrow) kernel writing `out`; `bias` is bound even when unused.
        let record_product = |out: &Tensor, bias: &Tensor| {
            self.record(Dispatch {
                kernel,
                params: matmul_params,
                bindings: &[
                    a.allocation(),
                    b.allocation(),
                    out.allocation(),
                    bias.allocation(),
                ],
                workgroups: plan.workgroups,
            })
        };
        if !split {
            self.before_op()?;
            let c = self.allocate(OP, vec![m, n], len)?;
            record_product(&c, epilogue.bias.unwrap_or(a))?;
            return Ok(c);
        }

        let reduce = KernelKey {
            source: Source::MatmulReduce,
            entry: "matmul_reduce",
            variant: Variant::Reduce {
                bias: has_bias,
                activation: epilogue.activation,
            },
        };
        self.prepare(&reduce)?;
        let (reduce_workgroups, grid_x) = grid_1d(self, OP, (len as u64).div_ceil(256))?;
        let splits = plan.splits as usize;
        let partial_len = element_count(OP, &[splits, m, n])?;
        if tensor_bytes(partial_len) > self.limits().max_storage_buffer_binding_size {
            return Err(ComputeError::ExceedsLimit {
                op: OP,
                what: "bytes of split-K partial products",
                value: tensor_bytes(partial_len),
                limit_name: "max_storage_buffer_binding_size",
                limit: self.limits().max_storage_buffer_binding_size,
            });
        }
        self.before_op()?;
        let c = self.allocate(OP, vec![m, n], len)?;
        let partial = self.allocate("matmul split-K partial", vec![splits, m, n], partial_len)?;
        record_product(&partial, a)?;
        let bias = epilogue.bias.unwrap_or(&partial);
        let mut reduce_params = Params::default();
        reduce_params[..4].copy_from_slice(&[len as u32, n as u32, plan.splits, grid_x]);
        self.record(Dispatch {
            kernel: reduce,
            params: reduce_params,
            bindings: &[partial.allocation(), bias.allocation(), c.allocation()],
            workgroups: reduce_workgroups,
        })?;
        // Dropped here: reusable after the submission that carries the reduction.
        drop(partial);
        Ok(c)
    }
}
