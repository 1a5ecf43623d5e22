//! What a log's client API can fail with; each case is one a caller can act on
//! (docs/log.md, "Errors").

use crate::entry::EntryError;
use crate::layout::LayoutError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// Too large for a slot, too many streams, a stream listed twice.
    #[error(transparent)]
    Entry(#[from] EntryError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("log full: position {position} would overwrite an entry not yet trimmed (the log is trimmed below {trim}); trim the log")]
    Full { position: u64, trim: u64 },
    #[error("position {position} is past the tail ({tail}): nothing was written there yet")]
    PastTail { position: u64, tail: u64 },
    #[error("cannot trim to {prefix}: past the tail ({tail})")]
    TrimPastTail { prefix: u64, tail: u64 },
    #[error("no log called {0:?}")]
    NoSuchLog(String),
    #[error("region {name:?} is a {kind}, not a log")]
    NotALog { name: String, kind: String },
    #[error("a log called {0:?} exists with another shape")]
    Exists(String),
    #[error("the cluster has no sequencer (is `tutti sequencer` running? `tutti up` starts one)")]
    NoSequencer,
    /// The append's entry may be at `position` or nowhere: its write's outcome is unknown.
    #[error("the append to position {position} may or may not have landed: {why}")]
    OutcomeUnknown { position: u64, why: String },
    #[error("slot of position {0} is corrupt: {1}")]
    Corrupt(u64, String),
    #[error("gave up at the deadline; last: {last}")]
    Deadline { last: String },
    /// The cluster (a memory node, the manager, the sequencer) failed the request.
    #[error("{0}")]
    Cluster(String),
}
