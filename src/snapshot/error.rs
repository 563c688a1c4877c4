//! The one error type of the snapshot importer and exporters.

use std::path::PathBuf;

/// Why a snapshot could not be read or written.
///
/// The importer sorts every failure into one of these: the file could not be read
/// ([`Io`](Self::Io)), the bytes are not a well-formed pickle
/// ([`MalformedPickle`](Self::MalformedPickle)), the pickle asks Python to import or call
/// something ([`ForbiddenOpcode`](Self::ForbiddenOpcode)), it would expand past the
/// importer's memory limits ([`LimitExceeded`](Self::LimitExceeded)), the bytes are not
/// JSON ([`Json`](Self::Json)), or the data is well-formed but is not a PyTorch snapshot
/// ([`Schema`](Self::Schema)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The snapshot file could not be read.
    #[error("cannot read snapshot file {}", path.display())]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not a well-formed pickle: truncated, an unknown opcode, a stack
    /// underflow, a missing memo entry, invalid UTF-8, an integer wider than 64 bits,
    /// bytes after `STOP`, and so on.
    #[error("malformed pickle at byte {offset_bytes}: {reason}")]
    MalformedPickle {
        /// Offset of the opcode that failed, in bytes from the start of the input.
        offset_bytes: usize,
        /// What was wrong, in words.
        reason: String,
    },

    /// The pickle contains an opcode that would make Python import a global, call an
    /// object, build a class instance, resolve a persistent id or extension code, or
    /// build a set or out-of-band buffer. The importer accepts plain data only (dicts,
    /// lists, tuples, str, bytes, int, float, bool, None) and stops at the first such
    /// opcode without resolving or running anything.
    #[error(
        "forbidden pickle opcode {opcode}{} at byte {offset_bytes}: a PyTorch snapshot is \
         plain data (dict, list, tuple, str, int, float, bool, None) and loading this file \
         in Python would import or call code; it was not loaded",
        global.as_deref().map(|name| format!(" ({name})")).unwrap_or_default()
    )]
    ForbiddenOpcode {
        /// The opcode's name as Python's `pickletools` spells it, e.g. `"GLOBAL"`,
        /// `"STACK_GLOBAL"`, `"REDUCE"`, `"NEWOBJ"`, `"EMPTY_SET"`.
        opcode: &'static str,
        /// Offset of the opcode, in bytes from the start of the input.
        offset_bytes: usize,
        /// For `GLOBAL`, `INST` and `STACK_GLOBAL`: the global it names, as
        /// `module.name` (for example `posix.system`), where it could be read.
        global: Option<String>,
    },

    /// The pickle is well-formed plain data but would need more memory or nesting than
    /// the importer allows: shared (memoized) values that expand to more than the
    /// expansion budget, or containers nested deeper than the depth limit (which is also
    /// what a self-containing list looks like).
    #[error("pickle exceeds the importer's limits: {what}")]
    LimitExceeded {
        /// Which limit, with its value.
        what: String,
    },

    /// The bytes are not valid JSON (syntax error or unexpected end of input).
    #[error("invalid JSON snapshot: {0}")]
    Json(#[source] serde_json::Error),

    /// The data is well-formed but is not a PyTorch snapshot: a missing field, a
    /// value of the wrong type (a string where a number belongs, a negative size, a
    /// bytes object), a dict key that is not a string.
    #[error("not a PyTorch snapshot: at {path}: {message}")]
    Schema {
        /// Where in the document: a path such as `segments[3].blocks[0]` for pickles,
        /// `line L, column C` for JSON, `<root>` for the top level.
        path: String,
        /// What was wrong, e.g. ``missing field `blocks` ``.
        message: String,
    },

    /// The snapshot holds a value that the exporters refuse to write, such as an
    /// address at or above 2^53 (JavaScript numbers in the memory_viz viewer lose
    /// precision there).
    #[error("cannot export snapshot: {field} = {value} is not below 2^53")]
    NotRepresentable {
        /// Which field, with its position, e.g. `segments[0].blocks[2].address`.
        field: String,
        /// The offending value.
        value: u64,
    },

    /// `serde_pickle` failed to write the pickle.
    #[error("cannot write pickle: {0}")]
    PickleWrite(#[source] serde_pickle::Error),
}

impl SnapshotError {
    /// Sorts a `serde_json` error into [`Json`](Self::Json) (syntax, end of input, IO) or
    /// [`Schema`](Self::Schema) (well-formed JSON with the wrong shape).
    pub(crate) fn from_json(error: serde_json::Error) -> Self {
        if error.classify() == serde_json::error::Category::Data {
            let position = format!(" at line {} column {}", error.line(), error.column());
            let message = error.to_string();
            let message = message
                .strip_suffix(&position)
                .unwrap_or(&message)
                .to_owned();
            SnapshotError::Schema {
                path: format!("line {}, column {}", error.line(), error.column()),
                message,
            }
        } else {
            SnapshotError::Json(error)
        }
    }
}
