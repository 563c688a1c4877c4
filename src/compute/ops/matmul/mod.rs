//! Matmul, f32: `C[M, N] = A[M, K] · B[K, N]`, row-major, any sizes, with an optional fused
//! epilogue `act(A·B + bias) + residual` (bias over columns, activation, then a residual of C's
//! shape: [`Epilogue`]), and for few rows an optional layer-norm prologue
//! ([`Context::matmul_layer_norm`](crate::compute::Context::matmul_layer_norm), below). Kernels:
//! `shaders/matmul.wgsl` and, for split-K, `shaders/matmul_reduce.wgsl`. CPU twins:
//! [`crate::compute::cpu::matmul`], [`crate::compute::cpu::matmul_with`] (the epilogue),
//! [`crate::compute::cpu::matmul_layer_norm`].
//!
//! # Tiles
//!
//! A workgroup computes a `bm × bn` block of C with `(bm / tm) · (bn / tn)` invocations, each
//! holding `tm × tn` outputs in registers (8×8, 16×8, 8×16, 4×8, 8×4, 4×16 or 16×4; see
//! [`MatmulTiles::ALL`]); it walks K in steps of `bk` through two workgroup-memory buffers (A
//! stored transposed for vec4 reads). The large tile — the first of [`MatmulOptions::large_tiles`] the device allows:
//! 128×256×16 with 8×16 outputs per invocation (256 invocations, 48 KiB of workgroup memory)
//! where the device has 48 KiB, else 128×128×8 with 16×8 (128 invocations, 16 KiB, which every
//! WebGPU device has) — is used when it yields at least [`MatmulOptions::min_workgroups`]
//! workgroups; otherwise the small one (64×64×8: 64
//! invocations, 8 KiB), or for at most 32 rows the thin one ([`MatmulOptions::thin_tiles`],
//! 32×128×16 with 4×8 outputs per invocation: 128 invocations, 20 KiB), and when even that leaves
//! the GPU idle, split-K: `splits` workgroups along K (as many as keep the workgroups within
//! [`MatmulOptions::split_workgroups`], one wave) each write a partial product, and a second
//! kernel adds them and runs the epilogue.
//! Tiles that do not fit the device's limits (workgroup memory, invocations) are skipped.
//!
//! # Autotuning
//!
//! The rules above choose a tile and a split from counts of workgroups. With
//! [`MatmulOptions::autotune`] (by default on every adapter but a software one), the first matmul
//! of a shape class (M rounded up to a power of two, N, K) that the tiled kernel serves, and
//! whose automatic plan is not the large tile unsplit, times candidate plans instead — the
//! automatic one, and the large, small, thin, 64×128×16, 64×128×16/4×8 and 128×64×16 tiles the
//! device takes, each with 1, 2, 4, 8 and 16 splits of at least `min_split_depth` — in a pool and
//! context of their own (given back after, so tuning leaves the context's pool as it was; a tuner
//! that cannot run leaves the rules' plan), with operands of the class's size: for five rounds
//! each candidate is timed right after the automatic plan (GPU timestamps where the adapter has
//! them) and scores the median of its time over the automatic plan's, so that a clock that moves
//! while it tunes does not decide (a pair, timed back to back, sees one clock). The fastest serves the
//! class from then on, in every context of the process on the same device with the same
//! options. The narrow kernel is tuned the same way for each shape (M, N, K): its automatic plan
//! and, for each power of two of lanes from 2 to 128 that N fills, no split and the splits of K
//! that give from a quarter to twice `min_workgroups` workgroups; with 8 rows or more, each of
//! these also with the rows in 2 and 4 groups where they divide M
//! ([`MatmulOptions::narrow_row_groups`]: each workgroup then keeps fewer sums, and the
//! workgroups multiply). A product with a residual or a layer-norm prologue follows the plan of
//! the plain product of its shape, tuned or not: nothing is tuned for them apart.
//!
//! # Few rows
//!
//! With at most [`MatmulOptions::NARROW_MAX_ROWS`] rows (a small batch) and K, N multiples of 4,
//! a tile would be mostly empty and would walk K serially; the narrow kernel
//! (`shaders/matmul_narrow.wgsl`) computes a matrix-vector style product instead, whose time is
//! reading B once. Each workgroup of 256 owns `narrow_lanes` vec4 columns of C and one chunk of
//! K; its invocations take the vec4 rows of the chunk in turn (`256 / narrow_lanes` slices), four
//! at a time (sixteen independent vec4 loads of B in flight per invocation, rows of B read as
//! `16 · narrow_lanes` contiguous bytes), then add their slices: first within each subgroup by
//! butterfly shuffles, where the device has subgroups of a fixed size wider than the lanes
//! ([`MatmulOptions::narrow_subgroups`]; on the H200, 32: a workgroup of 4 lanes is left with 8
//! slices, all eight rows in one pass), then in workgroup memory (a halving tree down to 8
//! slices, then one invocation per output; as many rows at a time as 16 KiB hold). Without a split
//! (one chunk: all of K) that is one dispatch storing C with the epilogue; with `splits` chunks
//! along the grid's z, each workgroup stores its partial products `[splits, M, N]` and the
//! split-K reduction (`shaders/matmul_reduce.wgsl`, as for the tiled kernel) adds them and runs
//! the epilogue. With the rows in groups, the workgroups of each group of rows follow those of
//! the one before, each multiplying its rows by the same columns of B.
//!
//! The epilogue — the bias, the activation, then the residual, added in f32 before C's one
//! rounding — runs where C is stored: in the narrow, tiled or cooperative kernel, or where K is
//! split in the reduction (every kernel reads the residual through accessors the host writes
//! with its binding, after the bias's). A device whose `max_storage_buffers_per_shader_stage`
//! cannot bind it gets the product, then an `add` (one dispatch more).
//!
//! The automatic plan ([`MatmulOptions::narrow_lanes`], [`MatmulOptions::narrow_splits`]): on a
//! GPU the widest workgroups (up to 64 vec4 columns, at least 2: 32 contiguous bytes of each row
//! of B) that still give `min_workgroups / 2` workgroups along N. K is split only where the lanes
//! chosen give fewer than a quarter of those (N below 264 on the H200: a split costs a second
//! dispatch, and 33 or more workgroups with many loads in flight per invocation keep HBM busy),
//! for about `min_workgroups / 2` workgroups in all (at most `max_splits`), as long as each
//! invocation keeps at least 8 vec4 rows of K per split. So (M × K × N) 8×1024×1024 and
//! 1×1024×1024 run one dispatch of 128 workgroups (2 lanes, 128 slices, two steps of K each),
//! 4×1024×4096, 1×4096×4096 and 8×4096×4096 of 256 (4 lanes, 64 slices; four and sixteen steps
//! each); 3×16384×64 splits K 4 ways over 8 workgroups along N. On a software GPU: 64 lanes, no
//! split.
//!
//! Measured on the H200 before this design (one dispatch, 2 to 64 lanes, two steps of K per
//! invocation at 8×1024×1024 followed by a 7-level tree over 128 slices, eight rows in two
//! passes; `bench_kernels --large --matmul 8x1024x1024`): 15 µs against 41 µs for the 64×64 tile
//! with split-K 4 at 8×1024×1024, 8.5 against 40 µs at 1×1024×1024, 76 against 766 µs at
//! 8×4096×4096; 2.67 TB/s of B at 1×4096×4096 (PyTorch 3.55).
//!
//! Each variant is compiled for its case: `vec4` (K and N multiples of 4: vec4 loads of A and B,
//! vec4 stores of C) or element loads and stores (the bindings declared as `array<f32>`);
//! `edges` (a partial tile somewhere: masked loads and stores) or none. The kernel's entry point
//! is written on the host with the K steps of a tile and the outputs of an invocation unrolled
//! (`kernels/matmul.rs`; its outline is in `shaders/matmul.wgsl`).
//!
//! ## The layer-norm prologue
//!
//! [`Context::matmul_layer_norm`](crate::compute::Context::matmul_layer_norm) multiplies the
//! layer norm of A's rows by B: a transformer's `LN(x) · W`, which at decode time is a few rows
//! whose normalized copy costs a dispatch of its own. Where the narrow kernel runs, it folds the
//! layer norm into its loads: each workgroup first computes the mean and `1 / √(var + eps)` of
//! each of its rows over the whole of K, in f32 (two passes over its rows of A, which are small:
//! the invocations dealt over the rows, their parts added by one tree in the workgroup memory
//! the sums use later), then normalizes each vec4 of A as it loads it in the loop over K, with
//! the vec4s of gamma and beta of the same step, rounded to the element type as the layer norm
//! stores it. With a split along K each split computes the statistics of its rows whole; with
//! the rows in groups each group its own. One dispatch (two with a split) where the layer norm
//! and the product took two; seven storage bindings at most (A, B, C, the bias, the residual,
//! gamma, beta), within WebGPU's default of eight: a device that binds fewer, and every product
//! the narrow kernel does not run, records the layer norm and the product instead.
//!
//! # Cooperative matrices (f16 on the tensor cores)
//!
//! On a device opened with [`GpuOptions::cooperative_matrix`](crate::GpuOptions::cooperative_matrix)
//! whose adapter offers 16×16×16 products of f16 into f32, with f16 and subgroups of a fixed 32
//! (the H200 under Vulkan), f16 matmuls of at least [`MatmulOptions::cooperative_min_rows`](crate::compute::MatmulOptions::cooperative_min_rows) rows
//! (16) run on cooperative matrices (`shaders/matmul_coop.wgsl`; [`MatmulPlan::cooperative`]
//! names the tile, [`CoopTiles`](crate::compute::CoopTiles)): a workgroup of 4 (or 8) subgroups computes a `bm × bn` block
//! of C, each subgroup `wm × wn` of it in 16×16 f32 accumulators; K is walked in slabs of 32,
//! A and B staged in workgroup memory as `vec4<f16>` rows padded by 8 elements (zero outside
//! the operands, so that odd shapes need no branch around the cooperative operations), the next
//! slab fetched into registers while the current one is multiplied; the epilogue stores each
//! accumulator to workgroup memory, adds the bias, activates, adds the residual, masks the edges
//! and rounds once to f16 (so at 16 rows and more an f16 `matmul_layer_norm` records the layer
//! norm and the product there). The tile: 32×128 for at most 32 rows, else the largest of 128×256, 128×128 and 64×128
//! that gives at least `min_workgroups / 2` block tiles, else 64×64 (each only where the
//! device's workgroup memory holds it; any named tile may be forced,
//! [`MatmulOptions::cooperative_tiles`](crate::compute::MatmulOptions::cooperative_tiles)); K is split as for
//! the tiled kernel where the block tiles are fewer than `min_workgroups / 2`. Fewer rows, f32
//! operands, and every other device keep the kernels below (so lavapipe, GL and WebGPU plans
//! are unchanged); f32 operands take the same plans as f16 ones only under the opt-in
//! [`MatmulOptions::cooperative_f32_as_f16`](crate::compute::MatmulOptions::cooperative_f32_as_f16)
//! (the kernel reads f32 and rounds each element to f16 as it fetches the slab, accumulates
//! in f32 and stores f32: TF32's mantissa with f16's range, which the caller guarantees). With [`MatmulOptions::autotune`](crate::compute::MatmulOptions::autotune) the first f16 product of a shape class (M
//! rounded up to a power of two, N, K) times the rules' plan and every tile the device takes
//! (with 2, 4, 8 and 16 splits too where the tile leaves the GPU idle), as the tiled kernel's
//! candidates are timed, and the fastest serves the class. A 128×128 tile of this design ran 4096³ at 230 TFLOP/s on the H200 in a
//! scratch probe (issue 28; this crate's f16 kernel: 43).
//!
//! # Measured on an H200 (Vulkan, driver 580, `bench_kernels`)
//!
//! The lent H200 holds its 1,980 MHz SM clock for about 3 s of load, then runs at 660–900 MHz
//! (cool and far below its power limit; `nvidia-smi` beside the benchmark), so the later cases of
//! one long `bench_kernels --large` process run 35–60% slower whatever the tile. Tiles are
//! compared at boost clock, in fresh processes: `bench_kernels --large --only matmul --matmul
//! 4096x4096x4096 --tile T`, one process per tile, every tile twice.
//!
//! The main loop fetches the next tile from global memory unconditionally (the last tile is
//! fetched again rather than branching around the fetch), so the driver's compiler can
//! interleave those loads with the products of the current tile. That alone took 128×128×8 from
//! 34.0 to 39.4 TFLOP/s and 128×128×8/16×8 from 39.7 to 40.4 at 4096³. With it (two fresh
//! processes per tile, the figures of a tile within 0.1):
//!
//! | tile (outputs per invocation) | invocations | workgroup memory | TFLOP/s at 4096³ |
//! |---|---|---|---|
//! | 128×256×16/8×16 (the default where 48 KiB fit) | 256 | 48 KiB | 45.2 |
//! | 256×128×8/16×8 | 256 | 24 KiB | 43.0 |
//! | 64×256×8/8×16 | 128 | 20 KiB | 42.6 |
//! | 128×128×8/16×8 (the default under 48 KiB) | 128 | 16 KiB | 40.4 |
//! | 128×128×8/8×16 | 128 | 16 KiB | 40.3 |
//! | 256×128×16/16×8 | 256 | 48 KiB | 40.1 |
//! | 128×128×16 | 256 | 32 KiB | 39.7–39.8 |
//! | 128×128×8 | 256 | 16 KiB | 39.4 |
//! | 256×64×8/16×8 | 128 | 20 KiB | 38.0 |
//! | 64×128×8 | 128 | 12 KiB | 37.4–37.5 |
//! | 128×64×8 | 64 | 12 KiB | 35.3 |
//! | 128×128×16/16×8 | 128 | 32 KiB | 24.2 |
//!
//! With the automatic plan: 45.2 at 4096³ (38.0 with wgpu's bounds checks), 45.9 at 8192³, 34.6
//! at 2048³ (64×64×8), 28.7 at 1024³ (64×64×8, split-K 2), 19.4 at 64×4096×4096 (64×64×8,
//! split-K 5). cuBLAS without TF32 reaches about 51. Tried and dropped: an XOR-swizzled and a
//! padded A tile in workgroup memory (no gain), global loads two tiles ahead (slower).

//!
//! # Files
//!
//! - `select.rs`: the rules (the cooperative matmul's too, `cooperative_plan`), a pure function of the options, the device's caps
//!   (`DeviceCaps`: limits, features, subgroup sizes, adapter, as plain data) and the shape, and the candidates the
//!   autotuner times (no GPU: its tests describe devices);
//! - `tune.rs`: the autotuner: its choice from measured times (pure), and its measuring, in a
//!   pool and context of its own; [`Context::matmul_plan`](crate::compute::Context::matmul_plan);
//! - `record.rs`: [`Context::matmul`](crate::compute::Context::matmul) and its epilogue,
//!   [`Context::matmul_layer_norm`](crate::compute::Context::matmul_layer_norm), recording a
//!   plan's dispatches.

mod record;
mod select;
mod tune;

pub use record::Epilogue;
pub use select::MatmulPlan;
