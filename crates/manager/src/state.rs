//! The manager's state machine: directory, epoch, GC relay and tids under recovery. It is
//! deterministic: the time comes in as an argument, and a change to the durable part (the
//! directory and the epoch) comes back as a `Persisted` snapshot that the driver writes
//! before it sends the reply that depends on it (`store` on disk; the simulator in memory).

use crate::regions::Regions;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tutti_wire::{
    Applied, Directory, ErrorCode, NodeId, NodeInfo, Placement, Request, Response, Tid,
};

/// Tids relayed to one node per heartbeat acknowledgement.
const GC_BATCH_MAX: usize = 65_536;
/// Heartbeats per registered node between two rotations of the reports awaiting their peers
/// (250 rounds of 200 ms: 50 s, whatever the cluster's size). A report kept through two
/// rotations is dropped; the node that sent it settles the tid by asking the tid's peers
/// itself, as after a manager restart. Without this, a tid whose peer took the lsn path (and
/// so never reports it) would stay here for good.
const REPORTS_ROTATE_ROUNDS: u64 = 250;

/// What the manager keeps across restarts: the epoch, the directory and the regions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Persisted {
    epoch: u64,
    nodes: BTreeMap<NodeId, PersistedNode>,
    /// Absent from the files of managers that predate regions.
    #[serde(default)]
    regions: Regions,
    /// Where the cluster's logs are sequenced (`SetSequencer`); absent likewise.
    #[serde(default)]
    sequencer: Option<String>,
}

impl Persisted {
    /// A new cluster's: no node, the first epoch.
    pub fn fresh() -> Persisted {
        Persisted {
            epoch: 1,
            nodes: BTreeMap::new(),
            regions: Regions::default(),
            sequencer: None,
        }
    }
}

impl Persisted {
    /// Where memory node `node` listens.
    pub fn addr(&self, node: NodeId) -> Option<String> {
        self.nodes.get(&node).map(|n| n.addr.clone())
    }

    /// A replicated node's placement as this state has it.
    pub fn placement(&self, node: NodeId) -> Option<Placement> {
        self.nodes.get(&node).and_then(PersistedNode::placement)
    }

    /// The epoch this state is at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How many memory nodes the directory holds.
    pub fn nodes_len(&self) -> usize {
        self.nodes.len()
    }

