//! The planner's vocabulary: buffers with lifetimes, options, plans, errors, and the checks that
//! need no search (the max-live lower bound and the validity of a plan).

use serde::{Deserialize, Serialize};

/// A buffer to place: `size` bytes alive over the steps `[lower, upper)`.
///
/// Two buffers *overlap in time* when their lifetimes intersect: `a.lower < b.upper` and
/// `b.lower < a.upper`. A buffer whose lifetime ends at step `t` and one that starts at `t` may
/// share memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Buffer {
    /// The caller's name for the buffer; unique within one planning problem.
    pub id: u64,
    /// The first step at which the buffer is alive.
    pub lower: u64,
    /// The first step at which the buffer is dead again (exclusive end of the lifetime).
    pub upper: u64,
    /// Its size in bytes. A zero-sized buffer is placed at offset 0 and occupies nothing.
    pub size: u64,
}

impl Buffer {
    /// A buffer `id` of `size` bytes alive over `[lower, upper)`.
    pub fn new(id: u64, lower: u64, upper: u64, size: u64) -> Self {
        Self {
            id,
            lower,
            upper,
            size,
        }
    }

    /// Whether the lifetimes of `self` and `other` intersect.
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// How to plan: alignment, limits, and how much search to spend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Every offset is a multiple of this (a power of two; 1 for none), e.g. the device's
    /// `min_storage_buffer_offset_alignment`.
    pub alignment: u64,
    /// When set, planning fails with [`PlanError::OverCapacity`] if the plan needs more bytes than
    /// this in total (over all arenas).
    pub capacity: Option<u64>,
    /// When set, no arena grows beyond this many bytes (e.g. the device's
    /// `max_storage_buffer_binding_size`): buffers are spread over as few arenas as the planner
    /// finds, each buffer wholly inside one arena.
    pub max_arena_bytes: Option<u64>,
    /// The work budget of [`plan`](super::plan), in steps. The skyline constructions may spend
    /// eleven twelfths of it (a step is a slot or a buffer looked at), the local search over
    /// orderings the rest (a step there is an already-placed buffer looked at while placing
    /// another, and counts 8), and the exact search of small instances up to a quarter more.
    /// The budget is a count, not a time, so the same input and options give the same plan on
    /// every machine; 0 leaves only the starting orderings.
    pub search_steps: u64,
    /// Instances with at most this many buffers (of nonzero size) are solved exactly by branch and
    /// bound (within a quarter of `search_steps`), when they fit in one arena.
    pub exact_max_buffers: usize,
}

impl PlanOptions {
    /// The default search budget: a quarter to half a second for a few hundred buffers on the
    /// 2-core Xeon the planner was tuned on (while other builds ran).
    pub const DEFAULT_SEARCH_STEPS: u64 = 200_000_000;

    /// The default options with offsets aligned to `alignment`.
    pub fn aligned(alignment: u64) -> Self {
        Self {
            alignment,
            ..Self::default()
        }
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            alignment: 1,
            capacity: None,
            max_arena_bytes: None,
            search_steps: Self::DEFAULT_SEARCH_STEPS,
            exact_max_buffers: 12,
        }
    }
}

/// Where one buffer lies: arena and byte offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The buffer's id.
    pub id: u64,
    /// The index of its arena in [`Plan::arena_bytes`].
    pub arena: usize,
    /// Its byte offset in the arena (a multiple of the alignment).
    pub offset: u64,
}

/// Offsets for a set of buffers, and what they cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// One placement per buffer, in the order of the buffers given to the planner.
    pub placements: Vec<Placement>,
    /// The size of each arena: the highest end (offset + size) of a buffer in it.
    pub arena_bytes: Vec<u64>,
    /// The bytes the plan needs: the sum of [`arena_bytes`](Self::arena_bytes).
    pub heap_bytes: u64,
    /// The most bytes alive at any one step: no plan needs fewer than this.
    pub max_live_bytes: u64,
    /// The alignment the offsets obey.
    pub alignment: u64,
    /// The arena limit the plan was made for, if any.
    pub max_arena_bytes: Option<u64>,
}

