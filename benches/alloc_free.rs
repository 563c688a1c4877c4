//! Time per allocate+free pair of four offset allocators over one 4 GiB segment, on the same
//! deterministic operation sequences.
//!
//! Allocators (benchmark function ids):
//!
//! - `wgpu_pool_exact`: [`BuddyAllocator`] with [`Rounding::Exact`];
//! - `wgpu_pool_pow2`: [`BuddyAllocator`] with [`Rounding::PowerOfTwo`];
//! - `offset_allocator`: `offset_allocator::Allocator<u32>` (TLSF-like, in 256-byte units);
//! - `buddy_system_allocator`: `buddy_system_allocator::FrameAllocator` (`BTreeSet` free lists, in
//!   256-byte frames).
//!
//! Every allocator manages 4 GiB = 2^24 units of 256 bytes. Sizes are mixed from 128 B to 64 MiB,
//! log-uniform: an exponent `e` is drawn uniformly in `8..=26` and the size uniformly in
//! `[2^e / 2, 2^e]` bytes. All sequences come from one seeded `StdRng`, generated before anything
//! is timed; every allocator sees exactly the same sizes and the same random choices.
//!
//! Sequences (benchmark parameters):
//!
//! - `lifo`: allocate [`BATCH`] blocks into an empty allocator, then free them in reverse order;
//! - `random`: allocate the same [`BATCH`] blocks, then free them in a random permutation;
//! - `churn`: pre-fill (untimed) until the live requested bytes reach 70% of the capacity, then
//!   [`CHURN_STEPS`] timed steps of "free a random live block, allocate a new random size"; when
//!   an allocation fails, one more random live block is freed and the allocation retried (the same
//!   rule, and the same random stream, for every allocator; failures are counted). Everything left
//!   is freed (untimed) at the end of each iteration.
//!
//! Untimed check: the churn failures of each allocator summed over [`CHECK_SEEDS`] more seeded
//! churn sequences (drawn like `churn`'s, without the batch) at 70% and at 80% occupancy. One
//! sequence's failure count is one sample of a chaotic process: the first failure changes which
//! blocks are live at every later step, so a change of placement anywhere moves it a lot (for the
//! exact-fit core, taking "at least the mean size" or "above the mean size" as large moved the
//! `churn` count from 42 to 151 while the sums over many seeds barely changed).
//!
//! Criterion reports per-pair rates (`Throughput::Elements` is the number of allocate+free pairs:
//! [`BATCH`] for `lifo` and `random`, [`CHURN_STEPS`] for `churn`). The allocators are built once,
//! outside timing, and every iteration
//! leaves them as it found them: after each benchmark the whole capacity must be allocatable again
//! at offset 0. Before anything is timed, each allocator is also checked once for overlapping or
//! out-of-range blocks on these sequences.
//!
//! After the criterion run (`cargo bench --bench alloc_free`) a markdown summary of the median
//! ns per pair over all timed batches is printed, with the churn failure counts and the check.
//!
//! Then the paired comparison of `wgpu_pool_exact` with `offset_allocator`: criterion measures one
//! allocator's sequences, then the next one's, tens of seconds apart, and a machine whose speed
//! drifts by more than the difference (the development machine's did: one binary's ratio ranged
//! 0.77-1.22 over criterion runs) decides the ratio. So the two are also timed chunk by chunk, in
//! turns (the first of a pair alternating), [`PAIRED_CHUNKS`] chunks each after
//! [`PAIRED_WARM_UP`] untimed ones: a chunk is [`PAIRED_BATCHES`] batches of `lifo` or `random`,
//! or one `churn` iteration (its pre-fill and drain untimed). The ratio per sequence is the
//! median over the chunks of exact's time over offset-allocator's in the same pair (with the
//! quartiles). `cargo bench --bench alloc_free -- paired` runs only this comparison (no
//! criterion benchmark matches `paired`); with `ALLOC_FREE_JSON=FILE` it also writes the ratios
//! as JSON: `{"chunks", "sequences": [{"sequence", "median", "q1", "q3", "exact_ns_per_pair",
//! "offset_ns_per_pair"}]}`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use wgpu_pool::buddy::{BuddyAllocator, Rounding};

