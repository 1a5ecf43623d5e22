//! The mirror's tokio driver (`tutti memnode --mode log-repl --role mirror`): serves its
//! primary's `Replicate` and `ReplicaTail`, writes and syncs the records (one sync per
//! round, on a thread of its own), flushes its image and truncates its log behind the
//! primary, heartbeats the manager, and once the manager names it primary, waits out the
//! old primary's lease and hands over to the ordinary node driver on the same data
//! directory. All decisions are the `Mirror`'s.

use crate::mirror::{Mirror, Replicate};
use crate::node::{io, open_data_dir, NodeConfig, NodeError, IMAGE_FILE};
use crate::redo_log::{Lsn, RedoLog};
use crate::space::Space;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tutti_wire::{ErrorCode, Managers, Replies, Request, Response};

/// How often a mirror tells the manager it is alive (the manager drops a mirror silent for
/// its fail-over timeout, 1 s by default).
const MIRROR_HEARTBEAT: Duration = Duration::from_millis(100);

/// How the mirror's time as a mirror ended.
pub(crate) enum Ended {
    /// The manager named it primary, and the old primary's lease has run out.
    Promoted,
    /// Shut down.
    Stopped,
}

enum MirrorCmd {
    Append(Lsn, u64, Vec<u8>),
    Truncate(Lsn),
    /// Sync what came before and stop (promoted, or shutting down).
    Stop,
}

struct MirrorNode {
    cfg: NodeConfig,
    mirror: Mutex<Mirror<Replies>>,
    log: std::sync::mpsc::Sender<MirrorCmd>,
    start: Instant,
}

impl MirrorNode {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn on_request(&self, id: u64, req: Request, reply_to: Replies) {
        if let Some((_, msg)) = Replicate::of(&req).filter(|(node, _)| *node == self.cfg.id) {
            let replies = {
                let mut m = self.mirror.lock().expect("mirror poisoned");
                let acts = m.on_replicate(self.now_ms(), reply_to, id, msg);
                if let Some((first, count, bytes)) = acts.append {
                    // Under the lock: records reach the writer in lsn order.
                    let _ = self.log.send(MirrorCmd::Append(first, count, bytes));
                }
                acts.replies
            };
            for (to, id, resp) in replies {
                let _ = to.send((id, resp));
            }
            return;
        }
        let resp = match req {
            Request::ReplicaTail {
                node,
                session,
                config_epoch,
                from,
            } if node == self.cfg.id => {
                let replies = self.mirror.lock().expect("mirror poisoned").on_tail(
                    reply_to,
                    id,
                    session,
                    config_epoch,
                    from,
                );
                for (to, id, resp) in replies {
                    let _ = to.send((id, resp));
                }
                return;
            }
            _ => Response::Error {
                code: ErrorCode::NotReady,
                message: format!(
                    "this is node {}'s mirror: it serves its primary only",
                    self.cfg.id
                ),
            },
        };
        if id != tutti_wire::ONE_WAY {
            let _ = reply_to.send((id, resp));
        }
    }
}

