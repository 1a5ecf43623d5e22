//! `tutti node add`: a memory node more for the local cluster a running `tutti up` serves.
//! It records the node in cluster.json, `tutti up` starts and supervises it, and this waits
//! until the manager's directory has it serving. `tutti node list`: every node as the
//! managers have it, with its placement (which process serves it, which mirrors it).

use super::args::{with_cluster_credentials, ClusterArg};
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tutti_client::{ClientOptions, Cluster};
use tutti_wire::Dialer;

/// How long `node add` waits for the new node to serve.
const JOIN_WAIT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub(crate) struct NodeArgs {
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Add a memory node to the cluster `tutti up --data DIR` runs, while it serves:
    /// {"node": ID, "addr": ..., "data": ...}.
    ///
    /// The node gets the next id, the cluster's mode and size, and free ports; `tutti up`
    /// starts it within a second, restarts it like the others, and starts it again with the
    /// cluster. Clients find it in the directory by themselves. Space in it is taken by what
    /// asks for it: `tutti fs grow` extends a file system onto it.
    Add {
        /// The data directory of the running `tutti up`.
        #[arg(long, default_value = "./tutti-data")]
        data: PathBuf,
    },
    /// Every memory node as the managers have it, one JSON object per line: {"node": ID,
    /// "addr": where it is served, "alive", "size_bytes", "placement": {"config_epoch",
    /// "primary", "mirror"} or null (a node that is not replicated)}.
    ///
    /// In `log-repl` and `ram-repl` mode the placement says which process serves the node
    /// and which one holds its copy; `mirror` is null while the node runs alone (its mirror
    /// lost, or a new one still joining).
    List {
        #[command(flatten)]
        cluster: ClusterArg,
    },
}

pub(crate) async fn run(a: NodeArgs, dialer: &Dialer) -> Result<(), String> {
    let data = match a.command {
        NodeCommand::Add { data } => data,
        NodeCommand::List { cluster } => return list(&cluster, dialer).await,
    };
    let dir = data.canonicalize().map_err(|e| {
        format!(
            "{}: {e}; `tutti up --data DIR` makes a cluster there",
            data.display()
        )
    })?;
    let file = tutti_harness::local::read_file(&dir).map_err(|e| e.to_string())?;
    let dialer = with_cluster_credentials(dialer, &file.credentials)?;
    let node = tutti_harness::local::record_node(&dir).map_err(|e| e.to_string())?;
    let until = Instant::now() + JOIN_WAIT;
    loop {
        let opts = ClientOptions {
            deadline: Duration::from_millis(500),
            dialer: dialer.clone(),
            ..ClientOptions::default()
        };
        if let Ok(cluster) = Cluster::connect(&file.manager, opts).await {
            if (cluster.nodes().iter()).any(|n| n.id == node.id && n.alive) {
                break;
            }
        }
        if Instant::now() > until {
            return Err(format!(
                "node {} is recorded in {} but did not join within {JOIN_WAIT:?}: is `tutti up --data {}` running? It starts the nodes cluster.json lists (and this one when it next starts)",
                node.id,
                dir.join("cluster.json").display(),
                data.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = json!({
        "node": node.id,
        "addr": node.addr,
        "metrics": node.metrics,
        "data": node.data,
    });
    outln!("{out}");
    Ok(())
}

async fn list(cluster: &ClusterArg, dialer: &Dialer) -> Result<(), String> {
    let c = cluster.connect(dialer).await?;
    for n in c.nodes() {
        let ask = tutti_wire::Request::Placement { node: n.id };
        let placement = match c.ask_manager(&ask).await {
            Ok(tutti_wire::Response::Placement(p)) => p,
            other => return Err(format!("node {}'s placement: {other:?}", n.id)),
        };
        let out = json!({
            "node": n.id,
            "addr": n.addr,
            "alive": n.alive,
            "size_bytes": n.size_bytes,
            "placement": placement.map(|p| json!({
                "config_epoch": p.config_epoch,
                "primary": p.primary,
                "mirror": p.mirror,
            })),
        });
        outln!("{out}");
    }
    Ok(())
}
