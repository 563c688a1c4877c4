//! The ops a transformer's forward needs beyond the element-wise ones and the products: layer
//! norm, the scaled and causal softmax of attention scores, the embedding gather and the greedy
//! choice of the next token (argmax). Kernels: `shaders/layer_norm.wgsl`,
//! `shaders/softmax_rows.wgsl` (both after `shaders/workgroup_reduce.wgsl`),
//! `shaders/embedding.wgsl`, `shaders/argmax_rows.wgsl`. Each is recorded through
//! [`Context::record`], so it runs eagerly and is captured into plans alike. On f16 tensors the
//! kernels load f16, compute in f32 and round once as they store (indices are f32 whatever the
//! input). CPU twins of the same names in [`crate::compute::cpu`].
//!
//! Token ids and indices: the crate has no integer element type, so they travel as f32 tensors
//! of exact integers (exact up to 2²⁴: tables of more rows and rows of more columns are
//! refused).

use super::{common_dtype, grid_1d};
use crate::compute::context::{Context, Dispatch};
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    element_count, kernel_u32, ComputeError, DType, ElementTypes, EmbeddingParams,
    EmbeddingSumParams, KernelKey, LayerNormParams, ParamsBlock, RowsParams, SoftmaxRowsParams,
    Source,
};

/// Ids a step takes from the GPU for [`Context::embedding_sum`]: row `t`'s id is
/// `ids[t] + fed[t] · previous[picks[t]]` where `fed[t] ≠ 0`. All f32: `fed` and `picks`
/// `[rows]`, `previous` `[samples]` (the previous step's sampled tokens).
#[derive(Debug, Clone, Copy)]
pub struct FedIds<'a> {
    /// Nonzero for the rows whose token is a previous sample.
    pub fed: &'a Tensor,
    /// The previous step's sampled tokens.
    pub previous: &'a Tensor,
    /// Each fed row's index into `previous`.
    pub picks: &'a Tensor,
}

/// The largest integer below which every integer is an f32: ids and indices are exact below it.
const EXACT_F32_INTEGERS: usize = 1 << 24;

/// Invocations per workgroup of the embedding gather.
const WORKGROUP_SIZE: u64 = 256;

/// Columns of a row one workgroup of `argmax_rows` takes: longer rows go in two passes.
const ARGMAX_PART: usize = 2048;

