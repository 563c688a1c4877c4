//! A pickle reader that accepts plain data only.
//!
//! A pickle is a program for a small stack machine, and Python's `pickle.load` runs it:
//! `GLOBAL` imports any module attribute, `REDUCE` calls it. This reader runs the same
//! machine for the data opcodes of protocols 0 to 5 and refuses, at the first occurrence,
//! every opcode that would import, call, build a class instance, resolve a persistent id
//! or extension code, or build a set or buffer. Nothing is ever resolved or executed.
//!
//! Decoding happens in two passes:
//!
//! 1. [`decode`] (`machine.rs`) runs the opcodes (`opcodes.rs`) into an arena
//!    (`value.rs`): containers live in one flat `Vec`, the stack and the memo hold small
//!    copyable [`Item`](value::Item)s that point into it, and strings borrow the input.
//!    Each opcode adds at most one entry to the stack, memo, mark list or arena, so
//!    memory is linear in the input length, and every length prefix is checked against
//!    the remaining input before anything is sliced (there is nothing to allocate: string
//!    data is borrowed). Memo references share, as in Python, so a list memoized before
//!    its `APPENDS` sees the appended items. Protocol 0's text arguments are unescaped
//!    in `text.rs`.
//! 2. [`deserialize`] (`de.rs`) walks the arena as a `serde` deserializer into the typed
//!    snapshot. Shared values are copied on the way out, which can expand exponentially
//!    for a hostile file ("billion laughs" through the memo), so the walk charges every
//!    value against a budget proportional to the input length, and refuses nesting
//!    deeper than [`MAX_DEPTH`](de::MAX_DEPTH) (which also stops self-containing lists).

mod de;
mod machine;
mod opcodes;
mod text;
mod value;

pub(crate) use de::deserialize;
pub(crate) use machine::decode;
