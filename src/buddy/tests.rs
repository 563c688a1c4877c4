//! Scenario tests with exact offsets, and property tests against a simple model.

use super::bins::{bin_floor, length_bin, BINS};
use super::run::for_each_piece;
use super::*;
use proptest::prelude::*;

const KIB: u64 = 1024;

fn exact(min_block: u64, max_order: u32) -> BuddyAllocator {
    BuddyAllocator::new(min_block, max_order, Rounding::Exact).unwrap()
}

/// Every scenario ends here: everything freed, the whole capacity is one block at offset 0.
fn assert_fully_coalesced(mut allocator: BuddyAllocator) {
    allocator.check_invariants().unwrap();
    let stats = allocator.stats();
    assert_eq!(stats.allocated_bytes, 0);
    assert_eq!(stats.free_bytes, stats.capacity_bytes);
    // The largest root: the whole capacity when it is a power of two.
    assert_eq!(
        stats.largest_free_bytes,
        allocator.min_block() << allocator.max_order()
    );
    if allocator.rounding() == Rounding::Exact || stats.capacity_bytes == stats.largest_free_bytes {
        let all = allocator.allocate(allocator.capacity()).unwrap();
        assert_eq!(all.offset(), 0);
        allocator.free(all);
    } else {
        assert!(matches!(
            allocator.allocate(allocator.capacity()),
            Err(AllocError::TooLarge { .. })
        ));
    }
}

#[test]
fn exact_fit_gives_the_tail_back() {
    // 8 units of 256 B. 5 units take [0, 5); the tail is a 1-unit block at 5 and a 2-unit at 6.
    let mut allocator = exact(256, 3);
    let a = allocator.allocate(5 * 256 - 10).unwrap();
    assert_eq!(a.offset(), 0);
    assert_eq!(a.units(), 5);
    assert_eq!(
        allocator.free_blocks(),
        vec![(5 * 256, 256), (6 * 256, 512)]
    );
    let stats = allocator.stats();
    assert_eq!(stats.allocated_bytes, 5 * 256);
    assert_eq!(stats.requested_bytes, 5 * 256 - 10);
    assert_eq!(stats.free_bytes, 3 * 256);
    assert_eq!(stats.largest_free_bytes, 512);
    assert_eq!(stats.free_blocks_per_order[0], 1);
    assert_eq!(stats.free_blocks_per_order[1], 1);
    // The tail is usable: 2 units land at 6, 1 unit at 5, and the segment is full.
    let b = allocator.allocate(512).unwrap();
    assert_eq!(b.offset(), 6 * 256);
    let c = allocator.allocate(1).unwrap();
    assert_eq!(c.offset(), 5 * 256);
    assert!(matches!(
        allocator.allocate(1),
        Err(AllocError::OutOfSpace {
            free_bytes: 0,
            largest_free_bytes: 0,
            ..
        })
    ));
    allocator.free(a);
    assert_eq!(allocator.free_blocks(), vec![(0, 1024), (1024, 256)]);
    allocator.free(c);
    allocator.free(b);
    assert_fully_coalesced(allocator);
}

#[test]
fn power_of_two_rounds_up() {
    let mut allocator = BuddyAllocator::new(256, 3, Rounding::PowerOfTwo).unwrap();
    let a = allocator.allocate(5 * 256).unwrap();
    assert_eq!((a.offset(), a.units()), (0, 8));
    assert!(matches!(
        allocator.allocate(1),
        Err(AllocError::OutOfSpace { .. })
    ));
    assert!((allocator.stats().internal_fragmentation() - 3.0 / 8.0).abs() < 1e-12);
    allocator.free(a);
    let b = allocator.allocate(256).unwrap();
    let c = allocator.allocate(300).unwrap();
    let d = allocator.allocate(256).unwrap();
    assert_eq!((b.offset(), c.offset(), d.offset()), (0, 512, 256));
    allocator.free(b);
    allocator.free(c);
    allocator.free(d);
    assert_fully_coalesced(allocator);
}

