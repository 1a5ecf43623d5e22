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

/// A directory a backup or a restore writes into: new, or empty when claimed.
struct Destination<'a> {
    dir: &'a std::path::Path,
    /// It did not exist: undoing removes it, not only what is in it.
    made: bool,
}

impl<'a> Destination<'a> {
    /// Creates `dir`, or checks that it is empty; `what` says what goes there, for the
    /// refusal.
    fn claim(dir: &'a std::path::Path, what: &str) -> Result<Destination<'a>, Error> {
        let made = match std::fs::read_dir(dir).map(|mut entries| entries.next().is_some()) {
            Ok(true) => {
                let shown = dir.display();
                return Err(Error::Refused(format!("{shown} is not empty: {what}")));
            }
            Ok(false) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(source) => {
                let what = format!("read {}", dir.display());
                return Err(Error::Io { what, source });
            }
        };
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        Ok(Destination { dir, made })
    }

    /// Removes what was written there (and the directory, if it was made).
    fn undo(&self) {
        if self.made {
            let _ = std::fs::remove_dir_all(self.dir);
        } else {
            self.empty();
        }
    }

    /// Removes what was written there, keeping the directory.
    fn empty(&self) {
        if let Ok(entries) = std::fs::read_dir(self.dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
}
