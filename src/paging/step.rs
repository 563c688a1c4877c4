//! The rows of one model step over a paged KV cache, as the step's kernels read them:
//! [`StepRows`].

use super::error::PagingError;

/// The inputs of one step of a decoder over a paged KV cache: `rows` token rows (prompt tokens
/// of sequences being filled, the newest token of sequences being decoded, in any mix), padded
/// to a fixed row count so that one captured plan serves every step of that count, and the rows
/// whose next token is sampled (a sequence's last row), padded to a fixed count too.
///
/// Each row carries its token id, its position in its sequence and its sequence's block table
/// (`max_blocks` ids, the unused ones 0). Padding rows hold token 0 at position 0 of a table of
/// block 0, which no sequence is given: their cache writes land there and change nothing
/// another row reads. Everything is f32 (exact integers), as the kernels read it.
///
/// A row's token may also be left to the GPU ([`StepRows::push_fed`]): it is then the token the
/// previous step sampled at a given index, which the host has not read yet — so that the step
/// can be submitted before the previous one is done.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRows {
    max_blocks: usize,
    rows: usize,
    ids: Vec<f32>,
    picks: Vec<f32>,
    fed: Vec<f32>,
    positions: Vec<f32>,
    table: Vec<f32>,
    samples: Vec<f32>,
    sampled: usize,
}

impl StepRows {
    /// An empty step of `rows` rows and `samples` sampled rows, tables of `max_blocks` blocks.
    /// [`PagingError::Config`] for no rows, no samples or tables of no blocks.
    pub fn new(rows: usize, samples: usize, max_blocks: usize) -> Result<Self, PagingError> {
        if rows == 0 || samples == 0 || max_blocks == 0 {
            return Err(PagingError::Config(
                "a step needs rows, sampled rows and table columns",
            ));
        }
        Ok(Self {
            max_blocks,
            rows: 0,
            ids: vec![0.0; rows],
            picks: vec![0.0; rows],
            fed: vec![0.0; rows],
            positions: vec![0.0; rows],
            table: vec![0.0; rows * max_blocks],
            samples: vec![0.0; samples],
            sampled: 0,
        })
    }

    /// The smallest power of two at least `rows` (at least 1): the row counts steps are
    /// planned for.
    pub fn bucket(rows: usize) -> usize {
        rows.max(1).next_power_of_two()
    }

    /// Every row count steps of `min_rows` to `max_rows` rows are padded to, fewest first:
    /// the buckets from `min_rows`'s up to the first at least `max_rows`.
    pub fn buckets(min_rows: usize, max_rows: usize) -> Vec<usize> {
        let mut counts = vec![Self::bucket(min_rows)];
        while let Some(&rows) = counts.last().filter(|&&r| r < max_rows) {
            counts.push(Self::bucket(rows + 1));
        }
        counts
    }

    /// Adds a row: `token` at `position` of a sequence whose blocks are `blocks`; `sample` asks
    /// for the next token after it, whose index among the step's samples is returned.
    /// [`PagingError::StepFull`] when the rows or samples are full or the table is longer than
    /// `max_blocks`; [`PagingError::Config`] for a position outside the table's blocks.
    pub fn push(
        &mut self,
        token: u32,
        position: usize,
        blocks: &[u32],
        block_tokens: usize,
        sample: bool,
    ) -> Result<Option<usize>, PagingError> {
        if self.rows == self.ids.len() {
            return Err(PagingError::StepFull {
                what: "rows",
                capacity: self.ids.len(),
                given: self.rows + 1,
            });
        }
        if sample && self.sampled == self.samples.len() {
            return Err(PagingError::StepFull {
                what: "sampled rows",
                capacity: self.samples.len(),
                given: self.sampled + 1,
            });
        }
        if blocks.len() > self.max_blocks {
            return Err(PagingError::StepFull {
                what: "table blocks",
                capacity: self.max_blocks,
                given: blocks.len(),
            });
        }
        if position >= blocks.len() * block_tokens {
            return Err(PagingError::Config(
                "a row's position lies past its sequence's blocks",
            ));
        }
        let row = self.rows;
        self.ids[row] = token as f32;
        self.positions[row] = position as f32;
        let start = row * self.max_blocks;
        for (slot, &block) in self.table[start..start + blocks.len()]
            .iter_mut()
            .zip(blocks)
        {
            *slot = block as f32;
        }
        self.rows += 1;
        if !sample {
            return Ok(None);
        }
        self.samples[self.sampled] = row as f32;
        self.sampled += 1;
        Ok(Some(self.sampled - 1))
    }

    /// Adds a row as [`StepRows::push`] does, whose token is the one the previous step sampled
    /// at index `previous_sample` (of as many sampled rows as this step's): its id is left to
    /// the GPU ([`StepRows::picks`], [`StepRows::fed`]). Errors as [`StepRows::push`], and
    /// [`PagingError::Config`] for an index past the sampled rows.
    pub fn push_fed(
        &mut self,
        previous_sample: usize,
        position: usize,
        blocks: &[u32],
        block_tokens: usize,
        sample: bool,
    ) -> Result<Option<usize>, PagingError> {
        if previous_sample >= self.samples.len() {
            return Err(PagingError::Config(
                "a fed row's previous sample lies past the sampled rows",
            ));
        }
        let row = self.rows;
        let sampled = self.push(0, position, blocks, block_tokens, sample)?;
        self.picks[row] = previous_sample as f32;
        self.fed[row] = 1.0;
        Ok(sampled)
    }

    /// Rows whose token the GPU takes from the previous step's samples.
    pub fn fed_rows(&self) -> usize {
        self.fed.iter().filter(|&&fed| fed != 0.0).count()
    }

    /// Rows added.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Sampled rows added.
    pub fn sampled(&self) -> usize {
        self.sampled
    }

    /// The row count the step is padded to.
    pub fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// The sampled-row count the step is padded to.
    pub fn sample_capacity(&self) -> usize {
        self.samples.len()
    }

    /// Table columns.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// Token ids, `[rows]` (0 for the rows [`StepRows::push_fed`] added).
    pub fn ids(&self) -> &[f32] {
        &self.ids
    }

    /// For each row, the index among the previous step's sampled rows whose token it takes,
    /// `[rows]` (0 where [`StepRows::fed`] is 0).
    pub fn picks(&self) -> &[f32] {
        &self.picks
    }

    /// 1 for each row whose token is the previous step's sample (its id is
    /// `ids + fed · previous[picks]`), else 0, `[rows]`.
    pub fn fed(&self) -> &[f32] {
        &self.fed
    }

    /// Positions, `[rows]`.
    pub fn positions(&self) -> &[f32] {
        &self.positions
    }

    /// Block tables, `[rows, max_blocks]`.
    pub fn table(&self) -> &[f32] {
        &self.table
    }

    /// The sampled rows' indices, `[samples]` (padding samples row 0).
    pub fn samples(&self) -> &[f32] {
        &self.samples
    }
}