#[test]
fn large_requests_take_the_start_of_a_run_and_small_ones_its_end() {
    let mut allocator = exact(KIB, 4); // 16 units
                                       // Nothing is live: 8 units count as at least the mean, and take the start.
    let a = allocator.allocate(8 * KIB).unwrap();
    // Below the mean live size (8, then 4.5, then 4.33): from the end of [8, 16).
    let b = allocator.allocate(KIB).unwrap();
    let c = allocator.allocate(4 * KIB).unwrap();
    let d = allocator.allocate(2 * KIB).unwrap();
    assert_eq!(
        [a.offset(), b.offset(), c.offset(), d.offset()],
        [0, 15 * KIB, 11 * KIB, 9 * KIB]
    );
    assert_eq!(allocator.free_blocks(), vec![(8 * KIB, KIB)]);
    // The mean is now 7 / 3 units: 4 units are above it and take the start of the run [0, 9).
    allocator.free(a);
    let e = allocator.allocate(4 * KIB).unwrap();
    assert_eq!(e.offset(), 0);
    assert_eq!(
        allocator.free_blocks(),
        vec![(4 * KIB, 4 * KIB), (8 * KIB, KIB)]
    );
    for allocation in [b, c, d, e] {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}

#[test]
fn a_request_straddles_buddy_blocks() {
    // 16 units of 1 KiB filled with 4-unit blocks, each at least the mean and so at the start of
    // the free run. Free [4, 8) and [8, 12): free blocks of order 2 that are not buddies, so no
    // 8-unit block is free, but the run [4, 12) holds a 6-unit request.
    let mut allocator = exact(KIB, 4);
    let mut blocks: Vec<_> = (0..4)
        .map(|_| allocator.allocate(4 * KIB).unwrap())
        .collect();
    let offsets: Vec<u64> = blocks.iter().map(|b| b.offset() / KIB).collect();
    assert_eq!(offsets, [0, 4, 8, 12]);
    let at_8 = blocks.remove(2);
    let at_4 = blocks.remove(1);
    allocator.free(at_4);
    allocator.free(at_8);
    assert_eq!(
        allocator.free_blocks(),
        vec![(4 * KIB, 4 * KIB), (8 * KIB, 4 * KIB)]
    );
    assert_eq!(allocator.stats().largest_free_bytes, 4 * KIB);
    // The run holds 8 units: order 3 in `fit_order`'s terms.
    assert_eq!(allocator.fit_order(6 * KIB), Some(3));
    let straddling = allocator.allocate(6 * KIB).unwrap();
    assert_eq!(straddling.offset(), 4 * KIB);
    assert_eq!(allocator.free_blocks(), vec![(10 * KIB, 2 * KIB)]);
    allocator.check_invariants().unwrap();
    allocator.free(straddling);
    for block in blocks {
        allocator.free(block);
    }
    assert_fully_coalesced(allocator);
}

#[test]
fn any_multiple_of_min_block_is_a_capacity() {
    // 40 units: a 32-unit root at 0 and an 8-unit root at 32; they never merge, but a request of
    // the whole capacity straddles them.
    let mut allocator = BuddyAllocator::with_capacity(KIB, 40 * KIB, Rounding::Exact).unwrap();
    assert_eq!(allocator.max_order(), 5);
    assert_eq!(
        allocator.free_blocks(),
        vec![(0, 32 * KIB), (32 * KIB, 8 * KIB)]
    );
    assert_eq!(allocator.stats().largest_free_bytes, 32 * KIB);
    let a = allocator.allocate(8 * KIB).unwrap();
    assert_eq!(a.offset(), 0); // the start of the only run
                               // 32 units, across the boundary of the two roots.
    let b = allocator.allocate(32 * KIB).unwrap();
    assert_eq!(b.offset(), 8 * KIB);
    assert!(matches!(
        allocator.allocate(1),
        Err(AllocError::OutOfSpace { .. })
    ));
    allocator.free(a);
    allocator.free(b);
    allocator.check_invariants().unwrap();
    assert_eq!(
        allocator.free_blocks(),
        vec![(0, 32 * KIB), (32 * KIB, 8 * KIB)]
    );
    let whole = allocator.allocate(40 * KIB).unwrap();
    assert_eq!(whole.offset(), 0);
    assert_eq!(allocator.stats().free_bytes, 0);
    assert_eq!(
        allocator.allocate(40 * KIB + 1).unwrap_err(),
        AllocError::TooLarge {
            requested_bytes: 40 * KIB + 1,
            capacity_bytes: 40 * KIB
        }
    );
    allocator.free(whole);
    allocator.check_invariants().unwrap();
    assert_eq!(allocator.free_blocks().len(), 2);
}

#[test]
fn figures_in_errors() {
    let mut allocator = exact(256, 4); // 4 KiB
    assert_eq!(allocator.allocate(0), Err(AllocError::ZeroSize));
    assert_eq!(
        allocator.allocate(4 * KIB + 1),
        Err(AllocError::TooLarge {
            requested_bytes: 4 * KIB + 1,
            capacity_bytes: 4 * KIB
        })
    );
    let a = allocator.allocate(KIB).unwrap(); // [0, 1 KiB)
    let b = allocator.allocate(2 * KIB).unwrap(); // [2, 4 KiB)
    assert_eq!(
        allocator.allocate(1025),
        Err(AllocError::OutOfSpace {
            requested_bytes: 1025,
            needed_block_bytes: 2 * KIB,
            largest_free_bytes: KIB,
            free_bytes: KIB,
        })
    );
    let message = allocator.allocate(1025).unwrap_err().to_string();
    assert!(
        message.contains("1025") && message.contains("largest free block 1024"),
        "{message}"
    );
    // A failed request changed nothing.
    allocator.check_invariants().unwrap();
    assert_eq!(allocator.stats().allocation_count, 2);
    allocator.free(a);
    allocator.free(b);
    assert_fully_coalesced(allocator);
}

#[test]
fn configuration_errors() {
    assert_eq!(
        BuddyAllocator::new(300, 4, Rounding::Exact).unwrap_err(),
        ConfigError::MinBlockNotPowerOfTwo {
            min_block_bytes: 300
        }
    );
    assert_eq!(
        BuddyAllocator::new(0, 4, Rounding::Exact).unwrap_err(),
        ConfigError::MinBlockNotPowerOfTwo { min_block_bytes: 0 }
    );
    assert_eq!(
        BuddyAllocator::new(256, 33, Rounding::Exact).unwrap_err(),
        ConfigError::MaxOrderTooLarge { max_order: 33 }
    );
    assert_eq!(
        BuddyAllocator::new(1 << 40, 30, Rounding::Exact).unwrap_err(),
        ConfigError::MaxOrderTooLarge { max_order: 30 }
    );
    assert_eq!(
        BuddyAllocator::with_capacity(256, 3 * 256 + 1, Rounding::Exact).unwrap_err(),
        ConfigError::CapacityNotMultipleOfMinBlock {
            capacity_bytes: 3 * 256 + 1,
            min_block_bytes: 256
        }
    );
    assert!(matches!(
        BuddyAllocator::with_capacity(256, 0, Rounding::Exact),
        Err(ConfigError::CapacityNotMultipleOfMinBlock { .. })
    ));
    let allocator = BuddyAllocator::with_capacity(256, 1 << 20, Rounding::Exact).unwrap();
    assert_eq!((allocator.capacity(), allocator.max_order()), (1 << 20, 12));
}

#[test]
#[should_panic(expected = "was freed into allocator")]
fn freeing_into_another_allocator_panics() {
    let mut first = exact(256, 4);
    let mut second = exact(256, 4);
    let allocation = first.allocate(256).unwrap();
    second.free(allocation);
}

#[test]
fn single_block_allocator() {
    let mut allocator = exact(256, 0);
    let a = allocator.allocate(1).unwrap();
    assert_eq!(
        allocator.allocate(1).unwrap_err(),
        AllocError::OutOfSpace {
            requested_bytes: 1,
            needed_block_bytes: 256,
            largest_free_bytes: 0,
            free_bytes: 0
        }
    );
    allocator.free(a);
    assert_fully_coalesced(allocator);
}

#[test]
fn fragmentation_figures() {
    let mut allocator = exact(256, 4);
    assert_eq!(allocator.stats().external_fragmentation(), 0.0);
    assert_eq!(allocator.stats().internal_fragmentation(), 0.0);
    let allocations: Vec<_> = (0..16).map(|_| allocator.allocate(200).unwrap()).collect();
    let stats = allocator.stats();
    assert_eq!(stats.external_fragmentation(), 0.0); // nothing free
    assert!((stats.internal_fragmentation() - (1.0 - 200.0 / 256.0)).abs() < 1e-12);
    // Free every other block: 8 blocks of 256 free, the largest is 256.
    let mut kept = Vec::new();
    for (i, allocation) in allocations.into_iter().enumerate() {
        if i % 2 == 0 {
            allocator.free(allocation);
        } else {
            kept.push(allocation);
        }
    }
    let stats = allocator.stats();
    assert_eq!(stats.free_bytes, 8 * 256);
    assert_eq!(stats.largest_free_bytes, 256);
    assert!((stats.external_fragmentation() - 7.0 / 8.0).abs() < 1e-12);
    for allocation in kept {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}

/// The model: live allocations as (offset, allocated bytes, requested bytes).
#[derive(Default)]
struct Model {
    live: Vec<(u64, u64, u64)>,
}

/// The longest run of free bytes between live allocations, counting only runs aligned to `align`
/// blocks (what an aligned request could use).
fn longest_free_run(model: &Model, capacity: u64, align: u64) -> u64 {
    let mut live: Vec<(u64, u64)> = model.live.iter().map(|l| (l.0, l.0 + l.1)).collect();
    live.sort_unstable();
    (0..capacity / align)
        .filter(|block| {
            let (start, end) = (block * align, (block + 1) * align);
            live.iter().all(|&(s, e)| e <= start || end <= s)
        })
        .map(|_| align)
        .max()
        .unwrap_or(0)
}

/// The lengths of the maximal free runs between live allocations, in bytes.
fn free_gaps(model: &Model, capacity: u64) -> Vec<u64> {
    let mut live: Vec<(u64, u64)> = model.live.iter().map(|l| (l.0, l.0 + l.1)).collect();
    live.sort_unstable();
    let mut gaps = Vec::new();
    let mut position = 0;
    for (start, end) in live.into_iter().chain([(capacity, capacity)]) {
        if start > position {
            gaps.push(start - position);
        }
        position = position.max(end);
    }
    gaps
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(u64),
    Free(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (1u64..=4096).prop_map(Op::Allocate),
        1 => (1u64..=64 * KIB).prop_map(Op::Allocate),
        3 => any::<usize>().prop_map(Op::Free),
    ];
    prop::collection::vec(op, 1..300)
}

fn run_against_model(
    rounding: Rounding,
    capacity_units: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let min_block = 256u64;
    let mut allocator =
        BuddyAllocator::with_capacity(min_block, capacity_units * min_block, rounding).unwrap();
    let roots = allocator.free_blocks();
    let mut handles: Vec<Allocation> = Vec::new();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Allocate(size) => {
                let before = allocator.stats();
                match allocator.allocate(size) {
                    Ok(allocation) => {
                        let rounded = check_placed(&allocator, &model, &allocation, size)?;
                        model.live.push((allocation.offset(), rounded, size));
                        handles.push(allocation);
                    }
                    Err(AllocError::OutOfSpace {
                        largest_free_bytes,
                        needed_block_bytes,
                        ..
                    }) => {
                        prop_assert!(largest_free_bytes < needed_block_bytes);
                        check_refused(&allocator, &model, size, needed_block_bytes)?;
                        prop_assert_eq!(allocator.stats(), before);
                    }
                    Err(other) => prop_assert!(false, "unexpected error {other}"),
                }
            }
            Op::Free(index) => {
                if handles.is_empty() {
                    continue;
                }
                let index = index % handles.len();
                allocator.free(handles.swap_remove(index));
                model.live.swap_remove(index);
            }
        }
        allocator.check_invariants().map_err(TestCaseError::fail)?;
        check_counters(&allocator, &model)?;
    }
    for handle in handles.drain(..) {
        allocator.free(handle);
    }
    prop_assert_eq!(allocator.free_blocks(), roots);
    assert_fully_coalesced(allocator);
    Ok(())
}

