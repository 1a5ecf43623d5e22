//! The sans-I/O heart of a tango client (Tango §3–4): the views it hosts, the versions of
//! their objects and keys, and the playing of their streams' entries in log order. It
//! decides every commit record it meets from those versions (the same on every client),
//! or, when it does not host the record's read set, waits for the decision record. The
//! driver (`Tango`) feeds it the entries its stream reads found and carries out its I/O.

use crate::codec::{Malformed, Reader, Writer};
use crate::object::Object;
use crate::record::{
    commit_len, speculative_len, write_decode, write_encode, written, Oid, Read, Record,
    Speculated, Write,
};
use crate::{planted, Bug};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

/// Malformed entries remembered for `malformed`, at most (the oldest are dropped).
pub const MALFORMED_KEPT_MAX: usize = 64;
/// Decisions remembered for `take_decisions`, at most (the oldest are dropped).
pub const DECISIONS_KEPT_MAX: usize = 4096;
/// A commit record more than this many positions after one of its speculative entries
/// aborts, and a view drops a speculative entry this far below what it played: an entry
/// whose writer died before its commit record (an orphan) is aborted and forgotten.
pub const SPECULATIVE_WINDOW: u64 = 1 << 20;

/// Whether the speculative entries of the commit record at `commit` are all below it and
/// within `SPECULATIVE_WINDOW` of it (if not, it aborts, the same on every client).
pub fn fresh(commit: u64, speculative: &[Speculated]) -> bool {
    speculative
        .iter()
        .all(|s| s.position < commit && commit - s.position <= SPECULATIVE_WINDOW)
}

/// One hosted object.
struct Hosted {
    view: Box<dyn Object>,
    /// Entries of the object's stream below this are already in the view (restored from a
    /// checkpoint taken there): they are not applied again, and its versions below it are
    /// unknown, so commits there that read it are not decided from them.
    from: u64,
    /// One past the position of the last committed write to the object (0: none; a write
    /// at position 0 must not look like no write).
    version: u64,
    /// One past the position of the last committed write without a key (it changes every
    /// key).
    whole: u64,
    /// One past the position of the last committed write of each key still in the view.
    keys: HashMap<Vec<u8>, u64>,
}

impl Hosted {
    fn version(&self, key: Option<&[u8]>) -> u64 {
        match key {
            None => self.version,
            Some(k) => self.keys.get(k).copied().unwrap_or(0).max(self.whole),
        }
    }
}

/// What a mutator that wrote an entry learns once it is played.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The update was applied; the object's reply.
    Applied(Vec<u8>),
    /// The object could not parse the update: it changed nothing.
    Malformed(String),
    /// The transaction's outcome, with the replies of its writes (in order) if it committed.
    Tx {
        committed: bool,
        replies: Vec<Vec<u8>>,
    },
}

/// How far `play` got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every entry below this position is played.
    Played(u64),
    /// Playing stopped at the commit record at `commit`: its read set includes objects
    /// not hosted here (or restored past it), and no decision record for it was seen yet.
    /// `streams`: those of the objects the commit writes.
    Blocked {
        commit: u64,
        reads: Vec<Read>,
        streams: Vec<Oid>,
    },
}

/// A commit record decided here whose writer promised a decision record not seen yet;
/// after a timeout, the driver appends it for the clients that cannot decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    pub committed: bool,
    pub streams: Vec<Oid>,
    /// The transaction is one this client awaits the outcome of (its own).
    pub own: bool,
}

/// A transaction's context (Tango §3.2): the versions its accessors saw and the writes its
/// mutators buffered. Reads see the views as played, never the transaction's own writes.
#[derive(Clone, Debug, Default)]
pub struct Tx {
    pub id: u64,
    pub reads: Vec<Read>,
    pub writes: Vec<Write>,
}

impl Tx {
    pub fn new(id: u64) -> Tx {
        Tx {
            id,
            ..Tx::default()
        }
    }

    pub fn write(&mut self, oid: Oid, key: Option<&[u8]>, data: Vec<u8>) {
        self.writes.push(Write {
            oid,
            key: key.map(<[u8]>::to_vec),
            data,
        });
    }