/// Bytes per unit, for every allocator.
const MIN_BLOCK: u64 = 256;
/// The capacity is `MIN_BLOCK << MAX_ORDER` = 4 GiB.
const MAX_ORDER: u32 = 24;
const CAPACITY_UNITS: u64 = 1 << MAX_ORDER;
const CAPACITY_BYTES: u64 = MIN_BLOCK << MAX_ORDER;
/// `FrameAllocator<ORDER>` holds blocks up to `2^(ORDER - 1)` frames: 25 for one 2^24 block.
const FRAME_ORDER: usize = MAX_ORDER as usize + 1;
/// Smallest and largest size exponents: 2^8 = 256 B .. 2^26 = 64 MiB.
const MIN_EXPONENT: u32 = 8;
const MAX_EXPONENT: u32 = 26;
/// Blocks allocated (then freed) per `lifo` / `random` iteration. 1000 would not fit: the sizes
/// average ~5 MiB, so 512 of them take ~2.6 GiB requested, ~3.5 GiB once rounded to powers of two.
const BATCH: usize = 512;
/// Timed free+allocate steps per `churn` iteration.
const CHURN_STEPS: usize = 10_000;
/// Live requested bytes after the `churn` pre-fill, as a share of the capacity.
const CHURN_OCCUPANCY: f64 = 0.70;
/// Untimed check: churn failures summed over this many more seeded sequences, at each of
/// [`CHECK_OCCUPANCIES`]. One sequence's failure count swings widely with any change of
/// placement (the first failure changes every later step), so the sum is what compares placements.
const CHECK_SEEDS: u64 = 16;
const CHECK_OCCUPANCIES: [f64; 2] = [0.70, 0.80];
const SEED: u64 = 0x5eed_a110_c0de;
/// Paired comparison: timed chunks per allocator and sequence.
const PAIRED_CHUNKS: usize = 301;
/// Paired comparison: untimed chunks per allocator and sequence before them.
const PAIRED_WARM_UP: usize = 3;
/// Paired comparison: `lifo` or `random` batches per chunk.
const PAIRED_BATCHES: usize = 40;

const ALLOCATORS: [&str; 4] = [
    "wgpu_pool_exact",
    "wgpu_pool_pow2",
    "offset_allocator",
    "buddy_system_allocator",
];
const SEQUENCES: [&str; 3] = ["lifo", "random", "churn"];

/// The common interface the benchmarks drive; sizes are in bytes, converted to 256-byte units by
/// the allocators that count in units.
trait OffsetAllocator {
    type Handle;
    fn allocate(&mut self, size_bytes: u64) -> Option<Self::Handle>;
    fn free(&mut self, handle: Self::Handle);
    fn offset_bytes(handle: &Self::Handle) -> u64;
}

impl OffsetAllocator for BuddyAllocator {
    type Handle = wgpu_pool::buddy::Allocation;

    #[inline]
    fn allocate(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        BuddyAllocator::allocate(self, size_bytes).ok()
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        BuddyAllocator::free(self, handle);
    }

    #[inline]
    fn offset_bytes(handle: &Self::Handle) -> u64 {
        handle.offset()
    }
}

impl OffsetAllocator for offset_allocator::Allocator<u32> {
    type Handle = offset_allocator::Allocation<u32>;

    #[inline]
    fn allocate(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        offset_allocator::Allocator::allocate(self, size_bytes.div_ceil(MIN_BLOCK) as u32)
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        offset_allocator::Allocator::free(self, handle);
    }

    #[inline]
    fn offset_bytes(handle: &Self::Handle) -> u64 {
        u64::from(handle.offset) * MIN_BLOCK
    }
}

