//! The memory node's tokio driver: serves connections, runs the redo-log writer thread
//! (group commit), checkpoints the image, heartbeats the manager, and performs stage 2 of
//! recovery by asking peers. All protocol decisions are the `Participant`'s.

use crate::participant::{Actions, Config, LogCounters, Mode, Participant, BATCH_TIDS_MAX};
use crate::recovery::Stage2;
use crate::redo_log::{encode_record, LogError, LogRecord, Lsn, RedoLog};
use crate::shipper::Shipper;
use crate::space::Space;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tutti_wire::EXIT_REPLACED;
use tutti_wire::{
    Backoff, Connection, Connections, Dialer, Limits, Managers, NodeId, Replies, Request, Response,
    RpcError, Tid,
};

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    pub listen: String,
    pub manager: String,
    pub data: Option<PathBuf>,
    pub mode: Mode,
    pub size_bytes: u64,
    pub metrics: Option<String>,
    pub timeout_uncertain_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub checkpoint_interval_ms: u64,
    pub log_segment_bytes: u64,
    pub limits: Limits,
    pub frame_bytes_max: usize,
    /// How it reaches the manager and its peers (routes through a proxy under `tutti chaos`).
    pub dialer: Dialer,
    /// `log-repl` (docs/replication.md): a primary's mirror at the node's first start (the
    /// manager's placement rules after that).
    pub mirror: Option<String>,
    pub role: Role,
    /// `ram-repl`: the data directory is on a RAM file system and holds this process's
    /// copy only while it runs. It is emptied at start and at a clean stop, and a process
    /// enters a node that already has a placement as a new mirror (docs/replication.md).
    pub volatile: bool,
}

/// What a `log-repl` process is for its logical node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves the node (an unreplicated node is its own primary).
    Primary,
    /// Holds a copy of the primary's log and image; serves once the manager names it
    /// primary.
    Mirror,
}

