//! GPT-2 served in a web page: the tiny model (seeded weights, or a safetensors file the user
//! picks) with a paged KV cache from the pool, its segment map redrawn as sequences join and
//! leave, the memory summary, and `snapshot.pickle` (for pytorch.org/memory_viz) and
//! `trace.json` (for ui.perfetto.dev) offered for download. Every greedy token is checked
//! against the model's f64 CPU twin, and the page says so.
//!
//! Build the page with `sh web/build.sh` and serve `target/web` with any static server (e.g.
//! `python3 -m http.server -d target/web`), then open it in a browser with WebGPU. Natively this
//! example only says so.

#[cfg(not(target_arch = "wasm32"))]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Natively: the page's workload on the native adapter, its figures as JSON (the same code
    // path, awaited with pollster), for a comparison with the page's.
    let json = std::env::args().skip_while(|arg| arg != "--json").nth(1);
    let figures = pollster::block_on(async {
        let gpu = wgpu_pool::request_gpu_async(wgpu_pool::LimitsChoice::Adapter).await?;
        let weights =
            wgpu_pool::model::Gpt2Weights::random(&wgpu_pool::model::Gpt2Config::tiny(), 7)?;
        workload::run(&gpu, &weights, |_, _, _| Ok(())).await
    })?;
    let text = serde_json::to_string_pretty(&figures)?;
    println!("{text}");
    if let Some(path) = json {
        std::fs::write(path, text)?;
    }
    eprintln!(
        "(in a browser: build the page with `sh web/build.sh`, serve target/web and open it in a \
         browser with WebGPU)"
    );
    Ok(())
}

#[cfg(target_arch = "wasm32")]
fn main() {
    page::start();
}

/// What the page and the native run share: the served stream, the check of its tokens against
/// the twin, and the kernels' timings.
pub(crate) mod workload {
    use serde::Serialize;
    use web_time::Instant;
    use wgpu_pool::compute::{Context, ContextOptions, DType};
    use wgpu_pool::history::HistoryOptions;
    use wgpu_pool::model::Gpt2Weights;
    use wgpu_pool::paging::{KvLayout, RequestSpec, StreamSpec};
    use wgpu_pool::serve::{Completion, Gpt2, Server, ServerOptions};
    use wgpu_pool::{Gpu, Pool, PoolOptions};

    /// A chosen token counts as the twin's when its logit is within this of the best (f32
    /// against f64: only near-ties may differ).
    pub const NEAR_TIE: f32 = 1e-3;

    /// The figures of one run, as JSON.
    #[derive(Debug, Serialize)]
    pub struct Figures {
        /// The adapter, as wgpu names it.
        pub adapter: String,
        /// wgpu's backend.
        pub backend: String,
        /// Requests served.
        pub requests: usize,
        /// Tokens generated.
        pub tokens: usize,
        /// Tokens equal to the twin's greedy choice.
        pub equal: usize,
        /// Tokens within [`NEAR_TIE`] of it (near-ties).
        pub near_ties: usize,
        /// Seconds from the first step to the last.
        pub serve_seconds: f64,
        /// Tokens per second of that time.
        pub tokens_per_second: f64,
        /// The most KV blocks held at once.
        pub kv_peak_blocks: usize,
        /// Out-of-memory refusals.
        pub oom_count: u64,
        /// Each kernel's time per op (median of rounds), recorded and awaited in batches.
        pub kernels: Vec<KernelFigure>,
    }

    /// One kernel's time.
    #[derive(Debug, Serialize)]
    pub struct KernelFigure {
        /// The op and its shape.
        pub op: String,
        /// Microseconds per op: the median over rounds of a batch's time over its ops.
        pub microseconds: f64,
    }

    /// The page's stream: 10 seeded requests for a model of `weights`' configuration.
    pub fn requests(weights: &Gpt2Weights) -> Result<Vec<RequestSpec>, Box<dyn std::error::Error>> {
        let config = weights.config;
        Ok(StreamSpec {
            requests: 10,
            prompt_tokens: (4, 40),
            output_tokens: (4, 24),
            vocab_size: config.vocab_size,
            max_tokens: config.n_ctx,
            seed: 7,
        }
        .generate()?)
    }

