//! The device side of the report: the adapter, the buffer-relevant limits, wgpu's own allocator
//! report and wgpu's internal counters, read from a device and kept as plain data.

use serde::{Deserialize, Serialize};

use crate::device::Gpu;
use crate::state::AccountedBytes;

/// Name, vendor, type, backend and driver of an adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterSummary {
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The backend-specific vendor id (a PCI vendor id on Vulkan, DX12 and Metal).
    pub vendor_id: u32,
    /// The vendor's name when the id is a known one (`NVIDIA`, `AMD`, `Intel`, `Mesa`, ...).
    pub vendor_name: Option<String>,
    /// The backend-specific device id.
    pub device_id: u32,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// `Vulkan`, `Metal`, `Dx12`, `Gl` or `BrowserWebGpu`.
    pub backend: String,
    /// The driver's name.
    pub driver: String,
    /// The driver's version and details.
    pub driver_info: String,
}

impl AdapterSummary {
    /// The summary of `info`.
    pub fn from_info(info: &wgpu::AdapterInfo) -> Self {
        Self {
            name: info.name.clone(),
            vendor_id: info.vendor,
            vendor_name: vendor_name(info.vendor).map(str::to_owned),
            device_id: info.device,
            device_type: format!("{:?}", info.device_type),
            backend: format!("{:?}", info.backend),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
        }
    }
}

/// The name of a PCI (or Khronos) vendor id, when it is a well-known one.
pub fn vendor_name(vendor_id: u32) -> Option<&'static str> {
    Some(match vendor_id {
        0x10de => "NVIDIA",
        0x1002 | 0x1022 => "AMD",
        0x8086 => "Intel",
        0x13b5 => "ARM",
        0x5143 => "Qualcomm",
        0x106b => "Apple",
        0x1414 => "Microsoft",
        0x1010 => "Imagination",
        0x14e4 => "Broadcom",
        0x10005 => "Mesa",
        _ => return None,
    })
}

/// The device limits that matter to a buffer pool and its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferLimits {
    /// Largest buffer the device creates, in bytes.
    pub max_buffer_size: u64,
    /// Largest storage binding, in bytes: no kernel can bind a larger allocation.
    pub max_storage_buffer_binding_size: u64,
    /// Every storage binding's offset is a multiple of this, in bytes.
    pub min_storage_buffer_offset_alignment: u32,
    /// Storage buffers one shader stage may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Largest uniform binding, in bytes.
    pub max_uniform_buffer_binding_size: u64,
    /// Every uniform binding's offset is a multiple of this, in bytes.
    pub min_uniform_buffer_offset_alignment: u32,
    /// Workgroup shared memory, in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroup size along x.
    pub max_compute_workgroup_size_x: u32,
    /// Workgroup size along y.
    pub max_compute_workgroup_size_y: u32,
    /// Workgroup size along z.
    pub max_compute_workgroup_size_z: u32,
    /// Workgroups in one dispatch, per dimension.
    pub max_compute_workgroups_per_dimension: u32,
}

impl BufferLimits {
    /// The buffer-relevant part of `limits`.
    pub fn from_limits(limits: &wgpu::Limits) -> Self {
        Self {
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            min_storage_buffer_offset_alignment: limits.min_storage_buffer_offset_alignment,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            max_uniform_buffer_binding_size: limits.max_uniform_buffer_binding_size,
            min_uniform_buffer_offset_alignment: limits.min_uniform_buffer_offset_alignment,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_compute_workgroup_size_y: limits.max_compute_workgroup_size_y,
            max_compute_workgroup_size_z: limits.max_compute_workgroup_size_z,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
        }
    }
}

/// One allocation in wgpu's allocator report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAllocation {
    /// The name wgpu gave it (usually the resource's label).
    pub name: String,
    /// Its size, in bytes.
    pub size_bytes: u64,
}

/// wgpu's own allocator report (`Device::generate_allocator_report()`), or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AllocatorReport {
    /// The backend sub-allocates (gpu-allocator on Vulkan and DX12) and reported.
    Present {
        /// Memory used by all allocations, in bytes.
        total_allocated_bytes: u64,
        /// Memory of all memory blocks, unallocated regions included, in bytes.
        total_reserved_bytes: u64,
        /// Memory blocks (device allocations) held.
        block_count: usize,
        /// Allocations in those blocks.
        allocation_count: usize,
        /// The largest allocations, largest first (at most [`LARGEST_ALLOCATIONS`]).
        largest_allocations: Vec<DeviceAllocation>,
    },
    /// The backend gives no report.
    Absent {
        /// Why, in words.
        reason: String,
    },
}

/// How many of the largest device allocations the report keeps.
pub const LARGEST_ALLOCATIONS: usize = 8;

