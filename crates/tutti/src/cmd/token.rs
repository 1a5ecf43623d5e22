//! `tutti token new FILE`: a new random cluster token in a file only its owner can read,
//! for `--token-file` on every process of a cluster.

use clap::{Args, Subcommand};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
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
        /// Replace FILE if it exists: every process must then be given the new token.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(a: TokenArgs) -> Result<(), String> {
    let TokenCommand::New { file, force } = a.command;
    let mut open = std::fs::OpenOptions::new();
    open.write(true).mode(0o600);
    if force {
        // An existing file keeps its mode on open; it must not stay readable by others.
        if let Err(e) = std::fs::remove_file(&file) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(format!("{}: {e}", file.display()));
            }
        }
    }
    let mut out = open.create_new(true).open(&file).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists; --force replaces it (and every process then needs the new one)",
                file.display()
            )
        } else {
            format!("{}: {e}", file.display())
        }
    })?;
    let written = writeln!(out, "{}", ClusterToken::generate()).and_then(|()| out.sync_all());
    written.map_err(|e| format!("{}: {e}", file.display()))
}
