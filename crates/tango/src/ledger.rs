//! A single-writer ledger as one object (Tango §5's TangoBK, after BookKeeper): entries
//! numbered from 0, added only by the writer holding the current epoch; a recovery-open
//! bumps the epoch and closes the ledger at its length, so the fenced writer's later adds
//! are refused by every view alike. Byte formats: docs/objects.md, "Ledger".

use crate::codec::{Malformed, Reader, Writer};
use crate::object::{Applied, Object};

const CLAIM: u8 = 1;
const ADD: u8 = 2;
const CLOSE: u8 = 3;
const RECOVER: u8 = 4;

#[derive(Default, Debug)]
pub struct Ledger {
    /// 0 until a writer claims the ledger; each recovery-open adds one.
    pub epoch: u64,
    /// The length it was closed at, if closed: no entry is ever added past it.
    pub closed: Option<u64>,
    pub entries: Vec<Vec<u8>>,
}

/// What a ledger update came to; the reply's bytes are `encode`d from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerReply {
    /// A claim or recovery gave this epoch; the ledger's length then.
    Epoch { epoch: u64, length: u64 },
    /// The entry's number.
    Added(u64),
    /// Closed at this length.
    Closed(u64),
    /// Refused: the writer's epoch is not the ledger's, or the ledger is closed (or, for
    /// a claim, already has a writer).
    Fenced,
}

impl LedgerReply {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match *self {
            LedgerReply::Epoch { epoch, length } => w.u8(1).u64(epoch).u64(length),
            LedgerReply::Added(n) => w.u8(2).u64(n),
            LedgerReply::Closed(n) => w.u8(3).u64(n),
            LedgerReply::Fenced => w.u8(4),
        };
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LedgerReply, Malformed> {
        let mut r = Reader::new(bytes);
        let reply = match r.u8("ledger's reply")? {
            1 => LedgerReply::Epoch {
                epoch: r.u64("epoch")?,
                length: r.u64("length")?,
            },
            2 => LedgerReply::Added(r.u64("entry number")?),
            3 => LedgerReply::Closed(r.u64("length")?),
            4 => LedgerReply::Fenced,
            other => return Err(Malformed(format!("ledger reply {other}"))),
        };
        r.end("ledger's reply")?;
        Ok(reply)
    }
}

impl Ledger {
    /// Makes the claimer the writer at epoch 1, if nobody wrote or recovered it yet.
    pub fn claim() -> Vec<u8> {
        vec![CLAIM]
    }

    pub fn add(epoch: u64, data: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(ADD).u64(epoch).bytes(data);
        w.finish()
    }

    pub fn close(epoch: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(CLOSE).u64(epoch);
        w.finish()
    }

    /// Fences whoever writes now and closes the ledger at its length (BookKeeper's
    /// open for recovery).
    pub fn recover() -> Vec<u8> {
        vec![RECOVER]
    }

    pub fn length(&self) -> u64 {
        self.entries.len() as u64
    }

    fn writable(&self, epoch: u64) -> bool {
        self.closed.is_none() && epoch == self.epoch && epoch != 0
    }
}

impl Object for Ledger {
    fn apply(&mut self, _: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        let mut r = Reader::new(update);
        let reply = match r.u8("ledger update")? {
            CLAIM => {
                r.end("claim")?;
                match self.epoch == 0 && self.closed.is_none() {
                    true => {
                        self.epoch = 1;
                        LedgerReply::Epoch {
                            epoch: 1,
                            length: self.length(),
                        }
                    }
                    false => LedgerReply::Fenced,
                }
            }
            ADD => {
                let epoch = r.u64("add's epoch")?;
                let data = r.bytes("entry")?;
                r.end("add")?;
                match self.writable(epoch) {
                    true => {
                        self.entries.push(data.to_vec());
                        LedgerReply::Added(self.length() - 1)
                    }
                    false => LedgerReply::Fenced,
                }
            }
            CLOSE => {
                let epoch = r.u64("close's epoch")?;
                r.end("close")?;
                match self.writable(epoch) {
                    true => {
                        self.closed = Some(self.length());
                        LedgerReply::Closed(self.length())
                    }
                    false => LedgerReply::Fenced,
                }
            }
            RECOVER => {
                r.end("recovery")?;
                self.epoch += 1;
                self.closed.get_or_insert(self.entries.len() as u64);
                LedgerReply::Epoch {
                    epoch: self.epoch,
                    length: self.length(),
                }
            }
            other => return Err(Malformed(format!("ledger update {other}"))),
        };
        Ok(Applied::reply(reply.encode()))
    }

