//! `tutti token new FILE`: a new random cluster token in a file only its owner can read,
//! for `--token-file` on every process of a cluster.

use clap::{Args, Subcommand};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use tutti_wire::ClusterToken;

#[derive(Args)]
pub(crate) struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Write a new token (64 random hex digits) to FILE, mode 0600; refuses to replace one.
    ///
    /// Copy the file to every machine of the cluster and pass `--token-file FILE` (or set
    /// TUTTI_TOKEN_FILE) to every tutti process and client there.
    New {
        file: PathBuf,
        /// Replace FILE if it exists (every process then needs the new token).
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(a: TokenArgs) -> Result<(), String> {
    let TokenCommand::New { file, force } = a.command;
    write_private(&file, &format!("{}\n", ClusterToken::generate()), force)
}

/// Writes `text` to a new file of mode 0600 at `path`, synced; an existing one is an error
/// unless `replace` (it is removed first: an existing file keeps its mode when opened).
pub(crate) fn write_private(path: &Path, text: &str, replace: bool) -> Result<(), String> {
    let at = |e: std::io::Error| format!("{}: {e}", path.display());
    if replace {
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(at(e));
            }
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!("{} exists; --force replaces it", path.display())
            } else {
                at(e)
            }
        })?;
    (file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all()))
    .map_err(at)
}
