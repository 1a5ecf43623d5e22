//! `tutti objects-workload` (hidden): a client process of `tutti chaos --workload objects`,
//! with its own views of the objects, running register and bank tasks until killed
//! (`tutti_harness::objects_workload`).

use super::args::ClusterArg;
use clap::Args;
use std::path::PathBuf;
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct ObjectsWorkloadArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// The log's name.
    #[arg(long)]
    log: String,
    /// This client's id: which bank maps it hosts.
    #[arg(long)]
    client: u64,
    /// Which start of this client this is (part of every transfer's tag).
    #[arg(long, default_value_t = 1)]
    incarnation: u64,
    /// Where to write the register history Porcupine checks.
    #[arg(long)]
    history: PathBuf,
}

pub(crate) async fn run(a: ObjectsWorkloadArgs, dialer: &Dialer) -> Result<(), String> {
    let log = a.cluster.open_log(dialer, &a.log).await?;
    tutti_harness::objects_workload::run_client(log, a.client, a.incarnation, &a.history).await;
    Ok(())
}
