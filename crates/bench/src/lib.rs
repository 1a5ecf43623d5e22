//! `tutti bench`: Sinfonia's §7.1 experiments on this machine, next to the physical limits
//! and the peers a user would pick instead (Redis, PostgreSQL, etcd, an embedded SQLite),
//! every point in one JSON record format.

pub mod backup;
pub mod cpu;
pub mod driver;
pub mod fs;
pub mod fs_peers;
pub mod fs_phases;
pub mod history;
pub mod limits;
pub mod log;
pub mod memory;
pub mod minitx;
pub mod namespace;
pub mod objects;
pub mod partitions;
pub mod peers;
pub mod replication;
pub mod suite;
pub mod transactions;
pub mod views;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The sections of RESULTS.md each suite writes from a run of its own (begin and end
/// markers): `tutti bench all` keeps them when it writes the rest.
pub const SUITE_SECTIONS: [(&str, &str); 4] = [
    (log::SECTION_BEGIN, log::SECTION_END),
    (objects::SECTION_BEGIN, objects::SECTION_END),
    (fs::SECTION_BEGIN, fs::SECTION_END),
    (replication::SECTION_BEGIN, replication::SECTION_END),
];

/// One measured point, in the record format shared by every benchmark.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Point {
    pub experiment: String,
    pub system: String,
    pub mode: String,
    pub nodes: usize,
    pub spread: usize,
    pub outstanding: usize,
    pub throughput_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The tail: a stall that stops every operation in flight for a moment shows here
    /// first, not at p99.
    #[serde(default)]
    pub p999_us: f64,
    #[serde(default)]
    pub max_us: f64,
    pub committed: u64,
    pub compare_failed: u64,
    pub errors: u64,
    /// Fig. 20: the size of the set items are drawn from, and the probability that two
    /// minitransactions overlap, as the paper computes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<f64>,
    /// Fig. 17 and 20: which operation (`cas`, `inc`, `add`; `rw6`, `ro50`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Fig. 17: which system (`A` per-item round trips then 2PC, `B` batched then 2PC, `C`
    /// 2PC combined, `D` 1PC combined). fs: `one-mount` or `two-mounts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Fig. 16 at the outstanding count the targets are read at: the throughput of every run,
    /// in the order measured; the record itself is the median run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    /// Memory: the node's resident set and the most it may use, after `written_bytes`
    /// written (`ram`) or `log_records` appended to its log since it started (`log`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_records: Option<u64>,
    /// The slowest synced write (write and fdatasync) of any server's log during the point
    /// (tutti `log`: read from the memory nodes' statistics before and after it): what the
    /// disk alone cost the slowest operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_sync_max_us: Option<u64>,
    /// `log_sync_max_us` is an upper bound (its histogram bucket's), not the write's time:
    /// that write was not the slowest since its node started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub log_sync_max_is_bound: bool,
    /// tutti's shared log: the trims that committed during the point, and the slowest of
    /// them (each trim is a minitransaction over every node of the log, racing the appends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trims: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim_max_us: Option<u64>,
    /// Objects: the client processes with their own views that served the point, and the
    /// writes per second a writer made meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub views: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_writes_per_s: Option<f64>,
    /// fs: the phase's seconds. Objects' history: seconds of updates so far, positions appended, the log's trim
    /// point, and how long a new client took to rebuild the view (`rss_bytes`: its peak
    /// resident set; `rss_before_bytes`: its resident set before it opened the view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_positions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trimmed_below: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_before_bytes: Option<u64>,
}

impl Point {
    pub fn new(
        experiment: &str,
        system: &str,
        mode: &str,
        nodes: usize,
        spread: usize,
        outstanding: usize,
    ) -> Point {
        Point {
            experiment: experiment.into(),
            system: system.into(),
            mode: mode.into(),
            nodes,
            spread,
            outstanding,
            throughput_per_s: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
            committed: 0,
            compare_failed: 0,
            errors: 0,
            items: None,
            overlap: None,
            operation: None,
            variant: None,
            runs: Vec::new(),
            rss_bytes: None,
            limit_bytes: None,
            written_bytes: None,
            log_records: None,
            log_sync_max_us: None,
            log_sync_max_is_bound: false,
            trims: None,
            trim_max_us: None,
            views: None,
            background_writes_per_s: None,
            elapsed_s: None,
            history_positions: None,
            trimmed_below: None,
            replay_us: None,
            rss_before_bytes: None,
        }
    }

    /// Fills in throughput (`ops` over `elapsed`) and latency percentiles.
    pub fn measured(mut self, ops: u64, elapsed: Duration, lat: &Latencies) -> Point {
        self.committed = ops;
        self.throughput_per_s = (ops as f64 / elapsed.as_secs_f64() * 10.0).round() / 10.0;
        self.p50_us = lat.quantile_us(0.5);
        self.p99_us = lat.quantile_us(0.99);
        self.p999_us = lat.quantile_us(0.999);
        self.max_us = lat.quantile_us(1.0);
        self
    }
}

/// Latencies in nanoseconds, from 100 ns to 60 s at 3 significant digits.
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Latencies {
        Latencies(Histogram::new_with_bounds(100, 60_000_000_000, 3).expect("histogram bounds"))
    }

    pub fn record(&mut self, d: Duration) {
        let _ = self.0.record((d.as_nanos() as u64).max(100));
    }

    pub fn add(&mut self, other: &Latencies) {
        self.0.add(&other.0).expect("same bounds");
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn quantile_us(&self, q: f64) -> f64 {
        (self.0.value_at_quantile(q) as f64 / 100.0).round() / 10.0
    }
}
