//! Scenario tests with exact offsets, and property tests against a simple model.

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
fn lowest_address_of_the_smallest_order_is_used() {
    let mut allocator = exact(KIB, 4); // 16 KiB
    let a = allocator.allocate(KIB).unwrap(); // [0,1)
    let b = allocator.allocate(KIB).unwrap(); // [1,2)
    let c = allocator.allocate(2 * KIB).unwrap(); // [2,4)
    let d = allocator.allocate(4 * KIB).unwrap(); // [4,8)
    assert_eq!(
        [a.offset(), b.offset(), c.offset(), d.offset()],
        [0, KIB, 2 * KIB, 4 * KIB]
    );
    allocator.free(a);
    allocator.free(c);
    // Free now: [0,1) order 0, [2,4) order 1, [8,16) order 3. A 1 KiB request takes [0,1).
    assert_eq!(allocator.fit_order(KIB), Some(0));
    let e = allocator.allocate(KIB).unwrap();
    assert_eq!(e.offset(), 0);
    // A 3 KiB request needs order 2: only [8,16) has it; it takes [8,11) and frees [11,12), [12,16).
    let f = allocator.allocate(3 * KIB).unwrap();
    assert_eq!(f.offset(), 8 * KIB);
    assert_eq!(
        allocator.free_blocks(),
        vec![(2 * KIB, 2 * KIB), (11 * KIB, KIB), (12 * KIB, 4 * KIB)]
    );
    for allocation in [b, d, e, f] {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}

#[test]
fn a_request_straddles_two_blocks_that_are_not_buddies() {
    // 16 units of 1 KiB. Fill everything with 4-unit blocks, then free [4,8) and [8,12): they are
    // free blocks of order 2 but not buddies, so no 8-unit block is free. A 6-unit request still
    // fits across them at 4.
    let mut allocator = exact(KIB, 4);
    let mut blocks: Vec<_> = (0..4)
        .map(|_| allocator.allocate(4 * KIB).unwrap())
        .collect();
    let third = blocks.remove(2);
    let second = blocks.remove(1);
    allocator.free(second);
    allocator.free(third);
    assert_eq!(
        allocator.free_blocks(),
        vec![(4 * KIB, 4 * KIB), (8 * KIB, 4 * KIB)]
    );
    assert_eq!(allocator.fit_order(6 * KIB), None);
    let straddling = allocator.allocate(6 * KIB).unwrap();
    assert_eq!(straddling.offset(), 4 * KIB);
    assert_eq!(allocator.free_blocks(), vec![(10 * KIB, 2 * KIB)]);
    allocator.check_invariants().unwrap();
    // The run before a block works too: free [12,16) and [10,12) remains; a 5-unit request takes
    // [11,16)? No: the candidate is the 4-unit block at 12 and the unit before it, at 11.
    let last = blocks.pop().unwrap();
    allocator.free(last);
    let before = allocator.allocate(5 * KIB).unwrap();
    assert_eq!(before.offset(), 11 * KIB);
    assert_eq!(allocator.free_blocks(), vec![(10 * KIB, KIB)]);
    allocator.free(straddling);
    allocator.free(before);
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
    assert_eq!(a.offset(), 32 * KIB); // the smallest sufficient block
    let b = allocator.allocate(32 * KIB).unwrap();
    assert_eq!(b.offset(), 0);
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
                        let rounded = match rounding {
                            Rounding::Exact => size.div_ceil(min_block) * min_block,
                            Rounding::PowerOfTwo => {
                                size.div_ceil(min_block).next_power_of_two() * min_block
                            }
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
                                allocation.offset() + rounded <= offset
                                    || offset + allocated <= allocation.offset(),
                                "overlap: new [{}, {}) with [{}, {})",
                                allocation.offset(),
                                allocation.offset() + rounded,
                                offset,
                                offset + allocated
                            );
                        }
                        model.live.push((allocation.offset(), rounded, size));
                        handles.push(allocation);
                    }
                    Err(AllocError::OutOfSpace {
                        largest_free_bytes,
                        needed_block_bytes,
                        ..
                    }) => {
                        // No aligned block was free; the request must not fit in any free run of
                        // the model either when it is a power of two (nothing to straddle).
                        prop_assert!(largest_free_bytes < needed_block_bytes);
                        if rounding == Rounding::PowerOfTwo
                            || size.div_ceil(min_block).is_power_of_two()
                        {
                            prop_assert!(
                                longest_free_run(&model, allocator.capacity(), needed_block_bytes)
                                    < needed_block_bytes
                            );
                        }
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
                prop_assert!(
                    free_offset + free_size <= offset || offset + allocated <= free_offset
                );
            }
        }
    }
    for handle in handles.drain(..) {
        allocator.free(handle);
    }
    prop_assert_eq!(allocator.free_blocks(), roots);
    assert_fully_coalesced(allocator);
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

