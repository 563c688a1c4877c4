//! What one dispatch reads: each kernel's `#[repr(C)]` parameter struct, carried as a
//! [`ParamsBlock`], and the size checks ([`element_count`], [`kernel_u32`]) that keep sizes within
//! the kernels' `u32` parameters.

use super::error::ComputeError;

/// Bytes of the uniform binding through which every kernel reads its parameters (binding 0, at a
/// dynamic offset into the context's ring): room for the largest parameter struct.
pub(crate) const PARAMS_BYTES: u64 = 32;

/// The entries of group 0 of every kernel, the crate's and the user's: the parameters' uniform
/// at binding 0 (dynamic offset, `params_binding_bytes` bound; none where that is 0), then
/// `storage` storage buffers at bindings `1..=storage`, always `read_write` (allocations share
/// segment buffers: see the module docs of `compute`).
pub(crate) fn group0_entries(
    params_binding_bytes: u64,
    storage: usize,
) -> Vec<wgpu::BindGroupLayoutEntry> {
    let params =
        std::num::NonZeroU64::new(params_binding_bytes).map(|bytes| wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: Some(bytes),
            },
            count: None,
        });
    let tensors = (1u32..)
        .take(storage)
        .map(|binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    params.into_iter().chain(tensors).collect()
}

/// Most storage bindings of any kernel: the token and position gather with fed ids
/// (`embedding_sum`: eight), within WebGPU's default of 8 per stage; the narrow matmul with a
/// residual and a layer-norm prologue takes seven (A, B, C, the bias, the residual, gamma and
/// beta).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 8;

/// A kernel's parameter struct as the bytes of its uniform slot (zero past the struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ParamsBlock([u8; PARAMS_BYTES as usize]);

impl ParamsBlock {
    /// The block of `params`, one of the parameter structs below.
    pub(crate) fn new<P: bytemuck::Pod>(params: &P) -> Self {
        const { assert!(size_of::<P>() <= PARAMS_BYTES as usize) };
        let bytes = bytemuck::bytes_of(params);
        let mut block = [0; PARAMS_BYTES as usize];
        block[..bytes.len()].copy_from_slice(bytes);
        Self(block)
    }

    /// The parameter struct the block was made from ([`ParamsBlock::new`]'s inverse).
    pub(crate) fn read<P: bytemuck::Pod>(&self) -> P {
        bytemuck::pod_read_unaligned(&self.0[..size_of::<P>()])
    }

    /// The bytes the uniform slot holds.
    pub(crate) fn bytes(&self) -> &[u8; PARAMS_BYTES as usize] {
        &self.0
    }
}

/// The parameters of the element-wise kernels (`shaders/unary.wgsl`, `shaders/binary.wgsl`);
/// WGSL `ElementwiseParams` in `shaders/common.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ElementwiseParams {
    /// vec4s to compute: ⌈len / 4⌉.
    pub(crate) len_vec4: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Columns of `x` (the bias length of `add_bias`); 0 for the other kernels.
    pub(crate) cols: u32,
    /// The scalar of the `*_scalar` kernels; 0 for the others.
    pub(crate) scalar: f32,
}

/// The parameters of the tiled matmul; WGSL `MatmulParams` in `shaders/matmul.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MatmulParams {
    pub(crate) m: u32,
    pub(crate) n: u32,
    pub(crate) k: u32,
    /// Depth of K per split (a multiple of the tile's `bk`); K when there is no split.
    pub(crate) k_chunk: u32,
    /// Block tiles along N.
    pub(crate) tiles_n: u32,
    /// Block tiles along M.
    pub(crate) tiles_m: u32,
    /// Workgroups per row of the grid: `tiles_n` where the grid is `[tiles_n, tiles_m]`, else
    /// the x of a grid over `tiles_n · tiles_m` linear ids.
    pub(crate) grid_x: u32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The parameters of the narrow matmul; WGSL `NarrowParams` in `shaders/matmul_narrow.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct NarrowParams {
    /// N / 4.
    pub(crate) n4: u32,
    /// K / 4.
    pub(crate) k4: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// vec4 rows of K per split along the grid's z (`k4` without a split).
    pub(crate) k_chunk4: u32,
    /// Workgroups (tiles of vec4 columns) per group of rows.
    pub(crate) tiles: u32,
    /// Rows of A and C (M).
    pub(crate) m: u32,
    /// The layer-norm prologue's epsilon (unused without it: 0).
    pub(crate) eps: f32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The parameters of the split-K reduction; WGSL `ReduceParams` in
/// `shaders/matmul_reduce.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ReduceParams {
    /// M · N.
    pub(crate) len: u32,
    pub(crate) n: u32,
    pub(crate) splits: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
}

