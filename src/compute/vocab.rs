//! The ground floor of `compute`: the words its other modules share, and nothing that uses them.
//! It imports no other module of `compute`; every other module builds on it.
//!
//! - [`ComputeError`], what an op, an upload or a read-back refuses with;
//! - [`ShaderChecks`], how kernels are compiled;
//! - the matmul's choices: [`Activation`], [`MatmulTiles`], [`MatmulOptions`];
//! - which kernel runs ([`Source`], [`Variant`], [`KernelKey`]) and what one dispatch of it
//!   binds ([`Dispatch`]);
//! - each kernel's parameters: one `#[repr(C)]` [`bytemuck::Pod`] struct per kernel's uniform,
//!   with a WGSL `struct` of the same name in its shader; a test in `kernels.rs` checks with naga
//!   that both have the same member offsets and size. A dispatch carries them as a
//!   [`ParamsBlock`], the bytes of its slot in the context's uniform ring;
//! - [`DType`], what a tensor's elements are stored as, and [`ElementTypes`], what one kernel
//!   variant loads and stores;
//! - size helpers: [`element_count`], [`tensor_bytes`], [`kernel_u32`]; host conversions of
//!   elements: [`encode_elements`], [`decode_elements`].

use std::fmt;

use crate::pool::PoolError;

/// Why an op, an upload or a read-back was refused. Nothing is recorded when an op fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ComputeError {
    /// The pool refused an allocation or a transfer (out of memory, too large for one binding...).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The shapes of an op's operands do not fit together.
    #[error("{op}: shapes {left:?} and {right:?} do not fit: {expected}")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's shape.
        left: Vec<usize>,
        /// The second operand's shape.
        right: Vec<usize>,
        /// What the op expects.
        expected: &'static str,
    },
    /// A shape the op cannot take (wrong rank, no elements, too many elements).
    #[error("{op}: shape {shape:?} is not valid: {reason}")]
    InvalidShape {
        /// The op.
        op: &'static str,
        /// The shape given.
        shape: Vec<usize>,
        /// Why not.
        reason: &'static str,
    },
    /// Uploaded data does not have the shape's number of elements.
    #[error("data of {data_len} values does not fill shape {shape:?} ({expected_len} values)")]
    DataLength {
        /// The shape given.
        shape: Vec<usize>,
        /// Values given.
        data_len: usize,
        /// Values the shape holds.
        expected_len: usize,
    },
    /// A size beyond what the device can dispatch or bind.
    #[error(
        "{op}: {what} = {value} exceeds the device's {limit_name} ({limit}); split the work into smaller ops"
    )]
    ExceedsLimit {
        /// The op.
        op: &'static str,
        /// What was too large.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The device limit that refused it.
        limit_name: &'static str,
        /// The limit's value.
        limit: u64,
    },
    /// A size beyond what a kernel's 32-bit parameters hold.
    #[error("{op}: {what} = {value} does not fit the kernels' 32-bit parameters")]
    ParameterOverflow {
        /// The op.
        op: &'static str,
        /// What was too large.
        what: &'static str,
        /// Its value (`u64::MAX` if even that does not hold it).
        value: u64,
    },
    /// A symbolic tensor (made by an op while its context captured: no memory, no data) was
    /// read, written, or passed to an op outside its capture.
    #[error(
        "{op}: the tensor is symbolic (made while its context captured): it has no memory; run the \
         capture's plan instead"
    )]
    Symbolic {
        /// The op.
        op: &'static str,
    },
    /// A capture or a plan was used in a way it cannot be (see [`Context::capture`](crate::compute::Context::capture)).
    #[error("capture: {0}")]
    Capture(String),
    /// The memory planner refused the captured buffers (a device limit they do not fit).
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// A capture was given the [`PlanArena`](crate::compute::PlanArena) of another context
    /// ([`CaptureOptions::arena`](crate::compute::CaptureOptions::arena)). Plans sharing an arena
    /// must never replay at the same time; only the replays of one context are ordered one after
    /// another, so an arena is shared only by plans of the context that made it
    /// ([`Context::plan_arena`](crate::compute::Context::plan_arena)). Nothing was built.
    #[error(
        "capture: the plan arena belongs to another context; replays of two contexts are not \
         ordered, so plans sharing an arena must be of one context: make one with this \
         context's plan_arena()"
    )]
    ForeignArena,
    /// A tensor of another context was passed to an op.
    #[error("{op}: the tensor belongs to another context")]
    ForeignTensor {
        /// The op.
        op: &'static str,
    },
    /// The operands of an op are stored as different element types (an f16 tensor and an f32
    /// one). Convert one first with [`Context::cast`](crate::compute::Context::cast).
    #[error(
        "{op}: operands of different element types ({left} and {right}); convert one with \
         Context::cast first"
    )]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's element type.
        left: DType,
        /// The element type of the operand that differs from it.
        right: DType,
    },
    /// An f16 tensor or op on a device without [`wgpu::Features::SHADER_F16`]: f16 storage
    /// needs it in every kernel that reads or writes such a tensor.
    #[error(
        "{op}: f16 tensors need wgpu::Features::SHADER_F16, which this device lacks (the adapter \
         does not offer it, or the device was opened without it: `request_gpu` asks for it \
         where the adapter has it); use DType::F32"
    )]
    ShaderF16Unavailable {
        /// The op.
        op: &'static str,
    },
    /// A configuration the device or the kernels cannot run.
    #[error("invalid compute configuration: {0}")]
    Config(String),
    /// A kernel of the user's ([`Context::dispatch`](crate::compute::Context::dispatch))
    /// declares a storage binding of its tensors `var<storage, read>` beside one declared
    /// `read_write`. Tensors may share one segment buffer, and wgpu refuses one buffer bound
    /// read-only and read-write in one dispatch, so such a kernel would run or fail depending on
    /// where the pool placed its tensors: it is refused at its first dispatch, whatever the
    /// placement.
    #[error(
        "dispatch: a storage binding of group 0 is declared `var<storage, read>` beside one \
         declared `read_write`; tensors may share a segment buffer, and wgpu refuses a buffer \
         bound both ways in one dispatch, so this kernel would fail whenever the pool places \
         its tensors together: declare every tensor binding `var<storage, read_write>` \
         (wgpu: {message})"
    )]
    ReadOnlyBinding {
        /// What wgpu said of the dispatch with every tensor in one buffer.
        message: String,
    },
    /// wgpu refused a kernel (a compile or pipeline error on this backend).
    #[error("kernel {kernel} was refused by the device: {message}")]
    Kernel {
        /// The kernel's entry point and variant.
        kernel: String,
        /// What wgpu said.
        message: String,
    },
    /// Waiting for the GPU failed.
    #[error("waiting for the GPU failed: {0}")]
    Wait(String),
    /// Reading GPU timestamps back failed.
    #[error("reading GPU timestamps failed: {0}")]
    Timing(String),
}

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

