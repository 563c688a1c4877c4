//! [`CoopTiles`], the block tiles of the matmul on cooperative matrices
//! (`shaders/matmul_coop.wgsl`), with the limits each needs.

use std::fmt;

use super::error::ComputeError;

/// A block tile of the matmul on cooperative matrices (f16 operands, the tensor cores where the
/// device opened [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`], see
/// [`GpuOptions::cooperative_matrix`](crate::GpuOptions::cooperative_matrix)): `bm × bn` outputs of C per workgroup,
/// `wm × wn` per subgroup of [`CoopTiles::SUBGROUP_SIZE`] invocations, each subgroup holding
/// `(wm / 16) · (wn / 16)` accumulators of 16×16 f32. K is walked in slabs of `bk`
/// ([`CoopTiles::BK`] unless a tile says otherwise), staged in workgroup memory as rows of
/// `vec4<f16>` padded by [`CoopTiles::PAD`] elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopTiles {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Rows of C per subgroup, a multiple of 16.
    pub wm: u32,
    /// Columns of C per subgroup, a multiple of 16.
    pub wn: u32,
    /// Depth of K per slab staged in workgroup memory: 32 or 64 (a deeper slab halves the
    /// workgroup's barriers per product and takes twice the staging memory).
    pub bk: u32,
}

impl fmt::Display for CoopTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        if name.contains('/') {
            write!(f, "coop {name}")
        } else {
            write!(f, "coop {name}/{}x{}", self.wm, self.wn)
        }
    }
}

impl CoopTiles {
    /// 128×128, four subgroups of 64×64 (16 accumulators each): 128 invocations, 22.5 KiB of
    /// workgroup memory. 180 TFLOP/s at 4096³ on the H200 and the H100. The automatic tile
    /// where it gives enough workgroups and 128×256 does not (or does not fit).
    pub const T128X128: Self = Self::new(128, 128, 64, 64);
    /// 128×256, sixteen subgroups of 64×32 (8 accumulators each): 512 invocations, 42.5 KiB.
    /// 201 TFLOP/s at 4096³ on the H100, the fastest tile there (eight subgroups of 64×64:
    /// 192–197, and 5–20% slower at 1 to 512 rows × 4096²); the automatic one where it gives
    /// enough workgroups.
    pub const T128X256: Self = Self::new(128, 256, 64, 32);
    /// 64×128, eight subgroups of 32×32 (4 accumulators): 256 invocations, 21.5 KiB. The
    /// automatic tile where it gives enough workgroups and the larger ones do not (512 rows ×
    /// 4096² on the H100: 22% faster than four subgroups of 32×64, 49% faster than 64×64;
    /// four subgroups were slower at every measured shape).
    pub const T64X128: Self = Self::new(64, 128, 32, 32);
    /// 64×64, four subgroups of 32×32 (4 accumulators): 128 invocations, 13.5 KiB (within
    /// WebGPU's 16 KiB). The automatic tile for more than 32 rows where the larger ones give too
    /// few workgroups (K then split) or do not fit.
    pub const T64X64: Self = Self::new(64, 64, 32, 32);
    /// 32×128, four subgroups of 32×32: 128 invocations, 15 KiB. The automatic tile for at
    /// most 32 rows.
    pub const T32X128: Self = Self::new(32, 128, 32, 32);

    /// 128×128 as [`Self::T128X128`], K in slabs of 64: half the barriers per product; 128
    /// invocations, 39 KiB of workgroup memory. A tuner candidate; 2.1× slower than
    /// [`Self::T128X128`] at 4096³ on the H100.
    pub const T128X128X64: Self = Self::T128X128.with_bk(64);
    /// 128×128, eight subgroups of 64×32 (8 accumulators, fewer registers), K in slabs of 64:
    /// 256 invocations, 43 KiB. A tuner candidate; on the H100 the fastest at 256 rows × 4096²
    /// (5% ahead of 64×64), 8% slower than [`Self::T128X128`] at 4096³.
    pub const T128X128X64W: Self = Self::new(128, 128, 64, 32).with_bk(64);
    /// 64×128, four subgroups of 32×64, K in slabs of 64: 128 invocations, 30 KiB. A tuner
    /// candidate; slower than the 32-deep slabs at every measured shape (H100).
    pub const T64X128X64: Self = Self::new(64, 128, 32, 64).with_bk(64);

    /// The named tiles.
    pub const ALL: [Self; 8] = [
        Self::T128X128,
        Self::T128X256,
        Self::T64X128,
        Self::T64X64,
        Self::T32X128,
        Self::T128X128X64,
        Self::T128X128X64W,
        Self::T64X128X64,
    ];