impl NodeConfig {
    pub fn new(
        id: NodeId,
        listen: String,
        manager: String,
        mode: Mode,
        data: Option<PathBuf>,
    ) -> Self {
        NodeConfig {
            id,
            listen,
            manager,
            data,
            mode,
            size_bytes: 1 << 30,
            metrics: None,
            timeout_uncertain_ms: 2_000,
            heartbeat_interval_ms: 200,
            checkpoint_interval_ms: 2_000,
            log_segment_bytes: crate::redo_log::SEGMENT_BYTES_MAX_DEFAULT,
            limits: Limits::default(),
            frame_bytes_max: tutti_wire::FRAME_BYTES_MAX_DEFAULT,
            dialer: Dialer::default(),
            mirror: None,
            role: Role::Primary,
            volatile: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Log(#[from] LogError),
    /// A `log-repl` primary that another copy of its node replaced.
    #[error("replaced: {0}")]
    Replaced(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodeError {
    let what = what.into();
    move |source| NodeError::Io { what, source }
}

/// How long a node waits for the manager or a peer before trying again.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// What the node hands the log writer, over an unbounded channel: senders hold the
/// participant's lock, which the writer takes after each sync, so a sender blocked on a full
/// channel would deadlock with it. The queue is bounded by the requests admitted: every
/// record comes from a request (each connection reads at most `IN_FLIGHT_MAX` at once,
/// and a request that needs its record durable is not answered before the sync) or from a
/// decision on a tid whose prepare was synced; the writer drains the whole queue each turn.
enum LogCmd {
    /// `count` records, encoded, that follow the ones before; `needs_sync` unless all are
    /// lazy (`LogRecord::needs_sync`).
    Append {
        count: u64,
        bytes: Vec<u8>,
        needs_sync: bool,
    },
    Truncate(Lsn),
    Sync(oneshot::Sender<()>),
}

/// Log records appended by requests but not yet handed to the writer, in lsn order.
#[derive(Default)]
struct Unsent {
    records: Vec<(Lsn, LogRecord)>,
    handover_scheduled: bool,
}

impl Unsent {
    /// Sends the unsent records, then `append`, then `truncate` to `node`'s writer. A
    /// replicated primary ships them from here too, before its writer has even woken: the
    /// mirror's copy is then made in parallel with this one's, not after it.
    fn hand_over(&mut self, node: &Node, append: Vec<(Lsn, LogRecord)>, truncate: Option<Lsn>) {
        let Some(log) = &node.log else { return };
        let mut records = std::mem::take(&mut self.records);
        records.extend(append);
        if let Some(&(first, _)) = records.first() {
            let mut bytes = Vec::new();
            let mut needs_sync = false;
            for (lsn, record) in &records {
                needs_sync |= record.needs_sync();
                encode_record(*lsn, record, &mut bytes);
            }
            let count = records.len() as u64;
            if let Some(shipper) = &node.shipper {
                let mut s = shipper.lock().expect("shipper poisoned");
                s.push(node.now_ms(), first, count, bytes.clone());
                node.ship_wakeup.notify_one();
            }
            let _ = log.send(LogCmd::Append {
                count,
                bytes,
                needs_sync,
            });
        }
        if let Some(lsn) = truncate {
            let _ = log.send(LogCmd::Truncate(lsn));
        }
    }
}

fn send_replies(replies: Vec<(Replies, u64, Response)>) {
    for (to, id, resp) in replies {
        if id != tutti_wire::ONE_WAY {
            let _ = to.send((id, resp));
        }
    }
}

pub(crate) struct Node {
    pub(crate) cfg: NodeConfig,
    participant: Mutex<Participant<Replies>>,
    log: Option<std::sync::mpsc::Sender<LogCmd>>,
    /// Whoever holds this lock sends to `log`, so records reach the writer in lsn order.
    unsent: Mutex<Unsent>,
    /// Set while the log writer waits for `participant`. A std mutex is not fair: the event
    /// loop retaking it step after step of a checkpoint kept the writer, and every reply
    /// waiting for a sync, from it for up to 37 ms. The checkpoint lets the writer go first.
    writer_waiting: AtomicBool,
    start: Instant,
    peers: Connections,
    directory: Mutex<HashMap<NodeId, String>>,
    /// The manager, or its group (`NodeConfig::manager` lists them).
    pub(crate) managers: Managers,
    /// A replicated primary's shipping to its mirror (`log-repl`); none otherwise.
    shipper: Option<Mutex<Shipper<Replies>>>,
    /// Wakes the shipping task: records to ship, or a new placement.
    pub(crate) ship_wakeup: tokio::sync::Notify,
    /// What a mirror joining this primary reads (re-replication).
    pub(crate) seed: Mutex<Option<crate::primary::Seed>>,
    /// Wakes `expire_lock_waits`: a minitransaction began to wait for a lock.
    lock_waits: tokio::sync::Notify,
}

impl Node {
    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Runs `f` on the shipper; only a replicated primary ships.
    pub(crate) fn with_shipper<T>(&self, f: impl FnOnce(&mut Shipper<Replies>) -> T) -> T {
        let shipper = self.shipper.as_ref().expect("a replicated primary");
        f(&mut shipper.lock().expect("shipper poisoned"))
    }

    /// Both copies hold every record below `durable_next`: the participant may rely on
    /// them, and the lease was renewed.
    pub(crate) fn durable(&self, durable_next: Lsn) {
        self.step(|p, now| p.on_synced(now, durable_next.saturating_sub(1)));
        self.release_held();
    }

    /// Takes a placement the managers committed: a placement naming another primary ends
    /// the process. A `log-repl` primary records each configuration it serves under with
    /// its copy (`mirror_node::record_served`).
    pub(crate) fn take_placement(&self, placement: tutti_wire::Placement) {
        let epochs = self.with_shipper(|s| {
            let before = s.placement().config_epoch;
            s.set_placement(placement)
                .map(|()| (before, s.placement().config_epoch))
        });
        match epochs {
            Err(why) => self.replaced(&why),
            Ok((before, now)) if now > before => self.record_served(now),
            Ok(_) => {}
        }
    }

    fn record_served(&self, config_epoch: u64) {
        if let (false, Some(data)) = (self.cfg.volatile, &self.cfg.data) {
            crate::mirror_node::record_served(data, config_epoch);
        }
    }

    /// Another copy serves this node now: stop at once, answering nobody. The primary
    /// leaves its copy to the process started next in its place: the copy that replaced
    /// it may die (or lose its disk) before it serves, and this one is then the node's
    /// only copy (`mirror_node::leave_copy`).
    pub(crate) fn replaced(&self, why: &str) -> ! {
        tracing::error!("this primary was replaced ({why}); stopping");
        if let (Some(data), Some(_)) = (&self.cfg.data, &self.shipper) {
            let config_epoch = self.with_shipper(|s| s.placement().config_epoch);
            crate::mirror_node::leave_copy(data, config_epoch);
        }
        std::process::exit(EXIT_REPLACED);
    }

    /// Sends `replies`, unless this is a replicated primary whose lease ran out: those wait
    /// (in order) for the next acknowledgement, since the mirror may be taking over.
    fn send(&self, replies: Vec<(Replies, u64, Response)>) {
        match &self.shipper {
            Some(shipper) => {
                let mut s = shipper.lock().expect("shipper poisoned");
                // Under the lock: replies leave in the order they were made.
                send_replies(s.replies(self.now_ms(), replies));
            }
            None => send_replies(replies),
        }
    }

    fn release_held(&self) {
        if let Some(shipper) = &self.shipper {
            let mut s = shipper.lock().expect("shipper poisoned");
            send_replies(s.release(self.now_ms()));
        }
    }

    /// Runs `f` on the participant and carries out its actions, handing its log records
    /// (after any unsent ones) to the writer at once.
    fn step(&self, f: impl FnOnce(&mut Participant<Replies>, u64) -> Actions<Replies>) {
        let replies = {
            let mut p = self.participant.lock().expect("participant poisoned");
            let acts = f(&mut p, self.now_ms());
            if self.log.is_some() {
                let mut unsent = self.unsent.lock().expect("unsent poisoned");
                unsent.hand_over(self, acts.append, acts.truncate_below);
            }
            acts.replies
        };
        self.send(replies);
    }

    /// `step` for a request read from a connection. Its log records wait until the
    /// connection has handled every request already received: the writer then gets the
    /// whole burst at once and syncs it in one go, where waking it for the burst's first
    /// record would cost one more sync (two device round trips) for a few records.
    fn step_request(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Participant<Replies>, u64) -> Actions<Replies>,
    ) {
        let replies = {
            let mut p = self.participant.lock().expect("participant poisoned");
            let before = p.waiting_until();
            let acts = f(&mut p, self.now_ms());
            // Only a request that began to wait, ending before the others, moves the timer.
            let after = p.waiting_until();
            if after.is_some() && (before.is_none() || after < before) {
                self.lock_waits.notify_one();
            }
            if self.log.is_some() {
                let mut unsent = self.unsent.lock().expect("unsent poisoned");
                unsent.records.extend(acts.append);
                if acts.truncate_below.is_some() {
                    unsent.hand_over(self, Vec::new(), acts.truncate_below);
                } else if !unsent.records.is_empty() && !unsent.handover_scheduled {
                    unsent.handover_scheduled = true;
                    // Runs once the tasks ready now, this connection's among them, yield.
                    let node = self.clone();
                    tokio::spawn(async move { node.hand_over_unsent() });
                }
            }
            acts.replies
        };
        self.send(replies);
    }

    fn hand_over_unsent(&self) {
        if self.log.is_some() {
            let mut unsent = self.unsent.lock().expect("unsent poisoned");
            unsent.handover_scheduled = false;
            unsent.hand_over(self, Vec::new(), None);
        }
    }

    /// `len` bytes of the image from `addr`, as they are in memory now (holes untouched).
    pub(crate) fn read_image(&self, addr: u64, len: u64) -> Vec<u8> {
        let p = self.participant.lock().expect("participant poisoned");
        p.space().read_written(addr, len)
    }

    /// Waits until every record appended so far is on disk.
    pub(crate) async fn sync_log(&self) -> Result<(), ()> {
        let Some(log) = &self.log else { return Ok(()) };
        let (tx, rx) = oneshot::channel();
        {
            // Under the lock: the cue must follow the records handed over before it.
            let mut unsent = self.unsent.lock().expect("unsent poisoned");
            unsent.hand_over(self, Vec::new(), None);
            log.send(LogCmd::Sync(tx)).map_err(|_| ())?;
        }
        rx.await.map_err(|_| ())
    }

    async fn peer(&self, id: NodeId) -> Result<Arc<Connection>, RpcError> {
        if let Some(c) = self.peers.cached(id) {
            return Ok(c);
        }
        let known = |node: &Node| {
            node.directory
                .lock()
                .expect("directory poisoned")
                .get(&id)
                .cloned()
        };
        let addr = match known(self) {
            Some(addr) => addr,
            None => {
                self.refresh_directory().await?;
                known(self).ok_or_else(|| RpcError::Connect {
                    addr: format!("node {id}"),
                    reason: "not in the manager's directory".into(),
                })?
            }
        };
        self.peers.get(id, &addr).await
    }

    /// Calls peer `q`. On a failure the directory is asked again: a replicated peer may be
    /// served at another address now (its mirror took over, and the old address may even
    /// answer again, as a mirror), and the connection to the old one is dropped.
    async fn call_peer(&self, q: NodeId, req: &Request) -> Result<Response, RpcError> {
        let result = match self.peer(q).await {
            Ok(conn) => conn.call_within(req, RPC_TIMEOUT).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            let addr_of = |node: &Node| {
                (node.directory.lock().expect("directory poisoned"))
                    .get(&q)
                    .cloned()
            };
            let before = addr_of(self);
            let _ = self.refresh_directory().await;
            if addr_of(self) != before {
                self.peers.forget(q);
            }
        }
        result
    }

    async fn refresh_directory(&self) -> Result<(), RpcError> {
        match self.managers.call(&Request::Directory, RPC_TIMEOUT).await? {
            Response::Directory(d) => {
                let mut dir = self.directory.lock().expect("directory poisoned");
                for n in d.nodes {
                    dir.insert(n.id, n.addr);
                }
                Ok(())
            }
            _ => Err(RpcError::Unexpected {
                addr: self.managers.list(),
            }),
        }
    }
}

/// Runs a memory node until `shutdown` resolves, then syncs the log and flushes the image.
/// A mirror (`Role::Mirror`) runs as one until the manager names it primary, then as the
/// node's primary on the same address and data directory.
pub async fn run(
    mut cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    if cfg.id == 0 {
        return Err(NodeError::Config("node ids start at 1".into()));
    }
    if cfg.mode == Mode::Ram && (cfg.mirror.is_some() || cfg.role == Role::Mirror) {
        return Err(NodeError::Config(
            "replication (a mirror) needs a redo log: use log-repl".into(),
        ));
    }
    if cfg.volatile {
        enter_volatile(&mut cfg).await?;
    }
    let creating = match (cfg.volatile, cfg.role, &cfg.mirror) {
        (false, Role::Primary, Some(_)) => enter_without_copy(&mut cfg).await?,
        _ => false,
    };
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .map_err(io(format!("listen on {}", cfg.listen)))?;
    let listening = listener.local_addr().map_err(io("local address"))?;
    tutti_wire::require_credentials_beyond_loopback(listening, cfg.dialer.credentials())
        .map_err(NodeError::Config)?;
    let parse_managers = || {
        Managers::parse(&cfg.manager, cfg.frame_bytes_max, cfg.dialer.clone())
            .map_err(NodeError::Config)
    };
    let mut shutdown = std::pin::pin!(shutdown);
    // The configuration epoch that named this process primary, if it was a mirror.
    let (listener, promoted_in) = match cfg.role {
        Role::Primary => (listener, None),
        Role::Mirror => {
            let ended =
                crate::mirror_node::run(&cfg, listener, parse_managers()?, shutdown.as_mut())
                    .await?;
            match ended {
                crate::mirror_node::Ended::Stopped => return stopped(&cfg),
                crate::mirror_node::Ended::Promoted(named_in) => {
                    (rebind(listening).await?, Some(named_in))
                }
            }
        }
    };
    let promoted = promoted_in.is_some();
    let listen_addr = listening.to_string();
    let managers = parse_managers()?;
    let replicated = cfg.mirror.is_some() || promoted;
    let pcfg = Config {
        id: cfg.id,
        mode: cfg.mode,
        timeout_uncertain_ms: cfg.timeout_uncertain_ms,
        limits: cfg.limits,
        checkpoint_step_tids: crate::participant::CHECKPOINT_STEP_TIDS,
    };
    let mut shipper = None;
    let (participant, log, space_flusher, rebooted, _dir_lock) = match cfg.mode {
        Mode::Ram => {
            let space = Space::anonymous(cfg.size_bytes).map_err(io("map the address space"))?;
            (Participant::new(pcfg, space, 1), None, None, false, None)
        }
        Mode::Log => {
            let data = cfg
                .data
                .clone()
                .ok_or_else(|| NodeError::Config("log mode needs --data DIR".into()))?;
            let lock = open_data_dir(&data, &cfg)?;
            if cfg.volatile && !promoted {
                crate::mirror_node::empty_copy(&data)?;
            }
            let space = Space::image(&data.join(IMAGE_FILE), cfg.size_bytes)
                .map_err(io("open the image"))?;
            let flusher = space.flusher();
            let recovered = open_log(&data, &cfg)?;
            // Once its image and log are there (`lost`).
            if creating {
                mark_whole(&data)?;
            }
            let rebooted = !recovered.records.is_empty();
            let (mut log, mut records) = (recovered.log, recovered.records);
            if replicated {
                let req = register_request(&cfg, &listen_addr, rebooted);
                let first = match crate::primary::register(&managers, &req).await {
                    // A copy promoted and replaced before it registered keeps its copy for
                    // the managers, as a replaced primary does; so does a `log-repl` primary
                    // replaced while it was down, as of the configuration it last served.
                    Err(NodeError::Replaced(why)) => {
                        let served = (!cfg.volatile)
                            .then(|| crate::mirror_node::served(&data))
                            .flatten();
                        if let Some(config_epoch) = promoted_in.or(served) {
                            crate::mirror_node::leave_copy(&data, config_epoch);
                        }
                        return Err(NodeError::Replaced(why));
                    }
                    first => first?,
                };
                let config_epoch = first.placement.config_epoch;
                tracing::info!(config_epoch, "registered with the managers");
                // This process, as the mirror tells it from an earlier one: later processes
                // start later.
                let session = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_micros() as u64);
                let (reg, behind) = crate::primary::adopt_mirror_tail(
                    cfg.id,
                    session,
                    &managers,
                    &req,
                    first,
                    &cfg.dialer,
                    cfg.frame_bytes_max,
                    &mut log,
                    &mut records,
                )
                .await?;
                if !cfg.volatile {
                    crate::mirror_node::record_served(&data, reg.placement.config_epoch);
                    // Registered: no longer a copy left for the managers to name again.
                    crate::mirror_node::remove_former_marker(&data)?;
                }
                let mut s = Shipper::new(cfg.id, session, reg.placement, log.next_lsn())
                    .in_ram(cfg.volatile);
                if behind {
                    s.mark_behind(0);
                }
                shipper = Some((s, reg.epoch));
            }
            let next = log.next_lsn();
            tracing::info!(records = records.len(), "stage 1: read the redo log");
            let p = Participant::recover(pcfg, space, next, records);
            (p, Some(log), Some(flusher), rebooted, Some(lock))
        }
    };
    let (log_tx, log_rx) = std::sync::mpsc::channel();
    let (shipper, registered_epoch) = match shipper {
        Some((s, epoch)) => (Some(Mutex::new(s)), Some(epoch)),
        None => (None, None),
    };
    let node = Arc::new(Node {
        cfg: cfg.clone(),
        participant: Mutex::new(participant),
        log: log.as_ref().map(|_| log_tx.clone()),
        unsent: Mutex::default(),
        writer_waiting: Default::default(),
        start: Instant::now(),
        peers: Connections::new(cfg.frame_bytes_max, RPC_TIMEOUT, cfg.dialer.clone()),
        directory: Mutex::default(),
        managers,
        shipper,
        ship_wakeup: tokio::sync::Notify::new(),
        seed: Mutex::default(),
        lock_waits: tokio::sync::Notify::new(),
    });
    tokio::spawn(expire_lock_waits(node.clone()));
    let writer = log.map(|log| {
        let node = node.clone();
        std::thread::Builder::new()
            .name(format!("redo-log-{}", cfg.id))
            .spawn(move || log_writer(node, log, log_rx))
            .expect("spawn the log writer")
    });
    let stop = tutti_wire::CancellationToken::new();
    let acceptor = {
        let node = node.clone();
        let frame_bytes_max = cfg.frame_bytes_max;
        tokio::spawn(tutti_wire::serve_until(
            listener,
            frame_bytes_max,
            cfg.dialer.credentials().clone(),
            stop.clone(),
            move |id, req, replies| {
                let req = match &node.shipper {
                    Some(_) => match crate::primary::serve_join(&node, id, req, replies.clone()) {
                        Ok(()) => return,
                        Err(req) => req,
                    },
                    None => req,
                };
                node.step_request(|p, now| p.on_request(now, replies, id, req))
            },
        ))
    };
    match registered_epoch {
        // Registered before recovery, to learn its placement.
        Some(epoch) => {
            node.step(|p, _| p.set_epoch(epoch));
            tokio::spawn(crate::primary::ship(node.clone()));
        }
        None => {
            tokio::spawn(register(node.clone(), listen_addr.clone(), rebooted));
        }
    }
    if let Some(addr) = cfg.metrics.clone() {
        let node = node.clone();
        tokio::spawn(crate::metrics::serve(addr, move || {
            node.participant
                .lock()
                .expect("participant poisoned")
                .stats(node.now_ms())
        }));
    }
    let recovery = {
        let node = node.clone();
        tokio::spawn(async move {
            let (undecided, serving) = {
                let mut p = node.participant.lock().expect("participant poisoned");
                (p.undecided(), p.serve_undecided(node.now_ms()))
            };
            if serving {
                // Their bytes stay locked until stage 2 decides them.
                tracing::info!(undecided = undecided.len(), "recovery done; serving");
                serve(&node, space_flusher);
                recover_stage2(&node, promoted, undecided).await;
            } else {
                recover_stage2(&node, promoted, undecided).await;
                let now = node.now_ms();
                node.participant
                    .lock()
                    .expect("participant poisoned")
                    .finish_recovery(now);
                tracing::info!("recovery done; serving");
                serve(&node, space_flusher);
            }
        })
    };
    tracing::info!(id = cfg.id, addr = %listen_addr, mode = ?cfg.mode, "memory node listening");
    shutdown.await;
    // Clients hear which of their requests ran (the log writer still syncs meanwhile).
    stop.cancel();
    recovery.abort();
    let _ = acceptor.await;
    let _ = node.sync_log().await;
    drop(writer);
    tracing::info!("memory node stopped");
    stopped(&cfg)
}

/// `ram-repl`: checks that the data directory is on a RAM file system, and makes a process
/// started as a primary of a node that already has a placement a mirror: a copy that
/// started empty must not serve the node, it joins it.
async fn enter_volatile(cfg: &mut NodeConfig) -> Result<(), NodeError> {
    let data = (cfg.data.clone())
        .ok_or_else(|| NodeError::Config("ram-repl needs --data DIR on a tmpfs".into()))?;
    std::fs::create_dir_all(&data).map_err(io(format!("create {}", data.display())))?;
    if !on_ram(&data).map_err(io(format!("statfs {}", data.display())))? {
        return Err(NodeError::Config(format!(
            "ram-repl keeps the node's copy in RAM: --data {} must be on a tmpfs (such as \
             /dev/shm), not on a disk",
            data.display()
        )));
    }
    if cfg.role == Role::Mirror {
        return Ok(());
    }
    let why = "a ram-repl copy does not survive its process";
    start_as_mirror_if_the_node_exists(cfg, why).await?;
    Ok(())
}

/// A primary holding no copy of the node (`why`): if the node exists already (it has a
/// placement), the process starts as a mirror and joins. Returns whether it exists.
async fn start_as_mirror_if_the_node_exists(
    cfg: &mut NodeConfig,
    why: &str,
) -> Result<bool, NodeError> {
    let managers = Managers::parse(&cfg.manager, cfg.frame_bytes_max, cfg.dialer.clone())
        .map_err(NodeError::Config)?;
    let Some(p) = placement(&managers, cfg.id).await else {
        return Ok(false);
    };
    tracing::warn!(
        node = cfg.id,
        primary = %p.primary,
        "the node exists already, and {why}: this process starts as a mirror and joins"
    );
    cfg.role = Role::Mirror;
    cfg.mirror = None;
    Ok(true)
}

/// A `log-repl` primary whose data directory holds no copy of the node (new, or its disk
/// was lost): if the node exists already, it starts as a mirror and joins, as a `ram-repl`
/// copy does; if not, this is the cluster's creation, and it holds the (empty) node from
/// now on. Returns whether it is the creation.
async fn enter_without_copy(cfg: &mut NodeConfig) -> Result<bool, NodeError> {
    let data =
        (cfg.data.clone()).ok_or_else(|| NodeError::Config("log-repl needs --data DIR".into()))?;
    if holds_copy(&data) {
        return Ok(false);
    }
    let why = format!(
        "its data directory {} holds no copy of it (new, or its disk was lost)",
        data.display()
    );
    Ok(!start_as_mirror_if_the_node_exists(cfg, &why).await?)
}

/// Whether `dir` is on a file system held in memory (tmpfs, ramfs).
fn on_ram(dir: &std::path::Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statfs(2) writes into the zeroed struct we own, from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // ramfs(5)'s magic, which the libc crate does not name.
    const RAMFS_MAGIC: libc::__fsword_t = 0x8584_58f6;
    Ok(st.f_type == libc::TMPFS_MAGIC || st.f_type == RAMFS_MAGIC)
}

/// After a clean stop: a `ram-repl` process's copy goes with it (it frees the memory).
fn stopped(cfg: &NodeConfig) -> Result<(), NodeError> {
    match (&cfg.data, cfg.volatile) {
        (Some(data), true) => crate::mirror_node::empty_copy(data),
        _ => Ok(()),
    }
}

/// Node `node`'s placement as the managers' leader has it committed (none: the node is
/// not replicated, or not registered yet), asked until the managers answer.
pub(crate) async fn placement(managers: &Managers, node: NodeId) -> Option<tutti_wire::Placement> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        match managers
            .call(&Request::Placement { node }, Duration::from_secs(2))
            .await
        {
            Ok(Response::Placement(p)) => return p,
            Ok(other) => tracing::warn!("the manager answered Placement with {other:?}"),
            Err(e) => tracing::debug!("asking the manager for the placement: {e}"),
        }
        backoff.pause().await;
    }
}

/// The layout of a node's data directory (docs/storage.md). Format 1 had redo log segments
/// without a header and records in bincode.
const DATA_FORMAT: u32 = 2;

/// In a `log-repl` process's data directory: the directory may not hold a whole copy of the
/// node, because it started empty (new, or its disk was lost) or was emptied to join. Made
/// before anything else in a new directory, and removed once the copy is whole: seeded by a
/// join, or the node's first primary at the cluster's creation (docs/replication.md, "A
/// lost disk"). A copy marked so is never named, nor promoted, as one.
const EMPTY_MARKER: &str = "empty";

/// Whether a `log-repl` data directory holds a whole copy of its node.
pub(crate) fn holds_copy(data: &std::path::Path) -> bool {
    data.join("node.json").exists() && !data.join(EMPTY_MARKER).exists() && lost(data).is_none()
}

/// What a data directory that has its `node.json` lacks of its image and redo log, if
/// anything: both are made before `node.json` (and before the empty mark goes), so a
/// directory without them lost them since (files deleted, a damaged file system).
fn lost(data: &std::path::Path) -> Option<String> {
    let image = data.join(IMAGE_FILE);
    match std::fs::metadata(&image) {
        Ok(m) if m.len() > 0 => {}
        Ok(_) => return Some(format!("{} is empty", image.display())),
        Err(e) => return Some(format!("{}: {e}", image.display())),
    }
    let log = data.join(LOG_DIR);
    (!log.is_dir()).then(|| format!("{} is missing", log.display()))
}

/// Makes the image (`size_bytes`, sparse) and the redo log's directory of a new data
/// directory, durably, before its `node.json` is written.
fn make_image_and_log(data: &std::path::Path, size_bytes: u64) -> Result<(), NodeError> {
    let image = crate::space::image_file(&data.join(IMAGE_FILE), size_bytes)
        .map_err(io("create the image"))?;
    image.sync_all().map_err(io("sync the image"))?;
    std::fs::create_dir_all(data.join(LOG_DIR)).map_err(io("create the log directory"))?;
    Ok(crate::redo_log::sync_dir(data)?)
}

/// Marks `data` as not holding a whole copy (`EMPTY_MARKER`), durably.
pub(crate) fn mark_empty(data: &std::path::Path) -> Result<(), NodeError> {
    std::fs::File::create(data.join(EMPTY_MARKER)).map_err(io("create the empty marker"))?;
    Ok(crate::redo_log::sync_dir(data)?)
}

/// Marks `data` as holding a whole copy, durably.
pub(crate) fn mark_whole(data: &std::path::Path) -> Result<(), NodeError> {
    match std::fs::remove_file(data.join(EMPTY_MARKER)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("remove the empty marker")(e))
        }
        _ => {}
    }
    Ok(crate::redo_log::sync_dir(data)?)
}

