//! A replicated primary's I/O (`log-repl`, docs/replication.md): registering before
//! recovery to learn its placement, adopting the records only its mirror holds, the task
//! that ships records to the mirror and lets the participant count them durable once both
//! disks hold them, and the seed a joining mirror reads. The decisions are the `Shipper`'s.

use crate::log_record::{LogRecord, Lsn};
use crate::mirror::{decode_records, encode_records};
use crate::node::{Node, NodeError};
use crate::redo_log::{read_synced, RedoLog};
use crate::shipper::Shipped;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tutti_wire::{
    Backoff, Connection, ErrorCode, Managers, NodeId, Placement, Replies, Request, Response,
    RpcError, SEED_READ_BYTES_MAX,
};

/// How often a primary with nothing to ship renews its lease.
const LEASE_RENEWAL: Duration = Duration::from_millis(100);

/// How long a call to the mirror may take before the connection is dropped and made again.
const MIRROR_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a replicated primary learns before its recovery.
pub(crate) struct Registered {
    pub epoch: u64,
    pub placement: Placement,
}

/// Registers with the manager until it answers; a refusal as a replaced primary ends the
/// node (`NodeError::Replaced`).
pub(crate) async fn register(managers: &Managers, req: &Request) -> Result<Registered, NodeError> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match managers.call(req, Duration::from_secs(5)).await {
            Ok(Response::Registered {
                epoch,
                placement: Some(placement),
                ..
            }) => return Ok(Registered { epoch, placement }),
            Ok(Response::Registered { .. }) => {
                return Err(NodeError::Config(
                    "the manager holds this node as unreplicated: start it without --mirror".into(),
                ))
            }
            Err(RpcError::Remote {
                code: ErrorCode::StaleConfig,
                message,
                ..
            }) => return Err(NodeError::Replaced(message)),
            Err(RpcError::Remote { code, message, .. }) => {
                return Err(NodeError::Config(format!(
                    "the manager refused the registration ({code:?}): {message}"
                )))
            }
            Ok(other) => tracing::warn!("manager answered Register with {other:?}"),
            Err(e) => tracing::warn!("registering with the manager: {e}"),
        }
        backoff.pause().await;
    }
}

