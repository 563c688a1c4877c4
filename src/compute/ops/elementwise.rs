//! Element-wise ops: unary, binary, binary with a scalar, the row-broadcast bias add, and the
//! cast between element types. Kernels: `shaders/unary.wgsl` and `shaders/binary.wgsl` (one vec4
//! per invocation, workgroups of 256, a 2-D grid past the x limit). On f16 tensors each kernel
//! loads f16, computes in f32 and rounds once to f16 as it stores; operands of different element
//! types are [`ComputeError::DTypeMismatch`]. CPU twins: [`crate::compute::cpu`].

use super::{common_dtype, grid_1d};
use crate::compute::context::{Context, Dispatch};
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    kernel_u32, ComputeError, DType, ElementTypes, ElementwiseParams, KernelKey, ParamsBlock,
    Source,
};

/// Invocations per workgroup of the element-wise kernels.
const WORKGROUP_SIZE: u64 = 256;

/// An element-wise function of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, computed as
    /// `x / (1 + e^(−2·√(2/π)·(x + 0.044715·x³)))` (see `shaders/common.wgsl`).
    Gelu,
    /// `eˣ`.
    Exp,
    /// `−x`.
    Neg,
    /// `√x` (NaN below 0).
    Sqrt,
    /// `x`: a copy (every bit kept), as `torch.clone`.
    Copy,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [Self; 6] = [
        Self::Relu,
        Self::Gelu,
        Self::Exp,
        Self::Neg,
        Self::Sqrt,
        Self::Copy,
    ];

    /// The kernel's (and the CPU twin's) name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Relu => "relu",
            Self::Gelu => "gelu",
            Self::Exp => "exp",
            Self::Neg => "neg",
            Self::Sqrt => "sqrt",
            Self::Copy => "copy",
        }
    }

    fn entry(self) -> &'static str {
        // `exp` and `sqrt` are WGSL built-ins: their kernels carry a suffix.
        match self {
            Self::Exp => "exp_kernel",
            Self::Sqrt => "sqrt_kernel",
            other => other.name(),
        }
    }
}

/// An element-wise function of two tensors (or a tensor and a scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b`.
    Div,
    /// `max(a, b)`.
    Maximum,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [Self; 5] = [Self::Add, Self::Sub, Self::Mul, Self::Div, Self::Maximum];

    /// The kernel's (and the CPU twin's) name; `<name>_scalar` with a scalar.
    pub fn name(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Sub => "sub",
            Self::Mul => "mul",
            Self::Div => "div",
            Self::Maximum => "maximum",
        }
    }

    fn scalar_entry(self) -> &'static str {
        match self {
            Self::Add => "add_scalar",
            Self::Sub => "sub_scalar",
            Self::Mul => "mul_scalar",
            Self::Div => "div_scalar",
            Self::Maximum => "maximum_scalar",
        }
    }
}

