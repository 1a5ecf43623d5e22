//! Tango's objects over tutti's shared log (docs/objects.md): an object is a view that its
//! stream's entries build by replay on any client; mutators append, accessors play the
//! streams to the tail first, so both are linearizable; transactions across objects commit
//! or abort by the versions their commit record carries, decided the same way by every
//! client that plays it (Tango §3–4).
//!
//! What decides anything is sans-I/O (`runtime`, `record`, the objects); `Tango` drives it
//! over the log client (`tutti_log::Log`). It does not store anything itself: durability,
//! ordering and recovery are the log's.

/// Deliberate protocol bugs that show the simulator's checkers catch what they stand for
/// (crates/sim/tests/planted.rs). Planted only with the `planted-bugs` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A commit record is decided from a stale version: a read passes if the version it
    /// saw is not newer than the current one, instead of equal to it.
    DecideFromStaleVersion,
    /// Decision records are ignored: a client that does not host a commit's read set
    /// decides it anyway, taking the reads it cannot check for current.
    IgnoreDecisionRecords,
    /// The log is trimmed below the highest forget position instead of the lowest,
    /// below some object's forget position.
    TrimBelowForget,
    /// A speculative entry's writes are applied when it is played, not when its commit
    /// record commits: an aborted or orphaned transaction's writes show.
    ApplySpeculativeOnSight,
}

tutti_wire::planted_bugs!(Bug);

mod client;
pub mod codec;
pub mod directory;
mod error;
pub mod handles;
pub mod ledger;
pub mod namespace;
mod namespace_ref;
pub mod object;
pub mod objects;
pub mod play;
pub mod record;
pub mod runtime;

pub use client::{Tango, TangoOptions, TxOutcome, DECISION_TIMEOUT_DEFAULT};
pub use codec::Malformed;
pub use directory::{Created, Directory, Meta, DIRECTORY_OID};
pub use error::TangoError;
pub use handles::{CounterRef, LedgerRef, LedgerWriter, MapRef, QueueRef, RegisterRef};
pub use ledger::{Ledger, LedgerReply};
pub use namespace::{Change, ChangeKind, Code, Namespace, Op, OpResult, Stat, ANY_VERSION};
pub use namespace_ref::{now_ms, version_or_any, Event, NamespaceRef, Session, WatchKind, Watches};
pub use object::{Applied, Object};
pub use objects::{Counter, Kind, Map, Queue, Register, SortedMap};
pub use play::{Load, LoadStep, PlayStep, Player, Rebuild, RebuildStep, Synced};
pub use record::{Oid, Read, Record, Speculated, Write};
pub use runtime::{Progress, Reply, Runtime, TooLarge, Tx, ViewError};
