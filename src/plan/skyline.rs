//! A bottom-up skyline construction: the steps are cut into slots between consecutive lifetime
//! boundaries, each slot has a floor (the top of what was placed over it), and the lowest flat
//! stretch of floor is filled next with a buffer whose whole lifetime lies in it, or, when no
//! buffer fits there, raised to the lower of its neighbours (the space below can serve no buffer
//! placed later). Which buffer fills a stretch is chosen by a rule, randomised across runs.

use crate::rng::SplitMix64;

use super::problem::Problem;

/// The slots of a problem and the reusable state of a construction.
pub(crate) struct Skyline<'p, 'a> {
    problem: &'p Problem<'a>,
    /// The placeable buffers.
    items: Vec<u32>,
    /// The first slot and the end slot of each item.
    first: Vec<u32>,
    end: Vec<u32>,
    /// The floor of each slot.
    floor: Vec<u64>,
    /// Whether each item is placed.
    done: Vec<bool>,
    /// The offset of each buffer (by buffer index) after a construction.
    pub(crate) offset: Vec<u64>,
    /// The buffers in the order they were placed.
    pub(crate) order: Vec<u32>,
    /// The choices of the last construction (item indices), to replay a prefix of.
    pub(crate) choices: Vec<u32>,
    /// Work spent so far (slots and items looked at).
    pub(crate) steps: u64,
}

/// How a construction breaks ties among the buffers that fit a stretch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    /// 0: larger size first; 1: longer lifetime first; 2: larger area first.
    pub(crate) key: u8,
    /// The chance, in 1/1024ths, that a choice is a random fitting buffer instead.
    pub(crate) noise: u64,
}

impl<'p, 'a> Skyline<'p, 'a> {
    /// Cuts the steps of `problem` into slots.
    pub(crate) fn new(problem: &'p Problem<'a>) -> Self {
        let mut items = problem.placeable.clone();
        // By start, so that the buffers starting in a stretch are a range of items.
        items.sort_by_key(|&i| (problem.buffers[i as usize].lower, i));
        let mut points: Vec<u64> = items
            .iter()
            .flat_map(|&i| {
                let b = &problem.buffers[i as usize];
                [b.lower, b.upper]
            })
            .collect();
        points.sort_unstable();
        points.dedup();
        let slot = |t: u64| points.partition_point(|&p| p < t) as u32;
        let first = items
            .iter()
            .map(|&i| slot(problem.buffers[i as usize].lower))
            .collect();
        let end = items
            .iter()
            .map(|&i| slot(problem.buffers[i as usize].upper))
            .collect();
        let slots = points.len().saturating_sub(1);
        Self {
            problem,
            done: vec![false; items.len()],
            items,
            first,
            end,
            floor: vec![0; slots],
            offset: vec![0; problem.len()],
            order: Vec::new(),
            choices: Vec::new(),
            steps: 0,
        }
    }

    /// Builds one plan with `rule`, making the choices of `prefix` first (the choices of an
    /// earlier construction, which are valid again because the construction is the same up to
    /// there); returns its heap (with the true sizes). The offsets are in
    /// `self.offset`, the placement order in `self.order`.
    pub(crate) fn build(&mut self, rule: Rule, rng: &mut SplitMix64, prefix: &[u32]) -> u64 {
        let p = self.problem;
        self.floor.fill(0);
        self.done.fill(false);
        self.order.clear();
        self.choices.clear();
        let mut left = self.items.len();
        let mut heap = 0u64;
        let mut fitting: Vec<usize> = Vec::new();
        let mut tiles: Vec<bool> = Vec::new();
        while left > 0 {
            let stretch = self.lowest_stretch();
            self.fitting_in(stretch, &mut fitting);
            if fitting.is_empty() {
                self.raise(stretch);
                continue;
            }
            self.tilings(stretch, &fitting, &mut tiles);
            self.steps += (fitting.len() + stretch.hi - stretch.lo) as u64;
            let chosen = self.choose(rule, rng, prefix, stretch, &mut fitting, &tiles);
            let b = self.items[chosen] as usize;
            self.choices.push(chosen as u32);
            self.done[chosen] = true;
            left -= 1;
            self.offset[b] = stretch.low;
            self.order.push(b as u32);
            heap = heap.max(stretch.low + p.buffers[b].size);
            let top = stretch.low + p.size[b];
            self.floor[self.first[chosen] as usize..self.end[chosen] as usize].fill(top);
        }
        heap
    }