    /// The state of a cluster restored from a backup (`tutti backup restore`): its nodes,
    /// `(id, addr, size_bytes)`, durable, and its regions as they were; no sequencer yet (a
    /// new one registers).
    pub fn restored(
        nodes: &[(NodeId, String, u64)],
        regions: &[tutti_wire::RegionInfo],
    ) -> Persisted {
        Persisted {
            epoch: 1,
            nodes: (nodes.iter())
                .map(|(id, addr, size_bytes)| {
                    let node = PersistedNode {
                        addr: addr.clone(),
                        size_bytes: *size_bytes,
                        durable: true,
                        config_epoch: 0,
                        mirror: None,
                        unregistered: false,
                        left_out: None,
                    };
                    (*id, node)
                })
                .collect(),
            regions: Regions::from_infos(regions),
            sequencer: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct PersistedNode {
    /// Where it serves: its primary's address, for a replicated node.
    addr: String,
    size_bytes: u64,
    durable: bool,
    /// A replicated node's configuration epoch (docs/replication.md); 0 for a node that
    /// is not replicated. Absent from files before replication.
    #[serde(default, skip_serializing_if = "is_zero")]
    config_epoch: u64,
    /// A replicated node's mirror, while it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mirror: Option<String>,
    /// The primary was named by a fail-over, or its mirror was dropped, and it has not
    /// registered under this placement yet: it has committed nothing the copy it replaced
    /// (or the dropped mirror) lacks, so that copy may be named again if it never does
    /// (`ManagerState::fail_over`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unregistered: bool,
    /// The copy the change to this placement left out (the primary replaced, the mirror
    /// dropped, the promoted copy that never registered), while the primary has not
    /// registered: the one copy that may be named in its place (`may_name_again`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    left_out: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A replaced primary, or a dropped mirror, that kept its copy, as it last told.
struct Former {
    addr: String,
    /// The configuration it served under: its copy holds the node's data as of then.
    config_epoch: u64,
    seen_ms: u64,
}

impl PersistedNode {
    /// Whether the copy at `addr`, a primary replaced or a mirror dropped under
    /// `config_epoch`, may be named primary again: this placement is the one that left it
    /// out (one epoch up, and `left_out` names it), and its primary has not registered
    /// under it, so it has committed nothing that copy lacks (every record the promoted
    /// mirror held, its primary had shipped to it; every record a primary counted durable,
    /// its mirror held). A copy outside the placement may ask without knowing its epoch (a
    /// mirror named or dropped while it was down or cut off): the managers know whom the
    /// change left out.
    fn may_name_again(&self, addr: &str, config_epoch: u64) -> bool {
        self.config_epoch == config_epoch + 1
            && self.addr != addr
            && self.mirror.is_none()
            && ((self.unregistered && self.left_out.as_deref() == Some(addr))
                || crate::planted(crate::Bug::RenameRegisteredFormer))
    }

    fn placement(&self) -> Option<Placement> {
        (self.config_epoch > 0).then(|| Placement {
            config_epoch: self.config_epoch,
            primary: self.addr.clone(),
            mirror: self.mirror.clone(),
        })
    }
}

/// A tid reported applied by some of its participants. The participants are shared by all
/// the tids of one report group. Only decisions that carry no lsns come this way (the
/// recovery coordinator's and a restart's stage 2), so a list of reporters is enough.
struct Awaited {
    participants: Arc<[NodeId]>,
    reported: Vec<NodeId>,
}

impl Awaited {
    /// Records that `node` reported; true once every participant has.
    fn report(&mut self, node: NodeId) -> bool {
        if self.participants.contains(&node) && !self.reported.contains(&node) {
            self.reported.push(node);
        }
        self.participants.iter().all(|q| self.reported.contains(q))
    }
}

/// Tids to recover together, grouped by participant for one REQUEST-ABORT per node.
pub struct RecoveryBatch {
    pub tids: Vec<(Tid, Vec<NodeId>)>,
    pub by_node: BTreeMap<NodeId, Vec<(Tid, Vec<NodeId>)>>,
}

pub struct ManagerState {
    persisted: Persisted,
    incarnation: u64,
    /// When each node was last heard from, on the driver's clock (ms).
    last_seen_ms: HashMap<NodeId, u64>,
    /// When each replicated node's mirror was last heard from, and how long its primary
    /// last said the mirror had kept records unacknowledged.
    mirror_seen_ms: HashMap<NodeId, u64>,
    mirror_behind_ms: HashMap<NodeId, u64>,
    /// Replaced `ram-repl` primaries that kept their copy, as they last told
    /// (`Request::FormerPrimary`), while the placement that replaced them may need them.
    formers: HashMap<NodeId, Former>,
    rebooted: HashSet<NodeId>,
    /// Multi-participant tids some participants reported applied, and which ones did.
    applied: FxHashMap<Tid, Awaited>,
    /// `applied` as it was at the last rotation.
    applied_older: FxHashMap<Tid, Awaited>,
    /// Heartbeats since the last rotation of `applied`.
    heartbeats: u64,
    /// The latest `applied_below` of each node, relayed to all of them.
    applied_below: BTreeMap<NodeId, u64>,
    gc_out: HashMap<NodeId, Vec<Tid>>,
    recovering: FxHashSet<Tid>,
}

impl ManagerState {
    /// The state machine over `persisted` (as last written). `incarnation` differs at each
    /// start, so that nodes can tell a restarted manager (its GC reports are gone).
    pub fn new(persisted: Persisted, incarnation: u64) -> ManagerState {
        ManagerState {
            persisted,
            incarnation,
            last_seen_ms: HashMap::new(),
            mirror_seen_ms: HashMap::new(),
            mirror_behind_ms: HashMap::new(),
            formers: HashMap::new(),
            rebooted: HashSet::new(),
            applied: FxHashMap::default(),
            applied_older: FxHashMap::default(),
            heartbeats: 0,
            applied_below: BTreeMap::new(),
            gc_out: HashMap::new(),
            recovering: FxHashSet::default(),
        }
    }

    /// Counts every registered node as heard from at `now_ms`: a new leader's view, since
    /// the leader before heard from them (a node that is down is found so after the
    /// failure timeout, as it would have been).
    pub fn presume_alive(&mut self, now_ms: u64) {
        for (&node, n) in &self.persisted.nodes {
            self.last_seen_ms.insert(node, now_ms);
            if n.mirror.is_some() {
                self.mirror_seen_ms.insert(node, now_ms);
            }
        }
    }

    /// The durable part as it is now.
    pub fn persisted(&self) -> &Persisted {
        &self.persisted
    }

    pub fn epoch(&self) -> u64 {
        self.persisted.epoch
    }

    /// Starts the next epoch. Write the snapshot before any message naming it leaves.
    pub fn advance_epoch(&mut self) -> Persisted {
        self.persisted.epoch += 1;
        self.persisted.clone()
    }

    /// Registers a memory node at `now_ms`. With a snapshot, the directory changed: write
    /// it before sending the reply (and send an error instead if that fails). `mirror`
    /// makes a new node replicated; a replicated node's placement is the manager's to
    /// change after that, and a primary it replaced is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &mut self,
        now_ms: u64,
        node: NodeId,
        addr: String,
        size_bytes: u64,
        durable: bool,
        rebooted: bool,
        mirror: Option<String>,
    ) -> (Response, Option<Persisted>) {
        let refuse = |code, message: String| (Response::Error { code, message }, None);
        if node == 0 {
            return refuse(ErrorCode::BadRequest, "node ids start at 1".into());
        }
        let known = self.persisted.nodes.get(&node);
        let (config_epoch, mirror) = match known {
            Some(k) if k.config_epoch > 0 && k.addr != addr => {
                let message = format!(
                    "node {node} is served by {} since configuration epoch {}: this primary \
                     was replaced",
                    k.addr, k.config_epoch
                );
                return refuse(ErrorCode::StaleConfig, message);
            }
            Some(k) if k.config_epoch > 0 => (k.config_epoch, k.mirror.clone()),
            Some(_) if mirror.is_some() => {
                let message = format!(
                    "node {node} was registered without a mirror; a mirror cannot join a \
                     node that already holds data"
                );
                return refuse(ErrorCode::BadRequest, message);
            }
            Some(_) => (0, None),
            None => (u64::from(mirror.is_some()), mirror),
        };
        if mirror.is_some() && !self.mirror_seen_ms.contains_key(&node) {
            self.mirror_seen_ms.insert(node, now_ms);
        }
        let entry = PersistedNode {
            addr,
            size_bytes,
            durable,
            config_epoch,
            mirror,
            unregistered: false,
            left_out: None,
        };
        let changed = self.persisted.nodes.get(&node) != Some(&entry);
        if changed {
            self.persisted.nodes.insert(node, entry);
        }
        self.last_seen_ms.insert(node, now_ms);
        if rebooted {
            self.rebooted.insert(node);
            let (n, r) = (self.persisted.nodes.len(), self.rebooted.len());
            if r * 2 > n {
                tracing::info!(
                    rebooted = r,
                    nodes = n,
                    "whole-system restart: nodes exchange all-log-tids in stage 2"
                );
            }
        }
        tracing::info!(node, "memory node registered");
        let registered = Response::Registered {
            epoch: self.persisted.epoch,
            incarnation: self.incarnation,
            placement: self.placement(node),
        };
        (registered, changed.then(|| self.persisted.clone()))
    }

    /// The directory at `now_ms`: a node not heard from for `failure_timeout_ms` is down.
    pub fn directory(&self, now_ms: u64, failure_timeout_ms: u64) -> Directory {
        let nodes = self
            .persisted
            .nodes
            .iter()
            .map(|(&id, n)| NodeInfo {
                id,
                addr: n.addr.clone(),
                size_bytes: n.size_bytes,
                durable: n.durable,
                alive: (self.last_seen_ms.get(&id))
                    .is_some_and(|&t| now_ms.saturating_sub(t) < failure_timeout_ms),
            })
            .collect();
        Directory {
            nodes,
            epoch: self.persisted.epoch,
        }
    }

    /// A replicated node's placement as this state has it.
    pub fn placement(&self, node: NodeId) -> Option<Placement> {
        self.persisted.placement(node)
    }

    /// `Request::MirrorHeartbeat`: the mirror at `addr` is alive. Replies the placement,
    /// which names the mirror primary once it took over.
    pub fn mirror_heartbeat(&mut self, now_ms: u64, node: NodeId, addr: &str) -> Response {
        let placement = self.placement(node);
        if placement.as_ref().and_then(|p| p.mirror.as_deref()) == Some(addr) {
            self.mirror_seen_ms.insert(node, now_ms);
        }
        if placement.as_ref().is_some_and(|p| p.primary == addr) {
            // Promoted, waiting out the old primary's lease before it registers: alive.
            self.last_seen_ms.insert(node, now_ms);
        }
        Response::Placement(placement)
    }

    /// `Request::FormerPrimary`: the process at `addr`, replaced as `node`'s primary (or
    /// dropped as its mirror), holds the node's data as of `config_epoch`. Noted while the
    /// placement that replaced it may still need it; replies whether it is to keep its copy.
    pub fn former_primary(
        &mut self,
        now_ms: u64,
        node: NodeId,
        addr: String,
        config_epoch: u64,
    ) -> Response {
        let Some(n) = self.persisted.nodes.get(&node) else {
            return Response::FormerCopy {
                placement: None,
                keep: false,
            };
        };
        let keep = n.may_name_again(&addr, config_epoch);
        let placement = n.placement();
        if keep {
            let former = Former {
                addr,
                config_epoch,
                seen_ms: now_ms,
            };
            self.formers.insert(node, former);
        }
        Response::FormerCopy { placement, keep }
    }

    /// `Request::AddMirror`: the primary of `node` under `config_epoch`, at `primary`, has
    /// a mirror at `mirror` caught up. Names it the node's mirror under the next epoch (to
    /// be committed: the snapshot returned) if the placement is still the one it joined;
    /// replies the placement as it then stands. A repeated request gets the same placement.
    pub fn add_mirror(
        &mut self,
        now_ms: u64,
        node: NodeId,
        config_epoch: u64,
        primary: &str,
        mirror: String,
    ) -> (Response, Option<Persisted>) {
        let stale = |message: String| Response::Error {
            code: ErrorCode::StaleConfig,
            message,
        };
        let Some(n) = self.persisted.nodes.get_mut(&node) else {
            return (stale(format!("node {node} is not registered")), None);
        };
        if n.config_epoch == config_epoch + 1 && n.mirror.as_ref() == Some(&mirror) {
            return (Response::Placement(n.placement()), None);
        }
        if n.config_epoch != config_epoch || n.addr != primary || n.mirror.is_some() {
            let message = format!(
                "node {node}'s placement moved on: configuration epoch {}, primary {}, mirror {:?}",
                n.config_epoch, n.addr, n.mirror
            );
            return (stale(message), None);
        }
        tracing::info!(node, %mirror, "a mirror caught up with the primary: it joins");
        n.mirror = Some(mirror);
        n.config_epoch += 1;
        n.left_out = None;
        let placement = n.placement();
        // Silent from now on, it is dropped like any mirror.
        self.mirror_seen_ms.insert(node, now_ms);
        self.mirror_behind_ms.remove(&node);
        (Response::Placement(placement), Some(self.persisted.clone()))
    }

    /// `Request::AbandonJoin`: the mirror at `mirror`, which joined `node` under
    /// `config_epoch`, is about to empty its data directory. Raises the epoch (to be
    /// committed: the snapshot returned) if the placement is still the one it joined, so
    /// that no `AddMirror` of that join can name it later; replies the placement.
    pub fn abandon_join(
        &mut self,
        node: NodeId,
        config_epoch: u64,
        mirror: &str,
    ) -> (Response, Option<Persisted>) {
        let Some(n) = self.persisted.nodes.get_mut(&node) else {
            return (Response::Placement(None), None);
        };
        if n.config_epoch != config_epoch || n.mirror.is_some() {
            return (Response::Placement(n.placement()), None);
        }
        tracing::info!(node, %mirror, "a joining mirror gives up its join");
        n.config_epoch += 1;
        n.left_out = None;
        (
            Response::Placement(n.placement()),
            Some(self.persisted.clone()),
        )
    }

    /// Changes the placement of every replicated node that lost a copy, as of `now_ms`:
    /// a primary silent for `timeout_ms` whose mirror was heard from since is replaced by
    /// the mirror; a mirror that long behind by its primary's account is dropped, and the
    /// primary goes on alone once it registers under that placement; a primary named by a
    /// fail-over, or left alone, that never registered, silent twice that long, is replaced
    /// by the copy it replaced (or dropped) if that one kept its data and was heard from
    /// since. Each change raises the node's
    /// configuration epoch. With a snapshot, propose it: nobody hears of the new placement
    /// before it is committed.
    pub fn fail_over(&mut self, now_ms: u64, timeout_ms: u64) -> Option<Persisted> {
        let silent_for =
            |seen: Option<&u64>, ms: u64| seen.is_none_or(|&t| now_ms.saturating_sub(t) >= ms);
        let silent = |seen: Option<&u64>| silent_for(seen, timeout_ms);
        let mut changed = false;
        for (&id, n) in self.persisted.nodes.iter_mut() {
            let primary_seen = self.last_seen_ms.get(&id).copied();
            let primary_silent = silent(primary_seen.as_ref());
            let Some(mirror) = n.mirror.clone() else {
                // A promoted mirror that died before it registered (a `ram-repl` one then
                // restarts empty): the primary it replaced, alive and holding the node's
                // data, serves again rather than the node being lost.
                // The promoted copy heartbeats until it registers (as a mirror while it
                // waits out the old primary's lease): silent for twice the timeout, it is
                // taken for gone. The former must have been heard from within the timeout
                // too: one silent since may have died (a `ram-repl` one restarts empty).
                let promoted_silent = silent_for(primary_seen.as_ref(), 2 * timeout_ms);
                let former = (self.formers.get(&id)).filter(|f| {
                    n.may_name_again(&f.addr, f.config_epoch)
                        && promoted_silent
                        && primary_seen.is_none_or(|p| f.seen_ms >= p + timeout_ms)
                        && !silent(Some(&f.seen_ms))
                });
                if let Some(f) = former {
                    tracing::warn!(node = id, silent = %n.addr, former = %f.addr, "a promoted copy never registered: the copy it replaced serves again");
                    n.left_out = Some(std::mem::replace(&mut n.addr, f.addr.clone()));
                    n.unregistered = true;
                    n.config_epoch += 1;
                    self.last_seen_ms.insert(id, now_ms);
                    self.formers.remove(&id);
                    changed = true;
                }
                continue;
            };
            let mirror_seen = self.mirror_seen_ms.get(&id).copied();
            let mirror_silent = silent(mirror_seen.as_ref());
            // Heard from only before the primary fell silent, the mirror may have died with
            // it, or since: a `ram-repl` mirror then restarts empty, and promoting it would
            // replace the one copy left. It takes over once heard from after.
            let mirror_outlived_primary = crate::planted(crate::Bug::TrustOldHeartbeats)
                || mirror_seen.is_some_and(|m| primary_seen.is_none_or(|p| m >= p + timeout_ms));
            // A mirror is dropped only on its primary's word: the primary, not the managers,
            // knows whether the copy keeps up. A mirror silent towards the managers (cut off,
            // or its heartbeats going to a former leader) may still hold every record, and a
            // primary heartbeat that arrives late (held in a partition) may come from a
            // primary killed since; dropping the mirror on both would leave the node no copy.
            let mirror_behind = (self.mirror_behind_ms.get(&id))
                .is_some_and(|&ms| ms >= timeout_ms)
                || (crate::planted(crate::Bug::DropSilentMirror) && mirror_silent);
            if primary_silent && !mirror_silent && mirror_outlived_primary {
                tracing::warn!(node = id, old = %n.addr, new = %mirror, "primary silent: its mirror takes over");
                n.left_out = Some(std::mem::replace(&mut n.addr, mirror));
                n.mirror = None;
                n.unregistered = true;
                // The new primary registers once recovered; it is not failed until then.
                self.last_seen_ms.insert(id, now_ms);
                self.formers.remove(&id);
            } else if !primary_silent && mirror_behind {
                tracing::warn!(node = id, %mirror, "mirror lost: the primary goes on alone");
                n.mirror = None;
                n.left_out = Some(mirror);
                // The primary commits alone only once it registered under this placement:
                // until then the dropped mirror holds every record it counted durable, and
                // is named in its place if it dies first (the report may have been stale).
                n.unregistered = true;
            } else {
                continue;
            }
            n.config_epoch += 1;
            self.mirror_seen_ms.remove(&id);
            self.mirror_behind_ms.remove(&id);
            changed = true;
        }
        changed.then(|| self.persisted.clone())
    }

    fn rotate_after(&self) -> u64 {
        REPORTS_ROTATE_ROUNDS * (self.persisted.nodes.len() as u64).max(1)
    }

    /// Records a heartbeat; returns the acknowledgement and, if the node reported uncertain
    /// tids not already under recovery, a batch for the recovery coordinator.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        node: NodeId,
        uncertain: Vec<(Tid, Vec<NodeId>)>,
        applied: Vec<Applied>,
        applied_below: u64,
        mirror_behind_ms: u64,
    ) -> (Response, Option<RecoveryBatch>) {
        self.last_seen_ms.insert(node, now_ms);
        self.mirror_behind_ms.insert(node, mirror_behind_ms);
        self.applied_below.insert(node, applied_below);
        self.heartbeats += 1;
        if self.heartbeats >= self.rotate_after() {
            self.heartbeats = 0;
            self.applied_older = std::mem::take(&mut self.applied);
        }
        for group in applied {
            let participants: Arc<[NodeId]> = group.participants.into();
            for tid in group.tids {
                let older = &mut self.applied_older;
                let entry = self.applied.entry(tid).or_insert_with(|| {
                    older.remove(&tid).unwrap_or_else(|| Awaited {
                        participants: participants.clone(),
                        reported: Vec::new(),
                    })
                });
                if entry.report(node) {
                    let done = self.applied.remove(&tid).expect("present");
                    for &q in done.participants.iter() {
                        self.gc_out.entry(q).or_default().push(tid);
                    }
                }
            }
        }
        let fresh: Vec<_> = uncertain
            .into_iter()
            .filter(|(tid, _)| self.recovering.insert(*tid))
            .collect();
        let batch = (!fresh.is_empty()).then(|| {
            let mut by_node: BTreeMap<NodeId, Vec<(Tid, Vec<NodeId>)>> = BTreeMap::new();
            for (tid, participants) in &fresh {
                for &q in participants {
                    by_node
                        .entry(q)
                        .or_default()
                        .push((*tid, participants.clone()));
                }
            }
            RecoveryBatch {
                tids: fresh,
                by_node,
            }
        });
        let out = self.gc_out.entry(node).or_default();
        let gc: Vec<Tid> = out.drain(..out.len().min(GC_BATCH_MAX)).collect();
        (
            Response::HeartbeatAck {
                epoch: self.persisted.epoch,
                incarnation: self.incarnation,
                gc,
                applied_below: self.applied_below.iter().map(|(&q, &b)| (q, b)).collect(),
                placement: self.placement(node),
            },
            batch,
        )
    }

    /// Answers a request about regions (`CreateRegion`, `Region`, `ExtendRegion`, `Regions`,
    /// `TakeRegion`) or the logs' sequencer (`SetSequencer`, `Sequencer`); `None` for any
    /// other. With a snapshot, write it before sending the reply.
    pub fn region_request(&mut self, req: Request) -> Option<(Response, Option<Persisted>)> {
        let (resp, changed) = match req {
            Request::CreateRegion {
                name,
                kind,
                nodes,
                bytes_per_node,
                params,
            } => {
                let known = &self.persisted.nodes;
                let size = |n| known.get(&n).map(|n: &PersistedNode| n.size_bytes);
                let regions = &mut self.persisted.regions;
                regions.create(name, kind, nodes, bytes_per_node, params, size)
            }
            Request::Region { name } => (self.persisted.regions.get(&name), false),
            Request::ExtendRegion { name, nodes } => {
                let known = &self.persisted.nodes;
                let size = |n| known.get(&n).map(|n: &PersistedNode| n.size_bytes);
                self.persisted.regions.extend(&name, nodes, size)
            }
            Request::Regions => (self.persisted.regions.all(), false),
            Request::TakeRegion {
                name,
                expect,
                holder,
            } => self.persisted.regions.take(&name, expect, holder),
            Request::SetSequencer { addr } => {
                let changed = self.persisted.sequencer.as_ref() != Some(&addr);
                self.persisted.sequencer = Some(addr);
                (
                    Response::Sequencer(self.persisted.sequencer.clone()),
                    changed,
                )
            }
            Request::Sequencer => (Response::Sequencer(self.persisted.sequencer.clone()), false),
            _ => return None,
        };
        Some((resp, changed.then(|| self.persisted.clone())))
    }

    pub fn recovery_done(&mut self, batch: &RecoveryBatch) {
        for (tid, _) in &batch.tids {
            self.recovering.remove(tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 3,
            seq,
        }
    }

    #[test]
    fn gc_relayed_once_every_participant_applied() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let applied = |tids: Vec<Tid>| {
            vec![Applied {
                participants: vec![1, 2],
                tids,
            }]
        };
        let (resp, _) = s.heartbeat(0, 1, vec![], applied(vec![tid(1), tid(2)]), 0, 0);
        assert!(matches!(resp, Response::HeartbeatAck { ref gc, .. } if gc.is_empty()));
        let (resp, _) = s.heartbeat(0, 1, vec![], applied(vec![tid(1)]), 0, 0);
        assert!(
            matches!(resp, Response::HeartbeatAck { ref gc, .. } if gc.is_empty()),
            "a report repeated by the same node does not count twice"
        );
        let (resp, _) = s.heartbeat(0, 2, vec![], applied(vec![tid(1)]), 0, 0);
        assert!(matches!(resp, Response::HeartbeatAck { ref gc, .. } if gc == &vec![tid(1)]));
        let (resp, _) = s.heartbeat(0, 1, vec![], vec![], 0, 0);
        assert!(matches!(resp, Response::HeartbeatAck { ref gc, .. } if gc == &vec![tid(1)]));
    }

    #[test]
    fn every_node_hears_every_nodes_latest_applied_below() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let below = |resp: Response| match resp {
            Response::HeartbeatAck { applied_below, .. } => applied_below,
            other => panic!("{other:?}"),
        };
        let _ = s.heartbeat(0, 2, vec![], vec![], 40, 0);
        assert_eq!(
            below(s.heartbeat(0, 1, vec![], vec![], 7, 0).0),
            vec![(1, 7), (2, 40)]
        );
        assert_eq!(
            below(s.heartbeat(0, 2, vec![], vec![], 41, 0).0),
            vec![(1, 7), (2, 41)]
        );
    }

    #[test]
    fn a_report_kept_through_two_rotations_is_dropped() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let applied = |tids: Vec<Tid>| {
            vec![Applied {
                participants: vec![1, 2],
                tids,
            }]
        };
        let gc = |resp: Response| match resp {
            Response::HeartbeatAck { gc, .. } => gc,
            other => panic!("{other:?}"),
        };
        let _ = s.heartbeat(0, 1, vec![], applied(vec![tid(1), tid(2)]), 0, 0);
        for _ in 1..s.rotate_after() {
            let _ = s.heartbeat(0, 3, vec![], vec![], 0, 0);
        }
        assert_eq!(s.applied_older.len(), 2, "rotated once");
        let completed = s.heartbeat(0, 2, vec![], applied(vec![tid(1)]), 0, 0).0;
        assert_eq!(
            gc(completed),
            vec![tid(1)],
            "a report found among the older ones"
        );
        assert_eq!(gc(s.heartbeat(0, 1, vec![], vec![], 0, 0).0), vec![tid(1)]);
        for _ in 0..2 * s.rotate_after() {
            let _ = s.heartbeat(0, 3, vec![], vec![], 0, 0);
        }
        assert!(s.applied.is_empty() && s.applied_older.is_empty());
        let _ = s.heartbeat(0, 2, vec![], applied(vec![tid(2)]), 0, 0);
        assert!(
            gc(s.heartbeat(0, 1, vec![], vec![], 0, 0).0).is_empty(),
            "node 1's report was dropped: node 1 settles tid 2 by asking node 2"
        );
    }

