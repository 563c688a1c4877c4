//! The test configurations shared by the policy's tests, and a pool over the simulated storage.

use crate::policy::{PolicyConfig, PolicyMode, PoolCore, SimulatedStorage};

pub(super) const MIB: u64 = 1 << 20;

/// The default policy for a device of 256 MiB buffers and 256-byte blocks: packed segments of 2
/// to 64 MiB, mid-sized requests above 1 MiB, large ones above 16 MiB (6/8 full, remainders
/// within 1/4), empty segments cached within 1/32 over the demand.
pub(super) fn config() -> PolicyConfig {
    let config = PolicyConfig::for_limits(256, 256 * MIB);
    assert_eq!(
        (
            config.mode,
            config.min_block_bytes,
            config.min_segment_bytes,
            config.max_segment_bytes,
            config.growth_divisor,
            config.max_allocation_bytes,
        ),
        (PolicyMode::Pooled, 256, 2 * MIB, 64 * MIB, 8, 256 * MIB)
    );
    assert_eq!(
        (
            config.mid_above_bytes,
            config.large_above_bytes,
            config.large_fill_eighths,
            config.large_remainder_divisor,
            config.cache_headroom_divisor,
        ),
        (MIB, 16 * MIB, 6, 4, 32)
    );
    config
}

pub(super) fn pool(config: PolicyConfig) -> PoolCore<SimulatedStorage> {
    PoolCore::new(config, SimulatedStorage::new(None)).unwrap()
}
