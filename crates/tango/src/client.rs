//! `Tango`, the driver of a `Runtime` over the log (Tango §3–4): it resolves names in the
//! directory, rebuilds the hosted views from their latest checkpoints and streams, plays
//! the streams to the tail before every accessor, appends updates, commit records and
//! decision records, checkpoints, forgets and trims.

use crate::directory::{Created, Directory, Meta, DIRECTORY_NAME, DIRECTORY_OID, NAME_BYTES_MAX};
use crate::error::TangoError;
use crate::object::Object;
use crate::objects::Kind;
use crate::play::{Load, LoadStep, PlayStep, Player, Rebuild, RebuildStep, Synced, Views};
use crate::record::{sorted_oids, Oid, Record, Speculated, Write};
use crate::runtime::{fresh, Reply, Runtime, TooLarge, Tx};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tutti_log::entry::{header_bytes, STREAMS_PER_ENTRY_MAX};
use tutti_log::{Log, Stream};

/// How long a player waits for a missing decision record before it rebuilds the read
/// set's views and decides itself, and how long a commit decided here may go without its
/// decision record before this client appends it for the others.
pub const DECISION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(500);
/// Loads of the views an open makes when trims keep passing them (a maintainer trimming
/// faster than the views load), before it gives up with `Trimmed`.
const LOAD_TRIES_MAX: u32 = 5;

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
    /// The hosted objects other than the directory, by name.
    objects: BTreeMap<String, Meta>,
    runtime: Mutex<Runtime>,
    playing: tokio::sync::Mutex<Playing>,
    /// Syncs begun, and the number of the last one finished (syncs are numbered from 1 in
    /// the order they begin, under the player's lock).
    syncs_begun: AtomicU64,
    syncs_done: AtomicU64,
    /// Each hosted object's latest checkpoint known here: the position it was taken at.
    checkpoints: Mutex<HashMap<Oid, u64>>,
}

