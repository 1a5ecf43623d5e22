//! Messages of the minitransaction protocol (Sinfonia Fig. 4, 7, 8) and of the management node.

use bincode::{Decode, Encode};

/// A memory node's logical id, chosen by the operator (`tutti up` numbers nodes 1..N).
/// Zero is never a valid node id.
pub type NodeId = u16;

/// A minitransaction id. Unique because `coordinator` is a random 64-bit id drawn when a
/// client starts and `seq` counts its minitransactions; `epoch` is the epoch the coordinator
/// believed current (Sinfonia §4.6: participants vote abort on tids two or more epochs old).
#[derive(Encode, Decode, Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Tid {
    pub epoch: u64,
    pub coordinator: u64,
    pub seq: u64,
}

impl std::fmt::Display for Tid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:016x}.{}", self.epoch, self.coordinator, self.seq)
    }
}

/// Comparison of a compare item. `Eq` compares bytes of any length; the ordered ones compare
/// the stored 8 bytes as a little-endian u64 against the operand (Sinfonia §8.2).
#[derive(Encode, Decode, Clone, Copy, PartialEq, Eq, Debug)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// Whether `stored op operand` holds, both as little-endian u64 for ordered ops.
    pub fn holds(self, stored: &[u8], operand: &[u8]) -> bool {
        if self == CmpOp::Eq {
            return stored == operand;
        }
        let (Ok(s), Ok(o)) = (<[u8; 8]>::try_from(stored), <[u8; 8]>::try_from(operand)) else {
            return false;
        };
        let (s, o) = (u64::from_le_bytes(s), u64::from_le_bytes(o));
        match self {
            CmpOp::Eq => s == o,
            CmpOp::Ne => s != o,
            CmpOp::Lt => s < o,
            CmpOp::Le => s <= o,
            CmpOp::Gt => s > o,
            CmpOp::Ge => s >= o,
        }
    }

    pub fn parse(s: &str) -> Option<CmpOp> {
        Some(match s {
            "eq" | "==" => CmpOp::Eq,
            "ne" | "!=" => CmpOp::Ne,
            "lt" | "<" => CmpOp::Lt,
            "le" | "<=" => CmpOp::Le,
            "gt" | ">" => CmpOp::Gt,
            "ge" | ">=" => CmpOp::Ge,
            _ => return None,
        })
    }
}

/// One item of a minitransaction, as sent to the memory node that holds it.
/// Reads and compares see the state before the minitransaction; writes and adds apply in
/// item order when every compare holds.
#[derive(Encode, Decode, Clone, PartialEq, Eq, Debug)]
pub enum Item {
    Read {
        addr: u64,
        len: u32,
    },
    Compare {
        addr: u64,
        op: CmpOp,
        bytes: Vec<u8>,
    },
    Write {
        addr: u64,
        bytes: Vec<u8>,
    },
    /// Atomic add to the little-endian i64 at `addr` (wrapping); logged as the resulting write.
    Add {
        addr: u64,
        delta: i64,
    },
}