    fn checkpoint(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.epoch).u64(self.closed.map_or(u64::MAX, |n| n));
        w.u32(self.entries.len() as u32);
        for e in &self.entries {
            w.bytes(e);
        }
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        let epoch = r.u64("epoch")?;
        let closed = Some(r.u64("closed length")?).filter(|&n| n != u64::MAX);
        let n = r.count("entries", 4)?;
        let entries = (0..n)
            .map(|_| r.bytes("entry").map(<[u8]>::to_vec))
            .collect::<Result<Vec<_>, _>>()?;
        r.end("ledger's checkpoint")?;
        if closed.is_some_and(|c| c != entries.len() as u64) {
            return Err(Malformed(
                "a closed ledger's length is not its entries'".into(),
            ));
        }
        *self = Ledger {
            epoch,
            closed,
            entries,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(l: &mut Ledger, update: &[u8]) -> LedgerReply {
        LedgerReply::decode(&l.apply(None, update, 0).unwrap().reply).unwrap()
    }

    #[test]
    fn a_recovery_fences_the_writer_and_closes_at_the_length() {
        let mut l = Ledger::default();
        assert_eq!(apply(&mut l, &Ledger::add(0, b"x")), LedgerReply::Fenced);
        assert_eq!(
            apply(&mut l, &Ledger::claim()),
            LedgerReply::Epoch {
                epoch: 1,
                length: 0
            }
        );
        assert_eq!(apply(&mut l, &Ledger::claim()), LedgerReply::Fenced);
        assert_eq!(apply(&mut l, &Ledger::add(1, b"a")), LedgerReply::Added(0));
        assert_eq!(apply(&mut l, &Ledger::add(1, b"b")), LedgerReply::Added(1));
        assert_eq!(
            apply(&mut l, &Ledger::recover()),
            LedgerReply::Epoch {
                epoch: 2,
                length: 2
            }
        );
        assert_eq!(apply(&mut l, &Ledger::add(1, b"late")), LedgerReply::Fenced);
        assert_eq!(apply(&mut l, &Ledger::add(2, b"late")), LedgerReply::Fenced);
        assert_eq!(apply(&mut l, &Ledger::close(1)), LedgerReply::Fenced);
        assert_eq!((l.closed, l.length()), (Some(2), 2));
        let mut restored = Ledger::default();
        restored.restore(&l.checkpoint()).unwrap();
        assert_eq!(restored.checkpoint(), l.checkpoint());
    }

    #[test]
    fn a_closed_ledger_takes_no_more_and_a_bad_update_is_malformed() {
        let mut l = Ledger::default();
        apply(&mut l, &Ledger::claim());
        apply(&mut l, &Ledger::add(1, b"a"));
        assert_eq!(apply(&mut l, &Ledger::close(1)), LedgerReply::Closed(1));
        assert_eq!(apply(&mut l, &Ledger::add(1, b"b")), LedgerReply::Fenced);
        assert_eq!(
            apply(&mut l, &Ledger::recover()),
            LedgerReply::Epoch {
                epoch: 2,
                length: 1
            }
        );
        assert!(l.apply(None, &[ADD, 1], 0).is_err());
        assert!(l.apply(None, &[9], 0).is_err());
        assert_eq!(l.length(), 1);
    }
}