/// Checks (or records, on first start) that the data directory belongs to this node. A new
/// directory of a `log-repl` process is marked empty first.
pub(crate) fn open_data_dir(
    data: &std::path::Path,
    cfg: &NodeConfig,
) -> Result<std::fs::File, NodeError> {
    std::fs::create_dir_all(data).map_err(io(format!("create {}", data.display())))?;
    let lock = std::fs::File::create(data.join("LOCK")).map_err(io("create LOCK"))?;
    lock.try_lock().map_err(|_| {
        NodeError::Config(format!(
            "{} is in use by another memory node",
            data.display()
        ))
    })?;
    let meta_path = data.join("node.json");
    let meta = data_dir_meta(cfg.id, cfg.size_bytes);
    match std::fs::read(&meta_path) {
        Ok(bytes) => {
            let found: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| NodeError::Config(format!("{}: {e}", meta_path.display())))?;
            if found["format"] != DATA_FORMAT {
                return Err(NodeError::Config(format!(
                    "{} holds data directory format {}, and this build reads format {DATA_FORMAT} \
                     (docs/storage.md); run the tutti version that wrote it",
                    data.display(),
                    found["format"]
                )));
            }
            if found != meta {
                return Err(NodeError::Config(format!(
                    "{} records {found} but this node was started as {meta}",
                    meta_path.display()
                )));
            }
            // A `ram-repl` copy is emptied at every start, and a marked one holds nothing.
            let lost = (!cfg.volatile && !data.join(EMPTY_MARKER).exists())
                .then(|| lost(data))
                .flatten();
            match lost {
                None => {}
                // It joins again, as after a lost disk (docs/replication.md).
                Some(what) if replicated(cfg) => {
                    tracing::warn!(
                        "{what}: this data directory no longer holds the node; it joins again"
                    );
                    mark_empty(data)?;
                }
                Some(what) => {
                    return Err(NodeError::Config(format!(
                        "{what}: the data directory {} lost part of node {}'s data; restore \
                         the node from a backup (tutti backup restore, docs/backup.md)",
                        data.display(),
                        cfg.id
                    )))
                }
            }
        }
        Err(_) => {
            if replicated(cfg) && !cfg.volatile {
                mark_empty(data)?;
            }
            if !cfg.volatile {
                make_image_and_log(data, cfg.size_bytes)?;
            }
            write_data_dir_meta(data, &meta)?
        }
    }
    Ok(lock)
}

