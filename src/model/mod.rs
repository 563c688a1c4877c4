#![deny(unsafe_code)]
//! GPT-2's weights on the host, read from and written to safetensors files in Hugging Face's
//! layout (the format users have: the `gpt2` checkpoints' folder of `model.safetensors` and
//! `config.json`). Pure: no GPU, no wgpu; the compute layers upload what this reads.
//!
//! - [`Gpt2Config`]: layers, width, heads, context, vocabulary ([`Gpt2Config::gpt2_small`],
//!   [`Gpt2Config::tiny`]), validated ([`ConfigError`]), stored as strings in the file's
//!   `__metadata__` under the names of Hugging Face's `config.json` ([`METADATA_KEYS`]).
//! - [`gpt2_layout`]: every tensor's name and shape (`wte.weight`, `wpe.weight`,
//!   `h.{i}.attn.c_attn.weight` in `Conv1D`'s `[in, out]` layout, ...), and GPT-2's
//!   initialisation of each; `lm_head` is tied to `wte` and not in the file, unless a
//!   checkpoint unties it ([`LM_HEAD`]).
//! - [`Gpt2Weights`]: one `Vec<f32>` per tensor, and an untied output projection when the file
//!   has one ([`Gpt2Weights::untied_lm_head`], [`Gpt2Weights::lm_head`]). [`Gpt2Weights::load`]
//!   reads a folder as `save_pretrained` writes it ([`MODEL_FILE`] and [`CONFIG_JSON`]) or a
//!   file; [`Gpt2Weights::from_bytes_with_config_json`] / [`Gpt2Weights::from_bytes`] read the
//!   bytes (in a browser). F32, F16 or BF16 tensors, names with or without a `transformer.`
//!   prefix, widened to f32; the configuration from the file's `__metadata__`, `config.json`
//!   and the caller, which must agree ([`LoadedWeights::config_sources`] says which stated
//!   what). [`Gpt2Weights::random`] makes seeded random weights; [`Gpt2Weights::write`] /
//!   [`Gpt2Weights::to_bytes`] write them back (an untied head with them), and
//!   [`write_random`] writes a seeded random checkpoint where no real one is at hand.
//!
//! A bad file is a [`WeightsError`] naming the tensor at fault (missing, wrong shape, wrong
//! type, running past the end of a truncated file, outside the layout), the field at fault
//! (sources that disagree, a `config.json` that is bad or describes another model) or the
//! blocks (other than `n_layer`), never a panic nor a silently different model; only the
//! causal-mask buffers are ignored and listed ([`LoadedWeights::ignored`]).
//!
//! ```
//! use wgpu_pool::model::{Gpt2Config, Gpt2Weights, StoredDtype};
//!
//! let config = Gpt2Config::tiny();
//! let weights = Gpt2Weights::random(&config, 7)?;
//! let bytes = weights.to_bytes(StoredDtype::F32)?;
//! let loaded = Gpt2Weights::from_bytes(&bytes, None)?; // the configuration is in the file
//! assert_eq!(loaded.weights, weights);
//! assert_eq!(loaded.weights.tensor("h.1.attn.c_attn.weight").map(<[f32]>::len), Some(64 * 192));
//! # Ok::<(), wgpu_pool::model::WeightsError>(())
//! ```
//!
//! # Files
//!
//! Bottom up; each file uses only those above it in this list.
//!
//! - `error.rs`: [`ConfigError`], [`WeightsError`], [`ConfigSource`].
//! - `config.rs`: [`Gpt2Config`], its validation, its `__metadata__` entries, and one
//!   configuration from the fields several sources state.
//! - `layout.rs`: [`gpt2_layout`], [`TensorSpec`], [`Init`], [`LM_HEAD`].
//! - `weights.rs`: [`Gpt2Weights`], [`Gpt2Block`].
//! - `reference.rs`: [`Gpt2Weights::reference_logits`] (the served model's CPU twin, in f64),
//!   [`Gpt2Weights::check_tokens`], [`LAYER_NORM_EPS`].
//! - `config_json.rs`: Hugging Face's `config.json`, read and checked.
//! - `read.rs`: [`Gpt2Weights::load`], [`Gpt2Weights::from_bytes_with_config_json`],
//!   [`Gpt2Weights::from_bytes`], [`LoadedWeights`].
//! - `write.rs`: [`Gpt2Weights::random`], [`Gpt2Weights::write`], [`Gpt2Weights::to_bytes`],
//!   [`write_random`], [`StoredDtype`] (its random numbers: the crate's SplitMix64, `src/rng.rs`).

mod config;
mod config_json;
mod error;
mod layout;
mod read;
mod reference;
#[cfg(test)]
mod tests;
mod weights;
mod write;

pub use config::{Gpt2Config, METADATA_KEYS};
pub use error::{ConfigError, ConfigSource, TokensError, WeightsError};
pub use layout::{gpt2_layout, Init, TensorSpec, LM_HEAD};
pub use read::{LoadedWeights, CONFIG_JSON, MODEL_FILE, TRANSFORMER_PREFIX};
pub use reference::{Disagreement, GreedyAgreement, LAYER_NORM_EPS};
pub use weights::{Gpt2Block, Gpt2Weights};
#[cfg(not(target_arch = "wasm32"))]
pub use write::write_random;
pub use write::StoredDtype;