/// Before stage 1: the records the mirror holds past this primary's log (synced there,
/// never acknowledged here) are appended to the log, and the records this log holds past
/// the mirror's are sent to it, so that both copies hold the same records before recovery
/// answers anyone. Returns the placement as it ended up (the manager drops a mirror that
/// does not answer, once told: records only it holds were never acknowledged) and whether
/// the mirror lacks records this log no longer holds.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn adopt_mirror_tail(
    node_id: NodeId,
    session: u64,
    managers: &Managers,
    register_req: &Request,
    mut registered: Registered,
    dialer: &tutti_wire::Dialer,
    frame_bytes_max: usize,
    log: &mut RedoLog,
    records: &mut Vec<(Lsn, LogRecord)>,
) -> Result<(Registered, bool), NodeError> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let asking_since = std::time::Instant::now();
    loop {
        let Some(mirror) = registered.placement.mirror.clone() else {
            return Ok((registered, false));
        };
        let from = log.next_lsn();
        let ask = Request::ReplicaTail {
            node: node_id,
            session,
            config_epoch: registered.placement.config_epoch,
            from,
        };
        let conn = match connect(&mirror, frame_bytes_max, dialer).await {
            Ok(conn) => Some(conn),
            Err(e) => {
                tracing::warn!(%mirror, "connecting to the mirror: {e}");
                None
            }
        };
        let answer = match &conn {
            Some(conn) => conn.call_within(&ask, MIRROR_CALL_TIMEOUT).await,
            None => Err(RpcError::Closed {
                addr: mirror.clone(),
            }),
        };
        match answer {
            Ok(Response::ReplicaTail {
                first_lsn,
                count,
                records: bytes,
            }) if first_lsn == from => {
                if count > 0 {
                    log.append(from, count, &bytes)?;
                    log.sync()?;
                    records.extend(decode_records(&bytes).0);
                    tracing::info!(from, count, "adopted the records only the mirror held");
                }
                return Ok((registered, false));
            }
            Ok(Response::ReplicaTail { first_lsn, .. }) => {
                // The mirror holds less: what it lacks goes to it now, if still here.
                let lacking: Vec<_> = (records.iter())
                    .filter(|(lsn, _)| *lsn >= first_lsn)
                    .cloned()
                    .collect();
                if lacking.first().is_none_or(|(lsn, _)| *lsn != first_lsn) {
                    tracing::error!(
                        mirror_next = first_lsn,
                        "the mirror lacks records this log no longer holds"
                    );
                    return Ok((registered, true));
                }
                let send = Request::Replicate {
                    node: node_id,
                    session,
                    config_epoch: registered.placement.config_epoch,
                    first_lsn,
                    count: lacking.len() as u64,
                    records: encode_records(&lacking),
                    truncate_below: 0,
                    primary_synced: from,
                };
                let conn = conn.as_ref().expect("it answered");
                match conn.call_within(&send, MIRROR_CALL_TIMEOUT).await {
                    Ok(Response::Replicated { next_lsn }) if next_lsn >= from => {
                        tracing::info!(
                            from = first_lsn,
                            to = from,
                            "sent the mirror what it lacked"
                        );
                        return Ok((registered, false));
                    }
                    Err(RpcError::Remote {
                        code: ErrorCode::StaleConfig,
                        message,
                        ..
                    }) => return Err(NodeError::Replaced(message)),
                    other => tracing::warn!("sending the mirror what it lacked: {other:?}"),
                }
            }
            Err(RpcError::Remote {
                code: ErrorCode::StaleConfig,
                message,
                ..
            }) => return Err(NodeError::Replaced(message)),
            Ok(other) => tracing::warn!("mirror answered ReplicaTail with {other:?}"),
            Err(e) => tracing::warn!(%mirror, "asking the mirror for its tail: {e}"),
        }
        backoff.pause().await;
        // The manager drops a mirror only on its primary's report (`Shipper::behind_ms`):
        // report this one unanswering, as a serving primary's heartbeat would, and ask
        // for the placement again.
        let behind_ms = asking_since.elapsed().as_millis() as u64;
        let report = crate::shipper::mirror_unanswering(node_id, behind_ms);
        if let Err(e) = managers.call(&report, Duration::from_secs(5)).await {
            tracing::warn!("reporting the mirror unanswering: {e}");
        }
        registered = register(managers, register_req).await?;
    }
}

/// Ships the records handed to the shipper to the mirror, in order and pipelined, over
/// one connection made again after any failure; on each acknowledgement, lets the
/// participant count what both disks hold durable and releases the replies its lease held.
pub(crate) async fn ship(node: Arc<Node>) {
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    loop {
        let target = node.with_shipper(|s| s.shipping_to().map(|(t, g)| (t.to_string(), g)));
        let Some((mirror, generation)) = target else {
            // Unreplicated for now: wait for a mirror to join.
            node.ship_wakeup.notified().await;
            continue;
        };
        // Unreachable counts as unanswered: the manager hears of a mirror it cannot connect to.
        let now = node.now_ms();
        node.with_shipper(|s| s.sending(now));
        let conn = match connect(&mirror, node.cfg.frame_bytes_max, &node.cfg.dialer).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%mirror, "connecting to the mirror: {e}");
                backoff.pause().await;
                continue;
            }
        };
        node.with_shipper(|s| s.reconnected());
        if let Err(e) = ship_on(&node, &conn, &mirror, generation).await {
            tracing::debug!(%mirror, "shipping to the mirror: {e}");
            backoff.pause().await;
        }
    }
}

async fn connect(
    addr: &str,
    frame_bytes_max: usize,
    dialer: &tutti_wire::Dialer,
) -> Result<Connection, RpcError> {
    match tokio::time::timeout(
        MIRROR_CALL_TIMEOUT,
        Connection::connect(addr, frame_bytes_max, dialer),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(RpcError::Timeout {
            addr: addr.to_string(),
            ms: MIRROR_CALL_TIMEOUT.as_millis() as u64,
        }),
    }
}

