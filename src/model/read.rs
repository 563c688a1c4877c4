//! Reading GPT-2 weights from a safetensors file in Hugging Face's layout: the header checked by
//! the safetensors crate, the configuration from `__metadata__` (or the caller), every tensor of
//! the layout found, its shape and type checked, and its values widened to f32.

use std::collections::BTreeSet;

use safetensors::{Dtype, SafeTensorError, SafeTensors};

use super::config::Gpt2Config;
use super::error::WeightsError;
use super::layout::gpt2_layout;
use super::weights::Gpt2Weights;

/// The prefix some exports (`GPT2LMHeadModel`'s state dict) put before every name.
pub const TRANSFORMER_PREFIX: &str = "transformer.";

/// Weights read from a file, with what the reading found beside them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedWeights {
    /// The weights, in f32.
    pub weights: Gpt2Weights,
    /// Tensors of the file that are not in the layout, ignored (sorted): e.g. `h.0.attn.bias`,
    /// the causal mask that Hugging Face's own `model.safetensors` for `gpt2` carries, or a
    /// `lm_head.weight` (GPT-2 ties it to `wte`; an untied one is not used).
    pub ignored: Vec<String>,
    /// The prefix the file's names carry: `""` or [`TRANSFORMER_PREFIX`].
    pub prefix: &'static str,
    /// True when the whole configuration came from the file's `__metadata__`, false when some
    /// of it came from the caller.
    pub config_from_file: bool,
}

impl Gpt2Weights {
    /// Reads a safetensors file in Hugging Face's GPT-2 layout (see [`from_bytes`](Self::from_bytes)).
    /// The whole file is read into memory (no memory map: this layer denies unsafe code), so the
    /// peak is about the file's size plus the weights' in f32 (1 GB for GPT-2 small in f32).
    /// Native only: in a browser read the bytes yourself and call [`from_bytes`](Self::from_bytes).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        path: impl AsRef<std::path::Path>,
        config: Option<&Gpt2Config>,
    ) -> Result<LoadedWeights, WeightsError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| WeightsError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes, config)
    }

    /// Reads the bytes of a safetensors file in Hugging Face's GPT-2 layout ([`gpt2_layout`],
    /// names with or without the `transformer.` prefix). The configuration is read from the
    /// file's `__metadata__` (`n_layer`, `n_embd`, `n_head`, `n_ctx`, `vocab_size`, as strings);
    /// `config` supplies what it lacks (Hugging Face's own files carry none) and must agree with
    /// what it has. Tensors stored as F32, F16 or BF16 are widened to f32.
    ///
    /// Refused with a typed [`WeightsError`], naming the tensor at fault: not a safetensors file,
    /// truncated or corrupt, metadata missing or bad, a tensor missing, of the wrong shape or of
    /// another type. Tensors outside the layout are ignored and listed in
    /// [`LoadedWeights::ignored`].
    pub fn from_bytes(
        bytes: &[u8],
        config: Option<&Gpt2Config>,
    ) -> Result<LoadedWeights, WeightsError> {
        let file = SafeTensors::deserialize(bytes).map_err(|e| format_error(bytes, e))?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| format_error(bytes, e))?;
        let (config, config_from_file) =
            Gpt2Config::from_metadata(header.metadata().as_ref(), config)?;
        let names: BTreeSet<&str> = file.names().into_iter().collect();
        let prefix = if !names.contains("wte.weight")
            && names.iter().any(|n| n.starts_with(TRANSFORMER_PREFIX))
        {
            TRANSFORMER_PREFIX
        } else {
            ""
        };
        let layout = gpt2_layout(&config);
        let mut tensors = Vec::with_capacity(layout.len());
        let mut expected = BTreeSet::new();
        for spec in &layout {
            let name = format!("{prefix}{}", spec.name);
            let view = file.tensor(&name).map_err(|_| {
                let other = if prefix.is_empty() {
                    format!("{TRANSFORMER_PREFIX}{}", spec.name)
                } else {
                    spec.name.clone()
                };
                if names.contains(other.as_str()) {
                    WeightsError::MixedPrefix {
                        tensor: name.clone(),
                        found: other,
                    }
                } else {
                    WeightsError::MissingTensor {
                        tensor: name.clone(),
                    }
                }
            })?;
            if view.shape() != spec.shape.as_slice() {
                return Err(WeightsError::Shape {
                    tensor: name,
                    expected: spec.shape.clone(),
                    found: view.shape().to_vec(),
                });
            }
            tensors.push(widen(&name, view.dtype(), view.data(), spec.len())?);
            expected.insert(name);
        }
        let ignored = names
            .into_iter()
            .filter(|n| !expected.contains(*n))
            .map(str::to_owned)
            .collect();
        Ok(LoadedWeights {
            weights: Gpt2Weights::from_layout_order(config, tensors),
            ignored,
            prefix,
            config_from_file,
        })
    }
}

