//! The allocation handle: a range of a GPU buffer, held until dropped, that binds directly as
//! `(buffer, offset, size)`. It holds the pool's shared state (not a `Pool`) and its record's
//! index in the live slab, which owns the policy's placement; dropping it frees the range.

use std::num::NonZeroU64;
use std::sync::Arc;

use super::options::PoolError;
use super::shared::{Reserved, Shared};
use crate::history::Label;
use crate::policy::SegmentId;

/// A range of a GPU buffer, held until dropped. Binds directly as `(buffer, offset, size)`. Not
/// `Clone`; dropping it gives the range back (reusable after the next `Pool::submit`; at once in
/// the naive baseline, whose buffer is given back).
pub struct Allocation {
    shared: Arc<Shared>,
    buffer: wgpu::Buffer,
    /// Its record in the pool's live slab (which owns its placement).
    live_slot: usize,
    segment: SegmentId,
    offset_bytes: u64,
    allocated_bytes: u64,
    size_bytes: u64,
    label: Label,
    /// Set by `Pool::free_submitted`: the last use is already submitted, so the range is
    /// reusable as soon as it is dropped.
    last_use_submitted: bool,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("offset_bytes", &self.offset_bytes)
            .field("size_bytes", &self.size_bytes)
            .field("allocated_bytes", &self.allocated_bytes)
            .field("segment", &self.segment)
            .field("label", &self.label)
            .finish()
    }
}

impl Allocation {
    /// The handle of a range just reserved in `shared`'s pool.
    pub(super) fn new(
        shared: Arc<Shared>,
        reserved: Reserved,
        size_bytes: u64,
        label: Label,
    ) -> Self {
        Self {
            shared,
            buffer: reserved.buffer,
            live_slot: reserved.live_slot,
            segment: reserved.segment,
            offset_bytes: reserved.offset_bytes,
            allocated_bytes: reserved.allocated_bytes,
            size_bytes,
            label,
            last_use_submitted: false,
        }
    }

    /// Its record's index in the live slab.
    pub(super) fn live_slot(&self) -> usize {
        self.live_slot
    }

    /// Points the handle at the range a compaction moved it to (the same size).
    pub(super) fn relocate(&mut self, buffer: wgpu::Buffer, segment: SegmentId, offset_bytes: u64) {
        self.buffer = buffer;
        self.segment = segment;
        self.offset_bytes = offset_bytes;
    }

    /// Names the allocation's new owner ([`super::Pool::reuse`]).
    pub(super) fn set_label(&mut self, label: Label) {
        self.label = label;
    }

    /// Declares the allocation's last use submitted: dropping it frees the range at once.
    pub(super) fn set_last_use_submitted(&mut self) {
        self.last_use_submitted = true;
    }

    /// `Ok` when the allocation was made by the pool whose shared state is `shared`, else
    /// [`PoolError::ForeignAllocation`].
    pub(super) fn check_pool(&self, shared: &Shared) -> Result<(), PoolError> {
        if std::ptr::eq(Arc::as_ptr(&self.shared), shared) {
            Ok(())
        } else {
            Err(PoolError::ForeignAllocation {
                label: self.label.to_string(),
                size_bytes: self.size_bytes,
            })
        }
    }

    /// True when the allocation was made by the pool whose shared state is `shared`.
    pub(super) fn is_of(&self, shared: &Shared) -> bool {
        self.check_pool(shared).is_ok()
    }

    /// Checks that `len_bytes` at `offset_bytes` lie within the allocation's size (exactly: not
    /// the size rounded up to 4) and are aligned for copies: the offset a multiple of 4, and the
    /// length too unless the access ends at the allocation's size (the tail is then padded into
    /// the bytes that round it up to 4, which it owns).
    pub(super) fn check_access(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), PoolError> {
        let end = offset_bytes.checked_add(len_bytes);
        let aligned = offset_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
            && (len_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
                || end == Some(self.size_bytes));
        let fits = end.is_some_and(|end| end <= self.size_bytes);
        if aligned && fits {
            Ok(())
        } else {
            Err(PoolError::OutOfBounds {
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes,
            })
        }
    }

    /// The buffer holding the range.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Start of the range in the buffer, in bytes; a multiple of the device's
    /// `min_storage_buffer_offset_alignment` (0 in the naive baseline).
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size_bytes
    }

    /// The size bound by [`Allocation::binding`]: the size asked for rounded up to 4 bytes.
    pub fn binding_size(&self) -> u64 {
        self.size_bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT
    }

    /// The bytes held for this allocation after rounding.
    pub fn allocated_size(&self) -> u64 {
        self.allocated_bytes
    }

    /// The segment holding it (in the naive baseline, its own buffer's).
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The label given at allocation.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `(buffer, offset, size)` for a bind group entry.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset_bytes,
            size: NonZeroU64::new(self.binding_size()),
        }
    }

    /// The binding as a bind-group resource.
    pub fn as_binding_resource(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(self.binding())
    }

    /// The range as a buffer slice, for copies.
    pub fn slice(&self) -> wgpu::BufferSlice<'_> {
        self.buffer
            .slice(self.offset_bytes..self.offset_bytes + self.binding_size())
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.shared
            .free(self.live_slot, self.buffer.clone(), self.last_use_submitted);
    }
}
