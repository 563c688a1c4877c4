//! The scheduler: [`Scheduler`], the [`ScheduledStep`] it returns and its [`SchedulerStats`].

use std::collections::{HashMap, VecDeque};
use web_time::Instant;

use super::error::SchedulerError;
use super::options::{Admission, SchedulerOptions};
use super::sequence::{Completion, Sequence};
use crate::paging::{AdmitRule, BlockManager, PagingError, RequestSpec, StepRows};

/// What the next step runs: its rows, and what scheduling it changed.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledStep {
    /// The rows, padded to a power of two of at least
    /// [`SchedulerOptions::min_step_rows`], and `max_batch` sampled rows.
    pub rows: StepRows,
    /// The request of each sampled row, in sample order: [`Scheduler::finish`] takes their
    /// tokens in this order.
    pub samples: Vec<u64>,
    /// Sequences running in the step (those with rows, and those waiting for a token the step
    /// before samples).
    pub sequences: usize,
    /// Whether every row is a decoding sequence's newest token.
    pub decode_only: bool,
    /// Requests admitted for this step.
    pub admitted: Vec<u64>,
    /// Requests preempted for this step (back in the queue, first in line).
    pub preempted: Vec<u64>,
}

/// What a scheduler has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SchedulerStats {
    /// Steps scheduled.
    pub steps: u64,
    /// Token rows scheduled, padding apart.
    pub rows: u64,
    /// Token rows, padding included.
    pub padded_rows: u64,
    /// Rows whose token the GPU takes from the step before.
    pub fed_rows: u64,
    /// Tokens sampled and read back.
    pub generated_tokens: u64,
    /// Sequences in each step, summed (over `steps` for the mean).
    pub in_flight_sum: u64,
    /// The most sequences in one step.
    pub in_flight_max: usize,
    /// Requests admission kept waiting for memory at least once.
    pub waits: u64,
    /// Steps at which a request waited for memory.
    pub wait_steps: u64,
    /// Sequences preempted to free blocks ([`Admission::Optimistic`] only).
    pub preemptions: u64,
    /// Tokens computed again after preemption (those the prefix cache did not keep).
    pub recomputed_tokens: u64,
    /// Prompt tokens admission found in the cache (prefix caching).
    pub cached_tokens: u64,
}

/// Decides each step of a server over a paged KV cache: see the [module](crate::scheduler).
#[derive(Debug, Clone)]
pub struct Scheduler {
    options: SchedulerOptions,
    blocks: BlockManager,
    sequences: HashMap<u64, Sequence>,
    /// Waiting requests, first in line first.
    waiting: VecDeque<u64>,
    /// Running sequences, in order of admission.
    running: Vec<u64>,
    finished: Vec<Completion>,
    /// The samples of each step scheduled and not finished, oldest first.
    in_flight: VecDeque<Vec<u64>>,
    next_id: u64,
    stats: SchedulerStats,
}

impl Scheduler {
    /// A scheduler over `blocks`. [`SchedulerError::Options`] for options that schedule
    /// nothing, or optimistic admission over a contiguous layout.
    pub fn new(options: SchedulerOptions, blocks: BlockManager) -> Result<Self, SchedulerError> {
        options.check()?;
        if matches!(options.admission, Admission::Optimistic { .. })
            && blocks.layout() != crate::paging::KvLayout::Paged
        {
            return Err(SchedulerError::Options(
                "optimistic admission needs the paged layout",
            ));
        }
        Ok(Self {
            options,
            blocks,
            sequences: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished: Vec::new(),
            in_flight: VecDeque::new(),
            next_id: 0,
            stats: SchedulerStats::default(),
        })
    }

