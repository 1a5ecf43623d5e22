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
}

pub(crate) async fn run(a: ManagerArgs, dialer: Dialer) -> Result<(), String> {
    let mut cfg = tutti_manager::ManagerConfig::new(a.listen, a.data);
    cfg.epoch_period_ms = a.epoch_period_s.max(1) * 1000;
    cfg.failure_timeout_ms = a.failure_timeout_ms;
    cfg.dialer = dialer;
    tutti_manager::run(cfg, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}
