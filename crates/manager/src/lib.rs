//! The tutti management node: the directory of memory nodes (persisted), failure detection
//! by heartbeat, the recovery coordinator for minitransactions whose coordinator vanished
//! (Sinfonia Fig. 7), the relay of "applied" sets for log garbage collection (§4.6), and the
//! epoch clock. It holds no application data and is not on the minitransaction path.

mod raft_store;
mod recovery;
mod regions;
mod replica;
mod state;
mod store;

/// Deliberate protocol bugs that prove the simulator's checkers can fail. They exist only
/// with the `planted-bugs` feature; without it `planted` is always false.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bug {
    /// The leader replies at once, before the change the reply tells of is committed: a
    /// leader lost with it takes back what the group acknowledged.
    ReplyBeforeCommit,
    /// A silent primary is failed over to a mirror heard from only before that silence
    /// began (`ManagerState::fail_over`), which may have died since.
    TrustOldHeartbeats,
    /// A mirror silent towards the managers is dropped while its primary is heard from,
    /// although the primary does not report it behind: the primary may have died since it
    /// sent what was heard, and the mirror holds the only copy left.
    DropSilentMirror,
    /// A replaced `ram-repl` primary that kept its copy is named again although the copy
    /// that replaced it registered (and may have served since): what that one committed is
    /// lost.
    RenameRegisteredFormer,
}

tutti_wire::planted_bugs!(Bug);

pub use recovery::Recovery;
pub use replica::{Actions, Replica, ReplicaConfig};
pub use state::{ManagerState, Persisted, RecoveryBatch};

/// Writes `state` as the manager's state in `dir` (a new cluster's, restored from a backup),
/// as a manager started on `dir` then reads it.
pub fn write_state(dir: &std::path::Path, state: &Persisted) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    store::save(dir, state)
}

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tutti_wire::{serve, Connection, Connections, Dialer, NodeId, Replies, Request, Response};

/// The Raft clock's tick: a follower stands after 10 to 20 ticks without a leader, and the
/// leader sends heartbeats every 2.
const TICK_MS: u64 = 50;
const ELECTION_TICKS: usize = 10;
const HEARTBEAT_TICKS: usize = 2;

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub listen: String,
    pub data: PathBuf,
    /// Every manager of the group, in the same order at each of them (a group of one by
    /// default: this manager).
    pub peers: Vec<String>,
    /// This manager's place in `peers`, from 1.
    pub id: u64,
    pub epoch_period_ms: u64,
    pub failure_timeout_ms: u64,
    /// A replicated node's primary silent this long is replaced by its mirror; a mirror
    /// its primary reports failing it this long is dropped.
    pub failover_timeout_ms: u64,
    pub frame_bytes_max: usize,
    /// How it reaches the memory nodes and the other managers (routes through a proxy
    /// under `tutti chaos`).
    pub dialer: Dialer,
}

