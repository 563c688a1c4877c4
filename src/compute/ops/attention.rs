//! Attention over a paged KV cache for one-token decode, and the write of each sequence's new
//! token into that cache. Kernels: `shaders/kv_write.wgsl` (and `shaders/kv_write_qkv.wgsl`,
//! which takes the keys and values from a fused query-key-value tensor),
//! `shaders/paged_attention.wgsl` and, for head sizes that are multiples of 4,
//! `shaders/paged_attention_vec4.wgsl` (both after `shaders/workgroup_reduce.wgsl`). Each is recorded through [`Context::record`], so it
//! runs eagerly and is captured into plans alike. CPU twins of the same names in
//! [`crate::compute::cpu`].
//!
//! The cache: one tensor for the keys and one for the values, each
//! `[num_blocks, block_tokens, n_head, head_dim]`. A sequence's tokens live in the blocks its
//! row of a block table names (`[batch, max_blocks]`): token `t` at block
//! `table[b, t / block_tokens]`, slot `t % block_tokens`, so blocks need not be contiguous nor
//! in order. Block ids, positions and lengths travel as f32 tensors of exact integers (the crate
//! has no integer element type); they are GPU data, read by the kernels, so the host cannot
//! check them: out-of-range values never make a kernel read or write outside its tensors (see
//! each op for what they give).

use std::sync::Arc;

use super::{common_dtype, grid_1d};
use crate::compute::context::{Context, Dispatch};
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    kernel_u32, ComputeError, DType, ElementTypes, KernelKey, KvWriteParams, PagedAttentionParams,
    ParamsBlock, Source,
};

/// The largest integer below which every integer is an f32: ids and positions are exact below it.
const EXACT_F32_INTEGERS: usize = 1 << 24;

/// Invocations per workgroup of both kernels.
const WORKGROUP_SIZE: usize = 256;

/// The new tokens of a call: a key and a value tensor (`[batch, n_head, head_dim]`; a query
/// given twice), or one fused query-key-value tensor (`[batch, 3, n_head, head_dim]`).
#[derive(Clone, Copy)]
enum Tokens<'a> {
    Pair(&'a Tensor, &'a Tensor),
    Fused(&'a Tensor),
}

impl<'a> Tokens<'a> {
    /// The tensor the shape errors name.
    fn first(self) -> &'a Tensor {
        match self {
            Tokens::Pair(first, _) | Tokens::Fused(first) => first,
        }
    }
}

/// How the decode attention reads its lengths operand.
#[derive(Debug, Clone, Copy)]
enum Lengths {
    /// Each sequence's length.
    Given,
    /// Each row's position (the length less one).
    Positions,
    /// Each row's position (the length less one), whose key and value the attention writes
    /// first ([`Context::paged_attention_decode_write_qkv`]).
    PositionsWriting,
}

/// The sizes of one paged cache and the batch that reads or writes it.
struct Paged {
    num_blocks: usize,
    block_tokens: usize,
    n_head: usize,
    head_dim: usize,
    batch: usize,
    max_blocks: usize,
}

