//! What a segment's memory comes from: the storage trait, its refusal, and the replay's simulated
//! storage.

use super::segment::SegmentClass;

/// What a segment's memory comes from: GPU buffers in the pool, nothing but bookkeeping in the
/// replay.
pub trait SegmentStorage {
    /// The storage's handle to one segment's memory.
    type Segment;

    /// Creates the memory of one segment of `size_bytes`, for the size class `class` (a storage
    /// may name its buffers by it). An error means the device (or simulated device) is out of
    /// memory.
    fn create_segment(
        &mut self,
        size_bytes: u64,
        class: SegmentClass,
    ) -> Result<Self::Segment, StorageError>;

    /// Gives a segment's memory back. It holds no live allocation.
    fn destroy_segment(&mut self, segment: Self::Segment);
}

/// A storage's refusal to create a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the device could not allocate {size_bytes} bytes: {reason}")]
pub struct StorageError {
    /// The size that was refused, in bytes.
    pub size_bytes: u64,
    /// What the device said.
    pub reason: String,
}

/// A storage that only counts: the replay's stand-in for a device. With a capacity, it refuses a
/// segment that would take its total past it, as a device out of memory would.
#[derive(Debug, Clone, Default)]
pub struct SimulatedStorage {
    /// The device memory available, in bytes; `None` for unlimited.
    pub capacity_bytes: Option<u64>,
    /// Bytes of segments now held, in bytes.
    pub held_bytes: u64,
}

impl SimulatedStorage {
    /// A simulated device of `capacity_bytes` (or unlimited).
    pub fn new(capacity_bytes: Option<u64>) -> Self {
        Self {
            capacity_bytes,
            held_bytes: 0,
        }
    }
}

impl SegmentStorage for SimulatedStorage {
    type Segment = u64;

    fn create_segment(
        &mut self,
        size_bytes: u64,
        _class: SegmentClass,
    ) -> Result<u64, StorageError> {
        if let Some(capacity) = self.capacity_bytes {
            if self.held_bytes.saturating_add(size_bytes) > capacity {
                return Err(StorageError {
                    size_bytes,
                    reason: format!(
                        "simulated device of {capacity} bytes has {} bytes free",
                        capacity.saturating_sub(self.held_bytes)
                    ),
                });
            }
        }
        self.held_bytes = self.held_bytes.saturating_add(size_bytes);
        Ok(size_bytes)
    }

    fn destroy_segment(&mut self, segment: u64) {
        self.held_bytes = self.held_bytes.saturating_sub(segment);
    }
}
