//! Tensors: pool allocations with a shape; and the context's methods that make, write and read
//! them.

use std::sync::Arc;

use super::context::{Context, Dispatch};
use super::shared::{Storage, TensorAllocation};
use super::types::{
    decode_elements, element_count, encode_elements, tensor_bytes, ComputeError, DType,
};
use crate::policy::SegmentId;
use crate::pool::{AllocOptions, Allocation, PoolError};

/// A tensor of f32 or f16 elements ([`Tensor::dtype`]), row-major, whose storage is a pool
/// [`Allocation`] of its context's pool.
///
/// The allocation is `len · dtype.size_bytes()` bytes rounded up to 16 (kernels read and write
/// whole vec4s; the lanes past `len` hold unspecified values). Whatever the element type, the
/// host reads and writes f32 values: an f16 tensor's are rounded on upload and widened (exactly)
/// on read-back. Clones share the data (as PyTorch's tensors share
/// a storage): the range goes back to the pool when the last clone (or the last
/// [`Plan`](super::graph::Plan) that binds it) is dropped, reusable after the submission that
/// carries the last op recorded on it.
///
/// A tensor made by an op while its context captures ([`Context::capture`]) is *symbolic*: it has
/// a shape but no memory and no data; the captured ops' plan gives it a range of its arena. Ops
/// record it into the capture; reading or writing it is [`ComputeError::Symbolic`].
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    shape: Vec<usize>,
    len: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype())
            .field("allocation", &self.storage.allocation().as_deref())
            .finish()
    }
}

impl Tensor {
    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements (the product of the dimensions; never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: tensors without elements are refused. For clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the elements are stored as.
    pub fn dtype(&self) -> DType {
        self.storage.dtype
    }

    /// Bytes of data: `len · dtype.size_bytes()` (the allocation may be up to 14 bytes larger:
    /// it is rounded up to 16).
    pub fn size_bytes(&self) -> u64 {
        self.len as u64 * self.dtype().size_bytes()
    }

    /// The pool allocation holding the data, borrowed: the guard derefs to the
    /// [`Allocation`].
    ///
    /// To bind a tensor in a kernel of your own, record the kernel through the context with
    /// [`Context::dispatch`] or [`Context::dispatch_with`]: the dispatch then joins the context's
    /// batch, and the tensor's range stays reserved until the submission that carries it. Work
    /// you record elsewhere (your own encoder) may bind this allocation too: once it was handed
    /// out, the tensor's range, when the tensor is dropped, waits for the pool's next submission
    /// (as any dropped [`Allocation`] does: submit your encoder through
    /// [`Pool::submit`](crate::Pool::submit)) and is never handed to an op's output in the
    /// open batch. Bind it `read_write` (see the pool's module documentation). To see where a
    /// tensor lies without handing it out, use [`Tensor::location`].
    ///
    /// Write into it with [`Context::write`], not [`Pool::write`](crate::Pool::write) on this
    /// allocation: an op's output may hold the range of a tensor dropped in the open batch, which
    /// the batch's ops still read, and the pool's write lands at the start of the next
    /// submission, before them; `Context::write` submits the batch first.
    ///
    /// A compaction ([`Context::compact`]) may move the tensor to another range: do not keep its
    /// buffer, offset or bind groups made over it across one (or submit work that uses them
    /// before it). While the guard lives, the tensor is not moved.
    ///
    /// # Panics
    ///
    /// On a symbolic tensor (see [`Tensor::is_symbolic`]; [`Tensor::try_allocation`] does not
    /// panic).
    pub fn allocation(&self) -> TensorAllocation<'_> {
        self.storage
            .expose()
            .expect("a symbolic tensor of a capture has no allocation: see Tensor::is_symbolic")
    }

