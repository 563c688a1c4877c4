//! The planner: best-fit and first-fit placement under several orderings, then an iterated local
//! search over the ordering, and branch and bound for small instances.

use crate::rng::SplitMix64;

use super::buffers::{Buffer, Plan, PlanError, PlanOptions};
use super::exact::branch_and_bound;
use super::greedy::size_order;
use super::place::{Decoder, Fit};
use super::problem::Problem;
use super::skyline::{Rule, Skyline};

/// What one step of the local search (a placed buffer looked at) costs in the budget, in steps
/// of the skyline construction (a slot or buffer looked at): about their ratio in time.
const DECODER_STEP_COST: u64 = 8;

/// Plans the buffers: aligned offsets such that no two buffers alive at the same time overlap in
/// memory, in one arena or, with `max_arena_bytes`, in as few as the search finds, using as few
/// bytes as the search finds. Deterministic, and never worse than
/// [`greedy_by_size`](super::greedy_by_size), whose plan is one of its starting points.
///
/// The search, within [`PlanOptions::search_steps`], stopping early at the lower bound:
///
/// 1. several orderings (by size, by size × lifetime, by lifetime, by start, by end, by number of
///    conflicts, by the bytes of the conflicts) are each placed with best fit and with first fit;
/// 2. bottom-up skyline constructions (one arena): the lowest flat stretch of the skyline is
///    filled next, preferring a buffer at its left end after which the rest of the stretch can
///    still be tiled exactly by the buffers that fit in it; three deterministic rules, then, in
///    turn, randomised tie-breaking and replays of the best construction's choices up to a
///    random point followed by randomised ones. When none of the three deterministic
///    constructions beats step 1, the skyline stops there and leaves its budget to step 3;
/// 3. an iterated local search over the ordering of the best so far: a buffer that reaches the
///    top of its arena (or, one time in four, any buffer) moves to an earlier position, the
///    buffers from there on are placed again, and the move is kept when the heap does not grow;
/// 4. instances of at most `options.exact_max_buffers` buffers are then solved by branch and
///    bound (exactly, unless its budget runs out first).
pub fn plan(buffers: &[Buffer], options: &PlanOptions) -> Result<Plan, PlanError> {
    let problem = Problem::new(buffers, options)?;
    let mut search = Search::new(&problem);
    search.start();
    let skyline_steps = search.skyline(options.search_steps / 12 * 11);
    search.improve(options.search_steps.saturating_sub(skyline_steps) / DECODER_STEP_COST);
    let mut best = problem.plan(&search.best_arena, &search.best_offset);
    if problem.placeable.len() <= options.exact_max_buffers
        && best.heap_bytes > problem.lower_bound
        && best.arena_bytes.len() <= 1
    {
        if let Some((heap, offsets)) =
            branch_and_bound(&problem, best.heap_bytes, options.search_steps / 4)
        {
            let fits = options.max_arena_bytes.is_none_or(|limit| heap <= limit);
            if heap < best.heap_bytes && fits {
                best = problem.plan(&vec![0; problem.len()], &offsets);
            }
        }
    }
    problem.within_capacity(best)
}

/// The state of the search.
struct Search<'p, 'a> {
    problem: &'p Problem<'a>,
    decoder: Decoder<'p, 'a>,
    rng: SplitMix64,
    /// The best heap found and its placement.
    best_heap: u64,
    best_offset: Vec<u64>,
    best_arena: Vec<u32>,
    /// The best ordering and its fit.
    best_order: Vec<u32>,
    best_fit: Fit,
}

impl<'p, 'a> Search<'p, 'a> {
    fn new(problem: &'p Problem<'a>) -> Self {
        let n = problem.len();
        Self {
            problem,
            decoder: Decoder::new(problem),
            rng: SplitMix64::new(0x9e37_79b9_7f4a_7c15 ^ problem.placeable.len() as u64),
            best_heap: u64::MAX,
            best_offset: vec![0; n],
            best_arena: vec![0; n],
            best_order: Vec::new(),
            best_fit: Fit::Best,
        }
    }

    /// Places the starting orderings, each with both fits, and keeps the best.
    fn start(&mut self) {
        let p = self.problem;
        let b = |i: u32| &p.buffers[i as usize];
        let len = |i: u32| b(i).upper - b(i).lower;
        let degree = |i: u32| p.conflicts(i as usize).len() as u64;
        let size = |i: u32| p.size[i as usize];
        let mut orders: Vec<Vec<u32>> = vec![size_order(p)];
        let keyed = |key: &dyn Fn(u32) -> (u128, u64)| {
            let mut order = p.placeable.clone();
            order.sort_by_key(|&i| (key(i), i));
            order
        };
        let rev = |x: u128| u128::MAX - x;
        orders.push(keyed(&|i| {
            (rev(u128::from(size(i)) * u128::from(len(i))), 0)
        }));
        orders.push(keyed(&|i| (rev(u128::from(len(i))), u64::MAX - size(i))));
        orders.push(keyed(&|i| (u128::from(b(i).lower), u64::MAX - size(i))));
        orders.push(keyed(&|i| {
            (rev(u128::from(b(i).upper)), u64::MAX - size(i))
        }));
        orders.push(keyed(&|i| (rev(u128::from(degree(i))), u64::MAX - size(i))));
        orders.push(keyed(&|i| {
            let weight: u128 = p
                .conflicts(i as usize)
                .iter()
                .map(|&c| u128::from(size(c)))
                .sum();
            (rev(weight + u128::from(size(i))), u64::MAX - size(i))
        }));
        for order in orders {
            for fit in [Fit::Best, Fit::First] {
                let heap = self.decoder.place(&order, 0, fit);
                if heap < self.best_heap {
                    self.keep(heap, &order, fit);
                }
            }
        }
    }

