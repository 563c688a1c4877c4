//! The free-run index: the regions of the arena (free runs and held ranges, linked in address
//! order) and the bin lists of free runs, with the two-level bitmap of the bins that list a run.
//! Splitting and merging runs is here; the allocator decides where.

use super::run::{Delta, Pieces, Tally};

/// The bits of a run's length, after its leading one, that pick its length bin (exact fit):
/// `1 << LENGTH_BITS` bins per power of two.
pub(super) const LENGTH_BITS: u32 = 4;
/// The bins per group: one group per power of two of the length (exact fit), or one per order of
/// the largest block (power of two, where only the first bin of each group is used).
pub(super) const GROUP_BINS: u32 = 1 << LENGTH_BITS;
/// All the bins: 64 groups.
pub(super) const BINS: usize = 64 << LENGTH_BITS;

/// The length bin of a run of `units` units: `units` itself below `2 << LENGTH_BITS`, above that
/// the power of two and the next [`LENGTH_BITS`] bits (a float with a [`LENGTH_BITS`]-bit
/// mantissa). Bins grow with the length; a bin holds the lengths from its lower bound to the next
/// bin's.
#[inline(always)]
pub(super) fn length_bin(units: u64) -> u32 {
    // Below `GROUP_BINS` the shift is 0 and the bin is `units`; above, `units >> shift` is the
    // leading one and the next `LENGTH_BITS` bits, which carries the group into the bin.
    let shift = (63 - (units | 1).leading_zeros()).max(LENGTH_BITS) - LENGTH_BITS;
    (shift << LENGTH_BITS) + (units >> shift) as u32
}

/// The shortest length in bin `bin`.
#[cfg_attr(not(test), allow(dead_code))]
pub(super) fn bin_floor(bin: u32) -> u64 {
    let (group, mantissa) = (bin >> LENGTH_BITS, u64::from(bin & (GROUP_BINS - 1)));
    if group == 0 {
        mantissa
    } else {
        (u64::from(GROUP_BINS) | mantissa) << (group - 1)
    }
}

/// No region: the end of a list.
pub(super) const NIL: u32 = u32::MAX;
/// The `list_prev` of a region held by an allocation.
pub(super) const HELD: u32 = u32::MAX - 1;

/// A run of units, free or held by one allocation. The regions tile `[0, capacity)` in address
/// order, starting with `regions[0]`; two free runs are never neighbours.
#[derive(Debug, Clone, Copy)]
pub(super) struct Region {
    pub(super) start: u64,
    pub(super) end: u64,
    /// The regions before and after in address order ([`NIL`] at the ends). A spare entry of the
    /// arena links the next spare entry in `next`.
    pub(super) prev: u32,
    pub(super) next: u32,
    /// A free run's neighbours in the list of its bin ([`NIL`] at the ends); [`HELD`] in
    /// `list_prev` marks a region held by an allocation.
    pub(super) list_prev: u32,
    pub(super) list_next: u32,
}

impl Region {
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.list_prev != HELD
    }

    #[inline]
    pub(super) fn pieces(&self) -> Pieces {
        Pieces::of(self.start, self.end)
    }
}

/// The regions with the bin lists and the spare list: what splitting and merging runs changes,
/// borrowed apart from the counters so that the arena's address stays in a register. Runs are
/// listed by length when `BY_LENGTH` (exact fit), else by the order of their largest block; the
/// choice is a constant so that no test of it is left in the list operations.
pub(super) struct Links<'a, const BY_LENGTH: bool> {
    pub(super) regions: &'a mut [Region],
    pub(super) heads: &'a mut [u32; BINS],
    pub(super) tails: &'a mut [u32; BINS],
    pub(super) groups: &'a mut u64,
    pub(super) bins: &'a mut [u64; 64],
    pub(super) spare: &'a mut u32,
}

