//! Appends' writes gathered per memory node: the writes waiting for one node leave together
//! as one minitransaction (`minitxs::write_batch`), a few batches out per node at most, so
//! that under load a node executes, logs and applies one record for many appends, and one
//! round trip carries them. A write alone goes out at once. Sans-I/O: the async client and
//! the simulator drive the same `Batcher`.

use crate::layout::LogLayout;
use crate::minitxs::{self, SlotWrite, Written};
use std::collections::{BTreeMap, VecDeque};
use tutti_client::{Minitx, Outcome};
use tutti_wire::NodeId;

/// Writes in one batch, at most: 3 items each, far below a minitransaction's item limit.
pub const WRITES_PER_BATCH_MAX: usize = 64;
/// A batch takes no further write once its entries reach this many bytes.
pub const BATCH_BYTES_MAX: usize = 1 << 20;
/// Batches out to one node at once by default; writes for it that come meanwhile wait for
/// the next. One: measured in `tutti bench log` (128 B appends, 64 outstanding, 4 nodes,
/// alternating runs), one batch out per node gave 55-57 K appends/s, two 44-50 K, four
/// 36-48 K, sixteen 41-46 K, and no batching 46-51 K: while a batch is synced at its node,
/// the next gathers every write that comes, and the node logs one record for them.
pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 1;

/// One minitransaction writing several positions of one node, and whose writes they are.
#[derive(Debug)]
pub struct Batch<T> {
    pub node: NodeId,
    pub tx: Minitx,
    epoch: u64,
    positions: Vec<u64>,
    tokens: Vec<T>,
}

impl<T> Batch<T> {
    /// How many positions it writes.
    pub fn writes(&self) -> usize {
        self.positions.len()
    }
}

/// The writes waiting for each node, and how many batches each has out. `T` names a write
/// to its driver (a reply channel, an append's number).
#[derive(Debug)]
pub struct Batcher<T> {
    waiting: BTreeMap<NodeId, VecDeque<(SlotWrite, T)>>,
    in_flight: BTreeMap<NodeId, usize>,
    in_flight_max: usize,
}

impl<T> Default for Batcher<T> {
    fn default() -> Self {
        Batcher::new(BATCHES_IN_FLIGHT_DEFAULT)
    }
}

impl<T> Batcher<T> {
    /// A batcher with at most `in_flight_max` batches out to each node.
    pub fn new(in_flight_max: usize) -> Batcher<T> {
        assert!(in_flight_max > 0, "a batch must be able to leave");
        Batcher {
            waiting: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            in_flight_max,
        }
    }

    /// Queues `write` for its node: the batch to run now if the node has room for one.
    pub fn queue(&mut self, layout: &LogLayout, write: SlotWrite, token: T) -> Option<Batch<T>> {
        let node = layout.slot(write.position).node;
        self.waiting
            .entry(node)
            .or_default()
            .push_back((write, token));
        self.next(layout, node)
    }

    /// `batch` ended with `outcome` (`None`: unknown, so each write may or may not be
    /// there; write each again, at the same position). What became of each write, and the
    /// node's next batch if writes wait for it.
    #[allow(clippy::type_complexity)]
    pub fn finish(
        &mut self,
        layout: &LogLayout,
        batch: Batch<T>,
        outcome: Option<&Outcome>,
    ) -> (Vec<(T, Written)>, Option<Batch<T>>) {
        let out = self.in_flight.get_mut(&batch.node).expect("a batch is out");
        *out -= 1;
        let results = match outcome {
            Some(o) => minitxs::written(layout, batch.epoch, &batch.positions, o),
            None => vec![Written::Unknown; batch.positions.len()],
        };
        let next = self.next(layout, batch.node);
        (batch.tokens.into_iter().zip(results).collect(), next)
    }

    /// Forgets every write and batch (the driver crashed).
    pub fn clear(&mut self) {
        self.waiting.clear();
        self.in_flight.clear();
    }