/// `(first frame, frame count)`: `FrameAllocator::dealloc` needs the count back.
type FrameHandle = (usize, usize);

impl OffsetAllocator for buddy_system_allocator::FrameAllocator<FRAME_ORDER> {
    type Handle = FrameHandle;

    #[inline]
    fn allocate(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        let count = size_bytes.div_ceil(MIN_BLOCK) as usize;
        self.alloc(count).map(|start| (start, count))
    }

    #[inline]
    fn free(&mut self, (start, count): Self::Handle) {
        self.dealloc(start, count);
    }

    #[inline]
    fn offset_bytes(handle: &Self::Handle) -> u64 {
        handle.0 as u64 * MIN_BLOCK
    }
}

fn new_wgpu_pool(rounding: Rounding) -> BuddyAllocator {
    let allocator = BuddyAllocator::new(MIN_BLOCK, MAX_ORDER, rounding)
        .expect("256 B << 24 is a valid buddy configuration");
    assert_eq!(allocator.capacity(), CAPACITY_BYTES);
    allocator
}

fn new_offset_allocator() -> offset_allocator::Allocator<u32> {
    offset_allocator::Allocator::new(u32::try_from(CAPACITY_UNITS).expect("2^24 units fit in u32"))
}

fn new_frame_allocator() -> buddy_system_allocator::FrameAllocator<FRAME_ORDER> {
    let mut allocator = buddy_system_allocator::FrameAllocator::<FRAME_ORDER>::new();
    allocator.add_frame(0, CAPACITY_UNITS as usize);
    // `add_frame` treats a range starting at frame 0 as aligned to only 32 frames, so it inserts
    // [0, 32), [32, 64), [64, 128), ..., [2^23, 2^24) as separate free blocks without merging
    // them. Freeing the first one merges the whole chain into one 2^24-frame block, the state
    // every other allocator starts in (and the one every benchmark iteration returns to).
    let first = allocator
        .alloc(32)
        .expect("an empty allocator has 32 frames");
    assert_eq!(first, 0);
    allocator.dealloc(first, 32);
    allocator
}

/// Panics unless the whole capacity can be allocated again as one block at offset 0: the
/// allocator is back to its pristine, fully coalesced state.
fn assert_pristine<A: OffsetAllocator>(name: &str, allocator: &mut A) {
    let whole = allocator
        .allocate(CAPACITY_BYTES)
        .unwrap_or_else(|| panic!("{name}: the whole capacity is not free as one block"));
    assert_eq!(
        A::offset_bytes(&whole),
        0,
        "{name}: whole-capacity block not at 0"
    );
    allocator.free(whole);
}

/// Every sequence, generated once before anything is timed.
struct Workload {
    /// Sizes of the `lifo` / `random` batch.
    batch_sizes: Vec<u64>,
    /// Indices into `batch_sizes`, in free order: reversed for `lifo`.
    lifo_order: Vec<usize>,
    /// Indices into `batch_sizes`, in free order: a random permutation for `random`.
    random_order: Vec<usize>,
    /// Sizes allocated (untimed) before the churn steps, summing to ~70% of the capacity.
    prefill_sizes: Vec<u64>,
    /// The size allocated by each churn step.
    churn_sizes: Vec<u64>,
    /// The random number choosing each churn step's victim (modulo the live count).
    churn_victims: Vec<u32>,
    /// The random numbers choosing the extra victims freed after failed allocations, consumed in
    /// order (and wrapped around) across the steps of one iteration.
    churn_retries: Vec<u32>,
}

fn random_size(rng: &mut StdRng) -> u64 {
    let exponent = rng.gen_range(MIN_EXPONENT..=MAX_EXPONENT);
    rng.gen_range((1u64 << exponent) / 2..=1u64 << exponent)
}

