//! The records a tango runtime writes into log entries (docs/objects.md, "Records"): an
//! update of one object; a transaction's commit record, carrying its read set and its
//! writes, and the speculative entries holding the writes that did not fit in it; the
//! decision record that may follow it; and a checkpoint, in parts.

use crate::codec::{Malformed, Reader, Writer};

/// An object's id, which is also the id of its stream in the log.
pub type Oid = u32;

const UPDATE: u8 = 1;
const COMMIT: u8 = 2;
const DECISION: u8 = 3;
const CHECKPOINT_PART: u8 = 4;
const CHECKPOINT: u8 = 5;
const SPECULATIVE: u8 = 6;

/// One change to one object: what its mutator wrote, for its `apply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub oid: Oid,
    /// The part of the object it changes (Tango §3.2, "Versioning"); none: all of it.
    pub key: Option<Vec<u8>>,
    pub data: Vec<u8>,
}

/// One read of a transaction: the version (position of the last write) it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub oid: Oid,
    pub key: Option<Vec<u8>>,
    pub version: u64,
}

impl Write {
    /// Its length in a record's encoding.
    pub fn encoded_len(&self) -> usize {
        4 + 1 + self.key.as_ref().map_or(0, |k| 4 + k.len()) + 4 + self.data.len()
    }
}

impl Read {
    /// Its length in a commit record's encoding.
    pub fn encoded_len(&self) -> usize {
        4 + 1 + self.key.as_ref().map_or(0, |k| 4 + k.len()) + 8
    }
}

/// The length of a speculative record holding `writes`.
pub fn speculative_len(writes: &[Write]) -> usize {
    1 + 8 + 4 + writes.iter().map(Write::encoded_len).sum::<usize>()
}

/// The length of a commit record with these reads, speculative entries and writes.
pub fn commit_len(reads: &[Read], speculative: &[Speculated], writes: &[Write]) -> usize {
    1 + 8
        + 1
        + 4
        + reads.iter().map(Read::encoded_len).sum::<usize>()
        + 4
        + writes.iter().map(Write::encoded_len).sum::<usize>()
        + 4
        + speculative
            .iter()
            .map(Speculated::encoded_len)
            .sum::<usize>()
}

/// A speculative entry of a transaction, as its commit record names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculated {
    pub position: u64,
    /// The objects it writes (its streams).
    pub oids: Vec<Oid>,
    /// How many writes it holds.
    pub writes: u32,
}

