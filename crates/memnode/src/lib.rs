//! The tutti memory node: a byte address space that minitransactions read, compare and
//! write atomically (Sinfonia §3–4). `participant` is the protocol as a sans-I/O state
//! machine; `node` drives it on tokio with a redo log, an image file and the manager.
//! Coordinators live in `tutti-client`; recovery of coordinator crashes in `tutti-manager`.

pub mod log_record;
pub mod metrics;
pub mod mirror;
mod mirror_node;
pub mod node;
pub mod participant;
mod primary;
pub mod range_locks;
pub mod recovery;
pub mod redo_log;
pub mod segment_files;
pub mod shipper;
pub mod space;
pub mod stats;

pub use node::{run, NodeConfig, Role};
pub use participant::{Config, Mode, Participant};
pub use tutti_wire::Limits;
pub use tutti_wire::EXIT_REPLACED;
