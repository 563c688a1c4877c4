//! Compute: WGSL kernels on tensors whose storage is pool memory — the workloads whose
//! intermediates the pool manages.
//!
//! A [`Context`] records ops into one open compute pass of one command encoder and submits them in
//! batches through [`Pool::submit`](crate::Pool::submit); a [`Tensor`] is a pool
//! [`Allocation`](crate::Allocation) with a shape. Ops allocate their outputs (the intermediates)
//! from the pool; dropping a tensor gives its range back, reusable after the submission that
//! carries its last use (the pool's reuse rule). Reading a tensor back flushes the batch.
//!
//! ```no_run
//! use wgpu_pool::compute::{Context, ContextOptions};
//! use wgpu_pool::{request_gpu, LimitsChoice, Pool, PoolOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = request_gpu(LimitsChoice::Adapter)?;
//! let pool = Pool::new(&gpu, PoolOptions::default())?;
//! let context = Context::new(&pool, ContextOptions::default())?;
//! let a = context.tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let b = context.tensor(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
//! let c = context.matmul(&a, &b)?; // recorded, not yet submitted
//! let probabilities = context.softmax(&c)?; // same pass
//! drop(c); // reusable after the next submission
//! assert_eq!(probabilities.to_vec()?.len(), 4); // flushes, waits, reads back
//! # Ok(())
//! # }
//! ```
//!
//! # Kernels
//!
//! `shaders/` holds the WGSL sources; every kernel has a CPU twin of the same name in [`cpu`] that
//! the tests compare with: element-wise `relu`, `gelu`, `exp`, `neg`, `sqrt`, `add`, `sub`, `mul`,
//! `div`, `maximum` (also with a scalar), `add_bias` (row broadcast); `matmul` (block tiles in
//! workgroup memory, 8×8 outputs per invocation, vec4 loads, fused bias and activation, split-K);
//! row-wise `sum` and `softmax`. (The WGSL entry points of `exp` and `sqrt` are `exp_kernel` and
//! `sqrt_kernel`: WGSL's built-ins have those names.)
//!
//! # Element types
//!
//! A tensor holds f32 or, where the device has [`wgpu::Features::SHADER_F16`], f16 elements
//! ([`DType`]; [`Context::tensor_with`], [`Context::zeros_with`], [`Context::empty_with`],
//! [`Context::cast`]). The host always reads and writes f32 values: uploads to an f16 tensor are
//! rounded to nearest even, read-backs widened exactly. Every kernel above takes f16 operands:
//! it loads f16, computes and accumulates in f32 (a matmul split along K keeps f32 partial
//! products), and rounds once to f16 as it stores its output, which has its operands' type.
//! Operands of different types are [`ComputeError::DTypeMismatch`]; an f16 tensor on a device
//! without the feature is [`ComputeError::ShaderF16Unavailable`]. The matmul's autotuner
//! measures f32 products and its choices serve f16 products of the same shapes too.
//!
//! # Rules the kernels keep
//!
//! - **Every storage binding is `var<storage, read_write>`**: inputs and outputs may share one
//!   segment buffer, and wgpu rejects read-only plus read-write bindings of one buffer in one
//!   dispatch.
//! - **Tensors are allocated rounded up to 16 bytes** and the logical length is tracked apart, so
//!   vec4 kernels never read or write past a binding; pool offsets are multiples of at least
//!   256 bytes, so every binding is 16-byte aligned.
//! - **Op parameters live in a uniform ring owned by the context** (not in the pool): one uniform
//!   buffer bound with a dynamic offset, filled on the CPU while a batch is recorded and written
//!   with one `queue.write_buffer` just before the batch is submitted. Bind groups therefore do
//!   not depend on parameters and are cached by the storage ranges they bind.
//! - **Unchecked kernels only behind host validation**: with [`ShaderChecks::Unchecked`] the
//!   kernels are compiled without wgpu's injected bounds checks
//!   (`create_shader_module_trusted`). Every op validates shapes, sizes, grid limits and binding
//!   ranges on the host before recording, and every kernel masks its own edges, so no access
//!   leaves its binding. Most tests run checked (the default); the narrow matmul's and
//!   `unchecked_kernels_compute_what_checked_ones_do` run both.
//! - **Workgroup memory is not zeroed** (`zero_initialize_workgroup_memory: false`, in both
//!   modes): every kernel writes it before reading it, and on GL the zeroing made llvmpipe take
//!   4–14 s to compile each matmul variant while holding wgpu's GL context lock (other threads'
//!   GL calls then time out after 6 s and panic).
//!
//! # Sharing the pool
//!
//! Other code may allocate from the context's pool and submit through it at any time. A tensor
//! dropped while the context has recorded but unsubmitted ops is kept by the context and given
//! back ([`Pool::free_submitted`](crate::Pool::free_submitted)) only once that batch is submitted,
//! so another [`Pool::submit`](crate::Pool::submit) cannot release a range the batch still reads.
//! A tensor dropped while no batch is open is reusable at once.
//!
//! To bind tensors in a kernel of your own, make it with [`Context::user_kernel`] and record it
//! with [`Context::dispatch`] (or [`Context::dispatch_with`]): it then joins the open batch and
//! its tensors are kept as above, as an op of the context's (see `ops::custom`).
//! Work recorded in an encoder of your own that binds [`Tensor::allocation`] is not tracked: a
//! tensor dropped before that work is submitted can have its range reused at once.
//!
//! # Compaction
//!
//! Tensors are the pool's only allocations that move. [`Context::compact`] empties sparsely used
//! segments by moving the context's tensors into free space of the others (GPU copies) and gives
//! them back; [`Context::compact_for`] makes room for one request; with
//! [`ContextOptions::compact_on_oom`] an op whose allocation fails compacts and tries once more
//! when that would make room. A compaction first submits the open batch; the copies follow it on
//! the queue and the old ranges are reused only after them; the context's cached bind groups are
//! dropped and plans that bind moved tensors (weights) make their bind groups again before their
//! next replay. What stays put: plan arenas, allocations of other users of the pool, and tensors
//! whose allocation is borrowed ([`Tensor::allocation`] returns a guard) or being read
//! asynchronously at the time. Bind groups of your own over a tensor's range do not follow it.
//!
//! # Modules, bottom up
//!
//! Each module uses only those listed before it:
//!
//! - `types` (private; its public items are re-exported here): the words the others share —
//!   [`ComputeError`], [`DType`], [`ShaderChecks`], [`Activation`], [`MatmulTiles`],
//!   [`MatmulOptions`], which kernel runs and what it loads and stores, what a dispatch binds,
//!   one `#[repr(C)]` parameter struct per kernel, size helpers, f16 conversions on the host;
//! - `kernels` (private): the WGSL of each kernel variant (`shaders/` plus the constants and the
//!   unrolled matmul entry points written on the host, in `kernels/matmul.rs`), pipelines and
//!   layouts;
//! - `timing`: GPU timestamps per dispatch;
//! - `record` (private): the one recording path of every dispatch — the bind group of
//!   "parameters + storage ranges", the cache of those, pass bookkeeping, the uniform ring;
//! - `user_kernel` (private; [`UserKernel`], [`UserKernelDesc`], [`UserBindGroup`] re-exported
//!   here): a kernel of the user's, read with naga and compiled once, and what its dispatches
//!   must give;
//! - `context`: [`Context`], its options and statistics; records dispatches into batches and
//!   submits them through the pool; keeps the storages of its tensors (for compaction);
//! - `tensor`: [`Tensor`], [`ReshapeError`], and the context's methods that upload, make
//!   ([`Context::zeros`], [`Context::empty`]), overwrite and read tensors;
//! - `ops`: the context's ops (element-wise, matmul, row reductions) and the dispatch of
//!   kernels of your own ([`Context::dispatch`]);
//! - `graph`: captures and plans (capture, fusion, planning, replay);
//! - [`cpu`]: the CPU twins of the kernels.

mod compaction;
mod context;
pub mod cpu;
mod graph;
mod kernels;
mod ops;
mod options;
mod record;
mod shared;
mod tensor;
mod timing;
mod types;
mod user_kernel;

pub use context::{Context, ContextOptions, ContextStats, TensorAllocation};
pub use graph::{Capture, CaptureOptions, Feed, Plan, PlanArena, PlanRun, PlanStats};
pub use kernels::catalog::{shader_catalog, CatalogShader, ShaderCatalog};
pub use ops::custom::Launch;
pub use ops::elementwise::{BinaryOp, UnaryOp};
pub use ops::matmul::{Epilogue, MatmulPlan};
pub use ops::transformer::FedIds;
pub use tensor::{ReshapeError, Tensor};
pub use timing::{KernelTiming, TimestampSupport};
pub(crate) use types::tensor_bytes;
pub use types::{
    Activation, Autotune, ComputeError, CoopProbe, CoopTiles, DType, MatmulOptions, MatmulTiles,
    ShaderChecks,
};
pub use user_kernel::{UserBindGroup, UserKernel, UserKernelDesc};