impl Workload {
    fn generate() -> Self {
        let mut rng = StdRng::seed_from_u64(SEED);
        let batch_sizes: Vec<u64> = (0..BATCH).map(|_| random_size(&mut rng)).collect();
        let lifo_order: Vec<usize> = (0..BATCH).rev().collect();
        let mut random_order: Vec<usize> = (0..BATCH).collect();
        random_order.shuffle(&mut rng);
        let workload = Self::churn_only(&mut rng, CHURN_OCCUPANCY);

        // Every allocator must hold the whole batch at once, even rounded to powers of two (without
        // frees a power-of-two buddy allocator fails only when less than the rounded size is free).
        let pow2_units: u64 = batch_sizes
            .iter()
            .map(|size| size.div_ceil(MIN_BLOCK).next_power_of_two())
            .sum();
        assert!(
            pow2_units <= CAPACITY_UNITS,
            "the batch needs {pow2_units} units rounded to powers of two, more than {CAPACITY_UNITS}"
        );

        Self {
            batch_sizes,
            lifo_order,
            random_order,
            ..workload
        }
    }

    /// The churn part only (no batch), drawn from `rng`, pre-filled to `occupancy`.
    fn churn_only(rng: &mut StdRng, occupancy: f64) -> Self {
        let target = (CAPACITY_BYTES as f64 * occupancy) as u64;
        let mut prefill_sizes = Vec::new();
        let mut prefill_bytes = 0u64;
        while prefill_bytes < target {
            let size = random_size(rng);
            prefill_bytes += size;
            prefill_sizes.push(size);
        }
        let churn_sizes = (0..CHURN_STEPS).map(|_| random_size(rng)).collect();
        let churn_victims = (0..CHURN_STEPS).map(|_| rng.gen()).collect();
        let churn_retries = (0..CHURN_STEPS).map(|_| rng.gen()).collect();
        Self {
            batch_sizes: Vec::new(),
            lifo_order: Vec::new(),
            random_order: Vec::new(),
            prefill_sizes,
            churn_sizes,
            churn_victims,
            churn_retries,
        }
    }
}

/// Allocates the batch, then frees it in `free_order`. Returns a checksum of the offsets.
#[inline(never)]
fn run_batch<A: OffsetAllocator>(
    allocator: &mut A,
    sizes: &[u64],
    free_order: &[usize],
    slots: &mut Vec<Option<A::Handle>>,
) -> u64 {
    slots.clear();
    let mut checksum = 0u64;
    for &size in sizes {
        let handle = allocator
            .allocate(size)
            .expect("the batch fits every allocator (checked before timing)");
        checksum = checksum.wrapping_add(A::offset_bytes(&handle));
        slots.push(Some(handle));
    }
    for &index in free_order {
        allocator.free(slots[index].take().expect("each block is freed once"));
    }
    checksum
}

/// Allocates the pre-fill sizes (untimed part of `churn`). Sizes that do not fit are skipped.
fn churn_prefill<A: OffsetAllocator>(
    allocator: &mut A,
    workload: &Workload,
    live: &mut Vec<(A::Handle, u64)>,
) {
    live.clear();
    for &size in &workload.prefill_sizes {
        if let Some(handle) = allocator.allocate(size) {
            live.push((handle, size));
        }
    }
}

/// The timed part of `churn`. Returns `(failed allocations, checksum of offsets)`.
#[inline(never)]
fn churn_steps<A: OffsetAllocator>(
    allocator: &mut A,
    workload: &Workload,
    live: &mut Vec<(A::Handle, u64)>,
) -> (u64, u64) {
    let mut failures = 0u64;
    let mut checksum = 0u64;
    let mut retry = 0usize;
    for step in 0..CHURN_STEPS {
        let victim = workload.churn_victims[step] as usize % live.len();
        let (handle, _) = live.swap_remove(victim);
        allocator.free(handle);
        let size = workload.churn_sizes[step];
        loop {
            if let Some(handle) = allocator.allocate(size) {
                checksum = checksum.wrapping_add(A::offset_bytes(&handle));
                live.push((handle, size));
                break;
            }
            failures += 1;
            assert!(
                !live.is_empty(),
                "a {size}-byte request failed with nothing allocated"
            );
            let r = workload.churn_retries[retry % workload.churn_retries.len()];
            retry += 1;
            let (handle, _) = live.swap_remove(r as usize % live.len());
            allocator.free(handle);
        }
    }
    (failures, checksum)
}