impl AllocatorReport {
    /// Asks `device` (of `backend`) for its report.
    pub fn from_device(device: &wgpu::Device, backend: wgpu::Backend) -> Self {
        match device.generate_allocator_report() {
            Some(report) => {
                let mut largest: Vec<DeviceAllocation> = report
                    .allocations
                    .iter()
                    .map(|allocation| DeviceAllocation {
                        name: allocation.name.clone(),
                        size_bytes: allocation.size,
                    })
                    .collect();
                largest.sort_by_key(|allocation| std::cmp::Reverse(allocation.size_bytes));
                largest.truncate(LARGEST_ALLOCATIONS);
                Self::Present {
                    total_allocated_bytes: report.total_allocated_bytes,
                    total_reserved_bytes: report.total_reserved_bytes,
                    block_count: report.blocks.len(),
                    allocation_count: report.allocations.len(),
                    largest_allocations: largest,
                }
            }
            None => Self::Absent {
                reason: match backend {
                    wgpu::Backend::Vulkan | wgpu::Backend::Dx12 => format!(
                        "wgpu's {backend:?} backend returned no allocator report (it is not \
                         sub-allocating on this device)"
                    ),
                    _ => format!(
                        "wgpu's {backend:?} backend has no allocator report \
                         (Device::generate_allocator_report() answers on Vulkan and DX12 only)"
                    ),
                },
            },
        }
    }

    /// Memory used by all allocations, in bytes, when there is a report.
    pub fn total_allocated_bytes(&self) -> Option<u64> {
        match self {
            Self::Present {
                total_allocated_bytes,
                ..
            } => Some(*total_allocated_bytes),
            Self::Absent { .. } => None,
        }
    }

    /// Memory of all memory blocks, in bytes, when there is a report.
    pub fn total_reserved_bytes(&self) -> Option<u64> {
        match self {
            Self::Present {
                total_reserved_bytes,
                ..
            } => Some(*total_reserved_bytes),
            Self::Absent { .. } => None,
        }
    }
}

/// wgpu's internal counters (`Device::get_internal_counters()`), or why they are off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DeviceCounters {
    /// Built with this crate's `counters` feature (wgpu's `counters`).
    Enabled {
        /// Live buffers.
        buffers: i64,
        /// Memory wgpu attributes to buffers, in bytes.
        buffer_memory_bytes: i64,
        /// Live textures.
        textures: i64,
        /// Memory wgpu attributes to textures, in bytes.
        texture_memory_bytes: i64,
        /// Device memory allocations.
        memory_allocations: i64,
        /// Live bind groups.
        bind_groups: i64,
        /// Live compute pipelines.
        compute_pipelines: i64,
        /// Live shader modules.
        shader_modules: i64,
        /// Live command encoders.
        command_encoders: i64,
    },
    /// Built without the `counters` feature.
    Disabled {
        /// Why, in words.
        reason: String,
    },
}

impl DeviceCounters {
    /// Reads `device`'s counters (or says they are off).
    pub fn from_device(device: &wgpu::Device) -> Self {
        if !cfg!(feature = "counters") {
            return Self::Disabled {
                reason: "wgpu-pool was built without its `counters` feature (wgpu's internal \
                         counters)"
                    .into(),
            };
        }
        let hal = device.get_internal_counters().hal;
        let read = |value: isize| value as i64;
        Self::Enabled {
            buffers: read(hal.buffers.read()),
            buffer_memory_bytes: read(hal.buffer_memory.read()),
            textures: read(hal.textures.read()),
            texture_memory_bytes: read(hal.texture_memory.read()),
            memory_allocations: read(hal.memory_allocations.read()),
            bind_groups: read(hal.bind_groups.read()),
            compute_pipelines: read(hal.compute_pipelines.read()),
            shader_modules: read(hal.shader_modules.read()),
            command_encoders: read(hal.command_encoders.read()),
        }
    }
}

/// Everything the report says about a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// The adapter.
    pub adapter: AdapterSummary,
    /// The device's buffer-relevant limits.
    pub limits: BufferLimits,
    /// wgpu's allocator report, or why there is none.
    pub allocator: AllocatorReport,
    /// wgpu's internal counters, or why they are off.
    pub counters: DeviceCounters,
    /// Every buffer this crate holds on the device, by role (`None` for a report of a bare
    /// device, [`DeviceReport::from_device`]): what wgpu's allocator report is compared with.
    #[serde(default)]
    pub accounted: Option<AccountedBytes>,
}

impl DeviceReport {
    /// The report of `gpu`'s device, with the crate's buffers on it ([`Gpu::accounted`]).
    pub fn from_gpu(gpu: &Gpu) -> Self {
        // The crate's buffers first: then the allocator report holds at least them.
        let accounted = gpu.accounted();
        Self {
            accounted: Some(accounted),
            ..Self::from_device(&gpu.info, &gpu.device)
        }
    }

    /// wgpu's allocator report's allocated bytes minus the crate's buffers: the memory of wgpu's
    /// own buffers, of allocation alignment and of buffers made on the device outside the crate.
    /// `None` without an allocator report or an accounting; negative where the device reports
    /// less than the crate created (a backend that allocates lazily).
    pub fn unaccounted_bytes(&self) -> Option<i128> {
        let device = self.allocator.total_allocated_bytes()?;
        let accounted = self.accounted.as_ref()?.total_bytes();
        Some(i128::from(device) - i128::from(accounted))
    }

    /// The report of `device`, opened on the adapter `info` describes.
    pub fn from_device(info: &wgpu::AdapterInfo, device: &wgpu::Device) -> Self {
        Self {
            adapter: AdapterSummary::from_info(info),
            limits: BufferLimits::from_limits(&device.limits()),
            allocator: AllocatorReport::from_device(device, info.backend),
            counters: DeviceCounters::from_device(device),
            accounted: None,
        }
    }
}
