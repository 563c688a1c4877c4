//! The buddy blocks of a run of free units, in closed form, and per-order counts of a few runs.
//!
//! The allocator keeps free space as maximal runs of free units. The buddy blocks of a run are its
//! canonical decomposition (what [`for_each_piece`] walks: from the start, always the largest
//! aligned block that fits). That decomposition rises then falls: blocks of increasing order from
//! the start up to the most aligned point of the run, then blocks of decreasing order to the end.
//! The orders of the rising blocks are the set bits of their total length and so are those of the
//! falling blocks, so two words describe every block of a run, with no walk.

/// The canonical decomposition of the run `[start, end)` into aligned buddy blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pieces {
    /// The start of the run.
    pub(crate) start: u64,
    /// The most aligned point of `[start, end]`, where the blocks stop growing.
    pub(crate) split: u64,
    /// Bit `k` is set when a block of order `k` lies in `[start, split)` (lowest order first).
    pub(crate) rising: u64,
    /// Bit `k` is set when a block of order `k` lies in `[split, end)` (highest order first).
    pub(crate) falling: u64,
}

impl Pieces {
    /// The blocks of `[start, end)`: none when it is empty.
    #[inline]
    pub(crate) fn of(start: u64, end: u64) -> Self {
        debug_assert!(start <= end, "run [{start}, {end})");
        // (The `| 1` leaves the highest bit of a difference alone, and makes an empty run's
        // split its end.)
        let highest_difference = 63 - (start ^ end | 1).leading_zeros();
        let split = end & (u64::MAX << highest_difference);
        Self {
            start,
            split,
            rising: split - start,
            falling: end - split,
        }
    }

    /// Bit `k` is set when the run holds a block of order `k` (one or two of them).
    #[inline]
    pub(crate) fn orders(&self) -> u64 {
        self.rising | self.falling
    }

    /// The order of the run's largest block.
    #[inline]
    pub(crate) fn top(&self) -> u32 {
        63 - self.orders().leading_zeros()
    }

    /// The start of the lowest-addressed block of `order`, which the run must hold.
    #[inline]
    pub(crate) fn block_start(&self, order: u32) -> u64 {
        debug_assert!(self.orders() >> order & 1 == 1);
        // Both candidates, then a select: which side holds the block is data, not a pattern.
        let rising = self.start + (self.rising & ((1u64 << order) - 1));
        let falling = self.split + (self.falling & (u64::MAX << order << 1));
        let in_rising = 0u64.wrapping_sub(self.rising >> order & 1);
        (rising & in_rising) | (falling & !in_rising)
    }
}

/// Per-order block counts of up to three runs, bit-sliced: bit `k` of `bits[j]` is bit `j` of the
/// number of blocks of order `k` (a run holds at most two blocks of one order).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    bits: [u64; 3],
}

impl Tally {
    /// Adds one block of every order set in `mask`.
    #[inline]
    fn add_mask(&mut self, mask: u64) {
        let carry_one = self.bits[0] & mask;
        self.bits[0] ^= mask;
        let carry_two = self.bits[1] & carry_one;
        self.bits[1] ^= carry_one;
        self.bits[2] ^= carry_two;
    }

    /// Adds the blocks of a run.
    #[inline]
    pub(crate) fn add(&mut self, pieces: Pieces) {
        self.add_mask(pieces.rising);
        self.add_mask(pieces.falling);
    }
}

/// A change of every per-order count at once, from -4 to 3 each, bit-sliced in two's complement:
/// bit `k` of `bits[j]` is bit `j` of the change at order `k`. Every change the allocator makes
/// fits: a cut replaces one run by at most one (-2 to 2), a free replaces at most two runs by one
/// (-4 to 2).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delta {
    bits: [u64; 3],
}

impl Delta {
    /// `plus - minus`, order by order; `plus` holds at most three blocks of an order, and the
    /// difference must lie in -4..=3.
    #[inline]
    pub(crate) fn between(plus: &Tally, minus: &Tally) -> Self {
        debug_assert!(
            plus.bits[2] == 0,
            "more than three blocks of an order added"
        );
        // plus + !minus + 1, in three bits.
        let mut bits = [0u64; 3];
        let mut carry = u64::MAX;
        for (j, bit) in bits.iter_mut().enumerate() {
            let a = plus.bits.get(j).copied().unwrap_or(0);
            let b = !minus.bits.get(j).copied().unwrap_or(0);
            *bit = a ^ b ^ carry;
            carry = (a & b) | (carry & (a ^ b));
        }
        Self { bits }
    }

