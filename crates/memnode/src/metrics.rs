//! The node's metrics endpoint (`--metrics ADDR`): what `tutti stats` reports (each class's
//! load over each window, and the node's gauges) in the OpenMetrics text format, encoded by
//! `prometheus-client` and served by hyper over HTTP/1.1 to every GET.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::CONTENT_TYPE;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tutti_wire::{LoadCounters, StatsReport, SyncHistogram, SYNC_BUCKETS};

const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Reads one counter of a class over a window.
type Counter = fn(&LoadCounters) -> u64;

/// `tutti_load_<name>`: its help, and the counter it reads.
const LOAD: [(&str, &str, Counter); 6] = [
    ("bytes_read", "bytes read by minitransactions", |c| {
        c.bytes_read
    }),
    (
        "bytes_written",
        "bytes written by committed minitransactions",
        |c| c.bytes_written,
    ),
    ("committed", "committed minitransactions", |c| c.committed),
    ("aborted_lock", "votes ABORT-LOCK", |c| c.aborted_lock),
    ("aborted_compare", "votes ABORT-CMP", |c| c.aborted_compare),
    ("forced_abort", "votes ABORT-FORCED or stale epoch", |c| {
        c.forced_abort
    }),
];

/// One scrape's statistics, encoded as they are when the scrape came.
#[derive(Debug)]
struct Scrape(StatsReport);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = &self.0;
        let node = r.node.to_string();
        for (name, help, counter) in LOAD {
            let (name, help) = (format!("load_{name}"), format!("{help}, over the window"));
            let mut family = encoder.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
            for class in &r.classes {
                for (window_s, counters) in r.windows_s.iter().zip(&class.windows) {
                    let labels = [
                        ("node", node.clone()),
                        ("class", class.class.clone()),
                        ("window", format!("{window_s}s")),
                    ];
                    ConstGauge::new(counter(counters)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, v) in [
            (
                "uncertain",
                "tids prepared and not yet decided",
                r.uncertain,
            ),
            (
                "locks_held",
                "ranges locked by prepared minitransactions",
                r.locks_held,
            ),
            (
                "lock_waiters",
                "single-node minitransactions waiting for busy locks",
                r.lock_waiters,
            ),
            ("log_bytes", "bytes in the redo log's segments", r.log_bytes),
            (
                "log_syncs",
                "syncs of the redo log since start",
                r.log_sync.count(),
            ),
            (
                "log_records_appended",
                "records appended to the redo log since start",
                r.log_records_appended,
            ),
            (
                "log_records_live",
                "redo log records not yet collected",
                r.log_records_live,
            ),
            ("epoch", "the epoch the node serves in", r.epoch),
            (
                "serving",
                "1 once recovery is done and the node serves",
                u64::from(r.serving),
            ),
            (
                "resident_memory_bytes",
                "the node process's resident set",
                r.rss_bytes,
            ),
            (
                "backup_saved_bytes",
                "pages a backup's cut holds saved by copy-on-write",
                r.backup_saved_bytes,
            ),
            (
                "backup_saved_bytes_max",
                "the most a backup's cut held saved at once since the node started",
                r.backup_saved_bytes_max,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v).encode(family.encode_family(&[("node", node.clone())])?)?;
        }
        let sync = &r.log_sync;
        let buckets: Vec<(f64, u64)> = (0..SYNC_BUCKETS)
            .map(|i| {
                let upper = SyncHistogram::upper_us(i).map_or(f64::INFINITY, |us| us as f64 / 1e6);
                (upper, sync.counts[i])
            })
            .collect();
        let mut family = encoder.encode_descriptor(
            "log_sync_duration_seconds",
            "how long the redo log's synced writes (write and fdatasync) took, since start",
            None,
            MetricType::Histogram,
        )?;
        family
            .encode_family(&[("node", node.clone())])?
            .encode_histogram::<NoLabelSet>(
                sync.sum_us as f64 / 1e6,
                sync.count(),
                &buckets,
                None,
            )?;
        let mut family = encoder.encode_descriptor(
            "log_sync_max_seconds",
            "the slowest synced write (write and fdatasync) of the redo log since start",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(sync.max_us as f64 / 1e6)
            .encode(family.encode_family(&[("node", node)])?)?;
        Ok(())
    }
}

/// The OpenMetrics text of one report: `tutti_load_<counter>{node,class,window}` and
/// `tutti_<gauge>{node}`.
pub fn openmetrics_text(report: &StatsReport) -> String {
    let mut registry = Registry::with_prefix("tutti");
    registry.register_collector(Box::new(Scrape(report.clone())));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding into a String cannot fail");
    out
}

/// Serves `report()`'s text on `addr` to every GET, until the process ends; a bind failure
/// is logged and leaves the node without an endpoint.
pub async fn serve(addr: String, report: impl Fn() -> StatsReport + Send + Sync + 'static) {
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics endpoint {addr}: {e}");
            return;
        }
    };
    let report = Arc::new(report);
    loop {
        let stream = tutti_wire::conn::accept(&listener).await;
        let report = report.clone();
        let service = hyper::service::service_fn(move |_request| {
            let body = openmetrics_text(&report());
            async move {
                let response = hyper::Response::builder()
                    .header(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)
                    .body(Full::new(Bytes::from(body)))
                    .expect("a valid response");
                Ok::<_, Infallible>(response)
            }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_wire::ClassLoad;

    #[test]
    fn each_class_window_and_gauge_is_one_labelled_sample() {
        let mut report = StatsReport {
            node: 2,
            windows_s: vec![5, 60],
            classes: vec![ClassLoad {
                class: "tx \"a\"".into(),
                windows: vec![
                    LoadCounters {
                        committed: 3,
                        ..LoadCounters::default()
                    },
                    LoadCounters {
                        committed: 7,
                        ..LoadCounters::default()
                    },
                ],
            }],
            uncertain: 0,
            locks_held: 0,
            lock_waiters: 0,
            log_bytes: 0,
            log_records_appended: 0,
            log_records_live: 0,
            epoch: 4,
            serving: true,
            rss_bytes: 0,
            log_sync: SyncHistogram::default(),
            backup_saved_bytes: 0,
            backup_saved_bytes_max: 0,
        };
        report.log_sync.record(100);
        report.log_sync.record(3_000);
        let text = openmetrics_text(&report);
        for line in [
            "# TYPE tutti_load_committed gauge",
            r#"tutti_load_committed{node="2",class="tx \"a\"",window="5s"} 3"#,
            r#"tutti_load_committed{node="2",class="tx \"a\"",window="60s"} 7"#,
            r#"tutti_serving{node="2"} 1"#,
            r#"tutti_epoch{node="2"} 4"#,
            "# TYPE tutti_log_sync_duration_seconds histogram",
            r#"tutti_log_sync_duration_seconds_bucket{le="0.000064",node="2"} 0"#,
            r#"tutti_log_sync_duration_seconds_bucket{le="0.000128",node="2"} 1"#,
            r#"tutti_log_sync_duration_seconds_bucket{le="0.004096",node="2"} 2"#,
            r#"tutti_log_sync_duration_seconds_bucket{le="+Inf",node="2"} 2"#,
            r#"tutti_log_sync_duration_seconds_count{node="2"} 2"#,
            r#"tutti_log_sync_max_seconds{node="2"} 0.003"#,
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }
}