impl Item {
    pub fn addr(&self) -> u64 {
        match self {
            Item::Read { addr, .. }
            | Item::Compare { addr, .. }
            | Item::Write { addr, .. }
            | Item::Add { addr, .. } => *addr,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Item::Read { len, .. } => u64::from(*len),
            Item::Compare { bytes, .. } | Item::Write { bytes, .. } => bytes.len() as u64,
            Item::Add { .. } => 8,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn writes(&self) -> bool {
        matches!(self, Item::Write { .. } | Item::Add { .. })
    }
}

/// Phase 1 of Sinfonia Fig. 4: execute the items this node holds and prepare to commit.
#[derive(Encode, Decode, Clone, Debug)]
pub struct ExecPrepare {
    pub tid: Tid,
    /// Every memory node of the minitransaction (`D` in Fig. 4), sorted, no duplicates.
    pub participants: Vec<NodeId>,
    /// Minitransaction class for load statistics (free text, at most `CLASS_BYTES_MAX`).
    pub class: String,
    /// No participant has a write or add item: nothing is logged anywhere (Sinfonia §4.7).
    /// Otherwise every participant logs its vote, writes or not, since "committed" means
    /// every participant has a commit vote in its log.
    pub read_only: bool,
    pub items: Vec<Item>,
    /// How many items of this tid the node already executed with `ExecuteAhead`; they are
    /// part of the vote, ahead of `items`. Zero for Sinfonia's own minitransactions.
    pub executed: u32,
    /// How long the node may keep this request waiting for busy locks before it votes
    /// ABORT-LOCK, in ms (at most `LOCK_WAIT_MS_MAX`): only a minitransaction on that node
    /// alone waits. 0: vote ABORT-LOCK at once, as Sinfonia's participant does. The
    /// coordinator sets it well inside its deadline, so that the vote comes back before.
    pub lock_wait_ms: u32,
}

pub const CLASS_BYTES_MAX: usize = 64;

/// The longest a memory node keeps a request waiting for busy locks (`ExecPrepare`'s
/// `lock_wait_ms`). A lock is normally held for one log sync, or for a multi-node
/// minitransaction's two phases, so most waits end far sooner.
pub const LOCK_WAIT_MS_MAX: u32 = 20;

/// A participant's vote (Fig. 4 lines 15–19, plus the stale-epoch rule of §4.6).
#[derive(Encode, Decode, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Vote {
    CommitOk,
    AbortLock,
    AbortForced,
    AbortCompare,
    AbortEpoch,
}

/// Reply to `ExecPrepare`. With a single participant the vote is also the outcome.
#[derive(Encode, Decode, Clone, Debug)]
pub struct VoteReply {
    pub vote: Vote,
    /// Data of the read items, in item order; present iff vote is CommitOk or AbortCompare.
    pub reads: Vec<Vec<u8>>,
    /// Positions (within the items sent to this node) of compare items that failed.
    pub failed_compares: Vec<u32>,
    /// The participant's current epoch, piggybacked for coordinators (§4.6).
    pub epoch: u64,
    /// Where this node logged its commit vote (the lsn of its Prepare record); 0 if it
    /// logged none. The coordinator hands these to every participant with a commit.
    pub lsn: u64,
}

/// The outcome of one minitransaction, as phase 2 tells a participant.
#[derive(Encode, Decode, Clone, PartialEq, Eq, Debug)]
pub struct Decision {
    pub tid: Tid,
    pub commit: bool,
    /// With a commit from the coordinator: every participant's `VoteReply::lsn`, in
    /// participant order, so that a participant can tell from the others' `applied_below`
    /// when all of them applied the tid. Empty when not known (a recovery decision): the
    /// tid is then reported for GC on its own.
    pub lsns: Vec<u64>,
}

impl Decision {
    /// An outcome learnt without the participants' lsns (by recovery): each participant
    /// then reports the tid for GC on its own.
    pub fn without_lsns(tid: Tid, commit: bool) -> Decision {
        Decision {
            tid,
            commit,
            lsns: Vec::new(),
        }
    }

    pub fn abort(tid: Tid) -> Decision {
        Decision::without_lsns(tid, false)
    }
}

/// Multi-participant tids that a memory node applied to its durable image, reported to the
/// manager for GC, grouped by their participants: a heartbeat names each set once.
#[derive(Encode, Decode, Clone, PartialEq, Eq, Debug)]
pub struct Applied {
    pub participants: Vec<NodeId>,
    pub tids: Vec<Tid>,
}

/// One `Decisions` message per node for `(node, decision)` pairs, nodes in ascending order.
pub fn decisions_by_node(pairs: impl IntoIterator<Item = (NodeId, Decision)>) -> Outgoing {
    let mut by_node: std::collections::BTreeMap<NodeId, Vec<Decision>> = Default::default();
    for (node, decision) in pairs {
        by_node.entry(node).or_default().push(decision);
    }
    by_node
        .into_iter()
        .map(|(node, decisions)| (node, Request::Decisions(decisions)))
        .collect()
}

/// A memory node as the directory knows it.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    pub addr: String,
    pub size_bytes: u64,
    /// `log` mode: a commit vote survives the node's crash, so a lost reply can be resolved
    /// by asking the node (REQUEST-ABORT). A `ram` node forgets one-phase commits.
    pub durable: bool,
    pub alive: bool,
}

#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub struct Directory {
    pub nodes: Vec<NodeInfo>,
    pub epoch: u64,
}

