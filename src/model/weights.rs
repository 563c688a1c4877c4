//! [`Gpt2Weights`]: a GPT-2 model's parameters on the host, one `Vec<f32>` per tensor of the
//! checkpoint's layout.

use super::config::Gpt2Config;
use super::error::WeightsError;
use super::layout::{gpt2_layout, lm_head_spec, TensorSpec};

/// The parameters of one transformer block `h.{i}`, named after Hugging Face's tensors
/// (`ln_1.weight` is `ln_1_weight`, `attn.c_attn.weight` is `attn_c_attn_weight`, ...). Weights are
/// in `Conv1D` layout, `[in, out]` row-major.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Gpt2Block {
    /// `ln_1.weight` `[n_embd]`: the first layer norm's gain.
    pub ln_1_weight: Vec<f32>,
    /// `ln_1.bias` `[n_embd]`.
    pub ln_1_bias: Vec<f32>,
    /// `attn.c_attn.weight` `[n_embd, 3·n_embd]`: queries, keys and values side by side.
    pub attn_c_attn_weight: Vec<f32>,
    /// `attn.c_attn.bias` `[3·n_embd]`.
    pub attn_c_attn_bias: Vec<f32>,
    /// `attn.c_proj.weight` `[n_embd, n_embd]`: attention's output projection.
    pub attn_c_proj_weight: Vec<f32>,
    /// `attn.c_proj.bias` `[n_embd]`.
    pub attn_c_proj_bias: Vec<f32>,
    /// `ln_2.weight` `[n_embd]`: the second layer norm's gain.
    pub ln_2_weight: Vec<f32>,
    /// `ln_2.bias` `[n_embd]`.
    pub ln_2_bias: Vec<f32>,
    /// `mlp.c_fc.weight` `[n_embd, 4·n_embd]`.
    pub mlp_c_fc_weight: Vec<f32>,
    /// `mlp.c_fc.bias` `[4·n_embd]`.
    pub mlp_c_fc_bias: Vec<f32>,
    /// `mlp.c_proj.weight` `[4·n_embd, n_embd]`.
    pub mlp_c_proj_weight: Vec<f32>,
    /// `mlp.c_proj.bias` `[n_embd]`.
    pub mlp_c_proj_bias: Vec<f32>,
}

impl Gpt2Block {
    /// The fields in the order of the layout's block tensors.
    fn slots(&self) -> [&Vec<f32>; 12] {
        [
            &self.ln_1_weight,
            &self.ln_1_bias,
            &self.attn_c_attn_weight,
            &self.attn_c_attn_bias,
            &self.attn_c_proj_weight,
            &self.attn_c_proj_bias,
            &self.ln_2_weight,
            &self.ln_2_bias,
            &self.mlp_c_fc_weight,
            &self.mlp_c_fc_bias,
            &self.mlp_c_proj_weight,
            &self.mlp_c_proj_bias,
        ]
    }

    /// A block from its tensors in the layout's order.
    fn from_slots(slots: [Vec<f32>; 12]) -> Self {
        let [ln_1_weight, ln_1_bias, attn_c_attn_weight, attn_c_attn_bias, attn_c_proj_weight, attn_c_proj_bias, ln_2_weight, ln_2_bias, mlp_c_fc_weight, mlp_c_fc_bias, mlp_c_proj_weight, mlp_c_proj_bias] =
            slots;
        Self {
            ln_1_weight,
            ln_1_bias,
            attn_c_attn_weight,
            attn_c_attn_bias,
            attn_c_proj_weight,
            attn_c_proj_bias,
            ln_2_weight,
            ln_2_bias,
            mlp_c_fc_weight,
            mlp_c_fc_bias,
            mlp_c_proj_weight,
            mlp_c_proj_bias,
        }
    }
}

