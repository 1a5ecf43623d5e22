//! The objects tango ships (Tango §3, Fig. 3): each a view and its `apply`, a few lines over
//! the runtime. Their updates are documented byte by byte in docs/objects.md ("Objects").
//! Accessors and mutators that do I/O live on `Tango`'s typed handles (`handles`).

use crate::codec::{Malformed, Reader, Writer};
use crate::object::{Applied, Object};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// What kind of object a name in the directory stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Register,
    Counter,
    Map,
    SortedMap,
    Queue,
    Namespace,
    Ledger,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Register,
        Kind::Counter,
        Kind::Map,
        Kind::SortedMap,
        Kind::Queue,
        Kind::Namespace,
        Kind::Ledger,
    ];

    pub fn code(self) -> u8 {
        match self {
            Kind::Register => 1,
            Kind::Counter => 2,
            Kind::Map => 3,
            Kind::SortedMap => 4,
            Kind::Queue => 5,
            Kind::Namespace => 6,
            Kind::Ledger => 7,
        }
    }

    pub fn from_code(code: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Register => "register",
            Kind::Counter => "counter",
            Kind::Map => "map",
            Kind::SortedMap => "sorted-map",
            Kind::Queue => "queue",
            Kind::Namespace => "namespace",
            Kind::Ledger => "ledger",
        }
    }

    /// An empty view of this kind.
    pub fn view(self) -> Box<dyn Object> {
        match self {
            Kind::Register => Box::new(Register::default()),
            Kind::Counter => Box::new(Counter::default()),
            Kind::Map => Box::new(Map::default()),
            Kind::SortedMap => Box::new(SortedMap::default()),
            Kind::Queue => Box::new(Queue::default()),
            Kind::Namespace => Box::new(crate::namespace::Namespace::default()),
            Kind::Ledger => Box::new(crate::ledger::Ledger::default()),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A value (Tango's TangoRegister): an update is the new value.
#[derive(Default, Debug)]
pub struct Register {
    pub value: Vec<u8>,
}

impl Object for Register {
    fn apply(&mut self, _: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        self.value = update.to_vec();
        Ok(Applied::default())
    }

    fn checkpoint(&self) -> Vec<u8> {
        self.value.clone()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        self.value = bytes.to_vec();
        Ok(())
    }
}

/// A signed 64-bit counter: an update is the amount to add (i64, little-endian); the reply
/// is the new value. Additions wrap.
#[derive(Default, Debug)]
pub struct Counter {
    pub value: i64,
}

impl Counter {
    pub fn add(n: i64) -> Vec<u8> {
        n.to_le_bytes().to_vec()
    }
}

fn read_i64(bytes: &[u8], what: &str) -> Result<i64, Malformed> {
    let mut r = Reader::new(bytes);
    let n = r.i64(what)?;
    r.end(what)?;
    Ok(n)
}

impl Object for Counter {
    fn apply(&mut self, _: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        self.value = self
            .value
            .wrapping_add(read_i64(update, "counter's addition")?);
        Ok(Applied::reply(self.value.to_le_bytes().to_vec()))
    }

    fn checkpoint(&self) -> Vec<u8> {
        self.value.to_le_bytes().to_vec()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        self.value = read_i64(bytes, "counter's checkpoint")?;
        Ok(())
    }
}

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// The table under a map: hashed or sorted.
pub trait Table: Default + Send + 'static {
    fn get(&self, key: &[u8]) -> Option<&Vec<u8>>;
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>>;
    fn delete(&mut self, key: &[u8]) -> Option<Vec<u8>>;
    fn entries(&self) -> Vec<(&Vec<u8>, &Vec<u8>)>;
}

impl Table for HashMap<Vec<u8>, Vec<u8>> {
    fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        HashMap::get(self, key)
    }
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        self.insert(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.remove(key)
    }
    fn entries(&self) -> Vec<(&Vec<u8>, &Vec<u8>)> {
        let mut entries: Vec<_> = self.iter().collect();
        entries.sort();
        entries
    }
}

impl Table for BTreeMap<Vec<u8>, Vec<u8>> {
    fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        BTreeMap::get(self, key)
    }
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        self.insert(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.remove(key)
    }
    fn entries(&self) -> Vec<(&Vec<u8>, &Vec<u8>)> {
        self.iter().collect()
    }
}