/// A new allocation of `size` bytes: rounded as its mode rounds, aligned, inside the capacity and
/// apart from every live allocation of the model. Returns its rounded size.
fn check_placed(
    allocator: &BuddyAllocator,
    model: &Model,
    allocation: &Allocation,
    size: u64,
) -> Result<u64, TestCaseError> {
    let (min_block, rounding) = (allocator.min_block(), allocator.rounding());
    let rounded = match rounding {
        Rounding::Exact => size.div_ceil(min_block) * min_block,
        Rounding::PowerOfTwo => size.div_ceil(min_block).next_power_of_two() * min_block,
    };
    prop_assert_eq!(allocation.allocated_size(min_block), rounded);
    prop_assert_eq!(allocation.offset() % min_block, 0);
    if rounding == Rounding::PowerOfTwo {
        // Aligned to its power-of-two block.
        prop_assert_eq!(allocation.offset() % rounded, 0);
    }
    prop_assert!(allocation.offset() + rounded <= allocator.capacity());
    for &(offset, allocated, _) in &model.live {
        prop_assert!(
            allocation.offset() + rounded <= offset || offset + allocated <= allocation.offset(),
            "overlap: new [{}, {}) with [{}, {})",
            allocation.offset(),
            allocation.offset() + rounded,
            offset,
            offset + allocated
        );
    }
    Ok(rounded)
}

