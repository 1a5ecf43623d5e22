//! Consistent backups of a tutti cluster (Sinfonia §4.8; docs/backup.md). `create` takes a
//! cut at the same point on every memory node while minitransactions go on, copies each
//! image as of the cut and writes the manifest last; `verify` checks a backup; `restore`
//! makes a new local cluster of it. The cut's protocol is `tutti_client::backup`.

mod create;
pub mod format;
mod restore;

pub use create::{create, CreateOptions};
pub use format::{verify, Manifest, NodeImage};
pub use restore::{restore, Restored};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The backup on disk is incomplete, changed or not a backup.
    #[error("{}: {reason}", path.display())]
    Damaged { path: PathBuf, reason: String },
    /// The cluster could not be backed up (a node down, locks that did not drain).
    #[error("{0}")]
    Cluster(String),
    /// What was asked cannot be done as asked (a destination that holds files).
    #[error("{0}")]
    Refused(String),
}