#[test]
fn the_tightest_run_is_used_first_listed_first() {
    // 32 units of 1 KiB, filled with runs of 2, 2, 4, 4, 4 and 16 units, in address order.
    let mut allocator = exact(KIB, 5);
    let held: Vec<Allocation> = [2, 2, 4, 4, 4, 16]
        .iter()
        .map(|&units| allocator.allocate(units * KIB).unwrap())
        .collect();
    let offsets: Vec<u64> = held.iter().map(|a| a.offset() / KIB).collect();
    assert_eq!(offsets, [0, 2, 4, 8, 12, 16]);
    let mut held: Vec<Option<Allocation>> = held.into_iter().map(Some).collect();
    // Free [2, 4), [4, 8) and [12, 16): the runs [2, 8) (blocks 2 at 2 and 4 at 4) and [12, 16)
    // (4 at 12), both of class 2 (their largest block has 4 units), listed in that order.
    for index in [1, 2, 4] {
        allocator.free(held[index].take().unwrap());
    }
    assert_eq!(
        allocator.free_blocks(),
        vec![(2 * KIB, 2 * KIB), (4 * KIB, 4 * KIB), (12 * KIB, 4 * KIB)]
    );
    assert_eq!(allocator.fit_order(2 * KIB), Some(1));
    // 2 units: the first run of class 2, at its smallest block of at least 2 units.
    let two = allocator.allocate(2 * KIB).unwrap();
    assert_eq!(two.offset(), 2 * KIB);
    // [4, 8) is listed again, after [12, 16): a 4-unit request takes the first listed, at 12, not
    // the lowest address (4).
    let four = allocator.allocate(4 * KIB).unwrap();
    assert_eq!(four.offset(), 12 * KIB);
    allocator.check_invariants().unwrap();
    for allocation in held.into_iter().flatten().chain([two, four]) {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
}

#[test]
fn a_straddling_request_may_use_a_run_of_a_quarter_of_its_order() {
    // 16 units. Hold [0, 1), [6, 7) and [8, 16): the free runs are [1, 6) (blocks 1 at 1, 2 at 2,
    // 2 at 4: largest of order 1) and [7, 8). A 5-unit request (order 3) finds no block of 4 units
    // or more, but the run [1, 6) of class 1 holds it.
    let mut allocator = exact(KIB, 4);
    let all = allocator.allocate(16 * KIB).unwrap();
    allocator.free(all);
    let first = allocator.allocate(KIB).unwrap();
    let mut rest: Vec<Allocation> = (1..16).map(|_| allocator.allocate(KIB).unwrap()).collect();
    assert_eq!(first.offset(), 0);
    // Free units 1..=5 and 7.
    let mut kept = Vec::new();
    for allocation in rest.drain(..) {
        let unit = allocation.offset() / KIB;
        if (1..=5).contains(&unit) || unit == 7 {
            allocator.free(allocation);
        } else {
            kept.push(allocation);
        }
    }
    assert_eq!(allocator.stats().largest_free_bytes, 2 * KIB);
    assert_eq!(allocator.fit_order(5 * KIB), None);
    let five = allocator.allocate(5 * KIB).unwrap();
    assert_eq!(five.offset(), KIB);
    assert_eq!(allocator.free_blocks(), vec![(7 * KIB, KIB)]);
    allocator.check_invariants().unwrap();
    allocator.free(five);
    allocator.free(first);
    for allocation in kept {
        allocator.free(allocation);
    }
    assert_fully_coalesced(allocator);
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
