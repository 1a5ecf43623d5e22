//! The sequencer server (`tutti sequencer`): records its address with the manager, then
//! serves `Sequence` requests for every log of the cluster, one task per log, each the tokio
//! driver of that log's `LogService` (takeover on first use, then grants within durable
//! reservations).

use crate::client::run;
use crate::service::{Effect, FrameId, LogService};
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tutti_client::{Cluster, Minitx, Outcome};
use tutti_wire::{Ask, Backoff, ErrorCode, Replies, Request, Response, RpcError};

/// Frames queued for one log while it is taken over, at most; past that the connection
/// waits.
const FRAMES_QUEUED_MAX: usize = 1024;
/// How long a takeover step may take from the last frame before the frames waiting for it
/// are answered with an error; the next frame starts another takeover.
const TAKEOVER_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// Where clients reach this sequencer: recorded with the manager.
    pub addr: String,
    /// Positions per durable reservation (`LEASE_DEFAULT`).
    pub lease: u64,
}

/// One `Sequence` request, waiting for its log's task.
struct Frame {
    id: u64,
    replies: Replies,
    min_epoch: u64,
    asks: Vec<Ask>,
}

/// Records this sequencer with the manager and serves every log's requests on `listener`
/// until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cluster: Cluster,
    opts: ServiceOptions,
    shutdown: impl Future<Output = ()>,
) {
    let set = Request::SetSequencer {
        addr: opts.addr.clone(),
    };
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    while let Err(e) = cluster.ask_manager(&set).await {
        tracing::warn!("recording this sequencer with the manager: {e}; retrying");
        backoff.pause().await;
    }
    tracing::info!(addr = %opts.addr, "sequencer serving");
    let logs: Arc<Mutex<FxHashMap<String, mpsc::Sender<Frame>>>> = Arc::default();
    let frame_bytes_max = cluster.options().frame_bytes_max;
    // The sequencer asks its clients for what it proves to the memory nodes.
    let credentials = cluster.options().dialer.credentials().clone();
    let handle = move |id: u64, req: Request, replies: Replies| {
        let Request::Sequence {
            log,
            min_epoch,
            asks,
        } = req
        else {
            let _ = replies.send((
                id,
                Response::Error {
                    code: ErrorCode::Unsupported,
                    message: "a sequencer serves Sequence requests only".into(),
                },
            ));
            return;
        };
        let frame = Frame {
            id,
            replies,
            min_epoch,
            asks,
        };
        let mut logs = logs.lock().expect("logs poisoned");
        let task = logs.entry(log.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(FRAMES_QUEUED_MAX);
            tokio::spawn(serve_log(cluster.clone(), opts.clone(), log, rx));
            tx
        });
        if let Err(mpsc::error::TrySendError::Full(frame)) = task.try_send(frame) {
            let task = task.clone();
            tokio::spawn(async move { task.send(frame).await });
        }
    };
    tokio::select! {
        _ = tutti_wire::serve(listener, frame_bytes_max, credentials, handle) => {}
        _ = shutdown => {}
    }
}

/// One log's task: the driver of its `LogService`. Takeover steps and manager requests are
/// awaited in turn (frames queue meanwhile); a reservation runs beside the frames.
async fn serve_log(
    cluster: Cluster,
    opts: ServiceOptions,
    name: String,
    mut frames: mpsc::Receiver<Frame>,
) {
    let mut service = LogService::new(name.clone(), opts.addr.clone(), opts.lease);
    let mut replies: FxHashMap<FrameId, (u64, Replies)> = FxHashMap::default();
    let mut reserving: Option<Reserving> = None;
    let mut takeover_until = Instant::now();
    loop {
        let effects = tokio::select! {
            frame = frames.recv() => {
                let Some(frame) = frame else { return };
                let (number, effects) = service.on_frame(frame.min_epoch, frame.asks);
                replies.insert(number, (frame.id, frame.replies));
                takeover_until = Instant::now() + TAKEOVER_DEADLINE;
                effects
            }
            (epoch, to, outcome) = async { reserving.as_mut().expect("guarded").await }, if reserving.is_some() => {
                reserving = None;
                if !outcome.committed {
                    tracing::warn!(log = %name, epoch, "sealed by a successor");
                }
                service.on_reserved(epoch, to, &outcome)
            }
        };
        let mut effects = std::collections::VecDeque::from(effects);
        while let Some(effect) = effects.pop_front() {
            let more = match effect {
                Effect::AskManager(req) => {
                    let reply = cluster.ask_manager(&req).await.map_err(|e| match e {
                        RpcError::Remote { code, message, .. } => (code, message),
                        e => (ErrorCode::NotReady, e.to_string()),
                    });
                    service.on_manager(reply)
                }
                Effect::Run(tx) => {
                    let outcome = run(&cluster, &tx, takeover_until).await;
                    let more = service.on_outcome(outcome.map_err(|e| e.to_string()));
                    if let Some(epoch) = service.epoch() {
                        tracing::info!(log = %name, epoch, "took the log over");
                    }
                    more
                }
                Effect::Reserve { tx, epoch, to } => {
                    reserving = Some(Box::pin(reserve(cluster.clone(), tx, epoch, to)));
                    vec![]
                }
                Effect::Answer(frame, answers) => {
                    if let Some((id, r)) = replies.remove(&frame) {
                        let _ = r.send((id, Response::Sequenced(answers)));
                    }
                    vec![]
                }
                Effect::Refuse(frame, code, message) => {
                    tracing::warn!(log = %name, "refused: {message}");
                    if let Some((id, r)) = replies.remove(&frame) {
                        let _ = r.send((id, Response::Error { code, message }));
                    }
                    vec![]
                }
            };
            effects.extend(more);
        }
    }
}

/// The reservation in flight: its epoch and end, and its outcome.
type Reserving = std::pin::Pin<Box<dyn Future<Output = (u64, u64, Outcome)> + Send>>;

/// Runs a reservation until it has an outcome: retried while the nodes do not answer (the
/// minitransaction may run twice).
async fn reserve(cluster: Cluster, tx: Minitx, epoch: u64, to: u64) -> (u64, u64, Outcome) {
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
    loop {
        let until = Instant::now() + Duration::from_secs(10);
        match run(&cluster, &tx, until).await {
            Ok(outcome) => return (epoch, to, outcome),
            Err(e) => {
                tracing::warn!(epoch, to, "reservation: {e}; retrying");
                backoff.pause().await;
            }
        }
    }
}
