//! `Tango`, the driver of a `Runtime` over the log (Tango §3–4): it resolves names in the
//! directory, rebuilds the hosted views from their latest checkpoints and streams, plays
//! the streams to the tail before every accessor, appends updates, commit records and
//! decision records, checkpoints, forgets and trims.

use crate::directory::{Created, Directory, Meta, DIRECTORY_NAME, DIRECTORY_OID, NAME_BYTES_MAX};
use crate::error::TangoError;
use crate::object::Object;
use crate::objects::Kind;
use crate::record::{Oid, Read, Record, Write};
use crate::runtime::{Progress, Reply, Runtime, Tx};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tutti_log::entry::{header_bytes, STREAMS_PER_ENTRY_MAX};
use tutti_log::{Found, Log, Stream};

/// How long a player waits for a missing decision record before it rebuilds the read
/// set's views and decides itself, and how long a commit decided here may go without its
/// decision record before this client appends it for the others.
pub const DECISION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(500);
/// Pause between syncs while a player waits for a decision record.
const DECISION_POLL: Duration = Duration::from_millis(5);

#[derive(Clone, Debug)]
pub struct TangoOptions {
    pub decision_timeout: Duration,
}

impl Default for TangoOptions {
    fn default() -> Self {
        TangoOptions {
            decision_timeout: DECISION_TIMEOUT_DEFAULT,
        }
    }
}

/// What a transaction came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    pub committed: bool,
    /// Its commit record's position (none for a read-only transaction).
    pub position: Option<u64>,
    /// The replies of its writes, in order, when it committed and its outcome was played
    /// here (not for write-only transactions, which do not wait for the log).
    pub replies: Vec<Vec<u8>>,
}

/// A client of the objects in one log. Clone it freely: clones share the views.
#[derive(Clone)]
pub struct Tango {
    inner: Arc<Inner>,
}

struct Inner {
    log: Log,
    opts: TangoOptions,
    /// The hosted objects other than the directory, by name.
    objects: BTreeMap<String, Meta>,
    runtime: Mutex<Runtime>,
    player: tokio::sync::Mutex<Player>,
    /// Syncs begun, and the number of the last one finished (syncs are numbered from 1 in
    /// the order they begin, under the player's lock).
    syncs_begun: AtomicU64,
    syncs_done: AtomicU64,
    /// Each hosted object's latest checkpoint known here: the position it was taken at.
    checkpoints: Mutex<HashMap<Oid, u64>>,
}

/// The streams of the hosted objects, read together.
struct Player {
    streams: Vec<Stream>,
    /// When each commit blocking the play, and each decision owed, was first seen.
    since: HashMap<u64, Instant>,
}

/// Views rebuilt from their checkpoints, with their streams' entries offered.
struct Loaded {
    runtime: Runtime,
    streams: Vec<Stream>,
    checkpoints: HashMap<Oid, u64>,
}

fn nonce() -> u64 {
    rand::random::<u64>() | 1
}

fn check_name(name: &str) -> Result<(), TangoError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX || name == DIRECTORY_NAME {
        return Err(TangoError::BadName(name.into()));
    }
    Ok(())
}

fn sorted_oids(oids: impl Iterator<Item = Oid>) -> Vec<Oid> {
    let mut oids: Vec<Oid> = oids.collect();
    oids.sort_unstable();
    oids.dedup();
    oids
}

impl Tango {
    /// Opens the objects of `log` named in `objects` (creating the names that do not exist
    /// yet) and rebuilds their views and the directory's.
    pub async fn open(
        log: Log,
        objects: &[(&str, Kind)],
        opts: TangoOptions,
    ) -> Result<Tango, TangoError> {
        let directory = Tango::start(log.clone(), BTreeMap::new(), opts.clone()).await?;
        if objects.is_empty() {
            return Ok(directory);
        }
        let mut metas = BTreeMap::new();
        for &(name, kind) in objects {
            metas.insert(name.to_string(), directory.create(name, kind, false).await?);
        }
        Tango::start(log, metas, opts).await
    }