/// Opens the redo log in `data`. A damaged one in a `log-repl` copy gives the copy up, as
/// a lost disk does (docs/replication.md, "A lost disk"): marked empty, the process exits,
/// and started again it joins the node's other copy, which holds every commit. Its files
/// stay until a join is offered.
pub(crate) fn open_log(
    data: &std::path::Path,
    cfg: &NodeConfig,
) -> Result<crate::redo_log::Recovered, NodeError> {
    match RedoLog::open(&data.join(LOG_DIR), cfg.log_segment_bytes) {
        Err(e @ (LogError::Corrupt { .. } | LogError::BadHeader { .. }))
            if replicated(cfg) && !cfg.volatile =>
        {
            tracing::error!(
                "{e}: this copy gives node {}'s data up and joins again",
                cfg.id
            );
            mark_empty(data)?;
            Err(e.into())
        }
        opened => Ok(opened?),
    }
}

/// Whether this process holds a copy of a replicated node (its primary, or a mirror).
fn replicated(cfg: &NodeConfig) -> bool {
    cfg.mirror.is_some() || cfg.role == Role::Mirror
}

/// The image file in a `log` node's data directory (docs/storage.md).
pub const IMAGE_FILE: &str = "image";

/// The redo log's directory in a data directory (docs/storage.md).
pub(crate) const LOG_DIR: &str = "log";

