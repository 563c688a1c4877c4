//! GPT-2's forward on the host, in f64, without a cache: the CPU twin of the served model
//! ([`Gpt2Weights::reference_logits`]).

use super::config::Gpt2Config;
use super::error::{TokensError, WeightsError};
use super::weights::{Gpt2Block, Gpt2Weights};

/// What [`Gpt2Weights::greedy_agreement`] found of an output against the twin.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GreedyAgreement {
    /// Tokens equal to the twin's greedy choice.
    pub equal: usize,
    /// Tokens within the near-tie margin of the twin's best logit.
    pub near_ties: usize,
    /// Tokens further off.
    pub disagreements: usize,
    /// The first token further off, if any.
    pub first_disagreement: Option<Disagreement>,
}

impl GreedyAgreement {
    /// Whether every token is the twin's choice or a near-tie.
    pub fn agrees(&self) -> bool {
        self.disagreements == 0
    }
}

/// A token that is neither the twin's greedy choice nor a near-tie of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disagreement {
    /// Its index in the output.
    pub index: usize,
    /// The token chosen.
    pub token: u32,
    /// The twin's best token there.
    pub best: u32,
    /// The twin's logit of `best` less its logit of `token`.
    pub gap: f32,
}

/// Layer normalization's epsilon in GPT-2.
pub const LAYER_NORM_EPS: f32 = 1e-5;

impl Gpt2Weights {
    /// Checks that `tokens` can be run: some, at most `n_ctx`, each below `vocab_size`.
    pub fn check_tokens(config: &Gpt2Config, tokens: &[u32]) -> Result<(), TokensError> {
        if tokens.is_empty() {
            return Err(TokensError::Empty);
        }
        if tokens.len() > config.n_ctx {
            return Err(TokensError::TooLong {
                tokens: tokens.len(),
                n_ctx: config.n_ctx,
            });
        }
        match tokens.iter().position(|&t| t as usize >= config.vocab_size) {
            Some(index) => Err(TokensError::OutOfVocabulary {
                token: tokens[index],
                index,
                vocab_size: config.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// How far `output`, generated greedily after `prompt`, agrees with this model's twin
    /// (teacher forcing: the twin's logits over the prompt and every output but the last, in
    /// one [`reference_logits`](Self::reference_logits) call): each token is the twin's best,
    /// or within `near_tie` of its logit (a near-tie, which f32 against f64 may resolve either
    /// way), or neither. Errors: those of `reference_logits` (an empty prompt among them).
    pub fn greedy_agreement(
        &self,
        prompt: &[u32],
        output: &[u32],
        near_tie: f32,
    ) -> Result<GreedyAgreement, WeightsError> {
        let vocab = self.config.vocab_size;
        let mut agreement = GreedyAgreement::default();
        if output.is_empty() {
            return Ok(agreement);
        }
        let mut tokens = prompt.to_vec();
        tokens.extend(&output[..output.len() - 1]);
        let logits = self.reference_logits(&tokens)?;
        Self::check_tokens(&self.config, output)?;
        for (index, &token) in output.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + index) * vocab..][..vocab];
            let best = (0..vocab).fold(0, |best, j| if row[j] > row[best] { j } else { best });
            let gap = row[best] - row[token as usize];
            if best == token as usize {
                agreement.equal += 1;
            } else if gap <= near_tie {
                agreement.near_ties += 1;
            } else {
                agreement.disagreements += 1;
                agreement.first_disagreement.get_or_insert(Disagreement {
                    index,
                    token,
                    best: best as u32,
                    gap,
                });
            }
        }
        Ok(agreement)
    }

    /// The logits `[tokens.len(), vocab_size]` at every position of `tokens` (causal
    /// attention; the output projection [`lm_head`](Self::lm_head), tied to `wte` or not), computed in f64 from the f32 weights: the reference
    /// the GPU's steps are tested against. GELU is the tanh approximation (GPT-2's `gelu_new`),
    /// layer norms use ε = 1e-5. Slow (no cache, one thread): for small models and tests.
    /// Errors: [`WeightsError::Tokens`] for tokens the model cannot run, and those of
    /// [`Gpt2Weights::check`].
    pub fn reference_logits(&self, tokens: &[u32]) -> Result<Vec<f32>, WeightsError> {
        self.check()?;
        let config = self.config;
        Self::check_tokens(&config, tokens)?;
        let e = config.n_embd;
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .enumerate()
            .map(|(pos, &t)| {
                let t = t as usize;
                (0..e)
                    .map(|i| f64::from(self.wte[t * e + i]) + f64::from(self.wpe[pos * e + i]))
                    .collect()
            })
            .collect();
        for block in &self.blocks {
            let attended = attention(&config, block, &x);
            for (row, add) in x.iter_mut().zip(&attended) {
                row.iter_mut().zip(add).for_each(|(v, a)| *v += a);
            }
            let mlp: Vec<Vec<f64>> = x.iter().map(|row| mlp(e, block, row)).collect();
            for (row, add) in x.iter_mut().zip(&mlp) {
                row.iter_mut().zip(add).for_each(|(v, a)| *v += a);
            }
        }
        let mut logits = Vec::with_capacity(tokens.len() * config.vocab_size);
        let head = self.lm_head();
        for row in &x {
            let h = layer_norm(row, &self.ln_f_weight, &self.ln_f_bias);
            for token in 0..config.vocab_size {
                let w = &head[token * e..(token + 1) * e];
                logits.push(h.iter().zip(w).map(|(a, &b)| a * f64::from(b)).sum::<f64>() as f32);
            }
        }
        Ok(logits)
    }
}

fn layer_norm(x: &[f64], gain: &[f32], bias: &[f32]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + f64::from(LAYER_NORM_EPS)).sqrt();
    x.iter()
        .zip(gain.iter().zip(bias))
        .map(|(v, (&g, &b))| (v - mean) * inv * f64::from(g) + f64::from(b))
        .collect()
}

