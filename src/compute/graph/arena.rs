//! The arena plans place their tensors in: [`PlanArena`].

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::compute::context::Context;
use crate::compute::shared::Shared;
use crate::compute::types::ComputeError;
use crate::plan::Buffer;
use crate::pool::{AllocOptions, Allocation, Pool};

impl Context {
    /// An empty arena for plans of this context to share (see [`PlanArena`]); captures of
    /// another context refuse it.
    pub fn plan_arena(&self) -> PlanArena {
        PlanArena {
            context: Arc::downgrade(&self.shared),
            inner: Arc::new(Mutex::new(ArenaState {
                pool: self.pool().clone(),
                allocations: Vec::new(),
                generation: 0,
                labelled_heap: 0,
                own_segments: false,
            })),
        }
    }
}

/// An arena for plans: pool allocations (one per arena index) that plans place their tensors
/// in. Plans that share one arena are never replayed at the same time: they are all of the
/// context that made it ([`Context::plan_arena`]; a capture of another context refuses it with
/// [`ComputeError::ForeignArena`]), whose replays are ordered, one after another. So it holds as
/// much as its largest plan needs; building a larger plan replaces an allocation (the old range
/// is given back after the submissions that use it) and the plans bound to it make their bind
/// groups again at their next replay.
#[derive(Clone)]
pub struct PlanArena {
    /// The context that made it: the only one whose plans may use it.
    context: Weak<Shared>,
    inner: Arc<Mutex<ArenaState>>,
}

impl std::fmt::Debug for PlanArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanArena")
            .field("bytes", &self.bytes())
            .finish()
    }
}

pub(super) struct ArenaState {
    pub(super) pool: Pool,
    pub(super) allocations: Vec<Allocation>,
    /// Bumped whenever an allocation is replaced.
    pub(super) generation: u64,
    /// The heap of the plan whose tensors label the arena's ranges.
    labelled_heap: u64,
    /// Each allocation in a segment sized for it ([`Pool::allocate_in_own_segment`]).
    own_segments: bool,
}

impl PlanArena {
    /// Whether `context` made this arena. (The weak reference keeps the context's allocation,
    /// so no later context can have its address.)
    pub(super) fn is_of(&self, context: &Context) -> bool {
        std::ptr::eq(self.context.as_ptr(), Arc::as_ptr(&context.shared))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ArenaState> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes of the arena's allocations.
    pub fn bytes(&self) -> u64 {
        self.lock().allocations.iter().map(Allocation::size).sum()
    }

    /// Makes the arena's allocations from now on each in a segment sized for it
    /// ([`Pool::allocate_in_own_segment`]): the pool then reserves their bytes rounded to a
    /// block, known before they are made.
    pub(crate) fn use_own_segments(&self) {
        self.lock().own_segments = true;
    }

    /// Grows the arena to hold `sizes` (one per arena index).
    pub(crate) fn reserve(&self, sizes: &[u64], label: &str) -> Result<(), ComputeError> {
        let mut state = self.lock();
        for (index, &size) in sizes.iter().enumerate() {
            let have = state.allocations.get(index).map_or(0, Allocation::size);
            if have >= size {
                continue;
            }
            let options = AllocOptions {
                label,
                bindable: false,
                ..AllocOptions::default()
            };
            let allocation = if state.own_segments {
                state.pool.allocate_in_own_segment(size, options)?
            } else {
                state.pool.allocate_with(size, options)?
            };
            if index < state.allocations.len() {
                state.allocations[index] = allocation;
            } else {
                state.allocations.push(allocation);
            }
            state.generation += 1;
        }
        Ok(())
    }
}

impl PlanArena {
    /// Labels the arena's ranges with the tensors of `planned` that use them, if it is the
    /// largest plan placed in the arena so far (the one that sized it).
    pub(super) fn label(
        &self,
        planned: &crate::plan::Plan,
        buffers: &[Buffer],
        names: &[String],
    ) -> Result<(), ComputeError> {
        let mut state = self.lock();
        if planned.heap_bytes < state.labelled_heap {
            return Ok(());
        }
        state.labelled_heap = planned.heap_bytes;
        for (arena, allocation) in state.allocations.iter().enumerate() {
            // Elementary ranges between the ends of the tensors placed in this arena.
            let placed: Vec<(u64, u64, usize)> = planned
                .placements
                .iter()
                .zip(buffers)
                .enumerate()
                .filter(|(_, (placement, buffer))| placement.arena == arena && buffer.size > 0)
                .map(|(id, (placement, buffer))| {
                    (placement.offset, placement.offset + buffer.size, id)
                })
                .collect();
            let mut bounds: Vec<u64> = placed.iter().flat_map(|&(a, b, _)| [a, b]).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let mut parts: Vec<(u64, u64, String)> = Vec::new();
            for pair in bounds.windows(2) {
                let (start, end) = (pair[0], pair[1]);
                let users: Vec<&str> = placed
                    .iter()
                    .filter(|&&(a, b, _)| a <= start && end <= b)
                    .map(|&(_, _, id)| names[id].as_str())
                    .collect();
                if users.is_empty() {
                    continue;
                }
                let label = match users.len() {
                    1..=4 => users.join(", "),
                    n => format!("{}, +{} more", users[..3].join(", "), n - 3),
                };
                match parts.last_mut() {
                    Some(last) if last.0 + last.1 == start && last.2 == label => {
                        last.1 += end - start
                    }
                    _ => parts.push((start, end - start, label)),
                }
            }
            state.pool.label_parts(allocation, &parts)?;
        }
        Ok(())
    }
}