    /// Depth of K per slab of [`Self::new`]'s tiles.
    pub const BK: u32 = 32;
    /// The depths of K per slab the kernel takes.
    pub const DEPTHS: [u32; 2] = [32, 64];
    /// f16 elements of padding after each staged row (spreads rows over memory banks).
    pub const PAD: u32 = 8;
    /// The subgroup size the kernel is written for (a cooperative matrix belongs to one
    /// subgroup; the epilogue maps its 16×16 elements onto 32 invocations).
    pub const SUBGROUP_SIZE: u32 = 32;
    /// Bytes of workgroup memory per subgroup for the epilogue: one 16×16 f32 accumulator.
    const SCRATCH_BYTES: u32 = 16 * 16 * 4;

    /// A tile of `bm × bn` per workgroup, `wm × wn` per subgroup, K in slabs of [`Self::BK`].
    pub const fn new(bm: u32, bn: u32, wm: u32, wn: u32) -> Self {
        Self {
            bm,
            bn,
            wm,
            wn,
            bk: Self::BK,
        }
    }

    /// The same tile with K in slabs of `bk` ([`Self::check`] takes those of [`Self::DEPTHS`]).
    pub const fn with_bk(self, bk: u32) -> Self {
        Self { bk, ..self }
    }

    /// The tile's short name: `BMxBN`, then `xBK` where the slabs are not [`Self::BK`] deep,
    /// then `w` for [`Self::T128X128X64W`]'s narrower subgroups; a tile that is not one of
    /// [`Self::ALL`] adds its subgroups' share, `/WMxWN` (as [`Self::named`] reads it).
    pub fn name(&self) -> String {
        let mut name = format!("{}x{}", self.bm, self.bn);
        if self.bk != Self::BK {
            name.push_str(&format!("x{}", self.bk));
        }
        let first = Self::ALL
            .iter()
            .find(|t| t.bm == self.bm && t.bn == self.bn && t.bk == self.bk);
        match first {
            Some(first) if first == self => {}
            _ if Self::ALL.contains(self) => name.push('w'),
            _ => name.push_str(&format!("/{}x{}", self.wm, self.wn)),
        }
        name
    }

    /// The tile of that [`Self::name`]: a named one (of [`Self::ALL`]) such as `128x128` or
    /// `128x128x64`, or any other written `BMxBN[xBK]/WMxWN` (e.g. `128x256/64x64`), for a
    /// command line; `None` where the text is neither. The tile is not checked
    /// ([`Self::check`] does).
    pub fn named(name: &str) -> Option<Self> {
        if let Some(tile) = Self::ALL.into_iter().find(|tile| tile.name() == name) {
            return Some(tile);
        }
        let (block, subgroup) = name.split_once('/')?;
        let dims =
            |text: &str| -> Option<Vec<u32>> { text.split('x').map(|d| d.parse().ok()).collect() };
        match (dims(block)?.as_slice(), dims(subgroup)?.as_slice()) {
            (&[bm, bn], &[wm, wn]) => Some(Self::new(bm, bn, wm, wn)),
            (&[bm, bn, bk], &[wm, wn]) => Some(Self::new(bm, bn, wm, wn).with_bk(bk)),
            _ => None,
        }
    }

    /// Subgroups per workgroup (saturating, 0 for a subgroup share of 0: such a tile fails
    /// [`Self::check`]).
    pub const fn subgroups(&self) -> u32 {
        match (self.bm.checked_div(self.wm), self.bn.checked_div(self.wn)) {
            (Some(rows), Some(columns)) => rows.saturating_mul(columns),
            _ => 0,
        }
    }

    /// Invocations per workgroup (saturating).
    pub const fn threads(&self) -> u32 {
        self.subgroups().saturating_mul(Self::SUBGROUP_SIZE)
    }

    /// `vec4<f16>` loads of A per invocation per slab (saturating; 0 without invocations).
    pub const fn a_loads(&self) -> u32 {
        self.per_invocation(self.bm.saturating_mul(self.bk / 4))
    }

    /// `vec4<f16>` loads of B per invocation per slab (saturating; 0 without invocations).
    pub const fn b_loads(&self) -> u32 {
        self.per_invocation(self.bk.saturating_mul(self.bn / 4))
    }

    /// `count` shared out over the invocations (0 without invocations).
    const fn per_invocation(&self, count: u32) -> u32 {
        match count.checked_div(self.threads()) {
            Some(each) => each,
            None => 0,
        }
    }

    /// Bytes of workgroup memory: the A and B slabs (f16, padded rows) and the epilogue's
    /// accumulator per subgroup.
    pub const fn workgroup_storage_bytes(&self) -> u32 {
        let a = self
            .bm
            .saturating_mul(self.bk.saturating_add(Self::PAD))
            .saturating_mul(2);
        let b = self
            .bk
            .saturating_mul(self.bn.saturating_add(Self::PAD))
            .saturating_mul(2);
        a.saturating_add(b)
            .saturating_add(self.subgroups().saturating_mul(Self::SCRATCH_BYTES))
    }

