//! Tango's objects over tutti's shared log (docs/objects.md): an object is a view that its
//! stream's entries build by replay on any client; mutators append, accessors play the
//! streams to the tail first, so both are linearizable; transactions across objects commit
//! or abort by the versions their commit record carries, decided the same way by every
//! client that plays it (Tango §3–4).
//!
//! What decides anything is sans-I/O (`runtime`, `record`, the objects); `Tango` drives it
//! over the log client (`tutti_log::Log`). It does not store anything itself: durability,
//! ordering and recovery are the log's.

mod client;
pub mod codec;
pub mod directory;
mod error;
pub mod handles;
pub mod object;
pub mod objects;
pub mod play;
pub mod record;
pub mod runtime;

pub use client::{Tango, TangoOptions, TxOutcome, DECISION_TIMEOUT_DEFAULT};
pub use codec::Malformed;
pub use directory::{Created, Directory, Meta, DIRECTORY_OID};
pub use error::TangoError;
pub use handles::{CounterRef, MapRef, QueueRef, RegisterRef};
pub use object::{Applied, Object};
pub use objects::{Counter, Kind, Map, Queue, Register, SortedMap};
pub use play::{Load, LoadStep, PlayStep, Player, Rebuild, RebuildStep, Synced};
pub use record::{Oid, Read, Record, Write};
pub use runtime::{Progress, Reply, Runtime, Tx, ViewError};
