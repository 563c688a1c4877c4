//! The classic fragmentation trap, and what the buddy pool does about it.
//!
//! ```text
//! cargo run --release --example fragmentation [-- --out DIR]
//! ```
//!
//! With `--out DIR`, the pool writes `DIR/oom_snapshot.pickle` at its first out-of-memory refusal
//! (part 3): the pool at that moment, with its history, for pytorch.org/memory_viz
//! ([`PoolOptions::oom_snapshot`]).
//!
//! A program allocates 100, 50, 200, 30, 150 and 20 MiB, then frees the 50, the 30 and the 20:
//!
//! ```text
//! | used 100 | free 50 | used 200 | free 30 | used 150 | free 20 |
//! ```
//!
//! 100 MiB are free, yet an 80 MiB request fails in an arena that can only cut its one big
//! buffer: no single hole is large enough. We show that first, then run the same program on the
//! GPU pool with a budget of the same 550 MiB, and ask for more than the budget allows, to read
//! the pool's explanation.
//!
//! Finally, the same trap with tensors of a compute context: sixteen 32 MiB tensors fill four
//! segments of 128 MiB under a 512 MiB budget, every other one is dropped, and the 80 MiB request
//! fails with 256 MiB free (the error says that compacting would make it fit). The context moves
//! two tensors with GPU copies (`Context::compact_for`), the request succeeds in the emptied
//! segment, and `Context::compact` then empties a further segment and gives it back; every tensor
//! still holds its values.

use anyhow::{bail, ensure, Result};
use wgpu_pool::compute::{ComputeError, Context, ContextOptions, Tensor};
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::policy::PolicyConfig;
use wgpu_pool::report::segment_map;
use wgpu_pool::{
    request_gpu, AllocOptions, Allocation, Gpu, LimitsChoice, Pool, PoolError, PoolOptions,
};

/// The program: sizes allocated in order, in units; then which of them are freed; then the request.
const SIZES: [u64; 6] = [100, 50, 200, 30, 150, 20];
const FREED: [usize; 3] = [1, 3, 5];
const REQUEST: u64 = 80;

fn main() -> Result<()> {
    env_logger::init();
    // Getting a device is kept apart from using it, so that the tests run the same code.
    let out = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, dir] if flag == "--out" => Some(std::path::PathBuf::from(dir)),
        other => bail!("usage: fragmentation [--out DIR], not {other:?}"),
    };
    let gpu = request_gpu(LimitsChoice::Adapter)?;
    println!("adapter: {gpu}\n");
    let outcome = run(&gpu, 1 << 20, true, out.as_deref())?;
    println!(
        "\nIn short: the arena failed with {} MiB free (largest hole {} MiB); the pool served the request: {}; \
         past its budget it explained why it could not: {}. With tensors: refused before compacting: {}, \
         served after moving {} tensors: {}; compact() gave back {} segment(s); values intact: {}.",
        outcome.arena_free_units,
        outcome.arena_largest_hole_units,
        outcome.pool_served,
        outcome.second_request_refused,
        outcome.tensors.refused_before,
        outcome.tensors.moves,
        outcome.tensors.served_after,
        outcome.tensors.segments_released,
        outcome.tensors.values_intact
    );
    Ok(())
}

/// What happened, for the tests.
#[derive(Debug)]
pub struct Outcome {
    /// Free units in the arena when the request failed.
    pub arena_free_units: u64,
    /// The arena's largest hole, in units.
    pub arena_largest_hole_units: u64,
    /// The pool (budget = the arena's size) served the request.
    pub pool_served: bool,
    /// A second request, beyond the budget, was refused with an out-of-memory explanation.
    pub second_request_refused: bool,
    /// The story told with tensors of a compute context, and compaction.
    pub tensors: TensorOutcome,
}