impl Plan {
    /// The bytes the plan spends above the lower bound: `heap_bytes - max_live_bytes`.
    pub fn waste_bytes(&self) -> u64 {
        self.heap_bytes.saturating_sub(self.max_live_bytes)
    }

    /// Checks the plan against the buffers it was made for: one placement per buffer with the
    /// same id, offsets aligned, every buffer inside its arena and every arena within the limit,
    /// `heap_bytes` the sum of the arenas, and no two buffers that overlap in time overlapping in
    /// memory in the same arena. `capacity`, when given, bounds `heap_bytes`.
    pub fn check(&self, buffers: &[Buffer], capacity: Option<u64>) -> Result<(), PlanError> {
        if self.placements.len() != buffers.len() {
            return Err(PlanError::Mismatch(format!(
                "{} placements for {} buffers",
                self.placements.len(),
                buffers.len()
            )));
        }
        if self.alignment == 0 || !self.alignment.is_power_of_two() {
            return Err(PlanError::BadAlignment(self.alignment));
        }
        self.check_arenas(capacity)?;
        self.check_placements(buffers)?;
        self.check_no_overlap(buffers)
    }

    /// The arenas within the limit, `heap_bytes` their sum and within `capacity`.
    fn check_arenas(&self, capacity: Option<u64>) -> Result<(), PlanError> {
        let mut total: u64 = 0;
        for (arena, &bytes) in self.arena_bytes.iter().enumerate() {
            if let Some(limit) = self.max_arena_bytes {
                if bytes > limit {
                    return Err(PlanError::Mismatch(format!(
                        "arena {arena} has {bytes} bytes, above the limit of {limit}"
                    )));
                }
            }
            total = total.checked_add(bytes).ok_or(PlanError::Overflow)?;
        }
        if total != self.heap_bytes {
            return Err(PlanError::Mismatch(format!(
                "heap_bytes is {} but the arenas add up to {total}",
                self.heap_bytes
            )));
        }
        if let Some(capacity) = capacity {
            if self.heap_bytes > capacity {
                return Err(PlanError::OverCapacity {
                    heap_bytes: self.heap_bytes,
                    capacity,
                    max_live_bytes: self.max_live_bytes,
                });
            }
        }
        Ok(())
    }

    /// Each placement for its buffer, aligned, inside its arena, and each arena's size the
    /// highest end of a buffer in it.
    fn check_placements(&self, buffers: &[Buffer]) -> Result<(), PlanError> {
        let mut used = vec![0u64; self.arena_bytes.len()];
        for (buffer, place) in buffers.iter().zip(&self.placements) {
            if buffer.id != place.id {
                return Err(PlanError::Mismatch(format!(
                    "placement of id {} where buffer {} was expected",
                    place.id, buffer.id
                )));
            }
            if place.offset % self.alignment != 0 {
                return Err(PlanError::Misaligned {
                    id: buffer.id,
                    offset: place.offset,
                    alignment: self.alignment,
                });
            }
            let Some(arena_bytes) = self.arena_bytes.get(place.arena) else {
                return Err(PlanError::Mismatch(format!(
                    "buffer {} is in arena {} of {}",
                    buffer.id,
                    place.arena,
                    self.arena_bytes.len()
                )));
            };
            let end = place
                .offset
                .checked_add(buffer.size)
                .ok_or(PlanError::Overflow)?;
            if buffer.size > 0 && end > *arena_bytes {
                return Err(PlanError::Mismatch(format!(
                    "buffer {} ends at {end}, past its arena's {arena_bytes} bytes",
                    buffer.id
                )));
            }
            used[place.arena] = used[place.arena].max(end);
        }
        if used != self.arena_bytes {
            return Err(PlanError::Mismatch(format!(
                "arena sizes {:?} but the buffers reach {used:?}",
                self.arena_bytes
            )));
        }
        Ok(())
    }