/// Frees everything still live (untimed end of each `churn` iteration).
fn churn_drain<A: OffsetAllocator>(allocator: &mut A, live: &mut Vec<(A::Handle, u64)>) {
    for (handle, _) in live.drain(..) {
        allocator.free(handle);
    }
}

/// Panics when two live blocks overlap or one leaves the capacity.
fn check_disjoint(name: &str, what: &str, mut ranges: Vec<(u64, u64)>) {
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "{name} ({what}): blocks {:?} and {:?} overlap",
            pair[0],
            pair[1]
        );
    }
    if let Some(last) = ranges.last() {
        assert!(
            last.0 + last.1 <= CAPACITY_BYTES,
            "{name} ({what}): {last:?} out of range"
        );
    }
}

/// One untimed pass over every sequence with correctness checks. Returns the churn failures.
fn validate<A: OffsetAllocator>(name: &str, allocator: &mut A, workload: &Workload) -> u64 {
    assert_pristine(name, allocator);

    let mut handles = Vec::new();
    for &size in &workload.batch_sizes {
        let handle = allocator
            .allocate(size)
            .unwrap_or_else(|| panic!("{name}: the batch does not fit"));
        handles.push((handle, size));
    }
    let ranges = handles
        .iter()
        .map(|(handle, size)| (A::offset_bytes(handle), *size))
        .collect();
    check_disjoint(name, "batch", ranges);
    let mut slots: Vec<Option<A::Handle>> = handles.into_iter().map(|(h, _)| Some(h)).collect();
    for &index in &workload.random_order {
        allocator.free(slots[index].take().expect("each block is freed once"));
    }
    assert_pristine(name, allocator);

    let mut live = Vec::new();
    churn_prefill(allocator, workload, &mut live);
    assert_eq!(
        live.len(),
        workload.prefill_sizes.len(),
        "{name}: the churn pre-fill does not fit"
    );
    let (failures, _) = churn_steps(allocator, workload, &mut live);
    let ranges = live
        .iter()
        .map(|(handle, size)| (A::offset_bytes(handle), *size))
        .collect();
    check_disjoint(name, "churn", ranges);
    let live_bytes: u64 = live.iter().map(|(_, size)| size).sum();
    CHURN_END.lock().unwrap().insert(
        name.to_string(),
        (live.len(), live_bytes as f64 / CAPACITY_BYTES as f64),
    );
    churn_drain(allocator, &mut live);
    assert_pristine(name, allocator);
    failures
}

/// Churn failures summed over [`CHECK_SEEDS`] more sequences (seeds `SEED + 1 ..`), per
/// occupancy of [`CHECK_OCCUPANCIES`]: the untimed check. The allocator is left pristine.
fn check_failures<A: OffsetAllocator>(name: &str, allocator: &mut A) -> Vec<u64> {
    let mut live = Vec::new();
    CHECK_OCCUPANCIES
        .iter()
        .map(|&occupancy| {
            (1..=CHECK_SEEDS)
                .map(|seed| {
                    let mut rng = StdRng::seed_from_u64(SEED + seed);
                    let workload = Workload::churn_only(&mut rng, occupancy);
                    churn_prefill(allocator, &workload, &mut live);
                    let (failures, _) = churn_steps(allocator, &workload, &mut live);
                    churn_drain(allocator, &mut live);
                    assert_pristine(name, allocator);
                    failures
                })
                .sum()
        })
        .collect()
}