    #[test]
    fn a_tid_is_applied_once_every_distinct_participant_reported() {
        let awaited = |participants: Vec<NodeId>| Awaited {
            participants: participants.into(),
            reported: Vec::new(),
        };
        let mut twice = awaited(vec![1, 1, 2]);
        assert!(!twice.report(1));
        assert!(!twice.report(9), "not a participant");
        assert!(twice.report(2));
        let mut many = awaited((1..=65).collect());
        for q in 1..65 {
            assert!(!many.report(q));
            assert!(!many.report(q));
        }
        assert!(many.report(65));
    }

    #[test]
    fn durable_changes_come_back_as_snapshots_to_write() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let (_, written) = s.register(0, 4, "127.0.0.1:9".into(), 4096, true, false, None);
        let written = written.expect("a new node is written before the reply");
        assert_eq!(&written, s.persisted());
        let (_, again) = s.register(10, 4, "127.0.0.1:9".into(), 4096, true, true, None);
        assert!(again.is_none(), "nothing changed");
        assert_eq!(s.advance_epoch().epoch, 2);
        let restarted = ManagerState::new(s.persisted().clone(), 2);
        assert_eq!(restarted.epoch(), 2);
        assert_eq!(
            restarted.persisted().addr(4).as_deref(),
            Some("127.0.0.1:9")
        );
    }

    #[test]
    fn regions_and_their_epochs_are_persisted_before_the_reply() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, "127.0.0.1:9".into(), 1 << 20, true, false, None);
        let create = Request::CreateRegion {
            name: "events".into(),
            kind: "log".into(),
            nodes: vec![1],
            bytes_per_node: 8192,
            params: vec![1, 2],
        };
        let (resp, written) = s.region_request(create).expect("a region request");
        assert!(matches!(resp, Response::Region(ref r) if r.nodes == vec![(1, (1 << 20) - 8192)]));
        let written = written.expect("a new region is written before the reply");
        let take = Request::TakeRegion {
            name: "events".into(),
            expect: 1,
            holder: "127.0.0.1:8".into(),
        };
        let (_, taken) = s.region_request(take).expect("a region request");
        assert!(taken.is_some());
        let restarted = ManagerState::new(s.persisted().clone(), 2);
        assert_eq!(restarted.persisted(), s.persisted());
        assert_ne!(&written, s.persisted(), "the epoch was written too");
        assert!(s.region_request(Request::Directory).is_none());
        let set = Request::SetSequencer {
            addr: "127.0.0.1:7".into(),
        };
        let (_, set_written) = s.region_request(set.clone()).expect("a sequencer request");
        assert!(set_written.is_some(), "the sequencer's address is written");
        assert!(s.region_request(set).expect("again").1.is_none());
        let (resp, _) = s
            .region_request(Request::Sequencer)
            .expect("a sequencer request");
        assert!(matches!(resp, Response::Sequencer(Some(ref a)) if a == "127.0.0.1:7"));
        let old_file = r#"{"epoch": 3, "nodes": {}}"#;
        let old: Persisted = serde_json::from_str(old_file).expect("files without regions load");
        assert_eq!(old.regions, Regions::default());
    }

    #[test]
    fn a_node_is_alive_until_the_failure_timeout_passes_on_the_given_clock() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(1_000, 1, "127.0.0.1:9".into(), 4096, true, false, None);
        let alive = |s: &ManagerState, now| s.directory(now, 3_000).nodes[0].alive;
        assert!(alive(&s, 3_999));
        assert!(!alive(&s, 4_000));
        let _ = s.heartbeat(5_000, 1, vec![], vec![], 0, 0);
        assert!(alive(&s, 7_999));
    }

    #[test]
    fn a_join_given_up_can_no_longer_be_named() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, "p:1".into(), 4096, true, false, Some("m:1".into()));
        let _ = s.heartbeat(2_000, 1, vec![], vec![], 0, 2_000);
        let _ = s
            .fail_over(2_000, 1_000)
            .expect("the mirror its primary reports behind dropped");
        let (given_up, written) = s.abandon_join(1, 2, "m:1");
        assert!(
            matches!(given_up, Response::Placement(Some(p)) if p.config_epoch == 3 && p.mirror.is_none())
        );
        assert!(written.is_some());
        let (late, written) = s.add_mirror(2_100, 1, 2, "p:1", "m:1".into());
        assert!(
            matches!(
                late,
                Response::Error {
                    code: ErrorCode::StaleConfig,
                    ..
                }
            ),
            "{late:?}"
        );
        assert!(written.is_none());
    }

    #[test]
    fn a_mirror_heard_from_only_before_its_primary_fell_silent_is_not_promoted() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, "p:1".into(), 4096, true, false, Some("m:1".into()));
        let _ = s.heartbeat(100, 1, vec![], vec![], 0, 0);
        // The mirror's last word comes just after the primary's: both may be gone.
        let _ = s.mirror_heartbeat(150, 1, "m:1");
        assert!(
            s.fail_over(1_100, 1_000).is_none(),
            "the mirror may be dead too"
        );
        let _ = s.mirror_heartbeat(1_120, 1, "m:1");
        let _ = s
            .fail_over(1_150, 1_000)
            .expect("alive after the primary fell silent");
        assert_eq!(s.placement(1).unwrap().primary, "m:1");
    }

    #[test]
    fn a_mirror_is_dropped_only_on_its_primarys_report() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, "p:1".into(), 4096, true, false, Some("m:1".into()));
        let _ = s.mirror_heartbeat(100, 1, "m:1");
        for now in (200..=2_000).step_by(100) {
            let _ = s.heartbeat(now, 1, vec![], vec![], 0, 0);
        }
        assert!(
            s.fail_over(2_000, 1_000).is_none(),
            "silent towards the managers, but keeping up with its primary"
        );
        let _ = s.heartbeat(2_100, 1, vec![], vec![], 0, 999);
        assert!(s.fail_over(2_100, 1_000).is_none(), "not behind for long");
        let _ = s.heartbeat(2_200, 1, vec![], vec![], 0, 1_000);
        let _ = s
            .fail_over(2_200, 1_000)
            .expect("behind for the fail-over timeout");
        assert_eq!(s.placement(1).unwrap().mirror, None);
    }

    /// Node 1 (primary p:1, mirror m:1) with its mirror dropped at 2,200 on its primary's
    /// report: configuration epoch 2, the primary alone.
    fn dropped_at_2200() -> ManagerState {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, "p:1".into(), 4096, true, false, Some("m:1".into()));
        let _ = s.heartbeat(2_200, 1, vec![], vec![], 0, 1_000);
        let _ = s.fail_over(2_200, 1_000).expect("dropped");
        s
    }

    #[test]
    fn a_dropped_mirror_is_named_primary_if_its_primary_dies_before_registering_alone() {
        let mut s = dropped_at_2200();
        let alone = s.placement(1).unwrap();
        assert_eq!((alone.config_epoch, alone.mirror), (2, None));
        let keep = |r: Response| matches!(r, Response::FormerCopy { keep: true, .. });
        assert!(
            !keep(s.former_primary(2_300, 1, "x:1".into(), 1)),
            "not the copy the drop left out"
        );
        assert!(keep(s.former_primary(2_300, 1, "m:1".into(), 1)));
        assert!(
            s.fail_over(3_300, 1_000).is_none(),
            "the primary may still register"
        );
        assert!(keep(s.former_primary(4_100, 1, "m:1".into(), 1)));
        let _ = s.fail_over(4_200, 1_000).expect("silent twice the timeout");
        let named = s.placement(1).unwrap();
        assert_eq!((named.config_epoch, named.primary.as_str()), (3, "m:1"));

        let mut s = dropped_at_2200();
        assert!(keep(s.former_primary(2_300, 1, "m:1".into(), 1)));
        let (resp, written) = s.register(2_400, 1, "p:1".into(), 4096, true, false, None);
        assert!(matches!(resp, Response::Registered { .. }), "{resp:?}");
        assert!(
            written.is_some(),
            "registered alone: committed before the reply"
        );
        assert!(
            !keep(s.former_primary(2_500, 1, "m:1".into(), 1)),
            "the primary may commit alone now: the dropped copy lets go"
        );
        assert!(s.fail_over(4_500, 1_000).is_none());
        assert_eq!(s.placement(1).unwrap().primary, "p:1");
    }

    #[test]
    fn a_silent_primary_is_replaced_by_its_mirror_and_then_refused() {
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let mirror = Some("m:1".to_string());
        let (resp, _) = s.register(0, 1, "p:1".into(), 4096, true, false, mirror.clone());
        let Response::Registered { placement, .. } = resp else {
            panic!("{resp:?}")
        };
        let first = placement.expect("replicated");
        assert_eq!((first.config_epoch, first.mirror), (1, mirror.clone()));
        let _ = s.register(0, 2, "q:1".into(), 4096, true, false, Some("n:1".into()));
        // Node 2's mirror fails its primary; node 1's primary stays silent.
        for now in (100..=1_000).step_by(100) {
            let _ = s.mirror_heartbeat(now, 1, "m:1");
            let _ = s.heartbeat(now, 2, vec![], vec![], 0, now - 1);
        }
        assert!(
            s.fail_over(999, 1_000).is_none(),
            "nothing silent or behind for 1 s yet"
        );
        let _ = s.heartbeat(1_000, 2, vec![], vec![], 0, 1_000);
        let written = s.fail_over(1_000, 1_000).expect("two changes");
        assert_eq!(&written, s.persisted());
        let one = s.placement(1).unwrap();
        assert_eq!(
            (one.config_epoch, one.primary.as_str(), one.mirror),
            (2, "m:1", None)
        );
        let two = s.placement(2).unwrap();
        assert_eq!(
            (two.config_epoch, two.primary.as_str(), two.mirror),
            (2, "q:1", None)
        );
        assert!(matches!(
            s.mirror_heartbeat(1_100, 1, "m:1"),
            Response::Placement(Some(p)) if p.primary == "m:1"
        ));
        let (refused, changed) = s.register(1_100, 1, "p:1".into(), 4096, true, true, mirror);
        assert!(
            matches!(
                refused,
                Response::Error {
                    code: ErrorCode::StaleConfig,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(changed.is_none());
        let (resp, _) = s.register(1_100, 1, "m:1".into(), 4096, true, true, None);
        assert!(matches!(
            resp,
            Response::Registered {
                placement: Some(_),
                ..
            }
        ));
        assert!(
            s.fail_over(5_000, 1_000).is_none(),
            "no mirror left to fail over to"
        );
        // The old primary, started again as a mirror, caught up: it joins.
        let (named, written) = s.add_mirror(5_000, 1, 2, "m:1", "p:1".into());
        let expected = Placement {
            config_epoch: 3,
            primary: "m:1".into(),
            mirror: Some("p:1".into()),
        };
        assert!(matches!(named, Response::Placement(Some(p)) if p == expected));
        assert!(written.is_some());
        let (again, written) = s.add_mirror(5_100, 1, 2, "m:1", "p:1".into());
        assert!(matches!(again, Response::Placement(Some(p)) if p == expected));
        assert!(written.is_none(), "a repeated request changes nothing");
        let (moved_on, written) = s.add_mirror(5_100, 1, 2, "m:1", "x:1".into());
        assert!(matches!(
            moved_on,
            Response::Error {
                code: ErrorCode::StaleConfig,
                ..
            }
        ));
        assert!(written.is_none());
        // A join given up raises the epoch: the request naming it is refused from then on.
        let (at, written) = s.abandon_join(1, 3, "p:1");
        assert!(
            matches!(at, Response::Placement(Some(p)) if p.config_epoch == 3 && p.mirror.is_some())
        );
        assert!(written.is_none(), "named already: nothing to give up");
        let _ = s.heartbeat(5_900, 1, vec![], vec![], 0, 0);
        assert!(
            s.fail_over(5_900, 1_000).is_none(),
            "heard from at its naming"
        );
        let _ = s.heartbeat(6_000, 1, vec![], vec![], 0, 1_000);
        assert!(
            s.fail_over(6_000, 1_000).is_some(),
            "then dropped once its primary reports it behind"
        );
        assert_eq!(s.placement(1).unwrap().mirror, None);
        let restarted = ManagerState::new(s.persisted().clone(), 2);
        assert_eq!(
            restarted.placement(1),
            s.placement(1),
            "placements are durable"
        );
    }

    /// Node 1 with primary P and mirror M (epoch 1), then M promoted (epoch 2) at `t`.
    fn promoted_at(t: u64) -> ManagerState {
        const P: &str = "10.0.0.1:1";
        const M: &str = "10.0.0.2:1";
        let mut s = ManagerState::new(Persisted::fresh(), 1);
        let _ = s.register(0, 1, P.into(), 4096, true, false, Some(M.into()));
        assert_eq!(s.placement(1).unwrap().config_epoch, 1);
        s.mirror_heartbeat(t - 1, 1, M);
        assert!(s.fail_over(t, 500).is_some(), "P silent: M promoted");
        assert_eq!(s.placement(1).unwrap().primary, M);
        s
    }

    #[test]
    fn a_replaced_primary_is_named_again_only_while_its_successor_never_registered() {
        const P: &str = "10.0.0.1:1";
        const M: &str = "10.0.0.2:1";
        let keep = |r: Response| match r {
            Response::FormerCopy { keep, .. } => keep,
            other => panic!("{other:?}"),
        };
        // M never registers and falls silent: P, heard from since, serves again.
        let mut s = promoted_at(1_000);
        assert!(keep(s.former_primary(1_100, 1, P.into(), 1)));
        assert!(
            !keep(s.former_primary(1_100, 1, P.into(), 0)),
            "not the copy replaced"
        );
        assert!(
            s.fail_over(1_900, 500).is_none(),
            "M silent for less than twice the timeout"
        );
        assert!(
            s.fail_over(2_500, 500).is_none(),
            "P not heard from within the timeout: it may have died since"
        );
        assert!(keep(s.former_primary(2_950, 1, P.into(), 1)));
        let written = s.fail_over(3_000, 500).expect("P named again");
        let p = written.placement(1).unwrap();
        assert_eq!((p.primary.as_str(), p.config_epoch, p.mirror), (P, 3, None));
        // M registered: P lets its copy go, and is never named again.
        let mut s = promoted_at(1_000);
        assert!(keep(s.former_primary(1_100, 1, P.into(), 1)));
        let (_, written) = s.register(1_200, 1, M.into(), 4096, true, true, None);
        assert!(
            written.is_some(),
            "the registration is committed before the reply"
        );
        assert!(!keep(s.former_primary(1_300, 1, P.into(), 1)));
        assert!(s.fail_over(5_000, 500).is_none());
        assert_eq!(s.placement(1).unwrap().primary, M);
        // M heartbeats while it waits out the lease: alive, P is not named.
        let mut s = promoted_at(1_000);
        for t in (1_100..3_000).step_by(100) {
            s.mirror_heartbeat(t, 1, M);
            assert!(keep(s.former_primary(t, 1, P.into(), 1)));
            assert!(s.fail_over(t, 500).is_none(), "at {t}");
        }
    }
}
