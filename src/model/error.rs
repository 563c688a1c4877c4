//! The typed errors of the model layer: a configuration refused, a weights file refused (naming
//! the tensor where one is at fault), a file that cannot be read or written.

use std::path::PathBuf;

/// A source of a [`Gpt2Config`](super::Gpt2Config) when weights are read: every source that
/// states a field must agree ([`WeightsError::ConfigMismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigSource {
    /// The safetensors file's `__metadata__` (as [`Gpt2Config::to_metadata`](super::Gpt2Config::to_metadata) writes it).
    Metadata,
    /// Hugging Face's `config.json` (beside the file, or given as text).
    ConfigJson,
    /// The configuration the caller passed.
    Caller,
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Metadata => "the file's __metadata__",
            Self::ConfigJson => "config.json",
            Self::Caller => "the configuration given",
        })
    }
}

/// Why a [`Gpt2Config`](super::Gpt2Config) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A dimension is zero.
    #[error("GPT-2 configuration: `{field}` is zero")]
    Zero {
        /// The field (`n_layer`, `n_embd`, `n_head`, `n_ctx` or `vocab_size`).
        field: &'static str,
    },
    /// The width does not split evenly into heads.
    #[error("GPT-2 configuration: n_embd {n_embd} is not divisible by n_head {n_head}")]
    HeadsDoNotDivideWidth {
        /// The width.
        n_embd: usize,
        /// The number of heads.
        n_head: usize,
    },
    /// The model's parameter count (or its size in bytes) does not fit in `usize`.
    #[error("GPT-2 configuration: the parameter count overflows (n_layer {n_layer}, n_embd {n_embd}, n_ctx {n_ctx}, vocab_size {vocab_size})")]
    TooLarge {
        /// Layers.
        n_layer: usize,
        /// Width.
        n_embd: usize,
        /// Context length.
        n_ctx: usize,
        /// Vocabulary size.
        vocab_size: usize,
    },
}