    /// One more block of every block of `pieces` (a run made free whole).
    #[inline]
    pub(crate) fn add(pieces: Pieces) -> Self {
        // A count of 0, 1 or 2 blocks: its two bits.
        let (rising, falling) = (pieces.rising, pieces.falling);
        Self {
            bits: [rising ^ falling, rising & falling, 0],
        }
    }

    /// The blocks of the run `plus` in place of those of the run `minus`: `Delta::between` for one
    /// run on each side, in fewer word operations.
    #[inline]
    pub(crate) fn swap(plus: Pieces, minus: Pieces) -> Self {
        // Each side counts 0 to 2 blocks of an order, in two bits; their difference (-2 to 2)
        // in three, by a two-bit subtraction whose borrow out is the sign.
        let (plus_one, plus_two) = (plus.rising ^ plus.falling, plus.rising & plus.falling);
        let (minus_one, minus_two) = (minus.rising ^ minus.falling, minus.rising & minus.falling);
        let borrow_one = !plus_one & minus_one;
        // (`minus_two` and `borrow_one` are never both set: two blocks leave no odd one.)
        let sign = !plus_two & (minus_two | borrow_one);
        Self {
            bits: [
                plus_one ^ minus_one,
                plus_two ^ minus_two ^ borrow_one,
                sign,
            ],
        }
    }

    /// One block of `order` less, and one more block of every order set in `tail` (below `order`).
    #[inline]
    pub(crate) fn split(order: u32, tail: u64) -> Self {
        debug_assert!(tail >> order == 0);
        let taken = 1u64 << order;
        Self {
            bits: [tail | taken, taken, taken],
        }
    }
}

/// The low bits of each count, held bit-sliced in [`Counts`]: four, one more than a [`Delta`], so
/// that a count wraps at most once per update and then lands in the middle of the low range. Each
/// plane fewer is a few word operations less on every allocate and free, for more carries into
/// `high`: on the benchmark (cachegrind) three planes took 1% fewer instructions than four on
/// `churn` but had 19% more branch mispredictions, five 3% more instructions for 5% fewer.
const LOW_BITS: usize = 4;

/// The step of `high` in [`Counts`]: half the range of the low bits, so that a count that has just
/// carried or borrowed sits in the middle of that range.
const HIGH_STEP: u64 = 1 << (LOW_BITS - 1);

/// One count per order (64 of them): `count[k] = high[k] * HIGH_STEP + low[k]`, the low part (from
/// 0 to 15) bit-sliced (bit `k` of `low[j]` is bit `j` of the low part of order `k`) and the high
/// part in `high[k]`. Adding a [`Delta`] to all 64 counts is a fixed sequence of word operations,
/// with no branch that depends on the data except for the counts whose low part leaves 0..=15.
///
/// A low part that carries past 15 (or borrows below 0) moves [`HIGH_STEP`] into (or out of) the
/// high part, which leaves it in the middle of its range (8 to 10, or 4 to 7): a count that goes
/// back and forth across a boundary carries once, not on every crossing (with `high` counting
/// sixteens, a count moving between 15 and 16 carried on every update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counts {
    low: [u64; LOW_BITS],
    high: [u64; 64],
    /// Bit `k` is set when `high[k]` is not zero (then the count is at least [`HIGH_STEP`]).
    high_orders: u64,
}

impl Counts {
    /// All counts zero.
    pub(crate) fn new() -> Self {
        Self {
            low: [0; LOW_BITS],
            high: [0; 64],
            high_orders: 0,
        }
    }

