//! Planned execution (`wgpu_pool::compute::graph`): a captured forward replayed against the same
//! ops run eagerly, at odd shapes, repeated and interleaved with eager work; fusion; arenas
//! shared by plans of several batch sizes; typed errors. Every test runs on the backend
//! `WGPU_BACKEND` selects; CI runs them on Vulkan (lavapipe) and GL (llvmpipe).
//!
//! A plan runs the same kernels as the eager ops, but fused (the matmul's epilogue adds the bias
//! and applies the activation in registers): results agree to 1e−5·|x| + 1e−6.

use rand::{rngs::StdRng, Rng, SeedableRng};
use wgpu_pool::compute::{
    CaptureOptions, ComputeError, Context, ContextOptions, Feed, MatmulOptions, Tensor,
    UserKernelDesc,
};
use wgpu_pool::{Gpu, Pool, PoolOptions};

use crate::gpu::{both, gpu};

fn context(gpu: &Gpu) -> Context {
    let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
    Context::new(&pool, ContextOptions::default()).expect("context")
}

/// A context on a pool of its own with these matmul options.
fn context_with_matmul(matmul: MatmulOptions) -> Context {
    let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    let options = ContextOptions {
        matmul,
        ..ContextOptions::default()
    };
    Context::new(&pool, options).expect("context")
}

fn random(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tolerance = 1e-5 * f64::from(w.abs()) + 1e-6;
        assert!(
            (f64::from(g) - f64::from(w)).abs() <= tolerance,
            "{what}: element {i}: plan {g}, eager {w}"
        );
    }
}

/// An MLP's layers: `(weights [in, out], bias [out])`.
fn layers(ctx: &Context, rng: &mut StdRng, widths: &[usize]) -> Vec<(Tensor, Tensor)> {
    widths
        .windows(2)
        .map(|pair| {
            let w = ctx
                .tensor(&random(rng, pair[0] * pair[1]), &[pair[0], pair[1]])
                .expect("weights");
            let b = ctx.tensor(&random(rng, pair[1]), &[pair[1]]).expect("bias");
            (w, b)
        })
        .collect()
}

/// The forward: matmul + bias + GELU per hidden layer, matmul + bias, softmax; and the row sums
/// of the last hidden activation (a second output).
fn forward(ctx: &Context, x: &Tensor, layers: &[(Tensor, Tensor)]) -> (Tensor, Tensor) {
    let mut h = x.clone();
    let mut hidden_sum = None;
    for (index, (w, b)) in layers.iter().enumerate() {
        let product = ctx.matmul(&h, w).expect("matmul");
        let biased = ctx.add_bias(&product, b).expect("bias");
        h = if index + 1 < layers.len() {
            let activated = ctx.gelu(&biased).expect("gelu");
            hidden_sum = Some(ctx.sum(&activated).expect("sum"));
            activated
        } else {
            biased
        };
    }
    let probabilities = ctx.softmax(&h).expect("softmax");
    (probabilities, hidden_sum.expect("at least two layers"))
}

/// The forward captured for inputs of `shape`, planned with `options`: its outputs are the
/// softmax and the row sums.
fn planned(
    ctx: &Context,
    shape: &[usize],
    layers: &[(Tensor, Tensor)],
    options: CaptureOptions,
) -> wgpu_pool::compute::Plan {
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(shape).expect("input");
    let (p, s) = forward(ctx, &x, layers);
    capture.finish_with(&[&p, &s], options).expect("plan")
}

fn eager(
    ctx: &Context,
    input: &[f32],
    shape: &[usize],
    layers: &[(Tensor, Tensor)],
) -> [Vec<f32>; 2] {
    let x = ctx.tensor(input, shape).expect("input");
    let (p, s) = forward(ctx, &x, layers);
    [p.to_vec().expect("read"), s.to_vec().expect("read")]
}

#[test]
fn replay_equals_eager_at_odd_shapes() {
    // Rows 1 and 3 take the narrow kernel (K, N multiples of 4), 5 and 37 the tiles (odd widths:
    // scalar loads and edges); the long K of the second set makes split-K.
    let cases: [(&[usize], &[usize]); 3] = [
        (&[1, 3, 37], &[16, 24, 8]),
        (&[5, 37], &[13, 29, 7]),
        (&[2, 9], &[12, 3000, 4]),
    ];
    for (label, gpu) in both() {
        let ctx = context(gpu);
        let mut rng = StdRng::seed_from_u64(1);
        for (rows_list, widths) in cases {
            let layers = layers(&ctx, &mut rng, widths);
            for &rows in rows_list {
                let shape = [rows, widths[0]];
                let mut capture = ctx.capture().expect("capture");
                let x = capture.input(&shape).expect("input");
                let (p, s) = forward(&ctx, &x, &layers);
                assert!(p.is_symbolic() && s.is_symbolic());
                let mut plan = capture.finish(&[&p, &s]).expect("plan");
                let stats = plan.stats().clone();
                // Per hidden layer bias and GELU fold into the matmul, the last layer's bias too.
                let hidden = widths.len() - 2;
                assert_eq!(
                    stats.fused_steps,
                    2 * hidden + 1,
                    "{label} {rows}x{widths:?}"
                );
                assert!(stats.heap_bytes >= stats.max_live_bytes);
                assert!(stats.heap_bytes <= stats.greedy_by_size_heap_bytes);
                for round in 0..3 {
                    let input = random(&mut rng, rows * widths[0]);
                    let want = eager(&ctx, &input, &shape, &layers);
                    let got = plan.run(&[Feed::Data(&input)]).expect("run");
                    let what = format!("{label} {rows}x{widths:?} round {round}");
                    assert_close(&format!("{what} softmax"), &got[0], &want[0]);
                    assert_close(&format!("{what} hidden sums"), &got[1], &want[1]);
                }
            }
        }
    }
}