/// Why GPT-2 weights could not be read, checked or written. Every refusal of a file's content
/// that one tensor is at fault for names it, as written in the file (prefix included).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The file could not be opened, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The bytes are not a safetensors file: the header's length or its JSON cannot be read.
    #[error("not a safetensors file: {reason}")]
    NotSafetensors {
        /// What is wrong, as the safetensors crate or the header check says it.
        reason: String,
    },
    /// The file is shorter than its header says: cut off while written or copied.
    #[error("truncated safetensors file{}: {found_bytes} bytes, the header needs {expected_bytes}", tensor.as_ref().map(|t| format!(" (tensor `{t}` runs past the end)")).unwrap_or_default())]
    Truncated {
        /// The first tensor (in file order) whose data runs past the end; `None` when the
        /// header itself is cut.
        tensor: Option<String>,
        /// The bytes the header asks for (at least, when the header itself is cut).
        expected_bytes: u64,
        /// The bytes there are.
        found_bytes: u64,
    },
    /// The header is readable but inconsistent: offsets that overlap, leave gaps, do not match a
    /// tensor's shape and type, or bytes after the last tensor.
    #[error("corrupt safetensors file{}: {reason}", tensor.as_ref().map(|t| format!(" (tensor `{t}`)")).unwrap_or_default())]
    Corrupt {
        /// The tensor at fault, when the format's check names one.
        tensor: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// A configuration value is stated by no source: not the file's `__metadata__`, not a
    /// `config.json`, not the caller's configuration.
    #[error("no source states `{key}`: not the file's __metadata__, no config.json, no configuration given")]
    MissingMetadata {
        /// The key (`n_layer`, `n_embd`, `n_head`, `n_ctx` or `vocab_size`).
        key: &'static str,
    },
    /// A configuration value in the file's `__metadata__` is not a whole number.
    #[error("the file's __metadata__ has `{key}` = {value:?}, not a whole number")]
    BadMetadata {
        /// The key.
        key: &'static str,
        /// The value found.
        value: String,
    },
    /// Two sources of the configuration (the file's `__metadata__`, a `config.json`, the
    /// caller's configuration) state one field differently.
    #[error("`{key}`: {first} says {first_value}, {second} says {second_value}")]
    ConfigMismatch {
        /// The field (`n_layer`, `n_embd`, `n_head`, `n_ctx` or `vocab_size`).
        key: &'static str,
        /// One source.
        first: ConfigSource,
        /// Its value.
        first_value: usize,
        /// The other source.
        second: ConfigSource,
        /// Its value.
        second_value: usize,
    },
    /// A `config.json` that cannot be read: not UTF-8, not JSON, not an object, or a key of
    /// the wrong type (a number that is negative, fractional or too large among them).
    #[error("config.json{}: {reason}", key.as_ref().map(|k| format!(" `{k}`")).unwrap_or_default())]
    BadConfigJson {
        /// The key at fault, when one is.
        key: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// A `config.json` describes a model the kernels do not compute (another architecture,
    /// activation, layer-norm epsilon, attention scaling or MLP width).
    #[error("config.json has `{key}` = {value}; the kernels compute only {supported}")]
    UnsupportedConfig {
        /// The key.
        key: &'static str,
        /// Its value, as JSON.
        value: String,
        /// What is computed.
        supported: &'static str,
    },
    /// The file's blocks `h.{i}` (numbered up to `file_blocks - 1`) are not the configuration's
    /// `n_layer`.
    #[error("the file's blocks run to h.{} ({file_blocks} blocks), the configuration has n_layer = {n_layer}", file_blocks.saturating_sub(1))]
    LayerCount {
        /// One more than the highest block index in the file (0 for none).
        file_blocks: usize,
        /// The configuration's layers.
        n_layer: usize,
    },
    /// A tensor outside GPT-2's layout, the untied `lm_head.weight` and the causal-mask buffers
    /// (`h.{i}.attn.bias`, `h.{i}.attn.masked_bias`): a model that would use it is not GPT-2 as
    /// served here (a classification head, an adapter, another architecture).
    #[error("tensor `{tensor}` is not part of GPT-2's layout")]
    UnexpectedTensor {
        /// Its name, as in the file.
        tensor: String,
    },
    /// `config.json` says `tie_word_embeddings: true` but the file's `lm_head.weight` differs
    /// from `wte.weight`.
    #[error("config.json ties the output projection to `wte.weight`, but the file's `{tensor}` differs from it")]
    TiedHeadDiffers {
        /// The head's name in the file.
        tensor: String,
    },
    /// A tensor of the GPT-2 layout is not in the file.
    #[error("tensor `{tensor}` is missing")]
    MissingTensor {
        /// Its name, as it should appear in the file.
        tensor: String,
    },
    /// A tensor of the layout is in the file only under the other prefix: the file's names mix
    /// `transformer.` and none.
    #[error("tensor `{tensor}` is missing; the file has `{found}` (its names mix the `transformer.` prefix and none)")]
    MixedPrefix {
        /// Its name, with the prefix the file's other names carry.
        tensor: String,
        /// The name the file has.
        found: String,
    },
    /// A tensor's shape is not the layout's for the configuration.
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// Its name.
        tensor: String,
        /// The layout's shape.
        expected: Vec<usize>,
        /// The file's.
        found: Vec<usize>,
    },
    /// A tensor is stored in a type other than F32, F16 or BF16.
    #[error("tensor `{tensor}` is stored as {found}; F32, F16 and BF16 are accepted")]
    Dtype {
        /// Its name.
        tensor: String,
        /// The type found, as safetensors names it.
        found: String,
    },
    /// Weights held in memory have another number of blocks than the configuration's layers.
    #[error("{found} blocks of weights for a configuration of {expected} layers")]
    Layers {
        /// The configuration's `n_layer`.
        expected: usize,
        /// The blocks held.
        found: usize,
    },
    /// The tokens cannot be run through the model (the CPU twin's refusal).
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// A tensor held in memory has another number of elements than its shape (on writing, on
    /// upload, or before the CPU twin runs).
    #[error("tensor `{tensor}` holds {found} values, its shape {shape:?} needs {expected}")]
    Length {
        /// Its name.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The values the shape needs.
        expected: usize,
        /// The values held.
        found: usize,
    },
    /// Host memory for a tensor could not be reserved.
    #[error("tensor `{tensor}`: cannot reserve {bytes} bytes of host memory")]
    HostMemory {
        /// Its name.
        tensor: String,
        /// The bytes asked for.
        bytes: usize,
    },
}

/// Why token ids cannot be run through a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// No tokens.
    #[error("no tokens")]
    Empty,
    /// More tokens than the model has positions.
    #[error("{tokens} tokens; the model's context holds {n_ctx}")]
    TooLong {
        /// Tokens given.
        tokens: usize,
        /// The model's context.
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} at index {index} is outside the vocabulary of {vocab_size}")]
    OutOfVocabulary {
        /// The id.
        token: u32,
        /// Where it is.
        index: usize,
        /// The vocabulary's size.
        vocab_size: usize,
    },
}
