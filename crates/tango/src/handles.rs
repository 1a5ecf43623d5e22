//! Typed handles on the shipped objects: each accessor and mutator is a line or two over
//! `Tango`'s query and update helpers, with a `_in` form for use inside a transaction
//! (Tango Fig. 3 and 4).

use crate::client::Tango;
use crate::error::TangoError;
use crate::ledger::{Ledger, LedgerReply};
use crate::objects::{Counter, MapOf, Queue, Register, SortedMap, Table};
use crate::record::Oid;
use crate::runtime::Tx;
use std::marker::PhantomData;

fn malformed(position: u64, e: crate::codec::Malformed) -> TangoError {
    TangoError::Malformed { position, why: e.0 }
}

#[derive(Clone, Copy, Debug)]
pub struct RegisterRef(pub Oid);

impl RegisterRef {
    pub async fn get(&self, t: &Tango) -> Result<Vec<u8>, TangoError> {
        t.query(self.0, |r: &Register| r.value.clone()).await
    }

    /// Sets the value; returns the update's position.
    pub async fn set(&self, t: &Tango, value: &[u8]) -> Result<u64, TangoError> {
        t.update(self.0, None, value.to_vec()).await
    }

    pub fn get_in(&self, t: &Tango, tx: &mut Tx) -> Result<Vec<u8>, TangoError> {
        t.query_in(tx, self.0, None, |r: &Register| r.value.clone())
    }

    pub fn set_in(&self, tx: &mut Tx, value: &[u8]) {
        tx.write(self.0, None, value.to_vec());
    }
}

#[derive(Clone, Copy, Debug)]
pub struct CounterRef(pub Oid);

impl CounterRef {
    pub async fn get(&self, t: &Tango) -> Result<i64, TangoError> {
        t.query(self.0, |c: &Counter| c.value).await
    }

    /// Adds `n`; returns the value it made.
    pub async fn add(&self, t: &Tango, n: i64) -> Result<i64, TangoError> {
        let (position, reply) = t.update_reply(self.0, None, Counter::add(n)).await?;
        let value: [u8; 8] = (reply.try_into())
            .map_err(|_| malformed(position, crate::codec::Malformed("counter's reply".into())))?;
        Ok(i64::from_le_bytes(value))
    }

    pub fn get_in(&self, t: &Tango, tx: &mut Tx) -> Result<i64, TangoError> {
        t.query_in(tx, self.0, None, |c: &Counter| c.value)
    }

    pub fn add_in(&self, tx: &mut Tx, n: i64) {
        tx.write(self.0, None, Counter::add(n));
    }
}

/// A handle on a map (`MapRef<Map>`) or a sorted map (`MapRef<SortedMap>`).
#[derive(Debug)]
pub struct MapRef<T: Table>(pub Oid, PhantomData<T>);

impl<T: Table> Clone for MapRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Table> Copy for MapRef<T> {}

impl<T: Table> MapRef<T> {
    pub fn new(oid: Oid) -> MapRef<T> {
        MapRef(oid, PhantomData)
    }

    pub async fn get(&self, t: &Tango, key: &[u8]) -> Result<Option<Vec<u8>>, TangoError> {
        t.query(self.0, |m: &MapOf<T>| m.get(key)).await
    }

