//! Settings: what a device's limits derive, the rules `validate` holds, sizes past `u64`, and the
//! simulated storage.

use crate::buddy::{BuddyAllocator, Rounding};
use crate::policy::*;

use super::fixtures::*;

#[test]
fn limits_derive_the_configuration() {
    let h200 = PolicyConfig::for_limits(32, 4_292_870_144);
    assert_eq!(h200.min_block_bytes, 256);
    assert_eq!(h200.max_segment_bytes, DEFAULT_MAX_SEGMENT_BYTES);
    assert_eq!(h200.max_allocation_bytes, 4_292_870_144);
    let webgpu = PolicyConfig::for_limits(256, 256 * MIB);
    assert_eq!(webgpu.max_segment_bytes, 64 * MIB);
    let small = PolicyConfig::for_limits(256, 48 * MIB);
    assert_eq!(small.max_segment_bytes, 32 * MIB);
    let odd = PolicyConfig::for_limits(1024, 40 * MIB);
    assert_eq!(
        (odd.min_block_bytes, odd.max_segment_bytes),
        (1024, 32 * MIB)
    );
    PoolCore::new(odd, SimulatedStorage::default()).unwrap();
}

#[test]
fn any_limits_give_a_policy_the_pool_accepts() {
    for alignment in [0, 1, 32, 256, 1 << 27, 1 << 40, 1 << 63, u64::MAX] {
        for max_buffer in [0, 4, 256, MIB, 4_292_870_144, 1 << 63, u64::MAX] {
            let config = PolicyConfig::for_limits(alignment, max_buffer);
            assert!(config.min_segment_bytes <= config.max_segment_bytes);
            let mut pool = PoolCore::new(config, SimulatedStorage::new(None))
                .unwrap_or_else(|e| panic!("for_limits({alignment}, {max_buffer}): {e}"));
            // A byte is placed, or refused with a typed error when no buffer can hold it.
            match pool.allocate(1) {
                Ok(placement) => pool.free(placement),
                Err(error) => assert!(
                    matches!(error, PolicyError::TooLarge { .. }),
                    "for_limits({alignment}, {max_buffer}): {error}"
                ),
            }
        }
    }
}

#[test]
fn sizes_whose_rounding_passes_u64_are_refused_as_too_large() {
    let open = PolicyConfig {
        max_allocation_bytes: u64::MAX,
        ..config()
    };
    let configs = [
        PolicyConfig::naive(4, u64::MAX),
        open.clone(),
        PolicyConfig {
            rounding: Rounding::PowerOfTwo,
            ..open.clone()
        },
        PolicyConfig::for_limits(32, u64::MAX),
    ];
    for config in configs {
        let mut pool = pool(config.clone());
        for size in [u64::MAX, u64::MAX - 1, (1 << 63) + 1] {
            let refused = pool.allocate(size);
            if config.rounding == Rounding::Exact && size == (1 << 63) + 1 {
                // Exact rounding of 2^63 + 1 to 256 bytes fits in u64: a typed refusal or a
                // placement, never a panic (the simulated storage has no capacity).
                if let Ok(placement) = refused {
                    pool.free(placement);
                }
                continue;
            }
            assert!(
                matches!(refused, Err(PolicyError::TooLarge { .. })),
                "{size}: {refused:?} under {config:?}"
            );
            assert!(pool.allocate_existing(size).is_none());
            assert_eq!(
                pool.compaction_estimate(size, CompactionLimits::default()),
                None
            );
            assert_eq!(pool.rounded_size(size), u64::MAX);
        }
        assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
    let buddy = BuddyAllocator::with_capacity(256, 256 * MIB, Rounding::PowerOfTwo).unwrap();
    assert_eq!(buddy.rounded_size(u64::MAX), u64::MAX);
    assert_eq!(buddy.rounded_size((1 << 63) + 1), u64::MAX);
    let exact = BuddyAllocator::with_capacity(256, 256 * MIB, Rounding::Exact).unwrap();
    assert_eq!(exact.rounded_size(u64::MAX), u64::MAX);
    assert_eq!(exact.rounded_size(300), 512);
}

#[test]
fn settings_that_break_their_documented_rules_are_refused() {
    let cases = [
        PolicyConfig {
            max_segment_bytes: 3 << 31,
            ..config()
        },
        PolicyConfig {
            min_segment_bytes: 3 * MIB,
            ..config()
        },
        PolicyConfig {
            min_segment_bytes: 128 * MIB,
            ..config()
        },
        PolicyConfig {
            large_fill_eighths: 9,
            ..config()
        },
        PolicyConfig {
            large_fill_eighths: 0,
            ..config()
        },
        PolicyConfig {
            cache_headroom_divisor: 0,
            ..config()
        },
    ];
    for case in cases {
        let refused = PoolCore::new(case.clone(), SimulatedStorage::new(None)).map(drop);
        assert!(
            matches!(refused, Err(PolicyError::Setting(_))),
            "{refused:?} for {case:?}"
        );
        assert_eq!(case.validate(), refused);
    }
    // A block that is no power of two is the buddy's refusal.
    let odd_block = PolicyConfig {
        min_block_bytes: 300,
        ..config()
    };
    assert!(matches!(odd_block.validate(), Err(PolicyError::Config(_))));
    assert_eq!(config().validate(), Ok(()));
}

#[test]
fn a_simulated_storage_set_past_its_capacity_refuses_with_a_message() {
    let mut storage = SimulatedStorage::new(Some(MIB));
    storage.held_bytes = 2 * MIB;
    let error = storage
        .create_segment(MIB, SegmentClass::Packed)
        .unwrap_err();
    assert!(error.reason.contains("0 bytes free"), "{}", error.reason);
    storage.held_bytes = u64::MAX;
    assert!(storage.create_segment(1, SegmentClass::Packed).is_err());
    storage.held_bytes = 0;
    storage.destroy_segment(MIB);
    assert_eq!(storage.held_bytes, 0);
}
