//! The ops: each validates its operands on the host, allocates its output from the pool and
//! records its dispatches into the context's open pass.

pub(crate) mod attention;
pub(crate) mod custom;
pub(crate) mod elementwise;
pub(crate) mod matmul;
pub(crate) mod rows;
pub(crate) mod transformer;

use super::context::Context;
use super::tensor::Tensor;
use super::types::{grid_1d_within, ComputeError, DType};

/// The element type all of an op's `operands` share, or [`ComputeError::DTypeMismatch`] naming
/// the first and the first that differs from it.
pub(crate) fn common_dtype(op: &'static str, operands: &[&Tensor]) -> Result<DType, ComputeError> {
    let left = operands[0].dtype();
    match operands.iter().find(|tensor| tensor.dtype() != left) {
        None => Ok(left),
        Some(other) => Err(ComputeError::DTypeMismatch {
            op,
            left,
            right: other.dtype(),
        }),
    }
}

/// The grid of `workgroups` workgroups of a 1-D kernel on `context`'s device, its x capped by
/// [`ContextOptions::max_grid_x`](crate::compute::ContextOptions::max_grid_x) (see
/// [`grid_1d_within`]). Returns the grid and `x`.
pub(crate) fn grid_1d(
    context: &Context,
    op: &'static str,
    workgroups: u64,
) -> Result<([u32; 3], u32), ComputeError> {
    let max_y = context.limits().max_compute_workgroups_per_dimension;
    grid_1d_within(op, workgroups, context.max_grid_x(), max_y)
}