/// Ships over `conn` until it fails or another mirror is the target.
async fn ship_on(
    node: &Arc<Node>,
    conn: &Connection,
    mirror: &str,
    generation: u64,
) -> Result<(), RpcError> {
    let mut in_flight = VecDeque::new();
    let mut renewal = tokio::time::interval(LEASE_RENEWAL);
    renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if node.with_shipper(|s| s.shipping_to() != Some((mirror, generation))) {
            return Ok(());
        }
        let heartbeat = tokio::select! {
            biased;
            reply = async {
                let (_, pending): &mut (u64, std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>) =
                    in_flight.front_mut().expect("awaited only when some are in flight");
                tokio::time::timeout(MIRROR_CALL_TIMEOUT, pending.as_mut()).await
            }, if !in_flight.is_empty() => {
                let (sent_ms, _) = in_flight.pop_front().expect("front");
                let reply = reply.map_err(|_| RpcError::Timeout {
                    addr: mirror.to_string(),
                    ms: MIRROR_CALL_TIMEOUT.as_millis() as u64,
                })?;
                let reply = match reply {
                    Ok(resp) => Ok(resp),
                    Err(RpcError::Remote { code, message, .. }) => Err((code, message)),
                    Err(e) => return Err(e),
                };
                let shipped = node.with_shipper(|s| s.on_reply(sent_ms, reply));
                match shipped {
                    Shipped::Acknowledged { durable_next } => node.durable(durable_next),
                    Shipped::Resend(requests) => {
                        for req in requests {
                            in_flight.push_back((node.now_ms(), Box::pin(conn.send_call(&req).await?)));
                        }
                    }
                    Shipped::MirrorBehind { mirror_next } => {
                        tracing::error!(mirror_next, "the mirror lacks records this log no longer holds; \
                            the manager drops it once this primary reports it behind");
                    }
                    Shipped::Stale(message) => {
                        refresh_placement(node).await;
                        // Everything unacknowledged goes again, under the new placement.
                        return Err(RpcError::Remote {
                            addr: mirror.to_string(),
                            code: ErrorCode::StaleConfig,
                            message,
                        });
                    }
                    Shipped::Nothing => {}
                }
                false
            }
            () = node.ship_wakeup.notified() => false,
            _ = renewal.tick() => true,
        };
        let now = node.now_ms();
        let requests = node.with_shipper(|s| s.to_send(now, heartbeat && in_flight.is_empty()));
        for req in requests {
            let sent_ms = node.now_ms();
            let pending: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
                Box::pin(conn.send_call(&req).await?);
            in_flight.push_back((sent_ms, pending));
        }
    }
}

/// What a mirror joining this primary reads (`Request::ReadSeed`): the records below the
/// join's first shipped one still in the log, read from disk at the join, then the image,
/// read from memory as asked. The image is fuzzy; the records from the log's head on,
/// replayed over it in order, make it exact (each record's writes are whole values).
pub(crate) struct Seed {
    join: u64,
    records: Arc<Vec<u8>>,
}

/// Answers `JoinMirror` and `ReadSeed`; hands back any other request.
pub(crate) fn serve_join(
    node: &Arc<Node>,
    id: u64,
    req: Request,
    reply_to: Replies,
) -> Result<(), Request> {
    match req {
        Request::JoinMirror { node: n, addr } if n == node.cfg.id => {
            let node = node.clone();
            tokio::spawn(async move {
                let resp = offer(&node, &addr).await.unwrap_or_else(|message| {
                    tracing::warn!(%addr, "a mirror asked to join: {message}");
                    Response::Error {
                        code: ErrorCode::NotReady,
                        message,
                    }
                });
                let _ = reply_to.send((id, resp));
            });
            Ok(())
        }
        Request::ReadSeed {
            node: n,
            join,
            offset,
            len,
        } if n == node.cfg.id => {
            let _ = reply_to.send((id, read_seed(node, join, offset, len)));
            Ok(())
        }
        other => Err(other),
    }
}

