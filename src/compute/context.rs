//! The compute context: records ops into one open compute pass and command encoder, submits
//! them in batches through the pool, and caches pipelines and bind groups.
//!
//! # Batches
//!
//! An op validates its operands on the host, allocates its output from the pool, and records one
//! or two dispatches into the open pass (a new pass costs ~35–40 µs of CPU on NVIDIA, a dispatch
//! in an open pass ~1 µs). The batch is submitted — through [`Pool::submit`], so that tensors
//! dropped during the batch become reusable only after the submission that carries their last use
//! — when:
//!
//! - a tensor is read back ([`Context::read`]) or overwritten ([`Context::write`]),
//! - [`Context::flush`] or [`Context::sync`] is called,
//! - the batch holds [`ContextOptions::max_ops_per_batch`] dispatches,
//! - tensors of more than [`ContextOptions::flush_when_freed_bytes_exceed`] bytes were dropped
//!   since the last submission (checked before an op allocates its output, so that it can reuse
//!   their memory).
//!
//! An op's output takes the memory of a tensor of its size dropped earlier in the open batch (the
//! most recently dropped), as PyTorch's allocator reuses a block freed on the same stream: the op's
//! dispatch, recorded after every use of the dropped tensor, writes it first, and wgpu puts a
//! barrier between them (`Pool::reuse`; [`Context::write`] submits the batch before its upload
//! lands). Beyond that the pool cannot reuse what was dropped until the batch is submitted: a
//! batch's memory peak is what was live when it began plus the outputs no dropped tensor of the
//! same size could take. A stream of `add`s over 4M elements thus writes one range again and
//! again (kept in the GPU's cache) instead of a new one per op.
//!
//! This module knows dispatches and allocations, not tensors: the context's methods that make,
//! write and read tensors are in [`super::tensor`], its ops in [`super::ops`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError, Weak,
};

use super::kernels::Kernels;
use super::record::{
    storage_group, BindGroups, Encoded, LayoutId, ParamsRing, PassRecorder, Range,
};
use super::timing::{KernelTiming, Timer, TimestampSupport};
use super::user_kernel::{UserBindGroup, UserKernel};
use super::vocab::{
    ComputeError, DType, KernelKey, MatmulOptions, ParamsBlock, TunedChoices, PARAMS_BYTES,
};
use crate::device::{AccountedBuffer, Gpu};
use crate::policy::{CompactionEstimate, CompactionLimits, OutOfMemory};
use crate::pool::{AllocOptions, Allocation, Compaction, Pool, PoolError};
use crate::state::BufferRole;

pub use super::vocab::ShaderChecks;

/// How a [`Context`] records, submits and compiles.
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
    /// Time every dispatch with GPU timestamps (see [`super::timing`]); read them with
    /// [`Context::take_kernel_timings`]. Makes every submission wait for the GPU, and the
    /// timestamps themselves cost time: on the H200 under Vulkan, several µs per dispatch (8 ×
    /// 1024² products back to back ran 2.09 TFLOP/s without them, 0.82 with them, in two runs at
    /// the same 1,980 MHz). Profile to see
    /// where time goes, not to serve.
    pub profile: bool,
    /// How matmuls choose tiles and split-K.
    pub matmul: MatmulOptions,
    /// Bind groups kept for reuse; the cache is emptied when it reaches this size. Not used with
    /// a naive pool ([`Pool::naive`]): there every tensor is a new buffer, so no bind group would
    /// be asked for twice and the cache would only hash and hold dropped buffers.
    pub max_cached_bind_groups: usize,
    /// Caps the x dimension of element-wise, row and matmul grids below the device's
    /// `max_compute_workgroups_per_dimension`, so that tests reach the 2-D grids (and the matmul's
    /// grid over rows of block tiles) with small tensors. `None`: the device's limit.
    pub max_grid_x: Option<u32>,
    /// When a tensor's allocation fails with out of memory and moving the context's tensors
    /// would make room for it ([`Context::compact_for`]), compact and try once more. Off by
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
    /// Kernels of the user's made ([`Context::user_kernel`]).
    pub user_kernels: u64,
}

/// The memory of a tensor: a pool allocation of its context, shared by the tensor's clones (and
/// by a [`Plan`](super::graph::Plan) that binds it), given back when the last holder drops it —
/// after the open batch is submitted if one is open (see [`Shared::free_tensor`]). A tensor made
/// while the context captures has no memory (its allocation is `None`): it names a buffer of the
/// capture, which the plan places in its arena.
///
/// The allocation sits behind a lock so that compaction ([`Context::compact`]) can move it: a
/// compaction takes the lock for writing only if no one holds it (`try_write`), so a tensor whose
/// allocation is borrowed at that moment ([`Tensor::allocation`](super::Tensor::allocation)) is
/// simply not moved, and readers wait at most for one compaction.
pub(crate) struct Storage {
    allocation: RwLock<Option<Allocation>>,
    /// Pins ([`Storage::pin`]) that keep compaction from moving the tensor without a lock held.
    pins: AtomicUsize,
    /// Set once the allocation was handed to the user ([`Tensor::allocation`](super::Tensor::allocation)):
    /// work the context does not see (the user's own encoder) may use it, so when the tensor is
    /// dropped its range waits for the pool's next submission, like any dropped allocation, and
    /// no op's output takes it.
    exposed: AtomicBool,
    /// The capture that made it, for a tensor without memory.
    pub(crate) capture: Option<u64>,
    /// Bytes the tensor's allocation takes (or will take, in a plan's arena).
    pub(crate) bytes: u64,
    /// What its elements are stored as (shared by the clones and reshapes of a tensor).
    pub(crate) dtype: DType,
    pub(crate) shared: Arc<Shared>,
}

