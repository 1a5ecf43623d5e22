//! The log's client API (Tango §2, §5): `Log` appends, reads, fills, checks and trims by
//! running the sans-I/O steps of `append`, `read` and `stream` against the cluster and the
//! sequencer; `Stream` reads one stream in log order. Asks to the sequencer from concurrent
//! callers leave in batches, one frame each, and so do their writes to each memory node,
//! one minitransaction each (`batch`). Every call gives up at its deadline.

use crate::append::{Append, AppendStep};
use crate::batch::{Batch, Batcher};
use crate::entry::StreamId;
use crate::error::LogError;
use crate::layout::{LogLayout, BACKPOINTERS_DEFAULT, SLOT_BYTES_DEFAULT};
use crate::minitxs::{self, SlotWrite, Words, Written};
use crate::own::{Own, OwnEntries};
use crate::read::{Found, Hole, ReadAt, ReadStep, HOLE_TIMEOUT_DEFAULT};
use crate::stream::{Sync, SyncStep};
use crate::takeover::{SlowCheck, Step};
use crate::{planted, Bug};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::{timeout_at, Instant};
use tutti_client::{Cluster, ExecError, Minitx, Outcome};
use tutti_wire::{
    Answer, Ask, Backoff, Connection, ErrorCode, RegionInfo, Request, Response, RpcError,
};

/// The region kind the manager records for a log.
pub const REGION_KIND: &str = "log";
/// Asks in one frame to the sequencer, at most.
pub const ASKS_PER_FRAME_MAX: usize = 1024;
/// Frames to the sequencer in flight per log handle: while they are out, asks gather into
/// the next one.
const FRAMES_IN_FLIGHT: usize = 2;

#[derive(Clone, Debug)]
pub struct LogOptions {
    /// How long one call may take, retries included.
    pub deadline: Duration,
    /// How long a reader waits for the writer of an unwritten position below the tail
    /// before it fills the position with junk.
    pub hole_timeout: Duration,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            deadline: Duration::from_secs(10),
            hole_timeout: HOLE_TIMEOUT_DEFAULT,
        }
    }
}

/// A new log's shape (`Log::create`).
#[derive(Clone, Debug)]
pub struct LogShape {
    pub nodes: Vec<tutti_wire::NodeId>,
    pub slot_bytes: u32,
    /// Bytes per node, the region's header included.
    pub capacity_bytes: u64,
    pub backpointers: u8,
}

impl LogShape {
    /// 4 KiB slots and 4 backpointers over `nodes`, `capacity_bytes` each.
    pub fn new(nodes: Vec<tutti_wire::NodeId>, capacity_bytes: u64) -> LogShape {
        LogShape {
            nodes,
            slot_bytes: SLOT_BYTES_DEFAULT,
            capacity_bytes,
            backpointers: BACKPOINTERS_DEFAULT,
        }
    }
}

/// The fast check's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    /// The next position to be handed out.
    pub tail: u64,
    pub epoch: u64,
}

/// A log's state as its memory nodes hold it (`Log::stat`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub layout: LogLayout,
    /// The words of every node, in layout order.
    pub words: Vec<Words>,
    pub tail: Tail,
}

/// What a caller waits on for one ask.
struct Pending {
    ask: Ask,
    min_epoch: u64,
    reply: oneshot::Sender<Result<Answer, String>>,
}

/// A handle on one log. Clone it freely: clones share the batcher of asks.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: Cluster,
    name: String,
    layout: LogLayout,
    opts: LogOptions,
    asks: mpsc::Sender<Pending>,
    writes: Mutex<Batcher<oneshot::Sender<WriteResult>>>,
    own: Mutex<OwnEntries<oneshot::Sender<()>>>,
}

/// What one append's write became.
#[derive(Clone, Debug)]
enum WriteResult {
    Written(Written),
    /// Its batch has no outcome, for this reason: the entry may or may not be there.
    Unknown(String),
    /// Its batch was refused as a whole, for this reason, which no retry mends.
    Failed(String),
}

fn remote(e: RpcError) -> LogError {
    LogError::Cluster(e.to_string())
}