/// What `node.json` records of the node whose data directory it is.
fn data_dir_meta(id: NodeId, size_bytes: u64) -> serde_json::Value {
    serde_json::json!({ "id": id, "size_bytes": size_bytes, "format": DATA_FORMAT })
}

fn write_data_dir_meta(data: &std::path::Path, meta: &serde_json::Value) -> Result<(), NodeError> {
    let tmp = data.join("node.json.tmp");
    std::fs::write(&tmp, meta.to_string()).map_err(io("write node.json"))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io("sync node.json"))?;
    std::fs::rename(&tmp, data.join("node.json")).map_err(io("rename node.json"))?;
    Ok(crate::redo_log::sync_dir(data)?)
}

/// Makes `data` the data directory of `log` node `id` whose image is `image` (a file of
/// `size_bytes`, complete and synced) and whose redo log is empty: a node restored from a
/// backup. `data` must not exist yet; `image` is moved into it.
pub fn create_data_dir(
    data: &std::path::Path,
    id: NodeId,
    size_bytes: u64,
    image: &std::path::Path,
) -> Result<(), NodeError> {
    std::fs::create_dir(data).map_err(io(format!("create {}", data.display())))?;
    std::fs::rename(image, data.join(IMAGE_FILE)).map_err(io("move the image in"))?;
    std::fs::create_dir(data.join(LOG_DIR)).map_err(io("create the log directory"))?;
    crate::redo_log::sync_dir(data)?;
    write_data_dir_meta(data, &data_dir_meta(id, size_bytes))
}