    /// Serves the stream on `gpu` with a paged KV cache (`after_step` sees the pool, the server
    /// and the requests finished so far after every step), checks every token against the twin,
    /// then times the kernels.
    pub async fn run(
        gpu: &Gpu,
        weights: &Gpt2Weights,
        mut after_step: impl FnMut(
            &Pool,
            &Server,
            &[Completion],
        ) -> Result<(), Box<dyn std::error::Error>>,
    ) -> Result<Figures, Box<dyn std::error::Error>> {
        let pool = Pool::new(
            gpu,
            PoolOptions {
                history: Some(HistoryOptions::default()),
                ..PoolOptions::default()
            },
        )?;
        let context = Context::new(&pool, ContextOptions::default())?;
        let model = Gpt2::upload(&context, weights, DType::F32)?;
        let options = ServerOptions {
            max_batch: 4,
            layout: KvLayout::Paged,
            block_tokens: 8,
            budget_bytes: Some(pool.stats().reserved_bytes.current + (12 << 20)),
            ..ServerOptions::default()
        };
        let mut server = Server::new(&context, model, options)?;
        server.warm_up_async().await?;
        let requests = requests(weights)?;
        let ids: Vec<u64> = requests
            .iter()
            .map(|request| server.submit(request))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        let mut finished: Vec<Completion> = Vec::new();
        while server.busy() {
            server.step_ahead_async().await?;
            server.label_kv()?;
            finished.extend(server.take_finished());
            after_step(&pool, &server, &finished)?;
        }
        let serve_seconds = started.elapsed().as_secs_f64();
        let (mut tokens, mut equal, mut near_ties) = (0, 0, 0);
        for (request, id) in requests.iter().zip(&ids) {
            let done = finished
                .iter()
                .find(|done| done.id == *id)
                .ok_or_else(|| format!("request {id} did not finish"))?;
            let agreement = weights.greedy_agreement(&request.prompt, &done.output, NEAR_TIE)?;
            tokens += done.output.len();
            equal += agreement.equal;
            near_ties += agreement.near_ties;
        }
        Ok(Figures {
            adapter: gpu.info.name.clone(),
            backend: format!("{:?}", gpu.info.backend),
            requests: ids.len(),
            tokens,
            equal,
            near_ties,
            serve_seconds,
            tokens_per_second: tokens as f64 / serve_seconds,
            kv_peak_blocks: server.stats().kv_peak.held_blocks,
            oom_count: pool.stats().oom_count,
            // A pool of their own: the server's budget holds the served one.
            kernels: kernels(&Context::new(
                &Pool::new(gpu, PoolOptions::default())?,
                ContextOptions::default(),
            )?)
            .await?,
        })
    }

    /// Rounds of each kernel; ops in a round's batch.
    const ROUNDS: usize = 5;
    const OPS: usize = 20;