/// [`check_failures`] by allocator.
static CHECK_FAILURES: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());

/// ns per pair of every timed batch, keyed by `(allocator, sequence)`.
static NS_PER_PAIR: Mutex<BTreeMap<(String, String), Vec<f64>>> = Mutex::new(BTreeMap::new());
/// Failed allocations per churn iteration, by allocator (the same in every iteration).
static CHURN_FAILURES: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
/// `(live blocks, live requested bytes / capacity)` after the churn steps, by allocator.
static CHURN_END: Mutex<BTreeMap<String, (usize, f64)>> = Mutex::new(BTreeMap::new());

fn record(name: &str, sequence: &str, elapsed: Duration, pairs: u64) {
    NS_PER_PAIR
        .lock()
        .unwrap()
        .entry((name.to_string(), sequence.to_string()))
        .or_default()
        .push(elapsed.as_nanos() as f64 / pairs as f64);
}

/// Registers the three sequences of one allocator.
fn bench_allocator<A: OffsetAllocator>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    allocator: &mut A,
    workload: &Workload,
) {
    let expected_failures = validate(name, allocator, workload);
    CHURN_FAILURES
        .lock()
        .unwrap()
        .insert(name.to_string(), expected_failures);
    let checked = check_failures(name, allocator);
    CHECK_FAILURES
        .lock()
        .unwrap()
        .insert(name.to_string(), checked);

    let mut slots: Vec<Option<A::Handle>> = Vec::with_capacity(BATCH);
    for (sequence, free_order) in [
        ("lifo", &workload.lifo_order),
        ("random", &workload.random_order),
    ] {
        group.throughput(Throughput::Elements(BATCH as u64));
        group.bench_function(BenchmarkId::new(name, sequence), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(run_batch(
                        allocator,
                        &workload.batch_sizes,
                        free_order,
                        &mut slots,
                    ));
                }
                let elapsed = start.elapsed();
                record(name, sequence, elapsed, iters * BATCH as u64);
                elapsed
            });
        });
        assert_pristine(name, allocator);
    }

    let mut live: Vec<(A::Handle, u64)> = Vec::with_capacity(workload.prefill_sizes.len() + 1);
    group.throughput(Throughput::Elements(CHURN_STEPS as u64));
    group.bench_function(BenchmarkId::new(name, "churn"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                churn_prefill(allocator, workload, &mut live);
                let start = Instant::now();
                let (failures, checksum) = churn_steps(allocator, workload, &mut live);
                timed += start.elapsed();
                black_box(checksum);
                assert_eq!(
                    failures, expected_failures,
                    "{name}: churn is not deterministic"
                );
                churn_drain(allocator, &mut live);
            }
            record(name, "churn", timed, iters * CHURN_STEPS as u64);
            timed
        });
    });
    assert_pristine(name, allocator);
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

