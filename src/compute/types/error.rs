//! [`ComputeError`], what an op, an upload or a read-back refuses with.

use super::dtype::DType;
use crate::pool::PoolError;

/// Why an op, an upload or a read-back was refused. Nothing is recorded when an op fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ComputeError {
    /// The pool refused an allocation or a transfer (out of memory, too large for one binding...).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The shapes of an op's operands do not fit together.
    #[error("{op}: shapes {left:?} and {right:?} do not fit: {expected}")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's shape.
        left: Vec<usize>,
        /// The second operand's shape.
        right: Vec<usize>,
        /// What the op expects.
        expected: &'static str,
    },
    /// A shape the op cannot take (wrong rank, no elements, too many elements).
    #[error("{op}: shape {shape:?} is not valid: {reason}")]
    InvalidShape {
        /// The op.
        op: &'static str,
        /// The shape given.
        shape: Vec<usize>,
        /// Why not.
        reason: &'static str,
    },
    /// A scalar argument an op cannot take (a layer norm's `eps` that is not finite or is
    /// negative, a softmax's scale that is not finite). Nothing is recorded.
    #[error("{op}: {what} = {value} is not valid: {expected}")]
    InvalidScalar {
        /// The op.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: f32,
        /// What the op takes.
        expected: &'static str,
    },
    /// An index given on the host (a token id) outside the rows it indexes. Nothing is
    /// uploaded or recorded.
    #[error("{op}: index {index} at position {position} is outside the {len} rows it indexes")]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// Where in the indices given.
        position: usize,
        /// The index.
        index: u64,
        /// Rows there are.
        len: usize,
    },
    /// Uploaded data does not have the shape's number of elements.
    #[error("data of {data_len} values does not fill shape {shape:?} ({expected_len} values)")]
    DataLength {
        /// The shape given.
        shape: Vec<usize>,
        /// Values given.
        data_len: usize,
        /// Values the shape holds.
        expected_len: usize,
    },
    /// A size beyond what the device can dispatch or bind.
    #[error(
        "{op}: {what} = {value} exceeds the device's {limit_name} ({limit}); split the work into smaller ops"
    )]
    ExceedsLimit {
        /// The op.
        op: &'static str,
        /// What was too large.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The device limit that refused it.
        limit_name: &'static str,
        /// The limit's value.
        limit: u64,
    },
    /// A size beyond what a kernel's 32-bit parameters hold.
    #[error("{op}: {what} = {value} does not fit the kernels' 32-bit parameters")]
    ParameterOverflow {
        /// The op.
        op: &'static str,
        /// What was too large.
        what: &'static str,
        /// Its value (`u64::MAX` if even that does not hold it).
        value: u64,
    },
    /// A symbolic tensor (made by an op while its context captured: no memory, no data) was
    /// read, written, or passed to an op outside its capture.
    #[error(
        "{op}: the tensor is symbolic (made while its context captured): it has no memory; run the \
         capture's plan instead"
    )]
    Symbolic {
        /// The op.
        op: &'static str,
    },
    /// A capture or a plan was used in a way it cannot be (see [`Context::capture`](crate::compute::Context::capture)).
    #[error("capture: {0}")]
    Capture(String),
    /// The memory planner refused the captured buffers (a device limit they do not fit).
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// A capture was given the [`PlanArena`](crate::compute::PlanArena) of another context
    /// ([`CaptureOptions::arena`](crate::compute::CaptureOptions::arena)). Plans sharing an arena
    /// must never replay at the same time; only the replays of one context are ordered one after
    /// another, so an arena is shared only by plans of the context that made it
    /// ([`Context::plan_arena`](crate::compute::Context::plan_arena)). Nothing was built.
    #[error(
        "capture: the plan arena belongs to another context; replays of two contexts are not \
         ordered, so plans sharing an arena must be of one context: make one with this \
         context's plan_arena()"
    )]
    ForeignArena,
    /// A tensor an op writes in place (a KV cache) given twice, or also as one of the op's
    /// other tensors: the write would go to one of them only (nothing was recorded).
    #[error("{op}: the cache tensors it writes must be distinct from each other and from its other tensors")]
    AliasedCache {
        /// The op.
        op: &'static str,
    },
    /// A tensor of another context was passed to an op.
    #[error("{op}: the tensor belongs to another context")]
    ForeignTensor {
        /// The op.
        op: &'static str,
    },
    /// The operands of an op are stored as different element types (an f16 tensor and an f32
    /// one). Convert one first with [`Context::cast`](crate::compute::Context::cast).
    #[error(
        "{op}: operands of different element types ({left} and {right}); convert one with \
         Context::cast first"
    )]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's element type.
        left: DType,
        /// The element type of the operand that differs from it.
        right: DType,
    },
    /// An f16 tensor or op on a device without [`wgpu::Features::SHADER_F16`]: f16 storage
    /// needs it in every kernel that reads or writes such a tensor.
    #[error(
        "{op}: f16 tensors need wgpu::Features::SHADER_F16, which this device lacks (the adapter \
         does not offer it, or the device was opened without it: `request_gpu` asks for it \
         where the adapter has it); use DType::F32"
    )]
    ShaderF16Unavailable {
        /// The op.
        op: &'static str,
    },
    /// An option (of [`ContextOptions`](crate::compute::ContextOptions),
    /// [`MatmulOptions`](crate::compute::MatmulOptions), a tile) that the device or the kernels
    /// cannot take.
    #[error("invalid compute configuration: {0}")]
    Config(String),
    /// A user's kernel refused: made from WGSL whose bindings do not follow the crate's
    /// convention or that does not compile ([`Context::user_kernel`](crate::compute::Context::user_kernel)),
    /// or dispatched with tensors, parameters or bind groups that do not fit what it declared
    /// ([`Context::dispatch_with`](crate::compute::Context::dispatch_with)). Nothing is recorded.
    #[error("{op} {kernel}: {reason}")]
    UserKernel {
        /// The call that refused it (`user_kernel`, `dispatch`).
        op: &'static str,
        /// The kernel's label.
        kernel: String,
        /// Why.
        reason: String,
    },
    /// A kernel of the user's ([`Context::user_kernel`](crate::compute::Context::user_kernel))
    /// declares a storage binding of its tensors `var<storage, read>`. Tensors may share one
    /// segment buffer, and wgpu refuses one buffer bound read-only and read-write in one
    /// dispatch, so such a kernel would run or fail depending on where the pool placed its
    /// tensors: it is refused when it is made, from its WGSL, whatever the placement.
    #[error(
        "user_kernel: a tensor binding of group 0 is declared `var<storage, read>`; tensors may \
         share a segment buffer, and wgpu refuses a buffer bound both ways in one dispatch, so \
         this kernel would fail whenever the pool places its tensors together: declare every \
         tensor binding `var<storage, read_write>` ({message})"
    )]
    ReadOnlyBinding {
        /// Which binding of which kernel.
        message: String,
    },
    /// wgpu refused a kernel (a compile or pipeline error on this backend).
    #[error("kernel {kernel} was refused by the device: {message}")]
    Kernel {
        /// The kernel's entry point and variant.
        kernel: String,
        /// What wgpu said.
        message: String,
    },
    /// Waiting for the GPU failed.
    #[error("waiting for the GPU failed: {0}")]
    Wait(String),
    /// Reading GPU timestamps back failed.
    #[error("reading GPU timestamps failed: {0}")]
    Timing(String),
}
