//! `tutti stats`: every memory node's load statistics, as a table or JSON.

use super::args::ClusterArg;
use super::out::outln;
use clap::Args;
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(a: StatsArgs, dialer: &Dialer) -> Result<(), String> {
    let cluster = a.cluster.connect(dialer).await?;
    let reports = cluster.stats().await;
    if a.json {
        let nodes: Vec<serde_json::Value> = reports
            .iter()
            .map(|(id, r)| match r {
                Ok(s) => serde_json::json!({
                    "node": id, "serving": s.serving, "epoch": s.epoch, "uncertain": s.uncertain,
                    "locks_held": s.locks_held, "lock_waiters": s.lock_waiters, "log_bytes": s.log_bytes, "log_records_live": s.log_records_live,
                    "log_syncs": s.log_sync.count(), "log_records_appended": s.log_records_appended,
                    "rss_bytes": s.rss_bytes, "log_sync_max_us": s.log_sync.max_us,
                    "backup_saved_bytes": s.backup_saved_bytes, "backup_saved_bytes_max": s.backup_saved_bytes_max,
                    "log_sync_mean_us": s.log_sync.sum_us.checked_div(s.log_sync.count()).unwrap_or(0),
                    "classes": s.classes.iter().map(|c| serde_json::json!({
                        "class": c.class,
                        "windows": s.windows_s.iter().zip(&c.windows).map(|(w, l)| serde_json::json!({
                            "window_s": w, "bytes_read": l.bytes_read, "bytes_written": l.bytes_written,
                            "committed": l.committed, "aborted_lock": l.aborted_lock,
                            "aborted_compare": l.aborted_compare, "forced_abort": l.forced_abort,
                        })).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => serde_json::json!({ "node": id, "error": e.to_string() }),
            })
            .collect();
        outln!("{}", serde_json::Value::Array(nodes));
        return Ok(());
    }
    outln!(
        "{:>4} {:<16} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8} {:>12} {:>12}",
        "node",
        "class",
        "window",
        "committed",
        "abort-lock",
        "abort-cmp",
        "forced",
        "per-s",
        "bytes-read",
        "bytes-written"
    );
    for (id, r) in &reports {
        match r {
            Ok(s) => {
                for c in &s.classes {
                    for (w, l) in s.windows_s.iter().zip(&c.windows) {
                        let rate = l.committed as f64 / *w as f64;
                        outln!(
                            "{id:>4} {:<16} {:>5}s {:>10} {:>10} {:>8} {:>8} {:>8.1} {:>12} {:>12}",
                            c.class,
                            w,
                            l.committed,
                            l.aborted_lock,
                            l.aborted_compare,
                            l.forced_abort,
                            rate,
                            l.bytes_read,
                            l.bytes_written
                        );
                    }
                }
                outln!("{id:>4} serving={} epoch={} uncertain={} locks_held={} lock_waiters={} log_bytes={} log_records_live={} log_syncs={} log_records_appended={} log_sync_max_us={} rss_bytes={}", s.serving, s.epoch, s.uncertain, s.locks_held, s.lock_waiters, s.log_bytes, s.log_records_live, s.log_sync.count(), s.log_records_appended, s.log_sync.max_us, s.rss_bytes);
            }
            Err(e) => outln!("{id:>4} unreachable: {e}"),
        }
    }
    Ok(())
}
