//! Tensors: pool allocations with a shape; and the context's methods that make, write and read
//! them.

use std::sync::Arc;

use super::context::{Context, Storage, TensorAllocation};
use super::vocab::{element_count, tensor_bytes, ComputeError};
use crate::pool::{AllocOptions, PoolError};

/// An f32 tensor, row-major, whose storage is a pool [`Allocation`](crate::Allocation) of its context's pool.
///
/// The allocation is `4 · len` bytes rounded up to 16 (kernels read and write whole vec4s; the
/// lanes past `len` hold unspecified values). Clones share the data (as PyTorch's tensors share
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

    /// Bytes of data: `4 · len` (the allocation may be up to 12 bytes larger).
    pub fn size_bytes(&self) -> u64 {
        self.len as u64 * 4
    }

    /// The pool allocation holding the data, borrowed: the guard derefs to the
    /// [`Allocation`](crate::Allocation).
    ///
    /// To bind a tensor in a kernel of your own, record the kernel through the context with
    /// [`Context::dispatch`] or [`Context::dispatch_with`]: the dispatch then joins the context's
    /// batch, and the tensor's range stays reserved until the submission that carries it. Work
    /// you record elsewhere (your own encoder) that binds this allocation is not tracked: if the
    /// tensor is dropped before that work is submitted while no batch of the context is open, its
    /// range is reusable at once, and a new allocation's upload can land in it before your kernel
    /// reads it. Bind it `read_write` (see the pool's module documentation).
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
            .allocation()
            .expect("a symbolic tensor of a capture has no allocation: see Tensor::is_symbolic")
    }

    /// The pool allocation holding the data; `None` for a symbolic tensor of a capture.
    pub fn try_allocation(&self) -> Option<TensorAllocation<'_>> {
        self.storage.allocation()
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

    /// Reads the tensor back (see [`Context::read`]).
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
    /// Uploads `data` as a tensor of `shape` (row-major). The upload lands before any op recorded
    /// on it.
    pub fn tensor(&self, data: &[f32], shape: &[usize]) -> Result<Tensor, ComputeError> {
        let len = element_count("tensor", shape)?;
        if data.len() != len {
            return Err(ComputeError::DataLength {
                shape: shape.to_vec(),
                data_len: data.len(),
                expected_len: len,
            });
        }
        // Real memory even while capturing: data made in a forward is a constant of its plan.
        let tensor = self.allocate_memory("tensor", shape.to_vec(), len)?;
        self.pool()
            .write(&tensor.allocation(), 0, bytemuck::cast_slice(data))?;
        Ok(tensor)
    }

    /// A tensor of `shape` filled with zeros. The clear is recorded into the open batch (on the
    /// GPU, no upload), before any op recorded on the tensor; it counts as a pending dispatch, so
    /// that [`Context::write`] submits it before its upload lands.
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        let len = element_count("zeros", shape)?;
        self.before_op()?;
        let tensor = self.allocate("zeros", shape.to_vec(), len)?;
        self.record_clear(&tensor.storage)?;
        Ok(tensor)
    }

    /// A tensor of `shape` whose contents are unspecified (like `torch.empty`: whatever the
    /// range held before), for outputs that are written whole before they are read.
    pub fn empty(&self, shape: &[usize]) -> Result<Tensor, ComputeError> {
        let len = element_count("empty", shape)?;
        self.before_op()?;
        self.allocate("empty", shape.to_vec(), len)
    }

    /// Overwrites `tensor` with `data`. Submits the open batch first (an upload lands at the start
    /// of the next submission, so ops recorded earlier would otherwise read the new data).
    pub fn write(&self, tensor: &Tensor, data: &[f32]) -> Result<(), ComputeError> {
        self.check_owner("write", tensor)?;
        let allocation = tensor
            .try_allocation()
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
            .write(&allocation, 0, bytemuck::cast_slice(data))?;
        Ok(())
    }

    /// Reads `tensor` back: submits the open batch (which computes it) and waits for it.
    pub fn read(&self, tensor: &Tensor) -> Result<Vec<f32>, ComputeError> {
        self.check_owner("read", tensor)?;
        let allocation = tensor
            .try_allocation()
            .ok_or(ComputeError::Symbolic { op: "read" })?;
        Ok(floats(&self.read_allocation(&allocation)?, tensor.len()))
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
        Ok(floats(&bytes, tensor.len()))
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

    /// A new tensor of `len` elements for an op's output: memory from the pool (`len` rounded
    /// up to 16 bytes), or, while the context captures, a symbolic tensor of the capture.
    pub(crate) fn allocate(
        &self,
        label: &'static str,
        shape: Vec<usize>,
        len: usize,
    ) -> Result<Tensor, ComputeError> {
        match self.capture_id() {
            Some(capture) => Ok(Tensor {
                storage: Storage::new(&self.shared, None, Some(capture), tensor_bytes(len)),
                shape,
                len,
            }),
            None => self.allocate_memory(label, shape, len),
        }
    }

    /// A new tensor of `len` elements whose memory comes from the pool, capturing or not.
    pub(crate) fn allocate_memory(
        &self,
        label: &'static str,
        shape: Vec<usize>,
        len: usize,
    ) -> Result<Tensor, ComputeError> {
        let bytes = tensor_bytes(len);
        let allocation = match self
            .pool()
            .allocate_with(bytes, AllocOptions::labeled(label))
        {
            Err(PoolError::OutOfMemory(oom)) => self.after_out_of_memory(bytes, label, oom)?,
            result => result?,
        };
        Ok(Tensor {
            storage: Storage::new(&self.shared, Some(allocation), None, bytes),
            shape,
            len,
        })
    }
}

/// The `len` f32s of a tensor read back (its allocation is rounded up past them).
fn floats(bytes: &[u8], len: usize) -> Vec<f32> {
    crate::pool::to_elements(&bytes[..len * 4], len)
}