    /// The pool allocation holding the data; `None` for a symbolic tensor of a capture. As
    /// [`Tensor::allocation`], it marks the range as the user's.
    pub fn try_allocation(&self) -> Option<TensorAllocation<'_>> {
        self.storage.expose()
    }

    /// Where the tensor's memory is now: its segment and offset in bytes (`None` for a symbolic
    /// tensor of a capture). For reports and tests: unlike [`Tensor::allocation`] it hands out
    /// nothing to bind, so the tensor's range stays free to be handed to an op's output once the
    /// tensor is dropped in the open batch.
    pub fn location(&self) -> Option<(SegmentId, u64)> {
        let allocation = self.storage.allocation()?;
        Some((allocation.segment(), allocation.offset()))
    }

    /// Whether the tensor was made by an op while its context captured: it has no memory or
    /// data of its own (see [`Context::capture`]).
    pub fn is_symbolic(&self) -> bool {
        !self.storage.has_memory()
    }

    /// The same data with another shape of as many elements (no copy). A refused shape gives
    /// the tensor back in the [`ReshapeError`].
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self, ReshapeError> {
        let checked = element_count("reshape", shape).and_then(|len| {
            if len == self.len {
                Ok(())
            } else {
                Err(ComputeError::ShapeMismatch {
                    op: "reshape",
                    left: self.shape.clone(),
                    right: shape.to_vec(),
                    expected: "as many elements",
                })
            }
        });
        match checked {
            Ok(()) => {
                self.shape = shape.to_vec();
                Ok(self)
            }
            Err(error) => Err(ReshapeError {
                tensor: self,
                error,
            }),
        }
    }

    /// Reads the tensor back as f32 values (see [`Context::read`]).
    pub fn to_vec(&self) -> Result<Vec<f32>, ComputeError> {
        Context {
            shared: self.storage.shared.clone(),
        }
        .read(self)
    }

    /// [`Tensor::to_vec`] as a future that does not block the thread ([`Context::read_async`]).
    pub async fn to_vec_async(&self) -> Result<Vec<f32>, ComputeError> {
        Context {
            shared: self.storage.shared.clone(),
        }
        .read_async(self)
        .await
    }

    /// `(rows, cols)` of the tensor seen as a matrix over its last dimension.
    pub(crate) fn rows_cols(&self) -> (usize, usize) {
        let cols = *self
            .shape
            .last()
            .expect("shapes have at least one dimension");
        (self.len / cols, cols)
    }
}

/// A refused [`Tensor::reshape`]: the tensor, given back unchanged, and why.
///
/// Converts into the [`ComputeError`] (dropping the tensor) for `?` in functions returning
/// `Result<_, ComputeError>`.
#[derive(Debug)]
pub struct ReshapeError {
    /// The tensor, with its shape and data unchanged.
    pub tensor: Tensor,
    /// Why the shape was refused: [`ComputeError::InvalidShape`] or
    /// [`ComputeError::ShapeMismatch`].
    pub error: ComputeError,
}

impl ReshapeError {
    /// The tensor, given back.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

impl std::fmt::Display for ReshapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for ReshapeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<ReshapeError> for ComputeError {
    fn from(refused: ReshapeError) -> Self {
        refused.error
    }
}

impl Context {
    /// Uploads `data` as an f32 tensor of `shape` (row-major). The upload lands before any op
    /// recorded on it.
    pub fn tensor(&self, data: &[f32], shape: &[usize]) -> Result<Tensor, ComputeError> {
        self.tensor_with(data, shape, DType::F32)
    }