/// A map from byte keys to byte values with a version per key (Tango §3.2): every update
/// is keyed, so transactions on different keys do not conflict. An update is `1` and the
/// value (put) or `2` (delete); the reply is the previous value (`1` and the value) or `0`.
#[derive(Default, Debug)]
pub struct MapOf<T: Table> {
    pub table: T,
}

/// A hashed map (Tango's TangoMap).
pub type Map = MapOf<HashMap<Vec<u8>, Vec<u8>>>;
/// A sorted map, with range queries.
pub type SortedMap = MapOf<BTreeMap<Vec<u8>, Vec<u8>>>;

impl<T: Table> MapOf<T> {
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.table.get(key).cloned()
    }

    pub fn put(value: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(PUT).bytes(value);
        w.finish()
    }

    pub fn delete() -> Vec<u8> {
        vec![DELETE]
    }

    /// The previous value a put's or delete's reply carries.
    pub fn previous(reply: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
        let mut r = Reader::new(reply);
        let previous = r.opt_bytes("map's reply")?.map(<[u8]>::to_vec);
        r.end("map's reply")?;
        Ok(previous)
    }
}

impl SortedMap {
    /// Entries with keys in `[from, to)` (`to` none: to the end), at most `limit`.
    pub fn range(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        use std::ops::Bound;
        let upper = to.map_or(Bound::Unbounded, Bound::Excluded);
        (self.table.range::<[u8], _>((Bound::Included(from), upper)))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl<T: Table> Object for MapOf<T> {
    fn apply(&mut self, key: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        let key = key.ok_or_else(|| Malformed("a map update without a key".into()))?;
        let mut r = Reader::new(update);
        let (previous, key_removed) = match r.u8("map's operation")? {
            PUT => {
                let value = r.bytes("map's value")?.to_vec();
                r.end("map's put")?;
                (self.table.put(key.to_vec(), value), false)
            }
            DELETE => {
                r.end("map's delete")?;
                (self.table.delete(key), true)
            }
            other => return Err(Malformed(format!("map operation {other}"))),
        };
        let mut w = Writer::new();
        w.opt_bytes(previous.as_deref());
        Ok(Applied {
            reply: w.finish(),
            key_removed,
        })
    }

    fn checkpoint(&self) -> Vec<u8> {
        let entries = self.table.entries();
        let mut w = Writer::new();
        w.u32(entries.len() as u32);
        for (k, v) in entries {
            w.bytes(k).bytes(v);
        }
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        let mut table = T::default();
        for _ in 0..r.count("map's entries", 8)? {
            let key = r.bytes("map's key")?.to_vec();
            table.put(key, r.bytes("map's value")?.to_vec());
        }
        r.end("map's checkpoint")?;
        self.table = table;
        Ok(())
    }
}

const ENQUEUE: u8 = 1;
const DEQUEUE: u8 = 2;

/// A FIFO queue whose dequeue is linearizable: which item a dequeue takes is decided when
/// its update is applied, the same on every view, and comes back as its reply (`1` and the
/// item, or `0` when the queue was empty). An update is `1` and the item, or `2`.
#[derive(Default, Debug)]
pub struct Queue {
    pub items: VecDeque<Vec<u8>>,
}

impl Queue {
    pub fn enqueue(item: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(ENQUEUE).bytes(item);
        w.finish()
    }

    pub fn dequeue() -> Vec<u8> {
        vec![DEQUEUE]
    }

    /// The item a dequeue's reply carries.
    pub fn dequeued(reply: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
        let mut r = Reader::new(reply);
        let item = r.opt_bytes("queue's reply")?.map(<[u8]>::to_vec);
        r.end("queue's reply")?;
        Ok(item)
    }
}

impl Object for Queue {
    fn apply(&mut self, _: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        let mut r = Reader::new(update);
        let mut w = Writer::new();
        match r.u8("queue's operation")? {
            ENQUEUE => {
                let item = r.bytes("queue's item")?.to_vec();
                r.end("queue's enqueue")?;
                self.items.push_back(item);
            }
            DEQUEUE => {
                r.end("queue's dequeue")?;
                w.opt_bytes(self.items.pop_front().as_deref());
            }
            other => return Err(Malformed(format!("queue operation {other}"))),
        }
        Ok(Applied::reply(w.finish()))
    }

    fn checkpoint(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.items.len() as u32);
        for item in &self.items {
            w.bytes(item);
        }
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        let n = r.count("queue's items", 4)?;
        let items = (0..n)
            .map(|_| r.bytes("queue's item").map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        r.end("queue's checkpoint")?;
        self.items = items;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(view: &mut dyn Object, key: Option<&[u8]>, update: &[u8]) -> Vec<u8> {
        view.apply(key, update, 0).unwrap().reply
    }

    /// Every kind's view survives a checkpoint and restore, and refuses a truncated one.
    #[test]
    fn checkpoints_round_trip_and_truncations_are_malformed() {
        let key: &[u8] = b"k";
        let updates = [
            (Kind::Register, None, b"value".to_vec()),
            (Kind::Counter, None, Counter::add(-3)),
            (Kind::Map, Some(key), Map::put(b"v")),
            (Kind::SortedMap, Some(key), SortedMap::put(b"v")),
            (Kind::Queue, None, Queue::enqueue(b"item")),
        ];
        for (kind, key, update) in updates {
            let mut view = kind.view();
            apply(&mut *view, key, &update);
            let bytes = view.checkpoint();
            let mut restored = kind.view();
            restored.restore(&bytes).unwrap();
            assert_eq!(restored.checkpoint(), bytes, "{kind}");
            if kind != Kind::Register {
                assert!(
                    kind.view().restore(&bytes[..bytes.len() - 1]).is_err(),
                    "{kind}"
                );
            }
        }
    }

    #[test]
    fn a_dequeue_takes_the_oldest_item_and_reports_an_empty_queue() {
        let mut q = Queue::default();
        apply(&mut q, None, &Queue::enqueue(b"a"));
        apply(&mut q, None, &Queue::enqueue(b"b"));
        let first = apply(&mut q, None, &Queue::dequeue());
        assert_eq!(Queue::dequeued(&first).unwrap(), Some(b"a".to_vec()));
        apply(&mut q, None, &Queue::dequeue());
        let none = apply(&mut q, None, &Queue::dequeue());
        assert_eq!(Queue::dequeued(&none).unwrap(), None);
    }

    #[test]
    fn a_sorted_map_answers_ranges_in_key_order() {
        let mut m = SortedMap::default();
        for k in ["d", "a", "c", "b"] {
            apply(&mut m, Some(k.as_bytes()), &SortedMap::put(k.as_bytes()));
        }
        let keys = |r: Vec<(Vec<u8>, Vec<u8>)>| r.into_iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(
            keys(m.range(b"b", Some(b"d"), 10)),
            vec![b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            keys(m.range(b"a", None, 2)),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        let removed = m.apply(Some(b"a"), &SortedMap::delete(), 0).unwrap();
        assert!(removed.key_removed);
        assert_eq!(
            SortedMap::previous(&removed.reply).unwrap(),
            Some(b"a".to_vec())
        );
    }

    #[test]
    fn a_map_update_without_a_key_or_with_an_unknown_operation_is_malformed() {
        let mut m = Map::default();
        assert!(m.apply(None, &Map::put(b"v"), 0).is_err());
        assert!(m.apply(Some(b"k"), &[9], 0).is_err());
        assert!(m.table.is_empty());
    }
}
