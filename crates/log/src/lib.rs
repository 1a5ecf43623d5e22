//! The shared log of Tango and CORFU, stored on memory nodes (docs/log.md): positions striped
//! round robin over a set of nodes, each written once by a one-node minitransaction whose
//! compares fence stale epochs and untrimmed slots; a sequencer that hands out positions and
//! each stream's backpointers; a seal that moves the log to a new epoch on every node at once.
//!
//! This crate holds the log's formats and its sans-I/O logic; it sends nothing.

pub mod entry;
pub mod layout;
pub mod minitxs;
pub mod sequencer;
pub mod takeover;

pub use entry::{Content, Entry, EntryError, StreamHeader, StreamId};
pub use layout::{LayoutError, LogLayout, Slot};
pub use sequencer::{Answer, Ask, Reservation, Sequencer};
pub use takeover::{SlowCheck, Step, TakenOver, Takeover, TakeoverError};
