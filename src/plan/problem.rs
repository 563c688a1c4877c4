//! A validated planning problem: sizes rounded up to the alignment, the conflict lists (which
//! buffers overlap which in time), the lower bound, and the conversion of offsets into a [`Plan`].

use super::buffers::{max_live_bytes, Buffer, Placement, Plan, PlanError, PlanOptions};

/// The buffers of one problem in the planner's terms. Buffers are named by their index in the
/// caller's slice.
pub(crate) struct Problem<'a> {
    /// The caller's buffers.
    pub(crate) buffers: &'a [Buffer],
    /// Sizes rounded up to the alignment: with every offset aligned, a buffer blocks exactly
    /// `[offset, offset + size)` for the buffers above it.
    pub(crate) size: Vec<u64>,
    /// `conflicts[start[i]..start[i + 1]]`: the buffers of nonzero size that overlap buffer `i` in
    /// time (empty for a zero-sized buffer).
    start: Vec<usize>,
    conflicts: Vec<u32>,
    /// The indices of the buffers of nonzero size.
    pub(crate) placeable: Vec<u32>,
    /// The caller's options.
    pub(crate) options: &'a PlanOptions,
    /// The most bytes alive at once (true sizes).
    pub(crate) max_live: u64,
    /// A lower bound on the heap of any plan, at least `max_live`: with alignment, the aligned
    /// sizes alive at once minus the slack of the topmost one.
    pub(crate) lower_bound: u64,
}

impl<'a> Problem<'a> {
    /// Validates the buffers and options and builds the conflict lists.
    pub(crate) fn new(buffers: &'a [Buffer], options: &'a PlanOptions) -> Result<Self, PlanError> {
        let alignment = options.alignment;
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(PlanError::BadAlignment(alignment));
        }
        if u32::try_from(buffers.len()).is_err() {
            return Err(PlanError::Overflow);
        }
        let mut ids: Vec<u64> = buffers.iter().map(|b| b.id).collect();
        ids.sort_unstable();
        if let Some(pair) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(PlanError::DuplicateId(pair[0]));
        }
        let size = aligned_sizes(buffers, options)?;
        let placeable: Vec<u32> = (0..buffers.len() as u32)
            .filter(|&i| size[i as usize] > 0)
            .collect();
        let (start, conflicts) = conflict_lists(buffers, &placeable);
        let max_live = max_live_bytes(buffers);
        let aligned: Vec<Buffer> = buffers
            .iter()
            .zip(&size)
            .map(|(b, &s)| Buffer { size: s, ..*b })
            .collect();
        let lower_bound = max_live.max(max_live_bytes(&aligned).saturating_sub(alignment - 1));
        Ok(Self {
            buffers,
            size,
            start,
            conflicts,
            placeable,
            options,
            max_live,
            lower_bound,
        })
    }

    /// The number of buffers.
    pub(crate) fn len(&self) -> usize {
        self.buffers.len()
    }

    /// The buffers of nonzero size that overlap buffer `i` in time.
    pub(crate) fn conflicts(&self, i: usize) -> &[u32] {
        &self.conflicts[self.start[i]..self.start[i + 1]]
    }

    /// The plan of the given arenas and offsets (one per buffer).
    pub(crate) fn plan(&self, arena: &[u32], offset: &[u64]) -> Plan {
        let arenas = arena.iter().map(|&a| a as usize + 1).max().unwrap_or(0);
        let mut arena_bytes = vec![0u64; arenas.max(usize::from(!self.buffers.is_empty()))];
        let placements = self
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let a = arena[i] as usize;
                if b.size > 0 {
                    arena_bytes[a] = arena_bytes[a].max(offset[i] + b.size);
                }
                Placement {
                    id: b.id,
                    arena: a,
                    offset: offset[i],
                }
            })
            .collect();
        let heap_bytes = arena_bytes.iter().sum();
        Plan {
            placements,
            arena_bytes,
            heap_bytes,
            max_live_bytes: self.max_live,
            alignment: self.options.alignment,
            max_arena_bytes: self.options.max_arena_bytes,
        }
    }

    /// `Ok(plan)` when it fits the capacity, the capacity error otherwise.
    pub(crate) fn within_capacity(&self, plan: Plan) -> Result<Plan, PlanError> {
        match self.options.capacity {
            Some(capacity) if plan.heap_bytes > capacity => Err(PlanError::OverCapacity {
                heap_bytes: plan.heap_bytes,
                capacity,
                max_live_bytes: self.max_live,
            }),
            _ => Ok(plan),
        }
    }
}

/// The size of each buffer rounded up to the alignment, once each lifetime is checked to be
/// nonempty and each size to be within the arena limit and to sum without overflow.
fn aligned_sizes(buffers: &[Buffer], options: &PlanOptions) -> Result<Vec<u64>, PlanError> {
    let mut size = Vec::with_capacity(buffers.len());
    let mut total: u64 = 0;
    for b in buffers {
        if b.lower == b.upper {
            return Err(PlanError::EmptyLifetime {
                id: b.id,
                lower: b.lower,
                upper: b.upper,
            });
        }
        if b.upper < b.lower {
            return Err(PlanError::InvertedLifetime {
                id: b.id,
                lower: b.lower,
                upper: b.upper,
            });
        }
        let aligned = b
            .size
            .checked_next_multiple_of(options.alignment)
            .ok_or(PlanError::Overflow)?;
        total = total.checked_add(aligned).ok_or(PlanError::Overflow)?;
        if let Some(limit) = options.max_arena_bytes {
            if b.size > limit {
                return Err(PlanError::TooLarge {
                    id: b.id,
                    size: b.size,
                    max_arena_bytes: limit,
                });
            }
        }
        size.push(aligned);
    }
    Ok(size)
}

/// The conflict lists of the `placeable` buffers, by a sweep over their starts, flattened:
/// `conflicts[start[i]..start[i + 1]]` are the buffers that overlap buffer `i` in time.
fn conflict_lists(buffers: &[Buffer], placeable: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let mut by_lower = placeable.to_vec();
    by_lower.sort_unstable_by_key(|&i| (buffers[i as usize].lower, i));
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); buffers.len()];
    let mut alive: Vec<u32> = Vec::new();
    for &i in &by_lower {
        let lower = buffers[i as usize].lower;
        alive.retain(|&j| buffers[j as usize].upper > lower);
        for &j in &alive {
            lists[i as usize].push(j);
            lists[j as usize].push(i);
        }
        alive.push(i);
    }
    let mut start = Vec::with_capacity(buffers.len() + 1);
    let mut conflicts = Vec::with_capacity(lists.iter().map(Vec::len).sum());
    start.push(0);
    for list in lists {
        conflicts.extend_from_slice(&list);
        start.push(conflicts.len());
    }
    (start, conflicts)
}