/// A tensor's little-endian bytes widened to f32 (`len` values; the safetensors crate has checked
/// that the bytes hold exactly the shape's values of the type).
fn widen(name: &str, dtype: Dtype, data: &[u8], len: usize) -> Result<Vec<f32>, WeightsError> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| WeightsError::HostMemory {
            tensor: name.to_owned(),
            bytes: len.saturating_mul(4),
        })?;
    match dtype {
        Dtype::F32 => values.extend(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        Dtype::F16 => values.extend(
            data.chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        Dtype::BF16 => values.extend(
            data.chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        other => {
            return Err(WeightsError::Dtype {
                tensor: name.to_owned(),
                found: other.to_string(),
            })
        }
    }
    Ok(values)
}

/// The safetensors crate's refusal as a [`WeightsError`]; for a file shorter than its header
/// says, the first tensor whose data runs past the end is named.
fn format_error(bytes: &[u8], error: SafeTensorError) -> WeightsError {
    match error {
        SafeTensorError::MetadataIncompleteBuffer => incomplete(bytes),
        SafeTensorError::InvalidHeaderLength => match header_length(bytes) {
            Some(n) if n > (bytes.len() as u64).saturating_sub(8) => WeightsError::Truncated {
                tensor: None,
                expected_bytes: n.saturating_add(8),
                found_bytes: bytes.len() as u64,
            },
            _ => WeightsError::NotSafetensors {
                reason: error.to_string(),
            },
        },
        SafeTensorError::InvalidOffset(tensor) => WeightsError::Corrupt {
            reason: "its data offsets leave a gap after the tensor before it, overlap it, or are inverted"
                .to_owned(),
            tensor: Some(tensor),
        },
        SafeTensorError::TensorInvalidInfo
        | SafeTensorError::ValidationOverflow
        | SafeTensorError::InvalidTensorView(..)
        | SafeTensorError::MisalignedSlice => WeightsError::Corrupt {
            tensor: None,
            reason: error.to_string(),
        },
        _ => WeightsError::NotSafetensors {
            reason: error.to_string(),
        },
    }
}

/// The header's length (the first 8 bytes, little endian), if the bytes have them.
fn header_length(bytes: &[u8]) -> Option<u64> {
    let first: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(first))
}

/// The error for a file whose size is not what its (valid) header says: truncated, naming the
/// first tensor (by offset) that runs past the end, or with bytes after the last tensor.
fn incomplete(bytes: &[u8]) -> WeightsError {
    let found_bytes = bytes.len() as u64;
    // The header parsed and validated already (the crate checks its size before this error).
    let start = header_length(bytes).unwrap_or(0).saturating_add(8);
    let header = usize::try_from(start)
        .ok()
        .and_then(|end| bytes.get(8..end))
        .and_then(|h| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(h).ok())
        .unwrap_or_default();
    let mut ends: Vec<(u64, &str)> = header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(name, info)| {
            let end = info.get("data_offsets")?.get(1)?.as_u64()?;
            Some((end, name.as_str()))
        })
        .collect();
    ends.sort_unstable();
    let expected_bytes = ends
        .last()
        .map_or(start, |(end, _)| start.saturating_add(*end));
    if expected_bytes < found_bytes {
        return WeightsError::Corrupt {
            tensor: None,
            reason: format!(
                "{} bytes after the last tensor (the header accounts for {expected_bytes} of {found_bytes})",
                found_bytes - expected_bytes
            ),
        };
    }
    let tensor = ends
        .iter()
        .find(|(end, _)| start.saturating_add(*end) > found_bytes)
        .map(|(_, name)| (*name).to_owned());
    WeightsError::Truncated {
        tensor,
        expected_bytes,
        found_bytes,
    }
}
