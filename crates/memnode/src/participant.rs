//! The Sinfonia participant (Fig. 4, 5, 7, 8) as a deterministic state machine: requests,
//! sync completions and manager acknowledgements go in; log records to append, replies to
//! send and log truncations come out. It does no I/O; `node` drives it on tokio and a
//! simulator can drive it unchanged. Its only side effect is on the address space (`Space`).

mod backup;

use crate::range_locks::{LockKind, LockRange, RangeLocks};
use crate::redo_log::{LogRecord, Lsn};
use crate::space::Space;
use crate::stats::{Load, WINDOWS_S};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};
use tutti_wire::{
    Applied, Decision, ErrorCode, ExecPrepare, Item, Limits, NodeId, Request, Response,
    StatsReport, Tid, Vote, VoteReply, CLASS_BYTES_MAX, LOCK_WAIT_MS_MAX,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No log: survives application crashes, not memory-node crashes.
    Ram,
    /// Redo log synced at prepare, image written lazily: survives crashes of every node.
    Log,
}

/// Plain writes `(address, bytes)` that a Prepare record carries.
pub type Writes = Vec<(u64, Vec<u8>)>;

/// What a heartbeat carries to the manager.
pub struct HeartbeatReport {
    /// Tids uncertain longer than the timeout, for the recovery coordinator.
    pub uncertain: Vec<(Tid, Vec<NodeId>)>,
    /// Multi-participant tids newly applied to the durable image without their
    /// participants' lsns, for GC.
    pub applied: Vec<Applied>,
    /// Every committed tid whose Prepare record here has a smaller lsn is in the image.
    pub applied_below: Lsn,
}

/// A forced-abort or epoch record this far behind the log head, or in a segment before the
/// current one, is appended again at a checkpoint, so that the segments before it can be
/// deleted.
const CARRY_DISTANCE_RECORDS: Lsn = 4096;

/// Tids per `RequestAbort` batch and per heartbeat report.
pub const BATCH_TIDS_MAX: usize = 65_536;
/// The load class that counts the tids a restart's stage 2 decides.
const RECOVERED_CLASS: &str = "recovered";

#[derive(Clone, Debug)]
pub struct Config {
    pub id: NodeId,
    pub mode: Mode,
    pub timeout_uncertain_ms: u64,
    pub limits: Limits,
    /// Tids one `checkpoint_step` looks at (`CHECKPOINT_STEP_TIDS`; the simulator takes
    /// fewer, so that other events interleave with a checkpoint's steps).
    pub checkpoint_step_tids: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Stages 2–3 of Fig. 8: only RequestAbort and LogTids are served.
    Recovering,
    Serving,
}

/// What the driver must do, in this order: append (and, if any record needs it, sync)
/// `append`; send `replies`; after the appends are synced, delete log segments wholly
/// below `truncate_below`.
pub struct Actions<R> {
    pub append: Vec<(Lsn, LogRecord)>,
    pub replies: Vec<(R, u64, Response)>,
    pub truncate_below: Option<Lsn>,
}

impl<R> Default for Actions<R> {
    fn default() -> Self {
        Actions {
            append: Vec::new(),
            replies: Vec::new(),
            truncate_below: None,
        }
    }
}

/// A tid this node executed and still holds locks for (Fig. 5 "uncertain").
struct Uncertain {
    participants: Vec<NodeId>,
    writes: Writes,
    /// Lsn of its Prepare record, if this node logged a commit vote.
    lsn: Option<Lsn>,
    since_ms: u64,
    class: usize,
}

/// Items a coordinator had executed ahead of EXEC&PREPARE (`Request::ExecuteAhead`), whose
/// locks this node holds. In memory only: a restart drops them, and the tid's EXEC&PREPARE,
/// which counts them, then votes abort.
struct Ahead {
    items: Vec<Item>,
    since_ms: u64,
}

/// Why `Participant::admit` did not admit a minitransaction.
enum Refusal {
    /// A lock it needs is held.
    Busy,
    /// The reply that refuses it.
    Reply(Response),
}

/// A single-node minitransaction that found a lock busy: it waits here, holding nothing,
/// for the locks it needs (`Participant::run_waiting`), instead of voting ABORT-LOCK. Only
/// a minitransaction that touches this node alone may wait: it takes all its locks in one
/// step and holds none while it waits, so no wait can be part of a cycle. A multi-node one
/// could hold locks elsewhere; it still votes ABORT-LOCK (Sinfonia §3.3).
struct Waiting<R> {
    reply_to: R,
    id: u64,
    ep: ExecPrepare,
    since_ms: u64,
}

impl<R> Waiting<R> {
    /// When it votes ABORT-LOCK if still waiting (its coordinator then backs off and tries
    /// again): after its `lock_wait_ms`.
    fn until_ms(&self) -> u64 {
        wait_until_ms(&self.ep, self.since_ms)
    }
}

fn wait_until_ms(ep: &ExecPrepare, since_ms: u64) -> u64 {
    since_ms.saturating_add(u64::from(ep.lock_wait_ms.min(LOCK_WAIT_MS_MAX)))
}

/// Where a step of a checkpoint's scan for `applied_below` got to.
enum Scanned {
    Unapplied(Lsn),
    AllApplied,
    /// The budget ran out before this lsn.
    NotYet(Lsn),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Unknown,
    Commit,
    Abort,
}

/// A tid with a commit vote in the redo log (Fig. 5 "all-log-tids" and "decided").
struct LogTid {
    lsn: Lsn,
    participants: Vec<NodeId>,
    outcome: Outcome,
    /// This node applied it to its durable image.
    durable: bool,
    /// Every participant applied it to a durable image: the GC rule of §4.6 lets it go.
    gc_ok: bool,
    /// From the coordinator's commit: every participant's Prepare lsn, in participant
    /// order. A participant whose `applied_below` passed its lsn applied the tid. Empty when
    /// the outcome came another way; the tid is then reported for GC on its own.
    lsns: Vec<Lsn>,
}

impl LogTid {
    /// A tid whose Prepare record is at `lsn` (0 in `ram` mode) and whose outcome is
    /// `outcome`, not yet applied anywhere durably.
    fn prepared(lsn: Lsn, participants: Vec<NodeId>, outcome: Outcome) -> LogTid {
        LogTid {
            lsn,
            participants,
            outcome,
            durable: false,
            gc_ok: false,
            lsns: Vec::new(),
        }
    }
}

enum Deferred<R> {
    Reply(R, u64, Response),
    OnePhase(Tid, R, u64, Response),
    Decision(Decision),
}

/// What the log writer reports about the redo log.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogCounters {
    pub bytes: u64,
    pub records_appended: u64,
    /// Where the segment being appended starts: a record kept below it keeps a whole
    /// older segment on disk.
    pub current_segment_first_lsn: Lsn,
    /// How long each synced write (the round's write and its fdatasync) took.
    pub sync: tutti_wire::SyncHistogram,
}

/// A checkpoint in progress: the committed tids applied to the space before it began, and
/// how far `checkpoint_step` got with them.
pub struct Checkpoint {
    tids: Vec<Tid>,
    pub upto: Lsn,
    work: CheckpointWork,
}

/// The stages of `checkpoint_step`, each resumable where its last step stopped.
enum CheckpointWork {
    /// Marking `tids[next..]` durable.
    Mark { next: usize },
    /// Collecting dead Prepare records at the log head (§4.6).
    Collect,
    /// Looking for the first tid in `[from, bound)` not applied to the durable image; the
    /// answer becomes `applied_below` only once found, since heartbeats go out meanwhile.
    Scan { head: Lsn, from: Lsn, bound: Lsn },
    /// Forced-aborts and the epoch record; the truncation point.
    Finish { head: Lsn },
}

/// Tids one `checkpoint_step` looks at (about 0.3 ms here): requests wait for the
/// participant at most that long behind a checkpoint, where the whole of one took 35–50 ms
/// under the Fig. 16 load (some 230,000 tids every 2 s).
pub const CHECKPOINT_STEP_TIDS: usize = 2048;

pub struct Participant<R> {
    cfg: Config,
    stage: Stage,
    epoch: u64,
    space: Space,
    locks: RangeLocks,
    /// Single-node minitransactions waiting for busy locks, in arrival order.
    waiting: VecDeque<Waiting<R>>,
    uncertain: FxHashMap<Tid, Uncertain>,
    ahead: FxHashMap<Tid, Ahead>,
    /// A B-tree, not a hash map: it holds every tid logged since the log head (about
    /// 200,000 under Fig. 16's load) and churns as checkpoints collect them. A hash table's
    /// growth, and its in-place rehash to clear the tombstones of removals, moved the whole
    /// table inside one request's hold of the participant (50-116 ms measured); a B-tree's
    /// work per insert and removal stays bounded.
    log_tids: BTreeMap<Tid, LogTid>,
    /// Prepare records still counted live, by lsn: the log is collected in this order.
    by_lsn: BTreeMap<Lsn, Tid>,
    /// Forced-abort tids and the lsn of their record.
    forced_abort: FxHashMap<Tid, Lsn>,
    next_lsn: Lsn,
    synced_lsn: Lsn,
    /// The last record that a reply may depend on (Prepare or ForcedAbort): answers about
    /// votes wait for it, not for lazily written Decided records.
    votes_lsn: Lsn,
    /// Lsn of the latest Epoch record (0: none); carried past the log head like forced-aborts.
    epoch_lsn: Lsn,
    deferred: VecDeque<(Lsn, Deferred<R>)>,
    applied_unflushed: Vec<Tid>,
    /// Applied tids for the next heartbeat to report, by participant set.
    to_report: BTreeMap<Vec<NodeId>, Vec<Tid>>,
    /// Reported tids not yet collected, and when they were reported.
    reported: FxHashMap<Tid, u64>,
    /// Every committed tid whose Prepare record has a smaller lsn is in the durable image.
    applied_below: Lsn,
    /// The highest `applied_below` each other node reported, as the manager relayed it.
    peers_applied_below: FxHashMap<NodeId, Lsn>,
    manager_incarnation: u64,
    /// Writes of recovered Prepare records, kept only until stage 3 replays them.
    recovered_writes: BTreeMap<Lsn, (Tid, Writes)>,
    load: Load,
    log: LogCounters,
    rss_bytes: u64,
    backup: Option<backup::Backup>,
    /// The last backup whose cut was read whole here (since this process started): an
    /// incremental backup starts from it.
    backup_base: Option<u64>,
    /// The most bytes an ended backup's cut held saved at once.
    backup_saved_bytes_max: u64,
}

impl<R> Participant<R> {
    /// A node with no state on disk (any `ram` node, or a `log` node's first start).
    pub fn new(cfg: Config, space: Space, next_lsn: Lsn) -> Self {
        Participant {
            cfg,
            stage: Stage::Serving,
            epoch: 0,
            space,
            locks: RangeLocks::default(),
            waiting: VecDeque::new(),
            uncertain: FxHashMap::default(),
            ahead: FxHashMap::default(),
            log_tids: BTreeMap::new(),
            by_lsn: BTreeMap::new(),
            forced_abort: FxHashMap::default(),
            next_lsn,
            synced_lsn: next_lsn - 1,
            votes_lsn: next_lsn - 1,
            epoch_lsn: 0,
            deferred: VecDeque::new(),
            applied_unflushed: Vec::new(),
            to_report: BTreeMap::new(),
            reported: FxHashMap::default(),
            applied_below: next_lsn,
            peers_applied_below: FxHashMap::default(),
            manager_incarnation: 0,
            recovered_writes: BTreeMap::new(),
            load: Load::default(),
            log: LogCounters::default(),
            rss_bytes: 0,
            backup: None,
            backup_base: None,
            backup_saved_bytes_max: 0,
        }
    }