fn print_summary() {
    let results = NS_PER_PAIR.lock().unwrap();
    if results.is_empty() {
        return;
    }
    let get = |name: &str, sequence: &str| {
        results
            .get(&(name.to_string(), sequence.to_string()))
            .map(|values| median(values))
    };
    let cell = |value: Option<f64>| value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));

    println!();
    println!("## alloc_free: ns per allocate+free pair (median over all timed batches)");
    println!();
    println!("| allocator | lifo | random | churn | churn failures | churn end: live blocks, live/capacity |");
    println!("|---|---:|---:|---:|---:|---:|");
    let failures = CHURN_FAILURES.lock().unwrap();
    let churn_end = CHURN_END.lock().unwrap();
    for name in ALLOCATORS {
        let row: Vec<String> = SEQUENCES.iter().map(|s| cell(get(name, s))).collect();
        let end = churn_end.get(name).map_or_else(
            || "-".to_string(),
            |(n, f)| format!("{n}, {:.1}%", f * 100.0),
        );
        println!(
            "| {name} | {} | {} | {} | {} | {end} |",
            row[0],
            row[1],
            row[2],
            failures.get(name).copied().unwrap_or_default()
        );
    }
    println!();
    println!("| ratio | lifo | random | churn |");
    println!("|---|---:|---:|---:|");
    for (label, numerator, denominator) in [
        (
            "offset_allocator / wgpu_pool_exact (target >= 1)",
            "offset_allocator",
            "wgpu_pool_exact",
        ),
        (
            "buddy_system_allocator / wgpu_pool_exact (target >= 3)",
            "buddy_system_allocator",
            "wgpu_pool_exact",
        ),
        (
            "wgpu_pool_pow2 / wgpu_pool_exact",
            "wgpu_pool_pow2",
            "wgpu_pool_exact",
        ),
    ] {
        let row: Vec<String> = SEQUENCES
            .iter()
            .map(|s| match (get(numerator, s), get(denominator, s)) {
                (Some(n), Some(d)) => format!("{:.2}", n / d),
                _ => "-".to_string(),
            })
            .collect();
        println!("| {label} | {} | {} | {} |", row[0], row[1], row[2]);
    }
    println!();
    let checked = CHECK_FAILURES.lock().unwrap();
    let header: Vec<String> = CHECK_OCCUPANCIES
        .iter()
        .map(|o| {
            format!(
                "churn failures, {CHECK_SEEDS} more seeds, {:.0}%",
                o * 100.0
            )
        })
        .collect();
    println!("| allocator | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(CHECK_OCCUPANCIES.len()));
    for name in ALLOCATORS {
        let row: Vec<String> = checked.get(name).map_or_else(
            || vec!["-".to_string(); CHECK_OCCUPANCIES.len()],
            |sums| sums.iter().map(u64::to_string).collect(),
        );
        println!("| {name} | {} |", row.join(" | "));
    }
    println!();
    println!(
        "capacity {} GiB in {MIN_BLOCK}-byte units; lifo/random: {BATCH} blocks per iteration; \
         churn: {CHURN_STEPS} steps at {:.0}% requested occupancy; seed {SEED:#x}",
        CAPACITY_BYTES >> 30,
        CHURN_OCCUPANCY * 100.0
    );
}

fn alloc_free(c: &mut Criterion) {
    let workload = Workload::generate();
    let mut exact = new_wgpu_pool(Rounding::Exact);
    let mut pow2 = new_wgpu_pool(Rounding::PowerOfTwo);
    let mut offset = new_offset_allocator();
    let mut frames = new_frame_allocator();

    let mut group = c.benchmark_group("alloc_free");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    bench_allocator(&mut group, ALLOCATORS[0], &mut exact, &workload);
    bench_allocator(&mut group, ALLOCATORS[1], &mut pow2, &workload);
    bench_allocator(&mut group, ALLOCATORS[2], &mut offset, &workload);
    bench_allocator(&mut group, ALLOCATORS[3], &mut frames, &workload);
    group.finish();
}

/// One timed chunk of `sequence` (see the module docs); returns the pairs it ran and the time.
fn paired_chunk<A: OffsetAllocator>(
    allocator: &mut A,
    workload: &Workload,
    sequence: &str,
    slots: &mut Vec<Option<A::Handle>>,
    live: &mut Vec<(A::Handle, u64)>,
) -> (u64, Duration) {
    match sequence {
        "churn" => {
            churn_prefill(allocator, workload, live);
            let started = Instant::now();
            black_box(churn_steps(allocator, workload, live));
            let elapsed = started.elapsed();
            churn_drain(allocator, live);
            (CHURN_STEPS as u64, elapsed)
        }
        _ => {
            let order = if sequence == "lifo" {
                &workload.lifo_order
            } else {
                &workload.random_order
            };
            let started = Instant::now();
            for _ in 0..PAIRED_BATCHES {
                black_box(run_batch(allocator, &workload.batch_sizes, order, slots));
            }
            ((BATCH * PAIRED_BATCHES) as u64, started.elapsed())
        }
    }
}

