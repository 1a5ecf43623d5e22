//! `tutti sequencer`: the logs' sequencer (normally started by `tutti up`).

use super::args::{shutdown_signal, ClusterArg};
use clap::Args;
use tutti_log::sequencer::LEASE_DEFAULT;
use tutti_log::server::{serve, ServiceOptions};
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct SequencerArgs {
    /// Address to serve on; recorded with the manager, so clients find it there.
    #[arg(long, default_value = "127.0.0.1:7750")]
    listen: String,
    #[command(flatten)]
    cluster: ClusterArg,
    /// Positions per reservation made durable on a log's memory nodes. A successor's slow
    /// check reads up to this many slot headers.
    #[arg(long, default_value_t = LEASE_DEFAULT)]
    lease: u64,
}

pub(crate) async fn run(a: SequencerArgs, dialer: Dialer) -> Result<(), String> {
    if a.lease == 0 {
        return Err("--lease must be at least 1".into());
    }
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", a.listen))?;
    let listening = (listener.local_addr()).map_err(|e| format!("listen on {}: {e}", a.listen))?;
    tutti_wire::require_credentials_beyond_loopback(listening, dialer.credentials())?;
    let cluster = a.cluster.connect(&dialer).await?;
    let opts = ServiceOptions {
        addr: a.listen,
        lease: a.lease,
    };
    serve(listener, cluster, opts, shutdown_signal()).await;
    Ok(())
}