impl ManagerConfig {
    pub fn new(listen: String, data: PathBuf) -> Self {
        ManagerConfig {
            peers: vec![listen.clone()],
            id: 1,
            listen,
            data,
            epoch_period_ms: 3_600_000,
            failure_timeout_ms: 3_000,
            failover_timeout_ms: 500,
            frame_bytes_max: tutti_wire::FRAME_BYTES_MAX_DEFAULT,
            dialer: Dialer::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("manager state {path} is unreadable: {reason}")]
    State { path: PathBuf, reason: String },
}

struct Manager {
    cfg: ManagerConfig,
    replica: Mutex<Replica<Replies>>,
    conns: Connections,
    /// A queue per other manager, by Raft id (the own one unused), for Raft messages in order.
    peers: Vec<mpsc::UnboundedSender<Vec<u8>>>,
    /// The origin of the state machine's clock.
    started: Instant,
}

impl Manager {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// Runs the manager until `shutdown` resolves. Prints nothing; logs through `tracing`.
pub async fn run(
    cfg: ManagerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ManagerError> {
    let stored = store::load_raft(&cfg.data)?;
    // At a group's first start, its state begins as `manager.json` (a restored cluster's,
    // or a manager's from before Raft) or fresh.
    let initial = match stored {
        Some(_) => Persisted::fresh(),
        None => store::load(&cfg.data)?,
    };
    let replica_cfg = ReplicaConfig {
        id: cfg.id,
        peers: cfg.peers.clone(),
        failure_timeout_ms: cfg.failure_timeout_ms,
        failover_timeout_ms: cfg.failover_timeout_ms,
        election_ticks: ELECTION_TICKS,
        heartbeat_ticks: HEARTBEAT_TICKS,
        fixed_election: false,
    };
    let replica = Replica::open(replica_cfg, stored.as_deref(), &initial).map_err(|reason| {
        ManagerError::State {
            path: store::raft_path(&cfg.data),
            reason,
        }
    })?;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .map_err(|source| ManagerError::Io {
            what: format!("listen on {}", cfg.listen),
            source,
        })?;
    let listening = listener.local_addr().map_err(|source| ManagerError::Io {
        what: "local address".into(),
        source,
    })?;
    tutti_wire::require_credentials_beyond_loopback(listening, cfg.dialer.credentials())
        .map_err(ManagerError::Config)?;
    tracing::info!(addr = %cfg.listen, id = cfg.id, managers = cfg.peers.len(), "manager listening");
    let conns = Connections::new(
        cfg.frame_bytes_max,
        Duration::from_secs(1),
        cfg.dialer.clone(),
    );
    let mut peers = Vec::new();
    let mut senders = Vec::new();
    for addr in &cfg.peers {
        let (tx, rx) = mpsc::unbounded_channel();
        peers.push(tx);
        senders.push(tokio::spawn(send_to_peer(
            addr.clone(),
            cfg.frame_bytes_max,
            cfg.dialer.clone(),
            rx,
        )));
    }
    let manager = Arc::new(Manager {
        cfg,
        replica: Mutex::new(replica),
        conns,
        peers,
        started: Instant::now(),
    });
    let acceptor = {
        let (manager, frame_bytes_max) = (manager.clone(), manager.cfg.frame_bytes_max);
        let credentials = manager.cfg.dialer.credentials().clone();
        tokio::spawn(serve(
            listener,
            frame_bytes_max,
            credentials,
            move |id, req, replies| {
                let now_ms = manager.now_ms();
                step(&manager, |r| r.on_request(now_ms, replies, id, req));
            },
        ))
    };
    let clock = tokio::spawn(raft_clock(manager.clone()));
    let epochs = tokio::spawn(epoch_clock(manager.clone()));
    shutdown.await;
    acceptor.abort();
    clock.abort();
    epochs.abort();
    for sender in senders {
        sender.abort();
    }
    Ok(())
}

/// Runs `f` on the replica and carries out its actions: the Raft state is on disk before
/// any message or reply that depends on it leaves. A manager that cannot write its state
/// stops (another one of the group takes over, or `tutti up` restarts it).
fn step(manager: &Arc<Manager>, f: impl FnOnce(&mut Replica<Replies>) -> Actions<Replies>) {
    let acts = {
        let mut replica = manager.replica.lock().expect("manager replica poisoned");
        let acts = f(&mut replica);
        if let Some(bytes) = &acts.persist {
            if let Err(e) = store::save_raft(&manager.cfg.data, bytes) {
                tracing::error!("writing the manager's Raft state: {e}; stopping");
                std::process::exit(70);
            }
        }
        acts
    };
    for (to, bytes) in acts.messages {
        if let Some(queue) = manager.peers.get(to as usize - 1) {
            let _ = queue.send(bytes);
        }
    }
    for (replies, id, resp) in acts.replies {
        if id != tutti_wire::ONE_WAY {
            let _ = replies.send((id, resp));
        }
    }
    for batch in acts.recoveries {
        tokio::spawn(recover(manager.clone(), batch));
    }
}

/// Forwards Raft messages to the manager at `addr`, in order, over one connection. Raft
/// resends what is lost, so messages queued while the peer cannot be reached are dropped.
async fn send_to_peer(
    addr: String,
    frame_bytes_max: usize,
    dialer: Dialer,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut conn: Option<Connection> = None;
    while let Some(bytes) = queue.recv().await {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            let connect = Connection::connect(&addr, frame_bytes_max, &dialer);
            conn = tokio::time::timeout(Duration::from_millis(500), connect)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let sent = match &conn {
            Some(c) => c.send_one_way(&Request::Raft(bytes)).await.is_ok(),
            None => false,
        };
        if !sent {
            conn = None;
            while queue.try_recv().is_ok() {}
        }
    }
}

async fn raft_clock(manager: Arc<Manager>) {
    let mut ticks = tokio::time::interval(Duration::from_millis(TICK_MS));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now_ms = manager.now_ms();
        step(&manager, |r| r.tick(now_ms));
    }
}

async fn epoch_clock(manager: Arc<Manager>) {
    loop {
        tokio::time::sleep(Duration::from_millis(manager.cfg.epoch_period_ms)).await;
        let now_ms = manager.now_ms();
        // Proposed through the group: no heartbeat acknowledgement names the epoch before
        // it is committed.
        step(&manager, |r| r.advance_epoch(now_ms));
    }
}

/// The recovery coordinator of Fig. 7 for a batch of tids: one REQUEST-ABORT per node, then
/// DECISION (commit iff every participant holds a commit vote) to every participant.
/// Drives a `Recovery` over TCP. A node that cannot be reached ends the attempt without a
/// decision; the participants report the tids again and a later attempt retries.
async fn recover(manager: Arc<Manager>, batch: RecoveryBatch) {
    let (mut recovery, requests) = Recovery::start(batch);
    let mut decisions = None;
    for (q, req) in requests {
        match call(&manager, q, &req).await {
            Ok(Response::Votes(votes)) => decisions = recovery.on_votes(q, &votes),
            other => {
                tracing::warn!(
                    node = q,
                    "recovery: no votes ({:?}); retried at the next report",
                    other.err()
                );
                break;
            }
        }
    }
    if let Some(decisions) = decisions {
        for (q, decision) in decisions {
            if let Ok(conn) = connection(&manager, q).await {
                let _ = conn.send_one_way(&decision).await;
            }
        }
        for (tid, commit) in recovery.outcomes() {
            tracing::info!(%tid, commit, "recovered a minitransaction");
        }
    }
    manager
        .replica
        .lock()
        .expect("manager replica poisoned")
        .recovery_done(recovery.batch());
}

async fn connection(manager: &Manager, q: NodeId) -> Result<Arc<Connection>, tutti_wire::RpcError> {
    if let Some(c) = manager.conns.cached(q) {
        return Ok(c);
    }
    let addr = manager
        .replica
        .lock()
        .expect("manager replica poisoned")
        .latest()
        .addr(q)
        .ok_or_else(|| tutti_wire::RpcError::Connect {
            addr: format!("node {q}"),
            reason: "not registered".into(),
        })?;
    manager.conns.get(q, &addr).await
}

async fn call(
    manager: &Manager,
    q: NodeId,
    req: &Request,
) -> Result<Response, tutti_wire::RpcError> {
    let conn = connection(manager, q).await?;
    tokio::time::timeout(Duration::from_secs(5), conn.call(req))
        .await
        .unwrap_or_else(|_| {
            Err(tutti_wire::RpcError::Closed {
                addr: conn.addr().to_string(),
            })
        })
}