/// Starts shipping to the mirror at `addr` and makes its seed.
async fn offer(node: &Arc<Node>, addr: &str) -> Result<Response, String> {
    let terms = node.with_shipper(|s| s.join(node.now_ms(), addr))?;
    node.ship_wakeup.notify_one();
    // Every record below `next_lsn` was handed to the writer before the join: once this
    // sync is done they are all on disk.
    node.sync_log()
        .await
        .map_err(|()| "the redo log writer stopped".to_string())?;
    let data = (node.cfg.data.clone()).ok_or("a replicated primary has a data directory")?;
    let below = terms.next_lsn;
    let records =
        tokio::task::spawn_blocking(move || read_synced(&data.join(crate::node::LOG_DIR), below))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("reading the redo log for the seed: {e}"))?;
    let first_lsn = records.first().map_or(below, |(lsn, _)| *lsn);
    let records = encode_records(&records);
    let records_bytes = records.len() as u64;
    *node.seed.lock().expect("seed poisoned") = Some(Seed {
        join: terms.join,
        records: Arc::new(records),
    });
    tracing::info!(
        %addr,
        join = terms.join,
        first_lsn,
        next_lsn = below,
        records_bytes,
        "a mirror joins: its seed is ready"
    );
    Ok(Response::JoinOffer {
        join: terms.join,
        config_epoch: terms.config_epoch,
        session: terms.session,
        first_lsn,
        next_lsn: below,
        records_bytes,
        image_bytes: node.cfg.size_bytes,
    })
}

fn read_seed(node: &Node, join: u64, offset: u64, len: u64) -> Response {
    let gone = || Response::Error {
        code: ErrorCode::NotFound,
        message: format!("join {join} was given up: ask to join again"),
    };
    if !node.with_shipper(|s| s.joiner_heard(node.now_ms(), join)) {
        return gone();
    }
    let records = match &*node.seed.lock().expect("seed poisoned") {
        Some(seed) if seed.join == join => seed.records.clone(),
        _ => return gone(),
    };
    let len = len.min(SEED_READ_BYTES_MAX);
    crate::mirror::seed_part(&records, node.cfg.size_bytes, offset, len, |from, len| {
        node.read_image(from, len)
    })
}

/// Asks the manager for this node's placement and takes it (a placement naming another
/// primary ends the process).
async fn refresh_placement(node: &Arc<Node>) {
    let ask = Request::Placement { node: node.cfg.id };
    match node.managers.call(&ask, Duration::from_secs(5)).await {
        Ok(Response::Placement(Some(placement))) => {
            node.take_placement(placement);
            node.durable(node.with_shipper(|s| s.durable_next()));
        }
        other => tracing::warn!("asking the manager for the placement: {other:?}"),
    }
}

/// The placement dropped this primary's mirror: it registers under that placement before
/// it counts anything durable on its own disk alone, after which the managers no longer
/// name the dropped copy in its place (`Shipper::confirming_alone`). One try per heartbeat;
/// refused, another copy serves the node, and this one stops.
pub(crate) async fn confirm_alone(node: &Node) {
    if !node.with_shipper(|s| s.confirming_alone()) {
        return;
    }
    let addr = node.with_shipper(|s| s.placement().primary.clone());
    let req = crate::node::register_request(&node.cfg, &addr, false);
    match node.managers.call(&req, Duration::from_secs(5)).await {
        Ok(Response::Registered {
            placement: Some(placement),
            ..
        }) => {
            node.take_placement(placement.clone());
            node.with_shipper(|s| s.confirm_alone(&placement));
            tracing::warn!(
                config_epoch = placement.config_epoch,
                "registered without the mirror: serving alone"
            );
        }
        Err(RpcError::Remote {
            code: ErrorCode::StaleConfig,
            message,
            ..
        }) => node.replaced(&message),
        other => tracing::warn!("registering without the mirror: {other:?}"),
    }
}

/// A joining mirror that holds everything this primary counted durable is named the
/// node's mirror by the manager; one silent too long before that is given up.
pub(crate) async fn name_joiner(node: &Arc<Node>) {
    let now = node.now_ms();
    let ask = node.with_shipper(|s| {
        s.give_up_silent_joiner(now);
        s.joiner_to_name()
            .map(|(config_epoch, mirror)| Request::AddMirror {
                node: node.cfg.id,
                config_epoch,
                primary: s.placement().primary.clone(),
                mirror: mirror.to_string(),
            })
    });
    let Some(ask) = ask else { return };
    match node.managers.call(&ask, Duration::from_secs(5)).await {
        Ok(Response::Placement(Some(placement))) => {
            tracing::info!(?placement, "the joining mirror is the node's mirror now");
            node.take_placement(placement);
            *node.seed.lock().expect("seed poisoned") = None;
            node.ship_wakeup.notify_one();
        }
        // The heartbeat brings the placement that moved on.
        other => tracing::warn!("naming the joining mirror: {other:?}"),
    }
}