impl Context {
    /// Writes each sequence's new token into a paged KV cache, in place: `k_new[b]` and
    /// `v_new[b]` (`[batch, n_head, head_dim]`) go to position `positions[b]` of sequence `b`,
    /// that is block `block_table[b, pos / block_tokens]`, slot `pos % block_tokens` of
    /// `k_cache` and `v_cache` (`[num_blocks, block_tokens, n_head, head_dim]`, of `k_new`'s
    /// element type). `block_table` (`[batch, max_blocks]`) and `positions` (`[batch]`) are f32
    /// tensors of exact integers. A position that is not an integer in
    /// `[0, max_blocks · block_tokens)`, or a block id it selects that is not an integer in
    /// `[0, num_blocks)`, writes nothing for that sequence. One dispatch; nothing is allocated.
    ///
    /// Errors: [`ComputeError::InvalidShape`] for caches that are not 4-D, a table that is not
    /// 2-D, more than 2²⁴ blocks or table positions (ids are exact f32 integers below that);
    /// [`ComputeError::ShapeMismatch`] for caches of different shapes or the same tensor,
    /// new tokens whose heads do not match the cache's or of different shapes, a table or
    /// positions of another batch; [`ComputeError::DTypeMismatch`] for caches and new tokens of
    /// different element types, or a table or positions that are not f32. Nothing is recorded
    /// on error.
    pub fn kv_write(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        block_table: &Tensor,
        positions: &Tensor,
    ) -> Result<(), ComputeError> {
        const OP: &str = "kv_write";
        for tensor in [k_cache, v_cache, k_new, v_new, block_table, positions] {
            self.check_owner(OP, tensor)?;
        }
        let paged = paged_shapes(
            OP,
            k_cache,
            v_cache,
            Tokens::Pair(k_new, v_new),
            block_table,
            positions,
        )?;
        distinct_caches(
            OP,
            &[k_cache, v_cache, k_new, v_new, block_table, positions],
        )?;
        let dtype = common_dtype(OP, &[k_cache, v_cache, k_new, v_new])?;
        let len = paged.batch * paged.n_head * paged.head_dim;
        let (workgroups, grid_x) = grid_1d(self, OP, len.div_ceil(WORKGROUP_SIZE) as u64)?;
        let params = KvWriteParams {
            batch: kernel_u32(OP, "batch", paged.batch)?,
            n_head: kernel_u32(OP, "heads", paged.n_head)?,
            head_dim: kernel_u32(OP, "head_dim", paged.head_dim)?,
            block_tokens: kernel_u32(OP, "block_tokens", paged.block_tokens)?,
            num_blocks: kernel_u32(OP, "blocks", paged.num_blocks)?,
            max_blocks: kernel_u32(OP, "max_blocks", paged.max_blocks)?,
            grid_x,
            pad: 0,
        };
        self.before_op()?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::KvWrite, OP).typed(ElementTypes::same(dtype)),
            params: ParamsBlock::new(&params),
            bindings: &[
                &k_cache.storage,
                &v_cache.storage,
                &k_new.storage,
                &v_new.storage,
                &block_table.storage,
                &positions.storage,
            ],
            workgroups,
        })
    }

    /// [`Context::kv_write`] from a fused query-key-value tensor `qkv`
    /// (`[batch, 3, n_head, head_dim]`: each sequence's query, key and value, as GPT-2's
    /// attention product gives them): the keys and values go into the caches, the queries are
    /// left to [`Context::paged_attention_decode_qkv`]. Errors as [`Context::kv_write`], the
    /// fused tensor in place of the new tokens.
    pub fn kv_write_qkv(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        qkv: &Tensor,
        block_table: &Tensor,
        positions: &Tensor,
    ) -> Result<(), ComputeError> {
        const OP: &str = "kv_write_qkv";
        for tensor in [k_cache, v_cache, qkv, block_table, positions] {
            self.check_owner(OP, tensor)?;
        }
        let paged = paged_shapes(
            OP,
            k_cache,
            v_cache,
            Tokens::Fused(qkv),
            block_table,
            positions,
        )?;
        distinct_caches(OP, &[k_cache, v_cache, qkv, block_table, positions])?;
        let dtype = common_dtype(OP, &[k_cache, v_cache, qkv])?;
        let len = paged.batch * paged.n_head * paged.head_dim;
        let (workgroups, grid_x) = grid_1d(self, OP, len.div_ceil(WORKGROUP_SIZE) as u64)?;
        let params = KvWriteParams {
            batch: kernel_u32(OP, "batch", paged.batch)?,
            n_head: kernel_u32(OP, "heads", paged.n_head)?,
            head_dim: kernel_u32(OP, "head_dim", paged.head_dim)?,
            block_tokens: kernel_u32(OP, "block_tokens", paged.block_tokens)?,
            num_blocks: kernel_u32(OP, "blocks", paged.num_blocks)?,
            max_blocks: kernel_u32(OP, "max_blocks", paged.max_blocks)?,
            grid_x,
            pad: 0,
        };
        self.before_op()?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::KvWriteQkv, OP).typed(ElementTypes::same(dtype)),
            params: ParamsBlock::new(&params),
            bindings: &[
                &k_cache.storage,
                &v_cache.storage,
                &qkv.storage,
                &block_table.storage,
                &positions.storage,
            ],
            workgroups,
        })
    }

    /// Attention of one query token per sequence over a paged KV cache (decode): for sequence
    /// `b` and head `h`, `softmax(scale · q[b, h] · Kᵀ) · V` over the sequence's first
    /// `seq_lens[b]` tokens (the tokens already written, the new one included), each found
    /// through `block_table[b]` as in [`Context::kv_write`]; the maximum score is subtracted
    /// before `exp`. `q` is `[batch, n_head, head_dim]`, the caches
    /// `[num_blocks, block_tokens, n_head, head_dim]` of `q`'s element type, `block_table`
    /// `[batch, max_blocks]` and `seq_lens` `[batch]` f32 tensors of exact integers; sequences
    /// of different lengths share one dispatch (one workgroup per sequence and head). Returns
    /// `[batch, n_head, head_dim]`. A length that is not an integer in
    /// `[1, max_blocks · block_tokens]`, or a block id among the sequence's tokens that is not an
    /// integer in `[0, num_blocks)`, gives NaN for every head of that sequence (block 0 is read
    /// in its place).
    ///
    /// Errors: those of [`Context::kv_write`] (with `q` for the new tokens);
    /// [`ComputeError::InvalidShape`] for a `head_dim` above 256;
    /// [`ComputeError::InvalidScalar`] for a `scale` that is not finite.
    pub fn paged_attention_decode(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        seq_lens: &Tensor,
        scale: f32,
    ) -> Result<Tensor, ComputeError> {
        let tokens = Tokens::Pair(q, q);
        self.attend(
            tokens,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            scale,
            Lengths::Given,
        )
    }

    /// [`Context::paged_attention_decode`] with each sequence's query taken from a fused
    /// query-key-value tensor `qkv` (`[batch, 3, n_head, head_dim]`, see
    /// [`Context::kv_write_qkv`]). Returns `[batch, n_head, head_dim]`. Errors as
    /// [`Context::paged_attention_decode`], the fused tensor in place of `q`.
    pub fn paged_attention_decode_qkv(
        &self,
        qkv: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        seq_lens: &Tensor,
        scale: f32,
    ) -> Result<Tensor, ComputeError> {
        let tokens = Tokens::Fused(qkv);
        self.attend(
            tokens,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            scale,
            Lengths::Given,
        )
    }

    /// [`Context::paged_attention_decode_qkv`] with each row's length read as its position
    /// plus one (`positions`, `[batch]`: the row's own token included), so that a step's
    /// positions serve as its lengths without an op between. Errors as
    /// [`Context::paged_attention_decode_qkv`], `positions` in place of the lengths.
    pub fn paged_attention_decode_qkv_at(
        &self,
        qkv: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        positions: &Tensor,
        scale: f32,
    ) -> Result<Tensor, ComputeError> {
        let tokens = Tokens::Fused(qkv);
        self.attend(
            tokens,
            k_cache,
            v_cache,
            block_table,
            positions,
            scale,
            Lengths::Positions,
        )
    }

    /// Decode rows' cache write and attention in one dispatch: for each row `b` of a fused
    /// query-key-value tensor `qkv` (`[batch, 3, n_head, head_dim]`), its key and value are
    /// written into the caches at `positions[b]` through `block_table[b]` (as
    /// [`Context::kv_write_qkv`] writes them), and its query attends over its sequence's tokens
    /// `0..=positions[b]` (as [`Context::paged_attention_decode_qkv`] with lengths
    /// `positions + 1`). Returns `[batch, n_head, head_dim]`.
    ///
    /// **Contract**: every row is a different sequence's new token — no row writes a block
    /// slot that another row of the same call reads or writes — as in a decode step (one new
    /// token per running sequence). The share of the attention that holds a row's new token
    /// writes it before reading it; nothing orders one row's write before another row's read,
    /// so rows of one sequence (a prompt's chunk) must use [`Context::kv_write_qkv`] then
    /// [`Context::paged_attention_decode_qkv`] instead, or they may read stale keys. The
    /// contract cannot be checked here (the tables are on the GPU): the caller keeps it.
    /// A position whose length is out of range, or an invalid block id, gives NaN rows and
    /// writes nothing, as the two ops do.
    ///
    /// Errors: those of [`Context::paged_attention_decode_qkv`], `positions` in place of the
    /// lengths.
    pub fn paged_attention_decode_write_qkv(
        &self,
        qkv: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        positions: &Tensor,
        scale: f32,
    ) -> Result<Tensor, ComputeError> {
        let tokens = Tokens::Fused(qkv);
        self.attend(
            tokens,
            k_cache,
            v_cache,
            block_table,
            positions,
            scale,
            Lengths::PositionsWriting,
        )
    }

    /// The decode attention of [`Context::paged_attention_decode`] over the queries of `tokens`,
    /// the lengths operand read as `lengths` says.
    // Long: the one-pass and the split (partial, then combine) recordings side by side.
    #[allow(clippy::too_many_arguments)] // the attention's operands, and how to read one
    fn attend(
        &self,
        tokens: Tokens<'_>,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        seq_lens: &Tensor,
        scale: f32,
        lengths: Lengths,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "paged_attention_decode";
        let q = tokens.first();
        for tensor in [q, k_cache, v_cache, block_table, seq_lens] {
            self.check_owner(OP, tensor)?;
        }
        let paged = paged_shapes(OP, k_cache, v_cache, tokens, block_table, seq_lens)?;
        check_attention(OP, q, &paged, scale)?;
        let dtype = common_dtype(OP, &[q, k_cache, v_cache])?;
        let pairs = paged.batch * paged.n_head;
        let parts = attention_parts(
            pairs,
            paged.max_blocks * paged.block_tokens,
            self.options().matmul.min_workgroups as usize,
        );
        let (workgroups, grid_x) = grid_1d(self, OP, (pairs * parts) as u64)?;
        let params = PagedAttentionParams {
            batch: kernel_u32(OP, "batch", paged.batch)?,
            n_head: kernel_u32(OP, "heads", paged.n_head)?,
            head_dim_parts: kernel_u32(OP, "head_dim", paged.head_dim)?
                | (parts as u32) << 16
                | u32::from(!matches!(lengths, Lengths::Given)) << 30
                | u32::from(matches!(lengths, Lengths::PositionsWriting)) << 29
                | u32::from(matches!(tokens, Tokens::Fused(_))) << 31,
            block_tokens: kernel_u32(OP, "block_tokens", paged.block_tokens)?,
            num_blocks: kernel_u32(OP, "blocks", paged.num_blocks)?,
            max_blocks: kernel_u32(OP, "max_blocks", paged.max_blocks)?,
            grid_x,
            scale,
        };
        self.before_op()?;
        let shape = vec![paged.batch, paged.n_head, paged.head_dim];
        let output = self.allocate_output(
            OP,
            shape,
            paged.batch * paged.n_head * paged.head_dim,
            dtype,
        )?;
        let bindings = |first: &Tensor, last: &Tensor| {
            [first, k_cache, v_cache, block_table, seq_lens, last].map(|t| Arc::clone(&t.storage))
        };
        // Heads of whole vec4s (GPT-2's 64) read q and the caches as vec4s.
        let source = if paged.head_dim % 4 == 0 {
            Source::PagedAttentionVec4
        } else {
            Source::PagedAttention
        };
        let attend = KernelKey::plain(source, OP);
        if parts == 1 {
            let bound = bindings(q, &output);
            self.record(Dispatch {
                kernel: attend.typed(ElementTypes::same(dtype)),
                params: ParamsBlock::new(&params),
                bindings: &bound.iter().collect::<Vec<_>>(),
                workgroups,
            })?;
            return Ok(output);
        }
        // Each share's record: head_dim sums, its max and its sum of weights, in f32.
        let records = pairs * parts * (paged.head_dim + 2);
        let partial = self.allocate_output(
            "paged attention partial",
            vec![records],
            records,
            DType::F32,
        )?;
        let bound = bindings(q, &partial);
        self.record(Dispatch {
            kernel: attend.typed(ElementTypes {
                input: dtype,
                output: DType::F32,
            }),
            params: ParamsBlock::new(&params),
            bindings: &bound.iter().collect::<Vec<_>>(),
            workgroups,
        })?;
        let (workgroups, grid_x) = grid_1d(self, OP, pairs as u64)?;
        let bound = bindings(&partial, &output);
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::PagedAttention, "paged_attention_combine").typed(
                ElementTypes {
                    input: DType::F32,
                    output: dtype,
                },
            ),
            params: ParamsBlock::new(&PagedAttentionParams { grid_x, ..params }),
            bindings: &bound.iter().collect::<Vec<_>>(),
            workgroups,
        })?;
        Ok(output)
    }
}