impl Storage {
    /// A tensor's storage of `bytes` holding `dtype` elements: with memory, registered with the
    /// context (so that compaction can find and move it); without, a symbolic tensor of
    /// `capture`.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        allocation: Option<Allocation>,
        capture: Option<u64>,
        bytes: u64,
        dtype: DType,
    ) -> Arc<Self> {
        let registered = allocation.is_some();
        Arc::new_cyclic(|weak: &Weak<Storage>| {
            if registered {
                shared
                    .registry()
                    .insert(weak.as_ptr() as usize, weak.clone());
            }
            Storage {
                allocation: RwLock::new(allocation),
                pins: AtomicUsize::new(0),
                exposed: AtomicBool::new(false),
                capture,
                bytes,
                dtype,
                shared: shared.clone(),
            }
        })
    }

    /// The allocation, `None` for a tensor of a capture. Held for reading: a compaction does not
    /// move it while the guard lives.
    pub(crate) fn allocation(&self) -> Option<TensorAllocation<'_>> {
        let guard = self
            .allocation
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        guard.is_some().then_some(TensorAllocation { guard })
    }

    /// [`Storage::allocation`] for the user: from now on the allocation may be used by work the
    /// context does not see, so its range is never handed on before the pool's next submission
    /// after the tensor is dropped.
    pub(crate) fn expose(&self) -> Option<TensorAllocation<'_>> {
        let allocation = self.allocation()?;
        self.exposed.store(true, Ordering::Release);
        Some(allocation)
    }

    /// Whether the tensor has memory (it is not a symbolic tensor of a capture).
    pub(crate) fn has_memory(&self) -> bool {
        self.capture.is_none()
    }

    /// The allocation's range, pinned where it is until the pin is dropped (compaction passes a
    /// pinned tensor over), without holding a lock: for reads across an `await`. `None` for a
    /// tensor of a capture.
    pub(crate) fn pin(&self) -> Option<PinnedRange<'_>> {
        let allocation = self.allocation()?;
        // Taken under the read lock: a compaction, which takes the write lock, sees it.
        self.pins.fetch_add(1, Ordering::AcqRel);
        Some(PinnedRange {
            storage: self,
            buffer: allocation.buffer().clone(),
            offset: allocation.offset(),
            binding_size: allocation.binding_size(),
            size: allocation.size(),
        })
    }
}

/// A tensor's range, kept in place until dropped ([`Storage::pin`]).
pub(crate) struct PinnedRange<'a> {
    storage: &'a Storage,
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) binding_size: u64,
    pub(crate) size: u64,
}

impl Drop for PinnedRange<'_> {
    fn drop(&mut self) {
        self.storage.pins.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let allocation = self
            .allocation
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        // An open batch may still use it: the context gives it back after submitting that.
        if let Some(allocation) = allocation {
            self.shared
                .registry()
                .remove(&(std::ptr::from_ref::<Storage>(self) as usize));
            self.shared
                .freed_bytes
                .fetch_add(allocation.size(), Ordering::Relaxed);
            self.shared.free_tensor(allocation, *self.exposed.get_mut());
        }
    }
}

/// The context's plan read-back buffer, held ([`Context::plan_read_back`]); derefs to it.
pub(crate) struct PlanReadBack<'a> {
    slot: MutexGuard<'a, Option<AccountedBuffer>>,
}

impl PlanReadBack<'_> {
    /// Forgets the buffer (a failed read may leave it mapped): the next read makes another.
    pub(crate) fn discard(mut self) {
        *self.slot = None;
    }
}

impl std::ops::Deref for PlanReadBack<'_> {
    type Target = wgpu::Buffer;

    fn deref(&self) -> &wgpu::Buffer {
        self.slot.as_ref().expect("made when the guard was taken")
    }
}

/// Locks `mutex`, carrying on with the data of a thread that panicked while holding it.
fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A tensor's pool allocation, borrowed ([`Tensor::allocation`](super::Tensor::allocation)):
/// derefs to the [`Allocation`]. While it lives, compaction leaves the tensor where it is; drop
/// it before calling [`Context::compact`] if the tensor should be movable.
pub struct TensorAllocation<'a> {
    guard: RwLockReadGuard<'a, Option<Allocation>>,
}

impl std::ops::Deref for TensorAllocation<'_> {
    type Target = Allocation;

    fn deref(&self) -> &Allocation {
        self.guard
            .as_ref()
            .expect("a TensorAllocation is made only over an allocation")
    }
}

impl std::fmt::Debug for TensorAllocation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// One dispatch, validated by its op.
pub(crate) struct Dispatch<'a> {
    pub(crate) kernel: KernelKey,
    pub(crate) params: ParamsBlock,
    /// The storage bindings, in binding order (1, 2, ...): the tensors' storages.
    pub(crate) bindings: &'a [&'a Arc<Storage>],
    pub(crate) workgroups: [u32; 3],
}

/// One step recorded while the context captures, in the order recorded.
pub(crate) enum Step {
    /// A kernel of the context's, as an op asked for it.
    Kernel {
        kernel: KernelKey,
        params: ParamsBlock,
        bindings: Vec<Arc<Storage>>,
        workgroups: [u32; 3],
    },
    /// A clear to zeros ([`Context::zeros`]).
    Clear(Arc<Storage>),
    /// A kernel of the user's ([`Context::dispatch_with`]): `params` at binding 0 and `storage`
    /// at bindings `1..` of group 0, `groups` at groups `1..`.
    Custom {
        kernel: UserKernel,
        params: Vec<u8>,
        storage: Vec<Arc<Storage>>,
        groups: Vec<UserBindGroup>,
        workgroups: [u32; 3],
    },
}

