//! What the device offers the choice of a kernel, as plain data ([`DeviceCaps`]), and what a
//! context's matmuls keep of their device ([`MatmulDevice`]: those caps and the autotuner's
//! choices).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::coop::CoopTiles;
use super::error::ComputeError;
use super::params::grid_1d_within;
use super::tiles::MatmulTiles;
use crate::device::Gpu;

/// What the device offers the choice of a kernel: its limits, its features, its subgroup sizes
/// and its adapter, as plain data. Made once per context from its device
/// ([`DeviceCaps::of`]); the matmul's plan is a function of these, the options and the shape
/// alone (`ops/matmul/select.rs`), so that tests describe a device instead of opening one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceCaps {
    /// The device's limits (as the device was opened, not what the adapter could offer).
    pub(crate) limits: wgpu::Limits,
    /// The device's features (as the device was opened): the kernels read
    /// [`wgpu::Features::SHADER_F16`], [`wgpu::Features::SUBGROUP`],
    /// [`wgpu::Features::TIMESTAMP_QUERY`] and
    /// [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`].
    pub(crate) features: wgpu::Features,
    /// The adapter offers 16×16×16 cooperative products of f16 into f32 (what
    /// `shaders/matmul_coop.wgsl` multiplies), as [`Gpu::cooperative_matmul_f16`] says: read
    /// only with [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`] among the features.
    pub(crate) cooperative_16x16_f16: bool,
    /// The smallest subgroup size the adapter reports (0 where it reports none).
    pub(crate) subgroup_min_size: u32,
    /// The largest subgroup size the adapter reports (0 where it reports none).
    pub(crate) subgroup_max_size: u32,
    /// What kind of adapter: a software one ([`wgpu::DeviceType::Cpu`]) runs invocations one
    /// after another, so some rules choose differently there.
    pub(crate) device_type: wgpu::DeviceType,
    /// The backend the device runs on.
    pub(crate) backend: wgpu::Backend,
    /// The adapter's PCI vendor id (0x10de for NVIDIA).
    pub(crate) vendor: u32,
    /// The adapter's PCI device id.
    pub(crate) device: u32,
    /// The adapter's name.
    pub(crate) name: String,
    /// The largest x dimension of a grid the context dispatches: the device's
    /// `max_compute_workgroups_per_dimension`, or less where
    /// [`ContextOptions::max_grid_x`](crate::compute::ContextOptions::max_grid_x) caps it.
    pub(crate) max_grid_x: u32,
}

impl DeviceCaps {
    /// The caps of `gpu`'s device, its grid's x at the device's limit.
    pub(crate) fn of(gpu: &Gpu) -> Self {
        let limits = gpu.device.limits();
        Self {
            max_grid_x: limits.max_compute_workgroups_per_dimension,
            limits,
            features: gpu.device.features(),
            cooperative_16x16_f16: gpu.cooperative_matmul_f16(),
            subgroup_min_size: gpu.info.subgroup_min_size,
            subgroup_max_size: gpu.info.subgroup_max_size,
            device_type: gpu.info.device_type,
            backend: gpu.info.backend,
            vendor: gpu.info.vendor,
            device: gpu.info.device,
            name: gpu.info.name.clone(),
        }
    }

    /// These caps with the grid's x capped at `cap` (`None`: the device's limit).
    pub(crate) fn with_max_grid_x(self, cap: Option<u32>) -> Self {
        let device = self.limits.max_compute_workgroups_per_dimension;
        Self {
            max_grid_x: cap.map_or(device, |cap| cap.min(device)),
            ..self
        }
    }

    /// The grid of `workgroups` workgroups of a 1-D kernel within the context's grid (see
    /// [`grid_1d_within`]). Returns the grid and `x`.
    pub(crate) fn grid_1d(
        &self,
        op: &'static str,
        workgroups: u64,
    ) -> Result<([u32; 3], u32), ComputeError> {
        let max_y = self.limits.max_compute_workgroups_per_dimension;
        grid_1d_within(op, workgroups, self.max_grid_x, max_y)
    }

    /// Whether the device was opened with every feature of `features`.
    pub(crate) fn has(&self, features: wgpu::Features) -> bool {
        self.features.contains(features)
    }

    /// Whether f16 matmuls can run on the cooperative matmul (`shaders/matmul_coop.wgsl`):
    /// [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`] with 16×16×16 f16 → f32 products,
    /// [`wgpu::Features::SHADER_F16`], and subgroups of a fixed size of
    /// [`CoopTiles::SUBGROUP_SIZE`] (the kernel maps its 16×16 accumulators onto 32
    /// invocations).
    pub(crate) fn cooperative_f16(&self) -> bool {
        self.has(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
            && self.cooperative_16x16_f16
            && self.fixed_subgroup_size() == Some(CoopTiles::SUBGROUP_SIZE)
    }

    /// Whether the adapter is a software one ([`wgpu::DeviceType::Cpu`]).
    pub(crate) fn is_software(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }

    /// The device's subgroup size where subgroups are usable and of one fixed size (so that they
    /// are full): [`wgpu::Features::SUBGROUP`], `subgroup_min_size == subgroup_max_size`, a power
    /// of two from 4 to 128. `None` otherwise.
    pub(crate) fn fixed_subgroup_size(&self) -> Option<u32> {
        let size = self.subgroup_min_size;
        let fixed = self.has(wgpu::Features::SUBGROUP)
            && size == self.subgroup_max_size
            && size.is_power_of_two()
            && (4..=128).contains(&size);
        fixed.then_some(size)
    }
}

/// The plans chosen by measurement, by shape class.
#[derive(Debug, Default)]
pub(crate) struct Choices {
    /// The tiled kernel's `(tiles, splits)` by `(M rounded up to a power of two, N, K)`.
    pub(crate) tiled: HashMap<(usize, usize, usize), (MatmulTiles, u32)>,
    /// The narrow kernel's `(lanes, splits, row groups)` by `(M, N, K)` (M is compiled into its
    /// variant).
    pub(crate) narrow: HashMap<(usize, usize, usize), (u32, u32, u32)>,
    /// The cooperative matmul's `(tiles, splits)` by `(M rounded up to a power of two, N, K)`.
    pub(crate) cooperative: HashMap<(usize, usize, usize), (CoopTiles, u32)>,
}

/// What a context's matmuls keep of their device, found at the first matmul: its caps, and the
/// autotuner's choices for the device (adapter, driver, backend) and the context's matmul
/// options, shared by every context of the process with that device and those options.
#[derive(Debug)]
pub(crate) struct MatmulDevice {
    /// The device's caps, the grid's x capped as the context's options say.
    pub(crate) caps: DeviceCaps,
    /// The autotuner's choices.
    pub(crate) choices: Arc<Mutex<Choices>>,
}

/// The name by which the context holds its [`MatmulDevice`] (`Shared::tuned`).
pub(crate) type TunedChoices = MatmulDevice;
