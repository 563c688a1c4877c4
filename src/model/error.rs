//! The typed errors of the model layer: a configuration refused, a weights file refused (naming
//! the tensor where one is at fault), a file that cannot be read or written.

use std::path::PathBuf;

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
    /// A configuration value is neither in the file's `__metadata__` nor given by the caller.
    #[error("the file's __metadata__ has no `{key}` and no configuration was given")]
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
    /// The file's `__metadata__` and the caller's configuration disagree.
    #[error(
        "the file's __metadata__ has `{key}` = {in_file}, the configuration given has {given}"
    )]
    ConfigMismatch {
        /// The key.
        key: &'static str,
        /// The file's value.
        in_file: usize,
        /// The caller's value.
        given: usize,
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