/// A refused request of `size` bytes: no aligned block was free, so the request must not fit in
/// any free run of the model either when it is a power of two (nothing to straddle); under exact
/// fit, no free run is long enough for the bins that are searched whole, and when the request's
/// own bin lists few runs, none is long enough at all.
fn check_refused(
    allocator: &BuddyAllocator,
    model: &Model,
    size: u64,
    needed_block_bytes: u64,
) -> Result<(), TestCaseError> {
    let (min_block, rounding) = (allocator.min_block(), allocator.rounding());
    if rounding == Rounding::PowerOfTwo || size.div_ceil(min_block).is_power_of_two() {
        prop_assert!(
            longest_free_run(model, allocator.capacity(), needed_block_bytes) < needed_block_bytes
        );
    }
    if rounding == Rounding::Exact {
        let units = size.div_ceil(min_block);
        let gaps = free_gaps(model, allocator.capacity());
        let longest = gaps.iter().max().copied().unwrap_or(0) / min_block;
        prop_assert!(longest < bin_floor(length_bin(units - 1) + 1));
        if gaps.len() <= STRADDLE_CANDIDATES {
            prop_assert!(longest < units, "{longest} units free in a run");
        }
    }
    Ok(())
}

/// The counters and the free blocks against the model's live allocations: the bytes add up, the
/// per-order counts match the blocks, and no free block overlaps a live allocation.
fn check_counters(allocator: &BuddyAllocator, model: &Model) -> Result<(), TestCaseError> {
    let min_block = allocator.min_block();
    let stats = allocator.stats();
    let allocated: u64 = model.live.iter().map(|l| l.1).sum();
    let requested: u64 = model.live.iter().map(|l| l.2).sum();
    prop_assert_eq!(stats.allocated_bytes, allocated);
    prop_assert_eq!(stats.requested_bytes, requested);
    prop_assert_eq!(
        stats.allocated_bytes + stats.free_bytes,
        stats.capacity_bytes
    );
    prop_assert_eq!(stats.allocation_count, model.live.len() as u64);
    let free_blocks = allocator.free_blocks();
    prop_assert_eq!(
        free_blocks.iter().map(|b| b.1).sum::<u64>(),
        stats.free_bytes
    );
    prop_assert_eq!(
        free_blocks.iter().map(|b| b.1).max().unwrap_or(0),
        stats.largest_free_bytes
    );
    for (order, &count) in stats.free_blocks_per_order.iter().enumerate() {
        let expected = free_blocks
            .iter()
            .filter(|b| b.1 == min_block << order)
            .count() as u64;
        prop_assert_eq!(count, expected);
    }
    // Free blocks never overlap live allocations.
    for &(free_offset, free_size) in &free_blocks {
        for &(offset, allocated, _) in &model.live {
            prop_assert!(free_offset + free_size <= offset || offset + allocated <= free_offset);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn exact_matches_the_model(ops in ops(), odd in any::<bool>()) {
        // 128 KiB, or 75 KiB: roots of 64, 8, 2 and 1 KiB.
        run_against_model(Rounding::Exact, if odd { 300 } else { 512 }, ops)?;
    }

    #[test]
    fn power_of_two_matches_the_model(ops in ops(), odd in any::<bool>()) {
        run_against_model(Rounding::PowerOfTwo, if odd { 300 } else { 512 }, ops)?;
    }
}

/// Fills an exact allocator of `units` units of 1 KiB with 1-unit allocations (each at least the
/// mean, so at the start of the free run: in address order), then frees the units in `free`, in
/// that order. Returns the allocations still held.
fn fenced(units: u64, free: impl IntoIterator<Item = u64>) -> (BuddyAllocator, Vec<Allocation>) {
    let mut allocator = BuddyAllocator::with_capacity(KIB, units * KIB, Rounding::Exact).unwrap();
    let mut held: Vec<Option<Allocation>> = (0..units)
        .map(|_| Some(allocator.allocate(KIB).unwrap()))
        .collect();
    assert!(held
        .iter()
        .enumerate()
        .all(|(unit, a)| a.as_ref().unwrap().offset() == unit as u64 * KIB));
    for unit in free {
        allocator.free(held[unit as usize].take().unwrap());
    }
    (allocator, held.into_iter().flatten().collect())
}

#[test]
fn the_shortest_sufficient_run_is_used() {
    // Free runs [1, 7) (6 units, listed first) and [9, 12) (3 units).
    let (mut allocator, held) = fenced(16, (1..7).chain(9..12));
    // 3 units: every run of 3 units or more would do; the 3-unit run is the tightest.
    assert_eq!(allocator.fit_order(3 * KIB), Some(1));
    let three = allocator.allocate(3 * KIB).unwrap();
    assert_eq!(three.offset(), 9 * KIB);
    // 2 units, above the mean live size: the start of the only run left.
    let two = allocator.allocate(2 * KIB).unwrap();
    assert_eq!(two.offset(), KIB);
    // 1 unit, below the mean (12 units in 9 allocations): the end of [3, 7).
    let one = allocator.allocate(KIB).unwrap();
    assert_eq!(one.offset(), 6 * KIB);
    allocator.check_invariants().unwrap();
    for allocation in held.into_iter().chain([three, two, one]) {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}

#[test]
fn a_run_of_the_requests_own_length_bin_is_searched() {
    // Lengths of 32 units and more share bins 2 units wide. Free runs [1, 33) (32 units, listed
    // first) and [40, 73) (33 units), both in the bin of 32 and 33: no bin of runs that are all
    // long enough for 33 units lists a run, but the second run of its own bin fits.
    assert_eq!(length_bin(32), length_bin(33));
    assert_ne!(length_bin(33), length_bin(34));
    let (mut allocator, held) = fenced(128, (1..33).chain(40..73));
    assert_eq!(allocator.fit_order(33 * KIB), None);
    let fits = allocator.allocate(33 * KIB).unwrap();
    assert_eq!(fits.offset(), 40 * KIB);
    assert_eq!(allocator.free_blocks(), {
        let mut run = Vec::new();
        for_each_piece(1, 33, 7, |start, order| {
            run.push((start * KIB, KIB << order))
        });
        run
    });
    // 33 units no longer fit anywhere.
    assert!(matches!(
        allocator.allocate(33 * KIB),
        Err(AllocError::OutOfSpace { .. })
    ));
    for allocation in held.into_iter().chain([fits]) {
        allocator.free(allocation);
    }
    allocator.check_invariants().unwrap();
    assert_eq!(allocator.stats().free_bytes, 128 * KIB);
}

#[test]
fn length_bins_grow_with_the_length() {
    let mut previous = 0;
    for units in 1..1u64 << 12 {
        let bin = length_bin(units);
        assert!(bin == previous || bin == previous + 1, "{units}: {bin}");
        assert!(bin_floor(bin) <= units && units < bin_floor(bin + 1));
        previous = bin;
    }
    for exponent in 12..34 {
        let units = 1u64 << exponent;
        assert_eq!(bin_floor(length_bin(units)), units);
        assert_eq!(length_bin(units - 1) + 1, length_bin(units));
        assert!((length_bin(units) as usize) < BINS);
    }
}

#[test]
fn bookkeeping_follows_the_regions_not_the_capacity() {
    // The largest capacity starts with one region; 1000 live allocations take about 2000.
    let mut allocator = BuddyAllocator::new(256, MAX_ORDER_LIMIT, Rounding::Exact).unwrap();
    assert!(
        allocator.bookkeeping_bytes() <= 64,
        "{}",
        allocator.bookkeeping_bytes()
    );
    let held: Vec<Allocation> = (1..=1000u64)
        .map(|i| allocator.allocate(i * 777).unwrap())
        .collect();
    allocator.check_invariants().unwrap();
    let bytes = allocator.bookkeeping_bytes();
    assert!(bytes <= 4 * 2 * 1000 * 32, "{bytes}");
    for allocation in held {
        allocator.free(allocation);
    }
    // Freed regions are reused, not added.
    let again: Vec<Allocation> = (1..=1000u64)
        .map(|i| allocator.allocate(i * 777).unwrap())
        .collect();
    assert_eq!(allocator.bookkeeping_bytes(), bytes);
    for allocation in again {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}