/// Refuses a head size above one workgroup's invocations and a scale that is not finite.
fn check_attention(
    op: &'static str,
    q: &Tensor,
    paged: &Paged,
    scale: f32,
) -> Result<(), ComputeError> {
    if paged.head_dim > WORKGROUP_SIZE {
        return Err(ComputeError::InvalidShape {
            op,
            shape: q.shape().to_vec(),
            reason: "head_dim above 256 (one invocation of 256 per output)",
        });
    }
    if !scale.is_finite() {
        return Err(ComputeError::InvalidScalar {
            op,
            what: "scale",
            value: scale,
            expected: "finite",
        });
    }
    Ok(())
}

/// Workgroups per (sequence, head) of the decode attention: enough shares of each sequence's
/// tokens that `pairs` pairs make at least twice `min_workgroups` workgroups (the GPU's fill),
/// at most one share per 256 of the table's `positions` and at most 16; 1 where the pairs alone
/// fill the GPU (a prefill's rows).
fn attention_parts(pairs: usize, positions: usize, min_workgroups: usize) -> usize {
    let wanted = (2 * min_workgroups).div_ceil(pairs.max(1));
    wanted.min(positions.div_ceil(256)).clamp(1, 16)
}

/// The sizes of a paged cache (`k_cache`, `v_cache`), its tokens (`k_new`, `v_new`:
/// `[batch, n_head, head_dim]`, `q` twice for attention), its block table
/// (`[batch, max_blocks]`) and its per-sequence integers (`[batch]`), checked against each
/// other (the element types apart, which [`common_dtype`] checks). Long: one check a rule,
/// each with its own message.
fn paged_shapes(
    op: &'static str,
    k_cache: &Tensor,
    v_cache: &Tensor,
    tokens: Tokens<'_>,
    block_table: &Tensor,
    per_sequence: &Tensor,
) -> Result<Paged, ComputeError> {
    let k_new = tokens.first();
    let invalid = |tensor: &Tensor, reason| ComputeError::InvalidShape {
        op,
        shape: tensor.shape().to_vec(),
        reason,
    };
    let mismatch = |left: &Tensor, right: &Tensor, expected| ComputeError::ShapeMismatch {
        op,
        left: left.shape().to_vec(),
        right: right.shape().to_vec(),
        expected,
    };
    let [num_blocks, block_tokens, n_head, head_dim] = *k_cache.shape() else {
        return Err(invalid(
            k_cache,
            "a KV cache is [num_blocks, block_tokens, n_head, head_dim]",
        ));
    };
    if v_cache.shape() != k_cache.shape() {
        return Err(mismatch(k_cache, v_cache, "K and V caches of one shape"));
    }
    if Arc::ptr_eq(&k_cache.storage, &v_cache.storage) {
        return Err(mismatch(
            k_cache,
            v_cache,
            "K and V caches that are two tensors",
        ));
    }
    let (batch, heads, dim) = match (tokens, k_new.shape()) {
        (Tokens::Pair(..), &[batch, heads, dim]) => (batch, heads, dim),
        (Tokens::Fused(_), &[batch, 3, heads, dim]) => (batch, heads, dim),
        (Tokens::Pair(..), _) => {
            return Err(invalid(k_new, "tokens are [batch, n_head, head_dim]"))
        }
        (Tokens::Fused(_), _) => {
            return Err(invalid(
                k_new,
                "fused tokens are [batch, 3, n_head, head_dim] (query, key, value)",
            ))
        }
    };
    if heads != n_head || dim != head_dim {
        return Err(mismatch(
            k_cache,
            k_new,
            "tokens of the cache's n_head and head_dim",
        ));
    }
    if let Tokens::Pair(k_new, v_new) = tokens {
        if v_new.shape() != k_new.shape() {
            return Err(mismatch(k_new, v_new, "new K and V of one shape"));
        }
    }
    let [table_batch, max_blocks] = *block_table.shape() else {
        return Err(invalid(block_table, "a block table is [batch, max_blocks]"));
    };
    if table_batch != batch {
        return Err(mismatch(
            k_new,
            block_table,
            "a block table of one row per sequence",
        ));
    }
    if per_sequence.shape() != [batch] {
        return Err(mismatch(
            k_new,
            per_sequence,
            "positions or lengths of shape [batch]",
        ));
    }
    for integers in [block_table, per_sequence] {
        if integers.dtype() != DType::F32 {
            return Err(ComputeError::DTypeMismatch {
                op,
                left: DType::F32,
                right: integers.dtype(),
            });
        }
    }
    let positions = max_blocks.saturating_mul(block_tokens);
    if num_blocks > EXACT_F32_INTEGERS || positions > EXACT_F32_INTEGERS {
        return Err(invalid(
            block_table,
            "more than 2^24 blocks or table positions (ids are f32, exact below 2^24)",
        ));
    }
    Ok(Paged {
        num_blocks,
        block_tokens,
        n_head,
        head_dim,
        batch,
        max_blocks,
    })
}

/// Refuses the caches (the first two of `tensors`, written in place) when either is also
/// another of `tensors`: [`ComputeError::AliasedCache`].
fn distinct_caches(op: &'static str, tensors: &[&Tensor]) -> Result<(), ComputeError> {
    let aliased = tensors[..2].iter().enumerate().any(|(index, cache)| {
        tensors
            .iter()
            .enumerate()
            .any(|(other, tensor)| other != index && Arc::ptr_eq(&cache.storage, &tensor.storage))
    });
    if aliased {
        return Err(ComputeError::AliasedCache { op });
    }
    Ok(())
}
