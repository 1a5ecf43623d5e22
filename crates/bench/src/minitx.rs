//! `tutti bench minitx`: Sinfonia's minitransaction workloads. Each minitransaction does
//! `ops_per_minitx` operations on 4-byte items drawn uniformly from `items_per_node` per
//! node, spread over `spread` memory nodes (Fig. 16, 18, 19: 3 or 16 compare-and-swaps;
//! Fig. 20: 8 operations of each kind); the sweep varies the outstanding minitransactions.

use super::driver::{closed_loop, Draw, Session, Swap};
use super::Point;
use std::sync::Arc;
use std::time::Duration;
use tutti_client::{Cluster, ExecuteAhead, Minitx};
use tutti_wire::{NodeId, SyncHistogram};

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

fn addr(item: u64) -> u64 {
    ITEMS_BASE + item * ITEM_STRIDE
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

/// Runs the sweep with the closed loop every system is measured with; calls `progress`
/// after each point.
pub async fn run_minitx(
    cluster: &Cluster,
    b: &MinitxBench,
    progress: impl FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let draw = Draw {
        groups: b.nodes.len(),
        items_per_group: b.items_per_node,
        spread: b.spread,
        swaps: b.ops_per_minitx,
        increment: matches!(b.kind, MinitxKind::Increment | MinitxKind::Add),
    };
    let label = Point::new(&b.experiment, "tutti", &b.mode, b.nodes.len(), b.spread, 0);
    let session = MinitxSession {
        cluster: cluster.clone(),
        bench: Arc::new(b.clone()),
    };
    let open = || {
        let s = session.clone();
        async move { Ok(s) }
    };
    let points = closed_loop(&label, draw, &b.outstanding, b.duration, open, progress).await?;
    // Against a running cluster the process exits next: leave no decision unsent.
    cluster.flush().await.map_err(|e| e.to_string())?;
    Ok(points)
}

/// The driver's session on tutti: a key is item `key % items_per_node` of node
/// `nodes[key / items_per_node]`, and each operation one minitransaction of `kind`.
#[derive(Clone)]
struct MinitxSession {
    cluster: Cluster,
    bench: Arc<MinitxBench>,
}

impl MinitxSession {
    fn item(&self, key: u64) -> (NodeId, u64) {
        let per_node = self.bench.items_per_node;
        (
            self.bench.nodes[(key / per_node) as usize],
            addr(key % per_node),
        )
    }

    fn minitx(&self, swaps: &[Swap]) -> Minitx {
        swaps
            .iter()
            .fold(Minitx::new().class("bench-cas"), |tx, s| {
                let (node, addr) = self.item(s.key);
                let old = s.old.to_le_bytes().to_vec();
                match self.bench.kind {
                    MinitxKind::Increment | MinitxKind::SameValue => tx
                        .compare(node, addr, old)
                        .write(node, addr, s.new.to_le_bytes().to_vec()),
                    MinitxKind::Add => tx.add(node, addr, 1),
                    MinitxKind::CompareOnly => tx.compare(node, addr, old),
                }
            })
    }
}

impl Session for MinitxSession {
    async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
        let tx = self.minitx(swaps);
        let out = match self.bench.access {
            Access::Combined => self.cluster.exec_and_commit(&tx).await,
            Access::Batched => {
                self.cluster
                    .exec_and_commit_ahead(&tx, ExecuteAhead::PerNode)
                    .await
            }
            Access::PerItem => {
                self.cluster
                    .exec_and_commit_ahead(&tx, ExecuteAhead::PerItem)
                    .await
            }
        };
        out.map(|o| o.committed).map_err(|e| e.to_string())
    }

    async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
        let tx = keys
            .iter()
            .fold(Minitx::new().class("bench-read"), |tx, &key| {
                let (node, addr) = self.item(key);
                tx.read(node, addr, 4)
            });
        let out = self
            .cluster
            .exec_and_commit(&tx)
            .await
            .map_err(|e| e.to_string())?;
        Ok(out
            .reads
            .iter()
            .map(|r| u32::from_le_bytes(r[..4].try_into().expect("4 bytes")))
            .collect())
    }

    /// The nodes the layout uses, in its order; `None` unless each of them answered.
    async fn log_syncs(&mut self) -> Option<Vec<SyncHistogram>> {
        let reports = self.cluster.stats().await;
        self.bench
            .nodes
            .iter()
            .map(|node| {
                reports
                    .iter()
                    .find(|(id, _)| id == node)
                    .and_then(|(_, r)| r.as_ref().ok())
                    .map(|r| r.log_sync)
            })
            .collect()
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