/// A named region of the memory nodes' address spaces, allocated by the manager to a layer
/// above the core (a shared log, say), with an epoch that the layer's single active holder
/// (a log's sequencer) takes from the manager. The manager knows nothing of what is inside.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionInfo {
    pub name: String,
    /// What the region is (`log`), so that one layer never opens another's region.
    pub kind: String,
    /// The nodes, in the order the creator gave, each with the region's first address.
    pub nodes: Vec<(NodeId, u64)>,
    pub bytes_per_node: u64,
    /// The creator's parameters, opaque to the manager.
    pub params: Vec<u8>,
    /// Raised by every `TakeRegion`; starts at 1.
    pub epoch: u64,
    /// Who took the current epoch (an address), if anyone did.
    pub holder: Option<String>,
}

/// A request to a log's sequencer (docs/log.md, "Sequencer"), many to a frame.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// The next position, for an entry in these streams.
    Next { streams: Vec<u32> },
    /// The tail and the streams' last positions, taking nothing (the fast check).
    Tail { streams: Vec<u32> },
}

/// The sequencer's answer to one `Ask`.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `position` is the asker's to write in `epoch`; `backpointers[i]` are the last
    /// positions of `streams[i]` before it, newest first.
    Granted {
        position: u64,
        epoch: u64,
        backpointers: Vec<Vec<u64>>,
    },
    /// The next position to be handed out, and each stream's last positions, newest first.
    Tail {
        tail: u64,
        epoch: u64,
        last: Vec<Vec<u64>>,
    },
    /// The request names more streams than an entry can hold.
    TooManyStreams(u32),
    /// This sequencer's epoch, `epoch`, is over: the log was sealed by a successor.
    Sealed { epoch: u64 },
    /// The log is full: `position`, the next one, would take the slot of an entry at or
    /// above the trim point, `trim`. Nothing was handed out; trim the log.
    Full { position: u64, trim: u64 },
}

/// Load counters of one minitransaction class over one window.
#[derive(Encode, Decode, Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadCounters {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub committed: u64,
    pub aborted_lock: u64,
    pub aborted_compare: u64,
    pub forced_abort: u64,
}

#[derive(Encode, Decode, Clone, Debug)]
pub struct ClassLoad {
    pub class: String,
    /// One entry per window of `StatsReport::windows_s`.
    pub windows: Vec<LoadCounters>,
}

#[derive(Encode, Decode, Clone, Debug)]
pub struct StatsReport {
    pub node: NodeId,
    pub windows_s: Vec<u64>,
    pub classes: Vec<ClassLoad>,
    pub uncertain: u64,
    pub locks_held: u64,
    /// Single-node minitransactions waiting for busy locks now (`ExecPrepare::lock_wait_ms`).
    pub lock_waiters: u64,
    pub log_bytes: u64,
    /// Since the node started: records appended to the redo log (group commit packs
    /// `log_records_appended / log_sync.count()` records into each sync).
    pub log_records_appended: u64,
    pub log_records_live: u64,
    pub epoch: u64,
    /// False while the node recovers (stages 1–3 of Fig. 8).
    pub serving: bool,
    /// Resident memory of the node's process, sampled at its last heartbeat (0 before).
    pub rss_bytes: u64,
    /// How long the redo log's synced writes took (each round's write and its fdatasync),
    /// since the node started; all zero in `ram`.
    pub log_sync: SyncHistogram,
    /// Bytes a backup's cut holds now: pages saved by copy-on-write ahead of its reader
    /// (0 with no backup running).
    pub backup_saved_bytes: u64,
    /// The most any backup's cut held at once since the node started.
    pub backup_saved_bytes_max: u64,
}

/// Buckets of a `SyncHistogram`.
pub const SYNC_BUCKETS: usize = 16;

/// Durations of a log's syncs: bucket `i` counts those that took at most `64 µs << i` and
/// more than the bucket before it; the last bucket counts every longer one. The exact
/// slowest is kept as well, since one slow sync holds up every reply waiting for it.
#[derive(Encode, Decode, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncHistogram {
    pub counts: [u64; SYNC_BUCKETS],
    pub sum_us: u64,
    pub max_us: u64,
}

impl SyncHistogram {
    /// The upper bound of bucket `i` in µs; `None` for the last, which has none.
    pub fn upper_us(i: usize) -> Option<u64> {
        (i + 1 < SYNC_BUCKETS).then(|| 64 << i)
    }