/// What a tensor's elements are stored as. Kernels compute in f32 whatever the storage: an f16
/// kernel converts each element it loads to f32, accumulates and computes in f32, and rounds
/// once (to nearest, ties to even) when it stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub enum DType {
    /// IEEE 754 binary32, 4 bytes (the default).
    #[default]
    F32,
    /// IEEE 754 binary16, 2 bytes: half the memory and bandwidth of f32, 11 significant bits
    /// (a relative rounding error of at most 2⁻¹¹ ≈ 4.9·10⁻⁴), finite up to 65,504. Needs a
    /// device with [`wgpu::Features::SHADER_F16`] ([`ComputeError::ShaderF16Unavailable`]
    /// otherwise).
    F16,
}

impl DType {
    /// Every element type.
    pub const ALL: [Self; 2] = [Self::F32, Self::F16];

    /// Bytes of one element: 4 or 2.
    pub const fn size_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// The name PyTorch and WGSL give it: `"f32"` or `"f16"`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one kernel variant loads and stores: its inputs' element type and its output's (which
/// differs where an f16 matmul split along K writes f32 partial products, or where a cast
/// converts). Arithmetic is f32 in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ElementTypes {
    pub(crate) input: DType,
    pub(crate) output: DType,
}

impl ElementTypes {
    /// f32 in and out: every kernel of the crate before f16.
    pub(crate) const F32: Self = Self::same(DType::F32);