#[test]
fn split_k_replays_with_the_epilogue_in_the_reduction() {
    // A few output tiles and a long K: the planner splits K, and the fused bias and GELU run in
    // the reduction.
    let ctx = context(gpu());
    let (m, k, n) = (33, 2048, 20);
    let plan_of = ctx.matmul_plan(m, n, k).expect("matmul plan");
    assert!(plan_of.splits > 1, "the case must split K: {plan_of:?}");
    let mut rng = StdRng::seed_from_u64(2);
    let layers = layers(&ctx, &mut rng, &[k, n, 8]);
    let input = random(&mut rng, m * k);
    let want = eager(&ctx, &input, &[m, k], &layers);
    let mut plan = planned(&ctx, &[m, k], &layers, CaptureOptions::default());
    assert_eq!(plan.stats().fused_steps, 3);
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_close("split-K softmax", &got[0], &want[0]);
    assert_close("split-K sums", &got[1], &want[1]);
}

#[test]
fn narrow_split_along_k_replays_with_the_epilogue_in_the_reduction() {
    // A few rows: the narrow kernel, K split over workgroups, the bias and GELU in the reduction.
    let ctx = context_with_matmul(MatmulOptions {
        narrow_splits: Some(4),
        ..MatmulOptions::default()
    });
    let (m, k, n) = (4, 2048, 20);
    let plan_of = ctx.matmul_plan(m, n, k).expect("matmul plan");
    assert!(
        plan_of.narrow_lanes > 0 && plan_of.splits > 1,
        "the case must split K in the narrow kernel: {plan_of:?}"
    );
    let mut rng = StdRng::seed_from_u64(4);
    let layers = layers(&ctx, &mut rng, &[k, n, 8]);
    let input = random(&mut rng, m * k);
    let want = eager(&ctx, &input, &[m, k], &layers);
    let mut plan = planned(&ctx, &[m, k], &layers, CaptureOptions::default());
    for round in 0..2 {
        let got = plan.run(&[Feed::Data(&input)]).expect("run");
        assert_close(&format!("narrow split softmax {round}"), &got[0], &want[0]);
        assert_close(&format!("narrow split sums {round}"), &got[1], &want[1]);
    }
}

#[test]
fn replays_interleave_with_eager_work_and_see_new_weights() {
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(3);
    let widths = [12, 20, 8];
    let layers = layers(&ctx, &mut rng, &widths);
    let rows = 6;
    let mut plan = planned(&ctx, &[rows, widths[0]], &layers, CaptureOptions::default());
    let created = plan.bind_groups_created();
    for round in 0..4 {
        // Eager work recorded before the replay and left unsubmitted: its input tensor feeds the
        // replay, and its result stays open across it.
        let input = random(&mut rng, rows * widths[0]);
        let source = ctx.tensor(&input, &[rows, widths[0]]).expect("tensor");
        let doubled = ctx.add(&source, &source).expect("add");
        let out_p = ctx.empty(&[rows, widths[2]]).expect("empty");
        let out_s = ctx.empty(&[rows]).expect("empty");
        plan.run_into(&[Feed::Tensor(&doubled)], &[&out_p, &out_s])
            .expect("run_into");
        let after = ctx.relu(&doubled).expect("relu");
        let twice: Vec<f32> = input.iter().map(|v| v + v).collect();
        let want = eager(&ctx, &twice, &[rows, widths[0]], &layers);
        assert_close(
            &format!("round {round} outputs"),
            &out_p.to_vec().expect("read"),
            &want[0],
        );
        assert_close(
            &format!("round {round} sums"),
            &out_s.to_vec().expect("read"),
            &want[1],
        );
        let relu: Vec<f32> = twice.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(
            after.to_vec().expect("read"),
            relu,
            "eager work after the replay"
        );
        // New weights: the next replay reads them.
        let (w, _) = &layers[round % layers.len()];
        ctx.write(w, &random(&mut rng, w.len())).expect("write");
    }
    assert_eq!(
        plan.bind_groups_created(),
        created,
        "no bind group per replay"
    );
}

