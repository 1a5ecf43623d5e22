//! `tutti bench minitx`: Sinfonia's minitransaction workloads. Each minitransaction does
//! `ops_per_minitx` operations on 4-byte items drawn uniformly from `items_per_node` per
//! node, spread over `spread` memory nodes (Fig. 16, 18, 19: 3 or 16 compare-and-swaps;
//! Fig. 20: 8 operations of each kind); the sweep varies the outstanding minitransactions.

use super::{Latencies, Point};
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_client::{Cluster, ExecError, ExecuteAhead, Minitx};
use tutti_wire::NodeId;

/// Items live at this address on each node (away from the bank workload's addresses).
const ITEMS_BASE: u64 = 64 << 20;
/// Items are 4 bytes, 8 apart, so that an `add` (8 bytes) touches one item only.
const ITEM_STRIDE: u64 = 8;

/// What each of a minitransaction's operations does to its item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinitxKind {
    /// Compare with the cached value, write it plus one; a failed compare refreshes the
    /// cache (an optimistic increment: Fig. 16's compare-and-swaps, Fig. 20's "inc").
    Increment,
    /// Compare with the cached value and write the same value back: always succeeds, so
    /// only the commit protocol is measured (Fig. 20's "cas").
    SameValue,
    /// An `add` item of 1, no compare (Fig. 20's increments with `add`).
    Add,
    /// A compare with the cached value only: a read-only minitransaction (Fig. 17).
    CompareOnly,
}

/// How items reach the memory nodes before the commit protocol (Sinfonia Fig. 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Inside the commit protocol's first phase, as tutti runs minitransactions (C, D).
    Combined,
    /// First executed and locked with one request per memory node, all at once, then
    /// two-phase commit (B).
    Batched,
    /// First executed and locked with one request per item, one after the other, then
    /// two-phase commit (A).
    PerItem,
}

#[derive(Clone, Debug)]
pub struct MinitxBench {
    pub nodes: Vec<NodeId>,
    pub spread: usize,
    pub items_per_node: u64,
    pub ops_per_minitx: usize,
    pub kind: MinitxKind,
    pub access: Access,
    pub outstanding: Vec<usize>,
    pub duration: Duration,
    pub mode: String,
    /// The experiment points are labelled with (`fig16`, `fig18`, …).
    pub experiment: String,
}

struct Mirror {
    values: Vec<AtomicU32>,
    items_per_node: u64,
}

impl Mirror {
    fn slot(&self, node_index: usize, item: u64) -> &AtomicU32 {
        &self.values[node_index * self.items_per_node as usize + item as usize]
    }
}

fn addr(item: u64) -> u64 {
    ITEMS_BASE + item * ITEM_STRIDE
}

/// Reads every item once so that compares start from the values actually stored.
async fn load_mirror(cluster: &Cluster, b: &MinitxBench) -> Result<Mirror, ExecError> {
    let mirror = Mirror {
        values: (0..b.nodes.len() as u64 * b.items_per_node)
            .map(|_| AtomicU32::new(0))
            .collect(),
        items_per_node: b.items_per_node,
    };
    for (ni, &node) in b.nodes.iter().enumerate() {
        let mut item = 0;
        while item < b.items_per_node {
            let chunk = (b.items_per_node - item).min(4000);
            let tx = (item..item + chunk).fold(Minitx::new().class("bench-load"), |tx, i| {
                tx.read(node, addr(i), 4)
            });
            let out = cluster.exec_and_commit(&tx).await?;
            for (k, r) in out.reads.iter().enumerate() {
                mirror.slot(ni, item + k as u64).store(
                    u32::from_le_bytes(r[..4].try_into().expect("4 bytes")),
                    Ordering::Relaxed,
                );
            }
            item += chunk;
        }
    }
    Ok(mirror)
}

/// The `ClientOptions::connections` that gives the `requested` connections to the `used`
/// nodes of a layout when the cluster has `known` nodes: the client spreads its
/// connections over every node it knows, and 1PC against `tutti up`'s 4 nodes would
/// otherwise get one.
pub fn client_connections(requested: usize, used: usize, known: usize) -> usize {
    if known <= used {
        return requested;
    }
    requested.div_ceil(used.max(1)) * known
}

/// Runs the sweep; calls `progress` after each point.
pub async fn run_minitx(
    cluster: &Cluster,
    b: &MinitxBench,
    mut progress: impl FnMut(&Point),
) -> Result<Vec<Point>, ExecError> {
    if b.spread == 0 || b.spread > b.nodes.len() {
        return Err(ExecError::Invalid(format!(
            "spread {} over {} nodes",
            b.spread,
            b.nodes.len()
        )));
    }
    if b.items_per_node * (b.spread as u64) < b.ops_per_minitx as u64 {
        return Err(ExecError::Invalid(format!(
            "{} distinct items per minitransaction from {} per node over {} nodes",
            b.ops_per_minitx, b.items_per_node, b.spread
        )));
    }
    let mirror = Arc::new(load_mirror(cluster, b).await?);
    let mut points = Vec::new();
    for &outstanding in &b.outstanding {
        let point = run_point(cluster, b, mirror.clone(), outstanding).await;
        progress(&point);
        points.push(point);
    }
    // Against a running cluster the process exits next: leave no decision unsent.
    cluster.flush().await?;
    Ok(points)
}