    async fn start(
        log: Log,
        objects: BTreeMap<String, Meta>,
        opts: TangoOptions,
    ) -> Result<Tango, TangoError> {
        let mut views: Vec<(Oid, Box<dyn Object>)> =
            vec![(DIRECTORY_OID, Box::new(Directory::default()))];
        views.extend(objects.values().map(|m| (m.oid, m.kind.view())));
        let loaded = load(&log, views, None).await?;
        let tango = Tango {
            inner: Arc::new(Inner {
                log,
                opts,
                objects,
                runtime: Mutex::new(loaded.runtime),
                player: tokio::sync::Mutex::new(Player {
                    streams: loaded.streams,
                    since: HashMap::new(),
                }),
                syncs_begun: AtomicU64::new(0),
                syncs_done: AtomicU64::new(0),
                checkpoints: Mutex::new(loaded.checkpoints),
            }),
        };
        tango.sync().await?;
        Ok(tango)
    }

    pub fn log(&self) -> &Log {
        &self.inner.log
    }

    fn runtime(&self) -> MutexGuard<'_, Runtime> {
        self.inner.runtime.lock().expect("runtime poisoned")
    }

    /// The hosted object called `name`.
    pub fn hosted(&self, name: &str) -> Result<&Meta, TangoError> {
        (self.inner.objects.get(name)).ok_or_else(|| TangoError::NoSuchObject(name.into()))
    }

    /// The hosted object called `name`, which must be a `kind`.
    pub fn hosted_as(&self, name: &str, kind: Kind) -> Result<Oid, TangoError> {
        let meta = self.hosted(name)?;
        if meta.kind != kind {
            return Err(TangoError::KindMismatch {
                name: name.into(),
                is: meta.kind,
                wanted: kind,
            });
        }
        Ok(meta.oid)
    }

    /// What the directory says of `name`, as of now.
    pub async fn lookup(&self, name: &str) -> Result<Option<Meta>, TangoError> {
        self.query(DIRECTORY_OID, |d: &Directory| d.get(name).cloned())
            .await
    }

    /// Every name in the directory, as of now.
    pub async fn names(&self) -> Result<Vec<(String, Meta)>, TangoError> {
        self.query(DIRECTORY_OID, |d: &Directory| {
            d.names().map(|(n, m)| (n.clone(), m.clone())).collect()
        })
        .await
    }

    /// Gives `name` to a new object of `kind` unless it has one; `decisions`: transactions
    /// writing it append decision records (Tango §4.1), for clients that host it without
    /// the objects such transactions read.
    pub async fn create(
        &self,
        name: &str,
        kind: Kind,
        decisions: bool,
    ) -> Result<Meta, TangoError> {
        check_name(name)?;
        let known = self.lookup(name).await?;
        let created = match known {
            Some(meta) => Created::Ready(meta),
            None => {
                let reply = self
                    .update_reply(
                        DIRECTORY_OID,
                        Some(name.as_bytes()),
                        Directory::create(kind, decisions),
                    )
                    .await?;
                Directory::created(&reply.1).map_err(|e| TangoError::Malformed {
                    position: reply.0,
                    why: e.0,
                })?
            }
        };
        match created {
            Created::Ready(meta) if meta.kind == kind => Ok(meta),
            Created::Ready(Meta { kind: is, .. }) | Created::OtherKind(is) => {
                Err(TangoError::KindMismatch {
                    name: name.into(),
                    is,
                    wanted: kind,
                })
            }
        }
    }

    /// Plays every hosted stream to the log's tail as of this call (Tango's query_helper):
    /// views read after it reflect every update acknowledged before it. Concurrent callers
    /// share syncs: one begun after this call began serves it.
    pub async fn sync(&self) -> Result<(), TangoError> {
        let ticket = self.inner.syncs_begun.load(Ordering::SeqCst);
        let mut player = self.inner.player.lock().await;
        if self.inner.syncs_done.load(Ordering::SeqCst) > ticket {
            return Ok(());
        }
        let number = self.inner.syncs_begun.fetch_add(1, Ordering::SeqCst) + 1;
        self.catch_up(&mut player).await?;
        self.inner.syncs_done.store(number, Ordering::SeqCst);
        Ok(())
    }

    async fn catch_up(&self, player: &mut Player) -> Result<(), TangoError> {
        loop {
            let syncs = player.streams.iter_mut().map(|s| s.sync());
            futures::future::try_join_all(syncs).await?;
            let progress = {
                let mut runtime = self.runtime();
                offer_streams(&mut runtime, &mut player.streams)?
            };
            let Progress::Blocked {
                commit,
                reads,
                streams,
            } = progress
            else {
                break;
            };
            let since = *player.since.entry(commit).or_insert_with(Instant::now);
            if since.elapsed() < self.inner.opts.decision_timeout {
                tokio::time::sleep(DECISION_POLL).await;
                continue;
            }
            let committed = self.decide_by_replay(commit, &reads).await?;
            self.runtime().resolve(commit, committed);
            player.since.remove(&commit);
            self.append_decision(commit, committed, &streams).await?;
        }
        self.pay_owed(player).await
    }

    /// Decides the commit at `commit` by rebuilding, as of it, the views of the objects it
    /// read (Tango §4.1: no client hosting them appended the decision in time).
    async fn decide_by_replay(&self, commit: u64, reads: &[Read]) -> Result<bool, TangoError> {
        let oids = sorted_oids(reads.iter().map(|r| r.oid));
        let loaded = self.replay(oids, commit).await?;
        Ok(loaded.runtime.validate(reads))
    }

    /// Views of `oids` as of `until`, rebuilt from their checkpoints and streams. A commit
    /// they wait on is decided by hosting the objects it read as well, and playing again.
    async fn replay(&self, mut oids: Vec<Oid>, until: u64) -> Result<Loaded, TangoError> {
        loop {
            let views = self.runtime().view(DIRECTORY_OID, |d: &Directory| {
                (oids.iter())
                    .map(|&oid| match oid {
                        DIRECTORY_OID => {
                            Some((oid, Box::new(Directory::default()) as Box<dyn Object>))
                        }
                        _ => (d.name_of(oid).and_then(|n| d.get(n))).map(|m| (oid, m.kind.view())),
                    })
                    .collect::<Option<Vec<_>>>()
            })?;
            let views = views.ok_or_else(|| TangoError::Undecided {
                commit: until,
                why: format!("objects {oids:?} are not all named in the directory"),
            })?;
            let mut loaded = load(&self.inner.log, views, Some(until)).await?;
            let Progress::Blocked { commit, reads, .. } =
                offer_streams(&mut loaded.runtime, &mut loaded.streams)?
            else {
                return Ok(loaded);
            };
            let hosted = oids.len();
            oids = sorted_oids(oids.into_iter().chain(reads.iter().map(|r| r.oid)));
            if oids.len() == hosted {
                return Err(TangoError::Undecided {
                    commit,
                    why: "it read objects whose views start from checkpoints taken after it, and no decision record was found".into(),
                });
            }
        }
    }

    async fn append_decision(
        &self,
        commit: u64,
        committed: bool,
        streams: &[Oid],
    ) -> Result<u64, TangoError> {
        let record = Record::Decision { commit, committed };
        let position = self.inner.log.append(record.encode(), streams).await?;
        self.runtime().settle_owed(commit);
        Ok(position)
    }

    /// Appends the decision records owed longer than the timeout (their writers crashed
    /// or are slow), for the clients that cannot decide those commits themselves.
    async fn pay_owed(&self, player: &mut Player) -> Result<(), TangoError> {
        let owed = self.runtime().owed().clone();
        player.since.retain(|p, _| owed.contains_key(p));
        for (commit, owed) in owed {
            let since = *player.since.entry(commit).or_insert_with(Instant::now);
            if since.elapsed() >= self.inner.opts.decision_timeout {
                self.append_decision(commit, owed.committed, &owed.streams)
                    .await?;
                player.since.remove(&commit);
            }
        }
        Ok(())
    }

    /// Runs `f` on the view of `oid` once the hosted streams are played to the tail
    /// (a linearizable accessor).
    pub async fn query<T: Object, R>(
        &self,
        oid: Oid,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, TangoError> {
        self.sync().await?;
        Ok(self.runtime().view(oid, f)?)
    }

    /// Runs `f` on the view of `oid` as played so far, without syncing (a stale read).
    pub fn query_stale<T: Object, R>(
        &self,
        oid: Oid,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, TangoError> {
        Ok(self.runtime().view(oid, f)?)
    }

    /// Appends an update of `oid` (hosted here or not: a remote write) and returns its
    /// position, without waiting for it to be played (Tango's update_helper).
    pub async fn update(
        &self,
        oid: Oid,
        key: Option<&[u8]>,
        data: Vec<u8>,
    ) -> Result<u64, TangoError> {
        let write = Write {
            oid,
            key: key.map(<[u8]>::to_vec),
            data,
        };
        let record = Record::Update { nonce: 0, write };
        Ok(self.inner.log.append(record.encode(), &[oid]).await?)
    }

    /// Appends an update of the hosted object `oid`, plays it, and returns its position
    /// and the object's reply.
    pub async fn update_reply(
        &self,
        oid: Oid,
        key: Option<&[u8]>,
        data: Vec<u8>,
    ) -> Result<(u64, Vec<u8>), TangoError> {
        if !self.runtime().hosts(oid) {
            return Err(crate::runtime::ViewError::NotHosted(oid).into());
        }
        let nonce = nonce();
        self.runtime().await_reply(nonce);
        let write = Write {
            oid,
            key: key.map(<[u8]>::to_vec),
            data,
        };
        let record = Record::Update { nonce, write };
        let played = async {
            let position = self.inner.log.append(record.encode(), &[oid]).await?;
            self.sync().await?;
            Ok::<_, TangoError>((position, self.runtime().take_reply(nonce)))
        };
        let (position, reply) = match played.await {
            Ok(played) => played,
            Err(e) => {
                self.runtime().forget_reply(nonce);
                return Err(e);
            }
        };
        match reply {
            Some(Reply::Applied(reply)) => Ok((position, reply)),
            Some(Reply::Malformed(why)) => Err(TangoError::Malformed { position, why }),
            other => unreachable!("the update at {position} played to {other:?}"),
        }
    }

    /// A new transaction (Tango's BeginTX). Its reads see the views as played: `sync`
    /// first for a fresh snapshot.
    pub fn begin(&self) -> Tx {
        Tx::new(nonce())
    }

    /// Runs `f` on the view of `oid` as played, recording in `tx` the version of `key` (or
    /// of the whole object) it saw.
    pub fn query_in<T: Object, R>(
        &self,
        tx: &mut Tx,
        oid: Oid,
        key: Option<&[u8]>,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, TangoError> {
        Ok(self.runtime().view_in(tx, oid, key, f)?)
    }

    /// Ends `tx` (Tango's EndTX). A read-only transaction plays to the tail and commits if
    /// its reads are still current; a write-only one appends its commit record and is
    /// committed; any other appends its commit record to the streams of every object it
    /// read or wrote, plays to it, and appends the decision record if an object written
    /// asks for one.
    pub async fn end(&self, tx: Tx) -> Result<TxOutcome, TangoError> {
        if tx.writes.is_empty() {
            self.sync().await?;
            let committed = self.runtime().validate(&tx.reads);
            return Ok(TxOutcome {
                committed,
                position: None,
                replies: vec![],
            });
        }
        let written = sorted_oids(tx.writes.iter().map(|w| w.oid));
        let decision_follows = !tx.reads.is_empty() && self.wants_decisions(&written).await?;
        let streams = sorted_oids(
            tx.reads
                .iter()
                .map(|r| r.oid)
                .chain(written.iter().copied()),
        );
        let record = tx.commit_record(decision_follows).encode();
        self.check_fits(record.len(), streams.len())?;
        if tx.reads.is_empty() {
            let position = self.inner.log.append(record, &streams).await?;
            return Ok(TxOutcome {
                committed: true,
                position: Some(position),
                replies: vec![],
            });
        }
        self.runtime().await_reply(tx.id);
        let played = async {
            let position = self.inner.log.append(record, &streams).await?;
            self.sync().await?;
            Ok::<_, TangoError>((position, self.runtime().take_reply(tx.id)))
        };
        let (position, reply) = match played.await {
            Ok(played) => played,
            Err(e) => {
                self.runtime().forget_reply(tx.id);
                return Err(e);
            }
        };
        let Some(Reply::Tx { committed, replies }) = reply else {
            unreachable!("the commit record at {position} played to {reply:?}");
        };
        if decision_follows {
            self.append_decision(position, committed, &written).await?;
        }
        Ok(TxOutcome {
            committed,
            position: Some(position),
            replies,
        })
    }

    /// Ends a read-only `tx` at the snapshot it read, touching no log (Tango's stale
    /// read-only transactions): whether its reads were consistent with each other.
    pub fn end_stale(&self, tx: &Tx) -> bool {
        assert!(
            tx.writes.is_empty(),
            "only read-only transactions end stale"
        );
        self.runtime().validate(&tx.reads)
    }

    /// Whether any of `oids` asks for decision records (the directory says).
    async fn wants_decisions(&self, oids: &[Oid]) -> Result<bool, TangoError> {
        let hosted = oids
            .iter()
            .map(|oid| self.inner.objects.values().find(|m| m.oid == *oid));
        if let Some(hosted) = hosted.collect::<Option<Vec<_>>>() {
            return Ok(hosted.iter().any(|m| m.decisions));
        }
        self.query(DIRECTORY_OID, |d: &Directory| {
            d.names().any(|(_, m)| m.decisions && oids.contains(&m.oid))
        })
        .await
    }

    fn check_fits(&self, bytes: usize, streams: usize) -> Result<(), TangoError> {
        if streams > STREAMS_PER_ENTRY_MAX {
            return Err(TangoError::TxTooManyObjects(streams));
        }
        let max = self.payload_max(streams);
        if bytes > max {
            return Err(TangoError::TxTooLarge {
                bytes,
                max,
                streams,
            });
        }
        Ok(())
    }

    /// The bytes of payload one entry in `streams` streams holds.
    fn payload_max(&self, streams: usize) -> usize {
        let layout = self.inner.log.layout();
        (layout.slot_bytes as usize).saturating_sub(header_bytes(streams, layout.backpointers))
    }

    /// Stores a checkpoint of the hosted object `oid` in the log, as of the tail (Tango
    /// §3.1): parts in no stream, then the checkpoint record in the object's stream. Returns
    /// the position it was taken at.
    pub async fn checkpoint(&self, oid: Oid) -> Result<u64, TangoError> {
        self.sync().await?;
        let (as_of, bytes) = {
            let runtime = self.runtime();
            (runtime.played(), runtime.checkpoint(oid)?)
        };
        // kind, object id and length before each part's bytes; kind, object id, position
        // and count before the parts' positions.
        let part_max = self.payload_max(0) - 9;
        let parts_max = (self.payload_max(1) - 17) / 8;
        if bytes.len().div_ceil(part_max) > parts_max {
            return Err(TangoError::CheckpointTooLarge {
                bytes: bytes.len(),
                max: parts_max * part_max,
            });
        }
        let parts = bytes.chunks(part_max.max(1)).map(|chunk| {
            let part = Record::CheckpointPart {
                oid,
                bytes: chunk.to_vec(),
            };
            self.inner.log.append(part.encode(), &[])
        });
        let parts = futures::future::try_join_all(parts).await?;
        let record = Record::Checkpoint { oid, as_of, parts }.encode();
        self.inner.log.append(record, &[oid]).await?;
        self.lock_checkpoints().insert(oid, as_of);
        Ok(as_of)
    }

    fn lock_checkpoints(&self) -> MutexGuard<'_, HashMap<Oid, u64>> {
        self.inner.checkpoints.lock().expect("checkpoints poisoned")
    }

    /// Gives up the history of object `name` (`"."` for the directory) below `position`,
    /// or below its latest checkpoint if that is lower: views are rebuilt from the
    /// checkpoint on. Returns the position recorded in the directory.
    pub async fn forget(&self, name: &str, position: u64) -> Result<u64, TangoError> {
        let oid = match name {
            DIRECTORY_NAME => DIRECTORY_OID,
            _ => self.hosted(name)?.oid,
        };
        let checkpoint = self.lock_checkpoints().get(&oid).copied();
        let position =
            position.min(checkpoint.ok_or_else(|| TangoError::NoCheckpoint(name.into()))?);
        self.update_reply(
            DIRECTORY_OID,
            Some(name.as_bytes()),
            Directory::forget(position),
        )
        .await?;
        Ok(position)
    }

    /// Trims the log below the lowest forget position over every object, the directory
    /// included (Tango §3.2); returns that position.
    pub async fn trim(&self) -> Result<u64, TangoError> {
        let point = self
            .query(DIRECTORY_OID, |d: &Directory| d.trim_point())
            .await?;
        if point > 0 {
            self.inner.log.trim(point).await?;
        }
        Ok(point)
    }

    /// The view of object `name` of `kind` as of `position` (every entry below it played),
    /// rebuilt from the latest checkpoint at or below it: the object's history.
    pub async fn view_at<T: Object, R>(
        &self,
        name: &str,
        position: u64,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, TangoError> {
        let meta =
            (self.lookup(name).await?).ok_or_else(|| TangoError::NoSuchObject(name.into()))?;
        let loaded = self.replay(vec![meta.oid], position).await?;
        Ok(loaded.runtime.view(meta.oid, f)?)
    }
}

/// Offers `runtime` what the streams found and plays to where all of them reached.
fn offer_streams(runtime: &mut Runtime, streams: &mut [Stream]) -> Result<Progress, TangoError> {
    let mut floor = u64::MAX;
    for stream in streams.iter_mut() {
        if let Some(trim) = stream.trimmed() {
            if trim > runtime.played() {
                return Err(TangoError::Trimmed {
                    trim,
                    played: runtime.played(),
                });
            }
        }
        for (position, payload) in stream.take_ready() {
            runtime.offer(position, &payload);
        }
        floor = floor.min(stream.floor());
    }
    Ok(runtime.play(floor))
}

/// Hosts `views` in a new runtime, each restored from its latest checkpoint (taken at or
/// below `until` if given), and offers it their streams' entries from the trim point on
/// (below `until` if given).
async fn load(
    log: &Log,
    views: Vec<(Oid, Box<dyn Object>)>,
    until: Option<u64>,
) -> Result<Loaded, TangoError> {
    let trim = log.trim_point().await?;
    let mut runtime = Runtime::new();
    let mut streams = Vec::with_capacity(views.len());
    let mut checkpoints = HashMap::new();
    let mut entries = BTreeMap::new();
    for (oid, view) in views {
        let mut stream = log.stream(oid, trim);
        stream.sync().await?;
        let found = stream.take_ready();
        let latest =
            found
                .iter()
                .rev()
                .find_map(|(&position, payload)| match Record::decode(payload) {
                    Ok(Record::Checkpoint {
                        oid: o,
                        as_of,
                        parts,
                    }) if o == oid && as_of >= trim && until.is_none_or(|u| as_of <= u) => {
                        Some((position, as_of, parts))
                    }
                    _ => None,
                });
        match latest {
            Some((position, as_of, parts)) => {
                let bytes = read_parts(log, oid, &parts).await?;
                runtime
                    .host_restored(oid, view, as_of, &bytes)
                    .map_err(|e| TangoError::Malformed { position, why: e.0 })?;
                checkpoints.insert(oid, as_of);
            }
            None => runtime.host(oid, view, 0),
        }
        entries.extend(
            found
                .into_iter()
                .filter(|(p, _)| until.is_none_or(|u| *p < u)),
        );
        streams.push(stream);
    }
    for (position, payload) in entries {
        runtime.offer(position, &payload);
    }
    Ok(Loaded {
        runtime,
        streams,
        checkpoints,
    })
}

async fn read_parts(log: &Log, oid: Oid, parts: &[u64]) -> Result<Vec<u8>, TangoError> {
    let reads = parts.iter().map(|&p| log.read(p));
    let mut bytes = Vec::new();
    for (&position, found) in parts
        .iter()
        .zip(futures::future::try_join_all(reads).await?)
    {
        let malformed = |why: String| TangoError::Malformed { position, why };
        let Found::Data { payload, .. } = found else {
            return Err(malformed(format!(
                "checkpoint part of object {oid} is {}",
                found.state()
            )));
        };
        match Record::decode(&payload) {
            Ok(Record::CheckpointPart {
                oid: o,
                bytes: part,
            }) if o == oid => bytes.extend(part),
            Ok(other) => {
                return Err(malformed(format!(
                    "not a checkpoint part of {oid}: {other:?}"
                )))
            }
            Err(e) => return Err(malformed(e.0)),
        }
    }
    Ok(bytes)
}
