//! A GPT-2 server over a paged KV cache with continuous batching and admission by predicted
//! memory: [`Server`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use web_time::Instant;

use super::error::ServeError;
use super::kv::KvCache;
use super::model::{Gpt2, Head, StepTensors};
use super::options::{Execution, ServerOptions};
use super::sizing::{memory_plan, MemoryPlan};
use super::stats::{Completion, ServerStats};
use super::step::capture;
use crate::compute::{Context, DType, Feed, Plan, PlanArena, PlanRun, Tensor};
use crate::model::Gpt2Weights;
use crate::paging::{BlockManager, RequestSpec, StepRows};
use crate::BudgetScope;

/// A sequence in flight.
struct Sequence {
    id: u64,
    prompt: Vec<u32>,
    max_new_tokens: usize,
    /// Prompt tokens written into the cache.
    filled: usize,
    output: Vec<u32>,
    submitted: Instant,
    first: Option<Instant>,
    waited: bool,
}

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
    /// The sequence of each sampled row, in sample order.
    samples: Vec<u64>,
    /// Whether every row of the step was a decoding one.
    decode_only: bool,
}

/// Serves GPT-2 requests: continuous batching (sequences join and leave between steps), a KV
/// cache of blocks from the pool, and admission by predicted memory — a request is admitted when
/// the KV blocks it can reach (its prompt and every output) are free, the steps' activations
/// being reserved up front — so that an admitted request never meets an out-of-memory.
///
/// Each step mixes the newest token of every decoding sequence with prompt tokens of the
/// sequences being filled (up to [`ServerOptions::max_step_tokens`] rows) and samples the next
/// token greedily after each sequence's last row. Planned steps can be pipelined
/// ([`Server::step_ahead`], which [`Server::run`] uses): the next step is submitted before the
/// one in flight is read, its decoding rows taking their newest tokens on the GPU.
pub struct Server {
    context: Context,
    model: Gpt2,
    cache: KvCache,
    blocks: BlockManager,
    options: ServerOptions,
    max_blocks: usize,
    arena: PlanArena,
    plans: BTreeMap<usize, Plan>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    finished: Vec<Completion>,
    next_id: u64,
    stats: ServerStats,
    /// Planned: the last step's sampled tokens, which the next step's fed rows read
    /// ([`StepRows::push_fed`]).
    sampled: Option<Tensor>,
    in_flight: Option<InFlight>,
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
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .field("finished", &self.finished.len())
            .field("step_in_flight", &self.in_flight.is_some())
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
    /// Errors: [`ServeError::Options`] for options that serve nothing; [`ServeError::Budget`]
    /// when the budget leaves no room for one sequence of the model's context; those of the
    /// ops and of the capture. A refused server leaves the pool's budget as it was.
    pub fn new(context: &Context, model: Gpt2, options: ServerOptions) -> Result<Self, ServeError> {
        let plan = memory_plan(context, &model, &options)?;
        let budget = options
            .budget_bytes
            .map(|budget| context.pool().budget_scope(Some(budget)));
        Self::build(context, model, options, plan, budget)
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
        let blocks = BlockManager::new(options.layout, options.block_tokens, cache.num_blocks())?;
        let mut server = Self {
            context: context.clone(),
            model,
            cache,
            blocks,
            max_blocks,
            arena,
            plans: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished: Vec::new(),
            next_id: 0,
            stats: ServerStats::default(),
            _budget: budget,
            plan,
            options,
            sampled,
            in_flight: None,
        };
        if server.options.execution == Execution::Planned {
            let mut rows = server.first_bucket();
            loop {
                let plan = server.capture_step(rows, &server.cache)?;
                server.plans.insert(rows, plan);
                if rows >= server.options.max_step_tokens {
                    break;
                }
                rows = StepRows::bucket(rows + 1);
            }
        }
        Ok(server)
    }

    /// The plan of a step of `rows` rows over `cache`, in the server's arena.
    fn capture_step(&self, rows: usize, cache: &KvCache) -> Result<Plan, ServeError> {
        capture(
            &self.context,
            &self.model,
            cache,
            rows,
            self.options.max_batch,
            self.max_blocks,
            Some(&self.arena),
        )
    }