    /// The time per op of a few kernels: `OPS` recorded, then awaited, `ROUNDS` times (after
    /// one round that compiles), the median round's time over `OPS`.
    async fn kernels(context: &Context) -> Result<Vec<KernelFigure>, Box<dyn std::error::Error>> {
        let values = |len: usize| {
            (0..len)
                .map(|i| (i % 97) as f32 / 97.0 - 0.5)
                .collect::<Vec<_>>()
        };
        let x = context.tensor(&values(1 << 20), &[1024, 1024])?;
        let a = context.tensor(&values(256 * 256), &[256, 256])?;
        let rows = context.tensor(&values(64 * 768), &[64, 768])?;
        let gamma = context.tensor(&vec![1.0; 768], &[768])?;
        let beta = context.tensor(&vec![0.0; 768], &[768])?;
        type Op<'a> = Box<dyn Fn() -> Result<(), wgpu_pool::compute::ComputeError> + 'a>;
        let cases: Vec<(&str, Op)> = vec![
            (
                "add 1024x1024 f32",
                Box::new(|| context.add(&x, &x).map(drop)),
            ),
            (
                "matmul 256x256x256 f32",
                Box::new(|| context.matmul(&a, &a).map(drop)),
            ),
            (
                "softmax_rows 64x768",
                Box::new(|| context.softmax_rows(&rows, 0.125, None).map(drop)),
            ),
            (
                "layer_norm 64x768",
                Box::new(|| context.layer_norm(&rows, &gamma, &beta, 1e-5).map(drop)),
            ),
        ];
        let mut figures = Vec::new();
        for (op, run) in cases {
            let mut rounds = Vec::new();
            for round in 0..=ROUNDS {
                let started = Instant::now();
                for _ in 0..OPS {
                    run()?;
                }
                context.sync_async().await?;
                if round > 0 {
                    rounds.push(started.elapsed().as_secs_f64() * 1e6 / OPS as f64);
                }
            }
            rounds.sort_by(f64::total_cmp);
            figures.push(KernelFigure {
                op: op.into(),
                microseconds: rounds[ROUNDS / 2],
            });
        }
        Ok(figures)
    }
}

#[cfg(target_arch = "wasm32")]
mod page {
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
    use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
    use wgpu_pool::report::{export_files, segments_svg, Report};
    use wgpu_pool::serve::{Completion, Server};
    use wgpu_pool::{request_gpu_async, LimitsChoice, Pool};

    use crate::workload;

    /// Serves the seeded model at once, and a file's model when one is picked.
    pub fn start() {
        std::panic::set_hook(Box::new(|info| {
            set_status("failed", &format!("panic: {info}"));
        }));
        let picked = Closure::<dyn FnMut(web_sys::Event)>::new(|event: web_sys::Event| {
            let Some(input) = event
                .target()
                .and_then(|target| target.dyn_into::<web_sys::HtmlInputElement>().ok())
            else {
                return;
            };
            let Some(file) = input.files().and_then(|files| files.get(0)) else {
                return;
            };
            wasm_bindgen_futures::spawn_local(async move {
                let bytes = match wasm_bindgen_futures::JsFuture::from(file.array_buffer()).await {
                    Ok(buffer) => js_sys::Uint8Array::new(&buffer).to_vec(),
                    Err(error) => return set_status("failed", &format!("{error:?}")),
                };
                match Gpt2Weights::from_bytes(&bytes, None) {
                    Ok(loaded) => serve_and_report(loaded.weights, &file.name()).await,
                    Err(error) => set_status("failed", &format!("{}: {error}", file.name())),
                }
            });
        });
        if let Some(input) = element("weights") {
            input
                .add_event_listener_with_callback("change", picked.as_ref().unchecked_ref())
                .ok();
        }
        picked.forget();
        wasm_bindgen_futures::spawn_local(async {
            match Gpt2Weights::random(&Gpt2Config::tiny(), 7) {
                Ok(weights) => serve_and_report(weights, "seeded tiny GPT-2").await,
                Err(error) => set_status("failed", &error.to_string()),
            }
        });
    }

    async fn serve_and_report(weights: Gpt2Weights, what: &str) {
        if let Err(error) = serve(weights, what).await {
            set_status("failed", &format!("{what}: {error}"));
        }
    }