/// What a capture recorded: its steps, which hold every tensor they use (so that no range they
/// name is given back while the capture lasts).
pub(crate) struct Tape {
    pub(crate) id: u64,
    pub(crate) steps: Vec<Step>,
}

/// Capture ids, unique in the process (0 is "not capturing").
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// The open batch.
#[derive(Default)]
struct Batch {
    encoder: Option<wgpu::CommandEncoder>,
    /// The open pass and the pipeline set in it.
    recorder: PassRecorder,
    dispatches: u32,
}

struct State {
    kernels: Kernels,
    bind_groups: BindGroups,
    ring: ParamsRing,
    batch: Batch,
    timer: Option<Timer>,
    timings: Vec<KernelTiming>,
    stats: ContextStats,
    /// The pool's count of segments given back, when the bind-group cache was last checked.
    segments_freed_seen: u64,
    /// The open capture's steps.
    tape: Option<Tape>,
}

pub(crate) struct Shared {
    pool: Pool,
    gpu: Gpu,
    options: ContextOptions,
    limits: wgpu::Limits,
    timestamps: TimestampSupport,
    /// Bytes of tensors dropped since the last submission.
    pub(crate) freed_bytes: AtomicU64,
    /// The allocations of tensors dropped since the last submission, by size in bytes: the open
    /// batch may still use them, so they go back to the pool only after the batch is submitted
    /// ([`Pool::free_submitted`]), whoever else submits to the pool meanwhile. Until then an op
    /// of the batch may take one for its output ([`Shared::take_deferred`]).
    deferred: Mutex<HashMap<u64, Vec<Allocation>>>,
    /// The buffer this context's plans read their outputs back through ([`Context::plan_read_back`]).
    plan_read_back: Mutex<Option<AccountedBuffer>>,
    /// The allocations of exposed tensors dropped since the last submission (see
    /// [`Shared::free_tensor`]): kept until the batch is submitted, taken by no op.
    deferred_exposed: Mutex<Vec<Allocation>>,
    /// Set from the first op recorded into a batch until that batch is submitted: while it is
    /// clear, a dropped tensor's last use is submitted and its range is reusable at once.
    batch_open: AtomicBool,
    /// The id of the open capture, 0 when none: while set, ops make symbolic tensors and record
    /// into the capture's tape instead of the batch.
    capturing: AtomicU64,
    /// The storages with memory of the context's live tensors, by address: what compaction may
    /// move.
    registry: Mutex<HashMap<usize, Weak<Storage>>>,
    /// Bumped whenever a compaction moved tensors: plans that bind tensors make their bind groups
    /// again when it changed.
    moved: AtomicU64,
    /// The matmul autotuner's choices for this device and these options, found in the
    /// process-wide registry at the first tuned matmul (so a matmul looks up its shape class
    /// alone).
    pub(crate) tuned: OnceLock<Arc<TunedChoices>>,
    state: Mutex<State>,
}

impl Shared {
    /// Gives a dropped tensor's allocation back: at once if no batch is open, else after the
    /// open batch (which may use it) is submitted. An `exposed` one (handed to the user, who may
    /// have recorded work on it that the context does not see) is dropped as any allocation
    /// is: its range waits for the pool's next submission (after the open batch's, if one is
    /// open), and no op's output takes it.
    pub(crate) fn free_tensor(&self, allocation: Allocation, exposed: bool) {
        let batch_open = self.batch_open.load(Ordering::Acquire);
        match (batch_open, exposed) {
            (true, false) => self
                .deferred
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(allocation.size())
                .or_default()
                .push(allocation),
            (true, true) => self
                .deferred_exposed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(allocation),
            (false, false) => self.pool.free_submitted([allocation]),
            (false, true) => drop(allocation),
        }
    }

    /// Gives the deferred allocations back: the batch that last used them is submitted. The
    /// exposed ones are dropped, to wait for the pool's next submission.
    fn release_deferred(&self) {
        let deferred = std::mem::take(
            &mut *self
                .deferred
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        self.pool.free_submitted(deferred.into_values().flatten());
        drop(std::mem::take(
            &mut *self
                .deferred_exposed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        ));
    }

    /// The allocation of `bytes` of a tensor dropped in the open batch most recently, handed to
    /// an op's output labelled `label` ([`Pool::reuse`]); `None` when there is none. Sound because
    /// the op records its dispatch, which writes the output first, into the same open batch after
    /// every use of the dropped tensor (wgpu puts a barrier between them), and the output is
    /// written from the host only through [`Context::write`], which submits the batch first.
    pub(crate) fn take_deferred(&self, bytes: u64, label: &str) -> Option<Allocation> {
        if !self.batch_open.load(Ordering::Acquire) {
            return None;
        }
        let allocation = {
            let mut deferred = self
                .deferred
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let same_size = deferred.get_mut(&bytes)?;
            let allocation = same_size.pop()?;
            if same_size.is_empty() {
                deferred.remove(&bytes);
            }
            allocation
        };
        // No longer dropped: it does not count towards `flush_when_freed_bytes_exceed`.
        let _ = self
            .freed_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |freed| {
                Some(freed.saturating_sub(bytes))
            });
        Some(self.pool.reuse(allocation, label))
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<usize, Weak<Storage>>> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while recording leaves at worst a batch that fails validation on submit.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle (context or tensor) is gone: submit what was recorded so that the ranges
        // it used become reusable. Nothing can read the results any more; errors are moot.
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.batch.recorder.end();
        let buffers: Vec<_> = state
            .batch
            .encoder
            .take()
            .map(|e| e.finish())
            .into_iter()
            .collect();
        if !buffers.is_empty() {
            state.ring.write(&self.gpu.queue);
            self.pool.submit(buffers);
        }
        self.release_deferred();
    }
}

