//! A hierarchical bitmap: set, clear and test one bit in O(1), find the lowest set bit in
//! O(log64(bits)) — four word reads for 16 million bits.

/// A set of indices `[0, len)` stored as bits, with summary levels above the leaves: bit `j` of
/// level `l + 1` is set exactly when word `j` of level `l` is not zero.
#[derive(Debug, Clone)]
pub(crate) struct Bitmap {
    /// `levels[0]` holds the leaves; the last level holds exactly one word.
    levels: Vec<Vec<u64>>,
}

impl Bitmap {
    /// An empty bitmap able to hold the indices `[0, len)`; `len` must be at least 1.
    pub(crate) fn new(len: usize) -> Self {
        let mut levels = Vec::new();
        let mut words = len.div_ceil(64).max(1);
        loop {
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            words = words.div_ceil(64);
        }
        Self { levels }
    }

    /// Whether `index` is in the set.
    #[inline]
    pub(crate) fn contains(&self, index: usize) -> bool {
        self.levels[0][index >> 6] & (1u64 << (index & 63)) != 0
    }

    /// Adds `index` to the set.
    #[inline]
    pub(crate) fn insert(&mut self, mut index: usize) {
        for level in &mut self.levels {
            let word = &mut level[index >> 6];
            let was_empty = *word == 0;
            *word |= 1u64 << (index & 63);
            if !was_empty {
                return;
            }
            index >>= 6;
        }
    }

    /// Removes `index` from the set.
    #[inline]
    pub(crate) fn remove(&mut self, mut index: usize) {
        for level in &mut self.levels {
            let word = &mut level[index >> 6];
            *word &= !(1u64 << (index & 63));
            if *word != 0 {
                return;
            }
            index >>= 6;
        }
    }

    /// The lowest index in the set, if any.
    #[inline]
    pub(crate) fn first(&self) -> Option<usize> {
        let top = self.levels.len() - 1;
        if self.levels[top][0] == 0 {
            return None;
        }
        let mut word_index = 0usize;
        for level in self.levels.iter().rev() {
            let word = level[word_index];
            word_index = (word_index << 6) | word.trailing_zeros() as usize;
        }
        Some(word_index)
    }

    /// The lowest index in the set that is at least `index`, if any. O(log64(bits)).
    pub(crate) fn next_from(&self, index: usize) -> Option<usize> {
        let mut level = 0;
        let mut position = index;
        // Climb until a level has a set bit at or after `position`.
        loop {
            let words = self.levels.get(level)?;
            let word_index = position >> 6;
            let word = *words.get(word_index)?;
            let masked = word & (!0u64 << (position & 63));
            if masked != 0 {
                position = (word_index << 6) | masked.trailing_zeros() as usize;
                break;
            }
            // Later words of this level are the bits after `word_index` one level up.
            position = word_index + 1;
            level += 1;
        }
        // Descend along the lowest set bits.
        while level > 0 {
            level -= 1;
            let word = self.levels[level][position];
            position = (position << 6) | word.trailing_zeros() as usize;
        }
        Some(position)
    }

    /// Every index in the set, in increasing order (a scan of the leaves; for reports, not hot paths).
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.levels[0]
            .iter()
            .enumerate()
            .filter(|(_, word)| **word != 0)
            .flat_map(|(word_index, &word)| {
                let mut rest = word;
                std::iter::from_fn(move || {
                    if rest == 0 {
                        return None;
                    }
                    let bit = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    Some((word_index << 6) | bit)
                })
            })
    }

    /// Heap bytes held by this bitmap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.levels.iter().map(|l| l.len() * 8).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Bitmap;

    #[test]
    fn insert_remove_first_across_levels() {
        let mut bitmap = Bitmap::new(64 * 64 * 3 + 5);
        assert_eq!(bitmap.first(), None);
        bitmap.insert(64 * 64 * 3 + 4);
        bitmap.insert(4097);
        assert_eq!(bitmap.first(), Some(4097));
        assert!(bitmap.contains(4097));
        assert!(!bitmap.contains(4096));
        bitmap.remove(4097);
        assert_eq!(bitmap.first(), Some(64 * 64 * 3 + 4));
        bitmap.insert(0);
        assert_eq!(bitmap.iter().collect::<Vec<_>>(), vec![0, 64 * 64 * 3 + 4]);
        bitmap.remove(0);
        bitmap.remove(64 * 64 * 3 + 4);
        assert_eq!(bitmap.first(), None);
        assert_eq!(bitmap.iter().count(), 0);
    }

    #[test]
    fn next_from_walks_the_set_in_order() {
        let len = 64 * 64 * 64 + 100;
        let mut bitmap = Bitmap::new(len);
        let members = [3usize, 64, 65, 4095, 4096, 64 * 64 * 64 + 99];
        for &m in &members {
            bitmap.insert(m);
        }
        let mut walked = Vec::new();
        let mut from = 0;
        while let Some(next) = bitmap.next_from(from) {
            walked.push(next);
            from = next + 1;
        }
        assert_eq!(walked, members);
        assert_eq!(bitmap.next_from(66), Some(4095));
        assert_eq!(bitmap.next_from(len + 500), None);
    }

    #[test]
    fn one_bit_bitmap() {
        let mut bitmap = Bitmap::new(1);
        bitmap.insert(0);
        assert_eq!(bitmap.first(), Some(0));
        bitmap.remove(0);
        assert_eq!(bitmap.first(), None);
    }
}