    /// `dtype` in and out.
    pub(crate) const fn same(dtype: DType) -> Self {
        Self {
            input: dtype,
            output: dtype,
        }
    }

    /// Whether the kernel reads or writes f16 (its module then enables the `f16` extension).
    pub(crate) fn uses_f16(self) -> bool {
        self.input == DType::F16 || self.output == DType::F16
    }

    /// A short label for reports and errors: `""` for f32, else ` f16` or ` f16→f32`.
    pub(crate) fn label(self) -> String {
        if self == Self::F32 {
            String::new()
        } else if self.input == self.output {
            format!(" {}", self.input)
        } else {
            format!(" {}→{}", self.input, self.output)
        }
    }
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
    /// 64×128, 16 deep, 4×8 outputs per invocation: 256 invocations, 24 KiB (twice the
    /// invocations of 64×128×16 on the same tile, for products of a few hundred rows).
    pub const T64X128X16_4X8: Self = Self::new(64, 128, 16).per_invocation(4, 8);
    /// 64×64, 16 deep, 4×8 outputs per invocation: 128 invocations, 16 KiB.
    pub const T64X64X16_4X8: Self = Self::new(64, 64, 16).per_invocation(4, 8);
    /// 32×128, 16 deep, 4×8 outputs per invocation: 128 invocations, 20 KiB.
    pub const T32X128X16_4X8: Self = Self::new(32, 128, 16).per_invocation(4, 8);
    /// 64×256, 16 deep, 4×16 outputs per invocation: 256 invocations, 40 KiB.
    pub const T64X256X16_4X16: Self = Self::new(64, 256, 16).per_invocation(4, 16);

    /// Every tile the kernel supports.
    pub const ALL: [Self; 23] = [
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
        Self::T64X128X16_4X8,
        Self::T64X64X16_4X8,
        Self::T32X128X16_4X8,
        Self::T64X256X16_4X16,
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
        (self.bm / self.tm.max(1)).saturating_mul(self.bn / self.tn.max(1))
    }

    /// vec4 loads of the A tile per invocation.
    pub(crate) fn a_loads(&self) -> u32 {
        self.bm.saturating_mul(self.bk) / 4 / self.threads().max(1)
    }

    /// vec4 loads of the B tile per invocation.
    pub(crate) fn b_loads(&self) -> u32 {
        self.bk.saturating_mul(self.bn) / 4 / self.threads().max(1)
    }

    /// Workgroup memory of the two tile buffers, in bytes (`u32::MAX` if that overflows).
    pub fn workgroup_storage_bytes(&self) -> u32 {
        self.bk
            .saturating_mul(self.bm.saturating_add(self.bn))
            .saturating_mul(8)
    }