/// A GPT-2 model's parameters on the host, in f32, as Hugging Face's checkpoint holds them
/// (see [`gpt2_layout`] for every name and shape). Read with
/// [`Gpt2Weights::load`] / [`Gpt2Weights::from_bytes`], made with [`Gpt2Weights::random`],
/// written with [`Gpt2Weights::write`].
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Weights {
    /// The model's shape.
    pub config: Gpt2Config,
    /// `wte.weight` `[vocab_size, n_embd]`: token embeddings, also the output projection
    /// unless [`lm_head`](Self::lm_head) unties it.
    pub wte: Vec<f32>,
    /// `wpe.weight` `[n_ctx, n_embd]`: position embeddings.
    pub wpe: Vec<f32>,
    /// The blocks `h.0` to `h.{n_layer - 1}`.
    pub blocks: Vec<Gpt2Block>,
    /// `ln_f.weight` `[n_embd]`: the final layer norm's gain.
    pub ln_f_weight: Vec<f32>,
    /// `ln_f.bias` `[n_embd]`.
    pub ln_f_bias: Vec<f32>,
    /// `lm_head.weight` `[vocab_size, n_embd]`: an untied output projection, `None` when it is
    /// tied to `wte` (GPT-2's own checkpoints). Read from a file whose `lm_head.weight` differs
    /// from its `wte.weight`, written back, served and used by the CPU twin.
    pub untied_lm_head: Option<Vec<f32>>,
}

impl Gpt2Weights {
    /// The output projection `[vocab_size, n_embd]` (logits are `h · lm_headᵀ`): the untied
    /// head when there is one, else `wte` (GPT-2 ties them).
    pub fn lm_head(&self) -> &[f32] {
        self.untied_lm_head.as_deref().unwrap_or(&self.wte)
    }

    /// Checks the weights against their configuration (the fields are public, so anything may
    /// be put in them): the configuration valid ([`Gpt2Config::validate`]), as many blocks as
    /// layers ([`WeightsError::Layers`]), every tensor holding its shape's values
    /// ([`WeightsError::Length`], naming it). Writing, uploading and the CPU twin check first.
    pub fn check(&self) -> Result<(), WeightsError> {
        self.config.validate()?;
        if self.blocks.len() != self.config.n_layer {
            return Err(WeightsError::Layers {
                expected: self.config.n_layer,
                found: self.blocks.len(),
            });
        }
        for (spec, values) in self.tensors() {
            if values.len() != spec.len() {
                return Err(WeightsError::Length {
                    expected: spec.len(),
                    found: values.len(),
                    tensor: spec.name,
                    shape: spec.shape,
                });
            }
        }
        Ok(())
    }

    /// Every tensor with its spec, in the layout's order ([`gpt2_layout`]), then the untied
    /// `lm_head.weight` when there is one ([`LM_HEAD`](super::LM_HEAD)).
    pub fn tensors(&self) -> Vec<(TensorSpec, &[f32])> {
        let mut values: Vec<&[f32]> = vec![&self.wte, &self.wpe];
        for block in &self.blocks {
            values.extend(block.slots().into_iter().map(Vec::as_slice));
        }
        values.push(&self.ln_f_weight);
        values.push(&self.ln_f_bias);
        let mut tensors: Vec<_> = gpt2_layout(&self.config).into_iter().zip(values).collect();
        if let Some(head) = &self.untied_lm_head {
            tensors.push((lm_head_spec(&self.config), head.as_slice()));
        }
        tensors
    }

    /// The tensor of that name in the layout (without a `transformer.` prefix) or the untied
    /// `lm_head.weight`, if any.
    pub fn tensor(&self, name: &str) -> Option<&[f32]> {
        self.tensors()
            .into_iter()
            .find(|(spec, _)| spec.name == name)
            .map(|(_, values)| values)
    }

    /// Weights from the tensors in the layout's order (as many as [`gpt2_layout`] lists for
    /// `config`; the caller has checked their sizes), the output projection tied.
    pub(crate) fn from_layout_order(config: Gpt2Config, tensors: Vec<Vec<f32>>) -> Self {
        let mut tensors = tensors.into_iter();
        let mut next = || tensors.next().unwrap_or_default();
        let wte = next();
        let wpe = next();
        let blocks = (0..config.n_layer)
            .map(|_| Gpt2Block::from_slots(std::array::from_fn(|_| next())))
            .collect();
        let ln_f_weight = next();
        let ln_f_bias = next();
        Self {
            config,
            wte,
            wpe,
            blocks,
            ln_f_weight,
            ln_f_bias,
            untied_lm_head: None,
        }
    }
}
