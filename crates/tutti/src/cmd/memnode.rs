//! `tutti memnode`: one memory node (normally started by `tutti up`).

use super::args::{parse_size, shutdown_signal, ModeArg};
use clap::Args;
use std::path::PathBuf;
use tutti_memnode::{Limits, NodeConfig, Role};
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
    /// Data directory (required but in ram mode): redo log segments, image, node.json. In
    /// ram-repl mode it must be on a tmpfs, and is emptied at start and at a clean stop.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = ModeArg::Log)]
    mode: ModeArg,
    /// log-repl, ram-repl: this process is the node's `primary` or its `mirror` (a backup
    /// copy that serves once the manager names it primary). A ram-repl primary of a node
    /// that exists already starts as a mirror.
    #[arg(long, value_enum, default_value_t = RoleArg::Primary)]
    role: RoleArg,
    /// log-repl, ram-repl primary: its mirror's address (exactly as the mirror listens), taken into
    /// the node's placement when the manager first hears of the node.
    #[arg(long, value_name = "ADDR")]
    mirror: Option<String>,
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

#[derive(Clone, Copy, clap::ValueEnum)]
enum RoleArg {
    Primary,
    Mirror,
}

pub(crate) async fn run(a: MemnodeArgs, dialer: Dialer) -> Result<(), String> {
    let replicated = a.mode.replicated();
    if !replicated && (a.mirror.is_some() || matches!(a.role, RoleArg::Mirror)) {
        return Err("--mirror and --role mirror need --mode log-repl or ram-repl".into());
    }
    if replicated && matches!(a.role, RoleArg::Primary) && a.mirror.is_none() {
        return Err(format!(
            "--mode {}: a primary needs --mirror ADDR",
            a.mode.name()
        ));
    }
    let mut cfg = NodeConfig::new(a.id, a.listen, a.manager, a.mode.mode(), a.data);
    cfg.mirror = a.mirror;
    cfg.volatile = a.mode == ModeArg::RamRepl;
    cfg.role = match a.role {
        RoleArg::Primary => Role::Primary,
        RoleArg::Mirror => Role::Mirror,
    };
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
    match tutti_memnode::run(cfg, shutdown_signal()).await {
        Ok(()) => Ok(()),
        Err(tutti_memnode::node::NodeError::Replaced(why)) => {
            eprintln!("tutti memnode: replaced: {why}");
            std::process::exit(tutti_memnode::EXIT_REPLACED);
        }
        Err(e) => Err(e.to_string()),
    }
}