impl Log {
    /// Allocates the log's regions from the manager and writes their headers; creating a
    /// log again with the same shape opens it.
    pub async fn create(
        cluster: &Cluster,
        name: &str,
        shape: &LogShape,
        opts: LogOptions,
    ) -> Result<Log, LogError> {
        let slots_per_node = LogLayout::slots_for(
            &shape.nodes,
            shape.slot_bytes,
            shape.capacity_bytes,
            shape.backpointers,
        )?;
        let mut layout = LogLayout {
            nodes: vec![],
            slot_bytes: shape.slot_bytes,
            slots_per_node,
            backpointers: shape.backpointers,
        };
        let create = Request::CreateRegion {
            name: name.into(),
            kind: REGION_KIND.into(),
            nodes: shape.nodes.clone(),
            bytes_per_node: layout.region_bytes(),
            params: layout.layout_word(),
        };
        let region = match cluster.ask_manager(&create).await {
            Ok(Response::Region(r)) => r,
            Ok(other) => return Err(LogError::Cluster(format!("the manager answered {other:?}"))),
            Err(RpcError::Remote {
                code: ErrorCode::Conflict,
                ..
            }) => return Err(LogError::Exists(name.into())),
            Err(e) => return Err(remote(e)),
        };
        layout.nodes = region.nodes;
        let until = Instant::now() + opts.deadline;
        // Refused when the headers are there already: by an earlier try of this create.
        run(cluster, &minitxs::create(&layout), until).await?;
        Log::open(cluster, name, opts).await
    }