/// What happened to the tensors of part 4.
#[derive(Debug, Default)]
pub struct TensorOutcome {
    /// The request was refused with out of memory, and the error said compacting would help.
    pub refused_before: bool,
    /// Tensors `compact_for` moved.
    pub moves: usize,
    /// The request was served after `compact_for`, without a new segment.
    pub served_after: bool,
    /// Segments `compact` emptied and gave back.
    pub segments_released: usize,
    /// Reserved bytes before and after `compact`.
    pub reserved_bytes: (u64, u64),
    /// Every tensor read back its values after both compactions.
    pub values_intact: bool,
}

/// Runs the story with sizes in `unit_bytes` (1 MiB in the example, less in the tests); with
/// `out`, the pool of parts 2 and 3 writes `oom_snapshot.pickle` there at its first refusal.
pub fn run(
    gpu: &Gpu,
    unit_bytes: u64,
    verbose: bool,
    out: Option<&std::path::Path>,
) -> Result<Outcome> {
    let say = |text: String| {
        if verbose {
            println!("{text}");
        }
    };

    // 1. A naive arena: one buffer of 550 units, cut first-fit. It never moves anything, and its
    //    holes cannot merge unless they are next to each other.
    let capacity: u64 = SIZES.iter().sum();
    let mut arena = FirstFitArena::new(capacity);
    let offsets: Vec<u64> = SIZES
        .iter()
        .map(|&size| arena.allocate(size).expect("the program fits"))
        .collect();
    for &index in &FREED {
        arena.free(offsets[index]);
    }
    say(format!(
        "1. A first-fit arena of {capacity} units (1 unit = {unit_bytes} bytes) after the program:"
    ));
    say(format!("   {}", arena.map()));
    let arena_free_units = arena.free_units();
    let arena_largest_hole_units = arena.largest_hole();
    match arena.allocate(REQUEST) {
        Some(_) => bail!("the arena was expected to fail"),
        None => say(format!(
            "   a request of {REQUEST} units FAILS: {arena_free_units} units are free, but the largest hole is {arena_largest_hole_units}.\n"
        )),
    }

    // 2. The pool, allowed to reserve the same 550 units. It asks the device for segments and can
    //    give an empty one back: a freed segment is not a hole stuck between live data.
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
    }
    let pool = Pool::new(
        gpu,
        PoolOptions {
            policy: Some(policy(gpu, unit_bytes)),
            // The moment to look at: the pool at its first refusal, with how it got there.
            oom_snapshot: out.map(|dir| dir.join("oom_snapshot.pickle")),
            history: out.map(|_| HistoryOptions::default()),
            ..PoolOptions::default()
        },
    )?;
    pool.set_budget(Some(capacity * unit_bytes));
    let mut live = allocate_program(&pool, unit_bytes)?;
    for &index in &FREED {
        live[index] = None;
    }
    // Nothing recorded uses the freed ranges any more: let the pool reuse them.
    pool.mark_submitted();
    say(
        "2. The buddy pool with a budget of the same 550 units, after the same program:"
            .to_string(),
    );
    say(indent(&segment_map(&pool.memory_state(), 72)));
    let pool_served = match pool.allocate_with(REQUEST * unit_bytes, copy_only("request")) {
        Ok(request) => {
            say(format!("   a request of {REQUEST} units SUCCEEDS: the pool gave its empty segments back and took a new one."));
            say(indent(&segment_map(&pool.memory_state(), 72)));
            live.push(Some(request));
            true
        }
        Err(error) => {
            say(format!("   the request failed: {error}"));
            false
        }
    };

    // 3. A second request of 80 units cannot fit: 530 of the 550 units are in use and no segment
    //    is empty. The error says what was asked, what is reserved and free, and what to try.
    let second_request_refused = match pool
        .allocate_with(REQUEST * unit_bytes, copy_only("second request"))
    {
        Err(error @ PoolError::OutOfMemory(_)) => {
            say(format!("\n3. A second request of {REQUEST} units no longer fits the budget, and the pool says why:\n   {error}"));
            if let Some(dir) = out {
                say(format!(
                    "   The pool at this refusal, with its history: {} (open it at pytorch.org/memory_viz)",
                    dir.join("oom_snapshot.pickle").display()
                ));
            }
            true
        }
        Err(other) => bail!("expected an out-of-memory error, got {other}"),
        Ok(_) => false,
    };
    drop(live);
    drop(pool);

    let tensors = tensors_story(gpu, unit_bytes, &say)?;
    Ok(Outcome {
        arena_free_units,
        arena_largest_hole_units,
        pool_served,
        second_request_refused,
        tensors,
    })
}