/// How long lazy records (`Decided`) may wait for the next synced batch before they are
/// written on their own: a write of its own costs a device round trip with direct I/O.
const LAZY_HOLD: Duration = Duration::from_millis(20);
/// Held lazy records are written once they reach this many bytes.
const LAZY_HOLD_BYTES: usize = 1 << 20;

/// Group commit: everything queued while the previous fdatasync ran goes into one write
/// and one fdatasync; then the participant releases the replies that waited for it. A
/// round with only lazy records writes nothing: they ride with the next synced batch.
fn log_writer(node: Arc<Node>, mut log: RedoLog, rx: std::sync::mpsc::Receiver<LogCmd>) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut buf = Vec::with_capacity(1 << 20);
    let mut counters = LogCounters::default();
    // Records encoded in `buf` and not yet written; they start at `log.next_lsn()`.
    let mut count = 0;
    let mut held_since: Option<Instant> = None;
    loop {
        let first = match held_since {
            None => match rx.recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => break,
            },
            Some(since) => match rx.recv_timeout(LAZY_HOLD.saturating_sub(since.elapsed())) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        let (mut needs_sync, mut truncate, mut waiters) = (false, None, Vec::new());
        for cmd in first.into_iter().chain(rx.try_iter()) {
            match cmd {
                LogCmd::Append {
                    count: n,
                    bytes,
                    needs_sync: sync,
                } => {
                    needs_sync |= sync;
                    buf.extend_from_slice(&bytes);
                    count += n;
                }
                LogCmd::Truncate(lsn) => truncate = Some(lsn),
                LogCmd::Sync(tx) => {
                    needs_sync = true;
                    waiters.push(tx);
                }
            }
        }
        let held_long = held_since.is_some_and(|since| since.elapsed() >= LAZY_HOLD);
        if !needs_sync && truncate.is_none() && !held_long && buf.len() < LAZY_HOLD_BYTES {
            held_since = held_since.or((count > 0).then(Instant::now));
            continue;
        }
        held_since = None;
        let result = (|| -> Result<(), LogError> {
            // A synced round's write is timed with its sync: with direct I/O the write is a
            // device round trip of its own, and a stalled disk shows in either.
            let started = Instant::now();
            if count > 0 {
                log.append(log.next_lsn(), count, &buf)?;
            }
            if needs_sync {
                log.sync()?;
                counters.sync.record(started.elapsed().as_micros() as u64);
            }
            if let Some(lsn) = truncate {
                log.truncate_head(lsn)?;
                if let Some(shipper) = &node.shipper {
                    shipper.lock().expect("shipper poisoned").truncated(lsn);
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            // A log we cannot write must not vote: stop the process; restart recovers.
            tracing::error!("redo log failed: {e}; stopping the node");
            std::process::exit(70);
        }
        counters.records_appended += count;
        counters.bytes = log.bytes_total();
        counters.current_segment_first_lsn = log.current_segment_first_lsn();
        buf.clear();
        count = 0;
        if needs_sync {
            let mut upto = log.next_lsn() - 1;
            if let Some(shipper) = &node.shipper {
                // Durable once the mirror holds them too.
                let both = shipper
                    .lock()
                    .expect("shipper poisoned")
                    .on_local_synced(upto + 1);
                upto = both - 1;
            }
            node.writer_waiting.store(true, Ordering::Relaxed);
            node.step(|p, now| {
                node.writer_waiting.store(false, Ordering::Relaxed);
                p.set_log_counters(counters);
                p.on_synced(now, upto)
            });
        } else {
            node.participant
                .lock()
                .expect("participant poisoned")
                .set_log_counters(counters);
        }
        for w in waiters {
            let _ = w.send(());
        }
    }
    if count > 0 && log.append(log.next_lsn(), count, &buf).is_err() {
        tracing::warn!("redo log: lazy records not written at shutdown");
    }
}

/// Listens on `addr` again: a promoted mirror's, which it stopped listening on a moment
/// ago (the port is released as the mirror's acceptor task ends).
pub(crate) async fn rebind(addr: std::net::SocketAddr) -> Result<TcpListener, NodeError> {
    let mut tries = 0;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) if tries < 100 => {
                tracing::debug!("listening again on {addr}: {e}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(io(format!("listen again on {addr}"))(e)),
        }
    }
}

pub(crate) fn register_request(cfg: &NodeConfig, addr: &str, rebooted: bool) -> Request {
    Request::Register {
        node: cfg.id,
        addr: addr.to_string(),
        size_bytes: cfg.size_bytes,
        durable: cfg.mode == Mode::Log,
        rebooted,
        mirror: cfg.mirror.clone(),
    }
}

async fn register(node: Arc<Node>, addr: String, rebooted: bool) {
    let req = register_request(&node.cfg, &addr, rebooted);
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match node.managers.call(&req, RPC_TIMEOUT).await {
            Ok(Response::Registered { epoch, .. }) => {
                node.step(|p, _| p.set_epoch(epoch));
                return;
            }
            Ok(_) => tracing::warn!("manager sent an unexpected reply to Register"),
            Err(e) => tracing::warn!("registering with the manager: {e}"),
        }
        backoff.pause().await;
    }
}