impl Context {
    /// Layer normalization over the last dimension: for each row of `x` (`[.., cols]`),
    /// `y = (x − mean) / √(var + eps) · gamma + beta` with the biased variance (over `cols`, as
    /// PyTorch's `layer_norm`). `gamma` and `beta` are `[cols]`, of `x`'s element type. Same shape
    /// as `x`.
    ///
    /// Errors: [`ComputeError::ShapeMismatch`] for `gamma` or `beta` not of shape `[cols]`,
    /// [`ComputeError::DTypeMismatch`] for operands of different element types,
    /// [`ComputeError::InvalidScalar`] for an `eps` that is not finite or is negative.
    pub fn layer_norm(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "layer_norm";
        for tensor in [x, gamma, beta] {
            self.check_owner(OP, tensor)?;
        }
        let (rows, cols) = x.rows_cols();
        for affine in [gamma, beta] {
            if affine.shape() != [cols] {
                return Err(ComputeError::ShapeMismatch {
                    op: OP,
                    left: x.shape().to_vec(),
                    right: affine.shape().to_vec(),
                    expected: "gamma and beta of shape [last dimension of x]",
                });
            }
        }
        if !eps.is_finite() || eps < 0.0 {
            return Err(ComputeError::InvalidScalar {
                op: OP,
                what: "eps",
                value: eps,
                expected: "finite and not negative",
            });
        }
        let dtype = common_dtype(OP, &[x, gamma, beta])?;
        let (workgroups, grid_x) = grid_1d(self, OP, rows as u64)?;
        let params = LayerNormParams {
            rows: kernel_u32(OP, "rows", rows)?,
            cols: kernel_u32(OP, "columns", cols)?,
            grid_x,
            eps,
        };
        self.before_op()?;
        let output = self.allocate_output(OP, x.shape().to_vec(), x.len(), dtype)?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::LayerNorm, OP).typed(ElementTypes::same(dtype)),
            params: ParamsBlock::new(&params),
            bindings: &[&x.storage, &gamma.storage, &beta.storage, &output.storage],
            workgroups,
        })?;
        Ok(output)
    }

    /// Softmax over the last dimension of `scale · x`, numerically stable (the largest kept
    /// score is subtracted before `exp`), optionally causal. Same shape as `x`.
    ///
    /// `x` holds attention scores `[.., queries, keys]` (a tensor of one dimension is one
    /// query). With `causal = Some(offset)`, query `i` (the index along the second-to-last
    /// dimension) attends to the keys `j ≤ i + offset` and its other columns are 0: `offset` 0
    /// for a prefill whose queries are its keys, `past` for `queries` new tokens after `past`
    /// cached ones (`keys = past + queries`). Every row keeps at least key 0. `None` keeps every
    /// key. `scale` 1 is the plain softmax (`1/√head_dim` for attention).
    ///
    /// Errors: [`ComputeError::InvalidScalar`] for a `scale` that is not finite.
    pub fn softmax_rows(
        &self,
        x: &Tensor,
        scale: f32,
        causal: Option<usize>,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "softmax_rows";
        self.check_owner(OP, x)?;
        if !scale.is_finite() {
            return Err(ComputeError::InvalidScalar {
                op: OP,
                what: "scale",
                value: scale,
                expected: "finite",
            });
        }
        let (rows, cols) = x.rows_cols();
        let queries = match x.shape() {
            [.., queries, _] => *queries,
            _ => 1,
        };
        let (workgroups, grid_x) = grid_1d(self, OP, rows as u64)?;
        let params = SoftmaxRowsParams {
            rows: kernel_u32(OP, "rows", rows)?,
            cols: kernel_u32(OP, "columns", cols)?,
            grid_x,
            scale,
            queries: kernel_u32(OP, "queries", queries)?,
            // At most the columns: every key is kept from there on, and the kernel's sum of
            // query and offset stays far below 2³².
            offset: kernel_u32(OP, "offset", causal.unwrap_or(0).min(cols))?,
            causal: u32::from(causal.is_some()),
            pad: 0,
        };
        let dtype = x.dtype();
        self.before_op()?;
        let output = self.allocate_output(OP, x.shape().to_vec(), x.len(), dtype)?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::SoftmaxRows, OP).typed(ElementTypes::same(dtype)),
            params: ParamsBlock::new(&params),
            bindings: &[&x.storage, &output.storage],
            workgroups,
        })?;
        Ok(output)
    }

    /// The rows of `table` (`[vocab, width]`) selected by `ids`, an f32 tensor of token ids
    /// (exact integers, any shape): shape `ids.shape() + [width]`, of the table's element type.
    /// The ids are read on the GPU, so this is the form a plan captures (an input of ids fed
    /// each replay). An id that is not an integer in `[0, vocab)` gives a row of NaN (the kernel
    /// never reads outside the table); [`Context::embedding_ids`] checks host ids instead. A
    /// table too large for one binding: [`Context::embedding_blocks`].
    ///
    /// Errors: [`ComputeError::InvalidShape`] for a table that is not 2-D or has more than 2²⁴
    /// rows (ids are exact f32 integers below that); [`ComputeError::DTypeMismatch`] for ids
    /// that are not f32.
    pub fn embedding(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor, ComputeError> {
        self.embedding_blocks(&[table], ids)
    }

    /// [`Context::embedding`] of a table given as blocks of rows, one after another (block `b`
    /// holds the ids from the sum of the rows before it): for a table beyond the device's
    /// largest binding (GPT-2's 50,257 × 768 f32 token table is 154 MB, above WebGPU's default
    /// 128 MiB), split by rows. One dispatch per block; the first writes NaN for every id that
    /// is none of its rows, each later one the rows of its ids.
    ///
    /// Errors: those of [`Context::embedding`] (the rows of all blocks together at most 2²⁴);
    /// [`ComputeError::InvalidShape`] for no blocks, [`ComputeError::ShapeMismatch`] for blocks
    /// of different widths, [`ComputeError::DTypeMismatch`] for blocks of different element
    /// types.
    pub fn embedding_blocks(
        &self,
        blocks: &[&Tensor],
        ids: &Tensor,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "embedding";
        for tensor in blocks.iter().chain([&ids]) {
            self.check_owner(OP, tensor)?;
        }
        let (_, width) = embedding_table(OP, blocks)?;
        if ids.dtype() != DType::F32 {
            return Err(ComputeError::DTypeMismatch {
                op: OP,
                left: DType::F32,
                right: ids.dtype(),
            });
        }
        let dtype = common_dtype(OP, blocks)?;
        let mut shape = ids.shape().to_vec();
        shape.push(width);
        let len = element_count(OP, &shape)?;
        let (workgroups, grid_x) = grid_1d(self, OP, (len as u64).div_ceil(WORKGROUP_SIZE))?;
        let kernel = KernelKey::plain(Source::Embedding, OP).typed(ElementTypes::same(dtype));
        // Compiled before the first block is recorded: the blocks are recorded whole or not at
        // all (sizes, grids and the kernel are checked here).
        self.prepare(&kernel)?;
        let mut first = 0;
        let mut params = Vec::with_capacity(blocks.len());
        for (index, block) in blocks.iter().enumerate() {
            let rows = block.shape()[0];
            params.push(EmbeddingParams {
                len: kernel_u32(OP, "elements", len)?,
                width: kernel_u32(OP, "width", width)?,
                rows: kernel_u32(OP, "rows", rows)?,
                grid_x,
                first: kernel_u32(OP, "rows", first)?,
                fill: u32::from(index == 0),
                pad0: 0,
                pad1: 0,
            });
            first += rows;
        }
        self.before_op()?;
        let output = self.allocate_output(OP, shape, len, dtype)?;
        for (block, params) in blocks.iter().zip(&params) {
            self.record(Dispatch {
                kernel,
                params: ParamsBlock::new(params),
                bindings: &[&block.storage, &ids.storage, &output.storage],
                workgroups,
            })?;
        }
        Ok(output)
    }

    /// [`Context::embedding`] of token ids given on the host: each is checked against the
    /// table's rows, then they are uploaded (as f32, exact) and gathered: `[ids.len(), width]`.
    /// While capturing, the ids are a constant of the plan: feed a plan's ids through an input
    /// and [`Context::embedding`] instead.
    ///
    /// Errors: [`ComputeError::IndexOutOfRange`] for an id at or past the table's rows and
    /// [`ComputeError::InvalidShape`] for no ids, both before anything is uploaded or
    /// recorded; those of [`Context::embedding`].
    pub fn embedding_ids(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor, ComputeError> {
        const OP: &str = "embedding_ids";
        self.check_owner(OP, table)?;
        let (vocab, _) = embedding_table(OP, &[table])?;
        if ids.is_empty() {
            return Err(ComputeError::InvalidShape {
                op: OP,
                shape: vec![0],
                reason: "no token ids",
            });
        }
        if let Some((position, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab)
        {
            return Err(ComputeError::IndexOutOfRange {
                op: OP,
                position,
                index: u64::from(id),
                len: vocab,
            });
        }
        // Exact: every id is below the table's rows, at most 2²⁴.
        let values: Vec<f32> = ids.iter().map(|&id| id as f32).collect();
        let ids = self.tensor(&values, &[ids.len()])?;
        self.embedding(table, &ids)
    }

    /// A transformer's first input in one gather: `table[id(t)] + positions_table[positions[t]]`
    /// for each row `t` (`[rows, width]`, of the tables' element type), token and position
    /// tables `[_, width]`, `ids` and `positions` `[rows]` f32 tensors of exact integers. With
    /// `fed` a row's id may come from the GPU: `id(t) = ids[t] + fed[t] · previous[picks[t]]`
    /// where `fed[t] ≠ 0` (a decode row whose token the previous step sampled; see
    /// [`StepRows`](crate::paging::StepRows)), else `ids[t]`. One dispatch where the device takes
    /// kernels of 8 storage bindings (WebGPU's default limit), else the gathers and the sum as
    /// separate ops (the same values). An id, position or pick that is not an integer row of
    /// its table (or index of `previous`) gives a row of NaN; nothing outside the tables is read.
    ///
    /// Errors: [`ComputeError::InvalidShape`] for tables that are not 2-D or of more than 2²⁴
    /// rows, or ids and positions that are not one row each; [`ComputeError::ShapeMismatch`]
    /// for tables of different widths or ids, positions and `fed`'s rows of different
    /// lengths; [`ComputeError::DTypeMismatch`] for tables of different element types or
    /// indices that are not f32.
    pub fn embedding_sum(
        &self,
        table: &Tensor,
        ids: &Tensor,
        positions_table: &Tensor,
        positions: &Tensor,
        fed: Option<FedIds<'_>>,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "embedding_sum";
        let mut indices = vec![ids, positions];
        if let Some(fed) = &fed {
            indices.extend([fed.fed, fed.previous, fed.picks]);
        }
        for tensor in indices.iter().copied().chain([table, positions_table]) {
            self.check_owner(OP, tensor)?;
        }
        let (rows, width) = embedding_table(OP, &[table])?;
        let (position_rows, _) = embedding_table(OP, &[positions_table])?;
        let dtype = common_dtype(OP, &[table, positions_table])?;
        if positions_table.shape()[1] != width {
            return Err(ComputeError::ShapeMismatch {
                op: OP,
                left: table.shape().to_vec(),
                right: positions_table.shape().to_vec(),
                expected: "token and position tables of one width",
            });
        }
        for tensor in &indices {
            if tensor.dtype() != DType::F32 {
                return Err(ComputeError::DTypeMismatch {
                    op: OP,
                    left: DType::F32,
                    right: tensor.dtype(),
                });
            }
            if tensor.shape().len() != 1 {
                return Err(ComputeError::InvalidShape {
                    op: OP,
                    shape: tensor.shape().to_vec(),
                    reason: "ids, positions, fed rows, picks and previous samples are 1-D",
                });
            }
        }
        let per_row = [
            Some(positions),
            fed.as_ref().map(|f| f.fed),
            fed.as_ref().map(|f| f.picks),
        ];
        for tensor in per_row.into_iter().flatten() {
            if tensor.shape() != ids.shape() {
                return Err(ComputeError::ShapeMismatch {
                    op: OP,
                    left: ids.shape().to_vec(),
                    right: tensor.shape().to_vec(),
                    expected: "one position, fed flag and pick a row",
                });
            }
        }
        let storage = Source::EmbeddingSum.storage_bindings();
        if (self.limits().max_storage_buffers_per_shader_stage as usize) < storage {
            // The same sums from the separate ops.
            let ids = match &fed {
                Some(fed) => {
                    let column = fed.previous.clone().reshape(&[fed.previous.len(), 1])?;
                    let taken = self.embedding(&column, fed.picks)?.reshape(&[ids.len()])?;
                    self.add(ids, &self.mul(fed.fed, &taken)?)?
                }
                None => ids.clone(),
            };
            let tokens = self.embedding(table, &ids)?;
            return self.add(&tokens, &self.embedding(positions_table, positions)?);
        }
        let shape = vec![ids.len(), width];
        let len = element_count(OP, &shape)?;
        let (workgroups, grid_x) = grid_1d(self, OP, (len as u64).div_ceil(WORKGROUP_SIZE))?;
        let params = EmbeddingSumParams {
            len: kernel_u32(OP, "elements", len)?,
            width: kernel_u32(OP, "width", width)?,
            rows: kernel_u32(OP, "rows", rows)?,
            grid_x,
            position_rows: kernel_u32(OP, "rows", position_rows)?,
            fed: match &fed {
                Some(fed) => kernel_u32(OP, "previous samples", fed.previous.len())?.max(1),
                None => 0,
            },
            pad0: 0,
            pad1: 0,
        };
        let kernel = KernelKey::plain(Source::EmbeddingSum, OP).typed(ElementTypes::same(dtype));
        self.before_op()?;
        let output = self.allocate_output(OP, shape, len, dtype)?;
        let (fed_rows, previous, picks) = match &fed {
            Some(fed) => (fed.fed, fed.previous, fed.picks),
            None => (ids, ids, ids),
        };
        self.record(Dispatch {
            kernel,
            params: ParamsBlock::new(&params),
            bindings: &[
                &table.storage,
                &ids.storage,
                &output.storage,
                &positions_table.storage,
                &positions.storage,
                &fed_rows.storage,
                &previous.storage,
                &picks.storage,
            ],
            workgroups,
        })?;
        Ok(output)
    }

    /// The index of the largest value of each row over the last dimension, the first on ties:
    /// `[.., cols]` → `[..]` (`[cols]` → `[1]`), f32 indices (exact) whatever `x`'s element type,
    /// so that a plan captures it (greedy decoding: the next token of each sequence's logits).
    /// A row holding NaN gives an unspecified index of the row. [`Context::argmax_rows_ids`]
    /// reads the indices back as integers.
    ///
    /// Errors: [`ComputeError::InvalidShape`] for rows of more than 2²⁴ columns (their indices
    /// are not all f32).
    pub fn argmax_rows(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        const OP: &str = "argmax_rows";
        self.check_owner(OP, x)?;
        let (rows, cols) = x.rows_cols();
        if cols > EXACT_F32_INTEGERS {
            return Err(ComputeError::InvalidShape {
                op: OP,
                shape: x.shape().to_vec(),
                reason: "rows of more than 2^24 columns (indices are f32, exact below 2^24)",
            });
        }
        let shape = match x.shape() {
            [_] => vec![1],
            [outer @ .., _] => outer.to_vec(),
            [] => vec![1],
        };
        let (workgroups, grid_x) = grid_1d(self, OP, rows as u64)?;
        let params = RowsParams {
            rows: kernel_u32(OP, "rows", rows)?,
            cols: kernel_u32(OP, "columns", cols)?,
            grid_x,
            aux: 0,
        };
        let types = ElementTypes {
            input: x.dtype(),
            output: DType::F32,
        };
        self.before_op()?;
        let output = self.allocate_output(OP, shape, rows, DType::F32)?;
        if cols <= ARGMAX_PART {
            self.record(Dispatch {
                kernel: KernelKey::plain(Source::ArgmaxRows, OP).typed(types),
                params: ParamsBlock::new(&params),
                bindings: &[&x.storage, &output.storage],
                workgroups,
            })?;
            return Ok(output);
        }
        // Long rows (a vocabulary's logits): a workgroup per part of a row, then one per row
        // adds the parts' records — a row alone would keep one workgroup busy for all of it.
        let parts = cols.div_ceil(ARGMAX_PART);
        let records = rows * parts * 2;
        let partial =
            self.allocate_output("argmax_rows partial", vec![records], records, DType::F32)?;
        let (part_groups, part_grid_x) = grid_1d(self, OP, (rows * parts) as u64)?;
        let aux = kernel_u32(OP, "parts", parts)?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::ArgmaxRows, "argmax_rows_partial").typed(types),
            params: ParamsBlock::new(&RowsParams {
                grid_x: part_grid_x,
                aux,
                ..params
            }),
            bindings: &[&x.storage, &partial.storage],
            workgroups: part_groups,
        })?;
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::ArgmaxRows, "argmax_rows_combine")
                .typed(ElementTypes::same(DType::F32)),
            params: ParamsBlock::new(&RowsParams { aux, ..params }),
            bindings: &[&partial.storage, &output.storage],
            workgroups,
        })?;
        Ok(output)
    }

    /// [`Context::argmax_rows`] read back as integers (submits the open batch and waits): one
    /// index per row.
    pub fn argmax_rows_ids(&self, x: &Tensor) -> Result<Vec<u32>, ComputeError> {
        let indices = self.argmax_rows(x)?;
        // Exact integers below 2²⁴, written by the kernel.
        Ok(self
            .read(&indices)?
            .into_iter()
            .map(|index| index as u32)
            .collect())
    }
}