impl Speculated {
    /// Its length in a commit record's encoding.
    pub fn encoded_len(&self) -> usize {
        8 + 4 + 4 * self.oids.len() + 4
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A write outside any transaction. `nonce` lets the writer find its reply (0: none).
    Update { nonce: u64, write: Write },
    /// Writes of transaction `tx` that did not fit in its commit record (Tango §3.2), in
    /// the streams of the objects they write: played only when the commit record naming
    /// them commits.
    Speculative { tx: u64, writes: Vec<Write> },
    /// A transaction's commit record, in the streams of every object it writes. It commits
    /// if every read's version is still current at its position and its speculative entries
    /// are recent enough (`runtime::SPECULATIVE_WINDOW`). Its writes are those of its
    /// speculative entries, in their order here, then its own.
    Commit {
        tx: u64,
        reads: Vec<Read>,
        speculative: Vec<Speculated>,
        writes: Vec<Write>,
        /// A decision record follows (some object written needs one, Tango §4.1).
        decision_follows: bool,
    },
    /// The outcome of the commit record at `commit`, for clients that do not host its
    /// read set.
    Decision { commit: u64, committed: bool },
    /// A piece of a checkpoint (in no stream: read by position).
    CheckpointPart { oid: Oid, bytes: Vec<u8> },
    /// A checkpoint of `oid`'s view and versions after every entry below `as_of` was
    /// played, in parts at `parts` (in order).
    Checkpoint {
        oid: Oid,
        as_of: u64,
        parts: Vec<u64>,
    },
}

fn put_key(w: &mut Writer, key: &Option<Vec<u8>>) {
    w.opt_bytes(key.as_deref());
}

pub(crate) fn write_encode(w: &mut Writer, write: &Write) {
    w.u32(write.oid);
    put_key(w, &write.key);
    w.bytes(&write.data);
}

pub(crate) fn write_decode(r: &mut Reader<'_>) -> Result<Write, Malformed> {
    Ok(Write {
        oid: r.u32("write's object")?,
        key: r.opt_bytes("write's key")?.map(<[u8]>::to_vec),
        data: r.bytes("write's data")?.to_vec(),
    })
}

fn writes_decode(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<Write>, Malformed> {
    let n = r.count(what, 9)?;
    let mut writes = Vec::with_capacity(n);
    for _ in 0..n {
        writes.push(write_decode(r)?);
    }
    Ok(writes)
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Record::Update { nonce, write } => {
                w.u8(UPDATE).u64(*nonce);
                write_encode(&mut w, write);
            }
            Record::Speculative { tx, writes } => {
                w.u8(SPECULATIVE).u64(*tx).u32(writes.len() as u32);
                for write in writes {
                    write_encode(&mut w, write);
                }
            }
            Record::Commit {
                tx,
                reads,
                speculative,
                writes,
                decision_follows,
            } => {
                w.u8(COMMIT).u64(*tx).u8(u8::from(*decision_follows));
                w.u32(reads.len() as u32);
                for read in reads {
                    w.u32(read.oid);
                    put_key(&mut w, &read.key);
                    w.u64(read.version);
                }
                w.u32(writes.len() as u32);
                for write in writes {
                    write_encode(&mut w, write);
                }
                w.u32(speculative.len() as u32);
                for s in speculative {
                    w.u64(s.position).u32(s.oids.len() as u32);
                    for oid in &s.oids {
                        w.u32(*oid);
                    }
                    w.u32(s.writes);
                }
            }
            Record::Decision { commit, committed } => {
                w.u8(DECISION).u64(*commit).u8(u8::from(*committed));
            }
            Record::CheckpointPart { oid, bytes } => {
                w.u8(CHECKPOINT_PART).u32(*oid).bytes(bytes);
            }
            Record::Checkpoint { oid, as_of, parts } => {
                w.u8(CHECKPOINT)
                    .u32(*oid)
                    .u64(*as_of)
                    .u32(parts.len() as u32);
                for p in parts {
                    w.u64(*p);
                }
            }
        }
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, Malformed> {
        let mut r = Reader::new(bytes);
        let record = match r.u8("record kind")? {
            UPDATE => Record::Update {
                nonce: r.u64("update's nonce")?,
                write: write_decode(&mut r)?,
            },
            COMMIT => {
                let tx = r.u64("commit's tx")?;
                let decision_follows = match r.u8("commit's decision flag")? {
                    0 => false,
                    1 => true,
                    other => return Err(Malformed(format!("commit's decision flag {other}"))),
                };
                let n = r.count("commit's reads", 13)?;
                let mut reads = Vec::with_capacity(n);
                for _ in 0..n {
                    reads.push(Read {
                        oid: r.u32("read's object")?,
                        key: r.opt_bytes("read's key")?.map(<[u8]>::to_vec),
                        version: r.u64("read's version")?,
                    });
                }
                let writes = writes_decode(&mut r, "commit's writes")?;
                let n = r.count("commit's speculative entries", 16)?;
                let mut speculative = Vec::with_capacity(n);
                for _ in 0..n {
                    let position = r.u64("speculative entry's position")?;
                    let oids = r.count("speculative entry's objects", 4)?;
                    let oids = (0..oids)
                        .map(|_| r.u32("speculative entry's object"))
                        .collect::<Result<_, _>>()?;
                    let writes = r.u32("speculative entry's writes")?;
                    speculative.push(Speculated {
                        position,
                        oids,
                        writes,
                    });
                }
                Record::Commit {
                    tx,
                    reads,
                    speculative,
                    writes,
                    decision_follows,
                }
            }
            SPECULATIVE => Record::Speculative {
                tx: r.u64("speculative entry's tx")?,
                writes: writes_decode(&mut r, "speculative entry's writes")?,
            },
            DECISION => Record::Decision {
                commit: r.u64("decision's commit")?,
                committed: r.u8("decision")? == 1,
            },
            CHECKPOINT_PART => Record::CheckpointPart {
                oid: r.u32("checkpoint part's object")?,
                bytes: r.bytes("checkpoint part")?.to_vec(),
            },
            CHECKPOINT => {
                let oid = r.u32("checkpoint's object")?;
                let as_of = r.u64("checkpoint's position")?;
                let n = r.count("checkpoint's parts", 8)?;
                let parts = (0..n)
                    .map(|_| r.u64("checkpoint part's position"))
                    .collect::<Result<_, _>>()?;
                Record::Checkpoint { oid, as_of, parts }
            }
            other => return Err(Malformed(format!("record kind {other}"))),
        };
        r.end("record")?;
        Ok(record)
    }

    /// The objects whose streams the record belongs in.
    pub fn streams(&self) -> Vec<Oid> {
        match self {
            Record::Update { write, .. } => vec![write.oid],
            Record::Speculative { writes, .. } => sorted_oids(writes.iter().map(|w| w.oid)),
            Record::Commit {
                writes,
                speculative,
                ..
            } => written(writes, speculative),
            Record::Decision { .. } | Record::CheckpointPart { .. } => vec![],
            Record::Checkpoint { oid, .. } => vec![*oid],
        }
    }
}

/// The objects a commit record writes, itself or through its speculative entries.
pub fn written(writes: &[Write], speculative: &[Speculated]) -> Vec<Oid> {
    let in_speculative = speculative.iter().flat_map(|s| s.oids.iter().copied());
    sorted_oids(writes.iter().map(|w| w.oid).chain(in_speculative))
}

/// `oids` in order, each once.
pub fn sorted_oids(oids: impl Iterator<Item = Oid>) -> Vec<Oid> {
    let mut oids: Vec<Oid> = oids.collect();
    oids.sort_unstable();
    oids.dedup();
    oids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        let write = Write {
            oid: 7,
            key: Some(b"k".to_vec()),
            data: b"v".to_vec(),
        };
        vec![
            Record::Update {
                nonce: 9,
                write: write.clone(),
            },
            Record::Commit {
                tx: 3,
                reads: vec![Read {
                    oid: 1,
                    key: None,
                    version: 44,
                }],
                speculative: vec![Speculated {
                    position: 40,
                    oids: vec![3, 5],
                    writes: 2,
                }],
                writes: vec![
                    write.clone(),
                    Write {
                        oid: 2,
                        key: None,
                        data: vec![],
                    },
                ],
                decision_follows: true,
            },
            Record::Speculative {
                tx: 3,
                writes: vec![write],
            },
            Record::Decision {
                commit: 12,
                committed: false,
            },
            Record::CheckpointPart {
                oid: 7,
                bytes: vec![1, 2, 3],
            },
            Record::Checkpoint {
                oid: 7,
                as_of: 100,
                parts: vec![101, 102],
            },
        ]
    }

    #[test]
    fn records_round_trip() {
        for record in samples() {
            assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn lengths_are_those_of_the_encodings() {
        for record in samples() {
            let len = match &record {
                Record::Speculative { writes, .. } => speculative_len(writes),
                Record::Commit {
                    reads,
                    speculative,
                    writes,
                    ..
                } => commit_len(reads, speculative, writes),
                _ => continue,
            };
            assert_eq!(len, record.encode().len(), "{record:?}");
        }
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_malformed() {
        for record in samples() {
            let bytes = record.encode();
            for n in 0..bytes.len() {
                assert!(
                    Record::decode(&bytes[..n]).is_err(),
                    "{record:?} cut at {n}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Record::decode(&longer).is_err());
        }
    }

    #[test]
    fn a_huge_count_is_refused_without_allocating() {
        let mut bytes = Record::Checkpoint {
            oid: 1,
            as_of: 2,
            parts: vec![],
        }
        .encode();
        bytes[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::decode(&bytes).is_err());
    }
}
