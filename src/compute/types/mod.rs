//! The ground floor of `compute`: the words its other modules share, and nothing that uses them.
//! It imports no other module of `compute`; every other module builds on it. One file per
//! concern:
//!
//! - `error.rs`: [`ComputeError`], what an op, an upload or a read-back refuses with;
//! - `dtype.rs`: [`DType`], what a tensor's elements are stored as, [`ElementTypes`], what one
//!   kernel variant loads and stores, the bytes a tensor takes ([`tensor_bytes`]) and the host's
//!   conversions of elements ([`encode_elements`], [`decode_elements`]);
//! - `options.rs`: the user's choices: [`ShaderChecks`], [`Activation`], [`Autotune`],
//!   [`MatmulOptions`];
//! - `tiles.rs`: [`MatmulTiles`], the tiled matmul's block tiles (the named ones and the limits
//!   each needs);
//! - `coop.rs`: [`CoopTiles`], the block tiles of the matmul on cooperative matrices (f16 on
//!   the tensor cores) and the limits each needs;
//! - `caps.rs`: [`DeviceCaps`], what the device offers the choice of a kernel, as plain data,
//!   and [`MatmulDevice`], what a context's matmuls keep of their device (those caps, the
//!   autotuner's choices);
//! - `kernel.rs`: which kernel runs ([`Source`], [`Variant`], [`KernelKey`]), and each variant's
//!   facts, described once: its WGSL constants, its label, and the epilogue it can fold;
//! - `params.rs`: each kernel's parameters, one `#[repr(C)]` [`bytemuck::Pod`] struct per
//!   kernel's uniform, with a WGSL `struct` of the same name in its shader (a test in
//!   `kernels.rs` checks with naga that both have the same member offsets and size), carried as
//!   a [`ParamsBlock`], the bytes of its slot in the context's uniform ring; and the size checks
//!   [`element_count`], [`kernel_u32`], [`grid_1d_within`].

mod caps;
mod coop;
mod dtype;
mod error;
mod kernel;
mod options;
mod params;
mod tiles;

pub(crate) use caps::{Choices, DeviceCaps, MatmulDevice, TunedChoices};
pub use coop::{CoopProbe, CoopTiles};
pub use dtype::DType;
pub(crate) use dtype::{decode_elements, encode_elements, tensor_bytes, ElementTypes};
pub use error::ComputeError;
pub(crate) use kernel::{
    narrow_grouped, narrow_sum_rows, FusedEpilogue, KernelKey, Source, Variant,
};
pub use options::{Activation, Autotune, MatmulOptions, ShaderChecks};
pub(crate) use params::{
    element_count, grid_1d_within, group0_entries, kernel_u32, ElementwiseParams, EmbeddingParams,
    EmbeddingSumParams, KvWriteParams, LayerNormParams, MatmulParams, NarrowParams,
    PagedAttentionParams, ParamsBlock, ReduceParams, RowsParams, SoftmaxRowsParams,
    MAX_STORAGE_BINDINGS, PARAMS_BYTES,
};
pub use tiles::MatmulTiles;
