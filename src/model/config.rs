//! [`Gpt2Config`]: the five numbers that fix GPT-2's shapes, validated, and their place in a
//! safetensors file's `__metadata__` (as strings, as Hugging Face's `config.json` names them).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, ConfigSource, WeightsError};

/// The keys of the configuration in a file's `__metadata__`, in the order of [`Gpt2Config`]'s
/// fields: the names of Hugging Face's `GPT2Config` (`config.json`).
pub const METADATA_KEYS: [&str; 5] = ["n_layer", "n_embd", "n_head", "n_ctx", "vocab_size"];

/// The shape of a GPT-2 model: layers, width, heads, context length and vocabulary, as Hugging
/// Face's `GPT2Config` names them (`n_positions` there is `n_ctx` here, as in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Gpt2Config {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream (the embedding size).
    pub n_embd: usize,
    /// Attention heads per block; `n_embd` is a multiple of it.
    pub n_head: usize,
    /// Longest sequence (positions in `wpe`).
    pub n_ctx: usize,
    /// Tokens in the vocabulary (rows of `wte`).
    pub vocab_size: usize,
}

impl Gpt2Config {
    /// GPT-2 small, Hugging Face's `gpt2`: 12 layers, 768 wide, 12 heads, context 1,024,
    /// 50,257 tokens (124,439,808 parameters).
    pub const fn gpt2_small() -> Self {
        Self {
            n_layer: 12,
            n_embd: 768,
            n_head: 12,
            n_ctx: 1024,
            vocab_size: 50257,
        }
    }

    /// A model small enough for tests on a software GPU: 2 layers, 64 wide, 4 heads of 16,
    /// context 128, 256 tokens.
    pub const fn tiny() -> Self {
        Self {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_ctx: 128,
            vocab_size: 256,
        }
    }

    /// The configuration checked: no dimension zero, `n_embd` a multiple of `n_head`, and the
    /// parameter count (in bytes of f32) within `usize`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in METADATA_KEYS.iter().zip(self.values()) {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ConfigError::HeadsDoNotDivideWidth {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        self.checked_parameter_count()
            .and_then(|n| n.checked_mul(4))
            .map(|_| ())
            .ok_or(ConfigError::TooLarge {
                n_layer: self.n_layer,
                n_embd: self.n_embd,
                n_ctx: self.n_ctx,
                vocab_size: self.vocab_size,
            })
    }

    /// The width of one head, `n_embd / n_head`.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// The number of parameters in the file's layout (the tied `lm_head` not counted again);
    /// saturates at `usize::MAX` for a configuration [`validate`](Self::validate) refuses.
    pub fn parameter_count(&self) -> usize {
        self.checked_parameter_count().unwrap_or(usize::MAX)
    }

    fn checked_parameter_count(&self) -> Option<usize> {
        let e = self.n_embd;
        let embeddings = self
            .vocab_size
            .checked_add(self.n_ctx)?
            .checked_mul(e)?
            .checked_add(e.checked_mul(2)?)?;
        // Per block: two layer norms (4e), c_attn (3e² + 3e), attn c_proj (e² + e), c_fc
        // (4e² + 4e), mlp c_proj (4e² + e): 12e² + 13e.
        let block = e
            .checked_mul(e)?
            .checked_mul(12)?
            .checked_add(e.checked_mul(13)?)?;
        embeddings.checked_add(block.checked_mul(self.n_layer)?)
    }

    fn values(&self) -> [usize; 5] {
        [
            self.n_layer,
            self.n_embd,
            self.n_head,
            self.n_ctx,
            self.vocab_size,
        ]
    }

    /// The configuration as a file's `__metadata__` entries (decimal strings), with `format`
    /// = `pt` as PyTorch's `save_file` writes it (Hugging Face's loaders check it).
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut metadata: HashMap<String, String> = METADATA_KEYS
            .iter()
            .zip(self.values())
            .map(|(key, value)| ((*key).to_owned(), value.to_string()))
            .collect();
        metadata.insert("format".to_owned(), "pt".to_owned());
        metadata
    }

    /// The configuration read from a file's `__metadata__`, each key taken from the file when
    /// there and from `given` otherwise; validated. The flag says whether every value came from
    /// the file.
    ///
    /// A value that is not a whole number is [`WeightsError::BadMetadata`]; a key in neither
    /// place [`WeightsError::MissingMetadata`]; a key in both that differs
    /// [`WeightsError::ConfigMismatch`].
    pub fn from_metadata(
        metadata: Option<&HashMap<String, String>>,
        given: Option<&Gpt2Config>,
    ) -> Result<(Gpt2Config, bool), WeightsError> {
        let stated = [
            (ConfigSource::Metadata, metadata_values(metadata)?),
            (ConfigSource::Caller, caller_values(given)),
        ];
        let (config, sources) = resolve(&stated)?;
        let all_from_file = sources.iter().all(|s| s.contains(&ConfigSource::Metadata));
        Ok((config, all_from_file))
    }
}

/// The fields one source states, in the order of [`METADATA_KEYS`].
pub(crate) type Stated = [Option<usize>; 5];

/// The fields a file's `__metadata__` states (each a decimal string), or
/// [`WeightsError::BadMetadata`].
pub(crate) fn metadata_values(
    metadata: Option<&HashMap<String, String>>,
) -> Result<Stated, WeightsError> {
    let mut values = [None; 5];
    for (value, key) in values.iter_mut().zip(METADATA_KEYS) {
        if let Some(text) = metadata.and_then(|m| m.get(key)) {
            *value = Some(
                text.trim()
                    .parse::<usize>()
                    .map_err(|_| WeightsError::BadMetadata {
                        key,
                        value: text.clone(),
                    })?,
            );
        }
    }
    Ok(values)
}

/// The fields of the caller's configuration (all, or none).
pub(crate) fn caller_values(given: Option<&Gpt2Config>) -> Stated {
    given.map_or([None; 5], |g| g.values().map(Some))
}

/// The configuration that `sources` state, validated, with the sources that stated each field
/// (in the order of [`METADATA_KEYS`]). Every source that states a field must agree
/// ([`WeightsError::ConfigMismatch`], naming the first two that differ); a field no source
/// states is [`WeightsError::MissingMetadata`].
pub(crate) fn resolve(
    sources: &[(ConfigSource, Stated)],
) -> Result<(Gpt2Config, [Vec<ConfigSource>; 5]), WeightsError> {
    let mut values = [0usize; 5];
    let mut stated_by: [Vec<ConfigSource>; 5] = Default::default();
    for (i, key) in METADATA_KEYS.into_iter().enumerate() {
        let mut first: Option<(ConfigSource, usize)> = None;
        for &(source, stated) in sources {
            let Some(value) = stated[i] else { continue };
            match first {
                Some((first, first_value)) if first_value != value => {
                    return Err(WeightsError::ConfigMismatch {
                        key,
                        first,
                        first_value,
                        second: source,
                        second_value: value,
                    })
                }
                Some(_) => {}
                None => first = Some((source, value)),
            }
            stated_by[i].push(source);
        }
        values[i] = first
            .map(|(_, value)| value)
            .ok_or(WeightsError::MissingMetadata { key })?;
    }
    let [n_layer, n_embd, n_head, n_ctx, vocab_size] = values;
    let config = Gpt2Config {
        n_layer,
        n_embd,
        n_head,
        n_ctx,
        vocab_size,
    };
    config.validate()?;
    Ok((config, stated_by))
}
