//! Placement of buffers one by one in a given order, each at a gap among the buffers placed
//! before it that overlap it in time (the decoder that turns an ordering into offsets).

use super::problem::Problem;

/// Which gap a buffer takes among those large enough for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The smallest gap that is large enough (TFLite's greedy planners); the top when none is.
    Best,
    /// The lowest gap that is large enough.
    First,
}

/// Places buffers in an order and remembers where, so that a changed order re-places only from
/// the first changed position on.
pub(crate) struct Decoder<'p, 'a> {
    problem: &'p Problem<'a>,
    /// The offset of each buffer (valid for those placed).
    pub(crate) offset: Vec<u64>,
    /// The arena of each buffer (valid for those placed).
    pub(crate) arena: Vec<u32>,
    /// The position of each buffer in the order being placed (`u32::MAX` for none).
    position: Vec<u32>,
    /// Scratch: (offset, end) of the placed neighbours of the buffer being placed.
    neighbours: Vec<(u64, u64)>,
    /// Placement steps spent so far (one per neighbour looked at).
    pub(crate) steps: u64,
}

impl<'p, 'a> Decoder<'p, 'a> {
    /// A decoder for `problem` with nothing placed.
    pub(crate) fn new(problem: &'p Problem<'a>) -> Self {
        let n = problem.len();
        Self {
            problem,
            offset: vec![0; n],
            arena: vec![0; n],
            position: vec![u32::MAX; n],
            neighbours: Vec::new(),
            steps: 0,
        }
    }

    /// Places `order[from..]` with `fit`, given that `order[..from]` was placed by an earlier call
    /// with the same prefix, and returns the heap: the sum over arenas of the highest end.
    ///
    /// `order` lists the placeable buffers (nonzero size), each once.
    pub(crate) fn place(&mut self, order: &[u32], from: usize, fit: Fit) -> u64 {
        self.set_positions(order, from);
        let limit = self.problem.options.max_arena_bytes;
        for &b in &order[from..] {
            let b = b as usize;
            let (arena, offset) = match limit {
                None => (0, self.fit_in_arena(b, None, fit).unwrap_or(0)),
                Some(limit) => {
                    let mut arena = 0;
                    loop {
                        if let Some(offset) = self.fit_in_arena(b, Some((arena, limit)), fit) {
                            break (arena, offset);
                        }
                        arena += 1;
                    }
                }
            };
            self.arena[b] = arena;
            self.offset[b] = offset;
        }
        self.heap(order)
    }

    /// Records the positions of `order[from..]` (after an order was changed back).
    pub(crate) fn set_positions(&mut self, order: &[u32], from: usize) {
        for (k, &b) in order.iter().enumerate().skip(from) {
            self.position[b as usize] = k as u32;
        }
    }

    /// The offset where buffer `b` goes among its neighbours placed before it (those in
    /// `arena` when arenas are limited), or `None` when it does not fit under the limit.
    fn fit_in_arena(&mut self, b: usize, arena: Option<(u32, u64)>, fit: Fit) -> Option<u64> {
        let p = self.problem;
        let here = self.position[b];
        self.neighbours.clear();
        let conflicts = p.conflicts(b);
        self.steps += conflicts.len() as u64;
        for &c in conflicts {
            let c = c as usize;
            if self.position[c] < here && arena.is_none_or(|(a, _)| self.arena[c] == a) {
                self.neighbours
                    .push((self.offset[c], self.offset[c] + p.size[c]));
            }
        }
        self.neighbours.sort_unstable_by_key(|&(offset, _)| offset);
        let size = p.size[b];
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut end = 0u64;
        for &(offset, neighbour_end) in &self.neighbours {
            if offset > end {
                let gap = offset - end;
                if gap >= size {
                    match fit {
                        Fit::First => return Some(end),
                        Fit::Best => {
                            if best.is_none_or(|(g, _)| gap < g) {
                                best = Some((gap, end));
                            }
                        }
                    }
                }
            }
            end = end.max(neighbour_end);
        }
        if let Some((_, offset)) = best {
            return Some(offset);
        }
        match arena {
            Some((_, limit)) if end + p.buffers[b].size > limit => None,
            _ => Some(end),
        }
    }

    /// The heap of the placed buffers of `order`: the sum over arenas of the highest end.
    pub(crate) fn heap(&self, order: &[u32]) -> u64 {
        let p = self.problem;
        if p.options.max_arena_bytes.is_none() {
            return order
                .iter()
                .map(|&b| self.offset[b as usize] + p.buffers[b as usize].size)
                .max()
                .unwrap_or(0);
        }
        let mut tops: Vec<u64> = Vec::new();
        for &b in order {
            let (a, b) = (self.arena[b as usize] as usize, b as usize);
            if tops.len() <= a {
                tops.resize(a + 1, 0);
            }
            tops[a] = tops[a].max(self.offset[b] + p.buffers[b].size);
        }
        tops.iter().sum()
    }
}