    /// Skyline constructions within `budget` steps; the best, if better, becomes the best plan
    /// and its placement order the starting point of the local search.
    ///
    /// Returns the steps spent. When none of the three deterministic constructions beats the
    /// starting orderings, the instance is not one that tiles well and the rest of the budget
    /// is left to the local search.
    fn skyline(&mut self, budget: u64) -> u64 {
        let p = self.problem;
        if p.placeable.is_empty() {
            return 0;
        }
        let mut sky = Skyline::new(p);
        let (mut incumbent, mut incumbent_heap) = (Vec::new(), u64::MAX);
        let mut run = 0u64;
        while sky.steps < budget && self.best_heap > p.lower_bound {
            if run == 3 && incumbent_heap > self.best_heap {
                break;
            }
            // Three deterministic rules, then in turn a fresh randomised construction and one
            // that replays the best construction's choices up to a random point.
            let rule = Rule {
                key: (run % 3) as u8,
                noise: if run < 3 { 0 } else { 32 * (1 + run % 8) },
            };
            let prefix = if run >= 3 && run.is_multiple_of(2) {
                let cut = self.rng.below(incumbent.len() as u64 + 1) as usize;
                &incumbent[..cut]
            } else {
                &[][..]
            };
            run += 1;
            let heap = sky.build(rule, &mut self.rng, prefix);
            if heap <= incumbent_heap {
                incumbent_heap = heap;
                incumbent.clone_from(&sky.choices);
            }
            let fits = p.options.max_arena_bytes.is_none_or(|limit| heap <= limit);
            if fits && heap < self.best_heap {
                self.best_heap = heap;
                self.best_offset.copy_from_slice(&sky.offset);
                self.best_arena.fill(0);
                self.best_order.clone_from(&sky.order);
                self.best_fit = Fit::First;
            }
        }
        sky.steps
    }

    fn keep(&mut self, heap: u64, order: &[u32], fit: Fit) {
        self.best_heap = heap;
        self.best_offset.copy_from_slice(&self.decoder.offset);
        self.best_arena.copy_from_slice(&self.decoder.arena);
        self.best_order.clear();
        self.best_order.extend_from_slice(order);
        self.best_fit = fit;
    }

    /// Iterated local search over the ordering, within `budget` placement steps.
    fn improve(&mut self, budget: u64) {
        let p = self.problem;
        let n = self.best_order.len();
        if n < 2 {
            return;
        }
        let budget = self.decoder.steps.saturating_add(budget);
        let fit = self.best_fit;
        let mut order = self.best_order.clone();
        let mut heap = self.decoder.place(&order, 0, fit);
        let mut saved_offset: Vec<u64> = Vec::with_capacity(n);
        let mut saved_arena: Vec<u32> = Vec::with_capacity(n);
        let mut top: Vec<usize> = Vec::new();
        while self.decoder.steps < budget && self.best_heap > p.lower_bound {
            // The buffers reaching the top of their arena (positions in the order): a pass over
            // all of them, counted as such.
            self.decoder.steps += n as u64;
            top.clear();
            let mut tops: Vec<u64> = Vec::new();
            for &b in &order {
                let a = self.decoder.arena[b as usize] as usize;
                if tops.len() <= a {
                    tops.resize(a + 1, 0);
                }
                let end = self.decoder.offset[b as usize] + p.buffers[b as usize].size;
                tops[a] = tops[a].max(end);
            }
            for (k, &b) in order.iter().enumerate() {
                let a = self.decoder.arena[b as usize] as usize;
                if self.decoder.offset[b as usize] + p.buffers[b as usize].size == tops[a] {
                    top.push(k);
                }
            }
            let (from, to) = {
                let k = top[self.rng.below(top.len() as u64) as usize];
                if k == 0 || self.rng.below(4) == 0 {
                    // A random buffer to a random place.
                    let from = self.rng.below(n as u64) as usize;
                    let mut to = self.rng.below(n as u64 - 1) as usize;
                    if to >= from {
                        to += 1;
                    }
                    (from, to)
                } else {
                    (k, self.rng.below(k as u64) as usize)
                }
            };
            let first = from.min(to);
            saved_offset.clear();
            saved_arena.clear();
            for &b in &order[first..] {
                saved_offset.push(self.decoder.offset[b as usize]);
                saved_arena.push(self.decoder.arena[b as usize]);
            }
            move_item(&mut order, from, to);
            let new_heap = self.decoder.place(&order, first, fit);
            if new_heap <= heap {
                heap = new_heap;
                if heap < self.best_heap {
                    self.keep(heap, &order, fit);
                }
            } else {
                move_item(&mut order, to, from);
                for (k, &b) in order[first..].iter().enumerate() {
                    self.decoder.offset[b as usize] = saved_offset[k];
                    self.decoder.arena[b as usize] = saved_arena[k];
                }
                self.decoder.set_positions(&order, first);
            }
        }
    }
}

/// Moves `order[from]` to position `to`, shifting the items between.
fn move_item(order: &mut [u32], from: usize, to: usize) {
    if from < to {
        order[from..=to].rotate_left(1);
    } else {
        order[to..=from].rotate_right(1);
    }
}