    /// Runs a step of padding rows (each writing block 0 only, which no sequence holds) for
    /// every row count steps are padded to (powers of two up to `max_step_tokens`), planned or
    /// eager: the drivers that compile pipelines at their first use do it here, and the matmul
    /// tuner measures each shape here, not in a request's step. Finishes a step in flight first
    /// ([`Server::sync`]); changes no sequence and no statistic otherwise.
    pub fn warm_up(&mut self) -> Result<(), ServeError> {
        self.sync()?;
        for step in self.warm_up_steps()? {
            self.run_rows(&step)
                .and_then(Tokens::wait)
                .map_err(|error| self.stop_running(error))?;
        }
        Ok(())
    }

    /// [`Server::warm_up`] without blocking the thread (for async code and browsers).
    pub async fn warm_up_async(&mut self) -> Result<(), ServeError> {
        self.sync_async().await?;
        for step in self.warm_up_steps()? {
            let tokens = self
                .run_rows(&step)
                .map_err(|error| self.stop_running(error))?;
            if let Err(error) = tokens.wait_async().await {
                return Err(self.stop_running(error));
            }
        }
        Ok(())
    }

    /// The steps of padding rows [`Server::warm_up`] runs: one per row count steps are padded to.
    fn warm_up_steps(&self) -> Result<Vec<StepRows>, ServeError> {
        let mut steps = Vec::new();
        let mut rows = self.first_bucket();
        loop {
            let capacity = StepRows::bucket(rows);
            steps.push(StepRows::new(
                capacity,
                self.options.max_batch,
                self.max_blocks,
            )?);
            if capacity >= self.options.max_step_tokens {
                return Ok(steps);
            }
            rows = capacity + 1;
        }
    }

    /// The fewest rows a step is padded to.
    fn first_bucket(&self) -> usize {
        StepRows::bucket(self.options.min_step_rows)
    }

