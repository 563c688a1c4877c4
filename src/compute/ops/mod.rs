//! The ops: each validates its operands on the host, allocates its output from the pool and
//! records its dispatches into the context's open pass.

pub mod custom;
pub mod elementwise;
pub mod matmul;
pub mod rows;

use super::context::Context;
use super::tensor::Tensor;
use super::vocab::{kernel_u32, ComputeError, DType};

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

/// The grid of `workgroups` workgroups of a 1-D kernel: `[x, 1, 1]`, or `[x, y, 1]` with
/// `x · y ≥ workgroups` when more than the x dimension holds (kernels recover the linear index
/// from `x`, passed in their parameters). Returns the grid and `x`.
pub(crate) fn grid_1d(
    context: &Context,
    op: &'static str,
    workgroups: u64,
) -> Result<([u32; 3], u32), ComputeError> {
    let max_x = u64::from(context.max_grid_x());
    let max_y = u64::from(context.limits().max_compute_workgroups_per_dimension);
    if workgroups <= max_x {
        let x = kernel_u32(op, "workgroups", workgroups)?;
        return Ok(([x, 1, 1], x));
    }
    let y = workgroups.div_ceil(max_x);
    if y > max_y {
        return Err(ComputeError::ExceedsLimit {
            op,
            what: "workgroups",
            value: workgroups,
            limit_name: "max_compute_workgroups_per_dimension squared",
            limit: max_x * max_y,
        });
    }
    let x = workgroups.div_ceil(y);
    let x = kernel_u32(op, "workgroups along x", x)?;
    let y = kernel_u32(op, "workgroups along y", y)?;
    Ok(([x, y, 1], x))
}
