//! Reading GPT-2 weights from a safetensors file in Hugging Face's layout, or from a folder as
//! `save_pretrained` writes it (`model.safetensors` and `config.json`): the header checked by the
//! safetensors crate, the configuration from every source that states it (the file's
//! `__metadata__`, `config.json`, the caller), as many blocks as layers, every tensor of the
//! layout found, its shape and type checked, its values widened to f32, an untied `lm_head`
//! kept, and nothing else in the file but the causal-mask buffers.

use std::collections::BTreeSet;

use safetensors::{Dtype, SafeTensorError, SafeTensors};

use super::config::{caller_values, metadata_values, resolve, Gpt2Config, METADATA_KEYS};
use super::config_json;
use super::error::{ConfigSource, WeightsError};
use super::layout::{gpt2_layout, lm_head_spec, LM_HEAD};
use super::weights::Gpt2Weights;

/// The prefix some exports (`GPT2LMHeadModel`'s state dict) put before every name.
pub const TRANSFORMER_PREFIX: &str = "transformer.";

/// The weights file in a folder as `save_pretrained` writes it.
pub const MODEL_FILE: &str = "model.safetensors";

/// The configuration file beside it.
pub const CONFIG_JSON: &str = "config.json";

/// Weights read from a file, with what the reading found beside them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedWeights {
    /// The weights, in f32 (with the file's `lm_head.weight` as
    /// [`Gpt2Weights::untied_lm_head`] when it differs from `wte.weight`).
    pub weights: Gpt2Weights,
    /// Tensors of the file that a GPT-2 model does not use, ignored (sorted): only the causal-mask
    /// buffers `h.{i}.attn.bias` and `h.{i}.attn.masked_bias` (with the file's prefix), which
    /// Hugging Face's own `model.safetensors` for `gpt2` carries. Any other tensor outside the
    /// layout is refused ([`WeightsError::UnexpectedTensor`]).
    pub ignored: Vec<String>,
    /// The prefix the file's names carry: `""` or [`TRANSFORMER_PREFIX`].
    pub prefix: &'static str,
    /// True when the whole configuration came from the file's `__metadata__`, false when some
    /// of it came from elsewhere (see [`config_sources`](Self::config_sources)).
    pub config_from_file: bool,
    /// For each field of the configuration, in the order of [`METADATA_KEYS`], the sources that
    /// stated it (all agreeing; at least one).
    pub config_sources: [(&'static str, Vec<ConfigSource>); 5],
}

impl LoadedWeights {
    /// The sources that stated `field` (`n_layer`, `n_embd`, `n_head`, `n_ctx` or
    /// `vocab_size`); empty for another name.
    pub fn sources_of(&self, field: &str) -> &[ConfigSource] {
        self.config_sources
            .iter()
            .find(|(key, _)| *key == field)
            .map_or(&[], |(_, sources)| sources.as_slice())
    }
}

impl Gpt2Weights {
    /// Reads GPT-2 weights from `path`: a folder as Hugging Face's `save_pretrained` writes it
    /// (its [`MODEL_FILE`], `model.safetensors`), or a safetensors file. For a folder, or a
    /// file named `model.safetensors`, the [`CONFIG_JSON`] beside it is read for the
    /// configuration too (a file of another name is read alone, so that a stray `config.json`
    /// in a shared folder is never taken for its configuration); see
    /// [`from_bytes_with_config_json`](Self::from_bytes_with_config_json) for what is checked.
    /// The whole file is read into memory (no memory map: this layer denies unsafe code), so the
    /// peak is about the file's size plus the weights' in f32 (1 GB for GPT-2 small in f32).
    /// Native only: in a browser read the bytes yourself and call
    /// [`from_bytes_with_config_json`](Self::from_bytes_with_config_json).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        path: impl AsRef<std::path::Path>,
        config: Option<&Gpt2Config>,
    ) -> Result<LoadedWeights, WeightsError> {
        let path = path.as_ref();
        let file = if path.is_dir() {
            path.join(MODEL_FILE)
        } else {
            path.to_owned()
        };
        let io = |path: &std::path::Path| {
            let path = path.to_owned();
            move |source| WeightsError::Io { path, source }
        };
        let bytes = std::fs::read(&file).map_err(io(&file))?;
        let json_path = file
            .parent()
            .map_or_else(|| CONFIG_JSON.into(), |dir| dir.join(CONFIG_JSON));
        let beside = path.is_dir() || file.file_name().is_some_and(|name| name == MODEL_FILE);
        let read = if beside {
            std::fs::read(&json_path)
        } else {
            Err(std::io::ErrorKind::NotFound.into())
        };
        let json = match read {
            Ok(json) => Some(
                String::from_utf8(json).map_err(|e| WeightsError::BadConfigJson {
                    key: None,
                    reason: format!("not UTF-8: {e}"),
                })?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&json_path)(e)),
        };
        Self::from_bytes_with_config_json(&bytes, json.as_deref(), config)
    }

    /// Reads the bytes of a safetensors file in Hugging Face's GPT-2 layout, the configuration
    /// from the file's `__metadata__` and `config`
    /// (see [`from_bytes_with_config_json`](Self::from_bytes_with_config_json), without a
    /// `config.json`).
    pub fn from_bytes(
        bytes: &[u8],
        config: Option<&Gpt2Config>,
    ) -> Result<LoadedWeights, WeightsError> {
        Self::from_bytes_with_config_json(bytes, None, config)
    }

    /// Reads the bytes of a safetensors file in Hugging Face's GPT-2 layout ([`gpt2_layout`],
    /// names with or without the `transformer.` prefix), with the text of its `config.json` when
    /// there is one (a browser's way to [`load`](Self::load) a folder).
    ///
    /// The configuration's fields come from every source that states them: the file's
    /// `__metadata__` (`n_layer`, `n_embd`, `n_head`, `n_ctx`, `vocab_size`, as strings), the
    /// `config.json` (the same keys, `n_positions` and/or `n_ctx` for the context), and
    /// `config`; sources that state a field must agree ([`WeightsError::ConfigMismatch`]), and
    /// every field needs one ([`WeightsError::MissingMetadata`]). The `config.json` must describe
    /// the model the kernels compute (`model_type` `gpt2`, the tanh GELU, layer-norm epsilon
    /// 1e-5, ...: [`WeightsError::UnsupportedConfig`]). Tensors stored as F32, F16 or BF16 are
    /// widened to f32.
    ///
    /// The file's blocks `h.{i}` must number `n_layer` ([`WeightsError::LayerCount`]). A
    /// `lm_head.weight` `[vocab_size, n_embd]` that differs from `wte.weight` is kept as the
    /// untied output projection ([`Gpt2Weights::untied_lm_head`]); one equal to it bit for bit
    /// is the tied head. With `tie_word_embeddings: true` in `config.json` a head that differs is
    /// refused ([`WeightsError::TiedHeadDiffers`]); with `false`, a file without one
    /// ([`WeightsError::MissingTensor`]). The causal-mask buffers (`h.{i}.attn.bias`,
    /// `h.{i}.attn.masked_bias`) are ignored and listed in [`LoadedWeights::ignored`]; any other
    /// tensor is refused ([`WeightsError::UnexpectedTensor`]).
    ///
    /// Refused with a typed [`WeightsError`], naming the tensor at fault: not a safetensors file,
    /// truncated or corrupt, metadata or `config.json` missing, bad or disagreeing, a tensor
    /// missing, of the wrong shape or of another type, blocks beyond or short of `n_layer`, a
    /// tensor outside the layout.
    pub fn from_bytes_with_config_json(
        bytes: &[u8],
        config_json: Option<&str>,
        config: Option<&Gpt2Config>,
    ) -> Result<LoadedWeights, WeightsError> {
        let file = SafeTensors::deserialize(bytes).map_err(|e| format_error(bytes, e))?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| format_error(bytes, e))?;
        let hf = config_json.map(config_json::parse).transpose()?;
        let mut stated = vec![(
            ConfigSource::Metadata,
            metadata_values(header.metadata().as_ref())?,
        )];
        if let Some(hf) = &hf {
            stated.push((ConfigSource::ConfigJson, hf.values));
        }
        stated.push((ConfigSource::Caller, caller_values(config)));
        let (config, sources) = resolve(&stated)?;
        if let Some(hf) = &hf {
            hf.check_against(&config)?;
        }
        let config_from_file = sources.iter().all(|s| s.contains(&ConfigSource::Metadata));
        let names: BTreeSet<&str> = file.names().into_iter().collect();
        let prefix = if !names.contains("wte.weight")
            && names.iter().any(|n| n.starts_with(TRANSFORMER_PREFIX))
        {
            TRANSFORMER_PREFIX
        } else {
            ""
        };
        let file_blocks = names
            .iter()
            .filter_map(|name| block_index(name))
            .max()
            .map_or(0, |i| i.saturating_add(1));
        if file_blocks != config.n_layer {
            return Err(WeightsError::LayerCount {
                file_blocks,
                n_layer: config.n_layer,
            });
        }
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
        let mut weights = Gpt2Weights::from_layout_order(config, tensors);
        let tie = hf.as_ref().and_then(|hf| hf.tie_word_embeddings);
        match file.tensor(LM_HEAD) {
            Ok(view) => {
                let spec = lm_head_spec(&config);
                if view.shape() != spec.shape.as_slice() {
                    return Err(WeightsError::Shape {
                        tensor: LM_HEAD.to_owned(),
                        expected: spec.shape,
                        found: view.shape().to_vec(),
                    });
                }
                let head = widen(LM_HEAD, view.dtype(), view.data(), spec.len())?;
                let tied = head
                    .iter()
                    .zip(&weights.wte)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                if !tied {
                    if tie == Some(true) {
                        return Err(WeightsError::TiedHeadDiffers {
                            tensor: LM_HEAD.to_owned(),
                        });
                    }
                    weights.untied_lm_head = Some(head);
                }
                expected.insert(LM_HEAD.to_owned());
            }
            Err(_) if tie == Some(false) => {
                return Err(WeightsError::MissingTensor {
                    tensor: LM_HEAD.to_owned(),
                })
            }
            Err(_) => {}
        }
        let mut ignored = Vec::new();
        for name in names.into_iter().filter(|n| !expected.contains(*n)) {
            if !is_mask_buffer(name, prefix) {
                return Err(WeightsError::UnexpectedTensor {
                    tensor: name.to_owned(),
                });
            }
            ignored.push(name.to_owned());
        }
        Ok(LoadedWeights {
            weights,
            ignored,
            prefix,
            config_from_file,
            config_sources: {
                let mut sources = sources.into_iter();
                METADATA_KEYS.map(|key| (key, sources.next().unwrap_or_default()))
            },
        })
    }
}

/// `i` of a name `h.{i}.…`, with or without the `transformer.` prefix.
fn block_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix(TRANSFORMER_PREFIX).unwrap_or(name);
    let (index, _) = rest.strip_prefix("h.")?.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // An index past usize is a block past any configuration's layers.
    Some(index.parse().unwrap_or(usize::MAX))
}

/// Whether `name` is a causal-mask buffer of a block (`{prefix}h.{i}.attn.bias` or
/// `{prefix}h.{i}.attn.masked_bias`): tensors Hugging Face's GPT-2 registers, that the model
/// computes rather than reads. The block count was checked, so `i` is one of the model's.
fn is_mask_buffer(name: &str, prefix: &str) -> bool {
    let Some(rest) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("h."))
    else {
        return false;
    };
    let Some((index, buffer)) = rest.split_once('.') else {
        return false;
    };
    !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && matches!(buffer, "attn.bias" | "attn.masked_bias")
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