async fn run_point(
    cluster: &Cluster,
    b: &MinitxBench,
    mirror: Arc<Mirror>,
    outstanding: usize,
) -> Point {
    let start = Instant::now();
    let until = start + b.duration;
    let (committed, failed, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for _ in 0..outstanding {
        let (cluster, b, mirror) = (cluster.clone(), b.clone(), mirror.clone());
        let (committed, failed, errors) = (committed.clone(), failed.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::new();
            while Instant::now() < until {
                let (tx, picks) = cas_minitx(&b, &mirror);
                let t0 = Instant::now();
                let result = match b.access {
                    Access::Combined => cluster.exec_and_commit(&tx).await,
                    Access::Batched => {
                        cluster
                            .exec_and_commit_ahead(&tx, ExecuteAhead::PerNode)
                            .await
                    }
                    Access::PerItem => {
                        cluster
                            .exec_and_commit_ahead(&tx, ExecuteAhead::PerItem)
                            .await
                    }
                };
                match result {
                    Ok(out) if out.committed => {
                        committed.fetch_add(1, Ordering::Relaxed);
                        for (ni, item, new) in picks {
                            mirror.slot(ni, item).store(new, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        refresh(&cluster, &b, &mirror, &picks).await;
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                lat.record(t0.elapsed());
            }
            lat
        }));
    }
    let mut lat = Latencies::new();
    for t in tasks {
        if let Ok(l) = t.await {
            lat.add(&l);
        }
    }
    let mut point = Point::new(
        &b.experiment,
        "tutti",
        &b.mode,
        b.nodes.len(),
        b.spread,
        outstanding,
    )
    .measured(committed.load(Ordering::Relaxed), start.elapsed(), &lat);
    point.compare_failed = failed.load(Ordering::Relaxed);
    point.errors = errors.load(Ordering::Relaxed);
    point
}

/// `ops_per_minitx` operations on distinct items over `spread` distinct nodes:
/// (minitx, [(node index, item, new value)]).
fn cas_minitx(b: &MinitxBench, mirror: &Mirror) -> (Minitx, Vec<(usize, u64, u32)>) {
    let mut rng = rand::thread_rng();
    let node_indices: Vec<usize> = (0..b.nodes.len())
        .collect::<Vec<_>>()
        .choose_multiple(&mut rng, b.spread)
        .copied()
        .collect();
    let mut tx = Minitx::new().class("bench-cas");
    let mut picks: Vec<(usize, u64, u32)> = Vec::with_capacity(b.ops_per_minitx);
    for k in 0..b.ops_per_minitx {
        let ni = node_indices[k % node_indices.len()];
        let item = loop {
            let i = rng.gen_range(0..b.items_per_node);
            if !picks.iter().any(|p| p.0 == ni && p.1 == i) {
                break i;
            }
        };
        let old = mirror.slot(ni, item).load(Ordering::Relaxed);
        let node = b.nodes[ni];
        let new = match b.kind {
            MinitxKind::Increment => old.wrapping_add(1),
            MinitxKind::SameValue => old,
            MinitxKind::CompareOnly => {
                tx = tx.compare(node, addr(item), old.to_le_bytes().to_vec());
                picks.push((ni, item, old));
                continue;
            }
            MinitxKind::Add => {
                tx = tx.add(node, addr(item), 1);
                picks.push((ni, item, old.wrapping_add(1)));
                continue;
            }
        };
        tx = tx
            .compare(node, addr(item), old.to_le_bytes().to_vec())
            .write(node, addr(item), new.to_le_bytes().to_vec());
        picks.push((ni, item, new));
    }
    (tx, picks)
}

async fn refresh(cluster: &Cluster, b: &MinitxBench, mirror: &Mirror, picks: &[(usize, u64, u32)]) {
    let tx = picks
        .iter()
        .fold(Minitx::new().class("bench-refresh"), |tx, (ni, item, _)| {
            tx.read(b.nodes[*ni], addr(*item), 4)
        });
    if let Ok(out) = cluster.exec_and_commit(&tx).await {
        for ((ni, item, _), r) in picks.iter().zip(&out.reads) {
            mirror.slot(*ni, *item).store(
                u32::from_le_bytes(r[..4].try_into().expect("4 bytes")),
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::client_connections;

    #[test]
    fn the_nodes_a_layout_uses_get_the_requested_connections() {
        // 1PC against tutti up's 4 nodes: 2 to node 1 means 2 per node of 4.
        assert_eq!(client_connections(2, 1, 4), 8);
        // The 2PC layout on 4 nodes, and 1PC on its own node: as requested.
        assert_eq!(client_connections(2, 4, 4), 2);
        assert_eq!(client_connections(2, 1, 1), 2);
        // 3 over 2 used nodes of 6: 2 per node.
        assert_eq!(client_connections(3, 2, 6), 12);
    }
}
