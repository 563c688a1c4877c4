//! Row-wise ops over the last dimension: `sum`, numerically stable `softmax`, and
//! `take_columns` (the first columns of each row).
//! Kernels: `shaders/rows.wgsl` (a workgroup of 256 per row, a 2-D grid past the x limit).
//! On f16 tensors the kernels load f16, sum and exponentiate in f32, and round once to f16 as
//! they store. CPU twins: [`crate::compute::cpu::sum`], [`crate::compute::cpu::softmax`] and
//! [`crate::compute::cpu::take_columns`].

use super::grid_1d;
use crate::compute::context::{Context, Dispatch};
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    kernel_u32, ComputeError, ElementTypes, KernelKey, ParamsBlock, RowsParams, Source,
};

impl Context {
    /// The sum over the last dimension: `[.., cols]` → `[..]` (`[cols]` → `[1]`).
    pub fn sum(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        let shape = match x.shape() {
            [_] => vec![1],
            [outer @ .., _] => outer.to_vec(),
            [] => vec![1],
        };
        self.rows("sum", x, shape)
    }

    /// Softmax over the last dimension, numerically stable (the row's maximum is subtracted
    /// before `exp`). Same shape as `x`.
    pub fn softmax(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.rows("softmax", x, x.shape().to_vec())
    }

    /// The first `take` columns of each row: `[.., cols]` → `[.., take]`, a copy (e.g. logits
    /// of a vocabulary padded to a multiple of 4, without the padding). Errors:
    /// [`ComputeError::InvalidShape`] for `take` 0 or above the columns.
    pub fn take_columns(&self, x: &Tensor, take: usize) -> Result<Tensor, ComputeError> {
        const OP: &str = "take_columns";
        let (_, cols) = x.rows_cols();
        if take == 0 || take > cols {
            return Err(ComputeError::InvalidShape {
                op: OP,
                shape: x.shape().to_vec(),
                reason: "take_columns keeps 1 to all of the last dimension's columns",
            });
        }
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("shapes have a dimension") = take;
        self.rows_with(OP, x, shape, take)
    }

    fn rows(
        &self,
        op: &'static str,
        x: &Tensor,
        shape: Vec<usize>,
    ) -> Result<Tensor, ComputeError> {
        self.rows_with(op, x, shape, 0)
    }

    /// A `shaders/rows.wgsl` kernel over the rows of `x`, into a tensor of `shape`; `take` for
    /// `take_columns`.
    fn rows_with(
        &self,
        op: &'static str,
        x: &Tensor,
        shape: Vec<usize>,
        take: usize,
    ) -> Result<Tensor, ComputeError> {
        self.check_owner(op, x)?;
        let (rows, cols) = x.rows_cols();
        let (workgroups, grid_x) = grid_1d(self, op, rows as u64)?;
        let len = shape.iter().product();
        self.before_op()?;
        let output = self.allocate_output(op, shape, len, x.dtype())?;
        let params = RowsParams {
            rows: kernel_u32(op, "rows", rows)?,
            cols: kernel_u32(op, "columns", cols)?,
            grid_x,
            aux: kernel_u32(op, "columns taken", take)?,
        };
        self.record(Dispatch {
            kernel: KernelKey::plain(Source::Rows, op).typed(ElementTypes::same(x.dtype())),
            params: ParamsBlock::new(&params),
            bindings: &[&x.storage, &output.storage],
            workgroups,
        })?;
        Ok(output)
    }
}