    /// Checks that the kernel takes the tile (`wm`, `wn` multiples of 16 dividing `bm`, `bn`;
    /// whole loads of each slab per invocation) and that the device's limits allow it
    /// ([`ComputeError::Config`] otherwise).
    pub fn check(&self, limits: &wgpu::Limits) -> Result<(), ComputeError> {
        let shape_ok = self.bm > 0
            && self.bn > 0
            && self.wm > 0
            && self.wn > 0
            && self.wm.is_multiple_of(16)
            && self.wn.is_multiple_of(16)
            && self.wm <= 64
            && self.wn <= 128
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && self.subgroups() <= 16
            && Self::DEPTHS.contains(&self.bk)
            && (self.bm * (self.bk / 4)).is_multiple_of(self.threads())
            && (self.bk * (self.bn / 4)).is_multiple_of(self.threads())
            && self.a_loads() >= 1
            && self.b_loads() >= 1;
        if !shape_ok {
            return Err(ComputeError::Config(format!(
                "cooperative matmul tile {self}: the kernel takes wm, wn multiples of 16 (wm at \
                 most 64, wn at most 128) dividing bm, bn, at most 16 subgroups, slabs of 32 or 64 \
                 of K, and whole vec4 loads of each slab per invocation (e.g. {}, {})",
                Self::T128X128,
                Self::T64X64
            )));
        }
        let threads = self.threads();
        let bytes = self.workgroup_storage_bytes();
        let device_ok = threads <= limits.max_compute_invocations_per_workgroup
            && threads <= limits.max_compute_workgroup_size_x
            && bytes <= limits.max_compute_workgroup_storage_size;
        if !device_ok {
            return Err(ComputeError::Config(format!(
                "cooperative matmul tile {self} needs {threads} invocations and {bytes} bytes of \
                 workgroup memory; the device allows {} invocations and {} bytes",
                limits.max_compute_invocations_per_workgroup,
                limits.max_compute_workgroup_storage_size
            )));
        }
        Ok(())
    }
}

/// A diagnostic variant of the cooperative matmul that leaves part of its loop over K out, to
/// time the rest ([`MatmulOptions::cooperative_probe`](crate::compute::MatmulOptions::cooperative_probe)):
/// **its results are not the product**. Each leaves out one more layer than the one before, so
/// that the differences between their times and the whole kernel's say where the time goes
/// (`bench_kernels --coop-probe NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoopProbe {
    /// The operands are read from storage once (the first slab); every slab after it is staged
    /// from those registers again: the staging, its barriers, the fragment loads and the
    /// products without the loads from storage.
    NoGlobalLoads,
    /// The first slab is staged once; the loop keeps its two barriers, loads the fragments
    /// from workgroup memory and multiplies: no loads from storage, no staging.
    NoStaging,
    /// The fragments of the first slab are loaded once before the loop, which only multiplies:
    /// the products alone, with this tile's accumulators.
    ProductsOnly,
}

impl CoopProbe {
    /// The probes, each leaving out more than the one before.
    pub const ALL: [Self; 3] = [Self::NoGlobalLoads, Self::NoStaging, Self::ProductsOnly];

