//! `tutti fs-workload` (hidden): a client process of `tutti chaos --workload fs`, working
//! through a mount with system calls until killed (`tutti_harness::fs_workload`).

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct FsWorkloadArgs {
    /// This client's id: its own directory is `own-ID`.
    #[arg(long)]
    client: u64,
    /// Which start of this client this is.
    #[arg(long, default_value_t = 1)]
    incarnation: u64,
    /// Where to write the register history Porcupine checks.
    #[arg(long)]
    history: PathBuf,
    /// Where to write each action and its answer.
    #[arg(long)]
    actions: PathBuf,
    /// The mount to work in.
    root: PathBuf,
}

pub(crate) fn run(a: FsWorkloadArgs) -> Result<(), String> {
    tutti_harness::fs_workload::run_client(
        &a.root,
        a.client,
        a.incarnation,
        &a.history,
        &a.actions,
    );
    Ok(())
}
