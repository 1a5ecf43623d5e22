//! `tutti memnode`: one memory node (normally started by `tutti up`).

use super::args::{parse_size, shutdown_signal, ModeArg};
use clap::Args;
use std::path::PathBuf;
use tutti_memnode::{Limits, NodeConfig};
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct MemnodeArgs {
    /// This node's id (1, 2, …), unique in the cluster.
    #[arg(long)]
    id: u16,
    #[arg(long, default_value = "127.0.0.1:7701")]
    listen: String,
    /// The manager's address, or every address of a manager group, comma-separated (the
    /// node follows the group's leader).
    #[arg(long, default_value = "127.0.0.1:7700")]
    manager: String,
    /// Data directory (required in log mode): redo log segments, image, node.json.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = ModeArg::Log)]
    mode: ModeArg,
    /// Bytes of address space (suffixes K, M, G accepted). Fixed at creation.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Serve metrics over HTTP on this address, in the OpenMetrics text format Prometheus scrapes.
    #[arg(long)]
    metrics: Option<String>,
    /// A tid uncertain this long is reported to the manager's recovery coordinator.
    #[arg(long, default_value_t = 2_000)]
    timeout_uncertain_ms: u64,
    /// How often the image is flushed and the log head collected.
    #[arg(long, default_value_t = 2_000)]
    checkpoint_interval_ms: u64,
    /// Redo log segment size; garbage collection deletes whole segments.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    log_segment_bytes: u64,
    #[arg(long, default_value_t = 1 << 20)]
    item_bytes_max: u64,
    #[arg(long, default_value_t = 16 << 20)]
    minitx_bytes_max: u64,
    #[arg(long, default_value_t = 4096)]
    items_max: usize,
}

pub(crate) async fn run(a: MemnodeArgs, dialer: Dialer) -> Result<(), String> {
    let mut cfg = NodeConfig::new(a.id, a.listen, a.manager, a.mode.mode(), a.data);
    cfg.size_bytes = a.size;
    cfg.metrics = a.metrics;
    cfg.dialer = dialer;
    cfg.timeout_uncertain_ms = a.timeout_uncertain_ms;
    cfg.checkpoint_interval_ms = a.checkpoint_interval_ms;
    cfg.log_segment_bytes = a.log_segment_bytes;
    cfg.limits = Limits {
        item_bytes_max: a.item_bytes_max,
        minitx_bytes_max: a.minitx_bytes_max,
        items_max: a.items_max,
    };
    cfg.frame_bytes_max = (a.minitx_bytes_max as usize)
        .saturating_add(1 << 20)
        .max(tutti_wire::FRAME_BYTES_MAX_DEFAULT);
    tutti_memnode::run(cfg, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}