    /// The syncs counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn record(&mut self, us: u64) {
        let i = (0..SYNC_BUCKETS)
            .find(|&i| Self::upper_us(i).is_none_or(|upper| us <= upper))
            .expect("the last bucket takes any duration");
        self.counts[i] += 1;
        self.sum_us += us;
        self.max_us = self.max_us.max(us);
    }

    /// The slowest of the syncs counted here and not in `earlier` (a reading of the same
    /// histogram taken before): exact when the maximum grew in between, otherwise the upper
    /// bound of the highest bucket that grew (the maximum, for the last). `None` if no sync
    /// happened in between.
    pub fn slowest_since(&self, earlier: &SyncHistogram) -> Option<SlowestSync> {
        if self.max_us > earlier.max_us {
            return Some(SlowestSync {
                us: self.max_us,
                exact: true,
            });
        }
        let i = (0..SYNC_BUCKETS)
            .rev()
            .find(|&i| self.counts[i] > earlier.counts[i])?;
        Some(SlowestSync {
            us: Self::upper_us(i).map_or(self.max_us, |upper| upper.min(self.max_us)),
            exact: false,
        })
    }
}

/// The slowest sync between two readings of a `SyncHistogram`: its duration, or when it
/// did not set the histogram's maximum, an upper bound on it (its bucket's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowestSync {
    pub us: u64,
    pub exact: bool,
}

/// Requests a state machine asks its driver to send, each to a memory node.
pub type Outgoing = Vec<(NodeId, Request)>;