    /// Queues a request submitted at `now`; returns its id (ids count up from 0 in submission
    /// order). [`SchedulerError::EmptyPrompt`], [`SchedulerError::NoOutputs`], and
    /// [`SchedulerError::Paging`] for one the empty cache could never hold.
    pub fn submit(&mut self, request: &RequestSpec, now: Instant) -> Result<u64, SchedulerError> {
        if request.prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        if request.max_new_tokens == 0 {
            return Err(SchedulerError::NoOutputs);
        }
        let reach = request.reach_tokens().saturating_sub(1);
        if let Some(error) = self.blocks.never_admits(reach) {
            return Err(error.into());
        }
        if reach.div_ceil(self.blocks.block_tokens()) > self.options.max_blocks {
            return Err(PagingError::StepFull {
                what: "table blocks",
                capacity: self.options.max_blocks,
                given: reach.div_ceil(self.blocks.block_tokens()),
            }
            .into());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(
            id,
            Sequence {
                id,
                prompt: request.prompt.clone(),
                max_new_tokens: request.max_new_tokens,
                output: Vec::new(),
                computed: 0,
                pending: false,
                committed_blocks: 0,
                submitted: now,
                first: None,
                waited: false,
                preemptions: 0,
                cached_tokens: None,
            },
        );
        self.waiting.push_back(id);
        Ok(id)
    }

    /// The next step: preempts what must make room (optimistic admission), admits what fits,
    /// and builds the rows of every running sequence — the newest token of each decoding one
    /// (taken on the GPU from the step in flight's samples where that step samples it), then
    /// prompt tokens in order of admission up to `max_step_tokens`. `None` when no sequence has
    /// a row. At most one step may be in flight ([`SchedulerError::StepInFlight`] otherwise).
    pub fn schedule(&mut self) -> Result<Option<ScheduledStep>, SchedulerError> {
        if self.in_flight.len() > 1 {
            return Err(SchedulerError::StepInFlight(
                "a step is scheduled with two in flight",
            ));
        }
        let pending: HashMap<u64, usize> = self
            .in_flight
            .back()
            .map(|samples| samples.iter().enumerate().map(|(i, &id)| (id, i)).collect())
            .unwrap_or_default();
        for index in 0..self.running.len() {
            let id = self.running[index];
            self.commit(id)?;
        }
        let limit = self.options.max_step_tokens;
        let mut plan: Vec<(u64, usize)> = Vec::new();
        let decoding = self
            .running
            .iter()
            .filter(|id| {
                let sequence = &self.sequences[*id];
                !sequence.sampled_all() && sequence.computed + 1 == sequence.reached()
            })
            .count();
        let mut left = limit - decoding;
        for id in &self.running {
            let sequence = &self.sequences[id];
            if sequence.sampled_all() {
                continue; // finished by the step in flight
            }
            let rows_left = sequence.reached() - sequence.computed;
            if rows_left == 1 {
                plan.push((*id, 1));
            } else if left > 0 {
                let chunk = rows_left.min(left);
                left -= chunk;
                plan.push((*id, chunk));
            }
        }
        // Blocks for the running sequences' rows, the newest preempted while there are none.
        let mut preempted = Vec::new();
        let mut grown: Vec<(u64, usize, usize)> = Vec::new(); // (id, rows, first position)
        let mut index = 0;
        while index < plan.len() {
            let (id, rows) = plan[index];
            let mut skipped = false;
            while self.blocks.blocks_to_grow(id, rows) > self.blocks.available_blocks() {
                let victim = *self.running.last().expect("the sequence itself runs");
                self.preempt(victim)?;
                preempted.push(victim);
                if let Some(position) = plan.iter().position(|&(p, _)| p == victim) {
                    plan.remove(position);
                }
                if victim == id {
                    skipped = true;
                    break;
                }
            }
            if skipped {
                continue;
            }
            let start = self.blocks.grow(id, rows)?;
            grown.push((id, rows, start));
            index += 1;
        }
        // Admission, unless this step had to preempt.
        let mut admitted = Vec::new();
        if preempted.is_empty() {
            self.admit(&mut admitted, &mut left, &mut grown)?;
        }
        let total: usize = grown.iter().map(|&(_, rows, _)| rows).sum();
        if total == 0 {
            return Ok(None);
        }
        let sequences = self
            .running
            .iter()
            .filter(|id| !self.sequences[*id].sampled_all())
            .count();
        let capacity = StepRows::bucket(total.max(self.options.min_step_rows));
        let mut rows = StepRows::new(capacity, self.options.max_batch, self.options.max_blocks)?;
        let mut samples = Vec::new();
        for (id, count, start) in grown {
            if self.push_rows(&mut rows, id, count, start, &pending)? {
                samples.push(id);
            }
            self.commit(id)?;
        }
        for id in &samples {
            self.sequences
                .get_mut(id)
                .expect("sampled sequences run")
                .pending = true;
        }
        self.stats.steps += 1;
        self.stats.rows += rows.rows() as u64;
        self.stats.padded_rows += rows.capacity() as u64;
        self.stats.fed_rows += rows.fed_rows() as u64;
        self.stats.in_flight_sum += sequences as u64;
        self.stats.in_flight_max = self.stats.in_flight_max.max(sequences);
        self.in_flight.push_back(samples.clone());
        Ok(Some(ScheduledStep {
            decode_only: samples.len() == rows.rows(),
            rows,
            samples,
            sequences,
            admitted,
            preempted,
        }))
    }

    /// Admits waiting requests in order while the batch has room and the rule lets them in,
    /// taking their first rows' blocks.
    fn admit(
        &mut self,
        admitted: &mut Vec<u64>,
        left: &mut usize,
        grown: &mut Vec<(u64, usize, usize)>,
    ) -> Result<(), SchedulerError> {
        while self.running.len() < self.options.max_batch {
            let rule = match self.options.admission {
                Admission::Reserve => AdmitRule::Reserve,
                // With nothing running, a request that fits the cache is admitted whatever
                // the watermark: it would wait forever otherwise.
                Admission::Optimistic { .. } if self.running.is_empty() => {
                    AdmitRule::Watermark { watermark: 0 }
                }
                Admission::Optimistic { watermark } => AdmitRule::Watermark {
                    watermark: (watermark * (self.blocks.num_blocks() - 1) as f64).ceil() as usize,
                },
            };
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let sequence = &self.sequences[&id];
            if sequence.pending {
                break; // preempted with a token in flight: admitted once it is read
            }
            let tokens = sequence.tokens();
            let Some(cached) = self
                .blocks
                .admit_tokens(id, &tokens, sequence.reach(), rule)?
            else {
                let sequence = self.sequences.get_mut(&id).expect("waiting");
                if !sequence.waited {
                    sequence.waited = true;
                    self.stats.waits += 1;
                }
                self.stats.wait_steps += 1;
                break;
            };
            self.waiting.pop_front();
            self.running.push(id);
            admitted.push(id);
            let sequence = self.sequences.get_mut(&id).expect("waiting");
            sequence.computed = cached;
            sequence.committed_blocks = cached / self.blocks.block_tokens();
            self.stats.cached_tokens += cached as u64;
            if sequence.preemptions > 0 {
                self.stats.recomputed_tokens += (tokens.len() - cached) as u64;
            }
            sequence.cached_tokens.get_or_insert(cached);
            let chunk = (tokens.len() - cached).min(*left);
            if chunk > 0 {
                *left -= chunk;
                let start = self.blocks.grow(id, chunk)?;
                grown.push((id, chunk, start));
            }
        }
        Ok(())
    }

    /// Pushes `count` rows of sequence `id` from position `start`; whether its last row is
    /// sampled.
    fn push_rows(
        &mut self,
        rows: &mut StepRows,
        id: u64,
        count: usize,
        start: usize,
        pending: &HashMap<u64, usize>,
    ) -> Result<bool, SchedulerError> {
        let block_tokens = self.blocks.block_tokens();
        let table = self.blocks.blocks(id).unwrap_or_default();
        let sequence = self.sequences.get_mut(&id).expect("running");
        let mut sampled = false;
        for offset in 0..count {
            let index = start + offset;
            let last = index + 1 == sequence.reached();
            let sample = last && !sequence.sampled_all();
            let pushed = if index == sequence.known() {
                // The token the step in flight samples, taken on the GPU.
                let previous = *pending
                    .get(&id)
                    .expect("a pending token's step is in flight");
                rows.push_fed(previous, index, table, block_tokens, sample)?
            } else {
                rows.push(sequence.token(index), index, table, block_tokens, sample)?
            };
            sampled |= pushed.is_some();
        }
        sequence.computed = start + count;
        Ok(sampled)
    }

    /// Keys sequence `id`'s newly full blocks whose tokens are known (prefix caching).
    fn commit(&mut self, id: u64) -> Result<(), SchedulerError> {
        if !self.blocks.prefix_caching() {
            return Ok(());
        }
        let sequence = self.sequences.get_mut(&id).expect("running");
        let full = sequence.computed.min(sequence.known()) / self.blocks.block_tokens();
        if full > sequence.committed_blocks {
            self.blocks.commit(id, &sequence.tokens())?;
            sequence.committed_blocks = full;
        }
        Ok(())
    }

    /// Frees running sequence `id`'s blocks and puts it first in line, to be computed again.
    fn preempt(&mut self, id: u64) -> Result<(), SchedulerError> {
        self.blocks.release(id)?;
        self.running.retain(|&running| running != id);
        self.waiting.push_front(id);
        let sequence = self.sequences.get_mut(&id).expect("running");
        sequence.computed = 0;
        sequence.committed_blocks = 0;
        sequence.preemptions += 1;
        self.stats.preemptions += 1;
        Ok(())
    }

    /// Takes the oldest step in flight's sampled tokens (in [`ScheduledStep::samples`]' order),
    /// appends each to its sequence, and retires the sequences that have all their outputs
    /// (their blocks freed). Returns the ids retired. [`SchedulerError::NoStepInFlight`],
    /// [`SchedulerError::MissingSamples`] for fewer tokens than the step sampled (nothing
    /// changes then).
    pub fn finish(&mut self, tokens: &[u32], now: Instant) -> Result<Vec<u64>, SchedulerError> {
        let samples = self
            .in_flight
            .front()
            .ok_or(SchedulerError::NoStepInFlight)?;
        if tokens.len() < samples.len() {
            return Err(SchedulerError::MissingSamples {
                samples: samples.len(),
                tokens: tokens.len(),
            });
        }
        let samples = self.in_flight.pop_front().expect("checked above");
        for (&id, &token) in samples.iter().zip(tokens) {
            if let Some(sequence) = self.sequences.get_mut(&id) {
                sequence.pending = false;
                sequence.output.push(token);
                sequence.first.get_or_insert(now);
                self.stats.generated_tokens += 1;
            }
        }
        let mut retired = Vec::new();
        for id in samples {
            if !self.sequences.get(&id).is_some_and(Sequence::done) {
                continue;
            }
            let sequence = self.sequences.remove(&id).expect("checked above");
            if let Some(index) = self.running.iter().position(|&r| r == id) {
                self.running.remove(index);
                self.blocks.release(id)?;
            } else {
                self.waiting.retain(|&w| w != id);
            }
            self.finished.push(sequence.complete(now));
            retired.push(id);
        }
        Ok(retired)
    }

    /// Stops every running sequence after a failed step: forgets the steps in flight, frees the
    /// running sequences' blocks and drops them; returns their ids, in order of admission. The
    /// waiting requests stay queued (a preempted one whose token was in flight computes it
    /// again).
    pub fn abort_running(&mut self) -> Vec<u64> {
        self.in_flight.clear();
        let stopped: Vec<u64> = std::mem::take(&mut self.running);
        for id in &stopped {
            // Every running sequence was admitted, so it holds blocks to release.
            let _ = self.blocks.release(*id);
            self.sequences.remove(id);
        }
        for sequence in self.sequences.values_mut() {
            sequence.pending = false;
        }
        stopped
    }

    /// Stops request `id`, waiting, running or finished and not taken: its blocks freed.
    /// [`SchedulerError::StepInFlight`] while a step is in flight (its rows may be the
    /// request's); [`SchedulerError::UnknownRequest`] for an id not held.
    pub fn cancel(&mut self, id: u64) -> Result<(), SchedulerError> {
        if !self.in_flight.is_empty() {
            return Err(SchedulerError::StepInFlight("cancel"));
        }
        if let Some(index) = self.finished.iter().position(|done| done.id == id) {
            self.finished.remove(index);
            return Ok(());
        }
        if self.sequences.remove(&id).is_none() {
            return Err(SchedulerError::UnknownRequest { id });
        }
        if let Some(index) = self.running.iter().position(|&r| r == id) {
            self.running.remove(index);
            self.blocks.release(id)?;
        }
        self.waiting.retain(|&w| w != id);
        Ok(())
    }

    /// The steps of padding rows only, one for every row count steps are padded to (powers of
    /// two from `min_step_rows` up to `max_step_tokens`): for warming a model up.
    pub fn padding_steps(&self) -> Result<Vec<StepRows>, SchedulerError> {
        self.step_row_counts()
            .into_iter()
            .map(|rows| {
                StepRows::new(rows, self.options.max_batch, self.options.max_blocks)
                    .map_err(SchedulerError::from)
            })
            .collect()
    }

    /// The row counts steps are padded to, fewest first.
    pub fn step_row_counts(&self) -> Vec<usize> {
        StepRows::buckets(self.options.min_step_rows, self.options.max_step_tokens)
    }

    /// The tokens request `id` has generated so far (all of them once finished and not yet
    /// taken); `None` for an id not held.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.sequences
            .get(&id)
            .map(|sequence| sequence.output.as_slice())
            .or_else(|| {
                self.finished
                    .iter()
                    .find(|done| done.id == id)
                    .map(|done| done.output.as_slice())
            })
    }

    /// The requests finished and not yet taken, in order of finishing.
    pub fn take_finished(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.finished)
    }

    /// Whether requests are waiting or running, or a step is in flight.
    pub fn busy(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.in_flight.is_empty()
    }

    /// Requests waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Steps scheduled and not finished.
    pub fn steps_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The KV cache's bookkeeping.
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// The options.
    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    /// What the scheduler has done so far.
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// Starts the statistics (and the KV cache's peak) anew.
    pub fn reset_stats(&mut self) {
        self.stats = SchedulerStats::default();
        self.blocks.reset_peak();
    }
}