#[test]
fn plans_of_several_batch_sizes_share_one_arena() {
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(4);
    let widths = [16, 32, 32, 8];
    let layers = layers(&ctx, &mut rng, &widths);
    let arena = ctx.plan_arena();
    let mut plans = Vec::new();
    // Smallest first: every larger plan grows the arena, and the earlier plans bind again.
    for rows in [1, 4, 9, 30] {
        let options = CaptureOptions {
            arena: Some(arena.clone()),
            ..CaptureOptions::default()
        };
        plans.push((rows, planned(&ctx, &[rows, widths[0]], &layers, options)));
    }
    let largest = plans
        .iter()
        .map(|(_, plan)| plan.stats().heap_bytes)
        .max()
        .expect("plans");
    assert!(arena.bytes() >= largest);
    assert!(
        arena.bytes() < largest + 4096,
        "the arena holds the largest plan, not the sum"
    );
    for round in 0..2 {
        for (rows, plan) in &mut plans {
            let input = random(&mut rng, *rows * widths[0]);
            let want = eager(&ctx, &input, &[*rows, widths[0]], &layers);
            let got = plan.run(&[Feed::Data(&input)]).expect("run");
            assert_close(&format!("round {round} rows {rows}"), &got[0], &want[0]);
            assert_close(
                &format!("round {round} rows {rows} sums"),
                &got[1],
                &want[1],
            );
        }
    }
    // After the first round every plan is bound to the final arena: no more bind groups.
    let created: Vec<u64> = plans.iter().map(|(_, p)| p.bind_groups_created()).collect();
    for (rows, plan) in &mut plans {
        let input = random(&mut rng, *rows * widths[0]);
        plan.run(&[Feed::Data(&input)]).expect("run");
    }
    let again: Vec<u64> = plans.iter().map(|(_, p)| p.bind_groups_created()).collect();
    assert_eq!(created, again);
}

#[test]
fn a_replay_allocates_nothing_and_the_arena_is_one_labelled_allocation() {
    let gpu = gpu();
    let pool = Pool::new(gpu, PoolOptions::default()).expect("pool");
    let ctx = Context::new(&pool, ContextOptions::default()).expect("context");
    let mut rng = StdRng::seed_from_u64(5);
    let widths = [64, 128, 128, 16];
    let layers = layers(&ctx, &mut rng, &widths);
    let live_before = pool.stats().allocations.current;
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[8, widths[0]]).expect("input");
    let (p, s) = forward(&ctx, &x, &layers);
    assert_eq!(
        pool.stats().allocations.current,
        live_before,
        "a capture allocates nothing"
    );
    let mut plan = capture.finish(&[&p, &s]).expect("plan");
    drop((x, p, s));
    assert_eq!(
        pool.stats().allocations.current,
        live_before + 1,
        "one arena"
    );
    // The arena's ranges are labelled with the tensors that share them, in the memory state and
    // the snapshot (whose spans still tile every segment).
    let state = pool.memory_state();
    let parts: Vec<&str> = state
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .filter(|span| span.label.starts_with("plan arena"))
        .map(|span| span.label.as_str())
        .collect();
    assert!(parts.len() >= 2, "{parts:?}");
    assert!(
        parts.iter().any(|label| label.contains("t0 input")),
        "{parts:?}"
    );
    assert!(
        parts.iter().any(|label| label.contains("matmul")),
        "{parts:?}"
    );
    let arena_bytes: u64 = state
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .filter(|span| span.label.starts_with("plan arena"))
        .map(|span| span.requested_bytes)
        .sum();
    assert_eq!(arena_bytes, plan.arena().bytes());
    pool.snapshot().check_invariants().expect("invariants");
    let total = pool.stats().allocations.total;
    let input = random(&mut rng, 8 * widths[0]);
    for _ in 0..5 {
        plan.run(&[Feed::Data(&input)]).expect("run");
    }
    assert_eq!(
        pool.stats().allocations.total,
        total,
        "replays allocate nothing"
    );
}

#[test]
fn labelled_parts_are_checked() {
    let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    let a = pool.allocate(1024).expect("allocate");
    let part = |offset: u64, bytes: u64| (offset, bytes, format!("p{offset}"));
    for bad in [
        vec![part(0, 0)],
        vec![part(0, 512), part(256, 512)],
        vec![part(768, 512)],
        vec![part(u64::MAX, 2)],
    ] {
        assert!(
            matches!(
                pool.label_parts(&a, &bad),
                Err(wgpu_pool::PoolError::InvalidParts { .. })
            ),
            "{bad:?}"
        );
    }
    pool.label_parts(&a, &[part(512, 256), part(0, 256)])
        .expect("parts");
    let labels: Vec<String> = pool
        .memory_state()
        .segments
        .iter()
        .flat_map(|segment| &segment.spans)
        .filter(|span| span.kind != wgpu_pool::report::SpanKind::Free)
        .map(|span| span.label.clone())
        .collect();
    assert_eq!(labels.len(), 4, "{labels:?}"); // two parts, the gap between, the tail
    assert!(
        labels[0].ends_with(": p0") && labels[2].ends_with(": p512"),
        "{labels:?}"
    );
    pool.snapshot().check_invariants().expect("invariants");
    let other = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    assert!(matches!(
        other.label_parts(&a, &[]),
        Err(wgpu_pool::PoolError::ForeignAllocation { .. })
    ));
}