#[derive(Encode, Decode, Clone, Debug)]
pub enum Request {
    /// Coordinator → participant, phase 1.
    ExecPrepare(ExecPrepare),
    /// Coordinator → participant, before phase 1 (Systems A and B of Sinfonia Fig. 17, the
    /// traditional way that minitransactions improve on): execute `items` now and keep their
    /// locks under the tid; nothing is logged. Replies `Vote`: COMMIT-OK with the reads,
    /// or why not (then the node has dropped everything of the tid). `executed` in the
    /// tid's `ExecPrepare` counts these items; unprepared ones are dropped after the
    /// uncertainty timeout, and an abort decision drops them at once.
    ExecuteAhead(ExecPrepare),
    /// Coordinator or recovery coordinator → participant, phase 2; no reply. One message
    /// carries the outcomes of several tids: a client's connection gathers those decided
    /// while its previous frames were being written, recovery those of one batch.
    Decisions(Vec<Decision>),
    /// Coordinator → participant, phase 2 of a read-only minitransaction over several nodes
    /// whose votes were all COMMIT-OK: release the read locks and say whether they were
    /// still held (a crash or a recovery decision drops them, and with them isolation).
    Release { tid: Tid },
    /// Recovery coordinator or recovering node → participant (Fig. 7, Fig. 8 stage 2),
    /// batched: one message carries every tid asked of this node.
    RequestAbort { tids: Vec<(Tid, Vec<NodeId>)> },
    /// Recovering node → peer: which of these tids are in the peer's all-log-tids (§4.5),
    /// asked only about the tids the recovering node must decide, so that the answer stays
    /// bounded however long the peer's log is (at most `BATCH_TIDS_MAX` per request).
    LogTids { tids: Vec<Tid> },
    /// Memory node → peer: which of these committed tids has the peer applied to its
    /// durable image (or already collected)? Backs up the manager's GC relay.
    Applied { tids: Vec<Tid> },
    /// Anyone → memory node: load statistics.
    Stats,
    /// Memory node → manager, at start; `rebooted` says it found state on disk. `mirror`:
    /// the backup it was started with (`log-repl`), recorded in the node's placement when
    /// the manager first hears of the node; after that the manager's placement rules.
    /// Replies `Registered`, or `Error { StaleConfig }` to a primary that was replaced.
    Register {
        node: NodeId,
        addr: String,
        size_bytes: u64,
        durable: bool,
        rebooted: bool,
        mirror: Option<String>,
    },
    /// Anyone → manager.
    Directory,
    /// Anyone → manager: allocate `bytes_per_node` on each of `nodes` under a new `name`.
    /// Replies `Region`. Creating the same region again (same name, kind, nodes, size and
    /// params) replies it again, so that a creator may retry.
    CreateRegion {
        name: String,
        kind: String,
        nodes: Vec<NodeId>,
        bytes_per_node: u64,
        params: Vec<u8>,
    },
    /// Anyone → manager: the region called `name`. Replies `Region`.
    Region { name: String },
    /// Anyone → manager: give region `name` `bytes_per_node` on each of `nodes` too, after
    /// its nodes (a volume grown onto new memory nodes). Nodes it spans already are left as
    /// they are, so that a grower may retry. Replies `Region` as it is after.
    ExtendRegion { name: String, nodes: Vec<NodeId> },
    /// Anyone → manager: every region. Replies `Regions`.
    Regions,
    /// A would-be holder → manager: if the region's epoch is still `expect`, raise it and
    /// record `holder` (durably, before the reply). Replies `Region` as it is after, taken
    /// or not: the caller compares the epoch.
    TakeRegion {
        name: String,
        expect: u64,
        holder: String,
    },
    /// Client → sequencer: answer `asks` for the log called `log`, in order. `min_epoch` is
    /// the highest epoch the client saw the log's memory nodes at: a sequencer of an older
    /// epoch was superseded and takes the log over again. Replies `Sequenced`.
    Sequence {
        log: String,
        min_epoch: u64,
        asks: Vec<Ask>,
    },
    /// Sequencer → manager, at start: record `addr` as where the cluster's logs are
    /// sequenced (durably, before the reply). Replies `Sequencer`.
    SetSequencer { addr: String },
    /// Anyone → manager: where the cluster's logs are sequenced. Replies `Sequencer`.
    Sequencer,
    /// Memory node → manager, periodically: tids uncertain for longer than the timeout,
    /// tids newly applied to the node's durable image whose participants' lsns it does not
    /// know (multi-participant ones only), and `applied_below`: every committed tid whose
    /// Prepare record at this node has a smaller lsn is in the node's durable image.
    /// `mirror_behind_ms`: a replicated primary's oldest record its mirror has not
    /// acknowledged has waited this long (0: none waits).
    Heartbeat {
        node: NodeId,
        uncertain: Vec<(Tid, Vec<NodeId>)>,
        applied: Vec<Applied>,
        applied_below: u64,
        mirror_behind_ms: u64,
    },
    /// Backup → memory node, phase 1 of a consistent cut (Sinfonia §4.8), sent to every
    /// node in node-id order: from the first one, the node refuses new locks (`AbortLock`)
    /// and the backup asks again until no tid holds a lock here. Replies `BackupLock`.
    /// A node forgets a fence not asked about for `BACKUP_FENCE_LEASE_MS`.
    BackupLock { backup: u64 },
    /// Backup → memory node, phase 2, once every node answered `locked`: keep the image as
    /// it is now for the backup (copy-on-write) and take locks again. With `since` the id of
    /// the last backup that completed at this node, the cut holds only the pages written
    /// since that one's cut (an incremental backup); otherwise all of them. Replies
    /// `BackupCut`.
    BackupCut { backup: u64, since: Option<u64> },
    /// Backup → memory node: the image as of the cut, `len` bytes from `offset`, read in
    /// order (each read starts where the last one ended). Replies `BackupChunk`. A node
    /// forgets a cut not read for `BACKUP_CUT_LEASE_MS`.
    BackupRead { backup: u64, offset: u64, len: u64 },
    /// Backup → memory node: the backup is over; drop its fence or cut. `completed`: every
    /// byte of the cut was read, and a later incremental backup may start from this one.
    /// Replies `BackupEnded`, also for a backup the node does not know.
    BackupEnd { backup: u64, completed: bool },
    /// Anyone → a manager, whichever its role: where it stands in its group. Replies
    /// `ManagerStatus`.
    ManagerStatus,
    /// Primary → its mirror (`log-repl`, docs/replication.md): the primary's redo log
    /// records `first_lsn .. first_lsn + count`, encoded as in a segment (docs/storage.md),
    /// the primary's truncation point (every record below it is dead; 0 for none) and
    /// `primary_synced` (every record below it is on the primary's own disk). Sent in lsn
    /// order, empty ones to renew the primary's lease. `session` names the primary process
    /// (drawn at its start): once a restarting primary asked for the tail, the mirror
    /// refuses what an earlier process still had in flight. Replies `Replicated`
    /// once the mirror holds every record of it durably, `ReplicaGap` when records before
    /// `first_lsn` are missing there, `Error { StaleConfig }` to a primary of an older
    /// configuration than the mirror knows (or to any primary, once promoted).
    Replicate {
        node: NodeId,
        session: u64,
        config_epoch: u64,
        first_lsn: u64,
        count: u64,
        records: Vec<u8>,
        truncate_below: u64,
        primary_synced: u64,
    },
    /// A restarting primary → its mirror, before its own recovery: the records the mirror
    /// holds from `from` on (logged there, never acknowledged: the primary adopts them, as
    /// if it had synced them itself), answered once every record the mirror appended is
    /// durable there. Replies `ReplicaTail`.
    ReplicaTail {
        node: NodeId,
        session: u64,
        config_epoch: u64,
        from: u64,
    },
    /// Mirror → manager, periodically: it is alive, at `addr`, holding every record of the
    /// node's log below `next_lsn`. Replies `Placement` (the mirror promotes itself when
    /// the placement names it primary).
    MirrorHeartbeat {
        node: NodeId,
        addr: String,
        next_lsn: u64,
    },
    /// A new mirror → a primary running without one (re-replication, docs/replication.md):
    /// start shipping the records from the next one on to `addr`, and prepare its seed:
    /// every record of this log below that point, read from disk, and this node's image,
    /// read from memory as `ReadSeed` asks for it. Replies `JoinOffer` once the seed's
    /// records are read.
    JoinMirror { node: NodeId, addr: String },
    /// A joining mirror → the primary: bytes `offset .. offset + len` of the seed `join`
    /// (its records, encoded as in a segment, then the image). Replies `SeedPart`.
    ReadSeed {
        node: NodeId,
        join: u64,
        offset: u64,
        len: u64,
    },
    /// Primary → manager: the mirror at `mirror`, which joined this primary under
    /// `config_epoch`, holds every record the primary counts durable, and the primary
    /// counts none durable from now on unless the mirror holds it too: name it the node's
    /// mirror. Replies `Placement` (the one committed; the same placement again to a
    /// repeated request), `Error { StaleConfig }` if the placement moved on meanwhile.
    AddMirror {
        node: NodeId,
        config_epoch: u64,
        primary: String,
        mirror: String,
    },
    /// Anyone → manager: node `node`'s placement as committed. Replies `Placement`. A
    /// primary asks when its mirror knows a newer configuration than it does.
    Placement { node: NodeId },
    /// A mirror that joined under `config_epoch` and was given up by its primary (nothing
    /// shipped to it for a while) → manager, before it empties its data directory to join
    /// anew: raise the node's configuration epoch, unless the placement moved on already,
    /// so that an `AddMirror` for that join still on its way can never name it (it would
    /// name a mirror that no longer holds what its primary counted durable). Replies
    /// `Placement`: the one committed, or the current one, which may name it mirror after
    /// all (it then keeps its data and serves as one).
    AbandonJoin {
        node: NodeId,
        config_epoch: u64,
        mirror: String,
    },
    /// Manager → manager, one-way: a message of the Raft group that holds the manager's
    /// durable state (an `eraftpb::Message` in protobuf, as the `raft` crate encodes it).
    Raft(Vec<u8>),
    /// A replaced `ram-repl` primary that kept its copy (it stopped and started again as a
    /// process of the mirror role, its data directory untouched) → manager, every 200 ms
    /// instead of `Placement`: the process at `addr` holds the node's data as of
    /// `config_epoch`, the configuration it served under. Replies `FormerCopy`. While the
    /// copy that replaced it has not registered, the managers may name this one primary
    /// again (docs/replication.md, "A replaced copy keeps its data").
    FormerPrimary {
        node: NodeId,
        addr: String,
        config_epoch: u64,
    },
    /// Writer → every other member of a tutti-fs volume, before it commits a write: forget
    /// what you cached of these `(node, address, length)` ranges and trust nothing until
    /// `WriteEnded` (docs/fs.md, "Coherent caching"). Replies `Invalidated` once done.
    Invalidate {
        writer: u64,
        seq: u64,
        ranges: Vec<(NodeId, u64, u32)>,
    },
    /// Writer → the members it sent `Invalidate`: the write has its outcome. One way.
    WriteEnded { writer: u64, seq: u64 },
}

