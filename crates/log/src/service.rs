//! The sequencer service (`tutti sequencer`): the tokio driver of `Sequencer`. It records its
//! address with the manager, then serves `Sequence` requests for every log of the cluster,
//! one task per log. A log is taken over on the first request for it (and again when a
//! client shows it a later epoch): take the epoch from the manager, seal, find the tail and
//! the streams' last positions (`Takeover`), then grant positions within reservations it
//! makes durable on the log's memory nodes.

use crate::client::{run, REGION_KIND};
use crate::error::LogError;
use crate::layout::LogLayout;
use crate::minitxs;
use crate::sequencer::{Reservation, Sequencer};
use crate::takeover::{Step, TakenOver, Takeover, TakeoverError};
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tutti_client::Cluster;
use tutti_wire::{Answer, Ask, Backoff, ErrorCode, Replies, Request, Response};

/// Frames queued for one log while it is taken over, at most; past that the connection
/// waits.
const FRAMES_QUEUED_MAX: usize = 1024;
/// How long one takeover (seal, slow check, backward scan) may take before the frames
/// waiting for it are answered with an error; the next frame starts another.
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
) -> Result<(), LogError> {
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
        _ = tutti_wire::serve(listener, frame_bytes_max, handle) => {}
        _ = shutdown => {}
    }
    Ok(())
}

/// A log's sequencer in its epoch.
struct Serving {
    layout: LogLayout,
    seq: Sequencer<(u64, u32)>,
    epoch: u64,
}

/// The reservation in flight: its end, and whether it became durable.
type Reserving = std::pin::Pin<Box<dyn Future<Output = (u64, bool)> + Send>>;

/// A frame waiting for some of its answers (grants wait for a reservation).
struct Unanswered {
    id: u64,
    replies: Replies,
    answers: Vec<Option<Answer>>,
    left: usize,
}

/// One log's task: takes the log over when needed, feeds its frames to the sequencer and
/// makes its reservations durable, one at a time.
async fn serve_log(
    cluster: Cluster,
    opts: ServiceOptions,
    name: String,
    mut frames: mpsc::Receiver<Frame>,
) {
    let mut serving: Option<Serving> = None;
    let mut unanswered: FxHashMap<u64, Unanswered> = FxHashMap::default();
    let mut next_frame: u64 = 0;
    let mut reserving: Option<Reserving> = None;
    loop {
        let acts = tokio::select! {
            frame = frames.recv() => {
                let Some(frame) = frame else { return };
                if serving.as_ref().is_none_or(|s| s.epoch < frame.min_epoch) {
                    reserving = None;
                    let sealed = serving.take().map(|mut s| s.seq.on_sealed());
                    if let Some(acts) = sealed {
                        answer(&mut unanswered, acts.answers);
                    }
                    match take_over(&cluster, &opts, &name).await {
                        Ok((s, r)) => {
                            tracing::info!(log = %name, epoch = s.epoch, from = r.from, "took the log over");
                            reserving = Some(Box::pin(reserve(cluster.clone(), s.layout.clone(), r)));
                            serving = Some(s);
                        }
                        Err((code, message)) => {
                            tracing::warn!(log = %name, "taking the log over: {message}");
                            let _ = frame.replies.send((frame.id, Response::Error { code, message }));
                            continue;
                        }
                    }
                }
                let s = serving.as_mut().expect("taken over");
                let number = next_frame;
                next_frame += 1;
                unanswered.insert(number, Unanswered {
                    id: frame.id,
                    replies: frame.replies,
                    answers: vec![None; frame.asks.len()],
                    left: frame.asks.len(),
                });
                s.seq.on_asks(frame.asks.into_iter().enumerate().map(|(i, a)| ((number, i as u32), a)))
            }
            (to, durable) = async { reserving.as_mut().expect("guarded").await }, if reserving.is_some() => {
                reserving = None;
                let s = serving.as_mut().expect("a reservation belongs to a serving sequencer");
                if durable {
                    s.seq.on_reserved(to)
                } else {
                    tracing::warn!(log = %name, epoch = s.epoch, "sealed by a successor");
                    s.seq.on_sealed()
                }
            }
        };
        if let (Some(r), Some(s)) = (acts.reserve, serving.as_ref()) {
            reserving = Some(Box::pin(reserve(cluster.clone(), s.layout.clone(), r)));
        }
        answer(&mut unanswered, acts.answers);
    }
}

fn answer(unanswered: &mut FxHashMap<u64, Unanswered>, answers: Vec<((u64, u32), Answer)>) {
    for ((number, i), a) in answers {
        let Some(u) = unanswered.get_mut(&number) else {
            continue;
        };
        u.answers[i as usize] = Some(a);
        u.left -= 1;
        if u.left == 0 {
            let u = unanswered.remove(&number).expect("present");
            let answers = u
                .answers
                .into_iter()
                .map(|a| a.expect("answered"))
                .collect();
            let _ = u.replies.send((u.id, Response::Sequenced(answers)));
        }
    }
}