impl Context {
    /// `y = op(x)`, element-wise.
    pub fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.check_owner(op.name(), x)?;
        let key = KernelKey::plain(Source::Unary, op.entry());
        self.elementwise(op.name(), key, &[x], x.shape(), 0, 0.0)
    }

    /// `x` with its elements stored as `dtype`: a new tensor (a copy of every bit where `x`
    /// already is `dtype`). To f16 each value is rounded to the nearest f16 (ties to even; beyond ±65,504
    /// it becomes ±∞); to f32 exactly. [`ComputeError::ShaderF16Unavailable`] for f16 on a
    /// device without [`wgpu::Features::SHADER_F16`].
    pub fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor, ComputeError> {
        const OP: &str = "cast";
        self.check_owner(OP, x)?;
        self.check_dtype(OP, dtype)?;
        let key = KernelKey::plain(Source::Unary, UnaryOp::Copy.entry()).typed(ElementTypes {
            input: x.dtype(),
            output: dtype,
        });
        self.elementwise(OP, key, &[x], x.shape(), 0, 0.0)
    }

    /// `max(x, 0)`, element-wise.
    pub fn relu(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Relu, x)
    }

    /// GELU (tanh approximation), element-wise.
    pub fn gelu(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Gelu, x)
    }

    /// `eˣ`, element-wise.
    pub fn exp(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Exp, x)
    }

    /// A copy of `x` with memory of its own (a clone of a [`Tensor`] shares the data instead).
    pub fn copy(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Copy, x)
    }

    /// `−x`, element-wise.
    pub fn neg(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Neg, x)
    }

    /// `√x`, element-wise.
    pub fn sqrt(&self, x: &Tensor) -> Result<Tensor, ComputeError> {
        self.unary(UnaryOp::Sqrt, x)
    }

    /// `y = a op b`, element-wise; `a` and `b` must have the same shape and element type.
    pub fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.check_owner(op.name(), a)?;
        self.check_owner(op.name(), b)?;
        if a.shape() != b.shape() {
            return Err(ComputeError::ShapeMismatch {
                op: op.name(),
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "equal shapes",
            });
        }
        let key = KernelKey::plain(Source::Binary, op.name());
        self.elementwise(op.name(), key, &[a, b], a.shape(), 0, 0.0)
    }

    /// `a + b`, element-wise.
    pub fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a − b`, element-wise.
    pub fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a · b`, element-wise.
    pub fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`, element-wise.
    pub fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `max(a, b)`, element-wise.
    pub fn maximum(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.binary(BinaryOp::Maximum, a, b)
    }

    /// `y = x op scalar`, element-wise.
    pub fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &Tensor,
        scalar: f32,
    ) -> Result<Tensor, ComputeError> {
        let name = op.scalar_entry();
        self.check_owner(name, x)?;
        let key = KernelKey::plain(Source::Unary, name);
        self.elementwise(name, key, &[x], x.shape(), 0, scalar)
    }

    /// `y[r, c] = x[r, c] + bias[c]`: `bias` has one dimension, the length of `x`'s last, and
    /// `x`'s element type.
    pub fn add_bias(&self, x: &Tensor, bias: &Tensor) -> Result<Tensor, ComputeError> {
        const OP: &str = "add_bias";
        self.check_owner(OP, x)?;
        self.check_owner(OP, bias)?;
        let (_, cols) = x.rows_cols();
        if bias.shape() != [cols] {
            return Err(ComputeError::ShapeMismatch {
                op: OP,
                left: x.shape().to_vec(),
                right: bias.shape().to_vec(),
                expected: "bias of shape [last dimension of x]",
            });
        }
        let key = KernelKey::plain(Source::Binary, OP);
        let cols = kernel_u32(OP, "columns", cols)?;
        self.elementwise(OP, key, &[x, bias], x.shape(), cols, 0.0)
    }

    /// Records one element-wise kernel over `shape`, writing a new tensor. The kernel loads
    /// and stores the inputs' element type (which must be one), unless `key` names other types
    /// already (a cast); a copy within one type copies the bytes.
    fn elementwise(
        &self,
        op: &'static str,
        key: KernelKey,
        inputs: &[&Tensor],
        shape: &[usize],
        cols: u32,
        scalar: f32,
    ) -> Result<Tensor, ComputeError> {
        let dtype = common_dtype(op, inputs)?;
        let types = if key.types == ElementTypes::F32 {
            ElementTypes::same(dtype)
        } else {
            key.types
        };
        let len = inputs[0].len();
        // A copy within one type moves bits: the f32 copy kernel over the bytes, so that f16 NaN
        // payloads and subnormals survive (a trip through f32 may quiet the one and flush the
        // other). Other kernels take one vec4 of their elements per invocation.
        let (key, len_vec4) = if key.entry == UnaryOp::Copy.entry() && types.input == types.output {
            let bytes = len as u64 * dtype.size_bytes();
            (key.typed(ElementTypes::F32), bytes.div_ceil(16))
        } else {
            (key.typed(types), len.div_ceil(4) as u64)
        };
        let (workgroups, grid_x) = grid_1d(self, op, len_vec4.div_ceil(WORKGROUP_SIZE))?;
        self.before_op()?;
        let output = self.allocate_output(op, shape.to_vec(), len, types.output)?;
        let mut bindings: Vec<_> = inputs.iter().map(|t| &t.storage).collect();
        bindings.push(&output.storage);
        self.record(Dispatch {
            kernel: key,
            params: ParamsBlock::new(&ElementwiseParams {
                len_vec4: kernel_u32(op, "vec4s", len_vec4)?,
                grid_x,
                cols,
                scalar,
            }),
            bindings: &bindings,
            workgroups,
        })?;
        Ok(output)
    }
}