    /// Opens the log called `name`.
    pub async fn open(cluster: &Cluster, name: &str, opts: LogOptions) -> Result<Log, LogError> {
        let region = region(cluster, name).await?;
        let layout = LogLayout::from_region(region.nodes, &region.params)?;
        let (asks, asks_rx) = mpsc::channel(ASKS_PER_FRAME_MAX * FRAMES_IN_FLIGHT);
        tokio::spawn(batch_asks(cluster.clone(), name.to_string(), asks_rx));
        Ok(Log {
            inner: Arc::new(Inner {
                cluster: cluster.clone(),
                name: name.to_string(),
                layout,
                opts,
                asks,
                writes: Mutex::default(),
                own: Mutex::default(),
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn layout(&self) -> &LogLayout {
        &self.inner.layout
    }

    fn until(&self) -> Instant {
        Instant::now() + self.inner.opts.deadline
    }

    /// Appends `payload` as one entry of every stream in `streams` (Tango's multiappend
    /// when there are several; none is allowed) and returns its position. Retries with a
    /// new position when its position was filled or the log moved to a new epoch.
    pub async fn append(&self, payload: Vec<u8>, streams: &[StreamId]) -> Result<u64, LogError> {
        let until = self.until();
        let layout = &self.inner.layout;
        let writer = rand::random::<u64>() | 1;
        let (mut append, first) = Append::new(layout, streams, payload, writer)?;
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
        let mut step = Ok(first);
        loop {
            let woken = (self.inner.own.lock())
                .expect("own entries poisoned")
                .on_step(&append, &step);
            for waiter in woken {
                let _ = waiter.send(());
            }
            step = match step? {
                AppendStep::Ask(ask) => match self.ask(ask, append.min_epoch(), until).await {
                    Ok(answer) => append.on_answer(layout, answer),
                    Err(e) => Err(e),
                },
                AppendStep::Write(write) => match self.write_once(write, until, &mut backoff).await
                {
                    Ok(written) => append.on_written(layout, written),
                    Err(e) => Err(e),
                },
                AppendStep::Done(position) => return Ok(position),
            }
        }
    }

    /// Writes `write` once; a batch with no outcome pauses first and counts as `Unknown`.
    async fn write_once(
        &self,
        write: SlotWrite,
        until: Instant,
        backoff: &mut Backoff,
    ) -> Result<Written, LogError> {
        let position = write.position;
        let unknown = |why| LogError::OutcomeUnknown { position, why };
        match timeout_at(until, self.write(write)).await {
            Ok(WriteResult::Written(written)) => Ok(written),
            Ok(WriteResult::Failed(why)) => Err(LogError::Cluster(why)),
            Ok(WriteResult::Unknown(why)) => {
                if !backoff.pause_before(until.into_std()).await {
                    return Err(unknown(why));
                }
                Ok(Written::Unknown)
            }
            Err(_) => Err(unknown("no outcome from the memory nodes".into())),
        }
    }

    /// Writes `write` in the next batch of its node.
    async fn write(&self, write: SlotWrite) -> WriteResult {
        let (reply, written) = oneshot::channel();
        let ready = (self.inner.writes.lock()).expect("batcher poisoned").queue(
            &self.inner.layout,
            write,
            reply,
        );
        if let Some(batch) = ready {
            tokio::spawn(run_batches(self.inner.clone(), batch));
        }
        written
            .await
            .unwrap_or_else(|_| WriteResult::Unknown("the batch was dropped".into()))
    }

    /// What `position` holds; a hole below the tail is waited for, then filled.
    pub async fn read(&self, position: u64) -> Result<Found, LogError> {
        let hole = Hole::FillAfter(self.inner.opts.hole_timeout);
        self.read_with(position, hole, self.until()).await
    }

    /// Fills `position` with junk unless it is written already; returns what it holds.
    pub async fn fill(&self, position: u64) -> Result<Found, LogError> {
        self.read_with(position, Hole::FillNow, self.until()).await
    }

    /// What `position` holds, doing `hole` with a hole.
    pub async fn read_with(
        &self,
        position: u64,
        hole: Hole,
        until: Instant,
    ) -> Result<Found, LogError> {
        if let Some(found) = self.own_entry(position, until).await {
            return Ok(found);
        }
        let layout = &self.inner.layout;
        let cluster = &self.inner.cluster;
        let (mut read, mut step) = ReadAt::new(layout, position, hole);
        loop {
            step = match step {
                ReadStep::Read(tx) => read.on_read(layout, &run(cluster, &tx, until).await?)?,
                ReadStep::Ask(ask) => {
                    let answer = self.ask(ask, read.min_epoch(), until).await?;
                    read.on_answer(layout, answer)?
                }
                ReadStep::Wait(pause) => {
                    tokio::time::sleep(pause).await;
                    read.on_waited(layout)
                }
                ReadStep::Fill(tx) => read.on_fill(layout, &run(cluster, &tx, until).await?)?,
                ReadStep::Done(found) => {
                    if let Found::Trimmed { trim } = found {
                        self.trimmed(trim);
                    }
                    return Ok(found);
                }
            }
        }
    }

    /// What one of this client's appends wrote at `position`, once it is written; `None`
    /// when none wrote it (or gave it up), for a read from the memory nodes.
    async fn own_entry(&self, position: u64, until: Instant) -> Option<Found> {
        loop {
            // The channel is made only for a read that waits: most find or miss at once.
            let mut woken = None;
            let own = (self.inner.own.lock())
                .expect("own entries poisoned")
                .look(position, || {
                    let (waiter, rx) = oneshot::channel();
                    woken = Some(rx);
                    waiter
                });
            match (own, woken) {
                (Own::Found(found), _) => return Some(found),
                (Own::Wait, Some(woken)) => {
                    if timeout_at(until, woken).await.is_err() {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }

    fn trimmed(&self, trim: u64) {
        (self.inner.own.lock())
            .expect("own entries poisoned")
            .trimmed(trim);
    }

    /// The fast check: the tail as the sequencer knows it, once the log's epoch shows that
    /// the sequencer was not replaced before it answered (a replaced one's tail may miss
    /// appends acknowledged since): every append acknowledged before the call is below it.
    pub async fn check(&self) -> Result<Tail, LogError> {
        let until = self.until();
        let mut min_epoch = 0;
        loop {
            match self
                .ask(Ask::Tail { streams: vec![] }, min_epoch, until)
                .await?
            {
                Answer::Tail { tail, epoch, .. } => {
                    if planted(Bug::UnfencedTail) {
                        return Ok(Tail { tail, epoch });
                    }
                    let fence = minitxs::epoch(&self.inner.layout);
                    let fenced = first_outcome(&self.inner.cluster, &fence, until).await?;
                    let log_epoch = minitxs::epoch_result(&fenced);
                    if log_epoch <= epoch {
                        return Ok(Tail { tail, epoch });
                    }
                    min_epoch = log_epoch;
                }
                Answer::Sealed { epoch } => min_epoch = epoch + 1,
                other => {
                    return Err(LogError::Cluster(format!(
                        "the sequencer answered a fast check with {other:?}"
                    )))
                }
            }
        }
    }

    /// The slow check: the end of the written log from the memory nodes alone (the highest
    /// written position below the sequencer's durable reservation, plus one). The fast
    /// check's tail is at or above it.
    pub async fn check_slow(&self) -> Result<u64, LogError> {
        let until = self.until();
        let cluster = &self.inner.cluster;
        let (mut check, tx) = SlowCheck::start(&self.inner.layout);
        let mut step = Step::Run(tx);
        loop {
            match step {
                Step::Run(tx) => {
                    let outcome = run(cluster, &tx, until).await?;
                    step = check
                        .on_outcome(&outcome)
                        .map_err(|e| LogError::Cluster(e.to_string()))?;
                }
                Step::Done(tail) => return Ok(tail),
            }
        }
    }

    /// Gives up every position below `prefix`: their slots may take new positions. Trims
    /// only grow; a trim to at or below the current one does nothing.
    pub async fn trim(&self, prefix: u64) -> Result<(), LogError> {
        let tail = self.check().await?.tail;
        if prefix > tail {
            return Err(LogError::TrimPastTail { prefix, tail });
        }
        run(
            &self.inner.cluster,
            &minitxs::trim(&self.inner.layout, prefix),
            self.until(),
        )
        .await?;
        self.trimmed(prefix);
        Ok(())
    }

    /// The position below which the log is trimmed.
    pub async fn trim_point(&self) -> Result<u64, LogError> {
        let tx = minitxs::words(&self.inner.layout);
        let outcome = run(&self.inner.cluster, &tx, self.until()).await?;
        let trim = (minitxs::words_result(&outcome).iter().map(|w| w.trim)).fold(0, u64::max);
        self.trimmed(trim);
        Ok(trim)
    }

    /// The log's control words on every node, and the tail.
    pub async fn stat(&self) -> Result<Stat, LogError> {
        let tx = minitxs::words(&self.inner.layout);
        let outcome = run(&self.inner.cluster, &tx, self.until()).await?;
        Ok(Stat {
            layout: self.inner.layout.clone(),
            words: minitxs::words_result(&outcome),
            tail: self.check().await?,
        })
    }

    /// A reader of stream `id` from position `from` on.
    pub fn stream(&self, id: StreamId, from: u64) -> Stream {
        Stream {
            log: self.clone(),
            id,
            floor: from,
            ready: BTreeMap::new(),
            trimmed: None,
        }
    }

    /// One ask of the sequencer, retried (the batcher finds the sequencer again after an
    /// error) until `until`.
    async fn ask(&self, ask: Ask, min_epoch: u64, until: Instant) -> Result<Answer, LogError> {
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(500));
        loop {
            let (reply, answer) = oneshot::channel();
            let pending = Pending {
                ask: ask.clone(),
                min_epoch,
                reply,
            };
            if self.inner.asks.send(pending).await.is_err() {
                return Err(LogError::Cluster("the log's batcher stopped".into()));
            }
            let last = match timeout_at(until, answer).await {
                Ok(Ok(Ok(answer))) => return Ok(answer),
                Ok(Ok(Err(e))) => e,
                Ok(Err(_)) => "the log's batcher stopped".to_string(),
                Err(_) => "no answer from the sequencer".to_string(),
            };
            if !backoff.pause_before(until.into_std()).await {
                return Err(LogError::Deadline { last });
            }
        }
    }
}

/// A reader of one stream, in log order, from a position on (Tango's `readnext`).
pub struct Stream {
    log: Log,
    id: StreamId,
    /// Every entry of the stream below this has been found.
    floor: u64,
    /// Entries found and not yet returned.
    ready: BTreeMap<u64, Vec<u8>>,
    /// A sync found the log trimmed here, above where the stream's reading stood: the
    /// stream's entries below it were never returned.
    trimmed: Option<u64>,
}

impl Stream {
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Every entry of the stream below this position has been returned by `readnext`, or
    /// is `ready` to be: the tail of the last sync.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Entries the last sync found that `readnext` has not returned yet.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Where a sync found the log trimmed above the stream's reading position (entries of
    /// the stream may have been skipped there), if it did.
    pub fn trimmed(&self) -> Option<u64> {
        self.trimmed
    }

    /// Takes every entry the syncs found and `readnext` has not returned, in log order.
    pub fn take_ready(&mut self) -> BTreeMap<u64, Vec<u8>> {
        std::mem::take(&mut self.ready)
    }

    /// Learns the stream's entries up to the tail (Tango's sync), reading back along the
    /// backpointers in parallel; returns the tail.
    pub async fn sync(&mut self) -> Result<u64, LogError> {
        let log = &self.log;
        let until = log.until();
        let hole = Hole::FillAfter(log.inner.opts.hole_timeout);
        let (mut sync, mut step) = Sync::new(self.id, log.inner.layout.backpointers, self.floor);
        loop {
            step = match step {
                SyncStep::Ask(ask) => {
                    let answer = log.ask(ask, sync.min_epoch(), until).await?;
                    sync.on_answer(&log.inner.layout, answer)?
                }
                SyncStep::Fence(txs) => {
                    sync.on_fenced(&first_outcome(&log.inner.cluster, &txs, until).await?)
                }
                SyncStep::Read(positions) => {
                    let reads = positions.iter().map(|&p| log.read_with(p, hole, until));
                    let found = futures::future::try_join_all(reads).await?;
                    sync.on_found(positions.into_iter().zip(found).collect())
                }
                SyncStep::Done {
                    tail,
                    entries,
                    trimmed,
                } => {
                    self.trimmed = self.trimmed.max(trimmed);
                    self.ready.extend(entries);
                    self.floor = self.floor.max(tail);
                    return Ok(tail);
                }
            }
        }
    }

    /// The stream's next entry (position and payload), syncing when none is known; `None`
    /// when the stream has no entry beyond the last one returned.
    pub async fn readnext(&mut self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        if self.ready.is_empty() {
            self.sync().await?;
        }
        Ok(self.ready.pop_first())
    }
}

/// The outcome of whichever of `txs` finishes first (each reads one node: a node down does
/// not hold the caller up while another answers).
async fn first_outcome(
    cluster: &Cluster,
    txs: &[Minitx],
    until: Instant,
) -> Result<Outcome, LogError> {
    let runs = txs.iter().map(|tx| Box::pin(run(cluster, tx, until)));
    futures::future::select_ok(runs)
        .await
        .map(|(outcome, _)| outcome)
}

async fn region(cluster: &Cluster, name: &str) -> Result<RegionInfo, LogError> {
    let ask = Request::Region { name: name.into() };
    match cluster.ask_manager(&ask).await {
        Ok(Response::Region(r)) if r.kind == REGION_KIND => Ok(*r),
        Ok(Response::Region(r)) => Err(LogError::NotALog {
            name: name.into(),
            kind: r.kind,
        }),
        Ok(other) => Err(LogError::Cluster(format!("the manager answered {other:?}"))),
        Err(RpcError::Remote {
            code: ErrorCode::NotFound,
            ..
        }) => Err(LogError::NoSuchLog(name.into())),
        Err(e) => Err(remote(e)),
    }
}

/// Runs `tx` until it has an outcome or `until` passes. Every log minitransaction may run
/// twice: the writes are fenced by compares that a second run fails harmlessly (and reads
/// back why), the rest only read.
pub(crate) async fn run(
    cluster: &Cluster,
    tx: &Minitx,
    until: Instant,
) -> Result<Outcome, LogError> {
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
    loop {
        let last = match timeout_at(until, cluster.exec_and_commit(tx)).await {
            Ok(Ok(outcome)) => return Ok(outcome),
            Ok(Err(
                e
                @ (ExecError::Invalid(_) | ExecError::UnknownNode(_) | ExecError::Rejected { .. }),
            )) => return Err(LogError::Cluster(e.to_string())),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no outcome from the memory nodes".to_string(),
        };
        if !backoff.pause_before(until.into_std()).await {
            return Err(LogError::Deadline { last });
        }
    }
}

/// Runs `batch`, hands each of its writes what became of it, and runs the node's next batch
/// while one waits.
async fn run_batches(inner: Arc<Inner>, mut batch: Batch<oneshot::Sender<WriteResult>>) {
    loop {
        let (outcome, failure) = match inner.cluster.exec_and_commit(&batch.tx).await {
            Ok(outcome) => (Some(outcome), None),
            Err(
                e
                @ (ExecError::Invalid(_) | ExecError::UnknownNode(_) | ExecError::Rejected { .. }),
            ) => (None, Some(WriteResult::Failed(e.to_string()))),
            Err(e) => (None, Some(WriteResult::Unknown(e.to_string()))),
        };
        let (results, next) = (inner.writes.lock()).expect("batcher poisoned").finish(
            &inner.layout,
            batch,
            outcome.as_ref(),
        );
        for (reply, written) in results {
            let _ = reply.send(failure.clone().unwrap_or(WriteResult::Written(written)));
        }
        match next {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// Gathers the asks of every caller of one log into frames to the sequencer, at most
/// `FRAMES_IN_FLIGHT` out at once, and hands each answer back. It finds the sequencer from
/// the manager, and again after any error.
async fn batch_asks(cluster: Cluster, log: String, mut asks: mpsc::Receiver<Pending>) {
    let frames = Arc::new(Semaphore::new(FRAMES_IN_FLIGHT));
    let conn: Arc<Mutex<Option<Arc<Connection>>>> = Arc::default();
    while let Some(first) = asks.recv().await {
        let Ok(permit) = frames.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < ASKS_PER_FRAME_MAX {
            match asks.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let (cluster, log, conn) = (cluster.clone(), log.clone(), conn.clone());
        tokio::spawn(async move {
            let result = send_frame(&cluster, &log, &conn, &batch).await;
            drop(permit);
            match result {
                Ok(answers) => {
                    for (p, a) in batch.into_iter().zip(answers) {
                        let _ = p.reply.send(Ok(a));
                    }
                }
                Err(e) => {
                    conn.lock().expect("connection slot poisoned").take();
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

/// How long a frame of asks may wait for the sequencer (or a connection to it). A frame
/// holds one of `FRAMES_IN_FLIGHT`; one left waiting on a sequencer cut off by a partition
/// (TCP reports nothing) would hold it for good, and with all of them held the log's asks
/// stopped until the connection closed. A sequencer answers in microseconds, a takeover
/// in a few round trips to the memory nodes.
const SEQUENCER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

async fn send_frame(
    cluster: &Cluster,
    log: &str,
    conn: &Mutex<Option<Arc<Connection>>>,
    batch: &[Pending],
) -> Result<Vec<Answer>, String> {
    let cached = conn.lock().expect("connection slot poisoned").clone();
    let c = match cached {
        Some(c) if !c.is_closed() => c,
        _ => {
            let addr = match cluster.ask_manager(&Request::Sequencer).await {
                Ok(Response::Sequencer(Some(addr))) => addr,
                Ok(Response::Sequencer(None)) => return Err(LogError::NoSequencer.to_string()),
                Ok(other) => return Err(format!("the manager answered {other:?}")),
                Err(e) => return Err(e.to_string()),
            };
            let opts = cluster.options();
            let connect = Connection::connect(&addr, opts.frame_bytes_max, &opts.dialer);
            let c = match tokio::time::timeout(SEQUENCER_CALL_TIMEOUT, connect).await {
                Ok(c) => c.map_err(|e| e.to_string())?,
                Err(_) => {
                    return Err(format!(
                        "no connection to the sequencer at {addr} within {} ms",
                        SEQUENCER_CALL_TIMEOUT.as_millis()
                    ))
                }
            };
            let c = Arc::new(c);
            *conn.lock().expect("connection slot poisoned") = Some(c.clone());
            c
        }
    };
    let req = Request::Sequence {
        log: log.to_string(),
        min_epoch: batch.iter().map(|p| p.min_epoch).max().unwrap_or(0),
        asks: batch.iter().map(|p| p.ask.clone()).collect(),
    };
    match c.call_within(&req, SEQUENCER_CALL_TIMEOUT).await {
        Ok(Response::Sequenced(answers)) if answers.len() == batch.len() => Ok(answers),
        Ok(other) => Err(format!("the sequencer at {} answered {other:?}", c.addr())),
        Err(e) => Err(e.to_string()),
    }
}