    /// The probe's name on a command line: `no-global-loads`, `no-staging`, `products-only`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoGlobalLoads => "no-global-loads",
            Self::NoStaging => "no-staging",
            Self::ProductsOnly => "products-only",
        }
    }

    /// The probe of that [`Self::name`]; `None` for another text.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|probe| probe.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_tiles_are_valid_and_their_sizes_are_as_documented() {
        let unlimited = wgpu::Limits {
            max_compute_workgroup_storage_size: 49_152,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            ..wgpu::Limits::default()
        };
        for tile in CoopTiles::ALL {
            tile.check(&unlimited).unwrap();
            assert_eq!(CoopTiles::named(&tile.name()), Some(tile));
        }
        assert_eq!(CoopTiles::T128X128.workgroup_storage_bytes(), 23_040);
        assert_eq!(CoopTiles::T128X256.workgroup_storage_bytes(), 43_520);
        assert_eq!(CoopTiles::T64X128.workgroup_storage_bytes(), 22_016);
        assert_eq!(CoopTiles::T64X64.workgroup_storage_bytes(), 13_824);
        assert_eq!(CoopTiles::T32X128.workgroup_storage_bytes(), 15_360);
        assert_eq!(CoopTiles::T128X128.threads(), 128);
        assert_eq!(CoopTiles::T128X256.threads(), 512);
        assert_eq!(CoopTiles::T64X128.threads(), 256);
        assert_eq!(
            (CoopTiles::T128X128.a_loads(), CoopTiles::T128X128.b_loads()),
            (8, 8)
        );
        // WebGPU's defaults take the small tiles only.
        let defaults = wgpu::Limits::default();
        assert!(CoopTiles::T64X64.check(&defaults).is_ok());
        assert!(CoopTiles::T32X128.check(&defaults).is_ok());
        assert!(CoopTiles::T128X128.check(&defaults).is_err());
        assert!(CoopTiles::new(128, 128, 24, 64).check(&unlimited).is_err());
        assert!(CoopTiles::new(128, 128, 0, 64).check(&unlimited).is_err());
        assert_eq!(CoopTiles::named("7x7"), None);
        assert_eq!(CoopTiles::named("128x256/64"), None);
        assert_eq!(CoopTiles::named("128x256/64xq"), None);
        // Any other tile by its block and subgroup shares, named back the same way.
        let eight = CoopTiles::new(128, 256, 64, 64);
        assert_eq!(CoopTiles::named("128x256/64x64"), Some(eight));
        assert_eq!(eight.name(), "128x256/64x64");
        assert_eq!(eight.to_string(), "coop 128x256/64x64");
        assert_eq!(eight.threads(), 256);
        assert!(eight.check(&unlimited).is_ok());
        assert_eq!(CoopTiles::named("128x256/64x32"), Some(CoopTiles::T128X256));
        // Every tile the kernel takes is named back to itself.
        let mut named = 0;
        for (bm, bn) in (16..=256)
            .step_by(16)
            .flat_map(|m| (16..=256).step_by(16).map(move |n| (m, n)))
        {
            for (wm, wn) in [16, 32, 48, 64]
                .into_iter()
                .flat_map(|m| (16..=128).step_by(16).map(move |n| (m, n)))
            {
                for bk in CoopTiles::DEPTHS {
                    let tile = CoopTiles::new(bm, bn, wm, wn).with_bk(bk);
                    if tile.check(&unlimited).is_ok() {
                        assert_eq!(CoopTiles::named(&tile.name()), Some(tile), "{tile}");
                        named += 1;
                    }
                }
            }
        }
        assert!(named > 100, "{named}");
        // Absurd tiles from a command line are refused by the check, never a panic.
        for name in [
            "0x0/0x0",
            "4294967295x4294967295/1x1",
            "16x16/32x32",
            "128x128x0/16x16",
        ] {
            let tile = CoopTiles::named(name).unwrap();
            assert!(tile.check(&unlimited).is_err(), "{name}");
            let _ = (
                tile.threads(),
                tile.a_loads(),
                tile.b_loads(),
                tile.to_string(),
            );
            let _ = tile.workgroup_storage_bytes();
        }
        for probe in CoopProbe::ALL {
            assert_eq!(CoopProbe::named(probe.name()), Some(probe));
        }
        assert_eq!(CoopProbe::named("full"), None);
        let deep = CoopTiles::named("64x64x64/32x32").unwrap();
        assert_eq!(deep, CoopTiles::T64X64.with_bk(64));
        assert_eq!(deep.name(), "64x64x64/32x32");
        assert_eq!(CoopTiles::named("128x128/64x64"), Some(CoopTiles::T128X128));
        assert_eq!(CoopTiles::T128X128.to_string(), "coop 128x128/64x64");
        // The deep slabs: names, sizes and loads.
        assert_eq!(CoopTiles::named("128x128x64"), Some(CoopTiles::T128X128X64));
        assert_eq!(
            CoopTiles::named("128x128x64w"),
            Some(CoopTiles::T128X128X64W)
        );
        assert_eq!(CoopTiles::T64X128X64.to_string(), "coop 64x128x64/32x64");
        assert_eq!(CoopTiles::T128X128X64.workgroup_storage_bytes(), 39_936);
        assert_eq!(CoopTiles::T128X128X64W.workgroup_storage_bytes(), 44_032);
        assert_eq!(CoopTiles::T64X128X64.workgroup_storage_bytes(), 30_720);
        assert_eq!(
            (
                CoopTiles::T128X128X64.a_loads(),
                CoopTiles::T128X128X64.b_loads()
            ),
            (16, 16)
        );
        assert_eq!(
            (
                CoopTiles::T64X128X64.a_loads(),
                CoopTiles::T64X128X64.b_loads()
            ),
            (8, 16)
        );
        // Slabs of another depth are refused.
        assert!(CoopTiles::T128X128.with_bk(48).check(&unlimited).is_err());
        assert!(CoopTiles::T128X128.with_bk(16).check(&unlimited).is_err());
    }
}