/// Makes `r` durable: its end and true once it is, false if the log's epoch moved on.
/// Retries while the nodes do not answer: the minitransaction may run twice.
async fn reserve(cluster: Cluster, layout: LogLayout, r: Reservation) -> (u64, bool) {
    let tx = minitxs::reserve(&layout, &r);
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
    loop {
        let until = Instant::now() + Duration::from_secs(10);
        match run(&cluster, &tx, until).await {
            Ok(outcome) => return (r.to, outcome.committed),
            Err(e) => {
                tracing::warn!(epoch = r.epoch, to = r.to, "reservation: {e}; retrying");
                backoff.pause().await;
            }
        }
    }
}

/// Takes `name` over: checks that this is still the cluster's sequencer, takes the next
/// epoch from the manager, seals and scans. Errors are the code and message to answer with.
async fn take_over(
    cluster: &Cluster,
    opts: &ServiceOptions,
    name: &str,
) -> Result<(Serving, Reservation), (ErrorCode, String)> {
    let until = Instant::now() + TAKEOVER_DEADLINE;
    let manager = |e: tutti_wire::RpcError| (ErrorCode::NotReady, e.to_string());
    loop {
        match cluster
            .ask_manager(&Request::Sequencer)
            .await
            .map_err(manager)?
        {
            Response::Sequencer(Some(addr)) if addr == opts.addr => {}
            other => {
                return Err((
                    ErrorCode::Conflict,
                    format!(
                        "this sequencer ({}) was replaced: the manager names {other:?}",
                        opts.addr
                    ),
                ))
            }
        }
        let region = match cluster
            .ask_manager(&Request::Region { name: name.into() })
            .await
        {
            Ok(Response::Region(r)) if r.kind == REGION_KIND => r,
            Ok(Response::Region(r)) => {
                return Err((
                    ErrorCode::BadRequest,
                    format!("region {name:?} is a {}, not a log", r.kind),
                ))
            }
            Ok(other) => {
                return Err((
                    ErrorCode::NotReady,
                    format!("the manager answered {other:?}"),
                ))
            }
            Err(tutti_wire::RpcError::Remote { code, message, .. }) => return Err((code, message)),
            Err(e) => return Err(manager(e)),
        };
        let layout = LogLayout::from_region(region.nodes.clone(), &region.params)
            .map_err(|e| (ErrorCode::BadRequest, e.to_string()))?;
        let take = Request::TakeRegion {
            name: name.into(),
            expect: region.epoch,
            holder: opts.addr.clone(),
        };
        let epoch = match cluster.ask_manager(&take).await.map_err(manager)? {
            Response::Region(r)
                if r.epoch == region.epoch + 1 && r.holder.as_deref() == Some(&opts.addr) =>
            {
                r.epoch
            }
            // Another taker got this epoch: start again from the region as it is now.
            Response::Region(_) => continue,
            other => {
                return Err((
                    ErrorCode::NotReady,
                    format!("the manager answered {other:?}"),
                ))
            }
        };
        match seal_and_scan(cluster, &layout, epoch, until).await {
            Ok(t) => {
                let (seq, r) =
                    Sequencer::start(t.epoch, t.tail, layout.backpointers, opts.lease, t.history);
                return Ok((Serving { layout, seq, epoch }, r));
            }
            Err(Ok(TakeoverError::Superseded(_))) => continue,
            Err(Ok(e)) => return Err((ErrorCode::BadRequest, e.to_string())),
            Err(Err(e)) => return Err((ErrorCode::NotReady, e.to_string())),
        }
    }
}

/// Runs a takeover at `epoch`, writing the log's headers first if its creator died before
/// it could (a region whose magic is still zero).
async fn seal_and_scan(
    cluster: &Cluster,
    layout: &LogLayout,
    epoch: u64,
    until: Instant,
) -> Result<TakenOver, Result<TakeoverError, LogError>> {
    loop {
        let (mut takeover, tx) = Takeover::start(layout, epoch);
        let mut step = Step::Run(tx);
        let result = loop {
            match step {
                Step::Run(tx) => {
                    let outcome = run(cluster, &tx, until).await.map_err(Err)?;
                    match takeover.on_outcome(&outcome) {
                        Ok(next) => step = next,
                        Err(e) => break Err(e),
                    }
                }
                Step::Done(t) => break Ok(t),
            }
        };
        match result {
            Err(TakeoverError::NotALog(0)) => {
                run(cluster, &minitxs::create(layout), until)
                    .await
                    .map_err(Err)?;
            }
            other => return other.map_err(Ok),
        }
    }
}