    /// Stage 1 of Fig. 8: rebuild all-log-tids, forced-abort and decided from the records
    /// read back from disk. The node then serves only recovery messages until
    /// `finish_recovery` or `serve_undecided`.
    pub fn recover(
        cfg: Config,
        space: Space,
        next_lsn: Lsn,
        records: Vec<(Lsn, LogRecord)>,
    ) -> Self {
        let mut p = Participant::new(cfg, space, next_lsn);
        p.stage = Stage::Recovering;
        for (lsn, record) in records {
            match record {
                LogRecord::Prepare {
                    tid,
                    participants,
                    writes,
                } => {
                    let outcome = if participants == [p.cfg.id] {
                        Outcome::Commit
                    } else {
                        Outcome::Unknown
                    };
                    p.epoch = p.epoch.max(tid.epoch);
                    p.log_tids
                        .insert(tid, LogTid::prepared(lsn, participants, outcome));
                    p.by_lsn.insert(lsn, tid);
                    p.recovered_writes.insert(lsn, (tid, writes));
                }
                LogRecord::Decided { tid, commit } => {
                    if let Some(t) = p.log_tids.get_mut(&tid) {
                        t.outcome = if commit {
                            Outcome::Commit
                        } else {
                            Outcome::Abort
                        };
                    }
                }
                LogRecord::ForcedAbort { tid } => {
                    p.forced_abort.insert(tid, lsn);
                }
                LogRecord::Epoch { epoch } => {
                    p.epoch = p.epoch.max(epoch);
                    p.epoch_lsn = lsn;
                }
            }
        }
        // Below the oldest Prepare read back, every tid was collected, so applied.
        p.applied_below = p.by_lsn.first_key_value().map_or(next_lsn, |(&lsn, _)| lsn);
        p
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The newest epoch this node has heard of (from the manager, or in a tid).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Moves to `epoch` if it is newer; in `log` mode the epoch is logged (synced before any
    /// reply that relies on it) so that it never regresses across a restart.
    pub fn set_epoch(&mut self, epoch: u64) -> Actions<R> {
        let mut acts = Actions::default();
        if epoch > self.epoch {
            self.epoch = epoch;
            if self.cfg.mode == Mode::Log {
                self.epoch_lsn = self.append(&mut acts, LogRecord::Epoch { epoch });
            }
        }
        acts
    }

    pub fn set_log_counters(&mut self, log: LogCounters) {
        self.log = log;
    }

    /// The driver's reading of its process's resident memory, for `stats`.
    pub fn set_rss_bytes(&mut self, rss_bytes: u64) {
        self.rss_bytes = rss_bytes;
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Whether a minitransaction in flight holds `len` bytes at `addr` for writing: their
    /// bytes in `space` may be about to change, its outcome still unknown here.
    pub fn write_locked(&self, addr: u64, len: u64) -> bool {
        self.locks.write_held(addr, addr + len)
    }

    /// Multi-participant tids whose outcome stage 2 must learn from their participants.
    pub fn undecided(&self) -> Vec<(Tid, Vec<NodeId>)> {
        let mut tids: Vec<_> = self
            .log_tids
            .iter()
            .filter(|(_, t)| t.outcome == Outcome::Unknown)
            .map(|(tid, t)| (*tid, t.participants.clone()))
            .collect();
        tids.sort();
        tids
    }

    /// Stage 2 of Fig. 8: records outcomes learned from the participants. A node serving
    /// already (`serve_undecided`) takes them as decisions: each applies or drops the tid's
    /// writes and frees its locks.
    pub fn resolve(&mut self, now_ms: u64, outcomes: &[(Tid, bool)]) -> Actions<R> {
        let mut acts = Actions::default();
        for &(tid, commit) in outcomes {
            if self.stage == Stage::Serving {
                self.decision(&mut acts, now_ms, Decision::without_lsns(tid, commit));
                continue;
            }
            if let Some(t) = self.log_tids.get_mut(&tid) {
                if t.outcome == Outcome::Unknown {
                    t.outcome = if commit {
                        Outcome::Commit
                    } else {
                        Outcome::Abort
                    };
                    self.append(&mut acts, LogRecord::Decided { tid, commit });
                }
            }
        }
        self.run_waiting(&mut acts, now_ms);
        acts
    }

    /// Stage 3 of Fig. 8 once stage 2 decided every tid: replays committed writes in log
    /// order (idempotent), then serves.
    pub fn finish_recovery(&mut self, now_ms: u64) {
        assert!(
            self.undecided().is_empty(),
            "stage 3 needs every outcome decided"
        );
        self.replay(now_ms);
    }

    /// Stage 3 ahead of stage 2, where log order allows it (docs/protocol.md, "Recovery
    /// from a participant crash"): replays the committed writes and serves, each undecided
    /// tid held as a prepared tid awaiting its coordinator is, its writes kept aside and
    /// their bytes write-locked until stage 2's outcome comes through `resolve`. A
    /// minitransaction that needs those bytes waits or votes ABORT-LOCK; every other runs
    /// at once, however long stage 2 waits for a peer. Not possible when an undecided
    /// tid's writes overlap a later record's: only replaying both in log order gives the
    /// bytes their value. (The later one locked the bytes after the tid was decided, which
    /// appended its `Decided` before; so only a log that lost records in the middle has
    /// such a pair.) Then nothing changes and it returns false.
    pub fn serve_undecided(&mut self, now_ms: u64) -> bool {
        let mut locks = RangeLocks::default();
        // Only records from the first undecided one on can overlap an undecided one.
        let first_undecided = (self.log_tids.values())
            .filter(|t| t.outcome == Outcome::Unknown)
            .map(|t| t.lsn)
            .min()
            .unwrap_or(Lsn::MAX);
        for (tid, writes) in self
            .recovered_writes
            .range(first_undecided..)
            .map(|(_, w)| w)
        {
            let ranges: Vec<LockRange> = (writes.iter())
                .map(|(addr, bytes)| LockRange {
                    start: *addr,
                    end: addr + bytes.len() as u64,
                    kind: LockKind::Write,
                })
                .collect();
            if ranges.iter().any(|r| locks.write_held(r.start, r.end)) {
                return false;
            }
            if self.log_tids[tid].outcome == Outcome::Unknown {
                locks.try_lock(*tid, &ranges);
            }
        }
        if !planted(Bug::ServeUndecidedUnlocked) {
            self.locks = locks;
        }
        self.replay(now_ms);
        true
    }

    /// Replays the recovered committed writes in log order, keeps the undecided ones'
    /// writes in `uncertain`, and serves.
    fn replay(&mut self, now_ms: u64) {
        for (_, (tid, writes)) in std::mem::take(&mut self.recovered_writes) {
            let t = &self.log_tids[&tid];
            match t.outcome {
                Outcome::Commit => {
                    for (addr, bytes) in &writes {
                        self.space.write(*addr, bytes);
                    }
                    self.applied_unflushed.push(tid);
                }
                Outcome::Unknown => {
                    let (participants, lsn) = (t.participants.clone(), Some(t.lsn));
                    let entry = Uncertain {
                        participants,
                        writes,
                        lsn,
                        since_ms: now_ms,
                        class: self.load.class_index(RECOVERED_CLASS),
                    };
                    self.uncertain.insert(tid, entry);
                }
                Outcome::Abort => {}
            }
        }
        self.stage = Stage::Serving;
    }

    pub fn on_request(&mut self, now_ms: u64, reply_to: R, id: u64, req: Request) -> Actions<R> {
        let mut acts = Actions::default();
        self.expire_backup(now_ms);
        match req {
            Request::RequestAbort { tids } => self.request_abort(&mut acts, reply_to, id, tids),
            Request::LogTids { tids } if tids.len() > BATCH_TIDS_MAX => {
                let message = format!("more than {BATCH_TIDS_MAX} tids");
                acts.replies
                    .push((reply_to, id, error(ErrorCode::BadRequest, message)));
            }
            Request::LogTids { tids } => {
                let tids = tids
                    .into_iter()
                    .filter(|t| self.log_tids.contains_key(t))
                    .collect();
                let lsn = self.votes_lsn;
                self.after(
                    &mut acts,
                    lsn,
                    Deferred::Reply(reply_to, id, Response::LogTids(tids)),
                );
            }
            Request::Stats => {
                acts.replies
                    .push((reply_to, id, Response::Stats(Box::new(self.stats(now_ms)))))
            }
            Request::Applied { tids } => {
                // A committed tid this node no longer holds was collected, which needed it applied.
                let applied = tids
                    .into_iter()
                    .filter(|t| self.log_tids.get(t).is_none_or(|lt| lt.durable || lt.gc_ok))
                    .collect();
                acts.replies
                    .push((reply_to, id, Response::Applied(applied)));
            }
            _ if self.stage != Stage::Serving => {
                acts.replies.push((
                    reply_to,
                    id,
                    error(ErrorCode::NotReady, "node is recovering".into()),
                ));
            }
            Request::ExecPrepare(ep) => match self.validate(&ep) {
                Ok(()) => self.exec_prepare(&mut acts, now_ms, reply_to, id, ep, None),
                Err(resp) => acts.replies.push((reply_to, id, resp)),
            },
            Request::ExecuteAhead(ep) => match self.validate(&ep) {
                Ok(()) => {
                    let resp = self.execute_ahead(now_ms, ep);
                    acts.replies.push((reply_to, id, resp));
                }
                Err(resp) => acts.replies.push((reply_to, id, resp)),
            },
            Request::Decisions(decisions) => {
                for decision in decisions {
                    self.decision(&mut acts, now_ms, decision);
                }
            }
            Request::Release { tid } => {
                let held = self
                    .uncertain
                    .get(&tid)
                    .is_some_and(|u| u.lsn.is_none() && u.writes.is_empty());
                if held {
                    let entry = self.uncertain.remove(&tid).expect("held");
                    self.commit_applied(now_ms, tid, &entry);
                }
                acts.replies
                    .push((reply_to, id, Response::Released { held }));
            }
            req @ (Request::BackupLock { .. }
            | Request::BackupCut { .. }
            | Request::BackupRead { .. }
            | Request::BackupEnd { .. }) => {
                self.backup_request(&mut acts, now_ms, reply_to, id, req)
            }
            Request::Replicate { node, .. } | Request::ReplicaTail { node, .. } => {
                // A primary that was replaced ships to its old mirror, which took over.
                acts.replies.push((
                    reply_to,
                    id,
                    error(
                        ErrorCode::StaleConfig,
                        format!("node {node} is served here: this is its primary now"),
                    ),
                ));
            }
            Request::JoinMirror { node, .. } | Request::ReadSeed { node, .. } => {
                // A replicated primary's driver answers these before the participant.
                acts.replies.push((
                    reply_to,
                    id,
                    error(
                        ErrorCode::NotReady,
                        format!("node {node} is not served here by a replicated primary"),
                    ),
                ));
            }
            Request::Register { .. }
            | Request::MirrorHeartbeat { .. }
            | Request::AddMirror { .. }
            | Request::AbandonJoin { .. }
            | Request::Placement { .. }
            | Request::FormerPrimary { .. }
            | Request::Invalidate { .. }
            | Request::WriteEnded { .. }
            | Request::Directory
            | Request::Heartbeat { .. }
            | Request::CreateRegion { .. }
            | Request::Region { .. }
            | Request::ExtendRegion { .. }
            | Request::Regions
            | Request::TakeRegion { .. }
            | Request::SetSequencer { .. }
            | Request::Sequencer
            | Request::Sequence { .. }
            | Request::Raft(_)
            | Request::ManagerStatus => {
                acts.replies.push((
                    reply_to,
                    id,
                    error(
                        ErrorCode::Unsupported,
                        "not a memory node's request: ask the manager or the sequencer".into(),
                    ),
                ));
            }
        }
        self.run_waiting(&mut acts, now_ms);
        acts
    }

    fn validate(&self, ep: &ExecPrepare) -> Result<(), Response> {
        let bad = |m: String| Err(error(ErrorCode::BadRequest, m));
        if !ep.participants.contains(&self.cfg.id) {
            let message = format!("node {} is not a participant", self.cfg.id);
            return Err(error(ErrorCode::UnknownNode, message));
        }
        if ep.participants.windows(2).any(|w| w[0] >= w[1]) || ep.participants.contains(&0) {
            return bad("participants must be sorted, unique and non-zero".into());
        }
        if ep.read_only && ep.items.iter().any(Item::writes) {
            return bad("a read-only minitransaction has write items".into());
        }
        if ep.class.len() > CLASS_BYTES_MAX {
            return bad(format!("class name longer than {CLASS_BYTES_MAX} bytes"));
        }
        if !(ep.items.is_empty() && ep.executed > 0) {
            // (The items executed ahead are checked together with these at EXEC&PREPARE.)
            self.cfg.limits.check(ep.items.iter()).or_else(bad)?;
        }
        match ep
            .items
            .iter()
            .position(|item| !self.space.contains(item.addr(), item.len()))
        {
            None => Ok(()),
            Some(i) => {
                let item = &ep.items[i];
                let (addr, len, size) = (item.addr(), item.len(), self.space.size_bytes());
                let message = format!(
                    "item {i}: [{addr}, +{len}) outside the {size} bytes of node {}",
                    self.cfg.id
                );
                Err(error(ErrorCode::OutOfRange, message))
            }
        }
    }

    /// `Request::ExecuteAhead`: lock and execute `ep.items` now, keep them for the tid's
    /// EXEC&PREPARE. Any refusal drops everything the tid holds here.
    fn execute_ahead(&mut self, now_ms: u64, ep: ExecPrepare) -> Response {
        let class = self.load.class_index(&ep.class);
        let tid = ep.tid;
        if self.uncertain.contains_key(&tid) || self.log_tids.contains_key(&tid) {
            return error(ErrorCode::BadRequest, format!("tid {tid} already executed"));
        }
        let refused = if tid.epoch + 2 <= self.epoch {
            Some(Vote::AbortEpoch)
        } else if self.forced_abort.contains_key(&tid) {
            Some(Vote::AbortForced)
        } else if !self.locks.try_lock(tid, &lock_ranges(&ep.items)) {
            Some(Vote::AbortLock)
        } else {
            None
        };
        if let Some(why) = refused {
            return self.refuse(now_ms, class, tid, why, vec![], vec![]);
        }
        let (reads, failed, bytes_read) = self.execute(&ep.items);
        self.load.at(class, now_ms).bytes_read += bytes_read;
        if !failed.is_empty() {
            return self.refuse(now_ms, class, tid, Vote::AbortCompare, reads, failed);
        }
        self.ahead
            .entry(tid)
            .or_insert(Ahead {
                items: Vec::new(),
                since_ms: now_ms,
            })
            .items
            .extend(ep.items);
        vote(Vote::CommitOk, reads, vec![], self.epoch)
    }

    fn drop_ahead(&mut self, tid: Tid) {
        self.ahead.remove(&tid);
        self.locks.release(tid);
    }

    /// Votes `why` (an abort) for `tid` and counts it: the tid keeps nothing here, neither
    /// locks nor items executed ahead (unless it is a duplicate of a prepared tid, whose
    /// locks stay with its vote).
    fn refuse(
        &mut self,
        now_ms: u64,
        class: usize,
        tid: Tid,
        why: Vote,
        reads: Vec<Vec<u8>>,
        failed_compares: Vec<u32>,
    ) -> Response {
        if !self.uncertain.contains_key(&tid) {
            self.drop_ahead(tid);
        }
        let counters = self.load.at(class, now_ms);
        match why {
            Vote::AbortLock => counters.aborted_lock += 1,
            Vote::AbortCompare => counters.aborted_compare += 1,
            _ => counters.forced_abort += 1,
        }
        vote(why, reads, failed_compares, self.epoch)
    }

    /// EXEC&PREPARE (Sinfonia Fig. 4): admit the minitransaction, execute its compares and
    /// reads, and vote; a COMMIT-OK vote in `log` mode waits for its Prepare record's sync.
    /// A single-node one that finds a lock busy waits (`Waiting`); `waiting_since` is when
    /// it began to, for one that waited already.
    fn exec_prepare(
        &mut self,
        acts: &mut Actions<R>,
        now_ms: u64,
        reply_to: R,
        id: u64,
        mut ep: ExecPrepare,
        waiting_since: Option<u64>,
    ) {
        let class = self.load.class_index(&ep.class);
        let tid = ep.tid;
        let since_ms = waiting_since.unwrap_or(now_ms);
        let woken = waiting_since.is_some() && planted(Bug::WokenWithoutLocks);
        match self.admit(now_ms, class, &mut ep) {
            Ok(()) => {}
            Err(Refusal::Busy) if woken => {}
            Err(Refusal::Busy) if self.may_wait(&ep, since_ms, now_ms) => {
                let waiting = Waiting {
                    reply_to,
                    id,
                    ep,
                    since_ms,
                };
                self.waiting.push_back(waiting);
                return;
            }
            Err(Refusal::Busy) => {
                let refusal = self.refuse(now_ms, class, tid, Vote::AbortLock, vec![], vec![]);
                acts.replies.push((reply_to, id, refusal));
                return;
            }
            Err(Refusal::Reply(refusal)) => {
                acts.replies.push((reply_to, id, refusal));
                return;
            }
        }
        let (reads, failed, bytes_read) = self.execute(&ep.items);
        self.load.at(class, now_ms).bytes_read += bytes_read;
        if !failed.is_empty() {
            let refusal = self.refuse(now_ms, class, tid, Vote::AbortCompare, reads, failed);
            acts.replies.push((reply_to, id, refusal));
            return;
        }
        let ok = VoteReply {
            vote: Vote::CommitOk,
            reads,
            failed_compares: vec![],
            epoch: self.epoch,
            lsn: 0,
        };
        let entry = Uncertain {
            writes: self.resolve_writes(&ep.items),
            participants: ep.participants,
            lsn: None,
            since_ms: now_ms,
            class,
        };
        if ep.read_only || self.cfg.mode == Mode::Ram {
            self.vote_in_memory(acts, tid, entry, ok, ep.read_only, (reply_to, id));
        } else {
            self.vote_after_logging(acts, tid, entry, ok, (reply_to, id));
        }
    }

    /// Whether `ep` may wait for its busy locks: it touches this node alone, executed
    /// nothing ahead (so it holds nothing here), and has not waited its `lock_wait_ms` yet.
    fn may_wait(&self, ep: &ExecPrepare, since_ms: u64, now_ms: u64) -> bool {
        ep.participants == [self.cfg.id] && ep.executed == 0 && now_ms < wait_until_ms(ep, since_ms)
    }

    /// Runs the waiting minitransactions, in arrival order, once something freed locks,
    /// and refuses those that waited their `lock_wait_ms`; after every step that may do
    /// either.
    fn run_waiting(&mut self, acts: &mut Actions<R>, now_ms: u64) {
        while !self.waiting.is_empty() {
            let freed = self.locks.take_freed();
            let expired = self.waiting.iter().any(|w| now_ms >= w.until_ms());
            if !freed && !expired {
                return;
            }
            for w in std::mem::take(&mut self.waiting) {
                if self.stage != Stage::Serving {
                    let refusal = error(ErrorCode::NotReady, "node is recovering".into());
                    acts.replies.push((w.reply_to, w.id, refusal));
                    continue;
                }
                self.exec_prepare(acts, now_ms, w.reply_to, w.id, w.ep, Some(w.since_ms));
            }
        }
    }

    /// When the first minitransaction waiting for locks has waited its `lock_wait_ms`: the
    /// driver calls `tick` then, in case nothing else happens on the node before.
    pub fn waiting_until(&self) -> Option<u64> {
        self.waiting.iter().map(Waiting::until_ms).min()
    }

    /// Refuses the minitransactions that waited for locks their `lock_wait_ms` (and runs
    /// those whose locks were freed).
    pub fn tick(&mut self, now_ms: u64) -> Actions<R> {
        let mut acts = Actions::default();
        self.run_waiting(&mut acts, now_ms);
        acts
    }

    /// Whether `ep` may execute: its epoch is current enough, its tid new, what it executed
    /// ahead still here and within limits, its locks free, and it was not forced to abort.
    /// Takes its locks and prepends the items executed ahead; `Err` says why not otherwise
    /// (`Busy`: a lock is, and the caller decides whether `ep` waits).
    fn admit(&mut self, now_ms: u64, class: usize, ep: &mut ExecPrepare) -> Result<(), Refusal> {
        let tid = ep.tid;
        if tid.epoch + 2 <= self.epoch {
            let refusal = self.refuse(now_ms, class, tid, Vote::AbortEpoch, vec![], vec![]);
            return Err(Refusal::Reply(refusal));
        }
        if self.uncertain.contains_key(&tid) || self.log_tids.contains_key(&tid) {
            return Err(Refusal::Reply(error(
                ErrorCode::BadRequest,
                format!("tid {tid} already executed"),
            )));
        }
        let executed = self.ahead.remove(&tid).map_or(0, |ahead| {
            let n = ahead.items.len();
            ep.items.splice(..0, ahead.items);
            n
        });
        if executed > 0 {
            if let Err(message) = self.cfg.limits.check(ep.items.iter()) {
                self.locks.release(tid);
                return Err(Refusal::Reply(error(ErrorCode::BadRequest, message)));
            }
        }
        // What was executed ahead may be gone (a restart, the timeout, a refusal): abort.
        let lost_ahead = executed != ep.executed as usize && !planted(Bug::IgnoreExecutedCount);
        let refused = if lost_ahead {
            Some(Vote::AbortForced)
        } else if !self.locks.try_lock(tid, &lock_ranges(&ep.items)) {
            return Err(Refusal::Busy);
        } else if self.forced_abort.contains_key(&tid) && !planted(Bug::SkipForcedAbortCheck) {
            Some(Vote::AbortForced)
        } else {
            None
        };
        match refused {
            Some(why) => Err(Refusal::Reply(self.refuse(
                now_ms,
                class,
                tid,
                why,
                vec![],
                vec![],
            ))),
            None => Ok(()),
        }
    }

    /// COMMIT-OK with nothing to log (`ram` mode, or a read-only minitransaction): a
    /// single-node one commits at once (`entry.since_ms` is now); otherwise the tid waits
    /// for its decision.
    fn vote_in_memory(
        &mut self,
        acts: &mut Actions<R>,
        tid: Tid,
        entry: Uncertain,
        ok: VoteReply,
        read_only: bool,
        (reply_to, id): (R, u64),
    ) {
        if entry.participants == [self.cfg.id] {
            self.commit_applied(entry.since_ms, tid, &entry);
        } else {
            if !read_only {
                // Ram mode keeps all-log-tids in memory only, for REQUEST-ABORT.
                let participants = entry.participants.clone();
                self.log_tids
                    .insert(tid, LogTid::prepared(0, participants, Outcome::Unknown));
            }
            if planted(Bug::ReleaseReadsAtEveryVote) {
                self.locks.release_reads(tid);
            }
            self.uncertain.insert(tid, entry);
        }
        acts.replies.push((reply_to, id, Response::Vote(ok)));
    }

    /// COMMIT-OK in `log` mode: the Prepare record is appended and the vote (or, for a
    /// single-node minitransaction, the commit and its reply) waits for its sync.
    ///
    /// A single-node minitransaction gives up its read locks here, keeping its write locks
    /// until its record is synced (early lock release): it took every lock it will ever
    /// take in this one step, so a later writer of what it read is serialised after it; that
    /// writer saw none of its writes (still locked), so if a crash loses this record and
    /// keeps the writer's, the writer alone is still a serial history. Without it, a word
    /// that every append compares (a log's epoch and trim point) stayed read-locked across
    /// back-to-back group commits, and a seal or a trim, which must write it, lost every
    /// try. A multi-node minitransaction keeps its read locks until the decision: it may
    /// take locks on another node after this vote.
    fn vote_after_logging(
        &mut self,
        acts: &mut Actions<R>,
        tid: Tid,
        mut entry: Uncertain,
        mut ok: VoteReply,
        (reply_to, id): (R, u64),
    ) {
        let single = entry.participants == [self.cfg.id];
        let lsn = self.append(
            acts,
            LogRecord::Prepare {
                tid,
                participants: entry.participants.clone(),
                writes: entry.writes.clone(),
            },
        );
        entry.lsn = Some(lsn);
        ok.lsn = lsn;
        let ok = Response::Vote(ok);
        let participants = entry.participants.clone();
        self.log_tids
            .insert(tid, LogTid::prepared(lsn, participants, Outcome::Unknown));
        self.by_lsn.insert(lsn, tid);
        self.uncertain.insert(tid, entry);
        if single || planted(Bug::ReleaseReadsAtEveryVote) {
            self.locks.release_reads(tid);
        }
        if single {
            self.after(acts, lsn, Deferred::OnePhase(tid, reply_to, id, ok));
        } else if planted(Bug::CommitOkBeforeSync) {
            acts.replies.push((reply_to, id, ok));
        } else {
            self.after(acts, lsn, Deferred::Reply(reply_to, id, ok));
        }
    }

    /// Compares and reads against the state before the minitransaction.
    fn execute(&self, items: &[Item]) -> (Vec<Vec<u8>>, Vec<u32>, u64) {
        let (mut reads, mut failed, mut bytes) = (Vec::new(), Vec::new(), 0);
        for (i, item) in items.iter().enumerate() {
            match item {
                Item::Read { addr, len } => {
                    reads.push(self.space.read(*addr, u64::from(*len)).to_vec());
                    bytes += u64::from(*len);
                }
                Item::Compare {
                    addr,
                    op,
                    bytes: operand,
                } => {
                    let stored_len = if *op == tutti_wire::CmpOp::Eq {
                        operand.len()
                    } else {
                        8
                    };
                    if !op.holds(self.space.read(*addr, stored_len as u64), operand) {
                        failed.push(i as u32);
                    }
                    bytes += stored_len as u64;
                }
                Item::Write { .. } | Item::Add { .. } => {}
            }
        }
        (reads, failed, bytes)
    }

    /// Turns writes and adds, in item order, into plain writes (so replay is idempotent).
    fn resolve_writes(&self, items: &[Item]) -> Writes {
        let mut writes: Writes = Vec::new();
        for item in items {
            match item {
                Item::Write { addr, bytes } => writes.push((*addr, bytes.clone())),
                Item::Add { addr, delta } => {
                    let mut current: [u8; 8] =
                        self.space.read(*addr, 8).try_into().expect("8 bytes");
                    for (waddr, wbytes) in &writes {
                        overlay(&mut current, *addr, *waddr, wbytes);
                    }
                    let sum = i64::from_le_bytes(current).wrapping_add(*delta);
                    writes.push((*addr, sum.to_le_bytes().to_vec()));
                }
                Item::Read { .. } | Item::Compare { .. } => {}
            }
        }
        writes
    }

    fn commit_applied(&mut self, now_ms: u64, tid: Tid, entry: &Uncertain) {
        let mut written = 0;
        for (addr, bytes) in &entry.writes {
            self.space.write(*addr, bytes);
            written += bytes.len() as u64;
        }
        let load = self.load.at(entry.class, now_ms);
        load.committed += 1;
        load.bytes_written += written;
        self.locks.release(tid);
    }

    /// Phase 2 of Fig. 4 (lines 26–31).
    fn decision(&mut self, acts: &mut Actions<R>, now_ms: u64, decision: Decision) {
        if self.ahead.contains_key(&decision.tid) {
            // Executed ahead and never prepared: only an abort can come, and it frees the locks.
            self.drop_ahead(decision.tid);
            return;
        }
        let Some(entry) = self.uncertain.get(&decision.tid) else {
            return;
        };
        if let Some(lsn) = entry.lsn.filter(|&lsn| lsn > self.synced_lsn) {
            // Only a misbehaving sender decides before our vote is durable; wait for it.
            self.after(acts, lsn, Deferred::Decision(decision));
            return;
        }
        let Decision { tid, commit, lsns } = decision;
        let entry = self.uncertain.remove(&tid).expect("present");
        if commit {
            self.commit_applied(now_ms, tid, &entry);
        } else {
            self.locks.release(tid);
        }
        if self.cfg.mode == Mode::Ram {
            self.log_tids.remove(&tid);
        } else if let Some(t) = self.log_tids.get_mut(&tid) {
            t.outcome = if commit {
                Outcome::Commit
            } else {
                Outcome::Abort
            };
            if commit {
                let me = t.participants.iter().position(|&q| q == self.cfg.id);
                // Lsns that disagree with this node's own record are not trusted: the tid
                // then takes the per-tid report.
                if lsns.len() == t.participants.len() && me.is_some_and(|i| lsns[i] == t.lsn) {
                    t.lsns = lsns;
                }
                self.applied_unflushed.push(tid);
            }
            self.append(acts, LogRecord::Decided { tid, commit });
        }
    }

    /// Fig. 7 lines 37–41, batched: a node with a commit vote keeps it; otherwise it is
    /// forced to abort (synced before the reply leaves).
    fn request_abort(
        &mut self,
        acts: &mut Actions<R>,
        reply_to: R,
        id: u64,
        tids: Vec<(Tid, Vec<NodeId>)>,
    ) {
        if tids.len() > BATCH_TIDS_MAX {
            acts.replies.push((
                reply_to,
                id,
                error(
                    ErrorCode::BadRequest,
                    format!("more than {BATCH_TIDS_MAX} tids"),
                ),
            ));
            return;
        }
        let mut votes = Vec::with_capacity(tids.len());
        for (tid, _) in tids {
            // A read-only participant's commit vote is not logged but held (with its locks)
            // in uncertain: it has chosen its vote, so it keeps it (Fig. 7).
            if self.log_tids.contains_key(&tid) || self.uncertain.contains_key(&tid) {
                votes.push((tid, true));
                continue;
            }
            votes.push((tid, false));
            let stale = tid.epoch + 2 <= self.epoch;
            if !stale && !self.forced_abort.contains_key(&tid) {
                let lsn = match self.cfg.mode {
                    Mode::Ram => 0,
                    Mode::Log => self.append(acts, LogRecord::ForcedAbort { tid }),
                };
                self.forced_abort.insert(tid, lsn);
            }
        }
        let lsn = self.votes_lsn;
        self.after(
            acts,
            lsn,
            Deferred::Reply(reply_to, id, Response::Votes(votes)),
        );
    }

    /// The log writer synced every record up to `upto`.
    pub fn on_synced(&mut self, now_ms: u64, upto: Lsn) -> Actions<R> {
        let mut acts = Actions::default();
        self.synced_lsn = self.synced_lsn.max(upto);
        while self
            .deferred
            .front()
            .is_some_and(|(lsn, _)| *lsn <= self.synced_lsn)
        {
            let (_, deferred) = self.deferred.pop_front().expect("front");
            match deferred {
                Deferred::Reply(to, id, resp) => acts.replies.push((to, id, resp)),
                Deferred::OnePhase(tid, to, id, resp) => {
                    let entry = self
                        .uncertain
                        .remove(&tid)
                        .expect("one-phase tid is uncertain until synced");
                    self.commit_applied(now_ms, tid, &entry);
                    self.log_tids.get_mut(&tid).expect("logged").outcome = Outcome::Commit;
                    self.applied_unflushed.push(tid);
                    acts.replies.push((to, id, resp));
                }
                Deferred::Decision(decision) => self.decision(&mut acts, now_ms, decision),
            }
        }
        self.run_waiting(&mut acts, now_ms);
        acts
    }

    fn append(&mut self, acts: &mut Actions<R>, record: LogRecord) -> Lsn {
        assert_eq!(self.cfg.mode, Mode::Log, "ram mode never logs");
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        if record.needs_sync() {
            self.votes_lsn = lsn;
        }
        acts.append.push((lsn, record));
        lsn
    }

    fn after(&mut self, acts: &mut Actions<R>, lsn: Lsn, deferred: Deferred<R>) {
        if lsn <= self.synced_lsn && self.deferred.is_empty() {
            if let Deferred::Reply(to, id, resp) = deferred {
                acts.replies.push((to, id, resp));
                return;
            }
        }
        self.deferred.push_back((lsn, deferred));
    }

    /// Starts a checkpoint: the driver flushes the image and syncs the log up to `upto`,
    /// then calls `checkpoint_step` until it returns the checkpoint's actions.
    pub fn checkpoint_begin(&mut self) -> Checkpoint {
        Checkpoint {
            tids: std::mem::take(&mut self.applied_unflushed),
            upto: self.next_lsn - 1,
            work: CheckpointWork::Mark { next: 0 },
        }
    }

    /// Goes on with `cp`, whose tids are in the durable image, for at most
    /// `checkpoint_step_tids` tids: applies the GC rule (§4.6) to the log head, moves
    /// `applied_below`, collects stale forced-aborts and carries live ones past the new
    /// head. `Some(actions)` once the checkpoint is complete. Other requests may be handled
    /// between steps: each stage only ever concludes what stays true when they are.
    pub fn checkpoint_step(&mut self, cp: &mut Checkpoint) -> Option<Actions<R>> {
        // Every outcome it marks must be durable first: a replicated primary hears its
        // records synced only once its mirror holds them too (`log-repl`), and a tid
        // reported applied here is collected by its peers, so a mirror taking over without
        // its `Decided` record would ask them in vain and abort it.
        if self.synced_lsn < cp.upto {
            return None;
        }
        let mut budget = self.cfg.checkpoint_step_tids.max(1);
        loop {
            match cp.work {
                CheckpointWork::Mark { next } => {
                    let end = cp.tids.len().min(next + budget);
                    for tid in &cp.tids[next..end] {
                        self.mark_durable(*tid);
                    }
                    budget -= end - next;
                    cp.work = if end == cp.tids.len() {
                        CheckpointWork::Collect
                    } else {
                        CheckpointWork::Mark { next: end }
                    };
                }
                CheckpointWork::Collect => {
                    if !self.collect_head(&mut budget) {
                        return None;
                    }
                    let head = self.log_head();
                    // Everything below the head was collected, so applied, and the mark
                    // never goes back: only the tids from the later of the two on count.
                    let from = self.applied_below.max(head);
                    let bound = self.next_lsn;
                    cp.work = CheckpointWork::Scan { head, from, bound };
                }
                CheckpointWork::Scan { head, from, bound } => {
                    if planted(Bug::AppliedBelowBeforeScan) {
                        self.applied_below = bound;
                    }
                    match self.first_unapplied(from, bound, &mut budget) {
                        Scanned::Unapplied(lsn) => self.applied_below = lsn,
                        Scanned::AllApplied => self.applied_below = bound,
                        Scanned::NotYet(next) => {
                            cp.work = CheckpointWork::Scan {
                                head,
                                from: next,
                                bound,
                            };
                            return None;
                        }
                    }
                    cp.work = CheckpointWork::Finish { head };
                }
                CheckpointWork::Finish { head } => return Some(self.carry_and_truncate(head)),
            }
            if budget == 0 {
                return None;
            }
        }
    }

    fn mark_durable(&mut self, tid: Tid) {
        if let Some(t) = self.log_tids.get_mut(&tid) {
            t.durable = true;
            if t.participants.len() == 1 || planted(Bug::GcBeforeAllApplied) {
                t.gc_ok = true;
            } else if !t.gc_ok && t.lsns.is_empty() {
                // Already confirmed when the manager's relay outran this node's replay
                // after a restart: a report now would wait forever for peers that
                // collected the tid long ago.
                queue_report(&mut self.to_report, tid, &t.participants);
            }
        }
    }

    /// Collects dead Prepare records at the head of the log, at most `budget` of them;
    /// true once the head is live (or the log empty).
    fn collect_head(&mut self, budget: &mut usize) -> bool {
        while let Some((&lsn, &tid)) = self.by_lsn.first_key_value() {
            let t = &self.log_tids[&tid];
            assert_eq!(t.lsn, lsn);
            let dead = match t.outcome {
                Outcome::Unknown => false,
                Outcome::Abort => true,
                Outcome::Commit => t.gc_ok || (t.durable && self.applied_by_all(t)),
            };
            if !dead {
                return true;
            }
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            self.by_lsn.pop_first();
            self.log_tids.remove(&tid);
        }
        true
    }

    /// The lsn of the oldest live Prepare record, or the next lsn if there is none.
    fn log_head(&self) -> Lsn {
        self.by_lsn
            .first_key_value()
            .map_or(self.next_lsn, |(&lsn, _)| lsn)
    }

    /// The first tid in `[from, bound)` not applied to the durable image, looking at most
    /// at `budget` tids.
    fn first_unapplied(&self, from: Lsn, bound: Lsn, budget: &mut usize) -> Scanned {
        for (&lsn, tid) in self.by_lsn.range(from..bound) {
            if *budget == 0 {
                return Scanned::NotYet(lsn);
            }
            *budget -= 1;
            let t = &self.log_tids[tid];
            let applied = match t.outcome {
                Outcome::Unknown => false,
                Outcome::Abort => true,
                Outcome::Commit => t.durable,
            };
            if !applied {
                return Scanned::Unapplied(lsn);
            }
        }
        Scanned::AllApplied
    }

    /// The last stage of a checkpoint: drops forced-aborts two epochs old, appends again
    /// the live ones (and the epoch record) far behind `head`, and truncates below what
    /// is left.
    fn carry_and_truncate(&mut self, head: Lsn) -> Actions<R> {
        let mut acts = Actions::default();
        let epoch = self.epoch;
        self.forced_abort.retain(|tid, _| tid.epoch + 2 > epoch);
        // Forced-aborts and the epoch must outlive the records around them. Far behind the
        // head they are appended again so that old segments can go; near it, truncation
        // simply stops at them (no rewrite on every checkpoint of an idle node).
        let carry_below = head
            .saturating_sub(CARRY_DISTANCE_RECORDS)
            .max(self.log.current_segment_first_lsn.min(head));
        let carried = sorted(
            self.forced_abort
                .iter()
                .filter(|(_, &lsn)| lsn < carry_below)
                .map(|(t, _)| *t),
        );
        for tid in carried {
            let lsn = self.append(&mut acts, LogRecord::ForcedAbort { tid });
            self.forced_abort.insert(tid, lsn);
        }
        if self.epoch_lsn != 0 && self.epoch_lsn < carry_below {
            self.epoch_lsn = self.append(&mut acts, LogRecord::Epoch { epoch: self.epoch });
        }
        let kept = self
            .forced_abort
            .values()
            .copied()
            .chain((self.epoch_lsn != 0).then_some(self.epoch_lsn));
        acts.truncate_below = Some(kept.fold(head, Lsn::min));
        acts
    }

    /// The coordinator told every participant's Prepare lsn, and each other participant's
    /// `applied_below` has passed its own: all of them applied the tid.
    fn applied_by_all(&self, t: &LogTid) -> bool {
        !t.lsns.is_empty()
            && (t.participants.iter().zip(&t.lsns)).all(|(q, lsn)| {
                *q == self.cfg.id
                    || self.peers_applied_below.get(q).is_some_and(|b| {
                        b > lsn || (b == lsn && planted(Bug::AppliedBelowInclusive))
                    })
            })
    }

    /// What the heartbeat tells the manager: tids uncertain for longer than the timeout
    /// (for its recovery coordinator) and newly durable multi-node tids (for GC).
    pub fn heartbeat(&mut self, now_ms: u64) -> HeartbeatReport {
        let timeout = self.cfg.timeout_uncertain_ms;
        // Items executed ahead by a coordinator that never prepared (it crashed, say).
        let abandoned: Vec<Tid> = self
            .ahead
            .iter()
            .filter(|(_, a)| now_ms.saturating_sub(a.since_ms) >= timeout)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in abandoned {
            self.drop_ahead(tid);
        }
        let mut uncertain = sorted(
            self.uncertain
                .iter()
                .filter(|(_, u)| {
                    u.participants.len() > 1 && now_ms.saturating_sub(u.since_ms) >= timeout
                })
                .map(|(tid, u)| (*tid, u.participants.clone())),
        );
        uncertain.truncate(BATCH_TIDS_MAX);
        let mut applied = Vec::new();
        let mut room = BATCH_TIDS_MAX;
        while room > 0 {
            let Some((participants, mut tids)) = self.to_report.pop_first() else {
                break;
            };
            if tids.len() > room {
                self.to_report
                    .insert(participants.clone(), tids.split_off(room));
            }
            room -= tids.len();
            for tid in &tids {
                self.reported.insert(*tid, now_ms);
            }
            applied.push(Applied { participants, tids });
        }
        HeartbeatReport {
            uncertain,
            applied,
            applied_below: self.applied_below,
        }
    }

    /// The manager relayed `gc`: every participant of these tids applied them durably.
    /// A new manager incarnation lost the reports sent before `sent_ms` (the time of the
    /// heartbeat this acknowledges), so those are sent again.
    pub fn on_heartbeat_ack(
        &mut self,
        sent_ms: u64,
        epoch: u64,
        incarnation: u64,
        gc: &[Tid],
        applied_below: &[(NodeId, Lsn)],
    ) -> Actions<R> {
        let acts = self.set_epoch(epoch);
        for &(node, below) in applied_below {
            let known = self.peers_applied_below.entry(node).or_default();
            *known = (*known).max(below);
        }
        if incarnation != self.manager_incarnation {
            self.manager_incarnation = incarnation;
            let lost = sorted(
                self.reported
                    .iter()
                    .filter(|(_, &at)| at < sent_ms)
                    .map(|(t, _)| *t),
            );
            for tid in lost {
                self.reported.remove(&tid);
                if let Some(t) = self.log_tids.get(&tid) {
                    queue_report(&mut self.to_report, tid, &t.participants);
                }
            }
        }
        for tid in gc {
            self.gc_confirmed(*tid);
        }
        acts
    }

    fn gc_confirmed(&mut self, tid: Tid) {
        self.reported.remove(&tid);
        if let Some(t) = self.log_tids.get_mut(&tid) {
            t.gc_ok = true;
        }
    }

    /// Reported tids still not collected after `age_ms`: the driver asks their peers whether
    /// they applied them, so that a relay lost with a manager crash cannot pin the log.
    /// All of them: the driver batches the questions.
    pub fn reported_older_than(&self, now_ms: u64, age_ms: u64) -> Vec<(Tid, Vec<NodeId>)> {
        sorted(
            self.reported
                .iter()
                .filter(|(_, &sent)| now_ms.saturating_sub(sent) >= age_ms)
                .map(|(tid, _)| {
                    // A tid collected meanwhile has no peers left to ask.
                    let participants = self.log_tids.get(tid).map(|t| t.participants.clone());
                    (*tid, participants.unwrap_or_default())
                }),
        )
    }

    /// Every participant of these reported tids applied them: collect them, and stop
    /// waiting for a relay (also for tids this node collected meanwhile, which would
    /// otherwise be asked about forever).
    pub fn applied_by_peers(&mut self, tids: &[Tid]) {
        for tid in tids {
            if self.reported.remove(tid).is_some() {
                self.gc_confirmed(*tid);
            }
        }
    }

    /// Serving, with no uncertain tid, no lock held and nothing waiting for one (cheap,
    /// unlike `stats`).
    pub fn idle(&self) -> bool {
        self.stage == Stage::Serving
            && self.uncertain.is_empty()
            && self.locks.holders() == 0
            && self.waiting.is_empty()
    }

    pub fn stats(&self, now_ms: u64) -> StatsReport {
        StatsReport {
            node: self.cfg.id,
            windows_s: WINDOWS_S.to_vec(),
            classes: self.load.report(now_ms),
            uncertain: self.uncertain.len() as u64,
            locks_held: self.locks.holders() as u64,
            lock_waiters: self.waiting.len() as u64,
            log_bytes: self.log.bytes,
            log_records_appended: self.log.records_appended,
            log_records_live: self.by_lsn.len() as u64,
            epoch: self.epoch,
            serving: self.stage == Stage::Serving,
            rss_bytes: self.rss_bytes,
            backup_saved_bytes: self.space.cut_saved_bytes().0,
            backup_saved_bytes_max: (self.backup_saved_bytes_max)
                .max(self.space.cut_saved_bytes().1),
            log_sync: self.log.sync,
        }
    }
}

/// Deliberate protocol bugs that prove the simulator's checkers can fail. They exist only
/// with the `planted-bugs` feature; without it `planted` is always false.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bug {
    /// EXEC&PREPARE ignores forced-abort (Fig. 4 line 17).
    SkipForcedAbortCheck,
    /// COMMIT-OK leaves before its Prepare record is synced.
    CommitOkBeforeSync,
    /// GC drops a committed tid as soon as this node applied it, not every participant.
    GcBeforeAllApplied,
    /// EXEC&PREPARE votes without the items executed ahead when they are gone.
    IgnoreExecutedCount,
    /// A peer whose `applied_below` equals its Prepare lsn counts as having applied the tid.
    AppliedBelowInclusive,
    /// A checkpoint's scan publishes `applied_below` before it has looked at every tid, so
    /// a heartbeat between two of its steps reports tids it has not applied.
    AppliedBelowBeforeScan,
    /// Every COMMIT-OK vote gives up its read locks, a multi-node minitransaction's too.
    ReleaseReadsAtEveryVote,
    /// A backup's fence answers `locked` at once, and its cut is taken while tids still
    /// hold locks (Sinfonia §4.8's phase 1 skipped): a tid may then be in one node's cut
    /// and not in another's.
    CutWithLocksHeld,
    /// A replicated primary counts a record durable once on its own disk, without waiting
    /// for its mirror's acknowledgement (`Shipper`).
    VoteBeforeMirrorAck,
    /// A promoted mirror serves before the old primary's lease has run out (`Mirror`).
    TakeOverWithinLease,
    /// A joining mirror is counted, and the manager asked to name it mirror, as soon as it
    /// asks to join, before it holds what its primary already counts durable (`Shipper`).
    JoinBeforeCaughtUp,
    /// A mirror promoted primary aborts its undecided tids without asking their other
    /// participants (`Stage2::after_promotion`).
    PromotionSkipsStage2,
    /// A node serving ahead of stage 2 leaves its undecided tids' bytes unlocked
    /// (`Participant::serve_undecided`): a minitransaction reads them before stage 2's
    /// commit writes them, and that write then overwrites its own.
    ServeUndecidedUnlocked,
    /// A `ram-repl` process restarted empty serves as the primary or mirror the placement
    /// still names it (`mirror::named_but_empty`), without the node's data.
    EmptyCopyServes,
    /// A single-node minitransaction that waited for a busy lock runs, once something
    /// freed a lock, without the locks it waited for.
    WokenWithoutLocks,
    /// Stage 2 decides a tid once a peer said it does not hold it, before that peer
    /// answered the REQUEST-ABORT (which aborts the tid there if it never voted).
    DecidedBeforeAnswered,
    /// A primary whose mirror the placement dropped counts records durable on its own disk
    /// at once, before the managers committed that it serves alone (`Shipper`): the dropped
    /// mirror, named primary if this one dies first, lacks them.
    AloneUnconfirmed,
    /// A mirror the placement no longer names empties its copy to join at once, instead of
    /// asking the managers whether the change left it out (`mirror_node::run`): the copy a
    /// stale report dropped, or a named mirror replaced before it heard, is gone when the
    /// copy serving in its place dies before it registers.
    OutsideCopyGivenUp,
}

tutti_wire::planted_bugs!(Bug);

/// Adds `tid` to the next heartbeat's report, in the group of its participant set.
fn queue_report(
    to_report: &mut BTreeMap<Vec<NodeId>, Vec<Tid>>,
    tid: Tid,
    participants: &[NodeId],
) {
    match to_report.get_mut(participants) {
        Some(tids) => tids.push(tid),
        None => {
            to_report.insert(participants.to_vec(), vec![tid]);
        }
    }
}

/// Items in order: hash-map iteration order must never reach an output, so that a
/// simulated run is the same every time for the same seed.
fn sorted<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort();
    v
}

/// Copies the part of a pending write `[waddr, +wbytes)` that overlaps the 8 bytes at `addr`.
fn overlay(current: &mut [u8; 8], addr: u64, waddr: u64, wbytes: &[u8]) {
    let (lo, hi) = (addr.max(waddr), (addr + 8).min(waddr + wbytes.len() as u64));
    for a in lo..hi {
        current[(a - addr) as usize] = wbytes[(a - waddr) as usize];
    }
}

fn error(code: ErrorCode, message: String) -> Response {
    Response::Error { code, message }
}

fn vote(vote: Vote, reads: Vec<Vec<u8>>, failed_compares: Vec<u32>, epoch: u64) -> Response {
    Response::Vote(VoteReply {
        vote,
        reads,
        failed_compares,
        epoch,
        lsn: 0,
    })
}

/// The byte ranges `items` lock: writes and adds exclusively, reads and compares shared.
/// Each range once: a compare-and-swap compares and writes the same bytes, and one write
/// lock covers both.
fn lock_ranges(items: &[Item]) -> Vec<LockRange> {
    let mut ranges: Vec<LockRange> = items
        .iter()
        .map(|item| LockRange {
            start: item.addr(),
            end: item.addr() + item.len(),
            kind: if item.writes() {
                LockKind::Write
            } else {
                LockKind::Read
            },
        })
        .collect();
    ranges.sort_unstable_by_key(|r| (r.start, r.end));
    ranges.dedup_by(|later, kept| {
        let same = (later.start, later.end) == (kept.start, kept.end);
        if same && later.kind == LockKind::Write {
            kept.kind = LockKind::Write;
        }
        same
    });
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_wire::CmpOp;

    pub(super) type P = Participant<u32>;

    pub(super) fn node(id: NodeId, mode: Mode) -> P {
        let cfg = Config {
            id,
            mode,
            timeout_uncertain_ms: 100,
            limits: Limits::default(),
            checkpoint_step_tids: CHECKPOINT_STEP_TIDS,
        };
        Participant::new(cfg, Space::anonymous(1 << 20).unwrap(), 1)
    }

    pub(super) fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 7,
            seq,
        }
    }

    /// An EXEC&PREPARE (or ExecuteAhead) body of class "t".
    fn ep(t: Tid, participants: Vec<NodeId>, read_only: bool, items: Vec<Item>) -> ExecPrepare {
        ExecPrepare {
            tid: t,
            participants,
            class: "t".into(),
            read_only,
            items,
            executed: 0,
            lock_wait_ms: LOCK_WAIT_MS_MAX,
        }
    }

    /// Phase 2 for one tid, as a coordinator sends it.
    fn decide(t: Tid, commit: bool) -> Request {
        decide_with_lsns(t, commit, vec![])
    }

    fn decide_with_lsns(t: Tid, commit: bool, lsns: Vec<Lsn>) -> Request {
        Request::Decisions(vec![Decision {
            tid: t,
            commit,
            lsns,
        }])
    }

    /// Runs the steps of checkpoint `cp` to its end.
    /// Runs `cp` to its end after the sync its driver makes first.
    fn checkpoint_done(p: &mut P, mut cp: Checkpoint) -> Actions<u32> {
        p.on_synced(0, cp.upto);
        loop {
            if let Some(acts) = p.checkpoint_step(&mut cp) {
                return acts;
            }
        }
    }

    /// Prepares, syncs and commits `(seq, participants)` tids in turn, then checkpoints.
    fn commit_and_checkpoint(p: &mut P, tids: impl IntoIterator<Item = (u64, Vec<NodeId>)>) {
        for (seq, participants) in tids {
            let a = prepare(p, tid(seq), participants, vec![write(0, 1)]);
            p.on_synced(0, a.append[0].0);
            p.on_request(0, 1, 0, decide(tid(seq), true));
        }
        let cp = p.checkpoint_begin();
        let _ = checkpoint_done(p, cp);
    }

    fn prepare(p: &mut P, t: Tid, participants: Vec<NodeId>, items: Vec<Item>) -> Actions<u32> {
        let read_only = !items.iter().any(Item::writes);
        let ep = ep(t, participants, read_only, items);
        p.on_request(0, 1, 1, Request::ExecPrepare(ep))
    }

    fn one_group(participants: Vec<NodeId>, tids: Vec<Tid>) -> Vec<Applied> {
        vec![Applied { participants, tids }]
    }

    fn vote_of(acts: &Actions<u32>) -> Vote {
        match &acts.replies[..] {
            [(_, _, Response::Vote(v))] => v.vote,
            other => panic!("expected one vote, got {}", other.len()),
        }
    }

    fn write(addr: u64, v: u64) -> Item {
        Item::Write {
            addr,
            bytes: v.to_le_bytes().to_vec(),
        }
    }

    #[test]
    fn a_compare_and_swap_takes_one_write_lock() {
        let compare = Item::Compare {
            addr: 8,
            op: CmpOp::Eq,
            bytes: vec![0; 8],
        };
        let read = Item::Read { addr: 8, len: 4 };
        let ranges = lock_ranges(&[compare, write(8, 1), read]);
        let ranges: Vec<_> = ranges.iter().map(|r| (r.start, r.end, r.kind)).collect();
        assert_eq!(
            ranges,
            vec![(8, 12, LockKind::Read), (8, 16, LockKind::Write)]
        );
    }

    #[test]
    fn one_phase_log_mode_replies_only_after_sync() {
        let mut p = node(1, Mode::Log);
        let acts = prepare(&mut p, tid(1), vec![1], vec![write(0, 5)]);
        assert!(
            acts.replies.is_empty(),
            "no COMMIT-OK before the record is synced"
        );
        assert_eq!(acts.append.len(), 1);
        assert_eq!(p.space().read(0, 8), &[0; 8], "not applied before sync");
        // A conflicting one-phase minitransaction meanwhile waits for the lock, and a
        // multi-node one finds it busy.
        let read = || vec![Item::Read { addr: 0, len: 8 }];
        assert!(prepare(&mut p, tid(2), vec![1], read()).replies.is_empty());
        let refused = prepare(&mut p, tid(3), vec![1, 2], read());
        assert_eq!(vote_of(&refused), Vote::AbortLock);
        let acts = p.on_synced(0, acts.append[0].0);
        let votes: Vec<_> = (acts.replies.iter())
            .map(|(_, _, r)| match r {
                Response::Vote(v) => (v.vote, v.reads.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        let five = 5u64.to_le_bytes().to_vec();
        assert_eq!(
            votes,
            vec![(Vote::CommitOk, vec![]), (Vote::CommitOk, vec![five])],
            "the commit, then the read that waited for it, which sees it"
        );
        assert_eq!(p.space().read(0, 8), &5u64.to_le_bytes());
        assert_eq!(p.stats(0).locks_held, 0);
        assert!(p.idle());
    }

    /// What the tests' single-node minitransactions may wait for a lock (`ep`).
    const WAIT_MS: u64 = LOCK_WAIT_MS_MAX as u64;

    #[test]
    fn waits_for_a_lock_run_in_arrival_order_and_end_after_lock_wait_ms() {
        let mut p = node(1, Mode::Log);
        // A multi-node minitransaction holds address 8 until its decision.
        let two = prepare(&mut p, tid(1), vec![1, 2], vec![write(8, 1)]);
        p.on_synced(0, two.append[0].0);
        let waiter = |p: &mut P, seq, v| {
            let ep = ep(tid(seq), vec![1], false, vec![write(8, v)]);
            assert!(p
                .on_request(1, 1, seq, Request::ExecPrepare(ep))
                .replies
                .is_empty());
        };
        waiter(&mut p, 2, 2);
        waiter(&mut p, 3, 3);
        assert_eq!(p.stats(1).lock_waiters, 2);
        assert_eq!(p.waiting_until(), Some(1 + WAIT_MS));
        assert!(p.tick(WAIT_MS).replies.is_empty(), "not waited long enough");
        // The decision frees the lock: the first waiter takes it and logs its write; the
        // second waits on, now for the first.
        let acts = p.on_request(2, 1, 0, decide(tid(1), true));
        let first = acts.append.iter().find_map(|(lsn, r)| match r {
            LogRecord::Prepare { tid: t, .. } if *t == tid(2) => Some(*lsn),
            _ => None,
        });
        let first = first.expect("the first waiter logged its write");
        let acts = p.on_synced(2, first);
        assert_eq!(acts.replies.len(), 1, "the first waiter's commit");
        assert_eq!(acts.replies[0].1, 2);
        assert_eq!(p.space().read(8, 8), &2u64.to_le_bytes());
        let acts = p.on_synced(3, acts.append[0].0);
        assert_eq!(acts.replies[0].1, 3, "then the second's");
        assert_eq!(p.space().read(8, 8), &3u64.to_le_bytes());
        // A wait that the holder outlasts ends in ABORT-LOCK.
        prepare(&mut p, tid(4), vec![1, 2], vec![write(16, 1)]);
        let ep = ep(tid(5), vec![1], false, vec![write(16, 2)]);
        assert!(p
            .on_request(10, 1, 5, Request::ExecPrepare(ep))
            .replies
            .is_empty());
        assert!(p.tick(10 + WAIT_MS - 1).replies.is_empty());
        assert_eq!(vote_of(&p.tick(10 + WAIT_MS)), Vote::AbortLock);
        assert_eq!(p.waiting_until(), None);
        assert_eq!(p.stats(10 + WAIT_MS).lock_waiters, 0);
    }

    #[test]
    fn one_phase_gives_up_its_read_locks_before_the_sync_and_two_phase_keeps_them() {
        let mut p = node(1, Mode::Log);
        let compare = |addr| Item::Compare {
            addr,
            op: CmpOp::Eq,
            bytes: vec![0; 8],
        };
        let one = prepare(&mut p, tid(1), vec![1], vec![compare(0), write(8, 5)]);
        let two = prepare(&mut p, tid(2), vec![1, 2], vec![compare(16), write(24, 5)]);
        // A multi-node minitransaction finding a lock busy votes at once (a single-node one
        // would wait for it).
        let busy =
            |p: &mut P, seq, addr| vote_of(&prepare(p, tid(seq), vec![1, 2], vec![write(addr, 1)]));
        assert_eq!(
            busy(&mut p, 3, 8),
            Vote::AbortLock,
            "written: locked to the sync"
        );
        assert_eq!(
            busy(&mut p, 4, 16),
            Vote::AbortLock,
            "read by a 2PC: locked"
        );
        // A writer of what the 1PC compared goes ahead, and its record follows the 1PC's.
        let later = prepare(&mut p, tid(5), vec![1], vec![write(0, 7)]);
        assert!(later.append[0].0 > one.append[0].0);
        let acts = p.on_synced(0, later.append[0].0);
        assert_eq!(acts.replies.len(), 3, "both 1PCs and the 2PC's vote");
        assert_eq!(p.space().read(0, 8), &7u64.to_le_bytes());
        assert_eq!(p.space().read(8, 8), &5u64.to_le_bytes());
        assert_eq!(two.append.len(), 1);
        assert_eq!(busy(&mut p, 6, 16), Vote::AbortLock, "until the decision");
    }

    #[test]
    fn two_phase_commit_and_abort() {
        let mut p = node(2, Mode::Log);
        let acts = prepare(&mut p, tid(1), vec![1, 2], vec![write(8, 9)]);
        let acts = p.on_synced(0, acts.append[0].0);
        assert_eq!(vote_of(&acts), Vote::CommitOk);
        assert_eq!(p.stats(0).uncertain, 1);
        let acts = p.on_request(0, 1, 0, decide(tid(1), true));
        assert!(matches!(
            acts.append[..],
            [(_, LogRecord::Decided { commit: true, .. })]
        ));
        assert_eq!(p.space().read(8, 8), &9u64.to_le_bytes());
        let acts = prepare(&mut p, tid(2), vec![1, 2], vec![write(8, 10)]);
        p.on_synced(0, acts.append[0].0);
        p.on_request(0, 1, 0, decide(tid(2), false));
        assert_eq!(p.space().read(8, 8), &9u64.to_le_bytes());
        let s = p.stats(0);
        assert_eq!((s.uncertain, s.locks_held), (0, 0));
    }

    #[test]
    fn vote_queries_do_not_wait_for_lazy_decided_records() {
        let mut p = node(2, Mode::Log);
        let acts = prepare(&mut p, tid(1), vec![1, 2], vec![write(8, 9)]);
        p.on_synced(0, acts.append[0].0);
        let acts = p.on_request(0, 1, 0, decide(tid(1), true));
        assert_eq!(
            acts.append.len(),
            1,
            "a Decided record, not synced on its own"
        );
        let acts = p.on_request(
            0,
            1,
            7,
            Request::RequestAbort {
                tids: vec![(tid(1), vec![1, 2])],
            },
        );
        assert!(
            matches!(&acts.replies[..], [(_, 7, Response::Votes(v))] if v == &vec![(tid(1), true)])
        );
    }

    #[test]
    fn release_says_whether_read_locks_were_still_held() {
        let mut p = node(1, Mode::Log);
        let read = || vec![Item::Read { addr: 0, len: 8 }];
        assert_eq!(
            vote_of(&prepare(&mut p, tid(1), vec![1, 2], read())),
            Vote::CommitOk
        );
        let acts = p.on_request(0, 1, 3, Request::Release { tid: tid(1) });
        assert!(matches!(
            acts.replies[..],
            [(_, 3, Response::Released { held: true })]
        ));
        assert_eq!(p.stats(0).locks_held, 0);
        // Recovery decided it first (or the node restarted): the locks were not held.
        assert_eq!(
            vote_of(&prepare(&mut p, tid(2), vec![1, 2], read())),
            Vote::CommitOk
        );
        let acts = p.on_request(
            0,
            1,
            4,
            Request::RequestAbort {
                tids: vec![(tid(2), vec![1, 2])],
            },
        );
        assert!(
            matches!(&acts.replies[..], [(_, 4, Response::Votes(v))] if v == &vec![(tid(2), true)]),
            "a chosen read-only vote is kept"
        );
        p.on_request(0, 1, 0, decide(tid(2), false));
        let acts = p.on_request(0, 1, 5, Request::Release { tid: tid(2) });
        assert!(matches!(
            acts.replies[..],
            [(_, 5, Response::Released { held: false })]
        ));
    }

    #[test]
    fn log_tids_answers_only_about_the_tids_asked() {
        let mut p = node(2, Mode::Log);
        let acts = prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)]);
        p.on_synced(0, acts.append[0].0);
        let acts = p.on_request(
            0,
            1,
            9,
            Request::LogTids {
                tids: vec![tid(1), tid(2)],
            },
        );
        assert!(matches!(&acts.replies[..], [(_, 9, Response::LogTids(t))] if t == &vec![tid(1)]));
        let too_many = vec![tid(3); BATCH_TIDS_MAX + 1];
        let acts = p.on_request(0, 1, 10, Request::LogTids { tids: too_many });
        assert!(matches!(
            acts.replies[0].2,
            Response::Error {
                code: ErrorCode::BadRequest,
                ..
            }
        ));
    }

    #[test]
    fn compares_reads_and_adds_see_the_state_before() {
        let mut p = node(1, Mode::Ram);
        prepare(&mut p, tid(1), vec![1], vec![write(0, 10)]);
        let acts = prepare(
            &mut p,
            tid(2),
            vec![1],
            vec![
                Item::Compare {
                    addr: 0,
                    op: CmpOp::Ge,
                    bytes: 10u64.to_le_bytes().to_vec(),
                },
                Item::Read { addr: 0, len: 8 },
                Item::Add { addr: 0, delta: -3 },
                Item::Add { addr: 0, delta: -3 },
            ],
        );
        match &acts.replies[0].2 {
            Response::Vote(v) => assert_eq!(v.reads, vec![10u64.to_le_bytes().to_vec()]),
            _ => panic!(),
        }
        assert_eq!(p.space().read(0, 8), &4u64.to_le_bytes());
        let acts = prepare(
            &mut p,
            tid(3),
            vec![1],
            vec![
                Item::Compare {
                    addr: 0,
                    op: CmpOp::Gt,
                    bytes: 4u64.to_le_bytes().to_vec(),
                },
                write(0, 0),
            ],
        );
        assert_eq!(vote_of(&acts), Vote::AbortCompare);
        assert_eq!(p.space().read(0, 8), &4u64.to_le_bytes());
    }

    #[test]
    fn request_abort_forces_abort_of_unvoted_and_keeps_commit_votes() {
        let mut p = node(1, Mode::Log);
        let acts = prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)]);
        let lsn1 = acts.append[0].0;
        let acts = p.on_request(
            0,
            9,
            5,
            Request::RequestAbort {
                tids: vec![(tid(1), vec![1, 2]), (tid(2), vec![1, 2])],
            },
        );
        assert!(
            matches!(acts.append[..], [(_, LogRecord::ForcedAbort { .. })]),
            "forced-abort is logged"
        );
        assert!(acts.replies.is_empty(), "votes wait for the sync");
        let acts = p.on_synced(0, lsn1 + 1);
        let votes = acts.replies.iter().find_map(|(_, _, r)| match r {
            Response::Votes(v) => Some(v.clone()),
            _ => None,
        });
        assert_eq!(votes.unwrap(), vec![(tid(1), true), (tid(2), false)]);
        // The slow original coordinator now arrives for tid 2: it must abort.
        assert_eq!(
            vote_of(&prepare(&mut p, tid(2), vec![1, 2], vec![write(64, 1)])),
            Vote::AbortForced
        );
    }

    #[test]
    fn stale_epoch_votes_abort_and_stale_forced_aborts_are_collected() {
        let mut p = node(1, Mode::Ram);
        p.on_request(
            0,
            9,
            5,
            Request::RequestAbort {
                tids: vec![(tid(3), vec![1, 2])],
            },
        );
        let _ = p.set_epoch(3);
        assert_eq!(
            vote_of(&prepare(&mut p, tid(4), vec![1], vec![write(0, 1)])),
            Vote::AbortEpoch
        );
        let fresh = Tid { epoch: 2, ..tid(5) };
        assert_eq!(
            vote_of(&prepare(&mut p, fresh, vec![1], vec![write(0, 1)])),
            Vote::CommitOk
        );
        let cp = p.checkpoint_begin();
        checkpoint_done(&mut p, cp);
        assert!(p.forced_abort.is_empty());
    }

    #[test]
    fn the_epoch_survives_a_restart_so_skipped_forced_aborts_stay_safe() {
        let mut p = node(1, Mode::Log);
        let acts = p.set_epoch(3);
        let records: Vec<(Lsn, LogRecord)> = acts.append.clone();
        assert_eq!(records, vec![(1, LogRecord::Epoch { epoch: 3 })]);
        // A RequestAbort for an epoch-1 tid records no forced-abort (it is stale) ...
        let acts = p.on_request(
            0,
            1,
            2,
            Request::RequestAbort {
                tids: vec![(tid(1), vec![1, 2])],
            },
        );
        assert!(acts.append.is_empty());
        // ... so after a restart the node must still know the epoch, or a late EXEC&PREPARE
        // of that tid would vote COMMIT-OK.
        let mut p = recovered(records);
        p.finish_recovery(0);
        assert_eq!(
            vote_of(&prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)])),
            Vote::AbortEpoch
        );
    }

    #[test]
    fn recovery_replays_committed_in_log_order_and_asks_only_for_undecided() {
        let records = vec![
            (
                1,
                LogRecord::Prepare {
                    tid: tid(1),
                    participants: vec![1],
                    writes: vec![(0, vec![1])],
                },
            ),
            (
                2,
                LogRecord::Prepare {
                    tid: tid(2),
                    participants: vec![1, 2],
                    writes: vec![(0, vec![2])],
                },
            ),
            (
                3,
                LogRecord::Decided {
                    tid: tid(2),
                    commit: true,
                },
            ),
            (
                4,
                LogRecord::Prepare {
                    tid: tid(3),
                    participants: vec![1, 2],
                    writes: vec![(0, vec![3])],
                },
            ),
            (
                5,
                LogRecord::Prepare {
                    tid: tid(4),
                    participants: vec![1, 3],
                    writes: vec![(0, vec![4])],
                },
            ),
            (6, LogRecord::ForcedAbort { tid: tid(9) }),
        ];
        let mut p = recovered(records);
        assert_eq!(p.stage(), Stage::Recovering);
        let acts = p.on_request(
            0,
            1,
            1,
            Request::ExecPrepare(ExecPrepare {
                tid: tid(10),
                participants: vec![1],
                class: String::new(),
                read_only: true,
                items: vec![Item::Read { addr: 0, len: 1 }],
                executed: 0,
                lock_wait_ms: 0,
            }),
        );
        assert!(matches!(
            acts.replies[0].2,
            Response::Error {
                code: ErrorCode::NotReady,
                ..
            }
        ));
        assert_eq!(
            p.undecided().iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![tid(3), tid(4)]
        );
        assert!(
            !p.serve_undecided(0),
            "tid 3 must be replayed before tid 4, whose bytes it shares: stage 2 first"
        );
        assert_eq!(p.stage(), Stage::Recovering);
        let acts = p.resolve(0, &[(tid(3), true), (tid(4), false)]);
        assert_eq!(acts.append.len(), 2);
        p.finish_recovery(0);
        assert_eq!(
            p.space().read(0, 1),
            &[3],
            "1, 2 and 3 committed, in log order; 4 aborted"
        );
        assert_eq!(
            vote_of(&prepare(&mut p, tid(9), vec![1, 2], vec![write(8, 1)])),
            Vote::AbortForced
        );
    }

    /// Node 1 after a restart over `records` (stage 1 done).
    fn recovered(records: Vec<(Lsn, LogRecord)>) -> P {
        let cfg = Config {
            id: 1,
            mode: Mode::Log,
            timeout_uncertain_ms: 100,
            limits: Limits::default(),
            checkpoint_step_tids: CHECKPOINT_STEP_TIDS,
        };
        let next = records.last().map_or(1, |r| r.0 + 1);
        Participant::recover(cfg, Space::anonymous(4096).unwrap(), next, records)
    }

    fn prepare_record(seq: u64, participants: Vec<NodeId>, addr: u64) -> LogRecord {
        LogRecord::Prepare {
            tid: tid(seq),
            participants,
            writes: vec![(addr, vec![seq as u8; 8])],
        }
    }

    #[test]
    fn a_restart_serves_before_stage_2_with_the_undecided_bytes_locked() {
        let mut p = recovered(vec![
            (1, prepare_record(1, vec![1, 2], 0)),
            (2, prepare_record(2, vec![1, 2], 16)),
            (3, prepare_record(3, vec![1], 32)),
        ]);
        assert!(p.serve_undecided(0));
        assert_eq!(p.stage(), Stage::Serving);
        assert_eq!(p.space().read(32, 1), &[3], "one-phase tid 3 is replayed");
        assert_eq!(p.space().read(0, 1), &[0], "tid 1 waits for stage 2");
        // Other bytes are served at once; the undecided tids' bytes are locked.
        let other = prepare(&mut p, tid(10), vec![1], vec![write(64, 1)]);
        assert_eq!(vote_of(&p.on_synced(0, other.append[0].0)), Vote::CommitOk);
        let busy = prepare(&mut p, tid(11), vec![1, 2], vec![write(0, 1)]);
        assert_eq!(vote_of(&busy), Vote::AbortLock);
        // The peers may ask: this node holds both votes.
        let acts = p.on_request(
            0,
            1,
            2,
            Request::RequestAbort {
                tids: vec![(tid(1), vec![1, 2]), (tid(2), vec![1, 2])],
            },
        );
        assert!(
            matches!(&acts.replies[..], [(_, _, Response::Votes(v))] if v.iter().all(|v| v.1)),
            "{:?}",
            acts.replies
        );
        let acts = p.resolve(0, &[(tid(1), true), (tid(2), false)]);
        assert_eq!(acts.append.len(), 2, "both outcomes are logged");
        assert_eq!(p.space().read(0, 1), &[1], "tid 1 committed");
        assert_eq!(p.space().read(16, 1), &[0], "tid 2 aborted");
        let free = prepare(&mut p, tid(12), vec![1, 2], vec![write(0, 1)]);
        let free = p.on_synced(0, free.append[0].0);
        assert_eq!(vote_of(&free), Vote::CommitOk, "the locks are free");
    }

    #[test]
    fn an_undecided_tid_whose_bytes_a_later_tid_wrote_waits_for_stage_2() {
        // Tid 3 locked tid 1's bytes, so tid 1 was decided first; its `Decided` was lost.
        let mut p = recovered(vec![
            (1, prepare_record(1, vec![1, 2], 0)),
            (2, prepare_record(3, vec![1], 4)),
        ]);
        assert!(!p.serve_undecided(0));
        assert_eq!(p.stage(), Stage::Recovering);
        let _ = p.resolve(0, &[(tid(1), true)]);
        p.finish_recovery(0);
        assert_eq!(p.space().read(0, 12), &[1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3]);
    }

    #[test]
    fn gc_frees_the_log_head_only_when_every_participant_applied() {
        let mut p = node(1, Mode::Log);
        let a = prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)]);
        p.on_synced(0, a.append[0].0);
        p.on_request(0, 1, 0, decide(tid(1), true));
        let b = prepare(&mut p, tid(2), vec![1], vec![write(8, 1)]);
        p.on_synced(0, b.append[0].0);
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        assert_eq!(acts.truncate_below, Some(1), "tid 1 waits for node 2");
        let report = p.heartbeat(0);
        assert_eq!(report.applied, one_group(vec![1, 2], vec![tid(1)]));
        let _ = p.on_heartbeat_ack(1, 1, 42, &[tid(1)], &[]);
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        assert_eq!(
            acts.truncate_below,
            Some(4),
            "everything but the epoch record (lsn 4) is collectable"
        );
        assert_eq!(p.stats(0).log_records_live, 0);
    }

    #[test]
    fn with_every_participants_lsn_gc_waits_only_for_the_peers_applied_below() {
        let mut p = node(1, Mode::Log);
        let a = prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)]);
        let lsn = a.append[0].0;
        let voted = p.on_synced(0, lsn);
        assert!(matches!(&voted.replies[..], [(_, _, Response::Vote(v))] if v.lsn == lsn));
        let b = prepare(&mut p, tid(2), vec![1, 2], vec![write(8, 1)]);
        p.on_synced(0, b.append[0].0);
        p.on_request(0, 1, 0, decide_with_lsns(tid(1), true, vec![lsn, 50]));
        let c = prepare(&mut p, tid(3), vec![1, 2], vec![write(16, 1)]);
        p.on_synced(0, c.append[0].0);
        p.on_request(0, 1, 0, decide_with_lsns(tid(3), true, vec![lsn, 51]));
        let cp = p.checkpoint_begin();
        assert_eq!(checkpoint_done(&mut p, cp).truncate_below, Some(lsn));
        let report = p.heartbeat(0);
        assert_eq!(
            report.applied,
            one_group(vec![1, 2], vec![tid(3)]),
            "tid 3's lsns disagree with this node's own: it is reported on its own"
        );
        assert_eq!(report.applied_below, b.append[0].0, "tid 2 is undecided");
        let _ = p.on_heartbeat_ack(1, 1, 42, &[], &[(2, 50)]);
        let cp = p.checkpoint_begin();
        assert_eq!(
            checkpoint_done(&mut p, cp).truncate_below,
            Some(lsn),
            "node 2 has not applied past its lsn 50"
        );
        let _ = p.on_heartbeat_ack(2, 1, 42, &[], &[(2, 51), (1, 1)]);
        let _ = p.on_heartbeat_ack(3, 1, 42, &[], &[(2, 20)]);
        let cp = p.checkpoint_begin();
        assert_eq!(
            checkpoint_done(&mut p, cp).truncate_below,
            Some(b.append[0].0),
            "tid 1 is collected; a lower report later does not take it back"
        );
        p.on_request(0, 1, 0, decide(tid(2), false));
        let cp = p.checkpoint_begin();
        let _ = checkpoint_done(&mut p, cp);
        assert_eq!(p.heartbeat(0).applied_below, p.next_lsn);
    }

    /// A checkpoint in one-tid steps ends where a whole one does, and a heartbeat between
    /// its steps reports no more than the scan has confirmed.
    #[test]
    fn a_checkpoint_in_steps_publishes_applied_below_only_once_its_scan_ends() {
        let run = |step_tids: usize| {
            let mut p = Participant::new(
                Config {
                    checkpoint_step_tids: step_tids,
                    ..node(1, Mode::Log).cfg
                },
                Space::anonymous(1 << 20).unwrap(),
                1,
            );
            // Tids 1–6 committed on two nodes (not collectable yet), 7 undecided, 8 committed.
            let mut lsns = Vec::new();
            for seq in 1..=8 {
                let a = prepare(&mut p, tid(seq), vec![1, 2], vec![write(seq * 8, 1)]);
                lsns.push(a.append[0].0);
                p.on_synced(0, a.append[0].0);
                if seq != 7 {
                    p.on_request(0, 1, 0, decide(tid(seq), true));
                }
            }
            let before = p.heartbeat(0).applied_below;
            let mut cp = p.checkpoint_begin();
            p.on_synced(0, cp.upto);
            let mut steps = 0;
            let acts = loop {
                steps += 1;
                if let Some(acts) = p.checkpoint_step(&mut cp) {
                    break acts;
                }
                let between = p.heartbeat(0).applied_below;
                assert!(
                    between == before || between == lsns[6],
                    "{between} published mid-scan, step {steps}"
                );
            };
            let after = p.heartbeat(0).applied_below;
            assert_eq!(after, lsns[6], "tid 7 is undecided");
            (acts.truncate_below, after, steps)
        };
        let (whole_truncate, whole_after, whole_steps) = run(CHECKPOINT_STEP_TIDS);
        let (stepped_truncate, stepped_after, stepped_steps) = run(1);
        assert_eq!(whole_steps, 1);
        assert!(stepped_steps > 8, "{stepped_steps} steps");
        assert_eq!(
            (stepped_truncate, stepped_after),
            (whole_truncate, whole_after)
        );
    }

    fn ahead(p: &mut P, now_ms: u64, t: Tid, items: Vec<Item>) -> VoteReply {
        let ep = ep(t, vec![1, 2], false, items);
        match &p
            .on_request(now_ms, 1, 1, Request::ExecuteAhead(ep))
            .replies[..]
        {
            [(_, _, Response::Vote(v))] => v.clone(),
            other => panic!("expected one vote, got {}", other.len()),
        }
    }

    fn prepare_after_ahead(p: &mut P, t: Tid, executed: u32) -> Actions<u32> {
        let ep = ExecPrepare {
            executed,
            lock_wait_ms: 0,
            ..ep(t, vec![1, 2], false, vec![])
        };
        p.on_request(0, 1, 1, Request::ExecPrepare(ep))
    }

    #[test]
    fn items_executed_ahead_keep_their_locks_until_the_decision() {
        let mut p = node(1, Mode::Log);
        let cas = |old: u64, new: u64| {
            vec![
                Item::Compare {
                    addr: 0,
                    op: CmpOp::Eq,
                    bytes: old.to_le_bytes().to_vec(),
                },
                write(0, new),
            ]
        };
        let first = ahead(&mut p, 0, tid(1), vec![Item::Read { addr: 8, len: 8 }]);
        assert_eq!(
            (first.vote, first.reads),
            (Vote::CommitOk, vec![vec![0; 8]])
        );
        assert_eq!(ahead(&mut p, 0, tid(1), cas(0, 7)).vote, Vote::CommitOk);
        // Held across the round trips: another minitransaction cannot touch those bytes.
        assert_eq!(
            vote_of(&prepare(&mut p, tid(2), vec![1, 2], vec![write(8, 1)])),
            Vote::AbortLock
        );
        let acts = prepare_after_ahead(&mut p, tid(1), 3);
        assert_eq!(acts.append.len(), 1, "the vote is logged with the write");
        let acts = p.on_synced(0, acts.append[0].0);
        let v = match &acts.replies[..] {
            [(_, _, Response::Vote(v))] => v.clone(),
            _ => panic!("one vote"),
        };
        assert_eq!((v.vote, v.reads), (Vote::CommitOk, vec![vec![0; 8]]));
        p.on_request(0, 1, 2, decide(tid(1), true));
        assert_eq!(p.space().read(0, 8), &7u64.to_le_bytes());
        assert_eq!(p.stats(0).locks_held, 0);
        // A failed compare ahead drops what the tid held.
        assert_eq!(
            ahead(&mut p, 0, tid(3), vec![write(16, 1)]).vote,
            Vote::CommitOk
        );
        let refused = ahead(&mut p, 0, tid(3), cas(0, 9));
        assert_eq!(
            (refused.vote, refused.failed_compares),
            (Vote::AbortCompare, vec![0])
        );
        assert_eq!(p.stats(0).locks_held, 0);
        assert_eq!(
            vote_of(&prepare_after_ahead(&mut p, tid(3), 1)),
            Vote::AbortForced,
            "the prepare finds nothing executed"
        );
    }

    #[test]
    fn items_executed_ahead_are_dropped_by_an_abort_or_the_timeout() {
        let mut p = node(1, Mode::Log);
        assert_eq!(
            ahead(&mut p, 0, tid(1), vec![write(0, 1)]).vote,
            Vote::CommitOk
        );
        p.on_request(0, 1, 2, decide(tid(1), false));
        assert_eq!(p.stats(0).locks_held, 0, "an abort frees them");
        assert_eq!(
            ahead(&mut p, 10, tid(2), vec![write(0, 2)]).vote,
            Vote::CommitOk
        );
        let _ = p.heartbeat(50);
        assert_eq!(p.stats(0).locks_held, 1, "kept within the timeout");
        let _ = p.heartbeat(110);
        assert_eq!(
            p.stats(0).locks_held,
            0,
            "a silent coordinator's locks expire"
        );
        assert_eq!(
            vote_of(&prepare_after_ahead(&mut p, tid(2), 1)),
            Vote::AbortForced,
            "a late prepare cannot commit what was dropped"
        );
        assert_eq!(p.space().read(0, 8), &[0; 8]);
    }

    #[test]
    fn a_forced_abort_in_an_older_segment_is_carried_so_the_segment_can_go() {
        let mut p = node(1, Mode::Log);
        let acts = p.on_request(
            0,
            9,
            5,
            Request::RequestAbort {
                tids: vec![(tid(1), vec![1, 2])],
            },
        );
        let forced_lsn = acts.append[0].0;
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        assert_eq!(acts.truncate_below, Some(forced_lsn), "near the head: kept");
        assert!(acts.append.is_empty(), "and not rewritten");
        // The writer started a new segment after the forced-abort.
        p.set_log_counters(LogCounters {
            current_segment_first_lsn: forced_lsn + 1,
            ..LogCounters::default()
        });
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        let carried = match &acts.append[..] {
            [(lsn, LogRecord::ForcedAbort { tid: t })] if *t == tid(1) => *lsn,
            other => panic!("expected the forced-abort again, got {other:?}"),
        };
        assert_eq!(acts.truncate_below, Some(carried), "the old segment can go");
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        assert!(acts.append.is_empty(), "carried once");
        // Its vote is still forced to abort.
        assert_eq!(
            vote_of(&prepare(&mut p, tid(1), vec![1, 2], vec![write(0, 1)])),
            Vote::AbortForced
        );
    }

    #[test]
    fn applied_tids_are_reported_by_participant_set_and_again_to_a_new_manager() {
        let mut p = node(1, Mode::Log);
        commit_and_checkpoint(&mut p, [(1, vec![1, 3]), (2, vec![1, 2]), (3, vec![1, 3])]);
        let groups = |p: &mut P, at| {
            let mut applied = p.heartbeat(at).applied;
            applied.iter_mut().for_each(|a| a.tids.sort());
            applied
        };
        let expected = vec![
            Applied {
                participants: vec![1, 2],
                tids: vec![tid(2)],
            },
            Applied {
                participants: vec![1, 3],
                tids: vec![tid(1), tid(3)],
            },
        ];
        assert_eq!(groups(&mut p, 5), expected);
        let _ = p.on_heartbeat_ack(5, 1, 42, &[tid(2)], &[]);
        assert!(groups(&mut p, 6).is_empty(), "reported once");
        let _ = p.on_heartbeat_ack(6, 1, 42, &[], &[]);
        let _ = p.on_heartbeat_ack(7, 1, 43, &[], &[]);
        assert_eq!(
            groups(&mut p, 8),
            expected[1..],
            "a new manager hears what the old one had not relayed"
        );
    }

    #[test]
    fn a_relay_that_outruns_the_replay_is_not_reported_again() {
        let records = vec![
            (
                1,
                LogRecord::Prepare {
                    tid: tid(1),
                    participants: vec![1, 2],
                    writes: vec![(0, vec![1])],
                },
            ),
            (
                2,
                LogRecord::Decided {
                    tid: tid(1),
                    commit: true,
                },
            ),
        ];
        let mut p = recovered(records);
        let _ = p.on_heartbeat_ack(1, 1, 42, &[tid(1)], &[]);
        p.finish_recovery(0);
        let cp = p.checkpoint_begin();
        let _ = checkpoint_done(&mut p, cp);
        assert!(p.heartbeat(2).applied.is_empty(), "node 2 collected tid 1");
        assert_eq!(p.stats(0).log_records_live, 0);
    }

    #[test]
    fn stale_reports_are_settled_by_peers_even_after_collection() {
        let mut p = node(1, Mode::Log);
        commit_and_checkpoint(&mut p, (1..=3).map(|seq| (seq, vec![1, 2])));
        assert_eq!(
            p.heartbeat(0).applied,
            vec![Applied {
                participants: vec![1, 2],
                tids: vec![tid(1), tid(2), tid(3)]
            }]
        );
        let _ = p.on_heartbeat_ack(0, 1, 42, &[tid(1)], &[]);
        assert_eq!(p.reported_older_than(5, 10), vec![]);
        assert_eq!(
            p.reported_older_than(10, 10),
            vec![(tid(2), vec![1, 2]), (tid(3), vec![1, 2])]
        );
        p.applied_by_peers(&[tid(1), tid(2)]);
        assert_eq!(p.reported_older_than(10, 10), vec![(tid(3), vec![1, 2])]);
        let cp = p.checkpoint_begin();
        let acts = checkpoint_done(&mut p, cp);
        assert_eq!(
            acts.truncate_below,
            Some(5),
            "tid 3 (lsn 5) still waits for node 2"
        );
    }

    #[test]
    fn read_only_participant_of_a_writing_minitransaction_logs_its_vote() {
        let mut p = node(1, Mode::Log);
        let ep = ExecPrepare {
            tid: tid(1),
            participants: vec![1, 2],
            class: String::new(),
            read_only: false,
            items: vec![Item::Read { addr: 0, len: 8 }],
            executed: 0,
            lock_wait_ms: 0,
        };
        let acts = p.on_request(0, 1, 1, Request::ExecPrepare(ep));
        assert!(matches!(acts.append[..], [(_, LogRecord::Prepare { .. })]));
    }

    #[test]
    fn invalid_requests_are_refused_with_a_reason() {
        let mut p = node(1, Mode::Ram);
        let cases = vec![
            (vec![2, 3], vec![write(0, 1)], ErrorCode::UnknownNode),
            (vec![2, 1], vec![write(0, 1)], ErrorCode::BadRequest),
            (vec![1], vec![], ErrorCode::BadRequest),
            (
                vec![1],
                vec![write((1 << 20) - 4, 1)],
                ErrorCode::OutOfRange,
            ),
            (
                vec![1],
                vec![Item::Read {
                    addr: u64::MAX,
                    len: 2,
                }],
                ErrorCode::OutOfRange,
            ),
            (
                vec![1],
                vec![Item::Read { addr: 0, len: 0 }],
                ErrorCode::BadRequest,
            ),
            (
                vec![1],
                vec![Item::Compare {
                    addr: 0,
                    op: CmpOp::Lt,
                    bytes: vec![1],
                }],
                ErrorCode::BadRequest,
            ),
        ];
        for (i, (participants, items, code)) in cases.into_iter().enumerate() {
            let acts = prepare(&mut p, tid(i as u64), participants, items);
            match &acts.replies[0].2 {
                Response::Error { code: c, message } => {
                    assert_eq!((*c, message.is_empty()), (code, false), "case {i}")
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
        assert_eq!(p.stats(0).locks_held, 0);
    }
}