    /// Serves the stream with `weights`, redrawing the page after every step, and shows the
    /// check of every token against the twin and the figures.
    async fn serve(weights: Gpt2Weights, what: &str) -> Result<(), Box<dyn std::error::Error>> {
        set_status("running", &format!("{what}: asking the browser for a GPU"));
        let gpu = request_gpu_async(LimitsChoice::Adapter).await?;
        set_status("running", &format!("{what} on {}: serving", gpu.info.name));
        let prompts: Vec<usize> = workload::requests(&weights)?
            .iter()
            .map(|request| request.prompt.len())
            .collect();
        let mut last_pool = None;
        let figures = workload::run(&gpu, &weights, |pool, server, finished| {
            last_pool = Some(pool.clone());
            draw(pool, server, finished, &prompts)
        })
        .await?;
        if let Some(pool) = &last_pool {
            offer_downloads(pool)?;
        }
        let wrong = figures.tokens - figures.equal - figures.near_ties;
        if let Some(status) = element("status") {
            status
                .set_attribute("data-tokens", &figures.tokens.to_string())
                .ok();
            status
                .set_attribute("data-equal", &figures.equal.to_string())
                .ok();
        }
        if let Some(out) = element("figures") {
            out.set_text_content(Some(&serde_json::to_string_pretty(&figures)?));
        }
        set_status(
            if wrong == 0 { "done" } else { "failed" },
            &format!(
                "{what}: {} tokens served ({:.0} tokens/s), {} equal to the f64 reference's \
                 greedy choice, {} within {} of it (near-ties), {wrong} not; {} KV blocks at \
                 most; {} out-of-memory errors",
                figures.tokens,
                figures.tokens_per_second,
                figures.equal,
                figures.near_ties,
                workload::NEAR_TIE,
                figures.kv_peak_blocks,
                figures.oom_count
            ),
        );
        Ok(())
    }

    /// The segment map, the memory summary and every request's tokens so far (`finished`: the
    /// requests done, which the server no longer holds).
    fn draw(
        pool: &Pool,
        server: &Server,
        finished: &[Completion],
        prompts: &[usize],
    ) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(map) = element("map") {
            map.set_inner_html(&segments_svg(&pool.memory_state())?);
        }
        if let Some(summary) = element("summary") {
            summary.set_text_content(Some(&Report::from_pool(pool).to_string()));
        }
        if let Some(list) = element("requests") {
            let lines: Vec<String> = prompts
                .iter()
                .enumerate()
                .map(|(id, prompt)| {
                    let id = id as u64;
                    let tokens = server.tokens(id).unwrap_or_else(|| {
                        finished
                            .iter()
                            .find(|done| done.id == id)
                            .map_or(&[], |done| done.output.as_slice())
                    });
                    let tokens: Vec<String> = tokens.iter().map(u32::to_string).collect();
                    format!(
                        "<li>request {id} (prompt of {prompt}): {}</li>",
                        tokens.join(" ")
                    )
                })
                .collect();
            list.set_inner_html(&lines.concat());
        }
        if let Some(stats) = element("stats") {
            let state = server.stats();
            stats.set_text_content(Some(&format!(
                "running {}, waiting {}, steps {}, tokens {}, KV blocks in use {} of {}",
                server.running(),
                server.waiting(),
                state.steps,
                state.generated_tokens,
                server.blocks().held_blocks(),
                server.cache().num_blocks()
            )));
        }
        Ok(())
    }

    /// Links that download `snapshot.pickle` and `trace.json`.
    fn offer_downloads(pool: &Pool) -> Result<(), Box<dyn std::error::Error>> {
        for file in export_files(pool)? {
            let id = match file.name {
                "snapshot.pickle" => "snapshot",
                "trace.json" => "trace",
                _ => continue,
            };
            let Some(link) = element(id) else {
                continue;
            };
            let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(file.bytes.as_slice()));
            let blob = web_sys::Blob::new_with_u8_array_sequence(&parts).map_err(js_error)?;
            let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(js_error)?;
            link.set_attribute("href", &url).map_err(js_error)?;
            link.set_attribute("download", file.name)
                .map_err(js_error)?;
        }
        Ok(())
    }

    fn js_error(error: JsValue) -> String {
        format!("{error:?}")
    }

    fn element(id: &str) -> Option<web_sys::Element> {
        web_sys::window()?.document()?.get_element_by_id(id)
    }

    /// Sets the status line and its state (`running`, `done`, `failed`), which the CI check reads.
    fn set_status(state: &str, text: &str) {
        if let Some(status) = element("status") {
            status.set_attribute("data-state", state).ok();
            status.set_text_content(Some(text));
        }
        web_sys::console::log_1(&format!("{state}: {text}").into());
    }
}
