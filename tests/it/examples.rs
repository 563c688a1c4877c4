//! The examples' logic at small sizes, on the backend the tests run on: each example keeps getting
//! a device apart from using it, so these tests call the very code the example runs.

use crate::gpu::gpu;

#[allow(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/fragmentation.rs"]
mod fragmentation;

#[test]
fn fragmentation_example_tells_its_story() {
    // Units of 64 KiB instead of 1 MiB: the same story in 35 MiB.
    let outcome = fragmentation::run(gpu(), 64 << 10, false).unwrap();
    assert_eq!(outcome.arena_free_units, 100);
    assert_eq!(outcome.arena_largest_hole_units, 50);
    assert!(outcome.pool_served, "{outcome:?}");
    assert!(outcome.second_request_refused, "{outcome:?}");
}

#[allow(
    dead_code,
    reason = "the example's main() and CLI types are not used here"
)]
#[path = "../../examples/pool_vs_naive.rs"]
mod pool_vs_naive;

#[test]
fn pool_vs_naive_example_serves_both_workloads() {
    let out = std::env::temp_dir().join(format!("wgpu-pool-pvn-{}", std::process::id()));
    let comparisons = pool_vs_naive::run(
        gpu(),
        pool_vs_naive::Scale::Test,
        &pool_vs_naive::Settings::default(),
        Some(&out),
        false,
    )
    .unwrap();
    assert_eq!(comparisons.len(), 2);
    for comparison in &comparisons {
        let name = comparison.workload.name;
        // After warm-up the pool creates no buffer; naive creates one per tensor.
        assert_eq!(
            comparison.pool.create_buffer_calls_after_warmup, 0,
            "{name}: {comparison:?}"
        );
        assert!(
            comparison.naive.create_buffer_calls_after_warmup > 0,
            "{name}"
        );
        assert!(
            comparison.pool.peak_reserved_bytes >= comparison.pool.peak_requested_bytes,
            "{name}"
        );
        // The pool counts a dropped tensor as requested until the submission that releases it.
        assert!(
            comparison.pool.peak_requested_bytes >= comparison.naive.peak_requested_bytes,
            "{name}"
        );
        assert!(
            comparison.speedup > 0.0 && comparison.pool.alloc_ns > 0.0,
            "{name}"
        );
    }
    // The memory report of the pool's mlp run.
    for file in [
        "report.txt",
        "snapshot.pickle",
        "snapshot.json",
        "segments.svg",
        "memory.svg",
        "trace.json",
    ] {
        let path = out.join(file);
        assert!(
            std::fs::metadata(&path)
                .map(|m| m.len() > 0)
                .unwrap_or(false),
            "{} missing",
            path.display()
        );
    }
    let snapshot = wgpu_pool::snapshot::Snapshot::from_path(out.join("snapshot.pickle")).unwrap();
    snapshot.check_invariants().unwrap();
    std::fs::remove_dir_all(&out).ok();
}
