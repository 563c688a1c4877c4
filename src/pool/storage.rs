//! The pool's `SegmentStorage`: every segment is one `wgpu::Buffer`. Pooled segments are created
//! with out-of-memory and validation errors caught ([`create_buffer_checked`]); in the naive mode a
//! segment is what a user writes without a pool, a plain `create_buffer`.

use std::sync::Arc;

use crate::device::{Gpu, Ledger};
use crate::policy::{SegmentClass, SegmentStorage, StorageError};
use crate::state::BufferRole;

/// The usages of every segment buffer.
pub const SEGMENT_USAGES: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The storage of a pool: every segment is one `wgpu::Buffer`.
pub(super) struct BufferStorage {
    device: wgpu::Device,
    /// The device's accounting: segments are counted in it from creation until given back (or
    /// until the storage, and with it every segment, is dropped).
    ledger: Arc<Ledger>,
    /// Bytes of the segments held now (what the ledger is given back when the storage drops).
    held_bytes: u64,
    /// Segments held now.
    held_segments: u64,
    /// The prefix of every buffer's label.
    label: String,
    /// The naive baseline: plain `create_buffer` calls, one per allocation.
    naive: bool,
    /// In the naive mode, the label of the allocation the next segment is made for (set before
    /// each allocation).
    pub(super) allocation_label: String,
}

impl BufferStorage {
    pub(super) fn new(gpu: &Gpu, label: String, naive: bool) -> Self {
        Self {
            device: gpu.device.clone(),
            ledger: gpu.ledger().clone(),
            held_bytes: 0,
            held_segments: 0,
            label,
            naive,
            allocation_label: String::new(),
        }
    }
}

impl SegmentStorage for BufferStorage {
    type Segment = wgpu::Buffer;

    fn create_segment(
        &mut self,
        size_bytes: u64,
        class: SegmentClass,
    ) -> Result<wgpu::Buffer, StorageError> {
        let buffer = self.create(size_bytes, class)?;
        self.ledger.add(BufferRole::PoolSegments, buffer.size());
        self.held_bytes += buffer.size();
        self.held_segments += 1;
        Ok(buffer)
    }

    fn destroy_segment(&mut self, segment: wgpu::Buffer) {
        self.ledger.sub(BufferRole::PoolSegments, segment.size());
        self.held_bytes = self.held_bytes.saturating_sub(segment.size());
        self.held_segments = self.held_segments.saturating_sub(1);
        // Dropping (not `destroy()`): wgpu frees the memory once submitted work using it is done.
        drop(segment);
    }
}

impl Drop for BufferStorage {
    fn drop(&mut self) {
        // The pool is gone, and with it every segment it still held.
        self.ledger.release(
            BufferRole::PoolSegments,
            self.held_segments,
            self.held_bytes,
        );
    }
}

impl BufferStorage {
    /// The segment's buffer: in the naive mode a plain `create_buffer`, else one whose errors
    /// are caught.
    fn create(
        &mut self,
        size_bytes: u64,
        class: SegmentClass,
    ) -> Result<wgpu::Buffer, StorageError> {
        if self.naive {
            // What a user writes without a pool: a plain `create_buffer` (sizes were checked
            // against the device's limits; a driver out-of-memory reaches wgpu's uncaptured-error
            // handler, as it would in that user's code).
            return Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("{} naive {}", self.label, self.allocation_label)),
                size: size_bytes,
                usage: SEGMENT_USAGES,
                mapped_at_creation: false,
            }));
        }
        let label = format!("{} {} segment ({size_bytes} B)", self.label, class.name());
        create_buffer_checked(&self.device, &label, size_bytes, SEGMENT_USAGES)
    }
}

/// `create_buffer` with out-of-memory and validation errors caught as a `StorageError` instead
/// of reaching the device's uncaptured-error handler.
///
/// Native only: the error scopes answer through a future that is waited for here. A browser
/// cannot wait, so there segments are plain `create_buffer` calls (below): `Pool::allocate_async`
/// awaits the device's word on them in scopes of its own, and the synchronous calls leave their
/// errors to the uncaptured-error handler.
#[cfg(not(target_arch = "wasm32"))]
fn create_buffer_checked(
    device: &wgpu::Device,
    label: &str,
    size_bytes: u64,
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer, StorageError> {
    let out_of_memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size_bytes,
        usage,
        mapped_at_creation: false,
    });
    let validation = pollster::block_on(validation.pop());
    let out_of_memory = pollster::block_on(out_of_memory.pop());
    match validation.or(out_of_memory) {
        None => Ok(buffer),
        Some(error) => Err(StorageError {
            size_bytes,
            reason: error.to_string(),
        }),
    }
}

/// In a browser, nothing may block: a plain `create_buffer` (see the native version's comment,
/// and `Pool::allocate_async`).
#[cfg(target_arch = "wasm32")]
fn create_buffer_checked(
    device: &wgpu::Device,
    label: &str,
    size_bytes: u64,
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer, StorageError> {
    Ok(device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size_bytes,
        usage,
        mapped_at_creation: false,
    }))
}
