//! Branch and bound for small instances: every plan can be pushed down until each buffer rests on
//! offset 0 or on the end of a buffer it overlaps in time; listing the buffers of such a plan by
//! offset, each one's offset is 0 or the end of a buffer listed before it. The search enumerates
//! these lists (offsets never decreasing, equal offsets in index order), so it finds an optimal
//! plan when it runs to the end.

use super::problem::Problem;

/// Searches for a plan in one arena with a heap below `upper`, within `budget` steps (one step is
/// one conflict looked at). Returns the best heap found below `upper` and its offsets (one per
/// buffer), or `None` when none was found.
pub(crate) fn branch_and_bound(
    problem: &Problem,
    upper: u64,
    budget: u64,
) -> Option<(u64, Vec<u64>)> {
    let n = problem.len();
    let mut state = State {
        problem,
        offset: vec![0; n],
        placed: vec![false; n],
        best: upper,
        best_offset: None,
        steps: 0,
        budget,
    };
    let remaining = problem.placeable.len();
    state.descend(remaining, 0, 0, usize::MAX);
    state.best_offset.map(|offsets| (state.best, offsets))
}

struct State<'p, 'a> {
    problem: &'p Problem<'a>,
    offset: Vec<u64>,
    placed: Vec<bool>,
    best: u64,
    best_offset: Option<Vec<u64>>,
    steps: u64,
    budget: u64,
}

impl State<'_, '_> {
    /// Places one more buffer at an offset of at least `last` (after `last_index` when equal),
    /// with `remaining` buffers left and the heap so far `top`.
    fn descend(&mut self, remaining: usize, top: u64, last: u64, last_index: usize) {
        if remaining == 0 {
            if top < self.best {
                self.best = top;
                self.best_offset = Some(self.offset.clone());
            }
            return;
        }
        if self.steps >= self.budget {
            return;
        }
        let p = self.problem;
        // Bound: every buffer left starts at `last` or above.
        let bound = p
            .placeable
            .iter()
            .filter(|&&b| !self.placed[b as usize])
            .map(|&b| last + p.buffers[b as usize].size)
            .max()
            .unwrap_or(0)
            .max(top);
        if bound >= self.best {
            return;
        }
        for k in 0..p.placeable.len() {
            let b = p.placeable[k] as usize;
            if self.placed[b] {
                continue;
            }
            let conflicts = p.conflicts(b);
            self.steps += conflicts.len() as u64 + 1;
            let mut candidates: Vec<u64> = conflicts
                .iter()
                .filter(|&&c| self.placed[c as usize])
                .map(|&c| self.offset[c as usize] + p.size[c as usize])
                .chain(std::iter::once(0))
                .filter(|&o| {
                    o > last || (o == last && (last_index == usize::MAX || b > last_index))
                })
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            for offset in candidates {
                let end = offset + p.buffers[b].size;
                if end.max(top) >= self.best {
                    break;
                }
                let free = conflicts.iter().all(|&c| {
                    let c = c as usize;
                    !self.placed[c]
                        || self.offset[c] + p.size[c] <= offset
                        || offset + p.size[b] <= self.offset[c]
                });
                if !free {
                    continue;
                }
                self.placed[b] = true;
                self.offset[b] = offset;
                self.descend(remaining - 1, top.max(end), offset, b);
                self.placed[b] = false;
                if self.steps >= self.budget {
                    return;
                }
            }
        }
    }
}
