//! The tutti management node: the directory of memory nodes (persisted), failure detection
//! by heartbeat, the recovery coordinator for minitransactions whose coordinator vanished
//! (Sinfonia Fig. 7), the relay of "applied" sets for log garbage collection (§4.6), and the
//! epoch clock. It holds no application data and is not on the minitransaction path.

mod recovery;
mod regions;
mod state;
mod store;

pub use recovery::Recovery;
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
use tutti_wire::{serve, Connection, Connections, Dialer, NodeId, Request, Response};

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub listen: String,
    pub data: PathBuf,
    pub epoch_period_ms: u64,
    pub failure_timeout_ms: u64,
    pub frame_bytes_max: usize,
    /// How it reaches the memory nodes (routes through a proxy under `tutti chaos`).
    pub dialer: Dialer,
}

impl ManagerConfig {
    pub fn new(listen: String, data: PathBuf) -> Self {
        ManagerConfig {
            listen,
            data,
            epoch_period_ms: 3_600_000,
            failure_timeout_ms: 3_000,
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
    state: Mutex<ManagerState>,
    conns: Connections,
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
    let persisted = store::load(&cfg.data)?;
    store::save(&cfg.data, &persisted).map_err(|source| ManagerError::Io {
        what: "write manager.json".into(),
        source,
    })?;
    // Differs at each start: nodes learn from it that GC reports held here are gone.
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let state = ManagerState::new(persisted, incarnation);
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
    tracing::info!(addr = %cfg.listen, epoch = state.epoch(), "manager listening");
    let conns = Connections::new(
        cfg.frame_bytes_max,
        Duration::from_secs(1),
        cfg.dialer.clone(),
    );
    let manager = Arc::new(Manager {
        cfg,
        state: Mutex::new(state),
        conns,
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
                let resp = handle(&manager, req);
                if id != tutti_wire::ONE_WAY {
                    let _ = replies.send((id, resp));
                }
            },
        ))
    };
    let epochs = tokio::spawn(epoch_clock(manager.clone()));
    shutdown.await;
    acceptor.abort();
    epochs.abort();
    Ok(())
}

fn handle(manager: &Arc<Manager>, req: Request) -> Response {
    let now_ms = manager.now_ms();
    let mut state = manager.state.lock().expect("manager state poisoned");
    match req {
        Request::Register {
            node,
            addr,
            size_bytes,
            durable,
            rebooted,
        } => {
            let (resp, written) = state.register(now_ms, node, addr, size_bytes, durable, rebooted);
            save_then(manager, written, resp)
        }
        Request::Directory => {
            Response::Directory(state.directory(now_ms, manager.cfg.failure_timeout_ms))
        }
        Request::Heartbeat {
            node,
            uncertain,
            applied,
            applied_below,
        } => {
            let (resp, batch) = state.heartbeat(now_ms, node, uncertain, applied, applied_below);
            if let Some(batch) = batch {
                tokio::spawn(recover(manager.clone(), batch));
            }
            resp
        }
        other => match state.region_request(other) {
            Some((resp, written)) => save_then(manager, written, resp),
            None => Response::Error {
                code: tutti_wire::ErrorCode::Unsupported,
                message: "the manager serves Register, Directory, Heartbeat, regions and the sequencer's address".into(),
            },
        },
    }
}

/// `resp`, once `written` (if any) is on disk; an error instead if it cannot be.
fn save_then(manager: &Manager, written: Option<Persisted>, resp: Response) -> Response {
    match written.map(|p| store::save(&manager.cfg.data, &p)) {
        Some(Err(e)) => Response::Error {
            code: tutti_wire::ErrorCode::NotReady,
            message: format!("persisting: {e}"),
        },
        _ => resp,
    }
}

async fn epoch_clock(manager: Arc<Manager>) {
    loop {
        tokio::time::sleep(Duration::from_millis(manager.cfg.epoch_period_ms)).await;
        // Saved under the lock: no heartbeat acknowledgement names the epoch before it is.
        let mut state = manager.state.lock().expect("manager state poisoned");
        let persisted = state.advance_epoch();
        if let Err(e) = store::save(&manager.cfg.data, &persisted) {
            tracing::error!("persisting the epoch: {e}");
        }
        tracing::info!(epoch = state.epoch(), "epoch advanced");
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
        .state
        .lock()
        .expect("manager state poisoned")
        .recovery_done(recovery.batch());
}

async fn connection(manager: &Manager, q: NodeId) -> Result<Arc<Connection>, tutti_wire::RpcError> {
    if let Some(c) = manager.conns.cached(q) {
        return Ok(c);
    }
    let addr = manager
        .state
        .lock()
        .expect("manager state poisoned")
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
