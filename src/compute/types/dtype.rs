//! What tensors store and kernels load: [`DType`], [`ElementTypes`], the bytes a tensor takes
//! ([`tensor_bytes`]) and the host's conversions of elements ([`encode_elements`],
//! [`decode_elements`]).

use std::fmt;

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
    /// device with [`wgpu::Features::SHADER_F16`]
    /// ([`ComputeError::ShaderF16Unavailable`](crate::compute::ComputeError::ShaderF16Unavailable)
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
pub(crate) fn encode_elements(data: &[f32], dtype: DType) -> Encoded<'_> {
    match dtype {
        DType::F32 => Encoded::Borrowed(bytemuck::cast_slice(data)),
        DType::F16 => {
            use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
            let mut halves = vec![0u16; data.len().next_multiple_of(2)];
            halves[..data.len()]
                .reinterpret_cast_mut::<half::f16>()
                .convert_from_f32_slice(data);
            Encoded::Halves(halves)
        }
    }
}

/// Elements encoded for an upload ([`encode_elements`]), read as bytes: f32 data as it is, f16
/// rounded into a buffer of their own (no second copy into bytes).
pub(crate) enum Encoded<'a> {
    Borrowed(&'a [u8]),
    Halves(Vec<u16>),
}

impl std::ops::Deref for Encoded<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Borrowed(bytes) => bytes,
            Self::Halves(halves) => bytemuck::cast_slice(halves),
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
            // Straight from the bytes where they are aligned (a mapped buffer is), else through
            // a copy.
            let bits: std::borrow::Cow<'_, [u16]> = match bytemuck::try_cast_slice(bytes) {
                Ok(bits) => bits.into(),
                Err(_) => crate::pool::to_elements::<u16>(bytes, len).into(),
            };
            let mut values = vec![0.0f32; len];
            bits.reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(&mut values);
            values
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The same from bytes one off a u16's alignment (decoded through a copy).
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        assert_eq!(
            decode_elements(&shifted[1..], data.len(), DType::F16),
            expected
        );
        let f32_bytes = encode_elements(&data, DType::F32);
        assert_eq!(decode_elements(&f32_bytes, data.len(), DType::F32), data);
    }
}
