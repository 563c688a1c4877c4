//! A GPT-2 server over a paged KV cache with continuous batching and admission by predicted
//! memory: [`Server`].

use std::collections::{BTreeMap, VecDeque};
use web_time::Instant;

use super::error::ServeError;
use super::kv::KvCache;
use super::model::{Gpt2, Head, StepKind, StepTensors};
use super::options::{Execution, ServerOptions};
use super::sizing::{memory_plan, MemoryPlan};
use super::stats::{Completion, ServerStats};
use super::step::{capture, feeds, step_shapes, StepShape};
use crate::compute::{Context, DType, Plan, PlanArena, PlanRun, PlanStats, Tensor};
use crate::model::Gpt2Weights;
use crate::paging::{BlockManager, BlockState, KvLayout, RequestSpec, StepRows};
use crate::scheduler::{ScheduledStep, Scheduler, SchedulerOptions, SchedulerStats};
use crate::BudgetScope;

/// A step's sampled tokens, being computed: by a submitted plan, or in the eager ops' tensor.
enum Tokens {
    Run(PlanRun),
    Eager(Tensor),
}

impl Tokens {
    /// The tokens, as f32 ids (waiting for the step).
    fn wait(self) -> Result<Vec<f32>, ServeError> {
        match self {
            Tokens::Run(run) => Ok(run.wait()?.swap_remove(0)),
            Tokens::Eager(tensor) => Ok(tensor.to_vec()?),
        }
    }

    /// [`Tokens::wait`] without blocking the thread.
    async fn wait_async(self) -> Result<Vec<f32>, ServeError> {
        match self {
            Tokens::Run(run) => Ok(run.wait_async().await?.swap_remove(0)),
            Tokens::Eager(tensor) => Ok(tensor.to_vec_async().await?),
        }
    }
}

/// A step submitted and not yet finished.
struct InFlight {
    tokens: Tokens,
    /// Sampled rows.
    samples: usize,
}

