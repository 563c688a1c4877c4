//! The pool's statistics: counters with their peaks and totals, and the figures derived from them.

/// A counter's current value, its peak, and its running total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counter {
    /// The value now.
    pub current: u64,
    /// The highest value seen.
    pub peak: u64,
    /// The sum of every increase (allocated in total).
    pub total: u64,
    /// The sum of every decrease (freed in total).
    pub freed: u64,
}

impl Counter {
    pub(crate) fn add(&mut self, amount: u64) {
        self.current += amount;
        self.total += amount;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn sub(&mut self, amount: u64) {
        self.current -= amount;
        self.freed += amount;
    }

    /// Starts a new peak from the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// The pool's statistics as plain data.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Bytes of segments held (the memory the pool took from the device).
    pub reserved_bytes: Counter,
    /// Bytes held by allocations after rounding: live ones, and (in the GPU pool) dropped ones
    /// whose ranges wait for a submission before reuse (`pending_free_bytes` of them; see
    /// [`PoolStats::live_allocated_bytes`]).
    pub allocated_bytes: Counter,
    /// Bytes asked for by the allocations holding a range: live ones and pending frees, as in
    /// `allocated_bytes`.
    pub requested_bytes: Counter,
    /// Allocations holding a range: live ones and pending frees (see
    /// [`PoolStats::live_allocations`]).
    pub allocations: Counter,
    /// Segments held, of every class.
    pub segments: Counter,
    /// Calls to the storage's `create_segment` that succeeded (each a `create_buffer` on a GPU).
    pub create_segment_calls: u64,
    /// Out-of-memory errors returned.
    pub oom_count: u64,
    /// The largest free block in any segment now, in bytes.
    pub largest_free_bytes: u64,
    /// Free bytes in all segments now, in bytes.
    pub free_bytes: u64,
    /// Bytes of segments that hold no allocation now (what `trim` would give back), counted in
    /// `free_bytes`.
    #[serde(default)]
    pub empty_segment_bytes: u64,
    /// The largest free block now in a segment that holds an allocation, in bytes (what is free
    /// but would not be given back).
    #[serde(default)]
    pub largest_held_free_bytes: u64,
    /// Dropped allocations whose ranges wait for a submission before reuse (PyTorch's
    /// `active_pending_free` blocks), counted in `allocations` (0 where nothing waits: the policy
    /// alone, the replay, the naive baseline).
    #[serde(default)]
    pub pending_frees: u64,
    /// Their bytes after rounding, counted in `allocated_bytes`.
    #[serde(default)]
    pub pending_free_bytes: u64,
}

impl PoolStats {
    /// Bytes held by live allocations, after rounding: `allocated_bytes` without the pending
    /// frees (what PyTorch's `memory_allocated` counts: it drops at free).
    pub fn live_allocated_bytes(&self) -> u64 {
        self.allocated_bytes
            .current
            .saturating_sub(self.pending_free_bytes)
    }

    /// Live allocations: `allocations` without the pending frees.
    pub fn live_allocations(&self) -> u64 {
        self.allocations.current.saturating_sub(self.pending_frees)
    }

    /// Starts new peaks from the current values of every counter.
    pub fn reset_peaks(&mut self) {
        for counter in [
            &mut self.reserved_bytes,
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.allocations,
            &mut self.segments,
        ] {
            counter.reset_peak();
        }
    }

    /// `1 - requested / allocated` over live allocations (0 when none).
    pub fn internal_fragmentation(&self) -> f64 {
        ratio_complement(self.requested_bytes.current, self.allocated_bytes.current)
    }

    /// `1 - largest free block / free bytes` over the segments that hold an allocation: the
    /// share of free memory that would not be given back by trimming and lies outside the
    /// largest free block (0 when nothing is free there). Empty segments are apart
    /// (`empty_segment_bytes`): a pool of empty segments is not fragmented.
    pub fn external_fragmentation(&self) -> f64 {
        ratio_complement(
            self.largest_held_free_bytes,
            self.free_bytes.saturating_sub(self.empty_segment_bytes),
        )
    }
}

fn ratio_complement(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        1.0 - part as f64 / whole as f64
    }
}
