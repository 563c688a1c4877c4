//! A paged KV cache on the GPU: [`KvCache`], one key tensor and one value tensor per layer,
//! each `[num_blocks, block_tokens, n_head, head_dim]`, whose blocks the paging layer's
//! [`BlockManager`](crate::paging::BlockManager) gives to sequences.

use crate::compute::{tensor_bytes, ComputeError, Context, DType, Tensor};
use crate::model::Gpt2Config;
use crate::PoolError;

/// The keys and values of every layer, in blocks of `block_tokens` tokens. Each tensor is one
/// pool allocation labelled `kv h.{layer}.k` / `kv h.{layer}.v`; [`KvCache::label_sequences`]
/// names the blocks each sequence holds inside them, so the memory state and the snapshots
/// made from it (memory_viz, the JSON report) show where every sequence's cache lives.
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    block_tokens: usize,
    num_blocks: usize,
    block_bytes: u64,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("layers", &self.layers.len())
            .field("block_tokens", &self.block_tokens)
            .field("num_blocks", &self.num_blocks)
            .field("bytes_per_block", &self.block_bytes)
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// Bytes one block takes over every layer, keys and values (`u64::MAX` where that passes
    /// it).
    pub fn block_bytes(config: &Gpt2Config, block_tokens: usize, dtype: DType) -> u64 {
        (2 * config.n_layer as u64)
            .saturating_mul(block_tokens as u64)
            .saturating_mul(config.n_embd as u64)
            .saturating_mul(dtype.size_bytes())
    }

    /// The most blocks a cache of `config` may have on a device of `limits`: each layer's key and
    /// value tensor within the storage binding limit (and the largest buffer), and at most
    /// [`BlockManager::MAX_BLOCKS`](crate::paging::BlockManager::MAX_BLOCKS). 0 where one block
    /// alone passes the limit.
    pub fn max_blocks(
        config: &Gpt2Config,
        block_tokens: usize,
        dtype: DType,
        limits: &wgpu::Limits,
    ) -> usize {
        let layer_block = (block_tokens as u64)
            .saturating_mul(config.n_embd as u64)
            .saturating_mul(dtype.size_bytes())
            .max(1);
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        usize::try_from(limit / layer_block)
            .unwrap_or(usize::MAX)
            .min(crate::paging::BlockManager::MAX_BLOCKS)
    }

    /// Bytes the pool is asked for one layer's key (or value) tensor of `num_blocks` blocks.
    pub(crate) fn layer_tensor_bytes(
        config: &Gpt2Config,
        block_tokens: usize,
        num_blocks: usize,
        dtype: DType,
    ) -> u64 {
        tensor_bytes(
            num_blocks
                .saturating_mul(block_tokens)
                .saturating_mul(config.n_embd),
            dtype,
        )
    }

    /// A zeroed cache of `num_blocks` blocks of `block_tokens` tokens for `config`, of `dtype`.
    /// Each tensor is made in a segment sized for it
    /// ([`Pool::allocate_in_own_segment`](crate::Pool::allocate_in_own_segment)): the pool
    /// reserves its bytes rounded up to a block, not a power-of-two segment two of them share,
    /// so a cache sized to a budget takes what it leaves. Errors: those of
    /// [`Context::zeros_labeled`] (out of memory, a tensor above the binding limit, f16
    /// unavailable).
    pub fn new(
        context: &Context,
        config: &Gpt2Config,
        block_tokens: usize,
        num_blocks: usize,
        dtype: DType,
    ) -> Result<Self, ComputeError> {
        let shape = [num_blocks, block_tokens, config.n_head, config.head_dim()];
        let layers = (0..config.n_layer)
            .map(|layer| {
                Ok((
                    context.zeros_labeled_in_own_segment(
                        &shape,
                        dtype,
                        &format!("kv h.{layer}.k"),
                    )?,
                    context.zeros_labeled_in_own_segment(
                        &shape,
                        dtype,
                        &format!("kv h.{layer}.v"),
                    )?,
                ))
            })
            .collect::<Result<_, ComputeError>>()?;
        Ok(Self {
            layers,
            block_tokens,
            num_blocks,
            block_bytes: Self::block_bytes(config, block_tokens, dtype),
        })
    }

    /// Layer `layer`'s key and value tensors.
    ///
    /// # Panics
    ///
    /// For a layer the model does not have.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks (block 0, kept for padding, included).
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Bytes of one block over every layer.
    pub fn bytes_per_block(&self) -> u64 {
        self.block_bytes
    }

    /// Bytes of the whole cache.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|(k, v)| k.size_bytes() + v.size_bytes())
            .sum()
    }

    /// Names the blocks of each sequence (`(id, its blocks)`) in the pool's memory state and
    /// the snapshots and segment maps made from it ([`Pool::label_parts`](crate::Pool::label_parts)):
    /// every layer's tensors get parts `seq {id}` over each run of consecutive blocks a sequence
    /// holds (replacing the names given before); blocks no sequence holds show as
    /// `kv h.{layer}.k (between parts)`.
    pub fn label_sequences<'a>(
        &self,
        context: &Context,
        sequences: impl IntoIterator<Item = (u64, &'a [u32])>,
    ) -> Result<(), PoolError> {
        if self.layers.is_empty() {
            return Ok(());
        }
        let block_bytes = self.block_bytes / (2 * self.layers.len() as u64);
        let mut parts: Vec<(u64, u64, String)> = Vec::new();
        for (id, blocks) in sequences {
            let mut runs: Vec<(u32, u32)> = Vec::new();
            let mut sorted = blocks.to_vec();
            sorted.sort_unstable();
            for block in sorted {
                match runs.last_mut() {
                    Some((_, end)) if *end == block => *end += 1,
                    _ => runs.push((block, block + 1)),
                }
            }
            for (start, end) in runs {
                parts.push((
                    u64::from(start) * block_bytes,
                    u64::from(end - start) * block_bytes,
                    format!("seq {id}"),
                ));
            }
        }
        for (k, v) in &self.layers {
            for tensor in [k, v] {
                if let Some(allocation) = tensor.try_allocation() {
                    context.pool().label_parts(&allocation, &parts)?;
                }
            }
        }
        Ok(())
    }

    /// Names blocks of the cache in the pool's memory state and the snapshots and segment maps
    /// made from it ([`Pool::label_parts`](crate::Pool::label_parts)): every layer's key and
    /// value tensor gets a part named `label` over each run of consecutive blocks of the same
    /// label (replacing the names given before); blocks not named show as
    /// `kv h.{layer}.k (between parts)`.
    pub fn label_blocks(
        &self,
        context: &Context,
        labels: impl IntoIterator<Item = (u32, String)>,
    ) -> Result<(), PoolError> {
        if self.layers.is_empty() {
            return Ok(());
        }
        let block_bytes = self.block_bytes / (2 * self.layers.len() as u64);
        let mut sorted: Vec<(u32, String)> = labels.into_iter().collect();
        sorted.sort();
        let mut parts: Vec<(u64, u64, String)> = Vec::new();
        let mut last: Option<u32> = None;
        for (block, label) in sorted {
            match parts.last_mut() {
                Some((_, size, name)) if last == Some(block.wrapping_sub(1)) && *name == label => {
                    *size += block_bytes;
                }
                _ => parts.push((u64::from(block) * block_bytes, block_bytes, label)),
            }
            last = Some(block);
        }
        for (k, v) in &self.layers {
            for tensor in [k, v] {
                if let Some(allocation) = tensor.try_allocation() {
                    context.pool().label_parts(&allocation, &parts)?;
                }
            }
        }
        Ok(())
    }
}
