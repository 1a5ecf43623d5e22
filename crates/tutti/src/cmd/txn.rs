//! `tutti txn`: one minitransaction from items on the command line, its outcome as JSON.

use super::args::ClusterArg;
use super::items::{parse_items, to_hex};
use super::out::outln;
use clap::Args;
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct TxnArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// Class to count this minitransaction under in `tutti stats`.
    #[arg(long, default_value = "txn")]
    class: String,
    #[arg(required = true)]
    items: Vec<String>,
}

pub(crate) async fn run(a: TxnArgs, dialer: &Dialer) -> Result<(), String> {
    let tx = parse_items(&a.items)
        .map_err(|e| e.to_string())?
        .class(&a.class);
    let cluster = a.cluster.connect(dialer).await?;
    let out = cluster
        .exec_and_commit(&tx)
        .await
        .map_err(|e| e.to_string())?;
    // The decision must reach the participants before this process exits, or the locks
    // stay held until the recovery coordinator steps in.
    cluster.flush().await.map_err(|e| e.to_string())?;
    let json = serde_json::json!({
        "committed": out.committed,
        "reads": out.reads.iter().map(|r| to_hex(r)).collect::<Vec<_>>(),
        "failed_compares": out.failed_compares,
    });
    outln!("{json}");
    Ok(())
}