    /// Every entry, in key order.
    pub async fn list(&self, t: &Tango) -> Result<Vec<(Vec<u8>, Vec<u8>)>, TangoError> {
        t.query(self.0, |m: &MapOf<T>| {
            (m.table.entries().into_iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .await
    }

    /// Puts `value` at `key` (the map must be hosted); returns the previous value.
    pub async fn put(
        &self,
        t: &Tango,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<Vec<u8>>, TangoError> {
        self.change(t, key, MapOf::<T>::put(value)).await
    }

    /// Deletes `key` (the map must be hosted); returns the value it had.
    pub async fn delete(&self, t: &Tango, key: &[u8]) -> Result<Option<Vec<u8>>, TangoError> {
        self.change(t, key, MapOf::<T>::delete()).await
    }

    async fn change(
        &self,
        t: &Tango,
        key: &[u8],
        update: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, TangoError> {
        let (position, reply) = t.update_reply(self.0, Some(key), update).await?;
        MapOf::<T>::previous(&reply).map_err(|e| malformed(position, e))
    }

    /// Puts without waiting for the previous value (works on maps not hosted here).
    pub async fn put_blind(&self, t: &Tango, key: &[u8], value: &[u8]) -> Result<u64, TangoError> {
        t.update(self.0, Some(key), MapOf::<T>::put(value)).await
    }

    pub fn get_in(
        &self,
        t: &Tango,
        tx: &mut Tx,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, TangoError> {
        t.query_in(tx, self.0, Some(key), |m: &MapOf<T>| m.get(key))
    }

    pub fn put_in(&self, tx: &mut Tx, key: &[u8], value: &[u8]) {
        tx.write(self.0, Some(key), MapOf::<T>::put(value));
    }

    pub fn delete_in(&self, tx: &mut Tx, key: &[u8]) {
        tx.write(self.0, Some(key), MapOf::<T>::delete());
    }
}

impl MapRef<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    /// Entries with keys in `[from, to)`, at most `limit`, in key order.
    pub async fn range(
        &self,
        t: &Tango,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, TangoError> {
        t.query(self.0, |m: &SortedMap| m.range(from, to, limit))
            .await
    }
}

#[derive(Clone, Copy, Debug)]
pub struct QueueRef(pub Oid);

impl QueueRef {
    /// Appends `item` at the back (the queue need not be hosted here).
    pub async fn enqueue(&self, t: &Tango, item: &[u8]) -> Result<u64, TangoError> {
        t.update(self.0, None, Queue::enqueue(item)).await
    }

    /// Takes the item at the front, if any (linearizable: decided where the dequeue's
    /// entry falls in the log).
    pub async fn dequeue(&self, t: &Tango) -> Result<Option<Vec<u8>>, TangoError> {
        let (position, reply) = t.update_reply(self.0, None, Queue::dequeue()).await?;
        Queue::dequeued(&reply).map_err(|e| malformed(position, e))
    }

    pub async fn len(&self, t: &Tango) -> Result<usize, TangoError> {
        t.query(self.0, |q: &Queue| q.items.len()).await
    }

    pub fn enqueue_in(&self, tx: &mut Tx, item: &[u8]) {
        tx.write(self.0, None, Queue::enqueue(item));
    }
}

/// A single-writer ledger (Tango's BookKeeper): `open_writer` claims it, `recover` fences
/// the writer and closes it, anyone reads.
#[derive(Clone, Copy, Debug)]
pub struct LedgerRef(pub Oid);

/// The ledger's writer, at the epoch its claim got.
#[derive(Clone, Copy, Debug)]
pub struct LedgerWriter {
    pub ledger: LedgerRef,
    pub epoch: u64,
}

impl LedgerRef {
    async fn change(&self, t: &Tango, update: Vec<u8>) -> Result<LedgerReply, TangoError> {
        let (position, reply) = t.update_reply(self.0, None, update).await?;
        match LedgerReply::decode(&reply).map_err(|e| malformed(position, e))? {
            LedgerReply::Fenced => Err(TangoError::LedgerFenced { position }),
            reply => Ok(reply),
        }
    }

    /// Becomes the ledger's only writer; fails if someone claimed or recovered it before.
    pub async fn open_writer(&self, t: &Tango) -> Result<LedgerWriter, TangoError> {
        match self.change(t, Ledger::claim()).await? {
            LedgerReply::Epoch { epoch, .. } => Ok(LedgerWriter {
                ledger: *self,
                epoch,
            }),
            other => unreachable!("a claim answered {other:?}"),
        }
    }

    /// Opens for recovery: fences the writer (its later adds fail) and closes the ledger at
    /// its length, which this returns.
    pub async fn recover(&self, t: &Tango) -> Result<u64, TangoError> {
        match self.change(t, Ledger::recover()).await? {
            LedgerReply::Epoch { length, .. } => Ok(length),
            other => unreachable!("a recovery answered {other:?}"),
        }
    }

    /// The entries numbered `from` to `to` (excluded) that exist.
    pub async fn read(&self, t: &Tango, from: u64, to: u64) -> Result<Vec<Vec<u8>>, TangoError> {
        t.query(self.0, |l: &Ledger| {
            let to = to.min(l.length()) as usize;
            let from = (from as usize).min(to);
            l.entries[from..to].to_vec()
        })
        .await
    }

    /// Its length, and whether it is closed.
    pub async fn length(&self, t: &Tango) -> Result<(u64, bool), TangoError> {
        t.query(self.0, |l: &Ledger| (l.length(), l.closed.is_some()))
            .await
    }
}

impl LedgerWriter {
    /// Adds an entry; returns its number. Fails once the ledger is recovered or closed.
    pub async fn add(&self, t: &Tango, data: &[u8]) -> Result<u64, TangoError> {
        match self.ledger.change(t, Ledger::add(self.epoch, data)).await? {
            LedgerReply::Added(n) => Ok(n),
            other => unreachable!("an add answered {other:?}"),
        }
    }

    /// Closes the ledger; returns its length.
    pub async fn close(&self, t: &Tango) -> Result<u64, TangoError> {
        match self.ledger.change(t, Ledger::close(self.epoch)).await? {
            LedgerReply::Closed(n) => Ok(n),
            other => unreachable!("a close answered {other:?}"),
        }
    }
}