/// Stage 4 of Fig. 8: heartbeats, checkpoints and the GC backstop.
fn serve(node: &Arc<Node>, flusher: Option<crate::space::Flusher>) {
    tokio::spawn(heartbeat_loop(node.clone()));
    if let Some(flusher) = flusher {
        tokio::spawn(checkpoint_loop(node.clone(), flusher));
    }
    tokio::spawn(collect_stale_reports(node.clone()));
}

/// Stage 2 of Fig. 8 with the §4.5 optimisations: learn each peer's all-log-tids, then ask
/// each (batched REQUEST-ABORTs) only about tids it does not hold. The peers are asked at
/// once, and each tid is resolved as soon as its own participants have answered: a peer
/// that is down keeps locked only the bytes of the tids it takes part in.
async fn recover_stage2(node: &Node, promoted: bool, undecided: Vec<(Tid, Vec<NodeId>)>) {
    if undecided.is_empty() {
        return;
    }
    tracing::info!(tids = undecided.len(), "stage 2: asking peers for outcomes");
    let (stage2, queries) = match promoted {
        true => Stage2::after_promotion(node.cfg.id, undecided),
        false => Stage2::start(node.cfg.id, undecided),
    };
    let stage2 = Mutex::new(stage2);
    let mut committed = resolve_decided(node, &stage2).await;
    let mut per_peer: std::collections::BTreeMap<NodeId, Vec<Request>> = Default::default();
    for (q, query) in queries {
        per_peer.entry(q).or_default().push(query);
    }
    let asking = per_peer.into_iter().map(|(q, queries)| {
        let stage2 = &stage2;
        async move {
            let mut committed = 0;
            for query in queries {
                let Response::LogTids(tids) = call_until_ok(node, q, &query).await else {
                    continue;
                };
                tracing::info!(
                    peer = q,
                    tids = tids.len(),
                    "stage 2: peer said which tids it holds"
                );
                let asks = lock_stage2(stage2).on_log_tids(q, tids);
                committed += resolve_decided(node, stage2).await;
                for (_, ask) in asks {
                    if let Response::Votes(votes) = call_until_ok(node, q, &ask).await {
                        tracing::info!(
                            peer = q,
                            votes = votes.len(),
                            "stage 2: peer's votes received"
                        );
                        lock_stage2(stage2).on_votes(q, &votes);
                        committed += resolve_decided(node, stage2).await;
                    }
                }
            }
            committed
        }
    });
    committed += futures::future::join_all(asking)
        .await
        .into_iter()
        .sum::<usize>();
    let stage2 = stage2.into_inner().expect("stage 2 poisoned");
    assert!(stage2.done(), "every peer answered");
    let tids = stage2.tids();
    tracing::info!(committed, aborted = tids - committed, "stage 2 done");
}

fn lock_stage2(stage2: &Mutex<Stage2>) -> std::sync::MutexGuard<'_, Stage2> {
    stage2.lock().expect("stage 2 poisoned")
}

/// Resolves the tids stage 2 decided since it last did (their bytes unlocked once served)
/// and tells their other participants; returns how many committed.
async fn resolve_decided(node: &Node, stage2: &Mutex<Stage2>) -> usize {
    let (outcomes, decisions) = lock_stage2(stage2).decided();
    if outcomes.is_empty() {
        return 0;
    }
    node.step(|p, now| p.resolve(now, &outcomes));
    for (q, decision) in decisions {
        if let Ok(conn) = node.peer(q).await {
            let _ = conn.send_one_way(&decision).await;
        }
    }
    outcomes.iter().filter(|o| o.1).count()
}

/// Calls a peer until it answers with something other than an error (Sinfonia blocks while
/// a participant is down; so does recovery).
async fn call_until_ok(node: &Node, q: NodeId, req: &Request) -> Response {
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let started = std::time::Instant::now();
    let mut failures = 0u32;
    loop {
        match node.call_peer(q, req).await {
            Ok(resp) => return resp,
            Err(e) => {
                failures += 1;
                // Recovery waits for its peers; say so when it has waited long.
                if failures.is_multiple_of(20) {
                    let waited = started.elapsed();
                    tracing::warn!(
                        peer = q,
                        ?waited,
                        failures,
                        "recovery still waiting for a peer: {e}"
                    );
                } else {
                    tracing::debug!("peer {q}: {e}");
                }
            }
        }
        backoff.pause().await;
    }
}

/// This process's resident set (`/proc/self/statm`), 0 where that cannot be read.
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// A replicated primary whose lease ran out and that has not heard from the manager for
/// this long stops: the manager replaces a primary silent for its fail-over timeout (500 ms
/// by default), and clients then find the new one only once this one's connections close.
const CUT_OFF_MS: u64 = 1_000;