    /// Adds `delta` to every count. No count may go below zero.
    #[inline]
    pub(crate) fn add(&mut self, delta: &Delta) {
        let sign = delta.bits[2];
        let mut carry = 0u64;
        for (j, plane) in self.low.iter_mut().enumerate() {
            // Above its own three bits the delta is its sign, repeated.
            let bit = if j < 3 { delta.bits[j] } else { sign };
            let sum = *plane ^ bit ^ carry;
            carry = (*plane & bit) | (carry & (*plane ^ bit));
            *plane = sum;
        }
        // Where the carry out of the low bits differs from the sign, the low part wrapped: up past
        // 15 where the delta is positive (it is now 0 to 2: the top bit is clear), down past 0
        // where it is negative (now 12 to 15: the top bit is set). Flipping the top bit moves
        // `HIGH_STEP` between the parts.
        let mut wrapped = carry ^ sign;
        if wrapped == 0 {
            return;
        }
        self.low[LOW_BITS - 1] ^= wrapped;
        while wrapped != 0 {
            let order = wrapped.trailing_zeros();
            wrapped &= wrapped - 1;
            // +1, or -1 (all ones) where the delta is negative.
            let step = 1 | 0u64.wrapping_sub(sign >> order & 1);
            let high = &mut self.high[order as usize];
            *high = high.wrapping_add(step);
            self.high_orders = self.high_orders & !(1 << order) | u64::from(*high != 0) << order;
        }
    }

    /// Bit `k` is set when the count of order `k` is not zero.
    #[inline]
    pub(crate) fn orders(&self) -> u64 {
        self.low
            .iter()
            .fold(self.high_orders, |orders, plane| orders | plane)
    }

    /// The count of `order`.
    pub(crate) fn get(&self, order: u32) -> u64 {
        let low: u64 = self
            .low
            .iter()
            .enumerate()
            .map(|(j, plane)| (plane >> order & 1) << j)
            .sum();
        self.high[order as usize] * HIGH_STEP + low
    }

    /// Sets the count of `order` (for tests).
    #[cfg(test)]
    fn set(&mut self, order: u32, count: u64) {
        // Any split with a low part of 0 to 15 is valid; this one keeps the low part below 8.
        let (high, low) = (count / HIGH_STEP, count % HIGH_STEP);
        for (j, plane) in self.low.iter_mut().enumerate() {
            *plane = *plane & !(1 << order) | (low >> j & 1) << order;
        }
        self.high[order as usize] = high;
        self.high_orders = self.high_orders & !(1 << order) | u64::from(high != 0) << order;
    }
}

/// Calls `f(start, order)` for each aligned block of the canonical decomposition of `[start, end)`
/// into buddy blocks, in address order (at most `2 * max_order + 2` blocks).
pub(super) fn for_each_piece(start: u64, end: u64, max_order: u32, mut f: impl FnMut(u64, u32)) {
    let mut position = start;
    while position < end {
        let alignment = if position == 0 {
            63
        } else {
            position.trailing_zeros()
        };
        let fits = 63 - (end - position).leading_zeros();
        let order = alignment.min(fits).min(max_order);
        f(position, order);
        position += 1u64 << order;
    }
}

#[cfg(test)]
mod tests {
    use super::{Counts, Delta, Pieces, Tally};
    use proptest::prelude::*;

    /// The decomposition walked one block at a time.
    fn walked(start: u64, end: u64) -> Vec<(u64, u32)> {
        let mut blocks = Vec::new();
        super::for_each_piece(start, end, 63, |s, o| blocks.push((s, o)));
        blocks
    }

    /// The decomposition read from the closed form.
    fn closed_form(start: u64, end: u64) -> Vec<(u64, u32)> {
        let pieces = Pieces::of(start, end);
        let mut blocks = Vec::new();
        let mut position = start;
        for order in 0..64 {
            if pieces.rising >> order & 1 == 1 {
                blocks.push((position, order));
                position += 1 << order;
            }
        }
        assert_eq!(position, pieces.split);
        for order in (0..64).rev() {
            if pieces.falling >> order & 1 == 1 {
                blocks.push((position, order));
                position += 1 << order;
            }
        }
        assert_eq!(position, end);
        blocks
    }