/// `x · W + b` for `W` `[x.len(), out]` row-major.
fn linear(x: &[f64], w: &[f32], b: &[f32]) -> Vec<f64> {
    let out = b.len();
    let mut y: Vec<f64> = b.iter().map(|&v| f64::from(v)).collect();
    for (i, &xi) in x.iter().enumerate() {
        for (yj, &wij) in y.iter_mut().zip(&w[i * out..(i + 1) * out]) {
            *yj += xi * f64::from(wij);
        }
    }
    y
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn mlp(e: usize, block: &Gpt2Block, row: &[f64]) -> Vec<f64> {
    let h = layer_norm(row, &block.ln_2_weight, &block.ln_2_bias);
    let f: Vec<f64> = linear(&h, &block.mlp_c_fc_weight, &block.mlp_c_fc_bias)
        .into_iter()
        .map(gelu)
        .collect();
    debug_assert_eq!(f.len(), 4 * e);
    linear(&f, &block.mlp_c_proj_weight, &block.mlp_c_proj_bias)
}

fn attention(config: &Gpt2Config, block: &Gpt2Block, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let e = config.n_embd;
    let hd = config.head_dim();
    let qkv: Vec<Vec<f64>> = x
        .iter()
        .map(|row| {
            let h = layer_norm(row, &block.ln_1_weight, &block.ln_1_bias);
            linear(&h, &block.attn_c_attn_weight, &block.attn_c_attn_bias)
        })
        .collect();
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![vec![0.0; e]; x.len()];
    for (i, row_out) in out.iter_mut().enumerate() {
        for head in 0..config.n_head {
            let q = &qkv[i][head * hd..(head + 1) * hd];
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    let k = &qkv[j][e + head * hd..e + (head + 1) * hd];
                    scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (j, w) in weights.iter().enumerate() {
                let v = &qkv[j][2 * e + head * hd..2 * e + (head + 1) * hd];
                for (o, vd) in row_out[head * hd..(head + 1) * hd].iter_mut().zip(v) {
                    *o += w / total * vd;
                }
            }
        }
    }
    out.iter()
        .map(|row| {
            let proj = linear(row, &block.attn_c_proj_weight, &block.attn_c_proj_bias);
            debug_assert_eq!(proj.len(), e);
            proj
        })
        .collect()
}