#[test]
fn fusion_off_gives_the_same_answers() {
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(6);
    let widths = [8, 12, 4];
    let layers = layers(&ctx, &mut rng, &widths);
    let input = random(&mut rng, 3 * widths[0]);
    let want = eager(&ctx, &input, &[3, widths[0]], &layers);
    let options = CaptureOptions {
        fuse: false,
        ..CaptureOptions::default()
    };
    let mut plan = planned(&ctx, &[3, widths[0]], &layers, options);
    assert_eq!(plan.stats().fused_steps, 0);
    assert_eq!(plan.stats().steps, plan.stats().recorded_steps);
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    // Unfused, the plan runs exactly the eager kernels.
    assert_eq!(got[0], want[0]);
    assert_eq!(got[1], want[1]);
}

#[test]
fn a_bias_computed_after_the_product_or_a_reshaped_product_is_not_fused() {
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(8);
    // Rows for the narrow kernel, the tiled one and split-K.
    for rows in [1, 2, 64] {
        let w = ctx.tensor(&random(&mut rng, 8 * 8), &[8, 8]).expect("w");
        // The bias is computed after the matmul: folding the add into the matmul would read it
        // before it is written (the previous run's values).
        let mut capture = ctx.capture().expect("capture");
        let x = capture.input(&[rows, 8]).expect("x");
        let b_in = capture.input(&[8]).expect("b");
        let h = ctx.matmul(&x, &w).expect("matmul");
        let b = ctx.neg(&b_in).expect("neg");
        let y = ctx
            .relu(&ctx.add_bias(&h, &b).expect("bias"))
            .expect("relu");
        let mut plan = capture.finish(&[&y]).expect("plan");
        for round in 0..3 {
            let input = random(&mut rng, rows * 8);
            let bias: Vec<f32> = (0..8).map(|i| (i + 10 * round) as f32).collect();
            let got = plan
                .run(&[Feed::Data(&input), Feed::Data(&bias)])
                .expect("run");
            let xt = ctx.tensor(&input, &[rows, 8]).expect("x");
            let bt = ctx.tensor(&bias, &[8]).expect("b");
            let want = ctx
                .relu(
                    &ctx.add_bias(&ctx.matmul(&xt, &w).expect("m"), &ctx.neg(&bt).expect("n"))
                        .expect("b"),
                )
                .expect("relu")
                .to_vec()
                .expect("read");
            assert_close(&format!("{rows} rows, round {round}"), &got[0], &want);
        }
        // A bias add over a reshape of the product adds along other columns: not the
        // product's epilogue.
        let b = ctx.tensor(&random(&mut rng, 4), &[4]).expect("b");
        let mut capture = ctx.capture().expect("capture");
        let x = capture.input(&[rows, 8]).expect("x");
        let h = ctx
            .matmul(&x, &w)
            .expect("matmul")
            .reshape(&[rows * 2, 4])
            .expect("reshape");
        let y = ctx.add_bias(&h, &b).expect("bias");
        let mut plan = capture.finish(&[&y]).expect("plan");
        let input = random(&mut rng, rows * 8);
        let got = plan.run(&[Feed::Data(&input)]).expect("run");
        let xt = ctx.tensor(&input, &[rows, 8]).expect("x");
        let want = ctx
            .add_bias(
                &ctx.matmul(&xt, &w)
                    .expect("m")
                    .reshape(&[rows * 2, 4])
                    .expect("r"),
                &b,
            )
            .expect("b")
            .to_vec()
            .expect("read");
        assert_close(&format!("{rows} rows, reshaped"), &got[0], &want);
    }
}

#[test]
fn a_product_that_adds_a_residual_folds_nothing_after_it() {
    use wgpu_pool::compute::{Activation, Epilogue};
    // act(x·w + r) is not act(x·w) + r, and a bias after the residual would change the order of
    // the sums: a bias add and an activation after such a product stay steps of their own.
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(9);
    let w = ctx.tensor(&random(&mut rng, 8 * 8), &[8, 8]).expect("w");
    let b = ctx.tensor(&random(&mut rng, 8), &[8]).expect("b");
    // Rows for the narrow kernel and the tiled one.
    for rows in [2, 64] {
        let forward = |x: &Tensor, r: &Tensor| {
            let epilogue = Epilogue {
                bias: Some(&b),
                activation: Activation::None,
                residual: Some(r),
            };
            let y = ctx.matmul_with(x, &w, epilogue).expect("matmul");
            ctx.relu(&ctx.add_bias(&y, &b).expect("bias"))
                .expect("relu")
        };
        let mut capture = ctx.capture().expect("capture");
        let x = capture.input(&[rows, 8]).expect("x");
        let r = capture.input(&[rows, 8]).expect("r");
        let y = forward(&x, &r);
        let mut plan = capture.finish(&[&y]).expect("plan");
        assert_eq!(plan.stats().fused_steps, 0, "{rows}: {:?}", plan.stats());
        assert_eq!(plan.stats().steps, 3, "{rows}: {:?}", plan.stats());
        let (input, residual) = (random(&mut rng, rows * 8), random(&mut rng, rows * 8));
        let got = plan
            .run(&[Feed::Data(&input), Feed::Data(&residual)])
            .expect("run");
        let xt = ctx.tensor(&input, &[rows, 8]).expect("x");
        let rt = ctx.tensor(&residual, &[rows, 8]).expect("r");
        let want = forward(&xt, &rt).to_vec().expect("read");
        assert_eq!(got[0], want, "{rows} rows: unfused, the eager bits");
    }
}

