//! The segments of free ranges (the mid-sized and the large class): each an exact-fit free list of
//! address-ordered ranges that coalesce on free, so that the space a request frees serves later
//! requests of any size up to it. The pool keeps, per class, one index of every free range of
//! every segment of that class, by size, and takes the smallest that fits (best fit; ties to the
//! lowest slot, then the lowest offset), cutting the request from the range's start.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Index, IndexMut};

/// Which of the two classes of free ranges a segment serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeClass {
    /// Mid-sized requests (above `mid_above_bytes`, up to `large_above_bytes`).
    Mid,
    /// Large requests (above `large_above_bytes`).
    Large,
}

/// The free ranges and live bytes of one segment of free ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ranges {
    /// Free ranges as `offset -> length`, in bytes; never two adjacent ones (they coalesce).
    free: BTreeMap<u64, u64>,
    size_bytes: u64,
    allocated_bytes: u64,
    allocations: u64,
    class: RangeClass,
}

impl Ranges {
    /// A segment of `size_bytes`, all free.
    pub(crate) fn new(size_bytes: u64, class: RangeClass) -> Self {
        Self {
            free: BTreeMap::from([(0, size_bytes)]),
            size_bytes,
            allocated_bytes: 0,
            allocations: 0,
            class,
        }
    }

    /// The class the segment serves.
    pub(crate) fn class(&self) -> RangeClass {
        self.class
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.allocations == 0
    }

    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.allocated_bytes
    }

    pub(crate) fn allocations(&self) -> u64 {
        self.allocations
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.size_bytes - self.allocated_bytes
    }

    pub(crate) fn largest_free_bytes(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// The free ranges as `(offset, length)`, in address order.
    pub(crate) fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&offset, &length)| (offset, length))
    }

    /// Takes `bytes` from the start of the free range at `offset`. Returns the range's length
    /// before, and the free range left after it, if any.
    fn take(&mut self, offset: u64, bytes: u64) -> (u64, Option<(u64, u64)>) {
        let length = self
            .free
            .remove(&offset)
            .expect("the index names a free range of the segment");
        assert!(length >= bytes, "a free range too short for the request");
        self.allocated_bytes += bytes;
        self.allocations += 1;
        let rest = (length > bytes).then(|| (offset + bytes, length - bytes));
        if let Some((rest_offset, rest_length)) = rest {
            self.free.insert(rest_offset, rest_length);
        }
        (length, rest)
    }

    /// Gives back `bytes` at `offset`, merging with the free ranges on either side. Returns the
    /// ranges that merged (gone from the list) and the free range that holds it now.
    fn give(&mut self, offset: u64, bytes: u64) -> (Vec<(u64, u64)>, (u64, u64)) {
        let mut merged = Vec::new();
        let (mut start, mut end) = (offset, offset + bytes);
        if let Some((&before, &length)) = self.free.range(..offset).next_back() {
            assert!(
                before + length <= offset,
                "a freed range overlaps a free one"
            );
            if before + length == offset {
                self.free.remove(&before);
                merged.push((before, length));
                start = before;
            }
        }
        if let Some(&length) = self.free.get(&end) {
            self.free.remove(&end);
            merged.push((end, length));
            end += length;
        }
        assert!(
            self.free.range(offset..offset + bytes).next().is_none(),
            "a freed range overlaps a free one"
        );
        self.free.insert(start, end - start);
        self.allocated_bytes -= bytes;
        self.allocations -= 1;
        (merged, (start, end - start))
    }
}

/// Every free range of every segment of one class, as `(length, slot, offset)`: the smallest that fits a
/// request is the first at or after `(request, 0, 0)`.
#[derive(Debug, Default)]
pub(crate) struct FreeIndex {
    ranges: BTreeSet<(u64, usize, u64)>,
}

impl FreeIndex {
    /// The tightest free range of at least `bytes`, as `(slot, offset)`.
    pub(crate) fn best_fit(
        &self,
        bytes: u64,
        accept: impl Fn(u64, usize) -> bool,
    ) -> Option<(usize, u64)> {
        self.ranges
            .range((bytes, 0, 0)..)
            .find(|&&(length, slot, _)| accept(length, slot))
            .map(|&(_, slot, offset)| (slot, offset))
    }

    /// Lists a new segment of `size_bytes` in `slot`.
    pub(crate) fn add_segment(&mut self, slot: usize, size_bytes: u64) {
        self.ranges.insert((size_bytes, slot, 0));
    }

    /// Forgets every free range of the segment in `slot`.
    pub(crate) fn remove_segment(&mut self, slot: usize, ranges: &Ranges) {
        for (offset, length) in ranges.free_ranges() {
            self.ranges.remove(&(length, slot, offset));
        }
    }

    /// Takes `bytes` from the free range at `offset` of `ranges` (in `slot`).
    pub(crate) fn take(&mut self, slot: usize, ranges: &mut Ranges, offset: u64, bytes: u64) {
        let (length, rest) = ranges.take(offset, bytes);
        self.ranges.remove(&(length, slot, offset));
        if let Some((rest_offset, rest_length)) = rest {
            self.ranges.insert((rest_length, slot, rest_offset));
        }
    }

    /// Gives back `bytes` at `offset` of `ranges` (in `slot`).
    pub(crate) fn give(&mut self, slot: usize, ranges: &mut Ranges, offset: u64, bytes: u64) {
        let (merged, (start, length)) = ranges.give(offset, bytes);
        for (merged_offset, merged_length) in merged {
            self.ranges.remove(&(merged_length, slot, merged_offset));
        }
        self.ranges.insert((length, slot, start));
    }

    /// A copy of the index without the ranges of the segments whose slot is `excluded`: a model
    /// for planning.
    pub(crate) fn without(&self, excluded: impl Fn(usize) -> bool) -> Self {
        Self {
            ranges: self
                .ranges
                .iter()
                .copied()
                .filter(|r| !excluded(r.1))
                .collect(),
        }
    }

    /// Takes `bytes` from the start of the tightest free range (as [`FreeIndex::take`] would,
    /// on the model alone): `(slot, offset)`.
    pub(crate) fn take_best_fit(&mut self, bytes: u64) -> Option<(usize, u64)> {
        let range = *self.ranges.range((bytes, 0, 0)..).next()?;
        self.ranges.remove(&range);
        let (length, slot, offset) = range;
        if length > bytes {
            self.ranges.insert((length - bytes, slot, offset + bytes));
        }
        Some((slot, offset))
    }

    /// The number of free ranges listed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// The free-range index of each class of free ranges.
#[derive(Debug, Default)]
pub(crate) struct ClassIndexes {
    mid: FreeIndex,
    large: FreeIndex,
}

impl ClassIndexes {
    /// The number of free ranges listed in both classes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.mid.len() + self.large.len()
    }
}

impl Index<RangeClass> for ClassIndexes {
    type Output = FreeIndex;

    fn index(&self, class: RangeClass) -> &FreeIndex {
        match class {
            RangeClass::Mid => &self.mid,
            RangeClass::Large => &self.large,
        }
    }
}

impl IndexMut<RangeClass> for ClassIndexes {
    fn index_mut(&mut self, class: RangeClass) -> &mut FreeIndex {
        match class {
            RangeClass::Mid => &mut self.mid,
            RangeClass::Large => &mut self.large,
        }
    }
}
