//! What the tango client API can fail with (docs/objects.md, "Errors").

use crate::objects::Kind;
use crate::runtime::ViewError;
use tutti_log::LogError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TangoError {
    /// The log failed the append, read, check or trim.
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("no object called {0:?}")]
    NoSuchObject(String),
    #[error("{name:?} is a {is}, not a {wanted}")]
    KindMismatch {
        name: String,
        is: Kind,
        wanted: Kind,
    },
    #[error("bad object name {0:?}: 1 to 255 bytes of UTF-8, and not \".\"")]
    BadName(String),
    /// One write, or the commit record's reads, do not fit in one log entry.
    #[error("part of the transaction is {bytes} bytes in one log entry; an entry holds {max} with its {streams} streams (a write or the read set is too large)")]
    TxTooLarge {
        bytes: usize,
        max: usize,
        streams: usize,
    },
    #[error("the transaction touches {0} objects; one commit record reaches at most {max}", max = tutti_log::entry::STREAMS_PER_ENTRY_MAX)]
    TxTooManyObjects(usize),
    /// The object could not parse the update at `position`: it changed nothing.
    #[error("the update at position {position} is malformed: {why}")]
    Malformed { position: u64, why: String },
    #[error("a checkpoint of {bytes} bytes; one holds at most {max} with this log's slots")]
    CheckpointTooLarge { bytes: usize, max: usize },
    #[error("object {0:?} has no checkpoint: checkpoint it before forgetting its history")]
    NoCheckpoint(String),
    #[error("the log was trimmed at {trim}, past what this client had played ({played}): reopen to rebuild the views from their checkpoints")]
    Trimmed { trim: u64, played: u64 },
    /// A namespace operation failed as ZooKeeper's would (`code.name()` is what the CLI
    /// prints).
    #[error("{code}: {path}")]
    Namespace {
        code: crate::namespace::Code,
        path: String,
    },
    #[error("the ledger refused the update at position {position}: another writer claimed it, a recovery fenced this writer, or it is closed")]
    LedgerFenced { position: u64 },
    #[error("bad path {path:?}: {why}")]
    BadPath { path: String, why: String },
    #[error("the commit record at {commit} could not be decided: {why}")]
    Undecided { commit: u64, why: String },
}
