//! The closed loop that measures every system alike, tutti and each peer: a task per
//! outstanding operation draws compare-and-swaps from a shared mirror of the items, runs them
//! through its `Session`, and accounts the answer the same way whatever system gave it.

use super::{Latencies, Point};
use rand::seq::index::sample;
use rand::Rng;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_wire::{SlowestSync, SyncHistogram};

/// One item of an operation: item `key` should hold `old` and is to hold `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swap {
    pub key: u64,
    pub old: u32,
    pub new: u32,
}

/// A client's connection (or handle) to the system under test; one per outstanding
/// operation.
pub trait Session: Send + 'static {
    /// Runs the swaps as one atomic operation: `Ok(true)` if every item held its `old` and
    /// now holds its `new`, `Ok(false)` if some item did not hold its `old` (nothing changed).
    fn swap(&mut self, swaps: &[Swap]) -> impl Future<Output = Result<bool, String>> + Send;
    /// The current values of `keys`, in order.
    fn read(&mut self, keys: &[u64]) -> impl Future<Output = Result<Vec<u32>, String>> + Send;
    /// How long each server's synced log writes took so far (tutti: every memory node's
    /// redo log), read before and after a point to tell a slow disk from a slow system;
    /// `None` where the system does not say.
    fn log_syncs(&mut self) -> impl Future<Output = Option<Vec<SyncHistogram>>> + Send {
        async { None }
    }
}

/// What an operation's swaps are drawn from: `groups` groups of `items_per_group` items each
/// (tutti: a group is a memory node; a peer is one group), `swaps` distinct items over
/// `spread` distinct groups taken in turn.
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    pub groups: usize,
    pub items_per_group: u64,
    pub spread: usize,
    pub swaps: usize,
    /// Each swap writes its item's value plus one (an optimistic increment); otherwise it
    /// writes the same value back.
    pub increment: bool,
}

/// Reads at most this many items per request while loading the mirror (etcd's default
/// limit of operations in one Txn).
const LOAD_CHUNK: u64 = 128;

/// Pause after an error, so that a system that refuses work is not spun against.
const ERROR_PAUSE: Duration = Duration::from_millis(1);

impl Draw {
    fn items(&self) -> u64 {
        self.groups as u64 * self.items_per_group
    }

    fn check(&self) -> Result<(), String> {
        if self.spread == 0 || self.spread > self.groups {
            return Err(format!("spread {} over {} nodes", self.spread, self.groups));
        }
        if self.items_per_group * (self.spread as u64) < self.swaps as u64 {
            return Err(format!(
                "{} distinct items per operation from {} per node over {} nodes",
                self.swaps, self.items_per_group, self.spread
            ));
        }
        Ok(())
    }

    /// `swaps` distinct items, from `spread` distinct groups in turn, with their mirrored
    /// values.
    fn swaps(&self, mirror: &[AtomicU32], rng: &mut impl Rng) -> Vec<Swap> {
        let groups = sample(rng, self.groups, self.spread).into_vec();
        let mut swaps: Vec<Swap> = Vec::with_capacity(self.swaps);
        for k in 0..self.swaps {
            let group = groups[k % groups.len()] as u64;
            let key = loop {
                let key = group * self.items_per_group + rng.gen_range(0..self.items_per_group);
                if !swaps.iter().any(|s| s.key == key) {
                    break key;
                }
            };
            let old = mirror[key as usize].load(Ordering::Relaxed);
            let new = if self.increment {
                old.wrapping_add(1)
            } else {
                old
            };
            swaps.push(Swap { key, old, new });
        }
        swaps
    }
}

