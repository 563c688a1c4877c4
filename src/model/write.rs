//! Writing GPT-2 weights in Hugging Face's safetensors layout, and seeded random weights for
//! when no real checkpoint is at hand.

use std::borrow::Cow;

use safetensors::{Dtype, View};

use crate::rng::SplitMix64;

use super::config::Gpt2Config;
use super::error::WeightsError;
use super::layout::{gpt2_layout, Init, TensorSpec};
use super::weights::Gpt2Weights;

/// The type tensors are stored as in a written file (read back widened to f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoredDtype {
    /// 32-bit floats, exact.
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest.
    F16,
    /// bfloat16, rounded to nearest.
    Bf16,
}

/// One tensor to write: its type, shape and little-endian bytes.
struct Stored<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl View for Stored<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// `values` as little-endian bytes of `dtype` (borrowed where f32 needs no conversion).
fn encode(values: &[f32], dtype: StoredDtype) -> (Dtype, Cow<'_, [u8]>) {
    match dtype {
        StoredDtype::F32 if cfg!(target_endian = "little") => {
            (Dtype::F32, Cow::Borrowed(bytemuck::cast_slice(values)))
        }
        StoredDtype::F32 => (
            Dtype::F32,
            Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ),
        StoredDtype::F16 => (
            Dtype::F16,
            Cow::Owned(
                values
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
        ),
        StoredDtype::Bf16 => (
            Dtype::BF16,
            Cow::Owned(
                values
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
        ),
    }
}

/// A number drawn from the generator, normal-ish with mean 0 and standard deviation 1: the sum
/// of four uniform 16-bit pieces of one 64-bit draw, centred and scaled (Irwin–Hall with four
/// terms, within ±√12). Only additions and multiplications, so the same on every machine.
fn standard_normalish(rng: &mut SplitMix64) -> f64 {
    let bits = rng.next_u64();
    let sum: f64 = (0..4)
        .map(|i| (((bits >> (16 * i)) & 0xffff) as f64 + 0.5) / 65536.0)
        .sum();
    (sum - 2.0) * 3f64.sqrt()
}

impl Gpt2Weights {
    /// Seeded random weights for `config`, initialised as GPT-2 is ([`gpt2_layout`]'s
    /// [`Init`]: normal-ish with std 0.02, residual projections 0.02 / √(2·n_layer), biases
    /// zero, layer-norm gains one). The same seed gives the same weights on every machine:
    /// one SplitMix64 stream over the tensors in the layout's order, each value the sum of four
    /// uniform 16-bit pieces of one draw (bounded, so activations stay finite).
    pub fn random(config: &Gpt2Config, seed: u64) -> Result<Self, WeightsError> {
        config.validate()?;
        let mut rng = SplitMix64::new(seed);
        let mut tensors = Vec::new();
        for spec in gpt2_layout(config) {
            let len = spec.len();
            let mut values = Vec::new();
            values
                .try_reserve_exact(len)
                .map_err(|_| WeightsError::HostMemory {
                    tensor: spec.name.clone(),
                    bytes: len.saturating_mul(4),
                })?;
            match spec.init {
                Init::Normal { std } => values.extend(
                    (0..len).map(|_| (standard_normalish(&mut rng) * f64::from(std)) as f32),
                ),
                Init::Zeros => values.resize(len, 0.0),
                Init::Ones => values.resize(len, 1.0),
            }
            tensors.push(values);
        }
        Ok(Self::from_layout_order(*config, tensors))
    }

    /// The tensors, checked against the configuration ([`Gpt2Weights::check`]).
    fn checked_tensors(&self) -> Result<Vec<(TensorSpec, &[f32])>, WeightsError> {
        self.check()?;
        Ok(self.tensors())
    }

    fn stored(&self, dtype: StoredDtype) -> Result<Vec<(String, Stored<'_>)>, WeightsError> {
        Ok(self
            .checked_tensors()?
            .into_iter()
            .map(|(spec, values)| {
                let (dtype, data) = encode(values, dtype);
                (
                    spec.name,
                    Stored {
                        dtype,
                        shape: spec.shape,
                        data,
                    },
                )
            })
            .collect())
    }

    /// The weights as the bytes of a safetensors file in Hugging Face's layout (names without
    /// prefix, no `lm_head`), the configuration in its `__metadata__` (see
    /// [`Gpt2Config::to_metadata`]), tensors stored as `dtype`.
    pub fn to_bytes(&self, dtype: StoredDtype) -> Result<Vec<u8>, WeightsError> {
        safetensors::serialize(self.stored(dtype)?, Some(self.config.to_metadata())).map_err(|e| {
            WeightsError::Corrupt {
                tensor: None,
                reason: format!("serializing: {e}"),
            }
        })
    }

    /// Writes the weights to `path` as [`to_bytes`](Self::to_bytes) lays them out (through a
    /// temporary file beside it, renamed into place). Native only: in a browser use
    /// [`to_bytes`](Self::to_bytes).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn write(
        &self,
        path: impl AsRef<std::path::Path>,
        dtype: StoredDtype,
    ) -> Result<(), WeightsError> {
        let path = path.as_ref();
        safetensors::serialize_to_file(self.stored(dtype)?, Some(self.config.to_metadata()), path)
            .map_err(|e| match e {
                safetensors::SafeTensorError::IoError(source) => WeightsError::Io {
                    path: path.to_owned(),
                    source,
                },
                other => WeightsError::Corrupt {
                    tensor: None,
                    reason: format!("serializing: {other}"),
                },
            })
    }
}

/// Writes seeded random weights for `config` ([`Gpt2Weights::random`]) to `path` in Hugging
/// Face's GPT-2 safetensors layout, f32, with the configuration in `__metadata__`; the same seed
/// writes the same tensors (the order of the `__metadata__` keys in the header may vary: the
/// safetensors crate keeps them in a hash map). Native only.
#[cfg(not(target_arch = "wasm32"))]
pub fn write_random(
    path: impl AsRef<std::path::Path>,
    config: &Gpt2Config,
    seed: u64,
) -> Result<(), WeightsError> {
    Gpt2Weights::random(config, seed)?.write(path, StoredDtype::F32)
}