/// Records ops on [`Tensor`](super::Tensor)s into batched command buffers. Cheap to clone (clones share one
/// context); `Send + Sync` (ops from several threads are recorded one at a time).
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("options", &self.shared.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Context {
    /// A context whose tensors live in `pool` (on the pool's device).
    pub fn new(pool: &Pool, options: ContextOptions) -> Result<Self, ComputeError> {
        if !(1..=65_536).contains(&options.max_ops_per_batch) {
            return Err(ComputeError::Config(format!(
                "max_ops_per_batch must be 1..=65536, not {}",
                options.max_ops_per_batch
            )));
        }
        if options.max_grid_x == Some(0) {
            return Err(ComputeError::Config("max_grid_x must not be 0".into()));
        }
        let gpu = pool.gpu().clone();
        let limits = gpu.device.limits();
        options.matmul.validate(&limits)?;
        let timer = if options.profile {
            Timer::new(&gpu)
        } else {
            None
        };
        let state = State {
            kernels: Kernels::new(&gpu.device, options.shader_checks),
            bind_groups: BindGroups::new(options.max_cached_bind_groups, !pool.is_naive()),
            ring: ParamsRing::new(
                &gpu,
                options.max_ops_per_batch,
                limits.min_uniform_buffer_offset_alignment,
            ),
            batch: Batch::default(),
            timer,
            timings: Vec::new(),
            stats: ContextStats::default(),
            segments_freed_seen: pool.segments_freed(),
            tape: None,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                pool: pool.clone(),
                timestamps: TimestampSupport::of(&gpu.device),
                gpu,
                options,
                limits,
                freed_bytes: AtomicU64::new(0),
                deferred: Mutex::new(HashMap::new()),
                deferred_exposed: Mutex::new(Vec::new()),
                plan_read_back: Mutex::new(None),
                batch_open: AtomicBool::new(false),
                capturing: AtomicU64::new(0),
                registry: Mutex::new(HashMap::new()),
                moved: AtomicU64::new(0),
                tuned: OnceLock::new(),
                state: Mutex::new(state),
            }),
        })
    }

    /// The pool the tensors live in.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The device and queue.
    pub fn gpu(&self) -> &Gpu {
        &self.shared.gpu
    }

    /// The options the context was made with.
    pub fn options(&self) -> &ContextOptions {
        &self.shared.options
    }

    /// The device's limits.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.shared.limits
    }

    /// What the adapter offers for GPU timing.
    pub fn timestamp_support(&self) -> TimestampSupport {
        self.shared.timestamps
    }

    /// What the context did so far.
    pub fn stats(&self) -> ContextStats {
        let state = self.shared.lock();
        ContextStats {
            pipelines_created: state.kernels.pipelines_created + state.stats.user_kernels,
            cached_bind_groups: state.bind_groups.len() as u64,
            bind_groups_created: state.bind_groups.created,
            bind_group_cache_hits: state.bind_groups.hits,
            passes: state.batch.recorder.passes,
            ..state.stats
        }
    }

    /// Dispatches (and clears of [`Context::zeros`]) recorded but not yet submitted.
    pub fn pending_dispatches(&self) -> u32 {
        self.shared.lock().batch.dispatches
    }

    /// Submits the open batch (which may compute `allocation`) together with a read-back of
    /// `allocation`, and waits for it: the allocation's bytes.
    pub(crate) fn read_allocation(&self, allocation: &Allocation) -> Result<Vec<u8>, ComputeError> {
        // The open batch and the read-back go in one submission.
        let mut state = self.shared.lock();
        let (buffers, timed) = self.finish_batch_locked(&mut state);
        let bytes = self.shared.pool.submit_and_read(buffers, allocation);
        self.after_submit_locked(&mut state, timed)?;
        Ok(bytes?)
    }

    /// Submits the open batch (possibly empty: that still releases the ranges of dropped tensors).
    pub fn flush(&self) -> Result<(), ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)
    }

    /// Submits the open batch and waits until the GPU has finished all work.
    pub fn sync(&self) -> Result<(), ComputeError> {
        self.flush()?;
        crate::device::wait_for_submitted(&self.shared.gpu.device)
            .map_err(|e| ComputeError::Wait(e.to_string()))
    }

    /// The GPU times of the dispatches submitted since the last call (with
    /// [`ContextOptions::profile`] on an adapter with timestamps; empty otherwise).
    pub fn take_kernel_timings(&self) -> Vec<KernelTiming> {
        std::mem::take(&mut self.shared.lock().timings)
    }

    /// Forgets the cached bind groups (they keep the buffers they bind alive).
    pub fn clear_bind_groups(&self) {
        self.shared.lock().bind_groups.clear();
    }

    /// Submits the open batch, forgets the cached bind groups, gives the plans' read-back buffer
    /// back and every empty segment to the device ([`Pool::trim`]). Returns the bytes of
    /// segments given back.
    pub fn trim(&self) -> Result<u64, ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)?;
        state.bind_groups.clear();
        drop(state);
        // Taken alone: a plan reading back holds it and then the state's lock.
        *lock_ignoring_poison(&self.shared.plan_read_back) = None;
        Ok(self.shared.pool.trim())
    }

    /// The buffer plans of this context read their outputs back through, at least `bytes` long
    /// (made, or made larger, here), held until the guard drops: plans share it, so that serving
    /// many batch sizes holds one read-back buffer, not one per plan.
    pub(crate) fn plan_read_back(&self, bytes: u64) -> PlanReadBack<'_> {
        let mut slot = lock_ignoring_poison(&self.shared.plan_read_back);
        let bytes = bytes.max(4);
        if slot.as_ref().is_none_or(|buffer| buffer.size() < bytes) {
            // Dropped first, so that the old and the new one are not held at once. Grown to a
            // power of two where the device allows it, so that growing stays rare.
            *slot = None;
            let max = self.shared.gpu.device.limits().max_buffer_size;
            let size = bytes
                .checked_next_power_of_two()
                .filter(|&size| size <= max)
                .unwrap_or(bytes);
            *slot = Some(self.shared.gpu.create_accounted_buffer(
                BufferRole::PlanReadBack,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool plan read-back"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                },
            ));
        }
        PlanReadBack { slot }
    }

    /// Moves the context's tensors out of sparsely used segments of the pool into free space of
    /// the others, and gives each segment so emptied back to the device
    /// ([`Pool::compact_segments`]), least occupied first, until no further segment can be
    /// emptied. Returns what moved and what was given back.
    ///
    /// Safe against work in flight: the open batch is submitted first, the copies are submitted
    /// after it (and after everything submitted before), and the old ranges are reused only
    /// after that submission. The context's cached bind groups are forgotten and plans that bind
    /// moved tensors make their bind groups again at their next replay. Only tensors with memory
    /// of this context move: allocations of other users of the pool, plan arenas, tensors whose
    /// allocation is borrowed at the time ([`Tensor::allocation`](super::Tensor::allocation))
    /// and tensors being read asynchronously stay where they are, and a segment holding one is
    /// never emptied. Bind groups or ranges of your own over a tensor's allocation do not follow
    /// it: make them again after a compaction.
    pub fn compact(&self) -> Result<Compaction, ComputeError> {
        let limits = CompactionLimits {
            max_moved_factor: 1,
            max_moves: usize::MAX,
        };
        self.compact_with(|pool, allocations| pool.compact_segments(allocations, limits))
    }

    /// Moves the context's tensors so that a request of `size_bytes` fits in the segments the
    /// pool holds, without a new segment ([`Pool::compact_for`] within
    /// [`CompactionLimits::default`]: at most the request's size is copied). Nothing moves when it
    /// already fits, or when no plan over the context's tensors makes room (an out-of-memory
    /// error's [`OutOfMemory::compaction`](crate::policy::OutOfMemory::compaction) says whether
    /// one would). The same guarantees as [`Context::compact`].
    pub fn compact_for(&self, size_bytes: u64) -> Result<Compaction, ComputeError> {
        self.compact_with(|pool, allocations| {
            pool.compact_for(size_bytes, allocations, CompactionLimits::default())
        })
    }

    /// What [`Context::compact_for`] would move to make room for `size_bytes`, without moving
    /// anything (over the tensors that would move now); `None` when it would not make room.
    pub fn compaction_estimate(&self, size_bytes: u64) -> Option<CompactionEstimate> {
        let storages = self.live_storages();
        // The tensors a compaction would move now: those it could lock for writing.
        let guards = movable(&storages);
        let allocations: Vec<&Allocation> = guards.iter().filter_map(|g| g.as_ref()).collect();
        self.shared
            .pool
            .compaction_estimate(size_bytes, &allocations)
    }

    /// How many compactions moved tensors: plans compare it with the count their bind groups
    /// were made at.
    pub(crate) fn moved_generation(&self) -> u64 {
        self.shared.moved.load(Ordering::Acquire)
    }

    /// The storages of the context's live tensors with memory.
    fn live_storages(&self) -> Vec<Arc<Storage>> {
        self.shared
            .registry()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Runs a compaction of the pool over the context's movable tensors, under the context's lock
    /// (no op records meanwhile) and after submitting the open batch; forgets the bind groups
    /// when something moved.
    fn compact_with(
        &self,
        compact: impl FnOnce(&Pool, &mut [&mut Allocation]) -> Result<Compaction, PoolError>,
    ) -> Result<Compaction, ComputeError> {
        let mut state = self.shared.lock();
        self.flush_locked(&mut state)?;
        let storages = self.live_storages();
        let mut guards = movable(&storages);
        let mut allocations: Vec<&mut Allocation> =
            guards.iter_mut().filter_map(|g| g.as_mut()).collect();
        let outcome = compact(&self.shared.pool, &mut allocations);
        drop(allocations);
        if outcome.as_ref().is_ok_and(|o| o.moves > 0) {
            // Cached groups name the old ranges (and keep given-back segments alive).
            state.bind_groups.clear();
            self.shared.moved.fetch_add(1, Ordering::AcqRel);
        }
        drop(guards);
        drop(state);
        drop(storages);
        Ok(outcome?)
    }

    /// An op's allocation of `bytes` failed with `oom`: with [`ContextOptions::compact_on_oom`],
    /// compacts and tries once more when that would make room; else (or when it still fails) the
    /// error, saying whether compacting the context's tensors would make room.
    pub(crate) fn after_out_of_memory(
        &self,
        bytes: u64,
        label: &'static str,
        mut oom: Box<OutOfMemory>,
    ) -> Result<Allocation, ComputeError> {
        let mut estimate = self.compaction_estimate(bytes);
        if self.shared.options.compact_on_oom && estimate.is_some() {
            self.compact_for(bytes)?;
            match self
                .shared
                .pool
                .allocate_with(bytes, AllocOptions::labeled(label))
            {
                Err(PoolError::OutOfMemory(again)) => {
                    oom = again;
                    estimate = self.compaction_estimate(bytes);
                }
                result => return Ok(result?),
            }
        }
        // The pool's estimate counts every allocation as movable; the context moves only its
        // own tensors.
        oom.compaction = estimate;
        Err(PoolError::OutOfMemory(oom).into())
    }

    /// The largest x dimension of a grid.
    pub(crate) fn max_grid_x(&self) -> u32 {
        let device = self.shared.limits.max_compute_workgroups_per_dimension;
        self.shared
            .options
            .max_grid_x
            .map_or(device, |cap| cap.min(device))
    }

    /// Called by an op before it allocates its output: submits the batch when enough was dropped
    /// (see [`ContextOptions::flush_when_freed_bytes_exceed`]).
    pub(crate) fn before_op(&self) -> Result<(), ComputeError> {
        if let Some(limit) = self.shared.options.flush_when_freed_bytes_exceed {
            if self.shared.freed_bytes.load(Ordering::Relaxed) > limit {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Compiles `kernel` if it is not yet (so that an op can fail before it records anything).
    pub(crate) fn prepare(&self, kernel: &KernelKey) -> Result<(), ComputeError> {
        self.shared.lock().kernels.pipeline(kernel).map(|_| ())
    }

    /// Records one dispatch into the open pass (opening the encoder and pass if needed), or into
    /// the open capture's tape.
    pub(crate) fn record(&self, dispatch: Dispatch<'_>) -> Result<(), ComputeError> {
        let storage = dispatch.kernel.source.storage_bindings();
        if dispatch.bindings.len() != storage {
            return Err(ComputeError::Config(format!(
                "{} takes {storage} storage bindings, {} given",
                dispatch.kernel.entry,
                dispatch.bindings.len()
            )));
        }
        let allocations = self.allocations(dispatch.kernel.entry, dispatch.bindings)?;
        // The kernels view every binding as vec4s: guard the unchecked ones (a plan's arena
        // offsets are aligned to at least 16 bytes).
        for allocation in allocations.iter().flatten() {
            if !allocation.offset().is_multiple_of(16)
                || !allocation.binding_size().is_multiple_of(16)
            {
                return Err(ComputeError::Config(format!(
                    "{}: binding at offset {} of {} bytes is not 16-byte aligned",
                    dispatch.kernel.entry,
                    allocation.offset(),
                    allocation.binding_size()
                )));
            }
        }
        self.check_workgroups(dispatch.kernel.entry, dispatch.workgroups)?;

        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let pipeline = state.kernels.pipeline(&dispatch.kernel)?.clone();
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Kernel {
                kernel: dispatch.kernel,
                params: dispatch.params,
                bindings: dispatch.bindings.iter().map(|&s| s.clone()).collect(),
                workgroups: dispatch.workgroups,
            });
            return Ok(());
        }
        let ranges = allocations.iter().flatten().map(range_of).collect();
        let layout = state.kernels.layouts(storage).bind_group.clone();
        let kernel = dispatch.kernel;
        self.record_locked(
            state,
            RecordedOp {
                pipeline: &pipeline,
                layout: (LayoutId::Builtin(storage), &layout),
                params: Params::Block(&dispatch.params),
                ranges,
                more_groups: &[],
                workgroups: dispatch.workgroups,
                label: &|| kernel.label(),
            },
        )
    }

    /// The allocations of `storages` (`None` for symbolic tensors of the open capture). A
    /// symbolic tensor of no open capture is [`ComputeError::Symbolic`].
    fn allocations<'s>(
        &self,
        op: &'static str,
        storages: &'s [&'s Arc<Storage>],
    ) -> Result<Vec<Option<TensorAllocation<'s>>>, ComputeError> {
        let capture = self.capture_id();
        storages
            .iter()
            .map(|storage| match (storage.allocation(), storage.capture) {
                (Some(allocation), _) => Ok(Some(allocation)),
                (None, Some(id)) if Some(id) == capture => Ok(None),
                (None, _) => Err(ComputeError::Symbolic { op }),
            })
            .collect()
    }

    /// The id of the open capture, if any.
    pub(crate) fn capture_id(&self) -> Option<u64> {
        match self.shared.capturing.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Opens a capture: submits the open batch, then records into a tape until
    /// [`Context::end_tape`]. Refused while a capture is open.
    pub(crate) fn begin_tape(&self) -> Result<u64, ComputeError> {
        let mut state = self.shared.lock();
        if state.tape.is_some() {
            return Err(ComputeError::Capture(
                "the context is already capturing: finish or drop that capture first".into(),
            ));
        }
        self.flush_locked(&mut state)?;
        let id = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        state.tape = Some(Tape {
            id,
            steps: Vec::new(),
        });
        self.shared.capturing.store(id, Ordering::Release);
        Ok(id)
    }

    /// Closes the capture `id` (if it is the open one) and returns its tape.
    pub(crate) fn end_tape(&self, id: u64) -> Option<Tape> {
        let mut state = self.shared.lock();
        if state.tape.as_ref().is_some_and(|tape| tape.id == id) {
            self.shared.capturing.store(0, Ordering::Release);
            state.tape.take()
        } else {
            None
        }
    }

    /// The pipeline of `kernel`, compiled if it is not yet.
    pub(crate) fn pipeline(
        &self,
        kernel: &KernelKey,
    ) -> Result<wgpu::ComputePipeline, ComputeError> {
        self.shared.lock().kernels.pipeline(kernel).cloned()
    }

    /// The bind-group layout of the kernels with `storage` storage bindings (after the
    /// parameters' uniform at binding 0).
    pub(crate) fn kernel_layout(&self, storage: usize) -> wgpu::BindGroupLayout {
        self.shared
            .lock()
            .kernels
            .layouts(storage)
            .bind_group
            .clone()
    }

    /// Submits the open batch and then `buffers`, in one submission through the pool (so that
    /// both are ordered after everything recorded before, and the batch's dropped tensors are
    /// released after it); `before` runs first, under the context's lock (no op records
    /// meanwhile), for queue writes that must land before `buffers` but after the batch.
    ///
    /// `moved` is [`Context::moved_generation`] when `buffers` were recorded: if a compaction has
    /// moved tensors since, they may name ranges given back, and nothing is submitted (`None`).
    pub(crate) fn submit_after_batch(
        &self,
        before: impl FnOnce() -> Result<(), ComputeError>,
        buffers: Vec<wgpu::CommandBuffer>,
        moved: u64,
    ) -> Result<Option<wgpu::SubmissionIndex>, ComputeError> {
        let mut state = self.shared.lock();
        if state.tape.is_some() {
            return Err(ComputeError::Capture(
                "a plan cannot run while its context captures".into(),
            ));
        }
        // Compactions hold the lock throughout: none can move a tensor between here and the
        // submission.
        if self.moved_generation() != moved {
            return Ok(None);
        }
        // The batch first, in a submission of its own: queue writes land at the start of the
        // next submission, and the batch may read what they overwrite.
        if state.batch.dispatches > 0 {
            self.flush_locked(&mut state)?;
        }
        before()?;
        let index = self.shared.pool.submit(buffers);
        state.stats.submissions += 1;
        Ok(Some(index))
    }

    /// Records a dispatch of a user's `kernel` into the open pass (or the open capture's tape):
    /// `params` at binding 0 and `storage` at bindings `1..` of group 0, `groups` at groups `1..`.
    /// The allocations are those of live tensors: the batch holds their ranges from here until it
    /// is submitted (a tensor dropped meanwhile is kept, see [`Shared::free_tensor`]).
    pub(crate) fn record_user(
        &self,
        kernel: &UserKernel,
        params: &[u8],
        storage: &[&Arc<Storage>],
        groups: &[&UserBindGroup],
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        const OP: &str = "dispatch";
        self.check_workgroups(OP, workgroups)?;
        kernel.check_dispatch(params, storage.iter().map(|s| s.bytes), groups)?;
        let allocations = self.allocations(OP, storage)?;
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Custom {
                kernel: kernel.clone(),
                params: params.to_vec(),
                storage: storage.iter().map(|&s| s.clone()).collect(),
                groups: groups.iter().map(|&g| g.clone()).collect(),
                workgroups,
            });
            return Ok(());
        }
        let Some(allocations) = allocations.into_iter().collect::<Option<Vec<_>>>() else {
            return Err(ComputeError::Symbolic { op: OP });
        };
        let ranges = allocations.iter().map(range_of).collect();
        let more_groups: Vec<wgpu::BindGroup> = groups.iter().map(|g| g.group.clone()).collect();
        let inner = &*kernel.inner;
        self.record_locked(
            state,
            RecordedOp {
                pipeline: &inner.pipeline,
                layout: (LayoutId::User(inner.id), &inner.layout),
                params: if inner.params_bytes > 0 {
                    Params::Bytes(params, inner.params_binding_bytes)
                } else {
                    Params::None
                },
                ranges,
                more_groups: &more_groups,
                workgroups,
                label: &|| inner.label.clone(),
            },
        )?;
        state.stats.user_dispatches += 1;
        Ok(())
    }

    /// Counts a user's kernel made by the context.
    pub(crate) fn count_user_kernel(&self) {
        self.shared.lock().stats.user_kernels += 1;
    }

    /// Records a clear of `storage` to zeros into the open batch, between passes (or into the
    /// open capture's tape). It counts as a dispatch of the batch (so that an overwrite submits
    /// the batch first: an upload lands at the start of the next submission, before the clear).
    pub(crate) fn record_clear(&self, storage: &Arc<Storage>) -> Result<(), ComputeError> {
        let storages = [storage];
        let allocation = self.allocations("zeros", &storages)?.pop().flatten();
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if let Some(tape) = &mut state.tape {
            tape.steps.push(Step::Clear(storage.clone()));
            return Ok(());
        }
        let Some(allocation) = allocation else {
            return Err(ComputeError::Symbolic { op: "zeros" });
        };
        self.flush_if_full_locked(state, 0)?;
        self.shared.batch_open.store(true, Ordering::Release);
        // A clear is not a compute command: end the open pass.
        state.batch.recorder.end();
        let device = &self.shared.gpu.device;
        let encoder = state.batch.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgpu-pool compute batch"),
            })
        });
        // Offsets and binding sizes are multiples of 4 (`COPY_BUFFER_ALIGNMENT`).
        encoder.clear_buffer(
            allocation.buffer(),
            allocation.offset(),
            Some(allocation.binding_size()),
        );
        state.batch.dispatches += 1;
        Ok(())
    }

    /// Refuses a grid beyond the device's `max_compute_workgroups_per_dimension`.
    pub(crate) fn check_workgroups(
        &self,
        op: &'static str,
        workgroups: [u32; 3],
    ) -> Result<(), ComputeError> {
        let limit = self.shared.limits.max_compute_workgroups_per_dimension;
        for (&count, name) in workgroups.iter().zip(["x", "y", "z"]) {
            if count > limit {
                return Err(ComputeError::ExceedsLimit {
                    op,
                    what: name,
                    value: u64::from(count),
                    limit_name: "max_compute_workgroups_per_dimension",
                    limit: u64::from(limit),
                });
            }
        }
        Ok(())
    }

    /// Submits the open batch if it holds `max_ops_per_batch` dispatches, the timer is full, or
    /// the parameter ring has no room for `params_slots` more slots.
    fn flush_if_full_locked(
        &self,
        state: &mut State,
        params_slots: u64,
    ) -> Result<(), ComputeError> {
        let timer_full = state.timer.as_ref().is_some_and(Timer::is_full);
        if state.batch.dispatches >= self.shared.options.max_ops_per_batch
            || timer_full
            || !state.ring.has_room(params_slots)
        {
            self.flush_locked(state)?;
        }
        Ok(())
    }

    /// Records one dispatch into the open pass (opening the encoder and pass if needed): its
    /// parameters into the ring, its bind group from the cache or made, then the dispatch. The
    /// one recording path of the context's kernels and users' kernels alike.
    fn record_locked(&self, state: &mut State, op: RecordedOp<'_>) -> Result<(), ComputeError> {
        let slots = match op.params {
            Params::Bytes(_, binding) => state.ring.slots_for(binding),
            Params::Block(_) | Params::None => 1,
        };
        self.flush_if_full_locked(state, slots)?;
        // The batch uses the dispatch's tensors from here on.
        self.shared.batch_open.store(true, Ordering::Release);
        let State {
            ring,
            bind_groups,
            batch,
            timer,
            ..
        } = state;
        let (params_offset, params_bytes) = match op.params {
            Params::Block(block) => (Some(ring.push(block)), Some(PARAMS_BYTES)),
            Params::Bytes(bytes, binding) => (Some(ring.push_bytes(bytes, binding)), Some(binding)),
            Params::None => (None, None),
        };
        let device = &self.shared.gpu.device;
        let (layout_id, layout) = op.layout;
        let group = bind_groups.get_or_make(layout_id, op.ranges, |ranges| {
            let params = params_bytes.map(|bytes| (&*ring.buffer, bytes));
            storage_group(device, "wgpu-pool compute", layout, params, ranges)
        });
        let encoder = batch.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgpu-pool compute batch"),
            })
        });
        let timing = timer.as_mut().map(|timer| (timer, (op.label)()));
        batch.recorder.dispatch(
            encoder,
            "wgpu-pool compute",
            &Encoded {
                pipeline: op.pipeline,
                group: &group,
                params_offset,
                more_groups: op.more_groups,
                workgroups: op.workgroups,
            },
            timing,
        );
        batch.dispatches += 1;
        state.stats.dispatches += 1;
        Ok(())
    }

    fn flush_locked(&self, state: &mut State) -> Result<(), ComputeError> {
        let (buffers, timed) = self.finish_batch_locked(state);
        // Through the pool: ranges of tensors dropped so far become reusable after this.
        self.shared.pool.submit(buffers);
        self.after_submit_locked(state, timed)
    }

    /// Ends the open pass and batch: its command buffer (if any), with the op parameters written
    /// so that they land at the start of the submission that carries it. Returns whether the
    /// batch resolves timestamps.
    fn finish_batch_locked(&self, state: &mut State) -> (Vec<wgpu::CommandBuffer>, bool) {
        // Ends the pass (dropping it records its end into the encoder).
        state.batch.recorder.end();
        let mut buffers = Vec::with_capacity(1);
        let mut timed = false;
        if let Some(mut encoder) = state.batch.encoder.take() {
            if let Some(timer) = &state.timer {
                timed = timer.resolve(&mut encoder);
            }
            buffers.push(encoder.finish());
        }
        // Lands at the start of the next submission, before the batch's dispatches.
        state.stats.params_bytes_written += state.ring.write(&self.shared.gpu.queue) as u64;
        state.ring.reset();
        state.batch.dispatches = 0;
        self.shared.freed_bytes.store(0, Ordering::Relaxed);
        (buffers, timed)
    }

    /// Bookkeeping after a batch was submitted: timings, and the bind groups of segments the pool
    /// gave back.
    fn after_submit_locked(&self, state: &mut State, timed: bool) -> Result<(), ComputeError> {
        state.stats.submissions += 1;
        // Cleared only now that the batch is submitted (and under the lock, so no op records
        // meanwhile): a tensor dropped before this point waits in `deferred`.
        self.shared.batch_open.store(false, Ordering::Release);
        self.shared.release_deferred();
        if timed {
            if let Some(timer) = &mut state.timer {
                let timings = timer.read(&self.shared.gpu.device)?;
                state.timings.extend(timings);
            }
        }
        // Cached bind groups keep their buffers alive: forget them when the pool gave segments
        // back, so that the memory really returns to the device.
        let freed = self.shared.pool.segments_freed();
        if freed != state.segments_freed_seen {
            state.bind_groups.clear();
            state.segments_freed_seen = freed;
        }
        Ok(())
    }
}

