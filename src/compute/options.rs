//! How a context is made ([`ContextOptions`]) and what it did ([`ContextStats`]).

use super::types::MatmulOptions;
pub use super::types::ShaderChecks;

/// How a [`Context`](crate::compute::Context) records, submits and compiles.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextOptions {
    /// Bounds checks in the kernels.
    pub shader_checks: ShaderChecks,
    /// A batch is submitted once it holds this many dispatches (1..=65,536). Each dispatch takes
    /// one slot of the parameter ring (`max(32, min_uniform_buffer_offset_alignment)` bytes).
    pub max_ops_per_batch: u32,
    /// Submit the batch before an op when tensors of more than this many bytes were dropped since
    /// the last submission, so that the op's output can reuse them. `None` (the default): only
    /// the other triggers submit, and a batch's dropped tensors are reused in the next batch.
    pub flush_when_freed_bytes_exceed: Option<u64>,
    /// Time every dispatch with GPU timestamps (see [`KernelTiming`](crate::compute::KernelTiming)); read them with
    /// [`Context::take_kernel_timings`](crate::compute::Context::take_kernel_timings). Makes every submission wait for the GPU, and the
    /// timestamps themselves cost time: on the H200 under Vulkan, several µs per dispatch (8 ×
    /// 1024² products back to back ran 2.09 TFLOP/s without them, 0.82 with them, in two runs at
    /// the same 1,980 MHz). Profile to see
    /// where time goes, not to serve.
    pub profile: bool,
    /// How matmuls choose tiles and split-K.
    pub matmul: MatmulOptions,
    /// Bind groups kept for reuse; the cache is emptied when it reaches this size. Not used with
    /// a naive pool ([`Pool::naive`](crate::Pool::naive)): there every tensor is a new buffer, so no bind group would
    /// be asked for twice and the cache would only hash and hold dropped buffers.
    pub max_cached_bind_groups: usize,
    /// Caps the x dimension of element-wise, row and matmul grids below the device's
    /// `max_compute_workgroups_per_dimension`, so that tests reach the 2-D grids (and the matmul's
    /// grid over rows of block tiles) with small tensors. `None`: the device's limit.
    pub max_grid_x: Option<u32>,
    /// When a tensor's allocation fails with out of memory and moving the context's tensors
    /// would make room for it ([`Context::compact_for`](crate::compute::Context::compact_for)), compact and try once more. Off by
    /// default: a compaction flushes the batch and copies memory.
    pub compact_on_oom: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            shader_checks: ShaderChecks::Checked,
            max_ops_per_batch: 1024,
            flush_when_freed_bytes_exceed: None,
            profile: false,
            matmul: MatmulOptions::default(),
            max_cached_bind_groups: 4096,
            max_grid_x: None,
            compact_on_oom: false,
        }
    }
}

impl ContextOptions {
    /// The defaults with unchecked kernels, for benchmarks.
    pub fn unchecked() -> Self {
        Self {
            shader_checks: ShaderChecks::Unchecked,
            ..Self::default()
        }
    }
}

/// What a context did, since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Dispatches recorded.
    pub dispatches: u64,
    /// Batches submitted (including empty ones that only released dropped tensors).
    pub submissions: u64,
    /// Compute passes begun.
    pub passes: u64,
    /// Pipelines compiled.
    pub pipelines_created: u64,
    /// Bind groups created.
    pub bind_groups_created: u64,
    /// Dispatches that found their bind group in the cache.
    pub bind_group_cache_hits: u64,
    /// Bind groups in the cache when the stats were read (a current count, not a total; always
    /// 0 with a naive pool).
    pub cached_bind_groups: u64,
    /// Bytes of op parameters written to the uniform ring.
    pub params_bytes_written: u64,
    /// Dispatches of kernels of the user's recorded (counted in `dispatches` too).
    pub user_dispatches: u64,
    /// Kernels of the user's made ([`Context::user_kernel`](crate::compute::Context::user_kernel)).
    pub user_kernels: u64,
}