    /// The commit record that ends the transaction, all its writes in it.
    pub fn commit_record(&self, decision_follows: bool) -> Record {
        self.commit_record_after(decision_follows, &[])
    }

    /// The commit record that ends the transaction, its first writes in the speculative
    /// entries `speculated` (appended from `speculative`, in order).
    pub fn commit_record_after(&self, decision_follows: bool, speculated: &[Speculated]) -> Record {
        let skip: usize = speculated.iter().map(|s| s.writes as usize).sum();
        Record::Commit {
            tx: self.id,
            reads: self.reads.clone(),
            speculative: speculated.to_vec(),
            writes: self.writes[skip..].to_vec(),
            decision_follows,
        }
    }

    /// The speculative entry holding the writes in `range`.
    pub fn speculative(&self, range: Range<usize>) -> Record {
        Record::Speculative {
            tx: self.id,
            writes: self.writes[range].to_vec(),
        }
    }

    /// How the writes go into speculative entries so that the commit record fits in one
    /// entry (Tango §3.2): the writes of each speculative entry, in order, filled greedily
    /// from the first write; none when the commit record fits as it is. An entry in `n`
    /// streams holds `payload_max(n)` bytes; the commit record goes in `commit_streams`.
    pub fn split(
        &self,
        commit_streams: usize,
        payload_max: impl Fn(usize) -> usize,
    ) -> Result<Vec<Range<usize>>, TooLarge> {
        let commit_max = payload_max(commit_streams);
        let (mut ranges, mut speculated) = (Vec::new(), Vec::new());
        let mut start = 0;
        loop {
            let bytes = commit_len(&self.reads, &speculated, &self.writes[start..]);
            if bytes <= commit_max {
                return Ok(ranges);
            }
            if start == self.writes.len() {
                return Err(TooLarge {
                    bytes,
                    streams: commit_streams,
                });
            }
            let (mut end, mut oids, mut bytes) = (start, BTreeSet::new(), speculative_len(&[]));
            while let Some(w) = self.writes.get(end) {
                let streams = oids.len() + usize::from(!oids.contains(&w.oid));
                if bytes + w.encoded_len() > payload_max(streams) {
                    break;
                }
                bytes += w.encoded_len();
                oids.insert(w.oid);
                end += 1;
            }
            if end == start {
                return Err(TooLarge {
                    bytes: speculative_len(&self.writes[start..=start]),
                    streams: 1,
                });
            }
            speculated.push(Speculated {
                position: 0,
                oids: oids.into_iter().collect(),
                writes: (end - start) as u32,
            });
            ranges.push(start..end);
            start = end;
        }
    }
}

/// Part of a transaction that fits in no log entry: `bytes` long, in `streams` streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    pub bytes: usize,
    pub streams: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("object {0} is not hosted by this client")]
    NotHosted(Oid),
    #[error("object {oid} is not a {wanted}")]
    WrongType { oid: Oid, wanted: &'static str },
}

#[derive(Default)]
pub struct Runtime {
    hosted: BTreeMap<Oid, Hosted>,
    /// Every entry of the hosted streams below this position has been played.
    played: u64,
    /// Entries offered at or above `played`, not played yet.
    offered: BTreeMap<u64, Result<Record, Malformed>>,
    /// Outcomes from decision records, for commits at or above `played`.
    decisions: HashMap<u64, bool>,
    /// Speculative entries played that write a hosted object, by position, until their
    /// commit record is played or they leave `SPECULATIVE_WINDOW`.
    speculative: BTreeMap<u64, Vec<Write>>,
    owed: BTreeMap<u64, Owed>,
    /// Replies kept for the nonces and transaction ids mutators wait on.
    awaited: HashMap<u64, Option<Reply>>,
    malformed: Vec<(u64, String)>,
    decided: std::collections::VecDeque<(u64, bool)>,
}

impl Runtime {
    pub fn new() -> Runtime {
        Runtime::default()
    }

    /// Hosts `view` as object `oid`, whose entries below `from` it already reflects.
    /// Only before anything is played.
    pub fn host(&mut self, oid: Oid, view: Box<dyn Object>, from: u64) {
        assert_eq!(self.played, 0, "objects are hosted before playing");
        self.hosted.insert(
            oid,
            Hosted {
                view,
                from,
                version: 0,
                whole: 0,
                keys: HashMap::new(),
            },
        );
    }