    /// The lowest slot (leftmost among equals) and its flat stretch.
    fn lowest_stretch(&mut self) -> Stretch {
        self.steps += self.floor.len() as u64;
        let (mut at, mut low) = (0usize, u64::MAX);
        for (s, &f) in self.floor.iter().enumerate() {
            if f < low {
                (at, low) = (s, f);
            }
        }
        let mut lo = at;
        while lo > 0 && self.floor[lo - 1] == low {
            lo -= 1;
        }
        let mut hi = at + 1;
        while hi < self.floor.len() && self.floor[hi] == low {
            hi += 1;
        }
        Stretch { lo, hi, low }
    }

    /// The items not yet placed whose whole lifetime lies in `stretch`, in item order, into
    /// `fitting`.
    fn fitting_in(&mut self, stretch: Stretch, fitting: &mut Vec<usize>) {
        fitting.clear();
        let from = self.first.partition_point(|&f| (f as usize) < stretch.lo);
        let to = self.first.partition_point(|&f| (f as usize) < stretch.hi);
        self.steps += (to - from) as u64;
        for k in from..to {
            if !self.done[k] && self.end[k] as usize <= stretch.hi {
                fitting.push(k);
            }
        }
    }

    /// Raises a stretch that no buffer fits to the lower of its neighbours.
    fn raise(&mut self, stretch: Stretch) {
        let Stretch { lo, hi, .. } = stretch;
        let left_floor = if lo > 0 { self.floor[lo - 1] } else { u64::MAX };
        let right_floor = self.floor.get(hi).copied().unwrap_or(u64::MAX);
        let raised = left_floor.min(right_floor);
        self.floor[lo..hi].fill(raised);
    }

    /// Which slots of the stretch can start an exact tiling of the rest of it by the fitting
    /// buffers, into `tiles`: `tiles[s - lo]`. (`fitting` is in item order, by first slot: read
    /// backwards, every buffer is seen after all those starting where it ends.)
    fn tilings(&self, stretch: Stretch, fitting: &[usize], tiles: &mut Vec<bool>) {
        let lo = stretch.lo;
        tiles.clear();
        tiles.resize(stretch.hi - lo + 1, false);
        tiles[stretch.hi - lo] = true;
        for &k in fitting.iter().rev() {
            let (f, e) = (self.first[k] as usize - lo, self.end[k] as usize - lo);
            tiles[f] |= tiles[e];
        }
    }

    /// The item that fills the stretch: the next choice of `prefix` if any; else a buffer at the
    /// left end after which the rest of the stretch can still be tiled exactly, then buffers that
    /// touch both ends of the stretch, then one end; then the rule (or, with the rule's noise, a
    /// random one of the best class).
    fn choose(
        &self,
        rule: Rule,
        rng: &mut SplitMix64,
        prefix: &[u32],
        stretch: Stretch,
        fitting: &mut Vec<usize>,
        tiles: &[bool],
    ) -> usize {
        let p = self.problem;
        let Stretch { lo, hi, .. } = stretch;
        let touches = |k: usize| {
            let left = self.first[k] as usize == lo;
            let exact = left && tiles[self.end[k] as usize - lo];
            2 * usize::from(exact) + usize::from(left) + usize::from(self.end[k] as usize == hi)
        };
        let key = |k: usize| -> u128 {
            let b = &p.buffers[self.items[k] as usize];
            let size = u128::from(p.size[self.items[k] as usize]);
            let len = u128::from(b.upper - b.lower);
            match rule.key {
                0 => size,
                1 => len,
                _ => size * len,
            }
        };
        if let Some(&k) = prefix.get(self.choices.len()) {
            k as usize
        } else if rule.noise > 0 && rng.below(1024) < rule.noise {
            let class = fitting.iter().map(|&k| touches(k)).max().unwrap_or(0);
            fitting.retain(|&k| touches(k) == class);
            fitting[rng.below(fitting.len() as u64) as usize]
        } else {
            *fitting
                .iter()
                .max_by_key(|&&k| (touches(k), key(k), std::cmp::Reverse(k)))
                .expect("not empty")
        }
    }
}

/// A flat stretch of floor: the slots `[lo, hi)`, all at height `low`.
#[derive(Clone, Copy)]
struct Stretch {
    lo: usize,
    hi: usize,
    low: u64,
}