/// The allocations of `storages` that a compaction may move, locked for writing. Never waits: a
/// tensor borrowed ([`Storage::allocation`]) or pinned ([`Storage::pin`]) elsewhere is left out.
fn movable(storages: &[Arc<Storage>]) -> Vec<RwLockWriteGuard<'_, Option<Allocation>>> {
    storages
        .iter()
        .filter_map(|storage| {
            let guard = match storage.allocation.try_write() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            };
            (storage.pins.load(Ordering::Acquire) == 0).then_some(guard)
        })
        .collect()
}

/// The storage range a dispatch binds for a tensor's allocation.
fn range_of(allocation: &TensorAllocation<'_>) -> Range {
    (
        allocation.buffer().clone(),
        allocation.offset(),
        allocation.binding_size(),
    )
}

/// A dispatch's parameters.
#[derive(Clone, Copy)]
enum Params<'a> {
    /// A kernel of the context's: one slot.
    Block(&'a ParamsBlock),
    /// A user's kernel's: its bytes and the bytes of its binding.
    Bytes(&'a [u8], u64),
    /// None (a user's kernel without parameters).
    None,
}

/// One dispatch for [`Context::record_locked`].
struct RecordedOp<'a> {
    pipeline: &'a wgpu::ComputePipeline,
    /// Group 0's layout and its key in the bind-group cache.
    layout: (LayoutId, &'a wgpu::BindGroupLayout),
    params: Params<'a>,
    ranges: Vec<Range>,
    more_groups: &'a [wgpu::BindGroup],
    workgroups: [u32; 3],
    /// The kernel's name, for timings.
    label: &'a dyn Fn() -> String,
}