/// Serves GPT-2 requests: continuous batching (sequences join and leave between steps), a KV
/// cache of blocks from the pool, and admission by memory. What each step runs is decided by a
/// GPU-free [`Scheduler`] (see [`crate::scheduler`]): admission reserves every block a request
/// can reach ([`Admission::Reserve`](crate::scheduler::Admission::Reserve), the default: no
/// admitted request ever meets an out-of-memory error) or admits optimistically and preempts
/// the newest sequence when the cache is full
/// ([`Admission::Optimistic`](crate::scheduler::Admission::Optimistic)); with prefix caching
/// ([`ServerOptions::prefix_caching`]) requests that start with the same tokens share their
/// blocks. The steps' activations are reserved up front.
///
/// Each step mixes the newest token of every decoding sequence with prompt tokens of the
/// sequences being filled (up to [`ServerOptions::max_step_tokens`] rows) and samples the next
/// token greedily after each sequence's last row; the server executes the step the scheduler
/// returns and hands its tokens back. Planned steps can be pipelined ([`Server::step_ahead`],
/// which [`Server::run`] uses): the next step is submitted before the one in flight is read,
/// its decoding rows taking their newest tokens on the GPU.
pub struct Server {
    context: Context,
    model: Gpt2,
    cache: KvCache,
    scheduler: Scheduler,
    options: ServerOptions,
    max_blocks: usize,
    arena: PlanArena,
    /// Step plans by row count and whether the step is decode-only ([`StepKind::Decode`]).
    plans: BTreeMap<(usize, bool), Plan>,
    stats: ServerStats,
    /// Planned: the last step's sampled tokens, which the next step's fed rows read
    /// ([`StepRows::push_fed`]).
    sampled: Option<Tensor>,
    /// Steps submitted and not finished, oldest first (at most two, briefly).
    in_flight: VecDeque<InFlight>,
    /// The server's budget on the pool while it lives: dropped with the server, it puts back
    /// the budget the pool had before (unless it was changed meanwhile).
    _budget: Option<BudgetScope>,
    /// What the dry run said the server holds, which it made.
    plan: MemoryPlan,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("options", &self.options)
            .field("waiting", &self.scheduler.waiting())
            .field("running", &self.scheduler.running())
            .field("steps_in_flight", &self.in_flight.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server of `model` on `context`: sizes the KV cache (from the budget, after the weights
    /// and the steps' activations, or as `kv_blocks` says) by its dry run
    /// ([`Server::dry_run`]), makes it, and, for planned execution, captures one step plan per
    /// row count (powers of two up to `max_step_tokens`), all in one arena. It makes exactly
    /// what the dry run says ([`Server::memory_plan`]): the same blocks, the same activation
    /// bytes. With a budget, the pool's budget is set to it while the server lives
    /// ([`Pool::budget_scope`](crate::Pool::budget_scope)): dropping the server puts back the
    /// budget the pool had before (unless it was changed meanwhile).
    ///
    /// `model` may be given by value or by reference (`&model`): the server shares its tensors
    /// (no copy), and a model given by reference stays the caller's whatever the answer — a
    /// refused budget is tried again with other options without uploading the weights again.
    ///
    /// Errors: [`ServeError::Options`] for options that serve nothing; [`ServeError::Budget`]
    /// when the budget leaves no room for one sequence of the model's context; those of the
    /// ops and of the capture. A refused server leaves the pool's budget as it was.
    pub fn new(
        context: &Context,
        model: impl std::borrow::Borrow<Gpt2>,
        options: ServerOptions,
    ) -> Result<Self, ServeError> {
        let model = model.borrow();
        let plan = memory_plan(context, model, &options)?;
        let budget = options
            .budget_bytes
            .map(|budget| context.pool().budget_scope(Some(budget)));
        Self::build(context, model.clone(), options, plan, budget)
    }

    /// What a server of `model` on `context` under `options` would hold, said before anything
    /// of it is made: the pool's reservation before it, the weights' bytes, the steps'
    /// activations, the KV cache's blocks and bytes, and the sequences of a length it holds
    /// ([`MemoryPlan::sequences_for`]). [`Server::new`] with the same options on the same pool
    /// makes exactly this. Measuring the activations makes a KV cache of two blocks and gives it
    /// back, and trims the context (see [`MemoryPlan`]); nothing else is made. Errors as
    /// [`Server::new`]'s ([`ServeError::Budget`] with the same figures).
    pub fn dry_run(
        context: &Context,
        model: &Gpt2,
        options: &ServerOptions,
    ) -> Result<MemoryPlan, ServeError> {
        memory_plan(context, model, options)
    }

    /// The step plans' statistics (planned execution; none when eager), fewest rows first:
    /// one per row count a step is padded to, and whether it is the plan of decode-only steps
    /// ([`StepKind::Decode`]; row counts up to `max_batch`'s) or of any rows. `steps` is the
    /// dispatches a step of that plan runs.
    pub fn plan_stats(&self) -> impl Iterator<Item = (usize, bool, &PlanStats)> + '_ {
        self.plans
            .iter()
            .map(|(&(rows, decode), plan)| (rows, decode, plan.stats()))
    }

    /// What the server's dry run said it holds, which it made.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// [`Server::new`] once its dry run said `plan` (and the budget is set): makes the arena,
    /// the sampled tokens and the cache, each in segments sized for them, then the plans.
    fn build(
        context: &Context,
        model: Gpt2,
        options: ServerOptions,
        plan: MemoryPlan,
        budget: Option<BudgetScope>,
    ) -> Result<Self, ServeError> {
        let config = model.config();
        let max_blocks = config.n_ctx.div_ceil(options.block_tokens);
        let arena = context.plan_arena();
        let sampled = match options.execution {
            Execution::Planned => {
                arena.use_own_segments();
                arena.reserve(plan.arena_bytes(), "serve step plans")?;
                Some(context.zeros_labeled_in_own_segment(
                    &[options.max_batch],
                    DType::F32,
                    "serve sampled tokens",
                )?)
            }
            Execution::Eager => None,
        };
        let cache = KvCache::new(
            context,
            &config,
            options.block_tokens,
            plan.kv_blocks,
            model.dtype(),
        )?;
        let blocks =
            BlockManager::new(options.layout, options.block_tokens, cache.num_blocks())?
                .with_prefix_caching(options.prefix_caching && options.layout == KvLayout::Paged)?;
        let scheduler = Scheduler::new(
            SchedulerOptions {
                max_batch: options.max_batch,
                max_step_tokens: options.max_step_tokens,
                min_step_rows: options.min_step_rows,
                max_blocks,
                admission: options.admission,
            },
            blocks,
        )?;
        let mut server = Self {
            context: context.clone(),
            model,
            cache,
            scheduler,
            max_blocks,
            arena,
            plans: BTreeMap::new(),
            stats: ServerStats::default(),
            _budget: budget,
            plan,
            options,
            sampled,
            in_flight: VecDeque::new(),
        };
        if server.options.execution == Execution::Planned {
            for (rows, kind) in server.step_plans() {
                let plan = server.capture_step(rows, kind, &server.cache)?;
                server.plans.insert((rows, kind == StepKind::Decode), plan);
            }
        }
        Ok(server)
    }

    /// The plan of a step of `rows` rows over `cache`, in the server's arena.
    fn capture_step(
        &self,
        rows: usize,
        kind: StepKind,
        cache: &KvCache,
    ) -> Result<Plan, ServeError> {
        let shape = StepShape {
            rows,
            samples: self.options.max_batch,
            max_blocks: self.max_blocks,
            kind,
        };
        capture(&self.context, &self.model, cache, shape, Some(&self.arena))
    }

    /// The step shapes the server plans (and warms up): every row count steps are padded to
    /// for any rows, and those up to `max_batch`'s for decode-only steps.
    fn step_plans(&self) -> Vec<(usize, StepKind)> {
        step_shapes(&self.options, self.scheduler.step_row_counts())
    }

    /// Runs a step of padding rows (each writing block 0 only, which no sequence holds) for
    /// every row count steps are padded to (powers of two up to `max_step_tokens`), planned or
    /// eager: the drivers that compile pipelines at their first use do it here, and the matmul
    /// tuner measures each shape here, not in a request's step. Finishes a step in flight first
    /// ([`Server::sync`]); changes no sequence and no statistic otherwise.
    pub fn warm_up(&mut self) -> Result<(), ServeError> {
        self.sync()?;
        for (step, decode) in self.warm_up_steps()? {
            self.run_rows(&step, decode)
                .and_then(Tokens::wait)
                .map_err(|error| self.stop_running(error))?;
        }
        Ok(())
    }

    /// [`Server::warm_up`] without blocking the thread (for async code and browsers).
    pub async fn warm_up_async(&mut self) -> Result<(), ServeError> {
        self.sync_async().await?;
        for (step, decode) in self.warm_up_steps()? {
            let tokens = self
                .run_rows(&step, decode)
                .map_err(|error| self.stop_running(error))?;
            if let Err(error) = tokens.wait_async().await {
                return Err(self.stop_running(error));
            }
        }
        Ok(())
    }

    /// The steps of padding rows [`Server::warm_up`] runs: one per row count steps are padded to.
    /// Each padding step is a valid decode-only step too (its rows write block 0 only): the
    /// decode plans are warmed with the same rows.
    fn warm_up_steps(&self) -> Result<Vec<(StepRows, bool)>, ServeError> {
        let padding = self.scheduler.padding_steps()?;
        let shapes = self.step_plans();
        let mut steps = Vec::with_capacity(shapes.len());
        for step in padding {
            for &(rows, kind) in &shapes {
                if rows == step.capacity() {
                    steps.push((step.clone(), kind == StepKind::Decode));
                }
            }
        }
        Ok(steps)
    }

    /// Queues a request; it is admitted when its KV blocks are free. Returns its id (ids count
    /// up from 0 in submission order). Errors: [`ServeError::Tokens`] for an empty prompt, a
    /// token outside the vocabulary, or a prompt and outputs longer than the model's context;
    /// [`ServeError::NoOutputs`]; [`ServeError::Paging`] for a request the empty cache could
    /// not admit. A request of prompt and outputs `L` holds `L − 1` tokens in the cache (the
    /// last output is sampled, never run).
    pub fn submit(&mut self, request: &RequestSpec) -> Result<u64, ServeError> {
        let config = self.model.config();
        Gpt2Weights::check_tokens(&config, &request.prompt)?;
        if request.max_new_tokens == 0 {
            return Err(ServeError::NoOutputs);
        }
        if request.reach_tokens() > config.n_ctx {
            return Err(crate::model::TokensError::TooLong {
                tokens: request.reach_tokens(),
                n_ctx: config.n_ctx,
            }
            .into());
        }
        Ok(self.scheduler.submit(request, Instant::now())?)
    }

    /// Whether requests are waiting or in flight (or a step is).
    pub fn busy(&self) -> bool {
        self.scheduler.busy() || !self.in_flight.is_empty()
    }

    /// Runs one step: admits what fits, runs every decoding sequence's newest token and prompt
    /// tokens of the sequences being filled, and appends each sampled next token. Returns the
    /// tokens generated (0 when nothing is queued), those of a step [`Server::step_ahead`] left
    /// in flight included. A failed step stops the running requests
    /// ([`ServeError::StepFailed`]).
    pub fn step(&mut self) -> Result<usize, ServeError> {
        self.advance(false)
    }

    /// [`Server::step`] without blocking the thread (for async code and browsers).
    pub async fn step_async(&mut self) -> Result<usize, ServeError> {
        self.advance_async(false).await
    }

    /// Runs one step without waiting for it (planned execution): admits what fits, submits the
    /// next step — its decoding rows whose newest token the step in flight samples take that
    /// token on the GPU, unread — and only then finishes the step in flight (its tokens
    /// appended, its finished sequences retired). The host's work for a step (building its
    /// rows, recording the plan's replay, reading tokens) so overlaps the GPU's for the one
    /// before. A step's tokens show one call later ([`Server::tokens`], [`Server::take_finished`])
    /// or after [`Server::sync`]. Eager execution runs the step as [`Server::step`] does.
    /// Returns the tokens the finished step generated.
    pub fn step_ahead(&mut self) -> Result<usize, ServeError> {
        self.advance(true)
    }

    /// [`Server::step_ahead`] without blocking the thread (for async code and browsers).
    pub async fn step_ahead_async(&mut self) -> Result<usize, ServeError> {
        self.advance_async(true).await
    }

    /// Finishes the step [`Server::step_ahead`] left in flight, if any: waits for it, appends
    /// its tokens and retires the sequences it finished. Returns the tokens it generated.
    /// Errors: [`ServeError::StepFailed`].
    pub fn sync(&mut self) -> Result<usize, ServeError> {
        self.finish().map_err(|error| self.stop_running(error))
    }

    /// [`Server::sync`] without blocking the thread (for async code and browsers).
    pub async fn sync_async(&mut self) -> Result<usize, ServeError> {
        match self.finish_async().await {
            Ok(generated) => Ok(generated),
            Err(error) => Err(self.stop_running(error)),
        }
    }

    /// [`Server::sync`]'s work.
    fn finish(&mut self) -> Result<usize, ServeError> {
        let Some(step) = self.in_flight.pop_front() else {
            return Ok(0);
        };
        let next = step.tokens.wait()?;
        self.append(step.samples, &next)
    }

    /// [`Server::finish`] without blocking the thread.
    async fn finish_async(&mut self) -> Result<usize, ServeError> {
        let Some(step) = self.in_flight.pop_front() else {
            return Ok(0);
        };
        let next = step.tokens.wait_async().await?;
        self.append(step.samples, &next)
    }

    /// Hands a finished step's `samples` sampled tokens `next` (f32 ids) to the scheduler, which
    /// appends them and retires the sequences it finished. Returns the tokens it generated.
    /// [`ServeError::BadSample`] for a token that is not an id of the vocabulary (a sample
    /// missing, or a broken device): never turned into a token.
    fn append(&mut self, samples: usize, next: &[f32]) -> Result<usize, ServeError> {
        let vocab_size = self.model.config().vocab_size;
        let tokens = (0..samples)
            .map(|sample| {
                let value = next.get(sample).copied().unwrap_or(f32::NAN);
                if value.is_finite()
                    && value >= 0.0
                    && value.fract() == 0.0
                    && (value as usize) < vocab_size
                {
                    Ok(value as u32)
                } else {
                    Err(ServeError::BadSample { sample, value })
                }
            })
            .collect::<Result<Vec<u32>, _>>()?;
        self.scheduler.finish(&tokens, Instant::now())?;
        self.sync_stats();
        Ok(samples)
    }

    /// The scheduler's counts copied into the server's statistics.
    fn sync_stats(&mut self) {
        let SchedulerStats {
            steps,
            rows,
            padded_rows,
            fed_rows,
            generated_tokens,
            in_flight_sum,
            in_flight_max,
            waits,
            wait_steps,
            preemptions,
            recomputed_tokens,
            cached_tokens,
        } = self.scheduler.stats().clone();
        let stats = &mut self.stats;
        stats.steps = steps;
        stats.rows = rows;
        stats.padded_rows = padded_rows;
        stats.fed_rows = fed_rows;
        stats.generated_tokens = generated_tokens;
        stats.in_flight_sum = in_flight_sum;
        stats.in_flight_max = in_flight_max;
        stats.waits = waits;
        stats.wait_steps = wait_steps;
        stats.preemptions = preemptions;
        stats.recomputed_tokens = recomputed_tokens;
        stats.cached_tokens = cached_tokens;
        stats.kv_peak = self.scheduler.blocks().peak();
    }

    /// One step, left in flight when `ahead` (planned) or finished; a failure stops the
    /// running requests.
    fn advance(&mut self, ahead: bool) -> Result<usize, ServeError> {
        self.advance_or_fail(ahead)
            .map_err(|error| self.stop_running(error))
    }

    /// [`Server::advance`]'s work. An error may leave the running sequences part-way through a
    /// step (rows pushed, blocks grown, tokens not read): the caller stops them.
    fn advance_or_fail(&mut self, ahead: bool) -> Result<usize, ServeError> {
        let started = Instant::now();
        let launched = self.launch()?;
        let mut generated = self.finish()?;
        let decode_only = self.hold(launched);
        if self.finishes_at_once(ahead) {
            generated += self.finish()?;
        }
        self.count_step(started, decode_only);
        Ok(generated)
    }

    /// [`Server::advance`] without blocking the thread.
    async fn advance_async(&mut self, ahead: bool) -> Result<usize, ServeError> {
        match self.advance_or_fail_async(ahead).await {
            Ok(generated) => Ok(generated),
            Err(error) => Err(self.stop_running(error)),
        }
    }

    /// [`Server::advance_or_fail`] without blocking the thread.
    async fn advance_or_fail_async(&mut self, ahead: bool) -> Result<usize, ServeError> {
        let started = Instant::now();
        let launched = self.launch()?;
        let mut generated = self.finish_async().await?;
        let decode_only = self.hold(launched);
        if self.finishes_at_once(ahead) {
            generated += self.finish_async().await?;
        }
        self.count_step(started, decode_only);
        Ok(generated)
    }

    /// Holds `launched` as the newest step in flight; whether it is decode-only (`None`: no
    /// step).
    fn hold(&mut self, launched: Option<(InFlight, bool)>) -> Option<bool> {
        let (step, decode_only) = launched?;
        self.in_flight.push_back(step);
        Some(decode_only)
    }

    /// Whether the step just launched is finished in the same call (not left in flight).
    fn finishes_at_once(&self, ahead: bool) -> bool {
        !ahead || self.options.execution == Execution::Eager
    }

    /// Counts a step's host time from `started` (decode-only steps apart).
    fn count_step(&mut self, started: Instant, decode_only: Option<bool>) {
        let seconds = started.elapsed().as_secs_f64();
        self.stats.step_seconds += seconds;
        if decode_only == Some(true) {
            self.stats.decode_step_seconds += seconds;
            self.stats.decode_steps += 1;
        }
    }

    /// Schedules the next step and submits it (`None` when no sequence has a row); whether it
    /// is decode-only.
    fn launch(&mut self) -> Result<Option<(InFlight, bool)>, ServeError> {
        let Some(ScheduledStep {
            rows,
            samples,
            decode_only,
            ..
        }) = self.scheduler.schedule()?
        else {
            self.sync_stats();
            return Ok(None);
        };
        self.sync_stats();
        let tokens = self.run_rows(&rows, decode_only)?;
        let step = InFlight {
            tokens,
            samples: samples.len(),
        };
        Ok(Some((step, decode_only)))
    }

    /// Submits the step's rows: planned, a replay left running (its decoding rows fed from
    /// the last step's samples where [`StepRows::fed`] says); eager, the ops run and read.
    /// `decode_only`: every row is a different sequence's newest token (the scheduler's
    /// [`ScheduledStep::decode_only`]), so the step may run as [`StepKind::Decode`] (the plan
    /// of any rows where no decode plan has its row count).
    fn run_rows(&mut self, rows: &StepRows, decode_only: bool) -> Result<Tokens, ServeError> {
        let n = rows.capacity();
        match self.options.execution {
            Execution::Planned => {
                let decode = decode_only && self.plans.contains_key(&(n, true));
                let plan = self
                    .plans
                    .get_mut(&(n, decode))
                    .ok_or(ServeError::NoPlan { rows: n })?;
                let sampled = self
                    .sampled
                    .as_ref()
                    .expect("planned servers keep their sampled tokens");
                Ok(Tokens::Run(plan.submit(&feeds(sampled, rows), &[sampled])?))
            }
            Execution::Eager => {
                if rows.fed_rows() > 0 {
                    return Err(ServeError::FedEagerStep);
                }
                let context = &self.context;
                let max_blocks = rows.max_blocks();
                let ids = context.tensor(rows.ids(), &[n])?;
                let positions = context.tensor(rows.positions(), &[n])?;
                let table = context.tensor(rows.table(), &[n, max_blocks])?;
                let samples = context.tensor(rows.samples(), &[rows.sample_capacity()])?;
                let inputs = StepTensors {
                    ids: &ids,
                    fed: None,
                    positions: &positions,
                    table: &table,
                    samples: &samples,
                };
                let kind = if decode_only {
                    StepKind::Decode
                } else {
                    StepKind::Mixed
                };
                let next =
                    self.model
                        .forward_step(context, &self.cache, inputs, Head::Argmax, kind)?;
                Ok(Tokens::Eager(next))
            }
        }
    }

    /// Stops every running sequence after `error` (a failed step): drops the steps in flight,
    /// frees the sequences' blocks and returns [`ServeError::StepFailed`] naming them. The
    /// waiting requests stay queued.
    fn stop_running(&mut self, error: ServeError) -> ServeError {
        self.in_flight.clear();
        let stopped = self.scheduler.abort_running();
        self.sync_stats();
        ServeError::StepFailed {
            source: Box::new(error),
            stopped,
        }
    }

    /// Steps until every queued request is finished ([`Server::step_ahead`]: planned steps
    /// pipelined); returns the finished requests (also those finished by earlier steps and not
    /// yet taken), in order of submission (by id).
    pub fn run(&mut self) -> Result<Vec<Completion>, ServeError> {
        while self.busy() {
            let before = self.progress();
            self.step_ahead()?;
            self.check_progress(before)?;
        }
        Ok(self.take_finished_in_order())
    }

    /// [`Server::run`] without blocking the thread (for async code and browsers, where each
    /// step's tokens are awaited): steps until every queued request is finished and returns the
    /// finished requests, in order of submission (by id).
    pub async fn run_async(&mut self) -> Result<Vec<Completion>, ServeError> {
        while self.busy() {
            let before = self.progress();
            self.step_ahead_async().await?;
            self.check_progress(before)?;
        }
        Ok(self.take_finished_in_order())
    }

    /// The finished requests not yet taken, by id.
    fn take_finished_in_order(&mut self) -> Vec<Completion> {
        let mut done = self.take_finished();
        done.sort_by_key(|completion| completion.id);
        done
    }

    /// What a step changes when it makes progress: waiting, running, tokens, steps,
    /// preemptions.
    fn progress(&self) -> (usize, usize, u64, u64, u64) {
        let stats = self.scheduler.stats();
        (
            self.scheduler.waiting(),
            self.scheduler.running(),
            stats.generated_tokens,
            stats.steps,
            stats.preemptions,
        )
    }

    /// Refuses a step that changed nothing of [`Server::progress`] (it would loop forever).
    fn check_progress(&self, before: (usize, usize, u64, u64, u64)) -> Result<(), ServeError> {
        if self.progress() == before {
            return Err(ServeError::NoProgress);
        }
        Ok(())
    }

    /// The tokens request `id` has generated so far (all of them once finished and not yet
    /// taken); `None` for an id the server does not hold.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.scheduler.tokens(id)
    }

