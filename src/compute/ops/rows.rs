//! Row-wise reductions over the last dimension: `sum` and numerically stable `softmax`.
//! Kernels: `shaders/rows.wgsl` (a workgroup of 256 per row, a 2-D grid past the x limit).
//! On f16 tensors the kernels load f16, sum and exponentiate in f32, and round once to f16 as
//! they store. CPU twins: [`crate::compute::cpu::sum`] and [`crate::compute::cpu::softmax`].

use super::grid_1d;
use crate::compute::context::{Context, Dispatch};
use crate::compute::tensor::Tensor;
use crate::compute::vocab::{
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

    fn rows(
        &self,
        op: &'static str,
        x: &Tensor,
        shape: Vec<usize>,
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
            pad: 0,
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