/// The median and quartiles of `values` (not empty).
fn quartiles(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

/// The paired comparison of `wgpu_pool_exact` with `offset_allocator` (module docs): prints a
/// markdown table, and writes JSON where `ALLOC_FREE_JSON` names a file.
fn paired_comparison() {
    let workload = Workload::generate();
    let mut exact = new_wgpu_pool(Rounding::Exact);
    let mut offset = new_offset_allocator();
    validate(ALLOCATORS[0], &mut exact, &workload);
    validate(ALLOCATORS[2], &mut offset, &workload);
    let (mut exact_slots, mut exact_live) = (Vec::new(), Vec::new());
    let (mut offset_slots, mut offset_live) = (Vec::new(), Vec::new());
    println!();
    println!(
        "Paired: wgpu_pool_exact / offset_allocator, {PAIRED_CHUNKS} chunks each in turns \
         (lifo/random: {PAIRED_BATCHES} batches per chunk; churn: one iteration)"
    );
    println!();
    println!("| sequence | median ratio | quartiles | exact ns/pair | offset ns/pair |");
    println!("|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for sequence in SEQUENCES {
        let mut ratios = Vec::with_capacity(PAIRED_CHUNKS);
        let (mut exact_ns, mut offset_ns) = (Vec::new(), Vec::new());
        for chunk in 0..PAIRED_WARM_UP + PAIRED_CHUNKS {
            let mut run_exact = || {
                paired_chunk(
                    &mut exact,
                    &workload,
                    sequence,
                    &mut exact_slots,
                    &mut exact_live,
                )
            };
            let mut run_offset = || {
                paired_chunk(
                    &mut offset,
                    &workload,
                    sequence,
                    &mut offset_slots,
                    &mut offset_live,
                )
            };
            // The first of a pair alternates, so that neither always runs on a warmer cache.
            let (e, o) = if chunk % 2 == 0 {
                let e = run_exact();
                (e, run_offset())
            } else {
                let o = run_offset();
                (run_exact(), o)
            };
            if chunk >= PAIRED_WARM_UP {
                let per_pair =
                    |(pairs, time): (u64, Duration)| time.as_nanos() as f64 / pairs as f64;
                ratios.push(per_pair(e) / per_pair(o));
                exact_ns.push(per_pair(e));
                offset_ns.push(per_pair(o));
            }
        }
        assert_pristine(ALLOCATORS[0], &mut exact);
        assert_pristine(ALLOCATORS[2], &mut offset);
        let (q1, median, q3) = quartiles(&mut ratios);
        let exact_median = quartiles(&mut exact_ns).1;
        let offset_median = quartiles(&mut offset_ns).1;
        println!(
            "| {sequence} | {median:.3} | {q1:.3}-{q3:.3} | {exact_median:.1} | {offset_median:.1} |"
        );
        rows.push(serde_json::json!({
            "sequence": sequence,
            "median": median,
            "q1": q1,
            "q3": q3,
            "exact_ns_per_pair": exact_median,
            "offset_ns_per_pair": offset_median,
        }));
    }
    if let Some(path) = std::env::var_os("ALLOC_FREE_JSON") {
        let json = serde_json::json!({ "chunks": PAIRED_CHUNKS, "sequences": rows });
        let text = serde_json::to_string_pretty(&json).expect("plain JSON values");
        if let Err(error) = std::fs::write(&path, text) {
            eprintln!("could not write {}: {error}", path.to_string_lossy());
        }
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    alloc_free(&mut criterion);
    criterion.final_summary();
    // Only a real measurement (`cargo bench`) gets the summary and the paired comparison;
    // `cargo test --benches` runs each benchmark once, unoptimised.
    if std::env::args().any(|arg| arg == "--bench") {
        print_summary();
        paired_comparison();
    }
}
