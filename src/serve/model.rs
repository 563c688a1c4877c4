//! GPT-2 on the GPU: its weights as tensors of the context ([`Gpt2`]) and one step of its
//! forward over a paged KV cache ([`Gpt2::forward`]), recorded through the context's ops (so it
//! runs eagerly or is captured into a plan alike).

use super::error::ServeError;
use super::kv::KvCache;
use crate::compute::{Activation, ComputeError, Context, DType, Epilogue, FedIds, Tensor};
use crate::model::{Gpt2Config, Gpt2Weights, LAYER_NORM_EPS};

/// One block's tensors. The attention's `c_attn` stays whole: one product gives each row's
/// query, key and value (`[rows, 3, n_head, head_dim]`), which the cache kernels read in place
/// (`kv_write_qkv`, `paged_attention_decode_qkv`).
#[derive(Clone)]
struct Block {
    ln_1: (Tensor, Tensor),
    qkv: (Tensor, Tensor),
    attn_proj: (Tensor, Tensor),
    ln_2: (Tensor, Tensor),
    fc: (Tensor, Tensor),
    mlp_proj: (Tensor, Tensor),
}

/// What a step computes for its sampled rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// The logits, `[samples, vocab_size]`.
    Logits,
    /// The greedy next token (the first largest logit), `[samples]` f32 ids.
    Argmax,
}

/// Which rows a step holds, which decides how its keys and values reach the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Any rows (prompt chunks and decoding tokens mixed): each layer writes the rows' keys and
    /// values into the cache ([`Context::kv_write_qkv`]), then attends
    /// ([`Context::paged_attention_decode_qkv_at`]).
    Mixed,
    /// Every row a different sequence's newest token (a decode step; padding rows write block
    /// 0, which no sequence holds): each layer's attention writes its row's key and value
    /// itself ([`Context::paged_attention_decode_write_qkv`], one dispatch fewer a layer). Rows
    /// of one sequence in such a step may read stale keys: the caller keeps the contract.
    Decode,
}

/// The inputs of one step (see [`StepRows`](crate::paging::StepRows)), as f32 tensors of exact
/// integers: `ids` and `positions` `[rows]`, `table` `[rows, max_blocks]`, `samples`
/// `[samples]` (row indices).
#[derive(Clone, Copy)]
pub struct StepTensors<'a> {
    /// Token ids (where `fed` takes a row's from the GPU: added to it, 0 there).
    pub ids: &'a Tensor,
    /// The rows whose token is the previous step's sample, read on the GPU (`None`: every id
    /// in `ids`).
    pub fed: Option<FedIds<'a>>,
    /// Positions in their sequences.
    pub positions: &'a Tensor,
    /// Each row's block table.
    pub table: &'a Tensor,
    /// The rows whose next token is computed.
    pub samples: &'a Tensor,
}

/// GPT-2's weights on the GPU, each tensor labelled with its checkpoint name in the pool's
/// reports (`gpt2 h.3.mlp.c_fc.weight`), and the output projection transposed, `lm_headᵀ`
/// (`[n_embd, vocab_size]` padded to a multiple of 4 columns: the products have no transposed
/// operand): `wteᵀ`, one more copy of the embedding, for GPT-2's tied head, or the checkpoint's
/// untied `lm_head.weight` ([`Gpt2Weights::lm_head`]).
/// Clones share the tensors (no copy).
#[derive(Clone)]
pub struct Gpt2 {
    config: Gpt2Config,
    dtype: DType,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: (Tensor, Tensor),
    /// `[e, vocab_size]` rounded up to a multiple of 4 columns (zeros past the vocabulary).
    lm_head: Tensor,
    /// −∞ past the vocabulary, 0 before it (`None` for a vocabulary of a multiple of 4).
    lm_padding: Option<Tensor>,
    bytes: u64,
}