/// The streams of the hosted objects, read together, and their player.
struct Playing {
    streams: Vec<Stream>,
    player: Player,
    /// The player's clock starts here.
    start: Instant,
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
        let mut tries = 1;
        loop {
            let mut views: Views = vec![(DIRECTORY_OID, Box::new(Directory::default()))];
            views.extend(objects.values().map(|m| (m.oid, m.kind.view())));
            let loaded = match load(&log, views, None, None).await {
                // A trim passed the load: start again from the new trim point.
                Err(TangoError::Trimmed { .. }) if tries < LOAD_TRIES_MAX => {
                    tries += 1;
                    continue;
                }
                loaded => loaded?,
            };
            let decision_timeout = opts.decision_timeout;
            let tango = Tango {
                inner: Arc::new(Inner {
                    log: log.clone(),
                    objects: objects.clone(),
                    runtime: Mutex::new(loaded.runtime),
                    playing: tokio::sync::Mutex::new(Playing {
                        streams: loaded.streams,
                        player: Player::new(decision_timeout),
                        start: Instant::now(),
                    }),
                    syncs_begun: AtomicU64::new(0),
                    syncs_done: AtomicU64::new(0),
                    checkpoints: Mutex::new(loaded.checkpoints),
                }),
            };
            // A trim between the load and this first play passes what was loaded, too.
            match tango.sync().await {
                Err(TangoError::Trimmed { .. }) if tries < LOAD_TRIES_MAX => tries += 1,
                synced => return synced.map(|()| tango),
            }
        }
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
        let mut playing = self.inner.playing.lock().await;
        if self.inner.syncs_done.load(Ordering::SeqCst) > ticket {
            return Ok(());
        }
        let number = self.inner.syncs_begun.fetch_add(1, Ordering::SeqCst) + 1;
        self.catch_up(&mut playing).await?;
        self.inner.syncs_done.store(number, Ordering::SeqCst);
        Ok(())
    }

    async fn catch_up(&self, playing: &mut Playing) -> Result<(), TangoError> {
        let Playing {
            streams,
            player,
            start,
        } = playing;
        let mut step = PlayStep::Sync;
        loop {
            step = match step {
                PlayStep::Sync => {
                    let synced = sync_all(streams).await?;
                    player.on_synced(&mut self.runtime(), synced, start.elapsed())?
                }
                PlayStep::Pause(pause) => {
                    tokio::time::sleep(pause).await;
                    PlayStep::Sync
                }
                PlayStep::Replay { commit, reads } => {
                    let oids = reads.iter().map(|r| r.oid);
                    let views = self.rebuild(oids, commit).await?;
                    let committed = views.validate(&reads);
                    player.on_replayed(&mut self.runtime(), commit, committed)
                }
                PlayStep::AppendDecision {
                    commit,
                    committed,
                    streams,
                } => {
                    let record = Record::Decision { commit, committed };
                    self.inner.log.append(record.encode(), &streams).await?;
                    player.on_decision_appended(&mut self.runtime(), commit, start.elapsed())
                }
                PlayStep::Done => return Ok(()),
            }
        }
    }

    /// Views of `oids` as of `until`, rebuilt from their checkpoints and streams.
    async fn rebuild(
        &self,
        oids: impl IntoIterator<Item = Oid>,
        until: u64,
    ) -> Result<Runtime, TangoError> {
        let (mut rebuild, mut step) = Rebuild::new(oids, until);
        loop {
            match step {
                RebuildStep::Load {
                    oids,
                    until,
                    start_by,
                } => {
                    let views = self.views_of(&oids, until)?;
                    let loaded = load(&self.inner.log, views, Some(until), Some(start_by)).await?;
                    step = rebuild.on_loaded(loaded.runtime)?;
                }
                RebuildStep::Done(runtime) => return Ok(*runtime),
            }
        }
    }

    /// Empty views of `oids`, of the kinds the directory gives them.
    fn views_of(&self, oids: &[Oid], until: u64) -> Result<Views, TangoError> {
        let views = self.runtime().view(DIRECTORY_OID, |d: &Directory| {
            (oids.iter())
                .map(|&oid| match oid {
                    DIRECTORY_OID => Some((oid, Box::new(Directory::default()) as Box<dyn Object>)),
                    _ => (d.name_of(oid).and_then(|n| d.get(n))).map(|m| (oid, m.kind.view())),
                })
                .collect::<Option<Vec<_>>>()
        })?;
        views.ok_or_else(|| TangoError::Undecided {
            commit: until,
            why: format!("objects {oids:?} are not all named in the directory"),
        })
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
    /// asks for one. Writes that do not fit in the commit record go first, in parallel, into
    /// speculative entries that it names (Tango §3.2; the buffer is flushed here rather than
    /// as it fills, as no one plays speculative entries before their commit record).
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
        let speculated = self.speculate(&tx, streams.len()).await?;
        let record = tx
            .commit_record_after(decision_follows, &speculated)
            .encode();
        if tx.reads.is_empty() {
            let position = self.inner.log.append(record, &streams).await?;
            return Ok(TxOutcome {
                committed: fresh(position, &speculated),
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
        // Unless the player appended it while blocked, or another client's came first.
        let owed = self.runtime().owed().contains_key(&position);
        if decision_follows && owed {
            let record = Record::Decision {
                commit: position,
                committed,
            };
            self.inner.log.append(record.encode(), &written).await?;
            self.runtime().settle_owed(position);
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

    /// Appends the speculative entries `tx` needs for its commit record (in
    /// `commit_streams` streams) to fit in one entry; what its commit record names.
    async fn speculate(
        &self,
        tx: &Tx,
        commit_streams: usize,
    ) -> Result<Vec<Speculated>, TangoError> {
        if commit_streams > STREAMS_PER_ENTRY_MAX {
            return Err(TangoError::TxTooManyObjects(commit_streams));
        }
        let ranges = (tx.split(commit_streams, |n| self.payload_max(n))).map_err(
            |TooLarge { bytes, streams }| TangoError::TxTooLarge {
                bytes,
                max: self.payload_max(streams),
                streams,
            },
        )?;
        let appends = ranges.into_iter().map(|range| {
            let writes = range.len() as u32;
            let record = tx.speculative(range);
            let oids = record.streams();
            async move {
                let position = self.inner.log.append(record.encode(), &oids).await?;
                Ok::<_, TangoError>(Speculated {
                    position,
                    oids,
                    writes,
                })
            }
        });
        futures::future::try_join_all(appends).await
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
        self.checkpoint_at_one_position(&[oid]).await
    }

    /// Checkpoints every hosted object and the directory at one position, the tail, which
    /// it returns: a client hosting several of them starts them all there, so every commit
    /// after it can be decided from them (docs/objects.md, "Checkpoints, forget and trim").
    pub async fn checkpoint_all(&self) -> Result<u64, TangoError> {
        let oids: Vec<Oid> = self.runtime().hosted().collect();
        self.checkpoint_at_one_position(&oids).await
    }

    async fn checkpoint_at_one_position(&self, oids: &[Oid]) -> Result<u64, TangoError> {
        self.sync().await?;
        let (as_of, views) = {
            let runtime = self.runtime();
            let views = (oids.iter())
                .map(|&oid| runtime.checkpoint(oid).map(|bytes| (oid, bytes)))
                .collect::<Result<Vec<_>, _>>()?;
            (runtime.played(), views)
        };
        // kind, object id and length before each part's bytes; kind, object id, position
        // and count before the parts' positions.
        let part_max = self.payload_max(0) - 9;
        let parts_max = (self.payload_max(1) - 17) / 8;
        if let Some((_, bytes)) =
            (views.iter()).find(|(_, b)| b.len().div_ceil(part_max) > parts_max)
        {
            return Err(TangoError::CheckpointTooLarge {
                bytes: bytes.len(),
                max: parts_max * part_max,
            });
        }
        for (oid, bytes) in views {
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
        }
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

    /// Checkpoints every hosted object and the directory at one position, forgets their
    /// history below it, and trims the log below every object's forget position (what a
    /// maintainer of a long-lived log runs, `tutti obj maintain`): returns the checkpoints'
    /// position and the trim point, which stays below objects this client does not host
    /// until they are forgotten too.
    pub async fn compact(&self) -> Result<(u64, u64), TangoError> {
        let as_of = self.checkpoint_all().await?;
        for name in self.inner.objects.keys() {
            self.forget(name, as_of).await?;
        }
        self.forget(DIRECTORY_NAME, as_of).await?;
        Ok((as_of, self.trim().await?))
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
        let views = self.rebuild([meta.oid], position).await?;
        Ok(views.view(meta.oid, f)?)
    }
}

/// Syncs every stream and hands over what each found.
async fn sync_all(streams: &mut [Stream]) -> Result<Vec<Synced>, TangoError> {
    futures::future::try_join_all(streams.iter_mut().map(|s| s.sync())).await?;
    Ok((streams.iter_mut())
        .map(|s| Synced {
            entries: s.take_ready(),
            floor: s.floor(),
            trimmed: s.trimmed(),
        })
        .collect())
}

/// Runs a `Load` of `views` against the log; keeps the streams it synced.
async fn load(
    log: &Log,
    views: Views,
    until: Option<u64>,
    start_by: Option<u64>,
) -> Result<Loaded, TangoError> {
    let (mut load, mut step) = Load::starting_by(views, until, start_by);
    let mut streams = Vec::new();
    loop {
        step = match step {
            LoadStep::TrimPoint => load.on_trim_point(log.trim_point().await?),
            LoadStep::Sync { oids, from } => {
                streams = oids.iter().map(|&oid| log.stream(oid, from)).collect();
                load.on_synced(&sync_all(&mut streams).await?)?
            }
            LoadStep::ReadParts(positions) => {
                let reads = positions.iter().map(|&p| log.read(p));
                load.on_parts(futures::future::try_join_all(reads).await?)?
            }
            LoadStep::Done => {
                let checkpoints = load.restored.clone();
                return Ok(Loaded {
                    runtime: load.runtime(),
                    streams,
                    checkpoints,
                });
            }
        }
    }
}