    pub fn hosts(&self, oid: Oid) -> bool {
        self.hosted.contains_key(&oid)
    }

    pub fn hosted(&self) -> impl Iterator<Item = Oid> + '_ {
        self.hosted.keys().copied()
    }

    pub fn played(&self) -> u64 {
        self.played
    }

    /// Recent entries that could not be decoded or applied: (position, why).
    /// The commit records played since the last call, with their outcomes, in log order
    /// (the latest `DECISIONS_KEPT_MAX`): for observers; the simulator checks that every
    /// client decides each one alike.
    pub fn take_decisions(&mut self) -> Vec<(u64, bool)> {
        self.decided.drain(..).collect()
    }

    pub fn malformed(&self) -> &[(u64, String)] {
        &self.malformed
    }

    fn note_malformed(&mut self, position: u64, why: String) {
        tracing::warn!(position, %why, "a log entry a view cannot parse");
        if self.malformed.len() == MALFORMED_KEPT_MAX {
            self.malformed.remove(0);
        }
        self.malformed.push((position, why));
    }

    /// Keeps the reply of the update or transaction `id` for `take_reply`.
    pub fn await_reply(&mut self, id: u64) {
        self.awaited.insert(id, None);
    }

    /// The reply of `id` once its entry is played; stops keeping it.
    pub fn take_reply(&mut self, id: u64) -> Option<Reply> {
        match self.awaited.get(&id) {
            Some(Some(_)) => self.awaited.remove(&id).flatten(),
            _ => None,
        }
    }

    /// Stops waiting for `id` (its mutator gave up).
    pub fn forget_reply(&mut self, id: u64) {
        self.awaited.remove(&id);
    }

    fn reply(&mut self, id: u64, reply: Reply) {
        if let Some(slot) = self.awaited.get_mut(&id) {
            *slot = Some(reply);
        }
    }

    /// An entry of a hosted stream at `position`, found by a stream read. Entries may
    /// come in any order and more than once; `play` puts them in order.
    pub fn offer(&mut self, position: u64, payload: &[u8]) {
        if position < self.played || self.offered.contains_key(&position) {
            return;
        }
        let record = Record::decode(payload);
        if let Ok(Record::Decision { commit, committed }) = record {
            self.owed.remove(&commit);
            if commit >= self.played {
                self.decisions.insert(commit, committed);
            }
            return;
        }
        self.offered.insert(position, record);
    }

    /// A decision learnt another way (by rebuilding the read set's views at the commit).
    pub fn resolve(&mut self, commit: u64, committed: bool) {
        if commit >= self.played {
            self.decisions.insert(commit, committed);
        }
    }

    /// Commits decided here whose decision records are still missing.
    pub fn owed(&self) -> &BTreeMap<u64, Owed> {
        &self.owed
    }

    /// The decision record of the commit at `commit` was appended.
    pub fn settle_owed(&mut self, commit: u64) {
        self.owed.remove(&commit);
    }

    /// Plays every offered entry below `floor`, in log order. The caller has offered all
    /// entries of the hosted streams below `floor`.
    pub fn play(&mut self, floor: u64) -> Progress {
        while let Some((&position, entry)) = self.offered.first_key_value() {
            if position >= floor {
                break;
            }
            if let Ok(Record::Commit {
                reads,
                writes,
                speculative,
                ..
            }) = entry
            {
                let streams = written(writes, speculative);
                let affects_views = (streams.iter())
                    .any(|oid| (self.hosted.get(oid)).is_some_and(|h| h.from <= position));
                if affects_views
                    && !self.decisions.contains_key(&position)
                    && fresh(position, speculative)
                    && !self.decidable(position, reads)
                {
                    let reads = reads.clone();
                    self.played = position;
                    return Progress::Blocked {
                        commit: position,
                        reads,
                        streams,
                    };
                }
            }
            let (_, record) = self.offered.pop_first().expect("peeked");
            self.played = position + 1;
            match record {
                Ok(record) => self.play_record(position, record),
                Err(e) => self.note_malformed(position, e.0),
            }
        }
        self.played = self.played.max(floor);
        while let Some((&position, _)) = self.speculative.first_key_value() {
            if position + SPECULATIVE_WINDOW >= self.played {
                break;
            }
            self.speculative.pop_first();
        }
        Progress::Played(self.played)
    }

    /// Whether this client can decide the commit at `position` from its own versions.
    fn decidable(&self, position: u64, reads: &[Read]) -> bool {
        if planted(Bug::IgnoreDecisionRecords) {
            return true;
        }
        reads
            .iter()
            .all(|r| (self.hosted.get(&r.oid)).is_some_and(|h| h.from <= position))
    }

    /// Whether every read's version is the current one.
    pub fn validate(&self, reads: &[Read]) -> bool {
        reads.iter().all(|r| match self.hosted.get(&r.oid) {
            Some(h) if planted(Bug::DecideFromStaleVersion) => {
                r.version <= h.version(r.key.as_deref())
            }
            Some(h) => h.version(r.key.as_deref()) == r.version,
            None => planted(Bug::IgnoreDecisionRecords),
        })
    }

    fn play_record(&mut self, position: u64, record: Record) {
        match record {
            Record::Update { nonce, write } => {
                if let Some(reply) = self.apply(position, &write) {
                    self.reply(nonce, reply);
                }
            }
            Record::Speculative { writes, .. } => {
                if planted(Bug::ApplySpeculativeOnSight) {
                    for write in &writes {
                        self.apply(position, write);
                    }
                    return;
                }
                let hosts_one = (writes.iter())
                    .any(|w| (self.hosted.get(&w.oid)).is_some_and(|h| h.from <= position));
                if hosts_one {
                    self.speculative.insert(position, writes);
                }
            }
            Record::Commit {
                tx,
                reads,
                speculative,
                writes,
                decision_follows,
            } => {
                let decided = self.decisions.remove(&position);
                let fresh = fresh(position, &speculative);
                if decided.is_none() && fresh && !self.decidable(position, &reads) {
                    // It writes nothing hosted here (`play` checked): nothing to decide.
                    return;
                }
                let committed = match decided {
                    Some(committed) => committed,
                    None => {
                        let committed = fresh && self.validate(&reads);
                        if decision_follows && fresh {
                            let streams = written(&writes, &speculative);
                            let own = self.awaited.contains_key(&tx);
                            let owed = Owed {
                                committed,
                                streams,
                                own,
                            };
                            self.owed.insert(position, owed);
                        }
                        committed
                    }
                };
                let mut replies = Vec::new();
                for s in &speculative {
                    let held = self.speculative.remove(&s.position);
                    if !committed {
                        continue;
                    }
                    match held {
                        Some(held) => {
                            replies.extend(held.iter().map(|w| self.reply_of(position, w)))
                        }
                        // It writes nothing hosted here.
                        None => replies.extend((0..s.writes).map(|_| Vec::new())),
                    }
                }
                if committed {
                    replies.extend(writes.iter().map(|w| self.reply_of(position, w)));
                }
                if self.decided.len() == DECISIONS_KEPT_MAX {
                    self.decided.pop_front();
                }
                self.decided.push_back((position, committed));
                self.reply(tx, Reply::Tx { committed, replies });
            }
            Record::Decision { .. } | Record::CheckpointPart { .. } | Record::Checkpoint { .. } => {
            }
        }
    }

    /// Applies one write of a committed transaction: the object's reply, empty if the
    /// object is not hosted here or could not parse it.
    fn reply_of(&mut self, position: u64, write: &Write) -> Vec<u8> {
        match self.apply(position, write) {
            Some(Reply::Applied(reply)) => reply,
            _ => Vec::new(),
        }
    }

    /// Applies one write to its object if hosted here (and not already in its view).
    fn apply(&mut self, position: u64, write: &Write) -> Option<Reply> {
        let hosted = self.hosted.get_mut(&write.oid)?;
        if position < hosted.from {
            return None;
        }
        match hosted
            .view
            .apply(write.key.as_deref(), &write.data, position)
        {
            Ok(applied) => {
                let version = position + 1;
                hosted.version = version;
                match &write.key {
                    None => hosted.whole = version,
                    Some(key) if applied.key_removed => {
                        hosted.keys.remove(key);
                    }
                    Some(key) => {
                        hosted.keys.insert(key.clone(), version);
                    }
                }
                Some(Reply::Applied(applied.reply))
            }
            Err(e) => {
                let why = format!("object {}: {}", write.oid, e.0);
                self.note_malformed(position, why.clone());
                Some(Reply::Malformed(why))
            }
        }
    }

    /// Runs `f` on the view of `oid` as played.
    pub fn view<T: Object, R>(&self, oid: Oid, f: impl FnOnce(&T) -> R) -> Result<R, ViewError> {
        let hosted = self.hosted.get(&oid).ok_or(ViewError::NotHosted(oid))?;
        let any: &dyn Any = &*hosted.view;
        let view = any.downcast_ref::<T>().ok_or(ViewError::WrongType {
            oid,
            wanted: std::any::type_name::<T>(),
        })?;
        Ok(f(view))
    }

    /// Runs `f` on the view of `oid` inside `tx`, recording the version read (of `key`, or
    /// of the whole object) in its read set.
    pub fn view_in<T: Object, R>(
        &self,
        tx: &mut Tx,
        oid: Oid,
        key: Option<&[u8]>,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, ViewError> {
        let r = self.view(oid, f)?;
        let version = self.hosted[&oid].version(key);
        let read = Read {
            oid,
            key: key.map(<[u8]>::to_vec),
            version,
        };
        if !tx.reads.contains(&read) {
            tx.reads.push(read);
        }
        Ok(r)
    }

    /// The view and versions of `oid` as played, for a checkpoint.
    pub fn checkpoint(&self, oid: Oid) -> Result<Vec<u8>, ViewError> {
        let h = self.hosted.get(&oid).ok_or(ViewError::NotHosted(oid))?;
        let mut w = Writer::new();
        w.u64(h.version).u64(h.whole).u32(h.keys.len() as u32);
        let mut keys: Vec<_> = h.keys.iter().collect();
        keys.sort();
        for (key, version) in keys {
            w.bytes(key).u64(*version);
        }
        let pending: Vec<_> = (self.speculative.iter())
            .filter(|(_, writes)| writes.iter().any(|w| w.oid == oid))
            .collect();
        w.u32(pending.len() as u32);
        for (position, writes) in pending {
            w.u64(*position).u32(writes.len() as u32);
            for write in writes {
                write_encode(&mut w, write);
            }
        }
        w.bytes(&h.view.checkpoint());
        Ok(w.finish())
    }

    /// Hosts `view` restored from `checkpoint` (from `Runtime::checkpoint`) taken when every
    /// entry below `as_of` was played.
    pub fn host_restored(
        &mut self,
        oid: Oid,
        mut view: Box<dyn Object>,
        as_of: u64,
        checkpoint: &[u8],
    ) -> Result<(), Malformed> {
        let mut r = Reader::new(checkpoint);
        let version = r.u64("checkpoint's version")?;
        let whole = r.u64("checkpoint's whole version")?;
        let n = r.count("checkpoint's keys", 12)?;
        let mut keys = HashMap::with_capacity(n);
        for _ in 0..n {
            let key = r.bytes("checkpoint's key")?.to_vec();
            keys.insert(key, r.u64("checkpoint's key version")?);
        }
        let n = r.count("checkpoint's speculative entries", 12)?;
        let mut pending = Vec::with_capacity(n);
        for _ in 0..n {
            let position = r.u64("speculative entry's position")?;
            let writes = r.count("speculative entry's writes", 9)?;
            let writes = (0..writes)
                .map(|_| write_decode(&mut r))
                .collect::<Result<Vec<_>, _>>()?;
            pending.push((position, writes));
        }
        view.restore(r.bytes("checkpoint's view")?)?;
        r.end("checkpoint")?;
        self.host(oid, view, as_of);
        let h = self.hosted.get_mut(&oid).expect("just hosted");
        (h.version, h.whole, h.keys) = (version, whole, keys);
        for (position, writes) in pending {
            self.speculative.entry(position).or_insert(writes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Counter, Kind, Map, Register};

    fn put(oid: Oid, key: &str, value: &str) -> Write {
        Write {
            oid,
            key: Some(key.as_bytes().to_vec()),
            data: Map::put(value.as_bytes()),
        }
    }

    fn update(write: Write) -> Vec<u8> {
        Record::Update { nonce: 0, write }.encode()
    }

    fn hosting(oids: &[(Oid, Kind)]) -> Runtime {
        let mut rt = Runtime::new();
        for &(oid, kind) in oids {
            rt.host(oid, kind.view(), 0);
        }
        rt
    }

    fn get(rt: &Runtime, oid: Oid, key: &str) -> Option<Vec<u8>> {
        rt.view(oid, |m: &Map| m.table.get(key.as_bytes()).cloned())
            .unwrap()
    }

    #[test]
    fn updates_play_in_log_order_whatever_order_they_are_offered_in() {
        let mut rt = hosting(&[(1, Kind::Map)]);
        rt.offer(5, &update(put(1, "k", "second")));
        rt.offer(2, &update(put(1, "k", "first")));
        assert_eq!(rt.play(4), Progress::Played(4));
        assert_eq!(get(&rt, 1, "k"), Some(b"first".to_vec()));
        rt.offer(2, &update(put(1, "k", "again")));
        assert_eq!(rt.play(6), Progress::Played(6));
        assert_eq!(get(&rt, 1, "k"), Some(b"second".to_vec()));
    }

    #[test]
    fn a_commit_with_a_stale_read_aborts_and_one_on_another_key_commits() {
        let mut rt = hosting(&[(1, Kind::Map)]);
        rt.offer(0, &update(put(1, "a", "0")));
        rt.play(1);
        let mut stale = Tx::new(7);
        let mut other_key = Tx::new(8);
        rt.view_in(&mut stale, 1, Some(b"a"), |_: &Map| ()).unwrap();
        rt.view_in(&mut other_key, 1, Some(b"b"), |_: &Map| ())
            .unwrap();
        stale.write(1, Some(b"b"), Map::put(b"from stale"));
        other_key.write(1, Some(b"c"), Map::put(b"from other"));
        rt.await_reply(7);
        rt.await_reply(8);
        rt.offer(1, &update(put(1, "a", "1")));
        rt.offer(2, &stale.commit_record(false).encode());
        rt.offer(3, &other_key.commit_record(false).encode());
        rt.play(4);
        assert!(matches!(
            rt.take_reply(7),
            Some(Reply::Tx {
                committed: false,
                ..
            })
        ));
        assert!(matches!(
            rt.take_reply(8),
            Some(Reply::Tx {
                committed: true,
                ..
            })
        ));
        assert_eq!(get(&rt, 1, "b"), None);
        assert_eq!(get(&rt, 1, "c"), Some(b"from other".to_vec()));
    }

    /// A client hosting an object written but not the read set waits for the decision
    /// record, and reaches the decision the client hosting the read set made.
    #[test]
    fn a_client_without_the_read_set_waits_for_the_decision_record() {
        let mut full = hosting(&[(1, Kind::Register), (2, Kind::Register)]);
        let mut partial = hosting(&[(2, Kind::Register)]);
        let mut tx = Tx::new(9);
        full.view_in(&mut tx, 1, None, |_: &Register| ()).unwrap();
        tx.write(2, None, b"written".to_vec());
        let commit = tx.commit_record(true).encode();
        let later = update(Write {
            oid: 2,
            key: None,
            data: b"later".to_vec(),
        });
        for rt in [&mut full, &mut partial] {
            rt.offer(0, &commit);
            rt.offer(1, &later);
        }
        assert_eq!(full.play(2), Progress::Played(2));
        assert!(full.owed()[&0].committed);
        let blocked = partial.play(2);
        assert!(
            matches!(blocked, Progress::Blocked { commit: 0, ref streams, .. } if streams == &[2])
        );
        partial.offer(
            2,
            &Record::Decision {
                commit: 0,
                committed: true,
            }
            .encode(),
        );
        assert_eq!(partial.play(3), Progress::Played(3));
        for rt in [&full, &partial] {
            assert_eq!(
                rt.view(2, |r: &Register| r.value.clone()).unwrap(),
                b"later"
            );
        }
        assert!(partial.owed().is_empty());
    }

    #[test]
    fn a_commit_writing_nothing_hosted_is_skipped_unless_decidable() {
        let mut rt = hosting(&[(1, Kind::Counter)]);
        let mut tx = Tx::new(3);
        tx.reads.push(Read {
            oid: 5,
            key: None,
            version: 0,
        });
        tx.write(6, None, Counter::add(1));
        rt.offer(0, &tx.commit_record(true).encode());
        assert_eq!(rt.play(1), Progress::Played(1));
    }

    #[test]
    fn a_malformed_entry_is_reported_and_changes_nothing() {
        let mut rt = hosting(&[(1, Kind::Counter)]);
        rt.await_reply(11);
        rt.offer(0, b"\xffgarbage");
        let bad = Write {
            oid: 1,
            key: None,
            data: vec![1, 2],
        };
        rt.offer(
            1,
            &Record::Update {
                nonce: 11,
                write: bad,
            }
            .encode(),
        );
        rt.offer(
            2,
            &update(Write {
                oid: 1,
                key: None,
                data: Counter::add(5),
            }),
        );
        assert_eq!(rt.play(3), Progress::Played(3));
        assert_eq!(rt.view(1, |c: &Counter| c.value).unwrap(), 5);
        let positions: Vec<u64> = rt.malformed().iter().map(|m| m.0).collect();
        assert_eq!(positions, vec![0, 1]);
        assert!(matches!(rt.take_reply(11), Some(Reply::Malformed(_))));
    }

    #[test]
    fn a_restored_view_has_the_same_state_and_versions() {
        let mut rt = hosting(&[(1, Kind::Map)]);
        rt.offer(0, &update(put(1, "a", "x")));
        rt.offer(1, &update(put(1, "b", "y")));
        rt.play(2);
        let bytes = rt.checkpoint(1).unwrap();
        let mut restored = Runtime::new();
        restored
            .host_restored(1, Kind::Map.view(), 2, &bytes)
            .unwrap();
        let mut tx = Tx::new(1);
        rt.view_in(&mut tx, 1, Some(b"a"), |_: &Map| ()).unwrap();
        rt.view_in(&mut tx, 1, None, |_: &Map| ()).unwrap();
        assert!(restored.validate(&tx.reads));
        assert_eq!(get(&restored, 1, "b"), Some(b"y".to_vec()));
        // An entry below the checkpoint is not applied again.
        restored.offer(1, &update(put(1, "b", "old")));
        restored.play(2);
        assert_eq!(get(&restored, 1, "b"), Some(b"y".to_vec()));
    }

    /// A transaction with every write but the last in speculative entries (1 write each).
    fn speculated_tx(id: u64, writes: &[Write]) -> (Vec<Vec<u8>>, Tx) {
        let mut tx = Tx::new(id);
        tx.writes = writes.to_vec();
        let entries = (0..writes.len() - 1)
            .map(|i| tx.speculative(i..i + 1).encode())
            .collect();
        (entries, tx)
    }

    fn speculated(position: u64, oid: Oid) -> Speculated {
        Speculated {
            position,
            oids: vec![oid],
            writes: 1,
        }
    }

    #[test]
    fn speculative_writes_show_only_when_their_commit_record_commits() {
        let mut rt = hosting(&[(1, Kind::Map), (2, Kind::Map)]);
        let (entries, mut tx) =
            speculated_tx(5, &[put(1, "a", "x"), put(2, "b", "y"), put(1, "c", "z")]);
        rt.view_in(&mut tx, 1, Some(b"guard"), |_: &Map| ())
            .unwrap();
        for (i, entry) in entries.iter().enumerate() {
            rt.offer(i as u64, entry);
        }
        rt.play(2);
        assert_eq!(get(&rt, 1, "a"), None, "not before the commit record");
        rt.await_reply(5);
        let commit = tx.commit_record_after(false, &[speculated(0, 1), speculated(1, 2)]);
        rt.offer(2, &commit.encode());
        rt.play(3);
        assert_eq!(
            rt.take_reply(5),
            Some(Reply::Tx {
                committed: true,
                replies: vec![vec![0], vec![0], vec![0]],
            })
        );
        assert_eq!(get(&rt, 1, "a"), Some(b"x".to_vec()));
        assert_eq!(get(&rt, 2, "b"), Some(b"y".to_vec()));
        assert_eq!(get(&rt, 1, "c"), Some(b"z".to_vec()));

        // The same again with a stale read: nothing shows.
        let (entries, mut stale) = speculated_tx(6, &[put(1, "a", "no"), put(2, "b", "no")]);
        rt.view_in(&mut stale, 1, Some(b"c"), |_: &Map| ()).unwrap();
        rt.offer(3, &entries[0]);
        rt.offer(4, &update(put(1, "c", "moved")));
        rt.offer(
            5,
            &stale
                .commit_record_after(false, &[speculated(3, 1)])
                .encode(),
        );
        rt.play(6);
        assert_eq!(get(&rt, 1, "a"), Some(b"x".to_vec()));
        assert_eq!(get(&rt, 2, "b"), Some(b"y".to_vec()));
        assert!(
            rt.speculative.is_empty(),
            "an aborted transaction's entries are dropped"
        );
    }

    #[test]
    fn an_orphaned_speculative_entry_is_dropped_and_a_late_commit_aborts() {
        let mut rt = hosting(&[(1, Kind::Map)]);
        let (entries, tx) = speculated_tx(5, &[put(1, "a", "x"), put(1, "b", "y")]);
        rt.offer(10, &entries[0]);
        rt.play(11);
        assert_eq!(rt.speculative.len(), 1);
        let late = 10 + SPECULATIVE_WINDOW + 1;
        rt.offer(
            late,
            &tx.commit_record_after(false, &[speculated(10, 1)]).encode(),
        );
        rt.play(late + 1);
        assert!(rt.speculative.is_empty());
        assert_eq!(get(&rt, 1, "a"), None);
        assert_eq!(get(&rt, 1, "b"), None, "the late commit record aborted");
        assert_eq!(rt.take_decisions(), vec![(late, false)]);
        assert!(
            !fresh(3, &[speculated(3, 1)]),
            "an entry at the commit's own position"
        );
    }

    #[test]
    fn a_checkpoint_carries_speculative_entries_its_commit_has_not_met() {
        let mut rt = hosting(&[(1, Kind::Map)]);
        let (entries, tx) = speculated_tx(5, &[put(1, "a", "x"), put(1, "b", "y")]);
        rt.offer(0, &entries[0]);
        rt.play(1);
        let bytes = rt.checkpoint(1).unwrap();
        let mut restored = Runtime::new();
        restored
            .host_restored(1, Kind::Map.view(), 1, &bytes)
            .unwrap();
        restored.offer(
            1,
            &tx.commit_record_after(false, &[speculated(0, 1)]).encode(),
        );
        restored.play(2);
        assert_eq!(get(&restored, 1, "a"), Some(b"x".to_vec()));
        assert_eq!(get(&restored, 1, "b"), Some(b"y".to_vec()));
    }

    #[test]
    fn split_fills_speculative_entries_until_the_commit_record_fits() {
        let mut tx = Tx::new(1);
        for i in 0..10 {
            tx.writes
                .push(put(1 + i % 2, &format!("k{i}"), &"v".repeat(40)));
        }
        // 10 writes of 60 bytes; 200 bytes an entry: 3 writes a speculative entry.
        let ranges = tx.split(2, |_| 200).unwrap();
        assert_eq!(ranges, vec![0..3, 3..6, 6..9]);
        let speculated: Vec<Speculated> = (ranges.iter())
            .map(|r| Speculated {
                position: 0,
                oids: vec![1, 2],
                writes: r.len() as u32,
            })
            .collect();
        assert!(tx.commit_record_after(false, &speculated).encode().len() <= 200);
        assert_eq!(tx.split(2, |_| 4096).unwrap(), Vec::<Range<usize>>::new());
        assert_eq!(
            tx.split(2, |_| 60),
            Err(TooLarge {
                bytes: 73,
                streams: 1
            }),
            "one write larger than an entry"
        );
    }

    #[test]
    fn views_of_the_wrong_type_or_not_hosted_are_errors() {
        let rt = hosting(&[(1, Kind::Map)]);
        assert_eq!(rt.view(2, |_: &Map| ()), Err(ViewError::NotHosted(2)));
        assert!(matches!(
            rt.view(1, |_: &Counter| ()),
            Err(ViewError::WrongType { oid: 1, .. })
        ));
    }
}
