//! A replicated primary's I/O (`log-repl`, docs/replication.md): registering before
//! recovery to learn its placement, adopting the records only its mirror holds, and the
//! task that ships records to the mirror and lets the participant count them durable once
//! both disks hold them. The decisions are the `Shipper`'s.

use crate::log_record::{decode_record, LogRecord, Lsn};
use crate::mirror::encode_records;
use crate::node::{Node, NodeError};
use crate::redo_log::RedoLog;
use crate::shipper::Shipped;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tutti_wire::{
    Backoff, Connection, ErrorCode, Managers, NodeId, Placement, Request, Response, RpcError,
};

/// Exit status of a primary that learnt it was replaced: `tutti up` does not start it
/// again as that node's primary.
pub const EXIT_REPLACED: i32 = 75;

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
/// does not answer) and whether the mirror lacks records this log no longer holds.
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
                    let mut at = 0;
                    while let Some((lsn, record, used)) = decode_record(&bytes[at..]) {
                        records.push((lsn, record));
                        at += used;
                    }
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
        // The manager drops a mirror silent for its fail-over timeout: ask again.
        registered = register(managers, register_req).await?;
    }
}

/// Ships the records handed to the shipper to the mirror, in order and pipelined, over
/// one connection made again after any failure; on each acknowledgement, lets the
/// participant count what both disks hold durable and releases the replies its lease held.
pub(crate) async fn ship(node: Arc<Node>) {
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    loop {
        let Some(mirror) = node.with_shipper(|s| s.mirror().map(str::to_string)) else {
            // Unreplicated for now: wait for a placement with a mirror (none comes back
            // today: a lost mirror is not replaced).
            node.ship_wakeup.notified().await;
            continue;
        };
        let conn = match connect(&mirror, node.cfg.frame_bytes_max, &node.cfg.dialer).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%mirror, "connecting to the mirror: {e}");
                backoff.pause().await;
                continue;
            }
        };
        node.with_shipper(|s| s.reconnected());
        if let Err(e) = ship_on(&node, &conn, &mirror).await {
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

/// Ships over `conn` until it fails or the placement changes.
async fn ship_on(node: &Arc<Node>, conn: &Connection, mirror: &str) -> Result<(), RpcError> {
    let mut in_flight = VecDeque::new();
    let mut renewal = tokio::time::interval(LEASE_RENEWAL);
    renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if node.with_shipper(|s| s.mirror() != Some(mirror)) {
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
                    Shipped::Replaced(message) => node.replaced(&message),
                    Shipped::Nothing => {}
                }
                false
            }
            () = node.ship_wakeup.notified() => false,
            _ = renewal.tick() => true,
        };
        let requests = node.with_shipper(|s| s.to_send(heartbeat && in_flight.is_empty()));
        for req in requests {
            let sent_ms = node.now_ms();
            let pending: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
                Box::pin(conn.send_call(&req).await?);
            in_flight.push_back((sent_ms, pending));
        }
    }
}
