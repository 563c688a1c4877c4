//! The tensors of Hugging Face's GPT-2 checkpoint (`GPT2Model`'s state dict, as in its
//! `model.safetensors`): names, shapes and how GPT-2 initialises each.
//!
//! Linear layers are `Conv1D` modules, whose weight is stored `[in, out]` (the transpose of
//! `nn.Linear`'s), so `x @ weight + bias` is the layer. The output projection `lm_head` is tied
//! to `wte` and absent from the file; a checkpoint that unties it carries [`LM_HEAD`] beside the
//! layout.

use super::config::Gpt2Config;

/// How GPT-2 initialises a tensor (Hugging Face's `GPT2PreTrainedModel._init_weights`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal {
        /// The standard deviation.
        std: f32,
    },
    /// Zeros (biases, layer-norm shifts).
    Zeros,
    /// Ones (layer-norm gains).
    Ones,
}

/// One tensor of the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Its name in the file, without a `transformer.` prefix, e.g. `h.0.attn.c_attn.weight`.
    pub name: String,
    /// Its shape (row-major), e.g. `[n_embd, 3 * n_embd]`.
    pub shape: Vec<usize>,
    /// How GPT-2 initialises it.
    pub init: Init,
}

impl TensorSpec {
    /// The number of values, the product of the shape.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a tensor of no values (never in a valid configuration's layout).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The name of an untied output projection, `[vocab_size, n_embd]` (as `GPT2LMHeadModel`'s state
/// dict names it, never with the `transformer.` prefix).
pub const LM_HEAD: &str = "lm_head.weight";

/// The spec of an untied output projection for `config`: [`LM_HEAD`], `[vocab_size, n_embd]`.
pub(crate) fn lm_head_spec(config: &Gpt2Config) -> TensorSpec {
    TensorSpec {
        name: LM_HEAD.to_owned(),
        shape: vec![config.vocab_size, config.n_embd],
        init: Init::Normal {
            std: INITIALIZER_RANGE,
        },
    }
}

/// Hugging Face's initializer range (`GPT2Config.initializer_range`).
const INITIALIZER_RANGE: f32 = 0.02;

/// The twelve tensors of block `h.{i}`, as (name after `h.{i}.`, shape as multiples of
/// `n_embd`), in the order of [`Gpt2Block`](super::Gpt2Block)'s fields.
pub(crate) const BLOCK_TENSORS: [(&str, &[usize]); 12] = [
    ("ln_1.weight", &[1]),
    ("ln_1.bias", &[1]),
    ("attn.c_attn.weight", &[1, 3]),
    ("attn.c_attn.bias", &[3]),
    ("attn.c_proj.weight", &[1, 1]),
    ("attn.c_proj.bias", &[1]),
    ("ln_2.weight", &[1]),
    ("ln_2.bias", &[1]),
    ("mlp.c_fc.weight", &[1, 4]),
    ("mlp.c_fc.bias", &[4]),
    ("mlp.c_proj.weight", &[4, 1]),
    ("mlp.c_proj.bias", &[1]),
];

/// The tensors of a GPT-2 checkpoint for `config`, in the order of [`Gpt2Weights`]'s fields:
/// `wte.weight` `[vocab_size, n_embd]`, `wpe.weight` `[n_ctx, n_embd]`, the twelve of each block
/// `h.{i}` (layer norms `[n_embd]`; `attn.c_attn` `[n_embd, 3·n_embd]`, `attn.c_proj`
/// `[n_embd, n_embd]`, `mlp.c_fc` `[n_embd, 4·n_embd]`, `mlp.c_proj` `[4·n_embd, n_embd]`, each
/// with its bias `[out]`), then `ln_f.weight` and `ln_f.bias` `[n_embd]`.
///
/// Weights are initialised normal with std 0.02, the residual projections (`c_proj`) with
/// 0.02 / √(2·n_layer) as GPT-2 does; biases zero, layer-norm gains one.
///
/// [`Gpt2Weights`]: super::Gpt2Weights
pub fn gpt2_layout(config: &Gpt2Config) -> Vec<TensorSpec> {
    let e = config.n_embd;
    let weight = Init::Normal {
        std: INITIALIZER_RANGE,
    };
    let residual = Init::Normal {
        std: INITIALIZER_RANGE / (2.0 * config.n_layer as f32).sqrt(),
    };
    let mut specs = vec![
        TensorSpec {
            name: "wte.weight".to_owned(),
            shape: vec![config.vocab_size, e],
            init: weight,
        },
        TensorSpec {
            name: "wpe.weight".to_owned(),
            shape: vec![config.n_ctx, e],
            init: weight,
        },
    ];
    for layer in 0..config.n_layer {
        for (suffix, multiples) in BLOCK_TENSORS {
            let init = if suffix.starts_with("ln_") {
                if suffix.ends_with("weight") {
                    Init::Ones
                } else {
                    Init::Zeros
                }
            } else if suffix.ends_with("bias") {
                Init::Zeros
            } else if suffix.ends_with("c_proj.weight") {
                residual
            } else {
                weight
            };
            specs.push(TensorSpec {
                name: format!("h.{layer}.{suffix}"),
                shape: multiples.iter().map(|m| m * e).collect(),
                init,
            });
        }
    }
    for (suffix, init) in [("weight", Init::Ones), ("bias", Init::Zeros)] {
        specs.push(TensorSpec {
            name: format!("ln_f.{suffix}"),
            shape: vec![e],
            init,
        });
    }
    specs
}
