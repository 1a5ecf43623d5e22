//! Map transactions in `tutti bench objects` (after Tango §6.2, Fig. 10): each reads 3 keys
//! of a map and writes 3, on one view, 64 outstanding, against the number of keys, with
//! keys drawn uniformly or by a Zipf law (exponent 0.99); throughput (transactions ended per
//! second) and goodput (committed per second). A transaction that read a key another
//! committed one wrote since aborts (per-key versions, Tango §3.2).

use crate::log::{closed_loop, label, Op};
use crate::Point;
use rand::distributions::Distribution;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tutti_tango::{Kind, MapRef, Tango, Tx};

/// Keys in the map, one point each.
pub const KEY_COUNTS: [u64; 4] = [100, 1_000, 10_000, 100_000];
pub const DISTRIBUTIONS: [&str; 2] = ["uniform", "zipf"];
/// Transactions in flight.
pub const OUTSTANDING: usize = 64;
const ZIPF_EXPONENT: f64 = 0.99;
const VALUE_BYTES: usize = 16;

type Table = std::collections::HashMap<Vec<u8>, Vec<u8>>;

enum Keys {
    Uniform(u64),
    Zipf(rand_distr::Zipf<f64>),
}

impl Keys {
    fn new(distribution: &str, count: u64) -> Result<Keys, String> {
        match distribution {
            "uniform" => Ok(Keys::Uniform(count)),
            _ => rand_distr::Zipf::new(count, ZIPF_EXPONENT)
                .map(Keys::Zipf)
                .map_err(|e| e.to_string()),
        }
    }

    fn draw(&self, rng: &mut impl Rng) -> Vec<u8> {
        let k = match self {
            Keys::Uniform(n) => rng.gen_range(0..*n),
            Keys::Zipf(z) => z.sample(rng) as u64 - 1,
        };
        format!("k{k}").into_bytes()
    }
}

struct Transaction {
    tango: Tango,
    map: MapRef<Table>,
    keys: Arc<Keys>,
    rng: rand::rngs::StdRng,
    aborted: Arc<AtomicU64>,
}

impl Op for Transaction {
    async fn run(&mut self) -> Result<u64, String> {
        let t = &self.tango;
        let mut tx = t.begin();
        for _ in 0..3 {
            let key = self.keys.draw(&mut self.rng);
            self.map
                .get_in(t, &mut tx, &key)
                .map_err(|e| e.to_string())?;
        }
        for _ in 0..3 {
            let key = self.keys.draw(&mut self.rng);
            self.map.put_in(&mut tx, &key, &[0x5a; VALUE_BYTES]);
        }
        end(t, tx, &self.aborted).await
    }
}

/// Ends `tx`: 1 if it committed; counts it in `aborted` if not.
pub(crate) async fn end(t: &Tango, tx: Tx, aborted: &AtomicU64) -> Result<u64, String> {
    let outcome = t.end(tx).await.map_err(|e| e.to_string())?;
    if !outcome.committed {
        aborted.fetch_add(1, Ordering::Relaxed);
    }
    Ok(u64::from(outcome.committed))
}

/// Every distribution at every key count, each on a map of its own in a log of their own
/// (a client per map). A point's `committed` is the goodput's count and
/// `compare_failed` the transactions that aborted.
pub async fn run(
    cluster: &tutti_client::Cluster,
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    // A commit record of 3 reads and 3 writes with its headers takes about 300 B; 48 MiB
    // of each node holds 393 K of them, more than one point appends (about 125 K at 25 K
    // transactions/s); the log is trimmed after each point.
    let log = crate::objects::four_node_log(cluster, "transactions", 512, 48 << 20, None).await?;
    let mut points = Vec::new();
    for distribution in DISTRIBUTIONS {
        for count in KEY_COUNTS {
            let name = format!("tx-{distribution}-{count}");
            let opts = tutti_tango::TangoOptions::default();
            let tango = Tango::open(log.clone(), &[(name.as_str(), Kind::Map)], opts)
                .await
                .map_err(|e| e.to_string())?;
            let map = MapRef::<Table>::new(
                tango
                    .hosted_as(&name, Kind::Map)
                    .map_err(|e| e.to_string())?,
            );
            let keys = Arc::new(Keys::new(distribution, count)?);
            let aborted = Arc::new(AtomicU64::new(0));
            let op = format!("keys={count}");
            let mut p = closed_loop(
                label("objects-map-tx", "tutti", distribution, OUTSTANDING, &op),
                OUTSTANDING,
                Duration::from_secs_f64(seconds),
                |i| {
                    let (tango, keys, aborted) = (tango.clone(), keys.clone(), aborted.clone());
                    async move {
                        Ok(Transaction {
                            tango,
                            map,
                            keys,
                            rng: rand::rngs::StdRng::seed_from_u64(i as u64),
                            aborted,
                        })
                    }
                },
            )
            .await?;
            p.compare_failed = aborted.load(Ordering::Relaxed);
            progress(&p);
            points.push(p);
            // This map is done and no one reads its history again: checkpoint the
            // directory, forget its history, and trim the log below it, so that the next
            // points' commit records fit.
            let as_of =
                (tango.checkpoint(tutti_tango::DIRECTORY_OID).await).map_err(|e| e.to_string())?;
            (tango.forget(".", as_of).await).map_err(|e| e.to_string())?;
            log.trim(as_of).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(points)
}

/// Throughput per second of a point: every transaction that ended, committed or not.
pub fn ended_per_s(p: &Point, seconds: f64) -> f64 {
    p.throughput_per_s + p.compare_failed as f64 / seconds
}

/// The RESULTS.md part: goodput and throughput against the key count, per distribution.
pub fn section(points: &[Point], seconds: f64) -> String {
    use std::fmt::Write as _;
    let mut md = format!(
        "\n### Map transactions\n\nEach transaction reads 3 keys of a map and writes 3 ({VALUE_BYTES} B values), on one view (a client hosting only that map), {OUTSTANDING} in flight; keys drawn uniformly or by a Zipf law (exponent {ZIPF_EXPONENT}) over the key count. A transaction begins on the view as played (no play of its own), so it aborts when a key it read was written since by a transaction that committed before it. Transactions ended per second, committed per second (goodput), and p50 / p99 latency in µs.\n\n| keys | uniform: ended/s | uniform: committed/s | zipf: ended/s | zipf: committed/s |\n| --- | --- | --- | --- | --- |\n"
    );
    let find = |distribution: &str, count: u64| {
        let op = format!("keys={count}");
        points.iter().find(|p| {
            p.experiment == "objects-map-tx"
                && p.mode == distribution
                && p.operation.as_deref() == Some(op.as_str())
        })
    };
    for count in KEY_COUNTS {
        let mut row = format!("| {count} |");
        for distribution in DISTRIBUTIONS {
            match find(distribution, count) {
                Some(p) => {
                    let _ = write!(
                        row,
                        " {:.0} | {:.0} ({:.0}/{:.0}) |",
                        ended_per_s(p, seconds),
                        p.throughput_per_s,
                        p.p50_us,
                        p.p99_us
                    );
                }
                None => row += " - | - |",
            }
        }
        let _ = writeln!(md, "{row}");
    }
    md
}