/// Runs node `cfg.id`'s mirror on `listener` until the manager promotes it or `shutdown`
/// resolves.
pub(crate) async fn run(
    cfg: &NodeConfig,
    listener: TcpListener,
    managers: Managers,
    shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Ended, NodeError> {
    let addr = listener
        .local_addr()
        .map_err(io("local address"))?
        .to_string();
    let data = cfg
        .data
        .clone()
        .ok_or_else(|| NodeError::Config("a mirror needs --data DIR".into()))?;
    let lock = open_data_dir(&data, cfg)?;
    let space =
        Space::image(&data.join(IMAGE_FILE), cfg.size_bytes).map_err(io("open the image"))?;
    let flusher = space.flusher();
    let recovered = RedoLog::open(&data.join("log"), cfg.log_segment_bytes)?;
    let next = recovered.log.next_lsn();
    tracing::info!(
        records = recovered.records.len(),
        next,
        "mirror: read the redo log"
    );
    let start = Instant::now();
    let mirror = Mirror::new(cfg.id, space, next, recovered.records, 0);
    let (log_tx, log_rx) = std::sync::mpsc::channel();
    let node = Arc::new(MirrorNode {
        cfg: cfg.clone(),
        mirror: Mutex::new(mirror),
        log: log_tx,
        start,
    });
    let writer = {
        let node = node.clone();
        let log = recovered.log;
        std::thread::Builder::new()
            .name(format!("mirror-log-{}", cfg.id))
            .spawn(move || mirror_writer(node, log, log_rx))
            .expect("spawn the mirror's log writer")
    };
    let acceptor = {
        let node = node.clone();
        tokio::spawn(tutti_wire::serve(
            listener,
            cfg.frame_bytes_max,
            cfg.dialer.credentials().clone(),
            move |id, req, replies| node.on_request(id, req, replies),
        ))
    };
    let checkpoints = tokio::spawn(checkpoint_loop(node.clone(), flusher));
    tracing::info!(id = cfg.id, %addr, "mirror listening");
    let ended = tokio::select! {
        promoted = heartbeat_until_promoted(&node, &managers, &addr) => promoted.map(|()| Ended::Promoted),
        () = shutdown => Ok(Ended::Stopped),
    };
    acceptor.abort();
    checkpoints.abort();
    // Connections already open keep their handler, and a promoted mirror refuses every
    // record from now on: nothing follows the stop.
    let _ = node.log.send(MirrorCmd::Stop);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    drop(lock);
    ended
}

/// Heartbeats the manager until its placement names this mirror primary; then waits out
/// the old primary's lease (no acknowledgement leaves from the promotion on).
async fn heartbeat_until_promoted(
    node: &MirrorNode,
    managers: &Managers,
    addr: &str,
) -> Result<(), NodeError> {
    loop {
        tokio::time::sleep(MIRROR_HEARTBEAT).await;
        let next_lsn = node.mirror.lock().expect("mirror poisoned").synced_next();
        let req = Request::MirrorHeartbeat {
            node: node.cfg.id,
            addr: addr.to_string(),
            next_lsn,
        };
        let placement = match managers.call(&req, Duration::from_secs(2)).await {
            Ok(Response::Placement(p)) => p,
            Ok(other) => {
                tracing::warn!("manager answered a mirror heartbeat with {other:?}");
                continue;
            }
            Err(e) => {
                tracing::debug!("mirror heartbeat: {e}");
                continue;
            }
        };
        let Some(p) = placement else { continue };
        if p.primary == addr {
            node.mirror
                .lock()
                .expect("mirror poisoned")
                .promote(p.config_epoch);
            tracing::warn!(
                node = node.cfg.id,
                config_epoch = p.config_epoch,
                "named primary: waiting out the old primary's lease"
            );
            while !node
                .mirror
                .lock()
                .expect("mirror poisoned")
                .may_take_over(node.now_ms())
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            return Ok(());
        }
        if p.mirror.as_deref() != Some(addr) {
            return Err(NodeError::Config(format!(
                "node {}'s placement (configuration epoch {}) no longer names this mirror: \
                 its primary is {} and its mirror {:?}",
                node.cfg.id, p.config_epoch, p.primary, p.mirror
            )));
        }
        node.mirror
            .lock()
            .expect("mirror poisoned")
            .set_config_epoch(p.config_epoch);
    }
}

/// Appends and syncs what the mirror hands over, a round at a time, then lets the mirror
/// apply and acknowledge it; truncates the log head as told.
fn mirror_writer(
    node: Arc<MirrorNode>,
    mut log: RedoLog,
    rx: std::sync::mpsc::Receiver<MirrorCmd>,
) {
    let mut stop = false;
    while !stop {
        let Ok(first) = rx.recv() else { break };
        let mut truncate = None;
        let result = (|| {
            for cmd in std::iter::once(first).chain(rx.try_iter()) {
                match cmd {
                    MirrorCmd::Append(lsn, count, bytes) => {
                        debug_assert_eq!(lsn, log.next_lsn());
                        log.append(lsn, count, &bytes)?;
                    }
                    MirrorCmd::Truncate(lsn) => truncate = Some(lsn),
                    MirrorCmd::Stop => stop = true,
                }
            }
            log.sync()?;
            if let Some(lsn) = truncate {
                log.truncate_head(lsn)?;
            }
            Ok::<(), crate::redo_log::LogError>(())
        })();
        if let Err(e) = result {
            // A mirror that cannot write must not acknowledge: stop; the manager drops it.
            tracing::error!("mirror's redo log failed: {e}; stopping");
            std::process::exit(70);
        }
        let replies = node
            .mirror
            .lock()
            .expect("mirror poisoned")
            .on_synced(node.now_ms(), log.next_lsn());
        for (to, id, resp) in replies {
            let _ = to.send((id, resp));
        }
    }
}

/// Every checkpoint interval: flushes the image, then truncates the log below what both
/// the image and the primary's truncation allow.
async fn checkpoint_loop(node: Arc<MirrorNode>, flusher: crate::space::Flusher) {
    loop {
        tokio::time::sleep(Duration::from_millis(node.cfg.checkpoint_interval_ms)).await;
        let below = node
            .mirror
            .lock()
            .expect("mirror poisoned")
            .truncation_point();
        let flusher = flusher.clone();
        match tokio::task::spawn_blocking(move || flusher.flush()).await {
            Ok(Ok(())) => {}
            other => {
                tracing::error!("flushing the mirror's image failed: {other:?}; stopping");
                std::process::exit(70);
            }
        }
        if below > 0 {
            let _ = node.log.send(MirrorCmd::Truncate(below));
        }
    }
}
