//! A small deterministic random number generator (SplitMix64), crate-private, at the bottom of the
//! layers so that every layer may use it: the planner's local search (`plan`), the seeded random
//! weights (`model`) and the seeded request streams (`paging`). Fixed seeds make each of them
//! repeatable.

#![deny(unsafe_code)]

/// SplitMix64: a 64-bit state advanced by a constant and mixed; the same seed gives the same
/// stream.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by the multiply-shift reduction.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}
