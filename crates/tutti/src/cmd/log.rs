//! `tutti log`: the shared log from the command line (create, append, read, tail, stream,
//! trim, stat), one JSON object per answer, so that people and scripts can use a log
//! without Rust. What each error means is in docs/log.md, "Errors".

use super::args::{parse_size, ClusterArg};
use super::items::{hex, to_hex};
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::json;
use std::time::Duration;
use tutti_log::{Found, Hole, Log, LogLayout, LogOptions, LogShape, StreamId};
use tutti_wire::{Dialer, NodeId};

#[derive(Args)]
pub(crate) struct LogArgs {
    #[command(subcommand)]
    command: LogCommand,
    #[command(flatten)]
    cluster: ClusterArg,
    /// How long a reader waits for the writer of an unwritten position below the tail
    /// before it fills the position with junk.
    #[arg(long, global = true, default_value_t = 100)]
    hole_timeout_ms: u64,
}

#[derive(Subcommand)]
enum LogCommand {
    /// Create a log striped over memory nodes; prints its shape. Creating it again with
    /// the same shape does nothing.
    Create {
        name: String,
        /// Bytes per slot: an entry's header, stream headers and payload must fit one.
        #[arg(long, default_value_t = 4096)]
        slot_bytes: u32,
        /// Memory nodes to stripe over, in position order (default: every node).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<NodeId>,
        /// Bytes of each node's space the log takes (suffixes K, M, G); the log holds
        /// (capacity - 4 KiB) / slot-bytes entries per node before it must be trimmed.
        #[arg(long, default_value = "64M", value_parser = parse_size)]
        capacity_bytes: u64,
        /// Backpointers per stream in each entry (Tango's K).
        #[arg(long, default_value_t = 4)]
        backpointers: u8,
    },
    /// Append one entry (HEX bytes) to the given streams (none: to no stream); prints its
    /// position.
    Append {
        name: String,
        /// A stream (a number below 2^32) the entry belongs to; repeat for several.
        #[arg(long = "stream")]
        streams: Vec<StreamId>,
        hex: String,
    },
    /// Read one position. A hole below the tail is waited for and then filled with junk,
    /// unless --no-fill.
    Read {
        name: String,
        position: u64,
        /// Report an unwritten position as "empty" instead of filling it.
        #[arg(long)]
        no_fill: bool,
    },
    /// The next position to be handed out (the sequencer's fast check).
    Tail {
        name: String,
        /// Instead, one past the last entry written, from the memory nodes alone (CORFU's
        /// slow check): below the fast check by what is handed out and not yet written.
        #[arg(long)]
        slow: bool,
    },
    /// Print every entry of a stream in log order, one JSON object per line.
    Stream {
        name: String,
        stream: StreamId,
        /// Start at this position.
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Give up every position below PREFIX, so that their slots can be reused.
    Trim { name: String, prefix: u64 },
    /// The log's shape, epoch, trim point and tail.
    Stat { name: String },
}

pub(crate) async fn run(a: LogArgs, dialer: &Dialer) -> Result<(), String> {
    let cluster = a.cluster.connect(dialer).await?;
    let opts = LogOptions {
        deadline: a.cluster.deadline(),
        hole_timeout: Duration::from_millis(a.hole_timeout_ms),
    };
    let e = |e: tutti_log::LogError| e.to_string();
    match a.command {
        LogCommand::Create {
            name,
            slot_bytes,
            nodes,
            capacity_bytes,
            backpointers,
        } => {
            let nodes = if nodes.is_empty() {
                cluster.nodes().iter().map(|n| n.id).collect()
            } else {
                nodes
            };
            let shape = LogShape {
                nodes,
                slot_bytes,
                capacity_bytes,
                backpointers,
            };
            let log = Log::create(&cluster, &name, &shape, opts)
                .await
                .map_err(e)?;
            outln!("{}", shape_json(&name, log.layout()));
        }
        LogCommand::Append {
            name,
            streams,
            hex: data,
        } => {
            let payload = hex(&data)?;
            let log = Log::open(&cluster, &name, opts).await.map_err(e)?;
            let position = log.append(payload, &streams).await.map_err(e)?;
            outln!("{}", json!({ "position": position }));
        }
        LogCommand::Read {
            name,
            position,
            no_fill,
        } => {
            let log = Log::open(&cluster, &name, opts.clone()).await.map_err(e)?;
            let hole = if no_fill {
                Hole::Report
            } else {
                Hole::FillAfter(opts.hole_timeout)
            };
            let until = tokio::time::Instant::now() + opts.deadline;
            let found = log.read_with(position, hole, until).await.map_err(e)?;
            let (streams, data) = match &found {
                Found::Data { streams, payload } => {
                    (streams.iter().map(|s| s.stream).collect(), to_hex(payload))
                }
                _ => (vec![], String::new()),
            };
            outln!(
                "{}",
                json!({
                    "position": position,
                    "state": found.state(),
                    "streams": streams,
                    "data": data,
                })
            );
        }
        LogCommand::Tail { name, slow } => {
            let log = Log::open(&cluster, &name, opts).await.map_err(e)?;
            let tail = if slow {
                log.check_slow().await.map_err(e)?
            } else {
                log.check().await.map_err(e)?.tail
            };
            outln!("{}", json!({ "tail": tail }));
        }
        LogCommand::Stream { name, stream, from } => {
            let log = Log::open(&cluster, &name, opts).await.map_err(e)?;
            let mut reader = log.stream(stream, from);
            while let Some((position, payload)) = reader.readnext().await.map_err(e)? {
                outln!(
                    "{}",
                    json!({ "position": position, "data": to_hex(&payload) })
                );
            }
        }
        LogCommand::Trim { name, prefix } => {
            let log = Log::open(&cluster, &name, opts).await.map_err(e)?;
            log.trim(prefix).await.map_err(e)?;
            outln!("{}", json!({ "trim": prefix }));
        }
        LogCommand::Stat { name } => {
            let log = Log::open(&cluster, &name, opts).await.map_err(e)?;
            let stat = log.stat().await.map_err(e)?;
            let max = |f: fn(&tutti_log::minitxs::Words) -> u64| stat.words.iter().map(f).max();
            let mut out = shape_json(&name, &stat.layout);
            out["epoch"] = json!(stat.tail.epoch);
            out["trim"] = json!(max(|w| w.trim));
            out["tail"] = json!(stat.tail.tail);
            out["reserved_to"] = json!(max(|w| w.reserved_to));
            outln!("{out}");
        }
    }
    // Appends, fills and trims leave decisions queued: send them before exiting.
    cluster.flush().await.map_err(|e| e.to_string())
}

/// A log's name and shape, as `create` and `stat` print them.
fn shape_json(name: &str, l: &LogLayout) -> serde_json::Value {
    json!({
        "name": name,
        "nodes": l.nodes.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "slot_bytes": l.slot_bytes,
        "slots_per_node": l.slots_per_node,
        "capacity_entries": l.period(),
        "backpointers": l.backpointers,
    })
}