    #[test]
    fn examples() {
        // [5, 8): 1 unit at 5, 2 at 6.
        assert_eq!(closed_form(5, 8), vec![(5, 0), (6, 1)]);
        // [0, 40): the roots of a 40-unit capacity.
        assert_eq!(closed_form(0, 40), vec![(0, 5), (32, 3)]);
        // [4, 12): two blocks of order 2 that are not buddies.
        assert_eq!(closed_form(4, 12), vec![(4, 2), (8, 2)]);
        let pieces = Pieces::of(4, 12);
        assert_eq!((pieces.top(), pieces.block_start(2)), (2, 4));
        let pieces = Pieces::of(3, 13);
        assert_eq!(closed_form(3, 13), vec![(3, 0), (4, 2), (8, 2), (12, 0)]);
        assert_eq!(pieces.block_start(0), 3);
        assert_eq!(Pieces::of(1, 2).top(), 0);
        // An empty run has no blocks.
        assert_eq!(Pieces::of(6, 6).orders(), 0);
    }

    proptest! {
        #[test]
        fn the_closed_form_is_the_walk(start in 0u64..1 << 34, len in 1u64..1 << 34) {
            let end = start + len;
            let blocks = walked(start, end);
            prop_assert_eq!(&closed_form(start, end), &blocks);
            let pieces = Pieces::of(start, end);
            prop_assert_eq!(pieces.top(), blocks.iter().map(|b| b.1).max().unwrap());
            for order in 0..64 {
                let first = blocks.iter().find(|b| b.1 == order).map(|b| b.0);
                prop_assert_eq!(pieces.orders() >> order & 1 == 1, first.is_some());
                if let Some(first) = first {
                    prop_assert_eq!(pieces.block_start(order), first);
                }
            }
        }

        #[test]
        fn deltas_change_the_counts(
            // One run added and two taken away: what a free that merges both neighbours does.
            runs in prop::collection::vec((0u64..1 << 20, 1u64..1 << 20), 3),
            counts in prop::collection::vec(10u64..1 << 36, 64),
            split in (0u32..36, any::<u64>()),
        ) {
            let mut applied = Counts::new();
            for (order, &count) in counts.iter().enumerate() {
                applied.set(order as u32, count);
            }
            let mut expected: Vec<i64> = counts.iter().map(|&c| c as i64).collect();
            let mut plus = Tally::default();
            let mut minus = Tally::default();
            for (i, &(start, len)) in runs.iter().enumerate() {
                let (tally, sign) = if i < 1 { (&mut plus, 1) } else { (&mut minus, -1) };
                tally.add(Pieces::of(start, start + len));
                for (_, order) in walked(start, start + len) {
                    expected[order as usize] += sign;
                }
            }
            applied.add(&Delta::between(&plus, &minus));
            let (order, tail) = (split.0, split.1 & ((1u64 << split.0) - 1));
            applied.add(&Delta::split(order, tail));
            expected[order as usize] -= 1;
            for (k, count) in expected.iter_mut().enumerate() {
                *count += (tail >> k & 1) as i64;
            }
            let applied: Vec<i64> = (0..64).map(|k| applied.get(k) as i64).collect();
            prop_assert_eq!(applied, expected);
        }

        #[test]
        fn swap_and_add_are_between(
            plus in (0u64..1 << 40, 0u64..1 << 40),
            minus in (0u64..1 << 40, 1u64..1 << 40),
        ) {
            // Empty runs (no blocks) included on the side added.
            let plus = Pieces::of(plus.0, plus.0 + plus.1);
            let minus = Pieces::of(minus.0, minus.0 + minus.1);
            let (mut plus_tally, mut minus_tally) = (Tally::default(), Tally::default());
            plus_tally.add(plus);
            minus_tally.add(minus);
            prop_assert_eq!(Delta::swap(plus, minus), Delta::between(&plus_tally, &minus_tally));
            prop_assert_eq!(Delta::swap(minus, plus), Delta::between(&minus_tally, &plus_tally));
            prop_assert_eq!(Delta::add(plus), Delta::between(&plus_tally, &Tally::default()));
        }

        #[test]
        fn large_counts_carry_and_borrow(order in 0u32..64, start in 1u64..1 << 39) {
            let mut counts = Counts::new();
            let mut one = Tally::default();
            one.add_mask(1 << order);
            counts.set(order, start);
            counts.add(&Delta::between(&one, &Tally::default()));
            prop_assert_eq!(counts.get(order), start + 1);
            counts.add(&Delta::between(&Tally::default(), &one));
            counts.add(&Delta::between(&Tally::default(), &one));
            prop_assert_eq!(counts.get(order), start - 1);
        }
    }
}