    /// Stops request `id`, waiting or in flight (a client gone): finishes a step in flight
    /// ([`Server::sync`]), then frees the request's KV blocks and drops it, finished or not:
    /// [`Server::take_finished`] will not list it. [`ServeError::UnknownRequest`] for an id the
    /// server does not hold (unknown, cancelled, or finished and taken already). Blocks while a
    /// step is in flight: in a browser use [`Server::cancel_async`].
    pub fn cancel(&mut self, id: u64) -> Result<(), ServeError> {
        while !self.in_flight.is_empty() {
            self.sync()?;
        }
        self.scheduler.cancel(id)?;
        Ok(())
    }

    /// [`Server::cancel`] without blocking the thread (for async code and browsers): the step in
    /// flight is awaited ([`Server::sync_async`]) rather than waited for.
    pub async fn cancel_async(&mut self, id: u64) -> Result<(), ServeError> {
        while !self.in_flight.is_empty() {
            self.sync_async().await?;
        }
        self.cancel(id)
    }

    /// The requests finished so far and not yet taken, in order of finishing.
    pub fn take_finished(&mut self) -> Vec<Completion> {
        self.scheduler.take_finished()
    }

    /// How many sequences of `tokens` tokens (prompt and outputs) the KV cache holds at once:
    /// the answer to "how many sequences of length L fit in this budget?" (the batch limit
    /// apart). 0 for fewer than 2 tokens (a request has a prompt token and an output at least)
    /// and for more than the model's context (no such request is admitted).
    pub fn capacity_for(&self, tokens: usize) -> usize {
        if tokens < 2 || tokens > self.model.config().n_ctx {
            return 0;
        }
        self.scheduler.blocks().capacity_for(tokens - 1)
    }

