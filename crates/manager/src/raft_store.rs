//! What a manager replica keeps of its Raft group: the hard state, a snapshot (the
//! manager's durable state as of an index, with the group's voters) and the entries after
//! it. `raft::Storage` reads it; `encode`/`decode` turn it into the bytes the driver writes
//! atomically (`raft.bin`) before anything that depends on them leaves the process.

use bincode::{Decode, Encode};
use protobuf::ProtobufEnum as _;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

/// An entry as stored: raft's fields that this group uses (no context, no sync log).
#[derive(Encode, Decode, Clone, Debug, PartialEq)]
struct StoredEntry {
    index: u64,
    term: u64,
    /// `EntryType` as its protobuf number.
    kind: i32,
    data: Vec<u8>,
}

/// The file's contents: the version first, so that a later layout can be told apart.
#[derive(Encode, Decode, Debug, PartialEq)]
struct Stored {
    version: u32,
    term: u64,
    vote: u64,
    commit: u64,
    snapshot_index: u64,
    snapshot_term: u64,
    voters: Vec<u64>,
    snapshot_data: Vec<u8>,
    entries: Vec<StoredEntry>,
}

const STORED_VERSION: u32 = 1;

#[derive(Clone, Debug, Default)]
pub struct RaftStore {
    hard_state: HardState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
}

impl RaftStore {
    /// A new group's first state: `voters` and `data` (the manager's durable state) as a
    /// snapshot at index 1, term 1, as every replica of the group starts.
    pub fn bootstrap(voters: &[u64], data: Vec<u8>) -> RaftStore {
        let mut snapshot = Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = 1;
        meta.term = 1;
        meta.mut_conf_state().voters = voters.to_vec();
        snapshot.data = data.into();
        let hard_state = HardState {
            term: 1,
            commit: 1,
            ..Default::default()
        };
        RaftStore {
            hard_state,
            snapshot,
            entries: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let meta = self.snapshot.get_metadata();
        let stored = Stored {
            version: STORED_VERSION,
            term: self.hard_state.term,
            vote: self.hard_state.vote,
            commit: self.hard_state.commit,
            snapshot_index: meta.index,
            snapshot_term: meta.term,
            voters: meta.get_conf_state().voters.clone(),
            snapshot_data: self.snapshot.data.to_vec(),
            entries: (self.entries.iter())
                .map(|e| StoredEntry {
                    index: e.index,
                    term: e.term,
                    kind: e.get_entry_type() as i32,
                    data: e.data.to_vec(),
                })
                .collect(),
        };
        bincode::encode_to_vec(&stored, bincode::config::standard()).expect("encodes to a Vec")
    }

    pub fn decode(bytes: &[u8]) -> Result<RaftStore, String> {
        let (stored, used): (Stored, usize) =
            bincode::decode_from_slice(bytes, bincode::config::standard())
                .map_err(|e| e.to_string())?;
        if used != bytes.len() {
            return Err(format!("{} bytes after the state", bytes.len() - used));
        }
        if stored.version != STORED_VERSION {
            return Err(format!("unknown version {}", stored.version));
        }
        let mut store = RaftStore::bootstrap(&stored.voters, stored.snapshot_data);
        let meta = store.snapshot.mut_metadata();
        meta.index = stored.snapshot_index;
        meta.term = stored.snapshot_term;
        store.hard_state.term = stored.term;
        store.hard_state.vote = stored.vote;
        store.hard_state.commit = stored.commit;
        for (expected, e) in (stored.snapshot_index + 1..).zip(stored.entries) {
            if e.index != expected {
                return Err(format!("entry {} where {expected} belongs", e.index));
            }
            let kind = EntryType::from_i32(e.kind)
                .ok_or_else(|| format!("entry {}: unknown type {}", e.index, e.kind))?;
            let mut entry = Entry {
                index: e.index,
                term: e.term,
                data: e.data.into(),
                ..Default::default()
            };
            entry.set_entry_type(kind);
            store.entries.push(entry);
        }
        Ok(store)
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// The snapshot's data: the manager's durable state as of the snapshot's index.
    pub fn snapshot_data(&self) -> &[u8] {
        &self.snapshot.data
    }

    pub fn entries_after_snapshot(&self) -> &[Entry] {
        &self.entries
    }

    fn first(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot.get_metadata().index, |e| e.index)
    }

    /// Appends `entries`, replacing any stored ones from the first's index on (a new
    /// leader's log overrides an old one's uncommitted tail).
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        assert!(first.index >= self.first(), "appending below the snapshot");
        assert!(first.index <= self.last() + 1, "appending past a gap");
        self.entries.truncate((first.index - self.first()) as usize);
        self.entries.extend_from_slice(entries);
    }

    /// Takes a snapshot sent by the leader: everything before and at its index is in it.
    /// Raft hands one over only when this log does not hold the snapshot's last entry, so
    /// every entry here goes.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.entries.clear();
        self.snapshot = snapshot;
    }

    /// Folds the entries up to `index` (applied) into the snapshot, whose data becomes
    /// `data`: the state as of `index`.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) {
        if index < self.first() || index > self.last() {
            return;
        }
        let at = (index - self.first()) as usize;
        let term = self.entries[at].term;
        self.entries.drain(..=at);
        let meta: &mut SnapshotMetadata = self.snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        self.snapshot.data = data.into();
    }
}

impl raft::Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let conf_state: ConfState = self.snapshot.get_metadata().get_conf_state().clone();
        Ok(RaftState::new(self.hard_state.clone(), conf_state))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.first()) as usize;
        let to = (high - self.first()) as usize;
        let mut entries = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let meta = self.snapshot.get_metadata();
        if idx == meta.index {
            return Ok(meta.term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_store_reads_back_as_written() {
        let mut s = RaftStore::bootstrap(&[1, 2, 3], b"state".to_vec());
        s.append(&[entry(2, 1, b"a"), entry(3, 2, b"b")]);
        let mut hs = s.hard_state.clone();
        hs.vote = 2;
        hs.term = 2;
        s.set_hard_state(hs);
        let back = RaftStore::decode(&s.encode()).unwrap();
        assert_eq!(back.encode(), s.encode());
        assert_eq!(back.last_index().unwrap(), 3);
        assert_eq!(back.term(3).unwrap(), 2);
        assert_eq!(
            back.initial_state().unwrap().conf_state.voters,
            vec![1, 2, 3]
        );
        assert!(RaftStore::decode(&s.encode()[..10]).is_err());
    }

    #[test]
    fn a_new_leaders_entries_replace_an_uncommitted_tail() {
        let mut s = RaftStore::bootstrap(&[1], vec![]);
        s.append(&[entry(2, 1, b"a"), entry(3, 1, b"b"), entry(4, 1, b"c")]);
        s.append(&[entry(3, 2, b"x")]);
        assert_eq!(s.last_index().unwrap(), 3);
        assert_eq!(s.term(3).unwrap(), 2);
    }

    #[test]
    fn compaction_keeps_the_state_and_the_later_entries() {
        let mut s = RaftStore::bootstrap(&[1], vec![]);
        s.append(&[entry(2, 1, b"a"), entry(3, 1, b"b"), entry(4, 1, b"c")]);
        s.compact(3, b"as of 3".to_vec());
        assert_eq!(s.first_index().unwrap(), 4);
        assert_eq!(s.term(3).unwrap(), 1);
        assert_eq!(s.snapshot_data(), b"as of 3");
        assert!(matches!(
            s.entries(2, 4, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(
            s.entries(4, 5, None, GetEntriesContext::empty(false))
                .unwrap()[0]
                .data,
            b"c".to_vec()
        );
    }
}