/// The parameters of the row reductions; WGSL `RowsParams` in `shaders/rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RowsParams {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// `take_columns`: the columns kept; `argmax_rows_partial` and `argmax_rows_combine`: the
    /// parts of a row (2,048 columns each); 0 for the other kernels.
    pub(crate) aux: u32,
}

/// The parameters of the layer norm; WGSL `LayerNormParams` in `shaders/layer_norm.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct LayerNormParams {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Added to the variance before its square root.
    pub(crate) eps: f32,
}

/// The parameters of the scaled, optionally causal softmax; WGSL `SoftmaxRowsParams` in
/// `shaders/softmax_rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SoftmaxRowsParams {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// What the scores are multiplied by before the softmax.
    pub(crate) scale: f32,
    /// Rows per block of queries: row `r` is query `r mod queries`.
    pub(crate) queries: u32,
    /// Query `i` keeps the columns `≤ i + offset` (at most `cols`).
    pub(crate) offset: u32,
    /// 1: the causal mask is on; 0: off.
    pub(crate) causal: u32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The parameters of the summed token and position gather; WGSL `EmbeddingSumParams` in
/// `shaders/embedding_sum.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct EmbeddingSumParams {
    /// Elements of the output: ids · width.
    pub(crate) len: u32,
    /// Columns of the tables.
    pub(crate) width: u32,
    /// Rows of the token table.
    pub(crate) rows: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Rows of the position table.
    pub(crate) position_rows: u32,
    /// Entries of `previous` (ids fed from the GPU), 0 for none.
    pub(crate) fed: u32,
    /// Unused (0).
    pub(crate) pad0: u32,
    /// Unused (0).
    pub(crate) pad1: u32,
}

/// The parameters of the embedding gather; WGSL `EmbeddingParams` in `shaders/embedding.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct EmbeddingParams {
    /// Elements of the output: ids · width.
    pub(crate) len: u32,
    /// Columns of the table.
    pub(crate) width: u32,
    /// Rows of this dispatch's block of the table.
    pub(crate) rows: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// The id of the block's first row.
    pub(crate) first: u32,
    /// 1: ids outside the block write NaN (the first block's dispatch); 0: they write nothing.
    pub(crate) fill: u32,
    /// Unused (0).
    pub(crate) pad0: u32,
    /// Unused (0).
    pub(crate) pad1: u32,
}

/// The parameters of the write of new tokens into a paged KV cache; WGSL `KvWriteParams` in
/// `shaders/kv_write.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct KvWriteParams {
    /// Sequences, one new token each.
    pub(crate) batch: u32,
    pub(crate) n_head: u32,
    pub(crate) head_dim: u32,
    /// Token slots per block of the cache.
    pub(crate) block_tokens: u32,
    /// Blocks of the cache.
    pub(crate) num_blocks: u32,
    /// Columns of the block table.
    pub(crate) max_blocks: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// Unused (0).
    pub(crate) pad: u32,
}

/// The parameters of the decode attention over a paged KV cache; WGSL `PagedAttentionParams` in
/// `shaders/paged_attention.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct PagedAttentionParams {
    /// Sequences, one query token each.
    pub(crate) batch: u32,
    pub(crate) n_head: u32,
    /// `head_dim | parts << 16 | fused << 31`: the head size (at most 256), the workgroups per
    /// (sequence, head), each over its share of the tokens (past 1 they write partial records
    /// that `paged_attention_combine` adds), and 1 where the queries are the first third of each
    /// row of a fused `[batch, 3, n_head, head_dim]` query-key-value tensor.
    pub(crate) head_dim_parts: u32,
    /// Token slots per block of the cache.
    pub(crate) block_tokens: u32,
    /// Blocks of the cache.
    pub(crate) num_blocks: u32,
    /// Columns of the block table.
    pub(crate) max_blocks: u32,
    /// Workgroups per row of the grid.
    pub(crate) grid_x: u32,
    /// What the scores are multiplied by before the softmax.
    pub(crate) scale: f32,
}