/// How long a memory node keeps a backup's fence without hearing `BackupLock` again: a
/// fenced node refuses every new lock, so a backup that went away must not hold it long.
pub const BACKUP_FENCE_LEASE_MS: u64 = 2_000;
/// How long a memory node keeps a backup's cut without a `BackupRead`.
pub const BACKUP_CUT_LEASE_MS: u64 = 10_000;
/// The most one `BackupRead` may ask for.
pub const BACKUP_READ_BYTES_MAX: u64 = 4 << 20;
/// The most one `ReadSeed` may ask for.
pub const SEED_READ_BYTES_MAX: u64 = 4 << 20;

/// Where a replicated logical memory node's copies are (`log-repl`): chosen by the
/// manager's leader, committed through the manager group before anyone acts on it.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// Raised at each change. A mirror refuses a primary of an older configuration, so a
    /// replaced primary never again gets a record acknowledged, hence never votes.
    pub config_epoch: u64,
    pub primary: String,
    /// The backup that acknowledges every record before the primary relies on it; none
    /// while the node runs unreplicated (its mirror was lost).
    pub mirror: Option<String>,
}

/// Exit status of a `log-repl` primary that learnt it was replaced: `tutti up` and
/// `tutti chaos` start it again as a process of the mirror role, which joins the node as
/// its new mirror.
pub const EXIT_REPLACED: i32 = 75;

