//! Why the paging layer refuses: [`PagingError`].

/// Why a KV cache's bookkeeping, a step's rows or a request stream is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PagingError {
    /// Options that describe no usable cache, step or stream.
    #[error("paging: {0}")]
    Config(&'static str),
    /// A sequence the cache cannot do this for.
    #[error("paging: sequence {id} {reason}")]
    Sequence {
        /// The sequence.
        id: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A sequence longer than the empty cache admits.
    #[error("paging: a sequence of {tokens} tokens needs {blocks} blocks; the cache has {capacity_blocks}")]
    NeverFits {
        /// Tokens the sequence can reach.
        tokens: usize,
        /// Blocks admission would take or promise for it.
        blocks: usize,
        /// Blocks sequences can have (block 0 aside).
        capacity_blocks: usize,
    },
    /// A sequence longer than the tokens the contiguous layout reserves for each
    /// ([`KvLayout::Contiguous`](crate::paging::KvLayout::Contiguous)'s `max_tokens`).
    #[error("paging: a sequence of {tokens} tokens passes the {max_tokens} tokens the contiguous layout reserves for each")]
    PassesMaxTokens {
        /// Tokens the sequence can reach.
        tokens: usize,
        /// Tokens reserved for each sequence.
        max_tokens: usize,
    },
    /// A sequence needs more blocks than are free and not promised (admitted by
    /// [`AdmitRule::Watermark`](crate::paging::AdmitRule::Watermark)): free some first.
    #[error("paging: sequence {id} needs {needed} more blocks; {available} are free")]
    OutOfBlocks {
        /// The sequence.
        id: u64,
        /// Blocks it needs beyond those promised to it.
        needed: usize,
        /// Blocks free or cached and not promised.
        available: usize,
    },
    /// A step given more rows than it holds.
    #[error("paging: a step of {capacity} {what} was given {given}")]
    StepFull {
        /// Rows or sampled rows.
        what: &'static str,
        /// How many it holds.
        capacity: usize,
        /// How many were given.
        given: usize,
    },
    /// An arrival rate that is not a positive, finite number of requests a second.
    #[error("paging: an arrival rate is a positive number of requests a second, not {rate}")]
    Rate {
        /// The rate given, as written.
        rate: String,
    },
    /// A shared prefix that leaves no room for an output in the context.
    #[error("paging: a shared prefix of {tokens} tokens leaves no room for an output in a context of {max_tokens}")]
    PrefixTooLong {
        /// The prefix's tokens.
        tokens: usize,
        /// The longest sequence (prompt and outputs).
        max_tokens: usize,
    },
}
