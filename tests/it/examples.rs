//! The examples' logic at small sizes, on the backend the tests run on: each example keeps getting
//! a device apart from using it, so these tests call the very code the example runs.

use crate::gpu::gpu;

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/fragmentation.rs"]
mod fragmentation;

#[test]
fn fragmentation_example_tells_its_story() {
    // Units of 64 KiB instead of 1 MiB: the same story in 35 MiB.
    let out = std::env::temp_dir().join(format!("wgpu-pool-frag-{}", std::process::id()));
    let outcome = fragmentation::run(gpu(), 64 << 10, false, Some(&out)).unwrap();
    assert_eq!(outcome.arena_free_units, 100);
    assert_eq!(outcome.arena_largest_hole_units, 50);
    assert!(outcome.pool_served, "{outcome:?}");
    assert!(outcome.second_request_refused, "{outcome:?}");
    // The tensors' part: refused (the error says compacting helps), two tensors moved, served
    // without a new segment, one more segment given back by compact(), values intact.
    let tensors = &outcome.tensors;
    assert!(tensors.refused_before, "{tensors:?}");
    assert_eq!(tensors.moves, 2, "{tensors:?}");
    assert!(tensors.served_after, "{tensors:?}");
    assert_eq!(tensors.segments_released, 1, "{tensors:?}");
    let segment = 128 * (64 << 10);
    assert_eq!(tensors.reserved_bytes, (4 * segment, 3 * segment));
    assert!(tensors.values_intact, "{tensors:?}");
    // Issue 26, item 8: the snapshot of the first refusal (part 3), with the oom in its trace.
    let snapshot = wgpu_pool::snapshot::Snapshot::from_path(out.join("oom_snapshot.pickle"))
        .expect("oom_snapshot.pickle");
    snapshot.check_invariants().unwrap();
    assert_eq!(
        snapshot.events().last().map(|event| event.action.clone()),
        Some(wgpu_pool::snapshot::TraceAction::Oom)
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[expect(
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
        // The planned side: the same answers (checked by `run`), no buffer after warm-up, and
        // its arena between the plan's lower bound and greedy-by-size's.
        let planned = &comparison.planned;
        assert_eq!(planned.create_buffer_calls_after_warmup, 0, "{name}");
        let (heap, live, greedy) = (
            planned.plan_heap_bytes.expect("planned heap"),
            planned.plan_max_live_bytes.expect("planned max-live"),
            planned.plan_greedy_by_size_bytes.expect("greedy"),
        );
        assert!(live <= heap && heap <= greedy, "{name}: {planned:?}");
        assert!(planned.plans.expect("plans") >= 1);
        assert!(
            (planned.checksum - comparison.pool.checksum).abs()
                <= 1e-4 * comparison.pool.checksum.abs().max(1.0)
        );
        // Weights plus the arena, within the pool's rounding.
        assert!(
            planned.peak_reserved_bytes >= planned.weights_bytes + heap,
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
        "plan.csv",
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

#[test]
fn pool_vs_naive_example_takes_the_small_workloads_width_and_depth() {
    let settings = pool_vs_naive::Settings {
        only: Some("small".into()),
        small_width: Some(8),
        small_layers: Some(5),
        ..pool_vs_naive::Settings::default()
    };
    let comparisons =
        pool_vs_naive::run(gpu(), pool_vs_naive::Scale::Test, &settings, None, false).unwrap();
    assert_eq!(comparisons.len(), 1, "only the small workload");
    let comparison = &comparisons[0];
    assert_eq!(comparison.workload.name, "small");
    assert_eq!(comparison.workload.widths, vec![8; 6]);
    // The model really has these layers: five 8x8 weights and 8-wide biases (1,440 bytes) live
    // throughout, beside a request's 16 tensors (input, 5 products, 5 biased sums, 4 GELUs, the
    // softmax) of at most 8 rows x 8 columns (256 bytes), which go back when its batch is
    // submitted.
    let peak = comparison.naive.peak_requested_bytes;
    assert!((1440 + 16 * 16..=1440 + 16 * 256).contains(&peak), "{peak}");
    assert_eq!(comparison.pool.create_buffer_calls_after_warmup, 0);
}

#[test]
fn pool_vs_naive_example_serves_in_f16_where_the_device_stores_it() {
    use wgpu_pool::compute::{Context, ContextOptions, DType};
    let settings = pool_vs_naive::Settings {
        only: Some("mlp".into()),
        dtype: DType::F16,
        ..pool_vs_naive::Settings::default()
    };
    let pool = wgpu_pool::Pool::new(gpu(), wgpu_pool::PoolOptions::default()).unwrap();
    let supports = Context::new(&pool, ContextOptions::default())
        .unwrap()
        .supports(DType::F16);
    drop(pool);
    let outcome = pool_vs_naive::run(gpu(), pool_vs_naive::Scale::Test, &settings, None, false);
    if !supports {
        // A device without SHADER_F16 (llvmpipe under GL): refused up front, with a message.
        let error = outcome.unwrap_err().to_string();
        assert!(
            error.contains("--dtype f16 needs a device with SHADER_F16"),
            "{error}"
        );
        eprintln!(
            "pool_vs_naive --dtype f16 NOT SERVED: {} has no SHADER_F16; checked the refusal",
            gpu().info.name
        );
        return;
    }
    let comparisons = outcome.unwrap();
    assert_eq!(comparisons.len(), 1);
    let comparison = &comparisons[0];
    assert_eq!(comparison.dtype, "f16");
    // The weights are f16: 2 bytes per element of [16, 32] + [32] and [32, 8] + [8].
    let elements = 16 * 32 + 32 + 32 * 8 + 8;
    for side in [&comparison.pool, &comparison.naive, &comparison.planned] {
        assert_eq!(side.weights_bytes, 2 * elements as u64);
        assert!(side.requests_per_s > 0.0 && side.checksum > 0.0);
    }
    // Every side answers alike within f16's tolerance (`run` checks it; again here).
    for side in [&comparison.naive, &comparison.planned] {
        let relative = (side.checksum - comparison.pool.checksum).abs() / side.checksum.abs();
        assert!(relative <= settings.checksum_tolerance(), "{relative}");
    }
    assert_eq!(comparison.pool.create_buffer_calls_after_warmup, 0);
}

#[test]
fn pool_vs_naive_example_takes_f32_products_on_f16_operands_when_asked() {
    // `--f32-as-f16`: where the device has no cooperative matrices (the software GPUs; the
    // test device is opened without them) the f32 products keep the portable kernels, and
    // every side still answers alike.
    let settings = pool_vs_naive::Settings {
        only: Some("small".into()),
        f32_as_f16: true,
        ..pool_vs_naive::Settings::default()
    };
    let comparisons =
        pool_vs_naive::run(gpu(), pool_vs_naive::Scale::Test, &settings, None, false).unwrap();
    assert_eq!(comparisons.len(), 1);
    assert_eq!(comparisons[0].dtype, "f32");
    assert_eq!(comparisons[0].pool.create_buffer_calls_after_warmup, 0);
}

#[test]
fn pool_vs_naive_example_refuses_bad_arguments_with_a_message() {
    let parse = |line: &str| pool_vs_naive::parse_args(line.split_whitespace().map(String::from));
    let args = parse("--large --only small --width 256 --layers 32 --batch-ops 8").unwrap();
    assert_eq!(args.scale, pool_vs_naive::Scale::Large);
    assert_eq!(args.settings.only.as_deref(), Some("small"));
    assert_eq!(args.settings.small_width, Some(256));
    assert_eq!(args.settings.small_layers, Some(32));
    assert_eq!(args.settings.max_ops_per_batch, Some(8));
    assert_eq!(args.settings.dtype, wgpu_pool::compute::DType::F32);
    assert!(!args.settings.f32_as_f16);
    let args = parse("--dtype f16 --f32-as-f16 --cooperative-matrix").unwrap();
    assert_eq!(args.settings.dtype, wgpu_pool::compute::DType::F16);
    assert!(args.settings.f32_as_f16 && args.cooperative_matrix);
    for (line, expected) in [
        ("--width 0", "positive number"),
        ("--width 6", "multiple of 4"),
        ("--width 1000000", "multiple of 4 up to"),
        ("--width", "needs a number"),
        ("--layers -3", "positive number"),
        ("--layers 18446744073709551615", "at most"),
        ("--only mlp --width 64", "--only mlp leaves out"),
        ("--only big", "small or mlp"),
        ("--batch-ops many", "needs a number"),
        ("--fast", "unknown argument"),
        ("--dtype f64", "f32 or f16"),
        ("--dtype", "needs a type"),
    ] {
        let error = format!("{:#}", parse(line).unwrap_err());
        assert!(error.contains(expected), "{line}: {error}");
    }
    // A layer's weights must fit one binding of the device: refused before anything is served.
    let limit = gpu().device.limits().max_storage_buffer_binding_size;
    let width = (((limit / 4) as f64).sqrt() as usize + 4) / 4 * 4;
    let settings = pool_vs_naive::Settings {
        only: Some("small".into()),
        small_width: Some(width),
        small_layers: Some(1),
        ..pool_vs_naive::Settings::default()
    };
    let error = pool_vs_naive::run(gpu(), pool_vs_naive::Scale::Test, &settings, None, false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_storage_buffer_binding_size"), "{error}");
}

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/first_steps.rs"]
mod first_steps;

#[test]
fn first_steps_example_doubles_every_value() {
    let doubled = first_steps::run(gpu()).unwrap();
    let expected: Vec<f32> = (0..1024).map(|i| 2.0 * i as f32).collect();
    assert_eq!(doubled, expected);
}

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/bench_kernels.rs"]
mod bench_kernels;

/// A file of the temp directory for this test and process.
fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("wgpu-pool-bk-{}-{name}", std::process::id()))
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("the JSON is written");
    std::fs::remove_file(path).ok();
    serde_json::from_str(&text).expect("valid JSON")
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// `bench_kernels` with `args`, `--torch` a file holding `torch_json` (PyTorch's figures as
/// `matmul.py --json` writes them) and `--json`: the JSON it wrote.
fn bench_kernels_json(name: &str, torch_json: &str, args: &[&str]) -> serde_json::Value {
    let (torch, out) = (
        temp_file(&format!("{name}-torch.json")),
        temp_file(&format!("{name}.json")),
    );
    std::fs::write(&torch, torch_json).unwrap();
    let mut list = strings(args);
    list.extend(strings(&["--torch", torch.to_str().unwrap()]));
    list.extend(strings(&["--json", out.to_str().unwrap()]));
    let result = bench_kernels::run(gpu(), &list);
    std::fs::remove_file(&torch).ok();
    result.expect("every product agrees with its twin");
    read_json(&out)
}

#[test]
fn bench_kernels_example_measures_checks_and_compares_with_pytorch() {
    // PyTorch's figures for one of the two shapes.
    let json = bench_kernels_json(
        "kernels",
        r#"{"dtype": "float32", "matmul": [{"m": 8, "n": 64, "k": 64, "time_us": 2.0,
            "stream_us": 4.0}], "chain_step_us": 3.0}"#,
        &[
            "--only", "matmul", "--matmul", "8x64x64", "--matmul", "33x20x12",
        ],
    );
    let products = json["matmul"].as_array().expect("a matmul list");
    assert_eq!(products.len(), 2, "{json}");
    for product in products {
        let time = product["time_us"].as_f64().unwrap();
        let stream = product["stream_us"].as_f64().unwrap();
        assert!(time > 0.0 && stream > 0.0, "{product}");
        assert!(
            product["max_rel_err"].as_f64().unwrap() <= 1e-5,
            "{product}"
        );
        assert!(!product["tiles"].as_str().unwrap().is_empty(), "{product}");
    }
    // Each shape was measured between two runs of the clock probe, at least once.
    let fastest = json["clock_probe"]["fastest_us"].as_f64().unwrap();
    for product in products {
        assert!(product["measurements"].as_u64().unwrap() >= 1, "{product}");
        let probe = product["clock_probe_us"].as_f64().unwrap();
        assert!(probe >= fastest, "{json}");
        assert_eq!(
            product["clock_low"].as_bool(),
            Some(probe > fastest * 1.1),
            "{json}"
        );
    }
    // The ratios are ours over PyTorch's where PyTorch measured the shape, null elsewhere.
    let (narrow, tiled) = (&products[0], &products[1]);
    assert!(
        narrow["tiles"].as_str().unwrap().starts_with("narrow"),
        "{narrow}"
    );
    let ratio = narrow["ratio"].as_f64().unwrap();
    assert!((ratio - narrow["time_us"].as_f64().unwrap() / 2.0).abs() < 1e-9);
    let stream_ratio = narrow["stream_ratio"].as_f64().unwrap();
    assert!((stream_ratio - narrow["stream_us"].as_f64().unwrap() / 4.0).abs() < 1e-9);
    assert!(
        tiled["ratio"].is_null() && tiled["stream_ratio"].is_null(),
        "{tiled}"
    );
}

#[test]
fn bench_kernels_measures_again_what_it_measured_while_the_clock_was_down() {
    // A simulated dip: the clock at a quarter during the second and third shapes, a probe 8%
    // slow (noise, not a dip) on the fourth.
    let probes = [50.0, 200.0, 180.0, 54.0, 51.0];
    assert_eq!(bench_kernels::measured_in_a_dip(&probes), vec![1, 2]);
    // No dip: nothing to measure again, and one probe alone is its own fastest.
    assert!(bench_kernels::measured_in_a_dip(&[50.0, 52.0, 50.5]).is_empty());
    assert!(bench_kernels::measured_in_a_dip(&[75.0]).is_empty());
}

#[test]
fn bench_kernels_example_streams_elementwise_ops_and_the_row_sum_beside_pytorch() {
    // PyTorch's stream times for `add` and `sum` of 8192 elements only.
    let json = bench_kernels_json(
        "elementwise",
        r#"{"dtype": "float32", "matmul": [], "elementwise": [
            {"op": "add", "n": 8192, "time_us": 3.0, "stream_us": 2.0},
            {"op": "sum", "n": 8192, "time_us": 3.0, "stream_us": 4.0}]}"#,
        &[
            "--only",
            "elementwise",
            "--op",
            "add",
            "--op",
            "sum",
            "--n",
            "8192",
            "--n",
            "4096",
        ],
    );
    let rows = json["elementwise"].as_array().expect("an elementwise list");
    let ops: Vec<(&str, u64)> = rows
        .iter()
        .map(|row| (row["op"].as_str().unwrap(), row["n"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ops,
        [("add", 8192), ("add", 4096), ("sum", 8192), ("sum", 4096)],
        "{json}"
    );
    for row in rows {
        let stream = row["stream_us"].as_f64().unwrap();
        let n = row["n"].as_f64().unwrap();
        assert!(
            stream > 0.0 && row["time_us"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        // Bytes read and written: 12 per element of add, 4 (and a store per row) of sum.
        let bytes = match row["op"].as_str().unwrap() {
            "add" => 12.0 * n,
            _ => 4.0 * n + 4.0 * n / 4096.0,
        };
        let gbs = row["stream_gbs"].as_f64().unwrap();
        assert!((gbs - bytes / (stream * 1e3)).abs() <= 1e-9 * gbs, "{row}");
        // Checked against the twin (a sum relative to the magnitude of its terms).
        assert!(row["max_rel_err"].as_f64().unwrap() <= 1e-6, "{row}");
        match (row["n"].as_u64().unwrap(), row["op"].as_str().unwrap()) {
            (8192, op) => {
                let theirs = if op == "add" { 2.0 } else { 4.0 };
                let ratio = row["stream_ratio"].as_f64().unwrap();
                assert!((ratio - stream / theirs).abs() < 1e-9, "{row}");
            }
            _ => assert!(row["stream_ratio"].is_null(), "{row}"),
        }
    }
}

#[test]
fn bench_kernels_example_times_planned_chains_with_forced_narrow_plans() {
    let json = bench_kernels_json(
        "chains",
        r#"{"dtype": "float32", "matmul": []}"#,
        &[
            "--only",
            "matmul",
            "--matmul",
            "2x16x16",
            "--chain-shape",
            "2x64",
            "--chain-plan",
            "2x1",
            "--chain-plan",
            "4x2",
            "--chain-runs",
            "3",
        ],
    );
    assert_eq!(
        json["matmul_chain_shape"],
        serde_json::json!([2, 64]),
        "{json}"
    );
    assert!(
        json["matmul_plan_chain_step_us"].as_f64().is_some(),
        "{json}"
    );
    let plans = json["matmul_chain_plans"]
        .as_array()
        .expect("the chain plans");
    let forced: Vec<(u64, u64)> = plans
        .iter()
        .map(|plan| {
            (
                plan["lanes"].as_u64().unwrap(),
                plan["splits"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(forced, [(2, 1), (4, 2)], "{json}");
    for plan in plans {
        for key in ["plan_step_us", "automatic_plan_step_us"] {
            let steps = plan[key].as_array().unwrap();
            assert_eq!(steps.len(), 3, "{plan}");
            assert!(
                steps.iter().all(|step| step.as_f64().unwrap().is_finite()),
                "{plan}"
            );
        }
    }
}

#[test]
fn bench_kernels_example_runs_sustained_products() {
    let json = bench_kernels_json(
        "sustained",
        r#"{"dtype": "float32", "matmul": [], "sustained": [{"m": 8, "n": 64, "k": 64,
            "tflops": 0.5}]}"#,
        &[
            "--sustained",
            "0.3",
            "--matmul",
            "8x64x64",
            "--narrow-lanes",
            "2",
            "--narrow-splits",
            "2",
        ],
    );
    let runs = json["sustained"].as_array().expect("a sustained list");
    assert_eq!(runs.len(), 2, "{json}");
    // The automatic plan, then the forced one (2 lanes, K split in two).
    assert_eq!(runs[0]["forced"], false, "{json}");
    assert_eq!(runs[1]["forced"], true, "{json}");
    assert_eq!(
        runs[1]["tiles"].as_str().unwrap().split(' ').nth(1),
        Some("x2"),
        "{json}"
    );
    assert_eq!(runs[1]["splits"], 2, "{json}");
    assert!(runs[1]["tflops"].as_f64().unwrap() > 0.0, "{json}");
    let run = &runs[0];
    let products = run["products"].as_u64().unwrap();
    let seconds = run["seconds"].as_f64().unwrap();
    let tflops = run["tflops"].as_f64().unwrap();
    assert!(products > 0 && seconds >= 0.3, "{run}");
    let expected = products as f64 * 2.0 * 8.0 * 64.0 * 64.0 / seconds / 1e12;
    assert!(
        (tflops - expected).abs() <= 1e-9 * expected.max(1.0),
        "{run}"
    );
    assert!(
        (run["ratio"].as_f64().unwrap() - tflops / 0.5).abs() < 1e-9,
        "{run}"
    );
}

#[test]
fn bench_kernels_example_refuses_bad_arguments_with_a_message() {
    for (list, expected) in [
        (vec!["--sustained", "-1"], "positive number of seconds"),
        (vec!["--matmul", "8x64"], "not MxNxK"),
        (vec!["--narrow-lanes", "3"], "power of two"),
        (vec!["--n", "1000"], "multiple of 4096"),
        (vec!["--op", "max"], "add, relu, gelu or sum"),
        (vec!["--chain-plan", "3x1"], "not LxS"),
        (vec!["--chain-shape", "8x0"], "not RxW"),
    ] {
        let error = bench_kernels::run(gpu(), &strings(&list)).unwrap_err();
        assert!(error.to_string().contains(expected), "{list:?}: {error:#}");
    }
    // PyTorch's half figures beside f32 products: refused, naming the script to run.
    let torch = temp_file("torch-half.json");
    std::fs::write(&torch, r#"{"dtype": "float16", "matmul": []}"#).unwrap();
    let error = bench_kernels::run(
        gpu(),
        &strings(&["--only", "matmul", "--torch", torch.to_str().unwrap()]),
    )
    .unwrap_err();
    std::fs::remove_file(&torch).ok();
    assert!(error.to_string().contains("--dtype float"), "{error:#}");
}

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/dispatch_cost.rs"]
mod dispatch_cost;

#[test]
fn dispatch_cost_example_times_a_users_kernel_beside_add_from_cached_bind_groups() {
    let (ops, rounds) = (40, 3);
    let json = dispatch_cost::run(
        gpu(),
        &strings(&[
            "--ops",
            &ops.to_string(),
            "--len",
            "1000",
            "--rounds",
            &rounds.to_string(),
        ]),
    )
    .expect("the user's kernel computes the sum");
    for key in [
        "add_ns_per_dispatch",
        "user_ns_per_dispatch",
        "user_over_add",
    ] {
        assert!(json[key].as_f64().unwrap() > 0.0, "{json}");
    }
    // The warm-up's 64 dispatches and the timed ones, each counted; the bind groups of the two
    // ranges the outputs alternate between are made once and then found in the cache.
    let dispatches = json["user_dispatches"].as_u64().unwrap();
    assert_eq!(dispatches, 64 + ops * rounds, "{json}");
    let created = json["user_bind_groups_created"].as_u64().unwrap();
    let hits = json["user_bind_group_cache_hits"].as_u64().unwrap();
    assert_eq!(created + hits, dispatches, "{json}");
    assert!(created <= 4, "{json}");
    // Bad arguments are refused with a message.
    let error = dispatch_cost::run(gpu(), &strings(&["--rounds", "0"])).unwrap_err();
    assert!(error.to_string().contains("at least 1"), "{error}");
    assert!(dispatch_cost::run(gpu(), &strings(&["--frobnicate"])).is_err());
}

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/serve_gpt.rs"]
mod serve_gpt;

#[test]
fn serve_gpt_example_serves_three_sides_and_reads_its_weights_back() {
    let (json, weights) = (temp_file("serve.json"), temp_file("tiny.safetensors"));
    let out = temp_file("serve-out");
    let base = strings(&["--requests", "10", "--max-batch", "6", "--seed", "3"]);
    let mut write = base.clone();
    write.extend(strings(&["--write-weights", weights.to_str().unwrap()]));
    serve_gpt::run(None, &write).expect("weights written without a GPU");
    let mut list = base.clone();
    list.extend(strings(&[
        "--json",
        json.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--eager",
        "--budget", // room for the eager side's unplanned intermediates too
        "8388608",
    ]));
    serve_gpt::run(Some(gpu()), &list).expect("served");
    let random = read_json(&json);
    assert_eq!(random["stream"]["requests"].as_array().unwrap().len(), 10);
    assert_eq!(random["max_batch"], 6);
    let sides = &random["sides"];
    for name in ["paged", "contiguous", "naive", "paged_eager", "paged_sync"] {
        let side = &sides[name];
        for key in [
            "generated_tokens_per_s",
            "ttft_ms_p50",
            "ttft_ms_p99",
            "tpot_ms_p50",
            "tpot_ms_p99",
            "kv_reserved_bytes_peak",
            "kv_used_bytes_peak",
            "kv_waste",
            "peak_reserved_bytes",
            "peak_requested_bytes",
            "in_flight_mean",
            "in_flight_max",
            "waits",
            "preemptions",
            "oom_errors",
            "segments_created",
            "device_reported_bytes",
            "accounted_bytes",
        ] {
            assert!(side.get(key).is_some(), "{name}: no {key}: {side}");
        }
        assert_eq!(side["oom_errors"], 0, "{name}");
        assert!(
            side["peak_reserved_bytes"].as_u64().unwrap()
                <= random["budget_bytes"].as_u64().unwrap()
        );
        let requests = side["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 10, "{name}");
        for (request, spec) in requests
            .iter()
            .zip(random["stream"]["requests"].as_array().unwrap())
        {
            assert_eq!(request["prompt"], spec["prompt"]);
            assert_eq!(
                request["output"].as_array().unwrap().len() as u64,
                spec["max_new_tokens"].as_u64().unwrap()
            );
        }
    }
    let waste = |name: &str| sides[name]["kv_waste"].as_f64().unwrap();
    assert!(waste("paged") < waste("contiguous"), "{sides}");
    // Pipelined, waited for or eager: the same tokens; only the pipelined side feeds rows.
    for name in ["paged_sync", "paged_eager", "contiguous", "naive"] {
        assert_eq!(
            sides[name]["requests"], sides["paged"]["requests"],
            "{name}"
        );
    }
    assert!(sides["paged"]["fed_rows"].as_u64().unwrap() > 0);
    assert_eq!(sides["paged_sync"]["fed_rows"], 0);
    assert_eq!(sides["paged_eager"]["fed_rows"], 0);
    assert!(
        sides["paged"]["in_flight_max"].as_u64() >= sides["contiguous"]["in_flight_max"].as_u64()
    );
    assert!(out.join("paged").join("snapshot.pickle").exists());
    // The weights written and read back serve the same tokens.
    let mut again = base;
    again.extend(strings(&[
        "--weights",
        weights.to_str().unwrap(),
        "--sides",
        "paged",
        "--json",
        json.to_str().unwrap(),
    ]));
    serve_gpt::run(Some(gpu()), &again).expect("served from the file");
    let from_file = read_json(&json);
    assert_eq!(
        from_file["sides"]["paged"]["requests"],
        sides["paged"]["requests"]
    );
    assert!(serve_gpt::run(Some(gpu()), &strings(&["--model", "gpt3"])).is_err());
    std::fs::remove_file(&weights).ok();
    std::fs::remove_dir_all(&out).ok();
}

/// `--rate` and `--shared-prefix`: arrivals recorded and non-decreasing, every prompt after one of
/// the prefixes, goodput within the requests served, and the same greedy tokens as the same
/// stream all at t = 0.
#[test]
fn serve_gpt_example_serves_arrivals_at_a_rate_after_shared_prefixes() {
    let json = temp_file("serve-rate.json");
    let path = json.to_str().unwrap();
    let base = strings(&[
        "--requests",
        "6",
        "--max-batch",
        "4",
        "--seed",
        "5",
        "--sides",
        "paged",
        "--shared-prefix",
        "2:8",
        "--json",
        path,
    ]);
    // Objectives every request meets on any device (a minute), then none can (a microsecond).
    let mut timed = base.clone();
    timed.extend(strings(&[
        "--rate",
        "40",
        "--slo-ttft-ms",
        "60000",
        "--slo-tpot-ms",
        "60000",
    ]));
    serve_gpt::run(Some(gpu()), &timed).expect("served at a rate");
    let at_rate = read_json(&json);
    assert_eq!(at_rate["slo"]["ttft_ms"], 60000.0, "{}", at_rate["slo"]);
    assert_eq!(at_rate["stream"]["traffic"]["rate"], 40.0);
    let stream = at_rate["stream"]["requests"].as_array().unwrap();
    assert_eq!(stream.len(), 6);
    let arrivals: Vec<f64> = stream
        .iter()
        .map(|request| request["arrival_s"].as_f64().expect("arrival_s"))
        .collect();
    assert!(arrivals[0] > 0.0, "{arrivals:?}");
    assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "{arrivals:?}");
    let mut prefixes: Vec<&[serde_json::Value]> = Vec::new();
    for request in stream {
        let prompt = request["prompt"].as_array().unwrap();
        assert!(prompt.len() > 8 && request["max_new_tokens"].as_u64().unwrap() >= 1);
        if !prefixes.contains(&&prompt[..8]) {
            prefixes.push(&prompt[..8]);
        }
    }
    assert!(prefixes.len() <= 2, "prompts after more than 2 prefixes");
    let side = &at_rate["sides"]["paged"];
    let wall_s = side["wall_s"].as_f64().unwrap();
    assert!(wall_s >= arrivals[5], "{wall_s} s before the last arrival");
    let (goodput, served) = (
        side["goodput_rps"].as_f64().unwrap(),
        side["requests_per_s"].as_f64().unwrap(),
    );
    assert!((served - 6.0 / wall_s).abs() < 1e-9 * served, "{side}");
    assert_eq!(side["slo_met"], 6, "{side}");
    assert!(goodput <= served && (goodput - served).abs() < 1e-9 * served);
    // The same stream at t = 0: the same prompts and greedy tokens.
    let mut at_once = base;
    at_once.extend(strings(&[
        "--slo-ttft-ms",
        "0.001",
        "--slo-tpot-ms",
        "0.001",
    ]));
    serve_gpt::run(Some(gpu()), &at_once).expect("served at t = 0");
    let at_zero = read_json(&json);
    let zero_stream = at_zero["stream"]["requests"].as_array().unwrap();
    assert!(zero_stream.iter().all(|r| r["arrival_s"] == 0.0));
    for (a, b) in stream.iter().zip(zero_stream) {
        assert_eq!(a["prompt"], b["prompt"]);
    }
    let zero_side = &at_zero["sides"]["paged"];
    assert_eq!(zero_side["requests"], side["requests"]);
    assert_eq!(zero_side["slo_met"], 0, "{zero_side}");
    assert_eq!(zero_side["goodput_rps"], 0.0);
    // Bad traffic is refused before any GPU work, with a message.
    for (list, expected) in [
        (vec!["--rate", "0"], "positive number of requests"),
        (vec!["--rate", "NaN"], "positive number of requests"),
        (vec!["--shared-prefix", "2"], "N:L"),
        (vec!["--shared-prefix", "0:4"], "N:L"),
        (vec!["--shared-prefix", "1:128"], "no room for an output"),
        (
            vec!["--slo-tpot-ms", "-1"],
            "positive numbers of milliseconds",
        ),
    ] {
        let error = serve_gpt::run(None, &strings(&list)).unwrap_err();
        assert!(
            format!("{error:#}").contains(expected),
            "{list:?}: {error:#}"
        );
    }
}

#[expect(dead_code, reason = "the example's main() is not called here")]
#[path = "../../examples/web_serve.rs"]
mod web_serve;

/// The page's workload, natively: the same `_async` calls the browser awaits, here driven by
/// pollster; every token the twin's (or a near-tie), the kernels timed.
#[test]
fn web_serve_workload_serves_the_twins_tokens_natively() {
    let weights =
        wgpu_pool::model::Gpt2Weights::random(&wgpu_pool::model::Gpt2Config::tiny(), 7).unwrap();
    let mut steps = 0;
    let figures = pollster::block_on(web_serve::workload::run(
        gpu(),
        &weights,
        |pool, server, finished| {
            steps += 1;
            assert!(pool.stats().oom_count == 0 && server.running() <= 4 && finished.len() <= 10);
            Ok(())
        },
    ))
    .unwrap();
    assert_eq!(figures.requests, 10);
    assert!(figures.tokens >= 40, "{figures:?}");
    assert_eq!(
        figures.equal + figures.near_ties,
        figures.tokens,
        "{figures:?}"
    );
    assert_eq!(figures.oom_count, 0);
    assert!(steps > 0 && figures.kv_peak_blocks > 0);
    assert_eq!(figures.kernels.len(), 4);
    assert!(figures.kernels.iter().all(|k| k.microseconds > 0.0));
}