    /// Uploads `data` as a tensor of `shape` whose elements are stored as `dtype`: for
    /// [`DType::F16`] each value is rounded to the nearest f16 (ties to even; beyond ±65,504 it
    /// becomes ±∞). [`ComputeError::ShaderF16Unavailable`] for f16 on a device without
    /// [`wgpu::Features::SHADER_F16`].
    pub fn tensor_with(
        &self,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor, ComputeError> {
        self.tensor_labeled(data, shape, dtype, "tensor")
    }

    /// [`Context::tensor_with`] under `label` in the pool's memory state and what is made from
    /// it (snapshots for memory_viz, the JSON report) and in its history, e.g. a weight's name.
    /// The text summary and the segment maps show sizes, not labels.
    pub fn tensor_labeled(
        &self,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, ComputeError> {
        let len = element_count("tensor", shape)?;
        self.check_dtype("tensor", dtype)?;
        if data.len() != len {
            return Err(ComputeError::DataLength {
                shape: shape.to_vec(),
                data_len: data.len(),
                expected_len: len,
            });
        }
        // Real memory even while capturing: data made in a forward is a constant of its plan.
        let tensor = self.allocate_memory(label, shape.to_vec(), len, dtype)?;
        self.pool().write(
            &tensor.storage.allocation().expect("allocated above"),
            0,
            &encode_elements(data, dtype),
        )?;
        Ok(tensor)
    }

    /// An f32 tensor of `shape` filled with zeros. The clear is recorded into the open batch (on
    /// the GPU, no upload), before any op recorded on the tensor; it counts as a pending
    /// dispatch, so that [`Context::write`] submits it before its upload lands.
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        self.zeros_with(shape, DType::F32)
    }

    /// [`Context::zeros`] with elements stored as `dtype` (zero bits are 0.0 in either type).
    pub fn zeros_with(&self, shape: &[usize], dtype: DType) -> Result<Tensor, ComputeError> {
        let len = element_count("zeros", shape)?;
        self.check_dtype("zeros", dtype)?;
        self.before_op()?;
        let tensor = self.allocate("zeros", shape.to_vec(), len, dtype)?;
        self.record_clear(&tensor.storage)?;
        Ok(tensor)
    }

    /// A tensor of `shape` of `dtype` filled with zeros, under `label` in the pool's memory state
    /// (as [`Context::tensor_labeled`]): for state that lives across steps and plans, such as a
    /// KV cache. The pool clears its range on the GPU before handing it out; its memory is real
    /// even while the context captures (a plan binds it as it binds weights).
    pub fn zeros_labeled(
        &self,
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, ComputeError> {
        self.zeros_labeled_as(shape, dtype, label, false)
    }

    /// [`Context::zeros_labeled`] in a segment sized for the tensor
    /// ([`Pool::allocate_in_own_segment`](crate::Pool::allocate_in_own_segment)), so that the
    /// pool reserves its bytes rounded to a block and no more.
    pub(crate) fn zeros_labeled_in_own_segment(
        &self,
        shape: &[usize],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor, ComputeError> {
        self.zeros_labeled_as(shape, dtype, label, true)
    }

    fn zeros_labeled_as(
        &self,
        shape: &[usize],
        dtype: DType,
        label: &str,
        own_segment: bool,
    ) -> Result<Tensor, ComputeError> {
        let len = element_count("zeros", shape)?;
        self.check_dtype("zeros", dtype)?;
        let bytes = tensor_bytes(len, dtype);
        let options = AllocOptions {
            label,
            zeroed: true,
            bindable: true,
        };
        let allocation = if own_segment {
            self.pool().allocate_in_own_segment(bytes, options)?
        } else {
            self.pool().allocate_with(bytes, options)?
        };
        Ok(self.tensor_over(allocation, shape.to_vec(), len, dtype))
    }

    /// An f32 tensor of `shape` whose contents are unspecified (like `torch.empty`: whatever the
    /// range held before), for outputs that are written whole before they are read.
    pub fn empty(&self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        self.empty_with(shape, DType::F32)
    }

    /// [`Context::empty`] with elements stored as `dtype`.
    pub fn empty_with(&self, shape: &[usize], dtype: DType) -> Result<Tensor, ComputeError> {
        let len = element_count("empty", shape)?;
        self.check_dtype("empty", dtype)?;
        self.before_op()?;
        self.allocate("empty", shape.to_vec(), len, dtype)
    }

    /// Whether this context's device stores tensors of `dtype`: f32 always, f16 where the
    /// device was opened with [`wgpu::Features::SHADER_F16`] ([`request_gpu`](crate::request_gpu)
    /// asks for it where the adapter offers it).
    pub fn supports(&self, dtype: DType) -> bool {
        match dtype {
            DType::F32 => true,
            DType::F16 => self
                .gpu()
                .device
                .features()
                .contains(wgpu::Features::SHADER_F16),
        }
    }

    /// Refuses `dtype` where the device cannot store it ([`Context::supports`]).
    pub(crate) fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<(), ComputeError> {
        if self.supports(dtype) {
            Ok(())
        } else {
            Err(ComputeError::ShaderF16Unavailable { op })
        }
    }

    /// Overwrites `tensor` with `data` (rounded to f16 for an f16 tensor). Submits the open batch
    /// first (an upload lands at the start of the next submission, so ops recorded earlier would
    /// otherwise read the new data).
    pub fn write(&self, tensor: &Tensor, data: &[f32]) -> Result<(), ComputeError> {
        self.check_owner("write", tensor)?;
        // Not handed out: the write is the context's own.
        let allocation = tensor
            .storage
            .allocation()
            .ok_or(ComputeError::Symbolic { op: "write" })?;
        if data.len() != tensor.len() {
            return Err(ComputeError::DataLength {
                shape: tensor.shape().to_vec(),
                data_len: data.len(),
                expected_len: tensor.len(),
            });
        }
        if self.pending_dispatches() > 0 {
            self.flush()?;
        }
        self.pool()
            .write(&allocation, 0, &encode_elements(data, tensor.dtype()))?;
        Ok(())
    }

    /// Reads `tensor` back as f32 values (an f16 tensor's widened exactly): submits the open
    /// batch (which computes it) and waits for it.
    pub fn read(&self, tensor: &Tensor) -> Result<Vec<f32>, ComputeError> {
        self.check_owner("read", tensor)?;
        // Not handed out: the read is the context's own.
        let allocation = tensor
            .storage
            .allocation()
            .ok_or(ComputeError::Symbolic { op: "read" })?;
        let bytes = self.read_allocation(&allocation)?;
        Ok(decode_elements(&bytes, tensor.len(), tensor.dtype()))
    }

    /// [`Context::read`] as a future that does not block the thread, for async code and the read
    /// a browser can run: submits the open batch, then awaits the read-back
    /// ([`Pool::read_async`](crate::Pool::read_async)).
    pub async fn read_async(&self, tensor: &Tensor) -> Result<Vec<f32>, ComputeError> {
        self.check_owner("read", tensor)?;
        // Pinned, not borrowed: a lock guard held across the wait would make the future `!Send`.
        let range = tensor
            .storage
            .pin()
            .ok_or(ComputeError::Symbolic { op: "read" })?;
        self.flush()?;
        let bytes = self
            .pool()
            .read_range_async(&range.buffer, range.offset, range.binding_size, range.size)
            .await?;
        drop(range);
        Ok(decode_elements(&bytes, tensor.len(), tensor.dtype()))
    }

    /// Refuses a tensor of another context.
    pub(crate) fn check_owner(
        &self,
        op: &'static str,
        tensor: &Tensor,
    ) -> Result<(), ComputeError> {
        if Arc::ptr_eq(&tensor.storage.shared, &self.shared) {
            Ok(())
        } else {
            Err(ComputeError::ForeignTensor { op })
        }
    }

    /// A new tensor of `len` elements of `dtype` for an op's output: memory from the pool (its
    /// bytes rounded up to 16), or, while the context captures, a symbolic tensor of the capture.
    pub(crate) fn allocate(
        &self,
        label: &'static str,
        shape: Vec<usize>,
        len: usize,
        dtype: DType,
    ) -> Result<Tensor, ComputeError> {
        match self.capture_id() {
            Some(capture) => Ok(Tensor {
                storage: Storage::new(
                    &self.shared,
                    None,
                    Some(capture),
                    tensor_bytes(len, dtype),
                    dtype,
                ),
                shape,
                len,
            }),
            None => self.allocate_memory(label, shape, len, dtype),
        }
    }

    /// A new tensor of `len` elements of `dtype` for the output of an op that records its
    /// dispatch, which writes the whole output, right after: as [`Context::allocate`], but taking
    /// the memory of a tensor of the same size dropped in the open batch where there is one
    /// (see the module documentation of [`super::context`]).
    pub(crate) fn allocate_output(
        &self,
        label: &'static str,
        shape: Vec<usize>,
        len: usize,
        dtype: DType,
    ) -> Result<Tensor, ComputeError> {
        if self.capture_id().is_none() {
            let bytes = tensor_bytes(len, dtype);
            if let Some(allocation) = self.shared.take_deferred(bytes, label) {
                return Ok(self.tensor_over(allocation, shape, len, dtype));
            }
        }
        self.allocate(label, shape, len, dtype)
    }

    /// Records one dispatch into the open pass (opening the encoder and pass if needed), or into
    /// the open capture's tape.
    pub(crate) fn record(&self, dispatch: Dispatch<'_>) -> Result<(), ComputeError> {
        // WebGPU in a browser refuses one buffer range bound twice in a dispatch where a binding
        // is writable (every binding here is `read_write`): there a tensor given twice (`x · x`)
        // is bound the second time through a copy. Only the ops that write their inputs in place
        // (the cache writes) could be changed by that, and they refuse a tensor given twice.
        // wgpu's native backends allow it, and bind it twice as they always did.
        if !self.binds_distinct_ranges() {
            return self.record_distinct(dispatch);
        }
        let repeated = |index: usize| {
            dispatch.bindings[..index]
                .iter()
                .any(|earlier| Arc::ptr_eq(earlier, dispatch.bindings[index]))
        };
        if !(1..dispatch.bindings.len()).any(repeated) {
            return self.record_distinct(dispatch);
        }
        let mut copies = Vec::new();
        for index in 0..dispatch.bindings.len() {
            copies.push(if repeated(index) {
                Some(self.copy(&Self::flat(dispatch.bindings[index]))?)
            } else {
                None
            });
        }
        let bindings: Vec<&Arc<Storage>> = dispatch
            .bindings
            .iter()
            .zip(&copies)
            .map(|(&storage, copy)| copy.as_ref().map_or(storage, |copy| &copy.storage))
            .collect();
        self.record_distinct(Dispatch {
            bindings: &bindings,
            ..dispatch
        })
    }

    /// A tensor of one vec4 of `dtype` for a binding a kernel declares but does not use (a
    /// matmul's bias when it has none) where [`Context::binds_distinct_ranges`]: never a tensor
    /// bound already. Taken like an op's output (a range dropped in the batch where there is
    /// one; in a plan, a place in its arena).
    pub(crate) fn unused_binding(&self, dtype: DType) -> Result<Tensor, ComputeError> {
        self.allocate_output("unused binding", vec![4], 4, dtype)
    }

    /// Whether every binding of a dispatch must be a range of its own: on the browser's WebGPU,
    /// which refuses a range bound twice where a binding is writable (see
    /// [`Context::record`]). wgpu's native backends allow it.
    pub(crate) fn binds_distinct_ranges(&self) -> bool {
        self.gpu().info.backend == wgpu::Backend::BrowserWebGpu
    }

    /// The whole of `storage` seen as a flat tensor of its element type (its bytes, rounded up
    /// to 16, as elements), for a copy of it.
    pub(crate) fn flat(storage: &Arc<Storage>) -> Tensor {
        let len = usize::try_from(storage.bytes / storage.dtype.size_bytes()).unwrap_or(0);
        Tensor {
            storage: Arc::clone(storage),
            shape: vec![len],
            len,
        }
    }

    /// A new tensor of `len` elements of `dtype` whose memory comes from the pool, capturing or
    /// not.
    pub(crate) fn allocate_memory(
        &self,
        label: &str,
        shape: Vec<usize>,
        len: usize,
        dtype: DType,
    ) -> Result<Tensor, ComputeError> {
        let bytes = tensor_bytes(len, dtype);
        let allocation = match self
            .pool()
            .allocate_with(bytes, AllocOptions::labeled(label))
        {
            Err(PoolError::OutOfMemory(oom)) => self.after_out_of_memory(bytes, label, oom)?,
            result => result?,
        };
        Ok(self.tensor_over(allocation, shape, len, dtype))
    }

    /// The tensor of `shape` (`len` elements of `dtype`) whose memory is `allocation`.
    fn tensor_over(
        &self,
        allocation: Allocation,
        shape: Vec<usize>,
        len: usize,
        dtype: DType,
    ) -> Tensor {
        let bytes = tensor_bytes(len, dtype);
        Tensor {
            storage: Storage::new(&self.shared, Some(allocation), None, bytes, dtype),
            shape,
            len,
        }
    }
}
