//! Hugging Face's `config.json` for GPT-2 (what `save_pretrained` writes beside
//! `model.safetensors`): the shape it states, and the keys that would make another model than the
//! one the kernels compute, checked. Keys this crate has no use for (`architectures`,
//! `bos_token_id`, dropout rates, `task_specific_params`, ...) are left alone.

use serde_json::{Map, Value};

use super::config::{Gpt2Config, Stated};
use super::error::WeightsError;
use super::reference::LAYER_NORM_EPS;

/// What a `config.json` says that loading uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HfConfig {
    /// The shape's fields it states (`n_positions` and `n_ctx` both state `n_ctx`).
    pub values: Stated,
    /// `tie_word_embeddings`, when stated.
    pub tie_word_embeddings: Option<bool>,
    /// `n_inner`, when stated and not `null` (the MLP's width; `null` is `4 · n_embd`).
    pub n_inner: Option<usize>,
}

/// The keys of the shape in `config.json`, with the field of [`Gpt2Config`] each states (its
/// index in [`METADATA_KEYS`](super::METADATA_KEYS)).
const SHAPE_KEYS: [(&str, usize); 6] = [
    ("n_layer", 0),
    ("n_embd", 1),
    ("n_head", 2),
    ("n_positions", 3),
    ("n_ctx", 3),
    ("vocab_size", 4),
];

/// The activations computed as GPT-2's tanh approximation of GELU (`gelu_new`; PyTorch's
/// `gelu(approximate="tanh")` under Transformers' name `gelu_pytorch_tanh` is the same
/// function).
const TANH_GELU: [&str; 2] = ["gelu_new", "gelu_pytorch_tanh"];

fn bad(key: &str, reason: impl Into<String>) -> WeightsError {
    WeightsError::BadConfigJson {
        key: Some(key.to_owned()),
        reason: reason.into(),
    }
}

/// A whole number that fits `usize`, or the key's [`WeightsError::BadConfigJson`].
fn whole(key: &str, value: &Value) -> Result<usize, WeightsError> {
    value
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| bad(key, format!("is {value}, not a whole number")))
}

fn boolean(object: &Map<String, Value>, key: &str) -> Result<Option<bool>, WeightsError> {
    object
        .get(key)
        .map(|value| {
            value
                .as_bool()
                .ok_or_else(|| bad(key, format!("is {value}, not true or false")))
        })
        .transpose()
}

/// `key`, when stated, must be `expected`.
fn require_bool(
    object: &Map<String, Value>,
    key: &'static str,
    expected: bool,
    supported: &'static str,
) -> Result<(), WeightsError> {
    match boolean(object, key)? {
        Some(value) if value != expected => Err(WeightsError::UnsupportedConfig {
            key,
            value: value.to_string(),
            supported,
        }),
        _ => Ok(()),
    }
}

/// Reads a `config.json`'s text. Refused: text that is not a JSON object, a shape key that is
/// not a whole number, `n_positions` and `n_ctx` that differ ([`WeightsError::BadConfigJson`]);
/// `model_type` other than `gpt2`, `activation_function` other than the tanh GELU,
/// `layer_norm_epsilon` other than 1e-5, `scale_attn_weights: false`,
/// `scale_attn_by_inverse_layer_idx: true` or `add_cross_attention: true`
/// ([`WeightsError::UnsupportedConfig`]).
pub(crate) fn parse(text: &str) -> Result<HfConfig, WeightsError> {
    let value: Value = serde_json::from_str(text).map_err(|e| WeightsError::BadConfigJson {
        key: None,
        reason: format!("not JSON: {e}"),
    })?;
    let Value::Object(object) = value else {
        return Err(WeightsError::BadConfigJson {
            key: None,
            reason: format!("not a JSON object but {value}"),
        });
    };
    let mut config = HfConfig::default();
    for (key, field) in SHAPE_KEYS {
        let Some(value) = object.get(key) else {
            continue;
        };
        let value = whole(key, value)?;
        match config.values[field] {
            Some(other) if other != value => {
                return Err(bad(
                    key,
                    format!("is {value}, while `n_positions` is {other}"),
                ))
            }
            _ => config.values[field] = Some(value),
        }
    }
    if let Some(model_type) = object.get("model_type") {
        if model_type.as_str() != Some("gpt2") {
            return Err(WeightsError::UnsupportedConfig {
                key: "model_type",
                value: model_type.to_string(),
                supported: "\"gpt2\"",
            });
        }
    }
    if let Some(activation) = object.get("activation_function") {
        let name = activation.as_str().ok_or_else(|| {
            bad(
                "activation_function",
                format!("is {activation}, not a name"),
            )
        })?;
        if !TANH_GELU.contains(&name) {
            return Err(WeightsError::UnsupportedConfig {
                key: "activation_function",
                value: activation.to_string(),
                supported: "GPT-2's tanh GELU (\"gelu_new\", or \"gelu_pytorch_tanh\")",
            });
        }
    }
    if let Some(eps) = object.get("layer_norm_epsilon") {
        let value = eps
            .as_f64()
            .ok_or_else(|| bad("layer_norm_epsilon", format!("is {eps}, not a number")))?;
        let expected = f64::from(LAYER_NORM_EPS);
        if (value - expected).abs() > expected * 1e-6 {
            return Err(WeightsError::UnsupportedConfig {
                key: "layer_norm_epsilon",
                value: eps.to_string(),
                supported: "layer norms of epsilon 1e-5",
            });
        }
    }
    require_bool(
        &object,
        "scale_attn_weights",
        true,
        "attention scores scaled by 1/sqrt(head_dim)",
    )?;
    require_bool(
        &object,
        "scale_attn_by_inverse_layer_idx",
        false,
        "attention scores scaled by 1/sqrt(head_dim) alone",
    )?;
    require_bool(
        &object,
        "add_cross_attention",
        false,
        "GPT-2 without cross-attention",
    )?;
    config.tie_word_embeddings = boolean(&object, "tie_word_embeddings")?;
    config.n_inner = match object.get("n_inner") {
        None | Some(Value::Null) => None,
        Some(value) => Some(whole("n_inner", value)?),
    };
    Ok(config)
}

impl HfConfig {
    /// Checks what depends on the whole configuration: `n_inner`, when stated, is
    /// `4 · n_embd` (the MLP's width the layout has).
    pub(crate) fn check_against(&self, config: &Gpt2Config) -> Result<(), WeightsError> {
        match self.n_inner {
            Some(n_inner) if Some(n_inner) != config.n_embd.checked_mul(4) => {
                Err(WeightsError::UnsupportedConfig {
                    key: "n_inner",
                    value: n_inner.to_string(),
                    supported: "an MLP of 4 · n_embd (`n_inner` null or that)",
                })
            }
            _ => Ok(()),
        }
    }
}
