//! `tutti log-workload` (hidden): a client process of `tutti chaos --workload log`, an
//! appender or a stream reader that runs until killed, printing what it saw
//! (`tutti_harness::log_workload`).

use super::args::ClusterArg;
use clap::Args;
use tutti_wire::Dialer;

#[derive(Args)]
#[group(id = "role", required = true, args = ["appender", "reader"])]
pub(crate) struct LogWorkloadArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// The log's name.
    #[arg(long)]
    log: String,
    /// Append to random streams as this client id.
    #[arg(long)]
    appender: Option<u64>,
    /// Read this stream.
    #[arg(long)]
    reader: Option<u32>,
    /// Which start of this client this is (part of every entry's tag).
    #[arg(long, default_value_t = 1)]
    incarnation: u64,
}

pub(crate) async fn run(a: LogWorkloadArgs, dialer: &Dialer) -> Result<(), String> {
    let log = a.cluster.open_log(dialer, &a.log).await?;
    match (a.appender, a.reader) {
        (Some(id), _) => tutti_harness::log_workload::append_forever(log, id, a.incarnation).await,
        (_, Some(stream)) => tutti_harness::log_workload::read_forever(log, stream).await,
        (None, None) => unreachable!("clap requires a role"),
    }
    Ok(())
}