/// `(vocab, width)` of an embedding table given as `blocks` of rows: each 2-D, of one width,
/// their rows together at most 2²⁴ (ids are exact f32 integers below that).
fn embedding_table(op: &'static str, blocks: &[&Tensor]) -> Result<(usize, usize), ComputeError> {
    let Some(first) = blocks.first() else {
        return Err(ComputeError::InvalidShape {
            op,
            shape: vec![0],
            reason: "an embedding table of no blocks",
        });
    };
    let mut vocab = 0usize;
    for block in blocks {
        let invalid = |reason| ComputeError::InvalidShape {
            op,
            shape: block.shape().to_vec(),
            reason,
        };
        let [rows, width] = *block.shape() else {
            return Err(invalid("an embedding table (or block) is [vocab, width]"));
        };
        if width != first.shape()[1] {
            return Err(ComputeError::ShapeMismatch {
                op,
                left: first.shape().to_vec(),
                right: block.shape().to_vec(),
                expected: "blocks of one width",
            });
        }
        vocab = vocab.saturating_add(rows);
        if vocab > EXACT_F32_INTEGERS {
            return Err(invalid(
                "a table of more than 2^24 rows (token ids are f32, exact below 2^24)",
            ));
        }
    }
    Ok((vocab, first.shape()[1]))
}
