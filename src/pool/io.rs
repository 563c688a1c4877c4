//! Moving bytes in and out of allocations: uploads with `queue.write_buffer`, and reads through one
//! staging buffer, alone or behind submitted work.

use super::allocation::Allocation;
use super::options::PoolError;
use std::sync::atomic::Ordering;

use super::shared::Shared;
use crate::state::BufferRole;

/// The largest staging buffer a read uses (when the device allows it): a larger read goes in
/// pieces of this size.
pub const MAX_STAGING_BYTES: u64 = 64 << 20;

/// The smallest staging buffer, so that small reads of different sizes share one.
const MIN_STAGING_BYTES: u64 = 64 << 10;

/// The largest power of two not above `bytes` (at least 4: every device allows buffers of 4 bytes).
fn largest_power_of_two_at_most(bytes: u64) -> u64 {
    if bytes < 4 {
        4
    } else {
        1 << (63 - bytes.leading_zeros())
    }
}

impl Shared {
    /// Uploads `data` at `offset_bytes` into `allocation` with `queue.write_buffer`.
    pub(super) fn write(
        &self,
        allocation: &Allocation,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        // A slice's length always fits 64 bits; were it not to, no allocation could hold it.
        let len_bytes = u64::try_from(data.len()).unwrap_or(u64::MAX);
        allocation.check_pool(self)?;
        allocation.check_access(offset_bytes, len_bytes)?;
        // Checked: the length is a multiple of 4, or the write ends at the allocation's size and
        // its last partial word is padded with zeros into the bytes that round the size up.
        let whole = data.len() / 4 * 4;
        let (body, tail) = data.split_at(whole);
        let start = allocation.offset() + offset_bytes;
        if !body.is_empty() {
            self.gpu
                .queue
                .write_buffer(allocation.buffer(), start, body);
        }
        if !tail.is_empty() {
            let mut word = [0u8; 4];
            word[..tail.len()].copy_from_slice(tail);
            let body_bytes = u64::try_from(whole).unwrap_or(u64::MAX);
            self.gpu
                .queue
                .write_buffer(allocation.buffer(), start + body_bytes, &word);
        }
        Ok(())
    }

