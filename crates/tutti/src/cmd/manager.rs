//! `tutti manager`: the management node (normally started by `tutti up`).

use super::args::shutdown_signal;
use clap::Args;
use std::path::PathBuf;
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct ManagerArgs {
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: String,
    /// Where the directory and epoch are kept.
    #[arg(long)]
    data: PathBuf,
    /// Seconds between epochs (forced-abort entries live two epochs).
    #[arg(long, default_value_t = 3600)]
    epoch_period_s: u64,
    /// A node silent this long is reported as not alive.
    #[arg(long, default_value_t = 3_000)]
    failure_timeout_ms: u64,
    /// A replicated node (`log-repl`) whose primary is silent this long is served by its
    /// mirror from then on; a mirror silent (or behind) this long is dropped.
    #[arg(long, default_value_t = 500)]
    failover_timeout_ms: u64,
    /// Every manager of a Raft group, in the same order at each (comma-separated
    /// addresses, this one's included). Without it, the manager is a group of one.
    #[arg(long, value_name = "ADDR,ADDR,...", requires = "id")]
    peers: Option<String>,
    /// This manager's place in --peers, from 1.
    #[arg(long, requires = "peers")]
    id: Option<u64>,
}

pub(crate) async fn run(a: ManagerArgs, dialer: Dialer) -> Result<(), String> {
    let mut cfg = tutti_manager::ManagerConfig::new(a.listen, a.data);
    if let (Some(peers), Some(id)) = (a.peers, a.id) {
        cfg.peers = peers.split(',').map(|p| p.trim().to_string()).collect();
        if id == 0 || id as usize > cfg.peers.len() {
            return Err(format!("--id {id}: not one of 1..={}", cfg.peers.len()));
        }
        cfg.id = id;
    }
    cfg.epoch_period_ms = a.epoch_period_s.max(1) * 1000;
    cfg.failure_timeout_ms = a.failure_timeout_ms;
    cfg.failover_timeout_ms = a.failover_timeout_ms;
    cfg.dialer = dialer;
    tutti_manager::run(cfg, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}