    /// Whether the kernel takes this tile (`tm`, `tn` 4, 8 or 16, from 32 to 128 outputs; `bm`, `bn`
    /// multiples of `tm`, `tn`; `bk` 8 or 16; each invocation loads one, two or four vec4s of
    /// each tile) and the device runs it (invocations, workgroup size, workgroup memory).
    pub fn check(&self, limits: &wgpu::Limits) -> Result<(), ComputeError> {
        let shape_ok = [4, 8, 16].contains(&self.tm)
            && [4, 8, 16].contains(&self.tn)
            && (32..=128).contains(&(self.tm * self.tn))
            && self.bm > 0
            && self.bn > 0
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bk == 8 || self.bk == 16)
            && (self.bm.saturating_mul(self.bk) / 4).is_multiple_of(self.threads())
            && (self.bk.saturating_mul(self.bn) / 4).is_multiple_of(self.threads())
            && [1, 2, 4].contains(&self.a_loads())
            && [1, 2, 4].contains(&self.b_loads());
        if !shape_ok {
            return Err(ComputeError::Config(format!(
                "matmul tile {self}: the kernel takes tm × tn outputs per invocation of 8×8, 16×8, \
                 8×16, 4×8, 8×4 or 4×16, bm, bn multiples of tm, tn, bk 8 or 16, and 1, 2 or 4 vec4 loads of \
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

/// The autotuner's choices for one device and one set of matmul options: shared by every context
/// of the process with that device and those options.
pub(crate) type TunedChoices = std::sync::Mutex<Choices>;

/// The plans chosen by measurement, by shape class.
#[derive(Debug, Default)]
pub(crate) struct Choices {
    /// The tiled kernel's `(tiles, splits)` by `(M rounded up to a power of two, N, K)`.
    pub(crate) tiled: std::collections::HashMap<(usize, usize, usize), (MatmulTiles, u32)>,
    /// The narrow kernel's `(lanes, splits)` by `(M, N, K)` (M is compiled into its variant).
    pub(crate) narrow: std::collections::HashMap<(usize, usize, usize), (u32, u32)>,
}

/// When matmuls choose their tile and split-K by measurement ([`MatmulOptions::autotune`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Autotune {
    /// Never: the rules of [`crate::compute::ops::matmul`] choose.
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

/// How matmuls choose their tiles and split-K (see [`crate::compute::ops::matmul`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulOptions {
    /// Use this tile for every matmul (`None`: choose per shape, see
    /// [`crate::compute::ops::matmul`]).
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
    /// The narrow kernel adds the slices of each subgroup by shuffles before workgroup memory,
    /// where the device has [`wgpu::Features::SUBGROUP`] (requested when the adapter has it),
    /// a fixed subgroup size (`subgroup_min_size == subgroup_max_size`, so subgroups are full) and
    /// subgroups wider than the lanes. `false`: workgroup memory only, on every device.
    pub narrow_subgroups: bool,
    /// Whether the tile and split-K of the tiled kernel are chosen by measurement: the first
    /// matmul of a shape class (M rounded up to a power of two, N, K) times a few candidate plans
    /// on the device, and the fastest serves the class from then on, in every context of the
    /// process on the same device (adapter, driver, backend) with the same options
    /// ([`crate::compute::ops::matmul`]). By default ([`Autotune::Gpu`]) on every adapter but a
    /// software one; the first matmul of each class then runs each of its few dozen candidates
    /// eleven times (one warm-up, five rounds of two) before it runs itself. Ignored where
    /// `tiles` or `split_k` is forced, and where the automatic plan is the large tile without a
    /// split. The narrow kernel's lanes and splits are chosen the same way, for each shape (M,
    /// N, K), unless `narrow_lanes` or `narrow_splits` is forced.
    pub autotune: Autotune,
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
            narrow_subgroups: true,
            autotune: Autotune::Gpu,
        }
    }
}

impl MatmulOptions {
    /// The most rows the narrow kernel takes.
    pub const NARROW_MAX_ROWS: u32 = 8;

    /// The most vec4 columns per workgroup of the narrow kernel.
    pub(crate) const NARROW_MAX_LANES: u32 = 256;

    /// Invocations per workgroup of the narrow kernel (lanes × slices).
    pub(crate) const NARROW_THREADS: u32 = 256;

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
        if self.narrow_splits == Some(0) {
            return Err(ComputeError::Config(
                "narrow_splits must be at least 1".into(),
            ));
        }
        if let Some(lanes) = self.narrow_lanes {
            if !lanes.is_power_of_two() || lanes > Self::NARROW_MAX_LANES {
                return Err(ComputeError::Config(format!(
                    "narrow_lanes must be a power of two from 1 to {}, got {lanes}",
                    Self::NARROW_MAX_LANES
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

/// A WGSL file of `shaders/` with entry points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Unary,
    Binary,
    Matmul,
    MatmulNarrow,
    MatmulReduce,
    Rows,
}

impl Source {
    /// Storage bindings (after the parameters at binding 0).
    pub(crate) fn storage_bindings(self) -> usize {
        match self {
            Self::Unary | Self::Rows => 2,
            Self::Binary | Self::MatmulReduce => 3,
            Self::Matmul | Self::MatmulNarrow => 4,
        }
    }
}

/// The compile-time choices of one variant of a kernel (WGSL constants the host writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Variant {
    /// No constants.
    Plain,
    /// The tiled matmul (`shaders/matmul.wgsl`).
    Matmul {
        tiles: MatmulTiles,
        group_rows: u32,
        vec4: bool,
        edges: bool,
        bias: bool,
        activation: Activation,
        /// The grid is laid out as rows of linear workgroup ids (beyond the device's
        /// per-dimension limit): the entry point returns at once for ids past the last tile.
        /// Off, the entry point has no such test.
        linear_grid: bool,
    },
    /// The matmul kernel for a few rows (`shaders/matmul_narrow.wgsl`).
    Narrow {
        rows: u32,
        lanes: u32,
        /// The device's subgroup size, fixed, wider than `lanes`: each subgroup adds the slices it
        /// holds by shuffles before workgroup memory. 0: no subgroup operations.
        subgroup: u32,
        /// K is split over the grid's z: the kernel writes partial products (no epilogue) that
        /// the split-K reduction adds.
        split: bool,
        bias: bool,
        activation: Activation,
    },
    /// The split-K reduction (`shaders/matmul_reduce.wgsl`).
    Reduce { bias: bool, activation: Activation },
}

impl Variant {
    /// A short label for reports and errors.
    pub(crate) fn label(&self) -> String {
        match *self {
            Self::Plain => String::new(),
            Self::Matmul {
                tiles,
                group_rows: _,
                vec4,
                edges,
                bias,
                activation,
                linear_grid,
            } => format!(
                " {tiles}{}{}{}{}{}",
                if vec4 { " vec4" } else { " scalar" },
                if edges { " edges" } else { "" },
                if bias { " +bias" } else { "" },
                activation.suffix(),
                if linear_grid { " linear grid" } else { "" }
            ),
            Self::Narrow {
                rows,
                lanes,
                subgroup,
                split,
                bias,
                activation,
            } => format!(
                " {rows} rows x{lanes} lanes{}{}{}{}",
                if subgroup > 0 {
                    format!(" subgroup {subgroup}")
                } else {
                    String::new()
                },
                if split { " split" } else { "" },
                if bias { " +bias" } else { "" },
                activation.suffix()
            ),
            Self::Reduce { bias, activation } => format!(
                "{}{}",
                if bias { " +bias" } else { "" },
                activation.suffix()
            ),
        }
    }
}

/// Which kernel: a source, an entry point and a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KernelKey {
    pub(crate) source: Source,
    pub(crate) entry: &'static str,
    pub(crate) variant: Variant,
    /// What the kernel loads and stores.
    pub(crate) types: ElementTypes,
}

impl KernelKey {
    /// A kernel without constants, on f32.
    pub(crate) const fn plain(source: Source, entry: &'static str) -> Self {
        Self {
            source,
            entry,
            variant: Variant::Plain,
            types: ElementTypes::F32,
        }
    }

    /// This kernel loading and storing `types`.
    pub(crate) const fn typed(self, types: ElementTypes) -> Self {
        Self { types, ..self }
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{}{}{}",
            self.entry,
            self.variant.label(),
            self.types.label()
        )
    }
}

/// Bytes of the uniform binding through which every kernel reads its parameters (binding 0, at a
/// dynamic offset into the context's ring): room for the largest parameter struct.
pub(crate) const PARAMS_BYTES: u64 = 32;

/// Most storage bindings of any kernel.
pub(crate) const MAX_STORAGE_BINDINGS: usize = 4;

/// A kernel's parameter struct as the bytes of its uniform slot (zero past the struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ParamsBlock([u8; PARAMS_BYTES as usize]);

impl ParamsBlock {
    /// The block of `params`, one of the parameter structs below.
    pub(crate) fn new<P: bytemuck::Pod>(params: &P) -> Self {
        const { assert!(size_of::<P>() <= PARAMS_BYTES as usize) };
        let bytes = bytemuck::bytes_of(params);
        let mut block = [0; PARAMS_BYTES as usize];
        block[..bytes.len()].copy_from_slice(bytes);
        Self(block)
    }

    /// The parameter struct the block was made from ([`ParamsBlock::new`]'s inverse).
    pub(crate) fn read<P: bytemuck::Pod>(&self) -> P {
        bytemuck::pod_read_unaligned(&self.0[..size_of::<P>()])
    }

    /// The bytes the uniform slot holds.
    pub(crate) fn bytes(&self) -> &[u8; PARAMS_BYTES as usize] {
        &self.0
    }
}

/// The parameters of the element-wise kernels (`shaders/unary.wgsl`, `shaders/binary.wgsl`);
/// WGSL `ElementwiseParams` in `shaders/common.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ElementwiseParams {
    /// vec4s to compute: ⌈len / 4⌉.
    pub(crate) len_vec4: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Columns of `x` (the bias length of `add_bias`); 0 for the other kernels.
    pub(crate) cols: u32,
    /// The scalar of the `*_scalar` kernels; 0 for the others.
    pub(crate) scalar: f32,
}

/// The parameters of the tiled matmul; WGSL `MatmulParams` in `shaders/matmul.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MatmulParams {
    pub(crate) m: u32,
    pub(crate) n: u32,
    pub(crate) k: u32,
    /// Depth of K per split (a multiple of the tile's `bk`); K when there is no split.
    pub(crate) k_chunk: u32,
    /// Block tiles along N.
    pub(crate) tiles_n: u32,
    /// Block tiles along M.
    pub(crate) tiles_m: u32,
    /// Workgroups per row of the grid: `tiles_n` where the grid is `[tiles_n, tiles_m]`, else
    /// the x of a grid over `tiles_n · tiles_m` linear ids.
    pub(crate) grid_x: u32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The parameters of the narrow matmul; WGSL `NarrowParams` in `shaders/matmul_narrow.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct NarrowParams {
    /// N / 4.
    pub(crate) n4: u32,
    /// K / 4.
    pub(crate) k4: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// vec4 rows of K per split along the grid's z (`k4` without a split).
    pub(crate) k_chunk4: u32,
}

/// The parameters of the split-K reduction; WGSL `ReduceParams` in
/// `shaders/matmul_reduce.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ReduceParams {
    /// M · N.
    pub(crate) len: u32,
    pub(crate) n: u32,
    pub(crate) splits: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
}

/// The parameters of the row reductions; WGSL `RowsParams` in `shaders/rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RowsParams {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The bytes a tensor of `len` elements of `dtype` allocates: `len · dtype.size_bytes()` rounded
/// up to 16 (whole vec4s of either type; saturating, though [`element_count`] keeps `len` within
/// 2^30).
pub(crate) fn tensor_bytes(len: usize, dtype: DType) -> u64 {
    (len as u64)
        .saturating_mul(dtype.size_bytes())
        .div_ceil(16)
        .saturating_mul(16)
}

/// `data` as the bytes of `dtype` elements: as they are for f32, rounded to nearest (ties to
/// even) for f16, as the kernels round their stores, then padded with a zero to a multiple of 4
/// bytes (uploads move whole multiples of 4; a tensor's allocation is rounded up to 16).
pub(crate) fn encode_elements(data: &[f32], dtype: DType) -> std::borrow::Cow<'_, [u8]> {
    match dtype {
        DType::F32 => std::borrow::Cow::Borrowed(bytemuck::cast_slice(data)),
        DType::F16 => {
            use half::slice::HalfFloatSliceExt;
            let mut halves = vec![half::f16::ZERO; data.len().next_multiple_of(2)];
            halves[..data.len()].convert_from_f32_slice(data);
            let bits: &[u16] = halves.reinterpret_cast();
            std::borrow::Cow::Owned(bytemuck::cast_slice(bits).to_vec())
        }
    }
}

/// The first `len` elements of `dtype` in `bytes` (at least `len · dtype.size_bytes()` of them),
/// as f32 (exactly: every f16 is an f32).
pub(crate) fn decode_elements(bytes: &[u8], len: usize, dtype: DType) -> Vec<f32> {
    let bytes = &bytes[..len * dtype.size_bytes() as usize];
    match dtype {
        DType::F32 => crate::pool::to_elements(bytes, len),
        DType::F16 => {
            use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
            let bits: Vec<u16> = crate::pool::to_elements(bytes, len);
            let mut values = vec![0.0f32; len];
            bits.reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(&mut values);
            values
        }
    }
}

/// The elements of `shape`; refuses shapes without elements and overflowing ones.
pub(crate) fn element_count(op: &'static str, shape: &[usize]) -> Result<usize, ComputeError> {
    let invalid = |reason| ComputeError::InvalidShape {
        op,
        shape: shape.to_vec(),
        reason,
    };
    if shape.is_empty() {
        return Err(invalid("a tensor has at least one dimension"));
    }
    let len = shape
        .iter()
        .try_fold(1usize, |len, &dim| len.checked_mul(dim))
        .ok_or_else(|| invalid("the element count overflows"))?;
    if len == 0 {
        return Err(invalid("tensors without elements are not supported"));
    }
    if len > (u32::MAX / 4) as usize {
        return Err(invalid("more than 2^30 elements (kernels index with u32)"));
    }
    Ok(len)
}

/// `value` (a size `what` of op `op`) as a kernel's `u32` parameter, or
/// [`ComputeError::ParameterOverflow`].
pub(crate) fn kernel_u32<T>(
    op: &'static str,
    what: &'static str,
    value: T,
) -> Result<u32, ComputeError>
where
    T: Copy + TryInto<u32> + TryInto<u64>,
{
    TryInto::<u32>::try_into(value).map_err(|_| ComputeError::ParameterOverflow {
        op,
        what,
        value: TryInto::<u64>::try_into(value).unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_u32_are_typed_errors() {
        assert_eq!(kernel_u32("op", "rows", 7usize), Ok(7));
        assert_eq!(kernel_u32("op", "rows", u64::from(u32::MAX)), Ok(u32::MAX));
        assert_eq!(
            kernel_u32("op", "rows", u64::from(u32::MAX) + 1),
            Err(ComputeError::ParameterOverflow {
                op: "op",
                what: "rows",
                value: 1 << 32
            })
        );
        // Fewer than 2^30 elements: their byte offsets fit a u32.
        assert_eq!(
            element_count("op", &[3, (1 << 30) / 3]),
            Ok(3 * ((1 << 30) / 3))
        );
        assert!(element_count("op", &[1 << 15, 1 << 15]).is_err());
        assert!(element_count("op", &[usize::MAX, 2]).is_err());
        assert_eq!(tensor_bytes(1, DType::F32), 16);
        assert_eq!(tensor_bytes(5, DType::F32), 32);
        // f16: whole vec4s of f16 (8 bytes) and the same 16-byte rounding.
        assert_eq!(tensor_bytes(1, DType::F16), 16);
        assert_eq!(tensor_bytes(8, DType::F16), 16);
        assert_eq!(tensor_bytes(9, DType::F16), 32);
    }

    #[test]
    fn f16_elements_round_to_nearest_even_and_widen_exactly() {
        let data = [
            1.0,
            -2.5,
            65504.0,
            1.0 + 1.0 / 4096.0,
            1.0 + 3.0 / 4096.0,
            1e-8,
            7e4,
        ];
        let bytes = encode_elements(&data, DType::F16);
        // Seven f16s padded to 16 bytes.
        assert_eq!(bytes.len(), 16);
        let back = decode_elements(&bytes, data.len(), DType::F16);
        // 1 + 2⁻¹² is a tie between 1 and 1 + 2⁻¹⁰ (even: 1); 1 + 3·2⁻¹² rounds up; 10⁻⁸ is
        // below the smallest subnormal's half; 70,000 is past the largest finite f16.
        let expected = [
            1.0,
            -2.5,
            65504.0,
            1.0,
            1.0 + 1.0 / 1024.0,
            0.0,
            f32::INFINITY,
        ];
        assert_eq!(back, expected);
        let f32_bytes = encode_elements(&data, DType::F32);
        assert_eq!(decode_elements(&f32_bytes, data.len(), DType::F32), data);
    }

    #[test]
    fn a_params_block_holds_the_struct_then_zeros() {
        let params = ReduceParams {
            len: 1,
            n: 2,
            splits: 3,
            grid_x: 4,
        };
        let block = ParamsBlock::new(&params);
        let words: Vec<u32> = block
            .bytes()
            .chunks_exact(4)
            .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
            .collect();
        assert_eq!(words, [1, 2, 3, 4, 0, 0, 0, 0]);
    }
}
