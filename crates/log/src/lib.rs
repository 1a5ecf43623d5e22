//! The shared log of Tango and CORFU, stored on memory nodes (docs/log.md): positions striped
//! round robin over a set of nodes, each written once by a one-node minitransaction whose
//! compares fence stale epochs and untrimmed slots; a sequencer that hands out positions and
//! each stream's backpointers; a seal that moves the log to a new epoch on every node at once.
//!
//! The formats and every decision are sans-I/O (`append`, `read`, `stream`, `sequencer`,
//! `takeover`), driven by the async client (`Log`, `Stream`) and the sequencer service
//! (`server`, run by `tutti sequencer`, over `service`) here, and by the simulator.

pub mod append;
pub mod batch;
mod client;
pub mod entry;
mod error;
pub mod layout;
pub mod minitxs;
pub mod own;
pub mod read;
pub mod sequencer;
pub mod server;
pub mod service;
pub mod stream;
pub mod takeover;

/// Deliberate protocol bugs that show the simulator's checkers catch what they stand for
/// (crates/sim/tests/planted.rs). Planted only with the `planted-bugs` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A restarted sequencer takes no epoch and seals nothing: it resumes in the log's epoch
    /// from the counter it last made durable (reserved_from), below what it handed out.
    ResumeWithoutSeal,
    /// A reader whose hole timeout passed takes the hole for junk without filling it.
    SkipHoleWithoutFill,
    /// The seal reaches the log's first node before the takeover scans, the others after.
    PartialSeal,
    /// A new epoch starts after the last entry written, handing out again the positions
    /// above it that were handed out and not yet written.
    RegrantUnwritten,
    /// A write of a batch that another write's refusal held back counts as written.
    HeldBackCountsAsWritten,
    /// A takeover's scan keeps only the entries of the positions it scans, not those of an
    /// earlier lap still in their slots (the new epoch starting over a period above the
    /// trim point).
    ScanSkipsEarlierLap,
    /// A fast check (a stream sync's, `Log::check`) takes the sequencer's tail without
    /// checking that its epoch is still the log's: a replaced sequencer's stale tail
    /// passes for current.
    UnfencedTail,
    /// An append that gives up its position (another entry took it, or the log moved on)
    /// leaves its entry among the client's own entries at that position.
    OwnEntryKeptWhenMoved,
}

tutti_wire::planted_bugs!(Bug);

pub use append::{Append, AppendStep};
pub use batch::{Batch, Batcher};
pub use client::{Log, LogOptions, LogShape, Stat, Stream, Tail, REGION_KIND};
pub use entry::{Content, Entry, EntryError, StreamHeader, StreamId};
pub use error::LogError;
pub use layout::{LayoutError, LogLayout, Slot};
pub use own::{Own, OwnEntries};
pub use read::{Found, Hole, ReadAt, ReadStep, HOLE_TIMEOUT_DEFAULT};
pub use sequencer::{Answer, Ask, Reservation, Sequencer};
pub use stream::{Sync, SyncStep};
pub use takeover::{SlowCheck, Step, TakenOver, Takeover, TakeoverError};
