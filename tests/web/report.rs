//! The reporter in a browser: the memory summary, the snapshot's bytes (pickle and JSON) parsed
//! back with PyTorch's invariants checked against the pool's figures, the history's exports
//! (Perfetto's trace, the SVG plots) as bytes a page offers for download.

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::history::HistoryOptions;
use wgpu_pool::report::{export_files, Report};
use wgpu_pool::snapshot::{BlockState, Snapshot};
use wgpu_pool::{AllocOptions, Allocation, Pool, PoolOptions};

use crate::support::gpu;

const MIB: u64 = 1 << 20;

/// A pool with history and a few labelled allocations live (and two freed).
async fn busy_pool() -> (Pool, Vec<Allocation>) {
    let pool = Pool::new(
        &gpu().await,
        PoolOptions {
            history: Some(HistoryOptions::default()),
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let mut live = Vec::new();
    {
        let _op = pool.op_scope("matmul");
        for (i, size) in [3 * MIB, 4096, 300, 17 * MIB, 65536]
            .into_iter()
            .enumerate()
        {
            live.push(
                pool.allocate_with(size, AllocOptions::labeled(&format!("t{i}")))
                    .unwrap(),
            );
        }
    }
    drop(live.remove(1));
    drop(live.remove(2));
    pool.submit([]);
    (pool, live)
}

#[wasm_bindgen_test]
async fn the_memory_summary_adds_up_the_pool() {
    let (pool, live) = busy_pool().await;
    let report = Report::from_pool(&pool);
    let text = report.to_string();
    assert!(text.contains("Allocated memory"), "{text}");
    assert!(text.contains("Reserved memory"), "{text}");
    let stats = pool.stats();
    assert_eq!(stats.allocations.current, live.len() as u64);
    let json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    assert!(json.is_object(), "{json}");
}

#[wasm_bindgen_test]
async fn the_snapshot_bytes_parse_back_with_pytorchs_invariants() {
    let (pool, live) = busy_pool().await;
    let files = export_files(&pool).unwrap();
    let bytes = |name: &str| {
        files
            .iter()
            .find(|file| file.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .bytes
            .clone()
    };
    for snapshot in [
        Snapshot::from_pickle_bytes(&bytes("snapshot.pickle")).unwrap(),
        Snapshot::from_json_bytes(&bytes("snapshot.json")).unwrap(),
    ] {
        snapshot.check_invariants().unwrap();
        let stats = pool.stats();
        let total: u64 = snapshot.segments.iter().map(|s| s.total_size).sum();
        assert_eq!(total, stats.reserved_bytes.current);
        let active: Vec<u64> = snapshot
            .segments
            .iter()
            .flat_map(|segment| &segment.blocks)
            .filter(|block| block.state == BlockState::ActiveAllocated)
            .map(|block| block.requested_size)
            .collect();
        let mut expected: Vec<u64> = live.iter().map(Allocation::size).collect();
        let mut got = active.clone();
        expected.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, expected, "the live allocations' requested sizes");
        assert!(!snapshot.device_traces.is_empty() && !snapshot.device_traces[0].is_empty());
    }
}

#[wasm_bindgen_test]
async fn the_exports_are_bytes_for_a_download() {
    let (pool, _live) = busy_pool().await;
    let files = export_files(&pool).unwrap();
    let names: Vec<&str> = files.iter().map(|file| file.name).collect();
    assert_eq!(
        names,
        [
            "report.txt",
            "report.json",
            "snapshot.pickle",
            "snapshot.json",
            "segments.svg",
            "history.json",
            "trace.json",
            "memory.svg"
        ]
    );
    for file in &files {
        assert!(!file.bytes.is_empty(), "{} is empty", file.name);
        if file.name.ends_with(".svg") {
            assert!(
                String::from_utf8_lossy(&file.bytes).contains("<svg"),
                "{}",
                file.name
            );
        }
        if file.name.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&file.bytes)
                .unwrap_or_else(|error| panic!("{}: {error}", file.name));
        }
    }
    let trace: serde_json::Value =
        serde_json::from_slice(&files.iter().find(|f| f.name == "trace.json").unwrap().bytes)
            .unwrap();
    let events = trace["traceEvents"].as_array().expect("a Chrome trace");
    assert!(events.len() >= 7, "{} events", events.len());
}

#[wasm_bindgen_test]
async fn the_history_keeps_time_in_a_browser() {
    let (pool, _live) = busy_pool().await;
    let history = pool.history().expect("history is on");
    let times: Vec<u64> = history.events().iter().map(|event| event.time_us).collect();
    assert!(times.len() >= 7, "{times:?}");
    assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{times:?}");
    assert!(history
        .events()
        .iter()
        .any(|event| event.op.as_ref().map(AsRef::as_ref) == Some("matmul")));
}
