//! What a context's handles share ([`Shared`]: the context, its tensors' storages and plans hold
//! it): the recording state behind one lock, the tensors' storages and their registry (what
//! compaction may move), and the hand-over of dropped tensors' ranges — kept while the open batch
//! may use them, given to an op's output of the same size, given back once the batch is submitted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, Weak};

use super::kernels::Kernels;
use super::options::{ContextOptions, ContextStats};
use super::record::{BindGroups, ParamsRing, PassRecorder};
use super::timing::{KernelTiming, Timer, TimestampSupport};
use super::types::{DType, KernelKey, ParamsBlock, TunedChoices};
use super::user_kernel::{UserBindGroup, UserKernel};
use crate::device::{AccountedBuffer, Gpu};
use crate::pool::{Allocation, Pool};

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
    pub(crate) allocation: RwLock<Option<Allocation>>,
    /// Pins ([`Storage::pin`]) that keep compaction from moving the tensor without a lock held.
    pub(crate) pins: AtomicUsize,
    /// Set once the allocation was handed to the user ([`Tensor::allocation`](super::Tensor::allocation)):
    /// work the context does not see (the user's own encoder) may use it, so when the tensor is
    /// dropped its range waits for the pool's next submission, like any dropped allocation, and
    /// no op's output takes it.
    pub(crate) exposed: AtomicBool,
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
    pub(crate) slot: MutexGuard<'a, Option<AccountedBuffer>>,
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
pub(crate) fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A tensor's pool allocation, borrowed ([`Tensor::allocation`](super::Tensor::allocation)):
/// derefs to the [`Allocation`]. While it lives, compaction leaves the tensor where it is; drop
/// it before calling [`Context::compact`](crate::compute::Context::compact) if the tensor should be movable.
pub struct TensorAllocation<'a> {
    pub(crate) guard: RwLockReadGuard<'a, Option<Allocation>>,
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

/// The open batch.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) encoder: Option<wgpu::CommandEncoder>,
    /// The open pass and the pipeline set in it.
    pub(crate) recorder: PassRecorder,
    pub(crate) dispatches: u32,
}

pub(crate) struct State {
    pub(crate) kernels: Kernels,
    pub(crate) bind_groups: BindGroups,
    pub(crate) ring: ParamsRing,
    pub(crate) batch: Batch,
    pub(crate) timer: Option<Timer>,
    pub(crate) timings: Vec<KernelTiming>,
    pub(crate) stats: ContextStats,
    /// The pool's count of segments given back, when the bind-group cache was last checked.
    pub(crate) segments_freed_seen: u64,
    /// The open capture's steps.
    pub(crate) tape: Option<Tape>,
}

pub(crate) struct Shared {
    pub(crate) pool: Pool,
    pub(crate) gpu: Gpu,
    pub(crate) options: ContextOptions,
    pub(crate) limits: wgpu::Limits,
    pub(crate) timestamps: TimestampSupport,
    /// Bytes of tensors dropped since the last submission.
    pub(crate) freed_bytes: AtomicU64,
    /// The allocations of tensors dropped since the last submission, by size in bytes: the open
    /// batch may still use them, so they go back to the pool only after the batch is submitted
    /// ([`Pool::free_submitted`]), whoever else submits to the pool meanwhile. Until then an op
    /// of the batch may take one for its output ([`Shared::take_deferred`]).
    pub(crate) deferred: Mutex<HashMap<u64, Vec<Allocation>>>,
    /// The buffer this context's plans read their outputs back through ([`Context::plan_read_back`]).
    pub(crate) plan_read_back: Mutex<Option<AccountedBuffer>>,
    /// The allocations of exposed tensors dropped since the last submission (see
    /// [`Shared::free_tensor`]): kept until the batch is submitted, taken by no op.
    pub(crate) deferred_exposed: Mutex<Vec<Allocation>>,
    /// Set from the first op recorded into a batch until that batch is submitted: while it is
    /// clear, a dropped tensor's last use is submitted and its range is reusable at once.
    pub(crate) batch_open: AtomicBool,
    /// The id of the open capture, 0 when none: while set, ops make symbolic tensors and record
    /// into the capture's tape instead of the batch.
    pub(crate) capturing: AtomicU64,
    /// The storages with memory of the context's live tensors, by address: what compaction may
    /// move.
    pub(crate) registry: Mutex<HashMap<usize, Weak<Storage>>>,
    /// Bumped whenever a compaction moved tensors: plans that bind tensors make their bind groups
    /// again when it changed.
    pub(crate) moved: AtomicU64,
    /// The matmul autotuner's choices for this device and these options, found in the
    /// process-wide registry at the first tuned matmul (so a matmul looks up its shape class
    /// alone).
    pub(crate) tuned: OnceLock<Arc<TunedChoices>>,
    pub(crate) state: Mutex<State>,
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
    pub(crate) fn release_deferred(&self) {
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

    pub(crate) fn registry(&self) -> MutexGuard<'_, HashMap<usize, Weak<Storage>>> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
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