#[test]
fn an_intermediate_used_twice_is_not_fused() {
    // The matmul's result is read by the bias add and by the output: it must stay.
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(7);
    let w = ctx.tensor(&random(&mut rng, 8 * 4), &[8, 4]).expect("w");
    let b = ctx.tensor(&random(&mut rng, 4), &[4]).expect("b");
    let input = random(&mut rng, 2 * 8);
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[2, 8]).expect("input");
    let product = ctx.matmul(&x, &w).expect("matmul");
    let biased = ctx.add_bias(&product, &b).expect("bias");
    let activated = ctx.relu(&biased).expect("relu");
    let mut plan = capture.finish(&[&product, &activated]).expect("plan");
    // The product is an output, and the bias add is no matmul: nothing folds.
    assert_eq!(plan.stats().fused_steps, 0, "{:?}", plan.stats());
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    let x = ctx.tensor(&input, &[2, 8]).expect("x");
    let want_product = ctx.matmul(&x, &w).expect("matmul").to_vec().expect("read");
    let want = ctx
        .relu(
            &ctx.add_bias(&ctx.matmul(&x, &w).expect("m"), &b)
                .expect("b"),
        )
        .expect("relu")
        .to_vec()
        .expect("read");
    assert_eq!(got[0], want_product);
    assert_close("relu(x·w + b)", &got[1], &want);
}

#[test]
fn zeros_and_custom_dispatches_are_captured() {
    let gpu = gpu();
    let ctx = context(gpu);
    let pipeline = ctx
        .user_kernel(&UserKernelDesc {
            label: "test triple",
            wgsl: "@group(0) @binding(1) var<storage, read_write> x: array<f32>;
                   @group(0) @binding(2) var<storage, read_write> y: array<f32>;
                   @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                       if id.x < arrayLength(&x) { y[id.x] = y[id.x] + 3.0 * x[id.x]; }
                   }",
            entry_point: "main",
            tensors: 2,
            ..UserKernelDesc::default()
        })
        .expect("kernel");
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[8]).expect("input");
    let y = ctx.zeros(&[8]).expect("zeros");
    ctx.dispatch(&pipeline, &[&x, &y], [1, 1, 1])
        .expect("dispatch");
    let z = ctx.neg(&y).expect("neg");
    let mut plan = capture.finish(&[&z]).expect("plan");
    for round in 0..3 {
        let input: Vec<f32> = (0..8).map(|i| (i + round) as f32).collect();
        let got = plan.run(&[Feed::Data(&input)]).expect("run");
        let want: Vec<f32> = input.iter().map(|v| -3.0 * v).collect();
        // The clear runs every replay: y does not accumulate.
        assert_eq!(got[0], want, "round {round}");
    }

    // A captured dispatch that wgpu would refuse (group 1 expected, none given) is refused at
    // the call, with a typed error, not at a submission; the capture goes on.
    let layout = gpu
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("test uniform"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
    let scaled = ctx
        .user_kernel(&UserKernelDesc {
            label: "test scaled",
            wgsl: "@group(0) @binding(1) var<storage, read_write> x: array<f32>;
                   @group(0) @binding(2) var<storage, read_write> y: array<f32>;
                   @group(1) @binding(0) var<uniform> k: vec4<f32>;
                   @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                       if id.x < arrayLength(&x) { y[id.x] = k.x * x[id.x]; }
                   }",
            entry_point: "main",
            tensors: 2,
            groups: &[&layout],
            ..UserKernelDesc::default()
        })
        .expect("kernel");
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[8]).expect("input");
    let y = ctx.empty(&[8]).expect("empty");
    let refused = ctx.dispatch(&scaled, &[&x, &y], [1, 1, 1]);
    assert!(
        matches!(refused, Err(ComputeError::UserKernel { .. })),
        "{refused:?}"
    );
    let z = ctx.neg(&x).expect("neg");
    let mut plan = capture.finish(&[&z]).expect("plan");
    assert_eq!(plan.stats().steps, 1, "the refused dispatch was captured");
    assert_eq!(
        plan.run(&[Feed::Data(&[1.0; 8])]).expect("run")[0],
        [-1.0; 8]
    );
    // The context runs on.
    assert_eq!(
        ctx.neg(&ctx.tensor(&[2.0], &[1]).unwrap())
            .unwrap()
            .to_vec()
            .unwrap(),
        [-2.0]
    );
}

