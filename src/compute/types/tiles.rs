//! [`MatmulTiles`], the block tiles of the tiled matmul kernel, with the limits each needs.

use std::fmt;

use super::error::ComputeError;

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
    /// Rows of C per invocation: 4, 8 or 16.
    pub tm: u32,
    /// Columns of C per invocation: 4, 8 or 16 (not both `tm` and `tn` 16: too many
    /// registers).
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
