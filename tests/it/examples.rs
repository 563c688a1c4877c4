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