/// How long a mirror's acknowledgement lets its primary answer, from when the primary sent
/// what was acknowledged; the mirror does not take over before as long after its last
/// acknowledgement, so no two primaries answer at once (docs/replication.md, "Leases").
pub const PRIMARY_LEASE_MS: u64 = 300;

/// What `Request::ManagerStatus` answers.
#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub struct ManagerStatus {
    /// Its Raft id (its place in the group, from 1) and the group's size.
    pub id: u64,
    pub managers: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    pub term: u64,
    /// The leader's address, when it knows one.
    pub leader: Option<String>,
    /// Raft indexes: the last entry of its log, the last known committed, the last applied.
    pub last_index: u64,
    pub commit: u64,
    pub applied: u64,
    /// The epoch of the state as of its log's last entry.
    pub epoch: u64,
}

#[derive(Encode, Decode, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request is malformed or breaks a limit.
    BadRequest,
    /// An address range lies outside the node's address space.
    OutOfRange,
    /// The request names a node this node or manager does not know, or is sent to the wrong node.
    UnknownNode,
    /// The node is recovering and serves only recovery messages.
    NotReady,
    /// The receiver does not serve this request (a manager asked for a vote, say).
    Unsupported,
    /// The named region does not exist.
    NotFound,
    /// A region of that name exists with other parameters.
    Conflict,
    /// A node's address space has no room left for the region.
    NoSpace,
    /// The sender acts on a configuration (`Placement`) older than the receiver's: a
    /// replaced primary.
    StaleConfig,
}