async fn heartbeat_loop(node: Arc<Node>) {
    let manager_heard_ms = Arc::new(std::sync::atomic::AtomicU64::new(node.now_ms()));
    if node.shipper.is_some() {
        let (node, heard) = (node.clone(), manager_heard_ms.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = node.now_ms();
                let silent_ms = now.saturating_sub(heard.load(Ordering::Relaxed));
                if silent_ms >= CUT_OFF_MS && !node.with_shipper(|s| s.lease_valid(now)) {
                    node.replaced("cut off from its mirror and from the managers");
                }
            }
        });
    }
    loop {
        tokio::time::sleep(Duration::from_millis(node.cfg.heartbeat_interval_ms)).await;
        let sent_ms = node.now_ms();
        let mirror_behind_ms =
            (node.shipper.as_ref()).map_or(0, |_| node.with_shipper(|s| s.behind_ms(sent_ms)));
        let rss_bytes = resident_bytes();
        let report = {
            let mut p = node.participant.lock().expect("participant poisoned");
            p.set_rss_bytes(rss_bytes);
            p.heartbeat(sent_ms)
        };
        let req = Request::Heartbeat {
            node: node.cfg.id,
            uncertain: report.uncertain,
            applied: report.applied,
            applied_below: report.applied_below,
            mirror_behind_ms,
        };
        match node.managers.call(&req, RPC_TIMEOUT).await {
            Ok(Response::HeartbeatAck {
                epoch,
                incarnation,
                gc,
                applied_below,
                placement,
            }) => {
                manager_heard_ms.store(node.now_ms(), Ordering::Relaxed);
                if let (Some(placement), Some(_)) = (placement, &node.shipper) {
                    node.take_placement(placement);
                    crate::primary::confirm_alone(&node).await;
                    // Without a mirror now (and registered so), what waited for it is
                    // durable.
                    let durable_next = node.with_shipper(|s| s.durable_next());
                    node.durable(durable_next);
                    node.ship_wakeup.notify_one();
                }
                node.step(|p, _| {
                    p.on_heartbeat_ack(sent_ms, epoch, incarnation, &gc, &applied_below)
                });
                if node.shipper.is_some() {
                    crate::primary::name_joiner(&node).await;
                }
            }
            Ok(_) | Err(_) => {
                // Reports may be lost: treat the manager as new so they are sent again.
                node.step(|p, _| p.on_heartbeat_ack(sent_ms + 1, 0, u64::MAX, &[], &[]));
            }
        }
    }
}

/// Refuses what waited for a lock its `lock_wait_ms` when nothing else happens on the node
/// (every request and sync also does, `Participant::tick`).
async fn expire_lock_waits(node: Arc<Node>) {
    loop {
        let until = (node.participant.lock().expect("participant poisoned")).waiting_until();
        match until {
            None => node.lock_waits.notified().await,
            Some(at_ms) => {
                let wait_ms = at_ms.saturating_sub(node.now_ms());
                // A waiter with an earlier end may come meanwhile: look again then.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {
                        node.step(|p, now| p.tick(now));
                    }
                    _ = node.lock_waits.notified() => {}
                }
            }
        }
    }
}

/// Between two steps of a checkpoint (the timer rounds it up to its 1 ms tick).
const CHECKPOINT_STEP_PAUSE: Duration = Duration::from_micros(500);

async fn checkpoint_loop(node: Arc<Node>, flusher: crate::space::Flusher) {
    loop {
        tokio::time::sleep(Duration::from_millis(node.cfg.checkpoint_interval_ms)).await;
        let mut cp = node
            .participant
            .lock()
            .expect("participant poisoned")
            .checkpoint_begin();
        let flusher = flusher.clone();
        match tokio::task::spawn_blocking(move || flusher.flush()).await {
            Ok(Ok(())) => {}
            other => {
                tracing::error!("flushing the image failed: {other:?}; stopping the node");
                std::process::exit(70);
            }
        }
        if node.sync_log().await.is_err() {
            return;
        }
        // In steps, each holding the participant briefly: requests go on between them. A
        // pause, not just a yield, between steps: taken back to back, the steps of four
        // nodes checkpointing at once (all started together) took the machine's cores for
        // 50-80 ms, and a request's step holding the participant was preempted for 4-8 ms
        // (probe). Paced, a checkpoint takes ~150 ms of its 2 s interval.
        let mut finished = false;
        while !finished {
            node.step(|p, _| {
                let acts = p.checkpoint_step(&mut cp);
                finished = acts.is_some();
                acts.unwrap_or_default()
            });
            tokio::time::sleep(CHECKPOINT_STEP_PAUSE).await;
            while node.writer_waiting.load(Ordering::Relaxed) {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Every 2 s: tids reported applied 4 s ago or more but never collected are checked with
/// their peers directly; once every participant applied one, it is collected here too. The
/// relay collects a tid within a heartbeat or two, and its peers have applied it by their
/// next checkpoint (2 s); the ones the relay never will (their peers took the lsn path, or
/// the manager that had the reports is gone) wait here no longer than that.
async fn collect_stale_reports(node: Arc<Node>) {
    const AGE_MS: u64 = 4_000;
    loop {
        tokio::time::sleep(Duration::from_millis(AGE_MS / 2)).await;
        let stale = node
            .participant
            .lock()
            .expect("participant poisoned")
            .reported_older_than(node.now_ms(), AGE_MS);
        let mut by_peer: HashMap<NodeId, Vec<Tid>> = HashMap::new();
        for (tid, d) in &stale {
            for &q in d.iter().filter(|&&q| q != node.cfg.id) {
                by_peer.entry(q).or_default().push(*tid);
            }
        }
        let mut missing: HashSet<Tid> = HashSet::new();
        for (q, tids) in by_peer {
            for batch in tids.chunks(BATCH_TIDS_MAX) {
                let ask = Request::Applied {
                    tids: batch.to_vec(),
                };
                let applied: HashSet<Tid> = match node.call_peer(q, &ask).await {
                    Ok(Response::Applied(a)) => a.into_iter().collect(),
                    _ => HashSet::new(),
                };
                missing.extend(batch.iter().filter(|t| !applied.contains(t)));
            }
        }
        let done: Vec<Tid> = stale
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| !missing.contains(t))
            .collect();
        node.participant
            .lock()
            .expect("participant poisoned")
            .applied_by_peers(&done);
    }
}