impl std::fmt::Debug for Gpt2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpt2")
            .field("config", &self.config())
            .field("dtype", &self.dtype())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Gpt2 {
    /// Reads GPT-2 weights from `path` (a folder as Hugging Face's `save_pretrained` writes it,
    /// `model.safetensors` and `config.json`, or a safetensors file: see
    /// [`Gpt2Weights::load`]) and uploads them as tensors of `dtype`
    /// ([`upload`](Self::upload)). Errors: [`ServeError::Weights`] for a file refused,
    /// and those of [`upload`](Self::upload). Native only: in a browser use
    /// [`from_bytes`](Self::from_bytes).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        context: &Context,
        path: impl AsRef<std::path::Path>,
        dtype: DType,
    ) -> Result<Self, ServeError> {
        let loaded = Gpt2Weights::load(path, None)?;
        Self::upload(context, &loaded.weights, dtype)
    }

    /// Reads GPT-2 weights from the bytes of a safetensors file and the text of its
    /// `config.json`, when there is one (see [`Gpt2Weights::from_bytes_with_config_json`]),
    /// and uploads them as tensors of `dtype` ([`upload`](Self::upload)): a browser's
    /// [`load`](Self::load). Errors: [`ServeError::Weights`] for a file refused, and those of
    /// [`upload`](Self::upload).
    pub fn from_bytes(
        context: &Context,
        bytes: &[u8],
        config_json: Option<&str>,
        dtype: DType,
    ) -> Result<Self, ServeError> {
        let loaded = Gpt2Weights::from_bytes_with_config_json(bytes, config_json, None)?;
        Self::upload(context, &loaded.weights, dtype)
    }

    /// Uploads `weights` as tensors of `dtype` (f16 where the device has it). Errors:
    /// [`ServeError::Weights`] for weights that do not match their configuration
    /// ([`Gpt2Weights::check`]); [`ServeError::Compute`] for those of
    /// [`Context::tensor_labeled`] (out of memory, f16 unavailable). Long: one upload a
    /// checkpoint tensor, in the layout's order.
    pub fn upload(
        context: &Context,
        weights: &Gpt2Weights,
        dtype: DType,
    ) -> Result<Self, ServeError> {
        weights.check()?;
        let config = weights.config;
        let e = config.n_embd;
        let mut bytes = 0;
        let mut upload = |data: &[f32], shape: &[usize], name: &str| {
            let tensor = context.tensor_labeled(data, shape, dtype, &format!("gpt2 {name}"))?;
            bytes += tensor.size_bytes();
            Ok::<_, ComputeError>(tensor)
        };
        let wte = upload(&weights.wte, &[config.vocab_size, e], "wte.weight")?;
        let wpe = upload(&weights.wpe, &[config.n_ctx, e], "wpe.weight")?;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for (i, block) in weights.blocks.iter().enumerate() {
            let name = |suffix: &str| format!("h.{i}.{suffix}");
            let pair =
                |upload: &mut Upload<'_>, w: &[f32], b: &[f32], rows: usize, suffix: &str| {
                    let cols = b.len();
                    Ok::<_, ComputeError>((
                        upload(w, &[rows, cols], &name(&format!("{suffix}.weight")))?,
                        upload(b, &[cols], &name(&format!("{suffix}.bias")))?,
                    ))
                };
            blocks.push(Block {
                ln_1: (
                    upload(&block.ln_1_weight, &[e], &name("ln_1.weight"))?,
                    upload(&block.ln_1_bias, &[e], &name("ln_1.bias"))?,
                ),
                qkv: pair(
                    &mut upload,
                    &block.attn_c_attn_weight,
                    &block.attn_c_attn_bias,
                    e,
                    "attn.c_attn",
                )?,
                attn_proj: pair(
                    &mut upload,
                    &block.attn_c_proj_weight,
                    &block.attn_c_proj_bias,
                    e,
                    "attn.c_proj",
                )?,
                ln_2: (
                    upload(&block.ln_2_weight, &[e], &name("ln_2.weight"))?,
                    upload(&block.ln_2_bias, &[e], &name("ln_2.bias"))?,
                ),
                fc: pair(
                    &mut upload,
                    &block.mlp_c_fc_weight,
                    &block.mlp_c_fc_bias,
                    e,
                    "mlp.c_fc",
                )?,
                mlp_proj: pair(
                    &mut upload,
                    &block.mlp_c_proj_weight,
                    &block.mlp_c_proj_bias,
                    4 * e,
                    "mlp.c_proj",
                )?,
            });
        }
        let ln_f = (
            upload(&weights.ln_f_weight, &[e], "ln_f.weight")?,
            upload(&weights.ln_f_bias, &[e], "ln_f.bias")?,
        );
        // Columns padded to a multiple of 4 (GPT-2's 50,257 to 50,260), so that the output
        // product reads them as vec4s (the narrow kernel for a step's few sampled rows); the
        // padding's logits are −∞ by a bias, so that no greedy choice takes one.
        let padded = config.vocab_size.next_multiple_of(4);
        let mut transposed = transpose(weights.lm_head(), config.vocab_size, e);
        if padded > config.vocab_size {
            transposed = transposed
                .chunks_exact(config.vocab_size)
                .flat_map(|row| {
                    row.iter()
                        .copied()
                        .chain(std::iter::repeat_n(0.0, padded - config.vocab_size))
                })
                .collect();
        }
        let label = if weights.untied_lm_head.is_some() {
            "lm_head (lm_head.weight transposed)"
        } else {
            "lm_head (wte transposed)"
        };
        let lm_head = upload(&transposed, &[e, padded], label)?;
        let lm_padding = if padded > config.vocab_size {
            let mut bias = vec![0.0; padded];
            bias[config.vocab_size..].fill(f32::NEG_INFINITY);
            Some(upload(&bias, &[padded], "lm_head padding (−∞ logits)")?)
        } else {
            None
        };
        Ok(Self {
            config,
            dtype,
            wte,
            wpe,
            blocks,
            ln_f,
            lm_head,
            lm_padding,
            bytes,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> Gpt2Config {
        self.config
    }

    /// The weights' element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of the weights on the GPU (the transposed output projection included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One step: every row's token through every block, each row writing its key and value
    /// into `cache` at its position (through its block table) and attending to its sequence's
    /// tokens up to and including itself; then the sampled rows' logits or greedy tokens.
    /// Prompt rows and decode rows mix freely. Errors: those of the ops (shapes that do not
    /// match the model or the cache, out of memory).
    pub fn forward(
        &self,
        context: &Context,
        cache: &KvCache,
        inputs: StepTensors<'_>,
        head: Head,
    ) -> Result<Tensor, ComputeError> {
        self.forward_step(context, cache, inputs, head, StepKind::Mixed)
    }

    /// [`Gpt2::forward`] for a step of `kind`: [`StepKind::Decode`] when every row is a
    /// different sequence's newest token (its contract), [`StepKind::Mixed`] otherwise.
    pub fn forward_step(
        &self,
        context: &Context,
        cache: &KvCache,
        inputs: StepTensors<'_>,
        head: Head,
        kind: StepKind,
    ) -> Result<Tensor, ComputeError> {
        let e = self.config.n_embd;
        let (heads, head_dim) = (self.config.n_head, self.config.head_dim());
        let rows = inputs.ids.len();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut x = context.embedding_sum(
            &self.wte,
            inputs.ids,
            &self.wpe,
            inputs.positions,
            inputs.fed,
        )?;
        // The layer norms are folded into the products that read them, and the residual adds
        // into the products whose output they add (`matmul_layer_norm`, `Epilogue::residual`):
        // one dispatch each where the rows are few (a decode step), the separate ops elsewhere.
        let normed =
            |x: &Tensor, (g, beta): &(Tensor, Tensor), (w, b): &(Tensor, Tensor), activation| {
                let epilogue = Epilogue {
                    bias: Some(b),
                    activation,
                    ..Default::default()
                };
                context.matmul_layer_norm(x, g, beta, LAYER_NORM_EPS, w, epilogue)
            };
        let added = |x: &Tensor, (w, b): &(Tensor, Tensor), residual: &Tensor| {
            let epilogue = Epilogue {
                bias: Some(b),
                residual: Some(residual),
                ..Default::default()
            };
            context.matmul_with(x, w, epilogue)
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            let (k_cache, v_cache) = cache.layer(layer);
            let qkv = normed(&x, &block.ln_1, &block.qkv, Activation::None)?
                .reshape(&[rows, 3, heads, head_dim])?;
            let (table, positions) = (inputs.table, inputs.positions);
            let attended = match kind {
                StepKind::Mixed => {
                    context.kv_write_qkv(k_cache, v_cache, &qkv, table, positions)?;
                    context.paged_attention_decode_qkv_at(
                        &qkv, k_cache, v_cache, table, positions, scale,
                    )?
                }
                StepKind::Decode => context.paged_attention_decode_write_qkv(
                    &qkv, k_cache, v_cache, table, positions, scale,
                )?,
            }
            .reshape(&[rows, e])?;
            drop(qkv);
            x = added(&attended, &block.attn_proj, &x)?;
            drop(attended);
            let f = normed(&x, &block.ln_2, &block.fc, Activation::Gelu)?;
            x = added(&f, &block.mlp_proj, &x)?;
        }
        let last = context.embedding(&x, inputs.samples)?;
        drop(x);
        let logits = context.matmul_layer_norm(
            &last,
            &self.ln_f.0,
            &self.ln_f.1,
            LAYER_NORM_EPS,
            &self.lm_head,
            Epilogue {
                bias: self.lm_padding.as_ref(),
                ..Default::default()
            },
        )?;
        match head {
            Head::Logits if self.lm_padding.is_some() => {
                context.take_columns(&logits, self.config.vocab_size)
            }
            Head::Logits => Ok(logits),
            Head::Argmax => context.argmax_rows(&logits),
        }
    }
}

/// Uploads values of a shape under a name.
type Upload<'a> = dyn FnMut(&[f32], &[usize], &str) -> Result<Tensor, ComputeError> + 'a;

/// `m` `[rows, cols]` transposed to `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}