#[derive(Encode, Decode, Clone, Debug)]
pub enum Response {
    Vote(VoteReply),
    /// Votes for `RequestAbort`: true iff the node holds a commit vote (tid in all-log-tids).
    Votes(Vec<(Tid, bool)>),
    LogTids(Vec<Tid>),
    Applied(Vec<Tid>),
    Released {
        held: bool,
    },
    /// Boxed: the report is several times larger than any other reply.
    Stats(Box<StatsReport>),
    Directory(Directory),
    /// Boxed, like `Stats`: larger than the replies on the data path.
    Region(Box<RegionInfo>),
    Regions(Vec<RegionInfo>),
    /// One answer per ask of a `Sequence` request, in order.
    Sequenced(Vec<Answer>),
    /// The sequencer's address, if one registered.
    Sequencer(Option<String>),
    /// `locked`: no tid holds a lock here, and none can take one until the cut; otherwise
    /// `holders` tids still do.
    BackupLock {
        locked: bool,
        holders: u64,
    },
    /// The cut is taken; the image is `size_bytes` long. `incremental`: it holds only the
    /// pages written since the `since` backup's cut.
    BackupCut {
        size_bytes: u64,
        incremental: bool,
    },
    /// Of a full cut, the image's bytes in the range read that are not all zero, as
    /// `(offset, bytes)` runs of whole pages in address order; every other byte of the range
    /// is zero. Of an incremental cut, the pages of the range written since the earlier
    /// cut, zero or not; every other page is as it was then.
    BackupChunk(Vec<(u64, Vec<u8>)>),
    BackupEnded,
    /// `placement`: the node's, if it is replicated.
    Registered {
        epoch: u64,
        incarnation: u64,
        placement: Option<Placement>,
    },
    HeartbeatAck {
        epoch: u64,
        incarnation: u64,
        gc: Vec<Tid>,
        /// The latest `applied_below` of every node that reported one to this incarnation.
        applied_below: Vec<(NodeId, u64)>,
        /// The node's placement, if it is replicated: a primary learns here that it lost
        /// its mirror (and runs alone) or was replaced (and stops).
        placement: Option<Placement>,
    },
    /// `Replicate`: the mirror holds every record below `next_lsn` durably.
    Replicated {
        next_lsn: u64,
    },
    /// `Replicate`: the mirror holds records below `next_lsn` only; send from there.
    ReplicaGap {
        next_lsn: u64,
    },
    /// `ReplicaTail`: records `first_lsn .. first_lsn + count`, encoded as in a segment.
    ReplicaTail {
        first_lsn: u64,
        count: u64,
        records: Vec<u8>,
    },
    /// `Placement`, `MirrorHeartbeat`, `AddMirror`, `AbandonJoin`: the node's placement as
    /// committed (none: not replicated).
    Placement(Option<Placement>),
    /// `JoinMirror`: the seed `join` holds the records `first_lsn .. next_lsn` in
    /// `records_bytes` bytes, then the image in `image_bytes`; the primary ships records
    /// from `next_lsn` on under `config_epoch` as the process `session`.
    JoinOffer {
        join: u64,
        config_epoch: u64,
        session: u64,
        first_lsn: u64,
        next_lsn: u64,
        records_bytes: u64,
        image_bytes: u64,
    },
    /// `ReadSeed`: bytes `offset .. offset + len` of the seed (`len` is less than asked for
    /// only at the seed's end): `records`, the part of the range in the seed's records, and
    /// in the rest, which is the image's, zeros but for `pages`: runs of whole 4 KiB pages,
    /// each at its offset in the image.
    SeedPart {
        len: u64,
        records: Vec<u8>,
        pages: Vec<(u64, Vec<u8>)>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// A manager's place in its Raft group, as it sees it.
    ManagerStatus(Box<ManagerStatus>),
    /// A manager that is not its group's leader: ask `leader` (its address, when known)
    /// instead. Nothing of the request was done.
    NotLeader {
        leader: Option<String>,
    },
    /// `FormerPrimary`: the node's placement as committed, and whether the former primary
    /// is to keep its copy (`keep`: the placement is the one that replaced it, and its
    /// primary has not registered under it); without `keep`, and not named, it empties its
    /// data directory and joins like any copy outside the placement.
    FormerCopy {
        placement: Option<Placement>,
        keep: bool,
    },
    /// `Invalidate`: the member forgot those ranges.
    Invalidated,
    /// Unasked (request id 0), server → client: the server stopped serving this
    /// connection (it changes role or stops). Every request it read before has its reply
    /// or will get one; every later one gets `Error { NotReady }` unexecuted. The client
    /// sends nothing more on it and closes its side, and the server closes once it has read
    /// to that end (docs/protocol.md, "Going away").
    GoingAway,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_lands_in_the_first_bucket_whose_bound_holds_it() {
        let mut h = SyncHistogram::default();
        for us in [0, 64, 65, 128, 1_000, 2_000_000_000] {
            h.record(us);
        }
        assert_eq!(h.counts[0], 2);
        assert_eq!(h.counts[1], 2);
        assert_eq!(h.counts[4], 1, "1 ms is in (512, 1024] µs");
        assert_eq!(h.counts[SYNC_BUCKETS - 1], 1);
        assert_eq!(h.max_us, 2_000_000_000);
        assert_eq!(SyncHistogram::upper_us(SYNC_BUCKETS - 2), Some(64 << 14));
    }

    #[test]
    fn the_slowest_since_an_earlier_reading_is_exact_when_it_set_the_maximum() {
        let mut h = SyncHistogram::default();
        h.record(9_000);
        let earlier = h;
        assert_eq!(h.slowest_since(&earlier), None);
        h.record(300);
        assert_eq!(
            h.slowest_since(&earlier),
            Some(SlowestSync {
                us: 512,
                exact: false
            }),
            "bounded by its bucket"
        );
        h.record(12_345);
        assert_eq!(
            h.slowest_since(&earlier),
            Some(SlowestSync {
                us: 12_345,
                exact: true
            })
        );
    }
}