/// Tensors in part 4: sixteen of this many units.
const TENSOR_UNITS: u64 = 32;
/// Part 4's segments, in units (a power of two above the request).
const TENSOR_SEGMENT_UNITS: u64 = 128;

/// Part 4: the fragmentation trap with tensors of a compute context, and compaction.
fn tensors_story(gpu: &Gpu, unit_bytes: u64, say: &dyn Fn(String)) -> Result<TensorOutcome> {
    let mut outcome = TensorOutcome::default();
    let mut policy = policy(gpu, unit_bytes);
    policy.min_segment_bytes = TENSOR_SEGMENT_UNITS * unit_bytes;
    policy.max_segment_bytes = TENSOR_SEGMENT_UNITS * unit_bytes;
    policy.large_above_bytes = TENSOR_SEGMENT_UNITS * unit_bytes;
    policy.growth_divisor = 0;
    policy.budget_bytes = Some(4 * TENSOR_SEGMENT_UNITS * unit_bytes);
    let pool = Pool::new(
        gpu,
        PoolOptions {
            policy: Some(policy),
            ..PoolOptions::default()
        },
    )?;
    let context = Context::new(&pool, ContextOptions::default())?;
    let floats = |units: u64| (units * unit_bytes / 4) as usize;
    let values = |tag: usize| vec![tag as f32; floats(TENSOR_UNITS)];
    let mut tensors: Vec<(usize, Tensor)> = (0..16)
        .map(|tag| {
            let tensor = context.tensor(&values(tag), &[floats(TENSOR_UNITS)])?;
            Ok((tag, tensor))
        })
        .collect::<Result<_, ComputeError>>()?;
    // Every other one dropped: 256 units free, in holes of 32.
    tensors.retain(|(tag, _)| tag % 2 == 0);
    let map = |title: &str| {
        say(format!("   {title}"));
        say(indent(&segment_map(&pool.memory_state(), 72)));
    };
    say(format!(
        "\n4. Sixteen tensors of {TENSOR_UNITS} units in segments of {TENSOR_SEGMENT_UNITS} units, under a budget of {} units, \
         every other one dropped:",
        4 * TENSOR_SEGMENT_UNITS
    ));
    map("before compaction:");
    let request = [floats(REQUEST)];
    match context.empty(&request) {
        Err(ComputeError::Pool(PoolError::OutOfMemory(oom))) => {
            say(format!("   a request of {REQUEST} units FAILS:\n   {oom}"));
            outcome.refused_before = oom.compaction.is_some();
        }
        Err(other) => bail!("expected an out-of-memory error, got {other}"),
        Ok(_) => bail!("the fragmented segments were expected to refuse the request"),
    }
    let moved = context.compact_for(REQUEST * unit_bytes)?;
    outcome.moves = moved.moves;
    say(format!(
        "   Context::compact_for({REQUEST} units) moved {} tensors ({} units) with GPU copies:",
        moved.moves,
        moved.moved_bytes / unit_bytes
    ));
    let segments_before = pool.stats().create_segment_calls;
    let request = context.empty(&request);
    outcome.served_after = request.is_ok() && pool.stats().create_segment_calls == segments_before;
    let request = request?;
    map(&format!(
        "and the request of {REQUEST} units SUCCEEDS in the segment it emptied:"
    ));
    let before = pool.stats().reserved_bytes.current;
    let compacted = context.compact()?;
    let after = pool.stats().reserved_bytes.current;
    outcome.segments_released = compacted.segments_released;
    outcome.reserved_bytes = (before, after);
    say(format!(
        "   Context::compact() moved {} more tensors and gave back {} segment(s): reserved {} -> {} units.",
        compacted.moves,
        compacted.segments_released,
        before / unit_bytes,
        after / unit_bytes
    ));
    map("after compact():");
    outcome.values_intact = true;
    for (tag, tensor) in &tensors {
        outcome.values_intact &= tensor.to_vec()? == values(*tag);
    }
    ensure!(outcome.values_intact, "a moved tensor lost its values");
    say("   Every tensor still reads back the values it was made with.".to_string());
    drop(request);
    Ok(outcome)
}