    /// The writes waiting for `node` in the epoch of the first, up to the limits, as a
    /// batch, if the node has room for one.
    fn next(&mut self, layout: &LogLayout, node: NodeId) -> Option<Batch<T>> {
        let out = self.in_flight.entry(node).or_default();
        let waiting = self.waiting.get_mut(&node)?;
        let epoch = waiting.front()?.0.epoch;
        if *out >= self.in_flight_max {
            return None;
        }
        *out += 1;
        let (mut writes, mut positions, mut tokens, mut bytes) = (vec![], vec![], vec![], 0);
        let mut later = VecDeque::new();
        while let Some((w, token)) = waiting.pop_front() {
            if w.epoch != epoch {
                later.push_back((w, token));
                continue;
            }
            bytes += w.bytes.len();
            positions.push(w.position);
            writes.push(w);
            tokens.push(token);
            if writes.len() == WRITES_PER_BATCH_MAX || bytes >= BATCH_BYTES_MAX {
                break;
            }
        }
        later.append(waiting);
        *waiting = later;
        Some(Batch {
            node,
            tx: minitxs::write_batch(layout, writes),
            epoch,
            positions,
            tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Content, Entry};
    use crate::minitxs::Refusal;

    /// Two nodes of 8 slots: even positions on node 1, odd on node 2.
    fn layout() -> LogLayout {
        crate::layout::two_nodes(256, 8)
    }

    fn write(position: u64, epoch: u64) -> SlotWrite {
        let entry = Entry {
            position,
            epoch,
            writer: position,
            content: Content::Junk,
        };
        SlotWrite::new(&layout(), epoch, &entry)
    }

    /// Epoch 2, trim 0, each slot with its tag and writer 55.
    fn outcome(committed: bool, tags: &[u64]) -> Outcome {
        let slots: Vec<[u64; 3]> = tags.iter().map(|&tag| [tag, 2, 55]).collect();
        Outcome {
            committed,
            ..crate::minitxs::tests::refused([2, 0], &slots)
        }
    }

    #[test]
    fn writes_that_wait_for_a_node_leave_together_in_their_epoch() {
        let l = layout();
        let mut b = Batcher::new(2);
        let first = b.queue(&l, write(0, 2), 'a').expect("node 1 is idle");
        let second = b
            .queue(&l, write(2, 2), 'b')
            .expect("a second batch may be out");
        assert_eq!((first.writes(), second.writes()), (1, 1));
        assert!(b.queue(&l, write(1, 2), 'c').is_some(), "node 2 has room");
        for (p, t) in [(4, 'd'), (6, 'e'), (8, 'f')] {
            assert!(b.queue(&l, write(p, 2), t).is_none(), "node 1 has two out");
        }
        assert!(b.queue(&l, write(10, 3), 'g').is_none());
        let (done, next) = b.finish(&l, first, Some(&outcome(true, &[0])));
        assert_eq!(done, vec![('a', Written::Done)]);
        let next = next.expect("writes wait for node 1");
        assert_eq!(next.tokens, vec!['d', 'e', 'f'], "the epoch-3 write waits");
        // One write of the three was taken: the other two are written again.
        let (done, _) = b.finish(&l, next, Some(&outcome(false, &[0, 7, 0])));
        assert_eq!(
            done,
            vec![
                ('d', Written::Again),
                ('e', Written::Refused(Refusal::Taken { writer: 55 })),
                ('f', Written::Again)
            ]
        );
        let (done, next) = b.finish(&l, second, None);
        assert_eq!(done, vec![('b', Written::Unknown)]);
        assert!(next.is_none(), "the epoch-3 write left with the last batch");
    }

    #[test]
    fn a_batch_stops_at_its_limits() {
        let l = LogLayout {
            slots_per_node: 1024,
            ..layout()
        };
        let mut b = Batcher::new(2);
        let mut out = vec![];
        for i in 0..(WRITES_PER_BATCH_MAX as u64 + 10) * 2 {
            out.extend(b.queue(&l, write(2 * i, 2), i));
        }
        assert_eq!(out.len(), 2);
        let (_, next) = b.finish(&l, out.remove(0), Some(&outcome(true, &[0])));
        assert_eq!(next.expect("more wait").writes(), WRITES_PER_BATCH_MAX);
    }
}
