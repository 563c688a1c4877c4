//! A hierarchical bitmap: set, clear and test one bit in O(1), find the lowest set bit in
//! O(log64(bits)) — four word reads for 16 million bits.

/// A set of indices `[0, len)` stored as bits, with summary levels above the leaves. The summaries
/// are kept lazily: bit `j` of level `l + 1` is set whenever word `j` of level `l` is not zero, but
/// may stay set after that word becomes zero. So `remove` touches one word only, `insert` stops at
/// the first summary bit already set, and `first` clears the stale bits it walks into.
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
    pub(crate) fn insert(&mut self, index: usize) {
        self.levels[0][index >> 6] |= 1u64 << (index & 63);
        let mut position = index >> 6;
        for level in &mut self.levels[1..] {
            let word = &mut level[position >> 6];
            let bit = 1u64 << (position & 63);
            if *word & bit != 0 {
                return;
            }
            *word |= bit;
            position >>= 6;
        }
    }

    /// Removes `index` from the set (the summaries above are cleaned lazily).
    #[inline]
    pub(crate) fn remove(&mut self, index: usize) {
        self.levels[0][index >> 6] &= !(1u64 << (index & 63));
    }

    /// The lowest index in the set, if any. Clears the stale summary bits it meets.
    #[inline]
    pub(crate) fn first(&mut self) -> Option<usize> {
        let top = self.levels.len() - 1;
        'restart: loop {
            if self.levels[top][0] == 0 {
                return None;
            }
            let mut level = top;
            let mut word_index = 0usize;
            loop {
                let word = self.levels[level][word_index];
                if word == 0 {
                    // A stale summary bit led here: clear it and search again.
                    self.levels[level + 1][word_index >> 6] &= !(1u64 << (word_index & 63));
                    continue 'restart;
                }
                let next = (word_index << 6) | word.trailing_zeros() as usize;
                if level == 0 {
                    return Some(next);
                }
                word_index = next;
                level -= 1;
            }
        }
    }

    /// The lowest index in the set that is at least `index`, if any. O(log64(bits)) plus the stale
    /// summary bits it skips; it changes nothing.
    pub(crate) fn next_from(&self, index: usize) -> Option<usize> {
        let mut level = 0;
        let mut position = index;
        loop {
            // Climb until a level has a set bit at or after `position`.
            let word_index = position >> 6;
            let word = *self.levels.get(level)?.get(word_index)?;
            let masked = word & (!0u64 << (position & 63));
            if masked == 0 {
                // Later words of this level are the bits after `word_index` one level up.
                position = word_index + 1;
                level += 1;
                continue;
            }
            position = (word_index << 6) | masked.trailing_zeros() as usize;
            // Descend along the lowest set bits; a stale summary bit sends the search on past it.
            while level > 0 {
                let child = self.levels[level - 1][position];
                if child == 0 {
                    break;
                }
                position = (position << 6) | child.trailing_zeros() as usize;
                level -= 1;
            }
            if level == 0 {
                return Some(position);
            }
            position += 1;
        }
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

    proptest::proptest! {
        #[test]
        fn matches_a_set(ops in proptest::collection::vec((0u8..4, 0usize..300_000), 1..400)) {
            let mut bitmap = Bitmap::new(300_000);
            let mut model = std::collections::BTreeSet::new();
            for (op, index) in ops {
                match op {
                    0 | 1 => { bitmap.insert(index); model.insert(index); }
                    2 => {
                        // Remove an existing member most of the time.
                        let victim = model.range(index..).next().or(model.iter().next()).copied().unwrap_or(index);
                        bitmap.remove(victim);
                        model.remove(&victim);
                    }
                    _ => {
                        proptest::prop_assert_eq!(bitmap.next_from(index), model.range(index..).next().copied());
                    }
                }
                proptest::prop_assert_eq!(bitmap.first(), model.iter().next().copied());
                proptest::prop_assert_eq!(bitmap.contains(index), model.contains(&index));
            }
            let walked: Vec<usize> = bitmap.iter().collect();
            proptest::prop_assert_eq!(walked, model.into_iter().collect::<Vec<_>>());
        }
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