/// The default policy, scaled so that the story reads the same at any unit: segments of at most
/// 64 units, requests above 16 units in large segments of their own. The story is about the
/// buddy allocators' packed segments, so requests of every size up to 16 units are packed (no
/// mid-sized class).
fn policy(gpu: &Gpu, unit_bytes: u64) -> PolicyConfig {
    let limits = gpu.device.limits();
    let mut policy = PolicyConfig::for_limits(
        u64::from(limits.min_storage_buffer_offset_alignment),
        limits.max_buffer_size,
    );
    policy.max_segment_bytes = (64 * unit_bytes)
        .next_power_of_two()
        .min(policy.max_segment_bytes);
    policy.min_segment_bytes = policy.min_segment_bytes.min(policy.max_segment_bytes);
    policy.large_above_bytes = 16 * unit_bytes;
    policy.mid_above_bytes = 0;
    policy
}

/// The story is about memory, not kernels: allocations larger than a binding may be (128 MiB on
/// some devices) are asked for as copy-only.
fn copy_only(label: &str) -> AllocOptions<'_> {
    AllocOptions {
        label,
        bindable: false,
        zeroed: false,
    }
}

/// Allocates the program's six sizes, in order.
fn allocate_program(pool: &Pool, unit_bytes: u64) -> Result<Vec<Option<Allocation>>, PoolError> {
    let labels = ["a", "b", "c", "d", "e", "f"];
    SIZES
        .iter()
        .zip(labels)
        .map(|(&size, label)| {
            pool.allocate_with(size * unit_bytes, copy_only(label))
                .map(Some)
        })
        .collect()
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("   {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A naive arena of offsets: first fit, no coalescing beyond neighbours, never moves anything.
struct FirstFitArena {
    capacity: u64,
    /// Live blocks as (offset, size), sorted by offset.
    used: Vec<(u64, u64)>,
}

impl FirstFitArena {
    fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: Vec::new(),
        }
    }

    /// The holes between live blocks, as (offset, size).
    fn holes(&self) -> Vec<(u64, u64)> {
        let mut holes = Vec::new();
        let mut cursor = 0;
        for &(offset, size) in &self.used {
            if offset > cursor {
                holes.push((cursor, offset - cursor));
            }
            cursor = offset + size;
        }
        if cursor < self.capacity {
            holes.push((cursor, self.capacity - cursor));
        }
        holes
    }

    fn allocate(&mut self, size: u64) -> Option<u64> {
        let (offset, _) = self.holes().into_iter().find(|&(_, hole)| hole >= size)?;
        let at = self.used.partition_point(|&(o, _)| o < offset);
        self.used.insert(at, (offset, size));
        Some(offset)
    }

    fn free(&mut self, offset: u64) {
        self.used.retain(|&(o, _)| o != offset);
    }

    fn free_units(&self) -> u64 {
        self.holes().iter().map(|h| h.1).sum()
    }

    fn largest_hole(&self) -> u64 {
        self.holes().iter().map(|h| h.1).max().unwrap_or(0)
    }

    fn map(&self) -> String {
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut cursor = 0;
        for &(offset, size) in &self.used {
            if offset > cursor {
                runs.push((offset - cursor, false));
            }
            runs.push((size, true));
            cursor = offset + size;
        }
        if cursor < self.capacity {
            runs.push((self.capacity - cursor, false));
        }
        let mut map = String::from("|");
        for (size, used) in runs {
            map.push_str(&format!(" {} {size} |", if used { "used" } else { "free" }));
        }
        map
    }
}