    /// What the server has done so far.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Starts the statistics (and the KV cache's peak) anew, e.g. after a warm-up.
    pub fn reset_stats(&mut self) {
        self.stats = ServerStats::default();
        self.scheduler.reset_stats();
        self.sync_stats();
    }

    /// Requests waiting for admission.
    pub fn waiting(&self) -> usize {
        self.scheduler.waiting()
    }

    /// Sequences in flight.
    pub fn running(&self) -> usize {
        self.scheduler.running()
    }

    /// The scheduler that decides each step (queues, admission, preemption, prefix sharing).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The KV cache's bookkeeping.
    pub fn blocks(&self) -> &BlockManager {
        self.scheduler.blocks()
    }

    /// The model.
    pub fn model(&self) -> &Gpt2 {
        &self.model
    }

    /// The options.
    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// The steps' activation bytes: planned, the step plans' shared arena; eager, what the
    /// steps' intermediates need at least (the arena their plans would share, measured by the
    /// dry run), which a budget keeps beside the cache.
    pub fn activation_bytes(&self) -> u64 {
        match self.options.execution {
            Execution::Planned => self.arena.bytes(),
            Execution::Eager => self.plan.activation_bytes,
        }
    }

    /// Names the KV cache's blocks in the pool's reports, so that the memory summary, the segment
    /// maps and the snapshots show them (see [`KvCache::label_blocks`]): `seq {id}` for a
    /// sequence's own blocks, `shared by {n} seqs` for a prefix several hold, `cached prefix`
    /// for blocks no sequence holds that keep their tokens for a later one (prefix caching).
    pub fn label_kv(&self) -> Result<(), ServeError> {
        let blocks = self.scheduler.blocks();
        let mut labels: BTreeMap<u32, String> = BTreeMap::new();
        for (id, held) in blocks.sequences() {
            for &block in held {
                if let BlockState::Held { refs } = blocks.block_state(block) {
                    let label = if refs > 1 {
                        format!("shared by {refs} seqs")
                    } else {
                        format!("seq {id}")
                    };
                    labels.insert(block, label);
                }
            }
        }
        for block in 1..blocks.num_blocks() as u32 {
            if blocks.block_state(block) == BlockState::Cached {
                labels.insert(block, "cached prefix".to_owned());
            }
        }
        self.cache
            .label_blocks(&self.context, labels)
            .map_err(|error| ServeError::Compute(error.into()))
    }
}
