//! Memory of one memory node against the core's targets: a `ram` node's resident set stays
//! within the bytes written to it plus `RAM_HEADROOM_BYTES`, and a `log` node's does not grow
//! with the records its log has taken (GC truncates the log; only live records are indexed).

use super::minitx::{run_minitx, MinitxBench};
use super::Point;
use std::time::{Duration, Instant};
use tutti_client::{Cluster, Minitx};
use tutti_wire::{NodeId, StatsReport};

/// What a `ram` node may hold beyond the bytes written to it.
pub const RAM_HEADROOM_BYTES: u64 = 64 << 20;
/// How far a `log` node may grow past its reading after the first round of load (allocator
/// and page-cache noise); growth beyond it would follow the log's length.
pub const LOG_SLACK_BYTES: u64 = 16 << 20;
/// The largest write item the default limits allow.
const WRITE_BYTES: u64 = 1 << 20;
/// A node reads its resident set at each heartbeat (every 200 ms by default).
const HEARTBEATS_WAIT: Duration = Duration::from_secs(1);

/// `node`'s statistics once it has read its resident set again since this call.
pub(crate) async fn settled_stats(cluster: &Cluster, node: NodeId) -> Result<StatsReport, String> {
    tokio::time::sleep(HEARTBEATS_WAIT).await;
    let reports = cluster.stats().await;
    match reports.into_iter().find(|(id, _)| *id == node) {
        Some((_, Ok(s))) if s.rss_bytes > 0 => Ok(s),
        Some((_, Ok(_))) => Err(format!("node {node} reported no resident set")),
        Some((_, Err(e))) => Err(format!("stats of node {node}: {e}")),
        None => Err(format!("node {node} is not in the cluster")),
    }
}

fn point(mode: &str, stats: &StatsReport, limit_bytes: u64) -> Point {
    let mut p = Point::new("memory", "tutti", mode, 1, 1, 1);
    p.rss_bytes = Some(stats.rss_bytes);
    p.limit_bytes = Some(limit_bytes);
    p
}

/// Writes `written` distinct bytes to `node` (1 MiB per minitransaction) and reads its
/// resident set before and after: two points.
pub async fn ram(cluster: &Cluster, node: NodeId, written: u64) -> Result<Vec<Point>, String> {
    let before = settled_stats(cluster, node).await?;
    let chunk = vec![0xa5u8; WRITE_BYTES as usize];
    let start = Instant::now();
    let mut addr = 0;
    while addr < written {
        let len = (written - addr).min(WRITE_BYTES);
        let tx =
            Minitx::new()
                .class("bench-memory")
                .write(node, addr, chunk[..len as usize].to_vec());
        let out = cluster
            .exec_and_commit(&tx)
            .await
            .map_err(|e| e.to_string())?;
        if !out.committed {
            return Err(format!("a write at {addr} did not commit"));
        }
        addr += len;
    }
    let elapsed = start.elapsed();
    let after = settled_stats(cluster, node).await?;
    let mut first = point("ram", &before, RAM_HEADROOM_BYTES);
    first.written_bytes = Some(0);
    let mut last = point("ram", &after, written + RAM_HEADROOM_BYTES);
    last.written_bytes = Some(written);
    last.committed = written.div_ceil(WRITE_BYTES);
    last.throughput_per_s = (last.committed as f64 / elapsed.as_secs_f64()).round();
    Ok(vec![first, last])
}

/// Runs `b` on its one `log` node `rounds` times and reads the node's resident set and log
/// records after each: one point per round, each limited by the first reading plus
/// `LOG_SLACK_BYTES`.
pub async fn log(
    cluster: &Cluster,
    b: &MinitxBench,
    rounds: usize,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let node = b.nodes[0];
    let mut points: Vec<Point> = Vec::new();
    for _ in 0..rounds {
        let load = run_minitx(cluster, b, |_| {}).await?;
        let stats = settled_stats(cluster, node).await?;
        let limit = points
            .first()
            .and_then(|p| p.rss_bytes)
            .unwrap_or(stats.rss_bytes)
            + LOG_SLACK_BYTES;
        let mut p = point("log", &stats, limit);
        p.log_records = Some(stats.log_records_appended);
        if let Some(run) = load.first() {
            p.outstanding = run.outstanding;
            p.throughput_per_s = run.throughput_per_s;
            p.committed = run.committed;
        }
        progress(&p);
        points.push(p);
    }
    Ok(points)
}
