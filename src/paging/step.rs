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
#[derive(Debug, Clone, PartialEq)]
pub struct StepRows {
    max_blocks: usize,
    rows: usize,
    ids: Vec<f32>,
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

    /// Token ids, `[rows]`.
    pub fn ids(&self) -> &[f32] {
        &self.ids
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
