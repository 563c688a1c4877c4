//! The plan of one server step: the token ids (the host's, or the last step's samples fed on
//! the GPU), the model's forward pass over the KV cache, and the greedy tokens out.

use super::error::ServeError;
use super::kv::KvCache;
use super::model::{Gpt2, Head, StepKind, StepTensors};
use super::options::ServerOptions;
use crate::compute::{Capture, CaptureOptions, Context, FedIds, Feed, Plan, PlanArena, Tensor};
use crate::paging::StepRows;

/// The inputs of a step's plan, in the order [`capture`] declares them: the last step's
/// samples, then [`StepRows`]'s ids, picks, fed, positions, table and samples. The one place
/// that order is written down besides `capture` itself, right above it.
pub(super) fn feeds<'a>(previous: &'a Tensor, rows: &'a StepRows) -> [Feed<'a>; 7] {
    [
        Feed::Tensor(previous),
        Feed::Data(rows.ids()),
        Feed::Data(rows.picks()),
        Feed::Data(rows.fed()),
        Feed::Data(rows.positions()),
        Feed::Data(rows.table()),
        Feed::Data(rows.samples()),
    ]
}

/// The step shapes a server plans: each of the row counts `counts` (those steps are padded
/// to) for any rows ([`StepKind::Mixed`]), and those up to `max_batch`'s (with
/// `min_step_rows`) for decode-only steps ([`StepKind::Decode`]), which have a row per
/// running sequence at most.
pub(super) fn step_shapes(options: &ServerOptions, counts: Vec<usize>) -> Vec<(usize, StepKind)> {
    let decode_rows = StepRows::bucket(options.max_batch.max(options.min_step_rows));
    let mut shapes: Vec<(usize, StepKind)> = counts
        .iter()
        .filter(|&&rows| rows <= decode_rows)
        .map(|&rows| (rows, StepKind::Decode))
        .collect();
    shapes.extend(counts.into_iter().map(|rows| (rows, StepKind::Mixed)));
    shapes
}

/// The shape of one step plan: its rows, sampled rows and block-table columns, and its kind.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepShape {
    pub(super) rows: usize,
    pub(super) samples: usize,
    pub(super) max_blocks: usize,
    pub(super) kind: StepKind,
}

/// Captures one step of `shape` over `cache` (greedy tokens out). Its inputs, in [`feeds`]'
/// order: the last step's samples, then [`StepRows`]'s ids, picks, fed, positions, table and
/// samples.
pub(super) fn capture(
    context: &Context,
    model: &Gpt2,
    cache: &KvCache,
    shape: StepShape,
    arena: Option<&PlanArena>,
) -> Result<Plan, ServeError> {
    let (capture, next) = record(context, model, cache, shape)?;
    let options = CaptureOptions {
        arena: arena.cloned(),
        ..CaptureOptions::default()
    };
    Ok(capture.finish_with(&[&next], options)?)
}

/// The arena bytes (one figure per arena index) the plan [`capture`] makes of the same step
/// would need, without building it ([`Capture::arena_bytes`]): nothing but what the recording
/// itself makes is created.
pub(super) fn arena_bytes(
    context: &Context,
    model: &Gpt2,
    cache: &KvCache,
    shape: StepShape,
) -> Result<Vec<u64>, ServeError> {
    let (capture, next) = record(context, model, cache, shape)?;
    Ok(capture.arena_bytes(&[&next], CaptureOptions::default())?)
}

/// Records one step into an open capture; gives the capture and the sampled tokens' tensor.
fn record(
    context: &Context,
    model: &Gpt2,
    cache: &KvCache,
    shape: StepShape,
) -> Result<(Capture, Tensor), ServeError> {
    let StepShape {
        rows,
        samples,
        max_blocks,
        kind,
    } = shape;
    let mut capture = context.capture()?;
    let previous = capture.input(&[samples])?;
    let ids = capture.input(&[rows])?;
    let picks = capture.input(&[rows])?;
    let fed = capture.input(&[rows])?;
    let positions = capture.input(&[rows])?;
    let table = capture.input(&[rows, max_blocks])?;
    let sampled = capture.input(&[samples])?;
    // ids + fed · previous[picks]: the host's ids, and the last step's samples where fed.
    let inputs = StepTensors {
        ids: &ids,
        fed: Some(FedIds {
            fed: &fed,
            previous: &previous,
            picks: &picks,
        }),
        positions: &positions,
        table: &table,
        samples: &sampled,
    };
    let next = model.forward_step(context, cache, inputs, Head::Argmax, kind)?;
    Ok((capture, next))
}