impl<const BY_LENGTH: bool> Links<'_, BY_LENGTH> {
    /// The bin of the free run `run`.
    #[inline(always)]
    fn bin_of(&self, run: u32) -> u32 {
        let region = &self.regions[run as usize];
        if BY_LENGTH {
            length_bin(region.end - region.start)
        } else {
            region.pieces().top() << LENGTH_BITS
        }
    }

    /// Lists the free run `run` last in the list of its bin.
    #[inline(always)]
    pub(super) fn list(&mut self, run: u32) {
        self.list_in(self.bin_of(run), run);
    }

    /// Lists the free run `run` last in the list of bin `bin`, its bin.
    #[inline(always)]
    fn list_in(&mut self, bin: u32, run: u32) {
        let bin = bin as usize % BINS;
        let tail = self.tails[bin];
        let region = &mut self.regions[run as usize];
        region.list_prev = tail;
        region.list_next = NIL;
        if tail == NIL {
            self.heads[bin] = run;
            *self.groups |= 1u64 << (bin >> LENGTH_BITS);
            self.bins[bin >> LENGTH_BITS] |= 1u64 << (bin & (GROUP_BINS as usize - 1));
        } else {
            self.regions[tail as usize].list_next = run;
        }
        self.tails[bin] = run;
    }

    /// Moves the free run `run`, which was listed in bin `bin` between `list_prev` and `list_next`
    /// and has changed its length since, to the end of the list of its bin now: the same as
    /// [`Self::unlink_from`] then [`Self::list`], but a run that stays in its bin as the last one
    /// listed there (most bins list one run or none) is left where it is, untouched.
    #[inline(always)]
    pub(super) fn relist(&mut self, run: u32, bin: u32, list_prev: u32, list_next: u32) {
        let new_bin = self.bin_of(run);
        if list_next == NIL && new_bin == bin {
            return;
        }
        self.unlink_from(bin, list_prev, list_next);
        self.list_in(new_bin, run);
    }

    /// Takes the free run `run`, not yet changed since it was listed, out of the list of its bin,
    /// given its neighbours there.
    #[inline(always)]
    fn unlink(&mut self, run: u32, list_prev: u32, list_next: u32) {
        self.unlink_from(self.bin_of(run), list_prev, list_next);
    }

    /// Takes a free run out of the list of bin `bin`, its bin, given its neighbours there.
    #[inline(always)]
    pub(super) fn unlink_from(&mut self, bin: u32, list_prev: u32, list_next: u32) {
        let bin = bin as usize % BINS;
        if list_prev == NIL {
            self.heads[bin] = list_next;
        } else {
            self.regions[list_prev as usize].list_next = list_next;
        }
        if list_next == NIL {
            self.tails[bin] = list_prev;
            if list_prev == NIL {
                let group = bin >> LENGTH_BITS;
                self.bins[group] &= !(1u64 << (bin & (GROUP_BINS as usize - 1)));
                if self.bins[group] == 0 {
                    *self.groups &= !(1u64 << group);
                }
            }
        } else {
            self.regions[list_next as usize].list_prev = list_prev;
        }
    }

    /// Puts `index` on the spare list.
    #[inline(always)]
    fn spare(&mut self, index: u32) {
        self.regions[index as usize].next = *self.spare;
        *self.spare = index;
    }

    /// Frees the held region `index` and merges it with the free runs beside it: unlists them,
    /// links the merged run in address order (the first region is kept, the others become spare)
    /// and lists it (a run before that keeps its bin as the last listed stays where it is, which
    /// is the same order). Returns the change of the free counts: merging runs is coalescing
    /// buddies, and the merged run's blocks replace those of its parts.
    #[inline(always)]
    pub(super) fn merge(&mut self, index: u32) -> Delta {
        let held = self.regions[index as usize];
        debug_assert!(!held.is_free());
        // (`NIL` is past the end of the arena, so `get` finds no neighbour there.)
        let before_free = self
            .regions
            .get(held.prev as usize)
            .is_some_and(Region::is_free);
        let after_free = self
            .regions
            .get(held.next as usize)
            .is_some_and(Region::is_free);
        // The run after first: unlinking it may change the list links of the run before, which
        // are read after it.
        let (after_pieces, end, next) = if after_free {
            let after = self.regions[held.next as usize];
            self.unlink(held.next, after.list_prev, after.list_next);
            (Some(after.pieces()), after.end, after.next)
        } else {
            (None, held.end, held.next)
        };
        let keep = if before_free { held.prev } else { index };
        if next != NIL {
            self.regions[next as usize].prev = keep;
        }
        let (before_pieces, start) = if before_free {
            let before = self.regions[held.prev as usize];
            let bin = self.bin_of(held.prev);
            let region = &mut self.regions[held.prev as usize];
            region.end = end;
            region.next = next;
            self.relist(held.prev, bin, before.list_prev, before.list_next);
            self.spare(index);
            (Some(before.pieces()), before.start)
        } else {
            let region = &mut self.regions[index as usize];
            region.end = end;
            region.next = next;
            self.list(index);
            (None, held.start)
        };
        if after_free {
            self.spare(held.next);
        }
        let merged = Pieces::of(start, end);
        match (before_pieces, after_pieces) {
            (None, None) => Delta::add(merged),
            (Some(part), None) | (None, Some(part)) => Delta::swap(merged, part),
            (Some(before), Some(after)) => {
                let mut parts = Tally::default();
                parts.add(before);
                parts.add(after);
                let mut whole = Tally::default();
                whole.add(merged);
                Delta::between(&whole, &parts)
            }
        }
    }
}
