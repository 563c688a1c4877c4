//! The `plan` example's logic on a small synthetic CSV (no GPU): reading, planning, checking,
//! the JSON it writes and the capacity failure.

#[path = "../examples/plan.rs"]
#[expect(
    dead_code,
    reason = "the example's main is its entry point, not this test's"
)]
mod plan_example;

use std::path::PathBuf;

fn data(name: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "data", "plan", name]
        .iter()
        .collect();
    path.to_string_lossy().into_owned()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn plans_the_tiling_to_its_lower_bound_and_writes_json() {
    let json = std::env::temp_dir().join(format!("plan-example-{}.json", std::process::id()));
    let outcome = plan_example::run(&args(&[
        &data("tiling.csv"),
        "--json",
        json.to_str().expect("a UTF-8 temp path"),
    ]))
    .expect("the example runs");
    assert_eq!(outcome.buffers.len(), 57);
    assert_eq!(outcome.plan.max_live_bytes, 4096);
    // The tiling is perfect: the planner finds it, greedy-by-size does not.
    assert_eq!(outcome.plan.heap_bytes, 4096);
    assert_eq!(outcome.greedy.heap_bytes, 4736);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON is written"))
            .expect("valid JSON");
    std::fs::remove_file(&json).ok();
    assert_eq!(written["buffers"], 57);
    assert_eq!(written["max_live_bytes"], 4096);
    assert_eq!(written["heap_bytes"], 4096);
    assert_eq!(written["greedy_by_size_heap_bytes"], 4736);
    assert!(written["seconds"].as_f64().is_some());
    let offsets = written["offsets"].as_array().expect("offsets");
    assert_eq!(offsets.len(), 57);
    for (entry, placement) in offsets.iter().zip(&outcome.plan.placements) {
        assert_eq!(entry["id"], placement.id);
        assert_eq!(entry["offset"], placement.offset);
    }
}

#[test]
fn alignment_and_capacity() {
    let outcome = plan_example::run(&args(&[&data("tiling.csv"), "--alignment", "256"]))
        .expect("the example runs");
    assert!(outcome.plan.placements.iter().all(|p| p.offset % 256 == 0));
    assert!(outcome.plan.heap_bytes <= outcome.greedy.heap_bytes);
    let error = plan_example::run(&args(&[&data("tiling.csv"), "--capacity", "4000"]))
        .expect_err("4096 bytes do not fit in 4000");
    let message = format!("{error:#}");
    assert!(
        message.contains("4096 bytes, above the capacity of 4000 bytes"),
        "{message}"
    );
    plan_example::run(&args(&[&data("tiling.csv"), "--capacity", "4096"])).expect("fits exactly");
}

#[test]
fn several_arenas_under_a_limit() {
    let outcome = plan_example::run(&args(&[&data("tiling.csv"), "--max-arena", "2048"]))
        .expect("the example runs");
    assert!(outcome.plan.arena_bytes.len() >= 2);
    assert!(outcome.plan.arena_bytes.iter().all(|&bytes| bytes <= 2048));
}

#[test]
fn reads_minimalloc_headers_and_refuses_bad_lines() {
    let minimalloc = "buffer,start,end,size\n0,0,10,5\n1,5,15,7\n";
    let buffers = plan_example::parse_csv(minimalloc).expect("MiniMalloc's benchmark header");
    assert_eq!(buffers.len(), 2);
    assert_eq!(
        (buffers[1].lower, buffers[1].upper, buffers[1].size),
        (5, 15, 7)
    );
    let reordered = plan_example::parse_csv("size,id,upper,lower\n5,0,10,0\n").expect("by name");
    assert_eq!((reordered[0].size, reordered[0].upper), (5, 10));
    let headerless = plan_example::parse_csv("3,1,2,4\n").expect("no header");
    assert_eq!(headerless[0].id, 3);
    assert!(plan_example::parse_csv("id,lower,upper,size\n0,1,2\n").is_err());
    assert!(plan_example::parse_csv("id,lower,upper,size\n0,1,2,-4\n").is_err());
    assert!(plan_example::parse_csv("id,lower,upper,size,gaps\n0,1,2,4,\n").is_err());
    // An inverted lifetime is the planner's typed error, reported with the buffer.
    let bad = std::env::temp_dir().join(format!("plan-example-bad-{}.csv", std::process::id()));
    std::fs::write(&bad, "id,lower,upper,size\n9,5,2,4\n").expect("write a temp file");
    let error = plan_example::run(&args(&[bad.to_str().expect("UTF-8")])).expect_err("inverted");
    std::fs::remove_file(&bad).ok();
    assert!(format!("{error:#}").contains("buffer 9 has an inverted lifetime"));
    assert!(plan_example::run(&args(&["--bogus"])).is_err());
    assert!(plan_example::run(&args(&[])).is_err());
}