    /// Queues a request; it is admitted when its KV blocks are free. Returns its id.
    /// Errors: [`ServeError::Tokens`] for an empty prompt, a token outside the vocabulary, or a
    /// prompt and outputs longer than the model's context; [`ServeError::NoOutputs`];
    /// [`ServeError::Paging`] for a request the empty cache could not admit. A request of
    /// prompt and outputs `L` holds `L − 1` tokens in the cache (the last output is sampled,
    /// never run).
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
        let kv_tokens = request.reach_tokens() - 1;
        if let Some(error) = self.blocks.never_admits(kv_tokens) {
            return Err(error.into());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Sequence {
            id,
            prompt: request.prompt.clone(),
            max_new_tokens: request.max_new_tokens,
            filled: 0,
            output: Vec::new(),
            submitted: Instant::now(),
            first: None,
            waited: false,
        });
        Ok(id)
    }

    /// Admits waiting requests in order while the batch has room and their KV blocks are free.
    fn admit(&mut self) -> Result<(), ServeError> {
        while self.running.len() < self.options.max_batch {
            let Some(next) = self.waiting.front_mut() else {
                break;
            };
            let kv_tokens = next.prompt.len() + next.max_new_tokens - 1;
            if !self.blocks.admit(next.id, kv_tokens)? {
                if !next.waited {
                    next.waited = true;
                    self.stats.waits += 1;
                }
                self.stats.wait_steps += 1;
                break;
            }
            let sequence = self.waiting.pop_front().expect("front exists");
            self.running.push(sequence);
        }
        Ok(())
    }

    /// Whether requests are waiting or in flight (or a step is).
    pub fn busy(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || self.in_flight.is_some()
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
        let Some(step) = self.in_flight.take() else {
            return Ok(0);
        };
        let next = step.tokens.wait()?;
        self.append(&step.samples, &next)
    }

    /// [`Server::finish`] without blocking the thread.
    async fn finish_async(&mut self) -> Result<usize, ServeError> {
        let Some(step) = self.in_flight.take() else {
            return Ok(0);
        };
        let next = step.tokens.wait_async().await?;
        self.append(&step.samples, &next)
    }

    /// Appends a finished step's sampled tokens `next` to the sequences `samples` names (in
    /// sample order) and retires the sequences it finished. Returns the tokens it generated.
    fn append(&mut self, samples: &[u64], next: &[f32]) -> Result<usize, ServeError> {
        let now = Instant::now();
        for (sample, id) in samples.iter().enumerate() {
            let token = next.get(sample).copied().unwrap_or(f32::NAN);
            if let Some(sequence) = self.running.iter_mut().find(|s| s.id == *id) {
                sequence.output.push(token as u32);
                sequence.first.get_or_insert(now);
            }
        }
        self.stats.generated_tokens += samples.len() as u64;
        self.retire(now)?;
        Ok(samples.len())
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
        self.admit()?;
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
        self.admit()?;
        let launched = self.launch()?;
        let mut generated = self.finish_async().await?;
        let decode_only = self.hold(launched);
        if self.finishes_at_once(ahead) {
            generated += self.finish_async().await?;
        }
        self.count_step(started, decode_only);
        Ok(generated)
    }

    /// Holds `launched` as the step in flight; whether it is decode-only (`None`: no step).
    fn hold(&mut self, launched: Option<InFlight>) -> Option<bool> {
        let decode_only = launched.as_ref().map(|step| step.decode_only);
        self.in_flight = launched;
        decode_only
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

    /// Builds the next step's rows and submits them (`None` when no sequence has a row).
    fn launch(&mut self) -> Result<Option<InFlight>, ServeError> {
        let pending: HashMap<u64, usize> = self
            .in_flight
            .iter()
            .flat_map(|step| step.samples.iter().enumerate())
            .map(|(sample, &id)| (id, sample))
            .collect();
        let (rows, samples, sequences) = self.build_rows(&pending)?;
        if rows.rows() == 0 {
            return Ok(None);
        }
        let decode_only = samples.len() == rows.rows();
        let tokens = self.run_rows(&rows)?;
        self.stats.steps += 1;
        self.stats.rows += rows.rows() as u64;
        self.stats.padded_rows += rows.capacity() as u64;
        self.stats.fed_rows += rows.fed_rows() as u64;
        self.stats.in_flight_sum += sequences as u64;
        self.stats.in_flight_max = self.stats.in_flight_max.max(sequences);
        Ok(Some(InFlight {
            tokens,
            samples,
            decode_only,
        }))
    }

    /// The step's rows: one per decoding sequence, then prompt chunks up to the step's rows;
    /// the sequence of each sampled row; and the sequences not finished by the step in flight.
    /// `pending` maps the sequences the step in flight samples to their sample index: their
    /// rows take that token on the GPU, and those it gives their last token have no row.
    fn build_rows(
        &mut self,
        pending: &HashMap<u64, usize>,
    ) -> Result<(StepRows, Vec<u64>, usize), ServeError> {
        let limit = self.options.max_step_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (sequence index, rows)
        let mut total = 0;
        let mut sequences = 0;
        for (index, sequence) in self.running.iter().enumerate() {
            let outstanding =
                sequence.output.len() + usize::from(pending.contains_key(&sequence.id));
            if outstanding >= sequence.max_new_tokens {
                continue; // finished by the step in flight
            }
            sequences += 1;
            if sequence.filled == sequence.prompt.len() {
                plan.push((index, 1));
                total += 1;
            }
        }
        for (index, sequence) in self.running.iter().enumerate() {
            let left = sequence.prompt.len() - sequence.filled;
            if left > 0 && total < limit {
                let chunk = left.min(limit - total);
                plan.push((index, chunk));
                total += chunk;
            }
        }
        if total == 0 {
            return Ok((StepRows::new(1, 1, 1)?, Vec::new(), 0));
        }
        // Eager steps are padded as planned ones are: the same shapes, so that the same kernels
        // (and the matmul tuner's choices, made once per shape) serve both.
        let mut rows = StepRows::new(
            StepRows::bucket(total.max(self.options.min_step_rows)),
            self.options.max_batch,
            self.max_blocks,
        )?;
        let mut samples = Vec::new();
        for (index, count) in plan {
            if self.push_rows(&mut rows, index, count, pending)? {
                samples.push(self.running[index].id);
            }
        }
        Ok((rows, samples, sequences))
    }

    /// Pushes `count` rows of sequence `index` (its newest token when decoding, else its next
    /// prompt tokens); whether its last row is sampled.
    fn push_rows(
        &mut self,
        rows: &mut StepRows,
        index: usize,
        count: usize,
        pending: &HashMap<u64, usize>,
    ) -> Result<bool, ServeError> {
        let block_tokens = self.options.block_tokens;
        let sequence = &mut self.running[index];
        let start = self.blocks.grow(sequence.id, count)?;
        let table = self.blocks.blocks(sequence.id).unwrap_or_default();
        if sequence.filled == sequence.prompt.len() {
            if let Some(&previous) = pending.get(&sequence.id) {
                rows.push_fed(previous, start, table, block_tokens, true)?;
                return Ok(true);
            }
            let token = *sequence.output.last().ok_or_else(|| {
                ServeError::Options(format!(
                    "request {} is decoding without a token (a failed step lost it)",
                    sequence.id
                ))
            })?;
            rows.push(token, start, table, block_tokens, true)?;
            return Ok(true);
        }
        let mut sampled = false;
        for offset in 0..count {
            let last = sequence.filled + offset + 1 == sequence.prompt.len();
            let token = sequence.prompt[sequence.filled + offset];
            sampled |= rows
                .push(token, start + offset, table, block_tokens, last)?
                .is_some();
        }
        sequence.filled += count;
        Ok(sampled)
    }

    /// Submits the step's rows: planned, a replay left running (its decoding rows fed from
    /// the last step's samples where [`StepRows::fed`] says); eager, the ops run and read.
    fn run_rows(&mut self, rows: &StepRows) -> Result<Tokens, ServeError> {
        match self.options.execution {
            Execution::Planned => {
                let plan = self.plans.get_mut(&rows.capacity()).ok_or_else(|| {
                    ServeError::Options(format!("no plan of {} rows", rows.capacity()))
                })?;
                let sampled = self
                    .sampled
                    .as_ref()
                    .expect("planned servers keep their sampled tokens");
                let feeds = [
                    Feed::Tensor(sampled),
                    Feed::Data(rows.ids()),
                    Feed::Data(rows.picks()),
                    Feed::Data(rows.fed()),
                    Feed::Data(rows.positions()),
                    Feed::Data(rows.table()),
                    Feed::Data(rows.samples()),
                ];
                Ok(Tokens::Run(plan.submit(&feeds, &[sampled])?))
            }
            Execution::Eager => {
                if rows.fed_rows() > 0 {
                    return Err(ServeError::Options(
                        "eager steps read their tokens: none is fed on the GPU".into(),
                    ));
                }
                let context = &self.context;
                let (n, max_blocks) = (rows.capacity(), rows.max_blocks());
                let ids = context.tensor(rows.ids(), &[n])?;
                let positions = context.tensor(rows.positions(), &[n])?;
                let table = context.tensor(rows.table(), &[n, max_blocks])?;
                let samples = context.tensor(rows.samples(), &[rows.sample_capacity()])?;
                let inputs = StepTensors {
                    ids: &ids,
                    positions: &positions,
                    table: &table,
                    samples: &samples,
                };
                let next = self
                    .model
                    .forward(context, &self.cache, inputs, Head::Argmax)?;
                Ok(Tokens::Eager(next))
            }
        }
    }

    /// Stops every running sequence after `error` (a failed step): drops the step in flight,
    /// frees the sequences' blocks and returns [`ServeError::StepFailed`] naming them. The
    /// waiting requests stay queued.
    fn stop_running(&mut self, error: ServeError) -> ServeError {
        self.in_flight = None;
        let stopped: Vec<u64> = self.running.drain(..).map(|sequence| sequence.id).collect();
        for &id in &stopped {
            // Every running sequence was admitted, so it holds blocks to release; a refusal
            // would only mean it holds none.
            let _ = self.blocks.release(id);
        }
        ServeError::StepFailed {
            source: Box::new(error),
            stopped,
        }
    }

    /// Moves the sequences that have all their tokens to the finished list, freeing their blocks.
    fn retire(&mut self, now: Instant) -> Result<(), ServeError> {
        let mut index = 0;
        while index < self.running.len() {
            if self.running[index].output.len() < self.running[index].max_new_tokens {
                index += 1;
                continue;
            }
            let sequence = self.running.remove(index);
            self.blocks.release(sequence.id)?;
            let first = sequence.first.unwrap_or(now);
            self.finished.push(Completion {
                id: sequence.id,
                prompt: sequence.prompt,
                output: sequence.output,
                time_to_first_token: first - sequence.submitted,
                time_to_last_token: now - sequence.submitted,
                waited: sequence.waited,
            });
        }
        self.stats.kv_peak = self.blocks.peak();
        Ok(())
    }

    /// Steps until every queued request is finished ([`Server::step_ahead`]: planned steps
    /// pipelined); returns the finished requests (also those finished by earlier steps and not
    /// yet taken), in order of finishing.
    pub fn run(&mut self) -> Result<Vec<Completion>, ServeError> {
        while self.busy() {
            let before = self.progress();
            self.step_ahead()?;
            self.check_progress(before)?;
        }
        Ok(self.take_finished())
    }

    /// [`Server::run`] without blocking the thread (for async code and browsers, where each
    /// step's tokens are awaited): steps until every queued request is finished and returns the
    /// finished requests, in order of finishing.
    pub async fn run_async(&mut self) -> Result<Vec<Completion>, ServeError> {
        while self.busy() {
            let before = self.progress();
            self.step_ahead_async().await?;
            self.check_progress(before)?;
        }
        Ok(self.take_finished())
    }

    /// What a step changes when it makes progress: waiting, running, tokens, steps.
    fn progress(&self) -> (usize, usize, u64, u64) {
        (
            self.waiting.len(),
            self.running.len(),
            self.stats.generated_tokens,
            self.stats.steps,
        )
    }

    /// Refuses a step that changed nothing of [`Server::progress`] (it would loop forever).
    fn check_progress(&self, before: (usize, usize, u64, u64)) -> Result<(), ServeError> {
        if self.progress() == before {
            return Err(ServeError::Options("a step made no progress".into()));
        }
        Ok(())
    }

    /// The tokens request `id` has generated so far (all of them once finished and not yet
    /// taken); `None` for an id the server does not hold.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.running
            .iter()
            .chain(&self.waiting)
            .find(|sequence| sequence.id == id)
            .map(|sequence| sequence.output.as_slice())
            .or_else(|| {
                self.finished
                    .iter()
                    .find(|done| done.id == id)
                    .map(|done| done.output.as_slice())
            })
    }

    /// Stops request `id`, waiting or in flight (a client gone): finishes a step in flight
    /// ([`Server::sync`]), then frees the request's KV blocks and drops it, finished or not:
    /// [`Server::take_finished`] will not list it. [`ServeError::UnknownRequest`] for an id the
    /// server does not hold (unknown, cancelled, or finished and taken already). Blocks while a
    /// step is in flight: in a browser use [`Server::cancel_async`].
    pub fn cancel(&mut self, id: u64) -> Result<(), ServeError> {
        self.sync()?;
        if let Some(index) = self.waiting.iter().position(|sequence| sequence.id == id) {
            self.waiting.remove(index);
            return Ok(());
        }
        if let Some(index) = self.finished.iter().position(|done| done.id == id) {
            self.finished.remove(index);
            return Ok(());
        }
        let index = self
            .running
            .iter()
            .position(|sequence| sequence.id == id)
            .ok_or(ServeError::UnknownRequest { id })?;
        self.running.remove(index);
        self.blocks.release(id)?;
        Ok(())
    }

    /// [`Server::cancel`] without blocking the thread (for async code and browsers): the step in
    /// flight is awaited ([`Server::sync_async`]) rather than waited for.
    pub async fn cancel_async(&mut self, id: u64) -> Result<(), ServeError> {
        self.sync_async().await?;
        self.cancel(id)
    }

    /// The requests finished so far and not yet taken.
    pub fn take_finished(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.finished)
    }

    /// How many sequences of `tokens` tokens (prompt and outputs) the KV cache holds at once:
    /// the answer to "how many sequences of length L fit in this budget?" (the batch limit
    /// apart). 0 for fewer than 2 tokens (a request has a prompt token and an output at least)
    /// and for more than the model's context (no such request is admitted).
    pub fn capacity_for(&self, tokens: usize) -> usize {
        if tokens < 2 || tokens > self.model.config().n_ctx {
            return 0;
        }
        self.blocks.capacity_for(tokens - 1)
    }

    /// What the server has done so far.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Starts the statistics (and the KV cache's peak) anew, e.g. after a warm-up.
    pub fn reset_stats(&mut self) {
        self.stats = ServerStats::default();
        self.blocks.reset_peak();
        self.stats.kv_peak = self.blocks.peak();
    }

    /// Requests waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences in flight.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The KV cache's bookkeeping.
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
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

    /// Names each sequence's KV blocks in the pool's reports (see [`KvCache::label_sequences`]).
    pub fn label_kv(&self) -> Result<(), ServeError> {
        self.cache
            .label_sequences(&self.context, self.blocks.sequences())
            .map_err(|error| ServeError::Compute(error.into()))
    }
}
