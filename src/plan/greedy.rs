//! Greedy by size, the baseline: TFLite's arena planner.

use super::buffers::{Buffer, Plan, PlanError, PlanOptions};
use super::place::{Decoder, Fit};
use super::problem::Problem;

/// Plans the buffers as TFLite's greedy-by-size planner does: largest first (ties: earlier
/// start, then input order), each at the smallest gap large enough for it among the buffers
/// already placed that overlap it in time, else above the highest of them. With
/// `max_arena_bytes`, a buffer that fits in no open arena opens a new one.
///
/// The baseline for [`plan`](super::plan); `options.search_steps` and `exact_max_buffers` are
/// not used.
pub fn greedy_by_size(buffers: &[Buffer], options: &PlanOptions) -> Result<Plan, PlanError> {
    let problem = Problem::new(buffers, options)?;
    let order = size_order(&problem);
    let mut decoder = Decoder::new(&problem);
    decoder.place(&order, 0, Fit::Best);
    problem.within_capacity(problem.plan(&decoder.arena, &decoder.offset))
}

/// The placeable buffers by size descending, then start ascending, then index.
pub(crate) fn size_order(problem: &Problem) -> Vec<u32> {
    let mut order = problem.placeable.clone();
    order.sort_by_key(|&i| {
        let b = &problem.buffers[i as usize];
        (std::cmp::Reverse(b.size), b.lower, i)
    });
    order
}