#[test]
fn capture_errors_are_typed_and_leave_the_context_usable() {
    let ctx = context(gpu());
    let w = ctx.tensor(&[1.0; 16], &[4, 4]).expect("w");

    // Nested captures are refused.
    let mut capture = ctx.capture().expect("capture");
    assert!(matches!(ctx.capture(), Err(ComputeError::Capture(_))));
    let x = capture.input(&[2, 4]).expect("input");
    let y = ctx.matmul(&x, &w).expect("matmul");
    // Symbolic tensors have no data.
    assert!(matches!(y.to_vec(), Err(ComputeError::Symbolic { .. })));
    assert!(matches!(
        ctx.write(&y, &[0.0; 8]),
        Err(ComputeError::Symbolic { .. })
    ));
    assert!(y.try_allocation().is_none());
    // Weights keep their data while capturing.
    assert_eq!(w.to_vec().expect("read"), [1.0; 16]);
    // An output must be computed by the capture.
    let refused = capture.finish(&[&w]);
    assert!(
        matches!(refused, Err(ComputeError::Capture(_))),
        "{refused:?}"
    );
    // The capture is closed: the symbolic tensors of it are refused by eager ops.
    assert!(matches!(ctx.relu(&y), Err(ComputeError::Symbolic { .. })));
    // And the context runs eagerly again.
    let z = ctx.relu(&w).expect("relu");
    assert_eq!(z.to_vec().expect("read"), [1.0; 16]);

    // A capture dropped unfinished records nothing.
    {
        let mut capture = ctx.capture().expect("capture");
        let x = capture.input(&[4]).expect("input");
        let _ = ctx.neg(&x).expect("neg");
    }
    assert_eq!(
        ctx.neg(&z).expect("neg").to_vec().expect("read"),
        [-1.0; 16]
    );

    // Replays refuse wrong inputs and outputs without submitting.
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[2, 4]).expect("input");
    let y = ctx.matmul(&x, &w).expect("matmul");
    let mut plan = capture.finish(&[&y]).expect("plan");
    assert!(matches!(plan.run(&[]), Err(ComputeError::Capture(_))));
    assert!(matches!(
        plan.run(&[Feed::Data(&[1.0; 7])]),
        Err(ComputeError::DataLength { .. })
    ));
    let wrong = ctx.empty(&[3]).expect("empty");
    assert!(matches!(
        plan.run_into(&[Feed::Data(&[1.0; 8])], &[&wrong]),
        Err(ComputeError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        plan.run(&[Feed::Tensor(&y)]),
        Err(ComputeError::Symbolic { .. })
    ));
    let other = context(gpu());
    let foreign = other.tensor(&[1.0; 8], &[2, 4]).expect("tensor");
    assert!(matches!(
        plan.run(&[Feed::Tensor(&foreign)]),
        Err(ComputeError::ForeignTensor { .. })
    ));
    assert_eq!(
        plan.run(&[Feed::Data(&[1.0; 8])]).expect("run")[0],
        [4.0; 8]
    );
}

