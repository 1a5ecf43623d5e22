//! Layered partitions in `tutti bench objects` (Tango §6.2, Fig. 10 middle): 4 clients, each
//! hosting the view of one map of its own, run transactions of 3 reads and 3 writes on it; a
//! growing share of them are cross-partition: they read the local map and write the local
//! one and a remote one (moving a key from one map to another), whose host cannot decide
//! them from its own views and learns the outcome from the decision record.

use crate::log::{closed_loop, label, Op};
use crate::Point;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tutti_tango::{Kind, MapRef, Tango, TangoOptions};

/// The shares of cross-partition transactions, one point each.
pub const CROSS_SHARES: [f64; 5] = [0.0, 0.1, 0.25, 0.5, 1.0];
pub const CLIENTS: usize = 4;
/// Transactions in flight on each client.
pub const PER_CLIENT: usize = 16;
pub const KEYS: u64 = 100_000;
const VALUE_BYTES: usize = 16;
const LOG: &str = "partitions";

type Table = std::collections::HashMap<Vec<u8>, Vec<u8>>;

struct Transaction {
    tango: Tango,
    local: MapRef<Table>,
    /// The other clients' maps.
    remote: Arc<Vec<MapRef<Table>>>,
    cross_share: f64,
    rng: rand::rngs::StdRng,
    aborted: Arc<AtomicU64>,
}

impl Transaction {
    fn key(&mut self) -> Vec<u8> {
        format!("k{}", self.rng.gen_range(0..KEYS)).into_bytes()
    }
}

impl Op for Transaction {
    async fn run(&mut self) -> Result<u64, String> {
        let t = self.tango.clone();
        let mut tx = t.begin();
        for _ in 0..3 {
            let key = self.key();
            (self.local.get_in(&t, &mut tx, &key)).map_err(|e| e.to_string())?;
        }
        let cross = self.rng.gen_bool(self.cross_share);
        for i in 0..3 {
            let key = self.key();
            let map = match cross && i == 2 {
                true => self.remote[self.rng.gen_range(0..self.remote.len())],
                false => self.local,
            };
            map.put_in(&mut tx, &key, &[0x5a; VALUE_BYTES]);
        }
        crate::transactions::end(&t, tx, &self.aborted).await
    }
}

/// One point per share of cross-partition transactions: transactions ended per second over
/// the 4 clients (`committed`: those that committed, the goodput; `compare_failed`: those
/// that aborted).
pub async fn run(
    cluster: &tutti_client::Cluster,
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    // A commit record of 3 reads and 3 writes in up to 2 streams, with its headers, takes
    // about 300 B; 40 MiB of each node holds the 300 K or so the points append.
    let log = crate::objects::four_node_log(cluster, LOG, 512, 40 << 20, None).await?;
    let names: Vec<String> = (0..CLIENTS).map(|c| format!("partition-{c}")).collect();
    let opts = TangoOptions::default();
    let directory =
        (Tango::open(log.clone(), &[], opts.clone()).await).map_err(|e| e.to_string())?;
    let mut maps = Vec::with_capacity(CLIENTS);
    for name in &names {
        // Decision records: a remote write's host does not host what the transaction read.
        let meta = (directory.create(name, Kind::Map, true).await).map_err(|e| e.to_string())?;
        maps.push(MapRef::<Table>::new(meta.oid));
    }
    let mut clients = Vec::with_capacity(CLIENTS);
    for name in &names {
        let hosted = [(name.as_str(), Kind::Map)];
        let t = Tango::open(log.clone(), &hosted, opts.clone()).await;
        clients.push(t.map_err(|e| e.to_string())?);
    }
    let mut points = Vec::new();
    for share in CROSS_SHARES {
        let op = format!("cross={:.0}%", share * 100.0);
        let aborted = Arc::new(AtomicU64::new(0));
        let mut p = closed_loop(
            label(
                "objects-partitions",
                "tutti",
                "log",
                CLIENTS * PER_CLIENT,
                &op,
            ),
            CLIENTS * PER_CLIENT,
            Duration::from_secs_f64(seconds),
            |i| {
                let client = i % CLIENTS;
                let remote = (0..CLIENTS).filter(|&c| c != client).map(|c| maps[c]);
                let tx = Transaction {
                    tango: clients[client].clone(),
                    local: maps[client],
                    remote: Arc::new(remote.collect()),
                    cross_share: share,
                    rng: rand::rngs::StdRng::seed_from_u64(i as u64),
                    aborted: aborted.clone(),
                };
                async move { Ok(tx) }
            },
        )
        .await?;
        p.views = Some(CLIENTS as u64);
        p.compare_failed = aborted.load(Ordering::Relaxed);
        progress(&p);
        points.push(p);
    }
    Ok(points)
}

/// The RESULTS.md part: transactions against the share of cross-partition ones.
pub fn section(points: &[Point], seconds: f64) -> String {
    use std::fmt::Write as _;
    let mut md = format!(
        "\n### Layered partitions\n\n{CLIENTS} clients in one process, each with the view of its own map only ({KEYS} keys, uniform), {PER_CLIENT} transactions in flight each: 3 reads and 3 writes of its map, or, for the share shown, cross-partition: 3 reads and 2 writes of its map and 1 write of another client's (a remote write, whose host learns the outcome from the decision record), {seconds} s a point. Transactions ended and committed per second over the {CLIENTS} clients, p50 / p99 µs.\n\n| cross-partition | ended/s | committed/s | p50 / p99 µs |\n| --- | --- | --- | --- |\n"
    );
    for p in points
        .iter()
        .filter(|p| p.experiment == "objects-partitions")
    {
        let ended = crate::transactions::ended_per_s(p, seconds);
        let _ = writeln!(
            md,
            "| {} | {ended:.0} | {:.0} | {:.0} / {:.0} |",
            p.operation
                .as_deref()
                .unwrap_or("")
                .trim_start_matches("cross="),
            p.throughput_per_s,
            p.p50_us,
            p.p99_us
        );
    }
    md
}