    /// No two buffers that overlap in time overlapping in memory in the same arena: a sweep over
    /// time, each buffer compared with the buffers alive when it starts.
    fn check_no_overlap(&self, buffers: &[Buffer]) -> Result<(), PlanError> {
        let mut by_start: Vec<usize> = (0..buffers.len())
            .filter(|&i| buffers[i].size > 0 && buffers[i].lower < buffers[i].upper)
            .collect();
        by_start.sort_by_key(|&i| (buffers[i].lower, i));
        let mut alive: Vec<usize> = Vec::new();
        for &i in &by_start {
            let b = &buffers[i];
            alive.retain(|&j| buffers[j].upper > b.lower);
            let (pi, bi_end) = (&self.placements[i], self.placements[i].offset + b.size);
            for &j in &alive {
                let pj = &self.placements[j];
                if pj.arena == pi.arena
                    && pi.offset < pj.offset + buffers[j].size
                    && pj.offset < bi_end
                {
                    return Err(PlanError::Overlap {
                        a: buffers[j].id,
                        b: b.id,
                    });
                }
            }
            alive.push(i);
        }
        Ok(())
    }
}

/// Why a planning problem or a plan was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A buffer's lifetime `[lower, upper)` is empty (`lower == upper`).
    #[error("buffer {id} has an empty lifetime [{lower}, {upper})")]
    EmptyLifetime {
        /// The buffer.
        id: u64,
        /// Its first step.
        lower: u64,
        /// Its end, equal to `lower`.
        upper: u64,
    },
    /// A buffer's lifetime ends before it starts (`upper < lower`).
    #[error("buffer {id} has an inverted lifetime [{lower}, {upper})")]
    InvertedLifetime {
        /// The buffer.
        id: u64,
        /// Its first step.
        lower: u64,
        /// Its end, below `lower`.
        upper: u64,
    },
    /// Two buffers share an id.
    #[error("two buffers have the id {0}")]
    DuplicateId(u64),
    /// The alignment is 0 or not a power of two.
    #[error("alignment {0} is not a power of two")]
    BadAlignment(u64),
    /// The sizes, aligned and summed, do not fit in a u64.
    #[error("the buffer sizes overflow u64 when aligned and summed")]
    Overflow,
    /// A buffer is larger than `max_arena_bytes`, so no arena can hold it.
    #[error(
        "buffer {id} of {size} bytes does not fit in an arena of at most {max_arena_bytes} bytes"
    )]
    TooLarge {
        /// The buffer.
        id: u64,
        /// Its size.
        size: u64,
        /// The arena limit.
        max_arena_bytes: u64,
    },
    /// The plan needs more bytes than the capacity allows.
    #[error(
        "the plan needs {heap_bytes} bytes, above the capacity of {capacity} bytes \
         (at least {max_live_bytes} bytes are alive at once)"
    )]
    OverCapacity {
        /// The bytes the best plan found needs.
        heap_bytes: u64,
        /// The capacity.
        capacity: u64,
        /// The lower bound.
        max_live_bytes: u64,
    },
    /// Two buffers that are alive at the same time overlap in memory (from [`Plan::check`]).
    #[error("buffers {a} and {b} are alive at the same time and overlap in memory")]
    Overlap {
        /// One buffer.
        a: u64,
        /// The other.
        b: u64,
    },
    /// An offset is not a multiple of the alignment (from [`Plan::check`]).
    #[error("buffer {id} is at offset {offset}, not a multiple of {alignment}")]
    Misaligned {
        /// The buffer.
        id: u64,
        /// Its offset.
        offset: u64,
        /// The alignment.
        alignment: u64,
    },
    /// The plan does not describe the buffers it is checked against (from [`Plan::check`]).
    #[error("the plan does not match the buffers: {0}")]
    Mismatch(String),
}

/// The most bytes alive at any one step (buffers with an empty or inverted lifetime count for
/// nothing; the sum saturates at `u64::MAX`). No plan needs fewer bytes than this.
pub fn max_live_bytes(buffers: &[Buffer]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(2 * buffers.len());
    for b in buffers.iter().filter(|b| b.lower < b.upper) {
        // At equal steps an end (false) sorts before a start (true): [lower, upper) is half-open.
        events.push((b.lower, true, b.size));
        events.push((b.upper, false, b.size));
    }
    events.sort_unstable();
    let (mut live, mut max): (u128, u128) = (0, 0);
    for (_, start, size) in events {
        if start {
            live += u128::from(size);
            max = max.max(live);
        } else {
            live -= u128::from(size);
        }
    }
    u64::try_from(max).unwrap_or(u64::MAX)
}