/// Measures `draw` at each count of `outstanding` operations for `duration`, one session per
/// operation from `open`; each point is `label` with the measurements filled in, and goes to
/// `progress` as it is measured.
///
/// The accounting, the same for every system: an operation's latency runs from sending it to
/// its answer, committed or refused by a compare (both are in the percentiles); throughput
/// counts committed operations. After a refused compare the session re-reads the items it
/// compared, untimed, as any client with a cache would. An error is counted in `errors`,
/// left out of the percentiles, and followed by a 1 ms pause.
pub async fn closed_loop<S: Session, F: Future<Output = Result<S, String>>>(
    label: &Point,
    draw: Draw,
    outstanding: &[usize],
    duration: Duration,
    mut open: impl FnMut() -> F,
    mut progress: impl FnMut(&Point),
) -> Result<Vec<Point>, String> {
    draw.check()?;
    let mirror = Arc::new(load_mirror(&mut open().await?, draw.items()).await?);
    let mut points = Vec::new();
    for &n in outstanding {
        let mut sessions = Vec::with_capacity(n);
        for _ in 0..n {
            sessions.push(open().await?);
        }
        let syncs_before = match sessions.first_mut() {
            Some(session) => session.log_syncs().await,
            None => None,
        };
        let start = Instant::now();
        let until = start + duration;
        let (failed, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::with_capacity(n);
        for mut session in sessions {
            let (mirror, failed, errors) = (mirror.clone(), failed.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Latencies::new();
                let mut committed = 0u64;
                while Instant::now() < until {
                    let swaps = draw.swaps(&mirror, &mut rand::thread_rng());
                    let t0 = Instant::now();
                    match session.swap(&swaps).await {
                        Ok(true) => {
                            lat.record(t0.elapsed());
                            committed += 1;
                            for s in &swaps {
                                mirror[s.key as usize].store(s.new, Ordering::Relaxed);
                            }
                        }
                        Ok(false) => {
                            lat.record(t0.elapsed());
                            failed.fetch_add(1, Ordering::Relaxed);
                            let keys: Vec<u64> = swaps.iter().map(|s| s.key).collect();
                            if let Ok(values) = session.read(&keys).await {
                                for (key, v) in keys.iter().zip(values) {
                                    mirror[*key as usize].store(v, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(ERROR_PAUSE).await;
                        }
                    }
                }
                (lat, committed, session)
            }));
        }
        let mut lat = Latencies::new();
        let mut committed = 0;
        let mut last = None;
        for t in tasks {
            let (l, c, session) = t.await.map_err(|e| e.to_string())?;
            lat.add(&l);
            committed += c;
            last = Some(session);
        }
        let elapsed = start.elapsed();
        let syncs_after = match last {
            Some(mut session) => session.log_syncs().await,
            None => None,
        };
        let mut point = Point {
            outstanding: n,
            ..label.clone()
        }
        .measured(committed, elapsed, &lat);
        point.compare_failed = failed.load(Ordering::Relaxed);
        point.errors = errors.load(Ordering::Relaxed);
        if let Some(slowest) = slowest_sync(syncs_before, syncs_after) {
            point.log_sync_max_us = Some(slowest.us);
            point.log_sync_max_is_bound = !slowest.exact;
        }
        progress(&point);
        points.push(point);
    }
    Ok(points)
}

/// The slowest sync of any server between two readings of their histograms (on a tie,
/// the exact one).
fn slowest_sync(
    before: Option<Vec<SyncHistogram>>,
    after: Option<Vec<SyncHistogram>>,
) -> Option<SlowestSync> {
    let (before, after) = (before?, after?);
    after
        .iter()
        .zip(&before)
        .filter_map(|(a, b)| a.slowest_since(b))
        .max_by_key(|s| (s.us, s.exact))
}

/// Reads every item once, so that the first compares expect the values actually stored.
async fn load_mirror<S: Session>(session: &mut S, items: u64) -> Result<Vec<AtomicU32>, String> {
    let mut mirror = Vec::with_capacity(items as usize);
    let mut key = 0;
    while key < items {
        let keys: Vec<u64> = (key..items.min(key + LOAD_CHUNK)).collect();
        let values = session.read(&keys).await?;
        if values.len() != keys.len() {
            return Err(format!(
                "read {} items, got {} values",
                keys.len(),
                values.len()
            ));
        }
        mirror.extend(values.into_iter().map(AtomicU32::new));
        key += keys.len() as u64;
    }
    Ok(mirror)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;

    #[test]
    fn swaps_are_distinct_items_spread_over_distinct_groups() {
        let draw = Draw {
            groups: 4,
            items_per_group: 3,
            spread: 2,
            swaps: 5,
            increment: true,
        };
        let mirror: Vec<AtomicU32> = (0..12).map(AtomicU32::new).collect();
        let mut rng = rand::thread_rng();
        for _ in 0..1000 {
            let swaps = draw.swaps(&mirror, &mut rng);
            assert_eq!(swaps.len(), 5);
            let keys: HashSet<u64> = swaps.iter().map(|s| s.key).collect();
            assert_eq!(keys.len(), 5, "{swaps:?}");
            let groups: HashSet<u64> = keys.iter().map(|k| k / 3).collect();
            assert_eq!(groups.len(), 2, "{swaps:?}");
            for s in swaps {
                assert_eq!((s.old, s.new), (s.key as u32, s.key as u32 + 1));
            }
        }
        assert!(Draw { spread: 5, ..draw }.check().is_err());
        assert!(Draw { swaps: 7, ..draw }.check().is_err());
    }

    #[test]
    fn the_slowest_sync_over_servers_says_whether_it_is_a_bound() {
        let mut node_a = SyncHistogram::default();
        let mut node_b = SyncHistogram::default();
        node_a.record(20_000);
        let before = vec![node_a, node_b];
        node_a.record(5_000);
        node_b.record(3_000);
        assert_eq!(
            slowest_sync(Some(before.clone()), Some(vec![node_a, node_b])),
            Some(SlowestSync {
                us: 8_192,
                exact: false
            }),
            "node a's 5 ms is known only by its bucket, above node b's exact 3 ms"
        );
        node_b.record(8_192);
        assert_eq!(
            slowest_sync(Some(before.clone()), Some(vec![node_a, node_b])),
            Some(SlowestSync {
                us: 8_192,
                exact: true
            })
        );
        assert_eq!(slowest_sync(None, Some(vec![node_a, node_b])), None);
    }

    /// A system that keeps its items in a map and refuses every other operation with an
    /// error, to check the loop's accounting.
    #[derive(Clone)]
    struct Map {
        items: Arc<Mutex<HashMap<u64, u32>>>,
        calls: Arc<AtomicU64>,
    }

    impl Session for Map {
        async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
            if self.calls.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
                return Err("refused".into());
            }
            let mut items = self.items.lock().unwrap();
            if swaps.iter().any(|s| items[&s.key] != s.old) {
                return Ok(false);
            }
            for s in swaps {
                items.insert(s.key, s.new);
            }
            Ok(true)
        }

        async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
            let items = self.items.lock().unwrap();
            Ok(keys.iter().map(|k| items[k]).collect())
        }
    }

    #[tokio::test]
    async fn committed_operations_are_counted_and_errors_left_out_of_the_latencies() {
        let map = Map {
            items: Arc::new(Mutex::new((0..300).map(|k| (k, 5)).collect())),
            calls: Arc::new(AtomicU64::new(0)),
        };
        let draw = Draw {
            groups: 1,
            items_per_group: 300,
            spread: 1,
            swaps: 3,
            increment: true,
        };
        let label = Point::new("fig16", "map", "test", 1, 1, 0);
        let points = closed_loop(
            &label,
            draw,
            &[1],
            Duration::from_millis(200),
            || {
                let m = map.clone();
                async move { Ok(m) }
            },
            |_| {},
        )
        .await
        .unwrap();
        let p = &points[0];
        assert_eq!((p.system.as_str(), p.outstanding), ("map", 1));
        assert!(p.committed > 0 && p.errors > 0);
        assert_eq!(p.compare_failed, 0, "the mirror was loaded from the map");
        let sum: u64 = map
            .items
            .lock()
            .unwrap()
            .values()
            .map(|&v| u64::from(v - 5))
            .sum();
        assert_eq!(sum, 3 * p.committed);
        assert!(p.throughput_per_s > 0.0 && p.max_us >= p.p50_us);
    }
}