    /// Copies `allocation` into the staging buffer — alone, or behind `work` through
    /// [`Shared::submit`] — waits, and returns its bytes: exactly `allocation.size()` of them.
    pub(super) fn read_via(
        &self,
        allocation: &Allocation,
        work: Option<Vec<wgpu::CommandBuffer>>,
    ) -> Result<Vec<u8>, PoolError> {
        if let Err(error) = allocation.check_pool(self) {
            // The work is submitted all the same (nothing is lost); only the read is refused.
            if let Some(work) = work {
                self.submit(work);
            }
            return Err(error);
        }
        let size = allocation.binding_size();
        // One staging buffer, reused by every read (reads wait for each other here), never above
        // the device's max_buffer_size nor MAX_STAGING_BYTES: larger reads go in pieces.
        let wanted = size
            .next_power_of_two()
            .max(MIN_STAGING_BYTES)
            .min(self.staging_limit());
        let mut staging_slot = self
            .staging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if staging_slot
            .as_ref()
            .is_none_or(|buffer| buffer.size() < wanted)
        {
            // Dropped first, so that the old and the new one are not held at once.
            *staging_slot = None;
            *staging_slot = Some(self.gpu.create_accounted_buffer(
                BufferRole::ReadBack,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool read-back"),
                    size: wanted,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                },
            ));
            self.staging_bytes.store(wanted, Ordering::Relaxed);
        }
        let staging = staging_slot.as_ref().expect("just ensured");
        let result = self
            .read_in_pieces(staging, allocation, size, work)
            .map(|mut bytes| {
                // The copy moved whole words; the bytes past the size are padding.
                bytes.truncate(usize::try_from(allocation.size()).unwrap_or(usize::MAX));
                bytes
            });
        if result.is_err() {
            // A failed read may leave the staging buffer mapped: start afresh next time.
            *staging_slot = None;
            self.staging_bytes.store(0, Ordering::Relaxed);
        }
        result
    }

    /// [`Shared::read_via`] without blocking and without work: through a staging buffer of its own
    /// (no lock is held across a wait), in pieces as large as the shared one's, each awaited.
    pub(super) async fn read_async(&self, allocation: &Allocation) -> Result<Vec<u8>, PoolError> {
        allocation.check_pool(self)?;
        self.read_range_async(
            allocation.buffer(),
            allocation.offset(),
            allocation.binding_size(),
            allocation.size(),
        )
        .await
    }

    /// Reads `size` bytes at `offset` of `buffer` (a range of `binding_size` bytes, a multiple of
    /// 4), as [`Shared::read_async`] does.
    pub(super) async fn read_range_async(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        binding_size: u64,
        size: u64,
    ) -> Result<Vec<u8>, PoolError> {
        let piece_bytes = binding_size.min(self.staging_limit());
        let staging = self.gpu.create_accounted_buffer(
            BufferRole::ReadBack,
            &wgpu::BufferDescriptor {
                label: Some("wgpu-pool async read-back"),
                size: piece_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            },
        );
        let mut bytes = Vec::with_capacity(usize::try_from(binding_size).unwrap_or(0));
        let mut done = 0;
        while done < binding_size {
            let piece = (binding_size - done).min(piece_bytes);
            self.gpu
                .queue
                .submit([self.copy_piece(&staging, buffer, offset + done, piece)]);
            bytes.extend(
                crate::device::read_mapped_async(&self.gpu.device, &staging, piece)
                    .await
                    .map_err(PoolError::ReadBack)?,
            );
            done += piece;
        }
        bytes.truncate(usize::try_from(size).unwrap_or(usize::MAX));
        if let Some(errors) = self.gpu.reported_errors() {
            return Err(PoolError::DeviceReported(errors));
        }
        Ok(bytes)
    }

    /// Reads the first `size` bytes of `allocation` through `staging`, a piece of at most its
    /// size at a time; the first piece goes behind `work`.
    fn read_in_pieces(
        &self,
        staging: &wgpu::Buffer,
        allocation: &Allocation,
        size: u64,
        mut work: Option<Vec<wgpu::CommandBuffer>>,
    ) -> Result<Vec<u8>, PoolError> {
        // Both are multiples of 4: the binding size is, and so is the staging buffer's.
        let piece_bytes = staging.size();
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        let mut done = 0;
        while done < size {
            let piece = (size - done).min(piece_bytes);
            bytes.extend(self.read_through(staging, allocation, done, piece, work.take())?);
            done += piece;
        }
        Ok(bytes)
    }

    fn read_through(
        &self,
        staging: &wgpu::Buffer,
        allocation: &Allocation,
        offset_bytes: u64,
        size: u64,
        work: Option<Vec<wgpu::CommandBuffer>>,
    ) -> Result<Vec<u8>, PoolError> {
        let copy = self.copy_piece(
            staging,
            allocation.buffer(),
            allocation.offset() + offset_bytes,
            size,
        );
        match work {
            // The pool's own submission: ranges waiting for one stay pending.
            None => {
                self.gpu.queue.submit([copy]);
            }
            Some(mut buffers) => {
                buffers.push(copy);
                self.submit(buffers);
            }
        }
        crate::device::read_mapped(&self.gpu.device, staging, size).map_err(PoolError::ReadBack)
    }

    /// The largest staging buffer a read uses: a power of two within the device's
    /// `max_buffer_size` and [`MAX_STAGING_BYTES`]; larger reads go in pieces of it.
    fn staging_limit(&self) -> u64 {
        largest_power_of_two_at_most(self.max_buffer_size.min(MAX_STAGING_BYTES))
    }

    /// A command buffer that copies `size` bytes of `buffer` from `offset_bytes` to the start of
    /// `staging`.
    fn copy_piece(
        &self,
        staging: &wgpu::Buffer,
        buffer: &wgpu::Buffer,
        offset_bytes: u64,
        size: u64,
    ) -> wgpu::CommandBuffer {
        let mut encoder = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgpu-pool read-back"),
            });
        encoder.copy_buffer_to_buffer(buffer, offset_bytes, staging, 0, size);
        encoder.finish()
    }
}