/// The elements of `shape`; refuses shapes without elements and overflowing ones.
pub(crate) fn element_count(op: &'static str, shape: &[usize]) -> Result<usize, ComputeError> {
    let invalid = |reason| ComputeError::InvalidShape {
        op,
        shape: shape.to_vec(),
        reason,
    };
    if shape.is_empty() {
        return Err(invalid("a tensor has at least one dimension"));
    }
    let len = shape
        .iter()
        .try_fold(1usize, |len, &dim| len.checked_mul(dim))
        .ok_or_else(|| invalid("the element count overflows"))?;
    if len == 0 {
        return Err(invalid("tensors without elements are not supported"));
    }
    if len > (u32::MAX / 4) as usize {
        return Err(invalid("more than 2^30 elements (kernels index with u32)"));
    }
    Ok(len)
}

/// `value` (a size `what` of op `op`) as a kernel's `u32` parameter, or
/// [`ComputeError::ParameterOverflow`].
pub(crate) fn kernel_u32<T>(
    op: &'static str,
    what: &'static str,
    value: T,
) -> Result<u32, ComputeError>
where
    T: Copy + TryInto<u32> + TryInto<u64>,
{
    TryInto::<u32>::try_into(value).map_err(|_| ComputeError::ParameterOverflow {
        op,
        what,
        value: TryInto::<u64>::try_into(value).unwrap_or(u64::MAX),
    })
}

/// The grid of `workgroups` workgroups of a 1-D kernel, on a device whose grids take at most
/// `max_x` workgroups along x and `max_y` along y: `[x, 1, 1]`, or `[x, y, 1]` with
/// `x · y ≥ workgroups` when more than the x dimension holds (kernels recover the linear index
/// from `x`, passed in their parameters). Returns the grid and `x`.
pub(crate) fn grid_1d_within(
    op: &'static str,
    workgroups: u64,
    max_x: u32,
    max_y: u32,
) -> Result<([u32; 3], u32), ComputeError> {
    let (max_x, max_y) = (u64::from(max_x), u64::from(max_y));
    if workgroups <= max_x {
        let x = kernel_u32(op, "workgroups", workgroups)?;
        return Ok(([x, 1, 1], x));
    }
    let y = workgroups.div_ceil(max_x);
    if y > max_y {
        return Err(ComputeError::ExceedsLimit {
            op,
            what: "workgroups",
            value: workgroups,
            limit_name: "max_compute_workgroups_per_dimension squared",
            limit: max_x * max_y,
        });
    }
    let x = workgroups.div_ceil(y);
    let x = kernel_u32(op, "workgroups along x", x)?;
    let y = kernel_u32(op, "workgroups along y", y)?;
    Ok(([x, y, 1], x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::types::dtype::{tensor_bytes, DType};

    #[test]
    fn sizes_beyond_u32_are_typed_errors() {
        assert_eq!(kernel_u32("op", "rows", 7usize), Ok(7));
        assert_eq!(kernel_u32("op", "rows", u64::from(u32::MAX)), Ok(u32::MAX));
        assert_eq!(
            kernel_u32("op", "rows", u64::from(u32::MAX) + 1),
            Err(ComputeError::ParameterOverflow {
                op: "op",
                what: "rows",
                value: 1 << 32
            })
        );
        // Fewer than 2^30 elements: their byte offsets fit a u32.
        assert_eq!(
            element_count("op", &[3, (1 << 30) / 3]),
            Ok(3 * ((1 << 30) / 3))
        );
        assert!(element_count("op", &[1 << 15, 1 << 15]).is_err());
        assert!(element_count("op", &[usize::MAX, 2]).is_err());
        assert_eq!(tensor_bytes(1, DType::F32), 16);
        assert_eq!(tensor_bytes(5, DType::F32), 32);
        // f16: whole vec4s of f16 (8 bytes) and the same 16-byte rounding.
        assert_eq!(tensor_bytes(1, DType::F16), 16);
        assert_eq!(tensor_bytes(8, DType::F16), 16);
        assert_eq!(tensor_bytes(9, DType::F16), 32);
    }

    #[test]
    fn a_params_block_holds_the_struct_then_zeros() {
        let params = ReduceParams {
            len: 1,
            n: 2,
            splits: 3,
            grid_x: 4,
        };
        let block = ParamsBlock::new(&params);
        let words: Vec<u32> = block
            .bytes()
            .chunks_exact(4)
            .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
            .collect();
        assert_eq!(words, [1, 2, 3, 4, 0, 0, 0, 0]);
    }
}