#[test]
fn a_tensor_beyond_the_binding_limit_is_a_typed_error_of_the_build() {
    // Symbolic tensors take no memory: a capture can describe one larger than any binding, and
    // the build refuses it before allocating anything.
    let ctx = context(gpu());
    let limit = ctx.limits().max_storage_buffer_binding_size;
    let len = usize::try_from(limit / 4 + 16).expect("fits usize");
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[len]).expect("input");
    let y = ctx.neg(&x).expect("neg");
    let before = ctx.pool().stats().allocations.total;
    let refused = capture.finish(&[&y]);
    assert!(
        matches!(
            refused,
            Err(ComputeError::ExceedsLimit {
                limit_name: "max_storage_buffer_binding_size",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(ctx.pool().stats().allocations.total, before);
}

#[test]
fn the_matmul_options_of_the_context_are_captured() {
    // A context whose matmuls never split K: the plan runs what the eager ops would.
    let ctx = context_with_matmul(MatmulOptions {
        split_k: Some(1),
        ..MatmulOptions::default()
    });
    let mut rng = StdRng::seed_from_u64(8);
    let layers = layers(&ctx, &mut rng, &[1024, 12, 8]);
    let input = random(&mut rng, 9 * 1024);
    let want = eager(&ctx, &input, &[9, 1024], &layers);
    let mut plan = planned(&ctx, &[9, 1024], &layers, CaptureOptions::default());
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_close("no split", &got[0], &want[0]);
    assert_close("no split sums", &got[1], &want[1]);
}

#[test]
fn a_replay_in_flight_keeps_its_arena_when_the_plan_is_dropped() {
    // The plan (and its arena) is dropped right after `run_into` submitted: nothing the replay
    // uses is destroyed, and new tensors that take the arena's range and are written at once
    // (uploads land at the next submission) do not reach the replay in flight.
    let ctx = context(gpu());
    let mut rng = StdRng::seed_from_u64(9);
    let widths = [32, 64, 16];
    let layers = layers(&ctx, &mut rng, &widths);
    let input = random(&mut rng, 4 * widths[0]);
    let want = eager(&ctx, &input, &[4, widths[0]], &layers);
    for round in 0..3 {
        let mut plan = planned(&ctx, &[4, widths[0]], &layers, CaptureOptions::default());
        let arena_bytes = plan.arena().bytes();
        let out_p = ctx.empty(&[4, widths[2]]).expect("empty");
        let out_s = ctx.empty(&[4]).expect("empty");
        plan.run_into(&[Feed::Data(&input)], &[&out_p, &out_s])
            .expect("run_into");
        drop(plan);
        // Overwrite whatever now takes the arena's bytes.
        let len = usize::try_from(arena_bytes / 4).expect("fits");
        let scribble = ctx.tensor(&vec![f32::NAN; len], &[len]).expect("tensor");
        let _also = ctx.relu(&scribble).expect("relu");
        assert_close(
            &format!("round {round}"),
            &out_p.to_vec().expect("read"),
            &want[0],
        );
        assert_close(
            &format!("round {round} sums"),
            &out_s.to_vec().expect("read"),
            &want[1],
        );
    }
}

/// Issue 26, item 4: plans of two contexts must not share an arena (their replays are not
/// ordered with each other). The second context's capture is refused with a typed error and
/// changes nothing: no allocation, the arena as it was, the first plan still right, the second
/// context free to capture again.
#[test]
fn a_capture_refuses_the_arena_of_another_context() {
    let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    let first = Context::new(&pool, ContextOptions::default()).expect("context");
    let second = Context::new(&pool, ContextOptions::default()).expect("context");
    let mut rng = StdRng::seed_from_u64(26);
    let widths = [8, 16, 4];
    let first_layers = layers(&first, &mut rng, &widths);
    let second_layers = layers(&second, &mut rng, &widths);
    let arena = first.plan_arena();
    let shared = || CaptureOptions {
        arena: Some(arena.clone()),
        ..CaptureOptions::default()
    };
    let mut plan = planned(&first, &[3, widths[0]], &first_layers, shared());
    let bytes = arena.bytes();
    assert!(bytes > 0);
    let allocations = pool.stats().allocations.current;
    let mut capture = second.capture().expect("capture");
    let x = capture.input(&[3, widths[0]]).expect("input");
    let (p, s) = forward(&second, &x, &second_layers);
    let refused = capture.finish_with(&[&p, &s], shared());
    assert!(
        matches!(refused, Err(ComputeError::ForeignArena)),
        "{refused:?}"
    );
    assert!(refused
        .unwrap_err()
        .to_string()
        .contains("belongs to another context"));
    drop((p, s, x));
    assert_eq!(pool.stats().allocations.current, allocations);
    assert_eq!(arena.bytes(), bytes);
    let input = random(&mut rng, 3 * widths[0]);
    let want = eager(&first, &input, &[3, widths[0]], &first_layers);
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_close("the first context's plan", &got[0], &want[0]);
    // The second context captures again, with an arena of its own.
    let own = CaptureOptions {
        arena: Some(second.plan_arena()),
        ..CaptureOptions::default()
    };
    let mut plan = planned(&second, &[3, widths[0]], &second_layers, own);
    let want = eager(&second, &input, &[3, widths[0]], &second_layers);
    let got = plan.run(&[Feed::Data(&input)]).expect("run");
    assert_close("the second context's plan", &got[0], &want[0]);
}

/// Plans of two contexts on one pool, each in an arena of its own context, replayed with
/// `run_into` from two threads at once: every replay gives the eager result.
#[test]
fn plans_of_two_contexts_replay_from_two_threads_at_once() {
    const REPLAYS: usize = 160;
    let pool = Pool::new(gpu(), PoolOptions::default()).expect("pool");
    let widths = [24, 48, 40, 12];
    let rows = 7;
    let sides: Vec<_> = (0..2u64)
        .map(|side| {
            let ctx = Context::new(&pool, ContextOptions::default()).expect("context");
            let mut rng = StdRng::seed_from_u64(40 + side);
            let layers = layers(&ctx, &mut rng, &widths);
            let options = CaptureOptions {
                arena: Some(ctx.plan_arena()),
                ..CaptureOptions::default()
            };
            let plan = planned(&ctx, &[rows, widths[0]], &layers, options);
            let cases: Vec<(Vec<f32>, [Vec<f32>; 2])> = (0..4)
                .map(|_| {
                    let input = random(&mut rng, rows * widths[0]);
                    let want = eager(&ctx, &input, &[rows, widths[0]], &layers);
                    (input, want)
                })
                .collect();
            (ctx, layers, plan, cases)
        })
        .collect();
    let wrong: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = sides
            .into_iter()
            .map(|(ctx, _layers, mut plan, cases)| {
                scope.spawn(move || {
                    let out_p = ctx.empty(&[rows, widths[3]]).expect("output");
                    let out_s = ctx.empty(&[rows]).expect("output");
                    let mut wrong = 0;
                    for replay in 0..REPLAYS {
                        let (input, want) = &cases[replay % cases.len()];
                        plan.run_into(&[Feed::Data(input)], &[&out_p, &out_s])
                            .expect("run_into");
                        let got = [out_p.to_vec().expect("read"), out_s.to_vec().expect("read")];
                        let close = |got: &[f32], want: &[f32]| {
                            got.iter().zip(want).all(|(&g, &w)| {
                                (f64::from(g) - f64::from(w)).abs()
                                    <= 1e-5 * f64::from(w.abs()) + 1e-6
                            })
                        };
                        if !(close(&got[0], &want[0]) && close(&got[1], &want[1])) {
                            wrong += 1;
                        }
                    }
                    wrong
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect()
    });
    assert_eq!(wrong, [0, 0], "wrong replays of {REPLAYS} per thread");
}

#[test]
fn submitted_replays_run_ahead_and_feed_each_other() {
    use wgpu_pool::state::BufferRole;
    // A device of its own: its ledger counts this test's read-back buffers only.
    let gpu = &crate::gpu::fresh_gpu();
    let ctx = context(gpu);
    let mut capture = ctx.capture().expect("capture");
    let x = capture.input(&[5]).expect("input");
    let doubled = ctx.add(&x, &x).expect("add");
    let y = ctx
        .binary_scalar(wgpu_pool::compute::BinaryOp::Add, &doubled, 1.0)
        .expect("add 1");
    let mut plan = capture.finish(&[&y]).expect("finish");
    let f = |v: &[f32]| v.iter().map(|a| 2.0 * a + 1.0).collect::<Vec<f32>>();
    let input = [0.5, -3.0, 7.0, 0.0, 1.25];
    let kept = ctx.empty(&[5]).expect("empty");
    let mut read_back = Vec::new();
    for round in 0..3 {
        // Three replays in flight, each fed the one before on the GPU, read in reverse order.
        let first = plan
            .submit(&[Feed::Data(&input)], &[&kept])
            .expect("submit");
        let second = plan
            .submit(&[Feed::Tensor(&kept)], &[&kept])
            .expect("submit");
        let third = plan.submit(&[Feed::Tensor(&kept)], &[]).expect("submit");
        let once = f(&input);
        let twice = f(&once);
        assert_eq!(third.wait().expect("third")[0], f(&twice), "round {round}");
        assert_eq!(second.wait().expect("second")[0], twice, "round {round}");
        assert_eq!(first.wait().expect("first")[0], once, "round {round}");
        assert_eq!(
            kept.to_vec().expect("kept"),
            twice,
            "kept holds the second's"
        );
        // A run dropped unread gives its buffer back too.
        drop(plan.submit(&[Feed::Data(&input)], &[]).expect("submit"));
        read_back.push(gpu.accounted().bytes_of(BufferRole::PlanReadBack));
    }
    assert!(
        read_back.windows(2).all(|w| w[0] == w[1]) && read_back[0] > 0,
        "read-back buffers are reused: {read_back:?}"
    );
    let wrong = ctx.empty(&[4]).expect("empty");
    assert!(matches!(
        plan.submit(&[Feed::Data(&input)], &[&wrong]),
        Err(ComputeError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        plan.submit(&[Feed::Data(&input[..4])], &[]),
        Err(ComputeError::DataLength { .. })
    ));
}

#[test]
fn a_residual_add_and_its_layer_norm_fuse_with_the_bits_of_both() {
    use wgpu_pool::compute::cpu;
    for (limits, gpu) in both() {
        let ctx = context(gpu);
        let mut rng = StdRng::seed_from_u64(12);
        for (rows, cols) in [(3, 5), (16, 768), (2, 300), (2, 1500)] {
            let x = random(&mut rng, rows * cols);
            let r = random(&mut rng, rows * cols);
            let gamma = random(&mut rng, cols);
            let beta = random(&mut rng, cols);
            let (tg, tb) = (
                ctx.tensor(&gamma, &[cols]).unwrap(),
                ctx.tensor(&beta, &[cols]).unwrap(),
            );
            let forward = |a: &Tensor, b: &Tensor| -> Vec<Tensor> {
                let sum = ctx.add(a, b).unwrap();
                let normed = ctx.layer_norm(&sum, &tg, &tb, 1e-5).unwrap();
                // The sum goes on (a residual stream), and is an output too.
                let next = ctx.add(&sum, &normed).unwrap();
                vec![normed, next, sum]
            };
            let (tx, tr) = (
                ctx.tensor(&x, &[rows, cols]).unwrap(),
                ctx.tensor(&r, &[rows, cols]).unwrap(),
            );
            let eager: Vec<Vec<f32>> = forward(&tx, &tr)
                .iter()
                .map(|t| t.to_vec().unwrap())
                .collect();
            let mut capture = ctx.capture().expect("capture");
            let a = capture.input(&[rows, cols]).unwrap();
            let b = capture.input(&[rows, cols]).unwrap();
            let outputs = forward(&a, &b);
            let mut plan = capture
                .finish(&outputs.iter().collect::<Vec<_>>())
                .expect("finish");
            assert_eq!(plan.stats().fused_steps, 1, "{limits}: {:?}", plan.stats());
            let got = plan.run(&[Feed::Data(&x), Feed::Data(&r)]).unwrap();
            let what = format!("add_layer_norm {rows}x{cols} ({limits})");
            assert_eq!(got, eager, "{what}: the bits of the two ops");
            let (sum, normed) = cpu::add_layer_norm(&x, &r, &gamma, &beta, cols, 1e-5);
            assert_eq!(got[2], sum, "{what}: sum");
            assert_close(&what, &got[0], &normed);
        }
    }
}
